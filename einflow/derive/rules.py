"""Derivative rules, one per IR node (the function table's rules live in einflow/lang/functions.py).

``derivative(e)`` is the Jacobian of ``e`` in bound normal form: its free indices are e's plus the
fresh indices of the variable. Leaves decide what varies: an input gives Kronecker deltas, a target
with a known tangent gives that tangent, anything else is constant.
"""

from __future__ import annotations

from collections.abc import Callable

from einflow.derive.conjugate import complex_mode, conjugate, function_rule, is_holomorphic, push_parts, real_part
from einflow.derive.normal import _APART, rename, rename_apart, stem_of
from einflow.derive.sizes import active
from einflow.lang import ir

__all__ = ["Leaf", "derivative", "wirtinger"]

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
    rule = function_rule(node.func)
    if not rule.holomorphic:  # conj, real, abs, ...: df is R-linear in du (LANGUAGE.md 9.2), conj(du) in it
        return push_parts(rule.tangent(node.arg, rename_apart(inner)))
    outer = rule.derivative(node.arg)
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


def _fresh(indices: tuple[str, ...]) -> dict[str, str]:
    """New names for ``indices`` (same sizes), unique in the derivation as ``rename_apart``'s are."""
    mapping = {i: f"{stem_of(i)}_r{next(_APART)}" for i in indices}
    sizes = active()
    if sizes is not None:
        for old, new in mapping.items():
            sizes.alias(new, old)
    return mapping


def _copy(expr: ir.Expr, mapping: dict[str, str] | None = None) -> ir.Expr:
    """A copy of ``expr`` (free indices renamed by ``mapping``) whose bound indices are renamed apart (I1)."""
    return rename_apart(rename(expr, mapping or {}))


