"""Fit: which steps to slice or compute in chunks so that a plan stays under its memory limit.

When the peak predicted from the specialised record (:mod:`einflow.engine.specialise`) exceeds the limit,
:func:`fit` walks the record's steps with the memory alive at each and decides, for every step over the limit:

- a **contraction** is sliced (:mod:`einflow.engine.slicing`): it may keep alive what the limit leaves once the
  arrays alive with it and its own result are counted;
- an **elementwise expression reduced right away** (``max[k](A[i,k] + B[k,j])``, a tropical product; or
  ``logsumexp[k](...)``) is fused with its reduction and computed in chunks of an index the reduction
  keeps, so the full i x k x j array is never built; when no kept index will do, in chunks of a reduced
  index whose partial results combine (sum, mean, max, min, logsumexp);
- any other **elementwise expression** (a sum that builds a large array, ``delta[p,r] A[q,s] + B[p,q,r,s]``)
  is computed in chunks of one of its indices, each written into its block of the result; a surviving
  delta (a **diagonal** array) that only this expression reads is made chunk by chunk inside the same loop,
  so the full diagonal array never exists (numpy backend);
- a **gathered window** (``E[t[b], d]``) read by one contraction alone is not made whole: each slice of the
  contraction makes its own block of it from the blocks of the position tensors (numpy backend);
- a **scatter-add** (``delta[v, t[b]]``, a strided or gathered adjoint) is computed in chunks of its value's
  first axis, each chunk's flat positions made and added into the one result, and any other gathered window
  in chunks of its first axis, each taken into its block of the result (numpy backend);
- anything else, or a step whose result and the arrays alive with it already exceed the limit, cannot fit
  and is named in the refusal with the reason.

The decisions come with the memory each fitted step then needs (:attr:`Fitting.transients`), so the plan
is checked once more from the record and the decisions, before anything is rendered; the render pass writes
the loops (:mod:`einflow.engine.render_fitted`). On the dask backend each slice is a task instead (see
``einflow.engine.backends.dask_backend.sliced_contraction``) and nothing is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from einflow.engine.affine import take_labels
from einflow.engine.convolution import sole_reader
from einflow.engine.linalg import is_linalg
from einflow.engine.memory import format_bytes
from einflow.engine.slicing import SCATTER_CHUNK_BYTES, Slicing, choose_slicing, slice_peak
from einflow.engine.specialise import Specialised
from einflow.engine.steps import (
    Arg,
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Node,
    Reduce,
    Scatter,
    Step,
    Window,
    node_args,
    step_inputs,
)

__all__ = ["Fitting", "NO_FITTING", "fit", "slice_axes", "NORMALISERS", "COMBINE", "Holders"]

#: bytes kept free for what the model does not count (ufunc buffers, Python objects): a tenth of the room, at most
HEADROOM = 1 << 20
#: on dask, the limit is shared by the blocks of the task a worker runs, of the next one it has ready and of
#: results waiting to be added up: each task may use a third of it
TASKS_AT_ONCE = 3
#: the most slices a contraction is cut into (a loop in the generated code), and the most tasks on dask
MAX_SLICES = 1 << 16
MAX_TASKS = 1 << 12
#: how partial reductions over chunks of a reduced index combine (``{a}``: so far, ``{b}``: this chunk's)
COMBINE = {"sum": "{a} + {b}", "mean": "{a} + {b}", "max": "{np}.maximum({a}, {b})",
           "min": "{np}.minimum({a}, {b})", "logsumexp": "{np}.logaddexp({a}, {b})"}
#: temporaries (arrays of the argument's size) the generated reductions make besides their result
REDUCE_TEMPORARIES = {"logsumexp": 3, "softmax": 2, "log_softmax": 2, "argmax": 2, "argmin": 2, "mean": 1, "max": 1,
                      "min": 1, "sum": 1}  # numpy's partial results and the helper's shifted copies, measured
#: reductions that keep every axis of their argument
NORMALISERS = ("softmax", "log_softmax", "argmax", "argmin")


@dataclass(frozen=True)
class Fitting:
    """What to slice or chunk so that a plan fits its memory limit, and the memory the fitted steps need."""

    #: contraction register -> bytes one slice may keep alive
    budgets: Mapping[int, int] = field(default_factory=dict)
    #: elementwise registers computed chunk by chunk inside the reduction that reads them
    fused: frozenset[int] = frozenset()
    #: reduction register -> (the fused elementwise step, the position of the chunked index in its labels, chunks)
    chunks: Mapping[int, tuple[Elementwise, int, int]] = field(default_factory=dict)
    #: elementwise register computed block by block into its whole result -> (the position of the chunked index
    #: in its labels, chunks, the diagonal steps made chunk by chunk inside the loop)
    pieces: Mapping[int, tuple[int, int, tuple[Diagonal, ...]]] = field(default_factory=dict)
    #: register -> why the step cannot be made to fit
    reasons: Mapping[int, str] = field(default_factory=dict)
    #: contraction register -> the slicing it runs with (``einflow.engine.slicing``)
    slicings: Mapping[int, Slicing] = field(default_factory=dict)
    #: register -> bytes alive only while it is computed, as fitted (None: nothing is sliced or chunked, the
    #: record's own figures hold)
    transients: Mapping[int, int] | None = None
    #: gathered window register -> the sliced contraction that makes it block by block (the window is in ``fused``)
    windows: Mapping[int, int] = field(default_factory=dict)
    #: scatter-add or gathered window register -> rows of the first axis (a scatter's value's, a window's own)
    #: computed at a time
    rows: Mapping[int, int] = field(default_factory=dict)
    #: chunked reduction register -> the registers its fused expression reads that are released only after it
    #: (the lowering frees them after the expression, which now runs inside the reduction)
    deferred: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        """Whether some step is sliced or chunked (or was meant to be: a slicing that cannot help)."""
        return self.transients is not None

    def held(self) -> set[int]:
        """Registers kept alive past their last step: the values of diagonals made block by block later."""
        return {diagonal.arg for _, _, diagonals in self.pieces.values() for diagonal in diagonals}


class _Deciding:
    """The decisions while :func:`fit` walks the steps (frozen into a :class:`Fitting` at the end)."""

    def __init__(self) -> None:
        self.budgets: dict[int, int] = {}
        self.fused: set[int] = set()
        self.chunks: dict[int, tuple[Elementwise, int, int]] = {}
        self.pieces: dict[int, tuple[int, int, tuple[Diagonal, ...]]] = {}
        self.reasons: dict[int, str] = {}
        self.windows: dict[int, int] = {}
        self.rows: dict[int, int] = {}

    def frozen(self, record: Specialised) -> Fitting:
        """The decisions with each budgeted contraction's slicing and the memory of every fitted step."""
        reasons = dict(self.reasons)
        slicings: dict[int, Slicing] = {}
        transients = dict(record.transients)
        dask = record.backend.lazy
        most = MAX_TASKS if dask else MAX_SLICES
        for window in self.windows:
            transients.pop(window, None)
        for out, budget in self.budgets.items():
            planned = record.contractions[out]
            itemsize = record.itemsize(out)
            step = next(step for step in record.lowered.steps if isinstance(step, Contract) and step.out == out)
            # a gathered window made per slice: its block and its int64 flat positions
            made = [(record.itemsize(r) + (0 if _takes_rows(record, r) else 8)) / itemsize
                    if self.windows.get(r) == out else 0.0 for r in step.args]
            # a strided window (a view whose elements overlap) is copied by the kernel, whatever its block
            strided = [r in record.strided_windows and r not in record.convolved_windows for r in step.args]
            slicing = choose_slicing(planned.equation, planned.shapes, planned.info.contraction_list,
                                     budget // itemsize, holds_operands=dask, max_slices=most, made=made,
                                     strided=strided)
            if slicing is None:
                reasons[out] = (f"slicing cannot help: in at most {most} slices (blocks of the indices' values), "
                                "one slice of this contraction still needs more")
            if slicing is None and any(made):  # one slice making the whole window (the plan is over its limit)
                slicing = choose_slicing(planned.equation, planned.shapes, planned.info.contraction_list,
                                         float("inf"), made=made, strided=strided)
            if slicing is not None and (slicing.labels or any(made)):
                slicings[out] = slicing
                transients[out] = slicing.peak * itemsize
        for out, (position, count, diagonals) in self.pieces.items():
            # one block of the result, the temporaries and each diagonal; the diagonals' values, kept for the loop
            size = record.shapes[out][position]
            block = -(-size // count)
            inside = record.expressions[out].temporaries + 3 * record.nbytes(out) + sum(
                record.nbytes(d.out) for d in diagonals)
            held = sum(record.nbytes(r) for r in {d.arg for d in diagonals})
            transients[out] = -(-inside * block // size) + held
        deferred: dict[int, tuple[int, ...]] = {}
        for out, (source, position, count) in self.chunks.items():
            # a chunk of the expression, its temporaries and the reduction's, and of the result (or, chunks of a
            # reduced index, the partial result and the one combined so far)
            size = record.shapes[source.out][position]
            block = -(-size // count)
            reduction = next(step for step in record.lowered.steps if isinstance(step, Reduce) and step.out == out)
            temporaries = (1 + REDUCE_TEMPORARIES.get(reduction.kind, 0)) * record.nbytes(source.out)
            transients.pop(source.out, None)
            transients[out] = (record.expressions[source.out].temporaries + temporaries) * block // size \
                + record.nbytes(out) * block // size
            if position in reduction.axes:
                transients[out] += 2 * record.nbytes(out)
            deferred[out] = _freed_between(record, source, reduction)
            transients[out] += sum(record.allocations.get(r, 0) for r in deferred[out])
        for out, rows in self.rows.items():
            transients[out] = min(rows, _row_count(record, out)) * _row_bytes(record, out)
        fitted = bool(self.budgets or self.chunks or self.pieces or self.rows)
        return Fitting(self.budgets, frozenset(self.fused), self.chunks, self.pieces, reasons, slicings,
                       transients if fitted else None, self.windows, self.rows, deferred)


#: the fitting of a plan without a memory limit, or that fits as it is
NO_FITTING = Fitting()


class Holders:
    """When freed arrays are released: an array viewed by another register (a strided window of it, a
    transposed view) is released once it and every view of it are freed, whatever order the Free steps
    name them in (``del t`` after its window only drops a name: the window holds the array)."""

    def __init__(self, views: Mapping[int, int]) -> None:
        self.views = views
        self.alive: dict[int, set[int]] = {}

    def root(self, register: int) -> int:
        while register in self.views:
            register = self.views[register]
        return register

    def made(self, register: int) -> None:
        self.alive.setdefault(self.root(register), set()).add(register)

    def released(self, registers: tuple[int, ...]) -> list[int]:
        """The registers whose own memory these frees release (the roots of groups left without a member)."""
        found = []
        for register in registers:
            root = self.root(register)
            members = self.alive.get(root)
            if members is None:
                found.append(root)
                continue
            members.discard(register)
            if not members:
                del self.alive[root]
                found.append(root)
        return found


def slice_axes(expr: Node, position: int, ranks: dict[int, int]) -> dict[int, int] | None:
    """register -> its axis along the expression's axis ``position`` (None if a register has two such axes)."""
    found: dict[int, int] = {}

    def visit(node: Any) -> bool:
        if isinstance(node, Arg):
            if not ranks.get(node.register):
                return True
            axis = position if node.axes is None else node.axes[position]
            if axis is None:
                return True
            return found.setdefault(node.register, axis) == axis
        return all(visit(child) for child in _children(node))

    return found if visit(expr) else None


def _freed_between(record: Specialised, source: Elementwise, reduction: Reduce) -> tuple[int, ...]:
    """The registers ``source`` reads that a Free step between it and ``reduction`` releases."""
    steps = record.lowered.steps
    start = steps.index(source)
    end = next(k for k, step in enumerate(steps) if step is reduction)
    read = set(node_args(source.expr))
    return tuple(r for step in steps[start + 1:end] if isinstance(step, Free) for r in step.registers if r in read)


def _row_shape(record: Specialised, out: int) -> tuple[int, ...]:
    """The shape a chunked step is cut along the first axis of: a scatter-add's value's, a window's own."""
    return record.specs[out][1] if _is_scatter(record, out) else record.shapes[out]


def _is_scatter(record: Specialised, out: int) -> bool:
    return any(isinstance(step, Scatter) and step.out == out for step in record.lowered.steps)


def _row_count(record: Specialised, out: int) -> int:
    """The rows a chunked scatter-add or window is computed in blocks of."""
    shape = _row_shape(record, out)
    return shape[0] if shape else 0


def _row_bytes(record: Specialised, out: int) -> int:
    """Bytes a chunked step allocates per row: a scatter-add (``einflow.engine.slicing.scatter_chunks``) for each
    element of its value's row, its positions, mask and kept positions, its value's flat copy and kept values; a
    window (``einflow.engine.slicing.window_chunks``) its int64 positions (none for a take of whole rows) and the
    block it copies in."""
    itemsize = record.itemsizes.get(out, 8)
    shape = _row_shape(record, out)
    inner = 1
    for size in shape[1:]:
        inner *= size
    if _is_scatter(record, out):
        return inner * (SCATTER_CHUNK_BYTES + 2 * itemsize)
    return inner * ((0 if _takes_rows(record, out) else 8) + itemsize)


def _takes_rows(record: Specialised, out: int) -> bool:
    """Whether a window is one take of whole rows (``A[t[z], r]``): no int64 positions per element."""
    spec = record.specs.get(out)
    return spec is not None and any(isinstance(step, Window) and step.out == out
                                    and take_labels(spec, record.shapes[step.arg]) is not None
                                    for step in record.lowered.steps)


def _gathered(record: Specialised, step: Window) -> bool:
    """Whether a window is a take at gathered positions (unpadded): its blocks are takes of the positions' blocks."""
    spec = record.specs.get(step.out)
    return bool(step.gathers) and spec is not None and spec[1] is None and bool(record.shapes[step.out])


def _gathered_reader(record: Specialised, step: Window) -> Contract | None:
    """The contraction that alone reads a gathered window (unpadded), which its slices can make block by block."""
    if not _gathered(record, step):
        return None
    reader = sole_reader(record.lowered.steps, step.out, record.lowered.outputs)
    if not isinstance(reader, Contract) or reader.out in record.convolutions or step.out not in reader.args:
        return None
    return reader


def _children(node: Any) -> tuple[Any, ...]:
    for name in ("terms", "factors"):
        if hasattr(node, name):
            return tuple(getattr(node, name))
    parts = [getattr(node, name, None) for name in ("arg", "other", "base")]
    return tuple(part for part in parts if part is not None and not isinstance(part, int))


def _reduced_next(steps: tuple[Step, ...], position: int, register: int,
                  outputs: tuple[int, ...]) -> Reduce | None:
    """The reduction right after ``steps[position]`` that is the only reader of ``register``, if there is one."""
    if register in outputs:
        return None
    following = next((step for step in steps[position + 1:] if not isinstance(step, Free)), None)
    if not isinstance(following, Reduce) or following.arg != register:
        return None
    readers = sum(step_inputs(step).count(register) for step in steps)
    return following if readers == 1 else None


def fit(record: Specialised, limit: float) -> Fitting:
    """Decide, step by step, what to slice or chunk so that the peak stays under ``limit`` (bytes)."""
    fitting = _Deciding()
    lowered, backend = record.lowered, record.backend
    allocations, transients = record.allocations, record.transients
    steps = lowered.steps
    live = 0
    holders = Holders(record.views)
    skipped: set[int] = set()
    for position, step in enumerate(steps):
        if isinstance(step, Free):
            live -= sum(allocations.get(r, 0) for r in holders.released(step.registers) if r not in fitting.fused)
            continue
        out = step.out
        holders.made(out)
        made, extra = allocations.get(out, 0), transients.get(out, 0)
        if backend.lazy:  # each slice a task holding its operand blocks: every contraction is checked
            if isinstance(step, Contract):
                planned = record.contractions[out]
                whole = slice_peak(planned.equation, planned.shapes, planned.info.contraction_list, holds_operands=True)
                if whole * record.itemsize(out) > limit / TASKS_AT_ONCE:
                    fitting.budgets[out] = int(limit / TASKS_AT_ONCE)
            continue
        if isinstance(step, Window) and backend.numpy_native and live + made + extra > limit:
            reader = _gathered_reader(record, step)
            if reader is not None:  # made block by block inside the contraction's slices
                fitting.fused.add(out)
                fitting.windows[out] = reader.out
                continue
            if _gathered(record, step):  # taken in blocks of rows into its result
                room = limit - live - made
                room -= min(max(room, 0) / 10, HEADROOM)
                row = _row_bytes(record, out)
                if row and room >= row:
                    fitting.rows[out] = int(room // row)
                    live += made
                    continue
        if out in skipped or live + made + extra <= limit and out not in fitting.windows.values():
            live += made
            continue
        if isinstance(step, Contract) and out in record.convolutions:
            fitting.reasons[out] = "slicing cannot help: a native convolution runs whole"
        elif isinstance(step, Contract):
            room = limit - live - made
            room -= min(room / 10, HEADROOM)
            if room > 0:
                fitting.budgets[out] = int(room)
            else:
                fitting.reasons[out] = (
                    f"slicing cannot help: the result of shape {record.shapes[out]} ({format_bytes(made)}) and the "
                    f"arrays alive with it ({format_bytes(live)}) already exceed the limit")
        elif isinstance(step, Elementwise):
            reduction = _reduced_next(steps, position, out, lowered.outputs)
            room = limit - live
            # chunk by chunk the expression is one numpy expression, with its temporaries (not block buffers)
            whole = made + record.expressions[out].temporaries
            chunking = None if reduction is None else _chunking(step, reduction, record, allocations,
                                                               whole, room - min(room / 10, HEADROOM))
            if chunking is not None and reduction is not None:
                fitting.fused.add(out)
                fitting.chunks[reduction.out] = (step, *chunking)
                skipped.add(reduction.out)  # counted when its own step comes
                continue
            diagonals = _diagonals_read_by(steps, position, lowered.outputs) if backend.numpy_native else ()
            alive = live - sum(allocations.get(d.out, 0) for d in diagonals)
            room = limit - alive - made
            # the diagonals' values stay alive through the loop (the model frees them after their diagonal)
            room -= sum(allocations.get(d.arg, 0) for d in diagonals)
            # chunk by chunk, too, the expression is one numpy expression (not block buffers), whose last
            # operation makes a block of the result while its operands' temporaries are alive; one more block
            # is kept free for numpy's own temporaries (measured 0.3 MB over the model in full-suite order)
            pieces = None if not backend.numpy_native or reduction is not None else _pieces(
                step, diagonals, record, allocations, 3 * made + record.expressions[out].temporaries,
                room - min(max(room, 0) / 10, HEADROOM))
            if pieces is not None:
                fitting.pieces[out] = (*pieces, diagonals)
                for diagonal in diagonals:
                    fitting.fused.add(diagonal.out)
                    fitting.reasons.pop(diagonal.out, None)
                live = alive + made
                continue
            if reduction is None and backend.numpy_native and room <= 0:
                for diagonal in diagonals:  # the result itself is the obstacle, not the diagonal
                    fitting.reasons.pop(diagonal.out, None)
                fitting.reasons[out] = (
                    f"slicing cannot help: the result of shape {record.shapes[out]} ({format_bytes(made)}) and the "
                    f"arrays alive with it ({format_bytes(alive)}) already exceed the limit")
                live += made
                continue
            fitting.reasons[out] = (
                "slicing cannot help: only contractions, and elementwise expressions reduced right away (such as "
                "max[k](A[i,k] + B[k,j]) or sum[i,j](exp(u[i] v[j]))), are computed in slices"
                if reduction is None else
                f"slicing cannot help: even in {MAX_SLICES} chunks of an index of this reduction, one chunk needs more")
        elif isinstance(step, Scatter) and backend.numpy_native and out not in record.convolved_scatters \
                and record.specs[out][1]:
            room = limit - live - made
            room -= min(max(room, 0) / 10, HEADROOM)
            row = _row_bytes(record, out)
            if row and room >= row:
                fitting.rows[out] = int(room // row)
            else:
                fitting.reasons[out] = (
                    f"slicing cannot help: the scatter's result of shape {record.shapes[out]} "
                    f"({format_bytes(made)}) and the arrays alive with it ({format_bytes(live)}), with one row of "
                    f"its value's positions ({format_bytes(row)}), exceed the limit")
        else:
            fitting.reasons[out] = f"slicing cannot help: a {type(step).__name__.lower()} step is not sliced"
        live += made
    return fitting.frozen(record)


def _chunking(step: Elementwise, reduction: Reduce, record: Specialised, allocations: Mapping[int, int], whole: int,
              room: float) -> tuple[int, int] | None:
    """(position of the index to chunk over in ``step.labels``, number of chunks) or None when none fits."""
    if reduction.labels != step.labels or is_linalg(reduction):  # a matrix is factorised whole
        return None
    kept = [k for k in range(len(step.labels)) if k not in reduction.axes]  # normalisers too: along the others
    # a reduced index can be chunked too when partial reductions combine (sums add up, maxima take the max)
    reduced = list(reduction.axes) if reduction.kind in COMBINE else []
    shape = record.shapes[step.out]
    result = allocations.get(reduction.out, 0)
    ranks = {register: len(record.shapes.get(register, ())) for register in node_args(step.expr)}
    best: tuple[int, int, int] | None = None
    for position in kept + reduced:
        size = shape[position]
        if size <= 1 or slice_axes(step.expr, position, ranks) is None:
            continue
        # one value of the index: its share of the expression and of the reduction's temporaries, and of the
        # result (kept) or a partial result
        temporaries = REDUCE_TEMPORARIES.get(reduction.kind, 0) * allocations.get(step.out, 0)
        per_value = (whole + temporaries) / size + (result / size if position in kept else 0)
        room_left = room - result * (1 if position in kept else 3)
        block = int(room_left // per_value) if per_value else size
        if block < 1:
            continue
        count = -(-size // min(block, size))
        if count > MAX_SLICES:
            continue
        key = (position not in kept, count, position)
        if best is None or key < best:
            best = key
    return None if best is None else (best[2], best[1])


def _diagonals_read_by(steps: tuple[Step, ...], position: int, outputs: tuple[int, ...]) -> tuple[Diagonal, ...]:
    """The diagonal steps before ``steps[position]`` that only it reads (once), and that are not outputs."""
    reader = steps[position]
    assert isinstance(reader, Elementwise)
    read = node_args(reader.expr)
    found = []
    for step in steps[:position]:
        if isinstance(step, Diagonal) and step.out not in outputs and read.count(step.out) == 1 \
                and sum(step_inputs(other).count(step.out) for other in steps) == 1:
            found.append(step)
    return tuple(found)


def _pieces(step: Elementwise, diagonals: tuple[Diagonal, ...], record: Specialised, allocations: Mapping[int, int],
            extra: int, room: float) -> tuple[int, int] | None:
    """(position of the index to compute ``step`` in chunks of, number of chunks) or None when none fits.

    Each chunk needs its share of the expression's result and temporaries (``extra``: a block's result is made,
    then copied into the whole one) and of the diagonal arrays made inside the loop; an index on a diagonal of
    one of them is not chunked (its chunk would cut the diagonal).
    """
    if room <= 0:
        return None
    shape = record.shapes[step.out]
    ranks = {register: len(record.shapes.get(register, ())) for register in node_args(step.expr)}
    per_chunkable = extra + sum(allocations.get(d.out, 0) for d in diagonals)
    best: tuple[int, int] | None = None
    for position, size in enumerate(shape):
        if size <= 1:
            continue
        axes = slice_axes(step.expr, position, ranks)
        if axes is None or any(d.out not in axes or _on_diagonal(d, d.output[axes[d.out]]) for d in diagonals):
            continue
        block = int(room // (per_chunkable / size)) if per_chunkable else size
        if block < 1:
            continue
        count = -(-size // min(block, size))
        if count <= MAX_SLICES and (best is None or count < best[1]):
            best = (position, count)
    return best


def _on_diagonal(step: Diagonal, label: str) -> bool:
    return any(label in group and len(group) > 1 for group in step.groups)
