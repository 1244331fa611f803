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

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import opt_einsum as oe

from einflow.engine.affine import (
    is_identity,
    is_view,
    plain_positions,
    scatter_spec,
    scatter_temporaries,
    window_spec,
    window_temporaries,
)
from einflow.engine.backends.base import Backend
from einflow.engine.blocks import block_rows, render_kernel, threads_for
from einflow.engine.codegen import (
    Source,
    _args_in_order,
    _describe,
    _operations,
    _temporaries,
    diagonal_view_labels,
    helpers,
    taken_names,
)
from einflow.engine.convolution import (
    convolution_kernel,
    numpy_convolution_bytes,
    numpy_convolves,
    scatter_convolution,
    sole_reader,
    window_convolution,
)
from einflow.engine.kernels import contraction_steps
from einflow.engine.linalg import (
    CHECK_KINDS,
    is_linalg,
    linalg_dtype,
    linalg_flops,
    linalg_result_dtype,
    linalg_workspace,
    solve_flops,
    solve_workspace,
)
from einflow.engine.paths import PathChoice, choose_path
from einflow.engine.steps import (
    Add,
    Arg,
    Constant,
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Inferred,
    Lowered,
    Mul,
    Node,
    Number,
    Ones,
    Reduce,
    Scatter,
    Size,
    SizeRef,
    Solve,
    Step,
    Window,
    arg_nodes,
    node_args,
    step_inputs,
)
from einflow.lang import ir
from einflow.lang.errors import EinflowError, ShapeError
from einflow.lang.indices import declared_sizes, statement_sizes
from einflow.lang.numbers import _is_unit

__all__ = ["Specialised", "ContractionPlan", "ExpressionPlan", "BlockPlan", "specialise", "PLAN_RULES",
           "common_dtype", "one_float_type"]

#: numpy's (and torch's) most axes of one array
MAX_AXES = 64
#: fused elementwise work on at least this many elements is computed block by block (numpy backend, float
#: inputs, ``einflow.engine.blocks``); smaller work is one numpy expression (a block's setup costs ~20 us)
BLOCK_ELEMENTS = 1 << 16
#: in fused elementwise work on at least this many elements, a product's small factors are multiplied first
HOIST_ELEMENTS = 1 << 16
#: a product's factors that together vary along at most 1/HOIST_SHARE of its elements are multiplied first
HOIST_SHARE = 8
#: the array module's and torch_ops' names in a contraction's text until the render pass names them
NP, OPS = "\x00np", "\x00ops"


@dataclass(frozen=True)
class ContractionPlan:
    """A contraction planned pairwise: the einsum equation over its operands (each in ``orders``' axis order),
    opt_einsum's path and PathInfo, the letters' index names and what the plan report shows of it."""

    equation: str
    shapes: tuple[tuple[int, ...], ...]
    path: Any
    info: Any
    #: letter -> index name
    names: Mapping[str, str]
    choice: PathChoice
    #: opt_einsum's FLOP count of the whole contraction
    flops: int
    #: (readable pairwise step, its FLOPs, its result's shape) for each pairwise step
    pairwise: tuple[tuple[str, int, tuple[int, ...]], ...]
    #: elements of the largest intermediate
    largest: int
    #: each operand's axes in the order they are read (torch: the order they are stored in)
    orders: tuple[tuple[int, ...], ...]
    #: torch, operands and result of one floating type: products of intermediates may be made in place
    in_place: bool
    #: backends with pairwise kernels: the contraction's text (``einflow.engine.kernels``) with the operands as
    #: ``{0}``, ``{1}``, ..., the scale as ``{scale}``, the array module as ``NP`` and torch_ops as ``OPS``,
    #: for the render pass to fill in with its names (None on other backends)
    text: str | None
    #: whether that text makes a new array (torch may then scale it in place)
    fresh: bool


@dataclass(frozen=True)
class BlockPlan:
    """A fused expression computed block by block (``einflow.engine.blocks``): ``rows`` rows per block on
    ``threads`` threads, each with ``buffers`` scratch blocks; ``sliced``: per kernel operand, whether it is
    cut along the result's first axis."""

    rows: int
    threads: int
    buffers: int
    sliced: tuple[bool, ...]


@dataclass(frozen=True)
class ExpressionPlan:
    """An elementwise step as it is computed: its expression with small factors multiplied first (``hoisted``:
    those products), the bytes of its temporaries as one numpy expression, and its blocks (None: one
    expression)."""

    expr: Node
    hoisted: tuple[Node, ...]
    temporaries: int
    blocks: BlockPlan | None


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
    builder = _Specialising(lowered, shapes, dtypes, backend, optimize, float_dtype)
    builder.convolve = convolve and convolution_kernel(backend) is not None
    builder.check(program, shapes, source)
    for step in lowered.steps:
        if not isinstance(step, Free):
            measure = PLAN_RULES[type(step)].measure
            if measure is not None:
                measure(builder, step)
    return builder.record()


