"""Hoisting: in a large fused product, the factors that vary along few of its axes multiplied first.

``A[p,v,w] x[q] c[p]`` is computed ``(x[q] c[p]) A[p,v,w]``: one pass over the large result instead of two. The
specialise pass (``einflow.engine.measure``) rewrites a fused expression so before planning its blocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from einflow.engine.steps import Add, Arg, Mul, Node, Number, arg_nodes

__all__ = ["hoist", "axes_of", "HOIST_ELEMENTS", "HOIST_SHARE"]

#: in fused elementwise work on at least this many elements, a product's small factors are multiplied first
HOIST_ELEMENTS = 1 << 16
#: a product's factors that together vary along at most 1/HOIST_SHARE of its elements are multiplied first
HOIST_SHARE = 8


def hoist(node: Node, shape: tuple[int, ...], shapes: Mapping[int, tuple[int, ...]],
           hoisted: dict[Node, int]) -> Node:
    """``node`` (of ``shape``) with the factors of each product (under its sums) that vary along few of its axes
    multiplied first, on their own smaller shape: ``A[p,v,w] x[q] c[p]`` is ``(x[q] c[p]) A[p,v,w]``, one pass over
    the large result instead of two. The products moved first are recorded in ``hoisted`` (node -> elements)."""
    if isinstance(node, Add):
        return Add(tuple(hoist(term, shape, shapes, hoisted) for term in node.terms))
    if not isinstance(node, Mul):
        return node
    factors = [hoist(factor, shape, shapes, hoisted) for factor in node.factors]
    numbers = [factor for factor in factors if isinstance(factor, Number)]
    arrays = [factor for factor in factors if not isinstance(factor, Number)]
    covers = [axes_of(factor, len(shape), shapes) for factor in arrays]

    def elements(axes: set[int]) -> int:
        return math.prod(shape[axis] for axis in axes)

    full = elements(set().union(*covers))
    order: list[int] = []
    covered: set[int] = set()
    while len(order) < len(arrays):  # greedily: the factor that widens the partial product least
        best = min((k for k in range(len(arrays)) if k not in order),
                   key=lambda k: (elements(covered | covers[k]), -elements(covers[k])))
        if elements(covered | covers[best]) * HOIST_SHARE > full:
            break
        order.append(best)
        covered |= covers[best]
    if len(order) < 2:
        return Mul(tuple(factors))
    first = Mul((*(arrays[k] for k in order), *numbers))
    hoisted[first] = elements(covered)
    return Mul((first, *(factor for k, factor in enumerate(arrays) if k not in order)))


def axes_of(node: Node, rank: int, shapes: Mapping[int, tuple[int, ...]]) -> set[int]:
    """The axes of an expression's result (of ``rank`` axes) along which it varies."""
    if isinstance(node, Arg):
        if node.axes is None:
            return set(range(rank)) if shapes.get(node.register) else set()
        return {position for position, axis in enumerate(node.axes) if axis is not None}
    return {axis for register_node in arg_nodes(node) for axis in axes_of(register_node, rank, shapes)}
