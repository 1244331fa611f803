"""Window contractions as native convolutions, on backends whose capability says they have them
(``Backend.native_convolution``: torch's ``torch.convolution`` and its weight gradient).

A product that reads one operand through a shifted or strided window, ``y[n,o,h,w] = x[n,c,2*h+r,2*w+s] K[o,c,r,s]``,
is a convolution: contracted as an einsum over the window it copies an im2col matrix of the window's size
(9x the input for a 3x3 kernel) before the matrix product, while a convolution kernel never forms it. So
where the shapes fit the pattern, the planner hands the whole contraction to one call:

- **forward**: the window's source is the convolution's input, the other operand its weight;
- **weight**: the same read where the other operand's spatial extent is the larger (a kernel's gradient,
  ``dL_dK[a,b,d,e] = x[n,b,h+d,w+e] dL_dy[n,a,h,w]``): the weight gradient of a convolution;
- **transpose**: a contraction kept whole and scattered through positions (``delta[u, 2*h + r]``: the gradient
  by ``x`` of a strided convolution) is a transposed convolution.

The roles come from where each index appears (the window, the other operand, the result); an axis of the
window's source reads either one index (sliced) or ``stride*i + dilation*j + offset`` with ``i`` in the result
and ``j`` in the other operand (a negative ``dilation`` flips the other operand along that axis). Anything else
is left to the einsum. Specs are plain tuples, written into the generated code as literals.

>>> spec = window_convolution(("n", "c", "h", "r"), ((2, 3, 4, 3), None, (("affine", ((0, 1),), 0),
...     ("affine", ((1, 1),), 0), ("affine", ((2, 1), (3, 1)), 0)), "x", "zeros"), (2, 3, 6), ("o", "c", "r"),
...     ("n", "o", "h"), (2, 5, 4))
>>> spec[0], spec[-1]
('forward', (0, 1, 2))
"""

from __future__ import annotations

import math
from typing import Any

from einflow.engine.steps import step_inputs

__all__ = [
    "ConvSpec",
    "window_convolution",
    "scatter_convolution",
    "convolve_torch",
    "convolve_numpy",
    "convolution_kernel",
    "numpy_convolution_bytes",
    "numpy_convolves",
    "winograd_3x3",
    "winograd_3x3_weight",
    "sole_reader",
]

#: (form, input order, input groups, input slices, pads, other order, other groups, flips, stride, dilation,
#:  result sizes, result permutation); ``form`` is forward, weight or transpose; a transpose's has which operand
#:  is its input last, a forward or weight one read through a ``pad`` mode other than zeros that mode
#:  (``circular``, ``reflect``, ``replicate``: torch's padding_mode, padding the input before the call)
ConvSpec = tuple[Any, ...]


def _prod(sizes: list[int]) -> int:
    return math.prod(sizes) if sizes else 1


