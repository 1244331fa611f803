"""Where each index of a statement gets its size, as symbolic sizes (an input's axis, a declaration, a range the
shifted reads allow); the checks with numbers are ``einflow.lang.indices.statement_sizes``."""

from __future__ import annotations

from collections.abc import Mapping

from einflow.engine.affine_lower import note_ranges
from einflow.engine.lower_context import LoweringContext
from einflow.engine.steps import Inferred, SizeRef
from einflow.lang import ir
from einflow.lang.indices import NOT_PLAIN, join_partners, size_links

__all__ = ["statement_size_refs", "declare_sizes"]


def statement_size_refs(cx: LoweringContext, statement: ir.Assign) -> tuple[dict[str, SizeRef], frozenset[str]]:
    """Where each index of the statement gets its size, and the indices that shifted reads size (LANGUAGE.md
    8.2); the statement's ranges are noted in ``cx.ranges``."""
    sizes: dict[str, SizeRef] = {}
    tensors, partners = size_links(statement.expr)
    for tensor in tensors:
        value = cx.names[tensor.name]
        if value.reg is not None:
            known = cx.register_sizes[value.reg]
            for axis, index in enumerate(tensor.indices):
                if axis < len(known) and index != NOT_PLAIN:
                    sizes.setdefault(index, known[axis])
    for index, source in cx.declared.items():
        sizes.setdefault(index, source)
    note_ranges(cx, statement, sizes)
    # index arithmetic: an index of a shifted read without a declared size has the range its reads allow
    shifted = frozenset(index for node in ir.walk(statement.expr) if isinstance(node, ir.Read)
                        for position in node.positions if isinstance(position, ir.Affine)
                        for index in position.indices if index not in cx.declared)
    for index in shifted:
        sizes[index] = Inferred(cx.statement, index)
    for node in ir.walk(statement.expr):  # a delta's position sizes only the indices nothing else sizes
        if isinstance(node, ir.ShiftDelta):
            for index in node.position.indices:
                if index not in sizes and index not in cx.declared:
                    sizes[index] = Inferred(cx.statement, index)
    return join_partners(sizes, partners), shifted


def declare_sizes(cx: LoweringContext, statement: ir.SizeDecl, shape_only: Mapping[str, tuple[SizeRef, ...]]) -> None:
    """A ``size`` declaration in force from here on (``cx.declared``); ``shape_only``: the axis sizes of targets
    that only size declarations read."""
    if isinstance(statement.source, int):
        for name in statement.names:
            cx.declared[name] = statement.source
        return
    if statement.source in shape_only:
        known: tuple[SizeRef, ...] = shape_only[statement.source]
    else:
        value = cx.names[statement.source]
        known = cx.register_sizes.get(value.reg, ()) if value.reg is not None else ()
    for axis, name in enumerate(statement.names):
        cx.declared[name] = known[axis] if axis < len(known) else 1
