"""Surviving deltas of a sum added into the sum's other terms: no zeroed array per delta term.

A Hessian is often a dense part plus terms that live on a diagonal (``A[p,q,r,s] + delta[p,r] b[p,q,s]``).
Lowered term by term, each delta term is a zeroed array of the full result's shape with its value written on
the diagonal, and the sum then reads them all: for the pairwise energy's Hessian, six arrays of the result's
size. :func:`accumulate_diagonals` rewrites such a sum so that the dense terms are computed once and each delta
term is added into the diagonal of that array (in place, where the array is the sum's own):

    _t5 = zeros(...); _t5[diag] = b        d2 = A + ...            # the dense terms
    d2 = A + ... + _t5 + ...        ->     d2[diag] += b           # each delta term, on its diagonal only

A delta term qualifies when it is read only by that sum (not a named target, not an output) and enters it
linearly: through sums and products with numbers (``-2 (x + 2 delta...)``), its numbers becoming the
diagonal step's ``coefficient``.

>>> from einflow.engine.lower import lower
>>> from einflow.program import compile
>>> steps = [step for step in lower(compile("h[p,q] = x[p] x[q] + 2 delta[p,q] x[p]")).steps if hasattr(step, "out")]
>>> [type(step).__name__ for step in steps]
['Elementwise', 'Elementwise', 'Diagonal']
>>> steps[2].base == steps[0].out  # x[p] x[q], then 2 x[p] added on its diagonal
True
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from einflow.engine.steps import (
    Add,
    Apply,
    Arg,
    AsFloat,
    Contract,
    Diagonal,
    Elementwise,
    Mul,
    Node,
    Number,
    Ones,
    Pow,
    Size,
    Step,
    realign,
    step_inputs,
)
from einflow.lang.numbers import _weak, exact_mul

__all__ = ["accumulate_diagonals"]

#: (register, axes, coefficient) of a delta term found in a sum
_Found = tuple[int, tuple[int, ...], "int | float"]


def accumulate_diagonals(steps: list[Step], protected: tuple[int, ...], ranks: dict[int, int],
                         register_count: int) -> tuple[list[Step], int]:
    """Steps with each qualifying sum of delta terms rewritten (see the module), and the new register count.

    ``protected``: registers read from outside the steps (outputs, named targets); ``ranks``: each register's.
    """
    uses: Counter[int] = Counter()
    for step in steps:
        uses.update(step_inputs(step))
    uses.update(protected)
    diagonals = {step.out: step for step in steps if isinstance(step, Diagonal) and step.base is None}
    if not diagonals:
        return steps, register_count
    replaced: dict[int, list[Step]] = {}
    removed: set[int] = set()
    producers = {step.out: step for step in steps if isinstance(step, Elementwise)}
    ones = {step.out for step in steps if isinstance(step, Ones)}
    # contractions of two or more arrays: each makes a new array (one operand alone may be einsum's view of it)
    products = {step.out for step in steps if isinstance(step, Contract) and len(step.args) > 1}
    rewritten: set[int] = set()
    for k, step in enumerate(steps):
        if not isinstance(step, Elementwise):
            continue
        rank = len(step.labels)

        def candidate(node: Arg, statement: int = step.statement, rank: int = rank) -> tuple[int, ...] | None:
            """The axes taking the delta term ``node`` to the sum's order, when it qualifies."""
            found = diagonals.get(node.register)
            if found is None or found.statement != statement or uses[node.register] != 1:
                return None
            if len(found.output) != rank:
                return None
            axes = tuple(range(rank)) if node.axes is None else node.axes
            if None in axes or sorted(axes) != list(range(rank)):  # type: ignore[type-var]
                return None
            return axes  # type: ignore[return-value]

        rest, terms = _strip(step.expr, 1, candidate)
        made = rest.register if isinstance(rest, Arg) and rest.axes is None and rest.register in products and \
            uses[rest.register] == 1 else None  # ``X[i,d] X[j,d] + s delta[i,j]``: into the product's own array
        if not terms or rest is None or not _computed(rest) and made is None:
            continue  # no delta term; or nothing computed for the others: no array of the sum's own to add into
        chain: list[Step] = []
        if made is None:
            base = register_count
            register_count += 1
            chain.append(Elementwise(step.statement, base, rest, step.labels, step.sizes))
            ranks[base] = rank
        else:
            base = made
        for number, (register, axes, coefficient) in enumerate(terms):
            term = diagonals[register]
            out = step.out if number == len(terms) - 1 else register_count
            if out != step.out:
                register_count += 1
                ranks[out] = rank
            value = producers.get(term.arg)
            labels = term.labels
            if value is not None and value.statement == step.statement and uses[term.arg] == 1 \
                    and value.out not in rewritten and value.labels == term.labels:
                value = _without_ones(value, ones, ranks)
                labels = value.labels
                chain.append(value)  # computed when it is added: not alive while the others are computed
                removed.add(term.arg)
            chain.append(replace(term, statement=step.statement, out=out, output=tuple(term.output[a] for a in axes),
                                 labels=labels, sizes=step.sizes, base=base,
                                 coefficient=_weak(exact_mul(term.coefficient, coefficient))))
            base = out
            removed.add(register)
        replaced[k] = chain
        rewritten.add(step.out)
    flat: list[Step] = []
    for k, step in enumerate(steps):
        if isinstance(step, (Diagonal, Elementwise)) and step.out in removed and k not in replaced:
            continue
        flat.extend(replaced.get(k, [step]))
    read = {register for step in flat for register in step_inputs(step)} | set(protected)
    # a delta's ones that only gave a diagonal term its shape are read no more
    return [step for step in flat if not (isinstance(step, Ones) and step.out not in read)], register_count


