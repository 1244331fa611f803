"""Steps -> Python source: one straight-line function body, one line (or two) per step.

:class:`Source` renders a :class:`einflow.engine.lower.Lowered` program without shapes: sizes are read off the
inputs at run time and contractions call ``opt_einsum.contract``; this is what ``to_source`` exports.
``einflow.engine.plan`` renders the same steps specialised for shapes, dtypes and a backend (literal sizes,
contractions as direct BLAS calls, large fused elementwise work block by block) and compiles that text as
the executor. ``_np`` is the array module in both.
"""

from __future__ import annotations

import builtins
import functools
import keyword
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from einflow.engine.linalg import (
    CHECK_KINDS,
    KEEPS_AXES,
    LINALG_HELPER,
    SOLVE_HELPER,
    TORCH_LINALG_HELPER,
    TORCH_SOLVE_HELPER,
    is_linalg,
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
from einflow.lang import ir
from einflow.lang.errors import EinflowError, MatrixError
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import einsum_equation, index_letters
from einflow.lang.numbers import _is_unit

__all__ = ["Source", "generic_booleans", "helpers", "taken_names", "NodeRule", "NODE_RULES", "StepRule", "STEP_RULES",
           "usable", "number_text", "HELPERS", "HELPER_KEYS", "TARGETS", "kind_of", "diagonal_spec",
           "diagonal_view_labels"]

#: function templates that differ on torch (``torch.maximum`` needs two tensors)
TORCH_CALLS = {"relu": "{np}.clamp({x}, min=0)", "sign": "{sign}({x})",
               "softplus": "{np}.logaddexp({np}.zeros_like({x}), {x})"}

# Private helpers the generated code may call; {np} and helper names are substituted.
HELPERS: dict[str, str] = {
    "output": '''def {output}(x):
    """A value as einflow returns it: a 0-d result is a numpy scalar, as numpy's full reductions give."""
    return x[()] if type(x).__module__ == "numpy" and getattr(x, "ndim", 1) == 0 else x''',
    "input": '''def {input}(x):
    """An input as einflow receives it: Python int/float stay weak scalars, the rest become arrays."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x
    return {np}.asarray(x)''',
    "as_float": '''def {as_float}(x):
    """Integer (and bool) values promoted to float64, as einflow does for negative or fractional powers."""
    if {np}.result_type(x).kind in "biu":
        return x.astype("float64") if hasattr(x, "astype") else float(x)
    return x''',
    "reciprocal": '''def {reciprocal}(x):
    """x ** -1 with einflow's promotion of integers to float64."""
    if isinstance(x, (int, float)):
        return 1.0 / x if x != 0 else float({np}.copysign({np}.inf, x))
    return {np}.reciprocal({as_float}(x))''',
    "divide": '''def {divide}(a, b):
    """a / b as numpy divides: Python numbers too (a zero divisor gives inf or nan, not ZeroDivisionError);
    arrays by numpy's own true division (integers as float64, ``bool / float32`` as float32)."""
    if isinstance(b, (int, float)) and isinstance(a, (int, float)):
        if b != 0:
            return a / b
        if a != a or a == 0:
            return float("nan")
        return float("inf") if (a > 0) == (str(float(b))[0] != "-") else float("-inf")
    return a / b''',
    "sigmoid": '''def {sigmoid}(x):
    """1 / (1 + exp(-x)) without overflow, accurate in both tails (as einflow computes it).

    With e = exp(-|x|) (never overflows): 1 / (1 + e) for x >= 0 and e / (1 + e) below, in one division.
    """
    e = {np}.exp({np}.copysign(x, -1))
    numerator = {np}.maximum(e, x >= 0)
    e += 1
    numerator /= e
    return numerator''',
    "erf": '''def {erf}(x):
    """The error function elementwise (math.erf per element; the argument's floating type kept)."""
    import math
    x = {as_float}({np}.asarray(x))
    typed = x.dtype.type  # each value of x's type (a dask block of one value is then still an array scalar)
    return {np}.asarray({np}.frompyfunc(lambda v: typed(math.erf(v)), 1, 1)(x), dtype=x.dtype)''',
    "reduce": '''def {reduce}(kind, x, axis):
    """A reduction or normaliser over axes, stable by construction (max-shifted exp)."""
    if kind == "max":
        return x.max(axis=axis)
    if kind == "min":
        return x.min(axis=axis)
    if kind == "mean":
        return {as_float}(x).mean(axis=axis)
    if kind in ("argmax", "argmin"):
        extreme = x.max(axis=axis, keepdims=True) if kind == "argmax" else x.min(axis=axis, keepdims=True)
        hits = (x == extreme).astype(x.dtype) if x.dtype.kind == "f" else {as_float}(x == extreme)
        return hits / hits.sum(axis=axis, keepdims=True)
    x = {as_float}(x)
    if x.size == 0:
        shift = {np}.zeros_like(x.sum(axis=axis, keepdims=True))
    else:
        shift = x.max(axis=axis, keepdims=True)
        shift = {np}.where({np}.isfinite(shift), shift, 0)
    shifted = x - shift
    e = {np}.exp(shifted)
    total = e.sum(axis=axis, keepdims=True)
    if kind == "softmax":
        return e / total
    if kind == "log_softmax":
        return shifted - {np}.log(total)
    return ({np}.log(total) + shift).squeeze(axis=axis)''',
    "step": '''def {step}(x):
    """1 where x > 0, else 0, in x's type."""
    return {np}.greater(x, 0).astype({np}.result_type(x))''',
    "sign": '''def {sign}(x):
    """The sign of x (numpy's: nan for nan, x / |x| for complex x)."""
    return {np}.sign(x)''',
    "conj": '''def {conj}(x):
    """The complex conjugate (a copy for real x: a later in-place step must never write into an input).
    (The dtype's kind, not iscomplexobj: dask.array has none.)"""
    complex_ = isinstance(x, complex) or getattr(getattr(x, "dtype", None), "kind", "") == "c"
    y = {np}.conj(x) if complex_ else x
    return y.copy() if y is x and hasattr(x, "copy") else y''',
    "real": '''def {real}(x):
    """The real part, as a new array (numpy's real is a view of x, or x itself: never written in place)."""
    y = {np}.real(x)
    return y.copy() if hasattr(y, "copy") else y''',
    "imag": '''def {imag}(x):
    """The imaginary part (zeros for real x), as a new array (numpy's imag of a complex x is a view of it)."""
    complex_ = isinstance(x, complex) or getattr(getattr(x, "dtype", None), "kind", "") == "c"
    y = {np}.imag(x)
    return y.copy() if complex_ and hasattr(y, "copy") else y''',
    "abs2": '''def {abs2}(x):
    """|x|^2: re^2 + im^2 for complex x (no square root), x * x otherwise."""
    if isinstance(x, complex) or getattr(getattr(x, "dtype", None), "kind", "") == "c":
        return x.real * x.real + x.imag * x.imag
    return x * x''',
    "as_input_float": '''def {as_input_float}(x, *inputs):
    """Deltas alone: numbers of the inputs' floating type when they have one (as einflow does)."""
    floats = [a.dtype for a in inputs if getattr(a, "dtype", None) is not None and a.dtype.kind == "f"]
    return x.astype({np}.result_type(*floats)) if floats else x''',
}
HELPERS["diagonal"] = '''def {diagonal}(value, shape, groups):
    """value written on the diagonals of a zero array of ``shape`` (groups[k]: the axes value's axis k runs along)."""
    index = [None] * len(shape)
    for k, axes in enumerate(groups):
        positions = {np}.arange(value.shape[k]).reshape(tuple(-1 if j == k else 1 for j in range(value.ndim)))
        for axis in axes:
            index[axis] = positions
    out = {np}.zeros(shape, dtype=value.dtype)
    out[tuple(index)] = value
    return out'''

#: the same helpers for PyTorch tensors (``{np}`` is torch): dtypes have no ``kind``, tensors no ``astype``
TORCH_HELPERS: dict[str, str] = {
    "input": '''def {input}(x):
    """An input as einflow receives it: Python int/float become 0-d int64/float64 tensors (weak in torch's
    promotion as Python numbers are in numpy's), the rest become tensors."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return {np}.tensor(x, dtype={np}.float64 if isinstance(x, float) else {np}.int64)
    x = {np}.as_tensor(x)
    return x.long() if x.dtype == {np}.bool else x''',
    "as_float": '''def {as_float}(x):
    """Integer (and bool) values promoted to float64, as einflow does for negative or fractional powers."""
    if isinstance(x, (int, float)):
        return float(x)
    return x if x.is_floating_point() or x.is_complex() else x.to({np}.float64)''',
    "reciprocal": '''def {reciprocal}(x):
    """x ** -1 with einflow's promotion of integers to float64."""
    if isinstance(x, (int, float)):
        return 1.0 / x if x != 0 else float("inf") if str(float(x))[0] != "-" else float("-inf")
    return {np}.reciprocal({as_float}(x))''',
    "sigmoid": '''def {sigmoid}(x):
    """1 / (1 + exp(-x)) without overflow, accurate in both tails (torch's own kernel)."""
    if isinstance(x, (int, float)):
        x = {np}.tensor(float(x), dtype={np}.float64)
    return {np}.sigmoid(x)''',
    "step": '''def {step}(x):
    """1 where x > 0, else 0, in x's type."""
    return (x > 0).to(x.dtype)''',
    "conj": '''def {conj}(x):
    """The complex conjugate (a copy for real x: a later in-place step must never write into an input)."""
    return x.conj_physical() if x.is_complex() else x.clone()''',
    "real": '''def {real}(x):
    """The real part, as a new tensor (torch's real is a view of x, or x itself)."""
    return (x.real if x.is_complex() else x).clone()''',
    "imag": '''def {imag}(x):
    """The imaginary part (zeros for real x: torch has no imag of a real tensor)."""
    return x.imag.clone() if x.is_complex() else {np}.zeros_like(x)''',
    "abs2": '''def {abs2}(x):
    """|x|^2: re^2 + im^2 for complex x (no square root), x * x otherwise."""
    if x.is_complex():
        return x.real * x.real + x.imag * x.imag
    return x * x''',
    "sign": '''def {sign}(x):
    """numpy's sign: nan where x is nan, x / |x| for complex x."""
    if x.is_complex():
        return {np}.sgn(x)
    return {np}.where({np}.isnan(x), x, {np}.sign(x)) if x.is_floating_point() else {np}.sign(x)''',
    "as_input_float": '''def {as_input_float}(x, *inputs):
    """Deltas alone: numbers of the inputs' floating type when they have one (as einflow does)."""
    floats = [a.dtype for a in inputs if isinstance(a, {np}.Tensor) and a.is_floating_point()]
    if not floats:
        return x
    dtype = floats[0]
    for other in floats[1:]:
        dtype = {np}.promote_types(dtype, other)
    return x.to(dtype)''',
    "diagonal": '''def {diagonal}(value, shape, groups):
    """value written on the diagonals of a zero tensor of ``shape`` (groups[k]: the axes value's axis k runs along)."""
    index = [None] * len(shape)
    for k, axes in enumerate(groups):
        positions = {np}.arange(value.shape[k], device=value.device)
        positions = positions.reshape(tuple(-1 if j == k else 1 for j in range(value.ndim)))
        for axis in axes:
            index[axis] = positions
    out = {np}.zeros(shape, dtype=value.dtype, device=value.device)
    out[tuple(index)] = value
    return out''',
    "erf": '''def {erf}(x):
    """The error function elementwise."""
    return {np}.special.erf({as_float}(x))''',
    "reduce": '''def {reduce}(kind, x, axis):
    """A reduction or normaliser over axes, stable by construction (torch's logsumexp is max-shifted)."""
    if kind == "max":
        return {np}.amax(x, dim=axis)
    if kind == "min":
        return {np}.amin(x, dim=axis)
    if kind == "mean":
        return {as_float}(x).mean(dim=axis)
    if kind in ("argmax", "argmin"):
        extreme = {np}.amax(x, dim=axis, keepdim=True) if kind == "argmax" else {np}.amin(x, dim=axis, keepdim=True)
        hits = (x == extreme).to(x.dtype) if x.dtype.is_floating_point else {as_float}(x == extreme)
        return hits / hits.sum(dim=axis, keepdim=True)
    x = {as_float}(x)
    if x.numel() == 0:
        shift = {np}.zeros_like(x.sum(dim=axis, keepdim=True))
    else:  # as numpy does: shifted by the finite maximum (torch's logsumexp rounds exp(x - lse) at 1e17)
        shift = {np}.amax(x, dim=axis, keepdim=True).detach()
        shift = {np}.where({np}.isfinite(shift), shift, {np}.zeros_like(shift))
    shifted = x - shift
    e = {np}.exp(shifted)
    total = e.sum(dim=axis, keepdim=True)
    if kind == "softmax":
        return e / total
    if kind == "log_softmax":
        return shifted - {np}.log(total)
    return ({np}.log(total) + shift).reshape([n for k, n in enumerate(x.shape) if k not in axis])''',
    "contract": '''def {contract}(equation, *operands):
    """opt_einsum.contract on tensors brought to numpy's common type first (torch.einsum refuses mixed types)."""
    dtype = operands[0].dtype
    for operand in operands[1:]:
        dtype = {np}.promote_types(dtype, operand.dtype)
    if dtype == {np}.bool:
        dtype = {np}.int64
    elif dtype.is_floating_point or dtype.is_complex:  # numpy: an n-byte integer needs a float of 2n bytes
        size = max([min(2 * a.dtype.itemsize, 8) for a in operands if not (a.dtype.is_floating_point or
                    a.dtype.is_complex)] + [dtype.itemsize // (2 if dtype.is_complex else 1)])
        wanted = {{2: {np}.float16, 4: {np}.float32, 8: {np}.float64}}[size]
        dtype = {np}.promote_types(dtype, wanted)
    return {oe}.contract(equation, *[a if a.dtype == dtype else a.to(dtype) for a in operands])''',
    "device": '''def {device}(*inputs):
    """Where new tensors go: the device of the first tensor input (the CPU when there is none)."""
    return next((a.device for a in inputs if isinstance(a, {np}.Tensor)), None)''',
}
#: jax arrays are immutable: the diagonal is written with ``.at[...].set`` (its indices are unique, which
#: also lets jax transpose the write: reverse mode through a JVP program with a surviving delta)
JAX_HELPERS: dict[str, str] = {
    "erf": '''def {erf}(x):
    """The error function elementwise (jax's own, traceable and differentiable)."""
    from jax.scipy.special import erf
    return erf({as_float}(x))''',
    "diagonal": HELPERS["diagonal"].replace("out[tuple(index)] = value\n    return out",
                                             "return out.at[tuple(index)].set(value, unique_indices=True)"),
}
HELPERS["owned"] = '''def {owned}(base, shape, value, coefficient=1):
    """``base`` as an array of ``shape`` and of its result type with ``value * coefficient``, for a diagonal to be
    added into in place: ``base`` itself when it already is one (einflow computed it for that alone), else a copy."""
    dtype = {np}.result_type(base, value, coefficient)
    if {np}.shape(base) == tuple(shape) and {np}.result_type(base) == dtype:
        return base
    return {np}.broadcast_to({np}.asarray(base), shape).astype(dtype)'''
HELPERS["contract"] = '''def {contract}(equation, *operands):
    """opt_einsum.contract."""
    return {oe}.contract(equation, *operands)'''
HELPERS["device"] = '''def {device}(*inputs):
    """Where new arrays go (numpy: the host)."""
    return None'''
#: torch divides integer tensors in float32: there both sides become float64 first, as numpy divides integers
TORCH_HELPERS["divide"] = HELPERS["divide"].replace("    return a / b", "    return {as_float}(a) / {as_float}(b)")
HELPERS["linalg"] = LINALG_HELPER
TORCH_HELPERS["linalg"] = TORCH_LINALG_HELPER
HELPERS["solve"] = SOLVE_HELPER
TORCH_HELPERS["solve"] = TORCH_SOLVE_HELPER
HELPER_NEEDS = {"reciprocal": ("as_float",), "divide": ("as_float",), "erf": ("as_float",), "reduce": ("as_float",),
                "linalg": ("as_float",), "solve": ("as_float",)}
_BUILTINS = frozenset(dir(builtins))
#: the helpers in the order generated code defines them
HELPER_KEYS = ("output", "input", "as_float", "reciprocal", "divide", "sigmoid", "step", "sign", "as_input_float",
               "diagonal", "owned", "contract", "device", "erf", "reduce", "linalg", "solve", "conj", "real", "imag",
               "abs2")
ALIASES = ("np", "oe", *HELPER_KEYS)
#: array modules code can be generated for (``to_source(target=...)``; backends pick theirs)
TARGETS = ("numpy", "torch", "jax")


def usable(name: str) -> bool:
    """Whether ``name`` can be a Python variable."""
    return name.isidentifier() and not keyword.iskeyword(name) and name != "__debug__"


def number_text(value: int | float, np_alias: str = "_np") -> str:
    if isinstance(value, complex):
        return f"complex({value.real!r}, {value.imag!r})"
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return repr(value)
    if math.isnan(value):
        return f"{np_alias}.nan"
    if math.isinf(value):
        return f"{np_alias}.inf" if value > 0 else f"-{np_alias}.inf"
    return repr(float(value))


def kind_of(step: Step) -> str:
    """The report's name for a step (its row of ``STEP_RULES``)."""
    return STEP_RULES[type(step)].kind(step)


class Source:
    """Render lowered steps as the body of a Python function (generic: no shapes known)."""

    def __init__(self, lowered: Lowered, taken: set[str] | None = None, target: str = "numpy") -> None:
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}")
        self.lowered = lowered
        #: the array module the code is written for: "numpy" (also cupy and dask arrays), "torch" or "jax"
        self.target = target
        self.taken = set(taken or ()) | _BUILTINS
        self.alias = {key: self.fresh("_" + key) for key in ALIASES}
        self.used_helpers: set[str] = set()
        self.vars: dict[int, str] = {}
        self.parameters: list[str] = []
        self.keyword_inputs: list[tuple[str, str]] = []
        for register, name in enumerate(lowered.inputs):
            if usable(name):
                var = name
                self.taken.add(name)
                self.parameters.append(name)
            else:
                var = self.fresh(name + "_" if usable(name + "_") else "_input")
                self.keyword_inputs.append((name, var))
            self.vars[register] = var
        self.named = dict(lowered.names)
        self.used = set(self.vars.values()) | set(self.alias.values())
        self.temp_count = 0
        self.labels: dict[int, tuple[str, ...]] = {}
        #: registers known to hold booleans (a specialised rendering knows them all; a generic one knows the
        #: ones vectors of deltas and the diagonals written from them)
        self.booleans: set[int] = generic_booleans(lowered)
        #: float literals as 0-d float64 tensors (generic torch code): torch computes ``0.5 * x`` of an integer
        #: tensor in float32, but with a 0-d float64 tensor in float64 and with a float32 ``x`` in float32, as
        #: numpy does with a Python float (a specialised rendering knows the dtypes and casts instead)
        self.tensor_literals = target == "torch"

    # ------------------------------------------------------------------ names
    def fresh(self, base: str) -> str:
        candidate, number = base, 0
        while candidate in self.taken or not usable(candidate):
            number += 1
            candidate = f"{base}_{number}"
        self.taken.add(candidate)
        return candidate

    def var(self, register: int) -> str:
        found = self.vars.get(register)
        if found is None:
            name = self.named.get(register)
            if name is not None and usable(name) and name not in self.used:
                self.taken.add(name)
                found = name
            else:
                self.temp_count += 1
                found = self.fresh(f"_t{self.temp_count}")
            self.vars[register] = found
            self.used.add(found)
        return found

    def helper(self, key: str) -> str:
        self.used_helpers.add(key)
        for need in HELPER_NEEDS.get(key, ()):
            self.used_helpers.add(need)
        return self.alias[key]

    def helper_text(self, key: str) -> str:
        own = TORCH_HELPERS if self.target == "torch" else JAX_HELPERS if self.target == "jax" else {}
        return own.get(key, HELPERS[key]).format(**self.alias)

    def device(self) -> str:
        """Text of the device new tensors go to (torch only), from the inputs."""
        inputs = ", ".join(self.vars[k] for k in range(len(self.lowered.inputs)))
        return f"{self.helper('device')}({inputs})"

    # ------------------------------------------------------------------ pieces
    def number(self, value: int | float) -> str:
        return number_text(value, self.alias["np"])

    def size(self, ref: SizeRef) -> str:
        if isinstance(ref, int):
            return repr(ref)
        if isinstance(ref, Inferred):  # known only with the shapes (a generic rendering samples dtypes with it)
            return "1"
        return f"{self.vars[ref[0]]}.shape[{ref[1]}]"

    def shape_text(self, refs: tuple[SizeRef, ...]) -> str:
        inner = ", ".join(self.size(ref) for ref in refs)
        return f"({inner},)" if len(refs) == 1 else f"({inner})"

    def arg(self, node: Arg) -> str:
        text = self.var(node.register)
        if node.axes is None:
            return text
        present = [axis for axis in node.axes if axis is not None]
        if present != list(range(len(present))):
            text += f".{'permute' if self.target == 'torch' else 'transpose'}({tuple(present)!r})"
        if None in node.axes:
            text += "[" + ", ".join(":" if axis is not None else "None" for axis in node.axes) + "]"
        return text

    def node(self, node: Node) -> tuple[str, int]:
        """(text, precedence): 1 sum, 2 product, 3 power, 4 atom (the node's row of ``NODE_RULES``)."""
        return NODE_RULES[type(node)].render(self, node)

    def add_terms(self, terms: Sequence[Node]) -> str:
        """``a + b - c``: the terms of a sum, a negative one subtracted (not the first)."""
        pieces: list[str] = []
        for position, term in enumerate(terms):
            negated = _negated(term) if position and self.subtractable(term) else None
            if negated is not None:
                text, level = self.node(negated)
                pieces.append(" - " + (f"({text})" if level < 2 else text))
            else:
                text, level = self.node(term)
                pieces.append((" + " if position else "") + (f"({text})" if level < 1 else text))
        return "".join(pieces)

    def divided(self, node: Mul, numerator: str, divisors: list[Node]) -> str:
        """``numerator`` (the text of ``node``'s other factors) divided by each divisor in turn, as numpy divides
        (Python numbers too: a zero divisor gives inf or nan, not ZeroDivisionError); integers as float64."""
        text = numerator
        for divisor in divisors:
            divisor_text = self.node(divisor)[0]
            text = f"{self.helper('divide')}({text}, {divisor_text})"
        return text

    def product_casts(self, node: Mul) -> dict[int, str]:
        """Factors to cast to the product's common dtype (position -> dtype); unknown dtypes: none."""
        return {}

    def torch_number(self, value: int | float) -> str:
        """A number as a 0-d tensor (torch.maximum and friends take tensors; 0-d ones promote as numpy's weak
        Python numbers do)."""
        dtype = "float64" if isinstance(value, float) else "bool" if isinstance(value, bool) else "int64"
        return f"{self.alias['np']}.tensor({self.number(value)}, dtype={self.alias['np']}.{dtype})"

    def product_order(self, node: Mul) -> list[int]:
        """The order a product's factors are multiplied in (positions); unknown shapes: as written."""
        return list(range(len(node.factors)))

    def subtractable(self, term: Node) -> bool:
        """Whether ``+ term`` may be written ``- (its negation)``: numpy refuses ``bool - bool`` (see ``booleans``)."""
        return not self.booleans or not any(register in self.booleans for register in node_args(term))

    def floating(self, x: str) -> str:
        """``x`` promoted to float64 when it holds integers or booleans (the dtypes are not known here)."""
        return f"{self.helper('as_float')}({x})"

    def call(self, func: str, x: str, promote: bool = True) -> str:
        rule = FUNCTION_RULES[func]
        template = TORCH_CALLS.get(func, rule.source) if self.target == "torch" else rule.source
        if rule.promotes and promote:
            x = self.floating(x)
        helpers = {key: self.helper(key) if "{" + key + "}" in template else ""
                   for key in ("sigmoid", "step", "erf", "sign", "conj", "real", "imag", "abs2")}
        return template.format(x=x, np=self.alias["np"], **helpers)

    def power(self, node: Pow) -> str:
        text, level = self.node(node.base)
        atom = text if level >= 4 else f"({text})"
        exponent = node.exponent
        integral = isinstance(exponent, int) or float(exponent).is_integer()
        np_ = self.alias["np"]
        if exponent == 2:
            return f"{atom} * {atom}" if isinstance(node.base, Arg) else f"{np_}.square({text})"
        if exponent == -1:
            return f"{self.helper('reciprocal')}({text})"
        if exponent == 0.5:  # integers promoted to float64, as for every fractional power
            return f"{np_}.sqrt({self.floating(text)})"
        power = "pow" if self.target == "torch" else "power"
        if not integral or exponent < 0:
            return f"{np_}.{power}({self.helper('as_float')}({text}), {self.number(exponent)})"
        return f"{np_}.{power}({text}, {self.number(exponent)})"

    def as_float(self, text: str) -> str:
        inputs = "".join(", " + self.vars[k] for k in range(len(self.lowered.inputs)))
        return f"{self.helper('as_input_float')}({text}{inputs})"

    def count(self, size: str) -> str:
        """An index's size as a 0-d value of the inputs' floating type (the integer type when they have none)."""
        return self.as_float(f"{self.alias['np']}.asarray({size})")

    def scaled(self, text: str, scale: tuple[Node, ...]) -> str:
        for factor in scale:
            factor_text, level = self.node(factor)
            text += " * " + (f"({factor_text})" if level < 2 else factor_text)
        return text

    # ------------------------------------------------------------------ steps
    def contract(self, step: Contract) -> str:
        equation = einsum_equation(step.operands, step.output)
        args = "".join(", " + self.var(register) for register in step.args)
        call = self.helper("contract") if self.target == "torch" else f"{self.alias['oe']}.contract"
        return self.scaled(f"{call}({equation!r}{args})", step.scale)

    def elementwise(self, step: Elementwise) -> str:
        return self.node(step.expr)[0]

    def astype(self, text: str, dtype: str) -> str:
        """``text`` (an array expression) converted to the numpy dtype named ``dtype``."""
        if self.target == "torch":
            return f"{text}.to({self.alias['np']}.{dtype})"
        return f"{text}.astype({dtype!r})"

    def reduce(self, text: str, axes: tuple[int, ...]) -> str:
        if self.target == "torch" and axes:
            return f"{text}.sum(dim={axes!r})"
        return f"{text}.sum(axis={axes!r})"

    def diagonal_value(self, step: Diagonal, full: bool = False) -> str:
        """The value of a Diagonal step aligned with its view (``diagonal_view_labels``), times its coefficient;
        ``full``: broadcast to the view's shape (for writers that index the diagonals)."""
        value = self.var(step.arg)
        labels = diagonal_view_labels(step)
        if len(labels) > len(step.labels):
            if step.labels:  # (a 0-d value, a Python number too, broadcasts as it is)
                value += "[..., " + ", ".join(["None"] * (len(labels) - len(step.labels))) + "]"
            if full:
                sizes = tuple(step.sizes[step.output.index(label)] for label in labels)
                value = f"{self.alias['np']}.broadcast_to({value}, {self.shape_text(sizes)})"
        return self.scaled(value, () if _is_unit(step.coefficient) else (Number(step.coefficient),))

    def diagonal(self, step: Diagonal, out: str) -> list[str]:
        value = self.var(step.arg)
        scaled = self.diagonal_value(step)
        if self.target != "numpy":  # no strided writes: index the diagonals
            groups = tuple(tuple(step.output.index(m) for m in next((g for g in step.groups if label in g), (label,)))
                           for label in diagonal_view_labels(step))
            written = f"{self.helper('diagonal')}({self.diagonal_value(step, True)}, {self.shape_text(step.sizes)}, " \
                      f"{groups!r})"
            return [f"{out} = {written}" if step.base is None else f"{out} = {self.var(step.base)} + {written}"]
        np_ = self.alias["np"]
        if step.base is None:
            lines = []
            if scaled != value:
                value = self.fresh("_value")
                lines.append(f"{value} = {scaled}")
            lines += [f"{out} = {np_}.zeros({self.shape_text(step.sizes)}, dtype={np_}.result_type({value}))",
                      f"{np_}.einsum({diagonal_spec(step)!r}, {out})[...] = {value}"]
            return lines + ([f"del {value}"] if scaled != self.var(step.arg) else [])
        owned = f"{self.helper('owned')}({self.var(step.base)}, {self.shape_text(step.sizes)}, {value}"
        owned += ")" if _is_unit(step.coefficient) else f", {self.number(step.coefficient)})"
        return [f"{out} = {owned}", *self.diagonal_add(step, out, scaled)]

    def diagonal_add(self, step: Diagonal, out: str, value: str) -> list[str]:
        """Lines adding ``value`` into the diagonal of ``out`` in place (numpy's strided view)."""
        view = self.fresh("_diagonal")
        return [f"{view} = {self.alias['np']}.einsum({diagonal_spec(step)!r}, {out})", f"{view} += {value}",
                f"del {view}"]

    def step_lines(self, step: Step) -> list[str]:
        """The statement(s) computing one step (its row of ``STEP_RULES``)."""
        return STEP_RULES[type(step)].render(self, step, self.var(step.out) if hasattr(step, "out") else "")

    def matrix_name(self, register: int) -> str | None:
        """The name of the declared matrix in ``register`` (an input or a target, read through its check)."""
        checks = {step.out: step.arg for step in self.lowered.steps if isinstance(step, Reduce)
                  and step.kind in (*CHECK_KINDS, "spd_by_factor")}
        register = checks.get(register, register)
        if register < len(self.lowered.inputs):
            return self.lowered.inputs[register]
        return dict(self.lowered.names).get(register)

    def window(self, step: Window | Scatter) -> str:
        """A shifted or gathered read (``einflow.engine.affine``); shape-free: the sizes are computed when it runs."""
        raise EinflowError("programs with shifted, strided or gathered reads cannot be exported to source yet "
                           "(their ranges are found from the shapes when the program runs): call the Program")

    def note(self, number: int, step: Step) -> str:
        return f"[{number}] {kind_of(step)} {STEP_RULES[type(step)].note(self, step)}".rstrip()

    def body(self) -> list[str]:
        """The function body (4-space indented): a comment per statement, each step's lines."""
        lines: list[str] = []
        steps = self.lowered.steps
        position = 0
        number = 0
        for statement, text in enumerate(self.lowered.statements):
            lines.append(f"    # {text}")
            while position < len(steps) and steps[position].statement == statement:
                step = steps[position]
                position += 1
                rendered = self.step_lines(step)
                if not rendered:
                    continue
                if not isinstance(step, Free):
                    number += 1
                    self.labels[step.out] = getattr(step, "labels", getattr(step, "output", ()))
                    rendered[0] += f"  # {self.note(number, step)}"
                lines.extend("    " + line for line in rendered)
        return lines

    def returned(self) -> list[str]:
        return [self.var(register) for register in self.lowered.outputs]


