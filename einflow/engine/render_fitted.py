"""Render the steps the fitting slices or chunks (:mod:`einflow.engine.fitting` decided which, and how).

A sliced contraction becomes a loop over a table of slices, each computed by a kernel for its block shape
(on dask: one task per slice); an elementwise expression reduced right away is computed chunk by chunk inside
its reduction; another large expression is computed block by block into its whole result, with the diagonal
arrays it alone reads made block by block in the same loop. Mixed into :class:`einflow.engine.render.Renderer`.
"""

from __future__ import annotations

import math
from typing import Any

import opt_einsum as oe

from einflow.engine.affine import window_kernel
from einflow.engine.fitting import COMBINE, NORMALISERS, Fitting, slice_axes
from einflow.engine.slicing import SliceKernel, slice_table, window_block
from einflow.engine.steps import Contract, Diagonal, Elementwise, Reduce, Step, Window, node_args
from einflow.lang.indices import einsum_equation, index_letters

__all__ = ["FittedRenderer"]


class FittedRenderer:
    """Renders sliced contractions and chunked expressions and reductions (mixed into the renderer)."""

    fitting: Fitting

    def fitted_lines(self: Any, step: Step) -> list[str] | None:
        """The lines of a step the fitting slices or chunks, or None to render it as usual."""
        if isinstance(step, Contract) and step.out in self.fitting.budgets:
            text = self.contract(step)
            return self.sliced_contract(step) or [f"{self.var(step.out)} = {text}"]
        if isinstance(step, (Elementwise, Diagonal)) and step.out in self.fitting.fused:
            return []
        if isinstance(step, Elementwise) and step.out in self.fitting.pieces:
            return self.chunked_elementwise(step)
        if isinstance(step, Reduce) and step.out in self.fitting.chunks:
            return self.chunked_reduce(step)
        return None

    def sliced_contract(self: Any, step: Contract) -> list[str] | None:
        slicing = self.fitting.slicings.get(step.out)
        if slicing is None:  # slicing cannot help, or it needs none
            return None
        planned = self.record.contractions[step.out]
        equation, shapes, path, info = planned.equation, planned.shapes, planned.path, planned.info
        dask = self.backend.lazy
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
        operands = ", ".join((self.window_block(r, f"{parts}[{k}]") if r in self.fitting.windows else
                              f"{self.var(r)}[{parts}[{k}]]" if step.operands[k] else self.var(r))
                             + (f".astype({str(common)!r})" if casts[k] else "") for k, r in enumerate(step.args))
        allocate, write = ("zeros", "+=") if slicing.accumulates else ("empty", "=")
        lines = [f"{out} = {np_}.{allocate}({shape!r}, dtype={dtype!r})",
                 f"for {at}, {parts}, {kernel} in {name}:",
                 f"    {out}[{at}] {write} {kernel}({operands})"]
        lines += [f"{out} *= {self.node(factor)[0]}" for factor in step.scale]
        return lines

    def window_block(self: Any, register: int, index: str) -> str:
        """The text making one slice's block ``index`` of a gathered window the fitting fused into the slices."""
        window = next(step for step in self.lowered.steps if isinstance(step, Window) and step.out == register)
        helper = self.fresh("_window_block")
        self.namespace[helper] = window_block
        kernel = self.fresh("_window_kernel")
        self.namespace[kernel] = window_kernel(self.backend)
        gathers = "".join(f", {self.var(g)}" for g in window.gathers)
        return f"{helper}({kernel}, {self.var(window.arg)}, {self.record.specs[register]!r}, {index}{gathers})"

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
        axes = slice_axes(step.expr, position, ranks) or {}
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
        return lines

    def diagonal_block(self: Any, step: Diagonal, view: str, axis: int, start: str, block: int,
                       size: int) -> list[str]:
        """Lines making ``view``: the block ``start:start + block`` along ``axis`` of a diagonal step's array."""
        np_ = self.alias["np"]
        label = step.output[axis]
        value = f"{self.var(step.arg)}[{':, ' * step.labels.index(label)}{start}:{start} + {block}]"
        dims = [f"min({block}, {size} - {start})" if k == axis else str(n) for k, n in enumerate(self.shape[step.out])]
        representative = {member: group[0] for group in step.groups for member in group}
        spec = einsum_equation([(representative.get(name, name) for name in step.output)], step.labels,
                               index_letters(step.labels))
        return [f"    {view} = {np_}.zeros(({', '.join(dims)},), dtype={self.var(step.arg)}.dtype)",
                f"    {np_}.einsum({spec!r}, {view})[...] = {value}"]

    def chunked_reduce(self: Any, step: Reduce) -> list[str]:
        lines = self.chunked_reduce_lines(step)
        released = [self.vars[r] for r in self.fitting.deferred.get(step.out, ()) if r in self.vars]
        return lines + ([f"del {', '.join(dict.fromkeys(released))}"] if released else [])

    def chunked_reduce_lines(self: Any, step: Reduce) -> list[str]:
        source, position, count = self.fitting.chunks[step.out]
        size = self.shape[source.out][position]
        block = -(-size // count)
        kept = position if step.kind in NORMALISERS else position - sum(1 for a in step.axes if a < position)
        ranks = {register: len(self.shape.get(register, ())) for register in node_args(source.expr)}
        axes = slice_axes(source.expr, position, ranks) or {}
        out, np_ = self.var(step.out), self.alias["np"]
        start, chunk = self.fresh("_start"), self.fresh(f"_chunk{step.out}")
        lines = [f"{out} = {np_}.empty({self.shape[step.out]!r}, dtype={str(self.dtype[step.out])!r})",
                 f"for {start} in range(0, {size}, {block}):"]
        views = {}
        for register, axis in sorted(axes.items()):
            view = views[register] = self.fresh(f"_part{register}")
            lines.append(f"    {view} = {self.var(register)}[{':, ' * axis}{start}:{start} + {block}]")
        text = self.chunk_text(source, views)
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
        return lines


class _Kernel:
    """A contract expression for one block shape, on a backend (cupy): ``kernel(*operands)``."""

    def __init__(self, expression: Any, backend: str) -> None:
        self.expression, self.backend = expression, backend

    def __call__(self, *operands: Any) -> Any:
        return self.expression(*operands, backend=self.backend)
