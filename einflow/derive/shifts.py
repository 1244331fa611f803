"""Derivatives through shifted, strided, constant and gathered reads (LANGUAGE.md 8.2).

A read through positions is a plain read times deltas of positions: ``x[h+r]`` is ``x[q] delta[q, h+r]``
summed over ``q``. Before a derivation each such delta is written as a constant tensor of its own
(``_shift1[q,h,r]``), so every rule, the simplifier and the sweeps see only plain tensors; the deltas
come back afterwards. The adjoint of a shifted read is then a scatter-add (``delta[p, h+r]`` kept, read
through where its index is summed), the tangent is a shifted read of the tangent, and second
derivatives follow, since a derivative program's deltas are written the same way before the next one.
A plain read of an index that a shifted read sizes (``x[i]`` beside ``x[i+1]``) is a shifted read by 0:
its range is the shifted one's, not its axis.

>>> from einflow.lang.check import checked
>>> from einflow.lang.grammar import parse
>>> program, table = disguise(checked(parse("y[h] = x[h+r] K[r]")))
>>> print(program.ir)
size q1 = x
y[h] = x[q1] _shift1[q1,h,r] K[r]
>>> print(ir.format_program(reveal(program.ir, table)))
size q1 = x
y[h] = x[q1] delta[q1, h + r] K[r]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from einflow.lang import ir
from einflow.lang.check import Checked, checked
from einflow.lang.errors import DerivativeError
from einflow.lang.indices import indices_in
from einflow.lang.positions import compose, read_through

__all__ = ["PSEUDO", "has_shifts", "disguise", "reveal", "gather_tensors", "with_shifts"]


#: the names of the pseudo tensors standing for deltas of positions during a derivation start with this
PSEUDO = "_shift"


def _nodes(program: ir.ProgramIR) -> list[ir.Expr]:
    return [node for statement in program.statements if isinstance(statement, ir.Assign)
            for node in ir.walk(statement.expr)]


def has_shifts(program: ir.ProgramIR) -> bool:
    """Whether the program reads through positions or has deltas of positions."""
    return any(isinstance(node, (ir.Read, ir.ShiftDelta)) for node in _nodes(program))


def gather_tensors(program: ir.ProgramIR) -> set[str]:
    """The integer tensors the program gathers through (they cannot be differentiated)."""
    return {gather.name for node in _nodes(program) if isinstance(node, (ir.Read, ir.ShiftDelta))
            for gather in node.gathers}


class _Table:
    """Pseudo tensor name -> (the delta's index, its position); fresh names for the pseudo tensors and indices."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)
        self.deltas: dict[str, tuple[str, ir.Affine | ir.Gather]] = {}
        #: pseudo tensor -> (tensor, axis) whose length its first axis has (a read's), where known
        self.lengths: dict[str, tuple[str, int]] = {}
        #: pseudo tensor -> the number of the statement whose read it stands for
        self.origins: dict[str, int] = {}
        #: index -> the program's ``size`` declaration of it (a padded read's range)
        self.declared: dict[str, ir.SizeDecl] = {}
        #: the disguised program's own statements and inputs (a pseudo tensor's origin is a position here)
        self.statements: tuple[ir.Statement, ...] = ()
        self.inputs: tuple[str, ...] = ()

    def fresh(self, stem: str) -> str:
        number = 1
        while f"{stem}{number}" in self.taken:
            number += 1
        self.taken.add(f"{stem}{number}")
        return f"{stem}{number}"

    def tensor(self, index: str, position: ir.Affine | ir.Gather) -> ir.Tensor:
        name = self.fresh(PSEUDO)
        self.deltas[name] = (index, position)
        return ir.Tensor(name, tuple(dict.fromkeys((index, *position.indices))))


def _names(program: ir.ProgramIR) -> set[str]:
    found: set[str] = set()
    for statement in program.statements:
        if isinstance(statement, ir.SizeDecl):
            found |= set(statement.names)
            continue
        if isinstance(statement, (ir.Return, ir.MatrixDecl)):
            found |= set(statement.names)
            continue
        found |= {statement.target or ""} | set(statement.indices or ())
        for node in ir.walk(statement.expr):
            if isinstance(node, (ir.Tensor, ir.Read)):
                found |= {node.name, *node.indices}
            elif isinstance(node, (ir.Reduce, ir.Normalize)):
                found |= set(node.indices)
            elif isinstance(node, ir.Delta):
                found |= {node.first, node.second}
            elif isinstance(node, ir.ShiftDelta):
                found |= set(node.indices)
            if isinstance(node, (ir.Read, ir.ShiftDelta)):
                found |= {gather.name for gather in node.gathers}
    return found


def _disguised(expr: ir.Expr, table: _Table, shifted: frozenset[str], indices: set[str],
               sizes: list[ir.SizeDecl], ranks: dict[str, int], inputs: tuple[str, ...] = ()) -> ir.Expr:
    if isinstance(expr, ir.ShiftDelta):
        return table.tensor(expr.index, expr.position)
    read: ir.Read | None = None
    if isinstance(expr, ir.Read):
        read = expr
    elif isinstance(expr, ir.Tensor) and set(expr.indices) & shifted and len(set(expr.indices)) == len(expr.indices):
        read = ir.Read(expr.name, tuple(ir.Affine(((1, i),)) if i in shifted else i for i in expr.indices))
    if read is not None:
        plain: list[str] = []
        deltas: list[ir.Expr] = []
        for axis, position in enumerate(read.positions):
            if isinstance(position, str):
                plain.append(position)
                continue
            index = table.fresh("q")
            plain.append(index)
            deltas.append(table.tensor(index, position))
            table.lengths[deltas[-1].name] = (read.name, axis)  # type: ignore[union-attr]
            if read.name in inputs:  # the index runs over the whole axis, wherever a derivation moves it
                names = tuple(index if k == axis else table.fresh("_axis") for k in range(ranks[read.name]))
                sizes.append(ir.SizeDecl(names, read.name))
        return ir.Product((ir.Tensor(read.name, tuple(plain)), *deltas))
    if isinstance(expr, ir.Product):
        return ir.product(*(_disguised(factor, table, shifted, indices, sizes, ranks, inputs)
                            for factor in expr.factors))
    children = ir.children(expr)
    if not children:
        return expr
    return ir.with_children(expr, tuple(_disguised(child, table, shifted, indices, sizes, ranks, inputs)
                                        for child in children))


def _shifted(expr: ir.Expr) -> frozenset[str]:
    """The indices whose range a statement's shifted reads may shorten (those alone in a position, as ``i`` in
    ``x[i+1]``): a plain read of one of them reads that shorter range, so it is a shifted read by 0."""
    return frozenset(position.terms[0][1] for node in ir.walk(expr) if isinstance(node, ir.Read)
                     for position in node.positions if isinstance(position, ir.Affine) and len(position.terms) == 1)


def disguise(program: Checked) -> tuple[Checked, _Table]:
    """The program with every delta of a position (those of shifted reads too) as a pseudo tensor."""
    table = _Table(_names(program.ir))
    indices = set(table.taken)
    declared = {name for s in program.ir.statements if isinstance(s, ir.SizeDecl) for name in s.names}
    table.declared = {name: s for s in program.ir.statements if isinstance(s, ir.SizeDecl) for name in s.names}
    table.statements, table.inputs = program.ir.statements, program.info.inputs
    statements: list[ir.Statement] = []
    for number, statement in enumerate(program.ir.statements):
        if isinstance(statement, ir.Assign):
            shifted = _shifted(statement.expr) - declared
            before = set(table.deltas)
            sizes: list[ir.SizeDecl] = []
            statement = replace(statement, expr=_disguised(statement.expr, table, shifted, indices, sizes,
                                                           program.info.ranks, program.info.inputs))
            statements.extend(sizes)
            table.origins.update(dict.fromkeys(set(table.deltas) - before, number))
        statements.append(statement)
    return checked(ir.ProgramIR(tuple(statements))), table


def _revealed(expr: ir.Expr, table: _Table, lengths: dict[str, tuple[str, int]] | None = None,
              renamed_from: dict[str, str] | None = None) -> ir.Expr:
    if isinstance(expr, ir.Tensor) and expr.name in table.deltas:
        index, position = table.deltas[expr.name]
        original = tuple(dict.fromkeys((index, *position.indices)))
        mapping = dict(zip(original, expr.indices))
        if lengths is not None and expr.name in table.lengths:
            lengths[mapping[index]] = table.lengths[expr.name]
        if renamed_from is not None:
            renamed_from.update({mapping[i]: i for i in position.indices})
        found: ir.Position | None = position
        renamed = position
        if isinstance(position, ir.Gather):
            renamed = ir.Gather(position.name, tuple(mapping[i] for i in position.indices))
        else:  # rename through placeholders, so that a swap of two names is a swap
            holders = {i: f"#{k}" for k, i in enumerate(position.indices)}
            for old, holder in holders.items():
                found = compose(found, old, ir.Affine(((1, holder),)))  # type: ignore[arg-type]
            for old, holder in holders.items():
                found = compose(found, holder, ir.Affine(((1, mapping[old]),)))  # type: ignore[arg-type]
            renamed = found  # type: ignore[assignment]
        if isinstance(renamed, ir.Affine) and not renamed.terms:  # delta[p, 3]: an index fixed by a literal
            return ir.ShiftDelta(mapping[index], renamed)
        return ir.ShiftDelta(mapping[index], renamed)
    children = ir.children(expr)
    if not children:
        return expr
    rebuilt = ir.with_children(expr, tuple(_revealed(child, table, lengths, renamed_from) for child in children))
    return rebuilt


def _read_through(expr: ir.Expr, bound: frozenset[str]) -> ir.Expr:
    """Deltas of positions summed against a read become the read (``x[q] delta[q, h+r]`` -> ``x[h+r]``)."""
    from einflow.lang.contraction import product_output
    from einflow.lang.indices import product_operands

    if isinstance(expr, ir.Product) and any(isinstance(f, ir.ShiftDelta) for f in expr.factors):
        _, summed = product_output(product_operands(expr.factors, bound), bound, frozenset())
        factors, _ = read_through(expr.factors, frozenset(summed))
        factors = tuple(_read_through(f, bound) for f in factors)
        return ir.product(*factors)
    if isinstance(expr, ir.Reduce):
        return ir.Reduce(expr.indices, _read_through(expr.body, bound | frozenset(expr.indices)), expr.kind)
    children = ir.children(expr)
    if not children:
        return expr
    return ir.with_children(expr, tuple(_read_through(child, bound) for child in children))


def _sizing(expr: ir.Expr) -> set[str]:
    """The indices whose range a revealed expression fixes: those of tensors, reads and deltas of positions."""
    found: set[str] = set()
    for node in ir.walk(expr):
        if isinstance(node, (ir.Tensor, ir.Read)):
            found |= set(indices_in(node))
        elif isinstance(node, ir.ShiftDelta):
            found |= {node.index, *node.position.indices}
    return found


def _unsized(program: ir.ProgramIR, table: _Table) -> set[str]:
    """The indices some statement uses but whose range nothing in it fixes once the pseudo tensors are deltas
    again (a mean's count over a strided index, ``delta[r2,r2]``), and no ``size`` declaration but one from
    a pseudo tensor fixes: they need a declaration of their own."""
    declared = {name for s in program.statements if isinstance(s, ir.SizeDecl)
                and not (isinstance(s.source, str) and s.source in table.deltas) for name in s.names}
    unsized: set[str] = set()
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            expr = _revealed(statement.expr, table)
            used = set(indices_in(expr)) | set(statement.indices or ())
            unsized |= used - _sizing(expr) - declared
    return unsized


def _position_sizes(statement: ir.SizeDecl, table: _Table, tensor: str, axis: int, rank: int,
                    unsized: set[str], ranks: dict[str, int]) -> list[ir.Statement]:
    """For ``size z, r2 = _shift1`` where ``_shift1`` stands for ``delta[z, 2*r]`` of a read ``x[2*r]`` and
    ``r2`` has no other size: ``_range1[r2] = x[2*r2]`` and ``size r2 = _range1``, the range inferred as it was
    in the program (every read of ``r`` alone in a position in that statement, ``s[r]`` too, joins the
    product: the range is their intersection). Positions of two or more indices are left as they are."""
    source = str(statement.source)
    emitted: list[ir.Statement] = []
    name = statement.names[1] if len(statement.names) > 1 else None
    index = _alone(table.deltas[source][1])
    if index is None and isinstance(table.deltas[source][1], ir.Affine):
        return _joint_sizes(statement, table, tensor, axis, rank, unsized, ranks)
    if name is None or name not in unsized or index is None:
        return emitted
    position = table.deltas[source][1]
    if isinstance(position, ir.Gather):  # ``t[m]``: the gather tensor's axis is m's range
        names = tuple(name if i == index else table.fresh("_axis") for i in position.indices)
        unsized.discard(name)
        return [ir.SizeDecl(names, position.name)]
    if index in table.declared:  # a declared range (padded reads): the same declaration for the copy
        original = table.declared[index]
        names = tuple(name if n == index else table.fresh("_axis") for n in original.names)
        unsized.discard(name)
        return [ir.SizeDecl(names, original.source)]
    reads: list[ir.Expr] = []
    for pseudo, (_, position) in table.deltas.items():
        if table.origins.get(pseudo) != table.origins.get(source) or _alone(position) != index \
                or not isinstance(position, ir.Affine) \
                or pseudo not in table.lengths:
            continue
        coefficient, _ = position.terms[0]  # type: ignore[union-attr]
        read = ir.Affine(((coefficient, name),), position.offset)  # type: ignore[union-attr]
        read_tensor, read_axis = table.lengths[pseudo]
        read_rank = ranks.get(read_tensor, read_axis + 1) if pseudo != source else rank
        reads.append(ir.Read(read_tensor, tuple(read if k == read_axis else ir.Affine((), 0)
                                                for k in range(read_rank))))
    helper = table.fresh("_range")
    emitted.append(ir.Assign(helper, (name,), ir.product(*dict.fromkeys(reads))))
    emitted.append(ir.SizeDecl((name,), helper))
    unsized.discard(name)
    return emitted


def _joint_sizes(statement: ir.SizeDecl, table: _Table, tensor: str, axis: int, rank: int, unsized: set[str],
                 ranks: dict[str, int]) -> list[ir.Statement]:
    """For ``size z, h2, r2 = _shift1`` where ``_shift1`` stands for ``delta[z, h + r]`` of a read ``x[h + r]`` and
    ``h2`` (or ``r2``) has no other size: ``_range1[h2,r2] = x[h2 + r2] k[r2]`` and ``size h2, _axis1 = _range1``:
    the read with the position's indices renamed, times the reads of its statement's inputs that size the
    position's indices on their own (``k[r]``), so the ranges are inferred as they were in the program."""
    index, position = table.deltas[str(statement.source)]
    mapping = dict(zip(dict.fromkeys((index, *position.indices)), statement.names))
    names = [mapping.get(i, i) for i in position.indices]
    if not set(names) & unsized or len(set(names)) != len(names) or not isinstance(position, ir.Affine):
        return []
    zero = ir.Affine((), 0)
    renamed = ir.Affine(tuple((c, mapping[i]) for c, i in position.terms), position.offset)
    reads: list[ir.Expr] = [ir.Read(tensor, tuple(renamed if k == axis else zero for k in range(rank)))]
    origin = table.statements[table.origins[str(statement.source)]]
    for node in ir.walk(origin.expr) if isinstance(origin, ir.Assign) else ():
        if isinstance(node, ir.Tensor) and node.name in table.inputs and node.name in ranks:
            for k, i in enumerate(node.indices):
                if i in position.indices:
                    reads.append(ir.Read(node.name, tuple(mapping[i] if m == k else zero
                                                          for m in range(ranks[node.name]))))
    helper = table.fresh("_range")
    declared = tuple(n if n in unsized else table.fresh("_axis") for n in names)
    unsized.difference_update(names)
    return [ir.Assign(helper, tuple(names), ir.product(*dict.fromkeys(reads))), ir.SizeDecl(declared, helper)]


def _alone(position: ir.Affine | ir.Gather) -> str | None:
    """The index of a position with one index (``2*r + 1``, ``t[m]``), else None."""
    if isinstance(position, ir.Affine) and len(position.terms) == 1:
        return position.terms[0][1]
    if isinstance(position, ir.Gather) and len(position.indices) == 1:
        return position.indices[0]
    return None


def reveal(program: ir.ProgramIR, table: _Table, forward: frozenset[str] = frozenset(),
           ranks: dict[str, int] | None = None) -> ir.ProgramIR:
    """The pseudo tensors back as deltas of positions; in the statements computing ``forward`` targets
    (the program's own values), deltas summed against reads are read through, as they were written."""
    ranks = ranks or {}
    statements: list[ir.Statement] = []
    declared: set[str] = set()
    unsized = _unsized(program, table)
    assigned: set[str] = set()
    pending: dict[str, list[ir.Statement]] = {}
    for statement in program.statements:
        if isinstance(statement, ir.SizeDecl):
            declared |= set(statement.names)
        if isinstance(statement, ir.Assign):
            lengths: dict[str, tuple[str, int]] = {}
            renamed_from: dict[str, str] = {}
            expr = _revealed(statement.expr, table, lengths, renamed_from)
            sized = declared | {index for node in ir.walk(expr) if isinstance(node, ir.Tensor)
                                for index in node.indices}
            for index, original in renamed_from.items():  # a copy of a declared (padded) index: its declaration
                if index not in declared and original != index and original in table.declared:
                    source = table.declared[original]
                    statements.append(ir.SizeDecl(tuple(index if n == original else table.fresh("_axis")
                                                        for n in source.names), source.source))
                    declared.add(index)
                    sized.add(index)
            for index, (tensor, axis) in lengths.items():
                if tensor in forward and tensor not in assigned:  # its own statement, or a later one's: no size yet
                    continue
                if index not in sized and tensor in ranks:  # a scattered index that a pseudo tensor sized
                    names = tuple(index if k == axis else table.fresh("_axis") for k in range(ranks[tensor]))
                    statements.append(ir.SizeDecl(names, tensor))
                    declared.add(index)
            if statement.target in forward:
                expr = _read_through(expr, frozenset(statement.indices or ()))
            statement = replace(statement, expr=expr)
            assigned.add(statement.target or "")
            statements.append(statement)
            statements.extend(pending.pop(statement.target or "", []))  # sizes from this target's axes
            continue
        elif isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str) \
                and statement.source in table.deltas:
            # the first axis has its read's length; the position's indices are sized where they are read
            length = table.lengths.get(statement.source)
            if length is None:
                continue
            tensor, axis = length
            rank = ranks.get(tensor, axis + 1)
            statements.extend(_position_sizes(statement, table, tensor, axis, rank, unsized, ranks))
            names = tuple(statement.names[0] if k == axis else table.fresh("_axis") for k in range(rank))
            statement = ir.SizeDecl(names, tensor)
            if tensor in forward and tensor not in assigned:  # a target's axis: declared once it is assigned
                pending.setdefault(tensor, []).append(statement)
                continue
        statements.append(statement)
    used = {index for statement in statements if isinstance(statement, ir.Assign)
            for index in (*indices_in(statement.expr), *(statement.indices or ()))}
    return ir.ProgramIR(tuple(s for s in statements  # the sizes of indices a derivation no longer reads go
                              if not isinstance(s, ir.SizeDecl) or set(s.names) & used))


def with_shifts(derivation: Any, program: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``derivation(program, *args, **kwargs)`` on the disguised program; reveal the deltas in its result."""
    if not isinstance(program, Checked) or not has_shifts(program.ir):
        return derivation(program, *args, **kwargs)
    wrt = kwargs.get("wrt", args[0] if args else None)
    names = [wrt] if isinstance(wrt, str) else list(wrt or ())
    gathered = gather_tensors(program.ir)
    for name in names:
        if name in gathered:
            raise DerivativeError(f"'{name}' holds the integer positions of a gather; a program cannot be "
                                  f"differentiated with respect to it")
    disguised, table = disguise(program)
    result = derivation(disguised, *args, **kwargs)
    revealed = reveal(result.ir, table, frozenset(program.info.targets), dict(program.info.ranks))
    return checked(revealed)
