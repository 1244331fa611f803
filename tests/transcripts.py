"""Comparing a documented transcript with what einflow prints, as doctest does, but not to the last digit."""

from __future__ import annotations

import doctest
import math
import re

__all__ = ["matches"]

_FLOAT = re.compile(r"-?\d+\.\d{6,}(?:e[-+]?\d+)?")


def matches(expected: str, got: str) -> bool:
    """Equal, with ``...`` in ``expected`` standing for any text (as in doctest's ELLIPSIS), and each number
    printed with six or more decimals equal to 1e-12 relative (a BLAS sum's last digit differs by machine).

    >>> matches("s: () float64\\n0.9650487376660893", "s: () float64\\n0.9650487376660895")
    True
    >>> matches("0.9650487376660893", "0.9650487376")
    False
    """
    wanted, found = _FLOAT.findall(expected), _FLOAT.findall(got)
    if len(wanted) == len(found) and all(math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-300)
                                         for a, b in zip(wanted, found)):
        expected, got = _FLOAT.sub("#", expected), _FLOAT.sub("#", got)
    return doctest.OutputChecker().check_output(expected.rstrip("\n") + "\n", got.rstrip("\n") + "\n",
                                                doctest.ELLIPSIS)
