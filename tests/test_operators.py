"""Per-sample derivatives and differential operators (LANGUAGE.md §9.1) against JAX in float64.

``batch=`` on jacobian/hessian/hessian_diagonal/laplacian/bilaplacian, the structure rule (an index that
indexes independent samples never meets a copy of itself: plan FLOPs and the largest intermediate grow
linearly in it), the weighted Laplacian, the bi-Laplacian and ``taylor``; references are ``jax.vmap`` of
``jax.hessian``/``jax.jacfwd``, nested Hessian traces and nested ``jax.jacfwd`` in t.
"""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

MLP = """h1[b,j] = tanh(W1[j,k] x[b,k])
h2[b,m] = sigmoid(W2[m,j] h1[b,j] + c[m])
f[b] = v[m] h2[b,m] + sum[k](x[b,k]^3)"""


def _arrays(batch: int = 5, d: int = 3, h: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"W1": rng.normal(size=(h, d)), "W2": rng.normal(size=(h, h)) / 2, "c": rng.normal(size=h),
            "v": rng.normal(size=h), "x": rng.normal(size=(batch, d))}


def _sample(a: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    def f(x):  # type: ignore[no-untyped-def]
        h1 = jnp.tanh(a["W1"] @ x)
        h2 = jax.nn.sigmoid(a["W2"] @ h1 + a["c"])
        return a["v"] @ h2 + jnp.sum(x ** 3)
    return f


def _trace(f):  # type: ignore[no-untyped-def]
    return lambda x: jnp.trace(jax.hessian(f)(x))


def _reparsed(program: ef.Program, arrays: dict[str, np.ndarray]) -> None:
    """The printed program is einflow text that runs on its own to the same values."""
    again = ef.compile(str(program))
    np.testing.assert_allclose(np.asarray(again(**{k: v for k, v in arrays.items() if k in again.inputs}), dtype=float),
                               np.asarray(program(**arrays), dtype=float), rtol=1e-12, atol=1e-12)


def test_batch_hessian_diagonal_jacobian_laplacian_match_vmapped_jax() -> None:
    a = _arrays()
    f = _sample(a)
    x = jnp.asarray(a["x"])
    hessian = ef.hessian(MLP, wrt="x", batch="b")
    np.testing.assert_allclose(hessian(**a), jax.vmap(jax.hessian(f))(x), rtol=1e-11, atol=1e-12)
    assert hessian(**a).shape == (5, 3, 3)
    diagonal = ef.hessian_diagonal(MLP, wrt="x", batch="b")
    np.testing.assert_allclose(diagonal(**a), jax.vmap(lambda u: jnp.diagonal(jax.hessian(f)(u)))(x),
                               rtol=1e-11, atol=1e-12)
    laplacian = ef.laplacian(MLP, wrt="x", batch="b")
    np.testing.assert_allclose(laplacian(**a), jax.vmap(_trace(f))(x), rtol=1e-11, atol=1e-12)
    layer = "h1[b,j] = tanh(W1[j,k] x[b,k])"
    jacobian = ef.jacobian(layer, wrt="x", batch="b")
    expected = jax.vmap(jax.jacfwd(lambda u: jnp.tanh(a["W1"] @ u)))(x)
    layer_arrays = {"W1": a["W1"], "x": a["x"]}
    np.testing.assert_allclose(jacobian(**layer_arrays), expected, rtol=1e-12, atol=1e-12)
    assert jacobian(**layer_arrays).shape == (5, 4, 3)  # J[b, j, k]
    for program in (hessian, diagonal, laplacian):
        _reparsed(program, a)
    _reparsed(jacobian, layer_arrays)


def test_batch_axis_anywhere_and_renamed_between_statements() -> None:
    text = "h[j,c] = tanh(W[j,k] x[k,c])\nf[c] = sum[j](h[j,c]^2)"  # the sample index c is x's second axis
    rng = np.random.default_rng(1)
    a = {"W": rng.normal(size=(4, 3)), "x": rng.normal(size=(3, 6))}

    def f(u):  # type: ignore[no-untyped-def]
        return jnp.sum(jnp.tanh(a["W"] @ u) ** 2)

    x = jnp.asarray(a["x"]).T
    np.testing.assert_allclose(ef.hessian(text, wrt="x", batch="c")(**a), jax.vmap(jax.hessian(f))(x), rtol=1e-11)
    np.testing.assert_allclose(ef.laplacian(text, wrt="x", batch="c")(**a), jax.vmap(_trace(f))(x), rtol=1e-11)
    renamed = "h[b,j] = tanh(W[j,k] y[b,k])\ng[e] = sum[j](h[e,j]^2)"
    b = {"W": a["W"], "y": a["x"].T}
    np.testing.assert_allclose(ef.laplacian(renamed, wrt="y", batch="e")(**b), jax.vmap(_trace(f))(x), rtol=1e-11)


def test_several_batch_indices_per_node_network() -> None:
    text = "h[b,n,j] = tanh(W[j,k] x[b,n,k])\nf[b,n] = v[j] h[b,n,j]"
    rng = np.random.default_rng(2)
    a = {"W": rng.normal(size=(4, 3)), "v": rng.normal(size=4), "x": rng.normal(size=(2, 5, 3))}

    def f(u):  # type: ignore[no-untyped-def]
        return a["v"] @ jnp.tanh(a["W"] @ u)

    per = jax.vmap(jax.vmap(_trace(f)))(jnp.asarray(a["x"]))
    got = ef.laplacian(text, wrt="x", batch=("b", "n"))(**a)
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got, per, rtol=1e-11)
    hessian = ef.hessian(text, wrt="x", batch=["b", "n"])(**a)
    np.testing.assert_allclose(hessian, jax.vmap(jax.vmap(jax.hessian(f)))(jnp.asarray(a["x"])), rtol=1e-11)