def _computed(node: Node | None) -> bool:
    """Whether evaluating ``node`` makes a new array (not an alias of a register, which must not be written)."""
    return isinstance(node, (Add, Apply, Pow)) or isinstance(node, Mul) and len(node.factors) > 1


def _strip(node: Node, coefficient: int | float, candidate) -> tuple[Node | None, list[_Found]]:  # noqa: ANN001
    """``node`` without its delta terms that enter it linearly (None when nothing else is left), and those terms
    with the numbers they are multiplied by."""
    if isinstance(node, Arg):
        axes = candidate(node)
        return (node, []) if axes is None else (None, [(node.register, axes, coefficient)])
    if isinstance(node, Add):
        kept: list[Node] = []
        found: list[_Found] = []
        for term in node.terms:
            rest, more = _strip(term, coefficient, candidate)
            found.extend(more)
            if rest is not None:
                kept.append(rest)
        if not found:
            return node, []
        return (None if not kept else kept[0] if len(kept) == 1 else Add(tuple(kept))), found
    if isinstance(node, Mul):
        others = [position for position, factor in enumerate(node.factors) if not isinstance(factor, Number)]
        if len(others) != 1:
            return node, []
        scale = coefficient
        for factor in node.factors:
            if isinstance(factor, Number):
                scale = exact_mul(scale, factor.value)
        inner, found = _strip(node.factors[others[0]], scale, candidate)
        if not found:
            return node, []
        if inner is None:
            return None, found
        if isinstance(inner, Mul):  # a sum left with one product: one product (``(a b -2) 2`` is ``a b -4``)
            outer = [factor.value for factor in node.factors if isinstance(factor, Number)]
            inner_numbers = [factor for factor in inner.factors if isinstance(factor, Number)]
            if len(inner_numbers) == 1 and all(isinstance(value, int) for value in outer):
                scale = inner_numbers[0].value
                for value in outer:
                    scale = exact_mul(scale, value)
                return Mul(tuple(Number(_weak(scale)) if factor is inner_numbers[0] else factor
                                 for factor in inner.factors)), found
        return Mul(tuple(inner if position == others[0] else factor for position, factor in enumerate(node.factors))), \
            found
    return node, []


def _without_ones(step: Elementwise, ones: set[int], ranks: dict[int, int]) -> Elementwise:
    """A delta term's value without its factors of ones (``t[p,r] 1[q]``: a delta index nothing else carries), which
    only repeat it along an axis: the diagonal step broadcasts the value along the axes it lacks instead."""
    if not isinstance(step.expr, Mul):
        return step
    rank = len(step.labels)
    repeats = [factor for factor in step.expr.factors if isinstance(factor, Arg) and factor.register in ones]
    kept = [factor for factor in step.expr.factors if not (isinstance(factor, Arg) and factor.register in ones)]
    if not repeats or all(isinstance(factor, Number) for factor in kept):
        return step  # deltas alone: the ones give the value its shape
    carried = set().union(*(_covered(factor, rank, ranks) for factor in kept))
    dropped = set().union(*(_covered(factor, rank, ranks) for factor in repeats)) - carried
    if not dropped:
        return step
    keep = tuple(position for position in range(rank) if position not in dropped)
    kept = [realign(factor, keep, ranks) for factor in kept]
    ranks[step.out] = len(keep)
    return replace(step, expr=kept[0] if len(kept) == 1 else Mul(tuple(kept)),
                   labels=tuple(step.labels[k] for k in keep), sizes=tuple(step.sizes[k] for k in keep))


def _covered(node: Node, rank: int, ranks: dict[int, int]) -> set[int]:
    """The positions of an expression's result (of ``rank`` axes) that it varies along."""
    if isinstance(node, Arg):
        if node.axes is None:
            return set(range(rank)) if ranks.get(node.register, 0) else set()
        return {position for position, axis in enumerate(node.axes) if axis is not None}
    if isinstance(node, (Number, Size)):
        return set()
    if isinstance(node, Apply):
        children: tuple[Node, ...] = (node.arg,) if node.other is None else (node.arg, node.other)
    elif isinstance(node, AsFloat):
        children = (node.arg,)
    elif isinstance(node, Pow):
        children = (node.base,)
    else:
        children = node.terms if isinstance(node, Add) else node.factors
    return set().union(*(_covered(child, rank, ranks) for child in children))
