"""The NumPy backend (default)."""

from __future__ import annotations

from typing import Any

import numpy

from einflow.engine.backends.base import Backend, refuse_masked

__all__ = ["NumpyBackend"]


class NumpyBackend(Backend):
    """Arrays are numpy.ndarray; contractions go through opt_einsum to BLAS.

    Other arrays are brought to the host: a dask array is computed, a cupy array copied off the device.

    >>> NumpyBackend().asarray([1.0, 2.0]).tolist()
    [1.0, 2.0]
    """

    name = "numpy"
    strided_views = True
    numpy_result_types = True
    numpy_native = True
    pairwise_kernels = True
    slices = True
    einsum_backend = "numpy"

    @property
    def xp(self) -> Any:
        return numpy

    def asarray(self, value: Any, chunks: Any = None) -> Any:
        if type(value) is numpy.ndarray and value.dtype != numpy.bool_ or \
                isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        refuse_masked(value)
        if type(value).__module__.startswith("cupy"):
            return self.numbers(value.get())
        if type(value).__module__.startswith("torch"):  # backend="numpy" asked for: no graph, on the host
            return self.numbers(value.detach().cpu().numpy())
        return self.numbers(numpy.asarray(value))