@pytest.mark.parametrize(("text", "batch", "message"), [
    ("m[k] = sum[b](x[b,k])\nf[b] = sum[k]((x[b,k] - m[k])^2)", "b", "mixes samples along batch index 'b'"),
    ("f[b] = sum[k](x[b,k] x[b+1,k])", "b", "reads shifted along it"),
    ("f[b] = sum[k](x[b,k]^2)", "k", "'k' is not an index of the output"),
    ("f[b] = sum[k](W[b,k] x[k])", "b", "does not follow an axis of 'x'"),
    ("f = sum[b](x[b,k] y[k])", "b", "'b' is not an index of the output"),
    ("f[b] = sum[k](x[b,k] M[b,c] x[c,k])", "b", "mixes samples along batch index 'b'"),
])
def test_batch_refusals_name_the_index(text: str, batch: str, message: str) -> None:
    with pytest.raises(ef.DerivativeError, match=message.replace("[", r"\[").replace("+", r"\+")):
        ef.laplacian(text, wrt="x", batch=batch)


def _plan(program: ef.Program, batch: int) -> tuple[int, int]:
    a = _arrays(batch=batch)
    shapes = {k: v.shape for k, v in a.items()}
    if "T" in program.inputs:
        shapes["T"] = a["x"].shape
    if "G" in program.inputs:
        shapes["G"] = (batch,)
    report = program.plan(**{k: v for k, v in shapes.items() if k in program.inputs})
    return report.flops, report.largest_intermediate


SUMMED = MLP.replace("f[b] = ", "e[b] = ") + "\nL = sum[b](e[b])"


@pytest.mark.parametrize("build", [
    lambda: ef.grad(SUMMED, wrt="x"),
    lambda: ef.hvp(SUMMED, wrt="x", tangent="T"),
    lambda: ef.vjp(MLP, wrt="x"),
    lambda: ef.jvp(MLP, wrt="x", tangent="T"),
    lambda: ef.hessian_diagonal(SUMMED, wrt="x"),
    lambda: ef.laplacian(SUMMED, wrt="x"),
    lambda: ef.laplacian(MLP, wrt="x", batch="b"),
    lambda: ef.hessian(MLP, wrt="x", batch="b"),
    lambda: ef.hessian_diagonal(MLP, wrt="x", batch="b"),
    lambda: ef.jacobian(MLP, wrt="x", batch="b"),
    lambda: ef.bilaplacian(MLP, wrt="x", batch="b"),
], ids=["grad", "hvp", "vjp", "jvp", "hessian_diagonal", "laplacian", "laplacian(batch)", "hessian(batch)",
        "hessian_diagonal(batch)", "jacobian(batch)", "bilaplacian(batch)"])
def test_work_and_memory_grow_linearly_in_the_samples(build) -> None:  # type: ignore[no-untyped-def]
    program = build()
    small, large = _plan(program, 16), _plan(program, 64)
    assert large[0] <= 4.4 * small[0], (small, large, str(program))
    assert large[1] <= 4.4 * small[1], (small, large, str(program))


