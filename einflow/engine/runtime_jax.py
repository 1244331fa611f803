"""The runtime helpers jax.numpy spells its own way (``JAX.runtime``): each replaces ``einflow.engine.runtime``'s.

jax arrays are immutable: the diagonal is written with ``.at[...].set`` (its indices are unique, which also
lets jax transpose the write: reverse mode through a JVP program with a surviving delta).
"""

from __future__ import annotations

import jax.numpy as xp

from einflow.engine.runtime import as_float
from einflow.lang.padding import fold

__all__ = ["erf", "diagonal", "flat", "window", "scatter"]


def diagonal(value, shape, groups):
    """value written on the diagonals of a zero array of ``shape`` (groups[k]: the axes value's axis k runs along)."""
    index = [None] * len(shape)
    for k, axes in enumerate(groups):
        positions = xp.arange(value.shape[k]).reshape(tuple(-1 if j == k else 1 for j in range(value.ndim)))
        for axis in axes:
            index[axis] = positions
    out = xp.zeros(shape, dtype=value.dtype)
    return out.at[tuple(index)].set(value, unique_indices=True)


def erf(x):
    """The error function elementwise (jax's own, traceable and differentiable)."""
    from jax.scipy.special import erf
    return erf(as_float(x))


# ------------------------------------------------------------------ shifted, strided and gathered reads
# (exported source: ``einflow.export.windows``; the engine's kernels, with every range known, are
# ``einflow.engine.affine``'s)


def flat(padded, shape, planned, gathers, device=None):
    """Flat positions into a C-ordered array of shape ``padded`` for every element of a read (broadcast)."""
    rank, flat, stride, strides = len(shape), 0, 1, []
    for length in reversed(padded):
        strides.insert(0, stride)
        stride *= length
    for axis, position in enumerate(planned):
        if position[0] == "affine":
            value = position[2]
            for label, coefficient in position[1]:
                view = [1] * rank
                view[label] = shape[label]
                value = value + coefficient * xp.arange(shape[label]).reshape(view)
        else:
            values, axes = gathers[position[1]], position[2]
            pass  # (jax: traced positions cannot be checked; outside ones are clamped)
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = shape[a]
            value = values.transpose(order).reshape(view)
        flat = flat + value * strides[axis]
    return flat


def window(array, shape, positions, *gathers, mode="zeros"):
    """A shifted, strided or gathered read: one take at flat positions (padded first where the reads leave the
    array: zeros, or the array folded by ``mode``)."""
    pads, planned = [], []
    for axis, position in enumerate(positions):
        if position[0] == "gather":
            pads.append((0, 0))
            planned.append(position)
            continue
        _, terms, offset = position
        low = high = offset
        if all(shape[label] for label, _ in terms):
            for label, coefficient in terms:
                reach = coefficient * (shape[label] - 1)
                low, high = low + min(reach, 0), high + max(reach, 0)
        pads.append((max(0, -low), max(0, high - (array.shape[axis] - 1))))
        planned.append(("affine", terms, offset + pads[-1][0]))
    if any(pair != (0, 0) for pair in pads) and mode == "zeros":
        array = xp.pad(array, pads)
    for axis, (before, after) in enumerate(pads if mode != "zeros" else ()):
        if before or after:
            length = array.shape[axis]
            array = xp.take(array, fold(xp.arange(-before, length + after), length, mode), axis=axis)
    return array.reshape(-1)[flat(array.shape, shape, planned, gathers)]


def scatter(value, shape, positions, *gathers):
    """A scatter-add: each element of ``value`` added into a zeroed array of ``shape`` where ``positions`` put
    it (a plain position: the same axis of ``value``); elements landing outside are dropped."""
    rank, flat, inside, stride, strides = len(value.shape), 0, None, 1, []
    for length in reversed(shape):
        strides.insert(0, stride)
        stride *= length

    def along(axis):
        view = [1] * rank
        view[axis] = value.shape[axis]
        return xp.arange(value.shape[axis]).reshape(view)

    for axis, position in enumerate(positions):
        if position[0] == "plain":
            place = along(position[1])
        elif position[0] == "affine":
            place = position[2]
            for source, coefficient in position[1]:
                place = place + coefficient * along(source)
            if len(position) > 3:  # folded back onto the axis (pad circular|reflect|replicate)
                place = fold(place, shape[axis], position[3])
            else:
                fits = (place >= 0) & (place < shape[axis])
                inside = fits if inside is None else inside & fits
        else:
            values, axes = gathers[position[1]], position[2]
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = value.shape[a]
            place = values.transpose(order).reshape(view)
        flat = flat + place * strides[axis]
    total, weights = 1, value.reshape(-1)
    for length in shape:
        total *= length
    flat = xp.broadcast_to(xp.asarray(flat), value.shape).reshape(-1)
    keep = None if inside is None else xp.broadcast_to(xp.asarray(inside), value.shape).reshape(-1)
    if keep is not None:
        flat = xp.where(keep, flat, total)
    return xp.zeros(total, dtype=value.dtype).at[flat].add(weights, mode="drop").reshape(shape)
