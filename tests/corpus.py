"""Shared test data: the corpus of programs every backend runs, with independent numpy references.

Test modules import it from here (``from corpus import ...``) instead of from one another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import einflow as ef

__all__ = ["Case", "CORPUS", "DERIVATIVES", "SPECIAL_VALUES", "Special", "assert_matches", "needs_grad"]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class Case:
    """A program, its input shapes (``()`` for a 0-d array, ``"float"`` for a Python number), a reference."""

    name: str
    text: str
    shapes: dict[str, Any]
    reference: Callable[..., Any]
    positive: bool = False  # inputs drawn from (0.5, 1.5) instead of N(0, 1)
    integer: bool = False  # integer inputs

    def arrays(self, seed: int = 0) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        out: dict[str, Any] = {}
        for name, shape in self.shapes.items():
            if shape == "float":
                out[name] = float(rng.uniform(0.5, 1.5))
            elif self.integer:
                out[name] = rng.integers(-5, 6, size=shape)
            elif self.positive:
                out[name] = rng.uniform(0.5, 1.5, size=shape)
            else:
                out[name] = rng.standard_normal(shape)
        return out


# The core corpus: each program with an independent reference written with numpy (einsum, ufuncs, closed forms).
CORPUS: list[Case] = [
    Case("matmul", "C[i,j] = A[i,k] B[k,j]", {"A": (5, 4), "B": (4, 3)},
         lambda A, B: np.einsum("ik,kj->ij", A, B)),
    Case("chain", "y[i] = A[i,j] B[j,k] x[k]", {"A": (6, 5), "B": (5, 7), "x": (7,)},
         lambda A, B, x: A @ (B @ x)),
    Case("dot", "s = x[i] y[i]", {"x": (9,), "y": (9,)}, lambda x, y: np.dot(x, y)),
    Case("outer", "O[i,j] = x[i] y[j]", {"x": (5,), "y": (3,)}, lambda x, y: np.multiply.outer(x, y)),
    Case("trace", "t = A[i,i]", {"A": (5, 5)}, lambda A: np.trace(A)),
    Case("diagonal", "d[i] = A[i,i]", {"A": (5, 5)}, lambda A: np.diagonal(A).copy()),
    Case("hadamard", "H[i,j] = A[i,j] B[i,j]", {"A": (4, 3), "B": (4, 3)}, lambda A, B: A * B),
    Case("bound-target", "y[i] = A[i,j] x[i]", {"A": (4, 6), "x": (4,)},
         lambda A, x: np.einsum("ij,i->i", A, x)),
    Case("broadcast-sum", "Z[b,f] = X[b,f] + c[f]", {"X": (5, 3), "c": (3,)}, lambda X, c: X + c[None, :]),
    Case("per-term-reduce", "y[i] = A[i,j] + c[i]", {"A": (4, 6), "c": (4,)}, lambda A, c: A.sum(axis=1) + c),
    Case("scaled-difference", "z[i] = 2 x[i] - 0.5 y[i]", {"x": (7,), "y": (7,)}, lambda x, y: 2 * x - 0.5 * y),
    Case("exp-log", "y[i] = exp(x[i]) + log(1 + x[i]^2)", {"x": (6,)},
         lambda x: np.exp(x) + np.log(1 + x**2)),
    Case("trig-sqrt", "y[i] = sqrt(x[i]) sin(x[i]) + cos(x[i]) tanh(x[i])", {"x": (6,)},
         lambda x: np.sqrt(x) * np.sin(x) + np.cos(x) * np.tanh(x), positive=True),
    Case("nonsmooth", "y[i] = sigmoid(x[i]) + relu(x[i]) - abs(x[i]) + sign(x[i]) step(x[i])", {"x": (8,)},
         lambda x: _sigmoid(x) + np.maximum(x, 0) - np.abs(x) + np.sign(x) * (x > 0)),
    Case("log1p", "y[i] = log1p(x[i] x[i])", {"x": (6,)}, lambda x: np.log1p(x * x)),
    Case("logistic-loss", "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", {"X": (8, 3), "y": (8,), "w": (3,)},
         lambda X, y, w: np.sum(np.log1p(np.exp(-y * (X @ w))))),
    Case("softmax", "m[i] = exp(x[i])\nZ = sum[i](m[i])\np[i] = m[i] / Z", {"x": (6,)},
         lambda x: np.exp(x) / np.exp(x).sum()),
    Case("divisor-scope", "y[i] = x[i]^3 / (1 + x[j] x[j])", {"x": (5,)}, lambda x: x**3 / (1 + x @ x)),
    Case("negative-powers", "y[i] = x[i]^-0.5 + x[i]^(-1)", {"x": (5,)}, lambda x: x**-0.5 + 1 / x, positive=True),
    Case("delta-survives", "J[i,j] = delta[i,j] exp(x[i])", {"x": (5,)}, lambda x: np.diag(np.exp(x))),
    Case("delta-eliminated", "y[i] = delta[i,j] x[j]", {"x": (5,)}, lambda x: x.copy()),
    Case("delta-sized", "size p = x; size q = x\nH[p,q] = 2 delta[p,q]", {"x": (4,)}, lambda x: 2 * np.eye(4)),
    Case("delta-rank3", "T[i,j,k] = delta[i,j] delta[j,k] x[i]", {"x": (3,)},
         lambda x: np.einsum("ij,jk,i->ijk", np.eye(3), np.eye(3), x)),
    Case("return-tuple", "h[i] = tanh(W[i,j] x[j] + b[i])\no = v[i] h[i]\no, h",
         {"W": (4, 3), "x": (3,), "b": (4,), "v": (4,)},
         lambda W, x, b, v: (v @ np.tanh(W @ x + b), np.tanh(W @ x + b))),
    Case("batched-affine", "Y[b,i] = X[b,j] W[i,j] + bias[i]", {"X": (6, 4), "W": (3, 4), "bias": (3,)},
         lambda X, W, bias: X @ W.T + bias),
    Case("quadratic-form", "q = x[i] A[i,j] x[j]", {"x": (5,), "A": (5, 5)}, lambda x, A: x @ A @ x),
    Case("frobenius", "n = sum[i,j](A[i,j]^2)", {"A": (4, 5)}, lambda A: np.sum(A**2)),
    Case("integers", "y[i] = 6 x[i] + M[i,j] x[j]", {"x": (4,), "M": (4, 4)}, lambda x, M: 6 * x + M @ x,
         integer=True),
    Case("python-scalar", "y[i] = a x[i] + a", {"a": "float", "x": (5,)}, lambda a, x: a * x + a),
    Case("zero-d-array", "y[i] = s x[i]", {"s": (), "x": (5,)}, lambda s, x: s * x),
    Case("three-tensor", "R[a,d] = T[a,b,c] U[c,b,d]", {"T": (3, 4, 5), "U": (5, 4, 2)},
         lambda T, U: np.einsum("abc,cbd->ad", T, U)),
]

# Derivative programs (need einflow.grad/hessian): (name, builder, shapes, closed-form reference).
DERIVATIVES: list[tuple[str, Callable[[], Any], dict[str, Any], Callable[..., Any]]] = [
    ("grad-logistic", lambda: ef.grad("L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", wrt="w"),
     {"X": (8, 3), "y": (8,), "w": (3,)},
     lambda X, y, w: -X.T @ (y * _sigmoid(-y * (X @ w)))),
    ("grad-tanh-layer", lambda: ef.grad("f = sum[i](tanh(W[i,j] x[j]))", wrt="W"), {"W": (4, 3), "x": (3,)},
     lambda W, x: np.multiply.outer(1 - np.tanh(W @ x) ** 2, x)),
    ("hessian-quadratic", lambda: ef.hessian("f = x[i] A[i,j] x[j]", wrt="x"), {"x": (5,), "A": (5, 5)},
     lambda x, A: A + A.T),
    ("hessian-elementwise", lambda: ef.hessian("f = sum[i](exp(x[i]))", wrt="x"), {"x": (5,)},
     lambda x: np.diag(np.exp(x))),
]

needs_grad = pytest.mark.skipif(not (hasattr(ef, "grad") and hasattr(ef, "hessian")),
                                reason="einflow.grad/hessian are not available yet")


def assert_matches(result: Any, expected: Any) -> None:
    if isinstance(expected, tuple):
        assert isinstance(result, tuple) and len(result) == len(expected)
        for got, want in zip(result, expected):
            assert_matches(got, want)
        return
    got = np.asarray(result)
    want = np.asarray(expected)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@dataclass(frozen=True)
class Special:
    """A program with fixed inputs holding the values backends could disagree on (inf, nan, bool, ints).

    ``program`` is einflow text or a function building the program (derivatives). Every backend must
    return the same values (nan where nan) and the same dtype as numpy.
    """

    name: str
    program: str | Callable[[], Any]
    arrays: dict[str, Any]

    def build(self) -> Any:
        return ef.compile(self.program) if isinstance(self.program, str) else self.program()


_INF, _NAN = np.inf, np.nan

SPECIAL_VALUES: list[Special] = [
    # deltas keep inf and nan on the diagonal and exact zeros off it (no inf * 0 = nan)
    Special("delta-inf", "T[i,j] = delta[i,j] x[j]", {"x": np.array([_INF, 1.0])}),
    Special("delta-nan-rank3", "T[i,j,k] = delta[i,j] delta[j,k] x[i]", {"x": np.array([_NAN, 1.0, -_INF])}),
    Special("jacobian-exp-inf", "J[i,j] = delta[i,j] exp(x[i])", {"x": np.array([_INF, -_INF, _NAN, 0.0])}),
    Special("delta-matrix", "T[i,j,k,l] = delta[i,k] A[i,j] delta[j,l]",
            {"A": np.array([[_INF, 2.0], [_NAN, -1.0]])}),
    Special("hessian-exp-inf", lambda: ef.hessian("f = sum[i](exp(x[i]))", wrt="x"), {"x": np.array([_INF, 0.0])}),
    Special("jacobian-tanh-nan", lambda: ef.jacobian("y[i] = tanh(x[i])", wrt="x"), {"x": np.array([_NAN, 1.0])}),
    # a contraction through inf is nan on every backend (inf * 0 is nan in a sum of products)
    Special("dot-inf-zero", "s = x[i] y[i]", {"x": np.array([_INF, 1.0]), "y": np.array([0.0, 1.0])}),
    Special("sqrt-negative", "y[i] = sqrt(x[i])", {"x": np.array([-1.0, 4.0])}),
    Special("sigmoid-extremes", "y[i] = sigmoid(x[i])", {"x": np.array([-1000.0, 1000.0, 0.0, _NAN])}),
    # booleans are the numbers 0 and 1 (int64): sums count
    Special("bool-dot", "s = x[i] x[i]", {"x": np.array([True, True, False])}),
    Special("bool-product", "y[i] = a[i] b[i]",
            {"a": np.array([True, False, True]), "b": np.array([True, True, False])}),
    Special("bool-matmul", "C[i,j] = A[i,k] B[k,j]", {"A": np.eye(3, dtype=bool), "B": np.ones((3, 2), dtype=bool)}),
    Special("bool-sum", "n = sum[i](x[i])", {"x": np.array([True, True, True, False])}),
    # the transcendental functions compute integers and booleans in float64
    Special("exp-uint8", "y[i] = exp(x[i])", {"x": np.array([0, 1, 255], dtype=np.uint8)}),
    Special("exp-int8", "y[i] = exp(x[i])", {"x": np.array([-128, 0, 127], dtype=np.int8)}),
    Special("log-bool", "y[i] = log(x[i])", {"x": np.array([True, False])}),
    Special("tanh-int16", "y[i] = tanh(x[i])", {"x": np.array([-3, 0, 3], dtype=np.int16)}),
    # weak literals never widen
    Special("weak-literal-float32", "y[i,j,k] = 0.5 A[i,j] n[k]",
            {"A": np.ones((2, 3), dtype=np.float32), "n": np.array([1, 2], dtype=np.int8)}),
    Special("float32-stays", "y[i] = 2 A[i,j] x[j] + 1", {"A": np.ones((3, 2), dtype=np.float32),
                                                            "x": np.array([1.5, -2.0], dtype=np.float32)}),
    Special("int-stays", "y[i] = 3 M[i,j] x[j]", {"M": np.arange(6).reshape(3, 2), "x": np.array([1, -1])}),
    Special("empty", "s = x[i] x[i]", {"x": np.zeros(0)}),
]