def test_summed_value_hessian_is_block_diagonal_and_right() -> None:
    a = _arrays(batch=4)
    f = _sample(a)
    hessian = ef.hessian(SUMMED, wrt="x")
    blocks = np.asarray(jax.vmap(jax.hessian(f))(jnp.asarray(a["x"])))
    expected = np.zeros((4, 3, 4, 3))
    for b in range(4):
        expected[b, :, b, :] = blocks[b]
    np.testing.assert_allclose(hessian(**a), expected, rtol=1e-11, atol=1e-12)
    # the only statement with two copies of b is the result itself
    assert str(hessian).count("delta[b,") == 1


def test_the_issue_laplacian_costs_a_forward_laplacian() -> None:
    text = "h1[b,j] = tanh(W1[j,k] x[b,k])\nh2[b,m] = tanh(W2[m,j] h1[b,j])\nL = sum[b](v[m] h2[b,m])"
    laplacian = ef.laplacian(text, wrt="x")
    forward = ef.compile(text)
    d, h = 50, 64
    shapes = {"W1": (h, d), "W2": (h, h), "v": (h,), "x": (16, d)}
    assert laplacian.plan(**shapes).flops <= (d + 6) * forward.plan(**shapes).flops
    rng = np.random.default_rng(3)
    a = {k: rng.normal(size=s) / 4 for k, s in shapes.items()}

    def total(x):  # type: ignore[no-untyped-def]
        return jnp.sum(jnp.tanh(jnp.tanh(x @ a["W1"].T) @ a["W2"].T) @ a["v"])

    np.testing.assert_allclose(laplacian(**a), jnp.trace(jax.hessian(total)(jnp.asarray(a["x"])).reshape(16 * d,
                                                                                                      16 * d)),
                               rtol=1e-10)


def test_weighted_laplacian_matches_jax() -> None:
    a = _arrays()
    f = _sample(a)
    rng = np.random.default_rng(4)
    s = rng.normal(size=(3, 3))
    weights = s @ s.T
    program = ef.laplacian(MLP, wrt="x", batch="b", weights="C")
    expected = jax.vmap(lambda u: jnp.sum(weights * jax.hessian(f)(u)))(jnp.asarray(a["x"]))
    np.testing.assert_allclose(program(**a, C=weights), expected, rtol=1e-11)
    unsymmetric = rng.normal(size=(3, 3))
    expected = jax.vmap(lambda u: jnp.sum(unsymmetric * jax.hessian(f)(u)))(jnp.asarray(a["x"]))
    np.testing.assert_allclose(program(**a, C=unsymmetric), expected, rtol=1e-11)
    with pytest.raises(ef.DerivativeError, match="already used"):
        ef.laplacian(MLP, wrt="x", batch="b", weights="W1")


def test_bilaplacian_matches_nested_jax() -> None:
    a = _arrays()
    f = _sample(a)
    program = ef.bilaplacian(MLP, wrt="x", batch="b")
    np.testing.assert_allclose(program(**a), jax.jit(jax.vmap(_trace(_trace(f))))(jnp.asarray(a["x"])), rtol=1e-10)
    _reparsed(program, a)
    whole = ef.bilaplacian("f = (x[i] x[i])^2 + sum[i](sin(x[i]))", wrt="x")
    u = np.array([0.3, -1.2, 0.8])
    expected = _trace(_trace(lambda y: jnp.sum(y ** 2) ** 2 + jnp.sum(jnp.sin(y))))(jnp.asarray(u))
    np.testing.assert_allclose(whole(x=u), expected, rtol=1e-12)


TAYLOR = [
    ("f = v[m] tanh(W2[m,j] tanh(W1[j,k] x[k]))", lambda a, x: a["v"] @ jnp.tanh(a["W2"] @ jnp.tanh(a["W1"] @ x))),
    ("f = logsumexp[m](W2[m,j] sigmoid(W1[j,k] x[k]))",
     lambda a, x: jax.scipy.special.logsumexp(a["W2"] @ jax.nn.sigmoid(a["W1"] @ x))),
    ("y[m] = softmax[m](W1[m,k] x[k]) * exp(-x[0]^2)",
     lambda a, x: jax.nn.softmax(a["W1"] @ x) * jnp.exp(-x[0] ** 2)),
    ("f = sum[k](sin(x[k]) x[k]^3) + log(1 + x[k] x[k]) + max[k](x[k])",
     lambda a, x: jnp.sum(jnp.sin(x) * x ** 3) + jnp.log(1 + x @ x) + jnp.max(x)),
    ("f = logdet[i,j](M[i,j] + x[i] x[j])", lambda a, x: jnp.linalg.slogdet(a["M"] + jnp.outer(x, x))[1]),
    ("f = sum[k]((x[k+1] - x[k])^2 cos(x[k]))", lambda a, x: jnp.sum((x[1:] - x[:-1]) ** 2 * jnp.cos(x[:-1]))),
]


