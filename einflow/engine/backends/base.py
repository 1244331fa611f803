"""What a backend provides: its array module, conversion in and out, and diagonal writes."""

from __future__ import annotations

from typing import Any

import numpy as np

from einflow.engine.dialect import NUMPY, Dialect
from einflow.lang.errors import BackendError
from einflow.lang.functions import FUNCTION_RULES

__all__ = ["Backend", "refuse_masked", "numpy_input"]


def refuse_masked(value: Any) -> None:
    """Masked arrays are refused on every backend (numpy would drop the mask, dask would honour it).

    >>> import numpy as np
    >>> try:
    ...     refuse_masked(np.ma.array([1.0, 2.0], mask=[0, 1]))
    ... except BackendError as error:
    ...     print(str(error)[:34])
    masked arrays are not supported: p
    """
    if isinstance(value, np.ma.MaskedArray) or isinstance(getattr(value, "_meta", None), np.ma.MaskedArray):
        raise BackendError("masked arrays are not supported: pass x.filled(0) (masked entries count as 0) or "
                           "x.compressed() (only the unmasked entries)")


def numpy_input(value: Any, backend: str, native: str) -> np.ndarray:
    """``value`` (not yet the backend's own array) as a numpy array of numbers, for a backend that converts it.

    Masked arrays and other libraries' arrays are refused with a BackendError (``native``: what to pass
    instead), as are arrays of non-numbers.
    """
    refuse_masked(value)
    library = type(value).__module__.split(".")[0]
    if library in ("cupy", "dask", "torch", "jax", "jaxlib") and library != backend:
        raise BackendError(f"backend {backend!r} cannot take a {library} array; pass {native} (or numpy arrays)")
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":
        raise BackendError(f"an input has dtype {array.dtype}; einflow computes with numbers "
                           "(bool, int, float or complex arrays)")
    return array


class Backend:
    """A thin adapter: opt_einsum already dispatches contractions on numpy, cupy and dask arrays."""

    name = "base"
    #: opt_einsum's backend name for contract expressions
    einsum_backend = "numpy"
    #: whether a zeroed output can be written through a strided diagonal view
    strided_writes = True
    # capabilities the engine plans by (never a backend's name):
    #: the dialect the generated function is written in: numpy's API (numpy, cupy, dask), torch or jax.numpy
    dialect: Dialect = NUMPY
    #: arrays are numpy.ndarray in this process: contractions become BLAS calls (engine.kernels), large fused
    #: elementwise work runs in ufunc blocks on threads (engine.blocks), diagonals are added in place
    numpy_native = False
    #: the array module makes strided views (``lib.stride_tricks.as_strided``): shifted reads are views
    strided_views = False
    #: contractions become pairwise BLAS-shaped calls planned per step (engine.kernels)
    pairwise_kernels = False
    #: the array library has native N-d convolutions (torch.convolution and its weight gradient): a product
    #: reading a window, or kept whole for a scatter, runs as one where it is a convolution (engine.convolution)
    native_convolution = False
    #: a contraction over the memory limit can run as a loop over slices into a preallocated output
    slices = False
    #: arrays are lazy chunked task graphs: each slice is a task, intermediates live on the workers
    lazy = False
    #: the array library computes in numpy's result types (else results are cast to the type numpy's rules give)
    numpy_result_types = False
    #: settings ``set_backend(name, **settings)`` may change (attribute name -> what it means)
    settings: dict[str, str] = {}

    def holds(self, dtype: Any) -> bool:
        """Whether this backend's arrays can hold numpy's ``dtype`` (jax without x64 has no float64)."""
        return True

    @property
    def xp(self) -> Any:  # pragma: no cover - each backend overrides
        raise NotImplementedError

    def asarray(self, value: Any, chunks: Any = None) -> Any:
        """Bring an input onto this backend (Python numbers stay weak Python scalars).

        ``chunks`` matters only to backends that chunk (dask); the others ignore it.
        """
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        refuse_masked(value)
        return self.numbers(self.xp.asarray(value))

    def numbers(self, array: Any) -> Any:
        """Booleans take part as the numbers 0 and 1 (int64) on every backend, so sums count them."""
        return array.astype(np.int64) if getattr(array, "dtype", None) == np.bool_ else array

    def result(self, value: Any, inputs_native: bool) -> Any:
        """Convert a result for the caller (dask computes unless ``inputs_native``; others return as is)."""
        return value

    def results(self, values: tuple[Any, ...], inputs_native: bool) -> tuple[Any, ...]:
        """Convert a tuple of results together (dask computes them in one graph)."""
        return tuple(self.result(value, inputs_native) for value in values)

    def configure(self, **settings: Any) -> None:
        """Change backend settings (see ``settings``); an unknown name is a BackendError."""
        for key, value in settings.items():
            if key not in self.settings:
                valid = ", ".join(sorted(self.settings)) or "none"
                raise BackendError(f"backend {self.name!r} has no setting {key!r}; its settings are: {valid}")
            setattr(self, key, value)

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
