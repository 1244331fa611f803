"""Backends: one corpus of programs checked on numpy and dask against independent numpy references.

Also: backend selection (``backend=``, ``set_backend``, ``auto``), array types in and out, the errors for
unknown or missing backends, and lazy imports of backend libraries.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import einflow as ef

try:
    from tests.corpus import CORPUS, DERIVATIVES, SPECIAL_VALUES, Case, Special, assert_matches, needs_grad
except ImportError:  # tests/ is not a package: pytest puts it on sys.path itself
    from corpus import CORPUS, DERIVATIVES, SPECIAL_VALUES, Case, Special, assert_matches, needs_grad

try:
    import dask.array as da
except ImportError:  # the numpy half of the tests still runs
    da = None

needs_dask = pytest.mark.skipif(da is None, reason="dask is not installed (pip install 'einflow[dask]')")


def run_on(engine: str, program: Any, arrays: dict[str, Any]) -> Any:
    """Evaluate on an engine; 'dask-lazy' passes dask arrays and computes the lazy result itself."""
    if engine == "numpy":
        return program(arrays)
    if engine == "dask":
        result = program(arrays, backend="dask", chunks=2)
        for value in result if isinstance(result, tuple) else (result,):
            # numpy arrays, and numpy scalars for scalar values, as on the numpy backend
            assert isinstance(value, (np.ndarray, np.generic)), "backend='dask' with numpy inputs returns numpy"
        return result
    assert engine == "dask-lazy"
    lazy = {name: da.from_array(value, chunks=2) if isinstance(value, np.ndarray) else value
            for name, value in arrays.items()}
    result = program(lazy)
    values = result if isinstance(result, tuple) else (result,)
    assert all(isinstance(value, da.Array) for value in values), "dask inputs give lazy dask arrays"
    import dask

    computed = dask.compute(*values)
    return computed if isinstance(result, tuple) else computed[0]


ENGINES = ["numpy", pytest.param("dask", marks=needs_dask), pytest.param("dask-lazy", marks=needs_dask)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_corpus(case: Case, engine: str) -> None:
    arrays = case.arrays()
    assert_matches(run_on(engine, ef.compile(case.text), arrays), case.reference(**arrays))


@needs_grad
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name, build, shapes, reference", DERIVATIVES, ids=[d[0] for d in DERIVATIVES])
def test_derivative_corpus(name: str, build: Callable[[], Any], shapes: dict[str, Any],
                           reference: Callable[..., Any], engine: str) -> None:
    arrays = Case(name, "", shapes, reference).arrays(seed=1)
    program = build()
    assert_matches(run_on(engine, program, arrays), reference(**arrays))


# ---------------------------------------------------------------------------------------------- backends agree
def _same(got: Any, want: Any, exact: bool) -> None:
    """The same dtype and shape, and the same values (nan where nan; exact when ``exact``)."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for one, other in zip(got, want):
            _same(one, other, exact)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    if exact:
        np.testing.assert_array_equal(got, want)  # nan compares equal to nan here, inf to inf
    else:  # chunked contractions add in another order
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES[1:])
@pytest.mark.parametrize("special", SPECIAL_VALUES, ids=[special.name for special in SPECIAL_VALUES])
def test_backends_agree_on_inf_nan_bool_and_dtypes(special: Special, engine: str) -> None:
    program = special.build()
    with np.errstate(all="ignore"):
        want = program(special.arrays, backend="numpy")
        got = run_on(engine, program, special.arrays)
    _same(got, want, exact=True)


@pytest.mark.parametrize("engine", ENGINES[1:])
@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_backends_agree_on_the_corpus_dtypes_included(case: Case, engine: str) -> None:
    program = ef.compile(case.text)
    arrays = case.arrays(seed=5)
    _same(run_on(engine, program, arrays), program(arrays, backend="numpy"), exact=False)


