"""Render: the specialised record (and the fitting's decisions) as one straight-line Python function.

:func:`render` writes the steps of a :class:`einflow.engine.specialise.Specialised` record with literal sizes:
contractions as direct BLAS calls on numpy (:mod:`einflow.engine.kernels`), large fused elementwise work block
by block on threads (:mod:`einflow.engine.blocks`), sliced and chunked steps as the fitting decided
(:mod:`einflow.engine.render_fitted`). It reads the record and the fitting and never changes them: every
shape, dtype, path, layout and memory figure was decided before; what rendering adds is names and text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import opt_einsum as oe

import einflow.engine.measure as measure_rows
from einflow.engine import codegen
from einflow.engine.affine import is_identity, scatter_kernel, window_kernel
from einflow.engine.backends.base import Backend
from einflow.engine.context import Names, RenderContext
from einflow.engine.fitting import Fitting
from einflow.engine.helpers import helpers
from einflow.engine.render_fitted import fitted_lines
from einflow.engine.render_steps import contract_text, elementwise_text
from einflow.engine.rows import diagonal_spec, diagonal_view_labels
from einflow.engine.slicing import scatter_chunks, window_chunks
from einflow.engine.specialise import Specialised
from einflow.engine.steps import (
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Reduce,
    Scatter,
    Step,
    Window,
    arg_nodes,
)
from einflow.lang.indices import einsum_equation, index_letters

__all__ = ["Rendered", "render", "step_lines", "RENDER_RULES", "RenderRule"]

#: a large diagonal view with an axis this short or shorter is added into slice by slice along that axis
DIAGONAL_LOOP = 16
#: intermediates of at least this many bytes are released (``del``) right after their last use
RELEASE_BYTES = 1 << 16


@dataclass(frozen=True)
class Rendered:
    """The generated function's source, the function, and the context that named its variables (the plan
    report names registers as the code does)."""

    source: str
    function: Any
    names: RenderContext


def render(record: Specialised, fitting: Fitting) -> Rendered:
    """Render and compile the record's steps, sliced and chunked as ``fitting`` says."""
    lowered = record.lowered
    dtypes = record.dtypes
    # promotion is needed only when some input holds integers or booleans (a weak int included)
    floating = all(dtype is float or (not isinstance(dtype, type) and np.dtype(dtype).kind in "fc")
                   for dtype in (dtypes[k] for k in range(len(lowered.inputs))))
    cx = RenderContext(Names(lowered, record.taken), lowered, record.backend.dialect, set(record.booleans),
                       floating_inputs=floating, record=record, fitting=fitting)
    body: list[str] = []
    number = 0
    for comment, steps in codegen.statement_steps(lowered):
        body.append(comment)
        for step in steps:
            number = codegen.annotate(cx, step, step_lines(cx, step), number, body)
    outputs = _returned(cx)
    result = ", ".join(outputs) + ("," if len(outputs) == 1 else "") if lowered.returns_tuple else outputs[0]
    parameters = ", ".join(cx.names.vars[k] for k in range(len(lowered.inputs)))
    kernels = [line for kernel in cx.kernels for line in (kernel, "")]
    text = "\n".join([*kernels, f"def _run({parameters}):", *body, f"    return {result}", ""])
    namespace = {**helpers(cx.alias, cx.dialect, record.backend.xp), **cx.namespace, cx.alias["oe"]: oe}
    exec(compile(text, "<einflow plan>", "exec"), namespace)  # noqa: S102 - generated here from plain data
    return Rendered(text, namespace["_run"], cx)


def step_lines(cx: RenderContext, step: Step) -> list[str]:
    """The statements computing one step with shapes (dask: its broadcast operands rechunked first)."""
    lines = _own_step_lines(cx, step)
    if cx.record.backend.lazy and isinstance(step, Elementwise):
        return _bounded_broadcast(cx, step) + lines
    return lines


