"""The functions opt_einsum calls for contractions on torch tensors, with numpy's type promotion.

``opt_einsum.contract_expression(...)(*tensors, backend="einflow.backends.torch_ops")`` imports this
module and calls ``tensordot``, ``transpose`` and ``einsum`` from it. torch's own kernels refuse
operands of different dtypes (a boolean delta's ones vector times a float tensor); here both
operands are first brought to their common type.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["tensordot", "transpose", "einsum"]


def _common(*operands: Any) -> list[Any]:
    dtype = operands[0].dtype
    for operand in operands[1:]:
        if operand.dtype != dtype:
            dtype = torch.promote_types(dtype, operand.dtype)
    if dtype == torch.bool:
        dtype = torch.int64
    return [operand if operand.dtype == dtype else operand.to(dtype) for operand in operands]


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    a, b = _common(a, b)
    return torch.tensordot(a, b, dims=axes)


def transpose(a: Any, axes: Any) -> Any:
    return a.permute(*axes)


def einsum(equation: str, *operands: Any) -> Any:
    return torch.einsum(equation, *_common(*operands))
