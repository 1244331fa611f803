"""Complex conjugation, real and imaginary parts of IR (LANGUAGE.md 9.2), pushed down to the leaves.

``conjugate(e)`` is ``conj(e)`` written where it is needed: numbers, deltas and real-valued functions are
their own conjugates, a product's conjugate is the product of its factors' conjugates, and the real
functions (exp, log, sin, ...) commute with conjugation, so ``conj(2 exp(x[i]) delta[i,p])`` is
``2 exp(conj(x[i])) delta[i,p]``. ``real_part`` / ``imag_part`` take the known-real factors out of a
product, so a delta stays outside ``real(...)`` where the simplifier can substitute it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator

from einflow.lang import ir
from einflow.lang.functions import FUNCTION_RULES, FunctionRule

__all__ = ["conjugate", "conjugate_outside", "real_part", "imag_part", "is_real", "holomorphic_obstacle", "push_parts",
           "complex_arrays", "complex_mode", "hermitian_inputs", "function_rule", "is_holomorphic"]

# ---- derivations for complex arrays (LANGUAGE.md 9.2). A derivation is symbolic: it does not know whether the
# arrays will be real or complex. Most rules hold for both; three do not, and a derivation for complex arrays
# (``complex_arrays()``, einflow.derivatives runs it when a call passes complex arrays) uses their complex forms:
# logdet is log|det| = Re(log det), not holomorphic (d = Re(tr(M^-1 dM)); for real M the real rule's tr(M^-1 dM));
# a declared spd/hermitian input varies on the Hermitian matrices ((G + G^H)/2, not (G + G^T)/2); sign(u) = u/|u|
# is not locally constant (abs's derivative conj(u)/|u| is differentiated again by hvp).
_COMPLEX: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("einflow_complex", default=None)

#: the rules of abs and sign on complex numbers, where sign(u) = u/|u| varies:
#: d sign = (du - sign(u) Re(conj(sign(u)) du))/|u|, whose Wirtinger parts are 1/(2|u|) and -sign(u)^2/(2|u|)
_COMPLEX_RULES = {
    "abs": dataclasses.replace(FUNCTION_RULES["abs"], tangent_text="real(conj(u) du) abs(u)^-1",
                               wirtinger_texts=("0.5 conj(u) abs(u)^-1", "0.5 u abs(u)^-1")),
    "sign": dataclasses.replace(FUNCTION_RULES["sign"], tangent_text="(du - u abs(u)^-2 real(conj(u) du)) abs(u)^-1",
                                wirtinger_texts=("0.5 abs(u)^-1", "-0.5 u^2 abs(u)^-3")),
}


@contextlib.contextmanager
def complex_arrays(hermitian: Iterable[str] = ()) -> Iterator[None]:
    """Derive for complex arrays inside the block; ``hermitian``: the inputs declared spd or hermitian."""
    token = _COMPLEX.set(frozenset(hermitian))
    try:
        yield
    finally:
        _COMPLEX.reset(token)


def complex_mode() -> bool:
    """Whether the derivation running is for complex arrays (``complex_arrays``)."""
    return _COMPLEX.get() is not None


def hermitian_inputs() -> frozenset[str]:
    """The declared matrices that vary on the Hermitian matrices (a derivation for complex arrays), else none."""
    return _COMPLEX.get() or frozenset()


def function_rule(name: str) -> FunctionRule:
    """The row of function ``name``: its complex form in a derivation for complex arrays (abs, sign)."""
    if _COMPLEX.get() is not None and name in _COMPLEX_RULES:
        return _COMPLEX_RULES[name]
    return FUNCTION_RULES[name]


def _obstacle(node: ir.Expr) -> str | None:
    if isinstance(node, ir.Call) and not function_rule(node.func).holomorphic:
        return node.func
    if isinstance(node, ir.Linalg) and node.kind == "logdet" and complex_mode():
        return "logdet"
    return None


def is_holomorphic(expr: ir.Expr) -> bool:
    """Whether ``expr`` applies no non-holomorphic function (conj, abs, ...; logdet of complex matrices)."""
    return all(_obstacle(node) is None for node in ir.walk(expr))

#: functions with real coefficients: f(conj(u)) = conj(f(u))
_COMMUTING = frozenset({"exp", "log", "log1p", "sqrt", "sin", "cos", "tanh", "sigmoid", "sign", "erf", "softplus"})


def is_real(expr: ir.Expr) -> bool:
    """Whether ``expr`` is real for any inputs, complex ones included (numbers, deltas, real-valued functions)."""
    if isinstance(expr, ir.Num):
        return not isinstance(expr.value, complex)
    if isinstance(expr, ir.Delta):
        return True
    if isinstance(expr, ir.Call):
        return FUNCTION_RULES[expr.func].real_valued
    if isinstance(expr, ir.Product):
        return all(map(is_real, expr.factors))
    if isinstance(expr, ir.Sum):
        return all(map(is_real, expr.terms))
    if isinstance(expr, ir.Power):
        return is_real(expr.base)
    if isinstance(expr, ir.Reduce):
        return expr.kind in ("max", "min") or is_real(expr.body)
    if isinstance(expr, ir.Normalize):
        return expr.kind in ("argmax", "argmin") or is_real(expr.body)
    if isinstance(expr, ir.Binary):
        return True  # maximum/minimum compare: real numbers only
    if isinstance(expr, ir.Linalg):
        return expr.kind == "logdet" or is_real(expr.body)
    return False


def conjugate(expr: ir.Expr) -> ir.Expr:
    """conj(expr), pushed down to the tensors that may be complex."""
    if is_real(expr):
        return expr
    if isinstance(expr, ir.Num):
        return ir.Num(expr.value.conjugate())
    if isinstance(expr, ir.Call):
        if expr.func == "conj":
            return expr.arg
        if expr.func in _COMMUTING:
            return ir.Call(expr.func, conjugate(expr.arg))
    if isinstance(expr, ir.Product):
        return ir.product(*map(conjugate, expr.factors))
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(map(conjugate, expr.terms)))
    if isinstance(expr, ir.Power):
        return ir.Power(conjugate(expr.base), expr.exponent)
    if isinstance(expr, ir.Reduce) and expr.kind in ("sum", "mean", "logsumexp"):
        return ir.Reduce(expr.indices, conjugate(expr.body), expr.kind)
    if isinstance(expr, ir.Normalize):
        return ir.Normalize(expr.kind, expr.indices, conjugate(expr.body))
    if isinstance(expr, ir.Linalg) and expr.kind in ("inv", "det"):
        return ir.Linalg(expr.kind, expr.indices, conjugate(expr.body))
    return ir.Call("conj", expr)


def conjugate_outside(expr: ir.Expr) -> ir.Expr:
    """conj(expr) with few conj copies: a contraction whose factors would need two or more new conjugates is
    conjugated once, after it (``conj(sum[a](conj(A[a]) E[a] M[a]))``, not ``sum[a](A[a] conj(E[a]) conj(M[a]))``:
    one conj of the result, and ``conj(A)`` is the forward's own); everything else as ``conjugate`` pushes it."""
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(map(conjugate_outside, expr.terms)))
    if isinstance(expr, ir.Product):
        return ir.product(*map(conjugate_outside, expr.factors))
    if isinstance(expr, ir.Reduce) and expr.kind == "sum" and isinstance(expr.body, ir.Product) \
            and not any(isinstance(f, ir.Delta) for f in expr.body.factors):
        needing = [f for f in expr.body.factors if not is_real(f) and not (isinstance(f, ir.Call) and f.func == "conj")]
        if len(needing) >= 2:
            return ir.Call("conj", expr)
    return push_parts(conjugate(expr))


