"""Render: the specialised record (and the fitting's decisions) as one straight-line Python function.

:func:`render` writes the steps of a :class:`einflow.engine.specialise.Specialised` record with literal sizes:
contractions as direct BLAS calls on numpy (:mod:`einflow.engine.kernels`), large fused elementwise work block
by block on threads (:mod:`einflow.engine.blocks`), sliced and chunked steps as the fitting decided
(:mod:`einflow.engine.render_fitted`). It reads the record and the fitting and never changes them: every
shape, dtype, path, layout and memory figure was decided before; what rendering adds is names and text.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import opt_einsum as oe

import einflow.engine.measure as measure_rows
from einflow.engine.affine import is_identity, scatter_kernel, window_kernel
from einflow.engine.backends.base import Backend
from einflow.engine.blocks import render_kernel, run_blocks
from einflow.engine.codegen import Source
from einflow.engine.convolution import convolution_kernel
from einflow.engine.fitting import Fitting
from einflow.engine.helpers import helpers
from einflow.engine.measure import NP, OPS, common_dtype, one_float_type
from einflow.engine.render_fitted import fitted_lines
from einflow.engine.rows import diagonal_spec, diagonal_view_labels, negation_of
from einflow.engine.slicing import scatter_chunks, window_chunks
from einflow.engine.specialise import Specialised
from einflow.engine.steps import (
    Add,
    Apply,
    Arg,
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Mul,
    Node,
    Number,
    Pow,
    Reduce,
    Scatter,
    Size,
    SizeRef,
    Step,
    Window,
    arg_nodes,
    node_args,
)
from einflow.lang.indices import einsum_equation, index_letters

__all__ = ["Rendered", "Renderer", "render", "RENDER_RULES", "StepContext"]

#: a large diagonal view with an axis this short or shorter is added into slice by slice along that axis
DIAGONAL_LOOP = 16
#: intermediates of at least this many bytes are released (``del``) right after their last use
RELEASE_BYTES = 1 << 16


@dataclass(frozen=True)
class StepContext:
    """What rendering one step knows of it beyond the record: ``scale_dtype``, the type of the contraction at
    hand (``scaled`` groups its scalar factors when that keeps it); ``read_as``, torch and jax: the floating type
    an elementwise step reads its integer arrays in, as numpy computes them (torch would compute ``0.5 x`` of
    int64 x in float32); ``in_place``, torch: the elementwise expression at hand reads and makes arrays of one
    floating type, so work on an array it just made may be done in place (``(a + b).tanh_()``)."""

    scale_dtype: Any = None
    read_as: str | None = None
    in_place: bool = False


#: the context outside any step
NO_CONTEXT = StepContext()


@dataclass(frozen=True)
class Rendered:
    """The generated function's source, the function, and the renderer that named its variables (the plan
    report names registers as the code does)."""

    source: str
    function: Any
    names: Source


def render(record: Specialised, fitting: Fitting) -> Rendered:
    """Render and compile the record's steps, sliced and chunked as ``fitting`` says."""
    renderer = Renderer(record, fitting)
    lowered = record.lowered
    body = renderer.body()
    outputs = renderer.returned()
    result = ", ".join(outputs) + ("," if len(outputs) == 1 else "") if lowered.returns_tuple else outputs[0]
    parameters = ", ".join(renderer.vars[k] for k in range(len(lowered.inputs)))
    kernels = [line for kernel in renderer.kernels for line in (kernel, "")]
    text = "\n".join([*kernels, f"def _run({parameters}):", *body, f"    return {result}", ""])
    namespace = {**helpers(renderer.alias, renderer.dialect, record.backend.xp), **renderer.namespace,
                 renderer.alias["oe"]: oe}
    exec(compile(text, "<einflow plan>", "exec"), namespace)  # noqa: S102 - generated here from plain data
    return Rendered(text, namespace["_run"], renderer)


def _real_part_of(dtype: np.dtype, common: np.dtype) -> bool:
    """Whether ``dtype`` is the real type of complex ``common`` (float64 of complex128): numpy computes its
    products with the other factors in that precision, as it would after the cast (a product of two such
    reals is the real part of their complex product), so the cast, a copy per call, is left out."""
    return dtype.kind == "f" and common.kind == "c" and dtype.itemsize * 2 == common.itemsize


