"""Contractions: einflow vs numpy.einsum (optimize False/True), opt_einsum, jax.jit(jnp.einsum), torch.einsum.

Every candidate computes the same result from the same float64 arrays; medians of interleaved repeats
(jax and torch timed in their own block). Three rows carry the issue's targets: a 4x4 matmul against a
bare opt_einsum ContractExpression call, a three-matrix chain against two numpy.matmul calls, and a
five-operand matrix-vector chain against the best matrix-vector order.

Run:  python benchmarks/contractions.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import opt_einsum as oe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, calibrate, combined_table, compare, machine, optional, seconds  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["CASES", "run", "main"]

# numpy.einsum(optimize=False) loops over every index at once: skipped above this many multiply-adds
NAIVE_LIMIT = 3e9


def _case(name: str, text: str, equation: str, sizes: dict[str, int], reference: str = "",
          target: float | None = None, hand: Callable[..., Any] | None = None) -> dict[str, Any]:
    return dict(name=name, text=text, equation=equation, sizes=sizes, reference=reference, target=target,
                hand=hand)


CASES = [
    _case("matmul 4x4 (tiny)", "C[i,j] = A[i,k] B[k,j]", "ik,kj->ij", dict(i=4, j=4, k=4),
          "opt_einsum ContractExpression", 1.5),
    _case("matmul 1000x1000", "C[i,j] = A[i,k] B[k,j]", "ik,kj->ij", dict(i=1000, j=1000, k=1000),
          "numpy.matmul", None, lambda A, B: A @ B),
    _case("chain E = A B C, 800x800", "E[i,m] = A[i,j] B[j,k] C[k,m]", "ij,jk,km->im",
          dict(i=800, j=800, k=800, m=800), "two numpy.matmul", 1.1, lambda A, B, C: (A @ B) @ C),
    _case("y = A B C D v, 800x800", "y[i] = A[i,j] B[j,k] C[k,l] D[l,m] v[m]", "ij,jk,kl,lm,m->i",
          dict(i=800, j=800, k=800, l=800, m=800), "A@(B@(C@(D@v)))", 1.3,
          lambda A, B, C, D, v: A @ (B @ (C @ (D @ v)))),
    _case("batched matmul 64x(128x128)", "C[b,i,j] = A[b,i,k] B[b,k,j]", "bik,bkj->bij",
          dict(b=64, i=128, j=128, k=128), "numpy.matmul", None, lambda A, B: A @ B),
    _case("Tucker core T[a,b,c] U[a,i] V[b,j] W[c,k], 60/40", "R[i,j,k] = T[a,b,c] U[a,i] V[b,j] W[c,k]",
          "abc,ai,bj,ck->ijk", dict(a=60, b=60, c=60, i=40, j=40, k=40)),
    _case("trace A B C D, 400x400", "t = A[i,j] B[j,k] C[k,l] D[l,i]", "ij,jk,kl,li->",
          dict(i=400, j=400, k=400, l=400), "numpy.trace(A@B@C@D)", None,
          lambda A, B, C, D: np.trace(A @ B @ C @ D)),
    _case("bilinear form x A y, n=3000", "f = x[i] A[i,j] y[j]", "i,ij,j->", dict(i=3000, j=3000),
          "x @ A @ y", None, lambda x, A, y: x @ A @ y),
    _case("sum of Hadamard product, 2000x2000", "s = A[i,j] B[i,j]", "ij,ij->", dict(i=2000, j=2000),
          "numpy.vdot", None, lambda A, B: np.vdot(A, B)),
    _case("attention scores Q K^T, 8x256x64", "S[h,q,k] = Q[h,q,d] K[h,k,d]", "hqd,hkd->hqk",
          dict(h=8, q=256, k=256, d=64)),
]


def _arrays(case: dict[str, Any], rng: np.random.Generator) -> tuple[list[str], list[np.ndarray]]:
    """Names and arrays of the einflow program's inputs, in equation order."""
    program = ef.compile(case["text"])
    terms = case["equation"].split("->")[0].split(",")
    sizes = case["sizes"]
    arrays = [rng.standard_normal(tuple(sizes[c] for c in term)) / np.sqrt(max(sizes.values())) for term in terms]
    return list(program.inputs), arrays


def _candidates(case: dict[str, Any], names: list[str], arrays: list[np.ndarray]) -> dict[str, Callable[[], Any]]:
    equation = case["equation"]
    program = ef.compile(case["text"])
    bound = dict(zip(names, arrays))
    candidates: dict[str, Callable[[], Any]] = {"einflow": lambda: program(bound)}
    expression = oe.contract_expression(equation, *(a.shape for a in arrays))
    if case["reference"] == "opt_einsum ContractExpression":
        candidates["reference"] = lambda: expression(*arrays)
    elif case["hand"] is not None:
        candidates["reference"] = lambda: case["hand"](*arrays)
    _, naive = oe.contract_path(equation, *arrays, optimize=False)
    if naive.opt_cost <= NAIVE_LIMIT:
        candidates["numpy.einsum"] = lambda: np.einsum(equation, *arrays, optimize=False)
    candidates["numpy.einsum optimize"] = lambda: np.einsum(equation, *arrays, optimize=True)
    candidates["opt_einsum"] = lambda: oe.contract(equation, *arrays)
    jax = optional("jax")
    if jax is not None:
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        compiled = jax.jit(lambda *xs: jnp.einsum(equation, *xs))
        device = [jnp.asarray(a) for a in arrays]
        candidates["jax.jit"] = lambda: compiled(*device).block_until_ready()
    torch = optional("torch")
    if torch is not None:
        tensors = [torch.from_numpy(a) for a in arrays]
        candidates["torch"] = lambda: torch.einsum(equation, *tensors)
    return candidates


def _check(candidates: dict[str, Callable[[], Any]], case: str) -> None:
    """Every candidate computes the same numbers as einflow."""
    ours = np.asarray(candidates["einflow"]())
    for name, function in candidates.items():
        theirs = np.asarray(function())
        assert np.allclose(theirs, ours, rtol=1e-8, atol=1e-8), f"{case}: {name} differs from einflow"


def run(repeat: int = 9, quick: bool = False) -> tuple[str, list[Row]]:
    """Time every case; returns the section's table and its rows."""
    rng = np.random.default_rng(0)
    rows = []
    for case in CASES[:3] if quick else CASES:
        names, arrays = _arrays(case, rng)
        candidates = _candidates(case, names, arrays)
        _check(candidates, case["name"])
        number = calibrate(candidates["einflow"], 0.05)  # long samples: a stalled BLAS thread averages out
        times = compare(candidates, repeat=repeat, number=number)
        ours = times["einflow"]
        row = Row("contractions", case["name"], seconds(ours))
        if "reference" in times:
            row.reference = case["reference"]
            row.ratio = ours / times["reference"]
            row.target = case["target"]
        for peer in ("numpy.einsum", "numpy.einsum optimize", "opt_einsum", "jax.jit", "torch"):
            if peer in times:
                row.peers[peer] = ours / times[peer]
            elif peer == "numpy.einsum":
                row.peers[peer] = "skipped"
        rows.append(row)
    return combined_table(rows), rows


def main() -> None:
    table, _ = run()
    print(f"## Contractions ({machine()})\n")
    print(table)
    print("\nRatios are einflow's median time divided by the other's: below 1, einflow is faster.")


if __name__ == "__main__":
    main()
