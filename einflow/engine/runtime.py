"""The generated code's runtime helpers, one real function per algorithm, written over numpy's API.

The array module is the global ``xp``: numpy here, and the array module of the plan where the generated code
runs them (``einflow.engine.helpers`` compiles each function's own source, under the generated code's names,
with ``xp`` bound to numpy, cupy, dask.array or jax.numpy). Exported source (``to_source``) is this source too.
A dialect whose library spells an algorithm differently has its own module (``Dialect.runtime``): its
functions replace these by name.
"""

from __future__ import annotations

import numpy as xp
import opt_einsum as oe

from einflow.lang.padding import fold

__all__ = ["output", "input", "as_float", "reciprocal", "divide", "sigmoid", "step", "sign", "as_input_float",
           "diagonal", "owned", "contract", "device", "erf", "reduce", "linalg", "solve", "conj", "real", "imag",
           "abs2", "ranges", "flat", "window", "scatter"]

# ruff: noqa: A001 - the helpers are named as the generated code names them (``input``, ``reduce``)


def output(x):
    """A value as einflow returns it: a 0-d result is a numpy scalar, as numpy's full reductions give."""
    return x[()] if type(x).__module__ == "numpy" and getattr(x, "ndim", 1) == 0 else x


def input(x):
    """An input as einflow receives it: Python int/float stay weak scalars, the rest become arrays."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x
    return xp.asarray(x)


def as_float(x):
    """Integer (and bool) values promoted to float64, as einflow does for negative or fractional powers."""
    if xp.result_type(x).kind in "biu":
        return x.astype("float64") if hasattr(x, "astype") else float(x)
    return x


def reciprocal(x):
    """x ** -1 with einflow's promotion of integers to float64."""
    if isinstance(x, (int, float)):
        return 1.0 / x if x != 0 else float(xp.copysign(xp.inf, x))
    return xp.reciprocal(as_float(x))


def divide(a, b):
    """a / b as numpy divides: Python numbers too (a zero divisor gives inf or nan, not ZeroDivisionError);
    arrays by numpy's own true division (integers as float64, ``bool / float32`` as float32)."""
    if isinstance(b, (int, float)) and isinstance(a, (int, float)):
        if b != 0:
            return a / b
        if a != a or a == 0:
            return float("nan")
        return float("inf") if (a > 0) == (str(float(b))[0] != "-") else float("-inf")
    return a / b


def sigmoid(x):
    """1 / (1 + exp(-x)) without overflow, accurate in both tails (as einflow computes it).

    With e = exp(-|x|) (never overflows): 1 / (1 + e) for x >= 0 and e / (1 + e) below, in one division.
    """
    e = xp.exp(xp.copysign(x, -1))
    numerator = xp.maximum(e, x >= 0)
    e += 1
    numerator /= e
    return numerator


def step(x):
    """1 where x > 0, else 0, in x's type."""
    return xp.greater(x, 0).astype(xp.result_type(x))


def sign(x):
    """The sign of x (numpy's: nan for nan, x / |x| for complex x)."""
    return xp.sign(x)


def as_input_float(x, *inputs):
    """Deltas alone: numbers of the inputs' floating type when they have one (as einflow does)."""
    floats = [a.dtype for a in inputs if getattr(a, "dtype", None) is not None and a.dtype.kind == "f"]
    return x.astype(xp.result_type(*floats)) if floats else x


def diagonal(value, shape, groups):
    """value written on the diagonals of a zero array of ``shape`` (groups[k]: the axes value's axis k runs along)."""
    index = [None] * len(shape)
    for k, axes in enumerate(groups):
        positions = xp.arange(value.shape[k]).reshape(tuple(-1 if j == k else 1 for j in range(value.ndim)))
        for axis in axes:
            index[axis] = positions
    out = xp.zeros(shape, dtype=value.dtype)
    out[tuple(index)] = value
    return out


def owned(base, shape, value, coefficient=1):
    """``base`` as an array of ``shape`` and of its result type with ``value * coefficient``, for a diagonal to be
    added into in place: ``base`` itself when it already is one (einflow computed it for that alone), else a copy."""
    dtype = xp.result_type(base, value, coefficient)
    if xp.shape(base) == tuple(shape) and xp.result_type(base) == dtype:
        return base
    return xp.broadcast_to(xp.asarray(base), shape).astype(dtype)


def contract(equation, *operands):
    """opt_einsum.contract."""
    return oe.contract(equation, *operands)


