"""The elementwise function table: values against numpy references, tails, dtypes, derivative rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

import einflow as ef
from einflow.lang.functions import FUNCTION_RULES

X = np.array([-3.0, -0.5, 0.0, 0.25, 2.0])
POSITIVE = np.array([0.1, 0.5, 1.0, 4.0])

REFERENCES = {
    "exp": (np.exp, X), "log": (np.log, POSITIVE), "log1p": (np.log1p, POSITIVE), "sqrt": (np.sqrt, POSITIVE),
    "sin": (np.sin, X), "cos": (np.cos, X), "tanh": (np.tanh, X),
    "sigmoid": (lambda v: np.array([1 / (1 + math.exp(-t)) for t in v]), X),
    "abs": (np.abs, X), "relu": (lambda v: np.maximum(v, 0), X), "sign": (np.sign, X),
    "step": (lambda v: (v > 0).astype(float), X),
    "erf": (lambda v: np.array([math.erf(t) for t in v]), X),
    "softplus": (lambda v: np.array([math.log1p(math.exp(t)) for t in v]), X),
    "conj": (np.conj, X), "real": (np.real, X), "imag": (np.imag, X), "abs2": (np.square, X),
    "angle": (np.angle, X),
}


def test_every_function_has_a_reference():
    assert set(REFERENCES) == set(FUNCTION_RULES)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_values(name):
    reference, x = REFERENCES[name]
    np.testing.assert_allclose(ef.evaluate(f"y[i] = {name}(x[i])", x=x), reference(x), rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", ["exp", "log", "log1p", "sqrt", "sin", "cos", "tanh", "sigmoid", "erf", "softplus"])
def test_derivative_rule_matches_central_differences(name):
    _, x = REFERENCES[name]
    x = x[x != 0] if name in ("log", "sqrt") else x
    gradient = ef.grad(f"f = sum[i]({name}(x[i]))", wrt="x")(x=x)
    f = ef.compile(f"f = sum[i]({name}(x[i]))")
    eps = 1e-6
    numeric = [(float(f(x=x + eps * e)) - float(f(x=x - eps * e))) / (2 * eps) for e in np.eye(len(x))]
    np.testing.assert_allclose(gradient, numeric, rtol=1e-6, atol=1e-8)


def test_sigmoid_is_accurate_in_both_tails_and_never_overflows():
    x = np.array([-745.0, -40.0, -20.0, 20.0, 40.0, 745.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = ef.evaluate("y[i] = sigmoid(x[i])", x=x)
    expected = np.array([math.exp(t) / (1 + math.exp(t)) if t < 0 else 1 / (1 + math.exp(-t)) for t in x])
    np.testing.assert_allclose(y, expected, rtol=1e-14, atol=0)
    assert y[1] > 0  # 4.2e-18, not rounded to zero


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_float32_stays_float32(name):
    _, x = REFERENCES[name]
    assert ef.evaluate(f"y[i] = {name}(x[i])", x=x.astype(np.float32)).dtype == np.float32


def test_softplus_is_stable_in_both_tails():
    x = np.array([-1000.0, -40.0, 40.0, 1000.0])
    with np.errstate(over="raise", invalid="raise"):
        y = ef.evaluate("y[i] = softplus(x[i])", x=x)
    np.testing.assert_allclose(y, [0.0, math.log1p(math.exp(-40.0)), 40.0 + math.log1p(math.exp(-40.0)), 1000.0],
                               rtol=1e-15, atol=0)
    assert y[1] > 0
    y32 = ef.evaluate("y[i] = softplus(x[i])", x=np.array([-200.0, 200.0], np.float32))
    assert y32.dtype == np.float32 and np.all(np.isfinite(y32))


def test_integers_promote_like_numpy_for_transcendental_functions():
    assert ef.evaluate("y[i] = exp(x[i])", x=np.arange(3)).dtype == np.float64
    assert ef.evaluate("y[i] = relu(x[i])", x=np.arange(-1, 2)).dtype == np.int64
    assert ef.evaluate("y[i] = sigmoid(x[i])", x=np.array([True, False])).dtype == np.float64
