"""Regression tests for derivatives of shifted reads in several dimensions and the refusals around them.

Each test is named after its reproducer; the references are JAX in float64, closed forms or torch.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import einflow as ef

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
RNG = np.random.default_rng(32)


def test_grad_of_U_a_b1_minus_U_a1_b1_is_minus_one_on_the_last_row() -> None:
    U = np.arange(9.0).reshape(3, 3) / 10
    got = ef.grad("L = sum[a,b](U[a,b+1] - U[a+1,b+1])", wrt="U")(U=U)
    np.testing.assert_array_equal(got, [[0, 1, 1], [0, 0, 0], [0, -1, -1]])


def test_hessian_of_the_five_point_laplacian_energy() -> None:
    text = "L = 0.5 * sum[a,b]((U[a,b+1] + U[a+2,b+1] + U[a+1,b] + U[a+1,b+2] - 4 U[a+1,b+1])^2)"
    U = RNG.normal(size=(5, 6))

    def energy(u):  # type: ignore[no-untyped-def]
        return 0.5 * jnp.sum((u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]) ** 2)

    np.testing.assert_allclose(ef.hessian(text, wrt="U")(U=U), jax.hessian(energy)(jnp.asarray(U)), atol=1e-12)
    np.testing.assert_allclose(ef.grad(text, wrt="U")(U=U), jax.grad(energy)(jnp.asarray(U)), atol=1e-12)


def test_grad_of_isotropic_total_variation() -> None:
    text = "L = sum[a,b](sqrt((U[a+1,b] - U[a,b])^2 + (U[a,b+1] - U[a,b])^2 + 0.01))"
    U = RNG.normal(size=(4, 5))

    def tv(u):  # type: ignore[no-untyped-def]
        return jnp.sum(jnp.sqrt((u[1:, :-1] - u[:-1, :-1]) ** 2 + (u[:-1, 1:] - u[:-1, :-1]) ** 2 + 0.01))

    np.testing.assert_allclose(ef.grad(text, wrt="U")(U=U), jax.grad(tv)(jnp.asarray(U)), atol=1e-12)


def test_window_index_summed_by_the_target_h_p_x_v1_p_keeps_every_row() -> None:
    x = RNG.normal(size=(4, 3))
    got = ef.grad("h[p] = x[v+1,p] - x[v,p]\nL = sum[p](h[p]^2)", wrt="x")(x=x)
    want = jax.grad(lambda x: jnp.sum(jnp.sum(x[1:] - x[:-1], 0) ** 2))(jnp.asarray(x))
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_jvp_of_h_c_M_c1_c_has_the_value_shape() -> None:
    M, V = RNG.normal(size=(6, 5)), RNG.normal(size=(6, 5))
    got = ef.jvp("h[c] = M[c+1,c]", wrt="M", tangent="V")(M=M, V=V)
    np.testing.assert_allclose(got, V[np.arange(1, 6), np.arange(5)])


def test_gradient_of_a_mean_over_gathered_rows_and_its_source() -> None:
    E, tok = RNG.normal(size=(3, 2)), np.array([[0, 1], [0, 2]])
    gradient = ef.grad("L = sum[b,d](mean[s](E[tok[b,s], d])^2)", wrt="E")
    want = jax.grad(lambda E: jnp.sum(jnp.mean(E[tok], axis=1) ** 2))(jnp.asarray(E))
    np.testing.assert_allclose(gradient(E=E, tok=tok), want, atol=1e-12)
    namespace: dict = {}
    exec(gradient.to_source("f"), namespace)
    np.testing.assert_allclose(namespace["f"](E=E, tok=tok), want, atol=1e-12)


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
def test_tanh_of_a_window_before_its_contraction(target: str) -> None:
    x, k = RNG.normal(size=7), RNG.normal(size=3)
    gradient = ef.grad("L = sum[n,j](tanh(x[n + j]) k[j])", wrt="x")
    want = jax.grad(lambda x: jnp.sum(jnp.tanh(jnp.stack([x[j:j + 5] for j in range(3)], 1)) * k))(jnp.asarray(x))
    np.testing.assert_allclose(gradient(x=x, k=k), want, atol=1e-12)
    namespace: dict = {}
    exec(gradient.to_source("f", target=target), namespace)
    if target == "torch":
        import torch

        got = namespace["f"](x=torch.as_tensor(x), k=torch.as_tensor(k)).numpy()
    else:
        got = np.asarray(namespace["f"](x=x, k=k))
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_weighted_1d_stencil_by_its_weights() -> None:
    v, w = RNG.normal(size=6), RNG.normal(size=4)
    text = "L = sum[e](w[e] (v[e] - 2 v[e + 1] + v[e + 2]))"
    np.testing.assert_allclose(ef.grad(text, wrt="w")(v=v, w=w), v[:4] - 2 * v[1:5] + v[2:], atol=1e-12)
    np.testing.assert_allclose(ef.grad(text, wrt="v")(v=v, w=w),
                               jax.grad(lambda v: jnp.sum(w * (v[:4] - 2 * v[1:5] + v[2:])))(jnp.asarray(v)))


def test_a_zero_hvp_accepts_the_tangent_it_names() -> None:
    x, c = RNG.normal(size=3), RNG.normal(size=3)
    np.testing.assert_array_equal(ef.hvp("L = x[i] c[i]", wrt="x", tangent="V")(x=x, c=c, V=x), np.zeros(3))
    # a jvp and a vjp by an input the value does not depend on take their tangent and cotangent too
    assert ef.jvp("L = sum[i](sign(x[i])) + c[0]", wrt="x", tangent="V")(x=x, c=c, V=x) == 0
    np.testing.assert_array_equal(ef.vjp("L = sum[i](sign(x[i]))", wrt="x", cotangent="G")(x=x, G=2.0),
                                  np.zeros(3))


def test_plain_reads_of_different_lengths_beside_a_shifted_read_meet_in_their_intersection() -> None:
    s, w = RNG.normal(size=5), RNG.normal(size=4)
    np.testing.assert_allclose(ef.evaluate("y[i] = s[i+1] - s[i] + w[i]", s=s, w=w), s[1:] - s[:-1] + w)
    gradient = ef.grad("L = sum[i](s[i+1] - s[i] + w[i])", wrt="s")(s=s, w=w)
    np.testing.assert_array_equal(gradient, [-1, 0, 0, 0, 1])
    # two plain reads of different lengths with no shifted read of the index stay an error
    with pytest.raises(ef.ShapeError, match="index 'i'"):
        ef.evaluate("y[i] = s[i] + w[i]", s=s, w=w)


@pytest.mark.parametrize("declaration", ["spd A", "symmetric A", "size m, n = A"])
def test_a_program_may_end_with_a_declaration(declaration: str) -> None:
    A = np.array([[2.0, 0.5], [0.5, 1.0]])
    text = f"L = sum[i,j](A[i,j] A[i,j])\n{declaration}"
    assert ef.evaluate(text, A=A) == pytest.approx(np.sum(A * A))
    want = 2 * A
    np.testing.assert_allclose(ef.grad(text, wrt="A")(A=A), want)
    if declaration != "size m, n = A":
        with pytest.raises(ef.EinflowError, match="symmetric"):
            ef.evaluate(text, A=np.array([[1.0, 2.0], [0.0, 1.0]]))


def test_helper_names_never_collide_with_a_gather_tensor_named_t1() -> None:
    M, t1 = RNG.normal(size=(3, 4)), np.array([0, 2, 3])
    gradient = ef.grad("L = sum[w,n](tanh(M[w,t1[n]]))", wrt="M")
    want = jax.grad(lambda M: jnp.sum(jnp.tanh(M[:, t1])))(jnp.asarray(M))
    np.testing.assert_allclose(gradient(M=M, t1=t1), want, atol=1e-12)
    assert ef.compile(str(gradient)).source == gradient.source  # re-parsable as printed


# seed 1727 of tests/test_differential.py: the implicit ``S = ...`` has the axes of the gathered read (m, c);
# its disguise ``W[q1,c] _shift1[q1,m]`` alone has them as (c, m), and df_dW read df_dS[a,m] for df_dS[m,a]
_REPRODUCER = "f = S[i,t2] S[p,m] R[p,i,t2] * w[m]"
_GATHERED_S_CASES = {
    # name: (S's statement, f's statement, W's shape, ix1's length, S from W and ix1 in JAX)
    "reproducer_square": ("S = (-(1 W[ix1[m],c]))**2", _REPRODUCER, (4, 3), 3, lambda W, ix: (-W[ix]) ** 2),
    "reproducer": ("S = (-(1 W[ix1[m],c]))**2", _REPRODUCER, (4, 3), 5, lambda W, ix: (-W[ix]) ** 2),
    "gather_on_the_second_axis": ("S = (-(1 W[c,ix1[m]]))**2", _REPRODUCER, (3, 4), 5,
                                  lambda W, ix: (-W[:, ix]) ** 2),
    "explicit_transposed_target": ("S[c,m] = (-W[ix1[m],c])**2", _REPRODUCER, (4, 3), 5,
                                   lambda W, ix: ((-W[ix]) ** 2).T),
    "gather_between_two_axes": ("S = W[d,ix1[m],c]^2", "f = S[i,t2,k] S[p,m,k] R[p,i,t2] * w[m]", (2, 4, 3), 5,
                                lambda W, ix: W[:, ix] ** 2),
    "product_beside_the_read": ("S = V[k] W[ix1[m],c]", "f = S[i,t2,k] S[p,m,k] R[p,i,t2] * w[m]", (4, 3), 5,
                                lambda W, ix: jnp.einsum("k,mc->kmc", jnp.asarray(_V), W[ix])),
    "shifted_read": ("S = (-(1 W[m+1,c]))**2", _REPRODUCER, (6, 3), 0, lambda W, ix: (-W[1:]) ** 2),
}
_V = RNG.normal(size=2)


@pytest.mark.parametrize("case", list(_GATHERED_S_CASES))
def test_grad_of_S_minus_W_ix1_m_c_squared_keeps_S_axes(case: str) -> None:
    first, second, shape, length, build = _GATHERED_S_CASES[case]
    W, ix1 = RNG.normal(size=shape), np.arange(length) * 3 % 4
    S = np.asarray(build(jnp.asarray(W), ix1))
    subscripts = "it,pm,pit,m->" if S.ndim == 2 else "itk,pmk,pit,m->"
    R, w = RNG.normal(size=(S.shape[0], S.shape[0], S.shape[1])), RNG.normal(size=S.shape[-1 if S.ndim == 2 else 1])
    inputs = {"W": W, "R": R, "w": w, **({"ix1": ix1} if length else {}), **({"V": _V} if "V[" in first else {})}
    program = f"{first}\n{second}"
    np.testing.assert_allclose(ef.evaluate(program, **inputs), np.einsum(subscripts, S, S, R, w), atol=1e-12)

    def f(W, R, w):  # type: ignore[no-untyped-def]
        S = build(W, ix1)
        return jnp.einsum(subscripts, S, S, R, w)

    want = jax.grad(f, argnums=(0, 1, 2))(jnp.asarray(W), jnp.asarray(R), jnp.asarray(w))
    got = ef.grad(program, wrt=["R", "w", "W"])(**inputs)
    for mine, theirs in zip(got, (want[1], want[2], want[0])):
        np.testing.assert_allclose(mine, theirs, atol=1e-12)


@pytest.mark.parametrize("target", ["", "y = "])
def test_jacobian_and_jvp_of_W_ix1_m_c_W_ix1_n_d_keep_the_value_axes(target: str) -> None:
    W, T, ix1 = RNG.normal(size=(4, 3)), RNG.normal(size=(4, 3)), np.array([2, 0, 3, 2, 1])
    text = f"{target}W[ix1[m],c] W[ix1[n],d]^2"  # value axes m, c, n, d; disguised they would be c, m, d, n

    def value(W):  # type: ignore[no-untyped-def]
        return jnp.einsum("mc,nd->mcnd", W[ix1], W[ix1] ** 2)

    np.testing.assert_allclose(ef.jacobian(text, wrt="W")(W=W, ix1=ix1), jax.jacobian(value)(jnp.asarray(W)),
                               atol=1e-12)
    _, tangent = jax.jvp(value, (jnp.asarray(W),), (jnp.asarray(T),))
    np.testing.assert_allclose(ef.jvp(text, wrt="W", tangent="T")(W=W, ix1=ix1, T=T), tangent, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax", "dask"])
def test_python_float_scalars_in_the_gp_kernel(backend: str) -> None:
    X = np.eye(2)
    got = ef.evaluate("K[i,j] = s exp(X[i,j]) + t delta[i,j]", X=X, s=1.5, t=0.5, backend=backend)
    got = np.asarray(got.compute() if hasattr(got, "compute") else got)
    np.testing.assert_allclose(got, 1.5 * np.exp(X) + 0.5 * np.eye(2))
    gradients = ef.grad("L = sum[i,j](s exp(X[i,j]) + t delta[i,j] X[i,j])", wrt=["s", "t"])(X=X, s=1.5, t=0.5)
    np.testing.assert_allclose(gradients, [np.exp(X).sum(), np.trace(X)])


# ---------------------------------------------------------------- torch's native convolutions
_SWEEP = [(length, kernel, stride, dilation)
          for length, kernel, stride, dilation in itertools.product((3, 4, 5, 6, 7, 9), (1, 2, 3), (1, 2, 3), (1, 2))
          if (kernel - 1) * dilation + 1 <= length]


@pytest.mark.parametrize("length, kernel, stride, dilation", _SWEEP)
def test_torch_native_convolution_sweep(length: int, kernel: int, stride: int, dilation: int) -> None:
    torch = pytest.importorskip("torch")
    text = f"y[n,o,h] = x[n,c,{stride}*h + {dilation}*r] K[o,c,r]"
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-4)):
        x = torch.randn(2, 3, length, dtype=dtype, requires_grad=True)
        K = torch.randn(4, 3, kernel, dtype=dtype, requires_grad=True)
        got = ef.evaluate(text, x=x, K=K)
        want = torch.nn.functional.conv1d(x, K, stride=stride, dilation=dilation)
        assert got.dtype == dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
        cotangent = torch.randn_like(want)
        for mine, theirs in zip(torch.autograd.grad(got, (x, K), cotangent),
                                torch.autograd.grad(want, (x, K), cotangent)):
            torch.testing.assert_close(mine, theirs, atol=tolerance, rtol=tolerance)


def test_torch_conv2d_stride_2_on_6x6_and_its_gradient() -> None:
    torch = pytest.importorskip("torch")
    for dtype in (torch.float64, torch.float32):
        x = torch.randn(1, 3, 6, 6, dtype=dtype, requires_grad=True)
        K = torch.randn(4, 3, 3, 3, dtype=dtype, requires_grad=True)
        got = ef.evaluate("y[n,o,h,w] = x[n,c,2*h + r,2*w + q] K[o,c,r,q]", x=x, K=K)
        want = torch.nn.functional.conv2d(x, K, stride=2)
        torch.testing.assert_close(got, want)
        gradient = ef.grad("L = sum[n,o,h,w](x[n,c,2*h + r,2*w + q] K[o,c,r,q])", wrt="K")(x=x.detach(), K=K.detach())
        torch.testing.assert_close(gradient, torch.autograd.grad(want.sum(), K)[0])


# ---------------------------------------------------------------- dtypes
@pytest.mark.parametrize("backend", ["numpy", "torch", "jax", "dask"])
def test_derivatives_through_max_and_min_keep_float32(backend: str) -> None:
    x = np.array([1, 3, 2, 3], dtype=np.float32)
    got = ef.grad("L = max[i](x[i]) + min[i](x[i] x[i])", wrt="x")(x=x, backend=backend)
    assert str(got.dtype).endswith("float32")
    np.testing.assert_allclose(np.asarray(got), [2, 0.5, 0, 0.5])


def test_a_constant_derivative_has_the_dtype_of_its_input() -> None:
    torch = pytest.importorskip("torch")
    single = np.ones(3, np.float32)
    assert ef.grad("L = s + x[i] x[i]", wrt="s")(s=np.float32(1), x=single).dtype == np.float32
    assert ef.grad("L = 2 s + x[i] x[i]", wrt="s")(s=2.0, x=np.ones(3)).dtype == np.float64
    value, gradient = ef.value_and_grad("L = 2 s + x[i] x[i]", wrt="s")(s=np.float32(1), x=single)
    assert gradient.dtype == np.float32 and gradient == 2
    by_torch = ef.grad("L = s + x[i] x[i]", wrt=["s", "x"])(s=torch.tensor(1.0), x=torch.ones(3))
    assert by_torch[0].dtype == torch.float32 and float(by_torch[0]) == 1


def test_the_symmetry_check_of_a_float32_target_has_a_float32_tolerance() -> None:
    A = np.random.default_rng(3).normal(size=(60, 40)).astype(np.float32)
    text = "S[i,k] = A[i,j] A[k,j]\nsymmetric S\nL = sum[i,k](S[i,k])"
    for backend in ("numpy", "torch", "jax"):
        assert float(ef.evaluate(text, A=A, backend=backend)) == pytest.approx(float((A @ A.T).sum()), rel=1e-4)
    with pytest.raises(ef.EinflowError, match="not symmetric"):
        B = np.eye(4, dtype=np.float32)
        B[0, 1] = 1e-3  # far above float32 round-off
        ef.evaluate("L = sum[i,k](S[i,k])\nsymmetric S", S=B)
    torch = pytest.importorskip("torch")
    for text in ("L = sum[i,k](S[i,k])\nsymmetric S", "L = sum[i,k](S[i,k])\nspd S"):  # torch: MatrixError too
        with pytest.raises(ef.MatrixError, match="not symmetric"):
            ef.evaluate(text, S=torch.as_tensor(B))
