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

__all__ = ["SPD_FACTORING", "FACTOR_KINDS", "SOLVE_HELPER", "TORCH_SOLVE_HELPER", "solve_flops", "LINALG_KINDS",
           "CHECK_KINDS", "SPD_KINDS",
           "matrix_kind", "linalg_result_dtype", "LINALG_HELPER",
           "TORCH_LINALG_HELPER", "is_linalg", "linalg_dtype", "linalg_flops"]

LINALG_KINDS = ("inv", "det", "logdet")
#: a declared matrix checked at call time (the step's value is the matrix itself)
CHECK_KINDS = ("symmetric", "spd", "hermitian")
#: the atoms of a matrix declared ``spd``: computed from its Cholesky factor
SPD_KINDS = ("spd_inv", "spd_det", "spd_logdet")
#: steps that factorise their matrix by Cholesky (and say so when it is not positive definite); "spd_factor":
#: the lower Cholesky factor itself, which "cho_solve" steps share (one factorisation for every solve with it)
SPD_FACTORING = ("spd_inv", "spd_det", "spd_logdet", "spd_solve", "spd_factor")
#: every kind this module's helper computes ("spd_by_factor": an spd check whose matrix a later step factorises)
_KINDS: tuple[str, ...] = LINALG_KINDS + CHECK_KINDS + SPD_KINDS + ("spd_by_factor", "spd_factor")
#: the atoms of an spd matrix computed from its shared Cholesky factor (an "spd_factor" step's value)
FACTOR_KINDS = ("cho_inv", "cho_det", "cho_logdet")
_KINDS += FACTOR_KINDS
#: how far from symmetric a declared matrix may be, relative to its largest entry (round-off of a computed one)
SYMMETRY_TOLERANCE = 1e-10

