"""Linear algebra as numpy's and jax's own linalg tests exercise it (issue 37): singular matrices, empty ones,
broadcast right-hand sides, matrices holding nan, declared matrices that are not what they claim, the gradient of
``det`` where the inverse does not exist, and ``sign_det``. One behaviour on every backend.

References are independent: numpy.linalg, scipy.linalg, closed forms and central differences in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import einflow as ef

BACKENDS = ("numpy", "torch", "jax", "dask")


def _on(backend: str) -> Callable[[np.ndarray], Any]:
    """A converter of numpy arrays to ``backend``'s arrays (skips when the library is missing)."""
    if backend == "numpy":
        return lambda array: array
    if backend == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy
    if backend == "jax":
        jax = pytest.importorskip("jax")
        jax.config.update("jax_enable_x64", True)
        return jax.numpy.asarray
    dask_array = pytest.importorskip("dask.array")
    return lambda array: dask_array.from_array(array, chunks=max(1, max(array.shape, default=1) // 2 or 1))


def _run(text: str, backend: str, **arrays: np.ndarray) -> np.ndarray:
    """``text`` on ``backend`` with the numpy ``arrays`` converted to it; the value as a numpy array."""
    convert = _on(backend)
    program = ef.compile(text)
    value = program(backend=backend, **{name: convert(array) for name, array in arrays.items()
                                        if name in program.inputs})
    if hasattr(value, "compute"):
        value = value.compute()
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


# ------------------------------------------------------------------ 0x0 matrices (numpy's empty answers)
EMPTY_SOLVES = [
    ("x[i] = inv[i,j](A[i,j]) b[j]", {"A": (0, 0), "b": (0,)}, lambda A, b: np.linalg.solve(A, b)),
    ("X[i,k] = inv[i,j](A[i,j]) B[j,k]", {"A": (0, 0), "B": (0, 3)}, lambda A, B: np.linalg.solve(A, B)),
    ("X[i,k] = inv[i,j](A[i,j]) B[j,k]", {"A": (2, 2), "B": (2, 0)}, lambda A, B: np.linalg.solve(A, B)),
    ("x[n,i] = inv[i,j](A[n,i,j]) b[n,j]", {"A": (3, 0, 0), "b": (3, 0)},
     lambda A, b: np.linalg.solve(A, b[..., None])[..., 0]),
    ("x[n,i] = inv[i,j](A[n,i,j]) b[n,j]", {"A": (0, 2, 2), "b": (0, 2)},
     lambda A, b: np.linalg.solve(A, b[..., None])[..., 0]),
    ("x[n,i] = inv[i,j](A[n,i,j]) b[j]", {"A": (3, 0, 0), "b": (0,)},
     lambda A, b: np.linalg.solve(A, np.broadcast_to(b, (3, 0))[..., None])[..., 0]),
    ("q = y[i] inv[i,j](A[i,j]) y[j]", {"A": (0, 0), "y": (0,)}, lambda A, y: np.float64(0.0)),
    ("spd A\nx[i] = inv[i,j](A[i,j]) b[j]", {"A": (0, 0), "b": (0,)}, lambda A, b: np.linalg.solve(A, b)),
    ("d = det[i,j](A[i,j])", {"A": (0, 0)}, lambda A: np.linalg.det(A)),
    ("d = logdet[i,j](A[i,j])", {"A": (0, 0)}, lambda A: np.linalg.slogdet(A)[1]),
    ("d[n] = det[i,j](A[n,i,j])", {"A": (4, 0, 0)}, lambda A: np.linalg.det(A)),
    ("Y[n,i,j] = inv[i,j](A[n,i,j])", {"A": (2, 0, 0)}, lambda A: np.linalg.inv(A)),
]


def _everywhere(cases: list[Any], sample: tuple[int, ...]) -> list[Any]:
    """Every case on numpy, the cases at positions ``sample`` on torch, jax and dask too (their first calls are
    slower: the suite's time stays small)."""
    def with_backend(case: Any, backend: str) -> Any:
        return (*case, backend) if isinstance(case, tuple) else (case, backend)
    return [with_backend(case, "numpy") for case in cases] + [
        with_backend(cases[k], backend) for backend in BACKENDS[1:] for k in sample]


@pytest.mark.parametrize(("text", "shapes", "reference", "backend"), _everywhere(EMPTY_SOLVES, (0, 3, 5, 7)))
def test_a_solve_with_0x0_matrices_gives_numpys_empty_answer(text: str, shapes: dict[str, tuple[int, ...]],
                                                              reference: Callable[..., Any], backend: str) -> None:
    # (a non-empty matrix is the identity: numpy refuses a singular one even with no right-hand sides)
    arrays = {name: np.broadcast_to(np.eye(shape[-1]), shape).copy() if name == "A" else np.zeros(shape)
              for name, shape in shapes.items()}
    expected = np.asarray(reference(*arrays.values()))
    value = _run(text, backend, **arrays)
    assert value.shape == expected.shape
    assert value.dtype == expected.dtype
    np.testing.assert_array_equal(value, expected)


# ------------------------------------------------------------------ broadcast right-hand sides are solved
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batched_inverse_against_an_unbatched_rhs_is_solved_not_inverted(backend: str) -> None:
    rng = np.random.default_rng(37)
    A = (rng.standard_normal((6, 8, 8)) + 1j * rng.standard_normal((6, 8, 8)) + 6 * np.eye(8)).astype(np.complex64)
    c = (rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64)
    text = "x[b,i] = inv[i,j](A[b,i,j]) c[j]"
    report = str(ef.compile(text).plan(A=A.shape, c=c.shape))
    assert "solve" in report and " inv " not in report
    x = _run(text, backend, A=A, c=c)
    assert x.dtype == np.complex64 and x.shape == (6, 8)
    expected = np.linalg.solve(A.astype(np.complex128), np.broadcast_to(c, (6, 8))[..., None])[..., 0]
    np.testing.assert_allclose(x, expected, rtol=2e-5, atol=2e-6)
    # numpy's TestSolve check for complex64 (assert_almost_equal(b, a x, decimal=6): residual under 1.5e-6)
    np.testing.assert_almost_equal(np.einsum("bij,bj->bi", A.astype(np.complex128), x), np.broadcast_to(c, (6, 8)),
                                   decimal=6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batched_inverse_against_an_unbatched_matrix_and_transposed(backend: str) -> None:
    rng = np.random.default_rng(1)
    A = rng.standard_normal((3, 4, 4)) + 4 * np.eye(4)
    B = rng.standard_normal((4, 2))
    X = _run("X[n,i,k] = inv[i,j](A[n,i,j]) B[j,k]", backend, A=A, B=B)
    np.testing.assert_allclose(X, np.linalg.solve(A, np.broadcast_to(B, (3, 4, 2))), rtol=1e-12)
    y = _run("y[n,j] = B[i,k] inv[i,j](A[n,i,j])", backend, A=A, B=B)  # B^T inv(A), summed over k too
    np.testing.assert_allclose(y, np.einsum("ik,nij->nj", B, np.linalg.inv(A)), rtol=1e-12)


# ------------------------------------------------------------------ one behaviour on every backend
SINGULAR = np.array([[1.0, 2.0], [2.0, 4.0]])


@pytest.mark.parametrize(("text", "backend"), _everywhere(
    ["x[i] = inv[i,j](A[i,j]) b[j]", "Y[i,j] = inv[i,j](A[i,j])", "q = b[i] inv[i,j](A[i,j]) b[j]",
     "y[j] = b[i] inv[i,j](A[i,j])"], (0, 1)))
def test_a_singular_solve_or_inverse_is_a_matrix_error_on_every_backend(text: str, backend: str) -> None:
    with pytest.raises(ef.MatrixError, match=r"matrix 'A' is singular"):
        _run(text, backend, A=SINGULAR, b=np.ones(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_singular_matrix_in_a_batch_is_a_matrix_error(backend: str) -> None:
    A = np.stack([np.eye(2), SINGULAR])
    with pytest.raises(ef.MatrixError, match="singular"):
        _run("x[n,i] = inv[i,j](A[n,i,j]) b[n,j]", backend, A=A, b=np.ones((2, 2)))


@pytest.mark.parametrize(("text", "backend"), _everywhere(
    ["spd A\nx[i] = inv[i,j](A[i,j]) b[j]", "spd A\nd = logdet[i,j](A[i,j])", "spd A\nd = det[i,j](A[i,j])",
     "spd A\nY[i,j] = inv[i,j](A[i,j])", "spd A\nd = A[i,j] b[i] b[j]"], (0, 1, 4)))
def test_an_spd_matrix_that_is_not_positive_definite_is_a_matrix_error_on_every_backend(text: str,
                                                                                         backend: str) -> None:
    indefinite = np.array([[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ef.MatrixError, match="matrix 'A' is declared spd but is not positive definite"):
        _run(text, backend, A=indefinite, b=np.ones(2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("declaration", ["symmetric", "spd"])
def test_symmetric_or_spd_declared_on_a_non_square_input_is_a_matrix_error(declaration: str, backend: str) -> None:
    with pytest.raises(ef.MatrixError, match=rf"'A' is declared {declaration} but is not square.*\(2, 3\)"):
        _run(f"{declaration} A\nd = A[i,j] A[i,j]", backend, A=np.ones((2, 3)))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (numpy warns of the overflow and the nan)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("atom", ["det", "logdet"])
def test_det_and_logdet_of_a_matrix_holding_nan_are_nan_on_every_backend(atom: str, backend: str) -> None:
    A = np.array([[[np.nan, 1.0], [1.0, 1.0]], [[2.0, 0.0], [0.0, 3.0]]])
    with np.errstate(invalid="ignore"):
        value = _run(f"d[n] = {atom}[i,j](A[n,i,j])", backend, A=A)
    assert np.isnan(value[0])
    assert value[1] == pytest.approx(6.0 if atom == "det" else np.log(6.0))


# ------------------------------------------------------------------ the gradient of det where inv does not exist
def _cofactors(A: np.ndarray) -> np.ndarray:
    """The cofactor matrix of a small matrix from its minors (the gradient of det, adj(A)^T): no inverse."""
    n = A.shape[0]
    cofactors = np.empty_like(A)
    for i in range(n):
        for j in range(n):
            minor = np.delete(np.delete(A, i, axis=0), j, axis=1)
            cofactors[i, j] = (-1) ** (i + j) * (np.linalg.det(minor) if n > 1 else 1.0)
    return cofactors


def _central_differences(f: Callable[[np.ndarray], float], A: np.ndarray, step: float = 1e-6) -> np.ndarray:
    gradient = np.empty_like(A)
    for position in np.ndindex(A.shape):
        up, down = A.copy(), A.copy()
        up[position] += step
        down[position] -= step
        gradient[position] = (f(up) - f(down)) / (2 * step)
    return gradient


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("A", [np.array([[1.0, 2.0], [2.0, 4.0]]), np.arange(1.0, 10.0).reshape(3, 3),
                               np.zeros((3, 3)), np.array([[0.0]]), np.diag([2.0, 0.0, 3.0, 5.0])])
def test_grad_of_det_at_a_singular_matrix_is_the_adjugate(A: np.ndarray, backend: str) -> None:
    gradient = ef.grad("f = det[i,j](A[i,j])", wrt="A")
    value = gradient(A=_on(backend)(A), backend=backend)
    value = np.asarray(value.compute() if hasattr(value, "compute") else value)
    np.testing.assert_allclose(value, _cofactors(A), atol=1e-12)
    np.testing.assert_allclose(value, _central_differences(np.linalg.det, A), atol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("corank", [1, 2])
def test_grad_of_det_of_singular_matrices_of_corank_1_and_2_matches_jax(corank: int, backend: str) -> None:
    # jax's testDetGradOfSingularMatrixCorank1/2: a random matrix of rank n - corank; the cofactors vanish for
    # corank 2, not for corank 1
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(corank)
    A = rng.standard_normal((5, 5 - corank)) @ rng.standard_normal((5 - corank, 5))
    expected = np.asarray(jax.grad(jax.numpy.linalg.det)(A))
    value = _run("f = det[i,j](A[i,j])", backend, A=A)  # (the value itself: a float near 0)
    assert abs(float(value)) < 1e-12
    gradient = ef.grad("f = det[i,j](A[i,j])", wrt="A")(A=_on(backend)(A), backend=backend)
    gradient = np.asarray(gradient.compute() if hasattr(gradient, "compute") else gradient)
    np.testing.assert_allclose(gradient, expected, atol=1e-10)
    np.testing.assert_allclose(gradient, _central_differences(np.linalg.det, A), atol=1e-7)
    if corank == 2:
        assert np.abs(gradient).max() < 1e-12
    else:
        assert np.abs(gradient).max() > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_of_det_of_a_batch_holding_a_singular_matrix(backend: str) -> None:
    A = np.stack([np.array([[2.0, 1.0], [1.0, 3.0]]), np.array([[1.0, 2.0], [2.0, 4.0]]), np.zeros((2, 2))])
    text = "f = sum[n](det[i,j](A[n,i,j]))"
    report = str(ef.grad(text, wrt="A").plan(A=A.shape))
    assert " adj " in report and " inv " not in report  # one adjugate step, no inverse
    value = ef.grad(text, wrt="A")(A=_on(backend)(A), backend=backend)
    value = np.asarray(value.compute() if hasattr(value, "compute") else value)
    np.testing.assert_allclose(value, np.stack([_cofactors(matrix) for matrix in A]), atol=1e-12)


@pytest.mark.parametrize("text", ["symmetric A\nf = det[i,j](A[i,j])", "f = det[i,j](A[j,i] + B[i,j])",
                                  "f = x[i] x[i] det[i,j](A[i,j])"])
def test_grad_of_det_at_a_singular_matrix_in_other_programs(text: str) -> None:
    A = np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 3.0]])
    arrays = {"A": A, "B": np.zeros((3, 3)), "x": np.array([1.0, 2.0, 0.5])}
    program = ef.compile(text.removeprefix("symmetric A\n"))  # (a varied matrix is no longer symmetric)
    arrays = {name: array for name, array in arrays.items() if name in program.inputs}

    def f(matrix: np.ndarray) -> float:
        return float(program(**{**arrays, "A": matrix}))

    expected = _central_differences(f, A)
    if text.startswith("symmetric"):
        expected = (expected + expected.T) / 2
    np.testing.assert_allclose(ef.grad(text, wrt="A")(**arrays), expected, atol=1e-7)


# ------------------------------------------------------------------ sign_det (LANGUAGE.md 9.4)
def _sign_det_matrices() -> np.ndarray:
    rng = np.random.default_rng(94)
    A = rng.standard_normal((6, 3, 3))
    A[1] = 1e200 * np.eye(3)  # det overflows to inf
    A[2] = -1e-200 * np.eye(3)  # det underflows to -0
    A[3, 0] = 0.0  # singular: sign 0
    A[4] = np.diag([-1e300, 1e300, 1e300])  # det is -inf
    A[5] = np.eye(3)[[1, 0, 2]]  # a permutation: -1
    return A


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (numpy warns of the overflow and the nan)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_det_is_finite_where_det_over_or_underflows_on_every_backend(backend: str) -> None:
    A = _sign_det_matrices()
    with np.errstate(all="ignore"):
        expected = np.linalg.slogdet(A)[0]
        assert not np.isfinite(np.linalg.det(A)[[1, 4]]).any() and np.linalg.det(A)[2] == 0
    value = _run("s[b] = sign_det[i,j](A[b,i,j])", backend, A=A)
    np.testing.assert_array_equal(value, expected)
    assert not np.signbit(value[3])  # 0, not -0
    assert value.dtype == np.float64
    # with logdet, from one factorisation: sign_det exp(logdet) is det where det is representable
    product = _run("d[b] = sign_det[i,j](A[b,i,j]) exp(logdet[i,j](A[b,i,j]))", backend, A=A)
    np.testing.assert_allclose(product[[0, 5]], np.linalg.det(A[[0, 5]]), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_det_of_a_complex_matrix_is_a_unit_complex_number(backend: str) -> None:
    rng = np.random.default_rng(3)
    C = rng.standard_normal((2, 3, 3)) + 1j * rng.standard_normal((2, 3, 3))
    value = _run("s[b] = sign_det[i,j](C[b,i,j])", backend, C=C)
    determinant = np.linalg.det(C)
    np.testing.assert_allclose(value, determinant / np.abs(determinant), rtol=1e-12)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (numpy warns of the overflow and the nan)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_det_of_a_matrix_holding_nan_is_nan_and_of_0x0_is_1(backend: str) -> None:
    A = np.array([[[np.nan, 1.0], [1.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    value = _run("s[b] = sign_det[i,j](A[b,i,j])", backend, A=A)
    assert np.isnan(value[0]) and value[1] == -1.0
    assert float(_run("s = sign_det[i,j](A[i,j])", backend, A=np.zeros((0, 0)))) == 1.0


def test_sign_det_prints_reparses_and_has_a_zero_derivative() -> None:
    program = ef.compile("f = sign_det[i,j](A[i,j]) x[i] x[i]")
    assert ef.compile(str(program)) == program
    assert "sign_det[i,j](A[i,j])" in str(program)
    A, x = np.diag([-2.0, 1.0]), np.array([1.0, 3.0])
    gradient = ef.grad(program, wrt="A")
    assert ef.compile(str(gradient)) == gradient
    np.testing.assert_array_equal(gradient(A=A, x=x), np.zeros((2, 2)))
    np.testing.assert_allclose(ef.grad(program, wrt="x")(A=A, x=x), -2 * x)
    # the derivative of sign_det logdet goes through logdet only: sign_det inv^T
    both = ef.grad("f = sign_det[i,j](A[i,j]) logdet[i,j](A[i,j])", wrt="A")(A=A)
    np.testing.assert_allclose(both, -np.linalg.inv(A).T)
    with pytest.raises(ef.ParseError):
        ef.compile("sign_det = x[i] x[i]")  # a reserved word
    assert r"\operatorname{sgn}\det A" in program.to_latex()


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
def test_sign_det_is_exported_to_source(target: str, tmp_path: Any) -> None:
    pytest.importorskip(target)
    A = _sign_det_matrices()
    source = ef.compile("s[b] = sign_det[i,j](A[b,i,j])").to_source(target=target)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(tmp_path / "exported.py"), "exec"), namespace)  # noqa: S102 - einflow's own output
    value = namespace["f"](A=_on(target)(A))
    value = value.detach().numpy() if hasattr(value, "detach") else np.asarray(value)
    np.testing.assert_array_equal(value, np.linalg.slogdet(A)[0])


# ------------------------------------------------------------------ numpy's TestDet/TestSolve/TestInv, shimmed
# Modelled on numpy's linalg/tests/test_linalg.py: each dtype, square, empty and batched (stacked) shapes, the
# result's dtype numpy's, the checks numpy's (assert_almost_equal: 6 decimals in single, 12 in double precision).
DTYPES = ("float32", "float64", "complex64", "complex128")
SHAPES = ((0, 0), (1, 1), (3, 3), (2, 0, 0), (0, 2, 2), (4, 3, 3), (2, 3, 4, 4))
_BATCH = "abcd"


#: every dtype and shape on numpy; on torch, jax and dask (slower to start) one single and one double dtype,
#: an empty and a batched shape
CASES = [(dtype, shape, "numpy") for dtype in DTYPES for shape in SHAPES] + [
    (dtype, shape, backend) for backend in ("torch", "dask") for dtype in ("float32", "complex128")
    for shape in ((2, 0, 0), (4, 3, 3))] + [("complex64", (4, 3, 3), "jax"), ("float64", (2, 0, 0), "jax")]


def _matrices(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng(len(shape) * 10 + shape[-1])
    A = rng.standard_normal(shape) + 3 * np.eye(shape[-1])  # well conditioned, as numpy's cases
    if dtype.startswith("complex"):
        A = A + 1j * rng.standard_normal(shape)
    return A.astype(dtype)


def _decimal(dtype: str) -> int:
    """numpy's decimals less one: its cases are 2x2 and better conditioned than these 4x4 ones (numpy's own
    float32 inverse of them misses 6 decimals too)."""
    return 5 if dtype in ("float32", "complex64") else 11


def _batch(shape: tuple[int, ...]) -> str:
    return ",".join(_BATCH[: len(shape) - 2])


def _ref(name: str, shape: tuple[int, ...], rows: str = "i", columns: str = "j") -> str:
    batch = _batch(shape)
    return f"{name}[{batch + ',' if batch else ''}{rows},{columns}]"


@pytest.mark.parametrize(("dtype", "shape", "backend"), CASES, ids=str)
def test_numpy_testdet_cases(dtype: str, shape: tuple[int, ...], backend: str) -> None:
    A = _matrices(shape, dtype)
    batch = _batch(shape)
    target = f"d[{batch}]" if batch else "d"
    det = _run(f"{target} = det[i,j]({_ref('A', shape)})", backend, A=A)
    logdet = _run(f"{target} = logdet[i,j]({_ref('A', shape)})", backend, A=A)
    sign = _run(f"{target} = sign_det[i,j]({_ref('A', shape)})", backend, A=A)
    expected = np.linalg.det(A)
    assert det.shape == expected.shape and det.dtype == expected.dtype
    # numpy: det is the product of the eigenvalues; slogdet's sign and log|det| give it back
    eigenvalues = np.prod(np.linalg.eigvals(A.astype(np.complex128)), axis=-1) if A.size else np.ones(shape[:-2])
    scale = np.maximum(1.0, np.abs(eigenvalues))
    eigenvalues = eigenvalues if det.dtype.kind == "c" else eigenvalues.real
    np.testing.assert_almost_equal(det / scale, (eigenvalues / scale).astype(det.dtype), decimal=_decimal(dtype) - 1)
    reference_sign, reference_logdet = np.linalg.slogdet(A)
    assert sign.dtype == reference_sign.dtype
    if dtype.startswith("complex") and backend != "numpy":
        # (torch, jax and dask return a complex logdet of a complex matrix, with a zero imaginary part: one
        # dtype rule for it is the complex-numbers work of issue 37, not this file's)
        assert np.all(logdet.imag == 0)
        logdet = logdet.real
    assert logdet.dtype == reference_logdet.dtype
    np.testing.assert_almost_equal(logdet, reference_logdet, decimal=_decimal(dtype) - 1)
    np.testing.assert_almost_equal(sign, reference_sign, decimal=_decimal(dtype) - 1)


@pytest.mark.parametrize(("dtype", "shape", "backend"), CASES, ids=str)
def test_numpy_testsolve_and_testinv_cases(dtype: str, shape: tuple[int, ...], backend: str) -> None:
    A = _matrices(shape, dtype)
    batch = _batch(shape)
    lead = batch + "," if batch else ""
    rng = np.random.default_rng(5)
    b = rng.standard_normal(shape[:-1] + (2,)) + (1j * rng.standard_normal(shape[:-1] + (2,))
                                                  if dtype.startswith("complex") else 0)
    b = b.astype(dtype)
    x = _run(f"x[{lead}i,k] = inv[i,j]({_ref('A', shape)}) b[{lead}j,k]", backend, A=A, b=b)
    expected = np.linalg.solve(A, b)
    assert x.shape == expected.shape and x.dtype == expected.dtype
    np.testing.assert_almost_equal(np.matmul(A.astype(np.complex128), x), b, decimal=_decimal(dtype))
    vector = np.ascontiguousarray(b[..., 0])  # a vector right-hand side, and one shared by the whole batch
    y = _run(f"y[{lead}i] = inv[i,j]({_ref('A', shape)}) v[{lead}j]", backend, A=A, v=vector)
    np.testing.assert_almost_equal(np.einsum("...ij,...j->...i", A.astype(np.complex128), y), vector,
                                   decimal=_decimal(dtype))
    shared = np.ascontiguousarray(vector.reshape(-1, shape[-1])[0]) if vector.size else np.zeros(shape[-1], dtype)
    z = _run(f"z[{lead}i] = inv[i,j]({_ref('A', shape)}) v[j]", backend, A=A, v=shared)
    assert z.shape == shape[:-1] and z.dtype == expected.dtype
    np.testing.assert_almost_equal(np.einsum("...ij,...j->...i", A.astype(np.complex128), z),
                                   np.broadcast_to(shared, shape[:-1]), decimal=_decimal(dtype))
    inverse = _run(f"Y[{lead}i,j] = inv[i,j]({_ref('A', shape)})", backend, A=A)
    assert inverse.shape == shape and inverse.dtype == np.linalg.inv(A).dtype
    np.testing.assert_allclose(inverse, np.linalg.inv(A), rtol=1e-4 if _decimal(dtype) < 10 else 1e-10, atol=1e-6)
    identity = np.broadcast_to(np.eye(shape[-1]), shape)
    np.testing.assert_almost_equal(np.matmul(A.astype(np.complex128), inverse), identity, decimal=_decimal(dtype))


# jax's testDetGrad: the gradient of det of random (batched) matrices against jax.grad, in both precisions
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 4, 4)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_jax_testdetgrad_cases(dtype: str, shape: tuple[int, ...]) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    A = np.random.default_rng(shape[-1]).standard_normal(shape).astype(dtype)
    expected = np.asarray(jax.grad(lambda m: jax.numpy.linalg.det(m).sum())(A))
    batch = _batch(shape)
    text = f"f = sum[{batch}](det[i,j]({_ref('A', shape)}))" if batch else f"f = det[i,j]({_ref('A', shape)})"
    gradient = ef.grad(text, wrt="A")(A=A)
    assert gradient.dtype == A.dtype
    np.testing.assert_allclose(gradient, expected, rtol=1e-4 if dtype == "float32" else 1e-12, atol=1e-5)
