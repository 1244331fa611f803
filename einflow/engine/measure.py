"""The specialise pass's rows: each step kind's shape, check, dtype, FLOPs, report text and measurement.

:func:`einflow.engine.specialise.specialise` reads one row per step (``PLAN_RULES``): the row sizes and types the
step's result and plans and measures it (contraction paths, fused expressions computed block by block,
windows, scatters, linear algebra workspace), writing what it finds into the pass's builder. The plans a row
makes (``ContractionPlan``, ``ExpressionPlan``, ``BlockPlan``) are frozen parts of the record.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import opt_einsum as oe

from einflow.engine import codegen, runtime
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
from einflow.engine.context import Names, RenderContext, generic_booleans, taken_names
from einflow.engine.convolution import (
    numpy_convolution_bytes,
    numpy_convolves,
    scatter_convolution,
    sole_reader,
    window_convolution,
)
from einflow.engine.dialect import Dialect
from einflow.engine.helpers import helpers
from einflow.engine.hoisting import HOIST_ELEMENTS, axes_of, hoist
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
from einflow.engine.rows import args_in_order, describe_node, diagonal_view_labels, operations_of, temporaries_of
from einflow.engine.steps import (
    Constant,
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Inferred,
    Lowered,
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
    node_args,
    step_inputs,
)
from einflow.lang.errors import EinflowError, ShapeError
from einflow.lang.indices import einsum_equation, index_letters
from einflow.lang.numbers import _is_unit

__all__ = ["Builder", "PLAN_RULES", "PlanRule", "ContractionPlan", "ExpressionPlan", "BlockPlan", "common_dtype",
           "one_float_type", "BLOCK_ELEMENTS", "NP", "OPS", "CONVOLVED_TYPES"]

#: fused elementwise work on at least this many elements is computed block by block (numpy backend, float
#: inputs, ``einflow.engine.blocks``); smaller work is one numpy expression (a block's setup costs ~20 us)
BLOCK_ELEMENTS = 1 << 16
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


def one_float_type(dialect: Dialect, dtypes: Mapping[int, Any], registers: list[int], out: int) -> bool:
    """Whether the registers and ``out`` are arrays of one floating type and the dialect may then work in place."""
    dtype = dtypes[out]
    return dialect.in_place and not isinstance(dtype, type) and np.dtype(dtype).kind == "f" and all(
        dtypes[r] == dtype for r in registers)


def _measure_contract(specialiser: Builder, step: Contract) -> None:
    """The contraction's path, its report figures, its intermediates' memory and (torch) its result's layout."""
    letters = index_letters(*step.operands)
    # each operand is taken in the axis order it is stored in (a transposed view is read as the contiguous array
    # it views), so matrix products pick their operands' layouts (numpy: which copies a reshape makes, and how
    # long their runs are) and (torch) an elementwise product inside the contraction meets operands of one layout
    if specialiser.dialect.stored_orders or specialiser.backend.pairwise_kernels:
        orders = [specialiser.stored_order(register) for register in step.args]
    else:
        orders = [tuple(range(len(labels))) for labels in step.operands]
    operand_labels = [tuple(labels[a] for a in order) for labels, order in zip(step.operands, orders)]
    equation = einsum_equation(operand_labels, step.output, letters)
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
        in_place = one_float_type(specialiser.dialect, dtypes, list(step.args), step.out) and all(
            dtypes[r] in (int, float) or not specialiser.shape[r] and np.dtype(dtypes[r]).kind in "biuf"
            for factor in step.scale for r in node_args(factor))
        # each pairwise step as a direct call, with its intermediates' memory and the order the last one makes
        # the result in; the names are the render pass's to fill in (they change neither the calls nor the memory)
        scale = "{scale}" if step.scale and specialiser.backend.numpy_native else None
        text, internal, final, fresh = contraction_steps(
            equation, shapes, info.contraction_list, [f"{{{k}}}" for k in range(len(step.args))], NP,
            dialect=specialiser.dialect, ops_alias=OPS, in_place=in_place, scale=scale)
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


def _scatter_convolution(specialiser: Builder, step: Contract) -> None:
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


def _window_convolution(specialiser: Builder, step: Window, spec: Any) -> bool:
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


