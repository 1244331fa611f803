"""What a session answers with: the Reply record, SessionError, and how names are checked and values shown.

A leaf module: ``einflow.shell.session`` (the session) and ``einflow.shell.commands`` (its ``:commands``) both build on
it, so neither needs to import the other's internals.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from einflow.lang import ir
from einflow.lang.errors import EinflowError, TensorNameError

__all__ = ["Reply", "SessionError", "check_name", "to_numpy", "format_value", "parse_bytes", "NAME",
           "SUMMARY_THRESHOLD"]

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SUMMARY_THRESHOLD = 200  # arrays with more elements are printed summarized


class SessionError(EinflowError):
    """A session command was used wrongly (bad arguments, unknown command, unreadable file)."""


@dataclass(frozen=True)
class Reply:
    """What one line produced: text to print, whether it succeeded, whether the session should end.

    ``error`` is the exception behind a failed line (its position, when it has one, is data there).
    """

    text: str = ""
    ok: bool = True
    quit: bool = False
    error: BaseException | None = field(default=None, compare=False, repr=False)


def check_name(name: str) -> str:
    """Raise TensorNameError unless ``name`` can name a tensor.

    >>> check_name("W1")
    'W1'
    """
    if not NAME.match(name):
        raise TensorNameError(f"{name!r} is not a valid tensor name (letters, digits, '_'; not starting with a digit)")
    if name in ir.RESERVED:
        raise TensorNameError(f"{name!r} is a reserved word and cannot name a tensor")
    return name


def to_numpy(value: Any) -> np.ndarray:
    """A host numpy array for printing or saving (computes dask arrays, copies cupy arrays)."""
    if hasattr(value, "get") and type(value).__module__.startswith("cupy"):
        value = value.get()
    return np.asarray(value)


def format_value(name: str | None, value: Any, width: int | None = None) -> str:
    """A ``name: shape dtype`` header, then the value in numpy's printing (large arrays summarized).

    >>> print(format_value("y", np.array([1.0, 2.0])))
    y: (2,) float64
    [1. 2.]
    """
    array = to_numpy(value)
    header = f"{array.shape} {array.dtype}"
    if name:
        header = f"{name}: {header}"
    width = width or shutil.get_terminal_size((100, 24)).columns
    if array.ndim == 0:
        body = str(array[()])
    else:
        body = np.array2string(array, max_line_width=max(width, 40), threshold=SUMMARY_THRESHOLD, edgeitems=3)
    return f"{header}\n{body}"


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}




def parse_bytes(text: str) -> int:
    """A size such as ``2GiB``, ``500 MB``, ``1.5e9`` or ``4096`` in bytes (GB = 1000**3, GiB = 1024**3).

    >>> parse_bytes("2GiB"), parse_bytes("500 MB"), parse_bytes("4096")
    (2147483648, 500000000, 4096)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise SessionError(f"cannot read {text!r} as a size: write it like 2GiB, 500MB, 1.5e9 or 4096 (bytes)")
    value = float(match.group(1)) * _UNITS[unit]
    if not value > 0 or value != value or value == float("inf"):
        raise SessionError(f"a memory limit must be a positive size, got {text!r}")
    return int(value)
