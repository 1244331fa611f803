"""The NumPy backend (default)."""

from __future__ import annotations

from typing import Any

import numpy

from einflow.backends.base import Backend

__all__ = ["NumpyBackend"]


class NumpyBackend(Backend):
    """Arrays are numpy.ndarray; contractions go through opt_einsum to BLAS."""

    name = "numpy"
    einsum_backend = "numpy"

    @property
    def xp(self) -> Any:
        return numpy
