"""float16 and bfloat16 on numpy (bfloat16 through ml_dtypes), torch and jax: results in the input's type,
contractions and reductions accumulated in float32 (as torch and jax accumulate them), gradients in the
input's type; ``ef.einsum``'s jax lowering (one ``dot_general`` per pairwise step, no needless transposes or
converts) and its ``preferred_element_type=``.

References: float64 computations on the low-precision inputs (numpy), numpy's own result types, and
``jax.make_jaxpr`` of the jax path (the checks of jax's own tests/lax_numpy_einsum_test.py, rewritten for
``ef.einsum``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import einflow as ef

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
#: the spacing of 1.0 in each type: a result rounded once is within half of it, relatively
EPS = {"float16": float(np.finfo(np.float16).eps), "bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)}


def _on(library: str, value: np.ndarray, name: str) -> Any:
    """``value`` (float64) rounded to the low type ``name`` as an array of ``library``."""
    if library == "torch":
        return torch.tensor(value, dtype=getattr(torch, name))
    if library == "jax":
        return jnp.asarray(value, dtype=jnp.dtype(name))
    return value.astype(BF16 if name == "bfloat16" else F16)


def _host(value: Any) -> np.ndarray:
    """A result as float64 numpy (torch bfloat16 has no numpy counterpart: through float32, exactly)."""
    if isinstance(value, torch.Tensor):
        return value.detach().float().numpy().astype(np.float64)
    return np.asarray(np.asarray(value).astype(np.float32), dtype=np.float64)


def _dtype_name(value: Any) -> str:
    return str(value.dtype).removeprefix("torch.")


CASES = [(library, name) for library in ("numpy", "torch", "jax") for name in ("float16", "bfloat16")]


# ------------------------------------------------------------------------------------------ programs
@pytest.mark.parametrize(("library", "name"), CASES)
def test_a_dot_product_of_4096_ones_is_4096_in_low_precision(library: str, name: str) -> None:
    # summed in bfloat16 the running sum stops at 256 (float16: 2048); in float32 it is exact
    ones = _on(library, np.ones(4096), name)
    dot = ef.compile("s = x[i] y[i]")(x=ones, y=ones)
    total = ef.compile("s = sum[i](x[i])")(x=ones)
    for result in (dot, total):
        assert _dtype_name(result) == name
        assert float(_host(result)) == 4096.0


def test_a_chunked_float16_sum_on_dask_is_float16_and_exact() -> None:
    import dask.array as da

    ones = da.ones(4096, chunks=1024, dtype=np.float16)
    lazy = ef.compile("s = sum[i](x[i] x[i])")(x=ones)
    assert isinstance(lazy, da.Array) and lazy.dtype == np.float16
    assert float(lazy.compute()) == 4096.0
    computed = ef.compile("s = sum[i](x[i])")(x=np.ones(4096, np.float16), backend="dask", chunks=512)
    assert computed.dtype == np.float16 and float(computed) == 4096.0


@pytest.mark.parametrize(("library", "name"), CASES)
def test_a_low_precision_program_matches_float64_within_one_rounding(library: str, name: str) -> None:
    rng = np.random.default_rng(0)
    X, w, b = rng.standard_normal((40, 300)), rng.standard_normal(300), rng.standard_normal(40)
    arrays = {"X": _on(library, X, name), "w": _on(library, w, name), "b": _on(library, b, name)}
    exact = {key: _host(value) for key, value in arrays.items()}  # the rounded inputs, in float64
    reference = np.tanh(exact["X"] @ exact["w"] / 20) + exact["b"]
    result = ef.compile("y[n] = tanh(X[n,i] w[i] / 20) + b[n]")(**arrays)
    assert _dtype_name(result) == name
    # float32 work, then one rounding: half a unit in the last place of the result's type, and float32's error
    np.testing.assert_allclose(_host(result), reference, rtol=EPS[name], atol=1e-5)


def test_low_precision_result_types_follow_numpy() -> None:
    program = ef.compile("z[i] = x[i] y[i]")
    half = np.ones(3, np.float16)
    for other in (np.ones(3, np.int8), np.ones(3, np.int16), np.ones(3, np.float32)):
        assert program(x=half, y=other).dtype == np.result_type(half, other)
    # booleans are the int64 numbers 0 and 1 in programs (docs/backends.md), with float16 as with float32
    flags = np.ones(3, bool)
    assert program(x=half, y=flags).dtype == program(x=half.astype(np.float32), y=flags).dtype
    # bfloat16 promotes as ml_dtypes (and jax) promote it: with int8 it stays, with float16 it is float32
    brain = np.ones(3, BF16)
    assert program(x=brain, y=np.ones(3, np.int8)).dtype == BF16
    assert program(x=brain, y=half).dtype == np.result_type(brain, half) == np.float32
    assert program(x=torch.ones(3, dtype=torch.bfloat16), y=torch.ones(3, dtype=torch.float16)).dtype == \
        torch.float32
    # an integer-only output stays integer: x[i]^2 of int8
    assert ef.compile("z[i] = k[i]^2 + 0 x[i]")(k=np.ones(3, np.int8), x=half).dtype == np.float16


# ------------------------------------------------------------------------------------------ gradients
LOSS = "L = sum[n]((X[n,i] w[i] - y[n])^2)"


def _loss_grad(X: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 2 * X.T @ (X @ w - y)


def _inputs(library: str, name: str) -> tuple[Any, Any, Any, np.ndarray]:
    rng = np.random.default_rng(1)
    X, w, y = (_on(library, value, name) for value in (rng.standard_normal((6, 3)), rng.standard_normal(3),
                                                        rng.standard_normal(6)))
    return X, w, y, _loss_grad(_host(X), _host(w), _host(y))


def _close_in(name: str, got: Any, reference: np.ndarray) -> None:
    np.testing.assert_allclose(_host(got), reference, rtol=EPS[name], atol=EPS[name] * np.abs(reference).max())


@pytest.mark.parametrize(("library", "name"), CASES)
def test_the_gradient_program_of_a_low_precision_loss_comes_back_in_its_type(library: str, name: str) -> None:
    X, w, y, reference = _inputs(library, name)
    gradient = ef.grad(LOSS, wrt="w")(X=X, w=w, y=y)
    assert _dtype_name(gradient) == name
    _close_in(name, gradient, reference)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_torch_autograd_of_a_low_precision_program_gives_grads_in_its_type(name: str) -> None:
    X, w, y, reference = _inputs("torch", name)
    w.requires_grad_(True)
    loss = ef.compile(LOSS)(X=X, w=w, y=y)
    assert loss.dtype == getattr(torch, name)
    loss.backward()
    assert w.grad is not None and w.grad.dtype == getattr(torch, name)
    _close_in(name, w.grad, reference)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_jax_grad_of_a_low_precision_program_is_in_its_type(name: str) -> None:
    X, w, y, reference = _inputs("jax", name)
    program = ef.compile(LOSS)
    gradient = jax.jit(jax.grad(lambda w_: program(X=X, w=w_, y=y)))(w)
    assert gradient.dtype == jnp.dtype(name)
    _close_in(name, gradient, reference)


# ------------------------------------------------------------------------------------------ ef.einsum
@pytest.mark.parametrize(("library", "name"), CASES)
def test_einsum_of_low_precision_arrays_accumulates_in_float32(library: str, name: str) -> None:
    ones = _on(library, np.ones((3, 4096)), name)
    rows = ef.einsum("ij->i", ones)
    dots = ef.einsum("ij,kj->ik", ones, ones)
    for result in (rows, dots):
        assert _dtype_name(result) == name
        assert (_host(result) == 4096.0).all()


def test_einsum_of_numpy_float16_matches_float64_within_one_rounding() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((30, 200)).astype(np.float16), rng.standard_normal((200, 20)).astype(np.float16)
    result = ef.einsum("ij,jk->ik", a, b)
    assert result.dtype == np.float16
    reference = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(result.astype(np.float64), reference, rtol=EPS["float16"], atol=1e-3)


def test_einsum_moves_numpy_bfloat16_without_arithmetic() -> None:
    a = np.arange(12.0).reshape(3, 4).astype(BF16)
    transposed = ef.einsum("ij->ji", a)
    assert transposed.dtype == BF16 and np.array_equal(transposed.astype(np.float32), a.T.astype(np.float32))
    square = np.arange(9.0).reshape(3, 3).astype(BF16)
    assert ef.einsum("ii->i", square).astype(np.float32).tolist() == [0.0, 4.0, 8.0]
    widened = ef.einsum("ij->ji", a, preferred_element_type=np.float32)
    assert widened.dtype == np.float32 and np.array_equal(widened, a.T.astype(np.float32))
    narrowed = ef.einsum("ij->ji", a.astype(np.float32), dtype=np.float16, casting="same_kind")
    assert narrowed.dtype == np.float16 and np.array_equal(narrowed, a.T.astype(np.float16))


@pytest.mark.parametrize("library", ["numpy", "torch", "jax"])
def test_einsum_preferred_element_type_is_the_result_type(library: str) -> None:
    ones = _on(library, np.ones(4096), "bfloat16")
    result = ef.einsum("i,i->", ones, ones, preferred_element_type=np.float32)
    assert _dtype_name(result) == "float32" and float(_host(result)) == 4096.0
    singles = {"numpy": np.ones(5, np.float32), "torch": torch.ones(5), "jax": jnp.ones(5, jnp.float32)}[library]
    narrowed = ef.einsum("i,i->", singles, singles, preferred_element_type="float16")
    assert _dtype_name(narrowed) == "float16" and float(_host(narrowed)) == 5.0


def test_einsum_preferred_element_type_that_is_no_dtype_is_an_argument_error() -> None:
    with pytest.raises(ef.EinflowError, match="preferred_element_type"):
        ef.einsum("i,i->", np.ones(2), np.ones(2), preferred_element_type="floaty")
    with pytest.raises(ef.EinflowError, match="preferred_element_type"):
        ef.einsum("i,i->", np.ones(2), np.ones(2), preferred_element_type=str)


# ------------------------------------------------------------------------------------------ the jax lowering
def _primitives(function: Callable[..., Any], *arrays: Any) -> tuple[list[str], Any]:
    jaxpr = jax.make_jaxpr(function)(*arrays)
    return [equation.primitive.name for equation in jaxpr.eqns], jaxpr


def test_ef_einsum_on_jax_has_no_unnecessary_transpose() -> None:
    names, _ = _primitives(partial(ef.einsum, "ijk,kl->ijl"), jnp.ones((2, 2, 2)), jnp.ones((2, 2)))
    assert names == ["dot_general"]


def test_ef_einsum_on_jax_is_one_dot_general_per_pairwise_step() -> None:
    arrays = [jnp.ones(shape) for shape in [(3, 4), (4, 5), (5, 6), (6, 2)]]
    names, _ = _primitives(partial(ef.einsum, "ij,jk,kl,lm->im"), *arrays)
    assert names == ["dot_general"] * 3


def test_ef_einsum_preferred_element_type_is_the_dot_generals() -> None:
    x, y = jnp.ones((2, 2), jnp.bfloat16), jnp.ones(2, jnp.bfloat16)
    names, jaxpr = _primitives(partial(ef.einsum, "ij,j->i"), x, y)
    assert names == ["dot_general"]
    assert jaxpr.eqns[0].params["preferred_element_type"] == jnp.bfloat16
    names, jaxpr = _primitives(partial(ef.einsum, "ij,j->i", preferred_element_type="float32"), x, y)
    assert names == ["dot_general"]
    assert jaxpr.eqns[0].params["preferred_element_type"] == np.float32
    assert jaxpr.out_avals[0].dtype == np.float32


MIXED = ["bool", "int8", "int32", "uint8", "float16", "bfloat16", "float32", "float64", "complex64"]


@pytest.mark.parametrize("lhs", MIXED)
@pytest.mark.parametrize("rhs", ["int8", "float16", "bfloat16", "float32", "complex64"])
def test_ef_einsum_mixed_precision_on_jax_converts_nothing_before_the_dot(lhs: str, rhs: str) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(10) * 3).astype(np.float32)
    a, b = jnp.asarray(x, dtype=jnp.dtype(lhs)), jnp.asarray(x[::-1].copy(), dtype=jnp.dtype(rhs))
    function = partial(ef.einsum, "a,a->a")
    names, _ = _primitives(function, a, b)
    assert names in (["dot_general"], ["dot_general", "convert_element_type"], ["dot_general", "ne"])
    result = function(a, b)
    # numpy's rule (bfloat16 is ml_dtypes' type, which numpy promotes)
    expected = np.einsum("a,a->a", np.asarray(a).astype(np.complex128), np.asarray(b).astype(np.complex128))
    common = np.result_type(np.asarray(a), np.asarray(b))
    assert result.dtype == jax.dtypes.canonicalize_dtype(common)
    if common == np.bool_:
        assert np.array_equal(np.asarray(result), expected != 0)
    else:
        eps = EPS["bfloat16"] if common == BF16 else float(np.finfo(common).eps) if common.kind in "fc" else 0.0
        np.testing.assert_allclose(np.asarray(result).astype(np.complex128), expected, rtol=eps, atol=eps * 10)
