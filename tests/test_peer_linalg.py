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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("text", "shapes", "reference"), EMPTY_SOLVES)
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text", ["x[i] = inv[i,j](A[i,j]) b[j]", "Y[i,j] = inv[i,j](A[i,j])",
                                  "q = b[i] inv[i,j](A[i,j]) b[j]", "y[j] = b[i] inv[i,j](A[i,j])"])
def test_a_singular_solve_or_inverse_is_a_matrix_error_on_every_backend(text: str, backend: str) -> None:
    with pytest.raises(ef.MatrixError, match=r"matrix 'A' is singular"):
        _run(text, backend, A=SINGULAR, b=np.ones(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_singular_matrix_in_a_batch_is_a_matrix_error(backend: str) -> None:
    A = np.stack([np.eye(2), SINGULAR])
    with pytest.raises(ef.MatrixError, match="singular"):
        _run("x[n,i] = inv[i,j](A[n,i,j]) b[n,j]", backend, A=A, b=np.ones((2, 2)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text", ["spd A\nx[i] = inv[i,j](A[i,j]) b[j]", "spd A\nd = logdet[i,j](A[i,j])",
                                  "spd A\nd = det[i,j](A[i,j])", "spd A\nY[i,j] = inv[i,j](A[i,j])",
                                  "spd A\nd = A[i,j] b[i] b[j]"])
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("atom", ["det", "logdet"])
def test_det_and_logdet_of_a_matrix_holding_nan_are_nan_on_every_backend(atom: str, backend: str) -> None:
    A = np.array([[[np.nan, 1.0], [1.0, 1.0]], [[2.0, 0.0], [0.0, 3.0]]])
    with np.errstate(invalid="ignore"):
        value = _run(f"d[n] = {atom}[i,j](A[n,i,j])", backend, A=A)
    assert np.isnan(value[0])
    assert value[1] == pytest.approx(6.0 if atom == "det" else np.log(6.0))
