"""Random valid programs: their gradients match central finite differences in float64."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import einflow as ef

N = 3
SMOOTH = ["exp", "tanh", "sigmoid", "sin", "cos", "softplus", "erf"]


@st.composite
def vector(draw, index: str, depth: int, names: list[str], counter: list[int], kinks: bool = False) -> str:
    """An expression whose only free index is ``index`` (bound where it is used); ``kinks``: also max/min
    reductions and maximum/minimum, differentiable away from ties."""
    leaves = [f"{name}[{index}]" for name in names]
    if depth <= 0:
        return draw(st.sampled_from(leaves + [f"A[{index},k{_next(counter)}] x[k{counter[0]}]"]))
    choice = draw(st.integers(0, 13 if kinks else 11))
    inner = lambda: draw(vector(index, depth - 1, names, counter, kinks))  # noqa: E731
    if choice == 12:  # a piecewise reduction binding its index like sum
        k = f"k{_next(counter)}"
        kind = draw(st.sampled_from(["max", "min"]))
        return f"{kind}[{k}](B[{index},{k}] ({draw(vector(k, depth - 1, names, counter, kinks))}))"
    if choice == 13:
        return f"{draw(st.sampled_from(['maximum', 'minimum']))}({inner()}, {inner()})"
    if choice == 0:
        return draw(st.sampled_from(leaves))
    if choice == 1:
        return f"{draw(st.sampled_from(['0.5', '2', '-1.5']))} * ({inner()})"
    if choice == 2:
        return f"{inner()} + {inner()}"
    if choice == 3:
        return f"{inner()} - {inner()}"
    if choice == 4:
        return f"{inner()} * ({inner()})"
    if choice == 5:
        return f"{draw(st.sampled_from(SMOOTH))}({inner()})"
    if choice == 6:
        return f"({inner()})^{draw(st.sampled_from(['2', '3']))}"
    if choice == 7:
        return f"{inner()} / (1 + ({inner()})^2)"
    if choice == 8:
        k = f"k{_next(counter)}"
        return f"sum[{k}](B[{index},{k}] ({draw(vector(k, depth - 1, names, counter, kinks))}))"
    if choice == 10:  # a normaliser over the expression's own index
        return f"{draw(st.sampled_from(['softmax', 'log_softmax']))}[{index}]({inner()})"
    if choice == 11:  # a smooth reduction binding its index like sum
        k = f"k{_next(counter)}"
        kind = draw(st.sampled_from(["logsumexp", "mean"]))
        return f"{kind}[{k}](B[{index},{k}] ({draw(vector(k, depth - 1, names, counter, kinks))}))"
    return f"log1p(({inner()})^2) + sqrt(1 + ({inner()})^2)"


def _next(counter: list[int]) -> int:
    counter[0] += 1
    return counter[0]


@st.composite
def programs(draw, kinks: bool = False) -> str:
    counter = [0]
    names = ["x", "y"]
    statements = []
    for number in range(draw(st.integers(0, 2))):
        target = f"h{number}"
        statements.append(f"{target}[i] = {draw(vector('i', 2, names, counter, kinks))}")
        names = names + [target]
    final = draw(st.integers(0, 2))
    if final == 0:
        body = f"sum[i]({draw(vector('i', 2, names, counter, kinks))})"
    elif final == 1:
        body = f"{draw(st.sampled_from(names))}[j] A[j,m] {draw(st.sampled_from(names))}[m]"
    else:
        body = f"tanh({draw(st.sampled_from(names))}[j] {draw(st.sampled_from(names))}[j]) + s"
    statements.append(f"L = {body}")
    return "\n".join(statements)


def _values(program: ef.Program, seed: int) -> dict:
    """Random inputs of the test's shapes; examples whose value is not finite or very large are skipped."""
    rng = np.random.default_rng(seed)
    shapes = {"x": (N,), "y": (N,), "A": (N, N), "B": (N, N), "s": ()}
    values = {name: 0.5 * rng.normal(size=shapes[name]) for name in program.inputs}
    value = float(program(values))
    assume(np.isfinite(value) and abs(value) < 1e4)
    return values


def _finite_difference(program: ef.Program, values: dict, wrt: str, eps: float = 1e-6) -> np.ndarray:
    base = values[wrt]
    out = np.zeros_like(base)
    for index in np.ndindex(base.shape):
        plus, minus = base.copy(), base.copy()
        plus[index] += eps
        minus[index] -= eps
        out[index] = (float(program({**values, wrt: plus})) - float(program({**values, wrt: minus}))) / (2 * eps)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=programs(), seed=st.integers(0, 2**16), wrt=st.sampled_from(["x", "A", "B", "y"]))
def test_gradient_matches_finite_differences(text, seed, wrt):
    program = ef.compile(text)
    assume(wrt in program.inputs)
    values = _values(program, seed)
    gradient = ef.grad(program, wrt=wrt)
    ours = gradient(values)
    reference = _finite_difference(program, values, wrt)
    assume(np.all(np.isfinite(reference)))
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5 * (1 + np.abs(reference).max()))
    # the printed program is a program: it re-parses and gives the same numbers
    np.testing.assert_allclose(ef.compile(str(gradient))(values), ours, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=programs(), seed=st.integers(0, 2**16))
def test_hessian_matches_finite_differences_of_gradient(text, seed):
    program = ef.compile(text)
    assume("x" in program.inputs)
    values = _values(program, seed)
    gradient = ef.grad(program, wrt="x")
    hessian = ef.hessian(program, wrt="x")
    H = hessian(values)
    columns = []
    for k in range(N):
        plus, minus = values["x"].copy(), values["x"].copy()
        plus[k] += 1e-6
        minus[k] -= 1e-6
        columns.append((gradient({**values, "x": plus}) - gradient({**values, "x": minus})) / 2e-6)
    reference = np.stack(columns, axis=1)
    assume(np.all(np.isfinite(reference)))
    np.testing.assert_allclose(H, reference, rtol=1e-4, atol=1e-5 * (1 + np.abs(reference).max()))
    np.testing.assert_allclose(H, H.T, rtol=1e-8, atol=1e-8 * (1 + np.abs(H).max()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=programs(kinks=True), seed=st.integers(0, 2**16), wrt=st.sampled_from(["x", "A", "B", "y"]))
def test_gradient_through_max_and_min_matches_finite_differences_away_from_ties(text, seed, wrt):
    """max/min reductions and maximum/minimum: the gradient is the indicator of the winner. Points within a
    finite-difference step of a tie (where two step sizes disagree) are skipped: there the derivative jumps."""
    program = ef.compile(text)
    assume(wrt in program.inputs)
    values = _values(program, seed)
    reference = _finite_difference(program, values, wrt)
    finer = _finite_difference(program, values, wrt, eps=1e-7)
    assume(np.all(np.isfinite(reference)))
    assume(np.allclose(reference, finer, rtol=1e-3, atol=1e-4 * (1 + np.abs(reference).max())))
    gradient = ef.grad(program, wrt=wrt)
    ours = gradient(values)
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5 * (1 + np.abs(reference).max()))
    np.testing.assert_allclose(ef.compile(str(gradient))(values), ours, rtol=1e-12, atol=1e-12)
