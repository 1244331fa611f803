"""Steps -> Python source: the render rows, functions of a :class:`~einflow.engine.context.RenderContext` and a
node or step, one line (or two) per step.

Over a context without a record they write the program without shapes: sizes are read off the inputs at run
time and contractions call ``opt_einsum.contract``; this is what ``to_source`` exports, and what the specialise
pass samples elementwise dtypes with. Over a context with the specialised record the same node rows write
literal sizes, numpy's result types and torch's in-place work; ``einflow.engine.render`` adds the rows of the
steps whose rendering with shapes differs (direct BLAS calls, block by block work, slices). ``_np`` is the
array module in both. Nothing here calls back into the modules above it: they call these rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from einflow.engine.context import RenderContext, number_text
from einflow.engine.linalg import CHECK_KINDS, is_linalg
from einflow.engine.rows import (
    STEP_RULES,
    diagonal_spec,
    diagonal_view_labels,
    is_divisor,
    kind_of,
    negation_of,
    positive_first,
)
from einflow.engine.steps import (
    Add,
    Apply,
    Arg,
    AsFloat,
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
    node_args,
)
from einflow.lang.errors import EinflowError
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import einsum_equation
from einflow.lang.numbers import _is_unit

__all__ = ["node_text", "step_lines", "NODE_TEXT", "STEP_TEXT", "statement_steps", "annotate", "returned",
           "number", "size", "shape_text", "arg", "call", "astype", "scaled", "reduce", "contract",
           "elementwise", "diagonal", "diagonal_value", "diagonal_add", "count", "floating", "as_float",
           "device", "matrix_name", "grouped", "FLAT_TERMS"]


# ---------------------------------------------------------------------------------------------- pieces
def number(cx: RenderContext, value: int | float) -> str:
    return number_text(value, cx.names.alias["np"])


def size(cx: RenderContext, ref: SizeRef) -> str:
    """An index's size: a literal with shapes; else read off an input, or (shifted reads) off the statement's
    ranges; an inferred size without ranges is 1 (the specialise pass samples dtypes with it)."""
    if cx.record is not None:
        return repr(cx.resolve(ref))
    if isinstance(ref, int):
        return repr(ref)
    if isinstance(ref, Inferred):
        name = cx.range_names.get(ref.statement)
        return "1" if name is None else f"{name}[{ref.index!r}]"
    return f"{cx.names.vars[ref[0]]}.shape[{ref[1]}]"


def shape_text(cx: RenderContext, refs: tuple[SizeRef, ...]) -> str:
    inner = ", ".join(size(cx, ref) for ref in refs)
    return f"({inner},)" if len(refs) == 1 else f"({inner})"


def device(cx: RenderContext) -> str:
    """Text of the device new tensors go to (torch only), from the inputs."""
    inputs = ", ".join(cx.names.vars[k] for k in range(len(cx.lowered.inputs)))
    return f"{cx.helper('device')}({inputs})"


def arg(cx: RenderContext, node: Arg) -> str:
    text = cx.views.get(node.register) or cx.var(node.register)
    if node.axes is not None:
        present = [axis for axis in node.axes if axis is not None]
        if present != list(range(len(present))):
            text += f".{cx.dialect.permute}({tuple(present)!r})"
        if None in node.axes:
            text += "[" + ", ".join(":" if axis is not None else "None" for axis in node.axes) + "]"
    if cx.read_as is not None:  # (integer arrays read in the step's floating type)
        dtype = cx.record.dtypes[node.register]
        if not isinstance(dtype, type) and np.dtype(dtype).kind in "biu":
            return astype(cx, text, cx.read_as)
    return text


def astype(cx: RenderContext, text: str, dtype: str) -> str:
    """``text`` (an array expression) converted to the numpy dtype named ``dtype``."""
    return cx.dialect.cast.format(x=text, dtype=dtype, np=cx.names.alias["np"])


def torch_number(cx: RenderContext, value: int | float) -> str:
    """A number as a 0-d tensor (torch.maximum and friends take tensors; 0-d ones promote as numpy's weak
    Python numbers do)."""
    dtype = "float64" if isinstance(value, float) else "bool" if isinstance(value, bool) else "int64"
    np_ = cx.names.alias["np"]
    return f"{np_}.tensor({number(cx, value)}, dtype={np_}.{dtype})"


def floating(cx: RenderContext, x: str) -> str:
    """``x`` promoted to float64 when some input holds integers or booleans (shape-free: when it may)."""
    return x if cx.floating_inputs else f"{cx.helper('as_float')}({x})"


def as_float(cx: RenderContext, text: str) -> str:
    """``text`` in the inputs' floating type (shape-free: found from the inputs when the code runs)."""
    if cx.record is not None:
        float_dtype = cx.record.float_dtype
        return text if float_dtype is None else astype(cx, text, str(np.dtype(float_dtype)))
    inputs = "".join(", " + cx.names.vars[k] for k in range(len(cx.lowered.inputs)))
    return f"{cx.helper('as_input_float')}({text}{inputs})"


