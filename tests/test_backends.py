"""Backends: one corpus of programs checked on numpy and dask against independent numpy references.

Also: backend selection (``backend=``, ``set_backend``, ``auto``), array types in and out, the errors for
unknown or missing backends, and lazy imports of backend libraries.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import einflow as ef

try:
    import dask.array as da
except ImportError:  # the numpy half of the tests still runs
    da = None

needs_dask = pytest.mark.skipif(da is None, reason="dask is not installed (pip install 'einflow[dask]')")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class Case:
    """A program, its input shapes (``()`` for a 0-d array, ``"float"`` for a Python number), a reference."""

    name: str
    text: str
    shapes: dict[str, Any]
    reference: Callable[..., Any]
    positive: bool = False  # inputs drawn from (0.5, 1.5) instead of N(0, 1)
    integer: bool = False  # integer inputs

    def arrays(self, seed: int = 0) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        out: dict[str, Any] = {}
        for name, shape in self.shapes.items():
            if shape == "float":
                out[name] = float(rng.uniform(0.5, 1.5))
            elif self.integer:
                out[name] = rng.integers(-5, 6, size=shape)
            elif self.positive:
                out[name] = rng.uniform(0.5, 1.5, size=shape)
            else:
                out[name] = rng.standard_normal(shape)
        return out


# The core corpus: each program with an independent reference written with numpy (einsum, ufuncs, closed forms).
CORPUS: list[Case] = [
    Case("matmul", "C[i,j] = A[i,k] B[k,j]", {"A": (5, 4), "B": (4, 3)},
         lambda A, B: np.einsum("ik,kj->ij", A, B)),
    Case("chain", "y[i] = A[i,j] B[j,k] x[k]", {"A": (6, 5), "B": (5, 7), "x": (7,)},
         lambda A, B, x: A @ (B @ x)),
    Case("dot", "s = x[i] y[i]", {"x": (9,), "y": (9,)}, lambda x, y: np.dot(x, y)),
    Case("outer", "O[i,j] = x[i] y[j]", {"x": (5,), "y": (3,)}, lambda x, y: np.multiply.outer(x, y)),
    Case("trace", "t = A[i,i]", {"A": (5, 5)}, lambda A: np.trace(A)),
    Case("diagonal", "d[i] = A[i,i]", {"A": (5, 5)}, lambda A: np.diagonal(A).copy()),
    Case("hadamard", "H[i,j] = A[i,j] B[i,j]", {"A": (4, 3), "B": (4, 3)}, lambda A, B: A * B),
    Case("bound-target", "y[i] = A[i,j] x[i]", {"A": (4, 6), "x": (4,)},
         lambda A, x: np.einsum("ij,i->i", A, x)),
    Case("broadcast-sum", "Z[b,f] = X[b,f] + c[f]", {"X": (5, 3), "c": (3,)}, lambda X, c: X + c[None, :]),
    Case("per-term-reduce", "y[i] = A[i,j] + c[i]", {"A": (4, 6), "c": (4,)}, lambda A, c: A.sum(axis=1) + c),
    Case("scaled-difference", "z[i] = 2 x[i] - 0.5 y[i]", {"x": (7,), "y": (7,)}, lambda x, y: 2 * x - 0.5 * y),
    Case("exp-log", "y[i] = exp(x[i]) + log(1 + x[i]^2)", {"x": (6,)},
         lambda x: np.exp(x) + np.log(1 + x**2)),
    Case("trig-sqrt", "y[i] = sqrt(x[i]) sin(x[i]) + cos(x[i]) tanh(x[i])", {"x": (6,)},
         lambda x: np.sqrt(x) * np.sin(x) + np.cos(x) * np.tanh(x), positive=True),
    Case("nonsmooth", "y[i] = sigmoid(x[i]) + relu(x[i]) - abs(x[i]) + sign(x[i]) step(x[i])", {"x": (8,)},
         lambda x: _sigmoid(x) + np.maximum(x, 0) - np.abs(x) + np.sign(x) * (x > 0)),
    Case("log1p", "y[i] = log1p(x[i] x[i])", {"x": (6,)}, lambda x: np.log1p(x * x)),
    Case("logistic-loss", "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", {"X": (8, 3), "y": (8,), "w": (3,)},
         lambda X, y, w: np.sum(np.log1p(np.exp(-y * (X @ w))))),
    Case("softmax", "m[i] = exp(x[i])\nZ = sum[i](m[i])\np[i] = m[i] / Z", {"x": (6,)},
         lambda x: np.exp(x) / np.exp(x).sum()),
    Case("divisor-scope", "y[i] = x[i]^3 / (1 + x[j] x[j])", {"x": (5,)}, lambda x: x**3 / (1 + x @ x)),
    Case("negative-powers", "y[i] = x[i]^-0.5 + x[i]^(-1)", {"x": (5,)}, lambda x: x**-0.5 + 1 / x, positive=True),
    Case("delta-survives", "J[i,j] = delta[i,j] exp(x[i])", {"x": (5,)}, lambda x: np.diag(np.exp(x))),
    Case("delta-eliminated", "y[i] = delta[i,j] x[j]", {"x": (5,)}, lambda x: x.copy()),
    Case("delta-sized", "size p = x; size q = x\nH[p,q] = 2 delta[p,q]", {"x": (4,)}, lambda x: 2 * np.eye(4)),
    Case("delta-rank3", "T[i,j,k] = delta[i,j] delta[j,k] x[i]", {"x": (3,)},
         lambda x: np.einsum("ij,jk,i->ijk", np.eye(3), np.eye(3), x)),
    Case("return-tuple", "h[i] = tanh(W[i,j] x[j] + b[i])\no = v[i] h[i]\no, h",
         {"W": (4, 3), "x": (3,), "b": (4,), "v": (4,)},
         lambda W, x, b, v: (v @ np.tanh(W @ x + b), np.tanh(W @ x + b))),
    Case("batched-affine", "Y[b,i] = X[b,j] W[i,j] + bias[i]", {"X": (6, 4), "W": (3, 4), "bias": (3,)},
         lambda X, W, bias: X @ W.T + bias),
    Case("quadratic-form", "q = x[i] A[i,j] x[j]", {"x": (5,), "A": (5, 5)}, lambda x, A: x @ A @ x),
    Case("frobenius", "n = sum[i,j](A[i,j]^2)", {"A": (4, 5)}, lambda A: np.sum(A**2)),
    Case("integers", "y[i] = 6 x[i] + M[i,j] x[j]", {"x": (4,), "M": (4, 4)}, lambda x, M: 6 * x + M @ x,
         integer=True),
    Case("python-scalar", "y[i] = a x[i] + a", {"a": "float", "x": (5,)}, lambda a, x: a * x + a),
    Case("zero-d-array", "y[i] = s x[i]", {"s": (), "x": (5,)}, lambda s, x: s * x),
    Case("three-tensor", "R[a,d] = T[a,b,c] U[c,b,d]", {"T": (3, 4, 5), "U": (5, 4, 2)},
         lambda T, U: np.einsum("abc,cbd->ad", T, U)),
]

# Derivative programs (need einflow.grad/hessian): (name, builder, shapes, closed-form reference).
DERIVATIVES: list[tuple[str, Callable[[], Any], dict[str, Any], Callable[..., Any]]] = [
    ("grad-logistic", lambda: ef.grad("L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", wrt="w"),
     {"X": (8, 3), "y": (8,), "w": (3,)},
     lambda X, y, w: -X.T @ (y * _sigmoid(-y * (X @ w)))),
    ("grad-tanh-layer", lambda: ef.grad("f = sum[i](tanh(W[i,j] x[j]))", wrt="W"), {"W": (4, 3), "x": (3,)},
     lambda W, x: np.multiply.outer(1 - np.tanh(W @ x) ** 2, x)),
    ("hessian-quadratic", lambda: ef.hessian("f = x[i] A[i,j] x[j]", wrt="x"), {"x": (5,), "A": (5, 5)},
     lambda x, A: A + A.T),
    ("hessian-elementwise", lambda: ef.hessian("f = sum[i](exp(x[i]))", wrt="x"), {"x": (5,)},
     lambda x: np.diag(np.exp(x))),
]

needs_grad = pytest.mark.skipif(not (hasattr(ef, "grad") and hasattr(ef, "hessian")),
                                reason="einflow.grad/hessian are not available yet")


def assert_matches(result: Any, expected: Any) -> None:
    if isinstance(expected, tuple):
        assert isinstance(result, tuple) and len(result) == len(expected)
        for got, want in zip(result, expected):
            assert_matches(got, want)
        return
    got = np.asarray(result)
    want = np.asarray(expected)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


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
        ef.backends.get_backend("dask").configure(chunks="auto")
    assert isinstance(p(x=da.from_array(x)), da.Array)


@needs_dask
def test_repeated_calls_reuse_one_plan() -> None:
    p = ef.compile("Product[row,col] = A[row,k] B[k,col]")
    A, B = np.ones((3, 4)), np.ones((4, 2))
    for _ in range(3):
        p(A=A, B=B)
        p(A=A, B=B, backend="numpy")
    assert len(p._plans) == 1
    p(A=A, B=B, backend="dask")
    assert len(p._plans) == 2


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
        p(x=np.ones(3), backend="torch")
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
