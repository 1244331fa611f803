"""Linear algebra atoms (LANGUAGE.md 8.1): inv, det, logdet, parsed, checked, computed and differentiated.

References: numpy.linalg for values; JAX (float64, jax.numpy.linalg) differentiating the same function for
derivatives; central differences in float64; closed forms (the 2x2 determinant's constant Hessian, the
second derivative of log|3t + 5|).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import einflow as ef
from einflow.lang import ir
from einflow.lang.grammar import parse

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

RNG = np.random.default_rng(25)


def well_conditioned(n: int, *batch: int) -> np.ndarray:
    """A random matrix (or batch) with a dominant diagonal: condition numbers of a few units."""
    return RNG.standard_normal((*batch, n, n)) / np.sqrt(n) + 3 * np.eye(n)


def spd(n: int) -> np.ndarray:
    X = RNG.standard_normal((n, n + 2))
    return X @ X.T / n + np.eye(n)


# ---------------------------------------------------------------- language
@pytest.mark.parametrize("text", [
    "x[i] = inv[i,j](A[i,j]) b[j]",
    "f = y[i] inv[i,j](K[i,j]) y[j] + logdet[i,j](K[i,j])",
    "d[b] = det[i,j](B[b,i,j] + delta[i,j])",
    "spd K\nf = logdet[i,j](K[i,j])",
    "symmetric A, B\nf = det[i,j](A[i,j] + B[i,j])",
])
def test_text_round_trips(text: str) -> None:
    program = parse(text)
    assert parse(ir.format_program(program)) == program
    assert ir.format_program(program) == text


@pytest.mark.parametrize("text, message", [
    ("inv(A)", "write inv[i,j](...)"),
    ("inv[i,i](A[i,i])", "two different indices"),
    ("inv = A[i,j]", "reserved word"),
    ("spd = A[i,j]", "reserved word"),
])
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ef.ParseError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]").replace(".", r"\.")):
        parse(text)


@pytest.mark.parametrize("text, message", [
    ("f = det[i,j](x[i])", "needs 'j' free in its body"),
    ("y[i] = det[i,j](A[i,j])", "already bound"),
    ("spd A\nf = A[i,j] x[j]", "has rank 1"),  # f has rank 1: the declaration is on A (rank 2) -> fine; see below
])
def test_check_errors(text: str, message: str) -> None:
    if "spd A" in text:
        ef.compile(text)  # A is a rank-2 input: a valid declaration
        with pytest.raises(ef.IndexRuleError, match="rank 1"):
            ef.compile("spd x\nf = A[i,j] x[j]")
        with pytest.raises(ef.EinflowError, match="neither an input nor a target"):
            ef.compile("spd Q\nf = A[i,j] x[j]")
        return
    with pytest.raises(ef.IndexRuleError, match=message):
        ef.compile(text)


def test_a_non_square_matrix_is_a_shape_error_naming_both_sizes() -> None:
    with pytest.raises(ef.ShapeError, match=r"square matrix: index 'i' has size 3 \(A \(axis 0\)\) but 'j' has size 4"):
        ef.compile("f = logdet[i,j](A[i,j])")(A=np.ones((3, 4)))


# ---------------------------------------------------------------- values
def test_values_against_numpy() -> None:
    A, b = well_conditioned(5), RNG.standard_normal(5)
    B = well_conditioned(4, 3)
    assert np.allclose(ef.compile("x[i] = inv[i,j](A[i,j]) b[j]")(A=A, b=b), np.linalg.solve(A, b), atol=1e-13)
    assert np.allclose(ef.compile("N[i,j] = inv[i,j](A[i,j])")(A=A), np.linalg.inv(A), atol=1e-13)
    assert np.isclose(ef.compile("f = det[i,j](A[i,j])")(A=A), np.linalg.det(A))
    assert np.isclose(ef.compile("f = logdet[i,j](-A[i,j])")(A=A), np.linalg.slogdet(-A)[1])
    # batched, and the matrix read transposed (rows are the first index of the bracket)
    assert np.allclose(ef.compile("d[b] = det[i,j](B[b,j,i])")(B=B), np.linalg.det(B))
    assert np.allclose(ef.compile("N[j,b,i] = inv[i,j](B[b,i,j])")(B=B), np.linalg.inv(B).transpose(2, 0, 1))
    assert np.allclose(ef.compile("N[b,i,j] = inv[i,j](B[b,j,i])")(B=B), np.linalg.inv(B.transpose(0, 2, 1)))
    # an integer matrix gives floats
    assert np.isclose(ef.compile("f = det[i,j](A[i,j])")(A=np.array([[2, 1], [1, 3]])), 5.0)


# ---------------------------------------------------------------- the PyTorch reproducers
def test_det_hessian_of_a_2x2_matrix_is_the_constant_epsilon_pattern() -> None:
    # pytorch#192540: jacfwd(jacfwd(det)) of a 2x2 matrix gave a wrong constant Hessian
    eps = np.array([[0.0, 1.0], [-1.0, 0.0]])
    expected = np.einsum("ik,jl->ijkl", eps, eps)
    hessian = ef.hessian("f = det[i,j](A[i,j])", wrt="A")
    for A in (well_conditioned(2), np.array([[1.0, 2.0], [3.0, 4.0]]), RNG.standard_normal((2, 2))):
        assert np.abs(hessian(A=A) - expected).max() < 1e-12


def test_second_derivative_of_logdet_along_a_line() -> None:
    # pytorch#196697: d2/dt2 log|det(A + tB)| with det = 3t + 5 at t = 0.7 is -9/(3t + 5)^2, not 0
    A = np.array([[5.0, 0.0], [0.0, 1.0]])
    B = np.array([[3.0, 0.0], [0.0, 0.0]])
    program = "f = logdet[i,j](A[i,j] + t B[i,j])"
    value = ef.hessian(program, wrt="t")(A=A, B=B, t=0.7)
    assert abs(value - -0.17853600476096013) < 1e-12
    assert abs(ef.grad(program, wrt="t")(A=A, B=B, t=0.7) - 3 / 7.1) < 1e-12
    # a full 2x2 pair with the same determinant line: A = [[2, 1], [1, 3]], B = [[3, 0], [0, 1]] - ... kept simple


# ---------------------------------------------------------------- derivatives vs JAX
def _jax_logdet(A: jax.Array) -> jax.Array:
    return jnp.linalg.slogdet(A)[1]


CASES = [  # (einflow program, its jax.numpy twin of the inputs (A, x), input names)
    ("f = logdet[i,j](A[i,j])", lambda A, x: _jax_logdet(A)),
    ("f = det[i,j](A[i,j])", lambda A, x: jnp.linalg.det(A)),
    ("f = x[i] inv[i,j](A[i,j]) x[j]", lambda A, x: x @ jnp.linalg.solve(A, x)),
    ("f = det[i,j](A[i,j] + x[i] x[j])", lambda A, x: jnp.linalg.det(A + jnp.outer(x, x))),
    ("f = sum[i](tanh(inv[i,j](A[i,j]) x[j]))", lambda A, x: jnp.sum(jnp.tanh(jnp.linalg.solve(A, x)))),
    ("f = logdet[i,j](A[i,k] A[j,k]) + x[i] inv[i,j](A[j,i]) x[j]",
     lambda A, x: _jax_logdet(A @ A.T) + x @ jnp.linalg.solve(A.T, x)),
]


def call(program: ef.Program, **data: np.ndarray) -> np.ndarray:
    """The program on the data it reads."""
    return program(**{name: data[name] for name in program.inputs})


@pytest.mark.parametrize("text, twin", CASES, ids=[c[0] for c in CASES])
def test_derivatives_match_jax(text: str, twin) -> None:  # noqa: ANN001
    A, x = well_conditioned(4), RNG.standard_normal(4)
    T = RNG.standard_normal((4, 4))
    data = {"A": A, "x": x, "T": T}
    ja, jx = jnp.asarray(A), jnp.asarray(x)
    reads_x = "x" in ef.compile(text).inputs
    g = jax.grad(twin, argnums=(0, 1))(ja, jx)
    assert np.allclose(call(ef.grad(text, wrt="A"), **data), g[0], rtol=1e-10, atol=1e-11)
    hessian = jax.hessian(twin, argnums=0)(ja, jx)
    assert np.allclose(call(ef.hessian(text, wrt="A"), **data), hessian, rtol=1e-9, atol=1e-10)
    if reads_x:
        assert np.allclose(call(ef.grad(text, wrt="x"), **data), g[1], rtol=1e-10, atol=1e-11)
        mixed = jax.jacfwd(jax.grad(twin, argnums=0), argnums=1)(ja, jx)
        assert np.allclose(call(ef.hessian(text, wrt=["A", "x"]), **data)[1], mixed, rtol=1e-9, atol=1e-10)
    diagonal = np.einsum("pqpq->pq", np.asarray(hessian))
    assert np.allclose(call(ef.hessian_diagonal(text, wrt="A"), **data), diagonal, rtol=1e-9, atol=1e-10)
    _, tangent_out = jax.jvp(lambda a: twin(a, jx), (ja,), (jnp.asarray(T),))
    assert np.allclose(call(ef.jvp(text, wrt="A", tangent="T"), **data), tangent_out, rtol=1e-10, atol=1e-11)
    expected_hvp = jax.jvp(jax.grad(lambda a: twin(a, jx)), (ja,), (jnp.asarray(T),))[1]
    assert np.allclose(call(ef.hvp(text, wrt="A", tangent="T"), **data), expected_hvp, rtol=1e-9, atol=1e-10)


def test_jacobian_of_the_inverse_and_a_batch() -> None:
    B = well_conditioned(3, 2)
    expected = jax.jacfwd(lambda b: jnp.linalg.inv(b))(jnp.asarray(B))
    assert np.allclose(ef.jacobian("N[b,i,j] = inv[i,j](B[b,i,j])", wrt="B")(B=B), expected, atol=1e-12)
    expected = jax.grad(lambda b: jnp.sum(jnp.linalg.slogdet(b)[1] ** 2))(jnp.asarray(B))
    assert np.allclose(ef.grad("f = sum[b](logdet[i,j](B[b,i,j])^2)", wrt="B")(B=B), expected, atol=1e-12)


def test_third_derivative_of_logdet_by_central_differences() -> None:
    # d3/dt3 log|det(A + tB)| = 2 tr((A^-1 B)^3) at t = 0, against differences of the second derivative
    A, B = well_conditioned(3), RNG.standard_normal((3, 3))
    second = ef.hessian("f = logdet[i,j](A[i,j] + t B[i,j])", wrt="t")
    third = ef.grad(ef.hessian("f = logdet[i,j](A[i,j] + t B[i,j])", wrt="t"), wrt="t")
    h = 1e-5
    central = (second(A=A, B=B, t=h) - second(A=A, B=B, t=-h)) / (2 * h)
    M = np.linalg.solve(A, B)
    assert abs(third(A=A, B=B, t=0.0) - 2 * np.trace(M @ M @ M)) < 1e-10
    assert abs(central - 2 * np.trace(M @ M @ M)) < 1e-6


def test_gp_likelihood_gradient_by_central_differences() -> None:
    gp = "K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nf = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])"
    X, y = RNG.standard_normal((6, 2)), RNG.standard_normal(6)
    value = ef.compile(gp)
    gradient = ef.grad(gp, wrt="X")(X=X, y=y, s=0.5)
    h = 1e-6
    central = np.zeros_like(X)
    for index in np.ndindex(X.shape):
        step = np.zeros_like(X)
        step[index] = h
        central[index] = (value(X=X + step, y=y, s=0.5) - value(X=X - step, y=y, s=0.5)) / (2 * h)
    assert np.allclose(gradient, central, atol=1e-8)
    assert np.isclose(ef.grad(gp, wrt="s")(X=X, y=y, s=0.5),
                      (value(X=X, y=y, s=0.5 + h) - value(X=X, y=y, s=0.5 - h)) / (2 * h), atol=1e-8)


# ---------------------------------------------------------------- symmetric / spd declarations
def test_declared_matrices_are_checked_at_call_time() -> None:
    program = ef.compile("spd K\nf = logdet[i,j](K[i,j])")
    K = spd(4)
    assert np.isclose(program(K=K), np.linalg.slogdet(K)[1])
    with pytest.raises(ef.MatrixError, match="'K' is declared spd but is not symmetric"):
        program(K=K + np.triu(np.ones((4, 4)), 1))
    with pytest.raises(ef.MatrixError, match="'K' is declared spd but is not positive definite"):
        program(K=-K)
    with pytest.raises(ValueError):  # a MatrixError is a ValueError
        ef.compile("symmetric A\nf = det[i,j](A[i,j])")(A=RNG.standard_normal((3, 3)))
    # a declared target: checked once computed (round-off asymmetry passes)
    gp = ef.compile("K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\nf = logdet[i,j](K[i,j])")
    X = RNG.standard_normal((5, 2))
    assert np.isclose(gp(X=X, s=0.5), np.linalg.slogdet(X @ X.T + 0.5 * np.eye(5))[1])
    with pytest.raises(ef.MatrixError, match="'K' is declared spd but is not positive definite"):
        gp(X=X, s=-1.0)
    # the same when a solve or an inverse factorises the matrix (the check then only looks at symmetry)
    for text in ("spd K\nf = y[i] inv[i,j](K[i,j]) y[j]", "spd K\nN[i,j] = inv[i,j](K[i,j])"):
        program = ef.compile(text)
        assert "'spd_by_factor'" in program.to_source()
        with pytest.raises(ef.MatrixError, match="'K' is declared spd but is not positive definite"):
            call(program, K=-K, y=np.ones(4))
        assert np.allclose(call(program, K=K, y=np.ones(4)), call(ef.compile(text.split("\n")[1]), K=K, y=np.ones(4)))


def _sym(A: jax.Array) -> jax.Array:
    return (A + A.T) / 2


SYMMETRIC_CASES = [
    ("spd A\nf = logdet[i,j](A[i,j])", lambda A, x: _jax_logdet(_sym(A))),
    ("symmetric A\nf = x[i] A[i,j] A[j,k] x[k]", lambda A, x: x @ _sym(A) @ _sym(A) @ x),
    ("spd A\nf = x[i] inv[i,j](A[i,j]) x[j] + logdet[i,j](A[i,j])",
     lambda A, x: x @ jnp.linalg.solve(_sym(A), x) + _jax_logdet(_sym(A))),
]


@pytest.mark.parametrize("text, twin", SYMMETRIC_CASES, ids=[c[0].replace("\n", "; ") for c in SYMMETRIC_CASES])
def test_derivatives_by_a_declared_matrix_are_symmetric(text: str, twin) -> None:  # noqa: ANN001
    # the gradient on the symmetric matrices is (G + G^T)/2: jax's gradient of f((A + A^T)/2) at a symmetric A
    A, x, T = spd(4), RNG.standard_normal(4), RNG.standard_normal((4, 4))
    data = {"A": A, "x": x, "T": T}
    ja, jx = jnp.asarray(A), jnp.asarray(x)
    gradient = call(ef.grad(text, wrt="A"), **data)
    assert np.allclose(gradient, gradient.T, atol=1e-13)
    assert np.allclose(gradient, jax.grad(twin)(ja, jx), rtol=1e-10, atol=1e-11)
    hessian = call(ef.hessian(text, wrt="A"), **data)
    assert np.allclose(hessian, jax.hessian(twin)(ja, jx), rtol=1e-9, atol=1e-10)
    assert np.allclose(hessian, hessian.transpose(1, 0, 2, 3)) and np.allclose(hessian, hessian.transpose(0, 1, 3, 2))
    expected_hvp = jax.jvp(jax.grad(lambda a: twin(a, jx)), (ja,), (jnp.asarray(T),))[1]
    assert np.allclose(call(ef.hvp(text, wrt="A", tangent="T"), **data), expected_hvp, rtol=1e-9, atol=1e-10)
    if "A[j,k]" not in text:  # the spd atoms: the declaration is in the derived program, Cholesky computes them
        source = ef.grad(text, wrt="A").to_source()
        # checked for symmetry; the Cholesky factor the inverse is computed from finds a non-spd matrix
        assert "_linalg('spd_factor'" in source and "'cho_inv'" in source and "'spd_by_factor'" in source


ROW_CASES = [  # a value whose output index is a row of the declared matrix: no independent samples along it
    ("symmetric A\ny[i] = A[i,j] x[j]", lambda A, x: _sym(A) @ x),
    ("spd A\ny[i] = tanh(A[i,j] x[j]) + A[j,i] x[j]", lambda A, x: jnp.tanh(_sym(A) @ x) + _sym(A).T @ x),
    ("symmetric A\ny[i] = exp(A[i,j] x[j]) x[i]", lambda A, x: jnp.exp(_sym(A) @ x) * x),
]


@pytest.mark.parametrize("text, twin", ROW_CASES, ids=[c[0].replace("\n", "; ") for c in ROW_CASES])
def test_jacobians_by_a_declared_matrix_read_along_its_rows(text: str, twin) -> None:  # noqa: ANN001
    # y[i] reads row i of A, but a declared A[i,j] is A[j,i]: i is no batch index (it was taken out of A, whose
    # declaration then failed on a rank-1 A); the Jacobian is jax's of y((A + A^T)/2), as for the gradient
    A, x = spd(4), RNG.standard_normal(4)
    ja, jx = jnp.asarray(A), jnp.asarray(x)
    jacobian = call(ef.jacobian(text, wrt="A"), A=A, x=x)
    assert np.allclose(jacobian, jax.jacobian(twin)(ja, jx), rtol=1e-10, atol=1e-12)
    assert np.allclose(jacobian, jacobian.transpose(0, 2, 1))
    # finite differences along a symmetric direction: the Jacobian contracted with it
    T = RNG.standard_normal((4, 4))
    T = T + T.T
    eps = 1e-6
    difference = (np.asarray(twin(ja + eps * T, jx)) - np.asarray(twin(ja - eps * T, jx))) / (2 * eps)
    assert np.allclose(np.einsum("ipq,pq->i", jacobian, T), difference, atol=1e-7)
    # a sum over the rows: the Hessian by A (per-row blocks before) and its diagonal
    total = text.rsplit("\n", 1)[0] + "\nf = sum[i](" + text.rsplit("= ", 1)[1] + ")"
    hessian = call(ef.hessian(total, wrt="A"), A=A, x=x)
    expected = jax.hessian(lambda a: jnp.sum(twin(a, jx)))(ja)
    assert np.allclose(hessian, expected, rtol=1e-9, atol=1e-10)
    diagonal = call(ef.hessian_diagonal(total, wrt="A"), A=A, x=x)
    assert np.allclose(diagonal, np.einsum("pqpq->pq", expected), rtol=1e-9, atol=1e-10)
    with pytest.raises(ef.DerivativeError, match="not independent|mixes samples"):  # (asked for: refused)
        ef.jacobian(text, wrt="A", batch="i")


def test_gp_gradient_factors_the_kernel_once() -> None:
    gp = ("K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\n"
          "f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])")
    source = ef.grad(gp, wrt="X").to_source()
    # one Cholesky factor; K^-1 y and K^-1 X are solves with it (the inverse is never formed), each in the two
    # orientations the gradient reads (a complex Hermitian K's transpose is its conjugate, not K)
    assert source.count("_linalg('spd_factor'") == 1 and source.count("_linalg('spd_by_factor'") == 1
    assert "_linalg('spd_inv'" not in source and source.count("_solve('cho_solve'") == 4


def test_real_gp_gradient_solves_once_per_right_hand_side() -> None:
    """Real arrays: K is its own transpose (one solve for both readings); X X^T + s delta is symmetric by
    construction (no symmetry check: the factorisation still checks it is positive definite) and s is added on
    the diagonal of the product's own array (no zeroed n x n array)."""
    gp = ("K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\n"
          "f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])")
    gradient = ef.grad(gp, wrt="X")
    X, y = RNG.standard_normal((30, 3)), RNG.standard_normal(30)
    K = X @ X.T + 0.5 * np.eye(30)
    alpha, solved = np.linalg.solve(K, y), np.linalg.solve(K, X)
    assert np.allclose(gradient(X=X, y=y, s=0.5), solved - np.outer(alpha, alpha @ X))
    (plan,) = gradient._plans.values()
    assert plan.source.count("_solve('cho_solve'") == 2 and plan.source.count("_linalg('spd_factor") == 1
    assert "spd_by_factor" not in plan.source and "zeros(" not in plan.source
    assert "_linalg('spd_factor_in_place'" in plan.source  # K is the program's own and read no more
    user = K.copy()  # a matrix of the caller's is never factorised in place, nor one read again
    for text in ("spd K\nf = y[i] inv[i,j](K[i,j]) y[j]", "spd K\nf = y[i] inv[i,j](K[i,j]) y[j] + sum[i,j](K[i,j])",
                 "spd K\nL[i,j] = K[j,i]\nspd L\nf = y[i] inv[i,j](L[i,j]) y[j]"):
        for _ in range(2):
            assert np.isclose(ef.compile(text)(K=user, y=y), y @ np.linalg.solve(K, y) + (
                K.sum() if "sum" in text else 0))
        assert np.array_equal(user, K)
    with pytest.raises(ef.MatrixError, match="'K' is declared spd but is not positive definite"):
        gradient(X=X, y=y, s=-1.0)
    # complex: K = Z Z^H is Hermitian, not symmetric: checked, and read in both orientations
    hermitian = ef.compile(gp.replace("X[j,d]", "conj(X[j,d])"))
    Z = X + 0.1j * RNG.standard_normal((30, 3))
    H = Z @ Z.conj().T + 0.5 * np.eye(30)
    expected = 0.5 * y @ np.linalg.solve(H, y) + 0.5 * np.linalg.slogdet(H)[1]
    assert np.isclose(hermitian(X=Z, y=y, s=0.5), expected)
    (plan,) = hermitian._plans.values()
    assert "spd_by_factor" in plan.source


