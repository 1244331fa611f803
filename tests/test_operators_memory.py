"""The memory a forward-sweep operator's plan holds: forward values computed when the sweep needs them
(einflow.derive.schedule), and a dead tangent multiplied in its own memory before its matrix product
(einflow.engine.render_steps). References: jax's Hessian trace in float64, and the inputs' own copies."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
from einflow.engine.backends import get_backend
from einflow.engine.plan import Plan, build_plan

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


def _silu_net(depth: int, seed: int = 0) -> tuple[str, dict[str, np.ndarray]]:
    """A network acting per node (folx's README structure, small): ``depth`` Dense + silu layers on x[b,n,k]."""
    rng = np.random.default_rng(seed)
    lines, previous, arrays = [], "x", {"x": rng.standard_normal((3, 4, 2))}
    for k in range(1, depth + 1):
        inner, outer = (f"j{k - 1}" if k > 1 else "k"), f"j{k}"
        lines.append(f"z{k}[b,n,{outer}] = W{k}[{outer},{inner}] {previous}[b,n,{inner}] + c{k}[{outer}]")
        lines.append(f"h{k}[b,n,{outer}] = z{k}[b,n,{outer}] sigmoid(z{k}[b,n,{outer}])")
        arrays[f"W{k}"] = rng.standard_normal((5, 2 if k == 1 else 5)) / 2
        arrays[f"c{k}"] = 0.1 * rng.standard_normal(5)
        previous = f"h{k}"
    lines.append(f"L = sum[b,n](v[j{depth}] h{depth}[b,n,j{depth}])")
    arrays["v"] = rng.standard_normal(5)
    return "\n".join(lines), arrays


def _jax_silu_laplacian(arrays: dict[str, np.ndarray], depth: int) -> float:
    def node(u):  # type: ignore[no-untyped-def]
        h = u
        for k in range(1, depth + 1):
            h = jax.nn.silu(arrays[f"W{k}"] @ h + arrays[f"c{k}"])
        return arrays["v"] @ h

    per_node = jax.vmap(jax.vmap(lambda u: jnp.trace(jax.hessian(node)(u))))(jnp.asarray(arrays["x"]))
    return float(jnp.sum(per_node))


def _plan(program: ef.Program, arrays: dict[str, np.ndarray]) -> Plan:
    shapes = {name: arrays[name].shape for name in program.inputs}
    return build_plan(
        program.ir,
        program.info,
        shapes,
        8,
        get_backend("numpy"),
        dtypes={name: arrays[name].dtype for name in program.inputs},
    )


def test_forward_values_are_computed_when_the_sweep_needs_them() -> None:
    text, arrays = _silu_net(3)
    laplacian = ef.laplacian(text, wrt="x")
    lines = [line.split("[")[0] for line in str(laplacian).splitlines()]
    # layer 2's forward values come after layer 1's tangent is carried into layer 2, not all before the sweep
    assert lines.index("dz2_dx") < lines.index("z2") < lines.index("dz3_dx") < lines.index("z3")
    expected = _jax_silu_laplacian(arrays, 3)
    np.testing.assert_allclose(laplacian(**arrays), expected, rtol=1e-10)
    np.testing.assert_allclose(ef.compile(str(laplacian))(**arrays), expected, rtol=1e-10)  # re-parsed


def test_deeper_network_holds_no_more_memory_at_once() -> None:
    """With the forward computed on demand, what one run holds at its peak does not grow with the depth (the
    whole forward pass alive until the sweep reached it grew linearly in it)."""
    peaks = []
    for depth in (4, 12):
        text, arrays = _silu_net(depth)
        arrays["x"] = np.random.default_rng(depth).standard_normal((40, 50, 2))
        peaks.append(_plan(ef.laplacian(text, wrt="x"), arrays).peak_bytes)
    assert peaks[1] < 1.1 * peaks[0], peaks


def test_bilaplacian_and_weighted_laplacian_keep_their_values() -> None:
    text = "h1[b,j] = tanh(W1[j,k] x[b,k])\nh2[b,m] = tanh(W2[m,j] h1[b,j])\nf[b] = v[m] h2[b,m]"
    rng = np.random.default_rng(2)
    arrays = {
        "x": rng.standard_normal((4, 3)),
        "W1": rng.standard_normal((5, 3)),
        "W2": rng.standard_normal((4, 5)) / 2,
        "v": rng.standard_normal(4),
    }

    def f(x):  # type: ignore[no-untyped-def]
        return arrays["v"] @ jnp.tanh(arrays["W2"] @ jnp.tanh(arrays["W1"] @ x))

    def lap(g):  # type: ignore[no-untyped-def]
        return lambda u: jnp.trace(jax.hessian(g)(u))

    x = jnp.asarray(arrays["x"])
    np.testing.assert_allclose(ef.bilaplacian(text, wrt="x", batch="b")(**arrays), jax.vmap(lap(lap(f)))(x), rtol=1e-9)
    weights = rng.standard_normal((3, 3))
    weighted = ef.laplacian(text, wrt="x", batch="b", weights="C")
    expected = jax.vmap(lambda u: jnp.sum(weights * jax.hessian(f)(u)))(x)
    np.testing.assert_allclose(weighted(**arrays, C=weights), expected, rtol=1e-10)


MLP = """h1[b,j] = tanh(W1[j,k] x[b,k] + c1[j])
h2[b,m] = tanh(W2[m,j] h1[b,j] + c2[m])
h3[b,q] = tanh(W3[q,m] h2[b,m] + c3[q])
f[b] = v[q] h3[b,q]"""


def _mlp_arrays(seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {"k": 6, "j": 64, "m": 64, "q": 48}
    return {
        "x": rng.standard_normal((32, sizes["k"])),
        "W1": rng.standard_normal((64, 6)) / 2,
        "W2": rng.standard_normal((64, 64)) / 8,
        "W3": rng.standard_normal((48, 64)) / 8,
        "c1": rng.standard_normal(64),
        "c2": rng.standard_normal(64),
        "c3": rng.standard_normal(48),
        "v": rng.standard_normal(48),
    }


def test_dead_tangent_is_multiplied_in_its_own_memory() -> None:
    """The tangent dz2[b,p,m] dies at the product that carries it into the next layer: it is multiplied by
    tanh' in place, and neither an input nor a value read later changes."""
    arrays = _mlp_arrays()
    laplacian = ef.laplacian(MLP, wrt="x", batch="b")
    plan = _plan(laplacian, arrays)
    assert "multiply(" in plan.source and ", out=" in plan.source
    before = {name: array.copy() for name, array in arrays.items()}

    def f(x):  # type: ignore[no-untyped-def]
        h = x
        for k in (1, 2, 3):
            h = jnp.tanh(arrays[f"W{k}"] @ h + arrays[f"c{k}"])
        return arrays["v"] @ h

    expected = jax.vmap(lambda u: jnp.trace(jax.hessian(f)(u)))(jnp.asarray(arrays["x"]))
    first = laplacian(**arrays)
    np.testing.assert_allclose(first, expected, rtol=1e-10)
    np.testing.assert_array_equal(laplacian(**arrays), first)  # a second call: the same values
    for name, array in arrays.items():
        np.testing.assert_array_equal(array, before[name])


def _body(program: ef.Program, arrays: dict[str, np.ndarray]) -> str:
    """The generated function's body (the block kernels defined before it write with out= too)."""
    return _plan(program, arrays).source.split("def _run")[1]


def test_no_product_in_place_where_the_operand_lives_on_or_is_an_input() -> None:
    rng = np.random.default_rng(4)
    arrays = {
        "A": rng.standard_normal((100, 120)),
        "B": rng.standard_normal((120, 120)),
        "s": rng.standard_normal(120),
        "C": rng.standard_normal((400, 120)),
    }
    A, B, s, C = (arrays[name] for name in "ABsC")
    dies = ef.compile("T[i,j] = A[i,k] B[k,j]\nU[i,q] = T[i,j] s[j] C[q,j]")
    assert ", out=" in _body(dies, arrays)  # T dies at U's product: scaled in place
    np.testing.assert_allclose(dies(**arrays), ((A @ B) * s) @ C.T, rtol=1e-12)
    # T is read again after the product that scales it: it keeps its values
    lives = ef.compile("T[i,j] = A[i,k] B[k,j]\nU[i,q] = T[i,j] s[j] C[q,j]\nR[i,q] = U[i,q] + T[i,j] C[q,j]")
    assert ", out=" not in _body(lives, arrays)
    np.testing.assert_allclose(lives(**arrays), ((A @ B) * s) @ C.T + (A @ B) @ C.T, rtol=1e-12)
    # an input multiplied by a factor before a matrix product is never written
    scaled = ef.compile("U[i,q] = A[i,j] s[j] C[q,j]")
    inputs = {"A": A, "s": s, "C": C}
    assert ", out=" not in _body(scaled, inputs)
    np.testing.assert_allclose(scaled(**inputs), (A * s) @ C.T, rtol=1e-12)
    np.testing.assert_array_equal(A, np.random.default_rng(4).standard_normal((100, 120)))