def window_convolution(
    labels: tuple[str, ...],
    spec: Any,
    source_shape: tuple[int, ...],
    other: tuple[str, ...],
    output: tuple[str, ...],
    output_shape: tuple[int, ...],
) -> ConvSpec | None:
    """The convolution computing ``einsum(window, other -> output)`` (window ``labels``, ``spec`` a
    :data:`~einflow.engine.affine.WindowSpec`, other operand's labels ``other``, the result's shape
    ``output_shape``), or None where it is not one."""
    shape, pads, positions, _, mode = spec
    if (
        any(position[0] != "affine" for position in positions)
        or not all(shape)
        or len({*labels}) != len(labels)
        or len({*other}) != len(other)
        or len({*output}) != len(output)
    ):
        return None
    window, others, result = set(labels), set(other), set(output)
    if window & others & result or others - window - result or window - others - result or result - window - others:
        return None
    size = {**dict(zip(output, output_shape)), **dict(zip(labels, shape))}
    plain: list[tuple[int, str, int]] = []  # (source axis, index, first position)
    spatial: list[tuple[int, str, int, str, int, int]] = []  # (axis, result index, stride, other's, dilation, low)
    seen: list[str] = []
    for axis, (_, terms, offset) in enumerate(positions):
        low = offset - (pads[axis][0] if pads else 0)
        names = [labels[label] for label, _ in terms]
        seen += names
        if len(terms) == 1 and terms[0][1] == 1 and names[0] not in (others & result):
            plain.append((axis, names[0], low))
        elif len(terms) == 2:
            (first, a), (second, b) = ((names[0], terms[0][1]), (names[1], terms[1][1]))
            if first in others and second in result:
                (first, a), (second, b) = (second, b), (first, a)
            if not (first in result and first not in others and second in others and second not in result):
                return None
            if a <= 0 or b == 0:
                return None
            spatial.append((axis, first, a, second, b, low))
        else:
            return None
    if len(set(seen)) != len(seen) or not 1 <= len(spatial) <= 3:
        return None
    slices: list[tuple[int, int]] = [(0, n) for n in source_shape]
    for axis, name, low in plain:
        if low < 0 or low + size[name] > source_shape[axis]:
            return None  # (a padded plain axis: left to the einsum)
        slices[axis] = (low, low + size[name])
    kept = [name for _, name, _ in plain if name in result]  # the input's batch-like axes
    summed = [name for _, name, _ in plain if name in others]  # contracted with the other operand
    fresh = [name for name in other if name in result and name not in window]  # the other's own result axes
    axis_pads, flips, strides, dilations = [], [], [], []
    for axis, name, stride, kernel, dilation, low in spatial:
        n, k, length = size[name], size[kernel], source_shape[axis]
        if dilation < 0:
            flips.append(other.index(kernel))
            dilation = -dilation
            low -= dilation * (k - 1)
        high = low + stride * (n - 1) + dilation * (k - 1)
        start, end = max(0, low), min(length, high + 1)
        if start >= end:
            return None
        if high < length - 1 and (length - start + max(0, -low) - dilation * (k - 1) - 1) // stride + 1 == n:
            end = length  # the whole axis gives the same positions: no slice, no copy of a strided view
        slices[axis] = (start, end)
        axis_pads.append((max(0, -low), max(0, high - (length - 1))))
        strides.append(stride)
        dilations.append(dilation)
    spatial_axes = [axis for axis, *_ in spatial]
    plain_axes = {name: axis for axis, name, _ in plain}
    out_spatial = [name for _, name, *_ in spatial]
    kernels = [kernel for _, _, _, kernel, _, _ in spatial]
    out_sizes = [size[name] for name in out_spatial]
    kernel_sizes = [size[name] for name in kernels]
    if _prod(kernel_sizes) <= _prod(out_sizes):  # forward: (kept, summed, *spatial) * (fresh, summed, *kernel)
        order = (*(plain_axes[name] for name in kept + summed), *spatial_axes)
        groups = (len(kept), len(summed))
        other_order = tuple(other.index(name) for name in fresh + summed + kernels)
        result_labels = kept + fresh + out_spatial
        form, stride_, dilation_ = "forward", strides, dilations
    else:  # weight gradient: input (summed, kept, *spatial), grad_output (summed, fresh, *kernel)
        order = (*(plain_axes[name] for name in summed + kept), *spatial_axes)
        groups = (len(summed), len(kept))
        other_order = tuple(other.index(name) for name in summed + fresh + kernels)
        result_labels = fresh + kept + out_spatial
        form, stride_, dilation_ = "weight", dilations, strides
    other_groups = (len(fresh) if form == "forward" else len(summed), len(summed) if form == "forward" else len(fresh))
    result_sizes = tuple(size[name] for name in result_labels)
    permutation = tuple(result_labels.index(name) for name in output)
    found = (
        form,
        order,
        groups,
        tuple(slices),
        tuple(axis_pads),
        other_order,
        other_groups,
        tuple(flips),
        tuple(stride_),
        tuple(dilation_),
        result_sizes,
        permutation,
    )
    if mode == "zeros":
        return found
    # a folded boundary (``pad reflect x``): torch's own padding_mode, where its limits allow it (reflect pads
    # less than the axis, circular at most the axis) and the padded axes are read whole (folding needs both ends)
    for (axis, *_), pair in zip(spatial, axis_pads):
        length = source_shape[axis]
        if pair != (0, 0) and (
            slices[axis] != (0, length) or max(pair) > length or mode == "reflect" and max(pair) >= length
        ):
            return None
    return (*found, mode)