# ---------------------------------------------------------------- solves, not inverses
SOLVES = [  # (program, numpy reference of A (well conditioned), B (4x3), b (4,), whether the inverse is still formed)
    ("x[i] = inv[i,j](A[i,j]) b[j]", lambda A, B, b: np.linalg.solve(A, b), False),
    ("C[i,k] = inv[i,j](A[i,j]) B[j,k]", lambda A, B, b: np.linalg.solve(A, B), False),
    ("C[k,j] = B[i,k] inv[i,j](A[i,j])", lambda A, B, b: B.T @ np.linalg.inv(A), False),
    ("f = b[i] inv[i,j](A[i,j]) b[j]", lambda A, B, b: b @ np.linalg.solve(A, b), False),
    ("f = b[i] inv[i,j](A[i,j] + A[j,i]) B[j,k] B[l,k] b[l]",
     lambda A, B, b: b @ np.linalg.solve(A + A.T, B @ (B.T @ b)), False),
    ("C[i,j] = inv[i,j](A[i,j]) + inv[i,k](A[i,k]) B[k,l] B[j,l]",
     lambda A, B, b: np.linalg.inv(A) + np.linalg.solve(A, B) @ B.T, True),
]


@pytest.mark.parametrize("text, reference, inverse", SOLVES, ids=[s[0] for s in SOLVES])
def test_contractions_with_an_inverse_are_solves(text: str, reference, inverse: bool) -> None:  # noqa: ANN001
    A, B, b = well_conditioned(4), RNG.standard_normal((4, 3)), RNG.standard_normal(4)
    program = ef.compile(text)
    assert np.allclose(call(program, A=A, B=B, b=b), reference(A, B, b), atol=1e-12)
    source = program.to_source()
    # where the program forms the inverse anyway, the product reads it (one factorisation): no solve then
    assert ("_solve('solve'" in source) != inverse
    assert source.count("_linalg('inv'") == inverse
    report = str(program.plan(**{name: {"A": A, "B": B, "b": b}[name] for name in program.inputs}))
    assert ("solve" in report) != inverse


