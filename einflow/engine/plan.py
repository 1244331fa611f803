"""Steps -> Plan: the lowered steps specialised for input shapes, dtypes and a backend, compiled once.

For one (program, backend, shapes, dtypes) signature the specialisation checks every statement's index
sizes, gives each register its shape and dtype, plans each contraction pairwise (opt_einsum), renders
the steps as one straight-line Python function (:mod:`einflow.engine.codegen`; contractions as direct BLAS
calls on numpy, large fused elementwise work block by block on threads, ``einflow.engine.blocks``) and predicts the
peak memory of a run from the same steps. The report (``Program.plan``) lists the same steps.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import opt_einsum as oe

from einflow.engine.affine import (
    is_identity,
    is_view,
    plain_positions,
    scatter_kernel,
    scatter_spec,
    scatter_temporaries,
    window_kernel,
    window_spec,
    window_temporaries,
)
from einflow.engine.backends.base import Backend
from einflow.engine.blocks import block_rows, render_kernel, run_blocks, threads_for
from einflow.engine.codegen import (
    HELPER_KEYS,
    Source,
    _args_in_order,
    _describe,
    _negated,
    _operations,
    _temporaries,
    diagonal_spec,
    diagonal_view_labels,
    kind_of,
)
from einflow.engine.convolution import convolution_kernel, scatter_convolution, sole_reader, window_convolution
from einflow.engine.fitting import Fitting, FittingRenderer, fit
from einflow.engine.kernels import contraction_steps
from einflow.engine.linalg import is_linalg, linalg_dtype, linalg_flops, linalg_result_dtype, solve_flops
from einflow.engine.lower import lower
from einflow.engine.memory import format_bytes
from einflow.engine.paths import PathChoice, choose_path
from einflow.engine.slicing import Slicing
from einflow.engine.steps import (
    Add,
    Apply,
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
    Pow,
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
from einflow.lang.check import ProgramInfo
from einflow.lang.errors import EinflowError, MatrixError, MemoryLimitError, ShapeError
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import declared_sizes, indices_in, statement_sizes
from einflow.lang.numbers import _is_unit

__all__ = ["Plan", "PlanStep", "build_plan", "indices_in", "TEMPORARIES"]

# temporaries (in arrays of the argument's size, float64) that functions.py's value rules build besides
# their result; tests/test_speed_features.py measures them
TEMPORARIES: dict[str, float] = {name: rule.temporaries for name, rule in FUNCTION_RULES.items() if rule.temporaries}

#: fused elementwise work on at least this many elements is computed block by block (numpy backend, float
#: inputs, ``einflow.engine.blocks``); smaller work is one numpy expression (a block's setup costs ~20 us)
BLOCK_ELEMENTS = 1 << 16
#: a large diagonal view with an axis this short or shorter is added into slice by slice along that axis
DIAGONAL_LOOP = 16
#: in fused elementwise work on at least this many elements, a product's small factors are multiplied first
HOIST_ELEMENTS = 1 << 16
#: intermediates of at least this many bytes are released (``del``) right after their last use
RELEASE_BYTES = 1 << 16


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


#: numpy's (and torch's) most axes of one array
MAX_AXES = 64


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
        return _peak(self.lowered.steps, self.allocations, self.transients)[0]

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


def _peak(steps: tuple[Step, ...], allocations: dict[int, int], transients: dict[int, int]) -> tuple[int, int]:
    """(peak bytes, the register being made at the peak)."""
    live = peak = 0
    at = -1
    for step in steps:
        if isinstance(step, Free):
            live -= sum(allocations.get(register, 0) for register in step.registers)
            continue
        made = allocations.get(step.out, 0)
        if live + made + transients.get(step.out, 0) > peak:
            peak, at = live + made + transients.get(step.out, 0), step.out
        live += made
    return peak, at


def _in_common_dtype(run: Any, count: int, coefficient: int | float | None) -> Any:
    """``run`` on its first ``count`` arguments, each cast to numpy's result type of all arguments.

    The arguments after ``count`` (scalars multiplied in later) and the weak ``coefficient`` only take part
    in the type; Python numbers stay weak, as in numpy.
    """
    weak = () if coefficient is None else (coefficient,)

    def typed(*values: Any) -> Any:
        arrays = values[:count]
        common = np.result_type(*[getattr(value, "dtype", value) for value in values], *weak)
        if all(getattr(array, "dtype", common) == common for array in arrays):
            return run(*arrays)
        return run(*[array.astype(common) if getattr(array, "dtype", common) != common else array
                     for array in arrays])

    return typed




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


#: the arrays' types a native convolution computes in (others contract the window as an einsum)
CONVOLVED_TYPES = ("float32", "float64")


class _Specialiser(FittingRenderer, Source):
    """Renders the steps for one signature: literal sizes, planned contractions, fused elementwise engines."""

    def __init__(self, lowered: Lowered, program: ir.ProgramIR, shapes: dict[str, tuple[int, ...]],
                 dtypes: dict[str, Any], backend: Backend, optimize: Any, source: str | None,
                 float_dtype: Any, fitting: Fitting | None = None) -> None:
        super().__init__(lowered, _taken(lowered), backend.target)
        #: what to slice or compute in chunks to fit the memory limit (decided from a first rendering)
        self.fitting = fitting if fitting is not None else Fitting()
        #: register -> the slicing its contraction runs with
        self.sliced: dict[int, Slicing] = {}
        #: register -> why slicing could not make it fit
        self.unfit: dict[int, str] = {}
        #: register -> (equation, operand shapes, path, PathInfo, letter -> index name) of its contraction
        self.paths: dict[int, tuple[str, list[tuple[int, ...]], Any, Any, dict[str, str]]] = {}
        self.backend = backend
        self.optimize = optimize
        self.float_dtype = float_dtype
        self.shape: dict[int, tuple[int, ...]] = {k: tuple(shapes[name]) for k, name in enumerate(lowered.inputs)}
        self.dtype: dict[int, Any] = {k: dtypes[name] for k, name in enumerate(lowered.inputs)}
        self.booleans.update(k for k, dtype in self.dtype.items() if dtype == np.dtype(bool))
        self.namespace: dict[str, Any] = {}
        self.report: dict[int, tuple[int, list[tuple[str, int, tuple[int, ...]]], int]] = {}
        self.path_choices: dict[int, PathChoice] = {}
        self.transient: dict[int, int] = {}
        #: kernels of the steps computed block by block (``einflow.engine.blocks``), defined before the function
        self.kernels: list[str] = []
        #: register -> the temporaries of its elementwise step as one expression (as a chunked reduction
        #: computes it chunk by chunk), whether or not the step runs block by block
        self.expression_transient: dict[int, int] = {}
        self.blocks_name: str | None = None
        #: register -> the register whose array it updates in place (a diagonal added into its base)
        self.updated: dict[int, int] = {}
        #: register -> the array a window (a strided view, einflow.engine.affine) views
        self.window_views: dict[int, int] = {}
        #: contraction register -> (the convolution computing it, its operands) on backends with native
        #: convolutions (einflow.engine.convolution); scatter register -> the contraction that computed it whole
        self.convolutions: dict[int, tuple[Any, tuple[int, ...]]] = {}
        self.convolved_scatters: dict[int, int] = {}
        self.scattered = {step.arg for step in lowered.steps if isinstance(step, Scatter)}
        #: the type of the contraction being rendered (``scaled`` groups its scalar factors when it can)
        self.scale_dtype: Any = None
        self._generic: tuple[Source, dict[str, Any]] | None = None
        #: the generated code's name for einflow.engine.backends.torch_ops (torch contractions), once one needs it
        self.ops_alias: str | None = None
        #: register -> the order its axes are stored in, when that is not their order (a transposed view);
        #: tracked for torch, where the contractions read operands in their stored order
        self.orders: dict[int, tuple[int, ...]] = {}
        #: torch: the step being rendered reads and makes arrays of one floating type, so work on an array the
        #: step itself just made may be done in place (``(a + b).tanh_()``: one allocation fewer per pass)
        self.in_place = False
        self.tensor_literals = False  # (integer arrays are read in the step's floating type: ``read_as``)
        #: torch and jax: the floating type integer arrays are read in by the elementwise step being rendered
        self.read_as: str | None = None
        #: (statement, index) -> its size, as each statement's check found it (shifted reads size some)
        self.inferred: dict[tuple[int, str], int] = {}
        self.check(program, shapes, source)

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
                self.specialise(steps[position])
                position += 1
            if number in bindings:
                target, register = bindings[number]
                tensors[target] = self.shape[register] if register is not None else ()

    def resolve(self, ref: SizeRef) -> int:
        if isinstance(ref, Inferred):
            return self.inferred[(ref.statement, ref.index)]
        return ref if isinstance(ref, int) else self.shape[ref[0]][ref[1]]

    def specialise(self, step: Step) -> None:
        if isinstance(step, Free):
            return
        rule = PLAN_RULES[type(step)]
        if rule.shape is not None:
            self.shape[step.out] = rule.shape(self, step)
        else:
            self.shape[step.out] = tuple(self.resolve(ref) for ref in step.sizes)  # type: ignore[union-attr]
            if len(step.sizes) > MAX_AXES:
                text = self.lowered.statements[step.statement]
                text = text if len(text) <= 80 else text[:77] + "..."
                labels = ", ".join(getattr(step, "labels", getattr(step, "output", ()))[:4])
                raise ShapeError(f"statement {text!r} needs an array of {len(step.sizes)} axes (indices {labels}, "
                                 f"...) at once; arrays have at most {MAX_AXES}: split the statement so that each "
                                 "part keeps fewer indices")
        if rule.check is not None:
            rule.check(self, step)
        self.dtype[step.out] = self.dtype_of(step)
        if self.dtype[step.out] == np.dtype(bool):
            self.booleans.add(step.out)


    def sample(self, register: int) -> Any:
        dtype = self.dtype[register]
        if isinstance(dtype, type):  # a weak Python number
            return dtype(1)
        return np.ones((1,) * len(self.shape[register]), dtype=dtype)

    def dtype_of(self, step: Step) -> Any:
        """The result dtype, from running the step's generic code on one-element arrays of the input dtypes
        (the step's row of ``PLAN_RULES``)."""
        return PLAN_RULES[type(step)].dtype(self, step)

    def sampled(self, step: Step) -> tuple[Source, dict[str, Any]]:
        """``generic()`` with one-element arrays of the dtypes ``step`` reads in its namespace."""
        generic, namespace = self.generic()
        namespace.update({f"_v{register}": self.sample(register) for register in step_inputs(step)})
        return generic, namespace

    def evaluated_dtype(self, text: str, namespace: dict[str, Any]) -> Any:
        """The dtype of the generic code ``text`` run in ``namespace`` (weak Python numbers stay their type)."""
        with np.errstate(all="ignore"):
            try:
                value = eval(_compiled(text), namespace)  # noqa: S307 - text generated here from plain data
            except (TypeError, OverflowError) as error:
                raise EinflowError(f"cannot compute this program for inputs of these dtypes: {error}; cast the "
                                   "inputs (e.g. to float64) first") from None
        if type(value) in (int, float):  # weak Python numbers in, a weak number out (1 / N for N=4 is 0.25)
            return type(value)
        return np.asarray(value).dtype

    def generic(self) -> tuple[Source, dict[str, Any]]:
        """A shape-free renderer whose variables are ``_v<register>``, and a namespace to evaluate its text in."""
        if self._generic is None:
            generic = Source(self.lowered, _taken(self.lowered))
            generic.vars = {register: f"_v{register}" for register in range(self.lowered.register_count)}
            generic.booleans = self.booleans  # the same set: both renderings write subtractions alike
            namespace = _helpers(generic, np)
            namespace[generic.alias["oe"]] = oe
            namespace.update({f"_v{k}": self.sample(k) for k in range(len(self.lowered.inputs))})
            self._generic = (generic, namespace)
        return self._generic

    def itemsize(self, register: int) -> int:
        dtype = self.dtype[register]
        return 8 if isinstance(dtype, type) else np.dtype(dtype).itemsize

    # ------------------------------------------------------------------ rendering
    def size(self, ref: SizeRef) -> str:
        return repr(self.resolve(ref))

    def floating(self, x: str) -> str:
        # promotion is needed only when some input holds integers or booleans (a weak int included)
        if all(dtype is float or (not isinstance(dtype, type) and np.dtype(dtype).kind in "fc")
               for dtype in (self.dtype[k] for k in range(len(self.lowered.inputs)))):
            return x
        return super().floating(x)

    def as_float(self, text: str) -> str:
        if self.float_dtype is None:
            return text
        return self.astype(text, str(np.dtype(self.float_dtype)))

    def count(self, size: str) -> str:
        if self.float_dtype is not None and self.backend.numpy_native:  # a numpy scalar, as a sum would give
            return f"{self.alias['np']}.{np.dtype(self.float_dtype).name}({size})"
        return super().count(size)

    def contract(self, step: Contract) -> str:
        """The contraction's expression: an einsum planned pairwise, or one native convolution where the backend
        has them and the step reads a window (or feeds a scatter) as a convolution does."""
        text = self.einsum_contract(step)
        if convolution_kernel(self.backend) is not None and not step.scale and step.out not in self.fitting.budgets \
                and step.out in self.scattered and step.out not in self.convolutions:
            self.scatter_convolution(step)
        fused = self.convolutions.get(step.out)
        if fused is None:
            return text
        spec, args = fused
        helper = self.alias.get("convolve") or "_convolve"
        self.namespace[helper] = convolution_kernel(self.backend)
        permutation = spec[11]  # the convolution's own (contiguous) result, viewed in the output's order
        stored = tuple(permutation.index(axis) for axis in range(len(permutation)))
        self.orders.pop(step.out, None)
        if stored != tuple(range(len(stored))):
            self.orders[step.out] = stored
        self.transient[step.out] = 0
        operands = ", ".join(self.var(register) for register in args)
        return self.scaled(f"{helper}({operands}, {spec!r}, {str(self.common_dtype(step))!r})", step.scale)

    def scatter_convolution(self, step: Contract) -> None:
        """Record the transposed convolution computing ``step`` and the scatter that only it feeds, if it is one."""
        scatter = sole_reader(self.lowered.steps, step.out, self.lowered.outputs)
        if not isinstance(scatter, Scatter) or scatter.gathers or len(step.args) != 2 or \
                any(str(self.dtype[register]) not in CONVOLVED_TYPES for register in step.args):
            return
        spec = scatter_spec(scatter.labels, tuple(self.resolve(ref) for ref in scatter.sizes), scatter.arg_labels,
                            self.shape[step.out], scatter.positions, "")
        found = scatter_convolution(step.operands, tuple(self.shape[r] for r in step.args), step.output, spec)
        if found is not None:
            self.convolutions[step.out] = (found, step.args)
            self.convolved_scatters[scatter.out] = step.out

    def window_convolution(self, step: Window, spec: Any) -> bool:
        """Whether the window's only reader is a contraction with one other array that is a convolution: then
        recorded for it (the contraction reads the window's array itself) and the window is no step of its own."""
        reader = sole_reader(self.lowered.steps, step.out, self.lowered.outputs)
        if not isinstance(reader, Contract) or len(reader.args) != 2 or reader.args[0] == reader.args[1] or \
                reader.out in self.fitting.budgets or reader.out in self.convolutions:
            return False
        side = reader.args.index(step.out)
        other = reader.args[1 - side]
        if other not in self.dtype:  # made later in the statement: an identity window of an input, say
            maker = next((s for s in self.lowered.steps if getattr(s, "out", None) == other), None)
            other = maker.arg if isinstance(maker, Window) else other
        if str(self.dtype[step.arg]) not in CONVOLVED_TYPES or str(self.dtype.get(other)) not in CONVOLVED_TYPES:
            return False
        found = window_convolution(reader.operands[side], spec, self.shape[step.arg], reader.operands[1 - side],
                                   reader.output, tuple(self.resolve(ref) for ref in reader.sizes))
        if found is None:
            return False
        self.convolutions[reader.out] = (found, (step.arg, reader.args[1 - side]))
        self.window_views[step.out] = step.arg
        return True

    def einsum_contract(self, step: Contract) -> str:
        letters = {label: oe.get_symbol(k) for k, label in
                   enumerate(dict.fromkeys(label for labels in step.operands for label in labels))}
        # torch: each operand is taken in the axis order it is stored in (a transposed view is read as the
        # contiguous array it views), so matrix products pick their operands' layouts and an elementwise
        # product inside the contraction meets operands of one layout
        orders = [self.stored_order(register) for register in step.args] if self.target == "torch" else \
            [tuple(range(len(labels))) for labels in step.operands]
        operand_labels = [tuple(labels[a] for a in order) for labels, order in zip(step.operands, orders)]
        equation = ",".join("".join(letters[label] for label in labels) for labels in operand_labels)
        equation += "->" + "".join(letters[label] for label in step.output)
        shapes = [tuple(self.shape[register][a] for a in order) for register, order in zip(step.args, orders)]
        path, info, self.path_choices[step.out] = choose_path(equation, shapes, self.optimize)
        names = {letter: label for label, letter in letters.items()}
        pairwise = []
        for contraction in info.contraction_list:
            inds, removed, einsum_str = contraction[:3]
            inputs, result = einsum_str.split("->")
            flops = oe.helpers.flop_count(set(inputs.replace(",", "")), bool(removed), len(inds), info.size_dict)
            readable = ",".join("[" + ",".join(names[c] for c in part) + "]" for part in inputs.split(","))
            readable += " -> [" + ",".join(names[c] for c in result) + "]"
            pairwise.append((readable, int(flops), tuple(info.size_dict[c] for c in result)))
        self.report[step.out] = (int(info.opt_cost), pairwise, int(info.largest_intermediate))
        self.paths[step.out] = (equation, shapes, path, info, names)
        operands = [self.var(register) if order == tuple(range(len(order)))
                    else f"{self.var(register)}.permute({order})" for register, order in zip(step.args, orders)]
        if len(step.args) > 2 or step.scale or self.target != "numpy":  # (torch, jax: int64 with float32 is float32)
            # numpy's dtype rule: every pairwise step computes in the result type of all the factors, the
            # scale included (a bool or int8 pair must not saturate or wrap before a wider factor joins it);
            # two arrays alone already promote like numpy
            common = self.common_dtype(step)
            for position, register in enumerate(step.args):
                dtype = self.dtype[register]
                if not isinstance(dtype, type) and np.dtype(dtype) != common:
                    operands[position] = self.astype(operands[position], str(common))
        output_elements = math.prod(self.shape[step.out])
        scaled_inside = False
        itemsize = self.itemsize(step.out)
        if self.backend.pairwise_kernels:
            # each pairwise step as a direct call: a GEMM-shaped one as dot / matmul on (transposed) views,
            # an elementwise product as `*`, the rest einsum (torch: through einflow.engine.backends.torch_ops)
            if self.target == "torch" and self.ops_alias is None:
                self.ops_alias = self.fresh("_ops")
                self.namespace[self.ops_alias] = importlib.import_module(self.backend.einsum_backend)
            # scale factors: numbers, and 0-d values that do not widen a floating array (torch keeps its type)
            in_place = self.one_float_type(list(step.args), step.out) and all(
                self.dtype[r] in (int, float) or not self.shape[r] and np.dtype(self.dtype[r]).kind in "biuf"
                for factor in step.scale for r in node_args(factor))
            # numpy: the scale multiplies the smallest operand, intermediate or result (the dot product in
            # `w[i] t[i] t[p]`); torch scales the contraction's own new array in place (below)
            scale = self.scaled("", step.scale) if step.scale and self.backend.numpy_native else None
            text, internal, final, fresh = contraction_steps(equation, shapes, info.contraction_list, operands,
                                                             self.alias["np"], dialect=self.target,
                                                             ops_alias=self.ops_alias or "_ops", in_place=in_place,
                                                             scale=scale)
            scaled_inside = scale is not None
            # the result is computed in the order ``final`` and viewed in the output's order
            self.orders[step.out] = tuple(step.output.index(names[letter]) for letter in final)
        else:
            if step.scale:
                smallest = min(range(len(shapes)), key=lambda k: math.prod(shapes[k]))
                if math.prod(shapes[smallest]) < output_elements:
                    scaled_inside = True
                    operands[smallest] = "(" + self.scaled(operands[smallest], step.scale) + ")"
            name = self.fresh(f"_contract{step.out}")
            self.namespace[name] = oe.contract_expression(equation, *shapes, optimize=path)
            text = f"{name}({', '.join(operands)}, backend={self.backend.einsum_backend!r})"
            internal = max((math.prod(shape) for _, _, shape in pairwise[:-1]), default=0)
        self.transient[step.out] = internal * itemsize
        if step.scale and not scaled_inside:
            scaled = self.scaled("{x}", step.scale)
            if self.target == "torch" and fresh and in_place and scaled.startswith("{x} * "):
                # the contraction's own new array, scaled in place
                return f"{text}.mul_({scaled[len('{x} * '):]})"
            text = self.scaled(text, step.scale)
        return text

    def stored_order(self, register: int) -> tuple[int, ...]:
        """The order ``register``'s axes are stored in (major first): ``x.permute(order)`` is contiguous."""
        return self.orders.get(register, tuple(range(len(self.shape[register]))))

    def track_order(self, step: Step) -> None:
        """Record the stored axis order of an elementwise result or a sum (contractions record their own).

        torch lays an elementwise result out like its first operand of full rank; a sum keeps the order
        of the axes it keeps.
        """
        if isinstance(step, Elementwise):
            rank = len(step.labels)
            for node in _args_in_order(step.expr):
                axes = node.axes if node.axes is not None else tuple(range(len(self.shape[node.register])))
                if len(self.shape[node.register]) != rank or None in axes or len(axes) != rank:
                    continue
                order = tuple(axes.index(a) for a in self.stored_order(node.register))
                if order != tuple(range(rank)):
                    self.orders[step.out] = order
                return
        elif isinstance(step, Reduce) and step.kind == "sum" and step.arg in self.orders:
            kept = [a for a in self.orders[step.arg] if a not in step.axes]
            positions = sorted(kept)
            order = tuple(positions.index(a) for a in kept)
            if order != tuple(range(len(order))):
                self.orders[step.out] = order

    def scaled(self, text: str, scale: tuple[Node, ...]) -> str:
        """``text * (f1 * f2 * ...)``: scalar factors multiplied together first, then one pass over the array.

        Only when that gives numpy's type of ``text * f1 * f2 ...`` (the contraction's result type, a
        floating one): every factor a number, a size or a 0-d register of that type. Otherwise one
        multiplication per factor.
        """
        dtype = self.scale_dtype
        if dtype is None or len(scale) < 2 or np.dtype(dtype).kind != "f" or not all(
                isinstance(f, (Number, Size)) and not isinstance(getattr(f, "value", 0), bool)
                or isinstance(f, Arg) and not self.shape.get(f.register) and self.dtype.get(f.register) == dtype
                for f in scale):
            return super().scaled(text, scale)
        factors = []
        for factor in scale:
            factor_text, level = self.node(factor)
            factors.append(f"({factor_text})" if level < 2 else factor_text)
        return f"{text} * ({' * '.join(factors)})"

    def product_casts(self, node: Mul) -> dict[int, str]:
        # an elementwise product of arrays computes in numpy's result type of all of them (as one einsum
        # would): `a * b * c` with int16, uint16, float32 is float32, not int32 * float32 = float64
        arrays = [(k, f) for k, f in enumerate(node.factors) if isinstance(f, Arg)]
        if len(arrays) < 3 or not all(isinstance(f, (Arg, Number, Size)) for f in node.factors):
            return {}
        parts: list[Any] = []
        for factor in node.factors:
            if isinstance(factor, Arg):
                dtype = self.dtype[factor.register]
                parts.append(dtype(1) if isinstance(dtype, type) else np.dtype(dtype))
            else:
                parts.append(factor.value if isinstance(factor, Number) else 1)
        common = np.result_type(*parts)
        return {k: str(common) for k, f in arrays if not isinstance(self.dtype[f.register], type)
                and np.dtype(self.dtype[f.register]) != common}

    def divided(self, node: Mul, numerator: str, divisors: list[Node]) -> str:
        # arrays are divided with ``/`` (the helper is for Python numbers alone, where 1.0 / 0.0 would raise)
        if all(isinstance(self.dtype[register], type) for register in node_args(node)):
            return super().divided(node, numerator, divisors)
        text = numerator if self.target != "torch" else self.floating(numerator)
        for divisor in divisors:
            divisor_text = self.node(divisor)[0]  # (a square renders as ``x * x``: atoms and calls go bare)
            text += " / " + self.floating(divisor_text if isinstance(divisor, (Arg, Apply, Size)) else
                                          f"({divisor_text})")
        return text

    def product_order(self, node: Mul) -> list[int]:
        # integer or boolean arrays times a float number: the number multiplies the smallest array first, so
        # that the large product is made once, as floats (`0.5 u[i] v[j]` is `(u * 0.5) v`, not an integer
        # outer product converted afterwards: half the memory, and no integer overflow)
        order = list(range(len(node.factors)))
        arrays = [k for k, f in enumerate(node.factors) if isinstance(f, Arg)]
        numbers = [k for k, f in enumerate(node.factors) if isinstance(f, Number) and isinstance(f.value, float)]
        dtypes = [self.dtype[node.factors[k].register] for k in arrays]  # type: ignore[attr-defined]
        if self.target != "numpy" or len(arrays) < 2 or not numbers or any(
                isinstance(dtype, type) or np.dtype(dtype).kind not in "biu" for dtype in dtypes):
            return order
        smallest = min(arrays, key=lambda k: math.prod(self.shape[node.factors[k].register]))
        rest = [k for k in order if k != smallest and k not in numbers]
        return [smallest, *numbers, *rest]

    def common_dtype(self, step: Contract) -> np.dtype:
        """numpy's result type of a contraction's arrays and scale factors (Python numbers stay weak)."""
        def sample(register: int) -> Any:
            dtype = self.dtype[register]
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

    def one_float_type(self, registers: list[int], out: int) -> bool:
        """Whether the registers and ``out`` are arrays of one floating type (torch may then work in place)."""
        dtype = self.dtype[out]
        return self.target == "torch" and not isinstance(dtype, type) and np.dtype(dtype).kind == "f" and all(
            self.dtype[r] == dtype for r in registers)

    def node(self, node: Node) -> tuple[str, int]:
        if self.in_place:
            found = self.node_in_place(node)
            if found is not None:
                return found
        return super().node(node)

    def node_in_place(self, node: Node) -> tuple[str, int] | None:
        """torch: a function of a sum or product, or ``c - product``, computed in place on the array the sum
        or product just made (autograd allows it: those operations keep no output for their backward)."""
        if isinstance(node, Apply) and node.other is None and _fresh(node.arg):
            inner, _ = self.node(node.arg)
            np_ = self.alias["np"]
            if self.call(node.func, "{x}", promote=False) == f"{np_}.{node.func}({{x}})" and \
                    hasattr(_torch_tensor_type(), f"{node.func}_"):
                return f"({inner}).{node.func}_()", 4
        if isinstance(node, Add) and len(node.terms) == 2:
            numbers = [t for t in node.terms if isinstance(t, Number) and not isinstance(t.value, bool)]
            others = [t for t in node.terms if not isinstance(t, Number)]
            if len(numbers) == 1 and len(others) == 1:
                negated = _negated(others[0])
                if negated is not None and _fresh(negated) and not isinstance(negated, Add):
                    inner, _ = self.node(negated)
                    return f"({inner}).neg_().add_({self.number(numbers[0].value)})", 4
        return None

    def elementwise(self, step: Elementwise) -> str:
        self.in_place = self.one_float_type(node_args(step.expr), step.out)
        try:
            return self.elementwise_text(step)
        finally:
            self.in_place = False

    def elementwise_text(self, step: Elementwise) -> str:
        elements = math.prod(self.shape[step.out])
        hoisted: dict[Node, int] = {}
        if elements >= HOIST_ELEMENTS:  # a large product's factors that vary along few axes multiplied first
            step = replace(step, expr=_hoist(step.expr, self.shape[step.out], self.shape, hoisted))
        need, extra = _temporaries(step.expr)
        self.transient[step.out] = int(max(need - 1 + extra, 0) * elements * self.itemsize(step.out))
        self.expression_transient[step.out] = self.transient[step.out]
        # (a step fused into a chunked reduction, or computed in chunks into its result, is rendered for one
        # chunk there: one expression)
        # (blocks pay where the one expression makes two or more passes over the result: the hoisted small
        # products are not such passes, and in a block they would be spread to the block's whole size)
        if self.backend.numpy_native and elements >= BLOCK_ELEMENTS \
                and _operations(step.expr, 1, tuple(hoisted)) >= 2 \
                and step.out not in self.fitting.fused and step.out not in self.fitting.pieces:
            found = self.blocks_text(step)
            if found is not None:
                return found
        return super().elementwise(step)

    def blocks_text(self, step: Elementwise) -> str | None:
        """The step computed block by block (``einflow.engine.blocks``), or None when it cannot be computed alike:
        the result and every array operand of one floating type (Python numbers besides), each operand
        carrying the result's first axis whole, of size 1, or not at all."""
        shape = self.shape[step.out]
        dtype = self.dtype[step.out]
        if not shape or isinstance(dtype, type) or np.dtype(dtype) not in (np.dtype("float32"), np.dtype("float64")):
            return None
        name = self.fresh(f"_kernel{step.out}")
        kernel = render_kernel(name, step.expr, self.alias["np"], self.number, self.size)
        if kernel is None:
            return None
        operands, sliced = [], []
        for arg in kernel.operands:
            own = self.dtype[arg.register]
            rank = len(self.shape[arg.register])
            if isinstance(own, type) and own in (int, float) and not rank:
                sliced.append(False)  # a Python number: weak, as in the one-expression form
            elif isinstance(own, type) or np.dtype(own) != np.dtype(dtype):
                return None
            else:
                axis = (0 if rank == len(shape) else None) if arg.axes is None else arg.axes[0]
                length = 1 if axis is None or not rank else self.shape[arg.register][axis]
                if length not in (1, shape[0]):
                    return None
                sliced.append(length == shape[0] and axis is not None and rank > 0)
            operands.append(self.arg(arg))
        rows = block_rows(shape, self.itemsize(step.out))
        threads = threads_for(shape, rows)
        self.transient[step.out] = threads * kernel.buffers * rows * math.prod(shape[1:]) * self.itemsize(step.out)
        self.kernels.append(kernel.text)
        if self.blocks_name is None:
            self.blocks_name = self.fresh("_run_blocks")
            self.namespace[self.blocks_name] = run_blocks
        listed = ", ".join(operands) + ("," if len(operands) == 1 else "")
        return (f"{self.blocks_name}({name}, ({listed}), {tuple(sliced)!r}, {shape!r}, {str(np.dtype(dtype))!r}, "
                f"{rows}, {kernel.buffers})")

    def step_lines(self, step: Step) -> list[str]:
        rule = PLAN_RULES[type(step)]
        if rule.lines is not None:  # the step's own lines, never sliced nor chunked
            return rule.lines(self, step)
        # a contraction's scale factors are grouped when that keeps its type (``scaled``)
        self.scale_dtype = self.dtype[step.out] if isinstance(step, Contract) else None
        # torch and jax: integer arrays in an elementwise step of floating type are read in that type, as
        # numpy computes them (torch would compute ``0.5 x`` of int64 x in float32)
        dtype = self.dtype[step.out]
        self.read_as = np.dtype(dtype).name if self.target != "numpy" and isinstance(step, Elementwise) and \
            not isinstance(dtype, type) and np.dtype(dtype).kind in "fc" and self.native(dtype) else None
        try:
            fitted = self.fitted_lines(step)  # sliced or chunked to fit the memory limit (einflow.engine.fitting)
            if fitted is not None:
                return fitted
            inline = rule.inline(self, step) if rule.inline is not None else None
            if inline is not None:
                return inline
            return super().step_lines(step)
        finally:
            self.scale_dtype = None
            self.read_as = None
            if self.target == "torch":
                self.track_order(step)

    def arg(self, node: Arg) -> str:
        text = super().arg(node)
        dtype = self.dtype[node.register]
        if self.read_as is not None and not isinstance(dtype, type) and np.dtype(dtype).kind in "biu":
            return self.astype(text, self.read_as)
        return text

    def native(self, dtype: Any) -> bool:
        """Whether the backend's arrays can hold numpy's ``dtype`` (jax without x64 has no float64)."""
        return self.backend.holds(dtype)

    def returned(self) -> list[str]:
        """The results, each in numpy's result type on every backend (torch sums uint8 into int64, dask an int8
        contraction into int64: brought back to the type the planner derived with numpy's rules)."""
        names = super().returned()
        if self.backend.numpy_result_types:
            return names
        typed = []
        for name, register in zip(names, self.lowered.outputs):
            dtype = self.dtype[register]
            if isinstance(dtype, type) or not self.native(dtype):
                typed.append(name)
            else:
                typed.append(self.astype(name, np.dtype(dtype).name))
        return typed
    def window(self, step: Window) -> str:
        """A shifted or gathered read: the backend's kernel (``einflow.engine.affine``) with its plan as literals."""
        labels = step.labels
        spec = window_spec(labels, tuple(self.resolve(ref) for ref in step.sizes), self.shape[step.arg],
                           plain_positions(step.positions, labels), tuple(self.shape[g] for g in step.gathers),
                           step.name)
        if is_identity(spec, self.shape[step.arg]):
            return self.var(step.arg)
        if self.backend.native_convolution and self.window_convolution(step, spec):
            return self.var(step.arg)
        self.transient[step.out] = window_temporaries(spec, self.shape[step.arg], self.itemsize(step.arg))
        if is_view(spec, self.backend):
            self.window_views[step.out] = step.arg  # memory: a view of its array, as a transpose is
        helper = self.alias.get("window") or "_window"
        self.namespace[helper] = window_kernel(self.backend)
        gathers = "".join(f", {self.var(g)}" for g in step.gathers)
        return f"{helper}({self.var(step.arg)}, {spec!r}{gathers})"

    def floating_register(self, register: int) -> bool:
        """Whether a register holds a numpy array of a floating type (not a weak Python number)."""
        dtype = self.dtype[register]
        return not isinstance(dtype, type) and np.dtype(dtype).kind == "f"

    def normaliser_lines(self, step: Reduce) -> list[str] | None:
        """A max-shifted softmax / log_softmax / logsumexp written out for a non-empty float numpy array, as the
        ``reduce`` helper computes it (a non-finite maximum shifts by 0) but without its generic checks, and
        with the exponentials taken in place; None elsewhere (the helper is called)."""
        dtype = self.dtype[step.arg]
        if not self.backend.numpy_native or isinstance(dtype, type) or np.dtype(dtype).kind != "f" \
                or not math.prod(self.shape[step.arg]):
            return None
        np_, x, out = self.alias["np"], self.var(step.arg), self.var(step.out)
        shift, work = self.fresh("_shift"), self.fresh("_e")
        axes = repr(step.axes)
        shape = self.shape[step.arg]
        if math.prod(size for k, size in enumerate(shape) if k not in step.axes) == 1:
            finite = self.fresh("_isfinite")  # one maximum: a Python test, a fifth of a ufunc call's cost
            self.namespace[finite] = math.isfinite
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

    def diagonal_add(self, step: Diagonal, out: str, value: str) -> list[str]:
        """Adding into a large diagonal view with a short axis goes slice by slice along that axis: numpy cannot
        tell quickly that such a view (``H[p,q,r,q]``, strides of every size) does not overlap itself, and makes
        a copy of it for ``+=`` (measured: a third of the pairwise-energy Hessian's size for ``q`` of size 3)."""
        labels = diagonal_view_labels(step)
        full = self.shape[step.out]
        shape = tuple(full[step.output.index(label)] for label in labels)
        if not self.backend.numpy_native or len(shape) < 2 or math.prod(shape) < BLOCK_ELEMENTS \
                or min(shape) > DIAGONAL_LOOP:
            return super().diagonal_add(step, out, value)
        axis = shape.index(min(shape))
        np_ = self.alias["np"]
        view, part, k = self.fresh("_diagonal"), self.fresh("_value"), self.fresh("_k")
        cut = ":, " * axis + k
        return [f"{view} = {np_}.einsum({diagonal_spec(step)!r}, {out})",
                f"{part} = {np_}.broadcast_to({value}, {shape!r})",
                f"for {k} in range({shape[axis]}):",
                f"    {view}[{cut}] += {part}[{cut}]",
                f"del {view}, {part}"]

    def diagonal(self, step: Diagonal, out: str) -> list[str]:
        value = self.diagonal_value(step)
        if step.base is not None and self.backend.numpy_native:
            base = self.var(step.base)
            made = next(made for made in self.lowered.steps if getattr(made, "out", None) == step.base)
            full = not isinstance(made, Elementwise) or len(_axes_of(made.expr, len(made.labels), self.shape)) == \
                len(made.labels)  # an elementwise base that some axis does not vary along is a broadcast shape
            if full and self.shape[step.base] == self.shape[step.out] and self.dtype[step.base] == self.dtype[step.out]:
                self.updated[step.out] = step.base  # the base is this step's alone: its diagonal is updated
                first = f"{out} = {base}"
            else:
                first = f"{out} = {self.alias['np']}.broadcast_to({base}, {self.shape[step.out]!r})" \
                        f".astype({str(self.dtype[step.out])!r})"
            return [first, *self.diagonal_add(step, out, value)]
        if self.backend.numpy_native or self.target != "numpy":
            return super().diagonal(step, out)
        name = self.fresh(f"_diagonal{step.out}")
        self.namespace[name] = _diagonal_writer(self.backend, replace(step, labels=diagonal_view_labels(step)),
                                                self.shape[step.out])
        written = f"{name}({self.diagonal_value(step, True)})"
        return [f"{out} = {written}" if step.base is None else f"{out} = {self.var(step.base)} + {written}"]


def _fresh(node: Node) -> bool:
    """Whether torch computes ``node`` into a new array that nothing else holds (a sum or product of arrays)."""
    if isinstance(node, Add):
        return any(not isinstance(term, (Number, Size)) for term in node.terms)
    if isinstance(node, Mul):
        return len(node.factors) >= 2 and any(not isinstance(f, (Number, Size)) for f in node.factors)
    return isinstance(node, Pow) and node.exponent == 2


@functools.lru_cache(maxsize=1)
def _torch_tensor_type() -> Any:
    import torch

    return torch.Tensor


@functools.lru_cache(maxsize=1024)
def _compiled(text: str) -> Any:
    return compile(text, "<einflow dtype>", "eval")


def _diagonal_writer(backend: Backend, step: Diagonal, full_shape: tuple[int, ...]) -> Any:
    """A surviving delta on backends without strided writes (or with their own): one function per step (its
    ``labels``: the axes of the diagonal view, ``diagonal_view_labels``)."""
    view_shape = tuple(full_shape[step.output.index(label)] for label in step.labels)
    groups = [tuple(step.output.index(m) for m in next((g for g in step.groups if label in g), (label,)))
              for label in step.labels]
    if not backend.strided_writes:
        letters = {label: oe.get_symbol(k) for k, label in enumerate(dict.fromkeys((*step.labels, *step.output)))}
        eyes = [(group[0], member) for group in step.groups for member in group[1:]]
        spec = "".join(letters[label] for label in step.labels)
        spec += "".join("," + letters[a] + letters[b] for a, b in eyes)
        spec += "->" + "".join(letters[label] for label in step.output)
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


_HELPER_CACHE: dict[tuple[Any, ...], dict[str, Any]] = {}


def _helpers(source: Source, xp: Any) -> dict[str, Any]:
    """The generated code's helper functions under the renderer's names, on the array module ``xp`` (cached)."""
    key = (tuple(sorted(source.alias.items())), xp.__name__, source.target)
    found = _HELPER_CACHE.get(key)
    if found is None:
        found = {source.alias["np"]: xp, "MatrixError": MatrixError}  # raised by the linalg helper's checks
        for name in HELPER_KEYS:
            exec(source.helper_text(name), found)  # noqa: S102 - our own helper text
        if len(_HELPER_CACHE) < 64:
            _HELPER_CACHE[key] = found
    return dict(found)


def _taken(lowered: Lowered) -> set[str]:
    return set(lowered.inputs) | {name for _, name in lowered.names}


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
    lowered = lower(program)
    if dtypes is None:
        default = np.dtype(f"f{itemsize}") if itemsize in (2, 4, 8) else np.dtype("float64")
        dtypes = {name: default for name in info.inputs}
    specialiser, plan = _render(program, lowered, shapes, dtypes, backend, optimize, source, float_dtype, None)
    if memory_limit is None:
        return plan
    peak, at = _peak(lowered.steps, plan.allocations, plan.transients)
    fitting = None
    if slicing and backend.slices and (peak > memory_limit or backend.lazy):
        fitting = fit(lowered, specialiser, plan.allocations, plan.transients, memory_limit, backend)
        if fitting:
            specialiser, plan = _render(program, lowered, shapes, dtypes, backend, optimize, source, float_dtype,
                                        fitting)
            peak, at = _peak(lowered.steps, plan.allocations, plan.transients)
    if peak > memory_limit and not backend.lazy:
        statement = next((s.statement for s in lowered.steps if getattr(s, "out", None) == at), 0)
        shape = specialiser.shape.get(at, ())
        if not slicing:
            why = "slicing is off (slicing=False). "
        elif not backend.slices:
            why = f"the {backend.name} backend does not slice. "
        else:
            reasons = {**(fitting.reasons if fitting is not None else {}), **specialiser.unfit}
            # the reason of the step at the peak first (an earlier step may be over only for what comes later)
            found = reasons.get(at) or next(iter(reasons.values()), "slicing cannot lower the peak further")
            why = found + ". "
        raise MemoryLimitError(
            f"the plan needs {format_bytes(peak)} at its peak (while computing an array of shape {shape} in "
            f"statement '{lowered.statements[statement]}'), over the memory limit of {format_bytes(memory_limit)}; "
            f"nothing was allocated. {why[0].upper()}{why[1:]}Use backend='dask' to compute in chunks, try "
            "another optimize= choice, raise memory_limit=, or shrink the problem")
    return plan


def _render(program: ir.ProgramIR, lowered: Lowered, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any],
            backend: Backend, optimize: Any, source: str | None, float_dtype: Any,
            fitting: Fitting | None) -> tuple[_Specialiser, Plan]:
    """Render and compile the steps (sliced and chunked as ``fitting`` says), with the memory each allocates."""
    specialiser = _Specialiser(lowered, program, shapes, dtypes, backend, optimize, source, float_dtype, fitting)
    body = specialiser.body()  # renders every step: contraction paths, transients
    outputs = specialiser.returned()
    result = ", ".join(outputs) + ("," if len(outputs) == 1 else "") if lowered.returns_tuple else outputs[0]
    parameters = ", ".join(specialiser.vars[k] for k in range(len(lowered.inputs)))
    kernels = [line for kernel in specialiser.kernels for line in (kernel, "")]
    text = "\n".join([*kernels, f"def _run({parameters}):", *body, f"    return {result}", ""])
    namespace = {**_helpers(specialiser, backend.xp), **specialiser.namespace, specialiser.alias["oe"]: oe}
    exec(compile(text, "<einflow plan>", "exec"), namespace)  # noqa: S102 - generated here from plain data
    allocations: dict[int, int] = {}
    views: dict[int, int] = {}
    report: list[PlanStep] = []
    for step in lowered.steps:
        if isinstance(step, Free):
            continue
        out = step.out
        shape = specialiser.shape[out]
        size = specialiser.itemsize(out)
        if isinstance(step, Elementwise) and isinstance(step.expr, Arg):
            views[out] = step.expr.register
        elif out in specialiser.updated:
            views[out] = specialiser.updated[out]
        elif out in specialiser.window_views:
            views[out] = specialiser.window_views[out]
        elif out not in specialiser.fitting.fused:  # a fused expression exists only chunk by chunk
            allocations[out] = math.prod(shape) * size
        report.append(_report_step(step, specialiser, lowered))
    plan = Plan(lowered, backend, report, tuple(specialiser.shape[o] for o in lowered.outputs),
                lowered.returns_tuple, text, namespace["_run"], allocations, views, specialiser.transient)
    return specialiser, plan