def scatter_convolution(
    operands: tuple[tuple[str, ...], ...], shapes: tuple[tuple[int, ...], ...], value: tuple[str, ...], spec: Any
) -> ConvSpec | None:
    """The transposed convolution computing the scatter-add ``spec`` (a :data:`~einflow.engine.affine.ScatterSpec`)
    of ``einsum(operands -> value)``, or None where it is not one."""
    out_shape, _, positions, _ = spec
    if len(operands) != 2 or any(len({*labels}) != len(labels) for labels in (*operands, value)):
        return None
    a, b = (set(labels) for labels in operands)
    result = set(value)
    if a & b & result or (a | b) - result - (a & b) or result - a - b or not all(out_shape):
        return None
    size = {name: n for labels, shape in zip(operands, shapes) for name, n in zip(labels, shape)}
    plain: list[tuple[int, str]] = []
    spatial: list[tuple[int, tuple[tuple[str, int], ...], int]] = []
    seen: list[str] = []
    for axis, position in enumerate(positions):
        if position[0] == "plain":
            name = value[position[1]]
            if size[name] != out_shape[axis]:
                return None
            plain.append((axis, name))
            seen.append(name)
        elif position[0] == "affine" and len(position[1]) == 2 and len(position) == 3:  # (4: a folded one)
            terms = tuple((value[v], c) for v, c in position[1])
            spatial.append((axis, terms, position[2]))
            seen += [name for name, _ in terms]
        else:
            return None
    if sorted(seen) != sorted(value) or not 1 <= len(spatial) <= 3:
        return None
    # the input is the operand with the larger spatial extent; its spatial indices carry the stride
    extent = [
        _prod([size[name] for _, terms, _ in spatial for name, _ in terms if name in labels]) for labels in operands
    ]
    first = 0 if extent[0] >= extent[1] else 1
    grad, weight = operands[first], operands[1 - first]
    summed = [name for name in grad if name in weight]
    batch = [name for _, name in plain if name in grad]
    channels = [name for _, name in plain if name in weight]
    ins, kernels, flips, strides, dilations, out_pads, native = [], [], [], [], [], [], []
    for axis, terms, offset in spatial:
        (i, stride), (j, dilation) = terms
        if i in weight:
            (i, stride), (j, dilation) = (j, dilation), (i, stride)
        if i not in grad or j not in weight or stride <= 0 or dilation == 0:
            return None
        ni, nj, length = size[i], size[j], out_shape[axis]
        if dilation < 0:
            flips.append(weight.index(j))
            dilation = -dilation
            offset -= dilation * (nj - 1)
        full = stride * (ni - 1) + dilation * (nj - 1) + 1
        crop = max(0, -offset)  # torch's padding crops both ends; output_padding adds at the end (< stride)
        extra = length - (full - 2 * crop)
        if offset <= 0 and 0 <= extra < max(stride, dilation):
            native.append((crop, extra))
            out_pads.append((0, 0))
        else:
            native.append((0, 0))
            out_pads.append((offset, length - offset - full))
        ins.append(i)
        kernels.append(j)
        strides.append(stride)
        dilations.append(dilation)
    order = tuple(grad.index(name) for name in batch + summed + ins)
    other_order = tuple(weight.index(name) for name in summed + channels + kernels)
    out_axes = (
        [axis for axis, _ in plain if value[positions[axis][1]] in grad]
        + [axis for axis, _ in plain if value[positions[axis][1]] in weight]
        + [axis for axis, _, _ in spatial]
    )
    result_sizes = tuple(out_shape[axis] for axis in out_axes)
    permutation = tuple(out_axes.index(axis) for axis in range(len(out_shape)))
    return (
        "transpose",
        order,
        (len(batch), len(summed)),
        tuple(native),
        tuple(out_pads),
        other_order,
        (len(summed), len(channels)),
        tuple(flips),
        tuple(strides),
        tuple(dilations),
        result_sizes,
        permutation,
        first,
    )


def _grouped(array: Any, order: tuple[int, ...], groups: tuple[int, int]) -> Any:
    """``array`` with its axes in ``order``, the first two groups of axes each flattened into one."""
    array = array.permute(order)
    shape = tuple(array.shape)
    first, second = groups
    return array.reshape(
        _prod(list(shape[:first])), _prod(list(shape[first : first + second])), *shape[first + second :]
    )


