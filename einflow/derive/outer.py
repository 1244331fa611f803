"""Outer factors out of derivative statements: a factor that only multiplies is not carried along.

A derivative by a weight that enters through a linear map, ``z[i] = W1[i,j] x[j]``, carries the input as
an outer factor: ``dh3_dW1[i,v,w] = W3[i,j] x[w] ... t1[j,v]``. Every statement that reads it inherits
``x[w]`` and is a 3-index array where a matrix would do. When every term of a derivative statement is
``x[w]`` times something with no ``w`` in it, the statement is written without the factor and its readers
multiply by it where they read the statement (``dh3_dW1[i,v] x[w]``); they are then often of the same form,
so the factor travels to the end, where it makes one outer product. A result keeps its indices: its
factored-out part becomes a statement of its own and the result is that times the outer factors.
"""

from __future__ import annotations

from collections.abc import Callable

from einflow.derive.cse import _map
from einflow.derive.normal import Fresh
from einflow.lang import ir
from einflow.lang.indices import indices_in

__all__ = ["factor_outer"]


def _without(expr: ir.Expr, factor: ir.Tensor, axes: frozenset[str]) -> ir.Expr | None:
    """``expr`` divided by ``factor`` when every term of it is ``factor`` times an expression without any
    of ``axes`` (the factor's indices), else None."""
    if expr == factor:
        return ir.Num(1)
    if isinstance(expr, ir.Product):
        touching = [k for k, f in enumerate(expr.factors) if indices_in(f) & axes]
        if len(touching) != 1:
            return None
        inner = _without(expr.factors[touching[0]], factor, axes)
        if inner is None:
            return None
        rest = [f for k, f in enumerate(expr.factors) if k != touching[0]]
        kept = [f for f in (*rest, inner) if f != ir.Num(1)] if rest else [inner]
        return ir.product(*kept) if kept else ir.Num(1)
    if isinstance(expr, ir.Sum):
        terms = [_without(term, factor, axes) for term in expr.terms]
        return None if any(t is None for t in terms) else ir.Sum(tuple(terms))  # type: ignore[arg-type]
    if isinstance(expr, ir.Reduce) and expr.kind == "sum" and not axes & set(expr.indices):
        body = _without(expr.body, factor, axes)
        return None if body is None else ir.Reduce(expr.indices, body)
    return None


def _outer_factors(expr: ir.Expr, indices: tuple[str, ...]) -> tuple[ir.Expr, list[ir.Tensor]]:
    """``expr`` with its outer factors taken out, and those factors (tensors on some of ``indices``)."""
    factors: list[ir.Tensor] = []
    free = set(indices)
    changed = True
    while changed:
        changed = False
        candidates = dict.fromkeys(node for node in ir.walk(expr) if isinstance(node, ir.Tensor) and node.indices
                                   and len(set(node.indices)) == len(node.indices) and set(node.indices) <= free)
        for candidate in candidates:
            axes = frozenset(candidate.indices)
            if not free - axes:
                continue  # the rest would be a number: nothing to gain
            rest = _without(expr, candidate, axes)
            if rest is not None and not indices_in(rest) & axes:
                expr, free, changed = rest, free - axes, True
                factors.append(candidate)
                break
    return expr, factors


def _reading(moved: dict[str, tuple[tuple[str, ...], tuple[str, ...], list[ir.Tensor]]],
             ) -> Callable[[ir.Expr], ir.Expr | None]:
    """A replacement for ``_map``: a read of a factored statement becomes the read times its factors."""
    def replace(node: ir.Expr) -> ir.Expr | None:
        if not isinstance(node, ir.Tensor) or node.name not in moved:
            return None
        old, new, factors = moved[node.name]
        at = dict(zip(old, node.indices))
        read = ir.Tensor(node.name, tuple(at[i] for i in new))
        return ir.product(read, *(ir.Tensor(f.name, tuple(at[i] for i in f.indices)) for f in factors))
    return replace


def _powers_apart(expr: ir.Expr) -> ir.Expr:
    """A read that became a product, raised to an integer power, as the product of the powers:
    ``(d[i,p] x[q])^2`` is ``d[i,p]^2 x[q]^2``, so a sum over i, p, q factors apart."""
    if isinstance(expr, ir.Power) and isinstance(expr.base, ir.Product) and isinstance(expr.exponent, int):
        return ir.product(*(ir.Power(_powers_apart(f), expr.exponent) for f in expr.base.factors))
    children = ir.children(expr)
    if not children:
        return expr
    new = tuple(_powers_apart(child) for child in children)
    return expr if new == children else ir.with_children(expr, new)


def factor_outer(statements: list[ir.Assign], results: set[str], keep: set[str], names: Fresh,
                 ranks: dict[str, int]) -> list[ir.Assign]:
    """The statements with outer factors moved from derivative statements to their readers.

    ``results`` keep their indices (their factored part gets a statement of its own when it is a sum of
    several terms or holds a sum, so the work runs on the smaller array); ``keep`` (the user's own
    statements) are left as they are. ``ranks`` is updated for the statements whose rank changes.
    """
    moved: dict[str, tuple[tuple[str, ...], tuple[str, ...], list[ir.Tensor]]] = {}
    out: list[ir.Assign] = []
    for statement in statements:
        expr = _powers_apart(_map(statement.expr, _reading(moved))) if moved else statement.expr
        if expr is not statement.expr:
            statement = ir.Assign(statement.target, statement.indices, expr)
        target, indices = statement.target, statement.indices
        if target is None or target in keep or not indices:
            out.append(statement)
            continue
        rest, factors = _outer_factors(expr, indices)
        if not factors:
            out.append(statement)
            continue
        taken = {i for f in factors for i in f.indices}
        smaller = tuple(i for i in indices if i not in taken)
        if target not in results:
            moved[target] = (indices, smaller, factors)
            ranks[target] = len(smaller)
            out.append(ir.Assign(target, smaller, rest))
            continue
        if not (isinstance(rest, ir.Sum) or any(isinstance(n, ir.Reduce) for n in ir.walk(rest))):
            out.append(statement)  # one product: the contraction planner places the outer factors itself
            continue
        name = names.pick([f"t{n}" for n in range(1, 100)], "t")
        ranks[name] = len(smaller)
        out.append(ir.Assign(name, smaller, rest))
        out.append(ir.Assign(target, indices, ir.product(ir.Tensor(name, smaller), *factors)))
    return out