def count(cx: RenderContext, size_text: str) -> str:
    """An index's size as a 0-d value of the inputs' floating type (the integer type when they have none)."""
    record = cx.record
    if record is not None and record.float_dtype is not None and record.backend.numpy_native:
        return f"{cx.names.alias['np']}.{np.dtype(record.float_dtype).name}({size_text})"  # as a sum would give
    return as_float(cx, f"{cx.names.alias['np']}.asarray({size_text})")


def call(cx: RenderContext, func: str, x: str, promote: bool = True) -> str:
    rule = FUNCTION_RULES[func]
    template = cx.dialect.calls.get(func, rule.source)
    if rule.promotes and promote:
        x = floating(cx, x)
    helpers = {key: cx.helper(key) if "{" + key + "}" in template else ""
               for key in ("sigmoid", "step", "erf", "sign", "conj", "real", "imag", "abs2")}
    return template.format(x=x, np=cx.names.alias["np"], **helpers)


def scaled(cx: RenderContext, text: str, scale: tuple[Node, ...]) -> str:
    """``text`` times each scalar factor in turn; with the contraction's type known (``scale_dtype``),
    ``text * (f1 * f2 * ...)``: the factors multiplied together first, then one pass over the array.

    Only when that gives numpy's type of ``text * f1 * f2 ...`` (the contraction's result type, a
    floating one): every factor a number, a size or a 0-d register of that type.
    """
    dtype = cx.scale_dtype
    if dtype is None or len(scale) < 2 or np.dtype(dtype).kind != "f" or not all(
            isinstance(f, (Number, Size)) and not isinstance(getattr(f, "value", 0), bool)
            or isinstance(f, Arg) and not cx.record.shapes.get(f.register) and cx.record.dtypes.get(f.register) == dtype
            for f in scale):
        for factor in scale:
            factor_text, level = node_text(cx, factor)
            text += " * " + (f"({factor_text})" if level < 2 else factor_text)
        return text
    factors = []
    for factor in scale:
        factor_text, level = node_text(cx, factor)
        factors.append(f"({factor_text})" if level < 2 else factor_text)
    return f"{text} * ({' * '.join(factors)})"


def reduce(cx: RenderContext, text: str, axes: tuple[int, ...]) -> str:
    keyword = cx.dialect.axis if axes else "axis"  # (torch: ``dim=()`` would sum every axis)
    return f"{text}.sum({keyword}={axes!r})"


def matrix_name(cx: RenderContext, register: int) -> str | None:
    """The name of the declared matrix in ``register`` (an input or a target, read through its check)."""
    lowered = cx.lowered
    checks = {step.out: step.arg for step in lowered.steps if isinstance(step, Reduce)
              and step.kind in (*CHECK_KINDS, "spd_by_factor")}
    register = checks.get(register, register)
    if register < len(lowered.inputs):
        return lowered.inputs[register]
    return dict(lowered.names).get(register)


