"""The elementwise functions: one row each, read by every stage that needs to know a function.

A row holds the value rule (array code, for folding constants and for backends), the source text the
generated code calls, the numexpr text (fused evaluation), the derivative rule (IR), LaTeX, a cost per
element, and the temporary arrays the value rule allocates besides its result (the memory model).
"""

from __future__ import annotations

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
    ``temporaries`` arrays of the argument's size (float64) that ``value`` allocates besides its result.
    """

    value: Callable[[Any, Any], Any]
    derivative: Callable[[ir.Expr], ir.Expr]
    source: str
    numexpr: str | None
    latex: str
    cost: int = 1
    temporaries: float = 0.0


def _call(name: str) -> Callable[[ir.Expr], ir.Expr]:
    return lambda u: ir.Call(name, u)


def _step_value(xp: Any, x: Any) -> Any:
    return xp.greater(x, 0).astype(xp.result_type(x))


def _sigmoid_value(xp: Any, x: Any) -> Any:
    # with e = exp(-|x|): 1/(1+e) for x >= 0 and e/(1+e) below: never overflows, accurate in both tails
    # (sigmoid(-40) = 4.2e-18 where 0.5 (tanh(x/2) + 1) rounds to 0), keeps float32, one exp only
    e = xp.exp(-1 * xp.abs(x))  # -1 * : booleans become integers
    r = 1 / (1 + e)
    return xp.where(x >= 0, r, e * r)


ZERO = ir.Num(0)

FUNCTION_RULES: dict[str, FunctionRule] = {
    "exp": FunctionRule(lambda xp, x: xp.exp(x), _call("exp"), "{np}.exp({x})", "exp({x})",
                        r"\exp\left(@\right)", 10),
    "log": FunctionRule(lambda xp, x: xp.log(x), lambda u: ir.Power(u, -1), "{np}.log({x})", "log({x})",
                        r"\log\left(@\right)", 10),
    "log1p": FunctionRule(lambda xp, x: xp.log1p(x), lambda u: ir.Power(ir.Sum((ir.Num(1), u)), -1),
                          "{np}.log1p({x})", "log1p({x})", r"\log\left(1 + @\right)", 10),
    "sqrt": FunctionRule(lambda xp, x: xp.sqrt(x), lambda u: ir.product(ir.Num(0.5), ir.Power(u, -0.5)),
                         "{np}.sqrt({x})", "sqrt({x})", r"\sqrt{@}", 4),
    "sin": FunctionRule(lambda xp, x: xp.sin(x), _call("cos"), "{np}.sin({x})", "sin({x})",
                        r"\sin\left(@\right)", 10),
    "cos": FunctionRule(lambda xp, x: xp.cos(x), lambda u: ir.negate(ir.Call("sin", u)), "{np}.cos({x})",
                        "cos({x})", r"\cos\left(@\right)", 10),
    "tanh": FunctionRule(lambda xp, x: xp.tanh(x),
                         lambda u: ir.Sum((ir.Num(1), ir.negate(ir.Power(ir.Call("tanh", u), 2)))),
                         "{np}.tanh({x})", "tanh({x})", r"\tanh\left(@\right)", 20),
    "sigmoid": FunctionRule(_sigmoid_value,
                            lambda u: ir.product(ir.Call("sigmoid", u),
                                                 ir.Sum((ir.Num(1), ir.negate(ir.Call("sigmoid", u))))),
                            # numexpr: one exp, exact to rounding down to x = -709 (below, 0 for a subnormal)
                            "{sigmoid}({x})", "1 / (1 + exp(-{x}))", r"\sigma\left(@\right)", 14, 3.125),
    "abs": FunctionRule(lambda xp, x: xp.abs(x), _call("sign"), "{np}.abs({x})", "abs({x})",
                        r"\left|@\right|"),  # abs'(0) = sign(0) = 0
    "relu": FunctionRule(lambda xp, x: xp.maximum(x, 0), _call("step"), "{np}.maximum({x}, 0)",
                         "where({x} > 0, {x}, 0)", r"\operatorname{relu}\left(@\right)"),  # relu'(0) = step(0) = 0
    "sign": FunctionRule(lambda xp, x: xp.sign(x), lambda u: ZERO, "{np}.sign({x})", None,
                         r"\operatorname{sign}\left(@\right)"),
    "step": FunctionRule(_step_value, lambda u: ZERO, "{step}({x})", None, r"\operatorname{step}\left(@\right)",
                         1, 0.125),
}

assert set(FUNCTION_RULES) == set(ir.FUNCTIONS)
