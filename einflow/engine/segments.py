"""Sorted segment sums (LANGUAGE.md §9.3): a scatter-add over a sparse tensor's coordinates as ``np.add.reduceat``
over the entries in coordinate order, the order found once per coordinate array (``argsort``, cached on it).

Only coordinate arrays einflow owns are cached: read-only arrays with their own data (a sparse input's coordinates,
``einflow.engine.sparse_arrays.to_coo``); a scatter at positions the caller passes keeps ``bincount``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["cacheable", "segments", "segment_sum", "forget"]

#: elements of the value taken into sorted order at a time, 512 KiB of float64 (a longer segment is taken whole)
CHUNK = 1 << 16

#: id of a coordinate array -> (a weak reference to it, the segment ids, the sorting order or None, the starts)
_SEGMENTS: dict[int, tuple[Any, np.ndarray, np.ndarray | None, np.ndarray]] = {}


def cacheable(positions: Any) -> bool:
    """Whether ``positions`` is a 1-D integer array that cannot change under the cache (read-only, its own data)."""
    return isinstance(positions, np.ndarray) and positions.ndim == 1 and positions.dtype.kind in "iu" and \
        not positions.flags.writeable and positions.base is None and positions.size > 0


def segments(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(the distinct positions in order, the order sorting the entries or None when they are sorted, where each run
    of one position starts in that order) of a cacheable coordinate array, computed once per array.

    >>> p = np.array([2, 0, 2, 1]); p.setflags(write=False)
    >>> ids, order, starts = segments(p)
    >>> ids.tolist(), order.tolist(), starts.tolist()
    ([0, 1, 2], [1, 3, 0, 2], [0, 1, 2])
    """
    key = id(positions)
    hit = _SEGMENTS.get(key)
    if hit is not None and hit[0]() is positions:
        return hit[1], hit[2], hit[3]
    order: np.ndarray | None = None
    ordered = positions
    if positions.size > 1 and bool(np.any(positions[1:] < positions[:-1])):
        order = np.argsort(positions, kind="stable")
        ordered = positions[order]
    change = np.empty(ordered.size, dtype=bool)
    change[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    ids = ordered[starts]
    _SEGMENTS[key] = (weakref.ref(positions, forget(_SEGMENTS, key)), ids, order, starts)
    return ids, order, starts


def forget(cache: dict[int, Any], key: int) -> Callable[[Any], None]:
    """A weak reference's callback dropping ``key`` from ``cache`` when the object it keys is freed."""
    def drop(_: Any) -> None:
        cache.pop(key, None)
    return drop


def segment_sum(value: np.ndarray, positions: np.ndarray, axis: int, out_axis: int, order: tuple[int, ...],
                out_shape: tuple[int, ...]) -> np.ndarray:
    """``out[..., positions[z], ...] += value[..., z, ...]``: the value's ``axis`` (z) summed by runs of one position
    into the output's ``out_axis``; ``order``: the value's axis for each output axis.

    >>> p = np.array([2, 0, 2, 1]); p.setflags(write=False)
    >>> segment_sum(np.array([[1., 2., 3., 4.]]), p, 1, 0, (1, 0), (4, 1)).ravel().tolist()
    [2.0, 4.0, 4.0, 0.0]
    """
    ids, sort, starts = segments(positions)
    out = np.zeros(out_shape, dtype=value.dtype)
    rows = np.moveaxis(out, out_axis, 0)  # a view: the segments' rows written through it
    if sort is None:
        rows[ids] = np.moveaxis(np.add.reduceat(value, starts, axis=axis).transpose(order), out_axis, 0)
        return out
    # entries in sorted order, taken a chunk of whole segments at a time (no copy of the whole value is made)
    step = max(1, CHUNK // max(1, value.size // max(1, value.shape[axis])))
    first = 0
    while first < starts.size:
        last = int(np.searchsorted(starts, starts[first] + step, side="left"))
        last = max(last, first + 1)
        begin = int(starts[first])
        end = int(starts[last]) if last < starts.size else positions.size
        taken = np.take(value, sort[begin:end], axis=axis)
        sums = np.add.reduceat(taken, starts[first:last] - begin, axis=axis)
        rows[ids[first:last]] = np.moveaxis(sums.transpose(order), out_axis, 0)
        first = last
    return out
