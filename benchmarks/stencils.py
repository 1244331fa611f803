"""Gradients of 2-D stencil losses (image processing, PDE residuals): einflow vs jax.jit(jax.grad) vs numpy.

Each row: a loss over an N x N image ``U`` written with shifted reads; einflow's gradient program (numpy
backend) against ``jax.jit(jax.grad)`` of the same loss written with slices, and against a hand-written
numpy gradient where one is short. Interleaved medians (``common.compare``), float64; run it pinned to one
core (``taskset -c 0``) so every side has the same threads. Also prints each gradient plan's FLOPs and
largest intermediate (linear in the image's size: no ``[p,a,q,b]`` block of deltas).

Run:  taskset -c 0 python benchmarks/stencils.py [--size N]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, format_table, machine, optional, ratio, seconds  # noqa: E402

import einflow as ef  # noqa: E402

LOSSES = {
    "5-point Laplacian energy": (
        "L = 0.5 * sum[a,b]((U[a,b+1] + U[a+2,b+1] + U[a+1,b] + U[a+1,b+2] - 4 U[a+1,b+1])^2)",
        lambda xp, u: 0.5 * xp.sum((u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]) ** 2)),
    "isotropic total variation": (
        "L = sum[a,b](sqrt((U[a+1,b] - U[a,b])^2 + (U[a,b+1] - U[a,b])^2 + 0.01))",
        lambda xp, u: xp.sum(xp.sqrt((u[1:, :-1] - u[:-1, :-1]) ** 2 + (u[:-1, 1:] - u[:-1, :-1]) ** 2 + 0.01))),
    "anisotropic TV (smoothed)": (
        "h = sum[a,b](sqrt((U[a+1,b] - U[a,b])^2 + 0.01))\nL = h + sum[a,b](sqrt((U[a,b+1] - U[a,b])^2 + 0.01))",
        lambda xp, u: xp.sum(xp.sqrt((u[1:] - u[:-1]) ** 2 + 0.01)) + xp.sum(xp.sqrt((u[:, 1:] - u[:, :-1]) ** 2
                                                                                   + 0.01))),
}


def _laplacian_gradient(u: np.ndarray) -> np.ndarray:
    """The 5-point Laplacian energy's gradient by hand: the adjoint stencil of the residual."""
    r = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    g = np.zeros_like(u)
    g[:-2, 1:-1] += r
    g[2:, 1:-1] += r
    g[1:-1, :-2] += r
    g[1:-1, 2:] += r
    g[1:-1, 1:-1] -= 4 * r
    return g


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    jax = optional("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
    U = np.random.default_rng(0).standard_normal((args.size, args.size))
    rows = []
    for name, (text, formula) in LOSSES.items():
        gradient = ef.grad(text, wrt="U")
        report = str(gradient.plan(U=U.shape)).splitlines()[-1]
        candidates = {"einflow": lambda gradient=gradient: gradient(U=U)}
        if jax is not None:
            import jax.numpy as jnp

            jitted = jax.jit(jax.grad(lambda u, formula=formula: formula(jnp, u)))
            U_jax = jnp.asarray(U)
            np.testing.assert_allclose(gradient(U=U), jitted(U_jax), rtol=1e-9, atol=1e-9)
            candidates["jax.jit"] = lambda jitted=jitted, U_jax=U_jax: jitted(U_jax).block_until_ready()
        if name == "5-point Laplacian energy":
            np.testing.assert_allclose(gradient(U=U), _laplacian_gradient(U), rtol=1e-9, atol=1e-9)
            candidates["numpy by hand"] = lambda: _laplacian_gradient(U)
        times = compare(candidates, repeat=9)
        row = [name, seconds(times["einflow"])]
        row.append(ratio(times["einflow"] / times["jax.jit"]) if "jax.jit" in times else "-")
        row.append(ratio(times["einflow"] / times["numpy by hand"]) if "numpy by hand" in times else "-")
        row.append(report.split("   ")[0].replace("total FLOPs: ", ""))
        row.append(report.split("largest intermediate: ")[1].split(" elements")[0])
        rows.append(row)
    print(f"# gradients of 2-D stencil losses, {args.size} x {args.size} float64 ({machine()})")
    print(format_table(rows, ["loss", "einflow", "÷ jax.jit(grad)", "÷ numpy by hand", "plan FLOPs",
                              "largest intermediate (elements)"]))


if __name__ == "__main__":
    main()
