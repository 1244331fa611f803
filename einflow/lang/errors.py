"""Error classes: every mistake a user can make surfaces as an EinflowError.

Each class also derives from the Python exception that numpy raises for the same mistake, so code written
for numpy keeps working: syntax, index and shape mistakes are ``ValueError``s, wrong argument types and
unknown keywords ``TypeError``s, an invalid contraction path a ``ValueError`` and a ``RuntimeError``
(numpy's einsum raises ``RuntimeError`` there), a plan over the memory limit a ``MemoryError``.

>>> import einflow as ef
>>> issubclass(ef.ShapeError, ValueError) and issubclass(ef.ArgumentError, TypeError)
True
"""

from __future__ import annotations

import unicodedata

__all__ = [
    "EinflowError",
    "ParseError",
    "IndexRuleError",
    "ShapeError",
    "TensorNameError",
    "GatherIndexError",
    "DerivativeError",
    "BackendError",
    "MemoryLimitError",
    "ArgumentError",
    "SubscriptsError",
    "PathError",
    "MatrixError",
    "SparseError",
]


class EinflowError(Exception):
    """Root of all einflow errors; catch this to catch any user mistake."""


class ParseError(EinflowError, ValueError):
    """The text is not valid einflow syntax.

    ``line`` and ``column`` are 1-based; the message shows the source line with a caret.
    """

    def __init__(self, message: str, line: int, column: int, source_line: str = "") -> None:
        self.line = line
        self.column = column
        self.source_line = source_line
        self.reason = message
        caret = ""
        if source_line:
            caret = f"\n    {source_line}\n    {_pad(source_line, column)}^"
        super().__init__(f"line {line}, column {column}: {message}{caret}")


class IndexRuleError(EinflowError, ValueError):
    """An index rule of the language is broken (free/contracted/bound indices, targets)."""


class ShapeError(EinflowError, ValueError):
    """Array shapes do not agree with the program (index sizes, ranks)."""


class GatherIndexError(EinflowError, IndexError):
    """A gather (``E[t[b], d]``) reads a position outside its axis: negative or too large (no wrap, no clamp)."""


class TensorNameError(EinflowError):
    """A tensor name is unknown, unbound, reserved or assigned twice."""


class DerivativeError(EinflowError, ValueError):
    """A derivative was requested that cannot be formed (non-scalar grad, unknown wrt)."""


class BackendError(EinflowError):
    """An unknown or unavailable backend was asked for."""


class MemoryLimitError(EinflowError, MemoryError):
    """The plan needs more memory than the memory limit allows; nothing was allocated."""


class ArgumentError(EinflowError, TypeError):
    """An argument has the wrong type, a keyword is unknown, or a dtype cannot be cast under ``casting=``."""


class SubscriptsError(EinflowError, ValueError):
    """``einsum`` subscripts are malformed (a character that is not a letter, a broken ``->`` or ``...``)."""


class PathError(EinflowError, ValueError, RuntimeError):
    """An explicit contraction path (``optimize=[...]``) does not contract the operands to one result."""


class MatrixError(EinflowError, ValueError):
    """A matrix declared ``symmetric`` or ``spd`` is not (LANGUAGE.md 8.1), or a matrix to invert is singular."""


def located(message: str, span: object | None, source: str | None) -> str:
    """Append the source line and a caret for ``span`` (a Span) when the source is known."""
    if span is None or not source:
        return message
    line = getattr(span, "line", 0)
    column = getattr(span, "column", 0)
    if not 1 <= line <= source.count("\n") + 1:
        return message
    text = source_line(source, line)
    return f"{message}\n  at line {line}, column {column}:\n    {text}\n    {_pad(text, column)}^"


def source_line(source: str, line: int) -> str:
    """Line ``line`` (1-based) of ``source`` as the parser counts lines (only ``\\n`` ends one), printable.

    Other line breaks (``\\r``, ``\\f``, ``\\u2028``) and control characters show as spaces, so the caret
    under a column still lines up. ``""`` when there is no such line.

    >>> source_line("a = 1\\fb\\nc = 2", 1)
    'a = 1 b'
    """
    lines = source.split("\n")
    if not 1 <= line <= len(lines):
        return ""
    return "".join(" " if c != "\t" and unicodedata.category(c)[0] in "CZ" and c != " " else c
                   for c in lines[line - 1].removesuffix("\r"))


def _pad(text: str, column: int) -> str:
    """White space that puts a caret under ``column`` of ``text`` (tabs stay tabs so it lines up)."""
    return "".join(c if c == "\t" else " " for c in text[: column - 1]).ljust(column - 1)


class SparseError(EinflowError, TypeError):
    """A sparse input einflow cannot use here: a backend or format without sparse support, or a read of a
    sparse tensor that would need its dense form (the message names the tensor and what is supported)."""
