"""The numpy check of a matrix declared ``symmetric``/``spd`` (by blocks of the upper triangle, scaled by the
diagonal first) decides as the plain rule does: ``max|M - M^T| <= tolerance * max|M|``."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

SYMMETRIC = ef.compile("symmetric M\ns = sum[i,j](M[i,j])")


def _rule(matrix: np.ndarray) -> bool:
    tolerance = max(1e-10, 100 * float(np.finfo(matrix.dtype).eps))
    return bool(np.abs(matrix - matrix.T).max() <= tolerance * np.abs(matrix).max())


@pytest.mark.parametrize("size", [1, 5, 127, 128, 129, 300])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_blocked_check_decides_as_the_rule(size: int, dtype: type) -> None:
    rng = np.random.default_rng(size)
    base = rng.standard_normal((size, size))
    cases = [base + base.T, (base + base.T) * 1e-30, np.diag(rng.standard_normal(size))]
    if size > 1:
        nudged = base + base.T
        nudged[size - 1, 0] += 1e-3  # far off the diagonal, in the last block
        cases.append(nudged)
        large = (base + base.T) * 1e-3
        large[0, size - 1] = large[size - 1, 0] = 1e3  # the largest entries off the diagonal
        large[0, size - 1] += 1e3 * 1e-12
        cases.append(large)
        noisy = large.copy()
        noisy[1, 0] += 1e-3 * np.abs(large).max()
        cases.append(noisy)
    for matrix in cases:
        matrix = matrix.astype(dtype)
        if _rule(matrix):
            assert SYMMETRIC(M=matrix) == pytest.approx(float(matrix.sum(dtype=np.float64)), rel=1e-3, abs=1e-3)
        else:
            with pytest.raises(ef.EinflowError, match="not symmetric"):
                SYMMETRIC(M=matrix)


def test_nan_and_inf_are_not_symmetric() -> None:
    for bad in (np.nan, np.inf):
        matrix = np.eye(200)
        matrix[150, 3] = matrix[3, 150] = bad
        with pytest.raises(ef.EinflowError, match="not symmetric"):
            SYMMETRIC(M=matrix)
        matrix = np.eye(200)
        matrix[7, 7] = bad
        with pytest.raises(ef.EinflowError, match="not symmetric"):
            SYMMETRIC(M=matrix)


def test_an_spd_matrix_that_is_not_symmetric_is_named() -> None:
    program = ef.compile("spd K\nf = logdet[i,j](K[i,j])")
    K = np.eye(300) * 2
    assert program(K=K) == pytest.approx(300 * np.log(2))
    K[299, 0] = 0.5
    with pytest.raises(ef.EinflowError, match="'K' is declared spd but is not symmetric"):
        program(K=K)
