"""Program calls and plans: strict keywords with suggestions, positional inputs, numpy scalars for scalar values."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

A = np.array([[1.0, 2.0], [3.0, 4.0]])
X = np.array([1.0, -1.0])


def test_unknown_keyword_is_a_type_error_with_a_suggestion():
    p = ef.compile("y[i] = A[i,j] x[j]")
    with pytest.raises(TypeError) as caught:
        p(A=A, x=X, optimise="greedy")
    message = str(caught.value)
    assert isinstance(caught.value, ef.EinflowError)
    assert "'optimise'" in message and "did you mean 'optimize'" in message
    assert "reads A, x" in message and "backend, optimize, memory_limit, chunks" in message
    with pytest.raises(ef.ArgumentError, match="did you mean 'x'"):
        p(A=A, xx=X)
    with pytest.raises(ef.ArgumentError, match="'zzz'") as caught:
        p(A=A, x=X, zzz=1)
    assert "did you mean" not in str(caught.value)


def test_positional_inputs_follow_p_inputs():
    p = ef.compile("y[i] = A[i,j] x[j]")
    assert p.inputs == ("A", "x")
    np.testing.assert_array_equal(p(A, X), A @ X)
    np.testing.assert_array_equal(p(A, x=X), A @ X)
    np.testing.assert_array_equal(p(A, X, backend="numpy", optimize="greedy"), A @ X)
    with pytest.raises(ef.ArgumentError, match="takes 2 positional"):
        p(A, X, X)
    with pytest.raises(ef.ArgumentError, match="both by position and by keyword"):
        p(A, X, A=A)
    with pytest.raises(ef.TensorNameError, match="'x' is not bound"):
        p(A)


def test_a_mapping_may_hold_arrays_the_program_does_not_read():
    p = ef.compile("y[i] = A[i,j] x[j]")
    np.testing.assert_array_equal(p({"A": A, "x": X, "T": np.ones(9)}), A @ X)
    g = ef.grad("f = sum[i](x[i] + c)", wrt="x")  # the gradient no longer reads c
    np.testing.assert_array_equal(g({"x": X, "c": 2.0}), np.ones(2))
    # a derivative accepts its source program's inputs by keyword too (the caller holds them all) ...
    assert g.accepts == {"x", "c", "f"}
    np.testing.assert_array_equal(g(x=X, c=2.0), np.ones(2))
    # ... but nothing else
    with pytest.raises(TypeError, match="unexpected keyword 'd'"):
        g(x=X, d=2.0)


def test_plan_options_are_not_shapes():
    p = ef.compile("C[i,j] = A[i,k] B[k,j]")
    report = p.plan(A=(100, 200), B=(200, 50), memory_limit=10**9)
    assert report.flops == 2 * 100 * 200 * 50
    with pytest.raises(ef.MemoryLimitError):
        p.plan(A=(100, 200), B=(200, 50), memory_limit=5)
    with pytest.raises(ef.ArgumentError, match="did you mean 'memory_limit'"):
        p.plan(A=(100, 200), B=(200, 50), memory_limt=5)
    assert p.plan((100, 200), "200x50").flops == p.plan(A=(100, 200), B=(200, 50)).flops
    assert p.plan({"A": (100, 200), "B": (200, 50), "other": (1,)}).contractions == 1


@pytest.mark.parametrize("text, arrays", [
    ("s = x[i] x[i]", {"x": X}),
    ("s = sum[i](exp(x[i]))", {"x": X}),
    ("s = A[i,i]", {"A": A}),
    ("s = x[i] A[i,j] x[j]", {"A": A, "x": X}),
    ("s = 2", {}),
    ("s = c", {"c": np.float32(2.0)}),
    ("s = n[i] n[i]", {"n": np.arange(3)}),
])
def test_scalar_values_are_numpy_scalars(text, arrays):
    p = ef.compile(text)
    for _ in range(2):  # the planning call and the cached fast path
        value = p(arrays)
        assert isinstance(value, np.generic), type(value)
    value, doubled = ef.compile(text + "\ns2 = 2 s; s, s2")(arrays)
    assert isinstance(value, np.generic) and isinstance(doubled, np.generic)
    assert isinstance(value, np.generic)


def test_derivative_programs_give_numpy_scalars():
    f = "f = x[i] A[i,j] x[j]"
    value, gradient = ef.value_and_grad(f, wrt="x")(A=A, x=X)
    assert isinstance(value, np.float64) and isinstance(gradient, np.ndarray)
    d = ef.grad("f = sum[i](exp(s x[i]))", wrt="s")(s=np.float64(0.5), x=X)
    assert isinstance(d, np.float64)
    np.testing.assert_allclose(d, np.sum(X * np.exp(0.5 * X)))
    assert isinstance(ef.hessian("f = s s s", wrt="s")(s=np.float64(2.0)), np.float64)