# ---------------------------------------------------------------------------------------------- products
def subtractable(cx: RenderContext, term: Node) -> bool:
    """Whether ``+ term`` may be written ``- (its negation)``: numpy refuses ``bool - bool`` (see ``booleans``)."""
    return not cx.booleans or not any(register in cx.booleans for register in node_args(term))


def add_terms(cx: RenderContext, terms: Sequence[Node]) -> str:
    """``a + b - c``: the terms of a sum, a negative one subtracted (not the first)."""
    pieces: list[str] = []
    for position, term in enumerate(terms):
        negated = negation_of(term) if position and subtractable(cx, term) else None
        if negated is not None:
            text, level = node_text(cx, negated)
            pieces.append(" - " + (f"({text})" if level < 2 else text))
        else:
            text, level = node_text(cx, term)
            pieces.append((" + " if position else "") + (f"({text})" if level < 1 else text))
    return "".join(pieces)


def product_casts(cx: RenderContext, node: Mul) -> dict[int, str]:
    """Factors to cast to the product's common dtype (position -> dtype); unknown dtypes: none.

    An elementwise product of arrays computes in numpy's result type of all of them (as one einsum would):
    ``a * b * c`` with int16, uint16, float32 is float32, not int32 * float32 = float64."""
    arrays = [(k, f) for k, f in enumerate(node.factors) if isinstance(f, Arg)]
    if cx.record is None or len(arrays) < 3 or not all(isinstance(f, (Arg, Number, Size)) for f in node.factors):
        return {}
    dtypes = cx.record.dtypes
    parts: list[Any] = []
    for factor in node.factors:
        if isinstance(factor, Arg):
            dtype = dtypes[factor.register]
            parts.append(dtype(1) if isinstance(dtype, type) else np.dtype(dtype))
        else:
            parts.append(factor.value if isinstance(factor, Number) else 1)
    common = np.result_type(*parts)
    return {k: str(common) for k, f in arrays if not isinstance(dtypes[f.register], type)
            and np.dtype(dtypes[f.register]) != common}


def product_order(cx: RenderContext, node: Mul) -> list[int]:
    """The order a product's factors are multiplied in (positions); unknown shapes: as written.

    Integer or boolean arrays times a float number: the number multiplies the smallest array first, so that
    the large product is made once, as floats (``0.5 u[i] v[j]`` is ``(u * 0.5) v``, not an integer outer
    product converted afterwards: half the memory, and no integer overflow)."""
    order = list(range(len(node.factors)))
    if cx.record is None:
        return order
    registers = {k: f.register for k, f in enumerate(node.factors) if isinstance(f, Arg)}
    arrays = list(registers)
    numbers = [k for k, f in enumerate(node.factors) if isinstance(f, Number) and isinstance(f.value, float)]
    dtypes = [cx.record.dtypes[registers[k]] for k in arrays]
    others = [k for k in order if k not in arrays and k not in numbers]  # calls, powers: maybe floating
    if not cx.dialect.numpy_types or len(arrays) < 2 or not numbers or others or any(
            isinstance(dtype, type) or np.dtype(dtype).kind not in "biu" for dtype in dtypes):
        return order
    smallest = min(arrays, key=lambda k: math.prod(cx.record.shapes[registers[k]]))
    rest = [k for k in order if k != smallest and k not in numbers]
    return [smallest, *numbers, *rest]


def divided(cx: RenderContext, node: Mul, numerator: str, divisors: list[Node]) -> str:
    """``numerator`` (the text of ``node``'s other factors) divided by each divisor in turn, as numpy divides:
    arrays with ``/``; Python numbers (or unknown dtypes) through the ``divide`` helper (a zero divisor gives
    inf or nan, not ZeroDivisionError), integers as float64."""
    text = numerator
    if cx.record is None or all(isinstance(cx.record.dtypes[register], type) for register in node_args(node)):
        for divisor in divisors:
            text = f"{cx.helper('divide')}({text}, {node_text(cx, divisor)[0]})"
        return text
    if cx.dialect.floats_before_division:
        text = floating(cx, numerator)
    for divisor in divisors:
        divisor_text = node_text(cx, divisor)[0]  # (a square renders as ``x * x``: atoms and calls go bare)
        text += " / " + floating(cx, divisor_text if isinstance(divisor, (Arg, Apply, Size)) else f"({divisor_text})")
    return text


