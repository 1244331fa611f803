"""The Dask backend: the whole program becomes one chunked dask graph, run by dask's active scheduler."""

from __future__ import annotations

import concurrent.futures
import math
import operator
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import dask
import dask.array
import numpy

from einflow.engine.backends.base import Backend, refuse_masked
from einflow.engine.memory import format_bytes
from einflow.lang.errors import BackendError, MemoryLimitError

__all__ = ["DaskBackend"]




def _default_client() -> Any:
    """dask.distributed's default Client, or None (distributed is never imported here)."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        return distributed.get_client()
    except (ValueError, AttributeError, OSError):
        return None


def _cluster_lost(error: BaseException) -> bool:
    """Whether ``error`` says the cluster went away rather than that a task failed."""
    if isinstance(error, concurrent.futures.CancelledError):
        return True  # distributed's FutureCancelledError: the scheduler dropped the computation
    if type(error).__module__.startswith(("distributed", "tornado")):
        return True  # CommClosedError, StreamClosedError
    client = _default_client()
    return client is not None and getattr(client, "status", "running") != "running"


def _cluster_gone(error: BaseException) -> str:
    """What to tell a user whose computation the dask cluster dropped (scheduler gone, connection closed)."""
    client = _default_client()
    address = getattr(getattr(client, "scheduler", None), "address", None)
    scheduler = f" (scheduler {address})" if address else ""
    return (f"the dask cluster is gone{scheduler}: the computation was cancelled or its connection closed "
            f"({type(error).__name__}: {error}). Start the cluster again (or close the Client to compute with "
            "dask's local scheduler) and call again")


class _DiagonalWriter:
    """``view[...] = value`` makes ``out`` the array with ``value`` on its diagonals and 0 elsewhere.

    ``groups[k]`` are the axes of ``out`` that axis k of ``value`` runs along together. Off-diagonal
    entries are selected as 0 (``where``), never computed as ``value * 0``, so inf and nan in ``value``
    stay where numpy's strided write puts them.
    """

    def __init__(self, out: Any, shape: tuple[int, ...], groups: list[tuple[int, ...]]) -> None:
        self.out, self.shape, self.groups = out, shape, groups

    def __setitem__(self, key: Any, value: Any) -> None:
        out, groups = self.out, self.groups
        value = dask.array.broadcast_to(dask.array.asarray(value, dtype=out.dtype), self.shape)
        # value's axis k goes to out's axis groups[k][0]; the other axes of its group are new (size 1)
        order = sorted(range(len(groups)), key=lambda k: groups[k][0])
        placed = value.transpose(order) if order != list(range(len(groups))) else value
        leading = sorted(group[0] for group in groups)
        expanded = placed.reshape(tuple(out.shape[axis] if axis in leading else 1 for axis in range(out.ndim)))
        def positions(axis: int) -> Any:  # 0, 1, 2, ... along ``axis`` of out, size 1 on the others
            return dask.array.arange(out.shape[axis]).reshape(tuple(-1 if a == axis else 1 for a in range(out.ndim)))

        mask = None
        for group in groups:
            for axis in group[1:]:
                same = positions(group[0]) == positions(axis)
                mask = same if mask is None else mask & same
        written = dask.array.where(mask, expanded, dask.array.zeros((), dtype=out.dtype)) if mask is not None \
            else dask.array.broadcast_to(expanded, out.shape)
        written = dask.array.broadcast_to(written, out.shape).astype(out.dtype, copy=False)
        out.dask, out._name, out._chunks, out._meta = written.dask, written.name, written.chunks, written._meta


def _slice_task(kernel: Any, dtype: str, cast: str | None, *blocks: Any) -> Any:
    """One slice of a sliced contraction, on a worker: the kernel on the operand blocks, in the result's dtype."""
    if cast is not None:
        blocks = tuple(block.astype(cast) if hasattr(block, "astype") else block for block in blocks)
    return numpy.asarray(kernel(*blocks), dtype=dtype)


def _identity(value: Any) -> Any:
    return value