def _measure_elementwise(specialiser: Builder, step: Elementwise) -> None:
    """The expression as computed (small products first), its temporaries, and its blocks when it has some."""
    shape = specialiser.shape[step.out]
    elements = math.prod(shape)
    hoisted: dict[Node, int] = {}
    expr = step.expr
    if elements >= HOIST_ELEMENTS:  # a large product's factors that vary along few axes multiplied first
        expr = hoist(expr, shape, specialiser.shape, hoisted)
    need, extra = temporaries_of(expr)
    temporaries = int(max(need - 1 + extra, 0) * elements * specialiser.itemsize(step.out))
    # (blocks pay where the one expression makes two or more passes over the result: the hoisted small
    # products are not such passes, and in a block they would be spread to the block's whole size)
    blocks = None
    if specialiser.backend.numpy_native and elements >= BLOCK_ELEMENTS and operations_of(expr, 1, tuple(hoisted)) >= 2:
        blocks = _blocks(specialiser, step.out, expr)
    specialiser.expressions[step.out] = ExpressionPlan(expr, tuple(hoisted), temporaries, blocks)
    specialiser.transient[step.out] = temporaries if blocks is None else \
        blocks.threads * blocks.buffers * blocks.rows * math.prod(shape[1:]) * specialiser.itemsize(step.out)
    if specialiser.dialect.stored_orders:
        _track_elementwise_order(specialiser, step)


def _blocks(specialiser: Builder, out: int, expr: Node) -> BlockPlan | None:
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


def _track_elementwise_order(specialiser: Builder, step: Elementwise) -> None:
    """torch lays an elementwise result out like its first operand of full rank."""
    rank = len(step.labels)
    for node in args_in_order(step.expr):
        axes = node.axes if node.axes is not None else tuple(range(len(specialiser.shape[node.register])))
        if len(specialiser.shape[node.register]) != rank or None in axes or len(axes) != rank:
            continue
        order = tuple(axes.index(a) for a in specialiser.stored_order(node.register))
        if order != tuple(range(rank)):
            specialiser.orders[step.out] = order
        return


def _measure_reduce(specialiser: Builder, step: Reduce) -> None:
    """Linear algebra: LAPACK's copies and workspace (a check's value is its matrix itself); torch: a sum keeps
    the order of the axes it keeps."""
    if is_linalg(step):
        specialiser.transient[step.out] = linalg_workspace(step.kind, specialiser.shape[step.arg], step.axes,
                                                           specialiser.dtype[step.arg])
        if step.kind in (*CHECK_KINDS, "spd_by_factor"):
            specialiser.window_views[step.out] = step.arg  # the helper returns the matrix it checked
        return
    if specialiser.dialect.stored_orders and step.kind == "sum" and step.arg in specialiser.orders:
        kept = [a for a in specialiser.orders[step.arg] if a not in step.axes]
        positions = sorted(kept)
        order = tuple(positions.index(a) for a in kept)
        if order != tuple(range(len(order))):
            specialiser.orders[step.out] = order


def _measure_window(specialiser: Builder, step: Window) -> None:
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


def _measure_scatter(specialiser: Builder, step: Scatter) -> None:
    spec = scatter_spec(step.labels, tuple(specialiser.resolve(ref) for ref in step.sizes), step.arg_labels,
                        specialiser.shape[step.arg], step.positions, specialiser.lowered.statements[step.statement],
                        step.modes)
    specialiser.specs[step.out] = spec
    if step.out in specialiser.convolved_scatters:  # computed whole by a transposed convolution
        specialiser.window_views[step.out] = step.arg
        return
    specialiser.transient[step.out] = scatter_temporaries(spec, specialiser.itemsize(step.arg),
                                                          _contiguous(specialiser, step.arg))


def _contiguous(specialiser: Builder, register: int) -> bool:
    """Whether a register's array is dense in some order of its axes (the scatter kernel flattens it in its
    memory order without a copy): any array but a strided window, whose elements overlap."""
    return register not in specialiser.window_views


def _measure_solve(specialiser: Builder, step: Solve) -> None:
    """LAPACK's copies of each matrix and its right-hand sides (numpy's solve), and float copies of integers."""
    n = specialiser.shape[step.matrix][step.axes[0]]
    specialiser.transient[step.out] = solve_workspace(
        step.kind, n, specialiser.shape[step.rhs], specialiser.dtype[step.matrix], specialiser.dtype[step.rhs],
        specialiser.shape[step.matrix])


