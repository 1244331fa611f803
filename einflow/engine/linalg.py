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

__all__ = ["linalg_workspace", "solve_workspace",
           "SPD_FACTORING", "FACTOR_KINDS", "SOLVE_HELPER", "TORCH_SOLVE_HELPER", "solve_flops", "LINALG_KINDS",
           "CHECK_KINDS", "SPD_KINDS",
           "matrix_kind", "linalg_result_dtype", "LINALG_HELPER",
           "TORCH_LINALG_HELPER", "is_linalg", "linalg_dtype", "linalg_flops"]

LINALG_KINDS = ("inv", "det", "logdet", "sign_det")
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
#: det(M) inv(M), M's adjugate, of a product that holds both (the derivative of det): defined for singular M too
_KINDS += ("adj",)
#: how far from symmetric a declared matrix may be, relative to its largest entry (round-off of a computed one)
SYMMETRY_TOLERANCE = 1e-10

#: ``{np}`` is numpy or jax.numpy; the matrices are moved to the last two axes, as their linalg wants them
LINALG_HELPER = '''def {linalg}(kind, x, axes, name=None):
    """inv, det, logdet (log|det|), sign_det or adj (det inv, also of a singular matrix) of the matrices on ``axes``
    (rows, columns) of ``x``, batched over the rest; "symmetric"/"spd": ``x`` itself once checked (a ValueError
    names the matrix otherwise); "spd_*": by Cholesky. A singular matrix to invert is a ValueError too."""
    if type(x).__module__.startswith("dask"):  # one numpy task (dask's linalg lacks det, slogdet and batches)
        return globals()["_dask_linalg"](kind, x, axes, name)
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {{name!r}}" if name else "a matrix"
    on_jax = {np}.__name__.startswith("jax")

    def refuse(bad, message):  # bad: an array of flags (jax: nan/inf instead of errors, so asked here)
        try:
            found = bool(bad.any())
        except TypeError:  # a traced array (jax.jit): no values to check
            return
        if found:
            raise error(message)

    def by_svd(x):
        """det(x) inv(x) of the matrices on the last two axes of ``x``, also singular ones: for x = U S V^H,
        adj(x) = det(U) det(V^H) V diag(prod_(j != i) s_j) U^H (zero when two or more singular values are)."""
        if x.shape[-1] == 0:
            return x
        u, s, vh = {np}.linalg.svd(x)
        ones = {np}.ones_like(s[..., :1])
        before = {np}.cumprod({np}.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
        after = {np}.flip({np}.cumprod({np}.concatenate([ones, {np}.flip(s[..., 1:], axis=-1)], axis=-1), axis=-1),
                          axis=-1)
        phase = {np}.linalg.det(u) * {np}.linalg.det(vh)
        return phase[..., None, None] * ({np}.conj({np}.swapaxes(vh, -1, -2)) * (before * after)[..., None, :]) @ \\
            {np}.conj({np}.swapaxes(u, -1, -2))

    if kind in ("symmetric", "spd", "spd_by_factor", "hermitian"):
        checks, kind = kind, "spd" if kind == "spd_by_factor" else kind
        if x.shape[axes[0]] != x.shape[axes[1]]:
            raise error(f"{{called}} is declared {{kind}} but is not square: its shape is {{tuple(x.shape)}}")
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
            raise error(f"{{called}} is declared {{kind}} but is not {{shape}}")
        try:
            positive = bool({np}.all({np}.isfinite({np}.linalg.cholesky({as_float}(x))))) if checks == "spd" else True
        except Exception as failed:  # numpy's LinAlgError (jax returns nan)
            if type(failed).__name__ != "LinAlgError":
                raise
            positive = False
        if not positive:
            raise error(f"{{called}} is declared spd but is not positive definite")
        return x
    not_positive = f"{{called}} is declared spd but is not positive definite"
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
                raise error(not_positive)
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
                raise error(not_positive)
            if info == 0:
                inverse, info = potri(factor, lower=True)
                if info == 0:
                    lower = {np}.tril(inverse)
                    return lower + {np}.conj({np}.tril(inverse, -1).T)
    if kind.startswith("spd_"):
        try:
            factor = {np}.linalg.cholesky(x)
        except {np}.linalg.LinAlgError:
            raise error(not_positive) from None
        if on_jax:  # jax's Cholesky of a matrix that is not positive definite is nan
            refuse(~{np}.isfinite(factor) & {np}.isfinite(x).all(axis=(-2, -1), keepdims=True), not_positive)
        if kind == "spd_factor":
            return {np}.moveaxis(factor, (-2, -1), axes)
        logdet = 2 * {np}.log({np}.abs({np}.diagonal(factor, axis1=-2, axis2=-1))).sum(axis=-1)
        if kind == "spd_logdet":
            return logdet
        if kind == "spd_det":
            return {np}.exp(logdet)
        kind = "inv"
    if kind == "adj" and x.shape[-1] == 0:
        return {np}.moveaxis(x, (-2, -1), axes)
    if kind in ("inv", "adj") and on_jax and x.shape[-1]:  # numpy's rule: an exact zero pivot of the LU factorisation
        import jax

        pivots = {np}.diagonal(jax.lax.linalg.lu(x)[0], axis1=-2, axis2=-1)
        if kind == "inv":
            refuse(pivots == 0, f"{{called}} is singular (a zero pivot in its LU factorisation): it has no inverse")
        else:  # the adjugate by SVD (defined for every matrix, one jit-able form): adj(U S V^H) = ...
            return {np}.moveaxis(by_svd(x), (-2, -1), axes)
    if kind == "inv":
        try:
            inverse = {np}.linalg.inv(x)
        except {np}.linalg.LinAlgError:
            raise error(f"{{called}} is singular (a zero pivot in its LU factorisation): it has no inverse") from None
        return {np}.moveaxis(inverse, (-2, -1), axes)
    if kind == "adj":  # det(x) inv(x) by LU where every matrix is invertible, else by SVD (singular ones too)
        try:
            with {np}.errstate(all="ignore"):
                determinant = {np}.linalg.det(x)
                adjugate = determinant[..., None, None] * {np}.linalg.inv(x)
            if not {np}.isfinite(adjugate).all() or not (determinant != 0).all():
                raise {np}.linalg.LinAlgError
        except {np}.linalg.LinAlgError:
            adjugate = by_svd(x)
        return {np}.moveaxis(adjugate, (-2, -1), axes)
    if kind == "det":
        value = {np}.linalg.det(x)
    elif kind == "sign_det":
        value = {np}.linalg.slogdet(x)[0]
    else:
        value = {np}.linalg.slogdet(x)[1]
    if {np}.__name__ == "numpy" or kind == "sign_det":  # LAPACK's det of a matrix holding nan can be 0: nan
        value = {np}.where({np}.isnan(x).any(axis=(-2, -1)), {np}.nan, value)
    return value'''