class DaskBackend(Backend):
    """Arrays are ``dask.array.Array``; opt_einsum's plan calls ``dask.array.tensordot``/``einsum``.

    numpy inputs are chunked (``chunks``, default ``"auto"``: dask's ``array.chunk-size``). If any input
    is already a dask array the result stays lazy; otherwise it is computed with dask's active scheduler
    (a ``dask.distributed`` Client when one exists) and returned as numpy.

    >>> import numpy as np
    >>> backend = DaskBackend()
    >>> backend.asarray(np.ones((4, 6)), chunks=2).chunks
    ((2, 2), (2, 2, 2))
    """

    name = "dask"
    slices = True
    lazy = True
    einsum_backend = "einflow.engine.backends.dask_ops"
    # a dask array has no strides: surviving deltas are "written" by zeros() and diagonal_view() below,
    # which select (``where``) rather than multiply by an identity, so inf and nan stay on the diagonal
    strided_writes = True
    settings = {"chunks": "chunk spec for numpy inputs: 'auto', an int, a tuple, or {tensor name: spec}"}

    def __init__(self, chunks: Any = "auto") -> None:
        self.chunks = chunks

    @property
    def xp(self) -> Any:
        return dask.array

    def chunk_floor(self, values: Any) -> Any:
        """A context in which the program's steps are bounded by its inputs' largest chunk (dask_ops)."""
        from einflow.engine.backends.dask_ops import chunk_floor

        return chunk_floor(values)

    def chunks_for(self, tensor: str, chunks: Any = None) -> Any:
        """The chunk spec for input ``tensor``: ``chunks`` (or the backend's setting), per tensor if a name map.

        >>> DaskBackend().chunks_for("A", {"A": 100})
        100
        """
        spec = self.chunks if chunks is None else chunks
        if isinstance(spec, Mapping) and spec and all(isinstance(key, str) for key in spec):
            return spec.get(tensor, "auto")
        return spec

    def asarray(self, value: Any, chunks: Any = None) -> Any:
        refuse_masked(value)
        if isinstance(value, dask.array.Array):
            if any(isinstance(size, float) and math.isnan(size) for size in value.shape):
                raise BackendError(f"a dask array input has unknown shape {value.shape}; call "
                                   ".compute_chunk_sizes() on it first")
            return self.numbers(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if not hasattr(value, "dtype") or not hasattr(value, "shape"):
            value = numpy.asarray(value)
        if numpy.dtype(value.dtype).kind not in "biufc":
            # chunking "auto" cannot size object arrays: say what einflow says on every backend
            raise BackendError(f"an input has dtype {value.dtype}; einflow computes with numbers "
                               "(bool, int, float or complex arrays)")
        spec = self.chunks_for("", chunks)
        try:
            # name=False: a random graph key instead of hashing the whole array's bytes
            chunked = dask.array.from_array(value, chunks=spec, name=False)
        except (ValueError, TypeError, ArithmeticError, NotImplementedError) as error:
            raise BackendError(f"cannot chunk an array of shape {tuple(value.shape)} with chunks={spec!r}: "
                               f"{error or type(error).__name__}") from None
        if any(size == 0 for sizes in chunked.chunks for size in sizes) and chunked.size:
            raise BackendError(f"cannot chunk an array of shape {tuple(value.shape)} with chunks={spec!r}: "
                               "chunks must be positive")
        return self.numbers(chunked)

    def result(self, value: Any, inputs_native: bool) -> Any:
        return self.results((value,), inputs_native)[0]

    def results(self, values: tuple[Any, ...], inputs_native: bool) -> tuple[Any, ...]:
        if inputs_native:
            return values
        # one compute call: shared sub-results of all outputs are computed once
        try:
            computed = dask.compute(*values)
        except (concurrent.futures.CancelledError, OSError, TimeoutError) as error:
            if not _cluster_lost(error):
                raise  # an error of the computation itself (a task reading a missing file, say)
            raise BackendError(_cluster_gone(error)) from error
        return tuple(numpy.asarray(value) for value in computed)

    def check_client_memory(self, names: tuple[str | None, ...], outputs: tuple[Any, ...],
                            memory_limit: float | None) -> None:
        """Refuse, before computing, results that would not fit on the client (dask gathers them there)."""
        if memory_limit is None:
            return
        for position, value in enumerate(outputs):
            needed = int(getattr(value, "nbytes", 0))
            if needed > memory_limit:
                name = names[position] if position < len(names) and names[position] else f"result {position}"
                raise MemoryLimitError(
                    f"the result {name!r} of shape {tuple(value.shape)} needs {format_bytes(needed)}, over the memory "
                    f"limit of {format_bytes(memory_limit)}, and backend='dask' with numpy inputs gathers results on "
                    "the client; nothing was computed. Pass dask arrays (dask.array.from_array) to get a lazy "
                    "result and store it chunk by chunk (e.g. to_zarr), reduce it in the program, or raise "
                    "memory_limit=")

    def sliced_contraction(self, table: list[tuple[Any, Any, Any]], operands: tuple[Any, ...],
                           shape: tuple[int, ...], dtype: str, accumulates: bool, cast: str | None) -> Any:
        """A contraction sliced to fit the memory limit, one task per slice (``einflow.engine.fitting``).

        ``table`` lists each slice as (its block of the output, each operand's block, the numpy kernel that
        contracts the blocks). Each operand is rechunked to the slices' blocks, so a slice's task reads one
        chunk of each operand and nothing more; slices of the same output block are added up pairwise (a
        tree of tasks), and the output's chunks are its blocks.
        """
        from dask.highlevelgraph import HighLevelGraph

        token = uuid.uuid4().hex
        arrays: list[Any] = []
        starts: list[list[list[int]]] = []
        for position, operand in enumerate(operands):
            if not isinstance(operand, dask.array.Array):
                arrays.append(None)
                starts.append([])
                continue
            axes = [sorted({(index[position][axis].start or 0, index[position][axis].stop or size)
                            for _, index, _ in table}) for axis, size in enumerate(operand.shape)]
            arrays.append(operand.rechunk(tuple(tuple(stop - start for start, stop in ranges) for ranges in axes)))
            starts.append([[start for start, _ in ranges] for ranges in axes])
        out_ranges = [sorted({(at[axis].start or 0, at[axis].stop or size) for at, _, _ in table})
                      for axis, size in enumerate(shape)]
        out_starts = [[start for start, _ in ranges] for ranges in out_ranges]
        slices_name, name = f"einflow-slice-{token}", f"einflow-sliced-{token}"
        graph: dict[Any, Any] = {}
        parts: dict[tuple[int, ...], list[Any]] = {}
        for number, (at, index, kernel) in enumerate(table):
            args: list[Any] = []
            for position, operand in enumerate(operands):
                array = arrays[position]
                if array is None:
                    args.append(operand)
                    continue
                args.append((array.name, *(starts[position][axis].index(part.start or 0)
                                            for axis, part in enumerate(index[position]))))
            graph[(slices_name, number)] = (_slice_task, kernel, dtype, cast, *args)
            block = tuple(out_starts[axis].index(part.start or 0) for axis, part in enumerate(at))
            parts.setdefault(block, []).append((slices_name, number))
        level = 0
        for block, found in parts.items():
            while len(found) > 1:  # a balanced tree of additions: each task holds two blocks of the output
                level += 1
                paired = []
                for k in range(0, len(found), 2):
                    if k + 1 == len(found):
                        paired.append(found[k])
                        continue
                    key = (f"einflow-sum-{token}", level, k)
                    graph[key] = (operator.add, found[k], found[k + 1])
                    paired.append(key)
                found = paired
            graph[(name, *block)] = (_identity, found[0])
        layers = HighLevelGraph.from_collections(name, graph, dependencies=[a for a in arrays if a is not None])
        chunks = tuple(tuple(stop - start for start, stop in ranges) for ranges in out_ranges)
        return dask.array.Array(layers, name, chunks, dtype=numpy.dtype(dtype))

    def eye(self, size: int, dtype: Any) -> Any:
        return dask.array.eye(size, dtype=dtype)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """Zeros whose ``strides`` name axes (axis k has stride 2**k), for ``diagonal_view`` to decode."""
        out = dask.array.zeros(shape, dtype=dtype)
        out.strides = tuple(1 << axis for axis in range(len(shape)))
        return out

    def diagonal_view(self, out: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        """A writer for ``out`` (from ``zeros``): ``view[...] = value`` puts value on the diagonals.

        A stride that sums several axes' strides (a delta's partner axes) makes those axes one diagonal.
        """
        groups = [tuple(axis for axis in range(out.ndim) if stride >> axis & 1) for stride in strides]
        return _DiagonalWriter(out, shape, groups)
