"""Comparing a documented transcript with what einflow prints, as doctest does, but not to the last digit; a
session's lines run with their outcome asserted."""

from __future__ import annotations

import doctest
import math
import re
from typing import Any

__all__ = ["matches", "run", "fail"]

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


def run(session: Any, line: str) -> str:
    """The reply to ``line`` in an einflow ``Session``, which must succeed."""
    reply = session.execute(line)
    assert reply.ok, reply.text
    return reply.text


def fail(session: Any, line: str) -> str:
    """The reply to ``line``, which must be an error."""
    reply = session.execute(line)
    assert not reply.ok, f"expected {line!r} to fail, got:\n{reply.text}"
    return reply.text
