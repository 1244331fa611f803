"""Lowering products: one :class:`Contract` step, or an elementwise multiplication when nothing is summed, and
the surviving deltas as a :class:`Diagonal` write. Each function is passed the statement's
:class:`~einflow.engine.lower_context.LoweringContext`.
"""

from __future__ import annotations

from collections import Counter

from einflow.engine.lower_context import LoweringContext, Value, align, number_types
from einflow.engine.steps import Arg, AsFloat, Contract, Diagonal, Mul, Node, Number, Size
from einflow.lang.indices import einsum_equation, index_letters
from einflow.lang.numbers import _is_unit, _weak

__all__ = ["contract", "presum", "diagonal"]


def contract(cx: LoweringContext, operands: list[tuple[Value, list[str]]], output: list[str],
             classes: dict[str, list[str]], coefficient: int | float, scalars: list[Value],
             counts: list[Size]) -> Value:
    operands, scalars = presum(cx, operands, output, scalars)
    partners = {member for rep, members in classes.items() for member in members if member != rep}
    inner = tuple(label for label in output if label not in partners)
    scale: list[Node] = [Arg(s.reg) for s in scalars] + counts  # type: ignore[arg-type]
    if not _is_unit(coefficient):
        scale.append(Number(_weak(coefficient)))
    if not operands:
        if not scalars:
            return diagonal(cx, Value(None, (), coefficient), output, classes)
        if len(scale) == 1 and isinstance(scale[0], Arg):
            return diagonal(cx, Value(scale[0].register, ()), output, classes)
        product = Mul(tuple(scale))
        value = cx.elementwise(("mul", product, number_types(product)), product, ())
        return diagonal(cx, value, output, classes)
    if not scalars and all(value.reg in cx.synthetic for value, _ in operands):
        # deltas alone are booleans: in the inputs' floating type (scaled even by the int 1: numbers, not bools)
        value, labels = operands[0]
        expr = Mul((AsFloat(Arg(value.reg)), Number(_weak(coefficient)), *counts))  # type: ignore[arg-type]
        operands[0] = (cx.elementwise(("mul", expr, number_types(expr)), expr, value.labels), labels)
        scale = []
    keys = [tuple(labels) for _, labels in operands]
    everything = [label for labels in keys for label in labels]
    repeated = any(len(set(labels)) != len(labels) for labels in keys)
    summed = set(everything) - set(inner)
    if not repeated and not summed:
        # an elementwise product (outer products included): broadcasting, never einsum
        factors = [Arg(value.reg, align(labels, inner)) for (value, _), labels in zip(operands, keys)]
        if len(factors) == 1 and not scale:
            if factors[0].axes is None:
                result = Value(operands[0][0].reg, inner)
            else:
                result = cx.aligned(factors[0], inner)  # type: ignore[arg-type]
        else:
            expr = Mul((*factors, *scale))  # type: ignore[arg-type]
            result = cx.elementwise(("mul", expr, number_types(expr)), expr, inner)
        return diagonal(cx, result, output, classes)
    if len(operands) == 1 and not repeated:
        value, labels = operands[0]
        keep = tuple(label for label in keys[0] if label in inner)
        axes = tuple(position for position, label in enumerate(keys[0]) if label not in inner)
        reduced = cx.sum_axes(Value(value.reg, keys[0]), frozenset(keys[0][a] for a in axes))
        reduced = Value(reduced.reg, keep)
        expr: Node = Arg(reduced.reg, align(keep, inner))  # type: ignore[arg-type]
        if scale:
            expr = Mul((expr, *scale))
        elif expr.axes is None:  # type: ignore[union-attr]
            return diagonal(cx, Value(reduced.reg, inner), output, classes)
        return diagonal(cx, cx.elementwise(("mul", expr, number_types(expr)), expr, inner), output,
                             classes)
    args = tuple(value.reg for value, _ in operands)
    sizes = cx.sizes_of(inner)
    # positional: the same contraction under other index names is computed once
    equation = einsum_equation(keys, inner, index_letters(everything))
    key = ("contract", equation, args, tuple(scale), number_types(Mul(tuple(scale))))
    result = cx.emit(key, inner, Contract, args, tuple(keys), inner, sizes, tuple(scale))
    return diagonal(cx, result, output, classes)


def presum(cx: LoweringContext, operands: list[tuple[Value, list[str]]], output: list[str],
           scalars: list[Value]) -> tuple[list[tuple[Value, list[str]]], list[Value]]:
    """An operand whose indices are all summed and occur nowhere else is summed on its own first: a scalar
    factor (``sum[i](w[i] s[p])`` is ``sum(w) * s``, not an ``i,p->p`` outer product); an operand's indices
    that occur nowhere else are summed on it first too."""
    if len(operands) < 2:
        return operands, scalars
    kept: list[tuple[Value, list[str]]] = []
    scalars = list(scalars)
    # how many operands carry each index: an operand's index is elsewhere when another one carries it too
    carriers = Counter(label for _, own in operands for label in set(own))
    for position, (value, labels) in enumerate(operands):
        shared = {label for label in labels if carriers[label] > 1}
        alone = (labels and len(set(labels)) == len(labels) and not set(labels) & (shared | set(output))
                 and value.reg not in cx.synthetic)
        private = frozenset(labels) - shared - set(output)
        if alone and (kept or position < len(operands) - 1):
            reduced = cx.sum_axes(Value(value.reg, tuple(labels)), frozenset(labels))
            scalars.append(Value(reduced.reg, ()))
        elif private and len(set(labels)) == len(labels) and value.reg not in cx.synthetic:
            # indices only this operand carries are summed on it first (`Y[r,c] t[r,s]`: the row sums of Y
            # times t, a broadcast product, not an `rc,rs->rs` einsum)
            reduced = cx.sum_axes(Value(value.reg, tuple(labels)), private)
            kept.append((reduced, [label for label in labels if label not in private]))
        else:
            kept.append((value, labels))
    return kept, scalars


def diagonal(cx: LoweringContext, value: Value, output: list[str], classes: dict[str, list[str]]) -> Value:
    if not classes:
        return value
    value = cx.materialize(value)
    full = tuple(output)
    groups = tuple(tuple(members) for members in classes.values())
    sizes = cx.sizes_of(full)
    reg, labels = value.reg, value.labels
    return cx.emit(("diag", reg, labels, full, groups, sizes), full, Diagonal, reg, labels, full, groups, sizes)
