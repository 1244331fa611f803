"""The operations array libraries spell differently, as numpy spells them: one table of small functions.

Every algorithm of :mod:`einflow.engine.runtime` is written over the array API its libraries share and over these
(:data:`PRIMITIVES`): an array write, a scatter-add, the device of new arrays, dtype tests, a strided view,
the factorisations' entry points. A dialect's own runtime module (``Dialect.runtime``: ``runtime_torch``,
``runtime_jax``) redefines those its library spells otherwise, and nothing else; these are the rest's.
"""

from __future__ import annotations

import numpy as xp

__all__ = ["PRIMITIVES", "svd_adjugate", "dtype_kind", "astype", "arange_on", "zeros_on", "asarray_on", "as_index",
           "permuted", "written", "added_at", "zero_padded", "taken", "strided_view", "extreme", "constant",
           "true_divide", "outside", "cholesky_lower", "cholesky_solved", "cholesky_inverted", "spd_inverted",
           "lu_inverted", "lu_solved", "adjugate"]

#: the operations array libraries spell differently, numpy's below: a dialect's runtime module redefines
#: these (and no other function) where its library differs; the algorithms call them by name
PRIMITIVES = ("dtype_kind", "astype", "arange_on", "zeros_on", "asarray_on", "as_index", "permuted", "written",
              "added_at", "zero_padded", "taken", "strided_view", "extreme", "constant", "true_divide", "outside",
              "cholesky_lower", "cholesky_solved", "cholesky_inverted", "spd_inverted", "lu_inverted", "lu_solved",
              "adjugate", "as_float", "input", "sigmoid", "step", "sign", "conj", "real", "imag", "abs2", "erf",
              "as_input_float", "contract", "device")


def svd_adjugate(x):
    """det(x) inv(x) of the matrices on the last two axes of ``x``, also singular ones: for x = U S V^H,
    adj(x) = det(U) det(V^H) V diag(prod_(j != i) s_j) U^H (zero when two or more singular values are)."""
    if x.shape[-1] == 0:
        return x
    u, s, vh = xp.linalg.svd(x)
    ones = xp.ones_like(s[..., :1])
    before = xp.cumprod(xp.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
    after = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(s[..., 1:], (-1,))], axis=-1), axis=-1), (-1,))
    phase = xp.linalg.det(u) * xp.linalg.det(vh)
    return phase[..., None, None] * (xp.conj(xp.swapaxes(vh, -1, -2)) * (before * after)[..., None, :]) @ \
        xp.conj(xp.swapaxes(u, -1, -2))


def dtype_kind(x):
    """numpy's kind of x's type: "b", "i", "u", "f" or "c" (Python numbers too)."""
    return xp.result_type(x).kind


def astype(x, dtype):
    """x converted to ``dtype`` (a numpy type name, or a type of the library)."""
    return x.astype(dtype)


def arange_on(n, like=None):
    """0, 1, ..., n - 1 where ``like`` is (its device)."""
    return xp.arange(n)


def zeros_on(shape, dtype, like=None):
    """Zeros of ``shape`` and ``dtype`` where ``like`` is (its device)."""
    return xp.zeros(shape, dtype=dtype)


def asarray_on(x, like=None):
    """x (an array or a number) as an array where ``like`` is (its device)."""
    return xp.asarray(x)


def as_index(values):
    """A gather's positions as the library indexes by them."""
    return values


def outside(values, length):
    """Whether a gather's positions leave an axis of ``length``."""
    return 0 not in values.shape and bool(values.min() < 0 or values.max() >= length)


def permuted(x, order):
    """x with its axes in ``order``."""
    return x.transpose(order)


def written(out, index, value):
    """out with ``value`` written at ``index`` (positions that are unique): out itself, written in place."""
    out[index] = value
    return out


def added_at(total, flat, weights, keep=None):
    """A zeroed flat array of ``total`` elements with each of ``weights`` added at its position in ``flat``
    (positions repeat; ``keep``: which to add, None: all)."""
    if keep is not None:
        flat, weights = flat[keep], weights[keep]
    out = xp.zeros(total, dtype=weights.dtype)
    xp.add.at(out, flat, weights)
    return out


def zero_padded(array, pads):
    """array padded with zeros by ``pads``, (before, after) per axis."""
    return xp.pad(array, pads)


def taken(array, positions, axis):
    """The elements of ``array`` at ``positions`` along ``axis``."""
    return xp.take(array, positions, axis=axis)


def strided_view(array, shape, planned):
    """A read of affine positions (``planned``, as ``flat`` takes them) as a strided view of ``array`` of
    ``shape``; None where the library has none."""
    strides = [0] * len(shape)
    for axis, (_, terms, _) in enumerate(planned):
        for label, coefficient in terms:
            strides[label] += coefficient * array.strides[axis]
    start = tuple(slice(position[2], None) for position in planned)
    view = xp.lib.stride_tricks.as_strided(array[start], shape=shape, strides=tuple(strides))
    if hasattr(view, "setflags"):  # (numpy's: never written through, its elements overlap; cupy's has no flag)
        view.setflags(write=False)
    return view