def _own_step_lines(cx: RenderContext, step: Step) -> list[str]:
    """The step's row of ``RENDER_RULES``: its own lines; else sliced or chunked as the fitting decided, its
    inline lines, its written lines, or the shape-free row (``codegen.STEP_TEXT``), over the step's context."""
    rule = RENDER_RULES.get(type(step))
    if rule is not None and rule.lines is not None:  # the step's own lines, never sliced nor chunked
        return rule.lines(cx, step)
    dtype = cx.record.dtypes[step.out]  # type: ignore[union-attr]
    read_as = np.dtype(dtype).name if not cx.dialect.numpy_types and isinstance(step, Elementwise) and \
        not isinstance(dtype, type) and np.dtype(dtype).kind in "fc" and cx.record.backend.holds(dtype) else None
    scale_dtype = dtype if isinstance(step, Contract) else None
    if scale_dtype is not None or read_as is not None:
        cx = replace(cx, scale_dtype=scale_dtype, read_as=read_as)
    fitted = fitted_lines(cx, step)  # sliced or chunked to fit the memory limit (einflow.engine.fitting)
    if fitted is not None:
        return fitted
    if rule is not None:
        if rule.inline is not None:
            inline = rule.inline(cx, step)
            if inline is not None:
                return inline
        if rule.written is not None:
            return rule.written(cx, step, cx.var(step.out))  # type: ignore[union-attr]
    return codegen.step_lines(cx, step)


def _returned(cx: RenderContext) -> list[str]:
    """The results, each in numpy's result type on every backend (torch sums uint8 into int64, dask an int8
    contraction into int64: brought back to the type the planner derived with numpy's rules)."""
    names = codegen.returned(cx)
    backend = cx.record.backend
    if backend.numpy_result_types:
        return names
    typed = []
    for name, register in zip(names, cx.lowered.outputs):
        dtype = cx.record.dtypes[register]
        if isinstance(dtype, type) or not backend.holds(dtype):
            typed.append(name)
        else:
            typed.append(codegen.astype(cx, name, np.dtype(dtype).name))
    return typed


def _window_text(cx: RenderContext, step: Window) -> str:
    """A shifted or gathered read: the backend's kernel (``einflow.engine.affine``) with its plan as literals."""
    record = cx.record
    spec = record.specs[step.out]
    if is_identity(spec, record.shapes[step.arg]) or step.out in record.convolved_windows:
        return cx.var(step.arg)  # the array itself (a convolution reads the window's array in place)
    helper = cx.alias.get("window") or "_window"
    cx.namespace[helper] = window_kernel(record.backend)
    gathers = "".join(f", {cx.var(g)}" for g in step.gathers)
    return f"{helper}({cx.var(step.arg)}, {spec!r}{gathers})"


def _floating_register(cx: RenderContext, register: int) -> bool:
    """Whether a register holds a numpy array of a floating type (not a weak Python number)."""
    dtype = cx.record.dtypes[register]
    return not isinstance(dtype, type) and np.dtype(dtype).kind == "f"


def _diagonal_add(cx: RenderContext, step: Diagonal, out: str, value: str) -> list[str]:
    """Adding into a large diagonal view with a short axis goes slice by slice along that axis: numpy cannot
    tell quickly that such a view (``H[p,q,r,q]``, strides of every size) does not overlap itself, and makes
    a copy of it for ``+=`` (measured: a third of the pairwise-energy Hessian's size for ``q`` of size 3)."""
    labels = diagonal_view_labels(step)
    full = cx.record.shapes[step.out]
    shape = tuple(full[step.output.index(label)] for label in labels)
    if len(shape) < 2 or math.prod(shape) < measure_rows.BLOCK_ELEMENTS or min(shape) > DIAGONAL_LOOP:
        return codegen.diagonal_add(cx, step, out, value)
    axis = shape.index(min(shape))
    np_ = cx.alias["np"]
    view, part, k = cx.fresh("_diagonal"), cx.fresh("_value"), cx.fresh("_k")
    cut = ":, " * axis + k
    return [f"{view} = {np_}.einsum({diagonal_spec(step)!r}, {out})",
            f"{part} = {np_}.broadcast_to({value}, {shape!r})",
            f"for {k} in range({shape[axis]}):",
            f"    {view}[{cut}] += {part}[{cut}]",
            f"del {view}, {part}"]


