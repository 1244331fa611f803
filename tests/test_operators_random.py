"""Differential test of the operators of LANGUAGE.md §9.1 on random programs (tests/randprog.py).

Each scalar random program is batched: a new index ``bb`` is put first on its ``wrt`` input and on every
tensor computed from it, so the value becomes one scalar per sample. einflow's ``laplacian``, ``hessian``,
``hessian_diagonal``, ``jacobian`` and ``bilaplacian`` with ``batch="bb"``, the weighted Laplacian and
``taylor`` (of the per-sample program) are compared with ``jax.vmap`` of JAX derivatives of randprog's own
evaluator (an independent implementation of the language rules) in float64. One check per program, by
rotation over the seeds. ``EINFLOW_OPERATORS_N`` sets how many programs (default 60),
``EINFLOW_OPERATORS_START`` the first seed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import randprog  # noqa: E402

import einflow as ef  # noqa: E402
from einflow.lang import ir  # noqa: E402
from einflow.lang.grammar import parse  # noqa: E402
from einflow.lang.indices import free_indices  # noqa: E402

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

COUNT = int(os.environ.get("EINFLOW_OPERATORS_N", "60"))
START = int(os.environ.get("EINFLOW_OPERATORS_START", "0"))
CHECKS = ("laplacian", "hessian", "hessian_diagonal", "jacobian", "weighted", "taylor", "bilaplacian")
BATCH = 3


def _vmap(function):  # type: ignore[no-untyped-def]
    """``jax.vmap`` compiled once: the reference's Hessians run in XLA, not op by op."""
    return jax.jit(jax.vmap(function))


def _batched_text(text: str, x: str, name: str = "bb") -> str:
    """``text`` with index ``name`` first on ``x`` and on everything computed from it (written here, from the
    IR's dataclasses, independently of einflow.derive.batch)."""
    program = parse(text)
    varying = {x}

    def put(node: ir.Expr) -> ir.Expr:
        if isinstance(node, ir.Tensor) and node.name in varying:
            return ir.Tensor(node.name, (name, *node.indices))
        if isinstance(node, ir.Read) and node.name in varying:
            return ir.Read(node.name, (name, *node.positions))
        children = ir.children(node)
        return ir.with_children(node, tuple(put(c) for c in children)) if children else node

    statements: list[ir.Statement] = []
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            reads = {n.name for n in ir.walk(statement.expr) if isinstance(n, (ir.Tensor, ir.Read))}
            if reads & varying:
                indices = statement.indices if statement.indices is not None else free_indices(statement.expr)
                target = statement.target if statement.target is not None else "bb_value"
                statements.append(ir.Assign(target, (name, *indices), put(statement.expr)))
                if statement.target is not None:
                    varying.add(statement.target)
                continue
        elif isinstance(statement, ir.SizeDecl) and statement.source in varying:
            statements.append(ir.SizeDecl(("bb_size", *statement.names), statement.source))
            continue
        statements.append(statement)
    return ir.format_program(ir.ProgramIR(tuple(statements)))


def _case(seed: int) -> tuple[Any, str, str, dict[str, np.ndarray], np.ndarray] | None:
    case = randprog.generate(seed)
    if not case.scalar:
        return None
    x = case.wrt[0]
    arrays = randprog.make_arrays(case.program, seed)
    if np.ndim(arrays[x]) == 0 or np.size(arrays[x]) > 12:
        return None
    if "bb" in case.text:
        return None
    text = _batched_text(case.text, x)
    try:  # (a product of two batched factors inside a term would sum bb there: not this program's meaning)
        ef.compile(text)
    except ef.EinflowError:
        return None
    if "bb" not in text.strip().splitlines()[-1]:
        return None  # the value does not depend on x
    rng = np.random.default_rng(seed + 7)
    samples = arrays[x][None] * rng.uniform(0.9, 1.1, size=(BATCH, *np.shape(arrays[x])))
    return case, text, x, arrays, samples


@pytest.mark.parametrize("seed", range(START, START + COUNT))
def test_operators_on_random_batched_programs(seed: int) -> None:
    found = _case(seed)
    if found is None:
        pytest.skip("not a scalar program with a small tensor input (the generator's draw)")
    case, text, x, arrays, samples = found
    check = CHECKS[seed % len(CHECKS)]
    shape = np.shape(arrays[x])
    size = int(np.prod(shape))
    read = set(ef.compile(case.text).inputs)
    arrays = {k: v for k, v in arrays.items() if k in read}
    inputs = {k: v for k, v in arrays.items() if k != x}

    def f(u):  # type: ignore[no-untyped-def]  # one sample's value, by randprog's evaluator
        return randprog.evaluate(case.program, {**arrays, x: u}, jnp)

    def hessian(u):  # type: ignore[no-untyped-def]
        return jax.hessian(f)(u).reshape(size, size)

    def trace(g):  # type: ignore[no-untyped-def]
        return lambda u: jnp.trace(jax.hessian(g)(u).reshape(size, size))

    batch = jnp.asarray(samples)
    given = {**inputs, x: samples}
    message = f"{check} (seed {seed}) of\n{text}"
    if check == "laplacian":
        got, want = ef.laplacian(text, wrt=x, batch="bb")(**given), _vmap(trace(f))(batch)
    elif check == "hessian":
        got = ef.hessian(text, wrt=x, batch="bb")(**given)
        want = _vmap(hessian)(batch).reshape(BATCH, *shape, *shape)
    elif check == "hessian_diagonal":
        got = ef.hessian_diagonal(text, wrt=x, batch="bb")(**given)
        want = _vmap(lambda u: jnp.diagonal(hessian(u)))(batch).reshape(BATCH, *shape)
    elif check == "jacobian":
        got, want = ef.jacobian(text, wrt=x, batch="bb")(**given), _vmap(jax.grad(f))(batch)
    elif check == "weighted":
        c = np.random.default_rng(seed).normal(size=(size, size))
        got = ef.laplacian(text, wrt=x, batch="bb", weights="CW")(**given, CW=c.reshape(*shape, *shape))
        want = _vmap(lambda u: jnp.sum(jnp.asarray(c) * hessian(u)))(batch)
    elif check == "taylor":
        direction = np.random.default_rng(seed).normal(size=shape)
        got = ef.taylor(case.text, wrt=x, direction="dv", order=3)(**arrays, dv=direction)
        path = lambda t: f(jnp.asarray(arrays[x]) + t * direction)  # noqa: E731
        want = []
        for _ in range(3):
            path = jax.jacfwd(path)
            want.append(path(0.0))
    else:
        if size > 6:
            pytest.skip("bi-Laplacian checked on inputs of at most 6 elements (nested JAX Hessians)")
        got, want = ef.bilaplacian(text, wrt=x, batch="bb")(**given), _vmap(trace(trace(f)))(batch)
    scale = 1 + float(np.max(np.abs(np.asarray(want, dtype=float))))
    np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=1e-7,
                               atol=1e-9 * scale, err_msg=message)
