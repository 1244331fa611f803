"""Large fused elementwise steps evaluated block by block: ufuncs writing into small reused buffers, on threads.

Written as one numpy expression, ``tanh(A) exp(B) + sigmoid(A)`` makes a fresh array per operation and
streams each through main memory again. Here the step becomes a *kernel*: a function of one block of rows
of its operands that calls numpy's ufuncs with ``out=`` into buffers of the block's size (they stay in
cache), the last call writing into the block of the result. :func:`run_blocks` calls the kernel on
successive blocks, on several threads when the arrays are large (ufuncs release the GIL).

Every element goes through the same ufuncs, in the same order and in the same dtype, as in the
one-expression form (``einflow.engine.codegen``), so both give identical numbers. Each function's block form is
the ``block`` column of its row in ``einflow.lang.functions``.

>>> import numpy as np
>>> from einflow.engine.steps import Add, Apply, Arg, Mul
>>> kernel = render_kernel("_k", Add((Mul((Apply("tanh", Arg(0)), Apply("exp", Arg(1)))), Apply("sigmoid", Arg(0)))),
...                        "_np", repr, repr)
>>> print(kernel.text)
def _k(a0, a1, out, t0, t1, t2):
    _np.tanh(a0, out=t0)
    _np.exp(a1, out=t1)
    _np.multiply(t0, t1, out=t0)
    _np.absolute(a0, out=t2)
    _np.negative(t2, out=t2)
    _np.exp(t2, out=t2)
    _np.greater_equal(a0, 0, out=t1)
    _np.maximum(t2, t1, out=t1)
    _np.add(t2, 1, out=t2)
    _np.divide(t1, t2, out=t1)
    _np.add(t0, t1, out=out)
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from einflow.engine.rows import is_divisor, negation_of, positive_first
from einflow.engine.steps import Add, Apply, Arg, Mul, Node, Number, Pow, Size
from einflow.lang.functions import FUNCTION_RULES

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["Kernel", "render_kernel", "run_blocks", "block_rows", "threads_for", "BLOCK_BYTES", "THREAD_ELEMENTS"]

#: bytes of one buffer (one block of one intermediate): a block's operands and buffers stay in the 1-2 MB
#: of cache per core (measured flat between 0.5 and 2 MB per buffer at 2000x2000, slower at 4 MB and 64 KB)
BLOCK_BYTES = 1 << 20
#: results with at least this many elements are computed on several threads (handing blocks to a worker
#: costs ~50 us; one block of these sizes costs ~0.5 ms and more)
THREAD_ELEMENTS = 1 << 18


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


#: the threads that compute one step (``EINFLOW_THREADS`` overrides: 1 computes on the calling thread only)
THREADS = max(1, int(os.environ.get("EINFLOW_THREADS", "0")) or _usable_cpus())

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
#: per thread, the byte buffers of earlier calls (fresh memory costs a page fault per 4 KiB on every call:
#: 0.7 ms for two 300x300 float64 buffers here, ten times the kernel's own work)
_KEPT = threading.local()
#: buffers larger than this (a single row over the block size) are not kept between calls
_KEEP_BYTES = 4 * BLOCK_BYTES


@dataclass(frozen=True)
class Kernel:
    """A rendered kernel: its source (``def name(a0, ..., out, t0, ...)``), operands and buffer count."""

    text: str
    #: the operands in parameter order (``a0``, ``a1``, ...)
    operands: tuple[Arg, ...]
    buffers: int


class _Writer:
    """Writes one ufunc call per operation, reusing buffers as soon as their value has been read."""

    def __init__(self, np_alias: str, number: Callable[[int | float], str], size: Callable[[Any], str]) -> None:
        self.np = np_alias
        self.number = number
        self.size = size
        self.lines: list[str] = []
        self.operands: dict[Arg, str] = {}
        self.free: list[str] = []
        self.count = 0

    def buffer(self) -> str:
        if self.free:
            return self.free.pop()
        self.count += 1
        return f"t{self.count - 1}"

    def release(self, *names: str) -> None:
        for name in names:
            if name.startswith("t") and name not in self.free:
                self.free.append(name)

    def target(self, out: str | None, *reads: str) -> str:
        """Where an operation reading ``reads`` writes: ``out``, else a buffer it reads (in place), else a new one."""
        if out is not None:
            return out
        return next((name for name in reads if name.startswith("t")), None) or self.buffer()

    def call(self, function: str, reads: Sequence[str], out: str | None) -> str:
        written = self.target(out, *reads)
        self.lines.append(f"{self.np}.{function}({', '.join(reads)}, out={written})")
        self.release(*(name for name in reads if name != written))
        return written

    def value(self, node: Node, out: str | None = None) -> str:
        """The name (or literal) holding ``node``'s value for the block; ``out``: where it must be written (the
        node's row of ``_VALUES``; a node without one has no block form)."""
        write = _VALUES.get(type(node))
        if write is None:
            raise _Unsupported  # AsFloat: deltas alone (booleans), never large fused work
        return write(self, node, out)

    def arg(self, node: Arg, out: str | None) -> str:
        name = self.operands.setdefault(node, f"a{len(self.operands)}")
        return name if out is None else self.call("positive", [name], out)

    def literal(self, node: Number | Size, out: str | None) -> str:
        if isinstance(node, Number) and (isinstance(node.value, bool)
                                         or isinstance(node.value, int) and abs(node.value) >= 2**53):
            raise _Unsupported
        literal = self.number(node.value) if isinstance(node, Number) else self.size(node.ref)
        return literal if out is None else self.call("add", [literal, "0"], out)

    def apply(self, node: Apply, out: str | None) -> str:
        if node.other is not None:
            if node.func not in ("maximum", "minimum"):
                raise _Unsupported
            first = self.value(node.arg)
            return self.call(node.func, [first, self.value(node.other)], out)
        lines = FUNCTION_RULES[node.func].block
        if lines is None:
            raise _Unsupported
        x = self.value(node.arg)
        written = self.target(out, x)
        temporary = self.buffer() if any("{t}" in line for line in lines) else ""
        self.lines.extend(line.format(np=self.np, x=x, out=written, t=temporary) for line in lines)
        self.release(*(name for name in (x, temporary) if name and name != written))
        return written

    def power(self, node: Pow, out: str | None) -> str:
        base = self.value(node.base)
        exponent = node.exponent
        if exponent == 2:
            return self.call("square", [base], out)
        if exponent == -1:
            return self.call("reciprocal", [base], out)
        if exponent == 0.5:
            return self.call("sqrt", [base], out)
        if isinstance(exponent, bool):
            raise _Unsupported
        return self.call("power", [base, self.number(exponent)], out)

    def add(self, node: Add, out: str | None) -> str:
        parts: list[tuple[str, Node]] = []
        for position, term in enumerate(positive_first(node.terms)):
            negated = negation_of(term) if position else None
            parts.append(("subtract", negated) if negated is not None else ("add", term))
        return self.fold(parts, out)

    def multiply(self, node: Mul, out: str | None) -> str:
        parts = [("multiply", factor) for factor in node.factors if not is_divisor(factor)]
        if parts:  # division is division, as in the one-expression form
            parts += [("divide", factor.base) for factor in node.factors if is_divisor(factor)]  # type: ignore
            return self.fold(parts, out)
        return self.fold([("multiply", factor) for factor in node.factors], out)

    def fold(self, parts: list[tuple[str, Node]], out: str | None) -> str:
        """``((p0 op1 p1) op2 p2) ...``, left to right as Python evaluates the one-expression form."""
        total = self.value(parts[0][1])
        for position, (operation, part) in enumerate(parts[1:], start=2):
            other = self.value(part)
            total = self.call(operation, [total, other], out if position == len(parts) else None)
        return total


