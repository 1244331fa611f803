"""Slicing: programs whose plans do not fit the memory limit, run in slices under it (numpy and dask).

Cases (issue 15):

- **8x**: ``s = A[i,j] B[j,k] C[k,l] D[l,i]`` (the trace of a ring of four matrices), whose unsliced plan
  needs 8x the limit: it must run under the limit with at most 1.5x the unsliced FLOPs;
- **grid**: a 5x5 grid tensor network (bond 19, open boundary, contracted to a number) whose plan with the
  default path needs more than 1 GiB, under a 1 GiB limit;
- **Hessian**: the logistic-regression Hessian ``X[s,p] X[s,q] ...`` over 1.5 million samples (its
  weighted copy of X alone is 1.1 GiB), under a 1 GiB limit;
- the same three on a dask LocalCluster (2 worker processes, 1 thread and a 1 GiB memory limit each):
  each slice is a task, sized to a third of the limit (``einflow.engine.fitting.TASKS_AT_ONCE``); the Hessian's
  samples are generated on the workers in chunks (a lazy dask input), so no process holds all of X. The
  8x case's numpy inputs travel in the graph, so its workers' resident sets hold them too (no target).

Each numpy case runs in a fresh Python process so that its memory is its own: the peak is measured twice,
with tracemalloc (numpy's allocations during the call) and as the rise of the process's peak resident set
(VmHWM) during the call. On the cluster each worker's peak resident set is read after the run, less what
it held before. Results are checked against an unsliced numpy computation.

Sizes: the default run (1.5 minutes on 2 busy cores) keeps every case at half the issue's limit: the grid
at bond 17 and the Hessian over 800,000 samples, both under 512 MiB (a quarter, 256 MiB, is too small for
the dask rows: a worker's fixed overhead then exceeds the limit's share); ``--full`` runs the issue's sizes
(bond 19, 1.5 million samples, 1 GiB: about 4 minutes); ``--quick`` is a smoke test of seconds.

Run:  python benchmarks/slicing.py [--quick | --full] [--no-dask]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, format_table, machine  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["CASES", "grid_text", "run", "main"]

GIB = 2**30
RING = "s = A[i,j] B[j,k] C[k,l] D[l,i]"
#: per mode: ring matrix size, grid bond, Hessian samples and features, the fixed limit of grid and Hessian
#: (None: half the unsliced plan's peak)
SIZES: dict[str, dict[str, Any]] = {
    "quick": {"ring": 400, "bond": 12, "samples": 200_000, "features": 50, "limit": None},
    "default": {"ring": 1200, "bond": 17, "samples": 800_000, "features": 100, "limit": GIB // 2},
    "full": {"ring": 1200, "bond": 19, "samples": 1_500_000, "features": 100, "limit": GIB},
}
LOGISTIC = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"


def grid_text(n: int = 5) -> str:
    """An n x n grid tensor network with open boundaries, contracted to a number."""
    names: dict[tuple[Any, ...], str] = {}

    def bond(a: tuple[int, int], b: tuple[int, int]) -> str:
        return names.setdefault(tuple(sorted((a, b))), f"b{len(names)}")

    factors = []
    for r in range(n):
        for c in range(n):
            around = [(r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)]
            labels = [bond((r, c), nb) for nb in around if 0 <= nb[0] < n and 0 <= nb[1] < n]
            factors.append(f"T{r}{c}[{','.join(labels)}]")
    return "z = " + " ".join(factors)


def _ring(mode: str) -> tuple[ef.Program, dict[str, np.ndarray], float, Any]:
    n = SIZES[mode]["ring"]
    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal((n, n)) / n**0.5 for name in "ABCD"}
    program = ef.compile(RING)
    shapes = {name: value.shape for name, value in arrays.items()}
    limit = program.plan(**shapes).peak_bytes / 8

    def reference() -> Any:
        return np.trace((arrays["A"] @ arrays["B"]) @ (arrays["C"] @ arrays["D"]))

    return program, arrays, limit, reference


def _grid(mode: str) -> tuple[ef.Program, dict[str, np.ndarray], float, Any]:
    bond = SIZES[mode]["bond"]
    text = grid_text(5)
    rng = np.random.default_rng(1)
    arrays = {match.group(1): rng.standard_normal((bond,) * (match.group(2).count(",") + 1)) / bond**0.5
              for match in re.finditer(r"(T\d\d)\[([^\]]*)\]", text)}
    program = ef.compile(text)
    limit = SIZES[mode]["limit"] or program.plan(**{k: v.shape for k, v in arrays.items()}).peak_bytes / 2

    def reference() -> Any:
        return program(arrays, memory_limit=None)

    return program, arrays, limit, reference


def _hessian(mode: str) -> tuple[ef.Program, dict[str, np.ndarray], float, Any]:
    samples, features = SIZES[mode]["samples"], SIZES[mode]["features"]
    rng = np.random.default_rng(2)
    arrays = {"X": rng.standard_normal((samples, features)), "y": np.sign(rng.standard_normal(samples)),
              "w": rng.standard_normal(features) / features}
    program = ef.hessian(LOGISTIC, wrt="w")
    limit = SIZES[mode]["limit"] or program.plan(X=(samples, features), y=(samples,), w=(features,)).peak_bytes / 2

    def reference() -> Any:
        x, y, w = arrays["X"], arrays["y"], arrays["w"]
        p = 1 / (1 + np.exp(-y * (x @ w)))
        return (x * (p * (1 - p))[:, None]).T @ x

    return program, arrays, limit, reference


CASES = {"8x": _ring, "grid": _grid, "Hessian": _hessian}


def _labels(mode: str) -> dict[str, str]:
    sizes = SIZES[mode]
    limit = "half its unsliced peak" if sizes["limit"] is None else _mib(sizes["limit"]).replace("1024 MiB", "1 GiB")
    return {"8x": f"`{RING}`, unsliced peak 8x the limit",
            "grid": f"5x5 grid network (bond {sizes['bond']}) under {limit}",
            "Hessian": f"logistic Hessian, {sizes['samples']:,} x {sizes['features']} samples, under {limit}"}


def _high_water() -> int:
    """This process's peak resident set (bytes), from /proc (0 where there is none)."""
    try:
        with open("/proc/self/status") as file:
            return next(int(line.split()[1]) * 1024 for line in file if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return 0


def _reset_high_water() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


def child(name: str, mode: str) -> dict[str, Any]:
    """One numpy case, measured in this (fresh) process."""
    program, arrays, limit, reference = CASES[name](mode)
    shapes = {key: value.shape for key, value in arrays.items()}
    whole = program.plan(**shapes)
    start = time.perf_counter()
    report = program.plan(**shapes, memory_limit=limit)
    planning = time.perf_counter() - start
    program(arrays, memory_limit=limit) if name == "8x" else None  # warm (the cheap case only)
    expected = reference()
    reset = _reset_high_water()
    before = _high_water()
    tracemalloc.start()
    start = time.perf_counter()
    value = program(arrays, memory_limit=limit)
    seconds = time.perf_counter() - start
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = _high_water() - before if reset else -1
    sliced = [(list(step.sliced), step.slices, step.overhead) for step in report.sliced]
    error = float(np.max(np.abs(np.asarray(value) - expected)) / max(np.max(np.abs(expected)), 1e-300))
    return {"limit": limit, "unsliced_peak": whole.peak_bytes, "peak": report.peak_bytes, "traced": traced,
            "rss": rss, "flops": report.flops, "unsliced_flops": whole.flops, "sliced": sliced,
            "seconds": seconds, "planning": planning, "error": error,
            "value": float(np.asarray(value)) if np.ndim(value) == 0 else None}


def _numpy_rows(mode: str) -> list[dict[str, Any]]:
    results = []
    for name in CASES:
        command = [sys.executable, __file__, "--child", name, "--mode", mode]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"case {name} failed:\n{done.stderr[-3000:]}")
        results.append({"case": name, **json.loads(done.stdout.strip().splitlines()[-1])})
    return results