TORCH_LINALG_HELPER = '''def {linalg}(kind, x, axes, name=None):
    """inv, det, logdet (log|det|), sign_det or adj (det inv, also of a singular matrix) of the matrices on ``axes``
    (rows, columns) of ``x``, batched over the rest; "symmetric"/"spd": ``x`` itself once checked (a ValueError
    names the matrix otherwise); "spd_*": by Cholesky. A singular matrix to invert is a ValueError too."""
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {{name!r}}" if name else "a matrix"
    not_positive = f"{{called}} is declared spd but is not positive definite"
    if kind in ("symmetric", "spd", "spd_by_factor", "hermitian"):
        checks, kind = kind, "spd" if kind == "spd_by_factor" else kind
        if x.shape[axes[0]] != x.shape[axes[1]]:
            raise error(f"{{called}} is declared {{kind}} but is not square: its shape is {{tuple(x.shape)}}")
        scale = float(x.abs().max()) if x.numel() else 0.0
        tolerance = max(1e-10, 100 * {np}.finfo(x.dtype).eps) if x.is_floating_point() or x.is_complex() else 1e-10
        # a complex spd or hermitian matrix equals its conjugate transpose (LANGUAGE.md 9.2)
        transposed = x.transpose(-1, -2).conj() if kind != "symmetric" and x.is_complex() else x.transpose(-1, -2)
        if x.numel() and not float((x - transposed).abs().max()) <= tolerance * scale:
            shape = "Hermitian" if kind == "hermitian" or x.is_complex() else "symmetric"
            raise error(f"{{called}} is declared {{kind}} but is not {{shape}}")
        info = {np}.linalg.cholesky_ex({as_float}(x)).info if checks == "spd" else None
        if info is not None and info.numel() and int(info.max()) != 0:
            raise error(not_positive)
        return x
    x = {np}.movedim({as_float}(x), axes, (-2, -1))
    if kind.startswith("cho_"):  # x is a lower Cholesky factor
        if kind == "cho_inv":
            return {np}.movedim({np}.cholesky_inverse(x), (-2, -1), axes)
        logdet = 2 * {np}.log({np}.diagonal(x, dim1=-2, dim2=-1).abs()).sum(dim=-1)
        return logdet if kind == "cho_logdet" else {np}.exp(logdet)
    if kind.startswith("spd_"):
        factor, info = {np}.linalg.cholesky_ex(x)
        if info.numel() and int(info.max()) != 0:
            raise error(not_positive)
        if kind == "spd_factor":
            return {np}.movedim(factor, (-2, -1), axes)
        logdet = 2 * {np}.log({np}.diagonal(factor, dim1=-2, dim2=-1).abs()).sum(dim=-1)
        if kind == "spd_logdet":
            return logdet
        if kind == "spd_det":
            return {np}.exp(logdet)
        kind = "inv"
    if kind == "inv":
        inverse, info = {np}.linalg.inv_ex(x)
        if info.numel() and int(info.max()) != 0:
            raise error(f"{{called}} is singular (a zero pivot in its LU factorisation): it has no inverse")
        return {np}.movedim(inverse, (-2, -1), axes)
    if kind == "adj":  # det(x) inv(x) by LU where every matrix is invertible, else by SVD (singular ones too)
        if x.shape[-1] == 0:
            return {np}.movedim(x, (-2, -1), axes)
        # det and inverse from one LU factorisation, so that their rounding cancels near a singular matrix
        factors, pivots, info = {np}.linalg.lu_factor_ex(x)
        swaps = (pivots != {np}.arange(1, x.shape[-1] + 1, device=pivots.device)).sum(-1) % 2
        determinant = (1 - 2 * swaps).to(x.dtype) * {np}.diagonal(factors, dim1=-2, dim2=-1).prod(-1)
        eye = {np}.eye(x.shape[-1], dtype=x.dtype, device=x.device).expand(x.shape)
        adjugate = determinant[..., None, None] * {np}.linalg.lu_solve(factors, pivots, eye)
        if (info.numel() and int(info.max()) != 0) or not bool({np}.isfinite(adjugate).all()):
            u, s, vh = {np}.linalg.svd(x)  # x = U S V^H: adj(x) = det(U) det(V^H) V diag(prod_(j != i) s_j) U^H
            ones = {np}.ones_like(s[..., :1])
            before = {np}.cumprod({np}.cat([ones, s[..., :-1]], dim=-1), dim=-1)
            after = {np}.flip({np}.cumprod({np}.cat([ones, {np}.flip(s[..., 1:], (-1,))], dim=-1), dim=-1), (-1,))
            phase = {np}.linalg.det(u) * {np}.linalg.det(vh)
            adjugate = phase[..., None, None] * ((vh.mH * (before * after)[..., None, :].to(vh.dtype)) @ u.mH)
        return {np}.movedim(adjugate, (-2, -1), axes)
    if kind == "det":
        return {np}.linalg.det(x)
    sign, logdet = {np}.linalg.slogdet(x)
    if kind == "sign_det":
        sign = sign + 0  # (a singular matrix's sign is 0, not -0)
        nan = {np}.full_like(sign, float("nan"))
        return {np}.where(x.isnan().flatten(-2).any(-1), nan, sign) if x.numel() else sign
    return logdet'''


