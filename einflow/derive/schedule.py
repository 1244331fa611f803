"""A forward sweep's program with the forward pass computed on demand: each forward value right before the
first statement of the sweep that needs it.

A forward sweep (the Laplacian's, einflow.derive.taylor) appends its tangent and Laplacian statements after the
whole forward pass, so every forward value of every layer is alive at once until the sweep reaches it: on
folx's README network (ten silu layers over 2000 nodes) 40 arrays of 1.6 MB, made anew on each call (about
15,000 page faults a call). :func:`on_demand` keeps the sweep's statements in their order and computes each
forward statement just before the first sweep statement that needs it (after the forward statements it needs
in turn), so a layer's forward values are computed next to that layer's tangents and freed with them: the
forward pass and the sweep interleave layer by layer, as a forward Laplacian runs.

Only the order changes, never a statement; a size declaration stays right before the sweep statement that
followed it. The program is left as it is when it assigns a name twice, when a
size declaration names an index that a forward statement uses (moving the statement past it would change
what sizes it), or when the new order would read a value before it is computed.
"""

from __future__ import annotations

from collections.abc import Collection

from einflow.derive.normal import stem_of
from einflow.lang import ir
from einflow.lang.check import Checked, checked
from einflow.lang.indices import indices_in

__all__ = ["on_demand"]


def _reads(statement: ir.Statement) -> set[str]:
    """The names a statement reads: tensors (plain, shifted or gathered reads), a declaration's source."""
    if isinstance(statement, ir.Assign):
        return {node.name for node in ir.walk(statement.expr) if isinstance(node, (ir.Tensor, ir.Read))}
    if isinstance(statement, ir.SizeDecl):
        return {statement.source} if isinstance(statement.source, str) else set()
    if isinstance(statement, ir.Return):
        return set(statement.names)
    return set()


def _indices(statement: ir.Assign) -> set[str]:
    """A statement's indices and their stems (a size declaration of ``k`` sizes ``k_2`` too)."""
    names = set(statement.indices or ()) | set(indices_in(statement.expr))
    return names | {stem_of(name) for name in names}


def on_demand(program: Checked, forward: Collection[str]) -> Checked:
    """``program`` with the statements assigning the names in ``forward`` computed when first needed: the
    other statements keep their order, each preceded by the forward statements it needs and not yet computed
    (those in their own order, each after the ones it needs)."""
    statements = program.ir.statements
    targets = [s.target for s in statements if isinstance(s, ir.Assign) and s.target is not None]
    if len(set(targets)) != len(targets):
        return program
    position = {s.target: k for k, s in enumerate(statements) if isinstance(s, ir.Assign) and s.target in forward}
    declared = {name for s in statements if isinstance(s, ir.SizeDecl) for name in s.names}
    if any(_indices(statements[k]) & declared for k in position.values()):  # type: ignore[arg-type]
        return program
    order: list[int] = []
    done: set[int] = set()

    def needs(k: int) -> list[int]:
        return sorted(position[name] for name in _reads(statements[k]) if name in position)

    def emit(k: int, itself: bool = True) -> None:
        """The forward statements ``k`` needs and not yet computed, each after the ones it needs in turn (depth
        first, without recursion: a deep network's chain is long), then ``k`` itself."""
        stack = [(k, needs(k))]
        while stack:
            top, pending = stack[-1]
            while pending and pending[0] in done:
                pending.pop(0)
            if pending:
                first = pending.pop(0)
                done.add(first)
                stack.append((first, needs(first)))
                continue
            stack.pop()
            if top != k or itself:
                order.append(top)

    # a size declaration waits for the next statement of the sweep (after the forward statements that one
    # needs): it stays next to the statement it sizes
    declarations: list[int] = []
    for k, statement in enumerate(statements):
        if isinstance(statement, ir.Assign) and statement.target in position:
            continue
        done.add(k)
        if isinstance(statement, ir.SizeDecl):
            declarations.append(k)
            continue
        emit(k, itself=False)
        for declaration in declarations:
            emit(declaration)
        declarations.clear()
        order.append(k)
    for declaration in declarations:
        emit(declaration)
    if len(order) != len(statements) or order == list(range(len(statements))):
        return program  # a forward statement nothing reads (or nothing moved)
    computed: set[str] = set()
    assigned = set(targets)
    for k in order:  # every value computed before it is read (the sweep's statements too)
        statement = statements[k]
        if _reads(statement) & (assigned - computed):
            return program
        if isinstance(statement, ir.Assign) and statement.target is not None:
            computed.add(statement.target)
    return checked(ir.ProgramIR(tuple(statements[k] for k in order)))
