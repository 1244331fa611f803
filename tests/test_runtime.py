"""The runtime helpers are real functions: called directly, and the text the generated code defines is theirs."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
from einflow.engine import runtime
from einflow.engine.dialect import DIALECTS, JAX, NUMPY, TORCH
from einflow.engine.helpers import (
    HELPER_KEYS,
    WINDOW_KEYS,
    defined_helpers,
    function_source,
    helper_needs,
    helper_text,
    helpers,
)
from einflow.engine.runtime_numpy import PRIMITIVES

ALIAS = {key: f"_{key}" for key in ("np", "oe", *HELPER_KEYS)}


def test_every_helper_is_a_function_of_the_runtime_module() -> None:
    for key in HELPER_KEYS:
        assert callable(getattr(runtime, key)), key
        assert (function_source("einflow.engine.runtime", key) or
                function_source("einflow.engine.runtime_numpy", key)) is not None, key


@pytest.mark.parametrize("module", ["einflow.engine.runtime_torch", "einflow.engine.runtime_jax"])
def test_a_dialect_module_redefines_only_the_table(module: str) -> None:
    """One implementation per algorithm: torch's and jax's modules hold only the operations their libraries
    spell differently; softmax, the linear algebra, windows and scatter-adds are runtime's alone."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as file:
        defined = {node.name for node in ast.parse(file.read()).body if isinstance(node, ast.FunctionDef)}
    assert defined <= set(PRIMITIVES), sorted(defined - set(PRIMITIVES))
    for algorithm in ("reduce", "linalg", "solve", "divide", "diagonal", *WINDOW_KEYS):
        assert function_source(module, algorithm) is None


def _called_by_text(dialect_name: str, key: str) -> set[str]:
    """The helpers ``key``'s source calls in a dialect, read off its text with a regular expression (the
    reference for ``helper_needs``, which walks the syntax tree), and those they call."""
    import re

    dialect, found, todo = DIALECTS[dialect_name], set(), [key]
    names = (*HELPER_KEYS, *WINDOW_KEYS)
    while todo:
        name = todo.pop()
        for module in filter(None, (dialect.runtime, "einflow.engine.runtime_numpy", "einflow.engine.runtime")):
            source = function_source(module, name)
            if source is not None:
                break
        body = source[0].split("\n", 1)[1]  # (not its own def line)
        body = re.sub(r"#.*", "", body)
        body = re.sub(r'"""[\s\S]*?"""|f?"[^"\n]*"', "", body)  # docstrings and messages
        for called in set(re.findall(r"(?<![.\w])(\w+)\(", body)) & set(names):
            if called not in found and called != key:
                found.add(called)
                if called != "fold":
                    todo.append(called)
    return found - {"fold"}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_helper_needs_are_what_the_sources_call(dialect: str) -> None:
    """Each dialect's needs are read from its own sources (a dialect module's functions first)."""
    keys = (*HELPER_KEYS, *(key for key in WINDOW_KEYS if key != "fold"))
    for key in keys:
        assert helper_needs(DIALECTS[dialect], key) == _called_by_text(dialect, key), key


def test_helper_needs_differ_by_dialect() -> None:
    """jax's linear algebra checks its factors with ``flagged``; numpy's and torch's raise from the library."""
    assert "flagged" in helper_needs(JAX, "linalg")
    assert "flagged" not in helper_needs(NUMPY, "linalg") and "flagged" not in helper_needs(TORCH, "linalg")
    assert defined_helpers(NUMPY, {"window"}) >= {"window", "flat", "gather_view", "fold"}
    assert "scatter" not in defined_helpers(NUMPY, {"window", "ranges"})


WINDOWS_AND_SOFTMAX = "y[i] = x[i+1] - x[i]\ns[i] = softmax[i](y[i])\nz[i] = inv[i,j](A[i,j]) s[j] / 2"