def _contraction(expr: ir.Reduce) -> bool:
    """Is ``expr`` a contraction of two or more complex factors (no deltas)? Its real or imaginary part is taken
    after it: inside, the product would be formed elementwise instead of contracted (einsum, matmul)."""
    if not isinstance(expr.body, ir.Product) or any(isinstance(f, ir.Delta) for f in expr.body.factors):
        return False
    return sum(not is_real(f) for f in expr.body.factors) >= 2


def _split_real(expr: ir.Expr) -> tuple[list[ir.Expr], list[ir.Expr]]:
    factors = expr.factors if isinstance(expr, ir.Product) else (expr,)
    return [f for f in factors if is_real(f)], [f for f in factors if not is_real(f)]


def real_part(expr: ir.Expr) -> ir.Expr:
    """real(expr), with the known-real factors of a product outside it."""
    if is_real(expr):
        return expr
    if isinstance(expr, ir.Num):
        return ir.Num(expr.value.real)
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(map(real_part, expr.terms)))
    if isinstance(expr, ir.Reduce) and expr.kind in ("sum", "mean") and not _contraction(expr):
        return ir.Reduce(expr.indices, real_part(expr.body), expr.kind)
    if isinstance(expr, ir.Call) and expr.func == "conj":
        return real_part(expr.arg)
    reals, others = _split_real(expr)
    if reals and others:
        return ir.product(*reals, real_part(ir.product(*others)))
    return ir.Call("real", expr)


