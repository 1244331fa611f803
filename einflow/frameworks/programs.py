"""The derivative programs and plans the framework runners use, each made once per program and signature."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from einflow.derivatives import jvp, value_and_grad, vjp
from einflow.engine.memory import memory_limit_bytes
from einflow.engine.plan import build_plan
from einflow.lang import ir
from einflow.lang.errors import DerivativeError, EinflowError
from einflow.lang.indices import free_indices
from einflow.program import Program

__all__ = ["vjp_program", "jvp_program", "value_and_grad_program", "batched_program", "plan_for"]


def _optimize_key(optimize: Any) -> Any:
    if isinstance(optimize, (str, bool)) or optimize is None:
        return optimize
    if isinstance(optimize, (list, tuple)):
        return tuple(tuple(step) if isinstance(step, (list, tuple)) else step for step in optimize)
    return ("object", id(optimize))


def plan_for(program: Any, engine: Any, values: list[Any], signature: tuple[Any, ...], optimize: Any,
             memory_limit: Any) -> Any:
    """The program's plan for this signature (``(shape, numpy dtype or weak type, device)`` per input), cached.

    The plan lives in the program's own plan cache, beside its numpy plans.
    """
    key = (engine.name, _optimize_key(optimize), memory_limit, signature)
    plan = program._plans.get(key)
    if plan is not None:
        return plan
    shapes = {tensor: entry[0] for tensor, entry in zip(program.info.inputs, signature)}
    dtypes = {tensor: entry[1] for tensor, entry in zip(program.info.inputs, signature)}
    for tensor, dtype in dtypes.items():
        if not isinstance(dtype, type) and np.dtype(dtype).kind not in "biufc":
            raise EinflowError(f"tensor {tensor!r} has dtype {dtype}; einflow computes with numbers "
                               "(bool, int, float or complex arrays)")
    itemsize = max([8 if isinstance(d, type) else np.dtype(d).itemsize for d in dtypes.values()] or [8])
    floats = [d for d in dtypes.values() if not isinstance(d, type) and np.dtype(d).kind == "f"]
    plan = build_plan(program.ir, program.info, shapes, itemsize, engine, optimize,
                      memory_limit_bytes(memory_limit), program.source,
                      float_dtype=np.result_type(*floats) if floats else None, dtypes=dtypes)
    program._plans[key] = plan
    return plan


def _fresh(program: Any, base: str) -> str:
    taken = set(program.info.inputs) | set(program.info.targets)
    name, number = base, 0
    while name in taken:
        number += 1
        name = f"{base}{number}"
    return name


@functools.lru_cache(maxsize=512)
def vjp_program(program: Any, wrt: tuple[str, ...]) -> tuple[Any, str]:
    """(einflow.vjp of ``program`` for the inputs ``wrt``, the cotangent's name).

    For one input the program returns its gradient, for several a tuple of gradients.

    Derived once per program and set of inputs (cached); frameworks call it in their backward pass.

    >>> import einflow as ef
    >>> program, cotangent = vjp_program(ef.compile("y[i] = A[i,j] x[j]"), ("x",))
    >>> cotangent, program.inputs
    ('G', ('x', 'G', 'A'))
    """
    cotangent = _fresh(program, "G")
    try:
        # one input: a single-result program (callable through the framework's node again)
        return vjp(program, wrt=wrt[0] if len(wrt) == 1 else list(wrt), cotangent=cotangent), cotangent
    except DerivativeError:
        raise
    except EinflowError as error:  # pragma: no cover - a derivative einflow cannot take is a DerivativeError
        raise DerivativeError(str(error)) from None


@functools.lru_cache(maxsize=512)
def jvp_program(program: Any, wrt: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
    """(einflow.jvp of ``program`` along tangents of the inputs ``wrt``, the tangents' names).

    The program is linear in the tangents (JAX transposes it for reverse mode). Derived once per
    program and set of inputs (cached); jax's forward mode calls it.

    >>> import einflow as ef
    >>> program, tangents = jvp_program(ef.compile("y[i] = A[i,j] x[j]"), ("x",))
    >>> tangents, program.inputs
    (('T_x',), ('A', 'T_x'))
    """
    taken = set(program.info.inputs) | set(program.info.targets)
    tangents: list[str] = []
    for name in wrt:
        tangent = _fresh(program, f"T_{name}")
        while tangent in taken:
            tangent += "_"
        taken.add(tangent)
        tangents.append(tangent)
    try:
        return jvp(program, wrt=list(wrt), tangent=tangents), tuple(tangents)
    except DerivativeError:
        raise
    except EinflowError as error:  # pragma: no cover - a derivative einflow cannot take is a DerivativeError
        raise DerivativeError(str(error)) from None


@functools.lru_cache(maxsize=512)
def value_and_grad_program(program: Any, wrt: tuple[str, ...]) -> Any:
    """``einflow.value_and_grad(program, wrt)`` (a scalar program's value and gradients in one pass), cached.

    A torch training step uses it: the forward pass computes the loss and its gradients with shared
    work, the backward pass scales the gradients by the incoming (scalar) gradient.
    """
    return value_and_grad(program, wrt=list(wrt))


def _batch_tensor(expr: ir.Expr, batched: set[str], index: str) -> ir.Expr:
    if isinstance(expr, ir.Tensor):
        return ir.Tensor(expr.name, (index, *expr.indices)) if expr.name in batched else expr
    return ir.with_children(expr, tuple(_batch_tensor(child, batched, index) for child in ir.children(expr)))


@functools.lru_cache(maxsize=512)
def batched_program(program: Any, batched: tuple[str, ...]) -> tuple[Any, tuple[bool, ...]]:
    """(``program`` with a new leading index on the inputs ``batched`` and on all that depends on them,
    whether each of its values carries that index: one flag, or one per value of a ``return`` line).

    ``torch.func.vmap`` over a program runs this one program once for the whole batch: the batch index
    joins each einsum (one batched contraction) instead of the framework looping or batching operation
    by operation. Derived once per program and set of batched inputs (cached).

    >>> import einflow as ef
    >>> program, carries = batched_program(ef.compile("y[i] = A[i,j] x[j]"), ("x",))
    >>> print(program)
    y[batch,i] = A[i,j] x[batch,j]
    >>> carries
    (True,)
    """
    names = set(program.info.inputs) | set(program.info.targets)
    taken = names | {index for statement in program.ir.statements if isinstance(statement, ir.Assign)
                     for node in ir.walk(statement.expr)
                     for index in (node.indices if isinstance(node, (ir.Tensor, ir.Reduce, ir.Normalize))
                                   else (node.first, node.second) if isinstance(node, ir.Delta) else ())}
    taken |= {index for statement in program.ir.statements if isinstance(statement, ir.Assign)
              for index in statement.indices or ()}
    taken |= {name for statement in program.ir.statements if isinstance(statement, ir.SizeDecl)
              for name in statement.names}
    index, number = "batch", 0
    while index in taken:
        number += 1
        index = f"batch{number}"
    carrying = set(batched)
    statements: list[ir.Statement] = []
    value_batched: tuple[bool, ...] = (False,)
    for statement in program.ir.statements:
        if isinstance(statement, ir.SizeDecl):
            if isinstance(statement.source, str) and statement.source in carrying:
                statement = ir.SizeDecl((index, *statement.names), statement.source)
            statements.append(statement)
            continue
        if isinstance(statement, ir.Return):
            value_batched = tuple(name in carrying for name in statement.names)
            statements.append(statement)
            continue
        reads = {node.name for node in ir.walk(statement.expr) if isinstance(node, ir.Tensor)}
        if not reads & carrying:
            statements.append(statement)
            if statement.target is not None:
                carrying.discard(statement.target)
            value_batched = (False,)
            continue
        indices = statement.indices if statement.indices is not None else free_indices(statement.expr)
        expr = _batch_tensor(statement.expr, carrying, index)
        # a bare expression gets a name: its value's index order is then the one written here, batch first
        target = statement.target if statement.target is not None else _fresh(program, "value")
        carrying.add(target)
        statements.append(ir.Assign(target, (index, *indices), expr))
        value_batched = (True,)
    return Program(ir.ProgramIR(tuple(statements))), value_batched
