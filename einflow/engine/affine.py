"""Shifted, strided, constant and gathered reads (LANGUAGE.md 8.2) on arrays: the :class:`~einflow.engine.steps.Window`
step's plan and its kernels.

A read ``x[n, c, 2*h + r - 1, 2*w + s - 1]`` becomes one array with an axis per index (``n, c, h, r, w, s``):
on numpy and cupy a strided view of ``x`` (no copy; a zero-padded copy first only where a ``size`` declaration
lets the read leave the axis), on torch ``torch.as_strided`` where every stride is non-negative; elsewhere
(jax, dask, negative strides, gathers) one ``take`` at flat positions computed by broadcasting. The product
that reads the window is then an ordinary contraction, planned by opt_einsum like any other.

>>> import numpy as np
>>> spec = window_spec(("h", "r"), (3, 2), (5,), (("affine", ((0, 1), (1, 1)), 0),), ())
>>> window_numpy(np.arange(5.0), spec)
array([[0., 1.],
       [1., 2.],
       [2., 3.]])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from einflow.engine.dialect import JAX, NUMPY, TORCH, Dialect
from einflow.engine.helpers import bound_helpers
from einflow.engine.segments import cacheable, segment_sum
from einflow.lang import ir
from einflow.lang.errors import GatherIndexError, ShapeError
from einflow.lang.indices import position_bounds
from einflow.lang.padding import fold

__all__ = ["window_temporaries", "take_labels", "scatter_temporaries", "is_view",
           "ScatterSpec", "scatter_spec", "scatter_numpy",
           "scatter_torch", "scatter_jax", "scatter_kernel", "WindowSpec", "plain_positions", "window_spec",
           "window_numpy", "window_torch", "window_generic", "is_identity", "window_kernel"]

#: (shape, pads or None, positions, name, mode): each position ``("affine", ((label axis, coefficient), ...),
#: offset)`` (offset after padding) or ``("gather", k, label axes of the gather's indices, axis length)``; the
#: padding reads zeros or, by ``mode``, the folded array (``pad circular|reflect|replicate``)
WindowSpec = tuple[tuple[int, ...], tuple[tuple[int, int], ...] | None, tuple[Any, ...], str, str]


def plain_positions(positions: tuple[ir.Position, ...], labels: tuple[str, ...]) -> tuple[Any, ...]:
    """IR positions as plain data over the window's label axes (shape-free)."""
    found: list[Any] = []
    gather = 0
    for position in positions:
        if isinstance(position, str):
            found.append(("affine", ((labels.index(position), 1),), 0))
        elif isinstance(position, ir.Affine):
            found.append(("affine", tuple((labels.index(index), c) for c, index in position.terms), position.offset))
        else:
            found.append(("gather", gather, tuple(labels.index(index) for index in position.indices)))
            gather += 1
    return tuple(found)


def window_spec(labels: tuple[str, ...], sizes: tuple[int, ...], source_shape: tuple[int, ...],
                positions: tuple[Any, ...], gather_shapes: tuple[tuple[int, ...], ...], name: str = "x",
                mode: str = "zeros") -> WindowSpec:
    """The window's plan for known sizes: its shape, the padding its reads need, positions after padding."""
    if 0 in sizes:  # an empty window reads nothing: no padding, every position from the axis' start
        return tuple(sizes), None, tuple(("affine", p[1], 0) if p[0] == "affine" else (*p, length)
                                         for p, length in zip(positions, source_shape)), name, "zeros"
    named = dict(zip(labels, sizes))
    pads: list[tuple[int, int]] = []
    planned: list[Any] = []
    for axis, position in enumerate(positions):
        length = source_shape[axis]
        if position[0] == "gather":
            pads.append((0, 0))
            planned.append((*position, length))
            continue
        _, terms, offset = position
        low, high = position_bounds(ir.Affine(tuple((c, labels[label]) for label, c in terms), offset), named)
        before, after = max(0, -low), max(0, high - (length - 1))
        if mode != "zeros" and length == 0 and before + after:
            raise ShapeError(f"'{name}' is declared pad {mode}, but its axis {axis} is empty: there is nothing to "
                             f"read at positions {low}..{high}")
        pads.append((before, after))
        planned.append(("affine", terms, offset + before))
    padding = tuple(pads) if any(p != (0, 0) for p in pads) else None
    return tuple(sizes), padding, tuple(planned), name, mode if padding is not None else "zeros"


