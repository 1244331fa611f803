"""A 1-D heat equation by explicit finite differences, written as an einflow stencil.

The Laplacian ``u[i-1] - 2 u[i] + u[i+1]`` reads shifted positions; ``size i = u`` fixes the range of
``i`` to the whole rod, so the reads past either end read 0 (a rod held at temperature 0 at both ends).
With ``pad replicate u`` the reads past an end repeat the end instead (an insulated rod: no heat flows out,
so the total heat stays what it was). Both are checked against the same scheme written with numpy.pad.

Run: python examples/heat_equation.py
"""

from __future__ import annotations

import numpy as np

import einflow as ef

STEP = ef.compile("size i = u\nv[i] = u[i] + alpha (u[i-1] - 2 u[i] + u[i+1])")
INSULATED = ef.compile("pad replicate u\nsize i = u\nv[i] = u[i] + alpha (u[i-1] - 2 u[i] + u[i+1])")


def numpy_step(u: np.ndarray, alpha: float, mode: str = "constant") -> np.ndarray:
    padded = np.pad(u, 1, mode=mode)  # type: ignore[call-overload]
    return u + alpha * (padded[:-2] - 2 * u + padded[2:])


def main() -> None:
    n, alpha, steps = 50, 0.25, 200
    u = np.exp(-((np.arange(n) - n / 2) ** 2) / 20.0)
    reference = u.copy()
    for _ in range(steps):
        u = STEP(u=u, alpha=alpha)
        reference = numpy_step(reference, alpha)
    print(f"after {steps} steps: max temperature {u.max():.4f}, total heat {u.sum():.4f}")
    print(f"largest difference from numpy slicing: {np.abs(u - reference).max():.2e}")
    assert np.allclose(u, reference)
    insulated = reference = np.exp(-((np.arange(n) - n / 2) ** 2) / 20.0)
    for _ in range(steps):
        insulated = INSULATED(u=insulated, alpha=alpha)
        reference = numpy_step(reference, alpha, mode="edge")
    print(f"insulated rod (pad replicate): total heat {insulated.sum():.4f}, "
          f"difference from numpy.pad(mode='edge') {np.abs(insulated - reference).max():.2e}")
    assert np.allclose(insulated, reference)
    assert np.isclose(insulated.sum(), np.exp(-((np.arange(n) - n / 2) ** 2) / 20.0).sum())


if __name__ == "__main__":
    main()
