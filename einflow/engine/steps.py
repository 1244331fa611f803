"""The plain data between the lowering and everything that reads it: steps, and the expressions inside them.

Each step reads registers and writes one (inputs are registers ``0..n-1``, in the program's input order):

- :class:`Contract`    a product that sums an index (or repeats one): one einsum, planned pairwise later;
- :class:`Elementwise` a fused elementwise expression (a :data:`Node` tree) over aligned registers: sums,
  products without a summed index, functions, powers, scales;
- :class:`Reduce`      a sum over some axes of one register;
- :class:`Diagonal`    a surviving delta: the value written into the diagonal of a zeroed array, or added into
  the diagonal of the sum's other terms (``base``, updated in place where it is the step's own array);
- :class:`Ones`, :class:`Constant` arrays that deltas and constant results need;
- :class:`Free`        registers released after their last use.

Nothing here knows shapes: an index's size is a :data:`SizeRef`, the literal of a ``size`` declaration or
an axis of an input. ``einflow.engine.lower`` makes these; ``einflow.engine.plan``, ``einflow.engine.codegen`` and
``einflow.export.python`` read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

from einflow.lang import ir

__all__ = ["SizeRef", "Arg", "Number", "Size", "Apply", "Pow", "Add", "Mul", "AsFloat", "Node", "Constant", "Ones",
           "Contract", "Reduce", "Elementwise", "Diagonal", "Window", "Scatter", "Inferred", "Free", "Solve", "Step",
           "Lowered", "step_inputs", "arg_nodes", "node_args",
           "map_args", "realign", "substitute", "substitute_all"]

@dataclass(frozen=True, slots=True)
class Inferred:
    """The size of an index that a shifted read sizes (LANGUAGE.md 8.2): known once the statement's shapes are."""

    statement: int
    index: str


#: an index's size: a literal (``size n = 10``), ``(input register, axis)``, or inferred from shifted reads
SizeRef = Union[int, tuple[int, int], Inferred]