def test_special_values_on_numpy_are_what_the_docs_say() -> None:
    """The semantics the other backends are held to, checked against numpy written by hand."""
    by_name = {special.name: special for special in SPECIAL_VALUES}

    def run(name: str) -> Any:
        special = by_name[name]
        with np.errstate(all="ignore"):
            return special.build()(special.arrays)

    np.testing.assert_array_equal(run("delta-inf"), [[np.inf, 0.0], [0.0, 1.0]])
    np.testing.assert_array_equal(run("hessian-exp-inf"), [[np.inf, 0.0], [0.0, 1.0]])
    assert run("bool-dot").dtype == np.int64 and run("bool-dot") == 2
    assert run("bool-sum") == 3
    assert run("bool-matmul").dtype == np.int64
    for name in ("exp-uint8", "exp-int8", "log-bool", "tanh-int16"):
        assert run(name).dtype == np.float64, name
    np.testing.assert_allclose(run("exp-uint8"), np.exp(np.array([0.0, 1.0, 255.0])), rtol=1e-15)
    assert run("weak-literal-float32").dtype == np.float32
    assert run("float32-stays").dtype == np.float32
    assert run("int-stays").dtype == np.int64
    assert np.isnan(run("dot-inf-zero"))
    np.testing.assert_array_equal(run("sigmoid-extremes"), [0.0, 1.0, 0.5, np.nan])


@pytest.mark.parametrize("engine", ["numpy", pytest.param("dask", marks=needs_dask)])
def test_masked_arrays_are_refused_on_every_backend(engine: str) -> None:
    masked = np.ma.array([1.0, 2.0, 3.0], mask=[False, False, True])
    program = ef.compile("s = x[i] x[i]")
    with pytest.raises(ef.BackendError, match="masked arrays are not supported"):
        program(x=masked, backend=engine)
    if engine == "dask":
        with pytest.raises(ef.BackendError, match="masked arrays are not supported"):
            program(x=da.from_array(masked, chunks=2, asarray=False))
    assert float(program(x=masked.filled(0), backend=engine)) == 5.0  # what the message suggests works


# ---------------------------------------------------------------------------------------------- array types
def test_auto_keeps_numpy_and_python_numbers_on_numpy() -> None:
    p = ef.compile("y[i] = a x[i]")
    assert type(p(a=2.0, x=np.ones(3))) is np.ndarray
    product = ef.compile("s = a b")(a=2.0, b=3)
    assert isinstance(product, (float, np.floating, np.ndarray)) and float(product) == 6.0


@needs_dask
def test_auto_with_any_dask_input_is_lazy() -> None:
    p = ef.compile("y[i] = A[i,j] x[j]")
    A = np.arange(12.0).reshape(4, 3)
    x = np.arange(3.0)
    for arrays in ({"A": da.from_array(A, chunks=2), "x": x}, {"A": A, "x": da.from_array(x, chunks=2)}):
        result = p(arrays)
        assert isinstance(result, da.Array)
        np.testing.assert_allclose(result.compute(), A @ x)


@needs_dask
def test_explicit_backend_returns_that_backends_arrays() -> None:
    p = ef.compile("y[i] = A[i,j] x[j]")
    A = np.arange(12.0).reshape(4, 3)
    x = np.arange(3.0)
    computed = p(A=A, x=x, backend="dask")
    assert type(computed) is np.ndarray
    lazy_in = p(A=da.from_array(A), x=x, backend="numpy")
    assert type(lazy_in) is np.ndarray
    np.testing.assert_allclose(lazy_in, A @ x)
    as_list = p(A=A.tolist(), x=list(x), backend="numpy")
    np.testing.assert_allclose(as_list, A @ x)


@needs_dask
def test_set_backend_changes_the_default() -> None:
    p = ef.compile("s = x[i] x[i]")
    x = np.arange(4.0)
    try:
        ef.set_backend("dask", chunks=2)
        assert ef.get_default_backend() == "dask"
        with_dask = p(x=x)
        assert type(with_dask) is np.float64 and with_dask == 14.0
        ef.set_backend("numpy")
        assert ef.get_default_backend() == "numpy"
        assert isinstance(p(x=da.from_array(x)), np.float64)  # numpy by default now, even for dask inputs
    finally:
        ef.set_backend("auto")
        ef.engine.backends.get_backend("dask").configure(chunks="auto")
    assert isinstance(p(x=da.from_array(x)), da.Array)


