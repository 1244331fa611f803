"""The functions opt_einsum calls for contractions on torch tensors, with numpy's type promotion.

The generated torch code calls ``matmul`` and ``einsum`` from here for each pairwise step of a
contraction (:func:`einflow.engine.kernels.contraction_text` with ``dialect=TORCH``);
``opt_einsum.contract_expression(...)(*tensors, backend="einflow.engine.backends.torch_ops")`` calls
``tensordot``, ``transpose`` and ``einsum``. torch's own kernels refuse operands of different dtypes
(a boolean delta's ones vector times a float tensor); here the operands are first brought to their
common type (operands of one floating type go straight to torch).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["tensordot", "transpose", "einsum", "matmul"]


def _common(*operands: Any) -> list[Any]:
    dtype = operands[0].dtype
    for operand in operands[1:]:
        if operand.dtype != dtype:
            dtype = torch.promote_types(dtype, operand.dtype)
    if dtype == torch.bool:
        dtype = torch.int64
    return [operand if operand.dtype == dtype else operand.to(dtype) for operand in operands]


def matmul(a: Any, b: Any) -> Any:
    """``torch.matmul`` (numpy.dot of 2-D and 1-D operands), after bringing both to their common type."""
    if a.dtype == b.dtype and a.dtype.is_floating_point:
        return torch.matmul(a, b)
    a, b = _common(a, b)
    return torch.matmul(a, b)


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    a, b = _common(a, b)
    return torch.tensordot(a, b, dims=axes)


def transpose(a: Any, axes: Any) -> Any:
    return a.permute(*axes)


def einsum(equation: str, *operands: Any) -> Any:
    return torch.einsum(equation, *_common(*operands))