def _diagonal_lines(cx: RenderContext, step: Diagonal, out: str) -> list[str]:
    record, backend = cx.record, cx.record.backend
    value = codegen.diagonal_value(cx, step)
    if step.base is not None and backend.numpy_native:
        base = cx.var(step.base)
        if step.out in record.updated:  # the base is this step's alone: its diagonal is updated
            first = f"{out} = {base}"
        else:
            first = f"{out} = {cx.alias['np']}.broadcast_to({base}, {record.shapes[step.out]!r})" \
                    f".astype({str(record.dtypes[step.out])!r})"
        return [first, *_diagonal_add(cx, step, out, value)]
    if backend.numpy_native or not cx.dialect.strided_writes:
        return codegen.diagonal(cx, step, out)
    name = cx.fresh(f"_diagonal{step.out}")
    cx.namespace[name] = _diagonal_writer(backend, replace(step, labels=diagonal_view_labels(step)),
                                          record.shapes[step.out])
    written = f"{name}({codegen.diagonal_value(cx, step, True)})"
    return [f"{out} = {written}" if step.base is None else f"{out} = {cx.var(step.base)} + {written}"]


def _bounded_broadcast(cx: RenderContext, step: Elementwise) -> list[str]:
    """dask: the line rechunking the arrays an elementwise step broadcasts to a larger result (an outer
    product ``x[:, None] * y[None, :]``), so its blocks stay near its inputs' (dask_ops.broadcast_operands)."""
    reads: dict[int, set[tuple[str, ...]]] = {}
    elements = math.prod(cx.record.shapes[step.out])
    for arg in arg_nodes(step.expr):
        shape = cx.record.shapes[arg.register]
        if not shape or math.prod(shape) >= elements:
            continue
        if arg.axes is None:
            if len(shape) != len(step.labels):
                continue
            labels = tuple(step.labels)
        else:
            where = {axis: k for k, axis in enumerate(arg.axes) if axis is not None}
            if len(where) != len(shape):
                continue
            labels = tuple(step.labels[where[axis]] for axis in range(len(shape)))
        reads.setdefault(arg.register, set()).add(labels)
    if not reads:
        return []
    helper = cx.names.once.get("broadcast")
    if helper is None:
        from einflow.engine.backends.dask_ops import broadcast_operands

        helper = cx.names.once["broadcast"] = cx.fresh("_broadcast_operands")
        cx.namespace[helper] = broadcast_operands
    names = [cx.var(register) for register in reads]
    readings: tuple[tuple[tuple[str, ...], ...], ...] = tuple(tuple(sorted(found)) for found in reads.values())
    targets = ", ".join(names) + ("," if len(names) == 1 else "")
    return [f"{targets} = {helper}(({targets}), {readings!r}, {tuple(step.labels)!r})"]

