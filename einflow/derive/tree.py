"""Shared adjoints: a product with many varying factors is split along a pairwise contraction tree.

The gradient of ``sum[a,b,...](A1[a,b] A2[b,c] ... AN[z,a])`` by every factor is, taken factor by
factor, N products of N-1 factors: N times the forward work. Reverse-mode AD does it in about three
times the forward work by keeping the forward's partial products and contracting the adjoint of each
node of the contraction tree with its sibling's partial product. Here that happens by rewriting the
product statement *before* the reverse sweep into one statement per node of its pairwise tree::

    L = sum[a,b,c,d](A[a,b] B[b,c] C[c,d] D[d,a])
    # becomes
    t1[a,c] = A[a,b] B[b,c]
    t2[c,a] = C[c,d] D[d,a]
    L = t1[a,c] t2[c,a]

The ordinary reverse sweep over these statements then writes the adjoints ``dL_dt1``, ``dL_dt2`` as
named statements, and every factor's gradient reads them: the environments are shared. Statements are
kept in bound normal form (every new index is fresh and tied to the index it copies, I1 and I3).

The tree is chosen when the program is derived, before sizes are known: sizes declared with a number
are used, every other index is taken to be of one common size (:data:`GUESSED_SIZE`). ``dp`` (optimal over
connected sub-networks) is used up to :data:`DP_LIMIT` factors. Beyond, the tree is searched as the
engine searches a large product's path (einflow.lang.trees.searched: cotengra's seeded hyper-optimiser
and exact subtree re-solving, no clock), so that the split statements are the forward's planned path when
the sizes are those guessed, and the gradient costs three forwards less the root's share; without
cotengra, opt_einsum's seeded random-greedy (:data:`GREEDY_TRIALS` trials) and one pass of re-solving.
The same program gets the same tree on any machine. Unknown sizes count as :data:`SEARCH_GUESS` there.
opt_einsum's plain ``greedy`` tree, the earlier choice, made intermediates of 8 bond-4 indices on a 6x6
grid where the forward's path keeps 6, and its gradient cost 41 forwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import opt_einsum as oe

from einflow.derive.normal import Fresh
from einflow.derive.shifts import PSEUDO
from einflow.derive.sizes import active
from einflow.lang import ir
from einflow.lang.trees import refine, searched

__all__ = ["split_products", "MIN_SHARED"]

#: a product is split once at least this many of its factors vary (with two, the factor-by-factor
#: adjoints cost about what the tree's do)
MIN_SHARED = 3
#: the size assumed for an index whose size is not a declared number (by dynamic programming, and by the
#: search beyond DP_LIMIT factors: a tree cheap at bond 2 does few operations and keeps intermediates narrow,
#: and stays cheap at larger bonds; one searched at 16 cost 1.03x the forward's path on a 6x6 grid of bond 4
#: and 4x on a 200-node random 3-regular graph of bond 2, one searched at 2 1.003x and 1.27x)
GUESSED_SIZE = 16
SEARCH_GUESS = 2
#: up to this many factors the tree is chosen by dynamic programming, beyond by a search
DP_LIMIT = 16
#: the search beyond DP_LIMIT factors without cotengra: opt_einsum's random-greedy trials
GREEDY_TRIALS = 64


@dataclass(frozen=True)
class _Node:
    """A node of the pairwise tree: a factor (``leaf`` >= 0) or the product of two nodes."""

    indices: tuple[str, ...]  # the node's kept indices (normal-form names of the statement)
    leaf: int = -1
    children: tuple[_Node, _Node] | None = None


def _parts(expr: ir.Expr) -> tuple[tuple[str, ...], list[ir.Num], list[ir.Tensor]] | None:
    """(summed indices, numbers, tensors) of ``sum[...](n T1 T2 ...)`` or ``n T1 T2 ...``; else None."""
    summed: tuple[str, ...] = ()
    if isinstance(expr, ir.Reduce):
        if expr.kind != "sum":
            return None
        summed, expr = expr.indices, expr.body
    if not isinstance(expr, ir.Product):
        return None
    numbers = [f for f in expr.factors if isinstance(f, ir.Num)]
    tensors = [f for f in expr.factors if isinstance(f, ir.Tensor)]
    if len(numbers) + len(tensors) != len(expr.factors):
        return None
    return summed, numbers, tensors


def _splittable(statement: ir.Assign, varying: set[str]) -> tuple[tuple[str, ...], list[ir.Num],
                                                                   list[ir.Tensor]] | None:
    parts = _parts(statement.expr)
    if parts is None:
        return None
    summed, numbers, tensors = parts
    if len(tensors) < 3 or sum(t.name in varying for t in tensors) < MIN_SHARED:
        return None
    if any(t.name.startswith(PSEUDO) for t in tensors):
        return None  # a read through positions stays whole (its deltas give its indices their ranges)
    output = set(statement.indices or ())
    seen: dict[str, int] = {}
    for tensor in tensors:
        if len(set(tensor.indices)) != len(tensor.indices):
            return None  # a diagonal read: left to the factor-by-factor rule
        for index in tensor.indices:
            seen[index] = seen.get(index, 0) + 1
    if not output <= seen.keys() or set(summed) | output != seen.keys():
        return None
    if any(count == 1 and index not in output for index, count in seen.items()):
        return None  # an index summed within one factor alone
    return summed, numbers, tensors


def _size_guess(index: str, guess: int) -> int:
    sizes = active()
    if sizes is not None:
        for source in sizes.sources(index):
            if isinstance(source, int):
                return source
    return guess


def _search(equation: str, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """A pairwise path for a product of more than DP_LIMIT factors, found as the engine finds a large product's
    path (einflow/engine/paths.py): the cheapest of greedy's path and einflow.lang.trees.searched's candidates,
    or, without cotengra, random-greedy's path refined."""
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    sizes = {letter: size for term, shape in zip(terms, shapes) for letter, size in zip(term, shape)}
    path, info = oe.contract_path(equation, *shapes, shapes=True, optimize="greedy")
    found = searched(terms, output, sizes, list(path), "greedy")
    if found is not None:
        return min([(int(info.opt_cost), 0, list(path), "greedy"), *found])[2]
    search = oe.RandomGreedy(max_repeats=GREEDY_TRIALS, minimize="flops")  # seeded by trial number
    path = list(search([set(term) for term in terms], set(output), sizes))
    return refine([set(term) for term in terms], set(output), sizes, path, deadline=0.0)


