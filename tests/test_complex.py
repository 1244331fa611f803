"""Complex numbers (LANGUAGE.md 9.2): conj/real/imag/abs2/angle, PyTorch's gradient convention for every
derivative kind, holomorphic Jacobians, Wirtinger Hessians, Hermitian matrices; references are torch autograd
(complex128), jax on the realified function, and closed forms."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(35)


def _complex(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape) + 1j * RNG.normal(size=shape)


X = _complex(3)
W = _complex(3, 3)
V = _complex(3)

# (program, the same function in torch); every one has a real value
PROGRAMS = {
    "f = sum[i](abs2(x[i]))": lambda x, W: (x.abs() ** 2).sum(),
    "f = sum[i](abs(x[i]))": lambda x, W: x.abs().sum(),
    "f = sum[i](real(x[i]))": lambda x, W: x.real.sum(),
    "f = sum[i](imag(x[i]))": lambda x, W: x.imag.sum(),
    "f = sum[i](angle(x[i]))": lambda x, W: x.angle().sum(),
    "f = real(sum[i](conj(x[i]) W[i,j] x[j]))": lambda x, W: (x.conj() @ W @ x).real,
    "f = imag(sum[i](exp(x[i]) sin(x[i])))": lambda x, W: (x.exp() * x.sin()).sum().imag,
    "f = sum[i](abs2(tanh(W[i,j] x[j])))": lambda x, W: ((W @ x).tanh().abs() ** 2).sum(),
    "f = real(sum[i](conj(x[i]) W[i,j] x[j])) / sum[k](abs2(x[k]))":
        lambda x, W: (x.conj() @ W @ x).real / (x.abs() ** 2).sum(),
    "f = sum[i](real(x[i] conj(W[i,i])) imag(x[i]))": lambda x, W: ((x * W.diagonal().conj()).real * x.imag).sum(),
    "y[i] = abs2(x[i])\nf = sum[i](y[i] y[i])": lambda x, W: ((x.abs() ** 2) ** 2).sum(),
    "f = sum[i](log(abs(x[i] + 3)))": lambda x, W: (x + 3).abs().log().sum(),
    "f = log(sum[i](abs2(exp(W[i,j] x[j]) / (1 + abs2(x[i])))))":
        lambda x, W: (((W @ x).exp() / (1 + x.abs() ** 2)).abs() ** 2).sum().log(),
}


def _arrays(program: ef.Program, **arrays: np.ndarray) -> dict[str, np.ndarray]:
    return {name: value for name, value in arrays.items() if name in program.inputs or name in ("v", "G")}


def _torch_gradients(text: str) -> dict[str, np.ndarray]:
    x = torch.tensor(X, requires_grad=True)
    w = torch.tensor(W, requires_grad=True)
    PROGRAMS[text](x, w).backward()
    return {name: t.grad.resolve_conj().numpy() for name, t in (("x", x), ("W", w)) if t.grad is not None}


# ---------------------------------------------------------------- the issue's reproducers
def test_grad_of_sum_abs_of_square_is_torchs_at_the_issue_point() -> None:
    x = np.array([1 + 2j, 3 - 1j])
    got = ef.grad("f = sum[i](abs(x[i]^2))", wrt="x")(x=x)
    np.testing.assert_allclose(got, [2 + 4j, 6 - 2j], rtol=1e-15)  # the issue: torch's; einflow gave -4.4-0.8j, ...


def test_grad_of_squared_norm_of_w_x_is_2_wh_w_x() -> None:
    x = np.array([1 + 2j, 3 - 1j])
    w = np.array([[1 + 1j, 2], [0.5j, 1 - 1j]])
    got = ef.grad("f = sum[i](abs(W[i,j] x[j])^2)", wrt="x")(W=w, x=x)
    np.testing.assert_allclose(got, 2 * w.conj().T @ w @ x, rtol=1e-14)


# ---------------------------------------------------------------- every derivative kind, one convention
@pytest.mark.parametrize("text", sorted(PROGRAMS))
def test_grad_and_value_and_grad_match_torch_autograd(text: str) -> None:
    program = ef.compile(text)
    want = _torch_gradients(text)
    for name in program.inputs:
        got = ef.grad(program, wrt=name)(**_arrays(program, x=X, W=W))
        np.testing.assert_allclose(got, want[name], rtol=1e-10, atol=1e-12)
    value, gradient = ef.value_and_grad(program, wrt="x")(**_arrays(program, x=X, W=W))
    np.testing.assert_allclose(gradient, want["x"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("text", ["y[i] = W[i,j] x[j]", "y[i] = exp(W[i,j] x[j]) conj(x[i])",
                                  "y[i] = abs2(x[i]) + imag(W[i,j] x[j])", "y[i] = conj(W[i,j]) tanh(x[j])"])
def test_vjp_is_torchs_backward_with_a_complex_cotangent(text: str) -> None:
    G = _complex(3)
    x = torch.tensor(X, requires_grad=True)
    w = torch.tensor(W)
    value = ef.compile(text)(x=x, W=w)  # einflow inside torch autograd: its own value
    reference = {
        "y[i] = W[i,j] x[j]": lambda: w @ x,
        "y[i] = exp(W[i,j] x[j]) conj(x[i])": lambda: (w @ x).exp() * x.conj(),
        "y[i] = abs2(x[i]) + imag(W[i,j] x[j])": lambda: x.abs() ** 2 + (w @ x).imag,
        "y[i] = conj(W[i,j]) tanh(x[j])": lambda: w.conj() @ x.tanh(),
    }[text]()
    reference.backward(torch.tensor(G) if reference.is_complex() else torch.tensor(G.real))
    got = ef.vjp(text, wrt="x", cotangent="G")(x=X, W=W, G=G if value.is_complex() else G.real)
    np.testing.assert_allclose(got, x.grad.resolve_conj().numpy(), rtol=1e-10, atol=1e-12)


# the same functions in jax.numpy (the references are jax's own derivatives of the realified function)
JAX_PROGRAMS = {
    "f = real(sum[i](conj(x[i]) W[i,j] x[j])) / sum[k](abs2(x[k]))":
        lambda x, W, m: m.real(m.conj(x) @ W @ x) / (m.abs(x) ** 2).sum(),
    "f = sum[i](abs2(tanh(W[i,j] x[j])))": lambda x, W, m: (m.abs(m.tanh(W @ x)) ** 2).sum(),
    "f = sum[i](angle(x[i]))": lambda x, W, m: m.angle(x).sum(),
    "f = sum[i](real(x[i] conj(W[i,i])) imag(x[i]))":
        lambda x, W, m: (m.real(x * m.conj(m.diagonal(W))) * m.imag(x)).sum(),
}


@pytest.mark.parametrize("text", sorted(JAX_PROGRAMS))
def test_jvp_and_hvp_match_jax_on_the_realified_function(text: str) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)

    def f(re, im):
        return JAX_PROGRAMS[text](re + 1j * im, jax.numpy.asarray(W), jax.numpy)

    program = ef.compile(text)
    _, tangent = jax.jvp(f, (X.real, X.imag), (V.real, V.imag))
    np.testing.assert_allclose(ef.jvp(program, wrt="x", tangent="v")(**_arrays(program, x=X, W=W), v=V), tangent,
                               rtol=1e-9, atol=1e-12)

    def gradient(re, im):  # dL/dRe + i dL/dIm: PyTorch's convention
        by_re, by_im = jax.grad(f, argnums=(0, 1))(re, im)
        return by_re + 1j * by_im

    _, second = jax.jvp(gradient, (X.real, X.imag), (V.real, V.imag))
    np.testing.assert_allclose(ef.hvp(program, wrt="x", tangent="v")(**_arrays(program, x=X, W=W), v=V), second,
                               rtol=1e-9, atol=1e-12)


def test_gradient_by_a_real_input_of_a_complex_program_is_real() -> None:
    x = X.real.copy()
    got = ef.grad("f = sum[i](abs2(W[i,j] x[j]))", wrt="x")(W=W, x=x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, 2 * (W.conj().T @ W @ x).real, rtol=1e-12)


# ---------------------------------------------------------------- printed derivative programs
def test_derivative_programs_print_conj_and_reparse() -> None:
    for derived in (ef.grad("f = sum[i](abs(W[i,j] x[j])^2)", wrt="x"),
                    ef.vjp("y[i] = W[i,j] x[j]", wrt="x", cotangent="G"),
                    ef.hvp("f = real(sum[i](conj(x[i]) W[i,j] x[j]))", wrt="x", tangent="v")):
        text = str(derived)
        assert "conj(" in text
        again = ef.compile(text)
        assert again == ef.compile(str(again))
        arrays = {"x": X, "W": W, "G": V, "v": V}
        np.testing.assert_allclose(again(**{k: arrays[k] for k in again.inputs}),
                                   derived(**{k: arrays[k] for k in derived.inputs}), rtol=1e-14)


def test_grad_of_a_holomorphic_real_program_prints_no_conj() -> None:
    assert "conj" not in str(ef.grad("f = sum[i](x[i] tanh(A[i,j] x[j]))", wrt="x"))


# ---------------------------------------------------------------- holomorphic Jacobians
@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_jacobian_of_a_holomorphic_program_is_the_complex_derivative(mode: str) -> None:
    got = ef.jacobian("y[i] = exp(W[i,j] x[j]) + x[i]^2", wrt="x", mode=mode)(W=W, x=X)
    want = np.exp(W @ X)[:, None] * W + np.diag(2 * X)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize(("text", "function"), [("y[i] = abs(x[i]) x[i]", "abs"), ("y[i] = conj(W[i,j] x[j])", "conj"),
                                                ("y[i] = real(x[i]) + 1", "real")])
def test_jacobian_of_a_non_holomorphic_program_names_the_function(text: str, function: str) -> None:
    jacobian = ef.jacobian(text, wrt="x")
    with pytest.raises(ef.DerivativeError, match=f"'{function}'.*jvp"):
        jacobian(**_arrays(jacobian, x=X, W=W))
    real = jacobian(**_arrays(jacobian, x=X.real.copy(), W=W.real.copy()))  # real inputs: as before
    assert real.dtype == np.float64


def test_hessian_diagonal_and_laplacians_of_a_holomorphic_program_read_the_complex_hessian() -> None:
    # f''(z)'s diagonal and trace (jax.hessian with holomorphic=True); a program that is not holomorphic has no
    # f''(z): refused with complex arrays, as hessian is (hvp and the Wirtinger pair are the ways there)
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    text = "f = sum[i](exp(W[i,j] x[j]) x[i]^2)"
    w, x = jnp.asarray(W), jnp.asarray(X)
    want = jax.hessian(lambda x: jnp.sum(jnp.exp(w @ x) * x**2), holomorphic=True)(x)
    np.testing.assert_allclose(ef.hessian(text, wrt="x")(W=W, x=X), want, rtol=1e-12)
    np.testing.assert_allclose(ef.hessian_diagonal(text, wrt="x")(W=W, x=X), jnp.diag(want), rtol=1e-12)
    np.testing.assert_allclose(ef.laplacian(text, wrt="x")(W=W, x=X), jnp.trace(want), rtol=1e-12)
    for kind in ("hessian", "hessian_diagonal", "laplacian", "bilaplacian"):
        derivative = getattr(ef, kind)("f = sum[i](abs2(W[i,j] x[j]))", wrt="x")
        with pytest.raises(ef.DerivativeError, match=f"{kind}: .*'abs2'.*hvp"):
            derivative(W=W, x=X)
        assert np.isrealobj(derivative(W=W.real.copy(), x=X.real.copy()))  # real inputs: as before


# ---------------------------------------------------------------- Wirtinger Hessians
def test_wirtinger_hessian_of_a_hermitian_form_is_the_matrix() -> None:
    M = W + W.conj().T
    A, B = ef.hessian("f = real(sum[i](conj(z[i]) M[i,j] z[j]))", wrt="z", wirtinger=True)(z=X, M=M)
    np.testing.assert_allclose(A, M, rtol=1e-14)
    np.testing.assert_allclose(B, 0, atol=1e-14)


@pytest.mark.parametrize("text", ["f = sum[i](abs2(tanh(W[i,j] x[j])))", "f = real(sum[i](x[i] x[i] W[i,i]))"])
def test_wirtinger_hessian_gives_the_hvp(text: str) -> None:
    program = ef.compile(text)
    A, B = ef.hessian(program, wrt="x", wirtinger=True)(x=X, W=W)
    hvp = ef.hvp(program, wrt="x", tangent="v")(x=X, W=W, v=V)
    np.testing.assert_allclose(2 * (A @ V + B @ V.conj()), hvp, rtol=1e-12)


@pytest.mark.parametrize("text", ["f = sum[i](abs(x[i]))", "f = sum[i](sqrt(abs2(x[i])))"])
def test_hvp_through_abs_of_complex_numbers_is_the_derivative_of_z_over_its_modulus(text: str) -> None:
    got = ef.hvp(text, wrt="x", tangent="v")(x=X, v=V)
    r = np.abs(X)  # d/dt (z + t v)/|z + t v| at t = 0
    np.testing.assert_allclose(got, V / r - X * np.real(np.conj(X) * V) / r**3, rtol=1e-12)


ABS_PROGRAMS = {  # second derivatives through abs (and sign) of complex numbers, against jax
    "f = sum[i](abs(W[i,j] x[j]))": lambda x, W, m: m.abs(W @ x).sum(),
    "f = sum[i](abs(x[i])^3 + abs(x[i] + 2) real(x[i]))": lambda x, W, m: (m.abs(x) ** 3 + m.abs(x + 2) * x.real).sum(),
    # sign(z) = z/|z| (jax.numpy.sign of complex numbers has a zero derivative; torch.sgn's is this one)
    "f = real(sum[i](sign(x[i]) W[i,j] conj(x[j])))": lambda x, W, m: ((x / m.abs(x)) @ W @ m.conj(x)).real,
    "f = log(1 + sum[i](abs(tanh(W[i,j] x[j]))))": lambda x, W, m: m.log(1 + m.abs(m.tanh(W @ x)).sum()),
}


@pytest.mark.parametrize("text", sorted(ABS_PROGRAMS))
def test_hvp_and_wirtinger_hessian_through_abs_match_jax(text: str) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)

    def f(re, im):
        return ABS_PROGRAMS[text](re + 1j * im, jax.numpy.asarray(W), jax.numpy)

    def gradient(re, im):  # dL/dRe + i dL/dIm: PyTorch's convention
        by_re, by_im = jax.grad(f, argnums=(0, 1))(re, im)
        return by_re + 1j * by_im

    program = ef.compile(text)
    _, second = jax.jvp(gradient, (X.real, X.imag), (V.real, V.imag))
    hvp = ef.hvp(program, wrt="x", tangent="v")(**_arrays(program, x=X, W=W), v=V)
    np.testing.assert_allclose(hvp, second, rtol=1e-9, atol=1e-12)
    A, B = ef.hessian(program, wrt="x", wirtinger=True)(**_arrays(program, x=X, W=W))
    np.testing.assert_allclose(2 * (A @ V + B @ V.conj()), second, rtol=1e-9, atol=1e-12)
    # real arrays: sign is locally constant, the real Hessian as before (jax on the real function)
    real = X.real.copy()
    want = jax.jvp(jax.grad(lambda x: ABS_PROGRAMS[text](x, jax.numpy.asarray(W.real), jax.numpy)), (real,),
                   (V.real,))[1]
    got = ef.hvp(program, wrt="x", tangent="v")(**_arrays(program, x=real, W=W.real.copy()), v=V.real.copy())
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- inside the frameworks
def test_inside_torch_autograd_and_jax_grad_each_frameworks_convention() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    text = "f = sum[i](abs(W[i,j] x[j])^2)"
    program = ef.compile(text)
    x = torch.tensor(X, requires_grad=True)
    program(W=torch.tensor(W), x=x).backward()
    want = 2 * W.conj().T @ W @ X
    np.testing.assert_allclose(x.grad.resolve_conj().numpy(), want, rtol=1e-12)
    by_jax = jax.grad(lambda z: program(W=jax.numpy.asarray(W), x=z))(jax.numpy.asarray(X))
    np.testing.assert_allclose(np.asarray(by_jax), want.conj(), rtol=1e-12)  # jax.grad: the conjugate


# ---------------------------------------------------------------- functions, literals, matrices
@pytest.mark.parametrize(("name", "reference"), [("conj", np.conj), ("real", np.real), ("imag", np.imag),
                                                 ("abs2", lambda z: np.abs(z) ** 2), ("angle", np.angle),
                                                 ("abs", np.abs)])
def test_complex_functions_on_numpy_torch_and_jax(name: str, reference) -> None:
    program = ef.compile(f"y[i] = {name}(x[i])")
    np.testing.assert_allclose(program(x=X), reference(X), rtol=1e-15)
    np.testing.assert_allclose(program(x=torch.tensor(X)).numpy(), reference(X), rtol=1e-15)
    np.testing.assert_allclose(program(x=X.real.copy()), reference(X.real), rtol=1e-15)
    np.testing.assert_allclose(program(x=torch.tensor(X.real)).numpy(), reference(X.real), rtol=1e-15)
    for target in ("numpy", "torch"):
        namespace: dict = {}
        exec(program.to_source(target=target), namespace)  # noqa: S102 - our own generated code
        module = torch.tensor if target == "torch" else np.asarray
        np.testing.assert_allclose(np.asarray(namespace["f"](x=module(X))), reference(X), rtol=1e-15)


def test_imaginary_literals_parse_print_and_compute() -> None:
    program = ef.compile("y[i] = 2j x[i] - 0.5j")
    assert ef.compile(str(program)) == program
    np.testing.assert_allclose(program(x=np.array([1.0, 2.0])), [1.5j, 3.5j])
    assert program(x=np.array([1.0], dtype=np.float32)).dtype == np.complex64  # weak, as Python's 2j
    with pytest.raises(ef.ParseError, match="exponent"):
        ef.compile("y[i] = x[i]^2j")


def _hermitian_positive() -> np.ndarray:
    return W @ W.conj().T + np.eye(3)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax", "dask"])
def test_logdet_of_a_complex_matrix_is_real_on_every_backend(backend: str) -> None:
    H = _hermitian_positive()
    want = np.linalg.slogdet(H)[1]
    for text in ("f = logdet[i,j](A[i,j])", "spd A\nf = logdet[i,j](A[i,j])", "hermitian A\nf = logdet[i,j](A[i,j])"):
        value = ef.evaluate(text, A=H, backend=backend)
        value = np.asarray(value.compute() if hasattr(value, "compute") else value)
        assert value.dtype.kind == "f", (text, value.dtype)
        np.testing.assert_allclose(value, want, rtol=1e-5 if backend == "jax" else 1e-12)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_complex_spd_is_hermitian_positive_definite_solved_by_cholesky(backend: str) -> None:
    H = _hermitian_positive()
    y = np.ones(3)
    got = ef.evaluate("spd A\nf = sum[i,j](y[i] inv[i,j](A[i,j]) y[j])", A=H, y=y, backend=backend)
    np.testing.assert_allclose(complex(got), y @ np.linalg.inv(H) @ y, rtol=1e-12)
    with pytest.raises(ef.EinflowError, match="'A'.*Hermitian"):
        ef.evaluate("hermitian A\nf = logdet[i,j](A[i,j])", A=W, backend=backend)
    with pytest.raises(ef.EinflowError, match="'A'.*Hermitian"):
        ef.evaluate("spd A\nf = logdet[i,j](A[i,j])", A=W @ W.T + np.eye(3), backend=backend)  # symmetric only


def test_jacobians_through_logdet_or_a_hermitian_matrix_of_complex_arrays_are_refused() -> None:
    # log|det| is not holomorphic, nor is a function of a Hermitian matrix: no complex derivative f'(z)
    with pytest.raises(ef.DerivativeError, match="logdet.*grad"):
        ef.jacobian("y[i] = x[i] logdet[a,b](A[a,b])", wrt="A")(A=_hermitian_positive(), x=X)
    with pytest.raises(ef.DerivativeError, match="'A'.*Hermitian"):
        ef.jacobian("hermitian A\ny[k] = x[k] A[i,j] x[i] x[j]", wrt="A")(A=_hermitian_positive(), x=X)
    real = ef.jacobian("y[i] = x[i] logdet[a,b](A[a,b])", wrt="A")(A=np.eye(3) * 2, x=np.ones(3))
    np.testing.assert_allclose(real, np.ones(3)[:, None, None] * np.eye(3) / 2)


def test_grad_of_abs_plus_relu_of_a_real_input_is_sign_plus_step() -> None:
    # a real-only function (relu, max) beside a non-holomorphic one: both Wirtinger parts, not 2 A real(h)
    g = ef.grad("f = sum[i](abs(x[i]) + relu(x[i]))", wrt="x")
    assert str(g).splitlines()[-1] == "df_dx[p] = sign(x[p]) + step(x[p])"
    x = np.array([-1.0, 0.5, 2.0])
    g = ef.grad("f = sum[i](abs(x[i]) max[j](x[j]))", wrt="x")(x=x)
    np.testing.assert_allclose(g, 2 * np.sign(x) + np.array([0, 0, 1]) * np.abs(x).sum())
