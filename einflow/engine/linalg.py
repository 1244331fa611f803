"""Linear algebra steps (LANGUAGE.md 8.1): ``inv``, ``det`` and ``logdet`` of the matrices on two axes of an array.

The lowering writes each atom as a :class:`einflow.engine.steps.Reduce` step whose ``kind`` is one of
:data:`LINALG_KINDS` and whose ``axes`` are (rows, columns), in that order; ``inv`` keeps every axis, ``det`` and
``logdet`` drop the two. The generated code calls the ``linalg`` helper below on the target's own linear algebra
(numpy.linalg, torch.linalg, jax.numpy.linalg), batched over the other axes. This module also says what such a
step costs (FLOPs) and what type it makes, for the specialiser and the plan report.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["LINALG_KINDS", "LINALG_HELPER", "TORCH_LINALG_HELPER", "is_linalg", "linalg_dtype", "linalg_flops"]

LINALG_KINDS = ("inv", "det", "logdet")

#: ``{np}`` is numpy or jax.numpy; the matrices are moved to the last two axes, as their linalg wants them
LINALG_HELPER = '''def {linalg}(kind, x, axes):
    """inv, det or logdet (log|det|) of the matrices on ``axes`` (rows, columns) of ``x``, batched over the rest."""
    x = {np}.moveaxis({as_float}(x), axes, (-2, -1))
    if kind == "inv":
        return {np}.moveaxis({np}.linalg.inv(x), (-2, -1), axes)
    if kind == "det":
        return {np}.linalg.det(x)
    return {np}.linalg.slogdet(x)[1]'''

TORCH_LINALG_HELPER = '''def {linalg}(kind, x, axes):
    """inv, det or logdet (log|det|) of the matrices on ``axes`` (rows, columns) of ``x``, batched over the rest."""
    x = {np}.movedim({as_float}(x), axes, (-2, -1))
    if kind == "inv":
        return {np}.movedim({np}.linalg.inv(x), (-2, -1), axes)
    if kind == "det":
        return {np}.linalg.det(x)
    return {np}.linalg.slogdet(x)[1]'''


def is_linalg(step: Any) -> bool:
    """Whether a step is a linear-algebra one (a Reduce step of a :data:`LINALG_KINDS` kind)."""
    return getattr(step, "kind", None) in LINALG_KINDS


def linalg_dtype(dtype: Any) -> Any:
    """The result type for an argument of ``dtype``: integers and booleans become float64, floats stay.

    >>> linalg_dtype(np.dtype("int32")), linalg_dtype(np.dtype("float32"))
    (dtype('float64'), dtype('float32'))
    """
    dtype = np.dtype(dtype)
    return np.dtype("float64") if dtype.kind in "biu" else dtype


def linalg_flops(kind: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    """Floating-point operations of the step on an argument of ``shape``: an LU factorisation (2/3 n^3) per
    matrix, and for ``inv`` the n right-hand sides solved with it (2 n^3 in all).

    >>> linalg_flops("inv", (10, 4, 4), (1, 2)), linalg_flops("logdet", (4, 4), (0, 1))
    (1280, 43)
    """
    n = shape[axes[0]]
    batch = math.prod(size for k, size in enumerate(shape) if k not in axes)
    per_matrix = 2 * n**3 if kind == "inv" else -(-2 * n**3 // 3)
    return batch * per_matrix
