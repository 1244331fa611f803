"""Lowering shifted reads (LANGUAGE.md 8.2): a read at affine positions as a :class:`Window` step, a product with
deltas of positions read through or scattered, and the ranges the plan infers for the shifted indices. Each
function is passed the statement's :class:`~einflow.engine.lower_context.LoweringContext`.
"""

from __future__ import annotations

from collections import Counter

from einflow.engine.lower_context import LoweringContext, Value, align, number_types
from einflow.engine.steps import Arg, AsFloat, Mul, Node, Number, Scatter, SizeRef, Window
from einflow.lang import ir
from einflow.lang.contraction import product_output
from einflow.lang.errors import EinflowError
from einflow.lang.indices import indices_in, product_operands
from einflow.lang.numbers import _weak
from einflow.lang.positions import _mentions, read_through, solve_through

__all__ = ["note_ranges", "lower_shifted", "indicator", "window"]


def note_ranges(cx: LoweringContext, statement: ir.Assign, known: dict[str, SizeRef]) -> None:
    """For a statement with shifted reads, what its ranges are inferred from when the shapes are known
    (``Lowered.ranges``: exported code infers them at run time as ``statement_sizes`` does)."""
    reads: list[tuple[SizeRef, tuple[tuple[int, str], ...], int, bool]] = []
    for node in ir.walk(statement.expr):
        if isinstance(node, ir.Read):
            value = cx.names[node.name]
            lengths = cx.register_sizes.get(value.reg, ()) if value.reg is not None else ()
            reads.extend((lengths[axis], position.terms, position.offset, False)
                         for axis, position in enumerate(node.positions)
                         if isinstance(position, ir.Affine) and axis < len(lengths))
        elif isinstance(node, ir.ShiftDelta) and node.index in known and isinstance(node.position, ir.Affine):
            reads.append((known[node.index], node.position.terms, node.position.offset, True))
    if reads:
        padded = tuple(sorted({index for _, terms, _, _ in reads for _, index in terms} & cx.declared.keys()))
        named = {index for _, terms, _, _ in reads for _, index in terms}
        cx.ranges.append((cx.statement, tuple((index, size) for index, size in known.items()
                                                  if index in named), tuple(reads), padded))


