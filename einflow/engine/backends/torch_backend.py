"""The PyTorch backend: tensors in, tensors out, on the inputs' device and in their dtype.

The generated executor is written for torch (``codegen`` target ``"torch"``): elementwise work calls
torch functions, contractions go through opt_einsum's plan with :mod:`einflow.engine.backends.torch_ops`
(torch.tensordot/einsum, promoting mixed dtypes as numpy does). Calling a program on tensors that
require grad records one node in the autograd graph (:mod:`einflow.frameworks.torch_autograd`).
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

from einflow.engine.backends.base import Backend, numpy_input
from einflow.engine.dialect import TORCH
from einflow.engine.precision import numpy_low
from einflow.lang.errors import BackendError

__all__ = ["TorchBackend", "numpy_dtype"]

_TO_NUMPY = {
    torch.bool: numpy.dtype(bool), torch.uint8: numpy.dtype("uint8"), torch.int8: numpy.dtype("int8"),
    torch.int16: numpy.dtype("int16"), torch.int32: numpy.dtype("int32"), torch.int64: numpy.dtype("int64"),
    torch.float16: numpy.dtype("float16"), torch.float32: numpy.dtype("float32"),
    torch.float64: numpy.dtype("float64"), torch.complex64: numpy.dtype("complex64"),
    torch.complex128: numpy.dtype("complex128"),
    # (unsigned types past uint8: numpy's sum of uint8 is uint64, and results come in numpy's type)
    **{getattr(torch, name): numpy.dtype(name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)},
}
_BFLOAT16 = numpy_low("bfloat16")  # ml_dtypes' numpy bfloat16 (it comes with jax)
if _BFLOAT16 is not None:
    _TO_NUMPY[torch.bfloat16] = _BFLOAT16


def numpy_dtype(dtype: Any) -> numpy.dtype:
    """The numpy dtype the planner reasons with for a torch dtype (BackendError for one numpy lacks).

    >>> numpy_dtype(torch.float32)
    dtype('float32')
    """
    found = _TO_NUMPY.get(dtype)
    if found is None:
        raise BackendError(f"backend 'torch' cannot compute with dtype {dtype} (einflow plans in numpy's types: "
                           "bool, int, bfloat16 (with ml_dtypes installed), float16/32/64, complex); cast the "
                           "input, e.g. x.float()")
    return found


class TorchBackend(Backend):
    """Arrays are ``torch.Tensor``; numpy arrays and Python lists are moved onto the tensors' device.

    >>> import torch
    >>> TorchBackend().asarray(torch.tensor([True, False])).dtype
    torch.int64
    """

    name = "torch"
    pairwise_kernels = True
    native_convolution = True
    dialect = TORCH
    einsum_backend = "einflow.engine.backends.torch_ops"
    strided_writes = False

    @property
    def xp(self) -> Any:
        return torch

    def asarray(self, value: Any, chunks: Any = None, device: Any = None) -> Any:
        if isinstance(value, torch.Tensor):
            return self.numbers(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        array = numpy_input(value, "torch", "torch tensors")
        return self.numbers(torch.as_tensor(array, device=device))

    def numbers(self, array: Any) -> Any:
        return array.long() if array.dtype == torch.bool else array

    def function(self, name: str) -> Any:  # pragma: no cover - the generated code calls torch directly
        raise BackendError("the torch backend runs generated code only")
