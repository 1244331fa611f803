"""Reverse (adjoint) and forward (tangent) sweeps over normal-form statements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from einflow.derive.canonical import bound_inside
from einflow.derive.conjugate import (
    complex_mode,
    conjugate,
    conjugate_outside,
    function_rule,
    hermitian_inputs,
    is_holomorphic,
    is_real,
    push_parts,
    real_part,
)
from einflow.derive.cse import reuse_forward
from einflow.derive.normal import Fresh, rename, rename_apart, tensor_names
from einflow.derive.rules import Leaf, derivative, input_leaf, wirtinger
from einflow.derive.simplify import simplify
from einflow.derive.tree import split_products
from einflow.lang import ir
from einflow.lang.indices import indices_in

__all__ = ["Work", "name_factors", "reverse_sweep", "forward_sweep", "tangent_sweep", "zeros"]


@dataclass
class Work:
    """A derivative program under construction, all in bound normal form."""

    statements: list[ir.Assign]
    inputs: tuple[str, ...]
    ranks: dict[str, int]
    fresh: Fresh
    tensor_fresh: Fresh
    sizes: list[ir.SizeDecl] = field(default_factory=list)
    size_of: dict[str, tuple[str, int]] = field(default_factory=dict)  # index -> (tensor, axis)
    forward_count: int = 0  # statements[:forward_count] compute the program's own values
    partials: set[str] = field(default_factory=set)  # targets made by splitting a product along its tree
    symmetric: frozenset[str] = frozenset()  # inputs declared symmetric/spd: derivatives on symmetric matrices
    links: frozenset[str] = frozenset()  # the levels of a deep chain of calls, each named (lift_deep_calls)
    factors: dict[str, ir.Expr] = field(default_factory=dict)  # a link -> its chain-rule factor (name_factors)

    def target(self, name: str) -> ir.Assign | None:
        for statement in self.statements:
            if statement.target == name:
                return statement
        return None

    def fresh_indices(self, tensor: str) -> tuple[str, ...]:
        """Fresh indices for ``tensor``'s axes, declared with a size statement."""
        rank = self.ranks[tensor]
        pool = [*"pqrsuvwabcdeg"] + [f"{c}{n}" for n in range(2, 10) for c in "pqrsuvw"]
        names = tuple(self.fresh.pick(pool, "p") for _ in range(rank))
        if names:
            self.sizes.append(ir.SizeDecl(names, tensor))
            for axis, name in enumerate(names):
                self.size_of[name] = (tensor, axis)
                if self.fresh.sizes is not None:
                    self.fresh.sizes.union(name, ("axis", tensor, axis))
        return names

    def varying_forward(self, varying: set[str], wrt: str) -> list[tuple[ir.Assign, str, tuple[str, ...]]]:
        """The forward statements whose target is in ``varying`` (other than ``wrt``), each with its target and
        indices, listed before a sweep adds statements."""
        return [(statement, statement.target, statement.indices or ())
                for statement in self.statements[: self.forward_count]
                if statement.target is not None and statement.target in varying and statement.target != wrt]

    def depends(self, wrt: set[str]) -> set[str]:
        """Targets whose value depends on any of ``wrt`` (plus ``wrt`` itself)."""
        varying = set(wrt)
        for statement in self.statements:
            if tensor_names(statement.expr) & varying:
                varying.add(statement.target)  # type: ignore[arg-type]
        return varying


def name_factors(work: Work) -> None:
    """Give each level of a deep chain its chain-rule factor as a forward statement: ``g3[i] = cos(h2[i])``
    after ``h3[i] = sin(h2[i])`` (f' reads the level's own value where it can: ``1 - h3[i]^2`` for tanh). The
    sweeps multiply by ``g3`` where they differentiate ``h3``, so the gradient, the first derivatives and each
    level of the second derivative (``(f o g)'' = f''(g) g'^2 + f'(g) g''``) read the factor by name."""
    statements: list[ir.Assign] = []
    for statement in work.statements[: work.forward_count]:
        statements.append(statement)
        if statement.target not in work.links or not isinstance(statement.expr, ir.Call) \
                or not function_rule(statement.expr.func).holomorphic:
            continue
        factor = simplify(function_rule(statement.expr.func).derivative(statement.expr.arg))
        factor = reuse_forward([statement], [ir.Assign(None, statement.indices, factor)])[0].expr
        if isinstance(factor, ir.Num) and factor.value == 0:
            continue  # (sign, step): the rules find no derivative
        if not isinstance(factor, (ir.Num, ir.Tensor)):
            name = work.tensor_fresh.pick([f"g{statement.target[1:]}"], "g")
            indices = statement.indices or ()
            statements.append(ir.Assign(name, indices, _fresh_copy(factor, work.fresh)))
            work.ranks[name] = len(indices)
            if work.fresh.sizes is not None:
                for axis, index in enumerate(indices):
                    work.fresh.sizes.union(index, ("axis", name, axis))
            factor = ir.Tensor(name, indices)
        work.factors[statement.target] = factor
    work.statements[: work.forward_count] = statements
    work.forward_count = len(statements)