def generic_booleans(lowered: Lowered) -> set[int]:
    """The registers known to hold booleans without knowing the inputs' dtypes: the ones vectors of deltas and
    the diagonals written from them."""
    booleans: set[int] = set()
    for step in lowered.steps:
        if isinstance(step, Ones) or isinstance(step, Diagonal) and step.arg in booleans and \
                step.base is None and _is_unit(step.coefficient):
            booleans.add(step.out)
    return booleans


def taken_names(lowered: Lowered) -> set[str]:
    """The names the generated code may not give its own variables: the inputs' and the targets'."""
    return set(lowered.inputs) | {name for _, name in lowered.names}


_HELPER_CACHE: dict[tuple[Any, ...], dict[str, Any]] = {}


def helpers(source: Source, xp: Any) -> dict[str, Any]:
    """The generated code's helper functions under the renderer's names, on the array module ``xp`` (cached)."""
    key = (tuple(sorted(source.alias.items())), xp.__name__, source.target)
    found = _HELPER_CACHE.get(key)
    if found is None:
        found = {source.alias["np"]: xp, "MatrixError": MatrixError}  # raised by the linalg helper's checks
        if xp.__name__.startswith("dask"):  # the linalg and solve helpers hand dask arrays to one numpy task
            import numpy

            from einflow.engine.backends.dask_linalg import linalg_task, solve_task

            on_numpy = helpers(source, numpy)
            found.update(_dask_linalg=functools.partial(linalg_task, on_numpy[source.alias["linalg"]]),
                         _dask_solve=functools.partial(solve_task, on_numpy[source.alias["solve"]]))
        for name in HELPER_KEYS:
            exec(source.helper_text(name), found)  # noqa: S102 - our own helper text
        if len(_HELPER_CACHE) < 64:
            _HELPER_CACHE[key] = found
    return dict(found)