def test_the_gp_likelihood_factors_the_kernel_once() -> None:
    gp = ("K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\n"
          "f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])")
    source = ef.compile(gp).to_source()  # K^-1 y and logdet K from one Cholesky factor
    assert source.count("_linalg('spd_factor'") == 1 and "_solve('cho_solve'" in source
    assert "_linalg('cho_logdet'" in source and "inv'" not in source
    for derivative in (ef.grad(gp, wrt="X"), ef.hvp(gp, wrt="X", tangent="V")):
        # the derivatives solve with K (against y, X and V): never K^-1 itself, never an n x n x n product
        text = derivative.to_source()
        assert text.count("_linalg('spd_factor'") == 1 and "inv'" not in text and "_solve('cho_solve'" in text
        shapes = {"X": (300, 4), "y": (300,), "s": (), "V": (300, 4)}
        plan = derivative.plan(**{name: shapes[name] for name in derivative.inputs})
        assert plan.flops < 300**3 / 3 + 60 * 300**2 * 4
    X, y, V = RNG.standard_normal((30, 3)), RNG.standard_normal(30), RNG.standard_normal((30, 3))
    jX, jy, jV = (jnp.asarray(a) for a in (X, y, V))

    def nll(X: jax.Array) -> jax.Array:
        K = X @ X.T + 0.7 * jnp.eye(30)
        return 0.5 * jy @ jnp.linalg.solve(K, jy) + 0.5 * jnp.linalg.slogdet(K)[1]

    assert np.allclose(ef.grad(gp, wrt="X")(X=X, y=y, s=0.7), jax.grad(nll)(jX), rtol=1e-10, atol=1e-12)
    expected = jax.jvp(jax.grad(nll), (jX,), (jV,))[1]
    assert np.allclose(ef.hvp(gp, wrt="X", tangent="V")(X=X, y=y, s=0.7, V=V), expected, rtol=1e-9, atol=1e-11)


