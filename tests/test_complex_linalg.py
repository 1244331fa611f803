"""Derivatives through inv and logdet of complex matrices and by declared Hermitian (spd/hermitian) matrices
(LANGUAGE.md 9.2). The gradient is PyTorch's, dL/dRe A + i dL/dIm A; references: torch autograd (complex128), jax
(its gradient conjugated) and central finite differences on the real and the imaginary parts separately. A
declared Hermitian matrix varies on the Hermitian matrices: its gradient is (G + G^H)/2 of the unconstrained G,
checked by finite differences along Hermitian directions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import einflow as ef

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

RNG = np.random.default_rng(3535)
N = 3


def _complex(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape) + 1j * RNG.normal(size=shape)


_W = _complex(N, N)
GENERAL = _complex(N, N) + 3 * np.eye(N)
HERMITIAN = _W @ _W.conj().T + np.eye(N)
Y = _complex(N)
T = _complex(N, N)

# (program, the same over an array module m, whether A is declared Hermitian); every value is real
Function = Callable[..., object]
PROGRAMS: dict[str, tuple[Function, bool]] = {
    "f = logdet[i,j](A[i,j])": (lambda A, y, m: m.linalg.slogdet(A)[1], False),
    "f = logdet[i,j](A[i,j]) + real(sum[i,j](conj(y[i]) inv[i,j](A[i,j]) y[j]))":
        (lambda A, y, m: m.linalg.slogdet(A)[1] + (m.conj(y) @ m.linalg.inv(A) @ y).real, False),
    "f = sum[i,j](abs2(inv[i,j](A[i,j])))": (lambda A, y, m: (m.abs(m.linalg.inv(A)) ** 2).sum(), False),
    "f = sum[i](abs2(inv[i,j](A[i,j]) y[j]))": (lambda A, y, m: (m.abs(m.linalg.inv(A) @ y) ** 2).sum(), False),
    "t[i,j] = A[i,k] conj(A[j,k]) + delta[i,j]\nf = logdet[i,j](t[i,j]) real(y[0])":
        (lambda A, y, m: m.linalg.slogdet(A @ m.conj(A).T + m.eye(N))[1] * y[0].real, False),
    "l = logdet[i,j](A[i,j])\nf = imag(y[0] exp(0.1j l)) + l^2": (
        lambda A, y, m: (y[0] * m.exp(0.1j * m.linalg.slogdet(A)[1])).imag + m.linalg.slogdet(A)[1] ** 2, False),
    "spd A\nf = logdet[i,j](A[i,j]) + real(sum[i,j](conj(y[i]) inv[i,j](A[i,j]) y[j]))":
        (lambda A, y, m: m.linalg.slogdet(A)[1] + (m.conj(y) @ m.linalg.inv(A) @ y).real, True),
    "hermitian A\nf = sum[i](abs2(inv[i,j](A[i,j]) y[j])) + logdet[i,j](A[i,j])":
        (lambda A, y, m: (m.abs(m.linalg.inv(A) @ y) ** 2).sum() + m.linalg.slogdet(A)[1], True),
    "spd A\nf = real(sum[i,j](y[i] inv[j,i](A[j,i]) conj(y[j]) A[i,j]))":
        (lambda A, y, m: (y[:, None] * m.linalg.inv(A).T * m.conj(y)[None, :] * A).sum().real, True),
}


def _matrix(text: str) -> np.ndarray:
    return HERMITIAN if PROGRAMS[text][1] else GENERAL


def _hermitian_part(G: np.ndarray) -> np.ndarray:
    return (G + G.conj().T) / 2


def _call(program: ef.Program, **arrays: np.ndarray) -> object:
    return program(**{k: v for k, v in arrays.items() if k in program.inputs or k == "T"})


def _value(program: ef.Program, A: np.ndarray) -> float:  # noqa: N803 - the programs' own names
    return float(np.real(_call(program, A=A, y=Y)))  # type: ignore[arg-type]


@pytest.mark.parametrize("text", sorted(PROGRAMS))
def test_grad_matches_torch_jax_and_finite_differences(text: str) -> None:
    function, hermitian = PROGRAMS[text]
    A = _matrix(text)
    project = _hermitian_part if hermitian else (lambda G: G)
    got = _call(ef.grad(text, wrt="A"), A=A, y=Y)
    a = torch.tensor(A, requires_grad=True)
    function(a, torch.tensor(Y), torch).backward()
    np.testing.assert_allclose(got, project(a.grad.resolve_conj().numpy()), rtol=1e-10, atol=1e-12)
    by_jax = np.asarray(jax.grad(lambda a: function(a, jnp.asarray(Y), jnp))(jnp.asarray(A)))
    np.testing.assert_allclose(got, project(by_jax.conj()), rtol=1e-10, atol=1e-12)
    value, gradient = ef.value_and_grad(text, wrt="A")(**{k: v for k, v in {"A": A, "y": Y}.items()
                                                         if k in ef.compile(text).inputs})
    np.testing.assert_allclose(gradient, got, rtol=1e-12, atol=1e-14)
    program, h = ef.compile(text), 1e-6
    if hermitian:  # along Hermitian directions D the derivative is Re(sum conj(grad) D)
        for _ in range(4):
            D = _complex(N, N)
            D = D + D.conj().T
            slope = (_value(program, A + h * D) - _value(program, A - h * D)) / (2 * h)
            assert abs(slope - np.real(np.sum(np.conj(got) * D))) < 1e-6
        return
    differences = np.zeros((N, N), dtype=complex)
    for i in range(N):
        for j in range(N):
            E = np.zeros((N, N))
            E[i, j] = h
            differences[i, j] = ((_value(program, A + E) - _value(program, A - E))
                                 + 1j * (_value(program, A + 1j * E) - _value(program, A - 1j * E))) / (2 * h)
    np.testing.assert_allclose(got, differences, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("text", sorted(PROGRAMS))
def test_jvp_and_hvp_match_jax_on_the_realified_function(text: str) -> None:
    function, hermitian = PROGRAMS[text]
    A = _matrix(text)
    tangent = _hermitian_part(T) if hermitian else T

    def realified(re: object, im: object) -> object:
        return function(re + 1j * im, jnp.asarray(Y), jnp)  # type: ignore[operator]

    def gradient(re: object, im: object) -> object:
        by_re, by_im = jax.grad(realified, argnums=(0, 1))(re, im)
        G = by_re + 1j * by_im
        return (G + G.conj().T) / 2 if hermitian else G

    point, direction = (A.real, A.imag), (tangent.real, tangent.imag)
    _, want = jax.jvp(realified, point, direction)
    np.testing.assert_allclose(_call(ef.jvp(text, wrt="A", tangent="T"), A=A, y=Y, T=tangent), want, rtol=1e-9,
                               atol=1e-12)
    _, second = jax.jvp(gradient, point, direction)
    np.testing.assert_allclose(_call(ef.hvp(text, wrt="A", tangent="T"), A=A, y=Y, T=tangent), second, rtol=1e-9,
                               atol=1e-11)


@pytest.mark.parametrize("text", sorted(t for t, (_, hermitian) in PROGRAMS.items() if not hermitian))
def test_real_arrays_keep_the_real_derivation(text: str) -> None:
    function, _ = PROGRAMS[text]
    A, y = GENERAL.real.copy(), Y.real.copy()
    program = ef.grad(text, wrt="A")
    a = torch.tensor(A, requires_grad=True)
    function(a, torch.tensor(y), torch).backward()
    np.testing.assert_allclose(_call(program, A=A, y=y), a.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_the_printed_program_is_the_real_one_and_the_complex_one_reparses() -> None:
    text = "f = logdet[i,j](A[i,j]) + real(sum[i,j](conj(y[i]) inv[i,j](A[i,j]) y[j]))"
    program = ef.grad(text, wrt="A")
    assert "conj" not in str(ef.grad("f = logdet[i,j](A[i,j])", wrt="A"))  # real arrays: no conj printed
    complex_program = program.complex_program  # type: ignore[attr-defined]
    assert "conj(" in str(complex_program)
    again = ef.compile(str(complex_program))
    np.testing.assert_allclose(again(A=GENERAL, y=Y), program(A=GENERAL, y=Y), rtol=1e-14)
    assert str(ef.grad("L = logdet[i,j](K[i,j])", wrt="K")).splitlines()[-1] == "dL_dK[p,q] = inv[q,p](K[q,p])"


def test_vjp_through_inv_of_a_complex_matrix_is_torchs_backward() -> None:
    G = _complex(N, N)
    a = torch.tensor(GENERAL, requires_grad=True)
    torch.linalg.inv(a).backward(torch.tensor(G))
    got = ef.vjp("B[i,j] = inv[i,j](A[i,j])", wrt="A", cotangent="G")(A=GENERAL, G=G)
    np.testing.assert_allclose(got, a.grad.resolve_conj().numpy(), rtol=1e-10)


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax", "dask"])
def test_a_complex_spd_inverse_read_transposed_is_the_conjugate(backend: str) -> None:
    # the transpose of a Hermitian matrix is its conjugate: a solve read in the other orientation is another solve
    inverse, X = np.linalg.inv(HERMITIAN), _complex(N, 2)
    cases = {"spd A\nf = sum[i,j](y[i] inv[j,i](A[j,i]) x[j]) + sum[i,j](y[i] inv[i,j](A[i,j]) x[j])":
             Y @ inverse.T @ Y.conj() + Y @ inverse @ Y.conj(),
             "spd A\nz[i,k] = inv[j,i](A[j,i]) X[j,k]": inverse.T @ X}
    for text, want in cases.items():
        got = ef.evaluate(text, **{k: v for k, v in {"A": HERMITIAN, "y": Y, "x": Y.conj(), "X": X}.items()
                                   if k in ef.compile(text).inputs}, backend=backend)
        got = got.compute() if hasattr(got, "compute") else got
        got = np.asarray(got.resolve_conj() if hasattr(got, "resolve_conj") else got)
        np.testing.assert_allclose(got, want, rtol=1e-5 if backend == "jax" else 1e-12)


def test_a_pickled_derivative_keeps_its_complex_program() -> None:
    import pickle

    program = pickle.loads(pickle.dumps(ef.grad("f = logdet[i,j](A[i,j])", wrt="A")))
    np.testing.assert_allclose(program(A=HERMITIAN), np.linalg.inv(HERMITIAN).conj().T, rtol=1e-12)
    np.testing.assert_allclose(program(A=HERMITIAN.real), np.linalg.inv(HERMITIAN.real).T, rtol=1e-12)
