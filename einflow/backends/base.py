"""What a backend provides: its array module, conversion in and out, and diagonal writes."""

from __future__ import annotations

from typing import Any

from einflow.functions import FUNCTION_RULES

__all__ = ["Backend"]


class Backend:
    """A thin adapter: opt_einsum already dispatches contractions on numpy, cupy and dask arrays."""

    name = "base"
    #: opt_einsum's backend name for contract expressions
    einsum_backend = "numpy"
    #: whether a zeroed output can be written through a strided diagonal view
    strided_writes = True

    @property
    def xp(self) -> Any:  # pragma: no cover - each backend overrides
        raise NotImplementedError

    def asarray(self, value: Any) -> Any:
        """Bring an input onto this backend (Python numbers stay weak Python scalars)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        return self.xp.asarray(value)

    def result(self, value: Any, inputs_native: bool) -> Any:
        """Convert a result for the caller (dask may compute; others return as is)."""
        return value

    def function(self, name: str) -> Any:
        """The elementwise function ``name`` on this backend's arrays."""
        rule = FUNCTION_RULES[name].value
        xp = self.xp
        return lambda x: rule(xp, x)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.xp.zeros(shape, dtype=dtype)

    def ones(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.xp.ones(shape, dtype=dtype)

    def eye(self, size: int, dtype: Any) -> Any:
        return self.xp.eye(size, dtype=dtype)

    def diagonal_view(self, out: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        """A writeable view of ``out`` with the given shape and strides (bytes)."""
        return self.xp.lib.stride_tricks.as_strided(out, shape=shape, strides=strides)