# ---------------------------------------------------------------- backends and exports
GP = "K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\nf = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])"


def test_backends_and_frameworks() -> None:
    import dask.array as da
    import torch

    X, y = RNG.standard_normal((6, 2)), RNG.standard_normal(6)
    program, gradient = ef.compile(GP), ef.grad(GP, wrt="X")
    value, expected = program(X=X, y=y, s=0.5), gradient(X=X, y=y, s=0.5)
    assert np.isclose(float(program(X=torch.tensor(X), y=torch.tensor(y), s=0.5)), value)
    assert np.isclose(float(program(X=jnp.asarray(X), y=jnp.asarray(y), s=0.5)), value)
    lazy = program(X=da.from_array(X, chunks=3), y=da.from_array(y, chunks=3), s=0.5)
    assert np.isclose(float(lazy.compute()), value)
    leaf = torch.tensor(X, requires_grad=True)
    program(X=leaf, y=torch.tensor(y), s=0.5).backward()  # torch autograd through einflow's gradient program
    assert np.allclose(leaf.grad.numpy(), expected, atol=1e-12)
    jitted = jax.jit(jax.grad(lambda x: program(X=x, y=jnp.asarray(y), s=0.5)))  # custom_jvp under jit
    assert np.allclose(np.asarray(jitted(jnp.asarray(X))), expected, atol=1e-12)
    batch = well_conditioned(3, 2)
    for target, module in (("torch", torch), ("jax", jnp)):
        source = ef.compile("d[b] = logdet[i,j](B[b,i,j])\ne[b] = d[b] + sum[i,j](inv[i,j](B[b,i,j]))").to_source(
            target=target)
        namespace: dict = {}
        exec(source, namespace)  # noqa: S102 - einflow's own generated code
        result = namespace["f"](B=module.asarray(batch) if target == "jax" else torch.tensor(batch))
        expected_batch = np.linalg.slogdet(batch)[1] + np.linalg.inv(batch).sum(axis=(1, 2))
        assert np.allclose(np.asarray(result), expected_batch)


