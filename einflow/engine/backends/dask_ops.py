"""The functions opt_einsum calls for contractions on dask arrays, with output chunks no coarser than
``dask.array.einsum`` makes them.

``dask.array.tensordot`` keeps its operands' chunks, so a pairwise step whose result is much larger than its
operands (an outer product, ``aijkl,amnop->ijklmnop``) makes output chunks as large as the product of the
kept axes' chunks: one 128 MiB task from two 1 MiB chunks. Here each step first cuts its operands' kept
axes the way ``dask.array.einsum`` does: when the largest output chunk would exceed the largest operand
chunk by more than dask's ``array.chunk-size-tolerance``, every operand's kept axes shrink by a share of
that factor (every kept axis split evenly, as dask splits them), so that no task's output outgrows the
chunks it reads. ``opt_einsum.contract_expression(...)(*arrays, backend="einflow.engine.backends.dask_ops")``.

The chunks a step is measured against are its operands' and, inside :func:`chunk_floor`, those of the whole
call's inputs: ``dask.array.einsum`` bounds one call by its largest input chunk, so a small intermediate of
a longer path (``bfc,dfe->bcde`` in ``abcde,bfc,dfe->acef``) is not cut into tasks smaller than the inputs
(dask's test_einsum_chunksizes, GH11627). Elementwise broadcasts of a program (an outer product ``x[i] y[j]``
is ``x[:, None] * y[None, :]``) are bounded the same way by :func:`broadcast_operands`.

>>> import dask.array as da
>>> a = da.ones((64, 8, 8, 8, 8), chunks=-1)
>>> tensordot(a, a, axes=([0], [0])).chunksize
(4, 4, 4, 4, 4, 4, 4, 4)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import dask
import dask.array as da

__all__ = ["tensordot", "transpose", "einsum", "bounded_chunks", "chunk_floor", "broadcast_operands"]

#: the largest input chunk (elements) of the call being built: no step is cut below it
_FLOOR: contextvars.ContextVar[int] = contextvars.ContextVar("einflow_dask_chunk_floor", default=1)


@contextlib.contextmanager
def chunk_floor(arrays: Iterable[Any]) -> Iterator[int]:
    """Within it, steps are measured against the largest chunk of ``arrays`` too (a call's dask inputs).

    >>> a = da.ones((4, 100), chunks=(4, 100))
    >>> with chunk_floor([a]) as floor:
    ...     floor
    400
    """
    floor = max((_largest(a.chunks) for a in arrays if isinstance(a, da.Array)), default=1)
    token = _FLOOR.set(max(floor, _FLOOR.get()))
    try:
        yield _FLOOR.get()
    finally:
        _FLOOR.reset(token)


def _largest(chunks: Sequence[tuple[int, ...]]) -> int:
    return math.prod(max(sizes, default=1) for sizes in chunks)


def _cut(chunks: tuple[tuple[int, ...], ...], axes: Sequence[int], target: float) -> tuple[tuple[int, ...], ...]:
    """``chunks`` with the chunks of ``axes`` split evenly (each axis by the same share of the factor) until the
    largest block holds at most ``target`` elements, as ``dask.array.einsum`` splits them."""
    tolerance = dask.config.get("array.chunk-size-tolerance", 1.25)
    new = list(chunks)
    for _ in range(64):
        factor = _largest(new) / max(target, 1)
        if factor <= 1:
            break
        changed = False
        for axis in axes:
            limit = max(new[axis], default=1) / factor ** (1 / len(axes))
            sizes: list[int] = []
            for size in new[axis]:
                parts = min(math.ceil(size / max(limit, 1e-9)), size) if size > tolerance * limit else 1
                sizes.extend(size // parts + (1 if k < size % parts else 0) for k in range(parts))
            changed |= tuple(sizes) != new[axis]
            new[axis] = tuple(sizes)
        if not changed:
            break
    return tuple(new)


def bounded_chunks(operands: Sequence[Any], kept: Sequence[Sequence[int]]) -> list[Any]:
    """``operands`` rechunked along their ``kept`` axes (those the result keeps) as ``dask.array.einsum`` would.

    >>> import dask.array as da
    >>> a = da.ones((4, 100), chunks=(4, 100))
    >>> [x.chunksize for x in bounded_chunks([a, a], [[1], [1]])]
    [(4, 20), (4, 20)]
    """
    output_axes = sum(len(axes) for axes in kept)
    if not output_axes:
        return list(operands)
    largest_input = max(_largest(operand.chunks) for operand in operands)
    if not largest_input:  # an empty operand: an empty result, nothing to bound
        return list(operands)
    largest_input = max(largest_input, _FLOOR.get())
    largest_output = math.prod(max(operand.chunks[k], default=1) for operand, axes in zip(operands, kept)
                               for k in axes)
    factor = largest_output / (largest_input * dask.config.get("array.chunk-size-tolerance", 1.25))
    if factor <= 1:
        return list(operands)
    result = []
    for operand, axes in zip(operands, kept):
        shrink = factor ** (len(axes) / output_axes)
        if not axes or shrink <= 1:
            result.append(operand)
            continue
        chunks = _cut(operand.chunks, axes, _largest(operand.chunks) / shrink)
        result.append(operand if chunks == operand.chunks else operand.rechunk(chunks))
    return result


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    """``dask.array.tensordot`` on operands whose kept axes are chunked for a bounded output chunk."""
    if isinstance(axes, int):
        summed_a, summed_b = list(range(a.ndim - axes, a.ndim)), list(range(axes))
    else:
        summed_a, summed_b = ([axes_k] if isinstance(axes_k, int) else list(axes_k) for axes_k in axes)
    kept_a = [k for k in range(a.ndim) if k not in summed_a]
    kept_b = [k for k in range(b.ndim) if k not in summed_b]
    a, b = bounded_chunks([a, b], [kept_a, kept_b])
    return da.tensordot(a, b, axes=(summed_a, summed_b))


def transpose(a: Any, axes: Any = None) -> Any:
    return da.transpose(a, axes)


def einsum(subscripts: Any, *operands: Any, **kwargs: Any) -> Any:
    """``dask.array.einsum`` (it bounds its output chunks itself), with each operand's repeated index (a trace or
    a diagonal, ``aa->``) chunked alike on all its axes: dask's einsum refuses to collapse axes whose chunks
    differ (``dimensions in operand 0 for collapsing index 'a' don't match (2 != 3)``).

    >>> import dask.array as da, numpy as np
    >>> float(einsum("aa->", da.from_array(np.eye(3), chunks=((2, 1), (3,)))).compute())
    3.0
    """
    if isinstance(subscripts, str):
        operands = tuple(_diagonal_chunks(labels, operand)
                         for labels, operand in zip(subscripts.split("->")[0].split(","), operands))
    largest = max((_largest(operand.chunks) for operand in operands if isinstance(operand, da.Array)), default=1)
    floor = _FLOOR.get()
    if floor <= largest:
        return da.einsum(subscripts, *operands, **kwargs)
    # dask.array.einsum measures the output against its operands' largest chunk times the tolerance: the same
    # bound against the call's largest input chunk is that tolerance scaled by floor / largest
    tolerance = dask.config.get("array.chunk-size-tolerance", 1.25)
    with dask.config.set({"array.chunk-size-tolerance": tolerance * floor / largest}):
        return da.einsum(subscripts, *operands, **kwargs)


def broadcast_operands(operands: Sequence[Any], labels: Sequence[Sequence[Sequence[str]]],
                       output: Sequence[str]) -> tuple[Any, ...]:
    """The operands of an elementwise step, broadcast to the axes ``output``, rechunked so that no block of the
    result holds more than the largest operand chunk (or the call's, :func:`chunk_floor`) times
    ``array.chunk-size-tolerance``: every output axis's chunks shrink by the same share, as
    ``dask.array.einsum`` shrinks them, and an axis two operands share is chunked alike in both.

    ``labels[k]``: the ways operand k is read (its axes' labels each time; ``x[i] x[j]`` reads x as ``i`` and
    as ``j``, and each axis takes the smallest chunk its labels ask for). Other values pass unchanged.

    >>> x, y = da.ones(2**18, chunks=2**18), da.ones(64, chunks=64)
    >>> a, b = broadcast_operands([x, y], [["i"], ["j"]], "ij")
    >>> a.chunksize, b.chunksize
    ((36635,), (8,))
    """
    arrays = [(operand, reads) for operand, reads in zip(operands, labels) if isinstance(operand, da.Array)]
    if not arrays or not output:
        return tuple(operands)
    largest_input = max(max(_largest(operand.chunks) for operand, _ in arrays), _FLOOR.get())
    block: dict[str, int] = {}
    for operand, reads in arrays:
        for axes in reads:
            for axis, label in enumerate(axes):
                block[label] = max(block.get(label, 1), max(operand.chunks[axis], default=1))
    factor = math.prod(block.get(label, 1) for label in set(output)) / (
        largest_input * dask.config.get("array.chunk-size-tolerance", 1.25))
    if factor <= 1:
        return tuple(operands)
    cut = [label for label in output if block.get(label, 1) > 1]
    shrink = factor ** (1 / max(len(cut), 1))
    size = {label: max(1, math.floor(block[label] / shrink)) for label in cut}  # (floor: within the bound)
    result = []
    for operand, reads in zip(operands, labels):
        if not isinstance(operand, da.Array):
            result.append(operand)
            continue
        wanted: dict[int, int] = {}
        for axes in reads:
            for axis, label in enumerate(axes):
                if label in size and max(operand.chunks[axis], default=1) > size[label]:
                    wanted[axis] = min(wanted.get(axis, size[label]), size[label])
        result.append(operand.rechunk(wanted) if wanted else operand)
    return tuple(result)


def _diagonal_chunks(labels: str, operand: Any) -> Any:
    """``operand`` with every axis of a repeated label chunked as that label's first axis."""
    chunks = list(getattr(operand, "chunks", ()))
    if len(set(labels)) == len(labels) or len(chunks) != len(labels):
        return operand
    first: dict[str, Any] = {}
    for axis, label in enumerate(labels):
        chunks[axis] = first.setdefault(label, chunks[axis])
    return operand if tuple(chunks) == operand.chunks else operand.rechunk(tuple(chunks))
