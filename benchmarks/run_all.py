"""`make bench`: every benchmark section, printed as one table of ratios (einflow ÷ the other).

Sections: call overhead, contractions (vs numpy.einsum, opt_einsum, jax.jit, torch), shared work,
memory (measured vs predicted peak), fused elementwise work (vs jax.jit), derivatives
(benchmarks/derivatives.py), large tensor networks (path FLOPs vs cotengra, gradient / forward FLOPs,
benchmarks/networks.py), dask (a chunked matrix chain vs dask.array.einsum from
benchmarks/dask_scale.py; its multi-GB operand run only with
--dask), slicing (programs over a memory limit run sliced under it, benchmarks/slicing.py) and the numpy
backend against hand-written numpy/scipy and torch's conv2d (benchmarks/hand_speed.py; pin it to one core
with one BLAS thread for the issue's conditions).
jax and torch are optional: their columns are left out when they are not installed.

Run:  python benchmarks/run_all.py [--quick] [--dask] [--write] [--only SECTION ...] [--torch-hessians]
      --write replaces the result tables of this suite's sections of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import Row, combined_table, machine  # noqa: E402

__all__ = ["SECTIONS", "main"]

DOCS = HERE.parent / "docs" / "benchmarks.md"


def _number(text: str) -> float | None:
    match = re.search(r"[-+]?\d*\.?\d+(?:e[-+]?\d+)?", text)
    return float(match.group()) if match else None


def _derivatives(repeat: int, quick: bool) -> list[Row]:
    """The derivative benchmark's rows, its ratios turned into einflow ÷ other.

    torch's Hessians (torch.autograd.functional.hessian) take seconds to tens of seconds per call on these
    cases, which alone would take `make bench` past ten minutes: they run only with --torch-hessians.
    """
    import derivatives

    _, raw = derivatives.run(repeat=3 if quick else repeat, torch_hessians=TORCH_HESSIANS)
    rows = []
    for cells in raw:
        row = Row("derivatives", cells[0], cells[1], "hand numpy", _number(cells[2]))
        for peer, cell in (("jax.jit", cells[3] if len(cells) > 3 else "n/a"),
                           ("torch", cells[4] if len(cells) > 4 else "n/a")):
            value = _number(cell) if cell != "n/a" else None
            if value:
                row.peers[peer] = 1 / value  # derivatives.py prints other / einflow
        rows.append(row)
    return rows


def _dask(repeat: int, quick: bool) -> list[Row]:
    """A chunked matrix chain: einflow's pairwise plan vs one dask.array.einsum call."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        return []
    import dask_scale

    warnings.filterwarnings("ignore", message="Increasing number of chunks")
    sizes = [(240, 60, False), (600, 150, True)] if quick else [(480, 120, False), (1200, 300, True)]
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        for size, chunk, optimize in sizes:
            cells = dask_scale.chain(client, size, chunk, optimize, 3)
            ours, theirs = _number(cells[2]), _number(cells[3])
            assert ours and theirs
            rows.append(Row("dask", f"{dask_scale.CHAIN}, {cells[0]}", cells[2], f"dask.array.einsum "
                            f"{cells[1]}", ours / theirs))
    return rows


def _slicing(repeat: int, quick: bool) -> list[Row]:
    """Programs over the memory limit, sliced (benchmarks/slicing.py): measured peak / limit, FLOP overhead."""
    import slicing

    return slicing.run(repeat, quick=quick)[1]


def _section(module: str) -> Callable[[int, bool], list[Row]]:
    def run(repeat: int, quick: bool) -> list[Row]:
        imported = __import__(module)
        if module in ("contractions", "networks"):
            return imported.run(repeat=repeat, quick=quick)[1]
        return imported.run(repeat=repeat)[1]

    return run


#: name -> (docs section title, runner)
SECTIONS: dict[str, tuple[str, Callable[[int, bool], list[Row]]]] = {
    "overhead": ("Call overhead", _section("overhead")),
    "contractions": ("Contractions", _section("contractions")),
    "shared_work": ("Shared work", _section("shared_work")),
    "memory": ("Memory", _section("memory")),
    "elementwise": ("Fused elementwise work", _section("elementwise")),
    "derivatives": ("Derivatives", _derivatives),
    "networks": ("Large networks", _section("networks")),
    "dask": ("Dask", _dask),
    "slicing": ("Slicing", _slicing),
    "hand_speed": ("The numpy backend against hand-written numpy", _section("hand_speed")),
}
#: the sections of docs/benchmarks.md whose result tables --write replaces (between their markers)
OWNED = ("overhead", "contractions", "shared_work", "memory")
TORCH_HESSIANS = False


def write_docs(tables: dict[str, str], stamp: str) -> None:
    """Replace the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in docs/benchmarks.md;
    a section without markers gets a new '## title' section with them at the end. Prose stays as written."""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    for name, table in tables.items():
        start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        block = f"{start}\n{stamp}\n\n{table}\n{end}"
        pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _, block=block: block, text, count=1)
        else:
            text = text.rstrip("\n") + f"\n\n## {SECTIONS[name][0]}\n\n{block}\n"
    DOCS.write_text(text.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and cases (a smoke test)")
    parser.add_argument("--dask", action="store_true", help="also run benchmarks/dask_scale.py (a 3 GB operand)")
    parser.add_argument("--write", action="store_true", help="rewrite this suite's sections of docs/benchmarks.md")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), help="run only these sections")
    parser.add_argument("--torch-hessians", action="store_true",
                        help="include torch in the derivative rows (its Hessians take many minutes)")
    args = parser.parse_args(argv)
    global TORCH_HESSIANS
    TORCH_HESSIANS = args.torch_hessians
    repeat = 3 if args.quick else 9
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    stamp = f"Measured {machine()}; medians of {repeat} interleaved repeats; load average {load:.1f} at the start."
    print(f"# einflow benchmarks\n\n{stamp}\n", flush=True)
    rows: list[Row] = []
    tables: dict[str, str] = {}
    for name, (title, runner) in SECTIONS.items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        found: list[Any] = runner(repeat, args.quick)
        print(f"  {title}: {len(found)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        rows.extend(found)
        if name in OWNED and found:
            tables[name] = combined_table(found)
    print(combined_table(rows))
    print("\nRatios are einflow's median divided by the other's (memory: measured peak ÷ predicted peak); "
          "below 1, einflow is faster. 'target' is the issue's bound on einflow ÷ ref.")
    missed = [row for row in rows if row.met == "NO"]
    for row in missed:
        print(f"target missed: {row.section} / {row.case}: {row.ratio:.2f} > {row.target}")
    if args.dask:
        print(flush=True)
        subprocess.run([sys.executable, str(HERE / "dask_scale.py")], check=False)
    if args.write:
        write_docs(tables, stamp)
        print(f"\nwrote {', '.join(SECTIONS[name][0] for name in tables)} to {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
