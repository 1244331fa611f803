"""The generated code's runtime helpers, one real function per algorithm, written over the array API.

The array module is the global ``xp``: numpy here, and the array module of the plan where the generated code
runs them (``einflow.engine.helpers`` compiles each function's own source, under the generated code's names,
with ``xp`` bound to numpy, cupy, dask.array, jax.numpy or torch). Exported source (``to_source``) is this
source too. Every algorithm (softmax, the linear algebra, windows, scatter-adds) is one function here, written
over what the array libraries share and over :data:`PRIMITIVES`: the few operations they spell differently
(an array write, a scatter-add, the device of new arrays, dtype tests, the factorisations' entry points). A
dialect's own module (``Dialect.runtime``) redefines those, and only those, by name.
"""

from __future__ import annotations

import numpy as xp
import opt_einsum as oe

# the operations numpy spells its own way (every one: the bound helpers find them here)
from einflow.engine.runtime_numpy import PRIMITIVES as PRIMITIVES
from einflow.engine.runtime_numpy import added_at as added_at
from einflow.engine.runtime_numpy import adjugate as adjugate
from einflow.engine.runtime_numpy import arange_on as arange_on
from einflow.engine.runtime_numpy import as_index as as_index
from einflow.engine.runtime_numpy import asarray_on as asarray_on
from einflow.engine.runtime_numpy import astype as astype
from einflow.engine.runtime_numpy import cholesky_inverted as cholesky_inverted
from einflow.engine.runtime_numpy import cholesky_lower as cholesky_lower
from einflow.engine.runtime_numpy import cholesky_solved as cholesky_solved
from einflow.engine.runtime_numpy import constant as constant
from einflow.engine.runtime_numpy import dtype_kind as dtype_kind
from einflow.engine.runtime_numpy import extreme as extreme
from einflow.engine.runtime_numpy import lu_inverted as lu_inverted
from einflow.engine.runtime_numpy import lu_solved as lu_solved
from einflow.engine.runtime_numpy import outside as outside
from einflow.engine.runtime_numpy import permuted as permuted
from einflow.engine.runtime_numpy import spd_inverted as spd_inverted
from einflow.engine.runtime_numpy import strided_view as strided_view
from einflow.engine.runtime_numpy import svd_adjugate as svd_adjugate
from einflow.engine.runtime_numpy import taken as taken
from einflow.engine.runtime_numpy import true_divide as true_divide
from einflow.engine.runtime_numpy import written as written
from einflow.engine.runtime_numpy import zero_padded as zero_padded
from einflow.engine.runtime_numpy import zeros_on as zeros_on
from einflow.lang.padding import fold

__all__ = ["output", "input", "as_float", "reciprocal", "divide", "sigmoid", "step", "sign", "as_input_float",
           "diagonal", "owned", "contract", "device", "erf", "reduce", "linalg", "solve", "conj", "real", "imag",
           "abs2", "ranges", "gather_view", "flat", "window", "scatter", "scatter_positions", "flagged", "PRIMITIVES"]

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
        return 1.0 / x if x != 0 else float("inf") if str(float(x))[0] != "-" else float("-inf")
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
    return true_divide(a, b)


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
        positions = arange_on(value.shape[k], value).reshape(tuple(-1 if j == k else 1 for j in range(value.ndim)))
        for axis in axes:
            index[axis] = positions
    return written(zeros_on(shape, value.dtype, value), tuple(index), value)


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
    if kind in ("max", "min"):
        return extreme(kind, x, axis)
    if kind == "mean":
        return as_float(x).mean(axis=axis)
    if kind in ("argmax", "argmin"):
        hits = x == extreme(kind[3:], x, axis, True)
        hits = astype(hits, x.dtype) if dtype_kind(x) == "f" else as_float(hits)
        return hits / hits.sum(axis=axis, keepdims=True)
    x = as_float(x)
    if 0 in x.shape:
        shift = xp.zeros_like(x.sum(axis=axis, keepdims=True))
    else:  # shifted by the finite maximum (a constant: its derivatives cancel)
        shift = constant(extreme("max", x, axis, True))
        shift = xp.where(xp.isfinite(shift), shift, 0)
    shifted = x - shift
    e = xp.exp(shifted)
    total = e.sum(axis=axis, keepdims=True)
    if kind == "softmax":
        return e / total
    if kind == "log_softmax":
        return shifted - xp.log(total)
    return (xp.log(total) + shift).squeeze(axis=axis)


