"""Index sizes: which indices an expression mentions, and where each index of a statement gets its size.

A statement's index takes its size from the tensor axes it labels, from a ``size`` declaration, or from
a delta partner (``delta[i,j]`` joins ``i`` and ``j``: equal sizes). This module owns those rules:
:func:`size_links` finds the tensor axes and delta partners of an expression, and :func:`join_partners`
propagates sizes across partners. The lowering (``einflow.engine.lower``) uses them with symbolic sizes (which
array's axis to read), the specialisation (``einflow.engine.plan``) with numbers, where :func:`statement_sizes`
also reports every disagreement as a ``ShapeError`` that points at the source, and the derivation's
size registry (``einflow.derive.sizes``) with classes of equal size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from opt_einsum import get_symbol

from einflow.lang import ir
from einflow.lang.contraction import product_output
from einflow.lang.errors import ShapeError, TensorNameError, located

__all__ = ["indices_in", "free_indices", "product_operands", "product_split", "top_level_terms", "size_links",
           "join_partners", "statement_sizes", "windowed_indices", "declared_sizes", "plain_axes", "NOT_PLAIN",
           "infer_ranges", "position_bounds", "index_letters", "einsum_equation"]

T = TypeVar("T")


def index_letters(*groups: Iterable[str]) -> dict[str, str]:
    """Each index name in ``groups`` as one letter, in order of first appearance (``a``..``z``, ``A``..``Z``, then
    opt_einsum's symbols past numpy's 52).

    >>> index_letters(("row", "k"), ("k", "col"))
    {'row': 'a', 'k': 'b', 'col': 'c'}
    """
    letters: dict[str, str] = {}
    for group in groups:
        for name in group:
            if name not in letters:
                letters[name] = get_symbol(len(letters))
    return letters


def einsum_equation(operands: Iterable[Iterable[str]], output: Iterable[str],
                    letters: Mapping[str, str] | None = None) -> str:
    """The einsum equation ``operands -> output`` over index names: each name as a letter (``letters``, else
    :func:`index_letters` of the operands and the output).

    >>> einsum_equation([("i", "k"), ("k", "j")], ("i", "j"))
    'ab,bc->ac'
    """
    operands = [tuple(labels) for labels in operands]
    output = tuple(output)
    if letters is None:
        letters = index_letters(*operands, output)
    return ",".join("".join(letters[name] for name in labels) for labels in operands) + "->" + \
        "".join(letters[name] for name in output)


def product_operands(factors: tuple[ir.Expr, ...], bound: frozenset[str]) -> list[tuple[str, ...]]:
    """The index lists a product's factors contribute (leaves with multiplicity, scopes once each)."""
    lists: list[tuple[str, ...]] = []
    for factor in factors:
        if isinstance(factor, (ir.Tensor, ir.Read, ir.ShiftDelta)):
            lists.append(factor.indices)
        elif isinstance(factor, ir.Delta):
            lists.append((factor.first, factor.second))
        elif isinstance(factor, ir.Num):
            lists.append(())
        else:
            lists.append(free_indices(factor, bound))
    return lists


def product_split(factors: tuple[ir.Expr, ...], bound: frozenset[str]) -> tuple[tuple[str, ...], set[str]]:
    """(free indices in order, contracted indices) of a product of ``factors`` with ``bound`` indices bound."""
    output, summed = product_output(product_operands(factors, bound), bound, frozenset())
    return tuple(output), set(summed)


