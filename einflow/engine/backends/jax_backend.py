"""The JAX backend: jax arrays (and tracers inside ``jax.jit``/``jax.grad``) in, jax arrays out.

The generated executor is written for ``jax.numpy`` (``codegen`` target ``"jax"``: immutable arrays,
diagonals written with ``.at[...].set``); contractions go through opt_einsum's plan with
``jax.numpy.tensordot``/``einsum``. Calling a program on jax values wraps it in ``jax.custom_jvp``
whose tangent is einflow's JVP program (:mod:`einflow.frameworks.jax_jvp`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy

from einflow.engine.backends.base import Backend, numpy_input
from einflow.engine.dialect import JAX
from einflow.lang.errors import BackendError

__all__ = ["JaxBackend"]


class JaxBackend(Backend):
    """Arrays are ``jax.Array`` (or tracers); numpy arrays become jax arrays (jax's dtype rules apply).

    >>> import jax.numpy as jnp
    >>> JaxBackend().asarray(jnp.array([True, False])).dtype.kind
    'i'
    """

    name = "jax"
    dialect = JAX
    einsum_backend = "jax"
    strided_writes = False

    @property
    def xp(self) -> Any:
        return jnp

    def holds(self, dtype: Any) -> bool:
        return bool(jax.dtypes.canonicalize_dtype(dtype) == numpy.dtype(dtype))

    def asarray(self, value: Any, chunks: Any = None) -> Any:
        if isinstance(value, (jax.Array, jax.core.Tracer)):
            return self.numbers(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        array = numpy_input(value, "jax", "jax arrays")
        return self.numbers(jnp.asarray(array))

    def numbers(self, array: Any) -> Any:
        if array.dtype == numpy.bool_:
            return array.astype(jax.dtypes.canonicalize_dtype(numpy.int64))
        return array

    def function(self, name: str) -> Any:  # pragma: no cover - the generated code calls jax.numpy directly
        raise BackendError("the jax backend runs generated code only")