def flagged(bad):
    """Whether any of the flags ``bad`` is set (False for a traced array, jax.jit's: it has no values to ask)."""
    try:
        return bool(bad.any())
    except TypeError:
        return False


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
    not_positive = f"{called} is declared spd but is not positive definite"
    singular = f"{called} is singular (a zero pivot in its LU factorisation): it has no inverse"
    if kind in ("symmetric", "spd", "spd_by_factor", "hermitian"):
        checks, kind = kind, "spd" if kind == "spd_by_factor" else kind
        if x.shape[axes[0]] != x.shape[axes[1]]:
            raise error(f"{called} is declared {kind} but is not square: its shape is {tuple(x.shape)}")
        kind_of = dtype_kind(x)
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
                scale = float(abs(x).max()) if 0 not in x.shape else 0.0
                tolerance = max(1e-10, 100 * float(xp.finfo(x.dtype).eps)) if kind_of in "fc" else 1e-10
                # a complex spd or hermitian matrix equals its conjugate transpose (LANGUAGE.md 9.2)
                transposed = xp.swapaxes(x, -1, -2)
                if kind != "symmetric" and kind_of == "c":
                    transposed = xp.conj(transposed)
                symmetric = (float(abs(x - transposed).max()) if 0 not in x.shape else 0.0) <= tolerance * scale
            except TypeError:  # a traced array (jax.jit): no values to check
                return x
        if not symmetric:
            shape = "Hermitian" if kind == "hermitian" or kind_of == "c" else "symmetric"
            raise error(f"{called} is declared {kind} but is not {shape}")
        if checks == "spd":
            factor = cholesky_lower(as_float(x))
            if factor is None or not bool(xp.all(xp.isfinite(factor))):
                raise error(not_positive)
        return x
    x = xp.moveaxis(as_float(x), axes, (-2, -1))
    if kind.startswith("cho_"):  # x is a lower Cholesky factor
        if kind == "cho_inv":
            return xp.moveaxis(cholesky_inverted(x), (-2, -1), axes)
        logdet = 2 * xp.log(xp.abs(xp.diagonal(x, 0, -2, -1))).sum(axis=-1)
        return logdet if kind == "cho_logdet" else xp.exp(logdet)
    if kind in ("inv", "spd_inv"):
        inverse = lu_inverted(x) if kind == "inv" else spd_inverted(x)
        if inverse is None:
            raise error(singular if kind == "inv" else not_positive)
        return xp.moveaxis(inverse, (-2, -1), axes)
    if kind.startswith("spd_"):
        factor = cholesky_lower(x, owned)
        if factor is None:
            raise error(not_positive)
        if kind == "spd_factor":
            return xp.moveaxis(factor, (-2, -1), axes)
        logdet = 2 * xp.log(xp.abs(xp.diagonal(factor, 0, -2, -1))).sum(axis=-1)
        return logdet if kind == "spd_logdet" else xp.exp(logdet)
    if kind == "adj":  # det(x) inv(x), also of a singular matrix
        return xp.moveaxis(adjugate(x) if x.shape[-1] else x, (-2, -1), axes)
    if kind == "det":
        value = xp.linalg.det(x)
    else:
        value = xp.linalg.slogdet(x)[0 if kind == "sign_det" else 1]
        value = value + 0 if kind == "sign_det" else value  # (a singular matrix's sign is 0, not -0)
    # LAPACK's det of a matrix holding nan can be 0: nan
    return xp.where(xp.isnan(x).any(axis=(-2, -1)), xp.nan, value) if 0 not in x.shape else value


def solve(kind, M, axes, B, axis, transposed, name=None, batch=()):
    """inv(M) B over M's columns (``transposed``: B^T inv(M), over its rows), without forming the inverse;
    ``batch``: (M's axis, B's axis) pairs solved matrix by matrix (first in the result; B's axis None: B is the
    same for every matrix, broadcast). A singular matrix is a ValueError naming it."""
    if type(M).__module__.startswith("dask") or type(B).__module__.startswith("dask"):  # one numpy task
        return globals()["_dask_solve"](kind, M, axes, B, axis, transposed, name, batch)
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {name!r}" if name else "a matrix"
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
            B = B.reshape(tuple(B.shape[:position]) + (1,) + tuple(B.shape[position:]))
    B = xp.broadcast_to(B, tuple(M.shape[:k]) + tuple(B.shape[k:]))
    columns = 1
    for size in B.shape[k + 1:]:
        columns *= size
    if 0 in M.shape:  # no equations (or no matrices): numpy's empty answer
        return zeros_on(B.shape, xp.promote_types(M.dtype, B.dtype), B)
    flat = B.reshape(tuple(B.shape[:k + 1]) + (columns,))
    if M.dtype != flat.dtype:  # one type for both (torch solves in one: a complex matrix, a real right side)
        common = xp.promote_types(M.dtype, flat.dtype)
        M, flat = astype(M, common), astype(flat, common)
    if kind == "cho_solve":  # M is the lower Cholesky factor of an spd matrix (an "spd_factor" step's value)
        flip = flip and dtype_kind(M) == "c"
        solved = cholesky_solved(M, xp.conj(flat) if flip else flat)
        return (xp.conj(solved) if flip else solved).reshape(B.shape)
    if kind == "spd_solve":
        factor = cholesky_lower(M)
        if factor is None:
            raise error(f"{called} is declared spd but is not positive definite")
        return cholesky_solved(factor, flat).reshape(B.shape)
    solved = lu_solved(M, flat)
    if solved is None:
        raise error(f"{called} is singular (a zero pivot in its LU factorisation): the system has no unique "
                    "solution")
    return solved.reshape(B.shape)


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