def free_indices(expr: ir.Expr, bound: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Free indices of ``expr`` in their order, when ``bound`` indices are bound around it.

    >>> from einflow.lang.grammar import parse_expression
    >>> free_indices(parse_expression("A[i,k] B[k,j]"))
    ('i', 'j')
    """
    if isinstance(expr, ir.Num):
        return ()
    if isinstance(expr, (ir.Tensor, ir.Read, ir.ShiftDelta)):
        return product_split((expr,), bound)[0]
    if isinstance(expr, ir.Delta):
        return product_split((expr,), bound)[0]
    if isinstance(expr, ir.Product):
        return product_split(expr.factors, bound)[0]
    if isinstance(expr, ir.Sum):
        seen: dict[str, None] = {}
        for term in expr.terms:
            for index in free_indices(term, bound):
                seen.setdefault(index, None)
        return tuple(seen)
    if isinstance(expr, ir.Call):
        return free_indices(expr.arg, bound)
    if isinstance(expr, ir.Power):
        return free_indices(expr.base, bound)
    if isinstance(expr, ir.Reduce):
        inner = bound | frozenset(expr.indices)
        return tuple(i for i in free_indices(expr.body, inner) if i not in expr.indices)
    if isinstance(expr, ir.Normalize):
        return free_indices(expr.body, bound)
    if isinstance(expr, ir.Binary):
        return free_indices(ir.Sum((expr.left, expr.right)), bound)
    if isinstance(expr, ir.Linalg):
        if not expr.reduces:
            return free_indices(expr.body, bound)
        inner = bound | frozenset(expr.indices)
        return tuple(i for i in free_indices(expr.body, inner) if i not in expr.indices)
    raise TypeError(f"not an expression: {expr!r}")


def top_level_terms(expr: ir.Expr) -> tuple[ir.Expr, ...]:
    """The operands of the outermost sum (each reduced on its own in an explicit statement)."""
    return expr.terms if isinstance(expr, ir.Sum) else (expr,)


@functools.lru_cache(maxsize=4096)
def indices_in(expr: ir.Expr) -> frozenset[str]:
    """Every index name occurring anywhere in ``expr``.

    >>> sorted(indices_in(ir.Product((ir.Tensor("A", ("i", "k")), ir.Delta("k", "j")))))
    ['i', 'j', 'k']
    """
    if isinstance(expr, (ir.Tensor, ir.Read, ir.ShiftDelta)):
        return frozenset(expr.indices)
    if isinstance(expr, ir.Delta):
        return frozenset((expr.first, expr.second))
    found = frozenset().union(*(indices_in(child) for child in ir.children(expr)))
    return found | frozenset(expr.indices) if isinstance(expr, (ir.Reduce, ir.Normalize, ir.Linalg)) else found


def size_links(expr: ir.Expr) -> tuple[list[ir.Tensor], list[tuple[str, str, ir.Delta]]]:
    """Where the indices of ``expr`` get their sizes: its tensor references (each index the size of the
    axis it labels) and its delta partners ``(first, second, delta)``, both in source order.

    >>> tensors, partners = size_links(ir.Product((ir.Tensor("A", ("i", "k")), ir.Delta("k", "j"))))
    >>> [t.name for t in tensors], [(first, second) for first, second, _ in partners]
    (['A'], [('k', 'j')])
    """
    tensors: list[ir.Tensor] = []
    partners: list[tuple[str, str, ir.Delta]] = []
    for node in ir.walk(expr):
        if isinstance(node, ir.Tensor):
            tensors.append(node)
        elif isinstance(node, ir.Read):
            tensors.extend(plain_axes(node))
        elif isinstance(node, ir.ShiftDelta):
            tensors.extend(ir.Tensor(gather.name, gather.indices, span=node.span) for gather in node.gathers)
        elif isinstance(node, ir.Delta):
            partners.append((node.first, node.second, node))
    return tensors, partners


def join_partners(found: dict[str, T], partners: Iterable[tuple[str, str, Any]],
                  note: Callable[[str, T, str, Any], None] | None = None,
                  clash: Callable[[str, str, Any], None] | None = None) -> dict[str, T]:
    """Give each delta partner the size its other index has, until nothing changes (``found`` is updated).

    ``note(index, size, where, node)`` records a size (default: store it); ``clash(first, second, node)``
    is told about partners whose sizes differ (default: ignored).

    >>> join_partners({"i": 3}, [("i", "j", None), ("j", "k", None)])
    {'i': 3, 'j': 3, 'k': 3}
    """
    def store(index: str, size: T, where: str, node: Any) -> None:
        found[index] = size

    record = note or store
    partners = list(partners)
    changed = True
    while changed:
        changed = False
        for first, second, node in partners:
            if first in found and second not in found:
                record(second, found[first], f"delta[{first},{second}] (partner of '{first}')", node)
                changed = True
            elif second in found and first not in found:
                record(first, found[second], f"delta[{first},{second}] (partner of '{second}')", node)
                changed = True
            elif clash is not None and first in found and second in found and found[first] != found[second]:
                clash(first, second, node)
    return found


def _bound_shape(tensor: str, rank: int, shapes: Mapping[str, tuple[int, ...]], span: Any, source: str | None,
                 wrong_rank: str, after: str = "") -> tuple[int, ...]:
    """``tensor``'s shape; an unbound tensor or a rank other than ``rank`` is an error (``wrong_rank``
    starts that message, the shape and ``after`` end it)."""
    shape = shapes.get(tensor)
    if shape is None:
        raise TensorNameError(located(f"tensor '{tensor}' is not bound", span, source))
    if len(shape) != rank:
        raise ShapeError(located(f"{wrong_rank} {len(shape)} (shape {tuple(shape)}){after}", span, source))
    return tuple(shape)


def declared_sizes(statement: ir.SizeDecl, shapes: Mapping[str, tuple[int, ...]],
                   source: str | None) -> dict[str, tuple[int, str]]:
    """The sizes a ``size`` declaration gives, each with where it comes from (for messages)."""
    if isinstance(statement.source, int):
        return {name: (statement.source, f"'size {name} = {statement.source}'") for name in statement.names}
    shape = _bound_shape(statement.source, len(statement.names), shapes, statement.span, source,
                         f"size declaration names {len(statement.names)} indices but '{statement.source}' has rank")
    return {name: (size, f"'size' of {statement.source} (axis {axis})")
            for axis, (name, size) in enumerate(zip(statement.names, shape))}


def statement_sizes(statement: ir.Assign, shapes: Mapping[str, tuple[int, ...]],
                    declared: Mapping[str, tuple[int, str]], source: str | None) -> dict[str, int]:
    """Each index of ``statement`` with its size; a ``ShapeError`` names the first disagreement.

    ``shapes``: every bound tensor's shape; ``declared``: sizes from earlier ``size`` declarations.
    """
    found: dict[str, tuple[int, str]] = {}
    mentioned: dict[str, None] = {}
    windowed = windowed_indices(statement.expr) - declared.keys()

    def note(index: str, size: int, where: str, node: Any) -> None:
        known = found.get(index)
        if known is None:
            found[index] = (size, where)
        elif known[0] != size and index in windowed and not where.startswith("'size"):
            # a plain read of an index that a shifted read sizes is a window by 0: the range is the intersection
            if size < known[0]:
                found[index] = (size, where)
        elif known[0] != size:
            raise ShapeError(located(
                f"index '{index}' has size {known[0]} in {known[1]} but size {size} in {where}",
                getattr(node, "span", None), source))

    tensors, partners = size_links(statement.expr)
    for node in tensors:  # source order: the first use is reported first
        shape = _bound_shape(node.name, len(node.indices), shapes, node.span, source, f"tensor '{node.name}' has rank",
                             f" but is used with {len(node.indices)} indices")
        for axis, (index, size) in enumerate(zip(node.indices, shape)):
            if index == NOT_PLAIN:
                continue
            mentioned.setdefault(index, None)
            note(index, size, f"{node.name} (axis {axis})", node)
    for first, second, _ in partners:
        mentioned.setdefault(first, None)
        mentioned.setdefault(second, None)
    for index in statement.indices or ():
        mentioned.setdefault(index, None)
    nodes = ir.walk(statement.expr)
    for node in nodes:  # an index only reads through positions mention (``max[i](x[i-1])``)
        if isinstance(node, (ir.Read, ir.ShiftDelta)):
            for index in node.indices:
                mentioned.setdefault(index, None)
    for index in mentioned:
        if index in declared:
            size, where = declared[index]
            note(index, size, where, statement)

    def clash(first: str, second: str, node: Any) -> None:
        raise ShapeError(located(
            f"delta[{first},{second}] joins index '{first}' of size {found[first][0]} ({found[first][1]}) with "
            f"index '{second}' of size {found[second][0]} ({found[second][1]})", node.span, source))

    sizes = {index: size for index, (size, _) in found.items()}
    join_partners(sizes, partners, lambda index, size, where, node: (note(index, size, where, node),
                                                                     sizes.__setitem__(index, size)), clash)
    reads = [node for node in nodes if isinstance(node, ir.Read)]
    shifts = [node for node in nodes if isinstance(node, ir.ShiftDelta)]
    if reads or shifts:
        for node in reads + shifts:  # type: ignore[operator]
            for index in node.indices:
                mentioned.setdefault(index, None)
        padded = frozenset(index for index in mentioned if index in declared)
        shapes = dict(shapes)
        for node in shifts:  # a delta reads like an axis as long as its index, and is 0 outside (never an error)
            if node.index in sizes:
                shapes[_DELTA + node.index] = (sizes[node.index],)
                reads.append(ir.Read(_DELTA + node.index, (node.position,), span=node.span))
        for index, size in infer_ranges(reads, sizes, padded, shapes, source).items():
            if index not in found or found[index][0] != size:
                found[index] = (size, "the reads of " + ", ".join(ir.format_expr(r) for r in reads))
        join_partners(sizes, partners, lambda index, size, where, node: (
            found.setdefault(index, (size, where)), sizes.__setitem__(index, size)))  # a delta partner of one
    for index in mentioned:
        if index not in found:
            raise ShapeError(located(
                f"index '{index}' has no size: it is not an axis of any tensor; declare it with "
                f"'size {index} = ...'", statement.span, source))
    for node in nodes:  # linear algebra: square matrices (LANGUAGE.md 8.1)
        if isinstance(node, ir.Linalg):
            (rows, row_where), (columns, column_where) = (found[index] for index in node.indices)
            if rows != columns:
                raise ShapeError(located(
                    f"{node.kind}[{','.join(node.indices)}] needs a square matrix: index '{node.indices[0]}' has size "
                    f"{rows} ({row_where}) but '{node.indices[1]}' has size {columns} ({column_where})",
                    node.span, source))
    return {index: size for index, (size, _) in found.items()}


# ---------------------------------------------------------------- index arithmetic (LANGUAGE.md 8.2)
#: the label :func:`size_links` gives a shifted, constant or gathered axis (it gives no index a size)
NOT_PLAIN = "#"


def windowed_indices(expr: ir.Expr) -> frozenset[str]:
    """The indices alone in an affine position of some read of ``expr`` (``i`` in ``x[i+1]``, ``2*i``): a plain
    read of one of them in the same statement is a read shifted by 0, so plain reads of different lengths
    beside it meet in their intersection (LANGUAGE.md 8.2) instead of disagreeing.

    >>> sorted(windowed_indices(ir.Read("x", (ir.Affine(((1, "i"),), 1), ir.Affine(((1, "h"), (1, "r")))))))
    ['i']
    """
    return frozenset(position.terms[0][1] for node in ir.walk(expr) if isinstance(node, ir.Read)
                     for position in node.positions if isinstance(position, ir.Affine) and len(position.terms) == 1)


def plain_axes(read: ir.Read) -> list[ir.Tensor]:
    """The plain references hidden in a Read, for size bookkeeping: the read tensor with its non-plain axes
    labelled :data:`NOT_PLAIN`, and each gather tensor with its indices.

    >>> [ir.format_expr(t) for t in plain_axes(ir.Read("E", (ir.Gather("t", ("b",)), "d")))]
    ['E[#,d]', 't[b]']
    """
    own = ir.Tensor(read.name, tuple(p if isinstance(p, str) else NOT_PLAIN for p in read.positions), span=read.span)
    return [own, *(ir.Tensor(gather.name, gather.indices, span=read.span) for gather in read.gathers)]


def position_bounds(position: ir.Affine, sizes: Mapping[str, int]) -> tuple[int, int]:
    """The least and greatest value of an affine position over its indices' ranges (all sizes positive).

    >>> position_bounds(ir.Affine(((2, "h"), (1, "r")), -1), {"h": 4, "r": 3})
    (-1, 7)
    """
    low = high = position.offset
    for coefficient, index in position.terms:
        reach = coefficient * (sizes[index] - 1)
        low += min(reach, 0)
        high += max(reach, 0)
    return low, high


#: the name a delta's position reads under while ranges are inferred (it never reads outside: it is 0 there)
_DELTA = "#delta "


def _describe(read: ir.Read, axis: int) -> str:
    return f"{ir.format_expr(read)} (axis {axis} of '{read.name}')"


def infer_ranges(reads: list[ir.Read], sizes: dict[str, int], padded: frozenset[str],
                 shapes: Mapping[str, tuple[int, ...]], source: str | None) -> dict[str, int]:
    """Sizes for the indices only affine reads mention, by Tullio's rule, then every affine position checked.

    An index without a size gets the largest range in which every read it takes part in (with its other
    indices known) stays inside its axis: the intersection. Then each affine position must stay inside its
    axis, unless one of its indices has a declared size (``padded``: such a read outside reads 0). ``sizes``
    holds the sizes known so far and is updated; a ``ShapeError`` names the read otherwise.

    >>> x = ir.Read("x", (ir.Affine(((1, "h"), (1, "r"))),))
    >>> infer_ranges([x], {"r": 3}, frozenset(), {"x": (10,)}, None)
    {'r': 3, 'h': 8}
    """
    affine = [(read, axis, position) for read in reads for axis, position in enumerate(read.positions)
              if isinstance(position, ir.Affine)]
    lenient = {id(read) for read in reads if read.name.startswith(_DELTA)}
    changed = True
    while changed:
        changed = False
        limits: dict[str, int] = {}
        for read, axis, position in affine:
            unknown = [(c, index) for c, index in position.terms if index not in sizes]
            if len(unknown) != 1:
                continue
            coefficient, index = unknown[0]
            known = ir.Affine(tuple(t for t in position.terms if t[1] != index), position.offset)
            if any(sizes[i] == 0 for i in known.indices):
                continue
            low, high = position_bounds(known, sizes)
            length = shapes[read.name][axis]
            if id(read) in lenient:
                low, high = max(low, 0), min(high, length - 1)
            if coefficient > 0:
                if low < 0:
                    raise ShapeError(located(
                        f"{_describe(read, axis)} reads position {low} at {index} = 0, before the axis starts; "
                        f"declare the size of '{index}' with 'size {index} = ...' to read zeros there",
                        read.span, source))
                limit = (length - 1 - high) // coefficient + 1
            else:
                if high > length - 1:
                    raise ShapeError(located(
                        f"{_describe(read, axis)} reads position {high} at {index} = 0, past the axis' length "
                        f"{length}; declare the size of '{index}' with 'size {index} = ...' to read zeros there",
                        read.span, source))
                limit = low // -coefficient + 1
            limits[index] = min(limits.get(index, max(limit, 0)), max(limit, 0))
        for index, limit in limits.items():
            sizes[index] = limit
            changed = True
    changed = True
    while changed:  # the intersection: an index a plain read sizes shrinks to what its affine reads allow
        changed = False
        for read, axis, position in affine:
            if id(read) in lenient or set(position.indices) & padded or not set(position.indices) <= sizes.keys():
                continue
            for coefficient, index in position.terms:
                known = ir.Affine(tuple(t for t in position.terms if t[1] != index), position.offset)
                if sizes[index] == 0 or any(sizes[i] == 0 for i in known.indices):
                    continue
                low, high = position_bounds(known, sizes)
                length = shapes[read.name][axis]
                limit = (length - 1 - high) // coefficient + 1 if coefficient > 0 else low // -coefficient + 1
                if 0 <= limit < sizes[index]:
                    sizes[index] = limit
                    changed = True
    for read, axis, position in affine:
        missing = [index for index in position.indices if index not in sizes]
        if missing:
            raise ShapeError(located(
                f"the ranges of {', '.join(repr(i) for i in missing)} in {_describe(read, axis)} cannot be inferred: "
                f"no other read gives them; declare one with 'size {missing[0]} = ...'", read.span, source))
        length = shapes[read.name][axis]
        if id(read) in lenient:
            continue
        if not position.terms:
            if not 0 <= position.offset < length:
                raise ShapeError(located(
                    f"{_describe(read, axis)} reads position {position.offset}, outside the axis of length {length}",
                    read.span, source))
            continue
        if any(sizes[index] == 0 for index in position.indices) or set(position.indices) & padded:
            continue
        low, high = position_bounds(position, sizes)
        if low < 0 or high >= length:
            ranges = ", ".join(f"{index} < {sizes[index]}" for index in position.indices)
            raise ShapeError(located(
                f"{_describe(read, axis)} reads positions {low}..{high} ({ranges}), outside the axis of length "
                f"{length}; only indices with a declared size read zeros outside (declare one with 'size')",
                read.span, source))
    return sizes
