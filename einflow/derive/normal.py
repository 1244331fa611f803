"""Bound normal form: every contraction an explicit sum[...] with program-wide unique index names.

In this form every index occurrence is bound by the statement's target or an enclosing ``Reduce``,
so products can be flattened, reordered and differentiated without any index changing its meaning.
``readable`` turns a normal-form statement back into idiomatic einflow (implicit contractions).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable

from einflow.derive.sizes import IndexSizes, active
from einflow.lang import ir
from einflow.lang.indices import free_indices, indices_in, product_operands, top_level_terms

__all__ = ["Fresh", "rename", "to_normal", "normal_statement", "readable", "tensor_names", "all_index_names"]


def stem_of(name: str) -> str:
    """The user's name behind a generated one: ``k_3`` and ``k_r12_1`` both come from ``k``."""
    return re.sub(r"(_[a-z]?\d+)+$", "", name) or name


class Fresh:
    """Names that collide with nothing in the program (nor with each other)."""

    def __init__(self, taken: Iterable[str] = (), sizes: IndexSizes | None = None) -> None:
        self.taken = set(taken) | set(ir.RESERVED)
        #: new name -> the name it was made from (to trace an index back to a tensor axis)
        self.parent: dict[str, str] = {}
        #: where a new index's size is recorded (it is the size of the index it was made from)
        self.sizes = sizes
        self._next: dict[str, int] = {}  # the next number to try per stem (names are never given back)

    def take(self, name: str) -> str:
        self.taken.add(name)
        return name

    def index(self, base: str) -> str:
        stem = stem_of(base)
        number = self._next.get(stem + "_", 1)
        while f"{stem}_{number}" in self.taken:
            number += 1
        self._next[stem + "_"] = number + 1
        self.parent[f"{stem}_{number}"] = base
        if self.sizes is not None:
            self.sizes.alias(f"{stem}_{number}", base)
        return self.take(f"{stem}_{number}")

    def pick(self, candidates: Iterable[str], fallback: str) -> str:
        for candidate in candidates:
            if candidate not in self.taken:
                return self.take(candidate)
        number = self._next.get(fallback, 1)
        while f"{fallback}{number}" in self.taken:
            number += 1
        self._next[fallback] = number + 1
        return self.take(f"{fallback}{number}")


def _rebuilt(node: ir.Expr, indices: tuple[str, ...], body: ir.Expr) -> ir.Expr:
    """``node`` (a normaliser, reduction or linear-algebra atom) over new indices and a new body."""
    if isinstance(node, ir.Normalize):
        return ir.Normalize(node.kind, indices, body)
    if isinstance(node, ir.Linalg):
        return ir.Linalg(node.kind, indices, body)  # type: ignore[arg-type]
    assert isinstance(node, ir.Reduce)
    return ir.Reduce(indices, body, node.kind)


def rename(expr: ir.Expr, mapping: dict[str, str]) -> ir.Expr:
    """Rename index names everywhere in ``expr`` (safe in normal form, where names are unique)."""
    if not mapping or not (indices_in(expr) & mapping.keys()):
        return expr
    if isinstance(expr, ir.Tensor):
        return ir.Tensor(expr.name, tuple(mapping.get(i, i) for i in expr.indices))
    if isinstance(expr, ir.Delta):
        return ir.Delta(mapping.get(expr.first, expr.first), mapping.get(expr.second, expr.second))
    if ir.reduces(expr):
        return _rebuilt(expr, tuple(mapping.get(i, i) for i in expr.indices), rename(expr.body, mapping))
    if ir.keeps_indices(expr):
        assert isinstance(expr, (ir.Normalize, ir.Linalg))
        renamed = tuple(mapping.get(i, i) for i in expr.indices)
        others = {mapping.get(i, i) for i in indices_in(expr.body) if i not in expr.indices}
        # (also where the normaliser's own index stays and another index of the body is renamed to it, and
        # where two of its indices are renamed to one: softmax[l,a] read at l = a = r)
        clash, seen = [], set()
        for old, new in zip(expr.indices, renamed):
            if new in others or new in seen:
                clash.append((old, new))
            seen.add(new)
        if not clash:
            return _rebuilt(expr, renamed, rename(expr.body, mapping))
        # softmax[k](e[q,k]) at k = q: normalise over a fresh k' and pick k' = q (renaming k to q would merge them)
        fresh = {old: f"{stem_of(old)}_r{next(_APART)}" for old, _ in clash}
        sizes = active()
        if sizes is not None:
            for old, new in fresh.items():
                sizes.alias(new, old)
        inner = _rebuilt(expr, tuple(fresh.get(i, mapping.get(i, i)) for i in expr.indices),
                         rename(expr.body, {**mapping, **fresh}))
        picks = [ir.Delta(fresh[old], new) for old, new in clash]
        return ir.Reduce(tuple(fresh.values()), ir.product(*picks, inner))
    return ir.with_children(expr, tuple(rename(c, mapping) for c in ir.children(expr)))