def padded(xp: Any, array: Any, pads: tuple[tuple[int, int], ...], mode: str) -> Any:
    """``array`` padded by ``pads`` (before, after) per axis: with zeros, or folded by ``mode``: numpy's
    wrap/reflect/edge with no limit on the width, on every backend, as one indexing by the folded positions of
    every axis (an open mesh: one copy, the padded array; dask indexes one axis at a time).

    >>> padded(np, np.arange(4.0), ((2, 3),), "reflect")
    array([2., 1., 0., 1., 2., 3., 2., 1., 0.])
    """
    torch_like = hasattr(array, "index_select")
    if mode == "zeros":
        if torch_like:
            import torch

            return torch.nn.functional.pad(array, [w for pair in reversed(pads) for w in pair])
        return xp.pad(array, pads)
    folded = [fold(np.arange(-before, length + after), length, mode)
              for length, (before, after) in zip(array.shape, pads)]
    if xp.__name__.startswith("dask"):
        for axis, ((before, after), taken) in enumerate(zip(pads, folded)):
            if before or after:
                array = xp.take(array, taken, axis=axis)
        return array
    mesh = np.ix_(*folded)
    if torch_like:
        import torch

        return array[tuple(torch.as_tensor(positions, device=array.device) for positions in mesh)]
    return array[mesh if xp is np else tuple(xp.asarray(positions) for positions in mesh)]


def is_identity(spec: WindowSpec, source_shape: tuple[int, ...]) -> bool:
    """Whether the window is the array itself (plain positions in order, whole axes): no step needed."""
    shape, pads, positions, *_ = spec
    return pads is None and shape == tuple(source_shape) and all(
        position == ("affine", ((axis, 1),), 0) for axis, position in enumerate(positions))


def _strided(spec: WindowSpec) -> bool:
    return all(position[0] == "affine" for position in spec[2])


def _kind(values: Any) -> str:
    kind = getattr(getattr(values, "dtype", None), "kind", None)
    return kind if kind is not None else np.dtype(str(values.dtype).replace("torch.", "")).kind


def _check_integers(values: Any, name: str, axis: int) -> None:
    """A gather tensor holds integers: float positions are refused on every backend, as numpy refuses float
    indices (torch's ``.long()`` would truncate ``-0.5`` to row 0), a GatherIndexError naming the read."""
    if _kind(values) not in "iu":
        raise GatherIndexError(f"the gather into axis {axis} of '{name}' reads positions from an array of type "
                               f"{values.dtype}; gather tensors hold integers (round and cast them first)")


def _signed(values: Any) -> Any:
    """64-bit unsigned positions as signed ones (checked inside the axis first): numpy and jax promote uint64
    with int64 to float64, which cannot index."""
    if _kind(values) == "u" and values.dtype.itemsize == 8:
        return values.astype(np.int64)
    return values


def _check_gather(values: Any, name: str, axis: int, length: int) -> None:
    """A gather's positions lie inside the axis (no wrap, no clamp): GatherIndexError naming where."""
    _check_integers(values, name, axis)
    try:
        if hasattr(values, "cpu"):  # torch
            flat = values.cpu().numpy().reshape(-1)
        elif type(values).__module__.startswith("cupy"):
            flat = values.get().reshape(-1)
        else:
            flat = np.asarray(values).reshape(-1)
    except Exception:  # noqa: BLE001 - a traced (jax) or lazy (dask) array: checked where it becomes concrete
        return
    bad = np.flatnonzero((flat < 0) | (flat >= length))
    if bad.size:
        where = np.unravel_index(int(bad[0]), np.shape(values))
        raise GatherIndexError(f"gather into axis {axis} of '{name}' (length {length}) reads position "
                               f"{int(flat[bad[0]])} at index {tuple(int(w) for w in where)} of its position "
                               f"tensor; positions must lie in [0, {length})")


def _permuted(values: Any, order: tuple[int, ...]) -> Any:
    if order == tuple(range(len(order))):
        return values
    return values.permute(order) if hasattr(values, "permute") else values.transpose(order)


