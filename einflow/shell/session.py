"""A session: einflow statements and commands typed one line at a time, kept as a program.

The prompt_toolkit front end (einflow.shell.repl) and the piped mode (``run_lines``, here) both drive a
``Session``: ``session.execute(line)`` runs one line and returns a ``Reply`` with the text to print.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TextIO

import numpy as np

from einflow.engine.memory import format_bytes
from einflow.lang import ir
from einflow.lang.errors import EinflowError, MemoryLimitError, ParseError, TensorNameError, located
from einflow.lang.grammar import parse
from einflow.lang.padding import resolve_pads
from einflow.program import Program, default_memory_limit
from einflow.shell.hints import front_end_hint, typed_hint
from einflow.shell.records import SessionRecord, check_record, make_record
from einflow.shell.replies import Reply, SessionError, check_name, format_value
from einflow.shell.statements import (
    Definition,
    affected_by,
    declarations_for,
    indices_of,
    needed_for,
    path_to,
    program_text,
    reads_of,
    topological,
)

__all__ = ["Session", "Reply", "Definition", "SessionError", "format_value", "needs_more", "check_name",
           "logical_lines", "run_lines", "located_reply", "PROMPT", "CONTINUATION", "register_command_runner"]

PROMPT = "ein> "
CONTINUATION = "...> "
MEMORY_ADVICE = "(:memory shows this session's limit; :memory 64GiB sets it, :memory none turns the guard off)"


def needs_more(text: str) -> bool:
    """Whether ``text`` is an unfinished statement: a ``(`` or ``[`` is open and the text ends too early.

    A line with an open bracket that is wrong before its end (``y[i = 2``) is not waited on: its error shows.

    >>> needs_more("y[i] = sum[j](A[i,j]"), needs_more("y[i = 2"), needs_more("y = x[i] # (")
    (True, False, False)
    """
    if text.lstrip().startswith(":"):
        return False
    depth = 0
    for line in text.splitlines():
        for char in line.split("#", 1)[0]:
            if char in "([":
                depth += 1
            elif char in ")]":
                depth -= 1
    if depth <= 0:
        return False
    try:
        parse(text)
    except ParseError as error:
        return error.reason.startswith("unexpected end of input")
    return False


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else message


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _error_reply(error: Exception) -> Reply:
    """What a line that raised ``error`` prints (the session is already as it was before the line)."""
    if isinstance(error, MemoryLimitError):
        return Reply(f"{_error_text(error)}\n{MEMORY_ADVICE}", ok=False, error=error)
    if isinstance(error, (EinflowError, OSError, ValueError)):
        return Reply(_error_text(error), ok=False, error=error)
    if isinstance(error, MemoryError):  # numpy could not allocate what the guard let through
        return Reply(f"MemoryError: out of memory ({error or 'numpy could not allocate an array'}); nothing "
                     f"was changed\n{MEMORY_ADVICE}", ok=False, error=error)
    return Reply(f"internal error (please report it): {_error_text(error)}", ok=False, error=error)


def _saved_backend(saved: str | None, current: str | None) -> tuple[str | None, list[str]]:
    """The backend a restored session runs on (the saved one, before any statement re-evaluates) and a note; a
    backend this machine lacks is named in the note and the session keeps its own."""
    from einflow.engine.backends import get_backend

    if saved is None or saved == current:
        return current, []
    try:
        if saved != "auto":
            get_backend(saved)
    except EinflowError as error:
        return current, [f"saved backend '{saved}' is not available here ({_first_line(_error_text(error))}); "
                         f"staying on {current or 'the default backend'}"]
    return saved, [f"backend: {saved}"]


#: the ``:command`` runner a Session takes when its front end gives none: einflow.shell.commands registers its
#: table here when it is imported (``einflow.shell`` imports it), so the session never imports the commands
_COMMAND_RUNNERS: dict[str, Callable[[Session, str], Reply]] = {}


def register_command_runner(runner: Callable[[Session, str], Reply]) -> None:
    """Make ``runner`` the ``:command`` runner of every Session created from now on without one of its own."""
    _COMMAND_RUNNERS["default"] = runner


class Session:
    """The state of one interactive session: bound arrays, kept statements, size declarations.

    A session is a program: each statement typed is evaluated with the current bindings, its target bound
    and its statement kept. Redefining a name replaces its statement and re-evaluates every kept statement
    that depends on it; a dependent that no longer evaluates becomes *stale* (it keeps its statement, loses
    its value, and is re-evaluated again whenever one of its inputs changes).

    >>> s = Session(width=80)
    >>> print(s.execute(":set x [3.0, 4.0]").text)
    x: (2,) float64
    [3. 4.]
    >>> print(s.execute("n = sqrt(x[i] x[i])").text)
    n: () float64
    5.0
    >>> print(s.execute(":set x [6.0, 8.0]").text.splitlines()[-1])
    re-evaluated: n
    >>> float(s.values["n"])
    10.0
    """

    def __init__(self, width: int | None = None, seed: int | None = None,
                 commands: Callable[[Session, str], Reply] | None = None) -> None:
        self.width = width
        #: runs a ``:command`` line: the runner given, else the one registered (einflow.shell.commands' table)
        self.commands = commands
        self.values: dict[str, Any] = {}
        self.definitions: dict[str, Definition] = {}
        self.origins: dict[str, str] = {}  # data names -> how they were bound
        self.sizes: dict[str, ir.SizeDecl] = {}  # index name -> its declaration
        self.matrices: dict[str, str] = {}  # `symmetric A` / `spd K`: matrix name -> its declaration
        self.pads: dict[str, str] = {}  # `pad reflect u`: tensor name -> its padding mode
        self.stale: dict[str, str] = {}  # name -> why it could not be re-evaluated
        self.order: dict[str, None] = {}  # every name, in the order it was first bound
        self.backend: str | None = None
        self.memory_limit: int | None | str = "default"  # bytes, None (no guard) or "default" (:memory)
        self.style: str | None = None  # a highlighting style chosen with :style (the terminal front end draws it)
        self.rng = np.random.default_rng(seed)
        #: whose words hints use: "repl" (the ein> prompt and piped sessions: :commands) or "notebook"
        #: (%%einflow cells: Python assignments and magics)
        self.front_end = "repl"

    # ------------------------------------------------------------------ entry point
    def execute(self, line: str) -> Reply:
        """Run one input (a statement line or a ``:command``) and say what to print.

        Errors never escape: they come back as a Reply with ``ok=False``; the session is left exactly as it
        was before the line (a line is all-or-nothing).
        """
        text = line.strip()
        if not text or text.startswith("#"):
            return Reply()
        snapshot = self._snapshot()
        try:
            if text.startswith(":"):
                return self._command_runner()(self, text)
            word = text.rstrip("()").strip()  # words typed as in Python or IPython (unless they are names here)
            hint = "" if word in self.values or word in self.definitions else typed_hint(text)
            if hint:
                return Reply(hint, ok=False)
            return Reply(self.run_statements(line))
        except KeyboardInterrupt:
            self._restore(snapshot)
            raise
        except Exception as error:  # (a bug in einflow too: it must not end the user's session)
            self._restore(snapshot)
            return _error_reply(error)

    def _command_runner(self) -> Callable[[Session, str], Reply]:
        runner = self.commands if self.commands is not None else _COMMAND_RUNNERS.get("default")
        if runner is None:
            raise SessionError("this session runs no :commands (none was given and none is registered)")
        return runner

    # ------------------------------------------------------------------ memory
    def limit_bytes(self) -> int | None:
        """The memory limit in bytes that statements and data commands run under (None: no guard)."""
        if self.memory_limit == "default":
            return default_memory_limit()
        return None if self.memory_limit is None else int(self.memory_limit)

    def guard(self, shape: tuple[int, ...], itemsize: int, what: str) -> None:
        """Refuse (MemoryLimitError) to make an array of ``shape`` when it is over the session's limit."""
        limit = self.limit_bytes()
        needed = math.prod(shape) * itemsize
        if limit is not None and needed > limit:
            raise MemoryLimitError(f"{what} needs {format_bytes(needed)} (shape {tuple(shape)}), over the memory "
                                   f"limit of {format_bytes(limit)}; nothing was allocated")

    @contextlib.contextmanager
    def all_or_nothing(self) -> Iterator[None]:
        """Run a block as one line runs: if it raises, the session is left exactly as it was before."""
        snapshot = self._snapshot()
        try:
            yield
        except BaseException:
            self._restore(snapshot)
            raise

    def _snapshot(self) -> tuple[Any, ...]:
        return (dict(self.values), dict(self.definitions), dict(self.origins), dict(self.sizes),
                dict(self.matrices), dict(self.pads), dict(self.stale), dict(self.order), self.backend)

    def _restore(self, snapshot: tuple[Any, ...]) -> None:
        (self.values, self.definitions, self.origins, self.sizes, self.matrices, self.pads, self.stale, self.order,
         self.backend) = snapshot

    def reset(self) -> None:
        """Forget every binding, statement and size declaration; go back to the default backend."""
        for table in (self.values, self.definitions, self.origins, self.sizes, self.matrices, self.pads, self.stale,
                      self.order):
            table.clear()
        self.backend = None

    # ------------------------------------------------------------------ statements
    def run_statements(self, text: str) -> str:
        """Parse ``text`` (one or more statements) and run each: define, declare, or print."""
        program = parse(text)
        out: list[str] = []
        for statement in program.statements:
            if isinstance(statement, ir.SizeDecl):
                out.extend(self.declare_sizes(statement))
            elif isinstance(statement, ir.MatrixDecl):  # kept for the session: checked and used by later statements
                self.matrices.update(dict.fromkeys(statement.names, statement.kind))
                out.append(f"{', '.join(statement.names)}: declared {statement.kind}")
            elif isinstance(statement, ir.PadDecl):  # kept for the session: later reads of the tensors fold
                self.pads.update(dict.fromkeys(statement.names, statement.mode))
                out.append(f"{', '.join(statement.names)}: declared pad {statement.mode}")
            elif isinstance(statement, ir.Return):
                for name in statement.names:
                    out.append(format_value(name, self.lookup(name), self.width))
            elif statement.target is None and isinstance(statement.expr, ir.Tensor) and not statement.expr.indices:
                out.append(format_value(statement.expr.name, self.lookup(statement.expr.name), self.width))
            elif statement.target is None:
                out.append(format_value(None, self.evaluate(statement, text), self.width))
            else:
                out.extend(self.define(statement, text))
        return "\n".join(out)

    def lookup(self, name: str) -> Any:
        """The current value of ``name`` (a clear error when it is unbound or stale)."""
        self._require_bound([name])
        return self.values[name]

    def unit(self, statements: ir.Statement | Sequence[ir.Statement], source: str | None = None) -> Program:
        """Statements as a Program, preceded by the session's size declarations for the indices they use."""
        if not isinstance(statements, Sequence):
            statements = (statements,)
        decls = declarations_for(statements, self.sizes, self.matrices, self.pads)
        program_ir = resolve_pads(ir.ProgramIR(decls + tuple(statements)))
        return Program(program_ir, source if source is not None else ir.format_program(program_ir))

    def evaluate(self, statement: ir.Assign, source: str | None = None) -> Any:
        """Evaluate one statement with the current bindings (nothing is bound)."""
        program = self.unit(statement, source)
        self._require_bound(program.inputs, statement, source)
        return program(self.values, backend=self.backend, memory_limit=self.memory_limit)

    def define(self, statement: ir.Assign, source: str) -> list[str]:
        """Evaluate ``statement``, bind its target, keep it, and re-evaluate what depends on the target."""
        name = statement.target
        assert name is not None
        self.unit(statement, source)  # compile-time checks first
        definition = Definition(statement, source, reads_of(statement, self.sizes), indices_of(statement))
        cycle = path_to(self.definitions, name, definition.reads)
        if cycle:
            raise TensorNameError(
                f"'{name}' cannot be redefined this way: it would depend on itself "
                f"({' -> '.join([name, *cycle])}); use a new name")
        value = self.evaluate(statement, source)
        self.values[name] = value
        self.order.setdefault(name)
        self.definitions[name] = definition
        self.origins.pop(name, None)
        self.stale.pop(name, None)
        return [format_value(name, value, self.width), *self.update_dependents({name})]

    def bind(self, name: str, value: Any, origin: str) -> list[str]:
        """Bind data to ``name`` (dropping any statement that defined it); re-evaluate its dependents."""
        return self.bind_many({name: value}, origin)

    def bind_many(self, arrays: Mapping[str, Any], origin: str) -> list[str]:
        """Bind several arrays as data at once, then re-evaluate what depends on any of them."""
        for name, value in arrays.items():
            check_name(name)
            self.values[name] = value
            self.order.setdefault(name)
            self.definitions.pop(name, None)
            self.stale.pop(name, None)
            self.origins[name] = origin
        return self.update_dependents(set(arrays))

    def declare_sizes(self, decl: ir.SizeDecl) -> list[str]:
        """Keep a size declaration for the rest of the session (it replaces earlier ones for its indices)."""
        notes: list[str] = []
        replaced = {id(old): old for name in decl.names if (old := self.sizes.get(name)) is not None}
        for old in replaced.values():
            for name in old.names:
                del self.sizes[name]
                if name not in decl.names:
                    notes.append(f"note: the size of index '{name}' is no longer declared")
        for name in decl.names:
            self.sizes[name] = decl
        notes.insert(0, ir.format_statement(decl))
        return notes + self.update_dependents(set(), set(decl.names) | {n for o in replaced.values() for n in o.names})

    def update_dependents(self, names: set[str], indices: Iterable[str] = (),
                          up_to_date: Iterable[str] = ()) -> list[str]:
        """Re-evaluate every kept statement that depends on ``names`` (or uses ``indices``), in order.

        Statements in ``up_to_date`` were just evaluated in an order that runs (:meth:`restore`): they are
        re-evaluated only when they read a statement that is. The walk is linear in the session's statements.
        """
        affected = affected_by(self.definitions, names, set(indices), set(up_to_date))
        updated: list[str] = []
        notes: list[str] = []
        for name in topological(self.definitions, affected):
            definition = replace(self.definitions[name], reads=reads_of(self.definitions[name].statement, self.sizes))
            self.definitions[name] = definition
            stale_inputs = sorted(read for read in definition.reads if read in self.stale)
            try:
                if stale_inputs:
                    raise TensorNameError(f"depends on stale {', '.join(stale_inputs)}")
                self.values[name] = self.evaluate(definition.statement, definition.source)
                self.stale.pop(name, None)
                updated.append(name)
            except EinflowError as error:
                self.values.pop(name, None)
                self.stale[name] = _first_line(str(error) if stale_inputs else _error_text(error))
                notes.append(f"stale: {name} ({self.stale[name]})")
        if updated:
            notes.insert(0, "re-evaluated: " + ", ".join(updated))
        return notes

    # ------------------------------------------------------------------ programs from history
    def program_for(self, target: str, cut: Iterable[str] = ()) -> str:
        """The program text that computes ``target`` from data: its statement and those it depends on (names in
        ``cut`` are taken as inputs: their statements are left out)."""
        self._require_bound([target])
        if target not in self.definitions:
            raise SessionError(f"'{target}' is data ({self.origins.get(target, 'bound')}), not a statement; "
                               "only names defined by a statement can be differentiated or planned")
        needed = needed_for(self.definitions, self.stale, target, set(cut) - {target})
        return program_text(self.definitions, self.sizes, needed, self.matrices, self.pads)

    # ------------------------------------------------------------------ the whole session as a program
    def statements_text(self) -> str:
        """Every kept statement that evaluates (stale ones are left out), in an order that runs, after the size
        declarations they use: the session as a program whose inputs are its data.

        >>> s = Session()
        >>> _ = s.execute(":set x [3.0, 4.0]"); _ = s.execute("y[i] = 2 x[i]"); _ = s.execute("n = y[i] y[i]")
        >>> print(s.statements_text())
        y[i] = 2 x[i]
        n = y[i] y[i]
        """
        kept = {name for name in self.definitions if name not in self.stale}
        return program_text(self.definitions, self.sizes, kept, self.matrices, self.pads)

    def record(self) -> dict[str, Any]:
        """What ``:save FILE.npz`` keeps beside the arrays so that ``:load`` restores a live session: the size,
        matrix and padding declarations, the kept statements (stale ones too) and which names are data."""
        return make_record(self.definitions, self.sizes, self.stale, self.values, self.backend, self.matrices,
                           self.pads)

    def restore(self, arrays: Mapping[str, Any], record: Mapping[str, Any] | SessionRecord, origin: str) -> list[str]:
        """Bind the saved data, then keep and re-evaluate the saved statements (the inverse of :meth:`record`);
        a statement that does not evaluate now is kept stale, as it would be after an edit.

        ``record`` is checked first (:func:`einflow.shell.records.check_record`, a SessionError naming ``origin``
        and the bad field). Each saved statement is evaluated once, in the record's order, and the work besides
        is linear in the number of statements; then the session's own statements that read a restored name (or
        use a restored size) are re-evaluated.
        """
        if not isinstance(record, SessionRecord):
            record = check_record(record, origin)
        self.backend, notes = _saved_backend(record.backend, self.backend)
        data = {name: arrays[name] for name in record.data if name in arrays}
        notes += self.bind_many(data, origin)
        for decl in record.sizes:
            for index in decl.names:
                self.sizes[index] = decl
        self.matrices.update(record.matrices())
        self.pads.update(record.pads())
        for saved in record.statements:
            self.definitions[saved.name] = Definition(saved.statement, saved.text,
                                                      reads_of(saved.statement, self.sizes),
                                                      indices_of(saved.statement))
            self.order.setdefault(saved.name)
            self.origins.pop(saved.name, None)
            self.values.pop(saved.name, None)
        saved_names = {saved.name for saved in record.statements}
        restored: list[str] = []
        for name in topological(self.definitions, saved_names):  # the record's order, unless an edit put a reader first
            definition = self.definitions[name]
            try:
                self._require_bound([read for read in definition.reads if read not in self.definitions])
                stale_inputs = sorted(read for read in definition.reads if read in self.stale)
                if stale_inputs:
                    raise TensorNameError(f"depends on stale {', '.join(stale_inputs)}")
                self.values[name] = self.evaluate(definition.statement, definition.source)
                self.stale.pop(name, None)
                restored.append(name)
            except EinflowError as error:
                self.values.pop(name, None)
                self.stale[name] = _first_line(_error_text(error))
                notes.append(f"stale: {name} ({self.stale[name]})")
        if restored:
            notes.append("statements restored (re-evaluated when their inputs change): " + ", ".join(restored))
        size_names = {index for decl in record.sizes for index in decl.names}
        return notes + self.update_dependents(saved_names, size_names, up_to_date=saved_names)

    # ------------------------------------------------------------------ helpers
    def names(self) -> list[str]:
        """Every tensor name the session knows (bound or stale), in the order they were made."""
        return [name for name in self.order if name in self.values or name in self.definitions]

    def hint(self, what: str, *words: str) -> str:
        """How to do ``what`` ("bind" a name, take the "jacobian" of ``words[0]`` wrt ``words[1:]``) in this
        session's front end: ``:commands`` at the prompt, Python and magics in a notebook.

        >>> Session().hint("jacobian", "H", "W1")
        ':jacobian H wrt W1'
        """
        return front_end_hint(self.front_end, what, *words)

    def _require_bound(self, names: Iterable[str], statement: ir.Assign | None = None,
                       source: str | None = None) -> None:
        """Refuse (TensorNameError) a name that is unbound or stale: with close matches among the bound names,
        and where ``statement`` (typed as ``source``) reads it."""
        for name in names:
            if name in self.values:
                continue
            if name in self.stale:
                raise TensorNameError(f"'{name}' is stale: {self.stale[name]}; fix its inputs or redefine it")
            close = difflib.get_close_matches(name, list(self.values), n=3, cutoff=0.5)
            message = f"'{name}' is not bound in this session"
            if close:
                message += "; did you mean " + " or ".join(f"'{c}'" for c in close) + "? Otherwise"
            message += f"; {self.hint('bind')}" if not close else f" {self.hint('bind')}"
            span = None
            if statement is not None:
                span = next((node.span for node in ir.walk(statement.expr)
                             if isinstance(node, (ir.Tensor, ir.Read)) and name in ir.tensors_read(node)), None)
            raise TensorNameError(located(message, span, source))

    def shapes(self, names: Iterable[str]) -> Mapping[str, tuple[int, ...]]:
        """The shapes of bound tensors."""
        self._require_bound(names)
        return {name: tuple(np.shape(self.values[name])) for name in names}


def logical_lines(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """Join lines while a ``(`` or ``[`` is open; yield (first line number, text)."""
    buffer: list[str] = []
    start = 0
    for number, line in enumerate(lines, 1):
        if buffer and line.lstrip().startswith(":"):  # a command never continues a statement
            yield start, "\n".join(buffer)
            buffer = []
        if not buffer:
            start = number
        buffer.append(line.rstrip("\r\n"))
        text = "\n".join(buffer)
        if not needs_more(text):
            yield start, text
            buffer = []
    if buffer:
        yield start, "\n".join(buffer)


_AT_LINE = re.compile(r"\n  at line (\d+), column (\d+):")


def located_reply(reply: Reply, name: str, number: int) -> str:
    """A failed line's message as ``NAME:LINE:COLUMN: message``, with the position in the input (one line
    number, counted in the file, not in the statement).

    >>> session = Session()
    >>> print(located_reply(session.execute("y = 2 3"), "<stdin>", 4))
    <stdin>:4:7: ParseError: unexpected number '3': a number cannot follow a factor without '*'
        y = 2 3
              ^
    """
    error, text = reply.error, reply.text
    if isinstance(error, ParseError):
        prefix = f"line {error.line}, column {error.column}: "
        text = text.replace(prefix, "", 1)
        return f"{name}:{number + error.line - 1}:{error.column}: {text}"
    match = _AT_LINE.search(text)
    if match:
        line, column = int(match.group(1)), int(match.group(2))
        return f"{name}:{number + line - 1}:{column}: {text[:match.start()]}{text[match.end():]}"
    return f"{name}:{number}: {text}"


def run_lines(session: Session, lines: Iterable[str], out: TextIO, err: TextIO, echo: bool = False,
              name: str = "<stdin>") -> int:
    """The piped mode: run each line as typed at the prompt; 1 if any line failed, else 0.

    Results go to ``out``; errors go to ``err`` as ``NAME:LINE: message``. With ``echo`` each input is
    written to ``out`` after the prompt first, so the output reads like a transcript.
    """
    failed = False
    for number, text in logical_lines(lines):
        if echo:
            out.write(PROMPT + text.replace("\n", "\n" + CONTINUATION) + "\n")
        reply = session.execute(text)
        if reply.ok:
            if reply.text:
                out.write(reply.text + "\n")
        else:
            failed = True
            out.flush()
            err.write(located_reply(reply, name, number) + "\n")
            err.flush()
        if reply.quit:
            break
    out.flush()
    return 1 if failed else 0
