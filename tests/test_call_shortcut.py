"""A repeated numpy call of one signature runs its plan's function straight away (``Program.__call__``'s
shortcut): it must give what the general path gives, for every way of passing inputs, and step aside whenever
the signature, the options or the backend change."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
import einflow.program


def test_repeated_calls_match_the_general_path_by_keyword_position_and_mapping() -> None:
    program = ef.compile("y[i] = tanh(A[i,j] x[j]) + s")
    rng = np.random.default_rng(0)
    A, x = rng.standard_normal((3, 4)), rng.standard_normal(4)
    expected = np.tanh(A @ x) + 0.5
    for _ in range(3):
        np.testing.assert_allclose(program(A=A, x=x, s=0.5), expected)
        np.testing.assert_allclose(program(A, x, 0.5), expected)
        np.testing.assert_allclose(program({"A": A, "x": x, "s": 0.5, "unused": 1}), expected)
    assert program._plans.calls  # the shortcut was learned
    assert program.cache_info().plans == 1


def test_a_new_shape_dtype_or_number_type_takes_the_general_path() -> None:
    program = ef.compile("y[i] = A[i,j] x[j] * s")
    A = np.arange(6.0).reshape(2, 3)
    x = np.ones(3)
    for _ in range(2):
        assert program(A=A, x=x, s=2.0).tolist() == [6.0, 24.0]
    wide = np.arange(8.0).reshape(2, 4)
    assert program(A=wide, x=np.ones(4), s=2.0).tolist() == [12.0, 44.0]
    assert program(A=A.astype(np.float32), x=x.astype(np.float32), s=2.0).dtype == np.float32
    assert program(A=A.astype(np.int64), x=np.ones(3, dtype=np.int64), s=2).dtype == np.int64
    assert program(A=A, x=x, s=2).tolist() == [6.0, 24.0]
    with pytest.raises(ef.EinflowError):
        program(A=A, x=np.ones(4), s=2.0)  # a wrong shape is still refused after the shortcut has been learned
    assert program(A=A, x=x, s=2.0).tolist() == [6.0, 24.0]


def test_the_shortcut_keeps_a_derivatives_dtype_and_booleans() -> None:
    gradient = ef.grad("L = sum[i](c[i] exp(w[i]))", wrt="w")
    c = np.arange(3.0)
    for dtype in (np.float32, np.float64, np.float32, np.float32):
        w = np.zeros(3, dtype=dtype)
        result = gradient(c=c, w=w)
        assert result.dtype == dtype
        np.testing.assert_allclose(result, c)
    copy = ef.compile("y[j] = x[j + 1]")
    flags = np.array([True, False, True])
    for _ in range(3):
        result = copy(x=flags)
        assert result.dtype == np.bool_ and result.tolist() == [False, True]


def test_options_and_backends_take_their_own_plans() -> None:
    program = ef.compile("s = x[i] x[i]")
    x = np.arange(4.0)
    for _ in range(2):
        assert program(x=x) == 14.0
    assert program(x=x, optimize="greedy") == 14.0
    assert program(x=x, memory_limit=None) == 14.0
    assert program(x=x, backend="numpy") == 14.0
    assert program(x=x) == 14.0
    assert type(program(x=x)) is np.float64  # a full reduction is a numpy scalar, as numpy's


def test_unknown_keywords_and_missing_inputs_are_refused_after_the_shortcut_is_learned() -> None:
    program = ef.compile("y[i] = x[i] + z[i]")
    x = np.ones(2)
    program(x=x, z=x)
    program(x=x, z=x)
    with pytest.raises(ef.EinflowError, match="unexpected keyword 'w'"):
        program(x=x, w=x)
    with pytest.raises(ef.EinflowError, match="'z' is not bound"):
        program(x=x)


def test_the_shortcut_follows_the_least_recently_used_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(einflow.program.PlanCache, "maxsize", 2)
    program = ef.Program(ef.compile("s = x[i] x[i]").ir)
    for size in (1, 2, 1, 1, 3):  # 1 is used last but one: 2 goes
        assert program(x=np.ones(size)) == size
    assert sorted(key[3][0][0] for key in program._plans) == [(1,), (3,)]
    assert sorted(call.signature[0][0] for call in program._plans.calls.values()) == [(1,), (3,)]
    assert program(x=np.ones(2)) == 2.0


def test_the_fast_call_by_keyword_steps_aside_for_anything_else() -> None:
    """The signature called last by keyword with the default options runs as one generated function
    (``einflow.plan_cache.fast_call``); options, other arrays, other names and another default backend do not."""
    program = ef.compile("y[i] = A[i,j] x[j] + s")
    A, x = np.arange(6.0).reshape(2, 3), np.ones(3)
    for _ in range(3):
        assert program(A=A, x=x, s=1.0).tolist() == [4.0, 13.0]
    assert program._plans.fast is not None
    assert program(A=A, x=x, s=1).tolist() == [4.0, 13.0]  # an int, not the float learned
    assert program(A=A, x=x, s=1.0, optimize="greedy").tolist() == [4.0, 13.0]
    assert program(A=A, x=x, s=1.0, backend="numpy").tolist() == [4.0, 13.0]
    assert program(A=A[:, :2], x=x[:2], s=1.0).tolist() == [2.0, 8.0]
    with pytest.raises(TypeError):
        program(A=A, x=x, t=1.0)  # an unknown keyword in place of an input
    torch = pytest.importorskip("torch")
    program(A=A, x=x, s=1.0)
    result = program(A=torch.as_tensor(A), x=torch.as_tensor(x), s=1.0)  # same shapes and dtypes, not numpy
    assert isinstance(result, torch.Tensor) and result.tolist() == [4.0, 13.0]
    scalar = ef.compile("t = x[i] x[i]")
    for _ in range(3):
        value = scalar(x=x)
        assert type(value) is np.float64 and value == 3.0
    named = ef.compile("y[i] = chunks[i] + 1")  # an input named like a call option: no fast call
    for _ in range(2):
        assert named({"chunks": x}).tolist() == [2.0, 2.0, 2.0]
    assert named._plans.fast is None
