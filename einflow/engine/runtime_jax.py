"""The operations jax.numpy spells its own way (``JAX.runtime``): each replaces ``einflow.engine.runtime_numpy``'s.

jax arrays are immutable: writes are ``.at[...].set`` (the diagonal's indices are unique, which also lets jax
transpose the write: reverse mode through a JVP program with a surviving delta) and ``.at[...].add``; there are
no strided views; a factorisation that fails gives nan or inf instead of an error, so the checks ask for them
(``flagged``: not while tracing, where there are no values).
"""

from __future__ import annotations

import jax.numpy as xp

from einflow.engine.runtime import as_float, flagged, svd_adjugate

__all__ = ["erf", "written", "added_at", "strided_view", "outside", "cholesky_lower", "cholesky_solved",
           "lu_inverted", "lu_solved", "adjugate"]


def erf(x):
    """The error function elementwise (jax's own, traceable and differentiable)."""
    from jax.scipy.special import erf
    return erf(as_float(x))


def written(out, index, value):
    """out with ``value`` written at ``index`` (positions that are unique), as a new array."""
    return out.at[index].set(value, unique_indices=True)


def added_at(total, flat, weights, keep=None):
    """A zeroed flat array of ``total`` elements with each of ``weights`` added at its position in ``flat``
    (``keep``: which to add, None: all; the others sent past the end, where they are dropped)."""
    if keep is not None:
        flat = xp.where(keep, flat, total)
    return xp.zeros(total, dtype=weights.dtype).at[flat].add(weights, mode="drop")


def strided_view(array, shape, planned):
    """None: jax has no strided views (the read is one take)."""
    return None


def outside(values, length):
    """False: traced positions cannot be checked (jax clamps those outside)."""
    return False


def cholesky_lower(x, overwrite=False):
    """The lower Cholesky factors; None where one is not positive definite (jax's factor holds nan there)."""
    factor = xp.linalg.cholesky(x)
    return None if flagged(~xp.isfinite(factor) & xp.isfinite(x).all(axis=(-2, -1), keepdims=True)) else factor


def cholesky_solved(factor, b):
    """inv(L L^H) b for the lower Cholesky factors L on the last two axes of ``factor``."""
    if factor.ndim == 2:
        from jax.scipy.linalg import cho_solve
        return cho_solve((factor, True), b)
    return xp.linalg.solve(xp.conj(xp.swapaxes(factor, -1, -2)), xp.linalg.solve(factor, b))


def lu_inverted(x):
    """The inverses by LU; None where a matrix is singular (numpy's rule: an exact zero pivot)."""
    import jax

    if x.shape[-1] and flagged(xp.diagonal(jax.lax.linalg.lu(x)[0], 0, -2, -1) == 0):
        return None
    return xp.linalg.inv(x)


def lu_solved(M, b):
    """inv(M) b by LU; None where a matrix is singular (numpy's rule: an exact zero pivot)."""
    import jax

    if flagged(xp.diagonal(jax.lax.linalg.lu(M)[0], 0, -2, -1) == 0):
        return None
    return xp.linalg.solve(M, b)


def adjugate(x):
    """det(x) inv(x) by SVD (defined for every matrix: one jit-able form)."""
    return svd_adjugate(x)
