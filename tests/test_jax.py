"""einflow inside JAX: jax arrays in and out, jax.jit with tracers, every jax transformation (jvp, jacfwd,
hessian, grad, grad of grad) through einflow's JVP program (custom_jvp).

References: the same function written in jax.numpy, differentiated by jax itself.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import einflow as ef
from einflow.frameworks import jvp_program
from einflow.lang.functions import FUNCTION_RULES

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

MLP = "L = sum[n]((tanh(X[n,i] W[i,h] + b[h]) v[h] - y[n])^2) / 2"


def mlp_jnp(X: jax.Array, W: jax.Array, b: jax.Array, v: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum((jnp.tanh(X @ W + b) @ v - y) ** 2) / 2


def data(seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    shapes = {"X": (6, 3), "W": (3, 4), "b": (4,), "v": (4,), "y": (6,)}
    return {name: jnp.asarray(rng.standard_normal(shape)) for name, shape in shapes.items()}


def test_jax_arrays_in_jax_arrays_out() -> None:
    p = ef.compile("C[i,k] = A[i,j] B[j,k]")
    for dtype in (jnp.float32, jnp.float64):
        A, B = jnp.ones((2, 3), dtype), jnp.ones((3, 4), dtype)
        C = p(A=A, B=B)
        assert isinstance(C, jax.Array) and C.dtype == dtype
        np.testing.assert_allclose(np.asarray(C), 3.0)
    assert isinstance(ef.einsum("ij,jk", C, np.ones((4, 2))), jax.Array)


def test_inside_jit_with_tracers() -> None:
    p = ef.compile(MLP)
    arrays = data()
    jitted = jax.jit(lambda W: p(arrays, W=W))
    np.testing.assert_allclose(jitted(arrays["W"]), mlp_jnp(**arrays), rtol=1e-12)


def test_grad_equals_jax_grad_of_jnp() -> None:
    p = ef.compile(MLP)
    arrays = data()
    names = ("W", "b", "v")
    mine = jax.grad(lambda W, b, v: p(arrays, W=W, b=b, v=v), argnums=(0, 1, 2))(*(arrays[n] for n in names))
    ref = jax.grad(lambda W, b, v: mlp_jnp(arrays["X"], W, b, v, arrays["y"]), argnums=(0, 1, 2))(
        *(arrays[n] for n in names))
    for a, b in zip(mine, ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_tangent_is_einflows_jvp_program() -> None:
    p = ef.compile(MLP.replace("/ 2", "/ 4"))  # a program of its own: its JVP program is derived here
    arrays = data()
    assert "custom_jvp_call" in str(jax.make_jaxpr(lambda W: p(arrays, W=W))(arrays["W"]))
    before = jvp_program.cache_info().misses
    jax.grad(lambda W: p(arrays, W=W))(arrays["W"])  # reverse mode: jax transposes einflow's JVP program
    assert jvp_program.cache_info().misses == before + 1
    program, tangents = jvp_program(p, ("W",))
    assert tangents == ("T_W",) and "T_W" in program.inputs


# a loss through a contraction, a nonlinearity, a reduction and a normaliser; and its jnp twin
SOFT = "L = logsumexp[n](A[n,i] x[i]) + sum[n](softmax[n](A[n,i] x[i]) tanh(A[n,j] x[j]))"


def soft_jnp(A: jax.Array, x: jax.Array) -> jax.Array:
    z = A @ x
    return jax.nn.logsumexp(z) + jnp.sum(jax.nn.softmax(z) * jnp.tanh(z))


@pytest.mark.parametrize("case", ["mlp", "soft"])
def test_forward_mode_jvp_jacfwd_hessian_under_jit(case: str) -> None:
    arrays = data(2)
    if case == "mlp":
        p, wrt = ef.compile(MLP), arrays["W"]

        def f(W: jax.Array) -> jax.Array:
            return p(arrays, W=W)

        def g(W: jax.Array) -> jax.Array:
            return mlp_jnp(arrays["X"], W, arrays["b"], arrays["v"], arrays["y"])
    else:
        p, A, wrt = ef.compile(SOFT), arrays["X"], arrays["y"][:3]

        def f(x: jax.Array) -> jax.Array:
            return p(A=A, x=x)

        def g(x: jax.Array) -> jax.Array:
            return soft_jnp(A, x)

    tangent = jnp.asarray(np.random.default_rng(5).standard_normal(wrt.shape))
    close = {"rtol": 1e-9, "atol": 1e-12}
    value, derivative = jax.jit(lambda w, t: jax.jvp(f, (w,), (t,)))(wrt, tangent)
    value_ref, derivative_ref = jax.jvp(g, (wrt,), (tangent,))
    np.testing.assert_allclose(value, value_ref, **close)
    np.testing.assert_allclose(derivative, derivative_ref, **close)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(f))(wrt), jax.jacfwd(g)(wrt), **close)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(wrt), jax.grad(g)(wrt), **close)
    np.testing.assert_allclose(jax.jit(jax.hessian(f))(wrt), jax.hessian(g)(wrt), **close)
    np.testing.assert_allclose(jax.jit(jax.jacfwd(jax.jacfwd(f)))(wrt), jax.hessian(g)(wrt), **close)
    second = jax.jit(jax.grad(lambda w: jnp.sum(jax.grad(f)(w) ** 2)))(wrt)
    np.testing.assert_allclose(second, jax.grad(lambda w: jnp.sum(jax.grad(g)(w) ** 2))(wrt), **close)


def test_jvp_with_several_inputs_and_integer_ones() -> None:
    p = ef.compile("y[n] = tanh(X[n,i] w[i]) k[n]")
    X, w, k = data()["X"], jnp.array([0.1, -0.2, 0.3]), jnp.arange(6)
    tX, tw = jnp.ones_like(X), jnp.array([1.0, 0.5, -1.0])
    _, got = jax.jvp(lambda X, w: p(X=X, w=w, k=k), (X, w), (tX, tw))
    _, want = jax.jvp(lambda X, w: jnp.tanh(X @ w) * k, (X, w), (tX, tw))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_grad_of_grad_and_hessian() -> None:
    p = ef.compile(MLP)
    arrays = data(1)

    def f(W: jax.Array) -> jax.Array:
        return p(arrays, W=W)

    def g(W: jax.Array) -> jax.Array:
        return mlp_jnp(arrays["X"], W, arrays["b"], arrays["v"], arrays["y"])

    W = arrays["W"]
    second = jax.grad(lambda W: jnp.sum(jax.grad(f)(W) ** 2))(W)
    reference = jax.grad(lambda W: jnp.sum(jax.grad(g)(W) ** 2))(W)
    np.testing.assert_allclose(second, reference, rtol=1e-9, atol=1e-12)
    # reverse over reverse, and jax.hessian (forward over reverse)
    np.testing.assert_allclose(jax.jit(jax.jacrev(jax.grad(f)))(W), jax.hessian(g)(W), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(jax.hessian(f)(W), jax.hessian(g)(W), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(FUNCTION_RULES))
def test_every_function_value_and_grad(name: str) -> None:
    x = jnp.array([-1.3, -0.4, 0.35, 0.8, 1.7])
    if name in ("log", "sqrt"):
        x = jnp.abs(x) + 0.5
    if name == "log1p":
        x = jnp.abs(x)
    p = ef.compile(f"s = sum[i]({name}(x[i]) x[i])")
    np.testing.assert_allclose(p(x=x), p(x=np.asarray(x)), rtol=1e-12)
    special = {"relu": jax.nn.relu, "sigmoid": jax.nn.sigmoid, "step": lambda x: (x > 0).astype(x.dtype),
               "erf": jax.scipy.special.erf, "softplus": jax.nn.softplus, "abs2": jnp.square}
    reference = special[name] if name in special else getattr(jnp, name)
    grad = jax.grad(lambda x: p(x=x))(x)
    np.testing.assert_allclose(grad, jax.grad(lambda x: jnp.sum(reference(x) * x))(x), rtol=1e-10)
    hess = jax.jacrev(jax.grad(lambda x: p(x=x)))(x)
    np.testing.assert_allclose(hess, jax.hessian(lambda x: jnp.sum(reference(x) * x))(x), rtol=1e-9, atol=1e-12)


def test_surviving_delta_and_size_declarations() -> None:
    p = ef.compile("size p = x\nsize q = x\nH[p,q] = delta[p,q] exp(x[p]) + x[p] x[q]")
    x = jnp.array([0.1, -0.2, 0.3])
    H = jax.jit(lambda x: p(x=x))(x)
    np.testing.assert_allclose(H, jnp.diag(jnp.exp(x)) + jnp.outer(x, x), rtol=1e-12)
    jac = jax.jacrev(lambda x: p(x=x))(x)
    reference = jax.jacrev(lambda x: jnp.diag(jnp.exp(x)) + jnp.outer(x, x))(x)
    np.testing.assert_allclose(jac, reference, rtol=1e-12)


def test_integer_inputs_get_no_gradient() -> None:
    p = ef.compile("s = sum[i](w[i] k[i])")
    k = jnp.array([1, 2, 3])
    np.testing.assert_allclose(jax.grad(lambda w: p(w=w, k=k))(jnp.ones(3)), [1.0, 2.0, 3.0])


def test_mixed_with_torch_is_an_error() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ef.BackendError, match="mix arrays"):
        ef.compile("s = x[i] y[i]")(x=jnp.ones(2), y=torch.ones(2))


def test_exported_jax_source_runs_without_einflow(tmp_path) -> None:
    p = ef.compile(MLP)
    source = p.to_source("loss", target="jax")
    assert "import jax.numpy" in source and "import einflow" not in source
    arrays = {name: np.asarray(value).tolist() for name, value in data().items()}
    script = tmp_path / "run.py"
    script.write_text("import sys; sys.modules['einflow'] = None\n" + source +
                      "\nimport jax\njax.config.update('jax_enable_x64', True)\nimport jax.numpy as jnp\n"
                      f"arrays = {{k: jnp.asarray(v) for k, v in {arrays!r}.items()}}\n"
                      "print(float(loss(**arrays)))\n"
                      "print(jax.grad(lambda W: loss(**{**arrays, 'W': W}))(arrays['W']).sum())\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    value, gradient_sum = map(float, result.stdout.split()[:2])
    arrays_j = data()
    assert value == pytest.approx(float(mlp_jnp(**arrays_j)), rel=1e-12)
    reference = jax.grad(lambda W: mlp_jnp(arrays_j["X"], W, arrays_j["b"], arrays_j["v"], arrays_j["y"]))
    assert gradient_sum == pytest.approx(float(reference(arrays_j["W"]).sum()), rel=1e-9)


def test_jax_newton_example() -> None:
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "examples" / "jax_newton.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert float(lines["max Hessian difference vs jax.hessian"]) < 1e-9
    assert float(lines["final gradient norm"]) < 1e-8  # Newton converges quadratically


def test_reductions_and_normalisers_under_grad() -> None:
    program = ef.compile("L = logsumexp[i](x[i]) + max[i](x[i]) + mean[i](x[i])")
    x = jnp.array([1.0, 2.0, 3.0])
    value, grad = jax.value_and_grad(lambda x: program(x=x))(x)
    np.testing.assert_allclose(value, jax.nn.logsumexp(x) + 3.0 + 2.0, rtol=1e-12)
    np.testing.assert_allclose(grad, jax.nn.softmax(x) + jnp.array([0.0, 0.0, 1.0]) + 1 / 3, rtol=1e-12)
    far = ef.compile("s[i] = log_softmax[i](x[i])")(x=jnp.array([1000.0, 999.0, 1.0]))
    np.testing.assert_allclose(far, jax.nn.log_softmax(jnp.array([1000.0, 999.0, 1.0])), rtol=1e-12)


def test_python_float_inputs_are_differentiated() -> None:
    p = ef.compile("L = sum[i](a x[i] x[i]) + k")
    x = jnp.array([1.0, 2.0])
    assert float(jax.grad(lambda a: p(x=x, a=a, k=1))(2.0)) == pytest.approx(5.0, rel=1e-15)
    _, tangent = jax.jvp(lambda a: p(x=x, a=a, k=1), (2.0,), (1.0,))
    assert float(tangent) == pytest.approx(5.0, rel=1e-15)