#: ``inv(M) B`` by a solve: B's axis ``axis`` against M's columns (rows when ``transposed``); the result's first
#: axis is M's other index, then B's other axes. spd: Cholesky (scipy's, when numpy and scipy are there)
SOLVE_HELPER = '''def {solve}(kind, M, axes, B, axis, transposed, name=None, batch=()):
    """inv(M) B over M's columns (``transposed``: B^T inv(M), over its rows), without forming the inverse;
    ``batch``: (M's axis, B's axis) pairs solved matrix by matrix (first in the result; B's axis None: B is the
    same for every matrix, broadcast). A singular matrix is a ValueError naming it."""
    if type(M).__module__.startswith("dask") or type(B).__module__.startswith("dask"):  # one numpy task
        return globals()["_dask_solve"](kind, M, axes, B, axis, transposed, name, batch)
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {{name!r}}" if name else "a matrix"
    singular = f"{{called}} is singular (a zero pivot in its LU factorisation): the system has no unique solution"
    not_positive = f"{{called}} is declared spd but is not positive definite"
    k = len(batch)
    # a Cholesky factor keeps its orientation: a Hermitian matrix's transpose is its conjugate, so B^T inv(M) is
    # conj(inv(M) conj(B)) (a real one: inv(M) B)
    flip = transposed and kind == "cho_solve"
    M = {np}.moveaxis({as_float}(M), [m for m, _ in batch] + list((axes[1], axes[0]) if transposed and not flip
                                                                  else axes), list(range(k + 2)))
    present = [b for _, b in batch if b is not None]
    B = {np}.moveaxis({as_float}(B), present + [axis], list(range(len(present) + 1)))
    for position, (_, b) in enumerate(batch):  # a right-hand side without a batch index: the same for each
        if b is None:
            B = {np}.expand_dims(B, position)
    B = {np}.broadcast_to(B, M.shape[:k] + B.shape[k:])
    columns = 1
    for size in B.shape[k + 1:]:
        columns *= size
    if 0 in M.shape:  # no equations (or no matrices): numpy's empty answer
        return {np}.zeros(B.shape, dtype={np}.promote_types(M.dtype, B.dtype))
    flat = B.reshape(B.shape[:k + 1] + (columns,))
    on_jax = {np}.__name__.startswith("jax")

    def refuse(bad, message):  # jax: inf/nan instead of errors, so asked here
        try:
            found = bool(bad.any())
        except TypeError:  # a traced array (jax.jit): no values to check
            return
        if found:
            raise error(message)

    if kind == "cho_solve":  # M is the lower Cholesky factor of an spd matrix (an "spd_factor" step's value)
        flip = flip and {np}.iscomplexobj(M)
        flat = {np}.conj(flat) if flip else flat
        solved = None
        if {np}.__name__ == "numpy" and not k:
            try:
                from scipy.linalg import cho_solve
            except ImportError:
                pass
            else:
                solved = cho_solve((M, True), flat, check_finite=False)
        if on_jax and not k:
            from jax.scipy.linalg import cho_solve
            solved = cho_solve((M, True), flat)
        if solved is None:
            solved = {np}.linalg.solve({np}.conj({np}.swapaxes(M, -1, -2)), {np}.linalg.solve(M, flat))
        return ({np}.conj(solved) if flip else solved).reshape(B.shape)
    if kind == "spd_solve" and {np}.__name__ == "numpy" and not k:
        try:
            from scipy.linalg import cho_factor, cho_solve
        except ImportError:
            pass
        else:
            try:
                factor = cho_factor(M, lower=True, check_finite=False)
            except {np}.linalg.LinAlgError:
                raise error(not_positive) from None
            return cho_solve(factor, flat, check_finite=False).reshape(B.shape)
    if kind == "spd_solve":
        try:
            factor = {np}.linalg.cholesky(M)
        except {np}.linalg.LinAlgError:
            raise error(not_positive) from None
        if on_jax:
            refuse(~{np}.isfinite(factor) & {np}.isfinite(M).all(axis=(-2, -1), keepdims=True), not_positive)
        inner = {np}.linalg.solve(factor, flat)
        return {np}.linalg.solve({np}.conj({np}.swapaxes(factor, -1, -2)), inner).reshape(B.shape)
    if on_jax:  # numpy's rule: an exact zero pivot of the LU factorisation
        import jax

        refuse({np}.diagonal(jax.lax.linalg.lu(M)[0], axis1=-2, axis2=-1) == 0, singular)
    try:
        return {np}.linalg.solve(M, flat).reshape(B.shape)
    except {np}.linalg.LinAlgError:
        raise error(singular) from None'''

