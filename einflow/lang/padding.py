"""Boundaries (LANGUAGE.md 9.4): ``pad MODE X`` makes the reads of ``X`` that leave its axes (through a
``size``-declared range) wrap, mirror or repeat the edge instead of reading 0.

The declaration is text; the IR carries its meaning on the nodes it changes: every :class:`~einflow.lang.ir.Read`
of ``X`` has ``mode`` set, and so has every :class:`~einflow.lang.ir.ShiftDelta` whose index is sized from an
axis of ``X`` (``size p = X``): ``delta[p, h + r - 1]`` is then 1 where ``p`` is the folded position, which is
how a derivative writes the adjoint of a padded read (a scatter-add onto the source positions).

>>> fold(-2, 5, "circular"), fold(-2, 5, "reflect"), fold(-2, 5, "replicate"), fold(6, 5, "reflect")
(3, 2, 0, 2)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from einflow.lang import ir

__all__ = ["fold", "resolve_pads", "declare_pads", "pad_modes", "without_pads"]


def fold(position: Any, length: int, mode: str) -> Any:
    """The source position a read at ``position`` (an int or an integer array) of an axis of ``length`` reads
    under ``mode``: ``circular`` wraps (numpy's ``wrap``), ``reflect`` mirrors without repeating the edge
    (numpy's ``reflect``, repeated for reads farther out than the axis is long), ``replicate`` repeats the edge
    (numpy's ``edge``); ``zeros`` leaves it (the caller reads 0 outside). Operators only: the same code folds
    numpy, torch and jax arrays."""
    if mode == "zeros":
        return position
    if mode == "circular":
        return position % length
    if mode == "replicate":
        if isinstance(position, int):
            return min(max(position, 0), length - 1)
        return position.clip(0, length - 1)
    if length == 1:  # reflect with one element: every position reads it
        return position * 0
    period = 2 * length - 2
    wrapped = position % period
    if isinstance(wrapped, int):
        return wrapped if wrapped < length else period - wrapped
    return wrapped + (wrapped >= length) * (period - 2 * wrapped)


def pad_modes(program: ir.ProgramIR) -> dict[str, str]:
    """Tensor name -> its declared mode (the last declaration of a name wins; check.py refuses two)."""
    return {name: statement.mode for statement in program.statements if isinstance(statement, ir.PadDecl)
            for name in statement.names}


def _with_modes(expr: ir.Expr, modes: dict[str, str], sized: dict[str, str]) -> ir.Expr:
    if isinstance(expr, ir.Read):
        mode = modes.get(expr.name, "zeros")
        return expr if expr.mode == mode else replace(expr, mode=mode)
    if isinstance(expr, ir.ShiftDelta):
        mode = modes.get(sized.get(expr.index, ""), "zeros") if isinstance(expr.position, ir.Affine) else "zeros"
        return expr if expr.mode == mode else replace(expr, mode=mode)
    children = ir.children(expr)
    if not children:
        return expr
    new = tuple(_with_modes(child, modes, sized) for child in children)
    return expr if new == children else ir.with_children(expr, new)


def _note_sizes(statement: ir.SizeDecl, sized: dict[str, str]) -> None:
    """Record in ``sized`` (index -> tensor) the tensor a ``size`` declaration reads its indices from."""
    for name in statement.names:
        if isinstance(statement.source, str):
            sized[name] = statement.source
        else:
            sized.pop(name, None)


def resolve_pads(program: ir.ProgramIR) -> ir.ProgramIR:
    """The program's reads and deltas with the modes its ``pad`` declarations give them (unchanged without any).

    >>> from einflow.lang.grammar import parse
    >>> program = parse("pad circular x\\nsize h = x\\ny[h] = x[h+r-1] k[r]")
    >>> program.statements[-1].expr.factors[0].mode
    'circular'
    """
    modes = pad_modes(program)
    if not modes:
        return program
    sized: dict[str, str] = {}  # index -> the tensor its latest size declaration reads
    statements: list[ir.Statement] = []
    for statement in program.statements:
        if isinstance(statement, ir.SizeDecl):
            _note_sizes(statement, sized)
        elif isinstance(statement, ir.Assign):
            expr = _with_modes(statement.expr, modes, sized)
            if expr is not statement.expr:
                statement = replace(statement, expr=expr)
        statements.append(statement)
    return ir.ProgramIR(tuple(statements))


def without_pads(program: ir.ProgramIR) -> ir.ProgramIR:
    """The program without its ``pad`` declarations (the nodes keep their modes)."""
    if not any(isinstance(statement, ir.PadDecl) for statement in program.statements):
        return program
    return ir.ProgramIR(tuple(s for s in program.statements if not isinstance(s, ir.PadDecl)))


def declare_pads(program: ir.ProgramIR) -> ir.ProgramIR:
    """The ``pad`` declarations that the modes on the program's nodes need, written first (a derivative program
    is built as IR: so its text re-parses to the same modes). A delta's mode is declared on the tensor its
    index is sized from."""
    found: dict[str, str] = {}
    sized: dict[str, str] = {}
    for statement in program.statements:
        if isinstance(statement, ir.SizeDecl):
            _note_sizes(statement, sized)
        elif isinstance(statement, ir.Assign):
            for node in ir.walk(statement.expr):
                if isinstance(node, ir.Read) and node.mode != "zeros":
                    found.setdefault(node.name, node.mode)
                elif isinstance(node, ir.ShiftDelta) and node.mode != "zeros" and node.index in sized:
                    found.setdefault(sized[node.index], node.mode)
        elif isinstance(statement, ir.PadDecl):
            for name in statement.names:
                found.setdefault(name, statement.mode)
    rest = tuple(statement for statement in program.statements if not isinstance(statement, ir.PadDecl))
    if not found:
        return ir.ProgramIR(rest)
    by_mode: dict[str, list[str]] = {}
    for name, mode in found.items():
        by_mode.setdefault(mode, []).append(name)
    declarations = tuple(ir.PadDecl(mode, tuple(names)) for mode, names in by_mode.items())
    return ir.ProgramIR(declarations + rest)