#: ``{np}`` is numpy or jax.numpy; the matrices are moved to the last two axes, as their linalg wants them
LINALG_HELPER = '''def {linalg}(kind, x, axes, name=None):
    """inv, det or logdet (log|det|) of the matrices on ``axes`` (rows, columns) of ``x``, batched over the rest;
    "symmetric"/"spd": ``x`` itself once checked (a ValueError names the matrix otherwise); "spd_*": by Cholesky."""
    if type(x).__module__.startswith("dask"):  # one numpy task (dask's linalg lacks det, slogdet and batches)
        return globals()["_dask_linalg"](kind, x, axes, name)
    if kind in ("symmetric", "spd", "spd_by_factor", "hermitian"):
        checks, kind = kind, "spd" if kind == "spd_by_factor" else kind
        error = globals().get("MatrixError", ValueError)
        try:
            scale = float(abs(x).max()) if x.size else 0.0
            kind_of = {np}.dtype(x.dtype).kind if hasattr({np}, "dtype") else "f"
            tolerance = max(1e-10, 100 * float({np}.finfo(x.dtype).eps)) if kind_of in "fc" else 1e-10
            # a complex spd or hermitian matrix equals its conjugate transpose (LANGUAGE.md 9.2)
            transposed = {np}.swapaxes(x, -1, -2)
            if kind != "symmetric" and kind_of == "c":
                transposed = {np}.conj(transposed)
            symmetric = float(abs(x - transposed).max(initial=0.0)) <= tolerance * scale
        except TypeError:  # a traced array (jax.jit): no values to check
            return x
        if not symmetric:
            shape = "Hermitian" if kind == "hermitian" or kind_of == "c" else "symmetric"
            raise error(f"matrix {{name!r}} is declared {{kind}} but is not {{shape}}")
        try:
            positive = bool({np}.all({np}.isfinite({np}.linalg.cholesky({as_float}(x))))) if checks == "spd" else True
        except Exception as failed:  # numpy's LinAlgError (jax returns nan)
            if type(failed).__name__ != "LinAlgError":
                raise
            positive = False
        if not positive:
            raise error(f"matrix {{name!r}} is declared spd but is not positive definite")
        return x
    x = {np}.moveaxis({as_float}(x), axes, (-2, -1))
    if kind.startswith("cho_"):  # x is a lower Cholesky factor
        if kind != "cho_inv":
            logdet = 2 * {np}.log({np}.abs({np}.diagonal(x, axis1=-2, axis2=-1))).sum(axis=-1)
            return logdet if kind == "cho_logdet" else {np}.exp(logdet)
        if {np}.__name__ == "numpy" and x.ndim == 2:
            try:  # LAPACK's inverse from the factor (potri)
                from scipy.linalg import get_lapack_funcs
            except ImportError:
                pass
            else:
                inverse, info = get_lapack_funcs(("potri",), (x,))[0](x, lower=True)
                return {np}.tril(inverse) + {np}.conj({np}.tril(inverse, -1).T)
        eye = {np}.eye(x.shape[-1], dtype=x.dtype)
        lower_inverse = {np}.linalg.solve(x, {np}.broadcast_to(eye, x.shape))
        return {np}.moveaxis({np}.conj({np}.swapaxes(lower_inverse, -1, -2)) @ lower_inverse, (-2, -1), axes)
    if kind == "spd_factor" and {np}.__name__ == "numpy" and x.ndim == 2 and x.dtype.kind == "f":
        try:  # LAPACK's potrf (numpy's own cholesky is about twice as slow on one matrix)
            from scipy.linalg import get_lapack_funcs
        except ImportError:
            pass
        else:
            factor, info = get_lapack_funcs(("potrf",), (x,))[0](x, lower=True, clean=True)
            if info > 0:
                raise globals().get("MatrixError", ValueError)(f"matrix {{name!r}} is declared spd but is not "
                                                               "positive definite")
            if info == 0:
                return {np}.moveaxis(factor, (-2, -1), axes)
    if kind == "spd_inv" and {np}.__name__ == "numpy" and x.ndim == 2 and x.dtype.kind == "f":
        try:  # LAPACK's inverse from the Cholesky factor (potrf, potri): half the work of an LU inverse
            from scipy.linalg import get_lapack_funcs
        except ImportError:
            pass
        else:
            potrf, potri = get_lapack_funcs(("potrf", "potri"), (x,))
            factor, info = potrf(x, lower=True, clean=False)
            if info > 0:
                raise globals().get("MatrixError", ValueError)(f"matrix {{name!r}} is declared spd but is not "
                                                               "positive definite")
            if info == 0:
                inverse, info = potri(factor, lower=True)
                if info == 0:
                    lower = {np}.tril(inverse)
                    return lower + {np}.conj({np}.tril(inverse, -1).T)
    if kind.startswith("spd_"):
        try:
            factor = {np}.linalg.cholesky(x)
        except {np}.linalg.LinAlgError:
            raise globals().get("MatrixError", ValueError)(f"matrix {{name!r}} is declared spd but is not "
                                                           "positive definite") from None
        if kind == "spd_factor":
            return {np}.moveaxis(factor, (-2, -1), axes)
        logdet = 2 * {np}.log({np}.abs({np}.diagonal(factor, axis1=-2, axis2=-1))).sum(axis=-1)
        if kind == "spd_logdet":
            return logdet
        if kind == "spd_det":
            return {np}.exp(logdet)
        kind = "inv"
    if kind == "inv":
        return {np}.moveaxis({np}.linalg.inv(x), (-2, -1), axes)
    if kind == "det":
        return {np}.linalg.det(x)
    return {np}.linalg.slogdet(x)[1]'''

TORCH_LINALG_HELPER = '''def {linalg}(kind, x, axes, name=None):
    """inv, det or logdet (log|det|) of the matrices on ``axes`` (rows, columns) of ``x``, batched over the rest;
    "symmetric"/"spd": ``x`` itself once checked (a ValueError names the matrix otherwise); "spd_*": by Cholesky."""
    if kind in ("symmetric", "spd", "spd_by_factor", "hermitian"):
        checks, kind = kind, "spd" if kind == "spd_by_factor" else kind
        scale = float(x.abs().max()) if x.numel() else 0.0
        tolerance = max(1e-10, 100 * {np}.finfo(x.dtype).eps) if x.is_floating_point() or x.is_complex() else 1e-10
        error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
        # a complex spd or hermitian matrix equals its conjugate transpose (LANGUAGE.md 9.2)
        transposed = x.transpose(-1, -2).conj() if kind != "symmetric" and x.is_complex() else x.transpose(-1, -2)
        if x.numel() and float((x - transposed).abs().max()) > tolerance * scale:
            shape = "Hermitian" if kind == "hermitian" or x.is_complex() else "symmetric"
            raise error(f"matrix {{name!r}} is declared {{kind}} but is not {{shape}}")
        if checks == "spd" and int({np}.linalg.cholesky_ex({as_float}(x)).info.max()) != 0:
            raise error(f"matrix {{name!r}} is declared spd but is not positive definite")
        return x
    x = {np}.movedim({as_float}(x), axes, (-2, -1))
    if kind.startswith("cho_"):  # x is a lower Cholesky factor
        if kind == "cho_inv":
            return {np}.movedim({np}.cholesky_inverse(x), (-2, -1), axes)
        logdet = 2 * {np}.log({np}.diagonal(x, dim1=-2, dim2=-1).abs()).sum(dim=-1)
        return logdet if kind == "cho_logdet" else {np}.exp(logdet)
    if kind.startswith("spd_"):
        factor = {np}.linalg.cholesky(x)
        if kind == "spd_factor":
            return {np}.movedim(factor, (-2, -1), axes)
        logdet = 2 * {np}.log({np}.diagonal(factor, dim1=-2, dim2=-1).abs()).sum(dim=-1)
        if kind == "spd_logdet":
            return logdet
        if kind == "spd_det":
            return {np}.exp(logdet)
        kind = "inv"
    if kind == "inv":
        return {np}.movedim({np}.linalg.inv(x), (-2, -1), axes)
    if kind == "det":
        return {np}.linalg.det(x)
    return {np}.linalg.slogdet(x)[1]'''