def extreme(which, x, axis, keepdims=False):
    """The largest (``which`` "max") or smallest ("min") elements over ``axis``."""
    if which == "max":
        return x.max(axis=axis, keepdims=keepdims)
    return x.min(axis=axis, keepdims=keepdims)


def constant(x):
    """x, taken as a constant by the library's automatic differentiation (numpy has none)."""
    return x


def true_divide(a, b):
    """a / b of arrays as numpy divides (integers as float64, ``bool / float32`` as float32)."""
    return a / b


def cholesky_lower(x, overwrite=False):
    """The lower Cholesky factors of the matrices on the last two axes of x; None where one is not positive
    definite. ``overwrite``: x is the caller's to lose (a real one is factorised in its own memory)."""
    if xp.__name__ == "numpy" and x.ndim == 2 and x.dtype.kind == "f":
        try:  # LAPACK's potrf (numpy's own cholesky is about twice as slow on one matrix)
            from scipy.linalg import get_lapack_funcs
        except ImportError:
            pass
        else:
            potrf = get_lapack_funcs(("potrf",), (x,))[0]
            if overwrite and x.flags.f_contiguous:
                factor, info = potrf(x, lower=True, clean=True, overwrite_a=True)
            elif overwrite and x.flags.c_contiguous:  # x^T = x (symmetric), and Fortran-ordered as LAPACK wants it
                factor, info = potrf(x.T, lower=True, clean=True, overwrite_a=True)
            else:
                factor, info = potrf(x, lower=True, clean=True)
            if info > 0:
                return None
            if info == 0:
                return factor
    try:
        return xp.linalg.cholesky(x)
    except xp.linalg.LinAlgError:
        return None


def cholesky_solved(factor, b):
    """inv(L L^H) b for the lower Cholesky factors L on the last two axes of ``factor``."""
    if xp.__name__ == "numpy" and factor.ndim == 2:
        try:
            from scipy.linalg import cho_solve
        except ImportError:
            pass
        else:
            return cho_solve((factor, True), b, check_finite=False)
    return xp.linalg.solve(xp.conj(xp.swapaxes(factor, -1, -2)), xp.linalg.solve(factor, b))


def cholesky_inverted(factor):
    """inv(L L^H) for the lower Cholesky factors L on the last two axes of ``factor``."""
    if xp.__name__ == "numpy" and factor.ndim == 2:
        try:  # LAPACK's inverse from the factor (potri)
            from scipy.linalg import get_lapack_funcs
        except ImportError:
            pass
        else:
            inverse, info = get_lapack_funcs(("potri",), (factor,))[0](factor, lower=True)
            return xp.tril(inverse) + xp.conj(xp.tril(inverse, -1).T)
    eye = xp.eye(factor.shape[-1], dtype=factor.dtype)
    lower_inverse = xp.linalg.solve(factor, xp.broadcast_to(eye, factor.shape))
    return xp.conj(xp.swapaxes(lower_inverse, -1, -2)) @ lower_inverse


def spd_inverted(x):
    """The inverses of the positive definite matrices on the last two axes of x; None where one is not."""
    if xp.__name__ == "numpy" and x.ndim == 2 and x.dtype.kind == "f":
        try:  # LAPACK's inverse from the Cholesky factor (potrf, potri): half the work of an LU inverse
            from scipy.linalg import get_lapack_funcs
        except ImportError:
            pass
        else:
            potrf, potri = get_lapack_funcs(("potrf", "potri"), (x,))
            factor, info = potrf(x, lower=True, clean=False)
            if info > 0:
                return None
            if info == 0:
                inverse, info = potri(factor, lower=True)
                if info == 0:
                    return xp.tril(inverse) + xp.conj(xp.tril(inverse, -1).T)
    return lu_inverted(x) if cholesky_lower(x) is not None else None


def lu_inverted(x):
    """The inverses of the matrices on the last two axes of x, by LU; None where one is singular (an exact zero
    pivot)."""
    try:
        return xp.linalg.inv(x)
    except xp.linalg.LinAlgError:
        return None


def lu_solved(M, b):
    """inv(M) b by LU for the matrices on the last two axes of M; None where one is singular."""
    try:
        return xp.linalg.solve(M, b)
    except xp.linalg.LinAlgError:
        return None


def adjugate(x):
    """det(x) inv(x) of the (non-empty) matrices on the last two axes of x: by LU where every matrix is
    invertible, else by SVD (singular ones too)."""
    try:
        with xp.errstate(all="ignore"):
            determinant = xp.linalg.det(x)
            found = determinant[..., None, None] * xp.linalg.inv(x)
        if not xp.isfinite(found).all() or not (determinant != 0).all():
            raise xp.linalg.LinAlgError
    except xp.linalg.LinAlgError:
        found = svd_adjugate(x)
    return found
