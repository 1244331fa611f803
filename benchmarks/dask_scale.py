"""Dask at scale: (a) a 3+ GB operand made lazily on a LocalCluster and reduced by an einflow program,
with the client's peak memory; (b) a matrix chain on chunked arrays, einflow vs ``dask.array.einsum``.

einflow's dask backend turns the program into one task graph whose contractions follow opt_einsum's
pairwise plan (``dask.array.tensordot``); ``dask.array.einsum`` instead runs one blockwise ``numpy.einsum``
over every combination of blocks of all indices, with no contraction tree.

Run:  python benchmarks/dask_scale.py            (about 3 minutes on 2 cores)
      python benchmarks/dask_scale.py --quick    (a smaller operand, for a smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from common import format_table, machine

import einflow as ef

__all__ = ["main"]

LOSS = """
z[s] = X[s,f] w[f]
L = sum[s](log(1 + exp(-y[s] z[s])))
"""
CHAIN = "D[i,l] = A[i,j] B[j,k] C[k,l]"


def _peak_rss_kib() -> int:
    """This process image's peak resident memory in KiB (VmHWM)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))


class PeakRSS:
    """Samples this process's resident memory in a background thread; ``peak`` is the largest sample."""

    def __init__(self, interval: float = 0.01) -> None:
        import psutil

        self.process = psutil.Process()
        self.interval = interval
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def big_operand(client: Any, rows: int, cols: int, chunk_rows: int) -> list[list[str]]:
    """(a) logistic loss (and its gradient, if einflow.value_and_grad exists) of a rows x cols operand."""
    import dask
    import dask.array as da

    rng = da.random.default_rng(0)
    X = rng.standard_normal((rows, cols), chunks=(chunk_rows, cols))
    y = da.sign(rng.standard_normal(rows, chunks=chunk_rows))
    w = np.random.default_rng(1).standard_normal(cols) / np.sqrt(cols)  # numpy, mixed with dask inputs
    if hasattr(ef, "value_and_grad"):
        program, what = ef.value_and_grad(LOSS, wrt="w"), "value_and_grad(logistic loss, wrt=w)"
    else:  # pragma: no cover - before derivatives existed
        program, what = ef.compile(LOSS), "logistic loss"
    gigabytes = X.nbytes / 1e9
    with PeakRSS() as memory:
        start = time.perf_counter()
        lazy = program(X=X, y=y, w=w)  # dask inputs: a lazy graph, nothing computed yet
        built = time.perf_counter() - start
        outputs = lazy if isinstance(lazy, tuple) else (lazy,)
        flat = [part for out in outputs for part in (out if isinstance(out, tuple) else (out,))]
        computed = dask.compute(*flat)
        wall = time.perf_counter() - start
    # an independent check with dask's own operations on the same (deterministic) operand
    reference = da.log1p(da.exp(-y * (X @ w))).sum().compute()
    error = abs(float(computed[0]) - float(reference)) / abs(float(reference))
    # each worker's peak resident memory over its life (VmHWM, KiB; getrusage's ru_maxrss would keep the peak of
    # the process that started the worker across fork+exec); (a) runs first
    workers = client.run(_peak_rss_kib)
    return [
        ["operand", f"X: {rows} x {cols} float64 = {gigabytes:.2f} GB, {X.npartitions} chunks of "
                    f"{chunk_rows} x {cols} ({X.nbytes / X.npartitions / 2**20:.0f} MiB), made by dask.array.random"],
        ["program", what],
        ["graph built in", f"{built:.3f} s"],
        ["wall time (build + compute)", f"{wall:.1f} s"],
        ["client peak RSS", f"{memory.peak / 2**30:.2f} GiB (target < 1.5 GB)"],
        ["worker peak RSS", ", ".join(f"{rss / 2**20:.2f} GiB" for rss in workers.values())],
        ["relative error of L vs dask-only expression", f"{error:.1e}"],
    ]


def _median(function: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def chain(client: Any, size: int, chunk: int, optimize: Any, repeat: int) -> list[str]:
    """(b) einflow's pairwise plan vs one dask.array.einsum call on the same persisted chunked matrices."""
    import dask.array as da

    rng = da.random.default_rng(2)
    A, B, C = client.persist([rng.standard_normal((size, size), chunks=chunk) / np.sqrt(size) for _ in range(3)])
    program = ef.compile(CHAIN)
    program(A=A, B=B, C=C).compute()  # warm-up: plan built and cached
    ours, D_ours = _median(lambda: program(A=A, B=B, C=C).compute(), repeat)
    theirs, D_theirs = _median(lambda: da.einsum("ij,jk,kl->il", A, B, C, optimize=optimize).compute(),
                               max(1, repeat // 3) if optimize is False else repeat)
    np.testing.assert_allclose(D_ours, D_theirs, rtol=1e-9, atol=1e-9)
    blocks = size // chunk
    return [f"{size} x {size}, chunks {chunk} ({blocks}x{blocks} blocks)", f"optimize={optimize!r}",
            f"{ours:.3f} s", f"{theirs:.3f} s", f"{theirs / ours:.1f}x"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 0.4 GB operand and small chains")
    args = parser.parse_args()
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        print("dask.distributed is not installed: pip install 'einflow[dask]'")
        return
    # dask.array.einsum warns when it splits blocks to bound its all-index intermediate: expected here
    warnings.filterwarnings("ignore", message="Increasing number of chunks")
    rows = 50_000 if args.quick else 400_000
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit="6GiB", silence_logs=40) as cluster, Client(cluster) as client:
        print(f"## Dask\n\n{machine()}; LocalCluster: 2 worker processes x 1 thread\n")
        print("### (a) a lazily generated operand reduced by an einflow program\n")
        print(format_table(big_operand(client, rows, 1000, 16_000 if not args.quick else 5_000),
                           ["", "result"]))
        print(f"\n### (b) `{CHAIN}` on chunked arrays: einflow vs `dask.array.einsum`\n")
        rows_b = [chain(client, 240 if args.quick else 360, 60 if args.quick else 90, False, 3),
                  chain(client, 600 if args.quick else 2400, 150 if args.quick else 600, True, 3)]
        print(format_table(rows_b, ["matrices", "dask.array.einsum", "einflow", "dask.array.einsum", "ratio"]))
        print("\n(einflow: two dask.array.tensordot steps from opt_einsum's plan; dask.array.einsum: one "
              "blockwise numpy.einsum over all i,j,k,l block combinations, then a sum.)")


if __name__ == "__main__":
    main()
