"""The elementwise functions: one row each, read by every stage that needs to know a function.

A row holds the value rule (array code, for folding constants and for backends), the source text the
generated code calls, its block form (ufunc calls writing into a buffer: large fused steps, ``einflow.engine.blocks``),
the derivative rule (IR), LaTeX, a cost per element, and the temporary arrays the value rule allocates
besides its result (the memory model).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from einflow.lang import ir

__all__ = ["FunctionRule", "FUNCTION_RULES"]


@dataclass(frozen=True)
class FunctionRule:
    """One elementwise function.

    ``value(xp, x)`` evaluates f elementwise on the array module ``xp``; ``derivative_text`` is f'(u) in
    einflow text (``u`` the argument), parsed once: ``derivative(arg)`` is f'(arg) as IR; ``source`` is the
    generated code (``{np}`` the array module, ``{x}`` the argument, ``{sigmoid}``/``{step}`` helpers);
    ``block`` the same as numpy ufunc calls writing into ``{out}`` (which may be ``{x}``'s buffer; ``{t}`` a
    scratch buffer), computing exactly what ``source`` computes for a floating argument, or None; ``latex``
    the LaTeX (``@`` the argument); ``cost`` operations per element for the plan report; ``temporaries``
    arrays of the argument's size (float64) that ``value`` allocates besides its result (the memory model);
    ``promotes``: integer and boolean arguments are computed in float64 (numpy would choose float16 for int8).

    >>> ir.format_expr(FUNCTION_RULES["tanh"].derivative(ir.Tensor("h", ("i",))))
    '1 - tanh(h[i])^2'
    """

    value: Callable[[Any, Any], Any]
    derivative_text: str
    source: str
    block: tuple[str, ...] | None
    latex: str
    cost: int = 1
    temporaries: float = 0.0
    #: integer and boolean arguments are computed in float64 (the transcendental functions)
    promotes: bool = True
    #: complex derivatives (LANGUAGE.md 9.2). A holomorphic f has df = f'(u) du on complex numbers too; a
    #: non-holomorphic one (conj, real, ...) has the tangent rule ``tangent_text`` (df in ``u`` and ``du``)
    #: and the Wirtinger partials ``wirtinger_texts`` (df/du, df/dconj(u)); ``derivative_text`` is then its
    #: derivative on real arguments
    tangent_text: str | None = None
    wirtinger_texts: tuple[str, str] | None = None
    #: the value is real for complex arguments too (abs, abs2, real, imag, angle, and the real-only functions)
    real_valued: bool = False

    @property
    def holomorphic(self) -> bool:
        return self.tangent_text is None

    def derivative(self, argument: ir.Expr) -> ir.Expr:
        """f'(argument) as IR: the parsed ``derivative_text`` with ``u`` replaced by ``argument``."""
        return _substitute(_parsed(self.derivative_text), {"u": argument})

    def tangent(self, argument: ir.Expr, tangent: ir.Expr) -> ir.Expr:
        """df as IR for a tangent ``du`` of the argument: f'(u) du, or the non-holomorphic rule."""
        if self.tangent_text is None:
            return ir.product(self.derivative(argument), tangent)
        return _substitute(_parsed(self.tangent_text), {"u": argument, "du": tangent})

    def wirtinger(self, argument: ir.Expr) -> tuple[ir.Expr, ir.Expr | None]:
        """(df/du, df/dconj(u)) as IR; the second is None for a holomorphic function."""
        if self.wirtinger_texts is None:
            return self.derivative(argument), None
        by_u, by_conjugate = self.wirtinger_texts
        return (_substitute(_parsed(by_u), {"u": argument}), _substitute(_parsed(by_conjugate), {"u": argument}))


@functools.cache
def _parsed(text: str) -> ir.Expr:
    from einflow.lang.grammar import parse

    statement = parse(f"d = {text}").statements[0]
    assert isinstance(statement, ir.Assign)
    return statement.expr


def _substitute(expr: ir.Expr, arguments: dict[str, ir.Expr]) -> ir.Expr:
    if isinstance(expr, ir.Tensor):
        return arguments.get(expr.name, expr)
    if isinstance(expr, ir.Product):
        return ir.Product(tuple(_substitute(factor, arguments) for factor in expr.factors))
    if isinstance(expr, ir.Sum):
        return ir.Sum(tuple(_substitute(term, arguments) for term in expr.terms))
    if isinstance(expr, ir.Call):
        return ir.Call(expr.func, _substitute(expr.arg, arguments))
    if isinstance(expr, ir.Power):
        return ir.Power(_substitute(expr.base, arguments), expr.exponent)
    return expr  # numbers (the derivative texts use no deltas or reductions)


