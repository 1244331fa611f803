"""The index logic of one product, shared by the evaluator (plan.py) and the code generator (export/python.py).

Pure functions on label lists: which indices a product keeps, and how its deltas are substituted away.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

__all__ = ["product_output", "eliminate_deltas"]


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
                     output: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Substitute deltas away where an index is summed (renaming ``operands``' labels in place).

    Returns the surviving diagonals (representative -> its members, all kept in the output) and the
    labels that no operand carries any more, which the caller supplies as vectors of ones:
    ``sum_j delta[j,l]`` is 1 for every kept ``l``; ``sum_{j,l} delta[j,l]`` counts ``l``'s size.

    >>> ops = [["j", "m"]]
    >>> eliminate_deltas(ops, [["i", "j"]], {"j"}, ["i", "m"]), ops
    (({}, []), [['i', 'm']])
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
    missing = [label for label in dict.fromkeys([*output, *sorted(survivors)])
               if label not in partners and not any(label in labels for labels in operands)]
    return classes, missing