class Renderer(Source):
    """Renders the steps for one signature: literal sizes, planned contractions, fused elementwise engines."""

    def __init__(self, record: Specialised, fitting: Fitting) -> None:
        super().__init__(record.lowered, set(record.taken), record.backend.dialect)
        self.record = record
        #: what to slice or compute in chunks to fit the memory limit
        self.fitting = fitting
        self.backend = record.backend
        self.float_dtype = record.float_dtype
        self.shape = record.shapes
        self.dtype = record.dtypes
        self.booleans = set(record.booleans)
        #: the generated function's globals besides the helpers (kernels, contract expressions, slice tables)
        self.namespace: dict[str, Any] = {}
        #: kernels of the steps computed block by block (``einflow.engine.blocks``), defined before the function
        self.kernels: list[str] = []
        self.blocks_name: str | None = None
        #: what rendering the step at hand knows of it (one frozen value per step, never changed in place)
        self.context = NO_CONTEXT
        #: the generated code's name for einflow.engine.backends.torch_ops (torch contractions), once one needs it
        self.ops_alias: str | None = None
        self.tensor_literals = False  # (integer arrays are read in the step's floating type: ``read_as``)
        #: dask: the generated code's name for dask_ops.broadcast_operands, once a broadcast needs it
        self.broadcast_helper: str | None = None

    def itemsize(self, register: int) -> int:
        return self.record.itemsize(register)

    def resolve(self, ref: SizeRef) -> int:
        return self.record.resolve(ref)

    def size(self, ref: SizeRef) -> str:
        return repr(self.record.resolve(ref))

    def floating(self, x: str) -> str:
        # promotion is needed only when some input holds integers or booleans (a weak int included)
        floating = self.__dict__.get("_floating_inputs")
        if floating is None:  # (once: a program of n functions asks n times)
            floating = self.__dict__["_floating_inputs"] = all(
                dtype is float or (not isinstance(dtype, type) and np.dtype(dtype).kind in "fc")
                for dtype in (self.dtype[k] for k in range(len(self.lowered.inputs))))
        if floating:
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

    def common_dtype(self, step: Contract) -> np.dtype:
        return common_dtype(self.dtype, step)

    def one_float_type(self, registers: list[int], out: int) -> bool:
        return one_float_type(self.dialect, self.dtype, registers, out)

    def contract(self, step: Contract) -> str:
        fused = self.record.convolutions.get(step.out)
        if fused is not None:  # one native convolution (einflow.engine.convolution)
            spec, args = fused
            helper = self.alias.get("convolve") or "_convolve"
            self.namespace[helper] = convolution_kernel(self.backend)
            arguments = ", ".join(self.var(register) for register in args)
            return self.scaled(f"{helper}({arguments}, {spec!r}, {str(self.common_dtype(step))!r})", step.scale)
        planned = self.record.contractions[step.out]
        equation, shapes, orders = planned.equation, planned.shapes, planned.orders
        operands = [self.var(register) if order == tuple(range(len(order)))
                    else f"{self.var(register)}.{self.dialect.permute}({order})"
                    for register, order in zip(step.args, orders)]
        if len(step.args) > 2 or step.scale or not self.dialect.numpy_types:  # (torch: int64 * float32 is float32)
            # numpy's dtype rule: every pairwise step computes in the result type of all the factors, the
            # scale included (a bool or int8 pair must not saturate or wrap before a wider factor joins it);
            # two arrays alone already promote like numpy
            common = self.common_dtype(step)
            for position, register in enumerate(step.args):
                dtype = self.dtype[register]
                if not isinstance(dtype, type) and np.dtype(dtype) != common and not (
                        self.dialect.numpy_types and _real_part_of(np.dtype(dtype), common)):
                    operands[position] = self.astype(operands[position], str(common))
        output_elements = math.prod(self.shape[step.out])
        scaled_inside = False
        fresh = in_place = False
        if self.backend.pairwise_kernels:
            # each pairwise step as a direct call: a GEMM-shaped one as dot / matmul on (transposed) views,
            # an elementwise product as `*`, the rest einsum (torch: through einflow.engine.backends.torch_ops)
            if not self.backend.numpy_native and self.ops_alias is None:  # (torch: its ops module)
                self.ops_alias = self.fresh("_ops")
                self.namespace[self.ops_alias] = importlib.import_module(self.backend.einsum_backend)
            in_place, fresh = planned.in_place, planned.fresh
            # numpy: the scale multiplies the smallest operand, intermediate or result (the dot product in
            # `w[i] t[i] t[p]`); torch scales the contraction's own new array in place (below)
            scale = self.scaled("", step.scale) if step.scale and self.backend.numpy_native else None
            assert planned.text is not None
            text = planned.text.format(*operands, scale=scale).replace(NP, self.alias["np"]) \
                .replace(OPS, self.ops_alias or "_ops")
            scaled_inside = scale is not None
        else:
            if step.scale:
                smallest = min(range(len(shapes)), key=lambda k: math.prod(shapes[k]))
                if math.prod(shapes[smallest]) < output_elements:
                    scaled_inside = True
                    operands[smallest] = "(" + self.scaled(operands[smallest], step.scale) + ")"
            name = self.fresh(f"_contract{step.out}")
            self.namespace[name] = oe.contract_expression(equation, *shapes, optimize=planned.path)
            text = f"{name}({', '.join(operands)}, backend={self.backend.einsum_backend!r})"
        if step.scale and not scaled_inside:
            scaled = self.scaled("{x}", step.scale)
            if self.dialect.in_place and fresh and in_place and scaled.startswith("{x} * "):
                # the contraction's own new array, scaled in place
                return f"{text}.mul_({scaled[len('{x} * '):]})"
            text = self.scaled(text, step.scale)
        return text

    def scaled(self, text: str, scale: tuple[Node, ...]) -> str:
        """``text * (f1 * f2 * ...)``: scalar factors multiplied together first, then one pass over the array.

        Only when that gives numpy's type of ``text * f1 * f2 ...`` (the contraction's result type, a
        floating one): every factor a number, a size or a 0-d register of that type. Otherwise one
        multiplication per factor.
        """
        dtype = self.context.scale_dtype
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
        text = self.floating(numerator) if self.dialect.floats_before_division else numerator
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
        registers = {k: f.register for k, f in enumerate(node.factors) if isinstance(f, Arg)}
        arrays = list(registers)
        numbers = [k for k, f in enumerate(node.factors) if isinstance(f, Number) and isinstance(f.value, float)]
        dtypes = [self.dtype[registers[k]] for k in arrays]
        others = [k for k in order if k not in arrays and k not in numbers]  # calls, powers: maybe floating
        if not self.dialect.numpy_types or len(arrays) < 2 or not numbers or others or any(
                isinstance(dtype, type) or np.dtype(dtype).kind not in "biu" for dtype in dtypes):
            return order
        smallest = min(arrays, key=lambda k: math.prod(self.shape[registers[k]]))
        rest = [k for k in order if k != smallest and k not in numbers]
        return [smallest, *numbers, *rest]

    def node(self, node: Node) -> tuple[str, int]:
        if self.context.in_place:
            found = _node_in_place(self, node)
            if found is not None:
                return found
        return super().node(node)

    def step_lines(self, step: Step) -> list[str]:
        lines = self.own_step_lines(step)
        if self.backend.lazy and isinstance(step, Elementwise):
            return _bounded_broadcast(self, step) + lines
        return lines

    def elementwise(self, step: Elementwise) -> str:
        outer = self.context
        self.context = replace(outer, in_place=self.one_float_type(node_args(step.expr), step.out))
        try:
            return self.elementwise_text(step)
        finally:
            self.context = outer

    def elementwise_text(self, step: Elementwise) -> str:
        planned = self.record.expressions[step.out]
        step = replace(step, expr=planned.expr)  # a large product's small factors multiplied first
        # (a step fused into a chunked reduction, or computed in chunks into its result, is rendered for one
        # chunk there: one expression)
        if planned.blocks is not None and step.out not in self.fitting.fused and step.out not in self.fitting.pieces:
            return self.blocks_text(step)
        return super().elementwise(step)

    def blocks_text(self, step: Elementwise) -> str:
        """The step computed block by block (``einflow.engine.blocks``) as the record planned it."""
        blocks = self.record.expressions[step.out].blocks
        assert blocks is not None
        shape = self.shape[step.out]
        name = self.fresh(f"_kernel{step.out}")
        kernel = render_kernel(name, step.expr, self.alias["np"], self.number, self.size)
        assert kernel is not None
        operands = [self.arg(arg) for arg in kernel.operands]
        self.kernels.append(kernel.text)
        if self.blocks_name is None:
            self.blocks_name = self.fresh("_run_blocks")
            self.namespace[self.blocks_name] = run_blocks
        listed = ", ".join(operands) + ("," if len(operands) == 1 else "")
        return (f"{self.blocks_name}({name}, ({listed}), {blocks.sliced!r}, {shape!r}, "
                f"{str(np.dtype(self.dtype[step.out]))!r}, {blocks.rows}, {kernel.buffers})")

    def own_step_lines(self, step: Step) -> list[str]:
        rule = RENDER_RULES.get(type(step))
        if rule is not None and rule.lines is not None:  # the step's own lines, never sliced nor chunked
            return rule.lines(self, step)
        dtype = self.dtype[step.out]  # type: ignore[union-attr]
        read_as = np.dtype(dtype).name if not self.dialect.numpy_types and isinstance(step, Elementwise) and \
            not isinstance(dtype, type) and np.dtype(dtype).kind in "fc" and self.native(dtype) else None
        outer, self.context = self.context, StepContext(dtype if isinstance(step, Contract) else None, read_as)
        try:
            fitted = fitted_lines(self, step)  # sliced or chunked to fit the memory limit (einflow.engine.fitting)
            if fitted is not None:
                return fitted
            inline = rule.inline(self, step) if rule is not None and rule.inline is not None else None
            if inline is not None:
                return inline
            return super().step_lines(step)
        finally:
            self.context = outer

    def arg(self, node: Arg) -> str:
        text = super().arg(node)
        dtype = self.dtype[node.register]
        read_as = self.context.read_as
        if read_as is not None and not isinstance(dtype, type) and np.dtype(dtype).kind in "biu":
            return self.astype(text, read_as)
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

    def window(self, step: Window | Scatter) -> str:
        """A shifted or gathered read: the backend's kernel (``einflow.engine.affine``) with its plan as literals."""
        spec = self.record.specs[step.out]
        if is_identity(spec, self.shape[step.arg]) or step.out in self.record.convolved_windows:
            return self.var(step.arg)  # the array itself (a convolution reads the window's array in place)
        helper = self.alias.get("window") or "_window"
        self.namespace[helper] = window_kernel(self.backend)
        gathers = "".join(f", {self.var(g)}" for g in step.gathers)
        return f"{helper}({self.var(step.arg)}, {spec!r}{gathers})"

    def floating_register(self, register: int) -> bool:
        """Whether a register holds a numpy array of a floating type (not a weak Python number)."""
        dtype = self.dtype[register]
        return not isinstance(dtype, type) and np.dtype(dtype).kind == "f"

    def diagonal_add(self, step: Diagonal, out: str, value: str) -> list[str]:
        """Adding into a large diagonal view with a short axis goes slice by slice along that axis: numpy cannot
        tell quickly that such a view (``H[p,q,r,q]``, strides of every size) does not overlap itself, and makes
        a copy of it for ``+=`` (measured: a third of the pairwise-energy Hessian's size for ``q`` of size 3)."""
        labels = diagonal_view_labels(step)
        full = self.shape[step.out]
        shape = tuple(full[step.output.index(label)] for label in labels)
        if not self.backend.numpy_native or len(shape) < 2 or math.prod(shape) < measure_rows.BLOCK_ELEMENTS \
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
            if step.out in self.record.updated:  # the base is this step's alone: its diagonal is updated
                first = f"{out} = {base}"
            else:
                first = f"{out} = {self.alias['np']}.broadcast_to({base}, {self.shape[step.out]!r})" \
                        f".astype({str(self.dtype[step.out])!r})"
            return [first, *self.diagonal_add(step, out, value)]
        if self.backend.numpy_native or not self.dialect.strided_writes:
            return super().diagonal(step, out)
        name = self.fresh(f"_diagonal{step.out}")
        self.namespace[name] = _diagonal_writer(self.backend, replace(step, labels=diagonal_view_labels(step)),
                                                self.shape[step.out])
        written = f"{name}({self.diagonal_value(step, True)})"
        return [f"{out} = {written}" if step.base is None else f"{out} = {self.var(step.base)} + {written}"]


