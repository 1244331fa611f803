"""einflow.derive.factor: common factors taken out of elementwise sums (fewer operations, the same values)."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
from einflow.derive.factor import _operations, fewer_operations
from einflow.lang import ir
from einflow.lang.grammar.parser import parse_expression

#: the Laplacian of h = z sigmoid(z) as the product and chain rules leave it (y = sigmoid(z), t = sigmoid(-z),
#: l = lap z, s = sum of the squared tangents), and other sums of products
CASES = [
    "l[i] y[i] + z[i] (t[i] l[i] y[i] + (t[i]^2 y[i] - y[i]^2 t[i]) s[i]) + 2 t[i] y[i] s[i]",
    "a[i] b[i] + a[i] c[i] + a[i] b[i] c[i] - 3 b[i]",
    "(a[i] + b[i])^2 - a[i]^2",
    "a[i,j] b[j] + a[i,j] c[i] exp(b[j])",
]


def _values(text: str, indices: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    program = ef.compile(f"r[{indices}] = {text}")
    return np.asarray(program(**{k: v for k, v in arrays.items() if k in program.inputs}))


@pytest.mark.parametrize("text", CASES)
def test_factored_sum_is_cheaper_and_equal(text: str) -> None:
    expr = parse_expression(text)
    indices = ("i", "j") if "j" in text else ("i",)
    factored = fewer_operations(expr, indices)
    assert _operations(factored) < _operations(expr)
    rng = np.random.default_rng(0)
    shapes = {"a": (3, 4), "b": (4,)} if "j" in text else {}
    arrays = {name: rng.standard_normal(shapes.get(name, (3,))) for name in "abclstyz"}
    expected = _values(text, ",".join(indices), arrays)
    np.testing.assert_allclose(_values(ir.format_expr(factored), ",".join(indices), arrays), expected, rtol=1e-12)


def test_left_alone() -> None:
    # a factor with an index the statement does not keep (a product of such factors sums it), a product with no
    # sum inside, and a sum with no factor to share
    for text, indices in [("a[i,j] b[j] + a[i,j] c[j]", ("i",)), ("a[i] b[i] c[i]", ("i",)),
                          ("a[i] + b[i] c[i]", ("i",))]:
        expr = parse_expression(text)
        assert fewer_operations(expr, indices) is expr


def test_silu_network_laplacian_factored() -> None:
    """The per-layer Laplacian of a silu network is one factored statement (the sigmoid's own Laplacian is
    computed in it) and agrees with the Hessian's trace."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    text = ("z1[b,j] = W1[j,k] x[b,k]\nh1[b,j] = z1[b,j] sigmoid(z1[b,j])\n"
            "z2[b,m] = W2[m,j] h1[b,j]\nh2[b,m] = z2[b,m] sigmoid(z2[b,m])\nf[b] = v[m] h2[b,m]")
    laplacian = ef.laplacian(text, wrt="x", batch="b")
    printed = str(laplacian)
    assert "lap_yh" not in printed  # the sigmoid's Laplacian is computed inside its reader's
    rng = np.random.default_rng(1)
    arrays = {"x": rng.standard_normal((5, 3)), "W1": rng.standard_normal((6, 3)), "W2": rng.standard_normal((4, 6)),
              "v": rng.standard_normal(4)}

    def f(x):  # type: ignore[no-untyped-def]
        h = jax.nn.silu(arrays["W1"] @ x)
        return arrays["v"] @ jax.nn.silu(arrays["W2"] @ h)

    expected = jax.vmap(lambda u: jnp.trace(jax.hessian(f)(u)))(jnp.asarray(arrays["x"]))
    np.testing.assert_allclose(laplacian(**arrays), expected, rtol=1e-10)
    np.testing.assert_allclose(ef.compile(printed)(**arrays), expected, rtol=1e-10)  # re-parsed
