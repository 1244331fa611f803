"""The CuPy backend: contractions and elementwise functions run on the GPU; results stay on the device."""

from __future__ import annotations

import importlib
from typing import Any

import numpy

from einflow.engine.backends.base import Backend, refuse_masked
from einflow.lang.errors import BackendError
from einflow.lang.functions import FUNCTION_RULES

__all__ = ["CupyBackend"]


class CupyBackend(Backend):
    """Arrays are ``cupy.ndarray``; numpy inputs are copied to the device once per call.

    cupy is imported when the backend is first built (ImportError if it is not installed); a machine
    without a usable CUDA device gives BackendError.
    """

    name = "cupy"
    strided_views = True
    numpy_result_types = True
    slices = True
    einsum_backend = "cupy"

    def __init__(self) -> None:
        self._cupy = importlib.import_module("cupy")
        try:
            count = self._cupy.cuda.runtime.getDeviceCount()
        except Exception as error:  # CUDARuntimeError when the driver or device is missing
            raise BackendError(f"backend 'cupy' is installed but no CUDA device can be used ({error})") from None
        if count < 1:
            raise BackendError("backend 'cupy' is installed but no CUDA device was found")

    @property
    def xp(self) -> Any:
        return self._cupy

    def asarray(self, value: Any, chunks: Any = None) -> Any:
        cupy = self._cupy
        if isinstance(value, cupy.ndarray):
            return self.numbers(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        refuse_masked(value)
        if type(value).__module__.startswith("dask"):
            value = value.compute()
            if isinstance(value, cupy.ndarray):
                return self.numbers(value)
        return self.numbers(cupy.asarray(numpy.asarray(value)))

    def function(self, name: str) -> Any:
        rule = FUNCTION_RULES[name].value
        cupy = self._cupy
        # the planner folds constants on the host (numpy 0-d arrays); everything else runs on the device
        return lambda x: rule(numpy if isinstance(x, numpy.ndarray) else cupy, x)

    def diagonal_view(self, out: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
        return self._cupy.lib.stride_tricks.as_strided(out, shape=shape, strides=strides)
