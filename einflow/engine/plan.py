"""Steps -> Plan: the lowered steps specialised for input shapes, dtypes and a backend, compiled once.

:func:`build_plan` runs the engine's passes over one signature, each reading what the one before made:

1. ``lower`` (:mod:`einflow.engine.lower`): the checked program as steps over registers;
2. ``specialise`` (:mod:`einflow.engine.specialise`): sizes checked, shapes and dtypes, contraction paths,
   the memory and FLOPs of each step, as one frozen record;
3. ``fit`` (:mod:`einflow.engine.fitting`): under a memory limit, what to slice or chunk, from the record;
4. ``render`` (:mod:`einflow.engine.render`): the record as one straight-line Python function, compiled;
5. ``report`` (:func:`report_steps`): the plan report's lines, from the same record and decisions.

The plan predicts the peak memory of a run from the record and the fitting (``Plan.peak_bytes``); a plan
over its memory limit is refused before anything is rendered or allocated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import opt_einsum as oe

from einflow.engine.backends.base import Backend
from einflow.engine.context import RenderContext
from einflow.engine.fitting import NO_FITTING, Fitting, Holders, fit
from einflow.engine.lower import computes_real, lower
from einflow.engine.measure import PLAN_RULES
from einflow.engine.memory import format_bytes
from einflow.engine.paths import PathChoice
from einflow.engine.render import render
from einflow.engine.rows import STEP_RULES, kind_of
from einflow.engine.specialise import Specialised, specialise
from einflow.engine.steps import Free, Lowered, Scatter, Step
from einflow.lang import ir
from einflow.lang.check import ProgramInfo
from einflow.lang.errors import EinflowError, MemoryLimitError
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import indices_in

__all__ = ["Plan", "PlanStep", "build_plan", "report_steps", "indices_in", "TEMPORARIES"]

# temporaries (in arrays of the argument's size, float64) that functions.py's value rules build besides
# their result; tests/test_speed_features.py measures them
TEMPORARIES: dict[str, float] = {name: rule.temporaries for name, rule in FUNCTION_RULES.items() if rule.temporaries}


@dataclass
class PlanStep:
    """One line of the plan report (one lowered step, specialised)."""

    statement: str
    kind: str
    equation: str
    flops: int
    shape: tuple[int, ...]
    itemsize: int
    pairwise: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    largest: int = 0  # elements of the largest intermediate inside this step
    path: PathChoice | None = None  # how a contraction's path was chosen (optimizer, seconds)
    #: the indices this step is sliced over to fit the memory limit (empty: run whole)
    sliced: tuple[str, ...] = ()
    #: how many slices (blocks of the sliced indices' values) the step runs, one after another
    slices: int = 1
    #: FLOPs of all slices over the FLOPs of the step run whole
    overhead: float = 1.0
    #: the step's array exists only chunk by chunk (an expression fused into the reduction that reads it)
    chunked: bool = False

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass
class Plan:
    """A program specialised for one signature: its steps, the generated function, the memory it needs."""

    lowered: Lowered
    backend: Backend
    steps: list[PlanStep]
    output_shapes: tuple[tuple[int, ...], ...]
    returns_tuple: bool
    #: the generated function's source (``function`` runs it)
    source: str
    function: Any
    #: bytes each step's result allocates (by register); views are in ``views`` instead
    allocations: dict[int, int] = field(default_factory=dict)
    #: register -> the register whose memory it shares (a transposed view)
    views: dict[int, int] = field(default_factory=dict)
    #: bytes alive only while a register is computed (intermediates inside a contraction or an expression)
    transients: dict[int, int] = field(default_factory=dict)
    #: what callers derive from this plan once and reuse (the torch bridge keeps its fused gradient plan here)
    derived: dict[Any, Any] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        """Predicted peak of the memory one run allocates: results and the intermediates alive at once.

        Each intermediate is released after its last use (a view keeps the array it views); inputs are
        the caller's and not counted.
        """
        return _peak(self.lowered.steps, self.allocations, self.transients, self.views)[0]

    def run(self, values: list[Any]) -> Any:
        try:
            return self.function(*values)
        except NotImplementedError as error:  # torch: clamp, sign, comparisons and max of complex tensors
            raise EinflowError(f"backend {self.backend.name!r} cannot compute this program for inputs of these "
                               f"dtypes: {error}") from None
        except (OverflowError, TypeError) as error:
            # numpy refusing a dtype (`-x` for uint8 x, sign of booleans) is the user's to fix, not a crash
            if not isinstance(error, OverflowError) and "ufunc" not in f"{type(error).__name__} {error}".lower() \
                    and "not supported" not in str(error):
                raise
            raise EinflowError(f"cannot compute this program for inputs of these dtypes: {error}; cast the inputs "
                               "(e.g. to float64) first") from None


def _peak(steps: tuple[Step, ...], allocations: Mapping[int, int], transients: Mapping[int, int],
          views: Mapping[int, int] | None = None) -> tuple[int, int]:
    """(peak bytes, the register being made at the peak); an array is released once it and its views are freed."""
    live = peak = 0
    at = -1
    holders = Holders(views or {})
    for step in steps:
        if isinstance(step, Free):
            live -= sum(allocations.get(register, 0) for register in holders.released(step.registers))
            continue
        holders.made(step.out)
        made = allocations.get(step.out, 0)
        if live + made + transients.get(step.out, 0) > peak:
            peak, at = live + made + transients.get(step.out, 0), step.out
        live += made
    return peak, at


def _check_optimize(optimize: Any) -> None:
    """``optimize=``: an opt_einsum path algorithm's name, True/False/None, a PathOptimizer or path function."""
    if optimize is None or isinstance(optimize, bool) or callable(optimize):
        return
    if isinstance(optimize, str):
        try:
            oe.paths.get_path_fn(optimize)
        except KeyError:
            names = ", ".join(repr(name) for name in sorted(oe.paths._PATH_OPTIONS))
            raise EinflowError(f"optimize={optimize!r} is not a path algorithm; valid options are {names}, "
                               "True/False, or an opt_einsum PathOptimizer") from None
        return
    if isinstance(optimize, (list, tuple)) and all(isinstance(step, (list, tuple)) for step in optimize):
        return  # an explicit contraction path
    raise EinflowError(f"optimize= must be a path algorithm's name (e.g. 'greedy', 'dp', 'optimal'), True/False, "
                       f"or an opt_einsum PathOptimizer, not {type(optimize).__name__}")