def _distinct_axes(values: Any, axes: tuple[int, ...]) -> tuple[Any, tuple[int, ...]]:
    """A gather tensor that repeats an index (``x[i,i]``) read on its diagonal: the values with one axis per
    distinct index, and those indices' label axes.

    >>> values, axes = _distinct_axes(np.arange(9).reshape(3, 3), (0, 0))
    >>> values, axes
    (array([0, 4, 8]), (0,))
    """
    axes = tuple(axes)
    while len(set(axes)) < len(axes):
        first = next(a for a in range(len(axes)) if axes[a] in axes[a + 1:])
        second = axes.index(axes[first], first + 1)
        values = values.diagonal(0, first, second)  # (numpy, cupy, torch, jax, dask: the diagonal goes last)
        axes = tuple(label for a, label in enumerate(axes) if a not in (first, second)) + (axes[first],)
    return values, axes


def _runtime(xp: Any) -> dict[str, Any]:
    """The runtime helpers (``einflow.engine.runtime``: the exported code's own) bound for the array module ``xp``."""
    return bound_helpers(next((dialect for dialect in (TORCH, JAX) if dialect.module == xp.__name__), NUMPY), xp)


def _prepared(positions: tuple[Any, ...], gathers: tuple[Any, ...], name: str) -> tuple[tuple[Any, ...], list[Any]]:
    """The positions and gathers as the runtime helpers read them: each gather checked inside its axis (a
    GatherIndexError naming the read), signed, with one axis per distinct index (``("gather", k, label axes)``)."""
    planned: list[Any] = []
    values = list(gathers)
    for axis, position in enumerate(positions):
        if position[0] == "gather":
            _, k, axes, length = position
            _check_gather(values[k], name, axis, length)
            values[k], axes = _distinct_axes(_signed(values[k]), axes)
            position = ("gather", k, axes)
        planned.append(position)
    return tuple(planned), values


def _flat_positions(xp: Any, spec: WindowSpec, padded_shape: tuple[int, ...], gathers: tuple[Any, ...],
                    like: Any = None) -> Any:
    """Flat positions into the (padded, C-ordered) array for every element of the window, broadcast: the
    runtime's ``flat`` (the exported code's), on the device of ``like``."""
    shape, _, positions, name, _ = spec
    planned, values = _prepared(positions, gathers, name)
    return _runtime(xp)["flat"](tuple(padded_shape), shape, planned, values, like)


def take_labels(spec: WindowSpec, source_shape: tuple[int, ...]) -> tuple[int, list[int]] | None:
    """For a window gathering along one axis and reading the others whole (``A[t[z], r]``, a sparse operand's
    gather): that axis and the window label of each axis ``take`` gives; None for any other window."""
    shape, pads, positions, _, _ = spec
    gathered = [axis for axis, position in enumerate(positions) if position[0] != "affine"]
    if pads is not None or len(gathered) != 1 or len(source_shape) != len(positions):
        return None
    axis = gathered[0]
    labels: list[int] = []
    for other, position in enumerate(positions):
        if other == axis:
            labels.extend(position[2])
            continue
        _, terms, offset = position
        if offset or len(terms) != 1 or terms[0][1] != 1 or shape[terms[0][0]] != source_shape[other]:
            return None
        labels.append(terms[0][0])
    return (axis, labels) if sorted(labels) == list(range(len(shape))) else None


def _take_rows(xp: Any, array: Any, spec: WindowSpec, gathers: tuple[Any, ...]) -> Any:
    """The window as one ``take`` of whole rows (no flat positions per element), or None (see _take_labels)."""
    found = take_labels(spec, tuple(array.shape))
    if found is None:
        return None
    axis, labels = found
    _, k, _, length = spec[2][axis]
    values = gathers[k]
    _check_gather(values, spec[3], axis, length)
    taken = xp.take(array, _signed(values), axis=axis)
    return taken.transpose([labels.index(label) for label in range(len(labels))])


