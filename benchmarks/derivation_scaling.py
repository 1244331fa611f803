"""How derivation time grows with a program's size: nesting depth and statement count (issue #18 item 4).

Run: ``.venv/bin/python benchmarks/derivation_scaling.py``. Prints seconds per ``ef.grad`` (median of 3)
for nested functions ``sin(sin(...(x[i] x[i])))`` and for chains of ``h_k[i] = tanh(h_{k-1}[i])``
statements, and the time per unit of size, which stays flat when derivation is linear.
"""

from __future__ import annotations

import statistics
import time

import einflow as ef


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


def main() -> None:
    print(f"{'program':<28} {'size':>5} {'seconds':>9} {'ms per unit':>12}")
    for depth in (10, 25, 50, 100, 150):  # the parser refuses nesting much deeper (a ParseError)
        took = seconds(nested(depth))
        print(f"{'nested sin':<28} {depth:>5} {took:>9.3f} {1000 * took / depth:>12.2f}")
    for count in (10, 50, 100, 250, 500):
        took = seconds(chain(count))
        print(f"{'tanh statements':<28} {count:>5} {took:>9.3f} {1000 * took / count:>12.2f}")


if __name__ == "__main__":
    main()
