"""What a feature's lowering reads and calls: lowered values and the context each lowering function is passed.

``einflow.engine.lower`` walks the IR; the lowerings of linear algebra (``einflow.engine.linalg_lower``), of
shifted reads (``einflow.engine.affine_lower``) and of contractions (``einflow.engine.contract_lower``) are
functions of a :class:`LoweringContext` (the register table, the names in scope, the current statement and its
index sizes), which the walk builds for each statement and passes down. The register operations (a step
numbered once, an elementwise step, a sum over axes, a transposed view, a number made an array, a vector of
ones) are the context's own methods, here: a feature's lowering calls nothing of the walk's but the lowering of
a sub-expression (``lower``, ``lower_product``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from einflow.engine.steps import (
    Add,
    Apply,
    Arg,
    AsFloat,
    Constant,
    Elementwise,
    Node,
    Number,
    Ones,
    Pow,
    Reduce,
    Size,
    SizeRef,
    Step,
)
from einflow.lang import ir
from einflow.lang.numbers import _weak

__all__ = ["Value", "Factor", "LoweringContext", "align", "number_types"]


def align(labels: tuple[str, ...], order: tuple[str, ...]) -> tuple[int | None, ...] | None:
    """Axes taking a register with ``labels`` to ``order`` (None when it already is in that order)."""
    if not labels or labels == order:
        return None
    return tuple(labels.index(label) if label in labels else None for label in order)


def number_types(node: Node) -> tuple[type, ...]:
    """The types of an expression's numbers: keys must tell ``x * 2`` from ``x * 2.0`` (1 == 1.0 in Python)."""
    if isinstance(node, Number):
        return (type(node.value),)
    if isinstance(node, (Arg, Size)):
        return ()
    if isinstance(node, (Apply, AsFloat)):
        return number_types(node.arg)
    if isinstance(node, Pow):
        return (*number_types(node.base), type(node.exponent))
    parts = node.terms if isinstance(node, Add) else node.factors
    return tuple(t for part in parts for t in number_types(part))


@dataclass(frozen=True, slots=True)
class Value:
    """A lowered value: a register with axis labels, or a compile-time number."""

    reg: int | None
    labels: tuple[str, ...] = ()
    const: int | float | None = None


@dataclass(frozen=True, slots=True)
class Factor:
    """The register of a Cholesky factor and the positions (rows, columns) of its matrices' axes."""

    reg: int
    axes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoweringContext:
    """One statement's lowering as a feature's lowering sees it: the register table and its operations, the
    lowering of a sub-expression, and the tables they share (mutable containers the walk owns; a feature adds to
    them). The walk makes one for each statement (and again once the statement's index sizes are known)."""

    #: the statement's position in the program (each step records it)
    statement: int
    #: where each index of the statement gets its size (``einflow.engine.lower_sizes.statement_size_refs``)
    sizes: Mapping[str, SizeRef]
    #: the register of the first step (registers below it are the inputs)
    first: int
    #: the steps made so far, in order: the step at position k makes register ``first + k``
    steps: list[Step]
    #: each step's key -> its register: equal work (by key) is numbered once
    numbering: dict[Any, int]
    #: ``lower(expr, bound, reduce)``: a sub-expression's value
    lower: Callable[[ir.Expr, frozenset[str], frozenset[str]], Value]
    #: ``lower_product(factors, bound, reduce, preferred)``: a product's value
    lower_product: Callable[[tuple[ir.Expr, ...], frozenset[str], frozenset[str], tuple[str, ...]], Value]
    #: tensor names in scope (inputs, targets, and the values a feature names: ``solve#3``, ``adj#4``, ``#5``)
    names: dict[str, Value]
    register_sizes: dict[int, tuple[SizeRef, ...]]
    #: ``symmetric A`` / ``spd K`` declarations: name -> kind
    matrices: dict[str, str]
    #: det steps: their register -> (the matrix's register, its (row, column) axes)
    determinants: dict[int, tuple[int, tuple[int, ...]]]
    #: ``size`` declarations in force
    declared: dict[str, SizeRef]
    #: the statements' shifted-read ranges (``Lowered.ranges``)
    ranges: list[Any]
    #: registers of synthetic ones (a delta's axis): booleans, never summed on their own
    synthetic: set[int]
    #: every value is real (no complex input or literal): a symmetric matrix is its own transpose
    real: bool = False

    def emit(self, key: Any, labels: tuple[str, ...], kind: Callable[..., Step], *fields: Any) -> Value:
        """Append the step ``kind(statement, register, *fields)`` unless an equal one (by ``key``) exists; its
        value has ``labels``. (The step's class and fields, not a function making it: nothing is called back.)"""
        register = self.numbering.get(key)
        if register is None:
            register = self.first + len(self.steps)
            step = kind(self.statement, register, *fields)
            self.steps.append(step)
            self.register_sizes[register] = getattr(step, "sizes", ())
            self.numbering[key] = register
        return Value(register, labels)

    def sizes_of(self, labels: tuple[str, ...]) -> tuple[SizeRef, ...]:
        return tuple(self.sizes.get(label, -1) for label in labels)  # -1: none; specialising says so

    def elementwise(self, key: Any, expr: Node, labels: tuple[str, ...]) -> Value:
        sizes = self.sizes_of(labels)
        return self.emit(key, labels, Elementwise, expr, labels, sizes)

    def materialize(self, value: Value) -> Value:
        """A compile-time number as a (0-d) array; an array as it is."""
        if value.const is None:
            return value
        constant = _weak(value.const)
        return self.emit(("const", type(constant), constant), (), Constant, constant)

    def sum_axes(self, value: Value, reduce: frozenset[str]) -> Value:
        axes = tuple(position for position, label in enumerate(value.labels) if label in reduce)
        if not axes or value.reg is None:
            return value
        labels = tuple(label for label in value.labels if label not in reduce)
        sizes = self.sizes_of(labels)
        reg = value.reg
        return self.emit(("sum", reg, axes), labels, Reduce, reg, value.labels, axes, sizes)

    def aligned(self, arg: Arg, order: tuple[str, ...]) -> Value:
        """A register transposed (a view): one step, so that the report and the code show it."""
        return self.elementwise(("align", arg), arg, order)

    def ones(self, label: str) -> Value:
        """A vector of ones along ``label`` (a delta's axis no operand carries): synthetic, a boolean."""
        size = self.sizes.get(label, -1)
        value = self.emit(("ones", size), (label,), Ones, size)
        assert value.reg is not None
        self.register_sizes[value.reg] = (size,)
        self.synthetic.add(value.reg)
        return value