def window_numpy(array: Any, spec: WindowSpec, *gathers: Any) -> Any:
    """The window on numpy (or cupy): a strided view of ``array``, padded first where the reads leave it.

    >>> spec = window_spec(("i",), (3,), (4,), (("affine", ((0, 1),), -1),), ())
    >>> window_numpy(np.array([1.0, 2.0, 3.0, 4.0]), spec)
    array([0., 1., 2.])
    """
    xp = np if isinstance(array, np.ndarray) else _module_of(array)
    shape, pads, positions, _, mode = spec
    if pads is not None:
        array = padded(xp, array, pads, mode)
    else:
        taken = _take_rows(xp, array, spec, gathers)
        if taken is not None:
            return taken
    if not _strided(spec) or not hasattr(getattr(xp, "lib", None), "stride_tricks"):
        return xp.reshape(array, (-1,))[_flat_positions(xp, spec, tuple(array.shape), gathers)]
    return _runtime(xp)["strided_view"](array, shape, positions)


def window_generic(array: Any, spec: WindowSpec, *gathers: Any) -> Any:
    """The window on any numpy-like module without strided views (jax, dask): one take at flat positions."""
    xp = _module_of(array)
    shape, pads, _, _, mode = spec
    if pads is not None:
        array = padded(xp, array, pads, mode)
    if xp.__name__.startswith("dask"):  # dask indexes by one flat vector of positions computed with numpy
        gathers = tuple(np.asarray(g) for g in gathers)
        flat = np.broadcast_to(_flat_positions(np, spec, tuple(array.shape), gathers), shape).reshape(-1)
        return xp.reshape(xp.reshape(array, (-1,))[flat], shape)
    return xp.reshape(array, (-1,))[_flat_positions(xp, spec, tuple(array.shape), gathers)]


def window_torch(array: Any, spec: WindowSpec, *gathers: Any) -> Any:
    """The window on torch: ``as_strided`` when every stride is non-negative, else one take."""
    import torch

    shape, pads, positions, _, mode = spec
    if pads is not None:
        array = padded(torch, array, pads, mode)
    if _strided(spec):
        view = _runtime(torch)["strided_view"](array, shape, positions)
        if view is not None:
            return view
    for axis, position in enumerate(positions):
        if position[0] == "gather":
            _check_integers(gathers[position[1]], spec[3], axis)
    gathers = tuple(g.long() for g in gathers)
    rows = _row_gather(spec, tuple(array.shape))
    if rows is not None:  # an embedding lookup: whole rows taken (index_select), as torch's embedding does
        axis, order = rows
        _check_gather(gathers[0], spec[3], axis, array.shape[axis])
        return _permuted(array.index_select(axis, gathers[0].reshape(-1)), order)
    return array.reshape(-1)[_flat_positions(torch, spec, tuple(array.shape), gathers, array)]