def _node_in_place(renderer: Renderer, node: Node) -> tuple[str, int] | None:
    """torch: a function of a sum or product, or ``c - product``, computed in place on the array the sum
    or product just made (autograd allows it: those operations keep no output for their backward); the
    node's row of ``_IN_PLACE`` (None: as usual)."""
    rule = _IN_PLACE.get(type(node))
    return None if rule is None else rule(renderer, node)

def _function_in_place(renderer: Renderer, node: Apply) -> tuple[str, int] | None:
    """``tanh(a + b)`` as ``(a + b).tanh_()``."""
    if node.other is None and _fresh(node.arg):
        inner, _ = renderer.node(node.arg)
        np_ = renderer.alias["np"]
        if renderer.call(node.func, "{x}", promote=False) == f"{np_}.{node.func}({{x}})" and \
                hasattr(_torch_tensor_type(), f"{node.func}_"):
            return f"({inner}).{node.func}_()", 4
    return None

def _difference_in_place(renderer: Renderer, node: Add) -> tuple[str, int] | None:
    """``c - a b`` as ``(a * b).neg_().add_(c)``."""
    if len(node.terms) == 2:
        numbers = [t for t in node.terms if isinstance(t, Number) and not isinstance(t.value, bool)]
        others = [t for t in node.terms if not isinstance(t, Number)]
        if len(numbers) == 1 and len(others) == 1:
            negated = negation_of(others[0])
            if negated is not None and _fresh(negated) and not isinstance(negated, Add):
                inner, _ = renderer.node(negated)
                return f"({inner}).neg_().add_({renderer.number(numbers[0].value)})", 4
    return None