def _floating(xp: Any, x: Any) -> Any:
    """Integer and boolean arrays as float64 (numpy would pick float16 for int8, float32 for int16)."""
    dtype = getattr(x, "dtype", None)
    return x.astype(xp.float64) if dtype is not None and dtype.kind in "biu" else x


def _transcendental(name: str) -> Callable[[Any, Any], Any]:
    """The value rule ``xp.<name>`` computing in float64 for integer inputs (LANGUAGE.md: ints promote to float64)."""
    return lambda xp, x: getattr(xp, name)(_floating(xp, x))


def _step_value(xp: Any, x: Any) -> Any:
    return xp.greater(x, 0).astype(xp.result_type(x))


def _sigmoid_value(xp: Any, x: Any) -> Any:
    # with e = exp(-|x|): 1/(1+e) for x >= 0 and e/(1+e) below: never overflows, accurate in both tails
    # (sigmoid(-40) = 4.2e-18 where 0.5 (tanh(x/2) + 1) rounds to 0), keeps float32, one exp and one
    # division: numerator max(e, [x >= 0]) is 1 or e; -|x| is copysign(x, -1) (one pass)
    x = _floating(xp, x)
    # (the generated code's helper, engine/runtime.py's sigmoid, computes it alike)
    e = xp.exp(xp.copysign(x, -1))
    numerator = xp.maximum(e, x >= 0)
    e += 1
    numerator /= e
    return numerator


def _erf_value(xp: Any, x: Any) -> Any:
    # numpy has no erf: math.erf per element (correctly rounded in float64), the argument's floating type kept
    x = _floating(xp, xp.asarray(x))
    values = xp.frompyfunc(math.erf, 1, 1)(x)
    return xp.asarray(values, dtype=x.dtype if x.dtype.kind == "f" else xp.float64)


def _softplus_value(xp: Any, x: Any) -> Any:
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): never overflows, keeps float32
    return xp.logaddexp(0, _floating(xp, x))


def _ufunc(name: str, before: str = "", after: str = "") -> tuple[str, ...]:
    """The block form of one ufunc call: ``{np}.name(before{x}after, out={out})``."""
    return (f"{{np}}.{name}({before}{{x}}{after}, out={{out}})",)


# the value rule's steps, in place: e = exp(-|x|), numerator max(e, [x >= 0]), numerator / (1 + e); -|x| as
# absolute and negative (two SIMD loops, together 1.6 ms per 4M float64 against 2.5 ms for copysign(x, -1))
_SIGMOID_BLOCK = ("{np}.absolute({x}, out={t})", "{np}.negative({t}, out={t})", "{np}.exp({t}, out={t})",
                  "{np}.greater_equal({x}, 0, out={out})", "{np}.maximum({t}, {out}, out={out})",
                  "{np}.add({t}, 1, out={t})", "{np}.divide({out}, {t}, out={out})")

def _is_complex(x: Any) -> bool:
    """Whether ``x`` (an array of any library, or a Python number) is complex (dask.array has no iscomplexobj)."""
    if isinstance(x, complex):
        return True
    method = getattr(x, "is_complex", None)  # torch tensors: dtypes without a kind
    if callable(method):
        return bool(method())
    return getattr(getattr(x, "dtype", None), "kind", "") == "c"


def _fresh(y: Any) -> Any:
    """``y`` as a new array: conj/real/imag of numpy return their argument or a view of it, which a later step
    writing in place would write into the caller's input."""
    return y.copy() if hasattr(y, "copy") else (y.clone() if hasattr(y, "clone") else y)


def _abs2_value(xp: Any, x: Any) -> Any:
    # |z|^2 = re^2 + im^2 (exact where abs(z)^2 would round through a square root)
    if _is_complex(x):
        return x.real * x.real + x.imag * x.imag
    return x * x