# ---------------------------------------------------------------------------------------------- plan rules
# One row per step kind, for what the specialiser decides with the shapes and dtypes: the result's shape
# (``shape``; None: its sizes resolved), a check of the shapes (``check``), the result's dtype (``dtype``),
# the plan report's FLOPs (``count``) and text (``describe``; None: the step's note, see
# ``codegen.STEP_RULES``), the step's own lines (``lines``: replacing the generic rendering, never sliced
# nor chunked) and lines tried before the generic rendering once fitting leaves the step whole (``inline``).


def _free_lines(specialiser: _Specialiser, step: Free) -> list[str]:
    # small arrays: releasing them early costs more time than it saves memory
    held = specialiser.fitting.held()  # read later, inside a loop computing an expression in blocks
    big = [r for r in step.registers if math.prod(specialiser.shape.get(r, ())) * specialiser.itemsize(r)
           >= RELEASE_BYTES and r not in held]
    return Source.step_lines(specialiser, Free(step.statement, tuple(big))) if big else []


def _scatter_lines(specialiser: _Specialiser, step: Scatter) -> list[str]:
    if step.out in specialiser.convolved_scatters:  # computed whole by a transposed convolution
        specialiser.window_views[step.out] = step.arg
        return [f"{specialiser.var(step.out)} = {specialiser.var(step.arg)}"]
    spec = scatter_spec(step.labels, tuple(specialiser.resolve(ref) for ref in step.sizes), step.arg_labels,
                        specialiser.shape[step.arg], step.positions, specialiser.lowered.statements[step.statement])
    specialiser.transient[step.out] = scatter_temporaries(spec)
    helper = specialiser.alias.get("scatter") or "_scatter"
    specialiser.namespace[helper] = scatter_kernel(specialiser.backend)
    gathers = "".join(f", {specialiser.var(g)}" for g in step.gathers)
    return [f"{specialiser.var(step.out)} = {helper}({specialiser.var(step.arg)}, {spec!r}{gathers})"]


