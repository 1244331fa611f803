"""Fused elementwise work: einflow against numpy and jax.jit on the same functions, and memory bandwidth.

``y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])`` at 2000x2000 (float64) is one fused step that
einflow computes block by block on threads (``einflow.engine.blocks``); the elementwise product and the
difference ``A - B C`` (issue #13) are one ufunc call or two. The bandwidth fraction is the time of a
plain streaming ``A + B -> C`` (the same three arrays' worth of memory traffic) over the program's time.

Timing: rounds of a block of calls of each candidate in turn (each sample the median of 4 calls after a
first one); the ratio to jax is the median over rounds of the two times measured in the same round, so
that the changing load of this shared machine cancels out as far as it can.

Run:  python benchmarks/elementwise.py [--threads N] [--repeat R] [--n N]
(``--threads 1`` pins the process, jax included, to one core and computes einflow on one thread.)
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, format_table, machine, optional, ratio, seconds  # noqa: E402

import einflow as ef  # noqa: E402

try:
    blocks = importlib.import_module("einflow.engine.blocks")
except ImportError:  # an einflow from before block evaluation, timed alike
    blocks = None

__all__ = ["run", "main", "CASES"]

TEXT = "y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])"


def _numpy_sigmoid_program(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(A))
    r = 1 / (1 + e)
    return np.tanh(A) * np.exp(B) + np.where(A >= 0, r, e * r)


#: (einflow text, the same in numpy, the same in jax.numpy as text over a, b, c)
CASES: list[tuple[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], str]] = [
    (TEXT, _numpy_sigmoid_program, "jnp.tanh(a) * jnp.exp(b) + jax.nn.sigmoid(a)"),
    ("y[i,j] = A[i,j] B[i,j]", lambda A, B, C: A * B, "a * b"),
    ("y[i,j] = A[i,j] - B[i,j] C[i,j]", lambda A, B, C: A - B * C, "a - b * c"),
]


def _rounds(candidates: dict[str, Callable[[], Any]], repeat: int, calls: int = 4) -> dict[str, list[float]]:
    """Seconds per call of each candidate: per round, the median of ``calls`` calls in a row after a first
    one (jax's allocator and worker threads settle within a block; between others' calls they do not)."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, function in candidates.items():
            function()
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                function()
                times.append(time.perf_counter() - start)
            samples[name].append(statistics.median(times))
    return samples


def run(repeat: int = 7, n: int = 2000) -> tuple[str, list[Row]]:
    rng = np.random.default_rng(0)
    A, B, C = (rng.standard_normal((n, n)) for _ in range(3))
    out = np.empty_like(A)
    jax = optional("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
        jnp = jax.numpy
        ja, jb, jc = jnp.asarray(A), jnp.asarray(B), jnp.asarray(C)
    rows = []
    lines = []
    for text, numpy_version, jax_text in CASES:
        program = ef.compile(text)
        arrays = {name: value for name, value in (("A", A), ("B", B), ("C", C)) if f"{name}[" in text}
        np.testing.assert_allclose(program(**arrays), numpy_version(A, B, C), rtol=1e-12, atol=1e-14)
        candidates: dict[str, Callable[[], Any]] = {
            "einflow": lambda program=program, arrays=arrays: program(**arrays),
            "numpy": lambda numpy_version=numpy_version: numpy_version(A, B, C),
            "stream": lambda: np.add(A, B, out=out)}
        if jax is not None:
            function = jax.jit(eval(f"lambda a, b, c: {jax_text}", {"jax": jax, "jnp": jnp}))  # noqa: S307
            candidates["jax.jit"] = lambda function=function: function(ja, jb, jc).block_until_ready()
        samples = _rounds(candidates, repeat)
        times = {name: statistics.median(values) for name, values in samples.items()}
        peers: dict[str, float | str] = {"numpy (unfused)": times["einflow"] / times["numpy"]}
        case = f"{text} at {n}x{n} float64"
        if jax is not None:
            paired = statistics.median(e / j for e, j in zip(samples["einflow"], samples["jax.jit"]))
            peers["jax.jit time"] = seconds(times["jax.jit"])
            rows.append(Row("elementwise", case, seconds(times["einflow"]), "jax.jit (x64)", paired,
                            1.2 if text == TEXT else None, peers))
        else:
            rows.append(Row("elementwise", case, seconds(times["einflow"]), "", None, None, peers))
        fraction = statistics.median(s / e for s, e in zip(samples["stream"], samples["einflow"]))
        rows.append(Row("elementwise", f"{text}: fraction of streaming bandwidth (A + B -> C time / program time)",
                        f"{fraction:.1%}", "np.add(A, B, out=C)", 1 / fraction))
        versus = rows[-2].ratio
        lines.append([f"`{text}`", seconds(times["einflow"]), seconds(times["numpy"]),
                      seconds(times["jax.jit"]) if jax is not None else "n/a",
                      "n/a" if versus is None else ratio(versus), f"{fraction:.1%}", seconds(times["stream"])])
    header = ["case", "einflow", "numpy (one expression)", "jax.jit", "einflow ÷ jax.jit (paired median)",
              "fraction of streaming bandwidth", "A + B -> C"]
    return format_table(lines, header), rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="pin to this many cores (jax too); 0: all")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--n", type=int, default=2000)
    options = parser.parse_args(argv)
    if options.threads:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:options.threads])
        if blocks is not None:
            blocks.THREADS = options.threads
    table, _ = run(options.repeat, options.n)
    threads = options.threads or (blocks.THREADS if blocks is not None else 1)
    print(f"## Fused elementwise work ({machine()}; einflow on {threads} thread(s), process on "
          f"{len(os.sched_getaffinity(0))} core(s))\n")
    print(table)


if __name__ == "__main__":
    main()