def lower_shifted(cx: LoweringContext, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
                  preferred: tuple[str, ...]) -> Value:
    """A product with deltas of positions: a summed one is read through (``x[p] delta[p, h+r]`` is the
    padded read ``x[h+r]``), a kept one scatters the product of the other factors (:class:`Scatter`)."""
    output, summed = product_output(product_operands(factors, bound), bound, reduce, preferred)
    through = {f.index for f in factors if isinstance(f, ir.ShiftDelta)} & set(summed)
    leaves = (ir.Num, ir.Tensor, ir.Read, ir.Delta, ir.ShiftDelta)
    named: list[ir.Expr] = []
    for factor in factors:  # a scope read through a delta is computed first, then read as a named array
        if not isinstance(factor, leaves) and indices_in(factor) & through:
            value = cx.materialize(cx.lower(factor, bound, frozenset()))
            name = f"#{value.reg}"
            cx.names[name] = Value(value.reg, value.labels)
            factor = ir.Tensor(name, value.labels)
        named.append(factor)
    factors, shifts = read_through(solve_through(tuple(named), frozenset(summed)), frozenset(summed))
    stuck = {id(shift): indicator(cx, shift) for shift in shifts if shift.index in summed}
    if stuck:  # a summed delta nothing reads through (``delta[v, t[n]] delta[v, t[m]]``): a dense 0/1 array
        factors = tuple(stuck.get(id(factor), factor) for factor in factors)
        shifts = [shift for shift in shifts if id(shift) not in stuck]
    reduce = reduce | frozenset(summed)  # substituting changes how often an index occurs, not whether it sums
    repeated = {index for index, count in Counter(shift.index for shift in shifts).items() if count > 1}
    dense: dict[int, ir.Expr] = {}
    for shift in shifts:  # a delta whose index other factors read too (or other deltas, all of them): 0/1 arrays
        others = {i for f in factors if f is not shift and not isinstance(f, ir.ShiftDelta) for i in _mentions(f)}
        if shift.index in others or shift.index in repeated or shift.index in shift.position.indices:
            # (``delta[s, t[s]]``, a diagonal of a scatter, as a Laplacian makes it: a 0/1 mask over s)
            dense[id(shift)] = indicator(cx, shift)
    if dense:
        factors = tuple(dense.get(id(factor), factor) for factor in factors)
        shifts = [f for f in factors if isinstance(f, ir.ShiftDelta)]
    if not shifts:
        return cx.lower_product(factors, bound, reduce, preferred)
    rest = tuple(factor for factor in factors if not isinstance(factor, ir.ShiftDelta))
    targets = [shift.index for shift in shifts]
    needed = tuple(dict.fromkeys([*(label for label in output if label not in targets),
                                  *(index for shift in shifts for index in shift.position.indices)]))
    value = cx.materialize(cx.lower_product(rest, bound | frozenset(needed), reduce - frozenset(needed),
                                                needed)) if rest else Value(None, (), 1)
    if value.reg is None and not needed:  # deltas of constant positions alone (``delta[p, 1]``): the number
        value = cx.materialize(Value(None, (), value.const))
    elif value.reg is None:  # deltas alone: ones of the inputs' floating type, times the number
        ones = [cx.ones(label) for label in needed]
        node: Node = Mul(tuple(Arg(one.reg, align((label,), needed)) for one, label in zip(ones, needed)))  # type: ignore
        node = Mul((AsFloat(node), Number(_weak(value.const))))  # type: ignore[arg-type]
        value = cx.elementwise(("mul", node, number_types(node)), node, needed)
    missing = [label for label in needed if label not in value.labels]
    if missing and value.reg is not None:  # broadcast over what the value lacks (a Toeplitz matrix of K)
        ones = [cx.ones(label) for label in missing]
        product = Mul((Arg(value.reg, align(value.labels, needed)),  # type: ignore[arg-type]
                       *(Arg(one.reg, align((label,), needed)) for one, label in zip(ones, missing))))  # type: ignore
        value = cx.elementwise(("mul", product, number_types(product)), product, needed)
    if (len(set(targets)) != len(targets) or value.reg is None or set(targets) & set(value.labels)
            or set(needed) - set(value.labels)):
        raise EinflowError("this product of deltas of positions cannot be computed yet: "
                           + ir.format_expr(ir.Product(factors)))
    by_target = {shift.index: shift for shift in shifts}
    positions = tuple(by_target[label].position if label in by_target else label for label in output)
    modes = tuple(by_target[label].mode if label in by_target else "zeros" for label in output)
    modes = modes if any(mode != "zeros" for mode in modes) else ()
    # (the gathers in the order of the output's axes, as the scatter numbers its gathered positions)
    gathers = tuple(cx.materialize(cx.names[g.name]).reg for label in output if label in by_target
                    for g in by_target[label].gathers)
    labels = tuple(output)
    sizes = cx.sizes_of(labels)
    key = ("scatter", value.reg, value.labels, positions, gathers, labels, sizes, modes)
    return cx.emit(key, labels, Scatter, value.reg, value.labels, positions, gathers, labels, sizes, modes)


def indicator(cx: LoweringContext, shift: ir.ShiftDelta) -> ir.Tensor:
    """``delta[p, 2*k + 1]`` as a dense 0/1 array over ``p`` and the position's indices (a scatter of ones),
    named so that a product reads it like any tensor."""
    labels = tuple(shift.position.indices)
    ones = [cx.ones(label) for label in labels]
    if ones:
        node: Node = AsFloat(Mul(tuple(Arg(one.reg, align((label,), labels))  # type: ignore[arg-type]
                                       for one, label in zip(ones, labels))))
        value = cx.elementwise(("mul", node, number_types(node)), node, labels)
    else:  # a constant position: one 1.0 put at it
        value = cx.materialize(Value(None, (), 1.0))
    output = (shift.index, *labels)
    gathers = tuple(cx.materialize(cx.names[g.name]).reg for g in shift.gathers)
    sizes = cx.sizes_of(output)
    positions = (shift.position, *labels)
    modes = (shift.mode, *("zeros" for _ in labels)) if shift.mode != "zeros" else ()
    key = ("scatter", value.reg, labels, positions, gathers, output, sizes, modes)
    result = cx.emit(key, output, Scatter, value.reg, labels, positions, gathers, output, sizes, modes)
    name = f"#{result.reg}"
    cx.names[name] = Value(result.reg, output)
    return ir.Tensor(name, output)


def window(cx: LoweringContext, read: ir.Read) -> Value:
    """A shifted, strided, constant or gathered read: one :class:`Window` step (``einflow.engine.affine``)."""
    source = cx.materialize(cx.names[read.name])
    gathers = tuple(cx.materialize(cx.names[gather.name]).reg for gather in read.gathers)
    labels = read.indices
    sizes = cx.sizes_of(labels)
    key = ("window", source.reg, read.positions, gathers, labels, sizes, read.mode)
    return cx.emit(key, labels, Window, source.reg, read.name, read.positions, gathers, labels, sizes, read.mode)