#: ``inv(M) B`` by a solve: B's axis ``axis`` against M's columns (rows when ``transposed``); the result's first
#: axis is M's other index, then B's other axes. spd: Cholesky (scipy's, when numpy and scipy are there)
SOLVE_HELPER = '''def {solve}(kind, M, axes, B, axis, transposed, name=None, batch=()):
    """inv(M) B over M's columns (``transposed``: B^T inv(M), over its rows), without forming the inverse;
    ``batch``: (M's axis, B's axis) pairs solved matrix by matrix (first in the result)."""
    if type(M).__module__.startswith("dask") or type(B).__module__.startswith("dask"):  # one numpy task
        return globals()["_dask_solve"](kind, M, axes, B, axis, transposed, name, batch)
    if batch:  # numpy's, jax's and torch's solve broadcast over leading axes; Cholesky by two of them
        k = len(batch)
        M = {np}.moveaxis({as_float}(M), [m for m, _ in batch] + list((axes[1], axes[0]) if transposed else axes),
                          list(range(k + 2)))
        B = {np}.moveaxis({as_float}(B), [b for _, b in batch] + [axis], list(range(k + 1)))
        flat = B.reshape(B.shape[:k + 1] + (-1,))
        if kind == "cho_solve":
            inner = {np}.linalg.solve(M, flat)
            return {np}.linalg.solve({np}.swapaxes(M, -1, -2), inner).reshape(B.shape)
        return {np}.linalg.solve(M, flat).reshape(B.shape)
    M = {np}.moveaxis({as_float}(M), axes, (1, 0) if transposed else (0, 1))
    B = {np}.moveaxis({as_float}(B), axis, 0)
    flat = B.reshape(B.shape[0], -1)
    if kind == "cho_solve":  # M is the lower Cholesky factor of an spd matrix (an "spd_factor" step's value)
        if {np}.__name__ == "numpy":
            try:
                from scipy.linalg import cho_solve
            except ImportError:
                pass
            else:
                return cho_solve((M, True), flat, check_finite=False).reshape(B.shape)
        if {np}.__name__.startswith("jax"):
            from jax.scipy.linalg import cho_solve
            return cho_solve((M, True), flat).reshape(B.shape)
        inner = {np}.linalg.solve(M, flat)
        return {np}.linalg.solve({np}.swapaxes(M, 0, 1), inner).reshape(B.shape)
    if kind == "spd_solve" and {np}.__name__ == "numpy":
        try:
            from scipy.linalg import cho_factor, cho_solve
        except ImportError:
            pass
        else:
            try:
                factor = cho_factor(M, lower=True, check_finite=False)
            except {np}.linalg.LinAlgError:
                raise globals().get("MatrixError", ValueError)(f"matrix {{name!r}} is declared spd but is not "
                                                               "positive definite") from None
            return cho_solve(factor, flat, check_finite=False).reshape(B.shape)
    return {np}.linalg.solve(M, flat).reshape(B.shape)'''