def diagonal_view_labels(step: Diagonal) -> tuple[str, ...]:
    """The axes of a Diagonal step's diagonal view: its value's, then those the value is broadcast along."""
    representative = {member: group[0] for group in step.groups for member in group}
    view = dict.fromkeys(representative.get(label, label) for label in step.output)
    return step.labels + tuple(label for label in view if label not in step.labels)


def diagonal_spec(step: Diagonal) -> str:
    """The einsum equation whose result is the writable view of a Diagonal step's diagonal (its value's axes)."""
    representative = {member: group[0] for group in step.groups for member in group}
    labels = diagonal_view_labels(step)
    return einsum_equation([(representative.get(label, label) for label in step.output)], labels, index_letters(labels))


def _divisor(factor: Node) -> bool:
    """Whether a product's factor is ``x ** -1`` (the product is rendered as a division by ``x``)."""
    return isinstance(factor, Pow) and not isinstance(factor.exponent, bool) and factor.exponent == -1


#: a sum or product of more terms is written in parenthesised groups of at most this many: Python's compiler
#: recurses once per operator of ``a + b + c + ...`` and overflows near 3,000 (the groups nest log(n) deep)
FLAT_TERMS = 64


def _grouped(items: Sequence[Any], render: Callable[[Sequence[Any]], str], operator: str) -> str:
    """``render(items)``, or for more than FLAT_TERMS items, the rendered groups joined by ``operator``.

    >>> _grouped([f"x{k}" for k in range(3)], " + ".join, " + ")
    'x0 + x1 + x2'
    >>> _grouped([f"x{k}" for k in range(130)], " + ".join, " + ").count("(")
    3
    """
    if len(items) <= FLAT_TERMS:
        return render(items)
    size = FLAT_TERMS  # groups of a power of FLAT_TERMS items, at most FLAT_TERMS of them
    while len(items) > size * FLAT_TERMS:
        size *= FLAT_TERMS
    return operator.join(f"({_grouped(items[k:k + size], render, operator)})" for k in range(0, len(items), size))


