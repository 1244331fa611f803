"""The engine's passes: specialise makes one frozen record; fit, render and report read it and agree with it."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import einflow as ef
import einflow.engine.blocks as blocks
from einflow.engine.backends import get_backend
from einflow.engine.fitting import NO_FITTING, fit
from einflow.engine.lower import lower
from einflow.engine.plan import _peak, build_plan, report_steps
from einflow.engine.render import render
from einflow.engine.specialise import Specialised, specialise


def _record(text: str, shapes: dict[str, tuple[int, ...]], backend: str = "numpy") -> tuple[ef.Program, Specialised]:
    program = ef.compile(text)
    dtypes = {name: np.dtype("float64") for name in program.info.inputs}
    lowered = lower(program.ir)
    return program, specialise(program.ir, lowered, shapes, dtypes, get_backend(backend), "auto", program.source,
                               None)


def test_the_record_is_frozen_and_rendering_leaves_it_as_it_was() -> None:
    _, record = _record("y[i,j] = tanh(A[i,k] B[k,j]) + exp(A[i,k] B[k,j])", {"A": (30, 20), "B": (20, 40)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.shapes = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        record.transients[0] = 1  # type: ignore[index]
    before = {field.name: dict(value) if hasattr(value, "items") else value
              for field in dataclasses.fields(record) for value in [getattr(record, field.name)]}
    first, second = render(record, NO_FITTING), render(record, NO_FITTING)
    after = {field.name: dict(value) if hasattr(value, "items") else value
             for field in dataclasses.fields(record) for value in [getattr(record, field.name)]}
    assert before == after
    assert first.source == second.source  # rendering twice from one record: the same code
    A, B = np.random.default_rng(0).normal(size=(30, 20)), np.random.default_rng(1).normal(size=(20, 40))
    np.testing.assert_allclose(first.function(A, B), np.tanh(A @ B) + np.exp(A @ B))


def test_block_kernel_memory_is_known_before_rendering_and_matches_the_rendered_kernel() -> None:
    shape = (1000, 300)
    _, record = _record("y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])", {"A": shape, "B": shape})
    (planned,) = record.expressions.values()
    assert planned.blocks is not None
    rendered = render(record, NO_FITTING)
    # the generated call: _run_blocks(kernel, (operands,), sliced, shape, dtype, rows, buffers)
    call = re.search(r"_run_blocks\(_kernel\d+, \([^)]*\), \([^)]*\), \((\d+), (\d+)\), 'float64', (\d+), (\d+)\)",
                     rendered.source)
    assert call is not None, rendered.source
    rows, buffers = int(call.group(3)), int(call.group(4))
    assert (rows, buffers) == (planned.blocks.rows, planned.blocks.buffers)
    # the kernel's own parameters: operands, out, then one per buffer
    parameters = re.search(r"def _kernel\d+\(([^)]*)\)", rendered.source).group(1).split(", ")  # type: ignore
    assert len([p for p in parameters if re.fullmatch(r"t\d+", p)]) == planned.blocks.buffers
    threads = blocks.threads_for(shape, rows)
    (transient,) = record.transients.values()
    assert transient == threads * buffers * rows * shape[1] * 8


def test_the_report_and_the_peak_read_the_record_the_code_was_rendered_from() -> None:
    program, record = _record("C[i,j] = A[i,k] B[k,l] D[l,j]", {"A": (300, 200), "B": (200, 250), "D": (250, 300)})
    plan = build_plan(program.ir, program.info, {"A": (300, 200), "B": (200, 250), "D": (250, 300)}, 8,
                      get_backend("numpy"), source=program.source)
    assert plan.peak_bytes == _peak(record.lowered.steps, dict(record.allocations), dict(record.transients))[0]
    (step,) = report_steps(record, NO_FITTING, render(record, NO_FITTING).names)
    (contraction,) = record.contractions.values()
    assert (step.flops, step.largest, tuple(step.pairwise)) == (contraction.flops, contraction.largest,
                                                                contraction.pairwise)
    assert step.flops == plan.steps[0].flops


def test_fit_decides_from_the_record_and_the_fitted_plan_stays_under_the_limit() -> None:
    shapes = {"A": (300, 200), "B": (200, 250), "D": (250, 300)}
    program, record = _record("C[i,j] = A[i,k] B[k,l] D[l,j]", shapes)
    whole = _peak(record.lowered.steps, dict(record.allocations), dict(record.transients))[0]
    limit = 1_000_000
    assert whole > limit
    fitting = fit(record, limit)
    (out,) = fitting.slicings
    assert fitting.transients is not None
    fitted = _peak(record.lowered.steps, dict(record.allocations), dict(fitting.transients))[0]
    assert fitted <= limit < whole
    plan = build_plan(program.ir, program.info, shapes, 8, get_backend("numpy"), memory_limit=limit,
                      source=program.source)
    assert plan.peak_bytes == fitted
    (reported,) = plan.steps
    assert reported.slices == fitting.slicings[out].slices > 1
    rng = np.random.default_rng(2)
    A, B, D = (rng.normal(size=shape) for shape in shapes.values())
    np.testing.assert_allclose(plan.run([A, B, D]), A @ B @ D, rtol=1e-10, atol=1e-10)
