"""Total-variation denoising of an image with einflow's gradient of a 2-D stencil loss.

The loss is written in index notation with reads shifted on both axes:

    L = 0.5 lam sum[a,b]((U[a,b] - F[a,b])^2) + sum[a,b](sqrt((U[a+1,b] - U[a,b])^2 + (U[a,b+1] - U[a,b])^2 + eps))

(``a``, ``b`` run over the range every read allows: one less than the image on each axis, so the data
term covers the same pixels). einflow derives its gradient as a printable program and gradient descent
removes most of the noise from a piecewise-constant image; the gradient is checked against central
differences first.

Run:  python examples/tv_denoise.py
"""

from __future__ import annotations

import numpy as np

import einflow as ef

LOSS = """
L = 0.5 * lam * sum[a,b]((U[a,b] - F[a,b])^2) + sum[a,b](sqrt((U[a+1,b] - U[a,b])^2 + (U[a,b+1] - U[a,b])^2 + eps))
"""


def main() -> None:
    rng = np.random.default_rng(0)
    n = 48
    clean = np.zeros((n, n))
    clean[8:30, 10:40] = 1.0
    clean[25:44, 20:30] = 0.5
    noisy = clean + 0.2 * rng.standard_normal((n, n))
    loss = ef.compile(LOSS)
    gradient = ef.grad(loss, wrt="U")
    print("the gradient program:")
    print(gradient)

    # central differences at a few pixels, float64
    data = dict(F=noisy, lam=4.0, eps=1e-2)
    point = noisy + 0.05 * rng.standard_normal((n, n))
    g = gradient(U=point, **data)
    worst = 0.0
    for i, j in [(0, 0), (5, 7), (20, 20), (n - 1, n - 2), (n - 2, n - 1)]:
        step = np.zeros((n, n))
        step[i, j] = 1e-6
        central = (loss(U=point + step, **data) - loss(U=point - step, **data)) / 2e-6
        worst = max(worst, abs(central - g[i, j]))
    print(f"central differences agree to {worst:.1e}")

    U = noisy.copy()
    for _ in range(300):
        U -= 0.01 * gradient(U=U, **data)
    inner = (slice(0, n - 1), slice(0, n - 1))
    before = np.sqrt(np.mean((noisy[inner] - clean[inner]) ** 2))
    after = np.sqrt(np.mean((U[inner] - clean[inner]) ** 2))
    print(f"error against the clean image: {before:.3f} noisy, {after:.3f} denoised")


if __name__ == "__main__":
    main()
