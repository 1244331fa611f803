"""The runtime helpers PyTorch spells its own way (``TORCH.runtime``): each replaces ``einflow.engine.runtime``'s.

torch tensors have no ``kind`` on their dtypes and no ``astype``; ``torch.maximum`` takes two tensors. As in
``einflow.engine.runtime``, the global ``xp`` is the array module (torch) and helpers call each other by name.
"""

from __future__ import annotations

import opt_einsum as oe
import torch as xp

from einflow.lang.padding import fold

__all__ = ["input", "as_float", "reciprocal", "divide", "sigmoid", "step", "conj", "real", "imag", "abs2", "sign",
           "as_input_float", "diagonal", "erf", "reduce", "contract", "device", "linalg", "solve", "flat", "window",
           "scatter"]

# ruff: noqa: A001 - the helpers are named as the generated code names them


def input(x):
    """An input as einflow receives it: Python int/float become 0-d int64/float64 tensors (weak in torch's
    promotion as Python numbers are in numpy's), the rest become tensors."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return xp.tensor(x, dtype=xp.float64 if isinstance(x, float) else xp.int64)
    x = xp.as_tensor(x)
    return x.long() if x.dtype == xp.bool else x


def as_float(x):
    """Integer (and bool) values promoted to float64, as einflow does for negative or fractional powers."""
    if isinstance(x, (int, float)):
        return float(x)
    return x if x.is_floating_point() or x.is_complex() else x.to(xp.float64)


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
            return as_float(a) / as_float(b)
        if a != a or a == 0:
            return float("nan")
        return float("inf") if (a > 0) == (str(float(b))[0] != "-") else float("-inf")
    return as_float(a) / as_float(b)


def sigmoid(x):
    """1 / (1 + exp(-x)) without overflow, accurate in both tails (torch's own kernel)."""
    if isinstance(x, (int, float)):
        x = xp.tensor(float(x), dtype=xp.float64)
    return xp.sigmoid(x)


def step(x):
    """1 where x > 0, else 0, in x's type."""
    return (x > 0).to(x.dtype)


def sign(x):
    """numpy's sign: nan where x is nan, x / |x| for complex x."""
    if x.is_complex():
        return xp.sgn(x)
    return xp.where(xp.isnan(x), x, xp.sign(x)) if x.is_floating_point() else xp.sign(x)


def as_input_float(x, *inputs):
    """Deltas alone: numbers of the inputs' floating type when they have one (as einflow does)."""
    floats = [a.dtype for a in inputs if isinstance(a, xp.Tensor) and a.is_floating_point()]
    if not floats:
        return x
    dtype = floats[0]
    for other in floats[1:]:
        dtype = xp.promote_types(dtype, other)
    return x.to(dtype)


def diagonal(value, shape, groups):
    """value written on the diagonals of a zero tensor of ``shape`` (groups[k]: the axes value's axis k runs along)."""
    index = [None] * len(shape)
    for k, axes in enumerate(groups):
        positions = xp.arange(value.shape[k], device=value.device)
        positions = positions.reshape(tuple(-1 if j == k else 1 for j in range(value.ndim)))
        for axis in axes:
            index[axis] = positions
    out = xp.zeros(shape, dtype=value.dtype, device=value.device)
    out[tuple(index)] = value
    return out


def contract(equation, *operands):
    """opt_einsum.contract on tensors brought to numpy's common type first (torch.einsum refuses mixed types)."""
    dtype = operands[0].dtype
    for operand in operands[1:]:
        dtype = xp.promote_types(dtype, operand.dtype)
    if dtype == xp.bool:
        dtype = xp.int64
    elif dtype.is_floating_point or dtype.is_complex:  # numpy: an n-byte integer needs a float of 2n bytes
        size = max([min(2 * a.dtype.itemsize, 8) for a in operands if not (a.dtype.is_floating_point or
                    a.dtype.is_complex)] + [dtype.itemsize // (2 if dtype.is_complex else 1)])
        wanted = {2: xp.float16, 4: xp.float32, 8: xp.float64}[size]
        dtype = xp.promote_types(dtype, wanted)
    return oe.contract(equation, *[a if a.dtype == dtype else a.to(dtype) for a in operands])


def device(*inputs):
    """Where new tensors go: the device of the first tensor input (the CPU when there is none)."""
    return next((a.device for a in inputs if isinstance(a, xp.Tensor)), None)


def erf(x):
    """The error function elementwise."""
    return xp.special.erf(as_float(x))


def reduce(kind, x, axis):
    """A reduction or normaliser over axes, stable by construction (torch's logsumexp is max-shifted)."""
    if kind == "max":
        return xp.amax(x, dim=axis)
    if kind == "min":
        return xp.amin(x, dim=axis)
    if kind == "mean":
        return as_float(x).mean(dim=axis)
    if kind in ("argmax", "argmin"):
        extreme = xp.amax(x, dim=axis, keepdim=True) if kind == "argmax" else xp.amin(x, dim=axis, keepdim=True)
        hits = (x == extreme).to(x.dtype) if x.dtype.is_floating_point else as_float(x == extreme)
        return hits / hits.sum(dim=axis, keepdim=True)
    x = as_float(x)
    if x.numel() == 0:
        shift = xp.zeros_like(x.sum(dim=axis, keepdim=True))
    else:  # as numpy does: shifted by the finite maximum (torch's logsumexp rounds exp(x - lse) at 1e17)
        shift = xp.amax(x, dim=axis, keepdim=True).detach()
        shift = xp.where(xp.isfinite(shift), shift, xp.zeros_like(shift))
    shifted = x - shift
    e = xp.exp(shifted)
    total = e.sum(dim=axis, keepdim=True)
    if kind == "softmax":
        return e / total
    if kind == "log_softmax":
        return shifted - xp.log(total)
    return (xp.log(total) + shift).reshape([n for k, n in enumerate(x.shape) if k not in axis])


def linalg(kind, x, axes, name=None):
    """inv, det, logdet (log|det|), sign_det or adj (det inv, also of a singular matrix) of the matrices on ``axes``
    (rows, columns) of ``x``, batched over the rest; "symmetric"/"spd": ``x`` itself once checked (a ValueError
    names the matrix otherwise); "spd_*": by Cholesky. A singular matrix to invert is a ValueError too."""
    kind = "spd_factor" if kind == "spd_factor_in_place" else kind  # (numpy's in-place factorisation)
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {name!r}" if name else "a matrix"
    not_positive = f"{called} is declared spd but is not positive definite"
    if kind in ("symmetric", "spd", "spd_by_factor", "hermitian"):
        checks, kind = kind, "spd" if kind == "spd_by_factor" else kind
        if x.shape[axes[0]] != x.shape[axes[1]]:
            raise error(f"{called} is declared {kind} but is not square: its shape is {tuple(x.shape)}")
        scale = float(x.abs().max()) if x.numel() else 0.0
        tolerance = max(1e-10, 100 * xp.finfo(x.dtype).eps) if x.is_floating_point() or x.is_complex() else 1e-10
        # a complex spd or hermitian matrix equals its conjugate transpose (LANGUAGE.md 9.2)
        transposed = x.transpose(-1, -2).conj() if kind != "symmetric" and x.is_complex() else x.transpose(-1, -2)
        if x.numel() and not float((x - transposed).abs().max()) <= tolerance * scale:
            shape = "Hermitian" if kind == "hermitian" or x.is_complex() else "symmetric"
            raise error(f"{called} is declared {kind} but is not {shape}")
        info = xp.linalg.cholesky_ex(as_float(x)).info if checks == "spd" else None
        if info is not None and info.numel() and int(info.max()) != 0:
            raise error(not_positive)
        return x
    x = xp.movedim(as_float(x), axes, (-2, -1))
    if kind.startswith("cho_"):  # x is a lower Cholesky factor
        if kind == "cho_inv":
            return xp.movedim(xp.cholesky_inverse(x), (-2, -1), axes)
        logdet = 2 * xp.log(xp.diagonal(x, dim1=-2, dim2=-1).abs()).sum(dim=-1)
        return logdet if kind == "cho_logdet" else xp.exp(logdet)
    if kind.startswith("spd_"):
        factor, info = xp.linalg.cholesky_ex(x)
        if info.numel() and int(info.max()) != 0:
            raise error(not_positive)
        if kind == "spd_factor":
            return xp.movedim(factor, (-2, -1), axes)
        logdet = 2 * xp.log(xp.diagonal(factor, dim1=-2, dim2=-1).abs()).sum(dim=-1)
        if kind == "spd_logdet":
            return logdet
        if kind == "spd_det":
            return xp.exp(logdet)
        kind = "inv"
    if kind == "inv":
        inverse, info = xp.linalg.inv_ex(x)
        if info.numel() and int(info.max()) != 0:
            raise error(f"{called} is singular (a zero pivot in its LU factorisation): it has no inverse")
        return xp.movedim(inverse, (-2, -1), axes)
    if kind == "adj":  # det(x) inv(x) by LU where every matrix is invertible, else by SVD (singular ones too)
        if x.shape[-1] == 0:
            return xp.movedim(x, (-2, -1), axes)
        # det and inverse from one LU factorisation, so that their rounding cancels near a singular matrix
        factors, pivots, info = xp.linalg.lu_factor_ex(x)
        swaps = (pivots != xp.arange(1, x.shape[-1] + 1, device=pivots.device)).sum(-1) % 2
        determinant = (1 - 2 * swaps).to(x.dtype) * xp.diagonal(factors, dim1=-2, dim2=-1).prod(-1)
        eye = xp.eye(x.shape[-1], dtype=x.dtype, device=x.device).expand(x.shape)
        adjugate = determinant[..., None, None] * xp.linalg.lu_solve(factors, pivots, eye)
        if (info.numel() and int(info.max()) != 0) or not bool(xp.isfinite(adjugate).all()):
            u, s, vh = xp.linalg.svd(x)  # x = U S V^H: adj(x) = det(U) det(V^H) V diag(prod_(j != i) s_j) U^H
            ones = xp.ones_like(s[..., :1])
            before = xp.cumprod(xp.cat([ones, s[..., :-1]], dim=-1), dim=-1)
            after = xp.flip(xp.cumprod(xp.cat([ones, xp.flip(s[..., 1:], (-1,))], dim=-1), dim=-1), (-1,))
            phase = xp.linalg.det(u) * xp.linalg.det(vh)
            adjugate = phase[..., None, None] * ((vh.mH * (before * after)[..., None, :].to(vh.dtype)) @ u.mH)
        return xp.movedim(adjugate, (-2, -1), axes)
    if kind == "det":
        return xp.linalg.det(x)
    sign, logdet = xp.linalg.slogdet(x)
    if kind == "sign_det":
        sign = sign + 0  # (a singular matrix's sign is 0, not -0)
        nan = xp.full_like(sign, float("nan"))
        return xp.where(x.isnan().flatten(-2).any(-1), nan, sign) if x.numel() else sign
    return logdet


def solve(kind, M, axes, B, axis, transposed, name=None, batch=()):
    """inv(M) B over M's columns (``transposed``: B^T inv(M), over its rows), without forming the inverse;
    ``batch``: (M's axis, B's axis) pairs solved matrix by matrix (first in the result; B's axis None: B is the
    same for every matrix, broadcast). A singular matrix is a ValueError naming it."""
    error = globals().get("MatrixError", ValueError)  # einflow's, where the plan runs; ValueError exported
    called = f"matrix {name!r}" if name else "a matrix"
    k = len(batch)
    flip = transposed and kind == "cho_solve"  # a factor keeps its orientation: conj(inv(M) conj(B)) (Hermitian M)
    M = xp.movedim(as_float(M), [m for m, _ in batch] + list((axes[1], axes[0]) if transposed and not flip
                                                             else axes), list(range(k + 2)))
    present = [b for _, b in batch if b is not None]
    B = xp.movedim(as_float(B), present + [axis], list(range(len(present) + 1)))
    for position, (_, b) in enumerate(batch):  # a right-hand side without a batch index: the same for each
        if b is None:
            B = B.unsqueeze(position)
    B = B.expand(tuple(M.shape[:k]) + tuple(B.shape[k:]))
    columns = 1
    for size in B.shape[k + 1:]:
        columns *= size
    if 0 in M.shape:  # no equations (or no matrices): numpy's empty answer
        return xp.zeros(B.shape, dtype=xp.promote_types(M.dtype, B.dtype), device=B.device)
    flat = B.reshape(tuple(B.shape[:k + 1]) + (columns,))
    if M.dtype != flat.dtype:  # torch solves in one dtype (a complex matrix, a real right side)
        common = xp.promote_types(M.dtype, flat.dtype)
        M, flat = M.to(common), flat.to(common)
    if kind == "cho_solve":  # M is the lower Cholesky factor of an spd matrix (an "spd_factor" step's value)
        if flip and M.is_complex():
            return xp.cholesky_solve(flat.conj(), M).conj().reshape(B.shape)
        return xp.cholesky_solve(flat, M).reshape(B.shape)
    if kind == "spd_solve":
        factor, info = xp.linalg.cholesky_ex(M)
        if info.numel() and int(info.max()) != 0:
            raise error(f"{called} is declared spd but is not positive definite")
        return xp.cholesky_solve(flat, factor).reshape(B.shape)
    solved, info = xp.linalg.solve_ex(M, flat)
    if info.numel() and int(info.max()) != 0:
        raise error(f"{called} is singular (a zero pivot in its LU factorisation): the system has no unique "
                    "solution")
    return solved.reshape(B.shape)


def conj(x):
    """The complex conjugate (a copy for real x: a later in-place step must never write into an input)."""
    return x.conj_physical() if x.is_complex() else x.clone()


def real(x):
    """The real part, as a new tensor (torch's real is a view of x, or x itself)."""
    return (x.real if x.is_complex() else x).clone()


def imag(x):
    """The imaginary part (zeros for real x: torch has no imag of a real tensor)."""
    return x.imag.clone() if x.is_complex() else xp.zeros_like(x)


def abs2(x):
    """|x|^2: re^2 + im^2 for complex x (no square root), x * x otherwise."""
    if x.is_complex():
        return x.real * x.real + x.imag * x.imag
    return x * x


# ------------------------------------------------------------------ shifted, strided and gathered reads
# (exported source: ``einflow.export.windows``; the engine's kernels, with every range known, are
# ``einflow.engine.affine``'s)


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
                value = value + coefficient * xp.arange(shape[label], device=device).reshape(view)
        else:
            values, axes = gathers[position[1]], position[2]
            if values.numel() and (values.min() < 0 or values.max() >= padded[axis]):
                raise IndexError(f"a gather reads a position outside its axis of length {padded[axis]}")
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = shape[a]
            value = values.permute(order).reshape(view)
        flat = flat + value * strides[axis]
    return flat


def window(array, shape, positions, *gathers, mode="zeros"):
    """A shifted, strided or gathered read: ``as_strided`` (padded first where the reads leave the array: zeros,
    or the array folded by ``mode``) where every stride is non-negative, else one take at flat positions."""
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
        array = xp.nn.functional.pad(array, [w for pair in reversed(pads) for w in pair])
    for axis, (before, after) in enumerate(pads if mode != "zeros" else ()):
        if before or after:
            length = array.shape[axis]
            folded = xp.arange(-before, length + after, device=array.device)
            array = array.index_select(axis, fold(folded, length, mode))
    strides, offset = [0] * len(shape), array.storage_offset()
    if not gathers:
        for axis, (_, terms, start) in enumerate(planned):
            offset += start * array.stride(axis)
            for label, coefficient in terms:
                strides[label] += coefficient * array.stride(axis)
    if not gathers and all(stride >= 0 for stride in strides) and all(shape):
        return array.as_strided(shape, strides, offset)
    gathers = tuple(gather.long() for gather in gathers)
    return array.reshape(-1)[flat(tuple(array.shape), shape, planned, gathers, array.device)]


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
        return xp.arange(value.shape[axis], device=value.device).reshape(view)

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
            values, axes = gathers[position[1]].long(), position[2]
            order = sorted(range(len(axes)), key=lambda a: axes[a])
            view = [1] * rank
            for a in axes:
                view[a] = value.shape[a]
            place = values.permute(order).reshape(view)
        flat = flat + place * strides[axis]
    total, weights = 1, value.reshape(-1)
    for length in shape:
        total *= length
    flat = xp.broadcast_to(xp.asarray(flat, device=value.device), value.shape).reshape(-1)
    keep = None if inside is None else xp.broadcast_to(xp.asarray(inside, device=value.device), value.shape).reshape(-1)
    if keep is not None:
        flat, weights = flat[keep], weights[keep]
    out = xp.zeros(total, dtype=value.dtype, device=value.device)
    return out.index_add_(0, flat, weights).reshape(shape)