TORCH_SOLVE_HELPER = '''def {solve}(kind, M, axes, B, axis, transposed, name=None, batch=()):
    """inv(M) B over M's columns (``transposed``: B^T inv(M), over its rows), without forming the inverse;
    ``batch``: (M's axis, B's axis) pairs solved matrix by matrix (first in the result; B's axis None: B is the
    same for every matrix, broadcast). A singular matrix is a ValueError naming it."""
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {{name!r}}" if name else "a matrix"
    k = len(batch)
    flip = transposed and kind == "cho_solve"  # a factor keeps its orientation: conj(inv(M) conj(B)) (Hermitian M)
    M = {np}.movedim({as_float}(M), [m for m, _ in batch] + list((axes[1], axes[0]) if transposed and not flip
                                                                 else axes), list(range(k + 2)))
    present = [b for _, b in batch if b is not None]
    B = {np}.movedim({as_float}(B), present + [axis], list(range(len(present) + 1)))
    for position, (_, b) in enumerate(batch):  # a right-hand side without a batch index: the same for each
        if b is None:
            B = B.unsqueeze(position)
    B = B.expand(tuple(M.shape[:k]) + tuple(B.shape[k:]))
    columns = 1
    for size in B.shape[k + 1:]:
        columns *= size
    if 0 in M.shape:  # no equations (or no matrices): numpy's empty answer
        return {np}.zeros(B.shape, dtype={np}.promote_types(M.dtype, B.dtype), device=B.device)
    flat = B.reshape(tuple(B.shape[:k + 1]) + (columns,))
    if M.dtype != flat.dtype:  # torch solves in one dtype (a complex matrix, a real right side)
        common = {np}.promote_types(M.dtype, flat.dtype)
        M, flat = M.to(common), flat.to(common)
    if kind == "cho_solve":  # M is the lower Cholesky factor of an spd matrix (an "spd_factor" step's value)
        if flip and M.is_complex():
            return {np}.cholesky_solve(flat.conj(), M).conj().reshape(B.shape)
        return {np}.cholesky_solve(flat, M).reshape(B.shape)
    if kind == "spd_solve":
        factor, info = {np}.linalg.cholesky_ex(M)
        if info.numel() and int(info.max()) != 0:
            raise error(f"{{called}} is declared spd but is not positive definite")
        return {np}.cholesky_solve(flat, factor).reshape(B.shape)
    solved, info = {np}.linalg.solve_ex(M, flat)
    if info.numel() and int(info.max()) != 0:
        raise error(f"{{called}} is singular (a zero pivot in its LU factorisation): the system has no unique "
                    "solution")
    return solved.reshape(B.shape)'''


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
    return f"spd_{kind}" if declared == "spd" and kind != "sign_det" else kind


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
    if kind.endswith("inv") or kind == "adj":
        return batch * 2 * n**3
    per_matrix = -(-n**3 // 3) if kind.startswith("spd") else -(-2 * n**3 // 3)
    return batch * per_matrix


def _converted(dtype: Any, shape: tuple[int, ...]) -> int:
    """Bytes of the floating copy the helpers make of an integer or boolean argument (``as_float``)."""
    if isinstance(dtype, type) or np.dtype(dtype).kind not in "biu":
        return 0
    return math.prod(shape) * 8


def linalg_workspace(kind: str, shape: tuple[int, ...], axes: tuple[int, ...], dtype: Any) -> int:
    """Bytes a linear-algebra step allocates besides its result while it runs, as numpy and scipy do it.

    numpy's gufuncs copy each matrix into a column-major buffer for LAPACK, one matrix of the batch at a time:
    ``det``/``logdet`` (getrf) one copy, ``inv`` (gesv against the identity) the copy and the identity; a
    Cholesky factorisation none besides its result (scipy's potrf); the inverse from a factor (potri) its copy
    and the two triangles it is symmetrised from. A check (``symmetric``, ``spd``) builds ``|x - x^T|`` (and
    ``spd`` the Cholesky factor, copy and result, unless a later step factorises). An integer matrix is first
    converted to float64 (a whole copy).
    ``tests/test_memory_promise.py`` measures these against the peak resident memory of a child process.

    >>> linalg_workspace("inv", (10, 4, 4), (1, 2), np.dtype("float64"))  # the copy and the identity: 2 x 4x4
    256
    """
    if not shape:
        return 0
    n = shape[axes[0]]
    itemsize = 8 if isinstance(dtype, type) else max(np.dtype(linalg_dtype(dtype)).itemsize, 4)
    matrix = n * n * itemsize
    whole = math.prod(shape) * itemsize
    converted = _converted(dtype, shape)
    if kind in CHECK_KINDS or kind == "spd_by_factor":  # (numpy reuses the difference for its absolute value)
        return converted + (2 if kind == "spd" else 1) * whole
    matrices = {"inv": 2, "det": 1, "logdet": 1, "spd_inv": 2, "spd_det": 1, "spd_logdet": 1, "cho_inv": 2}
    if kind == "spd_factor":  # scipy's potrf copies the matrix into its result
        return converted
    return converted + matrices.get(kind, 0) * matrix


def solve_workspace(kind: str, n: int, rhs_shape: tuple[int, ...], matrix_dtype: Any, rhs_dtype: Any,
                    matrix_shape: tuple[int, ...]) -> int:
    """Bytes a solve allocates besides its result: numpy's gufunc copies one matrix and its right-hand sides
    (per matrix of a batch) for LAPACK's gesv (scipy's Cholesky solve copies the right-hand sides), and an
    integer operand is first converted to float64.

    >>> solve_workspace("solve", 4, (4, 3), np.dtype("float64"), np.dtype("float64"), (4, 4))  # 4x4 and 4x3
    224
    """
    itemsize = max(np.dtype(linalg_dtype(np.result_type(
        *(float if isinstance(d, type) else d for d in (matrix_dtype, rhs_dtype))))).itemsize, 4)
    batch = max(math.prod(matrix_shape) // max(n * n, 1), 1)
    columns = math.prod(rhs_shape) // max(n * batch, 1)
    converted = _converted(matrix_dtype, matrix_shape) + _converted(rhs_dtype, rhs_shape)
    per_matrix = (0 if kind == "cho_solve" else n * n) + n * columns
    return converted + per_matrix * itemsize