class _Specialising:
    """What :func:`specialise` builds, step by step, before it is frozen into the record."""

    def __init__(self, lowered: Lowered, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any],
                 backend: Backend, optimize: Any, float_dtype: Any) -> None:
        self.lowered = lowered
        self.backend = backend
        self.target = backend.target
        self.optimize = optimize
        self.float_dtype = float_dtype
        self.shape: dict[int, tuple[int, ...]] = {k: tuple(shapes[name]) for k, name in enumerate(lowered.inputs)}
        self.dtype: dict[int, Any] = {k: dtypes[name] for k, name in enumerate(lowered.inputs)}
        self.taken = taken_names(lowered)
        #: a shape-free renderer whose variables are ``_v<register>``, and a namespace to evaluate its text in
        self.generic = Source(lowered, self.taken)
        self.generic.vars = {register: f"_v{register}" for register in range(lowered.register_count)}
        # the booleans known without dtypes, then the inputs' and each step's: the generic renderer shares
        # the set, so that both renderings write subtractions alike
        self.booleans = self.generic.booleans
        self.booleans.update(k for k, dtype in self.dtype.items() if dtype == np.dtype(bool))
        self.inferred: dict[tuple[int, str], int] = {}
        self.orders: dict[int, tuple[int, ...]] = {}
        self.contractions: dict[int, ContractionPlan] = {}
        self.expressions: dict[int, ExpressionPlan] = {}
        self.specs: dict[int, Any] = {}
        self.transient: dict[int, int] = {}
        self.window_views: dict[int, int] = {}
        #: register -> the bytes its step allocates where that is not its shape's (a transposed convolution makes
        #: the scatter's result; a padded window, its padded copy)
        self.sized: dict[int, int] = {}
        self.strided_windows: set[int] = set()
        self.updated: dict[int, int] = {}
        self.convolutions: dict[int, tuple[Any, tuple[int, ...]]] = {}
        self.convolved_windows: set[int] = set()
        self.convolved_scatters: set[int] = set()
        self.convolve = False  # whether window and scatter contractions may run as convolutions (specialise sets it)
        self.scattered = {step.arg for step in lowered.steps if isinstance(step, Scatter)}
        self._namespace: dict[str, Any] | None = None

    # ------------------------------------------------------------------ shapes and dtypes
    def check(self, program: ir.ProgramIR, shapes: dict[str, tuple[int, ...]], source: str | None) -> None:
        """Every statement's sizes agree (ShapeError otherwise); each register gets its shape and dtype."""
        tensors = dict(shapes)
        declared: dict[str, tuple[int, str]] = {}
        bindings = {statement: (target, register) for statement, target, register in self.lowered.bindings}
        steps = list(self.lowered.steps)
        position = 0
        for number, statement in enumerate(program.statements):
            if isinstance(statement, ir.SizeDecl):
                declared.update(declared_sizes(statement, tensors, source))
            elif isinstance(statement, ir.Assign):
                sizes = statement_sizes(statement, tensors, declared, source)
                self.inferred.update(((number, index), size) for index, size in sizes.items())
            while position < len(steps) and steps[position].statement == number:
                self.type_step(steps[position])
                position += 1
            if number in bindings:
                target, register = bindings[number]
                tensors[target] = self.shape[register] if register is not None else ()
            elif isinstance(statement, ir.Assign) and statement.target is not None and statement.indices is not None:
                # computed inside the statements that read it (einflow.engine.solving): its shape from its sizes
                tensors[statement.target] = tuple(sizes[index] for index in statement.indices)

    def resolve(self, ref: SizeRef) -> int:
        if isinstance(ref, Inferred):
            return self.inferred[(ref.statement, ref.index)]
        return ref if isinstance(ref, int) else self.shape[ref[0]][ref[1]]

    def type_step(self, step: Step) -> None:
        """The step's result's shape (checked) and dtype."""
        if isinstance(step, Free):
            return
        rule = PLAN_RULES[type(step)]
        if rule.shape is not None:
            self.shape[step.out] = rule.shape(self, step)
        else:
            sizes = step.sizes  # type: ignore[union-attr]
            self.shape[step.out] = tuple(self.resolve(ref) for ref in sizes)
            if len(sizes) > MAX_AXES:
                text = self.lowered.statements[step.statement]
                text = text if len(text) <= 80 else text[:77] + "..."
                labels = ", ".join(getattr(step, "labels", getattr(step, "output", ()))[:4])
                raise ShapeError(f"statement {text!r} needs an array of {len(sizes)} axes (indices {labels}, "
                                 f"...) at once; arrays have at most {MAX_AXES}: split the statement so that each "
                                 "part keeps fewer indices")
        if rule.check is not None:
            rule.check(self, step)
        self.dtype[step.out] = rule.dtype(self, step)
        if self.dtype[step.out] == np.dtype(bool):
            self.booleans.add(step.out)

    def sample(self, register: int) -> Any:
        dtype = self.dtype[register]
        if isinstance(dtype, type):  # a weak Python number
            return dtype(1)
        return np.ones((1,) * len(self.shape[register]), dtype=dtype)

    def sampled(self, step: Step) -> tuple[Source, dict[str, Any]]:
        """The generic renderer and a namespace to evaluate its text in, with one-element arrays of the dtypes
        ``step`` reads."""
        if self._namespace is None:
            namespace = helpers(self.generic, np)
            namespace[self.generic.alias["oe"]] = oe
            namespace.update({f"_v{k}": self.sample(k) for k in range(len(self.lowered.inputs))})
            self._namespace = namespace
        self._namespace.update({f"_v{register}": self.sample(register) for register in step_inputs(step)})
        return self.generic, self._namespace

    def evaluated_dtype(self, text: str, namespace: dict[str, Any]) -> Any:
        """The dtype of the generic code ``text`` run in ``namespace`` (weak Python numbers stay their type)."""
        with np.errstate(all="ignore"):
            try:
                value = eval(_compiled(text), namespace)  # noqa: S307 - text generated here from plain data
            except (TypeError, OverflowError) as error:
                raise EinflowError(f"cannot compute this program for inputs of these dtypes: {error}; cast the "
                                   "inputs (e.g. to float64) first") from None
        if type(value) in (int, float, complex):  # weak Python numbers in, a weak number out (1 / N for N=4 is 0.25)
            return type(value)
        return np.asarray(value).dtype

    def itemsize(self, register: int) -> int:
        dtype = self.dtype[register]
        return 8 if isinstance(dtype, type) else np.dtype(dtype).itemsize

    def stored_order(self, register: int) -> tuple[int, ...]:
        """The order ``register``'s axes are stored in (major first): ``x.permute(order)`` is contiguous."""
        return self.orders.get(register, tuple(range(len(self.shape[register]))))

    # ------------------------------------------------------------------ the record
    def record(self) -> Specialised:
        allocations: dict[int, int] = {}
        views: dict[int, int] = {}
        flops: dict[int, int] = {}
        for step in self.lowered.steps:
            if isinstance(step, Free):
                continue
            out = step.out
            flops[out] = PLAN_RULES[type(step)].count(self, step)
            if isinstance(step, Elementwise) and isinstance(step.expr, Arg):
                views[out] = step.expr.register
            elif out in self.updated:
                views[out] = self.updated[out]
            elif out in self.window_views:
                views[out] = self.window_views[out]
            else:
                allocations[out] = self.sized.get(out, math.prod(self.shape[out]) * self.itemsize(out))
        itemsizes = {register: 8 if isinstance(dtype, type) else np.dtype(dtype).itemsize
                     for register, dtype in self.dtype.items()}
        frozen = MappingProxyType  # read-only views: the passes after this one read the record, never write it
        return Specialised(self.lowered, self.backend, self.float_dtype, frozen(self.shape), frozen(self.dtype),
                           frozen(self.inferred), frozen(itemsizes), frozenset(self.booleans), frozenset(self.taken),
                           frozen(self.orders), frozen(self.contractions), frozen(self.expressions),
                           frozen(self.specs), frozen(flops), frozen(allocations), frozen(views),
                           frozen(self.updated), frozen(self.transient), frozen(self.convolutions),
                           frozenset(self.convolved_windows), frozenset(self.convolved_scatters),
                           frozenset(self.strided_windows))


