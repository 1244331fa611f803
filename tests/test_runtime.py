"""The runtime helpers are real functions: called directly, and the text the generated code defines is theirs."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
from einflow.engine import runtime
from einflow.engine.dialect import DIALECTS, JAX, NUMPY, TORCH
from einflow.engine.helpers import HELPER_KEYS, function_source, helper_text, helpers

ALIAS = {key: f"_{key}" for key in ("np", "oe", *HELPER_KEYS)}


def test_every_helper_is_a_function_of_the_runtime_module() -> None:
    for key in HELPER_KEYS:
        assert callable(getattr(runtime, key)), key
        assert function_source("einflow.engine.runtime", key) is not None


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_helper_text_is_the_function_renamed(dialect: str) -> None:
    for key in HELPER_KEYS:
        text = helper_text(DIALECTS[dialect], key, ALIAS)
        assert text.startswith(f"def _{key}("), text[:40]
        assert "xp." not in text  # the array module under the generated code's name
        compile(text, key, "exec")


def test_a_local_variable_named_like_a_helper_keeps_its_name() -> None:
    text = helper_text(TORCH, "linalg", ALIAS)
    assert "sign, logdet = _np.linalg.slogdet(x)" in text
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

    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    np.testing.assert_allclose(runtime_torch.reduce("softmax", x, (1,)).numpy(),
                               runtime.reduce("softmax", x.numpy(), (1,)))
    assert runtime_torch.sign(torch.tensor([float("nan")])).isnan().all()


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
    assert on_torch["_reduce"].__code__ is runtime_torch.reduce.__code__
    assert on_torch["_owned"].__code__ is runtime.owned.__code__  # (numpy's: torch has no own)
    assert on_torch["_np"] is torch