_APART = itertools.count(1)


def rename_apart(expr: ir.Expr) -> ir.Expr:
    """``expr`` with every index bound inside it renamed to a new name (keeps normal form unique
    when a rule copies a sub-expression). New names keep their stem: ``k_1`` becomes ``k_r17``."""
    inner = dict.fromkeys(i for node in ir.walk(expr) for i in ir.reduced_indices(node))
    if not inner:
        return expr
    mapping = {i: f"{stem_of(i)}_r{next(_APART)}" for i in inner}
    sizes = active()
    if sizes is not None:
        for old, new in mapping.items():
            sizes.alias(new, old)
    return rename(expr, mapping)


def normaliser_merges(factors: list[ir.Expr], old: str, new: str) -> bool:
    """Would renaming ``old`` to ``new`` merge a normaliser's index with another index of its body?"""
    for factor in factors:
        for node in ir.walk(factor):
            if ir.keeps_indices(node):
                assert isinstance(node, (ir.Normalize, ir.Linalg))
                body = indices_in(node.body)
                if (old in node.indices and new in body) or (new in node.indices and old in body):
                    return True
    return False


def tensor_names(expr: ir.Expr) -> set[str]:
    """Names of the tensors ``expr`` reads."""
    return {node.name for node in ir.walk(expr) if isinstance(node, ir.Tensor)}


def all_index_names(program: ir.ProgramIR) -> set[str]:
    """Every index name used anywhere in a program (targets, references, sums, size declarations)."""
    names: set[str] = set()
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            names |= indices_in(statement.expr) | set(statement.indices or ())
        elif isinstance(statement, ir.SizeDecl):
            names |= set(statement.names)
    return names


def _to_normal(expr: ir.Expr, bound: frozenset[str], fresh: Fresh) -> ir.Expr:
    if isinstance(expr, ir.Num):
        return expr
    if isinstance(expr, (ir.Tensor, ir.Delta)):
        return _normal_product((expr,), bound, fresh)
    if isinstance(expr, ir.Product):
        return _normal_product(expr.factors, bound, fresh)
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(_to_normal(t, bound, fresh) for t in expr.terms))
    if isinstance(expr, ir.Call):
        return ir.Call(expr.func, _to_normal(expr.arg, bound, fresh))
    if isinstance(expr, ir.Power):
        return ir.Power(_to_normal(expr.base, bound, fresh), expr.exponent)
    if isinstance(expr, ir.Reduce):
        # every reduction binds its indices exactly as sum does (I1)
        mapping = {index: fresh.index(index) for index in expr.indices}
        body = _rename_free(expr.body, mapping, bound | frozenset(expr.indices))
        inner = bound | frozenset(mapping.values())
        return ir.Reduce(tuple(mapping.values()), _to_normal(body, inner, fresh), expr.kind)
    if isinstance(expr, ir.Normalize):
        # a normaliser binds nothing: its indices are occurrences of indices bound around it
        return ir.Normalize(expr.kind, expr.indices, _to_normal(expr.body, bound, fresh))
    if isinstance(expr, ir.Linalg):  # inv binds nothing (as a normaliser); det and logdet as a reduction
        if not expr.reduces:
            return ir.Linalg(expr.kind, expr.indices, _to_normal(expr.body, bound, fresh))
        mapping = {index: fresh.index(index) for index in expr.indices}
        body = _rename_free(expr.body, mapping, bound | frozenset(expr.indices))
        inner = bound | frozenset(mapping.values())
        return ir.Linalg(expr.kind, (mapping[expr.indices[0]], mapping[expr.indices[1]]),
                         _to_normal(body, inner, fresh))
    if isinstance(expr, ir.Binary):
        return ir.Binary(expr.func, _to_normal(expr.left, bound, fresh), _to_normal(expr.right, bound, fresh))
    raise TypeError(expr)