def common_dtype(dtypes: Mapping[int, Any], step: Contract) -> np.dtype:
    """numpy's result type of a contraction's arrays and scale factors (Python numbers stay weak)."""
    def sample(register: int) -> Any:
        dtype = dtypes[register]
        return dtype(1) if isinstance(dtype, type) else np.dtype(dtype)

    parts: list[Any] = [sample(register) for register in step.args]
    for factor in step.scale:
        if isinstance(factor, Number):
            parts.append(factor.value)
        elif isinstance(factor, Size):
            parts.append(1)
        else:
            parts.extend(sample(register) for register in node_args(factor))
    return np.result_type(*parts)


def one_float_type(target: str, dtypes: Mapping[int, Any], registers: list[int], out: int) -> bool:
    """Whether the registers and ``out`` are arrays of one floating type (torch may then work in place)."""
    dtype = dtypes[out]
    return target == "torch" and not isinstance(dtype, type) and np.dtype(dtype).kind == "f" and all(
        dtypes[r] == dtype for r in registers)


@functools.lru_cache(maxsize=1024)
def _compiled(text: str) -> Any:
    return compile(text, "<einflow dtype>", "eval")


# ---------------------------------------------------------------------------------------------- measuring
def _measure_contract(specialiser: _Specialising, step: Contract) -> None:
    """The contraction's path, its report figures, its intermediates' memory and (torch) its result's layout."""
    letters = {label: oe.get_symbol(k) for k, label in
               enumerate(dict.fromkeys(label for labels in step.operands for label in labels))}
    # torch: each operand is taken in the axis order it is stored in (a transposed view is read as the
    # contiguous array it views), so matrix products pick their operands' layouts and an elementwise
    # product inside the contraction meets operands of one layout
    target = specialiser.target
    orders = [specialiser.stored_order(register) for register in step.args] if target == "torch" else \
        [tuple(range(len(labels))) for labels in step.operands]
    operand_labels = [tuple(labels[a] for a in order) for labels, order in zip(step.operands, orders)]
    equation = ",".join("".join(letters[label] for label in labels) for labels in operand_labels)
    equation += "->" + "".join(letters[label] for label in step.output)
    shapes = [tuple(specialiser.shape[register][a] for a in order) for register, order in zip(step.args, orders)]
    path, info, choice = choose_path(equation, shapes, specialiser.optimize)
    names = {letter: label for label, letter in letters.items()}
    pairwise = []
    for contraction in info.contraction_list:
        inds, removed, einsum_str = contraction[:3]
        inputs, result = einsum_str.split("->")
        flops = oe.helpers.flop_count(set(inputs.replace(",", "")), bool(removed), len(inds), info.size_dict)
        readable = ",".join("[" + ",".join(names[c] for c in part) + "]" for part in inputs.split(","))
        readable += " -> [" + ",".join(names[c] for c in result) + "]"
        pairwise.append((readable, int(flops), tuple(info.size_dict[c] for c in result)))
    dtypes = specialiser.dtype
    in_place = fresh = False
    text = None
    if specialiser.backend.pairwise_kernels:
        # scale factors: numbers, and 0-d values that do not widen a floating array (torch keeps its type)
        in_place = one_float_type(target, dtypes, list(step.args), step.out) and all(
            dtypes[r] in (int, float) or not specialiser.shape[r] and np.dtype(dtypes[r]).kind in "biuf"
            for factor in step.scale for r in node_args(factor))
        # each pairwise step as a direct call, with its intermediates' memory and the order the last one makes
        # the result in; the names are the render pass's to fill in (they change neither the calls nor the memory)
        scale = "{scale}" if step.scale and specialiser.backend.numpy_native else None
        text, internal, final, fresh = contraction_steps(
            equation, shapes, info.contraction_list, [f"{{{k}}}" for k in range(len(step.args))], NP,
            dialect=target, ops_alias=OPS, in_place=in_place, scale=scale)
        specialiser.orders[step.out] = tuple(step.output.index(names[letter]) for letter in final)
    else:
        internal = max((math.prod(shape) for _, _, shape in pairwise[:-1]), default=0)
    specialiser.contractions[step.out] = ContractionPlan(
        equation, tuple(shapes), path, info, names, choice, int(info.opt_cost), tuple(pairwise),
        int(info.largest_intermediate), tuple(orders), in_place, text, fresh)
    specialiser.transient[step.out] = internal * specialiser.itemsize(step.out)
    for k, register in enumerate(step.args):
        # a strided window (a view whose elements overlap) is copied whole where the kernel reshapes it or hands
        # it to BLAS; a transposed one the pairwise step counted already
        if register in specialiser.strided_windows and register not in specialiser.convolved_windows and \
                not (text is not None and any(f"{{{k}}}.{move}(" in text for move in ("transpose", "permute"))):
            specialiser.transient[step.out] += math.prod(specialiser.shape[register]) * specialiser.itemsize(register)
    if specialiser.convolve and not step.scale and step.out in specialiser.scattered \
            and step.out not in specialiser.convolutions:
        _scatter_convolution(specialiser, step)
    fused = specialiser.convolutions.get(step.out)
    if fused is not None:  # one native convolution: its own contiguous result, viewed in the output's order
        permutation = fused[0][11]
        stored = tuple(permutation.index(axis) for axis in range(len(permutation)))
        specialiser.orders.pop(step.out, None)
        if stored != tuple(range(len(stored))):
            specialiser.orders[step.out] = stored
        spec, (x, other) = fused
        x = specialiser.window_views[x] if x in specialiser.convolved_windows else x
        # a native convolution's workspace is the library's; numpy's kernel holds its channels-last copies
        specialiser.transient[step.out] = 0 if specialiser.backend.native_convolution else numpy_convolution_bytes(
            spec, specialiser.shape[x], specialiser.shape[other], specialiser.itemsize(step.out))
        if spec[0] != "transpose" and len(spec) > 12:  # torch's padding_mode: the input padded by F.pad, a copy
            padded = list(specialiser.shape[x])
            for axis, (before, after) in zip(spec[1][len(spec[1]) - len(spec[8]):], spec[4]):
                padded[axis] += before + after
            specialiser.transient[step.out] += math.prod(padded) * specialiser.itemsize(x)