def _reduce_inline(specialiser: _Specialiser, step: Reduce) -> list[str] | None:
    if step.kind in ("softmax", "log_softmax", "logsumexp"):
        inline = specialiser.normaliser_lines(step)
        if inline is not None:
            return inline
    if specialiser.backend.lazy and not math.prod(specialiser.shape[step.out]) \
            and step.kind in ("max", "min", "argmax", "argmin"):
        # an empty result (its other axes are empty): dask's chunked max of empty blocks raises
        return [f"{specialiser.var(step.out)} = {specialiser.alias['np']}.zeros({specialiser.shape[step.out]!r}, "
                f"dtype={np.dtype(specialiser.dtype[step.out]).name!r})"]
    if specialiser.backend.numpy_native and (
            step.kind in ("max", "min") or step.kind == "mean" and specialiser.floating_register(step.arg)):
        # the array's own method, as the ``reduce`` helper would call it, without the call through it
        return [f"{specialiser.var(step.out)} = {specialiser.var(step.arg)}.{step.kind}(axis={step.axes!r})"]
    return None


def _reduce_check(specialiser: _Specialiser, step: Reduce) -> None:
    if step.kind in ("max", "min", "argmax", "argmin") and \
            any(specialiser.shape[step.arg][axis] == 0 for axis in step.axes):
        empty = next(step.labels[axis] for axis in step.axes if specialiser.shape[step.arg][axis] == 0)
        raise ShapeError(f"{step.kind}[{empty}] over index {empty!r} of size 0: the {step.kind} of no values is "
                         "undefined (numpy refuses it alike); give the index at least one value")


