"""The operations PyTorch spells its own way (``TORCH.runtime``): each replaces ``einflow.engine.runtime_numpy``'s
(or an elementwise helper of ``einflow.engine.runtime``).

torch tensors have no ``kind`` on their dtypes and no ``astype``; new tensors go on a device; gather positions
index as int64; ``torch.maximum`` takes two tensors; the factorisations report failures in an ``info`` tensor
(``*_ex``). As in ``einflow.engine.runtime``, the global ``xp`` is the array module (torch) and helpers call
each other by name.
"""

from __future__ import annotations

import opt_einsum as oe
import torch as xp

from einflow.engine.runtime import svd_adjugate

__all__ = ["input", "as_float", "sigmoid", "step", "conj", "real", "imag", "abs2", "sign",
           "as_input_float", "erf", "contract", "device", "dtype_kind", "astype", "arange_on", "zeros_on",
           "asarray_on", "as_index", "permuted", "added_at", "zero_padded", "taken", "strided_view", "extreme",
           "constant", "true_divide", "cholesky_lower", "cholesky_solved", "cholesky_inverted", "lu_inverted",
           "lu_solved", "adjugate"]

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


# ------------------------------------------------------------------ the operations of runtime_numpy's table


def dtype_kind(x):
    """numpy's kind of x's type: "b", "i", "u", "f" or "c" (Python numbers too)."""
    if not isinstance(x, xp.Tensor):
        return "b" if isinstance(x, bool) else "i" if isinstance(x, int) else "c" if isinstance(x, complex) else "f"
    if x.dtype == xp.bool:
        return "b"
    return "c" if x.is_complex() else "f" if x.is_floating_point() else "i" if x.dtype.is_signed else "u"


def astype(x, dtype):
    """x converted to ``dtype`` (a numpy type name, or a torch dtype)."""
    return x.to(getattr(xp, dtype) if isinstance(dtype, str) else dtype)


def arange_on(n, like=None):
    """0, 1, ..., n - 1 on the device of ``like``."""
    return xp.arange(n, device=getattr(like, "device", None))


def zeros_on(shape, dtype, like=None):
    """Zeros of ``shape`` and ``dtype`` on the device of ``like``."""
    return xp.zeros(shape, dtype=dtype, device=getattr(like, "device", None))


def asarray_on(x, like=None):
    """x (a tensor or a number) as a tensor on the device of ``like``."""
    return xp.asarray(x, device=getattr(like, "device", None))


def as_index(values):
    """A gather's positions as torch indexes by them (int64)."""
    return values.long()


def permuted(x, order):
    """x with its axes in ``order``."""
    return x.permute(order)


def added_at(total, flat, weights, keep=None):
    """A zeroed flat tensor of ``total`` elements with each of ``weights`` added at its position in ``flat``
    (positions repeat; ``keep``: which to add, None: all)."""
    if keep is not None:
        flat, weights = flat[keep], weights[keep]
    return xp.zeros(total, dtype=weights.dtype, device=weights.device).index_add_(0, flat, weights)


def zero_padded(array, pads):
    """array padded with zeros by ``pads``, (before, after) per axis."""
    return xp.nn.functional.pad(array, [width for pair in reversed(pads) for width in pair])


def taken(array, positions, axis):
    """The elements of ``array`` at ``positions`` along ``axis``."""
    return array.index_select(axis, positions)


def strided_view(array, shape, planned):
    """A read of affine positions as ``as_strided`` of ``array``; None where a stride is negative (torch has
    none)."""
    strides, offset = [0] * len(shape), array.storage_offset()
    for axis, (_, terms, start) in enumerate(planned):
        offset += start * array.stride(axis)
        for label, coefficient in terms:
            strides[label] += coefficient * array.stride(axis)
    return array.as_strided(shape, strides, offset) if all(stride >= 0 for stride in strides) else None


def extreme(which, x, axis, keepdims=False):
    """The largest (``which`` "max") or smallest ("min") elements over ``axis``."""
    return (xp.amax if which == "max" else xp.amin)(x, dim=axis, keepdim=keepdims)


def constant(x):
    """x out of autograd's graph."""
    return x.detach()


def true_divide(a, b):
    """a / b as numpy divides: integers as float64 (torch divides them in float32)."""
    return as_float(a) / as_float(b)


def cholesky_lower(x, overwrite=False):
    """The lower Cholesky factors; None where one is not positive definite."""
    factor, info = xp.linalg.cholesky_ex(x)
    return None if info.numel() and int(info.max()) != 0 else factor


def cholesky_solved(factor, b):
    """inv(L L^H) b for the lower Cholesky factors L on the last two axes of ``factor``."""
    return xp.cholesky_solve(b, factor)


def cholesky_inverted(factor):
    """inv(L L^H) for the lower Cholesky factors L on the last two axes of ``factor``."""
    return xp.cholesky_inverse(factor)


def lu_inverted(x):
    """The inverses by LU; None where a matrix is singular."""
    inverse, info = xp.linalg.inv_ex(x)
    return None if info.numel() and int(info.max()) != 0 else inverse


def lu_solved(M, b):
    """inv(M) b by LU; None where a matrix is singular."""
    solved, info = xp.linalg.solve_ex(M, b)
    return None if info.numel() and int(info.max()) != 0 else solved


def adjugate(x):
    """det(x) inv(x): det and inverse from one LU factorisation (so that their rounding cancels near a singular
    matrix), by SVD where a matrix is singular."""
    factors, pivots, info = xp.linalg.lu_factor_ex(x)
    swaps = (pivots != xp.arange(1, x.shape[-1] + 1, device=pivots.device)).sum(-1) % 2
    determinant = (1 - 2 * swaps).to(x.dtype) * xp.diagonal(factors, dim1=-2, dim2=-1).prod(-1)
    eye = xp.eye(x.shape[-1], dtype=x.dtype, device=x.device).expand(x.shape)
    found = determinant[..., None, None] * xp.linalg.lu_solve(factors, pivots, eye)
    if (info.numel() and int(info.max()) != 0) or not bool(xp.isfinite(found).all()):
        found = svd_adjugate(x)
    return found
