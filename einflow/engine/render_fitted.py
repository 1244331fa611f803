"""Render the steps the fitting slices or chunks (:mod:`einflow.engine.fitting` decided which, and how).

A sliced contraction becomes a loop over a table of slices, each computed by a kernel for its block shape
(on dask: one task per slice); an elementwise expression reduced right away is computed chunk by chunk inside
its reduction; another large expression is computed block by block into its whole result, with the diagonal
arrays it alone reads made block by block in the same loop. Functions of the rendering's context and the step,
read by :mod:`einflow.engine.render` before a step's other rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import opt_einsum as oe

from einflow.engine import codegen
from einflow.engine.affine import window_kernel
from einflow.engine.context import RenderContext
from einflow.engine.fitting import COMBINE, NORMALISERS, slice_axes
from einflow.engine.measure import common_dtype
from einflow.engine.render_steps import contract_text, elementwise_text
from einflow.engine.slicing import SliceKernel, slice_table, window_block
from einflow.engine.steps import Contract, Diagonal, Elementwise, Reduce, Step, Window, node_args
from einflow.lang.indices import einsum_equation, index_letters

__all__ = ["fitted_lines", "FITTED_RULES"]


def _fitted_contract(cx: RenderContext, step: Contract) -> list[str] | None:
    if step.out not in cx.fitting.budgets:
        return None
    text = contract_text(cx, step)
    return _sliced_contract(cx, step) or [f"{cx.var(step.out)} = {text}"]


def _fitted_elementwise(cx: RenderContext, step: Elementwise) -> list[str] | None:
    if step.out in cx.fitting.fused:  # computed inside the chunked reduction reading it
        return []
    if step.out in cx.fitting.pieces:
        return _chunked_elementwise(cx, step)
    return None


def _fitted_diagonal(cx: RenderContext, step: Diagonal) -> list[str] | None:
    return [] if step.out in cx.fitting.fused else None  # made block by block by its reader


def _fitted_reduce(cx: RenderContext, step: Reduce) -> list[str] | None:
    return _chunked_reduce(cx, step) if step.out in cx.fitting.chunks else None


#: one row per step kind the fitting may slice or chunk: (cx, step) -> its lines, or None (as usual)
FITTED_RULES: dict[type, Callable[[Any, Any], list[str] | None]] = {
    Contract: _fitted_contract, Elementwise: _fitted_elementwise, Diagonal: _fitted_diagonal, Reduce: _fitted_reduce,
}


def fitted_lines(cx: RenderContext, step: Step) -> list[str] | None:
    """The lines of a step the fitting slices or chunks (its row of ``FITTED_RULES``), or None to render it as
    usual."""
    rule = FITTED_RULES.get(type(step))
    return None if rule is None else rule(cx, step)


def _sliced_contract(cx: RenderContext, step: Contract) -> list[str] | None:
    slicing = cx.fitting.slicings.get(step.out)
    if slicing is None:  # slicing cannot help, or it needs none
        return None
    planned = cx.record.contractions[step.out]
    equation, shapes, path, info = planned.equation, planned.shapes, planned.path, planned.info
    dask = cx.record.backend.lazy
    kernels: dict[Any, Any] = {}
    table = []
    for where, index, cut in slice_table(equation, shapes, slicing):
        found = kernels.get(cut)
        if found is None:
            if not cx.record.backend.numpy_native and not cx.record.backend.lazy:  # cupy: its own arrays
                expression = oe.contract_expression(equation, *cut, optimize=path)
                found = _Kernel(expression, cx.record.backend.einsum_backend)
            else:  # numpy, and each dask task computes its slice with numpy
                found = SliceKernel(equation, cut, info.contraction_list)
            kernels[cut] = found
        table.append((where, index, found))
    name = cx.fresh(f"_slices{step.out}")
    cx.namespace[name] = table
    out = cx.var(step.out)
    np_ = cx.alias["np"]
    dtype = str(cx.record.dtypes[step.out])
    common = common_dtype(cx.record.dtypes, step) if len(step.args) > 2 or step.scale else None
    casts = [common is not None and not isinstance(cx.record.dtypes[r], type) and cx.record.dtypes[r] != common
             for r in step.args]
    shape = cx.record.shapes[step.out]
    if dask:
        helper = cx.fresh(f"_sliced{step.out}")
        cx.namespace[helper] = cx.record.backend.sliced_contraction
        operands = ", ".join(cx.var(r) for r in step.args)
        cast = repr(str(common)) if any(casts) else None
        lines = [f"{out} = {helper}({name}, ({operands},), {shape!r}, {dtype!r}, {slicing.accumulates!r}, "
                 f"{cast})"]
        lines += [f"{out} = {out} * {codegen.node_text(cx, factor)[0]}" for factor in step.scale]
        return lines
    at, parts, kernel = cx.fresh("_at"), cx.fresh("_parts"), cx.fresh("_kernel")
    # (each operand in the axis order the plan reads it in, the order it is stored in: see the equation)
    stored = [cx.var(r) if order == tuple(range(len(order))) else f"{cx.var(r)}.transpose({order})"
              for r, order in zip(step.args, planned.orders)]
    operands = ", ".join((_window_block_text(cx, r, f"{parts}[{k}]") if r in cx.fitting.windows else
                          f"{stored[k]}[{parts}[{k}]]" if step.operands[k] else stored[k])
                         + (f".astype({str(common)!r})" if casts[k] else "") for k, r in enumerate(step.args))
    allocate, write = ("zeros", "+=") if slicing.accumulates else ("empty", "=")
    lines = [f"{out} = {np_}.{allocate}({shape!r}, dtype={dtype!r})",
             f"for {at}, {parts}, {kernel} in {name}:",
             f"    {out}[{at}] {write} {kernel}({operands})"]
    lines += [f"{out} *= {codegen.node_text(cx, factor)[0]}" for factor in step.scale]
    return lines

def _window_block_text(cx: RenderContext, register: int, index: str) -> str:
    """The text making one slice's block ``index`` of a gathered window the fitting fused into the slices."""
    window = next(step for step in cx.lowered.steps if isinstance(step, Window) and step.out == register)
    helper = cx.fresh("_window_block")
    cx.namespace[helper] = window_block
    kernel = cx.fresh("_window_kernel")
    cx.namespace[kernel] = window_kernel(cx.record.backend)
    gathers = "".join(f", {cx.var(g)}" for g in window.gathers)
    return f"{helper}({kernel}, {cx.var(window.arg)}, {cx.record.specs[register]!r}, {index}{gathers})"