def _positive_first(terms: tuple[Node, ...]) -> tuple[Node, ...]:
    """Two terms with the negative one first are swapped (``1 - x``, not ``x * (-1) + 1``): exact in floats."""
    if len(terms) == 2 and _negated(terms[0]) is not None and _negated(terms[1]) is None:
        return terms[1], terms[0]
    return terms


def _negated(term: Node) -> Node | None:
    """``term`` without its negative sign, when it is a product with a negative number (else None)."""
    if isinstance(term, Number) and not isinstance(term.value, (bool, complex)) and term.value < 0:
        return Number(-term.value) if not (isinstance(term.value, int) and term.value == -(2**63)) else None
    if isinstance(term, Mul):
        numbers = [f for f in term.factors if isinstance(f, Number)]
        if len(numbers) == 1 and not isinstance(numbers[0].value, (bool, complex)) and numbers[0].value < 0:
            value = numbers[0].value
            rest = tuple(f for f in term.factors if f is not numbers[0])
            if type(value) is int and value == -1 and rest:
                return rest[0] if len(rest) == 1 else Mul(rest)
            return Mul((*rest, Number(-value)))
    return None



# ---------------------------------------------------------------------------------------------- node rules
# One row per elementwise expression node: how the generated code computes it (``render``: text and
# precedence, children through ``source.node`` so a renderer's overrides apply), the plan report's text
# (``describe``), its operations per element (``operations``), the arrays ufuncs need to evaluate it
# (``temporaries``, the memory model) and the registers it reads in the order its operations meet them
# (``args``). Adding a node kind is adding a row.


