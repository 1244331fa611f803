"""Shared timing helpers for the benchmarks: medians of interleaved repeats, ratio tables."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from datetime import date
from typing import Any

__all__ = ["median_time", "compare", "machine", "format_table", "optional"]


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
            isolate: tuple[str, ...] = ("jax.jit", "torch")) -> dict[str, float]:
    """Medians for several candidates, measured interleaved (round-robin) so machine noise hits all alike.

    Candidates named in ``isolate`` (jax, torch) are measured afterwards, each in its own block: their
    worker threads and large allocations otherwise slow down whichever candidate runs right after them.
    """
    shared = {name: f for name, f in candidates.items() if name not in isolate}
    for function in shared.values():
        function()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, function in shared.items():
            start = time.perf_counter()
            for _ in range(number):
                function()
            samples[name].append((time.perf_counter() - start) / number)
    for name, function in candidates.items():
        if name in shared:
            continue
        function()
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                function()
            samples[name].append((time.perf_counter() - start) / number)
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