#: the arrays' types a native convolution computes in (others contract the window as an einsum)
CONVOLVED_TYPES = ("float32", "float64")


def _scatter_convolution(specialiser: _Specialising, step: Contract) -> None:
    """Record the transposed convolution computing ``step`` and the scatter that only it feeds, if it is one."""
    scatter = sole_reader(specialiser.lowered.steps, step.out, specialiser.lowered.outputs)
    if not isinstance(scatter, Scatter) or scatter.gathers or len(step.args) != 2 or \
            any(str(specialiser.dtype[register]) not in CONVOLVED_TYPES for register in step.args):
        return
    spec = scatter_spec(scatter.labels, tuple(specialiser.resolve(ref) for ref in scatter.sizes), scatter.arg_labels,
                        specialiser.shape[step.out], scatter.positions, "", scatter.modes)
    found = scatter_convolution(step.operands, tuple(specialiser.shape[r] for r in step.args), step.output, spec)
    if found is not None:
        specialiser.convolutions[step.out] = (found, step.args)
        specialiser.convolved_scatters.add(scatter.out)
        specialiser.sized[step.out] = math.prod(spec[0]) * specialiser.itemsize(step.out)  # the scatter's result


def _window_convolution(specialiser: _Specialising, step: Window, spec: Any) -> bool:
    """Whether the window's only reader is a contraction with one other array that is a convolution: then
    recorded for it (the contraction reads the window's array itself) and the window is no step of its own."""
    reader = sole_reader(specialiser.lowered.steps, step.out, specialiser.lowered.outputs)
    if not isinstance(reader, Contract) or len(reader.args) != 2 or reader.args[0] == reader.args[1] or \
            step.out not in reader.args or reader.out in specialiser.convolutions:  # (a 0-d window: a scale)
        return False
    side = reader.args.index(step.out)
    other = reader.args[1 - side]
    if other not in specialiser.dtype:  # made later in the statement: an identity window of an input, say
        maker = next((s for s in specialiser.lowered.steps if getattr(s, "out", None) == other), None)
        other = maker.arg if isinstance(maker, Window) else other
    if str(specialiser.dtype[step.arg]) not in CONVOLVED_TYPES or \
            str(specialiser.dtype.get(other)) not in CONVOLVED_TYPES:
        return False
    found = window_convolution(reader.operands[side], spec, specialiser.shape[step.arg], reader.operands[1 - side],
                               reader.output, tuple(specialiser.resolve(ref) for ref in reader.sizes))
    if found is None or not (specialiser.backend.native_convolution or
                             numpy_convolves(found, specialiser.shape.get(other)) and spec[4] == "zeros"):
        return False
    # (the window's register is its array itself: alive as long as the convolution needs it)
    specialiser.convolutions[reader.out] = (found, (step.out, reader.args[1 - side]))
    specialiser.convolved_windows.add(step.out)
    specialiser.window_views[step.out] = step.arg
    return True


