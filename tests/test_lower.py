"""The one lowering: the report, the executed code and the exported source are the same steps."""

from __future__ import annotations

import re

import numpy as np
import pytest

import einflow as ef
from einflow.engine.backends import get_backend
from einflow.engine.lower import lower
from einflow.engine.plan import build_plan
from einflow.engine.steps import Contract, Elementwise, Free
from einflow.lang.contraction import eliminate_deltas, product_output, split_product

RNG = np.random.default_rng(5)

# (program, input shapes)
CORPUS = [
    ("a = x[i] y[i]\nb = x[j] y[j]\na, b", dict(x=(4,), y=(4,))),
    ("C[i,j] = A[i,k] B[k,j]", dict(A=(3, 4), B=(4, 5))),
    ("y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])", dict(A=(3, 4), B=(3, 4))),
    ("D[i,j] = A[i,j] - B[j,i]", dict(A=(3, 3), B=(3, 3))),
    ("O[i,j] = 2 u[i] v[j]", dict(u=(3,), v=(4,))),
    ("t = A[i,i]", dict(A=(4, 4))),
    ("H[p,q] = 2 delta[p,q] + x[p] x[q]", dict(x=(3,))),
    ("h[j] = tanh(W1[j,k] x[k])\nL = 0.5 * sum[i]((W2[i,j] h[j] - t[i])^2)",
     dict(W1=(3, 4), x=(4,), W2=(2, 3), t=(2,))),
    ("y[i] = A[i,j] B[j,k] v[k] + c[i]", dict(A=(3, 4), B=(4, 5), v=(5,), c=(3,))),
    ("L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", dict(X=(6, 3), y=(6,), w=(3,))),
    ("u[i,j] = (1 - h[i,j]^2) x[i,j]\nv[k,l] = (1 - h[k,l]^2) y[k,l]\nu, v", dict(h=(3, 4), x=(3, 4), y=(3, 4))),
    ("size n = 3\nT[i,j] = delta[i,n] v[n] x[j]", dict(v=(3,), x=(2,))),
]

STEP = re.compile(r"# \[(\d+)\] (\w+)")


def _numbered(source: str) -> list[tuple[int, str]]:
    return [(int(number), kind) for number, kind in STEP.findall(source)]


@pytest.mark.parametrize("text, shapes", CORPUS, ids=[text.splitlines()[0] for text, _ in CORPUS])
def test_report_equals_executed_steps_equals_exported_lines(text: str, shapes: dict[str, tuple[int, ...]]) -> None:
    program = ef.compile(text)
    report = program.plan(shapes)
    reported = [(number, step.kind) for number, step in enumerate(report.steps, 1)]
    plan = build_plan(program.ir, program.info, shapes, 8, get_backend("numpy"))
    executed = _numbered(plan.source)
    exported = _numbered(program.to_source())
    assert reported == executed == exported
    computing = [step for step in lower(program).steps if not isinstance(step, Free)]
    assert len(computing) == len(reported)
    # and the generated function is what runs: its numbers are the exported function's
    arrays = {name: RNG.uniform(0.5, 1.5, shape) for name, shape in shapes.items()}
    namespace: dict[str, object] = {}
    exec(program.to_source(), namespace)
    want = namespace["f"](**arrays)
    got = program(arrays)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w, rtol=1e-13)


def test_a_shared_contraction_is_reported_once_and_runs_once() -> None:
    program = ef.compile("a = x[i] y[i]\nb = x[j] y[j]\na, b")
    report = program.plan(x=(4,), y=(4,))
    assert report.contractions == 1
    (step,) = lower(program).steps
    assert isinstance(step, Contract)
    a, b = program(x=np.arange(4.0), y=np.ones(4))
    assert a == b == 6.0


