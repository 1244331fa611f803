"""Keys of expressions up to the names of their summed indices (respecting index sizes).

Two expressions with equal ``canonical_key`` compute the same numbers: they differ only in the names
of indices bound inside them (and, with ``rename_free``, in a consistent renaming of free ones), and
each renamed index carries its size class from the derivation's registry (``sizes.py``), so
``sum[j](delta[j,j])`` and ``sum[c](delta[c,c])`` get equal keys only when ``|j| = |c|`` is known.
"""

from __future__ import annotations

import functools

from einflow.derive.normal import rename
from einflow.derive.sizes import active
from einflow.lang import ir
from einflow.lang.indices import indices_in

__all__ = ["bound_inside", "shape_key", "canonical_key", "alpha_key"]


def bound_inside(expr: ir.Expr) -> list[str]:
    """Indices bound by sum[...] somewhere inside ``expr``, in order of appearance."""
    found: dict[str, None] = {}
    for node in ir.walk(expr):
        found.update(dict.fromkeys(ir.reduced_indices(node)))
    return list(found)


_KIND = {ir.Num: 0, ir.Delta: 1, ir.Tensor: 2, ir.Power: 3, ir.Call: 4, ir.Sum: 5, ir.Reduce: 6, ir.Product: 7,
         ir.Normalize: 8, ir.Binary: 9, ir.Linalg: 10}


@functools.lru_cache(maxsize=16384)
def shape_key(expr: ir.Expr) -> tuple[int, str]:
    """Sort key ignoring index names (so alpha-equivalent products sort alike)."""
    anonymous = rename(expr, {i: "_" for i in indices_in(expr)})
    return _KIND[type(expr)], ir.format_expr(anonymous)


@functools.lru_cache(maxsize=16384)
def _sorted(expr: ir.Expr) -> ir.Expr:
    if isinstance(expr, ir.Product):
        return ir.Product(tuple(sorted((_sorted(f) for f in expr.factors), key=shape_key)))
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
