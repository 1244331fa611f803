"""Issue #10's reproducers: values and derivatives compared with closed forms in numpy float64.

Each case gives the program, what to compute, the inputs and the meaning of the program written out by
hand as a numpy function (from the scope rules of the language reference). Derivatives are compared with
float64 central differences of that closed form; each derivative program is also printed, re-parsed and
run again. Cases that previously failed: this list only ever grows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import einflow as ef

_rng = np.random.default_rng(10)


def _u(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return _rng.uniform(low, high, size=shape)


def _sigmoid(z: Any) -> Any:
    return 1 / (1 + np.exp(-z))


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    kind: str  # value | grad | value_and_grad | hessian | jacobian(forward) | jacobian(reverse)
    wrt: Any
    arrays: dict[str, np.ndarray]
    meaning: Callable[[dict[str, np.ndarray]], Any]  # the program's value, by hand


_X3 = _u(3)
CASES = [
    # 1. a delta with both indices contracted is the size of its index, not 1 (boolean "ones" saturate)
    Case("delta-trace-value", "size i, j = A\ny[p] = x[p] delta[i,i] delta[j,j]", "value", None,
         {"x": _u(3), "A": _u(3, 3)}, lambda a: 9 * a["x"]),
    Case("delta-trace-grad", "f = sum[a,n](x[k] y[k] + w[a] v[n])", "grad", "y",
         {"x": _u(4), "y": _u(4), "w": _u(2), "v": _u(3)},
         lambda a: 6 * a["x"] @ a["y"] + a["w"].sum() * a["v"].sum()),
    # 2. a reduction whose body is a sum of terms keeps the factor |a| for terms without a
    Case("sum-over-broadcast-term-grad", "f = sum[a,m](y[m] + w[a] y[m])", "grad", "y",
         {"y": _u(3), "w": np.array([0.7, 0.5])},
         lambda a: 2 * a["y"].sum() + a["w"].sum() * a["y"].sum()),
    Case("sum-over-broadcast-term-value-and-grad", "T[i] = sum[a](x[i] + x[i] tanh(w[a]))\nf = sum[i](T[i] T[i])",
         "value_and_grad", "w", {"x": _u(3), "w": _u(4)},
         lambda a: np.sum((a["x"] * (4 + np.tanh(a["w"]).sum())) ** 2)),
    # 3. a dummy index contracted in a scope and, under the same name, in the enclosing product
    Case("same-dummy-nested-grad", "f = x[k] y[k] exp(x[k] x[k])", "grad", "y",
         {"x": _u(3), "y": _u(3)}, lambda a: (a["x"] @ a["y"]) * np.exp(a["x"] @ a["x"])),
    Case("cosine-similarity-grad", "f = x[i] y[i] / (sqrt(x[i] x[i]) sqrt(y[i] y[i]))", "grad", "y",
         {"x": _u(4), "y": _u(4)},
         lambda a: (a["x"] @ a["y"]) / (np.sqrt(a["x"] @ a["x"]) * np.sqrt(a["y"] @ a["y"]))),
    Case("cosine-similarity-grad-both", "f = x[i] y[i] / (sqrt(x[i] x[i]) sqrt(y[i] y[i]))", "grad", ["x", "y"],
         {"x": _u(4), "y": _u(4)},
         lambda a: (a["x"] @ a["y"]) / (np.sqrt(a["x"] @ a["x"]) * np.sqrt(a["y"] @ a["y"]))),
    Case("trace-inside-function-grad", "L = sum[j](B[c,j] x[c] tanh(A[c,c]))", "grad", "x",
         {"B": _u(3, 2), "x": _u(3), "A": _u(3, 3)},
         lambda a: np.sum(a["B"] * a["x"][:, None]) * np.tanh(np.trace(a["A"]))),
    Case("trace-inside-function-grad-A", "L = sum[j](B[c,j] x[c] tanh(A[c,c]))", "grad", "A",
         {"B": _u(3, 2), "x": _u(3), "A": _u(3, 3)},
         lambda a: np.sum(a["B"] * a["x"][:, None]) * np.tanh(np.trace(a["A"]))),
    # 4. shared helpers: two deltas with different index sizes are different expressions
    Case("cse-respects-sizes-grad-list", "f = sum[j,c](-y[j] + R[c])", "grad", ["y", "R"],
         {"y": _u(3), "R": _u(2)}, lambda a: -2 * a["y"].sum() + 3 * a["R"].sum()),
    Case("cse-respects-sizes-grad-R", "f = sum[j,c](-y[j] + R[c])", "grad", "R",
         {"y": _u(3), "R": _u(2)}, lambda a: -2 * a["y"].sum() + 3 * a["R"].sum()),
    # 5. derivative programs must size every index they use
    Case("hessian-quadratic-form-sizes", "f = x[i] X[i,j] X[k,j] x[k]", "hessian", ["X", "x"],
         {"x": _u(3), "X": _u(3, 2)}, lambda a: np.sum((a["X"].T @ a["x"]) ** 2)),
    Case("grad-reduction-then-delta-trace", "f = sum[m](A[m,l] y[l]) delta[m,m]", "grad", "y",
         {"A": _u(3, 2), "y": _u(2)}, lambda a: 3 * np.sum(a["A"] @ a["y"])),
    Case("hessian-diagonal-of-implicit-target",
         "h1 = P[j] - U[o] U[o] - y[k] z[n] z[m] P[i]\nh2[n,m,l] = h1[i,i,n,m,l]\nL = sum[n,m,l](sigmoid(h2[n,m,l]))",
         "hessian", "U", {"P": _u(3), "U": _u(2), "y": _u(3), "z": _u(2)},
         lambda a: np.sum(_sigmoid(
             np.einsum("iinml->nml",
                       a["P"][:, None, None, None, None] - a["U"] @ a["U"]
                       - a["y"][None, :, None, None, None] * a["z"][None, None, :, None, None]
                       * a["z"][None, None, None, :, None] * a["P"][None, None, None, None, :])))),
    # 6. forward-mode Jacobians through intermediates
    Case("jacobian-forward-through-intermediate", "h[k,m] = x[k] z[m] + s\nY[k,m] = h[k,m] + s",
         "jacobian(forward)", "s", {"x": _u(3), "z": _u(2), "s": np.array(0.3)},
         lambda a: np.outer(a["x"], a["z"]) + 2 * a["s"]),
    Case("jacobian-reverse-through-intermediate", "h[k,m] = x[k] z[m] + s\nY[k,m] = h[k,m] + s",
         "jacobian(reverse)", "s", {"x": _u(3), "z": _u(2), "s": np.array(0.3)},
         lambda a: np.outer(a["x"], a["z"]) + 2 * a["s"]),
    # 7. the simplifier must terminate
    Case("hessian-recursion-reduction-of-sum", "T[i] = sum[a](x[i] + w[a] x[i])\nf = T[i] T[i]", "hessian", "x",
         {"x": _u(3), "w": _u(2)}, lambda a: np.sum((a["x"] * (2 + a["w"].sum())) ** 2)),
    Case("hessian-recursion-broadcast-sum",
         "h1 = U[o] U[o] + x[i] y[k]\nh2[m] = h1[i,m]\nL = sum[m](sigmoid(h2[m]))", "hessian", "U",
         {"U": _u(2), "x": _u(3), "y": _u(4)},
         lambda a: np.sum(_sigmoid(3 * (a["U"] @ a["U"]) + a["x"].sum() * a["y"]))),
    # --- found by the differential test (tests/test_differential.py), shrunk; see its docstring
    # G1: a contracted delta[q,q] beside another delta counts |q|
    Case("diff-delta-trace-beside-delta-grad", "size q = 3\nf = (C[c,c] * delta[q,q])^+3", "value_and_grad", "C",
         {"C": _u(2, 2)}, lambda a: (3 * np.trace(a["C"])) ** 3),
    Case("diff-delta-trace-beside-delta-jacobian", "size q = z\nf[c] = delta[q,q] * z[c] * g", "jacobian(reverse)",
         "z", {"z": _u(3), "g": np.array(0.6)}, lambda a: 3 * a["z"] * a["g"]),
    Case("diff-delta-trace-value",
         "size a = 3\nsize t2 = 2\nY = delta[t2,b] / M[l,l] * delta[a,a]\nL = Y[k,k] Y[t2,b] z[t2] z[b]", "value",
         None, {"M": _u(2, 2, low=0.5, high=1.5), "z": _u(2)},
         lambda a: (3 / np.trace(a["M"])) ** 2 * 2 * (a["z"] @ a["z"])),
    # G2: a reduction over a sum keeps |c| for the term without c, also once hoisted
    Case("diff-reduction-over-sum-value-and-grad", "f = sum[c]((z[j] B[b,b] * w[b])^3 + w[c]) z[j]", "value_and_grad",
         "z", {"z": _u(3), "B": _u(2, 2), "w": _u(2)},
         lambda a: np.sum((2 * (a["z"] * (np.diag(a["B"]) @ a["w"])) ** 3 + a["w"].sum()) * a["z"])),
    # G3: a dummy contracted inside a divisor / function / power base and, under the same name, outside
    Case("diff-same-dummy-divisor-jacobian", "f = (V[hid,q] x[q]) / (M[q,hid] g[q])", "jacobian(reverse)", "V",
         {"V": _u(2, 3), "x": _u(3), "M": _u(3, 2, low=0.5, high=1.5), "g": _u(3, low=0.5, high=1.5)},
         lambda a: np.sum(a["V"] * a["x"][None, :] / (a["M"].T @ a["g"])[:, None])),
    Case("diff-same-dummy-trace-in-divisor", "L = delta[a,k] / (M[k,k] + g) V[k,a]", "value_and_grad", "g",
         {"M": _u(3, 3, low=0.5, high=1.5), "g": np.array(0.4), "V": _u(3, 3)},
         lambda a: np.trace(a["V"]) / (np.trace(a["M"]) + a["g"])),
    Case("diff-same-dummy-trace-in-divisor-vector", "loss = (M[k,k] s[r]) / X[k,m,k] z[m]", "jacobian(reverse)", "z",
         {"M": _u(2, 2), "s": _u(3), "X": _u(2, 2, 2, low=0.5, high=1.5), "z": _u(2)},
         lambda a: np.trace(a["M"]) * a["s"] * np.sum(a["z"] / np.einsum("kmk->m", a["X"]))),
    Case("diff-same-dummy-trace-in-exp", "loss = ((R[p,l] * W[l,r] w[r]) * R[p,a]) exp(B[l,a,l])", "grad", "B",
         {"R": _u(2, 2), "W": _u(2, 3), "w": _u(3), "B": _u(2, 2, 2)},
         lambda a: np.einsum("pl,l,pa,a->", a["R"], a["W"] @ a["w"], a["R"], np.exp(np.einsum("lal->a", a["B"])))),
    Case("diff-same-dummy-power-base-hessian", "f = (g[j] Q[b,b] (A[b,b] + e) * y[j])^0.5", "hessian", "y",
         {"g": _u(2, low=0.5, high=1.5), "Q": np.diag([0.8, 1.1]) + 0.1, "A": np.diag([0.7, 1.3]) + 0.2,
          "e": np.array(0.5), "y": _u(2, low=0.5, high=1.5)},
         lambda a: (a["g"] @ a["y"] * np.trace(a["Q"]) * (np.trace(a["A"]) + a["e"])) ** 0.5),
    # G4: every index of a derivative program has a size
    Case("diff-sizes-user-literal", "size n = 3\nf = (delta[n,n] y[r] y[r])^(+2)", "grad", "y", {"y": _u(3)},
         lambda a: (3 * a["y"] @ a["y"]) ** 2),
    Case("diff-sizes-from-another-term", "loss[l] = delta[r,r] A[m,k] - w[l] e[r]", "jacobian(reverse)", "A",
         {"A": _u(2, 3), "w": _u(3), "e": _u(2)}, lambda a: 2 * a["A"].sum() - a["w"] * a["e"].sum()),
    Case("diff-sizes-helper-of-deltas-hessian", "loss = g[q] v[i] g[q] x[n] * R[n,n] * s[i]", "hessian", ["R", "x"],
         {"g": _u(2), "v": _u(3), "x": _u(2), "R": _u(2, 2), "s": _u(3)},
         lambda a: (a["g"] @ a["g"]) * (a["v"] @ a["s"]) * (a["x"] @ np.diag(a["R"]))),
    Case("diff-sizes-forward-intermediate", "H[q] = A[q,q]\nf = H[hid]", "jacobian(forward)", "A",
         {"A": _u(3, 3)}, lambda a: np.diag(a["A"]).copy()),
    # G6: a shared helper reused with its indices in other roles must agree in sizes (issue bug 4)
    Case("diff-cse-sizes-hessian", "Y[c,k,j] = -M[i,a] - A[c,i] z[r] A[k,j]\nf = Y[b,k,m] (x[m] * u[k] u[b])",
         "hessian", ["A", "M"], {"M": _u(3, 2), "A": _u(2, 3), "z": _u(2), "x": _u(3), "u": _u(2)},
         lambda a: -a["M"].sum() * a["x"].sum() * a["u"].sum() ** 2
         - a["z"].sum() * (a["A"].sum(axis=1) @ a["u"]) * (a["u"] @ a["A"] @ a["x"])),
    # G5: the simplifier terminates
    Case("diff-recursion-reduction-of-sum", "L = sum[hid](-(P[t2,t2] g[t2] + g[a] e[hid] * g[a]))", "grad", "g",
         {"P": _u(2, 2), "g": _u(2), "e": _u(3)},
         lambda a: -3 * np.diag(a["P"]) @ a["g"] - (a["g"] @ a["g"]) * a["e"].sum()),
    Case("diff-recursion-explicit-terms", "loss[n] = (-((-v[i] - s) * y[m])) + V[c,n]", "jacobian(forward)", "y",
         {"v": _u(3), "s": np.array(0.3), "y": _u(2), "V": _u(2, 4)},
         lambda a: (a["v"].sum() + 3 * a["s"]) * a["y"].sum() + a["V"].sum(axis=0)),
]


def _central(f: Callable[[dict[str, np.ndarray]], Any], arrays: dict[str, np.ndarray], x: str,
             h: float = 1e-6) -> np.ndarray:
    """d f / d arrays[x] (shape f's shape + x's shape) by central differences."""
    base = np.asarray(f(arrays))
    out = np.zeros(base.shape + arrays[x].shape)
    for position in np.ndindex(arrays[x].shape):
        plus, minus = dict(arrays), dict(arrays)
        plus[x], minus[x] = arrays[x].copy(), arrays[x].copy()
        plus[x][position] += h
        minus[x][position] -= h
        out[(...,) + position] = (np.asarray(f(plus)) - np.asarray(f(minus))) / (2 * h)
    return out


def _expected(case: Case) -> list[np.ndarray]:
    names = [case.wrt] if isinstance(case.wrt, str) else list(case.wrt or [])
    if case.kind == "value":
        return [np.asarray(case.meaning(case.arrays))]
    if case.kind == "hessian":
        blocks = []
        for first in names:
            for second in names:
                def gradient(a: dict[str, np.ndarray], first: str = first) -> np.ndarray:
                    return _central(case.meaning, a, first, h=1e-4)
                blocks.append(_central(gradient, case.arrays, second, h=1e-4))
        return blocks
    derivatives = [_central(case.meaning, case.arrays, x) for x in names]
    if case.kind == "value_and_grad":
        return [np.asarray(case.meaning(case.arrays)), *derivatives]
    return derivatives


def _build(case: Case) -> Any:
    if case.kind == "value":
        return ef.compile(case.text)
    if case.kind.startswith("jacobian"):
        return ef.jacobian(case.text, wrt=case.wrt, mode=case.kind[len("jacobian("):-1])
    return {"grad": ef.grad, "value_and_grad": ef.value_and_grad, "hessian": ef.hessian}[case.kind](
        case.text, wrt=case.wrt)


def _flat(result: Any) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for item in result if isinstance(result, tuple) else (result,):
        out.extend(_flat(item) if isinstance(item, tuple) else [np.asarray(item)])
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reproducer_gives_the_right_numbers(case: Case) -> None:
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if case.kind == "hessian" else {"rtol": 1e-6, "atol": 1e-8}
    expected = _expected(case)
    program = _build(case)
    got = _flat(program(case.arrays))
    assert len(got) == len(expected), str(program)
    for value, want in zip(got, expected):
        assert value.shape == want.shape, f"{value.shape} != {want.shape}\n{program}"
        np.testing.assert_allclose(value, want, err_msg=str(program), **tolerance)
    # the printed program is a program: it re-parses and gives the same numbers
    again = _flat(ef.compile(str(program))(case.arrays))
    for value, first in zip(again, got):
        np.testing.assert_allclose(value, first, rtol=1e-12, atol=1e-12, err_msg=str(program))


@pytest.mark.parametrize("wrt", [None, 3, 2.5, b"x", ["x", None], [["x"]]], ids=repr)
def test_wrt_that_is_not_a_name_is_a_derivative_error(wrt: Any) -> None:
    for derivative in (ef.grad, ef.hessian, ef.jacobian, ef.value_and_grad, ef.vjp):
        with pytest.raises(ef.DerivativeError):
            derivative("f = x[i] x[i]", wrt=wrt)


@pytest.mark.parametrize("text", [
    "Y = sum[b]((U[l,t] y[b] u[i])^2)",  # the output's indices are not written: they were summed too (seed 329)
    "Y[l,t,i] = sum[b]((U[l,t] y[b] u[i])^2)",
    "Y[i] = sum[b,l]((U[l,b] u[i] - y[b])^2)",
])
def test_a_sum_of_squares_over_some_indices_keeps_the_others(text: str) -> None:
    # a sum of squares over part of its base's indices is lowered as the base contracted with itself
    rng = np.random.default_rng(1)
    U, y, u = rng.standard_normal((2, 3)), rng.standard_normal(4), rng.standard_normal(5)
    if "U[l,b]" in text:
        U = rng.standard_normal((2, 4))
        expected = ((U[None] * u[:, None, None] - y[None, None]) ** 2).sum(axis=(1, 2))
    else:
        expected = ((U[:, :, None, None] * y[:, None] * u[None]) ** 2).sum(axis=2)
    np.testing.assert_allclose(ef.compile(text)(U=U, y=y, u=u), expected, rtol=1e-12)