def _measure_elementwise(specialiser: _Specialising, step: Elementwise) -> None:
    """The expression as computed (small products first), its temporaries, and its blocks when it has some."""
    shape = specialiser.shape[step.out]
    elements = math.prod(shape)
    hoisted: dict[Node, int] = {}
    expr = step.expr
    if elements >= HOIST_ELEMENTS:  # a large product's factors that vary along few axes multiplied first
        expr = _hoist(expr, shape, specialiser.shape, hoisted)
    need, extra = _temporaries(expr)
    temporaries = int(max(need - 1 + extra, 0) * elements * specialiser.itemsize(step.out))
    # (blocks pay where the one expression makes two or more passes over the result: the hoisted small
    # products are not such passes, and in a block they would be spread to the block's whole size)
    blocks = None
    if specialiser.backend.numpy_native and elements >= BLOCK_ELEMENTS and _operations(expr, 1, tuple(hoisted)) >= 2:
        blocks = _blocks(specialiser, step.out, expr)
    specialiser.expressions[step.out] = ExpressionPlan(expr, tuple(hoisted), temporaries, blocks)
    specialiser.transient[step.out] = temporaries if blocks is None else \
        blocks.threads * blocks.buffers * blocks.rows * math.prod(shape[1:]) * specialiser.itemsize(step.out)
    if specialiser.target == "torch":
        _track_elementwise_order(specialiser, step)


def _blocks(specialiser: _Specialising, out: int, expr: Node) -> BlockPlan | None:
    """How ``expr`` is computed block by block (``einflow.engine.blocks``), or None when it cannot be computed
    alike: the result and every array operand of one floating type (Python numbers besides), each operand
    carrying the result's first axis whole, of size 1, or not at all, every operation with a block form."""
    shape = specialiser.shape[out]
    dtype = specialiser.dtype[out]
    if not shape or isinstance(dtype, type) or np.dtype(dtype) not in (np.dtype("float32"), np.dtype("float64")):
        return None
    # the kernel's operands and buffers (its text, with the generated code's names, is the render pass's)
    kernel = render_kernel("_kernel", expr, "_np", repr, repr)
    if kernel is None:
        return None
    sliced = []
    for arg in kernel.operands:
        own = specialiser.dtype[arg.register]
        rank = len(specialiser.shape[arg.register])
        if isinstance(own, type) and own in (int, float) and not rank:
            sliced.append(False)  # a Python number: weak, as in the one-expression form
        elif isinstance(own, type) or np.dtype(own) != np.dtype(dtype):
            return None
        else:
            axis = (0 if rank == len(shape) else None) if arg.axes is None else arg.axes[0]
            length = 1 if axis is None or not rank else specialiser.shape[arg.register][axis]
            if length not in (1, shape[0]):
                return None
            sliced.append(length == shape[0] and axis is not None and rank > 0)
    rows = block_rows(shape, specialiser.itemsize(out))
    return BlockPlan(rows, threads_for(shape, rows), kernel.buffers, tuple(sliced))


