"""Differential test of random complex programs (LANGUAGE.md 9.2): every derivative kind against torch autograd
(complex128) and jax on the realified function.

Each program is a real value of a complex vector expression u[i] built from random pieces (contractions,
exp/sin/tanh, conj/real/imag/abs/abs2/angle, powers, quotients, softmax and logsumexp of real parts, inv and
logdet of a Hermitian positive definite matrix built from u); it is written three times: einflow text, torch and
jax.numpy (``F``: the framework's softmax, logsumexp, inv, logdet). Compared: grad and value_and_grad (torch),
vjp of u with a complex cotangent (torch's backward), jvp and hvp (jax's jvp of the realified function and of
its gradient), the Wirtinger Hessian (against the hvp). ``EINFLOW_COMPLEX_N=1000`` runs 1,000 programs (the
default is a few dozen; ``EINFLOW_COMPLEX_FIRST=500`` starts at seed 500).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import einflow as ef

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

COUNT = int(os.environ.get("EINFLOW_COMPLEX_N", "8"))
FIRST = int(os.environ.get("EINFLOW_COMPLEX_FIRST", "0"))  # the first seed (a long run split over processes)

# (einflow text, the same as Python over an array module m) of a complex vector over i, from the input x[i]
# (and W[i,j], y[i]); "{u}" is an inner piece
LEAVES = [
    ("x[i]", "x"),
    ("W[i,j] x[j]", "(W @ x)"),
    ("x[i] y[i]", "(x * y)"),
    ("conj(x[i]) y[i]", "(m.conj(x) * y)"),
    ("x[i]^2", "(x ** 2)"),
    ("conj(W[j,i]) x[j]", "(m.conj(W).T @ x)"),
]
WRAPS = [
    ("exp(0.3 {u})", "m.exp(0.3 * {u})"),
    ("sin({u})", "m.sin({u})"),
    ("tanh({u})", "m.tanh({u})"),
    ("conj({u})", "m.conj({u})"),
    ("{u} / (2 + abs2({u}))", "({u} / (2 + m.abs({u}) ** 2))"),
    ("W[i,j] {v}", "(W @ {v})"),
    ("{u} y[i] + x[i]", "({u} * y + x)"),
    ("real({u}) x[i]", "(m.real({u}) * x)"),
    ("1j imag({u}) + {u}", "(1j * m.imag({u}) + {u})"),
    ("abs({u} + 3) {u}", "(m.abs({u} + 3) * {u})"),
    ("softmax[i](real({u})) {u}", "(F.softmax(m.real({u})) * {u})"),
    ("{u} - logsumexp[j](imag({v}))", "({u} - F.logsumexp(m.imag({v})))"),
]
_HERMITIAN = "K[i,j] = conj({u}) {v} + W[i,k] conj(W[j,k]) + delta[i,j]"
_HERMITIAN_CODE = "(m.conj({u})[:, None] * {u}[None, :] + W @ m.conj(W).T + F.eye)"
SCALARS = [
    ("sum[i](abs2({u}))", "(m.abs({u}) ** 2).sum()"),
    ("real(sum[i](conj(y[i]) {u}))", "m.real((m.conj(y) * {u}).sum())"),
    ("imag(sum[i]({u}))", "m.imag({u}.sum())"),
    ("sum[i](abs({u} + 4))", "m.abs({u} + 4).sum()"),
    ("sum[i](angle({u} + 3))", "m.angle({u} + 3).sum()"),
    ("log(1 + sum[i](abs2({u})))", "m.log(1 + (m.abs({u}) ** 2).sum())"),
    ("sum[i](real({u}) imag({u}))", "(m.real({u}) * m.imag({u})).sum()"),
    ("real(sum[i](conj(x[i]) W[i,j] {v})) / sum[k](abs2(x[k]))",
     "m.real(m.conj(x) @ (W @ {v})) / (m.abs(x) ** 2).sum()"),
    ("logsumexp[i](real({u}) + imag({u}))", "F.logsumexp(m.real({u}) + m.imag({u}))"),
    # a Hermitian positive definite matrix K (declared hermitian or spd) built from u: logdet and inv of it
    (f"{_HERMITIAN}\nhermitian K\nf = logdet[i,j](K[i,j])", f"F.logdet({_HERMITIAN_CODE})"),
    (f"{_HERMITIAN}\nspd K\nf = real(sum[i,j](conj(y[i]) inv[i,j](K[i,j]) y[j]))",
     f"m.real(m.conj(y) @ F.inv({_HERMITIAN_CODE}) @ y)"),
    (f"{_HERMITIAN}\nf = logdet[i,j](K[i,j]) + imag(sum[i,j](y[i] inv[i,j](K[i,j]) x[j]))",
     f"F.logdet({_HERMITIAN_CODE}) + m.imag(y @ F.inv({_HERMITIAN_CODE}) @ x)"),
]


_NEXT = {"i": "j", "j": "k", "k": "l", "l": "n"}


def _with_j(text: str) -> str:
    """A piece written over i as the same piece over j (for a contraction ``W[i,j] <piece over j>``): each
    index renamed to the next letter."""
    return re.sub(r"\[([a-z, ]+)\]", lambda m: "[" + ",".join(_NEXT[i.strip()] for i in m.group(1).split(",")) + "]",
                  text)


def random_program(seed: int) -> tuple[str, str, str]:
    """(the einflow program, the scalar in Python over ``m``, the vector u in Python over ``m``)."""
    rng = np.random.default_rng(seed)
    text, code = LEAVES[rng.integers(len(LEAVES))]
    lines = []
    for _ in range(rng.integers(1, 3)):
        wrap_text, wrap_code = WRAPS[rng.integers(len(WRAPS))]
        if "{v}" in wrap_text:  # a contraction reads the piece so far as a statement (its i bound by the target)
            lines.append(f"t{len(lines)}[i] = {text}")
            text = f"t{len(lines) - 1}[i]"
        text, code = wrap_text.format(u=f"({text})", v=f"({_with_j(text)})"), wrap_code.format(u=code, v=code)
    scalar_text, scalar_code = SCALARS[rng.integers(len(SCALARS))]
    scalar_text = scalar_text if scalar_text.startswith("K[") else "f = " + scalar_text
    program = "\n".join([*lines, f"u[i] = {text}", scalar_text.format(u="u[i]", v="u[j]")])
    return program, scalar_code.format(u="u", v="u"), code


class _Frameworks:
    """The normalisers and matrix functions of torch or jax.numpy (``F`` in the programs' code)."""

    def __init__(self, m) -> None:  # type: ignore[no-untyped-def]
        if m is torch:
            self.softmax = lambda x: torch.softmax(x, 0)
            self.logsumexp = lambda x: torch.logsumexp(x, 0)
            self.logdet = lambda K: torch.linalg.slogdet(K)[1]
            self.inv = torch.linalg.inv
            self.eye = torch.eye(3, dtype=torch.float64)
        else:
            self.softmax = jax.nn.softmax
            self.logsumexp = jax.nn.logsumexp
            self.logdet = lambda K: jnp.linalg.slogdet(K)[1]
            self.inv = jnp.linalg.inv
            self.eye = jnp.eye(3)


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(10_000 + seed)
    n = 3

    def c(*shape: int) -> np.ndarray:
        return 0.7 * (rng.normal(size=shape) + 1j * rng.normal(size=shape))

    return {"x": c(n), "W": c(n, n), "y": c(n), "v": c(n), "G": c(n)}


def _close(got: object, want: object, what: str, program: str) -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-8, atol=1e-10,
                               err_msg=f"{what} of\n{program}")


