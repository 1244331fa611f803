"""Programs on jax arrays: generated jax.numpy code wrapped in ``jax.custom_jvp`` with einflow's JVP.

The call works on concrete arrays and on tracers (inside ``jax.jit``, ``jax.grad``): the plan depends
only on shapes and dtypes. The tangent of a call is ``einflow.jvp(program)`` (derived once per program
and set of varying inputs), itself called through this module again, so every jax transformation
works: ``jax.jvp``, ``jax.jacfwd``, ``jax.hessian`` and nested ones differentiate einflow's derivative
programs with einflow. For reverse mode (``jax.grad``, ``jax.vjp``) jax transposes the JVP program,
which is linear in the tangents (each step an einsum or an elementwise product: its transpose is one
too). Why not ``jax.custom_vjp`` with einflow's VJP program: jax refuses forward mode through any
``custom_vjp`` function (docs/frameworks.md has the comparison).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from einflow.frameworks.programs import jvp_program, plan_for
from einflow.lang.errors import BackendError

__all__ = ["call"]


def _signature(value: Any) -> tuple[Any, ...]:
    if isinstance(value, (int, float)):  # jax may hand over its own float/int subclasses: weak numbers
        return (), int if isinstance(value, int) else float, None
    return tuple(value.shape), np.dtype(value.dtype), None


def _run(program: Any, engine: Any, arrays: tuple[Any, ...], optimize: Any, memory_limit: Any) -> Any:
    signature = tuple(_signature(value) for value in arrays)
    return plan_for(program, engine, list(arrays), signature, optimize, memory_limit).run(list(arrays))


def call(program: Any, engine: Any, values: list[Any], optimize: Any, memory_limit: Any) -> Any:
    """Run ``program`` on jax arrays (or tracers); differentiable by jax through einflow's JVP program."""
    converted: list[Any] = []
    for tensor, value in zip(program.info.inputs, values):
        try:
            converted.append(engine.asarray(value))
        except (ValueError, TypeError) as error:
            raise BackendError(f"tensor {tensor!r}: cannot use this input as a jax array ({error})") from None
    if program.info.returns_tuple:
        # several results: jax differentiates the generated jax.numpy code itself
        return _run(program, engine, tuple(converted), optimize, memory_limit)
    try:
        differentiable = _differentiable(program, engine, optimize, memory_limit)
    except TypeError:  # an unhashable option (a PathOptimizer, say): build the wrapper for this call
        differentiable = _differentiable.__wrapped__(program, engine, optimize, memory_limit)
    return differentiable(*converted)


def _tangent_inputs(names: tuple[str, ...], arrays: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[str, ...]:
    """The inputs whose tangent is not a symbolic zero (floating or complex values: Python floats too)."""
    return tuple(name for name, value, tangent in zip(names, arrays, tangents)
                 if not isinstance(tangent, jax.custom_derivatives.SymbolicZero)
                 and (isinstance(value, float) or (not isinstance(value, int) and np.dtype(value.dtype).kind in "fc")))


@functools.lru_cache(maxsize=256)
def _differentiable(program: Any, engine: Any, optimize: Any, memory_limit: Any) -> Any:
    """``jax.custom_jvp`` of one program: forward the plan, tangents through einflow's JVP program."""
    names = program.info.inputs

    @jax.custom_jvp
    def run(*arrays: Any) -> Any:
        return _run(program, engine, arrays, optimize, memory_limit)

    def forward(arrays: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        value = _run(program, engine, arrays, optimize, memory_limit)
        wanted = _tangent_inputs(names, arrays, tangents)
        if not wanted:
            return value, jax.numpy.zeros_like(value)
        jvp, tangent_names = jvp_program(program, wanted)
        bound = dict(zip(names, arrays))
        given = dict(zip(names, tangents))
        bound.update({tangent: given[name] for name, tangent in zip(wanted, tangent_names)})
        # the JVP program is a custom_jvp call again: its own tangent (jax.hessian = jacfwd(jacrev)) is einflow's
        out = jvp({key: bound[key] for key in jvp.info.inputs}, backend="jax", optimize=optimize,
                             memory_limit=memory_limit)
        out = jax.numpy.asarray(out)
        if out.shape != jax.numpy.shape(value):
            out = jax.numpy.broadcast_to(out, jax.numpy.shape(value))
        return value, out.astype(value.dtype)

    run.defjvp(forward, symbolic_zeros=True)
    return run
