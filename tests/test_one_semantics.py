"""One answer on every backend (issue 28): each reproducer of a silent difference or a raw error, as a test.

References are numpy's own results (numpy.einsum, numpy ufuncs) or closed forms; every backend that is
installed is checked (numpy, torch, jax, dask).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import einflow as ef

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
da = pytest.importorskip("dask.array")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

BACKENDS = ("numpy", "torch", "jax", "dask")


def native(value: Any, backend: str) -> Any:
    """A numpy array as the backend's own array (Python numbers stay as they are)."""
    if not isinstance(value, np.ndarray):
        return value
    if backend == "torch":
        return torch.from_numpy(value)
    if backend == "jax":
        return jnp.asarray(value)
    if backend == "dask":
        return da.from_array(value, chunks=2)
    return value


def host(value: Any) -> np.ndarray:
    """A result as a numpy array (computed, copied off its library)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if hasattr(value, "compute"):
        value = value.compute()
    return np.asarray(value)


def run(text: str, backend: str, **arrays: Any) -> np.ndarray:
    return host(ef.evaluate(text, **{name: native(value, backend) for name, value in arrays.items()}))


def exported(text: str, target: str, **arrays: Any) -> np.ndarray:
    """The program's ``to_source`` code for ``target``, executed standalone."""
    namespace: dict[str, Any] = {}
    exec(ef.compile(text).to_source("f", target=target), namespace)  # noqa: S102 - einflow's own output
    return host(namespace["f"](**{name: native(value, target) for name, value in arrays.items()}))


# ------------------------------------------------------------------------------------ silently different numbers
@pytest.mark.parametrize("backend", ["numpy", "torch", "dask"])  # (XLA flushes subnormals to zero: docs/backends.md)
def test_division_of_two_subnormals_is_one(backend: str) -> None:
    value = ef.evaluate("y = a / b", a=1e-310, b=1e-310) if backend == "numpy" else \
        run("y[i] = a[i] / b[i]", backend, a=np.array([1e-310]), b=np.array([1e-310]))
    assert np.all(np.asarray(value) == 1.0)
    assert ef.evaluate("y = a / b", a=1e-310, b=1e-310) == 1e-310 / 1e-310


@pytest.mark.parametrize("backend", BACKENDS)
def test_x_over_x_in_float32_near_its_largest_value_is_one(backend: str) -> None:
    x = np.array([1e38, 3.0], dtype=np.float32)
    got = run("y[i] = x[i] / x[i]", backend, x=x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, x / x)


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
def test_exported_division_is_division(target: str) -> None:
    x = np.array([1e38, 3.0], dtype=np.float32)
    np.testing.assert_array_equal(exported("y[i] = x[i] / x[i]", target, x=x), [1.0, 1.0])
    if target != "jax":  # XLA flushes subnormals to zero
        assert float(exported("y = a / b", target, a=1e-310, b=1e-310)) == 1.0


def test_exported_division_of_python_numbers_by_zero_is_numpy_s() -> None:
    with np.errstate(all="ignore"):
        for a, b in ((1.0, 0.0), (-1.0, 0.0), (1.0, -0.0), (0.0, 0.0)):
            want = np.float64(a) / np.float64(b)
            got = exported("y = a / b", "numpy", a=a, b=b)
            assert np.array_equal(got, want, equal_nan=True), (a, b, got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_at_1e17_is_one_half(backend: str) -> None:
    got = run("y[i] = softmax[i](x[i])", backend, x=np.array([1e17, 1e17]))
    np.testing.assert_array_equal(got, [0.5, 0.5])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 1e308 - (-1e308), as in numpy
@pytest.mark.parametrize("backend", BACKENDS)
def test_log_softmax_at_the_largest_floats(backend: str) -> None:
    got = run("y[i] = log_softmax[i](x[i])", backend, x=np.array([1e308, 1e308, -1e308]))
    np.testing.assert_allclose(got, [-math.log(2), -math.log(2), -np.inf], rtol=1e-15)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 1e308 - (-1e308), as in numpy
@pytest.mark.parametrize("backend", BACKENDS)
def test_logsumexp_at_the_largest_floats(backend: str) -> None:
    got = run("y = logsumexp[i](x[i])", backend, x=np.array([1e308, 1e308, -1e308]))
    np.testing.assert_allclose(got, 1e308, rtol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sign_of_nan_is_nan(backend: str) -> None:
    x = np.array([np.nan, -2.0, 0.0, 3.0])
    np.testing.assert_array_equal(run("y[i] = sign(x[i])", backend, x=x), np.sign(x))


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
def test_exported_sign_of_nan_is_nan(target: str) -> None:
    x = np.array([np.nan, -2.0, 0.0, 3.0])
    np.testing.assert_array_equal(exported("y[i] = sign(x[i])", target, x=x), np.sign(x))


def test_einsum_of_jax_booleans_stays_boolean() -> None:
    got = ef.einsum("ij->i", jnp.ones((2, 3), bool))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(got), np.einsum("ij->i", np.ones((2, 3), bool)))


def test_einsum_of_torch_booleans_stays_boolean() -> None:
    got = ef.einsum("ij->ji", torch.ones(2, 3, dtype=torch.bool))
    assert got.dtype == torch.bool
    np.testing.assert_array_equal(got.numpy(), np.einsum("ij->ji", np.ones((2, 3), bool)))


def test_einsum_of_dask_booleans_stays_boolean() -> None:
    a = np.array([[True, False, False], [False, False, False]])
    got = ef.einsum("ij,ij->i", da.from_array(a, chunks=2), da.from_array(a, chunks=2))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got.compute(), np.einsum("ij,ij->i", a, a))


