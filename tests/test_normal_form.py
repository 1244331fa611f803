"""Direct tests of the derivation's front end: bound normal form, the index-size registry, shared helpers."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
from einflow.derive.cse import hoist_repeated
from einflow.derive.normal import Fresh, all_index_names, readable, to_normal
from einflow.derive.sizes import IndexSizes, activated
from einflow.lang import ir
from einflow.lang.grammar import parse

# programs whose dummies are reused across scopes, traces, deltas and per-term reductions
PROGRAMS = [
    "f = x[k] y[k] exp(x[k] x[k])",
    "f = x[i] y[i] / (sqrt(x[i] x[i]) sqrt(y[i] y[i]))",
    "L = sum[j](B[c,j] x[c] tanh(A[c,c]))",
    "T[i] = sum[a](x[i] + x[i] tanh(w[a]))\nf = sum[i](T[i] T[i])",
    "f = sum[a,m](y[m] + w[a] y[m])",
    "y[p] = x[p] + A[p,j] x[j] + sum[j](A[j,j]) x[p]",
]
# sized only through the name: the outer m of delta[m,m] gets its size from A[m,l] in the same statement,
# a link the normal form's unique names no longer show (the derivation's size registry keeps it)
SIZED_BY_NAME = ["f = sum[m](A[m,l] y[l]) delta[m,m]"]
ARRAYS = {"x": (3,), "y": (3,), "A": (3, 3), "B": (3, 2), "w": (2,), "T": (3,)}


def _inputs(program: ef.Program) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {name: rng.uniform(0.5, 1.5, size=ARRAYS[name]) for name in program.inputs}


def _normal_program(text: str) -> tuple[ef.Program, ef.Program, ef.Program]:
    """(original, normal form as a program, normal form made readable again)."""
    program = ef.compile(text)
    statements = program.ir.statements
    last = len(statements) - 1
    names = {last: statements[last].target or "f_value"}  # type: ignore[union-attr]
    sizes = IndexSizes()
    with activated(sizes):
        sizes.add_program(statements, names)
        fresh = Fresh(all_index_names(program.ir) | set(program.inputs), sizes)
        normal = to_normal(program.ir, fresh, names)
        pretty = [readable(statement, set())[0] for statement in normal]

    def with_sizes(statements: list[ir.Assign]) -> ef.Program:
        names = sorted(all_index_names(ir.ProgramIR(tuple(statements))))
        declared = [ir.SizeDecl((i,), 3) for i in names if text in SIZED_BY_NAME and i.startswith("m")]
        return ef.compile(ir.format_program(ir.ProgramIR((*declared, *statements))))

    return program, with_sizes(normal), with_sizes(pretty)


@pytest.mark.parametrize("text", PROGRAMS + SIZED_BY_NAME)
def test_normal_form_binds_every_index_once_and_keeps_the_value(text: str) -> None:
    program, normal, pretty = _normal_program(text)
    binders: list[str] = []
    for statement in normal.ir.statements:
        if not isinstance(statement, ir.Assign):
            continue
        binders.extend(statement.indices or ())
        binders.extend(i for node in ir.walk(statement.expr) if isinstance(node, ir.Reduce) for i in node.indices)
    assert len(binders) == len(set(binders)), "a binder name occurs twice"
    inputs = _inputs(program)
    expected = np.asarray(program(**inputs))
    np.testing.assert_allclose(np.asarray(normal(**inputs)), expected, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(pretty(**inputs)), expected, rtol=1e-12)


def test_nested_dummy_keeps_its_own_binder() -> None:
    _, normal, _ = _normal_program("f = x[k] y[k] exp(x[k] x[k])")
    statement = normal.ir.statements[-1]
    assert isinstance(statement, ir.Assign)
    call = next(node for node in ir.walk(statement.expr) if isinstance(node, ir.Call))
    inner = {i for node in ir.walk(call.arg) if isinstance(node, ir.Tensor) for i in node.indices}
    outer = {i for node in ir.walk(statement.expr) if isinstance(node, ir.Tensor) and node.name == "y"
             for i in node.indices}
    assert inner and outer and not inner & outer


def test_size_registry_ties_renamed_indices_per_statement() -> None:
    program = ef.compile("size n = 5\na[i] = x[i] delta[n,n]\nb[i] = A[i,j] z[j]")
    sizes = IndexSizes()
    sizes.add_program(program.ir.statements, {})
    assert sizes.key(("user", 1, "i")) == sizes.key(("axis", "x", 0))  # type: ignore[arg-type]
    assert sizes.sources(("user", 1, "n")) == [5]  # type: ignore[arg-type]
    # the same name in another statement is another index
    assert sizes.key(("user", 2, "i")) != sizes.key(("user", 1, "i"))  # type: ignore[arg-type]
    sizes.alias("i_7", ("user", 2, "i"))
    assert sizes.sources("i_7") == [("A", 0), ("b", 0)]
    assert sizes.key("unknown") != sizes.key("other unknown")


def test_shared_helpers_only_merge_equal_sizes() -> None:
    statements = [ir.Assign("a", (), parse("f = sum[j](exp(w[j]))").statements[0].expr),  # type: ignore[union-attr]
                  ir.Assign("b", (), parse("f = sum[c](exp(w[c]))").statements[0].expr),  # type: ignore[union-attr]
                  ir.Assign("c", (), parse("f = sum[d](exp(v[d]))").statements[0].expr)]  # type: ignore[union-attr]
    statements.append(ir.Assign("e", (), parse("f = sum[d2](exp(v[d2])) + sum[j2](exp(w[j2]))")
                                .statements[0].expr))  # type: ignore[union-attr]
    sizes = IndexSizes()
    with activated(sizes):
        for name, tensor in (("j", "w"), ("c", "w"), ("j2", "w"), ("d", "v"), ("d2", "v")):
            sizes.union(name, ("axis", tensor, 0))
        fresh = Fresh({"j", "c", "d", "j2", "d2"}, sizes)
        hoisted = hoist_repeated(statements, fresh, Fresh({"a", "b", "c", "e", "w", "v"}), {})
    helpers = [s for s in hoisted if s.target not in {"a", "b", "c", "e"}]
    assert len(helpers) == 2  # one per size class: sum over w's axis, sum over v's axis
    program = ef.compile(ir.format_program(ir.ProgramIR((*hoisted, ir.Return(("a", "c", "e"))))))
    w, v = np.array([0.1, 0.2]), np.array([0.3, 0.4, 0.5])
    a, c, e = program(w=w, v=v)
    assert np.isclose(a, np.exp(w).sum()) and np.isclose(c, np.exp(v).sum())
    assert np.isclose(e, np.exp(w).sum() + np.exp(v).sum())


def test_grad_with_helpers_of_different_sizes() -> None:
    # |j| = 2, |c| = 3: a shared helper for "the count of a summed index" would mix them up
    g = ef.grad("f = sum[j,c](-y[j] + R[c])", wrt=["y", "R"])
    dy, dR = g(y=np.ones(2), R=np.ones(3))
    np.testing.assert_array_equal(dy, [-3.0, -3.0])
    np.testing.assert_array_equal(dR, [2.0, 2.0, 2.0])