def _normaliser_lines(cx: RenderContext, step: Reduce) -> list[str] | None:
    """A max-shifted softmax / log_softmax / logsumexp written out for a non-empty float numpy array, as the
    ``reduce`` helper computes it (a non-finite maximum shifts by 0) but without its generic checks, and
    with the exponentials taken in place; None elsewhere (the helper is called)."""
    dtype = cx.record.dtypes[step.arg]
    if not cx.record.backend.numpy_native or isinstance(dtype, type) or np.dtype(dtype).kind != "f" \
            or not math.prod(cx.record.shapes[step.arg]):
        return None
    np_, x, out = cx.alias["np"], cx.var(step.arg), cx.var(step.out)
    shift, work = cx.fresh("_shift"), cx.fresh("_e")
    axes = repr(step.axes)
    shape = cx.record.shapes[step.arg]
    if math.prod(size for k, size in enumerate(shape) if k not in step.axes) == 1:
        finite = cx.fresh("_isfinite")  # one maximum: a Python test, a fifth of a ufunc call's cost
        cx.namespace[finite] = math.isfinite
        test = f"{finite}({shift}.item())"
    else:
        test = f"{np_}.isfinite({shift}).all()"
    lines = [f"{shift} = {x}.max(axis={axes}, keepdims=True)",
             f"if not {test}:",
             f"    {shift} = {np_}.where({np_}.isfinite({shift}), {shift}, 0)",
             f"{work} = {x} - {shift}"]
    if step.kind == "softmax":
        lines += [f"{np_}.exp({work}, out={work})", f"{work} /= {work}.sum(axis={axes}, keepdims=True)",
                  f"{out} = {work}"]
    elif step.kind == "log_softmax":
        lines += [f"{work} -= {np_}.log({np_}.exp({work}).sum(axis={axes}, keepdims=True))", f"{out} = {work}"]
    else:
        lines += [f"{np_}.exp({work}, out={work})",
                  f"{out} = ({np_}.log({work}.sum(axis={axes}, keepdims=True)) + {shift}).squeeze(axis={axes})"]
    lines.append(f"del {shift}, {work}")
    return lines


def _diagonal_writer(backend: Backend, step: Diagonal, full_shape: tuple[int, ...]) -> Any:
    """A surviving delta on backends without strided writes (or with their own): one function per step (its
    ``labels``: the axes of the diagonal view, ``diagonal_view_labels``)."""
    view_shape = tuple(full_shape[step.output.index(label)] for label in step.labels)
    groups = [tuple(step.output.index(m) for m in next((g for g in step.groups if label in g), (label,)))
              for label in step.labels]
    if not backend.strided_writes:
        eyes = [(group[0], member) for group in step.groups for member in group[1:]]
        spec = einsum_equation([step.labels, *eyes], step.output, index_letters(step.labels, step.output))
        sizes = [full_shape[step.output.index(b)] for _, b in eyes]

        def write(value: Any) -> Any:
            return backend.xp.einsum(spec, value, *(backend.eye(size, bool) for size in sizes))

        return write

    def write_strided(value: Any) -> Any:
        out = backend.zeros(full_shape, value.dtype)
        strides = tuple(sum(out.strides[k] for k in group) for group in groups)
        backend.diagonal_view(out, view_shape, strides)[...] = value
        return out

    return write_strided


# ---------------------------------------------------------------------------------------------- render rules
# The steps whose rendering with shapes differs from the generic one (``rows.STEP_RULES``): their own lines
# (``lines``: replacing the generic rendering, never sliced nor chunked) and lines tried before the generic
# rendering once fitting leaves the step whole (``inline``).


def _free_lines(cx: RenderContext, step: Free) -> list[str]:
    # small arrays: releasing them early costs more time than it saves memory
    held = cx.fitting.held()  # read later, inside a loop computing an expression in blocks
    held |= {r for registers in cx.fitting.deferred.values() for r in registers}  # (released after it)
    big = [r for r in step.registers if math.prod(cx.record.shapes.get(r, ())) * cx.record.itemsize(r)
           >= RELEASE_BYTES and r not in held and r not in cx.fitting.windows]  # (windows: made per slice)
    return codegen.step_lines(cx, Free(step.statement, tuple(big))) if big else []


