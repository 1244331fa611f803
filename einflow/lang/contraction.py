"""The index logic of one product, shared by the evaluator (plan.py) and the code generator (export/python.py).

Pure functions on label lists: which indices a product keeps, and how its deltas are substituted away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from einflow.lang import ir
from einflow.lang.numbers import exact_mul

__all__ = ["ProductParts", "split_product", "product_output", "eliminate_deltas"]

V = TypeVar("V")


@dataclass
class ProductParts(Generic[V]):
    """A product's factors sorted by role: a folded number, 0-d values, indexed operands, deltas."""

    coefficient: int | float = 1
    scalars: list[V] = field(default_factory=list)
    operands: list[tuple[V, list[str]]] = field(default_factory=list)
    deltas: list[list[str]] = field(default_factory=list)
    #: every operand's and delta's labels in factor order (the order of the product's free indices)
    sequence: list[list[str]] = field(default_factory=list)


def split_product(factors: tuple[ir.Expr, ...], tensor: Callable[[str], V], lower: Callable[[ir.Expr], V],
                  constant: Callable[[V], int | float | None],
                  labels: Callable[[V], tuple[str, ...]]) -> ProductParts[V]:
    """Sort a product's factors, the same way for the evaluator and the code generator.

    ``tensor(name)`` is a named value, ``lower(factor)`` evaluates a scope-opening factor,
    ``constant(value)`` is its compile-time number (or None), ``labels(value)`` its axis labels.
    Numbers and constant values fold into the coefficient exactly (integers of any size; ``_weak`` makes
    it a weak Python number where it is used).
    """
    parts: ProductParts[V] = ProductParts()
    for factor in factors:
        if isinstance(factor, ir.Num):
            parts.coefficient = exact_mul(parts.coefficient, factor.value)
            continue
        if isinstance(factor, ir.Delta):
            parts.deltas.append([factor.first, factor.second])
            parts.sequence.append(parts.deltas[-1])
            continue
        if isinstance(factor, ir.Tensor):
            value = tensor(factor.name)
            indices = factor.indices
        elif isinstance(factor, ir.Read):  # a window: one axis per index it mentions
            value = lower(factor)
            indices = factor.indices
        else:
            value = lower(factor)
            indices = labels(value)
        number = constant(value)
        if number is not None:
            parts.coefficient = exact_mul(parts.coefficient, number)
        elif not indices:
            parts.scalars.append(value)
        else:
            parts.operands.append((value, list(indices)))
            parts.sequence.append(parts.operands[-1][1])
    return parts


def product_output(sequence: list[list[str]] | list[tuple[str, ...]], bound: frozenset[str], reduce: frozenset[str],
                   preferred: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(output labels, summed labels), both in order, of a product whose operands carry ``sequence``'s labels.

    An index is kept when it occurs once or is bound, and is not in ``reduce``; it is summed otherwise.
    Kept labels come in order of first occurrence, or in ``preferred``'s order for those it names.

    >>> product_output([["i", "k"], ["k", "j"]], frozenset(), frozenset())
    (['i', 'j'], ['k'])
    """
    counts: Counter[str] = Counter()
    order: list[str] = []
    for labels in sequence:
        for label in labels:
            if label not in counts:
                order.append(label)
            counts[label] += 1
    output = [label for label in order if (counts[label] == 1 or label in bound) and label not in reduce]
    if preferred:
        output = [label for label in preferred if label in output] + [l for l in output if l not in preferred]
    return output, [label for label in order if label not in output]


def eliminate_deltas(operands: list[list[str]], deltas: list[list[str]], summed: Collection[str],
                     output: list[str]) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """Substitute deltas away where an index is summed (renaming ``operands``' labels in place).

    Returns the surviving diagonals (representative -> its members, all kept in the output), the
    output labels that no operand carries any more, which the caller supplies as vectors of ones
    (``sum_j delta[j,l]`` is 1 for every kept ``l``), and the summed labels that no operand carries,
    whose sizes multiply the product (``sum_{j,l} delta[j,l]`` counts ``l``'s size). Counting by
    multiplication, not by contracting vectors of ones, keeps a count exact in any dtype.

    >>> ops = [["j", "m"]]
    >>> eliminate_deltas(ops, [["i", "j"]], {"j"}, ["i", "m"]), ops
    (({}, [], []), [['i', 'm']])
    >>> eliminate_deltas([["p"]], [["i", "i"], ["j", "j"]], {"i", "j"}, ["p"])
    ({}, [], ['i', 'j'])
    """
    classes: dict[str, list[str]] = {}
    survivors: set[str] = set()  # indices a substituted delta leaves behind (still summed or kept)

    def rename(old: str, new: str) -> None:
        for labels in [*operands, *deltas]:
            labels[:] = [new if label == old else label for label in labels]
        if old in survivors:
            survivors.discard(old)
            survivors.add(new)

    while deltas:
        first, second = deltas.pop()
        if first == second:
            survivors.add(first)  # delta[i,i] is 1, but summing i over it still counts i's size
        elif first in summed:
            rename(first, second)
            survivors.add(second)
        elif second in summed:
            rename(second, first)
            survivors.add(first)
        else:
            # both stay in the output: remember the diagonal and compute on one label
            members = classes.pop(second, [second])
            group = classes.setdefault(first, [first])
            group.extend(member for member in members if member not in group)
            rename(second, first)
    partners = {member for rep, members in classes.items() for member in members if member != rep}
    uncarried = [label for label in dict.fromkeys([*output, *sorted(survivors)])
                 if label not in partners and not any(label in labels for labels in operands)]
    return classes, [label for label in uncarried if label in output], [l for l in uncarried if l not in output]
