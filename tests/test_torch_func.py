"""einflow inside torch.func and jax's transforms: one matrix of transforms against the framework itself.

Each program is written twice, in einflow and in plain torch / jax.numpy; every transform of the einflow
call must equal the same transform of the plain function (float64, rtol 1e-9). The einflow side
differentiates with einflow's derivative programs (``vjp``/``jvp``) and batches with
``batched_program``: the tests check that those were used, not the framework's tape of the forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import func

import einflow as ef
from einflow.frameworks import batched_program, jvp_program, vjp_program

F64 = torch.float64


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed + 13 * sum(shape)), dtype=F64)


# (einflow text, the same function in torch, shapes of the inputs in order; the first input is differentiated)
CASES: dict[str, tuple[str, Callable[..., Any], dict[str, tuple[int, ...]]]] = {
    "mlp loss": ("L = sum[n]((tanh(X[n,i] W[i,h]) v[h] - y[n])^2)",
                 lambda W, X, v, y: ((torch.tanh(X @ W) @ v - y) ** 2).sum(),
                 {"W": (3, 4), "X": (5, 3), "v": (4,), "y": (5,)}),
    "softmax cross-entropy": ("L = -t[c] log_softmax[c](A[c,k] x[k])",
                              lambda x, A, t: -(t * torch.log_softmax(A @ x, 0)).sum(),
                              {"x": (4,), "A": (3, 4), "t": (3,)}),
    "vector output": ("y[i] = exp(A[i,j] x[j]) + x[i]^3",
                      lambda x, A: torch.exp(A @ x) + x ** 3,
                      {"x": (3,), "A": (3, 3)}),
    "two statements": ("h[k] = tanh(W[k,i] x[i])\nz = v[k] h[k] + c\nL = (z - t)^2",
                       lambda x, W, v, c, t: ((v @ torch.tanh(W @ x) + c - t) ** 2),
                       {"x": (3,), "W": (4, 3), "v": (4,), "c": (), "t": ()}),
}


def _functions(case: str) -> tuple[Callable[..., Any], Callable[..., Any], list[torch.Tensor]]:
    text, plain, shapes = CASES[case]
    program = ef.compile(text)
    names = list(shapes)

    def einflow(*arrays: torch.Tensor) -> Any:
        return program(dict(zip(names, arrays)))

    return einflow, plain, [rand(*shape, seed=k) for k, shape in enumerate(shapes.values())]


def _scalar(case: str) -> bool:
    return case != "vector output"


TRANSFORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "grad": func.grad,
    "jacrev": func.jacrev,
    "jacfwd": func.jacfwd,
    "hessian": func.hessian,
    "jacfwd(jacfwd)": lambda f: func.jacfwd(func.jacfwd(f)),
    "grad argnums=(0,1)": lambda f: func.grad(f, argnums=(0, 1)),
    "hessian argnums=(0,1)": lambda f: func.hessian(f, argnums=(0, 1)),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("case", list(CASES))
def test_torch_func_transform_equals_plain_torch(case: str, transform: str) -> None:
    einflow, plain, arrays = _functions(case)
    if transform.startswith("grad") and not _scalar(case):
        pytest.skip("grad needs a scalar function")
    got, want = TRANSFORMS[transform](einflow)(*arrays), TRANSFORMS[transform](plain)(*arrays)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_torch_func_jvp_and_vjp(case: str) -> None:
    einflow, plain, arrays = _functions(case)
    tangents = tuple(rand(*a.shape, seed=50 + k) for k, a in enumerate(arrays))
    (value, tangent), (want_value, want_tangent) = func.jvp(einflow, tuple(arrays), tangents), \
        func.jvp(plain, tuple(arrays), tangents)
    torch.testing.assert_close(value, want_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tangent, want_tangent, rtol=1e-9, atol=1e-12)
    value, pull = func.vjp(einflow, *arrays)
    _, want_pull = func.vjp(plain, *arrays)
    cotangent = torch.ones_like(value)
    for got, want in zip(pull(cotangent), want_pull(cotangent)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_vmap_over_the_batch_of_every_input(case: str) -> None:
    einflow, plain, arrays = _functions(case)
    batch = [torch.stack([a + 0.1 * k for k in range(4)], dim=min(1, a.dim())) for a in arrays]
    in_dims = tuple(min(1, a.dim()) for a in arrays)  # a batch axis that is not the first, where there is room
    got = func.vmap(einflow, in_dims=in_dims)(*batch)
    want = func.vmap(plain, in_dims=in_dims)(*batch)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_per_example_gradients_vmap_of_grad() -> None:
    """Per-example gradients: vmap(grad(loss)) over examples, parameters shared, as in torch's tutorial."""
    text, plain, _ = CASES["two statements"]
    program = ef.compile(text)
    params = (rand(4, 3, seed=1), rand(4, seed=2), rand(seed=3))
    xs, ts = rand(8, 3, seed=4), rand(8, seed=5)

    def einflow(W: Any, v: Any, c: Any, x: Any, t: Any) -> Any:
        return program(x=x, W=W, v=v, c=c, t=t)

    def reference(W: Any, v: Any, c: Any, x: Any, t: Any) -> Any:
        return plain(x, W, v, c, t)

    per_example = func.vmap(func.grad(einflow, argnums=(0, 1, 2)), in_dims=(None, None, None, 0, 0))
    want = func.vmap(func.grad(reference, argnums=(0, 1, 2)), in_dims=(None, None, None, 0, 0))
    for got, expected in zip(per_example(*params, xs, ts), want(*params, xs, ts)):
        assert got.shape[0] == 8
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    # and the Hessian of each example (vmap of hessian), jacobians of a batch of vector functions
    hessians = func.vmap(func.hessian(einflow), in_dims=(None, None, None, 0, 0))(*params, xs, ts)
    torch.testing.assert_close(hessians, func.vmap(func.hessian(reference), in_dims=(None, None, None, 0, 0))(
        *params, xs, ts), rtol=1e-9, atol=1e-12)