def _render_number(source: Source, node: Number) -> tuple[str, int]:
    if source.tensor_literals and isinstance(node.value, float):
        return source.torch_number(node.value), 4
    text = source.number(node.value)
    return text, 1 if text.startswith("-") else 4


def _render_apply(source: Source, node: Apply) -> tuple[str, int]:
    if node.other is not None:
        operands = [source.node(part)[0] if source.target != "torch" or not isinstance(part, Number)
                    else source.torch_number(part.value) for part in (node.arg, node.other)]
        return f"{source.alias['np']}.{node.func}({operands[0]}, {operands[1]})", 4
    inner = source.node(node.arg)[0]
    # a promoting function's result is already floating: no second promotion around it
    computed_float = (isinstance(node.arg, Apply) and node.arg.other is None  # maximum(a, b) keeps ints
                      and FUNCTION_RULES[node.arg.func].promotes)
    return source.call(node.func, inner, promote=not computed_float), 4


def _render_as_float(source: Source, node: AsFloat) -> tuple[str, int]:
    if isinstance(node.arg, Size):
        return source.count(source.size(node.arg.ref)), 4
    return source.as_float(source.node(node.arg)[0]), 4


def _render_mul(source: Source, node: Mul) -> tuple[str, int]:
    factors = []
    casts = source.product_casts(node)
    divisors = [f.base for f in node.factors if _divisor(f)]  # type: ignore[union-attr]
    if len(divisors) == len(node.factors):
        divisors = []  # reciprocals alone: 1 / x is the reciprocal
    for position in source.product_order(node):
        factor = node.factors[position]
        if divisors and _divisor(factor):
            continue
        text, level = source.node(factor)
        if position in casts:
            text, level = source.astype(text if level >= 4 else f"({text})", casts[position]), 4
        factors.append(f"({text})" if level < 2 else text)
    product = _grouped(factors, " * ".join, " * ")
    if divisors:  # division is division (x / x is 1 where x * (1 / x) may not be)
        return source.divided(node, product, divisors), 2
    return product, 2