# ---------------------------------------------------------------- elementwise expressions
@dataclass(frozen=True, slots=True)
class Arg:
    """A register, aligned: ``axes[k]`` is the register's axis at position k, or None for a broadcast axis."""

    register: int
    axes: tuple[int | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class Number:
    value: int | float


@dataclass(frozen=True, slots=True)
class Apply:
    """An elementwise function of ``einflow.lang.functions`` (``other``: the second argument of maximum/minimum)."""

    func: str
    arg: Node
    other: Node | None = None


@dataclass(frozen=True, slots=True)
class Pow:
    base: Node
    exponent: int | float


@dataclass(frozen=True, slots=True)
class Add:
    terms: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Mul:
    factors: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Size:
    """An index's size as a number: a summed delta index that nothing else carries counts it."""

    ref: SizeRef


@dataclass(frozen=True, slots=True)
class AsFloat:
    """Deltas alone are booleans: numbers of the inputs' floating type (when they have one)."""

    arg: Node


Node = Union[Arg, Number, Size, Apply, Pow, Add, Mul, AsFloat]


# ---------------------------------------------------------------- steps
@dataclass(frozen=True, slots=True)
class Constant:
    statement: int
    out: int
    value: int | float


@dataclass(frozen=True, slots=True)
class Ones:
    """A boolean vector of ones (a delta's index that no operand carries any more)."""

    statement: int
    out: int
    size: SizeRef


@dataclass(frozen=True, slots=True)
class Contract:
    """``einsum`` of ``args`` (labels ``operands``) into ``output``, multiplied by the ``scale`` factors."""

    statement: int
    out: int
    args: tuple[int, ...]
    operands: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    sizes: tuple[SizeRef, ...]
    scale: tuple[Node, ...] = ()


@dataclass(frozen=True, slots=True)
class Reduce:
    """A reduction of ``arg`` over ``axes`` (``kind``: sum, max, min, mean, logsumexp), or a normaliser
    (softmax, log_softmax, argmax, argmin) over ``axes`` that keeps every axis (then ``sizes`` are the argument's)."""

    statement: int
    out: int
    arg: int
    labels: tuple[str, ...]
    axes: tuple[int, ...]
    sizes: tuple[SizeRef, ...]
    kind: str = "sum"


@dataclass(frozen=True, slots=True)
class Elementwise:
    statement: int
    out: int
    expr: Node
    labels: tuple[str, ...]
    sizes: tuple[SizeRef, ...]


@dataclass(frozen=True, slots=True)
class Diagonal:
    """``arg`` (axes ``labels``) times ``coefficient`` written into a zeroed array with axes ``output``; each
    group shares a diagonal. With a ``base`` (a register aligned with ``output``, computed for this step alone),
    the value is added to the base's diagonal instead: ``base + delta ... arg`` without a zeroed array."""

    statement: int
    out: int
    arg: int
    labels: tuple[str, ...]
    output: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    sizes: tuple[SizeRef, ...]
    base: int | None = None
    coefficient: int | float = 1


@dataclass(frozen=True, slots=True)
class Window:
    """A read through shifted, strided, constant or gathered positions (``x[2*h + r - 1]``, ``E[t[b], d]``):
    the array with one axis per index of ``labels``, a strided view of ``arg`` where it can be (a gather takes;
    a position outside the axis reads 0 where a ``size`` declaration allows it). ``positions`` are the IR's,
    a gather's tensor read from ``gathers`` (registers, in the order of the read's gathers)."""

    statement: int
    out: int
    arg: int
    name: str
    positions: tuple[ir.Position, ...]
    gathers: tuple[int, ...]
    labels: tuple[str, ...]
    sizes: tuple[SizeRef, ...]
    #: outside the axis: ``zeros`` reads 0; ``circular``, ``reflect``, ``replicate`` fold (``pad`` declarations)
    mode: str = "zeros"


@dataclass(frozen=True, slots=True)
class Scatter:
    """A scatter-add (``delta[p, h + r]`` or ``delta[v, t[b]]`` kept in a product's output): a zeroed array with axes
    ``labels`` into which every element of ``arg`` (axes ``arg_labels``) is added at the position each of
    ``positions`` gives (a plain label: the same axis of ``arg``); elements landing outside are dropped."""

    statement: int
    out: int
    arg: int
    arg_labels: tuple[str, ...]
    positions: tuple[ir.Position, ...]
    gathers: tuple[int, ...]
    labels: tuple[str, ...]
    sizes: tuple[SizeRef, ...]
    #: per position, how one outside its axis folds back (``zeros``: dropped); empty: all ``zeros``
    modes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Free:
    statement: int
    registers: tuple[int, ...]


# ---- linear algebra (LANGUAGE.md 8.1; einflow.engine.linalg renders it)
@dataclass(frozen=True, slots=True)
class Solve:
    """``inv(M) B`` without the inverse: ``matrix``'s axes ``axes`` are (rows, columns) of M; ``rhs``'s axis
    ``rhs_axis`` is contracted with M's columns (with its rows when ``transposed``: ``B^T inv(M)``). The result's
    first axis is M's other index, then ``rhs``'s other axes in order (``labels``). ``kind``: solve (LU),
    spd_solve (Cholesky, M declared spd) or cho_solve (``matrix`` holds M's Cholesky factor). ``batch``: pairs
    (M's axis, rhs's axis) of M's batch indices, solved matrix by matrix; they come first in the result (rhs's
    axis None: rhs lacks that index and is broadcast, the same right-hand sides for every matrix)."""

    statement: int
    out: int
    matrix: int
    rhs: int
    axes: tuple[int, int]
    rhs_axis: int
    transposed: bool
    labels: tuple[str, ...]
    sizes: tuple[SizeRef, ...]
    kind: str = "solve"
    batch: tuple[tuple[int, int | None], ...] = ()



Step = Union[Constant, Ones, Contract, Reduce, Elementwise, Diagonal, Window, Scatter, Free, Solve]


@dataclass(frozen=True)
class Lowered:
    """A lowered program: its steps and where its values are."""

    inputs: tuple[str, ...]
    ranks: tuple[int, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    returns_tuple: bool
    #: each statement's einflow text (a step's ``statement`` is a position here)
    statements: tuple[str, ...]
    #: register -> the target name of the statement that made it
    names: tuple[tuple[int, str], ...]
    register_count: int
    #: (statement, target, register or None for a number) for each assignment with a target
    bindings: tuple[tuple[int, str, int | None], ...] = ()
    #: each statement with shifted reads: (statement, its known sizes (index, size), its affine reads as (axis
    #: length, ((coefficient, index), ...), offset, whether a delta's), declared indices among them); its
    #: ranges are these, Tullio's rule applied (``einflow.lang.indices.infer_ranges``)
    ranges: tuple[tuple[int, tuple[tuple[str, SizeRef], ...], tuple[tuple[SizeRef, tuple[tuple[int, str], ...],
                                                                           int, bool], ...], tuple[str, ...]], ...] = ()


def arg_nodes(node: Node) -> list[Arg]:
    """The operands an expression reads, in order, with repeats."""
    if isinstance(node, Arg):
        return [node]
    if isinstance(node, (Number, Size)):
        return []
    if isinstance(node, Apply) and node.other is not None:
        return arg_nodes(node.arg) + arg_nodes(node.other)
    if isinstance(node, (Apply, AsFloat)):
        return arg_nodes(node.arg)
    if isinstance(node, Pow):
        return arg_nodes(node.base)
    parts = node.terms if isinstance(node, Add) else node.factors
    return [arg for part in parts for arg in arg_nodes(part)]


def node_args(node: Node) -> list[int]:
    """Registers an expression reads, in order, with repeats."""
    return [arg.register for arg in arg_nodes(node)]


def step_inputs(step: Step) -> list[int]:
    """Registers a step reads (with repeats)."""
    if isinstance(step, Contract):
        return [*step.args, *(r for factor in step.scale for r in node_args(factor))]
    if isinstance(step, Elementwise):
        return node_args(step.expr)
    if isinstance(step, Diagonal):
        return [step.arg] if step.base is None else [step.base, step.arg]
    if isinstance(step, Reduce):
        return [step.arg]
    if isinstance(step, Solve):
        return [step.matrix, step.rhs]
    if isinstance(step, (Window, Scatter)):
        return [step.arg, *step.gathers]
    return []


def map_args(node: Node, on_arg: Callable[[Arg], Node]) -> Node:
    """``node`` rebuilt with each register read (an :class:`Arg`) replaced by ``on_arg`` of it."""
    if isinstance(node, Arg):
        return on_arg(node)
    if isinstance(node, (Number, Size)):
        return node
    if isinstance(node, Apply):
        other = None if node.other is None else map_args(node.other, on_arg)
        return Apply(node.func, map_args(node.arg, on_arg), other)
    if isinstance(node, AsFloat):
        return AsFloat(map_args(node.arg, on_arg))
    if isinstance(node, Pow):
        return Pow(map_args(node.base, on_arg), node.exponent)
    if isinstance(node, Add):
        return Add(tuple(map_args(term, on_arg) for term in node.terms))
    return Mul(tuple(map_args(factor, on_arg) for factor in node.factors))


def realign(node: Node, axes: tuple[int | None, ...] | None, ranks: dict[int, int]) -> Node:
    """``node`` with its result's axes rearranged by ``axes``, pushed down to its registers (``ranks``: theirs)."""
    if axes is None:
        return node

    def aligned(arg: Arg) -> Node:
        if arg.axes is None and not ranks.get(arg.register):
            return arg  # a 0-d value broadcasts as it is
        if arg.axes is None:
            return Arg(arg.register, axes)
        return Arg(arg.register, tuple(None if a is None else arg.axes[a] for a in axes))

    return map_args(node, aligned)


def substitute_all(node: Node, replacements: dict[int, Node], ranks: dict[int, int]) -> Node:
    """``node`` with each register of ``replacements`` replaced by its expression, in one walk."""

    def replaced(arg: Arg) -> Node:
        found = replacements.get(arg.register)
        return arg if found is None else realign(found, arg.axes, ranks)

    return map_args(node, replaced)


def substitute(node: Node, register: int, replacement: Node, ranks: dict[int, int]) -> Node:
    """``node`` with the register replaced by an expression (aligned as the register was)."""
    return substitute_all(node, {register: replacement}, ranks)
