"""conj/real/imag never hand an input array to a step that writes in place (found merging the complex work:
``inv(conj(A) + delta)`` added the identity into the caller's A, since conj of a real array returned A itself)."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef


@pytest.mark.parametrize("func", ["conj", "real"])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_inv_of_conj_of_A_plus_delta_leaves_A_alone_and_solves_A_plus_I(func: str, backend: str) -> None:
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 3)) + 3 * np.eye(3)
    x = rng.normal(size=3)
    kept = A.copy()
    want = x @ np.linalg.inv(A + np.eye(3))
    arrays = {"A": A, "x": x}
    if backend == "torch":
        torch = pytest.importorskip("torch")
        arrays = {k: torch.as_tensor(v) for k, v in arrays.items()}
    got = ef.evaluate(f"w[q] = x[c] inv[c,q]({func}(A[c,q]) + delta[c,q])", **arrays)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(arrays["A"]), kept)


def test_imag_of_a_complex_input_is_not_written_back_into_it() -> None:
    z = np.array([[1 + 2j, 3 - 1j], [0.5j, 2 + 0j]])
    kept = z.copy()
    got = ef.evaluate("w[i,j] = imag(z[i,j]) + delta[i,j]", z=z)
    np.testing.assert_allclose(got, z.imag + np.eye(2))
    np.testing.assert_array_equal(z, kept)