FUNCTION_RULES: dict[str, FunctionRule] = {
    #                    value rule                        f'(u)                     generated code
    "exp": FunctionRule(_transcendental("exp"), "exp(u)", "{np}.exp({x})", _ufunc("exp"),
                        r"\exp\left(@\right)", 10),
    "log": FunctionRule(_transcendental("log"), "u^-1", "{np}.log({x})", _ufunc("log"), r"\log\left(@\right)", 10),
    "log1p": FunctionRule(_transcendental("log1p"), "(1 + u)^-1", "{np}.log1p({x})", _ufunc("log1p"),
                          r"\log\left(1 + @\right)", 10),
    "sqrt": FunctionRule(_transcendental("sqrt"), "0.5 u^-0.5", "{np}.sqrt({x})", _ufunc("sqrt"), r"\sqrt{@}", 4),
    "sin": FunctionRule(_transcendental("sin"), "cos(u)", "{np}.sin({x})", _ufunc("sin"), r"\sin\left(@\right)", 10),
    "cos": FunctionRule(_transcendental("cos"), "-sin(u)", "{np}.cos({x})", _ufunc("cos"), r"\cos\left(@\right)", 10),
    "tanh": FunctionRule(_transcendental("tanh"), "1 - tanh(u)^2", "{np}.tanh({x})", _ufunc("tanh"),
                         r"\tanh\left(@\right)", 20),
    # sigmoid' = sigmoid(u) sigmoid(-u): 1 - sigmoid(u) would round to 0 for u > 37 (exact: 4.25e-18 at 40)
    "sigmoid": FunctionRule(_sigmoid_value, "sigmoid(u) sigmoid(-u)", "{sigmoid}({x})", _SIGMOID_BLOCK,
                            r"\sigma\left(@\right)", 14, 1.125),
    # abs'(0) = sign(0) = 0; on complex numbers the modulus: d|u| = Re(conj(sign(u)) du), sign(u) = u/|u|
    "abs": FunctionRule(lambda xp, x: xp.abs(x), "sign(u)", "{np}.abs({x})", _ufunc("absolute"),
                        r"\left|@\right|", promotes=False, tangent_text="real(conj(sign(u)) du)",
                        wirtinger_texts=("0.5 conj(sign(u))", "0.5 sign(u)"), real_valued=True),
    # relu'(0) = step(0) = 0
    "relu": FunctionRule(lambda xp, x: xp.maximum(x, 0), "step(u)", "{np}.maximum({x}, 0)",
                         _ufunc("maximum", after=", 0"), r"\operatorname{relu}\left(@\right)", promotes=False,
                         real_valued=True),
    "sign": FunctionRule(lambda xp, x: xp.sign(x), "0", "{np}.sign({x})", _ufunc("sign"),
                         r"\operatorname{sign}\left(@\right)", promotes=False),
    "step": FunctionRule(_step_value, "0", "{step}({x})", _ufunc("greater", after=", 0"),
                         r"\operatorname{step}\left(@\right)", 1, 0.125, promotes=False,
                         real_valued=True),
    # erf'(u) = 2/sqrt(pi) exp(-u^2)
    "erf": FunctionRule(_erf_value, f"{2 / math.sqrt(math.pi)!r} exp(-u^2)", "{erf}({x})", None,
                        r"\operatorname{erf}\left(@\right)", 40, 4.0),
    # softplus' = sigmoid; log(1 + exp(x)) evaluated as logaddexp(0, x)
    "softplus": FunctionRule(_softplus_value, "sigmoid(u)", "{np}.logaddexp(0, {x})",
                             _ufunc("logaddexp", before="0, "), r"\operatorname{softplus}\left(@\right)",
                             24, 0.0),
    # ---- complex numbers (LANGUAGE.md 9.2): f(u) next to df (the tangent rule) and (df/du, df/dconj(u))
    "conj": FunctionRule(lambda xp, x: xp.conj(x) if _is_complex(x) else _fresh(x), "1", "{conj}({x})",
                         _ufunc("positive"),
                         r"\overline{@}", promotes=False,
                         tangent_text="conj(du)", wirtinger_texts=("0", "1")),
    "real": FunctionRule(lambda xp, x: _fresh(xp.real(x)), "1", "{real}({x})", _ufunc("positive"),
                         r"\operatorname{Re}\left(@\right)",
                         promotes=False, tangent_text="real(du)", wirtinger_texts=("0.5", "0.5"), real_valued=True),
    "imag": FunctionRule(lambda xp, x: _fresh(xp.imag(x)) if _is_complex(x) else xp.imag(x), "0", "{imag}({x})",
                         None, r"\operatorname{Im}\left(@\right)",
                         promotes=False, tangent_text="imag(du)", wirtinger_texts=("-0.5j", "0.5j"),
                         real_valued=True),
    # |u|^2 = u conj(u)
    "abs2": FunctionRule(_abs2_value, "2 u", "{abs2}({x})", _ufunc("multiply", after=", {x}"),
                         r"\left|@\right|^{2}", 2, promotes=False,
                         tangent_text="2 real(conj(u) du)", wirtinger_texts=("conj(u)", "u"), real_valued=True),
    # angle(u) = Im(log u): d angle = Im(du / u)
    "angle": FunctionRule(lambda xp, x: xp.angle(_floating(xp, x)), "0", "{np}.angle({x})",
                          _ufunc("arctan2", before="0, "),
                          r"\arg\left(@\right)", 20, tangent_text="imag(du u^-1)",
                          wirtinger_texts=("-0.5j u^-1", "0.5j conj(u)^-1"), real_valued=True),
}

assert set(FUNCTION_RULES) == set(ir.FUNCTIONS)