def device(*inputs):
    """Where new arrays go (numpy: the host)."""
    return None


def erf(x):
    """The error function elementwise (math.erf per element; the argument's floating type kept)."""
    import math
    x = as_float(xp.asarray(x))
    typed = x.dtype.type  # each value of x's type (a dask block of one value is then still an array scalar)
    return xp.asarray(xp.frompyfunc(lambda v: typed(math.erf(v)), 1, 1)(x), dtype=x.dtype)


def reduce(kind, x, axis):
    """A reduction or normaliser over axes, stable by construction (max-shifted exp)."""
    if kind == "max":
        return x.max(axis=axis)
    if kind == "min":
        return x.min(axis=axis)
    if kind == "mean":
        return as_float(x).mean(axis=axis)
    if kind in ("argmax", "argmin"):
        extreme = x.max(axis=axis, keepdims=True) if kind == "argmax" else x.min(axis=axis, keepdims=True)
        hits = (x == extreme).astype(x.dtype) if x.dtype.kind == "f" else as_float(x == extreme)
        return hits / hits.sum(axis=axis, keepdims=True)
    x = as_float(x)
    if x.size == 0:
        shift = xp.zeros_like(x.sum(axis=axis, keepdims=True))
    else:
        shift = x.max(axis=axis, keepdims=True)
        shift = xp.where(xp.isfinite(shift), shift, 0)
    shifted = x - shift
    e = xp.exp(shifted)
    total = e.sum(axis=axis, keepdims=True)
    if kind == "softmax":
        return e / total
    if kind == "log_softmax":
        return shifted - xp.log(total)
    return (xp.log(total) + shift).squeeze(axis=axis)