def build_plan(program: ir.ProgramIR, info: ProgramInfo, shapes: dict[str, tuple[int, ...]], itemsize: int,
               backend: Backend, optimize: Any = "auto", memory_limit: float | None = None,
               source: str | None = None, float_dtype: Any = None, dtypes: dict[str, Any] | None = None,
               slicing: bool = True) -> Plan:
    """Specialise a checked program's steps for concrete input shapes (and dtypes) on a backend.

    Over ``memory_limit`` (bytes), contractions are sliced and elementwise expressions reduced right away
    are computed in chunks (``einflow.engine.fitting``) unless ``slicing`` is False; a plan that still does not
    fit raises MemoryLimitError before anything is allocated.

    ``float_dtype`` (the inputs' floating type, if any) is the type of products made of deltas alone,
    so that a Hessian like ``2 delta[p,q]`` has the type of the ``x`` it was taken for. Without
    ``dtypes``, inputs are taken as arrays of ``itemsize``-byte floats.
    """
    _check_optimize(optimize)
    if dtypes is None:
        default = np.dtype(f"f{itemsize}") if itemsize in (2, 4, 8) else np.dtype("float64")
        dtypes = {name: default for name in info.inputs}
    lowered = lower(program, computes_real(program, dtypes))
    record = specialise(program, lowered, shapes, dtypes, backend, optimize, source, float_dtype)
    try:
        fitting = NO_FITTING if memory_limit is None else _fitted(record, memory_limit, slicing)
    except MemoryLimitError as over:
        if not record.convolutions or backend.native_convolution:
            raise
        # numpy's convolution kernel runs whole: over the limit, the same products as einsums, which may slice
        record = specialise(program, lowered, shapes, dtypes, backend, optimize, source, float_dtype, convolve=False)
        try:
            fitting = _fitted(record, memory_limit, slicing)
        except MemoryLimitError:
            raise over from None
    rendered = render(record, fitting)
    transients = dict(record.transients if fitting.transients is None else fitting.transients)
    allocations = {register: size for register, size in record.allocations.items() if register not in fitting.fused}
    views = {register: base for register, base in record.views.items()
             if not (register in fitting.fused and register in record.updated)}  # a fused diagonal is not made
    return Plan(lowered, backend, report_steps(record, fitting, rendered.names),
                tuple(record.shapes[o] for o in lowered.outputs), lowered.returns_tuple, rendered.source,
                rendered.function, allocations, views, transients)