def power(cx: RenderContext, node: Pow) -> str:
    text, level = node_text(cx, node.base)
    atom = text if level >= 4 else f"({text})"
    exponent = node.exponent
    integral = isinstance(exponent, int) or float(exponent).is_integer()
    np_ = cx.names.alias["np"]
    if exponent == 2:
        return f"{atom} * {atom}" if isinstance(node.base, Arg) else f"{np_}.square({text})"
    if exponent == -1:
        return f"{cx.helper('reciprocal')}({text})"
    if exponent == 0.5:  # integers promoted to float64, as for every fractional power
        return f"{np_}.sqrt({floating(cx, text)})"
    name = cx.dialect.power
    if not integral or exponent < 0:
        return f"{np_}.{name}({cx.helper('as_float')}({text}), {number(cx, exponent)})"
    return f"{np_}.{name}({text}, {number(cx, exponent)})"


#: a sum or product of more terms is written in parenthesised groups of at most this many: Python's compiler
#: recurses once per operator of ``a + b + c + ...`` and overflows near 3,000 (the groups nest log(n) deep)
FLAT_TERMS = 64


def grouped(items: Sequence[Any], render: Callable[[Sequence[Any]], str], operator: str) -> str:
    """``render(items)``, or for more than FLAT_TERMS items, the rendered groups joined by ``operator``.

    >>> grouped([f"x{k}" for k in range(3)], " + ".join, " + ")
    'x0 + x1 + x2'
    >>> grouped([f"x{k}" for k in range(130)], " + ".join, " + ").count("(")
    3
    """
    if len(items) <= FLAT_TERMS:
        return render(items)
    span = FLAT_TERMS  # groups of a power of FLAT_TERMS items, at most FLAT_TERMS of them
    while len(items) > span * FLAT_TERMS:
        span *= FLAT_TERMS
    return operator.join(f"({grouped(items[k:k + span], render, operator)})" for k in range(0, len(items), span))


# ---------------------------------------------------------------------------------------------- node rows
# One row per elementwise expression node: the generated code's (text, precedence): 1 sum, 2 product,
# 3 power, 4 atom. Children go through ``node_text``, which first tries torch's in-place forms.


def _number_text(cx: RenderContext, node: Number) -> tuple[str, int]:
    if cx.tensor_literals and isinstance(node.value, float):
        return torch_number(cx, node.value), 4
    text = number(cx, node.value)
    return text, 1 if text.startswith("-") else 4


def _apply_text(cx: RenderContext, node: Apply) -> tuple[str, int]:
    if node.other is not None:
        operands = [node_text(cx, part)[0] if not cx.dialect.typed_literals or not isinstance(part, Number)
                    else torch_number(cx, part.value) for part in (node.arg, node.other)]
        return f"{cx.names.alias['np']}.{node.func}({operands[0]}, {operands[1]})", 4
    inner = node_text(cx, node.arg)[0]
    # a promoting function's result is already floating: no second promotion around it
    computed_float = (isinstance(node.arg, Apply) and node.arg.other is None  # maximum(a, b) keeps ints
                      and FUNCTION_RULES[node.arg.func].promotes)
    return call(cx, node.func, inner, promote=not computed_float), 4


def _as_float_text(cx: RenderContext, node: AsFloat) -> tuple[str, int]:
    if isinstance(node.arg, Size):
        return count(cx, size(cx, node.arg.ref)), 4
    return as_float(cx, node_text(cx, node.arg)[0]), 4