def _row_gather(spec: WindowSpec, source_shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
    """(the gathered axis, the window's axes as source axes) when one gather of one index reads one axis and
    every other axis is read whole by one index of its own: rows taken whole."""
    shape, pads, positions, *_ = spec
    gathered = [axis for axis, position in enumerate(positions) if position[0] == "gather"]
    if pads is not None or len(gathered) != 1 or len(positions[gathered[0]][2]) != 1:
        return None
    labels = []
    for axis, position in enumerate(positions):
        if position[0] == "gather":
            labels.append(position[2][0])
        elif len(position[1]) == 1 and position[1][0][1] == 1 and position[2] == 0 and \
                shape[position[1][0][0]] == source_shape[axis]:
            labels.append(position[1][0][0])
        else:
            return None
    if sorted(labels) != list(range(len(shape))):
        return None
    return gathered[0], tuple(labels.index(label) for label in range(len(shape)))


def _module_of(array: Any) -> Any:
    module = type(array).__module__.split(".")[0]
    if module == "numpy":
        return np
    if module in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp
    if module == "dask":
        import dask.array as da

        return da
    if module == "cupy":
        import cupy

        return cupy
    return np


def window_kernel(backend: Any) -> Any:
    """The kernel a backend's generated code binds as its window helper, by the backend's capabilities: torch's
    own, strided views where the array module has them (numpy, cupy), one flat take elsewhere (jax, dask)."""
    own = _OWN_WINDOW.get(backend.dialect)
    if own is not None:
        return own
    return window_numpy if backend.strided_views else window_generic


# ---------------------------------------------------------------- scatter-adds (deltas of positions kept)
#: (output shape, value shape, positions, name): each position ``("plain", value axis)``,
#: ``("affine", ((value axis, coefficient), ...), offset)`` or ``("gather", k, value axes, axis length)``
ScatterSpec = tuple[tuple[int, ...], tuple[int, ...], tuple[Any, ...], str]


def scatter_spec(labels: tuple[str, ...], sizes: tuple[int, ...], arg_labels: tuple[str, ...],
                 arg_shape: tuple[int, ...], positions: tuple[ir.Position, ...], name: str,
                 modes: tuple[str, ...] = ()) -> ScatterSpec:
    """The scatter's plan for known sizes (an affine position folded by a mode other than ``zeros`` carries it:
    ``("affine", terms, offset, mode)``, and adds what lands outside onto the folded position)."""
    planned: list[Any] = []
    gather = 0
    for k, (position, size) in enumerate(zip(positions, sizes)):
        if isinstance(position, str):
            planned.append(("plain", arg_labels.index(position)))
        elif isinstance(position, ir.Affine):
            planned.append(("affine", tuple((arg_labels.index(i), c) for c, i in position.terms), position.offset))
            if modes and modes[k] != "zeros":
                if size == 0 and all(arg_shape):
                    raise ShapeError(f"a delta folded by pad {modes[k]} adds into an empty axis ({name})")
                planned[-1] = (*planned[-1], modes[k])
        else:
            planned.append(("gather", gather, tuple(arg_labels.index(i) for i in position.indices), size))
            gather += 1
    return tuple(sizes), tuple(arg_shape), tuple(planned), name


def _scatter_positions(xp: Any, spec: ScatterSpec, gathers: tuple[Any, ...], like: Any = None) -> tuple[Any, Any]:
    """Flat positions in the (C-ordered) output for every element of the value, and which land inside: the
    runtime's ``scatter_positions`` (the exported code's), on the device of ``like``."""
    out_shape, value_shape, positions, name = spec
    planned, values = _prepared(positions, gathers, name)
    return _runtime(xp)["scatter_positions"](tuple(value_shape), tuple(out_shape), planned, values, like)


def _slice_scatter(spec: ScatterSpec) -> tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]] | None:
    """For a scatter that writes each value axis along one output axis by one affine index (``delta[p, a+1]
    delta[q, 2*b]``: no two elements land on one position), the value's axes in the output's order and the
    slices of the value and of the output they fill; None for any other scatter.

    >>> _slice_scatter(((5,), (4,), (("affine", ((0, 2),), 1),), "x"))
    ((0,), (slice(0, 2, None),), (slice(1, 4, 2),))
    """
    out_shape, value_shape, positions, _ = spec
    order, taken, kept = [], [], []
    for axis, position in enumerate(positions):
        if position[0] == "plain":
            source, coefficient, offset = position[1], 1, 0
        elif position[0] == "affine" and len(position[1]) == 1 and position[1][0][1] != 0 and len(position) == 3:
            (source, coefficient), offset = position[1][0], position[2]
        else:
            return None
        length, count = out_shape[axis], value_shape[source]
        # the indices i with 0 <= offset + coefficient * i < length: one run [low, high)
        if coefficient > 0:
            low, high = max(0, -(offset // coefficient)), min(count, (length - 1 - offset) // coefficient + 1)
        else:
            step = -coefficient
            low, high = max(0, -((length - 1 - offset) // step)), min(count, offset // step + 1)
        high = max(high, low)
        start = offset + coefficient * low
        stop = offset + coefficient * (high - 1) + (1 if coefficient > 0 else -1)
        order.append(source)
        kept.append(slice(low, high))
        taken.append(slice(start, stop if stop >= 0 else None, coefficient) if high > low else slice(0, 0))
    if sorted(order) != list(range(len(value_shape))):
        return None
    return tuple(order), tuple(kept[order.index(k)] for k in range(len(order))), tuple(taken)


def scatter_numpy(value: Any, spec: ScatterSpec, *gathers: Any) -> Any:
    """The scatter-add on numpy: ``bincount`` with weights (float64), ``add.at`` for other types.

    >>> spec = scatter_spec(("p",), (4,), ("h", "r"), (3, 2), (ir.Affine(((1, "h"), (1, "r"))),), "x")
    >>> scatter_numpy(np.ones((3, 2)), spec)
    array([1., 2., 2., 1.])
    """
    xp = np if isinstance(value, np.ndarray) else _module_of(value)
    if xp.__name__.startswith("dask"):  # no scatter on dask arrays: computed here, handed back as one chunk
        import dask.array as da

        return da.from_array(scatter_numpy(np.asarray(value), spec, *(np.asarray(g) for g in gathers)))
    out_shape, value_shape, _, _ = spec
    sliced = _slice_scatter(spec)
    if sliced is not None:  # one strided copy into zeros: no two elements land on one position
        order, kept, taken = sliced
        out = xp.zeros(out_shape, dtype=value.dtype)
        out[taken] = value[kept].transpose(order)
        return out
    value, spec = _in_memory_order(value, spec)
    value_shape = spec[1]
    rows = _row_scatter(spec) if xp is np and len(gathers) == 1 and cacheable(gathers[0]) else None
    if rows is not None and len(spec[2][rows[0]]) == 4 and value.dtype.kind in "fc":  # a sparse input's coordinates
        return segment_sum(value, gathers[0], rows[1][rows[0]], rows[0], rows[1], out_shape)
    flat, inside = _scatter_positions(xp, spec, gathers)
    # (bincount copies a read-only broadcast view: one of the value's own shape is not made)
    if tuple(getattr(flat, "shape", ())) != tuple(value_shape) or not hasattr(flat, "reshape"):
        flat = xp.broadcast_to(flat, value_shape)
    flat = flat.reshape(-1)
    weights = value.reshape(-1)
    if inside is not None:
        keep = xp.broadcast_to(inside, value_shape).reshape(-1)
        flat, weights = flat[keep], weights[keep]
    total = math.prod(out_shape)
    if xp is np and value.dtype == np.float64 and flat.size:  # (bincount of nothing is int64 zeros)
        return np.bincount(flat, weights=weights, minlength=total).reshape(out_shape)
    out = xp.zeros(total, dtype=value.dtype)
    if xp.__name__ == "cupy":  # the accumulating kernel of cupy
        import cupyx

        cupyx.scatter_add(out, flat, weights)
    else:
        xp.add.at(out, flat, weights)
    return out.reshape(out_shape)


def _in_memory_order(value: Any, spec: ScatterSpec) -> tuple[Any, ScatterSpec]:
    """The value with its axes in the order its strides lay them out (a transposed array becomes contiguous, so
    flattening it copies nothing), and the spec reading its axes in that order."""
    strides = getattr(value, "strides", None)
    if strides is None or value.ndim < 2:
        return value, spec
    order = tuple(sorted(range(value.ndim), key=lambda axis: -abs(strides[axis])))
    if order == tuple(range(value.ndim)):
        return value, spec
    out_shape, value_shape, positions, name = spec
    moved: list[Any] = []
    for position in positions:
        if position[0] == "plain":
            moved.append(("plain", order.index(position[1])))
        elif position[0] == "affine":
            moved.append(("affine", tuple((order.index(axis), c) for axis, c in position[1]), *position[2:]))
        else:
            moved.append((position[0], position[1], tuple(order.index(axis) for axis in position[2]), position[3]))
    return value.transpose(order), (out_shape, tuple(value_shape[axis] for axis in order), tuple(moved), name)


def _row_scatter(spec: ScatterSpec) -> tuple[int, tuple[int, ...]] | None:
    """(the output axis, the value's axes in the output's order) when one gather of one index writes one axis
    and every other position is a whole plain axis (an embedding's gradient): rows added whole."""
    out_shape, value_shape, positions, _ = spec
    gathered = [axis for axis, position in enumerate(positions) if position[0] == "gather"]
    if len(gathered) != 1 or any(position[0] == "affine" for position in positions):
        return None
    order = tuple(position[2][0] if position[0] == "gather" else position[1] for position in positions)
    if len(positions[gathered[0]][2]) != 1 or sorted(order) != list(range(len(value_shape))) or any(
            position[0] == "plain" and value_shape[position[1]] != out_shape[axis]
            for axis, position in enumerate(positions)):
        return None
    return gathered[0], order


def scatter_torch(value: Any, spec: ScatterSpec, *gathers: Any) -> Any:
    """The scatter-add on torch: where one gather writes one axis, whole rows (torch's embedding backward when
    it is the first axis, else ``index_add_`` of rows); otherwise ``index_add_`` of single elements into a
    zeroed flat array."""
    import torch

    out_shape, value_shape, positions, name = spec
    for axis, position in enumerate(positions):
        if position[0] == "gather":
            _check_integers(gathers[position[1]], name, axis)
    rows = _row_scatter(spec)
    if rows is not None and value.dtype.is_floating_point:
        axis, order = rows
        _check_gather(gathers[0], name, axis, out_shape[axis])
        positions_ = gathers[0].long().reshape(-1)
        if axis == 0:  # torch's embedding backward: the rows summed by position (sorted, in parallel)
            flat = _permuted(value, order).reshape(positions_.shape[0], -1)
            return torch.ops.aten.embedding_dense_backward(flat, positions_, out_shape[0], -1, False).reshape(out_shape)
        out = torch.zeros(out_shape, dtype=value.dtype, device=value.device)
        return out.index_add_(axis, positions_, _permuted(value, order))
    flat, inside = _scatter_positions(torch, spec, tuple(g.long() for g in gathers), value)
    flat = torch.as_tensor(flat, device=value.device).broadcast_to(value_shape).reshape(-1)
    weights = value.reshape(-1)
    if inside is not None:
        keep = torch.as_tensor(inside, device=value.device).broadcast_to(value_shape).reshape(-1)
        flat, weights = flat[keep], weights[keep]
    out = torch.zeros(math.prod(out_shape), dtype=value.dtype, device=value.device)
    return out.index_add_(0, flat, weights).reshape(out_shape)


def scatter_jax(value: Any, spec: ScatterSpec, *gathers: Any) -> Any:
    """The scatter-add on jax: ``.at[...].add`` (positions outside are dropped)."""
    import jax.numpy as jnp

    out_shape, value_shape, _, _ = spec
    flat, inside = _scatter_positions(jnp, spec, gathers)
    flat = jnp.broadcast_to(flat, value_shape).reshape(-1)
    total = math.prod(out_shape)
    if inside is not None:
        flat = jnp.where(jnp.broadcast_to(inside, value_shape).reshape(-1), flat, total)
    out = jnp.zeros(total, dtype=value.dtype)
    return out.at[flat].add(value.reshape(-1), mode="drop").reshape(out_shape)


#: the kernels a dialect has its own of (the rest use numpy's API)
_OWN_WINDOW: dict[Dialect, Any] = {TORCH: window_torch}
_OWN_SCATTER: dict[Dialect, Any] = {TORCH: scatter_torch, JAX: scatter_jax}


def scatter_kernel(backend: Any) -> Any:
    """The kernel a backend's generated code binds as its scatter helper: by the dialect its code is written in
    (torch's index_add_, jax's .at[].add, numpy's add.at on numpy, cupy and dask)."""
    return _OWN_SCATTER.get(backend.dialect, scatter_numpy)


# ---------------------------------------------------------------- memory: what the kernels allocate
def is_view(spec: WindowSpec, backend: Any) -> bool:
    """Whether the window is a view of its array (no memory of its own): unpadded, strided, on a backend whose
    arrays have strided views (numpy, cupy)."""
    return spec[1] is None and _strided(spec) and backend.strided_views


def window_temporaries(spec: WindowSpec, source_shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes a window allocates besides its result: the zero-padded copy, and the flat positions of a take."""
    shape, pads, *_ = spec
    total = 0
    if take_labels(spec, source_shape) is not None:  # one take of whole rows: the result alone
        return 0
    if pads is not None:
        total += math.prod(n + before + after for n, (before, after) in zip(source_shape, pads)) * itemsize
    if not _strided(spec):
        total += math.prod(shape) * 8  # int64 positions, one per element of the window
    return total


def scatter_temporaries(spec: ScatterSpec, itemsize: int = 8, contiguous: bool = True) -> int:
    """Bytes a scatter-add allocates besides its result (numpy's kernel): none for a strided copy into zeros;
    otherwise int64 flat positions per element of the value, its flat copy when it is not ``contiguous``, and
    where positions may land outside, the mask and the positions and values kept (copies)."""
    if _slice_scatter(spec) is not None:
        return 0
    _, value_shape, positions, _ = spec
    elements = math.prod(value_shape)
    total = elements * (8 + (0 if contiguous else itemsize))
    if any(position[0] == "affine" for position in positions):  # the mask, the kept positions and values
        total += elements * (1 + 8 + itemsize)
    return total
