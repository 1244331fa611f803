"""Forward sweeps of Taylor coefficients over normal-form statements (LANGUAGE.md §9.1).

:func:`laplacian_sweep` carries, for every statement that depends on ``x``, its first derivatives along every
direction of ``x`` (one extra index, as a forward-mode Jacobian) and its Laplacian *collapsed* over the
directions (no direction index): ``lap f(A, B, ...) = sum_A df/dA lap A + sum_u d2f[A'_u, B'_u]``. A nonlinear
function of a contraction is split in two statements first, ``z = W h`` and ``y = f(z)``, so the second-order
term is ``f''(z) sum_u z'_u^2`` and reads the contraction's tangent once. The cost is about that of ``D + 2``
forward passes for ``D`` directions (the forward Laplacian), not that of a Hessian.

:func:`taylor_sweep` carries the coefficients ``d^k/dt^k T(x + t v)`` for ``k = 1..K`` along one direction:
for a statement ``T = E(A, B, ...)``, Faà di Bruno's formula over the integer partitions of ``k``,
``T_k = sum_{j_1+...+j_m = k} k!/(prod j_i! prod mult!) D^m E[A_{j_1}, ..., A_{j_m}]``, where ``D^m E`` is
``E``'s m-th derivative contracted with the coefficients (computed symbolically, one derivative at a time).
"""

from __future__ import annotations

import math
from collections import Counter

from einflow.derive.canonical import bound_inside
from einflow.derive.cse import reuse_forward
from einflow.derive.factor import fewer_operations
from einflow.derive.normal import rename
from einflow.derive.rules import Leaf, derivative, input_leaf
from einflow.derive.simplify import simplify
from einflow.derive.sweep import _INLINE_DEPTH, Work, _fresh_copy, _on_axes
from einflow.lang import ir
from einflow.lang.indices import indices_in

__all__ = ["laplacian_sweep", "taylor_sweep", "split_calls"]

#: placeholder tensor names (never printed: replaced by the coefficients they stand for)
_FIRST = "__first_"
_SECOND = "__second_"


def _is_zero(expr: ir.Expr | None) -> bool:
    return expr is None or (isinstance(expr, ir.Num) and expr.value == 0)


def split_calls(work: Work, varying: set[str]) -> None:
    """Every function call that depends on ``varying`` gets statements of its own, innermost first:
    ``y = v[m] tanh(W[m,j] h[j])`` becomes ``z[m] = W[m,j] h[j]; t[m] = tanh(z[m]); y = v[m] t[m]``. The
    sweeps then carry each call's coefficients by name (``f''(z) z'^2`` reads z's tangent once) instead of
    differentiating a nested expression again for every order."""
    statements: list[ir.Assign] = []
    varying = set(varying)
    added = [0]

    def new(stem: str, indices: tuple[str, ...], expr: ir.Expr) -> ir.Tensor:
        name = work.tensor_fresh.pick([stem], "z")
        statements.append(ir.Assign(name, indices, expr))
        work.ranks[name] = len(indices)
        if work.fresh.sizes is not None:
            for axis, index in enumerate(indices):
                work.fresh.sizes.union(index, ("axis", name, axis))
        varying.add(name)
        added[0] += 1
        return ir.Tensor(name, indices)

    def lift(node: ir.Expr, stem: str, top: bool) -> ir.Expr:
        children = ir.children(node)
        if children:
            lifted = tuple(lift(child, stem, False) for child in children)
            if lifted != children:
                node = ir.with_children(node, lifted)
        nonlinear = isinstance(node, (ir.Call, ir.Normalize, ir.Linalg)) or (
            isinstance(node, ir.Reduce) and node.kind != "sum")
        if not nonlinear or not _reads(node) & varying:
            return node
        inner = node.arg if isinstance(node, ir.Call) else node.body  # type: ignore[union-attr]
        if not isinstance(inner, (ir.Tensor, ir.Num)):
            bound = set(bound_inside(inner))
            inner = new(f"z{stem}", tuple(i for i in _ordered_indices(inner) if i not in bound), inner)
            node = ir.with_children(node, (inner,))
        if top:
            return node
        bound = set(bound_inside(node))
        return new(f"y{stem}", tuple(i for i in _ordered_indices(node) if i not in bound), node)

    for position, statement in enumerate(work.statements):
        if position < work.forward_count and _reads(statement.expr) & varying:
            expr = lift(statement.expr, statement.target or "f", True)
            statements.append(statement if expr is statement.expr else
                              ir.Assign(statement.target, statement.indices, expr))
            if statement.target is not None:
                varying.add(statement.target)
        else:
            statements.append(statement)
    work.statements[:] = statements
    work.forward_count += added[0]


