"""Scaled dot-product attention in einflow, its gradients checked against central finite differences.

    S[q,k] = Q[q,d] K[k,d] / sqrt(dim)          scores
    A[q,k] = softmax[k](S[q,k])                 attention weights (softmax over keys, max-shifted)
    O[q,e] = A[q,k] V[k,e]                      output

and a scalar loss L = sum of O times a fixed random weighting G (written into the last statement).
einflow's ``grad`` gives dL/dQ, dL/dK, dL/dV symbolically; each is compared with float64 central
differences, element by element. softmax is evaluated max-shifted and its derivative is einflow's
compact form ``A (delta - A)``, so the loss and gradients stay finite for scores near 1000 (the run ends
by checking that against a numpy reference).

Run:  python examples/attention.py
"""

from __future__ import annotations

import numpy as np

import einflow as ef

ATTENTION = """
S[q,k] = Q[q,d] K[k,d] * scale
A[q,k] = softmax[k](S[q,k])
L = A[q,k] V[k,e] G[q,e]
"""


def central_difference(function, arrays: dict[str, np.ndarray], name: str, h: float = 1e-6) -> np.ndarray:
    """dL/d(arrays[name]) by (L(x + h) - L(x - h)) / 2h, one element at a time."""
    base = arrays[name]
    gradient = np.zeros_like(base)
    for position in np.ndindex(base.shape):
        shifted = base.copy()
        shifted[position] += h
        above = function(**{**arrays, name: shifted})
        shifted[position] -= 2 * h
        below = function(**{**arrays, name: shifted})
        gradient[position] = (above - below) / (2 * h)
    return gradient


def main(queries: int = 5, keys: int = 7, dim: int = 4, values: int = 3) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "Q": rng.standard_normal((queries, dim)),
        "K": rng.standard_normal((keys, dim)),
        "V": rng.standard_normal((keys, values)),
        "G": rng.standard_normal((queries, values)),
        "scale": 1.0 / np.sqrt(dim),
    }
    attention = ef.compile(ATTENTION)
    gradient = ef.grad(attention, wrt=["Q", "K", "V"])
    print("gradient program:")
    print(gradient)
    print()

    # the forward value agrees with a plain numpy softmax attention
    scores = arrays["Q"] @ arrays["K"].T * arrays["scale"]
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    expected = float(np.sum((weights @ arrays["V"]) * arrays["G"]))
    value = float(attention(**arrays))
    print(f"loss {value:.12f}, numpy reference {expected:.12f}, difference {abs(value - expected):.1e}")

    loss = lambda **a: float(attention(**a))  # noqa: E731
    worst = 0.0
    for name, symbolic in zip(["Q", "K", "V"], gradient(**arrays)):
        numeric = central_difference(loss, arrays, name)
        error = np.abs(symbolic - numeric).max() / np.abs(numeric).max()
        worst = max(worst, error)
        print(f"dL/d{name}: shape {symbolic.shape}, max relative difference to finite differences {error:.2e}")
    print(f"largest relative difference {worst:.2e} (central differences with h=1e-6 are good to ~1e-9)")

    # large scores: a scale of 250 puts scores near 1000, where exp alone overflows
    large = {**arrays, "scale": 250.0}
    scores = large["Q"] @ large["K"].T * large["scale"]
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    expected = float(np.sum((weights @ large["V"]) * large["G"]))
    value = float(attention(**large))
    finite = all(np.all(np.isfinite(g)) for g in gradient(**large))
    print(f"scores up to {np.abs(scores).max():.0f}: loss {value:.12f}, numpy {expected:.12f}, "
          f"gradients finite: {finite}")
    assert abs(value - expected) <= 1e-9 * max(1.0, abs(expected)) and finite


if __name__ == "__main__":
    main()