def test_per_example_gradients_run_one_batched_gradient_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under vmap(grad) nothing differentiates the gradients again: all of them come from one VJP program
    (several results), batched by an index, instead of one program per parameter."""
    import einflow.frameworks.torch_autograd as torch_autograd

    text, plain, _ = CASES["two statements"]
    program = ef.compile(text)
    W, v, xs, ts = rand(4, 3, seed=1), rand(4, seed=2), rand(6, 3, seed=4), rand(6, seed=5)
    batched: list[Any] = []

    def recording(program: Any, names: tuple[str, ...]) -> Any:  # a spy on the real function
        batched.append(program)
        return batched_program(program, names)

    monkeypatch.setattr(torch_autograd, "batched_program", recording)
    got = func.vmap(func.grad(lambda W, v, x, t: program(x=x, W=W, v=v, c=0.5, t=t), argnums=(0, 1)),
                    in_dims=(None, None, 0, 0))(W, v, xs, ts)
    want = func.vmap(func.grad(lambda W, v, x, t: plain(x, W, v, 0.5, t), argnums=(0, 1)),
                     in_dims=(None, None, 0, 0))(W, v, xs, ts)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    vjp, _ = vjp_program(program, ("W", "v"))
    assert batched == [program, vjp] and vjp.info.returns_tuple  # the loss, then both gradients in one program


def test_a_gradient_taken_by_torch_func_on_tensors_that_require_grad_stays_differentiable() -> None:
    """grad(f)(x) with x requiring grad (plain autograd outside torch.func): the gradient is differentiated
    again by .backward(), so it must stay a graph of einflow nodes (one VJP program per input)."""
    program = ef.compile("L = sum[n](exp(X[n,i] w[i]) b)")
    X, w, b = rand(5, 3), rand(3).requires_grad_(), rand().requires_grad_()
    gw, gb = func.grad(lambda w, b: program(X=X, w=w, b=b), argnums=(0, 1))(w, b)
    (gw.sum() + gb).backward()
    w0, b0 = w.detach(), b.detach()
    hw, hb = torch.autograd.functional.hessian(lambda w, b: (torch.exp(X @ w) * b).sum(), (w0, b0))
    torch.testing.assert_close(w.grad, hw[0].sum(0) + hb[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(b.grad, hw[1].sum(0) + hb[1], rtol=1e-9, atol=1e-12)


def test_vmap_of_a_program_with_several_results() -> None:
    program = ef.compile("a[i] = tanh(A[i,j] x[j])\nb = sum[i](a[i]^2) + c\na, b")
    A, xs, c = rand(3, 4), rand(5, 4), rand()
    a, b = func.vmap(lambda x: program(A=A, x=x, c=c))(xs)
    torch.testing.assert_close(a, torch.tanh(xs @ A.T))
    torch.testing.assert_close(b, (torch.tanh(xs @ A.T) ** 2).sum(1) + c)
    # a result that does not depend on the batch comes back broadcast
    a, k = func.vmap(lambda x: ef.compile("a[i] = 2 x[i]\nk = 3 c\na, k")(x=x, c=c))(xs)
    torch.testing.assert_close(k, (3 * c).expand(5))


def test_the_torch_func_example() -> None:
    """examples/torch_func.py: per-example gradients (clipped) and a Hessian equal plain torch.func's."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "torch_func.py"
    spec = importlib.util.spec_from_file_location("example_torch_func", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    errors = module.main()
    assert errors["gradient_error"] < 1e-12 and errors["hessian_error"] < 1e-12


def test_nested_vmap_and_an_unbatched_result() -> None:
    program = ef.compile("y[i] = A[i,j] x[j]\ns = sum[i](c[i])")
    A, x, c = rand(2, 5, 3, 3), rand(5, 3), rand(3)

    def einflow(A: Any, x: Any) -> Any:
        return ef.compile("y[i] = A[i,j] x[j]")(A=A, x=x)

    got = func.vmap(func.vmap(einflow, in_dims=(0, 0)), in_dims=(0, None))(A, x)
    torch.testing.assert_close(got, torch.einsum("abij,bj->abi", A, x))
    # a result that does not depend on the batched input is not batched by einflow: torch broadcasts it
    summed = func.vmap(lambda A: program(A=A, x=x[0], c=c), in_dims=0)(A[0])
    torch.testing.assert_close(summed, c.sum().expand(5))


def test_the_derivatives_and_batches_are_einflows() -> None:
    program = ef.compile("L = sum[n](exp(X[n,i] w[i]))")
    X, w = rand(6, 3), rand(3)
    before = (vjp_program.cache_info().misses, jvp_program.cache_info().misses, batched_program.cache_info().misses)
    gradient = func.grad(lambda w: program(X=X, w=w))(w)
    hessian = func.hessian(lambda w: program(X=X, w=w))(w)
    per_row = func.vmap(func.grad(lambda w, x: program(X=x[None], w=w)), in_dims=(None, 0))(w, X)
    after = (vjp_program.cache_info().misses, jvp_program.cache_info().misses, batched_program.cache_info().misses)
    assert all(b > a for a, b in zip(before, after)), (before, after)  # each kind of program was derived
    weights = torch.exp(X @ w)
    torch.testing.assert_close(gradient, X.T @ weights)
    torch.testing.assert_close(hessian, X.T @ (weights[:, None] * X))
    torch.testing.assert_close(per_row, weights[:, None] * X)


def test_plain_backward_still_fuses_value_and_gradient() -> None:
    """A loss's .backward() (no torch.func) keeps the fused value-and-gradient pass of the training step."""
    program = ef.compile("L = sum[n]((X[n,i] w[i] - y[n])^2)")
    X, y, w = rand(5, 2), rand(5), rand(2).requires_grad_()
    loss = program(X=X, w=w, y=y)
    loss.backward()
    torch.testing.assert_close(w.grad, 2 * X.T @ (X @ w.detach() - y))
    (fused,) = [v for key, v in next(iter(program._plans.values())).derived.items() if key[0] == "value_and_grad"]
    assert fused is not None


def test_batched_program_keeps_unbatched_statements_and_names_a_bare_value() -> None:
    program, carries = batched_program(ef.compile("k = 2 c\ny[i] = k x[i]"), ("x",))
    assert str(program) == "k = 2 c\ny[batch,i] = k x[batch,i]" and carries == (True,)
    program, carries = batched_program(ef.compile("x[j] A[i,j]"), ("A",))
    assert program.info.targets["value"] == ("batch", "j", "i") or program.info.targets["value"][0] == "batch"
    program, carries = batched_program(ef.compile("y[batch] = x[batch]\nz = sum[batch](y[batch])"), ("x",))
    assert "batch1" in str(program) and carries == (True,)
    program, carries = batched_program(ef.compile("a[i] = 2 x[i]\nb = 3 c\na, b"), ("x",))
    assert carries == (True, False)


# ------------------------------------------------------------------------------------------------ jax
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)