def linalg(kind, x, axes, name=None):
    """inv, det, logdet (log|det|), sign_det or adj (det inv, also of a singular matrix) of the matrices on ``axes``
    (rows, columns) of ``x``, batched over the rest; "symmetric"/"spd": ``x`` itself once checked (a ValueError
    names the matrix otherwise); "spd_*": by Cholesky. A singular matrix to invert is a ValueError too."""
    owned = kind == "spd_factor_in_place"  # x is this step's alone: numpy factorises a real one in its memory
    kind = "spd_factor" if owned else kind
    if type(x).__module__.startswith("dask"):  # one numpy task (dask's linalg lacks det, slogdet and batches)
        return globals()["_dask_linalg"](kind, x, axes, name)
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {name!r}" if name else "a matrix"
    on_jax = xp.__name__.startswith("jax")

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
        u, s, vh = xp.linalg.svd(x)
        ones = xp.ones_like(s[..., :1])
        before = xp.cumprod(xp.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
        after = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(s[..., 1:], axis=-1)], axis=-1), axis=-1),
                          axis=-1)
        phase = xp.linalg.det(u) * xp.linalg.det(vh)
        return phase[..., None, None] * (xp.conj(xp.swapaxes(vh, -1, -2)) * (before * after)[..., None, :]) @ \
            xp.conj(xp.swapaxes(u, -1, -2))

    if kind in ("symmetric", "spd", "spd_by_factor", "hermitian"):
        checks, kind = kind, "spd" if kind == "spd_by_factor" else kind
        if x.shape[axes[0]] != x.shape[axes[1]]:
            raise error(f"{called} is declared {kind} but is not square: its shape is {tuple(x.shape)}")
        kind_of = xp.dtype(x.dtype).kind if hasattr(xp, "dtype") else "f"
        if xp.__name__ == "numpy" and x.ndim == 2 and kind_of == "f" and x.size:
            # by blocks of rows against the columns' transposed blocks, the upper triangle only (no transposed
            # copy of the whole matrix); against the diagonal's largest magnitude first (at most the largest
            # entry's, so passing it passes), then against the largest entry's
            tolerance, worst = max(1e-10, 100 * float(xp.finfo(x.dtype).eps)), 0.0
            for start in range(0, x.shape[0], 128):
                block = xp.subtract(x[start:start + 128, start:], x[start:, start:start + 128].T)
                largest = float(xp.abs(block, out=block).max())
                if largest != largest:  # nan: not symmetric
                    worst = largest
                    break
                worst = max(worst, largest)
            diagonal = xp.diagonal(x)
            symmetric = worst <= tolerance * max(float(diagonal.max()), -float(diagonal.min())) or \
                worst <= tolerance * max(float(x.max()), -float(x.min()))
        else:
            try:
                scale = float(abs(x).max()) if x.size else 0.0
                tolerance = max(1e-10, 100 * float(xp.finfo(x.dtype).eps)) if kind_of in "fc" else 1e-10
                # a complex spd or hermitian matrix equals its conjugate transpose (LANGUAGE.md 9.2)
                transposed = xp.swapaxes(x, -1, -2)
                if kind != "symmetric" and kind_of == "c":
                    transposed = xp.conj(transposed)
                symmetric = float(abs(x - transposed).max(initial=0.0)) <= tolerance * scale
            except TypeError:  # a traced array (jax.jit): no values to check
                return x
        if not symmetric:
            shape = "Hermitian" if kind == "hermitian" or kind_of == "c" else "symmetric"
            raise error(f"{called} is declared {kind} but is not {shape}")
        try:
            positive = bool(xp.all(xp.isfinite(xp.linalg.cholesky(as_float(x))))) if checks == "spd" else True
        except Exception as failed:  # numpy's LinAlgError (jax returns nan)
            if type(failed).__name__ != "LinAlgError":
                raise
            positive = False
        if not positive:
            raise error(f"{called} is declared spd but is not positive definite")
        return x
    not_positive = f"{called} is declared spd but is not positive definite"
    x = xp.moveaxis(as_float(x), axes, (-2, -1))
    if kind.startswith("cho_"):  # x is a lower Cholesky factor
        if kind != "cho_inv":
            logdet = 2 * xp.log(xp.abs(xp.diagonal(x, axis1=-2, axis2=-1))).sum(axis=-1)
            return logdet if kind == "cho_logdet" else xp.exp(logdet)
        if xp.__name__ == "numpy" and x.ndim == 2:
            try:  # LAPACK's inverse from the factor (potri)
                from scipy.linalg import get_lapack_funcs
            except ImportError:
                pass
            else:
                inverse, info = get_lapack_funcs(("potri",), (x,))[0](x, lower=True)
                return xp.tril(inverse) + xp.conj(xp.tril(inverse, -1).T)
        eye = xp.eye(x.shape[-1], dtype=x.dtype)
        lower_inverse = xp.linalg.solve(x, xp.broadcast_to(eye, x.shape))
        return xp.moveaxis(xp.conj(xp.swapaxes(lower_inverse, -1, -2)) @ lower_inverse, (-2, -1), axes)
    if kind == "spd_factor" and xp.__name__ == "numpy" and x.ndim == 2 and x.dtype.kind == "f":
        try:  # LAPACK's potrf (numpy's own cholesky is about twice as slow on one matrix)
            from scipy.linalg import get_lapack_funcs
        except ImportError:
            pass
        else:
            potrf = get_lapack_funcs(("potrf",), (x,))[0]
            if owned and x.flags.f_contiguous:
                factor, info = potrf(x, lower=True, clean=True, overwrite_a=True)
            elif owned and x.flags.c_contiguous:  # x^T = x (symmetric), and Fortran-ordered as LAPACK wants it
                factor, info = potrf(x.T, lower=True, clean=True, overwrite_a=True)
            else:
                factor, info = potrf(x, lower=True, clean=True)
            if info > 0:
                raise error(not_positive)
            if info == 0:
                return xp.moveaxis(factor, (-2, -1), axes)
    if kind == "spd_inv" and xp.__name__ == "numpy" and x.ndim == 2 and x.dtype.kind == "f":
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
                    lower = xp.tril(inverse)
                    return lower + xp.conj(xp.tril(inverse, -1).T)
    if kind.startswith("spd_"):
        try:
            factor = xp.linalg.cholesky(x)
        except xp.linalg.LinAlgError:
            raise error(not_positive) from None
        if on_jax:  # jax's Cholesky of a matrix that is not positive definite is nan
            refuse(~xp.isfinite(factor) & xp.isfinite(x).all(axis=(-2, -1), keepdims=True), not_positive)
        if kind == "spd_factor":
            return xp.moveaxis(factor, (-2, -1), axes)
        logdet = 2 * xp.log(xp.abs(xp.diagonal(factor, axis1=-2, axis2=-1))).sum(axis=-1)
        if kind == "spd_logdet":
            return logdet
        if kind == "spd_det":
            return xp.exp(logdet)
        kind = "inv"
    if kind == "adj" and x.shape[-1] == 0:
        return xp.moveaxis(x, (-2, -1), axes)
    if kind in ("inv", "adj") and on_jax and x.shape[-1]:  # numpy's rule: an exact zero pivot of the LU factorisation
        import jax

        pivots = xp.diagonal(jax.lax.linalg.lu(x)[0], axis1=-2, axis2=-1)
        if kind == "inv":
            refuse(pivots == 0, f"{called} is singular (a zero pivot in its LU factorisation): it has no inverse")
        else:  # the adjugate by SVD (defined for every matrix, one jit-able form): adj(U S V^H) = ...
            return xp.moveaxis(by_svd(x), (-2, -1), axes)
    if kind == "inv":
        try:
            inverse = xp.linalg.inv(x)
        except xp.linalg.LinAlgError:
            raise error(f"{called} is singular (a zero pivot in its LU factorisation): it has no inverse") from None
        return xp.moveaxis(inverse, (-2, -1), axes)
    if kind == "adj":  # det(x) inv(x) by LU where every matrix is invertible, else by SVD (singular ones too)
        try:
            with xp.errstate(all="ignore"):
                determinant = xp.linalg.det(x)
                adjugate = determinant[..., None, None] * xp.linalg.inv(x)
            if not xp.isfinite(adjugate).all() or not (determinant != 0).all():
                raise xp.linalg.LinAlgError
        except xp.linalg.LinAlgError:
            adjugate = by_svd(x)
        return xp.moveaxis(adjugate, (-2, -1), axes)
    if kind == "det":
        value = xp.linalg.det(x)
    elif kind == "sign_det":
        value = xp.linalg.slogdet(x)[0]
    else:
        value = xp.linalg.slogdet(x)[1]
    if xp.__name__ == "numpy" or kind == "sign_det":  # LAPACK's det of a matrix holding nan can be 0: nan
        value = xp.where(xp.isnan(x).any(axis=(-2, -1)), xp.nan, value)
    return value


