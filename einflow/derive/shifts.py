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
_range1[h,r] = x[h + r] K[r]
size h, _axis1 = _range1
y[h] = x[q1] delta[q1, h + r] K[r]

Revealed as a derivative statement (not one of the program's own values), ``h`` keeps the range it had in the
statement it came from: a range helper's axis (``_Ranges``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from einflow.lang import ir
from einflow.lang.check import Checked, checked
from einflow.lang.errors import DerivativeError
from einflow.lang.indices import free_indices, indices_in, windowed_indices
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
        #: pseudo tensor -> how its delta folds a position outside (``pad`` modes; absent: zeros)
        self.modes: dict[str, str] = {}
        #: pseudo tensor -> (tensor, axis) whose length its first axis has (a read's), where known
        self.lengths: dict[str, tuple[str, int]] = {}
        #: pseudo tensor -> the number of the statement whose read it stands for
        self.origins: dict[str, int] = {}
        #: index -> the program's ``size`` declaration of it (a padded read's range)
        self.declared: dict[str, ir.SizeDecl] = {}
        #: the disguised program's own statements and inputs (a pseudo tensor's origin is a position here)
        self.statements: tuple[ir.Statement, ...] = ()
        self.inputs: tuple[str, ...] = ()
        #: targets of implicit statements given their axes explicitly while disguised (``S = W[t[m],c]`` has
        #: axes ``m, c``; its disguise ``W[q1,c] _shift1[q1,m]`` alone would give them as ``c, m``)
        self.implicit: set[str | None] = set()

    def fresh(self, stem: str) -> str:
        number = 1
        while f"{stem}{number}" in self.taken:
            number += 1
        self.taken.add(f"{stem}{number}")
        return f"{stem}{number}"

    def tensor(self, index: str, position: ir.Affine | ir.Gather, mode: str = "zeros") -> ir.Tensor:
        name = self.fresh(PSEUDO)
        self.deltas[name] = (index, position)
        if mode != "zeros":
            self.modes[name] = mode
        return ir.Tensor(name, tuple(dict.fromkeys((index, *position.indices))))


def _names(program: ir.ProgramIR) -> set[str]:
    found: set[str] = set()
    for statement in program.statements:
        if isinstance(statement, ir.SizeDecl):
            found |= set(statement.names)
            continue
        if isinstance(statement, (ir.Return, ir.MatrixDecl, ir.PadDecl)):
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
        return table.tensor(expr.index, expr.position, expr.mode)
    read: ir.Read | None = None
    if isinstance(expr, ir.Read):
        read = ir.Read(expr.name, tuple(ir.Affine(((1, p),)) if isinstance(p, str) and p in shifted else p
                                        for p in expr.positions), expr.mode)
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
            deltas.append(table.tensor(index, position, read.mode))
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
            shifted = windowed_indices(statement.expr) - declared
            before = set(table.deltas)
            sizes: list[ir.SizeDecl] = []
            expr = _disguised(statement.expr, table, shifted, indices, sizes, program.info.ranks,
                              program.info.inputs)
            axes = statement.indices
            if axes is None and free_indices(expr) != free_indices(statement.expr):  # the reads' axes, as written
                axes = free_indices(statement.expr)
                table.implicit.add(statement.target)
            statement = replace(statement, indices=axes, expr=expr)
            statements.extend(sizes)
            table.origins.update(dict.fromkeys(set(table.deltas) - before, number))
        statements.append(statement)
    return checked(ir.ProgramIR(tuple(statements))), table


def _revealed(expr: ir.Expr, table: _Table, lengths: dict[str, tuple[str, int]] | None = None,
              positions: dict[str, tuple[str, int]] | None = None) -> ir.Expr:
    """The pseudo tensors of ``expr`` as deltas of positions again. ``lengths`` learns which read's axis each
    delta's first index runs over; ``positions`` learns, for each index of a revealed position, the index of the
    program's own statement it stands for and that statement's number (its range is that index's range there)."""
    if isinstance(expr, ir.Tensor) and expr.name in table.deltas:
        index, position = table.deltas[expr.name]
        original = tuple(dict.fromkeys((index, *position.indices)))
        mapping = dict(zip(original, expr.indices))
        if lengths is not None and expr.name in table.lengths:
            lengths[mapping[index]] = table.lengths[expr.name]
        if positions is not None and expr.name in table.origins:
            for i in position.indices:
                positions.setdefault(mapping[i], (i, table.origins[expr.name]))
            if expr.name not in table.lengths:  # the program's own delta (a scatter): its index is sized there too
                positions.setdefault(mapping[index], (index, table.origins[expr.name]))
        if isinstance(position, ir.Gather):
            return ir.ShiftDelta(mapping[index], ir.Gather(position.name, tuple(mapping[i] for i in position.indices)))
        found: ir.Position | None = position
        holders = {i: f"#{k}" for k, i in enumerate(position.indices)}  # a swap of two names is a swap
        for old, holder in holders.items():
            found = compose(found, old, ir.Affine(((1, holder),)))  # type: ignore[arg-type]
        for old, holder in holders.items():
            found = compose(found, holder, ir.Affine(((1, mapping[old]),)))  # type: ignore[arg-type]
        return ir.ShiftDelta(mapping[index], found, table.modes.get(expr.name, "zeros"))  # type: ignore[arg-type]
    children = ir.children(expr)
    if not children:
        return expr
    return ir.with_children(expr, tuple(_revealed(child, table, lengths, positions) for child in children))


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


def _scatters(expr: ir.Expr, targets: frozenset[str]) -> bool:
    """Whether ``expr`` holds a delta of a position into a target index (a scatter)."""
    return any(isinstance(node, ir.ShiftDelta) and node.index in targets for node in ir.walk(expr))


def _alike(terms: tuple[ir.Expr, ...], bound: frozenset[str]) -> bool:
    """Whether the terms have the same free indices (a term without one is broadcast over it in their sum)."""
    return len({frozenset(free_indices(term, bound)) for term in terms}) == 1


def _added(parts: list[ir.Expr]) -> ir.Expr:
    flat = [term for part in parts for term in (part.terms if isinstance(part, ir.Sum) else (part,))]
    return flat[0] if len(flat) == 1 else ir.Sum(tuple(flat))


def _scaled(factors: list[ir.Expr]) -> ir.Expr:
    """The product of ``factors`` with its numbers multiplied into one leading number."""
    flat = ir.product(*factors)
    factors = list(flat.factors) if isinstance(flat, ir.Product) else [flat]
    scale = float(np.prod([f.value for f in factors if isinstance(f, ir.Num)]))
    others = [f for f in factors if not isinstance(f, ir.Num)]
    number = int(scale) if scale.is_integer() else scale
    return ir.product(*([ir.Num(number)] if scale != 1 or not others else []), *others)


def _distributed(expr: ir.Expr, targets: frozenset[str], bound: frozenset[str] | None = None) -> ir.Expr:
    """A derivative statement's products distributed over their sums of scatters, and sums over indices over
    the terms they add: ``sum[a,b](F[a,b] (delta[p, a+1] delta[q, b] - delta[p, a] delta[q, b]))`` is two
    scatters of ``F`` (each ``[a,b] -> [p,q]``) instead of one product with a ``[p,a,q,b]`` sum of deltas.
    Only where the terms have the same free indices, so the distributed form means the same."""
    bound = targets if bound is None else bound
    if isinstance(expr, ir.Sum):
        return _added([_distributed(term, targets, bound) for term in expr.terms])
    if isinstance(expr, ir.Reduce) and expr.kind == "sum":
        inner = bound | frozenset(expr.indices)
        body = _distributed(expr.body, targets, inner)
        if isinstance(body, ir.Sum) and _alike(body.terms, inner) and _scatters(body, targets):
            return _added([ir.Reduce(expr.indices, term, "sum") for term in body.terms])
        return ir.Reduce(expr.indices, body, expr.kind)
    if isinstance(expr, ir.Product):
        factors = [_distributed(factor, targets, bound) for factor in expr.factors]
        for k, factor in enumerate(factors):
            if isinstance(factor, ir.Sum) and all(_scatters(t, targets) for t in factor.terms) \
                    and _alike(factor.terms, bound):
                rest = factors[:k] + factors[k + 1:]
                return _added([_distributed(_scaled([*rest, part]), targets, bound) for part in factor.terms])
        return ir.product(*factors)
    return expr


def _plainly_sized(expr: ir.Expr) -> set[str]:
    """The indices a revealed expression sizes as axes: of tensors, plain positions of reads, gathers."""
    found: set[str] = set()
    for node in ir.walk(expr):
        if isinstance(node, ir.Tensor):
            found |= set(node.indices)
        elif isinstance(node, ir.Read):
            found |= {p for p in node.positions if isinstance(p, str)}
        if isinstance(node, (ir.Read, ir.ShiftDelta)):
            found |= {i for gather in node.gathers for i in gather.indices}
    return found


class _Ranges:
    """Exact ranges for the indices of derivative statements that stand for indices of reads through positions.

    A derivation moves the factors of a statement with shifted reads into new statements, each with only some
    of the reads; re-inferred from those, an index whose range was the intersection of all of them (``a`` in
    ``U[a, b+1] - U[a+1, b+1]``) would get a longer one. So each such index gets a ``size`` declaration of the
    range it had in its own statement: the axis of that statement's target, the program's own declaration,
    the gather tensor's axis, or else the axis of a range helper, ``_range1[a,b] = U[a,b+1] U[a+1,b+1]``: the
    statement's reads of those indices (other axes summed), whose ranges are inferred as the statement's.
    """

    def __init__(self, table: _Table, ranks: dict[str, int]) -> None:
        self.table, self.ranks = table, ranks
        self.helpers: dict[int, tuple[str, tuple[str, ...]]] = {}

    def _helper(self, origin: int, available: set[str]) -> tuple[list[ir.Statement], str, tuple[str, ...]] | None:
        if origin in self.helpers:
            name, indices = self.helpers[origin]
            return [], name, indices
        statement = self.table.statements[origin]
        assert isinstance(statement, ir.Assign)
        nodes = ir.walk(statement.expr)
        keep: set[str] = set()
        for node in nodes:
            if isinstance(node, ir.Read):
                keep |= {i for p in node.positions if isinstance(p, ir.Affine) for i in p.indices}
            elif isinstance(node, ir.ShiftDelta):
                keep |= set(node.indices)
        keep |= windowed_indices(statement.expr)
        keep -= self.table.declared.keys()  # a declared index has its range, and reads through it are padded
        factors: list[ir.Expr] = []
        for node in nodes:
            if isinstance(node, (ir.Tensor, ir.Read)) and node.name in available:
                old = node.indices if isinstance(node, ir.Tensor) else node.positions
                if any(ir.position_indices(p) and set(ir.position_indices(p)) <= keep for p in old):
                    # the other axes summed over whole (a fresh index each), never read at one position: an axis
                    # may be empty (a batch of 0), and its length is no part of the kept indices' ranges
                    new = tuple(p if set(ir.position_indices(p)) <= keep else self.table.fresh("_over") for p in old)
                    plain = all(isinstance(p, str) for p in new)
                    factors.append(ir.Tensor(node.name, new) if plain else ir.Read(node.name, new))  # type: ignore
            elif isinstance(node, ir.ShiftDelta) and not node.gathers and set(node.indices) <= keep:
                factors.append(node)
            elif isinstance(node, ir.Delta) and {node.first, node.second} & keep:
                factors.append(node)
        ordered = (i for f in factors for i in (f.indices if isinstance(f, (ir.Tensor, ir.Read, ir.ShiftDelta))
                                                else (f.first, f.second) if isinstance(f, ir.Delta) else ()))
        indices = tuple(dict.fromkeys(i for i in ordered if i in keep))  # in order of first occurrence
        if not factors or not indices:
            return None
        name = self.table.fresh("_range")
        self.helpers[origin] = (name, indices)
        return [ir.Assign(name, indices, ir.product(*dict.fromkeys(factors)))], name, indices

    def declare(self, index: str, original: str, origin: int, assigned: set[str]) -> list[ir.Statement]:
        """The statements that give ``index`` the range ``original`` has in statement ``origin``."""
        table = self.table
        statement = table.statements[origin]
        assert isinstance(statement, ir.Assign)

        def axis_of(tensor: str | int, names: tuple[str, ...], at: int) -> list[ir.Statement]:
            if isinstance(tensor, int):
                return [ir.SizeDecl((index,), tensor)]
            return [ir.SizeDecl(tuple(index if k == at else table.fresh("_axis") for k in range(len(names))),
                                tensor)]

        if original in table.declared:
            declaration = table.declared[original]
            return axis_of(declaration.source, declaration.names, declaration.names.index(original))
        if statement.target in assigned and original in (statement.indices or ()):
            return axis_of(statement.target, statement.indices, statement.indices.index(original))  # type: ignore
        affine = any(isinstance(node, (ir.Read, ir.ShiftDelta)) and any(
            isinstance(p, ir.Affine) and original in p.indices
            for p in (node.positions if isinstance(node, ir.Read) else (node.position,)))
            for node in ir.walk(statement.expr))
        if not affine:
            for node in ir.walk(statement.expr):
                for gather in node.gathers if isinstance(node, (ir.Read, ir.ShiftDelta)) else ():
                    if original in gather.indices:
                        return axis_of(gather.name, gather.indices, gather.indices.index(original))
        found = self._helper(origin, set(table.inputs) | assigned)
        if found is None or original not in found[2]:
            return []
        emitted, name, indices = found
        return [*emitted, *axis_of(name, indices, indices.index(original))]


def reveal(program: ir.ProgramIR, table: _Table, forward: frozenset[str] = frozenset(),
           ranks: dict[str, int] | None = None) -> ir.ProgramIR:
    """The pseudo tensors back as deltas of positions; in the statements computing ``forward`` targets
    (the program's own values), deltas summed against reads are read through, as they were written. Every
    other statement's indices from positions keep the ranges they had (:class:`_Ranges`)."""
    from einflow.derive.normal import rename, stem_of

    ranks = ranks or {}
    table.taken |= _names(program)
    ranges = _Ranges(table, ranks)
    statements: list[ir.Statement] = []
    declared: dict[str, tuple[str, int] | None] = {}  # index -> the (index, statement) whose range it has
    uses: dict[str, int] = {}
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            for index in {*indices_in(statement.expr), *(statement.indices or ())}:
                uses[index] = uses.get(index, 0) + 1
    assigned: set[str] = set()
    pending: dict[str, list[ir.Statement]] = {}
    for statement in program.statements:
        if isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str) \
                and statement.source in table.deltas:
            # the first axis has its read's length; the position's indices have their ranges in their statement
            pseudo = statement.source
            index, position = table.deltas[pseudo]
            axes = dict(zip(statement.names, dict.fromkeys((index, *position.indices))))
            for name, source in list(axes.items())[1:]:
                if name not in declared and pseudo in table.origins:
                    statements.extend(ranges.declare(name, source, table.origins[pseudo], assigned))
                    declared[name] = (source, table.origins[pseudo])
            length = table.lengths.get(pseudo)
            if length is None:
                continue
            tensor, axis = length
            rank = ranks.get(tensor, axis + 1)
            names = tuple(statement.names[0] if k == axis else table.fresh("_axis") for k in range(rank))
            statement = ir.SizeDecl(names, tensor)
            if tensor in forward and tensor not in assigned:  # a target's axis: declared once it is assigned
                pending.setdefault(tensor, []).append(statement)
                continue
            declared.setdefault(statement.names[axis], None)
            statements.append(statement)
            continue
        if isinstance(statement, ir.SizeDecl):
            declared.update(dict.fromkeys(statement.names))
        if isinstance(statement, ir.Assign):
            lengths: dict[str, tuple[str, int]] = {}
            positions: dict[str, tuple[str, int]] = {}
            expr = _revealed(statement.expr, table, lengths, positions)
            if statement.target not in forward:
                plain = _plainly_sized(expr)
                need = {d: key for d, key in positions.items() if d not in plain and declared.get(d, ()) != key
                        and not (d == key[0] and d in table.declared and d in declared)}  # the program's own
                renames = {d: table.fresh(stem_of(d)) for d in need if d in declared or uses.get(d, 0) > 1}
                if renames:
                    statement = replace(statement, expr=rename(statement.expr, renames),
                                        indices=tuple(renames.get(i, i) for i in statement.indices)
                                        if statement.indices is not None else None)
                    lengths, positions = {}, {}
                    expr = _revealed(statement.expr, table, lengths, positions)
                for d, (original, origin) in need.items():
                    name = renames.get(d, d)
                    statements.extend(ranges.declare(name, original, origin, assigned))
                    declared[name] = (original, origin)
                if statement.indices:
                    expr = _distributed(expr, frozenset(statement.indices))
            sized = set(declared) | {index for node in ir.walk(expr) if isinstance(node, ir.Tensor)
                                     for index in node.indices}
            for index, (tensor, axis) in lengths.items():
                if tensor in forward and tensor not in assigned:  # its own statement, or a later one's: no size yet
                    continue
                if index not in sized and tensor in ranks:  # a scattered index that a pseudo tensor sized
                    names = tuple(index if k == axis else table.fresh("_axis") for k in range(ranks[tensor]))
                    statements.append(ir.SizeDecl(names, tensor))
                    declared.setdefault(index, None)
            if statement.target in forward:
                expr = _read_through(expr, frozenset(statement.indices or ()))
                if statement.target in table.implicit and free_indices(expr) == statement.indices:
                    statement = replace(statement, indices=None)  # implicit again, as it was written
            statement = replace(statement, expr=expr)
            assigned.add(statement.target or "")
            statements.append(statement)
            statements.extend(pending.pop(statement.target or "", []))  # sizes from this target's axes
            continue
        statements.append(statement)
    used = {index for statement in statements if isinstance(statement, ir.Assign)
            for index in (*indices_in(statement.expr), *(statement.indices or ()))}
    once: list[ir.Statement] = []
    seen: set[str] = set()
    for s in statements:  # an index sized twice (a read's axis and the derivation's own line): the first holds
        if isinstance(s, ir.SizeDecl):
            s = replace(s, names=tuple(table.fresh("_axis") if n in seen else n for n in s.names))
            seen |= set(s.names)
        once.append(s)
    return ir.ProgramIR(tuple(s for s in once  # the sizes of indices a derivation no longer reads go
                              if not isinstance(s, ir.SizeDecl) or set(s.names) & used))


