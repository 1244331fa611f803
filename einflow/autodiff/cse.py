"""Sharing work in derivative programs: reuse forward values by name, hoist repeated sub-expressions.

Finding repeats must stay cheap on deep programs (a chain of 100 nested functions): every node gets a
fingerprint, computed bottom up once per pass, that ignores index names and factor order. Equal
canonical keys imply equal fingerprints, so the (costlier) canonical key is computed only for nodes
whose fingerprint occurs more than once.
"""

from __future__ import annotations

from collections.abc import Callable

from einflow import ir
from einflow.autodiff.canonical import bound_inside, canonical_key
from einflow.autodiff.normal import Fresh, rename

__all__ = ["reuse_forward", "hoist_repeated", "coefficients_out"]

_Candidate = (ir.Call, ir.Power, ir.Sum, ir.Reduce, ir.Normalize, ir.Binary)


class _Shapes:
    """Per-node facts computed bottom up and memoised by node identity (valid while the trees live)."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[int, int, bool, ir.Expr]] = {}

    def facts(self, node: ir.Expr) -> tuple[int, int, bool]:
        """(fingerprint, number of nodes, contains a function or a sum)."""
        found = self._memo.get(id(node))
        if found is not None:
            return found[:3]
        kids = [self.facts(child) for child in ir.children(node)]
        size = 1 + sum(k[1] for k in kids)
        shares = isinstance(node, (ir.Call, ir.Reduce, ir.Normalize, ir.Binary)) or any(k[2] for k in kids)
        prints = [k[0] for k in kids]
        if isinstance(node, ir.Tensor):
            payload: tuple = ("T", node.name, len(node.indices))
        elif isinstance(node, ir.Delta):
            payload = ("D",)
        elif isinstance(node, ir.Num):
            payload = ("N", node.value, type(node.value).__name__)
        elif isinstance(node, ir.Product):
            payload = ("P", tuple(sorted(prints)))  # canonical keys sort factors
        elif isinstance(node, ir.Sum):
            payload = ("S", tuple(prints))
        elif isinstance(node, ir.Call):
            payload = ("C", node.func, *prints)
        elif isinstance(node, ir.Power):
            payload = ("W", node.exponent, *prints)
        elif isinstance(node, ir.Normalize):
            payload = ("Z", node.kind, len(node.indices), *prints)
        elif isinstance(node, ir.Binary):
            payload = ("B", node.func, *prints)
        else:
            assert isinstance(node, ir.Reduce)
            payload = ("R", node.kind, len(node.indices), *prints)
        facts = (hash(payload), size, shares)
        self._memo[id(node)] = (*facts, node)  # keep the node alive so its id is not reused
        return facts


def _map(expr: ir.Expr, replace: Callable[[ir.Expr], ir.Expr | None]) -> ir.Expr:
    """``expr`` with each outermost node that ``replace`` maps to something replaced by it."""
    found = replace(expr)
    if found is not None:
        return found
    if isinstance(expr, ir.Product):
        return ir.product(*(_map(f, replace) for f in expr.factors))
    return ir.with_children(expr, tuple(_map(c, replace) for c in ir.children(expr)))


def reuse_forward(forward: list[ir.Assign], statements: list[ir.Assign]) -> list[ir.Assign]:
    """Replace sub-expressions equal (up to index names) to a forward statement's right side by its target."""
    shapes = _Shapes()
    known: dict[ir.Expr, tuple[str, list[str], tuple[str, ...]]] = {}
    prints: set[int] = set()
    for statement in forward:
        if isinstance(statement.expr, _Candidate) and statement.target:
            key, free = canonical_key(statement.expr)
            if set(free) == set(statement.indices or ()):
                known.setdefault(key, (statement.target, free, statement.indices or ()))
                prints.add(shapes.facts(statement.expr)[0])
    if not known:
        return statements

    def replace(node: ir.Expr) -> ir.Expr | None:
        if not isinstance(node, _Candidate) or shapes.facts(node)[0] not in prints:
            return None
        key, free = canonical_key(node)
        hit = known.get(key)
        if hit is None:
            return None
        name, order, indices = hit
        mapping = dict(zip(order, free))
        return ir.Tensor(name, tuple(mapping[i] for i in indices))

    return [ir.Assign(s.target, s.indices, _map(s.expr, replace)) for s in statements]


