"""Positions (LANGUAGE.md 8.2) as algebra: substituting a position for an index, and reading a tensor through a
delta of a position (``x[p] delta[p, h+r]`` is ``x[h+r]``). The lowering and the derivation share these."""

from __future__ import annotations

from einflow.lang import ir
from einflow.lang.indices import indices_in

__all__ = ["compose", "read_through", "solve_through"]


def compose(position: ir.Position, index: str, value: ir.Affine | ir.Gather) -> ir.Position | None:
    """``position`` with ``index`` replaced by the position ``value`` (None where that is no position).

    >>> compose(ir.Affine(((2, "p"), (1, "s"))), "p", ir.Affine(((1, "h"),), 1))
    Affine(terms=((2, 'h'), (1, 's')), offset=2)
    """
    if isinstance(position, str):
        return value if position == index else position
    if isinstance(position, ir.Gather) or index not in position.indices:
        return None if isinstance(position, ir.Gather) and index in position.indices else position
    if isinstance(value, ir.Gather):
        return None
    coefficient = dict((i, c) for c, i in position.terms)[index]
    terms: dict[str, int] = {}
    for c, i in position.terms:  # the substituted terms where the index was
        for c2, i2 in ((coefficient * c3, i3) for c3, i3 in value.terms) if i == index else ((c, i),):
            terms[i2] = terms.get(i2, 0) + c2
    return ir.Affine(tuple((c, i) for i, c in terms.items() if c), position.offset + coefficient * value.offset)


def _substituted(factor: ir.Expr, index: str, value: ir.Affine | ir.Gather, mode: str = "zeros") -> ir.Expr | None:
    """``factor`` reading ``value`` where it read ``index``; outside its axis as ``mode`` says (a read that
    already folds otherwise, or reads zeros, keeps its delta: one read has one mode)."""
    if not isinstance(factor, (ir.Tensor, ir.Read)) or isinstance(factor, ir.Read) and factor.mode != mode:
        return None
    positions = factor.indices if isinstance(factor, ir.Tensor) else factor.positions
    found = [compose(position, index, value) for position in positions]
    if any(position is None for position in found):
        return None
    return ir.Read(factor.name, tuple(found), mode)  # type: ignore[arg-type]


def read_through(factors: tuple[ir.Expr, ...], summed: frozenset[str]) -> tuple[tuple[ir.Expr, ...],
                                                                                 list[ir.ShiftDelta]]:
    """Substitute each delta of a position whose index is summed into the reads of that index
    (``x[p] delta[p, h+r]`` -> ``x[h+r]``, zero outside ``x``); the deltas left over scatter.

    >>> factors = (ir.Tensor("x", ("p",)), ir.ShiftDelta("p", ir.Affine(((1, "h"), (1, "r")))))
    >>> read_through(factors, frozenset({"p"}))
    ((Read(name='x', positions=(Affine(terms=((1, 'h'), (1, 'r')), offset=0),), mode='zeros'),), [])
    """
    current = list(factors)
    for shift in [factor for factor in factors if isinstance(factor, ir.ShiftDelta)]:
        if shift.index not in summed:
            continue
        users = [k for k, factor in enumerate(current) if factor is not shift and shift.index in _mentions(factor)]
        replaced = {k: _substituted(current[k], shift.index, shift.position, shift.mode) for k in users}
        if not users or any(value is None for value in replaced.values()):
            continue
        current = [replaced.get(k, factor) for k, factor in enumerate(current) if factor is not shift]  # type: ignore
    return tuple(current), [factor for factor in current if isinstance(factor, ir.ShiftDelta)]


def _mentions(factor: ir.Expr) -> tuple[str, ...]:
    if isinstance(factor, (ir.Tensor, ir.Read, ir.ShiftDelta)):
        return factor.indices
    if isinstance(factor, ir.Delta):
        return (factor.first, factor.second)
    return tuple(indices_in(factor))



def solve_through(factors: tuple[ir.Expr, ...], summed: frozenset[str]) -> tuple[ir.Expr, ...]:
    """A kept delta of a unit-stride position solved for its first summed index, substituted into the reads
    of that index: ``g[h] k[r] delta[p, h + r]`` summed over ``h`` is ``g[p - r] k[r]`` (zero outside ``g``),
    a transposed convolution as a correlation of the padded cotangent, with no scatter.

    Only positions whose coefficients are all 1 or -1 are solved (a strided one scatters: solving it
    for the kernel index would read a window as large as the image times the output), and only for an index a
    plain read sizes (its range is then the read's zero padding; ``delta[q, h + r] delta[p, h + r2]`` keeps
    ``h``, whose range nothing else would hold).

    >>> factors = (ir.Tensor("g", ("h",)), ir.Tensor("k", ("r",)), ir.ShiftDelta("p", ir.Affine(((1, "h"), (1, "r")))))
    >>> [ir.format_expr(f) for f in solve_through(factors, frozenset({"h", "r"}))]
    ['g[p - r]', 'k[r]']
    """
    current = list(factors)
    for shift in [f for f in factors if isinstance(f, ir.ShiftDelta)]:
        position = shift.position
        if shift.index in summed or not isinstance(position, ir.Affine) or shift.mode != "zeros" or \
                any(abs(c) != 1 for c, _ in position.terms):  # (a folded delta scatters: no read inverts it)
            continue
        for coefficient, index in position.terms:
            if index not in summed:
                continue
            users = [k for k, f in enumerate(current) if f is not shift and index in _mentions(f)]
            if not any(isinstance(current[k], ir.Tensor) or isinstance(current[k], ir.Read)
                       and index in current[k].positions for k in users):  # type: ignore[union-attr]
                continue  # no plain read gives the index its range: substituted, the range would be lost
            # index = coefficient * (p - offset - the other terms)
            value = ir.Affine(((coefficient, shift.index),
                               *((-coefficient * c, i) for c, i in position.terms if i != index)),
                              -coefficient * position.offset)
            replaced = {k: _substituted(current[k], index, value) for k in users}
            if not users or any(v is None for v in replaced.values()):
                continue
            current = [replaced.get(k, f) for k, f in enumerate(current) if f is not shift]  # type: ignore[misc]
            break
    return tuple(current)