@pytest.mark.parametrize(("text", "function"), TAYLOR, ids=[t.split("\n")[0][:30] for t, _ in TAYLOR])
def test_taylor_matches_nested_jacfwd(text: str, function) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    a = {"W1": rng.normal(size=(4, 3)), "W2": rng.normal(size=(4, 4)) / 2, "v": rng.normal(size=4),
         "M": 4 * np.eye(3), "x": rng.normal(size=3) / 2}
    direction = rng.normal(size=3)
    order = 5
    program = ef.taylor(text, wrt="x", direction="dx", order=order)
    got = program(**{k: v for k, v in a.items() if k in program.inputs}, dx=direction)
    path = lambda t: function(a, jnp.asarray(a["x"]) + t * direction)  # noqa: E731
    for k in range(order):
        path = jax.jacfwd(path)
        np.testing.assert_allclose(got[k], jax.jit(path)(0.0), rtol=1e-9, atol=1e-9,
                                   err_msg=f"order {k + 1} of {text}")


def test_taylor_of_order_eight_costs_a_few_forwards_and_matches_jet() -> None:
    from jax.experimental import jet

    text = "h1[j] = tanh(W1[j,k] x[k])\nh2[m] = tanh(W2[m,j] h1[j])\nh3[n] = tanh(W3[n,m] h2[m])\nf = v[n] h3[n]"
    rng = np.random.default_rng(6)
    a = {"W1": rng.normal(size=(16, 8)) / 3, "W2": rng.normal(size=(16, 16)) / 4, "W3": rng.normal(size=(16, 16)) / 4,
         "v": rng.normal(size=16), "x": rng.normal(size=8)}
    direction = rng.normal(size=8)
    program = ef.taylor(text, wrt="x", direction="dx", order=8)

    def f(x):  # type: ignore[no-untyped-def]
        return a["v"] @ jnp.tanh(a["W3"] @ jnp.tanh(a["W2"] @ jnp.tanh(a["W1"] @ x)))

    _, series = jet.jet(f, (jnp.asarray(a["x"]),), ((jnp.asarray(direction),) + (jnp.zeros(8),) * 7,))
    np.testing.assert_allclose(program(**a, dx=direction), series, rtol=1e-9)
    shapes = {k: v.shape for k, v in a.items()}
    assert program.plan(**shapes, dx=(8,)).flops <= 45 * ef.compile(text).plan(**shapes).flops


def test_taylor_refusals() -> None:
    with pytest.raises(ef.DerivativeError, match="order"):
        ef.taylor("f = x[i] x[i]", wrt="x", order=0)
    with pytest.raises(ef.DerivativeError, match="already used"):
        ef.taylor("f = x[i] v[i]", wrt="x", direction="v")


def test_operators_inside_jax_grad_and_on_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    a = _arrays()
    f = _sample(a)
    laplacian = ef.laplacian(MLP, wrt="x", batch="b")

    def loss(w1):  # type: ignore[no-untyped-def]
        return jnp.sum(laplacian(**{**{k: jnp.asarray(v) for k, v in a.items()}, "W1": w1}) ** 2)

    def reference(w1):  # type: ignore[no-untyped-def]
        g = _sample({**a, "W1": w1})
        return jnp.sum(jax.vmap(_trace(g))(jnp.asarray(a["x"])) ** 2)

    np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(a["W1"])), jax.grad(reference)(jnp.asarray(a["W1"])),
                               rtol=1e-10)
    tensors = {k: torch.tensor(v, requires_grad=(k == "W1")) for k, v in a.items()}
    value = laplacian(**tensors)
    np.testing.assert_allclose(value.detach().numpy(), jax.vmap(_trace(f))(jnp.asarray(a["x"])), rtol=1e-11)
    value.pow(2).sum().backward()
    np.testing.assert_allclose(tensors["W1"].grad.numpy(), jax.grad(reference)(jnp.asarray(a["W1"])), rtol=1e-10)