JAX_PLAIN: dict[str, Callable[..., Any]] = {
    "mlp loss": lambda W, X, v, y: ((jnp.tanh(X @ W) @ v - y) ** 2).sum(),
    "softmax cross-entropy": lambda x, A, t: -(t * jax.nn.log_softmax(A @ x)).sum(),
    "vector output": lambda x, A: jnp.exp(A @ x) + x ** 3,
    "two statements": lambda x, W, v, c, t: (v @ jnp.tanh(W @ x) + c - t) ** 2,
}

JAX_TRANSFORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "grad": jax.grad, "jacrev": jax.jacrev, "jacfwd": jax.jacfwd, "hessian": jax.hessian,
}


# jax traces each transform anew (seconds per case on a busy machine): each row once, on a scalar loss of two
# statements or on a vector result; tests/test_jax.py has more programs under jax.jit
JAX_ROWS = [("two statements", "grad"), ("two statements", "hessian"), ("two statements", "vmap(grad)"),
            ("vector output", "jacrev"), ("vector output", "jacfwd"), ("vector output", "jvp"),
            ("vector output", "vmap")]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "transform"), JAX_ROWS)
def test_jax_transform_equals_plain_jax(case: str, transform: str) -> None:
    import numpy as np

    text, _, shapes = CASES[case]
    program = ef.compile(text)
    names = list(shapes)
    arrays = [jnp.asarray(rand(*shape, seed=k).numpy()) for k, shape in enumerate(shapes.values())]

    def einflow(*values: Any) -> Any:
        return program(dict(zip(names, values)))

    plain = JAX_PLAIN[case]
    if transform == "jvp":
        tangents = tuple(jnp.ones_like(a) for a in arrays)
        got, want = jax.jvp(einflow, tuple(arrays), tangents), jax.jvp(plain, tuple(arrays), tangents)
    elif transform.startswith("vmap"):
        batch = [jnp.stack([a + 0.1 * k for k in range(3)]) for a in arrays]
        inner = (lambda f: jax.grad(f)) if transform == "vmap(grad)" else (lambda f: f)
        got, want = jax.vmap(inner(einflow))(*batch), jax.vmap(inner(plain))(*batch)
    else:
        got, want = JAX_TRANSFORMS[transform](einflow)(*arrays), JAX_TRANSFORMS[transform](plain)(*arrays)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-12)