def _rename_free(expr: ir.Expr, mapping: dict[str, str], bound: frozenset[str]) -> ir.Expr:
    """Rename the occurrences of ``mapping``'s indices that are free in ``expr`` (``bound``: bound around it).

    An index that a nested scope contracts on its own (``exp(x[k] x[k])`` inside ``x[k] y[k] exp(...)``)
    or that a ``sum[...]`` rebinds is that scope's own index and keeps its name.
    """
    if not mapping:
        return expr
    free = set(free_indices(expr, bound))
    mapping = {old: new for old, new in mapping.items() if old in free}
    if not mapping:
        return expr
    if isinstance(expr, (ir.Tensor, ir.Delta, ir.Num)):
        return rename(expr, mapping)
    if ir.reduces(expr):
        return _rebuilt(expr, expr.indices, _rename_free(expr.body, mapping, bound | frozenset(expr.indices)))
    if isinstance(expr, ir.Linalg):
        return ir.Linalg(expr.kind, (mapping.get(expr.indices[0], expr.indices[0]),
                                     mapping.get(expr.indices[1], expr.indices[1])),
                         _rename_free(expr.body, mapping, bound))
    if isinstance(expr, ir.Normalize):
        return ir.Normalize(expr.kind, tuple(mapping.get(i, i) for i in expr.indices),
                            _rename_free(expr.body, mapping, bound))
    return ir.with_children(expr, tuple(_rename_free(c, mapping, bound) for c in ir.children(expr)))


def _normal_product(factors: tuple[ir.Expr, ...], bound: frozenset[str], fresh: Fresh) -> ir.Expr:
    counts: Counter[str] = Counter()
    for indices in product_operands(factors, bound):
        counts.update(indices)
    contracted = [i for i in counts if counts[i] >= 2 and i not in bound]
    mapping = {index: fresh.index(index) for index in contracted}
    inner = bound | frozenset(mapping.values())
    renamed = []
    for factor in factors:
        if isinstance(factor, (ir.Tensor, ir.Delta, ir.Num)):
            renamed.append(rename(factor, mapping))
        else:
            # scope-opening factor: its contracted indices are local (the checker forbids a clash with
            # this product's free ones), so only occurrences free in it are this product's indices
            renamed.append(_to_normal(_rename_free(factor, mapping, bound), inner, fresh))
    body = ir.product(*renamed)
    return ir.Reduce(tuple(mapping.values()), body) if mapping else body


def normal_statement(statement: ir.Assign, fresh: Fresh, target: str) -> ir.Assign:
    """A statement in normal form: explicit target with fresh index names, every sum explicit."""
    if statement.indices is None:
        indices = free_indices(statement.expr)
        expr = statement.expr
    else:
        indices = statement.indices
        expr = statement.expr
    mapping = {index: fresh.index(index) for index in indices}
    bound = frozenset(mapping.values())
    terms = []
    for term in top_level_terms(expr) if statement.indices is not None else (expr,):
        term = _rename_free(term, mapping, frozenset(indices))
        term = _to_normal(term, bound, fresh)
        extra = [i for i in free_indices(term, bound) if i not in bound]
        if extra:
            extra_map = {i: fresh.index(i) for i in extra}
            term = ir.Reduce(tuple(extra_map.values()), rename(term, extra_map))
        terms.append(term)
    body = terms[0] if len(terms) == 1 else ir.Sum(tuple(terms))
    return ir.Assign(target, tuple(mapping.values()), body)


def to_normal(program: ir.ProgramIR, fresh: Fresh, names: dict[int, str]) -> list[ir.Assign]:
    """Normal-form versions of the program's assignments (``names`` gives targets to bare statements).

    With ``fresh.sizes`` set, each new index is tied to the user's name in its own statement (the
    same name in another statement may have another size).
    """
    sizes, fresh.sizes = fresh.sizes, None
    result = []
    for position, statement in enumerate(program.statements):
        if isinstance(statement, ir.Assign):
            target = statement.target if statement.target is not None else names.get(position)
            if target is None:
                continue
            before = set(fresh.parent)
            result.append(normal_statement(statement, fresh, target))
            if sizes is not None:
                for new in fresh.parent.keys() - before:
                    origin = new
                    while origin in fresh.parent:
                        origin = fresh.parent[origin]
                    sizes.alias(new, ("user", position, origin))
    fresh.sizes = sizes
    return result


# ---------------------------------------------------------------- back to readable einflow