def _diagonal_dtype(specialiser: _Specialiser, step: Diagonal) -> Any:
    value = specialiser.sample(step.arg)
    if not _is_unit(step.coefficient):
        value = value * step.coefficient
    return np.result_type(value if step.base is None else specialiser.sample(step.base) + value)


def _elementwise_dtype(specialiser: _Specialiser, step: Elementwise) -> Any:
    generic, namespace = specialiser.sampled(step)
    return specialiser.evaluated_dtype(generic.elementwise(step), namespace)


def _contract_dtype(specialiser: _Specialiser, step: Contract) -> Any:
    generic, namespace = specialiser.sampled(step)
    # einsum's type is its operands' (bools stay bools), then the scale's
    namespace["_contracted"] = np.ones((1,), dtype=np.result_type(*(specialiser.sample(r) for r in step.args)))
    return specialiser.evaluated_dtype(generic.scaled("_contracted", step.scale), namespace)


def _solve_dtype(specialiser: _Specialiser, step: Solve) -> Any:
    specialiser.sampled(step)
    return linalg_dtype(np.result_type(specialiser.dtype[step.matrix], specialiser.dtype[step.rhs]))


def _reduce_dtype(specialiser: _Specialiser, step: Reduce) -> Any:
    generic, namespace = specialiser.sampled(step)
    if is_linalg(step):
        return linalg_result_dtype(step.kind, specialiser.dtype[step.arg])
    if step.kind == "sum":
        return specialiser.sample(step.arg).sum(axis=step.axes).dtype
    # max keeps the type; mean, the normalisers and logsumexp compute in floats (the reduce helper)
    with np.errstate(all="ignore"):
        sample = np.asarray(specialiser.sample(step.arg))
        return np.asarray(namespace[generic.alias["reduce"]](step.kind, sample, step.axes)).dtype