TORCH_SOLVE_HELPER = '''def {solve}(kind, M, axes, B, axis, transposed, name=None, batch=()):
    """inv(M) B over M's columns (``transposed``: B^T inv(M), over its rows), without forming the inverse;
    ``batch``: (M's axis, B's axis) pairs solved matrix by matrix (first in the result)."""
    k = len(batch)
    M = {np}.movedim({as_float}(M), [m for m, _ in batch] + list((axes[1], axes[0]) if transposed else axes),
                     list(range(k + 2)))
    B = {np}.movedim({as_float}(B), [b for _, b in batch] + [axis], list(range(k + 1)))
    flat = B.reshape(B.shape[:k + 1] + (-1,))
    if M.dtype != flat.dtype:  # torch solves in one dtype (a complex matrix, a real right side)
        common = {np}.promote_types(M.dtype, flat.dtype)
        M, flat = M.to(common), flat.to(common)
    if kind == "cho_solve":  # M is the lower Cholesky factor of an spd matrix (an "spd_factor" step's value)
        return {np}.cholesky_solve(flat, M).reshape(B.shape)
    if kind == "spd_solve":
        return {np}.cholesky_solve(flat, {np}.linalg.cholesky(M)).reshape(B.shape)
    return {np}.linalg.solve(M, flat).reshape(B.shape)'''


def solve_flops(kind: str, n: int, columns: int) -> int:  # (per matrix: a batched solve counts each)
    """A factorisation (LU 2/3 n^3, Cholesky 1/3 n^3; none for "cho_solve", whose factor a step made) and two
    triangular solves (2 n^2) per right-hand side.

    >>> solve_flops("spd_solve", 3, 1), solve_flops("solve", 3, 2), solve_flops("cho_solve", 3, 2)
    (27, 54, 36)
    """
    factor = 0 if kind == "cho_solve" else -(-n**3 // 3) if kind == "spd_solve" else -(-2 * n**3 // 3)
    return factor + 2 * n * n * columns


def is_linalg(step: Any) -> bool:
    """Whether a step is a linear-algebra one (a Reduce step of a kind this module computes)."""
    return getattr(step, "kind", None) in _KINDS


def matrix_kind(kind: str, declared: str | None) -> str:
    """The step kind of an atom on a matrix declared ``declared`` (None: undeclared): spd ones use Cholesky.

    >>> matrix_kind("logdet", "spd"), matrix_kind("logdet", "symmetric")
    ('spd_logdet', 'logdet')
    """
    return f"spd_{kind}" if declared == "spd" else kind


def linalg_dtype(dtype: Any) -> Any:
    """The result type for an argument of ``dtype``: integers and booleans become float64, floats stay.

    >>> linalg_dtype(np.dtype("int32")), linalg_dtype(np.dtype("float32"))
    (dtype('float64'), dtype('float32'))
    """
    dtype = np.dtype(dtype)
    return np.dtype("float64") if dtype.kind in "biu" else dtype


def linalg_result_dtype(kind: str, dtype: Any) -> Any:
    """The step's result type: a check keeps its matrix's, the atoms :func:`linalg_dtype`; logdet is log|det|,
    real for a complex matrix (LANGUAGE.md 9.2).

    >>> linalg_result_dtype("logdet", np.dtype("complex64"))
    dtype('float32')
    """
    if kind in CHECK_KINDS:
        return dtype
    result = linalg_dtype(dtype)
    return np.dtype(result.char.lower()) if kind.endswith("logdet") and result.kind == "c" else result


def linalg_flops(kind: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    """Floating-point operations of the step on an argument of ``shape``: an LU factorisation (2/3 n^3) per
    matrix, and for ``inv`` the n right-hand sides solved with it (2 n^3 in all).

    >>> linalg_flops("inv", (10, 4, 4), (1, 2)), linalg_flops("logdet", (4, 4), (0, 1))
    (1280, 43)
    """
    n = shape[axes[0]]
    batch = math.prod(size for k, size in enumerate(shape) if k not in axes)
    if kind in ("symmetric", "spd_by_factor"):
        return batch * n * n
    if kind in FACTOR_KINDS:  # from a Cholesky factor: its diagonal, or the inverse (LAPACK potri: 2/3 n^3)
        return batch * (-(-2 * n**3 // 3) if kind == "cho_inv" else n)
    # LU: 2/3 n^3; Cholesky: 1/3 n^3; an inverse from either: 2 n^3 in all (n solves of 2 n^2 each)
    per_matrix = 2 * n**3 if kind.endswith("inv") else -(-n**3 // 3) if kind.startswith("spd") else -(-2 * n**3 // 3)
    return batch * per_matrix