def _counts(factors: tuple[ir.Expr, ...]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for indices in product_operands(factors, frozenset(indices_in(ir.Product(factors)))):
        counts.update(indices)
    return counts


def _contracts_if_unbound(expr: ir.Expr, index: str) -> bool:
    """Would ``index`` be contracted somewhere inside ``expr`` if it were not bound around it?"""
    if index not in indices_in(expr):
        return False
    if isinstance(expr, ir.Tensor):
        return expr.indices.count(index) >= 2
    if isinstance(expr, ir.Delta):
        return expr.first == expr.second == index
    if isinstance(expr, ir.Product):
        count = 0
        for factor in expr.factors:
            if isinstance(factor, ir.Tensor):
                count += factor.indices.count(index)
            elif isinstance(factor, ir.Delta):
                count += (factor.first == index) + (factor.second == index)
            elif index in indices_in(factor):
                if _contracts_if_unbound(factor, index):
                    return True
                count += 1
        return count >= 2
    if isinstance(expr, ir.Sum):
        return any(_contracts_if_unbound(t, index) for t in expr.terms)
    if isinstance(expr, ir.Call):
        return _contracts_if_unbound(expr.arg, index)
    if isinstance(expr, ir.Power):
        return _contracts_if_unbound(expr.base, index)
    if isinstance(expr, (ir.Reduce, ir.Normalize, ir.Linalg)):
        return _contracts_if_unbound(expr.body, index)
    if isinstance(expr, ir.Binary):
        return _contracts_if_unbound(expr.left, index) or _contracts_if_unbound(expr.right, index)
    return False


def _factors_of(expr: ir.Expr) -> tuple[ir.Expr, ...]:
    return expr.factors if isinstance(expr, ir.Product) else (expr,)


def _occurrences(factors: tuple[ir.Expr, ...], index: str) -> int:
    count = 0
    for factor in factors:
        if isinstance(factor, ir.Tensor):
            count += factor.indices.count(index)
        elif isinstance(factor, ir.Delta):
            count += (factor.first == index) + (factor.second == index)
        elif index in indices_in(factor):
            count += 1
    return count


def _implicit(expr: ir.Expr, top_level: bool) -> ir.Expr:
    """Drop sum[...] wrappers that an implicit contraction (or explicit-mode reduction) expresses."""
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(_implicit(t, top_level and not isinstance(t, ir.Sum)) for t in expr.terms))
    if isinstance(expr, ir.Call):
        return ir.Call(expr.func, _implicit(expr.arg, False))
    if isinstance(expr, ir.Power):
        return ir.Power(_implicit(expr.base, False), expr.exponent)
    if isinstance(expr, ir.Product):
        return ir.product(*(_implicit(f, False) for f in expr.factors))
    if isinstance(expr, ir.Normalize):
        return ir.Normalize(expr.kind, expr.indices, _implicit(expr.body, False))
    if isinstance(expr, ir.Linalg):
        return ir.Linalg(expr.kind, expr.indices, _implicit(expr.body, False))
    if isinstance(expr, ir.Binary):
        return ir.Binary(expr.func, _implicit(expr.left, False), _implicit(expr.right, False))
    if isinstance(expr, ir.Reduce) and expr.kind != "sum":
        return ir.Reduce(expr.indices, _implicit(expr.body, False), expr.kind)
    if isinstance(expr, ir.Reduce):
        body = _implicit(expr.body, False)
        factors = body.factors if isinstance(body, ir.Product) else (body,)
        keep = []
        for index in expr.indices:
            rebinding = any(_contracts_if_unbound(f, index) for f in factors
                            if not isinstance(f, (ir.Tensor, ir.Delta, ir.Num)))
            count = _occurrences(factors, index)
            if isinstance(body, ir.Sum) and top_level:
                # the terms become top-level terms, each reduced on its own: a term without the index
                # would lose its factor of the index's size
                implicit = all(_occurrences(_factors_of(term), index) == 1 and not _contracts_if_unbound(term, index)
                               for term in body.terms)
            else:
                implicit = count >= 2 or (top_level and count == 1)
            if rebinding or not implicit:
                keep.append(index)
        if keep:
            return ir.Reduce(tuple(keep), body)
        return body
    return expr