def solve(kind, M, axes, B, axis, transposed, name=None, batch=()):
    """inv(M) B over M's columns (``transposed``: B^T inv(M), over its rows), without forming the inverse;
    ``batch``: (M's axis, B's axis) pairs solved matrix by matrix (first in the result; B's axis None: B is the
    same for every matrix, broadcast). A singular matrix is a ValueError naming it."""
    if type(M).__module__.startswith("dask") or type(B).__module__.startswith("dask"):  # one numpy task
        return globals()["_dask_solve"](kind, M, axes, B, axis, transposed, name, batch)
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {name!r}" if name else "a matrix"
    singular = f"{called} is singular (a zero pivot in its LU factorisation): the system has no unique solution"
    not_positive = f"{called} is declared spd but is not positive definite"
    k = len(batch)
    # a Cholesky factor keeps its orientation: a Hermitian matrix's transpose is its conjugate, so B^T inv(M) is
    # conj(inv(M) conj(B)) (a real one: inv(M) B)
    flip = transposed and kind == "cho_solve"
    M = xp.moveaxis(as_float(M), [m for m, _ in batch] + list((axes[1], axes[0]) if transposed and not flip
                                                              else axes), list(range(k + 2)))
    present = [b for _, b in batch if b is not None]
    B = xp.moveaxis(as_float(B), present + [axis], list(range(len(present) + 1)))
    for position, (_, b) in enumerate(batch):  # a right-hand side without a batch index: the same for each
        if b is None:
            B = xp.expand_dims(B, position)
    B = xp.broadcast_to(B, M.shape[:k] + B.shape[k:])
    columns = 1
    for size in B.shape[k + 1:]:
        columns *= size
    if 0 in M.shape:  # no equations (or no matrices): numpy's empty answer
        return xp.zeros(B.shape, dtype=xp.promote_types(M.dtype, B.dtype))
    flat = B.reshape(B.shape[:k + 1] + (columns,))
    on_jax = xp.__name__.startswith("jax")

    def refuse(bad, message):  # jax: inf/nan instead of errors, so asked here
        try:
            found = bool(bad.any())
        except TypeError:  # a traced array (jax.jit): no values to check
            return
        if found:
            raise error(message)

    if kind == "cho_solve":  # M is the lower Cholesky factor of an spd matrix (an "spd_factor" step's value)
        flip = flip and xp.iscomplexobj(M)
        flat = xp.conj(flat) if flip else flat
        solved = None
        if xp.__name__ == "numpy" and not k:
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
            solved = xp.linalg.solve(xp.conj(xp.swapaxes(M, -1, -2)), xp.linalg.solve(M, flat))
        return (xp.conj(solved) if flip else solved).reshape(B.shape)
    if kind == "spd_solve" and xp.__name__ == "numpy" and not k:
        try:
            from scipy.linalg import cho_factor, cho_solve
        except ImportError:
            pass
        else:
            try:
                factor = cho_factor(M, lower=True, check_finite=False)
            except xp.linalg.LinAlgError:
                raise error(not_positive) from None
            return cho_solve(factor, flat, check_finite=False).reshape(B.shape)
    if kind == "spd_solve":
        try:
            factor = xp.linalg.cholesky(M)
        except xp.linalg.LinAlgError:
            raise error(not_positive) from None
        if on_jax:
            refuse(~xp.isfinite(factor) & xp.isfinite(M).all(axis=(-2, -1), keepdims=True), not_positive)
        inner = xp.linalg.solve(factor, flat)
        return xp.linalg.solve(xp.conj(xp.swapaxes(factor, -1, -2)), inner).reshape(B.shape)
    if on_jax:  # numpy's rule: an exact zero pivot of the LU factorisation
        import jax

        refuse(xp.diagonal(jax.lax.linalg.lu(M)[0], axis1=-2, axis2=-1) == 0, singular)
    try:
        return xp.linalg.solve(M, flat).reshape(B.shape)
    except xp.linalg.LinAlgError:
        raise error(singular) from None


