"""Sharing work in derivative programs: reuse forward values by name, hoist repeated sub-expressions.

Finding repeats must stay cheap on deep programs (a chain of 100 nested functions): every node gets a
fingerprint, computed bottom up once per pass, that ignores index names and factor order. Equal
canonical keys imply equal fingerprints, so the (costlier) canonical key is computed only for nodes
whose fingerprint occurs more than once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from einflow.derive.canonical import bound_inside, canonical_key
from einflow.derive.normal import Fresh, rename
from einflow.derive.shifts import PSEUDO
from einflow.lang import ir

__all__ = ["reuse_forward", "hoist_repeated", "hoist_shared_products", "coefficients_out"]

_Candidate = (ir.Call, ir.Power, ir.Sum, ir.Reduce, ir.Normalize, ir.Binary, ir.Linalg)

#: a subset of a product's factors that statements may share: (signature, node, product, summed indices, subset)
_Subset = tuple[tuple[int, ...], ir.Expr, ir.Product, frozenset[str], tuple[int, ...]]


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
        shares = isinstance(node, (ir.Call, ir.Reduce, ir.Normalize, ir.Binary, ir.Linalg)) or any(k[2] for k in kids)
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
        elif isinstance(node, ir.Linalg):
            payload = ("L", node.kind, *prints)
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
        if not statement.target:
            continue
        # as written, and as the simplifier writes derivatives (numbers folded and moved out of sums:
        # ``exp(Q[n,d] K[m,d] / 8)`` is found again as ``exp(0.125 sum[d](K[m,d] Q[n,d]))``)
        for expr in dict.fromkeys((statement.expr, _simplified(statement.expr))):
            if isinstance(expr, _Candidate):
                key, free = canonical_key(expr)
                if set(free) == set(statement.indices or ()):
                    known.setdefault(key, (statement.target, free, statement.indices or ()))
                    prints.add(shapes.facts(expr)[0])
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


def _simplified(expr: ir.Expr) -> ir.Expr:
    """``expr`` as the simplifier writes it, with numbers outside sums (the form derivatives take)."""
    from einflow.derive.simplify import simplify

    return coefficients_out(ir.Assign(None, None, simplify(expr))).expr


def _largest_repeats(statements: list[ir.Assign], shapes: _Shapes) -> list[tuple[ir.Expr, ir.Expr, int, int]]:
    """(canonical key, an example, its fingerprint, first statement) of the largest repeated candidate, then of
    the next largest as long as hoisting the ones before leaves them as they are (none lies inside an occurrence
    of one before, nor shares its fingerprint): one pass finds what one hoist per pass would find next, in
    that order (checked byte for byte on the derivative tests' programs)."""
    groups: dict[int, list[tuple[ir.Expr, int]]] = {}
    for position, statement in enumerate(statements):
        for node in ir.walk(statement.expr):
            if isinstance(node, _Candidate):
                fingerprint, _, shares = shapes.facts(node)
                if shares:
                    groups.setdefault(fingerprint, []).append((node, position))
    repeated = [group for group in groups.values() if len(group) >= 2]
    repeated.sort(key=lambda group: -shapes.facts(group[0][0])[1])
    found: list[tuple[ir.Expr, ir.Expr, int, int]] = []
    inside: set[int] = set()  # the nodes within the occurrences of those found
    for group in repeated:
        by_key: dict[ir.Expr, list[tuple[ir.Expr, int]]] = {}
        for node, position in group:
            by_key.setdefault(canonical_key(node)[0], []).append((node, position))
        for key, nodes in by_key.items():
            if len(nodes) < 2:
                continue
            fingerprint = shapes.facts(nodes[0][0])[0]
            if found and (any(id(node) in inside for node, _ in nodes) or fingerprint in {f[2] for f in found}):
                return found  # hoisting the ones found changes this group: the next pass looks again
            found.append((key, nodes[0][0], fingerprint, min(position for _, position in nodes)))
            inside.update(id(within) for node, _ in nodes for within in ir.walk(node))
    return found


def hoist_repeated(statements: list[ir.Assign], fresh: Fresh, names: Fresh, ranks: dict[str, int]) -> list[ir.Assign]:
    """Give sub-expressions that occur twice or more (and contain a function or a sum) their own statement.

    Largest first; a pass hoists every repeat that the ones before it in the pass leave unchanged, so a deep
    chain's hundred repeated factors take one pass, not a hundred."""
    for _ in range(32):
        shapes = _Shapes()
        found = _largest_repeats(statements, shapes)
        if not found:
            return statements
        hoisted: dict[int, list[tuple[ir.Expr, str]]] = {}
        before: dict[int, list[ir.Assign]] = {}
        for key, example, fingerprint, first in found:
            _, free = canonical_key(example)
            target_indices = tuple(fresh.index(i) for i in free)
            body = rename(example, dict(zip(free, target_indices)))
            body = rename(body, {i: fresh.index(i) for i in bound_inside(body)})
            name = names.pick([f"t{n}" for n in range(1, 100)], "t")
            ranks[name] = len(target_indices)
            hoisted.setdefault(fingerprint, []).append((key, name))
            before.setdefault(first, []).append(ir.Assign(name, target_indices, body))

        def replace(node: ir.Expr, shapes: _Shapes = shapes,
                    hoisted: dict[int, list[tuple[ir.Expr, str]]] = hoisted) -> ir.Expr | None:
            if not isinstance(node, _Candidate):
                return None
            candidates = hoisted.get(shapes.facts(node)[0])
            if candidates is None:
                return None
            node_key, node_free = canonical_key(node)
            return next((ir.Tensor(name, tuple(node_free)) for key, name in candidates if key == node_key), None)

        updated: list[ir.Assign] = []
        for position, statement in enumerate(statements):
            updated.extend(before.get(position, ()))
            updated.append(ir.Assign(statement.target, statement.indices, _map(statement.expr, replace)))
        statements = updated
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


#: products with more factors than this are left alone (their subsets are too many to compare)
_MOST_FACTORS = 8
#: the uniform index size the cost check plans with (sizes are unknown while deriving)
_PLANNING_SIZE = 64
#: contracting a shared group first may cost a product this much more than its own best order (one more
#: pass over an intermediate); what it must never do is raise the order of the cost (a matrix-matrix
#: product where a reader had matrix-vector ones)
_SLACK = 1.1


class _Occurrence:
    """A subset of a product's factors: where it is, and which of its indices the product sums only there."""

    __slots__ = ("statement", "node", "subset", "free", "internal")

    def __init__(self, statement: int, node: ir.Expr, subset: tuple[int, ...], free: list[str],
                 internal: frozenset[str]) -> None:
        self.statement, self.node, self.subset = statement, node, subset
        #: the subset's indices in its canonical order (position k of every occurrence means the same axis)
        self.free = free
        #: indices the surrounding sum binds that no factor outside the subset reads
        self.internal = internal


def _free_indices(expr: ir.Expr) -> list[str]:
    found = _FREE.get(id(expr))
    if found is not None and found[0] is expr:
        return found[1]
    bound = set(bound_inside(expr))
    free = [index for index in dict.fromkeys(_indices_of(expr)) if index not in bound]
    if len(_FREE) > 65536:
        _FREE.clear()
    _FREE[id(expr)] = (expr, free)  # the node is kept with its entry, so its id stays its own
    return free


#: expression id -> (expression, its free indices): a memo that lives across derivations (bounded)
_FREE: dict[int, tuple[ir.Expr, list[str]]] = {}


def _indices_of(expr: ir.Expr) -> list[str]:
    found: list[str] = []
    for node in ir.walk(expr):
        if isinstance(node, ir.Tensor):
            found.extend(node.indices)
        elif isinstance(node, ir.Delta):
            found.extend((node.first, node.second))
    return found


def _products(expr: ir.Expr) -> list[tuple[ir.Expr, ir.Product, frozenset[str]]]:
    """(node to replace, its product, the indices summed right around it) for every product in ``expr``.

    A product that is the body of a sum is replaced with its sum (``sum[o](W2[q,o] t1[o,n])``).
    """
    found: list[tuple[ir.Expr, ir.Product, frozenset[str]]] = []

    def visit(node: ir.Expr) -> None:
        if isinstance(node, ir.Reduce) and node.kind == "sum" and isinstance(node.body, ir.Product):
            found.append((node, node.body, frozenset(node.indices)))
            for factor in node.body.factors:
                visit(factor)
            return
        if isinstance(node, ir.Product):
            found.append((node, node, frozenset()))
        for child in ir.children(node):
            visit(child)

    visit(expr)
    return found


def _path_cost(terms: list[list[str]], output: list[str]) -> int:
    """FLOPs of the best pairwise order of an einsum of ``terms`` into ``output``, every index of one size."""
    import opt_einsum as oe

    letters: dict[str, str] = {}
    for index in [*(i for term in terms for i in term), *output]:
        letters.setdefault(index, oe.get_symbol(len(letters)))
    if not terms:
        return 0
    equation = ",".join("".join(letters[i] for i in term) for term in terms)
    equation += "->" + "".join(letters[i] for i in output)
    return _equation_cost(equation)


@functools.lru_cache(maxsize=4096)
def _equation_cost(equation: str) -> int:
    import opt_einsum as oe

    shapes = [(_PLANNING_SIZE,) * len(term) for term in equation.split("->")[0].split(",")]
    return int(oe.contract_path(equation, *shapes, shapes=True, optimize="dp")[1].opt_cost)


def _costs(product: ir.Product, summed: frozenset[str], subset: tuple[int, ...], keep: list[str]) -> tuple[int, int]:
    """(FLOPs of the product as it is, FLOPs with the subset contracted first into ``keep``) at uniform sizes."""
    factors = [f for f in product.factors if not isinstance(f, ir.Num)]
    terms = [_free_indices(f) for f in factors]
    every = [i for term in terms for i in term]
    output = [i for i in dict.fromkeys(every) if i not in summed]
    # scalar factors are a scale applied once, not a pairwise step: planned without them
    whole = _path_cost([term for term in terms if term], output)
    inner = _path_cost([terms[k] for k in subset if terms[k]], keep)
    rest = [terms[k] for k in range(len(terms)) if k not in subset and terms[k]] + [keep]
    return whole, inner + (_path_cost(rest, output) if len(rest) > 1 or set(keep) != set(output) else 0)


def hoist_shared_products(statements: list[ir.Assign], fresh: Fresh, names: Fresh,
                          ranks: dict[str, int]) -> list[ir.Assign]:
    """Give a group of factors that several products share its own statement (a shared adjoint, computed once).

    ``dL_dW1[p,q] = sum[n,o](X[n,p] W2[q,o] t2[q,n] t1[o,n])`` and ``dL_db1[r] = sum[n,o](W2[r,o] t2[r,n]
    t1[o,n])`` share ``a[q,n] = sum[o](W2[q,o] t2[q,n] t1[o,n])`` (the adjoint through tanh): it becomes a
    statement and both products read it. A group is shared only where contracting it first costs no more
    than each product's own best order (counted with every index of one size), so a matrix product that
    one reader would contract with a vector first is not formed. The largest shared group goes first.
    """
    memo: dict[tuple[int, tuple[int, ...]], tuple[ir.Expr, list[str], ir.Product]] = {}
    shapes = _Shapes()  # fingerprints by node identity: the nodes a pass leaves alone keep theirs
    subsets: dict[int, tuple[ir.Expr, list[_Subset]]] = {}  # a statement's factor subsets, by its identity
    for _ in range(32):
        found = _largest_shared(statements, memo, shapes, subsets)
        if not found:
            return statements
        replacements: dict[int, dict[int, ir.Expr]] = {}
        before: dict[int, list[ir.Assign]] = {}
        for group, internal_positions, existing in found:
            first = group[0]
            keep_positions = [k for k in range(len(first.free)) if k not in internal_positions]
            if existing is not None:
                # a statement computes the group already (its whole right side): the others read its target
                statement = statements[existing.statement]
                assert statement.target is not None
                name, order = statement.target, [existing.free.index(i) for i in statement.indices or ()]
                group = [occurrence for occurrence in group if occurrence is not existing]
            else:
                product = _product_of(first)
                example = ir.product(*(product.factors[k] for k in first.subset))
                target_indices = tuple(fresh.index(first.free[k]) for k in keep_positions)
                summed_indices = tuple(fresh.index(first.free[k]) for k in internal_positions)
                mapping = dict(zip([first.free[k] for k in keep_positions], target_indices))
                mapping.update(zip([first.free[k] for k in internal_positions], summed_indices))
                body = rename(example, mapping)
                body = rename(body, {i: fresh.index(i) for i in bound_inside(body) if i not in summed_indices})
                if summed_indices:
                    body = ir.Reduce(summed_indices, body)
                name, order = names.pick([f"t{n}" for n in range(1, 100)], "t"), keep_positions
                ranks[name] = len(target_indices)
                at = min(occurrence.statement for occurrence in group)
                before.setdefault(at, []).append(ir.Assign(name, target_indices, body))
            for occurrence in group:
                replacements.setdefault(occurrence.statement, {})[id(occurrence.node)] = _replaced(
                    occurrence, name, order, internal_positions)
        updated: list[ir.Assign] = []
        for position, statement in enumerate(statements):
            updated.extend(before.get(position, ()))
            table = replacements.get(position)
            if table is None:
                updated.append(statement)
                continue
            expr = _map(statement.expr, _lookup(table))
            updated.append(ir.Assign(statement.target, statement.indices, expr))
        statements = updated
    return statements


def _lookup(table: dict[int, ir.Expr]) -> Callable[[ir.Expr], ir.Expr | None]:
    """``_map``'s replacement: the node's entry in ``table`` (by identity), else None."""
    return lambda node: table.get(id(node))


def _whole_statement(occurrence: _Occurrence, statements: list[ir.Assign], internal: frozenset[int]) -> bool:
    """Whether the occurrence is the whole right side of its statement (which then computes the group)."""
    statement = statements[occurrence.statement]
    product = _product_of(occurrence)
    if statement.expr is not occurrence.node or statement.target is None or len(occurrence.subset) != len(
            product.factors):
        return False
    summed = set(occurrence.node.indices) if isinstance(occurrence.node, ir.Reduce) else set()
    kept = [i for k, i in enumerate(occurrence.free) if k not in internal]
    return summed == {occurrence.free[k] for k in internal} and sorted(kept) == sorted(statement.indices or ())


def _product_of(occurrence: _Occurrence) -> ir.Product:
    node = occurrence.node
    product = node.body if isinstance(node, ir.Reduce) else node
    assert isinstance(product, ir.Product)
    return product


def _replaced(occurrence: _Occurrence, name: str, keep: list[int], internal: frozenset[int]) -> ir.Expr:
    """The occurrence's product (and its sum) with the subset's factors replaced by ``name`` (its axes: the
    subset's indices at the canonical positions ``keep``)."""
    product = _product_of(occurrence)
    rest = [f for k, f in enumerate(product.factors) if k not in occurrence.subset]
    tensor = ir.Tensor(name, tuple(occurrence.free[k] for k in keep))
    replaced = ir.product(*rest, tensor)
    node = occurrence.node
    if isinstance(node, ir.Reduce):
        summed_here = {occurrence.free[k] for k in internal}
        remaining = tuple(i for i in node.indices if i not in summed_here)
        if remaining:
            return ir.Reduce(remaining, replaced)
    return replaced


def _largest_shared(statements: list[ir.Assign],
                    memo: dict[tuple[int, tuple[int, ...]], tuple[ir.Expr, list[str], ir.Product]] | None = None,
                    shapes: _Shapes | None = None,
                    subsets: dict[int, tuple[ir.Expr, list[_Subset]]] | None = None,
                    ) -> list[tuple[list[_Occurrence], frozenset[int], _Occurrence | None]]:
    """For the largest group of factors that two or more products share: its occurrences, the positions (in
    canonical order) of the indices the shared statement sums, and the occurrence that is a whole statement's
    right side if there is one; then the same for the next largest groups as long as each lies in statements
    that the groups before it leave unchanged: the order one group per pass finds them in, unless a rewritten
    product makes a new shared group that would come first (none does in the derivative tests' programs).
    Empty when no group pays."""
    shapes = shapes if shapes is not None else _Shapes()
    by_print: dict[tuple[int, ...], list[tuple[int, ir.Expr, ir.Product, frozenset[str], tuple[int, ...]]]] = {}
    for position, statement in enumerate(statements):
        for signature, node, product, summed, subset in _subsets(statement.expr, shapes, subsets):
            by_print.setdefault(signature, []).append((position, node, product, summed, subset))
    candidates = [group for group in by_print.values() if len({(entry[0], id(entry[1])) for entry in group}) >= 2]
    candidates.sort(key=lambda group: -len(group[0][4]))
    found: list[tuple[list[_Occurrence], frozenset[int], _Occurrence | None]] = []
    changed: set[int] = set()  # the statements the groups found rewrite
    for group in candidates:
        if found and any(entry[0] in changed for entry in group):
            return found  # a group found before changes its products: the next pass looks again
        by_key: dict[ir.Expr, list[_Occurrence]] = {}
        for position, node, product, summed, subset in group:
            # canonical keys are kept across passes (a product a pass leaves alone keeps its object;
            # the product itself is kept in the memo so that its id is not reused)
            cached = memo.get((id(product), subset)) if memo is not None else None
            if cached is None:
                example = ir.Product(tuple(product.factors[k] for k in subset))
                key, free = canonical_key(example)
                if memo is not None:
                    memo[(id(product), subset)] = (key, free, product)
            else:
                key, free, _ = cached
            outside = {i for k, f in enumerate(product.factors) if k not in subset for i in _free_indices(f)}
            internal = frozenset(i for i in free if i in summed and i not in outside)
            by_key.setdefault(key, []).append(_Occurrence(position, node, subset, free, internal))
        for occurrences in by_key.values():
            chosen = _one_per_node(occurrences)
            if len(chosen) < 2:
                continue
            internal_positions = frozenset.intersection(*(frozenset(k for k, i in enumerate(o.free) if i in o.internal)
                                                          for o in chosen))
            if not _pays(chosen, internal_positions):
                continue
            if len({o.statement for o in chosen}) < 2:
                # terms of one statement share it: left to that statement (a Hessian's mirrored dense terms
                # stay in the one pass that adds its delta terms in place, with no array as large stored)
                continue
            existing = next((o for o in chosen if _whole_statement(o, statements, internal_positions)), None)
            if existing is not None and existing.statement > min(o.statement for o in chosen):
                continue  # computed by a statement that comes after a reader: left as it is
            found.append((chosen, internal_positions, existing))
            changed.update(o.statement for o in chosen)
            if sum(len(o) >= 2 for o in by_key.values()) > 1:
                return found  # another key of the same factors may follow: the next pass looks again
            break
    return found


def _subsets(expr: ir.Expr, shapes: _Shapes, memo: dict[int, tuple[ir.Expr, list[_Subset]]] | None) -> list[_Subset]:
    """(signature, node, product, summed indices, subset) for every subset of two or more factors of the
    products in ``expr`` that may be shared; kept in ``memo`` by the expression's identity (a statement a
    pass leaves alone keeps its object, so the next pass reads its subsets from there)."""
    found = memo.get(id(expr)) if memo is not None else None
    if found is not None:
        return found[1]
    subsets: list[_Subset] = []
    for node, product, summed in _products(expr):
        arrays = [k for k, f in enumerate(product.factors) if not isinstance(f, ir.Num)]
        if len(arrays) > _MOST_FACTORS or len(arrays) < 2:
            continue
        if any(isinstance(product.factors[k], ir.Delta) for k in arrays):
            continue
        if any(isinstance(f, ir.Tensor) and f.name.startswith(PSEUDO) for f in product.factors):
            continue  # a read through positions stays whole (its deltas give its indices their ranges)
        prints = {k: shapes.facts(product.factors[k])[0] for k in arrays}
        for size in range(2, len(arrays) + 1):
            for subset in _combinations(arrays, size):
                subsets.append((tuple(sorted(prints[k] for k in subset)), node, product, summed, subset))
    if memo is not None:
        memo[id(expr)] = (expr, subsets)  # (the expression is kept so that its id is not reused)
    return subsets


def _one_per_node(occurrences: list[_Occurrence]) -> list[_Occurrence]:
    """One occurrence per product (a product holding the group twice over gives its first)."""
    seen: set[tuple[int, int]] = set()
    chosen = []
    for occurrence in occurrences:
        place = (occurrence.statement, id(occurrence.node))
        if place not in seen:
            seen.add(place)
            chosen.append(occurrence)
    return chosen


def _pays(occurrences: list[_Occurrence], internal: frozenset[int]) -> bool:
    """Whether the group is worth a statement: it has work in it (a sum, or a product of two arrays
    at least), and contracting it first costs each product at most ``_SLACK`` times its own best order."""
    first = occurrences[0]
    product = _product_of(first)
    if not internal and sum(1 for k in first.subset if _free_indices(product.factors[k])) < 2:
        return False  # a number times an array is no work worth a statement
    for occurrence in occurrences:
        product = _product_of(occurrence)
        summed = frozenset(occurrence.node.indices) if isinstance(occurrence.node, ir.Reduce) else frozenset()
        keep = [i for k, i in enumerate(occurrence.free) if k not in internal]
        arrays = [k for k, f in enumerate(product.factors) if not isinstance(f, ir.Num)]
        subset = tuple(arrays.index(k) for k in occurrence.subset)
        whole, forced = _costs(product, summed, subset, keep)
        if forced > _SLACK * whole:
            return False
    return True


def _combinations(items: list[int], size: int) -> list[tuple[int, ...]]:
    from itertools import combinations

    return list(combinations(items, size))
