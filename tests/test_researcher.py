"""The researcher benchmark's cases: value, gradient and Hessian of both einflow forms (primitives and
built-ins) against JAX in float64 (rtol 1e-9), the hand-written numpy gradient, and float32 stability."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import einflow as ef

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from researcher import CASES, Case  # noqa: E402

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

IDS = [case.name for case in CASES]


@pytest.mark.parametrize("form", ["primitives", "builtins"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_value_gradient_hessian_match_jax(case: Case, form: str) -> None:
    inputs = case.make(np.random.default_rng(3), 12)
    loss = case.jax_loss(jax.numpy)
    position = list(inputs).index(case.wrt)
    text = getattr(case, form)
    program = ef.compile(text)
    np.testing.assert_allclose(program(**{n: inputs[n] for n in program.inputs}), loss(*inputs.values()), rtol=1e-9)
    gradient = ef.grad(text, wrt=case.wrt)
    got = gradient(**{n: inputs[n] for n in gradient.inputs})
    np.testing.assert_allclose(got, jax.grad(loss, argnums=position)(*inputs.values()), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got, case.numpy_grad(**inputs), rtol=1e-9, atol=1e-12)
    hessian = ef.hessian(text, wrt=case.wrt)
    expected = jax.hessian(loss, argnums=position)(*inputs.values())
    np.testing.assert_allclose(hessian(**{n: inputs[n] for n in hessian.inputs}), expected, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("form", ["primitives", "builtins"])
@pytest.mark.parametrize("case", [c for c in CASES if c.wrt == "x" or c.name == "attention"], ids=lambda c: c.name)
def test_float32_is_finite_at_200(case: Case, form: str) -> None:
    inputs = case.make(np.random.default_rng(4), 12)
    scaled = {name: (value * (200 / np.abs(value).max()) if name in ("x", "Q") else value).astype(np.float32)
              for name, value in inputs.items()}
    text = getattr(case, form)
    for program in (ef.compile(text), ef.grad(text, wrt=case.wrt)):
        value = program(**{n: scaled[n] for n in program.inputs})
        assert value.dtype == np.float32 and np.all(np.isfinite(value)), (program, value)


def test_builtin_gradients_are_compact() -> None:
    """No step of a built-in form's gradient is larger than its largest input."""
    for case in CASES:
        inputs = case.make(np.random.default_rng(5), 64)
        gradient = ef.grad(case.builtins, wrt=case.wrt)
        largest = max(np.asarray(v).size for v in inputs.values())
        shapes = {n: np.shape(inputs[n]) for n in gradient.inputs}
        for step in gradient.plan(**shapes).steps:
            assert int(np.prod(step.shape)) <= largest, (case.name, step)