def convolve_torch(x: Any, other: Any, spec: ConvSpec, dtype: str) -> Any:
    """The convolution ``spec`` of ``x`` (a window's source, or a transposed convolution's input) with ``other``,
    in numpy's type ``dtype`` of the two (computed by the einsum over the window when not float32/float64)."""
    import torch

    F = torch.nn.functional
    kind = getattr(torch, dtype)
    x, other = x.to(kind), other.to(kind)
    form, order, groups, slices, pads, other_order, other_groups, flips, stride, dilation, sizes, permutation = spec[
        :12
    ]
    if form == "transpose" and spec[12] == 1:
        x, other = other, x
    if flips:
        other = other.flip(flips)
    weight = _grouped(other, other_order, other_groups).contiguous()
    if form == "transpose":
        source = _grouped(x, order, groups)
        padding = [crop for crop, _ in slices]
        extra = [add for _, add in slices]
        out = torch.convolution(source, weight, None, list(stride), padding, list(dilation), True, extra, 1)
        if any(pair != (0, 0) for pair in pads):
            out = F.pad(out, [w for pair in reversed(pads) for w in pair])
    else:
        x = x[tuple(slice(start, end) for start, end in slices)]
        mode = spec[12] if len(spec) > 12 else "zeros"
        symmetric = [left if left == right and mode == "zeros" else 0 for left, right in pads]
        explicit = [(0, 0) if left == right and mode == "zeros" else (left, right) for left, right in pads]
        source = _grouped(x, order, groups)
        if any(pair != (0, 0) for pair in explicit):
            source = F.pad(
                source, [w for pair in reversed(explicit) for w in pair], mode="constant" if mode == "zeros" else mode
            )
        if form == "forward":
            out = torch.convolution(
                source, weight, None, list(stride), symmetric, list(dilation), False, [0] * len(stride), 1
            )
        else:
            shape = (weight.shape[1], source.shape[1], *sizes[-len(stride) :])
            # torch infers the output's length from the input's: where the stride does not tile the input (its
            # last positions are read by no output), those positions go, so that it agrees with the gradient's
            needed = [
                (out - 1) * step + spread * (kernel - 1) + 1 - 2 * pad
                for out, step, spread, kernel, pad in zip(weight.shape[2:], stride, dilation, shape[2:], symmetric)
            ]
            if any(length > need for length, need in zip(source.shape[2:], needed)):
                crop = [slice(None), slice(None)] + [
                    slice(0, min(length, need)) for length, need in zip(source.shape[2:], needed)
                ]
                source = source[tuple(crop)]
            out = torch.ops.aten.convolution_backward(
                weight,
                source,
                source.new_empty(shape),
                None,
                list(stride),
                symmetric,
                list(dilation),
                False,
                [0] * len(stride),
                1,
                [False, True, False],
            )[1]
    out = out.reshape(sizes)
    return out.permute(permutation)


def sole_reader(steps: tuple[Any, ...], register: int, outputs: tuple[int, ...]) -> Any:
    """The one step that reads ``register`` (once), or None when it is a result or read elsewhere too."""
    if register in outputs:
        return None
    readers = _readers(steps).get(register, [])
    return readers[0] if len(readers) == 1 else None


#: the steps last indexed and, per register, the steps reading it (once per read): planning asks for each window
#: and scatter, and a scan of every step each time made a program of n shifted statements n^2 work
_INDEXED: tuple[tuple[Any, ...], dict[int, list[Any]]] = ((), {})


def _readers(steps: tuple[Any, ...]) -> dict[int, list[Any]]:
    global _INDEXED
    indexed = _INDEXED
    if indexed[0] is steps:
        return indexed[1]
    readers: dict[int, list[Any]] = {}
    for step in steps:
        for register in step_inputs(step):
            readers.setdefault(register, []).append(step)
    _INDEXED = (steps, readers)
    return readers


def numpy_convolves(spec: ConvSpec, other_shape: tuple[int, ...] | None = None) -> bool:
    """Whether numpy's kernel pays for ``spec`` over the einsum on the window (``other_shape``: the shape of the
    operand that is not the window): a transposed convolution (it saves the scatter), and a unit-stride 3x3
    forward convolution over two spatial axes with at least 8 channels in and out (Winograd's F(2x2, 3x3),
    :func:`winograd_3x3`: 2.25x fewer multiplications than the im2col GEMM). Other forward convolutions and
    kernel gradients stay einsums: an im2col copy and one BLAS product with the whole kernel as its inner
    dimension measured faster on numpy (docs/benchmarks.md, 2026-12-02, branch conv3) than a kernel of one
    product per kernel offset on shifted channels-last rows."""
    if spec[0] == "transpose":
        return True
    return other_shape is not None and _winograd_shape(spec, other_shape) is not None