def _ordered_indices(expr: ir.Expr) -> list[str]:
    """Every index ``expr`` mentions, in order of first appearance."""
    found: dict[str, None] = {}
    for node in ir.walk(expr):
        if isinstance(node, (ir.Tensor, ir.Read, ir.ShiftDelta)):
            found.update(dict.fromkeys(node.indices))
        elif isinstance(node, ir.Delta):
            found.update(dict.fromkeys((node.first, node.second)))
    return list(found)


def _reads(expr: ir.Expr) -> set[str]:
    return {node.name for node in ir.walk(expr) if isinstance(node, ir.Tensor)}


class _Coefficients:
    """Named coefficients of the statements (tangents, Laplacians): placeholders in derivatives, then
    substituted by the expression or the tensor that holds each."""

    def __init__(self, work: Work, prefix: str) -> None:
        self.work = work
        self.prefix = prefix
        self.known: dict[str, tuple[tuple[str, ...], ir.Expr, int]] = {}  # name -> (indices, expr, depth)

    def placeholder(self, name: str, indices: tuple[str, ...]) -> ir.Tensor | None:
        return ir.Tensor(self.prefix + name, indices) if name in self.known else None

    def substitute(self, expr: ir.Expr) -> tuple[ir.Expr, int]:
        """``expr`` with its placeholders replaced; the deepest inlined coefficient it read."""
        depth = [0]

        def visit(node: ir.Expr) -> ir.Expr:
            if isinstance(node, ir.Tensor) and node.name.startswith(self.prefix):
                indices, stored, level = self.known[node.name[len(self.prefix):]]
                depth[0] = max(depth[0], level)
                return rename(_fresh_copy(stored, self.work.fresh), dict(zip(indices, node.indices)))
            children = ir.children(node)
            if not children:
                return node
            return ir.with_children(node, tuple(visit(child) for child in children))

        return visit(expr), depth[0]

    def keep(self, target: str, indices: tuple[str, ...], axes: tuple[str, ...], expr: ir.Expr, depth: int,
             name: str, inline: bool = False) -> None:
        """Record ``target``'s coefficient: inlined where it is simple (or ``inline``: where its one reader
        computes it with its own), else a statement named ``name``."""
        work = self.work
        full = axes + indices  # the directions first: a contraction over the last axis is then one matrix product

        def materialize(kept: tuple[str, ...], body: ir.Expr) -> ir.Tensor:
            tensor = work.tensor_fresh.pick([name], "d")
            work.statements.append(ir.Assign(tensor, kept, body))
            work.ranks[tensor] = len(kept)
            return ir.Tensor(tensor, kept)

        if isinstance(expr, (ir.Num, ir.Tensor)) or inline:
            self.known[target] = (full, expr, depth + 1)
        elif (isinstance(expr, ir.Sum) or any(isinstance(n, ir.Reduce) for n in ir.walk(expr))
              or depth + 1 > _INLINE_DEPTH):  # (a contraction is computed once, in this statement's layout)
            split = _on_axes(expr, indices, axes)
            if split is None:
                self.known[target] = (full, materialize(full, expr), 0)
            else:
                carried, coefficient, kept = split
                if not isinstance(coefficient, (ir.Num, ir.Tensor)):
                    coefficient = materialize(kept, coefficient)
                self.known[target] = (full, ir.product(*carried, coefficient), 1)
        else:
            self.known[target] = (full, expr, depth + 1)


