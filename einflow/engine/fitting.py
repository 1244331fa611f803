"""Fitting a plan under the memory limit: which steps to slice or compute in chunks, and their generated code.

A plan is first rendered whole; when its predicted peak exceeds the limit, :func:`fit` walks its steps with
the memory alive at each and decides, for every step over the limit:

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
- anything else, or a step whose result and the arrays alive with it already exceed the limit, cannot fit
  and is named in the refusal with the reason.

The plan is then rendered again with these decisions (:class:`FittingRenderer` renders the loops) and
checked once more. On the dask backend each slice is a task instead (see
``einflow.engine.backends.dask_backend.sliced_contraction``) and nothing is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import opt_einsum as oe

from einflow.engine.linalg import is_linalg
from einflow.engine.memory import format_bytes
from einflow.engine.slicing import SliceKernel, choose_slicing, slice_peak, slice_table
from einflow.engine.steps import (
    Arg,
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Lowered,
    Node,
    Reduce,
    Step,
    node_args,
    step_inputs,
)

__all__ = ["Fitting", "FittingRenderer", "fit", "NORMALISERS"]

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


@dataclass
class Fitting:
    """What to slice or chunk so that a plan fits its memory limit."""

    #: contraction register -> bytes one slice may keep alive
    budgets: dict[int, int] = field(default_factory=dict)
    #: elementwise registers computed chunk by chunk inside the reduction that reads them
    fused: set[int] = field(default_factory=set)
    #: reduction register -> (the fused elementwise step, the position of the chunked index in its labels, chunks)
    chunks: dict[int, tuple[Elementwise, int, int]] = field(default_factory=dict)
    #: elementwise register computed block by block into its whole result -> (the position of the chunked index
    #: in its labels, chunks, the diagonal steps made chunk by chunk inside the loop)
    pieces: dict[int, tuple[int, int, tuple[Diagonal, ...]]] = field(default_factory=dict)
    #: register -> why the step cannot be made to fit
    reasons: dict[int, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.budgets or self.chunks or self.pieces)

    def held(self) -> set[int]:
        """Registers kept alive past their last step: the values of diagonals made block by block later."""
        return {diagonal.arg for _, _, diagonals in self.pieces.values() for diagonal in diagonals}


def _slice_axes(expr: Node, position: int, ranks: dict[int, int]) -> dict[int, int] | None:
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


def fit(lowered: Lowered, renderer: Any, allocations: dict[int, int], transients: dict[int, int],
        limit: float, backend: Any) -> Fitting:
    """Decide, step by step, what to slice or chunk so that the peak stays under ``limit`` (bytes)."""
    fitting = Fitting()
    steps = lowered.steps
    live = 0
    skipped: set[int] = set()
    for position, step in enumerate(steps):
        if isinstance(step, Free):
            live -= sum(allocations.get(r, 0) for r in step.registers if r not in fitting.fused)
            continue
        out = step.out
        made, extra = allocations.get(out, 0), transients.get(out, 0)
        if backend.lazy:  # each slice a task holding its operand blocks: every contraction is checked
            if isinstance(step, Contract) and out in renderer.paths:
                equation, shapes, _, info, _ = renderer.paths[out]
                whole = slice_peak(equation, shapes, info.contraction_list, holds_operands=True)
                if whole * renderer.itemsize(out) > limit / TASKS_AT_ONCE:
                    fitting.budgets[out] = int(limit / TASKS_AT_ONCE)
            continue
        if out in skipped or live + made + extra <= limit:
            live += made
            continue
        if isinstance(step, Contract):
            room = limit - live - made
            room -= min(room / 10, HEADROOM)
            if room > 0:
                fitting.budgets[out] = int(room)
            else:
                fitting.reasons[out] = (
                    f"slicing cannot help: the result of shape {renderer.shape[out]} ({format_bytes(made)}) and the "
                    f"arrays alive with it ({format_bytes(live)}) already exceed the limit")
        elif isinstance(step, Elementwise):
            reduction = _reduced_next(steps, position, out, lowered.outputs)
            room = limit - live
            # chunk by chunk the expression is one numpy expression, with its temporaries (not block buffers)
            whole = made + renderer.expression_transient.get(out, extra)
            chunking = None if reduction is None else _chunking(step, reduction, renderer, allocations,
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
                step, diagonals, renderer, allocations, 3 * made + renderer.expression_transient.get(out, extra),
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
                    f"slicing cannot help: the result of shape {renderer.shape[out]} ({format_bytes(made)}) and the "
                    f"arrays alive with it ({format_bytes(alive)}) already exceed the limit")
                live += made
                continue
            fitting.reasons[out] = (
                "slicing cannot help: only contractions, and elementwise expressions reduced right away (such as "
                "max[k](A[i,k] + B[k,j]) or sum[i,j](exp(u[i] v[j]))), are computed in slices"
                if reduction is None else
                f"slicing cannot help: even in {MAX_SLICES} chunks of an index of this reduction, one chunk needs more")
        else:
            fitting.reasons[out] = f"slicing cannot help: a {type(step).__name__.lower()} step is not sliced"
        live += made
    return fitting


def _chunking(step: Elementwise, reduction: Reduce, renderer: Any, allocations: dict[int, int], whole: int,
              room: float) -> tuple[int, int] | None:
    """(position of the index to chunk over in ``step.labels``, number of chunks) or None when none fits."""
    if reduction.labels != step.labels or is_linalg(reduction):  # a matrix is factorised whole
        return None
    kept = [k for k in range(len(step.labels)) if k not in reduction.axes]  # normalisers too: along the others
    # a reduced index can be chunked too when partial reductions combine (sums add up, maxima take the max)
    reduced = list(reduction.axes) if reduction.kind in COMBINE else []
    shape = renderer.shape[step.out]
    result = allocations.get(reduction.out, 0)
    ranks = {register: len(renderer.shape.get(register, ())) for register in node_args(step.expr)}
    best: tuple[int, int, int] | None = None
    for position in kept + reduced:
        size = shape[position]
        if size <= 1 or _slice_axes(step.expr, position, ranks) is None:
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


def _pieces(step: Elementwise, diagonals: tuple[Diagonal, ...], renderer: Any, allocations: dict[int, int],
            extra: int, room: float) -> tuple[int, int] | None:
    """(position of the index to compute ``step`` in chunks of, number of chunks) or None when none fits.

    Each chunk needs its share of the expression's result and temporaries (``extra``: a block's result is made,
    then copied into the whole one) and of the diagonal arrays made inside the loop; an index on a diagonal of
    one of them is not chunked (its chunk would cut the diagonal).
    """
    if room <= 0:
        return None
    shape = renderer.shape[step.out]
    ranks = {register: len(renderer.shape.get(register, ())) for register in node_args(step.expr)}
    per_chunkable = extra + sum(allocations.get(d.out, 0) for d in diagonals)
    best: tuple[int, int] | None = None
    for position, size in enumerate(shape):
        if size <= 1:
            continue
        axes = _slice_axes(step.expr, position, ranks)
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


class FittingRenderer:
    """Renders sliced contractions and chunked reductions (mixed into the plan's specialising renderer)."""

    fitting: Fitting

    def fitted_lines(self: Any, step: Step) -> list[str] | None:
        """The lines of a step the fitting slices or chunks, or None to render it as usual."""
        if isinstance(step, Contract) and step.out in self.fitting.budgets:
            text = self.contract(step)  # plans the path and the whole contraction's report
            return self.sliced_contract(step) or [f"{self.var(step.out)} = {text}"]
        if isinstance(step, (Elementwise, Diagonal)) and step.out in self.fitting.fused:
            return []
        if isinstance(step, Elementwise) and step.out in self.fitting.pieces:
            return self.chunked_elementwise(step)
        if isinstance(step, Reduce) and step.out in self.fitting.chunks:
            return self.chunked_reduce(step)
        return None

    def sliced_contract(self: Any, step: Contract) -> list[str] | None:
        equation, shapes, path, info, _ = self.paths[step.out]
        itemsize = self.itemsize(step.out)
        dask = self.backend.lazy
        most = MAX_TASKS if dask else MAX_SLICES
        slicing = choose_slicing(equation, shapes, info.contraction_list, self.fitting.budgets[step.out] // itemsize,
                                 holds_operands=dask, max_slices=most)
        if slicing is None:
            self.unfit[step.out] = (f"slicing cannot help: in at most {most} slices (blocks of the indices' values), "
                                    "one slice of this contraction still needs more")
            return None
        if not slicing.labels:
            return None
        self.sliced[step.out] = slicing
        _, pairwise, _ = self.report[step.out]
        self.report[step.out] = (slicing.flops, pairwise, slicing.largest)
        self.transient[step.out] = slicing.peak * itemsize
        kernels: dict[Any, Any] = {}
        table = []
        for at, index, cut in slice_table(equation, shapes, slicing):
            kernel = kernels.get(cut)
            if kernel is None:
                if not self.backend.numpy_native and not self.backend.lazy:  # cupy: its own arrays
                    expression = oe.contract_expression(equation, *cut, optimize=path)
                    kernel = _Kernel(expression, self.backend.einsum_backend)
                else:  # numpy, and each dask task computes its slice with numpy
                    kernel = SliceKernel(equation, cut, info.contraction_list)
                kernels[cut] = kernel
            table.append((at, index, kernel))
        name = self.fresh(f"_slices{step.out}")
        self.namespace[name] = table
        out = self.var(step.out)
        np_ = self.alias["np"]
        dtype = str(self.dtype[step.out])
        common = self.common_dtype(step) if len(step.args) > 2 or step.scale else None
        casts = [common is not None and not isinstance(self.dtype[r], type) and self.dtype[r] != common
                 for r in step.args]
        shape = self.shape[step.out]
        if dask:
            helper = self.fresh(f"_sliced{step.out}")
            self.namespace[helper] = self.backend.sliced_contraction
            operands = ", ".join(self.var(r) for r in step.args)
            cast = repr(str(common)) if any(casts) else None
            lines = [f"{out} = {helper}({name}, ({operands},), {shape!r}, {dtype!r}, {slicing.accumulates!r}, "
                     f"{cast})"]
            lines += [f"{out} = {out} * {self.node(factor)[0]}" for factor in step.scale]
            return lines
        at, parts, kernel = self.fresh("_at"), self.fresh("_parts"), self.fresh("_kernel")
        operands = ", ".join((f"{self.var(r)}[{parts}[{k}]]" if step.operands[k] else self.var(r))
                             + (f".astype({str(common)!r})" if casts[k] else "") for k, r in enumerate(step.args))
        allocate, write = ("zeros", "+=") if slicing.accumulates else ("empty", "=")
        lines = [f"{out} = {np_}.{allocate}({shape!r}, dtype={dtype!r})",
                 f"for {at}, {parts}, {kernel} in {name}:",
                 f"    {out}[{at}] {write} {kernel}({operands})"]
        lines += [f"{out} *= {self.node(factor)[0]}" for factor in step.scale]
        return lines

    def chunk_text(self: Any, step: Elementwise, views: dict[int, str]) -> str:
        """The expression of ``step`` for one chunk: the registers in ``views`` read through their chunk's name."""
        saved = {register: self.vars.get(register) for register in views}
        self.vars.update(views)
        try:
            return str(self.elementwise(step))
        finally:
            for register, name in saved.items():
                if name is None:
                    self.vars.pop(register, None)
                else:
                    self.vars[register] = name

    def chunked_elementwise(self: Any, step: Elementwise) -> list[str]:
        """The expression computed in blocks of one index into its whole result; the diagonal arrays it reads
        are made block by block in the loop (zeros, the values written on the diagonal's strided view)."""
        position, count, diagonals = self.fitting.pieces[step.out]
        shape = self.shape[step.out]
        size = shape[position]
        block = -(-size // count)
        ranks = {register: len(self.shape.get(register, ())) for register in node_args(step.expr)}
        axes = _slice_axes(step.expr, position, ranks) or {}
        made = {diagonal.out: diagonal for diagonal in diagonals}
        out, np_ = self.var(step.out), self.alias["np"]
        start = self.fresh("_start")
        lines = [f"{out} = {np_}.empty({shape!r}, dtype={str(self.dtype[step.out])!r})",
                 f"for {start} in range(0, {size}, {block}):"]
        cut = f"{start}:{start} + {block}"
        views = {}
        for register, axis in sorted(axes.items()):
            view = views[register] = self.fresh(f"_part{register}")
            diagonal = made.get(register)
            if diagonal is None:
                lines.append(f"    {view} = {self.var(register)}[{':, ' * axis}{cut}]")
            else:
                lines += self.diagonal_block(diagonal, view, axis, start, block, size)
        text = self.chunk_text(step, views)
        lines.append(f"    {out}[{':, ' * position}{cut}] = {text}")
        if diagonals:
            lines.append(f"del {', '.join(dict.fromkeys(self.var(d.arg) for d in diagonals))}")
        inside = self.transient.get(step.out, 0) + 3 * math.prod(shape) * self.itemsize(step.out) + sum(
            math.prod(self.shape[d.out]) * self.itemsize(d.out) for d in diagonals)
        held = sum(math.prod(self.shape[r]) * self.itemsize(r) for r in {d.arg for d in diagonals})
        # one block of the result, the temporaries and each diagonal; the diagonals' values, kept for the loop
        self.transient[step.out] = -(-inside * block // size) + held
        return lines

    def diagonal_block(self: Any, step: Diagonal, view: str, axis: int, start: str, block: int,
                       size: int) -> list[str]:
        """Lines making ``view``: the block ``start:start + block`` along ``axis`` of a diagonal step's array."""
        np_ = self.alias["np"]
        label = step.output[axis]
        value = f"{self.var(step.arg)}[{':, ' * step.labels.index(label)}{start}:{start} + {block}]"
        dims = [f"min({block}, {size} - {start})" if k == axis else str(n) for k, n in enumerate(self.shape[step.out])]
        representative = {member: group[0] for group in step.groups for member in group}
        letters = {name: oe.get_symbol(k) for k, name in enumerate(step.labels)}
        spec = "".join(letters[representative.get(name, name)] for name in step.output)
        spec += "->" + "".join(letters[name] for name in step.labels)
        return [f"    {view} = {np_}.zeros(({', '.join(dims)},), dtype={self.var(step.arg)}.dtype)",
                f"    {np_}.einsum({spec!r}, {view})[...] = {value}"]

    def chunked_reduce(self: Any, step: Reduce) -> list[str]:
        source, position, count = self.fitting.chunks[step.out]
        size = self.shape[source.out][position]
        block = -(-size // count)
        kept = position if step.kind in NORMALISERS else position - sum(1 for a in step.axes if a < position)
        ranks = {register: len(self.shape.get(register, ())) for register in node_args(source.expr)}
        axes = _slice_axes(source.expr, position, ranks) or {}
        out, np_ = self.var(step.out), self.alias["np"]
        start, chunk = self.fresh("_start"), self.fresh(f"_chunk{step.out}")
        lines = [f"{out} = {np_}.empty({self.shape[step.out]!r}, dtype={str(self.dtype[step.out])!r})",
                 f"for {start} in range(0, {size}, {block}):"]
        views = {}
        for register, axis in sorted(axes.items()):
            view = views[register] = self.fresh(f"_part{register}")
            lines.append(f"    {view} = {self.var(register)}[{':, ' * axis}{start}:{start} + {block}]")
        text = self.chunk_text(source, views)
        elements = math.prod(self.shape[source.out])
        itemsize = self.itemsize(source.out)
        temporaries = (1 + REDUCE_TEMPORARIES.get(step.kind, 0)) * elements * itemsize
        self.transient[step.out] = (self.transient.pop(source.out, 0) + temporaries) * block // size \
            + math.prod(self.shape[step.out]) * self.itemsize(step.out) * block // size
        combined = position in step.axes  # a reduced index: partial results combine
        kind = "sum" if step.kind == "mean" and combined else step.kind
        if kind == "sum":
            reduced = self.reduce(chunk, step.axes)
        else:
            reduced = f"{self.helper('reduce')}({kind!r}, {chunk}, {step.axes!r})"
        if not combined:
            lines += [f"    {chunk} = {text}",
                      f"    {out}[{':, ' * kept}{start}:{start} + {block}] = {reduced}",
                      f"    del {chunk}"]
            return lines
        part = self.fresh(f"_partial{step.out}")
        merge = COMBINE[step.kind].format(a=out, b=part, np=np_)
        lines[0] = f"{out} = None"
        lines += [f"    {chunk} = {text}",
                  f"    {part} = {reduced}",
                  f"    del {chunk}",
                  f"    {out} = {part} if {out} is None else {merge}"]
        if step.kind == "mean":
            count = math.prod(self.shape[source.out][axis] for axis in step.axes)
            lines.append(f"{out} = {self.helper('as_float')}({out}) / {count}")
        self.transient[step.out] += 2 * math.prod(self.shape[step.out]) * self.itemsize(step.out)
        return lines


class _Kernel:
    """A contract expression for one block shape, on a backend (cupy): ``kernel(*operands)``."""

    def __init__(self, expression: Any, backend: str) -> None:
        self.expression, self.backend = expression, backend

    def __call__(self, *operands: Any) -> Any:
        return self.expression(*operands, backend=self.backend)