def _fitted(record: Specialised, memory_limit: float, slicing: bool) -> Fitting:
    """What to slice or chunk to stay under ``memory_limit`` (MemoryLimitError when nothing will do)."""
    lowered, backend = record.lowered, record.backend
    peak, at = _peak(lowered.steps, record.allocations, record.transients, record.views)
    fitting = NO_FITTING
    if slicing and backend.slices and (peak > memory_limit or backend.lazy):
        fitting = fit(record, memory_limit)
        if fitting.transients is not None:  # some step sliced or chunked
            allocations = {r: size for r, size in record.allocations.items() if r not in fitting.fused}
            peak, at = _peak(lowered.steps, allocations, fitting.transients, record.views)
    if peak > memory_limit and not backend.lazy:
        statement = next((s.statement for s in lowered.steps if getattr(s, "out", None) == at), 0)
        shape = record.shapes.get(at, ())
        if not slicing:
            why = "slicing is off (slicing=False). "
        elif not backend.slices:
            why = f"the {backend.name} backend does not slice. "
        else:
            # the reason of the step at the peak first (an earlier step may be over only for what comes later)
            found = fitting.reasons.get(at) or next(iter(fitting.reasons.values()),
                                                    "slicing cannot lower the peak further")
            why = found + ". "
        raise MemoryLimitError(
            f"the plan needs {format_bytes(peak)} at its peak (while computing an array of shape {shape} in "
            f"statement '{lowered.statements[statement]}'), over the memory limit of {format_bytes(memory_limit)}; "
            f"nothing was allocated. {why[0].upper()}{why[1:]}Use backend='dask' to compute in chunks, try "
            "another optimize= choice, raise memory_limit=, or shrink the problem")
    return fitting if fitting.transients is not None else NO_FITTING


# ---------------------------------------------------------------------------------------------- report
def report_steps(record: Specialised, fitting: Fitting, names: RenderContext) -> list[PlanStep]:
    """The plan report's lines: each step of ``record`` as ``fitting`` runs it, its registers named as the
    rendered code (``names``) names them."""
    steps = []
    for step in record.lowered.steps:
        if not isinstance(step, Free):
            steps.append(_report_step(step, record, fitting, names))
    return steps


def _report_step(step: Step, record: Specialised, fitting: Fitting, names: RenderContext) -> PlanStep:
    out = step.out  # type: ignore[union-attr]
    shape = record.shapes[out]
    statement = record.lowered.statements[step.statement]
    size = record.itemsizes[out]
    kind = kind_of(step)  # the step's rows: its name and its note, as the code's comment reads them
    rule = PLAN_RULES[type(step)]
    text = STEP_RULES[type(step)].note(names, step).rstrip() if rule.describe is None else rule.describe(names, step)
    planned = record.contractions.get(out)
    if planned is None:
        reported = PlanStep(statement, kind, text, record.flops[out], shape, size)
    else:  # a contraction: its pairwise steps, largest intermediate and path
        reported = PlanStep(statement, kind, text, planned.flops, shape, size, list(planned.pairwise),
                            planned.largest, path=planned.choice)
    sliced = fitting.slicings.get(out)
    if sliced is not None:
        reported.flops, reported.largest = sliced.flops, sliced.largest
        reported.sliced = tuple(planned.names[label] for label in sliced.labels)  # type: ignore[union-attr]
        reported.slices, reported.overhead = sliced.slices, sliced.overhead
    for computed, (position, count, diagonals) in fitting.pieces.items():
        if out == computed:  # an expression computed in blocks into its whole result
            reported.sliced, reported.slices = (step.labels[position],), count  # type: ignore[union-attr]
        elif out in [diagonal.out for diagonal in diagonals]:  # a diagonal array made block by block
            reported.chunked, reported.largest = True, -(-math.prod(reported.shape) // count)
    rows = fitting.rows.get(out)
    if rows is not None:  # a scatter-add or a gathered window in blocks of rows (a scatter's value's)
        labels = getattr(step, "arg_labels", None) or step.labels  # type: ignore[union-attr]
        count = record.specs[out][1][0] if isinstance(step, Scatter) else shape[0]
        reported.sliced, reported.slices = (labels[0],), -(-count // rows)
    if out in fitting.windows:  # made block by block inside the slices of the contraction reading it
        reported.chunked, reported.largest = True, 0
    for reduced, (source, position, count) in fitting.chunks.items():
        if out in (reduced, source.out):  # a fused expression and its reduction, chunk by chunk
            reported.sliced, reported.slices = (source.labels[position],), count
            if out == source.out:
                reported.chunked, reported.largest = True, -(-math.prod(reported.shape) // count)
    return reported