def _largest_repeat(statements: list[ir.Assign], shapes: _Shapes) -> tuple[ir.Expr, ir.Expr, int, int] | None:
    """(canonical key, an example, its fingerprint, first statement) of the largest repeated candidate."""
    groups: dict[int, list[tuple[ir.Expr, int]]] = {}
    for position, statement in enumerate(statements):
        for node in ir.walk(statement.expr):
            if isinstance(node, _Candidate):
                fingerprint, _, shares = shapes.facts(node)
                if shares:
                    groups.setdefault(fingerprint, []).append((node, position))
    repeated = [group for group in groups.values() if len(group) >= 2]
    repeated.sort(key=lambda group: -shapes.facts(group[0][0])[1])
    for group in repeated:
        by_key: dict[ir.Expr, list[tuple[ir.Expr, int]]] = {}
        for node, position in group:
            by_key.setdefault(canonical_key(node)[0], []).append((node, position))
        for key, nodes in by_key.items():
            if len(nodes) >= 2:
                example, _ = nodes[0]
                return key, example, shapes.facts(example)[0], min(position for _, position in nodes)
    return None


def hoist_repeated(statements: list[ir.Assign], fresh: Fresh, names: Fresh, ranks: dict[str, int]) -> list[ir.Assign]:
    """Give sub-expressions that occur twice or more (and contain a function or a sum) their own statement."""
    for _ in range(32):
        shapes = _Shapes()
        found = _largest_repeat(statements, shapes)
        if found is None:
            return statements
        key, example, fingerprint, first = found
        _, free = canonical_key(example)
        target_indices = tuple(fresh.index(i) for i in free)
        body = rename(example, dict(zip(free, target_indices)))
        body = rename(body, {i: fresh.index(i) for i in bound_inside(body)})
        name = names.pick([f"t{n}" for n in range(1, 100)], "t")
        ranks[name] = len(target_indices)

        def replace(node: ir.Expr, key: ir.Expr = key, name: str = name, shapes: _Shapes = shapes,
                    fingerprint: int = fingerprint) -> ir.Expr | None:
            if not isinstance(node, _Candidate) or shapes.facts(node)[0] != fingerprint:
                return None
            node_key, node_free = canonical_key(node)
            if node_key != key:
                return None
            return ir.Tensor(name, tuple(node_free))

        updated = [ir.Assign(s.target, s.indices, _map(s.expr, replace)) for s in statements]
        statements = updated[:first] + [ir.Assign(name, target_indices, body)] + updated[first:]
    return statements


def coefficients_out(statement: ir.Assign) -> ir.Assign:
    """``statement`` with numbers moved out of sums, ``sum[f](-1 X[s,f] w[f])`` -> ``-sum[f](X[s,f] w[f])``.

    This is the simplifier's form, so a forward value and its copy in a derivative compare equal.
    Returns ``statement`` itself when nothing moves.
    """

    def out(node: ir.Expr) -> ir.Expr:
        kids = ir.children(node)
        if kids:
            moved = tuple(out(kid) for kid in kids)
            if any(new is not old for new, old in zip(moved, kids)):
                node = ir.product(*moved) if isinstance(node, ir.Product) else ir.with_children(node, moved)
        if isinstance(node, ir.Reduce) and node.kind == "sum" and isinstance(node.body, ir.Product):
            numbers = [f for f in node.body.factors if isinstance(f, ir.Num)]
            rest = [f for f in node.body.factors if not isinstance(f, ir.Num)]
            if numbers and rest:
                return ir.product(*numbers, ir.Reduce(node.indices, ir.product(*rest)))
        return node

    expr = out(statement.expr)
    return statement if expr is statement.expr else ir.Assign(statement.target, statement.indices, expr)
