"""Simplification of bound-normal-form expressions: what a careful person would write.

Every index in normal form is bound and uniquely named, so each rule below preserves meaning. The
rules are rows: a name and a before -> after example (``RULES``; ``tests/test_simplify.py`` checks
every row, numerically and by the rule firing). Per node type they run in the order listed, bottom
up, until nothing changes.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from einflow.derive.canonical import alpha_key, bound_inside, canonical_key, shape_key
from einflow.derive.normal import normaliser_merges, rename, rename_apart
from einflow.lang import ir
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import indices_in
from einflow.lang.numbers import _fold_power, _weak
from einflow.lang.stable import stable_log, stable_softmax

__all__ = ["Rule", "RULES", "SimplifierLimitWarning", "simplify", "fired_rules", "is_zero", "canonical_key",
           "bound_inside"]


@dataclass(frozen=True)
class Rule:
    """One rewrite: where it applies, its name, and an example in normal form (before -> after)."""

    node: str
    name: str
    before: str
    after: str


#: every rewrite of the simplifier, in the order it is tried on its kind of node
RULES: tuple[Rule, ...] = (
    Rule("product", "flatten", "x[p] (y[p] z[p])^1", "x[p] y[p] z[p]"),
    Rule("product", "fold numbers", "2 x[p] * 3", "6 x[p]"),
    Rule("product", "zero", "0 x[p] y[p]", "0"),
    Rule("product", "scaled sum stays", "2 sum[k](A[p,k] + y[p])", "2 sum[k](A[p,k] + y[p])"),
    Rule("product", "negated sum", "-(x[p] - y[p])", "-x[p] + y[p]"),
    Rule("product", "hoist sums", "x[p] sum[k](A[p,k] y[k])", "sum[k](A[p,k] x[p] y[k])"),
    Rule("product", "unit delta", "delta[p,p] x[p]", "x[p]"),
    Rule("product", "idempotent delta", "delta[p,q] delta[p,q] A[p,q]", "delta[p,q] A[p,q]"),
    Rule("product", "powers", "x[p] x[p] x[p]^-0.5", "x[p]^1.5"),
    Rule("product", "sigmoid", "exp(x[p]) (1 + exp(x[p]))^-1", "sigmoid(x[p])"),
    Rule("product", "softmax", "exp(A[p,q]) sum[u](exp(A[p,u]))^-1", "softmax[q](A[p,q])"),
    Rule("product", "order", "y[p] * 2 delta[p,q]", "2 delta[p,q] y[p]"),
    Rule("sum", "flatten", "x[p] + (y[p] + z[p])^1", "x[p] + y[p] + z[p]"),
    Rule("sum", "like terms", "x[p] + 2 x[p] - y[p]", "3 x[p] - y[p]"),
    Rule("sum", "fold constants", "1 + x[p] + 2", "3 + x[p]"),
    Rule("reduce", "merge", "sum[k](sum[j](A[k,j]))", "sum[k,j](A[k,j])"),
    Rule("reduce", "zero", "sum[k](0 A[p,k])", "0"),
    Rule("reduce", "distribute for a delta", "sum[u](A[p,u] (delta[u,q] + B[u,q]))",
         "A[p,q] + sum[u](A[p,u] B[u,q])"),
    Rule("reduce", "scale outside", "sum[k](2 (A[p,k] + y[p]))", "2 sum[k](A[p,k] + y[p])"),
    Rule("reduce", "split terms", "sum[k](A[p,k] + B[k,p])", "sum[k](A[p,k]) + sum[k](B[k,p])"),
    Rule("reduce", "common factors", "sum[k](x[k] y[p] + x[k] z[p])", "sum[k](x[k] (y[p] + z[p]))"),
    Rule("reduce", "delta", "sum[u](delta[u,p] x[u])", "x[p]"),
    Rule("reduce", "count", "sum[q,u](2 delta[q,u] y[p])", "2 sum[u](delta[u,u] y[p])"),
    # a reduction or normaliser over an index its body lost (a delta eliminated it): the body is constant there
    Rule("reduce", "unused index", "max[k,u](sum[v](A[p,k] delta[u,v]))", "max[k](A[p,k])"),
    Rule("reduce", "unused index of logsumexp", "logsumexp[k,u](sum[v](A[p,k] delta[u,v]))",
         "logsumexp[k](A[p,k]) + log(sum[u](delta[u,u]))"),
    Rule("normalize", "unused index", "softmax[q,k](sum[v](A[p,k] delta[q,v]))",
         "softmax[q](delta[q,q]) softmax[k](A[p,k])"),
    Rule("normalize", "unused index of log_softmax", "log_softmax[q](sum[v](x[p] delta[q,v]))",
         "delta[p,p] log_softmax[q](delta[q,q])"),
    Rule("call", "fold numbers", "exp(0) x[p]", "x[p]"),
    Rule("call", "logsumexp", "log(sum[k](exp(A[p,k])))", "logsumexp[k](A[p,k])"),
    Rule("call", "softplus", "log(1 + exp(x[p]))", "softplus(x[p])"),
    Rule("call", "log sigmoid", "log(sigmoid(x[p]))", "-softplus(-x[p])"),
    Rule("call", "log_softmax", "log(exp(A[p,q]) / sum[u](exp(A[p,u])))", "log_softmax[q](A[p,q])"),
    Rule("power", "one", "(x[p] y[p])^1", "x[p] y[p]"),
    Rule("power", "fold numbers", "2^3 x[p]", "8 x[p]"),
    Rule("power", "power of power", "(x[p]^2)^3", "x[p]^6"),
)


class SimplifierLimitWarning(UserWarning):
    """The simplifier stopped at its pass limit before reaching a fixed point (the result is still correct)."""


_PASSES = 8
_FIRED: ContextVar[set[str] | None] = ContextVar("einflow_fired_rules", default=None)


def _fire(node: str, name: str) -> None:
    fired = _FIRED.get()
    if fired is not None:
        fired.add(f"{node}: {name}")


@contextlib.contextmanager
def fired_rules() -> Iterator[set[str]]:
    """Collect the ``"node: name"`` of every rule that changes something while the block runs."""
    token = _FIRED.set(set())
    try:
        yield _FIRED.get()  # type: ignore[misc]
    finally:
        _FIRED.reset(token)


def is_zero(expr: ir.Expr) -> bool:
    return isinstance(expr, ir.Num) and expr.value == 0 and not isinstance(expr.value, bool)


def _fold_number(value: float | int) -> ir.Num:
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    return ir.Num(_weak(value))  # (an int beyond int64 is a float, inf beyond the float range: never raises)


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


def _factors_of(expr: ir.Expr) -> list[ir.Expr]:
    return list(expr.factors) if isinstance(expr, ir.Product) else [expr]


def _terms_of(expr: ir.Expr) -> list[ir.Expr]:
    return list(expr.terms) if isinstance(expr, ir.Sum) else [expr]


def _as_power(factor: ir.Expr) -> tuple[ir.Expr, int | float]:
    return (factor.base, factor.exponent) if isinstance(factor, ir.Power) else (factor, 1)


Simplify = Callable[[ir.Expr], ir.Expr]


# ---------------------------------------------------------------- products


def _s_product(node: ir.Product, s: Simplify) -> ir.Expr:
    coefficient: int | float = 1
    numbers = 0
    factors: list[ir.Expr] = []
    reduces: list[ir.Reduce] = []
    pending = list(node.factors)
    while pending:
        factor = s(pending.pop(0))
        if isinstance(factor, ir.Product):
            _fire("product", "flatten")
            pending[:0] = list(factor.factors)
        elif isinstance(factor, ir.Num):
            numbers += 1
            if numbers == 2:
                _fire("product", "fold numbers")
            coefficient = coefficient * factor.value
        elif isinstance(factor, ir.Reduce) and factor.kind == "sum":
            reduces.append(factor)
        else:
            factors.append(factor)
    if coefficient == 0:
        _fire("product", "zero")
        return ir.Num(0)
    if len(reduces) == 1 and not factors:
        # nothing to contract the sum with; keeping c outside is also what "scale outside" makes of it
        _fire("product", "scaled sum stays")
        return _with_coefficient(coefficient, reduces[0])
    if reduces:
        return s(_hoist_sums(coefficient, factors, reduces))
    if coefficient == -1 and len(factors) == 1 and isinstance(factors[0], ir.Sum):
        # -(a - b) is -a + b: the minus goes into the terms (the generated code is b - a, one pass fewer)
        _fire("product", "negated sum")
        return s(ir.Sum(tuple(ir.product(ir.Num(-1), term) for term in factors[0].terms)))
    factors = _unit_deltas(factors)
    factors = _powers(factors, s)
    factors = _sigmoid(factors)
    factors = _softmax(factors)
    ordered = sorted(factors, key=shape_key)
    if ordered != factors:
        _fire("product", "order")
    if not ordered:
        return _fold_number(coefficient)
    return _with_coefficient(coefficient, ir.product(*ordered))


def _hoist_sums(coefficient: int | float, factors: list[ir.Expr], reduces: list[ir.Reduce]) -> ir.Expr:
    """``x[p] sum[k](A[p,k] y[k])`` -> ``sum[k](x[p] A[p,k] y[k])``: the whole product is one contraction.

    A summed index also used elsewhere in the product (a copied sub-expression) is renamed apart first.
    """
    _fire("product", "hoist sums")
    indices: list[str] = []
    factors = list(factors)
    for position, reduce in enumerate(reduces):
        elsewhere = set().union(*(indices_in(f) for f in factors), *(indices_in(r) for r in reduces[position + 1:]))
        elsewhere |= set(indices)
        if elsewhere & set(reduce.indices):
            reduce = rename_apart(reduce)  # type: ignore[assignment]
        indices.extend(reduce.indices)
        factors.append(reduce.body)
    return ir.Reduce(tuple(indices), ir.product(_fold_number(coefficient), *factors))


def _unit_deltas(factors: list[ir.Expr]) -> list[ir.Expr]:
    """``delta[p,p]`` is 1 where ``p`` occurs elsewhere (alone it counts ``p``'s size); delta delta = delta."""
    kept: list[ir.Expr] = []
    for position, factor in enumerate(factors):
        if isinstance(factor, ir.Delta):
            if factor.first == factor.second:
                others = factors[:position] + factors[position + 1:]
                if any(factor.first in indices_in(o) for o in others):
                    _fire("product", "unit delta")
                    continue
            if factor in kept:
                _fire("product", "idempotent delta")
                continue
        kept.append(factor)
    return kept


def _powers(factors: list[ir.Expr], s: Simplify) -> list[ir.Expr]:
    """Equal factors (equal up to their summed indices' names) merge into one power."""
    merged: dict[ir.Expr, int | float] = {}
    order: list[ir.Expr] = []
    representative: dict[ir.Expr, ir.Expr] = {}
    for factor in factors:
        base, exponent = _as_power(factor)
        if isinstance(base, ir.Delta):
            # a delta is 0 or 1: a positive power of it is itself
            order.append(base if exponent > 0 else factor)
            continue
        key = alpha_key(base)
        if key in merged:
            _fire("product", "powers")
            merged[key] = merged[key] + exponent
        else:
            merged[key] = exponent
            representative[key] = base
            order.append(key)
    rebuilt: list[ir.Expr] = []
    for key in order:
        if key not in representative:  # a delta, or a power of one kept as it is
            rebuilt.append(key)
            continue
        base = representative[key]
        exponent = merged[key]
        if exponent == 0:
            continue
        rebuilt.append(base if exponent == 1 else s(ir.Power(base, exponent)))
    return rebuilt


def _one_plus_exp(expr: ir.Expr) -> ir.Expr | None:
    """``u`` when ``expr`` is ``1 + exp(u)``."""
    if isinstance(expr, ir.Sum) and len(expr.terms) == 2:
        first, second = expr.terms
        if isinstance(first, ir.Num) and first.value == 1 and isinstance(second, ir.Call) and second.func == "exp":
            return second.arg
    return None


def _sigmoid(factors: list[ir.Expr]) -> list[ir.Expr]:
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
                _fire("product", "sigmoid")
                sigmoid = ir.Call("sigmoid", base.arg)
                result[position] = sigmoid if exponent == 1 else ir.Power(sigmoid, exponent)
                del result[other_position]
                return _sigmoid(result)
    return result


def _softmax(factors: list[ir.Expr]) -> list[ir.Expr]:
    """``exp(u[q]) / sum[k](exp(u[k]))`` is ``softmax[q](u[q])`` (evaluated max-shifted: no overflow)."""
    rewritten = stable_softmax(factors)
    while rewritten is not None:
        _fire("product", "softmax")
        factors = rewritten
        rewritten = stable_softmax(factors)
    return factors


# ---------------------------------------------------------------- sums


def _s_sum(node: ir.Sum, s: Simplify) -> ir.Expr:
    terms: list[ir.Expr] = []
    for term in node.terms:
        term = s(term)
        if isinstance(term, ir.Sum):
            _fire("sum", "flatten")
        terms.extend(_terms_of(term))
    constant: int | float = 0
    constants = 0
    merged: dict[ir.Expr, list] = {}
    order: list[ir.Expr] = []
    for term in terms:
        coefficient, rest = _split_coefficient(term)
        if rest is None:
            constant = constant + coefficient
            constants += 1
            continue
        key, _ = canonical_key(rest, rename_free=False)
        if key in merged:
            _fire("sum", "like terms")
            merged[key][0] = merged[key][0] + coefficient
        else:
            merged[key] = [coefficient, rest]
            order.append(key)
    if constants > 1:
        _fire("sum", "fold constants")
    result = [_with_coefficient(merged[k][0], merged[k][1]) for k in order if merged[k][0] != 0]
    if constant != 0 or (not result and isinstance(constant, float)):
        result.insert(0, _fold_number(constant))
    if not result:
        return ir.Num(0)
    return result[0] if len(result) == 1 else ir.Sum(tuple(result))


# ---------------------------------------------------------------- sum[...]


def _has_delta_on(expr: ir.Expr, indices: set[str]) -> bool:
    """A factor of ``expr`` is a delta on ``indices``, or a sum with such a term (distributing reaches it)."""
    return any((isinstance(f, ir.Delta) and bool({f.first, f.second} & indices))
               or (isinstance(f, ir.Sum) and any(_has_delta_on(t, indices) for t in f.terms))
               or (isinstance(f, ir.Reduce) and f.kind == "sum" and _has_delta_on(f.body, indices))
               for f in _factors_of(expr))


def _eliminate_deltas(indices: list[str], factors: list[ir.Expr]) -> tuple[list[str], list[ir.Expr]]:
    """``sum[k](delta[k,p] x[k])`` -> ``x[p]``: a delta on a summed index renames it to its partner."""
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
            if normaliser_merges(rest, old, new):
                continue  # softmax[k](e[q,k]) at k = q is not softmax[q](e[q,q]): the delta stays
            _fire("reduce", "delta")
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


def _s_reduce(node: ir.Reduce, s: Simplify) -> ir.Expr:
    if node.kind != "sum":
        # max/min/mean/logsumexp: none of the sum rules (merging, delta elimination, splitting, hoisting) hold
        body = s(node.body)
        present = indices_in(body)
        used = tuple(i for i in node.indices if i in present)
        if used == node.indices:
            return ir.Reduce(node.indices, body, node.kind)
        # constant along the unused indices: max/min/mean ignore them, logsumexp adds log of their count
        reduced = ir.Reduce(used, body, node.kind) if used else body
        if node.kind != "logsumexp":
            _fire("reduce", "unused index")
            return reduced
        _fire("reduce", "unused index of logsumexp")
        unused = tuple(i for i in node.indices if i not in present)
        count = ir.Reduce(unused, ir.product(*(ir.Delta(i, i) for i in unused)))
        return s(ir.Sum((reduced, ir.Call("log", count))))
    body = s(node.body)
    indices = list(node.indices)
    if isinstance(body, ir.Reduce) and body.kind == "sum":
        _fire("reduce", "merge")
        indices += list(body.indices)
        body = body.body
    if is_zero(body):
        _fire("reduce", "zero")
        return ir.Num(0)
    factors = _factors_of(body)
    # distribute over a sum factor only when that lets a delta disappear
    for position, factor in enumerate(factors):
        if isinstance(factor, ir.Sum) and any(_has_delta_on(t, set(indices)) for t in factor.terms):
            others = factors[:position] + factors[position + 1:]
            distributed = s(ir.Sum(tuple(ir.product(*others, t) for t in factor.terms)))
            if distributed != body:
                _fire("reduce", "distribute for a delta")
            body = distributed
            factors = _factors_of(body)
            break
    outer, rest = _split_coefficient(body)
    if isinstance(rest, ir.Sum) and outer != 1:
        _fire("reduce", "scale outside")
        return s(ir.product(_fold_number(outer), _s_reduce(ir.Reduce(tuple(indices), rest), s)))
    if isinstance(body, ir.Sum):
        terms = list(body.terms)
        wanted = set(indices)
        if all(wanted <= indices_in(t) for t in terms) and any(_has_delta_on(t, wanted) for t in terms):
            _fire("reduce", "split terms")
            return s(ir.Sum(tuple(ir.Reduce(tuple(indices), t) for t in terms)))
        shared = _common_factors(terms)
        if shared is not None:
            _fire("reduce", "common factors")
            common, remainders = shared
            inner = s(ir.Sum(tuple(remainders)))
            return _finish_reduce(indices, [*common, *_factors_of(inner)], s)
        if all(wanted <= indices_in(t) for t in terms):
            _fire("reduce", "split terms")
            return s(ir.Sum(tuple(ir.Reduce(tuple(indices), t) for t in terms)))
        return _finish_reduce(indices, [body], s)
    return _finish_reduce(indices, factors, s)


def _finish_reduce(indices: list[str], factors: list[ir.Expr], s: Simplify) -> ir.Expr:
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
        if isinstance(body, ir.Num):
            return _fold_number(coefficient * body.value)
        return _with_coefficient(coefficient, None if isinstance(body, ir.Num) and body.value == 1 else body)
    present = indices_in(body)
    for index in indices:
        if index not in present:
            _fire("reduce", "count")
            body = ir.product(body, ir.Delta(index, index))  # sums a constant: the index's size
    body_coefficient, body_rest = _split_coefficient(body)
    total = coefficient * body_coefficient
    if body_rest is None:
        body_rest = ir.Num(1)
    return _with_coefficient(total, ir.Reduce(tuple(indices), body_rest))


# ---------------------------------------------------------------- functions and powers


def _s_call(node: ir.Call, s: Simplify) -> ir.Expr:
    arg = s(node.arg)
    if node.func == "log":
        stable = stable_log(arg)
        if stable is not None:
            _fire("call", stable[0])
            return s(stable[1])
    if isinstance(arg, ir.Num):
        with np.errstate(all="ignore"):
            value = FUNCTION_RULES[node.func].value(np, np.asarray(arg.value))
        value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            return ir.Call(node.func, arg)
        _fire("call", "fold numbers")
        return _fold_number(value)
    return ir.Call(node.func, arg)


def _s_power(node: ir.Power, s: Simplify) -> ir.Expr:
    base = s(node.base)
    exponent = node.exponent
    if exponent == 1:
        _fire("power", "one")
        return base
    if exponent == 0:
        _fire("power", "one")
        return ir.Num(1)
    if isinstance(base, ir.Num):
        try:  # (bounded work: 10^400 and 10^(10^9) fold in float64 without forming the integer)
            value = base.value ** exponent if isinstance(base.value, complex) else _fold_power(base.value, exponent)
        except (OverflowError, ZeroDivisionError):
            return ir.Power(base, exponent)
        if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
            return ir.Power(base, exponent)
        if isinstance(exponent, int) and exponent < 0 and isinstance(base.value, int):
            value = float(value)
        _fire("power", "fold numbers")
        return _fold_number(value)
    if isinstance(base, ir.Power) and isinstance(exponent, int):
        _fire("power", "power of power")
        return s(ir.Power(base.base, base.exponent * exponent))
    if isinstance(base, ir.Product) and isinstance(exponent, int) and exponent > 0:
        spans = [frozenset(indices_in(f)) for f in base.factors]
        if len(set(spans)) > 1:  # (a[i,p] x[q])^2 = a[i,p]^2 x[q]^2: a sum over i, p, q then factors apart
            _fire("power", "power of product")
            return s(ir.product(*(ir.Power(f, exponent) for f in base.factors)))
    return ir.Power(base, exponent)


def _s_normalize(node: ir.Normalize, s: Simplify) -> ir.Expr:
    body = s(node.body)
    present = indices_in(body)
    used = tuple(i for i in node.indices if i in present)
    if used == node.indices:
        return ir.Normalize(node.kind, node.indices, body)
    # constant along the unused indices (bound around the normaliser): normalising over them alone gives
    # softmax[q](delta[q,q]) = 1/size(q) (argmax: ties split equally, the same), log_softmax -log size(q)
    unused = tuple(i for i in node.indices if i not in present)
    constant = ir.Normalize(node.kind, unused, ir.product(*(ir.Delta(i, i) for i in unused)))
    if used:
        rest: ir.Expr = ir.Normalize(node.kind, used, body)
    else:  # nothing left to normalise: the body's own indices stay (delta[p,p] = 1 along p)
        rest = ir.product(*(ir.Delta(i, i) for i in sorted(present - set(bound_inside(body)))))
    if node.kind == "log_softmax":
        _fire("normalize", "unused index of log_softmax")
        return s(ir.Sum((rest, constant)) if used else ir.product(constant, rest))
    _fire("normalize", "unused index")
    return s(ir.product(rest, constant))


def _s_linalg(node: ir.Linalg, s: Simplify) -> ir.Expr:
    return ir.Linalg(node.kind, node.indices, s(node.body))


def _s_binary(node: ir.Binary, s: Simplify) -> ir.Expr:
    return ir.Binary(node.func, s(node.left), s(node.right))


_NODE_RULES: dict[type, Callable[..., ir.Expr]] = {
    ir.Normalize: _s_normalize,
    ir.Binary: _s_binary,
    ir.Linalg: _s_linalg,
    ir.Product: _s_product,
    ir.Sum: _s_sum,
    ir.Reduce: _s_reduce,
    ir.Call: _s_call,
    ir.Power: _s_power,
}


def simplify(expr: ir.Expr) -> ir.Expr:
    """Simplify a bound-normal-form expression to a fixed point (warns if the pass limit stops it first)."""
    cache: dict[ir.Expr, ir.Expr] = {}

    def s(node: ir.Expr) -> ir.Expr:
        rule = _NODE_RULES.get(type(node))
        if rule is None:
            return node
        found = cache.get(node)
        if found is None:
            found = rule(node, s)
            cache[node] = found
        return found

    for _ in range(_PASSES):
        result = s(expr)
        if result == expr:
            return result
        expr = result
    warnings.warn(f"the simplifier stopped after {_PASSES} passes without reaching a fixed point; the result "
                  f"is correct but may not be in its simplest form: {ir.format_expr(expr)}",
                  SimplifierLimitWarning, stacklevel=2)
    return expr