def test_latex() -> None:
    text = ef.compile(GP + " + det[i,j](K[j,i] + delta[i,j])").to_latex()
    assert r"\left(K^{-1}\right)_{i,j}" in text and r"\log\lvert\det K\rvert" in text
    assert r"\det \left[K_{ji} + \delta_{ij}\right]_{i,j}" in text


def test_repl_session_declares_and_checks() -> None:
    import subprocess
    import sys

    script = "spd K\n:randn X 5 2\nK[i,j] = X[i,d] X[j,d] + delta[i,j]\nf = logdet[i,j](K[i,j])\n:grad f X\n" \
             "spd M\nM[i,j] = -delta[i,j] X[i,d] X[j,d]\n"
    done = subprocess.run([sys.executable, "-m", "einflow.shell.cli"], input=script, capture_output=True, text=True,
                          timeout=120)
    out = done.stdout + done.stderr
    assert "K: declared spd" in out and "df_dK[r,s] = inv[s,r](K[s,r])" in out
    assert "MatrixError: matrix 'M' is declared spd but is not positive definite" in out


def test_derivative_of_a_bare_expression_after_a_declaration() -> None:
    # the value's statement is found among the statements the sweeps see (the declaration left out)
    text = "symmetric A\nsum[k,t](W[k,t] (x[p] inv[p,r](A[r,p]) y[r]))"
    A, W, x, y = spd(3), RNG.standard_normal((2, 2)), RNG.standard_normal(3), RNG.standard_normal(3)
    gradient = ef.grad(text, wrt="y")(A=A, W=W, x=x, y=y)
    assert np.allclose(gradient, W.sum() * np.linalg.solve(A, x), rtol=1e-12)


