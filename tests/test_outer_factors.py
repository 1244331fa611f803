"""Outer factors stay out of derivative statements (issue 12, item 5: lean full Hessians).

The input behind a weight (``x[w]`` for ``W1[v,w] x[w]``) multiplies every derivative by ``W1``: derivative
statements are written without it, their readers multiply it in, and it ends in one outer product in the
result. References: JAX's ``jax.hessian`` in float64 and central differences of a hand-written gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
from einflow.lang import ir

jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)

ACTIVATIONS = {"tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "softplus": jax.nn.softplus, "sin": jnp.sin}
HEADS = {
    "squares": ("L = sum[i]({h}[i]^2)", lambda h: jnp.sum(h ** 2)),
    "logsumexp": ("L = logsumexp[i]({h}[i])", jax.scipy.special.logsumexp),
    "target": ("L = 0.5 * sum[i](({h}[i] - t[i])^2)", None),
}


def _chain(activations: list[str], head: str) -> tuple[str, object]:
    """A tanh/sigmoid/... MLP on one input vector with the given loss, as einflow text and as a JAX function."""
    lines = []
    previous = "x"
    for k, name in enumerate(activations, start=1):
        lines.append(f"h{k}[i] = {name}(W{k}[i,j] {previous}[j])")
        previous = f"h{k}"
    text, loss = HEADS[head]
    lines.append(text.format(h=previous))

    def function(W1, arrays):  # noqa: ANN001, ANN202
        h = arrays["x"]
        for k, name in enumerate(activations, start=1):
            h = ACTIVATIONS[name]((W1 if k == 1 else arrays[f"W{k}"]) @ h)
        if head == "target":
            return 0.5 * jnp.sum((h - arrays["t"]) ** 2)
        return loss(h)

    return "\n".join(lines), function


def _intermediate_ranks(program: ef.Program) -> list[int]:
    """Ranks of every statement's target but the results'."""
    results = set(program.outputs)
    return [len(s.indices or ()) for s in program.ir.statements if isinstance(s, ir.Assign) and s.target not in results]


@pytest.mark.parametrize("seed", range(12))
def test_mlp_hessians_by_the_first_weight_match_jax_and_keep_matrix_intermediates(seed: int) -> None:
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(1, 4))
    activations = [str(rng.choice(list(ACTIVATIONS))) for _ in range(depth)]
    head = str(rng.choice(list(HEADS)))
    text, function = _chain(activations, head)
    sizes = [int(rng.integers(2, 6)) for _ in range(depth + 1)]
    arrays = {"x": rng.normal(size=sizes[0])}
    for k in range(1, depth + 1):
        arrays[f"W{k}"] = rng.normal(size=(sizes[k], sizes[k - 1])) / 2
    if head == "target":
        arrays["t"] = rng.normal(size=sizes[-1])
    hessian = ef.hessian(text, wrt="W1")
    expected = jax.hessian(function)(jnp.asarray(arrays["W1"]), {k: jnp.asarray(v) for k, v in arrays.items()})
    np.testing.assert_allclose(hessian(arrays), np.asarray(expected), rtol=1e-9, atol=1e-11, err_msg=text)
    # the Hessian by z1 = W1 x is a matrix: no statement but the result carries x's index as well
    assert max(_intermediate_ranks(hessian)) <= 2, str(hessian)
    plan = hessian.plan(**{name: a.shape for name, a in arrays.items()})
    # (the rows of W1 are independent samples: the blocks [i,p,q] of the block-diagonal result, no [i,i] block)
    assert all(np.prod(shape) <= sizes[1] * sizes[0] ** 2 or np.prod(shape) <= max(sizes) ** 2
               for shape in _step_shapes(plan)[:-1]), str(plan)


def test_the_three_layer_hessian_ends_in_one_outer_product() -> None:
    text = "\n".join(["h1[i] = tanh(W1[i,j] x[j])", "h2[i] = tanh(W2[i,j] h1[j])", "h3[i] = tanh(W3[i,j] h2[j])",
                      "L = sum[i](h3[i]^2)"])
    hessian = ef.hessian(text, wrt="W1")
    last = [s for s in hessian.ir.statements if isinstance(s, ir.Assign)][-1]
    # d2L_dW12[p,q,v,w] = t[p,v] x[w] x[q]: the part by z1 (with its delta term) is a statement of its own
    assert isinstance(last.expr, ir.Product) and len(last.expr.factors) == 3
    assert sorted(f.name for f in last.expr.factors if isinstance(f, ir.Tensor) and f.name == "x") == ["x", "x"]
    shapes = {"x": (48,), "W1": (48, 48), "W2": (48, 48), "W3": (48, 48)}
    plan = hessian.plan(**shapes)
    largest_but_result = max(int(np.prod(step_shape)) for step_shape in _step_shapes(plan)[:-1])
    assert largest_but_result <= 48 * 48


def _step_shapes(plan: object) -> list[tuple[int, ...]]:
    report = str(plan)
    shapes = []
    for line in report.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and "(" in line:
            inside = line[line.index("(") + 1: line.index(")")]
            shapes.append(tuple(int(n) for n in inside.split(",") if n.strip()))
    return shapes


def test_a_result_that_is_a_sum_is_computed_small_then_multiplied_out() -> None:
    """The Jacobian of a layer's gradient by its weight: both terms share x[q] x[w]."""
    text = "h[i] = tanh(W[i,j] x[j])\nL = sum[i](h[i] t[i])"
    hessian = ef.hessian(text, wrt="W")
    rng = np.random.default_rng(1)
    arrays = {"W": rng.normal(size=(4, 3)), "x": rng.normal(size=3), "t": rng.normal(size=4)}

    def loss(W):  # noqa: ANN001, ANN202
        return jnp.sum(jnp.tanh(W @ arrays["x"]) * arrays["t"])

    np.testing.assert_allclose(hessian(arrays), np.asarray(jax.hessian(loss)(jnp.asarray(arrays["W"]))),
                               rtol=1e-12, atol=1e-14)
    assert max(_intermediate_ranks(hessian), default=0) <= 2, str(hessian)


