"""Other projects' test cases run against einflow (issue 37), ported as data: their shapes, equations, dtypes
and configurations, not their code.

- jax's ``tests/linalg_test.py``: testDet, testDetOfSingularMatrix, testSlogdet, testIssue1213, testSlogdetGrad,
  testSolve, testInv and testCholesky (einflow has no Cholesky atom: the factor is what a matrix declared ``spd``
  is solved, inverted and log-determined with, so its cases check those);
- torch's ``common_nn`` Conv1d/Conv2d module entries (stride, padding, dilation, groups, no bias, an empty
  batch, ``padding="valid"/"same"``);
- torch's gather/scatter_add and jax's take_along_axis cases (every axis, index tensors longer than the axis,
  float, integer and bool data, int32 and int64 positions);
- jax's ``lax_numpy_einsum_test.py`` and torch's ``test_einsum*`` equations with their shapes, through
  ``ef.einsum`` on numpy arrays (and on torch and jax arrays for a sample).

References are independent: numpy/scipy in float64 or complex128, torch.nn.functional, numpy.einsum. Each case
compiles once; the shapes are the peers' own small ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import einflow as ef

BATCH = "abcd"
DTYPES = ("float32", "float64", "complex64", "complex128")


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "compute"):
        value = value.compute()
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _converter(backend: str) -> Callable[[np.ndarray], Any]:
    if backend == "numpy":
        return lambda array: array
    if backend == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax.numpy.asarray


def _run(text: str, backend: str = "numpy", **arrays: np.ndarray) -> np.ndarray:
    program = ef.compile(text)
    convert = _converter(backend)
    return _numpy(program(backend=backend, **{name: convert(np.ascontiguousarray(array))
                                              for name, array in arrays.items() if name in program.inputs}))


def _ref(name: str, shape: tuple[int, ...], rows: str = "i", columns: str = "j") -> str:
    batch = ",".join(BATCH[: len(shape) - 2])
    return f"{name}[{batch + ',' if batch else ''}{rows},{columns}]"


def _target(name: str, shape: tuple[int, ...], *rest: str) -> str:
    indices = list(BATCH[: len(shape) - 2]) + list(rest)
    return f"{name}[{','.join(indices)}]" if indices else name


def _rand_default(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """jax's ``rand_default``: normal values scaled by 3 (complex: independent real and imaginary parts)."""
    value = 3 * rng.standard_normal(shape)
    if dtype.startswith("complex"):
        value = value + 3j * rng.standard_normal(shape)
    return value.astype(dtype)


def _tolerance(dtype: str) -> float:
    return 2e-3 if dtype in ("float32", "complex64") else 1e-9  # jax's tol=1e-3 in single precision


def _wide(array: np.ndarray) -> np.ndarray:
    return array.astype(np.complex128 if array.dtype.kind == "c" else np.float64)


# ================================================================== jax's linalg_test
#: a sample of the cases also runs on torch and jax (their first calls cost more)
def _with_backends(cases: list[tuple[Any, ...]], torch: tuple[int, ...], jax: tuple[int, ...] = ()
                   ) -> list[tuple[Any, ...]]:
    """Every case on numpy, those at positions ``torch`` on torch and ``jax`` on jax (each jax program is traced
    and compiled, 1-3 s of CPU: jax runs the broadcast solve here; tests/test_peer_linalg.py runs det, logdet,
    sign_det, inverses and declared matrices on jax)."""
    return [(*case, "numpy") for case in cases] + [(*cases[k], "torch") for k in torch] + [
        (*cases[k], "jax") for k in jax]


JAX_DET = [(n, dtype) for n in (0, 4, 5, 25) for dtype in DTYPES]


@pytest.mark.parametrize(("n", "dtype", "backend"), _with_backends(JAX_DET, (5, 14)), ids=str)
def test_jax_testdet(n: int, dtype: str, backend: str) -> None:
    A = _rand_default(np.random.default_rng(n), (n, n), dtype)
    value = _run("d = det[i,j](A[i,j])", backend, A=A)
    expected = np.linalg.det(_wide(A))
    assert value.dtype == np.linalg.det(A).dtype and value.shape == ()
    scale = max(1.0, abs(expected))
    assert abs(value - expected) / scale < _tolerance(dtype) * (n + 1)


def test_jax_testdetofsingularmatrix() -> None:
    A = np.array([[-1.0, 3.0 / 2], [2.0 / 3, -1.0]], dtype=np.float32)
    value = _run("d = det[i,j](A[i,j])", A=A)
    assert value.dtype == np.float32
    assert abs(float(value)) < 1e-6


JAX_SLOGDET = [(shape, dtype) for shape in ((0, 0), (1, 1), (3, 3), (4, 4), (10, 10), (200, 200), (2, 2, 2),
                                            (2, 3, 3), (3, 2, 2)) for dtype in DTYPES]


