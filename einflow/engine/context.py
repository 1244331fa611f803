"""What the render rows read: the generated code's names and a frozen context per step.

:class:`Names` gives registers, helpers and temporaries their names in the generated code (one per rendering,
written as the rows name things). :class:`RenderContext` is the frozen value every row of
:mod:`einflow.engine.codegen`, :mod:`einflow.engine.render` and :mod:`einflow.engine.render_fitted` takes: the
names, the dialect, the lowered program and, when shapes are known, the specialised record and the fitting's
decisions; a step's own facts (``scale_dtype``, ``read_as``, ``in_place``) are a copy of it made for that step
(``dataclasses.replace``) and passed down, never set and reset. Without a record the same rows write
shape-free code: ``to_source``'s, and the one-element samples the specialise pass types elementwise steps with.
"""

from __future__ import annotations

import builtins
import keyword
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from einflow.engine.dialect import NUMPY, Dialect
from einflow.engine.helpers import HELPER_KEYS
from einflow.engine.steps import Diagonal, Inferred, Lowered, Ones, SizeRef
from einflow.lang.numbers import _is_unit

__all__ = ["Names", "RenderContext", "usable", "number_text", "ALIASES", "generic_booleans", "taken_names",
           "resolve_size"]

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


def resolve_size(ref: SizeRef, shapes: Mapping[int, tuple[int, ...]],
                 inferred: Mapping[tuple[int, str], int]) -> int:
    """An index's size: a literal, an axis of a register of known shape, or a size a statement's check inferred."""
    if isinstance(ref, Inferred):
        return inferred[(ref.statement, ref.index)]
    return ref if isinstance(ref, int) else shapes[ref[0]][ref[1]]


class Names:
    """The generated code's names: each register's variable, the helpers used, fresh temporaries."""

    def __init__(self, lowered: Lowered, taken: set[str] | frozenset[str] | None = None) -> None:
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
        #: each step's result's labels, as the body numbered it
        self.labels: dict[int, tuple[str, ...]] = {}
        #: names made once per rendering and then reused (the blocks runner, torch_ops, ...), by purpose
        self.once: dict[str, str] = {}

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
        """The name of the helper ``key``, noted as used (exported source defines it and, in its dialect, what it
        calls: ``einflow.engine.helpers.defined_helpers``)."""
        self.used_helpers.add(key)
        return self.alias[key]


@dataclass(frozen=True)
class RenderContext:
    """What a render row knows: the rendering's names (shared, growing as rows name things), the dialect, the
    lowered program, the registers known to hold booleans and, with shapes, the specialised record
    (``record``), the fitting's decisions and the generated function's globals.

    Per step (a copy made with ``dataclasses.replace`` for the step at hand): ``scale_dtype``, the type of the
    contraction at hand (``scaled`` groups its scalar factors when that keeps it); ``read_as``, torch and jax:
    the floating type an elementwise step reads its integer arrays in, as numpy computes them (torch would
    compute ``0.5 x`` of int64 x in float32); ``in_place``, torch: the elementwise expression at hand reads and
    makes arrays of one floating type, so work on an array it just made may be done in place
    (``(a + b).tanh_()``).
    """

    names: Names
    lowered: Lowered
    dialect: Dialect = NUMPY
    #: registers known to hold booleans (a specialised rendering knows them all; a shape-free one the ones
    #: vectors of deltas and the diagonals written from them, ``generic_booleans``)
    booleans: set[int] | frozenset[int] = frozenset()
    #: float literals as 0-d float64 tensors (shape-free torch code): torch computes ``0.5 * x`` of an integer
    #: tensor in float32, but with a 0-d float64 tensor in float64 and with a float32 ``x`` in float32, as
    #: numpy does with a Python float (a specialised rendering knows the dtypes and casts instead)
    tensor_literals: bool = False
    #: every input holds floating numbers (no promotion needed); known only with the dtypes
    floating_inputs: bool = False
    #: the specialised record (``einflow.engine.specialise.Specialised``); None: shape-free code
    record: Any = None
    #: the fitting's decisions (``einflow.engine.fitting.Fitting``), with a record
    fitting: Any = None
    #: the generated function's globals besides the helpers (kernels, contract expressions, slice tables)
    namespace: dict[str, Any] = field(default_factory=dict)
    #: kernels of the steps computed block by block (``einflow.engine.blocks``), defined before the function
    kernels: list[str] = field(default_factory=list)
    #: shape-free code with shifted reads: each statement's variable holding its inferred ranges
    range_names: dict[int, str] = field(default_factory=dict)
    #: registers read through another name in the expression at hand (a chunk's view of them)
    views: Mapping[int, str] = field(default_factory=dict)
    scale_dtype: Any = None
    read_as: str | None = None
    in_place: bool = False

    @property
    def alias(self) -> dict[str, str]:
        return self.names.alias

    def var(self, register: int) -> str:
        return self.names.var(register)

    def fresh(self, base: str) -> str:
        return self.names.fresh(base)

    def helper(self, key: str) -> str:
        return self.names.helper(key)

    def resolve(self, ref: SizeRef) -> int:
        return resolve_size(ref, self.record.shapes, self.record.inferred)


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