def _measure_diagonal(specialiser: Builder, step: Diagonal) -> None:
    """numpy: a diagonal added into a base that is this step's alone updates the base in place."""
    if step.base is None or not specialiser.backend.numpy_native:
        return
    made = next(made for made in specialiser.lowered.steps if getattr(made, "out", None) == step.base)
    full = not isinstance(made, Elementwise) or len(axes_of(made.expr, len(made.labels), specialiser.shape)) == \
        len(made.labels)  # an elementwise base that some axis does not vary along is a broadcast shape
    if full and specialiser.shape[step.base] == specialiser.shape[step.out] and \
            specialiser.dtype[step.base] == specialiser.dtype[step.out]:
        specialiser.updated[step.out] = step.base


# ---------------------------------------------------------------------------------------------- plan rules
# One row per step kind, for what specialising decides with the shapes and dtypes: the result's shape
# (``shape``; None: its sizes resolved), a check of the shapes (``check``), the result's dtype (``dtype``),
# the plan report's FLOPs (``count``) and text (``describe``, read by the report pass with the rendered
# names; None: the step's note, see ``rows.STEP_RULES``), and what it plans and measures (``measure``:
# paths, memory, layouts). The rendering's own rows are ``einflow.engine.render.RENDER_RULES``.


def _reduce_check(specialiser: Builder, step: Reduce) -> None:
    if step.kind in ("max", "min", "argmax", "argmin") and \
            any(specialiser.shape[step.arg][axis] == 0 for axis in step.axes):
        empty = next(step.labels[axis] for axis in step.axes if specialiser.shape[step.arg][axis] == 0)
        raise ShapeError(f"{step.kind}[{empty}] over index {empty!r} of size 0: the {step.kind} of no values is "
                         "undefined (numpy refuses it alike); give the index at least one value")


def _diagonal_dtype(specialiser: Builder, step: Diagonal) -> Any:
    value = specialiser.sample(step.arg)
    if not _is_unit(step.coefficient):
        value = value * step.coefficient
    return np.result_type(value if step.base is None else specialiser.sample(step.base) + value)


def _elementwise_dtype(specialiser: Builder, step: Elementwise) -> Any:
    generic, namespace = specialiser.sampled(step)
    return specialiser.evaluated_dtype(codegen.elementwise(generic, step), namespace)


def _contract_dtype(specialiser: Builder, step: Contract) -> Any:
    generic, namespace = specialiser.sampled(step)
    # einsum's type is its operands' (bools stay bools), then the scale's
    namespace["_contracted"] = np.ones((1,), dtype=np.result_type(*(specialiser.sample(r) for r in step.args)))
    text = codegen.scaled(generic, "_contracted", step.scale) if step.scale else "_contracted"
    return specialiser.evaluated_dtype(text, namespace)


def _solve_dtype(specialiser: Builder, step: Solve) -> Any:
    specialiser.sampled(step)
    return linalg_dtype(np.result_type(specialiser.dtype[step.matrix], specialiser.dtype[step.rhs]))


def _reduce_dtype(specialiser: Builder, step: Reduce) -> Any:
    if is_linalg(step):
        return linalg_result_dtype(step.kind, specialiser.dtype[step.arg])
    if step.kind == "sum":
        return specialiser.sample(step.arg).sum(axis=step.axes).dtype
    # max keeps the type; mean, the normalisers and logsumexp compute in floats (the reduce helper itself)
    with np.errstate(all="ignore"):
        sample = np.asarray(specialiser.sample(step.arg))
        return np.asarray(runtime.reduce(step.kind, sample, step.axes)).dtype


def _reduce_flops(specialiser: Builder, step: Reduce) -> int:
    if is_linalg(step):
        return linalg_flops(step.kind, specialiser.shape[step.arg], step.axes)
    return math.prod(specialiser.shape[step.arg])