def test_elementwise_work_is_fused_into_one_step_without_einsum() -> None:
    program = ef.compile("y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])")
    (step,) = lower(program).steps
    assert isinstance(step, Elementwise)
    source = program.to_source()
    assert "einsum(" not in source and "contract(" not in source
    A, B = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4))
    np.testing.assert_allclose(program(A=A, B=B), np.tanh(A) * np.exp(B) + 1 / (1 + np.exp(-A)), rtol=1e-13)


def test_a_difference_is_a_subtraction_and_an_elementwise_product_a_multiplication() -> None:
    source = ef.compile("D[i,j] = A[i,j] - B[i,j] C[i,j]").to_source()
    line = next(line for line in source.splitlines() if line.strip().startswith("D ="))
    assert "A - B * C" in line and "einsum(" not in source and "contract(" not in source


def test_large_fused_work_runs_in_blocks_with_the_same_numbers() -> None:
    program = ef.compile("y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])")
    A, B = RNG.normal(size=(300, 300)), RNG.normal(size=(300, 300))
    plan = build_plan(program.ir, program.info, {"A": A.shape, "B": B.shape}, 8, get_backend("numpy"),
                      dtypes={"A": A.dtype, "B": B.dtype})
    assert "_run_blocks(" in plan.source and "_np.tanh(a0, out=" in plan.source
    np.testing.assert_allclose(plan.run([A, B]), np.tanh(A) * np.exp(B) + 1 / (1 + np.exp(-A)), rtol=1e-13, atol=1e-15)


def test_generated_code_is_compiled_once_per_signature() -> None:
    program = ef.compile("z[i] = A[i,j] x[j] + 1")
    program(A=np.ones((2, 3)), x=np.ones(3))
    program(A=np.ones((2, 3)), x=np.ones(3))
    program(A=np.ones((4, 3)), x=np.ones(3))
    assert program.cache_info().plans == 2


# ---------------------------------------------------------------- contraction.py


def test_product_output_keeps_single_and_bound_indices_in_order() -> None:
    assert product_output([["i", "k"], ["k", "j"]], frozenset(), frozenset()) == (["i", "j"], ["k"])
    assert product_output([["i", "k"], ["k", "j"]], frozenset({"k"}), frozenset()) == (["i", "k", "j"], [])
    assert product_output([["i", "j"]], frozenset(), frozenset({"j"})) == (["i"], ["j"])
    assert product_output([["i", "j"]], frozenset(), frozenset(), ("j", "i")) == (["j", "i"], [])


def test_eliminate_deltas_substitutes_summed_indices_and_keeps_diagonals() -> None:
    operands = [["j", "m"]]
    assert eliminate_deltas(operands, [["i", "j"]], {"j"}, ["i", "m"]) == ({}, [], [])
    assert operands == [["i", "m"]]
    operands = [["i"]]
    classes, missing, counted = eliminate_deltas(operands, [["i", "j"]], set(), ["i", "j"])
    assert classes == {"i": ["i", "j"]} and missing == [] and counted == []
    # sum_j delta[j,l]: ones over l
    operands = []
    assert eliminate_deltas(operands, [["j", "l"]], {"j"}, ["l"]) == ({}, ["l"], [])
    # sum_{i,j} delta[i,i] delta[j,j]: counts |i| |j| (multiplied, never contracted as booleans)
    operands = [["p"]]
    assert eliminate_deltas(operands, [["i", "i"], ["j", "j"]], {"i", "j"}, ["p"]) == ({}, [], ["i", "j"])


def test_split_product_sorts_factors_by_role() -> None:
    program = ef.compile("y[i] = 2 s A[i,j] delta[j,k] v[k] * 3")
    factors = program.ir.statements[0].expr.factors
    values = {"s": ("s", ()), "A": ("A", ("i", "j")), "v": ("v", ("k",))}
    parts = split_product(factors, values.__getitem__, lambda f: None, lambda value: None, lambda value: value[1])
    assert parts.coefficient == 6
    assert parts.scalars == [("s", ())]
    assert [labels for _, labels in parts.operands] == [["i", "j"], ["k"]]
    assert parts.deltas == [["j", "k"]]
    assert parts.sequence == [["i", "j"], ["j", "k"], ["k"]]