def _bounded_broadcast(renderer: Renderer, step: Elementwise) -> list[str]:
    """dask: the line rechunking the arrays an elementwise step broadcasts to a larger result (an outer
    product ``x[:, None] * y[None, :]``), so its blocks stay near its inputs' (dask_ops.broadcast_operands)."""
    reads: dict[int, set[tuple[str, ...]]] = {}
    elements = math.prod(renderer.shape[step.out])
    for arg in arg_nodes(step.expr):
        shape = renderer.shape[arg.register]
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
    helper = renderer.broadcast_helper
    if helper is None:
        from einflow.engine.backends.dask_ops import broadcast_operands

        helper = renderer.broadcast_helper = renderer.fresh("_broadcast_operands")
        renderer.namespace[helper] = broadcast_operands
    names = [renderer.var(register) for register in reads]
    readings: tuple[tuple[tuple[str, ...], ...], ...] = tuple(tuple(sorted(found)) for found in reads.values())
    targets = ", ".join(names) + ("," if len(names) == 1 else "")
    return [f"{targets} = {helper}(({targets}), {readings!r}, {tuple(step.labels)!r})"]

def _normaliser_lines(renderer: Renderer, step: Reduce) -> list[str] | None:
    """A max-shifted softmax / log_softmax / logsumexp written out for a non-empty float numpy array, as the
    ``reduce`` helper computes it (a non-finite maximum shifts by 0) but without its generic checks, and
    with the exponentials taken in place; None elsewhere (the helper is called)."""
    dtype = renderer.dtype[step.arg]
    if not renderer.backend.numpy_native or isinstance(dtype, type) or np.dtype(dtype).kind != "f" \
            or not math.prod(renderer.shape[step.arg]):
        return None
    np_, x, out = renderer.alias["np"], renderer.var(step.arg), renderer.var(step.out)
    shift, work = renderer.fresh("_shift"), renderer.fresh("_e")
    axes = repr(step.axes)
    shape = renderer.shape[step.arg]
    if math.prod(size for k, size in enumerate(shape) if k not in step.axes) == 1:
        finite = renderer.fresh("_isfinite")  # one maximum: a Python test, a fifth of a ufunc call's cost
        renderer.namespace[finite] = math.isfinite
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