def test_derivative_sizes_with_a_declaration_first() -> None:
    # the derivation's index sizes are tied to the statements it differentiates (the declaration left out):
    # r, counted by the derivative, is sized by C
    text = ("spd A\nloss = sum[r](-maximum(delta[q,r] delta[b,b] C[q,r] u[b], 2.5 e (inv[p,l](A[p,l]) B[p,l]))"
            " + sum[i](2. V[b,l,i] P[l,b]))")
    data = {"A": spd(4), "B": RNG.standard_normal((4, 4)), "C": RNG.standard_normal((3, 3)),
            "P": RNG.standard_normal((4, 2)), "V": RNG.standard_normal((2, 4, 3)), "e": 0.3,
            "u": RNG.standard_normal(2)}
    gradient = ef.grad(text, wrt="V")(**data)
    assert np.allclose(gradient, np.broadcast_to(6 * data["P"].T[:, :, None], (2, 4, 3)), rtol=1e-12)


BATCHED = [  # (program, numpy reference from A (5 well-conditioned 4x4 matrices), x (5, 4), B (4, 5, 3))
    ("z[b,i] = inv[i,j](A[b,i,j]) x[b,j]", lambda A, x, B: np.linalg.solve(A, x[..., None])[..., 0]),
    ("z[b,j] = x[b,i] inv[i,j](A[b,i,j])", lambda A, x, B: np.linalg.solve(A.transpose(0, 2, 1), x[..., None])[..., 0]),
    ("f = x[b,i] inv[i,j](A[b,i,j]) x[b,j]",
     lambda A, x, B: np.einsum("bi,bi->", x, np.linalg.solve(A, x[..., None])[..., 0])),
    ("z[i,b,k] = inv[i,j](A[b,j,i]) B[j,b,k]",
     lambda A, x, B: np.linalg.solve(A.transpose(0, 2, 1), B.transpose(1, 0, 2)).transpose(1, 0, 2)),
]


