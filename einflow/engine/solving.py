"""Solves, not inverses, across statements (LANGUAGE.md 8.1): intermediates that carry ``inv`` are inlined into the
products that read them, so that each inverse meets its thin neighbours in one product and becomes a solve.

A derivative program names its intermediates: the gradient of the Gaussian-process likelihood is

    df_dK[r,u] = -0.5 y[i] y[j] inv[u,j](K[u,j]) inv[i,r](K[i,r]) + 0.5 inv[u,r](K[u,r])
    df_dX[p,q] = X[j,q] df_dK[p,j] + X[i,q] df_dK[i,p]

Computed statement by statement, ``df_dK`` is an n x n array holding the inverse (O(n^3)). Inlined and expanded,
``df_dX``'s terms are products such as ``X[j,q] inv[p,j](K[p,j])`` and ``X[j,q] y[i] y[k] inv[p,k](K) inv[i,j](K)``:
the lowering solves each inverse against its thinnest neighbour (``X``: d right-hand sides; ``y``: one), all from
one factorisation, and the rest are O(n^2 d) products. The same holds for Hessian-vector products, where the
low-rank ``hvp_K[i,j] = V[i,d] X[j,d] + X[i,d] V[j,d]`` is inlined next to the inverses it meets.

Only plain linear statements take part (sums of products of tensors, numbers and ``inv`` of a tensor), read only
as factors of plain products, never a program output, a declared matrix or the source of a ``size``
declaration; a program whose expansion would exceed :data:`MAX_TERMS` terms in a statement is left as it is.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from einflow.lang import ir
from einflow.lang.indices import indices_in

__all__ = ["Inlining", "MAX_TERMS", "inline_inverses"]

#: the most product terms a statement may expand to (beyond it, the program is computed statement by statement)
MAX_TERMS = 64


@dataclass(frozen=True)
class Inlining:
    """The statements computed inside their readers (``skipped``, by number) and the readers' expanded
    expressions (``rewritten``, by statement number)."""

    skipped: frozenset[int] = frozenset()
    rewritten: tuple[tuple[int, ir.Expr], ...] = ()


def _plain(expr: ir.Expr) -> bool:
    """A sum of products of numbers, tensors (distinct indices) and unbatched ``inv`` of a tensor."""
    if isinstance(expr, ir.Num):
        return True
    if isinstance(expr, ir.Tensor):
        return len(set(expr.indices)) == len(expr.indices)
    if isinstance(expr, ir.Linalg):
        body = expr.body
        return expr.kind == "inv" and isinstance(body, ir.Tensor) and len(body.indices) == 2 and \
            set(body.indices) == set(expr.indices) and expr.indices[0] != expr.indices[1]
    if isinstance(expr, (ir.Product, ir.Sum)):
        return all(_plain(child) for child in ir.children(expr))
    return False


def _terms(expr: ir.Expr) -> tuple[ir.Expr, ...]:
    return expr.terms if isinstance(expr, ir.Sum) else (expr,)


def _reads(expr: ir.Expr) -> set[str]:
    """The tensors ``expr`` reads: plainly, at shifted or gathered positions, or as gather positions (a tensor read
    other than as a plain factor stays a statement of its own)."""
    found = {node.name for node in ir.walk(expr) if isinstance(node, (ir.Tensor, ir.Read))}
    found.update(g.name for node in ir.walk(expr) if isinstance(node, (ir.Read, ir.ShiftDelta)) for g in node.gathers)
    return found


def _has_inverse(expr: ir.Expr, inlined: set[str]) -> bool:
    return any(isinstance(node, ir.Linalg) or isinstance(node, ir.Tensor) and node.name in inlined
               for node in ir.walk(expr))


def _rename(expr: ir.Expr, mapping: dict[str, str]) -> ir.Expr:
    if isinstance(expr, ir.Tensor):
        return ir.Tensor(expr.name, tuple(mapping.get(index, index) for index in expr.indices))
    if isinstance(expr, ir.Linalg):
        first, second = (mapping.get(index, index) for index in expr.indices)
        return ir.Linalg(expr.kind, (first, second), _rename(expr.body, mapping))
    return ir.with_children(expr, tuple(_rename(child, mapping) for child in ir.children(expr)))


Term = tuple[int | float, tuple[ir.Expr, ...]]


def _expand(expr: ir.Expr, definitions: dict[str, ir.Assign], fresh: itertools.count) -> list[Term]:
    """``expr`` as a sum of products (coefficient, factors), the ``definitions`` substituted with their summed
    indices renamed apart (names the language cannot write)."""
    if isinstance(expr, ir.Num):
        return [(expr.value, ())]
    if isinstance(expr, ir.Tensor) and expr.name in definitions:
        definition = definitions[expr.name]
        assert definition.indices is not None
        mapping = dict(zip(definition.indices, expr.indices))
        for index in sorted(indices_in(definition.expr) - set(definition.indices)):
            mapping[index] = f"{index}#{next(fresh)}"
        return _expand(_rename(definition.expr, mapping), definitions, fresh)
    if isinstance(expr, ir.Sum):
        return [term for child in expr.terms for term in _expand(child, definitions, fresh)]
    if isinstance(expr, ir.Product):
        terms: list[Term] = [(1, ())]
        for factor in expr.factors:
            parts = _expand(factor, definitions, fresh)
            terms = [(left * right, (*mine, *theirs)) for left, mine in terms for right, theirs in parts]
            if len(terms) > MAX_TERMS:
                raise OverflowError
        return terms
    return [(1, (expr,))]


def _build(terms: list[Term]) -> ir.Expr:
    built = []
    for coefficient, factors in terms:
        if coefficient == 0:
            continue
        parts = factors if coefficient == 1 and factors else (ir.Num(coefficient), *factors)
        built.append(ir.product(*parts))
    if not built:
        return ir.Num(0)
    return built[0] if len(built) == 1 else ir.Sum(tuple(built))


def inline_inverses(program: ir.ProgramIR, outputs: frozenset[str]) -> Inlining:
    """Which statements to inline into their readers so that inverses become solves, and the readers rewritten.

    ``outputs``: the names the program returns (never inlined).
    """
    statements = program.statements
    if not any(isinstance(node, ir.Linalg) and node.kind == "inv" for statement in statements
               if isinstance(statement, ir.Assign) for node in ir.walk(statement.expr)):
        return Inlining()
    assigned: dict[str, list[int]] = {}
    readers: dict[str, list[int]] = {}
    fixed = set(outputs)
    for number, statement in enumerate(statements):
        if isinstance(statement, ir.Assign):
            if statement.target is not None:
                assigned.setdefault(statement.target, []).append(number)
            for name in _reads(statement.expr):
                readers.setdefault(name, []).append(number)
        elif isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str):
            fixed.add(statement.source)
        elif isinstance(statement, (ir.MatrixDecl, ir.PadDecl)):
            fixed.update(statement.names)
    explicit = {number for number, statement in enumerate(statements) if isinstance(statement, ir.Assign)
                and statement.indices is not None and _plain(statement.expr)}

    def candidate(name: str) -> bool:
        numbers = assigned.get(name, [])
        if name in fixed or len(numbers) != 1 or numbers[0] not in explicit:
            return False
        indices = tuple(statements[numbers[0]].indices or ())  # type: ignore[union-attr]
        if len(set(indices)) != len(indices) or not readers.get(name):
            return False
        # read only as a tensor factor of plain statements after it (never inside an inverse)
        return all(number > numbers[0] and number in explicit and not any(
            isinstance(node, ir.Linalg) and name in _reads(node.body)
            for node in ir.walk(statements[number].expr)) for number in readers[name])  # type: ignore[union-attr]

    names = [name for name in assigned if candidate(name)]
    inlined: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in names:
            if name in inlined:
                continue
            definition = statements[assigned[name][0]]
            assert isinstance(definition, ir.Assign)
            touches = _has_inverse(definition.expr, inlined) or any(
                statements[number].target in inlined or any(  # type: ignore[union-attr,operator]
                    name in _reads(term) and _has_inverse(term, inlined)
                    for term in _terms(statements[number].expr))  # type: ignore[union-attr]
                for number in readers[name])
            if touches:
                inlined.add(name)
                changed = True
    if not inlined:
        return Inlining()
    definitions = {name: statements[assigned[name][0]] for name in inlined}
    skipped = frozenset(assigned[name][0] for name in inlined)
    fresh = itertools.count()
    rewritten = []
    for number, statement in enumerate(statements):
        if number in skipped or not isinstance(statement, ir.Assign) or not _reads(statement.expr) & inlined:
            continue
        try:
            terms = _expand(statement.expr, definitions, fresh)  # type: ignore[arg-type]
        except OverflowError:
            return Inlining()
        if len(terms) > MAX_TERMS:
            return Inlining()
        rewritten.append((number, _build(terms)))
    return Inlining(skipped, tuple(rewritten))