def _track_elementwise_order(specialiser: _Specialising, step: Elementwise) -> None:
    """torch lays an elementwise result out like its first operand of full rank."""
    rank = len(step.labels)
    for node in _args_in_order(step.expr):
        axes = node.axes if node.axes is not None else tuple(range(len(specialiser.shape[node.register])))
        if len(specialiser.shape[node.register]) != rank or None in axes or len(axes) != rank:
            continue
        order = tuple(axes.index(a) for a in specialiser.stored_order(node.register))
        if order != tuple(range(rank)):
            specialiser.orders[step.out] = order
        return


def _measure_reduce(specialiser: _Specialising, step: Reduce) -> None:
    """Linear algebra: LAPACK's copies and workspace (a check's value is its matrix itself); torch: a sum keeps
    the order of the axes it keeps."""
    if is_linalg(step):
        specialiser.transient[step.out] = linalg_workspace(step.kind, specialiser.shape[step.arg], step.axes,
                                                           specialiser.dtype[step.arg])
        if step.kind in (*CHECK_KINDS, "spd_by_factor"):
            specialiser.window_views[step.out] = step.arg  # the helper returns the matrix it checked
        return
    if specialiser.target == "torch" and step.kind == "sum" and step.arg in specialiser.orders:
        kept = [a for a in specialiser.orders[step.arg] if a not in step.axes]
        positions = sorted(kept)
        order = tuple(positions.index(a) for a in kept)
        if order != tuple(range(len(order))):
            specialiser.orders[step.out] = order


def _measure_window(specialiser: _Specialising, step: Window) -> None:
    labels = step.labels
    spec = window_spec(labels, tuple(specialiser.resolve(ref) for ref in step.sizes), specialiser.shape[step.arg],
                       plain_positions(step.positions, labels), tuple(specialiser.shape[g] for g in step.gathers),
                       step.name, step.mode)
    specialiser.specs[step.out] = spec
    if is_identity(spec, specialiser.shape[step.arg]):
        return
    if specialiser.convolve and _window_convolution(specialiser, step, spec):
        return  # read in place by the convolution that computes its only reader
    specialiser.transient[step.out] = window_temporaries(spec, specialiser.shape[step.arg],
                                                         specialiser.itemsize(step.arg))
    if spec[1] is not None and is_view(spec[:1] + (None,) + spec[2:], specialiser.backend):
        # a strided view of the zero-padded copy: the copy is what the window allocates
        specialiser.sized[step.out], specialiser.transient[step.out] = specialiser.transient[step.out], 0
        specialiser.strided_windows.add(step.out)
    if is_view(spec, specialiser.backend):
        specialiser.strided_windows.add(step.out)
        specialiser.window_views[step.out] = step.arg  # memory: a view of its array, as a transpose is


def _measure_scatter(specialiser: _Specialising, step: Scatter) -> None:
    spec = scatter_spec(step.labels, tuple(specialiser.resolve(ref) for ref in step.sizes), step.arg_labels,
                        specialiser.shape[step.arg], step.positions, specialiser.lowered.statements[step.statement],
                        step.modes)
    specialiser.specs[step.out] = spec
    if step.out in specialiser.convolved_scatters:  # computed whole by a transposed convolution
        specialiser.window_views[step.out] = step.arg
        return
    specialiser.transient[step.out] = scatter_temporaries(spec, specialiser.itemsize(step.arg),
                                                          _contiguous(specialiser, step.arg))


def _contiguous(specialiser: _Specialising, register: int) -> bool:
    """Whether a register's array is dense in some order of its axes (the scatter kernel flattens it in its
    memory order without a copy): any array but a strided window, whose elements overlap."""
    return register not in specialiser.window_views


def _measure_solve(specialiser: _Specialising, step: Solve) -> None:
    """LAPACK's copies of each matrix and its right-hand sides (numpy's solve), and float copies of integers."""
    n = specialiser.shape[step.matrix][step.axes[0]]
    specialiser.transient[step.out] = solve_workspace(
        step.kind, n, specialiser.shape[step.rhs], specialiser.dtype[step.matrix], specialiser.dtype[step.rhs],
        specialiser.shape[step.matrix])