def _derive(work: Work, statement: ir.Assign, leaf: Leaf) -> ir.Expr | None:
    """d(statement's right side); a link of a deep chain, ``f(u)``, is its named factor times du."""
    factor = work.factors.get(statement.target)  # type: ignore[arg-type]
    if factor is None:
        return derivative(statement.expr, leaf)
    assert isinstance(statement.expr, ir.Call)
    inner = derivative(statement.expr.arg, leaf)
    return None if inner is None else ir.product(factor, rename_apart(inner))


def _fresh_copy(expr: ir.Expr, fresh: Fresh) -> ir.Expr:
    """``expr`` with its internal dummy indices renamed apart (for inlining at a second place)."""
    return rename(expr, {index: fresh.index(index) for index in bound_inside(expr)})


def _pulled_back(work: Work, statement: ir.Assign, leaf: Leaf, cotangent: ir.Expr,
                 conjugate_jacobian: bool) -> ir.Expr | None:
    """The cotangent times the statement's derivative by one read (not yet summed over the statement's indices).

    Complex numbers (LANGUAGE.md 9.2): the adjoints are those of jax, conj(dL/dRe + i dL/dIm), so a
    holomorphic statement pulls back by its complex derivative J as for real numbers (J h); a statement
    with a non-holomorphic function by its Wirtinger derivatives, A h + conj(B) conj(h), which is
    2 A real(h) for a real-valued one (B = conj(A) there). ``conjugate_jacobian``: the adjoints are
    PyTorch's instead (a holomorphic program only): conj(J) h.
    """
    if is_holomorphic(statement.expr) or statement.target in work.factors:
        jac = _derive(work, statement, leaf)
        if jac is None:
            return None
        return ir.product(cotangent, conjugate(jac) if conjugate_jacobian else jac)
    by_z, by_conjugate = wirtinger(statement.expr, leaf)
    if is_real(statement.expr) and not _real_only(statement.expr):
        return None if by_z is None else ir.product(ir.Num(2), real_part(cotangent), by_z)
    terms = []
    if by_z is not None:
        terms.append(ir.product(cotangent, by_z))
    if by_conjugate is not None:
        terms.append(ir.product(conjugate(cotangent), conjugate(by_conjugate)))
    return push_parts(terms[0] if len(terms) == 1 else ir.Sum(tuple(terms))) if terms else None


def _real_only(expr: ir.Expr) -> bool:
    """Does ``expr`` apply a function of real numbers only (relu, step, max, maximum, ...)? Such a function's
    Wirtinger parts are its real derivative and 0, so B = conj(A) fails for the real value it gives. So does
    logdet where the derivation is for real arrays (its rule tr(N dM), a real derivative; for complex arrays
    it is log|det| with both Wirtinger parts)."""
    return any(isinstance(node, ir.Call) and node.func in ("relu", "step") or isinstance(node, ir.Binary)
               or isinstance(node, ir.Reduce) and node.kind in ("max", "min")
               or isinstance(node, ir.Normalize) and node.kind in ("argmax", "argmin")
               or isinstance(node, ir.Linalg) and node.kind == "logdet" and not complex_mode()
               for node in ir.walk(expr))