def _reduce_flops(specialiser: _Specialiser, step: Reduce) -> int:
    if is_linalg(step):
        return linalg_flops(step.kind, specialiser.shape[step.arg], step.axes)
    return math.prod(specialiser.shape[step.arg])


def _solve_flops(specialiser: _Specialiser, step: Solve) -> int:
    n = specialiser.shape[step.matrix][step.axes[0]]
    return solve_flops(step.kind, n, math.prod(specialiser.shape[step.rhs]) // max(n, 1))


def _diagonal_flops(specialiser: _Specialiser, step: Diagonal) -> int:
    shape = specialiser.shape[step.out]
    if step.base is not None:  # an addition into the diagonal only
        return math.prod(shape[step.output.index(label)] for label in diagonal_view_labels(step))
    return math.prod(shape)


def _elements(specialiser: _Specialiser, step: Step) -> int:
    return math.prod(specialiser.shape[step.out])  # type: ignore[union-attr]


@dataclass(frozen=True)
class PlanRule:
    """One step kind as the specialiser sees it: ``shape(specialiser, step)`` its result's shape (None: the
    step's ``sizes`` resolved); ``check(specialiser, step)`` raises ShapeError for shapes it cannot compute
    with (None: none); ``dtype(specialiser, step)`` its result's dtype;
    ``count(specialiser, step)`` its FLOPs in the plan report; ``describe(specialiser, step)`` the report's text
    (None: the step's note); ``lines(specialiser, step)`` its own lines (None: sliced or chunked when it must
    fit, else ``inline`` or the generic rendering); ``inline(specialiser, step)`` lines tried before the generic
    rendering (None when they do not apply)."""

    dtype: Callable[[Any, Any], Any]
    count: Callable[[Any, Any], int]
    describe: Callable[[Any, Any], str] | None = None
    lines: Callable[[Any, Any], list[str]] | None = None
    inline: Callable[[Any, Any], list[str] | None] | None = None
    shape: Callable[[Any, Any], tuple[int, ...]] | None = None
    check: Callable[[Any, Any], None] | None = None


def _no_dtype(specialiser: _Specialiser, step: Step) -> Any:
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
        count=lambda specialiser, step: specialiser.report[step.out][0]),
    Reduce: PlanRule(  # plain reductions, the normalisers and the linear-algebra kinds (einflow.engine.linalg)
        dtype=_reduce_dtype,
        count=_reduce_flops,
        inline=_reduce_inline,
        check=_reduce_check),
    Solve: PlanRule(
        dtype=_solve_dtype,
        count=_solve_flops),
    Elementwise: PlanRule(
        dtype=_elementwise_dtype,
        count=lambda specialiser, step: _elements(specialiser, step) * max(1, _operations(step.expr)),
        describe=lambda specialiser, step: _describe(step.expr, step.labels, specialiser)),
    Diagonal: PlanRule(
        dtype=_diagonal_dtype,
        count=_diagonal_flops),
    Window: PlanRule(
        dtype=lambda specialiser, step: specialiser.dtype[step.arg],
        count=_elements,
        lines=lambda specialiser, step: [f"{specialiser.var(step.out)} = {specialiser.window(step)}"]),
    Scatter: PlanRule(
        dtype=lambda specialiser, step: specialiser.dtype[step.arg],
        count=_elements,
        lines=_scatter_lines),
    Free: PlanRule(
        dtype=_no_dtype,
        count=lambda specialiser, step: 0,
        lines=_free_lines),
}