def _measure_diagonal(specialiser: _Specialising, step: Diagonal) -> None:
    """numpy: a diagonal added into a base that is this step's alone updates the base in place."""
    if step.base is None or not specialiser.backend.numpy_native:
        return
    made = next(made for made in specialiser.lowered.steps if getattr(made, "out", None) == step.base)
    full = not isinstance(made, Elementwise) or len(_axes_of(made.expr, len(made.labels), specialiser.shape)) == \
        len(made.labels)  # an elementwise base that some axis does not vary along is a broadcast shape
    if full and specialiser.shape[step.base] == specialiser.shape[step.out] and \
            specialiser.dtype[step.base] == specialiser.dtype[step.out]:
        specialiser.updated[step.out] = step.base


# ---------------------------------------------------------------------------------------------- plan rules
# One row per step kind, for what specialising decides with the shapes and dtypes: the result's shape
# (``shape``; None: its sizes resolved), a check of the shapes (``check``), the result's dtype (``dtype``),
# the plan report's FLOPs (``count``) and text (``describe``, read by the report pass with the rendered
# names; None: the step's note, see ``codegen.STEP_RULES``), and what it plans and measures (``measure``:
# paths, memory, layouts). The rendering's own rows are ``einflow.engine.render.RENDER_RULES``.


def _reduce_check(specialiser: _Specialising, step: Reduce) -> None:
    if step.kind in ("max", "min", "argmax", "argmin") and \
            any(specialiser.shape[step.arg][axis] == 0 for axis in step.axes):
        empty = next(step.labels[axis] for axis in step.axes if specialiser.shape[step.arg][axis] == 0)
        raise ShapeError(f"{step.kind}[{empty}] over index {empty!r} of size 0: the {step.kind} of no values is "
                         "undefined (numpy refuses it alike); give the index at least one value")


def _diagonal_dtype(specialiser: _Specialising, step: Diagonal) -> Any:
    value = specialiser.sample(step.arg)
    if not _is_unit(step.coefficient):
        value = value * step.coefficient
    return np.result_type(value if step.base is None else specialiser.sample(step.base) + value)


def _elementwise_dtype(specialiser: _Specialising, step: Elementwise) -> Any:
    generic, namespace = specialiser.sampled(step)
    return specialiser.evaluated_dtype(generic.elementwise(step), namespace)


def _contract_dtype(specialiser: _Specialising, step: Contract) -> Any:
    generic, namespace = specialiser.sampled(step)
    # einsum's type is its operands' (bools stay bools), then the scale's
    namespace["_contracted"] = np.ones((1,), dtype=np.result_type(*(specialiser.sample(r) for r in step.args)))
    text = generic.scaled("_contracted", step.scale) if step.scale else "_contracted"
    return specialiser.evaluated_dtype(text, namespace)


def _solve_dtype(specialiser: _Specialising, step: Solve) -> Any:
    specialiser.sampled(step)
    return linalg_dtype(np.result_type(specialiser.dtype[step.matrix], specialiser.dtype[step.rhs]))


def _reduce_dtype(specialiser: _Specialising, step: Reduce) -> Any:
    generic, namespace = specialiser.sampled(step)
    if is_linalg(step):
        return linalg_result_dtype(step.kind, specialiser.dtype[step.arg])
    if step.kind == "sum":
        return specialiser.sample(step.arg).sum(axis=step.axes).dtype
    # max keeps the type; mean, the normalisers and logsumexp compute in floats (the reduce helper)
    with np.errstate(all="ignore"):
        sample = np.asarray(specialiser.sample(step.arg))
        return np.asarray(namespace[generic.alias["reduce"]](step.kind, sample, step.axes)).dtype


def _reduce_flops(specialiser: _Specialising, step: Reduce) -> int:
    if is_linalg(step):
        return linalg_flops(step.kind, specialiser.shape[step.arg], step.axes)
    return math.prod(specialiser.shape[step.arg])


