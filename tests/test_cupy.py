"""The CuPy backend on a GPU: the corpus against numpy, arrays staying on the device, diagonal writes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import einflow as ef
from einflow.lang.ir import FUNCTIONS

cupy = pytest.importorskip("cupy", reason="cupy is not installed (pip install 'einflow[cupy]')")
try:
    _devices = cupy.cuda.runtime.getDeviceCount()
except Exception as error:  # CUDARuntimeError without a driver or device
    pytest.skip(f"cupy is installed but no CUDA device is usable ({error})", allow_module_level=True)
if _devices < 1:
    pytest.skip("cupy is installed but no CUDA device was found", allow_module_level=True)

try:
    from tests.corpus import CORPUS, DERIVATIVES, SPECIAL_VALUES, Case, Special, assert_matches, needs_grad
except ImportError:  # tests/ is not a package: pytest puts it on sys.path itself
    from corpus import CORPUS, DERIVATIVES, SPECIAL_VALUES, Case, Special, assert_matches, needs_grad


def to_host(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(to_host(v) for v in value)
    assert isinstance(value, cupy.ndarray), f"expected a device array, got {type(value).__name__}"
    return cupy.asnumpy(value)


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_corpus_with_numpy_inputs_on_the_device(case: Case) -> None:
    arrays = case.arrays(seed=5)
    result = ef.compile(case.text)(arrays, backend="cupy")
    assert_matches(to_host(result), case.reference(**arrays))


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_corpus_with_cupy_inputs_picks_cupy(case: Case) -> None:
    arrays = case.arrays(seed=6)
    on_device = {name: cupy.asarray(value) if isinstance(value, np.ndarray) else value
                 for name, value in arrays.items()}
    result = ef.compile(case.text)(on_device)  # backend="auto"
    assert_matches(to_host(result), case.reference(**arrays))


@pytest.mark.parametrize("special", SPECIAL_VALUES, ids=[special.name for special in SPECIAL_VALUES])
def test_cupy_agrees_with_numpy_on_inf_nan_bool_and_dtypes(special: Special) -> None:
    program = special.build()
    with np.errstate(all="ignore"):
        want = np.asarray(program(special.arrays, backend="numpy"))
    got = to_host(program({name: cupy.asarray(value) for name, value in special.arrays.items()}))
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


def test_masked_arrays_are_refused_on_cupy() -> None:
    with pytest.raises(ef.BackendError, match="masked arrays are not supported"):
        ef.compile("s = x[i] x[i]")(x=np.ma.array([1.0, 2.0], mask=[0, 1]), backend="cupy")


@needs_grad
@pytest.mark.parametrize("name, build, shapes, reference", DERIVATIVES, ids=[d[0] for d in DERIVATIVES])
def test_derivatives_on_the_device(name: str, build: Any, shapes: dict[str, Any], reference: Any) -> None:
    arrays = Case(name, "", shapes, reference).arrays(seed=7)
    assert_matches(to_host(build()(arrays, backend="cupy")), reference(**arrays))


def test_every_function_runs_on_the_device() -> None:
    x = cupy.linspace(0.1, 2.0, 11)
    for name in FUNCTIONS:
        result = ef.compile(f"y[i] = {name}(x[i])")(x=x)
        assert isinstance(result, cupy.ndarray), name
        reference = ef.compile(f"y[i] = {name}(x[i])")(x=cupy.asnumpy(x))
        np.testing.assert_allclose(cupy.asnumpy(result), reference, rtol=1e-12, err_msg=name)


def test_explicit_numpy_backend_brings_results_home() -> None:
    x = cupy.arange(4.0)
    result = ef.compile("s = x[i] x[i]")(x=x, backend="numpy")
    assert not isinstance(result, cupy.ndarray)
    assert float(result) == 14.0


def test_surviving_delta_is_a_strided_write_on_the_device() -> None:
    x = cupy.linspace(-1, 1, 6)
    result = ef.compile("T[i,j,k] = delta[i,j] delta[j,k] exp(x[i])")(x=x)
    expected = np.zeros((6, 6, 6))
    host = np.exp(np.linspace(-1, 1, 6))
    expected[np.arange(6), np.arange(6), np.arange(6)] = host
    np.testing.assert_allclose(to_host(result), expected)


def test_memory_guard_applies_on_the_device() -> None:
    u = cupy.ones(10**6)
    with pytest.raises(ef.MemoryLimitError):
        ef.compile("O[i,j] = u[i] v[j]")(u=u, v=u)
