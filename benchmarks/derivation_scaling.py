"""How derivation time grows with a program's size: nesting depth and statement count (issue #18 item 4),
and the second derivatives of a deep nested function (issue #27 item 4).

Run: ``.venv/bin/python benchmarks/derivation_scaling.py [--hessian-only]``. Prints seconds per ``ef.grad``
(median of 3) for nested functions ``sin(sin(...(x[i] x[i])))`` and for chains of ``h_k[i] = tanh(h_{k-1}[i])``
statements, and the time per unit of size, which stays flat when derivation is linear. Then, for
``f = sum[i](sin(sin(...x[i]...)))`` at depth d: CPU seconds of ``ef.hessian`` (and ``ef.hvp``; median of 3),
of the derived program's first call on 1,000 elements, and the printed program's length. The parser refuses
text nested deeper than about 170 calls, so those programs are built as IR (the derivation is the same).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import einflow as ef
from einflow.lang import ir


def nested(depth: int) -> str:
    return "f = " + "sin(" * depth + "x[i] x[i]" + ")" * depth


def chain(statements: int) -> str:
    lines = ["h0[i] = tanh(x[i])"]
    lines += [f"h{k}[i] = tanh(h{k - 1}[i])" for k in range(1, statements - 1)]
    lines.append(f"f = h{statements - 2}[i] h{statements - 2}[i]")
    return "\n".join(lines)


def seconds(text: str) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        ef.grad(text, wrt="x")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def nested_sum(depth: int) -> ef.Program:
    """``f = sum[i](sin(sin(...x[i]...)))`` with ``depth`` calls, built as IR (deeper than the parser takes)."""
    expr: ir.Expr = ir.Tensor("x", ("i",))
    for _ in range(depth):
        expr = ir.Call("sin", expr)
    return ef.Program(ir.ProgramIR((ir.Assign("f", None, ir.Reduce(("i",), expr)),)))


def second_derivative(what: str, depth: int) -> tuple[float, float, int]:
    """(CPU seconds of deriving, median of 3; CPU seconds of the first call on 1,000 elements; characters)."""
    program = nested_sum(depth)
    times = []
    for _ in range(3):
        start = time.process_time()
        derived = getattr(ef, what)(program, wrt="x")
        times.append(time.process_time() - start)
    x = np.linspace(-1.5, 1.5, 1000)
    start = time.process_time()
    derived(x=x, T=x) if what == "hvp" else derived(x=x)
    return statistics.median(times), time.process_time() - start, len(derived.text)


def hessians() -> None:
    print("| derivative | depth d | derivation CPU s | first call CPU s | characters | characters / d |")
    print("|---|---|---|---|---|---|")
    second_derivative("hessian", 5)  # imports, caches
    for what in ("hessian", "hvp"):
        for depth in (10, 25, 50, 100, 200):
            derive, first, chars = second_derivative(what, depth)
            print(f"| {what} | {depth} | {derive:.3f} | {first:.3f} | {chars} | {chars / depth:.0f} |", flush=True)


def main() -> None:
    if "--hessian-only" in sys.argv:
        hessians()
        return
    print(f"{'program':<28} {'size':>5} {'seconds':>9} {'ms per unit':>12}")
    for depth in (10, 25, 50, 100, 150):  # the parser refuses nesting much deeper (a ParseError)
        took = seconds(nested(depth))
        print(f"{'nested sin':<28} {depth:>5} {took:>9.3f} {1000 * took / depth:>12.2f}")
    for count in (10, 50, 100, 250, 500):
        took = seconds(chain(count))
        print(f"{'tanh statements':<28} {count:>5} {took:>9.3f} {1000 * took / count:>12.2f}")
    print()
    hessians()


if __name__ == "__main__":
    main()
