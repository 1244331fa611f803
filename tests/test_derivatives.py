"""Derivatives against closed forms (Matrix Cookbook), printed forms, shapes, round trips, errors."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

RNG = np.random.default_rng(7)


def _sig(z):
    return 1 / (1 + np.exp(-z))


def arrays(**shapes):
    out = {}
    for name, shape in shapes.items():
        if name.startswith("pos_"):
            out[name[4:]] = RNG.uniform(0.5, 2.0, size=shape)
        else:
            out[name] = RNG.normal(size=shape)
    return out


# (text, wrt, shapes, gradient closed form, Hessian closed form or None)
COOKBOOK = [
    ("f = a[i] x[i]", "x", dict(a=3, x=3), lambda a, x: a, lambda a, x: np.zeros((3, 3))),
    ("f = x[i] A[i,j] x[j]", "x", dict(x=4, A=(4, 4)), lambda x, A: (A + A.T) @ x, lambda x, A: A + A.T),
    ("f = a[i] X[i,j] b[j]", "X", dict(a=3, X=(3, 4), b=4), lambda a, X, b: np.outer(a, b), None),
    ("f = X[i,i]", "X", dict(X=(4, 4)), lambda X: np.eye(4), None),
    ("f = A[i,j] X[j,i]", "X", dict(A=(3, 4), X=(4, 3)), lambda A, X: A.T, None),
    ("f = A[i,j] X[j,k] B[k,i]", "X", dict(A=(2, 3), X=(3, 4), B=(4, 2)), lambda A, X, B: A.T @ B.T, None),
    ("f = X[i,j] X[i,j]", "X", dict(X=(3, 2)), lambda X: 2 * X, None),
    ("f = X[i,k] A[k,l] X[i,l]", "X", dict(X=(3, 4), A=(4, 4)), lambda X, A: X @ (A + A.T), None),
    ("f = sum[i]((A[i,j] x[j] - b[i])^2)", "x", dict(A=(5, 3), x=3, b=5),
     lambda A, x, b: 2 * A.T @ (A @ x - b), lambda A, x, b: 2 * A.T @ A),
    ("f = sum[i](exp(x[i]))", "x", dict(x=4), lambda x: np.exp(x), lambda x: np.diag(np.exp(x))),
    ("f = sum[i](log(x[i]))", "x", dict(pos_x=4), lambda x: 1 / x, lambda x: -np.diag(1 / x**2)),
    ("f = sum[i](tanh(x[i]))", "x", dict(x=4), lambda x: 1 - np.tanh(x) ** 2, None),
    ("f = sum[i](sigmoid(x[i]))", "x", dict(x=4), lambda x: _sig(x) * (1 - _sig(x)), None),
    ("f = sqrt(x[i] x[i])", "x", dict(x=4), lambda x: x / np.linalg.norm(x),
     lambda x: (np.eye(4) - np.outer(x, x) / (x @ x)) / np.linalg.norm(x)),
    ("f = a[i] x[i] / (b[j] x[j])", "x", dict(a=3, x=3, b=3),
     lambda a, x, b: a / (b @ x) - (a @ x) * b / (b @ x) ** 2, None),
    ("f = sum[s](log(1 + exp(z[s])))", "z", dict(z=5), lambda z: _sig(z), lambda z: np.diag(_sig(z) * (1 - _sig(z)))),
    ("f = sum[i](sin(x[i]) cos(x[i]))", "x", dict(x=3), lambda x: np.cos(2 * x), lambda x: np.diag(-2 * np.sin(2 * x))),
    ("f = log(x[i] x[i])", "x", dict(x=3), lambda x: 2 * x / (x @ x), None),
    ("f = sum[s](log(1 + exp(-y[s] X[s,k] w[k])))", "w", dict(y=6, X=(6, 3), w=3),
     lambda y, X, w: X.T @ (-y * _sig(-y * (X @ w))),
     lambda y, X, w: X.T @ np.diag(y**2 * _sig(-y * (X @ w)) * (1 - _sig(-y * (X @ w)))) @ X),
]


@pytest.mark.parametrize("text, wrt, shapes, gradient, hessian", COOKBOOK, ids=[c[0] for c in COOKBOOK])
def test_matrix_cookbook(text, wrt, shapes, gradient, hessian):
    values = arrays(**{k: (v if isinstance(v, tuple) else (v,)) for k, v in shapes.items()})
    order = [k[4:] if k.startswith("pos_") else k for k in shapes]
    expected = gradient(*[values[k] for k in order])
    g = ef.grad(text, wrt=wrt)
    np.testing.assert_allclose(g(values), expected, rtol=1e-9, atol=1e-12)
    if hessian is not None:
        h = ef.hessian(text, wrt=wrt)
        np.testing.assert_allclose(h(values), hessian(*[values[k] for k in order]), rtol=1e-9, atol=1e-12)


def test_quadratic_form_hessian_prints_without_deltas():
    h = ef.hessian("f = x[i] A[i,j] x[j]", wrt="x")
    last = str(h).splitlines()[-1]
    assert last == "d2f_dx2[p,q] = A[p,q] + A[q,p]"
    assert "delta" not in str(h)


def test_logistic_hessian_is_one_contraction_without_cube():
    text = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"
    h = ef.hessian(text, wrt="w")
    final = str(h).splitlines()[-1]
    assert final.count("X[s,") == 2 and "y[s]" in final  # X[s,p] d[s] X[s,q]
    n, d = 50, 20
    report = h.plan(X=(n, d), y=(n,), w=(d,))
    last_statement = [s for s in report.steps if s.statement == final]
    big = [s for s in last_statement if s.kind == "contract" and s.shape == (d, d)]
    assert len(big) == 1  # one contraction X[s,p] d[s] X[s,q]; everything else is elementwise over s
    assert all(s.shape in {(n,), (d, d)} for s in last_statement)
    assert report.largest_intermediate < n * d * d  # never an s x p x q intermediate


def test_matrix_factorization_hessian_keeps_one_delta_written_diagonally():
    h = ef.hessian("L = sum[i,j]((T[i,j] - U[i,r] V[j,r])^2)", wrt="U")
    final = str(h).splitlines()[-1]
    assert final.count("delta") == 1
    assert final.endswith("= 2 delta[i,r] V[j,p] V[j,q]")  # rows i are independent samples: block diagonal
    report = h.plan({"T": (20, 30), "U": (20, 4), "V": (30, 4)})
    kinds = [s.kind for s in report.steps]
    assert "diagonal" in kinds
    contract = [s for s in report.steps if s.kind == "contract"]
    assert all(s.largest <= 20 * 4 * 4 for s in contract)  # no dense identity product
    T, U, V = (RNG.normal(size=s) for s in [(20, 30), (20, 4), (30, 4)])
    expected = np.einsum("ps,qu->pqsu", np.eye(20), 2 * V.T @ V)
    np.testing.assert_allclose(h({"T": T, "U": U, "V": V}), expected, atol=1e-12)


def test_multi_statement_gradient_reuses_forward_values():
    text = "h[j] = tanh(W1[j,k] x[k])\nL = 0.5 * sum[i]((W2[i,j] h[j] - t[i])^2)"
    g = ef.grad(text, wrt=["W1", "W2"])
    printed = str(g)
    assert printed.startswith("h[j] = tanh(W1[j,k] x[k])")
    assert "dL_dh[" in printed  # an adjoint statement, not one inlined term
    assert "(1 - h[p]^2)" in printed  # tanh' written with the forward value h
    v = arrays(W1=(3, 4), x=(4,), W2=(2, 3), t=(2,))
    h = np.tanh(v["W1"] @ v["x"])
    r = v["W2"] @ h - v["t"]
    d1, d2 = g(v)
    np.testing.assert_allclose(d2, np.outer(r, h))
    np.testing.assert_allclose(d1, np.outer((v["W2"].T @ r) * (1 - h**2), v["x"]))


def test_jacobian_shape_and_values():
    text = "h[j] = tanh(W[j,k] x[k])\ny[i] = V[i,j] h[j]"
    v = arrays(W=(3, 4), x=(4,), V=(2, 3))
    J = ef.jacobian(text, wrt="x")(v)
    h = np.tanh(v["W"] @ v["x"])
    assert J.shape == (2, 4)
    np.testing.assert_allclose(J, v["V"] @ np.diag(1 - h**2) @ v["W"])
    JW = ef.jacobian(text, wrt="W")(v)
    assert JW.shape == (2, 3, 4)
    np.testing.assert_allclose(JW, np.einsum("ij,j,k->ijk", v["V"], 1 - h**2, v["x"]))


def test_elementwise_jacobian_keeps_a_delta():
    j = ef.jacobian("y[i] = tanh(x[i])", wrt="x")
    assert "delta" in str(j)
    x = RNG.normal(size=5)
    np.testing.assert_allclose(j(x=x), np.diag(1 - np.tanh(x) ** 2))


def test_hessian_is_symmetric():
    text = "f = sum[i](tanh(A[i,j] x[j])^2) + x[k] x[k] x[l] B[l,m] x[m]"
    v = arrays(A=(4, 3), x=(3,), B=(3, 3))
    H = ef.hessian(text, wrt="x")(v)
    assert H.shape == (3, 3)
    np.testing.assert_allclose(H, H.T, atol=1e-12)


def test_hessian_blocks_for_a_list():
    h = ef.hessian("f = x[i] A[i,j] y[j]", wrt=["x", "y"])
    v = arrays(x=(2,), A=(2, 3), y=(3,))
    xx, xy, yx, yy = h(v)
    assert xx.shape == (2, 2) and xy.shape == (2, 3) and yx.shape == (3, 2) and yy.shape == (3, 3)
    np.testing.assert_allclose(xy, v["A"])
    np.testing.assert_allclose(yx, v["A"].T)
    np.testing.assert_allclose(xx, 0)


def test_vjp_matches_jacobian_contraction():
    text = "y[i] = exp(A[i,j] x[j])"
    v = arrays(A=(3, 4), x=(4,), g=(3,))
    out = ef.vjp(text, wrt="x", cotangent="g")(v)
    J = ef.jacobian(text, wrt="x")(v)
    np.testing.assert_allclose(out, v["g"] @ J)


def test_value_and_grad_shares_the_residual():
    text = "L = sum[i,j]((A[i,k] X[k,j] - B[i,j])^2)"
    p = ef.value_and_grad(text, wrt="X")
    printed = str(p)
    assert printed.count("A[i,k] X[k,j]") == 1  # the residual is one statement
    v = arrays(A=(4, 3), X=(3, 2), B=(4, 2))
    value, gradient = p(v)
    residual = v["A"] @ v["X"] - v["B"]
    np.testing.assert_allclose(value, np.sum(residual**2))
    np.testing.assert_allclose(gradient, 2 * v["A"].T @ residual)
    value2, (g1, g2) = ef.value_and_grad(text, wrt=["X", "B"])(v)
    np.testing.assert_allclose(g2, -2 * residual)


def test_constant_and_lost_indices_still_run():
    x = RNG.normal(size=4)
    # a mapping may hold arrays the derivative no longer reads (c)
    np.testing.assert_allclose(ef.grad("f = sum[i](x[i] + c)", wrt="x")({"x": x, "c": 1.0}), np.ones(4))
    assert float(ef.grad("f = sum[i](x[i] + c)", wrt="c")({"x": x, "c": 1.0})) == 4
    np.testing.assert_allclose(ef.grad("f = M[i,i]", wrt="M")(M=np.ones((3, 3))), np.eye(3))


def test_non_smooth_points():
    x = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_array_equal(ef.grad("f = sum[i](abs(x[i]))", wrt="x")(x=x), [-1, 0, 1])
    np.testing.assert_array_equal(ef.grad("f = sum[i](relu(x[i]))", wrt="x")(x=x), [0, 0, 1])


ROUND_TRIP = [
    ("f = x[i] A[i,j] x[j]", "x", dict(x=(3,), A=(3, 3))),
    ("L = sum[i,j]((T[i,j] - U[i,r] V[j,r])^2)", "U", dict(T=(3, 4), U=(3, 2), V=(4, 2))),
    ("h[j] = tanh(W[j,k] x[k])\nL = sum[j](h[j]^2)", "W", dict(W=(3, 2), x=(2,))),
    ("f = sum[i](sigmoid(x[i]) sqrt(1 + x[i]^2)) / (1 + x[j] x[j])", "x", dict(x=(3,))),
]


@pytest.mark.parametrize("text, wrt, shapes", ROUND_TRIP)
@pytest.mark.parametrize("derive", [ef.grad, ef.hessian, ef.jacobian])
def test_printed_derivatives_reparse_and_evaluate_identically(text, wrt, shapes, derive):
    program = derive(text, wrt=wrt)
    again = ef.compile(str(program))
    assert again == program
    v = arrays(**shapes)
    np.testing.assert_array_equal(again(v), program(v))


def test_grad_of_non_scalar_suggests_jacobian_and_vjp():
    with pytest.raises(ef.DerivativeError, match="jacobian.*vjp"):
        ef.grad("y[i] = A[i,j] x[j]", wrt="x")


def test_unknown_wrt():
    with pytest.raises(ef.DerivativeError, match="'z' is not an input"):
        ef.grad("f = x[i] x[i]", wrt="z")


def test_wrt_a_computed_target():
    with pytest.raises(ef.DerivativeError, match="computed by the program"):
        ef.grad("h[i] = x[i]^2\nf = h[i] h[i]", wrt="h")


def test_vjp_cotangent_name_clash():
    with pytest.raises(ef.DerivativeError, match="already used"):
        ef.vjp("y[i] = A[i,j] x[j]", wrt="x", cotangent="A")


def test_derivative_names_never_collide():
    g = ef.grad("df_dx = 3\nf = df_dx x[i] x[i]", wrt="x")
    assert g.outputs == ("d_x1",)  # the usual name df_dx is taken by the user's tensor: the gradient gets another
    assert g.info.targets["df_dx"] == ()  # and the user's df_dx is still the scalar 3
    x = RNG.normal(size=3)
    np.testing.assert_allclose(g(x=x), 6 * x)


@pytest.mark.parametrize("wrt", ["x", "W", "V"])
def test_jacobian_forward_and_reverse_modes_agree(wrt):
    text = "h[j] = tanh(W[j,k] x[k])\ny[i] = V[i,j] h[j]"
    v = arrays(W=(3, 4), x=(4,), V=(2, 3))
    forward = ef.jacobian(text, wrt=wrt, mode="forward")(v)
    reverse = ef.jacobian(text, wrt=wrt, mode="reverse")(v)
    np.testing.assert_allclose(forward, reverse, rtol=1e-12)


def test_jacobian_auto_mode_carries_the_smaller_side():
    text = "h[j] = tanh(W[j,k] x[k])\ny[i] = V[i,j] h[j]"
    assert "dy_dh" in str(ef.jacobian(text, wrt="W"))  # value rank 1 < W rank 2: adjoints (reverse)
    assert "dy_dh" not in str(ef.jacobian(text, wrt="x"))  # ranks equal: tangents (forward)
    with pytest.raises(ef.DerivativeError, match="valid options"):
        ef.jacobian(text, wrt="x", mode="sideways")


# cases that previously failed (this list only grows): programs with `size` declarations whose
# derivatives lost the declared size, or put the user's declaration after the derivative
SIZED = [
    "size n = 3\nf = sum[i](x[i] delta[i,n] delta[n,n])",
    "size n = 4\nf = sum[i](x[i]) sum[m](delta[m,n] delta[n,n])",
    "size n = 4\ny[n] = x[i] x[i] + delta[n,n]\nf = y[k] y[k]",
    "size a, b = M\nf = sum[i](x[i]) sum[m](delta[m,b] delta[b,b])",
]


@pytest.mark.parametrize("text", SIZED)
def test_gradients_of_programs_with_size_declarations(text):
    x, M = RNG.normal(size=3), np.ones((2, 5))
    program, gradient = ef.compile(text), ef.grad(text, wrt="x")
    eps = 1e-6
    numeric = [(float(program({"x": x + eps * e, "M": M})) - float(program({"x": x - eps * e, "M": M}))) / (2 * eps)
               for e in np.eye(3)]
    np.testing.assert_allclose(gradient({"x": x, "M": M}), numeric, rtol=1e-6, atol=1e-6)
    assert gradient.outputs == ("df_dx",)  # the program's value is the derivative, not a declaration


def test_docs_derivatives_examples_print_what_they_show() -> None:
    """Every ``>>>`` example of docs/derivatives.md runs and prints what the page shows."""
    import doctest
    import pathlib
    import re

    path = pathlib.Path(__file__).resolve().parent.parent / "docs" / "derivatives.md"
    blocks = re.findall(r"```(?:text|python)\n(.*?)```", path.read_text(), flags=re.DOTALL)
    text = "\n\n".join(block for block in blocks if ">>>" in block)
    test = doctest.DocTestParser().get_doctest(text, {"ef": ef, "np": np}, "docs/derivatives.md", str(path), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert len(test.examples) >= 5 and runner.failures == 0, "".join(report)