def imag_part(expr: ir.Expr) -> ir.Expr:
    """imag(expr), with the known-real factors of a product outside it (0 for a real expression)."""
    if is_real(expr):
        return ir.Num(0)
    if isinstance(expr, ir.Num):
        return ir.Num(expr.value.imag)
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(map(imag_part, expr.terms)))
    if isinstance(expr, ir.Reduce) and expr.kind in ("sum", "mean") and not _contraction(expr):
        return ir.Reduce(expr.indices, imag_part(expr.body), expr.kind)
    if isinstance(expr, ir.Call) and expr.func == "conj":
        return ir.negate(imag_part(expr.arg))
    reals, others = _split_real(expr)
    if reals and others:
        return ir.product(*reals, imag_part(ir.product(*others)))
    return ir.Call("imag", expr)


_PARTS = {"conj": conjugate, "real": real_part, "imag": imag_part}


def push_parts(expr: ir.Expr) -> ir.Expr:
    """Every conj/real/imag call of ``expr`` pushed down (bottom up), so deltas leave their arguments."""
    if isinstance(expr, ir.Call):
        arg = push_parts(expr.arg)
        rule = _PARTS.get(expr.func)
        return rule(arg) if rule is not None else ir.Call(expr.func, arg)
    if isinstance(expr, ir.Product):
        return ir.product(*map(push_parts, expr.factors))
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(map(push_parts, expr.terms)))
    if isinstance(expr, ir.Power):
        return ir.Power(push_parts(expr.base), expr.exponent)
    if isinstance(expr, ir.Reduce):
        return ir.Reduce(expr.indices, push_parts(expr.body), expr.kind)
    if isinstance(expr, ir.Normalize):
        return ir.Normalize(expr.kind, expr.indices, push_parts(expr.body))
    if isinstance(expr, ir.Linalg):
        return ir.Linalg(expr.kind, expr.indices, push_parts(expr.body))
    if isinstance(expr, ir.Binary):
        return ir.Binary(expr.func, push_parts(expr.left), push_parts(expr.right))
    return expr


def holomorphic_obstacle(statements: list[ir.Expr]) -> str | None:
    """The first function that makes a program non-holomorphic (conj, real, imag, abs, abs2, angle; logdet in a
    derivation for complex arrays), or None."""
    for expr in statements:
        for node in ir.walk(expr):
            found = _obstacle(node)
            if found is not None:
                return found
    return None