def _chunk_text(cx: RenderContext, step: Elementwise, views: dict[int, str]) -> str:
    """The expression of ``step`` for one chunk: the registers in ``views`` read through their chunk's name."""
    return elementwise_text(replace(cx, views=views), step)

def _chunked_elementwise(cx: RenderContext, step: Elementwise) -> list[str]:
    """The expression computed in blocks of one index into its whole result; the diagonal arrays it reads
    are made block by block in the loop (zeros, the values written on the diagonal's strided view)."""
    position, count, diagonals = cx.fitting.pieces[step.out]
    shape = cx.record.shapes[step.out]
    size = shape[position]
    block = -(-size // count)
    ranks = {register: len(cx.record.shapes.get(register, ())) for register in node_args(step.expr)}
    axes = slice_axes(step.expr, position, ranks) or {}
    made = {diagonal.out: diagonal for diagonal in diagonals}
    out, np_ = cx.var(step.out), cx.alias["np"]
    start = cx.fresh("_start")
    lines = [f"{out} = {np_}.empty({shape!r}, dtype={str(cx.record.dtypes[step.out])!r})",
             f"for {start} in range(0, {size}, {block}):"]
    cut = f"{start}:{start} + {block}"
    views = {}
    for register, axis in sorted(axes.items()):
        view = views[register] = cx.fresh(f"_part{register}")
        diagonal = made.get(register)
        if diagonal is None:
            lines.append(f"    {view} = {cx.var(register)}[{':, ' * axis}{cut}]")
        else:
            lines += _diagonal_block(cx, diagonal, view, axis, start, block, size)
    text = _chunk_text(cx, step, views)
    lines.append(f"    {out}[{':, ' * position}{cut}] = {text}")
    if diagonals:
        lines.append(f"del {', '.join(dict.fromkeys(cx.var(d.arg) for d in diagonals))}")
    return lines

def _diagonal_block(cx: RenderContext, step: Diagonal, view: str, axis: int, start: str, block: int,
                   size: int) -> list[str]:
    """Lines making ``view``: the block ``start:start + block`` along ``axis`` of a diagonal step's array."""
    np_ = cx.alias["np"]
    label = step.output[axis]
    value = f"{cx.var(step.arg)}[{':, ' * step.labels.index(label)}{start}:{start} + {block}]"
    dims = [f"min({block}, {size} - {start})" if k == axis else str(n)
            for k, n in enumerate(cx.record.shapes[step.out])]
    representative = {member: group[0] for group in step.groups for member in group}
    spec = einsum_equation([(representative.get(name, name) for name in step.output)], step.labels,
                           index_letters(step.labels))
    return [f"    {view} = {np_}.zeros(({', '.join(dims)},), dtype={cx.var(step.arg)}.dtype)",
            f"    {np_}.einsum({spec!r}, {view})[...] = {value}"]

def _chunked_reduce(cx: RenderContext, step: Reduce) -> list[str]:
    lines = _chunked_reduce_lines(cx, step)
    released = [cx.names.vars[r] for r in cx.fitting.deferred.get(step.out, ()) if r in cx.names.vars]
    return lines + ([f"del {', '.join(dict.fromkeys(released))}"] if released else [])

def _chunked_reduce_lines(cx: RenderContext, step: Reduce) -> list[str]:
    source, position, count = cx.fitting.chunks[step.out]
    size = cx.record.shapes[source.out][position]
    block = -(-size // count)
    kept = position if step.kind in NORMALISERS else position - sum(1 for a in step.axes if a < position)
    ranks = {register: len(cx.record.shapes.get(register, ())) for register in node_args(source.expr)}
    axes = slice_axes(source.expr, position, ranks) or {}
    out, np_ = cx.var(step.out), cx.alias["np"]
    start, chunk = cx.fresh("_start"), cx.fresh(f"_chunk{step.out}")
    lines = [f"{out} = {np_}.empty({cx.record.shapes[step.out]!r}, dtype={str(cx.record.dtypes[step.out])!r})",
             f"for {start} in range(0, {size}, {block}):"]
    views = {}
    for register, axis in sorted(axes.items()):
        view = views[register] = cx.fresh(f"_part{register}")
        lines.append(f"    {view} = {cx.var(register)}[{':, ' * axis}{start}:{start} + {block}]")
    text = _chunk_text(cx, source, views)
    combined = position in step.axes  # a reduced index: partial results combine
    kind = "sum" if step.kind == "mean" and combined else step.kind
    if kind == "sum":
        reduced = codegen.reduce(cx, chunk, step.axes)
    else:
        reduced = f"{cx.helper('reduce')}({kind!r}, {chunk}, {step.axes!r})"
    if not combined:
        lines += [f"    {chunk} = {text}",
                  f"    {out}[{':, ' * kept}{start}:{start} + {block}] = {reduced}",
                  f"    del {chunk}"]
        return lines
    part = cx.fresh(f"_partial{step.out}")
    merge = COMBINE[step.kind].format(a=out, b=part, np=np_)
    lines[0] = f"{out} = None"
    lines += [f"    {chunk} = {text}",
              f"    {part} = {reduced}",
              f"    del {chunk}",
              f"    {out} = {part} if {out} is None else {merge}"]
    if step.kind == "mean":
        count = math.prod(cx.record.shapes[source.out][axis] for axis in step.axes)
        lines.append(f"{out} = {cx.helper('as_float')}({out}) / {count}")
    return lines


class _Kernel:
    """A contract expression for one block shape, on a backend (cupy): ``kernel(*operands)``."""

    def __init__(self, expression: Any, backend: str) -> None:
        self.expression, self.backend = expression, backend

    def __call__(self, *operands: Any) -> Any:
        return self.expression(*operands, backend=self.backend)