#: torch: the node kinds computed in place on an array their argument just made
_IN_PLACE: dict[type, Callable[[Renderer, Any], tuple[str, int] | None]] = {
    Apply: _function_in_place, Add: _difference_in_place,
}


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


def _free_lines(renderer: Renderer, step: Free) -> list[str]:
    # small arrays: releasing them early costs more time than it saves memory
    held = renderer.fitting.held()  # read later, inside a loop computing an expression in blocks
    held |= {r for registers in renderer.fitting.deferred.values() for r in registers}  # (released after it)
    big = [r for r in step.registers if math.prod(renderer.shape.get(r, ())) * renderer.itemsize(r)
           >= RELEASE_BYTES and r not in held and r not in renderer.fitting.windows]  # (windows: made per slice)
    return Source.step_lines(renderer, Free(step.statement, tuple(big))) if big else []


def _window_lines(renderer: Renderer, step: Window) -> list[str]:
    if step.out in renderer.fitting.windows:  # made block by block by the sliced contraction reading it
        return []
    rows = renderer.fitting.rows.get(step.out)
    if rows is not None:  # taken in blocks of rows, to fit the memory limit (einflow.engine.fitting)
        chunked, kernel = renderer.fresh("_window_chunks"), renderer.fresh("_window_kernel")
        renderer.namespace[chunked], renderer.namespace[kernel] = window_chunks, window_kernel(renderer.backend)
        gathers = "".join(f", {renderer.var(g)}" for g in step.gathers)
        return [f"{renderer.var(step.out)} = {chunked}({kernel}, {renderer.var(step.arg)}, "
                f"{renderer.record.specs[step.out]!r}, {rows}{gathers})"]
    return [f"{renderer.var(step.out)} = {renderer.window(step)}"]