#: one row per node kind with a block form: how the writer computes it
_VALUES: dict[type, Callable[[_Writer, Any, str | None], str]] = {
    Arg: _Writer.arg, Number: _Writer.literal, Size: _Writer.literal, Apply: _Writer.apply, Pow: _Writer.power,
    Add: _Writer.add, Mul: _Writer.multiply,
}


class _Unsupported(Exception):
    """An operation without a block form (the step is then computed as one expression)."""


def render_kernel(name: str, node: Node, np_alias: str, number: Callable[[int | float], str],
                  size: Callable[[Any], str]) -> Kernel | None:
    """The kernel computing ``node`` for one block (``def name(a0, ..., out, t0, ...)``), or None when some
    operation has no block form. ``number`` and ``size`` render literals as the one-expression form does."""
    writer = _Writer(np_alias, number, size)
    try:
        result = writer.value(node, "out")
    except _Unsupported:
        return None
    assert result == "out"
    parameters = [*writer.operands.values(), "out", *(f"t{k}" for k in range(writer.count))]
    body = "\n".join("    " + line for line in writer.lines)
    return Kernel(f"def {name}({', '.join(parameters)}):\n{body}", tuple(writer.operands), writer.count)


def block_rows(shape: tuple[int, ...], itemsize: int) -> int:
    """Rows (along the first axis) of one block: about :data:`BLOCK_BYTES` per buffer, at least one row."""
    row = itemsize
    for size in shape[1:]:
        row *= size
    return max(1, min(shape[0], BLOCK_BYTES // max(row, 1)))


def threads_for(shape: tuple[int, ...], rows: int) -> int:
    """How many threads compute a result of ``shape`` in blocks of ``rows`` rows."""
    elements = 1
    for size in shape:
        elements *= size
    if elements < THREAD_ELEMENTS:
        return 1
    return max(1, min(THREADS, -(-shape[0] // rows)))


def _buffers(count: int, shape: tuple[int, ...], dtype: str) -> list[Any]:
    """``count`` scratch arrays of ``shape`` for this thread, reusing the memory of earlier calls."""
    nbytes = np.dtype(dtype).itemsize
    for size in shape:
        nbytes *= size
    if nbytes > _KEEP_BYTES:
        return [np.empty(shape, dtype) for _ in range(count)]
    kept: list[Any] = getattr(_KEPT, "buffers", [])
    for position in range(count):
        if position == len(kept):
            kept.append(np.empty(nbytes, np.uint8))
        elif kept[position].nbytes < nbytes:
            kept[position] = np.empty(nbytes, np.uint8)
    _KEPT.buffers = kept
    return [raw[:nbytes].view(dtype).reshape(shape) for raw in kept[:count]]


def _pool() -> ThreadPoolExecutor:
    global _POOL
    from concurrent.futures import ThreadPoolExecutor  # imported when first needed (~10 ms)

    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max(1, THREADS - 1), thread_name_prefix="einflow-blocks")
        return _POOL


def _forget_pool() -> None:
    """In a forked child the pool's threads do not exist: start a new pool when one is needed."""
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def run_blocks(kernel: Callable[..., Any], operands: Sequence[Any], sliced: Sequence[bool], shape: tuple[int, ...],
               dtype: str, rows: int, buffers: int) -> Any:
    """The result of ``shape`` and ``dtype``, computed by ``kernel`` block by block (``rows`` rows each).

    Operands whose ``sliced`` flag is set are cut along their first axis with the result; the others
    (broadcast along it, 0-d values) are passed whole. Each thread has its own buffers and takes the next
    block not yet taken; numpy's error state (``np.errstate``) of the caller holds on every thread.
    """
    out = np.empty(shape, dtype)
    threads = threads_for(shape, rows)
    # what the threads share; emptied when the call is done, so that a pool thread that has not yet
    # dropped its task keeps no operand alive (the caller may free one right after this call)
    job: list[Any] = [kernel, operands, sliced, out, rows, buffers, itertools.count()]
    if threads == 1:
        _work(job)
        return out
    futures: list[Future[None]] = [_pool().submit(_help, job, np.geterr()) for _ in range(threads - 1)]
    try:
        _work(job)
    finally:  # helpers not started yet (the pool busy with another call's blocks) have nothing left to do
        errors = [None if future.cancel() else future.exception() for future in futures]
        job.clear()
    for error in errors:
        if error is not None:
            raise error
    return out


def _help(job: list[Any], settings: Any) -> None:
    """A pool thread's share of a call, under the caller's error state."""
    with np.errstate(**settings):
        _work(job)


def _work(job: list[Any]) -> None:
    """Take blocks (``next`` on the shared counter is atomic under the GIL) until none is left."""
    kernel, operands, sliced, out, rows, buffers, taken = job
    length = out.shape[0]
    blocks = -(-length // rows)
    temporaries = _buffers(buffers, (rows, *out.shape[1:]), str(out.dtype))
    for block in taken:
        if block >= blocks:
            return
        start = block * rows
        stop = min(start + rows, length)
        part = [x[start:stop] if cut else x for x, cut in zip(operands, sliced)]
        if stop - start < rows:
            kernel(*part, out[start:stop], *(t[:stop - start] for t in temporaries))
        else:
            kernel(*part, out[start:stop], *temporaries)
