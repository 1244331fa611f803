"""Newton's method vs gradient descent for L2-regularized logistic regression, derivatives by einflow.

einflow differentiates the loss symbolically: ``value_and_grad`` gives the loss and its gradient in one
program, ``hessian`` the exact Hessian (with its ``lam delta[p,q]`` term). Newton's method needs a handful
of steps; gradient descent with the classical 1/Lipschitz step needs thousands.

Run:  python examples/newton_logistic.py
"""

from __future__ import annotations

import time

import numpy as np

import einflow as ef

LOSS = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f]))) / N + 0.5 lam w[f] w[f]"
TOLERANCE = 1e-8  # stop when the gradient's norm is below this
MAX_GD_STEPS = 20_000


def make_data(samples: int = 400, features: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features on different scales (an ill-conditioned problem) and noisy +-1 labels."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((samples, features)) * np.array([1.0, 0.5, 2.0, 1.0, 0.3, 3.0])[:features]
    w_true = rng.standard_normal(features)
    probability = 1.0 / (1.0 + np.exp(-X @ w_true))
    y = np.where(rng.random(samples) < probability, 1.0, -1.0)
    return X, y


def main() -> None:
    X, y = make_data()
    samples, features = X.shape
    data = {"X": X, "y": y, "N": float(samples), "lam": 1e-3}
    value_and_grad = ef.value_and_grad(LOSS, wrt="w")
    hessian = ef.hessian(LOSS, wrt="w")
    print("loss:", LOSS)
    print("\nHessian program (einflow):")
    print(hessian)

    start = time.perf_counter()
    w = np.zeros(features)
    newton_steps = 0
    loss, gradient = value_and_grad(w=w, **data)
    while np.linalg.norm(gradient) >= TOLERANCE and newton_steps < 50:
        w = w - np.linalg.solve(hessian(w=w, **data), gradient)
        newton_steps += 1
        loss, gradient = value_and_grad(w=w, **data)
    newton_loss, newton_w = float(loss), w
    newton_time = time.perf_counter() - start

    # gradient descent with step 1/L, L = lambda_max(X^T X) / (4 N) + lam bounds the Hessian
    step = 1.0 / (np.linalg.eigvalsh(X.T @ X / samples).max() / 4 + data["lam"])
    start = time.perf_counter()
    w = np.zeros(features)
    gd_steps = 0
    loss, gradient = value_and_grad(w=w, **data)
    while np.linalg.norm(gradient) >= TOLERANCE and gd_steps < MAX_GD_STEPS:
        w = w - step * gradient
        gd_steps += 1
        loss, gradient = value_and_grad(w=w, **data)
    gd_loss = float(loss)
    gd_time = time.perf_counter() - start

    print(f"\nnewton: converged in {newton_steps} iterations, final loss {newton_loss:.12f} ({newton_time:.3f} s)")
    print(f"gradient descent: converged in {gd_steps} iterations, final loss {gd_loss:.12f} ({gd_time:.3f} s)")
    print(f"weights agree to {np.abs(newton_w - w).max():.2e}")
    print(f"newton needed {gd_steps / newton_steps:.0f}x fewer iterations")


if __name__ == "__main__":
    main()
