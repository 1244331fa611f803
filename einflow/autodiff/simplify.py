"""Simplification of bound-normal-form expressions: what a careful person would write.

Rules (each preserves meaning because every index in normal form is bound and uniquely named):
delta elimination by substitution, constant folding, zero/one elimination, flattening, equal
factors merged into powers, like terms merged after canonical renaming of dummy indices, common
factors pulled out of a sum (never distributing unless that removes a delta), canonical factor order.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from einflow import ir
from einflow.autodiff.normal import rename, rename_apart
from einflow.autodiff.sizes import active
from einflow.functions import FUNCTION_RULES
from einflow.plan import indices_in

__all__ = ["simplify", "canonical_key", "bound_inside", "is_zero"]


def is_zero(expr: ir.Expr) -> bool:
    return isinstance(expr, ir.Num) and expr.value == 0 and not isinstance(expr.value, bool)


def _fold_number(value: float | int) -> ir.Num:
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        value = float(value)
    return ir.Num(value)


def bound_inside(expr: ir.Expr) -> list[str]:
    """Indices bound by sum[...] somewhere inside ``expr``, in order of appearance."""
    found: dict[str, None] = {}
    for node in ir.walk(expr):
        if isinstance(node, ir.Reduce):
            found.update(dict.fromkeys(node.indices))
    return list(found)


_KIND = {ir.Num: 0, ir.Delta: 1, ir.Tensor: 2, ir.Power: 3, ir.Call: 4, ir.Sum: 5, ir.Reduce: 6, ir.Product: 7}


def _shape_key(expr: ir.Expr) -> tuple[int, str]:
    """Sort key ignoring index names (so alpha-equivalent products sort alike)."""
    anonymous = rename(expr, {i: "_" for i in indices_in(expr)})
    return _KIND[type(expr)], ir.format_expr(anonymous)


def _sorted(expr: ir.Expr) -> ir.Expr:
    if isinstance(expr, ir.Product):
        return ir.Product(tuple(sorted((_sorted(f) for f in expr.factors), key=_shape_key)))
    return ir.with_children(expr, tuple(_sorted(c) for c in ir.children(expr)))


def _first_occurrence(expr: ir.Expr) -> list[str]:
    order: dict[str, None] = {}
    for node in ir.walk(expr):
        if isinstance(node, ir.Tensor):
            order.update(dict.fromkeys(node.indices))
        elif isinstance(node, ir.Delta):
            order.update(dict.fromkeys((node.first, node.second)))
    return list(order)


def canonical_key(expr: ir.Expr, rename_free: bool = True) -> tuple[ir.Expr, list[str]]:
    """(key, free indices in first-occurrence order): equal keys mean alpha-equivalent expressions.

    With ``rename_free=False`` free indices keep their names (equal keys then mean equal values).
    """
    ordered = _sorted(expr)
    dummies = set(bound_inside(ordered))
    mapping: dict[str, str] = {}
    free: list[str] = []
    for index in _first_occurrence(ordered):
        if index in dummies:
            mapping[index] = f"#d{len(mapping)}{_size_tag(index)}"
        else:
            free.append(index)
    if rename_free:
        for position, index in enumerate(free):
            mapping[index] = f"#f{position}{_size_tag(index)}"
    return rename(ordered, mapping), free


def _size_tag(index: str) -> str:
    """The size class of ``index`` in the derivation in progress: renaming keeps sizes apart."""
    sizes = active()
    return "" if sizes is None else "@" + sizes.key(index)


@functools.lru_cache(maxsize=8192)
def _alpha_key(expr: ir.Expr) -> ir.Expr:
    return canonical_key(expr, rename_free=False)[0]


def alpha_key(expr: ir.Expr) -> ir.Expr:
    """Equal for expressions that differ only in the names of indices summed inside them (of equal sizes)."""
    sizes = active()
    if sizes is None:
        return _alpha_key(expr)
    found = sizes.cache.get(expr)
    if found is None:
        found = sizes.cache[expr] = canonical_key(expr, rename_free=False)[0]
    return found  # type: ignore[return-value]


# ---------------------------------------------------------------- the rewrite rules


def _split_coefficient(expr: ir.Expr) -> tuple[int | float, ir.Expr | None]:
    if isinstance(expr, ir.Num):
        return expr.value, None
    if isinstance(expr, ir.Product) and isinstance(expr.factors[0], ir.Num):
        rest = expr.factors[1:]
        return expr.factors[0].value, (rest[0] if len(rest) == 1 else ir.Product(rest))
    return 1, expr


def _with_coefficient(coefficient: int | float, rest: ir.Expr | None) -> ir.Expr:
    if rest is None:
        return _fold_number(coefficient)
    if coefficient == 1:
        return rest
    if coefficient == 0:
        return ir.Num(0)
    return ir.product(_fold_number(coefficient), rest)


def _s_product(node: ir.Product, s: Callable[[ir.Expr], ir.Expr]) -> ir.Expr:
    coefficient: int | float = 1
    factors: list[ir.Expr] = []
    reduces: list[ir.Reduce] = []
    pending = list(node.factors)
    while pending:
        factor = s(pending.pop(0))
        if isinstance(factor, ir.Product):
            pending[:0] = list(factor.factors)
        elif isinstance(factor, ir.Num):
            coefficient = coefficient * factor.value
        elif isinstance(factor, ir.Reduce):
            reduces.append(factor)
        else:
            factors.append(factor)
    if coefficient == 0:
        return ir.Num(0)
    if len(reduces) == 1 and not factors:
        # c sum[k](e): nothing to contract with; keeping c outside is also what _s_reduce makes of it
        return _with_coefficient(coefficient, reduces[0])
    if reduces:
        # hoist sums out of the product so the whole thing is one contraction; a summed index that
        # is also used elsewhere in the product (a copied sub-expression) is renamed apart first
        indices: list[str] = []
        for position, reduce in enumerate(reduces):
            elsewhere = set().union(*(indices_in(f) for f in factors), *(indices_in(r) for r in reduces[position + 1:]))
            elsewhere |= set(indices)
            if elsewhere & set(reduce.indices):
                reduce = rename_apart(reduce)  # type: ignore[assignment]
            indices.extend(reduce.indices)
            factors.append(reduce.body)
        return s(ir.Reduce(tuple(indices), ir.product(_fold_number(coefficient), *factors)))
    # a delta with equal indices is 1 where its index occurs elsewhere (it only marks a size otherwise)
    kept: list[ir.Expr] = []
    for position, factor in enumerate(factors):
        if isinstance(factor, ir.Delta):
            if factor.first == factor.second:
                others = factors[:position] + factors[position + 1:]
                if any(factor.first in indices_in(o) for o in others):
                    continue
            if factor in kept:
                continue  # delta * delta = delta
        kept.append(factor)
    factors = kept
    # equal factors (all indices bound) merge into powers
    merged: dict[ir.Expr, int | float] = {}
    order: list[ir.Expr] = []
    representative: dict[ir.Expr, ir.Expr] = {}
    for factor in factors:
        base, exponent = (factor.base, factor.exponent) if isinstance(factor, ir.Power) else (factor, 1)
        if isinstance(base, ir.Delta):
            order.append(factor)
            continue
        key = alpha_key(base)
        if key in merged:
            merged[key] = merged[key] + exponent
        else:
            merged[key] = exponent
            representative[key] = base
            order.append(key)
    rebuilt: list[ir.Expr] = []
    for key in order:
        if isinstance(key, ir.Delta):
            rebuilt.append(key)
            continue
        base = representative[key]
        exponent = merged[key]
        if exponent == 0:
            continue
        rebuilt.append(base if exponent == 1 else s(ir.Power(base, exponent)))
    factors = sorted(_logistic(rebuilt), key=_shape_key)
    if not factors:
        return _fold_number(coefficient)
    return _with_coefficient(coefficient, ir.product(*factors))


def _as_power(factor: ir.Expr) -> tuple[ir.Expr, int | float]:
    return (factor.base, factor.exponent) if isinstance(factor, ir.Power) else (factor, 1)


def _one_plus_exp(expr: ir.Expr) -> ir.Expr | None:
    """``u`` when ``expr`` is ``1 + exp(u)``."""
    if isinstance(expr, ir.Sum) and len(expr.terms) == 2:
        first, second = expr.terms
        if isinstance(first, ir.Num) and first.value == 1 and isinstance(second, ir.Call) and second.func == "exp":
            return second.arg
    return None


def _logistic(factors: list[ir.Expr]) -> list[ir.Expr]:
    """``exp(u)^a (1 + exp(u))^-a`` is ``sigmoid(u)^a`` (the derivative of softplus, written as such)."""
    result = list(factors)
    for position, factor in enumerate(result):
        base, exponent = _as_power(factor)
        if not (isinstance(base, ir.Call) and base.func == "exp"):
            continue
        key = alpha_key(base.arg)
        for other_position, other in enumerate(result):
            other_base, other_exponent = _as_power(other)
            inner = _one_plus_exp(other_base)
            if inner is not None and other_exponent == -exponent and alpha_key(inner) == key:
                sigmoid = ir.Call("sigmoid", base.arg)
                result[position] = sigmoid if exponent == 1 else ir.Power(sigmoid, exponent)
                del result[other_position]
                return _logistic(result)
    return result


def _terms_of(expr: ir.Expr) -> list[ir.Expr]:
    return list(expr.terms) if isinstance(expr, ir.Sum) else [expr]


def _s_sum(node: ir.Sum, s: Callable[[ir.Expr], ir.Expr]) -> ir.Expr:
    terms: list[ir.Expr] = []
    for term in node.terms:
        term = s(term)
        terms.extend(_terms_of(term))
    constant: int | float = 0
    merged: dict[ir.Expr, list] = {}
    order: list[ir.Expr] = []
    for term in terms:
        coefficient, rest = _split_coefficient(term)
        if rest is None:
            constant = constant + coefficient
            continue
        key, _ = canonical_key(rest, rename_free=False)
        if key in merged:
            merged[key][0] = merged[key][0] + coefficient
        else:
            merged[key] = [coefficient, rest]
            order.append(key)
    result = [_with_coefficient(merged[k][0], merged[k][1]) for k in order if merged[k][0] != 0]
    if constant != 0 or (not result and isinstance(constant, float)):
        result.insert(0, _fold_number(constant))
    if not result:
        return ir.Num(0)
    return result[0] if len(result) == 1 else ir.Sum(tuple(result))


def _factors_of(expr: ir.Expr) -> list[ir.Expr]:
    return list(expr.factors) if isinstance(expr, ir.Product) else [expr]


def _has_delta_on(expr: ir.Expr, indices: set[str]) -> bool:
    return any(isinstance(f, ir.Delta) and ({f.first, f.second} & indices) for f in _factors_of(expr))


def _eliminate_deltas(indices: list[str], factors: list[ir.Expr]) -> tuple[list[str], list[ir.Expr]]:
    changed = True
    while changed:
        changed = False
        for position, factor in enumerate(factors):
            if not isinstance(factor, ir.Delta) or factor.first == factor.second:
                continue
            if factor.first in indices:
                old, new = factor.first, factor.second
            elif factor.second in indices:
                old, new = factor.second, factor.first
            else:
                continue
            rest = factors[:position] + factors[position + 1:]
            factors = [rename(f, {old: new}) for f in rest]
            indices = [i for i in indices if i != old]
            changed = True
            break
    return indices, factors


def _common_factors(terms: list[ir.Expr]) -> tuple[list[ir.Expr], list[ir.Expr]] | None:
    """Factors every term shares (up to names of their inner sums), and what is left of each term."""
    lists = [_factors_of(t) for t in terms]
    common = Counter(alpha_key(f) for f in lists[0] if not isinstance(f, ir.Num))
    for factors in lists[1:]:
        common &= Counter(alpha_key(f) for f in factors)
    if not common:
        return None
    remainders = []
    for factors in lists:
        left = Counter(common)
        rest = []
        for f in factors:
            key = alpha_key(f)
            if left[key] > 0:
                left[key] -= 1
            else:
                rest.append(f)
        remainders.append(ir.product(*rest) if rest else ir.Num(1))
    shared = []
    for f in lists[0]:
        key = alpha_key(f)
        if common[key] > 0:
            shared.append(f)
            common[key] -= 1
    return shared, remainders


def _s_reduce(node: ir.Reduce, s: Callable[[ir.Expr], ir.Expr]) -> ir.Expr:
    body = s(node.body)
    indices = list(node.indices)
    if isinstance(body, ir.Reduce):
        indices += list(body.indices)
        body = body.body
    if is_zero(body):
        return ir.Num(0)
    factors = _factors_of(body)
    # distribute over a sum factor only when that lets a delta disappear
    for position, factor in enumerate(factors):
        if isinstance(factor, ir.Sum) and any(_has_delta_on(t, set(indices)) for t in factor.terms):
            others = factors[:position] + factors[position + 1:]
            body = s(ir.Sum(tuple(ir.product(*others, t) for t in factor.terms)))
            factors = _factors_of(body)
            break
    outer, rest = _split_coefficient(body)
    if isinstance(rest, ir.Sum) and outer != 1:
        # c * (a + b): work on the sum, scale the result
        return s(ir.product(_fold_number(outer), _s_reduce(ir.Reduce(tuple(indices), rest), s)))
    if isinstance(body, ir.Sum):
        terms = list(body.terms)
        wanted = set(indices)
        if any(_has_delta_on(t, wanted) for t in terms) and all(wanted <= indices_in(t) for t in terms):
            return s(ir.Sum(tuple(ir.Reduce(tuple(indices), t) for t in terms)))
        shared = _common_factors(terms)
        if shared is not None:
            common, remainders = shared
            inner = s(ir.Sum(tuple(remainders)))
            return _finish_reduce(indices, [*common, *_factors_of(inner)], s)
        if all(wanted <= indices_in(t) for t in terms):
            return s(ir.Sum(tuple(ir.Reduce(tuple(indices), t) for t in terms)))
        return _finish_reduce(indices, [body], s)
    return _finish_reduce(indices, factors, s)


def _finish_reduce(indices: list[str], factors: list[ir.Expr], s: Callable[[ir.Expr], ir.Expr]) -> ir.Expr:
    indices, factors = _eliminate_deltas(indices, factors)
    coefficient = 1
    rest = []
    for f in factors:
        if isinstance(f, ir.Num):
            coefficient = coefficient * f.value
        else:
            rest.append(f)
    if coefficient == 0:
        return ir.Num(0)
    body = s(ir.product(*rest)) if rest else ir.Num(1)
    if not indices:
        return _with_coefficient(coefficient, None if isinstance(body, ir.Num) and body.value == 1 else body) \
            if not isinstance(body, ir.Num) else _fold_number(coefficient * body.value)
    present = indices_in(body)
    for index in indices:
        if index not in present:
            body = ir.product(body, ir.Delta(index, index))  # sums a constant: the index's size
    body_coefficient, body_rest = _split_coefficient(body)
    total = coefficient * body_coefficient
    if body_rest is None:
        body_rest = ir.Num(1)
    return _with_coefficient(total, ir.Reduce(tuple(indices), body_rest))


def _s_call(node: ir.Call, s: Callable[[ir.Expr], ir.Expr]) -> ir.Expr:
    arg = s(node.arg)
    if isinstance(arg, ir.Num):
        with np.errstate(all="ignore"):
            value = FUNCTION_RULES[node.func].value(np, np.asarray(arg.value))
        value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            return ir.Call(node.func, arg)
        return _fold_number(value)
    return ir.Call(node.func, arg)


def _s_power(node: ir.Power, s: Callable[[ir.Expr], ir.Expr]) -> ir.Expr:
    base = s(node.base)
    exponent = node.exponent
    if exponent == 1:
        return base
    if exponent == 0:
        return ir.Num(1)
    if isinstance(base, ir.Num):
        try:
            value = base.value ** exponent
        except (OverflowError, ZeroDivisionError):
            return ir.Power(base, exponent)
        if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
            return ir.Power(base, exponent)
        if isinstance(exponent, int) and exponent < 0 and isinstance(base.value, int):
            value = float(value)
        return _fold_number(value)
    if isinstance(base, ir.Power) and isinstance(exponent, int):
        return s(ir.Power(base.base, base.exponent * exponent))
    return ir.Power(base, exponent)


_RULES: dict[type, Callable[..., ir.Expr]] = {
    ir.Product: _s_product,
    ir.Sum: _s_sum,
    ir.Reduce: _s_reduce,
    ir.Call: _s_call,
    ir.Power: _s_power,
}


def simplify(expr: ir.Expr) -> ir.Expr:
    """Simplify a bound-normal-form expression to a fixed point."""
    cache: dict[ir.Expr, ir.Expr] = {}

    def s(node: ir.Expr) -> ir.Expr:
        rule = _RULES.get(type(node))
        if rule is None:
            return node
        found = cache.get(node)
        if found is None:
            found = rule(node, s)
            cache[node] = found
        return found

    for _ in range(8):
        result = s(expr)
        if result == expr:
            return result
        expr = result
    return expr
