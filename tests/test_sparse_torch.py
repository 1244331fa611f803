"""Sparse operands on the torch backend (LANGUAGE.md §9.3): torch sparse COO and CSR tensors, values and
derivatives against dense torch with the zeros written out, autograd through a call (to the dense operands and to
a COO tensor's values), and the errors for jax BCOO, dask and mixed libraries."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import einflow as ef

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore:Sparse")


def _dense(seed: int = 0) -> Any:
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(7, 5, dtype=torch.float64, generator=generator)
    dense = dense * (torch.rand(7, 5, generator=generator) < 0.4)
    dense[2] = 0.0  # an empty row
    return dense


LAYOUTS = ["coo", "csr"]


def _sparse(dense: Any, layout: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_values_and_sparse_results(layout: str) -> None:
    dense = _dense()
    S = _sparse(dense, layout)
    H = torch.randn(5, 3, dtype=torch.float64)
    y = ef.evaluate("y[i,f] = S[i,j] H[j,f]", S=S, H=H)
    assert y.layout == torch.strided
    torch.testing.assert_close(y, dense @ H)
    torch.testing.assert_close(ef.evaluate("u[j] = S[i,j] x[i]", S=S, x=torch.arange(7.0, dtype=torch.float64)),
                               dense.T @ torch.arange(7.0, dtype=torch.float64))
    P, Q = torch.randn(7, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    T = ef.evaluate("T[i,j] = S[i,j] P[i,f] Q[j,f]", S=S, P=P, Q=Q)  # SDDMM: on S's pattern, S's layout
    assert T.layout == S.layout
    torch.testing.assert_close(T.to_dense(), dense * (P @ Q.T))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_derivative_programs_against_dense_torch(layout: str) -> None:
    dense = _dense(1)
    S = _sparse(dense, layout)
    H = torch.randn(5, 3, dtype=torch.float64)
    loss = ef.compile("y[i,f] = S[i,j] H[j,f]\nL = sum[i,f](tanh(y[i,f]))")
    dS, dH = ef.grad(loss, wrt=["S", "H"])(S=S, H=H)
    D, Hd = dense.clone().requires_grad_(), H.clone().requires_grad_()
    torch.tanh(D @ Hd).sum().backward()
    assert dS.layout == S.layout  # the derivative by the stored values, on S's pattern
    torch.testing.assert_close(dS.to_dense(), D.grad * (dense != 0))
    torch.testing.assert_close(dH, Hd.grad)
    T = torch.randn(5, 3, dtype=torch.float64)
    jvp = ef.jvp(loss, wrt="H", tangent="T_H")(S=S, H=H, T_H=T)
    torch.testing.assert_close(jvp, (Hd.grad * T).sum())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_autograd_through_a_call(layout: str) -> None:
    dense = _dense(2)
    H = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    loss = ef.compile("L = sum[i,f](tanh(S[i,j] H[j,f]))")
    loss(S=_sparse(dense, layout), H=H).backward()
    expected = torch.autograd.grad(torch.tanh(dense @ H).sum(), H)[0]
    torch.testing.assert_close(H.grad, expected)


def test_autograd_to_the_values_of_a_coo_tensor() -> None:
    dense = _dense(3)
    coalesced = dense.to_sparse().coalesce()
    values = coalesced.values().clone().requires_grad_()
    # duplicates: every entry stored as two halves, summed on conversion
    indices = torch.cat([coalesced.indices(), coalesced.indices()], dim=1)
    S = torch.sparse_coo_tensor(indices, torch.cat([values / 2, values / 2]), dense.shape)
    H = torch.randn(5, 3, dtype=torch.float64)
    ef.evaluate("L = sum[i,f](tanh(S[i,j] H[j,f]))", S=S, H=H).backward()
    D = dense.clone().requires_grad_()
    torch.tanh(D @ H).sum().backward()
    rows, cols = coalesced.indices()
    torch.testing.assert_close(values.grad, D.grad[rows, cols])


def test_errors() -> None:
    S = _dense().to_sparse()
    with pytest.raises(ef.SparseError, match="numpy backend does not take"):
        ef.evaluate("y[i,f] = S[i,j] H[j,f]", S=S, H=np.ones((5, 3)), backend="numpy")
    # numpy arrays beside a torch sparse tensor run on torch, as beside a dense torch tensor
    torch.testing.assert_close(ef.evaluate("y[i,f] = S[i,j] H[j,f]", S=S, H=np.ones((5, 3))),
                               _dense() @ torch.ones(5, 3, dtype=torch.float64))
    with pytest.raises(ef.SparseError, match="layout"):
        ef.evaluate("y[i,f] = S[i,j] H[j,f]", S=_dense().to_sparse_csc(), H=torch.ones(5, 3, dtype=torch.float64))
    sp = pytest.importorskip("scipy.sparse")
    with pytest.raises(ef.SparseError, match="one library"):
        ef.evaluate("y[i] = S[i,j] R[i,j]", S=S, R=sp.csr_array(np.ones((7, 5))))
    pytest.importorskip("dask")
    with pytest.raises(ef.SparseError, match="dask backend does not take"):
        ef.evaluate("y[i,f] = S[i,j] H[j,f]", S=sp.csr_array(np.ones((7, 5))), H=np.ones((5, 3)), backend="dask")