@needs_dask
def test_repeated_calls_reuse_one_plan() -> None:
    p = ef.compile("Product[row,col] = A[row,k] B[k,col]")
    A, B = np.ones((3, 4)), np.ones((4, 2))
    for _ in range(3):
        p(A=A, B=B)
        p(A=A, B=B, backend="numpy")
    assert p.cache_info().plans == 1
    p(A=A, B=B, backend="dask")
    assert p.cache_info().plans == 2


@needs_dask
def test_the_same_array_twice_is_one_graph_input() -> None:
    p = ef.compile("s = x[i] y[i] z[i]")
    x = np.arange(5.0)
    lazy = p(x=x, y=x, z=da.ones(5))  # x and y are one numpy array: converted once
    sources = [name for name in lazy.dask.layers if name.startswith("array-")]
    assert len(sources) == 1
    assert float(lazy.compute()) == float(x @ x)


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_backend_lists_choices_and_install_command() -> None:
    p = ef.compile("s = x[i] x[i]")
    with pytest.raises(ef.BackendError) as error:
        p(x=np.ones(3), backend="tensorflow")
    message = str(error.value)
    for choice in ("numpy", "cupy", "dask", "auto"):
        assert choice in message
    assert "pip install 'einflow[dask]'" in message
    with pytest.raises(ef.BackendError):
        ef.set_backend("tensorflow")
    assert ef.get_default_backend() == "auto"


@needs_dask
def test_unknown_backend_setting_is_an_error() -> None:
    with pytest.raises(ef.BackendError, match="chunks"):
        ef.set_backend("dask", chunk=4)
    with pytest.raises(ef.BackendError, match="no setting"):
        ef.set_backend("numpy", chunks=4)
    assert ef.get_default_backend() == "auto"


def test_missing_cupy_is_a_backend_error() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cupy is installed here; tests/test_cupy.py covers it")
    with pytest.raises(ef.BackendError, match=r"pip install 'einflow\[cupy\]'"):
        ef.compile("s = x[i] x[i]")(x=np.ones(3), backend="cupy")


@needs_dask
def test_bad_chunks_and_non_numeric_inputs_are_einflow_errors() -> None:
    p = ef.compile("C[i,j] = A[i,k] B[k,j]")
    with pytest.raises(ef.BackendError, match="chunks"):
        p(A=np.ones((2, 2)), B=np.ones((2, 2)), backend="dask", chunks=(1, 1, 1))
    with pytest.raises(ef.EinflowError, match="dtype"):
        p(A=np.array([["a", "b"], ["c", "d"]]), B=np.ones((2, 2)), backend="numpy")


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_uninstalled_dask_names_the_install_command() -> None:
    code = ("import sys; sys.modules['dask'] = None\n"
            "import numpy as np, einflow as ef\n"
            "try:\n    ef.compile('s = x[i] x[i]')(x=np.ones(3), backend='dask')\n"
            "except ef.BackendError as error:\n    print('ERROR', error)\n")
    completed = _run_python(code)
    assert completed.returncode == 0, completed.stderr
    assert "ERROR" in completed.stdout and "pip install 'einflow[dask]'" in completed.stdout


@needs_dask
def test_backend_libraries_are_imported_only_when_asked() -> None:
    code = ("import sys, numpy as np, einflow\n"
            "print(einflow.compile('y[i] = exp(A[i,j] x[j])')(A=np.ones((2, 2)), x=np.ones(2)).sum())\n"
            "print(sorted(m for m in ('dask', 'cupy', 'distributed') if m in sys.modules))\n"
            "einflow.compile('s = x[i] x[i]')(x=np.ones(2), backend='dask')\n"
            "print('dask' in sys.modules)\n")
    completed = _run_python(code)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.split()
    assert lines[1] == "[]", completed.stdout
    assert lines[2] == "True"