def _describe_arg(node: Arg, labels: tuple[str, ...], specialiser: Any) -> str:
    rank = len(specialiser.shape[node.register])
    axes = node.axes if node.axes is not None else tuple(range(rank)) if rank else ()
    own = [label for _, label in sorted((axis, labels[k]) for k, axis in enumerate(axes) if axis is not None)]
    name = specialiser.var(node.register)
    return f"{name}[{','.join(own)}]" if own else name


def _describe_apply(node: Apply, labels: tuple[str, ...], specialiser: Any) -> str:
    if node.other is not None:
        return f"{node.func}({_describe(node.arg, labels, specialiser)}, {_describe(node.other, labels, specialiser)})"
    return f"{node.func}({_describe(node.arg, labels, specialiser)})"


def _describe_pow(node: Pow, labels: tuple[str, ...], specialiser: Any) -> str:
    base = _describe(node.base, labels, specialiser)
    return f"({base})^{node.exponent}" if " " in base else f"{base}^{node.exponent}"


def _describe_mul(node: Mul, labels: tuple[str, ...], specialiser: Any) -> str:
    factors = sorted(node.factors, key=lambda factor: not isinstance(factor, Number))  # the number first
    return " ".join(f"({_describe(f, labels, specialiser)})" if isinstance(f, Add) else
                    _describe(f, labels, specialiser) for f in factors)