def _tree(tensors: list[ir.Tensor], output: tuple[str, ...]) -> _Node:
    """The pairwise contraction tree of ``tensors`` (kept indices per node) chosen by opt_einsum."""
    letters: dict[str, str] = {}
    for tensor in tensors:
        for index in tensor.indices:
            letters.setdefault(index, oe.get_symbol(len(letters)))
    equation = ",".join("".join(letters[i] for i in t.indices) for t in tensors)
    equation += "->" + "".join(letters[i] for i in output)
    many = len(tensors) > DP_LIMIT
    shapes = [tuple(_size_guess(i, SEARCH_GUESS if many else GUESSED_SIZE) for i in t.indices) for t in tensors]
    optimize = _search(equation, shapes) if many else "dp"
    path, _ = oe.contract_path(equation, *shapes, shapes=True, optimize=optimize)
    nodes: list[tuple[_Node, set[int]]] = [(_Node(t.indices, leaf=k), {k}) for k, t in enumerate(tensors)]
    for step in path:
        picked = [nodes[k] for k in step]
        for k in sorted(step, reverse=True):
            del nodes[k]
        while len(picked) > 1:  # a step joining more than two operands is split into pairs
            (first, first_leaves), (second, second_leaves) = picked[0], picked[1]
            leaves = first_leaves | second_leaves
            inside = {i for k in leaves for i in tensors[k].indices}
            outside = {i for k, t in enumerate(tensors) if k not in leaves for i in t.indices} | set(output)
            ordered = dict.fromkeys(first.indices + second.indices)
            kept = tuple(i for i in ordered if i in inside and i in outside)
            picked = [(_Node(kept, children=(first, second)), leaves), *picked[2:]]
        nodes.append(picked[0])
    assert len(nodes) == 1
    return nodes[0][0]


def _split(statement: ir.Assign, tensors: list[ir.Tensor], numbers: list[ir.Num], index_fresh: Fresh,
           tensor_fresh: Fresh, ranks: dict[str, int]) -> list[ir.Assign]:
    """One statement per internal node of the tree; the last one is ``statement``'s target."""
    root = _tree(tensors, statement.indices or ())
    statements: list[ir.Assign] = []

    def reference(node: _Node, names: dict[str, str]) -> ir.Tensor:
        """``node``'s value read in a statement whose index names are ``names`` (old -> new)."""
        if node.leaf >= 0:
            tensor = tensors[node.leaf]
            return ir.Tensor(tensor.name, tuple(names[i] for i in tensor.indices))
        return ir.Tensor(made[id(node)], tuple(names[i] for i in node.indices))

    made: dict[int, str] = {}

    def emit(node: _Node) -> None:
        assert node.children is not None
        for child in node.children:
            if child.children is not None:
                emit(child)
        first, second = node.children
        involved = dict.fromkeys(first.indices + second.indices)
        summed = tuple(i for i in involved if i not in node.indices)
        if node is root:
            names = {i: i for i in involved}  # the statement's own binders: unique already
            factors: list[ir.Expr] = [*numbers, reference(first, names), reference(second, names)]
            body = ir.product(*factors)
            statements.append(ir.Assign(statement.target, statement.indices,
                                        ir.Reduce(summed, body) if summed else body))
            return
        names = {i: index_fresh.index(i) for i in involved}
        name = tensor_fresh.pick([], "t")
        made[id(node)] = name
        ranks[name] = len(node.indices)
        body = ir.product(reference(first, names), reference(second, names))
        statements.append(ir.Assign(name, tuple(names[i] for i in node.indices),
                                    ir.Reduce(tuple(names[i] for i in summed), body) if summed else body))

    emit(root)
    return statements


def split_products(statements: list[ir.Assign], upto: int, varying: set[str], index_fresh: Fresh,
                   tensor_fresh: Fresh, ranks: dict[str, int], partials: set[str]) -> int:
    """Split, in place, the product statements among ``statements[:upto]`` with many varying factors.

    Returns how many statements were inserted (the split statement keeps its target, last); the new
    statements' targets are added to ``partials``.
    """
    inserted = 0
    position = 0
    while position < upto + inserted:
        statement = statements[position]
        parts = _splittable(statement, varying)
        if parts is None:
            position += 1
            continue
        _, numbers, tensors = parts
        pieces = _split(statement, tensors, numbers, index_fresh, tensor_fresh, ranks)
        statements[position:position + 1] = pieces
        partials.update(piece.target for piece in pieces[:-1] if piece.target is not None)
        inserted += len(pieces) - 1
        position += len(pieces)
    return inserted
