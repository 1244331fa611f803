"""Contraction order with a sparse factor (LANGUAGE.md §9.3): which dense factors of a product are contracted with
each other before the product gathers them at the sparse factor's coordinates.

Gathered at the entries, a dense factor's indices shared with the sparse factor become the entries' index z: every
step that touches z costs nnz x the sizes of its other indices. Contracting two dense factors first costs their
dense sizes instead, which pays where the entries outnumber the rows they gather (``S[i,j] B[j,k] C[k,f]`` with
many entries per row: ``B C`` first, then one gather of it, instead of nnz x k x f). The cost of every contraction
tree over the factors is compared, with the sparse factor's steps costing nnz x their other indices, against the
best tree that gathers each dense factor alone (the product as the rewrite writes it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cache

__all__ = ["dense_groups", "GAIN", "MOST"]

#: the grouped order is taken when it costs at most this share of the order that gathers every factor alone
GAIN = 0.5
#: products with more dense factors than this are left in the order the rewrite writes them
MOST = 6


def dense_groups(sparse: frozenset[str], dense: Sequence[frozenset[str]], needed: frozenset[str],
                 sizes: Mapping[str, int], nnz: int) -> list[tuple[int, ...]]:
    """Groups of the ``dense`` factors (by position, each of two or more) to contract with each other first, from
    the cheapest contraction tree; empty where gathering every factor alone costs at most 1/:data:`GAIN` of it.

    ``sparse``: the sparse factor's indices; ``needed``: the indices read outside the factors (kept by the
    product, or read by its other factors); ``sizes``: every index's size; ``nnz``: the sparse factor's entries.

    >>> s, d = frozenset("ij"), [frozenset("jk"), frozenset("kf")]
    >>> dense_groups(s, d, frozenset("if"), {"i": 100, "j": 100, "k": 64, "f": 32}, 2000)
    [(0, 1)]
    >>> dense_groups(s, d, frozenset("if"), {"i": 100, "j": 100, "k": 64, "f": 32}, 50)
    []
    """
    count = len(dense)
    if count < 2 or count > MOST:
        return []
    operands = (sparse, *dense)
    full = (1 << (count + 1)) - 1

    def indices(subset: int) -> frozenset[str]:
        inside = frozenset().union(*(operands[k] for k in range(count + 1) if subset >> k & 1))
        outside = frozenset().union(*(operands[k] for k in range(count + 1) if not subset >> k & 1))
        return inside & (needed | outside)

    def step(subset: int, left: int, right: int) -> float:
        union = indices(left) | indices(right)
        if subset & 1:  # on the entries: nnz x the indices that are not the sparse factor's
            return nnz * math.prod(sizes[i] for i in union - sparse)
        return float(math.prod(sizes[i] for i in union))

    @cache
    def best(subset: int, alone: bool) -> tuple[float, tuple[int, ...]]:
        """(the cheapest cost, the groups) of contracting ``subset``; ``alone``: dense factors only one by one."""
        if subset & (subset - 1) == 0:
            return 0.0, ()
        if alone and not subset & 1:
            return math.inf, ()
        found: tuple[float, tuple[int, ...]] = (math.inf, ())
        left = (subset - 1) & subset
        while left:
            right = subset ^ left
            if (not left & 1) if subset & 1 else left < right:  # each split once; the sparse side on the left
                left = (left - 1) & subset
                continue
            first, second = best(left, alone), best(right, alone)
            cost = first[0] + second[0] + step(subset, left, right)
            if cost < found[0]:
                groups = first[1] + second[1]
                if subset & 1 and right & (right - 1):  # a dense subtree of two or more beside the entries
                    groups += (right,)
                found = (cost, groups)
            left = (left - 1) & subset
        return found

    grouped, alone = best(full, False), best(full, True)
    if not grouped[1] or grouped[0] > GAIN * alone[0]:
        return []
    return [tuple(k - 1 for k in range(1, count + 1) if subset >> k & 1) for subset in grouped[1]]