def _dask_rows(mode: str, values: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The same cases on a LocalCluster: each slice a task; the workers' peak resident sets measured.

    ``values``: the numpy runs' checked scalar results, reused as references (the grid's takes seconds)."""
    try:
        import dask.array as da
        from distributed import Client, LocalCluster
    except ImportError:
        return []
    results = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40, memory_limit=GIB) as cluster, Client(cluster) as client:
        for name in CASES:
            program, arrays, limit, reference = CASES[name](mode)
            if name == "8x":  # a task holds its operand blocks too: the limit is 1/8 of operands and plan together
                limit = (limit * 8 + sum(value.nbytes for value in arrays.values())) / 8
            known = (values or {}).get(name)
            expected = np.asarray(known) if known is not None else reference() if name != "Hessian" else None
            inputs: dict[str, Any] = arrays
            if name == "Hessian":  # the samples are made on the workers, chunk by chunk: the client never holds them
                samples, features = arrays["X"].shape
                generator = da.random.default_rng(3)
                x = generator.standard_normal((samples, features), chunks=(samples // 16, features))
                y = da.sign(generator.standard_normal(samples, chunks=samples // 16))
                inputs = {"X": x, "y": y, "w": arrays["w"]}
                p = 1 / (1 + da.exp(-y * (x @ arrays["w"])))
                expected = np.asarray(((x * (p * (1 - p))[:, None]).T @ x).compute())
            shapes = {key: value.shape for key, value in arrays.items()}
            report = program.plan(**shapes, backend="dask", memory_limit=limit)
            client.run(_reset_high_water)
            before = client.run(_high_water)
            start = time.perf_counter()
            value = program(inputs, backend="dask", memory_limit=limit)
            value = np.asarray(value.compute() if hasattr(value, "compute") else value)
            seconds = time.perf_counter() - start
            after = client.run(_high_water)
            rise = max(after[worker] - before[worker] for worker in after)
            error = float(np.max(np.abs(value - expected)) / max(np.max(np.abs(expected)), 1e-300))
            sliced = [(list(step.sliced), step.slices, step.overhead) for step in report.sliced]
            results.append({"case": name, "limit": limit, "sliced": sliced, "rss": rise, "seconds": seconds,
                            "error": error, "flops": report.flops, "task": report.peak_bytes})
            del inputs
    return results


def _mib(count: float) -> str:
    return f"{count / 2**20:.0f} MiB" if count >= 2**20 else f"{count / 2**20:.2f} MiB"


def _slices(sliced: list[Any]) -> str:
    return "; ".join(f"[{','.join(labels)}] x{count} ({overhead:.2f}x FLOPs)" for labels, count, overhead in sliced)


def run(repeat: int = 1, quick: bool = False, dask: bool = True, full: bool = False) -> tuple[str, list[Row]]:
    """Markdown tables and combined-table rows (ratio: measured peak / limit, target 1)."""
    del repeat  # each case runs once: the point is the memory, and the biggest take seconds
    mode = "quick" if quick else "full" if full else "default"
    labels = _labels(mode)
    numpy_results = _numpy_rows(mode)
    rows, table = [], []
    for result in numpy_results:
        measured = max(result["traced"], result["rss"])
        table.append([result["case"], _mib(result["limit"]), _mib(result["unsliced_peak"]), _mib(result["peak"]),
                      _mib(result["traced"]), _mib(result["rss"]) if result["rss"] >= 0 else "n/a",
                      _slices(result["sliced"]), f"{result['flops'] / result['unsliced_flops']:.3f}",
                      f"{result['seconds']:.1f} s", f"{result['error']:.1e}"])
        rows.append(Row("slicing", labels[result["case"]], _mib(measured), "the memory limit",
                        measured / result["limit"], 1.0))
        if result["case"] == "8x":
            rows.append(Row("slicing", "8x case: sliced FLOPs / unsliced FLOPs", f"{result['flops']:.3g}",
                            "unsliced FLOPs", result["flops"] / result["unsliced_flops"], 1.5))
    text = format_table(table, ["case", "limit", "unsliced peak (plan)", "sliced peak (plan)",
                                "measured (tracemalloc)", "measured (RSS rise)", "sliced over", "FLOPs / unsliced",
                                "time", "relative error"])
    if dask:
        dask_results = _dask_rows(mode, {result["case"]: result["value"] for result in numpy_results
                                          if result["value"] is not None})
        dask_table = []
        for result in dask_results:
            dask_table.append([result["case"], _mib(result["limit"]), _slices(result["sliced"]), _mib(result["task"]),
                               _mib(result["rss"]), f"{result['seconds']:.1f} s", f"{result['error']:.1e}"])
            # a worker holds its share of numpy inputs shipped in the graph too: only the 1 GiB cases, whose
            # inputs are small or made on the workers, compare its resident set with the limit
            rows.append(Row("slicing", f"dask LocalCluster: {labels[result['case']]}", _mib(result["rss"]),
                            "the memory limit", result["rss"] / result["limit"],
                            1.0 if result["case"] != "8x" and mode != "quick" else None))
        text += ("\n\nOn a dask LocalCluster (2 worker processes x 1 thread, 1 GiB memory limit each; each slice a "
                 "task):\n\n") + format_table(
            dask_table, ["case", "limit", "sliced over", "plan peak (per task)", "largest worker peak RSS rise",
                         "time", "relative error"])
    return text, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test, seconds)")
    parser.add_argument("--full", action="store_true", help="the issue's sizes: bond 19, 1.5M samples, 1 GiB")
    parser.add_argument("--mode", choices=sorted(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--no-dask", action="store_true", help="skip the LocalCluster runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.mode or ("quick" if args.quick else "default"))))
        return 0
    print(f"# Slicing\n\nMeasured {machine()}; load average {os.getloadavg()[0]:.1f} at the start.\n", flush=True)
    text, rows = run(quick=args.quick, dask=not args.no_dask, full=args.full)
    print(text)
    missed = [row for row in rows if row.met == "NO"]
    for row in missed:
        print(f"target missed: {row.case}: {row.ratio:.2f} > {row.target}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