def reverse_sweep(work: Work, output: str, seed: ir.Expr, wrt: list[str], name_of: dict[str, str],
                  extra: tuple[str, ...] = (), conjugate_jacobian: bool = False,
                  conjugate_result: bool = False) -> dict[str, str]:
    """Append adjoint statements computing the cotangent ``seed`` pulled back to each ``wrt`` input.

    ``seed`` has the output's target indices free, plus ``extra`` indices that every adjoint carries
    along (a reverse-mode Jacobian seeds with deltas and keeps the value's axes as ``extra``).
    Returns wrt name -> adjoint statement name (its indices: ``extra`` then the input's axes).
    ``conjugate_jacobian`` / ``conjugate_result``: complex conventions, see ``_pulled_back``.
    """
    varying = work.depends(set(wrt))
    position = next(k for k, s in enumerate(work.statements) if s.target == output)
    if position < work.forward_count:
        # products with many varying factors: one statement per node of their pairwise tree (shared adjoints)
        inserted = split_products(work.statements, position + 1, varying, work.fresh, work.tensor_fresh, work.ranks,
                                  work.partials)
        work.forward_count += inserted
        position += inserted
        varying = work.depends(set(wrt))
    forward = work.statements[: position + 1]
    adjoint_indices: dict[str, tuple[str, ...]] = {x: work.fresh_indices(x) for x in wrt}
    contributions: dict[str, list[ir.Expr]] = {}
    adjoint_of: dict[str, ir.Expr] = {output: seed}
    emitted: list[ir.Assign] = []
    for statement in reversed(forward):
        target = statement.target
        assert target is not None
        if target != output:
            parts = contributions.get(target)
            if not parts:
                continue
            indices = adjoint_indices[target] + extra
            if target in work.partials and len(parts) == 1 and isinstance(parts[0], ir.Tensor):
                # the adjoint is another tensor read as it is (a split product's root): no copy statement
                mapping = dict(zip(indices, (statement.indices or ()) + extra))
                adjoint_of[target] = rename(parts[0], mapping)
            else:
                name = work.tensor_fresh.pick([f"d{name_of['value']}_d{target}"], f"d_{target}")
                emitted.append(ir.Assign(name, indices, simplify(ir.Sum(tuple(parts)) if len(parts) > 1 else parts[0])))
                work.ranks[name] = len(indices)
                adjoint_of[target] = ir.Tensor(name, (statement.indices or ()) + extra)
        cotangent = adjoint_of[target]
        for read in sorted(tensor_names(statement.expr) & varying):
            if read not in adjoint_indices:
                adjoint_indices[read] = work.fresh_indices(read)
            pulled = _pulled_back(work, statement, input_leaf(read, adjoint_indices[read]), cotangent,
                                  conjugate_jacobian)
            if pulled is None:
                continue
            if statement.indices:
                pulled = ir.Reduce(statement.indices, pulled)
            contribution = simplify(_fresh_copy(pulled, work.fresh))
            if read in work.symmetric and len(adjoint_indices[read]) == 2:
                # a declared symmetric matrix: the contribution projected on the symmetric matrices, (C + C^T)/2,
                # term by term (a projection inside the product would sum two n^2 x n^2 arrays)
                # (C + C^H)/2 for a matrix declared spd or hermitian in a derivation for complex arrays
                p, q = adjoint_indices[read]
                swapped = _fresh_copy(rename(contribution, {p: q, q: p}), work.fresh)
                if read in hermitian_inputs():
                    swapped = push_parts(conjugate(swapped))
                contribution = simplify(ir.Sum((ir.product(ir.Num(0.5), contribution),
                                                ir.product(ir.Num(0.5), swapped))))
            if not (isinstance(contribution, ir.Num) and contribution.value == 0):
                contributions.setdefault(read, []).append(contribution)
    names: dict[str, str] = {}
    for x in wrt:
        name = work.tensor_fresh.pick([name_of[x]], f"d_{x}")
        if x not in adjoint_indices:
            adjoint_indices[x] = work.fresh_indices(x)
        parts = contributions.get(x, [])
        if parts:
            body = simplify(ir.Sum(tuple(parts)) if len(parts) > 1 else parts[0])
            if conjugate_result:
                body = simplify(conjugate_outside(body))
        else:
            body = ir.Num(0)
        if isinstance(body, ir.Num) and body.value == 0:
            body = zeros(extra + adjoint_indices[x])
        emitted.append(ir.Assign(name, extra + adjoint_indices[x], body))
        names[x] = name
    work.statements.extend(emitted)
    return names


def zeros(indices: tuple[str, ...]) -> ir.Expr:
    """An exact zero over ``indices``: ``0 delta[p,p] ...`` reads no input (the deltas only give its shape)."""
    return ir.product(ir.Num(0), *(ir.Delta(i, i) for i in indices)) if indices else ir.Num(0)


def _contracts(expr: ir.Expr) -> bool:
    """Does ``expr`` contract a product of three or more factors (a chain worth naming once)?"""
    return any(isinstance(node, ir.Reduce) and node.kind == "sum" and isinstance(node.body, ir.Product)
               and sum(not isinstance(f, ir.Num) for f in node.body.factors) >= 3 for node in ir.walk(expr))


def forward_sweep(work: Work, wrt: str, through: list[str],
                  outputs: list[str]) -> tuple[dict[str, ir.Assign], tuple[str, ...]]:
    """Tangents of ``through`` statements with respect to input ``wrt`` (fresh trailing indices).

    Returns (output name -> tangent statement, not yet appended, whose target indices are the output's
    then the fresh ones; the fresh indices). An output missing from the dict does not depend on ``wrt``.
    """
    fresh_axes = work.fresh_indices(wrt)
    seeds = {wrt: input_leaf(wrt, fresh_axes, wrt in work.symmetric)}
    results = tangent_sweep(work, seeds, fresh_axes, lambda t: f"d{t}_d{wrt}",
                            through, outputs)
    return results, fresh_axes


