"""Sparse arrays as einflow reads them (LANGUAGE.md §9.3): which library's array a value is, its coordinates and
values (duplicates summed), results put back as that library's array, and SpMM by scipy's compressed-row kernel.

Libraries are imported only when a sparse input arrives (a value's type module is read without importing it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from einflow.lang.errors import SparseError

__all__ = ["sparse_kind", "is_sparse", "SparseArray", "to_coo", "values_of", "wrap", "SUPPORTED", "SpMM", "spmm",
           "same_coords"]

#: what a message about an unsupported sparse input says is supported
SUPPORTED = ("scipy.sparse arrays and matrices (every format, 2-D) and pydata sparse.COO (n-D) on the numpy "
             "backend, torch sparse COO and CSR tensors on the torch backend")


def sparse_kind(value: Any) -> str | None:
    """``"scipy"``, ``"pydata"``, ``"torch"``, ``"jax"`` for a sparse array of that library, else None (no import).

    >>> sparse_kind(np.ones(2)) is None
    True
    """
    kind = type(value)
    module = kind.__module__
    if module.startswith("numpy") or module == "builtins":
        return None
    if module.startswith("scipy.sparse"):
        return "scipy"
    if module == "sparse" or module.startswith("sparse."):
        return "pydata"
    if module.startswith("torch"):
        layout = str(getattr(value, "layout", "torch.strided"))
        return None if layout == "torch.strided" else "torch"
    if module.startswith("jax.experimental.sparse"):
        return "jax"
    return None


def is_sparse(value: Any) -> bool:
    """Whether ``value`` is a sparse array of a library einflow knows (scipy, pydata sparse, torch, jax)."""
    return sparse_kind(value) is not None


@dataclass(frozen=True, eq=False)
class SparseArray:
    """One sparse input as coordinates (int64, one vector per axis, no duplicates) and values, and the array it
    came from (a sparse result takes its kind and format)."""

    coords: tuple[Any, ...]
    values: Any
    shape: tuple[int, ...]
    like: Any

    @property
    def nnz(self) -> int:
        return int(self.values.shape[0])


def to_coo(name: str, value: Any) -> SparseArray:
    """The coordinates and values of the sparse input ``name`` (scipy.sparse of any format, pydata sparse, torch
    sparse COO/CSR).

    Duplicate coordinates are summed (the input itself is left alone); jax sparse arrays, and pydata arrays whose
    fill value is not 0, are a :class:`SparseError` naming the tensor.
    """
    kind = sparse_kind(value)
    coords: tuple[np.ndarray, ...]
    if kind == "scipy" and value.format == "csr" and value.has_canonical_format:  # rows sorted, no duplicates
        counts = np.diff(value.indptr)
        coords = (np.repeat(np.arange(value.shape[0], dtype=np.int64), counts),
                  np.asarray(value.indices, dtype=np.int64))
        values = np.asarray(value.data)
    elif kind == "scipy":
        coo = value.tocoo(copy=True)
        coo.sum_duplicates()
        coords = (np.asarray(coo.row, dtype=np.int64), np.asarray(coo.col, dtype=np.int64))
        values = np.asarray(coo.data)
    elif kind == "pydata":
        import sparse

        array = value if isinstance(value, sparse.COO) else sparse.COO(value)
        if not _is_zero(array.fill_value):
            raise SparseError(f"tensor {name!r}: a sparse array whose missing entries are {array.fill_value!r}; "
                              "einflow reads missing entries as 0 (give fill_value=0)")
        # (a pydata COO sums its duplicate coordinates when it is built, unless told it has none)
        coords = tuple(np.asarray(axis, dtype=np.int64) for axis in array.coords)
        values = np.asarray(array.data)
    elif kind == "torch":
        return _torch_coo(name, value)
    else:
        raise SparseError(f"tensor {name!r} is a {type(value).__module__}.{type(value).__name__}; einflow takes "
                          f"{SUPPORTED} (convert it, or pass it dense)")
    if values.dtype.kind not in "biufc":
        raise SparseError(f"tensor {name!r} has dtype {values.dtype}; einflow computes with numbers")
    return SparseArray(tuple(map(_owned, coords)), values, tuple(int(n) for n in value.shape), value)


def _torch_coo(name: str, value: Any) -> SparseArray:
    """A torch sparse COO or CSR tensor as coordinates and values (torch tensors on its device); the values keep
    their autograd history (``coalesce().values()``, a CSR tensor's ``values()``), so gradients reach it."""
    import torch

    if value.layout == torch.sparse_coo:
        coalesced = value.coalesce()  # duplicates summed
        indices = coalesced.indices()
        coords = tuple(indices[axis] for axis in range(indices.shape[0]))
        values = coalesced.values()
    elif value.layout == torch.sparse_csr:
        crow = value.crow_indices()
        rows = torch.repeat_interleave(torch.arange(value.shape[0], device=crow.device), crow[1:] - crow[:-1])
        coords = (rows, value.col_indices().to(torch.int64))
        values = value.values()
    else:
        raise SparseError(f"tensor {name!r} is a torch tensor of layout {value.layout}; einflow takes torch sparse "
                          "COO and CSR tensors (convert it with .to_sparse() or .to_sparse_csr(), or pass it dense)")
    if values.dim() != 1:
        raise SparseError(f"tensor {name!r} is a hybrid sparse tensor (dense axes under its entries); einflow takes "
                          "torch sparse tensors whose every axis is sparse")
    if values.dtype.is_complex or not values.dtype.is_floating_point and values.dtype not in (
            torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool):
        raise SparseError(f"tensor {name!r} has dtype {values.dtype}; einflow computes with numbers")
    return SparseArray(coords, values, tuple(int(n) for n in value.shape), value)


def same_coords(first: SparseArray, second: SparseArray) -> bool:
    """Whether two converted inputs lie on one pattern (equal coordinates, axis by axis)."""
    if first is second:
        return True
    if first.shape != second.shape or first.nnz != second.nnz:
        return False
    if sparse_kind(first.like) == "torch" or sparse_kind(second.like) == "torch":
        import torch

        return all(torch.is_tensor(a) and torch.is_tensor(b) and bool(torch.equal(a, b))
                   for a, b in zip(first.coords, second.coords))
    return all(np.array_equal(a, b) for a, b in zip(first.coords, second.coords))


def _owned(axis: np.ndarray) -> np.ndarray:
    """A coordinate vector einflow owns, read-only: its sorting order can be kept on it
    (``einflow.engine.segments``) without the caller's array changing under it."""
    if axis.base is not None or axis.flags.writeable:
        axis = np.array(axis, dtype=np.int64, copy=True)
    axis.setflags(write=False)
    return axis


def values_of(value: Any) -> np.ndarray | None:
    """The stored values of a sparse input already converted, read again (in place changes seen), when they are
    the array's own data in the converted order (pydata COO, canonical CSR); None: convert it again."""
    kind = sparse_kind(value)
    if kind == "pydata" and hasattr(value, "coords") and _is_zero(value.fill_value):
        return np.asarray(value.data)
    if kind == "scipy" and value.format == "csr" and value.has_canonical_format:
        return np.asarray(value.data)
    return None


def _is_zero(value: Any) -> bool:
    try:
        return bool(value == 0)
    except (TypeError, ValueError):
        return False


def wrap(values: Any, coords: tuple[Any, ...], shape: tuple[int, ...], like: Any) -> Any:
    """A sparse array of ``like``'s kind (scipy: its format, array or matrix; pydata: COO) on a pattern."""
    if sparse_kind(like) == "torch":
        import torch

        indices = torch.stack(coords) if coords else torch.zeros((0, values.shape[0]), dtype=torch.int64)
        result = torch.sparse_coo_tensor(indices, values, shape, is_coalesced=True)
        return result.to_sparse_csr() if like.layout == torch.sparse_csr else result
    values = np.asarray(values)
    if sparse_kind(like) == "scipy":
        import scipy.sparse as sp

        build = sp.coo_array if isinstance(like, sp.sparray) else sp.coo_matrix
        result = build((values, tuple(coords)), shape=shape)
        return result.asformat(like.format)
    import sparse

    return sparse.COO(np.stack(coords) if coords else np.zeros((0, values.shape[0]), np.int64), values,
                      shape=shape, has_duplicates=False)


@dataclass(frozen=True)
class SpMM:
    """``T[i,f] = S[i,j] D[j,f]`` with a sparse 2-D input and a dense input, computed before the program by
    scipy's compressed-row kernel into the input ``name`` (``transpose``: S's first index is the summed one;
    ``axis``: D's axis it sums)."""

    name: str
    sparse: str
    dense: str
    transpose: bool
    axis: int


def spmm(product: SpMM, sparse: Any, dense: Any) -> np.ndarray:
    """The sparse-dense matrix product ``product`` through scipy's compressed-row kernel (pydata arrays converted)."""
    matrix = sparse.tocsr()
    if product.transpose:
        matrix = matrix.T
    dense = np.moveaxis(np.asarray(dense), product.axis, 0)
    rest = dense.shape[1:]
    result = matrix @ dense.reshape(dense.shape[0], -1)
    return np.asarray(result).reshape((matrix.shape[0], *rest))