def conj(x):
    """The complex conjugate (a copy for real x: a later in-place step must never write into an input).
    (The dtype's kind, not iscomplexobj: dask.array has none.)"""
    complex_ = isinstance(x, complex) or getattr(getattr(x, "dtype", None), "kind", "") == "c"
    y = xp.conj(x) if complex_ else x
    return y.copy() if y is x and hasattr(x, "copy") else y


def real(x):
    """The real part, as a new array (numpy's real is a view of x, or x itself: never written in place)."""
    y = xp.real(x)
    return y.copy() if hasattr(y, "copy") else y


def imag(x):
    """The imaginary part (zeros for real x), as a new array (numpy's imag of a complex x is a view of it)."""
    complex_ = isinstance(x, complex) or getattr(getattr(x, "dtype", None), "kind", "") == "c"
    y = xp.imag(x)
    return y.copy() if complex_ and hasattr(y, "copy") else y


def abs2(x):
    """|x|^2: re^2 + im^2 for complex x (no square root), x * x otherwise."""
    if isinstance(x, complex) or getattr(getattr(x, "dtype", None), "kind", "") == "c":
        return x.real * x.real + x.imag * x.imag
    return x * x


# ------------------------------------------------------------------ shifted, strided and gathered reads
# (exported source: ``einflow.export.windows``; the engine's kernels, with every range known, are
# ``einflow.engine.affine``'s)


def ranges(reads, sizes, padded):
    """Each index only shifted reads size gets the largest range in which every read it takes part in stays
    inside its axis, and an index a plain read sizes shrinks to what its shifted reads allow (Tullio's rule).
    ``reads``: (axis length, ((coefficient, index), ...), offset, whether a delta's) per affine position."""
    def bounds(terms, offset):
        low = high = offset
        for coefficient, index in terms:
            reach = coefficient * (sizes[index] - 1)
            low, high = low + min(reach, 0), high + max(reach, 0)
        return low, high

    def limit(length, coefficient, low, high):
        return (length - 1 - high) // coefficient + 1 if coefficient > 0 else low // -coefficient + 1

    changed = True
    while changed:
        changed, limits = False, {}
        for length, terms, offset, lenient in reads:
            unknown = [(c, index) for c, index in terms if index not in sizes]
            if len(unknown) != 1:
                continue
            coefficient, index = unknown[0]
            known = [(c, i) for c, i in terms if i != index]
            if any(sizes[i] == 0 for _, i in known):
                continue
            low, high = bounds(known, offset)
            if lenient:
                low, high = max(low, 0), min(high, length - 1)
            elif low < 0 if coefficient > 0 else high > length - 1:
                raise ValueError(f"a shifted read of index {index!r} leaves its axis of length {length}")
            limits[index] = min(limits.get(index, limit(length, coefficient, low, high)),
                                max(limit(length, coefficient, low, high), 0))
        for index, size in limits.items():
            sizes[index], changed = size, True
    changed = True
    while changed:
        changed = False
        for length, terms, offset, lenient in reads:
            indices = {i for _, i in terms}
            if lenient or indices & set(padded) or not indices <= sizes.keys():
                continue
            for coefficient, index in terms:
                known = [(c, i) for c, i in terms if i != index]
                if sizes[index] == 0 or any(sizes[i] == 0 for _, i in known):
                    continue
                size = limit(length, coefficient, *bounds(known, offset))
                if 0 <= size < sizes[index]:
                    sizes[index], changed = size, True
    return sizes


