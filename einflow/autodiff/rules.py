"""Derivative rules, one per IR node (the function table's rules live in einflow/functions.py).

``derivative(e)`` is the Jacobian of ``e`` in bound normal form: its free indices are e's plus the
fresh indices of the variable. Leaves decide what varies: an input gives Kronecker deltas, a target
with a known tangent gives that tangent, anything else is constant.
"""

from __future__ import annotations

from collections.abc import Callable

from einflow import ir
from einflow.autodiff.normal import rename_apart
from einflow.functions import FUNCTION_RULES

__all__ = ["Leaf", "derivative"]

#: leaf rule: a tensor reference -> its derivative (None when it does not vary)
Leaf = Callable[[ir.Tensor], "ir.Expr | None"]


def _num(value: int | float) -> ir.Num:
    return ir.Num(value)


def _add(parts: list[ir.Expr]) -> ir.Expr | None:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else ir.Sum(tuple(parts))


def _d_product(node: ir.Product, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    # product rule: one term per factor that varies, that factor replaced by its derivative
    terms = []
    for position, factor in enumerate(node.factors):
        varied = d(factor)
        if varied is not None:
            terms.append(ir.product(*node.factors[:position], varied, *node.factors[position + 1:]))
    return _add(terms)


def _d_sum(node: ir.Sum, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    return _add([varied for varied in map(d, node.terms) if varied is not None])


def _d_call(node: ir.Call, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    # chain rule: f'(u) du; u now occurs twice, so du's summed indices are renamed apart
    inner = d(node.arg)
    if inner is None:
        return None
    outer = FUNCTION_RULES[node.func].derivative(node.arg)
    if isinstance(outer, ir.Num) and outer.value == 0:
        return None
    return ir.product(outer, rename_apart(inner))


def _d_power(node: ir.Power, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    inner = d(node.base)
    if inner is None:
        return None
    exponent = node.exponent
    if exponent == 0:
        return None
    lowered = exponent - 1
    if lowered == 0:
        return ir.product(_num(exponent), inner)
    base = node.base if lowered == 1 else ir.Power(node.base, lowered)
    return ir.product(_num(exponent), base, rename_apart(inner))


def _d_reduce(node: ir.Reduce, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    inner = d(node.body)
    return None if inner is None else ir.Reduce(node.indices, inner)


_RULES: dict[type, Callable[..., ir.Expr | None]] = {
    ir.Num: lambda node, d: None,
    ir.Delta: lambda node, d: None,
    ir.Product: _d_product,
    ir.Sum: _d_sum,
    ir.Call: _d_call,
    ir.Power: _d_power,
    ir.Reduce: _d_reduce,
}


def derivative(expr: ir.Expr, leaf: Leaf) -> ir.Expr | None:
    """d(expr) in bound normal form; None means identically zero."""

    def d(node: ir.Expr) -> ir.Expr | None:
        if isinstance(node, ir.Tensor):
            return leaf(node)
        return _RULES[type(node)](node, d)

    return d(expr)


def input_leaf(name: str, fresh_indices: tuple[str, ...]) -> Leaf:
    """Leaf rule for differentiating by input ``name`` at ``fresh_indices``: deltas pair the axes."""

    def leaf(node: ir.Tensor) -> ir.Expr | None:
        if node.name != name:
            return None
        if not node.indices:
            return _num(1)
        return ir.product(*(ir.Delta(a, p) for a, p in zip(node.indices, fresh_indices)))

    return leaf
