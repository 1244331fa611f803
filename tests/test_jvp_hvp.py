"""jvp, hvp and exact zero blocks, against JAX (float64) and closed forms; the CLI and REPL commands."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import einflow as ef

jax = pytest.importorskip("jax", reason="jax is a test dependency (make test installs it)")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)

RNG = np.random.default_rng(11)
B, V, F = 6, 5, 4
DATA = {"X": RNG.normal(size=(B, F)), "W": RNG.normal(size=(V, F)), "Y": np.eye(V)[RNG.integers(0, V, B)],
        "b": RNG.normal(size=V)}
CROSS_ENTROPY = """z[n,v] = W[v,f] X[n,f] + b[v]
L = sum[n](log(sum[v](exp(z[n,v]))) - sum[v](Y[n,v] z[n,v]))"""


def cross_entropy(W, b):  # noqa: ANN001, ANN201 - the same function in jnp
    z = DATA["X"] @ W.T + b
    return jnp.sum(jnp.log(jnp.sum(jnp.exp(z), axis=1)) - jnp.sum(DATA["Y"] * z, axis=1))


def test_jvp_matches_jax_for_several_inputs() -> None:
    tangents = {"T_W": RNG.normal(size=(V, F)), "T_b": RNG.normal(size=V)}
    program = ef.jvp(CROSS_ENTROPY, wrt=["W", "b"])
    assert program.inputs and {"T_W", "T_b"} <= set(program.inputs)
    _, expected = jax.jvp(cross_entropy, (DATA["W"], DATA["b"]), (tangents["T_W"], tangents["T_b"]))
    np.testing.assert_allclose(program(**DATA, **tangents), expected, rtol=1e-10)


def test_hvp_matches_jax_and_stays_small() -> None:
    tangent = RNG.normal(size=(V, F))
    program = ef.hvp(CROSS_ENTROPY, wrt="W", tangent="V")
    expected = jax.jvp(jax.grad(cross_entropy), (DATA["W"], DATA["b"]), (tangent, jnp.zeros(V)))[1]
    np.testing.assert_allclose(program(**DATA, V=tangent), expected, rtol=1e-10)
    # never B x V x B x V (or any Hessian-sized array): nothing larger than the largest input or B x V
    report = program.plan(**{k: v.shape for k, v in DATA.items()}, V=tangent.shape)
    assert report.largest_intermediate <= max(B * V, V * F)


def test_hvp_blocks_for_a_list() -> None:
    tangents = {"T_W": RNG.normal(size=(V, F)), "T_b": RNG.normal(size=V)}
    hw, hb = ef.hvp(CROSS_ENTROPY, wrt=["W", "b"])(**DATA, **tangents)
    ew, eb = jax.jvp(jax.grad(cross_entropy, argnums=(0, 1)), (DATA["W"], DATA["b"]),
                     (tangents["T_W"], tangents["T_b"]))[1]
    np.testing.assert_allclose(hw, ew, rtol=1e-10)
    np.testing.assert_allclose(hb, eb, rtol=1e-10)


def test_jvp_of_a_tensor_value_and_of_an_unrelated_input() -> None:
    program = ef.jvp("y[i] = tanh(A[i,j] x[j])", wrt="x", tangent="t")
    A, x, t = RNG.normal(size=(3, 2)), RNG.normal(size=2), RNG.normal(size=2)
    np.testing.assert_allclose(program(A=A, x=x, t=t), (1 - np.tanh(A @ x) ** 2) * (A @ t), rtol=1e-12)
    along_s = ef.jvp("y[i] = tanh(A[i,j] x[j]) + s", wrt="s", tangent="ds")
    np.testing.assert_array_equal(along_s({"A": A, "x": x, "ds": np.float64(2.0)}), np.full(3, 2.0))
    # y does not depend on s: an exact zero of y's shape
    zero = ef.jvp("u = s^2\ny[i] = tanh(A[i,j] x[j])", wrt="s", tangent="ds")
    np.testing.assert_array_equal(zero({"A": A, "x": x, "s": np.nan, "ds": np.float64(2.0)}), np.zeros(3))


def test_zero_blocks_are_exact_and_read_no_values() -> None:
    hessian = ef.hessian("f = x[i] x[i] + sum[k,j](A[k,j] y[j])", wrt=["x", "A"])
    xx, xa, ax, aa = hessian(x=np.array([np.inf, 1.0]), A=np.ones((2, 2)), y=np.array([np.nan, 1.0]))
    assert xa.shape == (2, 2, 2) and ax.shape == (2, 2, 2) and aa.shape == (2, 2, 2, 2)
    for block in (xa, ax, aa):
        np.testing.assert_array_equal(block, 0.0)  # 0 * inf or 0 * nan would be nan
    np.testing.assert_array_equal(xx, 2 * np.eye(2))


def test_tangent_names_are_checked() -> None:
    with pytest.raises(ef.DerivativeError, match="already used"):
        ef.jvp("y[i] = A[i,j] x[j]", wrt="x", tangent="A")
    with pytest.raises(ef.DerivativeError, match="one name per"):
        ef.hvp(CROSS_ENTROPY, wrt=["W", "b"], tangent="V")
    with pytest.raises(ef.DerivativeError, match="scalar"):
        ef.hvp("y[i] = A[i,j] x[j]", wrt="x")


def test_cli_jvp_and_hvp() -> None:
    out = subprocess.run([sys.executable, "-m", "einflow.shell.cli", "hvp", "f = x[i] A[i,j] x[j]", "--wrt", "x",
                          "--tangent", "v"], capture_output=True, text=True, check=True).stdout
    assert "hvp_x[p] = A[p,j] v[j] + A[i,p] v[i]" in out
    out = subprocess.run([sys.executable, "-m", "einflow.shell.cli", "jvp", "y[i] = tanh(W[i,j] x[j])", "--wrt", "x"],
                         capture_output=True, text=True, check=True).stdout
    assert "jvp_y[i] = T[j] W[i,j] (1 - y[i]^2)" in out


def test_repl_hvp_binds_the_product() -> None:
    lines = ":set x [0.5, -1.0, 2.0]\n:set v [1.0, 2.0, 3.0]\nf = sum[i](exp(x[i]))\n:hvp f wrt x along v\n"
    out = subprocess.run([sys.executable, "-m", "einflow.shell.cli"], input=lines, capture_output=True, text=True,
                         check=True).stdout
    assert "hvp_x[p] = v[p] t1[p]" in out
    expected = np.exp([0.5, -1.0, 2.0]) * [1.0, 2.0, 3.0]
    assert f"{expected[2]:.4f}"[:5] in out


MLP3 = """h1[i] = tanh(W1[i,j] x[j])
h2[i] = tanh(W2[i,j] h1[j])
h3[i] = tanh(W3[i,j] h2[j])
L = sum[i](h3[i]^2)"""


def _mlp(W1, W2, W3, x):  # noqa: ANN001, ANN202
    return jnp.sum(jnp.tanh(W3 @ jnp.tanh(W2 @ jnp.tanh(W1 @ x))) ** 2)


def test_hessian_diagonal_and_laplacian_match_jax_without_forming_the_hessian() -> None:
    n = 40
    rng = np.random.default_rng(5)
    arrays = {"x": rng.normal(size=n), **{f"W{k}": rng.normal(size=(n, n)) / 6 for k in (1, 2, 3)}}
    full = np.asarray(jax.hessian(_mlp)(*(jnp.asarray(arrays[k]) for k in ("W1", "W2", "W3", "x")))).reshape(n * n,
                                                                                                            n * n)
    diagonal = ef.hessian_diagonal(MLP3, wrt="W1")
    np.testing.assert_allclose(diagonal(arrays), np.diagonal(full).reshape(n, n), rtol=1e-10, atol=1e-12)
    laplacian = ef.laplacian(MLP3, wrt="W1")
    np.testing.assert_allclose(laplacian(arrays), np.trace(full), rtol=1e-10)
    shapes = {k: v.shape for k, v in arrays.items()}
    for program in (diagonal, laplacian):  # the Hessian has n^4 elements; nothing here is larger than n^2
        assert program.plan(**shapes).largest_intermediate <= n * n, str(program.plan(**shapes))


def test_hessian_diagonal_blocks_for_a_list_and_exact_zeros() -> None:
    text = "f = sum[i](exp(A[i,j] x[j])) + s^3 + t x[i] x[i]"
    rng = np.random.default_rng(6)
    A, x = rng.normal(size=(4, 3)), rng.normal(size=3)
    dx, ds, dt = ef.hessian_diagonal(text, wrt=["x", "s", "t"])(A=A, x=x, s=2.0, t=0.5)
    np.testing.assert_allclose(dx, (A**2).T @ np.exp(A @ x) + 2 * 0.5, rtol=1e-12)
    assert float(ds) == 12.0
    assert float(dt) == 0.0  # f is linear in t
    total = ef.laplacian(text, wrt=["x", "s", "t"])(A=A, x=x, s=2.0, t=0.5)
    np.testing.assert_allclose(total, np.sum(dx) + 12.0, rtol=1e-12)
    # a value linear in its input: the Laplacian is an exact zero, computed without reading the inputs
    zero = ef.laplacian("f = A[i,j] x[j] y[i]", wrt="x")
    assert float(zero(A=np.full((2, 2), np.nan), x=np.ones(2), y=np.ones(2))) == 0.0


def test_pairwise_energy_laplacian_matches_jax() -> None:
    text = "E = sum[i,j](exp(-sum[d]((x[i,d] - x[j,d])^2)))"
    x = np.random.default_rng(7).normal(size=(30, 3))

    def energy(x_):  # noqa: ANN001, ANN202
        d = x_[:, None, :] - x_[None, :, :]
        return jnp.sum(jnp.exp(-jnp.sum(d**2, axis=2)))

    full = np.asarray(jax.hessian(energy)(jnp.asarray(x))).reshape(90, 90)
    np.testing.assert_allclose(ef.hessian_diagonal(text, wrt="x")(x=x), np.diagonal(full).reshape(30, 3),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ef.laplacian(text, wrt="x")(x=x), np.trace(full), rtol=1e-10)


def test_cli_and_repl_diagonal_and_laplacian() -> None:
    out = subprocess.run([sys.executable, "-m", "einflow.shell.cli", "laplacian", "f = x[i] A[i,j] x[j]", "--wrt", "x"],
                         capture_output=True, text=True, check=True).stdout
    assert "laplacian_f = 2 A[p,p]" in out
    lines = ":set x [0.5, -1.0, 2.0]\nf = sum[i](exp(x[i]))\n:hessian_diagonal f wrt x\n:laplacian f wrt x\n"
    out = subprocess.run([sys.executable, "-m", "einflow.shell.cli"], input=lines, capture_output=True, text=True,
                         check=True).stdout
    assert "d2f_dx2_diag[i] =" in out and "laplacian_f =" in out  # (elements i are independent samples)
    assert f"{np.exp(2.0):.4f}"[:5] in out and f"{np.exp([0.5, -1.0, 2.0]).sum():.4f}"[:5] in out


NORMALISED = [  # the Hessian reads a normaliser with both of its axes; its diagonal must not merge them
    ("L = sum[i,k](softmax[k](u[k] u[i]) c[k])",
     lambda u, c: jnp.sum(jax.nn.softmax(u[None, :] * u[:, None], axis=1) * c[None, :])),
    ("L = sum[i](logsumexp[k](u[k] u[i] c[k]))",
     lambda u, c: jnp.sum(jax.scipy.special.logsumexp(u[None, :] * u[:, None] * c[None, :], axis=1))),
    ("L = sum[i,k](log_softmax[k](u[k] + u[i]^2) c[k] u[i])",
     lambda u, c: jnp.sum(jax.nn.log_softmax(u[None, :] + u[:, None] ** 2, axis=1) * c[None, :] * u[:, None])),
]


@pytest.mark.parametrize("text, function", NORMALISED, ids=[t for t, _ in NORMALISED])
def test_hessian_diagonal_through_normalisers(text: str, function) -> None:  # noqa: ANN001
    """Found by the differential run (seed 60463): renaming the Hessian's second axis ``q`` to its first ``p``
    inside ``softmax[p](... u[q] ...)`` made it normalise over both; the normaliser now takes a new index and
    picks it with a delta. Indices summed inside the statement get new names first for the same reason."""
    rng = np.random.default_rng(8)
    u, c = rng.normal(size=4), rng.normal(size=4)
    expected = np.diagonal(np.asarray(jax.hessian(function)(jnp.asarray(u), jnp.asarray(c))))
    np.testing.assert_allclose(ef.hessian_diagonal(text, wrt="u")(u=u, c=c), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ef.laplacian(text, wrt="u")(u=u, c=c), np.sum(expected), rtol=1e-10, atol=1e-12)


def test_the_tour_prints_the_hessian_its_diagonal_and_its_trace() -> None:
    """examples/tour.ein, step 5b: the printed diagonal is the printed Hessian's, the Laplacian its trace."""
    from pathlib import Path

    tour = (Path(__file__).resolve().parent.parent / "examples" / "tour.ein").read_text()
    out = subprocess.run([sys.executable, "-m", "einflow.shell.cli", "--echo"], input=tour, capture_output=True,
                         text=True, check=True).stdout

    def printed(name: str) -> np.ndarray:
        block = out.split(f"\n{name}: ", 1)[1].split("\n", 1)[1].split("\nein>", 1)[0]
        return np.array([float(v) for v in block.replace("[", " ").replace("]", " ").split()])

    hessian = printed("d2L_dw2").reshape(3, 3)
    np.testing.assert_allclose(printed("d2L_dw2_diag"), np.diagonal(hessian), rtol=1e-7)
    np.testing.assert_allclose(printed("laplacian_L"), [np.trace(hessian)], rtol=1e-7)


def test_hessian_diagonal_reads_a_joint_normaliser_on_its_diagonal() -> None:
    """Found by the differential run (seed 110330): a normaliser over two indices read with both at one
    index (``log_softmax[l,a]`` at l = a = p) was printed ``softmax[p,p]``; one of them now takes a new index
    that a delta picks."""
    text = "L = sum[l,a](log_softmax[l,a](x[a] W[l,a] + y[l] x[l]) y[a])"
    rng = np.random.default_rng(9)
    x, W, y = rng.normal(size=3), rng.normal(size=(3, 3)), rng.normal(size=3)

    def loss(x_):  # noqa: ANN001, ANN202
        z = x_[None, :] * W + (y * x_)[:, None]
        return jnp.sum(jax.nn.log_softmax(z.ravel()).reshape(3, 3) * y[None, :])

    expected = np.diagonal(np.asarray(jax.hessian(loss)(jnp.asarray(x))))
    np.testing.assert_allclose(ef.hessian_diagonal(text, wrt="x")(x=x, W=W, y=y), expected, rtol=1e-10, atol=1e-12)