def laplacian_sweep(work: Work, wrt: str, output: str, weights: str | None = None) -> ir.Expr:
    """The Laplacian of the scalar ``output`` by the elements of input ``wrt`` (weighted by the input
    ``weights`` over wrt's axes twice: ``sum[u,w](C[u,w] d2 output/dx[u]dx[w])``), by a forward sweep; the
    tangent and Laplacian statements are appended to the work. Returns the output's Laplacian expression."""
    varying = work.depends({wrt})
    split_calls(work, varying)
    varying = work.depends({wrt})
    u = work.fresh_indices(wrt)
    w = work.fresh_indices(wrt) if weights is not None else u
    tangents = _Coefficients(work, _FIRST)
    laplacians = _Coefficients(work, _SECOND)
    symmetric = wrt in work.symmetric
    alone = _read_once_elementwise(work)
    calls = [s for s in work.statements[: work.forward_count] if isinstance(s.expr, ir.Call)]

    def along(axes: tuple[str, ...]) -> Leaf:
        seed = input_leaf(wrt, axes, symmetric)

        def leaf(node: ir.Tensor) -> ir.Expr | None:
            if node.name == wrt:
                return seed(node)
            return tangents.placeholder(node.name, axes + node.indices)

        return leaf

    def second(node: ir.Tensor) -> ir.Expr | None:
        return laplacians.placeholder(node.name, node.indices)

    for statement, target, indices in work.varying_forward(varying, wrt):
        first = derivative(statement.expr, along(u))
        if _is_zero(first):
            continue
        assert first is not None
        tangent, depth = tangents.substitute(first)
        tangent = simplify(tangent)
        quadratic = derivative(first, along(w))  # the coefficients in `first` are held: d2E[A'_u, B'_w]
        linear = derivative(statement.expr, second)
        parts: list[ir.Expr] = []
        if not _is_zero(linear):
            parts.append(laplacians.substitute(linear)[0])  # type: ignore[arg-type]
        if not _is_zero(quadratic):
            body, _ = tangents.substitute(quadratic)  # type: ignore[arg-type]
            if weights is not None:
                body = ir.product(ir.Tensor(weights, u + w), body)
                parts.append(ir.Reduce(u + w, body))
            else:
                parts.append(ir.Reduce(u, body) if u else body)
        laplacian = simplify(ir.Sum(tuple(parts)) if len(parts) > 1 else parts[0]) if parts else ir.Num(0)
        laplacian = _sums_apart(laplacian)
        if isinstance(laplacian, ir.Sum):  # the forward's values by name first: sigmoid(z) is y's factor too
            laplacian = fewer_operations(reuse_forward(calls, [ir.Assign(None, indices, laplacian)])[0].expr, indices)
        if target == output:
            return laplacian
        if not _is_zero(tangent):
            tangents.keep(target, indices, u, tangent, depth, f"d{target}_d{wrt}")
        if not _is_zero(laplacian):
            laplacians.keep(target, indices, (), laplacian, 0, f"lap_{target}",
                            inline=target in alone and _elementwise(laplacian, indices, set(u) | set(w)))
    return ir.Num(0)  # the output does not depend on wrt


def _elementwise(expr: ir.Expr, indices: tuple[str, ...], directions: set[str]) -> bool:
    """Does ``expr`` compute element by element over ``indices``, summing nothing but the directions?"""
    return all(set(ir.reduced_indices(n)) <= directions for n in ir.walk(expr) if ir.reduces(n)) and \
        indices_in(expr) - directions <= set(indices)


def _read_once_elementwise(work: Work) -> set[str]:
    """The forward's targets that one statement alone reads, elementwise (its indices as that statement's,
    nothing summed): ``y`` of ``y = sigmoid(z); h = z y``. Their Laplacians are computed in their reader's
    (one expression, whose common factors come out together: einflow.derive.factor)."""
    readers: dict[str, list[ir.Assign]] = {}
    for statement in work.statements[: work.forward_count]:
        for name in _reads(statement.expr):
            readers.setdefault(name, []).append(statement)
    alone = set()
    for name, statements in readers.items():
        if len(statements) != 1 or statements[0].target is None:
            continue
        reader = statements[0]
        reads = [n for n in ir.walk(reader.expr) if isinstance(n, ir.Tensor) and n.name == name]
        if all(n.indices == reader.indices for n in reads) and not any(
                ir.reduces(n) or isinstance(n, (ir.Read, ir.ShiftDelta)) for n in ir.walk(reader.expr)):
            alone.add(name)
    return alone