def _solve_flops(specialiser: _Specialising, step: Solve) -> int:
    n = specialiser.shape[step.matrix][step.axes[0]]
    batch = math.prod(specialiser.shape[step.matrix][axis] for axis, _ in step.batch)  # one solve per matrix
    shared = math.prod(specialiser.shape[step.rhs][axis] for _, axis in step.batch if axis is not None)
    return batch * solve_flops(step.kind, n, math.prod(specialiser.shape[step.rhs]) // max(n * shared, 1))


def _diagonal_flops(specialiser: _Specialising, step: Diagonal) -> int:
    shape = specialiser.shape[step.out]
    if step.base is not None:  # an addition into the diagonal only
        return math.prod(shape[step.output.index(label)] for label in diagonal_view_labels(step))
    return math.prod(shape)


def _elements(specialiser: _Specialising, step: Step) -> int:
    shape: tuple[int, ...] = specialiser.shape[step.out]  # type: ignore[union-attr]
    return math.prod(shape)


@dataclass(frozen=True)
class PlanRule:
    """One step kind as specialising sees it: ``shape(specialiser, step)`` its result's shape (None: the
    step's ``sizes`` resolved); ``check(specialiser, step)`` raises ShapeError for shapes it cannot compute
    with (None: none); ``dtype(specialiser, step)`` its result's dtype; ``count(specialiser, step)`` its FLOPs
    in the plan report; ``describe(source, step)`` the report's text, given the renderer that named the
    registers (None: the step's note); ``measure(specialiser, step)`` plans the step and records its memory
    (None: nothing besides its result)."""

    dtype: Callable[[Any, Any], Any]
    count: Callable[[Any, Any], int]
    describe: Callable[[Any, Any], str] | None = None
    shape: Callable[[Any, Any], tuple[int, ...]] | None = None
    check: Callable[[Any, Any], None] | None = None
    measure: Callable[[Any, Any], None] | None = None


def _no_dtype(specialiser: _Specialising, step: Step) -> Any:
    raise AssertionError("a Free step has no result")


PLAN_RULES: dict[type, PlanRule] = {
    Constant: PlanRule(
        dtype=lambda specialiser, step: np.asarray(step.value).dtype,
        count=_elements,
        shape=lambda specialiser, step: ()),
    Ones: PlanRule(
        dtype=lambda specialiser, step: np.dtype(bool),
        count=_elements,
        shape=lambda specialiser, step: (specialiser.resolve(step.size),)),
    Contract: PlanRule(
        dtype=_contract_dtype,
        count=lambda specialiser, step: specialiser.contractions[step.out].flops,
        measure=_measure_contract),
    Reduce: PlanRule(  # plain reductions, the normalisers and the linear-algebra kinds (einflow.engine.linalg)
        dtype=_reduce_dtype,
        count=_reduce_flops,
        check=_reduce_check,
        measure=_measure_reduce),
    Solve: PlanRule(
        dtype=_solve_dtype,
        count=_solve_flops,
        measure=_measure_solve),
    Elementwise: PlanRule(
        dtype=_elementwise_dtype,
        count=lambda specialiser, step: _elements(specialiser, step) * max(1, _operations(step.expr)),
        describe=lambda source, step: _describe(step.expr, step.labels, source),
        measure=_measure_elementwise),
    Diagonal: PlanRule(
        dtype=_diagonal_dtype,
        count=_diagonal_flops,
        measure=_measure_diagonal),
    Window: PlanRule(
        dtype=lambda specialiser, step: specialiser.dtype[step.arg],
        count=_elements,
        measure=_measure_window),
    Scatter: PlanRule(
        dtype=lambda specialiser, step: specialiser.dtype[step.arg],
        count=_elements,
        measure=_measure_scatter),
    Free: PlanRule(
        dtype=_no_dtype,
        count=lambda specialiser, step: 0),
}

assert set(PLAN_RULES) == set(Step.__args__)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- hoisting
def _hoist(node: Node, shape: tuple[int, ...], shapes: Mapping[int, tuple[int, ...]],
           hoisted: dict[Node, int]) -> Node:
    """``node`` (of ``shape``) with the factors of each product (under its sums) that vary along few of its axes
    multiplied first, on their own smaller shape: ``A[p,v,w] x[q] c[p]`` is ``(x[q] c[p]) A[p,v,w]``, one pass over
    the large result instead of two. The products moved first are recorded in ``hoisted`` (node -> elements)."""
    if isinstance(node, Add):
        return Add(tuple(_hoist(term, shape, shapes, hoisted) for term in node.terms))
    if not isinstance(node, Mul):
        return node
    factors = [_hoist(factor, shape, shapes, hoisted) for factor in node.factors]
    numbers = [factor for factor in factors if isinstance(factor, Number)]
    arrays = [factor for factor in factors if not isinstance(factor, Number)]
    covers = [_axes_of(factor, len(shape), shapes) for factor in arrays]

    def elements(axes: set[int]) -> int:
        return math.prod(shape[axis] for axis in axes)

    full = elements(set().union(*covers))
    order: list[int] = []
    covered: set[int] = set()
    while len(order) < len(arrays):  # greedily: the factor that widens the partial product least
        best = min((k for k in range(len(arrays)) if k not in order),
                   key=lambda k: (elements(covered | covers[k]), -elements(covers[k])))
        if elements(covered | covers[best]) * HOIST_SHARE > full:
            break
        order.append(best)
        covered |= covers[best]
    if len(order) < 2:
        return Mul(tuple(factors))
    first = Mul((*(arrays[k] for k in order), *numbers))
    hoisted[first] = elements(covered)
    return Mul((first, *(factor for k, factor in enumerate(arrays) if k not in order)))


def _axes_of(node: Node, rank: int, shapes: Mapping[int, tuple[int, ...]]) -> set[int]:
    """The axes of an expression's result (of ``rank`` axes) along which it varies."""
    if isinstance(node, Arg):
        if node.axes is None:
            return set(range(rank)) if shapes.get(node.register) else set()
        return {position for position, axis in enumerate(node.axes) if axis is not None}
    return {axis for register_node in arg_nodes(node) for axis in _axes_of(register_node, rank, shapes)}