def _window_lines(cx: RenderContext, step: Window) -> list[str]:
    if step.out in cx.fitting.windows:  # made block by block by the sliced contraction reading it
        return []
    rows = cx.fitting.rows.get(step.out)
    if rows is not None:  # taken in blocks of rows, to fit the memory limit (einflow.engine.fitting)
        chunked, kernel = cx.fresh("_window_chunks"), cx.fresh("_window_kernel")
        cx.namespace[chunked], cx.namespace[kernel] = window_chunks, window_kernel(cx.record.backend)
        gathers = "".join(f", {cx.var(g)}" for g in step.gathers)
        return [f"{cx.var(step.out)} = {chunked}({kernel}, {cx.var(step.arg)}, "
                f"{cx.record.specs[step.out]!r}, {rows}{gathers})"]
    return [f"{cx.var(step.out)} = {_window_text(cx, step)}"]


def _scatter_lines(cx: RenderContext, step: Scatter) -> list[str]:
    if step.out in cx.record.convolved_scatters:  # computed whole by a transposed convolution
        return [f"{cx.var(step.out)} = {cx.var(step.arg)}"]
    spec = cx.record.specs[step.out]
    helper = cx.alias.get("scatter") or "_scatter"
    cx.namespace[helper] = scatter_kernel(cx.record.backend)
    gathers = "".join(f", {cx.var(g)}" for g in step.gathers)
    rows = cx.fitting.rows.get(step.out)
    if rows is not None:  # in chunks of the value's rows, to fit the memory limit (einflow.engine.fitting)
        chunked = cx.fresh("_scatter_chunks")
        cx.namespace[chunked] = scatter_chunks
        return [f"{cx.var(step.out)} = {chunked}({cx.var(step.arg)}, {spec!r}, {rows}{gathers})"]
    return [f"{cx.var(step.out)} = {helper}({cx.var(step.arg)}, {spec!r}{gathers})"]


def _reduce_inline(cx: RenderContext, step: Reduce) -> list[str] | None:
    if step.kind in ("softmax", "log_softmax", "logsumexp"):
        inline = _normaliser_lines(cx, step)
        if inline is not None:
            return inline
    if cx.record.backend.lazy and not math.prod(cx.record.shapes[step.out]) \
            and step.kind in ("max", "min", "argmax", "argmin"):
        # an empty result (its other axes are empty): dask's chunked max of empty blocks raises
        return [f"{cx.var(step.out)} = {cx.alias['np']}.zeros({cx.record.shapes[step.out]!r}, "
                f"dtype={np.dtype(cx.record.dtypes[step.out]).name!r})"]
    if cx.record.backend.numpy_native and (
            step.kind in ("max", "min") or step.kind == "mean" and _floating_register(cx, step.arg)):
        # the array's own method, as the ``reduce`` helper would call it, without the call through it
        return [f"{cx.var(step.out)} = {cx.var(step.arg)}.{step.kind}(axis={step.axes!r})"]
    return None


@dataclass(frozen=True)
class RenderRule:
    """One step kind as the render pass writes it with shapes: ``lines(cx, step)`` its own lines (None: sliced
    or chunked when it must fit, else ``inline``, ``written`` or the shape-free row); ``inline(cx, step)`` lines
    tried first once fitting leaves the step whole (None when they do not apply); ``written(cx, step, out)`` the
    statements computing it whole (``out`` the name of its result; None: the shape-free row,
    ``codegen.STEP_TEXT``)."""

    lines: Callable[[Any, Any], list[str]] | None = None
    inline: Callable[[Any, Any], list[str] | None] | None = None
    written: Callable[[Any, Any, str], list[str]] | None = None


RENDER_RULES: dict[type, RenderRule] = {
    Contract: RenderRule(written=lambda cx, step, out: [f"{out} = {contract_text(cx, step)}"]),
    Elementwise: RenderRule(written=lambda cx, step, out: [f"{out} = {elementwise_text(cx, step)}"]),
    Diagonal: RenderRule(written=_diagonal_lines),
    Reduce: RenderRule(inline=_reduce_inline),
    Window: RenderRule(lines=_window_lines),
    Scatter: RenderRule(lines=_scatter_lines),
    Free: RenderRule(lines=_free_lines),
}