def _solve_flops(specialiser: Builder, step: Solve) -> int:
    n = specialiser.shape[step.matrix][step.axes[0]]
    batch = math.prod(specialiser.shape[step.matrix][axis] for axis, _ in step.batch)  # one solve per matrix
    shared = math.prod(specialiser.shape[step.rhs][axis] for _, axis in step.batch if axis is not None)
    return batch * solve_flops(step.kind, n, math.prod(specialiser.shape[step.rhs]) // max(n * shared, 1))


def _diagonal_flops(specialiser: Builder, step: Diagonal) -> int:
    shape = specialiser.shape[step.out]
    if step.base is not None:  # an addition into the diagonal only
        return math.prod(shape[step.output.index(label)] for label in diagonal_view_labels(step))
    return math.prod(shape)


def _elements(specialiser: Builder, step: Step) -> int:
    shape: tuple[int, ...] = specialiser.shape[step.out]  # type: ignore[union-attr]
    return math.prod(shape)


@dataclass(frozen=True)
class PlanRule:
    """One step kind as specialising sees it: ``shape(specialiser, step)`` its result's shape (None: the
    step's ``sizes`` resolved); ``check(specialiser, step)`` raises ShapeError for shapes it cannot compute
    with (None: none); ``dtype(specialiser, step)`` its result's dtype; ``count(specialiser, step)`` its FLOPs
    in the plan report; ``describe(context, step)`` the report's text, given the render context that named the
    registers (None: the step's note); ``measure(specialiser, step)`` plans the step and records its memory
    (None: nothing besides its result)."""

    dtype: Callable[[Any, Any], Any]
    count: Callable[[Any, Any], int]
    describe: Callable[[Any, Any], str] | None = None
    shape: Callable[[Any, Any], tuple[int, ...]] | None = None
    check: Callable[[Any, Any], None] | None = None
    measure: Callable[[Any, Any], None] | None = None


def _no_dtype(specialiser: Builder, step: Step) -> Any:
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
        count=lambda specialiser, step: _elements(specialiser, step) * max(1, operations_of(step.expr)),
        describe=lambda context, step: describe_node(step.expr, step.labels, context),
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


# ---------------------------------------------------------------------------------------------- the builder
class Builder:
    """What :func:`einflow.engine.specialise.specialise` builds, step by step, before it is frozen into the record:
    the rows of ``PLAN_RULES`` read and write it."""

    def __init__(self, lowered: Lowered, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any],
                 backend: Backend, optimize: Any, float_dtype: Any) -> None:
        self.lowered = lowered
        self.backend = backend
        self.dialect = backend.dialect
        self.optimize = optimize
        self.float_dtype = float_dtype
        self.shape: dict[int, tuple[int, ...]] = {k: tuple(shapes[name]) for k, name in enumerate(lowered.inputs)}
        self.dtype: dict[int, Any] = {k: dtypes[name] for k, name in enumerate(lowered.inputs)}
        self.taken = taken_names(lowered)
        # the booleans known without dtypes, then the inputs' and each step's: the shape-free context shares the
        # set, so that its text and the rendered code write subtractions alike
        self.booleans = generic_booleans(lowered)
        self.booleans.update(k for k, dtype in self.dtype.items() if dtype == np.dtype(bool))
        #: a shape-free render context whose variables are ``_v<register>`` (the rows' text, evaluated on
        #: one-element samples, gives an elementwise step's dtype), and a namespace to evaluate it in
        names = Names(lowered, self.taken)
        names.vars = {register: f"_v{register}" for register in range(lowered.register_count)}
        self.generic = RenderContext(names, lowered, booleans=self.booleans)
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

    def resolve(self, ref: SizeRef) -> int:
        if isinstance(ref, Inferred):
            return self.inferred[(ref.statement, ref.index)]
        return ref if isinstance(ref, int) else self.shape[ref[0]][ref[1]]

    def sample(self, register: int) -> Any:
        dtype = self.dtype[register]
        if isinstance(dtype, type):  # a weak Python number
            return dtype(1)
        return np.ones((1,) * len(self.shape[register]), dtype=dtype)

    def sampled(self, step: Step) -> tuple[RenderContext, dict[str, Any]]:
        """The shape-free render context and a namespace to evaluate its text in, with one-element arrays of the
        dtypes ``step`` reads."""
        if self._namespace is None:
            namespace = helpers(self.generic.alias, self.generic.dialect, np)
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


@functools.lru_cache(maxsize=1024)
def _compiled(text: str) -> Any:
    return compile(text, "<einflow dtype>", "eval")
