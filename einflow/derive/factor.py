"""Elementwise sums rewritten with fewer operations: a greedy multivariate Horner scheme.

A derivative's elementwise statement is often a sum of products of a few shared factors, as the product and
chain rules leave it: the Laplacian of ``h = z sigmoid(z)`` (``y = sigmoid(z)``, ``t = sigmoid(-z)``) is
``lap_z y + z (t lap_z y + (t^2 y - y^2 t) s) + 2 t y s`` with ``s = sum[p](z'_p^2)``, 15 operations per
element. :func:`fewer_operations` expands such a sum into monomials over its factors (the tensors, calls and
sums it multiplies), then takes out, again and again, the factor most monomials share:
``y (t (z (lap_z + s (t - y)) + 2 s) + lap_z)``, 9 operations. The rewrite is kept only when it counts fewer
operations than the expression it replaces (a repeated subexpression counted once, as the statement's
common-subexpression pass would compute it).

Only elementwise algebra is rewritten: every factor's free indices are the statement's own, so taking a
factor out of some terms changes no summation.
"""

from __future__ import annotations

from collections import Counter

from einflow.derive.canonical import alpha_key, bound_inside
from einflow.lang import ir
from einflow.lang.indices import indices_in

__all__ = ["fewer_operations"]

#: the most monomials an expansion may make before the rewrite is given up
_LIMIT = 64

#: a monomial: its number and, per factor (by key), the power it is raised to
_Monomial = tuple[float, dict[object, int]]


class _Skip(Exception):
    """The expression is not an elementwise polynomial of few monomials: left as it is."""


def fewer_operations(expr: ir.Expr, indices: tuple[str, ...]) -> ir.Expr:
    """``expr`` (an elementwise expression over ``indices``) with common factors taken out of its sums, when
    that counts fewer operations; otherwise ``expr`` itself."""
    if not isinstance(expr, (ir.Sum, ir.Product)) or not any(isinstance(n, ir.Sum) for n in ir.walk(expr)):
        return expr
    atoms: dict[object, ir.Expr] = {}
    try:
        monomials = _expand(expr, frozenset(indices), atoms)
    except _Skip:
        return expr
    if not monomials:
        return ir.Num(0)
    order = {key: position for position, key in enumerate(atoms)}
    rewritten = _horner(monomials, atoms, order)
    return rewritten if _operations(rewritten) < _operations(expr) else expr


def _expand(node: ir.Expr, allowed: frozenset[str], atoms: dict[object, ir.Expr]) -> list[_Monomial]:
    if isinstance(node, ir.Num):
        return [(node.value, {})]
    if isinstance(node, ir.Sum):
        return _combined([m for term in node.terms for m in _expand(term, allowed, atoms)])
    if isinstance(node, ir.Product):
        result: list[_Monomial] = [(1, {})]
        for factor in node.factors:
            result = _times(result, _expand(factor, allowed, atoms))
        return result
    if isinstance(node, ir.Power) and isinstance(node.exponent, int) and 1 <= node.exponent <= 4 \
            and isinstance(node.base, (ir.Sum, ir.Product)):
        base = _expand(node.base, allowed, atoms)
        result = base
        for _ in range(node.exponent - 1):
            result = _times(result, base)
        return result
    if isinstance(node, ir.Power) and isinstance(node.exponent, int) and node.exponent >= 1:
        return [(1, {_atom(node.base, allowed, atoms): node.exponent})]
    return [(1, {_atom(node, allowed, atoms): 1})]


def _atom(node: ir.Expr, allowed: frozenset[str], atoms: dict[object, ir.Expr]) -> object:
    if not (indices_in(node) - frozenset(bound_inside(node))) <= allowed:
        raise _Skip  # an index the statement does not keep: a product of such factors sums it
    key = alpha_key(node)
    atoms.setdefault(key, node)
    return key


