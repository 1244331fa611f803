"""What a feature's lowering reads and calls: lowered values and the context each lowering function is passed.

``einflow.engine.lower`` walks the IR; the lowerings of linear algebra (``einflow.engine.linalg_lower``), of
shifted reads (``einflow.engine.affine_lower``) and of contractions (``einflow.engine.contract_lower``) are
functions of a :class:`LoweringContext` (the registers, the names in scope and the current statement), which
the walk builds for each statement and passes down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from einflow.engine.steps import Add, Apply, Arg, AsFloat, Node, Number, Pow, Size, SizeRef, Step
from einflow.lang import ir

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
    """One statement's lowering as a feature's lowering sees it: the register operations, the lowering of a
    sub-expression, and the tables they share (mutable dicts the walk owns; a feature adds to them)."""

    #: the statement's position in the program (each step records it)
    statement: int
    #: ``emit(key, make, labels)``: the step ``make(register)`` unless an equal one (by ``key``) exists
    emit: Callable[[Any, Callable[[int], Step], tuple[str, ...]], Value]
    sizes_of: Callable[[tuple[str, ...]], tuple[SizeRef, ...]]
    materialize: Callable[[Value], Value]
    elementwise: Callable[[Any, Node, tuple[str, ...]], Value]
    ones: Callable[[str], Value]
    sum_axes: Callable[[Value, frozenset[str]], Value]
    #: ``aligned(arg, order)``: a register transposed (a view step)
    aligned: Callable[[Arg, tuple[str, ...]], Value]
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
