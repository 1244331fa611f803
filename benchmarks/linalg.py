"""Linear algebra (issue 25): the Gaussian-process negative log marginal likelihood and logdet's derivatives.

    K[i,j] = X[i,d] X[j,d] + s delta[i,j];  spd K
    f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])

1. gradient by X (n = 2000, d = 50): einflow vs two hand-written numpy/scipy Cholesky versions (LAPACK potrf,
   potrs, potri: dL/dX = (K^-1 - a a^T) X with K^-1 formed; and the solve form, K^-1 X by potrs with d
   right-hand sides, O(n^3/3 + n^2 d)) vs jax.jit(jax.grad) (float64);
2. Hessian-vector product by X: einflow's hvp vs jax.jit of jax's forward-over-reverse hvp;
3. hessian of logdet at n = 64 and hvp of logdet at n = 256: time and the peak memory the call allocates
   (tracemalloc: numpy reports its arrays to it).

Candidates are timed interleaved in one process (medians; jax in its own block, as benchmarks/common.py does),
once by wall time and once by the process's CPU time (all threads; not stretched by other jobs on a shared machine).
Run: python benchmarks/linalg.py [--quick]
"""

from __future__ import annotations

import sys
import time
import tracemalloc

import numpy as np
from scipy.linalg import get_lapack_funcs

import einflow as ef
from benchmarks.common import compare, machine, ratio, seconds

GP = ("K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\n"
      "f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])")


def hand_gradient(X: np.ndarray, y: np.ndarray, s: float) -> np.ndarray:
    """d/dX of the GP negative log marginal likelihood, by hand: one Cholesky factor, alpha, K^-1 from it."""
    K = X @ X.T
    K[np.diag_indices_from(K)] += s
    potrf, potrs, potri = get_lapack_funcs(("potrf", "potrs", "potri"), (K,))
    factor, info = potrf(K, lower=True, clean=False)
    alpha, info = potrs(factor, y, lower=True)
    inverse, info = potri(factor, lower=True)
    inverse = np.tril(inverse) + np.tril(inverse, -1).T
    inverse -= np.outer(alpha, alpha)  # dL/dK = (K^-1 - alpha alpha^T)/2; K = X X^T gives 2 dL/dK X
    return inverse @ X


def hand_solve_gradient(X: np.ndarray, y: np.ndarray, s: float) -> np.ndarray:
    """The same gradient in the solve form: (K^-1 - alpha alpha^T) X = K^-1 X - alpha (alpha^T X), K^-1 X by potrs
    with d right-hand sides from the one Cholesky factor (K^-1 never formed)."""
    K = X @ X.T
    K[np.diag_indices_from(K)] += s
    potrf, potrs = get_lapack_funcs(("potrf", "potrs"), (K,))
    factor, info = potrf(K, lower=True, clean=False)
    alpha, info = potrs(factor, y, lower=True)
    solved, info = potrs(factor, X, lower=True)
    return solved - np.outer(alpha, alpha @ X)


def timed(candidates: dict, repeat: int) -> tuple[dict[str, float], dict[str, float]]:  # type: ignore[type-arg]
    """Medians by wall time and by the process's CPU time (each interleaved, jax in its own block)."""
    return compare(candidates, repeat=repeat), compare(candidates, repeat=repeat, clock=time.process_time)


