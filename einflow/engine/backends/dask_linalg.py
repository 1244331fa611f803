"""Linear algebra of dask arrays: each inv, det, logdet, check or solve is one task that runs numpy's.

``dask.array.linalg`` has no ``det``, ``slogdet`` or ``LinAlgError``, solves only 2-d matrices cut into square
chunks, and batches nothing. A matrix that LAPACK factorises is needed whole anyway, so here the step's arrays
become one ``dask.delayed`` call of the numpy helper (``einflow.engine.linalg``'s text run on numpy) and the
result one chunk of known shape and type (``dask.array.from_delayed``); the steps after it rechunk as they need.
The generated code's helpers call these for dask arrays (``codegen.helpers`` puts them in its namespace).

>>> import dask.array as da, numpy as np
>>> m = da.from_array(np.diag([2.0, 3.0, 4.0]), chunks=2)
>>> det = lambda kind, x, axes, name: np.linalg.det(x)
>>> round(float(linalg_task(det, "det", m, (0, 1)).compute()), 9)
24.0
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np

__all__ = ["linalg_task", "solve_task"]


def _identity(ndim: int, axes: tuple[int, int], dtype: Any) -> np.ndarray:
    """A 2x2 identity on ``axes`` (size 1 on the other axes): a sample the helper accepts for every kind."""
    eye = np.eye(2, dtype=dtype).reshape((1,) * (ndim - 2) + (2, 2))
    return np.moveaxis(eye, (-2, -1), axes)


def linalg_task(helper: Any, kind: str, x: Any, axes: tuple[int, int], name: str | None = None) -> Any:
    """``helper`` (the generated code's linalg helper on numpy) of the matrices on ``axes`` of dask array ``x``,
    as one task."""
    sample = np.asarray(helper(kind, _identity(x.ndim, axes, x.dtype), axes, name))
    shape = x.shape if sample.ndim == x.ndim else tuple(s for k, s in enumerate(x.shape) if k not in axes)
    value = dask.delayed(helper, pure=True)(kind, x, axes, name)
    return da.from_delayed(value, shape=shape, dtype=sample.dtype)


def solve_task(helper: Any, kind: str, M: Any, axes: tuple[int, int], B: Any, axis: int, transposed: bool,
               name: str | None = None, batch: tuple[tuple[int, int | None], ...] = ()) -> Any:
    """``helper`` (the generated code's solve helper on numpy) of ``B`` against ``M`` (dask arrays), as one task."""
    matrix = _identity(M.ndim, axes, M.dtype)
    rhs_shape = [1] * B.ndim
    rhs_shape[axis] = 2
    sample = np.asarray(helper(kind, matrix, axes, np.ones(rhs_shape, dtype=B.dtype), axis, transposed, name,
                               tuple(batch)))
    first = [b for _, b in batch if b is not None] + [axis]  # (B's axis None: B is broadcast over that batch)
    shape = tuple(M.shape[m] for m, _ in batch) + tuple(B.shape[k] for k in first[-1:] + [
        k for k in range(B.ndim) if k not in first])
    value = dask.delayed(helper, pure=True)(kind, M, axes, B, axis, transposed, name, tuple(batch))
    return da.from_delayed(value, shape=shape, dtype=sample.dtype)
