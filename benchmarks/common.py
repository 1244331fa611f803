"""Shared timing helpers for the benchmarks: medians of interleaved repeats, ratio tables."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

__all__ = ["median_time", "compare", "machine", "format_table", "optional", "calibrate", "Row", "PEERS",
           "combined_table", "seconds", "ratio"]

#: the peer columns of the combined table, in order
PEERS = ("numpy.einsum", "numpy.einsum optimize", "opt_einsum", "jax.jit", "torch", "dask.array.einsum")


def median_time(function: Callable[[], Any], repeat: int = 7, number: int = 1) -> float:
    """Median seconds per call of ``function`` over ``repeat`` runs of ``number`` calls (after one warm-up)."""
    function()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            function()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def compare(candidates: dict[str, Callable[[], Any]], repeat: int = 7, number: int = 1,
            isolate: tuple[str, ...] = ("jax.jit", "torch"),
            clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Medians for several candidates, measured interleaved (round-robin) so machine noise hits all alike.

    Candidates named in ``isolate`` (jax, torch) are measured afterwards, each in its own block: their
    worker threads and large allocations otherwise slow down whichever candidate runs right after them.
    ``clock``: wall time by default; ``time.process_time`` (CPU time of all the process's threads) is not
    stretched by other jobs on a shared machine.
    """
    shared = {name: f for name, f in candidates.items() if name not in isolate}
    for function in shared.values():
        function()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, function in shared.items():
            start = clock()
            for _ in range(number):
                function()
            samples[name].append((clock() - start) / number)
    for name, function in candidates.items():
        if name in shared:
            continue
        function()
        for _ in range(repeat):
            start = clock()
            for _ in range(number):
                function()
            samples[name].append((clock() - start) / number)
    return {name: statistics.median(values) for name, values in samples.items()}


def machine() -> str:
    import os

    import numpy

    return (f"{date.today().isoformat()}, {platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, numpy {numpy.__version__}")


def format_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[k])) for r in [header, *rows]) for k in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, rule, *body])


def optional(module: str) -> Any:
    """Import an optional reference library, or None when it is not installed."""
    try:
        return __import__(module)
    except ImportError:
        return None


def calibrate(function: Callable[[], Any], seconds: float = 0.02) -> int:
    """How many calls of ``function`` make one timing sample last about ``seconds`` (at least 1)."""
    function()
    start = time.perf_counter()
    function()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(100_000, int(seconds / once)))


def seconds(value: float) -> str:
    """A duration with a readable unit."""
    if value < 1e-3:
        return f"{value * 1e6:.1f} us"
    if value < 1:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.2f} s"


@dataclass
class Row:
    """One line of the combined table: einflow's measurement, its target, and ratios to peers.

    ``ratio`` is einflow / reference (the target's reference); ``peers`` maps a peer name to
    einflow's time divided by the peer's time (below 1: einflow is faster).
    """

    section: str
    case: str
    einflow: str
    reference: str = ""
    ratio: float | None = None
    target: float | None = None  # the ratio must be at most this
    peers: dict[str, float | str] = field(default_factory=dict)

    @property
    def met(self) -> str:
        if self.target is None or self.ratio is None:
            return ""
        return "yes" if self.ratio <= self.target else "NO"


def ratio(value: float) -> str:
    """A ratio with two significant digits below 0.1 (0.0053), two decimals up to 10, none above."""
    if value >= 10:
        return f"{value:.0f}"
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.2g}"


def combined_table(rows: list[Row]) -> str:
    """One markdown table for every section: ratios are einflow ÷ the other (below 1: einflow is faster)."""
    header = ["section", "case", "einflow", "reference", "einflow ÷ ref", "target", "met", *PEERS]
    used = [peer for peer in PEERS if any(peer in row.peers for row in rows)]
    header = header[:7] + used
    body = []
    for row in rows:
        cells = [row.section, row.case, row.einflow, row.reference,
                 "" if row.ratio is None else ratio(row.ratio),
                 "" if row.target is None else f"≤ {row.target:g}", row.met]
        for peer in used:
            value = row.peers.get(peer, "")
            cells.append(ratio(value) if isinstance(value, float) else str(value))
        body.append(cells)
    return format_table(body, header)
