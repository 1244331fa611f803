"""How compile + first call grows with a program's size (issue 27): statement chains, wide products, long
sums, deep nesting, and the Hessian of a nested function.

Run: ``.venv/bin/python benchmarks/front_end.py [--quick]``. Each row: the size, CPU seconds of
``ef.compile(text)(arrays)`` in this process (``time.process_time``: other jobs on a shared machine do not
stretch it) and the seconds per 1,000 units, which stays flat when the work is linear. The nesting row
times a refused program; the Hessian rows give derivation seconds and the printed program's length.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from test_scale import chain, long_sum, product, seconds  # noqa: E402

import einflow as ef  # noqa: E402


def nested_hessian(depth: int) -> tuple[float, int]:
    """(CPU seconds of ef.hessian, characters of its program) for ``f = sum[i](sin(sin(...x[i]...)))``."""
    program = ef.compile("f = sum[i](" + "sin(" * depth + "x[i]" + ")" * depth + ")")
    start = time.process_time()
    hessian = ef.hessian(program, "x")
    return time.process_time() - start, len(hessian.text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 4,000 only")
    args = parser.parse_args()
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    seconds(chain, 50)
    print("| program | size | CPU seconds | per 1,000 |\n|---|---|---|---|")
    for name, make, sizes in (("statements t{k} = t{k-1} + 1", chain, (1000, 2000, 4000, 10000)),
                              ("product of n vectors", product, (1000, 2000, 4000, 10000)),
                              ("sum of n terms", long_sum, (1000, 10000, 100000))):
        for size in sizes:
            if args.quick and size > 4000:
                continue
            took, _ = seconds(make, size)
            print(f"| {name} | {size} | {took:.2f} | {1000 * took / size:.3f} |", flush=True)
    for depth in (1000, 100_000):
        text = "y = " + "(" * depth + "x" + ")" * depth
        start = time.process_time()
        try:
            ef.compile(text)
        except ef.ParseError:
            pass
        print(f"| {depth} nested parentheses (refused) | {depth} | {time.process_time() - start:.3f} | |")
    print("\n| Hessian of sum[i](sin^d(x[i])): depth d | seconds | characters | characters / d |\n|---|---|---|---|")
    for depth in (5, 10, 20, 40) if not args.quick else (5, 10, 20):
        took, chars = nested_hessian(depth)
        print(f"| {depth} | {took:.2f} | {chars} | {chars / depth:.0f} |", flush=True)


if __name__ == "__main__":
    main()
