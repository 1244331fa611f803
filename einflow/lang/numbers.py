"""Folding Python numbers the way the language says: weak like Python scalars, never raising."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["_weak", "_is_unit", "_fold_power", "exact_add", "exact_mul"]


def _weak(value: int | float) -> int | float:
    """A folded constant stays a Python number; an int beyond int64 becomes a float (inf beyond float range)."""
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


def exact_add(a: int | float, b: int | float) -> int | float:
    """``a + b`` while folding: integers stay exact (``_weak`` applies when the constant is used)."""
    try:
        return a + b
    except OverflowError:  # an int too large for a float met a float
        return _weak(a) + _weak(b)


def exact_mul(a: int | float, b: int | float) -> int | float:
    """``a * b`` while folding: integers stay exact (``_weak`` applies when the constant is used)."""
    try:
        return a * b
    except OverflowError:
        with np.errstate(all="ignore"):
            return float(np.float64(_weak(a)) * np.float64(_weak(b)))


def _is_unit(coefficient: int | float) -> bool:
    """Multiplying by this changes nothing, dtype included (a float 1.0 still promotes integer arrays)."""
    return isinstance(coefficient, int) and coefficient == 1


def _fold_power(base: int | float, exponent: int | float) -> int | float:
    """``base ** exponent`` on Python numbers without raising: ints stay ints while they fit int64."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        if abs(base) <= 1 or exponent * math.log2(abs(base)) < 64:
            return _weak(base**exponent)
    with np.errstate(all="ignore"):
        return float(np.power(np.float64(_weak(base)), float(exponent)))
