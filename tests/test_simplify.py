"""The simplifier's rule table: every row fires on its example, prints as documented and keeps the numbers.

Examples are in bound normal form: indices not bound by a ``sum[...]`` are the statement target's
(evaluated as ``T[p,q] = ...``, so they are never contracted).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import einflow as ef
from einflow.derive import simplify as simplifier
from einflow.derive.canonical import bound_inside
from einflow.derive.simplify import RULES, SimplifierLimitWarning, fired_rules, simplify
from einflow.engine.plan import indices_in
from einflow.lang import ir
from einflow.lang.grammar.parser import parse_expression

SIZES = {"p": 3, "q": 3, "u": 3, "k": 4, "j": 2}
DECLARATIONS = "\n".join(f"size {name} = {size}" for name, size in SIZES.items())


def _unbound(expr: ir.Expr) -> set[str]:
    """Indices not bound by a sum inside ``expr``: in normal form, the ones its statement's target binds."""
    return set(indices_in(expr)) - set(bound_inside(expr))


def _value(expr_text: str, axes: tuple[str, ...], arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The value of ``expr_text`` over ``axes`` (broadcast along the axes it does not use)."""
    free = [i for i in axes if i in _unbound(parse_expression(expr_text))]
    target = f"T[{','.join(free)}]" if free else "T"
    program = ef.compile(f"{DECLARATIONS}\n{target} = {expr_text}")
    value = np.asarray(program(**{name: arrays[name] for name in program.inputs}))
    value = value.reshape([SIZES[i] if i in free else 1 for i in axes])
    return np.broadcast_to(value, [SIZES[i] for i in axes])


def _arrays(expr: ir.Expr) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    arrays = {}
    for node in ir.walk(expr):
        if isinstance(node, ir.Tensor):
            shape = tuple(SIZES[i] for i in node.indices)
            arrays[node.name] = rng.uniform(0.5, 1.5, size=shape)  # positive: fractional powers are defined
    return arrays


@pytest.mark.parametrize("rule", RULES, ids=[f"{r.node}-{r.name}" for r in RULES])
def test_rule_row(rule: simplifier.Rule) -> None:
    before = parse_expression(rule.before)
    with fired_rules() as fired:
        after = simplify(before)
    assert f"{rule.node}: {rule.name}" in fired, f"the example does not exercise the rule: fired {sorted(fired)}"
    assert ir.format_expr(after) == rule.after
    axes = tuple(i for i in SIZES if i in _unbound(before))
    arrays = _arrays(before)
    np.testing.assert_allclose(_value(rule.after, axes, arrays), _value(rule.before, axes, arrays), rtol=1e-12)


def test_every_rule_has_a_distinct_name_per_node() -> None:
    keys = [(r.node, r.name) for r in RULES]
    assert len(keys) == len(set(keys))


def test_pass_limit_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simplifier, "_PASSES", 1)
    expr = parse_expression("sum[k](A[p,k] (delta[k,q] + B[k,q]))")
    with pytest.warns(SimplifierLimitWarning, match="pass"):
        simplify(expr)


def test_fixed_point_gives_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ir.format_expr(simplify(parse_expression("x[p] + x[p]"))) == "2 x[p]"