def _operations_apply(node: Apply, call: int | None, leaves: Any) -> int:
    if node.other is not None:
        return 1 + _operations(node.arg, call, leaves) + _operations(node.other, call, leaves)
    return (FUNCTION_RULES[node.func].cost if call is None else call) + _operations(node.arg, call, leaves)


def _operations_of_parts(parts: tuple[Node, ...], call: int | None, leaves: Any) -> int:
    return len(parts) - 1 + sum(_operations(part, call, leaves) for part in parts)


def _temporaries_apply(node: Apply) -> tuple[int, float]:
    if node.other is not None:
        return _temporaries(Add((node.arg, node.other)))
    return _temporaries_unary(node.arg, FUNCTION_RULES[node.func].temporaries)


def _temporaries_unary(arg: Node, own: float = 0.0) -> tuple[int, float]:
    inner, extra = _temporaries(arg)
    return max(inner, 1), max(extra, own + inner)


def _temporaries_of_parts(parts: tuple[Node, ...]) -> tuple[int, float]:
    need = 0
    extra = 0.0
    for position, part in enumerate(parts):
        count, more = _temporaries(part)
        # earlier partial results stay alive while this operand is computed
        need = max(need, count + (1 if position > 1 else 0), 1)
        extra = max(extra, more)
    return need, extra


def _no_temporaries(node: Node) -> tuple[int, float]:
    return 0, 0.0


def _no_operations(node: Node, call: int | None, leaves: Any) -> int:
    return 0


@dataclass(frozen=True)
class NodeRule:
    """One elementwise expression node kind: ``render(source, node)`` the generated code's (text, precedence);
    ``describe(node, labels, specialiser)`` the plan report's text; ``operations(node, call, leaves)`` its
    operations per element (see ``_operations``); ``temporaries(node)`` (arrays needed, counting the result;
    extra temporaries of functions); ``args(node)`` the registers it reads, in the order its operations meet them.

    >>> NODE_RULES[Add].describe(Add((Number(1), Number(2.5))), (), None)
    '1 + 2.5'
    """

    render: Callable[[Source, Any], tuple[str, int]]
    describe: Callable[[Any, tuple[str, ...], Any], str]
    operations: Callable[[Any, int | None, Any], int]
    temporaries: Callable[[Any], tuple[int, float]]
    args: Callable[[Any], list[Arg]]


NODE_RULES: dict[type, NodeRule] = {
    Arg: NodeRule(
        render=lambda source, node: (source.arg(node), 4),
        describe=_describe_arg,
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: [node]),
    Number: NodeRule(
        render=_render_number,
        describe=lambda node, labels, specialiser: repr(node.value),
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: []),
    Size: NodeRule(
        render=lambda source, node: (source.size(node.ref), 4),
        describe=lambda node, labels, specialiser: repr(specialiser.resolve(node.ref)),
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: []),
    Apply: NodeRule(
        render=_render_apply,
        describe=_describe_apply,
        operations=_operations_apply,
        temporaries=_temporaries_apply,
        args=lambda node: _args_in_order(node.arg) + ([] if node.other is None else _args_in_order(node.other))),
    AsFloat: NodeRule(
        render=_render_as_float,
        describe=lambda node, labels, specialiser: _describe(node.arg, labels, specialiser),
        operations=lambda node, call, leaves: 1 + _operations(node.arg, call, leaves),
        temporaries=lambda node: _temporaries_unary(node.arg),
        args=lambda node: _args_in_order(node.arg)),
    Pow: NodeRule(
        render=lambda source, node: (source.power(node), 4),
        describe=_describe_pow,
        operations=lambda node, call, leaves: 1 + _operations(node.base, call, leaves),
        temporaries=lambda node: _temporaries_unary(node.base),
        args=lambda node: _args_in_order(node.base)),
    Add: NodeRule(
        render=lambda source, node: (_grouped(_positive_first(node.terms), source.add_terms, " + "), 1),
        describe=lambda node, labels, specialiser: " + ".join(_describe(term, labels, specialiser)
                                                              for term in node.terms),
        operations=lambda node, call, leaves: _operations_of_parts(node.terms, call, leaves),
        temporaries=lambda node: _temporaries_of_parts(node.terms),
        args=lambda node: [arg for part in _positive_first(node.terms) for arg in _args_in_order(part)]),
    Mul: NodeRule(
        render=_render_mul,
        describe=_describe_mul,
        operations=lambda node, call, leaves: _operations_of_parts(node.factors, call, leaves),
        temporaries=lambda node: _temporaries_of_parts(node.factors),
        args=lambda node: [arg for part in node.factors for arg in _args_in_order(part)]),
}

assert set(NODE_RULES) == set(Node.__args__)  # type: ignore[attr-defined]


def _describe(node: Node, labels: tuple[str, ...], specialiser: Any) -> str:
    """An elementwise expression in einflow-like text: ``tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])``."""
    return NODE_RULES[type(node)].describe(node, labels, specialiser)


def _operations(node: Node, call: int | None = None, leaves: Any = ()) -> int:
    """Operations per element (a function counts its ``cost``, or ``call`` when given; ``leaves``: nodes computed
    apart, which count none)."""
    if node in leaves:
        return 0
    return NODE_RULES[type(node)].operations(node, call, leaves)


def _temporaries(node: Node) -> tuple[int, float]:
    """(arrays needed to evaluate ``node`` with ufuncs, counting the result; extra temporaries of functions)."""
    return NODE_RULES[type(node)].temporaries(node)


def _args_in_order(node: Node) -> list[Arg]:
    """The registers an expression reads, in the order its operations meet them."""
    return NODE_RULES[type(node)].args(node)


# ---------------------------------------------------------------------------------------------- step rules
# One row per step kind: the report's name for it (``kind``), the statements computing it (``render``, given
# the renderer and the name of its result) and the text after the name in its comment and the plan report
# (``note``). The specialised rows are ``einflow.engine.specialise.PLAN_RULES`` (shapes, dtypes, FLOPs, memory) and
# ``einflow.engine.render.RENDER_RULES`` (lines with shapes).


