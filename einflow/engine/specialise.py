"""Specialise: the lowered steps sized, typed, planned and measured for one signature, as one frozen record.

For one (program, backend, shapes, dtypes) signature :func:`specialise` checks every statement's index sizes
(ShapeError otherwise), gives each register its shape and dtype (the dtype by running the step's generic code
on one-element arrays), plans each contraction pairwise (opt_einsum, :mod:`einflow.engine.paths`) and
measures the memory of each step: the bytes its result allocates, the arrays it views, and the temporaries
alive while it is computed, a fused expression computed block by block (:mod:`einflow.engine.blocks`)
included. The result, :class:`Specialised`, is read, never changed, by the passes after it: ``fit``
(:mod:`einflow.engine.fitting`: what to slice or chunk under a memory limit), ``render``
(:mod:`einflow.engine.render`: the generated code) and the plan report (:mod:`einflow.engine.plan`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from einflow.engine.backends.base import Backend
from einflow.engine.convolution import (
    convolution_kernel,
)
from einflow.engine.measure import (
    BLOCK_ELEMENTS,
    NP,
    OPS,
    PLAN_RULES,
    BlockPlan,
    Builder,
    ContractionPlan,
    ExpressionPlan,
    common_dtype,
    one_float_type,
)
from einflow.engine.steps import (
    Arg,
    Elementwise,
    Free,
    Inferred,
    Lowered,
    SizeRef,
    Step,
)
from einflow.lang import ir
from einflow.lang.errors import ShapeError
from einflow.lang.indices import declared_sizes, statement_sizes

__all__ = ["Specialised", "ContractionPlan", "ExpressionPlan", "BlockPlan", "specialise", "PLAN_RULES",
           "common_dtype", "one_float_type", "BLOCK_ELEMENTS", "NP", "OPS"]

#: numpy's (and torch's) most axes of one array
MAX_AXES = 64
@dataclass(frozen=True)
class Specialised:
    """The steps of one signature: shapes, dtypes, contraction paths, memory and FLOPs per register.

    Made once by :func:`specialise`; the passes after it (fit, render, report) only read it.
    """

    lowered: Lowered
    backend: Backend
    #: the inputs' floating type, if any (the type of products made of deltas alone)
    float_dtype: Any
    shapes: Mapping[int, tuple[int, ...]]
    #: register -> numpy dtype, or ``int`` / ``float`` for a weak Python number
    dtypes: Mapping[int, Any]
    #: (statement, index) -> its size, as each statement's check found it (shifted reads size some)
    inferred: Mapping[tuple[int, str], int]
    #: register -> bytes of one element (8 for a weak Python number)
    itemsizes: Mapping[int, int]
    #: registers holding booleans
    booleans: frozenset[int]
    #: the names the generated code may not give its own variables (``codegen.taken_names``)
    taken: frozenset[str]
    #: register -> the order its axes are stored in, when that is not their order (torch: a transposed view)
    orders: Mapping[int, tuple[int, ...]]
    contractions: Mapping[int, ContractionPlan]
    expressions: Mapping[int, ExpressionPlan]
    #: Window and Scatter steps' plans (``einflow.engine.affine``)
    specs: Mapping[int, Any]
    #: register -> the plan report's FLOPs of its step (run whole)
    flops: Mapping[int, int]
    #: register -> bytes its step allocates, run whole (views are in ``views`` instead)
    allocations: Mapping[int, int]
    #: register -> the register whose memory it shares (a transposed view, a window, an updated diagonal)
    views: Mapping[int, int]
    #: register -> the register whose array a diagonal step updates in place
    updated: Mapping[int, int]
    #: register -> bytes alive only while it is computed, run whole (intermediates, temporaries, blocks)
    transients: Mapping[int, int]
    #: contraction register -> (the native convolution computing it, its operands), on backends that have them
    #: (``einflow.engine.convolution``); the windows they read in place and the scatters they compute whole
    convolutions: Mapping[int, tuple[Any, tuple[int, ...]]]
    convolved_windows: frozenset[int]
    convolved_scatters: frozenset[int]
    #: windows that are strided views (of their array or of its padded copy): a kernel copies them to reshape
    strided_windows: frozenset[int] = frozenset()

    def itemsize(self, register: int) -> int:
        return self.itemsizes[register]

    def nbytes(self, register: int) -> int:
        return math.prod(self.shapes[register]) * self.itemsizes[register]

    def resolve(self, ref: SizeRef) -> int:
        if isinstance(ref, Inferred):
            return self.inferred[(ref.statement, ref.index)]
        return ref if isinstance(ref, int) else self.shapes[ref[0]][ref[1]]


def specialise(program: ir.ProgramIR, lowered: Lowered, shapes: dict[str, tuple[int, ...]],
               dtypes: dict[str, Any], backend: Backend, optimize: Any, source: str | None,
               float_dtype: Any, convolve: bool = True) -> Specialised:
    """The record of ``lowered`` (lowered from ``program``) for these input shapes and dtypes on ``backend``.
    ``convolve=False`` contracts windows as einsums (sliceable) even where the backend has a convolution kernel.

    First every statement's sizes are checked and each register gets its shape and dtype; then each step
    is planned and measured in order (its row of ``PLAN_RULES``).
    """
    builder = Builder(lowered, shapes, dtypes, backend, optimize, float_dtype)
    builder.convolve = convolve and convolution_kernel(backend) is not None
    _check(builder, program, shapes, source)
    for step in lowered.steps:
        if not isinstance(step, Free):
            measure = PLAN_RULES[type(step)].measure
            if measure is not None:
                measure(builder, step)
    return _record(builder)


def _check(builder: Builder, program: ir.ProgramIR, shapes: dict[str, tuple[int, ...]], source: str | None) -> None:
    """Every statement's sizes agree (ShapeError otherwise); each register gets its shape and dtype."""
    tensors = dict(shapes)
    declared: dict[str, tuple[int, str]] = {}
    bindings = {statement: (target, register) for statement, target, register in builder.lowered.bindings}
    steps = list(builder.lowered.steps)
    position = 0
    for number, statement in enumerate(program.statements):
        if isinstance(statement, ir.SizeDecl):
            declared.update(declared_sizes(statement, tensors, source))
        elif isinstance(statement, ir.Assign):
            sizes = statement_sizes(statement, tensors, declared, source)
            builder.inferred.update(((number, index), size) for index, size in sizes.items())
        while position < len(steps) and steps[position].statement == number:
            _type_step(builder, steps[position])
            position += 1
        if number in bindings:
            target, register = bindings[number]
            tensors[target] = builder.shape[register] if register is not None else ()
        elif isinstance(statement, ir.Assign) and statement.target is not None and statement.indices is not None:
            # computed inside the statements that read it (einflow.engine.solving): its shape from its sizes
            tensors[statement.target] = tuple(sizes[index] for index in statement.indices)


