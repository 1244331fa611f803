"""The elementwise functions: one row each, read by every stage that needs to know a function.

A row holds the value rule (array code, for folding constants and for backends), the source text the
generated code calls, the numexpr text (fused evaluation), the derivative rule (IR), LaTeX, a cost per
element, and the temporary arrays the value rule allocates besides its result (the memory model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from einflow import ir

__all__ = ["FunctionRule", "FUNCTION_RULES"]


@dataclass(frozen=True)
class FunctionRule:
    """One elementwise function.

    ``value(xp, x)`` evaluates f elementwise on the array module ``xp``; ``derivative(u)`` is f'(u) as IR;
    ``source`` is the generated code (``{np}`` the array module, ``{x}`` the argument, ``{sigmoid}``/``{step}``
    helpers); ``numexpr`` the same for numexpr (``{x}`` must be a name when it occurs twice), or None;
    ``latex`` the LaTeX (``@`` the argument); ``cost`` operations per element for the plan report;
    ``temporaries`` arrays of the argument's size (float64) that ``value`` allocates besides its result;
    ``promotes``: integer and boolean arguments are computed in float64.
    """

    value: Callable[[Any, Any], Any]
    derivative: Callable[[ir.Expr], ir.Expr]
    source: str
    numexpr: str | None
    latex: str
    cost: int = 1
    temporaries: float = 0.0
    #: integer and boolean arguments are computed in float64 (the transcendental functions)
    promotes: bool = True


def _call(name: str) -> Callable[[ir.Expr], ir.Expr]:
    return lambda u: ir.Call(name, u)


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
    # (sigmoid(-40) = 4.2e-18 where 0.5 (tanh(x/2) + 1) rounds to 0), keeps float32, one exp only
    x = _floating(xp, x)
    e = xp.exp(-xp.abs(x))
    r = 1 / (1 + e)
    return xp.where(x >= 0, r, e * r)


def _erf_value(xp: Any, x: Any) -> Any:
    # numpy has no erf: math.erf per element (correctly rounded in float64), the argument's floating type kept
    x = _floating(xp, xp.asarray(x))
    values = xp.frompyfunc(math.erf, 1, 1)(x)
    return xp.asarray(values, dtype=x.dtype if x.dtype.kind == "f" else xp.float64)


def _softplus_value(xp: Any, x: Any) -> Any:
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): never overflows, keeps float32
    return xp.logaddexp(0, _floating(xp, x))


#: 2 / sqrt(pi): erf'(u) = 2/sqrt(pi) exp(-u^2)
TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)

ZERO = ir.Num(0)

FUNCTION_RULES: dict[str, FunctionRule] = {
    "exp": FunctionRule(_transcendental("exp"), _call("exp"), "{np}.exp({x})", "exp({x})",
                        r"\exp\left(@\right)", 10),
    "log": FunctionRule(_transcendental("log"), lambda u: ir.Power(u, -1), "{np}.log({x})", "log({x})",
                        r"\log\left(@\right)", 10),
    "log1p": FunctionRule(_transcendental("log1p"), lambda u: ir.Power(ir.Sum((ir.Num(1), u)), -1),
                          "{np}.log1p({x})", "log1p({x})", r"\log\left(1 + @\right)", 10),
    "sqrt": FunctionRule(_transcendental("sqrt"), lambda u: ir.product(ir.Num(0.5), ir.Power(u, -0.5)),
                         "{np}.sqrt({x})", "sqrt({x})", r"\sqrt{@}", 4),
    "sin": FunctionRule(_transcendental("sin"), _call("cos"), "{np}.sin({x})", "sin({x})",
                        r"\sin\left(@\right)", 10),
    "cos": FunctionRule(_transcendental("cos"), lambda u: ir.negate(ir.Call("sin", u)), "{np}.cos({x})",
                        "cos({x})", r"\cos\left(@\right)", 10),
    "tanh": FunctionRule(_transcendental("tanh"),
                         lambda u: ir.Sum((ir.Num(1), ir.negate(ir.Power(ir.Call("tanh", u), 2)))),
                         "{np}.tanh({x})", "tanh({x})", r"\tanh\left(@\right)", 20),
    # sigmoid' = sigmoid(u) sigmoid(-u): 1 - sigmoid(u) would round to 0 for u > 37 (exact: 4.25e-18 at 40)
    "sigmoid": FunctionRule(_sigmoid_value,
                            lambda u: ir.product(ir.Call("sigmoid", u), ir.Call("sigmoid", ir.negate(u))),
                            # numexpr: one exp, exact to rounding down to x = -709 (below, 0 for a subnormal)
                            "{sigmoid}({x})", "1 / (1 + exp(-{x}))", r"\sigma\left(@\right)", 14, 3.125),
    "abs": FunctionRule(lambda xp, x: xp.abs(x), _call("sign"), "{np}.abs({x})", "abs({x})",
                        r"\left|@\right|", promotes=False),  # abs'(0) = sign(0) = 0
    # relu'(0) = step(0) = 0
    "relu": FunctionRule(lambda xp, x: xp.maximum(x, 0), _call("step"), "{np}.maximum({x}, 0)",
                         "where({x} > 0, {x}, 0)", r"\operatorname{relu}\left(@\right)", promotes=False),
    "sign": FunctionRule(lambda xp, x: xp.sign(x), lambda u: ZERO, "{np}.sign({x})", None,
                         r"\operatorname{sign}\left(@\right)", promotes=False),
    "step": FunctionRule(_step_value, lambda u: ZERO, "{step}({x})", None, r"\operatorname{step}\left(@\right)",
                         1, 0.125, promotes=False),
    "erf": FunctionRule(_erf_value,
                        lambda u: ir.product(ir.Num(TWO_OVER_SQRT_PI), ir.Call("exp", ir.negate(ir.Power(u, 2)))),
                        "{erf}({x})", None, r"\operatorname{erf}\left(@\right)", 40, 4.0),
    # softplus' = sigmoid; log(1 + exp(x)) evaluated as logaddexp(0, x)
    "softplus": FunctionRule(_softplus_value, _call("sigmoid"), "{np}.logaddexp(0, {x})",
                             "where({x} > 0, {x}, 0) + log1p(exp(-abs({x})))", r"\operatorname{softplus}\left(@\right)",
                             24, 0.0),
}

assert set(FUNCTION_RULES) == set(ir.FUNCTIONS)
