"""Shared adjoints: gradients of many factors of one product, value_and_grad sharing the forward, and
derivative text that stays linear in a network's depth. Values against numpy closed forms and JAX
(float64); FLOP ratios from the plan report."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef

jax = pytest.importorskip("jax", reason="jax is a test dependency (make test installs it)")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)

RNG = np.random.default_rng(5)


def ring(count: int) -> tuple[str, list[str]]:
    """``L = sum[a0,...](A0[a0,a1] A1[a1,a2] ... A{n-1}[a{n-1},a0])`` and its factor names."""
    indices = [f"a{k}" for k in range(count)]
    factors = " ".join(f"A{k}[{indices[k]},{indices[(k + 1) % count]}]" for k in range(count))
    return f"L = sum[{','.join(indices)}]({factors})", [f"A{k}" for k in range(count)]


def grid(rows: int, columns: int) -> tuple[str, dict[str, int]]:
    """A closed rows x columns tensor network (a PEPS-like grid), each tensor with one index per bond."""
    factors, ranks = [], {}
    for i in range(rows):
        for j in range(columns):
            legs = []
            if i > 0:
                legs.append(f"v{i - 1}_{j}")
            if i < rows - 1:
                legs.append(f"v{i}_{j}")
            if j > 0:
                legs.append(f"h{i}_{j - 1}")
            if j < columns - 1:
                legs.append(f"h{i}_{j}")
            factors.append(f"T{i}{j}[{','.join(legs)}]")
            ranks[f"T{i}{j}"] = len(legs)
    return "L = " + " ".join(factors), ranks


@pytest.mark.parametrize("count", [3, 12, 50])
def test_ring_gradient_by_every_factor_costs_at_most_three_forwards(count: int) -> None:
    text, names = ring(count)
    forward = ef.compile(text)
    gradient = ef.grad(text, wrt=names)
    shapes = {name: (16, 16) for name in names}
    ratio = gradient.plan(**shapes).flops / forward.plan(**shapes).flops
    assert ratio <= 3.0, ratio  # factor by factor it was ~count x (12x at 12, 50x at 50)
    if count <= 12:
        # values: d trace(A0 ... An-1) / d Ak = (A{k+1} ... A{k-1})^T
        arrays = {name: RNG.normal(size=(3, 3)) for name in names}
        got = gradient(**arrays)
        for k in range(count):
            rest = np.eye(3)
            for other in names[k + 1:] + names[:k]:
                rest = rest @ arrays[other]
            np.testing.assert_allclose(got[k], rest.T, rtol=1e-10, atol=1e-12)


def test_ring_gradient_shares_named_partial_products_and_reparses() -> None:
    text, names = ring(6)
    gradient = ef.grad(text, wrt=names)
    printed = str(gradient)
    assert "t1[" in printed and "dL_dt" in printed  # partial products and their adjoints, by name
    arrays = {name: RNG.normal(size=(2, 2)) for name in names}
    again = ef.compile(printed)
    for got, expected in zip(again(**arrays), gradient(**arrays)):
        np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("bond", [8, 16])
def test_grid_gradient_by_every_tensor_costs_at_most_three_forwards(bond: int) -> None:
    text, ranks = grid(4, 4)
    forward = ef.compile(text)
    gradient = ef.grad(text, wrt=list(ranks))
    shapes = {name: (bond,) * rank for name, rank in ranks.items()}
    derivative = gradient.plan(**shapes).flops
    assert derivative <= 3.0 * forward.plan(optimize="dp", **shapes).flops
    assert derivative <= 3.0 * forward.plan(**shapes).flops  # the default ("auto": greedy at 16 tensors)


def test_grid_gradient_values_match_jax() -> None:
    text, ranks = grid(3, 3)
    arrays = {name: RNG.normal(size=(2,) * rank) for name, rank in ranks.items()}
    names = list(ranks)
    equation = ef.compile(text)

    def value(*tensors):  # noqa: ANN002, ANN202 - the same contraction in jnp
        return jnp.einsum(_einsum_equation(text), *tensors)

    expected = jax.grad(value, argnums=tuple(range(len(names))))(*(arrays[n] for n in names))
    got = ef.grad(text, wrt=names)(**arrays)
    np.testing.assert_allclose(equation(**arrays), value(*(arrays[n] for n in names)), rtol=1e-12)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def _einsum_equation(text: str) -> str:
    """numpy's equation for a product statement ``L = A[i,j] B[j,k] ...`` (full contraction)."""
    import re

    letters: dict[str, str] = {}
    operands = []
    for indices in re.findall(r"\[([^\]]*)\]", text):
        operands.append("".join(letters.setdefault(i, chr(ord("a") + len(letters))) for i in indices.split(",")))
    return ",".join(operands) + "->"