def tangent_sweep(work: Work, seeds: dict[str, Leaf], axes: tuple[str, ...], name_of: Callable[[str], str],
                  through: list[str], outputs: list[str]) -> dict[str, ir.Assign]:
    """Carry tangents forward through the ``through`` statements.

    ``seeds`` give the tangent of each varying input's reference (deltas for a Jacobian, a tangent
    tensor for a JVP); every tangent carries the extra ``axes``. Returns output name -> tangent statement
    (not yet appended; target indices: the output's, then ``axes``); an output missing from the dict does
    not vary. Simple tangents are inlined where used; others become statements named ``name_of(target)``.
    """
    tangents: dict[str, tuple[tuple[str, ...], ir.Expr, int]] = {}
    inlined = [0]  # the deepest inlined tangent the statement being derived read

    def leaf(node: ir.Tensor) -> ir.Expr | None:
        seed = seeds.get(node.name)
        if seed is not None:
            return seed(node)
        found = tangents.get(node.name)
        if found is None:
            return None
        indices, expr, depth = found
        inlined[0] = max(inlined[0], depth)
        copy = _fresh_copy(expr, work.fresh)
        return rename(copy, dict(zip(indices, node.indices)))

    def materialize(target: str, indices: tuple[str, ...], expr: ir.Expr) -> ir.Tensor:
        name = work.tensor_fresh.pick([name_of(target)], f"d_{target}")
        work.statements.append(ir.Assign(name, indices, expr))
        work.ranks[name] = len(indices)
        return ir.Tensor(name, indices)

    results: dict[str, ir.Assign] = {}
    for statement in list(work.statements):
        if statement.target not in through:
            continue
        inlined[0] = 0
        tangent = _derive(work, statement, leaf)
        if tangent is None:
            continue
        tangent = simplify(tangent)
        indices = statement.indices or ()
        if statement.target in outputs:
            results[statement.target] = ir.Assign(statement.target, indices + axes, tangent)
            continue
        assert statement.target is not None
        # keep simple tangents symbolic (inlined at each use); materialize the rest once: sums of terms,
        # contractions (inlining those repeats the chain: a deep network's statements would grow with depth),
        # the levels of a deep chain of calls, and tangents that inline tangents more than _INLINE_DEPTH deep
        # (in a chain h2 = sin(h1), h3 = sin(h2), ... each level's tangent would carry the factors of all
        # levels below it). A tangent on the extra axes through deltas, ``delta[i,p] c[i]``, gets a statement
        # for its coefficient ``c`` only and stays inlined: a chain's Hessian keeps vectors, not n x n arrays.
        depth = inlined[0] + 1
        if (isinstance(tangent, ir.Sum) or _contracts(tangent) or depth > _INLINE_DEPTH
                or statement.target in work.links):
            split = _on_axes(tangent, indices, axes)
            if split is None:
                tangents[statement.target] = (indices + axes, materialize(statement.target, indices + axes, tangent), 0)
            else:
                carried, coefficient, kept = split
                if not isinstance(coefficient, (ir.Num, ir.Tensor)):
                    coefficient = materialize(statement.target, kept, coefficient)
                tangents[statement.target] = (indices + axes, ir.product(*carried, coefficient), 1)
        else:
            tangents[statement.target] = (indices + axes, tangent, depth)
    return results


#: how many tangents deep a tangent is inlined: a deeper one gets a statement (its coefficient does)
_INLINE_DEPTH = 3


def _on_axes(tangent: ir.Expr, indices: tuple[str, ...], axes: tuple[str, ...],
             ) -> tuple[list[ir.Expr], ir.Expr, tuple[str, ...]] | None:
    """``tangent`` split as (its factors on the extra ``axes``, the coefficient they multiply, the statement's
    ``indices`` the coefficient keeps), or None. A product splits when its factors on the axes are deltas
    or tensors (``delta[i,p] x[q] c[i]``); a sum when every term carries the same deltas and nothing else on
    the axes (a sum sharing a tensor keeps its statement)."""
    if not axes:
        return None
    on = set(axes)
    terms = tangent.terms if isinstance(tangent, ir.Sum) else (tangent,)
    carriers = ir.Delta if len(terms) > 1 else (ir.Delta, ir.Tensor)
    carried: list[ir.Expr] | None = None
    rests: list[ir.Expr] = []
    for term in terms:
        factors = term.factors if isinstance(term, ir.Product) else (term,)
        touching = [f for f in factors if indices_in(f) & on]
        if not touching or not all(isinstance(f, carriers) for f in touching):
            return None
        if carried is None:
            carried = touching
        elif sorted(map(repr, touching)) != sorted(map(repr, carried)):
            return None
        rest = [f for f in factors if not indices_in(f) & on]
        rests.append(ir.product(*rest) if rest else ir.Num(1))
    assert carried is not None
    coefficient = simplify(ir.Sum(tuple(rests)) if len(rests) > 1 else rests[0])
    present = indices_in(coefficient)
    return carried, coefficient, tuple(i for i in indices if i in present)
