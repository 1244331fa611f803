"""How often the first call of a small program crosses between einflow's modules, and what it costs.

A profile hook sees every Python call made inside einflow during ``compile`` + first call of a small
program (and during one derivation); a call whose caller lives in another einflow module is one
crossing. Run against any checkout: ``python benchmarks/boundaries.py [path-to-checkout]``; the checkout's
einflow is imported (benchmarks/run_all.py runs it on this one).
"""

from __future__ import annotations

import collections
import statistics
import sys
import time


def _module(frame) -> str:  # type: ignore[no-untyped-def]
    return frame.f_globals.get("__name__", "")


def crossings(action) -> tuple[int, collections.Counter]:  # type: ignore[no-untyped-def]
    """(calls from one einflow module into another while ``action()`` runs, counts by (caller, callee) module)."""
    pairs: collections.Counter = collections.Counter()

    def hook(frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call":
            return
        callee = _module(frame)
        caller = _module(frame.f_back) if frame.f_back is not None else ""
        if callee.startswith("einflow") and caller.startswith("einflow") and callee != caller:
            pairs[caller, callee] += 1

    sys.setprofile(hook)
    try:
        action()
    finally:
        sys.setprofile(None)
    return sum(pairs.values()), pairs


def main() -> None:
    if len(sys.argv) > 1:
        sys.path.insert(0, sys.argv[1])
    import numpy as np

    import einflow as ef

    rng = np.random.default_rng(0)
    arrays = {"A": rng.normal(size=(3, 4)), "B": rng.normal(size=(4, 5))}
    mlp = "h[j] = tanh(W1[j,k] x[k])\nL = 0.5 * sum[i]((W2[i,j] h[j] - t[i])^2)"
    mlp_arrays = {"W1": rng.normal(size=(8, 6)), "x": rng.normal(size=6), "W2": rng.normal(size=(4, 8)),
                  "t": rng.normal(size=4)}
    counter = [0]

    def first_call() -> None:  # a new text each time, so nothing is cached
        counter[0] += 1
        ef.compile(f"C{counter[0]}[i,j] = A[i,k] B[k,j]")(**arrays)

    def derivation() -> None:
        counter[0] += 1
        ef.grad(mlp.replace("L =", f"L{counter[0]} ="), wrt=["W1", "W2"])

    def derivation_and_call() -> None:
        counter[0] += 1
        ef.grad(mlp.replace("L =", f"L{counter[0]} ="), wrt=["W1", "W2"])(**mlp_arrays)

    first_call()  # imports and one-time set-up out of the way
    derivation_and_call()
    total, pairs = crossings(first_call)
    print(f"einflow at {ef.__file__}")
    print(f"first call of a small program: {total} calls across einflow modules, {len(pairs)} module pairs")
    for (caller, callee), count in pairs.most_common(8):
        print(f"  {count:5d}  {caller} -> {callee}")
    total, pairs = crossings(derivation)
    print(f"grad of a 2-layer MLP (derivation only): {total} calls across einflow modules, {len(pairs)} pairs")
    for name, action in (("first call of a small program", first_call), ("grad of the MLP (derive)", derivation),
                         ("grad of the MLP + first call", derivation_and_call)):
        times = []
        for _ in range(15):
            start = time.perf_counter()
            action()
            times.append(time.perf_counter() - start)
        print(f"{name}: median {statistics.median(times) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