def _d_reduce(node: ir.Reduce, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    inner = d(node.body)
    if inner is None:
        return None
    if node.kind == "sum":
        return ir.Reduce(node.indices, inner)
    if node.kind == "mean":  # mean = sum / size; the size is sum[k](delta[k,k]) (no dense mean of a Jacobian)
        mapping = _fresh(node.indices)
        size = ir.Reduce(tuple(mapping.values()), ir.product(*(ir.Delta(k, k) for k in mapping.values())))
        return ir.product(ir.Reduce(node.indices, inner), ir.Power(size, -1))
    if node.kind == "logsumexp":  # d logsumexp[k](e) = sum[k](softmax[k](e) de)
        weights: ir.Expr = ir.Normalize("softmax", node.indices, _copy(node.body))
    else:  # max, min: the indicator of the arg-max (arg-min), ties split equally, as JAX does; computed in
        # one step from one array, so a recomputed body that rounds differently cannot unbalance it
        weights = ir.Normalize("argmax" if node.kind == "max" else "argmin", node.indices, _copy(node.body))
    return ir.Reduce(node.indices, ir.product(weights, rename_apart(inner)))


def _d_normalize(node: ir.Normalize, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    # s = softmax[k](e): ds[k] = s[k] (de[k] - sum[k'](s[k'] de[k'])), the compact form of s (delta - s) de;
    # d log_softmax[k](e) = de[k] - sum[k'](s[k'] de[k'])
    if node.kind in ("argmax", "argmin"):
        return None  # piecewise constant
    inner = d(node.body)
    if inner is None:
        return None
    mapping = _fresh(node.indices)
    softmax = ir.Normalize("softmax", node.indices, node.body)
    mean = ir.Reduce(tuple(mapping.values()), ir.product(_copy(softmax, mapping), _copy(inner, mapping)))
    centred = ir.Sum((rename_apart(inner), ir.negate(mean)))
    if node.kind == "log_softmax":
        return centred
    return ir.product(_copy(softmax), centred)


# ---- linear algebra (LANGUAGE.md 8.1), N = inv[i,j](M): dN = -N dM N, d logdet = N^T dM, d det = det N^T dM
def _d_linalg(node: ir.Linalg, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    if node.kind == "sign_det":  # piecewise constant (LANGUAGE.md 9.4)
        return None
    inner = d(node.body)
    if inner is None:
        return None
    if node.kind == "logdet":  # log|det| of complex matrices: Re(tr(N dM)) (LANGUAGE.md 9.2)
        varied = _trace(node, inner)
        return push_parts(real_part(varied)) if complex_mode() else varied
    row, column = node.indices
    if node.kind == "inv":  # dN[i,j] = -N[i,a] dM[a,b] N[b,j]
        mapping = _fresh(node.indices)
        a, b = mapping[row], mapping[column]
        inverse = ir.Linalg("inv", node.indices, node.body)
        return ir.Reduce((a, b), ir.product(_num(-1), _copy(inverse, {column: a}), _copy(inner, {row: a, column: b}),
                                            _copy(inverse, {row: b})))
    varied = _trace(node, inner)
    return ir.product(_copy(node), varied)


def _d_log_det(node: ir.Linalg, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    """d log det(M) = tr(N dM) (holomorphic; log|det| is its real part)."""
    inner = d(node.body)
    return None if inner is None else _trace(node, inner)


def _trace(node: ir.Linalg, inner: ir.Expr) -> ir.Expr:
    """sum[i,j](N[j,i] dM[i,j]): the inverse read transposed (its own indices swapped) against ``inner``."""
    row, column = node.indices
    transposed = _copy(ir.Linalg("inv", node.indices, node.body), {row: column, column: row})
    return ir.Reduce(node.indices, ir.product(transposed, rename_apart(inner)))


def _d_binary(node: ir.Binary, d: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr | None:
    # maximum(a, b): (1 + sign(a - b))/2 da + (1 - sign(a - b))/2 db (ties split equally, as JAX); minimum swapped
    left, right = d(node.left), d(node.right)
    if left is None and right is None:
        return None
    sign = 1 if node.func == "maximum" else -1
    difference = ir.Call("sign", ir.Sum((_copy(node.left), ir.negate(_copy(node.right)))))
    terms = []
    for varied, direction in ((left, sign), (right, -sign)):
        if varied is not None:
            weight = ir.Sum((_num(0.5), ir.product(_num(0.5 * direction), _copy(difference))))
            terms.append(ir.product(weight, rename_apart(varied)))
    return _add(terms)


_RULES: dict[type, Callable[..., ir.Expr | None]] = {
    ir.Num: lambda node, d: None,
    ir.Delta: lambda node, d: None,
    ir.Product: _d_product,
    ir.Sum: _d_sum,
    ir.Call: _d_call,
    ir.Power: _d_power,
    ir.Reduce: _d_reduce,
    ir.Normalize: _d_normalize,
    ir.Binary: _d_binary,
    ir.Linalg: _d_linalg,
}


def derivative(expr: ir.Expr, leaf: Leaf) -> ir.Expr | None:
    """d(expr) in bound normal form; None means identically zero."""

    def d(node: ir.Expr) -> ir.Expr | None:
        if isinstance(node, ir.Tensor):
            return leaf(node)
        return _RULES[type(node)](node, d)

    return d(expr)


def _combine(by_u: ir.Expr, by_conjugate: ir.Expr, straight: ir.Expr | None,
             crossed: ir.Expr | None) -> ir.Expr | None:
    """A Wirtinger part of f(u): ``by_u straight + by_conjugate conj(crossed)`` (None for zero)."""
    terms = []
    if straight is not None:
        terms.append(ir.product(by_u, rename_apart(straight)))
    if crossed is not None:
        terms.append(ir.product(by_conjugate, conjugate(rename_apart(crossed))))
    combined = _add(terms)
    return None if combined is None else push_parts(combined)


def wirtinger(expr: ir.Expr, leaf: Leaf) -> tuple[ir.Expr | None, ir.Expr | None]:
    """The Wirtinger derivatives (d expr/dz, d expr/dconj(z)) for the leaf rule of z (its deltas).

    A holomorphic sub-expression has d/dconj(z) = 0 and d/dz its ``derivative``; a non-holomorphic
    function f(u) combines its partials: d/dz = f_u u_z + f_conj(u) conj(u_conj(z)), d/dconj(z) =
    f_u u_conj(z) + f_conj(u) conj(u_z). Every other node's rule is linear in its children's derivatives,
    so it applies to each of the two parts.
    """
    known: dict[int, tuple[ir.Expr | None, ir.Expr | None]] = {}

    def parts(node: ir.Expr) -> tuple[ir.Expr | None, ir.Expr | None]:
        found = known.get(id(node))
        if found is not None:
            return found
        if isinstance(node, ir.Tensor):
            result: tuple[ir.Expr | None, ir.Expr | None] = (leaf(node), None)
        elif is_holomorphic(node):
            result = (derivative(node, leaf), None)
        elif isinstance(node, ir.Linalg) and node.kind == "logdet":
            # log|det M| = real(log det M) (complex arrays): real's parts (1/2, 1/2) after log det's tr(N dM)
            half = ir.Num(0.5)
            straight = _d_log_det(node, lambda child: parts(child)[0])
            crossed = _d_log_det(node, lambda child: parts(child)[1])
            result = (_combine(half, half, straight, crossed), _combine(half, half, crossed, straight))
        elif isinstance(node, ir.Call) and not function_rule(node.func).holomorphic:
            by_u, by_conjugate = function_rule(node.func).wirtinger(node.arg)
            assert by_conjugate is not None
            inner_u, inner_conjugate = parts(node.arg)
            result = (_combine(by_u, by_conjugate, inner_u, inner_conjugate),
                      _combine(by_u, by_conjugate, inner_conjugate, inner_u))
        else:
            rule = _RULES[type(node)]
            result = (rule(node, lambda child: parts(child)[0]), rule(node, lambda child: parts(child)[1]))
        known[id(node)] = result
        return result

    return parts(expr)


def input_leaf(name: str, fresh_indices: tuple[str, ...], symmetric: bool = False) -> Leaf:
    """Leaf rule for differentiating by input ``name`` at ``fresh_indices``: deltas pair the axes.

    A matrix declared symmetric varies on the symmetric matrices only: dA[a,b]/dA[p,q] is the projection
    (delta[a,p] delta[b,q] + delta[a,q] delta[b,p])/2, so gradients come out as (G + G^T)/2 (LANGUAGE.md 8.1).
    """

    def leaf(node: ir.Tensor) -> ir.Expr | None:
        if node.name != name:
            return None
        if not node.indices:
            return _num(1)
        if symmetric and len(node.indices) == 2:
            (a, b), (p, q) = node.indices, fresh_indices
            return ir.Sum((ir.product(_num(0.5), ir.Delta(a, p), ir.Delta(b, q)),
                           ir.product(_num(0.5), ir.Delta(a, q), ir.Delta(b, p))))
        return ir.product(*(ir.Delta(a, p) for a, p in zip(node.indices, fresh_indices)))

    return leaf