def readable(statement: ir.Assign, keep: set[str], declared: frozenset[str] = frozenset(),
             avoid: Iterable[str] = ()) -> tuple[ir.Assign, dict[str, str]]:
    """A normal-form statement as idiomatic einflow, with short index names (and the renaming used).

    ``keep`` are names that must not be reused for other indices (size-declared ones); an index made
    from a user-``declared`` name gets that name back (so its declared size applies again); ``avoid``
    are other names no index may take (the program's tensor names).
    """
    expr = _implicit(statement.expr, bool(statement.indices))
    names: list[str] = list(statement.indices or ())
    for index in sorted(indices_in(expr)):
        if index not in names:
            names.append(index)
    used = set(keep) | set(avoid)
    mapping: dict[str, str] = {}
    for name in names:
        if name in keep:
            mapping[name] = name
            continue
        stem = stem_of(name)
        if stem in declared and stem not in mapping.values():
            mapping[name] = stem
            continue
        candidate, number = stem, 1
        while candidate in used or candidate in ir.RESERVED:
            number += 1
            candidate = f"{stem}_{number}" if stem[-1].isdigit() else f"{stem}{number}"
        used.add(candidate)
        mapping[name] = candidate
    indices = tuple(mapping[i] for i in statement.indices or ())
    return ir.Assign(statement.target, indices if indices else None, rename(expr, mapping)), mapping


def lift_deep_calls(statements: list[ir.Assign], fresh: Fresh, names: Fresh, ranks: dict[str, int],
                    depth: int = 8, lifted_names: set[str] | None = None) -> list[ir.Assign]:
    """Give every function call inside another its own statement when calls nest ``depth`` deep.

    Differentiating ``f(g(h(...)))`` copies the inner chain into every factor of the chain rule, and a
    second derivative multiplies those copies again. With each level named (``h1[i] = sin(x[i])``,
    ``h2[i] = sin(h1[i])``, ...), every statement's first and second derivative is a few factors that read
    the previous level's names, so derivative programs and their derivation stay linear in the nesting depth.
    Statements nested less than ``depth`` deep are unchanged. Keeps normal form: a helper binds fresh
    copies of the indices its expression leaves free. The helpers' names are added to ``lifted_names``.
    """
    result: list[ir.Assign] = []
    for statement in statements:
        if _call_depth(statement.expr) < depth:
            result.append(statement)
            continue
        lifted: list[ir.Assign] = []
        named: dict[ir.Expr, ir.Tensor] = {}  # a call met again (the same chain twice) reads the first's statement

        def visit(expr: ir.Expr, inside: bool, lifted: list[ir.Assign] = lifted,
                  named: dict[ir.Expr, ir.Tensor] = named) -> ir.Expr:
            within = inside or isinstance(expr, (ir.Call, ir.Power))
            kids = tuple(visit(child, within) for child in ir.children(expr))
            new = ir.with_children(expr, kids) if kids else expr
            if not inside or not isinstance(expr, ir.Call):
                return new
            if new in named:
                return named[new]
            bound = {i for node in ir.walk(new) for i in ir.reduced_indices(node)}
            free = [i for i in dict.fromkeys(_occurring(new)) if i not in bound]
            axes = tuple(fresh.index(i) for i in free)
            name = names.pick([f"h{n}" for n in range(1, 1000)], "h")
            ranks[name] = len(axes)
            if fresh.sizes is not None:  # the helper's axes have its indices' sizes (so keys match across levels)
                for axis, index in enumerate(axes):
                    fresh.sizes.union(index, ("axis", name, axis))
            lifted.append(ir.Assign(name, axes, rename(new, dict(zip(free, axes)))))
            if lifted_names is not None:
                lifted_names.add(name)
            named[new] = ir.Tensor(name, tuple(free))
            return named[new]

        expr = visit(statement.expr, False)
        result.extend(lifted)
        result.append(ir.Assign(statement.target, statement.indices, expr))
    return result


def _call_depth(expr: ir.Expr) -> int:
    """How deep function calls and powers nest in ``expr`` (``sin(x[i]^2)``: 2), without recursion."""
    deepest = 0
    stack = [(expr, 0)]
    while stack:
        node, level = stack.pop()
        level += isinstance(node, (ir.Call, ir.Power))
        deepest = max(deepest, level)
        stack.extend((child, level) for child in ir.children(node))
    return deepest


def _occurring(expr: ir.Expr) -> Iterable[str]:
    for node in ir.walk(expr):
        if isinstance(node, ir.Tensor):
            yield from node.indices
        elif isinstance(node, ir.Delta):
            yield from (node.first, node.second)