assert set(PLAN_RULES) == set(Step.__args__)  # type: ignore[attr-defined]


def _report_step(step: Step, specialiser: _Specialiser, lowered: Lowered) -> PlanStep:
    reported = _step_report(step, specialiser, lowered)
    out = step.out  # type: ignore[union-attr]
    sliced = specialiser.sliced.get(out)
    if sliced is not None:
        names = specialiser.paths[out][4]
        reported.sliced = tuple(names[label] for label in sliced.labels)
        reported.slices, reported.overhead = sliced.slices, sliced.overhead
    for computed, (position, count, diagonals) in specialiser.fitting.pieces.items():
        if out == computed:  # an expression computed in blocks into its whole result
            reported.sliced, reported.slices = (step.labels[position],), count  # type: ignore[union-attr]
        elif out in [diagonal.out for diagonal in diagonals]:  # a diagonal array made block by block
            reported.chunked, reported.largest = True, -(-math.prod(reported.shape) // count)
    for reduced, (source, position, count) in specialiser.fitting.chunks.items():
        if out in (reduced, source.out):  # a fused expression and its reduction, chunk by chunk
            reported.sliced, reported.slices = (source.labels[position],), count
            if out == source.out:
                reported.chunked, reported.largest = True, -(-math.prod(reported.shape) // count)
    return reported


def _step_report(step: Step, specialiser: _Specialiser, lowered: Lowered) -> PlanStep:
    out = step.out  # type: ignore[union-attr]
    shape = specialiser.shape[out]
    statement = lowered.statements[step.statement]
    size = specialiser.itemsize(out)
    kind = kind_of(step)
    equation = specialiser.note(0, step).split(" ", 2)[2] if len(specialiser.note(0, step).split(" ", 2)) > 2 else ""
    rule = PLAN_RULES[type(step)]
    text = equation if rule.describe is None else rule.describe(specialiser, step)
    flops = rule.count(specialiser, step)
    if out in specialiser.report:  # a contraction: its pairwise steps, largest intermediate and path
        _, pairwise, largest = specialiser.report[out]
        return PlanStep(statement, kind, text, flops, shape, size, pairwise, largest,
                        path=specialiser.path_choices.get(out))
    return PlanStep(statement, kind, text, flops, shape, size)


#: a product's factors that together vary along at most 1/HOIST_SHARE of its elements are multiplied first
HOIST_SHARE = 8


def _hoist(node: Node, shape: tuple[int, ...], shapes: dict[int, tuple[int, ...]], hoisted: dict[Node, int]) -> Node:
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


def _axes_of(node: Node, rank: int, shapes: dict[int, tuple[int, ...]]) -> set[int]:
    """The axes of an expression's result (of ``rank`` axes) along which it varies."""
    if isinstance(node, Arg):
        if node.axes is None:
            return set(range(rank)) if shapes.get(node.register) else set()
        return {position for position, axis in enumerate(node.axes) if axis is not None}
    return {axis for register_node in arg_nodes(node) for axis in _axes_of(register_node, rank, shapes)}


