"""Sparse operands (LANGUAGE.md §9.3): scipy.sparse and pydata sparse inputs, values and derivatives against dense
numpy with the zeros written out, results on a pattern, errors, and no densifying."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

sp = pytest.importorskip("scipy.sparse")
sparse = pytest.importorskip("sparse")

FORMATS = ["csr", "csc", "coo", "bsr", "dia", "lil", "dok"]


def _matrix(rows: int = 7, cols: int = 5, density: float = 0.35, seed: int = 0,
            empty_row: int | None = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(rows, cols)) * (rng.random((rows, cols)) < density)
    if empty_row is not None:
        dense[empty_row] = 0.0
    return dense


def _dense(value):
    if isinstance(value, sparse.SparseArray):
        return value.todense()
    return value.toarray()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("array", [True, False], ids=["array", "matrix"])
def test_spmm_every_scipy_format(fmt: str, array: bool) -> None:
    dense = _matrix()
    build = sp.csr_array if array else sp.csr_matrix
    S = build(dense).asformat(fmt)
    H = np.random.default_rng(1).normal(size=(5, 3))
    y = ef.compile("y[i,f] = S[i,j] H[j,f]")(S=S, H=H)
    assert type(y) is np.ndarray
    np.testing.assert_allclose(y, dense @ H, atol=1e-13)
    # the transposed product and a matrix-vector product
    x = np.arange(7.0)
    np.testing.assert_allclose(ef.compile("u[j] = S[i,j] x[i]")(S=S, x=x), dense.T @ x, atol=1e-13)


def test_duplicates_are_summed() -> None:
    rows, cols = np.array([0, 0, 2, 0]), np.array([1, 1, 3, 1])
    data = np.array([1.0, 2.0, 5.0, 4.0])
    S = sp.coo_array((data, (rows, cols)), shape=(3, 4))
    dense = S.toarray()
    assert dense[0, 1] == 7.0
    H = np.random.default_rng(2).normal(size=(4, 2))
    np.testing.assert_allclose(ef.compile("y[i,f] = S[i,j] H[j,f]")(S=S, H=H), dense @ H)
    # a function with f(0) = 0 sees the summed entry, not each duplicate
    T = ef.compile("T[i,j] = S[i,j]^2")(S=S)
    np.testing.assert_allclose(_dense(T), dense**2)
    assert S.nnz == 4  # the caller's array is left alone


def test_sddmm_returns_sparse_on_the_pattern() -> None:
    dense = _matrix()
    rng = np.random.default_rng(3)
    P, Q = rng.normal(size=(7, 4)), rng.normal(size=(5, 4))
    for S in (sp.csr_array(dense), sp.csc_matrix(dense), sparse.COO.from_numpy(dense)):
        T = ef.compile("T[i,j] = S[i,j] P[i,f] Q[j,f]")(S=S, P=P, Q=Q)
        assert type(T) is type(S)
        np.testing.assert_allclose(_dense(T), dense * (P @ Q.T), atol=1e-13)
    # transposed target: the pattern transposed
    T = ef.compile("T[j,i] = S[i,j] P[i,f] Q[j,f]")(S=sp.csr_array(dense), P=P, Q=Q)
    np.testing.assert_allclose(_dense(T), (dense * (P @ Q.T)).T, atol=1e-13)


def test_elementwise_functions() -> None:
    dense = _matrix()
    S = sp.csr_array(dense)
    T = ef.compile("T[i,j] = tanh(S[i,j])")(S=S)  # tanh(0) = 0: on the pattern
    assert sp.issparse(T)
    np.testing.assert_allclose(_dense(T), np.tanh(dense))
    E = ef.compile("E[i,j] = exp(S[i,j])")(S=S)  # exp(0) = 1: dense, as numpy gives it
    assert type(E) is np.ndarray
    np.testing.assert_allclose(E, np.exp(dense))
    s = ef.compile("s = sum[i,j](S[i,j]^2)")(S=S)
    assert np.isclose(s, (dense**2).sum())


def test_pattern_value_used_later() -> None:
    dense = _matrix()
    rng = np.random.default_rng(4)
    P, Q, H = rng.normal(size=(7, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    p = ef.compile("""
    A[i,j] = S[i,j] exp(P[i,f] Q[j,f])
    y[i,g] = A[i,j] H[j,g]
    """)
    y = p(S=sp.csr_array(dense), P=P, Q=Q, H=H)
    np.testing.assert_allclose(y, (dense * np.exp(P @ Q.T)) @ H, atol=1e-12)


def test_pydata_coo_3d_mttkrp_and_cp_gradient() -> None:
    rng = np.random.default_rng(5)
    shape, rank = (6, 5, 4), 3
    dense = rng.normal(size=shape) * (rng.random(shape) < 0.3)
    dense[1] = 0.0
    X = sparse.COO.from_numpy(dense)
    A, B, C = (rng.normal(size=(n, rank)) for n in shape)
    M = ef.compile("M[i,r] = X[i,j,k] B[j,r] C[k,r]")(X=X, B=B, C=C)
    np.testing.assert_allclose(M, np.einsum("ijk,jr,kr->ir", dense, B, C), atol=1e-12)
    # the CP loss of the observed entries: || X - W * [[A, B, C]] ||^2, W the pattern of X
    W = sparse.COO(X.coords, np.ones(X.nnz), shape=shape)
    loss = ef.compile("""
    E[i,j,k] = X[i,j,k] - W[i,j,k] A[i,r] B[j,r] C[k,r]
    L = sum[i,j,k](E[i,j,k]^2)
    """)
    mask = W.todense()  # the stored entries (from_numpy may store some zeros)
    recon = np.einsum("ir,jr,kr->ijk", A, B, C)
    residual = dense - mask * recon
    assert np.isclose(loss(X=X, W=W, A=A, B=B, C=C), (residual**2).sum())
    gA, gB, gC, gX = ef.grad(loss, wrt=["A", "B", "C", "X"])(X=X, W=W, A=A, B=B, C=C)
    np.testing.assert_allclose(gA, -2 * np.einsum("ijk,jr,kr->ir", mask * residual, B, C), atol=1e-11)
    np.testing.assert_allclose(gB, -2 * np.einsum("ijk,ir,kr->jr", mask * residual, A, C), atol=1e-11)
    np.testing.assert_allclose(gC, -2 * np.einsum("ijk,ir,jr->kr", mask * residual, A, B), atol=1e-11)
    assert isinstance(gX, sparse.COO)
    np.testing.assert_allclose(gX.todense(), 2 * residual * mask, atol=1e-11)
    assert gX.nnz == X.nnz
    assert gX.nnz == X.nnz


def test_gradients_against_dense() -> None:
    dense = _matrix()
    rng = np.random.default_rng(6)
    H = rng.normal(size=(5, 3))
    p = ef.compile("""
    y[i,f] = S[i,j] H[j,f]
    L = sum[i,f](tanh(y[i,f]))
    """)
    S = sp.csr_array(dense)
    gS, gH = ef.grad(p, wrt=["S", "H"])(S=S, H=H)
    dS, dH = ef.grad(p, wrt=["S", "H"])(S=dense, H=H)
    assert sp.issparse(gS) and gS.format == "csr"
    np.testing.assert_allclose(gS.toarray(), dS * (dense != 0), atol=1e-13)
    np.testing.assert_allclose(gH, dH, atol=1e-13)
    # finite differences along a stored entry
    eps = 1e-6
    k = np.flatnonzero(dense)[3]
    bumped = dense.copy()
    bumped.flat[k] += eps
    numeric = (p(S=sp.csr_array(bumped), H=H) - p(S=S, H=H)) / eps
    assert abs(numeric - gS.toarray().flat[k]) < 1e-5


def test_value_and_grad_and_plan_count_nnz() -> None:
    p = ef.compile("y[i,f] = S[i,j] H[j,f]")
    small = sp.random_array((1000, 1000), density=0.001, random_state=0, format="csr")
    large = sp.random_array((1000, 1000), density=0.01, random_state=0, format="csr")
    H = np.ones((1000, 8))
    f_small = p.plan(S=small, H=H).flops
    f_large = p.plan(S=large, H=H).flops
    assert 5 < f_large / f_small < 15
    assert f_large < 2 * 1000 * 1000 * 8 / 10  # far below the dense product's


def test_never_densified() -> None:
    # a (10^6 x 10^6 x 10^5) tensor: its dense form would need 8e17 bytes
    rng = np.random.default_rng(7)
    shape, nnz, rank = (10**6, 10**6, 10**5), 200, 4
    coords = np.stack([rng.integers(0, n, nnz) for n in shape])
    X = sparse.COO(coords, rng.normal(size=nnz), shape=shape)
    B, C = rng.normal(size=(shape[1], rank)), rng.normal(size=(shape[2], rank))
    p = ef.compile("L = sum[i,j,k,r](X[i,j,k] B[j,r] C[k,r])")
    value = p(X=X, B=B, C=C, memory_limit="1GB")
    expected = (X.data[:, None] * B[X.coords[1]] * C[X.coords[2]]).sum()
    assert np.isclose(value, expected)
    gX = ef.grad(p, wrt="X")(X=X, B=B, C=C, memory_limit="1GB")
    assert isinstance(gX, sparse.COO) and gX.nnz == X.nnz
    n = 10**7
    S = sp.coo_array((rng.normal(size=500), (rng.integers(0, n, 500), rng.integers(0, n, 500))), shape=(n, n)).tocsr()
    y = ef.compile("y[i] = S[i,j] x[j]")(S=S, x=np.ones(10**7), memory_limit="1GB")
    np.testing.assert_allclose(y, S @ np.ones(10**7))


def test_errors() -> None:
    S = sp.csr_array(_matrix())
    p = ef.compile("y[i,f] = S[i,j] H[j,f]")
    with pytest.raises(ef.SparseError, match="'S'.*numpy"):
        p(S=S, H=np.ones((5, 2)), backend="dask")
    torch = pytest.importorskip("torch")  # (torch sparse tensors: tests/test_sparse_torch.py)
    with pytest.raises(ef.SparseError, match="'S'"):
        p(S=S, H=torch.ones(5, 2))
    with pytest.raises(ef.SparseError, match="diagonal"):
        ef.compile("t = S[i,i]")(S=sp.csr_array(np.eye(3)))
    with pytest.raises(ef.SparseError, match="fill"):
        p(S=sparse.COO.from_numpy(np.eye(5), fill_value=1.0), H=np.ones((5, 2)))


def test_jax_bcoo_is_refused() -> None:
    jsparse = pytest.importorskip("jax.experimental.sparse")
    import jax.numpy as jnp

    with pytest.raises(ef.SparseError, match="'S'"):
        ef.compile("y[i] = S[i,j] x[j]")(S=jsparse.BCOO.fromdense(jnp.eye(3)), x=jnp.ones(3))


def test_spmm_through_scipy_and_gather_form_agree() -> None:
    dense = _matrix(9, 6, seed=8)
    rng = np.random.default_rng(9)
    D3 = rng.normal(size=(6, 2, 3))
    for S in (sp.csr_array(dense), sparse.COO.from_numpy(dense)):
        y = ef.compile("y[i,f,g] = S[i,j] D[j,f,g]")(S=S, D=D3)  # scipy's kernel
        np.testing.assert_allclose(y, np.einsum("ij,jfg->ifg", dense, D3), atol=1e-13)
        Dt = rng.normal(size=(4, 9))
        u = ef.compile("u[j,f] = S[i,j] D[f,i]")(S=S, D=Dt)  # transposed, summed axis last
        np.testing.assert_allclose(u, dense.T @ Dt.T, atol=1e-13)
        w = ef.compile("w[i,f] = 2 S[i,j] D[j,f]")(S=S, D=D3[:, :, 0])  # a scaled product: the gather form
        np.testing.assert_allclose(w, 2 * dense @ D3[:, :, 0], atol=1e-13)


def test_plan_report_shows_the_form_that_runs() -> None:
    S = sp.csr_array(_matrix(50, 40, density=0.1, seed=10))
    # an SpMM of two inputs runs through scipy's CSR kernel: the report's first step, 2 nnz x 8 FLOPs
    report = ef.compile("y[i,f] = S[i,j] H[j,f]").plan(S=S, H=(40, 8))
    assert report.steps[0].kind == "spmm" and report.steps[0].flops == 2 * S.nnz * 8
    assert report.steps[0].shape == (50, 8) and "S @ H" in str(report)
    assert report.flops < 2 * 50 * 40 * 8
    # a product the kernel does not take: the gather form, its FLOPs from nnz
    report = ef.compile("y[i,f] = S[i,j] H[j,f] W[i,f]").plan(S=S, H=(40, 8), W=(50, 8))
    assert "S_v" in str(report) and all(step.kind != "spmm" for step in report.steps)
    assert report.flops < 2 * 50 * 40 * 8


def test_jvp_and_hvp_by_a_dense_operand() -> None:
    dense = _matrix(seed=11)
    rng = np.random.default_rng(12)
    H, T = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    p = ef.compile("y[i,f] = S[i,j] H[j,f]\nL = sum[i,f](tanh(y[i,f]))")
    for make in (ef.jvp, ef.hvp):
        derived = make(p, wrt="H")
        tangent = next(name for name in derived.inputs if name not in ("S", "H"))
        ours = derived(S=sp.csr_array(dense), H=H, **{tangent: T})
        np.testing.assert_allclose(ours, derived(S=dense, H=H, **{tangent: T}), atol=1e-12)
    # the Hessian by H multiplies S by itself on two index pairs: a product of two sparse factors
    with pytest.raises(ef.SparseError, match="two sparse"):
        ef.hessian(p, wrt="H")(S=sp.csr_array(dense), H=H)


def test_value_and_grad_with_a_sparse_input() -> None:
    dense = _matrix(seed=13)
    H = np.random.default_rng(14).normal(size=(5, 3))
    text = "y[i,f] = S[i,j] H[j,f]\nL = sum[i,f](y[i,f]^2)"
    value, (gS, gH) = ef.value_and_grad(text, wrt=["S", "H"])(S=sp.csr_matrix(dense), H=H)
    assert np.isclose(value, ((dense @ H) ** 2).sum())
    assert isinstance(gS, sp.csr_matrix)
    np.testing.assert_allclose(gS.toarray(), 2 * (dense @ H) @ H.T * (dense != 0), atol=1e-12)
    np.testing.assert_allclose(gH, 2 * dense.T @ (dense @ H), atol=1e-12)


# ---------------------------------------------------------------- found by tests/test_sparse_differential.py
REGRESSIONS = [
    # an index summed inside a divisor of its own (a trace) is another index than the product's (seed 17)
    ("Y[m] = u[c] S[m,c] / W[c,c]", {"u": (5,), "W": (5, 5)}),
    # inv over indices read at the sparse tensor's coordinates: computed whole first (seed 61)
    ("L = inv[a,b](M[a,b] + 3 delta[a,b]) S[i,a] Q[i,b]", {"M": (5, 5), "Q": (7, 5)}),
    # a sum's terms keep the index they share with the product around them (seed 57)
    ("f = sum[i](e[i] (S[i,j] T[j,k] + S[i,j] U[j,k]) g[k])", {"e": (7,), "T": (5, 3), "U": (5, 3), "g": (3,)}),
    # an index summed inside a function's argument is not the product's (seed 69)
    ("L[t,l] = X[n,n] y[n] / exp(A[r,n] R[t,r] S[n,l])", {"X": (7, 7), "y": (7,), "A": (2, 7), "R": (3, 2)}),
    # a delta partner of a coordinate gets its size (seed 64)
    ("f = logsumexp[h,r](d[h,m] S[m,n] P[r,n])", {"d": (7, 7), "P": (2, 5)}),
    # an index gathered in one term and read in another keeps its size (seed 96)
    ("G[r] = sum[n](R[r,a] S[n,a]) + (B[j] delta[n,n])^1", {"R": (3, 5), "B": (2,)}),
    # the kept indices written in another order than the sparse factor's (seeds 142, 155, 163, 168, 288)
    ("Y[j,i,l] = P[j,l] S[i,j]", {"P": (5, 2)}),
    ("Y[l,j,i] = P[j,l] S[i,j] - E[i,j]", {"P": (5, 2), "E": (7, 5)}),
    # a reduction over an index of the same name as the (implicit) target's (seed 102)
    ("Y = mean[j,i](delta[h,j] S[h,i]) + w[j]", {"w": (7,)}),
    ("Y = max[j,i](delta[i,j] S[h,i] D[i]) + w[j]", {"w": (5,), "D": (5,)}),
    # an index read in one scope and sized by a tensor of another (seed 203)
    ("Y[a] = sum[r](delta[k,k] S[a,r]) + sum[k](P[a,k])", {"P": (7, 3)}),
    # a tensor's diagonal read at a gather sums the diagonal where its own product does (seeds 615, 806, 903, 912)
    ("f[h] = log_softmax[h](S[p,h] g[p] W[t,t,p])", {"g": (7,), "W": (2, 2, 7)}),
    ("L = (P[r,k,r] - y[k])^2 v[r] S[k,r]", {"P": (5, 7, 5), "y": (7,), "v": (5,)}),
    # the entries of a sparse factor summed by the scope that sums its indices, not by the statement (seed 699)
    ("L = c (sum[q,i,j](S[i,j] W[q]) + T[q] Y[q])", {"c": (), "W": (3,), "T": (3,), "Y": (3,)}),
    # dense factors contracted first keep the one size source of an index read elsewhere in a delta (seed 845)
    ("L = sum[n](S[a,n] X[k] M[k,q,b] P[q,b]) - delta[q,q] u[a]", {"X": (4,), "M": (4, 3, 2), "P": (3, 2),
                                                                  "u": (7,)}),
    # a normaliser computed on its own keeps the size of an index it reads only in a delta (seed 636)
    ("L = S[p,n] softmax[n](u[n] delta[q,q]) M[q,q]", {"u": (5,), "M": (3, 3)}),
]


def test_scatter_of_gathered_positions_in_the_output_order() -> None:
    # a product scattering two gathered positions into an output whose axes are not in the deltas' order: each
    # axis takes its own positions (it took them in the deltas' order, a transposed result), on any arrays
    rng = np.random.default_rng(11)
    rows, cols = rng.integers(0, 4, 9), rng.integers(0, 3, 9)
    v, P = rng.normal(size=9), rng.normal(size=(3, 2))
    expected = np.zeros((3, 4, 2))
    np.add.at(expected, (cols, rows), v[:, None] * P[cols])
    program = ef.compile("size h = 3\nsize k = 4\nY[h,k,l] = v[z] delta[k, r[z]] delta[h, c[z]] P[c[z], l]")
    for read_only in (False, True):  # (read-only coordinates take the sorted segment sums)
        r, c = rows.copy(), cols.copy()
        r.setflags(write=not read_only)
        c.setflags(write=not read_only)
        np.testing.assert_allclose(program(v=v, r=r, c=c, P=P), expected, atol=1e-13)


@pytest.mark.parametrize("text, shapes", REGRESSIONS)
def test_rewrite_scopes_against_dense(text: str, shapes: dict) -> None:
    dense = _matrix()
    rng = np.random.default_rng(7)
    arrays = {name: rng.uniform(0.5, 1.5, size=shape) for name, shape in shapes.items()}
    program = ef.compile(text)
    for S in (sp.csr_array(dense), sparse.COO.from_numpy(dense)):
        got, want = program(**arrays, S=S), program(**arrays, S=dense)
        got = _dense(got) if sp.issparse(got) or isinstance(got, sparse.SparseArray) else got
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conversion_and_segment_order_are_kept_per_input() -> None:
    from einflow import sparse_inputs
    from einflow.engine import segments

    rng = np.random.default_rng(8)
    shape, rank = (6, 5, 4), 3
    dense = rng.normal(size=shape) * (rng.random(shape) < 0.4)
    X = sparse.COO.from_numpy(dense)
    A, B, C = (rng.normal(size=(n, rank)) for n in shape)
    first = sparse_inputs.converted_input("X", X)
    assert sparse_inputs.converted_input("X", X).coords[1] is first.coords[1]  # not converted again
    assert not first.coords[0].flags.writeable
    W = sparse.COO(X.coords, np.ones(X.nnz), shape=shape)
    gradient = ef.grad("L = sum[i,j,k]((X[i,j,k] - W[i,j,k] A[i,r] B[j,r] C[k,r])^2)", wrt="B")
    mask = W.todense()

    def expected() -> np.ndarray:
        residual = X.todense() - mask * np.einsum("ir,jr,kr->ijk", A, B, C)
        return -2 * np.einsum("ijk,ir,kr->jr", mask * residual, A, C)

    for _ in range(2):
        np.testing.assert_allclose(gradient(X=X, W=W, A=A, B=B, C=C), expected(), atol=1e-12)
    rows = sparse_inputs.converted_input("W", W).coords[1]  # (the group's coordinates are W's, read first)
    assert any(entry[0]() is rows for entry in segments._SEGMENTS.values())  # sorted once, kept on them
    X.data *= 2  # values changed in place are read again
    np.testing.assert_allclose(gradient(X=X, W=W, A=A, B=B, C=C), expected(), atol=1e-12)


def test_segment_sums_in_chunks_match_bincount(monkeypatch: pytest.MonkeyPatch) -> None:
    from einflow.engine import segments

    rng = np.random.default_rng(9)
    positions = rng.integers(0, 50, 1000)
    positions[positions == 7] = 8  # an empty segment
    positions.setflags(write=False)
    value = rng.normal(size=(3, 1000))
    expected = np.stack([np.bincount(positions, weights=row, minlength=50) for row in value], axis=1)
    for chunk in (1, 7, 64, 1 << 20):
        monkeypatch.setattr(segments, "CHUNK", chunk)
        np.testing.assert_allclose(segments.segment_sum(value, positions, 1, 0, (1, 0), (50, 3)), expected,
                                   atol=1e-12)
    assert segments.cacheable(positions) and not segments.cacheable(np.arange(3))


def test_declaration_of_a_tensor_only_dead_statements_read() -> None:
    # (seed 110 of the sparse differential test: the rewrite drops G, and with it the only read of A)
    dense = _matrix()
    program = ef.compile("symmetric A\nG[i] = inv[a,b](A[a,b]) S[i,b]\ny[i] = S[i,j] x[j]\ny[i]")
    x, A = np.arange(5.0), np.eye(5) * 2
    np.testing.assert_allclose(program(A=A, S=sp.csr_array(dense), x=x), dense @ x, atol=1e-13)


def test_inverse_read_at_gathered_positions_stays_a_statement() -> None:
    # (seed 586: an intermediate holding inv, read by a gather as well as by a product, was inlined into the
    # product as a solve and its statement dropped, while the gather still read it)
    rng = np.random.default_rng(12)
    A = rng.normal(size=(4, 4)) + 4 * np.eye(4)
    X, ix = rng.normal(size=(4, 2)), np.array([3, 0, 0, 2, 1])
    program = ef.compile("t[m,p] = inv[m,p](A[m,p])\ng[z,a] = t[ix[z], a]\nh[m,q] = T[m,p] t[p,n] X[n,q]\ng, h")
    T = rng.normal(size=(4, 4))
    g, h = program(A=A, ix=ix, X=X, T=T)
    inverse = np.linalg.inv(A)
    np.testing.assert_allclose(g, inverse[ix], atol=1e-12)
    np.testing.assert_allclose(h, T @ inverse @ X, atol=1e-12)


def test_contraction_order_knows_nnz() -> None:
    # S B C: with many entries per row, B C is contracted first (n k f) and gathered once (nnz f); with few, each
    # entry gathers a row of B (nnz k f): the order that costs less for this nnz (einflow.engine.sparse_order)
    rng = np.random.default_rng(13)
    n, k, f = 300, 40, 20
    B, C = rng.normal(size=(n, k)), rng.normal(size=(k, f))
    program = ef.compile("y[i,f] = S[i,j] B[j,k] C[k,f]")
    for density in (0.05, 0.0005):
        S = sp.random_array((n, n), density=density, random_state=1, format="csr")
        np.testing.assert_allclose(program(S=S, B=B, C=C), S.toarray() @ B @ C, atol=1e-10)
        report = program.plan(S=S, B=B, C=C)
        gathered = 2 * S.nnz * k * f  # every entry times a row of B, times C
        first = report.steps[0]
        if density == 0.05:  # 15 entries a row: B C first
            assert first.kind == "contract" and "[j,k] [k,f] -> [j,f]" in first.equation, report
            assert report.flops < gathered / 3
        else:  # 0.15 entries a row: B gathered at the entries first
            assert first.kind == "window" and "B[" in first.equation, report
            assert report.flops < 2 * n * k * f  # below the dense product B C alone
    # a program of dense factors only is planned as before, by opt_einsum
    dense = ef.compile("y[i,f] = A[i,j] B[j,k] C[k,f]").plan(A=np.ones((n, n)), B=B, C=C)
    assert dense.steps[0].kind == "contract"


def test_plan_flops_scale_with_nnz_in_the_grouped_order() -> None:
    # the grouped order's cost beyond the dense contraction is the entries': 10x nnz, about 10x its FLOPs
    rng = np.random.default_rng(14)
    n, k, f = 400, 30, 16
    program = ef.compile("y[i,f] = S[i,j] B[j,k] C[k,f]")
    B, C = rng.normal(size=(n, k)), rng.normal(size=(k, f))
    flops = []
    for density in (0.01, 0.1):
        S = sp.random_array((n, n), density=density, random_state=2, format="csr")
        report = program.plan(S=S, B=B, C=C)
        assert report.steps[0].kind == "contract"
        flops.append(report.flops - report.steps[0].flops)
    assert 8 < flops[1] / flops[0] < 12
