"""A saved session's record (the JSON beside the arrays of ``:save FILE.npz``), checked field by field.

``Session.record()`` writes the record; :func:`check_record` reads one back and refuses, with a
``SessionError`` that names the file and the field, anything that is not a record this einflow wrote:
a missing or mistyped field, a statement that does not parse or does not define its name, a record
``version`` other than :data:`RECORD_VERSION`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from einflow.lang import ir
from einflow.lang.errors import EinflowError
from einflow.lang.grammar import parse
from einflow.shell.replies import SessionError, check_name
from einflow.shell.statements import topological

__all__ = ["RECORD_FORMAT", "RECORD_VERSION", "SavedStatement", "SessionRecord", "check_record", "make_record"]

RECORD_FORMAT = "einflow session"
#: the record version this einflow writes and the only one it reads
RECORD_VERSION = 1


@dataclass(frozen=True)
class SavedStatement:
    """One kept statement of a saved session: its name, its parsed assignment, its text, why it was stale."""

    name: str
    statement: ir.Assign
    text: str
    stale: str | None


@dataclass(frozen=True)
class SessionRecord:
    """A checked record: size declarations, statements (in the order they run), data names, the backend, and the
    matrix and padding declarations (``spd K``, ``pad reflect u``; absent from records saved before they were kept)."""

    sizes: tuple[ir.SizeDecl, ...]
    statements: tuple[SavedStatement, ...]
    data: tuple[str, ...]
    backend: str | None
    declarations: tuple[ir.MatrixDecl | ir.PadDecl, ...] = ()

    def matrices(self) -> dict[str, str]:
        """The declared matrices: name -> ``symmetric``, ``spd`` or ``hermitian``."""
        return {name: d.kind for d in self.declarations if isinstance(d, ir.MatrixDecl) for name in d.names}

    def pads(self) -> dict[str, str]:
        """The padded tensors: name -> padding mode."""
        return {name: d.mode for d in self.declarations if isinstance(d, ir.PadDecl) for name in d.names}


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


class _Fields:
    """Reads the fields of one record, raising a SessionError that names ``where`` and the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, problem: str) -> SessionError:
        return SessionError(f"{self.where}: field '{field}' {problem}; the session record is damaged or was not "
                            "written by einflow's :save (nothing was loaded)")

    def get(self, record: Mapping[str, Any], key: str, field: str, kind: type | tuple[type, ...],
            what: str, required: bool = True, default: Any = None) -> Any:
        if key not in record:
            if required:
                raise self.fail(field, "is missing")
            return default
        value = record[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # JSON true is not 1
            raise self.fail(field, f"is {_kind(value)}, not {what}")
        return value

    def name(self, value: object, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"is {_kind(value)}, not a tensor name")
        try:
            return check_name(value)
        except EinflowError as error:
            raise self.fail(field, f"is not a tensor name ({error})") from None

    def parsed(self, text: str, field: str) -> tuple[ir.Statement, ...]:
        try:
            return parse(text).statements
        except EinflowError as error:
            first = str(error).splitlines()[0]
            raise self.fail(field, f"does not parse ({type(error).__name__}: {first})") from None


def check_record(record: object, where: str) -> SessionRecord:
    """The record a ``:save FILE.npz`` wrote, checked; ``where`` names it in errors (``FILE.npz[member]``).

    >>> record = {"format": "einflow session", "version": 1, "sizes": ["size n = x"], "data": ["x"],
    ...           "statements": [{"name": "y", "text": "y[i] = 2 x[i]", "stale": None}], "backend": None}
    >>> [saved.name for saved in check_record(record, "s.npz").statements]
    ['y']
    >>> check_record({**record, "version": 2}, "s.npz")
    Traceback (most recent call last):
    einflow.shell.replies.SessionError: s.npz: field 'version' is 2: this einflow reads session records of version 1 \
(the file was saved by a newer einflow); nothing was loaded
    """
    fields = _Fields(where)
    if not isinstance(record, Mapping) or record.get("format") != RECORD_FORMAT:
        raise SessionError(f"{where} is not a session record (a JSON object with \"format\": \"{RECORD_FORMAT}\")")
    version = fields.get(record, "version", "version", int, "a whole number")
    if version != RECORD_VERSION:
        newer = " (the file was saved by a newer einflow)" if version > RECORD_VERSION else ""
        raise SessionError(f"{where}: field 'version' is {version}: this einflow reads session records of version "
                           f"{RECORD_VERSION}{newer}; nothing was loaded")

    data: dict[str, None] = {}
    for number, name in enumerate(fields.get(record, "data", "data", list, "a list of tensor names")):
        if fields.name(name, f"data[{number}]") in data:
            raise fields.fail(f"data[{number}]", f"names '{name}' a second time")
        data[name] = None

    sizes: list[ir.SizeDecl] = []
    for number, text in enumerate(fields.get(record, "sizes", "sizes", list, "a list of size declarations")):
        field = f"sizes[{number}]"
        if not isinstance(text, str):
            raise fields.fail(field, f"is {_kind(text)}, not a size declaration (text such as 'size n = 3')")
        statements = fields.parsed(text, field)
        if len(statements) != 1 or not isinstance(statements[0], ir.SizeDecl):
            raise fields.fail(field, f"is {text!r}, not one size declaration (such as 'size n = 3')")
        sizes.append(statements[0])

    saved: list[SavedStatement] = []
    names: set[str] = set()
    entries = fields.get(record, "statements", "statements", list, "a list of statements")
    for number, entry in enumerate(entries):
        field = f"statements[{number}]"
        if not isinstance(entry, Mapping):
            raise fields.fail(field, f"is {_kind(entry)}, not an object with 'name', 'text' and 'stale'")
        name = fields.name(fields.get(entry, "name", f"{field}.name", str, "a tensor name"), f"{field}.name")
        text = fields.get(entry, "text", f"{field}.text", str, "a statement's text")
        stale = fields.get(entry, "stale", f"{field}.stale", (str, type(None)), "null or a reason", required=False)
        statements = fields.parsed(text, f"{field}.text")
        statement = statements[0] if len(statements) == 1 else None
        if not isinstance(statement, ir.Assign) or statement.target is None:
            raise fields.fail(f"{field}.text", f"is {text!r}, not one statement that defines a tensor")
        if statement.target != name:
            raise fields.fail(f"{field}.text", f"defines '{statement.target}', but the entry's name is '{name}'")
        if name in names:
            raise fields.fail(f"{field}.name", f"'{name}' is defined by an earlier statement too")
        if name in data:
            raise fields.fail(f"{field}.name", f"'{name}' is listed as data too")
        names.add(name)
        saved.append(SavedStatement(name, statement, text, stale))

    declarations: list[ir.MatrixDecl | ir.PadDecl] = []
    texts = fields.get(record, "declarations", "declarations", list, "a list of declarations", required=False,
                       default=[])
    for number, text in enumerate(texts):
        field = f"declarations[{number}]"
        if not isinstance(text, str):
            raise fields.fail(field, f"is {_kind(text)}, not a declaration (text such as 'spd K' or 'pad reflect u')")
        statements = fields.parsed(text, field)
        if len(statements) != 1 or not isinstance(statements[0], (ir.MatrixDecl, ir.PadDecl)):
            raise fields.fail(field, f"is {text!r}, not one matrix or padding declaration (such as 'spd K')")
        declarations.append(statements[0])

    backend = fields.get(record, "backend", "backend", (str, type(None)), "null or a backend's name",
                         required=False)
    return SessionRecord(tuple(sizes), tuple(saved), tuple(data), backend, tuple(declarations))


def make_record(definitions: Mapping[str, Any], sizes: Mapping[str, ir.SizeDecl], stale: Mapping[str, str],
                values: Mapping[str, Any], backend: str | None, matrices: Mapping[str, str] | None = None,
                pads: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A session's record (``Session.record()``): its size declarations, its kept statements (``definitions``,
    stale ones too) in an order that runs, which of its names (``values``) are data, its backend, and its matrix
    (``matrices``: name -> ``spd``...) and padding (``pads``: name -> mode) declarations, one per kind or mode."""
    decls = list(dict.fromkeys(sizes.values()))
    order = topological(definitions, set(definitions))
    declarations: list[ir.MatrixDecl | ir.PadDecl] = [
        ir.MatrixDecl(kind, tuple(n for n, k in (matrices or {}).items() if k == kind))
        for kind in dict.fromkeys((matrices or {}).values())]
    declarations += [ir.PadDecl(mode, tuple(n for n, m in (pads or {}).items() if m == mode))
                     for mode in dict.fromkeys((pads or {}).values())]
    return {"format": RECORD_FORMAT, "version": RECORD_VERSION,
            "sizes": [ir.format_statement(decl) for decl in decls],
            "declarations": [ir.format_statement(decl) for decl in declarations],
            "statements": [{"name": name, "text": definitions[name].text,
                            "stale": stale.get(name)} for name in order],
            "data": [name for name in values if name not in definitions],
            "backend": backend}
