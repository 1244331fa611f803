"""Call overhead: what einflow adds around tiny contractions, and what the first call (planning) costs.

Rows: a compiled program's call on 4x4 operands against a bare opt_einsum ContractExpression call
(the issue's target: at most 1.5x), the same for a five-operand chain, the numpy-compatible
``einflow.einsum`` against ``numpy.einsum``, and the first call of a fresh program (parse, check,
plan, run) against a later call.

Run:  python benchmarks/overhead.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import opt_einsum as oe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, calibrate, combined_table, compare, machine, seconds  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["run", "main"]

CHAIN = "y[i] = A[i,j] B[j,k] C[k,l] D[l,m] v[m]"


def _first_call(repeat: int) -> tuple[float, float]:
    """Median seconds of a fresh program's first call (new text each time, so nothing is cached) and of a
    repeated call."""
    rng = np.random.default_rng(1)
    arrays = dict(A=rng.standard_normal((30, 40)), B=rng.standard_normal((40, 50)), C=rng.standard_normal((50, 60)),
                  D=rng.standard_normal((60, 70)), v=rng.standard_normal(70))
    firsts = []
    for k in range(repeat):
        text = CHAIN.replace("y[i]", f"y{k}_{time.perf_counter_ns()}[i]")
        start = time.perf_counter()
        program = ef.compile(text)
        program(arrays)
        firsts.append(time.perf_counter() - start)
    again = compare({"again": lambda: program(arrays)}, repeat=repeat, number=1000)["again"]
    return statistics.median(firsts), again


def straight_line(statements: int) -> tuple[str, str]:
    """A program of ``statements`` statements and the same computation hand-written as straight-line numpy."""
    lines, hand = [], ["def hand(W, x, y):", "    h0 = x"]
    lines.append("h0[i] = x[i]")
    for k in range(1, statements):
        if k % 2:
            lines.append(f"h{k}[i] = tanh(W[i,j] h{k - 1}[j])")
            hand.append(f"    h{k} = np.tanh(np.dot(W, h{k - 1}))")
        else:
            lines.append(f"h{k}[i] = h{k - 1}[i] y[i] - h{k - 2}[i]")
            hand.append(f"    h{k} = h{k - 1} * y - h{k - 2}")
    hand.append(f"    return h{statements - 1}")
    return "\n".join(lines), "\n".join(hand)


def run(repeat: int = 15) -> tuple[str, list[Row]]:
    """Time the overhead cases; returns the section's table and its rows."""
    rng = np.random.default_rng(0)
    rows = []

    a, b = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    matmul = ef.compile("C[i,j] = A[i,k] B[k,j]")
    expression = oe.contract_expression("ik,kj->ij", a.shape, b.shape)
    assert np.allclose(matmul(A=a, B=b), expression(a, b))
    candidates = {"einflow": lambda: matmul(A=a, B=b), "reference": lambda: expression(a, b),
                  "numpy.einsum": lambda: np.einsum("ik,kj->ij", a, b),
                  "opt_einsum": lambda: oe.contract("ik,kj->ij", a, b)}
    times = compare(candidates, repeat=repeat, number=calibrate(candidates["einflow"]))
    rows.append(Row("overhead", "program call, 4x4 matmul", seconds(times["einflow"]), "opt_einsum ContractExpression",
                    times["einflow"] / times["reference"], 1.5,
                    {"numpy.einsum": times["einflow"] / times["numpy.einsum"],
                     "opt_einsum": times["einflow"] / times["opt_einsum"]}))

    m = [rng.standard_normal((4, 4)) for _ in range(4)]
    v = rng.standard_normal(4)
    chain = ef.compile(CHAIN)
    chain_arrays = dict(A=m[0], B=m[1], C=m[2], D=m[3], v=v)
    chain_expression = oe.contract_expression("ij,jk,kl,lm,m->i", *(x.shape for x in (*m, v)))
    assert np.allclose(chain(chain_arrays), chain_expression(*m, v))
    candidates = {"einflow": lambda: chain(chain_arrays), "reference": lambda: chain_expression(*m, v),
                  "numpy.einsum": lambda: np.einsum("ij,jk,kl,lm,m->i", *m, v),
                  "opt_einsum": lambda: oe.contract("ij,jk,kl,lm,m->i", *m, v)}
    times = compare(candidates, repeat=repeat, number=calibrate(candidates["einflow"]))
    rows.append(Row("overhead", "program call, 5-operand chain 4x4", seconds(times["einflow"]),
                    "opt_einsum ContractExpression", times["einflow"] / times["reference"], 1.5,
                    {"numpy.einsum": times["einflow"] / times["numpy.einsum"],
                     "opt_einsum": times["einflow"] / times["opt_einsum"]}))

    candidates = {"einflow": lambda: ef.einsum("ik,kj->ij", a, b), "reference": lambda: np.einsum("ik,kj->ij", a, b),
                  "opt_einsum": lambda: oe.contract("ik,kj->ij", a, b)}
    times = compare(candidates, repeat=repeat, number=calibrate(candidates["einflow"]))
    rows.append(Row("overhead", "einflow.einsum one-shot, 4x4", seconds(times["einflow"]), "numpy.einsum",
                    times["einflow"] / times["reference"], None,
                    {"opt_einsum": times["einflow"] / times["opt_einsum"]}))

    for statements in (10, 50, 200):
        text, hand_text = straight_line(statements)
        namespace: dict[str, object] = {"np": np}
        exec(hand_text, namespace)  # noqa: S102 - the benchmark's own reference
        hand = namespace["hand"]
        program = ef.compile(text)
        inputs = dict(W=rng.standard_normal((4, 4)) / 2, x=rng.standard_normal(4), y=rng.standard_normal(4))
        assert np.allclose(program(inputs), hand(**inputs))
        candidates = {"einflow": lambda p=program, a=inputs: p(a), "reference": lambda h=hand, a=inputs: h(**a)}
        times = compare(candidates, repeat=repeat, number=calibrate(candidates["einflow"]))
        rows.append(Row("overhead", f"{statements}-statement program call, 4-element vectors",
                        seconds(times["einflow"]), "hand-written straight-line numpy",
                        times["einflow"] / times["reference"], 1.5))

    first, again = _first_call(repeat)
    rows.append(Row("overhead", "first call of a new 5-operand program (parse+check+plan+run)", seconds(first),
                    "a repeated call", first / again))
    return combined_table(rows), rows


def main() -> None:
    table, _ = run()
    print(f"## Call overhead ({machine()})\n")
    print(table)


if __name__ == "__main__":
    main()