@pytest.mark.parametrize("target", sorted(DIALECTS))
def test_exported_source_defines_only_what_it_calls(target: str) -> None:
    """A dialect's exported source defines the helpers its code calls and those they call in that dialect:
    every function it defines is called in it (no torch- or jax-only helper in numpy's source)."""
    import re

    source = ef.compile(WINDOWS_AND_SOFTMAX).to_source("f", target=target)
    defined = re.findall(r"^def (\w+)\(", source, flags=re.M)
    for name in defined:
        if name != "f":
            assert re.search(rf"(?<![.\w]){name}\(", source.replace(f"def {name}(", "")), f"{name} is never called"
    assert ("def _flagged(" in source) == (target == "jax")  # jax's factorisations' checks only
    assert "def _scatter(" not in source  # a forward read: no scatter-add


def test_exported_numpy_source_of_windows_and_softmax_runs_standalone() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(6)
    A = rng.standard_normal((5, 5)) + 5 * np.eye(5)
    namespace: dict[str, object] = {}
    exec(ef.compile(WINDOWS_AND_SOFTMAX).to_source("f"), namespace)  # nothing of einflow in scope
    z = namespace["f"](x=x, A=A)  # type: ignore[operator]
    y = x[1:] - x[:-1]
    s = np.exp(y - y.max()) / np.exp(y - y.max()).sum()
    np.testing.assert_allclose(z, np.linalg.solve(A, s) / 2, rtol=1e-12)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_helper_text_is_the_function_renamed(dialect: str) -> None:
    for key in HELPER_KEYS:
        text = helper_text(DIALECTS[dialect], key, ALIAS)
        assert text.startswith(f"def _{key}("), text[:40]
        assert "xp." not in text  # the array module under the generated code's name
        compile(text, key, "exec")


def test_a_local_variable_named_like_a_helper_keeps_its_name() -> None:
    text = helper_text(TORCH, "solve", ALIAS)
    assert "flat = B.reshape(" in text and "_lu_solved(M, flat)" in text
    assert "from jax.scipy.special import erf\n    return erf(_as_float(x))" in helper_text(JAX, "erf", ALIAS)


def test_softmax_called_directly_and_through_the_generated_names() -> None:
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 1000.0]])
    direct = runtime.reduce("softmax", x, (1,))
    np.testing.assert_allclose(direct.sum(axis=1), 1.0)
    assert np.isfinite(direct).all()
    compiled = helpers(ALIAS, NUMPY, np)["_reduce"]
    np.testing.assert_array_equal(compiled("softmax", x, (1,)), direct)
    expected = [np.log(np.exp(row - row.max()).sum()) + row.max() for row in x]
    np.testing.assert_allclose(runtime.reduce("logsumexp", x, (1,)), expected)


def test_linear_algebra_helpers_directly() -> None:
    matrix = np.array([[4.0, 1.0], [1.0, 3.0]])
    np.testing.assert_allclose(runtime.linalg("inv", matrix, (0, 1)), np.linalg.inv(matrix))
    np.testing.assert_allclose(runtime.linalg("spd_logdet", matrix, (0, 1)), np.log(11.0))
    rhs = np.array([1.0, 2.0])
    np.testing.assert_allclose(runtime.solve("spd_solve", matrix, (0, 1), rhs, 0, False), np.linalg.solve(matrix, rhs))
    with pytest.raises(ValueError, match="singular"):
        runtime.linalg("inv", np.zeros((2, 2)), (0, 1))


def test_small_helpers_directly() -> None:
    assert runtime.divide(1, 0) == float("inf") and runtime.divide(-1.0, 0) == float("-inf")
    assert runtime.reciprocal(-0.0) == float("-inf")
    np.testing.assert_allclose(runtime.sigmoid(np.array([-800.0, 0.0, 800.0])), [0.0, 0.5, 1.0])
    assert runtime.as_float(np.arange(3)).dtype == np.float64
    x = np.array([1.0, 2.0])
    assert runtime.conj(x) is not x and runtime.real(x) is not x
    np.testing.assert_array_equal(runtime.diagonal(np.array([1, 2]), (2, 2), ((0, 1),)), [[1, 0], [0, 2]])


