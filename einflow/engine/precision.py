"""Low-precision floats (float16, bfloat16): computed in float32, each result rounded once to the input's type.

torch and jax keep a bfloat16 or float16 array in its type but accumulate its contractions and reductions in
float32; einflow does the same on every backend, more simply: a low-precision input is widened to float32 on
its own library (``x.float()`` on torch, ``x.astype(float32)`` elsewhere, so autograd and jax tracing see the
cast), the program runs in float32, and each result that float32 inputs make float32 is rounded to the low
type. Which results are rounded follows numpy's rule for the input types (ml_dtypes' rule for bfloat16:
bfloat16 promotes as float16 does; booleans count as int64, as programs count them): float16 inputs, or
float16 with int8/uint8 inputs, give float16; float16 beside float32, int16 or bfloat16 gives float32, so
nothing is rounded.

>>> import numpy as np
>>> widened, low = widen([np.ones(3, np.float16), 2.0])
>>> widened[0].dtype, low
(dtype('float32'), 'float16')
>>> narrow(np.ones(2, np.float32), low).dtype
dtype('float16')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LOW_NAMES", "low_name", "is_low", "widen", "narrow", "result_low", "numpy_low"]

#: the low-precision float types, by name (numpy and torch spell them alike; bfloat16 is ml_dtypes' in numpy)
LOW_NAMES = ("float16", "bfloat16")


def low_name(dtype: Any) -> str | None:
    """``'float16'`` or ``'bfloat16'`` for a numpy, ml_dtypes, jax or torch dtype of that type, else None.

    >>> low_name(np.dtype(np.float16)), low_name(np.dtype(np.float32))
    ('float16', None)
    """
    if dtype is None or isinstance(dtype, type) and not issubclass(dtype, np.generic):
        return None
    name = str(dtype).removeprefix("torch.")
    if name in LOW_NAMES:
        return name
    try:
        name = np.dtype(dtype).name
    except TypeError:
        return None
    return name if name in LOW_NAMES else None


def is_low(dtype: Any) -> bool:
    """Whether ``dtype`` is float16 or bfloat16 (any library's)."""
    return getattr(dtype, "itemsize", None) == 2 and low_name(dtype) is not None


def numpy_low(name: str) -> np.dtype | None:
    """numpy's dtype for a low type's name (bfloat16 needs ml_dtypes, which jax brings; None without it)."""
    if name == "float16":
        return np.dtype(np.float16)
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes comes with jax
        return None
    return np.dtype(ml_dtypes.bfloat16)


def result_low(dtypes: Sequence[Any]) -> str | None:
    """The low type numpy's rule gives the whole call (None when the arrays' common type is wider).

    bfloat16 promotes as float16 does (ml_dtypes' rule), and the two together give float32.

    >>> result_low([np.dtype(np.float16), np.dtype(np.int8)]), result_low([np.dtype(np.float16), np.int16])
    ('float16', None)
    """
    lows = {low_name(dtype) for dtype in dtypes} - {None}
    if not lows or len(lows) > 1:
        return None
    stand_ins: list[np.dtype[Any]] = []
    for dtype in dtypes:
        if low_name(dtype) is not None:
            stand_ins.append(np.dtype(np.float16))
        elif type(dtype).__module__.startswith("torch"):
            if dtype.is_floating_point or dtype.is_complex:
                return None
            stand_ins.append(np.dtype("int64" if str(dtype) == "torch.bool" else str(dtype).removeprefix("torch.")))
        else:
            try:
                stand_ins.append(np.dtype(dtype))
            except TypeError:
                return None
        if stand_ins[-1] == np.bool_:  # programs count booleans as int64 0 and 1
            stand_ins[-1] = np.dtype(np.int64)
    return lows.pop() if np.result_type(*stand_ins) == np.float16 else None


def _float32_of(value: Any) -> Any:
    module = type(value).__module__
    if module.startswith("torch"):
        return value.float()
    if module.startswith(("jax", "jaxlib")):
        import jax.numpy as jnp

        return value.astype(jnp.float32)
    return value.astype(np.float32)


def widen(values: Sequence[Any]) -> tuple[list[Any], str | None]:
    """``(values with each float16/bfloat16 array as float32, the low type of the results or None)``.

    Values of other types pass unchanged; the low type is None when no input is low or numpy's rule makes the
    call wider than the low type (then the float32 results are what numpy's rule gives).
    """
    dtypes = [getattr(value, "dtype", None) for value in values]
    if not any(is_low(dtype) for dtype in dtypes):
        return list(values), None
    low = result_low([dtype for dtype in dtypes if dtype is not None])
    return [_float32_of(value) if is_low(dtype) else value for value, dtype in zip(values, dtypes)], low


def narrow(result: Any, low: str) -> Any:
    """Each float32 array of ``result`` (one array or a tuple) rounded to ``low`` on its own library."""
    if type(result) is tuple:
        return tuple(narrow(value, low) for value in result)
    dtype = getattr(result, "dtype", None)
    if dtype is None or str(dtype).removeprefix("torch.") != "float32":
        return result
    module = type(result).__module__
    if module.startswith("torch"):
        import torch

        return result.to(getattr(torch, low))
    if module.startswith(("jax", "jaxlib")):
        import jax.numpy as jnp

        return result.astype(jnp.dtype(low))
    target = numpy_low(low)
    return result if target is None else result.astype(target)
