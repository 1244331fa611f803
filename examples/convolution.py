"""A tiny convolutional network trained with einflow's own gradients.

Two convolutions ("same" 3x3, then a strided 2x2), tanh, and a linear read-out classify 8x8 images of
a horizontal versus a vertical bar (with noise). The gradient program is einflow text: the adjoint of
each shifted read is a scatter-add written with ``delta[p, h + r - 1]``. The gradient is checked against
central finite differences once, then plain gradient descent trains the network.

Run: python examples/convolution.py
"""

from __future__ import annotations

import numpy as np

import einflow as ef

NETWORK = """size n, c, h, w = x
z[n,o,h,w] = x[n,c,h+r-1,w+s-1] K1[o,c,r,s]
a[n,o,h,w] = tanh(z[n,o,h,w])
u[n,m,i,j] = a[n,o,2*i+r,2*j+s] K2[m,o,r,s]
logit[n] = tanh(u[n,m,i,j]) V[m,i,j]
L = sum[n](log(1 + exp(-label[n] logit[n]))) / 32"""


def images(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy 8x8 images of a horizontal (+1) or vertical (-1) bar at a random place."""
    x = 0.3 * rng.standard_normal((count, 1, 8, 8))
    label = rng.choice([-1.0, 1.0], size=count)
    for k in range(count):
        where = rng.integers(1, 7)
        if label[k] > 0:
            x[k, 0, where, :] += 1.0
        else:
            x[k, 0, :, where] += 1.0
    return x, label


def finite_difference_check(gradient: ef.Program, arrays: dict[str, np.ndarray]) -> float:
    """Largest relative gap between the gradient and central differences on a few entries."""
    loss = ef.compile(NETWORK)
    analytic = gradient(**arrays)
    worst = 0.0
    for name, grad in zip(("K1", "K2", "V"), analytic):
        for flat in (0, grad.size // 2, grad.size - 1):
            index = np.unravel_index(flat, grad.shape)
            step = 1e-6
            plus, minus = {k: v.copy() for k, v in arrays.items()}, {k: v.copy() for k, v in arrays.items()}
            plus[name][index] += step
            minus[name][index] -= step
            numeric = (loss(**plus) - loss(**minus)) / (2 * step)
            worst = max(worst, abs(numeric - grad[index]) / max(1e-8, abs(numeric)))
    return worst


def main() -> None:
    rng = np.random.default_rng(0)
    params = {"K1": 0.5 * rng.standard_normal((4, 1, 3, 3)), "K2": 0.5 * rng.standard_normal((3, 4, 2, 2)),
              "V": 0.5 * rng.standard_normal((3, 4, 4))}
    gradient = ef.grad(NETWORK, wrt=["K1", "K2", "V"])
    x, label = images(rng, 32)
    gap = finite_difference_check(gradient, {**params, "x": x, "label": label})
    print(f"finite differences: largest relative gap {gap:.1e}")
    loss = ef.compile(NETWORK)
    first = loss(**params, x=x, label=label)
    for _ in range(150):
        x, label = images(rng, 32)
        for name, grad in zip(("K1", "K2", "V"), gradient(**params, x=x, label=label)):
            params[name] -= 0.5 * grad
    x, label = images(rng, 256)
    scores = ef.compile(NETWORK.rsplit("\n", 1)[0])(**params, x=x)
    accuracy = float(np.mean(np.sign(scores) == label))
    print(f"loss before training {first:.3f}; accuracy on 256 new images {accuracy:.3f}")


if __name__ == "__main__":
    main()