def _free_lines(source: Source, step: Free, out: str) -> list[str]:
    names = [source.vars[r] for r in step.registers if r in source.vars]
    return [f"del {', '.join(names)}"] if names else []


def _constant_lines(source: Source, step: Constant, out: str) -> list[str]:
    np_ = source.alias["np"]
    if source.target == "torch":  # a 0-d tensor (numpy's default types; 0-d tensors do not widen others)
        dtype = "float64" if isinstance(step.value, float) else "int64"
        return [f"{out} = {np_}.tensor({source.number(step.value)}, dtype={np_}.{dtype})"]
    return [f"{out} = {np_}.asarray({source.number(step.value)})"]


def _ones_lines(source: Source, step: Ones, out: str) -> list[str]:
    np_ = source.alias["np"]
    if source.target == "torch":
        return [f"{out} = {np_}.ones(({source.size(step.size)},), dtype={np_}.bool, device={source.device()})"]
    return [f"{out} = {np_}.ones(({source.size(step.size)},), dtype=\"bool\")"]


def _reduce_lines(source: Source, step: Reduce, out: str) -> list[str]:
    if step.kind == "sum":
        return [f"{out} = {source.reduce(source.var(step.arg), step.axes)}"]
    if is_linalg(step):
        name = source.matrix_name(step.arg)  # named in the errors (singular, not positive definite)
        extra = f", {name!r}" if name is not None and not step.kind.startswith("cho_") else ""
        return [f"{out} = {source.helper('linalg')}({step.kind!r}, {source.var(step.arg)}, {step.axes!r}{extra})"]
    return [f"{out} = {source.helper('reduce')}({step.kind!r}, {source.var(step.arg)}, {step.axes!r})"]


def _solve_lines(source: Source, step: Solve, out: str) -> list[str]:
    name = source.matrix_name(step.matrix) if step.kind != "cho_solve" else None
    extra = f", name={name!r}" if name is not None else ""
    extra += f", batch={step.batch!r}" if step.batch else ""
    return [f"{out} = {source.helper('solve')}({step.kind!r}, {source.var(step.matrix)}, {step.axes!r}, "
            f"{source.var(step.rhs)}, {step.rhs_axis}, {step.transposed}{extra})"]


def _reduce_note(source: Source, step: Reduce) -> str:
    keeps = (*ir.NORMALISERS, *KEEPS_AXES)
    kept = step.labels if step.kind in keeps else tuple(
        label for k, label in enumerate(step.labels) if k not in step.axes)
    return f"[{','.join(step.labels)}] -> [{','.join(kept)}]"


def _solve_note(source: Source, step: Solve) -> str:
    over = "rows" if step.transposed else "columns"
    return f"inv({source.var(step.matrix)}) {source.var(step.rhs)} over its {over} -> [{','.join(step.labels)}]"


def _diagonal_note(source: Source, step: Diagonal) -> str:
    text = "delta " + ", ".join("=".join(group) for group in step.groups)
    if step.base is not None:
        text = f"{source.var(step.base)} + {text}"
    return text


def _scatter_note(source: Source, step: Scatter) -> str:
    written = ", ".join(ir.format_position(position) for position in step.positions)
    return f"[{','.join(step.arg_labels)}] -> [{written}] of [{','.join(step.labels)}]"


def _window_note(source: Source, step: Window) -> str:
    read = ", ".join(ir.format_position(position) for position in step.positions)
    return f"{step.name}[{read}] -> [{','.join(step.labels)}]"


def _elementwise_kind(step: Elementwise) -> str:
    expr = step.expr
    if isinstance(expr, Arg):
        return "transpose"
    if isinstance(expr, Add):
        return "add"
    if isinstance(expr, Mul):
        arrays = [f for f in expr.factors if isinstance(f, (Arg, AsFloat)) or not isinstance(f, (Number, Size))]
        return "scale" if len(arrays) <= 1 or all(isinstance(f, (Number, Size, AsFloat)) for f in arrays) else "product"
    return "elementwise"


def _no_note(source: Source, step: Step) -> str:
    return ""


@dataclass(frozen=True)
class StepRule:
    """One step kind: ``kind(step)`` the report's name for it; ``render(source, step, out)`` the statements
    computing it (``out`` the name of its result); ``note(source, step)`` the text after the name in its comment
    in the generated code and in the plan report (e.g. ``[i,k] [k,j] -> [i,j]``).

    >>> STEP_RULES[Contract].kind(Contract(0, 2, (0, 1), (("i", "k"), ("k", "j")), ("i", "j"), (), ()))
    'contract'
    """

    kind: Callable[[Any], str]
    render: Callable[[Source, Any, str], list[str]]
    note: Callable[[Source, Any], str]


STEP_RULES: dict[type, StepRule] = {
    Constant: StepRule(
        kind=lambda step: "constant",
        render=_constant_lines,
        note=_no_note),
    Ones: StepRule(
        kind=lambda step: "ones",
        render=_ones_lines,
        note=_no_note),
    Contract: StepRule(
        kind=lambda step: "contract",
        render=lambda source, step, out: [f"{out} = {source.contract(step)}"],
        note=lambda source, step: " ".join(f"[{','.join(labels)}]" for labels in step.operands)
        + f" -> [{','.join(step.output)}]"),
    Reduce: StepRule(  # plain reductions, the normalisers and the linear-algebra kinds (einflow.engine.linalg)
        kind=lambda step: step.kind,
        render=_reduce_lines,
        note=_reduce_note),
    Solve: StepRule(
        kind=lambda step: step.kind,
        render=_solve_lines,
        note=_solve_note),
    Elementwise: StepRule(
        kind=_elementwise_kind,
        render=lambda source, step, out: [f"{out} = {source.elementwise(step)}"],
        note=lambda source, step: f"[{','.join(step.labels)}]"),
    Diagonal: StepRule(
        kind=lambda step: "diagonal",
        render=lambda source, step, out: source.diagonal(step, out),
        note=_diagonal_note),
    Window: StepRule(
        kind=lambda step: "window",
        render=lambda source, step, out: [f"{out} = {source.window(step)}"],
        note=_window_note),
    Scatter: StepRule(
        kind=lambda step: "scatter",
        render=lambda source, step, out: [f"{out} = {source.window(step)}"],
        note=_scatter_note),
    Free: StepRule(
        kind=lambda step: "free",
        render=_free_lines,
        note=_no_note),
}

assert set(STEP_RULES) == set(Step.__args__)  # type: ignore[attr-defined]