def _sums_apart(expr: ir.Expr) -> ir.Expr:
    """Sums of products split into independent sums: ``sum[p,q](a[p,i]^2 x[q]^2 c[i])`` is
    ``c[i] sum[p](a[p,i]^2) sum[q](x[q]^2)`` (the factors grouped by the summed indices they share), so no
    term builds an array over indices that never meet."""
    children = ir.children(expr)
    if children:
        new = tuple(_sums_apart(child) for child in children)
        if new != children:
            expr = ir.with_children(expr, new)
    if not (isinstance(expr, ir.Reduce) and expr.kind == "sum" and isinstance(expr.body, ir.Product)):
        return expr
    summed = set(expr.indices)
    outside: list[ir.Expr] = []
    groups: list[tuple[set[str], list[ir.Expr]]] = []
    for factor in expr.body.factors:
        touched = set(_ordered_indices(factor)) & summed
        if not touched:
            outside.append(factor)
            continue
        joined = [g for g in groups if g[0] & touched]
        merged = (touched.union(*(g[0] for g in joined)), [f for g in joined for f in g[1]] + [factor])
        groups = [g for g in groups if not g[0] & touched] + [merged]
    if len(groups) + bool(outside) <= 1:
        return expr
    parts = [ir.Reduce(tuple(i for i in expr.indices if i in indices), ir.product(*factors))
             for indices, factors in groups]
    unused = [i for i in expr.indices if not any(i in g[0] for g in groups)]
    if unused:  # a summed index no factor reads counts its size: delta[p,p] keeps it
        parts.append(ir.Reduce(tuple(unused), ir.product(*(ir.Delta(i, i) for i in unused))))
    return ir.product(*outside, *parts)


def _partitions(k: int, largest: int | None = None) -> list[list[int]]:
    """The integer partitions of ``k`` (parts in decreasing order)."""
    largest = k if largest is None else largest
    if k == 0:
        return [[]]
    found = []
    for part in range(min(k, largest), 0, -1):
        for rest in _partitions(k - part, part):
            found.append([part, *rest])
    return found


def _multiplicity(parts: list[int], k: int) -> float:
    """Faà di Bruno's coefficient of one integer partition: ``k! / (prod j! prod multiplicity!)``."""
    denominator = 1
    for part, count in Counter(parts).items():
        denominator *= math.factorial(part) ** count * math.factorial(count)
    return math.factorial(k) / denominator


def taylor_sweep(work: Work, wrt: str, direction: str, order: int, output: str) -> list[ir.Expr]:
    """The derivatives ``d^k/dt^k output(x + t v)`` at ``t = 0``, ``k = 1..order`` (``v`` the input
    ``direction``, shaped like ``wrt``): coefficient statements appended, the output's expressions returned."""
    varying = work.depends({wrt})
    split_calls(work, varying)
    varying = work.depends({wrt})
    coefficients = [_Coefficients(work, f"__taylor{k}_") for k in range(order + 1)]

    def leaf_of(k: int) -> Leaf:
        def leaf(node: ir.Tensor) -> ir.Expr | None:
            if node.name == wrt:
                return ir.Tensor(direction, node.indices) if k == 1 else None
            return coefficients[k].placeholder(node.name, node.indices)

        return leaf

    for statement, target, indices in work.varying_forward(varying, wrt):
        call = statement.expr
        if (isinstance(call, ir.Call) and call.func in _POLYNOMIAL_DERIVATIVES and isinstance(call.arg, ir.Tensor)
                and call.arg.name in coefficients[1].known and target != output):
            series = [coefficients[k].placeholder(call.arg.name, call.arg.indices) for k in range(1, order + 1)]
            arg = [coefficients[k].substitute(s)[0] if s is not None else None for k, s in enumerate(series, start=1)]
            for k, coefficient in enumerate(_recurrence(work, target, indices, call.func, arg), start=1):
                if coefficient is not None:
                    coefficients[k].keep(target, indices, (), coefficient, 0, f"{target}_t{k}")
            continue
        found: list[ir.Expr] = []
        for k in range(1, order + 1):
            terms: list[ir.Expr] = []
            for parts in _partitions(k):
                expr: ir.Expr | None = statement.expr
                for part in parts:  # D^m E contracted with the coefficients of orders j_1, ..., j_m
                    expr = derivative(expr, leaf_of(part)) if expr is not None else None
                    if expr is not None:
                        expr = simplify(expr)
                    if _is_zero(expr):
                        break
                if _is_zero(expr):
                    continue
                assert expr is not None
                scale = _multiplicity(parts, k)
                terms.append(expr if scale == 1 else ir.product(ir.Num(_number(scale)), expr))
            if not terms:
                found.append(ir.Num(0))
                continue
            body = ir.Sum(tuple(terms)) if len(terms) > 1 else terms[0]
            for level in coefficients:
                body = level.substitute(body)[0] if level.known else body
            found.append(simplify(body))
        if target == output:
            return found
        for k, expr in enumerate(found, start=1):
            if not _is_zero(expr):
                coefficients[k].keep(target, indices, (), expr, 0, f"{target}_t{k}")
    return [ir.Num(0)] * order  # the output does not depend on wrt