def test_torch_helpers_directly() -> None:
    torch = pytest.importorskip("torch")
    from einflow.engine import runtime_torch

    on_torch = helpers(ALIAS, TORCH, torch)
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    np.testing.assert_allclose(on_torch["_reduce"]("softmax", x, (1,)).numpy(),
                               runtime.reduce("softmax", x.numpy(), (1,)))
    assert runtime_torch.sign(torch.tensor([float("nan")])).isnan().all()
    matrix = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    for kind in ("inv", "spd_inv", "spd_logdet", "det", "sign_det", "logdet", "adj", "spd_factor"):
        np.testing.assert_allclose(on_torch["_linalg"](kind, matrix, (0, 1)).numpy(),
                                   runtime.linalg(kind, matrix.numpy(), (0, 1)), err_msg=kind)
    rhs = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=torch.float64)
    for kind in ("solve", "spd_solve"):
        np.testing.assert_allclose(on_torch["_solve"](kind, matrix, (0, 1), rhs, 0, True).numpy(),
                                   runtime.solve(kind, matrix.numpy(), (0, 1), rhs.numpy(), 0, True), err_msg=kind)
    with pytest.raises(ValueError, match="singular"):
        on_torch["_linalg"]("inv", torch.zeros((2, 2), dtype=torch.float64), (0, 1))


@pytest.mark.parametrize("dialect", ["torch", "jax"])
def test_windows_and_scatters_agree_with_numpy(dialect: str) -> None:
    """The one window and scatter-add algorithm, bound for each library, gives numpy's values."""
    module = pytest.importorskip("torch" if dialect == "torch" else "jax.numpy")
    from einflow.engine.helpers import bound_helpers

    mine, numpy_ = bound_helpers(DIALECTS[dialect], module), bound_helpers(NUMPY, np)
    x = np.arange(24.0).reshape(4, 6)
    rows = np.array([2, 0, 3])
    shifted = (("affine", ((0, 2), (1, 1)), -1), ("gather", 0, (2,)))
    expected = numpy_["window"](x, (2, 2, 3), shifted, rows)
    got = mine["window"](module.asarray(x), (2, 2, 3), shifted, module.asarray(rows))
    np.testing.assert_array_equal(np.asarray(got), expected)
    strided = (("affine", ((0, 1), (1, 1)), 0), ("affine", ((2, 2),), 1))
    np.testing.assert_array_equal(np.asarray(mine["window"](module.asarray(x), (3, 2, 3), strided)),
                                  numpy_["window"](x, (3, 2, 3), strided))
    value = np.arange(12.0).reshape(3, 4)
    positions = (("affine", ((0, 1), (1, 1)), -1), ("gather", 0, (1,)))
    where = np.array([1, 1, 0, 2])
    expected = numpy_["scatter"](value, (5, 3), positions, where)
    got = mine["scatter"](module.asarray(value), (5, 3), positions, module.asarray(where))
    np.testing.assert_array_equal(np.asarray(got), expected)
    np.testing.assert_array_equal(np.asarray(mine["diagonal"](module.asarray([1.0, 2.0]), (2, 2), ((0, 1),))),
                                  [[1.0, 0.0], [0.0, 2.0]])


def test_exported_source_defines_the_runtime_functions() -> None:
    source = ef.compile("y[i] = softmax[j](A[i,j])").to_source("f")
    assert helper_text(NUMPY, "reduce", {**ALIAS, "reduce": "_reduce", "as_float": "_as_float"}) in source


def test_the_generated_code_calls_the_runtime_functions_themselves() -> None:
    bound = helpers(ALIAS, NUMPY, np)
    for key in HELPER_KEYS:
        assert bound[f"_{key}"].__code__ is getattr(runtime, key).__code__, key
    torch = pytest.importorskip("torch")
    from einflow.engine import runtime_torch

    on_torch = helpers(ALIAS, TORCH, torch)
    assert on_torch["_reduce"].__code__ is runtime.reduce.__code__  # one implementation
    assert on_torch["_extreme"].__code__ is runtime_torch.extreme.__code__  # (torch's own amax)
    assert on_torch["_owned"].__code__ is runtime.owned.__code__  # (numpy's: torch has no own)
    assert on_torch["_np"] is torch