@pytest.mark.parametrize("seed", range(FIRST, FIRST + COUNT))
def test_random_complex_program_every_derivative_kind(seed: int) -> None:
    program_text, scalar_code, vector_code = random_program(seed)
    arrays = _inputs(seed)
    program = ef.compile(program_text)
    data = {name: arrays[name] for name in program.inputs}

    def scalar(m, x, W, y):  # noqa: N803 - the programs' own names
        F = _Frameworks(m)  # noqa: N806
        u = eval(vector_code, {"m": m, "F": F, "x": x, "W": W, "y": y})  # noqa: S307 - our own table's code
        return eval(scalar_code, {"m": m, "F": F, "u": u, "x": x, "W": W, "y": y})  # noqa: S307

    # value and grad: torch autograd, complex128
    x = torch.tensor(arrays["x"], requires_grad=True)
    W, y = torch.tensor(arrays["W"]), torch.tensor(arrays["y"])
    value = scalar(torch, x, W, y)
    value.backward()
    _close(program(**data), value.detach().resolve_conj().numpy(), "value", program_text)
    _close(ef.grad(program, wrt="x")(**data), x.grad.resolve_conj().numpy(), "grad", program_text)
    both = ef.value_and_grad(program, wrt="x")(**data)
    _close(both[1], x.grad.resolve_conj().numpy(), "value_and_grad", program_text)

    # vjp of the complex vector u with a complex cotangent: torch's backward(G)
    x = torch.tensor(arrays["x"], requires_grad=True)
    u = eval(vector_code, {"m": torch, "F": _Frameworks(torch), "x": x, "W": W, "y": y})  # noqa: S307
    u.backward(torch.tensor(arrays["G"]))
    lines = program_text.splitlines()
    inner = ef.compile("\n".join(lines[:next(k for k, line in enumerate(lines) if line.startswith("u[i] =")) + 1]))
    _close(ef.vjp(inner, wrt="x", cotangent="G")(**{k: arrays[k] for k in inner.inputs}, G=arrays["G"]),
           x.grad.resolve_conj().numpy(), "vjp", program_text)

    # jvp and hvp: jax on the realified function
    def realified(re, im):
        return scalar(jnp, re + 1j * im, jnp.asarray(arrays["W"]), jnp.asarray(arrays["y"]))

    point, direction = (arrays["x"].real, arrays["x"].imag), (arrays["v"].real, arrays["v"].imag)
    _, tangent = jax.jvp(realified, point, direction)
    _close(ef.jvp(program, wrt="x", tangent="v")(**data, v=arrays["v"]), tangent, "jvp", program_text)

    def gradient(re, im):
        by_re, by_im = jax.grad(realified, argnums=(0, 1))(re, im)
        return by_re + 1j * by_im

    _, second = jax.jvp(gradient, point, direction)
    hvp = ef.hvp(program, wrt="x", tangent="v")(**data, v=arrays["v"])
    _close(hvp, second, "hvp", program_text)
    if seed % 4 == 0:
        A, B = ef.hessian(program, wrt="x", wirtinger=True)(**data)
        _close(2 * (A @ arrays["v"] + B @ arrays["v"].conj()), hvp, "wirtinger hessian", program_text)


def test_the_generator_draws_every_piece() -> None:
    drawn = "\n".join(random_program(seed)[0] for seed in range(200))
    for name in ("conj(", "real(", "imag(", "abs(", "abs2(", "angle(", "exp(", "sin(", "tanh(", "W[i,j]", "softmax[",
                 "logsumexp[", "inv[", "logdet[", "hermitian K", "spd K"):
        assert name in drawn