#: functions whose derivative is a polynomial in their value, y' = P(y) z' (coefficients of P, lowest first):
#: their Taylor coefficients follow a recurrence of Cauchy products, O(K^2) per element for order K
_POLYNOMIAL_DERIVATIVES = {"tanh": (1, 0, -1), "sigmoid": (0, 1, -1), "exp": (0, 1)}


def _recurrence(work: Work, target: str, indices: tuple[str, ...], func: str,
                arg: list[ir.Expr | None]) -> list[ir.Expr | None]:
    """The derivatives ``y_k`` (k = 1..K) of ``y = func(z)`` from ``z``'s derivatives ``arg`` (None: zero):
    with normalised coefficients ``c_k = y_k / k!``, ``w = P(y)`` (a series of Cauchy products of y's) and
    ``c_k = 1/k sum_{j=1..k} j a_j w_{k-j}``. Each coefficient is a statement of its own."""
    order = len(arg)
    polynomial = _POLYNOMIAL_DERIVATIVES[func]
    value = ir.Tensor(target, indices)
    a = [None, *(None if e is None else simplify(ir.product(ir.Num(1 / math.factorial(j)), e)) if j > 1 else e
                 for j, e in enumerate(arg, start=1))]

    def named(stem: str, expr: ir.Expr | None) -> ir.Expr | None:
        if expr is None:
            return None
        expr = simplify(expr)
        if isinstance(expr, (ir.Num, ir.Tensor)):
            return None if isinstance(expr, ir.Num) and expr.value == 0 else expr
        name = work.tensor_fresh.pick([stem], "c")
        work.statements.append(ir.Assign(name, indices, expr))
        work.ranks[name] = len(indices)
        return ir.Tensor(name, indices)

    def cauchy(left: list[ir.Expr | None], right: list[ir.Expr | None], k: int) -> ir.Expr | None:
        terms = [ir.product(left[j], right[k - j]) for j in range(k + 1)  # type: ignore[arg-type]
                 if left[j] is not None and right[k - j] is not None]
        return None if not terms else terms[0] if len(terms) == 1 else ir.Sum(tuple(terms))

    c: list[ir.Expr | None] = [value]
    powers: dict[int, list[ir.Expr | None]] = {1: c}
    for degree in range(2, len(polynomial)):
        powers[degree] = [ir.Power(value, degree)]
    w: list[ir.Expr | None] = []
    results: list[ir.Expr | None] = []
    for k in range(1, order + 1):
        m = k - 1  # w_m first: it needs y's coefficients up to m
        if m > 0:
            for degree in range(2, len(polynomial)):
                powers[degree].append(named(f"{target}_p{degree}_{m}", cauchy(powers[degree - 1], c, m)))
        terms: list[ir.Expr] = [ir.Num(polynomial[0])] if m == 0 and polynomial[0] else []
        terms += [ir.product(ir.Num(coefficient), powers[degree][m])  # type: ignore[arg-type]
                  for degree, coefficient in enumerate(polynomial) if degree and coefficient
                  and powers[degree][m] is not None]
        w.append(named(f"{target}_w{m}", ir.Sum(tuple(terms)) if len(terms) > 1 else terms[0] if terms else None))
        parts = [ir.product(ir.Num(j), a[j], w[k - j]) for j in range(1, k + 1)  # type: ignore[arg-type]
                 if a[j] is not None and w[k - j] is not None]
        body = None if not parts else ir.product(ir.Num(1 / k), ir.Sum(tuple(parts)) if len(parts) > 1 else parts[0])
        c.append(named(f"{target}_c{k}", body))
        coefficient = c[k]
        results.append(None if coefficient is None else simplify(ir.product(ir.Num(math.factorial(k)), coefficient)))
    return results


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