def _mul_text(cx: RenderContext, node: Mul) -> tuple[str, int]:
    factors = []
    casts = product_casts(cx, node)
    divisors = [f.base for f in node.factors if is_divisor(f)]  # type: ignore[union-attr]
    if len(divisors) == len(node.factors):
        divisors = []  # reciprocals alone: 1 / x is the reciprocal
    for position in product_order(cx, node):
        factor = node.factors[position]
        if divisors and is_divisor(factor):
            continue
        text, level = node_text(cx, factor)
        if position in casts:
            text, level = astype(cx, text if level >= 4 else f"({text})", casts[position]), 4
        factors.append(f"({text})" if level < 2 else text)
    product = grouped(factors, " * ".join, " * ")
    if divisors:  # division is division (x / x is 1 where x * (1 / x) may not be)
        return divided(cx, node, product, divisors), 2
    return product, 2


NODE_TEXT: dict[type, Callable[[RenderContext, Any], tuple[str, int]]] = {
    Arg: lambda cx, node: (arg(cx, node), 4),
    Number: _number_text,
    Size: lambda cx, node: (size(cx, node.ref), 4),
    Apply: _apply_text,
    AsFloat: _as_float_text,
    Pow: lambda cx, node: (power(cx, node), 4),
    Add: lambda cx, node: (grouped(positive_first(node.terms), functools.partial(add_terms, cx), " + "), 1),
    Mul: _mul_text,
}

assert set(NODE_TEXT) == set(Node.__args__)  # type: ignore[attr-defined]


def node_text(cx: RenderContext, node: Node) -> tuple[str, int]:
    """(text, precedence) of an elementwise node (its row of ``NODE_TEXT``; torch's in-place forms first)."""
    if cx.in_place:
        rule = _IN_PLACE.get(type(node))
        found = None if rule is None else rule(cx, node)
        if found is not None:
            return found
    return NODE_TEXT[type(node)](cx, node)


# torch: a function of a sum or product, or ``c - product``, computed in place on the array the sum or product
# just made (autograd allows it: those operations keep no output for their backward)
def _function_in_place(cx: RenderContext, node: Apply) -> tuple[str, int] | None:
    """``tanh(a + b)`` as ``(a + b).tanh_()``."""
    if node.other is None and _fresh(node.arg):
        inner, _ = node_text(cx, node.arg)
        np_ = cx.names.alias["np"]
        if call(cx, node.func, "{x}", promote=False) == f"{np_}.{node.func}({{x}})" and \
                hasattr(_torch_tensor_type(), f"{node.func}_"):
            return f"({inner}).{node.func}_()", 4
    return None


def _difference_in_place(cx: RenderContext, node: Add) -> tuple[str, int] | None:
    """``c - a b`` as ``(a * b).neg_().add_(c)``."""
    if len(node.terms) == 2:
        numbers = [t for t in node.terms if isinstance(t, Number) and not isinstance(t.value, bool)]
        others = [t for t in node.terms if not isinstance(t, Number)]
        if len(numbers) == 1 and len(others) == 1:
            negated = negation_of(others[0])
            if negated is not None and _fresh(negated) and not isinstance(negated, Add):
                inner, _ = node_text(cx, negated)
                return f"({inner}).neg_().add_({number(cx, numbers[0].value)})", 4
    return None


