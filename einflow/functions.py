"""The elementwise functions: value rule (array code) beside derivative rule (IR), one entry each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from einflow import ir

__all__ = ["FunctionRule", "FUNCTION_RULES"]


@dataclass(frozen=True)
class FunctionRule:
    """``value(xp, x)`` evaluates f elementwise on the array module ``xp``; ``derivative(u)`` is f'(u) as IR."""

    value: Callable[[Any, Any], Any]
    derivative: Callable[[ir.Expr], ir.Expr]


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


ZERO = ir.Num(0)

FUNCTION_RULES: dict[str, FunctionRule] = {
    #            value rule                                    derivative rule f'(u)
    "exp": FunctionRule(_transcendental("exp"), _call("exp")),
    "log": FunctionRule(_transcendental("log"), lambda u: ir.Power(u, -1)),
    "log1p": FunctionRule(_transcendental("log1p"), lambda u: ir.Power(ir.Sum((ir.Num(1), u)), -1)),
    "sqrt": FunctionRule(_transcendental("sqrt"), lambda u: ir.product(ir.Num(0.5), ir.Power(u, -0.5))),
    "sin": FunctionRule(_transcendental("sin"), _call("cos")),
    "cos": FunctionRule(_transcendental("cos"), lambda u: ir.negate(ir.Call("sin", u))),
    "tanh": FunctionRule(_transcendental("tanh"),
                         lambda u: ir.Sum((ir.Num(1), ir.negate(ir.Power(ir.Call("tanh", u), 2))))),
    # sigmoid' = sigmoid(u) sigmoid(-u): 1 - sigmoid(u) would round to 0 for u > 37 (exact: 4.25e-18 at 40)
    "sigmoid": FunctionRule(_sigmoid_value,
                            lambda u: ir.product(ir.Call("sigmoid", u), ir.Call("sigmoid", ir.negate(u)))),
    "abs": FunctionRule(lambda xp, x: xp.abs(x), _call("sign")),  # abs'(0) = sign(0) = 0
    "relu": FunctionRule(lambda xp, x: xp.maximum(x, 0), _call("step")),  # relu'(0) = step(0) = 0
    "sign": FunctionRule(lambda xp, x: xp.sign(x), lambda u: ZERO),
    "step": FunctionRule(_step_value, lambda u: ZERO),
}

assert set(FUNCTION_RULES) == set(ir.FUNCTIONS)