@pytest.mark.parametrize("backend", ["torch", "jax", "dask"])
@pytest.mark.parametrize("dtypes", [("int8", "int8"), ("int8", "float32"), ("int64", "float32"), ("uint8", "int8")])
def test_einsum_keeps_numpy_s_result_type(backend: str, dtypes: tuple[str, str]) -> None:
    a = np.arange(6).reshape(2, 3).astype(dtypes[0])
    b = np.arange(3).astype(dtypes[1])
    want = np.einsum("ij,j->i", a, b)
    got = ef.einsum("ij,j->i", native(a, backend), native(b, backend))
    assert host(got).dtype == want.dtype
    np.testing.assert_array_equal(host(got), want)


def test_einsum_of_a_masked_array_computes_as_numpy() -> None:
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    want = np.einsum("i,i->i", masked, np.ones(3))
    np.testing.assert_array_equal(ef.einsum("i,i->i", masked, np.ones(3)), want)


def test_einsum_of_masked_operands_in_a_five_operand_contraction() -> None:
    rng = np.random.default_rng(0)
    operands = [np.ma.masked_array(rng.random(3), mask=[0, 1, 0]), rng.random((3, 4)),
                np.ma.masked_array(rng.random((4, 2)), mask=rng.random((4, 2)) < 0.5), rng.random(2), rng.random(3)]
    want = np.einsum("i,ij,jk,k,i->", *operands)
    np.testing.assert_allclose(ef.einsum("i,ij,jk,k,i->", *operands), want, rtol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_programs_refuse_masked_arrays(backend: str) -> None:
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    with pytest.raises(ef.EinflowError, match="masked arrays"):
        ef.evaluate("y[i] = x[i]", x=masked, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text, dtype", [("y[i] = x[i]^0.5", "int8"), ("y[i] = 0.5 x[i]", "int64"),
                                         ("s = x[i] x[i]", "int8"), ("s = sum[i](x[i])", "uint8"),
                                         ("y[i] = x[i] / x[i]", "int16"), ("y[i] = exp(x[i])", "int32"),
                                         ("y[i] = x[i] + 2.5", "int8"), ("y[i] = maximum(x[i], 2.5)", "int64")])