#: torch: the node kinds computed in place on an array their argument just made
_IN_PLACE: dict[type, Callable[[RenderContext, Any], tuple[str, int] | None]] = {
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


# ---------------------------------------------------------------------------------------------- step rows
# One row per step kind: the statements computing it without shapes, given the name of its result (the
# specialised rendering's own rows are ``einflow.engine.render.RENDER_RULES``; the name, note and kind of each
# step are ``rows.STEP_RULES``).


def contract(cx: RenderContext, step: Contract) -> str:
    equation = einsum_equation(step.operands, step.output)
    args = "".join(", " + cx.var(register) for register in step.args)
    function = cx.helper("contract") if cx.dialect.promoting_contract else f"{cx.names.alias['oe']}.contract"
    return scaled(cx, f"{function}({equation!r}{args})", step.scale)


def elementwise(cx: RenderContext, step: Elementwise) -> str:
    return node_text(cx, step.expr)[0]


def diagonal_value(cx: RenderContext, step: Diagonal, full: bool = False) -> str:
    """The value of a Diagonal step aligned with its view (``diagonal_view_labels``), times its coefficient;
    ``full``: broadcast to the view's shape (for writers that index the diagonals)."""
    value = cx.var(step.arg)
    labels = diagonal_view_labels(step)
    if len(labels) > len(step.labels):
        if step.labels:  # (a 0-d value, a Python number too, broadcasts as it is)
            value += "[..., " + ", ".join(["None"] * (len(labels) - len(step.labels))) + "]"
        if full:
            sizes = tuple(step.sizes[step.output.index(label)] for label in labels)
            value = f"{cx.names.alias['np']}.broadcast_to({value}, {shape_text(cx, sizes)})"
    return scaled(cx, value, () if _is_unit(step.coefficient) else (Number(step.coefficient),))


def diagonal(cx: RenderContext, step: Diagonal, out: str) -> list[str]:
    value = cx.var(step.arg)
    scaled_value = diagonal_value(cx, step)
    if not cx.dialect.strided_writes:  # index the diagonals
        groups = tuple(tuple(step.output.index(m) for m in next((g for g in step.groups if label in g), (label,)))
                       for label in diagonal_view_labels(step))
        written = f"{cx.helper('diagonal')}({diagonal_value(cx, step, True)}, {shape_text(cx, step.sizes)}, " \
                  f"{groups!r})"
        return [f"{out} = {written}" if step.base is None else f"{out} = {cx.var(step.base)} + {written}"]
    np_ = cx.names.alias["np"]
    if step.base is None:
        lines = []
        if scaled_value != value:
            value = cx.fresh("_value")
            lines.append(f"{value} = {scaled_value}")
        lines += [f"{out} = {np_}.zeros({shape_text(cx, step.sizes)}, dtype={np_}.result_type({value}))",
                  f"{np_}.einsum({diagonal_spec(step)!r}, {out})[...] = {value}"]
        return lines + ([f"del {value}"] if scaled_value != cx.var(step.arg) else [])
    owned = f"{cx.helper('owned')}({cx.var(step.base)}, {shape_text(cx, step.sizes)}, {value}"
    owned += ")" if _is_unit(step.coefficient) else f", {number(cx, step.coefficient)})"
    return [f"{out} = {owned}", *diagonal_add(cx, step, out, scaled_value)]


def diagonal_add(cx: RenderContext, step: Diagonal, out: str, value: str) -> list[str]:
    """Lines adding ``value`` into the diagonal of ``out`` in place (numpy's strided view)."""
    view = cx.fresh("_diagonal")
    return [f"{view} = {cx.names.alias['np']}.einsum({diagonal_spec(step)!r}, {out})", f"{view} += {value}",
            f"del {view}"]


def _window(cx: RenderContext, step: Window | Scatter, out: str) -> list[str]:
    """A shifted or gathered read without shapes: its ranges are computed when it runs (``einflow.export``)."""
    raise EinflowError("programs with shifted, strided or gathered reads cannot be exported to source yet "
                       "(their ranges are found from the shapes when the program runs): call the Program")


def _free_lines(cx: RenderContext, step: Free, out: str) -> list[str]:
    names = [cx.names.vars[r] for r in step.registers if r in cx.names.vars]
    return [f"del {', '.join(names)}"] if names else []


def _constant_lines(cx: RenderContext, step: Constant, out: str) -> list[str]:
    np_ = cx.names.alias["np"]
    if cx.dialect.typed_literals:  # a 0-d tensor (numpy's default types; 0-d tensors do not widen others)
        dtype = "float64" if isinstance(step.value, float) else "int64"
        return [f"{out} = {np_}.tensor({number(cx, step.value)}, dtype={np_}.{dtype})"]
    return [f"{out} = {np_}.asarray({number(cx, step.value)})"]


def _ones_lines(cx: RenderContext, step: Ones, out: str) -> list[str]:
    np_ = cx.names.alias["np"]
    if cx.dialect.devices:
        return [f"{out} = {np_}.ones(({size(cx, step.size)},), dtype={np_}.bool, device={device(cx)})"]
    return [f"{out} = {np_}.ones(({size(cx, step.size)},), dtype=\"bool\")"]


def _reduce_lines(cx: RenderContext, step: Reduce, out: str) -> list[str]:
    if step.kind == "sum":
        return [f"{out} = {reduce(cx, cx.var(step.arg), step.axes)}"]
    if is_linalg(step):
        name = matrix_name(cx, step.arg)  # named in the errors (singular, not positive definite)
        extra = f", {name!r}" if name is not None and not step.kind.startswith("cho_") else ""
        return [f"{out} = {cx.helper('linalg')}({step.kind!r}, {cx.var(step.arg)}, {step.axes!r}{extra})"]
    return [f"{out} = {cx.helper('reduce')}({step.kind!r}, {cx.var(step.arg)}, {step.axes!r})"]


def _solve_lines(cx: RenderContext, step: Solve, out: str) -> list[str]:
    name = matrix_name(cx, step.matrix) if step.kind != "cho_solve" else None
    extra = f", name={name!r}" if name is not None else ""
    extra += f", batch={step.batch!r}" if step.batch else ""
    return [f"{out} = {cx.helper('solve')}({step.kind!r}, {cx.var(step.matrix)}, {step.axes!r}, "
            f"{cx.var(step.rhs)}, {step.rhs_axis}, {step.transposed}{extra})"]


#: the statements computing each step kind without shapes: (context, step, its result's name) -> lines
STEP_TEXT: dict[type, Callable[[RenderContext, Any, str], list[str]]] = {
    Constant: _constant_lines,
    Ones: _ones_lines,
    Contract: lambda cx, step, out: [f"{out} = {contract(cx, step)}"],
    Reduce: _reduce_lines,
    Solve: _solve_lines,
    Elementwise: lambda cx, step, out: [f"{out} = {elementwise(cx, step)}"],
    Diagonal: diagonal,
    Window: _window,
    Scatter: _window,
    Free: _free_lines,
}

assert set(STEP_TEXT) == set(Step.__args__)  # type: ignore[attr-defined]


def step_lines(cx: RenderContext, step: Step) -> list[str]:
    """The statement(s) computing one step without shapes (its row of ``STEP_TEXT``)."""
    return STEP_TEXT[type(step)](cx, step, cx.var(step.out) if hasattr(step, "out") else "")


# ---------------------------------------------------------------------------------------------- the body
def statement_steps(lowered: Lowered) -> list[tuple[str, list[Step]]]:
    """Each statement's comment line and its steps, in order: the body's outline (its writer renders each step
    and ``annotate``s its lines)."""
    steps = lowered.steps
    outline = []
    position = 0
    for statement, text in enumerate(lowered.statements):
        mine = []
        while position < len(steps) and steps[position].statement == statement:
            mine.append(steps[position])
            position += 1
        outline.append((f"    # {text}", mine))
    return outline


def annotate(cx: RenderContext, step: Step, rendered: list[str], number: int, lines: list[str]) -> int:
    """Append a step's rendered lines to the body (4-space indented), the first with the step's number, kind and
    note as a comment; the next step's number."""
    if not rendered:
        return number
    if not isinstance(step, Free):
        number += 1
        cx.names.labels[step.out] = getattr(step, "labels", getattr(step, "output", ()))
        note = f"[{number}] {kind_of(step)} {STEP_RULES[type(step)].note(cx, step)}".rstrip()
        rendered = [f"{rendered[0]}  # {note}", *rendered[1:]]
    lines.extend("    " + line for line in rendered)
    return number


def returned(cx: RenderContext) -> list[str]:
    return [cx.var(register) for register in cx.lowered.outputs]