def flat(padded, shape, planned, gathers, device=None):
    """Flat positions into a C-ordered array of shape ``padded`` for every element of a read (broadcast)."""
    rank, flat, stride, strides = len(shape), 0, 1, []
    for length in reversed(padded):
        strides.insert(0, stride)
        stride *= length
    for axis, position in enumerate(planned):
        if position[0] == "affine":
            value = position[2]
            for label, coefficient in position[1]:
                view = [1] * rank
                view[label] = shape[label]
                value = value + coefficient * xp.arange(shape[label]).reshape(view)
        else:
            values, axes = gathers[position[1]], position[2]
            if values.size and (values.min() < 0 or values.max() >= padded[axis]):
                raise IndexError(f"a gather reads a position outside its axis of length {padded[axis]}")
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = shape[a]
            value = values.transpose(order).reshape(view)
        flat = flat + value * strides[axis]
    return flat


def window(array, shape, positions, *gathers, mode="zeros"):
    """A shifted, strided or gathered read: a strided view (padded first where the reads leave the array: zeros,
    or the array folded by ``mode``), or one take at flat positions where it gathers."""
    pads, planned = [], []
    for axis, position in enumerate(positions):
        if position[0] == "gather":
            pads.append((0, 0))
            planned.append(position)
            continue
        _, terms, offset = position
        low = high = offset
        if all(shape[label] for label, _ in terms):
            for label, coefficient in terms:
                reach = coefficient * (shape[label] - 1)
                low, high = low + min(reach, 0), high + max(reach, 0)
        pads.append((max(0, -low), max(0, high - (array.shape[axis] - 1))))
        planned.append(("affine", terms, offset + pads[-1][0]))
    if any(pair != (0, 0) for pair in pads) and mode == "zeros":
        array = xp.pad(array, pads)
    for axis, (before, after) in enumerate(pads if mode != "zeros" else ()):
        if before or after:
            length = array.shape[axis]
            array = xp.take(array, fold(xp.arange(-before, length + after), length, mode), axis=axis)
    if gathers or not all(shape):
        return array.reshape(-1)[flat(array.shape, shape, planned, gathers)]
    strides = [0] * len(shape)
    for axis, (_, terms, _) in enumerate(planned):
        for label, coefficient in terms:
            strides[label] += coefficient * array.strides[axis]
    start = tuple(slice(position[2], None) for position in planned)
    return xp.lib.stride_tricks.as_strided(array[start], shape=shape, strides=tuple(strides), writeable=False)


def scatter(value, shape, positions, *gathers):
    """A scatter-add: each element of ``value`` added into a zeroed array of ``shape`` where ``positions`` put
    it (a plain position: the same axis of ``value``); elements landing outside are dropped."""
    rank, flat, inside, stride, strides = len(value.shape), 0, None, 1, []
    for length in reversed(shape):
        strides.insert(0, stride)
        stride *= length

    def along(axis):
        view = [1] * rank
        view[axis] = value.shape[axis]
        return xp.arange(value.shape[axis]).reshape(view)

    for axis, position in enumerate(positions):
        if position[0] == "plain":
            place = along(position[1])
        elif position[0] == "affine":
            place = position[2]
            for source, coefficient in position[1]:
                place = place + coefficient * along(source)
            if len(position) > 3:  # folded back onto the axis (pad circular|reflect|replicate)
                place = fold(place, shape[axis], position[3])
            else:
                fits = (place >= 0) & (place < shape[axis])
                inside = fits if inside is None else inside & fits
        else:
            values, axes = gathers[position[1]], position[2]
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = value.shape[a]
            place = values.transpose(order).reshape(view)
        flat = flat + place * strides[axis]
    total, weights = 1, value.reshape(-1)
    for length in shape:
        total *= length
    flat = xp.broadcast_to(xp.asarray(flat), value.shape).reshape(-1)
    keep = None if inside is None else xp.broadcast_to(xp.asarray(inside), value.shape).reshape(-1)
    if keep is not None:
        flat, weights = flat[keep], weights[keep]
    out = xp.zeros(total, dtype=value.dtype)
    xp.add.at(out, flat, weights)
    return out.reshape(shape)