def _times(left: list[_Monomial], right: list[_Monomial]) -> list[_Monomial]:
    if len(left) * len(right) > _LIMIT:
        raise _Skip
    result = []
    for a, first in left:
        for b, second in right:
            powers = dict(first)
            for key, power in second.items():
                powers[key] = powers.get(key, 0) + power
            result.append((a * b, powers))
    return _combined(result)


def _combined(monomials: list[_Monomial]) -> list[_Monomial]:
    """Like monomials added up (their numbers summed), zeros dropped, in order of first appearance."""
    found: dict[frozenset[tuple[object, int]], list[float | dict[object, int]]] = {}
    for number, powers in monomials:
        key = frozenset(powers.items())
        if key in found:
            found[key][0] += number  # type: ignore[operator]
        else:
            found[key] = [number, powers]
    if len(found) > _LIMIT:
        raise _Skip
    return [(number, powers) for number, powers in found.values() if number != 0]  # type: ignore[misc]


def _horner(monomials: list[_Monomial], atoms: dict[object, ir.Expr], order: dict[object, int]) -> ir.Expr:
    counts: Counter[object] = Counter(key for _, powers in monomials for key in powers)
    best = max(counts, key=lambda key: (counts[key], -order[key]), default=None)
    if best is None or counts[best] < 2:
        terms = [_monomial(number, powers, atoms, order) for number, powers in monomials]
        return terms[0] if len(terms) == 1 else ir.Sum(tuple(terms))
    inside: list[_Monomial] = []
    outside: list[_Monomial] = []
    for number, powers in monomials:
        if best in powers:
            lowered = dict(powers)
            lowered[best] -= 1
            if not lowered[best]:
                del lowered[best]
            inside.append((number, lowered))
        else:
            outside.append((number, powers))
    inner = _horner(inside, atoms, order)
    if isinstance(inner, ir.Num):
        term = ir.product(inner, atoms[best])
    elif isinstance(inner, ir.Product) and isinstance(inner.factors[0], ir.Num):
        term = ir.Product((inner.factors[0], atoms[best], *inner.factors[1:]))
    else:
        term = ir.product(atoms[best], inner)
    if not outside:
        return term
    rest = _horner(outside, atoms, order)
    return ir.Sum((term, *(rest.terms if isinstance(rest, ir.Sum) else (rest,))))


def _monomial(number: float, powers: dict[object, int], atoms: dict[object, ir.Expr],
              order: dict[object, int]) -> ir.Expr:
    factors: list[ir.Expr] = [atoms[key] if power == 1 else ir.Power(atoms[key], power)
                              for key, power in sorted(powers.items(), key=lambda item: order[item[0]])]
    if number != 1 or not factors:
        value = int(number) if isinstance(number, float) and number.is_integer() else number
        factors.insert(0, ir.Num(value))
    return ir.product(*factors)


def _operations(expr: ir.Expr) -> int:
    """Additions and multiplications per element (a square one multiplication), each distinct subexpression
    once; the factors themselves (calls, sums over other indices) count nothing: both forms share them."""
    seen: set[object] = set()

    def visit(node: ir.Expr) -> int:
        if not isinstance(node, (ir.Sum, ir.Product, ir.Power)):
            return 0
        key = alpha_key(node)
        if key in seen:
            return 0
        seen.add(key)
        if isinstance(node, ir.Sum):
            return len(node.terms) - 1 + sum(map(visit, node.terms))
        if isinstance(node, ir.Product):
            numbers = [f for f in node.factors if isinstance(f, ir.Num)]
            scaled = any(abs(f.value) != 1 for f in numbers)  # (a sign folds into the sum around it)
            return len(node.factors) - len(numbers) - 1 + scaled + sum(map(visit, node.factors))
        exponent = node.exponent
        own = exponent - 1 if isinstance(exponent, int) and exponent >= 1 else 1
        return own + visit(node.base)

    return visit(expr)