@pytest.mark.parametrize(("shape", "dtype", "backend"), _with_backends(JAX_SLOGDET, (29, 30)), ids=str)
def test_jax_testslogdet(shape: tuple[int, ...], dtype: str, backend: str) -> None:
    A = _rand_default(np.random.default_rng(sum(shape)), shape, dtype)
    target = _target("s", shape)
    sign = _run(f"{target} = sign_det[i,j]({_ref('A', shape)})", backend, A=A)
    logdet = _run(f"{target} = logdet[i,j]({_ref('A', shape)})", backend, A=A)
    expected_sign, expected_logdet = np.linalg.slogdet(_wide(A))
    numpy_sign, numpy_logdet = np.linalg.slogdet(A)
    assert sign.shape == expected_sign.shape and sign.dtype == numpy_sign.dtype
    assert logdet.dtype == numpy_logdet.dtype  # real, also for a complex matrix (log|det|)
    tolerance = _tolerance(dtype) * shape[-1]
    np.testing.assert_allclose(logdet, expected_logdet, atol=tolerance, rtol=tolerance)
    np.testing.assert_allclose(sign, expected_sign, atol=tolerance)


def test_jax_testissue1213() -> None:
    # a batch of two -0.01 identities, float32: log|det| = 5 log(0.01), sign -1
    A = np.array([np.diag(np.ones(5, dtype=np.float32)) * np.float32(-0.01)] * 2)
    sign = _run("s[a] = sign_det[i,j](A[a,i,j])", A=A)
    logdet = _run("s[a] = logdet[i,j](A[a,i,j])", A=A)
    assert sign.dtype == logdet.dtype == np.float32
    np.testing.assert_array_equal(sign, [-1.0, -1.0])
    np.testing.assert_allclose(logdet, [5 * np.log(0.01)] * 2, rtol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (5, 5), (2, 7, 7)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_jax_testslogdetgrad(shape: tuple[int, ...], dtype: str) -> None:
    # jax checks slogdet's derivatives numerically; here: the gradient of sum log|det| is inv(A)^T
    A = _rand_default(np.random.default_rng(shape[-1]), shape, dtype)
    batch = ",".join(BATCH[: len(shape) - 2])
    body = f"logdet[i,j]({_ref('A', shape)})"
    gradient = ef.grad(f"f = sum[{batch}]({body})" if batch else f"f = {body}", wrt="A")(A=A)
    assert gradient.dtype == A.dtype
    np.testing.assert_allclose(gradient, np.swapaxes(np.linalg.inv(_wide(A)), -1, -2),
                               rtol=_tolerance(dtype) * 10, atol=_tolerance(dtype))


#: (A's shape, b's shape, the einflow statement); jax's rule: b is a stack of vectors where b.ndim == A.ndim - 1,
#: and A's batch broadcasts against b's (a batch axis of length 1 is read at position 0)
JAX_SOLVE = [
    ((1, 1), (1, 1), "x[i,k] = inv[i,j](A[i,j]) b[j,k]"),
    ((4, 4), (4,), "x[i] = inv[i,j](A[i,j]) b[j]"),
    ((8, 8), (8, 4), "x[i,k] = inv[i,j](A[i,j]) b[j,k]"),
    ((1, 2, 2), (3, 2), "x[n,i] = inv[i,j](A[0,i,j]) b[n,j]"),
    ((2, 1, 3, 3), (2, 4, 3, 4), "x[a,m,i,k] = inv[i,j](A[a,0,i,j]) b[a,m,j,k]"),
]


def _jax_solve_reference(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    if b.ndim == A.ndim - 1:
        return np.linalg.solve(A, b[..., None])[..., 0]
    return np.linalg.solve(A, b)


@pytest.mark.parametrize(("case", "dtype", "backend"), _with_backends(
    [(case, dtype) for case in JAX_SOLVE for dtype in DTYPES], (13, 19), (19,)), ids=str)
def test_jax_testsolve(case: tuple[Any, ...], dtype: str, backend: str) -> None:
    a_shape, b_shape, text = case
    rng = np.random.default_rng(len(a_shape) + len(b_shape))
    A = _rand_default(rng, a_shape, dtype) + 8 * np.eye(a_shape[-1], dtype=dtype)  # (rand_default, invertible)
    b = _rand_default(rng, b_shape, dtype)
    x = _run(text, backend, A=A, b=b)
    expected = _jax_solve_reference(_wide(A), _wide(b))
    assert x.dtype == np.dtype(dtype) and x.shape == expected.shape
    np.testing.assert_allclose(x, expected, rtol=_tolerance(dtype), atol=_tolerance(dtype))
    assert "solve" in str(ef.compile(text).plan(A=a_shape, b=b_shape))  # solved, not inverted


@pytest.mark.parametrize(("shape", "dtype", "backend"), _with_backends(
    [(shape, dtype) for shape in ((1, 1), (4, 4), (2, 5, 5), (200, 200), (5, 5, 5))
     for dtype in ("float32", "float64")], (2, 9)), ids=str)
def test_jax_testinv(shape: tuple[int, ...], dtype: str, backend: str) -> None:
    rng = np.random.default_rng(shape[-1])
    A = (_rand_default(rng, shape, dtype) + 3 * np.sqrt(shape[-1]) * np.eye(shape[-1])).astype(dtype)
    inverse = _run(f"{_target('Y', shape, 'i', 'j')} = inv[i,j]({_ref('A', shape)})", backend, A=A)
    assert inverse.dtype == np.dtype(dtype) and inverse.shape == shape
    identity = np.broadcast_to(np.eye(shape[-1]), shape)
    np.testing.assert_allclose(np.matmul(_wide(A), _wide(inverse)), identity, atol=_tolerance(dtype) * 10)
    np.testing.assert_allclose(inverse, np.linalg.inv(_wide(A)), rtol=_tolerance(dtype) * 10,
                               atol=_tolerance(dtype))


JAX_CHOLESKY = [(shape, dtype) for shape in ((1, 1), (4, 4), (2, 5, 5), (200, 200), (1000, 0, 0))
                for dtype in DTYPES]


@pytest.mark.parametrize(("shape", "dtype", "backend"), _with_backends(JAX_CHOLESKY, (5, 11)), ids=str)
def test_jax_testcholesky_cases_through_spd(shape: tuple[int, ...], dtype: str, backend: str) -> None:
    # jax's matrices: a a^H with a of shape (..., n, 2n), Hermitian positive definite
    rng = np.random.default_rng(shape[-1] + len(shape))
    a = _rand_default(rng, shape[:-1] + (2 * shape[-1],), dtype)
    A = np.matmul(a, np.conj(np.swapaxes(a, -1, -2))).astype(dtype)
    A = (A + np.conj(np.swapaxes(A, -1, -2))) / 2  # exactly Hermitian in its own precision
    b = _rand_default(rng, shape[:-1], dtype)
    lead = ",".join(BATCH[: len(shape) - 2])
    lead = lead + "," if lead else ""
    # ``spd`` declares square rank-2 matrices only (docs/language.md, section 10): a batch is solved by LU
    declaration = "" if lead else "spd A\n"
    if lead:
        with pytest.raises(ef.IndexRuleError, match="'A' is declared spd but has rank 3"):
            ef.compile(f"spd A\nl[{lead[:-1]}] = logdet[i,j]({_ref('A', shape)})")
    logdet = _run(f"{declaration}{_target('l', shape)} = logdet[i,j]({_ref('A', shape)})", backend, A=A)
    solve = f"{declaration}x[{lead}i] = inv[i,j]({_ref('A', shape)}) b[{lead}j]"
    x = _run(solve, backend, A=A, b=b)
    if not lead:
        assert "cho_solve" in str(ef.compile(solve).plan(A=shape, b=shape[:-1]))  # the Cholesky factor, no LU
    L = np.linalg.cholesky(_wide(A))
    diagonal = np.diagonal(L, axis1=-2, axis2=-1).real
    expected_logdet = 2 * np.log(diagonal).sum(axis=-1)
    assert logdet.dtype == np.linalg.slogdet(A)[1].dtype and logdet.shape == shape[:-2]
    tolerance = _tolerance(dtype) * max(1, shape[-1])
    np.testing.assert_allclose(logdet, expected_logdet, rtol=tolerance, atol=tolerance)
    expected_x = np.linalg.solve(_wide(A), _wide(b)[..., None])[..., 0]
    assert x.dtype == np.dtype(dtype) and x.shape == shape[:-1]
    scale = np.abs(expected_x).max(initial=1.0)
    np.testing.assert_allclose(x / scale, expected_x / scale, atol=tolerance)


# ================================================================== torch's common_nn Conv1d/Conv2d entries
#: (name, in channels, out channels, kernel, stride, padding, dilation, groups, bias, input size)
TORCH_CONV = [
    ("Conv1d", 4, 5, (3,), (1,), (0,), (1,), 1, True, (2, 4, 10)),
    ("Conv1d_stride", 4, 5, (3,), (2,), (0,), (1,), 1, True, (2, 4, 10)),
    ("Conv1d_pad1", 4, 5, (3,), (1,), (1,), (1,), 1, True, (2, 4, 10)),
    ("Conv1d_pad2", 4, 5, (5,), (1,), (2,), (1,), 1, True, (2, 4, 10)),
    ("Conv1d_pad1size1", 4, 4, (3,), (1,), (1,), (1,), 1, True, (1, 4, 1)),
    ("Conv1d_pad2size1", 4, 4, (5,), (1,), (2,), (1,), 1, True, (1, 4, 1)),
    ("Conv1d_zero_batch", 4, 5, (3,), (1,), (0,), (1,), 1, True, (0, 4, 10)),
    ("Conv1d_dilated", 4, 5, (3,), (1,), (0,), (2,), 1, True, (2, 4, 10)),
    ("Conv1d_groups", 4, 6, (3,), (1,), (0,), (1,), 2, True, (2, 4, 6)),
    ("Conv1d_pad_valid", 4, 5, (3,), (1,), "valid", (1,), 1, True, (2, 4, 10)),
    ("Conv1d_pad_same", 4, 5, (3,), (1,), "same", (1,), 1, True, (2, 4, 10)),
    ("Conv1d_pad_same2", 4, 5, (4,), (1,), "same", (1,), 1, True, (2, 4, 10)),
    ("Conv1d_pad_same_dilated", 4, 5, (4,), (1,), "same", (2,), 1, True, (2, 4, 10)),
    ("Conv2d", 3, 4, (3, 2), (1, 1), (0, 0), (1, 1), 1, True, (2, 3, 7, 5)),
    ("Conv2d_strided", 3, 4, (3, 3), (2, 2), (0, 0), (1, 1), 1, True, (2, 3, 6, 6)),
    ("Conv2d_padding", 3, 4, (3, 3), (2, 2), (1, 1), (1, 1), 1, True, (2, 3, 6, 6)),
    ("Conv2d_dilated", 3, 2, (3, 3), (2, 2), (1, 1), (2, 2), 1, True, (2, 3, 8, 8)),
    ("Conv2d_no_bias", 3, 4, (3, 2), (1, 1), (0, 0), (1, 1), 1, False, (2, 3, 6, 5)),
    ("Conv2d_zero_batch", 3, 4, (3, 2), (1, 1), (0, 0), (1, 1), 1, True, (0, 3, 7, 5)),
    ("Conv2d_groups", 4, 6, (3, 2), (1, 1), (0, 0), (1, 1), 2, True, (2, 4, 6, 5)),
    ("Conv2d_pad_valid", 2, 4, (3, 4), (1, 1), "valid", (1, 1), 1, True, (2, 2, 6, 5)),
    ("Conv2d_pad_same", 2, 4, (3, 4), (1, 1), "same", (1, 1), 1, True, (2, 2, 6, 5)),
    ("Conv2d_pad_same_dilated", 2, 4, (3, 4), (1, 1), "same", (2, 2), 1, True, (2, 2, 6, 5)),
]
_SPATIAL = ("h", "w")
_KERNEL = ("r", "s")


def _conv_program(kernel: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...] | str,
                  dilation: tuple[int, ...], groups: int, bias: bool, input_size: tuple[int, ...]) -> str:
    """The einflow program of one torch convolution: channels split into ``groups`` (x[n,g,c,...]), padding
    through a ``size`` declaration of each output axis (zeros outside x), bias added per channel."""
    lines = []
    reads = []
    for axis, (k, s, d, length) in enumerate(zip(kernel, stride, dilation, input_size[2:])):
        if padding == "same":
            before = d * (k - 1) // 2  # torch pads the odd extra one at the end
            total = d * (k - 1)
        else:
            before = 0 if padding == "valid" else padding[axis]
            total = 2 * before
        out = max((length + total - d * (k - 1) - 1) // s + 1, 0)
        if total:
            lines.append(f"size {_SPATIAL[axis]} = {out}")
        position = f"{s}*{_SPATIAL[axis]}" if s != 1 else _SPATIAL[axis]
        position += f" + {d}*{_KERNEL[axis]}" if d != 1 else f" + {_KERNEL[axis]}"
        position += f" - {before}" if before else ""
        reads.append(position)
    space = ",".join(_SPATIAL[: len(kernel)])
    window = ",".join(_KERNEL[: len(kernel)])
    body = f"x[n,g,c,{','.join(reads)}] K[g,o,c,{window}]"
    lines.append(f"y[n,g,o,{space}] = {body}" + (" + B[g,o]" if bias else ""))
    return "\n".join(lines)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")  # (torch's own note)
@pytest.mark.parametrize("case", TORCH_CONV, ids=lambda case: case[0])
def test_torch_common_nn_conv_entries(case: tuple[Any, ...]) -> None:
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("torch.nn.functional")
    name, c_in, c_out, kernel, stride, padding, dilation, groups, bias, input_size = case
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal(input_size)
    K = rng.standard_normal((c_out, c_in // groups, *kernel))
    B = rng.standard_normal(c_out) if bias else None
    convolve = functional.conv1d if len(kernel) == 1 else functional.conv2d
    expected = convolve(torch.from_numpy(x), torch.from_numpy(K), None if B is None else torch.from_numpy(B),
                        stride=stride, padding=padding, dilation=dilation, groups=groups).numpy()
    text = _conv_program(kernel, stride, padding, dilation, groups, bias, input_size)
    arrays = {"x": x.reshape(input_size[0], groups, c_in // groups, *input_size[2:]),
              "K": K.reshape(groups, c_out // groups, *K.shape[1:])}
    if bias:
        arrays["B"] = B.reshape(groups, c_out // groups)
    for backend in ("numpy", "torch"):
        value = _run(text, backend, **arrays)
        value = value.reshape(value.shape[0], c_out, *value.shape[3:])
        assert value.shape == expected.shape, (backend, text)
        np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-10, err_msg=f"{backend}: {text}")


# ================================================================== gathers and scatter-adds
def _letters(rank: int) -> list[str]:
    return list("abc"[:rank])


#: jax's testTakeAlongAxis and torch's test_gather: every axis, the positions' axis longer than the data's (jax
#: makes it 3x), int32 and int64 positions; torch's and jax's data dtypes. (jax also draws negative positions:
#: einflow reads positions in [0, n) only, a documented difference; a negative one is a GatherIndexError.)
GATHERS = [(shape, axis, dtype, index_dtype)
           for shape in ((4,), (3, 4), (2, 3, 4)) for axis in range(len(shape))
           for dtype, index_dtype in (("float32", "int32"), ("float64", "int64"), ("int32", "int64"),
                                      ("bool", "int32"), ("complex64", "int64"))]


@pytest.mark.parametrize(("shape", "axis", "dtype", "index_dtype", "backend"), _with_backends(
    GATHERS, (18, 21, 27)), ids=str)
def test_take_along_axis_and_gather_cases(shape: tuple[int, ...], axis: int, dtype: str, index_dtype: str,
                                          backend: str) -> None:
    rng = np.random.default_rng(len(shape) * 10 + axis)
    x = _rand_default(rng, shape, dtype) if dtype.startswith(("float", "complex")) else \
        (rng.integers(-5, 5, shape) > 0 if dtype == "bool" else rng.integers(-5, 5, shape)).astype(dtype)
    index_shape = list(shape)
    index_shape[axis] *= 3
    t = rng.integers(0, shape[axis], index_shape).astype(index_dtype)
    letters = _letters(len(shape))
    reads = [f"t[{','.join(letters)}]" if k == axis else letter for k, letter in enumerate(letters)]
    value = _run(f"y[{','.join(letters)}] = x[{', '.join(reads)}]", backend, x=x, t=t)
    expected = np.take_along_axis(x, t.astype(np.int64), axis=axis)
    assert value.dtype == expected.dtype  # bool stays bool, int32 stays int32
    np.testing.assert_array_equal(value, expected)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        np.testing.assert_array_equal(value, torch.gather(torch.from_numpy(x), axis, torch.from_numpy(
            t.astype(np.int64))).numpy())


def test_a_negative_take_along_axis_position_is_a_gather_index_error() -> None:
    with pytest.raises(ef.GatherIndexError, match=r"reads position -1"):
        _run("y[a,b] = x[a, t[a,b]]", x=np.ones((2, 3)), t=np.array([[0, -1], [1, 2]]))


#: torch's test_scatter_add: dst.scatter_add_(dim, index, src) with index and src of the same shape, the
#: positions drawn with repeats; in einflow a scatter-add is a sum through a delta of the positions
SCATTERS = [((5, 3), 0, (7, 3)), ((5, 3), 1, (5, 6)), ((4, 3, 2), 0, (6, 3, 2)), ((4, 3, 2), 1, (4, 5, 2)),
            ((4, 3, 2), 2, (4, 3, 4)), ((5,), 0, (9,))]


@pytest.mark.parametrize(("dtype", "backend"), [("float64", "numpy"), ("float32", "numpy"), ("int64", "numpy"),
                                                ("float64", "torch")])
@pytest.mark.parametrize(("shape", "axis", "source_shape"), SCATTERS, ids=str)
def test_torch_scatter_add_cases(shape: tuple[int, ...], axis: int, source_shape: tuple[int, ...], dtype: str,
                                 backend: str) -> None:
    rng = np.random.default_rng(sum(shape) + axis)
    destination = rng.integers(-4, 4, shape).astype(dtype)
    source = rng.integers(-4, 4, source_shape).astype(dtype)
    t = rng.integers(0, shape[axis], source_shape)
    letters = _letters(len(shape))
    kept = [letter.upper() if k == axis else letter for k, letter in enumerate(letters)]
    text = (f"size {','.join(kept)} = D\n"
            f"y[{','.join(kept)}] = D[{','.join(kept)}] + sum[{letters[axis]}](delta[{kept[axis]}, "
            f"t[{','.join(letters)}]] S[{','.join(letters)}])")
    value = _run(text, backend, D=destination, S=source, t=t)
    expected = destination.copy()
    for position in np.ndindex(source_shape):
        target = list(position)
        target[axis] = t[position]
        expected[tuple(target)] += source[position]
    assert value.dtype == expected.dtype
    np.testing.assert_array_equal(value, expected)


# ================================================================== jax's and torch's einsum equations
def _cycled_shapes(equation: str) -> list[tuple[int, ...]]:
    """jax's test_from_dask shapes: each letter sized 2, 3, 4, 2, ... in order of appearance; '...' is 2 axes."""
    sizes: dict[str, int] = {}
    cycle = itertools.cycle((2, 3, 4))
    terms = equation.split("->")[0].split(",")
    shapes = []
    for term in terms:
        shape = []
        for letter in term.replace("...", "01"):
            if letter not in sizes:
                sizes[letter] = next(cycle)
            shape.append(sizes[letter])
        shapes.append(tuple(shape))
    return shapes


JAX_FROM_DASK = ["abc,bad->abcd", "abcdef,bcdfg->abcdeg", "ea,fb,abcd,gc,hd->efgh", "ab,b", "aa", "a,a->", "a,a->a",
                 "a,a", "a,b", "a,b,c", "a", "ba,b", "ba,b->", "defab,fedbc->defac", "ab...,bc...->ac...", "a...a",
                 "abc...->cba...", "...ab->...a", "a...a->a...", "...abc,...abcd->...d", "ab...,b->ab...", "aa->a",
                 "ab,ab,c->c", "aab,bc->ac", "aab,bcc->ac", "fdf,cdd,ccd,afe->ae", "fff,fae,bef,def->abd"]

#: jax's named tests: (equation, shapes)
JAX_EINSUM = [
    ("i,j,k->ijk", [(3,), (4,), (5,)]), ("ij,j->i", [(3, 4), (4,)]), ("ijk,j->i", [(3, 4, 5), (4,)]),
    ("iji,i->j", [(3, 4, 3), (3,)]), ("ij,ij->", [(3, 4), (3, 4)]), ("nij,jk->nik", [(10, 2, 3), (3, 4)]),
    ("sa,shb->shab", [(2, 1), (2, 3, 4)]), ("ijk->j", [(3, 4, 5)]), ("ijk->kij", [(3, 4, 5)]),
    ("ijk->ki", [(3, 4, 5)]), ("...ijk->...ki", [(2, 3, 4, 5)]), ("...ijk->ki", [(3, 4, 5)]), ("ii->", [(3, 3)]),
    ("ij->", [(3, 3)]), ("iii->", [(3, 3, 3)]), ("ii->i", [(3, 3)]), ("iij->i", [(3, 3, 4)]),
    ("iii->i", [(3, 3, 3)]), ("iijkk->i", [(3, 3, 5, 4, 4)]), ("iijkk->ik", [(3, 3, 5, 4, 4)]),
    ("iijkl->il", [(3, 3, 5, 4, 4)]), ("ij->ij", [(3, 3)]), ("ij...,jk...->ik...", [(2, 3, 5, 1), (3, 4, 5, 1)]),
    ("ijj,k->ik", [(2, 3, 3), (4,)]), ("ij,ij,jk->ik", [(2, 3), (2, 3), (3, 4)]),
    ("ijkl,ijml->ijkm", [(1, 8, 20, 4), (1, 8, 20, 4)]), ("ntk,kd,dc->nc", [(2, 6, 5), (5, 4), (4, 3)]),
    ("cij,cjk->cik", [(3, 4, 5), (3, 5, 6)]), ("...ij,...j", [(2, 1, 3, 3), (2, 4, 3)]),
    ("cij,cjk->cik", [(1, 4, 5), (3, 5, 6)]), ("cij,cjk->cik", [(3, 4, 5), (3, 1, 6)]),
    ("cij,cjk->cik", [(1, 4, 5), (3, 1, 6)]), ("i->", [(3,)]), ("ii->i", [(4, 4)]), ("ij,jk", [(3, 4), (4, 3)]),
    ("ij,jkl,klm", [(2, 2), (2, 3, 4), (3, 4, 2)]),
] + [(equation, _cycled_shapes(equation)) for equation in JAX_FROM_DASK]

#: torch's test_einsum: the named tensors' shapes, then (equation, operands)
_TORCH_TENSORS = {"x": (5,), "y": (7,), "A": (3, 5), "B": (2, 5), "C": (2, 3, 5), "D": (2, 5, 7), "E": (7, 9),
                  "F": (2, 3, 3, 5), "G": (5, 4, 6), "H": (4, 4), "I": (2, 3, 2), "At": (5, 3), "J": (2, 1, 3, 1, 4),
                  "K": (5, 3), "L": (2, 5, 2, 3), "l": (5, 10), "r": (5, 20), "w": (15, 10, 20), "l2": (5, 5),
                  "r2": (5, 10), "w2": (15, 5, 10)}
TORCH_EINSUM = [
    ("i->", "x"), ("i,i->", "xx"), ("i,i->i", "xx"), ("i,j->ij", "xy"), ("ij->ji", "A"), ("ij->j", "A"),
    ("ij->i", "A"), ("ij,ij->ij", "AA"), ("ij,j->i", "Ax"), ("ij,kj->ik", "AB"), ("ij,ab->ijab", "AE"),
    ("Aij,Ajk->Aik", "CD"), ("ijk,jk->i", "CA"), ("aij,jk->aik", "DE"), ("abCd,dFg->abCFg", "FG"),
    ("ijk,jk->ik", "CA"), ("ijk,jk->ij", "CA"), ("ijk,ik->j", "CB"), ("ijk,ik->jk", "CB"), ("ii", "H"),
    ("ii->i", "H"), ("iji->j", "I"), ("ngrg...->nrg...", "J"), ("i...->...", "H"), ("ki,...k->i...", ["At", "B"]),
    ("k...,jk->...", ["At", "B"]), ("...ik, ...j -> ...ij", "Cx"), ("Bik,k...j->i...j", "CK"),
    ("i...j, ij... -> ...ij", "CL"), ("bn,anm,bm->ba", "lwr"), ("bn,Anm,bm->bA", ["l2", "w2", "r2"]),
]
TORCH_EINSUM = [(equation, [_TORCH_TENSORS[name] for name in names]) for equation, names in TORCH_EINSUM]

#: torch's test_einsum_corner_cases: (equation, operands, expected)
TORCH_CORNER_CASES = [
    (" ", [1], 1), (" -> ", [1], 1), (" , ", [2, 2], 4), (" , , ", [2, 2, 2], 8), (" , -> ", [2, 2], 4),
    (" i ", [[1]], [1]), (" i -> ", [[1]], 1), (" i -> i ", [[1]], [1]), (" i , i ", [[2], [2]], 4),
    (" i , i -> i ", [[2], [2]], [4]), ("i", [[]], []), (" i j -> j", [[[], []]], []),
    ("ij->i", [[[], []]], [0.0, 0.0]), (" i j k  ,  k  -> i j ", [np.ones((3, 0, 6)), np.ones(6)], [[], [], []]),
    ("i,j", [[2], [1, 2]], [[2, 4]]), ("i,ij->ij", [[1, 2], [[1, 2, 3], [2, 3, 4]]], [[1, 2, 3], [4, 6, 8]]),
    ("...", [1], 1), ("...->", [1], 1), ("...->...", [1], 1), ("...", [[1]], [1]),
    ("z...->z", [[1]], [1]), ("Z...->...Z", [[1]], [1]),
]

#: torch's corner cases where an output without '...' sums the ellipsis axes: numpy refuses them ("output has
#: more dimensions than subscripts given"), and einflow.einsum follows numpy (docs/api.md)
TORCH_ELLIPSIS_SUMS = [("...->", [[1]]), ("...a->", [[[2], [4]]]), ("a...b->ab", [[[[1], [2]], [[3], [4]]]])]

#: torch's test_einsum_error_cases that numpy refuses too (torch's own wording aside)
TORCH_ERROR_CASES = [(". ..", [(2,)]), ("... ...", [(2,)]), ("1", [(2,)]), (",", [(2,)]), ("", [(2,), (2,)]),
                     ("", [(2,)]), ("ai", [(2,)]), ("ai...", [(2,)]), ("a->... .", [(2,)]), ("a->..", [(2,)]),
                     ("a->1", [(2,)]), ("a->aa", [(2,)]), ("a->i", [(2,)]), ("aa", [(2, 3)]),
                     ("a, ba", [(2,), (2, 3)])]


def _operands(shapes: list[tuple[int, ...]], dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return [rng.integers(0, 2, shape).astype(bool) for shape in shapes]
    if dtype.startswith("int"):
        return [rng.integers(-3, 4, shape).astype(dtype) for shape in shapes]
    return [_rand_default(rng, shape, dtype) for shape in shapes]


def _check_einsum(equation: str, operands: list[np.ndarray], backend: str = "numpy", **options: Any) -> None:
    expected = np.einsum(equation, *operands)
    convert = _converter(backend)
    value = ef.einsum(equation, *[convert(operand) for operand in operands], **options)
    value = _numpy(value)
    assert value.shape == expected.shape, equation
    if backend == "numpy":
        assert value.dtype == expected.dtype, equation
    tolerance = 1e-4 if expected.dtype in (np.float32, np.complex64) else 1e-10
    np.testing.assert_allclose(value, expected, rtol=tolerance, atol=tolerance, err_msg=equation)


@pytest.mark.parametrize(("equation", "shapes"), JAX_EINSUM, ids=[case[0] for case in JAX_EINSUM])
def test_jax_einsum_equations(equation: str, shapes: list[tuple[int, ...]]) -> None:
    operands = _operands(shapes, "float64", len(equation))
    _check_einsum(equation, operands)
    _check_einsum(equation, [operand.astype(np.float32) for operand in operands])


@pytest.mark.parametrize("dtype", ["float32", "int32", "complex64", "bool"])
def test_jax_einsum_from_dask_dtypes(dtype: str) -> None:
    # one test per dtype over jax's 27 test_from_dask equations (jax runs each pair as its own test)
    for equation in JAX_FROM_DASK:
        _check_einsum(equation, _operands(_cycled_shapes(equation), dtype, len(equation)))


@pytest.mark.parametrize("optimize", [True, False, "optimal", "auto", "greedy"])
def test_jax_einsum_optimization_modes(optimize: Any) -> None:
    for equation, shapes in (("i->", [(3,)]), ("ii->i", [(4, 4)]), ("ij,jk", [(3, 4), (4, 3)]),
                             ("ij,jkl,klm", [(2, 2), (2, 3, 4), (3, 4, 2)])):
        operands = _operands(shapes, "float32", 3)
        _check_einsum(equation, operands, optimize=optimize)
        path, _ = ef.einsum_path(equation, *operands, optimize=optimize)
        _check_einsum(equation, operands, optimize=path)


def test_jax_einsum_inf_nan() -> None:
    x = np.array([[[np.inf, np.inf], [1.0, 1.0]]])
    np.testing.assert_array_equal(ef.einsum("baa->ba", x), np.einsum("baa->ba", x))


@pytest.mark.parametrize(("equation", "shapes"), TORCH_EINSUM, ids=[case[0] for case in TORCH_EINSUM])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_torch_einsum_equations(equation: str, shapes: list[tuple[int, ...]], dtype: str) -> None:
    _check_einsum(equation, _operands(shapes, dtype, len(equation)))


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_torch_and_jax_einsum_equations_on_their_own_arrays(backend: str) -> None:
    # a sample of each peer's equations through ef.einsum on that peer's arrays
    cases = TORCH_EINSUM[::3] if backend == "torch" else JAX_EINSUM[::12]
    for equation, shapes in cases:
        _check_einsum(equation, _operands(shapes, "float64", len(equation)), backend)


def test_torch_einsum_sublist_format() -> None:
    rng = np.random.default_rng(0)
    x, y, A, B = (rng.standard_normal(shape) for shape in ((5,), (7,), (3, 5), (2, 5)))
    C = rng.standard_normal((2, 1, 3, 1, 4))
    l, r, w = rng.standard_normal((5, 10)), rng.standard_normal((5, 20)), rng.standard_normal((15, 10, 20))
    At = np.ascontiguousarray(A.T)
    for arguments in ([x, [0]], [x, [0], []], [x, [0], y, [1], [0, 1]], [A, [0, 1], [1, 0]],
                      [A, [0, 1], x, [1], [0]], [A, [0, 1], B, [2, 1]], [A, [0, 1], B, [2, 1], [0, 2]],
                      [C, [0, 1, 2, 1, Ellipsis], [0, 2, 1, Ellipsis]], [At, [0, 1], B, [Ellipsis, 0]],
                      [At, [0, 1], B, [Ellipsis, 0], [1, Ellipsis]], [At, [0, Ellipsis], B, [1, 0], [Ellipsis]],
                      [l, [40, 41], w, [2, 41, 50], r, [40, 50], [40, 2]]):
        np.testing.assert_allclose(ef.einsum(*arguments), np.einsum(*arguments), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("equation", "operands", "expected"), TORCH_CORNER_CASES,
                         ids=[repr(case[0]) for case in TORCH_CORNER_CASES])
def test_torch_einsum_corner_cases(equation: str, operands: list[Any], expected: Any) -> None:
    arrays = [np.asarray(operand, dtype=np.float32) for operand in operands]
    value = ef.einsum(equation, *arrays)
    np.testing.assert_array_equal(value, np.asarray(expected, dtype=np.float32))
    assert np.shape(value) == np.shape(np.einsum(equation, *arrays))


@pytest.mark.parametrize(("equation", "operands"), TORCH_ELLIPSIS_SUMS,
                         ids=[repr(case[0]) for case in TORCH_ELLIPSIS_SUMS])
def test_torch_einsum_ellipsis_sums_follow_numpy(equation: str, operands: list[Any]) -> None:
    arrays = [np.asarray(operand, dtype=np.float32) for operand in operands]
    with pytest.raises(ValueError, match="output has more dimensions"):
        np.einsum(equation, *arrays)
    with pytest.raises(ef.SubscriptsError, match="the ellipsis covers 1 axis"):
        ef.einsum(equation, *arrays)


@pytest.mark.parametrize(("equation", "shapes"), TORCH_ERROR_CASES, ids=[repr(case[0]) for case in TORCH_ERROR_CASES])
def test_torch_einsum_error_cases_are_einflow_errors(equation: str, shapes: list[tuple[int, ...]]) -> None:
    operands = [np.ones(shape, dtype=np.float32) for shape in shapes]
    with pytest.raises(ValueError):
        np.einsum(equation, *operands)
    with pytest.raises(ef.EinflowError):
        ef.einsum(equation, *operands)
