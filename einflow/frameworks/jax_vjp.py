"""Programs on jax arrays: generated jax.numpy code wrapped in ``jax.custom_vjp`` with einflow's VJP.

The call works on concrete arrays and on tracers (inside ``jax.jit``, ``jax.grad``): the plan depends
only on shapes and dtypes. ``jax.grad`` of a call runs ``einflow.vjp(program)`` (derived once per
program and set of inputs) as the backward pass; that program is called through this module again,
so ``jax.grad(jax.grad(...))`` differentiates einflow's derivative program with einflow.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from einflow.errors import BackendError
from einflow.frameworks import plan_for, vjp_program

__all__ = ["call"]


def _signature(value: Any) -> tuple[Any, ...]:
    if isinstance(value, (int, float)):  # jax may hand over its own float/int subclasses: weak numbers
        return (), int if isinstance(value, int) else float, None
    return tuple(value.shape), np.dtype(value.dtype), None


def _run(program: Any, engine: Any, arrays: tuple[Any, ...], optimize: Any, memory_limit: Any) -> Any:
    signature = tuple(_signature(value) for value in arrays)
    return plan_for(program, engine, list(arrays), signature, optimize, memory_limit).run(list(arrays))


def call(program: Any, engine: Any, values: list[Any], optimize: Any, memory_limit: Any) -> Any:
    """Run ``program`` on jax arrays (or tracers); differentiable by jax through einflow's VJP program."""
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


def _zero_cotangent(value: Any) -> Any:
    """The cotangent jax expects for an input einflow does not differentiate (integers: float0)."""
    if isinstance(value, (int, float)):
        return None
    if np.dtype(value.dtype).kind in "biu":
        return np.zeros(value.shape, dtype=jax.dtypes.float0)
    return None


@functools.lru_cache(maxsize=256)
def _differentiable(program: Any, engine: Any, optimize: Any, memory_limit: Any) -> Any:
    """``jax.custom_vjp`` of one program (for given options): forward the plan, backward einflow's VJP."""
    names = program.info.inputs

    @jax.custom_vjp
    def run(*arrays: Any) -> Any:
        return _run(program, engine, arrays, optimize, memory_limit)

    def forward(*arrays: Any) -> tuple[Any, Any]:
        return _run(program, engine, arrays, optimize, memory_limit), arrays

    def backward(arrays: tuple[Any, ...], cotangent: Any) -> tuple[Any, ...]:
        wanted = tuple(name for name, value in zip(names, arrays)
                       if not isinstance(value, (int, float)) and np.dtype(value.dtype).kind in "fc")
        gradients: dict[str, Any] = {}
        bound = dict(zip(names, arrays))
        # one single-result VJP program per input: each is a custom_vjp call again, so a second jax.grad
        # differentiates with einflow too (under jax.jit, XLA shares their common work)
        for name in wanted:
            vjp, cotangent_name = vjp_program(program, (name,))
            bound[cotangent_name] = cotangent
            gradients[name] = vjp({key: bound[key] for key in vjp.info.inputs}, backend="jax", optimize=optimize,
                                  memory_limit=memory_limit)
        results = []
        for name, value in zip(names, arrays):
            if name not in gradients:
                results.append(_zero_cotangent(value))
                continue
            gradient = jax.numpy.asarray(gradients[name])
            shape = () if isinstance(value, (int, float)) else tuple(value.shape)
            if gradient.shape != shape:
                gradient = jax.numpy.broadcast_to(gradient, shape)
            results.append(gradient.astype(value.dtype) if hasattr(value, "dtype") else gradient)
        return tuple(results)

    run.defvjp(forward, backward)
    return run
