"""Fit a Gaussian process's kernel hyper-parameters with einflow's gradient of its negative log likelihood.

The model (squared-exponential kernel, log-parameters so that every value is allowed):

    K[i,j] = exp(la - 0.5 D[i,j] exp(-2 ll)) + exp(ls) delta[i,j]      (D: squared distances)
    spd K
    f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])

einflow differentiates the text (the gradient is printed below), computes the quadratic form by a Cholesky
solve and the one inverse the gradient needs from the same kind of factor; scipy's L-BFGS-B takes the steps.
The data come from a known GP, so the fitted parameters can be compared with the true ones.
Run: python examples/gaussian_process.py
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

import einflow as ef

NLL = """K[i,j] = exp(la - 0.5 D[i,j] exp(-2 ll)) + exp(ls) delta[i,j]
spd K
f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])"""


def main() -> None:
    rng = np.random.default_rng(7)
    n = 200
    x = np.sort(rng.uniform(0, 10, n))
    D = (x[:, None] - x[None, :]) ** 2
    amplitude, length, noise = 1.5, 0.8, 0.1  # the truth: K = a^2 exp(-D / 2 l^2) + noise^2 I
    K = amplitude**2 * np.exp(-0.5 * D / length**2) + noise**2 * np.eye(n)
    y = np.linalg.cholesky(K) @ rng.standard_normal(n)

    value_and_grad = ef.value_and_grad(NLL, wrt=["la", "ll", "ls"])
    print("gradient program:")
    print(ef.grad(NLL, wrt=["la", "ll", "ls"]))

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        value, gradients = value_and_grad(D=D, y=y, la=theta[0], ll=theta[1], ls=theta[2])
        return float(value), np.array([float(g) for g in gradients])

    start = np.array([0.0, 0.0, -1.0])
    # the gradient against central differences at the start
    _, gradient = objective(start)
    h = 1e-6
    central = [(objective(start + h * e)[0] - objective(start - h * e)[0]) / (2 * h) for e in np.eye(3)]
    print(f"\ngradient at the start {np.round(gradient, 6)}; central differences agree to "
          f"{np.max(np.abs(gradient - central)):.1e}")
    fitted = minimize(objective, start, jac=True, method="L-BFGS-B")
    la, ll, ls = fitted.x
    print(f"fitted in {fitted.nit} iterations: amplitude {np.exp(la / 2):.3f} (true {amplitude}), length "
          f"{np.exp(ll):.3f} (true {length}), noise {np.exp(ls / 2):.3f} (true {noise}); "
          f"negative log likelihood {fitted.fun:.3f}")


if __name__ == "__main__":
    main()
