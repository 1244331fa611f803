"""The bi-Laplacian by one collapsed forward sweep of fourth order (LANGUAGE.md §9.1).

``Δ²f = sum[u,w](d4 f / dx[u]^2 dx[w]^2)``. The Laplacian of the Laplacian program (einflow.derive.taylor's
forward Laplacian applied twice) carries, through the second sweep, the derivatives of the first sweep's
tangents and of its Laplacians, and so computes ``d/dx[q] lap T`` and ``lap dT/dx[p]`` (the same numbers) twice,
and ``T``'s Laplacian twice. This sweep carries each coefficient once, the highest ones summed over the
directions (collapsed, as Dangel et al.'s collapsed Taylor mode sums the highest Taylor coefficients): for every
statement ``T`` that depends on ``x``, its tangent ``T_u`` and Hessian ``T_uw`` along every pair of directions,
its Laplacian ``L = sum_u T_uu``, the Laplacian's gradient ``G_u`` and its bi-Laplacian ``Q``. For
``T = E(A, B, ...)``, with ``D^m E[X_1, ..., X_m]`` E's m-th derivative contracted with coefficients (taken
symbolically) and the sums over repeated direction indices::

    T_u  = DE[A_u]
    T_uw = DE[A_uw] + D2E[A_u, A_w]
    L    = DE[L_A] + D2E[A_u, A_u]
    G_u  = DE[G_A,u] + D2E[A_u, L_A] + 2 D2E[A_uw, A_w] + D3E[A_u, A_w, A_w]
    Q    = DE[Q_A] + D2E[L_A, L_A] + 4 D2E[G_A,u, A_u] + 2 D2E[A_uw, A_uw]
           + 2 D3E[L_A, A_u, A_u] + 4 D3E[A_uw, A_u, A_w] + D4E[A_u, A_u, A_w, A_w]

Per layer of an MLP with D inputs that is ``1 + D + D^2 + 1 + D + 1`` carried columns against the nested
sweep's ``1 + D + 1 + 1 + D^2 + D + D + 1``. The interpolated form (fourth-order Taylor series along the ``D^2``
directions ``e_i`` and ``e_i +- e_j``, their fourth coefficients collapsed) would carry ``3 D^2 + 1``.
"""

from __future__ import annotations

from einflow.derive.cse import reuse_forward
from einflow.derive.factor import fewer_operations
from einflow.derive.rules import Leaf, derivative, input_leaf
from einflow.derive.simplify import simplify
from einflow.derive.sweep import Work
from einflow.derive.taylor import _Coefficients, _is_zero, _sums_apart, split_calls
from einflow.lang import ir

__all__ = ["bilaplacian_sweep"]


def bilaplacian_sweep(work: Work, wrt: str, output: str) -> ir.Expr:
    """The bi-Laplacian of the scalar ``output`` by the elements of input ``wrt``, by one forward sweep (the
    coefficient statements are appended to the work). Returns the output's bi-Laplacian expression."""
    varying = work.depends({wrt})
    split_calls(work, varying)
    varying = work.depends({wrt})
    u = work.fresh_indices(wrt)
    w = work.fresh_indices(wrt)
    first = _Coefficients(work, "__first_")
    hessian = _Coefficients(work, "__hessian_")
    laplacian = _Coefficients(work, "__laplacian_")
    gradient = _Coefficients(work, "__gradient_")
    bilaplacian = _Coefficients(work, "__bilaplacian_")
    channels = (first, hessian, laplacian, gradient, bilaplacian)
    symmetric = wrt in work.symmetric
    calls = [s for s in work.statements[: work.forward_count] if isinstance(s.expr, ir.Call)]

    def along(axes: tuple[str, ...]) -> Leaf:
        seed = input_leaf(wrt, axes, symmetric)

        def leaf(node: ir.Tensor) -> ir.Expr | None:
            return seed(node) if node.name == wrt else first.placeholder(node.name, axes + node.indices)

        return leaf

    def of(channel: _Coefficients, axes: tuple[str, ...] = ()) -> Leaf:
        return lambda node: channel.placeholder(node.name, axes + node.indices)

    def d(expr: ir.Expr | None, *leaves: Leaf) -> ir.Expr | None:
        """``D^m E[X_1, ..., X_m]``: one symbolic derivative per leaf (the coefficients already in are held)."""
        for leaf in leaves:
            if _is_zero(expr):
                return None
            assert expr is not None
            expr = derivative(expr, leaf)
            expr = None if expr is None else simplify(expr)
        return None if _is_zero(expr) else expr

    def total(*terms: tuple[float, tuple[str, ...], ir.Expr | None]) -> ir.Expr:
        """``sum scale sum[summed](term)`` over the nonzero terms, with every coefficient substituted."""
        parts: list[ir.Expr] = []
        for scale, summed, term in terms:
            if term is None:
                continue
            body = ir.Reduce(summed, term) if summed else term
            parts.append(body if scale == 1 else ir.product(ir.Num(scale), body))
        if not parts:
            return ir.Num(0)
        expr: ir.Expr = ir.Sum(tuple(parts)) if len(parts) > 1 else parts[0]
        for channel in channels:
            if channel.known:
                expr = channel.substitute(expr)[0]
        return simplify(expr)

    def tidy(expr: ir.Expr, indices: tuple[str, ...]) -> ir.Expr:
        expr = _sums_apart(expr)
        if isinstance(expr, ir.Sum):  # the forward's values by name first: tanh(z) is h's factor too
            expr = fewer_operations(reuse_forward(calls, [ir.Assign(None, indices, expr)])[0].expr, indices)
        return expr

    for statement, target, indices in work.varying_forward(varying, wrt):
        expr = statement.expr
        e_u = d(expr, along(u))
        if e_u is None:
            continue
        e_w, e_uu, e_uw = d(expr, along(w)), d(e_u, along(u)), d(e_u, along(w))
        e_uww = d(e_uw, along(w))
        quartic = total(
            (1, (), d(expr, of(bilaplacian))),
            (1, (), d(expr, of(laplacian), of(laplacian))),
            (4, u, d(e_u, of(gradient, u))),
            (2, u + w, d(expr, of(hessian, u + w), of(hessian, u + w))),
            (2, u, d(e_uu, of(laplacian))),
            (4, u + w, d(e_uw, of(hessian, u + w))),
            (1, u + w, d(e_uww, along(u))),
        )
        if target == output:
            return tidy(quartic, indices)
        tangent, depth = first.substitute(e_u)
        first.keep(target, indices, u, simplify(tangent), depth, f"d{target}_d{wrt}")
        coefficients = [
            (hessian, u + w, total((1, (), d(expr, of(hessian, u + w))), (1, (), e_uw)), f"d2{target}_d{wrt}2"),
            (laplacian, (), total((1, (), d(expr, of(laplacian))), (1, u, e_uu)), f"lap_{target}"),
            (
                gradient,
                u,
                total(
                    (1, (), d(expr, of(gradient, u))),
                    (1, (), d(e_u, of(laplacian))),
                    (2, w, d(e_w, of(hessian, u + w))),
                    (1, w, e_uww),
                ),
                f"dlap_{target}_d{wrt}",
            ),
            (bilaplacian, (), quartic, f"bilap_{target}"),
        ]
        for channel, axes, value, name in coefficients:
            if not _is_zero(value):
                channel.keep(target, indices, axes, tidy(value, axes + indices), 0, name)
    return ir.Num(0)  # the output does not depend on wrt