def _renamed_tensors(statements: tuple[ir.Statement, ...], mapping: dict[str, str]) -> tuple[ir.Statement, ...]:
    """The statements with the tensors of ``mapping`` renamed: targets, references, declarations, returns."""
    def renamed(expr: ir.Expr) -> ir.Expr:
        if isinstance(expr, ir.Tensor) and expr.name in mapping:
            return ir.Tensor(mapping[expr.name], expr.indices)
        children = ir.children(expr)
        return ir.with_children(expr, tuple(renamed(child) for child in children)) if children else expr

    result: list[ir.Statement] = []
    for statement in statements:
        if isinstance(statement, ir.Assign):
            statement = replace(statement, target=mapping.get(statement.target or "", statement.target),
                                expr=renamed(statement.expr))
        elif isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str):
            statement = replace(statement, source=mapping.get(statement.source, statement.source))
        elif isinstance(statement, (ir.Return, ir.MatrixDecl, ir.PadDecl)):
            statement = replace(statement, names=tuple(mapping.get(n, n) for n in statement.names))
        result.append(statement)
    return tuple(result)


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
    clashes = {statement.target for statement in result.ir.statements
               if isinstance(statement, ir.Assign) and statement.target in gathered}
    statements = result.ir.statements
    if clashes:  # a helper named like a gather tensor the pseudo tensors hid from the derivation (``t1``)
        table.taken |= _names(result.ir)
        statements = _renamed_tensors(statements, {name: table.fresh(name.rstrip("0123456789") or "t")
                                                   for name in clashes if name is not None})
    revealed = reveal(ir.ProgramIR(statements), table, frozenset(program.info.targets), dict(program.info.ranks))
    return checked(revealed)