def _scatter_lines(renderer: Renderer, step: Scatter) -> list[str]:
    if step.out in renderer.record.convolved_scatters:  # computed whole by a transposed convolution
        return [f"{renderer.var(step.out)} = {renderer.var(step.arg)}"]
    spec = renderer.record.specs[step.out]
    helper = renderer.alias.get("scatter") or "_scatter"
    renderer.namespace[helper] = scatter_kernel(renderer.backend)
    gathers = "".join(f", {renderer.var(g)}" for g in step.gathers)
    rows = renderer.fitting.rows.get(step.out)
    if rows is not None:  # in chunks of the value's rows, to fit the memory limit (einflow.engine.fitting)
        chunked = renderer.fresh("_scatter_chunks")
        renderer.namespace[chunked] = scatter_chunks
        return [f"{renderer.var(step.out)} = {chunked}({renderer.var(step.arg)}, {spec!r}, {rows}{gathers})"]
    return [f"{renderer.var(step.out)} = {helper}({renderer.var(step.arg)}, {spec!r}{gathers})"]


def _reduce_inline(renderer: Renderer, step: Reduce) -> list[str] | None:
    if step.kind in ("softmax", "log_softmax", "logsumexp"):
        inline = _normaliser_lines(renderer, step)
        if inline is not None:
            return inline
    if renderer.backend.lazy and not math.prod(renderer.shape[step.out]) \
            and step.kind in ("max", "min", "argmax", "argmin"):
        # an empty result (its other axes are empty): dask's chunked max of empty blocks raises
        return [f"{renderer.var(step.out)} = {renderer.alias['np']}.zeros({renderer.shape[step.out]!r}, "
                f"dtype={np.dtype(renderer.dtype[step.out]).name!r})"]
    if renderer.backend.numpy_native and (
            step.kind in ("max", "min") or step.kind == "mean" and renderer.floating_register(step.arg)):
        # the array's own method, as the ``reduce`` helper would call it, without the call through it
        return [f"{renderer.var(step.out)} = {renderer.var(step.arg)}.{step.kind}(axis={step.axes!r})"]
    return None


@dataclass(frozen=True)
class RenderRule:
    """One step kind as the render pass writes it with shapes: ``lines(renderer, step)`` its own lines (None:
    sliced or chunked when it must fit, else ``inline`` or the generic rendering); ``inline(renderer, step)``
    lines tried before the generic rendering (None when they do not apply)."""

    lines: Callable[[Any, Any], list[str]] | None = None
    inline: Callable[[Any, Any], list[str] | None] | None = None


RENDER_RULES: dict[type, RenderRule] = {
    Reduce: RenderRule(inline=_reduce_inline),
    Window: RenderRule(lines=_window_lines),
    Scatter: RenderRule(lines=_scatter_lines),
    Free: RenderRule(lines=_free_lines),
}
