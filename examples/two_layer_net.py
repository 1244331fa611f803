"""Train a two-layer tanh network on synthetic data with einflow's ``value_and_grad``.

The network, its loss and the gradients with respect to all four parameter tensors are one einflow
program; training is plain numpy (Adam). The loss curve is printed every 100 steps.

Run:  python examples/two_layer_net.py
"""

from __future__ import annotations

import numpy as np

import einflow as ef

NETWORK = """
H[b,h] = tanh(X[b,f] W1[f,h] + b1[h])
P[b] = H[b,h] w2[h] + c
L = sum[b]((P[b] - t[b])^2) / N
"""
PARAMETERS = ["W1", "b1", "w2", "c"]


def make_data(samples: int = 256, features: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Targets from a smooth function of the inputs (a fixed random teacher network plus a little noise)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (samples, features))
    teacher = rng.standard_normal((features, 3))
    t = np.sin(X @ teacher).sum(axis=1) + 0.05 * rng.standard_normal(samples)
    return X, t


def main(steps: int = 1500, hidden: int = 32, learning_rate: float = 0.01) -> None:
    X, t = make_data()
    samples, features = X.shape
    rng = np.random.default_rng(1)
    params = {
        "W1": rng.standard_normal((features, hidden)) / np.sqrt(features),
        "b1": np.zeros(hidden),
        "w2": rng.standard_normal(hidden) / np.sqrt(hidden),
        "c": np.zeros(()),
    }
    train = ef.value_and_grad(NETWORK, wrt=PARAMETERS)
    print("gradient program:")
    print(train)
    print()
    # Adam, in numpy
    first = {name: np.zeros_like(value) for name, value in params.items()}
    second = {name: np.zeros_like(value) for name, value in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    losses = []
    for step in range(1, steps + 1):
        loss, gradients = train(X=X, t=t, N=float(samples), **params)
        losses.append(float(loss))
        for name, gradient in zip(PARAMETERS, gradients):
            first[name] = beta1 * first[name] + (1 - beta1) * gradient
            second[name] = beta2 * second[name] + (1 - beta2) * gradient**2
            corrected = first[name] / (1 - beta1**step), second[name] / (1 - beta2**step)
            params[name] = params[name] - learning_rate * corrected[0] / (np.sqrt(corrected[1]) + eps)
        if step == 1 or step % 100 == 0:
            print(f"step {step:5d}  loss {loss:.6f}")
    final, _ = train(X=X, t=t, N=float(samples), **params)
    print(f"\ninitial loss {losses[0]:.6f}, final loss {float(final):.6f} "
          f"({losses[0] / float(final):.0f}x lower)")
    print(f"target variance {np.var(t):.6f}: the network explains {1 - float(final) / np.var(t):.1%} of it")


if __name__ == "__main__":
    main()