@pytest.mark.parametrize("text, reference", BATCHED, ids=[case[0] for case in BATCHED])
def test_batched_matrices_are_solved_not_inverted(text: str, reference) -> None:  # noqa: ANN001
    import torch

    A = RNG.standard_normal((5, 4, 4)) / 4 + 3 * np.eye(4)
    data = {"A": A, "x": RNG.standard_normal((5, 4)), "B": RNG.standard_normal((4, 5, 3))}
    program = ef.compile(text)
    inputs = {name: data[name] for name in program.inputs}
    expected = reference(data["A"], data["x"], data["B"])
    assert np.allclose(program(**inputs), expected, rtol=1e-11)
    assert np.allclose(program(**{k: torch.tensor(v) for k, v in inputs.items()}).numpy(), expected, rtol=1e-11)
    assert np.allclose(program(**{k: jnp.asarray(v) for k, v in inputs.items()}), expected, rtol=1e-11)
    source = program.to_source()
    assert "_solve('solve'" in source and "_linalg('inv'" not in source  # one batched solve, no inverse


def test_gradient_through_a_batched_solve_matches_jax() -> None:
    text = "f = x[b,i] inv[i,j](A[b,i,j]) x[b,j]"
    A, x = RNG.standard_normal((3, 4, 4)) / 4 + 3 * np.eye(4), RNG.standard_normal((3, 4))

    def twin(A: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.einsum("bi,bi->", x, jnp.linalg.solve(A, x[..., None])[..., 0])

    expected = jax.grad(twin, argnums=(0, 1))(jnp.asarray(A), jnp.asarray(x))
    got = ef.grad(text, wrt=["A", "x"])(A=A, x=x)
    assert all(np.allclose(g, e, rtol=1e-10) for g, e in zip(got, expected))


def test_every_atom_and_solve_on_chunked_dask_arrays() -> None:
    # dask.array.linalg has no det, slogdet or LinAlgError and solves only square-chunked 2-d matrices
    # (cross-backend seeds 12230, 12235: AttributeError): each step is one numpy task instead
    import dask.array as da

    batch, A = well_conditioned(3, 4), well_conditioned(5, 5)[0]
    X, b = RNG.standard_normal((5, 2)), RNG.standard_normal(5)
    spd = A @ A.T + 5 * np.eye(5)
    text = ("d[n] = det[i,j](B[n,i,j]) + logdet[i,j](B[n,i,j]) + sum[i,j](inv[i,j](B[n,i,j]))\n"
            "s[k] = inv[i,j](M[i,j]) X[j,k] + b[i] inv[i,j](A[i,j]) X[j,k]\n"
            "spd M\n"
            "r = logdet[i,j](M[i,j]) + b[i] inv[i,j](M[i,j]) b[j]\n"
            "d, s, r")
    program = ef.compile(text)
    arrays = {"B": batch, "M": spd, "A": A, "X": X, "b": b}
    expected = program(**arrays, backend="numpy")
    lazy = program(**{name: da.from_array(value, chunks=2) for name, value in arrays.items()})
    for got, want in zip(lazy, expected):
        assert isinstance(got, da.Array)
        np.testing.assert_allclose(got.compute(), want, rtol=1e-10)
    np.testing.assert_allclose(expected[0], np.linalg.det(batch) + np.linalg.slogdet(batch)[1]
                               + np.linalg.inv(batch).sum(axis=(1, 2)), rtol=1e-10)
    with pytest.raises(ef.EinflowError, match="not positive definite"):  # the check runs when dask computes
        program(**{**arrays, "M": da.from_array(-spd, chunks=2)})[2].compute()