def test_generated_helpers_work_in_every_plan() -> None:
    # the helpers (reciprocal, as_float, sigmoid) are shared between plans; each must keep Python's builtins
    for _ in range(2):
        x = np.arange(1, 4)  # integers: reciprocal and as_float convert them
        np.testing.assert_allclose(ef.evaluate("y[i] = x[i]^-1 + x[i]^-0.5", x=x), 1 / x + x**-0.5)
        np.testing.assert_allclose(ef.evaluate("y[i] = sigmoid(x[i])", x=x), 1 / (1 + np.exp(-x.astype(float))))


def test_booleans_subtract_as_numbers() -> None:
    # numpy refuses bool - bool; einflow's booleans are the numbers 0 and 1 (as before the subtraction)
    a, b = np.array([True, False, True]), np.array([False, False, True])
    assert ef.evaluate("y[i] = a[i] - b[i]", a=a, b=b).tolist() == [1, 0, 0]
    assert ef.evaluate("y[i] = a[i] - b[i]", a=a.astype(float), b=b).tolist() == [1.0, 0.0, 0.0]


# ---------------------------------------------------------------- counts of deltas alone


@pytest.mark.parametrize("text", [
    "L = sum[i](w[i] (x[i] - mean[j](x[j])) / sqrt(mean[j]((x[j] - mean[k](x[k]))^2) + 0.00001))",
    "L = sum[i](w[i] mean[j](x[j] x[i]))",
])
def test_mean_derivative_counts_by_size_not_by_a_ones_vector(text: str) -> None:
    """mean's derivative carries 1/n (`delta[j,j]^-1`): n comes from the index's size, never from a vector of
    ones built, cast and summed (a full array and three passes for one number)."""
    x, w = RNG.normal(size=7), RNG.normal(size=7)
    gradient = ef.grad(text, wrt="x")
    assert "delta[" in gradient.text  # the count is there, written as a delta
    steps = [step for step in lower(gradient).steps if not isinstance(step, Free)]
    assert not [step for step in steps if type(step).__name__ == "Ones"]
    assert "ones(" not in gradient.to_source("f")
    # the value: central differences in float64
    loss = ef.compile(text)
    step = 1e-6
    numeric = np.array([(loss(x=x + step * e, w=w) - loss(x=x - step * e, w=w)) / (2 * step) for e in np.eye(7)])
    np.testing.assert_allclose(gradient(x=x, w=w), numeric, rtol=1e-6, atol=1e-8)
    (plan,) = gradient._plans.values()
    assert "ones(" not in plan.source


@pytest.mark.parametrize("dtype, expected", [("float32", np.float32), ("float64", np.float64), ("int32", np.int64)])
def test_count_of_deltas_alone_has_the_inputs_floating_type(dtype: str, expected: type) -> None:
    """`n = delta[j,j]` (the size of j) is a number of the inputs' floating type, the integer type without one."""
    program = ef.compile("size j = x\nn = delta[j,j]\nr = delta[j,j]^-1\nn, r")
    x = np.arange(5).astype(dtype)
    n, r = program(x=x)
    assert n == 5 and np.asarray(n).dtype == expected
    assert r == pytest.approx(0.2)
    assert "ones(" not in next(iter(program._plans.values())).source


def test_node_rows_read_the_registers_the_steps_read() -> None:
    from einflow.engine.rows import NODE_RULES, STEP_RULES, args_in_order
    from einflow.engine.specialise import PLAN_RULES
    from einflow.engine.steps import Node, Step, node_args

    assert set(NODE_RULES) == set(Node.__args__) and set(STEP_RULES) == set(PLAN_RULES) == set(Step.__args__)
    for text, _ in CORPUS:
        for step in lower(ef.compile(text)).steps:
            if isinstance(step, Elementwise):
                assert {arg.register for arg in args_in_order(step.expr)} == set(node_args(step.expr))
