"""Steps -> Python source: one straight-line function body, one line (or two) per step.

:class:`Source` renders a :class:`einflow.engine.lower.Lowered` program without shapes: sizes are read off the
inputs at run time and contractions call ``opt_einsum.contract``; this is what ``to_source`` exports.
``einflow.engine.plan`` renders the same steps specialised for shapes, dtypes and a backend (literal sizes,
contractions as direct BLAS calls, large fused elementwise work block by block) and compiles that text as
the executor. ``_np`` is the array module in both.
"""

from __future__ import annotations

import builtins
import keyword
import math
from collections.abc import Sequence

from einflow.engine.dialect import NUMPY, Dialect
from einflow.engine.helpers import HELPER_KEYS, HELPER_NEEDS, helper_text
from einflow.engine.linalg import CHECK_KINDS
from einflow.engine.rows import (
    NODE_RULES,
    STEP_RULES,
    diagonal_spec,
    diagonal_view_labels,
    kind_of,
    negation_of,
)
from einflow.engine.steps import (
    Arg,
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
    SizeRef,
    Step,
    Window,
    node_args,
)
from einflow.lang.errors import EinflowError
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import einsum_equation
from einflow.lang.numbers import _is_unit

__all__ = ["Source", "generic_booleans", "taken_names", "usable", "number_text", "ALIASES"]

#: the generated code's names: the array module, opt_einsum, the helpers (``einflow.engine.helpers``)
ALIASES = ("np", "oe", *HELPER_KEYS)
_BUILTINS = frozenset(dir(builtins))


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


class Source:
    """Render lowered steps as the body of a Python function (generic: no shapes known)."""

    def __init__(self, lowered: Lowered, taken: set[str] | None = None, dialect: Dialect = NUMPY) -> None:
        self.lowered = lowered
        #: the array dialect the code is written in: numpy's (also cupy and dask arrays), torch's or jax's
        self.dialect = dialect
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
        self.tensor_literals = dialect.typed_literals

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
        return helper_text(self.dialect, key, self.alias)

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
            text += f".{self.dialect.permute}({tuple(present)!r})"
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
            negated = negation_of(term) if position and self.subtractable(term) else None
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
        template = self.dialect.calls.get(func, rule.source)
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
        power = self.dialect.power
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
        call = self.helper("contract") if self.dialect.promoting_contract else f"{self.alias['oe']}.contract"
        return self.scaled(f"{call}({equation!r}{args})", step.scale)

    def elementwise(self, step: Elementwise) -> str:
        return self.node(step.expr)[0]

    def astype(self, text: str, dtype: str) -> str:
        """``text`` (an array expression) converted to the numpy dtype named ``dtype``."""
        return self.dialect.cast.format(x=text, dtype=dtype, np=self.alias["np"])

    def reduce(self, text: str, axes: tuple[int, ...]) -> str:
        keyword = self.dialect.axis if axes else "axis"  # (torch: ``dim=()`` would sum every axis)
        return f"{text}.sum({keyword}={axes!r})"

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
        if not self.dialect.strided_writes:  # index the diagonals
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