def test_hessian_and_hvp_through_a_split_product_match_jax() -> None:
    text = "N = sum[a,b,c,d](A[a,b] B[b,c] A[c,d] C[d,a])\nL = N sin(N)"
    arrays = {"A": RNG.normal(size=(2, 2)), "B": RNG.normal(size=(2, 2)), "C": RNG.normal(size=(2, 2))}

    def value(A, B, C):  # noqa: ANN001, ANN202
        n = jnp.trace(A @ B @ A @ C)
        return n * jnp.sin(n)

    hessian = ef.hessian(text, wrt=["A", "B", "C"])(**arrays)
    expected = jax.hessian(value, argnums=(0, 1, 2))(arrays["A"], arrays["B"], arrays["C"])
    for k, block in enumerate(hessian):
        np.testing.assert_allclose(block, expected[k // 3][k % 3], rtol=1e-9, atol=1e-12)
    tangents = {"T_A": RNG.normal(size=(2, 2)), "T_B": RNG.normal(size=(2, 2)), "T_C": RNG.normal(size=(2, 2))}
    rows = ef.hvp(text, wrt=["A", "B", "C"])(**arrays, **tangents)
    for k, row in enumerate(rows):
        want = sum(np.tensordot(expected[k][j], tangents[f"T_{n}"], axes=2) for j, n in enumerate("ABC"))
        np.testing.assert_allclose(row, want, rtol=1e-9, atol=1e-12)


def test_value_and_grad_costs_little_more_than_grad() -> None:
    logistic = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"
    shapes = {"X": (2000, 1000), "y": (2000,), "w": (1000,)}
    both = ef.value_and_grad(logistic, wrt="w")
    assert both.plan(**shapes).flops <= 1.1 * ef.grad(logistic, wrt="w").plan(**shapes).flops  # was 1.5x
    X, y, w = RNG.normal(size=(20, 5)), np.sign(RNG.normal(size=20)), RNG.normal(size=5)
    value, gradient = both(X=X, y=y, w=w)
    z = -y * (X @ w)
    np.testing.assert_allclose(value, np.sum(np.logaddexp(0, z)), rtol=1e-12)
    np.testing.assert_allclose(gradient, X.T @ (-y / (1 + np.exp(-z))), rtol=1e-10)
    text, names = ring(12)
    square = {name: (16, 16) for name in names}
    ring_both = ef.value_and_grad(text, wrt=names).plan(**square).flops
    assert ring_both <= 1.1 * ef.grad(text, wrt=names).plan(**square).flops


def mlp(depth: int) -> str:
    lines = ["h1[i] = tanh(W1[i,j] x[j])"]
    lines += [f"h{k}[i] = tanh(W{k}[i,j] h{k - 1}[j])" for k in range(2, depth + 1)]
    return "\n".join(lines + [f"L = sum[i](h{depth}[i]^2)"])


def test_deep_mlp_hessian_text_grows_linearly() -> None:
    lengths = {depth: len(str(ef.hessian(mlp(depth), wrt="W1"))) for depth in (8, 16, 32)}
    # naming the tangents that contract a chain: 2044, 4501, 9349 characters (was 2332, 6715, 21179 ~ k^1.5)
    assert lengths[32] / lengths[16] < 2.3 and lengths[16] / lengths[8] < 2.3, lengths
    assert lengths[32] < 12_000, lengths


def test_mlp_hessian_matches_jax() -> None:
    sizes = (3, 4, 3, 2)
    arrays = {"x": RNG.normal(size=sizes[0])}
    for k in range(1, 4):
        arrays[f"W{k}"] = RNG.normal(size=(sizes[k], sizes[k - 1]))

    def value(W1):  # noqa: ANN001, ANN202
        h = jnp.tanh(W1 @ arrays["x"])
        h = jnp.tanh(arrays["W2"] @ h)
        return jnp.sum(jnp.tanh(arrays["W3"] @ h) ** 2)

    got = ef.hessian(mlp(3), wrt="W1")(**arrays)
    np.testing.assert_allclose(got, jax.hessian(value)(arrays["W1"]), rtol=1e-9, atol=1e-12)
