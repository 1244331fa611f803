"""Memory: the peak an evaluation allocates (tracemalloc) against the peak its plan predicts.

The prediction is ``Plan.peak_bytes``: intermediates and results alive at once, each intermediate
released after its last use (a view keeps what it views), plus the intermediates inside a contraction
and the one temporary of sigmoid/step; the caller's inputs are not counted. numpy reports its array
allocations to tracemalloc, so the measured peak is what numpy allocated during one call (BLAS
workspace and Python objects aside). Target: measured at most 1.2x predicted. For scale, each row
also names what keeping every intermediate to the end would need (einflow before plans released them).

Run:  python benchmarks/memory.py
"""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, combined_table, machine  # noqa: E402
from shared_work import LAYERS, LEAST_SQUARES, _network_arrays, network  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["measure", "run", "main"]

LOGISTIC = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"


def _mib(count: float) -> str:
    return f"{count / 2**20:.1f} MiB"


def measure(program: ef.Program, arrays: dict[str, Any]) -> tuple[int, int, int]:
    """(measured peak, predicted peak, all intermediates kept) in bytes for one call on ``arrays``."""
    program(arrays)  # plan built and cached; the measured call only runs it
    plans = [plan for plan in program._plans.values() if plan.backend.name == "numpy"]
    plan = plans[-1]
    tracemalloc.start()
    try:
        result = program(arrays)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return peak, plan.peak_bytes, sum(plan.allocations.values()) + max(plan.transients.values(), default=0)


def run(repeat: int = 1) -> tuple[str, list[Row]]:
    """Measure each case once (allocation is deterministic); returns the section's table and its rows."""
    del repeat
    rng = np.random.default_rng(0)
    squares = dict(A=rng.standard_normal((1500, 1000)), X=rng.standard_normal((1000, 800)),
                   B=rng.standard_normal((1500, 800)))
    logistic = dict(X=rng.standard_normal((20000, 500)) / 20, y=np.sign(rng.standard_normal(20000)),
                    w=rng.standard_normal(500))
    chain = {name: rng.standard_normal((800, 800)) for name in "ABC"}
    tucker = dict(T=rng.standard_normal((60, 60, 60)), U=rng.standard_normal((60, 40)),
                  V=rng.standard_normal((60, 40)), W=rng.standard_normal((60, 40)))
    cases = [
        ("least squares value", ef.compile(LEAST_SQUARES), squares),
        ("least squares value_and_grad", ef.value_and_grad(LEAST_SQUARES, wrt="X"), squares),
        ("chain E = A B C, 800x800", ef.compile("E[i,m] = A[i,j] B[j,k] C[k,m]"), chain),
        ("Tucker core, 60/40", ef.compile("R[i,j,k] = T[a,b,c] U[a,i] V[b,j] W[c,k]"), tucker),
        ("logistic gradient 20000x500", ef.grad(LOGISTIC, wrt="w"), logistic),
        ("logistic Hessian 20000x500", ef.hessian(LOGISTIC, wrt="w"), logistic),
        (f"{LAYERS}-layer tanh net gradient", ef.grad(network(), wrt=[f"W{k}" for k in range(1, LAYERS + 1)]),
         _network_arrays(rng)),
    ]
    rows = []
    for name, program, arrays in cases:
        peak, predicted, kept = measure(program, arrays)
        rows.append(Row("memory", f"{name} (all kept: {_mib(kept)})", _mib(peak), f"predicted {_mib(predicted)}",
                        peak / predicted, 1.2))
    return combined_table(rows), rows


def main() -> None:
    table, _ = run()
    print(f"## Memory ({machine()})\n")
    print(table)


if __name__ == "__main__":
    main()