def _type_step(builder: Builder, step: Step) -> None:
    """The step's result's shape (checked) and dtype."""
    if isinstance(step, Free):
        return
    rule = PLAN_RULES[type(step)]
    if rule.shape is not None:
        builder.shape[step.out] = rule.shape(builder, step)
    else:
        sizes = step.sizes  # type: ignore[union-attr]
        builder.shape[step.out] = tuple(builder.resolve(ref) for ref in sizes)
        if len(sizes) > MAX_AXES:
            text = builder.lowered.statements[step.statement]
            text = text if len(text) <= 80 else text[:77] + "..."
            labels = ", ".join(getattr(step, "labels", getattr(step, "output", ()))[:4])
            raise ShapeError(f"statement {text!r} needs an array of {len(sizes)} axes (indices {labels}, "
                             f"...) at once; arrays have at most {MAX_AXES}: split the statement so that each "
                             "part keeps fewer indices")
    if rule.check is not None:
        rule.check(builder, step)
    builder.dtype[step.out] = rule.dtype(builder, step)
    if builder.dtype[step.out] == np.dtype(bool):
        builder.booleans.add(step.out)


def _record(builder: Builder) -> Specialised:
    allocations: dict[int, int] = {}
    views: dict[int, int] = {}
    flops: dict[int, int] = {}
    for step in builder.lowered.steps:
        if isinstance(step, Free):
            continue
        out = step.out
        flops[out] = PLAN_RULES[type(step)].count(builder, step)
        if isinstance(step, Elementwise) and isinstance(step.expr, Arg):
            views[out] = step.expr.register
        elif out in builder.updated:
            views[out] = builder.updated[out]
        elif out in builder.window_views:
            views[out] = builder.window_views[out]
        else:
            allocations[out] = builder.sized.get(out, math.prod(builder.shape[out]) * builder.itemsize(out))
    itemsizes = {register: 8 if isinstance(dtype, type) else np.dtype(dtype).itemsize
                 for register, dtype in builder.dtype.items()}
    frozen = MappingProxyType  # read-only views: the passes after this one read the record, never write it
    return Specialised(builder.lowered, builder.backend, builder.float_dtype, frozen(builder.shape),
                       frozen(builder.dtype), frozen(builder.inferred), frozen(itemsizes), frozenset(builder.booleans),
                       frozenset(builder.taken),
                       frozen(builder.orders), frozen(builder.contractions), frozen(builder.expressions),
                       frozen(builder.specs), frozen(flops), frozen(allocations), frozen(views),
                       frozen(builder.updated), frozen(builder.transient), frozen(builder.convolutions),
                       frozenset(builder.convolved_windows), frozenset(builder.convolved_scatters),
                       frozenset(builder.strided_windows))