def gather_view(values, axes, shape):
    """A gather's positions (an index array) laid along the axes ``axes`` of a broadcast array of ``shape``: its
    k-th axis on axis ``axes[k]`` (its axes moved into the order of ``axes``), length 1 on the others."""
    order = sorted(range(len(axes)), key=lambda a: axes[a])
    view = [1] * len(shape)
    for a in axes:
        view[a] = shape[a]
    return permuted(values, order).reshape(view)


def flat(padded, shape, planned, gathers, like=None):
    """Flat positions into a C-ordered array of shape ``padded`` for every element of a read (broadcast), on the
    device of ``like``. ``planned``: per axis ("affine", ((label axis, coefficient), ...), offset) or ("gather",
    k, label axes of ``gathers[k]``'s axes)."""
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
                value = value + coefficient * arange_on(shape[label], like).reshape(view)
        else:
            values = gathers[position[1]]
            if outside(values, padded[axis]):
                raise IndexError(f"a gather reads a position outside its axis of length {padded[axis]}")
            value = gather_view(values, position[2], shape)
        flat = flat + value * strides[axis]
    return flat


def window(array, shape, positions, *gathers, mode="zeros"):
    """A shifted, strided or gathered read: a strided view where the library has one (padded first where the
    reads leave the array: zeros, or the array folded by ``mode``), else one take at flat positions."""
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
        array = zero_padded(array, pads)
    for axis, (before, after) in enumerate(pads if mode != "zeros" else ()):
        if before or after:
            length = array.shape[axis]
            array = taken(array, fold(arange_on(before + length + after, array) - before, length, mode), axis)
    if not gathers and all(shape):
        view = strided_view(array, shape, planned)
        if view is not None:
            return view
    gathers = tuple(as_index(gather) for gather in gathers)
    return array.reshape(-1)[flat(tuple(array.shape), shape, planned, gathers, array)]


def scatter_positions(value_shape, shape, positions, gathers, like=None):
    """Flat positions in a C-ordered array of ``shape`` for every element of a value of ``value_shape``
    (broadcast), and which of them land inside it (None: all do). ``positions``: per axis ("plain", value
    axis), ("affine", ((value axis, coefficient), ...), offset[, mode]) (a mode folds what lands outside back
    onto the axis: pad circular|reflect|replicate) or ("gather", k, value axes of ``gathers[k]``'s axes)."""
    rank, flat, inside, stride, strides = len(value_shape), 0, None, 1, []
    for length in reversed(shape):
        strides.insert(0, stride)
        stride *= length

    def along(axis):
        view = [1] * rank
        view[axis] = value_shape[axis]
        return arange_on(value_shape[axis], like).reshape(view)

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
            place = gather_view(gathers[position[1]], position[2], value_shape)
        flat = flat + place * strides[axis]
    return flat, inside


def scatter(value, shape, positions, *gathers):
    """A scatter-add: each element of ``value`` added into a zeroed array of ``shape`` where ``positions`` put
    it (a plain position: the same axis of ``value``); elements landing outside are dropped."""
    gathers = tuple(as_index(gather) for gather in gathers)
    flat, inside = scatter_positions(tuple(value.shape), shape, positions, gathers, value)
    total = 1
    for length in shape:
        total *= length
    flat = xp.broadcast_to(asarray_on(flat, value), value.shape).reshape(-1)
    keep = None if inside is None else xp.broadcast_to(asarray_on(inside, value), value.shape).reshape(-1)
    return added_at(total, flat, value.reshape(-1), keep).reshape(shape)
