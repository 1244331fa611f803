"""Sharing work in derivative programs: reuse forward values by name, hoist repeated sub-expressions."""

from __future__ import annotations

from collections.abc import Callable

from einflow import ir
from einflow.autodiff.canonical import bound_inside, canonical_key
from einflow.autodiff.normal import Fresh, rename

__all__ = ["reuse_forward", "hoist_repeated"]

_Candidate = (ir.Call, ir.Power, ir.Sum, ir.Reduce)


def _map(expr: ir.Expr, replace: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr:
    """``expr`` with each outermost node that ``replace`` maps to something replaced by it."""
    found = replace(expr)
    if found is not None:
        return found
    if isinstance(expr, ir.Product):
        return ir.product(*(_map(f, replace) for f in expr.factors))
    return ir.with_children(expr, tuple(_map(c, replace) for c in ir.children(expr)))


def _nodes(expr: ir.Expr) -> list[ir.Expr]:
    return list(ir.walk(expr))


def _worth_sharing(expr: ir.Expr) -> bool:
    return any(isinstance(n, (ir.Call, ir.Reduce)) for n in _nodes(expr))


def reuse_forward(forward: list[ir.Assign], statements: list[ir.Assign]) -> list[ir.Assign]:
    """Replace sub-expressions equal (up to index names) to a forward statement's right side by its target."""
    known: dict[ir.Expr, tuple[str, list[str], tuple[str, ...]]] = {}
    for statement in forward:
        if isinstance(statement.expr, _Candidate) and statement.target:
            key, free = canonical_key(statement.expr)
            if set(free) == set(statement.indices or ()):
                known.setdefault(key, (statement.target, free, statement.indices or ()))
    if not known:
        return statements

    def replace(node: ir.Expr) -> ir.Expr | None:
        if not isinstance(node, _Candidate):
            return None
        key, free = canonical_key(node)
        hit = known.get(key)
        if hit is None:
            return None
        name, order, indices = hit
        mapping = dict(zip(order, free))
        return ir.Tensor(name, tuple(mapping[i] for i in indices))

    return [ir.Assign(s.target, s.indices, _map(s.expr, replace)) for s in statements]


def hoist_repeated(statements: list[ir.Assign], fresh: Fresh, names: Fresh, ranks: dict[str, int]) -> list[ir.Assign]:
    """Give sub-expressions that occur twice or more (and contain a function or a sum) their own statement."""
    for _ in range(32):
        counts: dict[ir.Expr, list[ir.Expr]] = {}
        for statement in statements:
            for node in _nodes(statement.expr):
                if isinstance(node, _Candidate) and _worth_sharing(node):
                    counts.setdefault(canonical_key(node)[0], []).append(node)
        repeated = [(len(_nodes(nodes[0])), key) for key, nodes in counts.items() if len(nodes) >= 2]
        if not repeated:
            return statements
        _, key = max(repeated, key=lambda item: item[0])
        example = counts[key][0]
        _, free = canonical_key(example)
        target_indices = tuple(fresh.index(i) for i in free)
        body = rename(example, dict(zip(free, target_indices)))
        body = rename(body, {i: fresh.index(i) for i in bound_inside(body)})
        name = names.pick([f"t{n}" for n in range(1, 100)], "t")
        ranks[name] = len(target_indices)

        def replace(node: ir.Expr, key: ir.Expr = key, name: str = name) -> ir.Expr | None:
            if not isinstance(node, _Candidate):
                return None
            node_key, node_free = canonical_key(node)
            if node_key != key:
                return None
            return ir.Tensor(name, tuple(node_free))

        first = next(k for k, s in enumerate(statements) if any(
            canonical_key(n)[0] == key for n in _nodes(s.expr) if isinstance(n, _Candidate)))
        updated = [ir.Assign(s.target, s.indices, _map(s.expr, replace)) for s in statements]
        statements = updated[:first] + [ir.Assign(name, target_indices, body)] + updated[first:]
    return statements
