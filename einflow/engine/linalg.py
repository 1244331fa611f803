"""Linear algebra steps (LANGUAGE.md 8.1): ``inv``, ``det`` and ``logdet`` of the matrices on two axes of an array.

The lowering writes each atom as a :class:`einflow.engine.steps.Reduce` step whose ``kind`` is one of
:data:`LINALG_KINDS` and whose ``axes`` are (rows, columns), in that order; ``inv`` keeps every axis, ``det`` and
``logdet`` drop the two. The generated code calls the ``linalg`` helper (``einflow.engine.runtime``) on the
dialect's linear algebra (numpy.linalg, torch.linalg, jax.numpy.linalg), batched over the other axes. This module
says what such a step costs (FLOPs) and what type it makes, for the specialiser and the plan report.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from einflow.lang.ir import LINALG, MATRIX_DECLARATIONS

__all__ = ["linalg_workspace", "solve_workspace",
           "SPD_FACTORING", "FACTOR_KINDS", "solve_flops", "LINALG_KINDS",
           "CHECK_KINDS", "SPD_KINDS", "KEEPS_AXES",
           "matrix_kind", "linalg_result_dtype", "is_linalg", "linalg_dtype", "linalg_flops"]

LINALG_KINDS = LINALG
#: a declared matrix checked at call time (the step's value is the matrix itself)
CHECK_KINDS = MATRIX_DECLARATIONS
#: the atoms of a matrix declared ``spd``: computed from its Cholesky factor
SPD_KINDS = ("spd_inv", "spd_det", "spd_logdet")
#: steps that factorise their matrix by Cholesky (and say so when it is not positive definite); "spd_factor":
#: the lower Cholesky factor itself, which "cho_solve" steps share (one factorisation for every solve with it);
#: "spd_factor_in_place": of a matrix no later step reads, in the matrix's own memory (numpy, real matrices)
SPD_FACTORING = ("spd_inv", "spd_det", "spd_logdet", "spd_solve", "spd_factor", "spd_factor_in_place")
#: every kind this module's helper computes ("spd_by_factor": an spd check whose matrix a later step factorises)
_KINDS: tuple[str, ...] = LINALG_KINDS + CHECK_KINDS + SPD_KINDS + ("spd_by_factor", "spd_factor",
                                                                    "spd_factor_in_place")
#: the atoms of an spd matrix computed from its shared Cholesky factor (an "spd_factor" step's value)
FACTOR_KINDS = ("cho_inv", "cho_det", "cho_logdet")
_KINDS += FACTOR_KINDS
#: the step kinds whose value keeps every axis of its argument (an inverse, an adjugate, a checked matrix, a
#: Cholesky factor); the others (det, logdet, sign_det and their spd and cho forms) drop the matrix's two
KEEPS_AXES = frozenset({"inv", "adj", "spd_inv", "cho_inv", "spd_by_factor", "spd_factor", "spd_factor_in_place",
                        *CHECK_KINDS})
#: det(M) inv(M), M's adjugate, of a product that holds both (the derivative of det): defined for singular M too
_KINDS += ("adj",)
#: how far from symmetric a declared matrix may be, relative to its largest entry (round-off of a computed one)
SYMMETRY_TOLERANCE = 1e-10

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
    if kind in ("spd_factor", "spd_factor_in_place"):  # scipy's potrf copies the matrix into its result (in
        return converted  # place: none, where the matrix is real and contiguous; its allocation still counted)
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
