"""Shifted, strided and gathered reads in exported source (LANGUAGE.md 8.2): the helpers the generated function
defines, per target, and the plain data its calls pass them.

The engine plans a window with the shapes known (``einflow.engine.affine``); exported code does the same at run
time: ``ranges`` infers each statement's ranges from the arrays' shapes by Tullio's rule, as
``einflow.lang.indices.infer_ranges`` does (without its error messages: a read that cannot fit raises
ValueError), ``window`` reads through positions (a strided view on numpy and torch, zero-padded where a declared
size lets the reads leave the array; one take at flat positions on jax and for gathers), ``scatter`` adds into
a zeroed array (``numpy.add.at``, ``Tensor.index_add_``, ``.at[].add``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from einflow.engine.affine import plain_positions
from einflow.engine.dialect import Dialect
from einflow.engine.steps import Scatter, Window
from einflow.lang import ir
from einflow.lang.padding import fold

__all__ = ["RANGES", "FLAT", "WINDOW", "SCATTER", "window_data", "scatter_data"]

RANGES = '''def {ranges}(reads, sizes, padded):
    """Each index only shifted reads size gets the largest range in which every read it takes part in stays
    inside its axis, and an index a plain read sizes shrinks to what its shifted reads allow (Tullio's rule).
    ``reads``: (axis length, ((coefficient, index), ...), offset, whether a delta's) per affine position."""
    def bounds(terms, offset):
        low = high = offset
        for coefficient, index in terms:
            reach = coefficient * (sizes[index] - 1)
            low, high = low + min(reach, 0), high + max(reach, 0)
        return low, high

    def limit(length, coefficient, low, high):
        return (length - 1 - high) // coefficient + 1 if coefficient > 0 else low // -coefficient + 1

    changed = True
    while changed:
        changed, limits = False, {{}}
        for length, terms, offset, lenient in reads:
            unknown = [(c, index) for c, index in terms if index not in sizes]
            if len(unknown) != 1:
                continue
            coefficient, index = unknown[0]
            known = [(c, i) for c, i in terms if i != index]
            if any(sizes[i] == 0 for _, i in known):
                continue
            low, high = bounds(known, offset)
            if lenient:
                low, high = max(low, 0), min(high, length - 1)
            elif low < 0 if coefficient > 0 else high > length - 1:
                raise ValueError(f"a shifted read of index {{index!r}} leaves its axis of length {{length}}")
            limits[index] = min(limits.get(index, limit(length, coefficient, low, high)),
                                max(limit(length, coefficient, low, high), 0))
        for index, size in limits.items():
            sizes[index], changed = size, True
    changed = True
    while changed:
        changed = False
        for length, terms, offset, lenient in reads:
            indices = {{i for _, i in terms}}
            if lenient or indices & set(padded) or not indices <= sizes.keys():
                continue
            for coefficient, index in terms:
                known = [(c, i) for c, i in terms if i != index]
                if sizes[index] == 0 or any(sizes[i] == 0 for _, i in known):
                    continue
                size = limit(length, coefficient, *bounds(known, offset))
                if 0 <= size < sizes[index]:
                    sizes[index], changed = size, True
    return sizes'''

FLAT = '''def {flat}(padded, shape, planned, gathers, device=None):
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
                value = value + coefficient * {np}.arange(shape[label]{device}).reshape(view)
        else:
            values, axes = gathers[position[1]], position[2]
            {check}
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = shape[a]
            value = values.{permute}(order).reshape(view)
        flat = flat + value * strides[axis]
    return flat'''

#: the bounds check of a gather's positions (none on jax, whose arrays may be traced)
_CHECK = {
    "numpy": 'if values.size and (values.min() < 0 or values.max() >= padded[axis]):\n'
             '                raise IndexError(f"a gather reads a position outside its axis of length {padded[axis]}")',
    "torch": 'if values.numel() and (values.min() < 0 or values.max() >= padded[axis]):\n'
             '                raise IndexError(f"a gather reads a position outside its axis of length {padded[axis]}")',
    "jax": "pass  # (jax: traced positions cannot be checked; outside ones are clamped)",
}

def _fold_text() -> str:
    """``einflow.lang.padding.fold`` itself (one implementation: operators only, so any array module runs it),
    its signature without annotations and its name a placeholder."""
    text = inspect.getsource(fold)
    return re.sub(r"def fold\(.*?\) -> Any:", "def {fold}(position, length, mode):", text, count=1, flags=re.S)


#: ``pad circular|reflect|replicate`` (LANGUAGE.md 9.4): the padded array as one take of folded positions per axis
_FOLDED = {
    "numpy": "{np}.take(array, {fold}({np}.arange(-before, length + after), length, mode), axis=axis)",
    "jax": "{np}.take(array, {fold}({np}.arange(-before, length + after), length, mode), axis=axis)",
    "torch": "array.index_select(axis, {fold}({np}.arange(-before, length + after, device=array.device), length, "
             "mode))",
}


def _padding(target: str, zeros: str) -> str:
    return f'''    if any(pair != (0, 0) for pair in pads) and mode == "zeros":
        array = {zeros}
    for axis, (before, after) in enumerate(pads if mode != "zeros" else ()):
        if before or after:
            length = array.shape[axis]
            array = {_FOLDED[target]}'''


_PLAN = '''    pads, planned = [], []
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
        planned.append(("affine", terms, offset + pads[-1][0]))'''

WINDOW = {
    "numpy": '''def {window}(array, shape, positions, *gathers, mode="zeros"):
    """A shifted, strided or gathered read: a strided view (padded first where the reads leave the array: zeros,
    or the array folded by ``mode``), or one take at flat positions where it gathers."""
''' + _PLAN + "\n" + _padding("numpy", "{np}.pad(array, pads)") + '''
    if gathers or not all(shape):
        return array.reshape(-1)[{flat}(array.shape, shape, planned, gathers)]
    strides = [0] * len(shape)
    for axis, (_, terms, _) in enumerate(planned):
        for label, coefficient in terms:
            strides[label] += coefficient * array.strides[axis]
    start = tuple(slice(position[2], None) for position in planned)
    return {np}.lib.stride_tricks.as_strided(array[start], shape=shape, strides=tuple(strides), writeable=False)''',
    "torch": '''def {window}(array, shape, positions, *gathers, mode="zeros"):
    """A shifted, strided or gathered read: ``as_strided`` (padded first where the reads leave the array: zeros,
    or the array folded by ``mode``) where every stride is non-negative, else one take at flat positions."""
''' + _PLAN + "\n" + _padding("torch", "{np}.nn.functional.pad(array, [w for pair in reversed(pads) for w in pair])"
                               ) + '''
    strides, offset = [0] * len(shape), array.storage_offset()
    if not gathers:
        for axis, (_, terms, start) in enumerate(planned):
            offset += start * array.stride(axis)
            for label, coefficient in terms:
                strides[label] += coefficient * array.stride(axis)
    if not gathers and all(stride >= 0 for stride in strides) and all(shape):
        return array.as_strided(shape, strides, offset)
    gathers = tuple(gather.long() for gather in gathers)
    return array.reshape(-1)[{flat}(tuple(array.shape), shape, planned, gathers, array.device)]''',
    "jax": '''def {window}(array, shape, positions, *gathers, mode="zeros"):
    """A shifted, strided or gathered read: one take at flat positions (padded first where the reads leave the
    array: zeros, or the array folded by ``mode``)."""
''' + _PLAN + "\n" + _padding("jax", "{np}.pad(array, pads)") + '''
    return array.reshape(-1)[{flat}(array.shape, shape, planned, gathers)]''',
}

_ADD = {
    "numpy": '''    if keep is not None:
        flat, weights = flat[keep], weights[keep]
    out = {np}.zeros(total, dtype=value.dtype)
    {np}.add.at(out, flat, weights)
    return out.reshape(shape)''',
    "torch": '''    if keep is not None:
        flat, weights = flat[keep], weights[keep]
    out = {np}.zeros(total, dtype=value.dtype, device=value.device)
    return out.index_add_(0, flat, weights).reshape(shape)''',
    "jax": '''    if keep is not None:
        flat = {np}.where(keep, flat, total)
    return {np}.zeros(total, dtype=value.dtype).at[flat].add(weights, mode="drop").reshape(shape)''',
}

#: the method making gathered positions an index array, where one is needed (torch's index_add_ takes int64)
_AS_INDEX = {"torch": ".long()"}

SCATTER = {target: '''def {scatter}(value, shape, positions, *gathers):
    """A scatter-add: each element of ``value`` added into a zeroed array of ``shape`` where ``positions`` put
    it (a plain position: the same axis of ``value``); elements landing outside are dropped."""
    rank, flat, inside, stride, strides = len(value.shape), 0, None, 1, []
    for length in reversed(shape):
        strides.insert(0, stride)
        stride *= length

    def along(axis):
        view = [1] * rank
        view[axis] = value.shape[axis]
        return {np}.arange(value.shape[axis]{device}).reshape(view)

    for axis, position in enumerate(positions):
        if position[0] == "plain":
            place = along(position[1])
        elif position[0] == "affine":
            place = position[2]
            for source, coefficient in position[1]:
                place = place + coefficient * along(source)
            if len(position) > 3:  # folded back onto the axis (pad circular|reflect|replicate)
                place = {fold}(place, shape[axis], position[3])
            else:
                fits = (place >= 0) & (place < shape[axis])
                inside = fits if inside is None else inside & fits
        else:
            values, axes = gathers[position[1]]''' + _AS_INDEX.get(target, "") + ''', position[2]
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = value.shape[a]
            place = values.{permute}(order).reshape(view)
        flat = flat + place * strides[axis]
    total, weights = 1, value.reshape(-1)
    for length in shape:
        total *= length
    flat = {np}.broadcast_to({np}.asarray(flat{device}), value.shape).reshape(-1)
    keep = None if inside is None else {np}.broadcast_to({np}.asarray(inside{device}), value.shape).reshape(-1)
''' + _ADD[target] for target in _ADD}


def helper_texts(dialect: Dialect, names: dict[str, str]) -> dict[str, str]:
    """The helpers' texts in ``dialect`` (``names``: np, ranges, flat, window, scatter -> their names here)."""
    target = dialect.name
    fields = dict(names, device=", device=device" if dialect.devices else "", permute=dialect.permute,
                  check=_CHECK[target])
    scatter_fields = dict(fields, device=", device=value.device" if dialect.devices else "")
    return {"ranges": RANGES.format(**fields), "flat": FLAT.format(**fields),
            "window": WINDOW[target].format(**fields), "scatter": SCATTER[target].format(**scatter_fields),
            "fold": _fold_text().replace("{fold}", names["fold"])}


def window_data(step: Window) -> Any:
    """The window's positions as plain data over its label axes (``einflow.engine.affine.plain_positions``)."""
    return plain_positions(step.positions, step.labels)


def scatter_data(step: Scatter) -> Any:
    """The scatter's positions as plain data over its value's axes: ("plain", axis), ("affine", ((axis,
    coefficient), ...), offset) or ("gather", k, axes)."""
    planned: list[Any] = []
    gather = 0
    for position in step.positions:
        if isinstance(position, str):
            planned.append(("plain", step.arg_labels.index(position)))
        elif isinstance(position, ir.Affine):
            planned.append(("affine", tuple((step.arg_labels.index(i), c) for c, i in position.terms),
                            position.offset))
            if step.modes and step.modes[len(planned) - 1] != "zeros":  # folded (``pad`` modes)
                planned[-1] = (*planned[-1], step.modes[len(planned) - 1])
        else:
            planned.append(("gather", gather, tuple(step.arg_labels.index(i) for i in position.indices)))
            gather += 1
    return tuple(planned)