def test_result_dtype_is_numpy_s_rule_on_every_backend(backend: str, text: str, dtype: str) -> None:
    x = np.arange(1, 4).astype(dtype)
    want = np.asarray(ef.evaluate(text, x=x))
    got = run(text, backend, x=x)
    assert got.dtype == want.dtype, (backend, got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_the_documented_result_types() -> None:
    # the table in docs/backends.md: fractional powers and transcendentals of integers are float64
    x = np.arange(1, 4, dtype=np.int8)
    assert ef.evaluate("y[i] = x[i]^0.5", x=x).dtype == np.float64
    assert ef.evaluate("y[i] = x[i]^1.5", x=x).dtype == np.float64
    assert ef.evaluate("y[i] = x[i] / x[i]", x=x).dtype == np.float64
    assert ef.evaluate("s = x[i] x[i]", x=x).dtype == np.int8  # a contraction keeps einsum's type
    assert ef.evaluate("s = sum[i](x[i])", x=x).dtype == np.sum(x).dtype  # a sum numpy's sum's
    assert ef.evaluate("y[i] = 0.5 x[i]", x=x.astype(np.float32)).dtype == np.float32  # numbers are weak


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_over_an_empty_index_is_a_typed_error(backend: str) -> None:
    with pytest.raises(ef.ShapeError, match="size 0"):
        run("r[j] = max[i](A[i,j])", backend, A=np.zeros((0, 3)))
    with pytest.raises(ef.ShapeError, match="size 0"):
        run("r = min[i](x[i])", backend, x=np.zeros(0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_over_a_full_axis_of_an_empty_array_is_empty(backend: str) -> None:
    got = run("r[i] = max[j](A[i,j])", backend, A=np.zeros((0, 3)))
    assert got.shape == (0,)
    np.testing.assert_array_equal(got, np.zeros((0, 3)).max(axis=1))


def test_written_out_log_softmax_cross_entropy_is_stable() -> None:
    text = "L = -sum[c](t[c] log(exp(z[c]) / sum[k](exp(z[k]))))"
    assert float(ef.evaluate(text, z=np.array([900.0, -100.0, 0.0]), t=np.array([0.0, 1.0, 0.0]))) == 1000.0
    z32 = np.array([200.0, -200.0, 0.0], np.float32)
    t32 = np.array([0.0, 1.0, 0.0], np.float32)
    value = ef.evaluate(text, z=z32, t=t32)
    gradient = ef.grad(ef.compile(text), "z")(z=z32, t=t32)
    assert np.isfinite(value) and np.all(np.isfinite(gradient))
    np.testing.assert_allclose(value, 400.0, rtol=1e-6)
    np.testing.assert_allclose(gradient, [1.0, -1.0, 0.0], atol=1e-6)  # softmax(z) - t


def test_written_out_log_softmax_is_rewritten() -> None:
    from einflow.lang import ir
    from einflow.lang.grammar import parse_expression
    from einflow.lang.stable import stabilize

    rewritten = ir.format_expr(stabilize(parse_expression("log(exp(z[c]) / sum[k](exp(z[k])))")))
    assert rewritten == "log_softmax[c](z[c])"
    assert ir.format_expr(stabilize(parse_expression("log(softmax[c](z[c]))"))) == "log_softmax[c](z[c])"


# ------------------------------------------------------------------------------------ raw errors on one backend
def test_torch_maximum_with_a_python_number() -> None:
    x = np.array([-1.0, 2.0, 3.0])
    np.testing.assert_array_equal(run("y[i] = maximum(x[i], 0)", "torch", x=x), np.maximum(x, 0))
    np.testing.assert_array_equal(run("y[i] = minimum(x[i], 2.5)", "torch", x=x), np.minimum(x, 2.5))
    np.testing.assert_array_equal(run("y[i] = maximum(x[i], 2.5)", "torch", x=x.astype(np.int64)),
                                  np.maximum(x.astype(np.int64), 2.5))


@pytest.mark.parametrize("text", ["y[i] = relu(x[i])", "y[i] = step(x[i])", "y = max[i](x[i])", "y = min[i](x[i])"])
def test_torch_relu_step_max_min_of_complex_tensors_is_a_typed_error(text: str) -> None:
    with pytest.raises(ef.EinflowError, match="cannot compute"):
        ef.evaluate(text, x=torch.tensor([1 + 1j, -1 + 0j]))


def test_torch_sign_of_complex_tensors_is_numpy_s() -> None:
    x = np.array([1 + 1j, -1 + 0j, 0j])
    np.testing.assert_allclose(run("y[i] = sign(x[i])", "torch", x=x), np.sign(x), rtol=1e-15)


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("text", ["y = s^3 x[i] x[i]", "y = relu(s) x[i] x[i]", "y = s^2 x[i] x[i]",
                                  "y = maximum(s, 1) x[i] x[i]", "y = sign(s) x[i] x[i]"])
def test_to_source_with_a_python_float_scalar_input(target: str, text: str) -> None:
    x = np.array([1.0, 0.5])
    want = ef.evaluate(text, s=0.5, x=x)
    np.testing.assert_allclose(exported(text, target, s=0.5, x=x), want, rtol=1e-15)


def test_to_source_torch_with_integer_and_float_operands_of_one_contraction() -> None:
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.linspace(0, 1, 3).astype(np.float32)
    want = ef.evaluate("y[i] = A[i,j] b[j]", A=a, b=b)
    got = exported("y[i] = A[i,j] b[j]", "torch", A=a, b=b)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_dask_erf_of_a_scalar() -> None:
    assert float(ef.evaluate("y = erf(s)", s=0.5, backend="dask")) == math.erf(0.5)
    C = np.arange(9.0).reshape(3, 3) / 10
    np.testing.assert_allclose(run("y[a] = erf(C[a,a])", "dask", C=C), [math.erf(c) for c in np.diag(C)],
                               rtol=1e-15)


def test_dask_arrays_chunked_by_2_along_a_size_3_axis() -> None:
    rng = np.random.default_rng(1)
    arrays = {"A": rng.random((3, 3)), "x": rng.random(3), "B": rng.random((3, 4))}
    for text in ("y[i] = A[i,j] x[j]", "y[j] = x[i] A[i,j] x[i]", "C[i,k] = A[i,j] B[j,k]",
                 "y[i,j] = x[i] delta[i,j]", "y[i] = A[i,i] + x[i]", "H[i,j] = A[i,j] + A[j,i]"):
        used = {k: v for k, v in arrays.items() if k + "[" in text}
        np.testing.assert_allclose(run(text, "dask", **used), ef.evaluate(text, **used), rtol=1e-14)


def test_a_tensor_called_self_by_keyword() -> None:
    assert ef.compile("y = self + 1")(self=1.0) == 2.0
    assert ef.compile("y = self + 1").plan(self=()).flops >= 0
    assert float(ef.grad(ef.compile("y = self^2"), "self")(self=3.0)) == 6.0


def test_einsum_out_of_another_type_after_an_optimized_path() -> None:
    out = np.array(0)
    want = np.einsum("i,i->", np.ones(7), np.ones(7), out=np.array(0), optimize="optimal")
    got = ef.einsum("i,i->", np.ones(7), np.ones(7), out=out, optimize="optimal")
    assert got is out and int(got) == int(want) == 7
    with pytest.raises(ef.EinflowError):  # numpy refuses this one (no optimized path)
        ef.einsum("i,i->", np.ones(7), np.ones(7), out=np.array(0), optimize=False)


def test_einsum_refuses_a_split_ellipsis() -> None:
    with pytest.raises(ValueError):
        np.einsum(". ..", np.ones(3))
    with pytest.raises(ef.SubscriptsError, match="ellipsis"):
        ef.einsum(". ..", np.ones(3))
    np.testing.assert_array_equal(ef.einsum("... ", np.ones(3)), np.einsum("... ", np.ones(3)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_contraction_of_int64_and_float32_computes_in_float64(backend: str) -> None:
    # numpy's type for int64 with float32 is float64; torch and jax alone would contract in float32
    a = (np.arange(6, dtype=np.int64).reshape(2, 3) * 10**9 + 1)
    b = np.array([0.1, 0.7, 1.3], dtype=np.float32)
    want = np.einsum("ij,j->i", a, b)
    got = run("y[i] = A[i,j] b[j]", backend, A=a, b=b)
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_cross_seed_6301_a_delta_over_a_float32_value_stays_float32_on_torch() -> None:
    # the gradient of log(Q[m,m]) is delta[p,q] / t1: a bool array of ones over a float32 0-d array; the
    # planner predicted float64 (its divide helper promoted the bool to float64 first) and torch cast to it
    gradient = ef.grad("f = log(Q[m,m])", wrt="Q")
    Q = 2 * np.eye(3, dtype=np.float32)
    expected = gradient(Q=Q)
    assert expected.dtype == np.float32
    value = gradient(Q=torch.tensor(Q))
    assert value.dtype == torch.float32
    np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_seed_10543_deltas_times_a_number_and_a_float32_value_stay_float32(backend: str) -> None:
    # the Hessian of P[l,l]^0.5 is -0.25 delta[p,q] delta[r,s] t1^-1.5: bool ones times a Python float made a
    # float64 array on numpy before the float32 factor came (the number multiplied the smallest integer array
    # first, a memory rule meant for products of integer arrays alone); the numbers now come after it
    hessian = ef.hessian("loss = P[l,l]^0.5", wrt="P")
    P = (2 * np.eye(3) + 0.1).astype(np.float32)
    value = host(hessian(P=native(P, backend)))
    assert value.dtype == np.float32
    t1 = np.trace(P.astype(np.float64))
    want = -0.25 * np.einsum("pq,rs->pqrs", np.eye(3), np.eye(3)) * t1**-1.5
    np.testing.assert_allclose(value, want, rtol=1e-6)
