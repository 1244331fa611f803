"""Stable forms of written-out expressions: log-sum-exp, softmax, log-softmax, softplus and log-sigmoid.

``log(sum[k](exp(e)))`` becomes ``logsumexp[k](e)``, ``exp(e[q]) / sum[k](exp(e[k]))`` becomes
``softmax[q](e[q])``, ``log(softmax[q](e[q]))`` (and so the written-out
``log(exp(e[q]) / sum[k](exp(e[k])))``) becomes ``log_softmax[q](e[q])``, ``log(1 + exp(u))`` becomes
``softplus(u)`` and ``log(sigmoid(u))`` becomes ``-softplus(-u)``. Each rewrite keeps every index's
binding (the reduction binds the same indices; a function's argument and a reduction's body are scoped
alike), so it applies to any program. The lowering applies them to every program it evaluates (the
program's text is unchanged), and the simplifier has them as rule rows, so written-out forms are finite
wherever their value is.

>>> from einflow.lang.grammar import parse_expression
>>> from einflow.lang import ir
>>> ir.format_expr(stabilize(parse_expression("log(sum[k](exp(x[k])))")))
'logsumexp[k](x[k])'
"""

from __future__ import annotations

from einflow.lang import ir

__all__ = ["stable_log", "stable_softmax", "stabilize", "stabilize_program"]


def _occurrences(expr: ir.Expr, index: str) -> int:
    count = 0
    for node in ir.walk(expr):
        if isinstance(node, ir.Tensor):
            count += node.indices.count(index)
        elif isinstance(node, ir.Delta):
            count += (node.first == index) + (node.second == index)
        elif isinstance(node, (ir.Reduce, ir.Normalize, ir.Linalg)) and index in node.indices:
            return 2  # bound or normalised inside: not a plain occurrence
    return count


def _rename(expr: ir.Expr, old: str, new: str) -> ir.Expr:
    if isinstance(expr, ir.Tensor):
        return ir.Tensor(expr.name, tuple(new if i == old else i for i in expr.indices))
    if isinstance(expr, ir.Delta):
        return ir.Delta(new if expr.first == old else expr.first, new if expr.second == old else expr.second)
    return ir.with_children(expr, tuple(_rename(c, old, new) for c in ir.children(expr)))


def stable_softmax(factors: list[ir.Expr]) -> list[ir.Expr] | None:
    """A product's factors with ``exp(u[q]) sum[k](exp(u[k]))^-n`` as ``softmax[q](u[q]) sum[k](exp(u[k]))^(1-n)``.

    Applies when ``q`` occurs once in ``u`` and ``k`` once in the sum's ``u[k]`` (so the scopes agree);
    None when nothing applies.
    """
    sums = []  # the factors sum[k](exp(v))^-n, found once (a product of n exps is not n^2 work)
    for other_position, other in enumerate(factors):
        base, exponent = (other.base, other.exponent) if isinstance(other, ir.Power) else (other, 1)
        if isinstance(exponent, int) and exponent < 0 and isinstance(base, ir.Reduce) and base.kind == "sum" \
                and len(base.indices) == 1 and isinstance(base.body, ir.Call) and base.body.func == "exp":
            sums.append((other_position, base, exponent))
    if not sums:
        return None
    for position, factor in enumerate(factors):
        if not (isinstance(factor, ir.Call) and factor.func == "exp"):
            continue
        u = factor.arg
        for other_position, base, exponent in sums:
            assert isinstance(base, ir.Reduce) and isinstance(base.body, ir.Call)
            (k,) = base.indices
            v = base.body.arg
            if _occurrences(v, k) != 1:
                continue
            for q in sorted({i for node in ir.walk(u) if isinstance(node, ir.Tensor) for i in node.indices}):
                if _occurrences(u, q) == 1 and _rename(v, k, q) == u:
                    rest = [f for n, f in enumerate(factors) if n not in (position, other_position)]
                    if exponent + 1:
                        rest.append(ir.Power(base, exponent + 1) if exponent + 1 != 1 else base)
                    return [*rest, ir.Normalize("softmax", (q,), u)]
    return None


def stable_log(arg: ir.Expr) -> tuple[str, ir.Expr] | None:
    """(rule name, stable form) of ``log(arg)`` when one applies, else None."""
    if isinstance(arg, ir.Reduce) and arg.kind == "sum" and isinstance(arg.body, ir.Call) and arg.body.func == "exp":
        return "logsumexp", ir.Reduce(arg.indices, arg.body.arg, "logsumexp")
    if isinstance(arg, ir.Sum) and len(arg.terms) == 2:
        for one, other in (arg.terms, arg.terms[::-1]):
            if isinstance(one, ir.Num) and one.value == 1 and isinstance(other, ir.Call) and other.func == "exp":
                return "softplus", ir.Call("softplus", other.arg)
    if isinstance(arg, ir.Normalize) and arg.kind == "softmax":  # 0 log 0 where log_softmax is finite
        return "log_softmax", ir.Normalize("log_softmax", arg.indices, arg.body)
    if isinstance(arg, ir.Call) and arg.func == "sigmoid":
        return "log sigmoid", ir.negate(ir.Call("softplus", ir.negate(arg.arg)))
    return None


def stabilize(expr: ir.Expr) -> ir.Expr:
    """``expr`` with every written-out log-sum-exp, softmax, log-softmax, softplus and log-sigmoid in its stable
    form."""
    kids = ir.children(expr)
    if kids:
        new = tuple(stabilize(kid) for kid in kids)
        if new != kids:
            expr = ir.product(*new) if isinstance(expr, ir.Product) else ir.with_children(expr, new)
    if isinstance(expr, ir.Call) and expr.func == "log":
        found = stable_log(expr.arg)
        if found is not None:
            return found[1]
    if isinstance(expr, ir.Product):
        factors: list[ir.Expr] | None = list(expr.factors)
        while True:
            rewritten = stable_softmax(factors)  # type: ignore[arg-type]
            if rewritten is None:
                break
            factors = rewritten
        if list(expr.factors) != factors:
            return ir.product(*factors)  # type: ignore[misc]
    return expr


def stabilize_program(program: ir.ProgramIR) -> ir.ProgramIR:
    """Every assignment of ``program`` stabilized (the same program when nothing applies)."""
    statements = []
    changed = False
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            expr = stabilize(statement.expr)
            if expr != statement.expr:
                changed = True
                statement = ir.Assign(statement.target, statement.indices, expr, span=statement.span)
        statements.append(statement)
    return ir.ProgramIR(tuple(statements)) if changed else program