def test_a_batch_keeps_its_input_inside() -> None:
    """``X[n,w]`` carries the batch index the derivative sums later: it is not an outer factor."""
    text = "h[n,i] = tanh(W[i,j] X[n,j])\nL = sum[n,i](h[n,i]^2)"
    hessian = ef.hessian(text, wrt="W")
    rng = np.random.default_rng(2)
    arrays = {"W": rng.normal(size=(3, 4)) / 2, "X": rng.normal(size=(5, 4))}

    def loss(W):  # noqa: ANN001, ANN202
        return jnp.sum(jnp.tanh(arrays["X"] @ W.T) ** 2)

    np.testing.assert_allclose(hessian(arrays), np.asarray(jax.hessian(loss)(jnp.asarray(arrays["W"]))),
                               rtol=1e-11, atol=1e-13)


def test_a_statement_that_sizes_an_index_keeps_its_axes() -> None:
    """Found by the differential run (seed 60029): ``t7[k,n] = s[k] t6[n]`` (a split of the user's product)
    has the outer factor ``s[k]``, but ``size r2, s2 = t7`` reads sizes from its axes; taking it out made
    the printed gradient fail its own check. Such statements keep their axes; derivative ones still shrink."""
    text = ("S = (V[t2,r,m] x[t2] * Q[n,r] s[k] s[t2] e) v[j] x[m]\n"
            "(-(S[p,c,hid] * (v[hid] v[p]) * x[c])) + (v[q] A[c,c] v[q] B[p,p] + e - g) - 2.5E+0")
    rng = np.random.default_rng(3)
    arrays = {"V": rng.normal(size=(3, 2, 3)), "x": rng.normal(size=3), "Q": rng.normal(size=(4, 2)),
              "s": rng.normal(size=3), "e": 0.7, "v": rng.normal(size=4), "A": rng.normal(size=(2, 2)),
              "B": rng.normal(size=(5, 5)), "g": 0.3}

    def f(s, Q, x):  # noqa: ANN001, ANN202
        a = {k: jnp.asarray(v) for k, v in arrays.items()}
        S = jnp.einsum("trm,t,nr,k,t,j,m->nkj", a["V"], x, Q, s, s, a["v"], x) * a["e"]
        return (-jnp.einsum("pch,h,p,c->", S, a["v"], a["v"], x)
                + jnp.sum(a["v"] ** 2) * jnp.trace(a["A"]) * jnp.trace(a["B"]) + a["e"] - a["g"] - 2.5)

    wrt = ["s", "Q", "x"]
    gradient = ef.grad(text, wrt=wrt)
    expected = jax.grad(f, argnums=(0, 1, 2))(*(jnp.asarray(arrays[n]) for n in wrt))
    for got, want in zip(gradient(arrays), expected):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-10, atol=1e-12)
    # the gradient of S, an outer product of vectors, is a vector times outer factors
    df_dS = next(s for s in gradient.ir.statements if isinstance(s, ir.Assign) and s.target == "df_dS")
    assert len(df_dS.indices) == 1