def _winograd_shape(spec: ConvSpec, other_shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """``(out channels, in channels, output rows, output columns)`` of a forward convolution that Winograd's
    F(2x2, 3x3) computes, else None."""
    if spec[0] not in ("forward", "weight") or len(spec) != 12 or tuple(spec[8]) != (1, 1) or tuple(spec[9]) != (1, 1):
        return None
    weight = [other_shape[axis] for axis in spec[5]]
    first, second = spec[6]
    if spec[0] == "forward":  # other: the kernel (out, in, 3, 3)
        if weight[first + second :] != [3, 3]:
            return None
        outs, ins = _prod(weight[:first]), _prod(weight[first : first + second])
        rows, columns = spec[10][-2:]
    else:  # other: the output's gradient (batch, out, rows, columns); the result the kernel's (out, in, 3, 3)
        if len(weight) != first + second + 2 or tuple(spec[10][-2:]) != (3, 3):
            return None
        outs = _prod(weight[first : first + second])
        ins = _prod(list(spec[10][:-2])) // max(outs, 1)
        rows, columns = weight[-2:]
    if outs < 8 or ins < 8 or rows < 2 or columns < 2:
        return None
    return outs, ins, rows, columns


#: about how many bytes of transformed tiles one pass of :func:`winograd_3x3` (and of :func:`winograd_3x3_weight`,
#: whose products sum over the tiles and gain from more of them) works on: a block of images, or of one image's tile
#: rows, whose transforms and products run while their buffers are still in cache (docs/benchmarks.md, 2026-12-08)
_BLOCK_BYTES = {"forward": 512 << 10, "weight": 4 << 20}


def _blocks(
    form: str, batch: int, tiles_h: int, tiles_w: int, channels: int, itemsize: int
) -> list[tuple[int, int, int, int]]:
    """``(first image, last image + 1, first tile row, last tile row + 1)`` of each block of a Winograd pass
    (``form``: forward or weight) over ``batch`` images of ``tiles_h`` x ``tiles_w`` tiles, 16 values a channel each."""
    rows = max(1, _BLOCK_BYTES[form] // (16 * tiles_w * channels * itemsize))
    if rows < tiles_h:
        return [(n, n + 1, t, min(tiles_h, t + rows)) for n in range(batch) for t in range(0, tiles_h, rows)]
    images = max(1, rows // tiles_h)
    return [(n, min(batch, n + images), 0, tiles_h) for n in range(0, batch, images)]


def _winograd_bytes(spec: ConvSpec, x_shape: tuple[int, ...], other_shape: tuple[int, ...], itemsize: int) -> int:
    """The temporaries :func:`winograd_3x3` (or :func:`winograd_3x3_weight`) holds at once for ``spec`` (its result
    aside): the transformed kernels and one block's phases, transformed tiles and products."""
    found = _winograd_shape(spec, other_shape)
    assert found is not None
    outs, ins, rows, columns = found
    batch = _prod([x_shape[axis] for axis in spec[1][: spec[2][0]]])
    tiles_h, tiles_w = -(-rows // 2), -(-columns // 2)
    n0, n1, t0, t1 = _blocks(spec[0], batch, tiles_h, tiles_w, max(ins, outs), itemsize)[0]
    tiles = (n1 - n0) * (t1 - t0 + 1) * (tiles_w + 1)
    return (16 * outs * ins + 44 * tiles * max(ins, outs)) * itemsize


def _span(first: int, length: int, count: int) -> tuple[int, int, int]:
    """The positions ``t`` in ``[lo, hi)`` (``0 <= t < count``) whose row ``2 t + first`` is one of ``length``, and
    the first such row: ``(lo, hi, 2 lo + first)``."""
    lo = max(0, (1 - first) // 2)
    hi = max(lo, min(count, (length - first + 1) // 2))
    return lo, hi, 2 * lo + first


def _phases(x: Any, top: int, left: int, count_h: int, count_w: int) -> Any:
    """``x`` (N, C, H, W) split by the parity of its rows and columns, channels last: ``P[p, q, n, t, u, c] =
    x[n, c, 2 t + p - top, 2 u + q - left]`` (zero outside ``x``), a (2, 2, N, count_h, count_w, C) array. A 4x4
    tile at rows and columns ``2 t + k`` reads ``P[k % 2, l % 2, :, t + k // 2, u + l // 2]``: contiguous runs, no
    stride 2."""
    import numpy as np

    N, C, H, W = x.shape
    P = np.empty((2, 2, N, count_h, count_w, C), dtype=x.dtype)
    for p in range(2):
        t0, t1, row = _span(p - top, H, count_h)
        for q in range(2):
            u0, u1, column = _span(q - left, W, count_w)
            block = P[p, q]
            if (t0, t1, u0, u1) != (0, count_h, 0, count_w):
                block[...] = 0
            if t1 > t0 and u1 > u0:
                block[:, t0:t1, u0:u1] = x[
                    :, :, row : row + 2 * (t1 - t0) - 1 : 2, column : column + 2 * (u1 - u0) - 1 : 2
                ].transpose(0, 2, 3, 1)
    return P


def _input_tiles(P: Any, tiles_h: int, tiles_w: int) -> Any:
    """Winograd's F(2x2, 3x3) input transform B^T d B of every 4x4 tile d of the phases ``P`` (:func:`_phases`), as a
    (4, 4, N, tiles_h, tiles_w, C) array: along the rows (both column parities at once), then the columns."""
    import numpy as np

    N, C = P.shape[2], P.shape[5]
    R = np.empty((4, 2, N, tiles_h, tiles_w + 1, C), dtype=P.dtype)
    a, b = P[:, :, :, :tiles_h], P[:, :, :, 1 : tiles_h + 1]  # rows 2t + k: a[k % 2] for k < 2, b[k % 2] after
    np.subtract(a[0], b[0], out=R[0])
    np.add(a[1], b[0], out=R[1])
    np.subtract(b[0], a[1], out=R[2])
    np.subtract(a[1], b[1], out=R[3])
    V = np.empty((4, 4, N, tiles_h, tiles_w, C), dtype=P.dtype)
    a, b = R[..., :tiles_w, :], R[..., 1 : tiles_w + 1, :]
    np.subtract(a[:, 0], b[:, 0], out=V[:, 0])
    np.add(a[:, 1], b[:, 0], out=V[:, 1])
    np.subtract(b[:, 0], a[:, 1], out=V[:, 2])
    np.subtract(a[:, 1], b[:, 1], out=V[:, 3])
    return V


def _kernel_tiles(weight: Any) -> Any:
    """The kernels' transform G g G^T of ``weight`` (O, C, 3, 3), as a (16, C, O) array."""
    import numpy as np

    O, C = weight.shape[:2]
    g = weight.transpose(2, 3, 1, 0)  # (3, 3, C, O)
    U = np.empty((4, 4, C, O), dtype=weight.dtype)
    for a, row in enumerate((g[0], (g[0] + g[1] + g[2]) * 0.5, (g[0] - g[1] + g[2]) * 0.5, g[2])):
        U[a, 0] = row[0]
        np.multiply(row[0] + row[1] + row[2], 0.5, out=U[a, 1])
        np.multiply(row[0] - row[1] + row[2], 0.5, out=U[a, 2])
        U[a, 3] = row[2]
    return U.reshape(16, C, O)


def winograd_3x3_weight(x: Any, grad: Any, pads: tuple[tuple[int, int], ...]) -> Any:
    """The gradient (O, C, 3, 3) of ``sum(grad * winograd_3x3(x, kernel, pads, ...))`` by the kernel, ``grad``
    (N, O, rows, columns): the adjoint of the forward's F(2x2, 3x3) map, G^T (sum over the tiles of
    (A dY A^T) * (B^T d B)) G, with its 16 matrix products over the tiles (the same multiplications as the forward),
    block by block (:func:`_blocks`)."""
    import numpy as np

    N, O, rows, columns = grad.shape
    C = x.shape[1]
    tiles_h, tiles_w = -(-rows // 2), -(-columns // 2)
    Z = np.zeros((4, 4, O, C), dtype=grad.dtype)
    for n0, n1, t0, t1 in _blocks("weight", N, tiles_h, tiles_w, max(C, O), grad.dtype.itemsize):
        V = _input_tiles(_phases(x[n0:n1], pads[0][0] - 2 * t0, pads[1][0], t1 - t0 + 1, tiles_w + 1), t1 - t0, tiles_w)
        G = _phases(grad[n0:n1], -2 * t0, 0, t1 - t0, tiles_w)  # the 2x2 output tiles dY, by parity
        # A dY A^T, A = [[1, 0], [1, 1], [1, -1], [0, -1]]: its rows and columns 1 and 2 are sums and differences,
        # 0 and 3 the tile's own rows and columns (3's sign applied to Z below)
        R = np.empty((2, 2, *G.shape[2:]), dtype=grad.dtype)
        np.add(G[0], G[1], out=R[0])
        np.subtract(G[0], G[1], out=R[1])
        rows_ = (G[0], R[0], R[1], G[1])
        S = np.empty((4, 2, *G.shape[2:]), dtype=grad.dtype)
        for a, row in enumerate(rows_):
            np.add(row[0], row[1], out=S[a, 0])
            np.subtract(row[0], row[1], out=S[a, 1])
        for a, row in enumerate(rows_):
            for b, tile in enumerate((row[0], S[a, 0], S[a, 1], row[1])):
                Z[a, b] += np.matmul(tile.reshape(-1, O).T, V[a, b].reshape(-1, C))
        del V, G, R, S
    Z[3] *= -1
    Z[:, 3] *= -1
    half = 0.5 * (Z[1] + Z[2])
    Q = (Z[0] + half, 0.5 * (Z[1] - Z[2]), half + Z[3])  # G^T Z along the rows: (3, 4, O, C)
    out = np.empty((O, C, 3, 3), dtype=grad.dtype)
    for i, q in enumerate(Q):
        half = 0.5 * (q[1] + q[2])
        out[:, :, i, 0] = q[0] + half
        out[:, :, i, 1] = 0.5 * (q[1] - q[2])
        out[:, :, i, 2] = half + q[3]
    return out


def winograd_3x3(x: Any, weight: Any, pads: tuple[tuple[int, int], ...], rows: int, columns: int) -> Any:
    """The correlation of ``x`` (N, C, H, W) with ``weight`` (O, C, 3, 3), ``x`` zero-padded by ``pads`` (before,
    after) on its last two axes, as an (N, O, rows, columns) array, by Winograd's minimal filtering F(2x2, 3x3):
    each 4x4 input tile and each 3x3 kernel transformed (B^T d B, G g G^T), 16 matrix products (tiles x C) @ (C x O)
    (one per tile position), each 2x2 output tile transformed back (A^T m A): 16 multiplications per output tile
    instead of 36, the transforms additions and halvings (float32 error: tests/test_convolution_numpy.py). The work
    goes block by block (:func:`_blocks`) on channels-last tiles, each pass over contiguous runs; the result is a
    view of a channels-last (N, rows, columns, O) array."""
    import numpy as np

    N, C = x.shape[:2]
    O = weight.shape[0]
    tiles_h, tiles_w = -(-rows // 2), -(-columns // 2)
    U = _kernel_tiles(weight)
    out = np.empty((N, tiles_h, 2, tiles_w, 2, O), dtype=x.dtype)
    view = out.transpose(2, 4, 0, 1, 3, 5)  # (row parity, column parity, N, tile row, tile column, O)
    for n0, n1, t0, t1 in _blocks("forward", N, tiles_h, tiles_w, max(C, O), x.dtype.itemsize):
        V = _input_tiles(_phases(x[n0:n1], pads[0][0] - 2 * t0, pads[1][0], t1 - t0 + 1, tiles_w + 1), t1 - t0, tiles_w)
        M = np.matmul(V.reshape(16, -1, C), U).reshape(4, 4, n1 - n0, t1 - t0, tiles_w, O)
        del V
        # A^T m A, A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]: along the rows in place, then the columns into the output
        np.add(M[0], M[1], out=M[0])
        np.add(M[0], M[2], out=M[0])
        np.subtract(M[1], M[2], out=M[1])
        np.subtract(M[1], M[3], out=M[1])
        S, target = M[:2], view[:, :, n0:n1, t0:t1]
        np.add(S[:, 0], S[:, 1], out=S[:, 0])
        np.add(S[:, 0], S[:, 2], out=target[:, 0])
        np.subtract(S[:, 1], S[:, 2], out=S[:, 1])
        np.subtract(S[:, 1], S[:, 3], out=target[:, 1])
        del M
    return out.reshape(N, 2 * tiles_h, 2 * tiles_w, O)[:, :rows, :columns].transpose(0, 3, 1, 2)


def numpy_convolution_bytes(
    spec: ConvSpec, x_shape: tuple[int, ...], other_shape: tuple[int, ...], itemsize: int
) -> int:
    """The temporaries :func:`convolve_numpy` holds at once for the convolution ``spec`` (its result aside), in
    bytes: a transposed convolution's two copies of its input, its output before the crop and one offset's
    product; a forward one's Winograd buffers (:func:`winograd_3x3`)."""
    if spec[0] != "transpose":
        return _winograd_bytes(spec, x_shape, other_shape, itemsize)
    _, order, _, _, _, other_order, other_groups, _, stride, dilation = spec[:10]
    if spec[12] == 1:
        x_shape, other_shape = other_shape, x_shape
    elements = _prod(list(x_shape))
    inputs = [x_shape[axis] for axis in order[len(order) - len(stride) :]]
    weight = [other_shape[axis] for axis in other_order]
    kernel = weight[sum(other_groups) :]
    outs = _prod(weight[other_groups[0] : sum(other_groups)])
    batch = elements // (_prod(inputs) * _prod(weight[: other_groups[0]]))
    full = _prod([s * (n - 1) + d * (k - 1) + 1 for s, n, d, k in zip(stride, inputs, dilation, kernel)])
    return max(2 * elements, elements + outs * batch * (full + _prod(inputs))) * itemsize


def convolve_numpy(x: Any, other: Any, spec: ConvSpec, dtype: str) -> Any:
    """A transposed convolution (``spec``'s form ``transpose``) on numpy without its scatter: one matrix product per
    kernel offset, added into a strided view of the output (a kernel of 3x3 is 9 products of the input's size);
    a unit-stride 3x3 forward convolution by :func:`winograd_3x3`."""
    import numpy as np

    x, other = np.asarray(x, dtype=dtype), np.asarray(other, dtype=dtype)
    if spec[0] == "forward":
        _, order, groups, slices, pads, other_order, other_groups, flips, _, _, sizes, permutation = spec
        x = x[tuple(slice(start, end) for start, end in slices)].transpose(order)
        shape = x.shape
        source = x.reshape(_prod(list(shape[: groups[0]])), _prod(list(shape[groups[0] : sum(groups)])), *shape[-2:])
        if flips:
            other = np.flip(other, flips)
        weight = other.transpose(other_order)
        kernel = weight.shape
        weight = weight.reshape(
            _prod(list(kernel[: other_groups[0]])), _prod(list(kernel[other_groups[0] : sum(other_groups)])), 3, 3
        )
        result = winograd_3x3(source, weight, pads, *sizes[-2:])
        return result.reshape(sizes).transpose(permutation)
    if spec[0] == "weight":  # x: the window's source (batch, in, ...), other: the output's gradient (batch, out, ...)
        _, order, groups, slices, pads, other_order, other_groups, _, _, _, sizes, permutation = spec
        x = x[tuple(slice(start, end) for start, end in slices)].transpose(order)
        shape = x.shape
        source = x.reshape(_prod(list(shape[: groups[0]])), _prod(list(shape[groups[0] : sum(groups)])), *shape[-2:])
        grad = other.transpose(other_order)
        shape = grad.shape
        grad = grad.reshape(
            _prod(list(shape[: other_groups[0]])), _prod(list(shape[other_groups[0] : sum(other_groups)])), *shape[-2:]
        )
        return winograd_3x3_weight(source, grad, pads).reshape(sizes).transpose(permutation)
    _, order, groups, native, pads, other_order, other_groups, flips, stride, dilation, sizes, permutation, first = spec
    if first == 1:
        x, other = other, x
    if flips:
        other = np.flip(other, flips)
    source = np.ascontiguousarray(x.transpose(order))
    shape = source.shape
    inputs = shape[len(order) - len(stride) :]
    source = source.reshape(_prod(list(shape[: groups[0]])), _prod(list(shape[groups[0] : groups[0] + groups[1]])), -1)
    weight = other.transpose(other_order)
    kernel = weight.shape[other_groups[0] + other_groups[1] :]
    weight = weight.reshape(source.shape[1], -1, *kernel)
    full = [s * (n - 1) + d * (k - 1) + 1 for s, n, d, k in zip(stride, inputs, dilation, kernel)]
    batch = source.shape[0]
    source = np.ascontiguousarray(source.transpose(1, 0, 2)).reshape(source.shape[1], -1)  # (Cin, N * positions)
    out = np.zeros((weight.shape[1], batch, *full), dtype=dtype)  # (Cout, N, ...): each product lands whole
    for offset in np.ndindex(*kernel):
        matrix = np.ascontiguousarray(weight[(slice(None), slice(None)) + tuple(offset)].T)  # (Cout, Cin): BLAS
        product = (matrix @ source).reshape(weight.shape[1], batch, *inputs)
        view = tuple(slice(d * k, d * k + s * (n - 1) + 1, s) for d, k, s, n in zip(dilation, offset, stride, inputs))
        out[(slice(None), slice(None)) + view] += product
    out = out.transpose(1, 0, *range(2, out.ndim))
    result = np.zeros(out.shape[:2] + tuple(sizes[-len(stride) :]), dtype=dtype)
    starts = [-crop if pair == (0, 0) else pair[0] for (crop, _), pair in zip(native, pads)]
    inside = tuple(
        slice(max(0, start), min(length, start + f)) for start, length, f in zip(starts, sizes[-len(stride) :], full)
    )
    taken = tuple(
        slice(max(0, -start), max(0, -start) + (piece.stop - piece.start)) for start, piece in zip(starts, inside)
    )
    result[(slice(None), slice(None)) + inside] = out[(slice(None), slice(None)) + taken]
    return result.reshape(sizes).transpose(permutation)


def convolution_kernel(backend: Any) -> Any:
    """The kernel a backend's generated code binds for its convolutions: torch's native ones where the backend
    has them, the transposed convolution by matrix products on numpy arrays in this process, else None."""
    if backend.native_convolution:
        return convolve_torch
    return convolve_numpy if backend.numpy_native else None