def peak_bytes(function) -> int:  # noqa: ANN001
    """The most memory one call allocates at once, beyond what was allocated before it (tracemalloc)."""
    function()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    function()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def main(quick: bool = False) -> None:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    n, d = (500, 20) if quick else (2000, 50)
    repeat = 3 if quick else 5
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    y = rng.standard_normal(n)
    V = rng.standard_normal((n, d))
    s = 0.5

    def nll(X: jax.Array, y: jax.Array) -> jax.Array:
        K = X @ X.T + s * jnp.eye(X.shape[0])
        factor = jnp.linalg.cholesky(K)
        alpha = jax.scipy.linalg.cho_solve((factor, True), y)
        return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diagonal(factor)))

    print(machine())
    gradient = ef.grad(GP, wrt="X")
    jax_gradient = jax.jit(jax.grad(nll))
    jX, jy = jnp.asarray(X), jnp.asarray(y)
    expected = hand_gradient(X, y, s)
    assert np.allclose(gradient(X=X, y=y, s=s), expected, rtol=1e-7, atol=1e-8)
    assert np.allclose(hand_solve_gradient(X, y, s), expected, rtol=1e-7, atol=1e-8)
    assert np.allclose(np.asarray(jax_gradient(jX, jy)), expected, rtol=1e-7, atol=1e-8)
    print(f"\ngradient plan: {gradient.plan(X=X.shape, y=y.shape, s=()).flops / 1e9:.2f} GFLOP")
    candidates = {"einflow": lambda: gradient(X=X, y=y, s=s), "numpy/scipy": lambda: hand_gradient(X, y, s),
                  "numpy/scipy solves": lambda: hand_solve_gradient(X, y, s),
                  "jax.jit": lambda: jax_gradient(jX, jy).block_until_ready()}
    for clock, times in zip(("wall", "CPU"), timed(candidates, repeat)):
        mine = times["einflow"]
        print(f"GP gradient by X (n={n}, d={d}), {clock} time: einflow {seconds(mine)}, hand-written "
              f"Cholesky with K^-1 {seconds(times['numpy/scipy'])} (einflow / hand "
              f"{ratio(mine / times['numpy/scipy'])}, target 1.3), hand-written solves "
              f"{seconds(times['numpy/scipy solves'])} (einflow / hand {ratio(mine / times['numpy/scipy solves'])}), "
              f"jax.jit(jax.grad) {seconds(times['jax.jit'])} (einflow / jax {ratio(mine / times['jax.jit'])})")

    hvp = ef.hvp(GP, wrt="X", tangent="V")
    jax_hvp = jax.jit(lambda X, y, V: jax.jvp(lambda x: jax.grad(nll)(x, y), (X,), (V,))[1])
    jV = jnp.asarray(V)
    assert np.allclose(hvp(X=X, y=y, s=s, V=V), np.asarray(jax_hvp(jX, jy, jV)), rtol=1e-6, atol=1e-7)
    print(f"hvp plan: {hvp.plan(X=X.shape, y=y.shape, s=(), V=V.shape).flops / 1e9:.2f} GFLOP")
    candidates = {"einflow": lambda: hvp(X=X, y=y, s=s, V=V),
                  "jax.jit": lambda: jax_hvp(jX, jy, jV).block_until_ready()}
    for clock, times in zip(("wall", "CPU"), timed(candidates, repeat)):
        print(f"GP hvp by X (n={n}, d={d}), {clock} time: einflow {seconds(times['einflow'])}, jax.jit hvp "
              f"{seconds(times['jax.jit'])} (jax / einflow {ratio(times['jax.jit'] / times['einflow'])}, target 5)")

    for size, what in ((64, "hessian"), (256, "hvp")):
        A = rng.standard_normal((size, size)) / np.sqrt(size) + 3 * np.eye(size)
        T = rng.standard_normal((size, size))
        if what == "hessian":
            program = ef.hessian("f = logdet[i,j](A[i,j])", wrt="A")
            call = lambda program=program, A=A: program(A=A)  # noqa: E731
            reference = lambda A=A: -np.einsum("qi,jp->ijpq", *(2 * [np.linalg.inv(A)]))  # noqa: E731
            assert np.allclose(call(), reference())
        else:
            program = ef.hvp("f = logdet[i,j](A[i,j])", wrt="A", tangent="T")
            call = lambda program=program, A=A, T=T: program(A=A, T=T)  # noqa: E731
            reference = lambda A=A, T=T: -(np.linalg.inv(A) @ T @ np.linalg.inv(A)).T  # noqa: E731
            assert np.allclose(call(), reference())
        times = compare({"einflow": call, "numpy": reference}, repeat=repeat)
        peak = peak_bytes(call)
        print(f"logdet {what} (n={size}): einflow {seconds(times['einflow'])}, numpy closed form "
              f"{seconds(times['numpy'])}; peak allocated {peak / 2**20:.2f} MiB = {peak / (8 * size * size):.2f} "
              f"n^2 float64 (the result alone: {(size**4 if what == 'hessian' else size**2) / (size * size):.0f} n^2)")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
