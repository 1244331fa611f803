"""The session's ``:commands``: data in and out, derivatives through history, plans, timing, help."""

from __future__ import annotations

import ast
import difflib
import re
import shlex
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from einflow.engine.memory import format_bytes
from einflow.lang.errors import DerivativeError
from einflow.lang.grammar import parse
from einflow.shell.files import atomic_write, check_numeric, load_arrays, read_session_record, save_arrays
from einflow.shell.replies import Reply, SessionError, check_name, format_value, parse_bytes, to_numpy
from einflow.shell.session import Session, register_command_runner

if TYPE_CHECKING:  # annotations only
    from einflow.program import Program
    from einflow.report import PlanReport

__all__ = ["COMMANDS", "Command", "run_command", "unique_commands", "program_of", "parse_wrt", "derivative_program",
           "bind_derivative", "plan_report"]


@dataclass(frozen=True)
class Command:
    """One ``:command``: how to call it, what it does, and the function that runs it."""

    name: str
    usage: str
    summary: str
    run: Callable[[Session, str], str | Reply]
    section: str = ""
    aliases: tuple[str, ...] = ()


# The one table of commands: :help, Tab completion and the docs test all read it (in registration order).
COMMANDS: dict[str, Command] = {}
_section = ""


def _begin_section(title: str) -> None:
    """Commands registered from here on are listed under ``title`` in :help."""
    global _section
    _section = title


def _command(name: str, usage: str, summary: str, aliases: tuple[str, ...] = ()) -> Callable[..., Any]:
    def register(function: Callable[[Session, str], str | Reply]) -> Callable[[Session, str], str | Reply]:
        command = Command(name, usage, summary, function, _section, aliases)
        for alias in (name, *aliases):
            COMMANDS[alias] = command
        return function

    return register


def unique_commands() -> list[Command]:
    """Each command once (aliases folded), in the order they were registered."""
    return list({id(command): command for command in COMMANDS.values()}.values())


def run_command(session: Session, text: str) -> Reply:
    """Run ``:name args``; unknown names get a suggestion."""
    word, _, rest = text[1:].strip().partition(" ")
    command = COMMANDS.get(word)
    if command is None:
        close = difflib.get_close_matches(word, COMMANDS, n=1)
        hint = f"; did you mean :{close[0]}?" if close else ""
        raise SessionError(f"unknown command ':{word}'{hint} (:help lists the commands)")
    result = command.run(session, rest.strip())
    return result if isinstance(result, Reply) else Reply(result)


def _words(rest: str, usage: str, minimum: int = 1) -> list[str]:
    words = shlex.split(rest)
    if len(words) < minimum:
        raise SessionError(f"usage: {usage}")
    return words


# ---------------------------------------------------------------- data in
_begin_section("data in")


_SET_TAKES = ("write numbers or (nested) lists of numbers, no names or calls; for an array of a shape use "
              ":zeros, :ones, :randn, :rand or :load")


@_command("set", ":set NAME LITERAL", "bind a Python literal: :set x [1.0, 2.0]  (numbers, nested lists)")
def _set(session: Session, rest: str) -> str:
    name, _, literal = rest.partition(" ")
    if not literal.strip():
        raise SessionError("usage: :set NAME LITERAL   e.g. :set A [[1.0, 2.0], [3.0, 4.0]]")
    check_name(name)
    try:
        value = ast.literal_eval(literal.strip())
    except SyntaxError as error:
        raise SessionError(f"cannot read {literal.strip()!r} as a Python literal ({error.msg}); "
                           f"{_SET_TAKES}") from None
    except (ValueError, TypeError, MemoryError, RecursionError):
        raise SessionError(f"cannot read {literal.strip()!r} as a Python literal: {_SET_TAKES}") from None
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged lists
        raise SessionError(f"cannot make an array from {literal.strip()!r}: {error}") from None
    check_numeric(name, array)
    notes = session.bind(name, array, f":set {literal.strip()}")
    return "\n".join([format_value(name, array, session.width), *notes])


def _fill(kind: str) -> Callable[[Session, str], str]:
    def fill(session: Session, rest: str) -> str:
        name, *dims = _words(rest, f":{kind} NAME d1 d2 ...")
        check_name(name)
        try:
            shape = tuple(int(d) for d in dims)
        except ValueError:
            raise SessionError(f"sizes must be whole numbers: :{kind} {rest}") from None
        if any(d < 0 for d in shape):
            raise SessionError(f"sizes must not be negative: :{kind} {rest}")
        session.guard(shape, np.dtype(np.float64).itemsize, f":{kind} {rest}")
        makers = {
            "randn": lambda: session.rng.standard_normal(shape),
            "rand": lambda: session.rng.random(shape),
            "zeros": lambda: np.zeros(shape),
            "ones": lambda: np.ones(shape),
        }
        array = makers[kind]()
        notes = session.bind(name, array, f":{kind} {' '.join(dims)}".rstrip())
        return "\n".join([format_value(name, array, session.width), *notes])

    return fill


_command("randn", ":randn NAME d1 d2 ...", "standard normal samples of that shape")(_fill("randn"))
_command("rand", ":rand NAME d1 d2 ...", "uniform samples in [0, 1) of that shape")(_fill("rand"))
_command("zeros", ":zeros NAME d1 d2 ...", "an array of zeros")(_fill("zeros"))
_command("ones", ":ones NAME d1 d2 ...", "an array of ones")(_fill("ones"))


@_command("seed", ":seed N", "seed the generator used by :randn and :rand")
def _seed(session: Session, rest: str) -> str:
    try:
        session.rng = np.random.default_rng(int(rest))
    except ValueError:
        raise SessionError("usage: :seed N   (a non-negative whole number)") from None
    return ""


@_command("load", ":load NAME FILE.npy | :load FILE.npz [NAME ...]",
          "read arrays (.npy one, .npz all or some); a session's .npz brings its statements back too")
def _load(session: Session, rest: str) -> str:
    words = _words(rest, ":load NAME FILE.npy  or  :load FILE.npz [NAME ...]")
    files = [word for word in words if word.endswith((".npz", ".npy"))]
    if len(files) != 1:
        raise SessionError("usage: :load NAME FILE.npy  or  :load FILE.npz [NAME ...]")
    names = [word for word in words if word != files[0]]
    if files[0].endswith(".npy") and len(names) > 1:
        raise SessionError("a .npy file holds one array: :load NAME FILE.npy")
    found = read_session_record(files[0]) if files[0].endswith(".npz") and not names else None
    if found is not None:  # a saved session: its data, then its statements (they re-evaluate as they run)
        record = found[1]
        arrays = load_arrays(files[0], list(record.data), session.limit_bytes())
        lines = [f"{name}: {array.shape} {array.dtype}  (from {files[0]})" for name, array in arrays.items()]
        return "\n".join(lines + session.restore(arrays, record, f":load {files[0]}"))
    arrays = load_arrays(files[0], names or None, session.limit_bytes())
    notes = session.bind_many(arrays, f":load {files[0]}")
    lines = [f"{name}: {array.shape} {array.dtype}  (from {files[0]})" for name, array in arrays.items()]
    return "\n".join(lines + notes)


# ---------------------------------------------------------------- data out
_begin_section("data out")


_SAVE_USAGE = ":save FILE.npz [NAME ...]  or  :save NAME FILE.npy  or  :save FILE.ein"


@_command("save", ":save FILE.npz [NAME ...] | :save NAME FILE.npy | :save FILE.ein",
          "write atomically: the session (.npz: arrays and statements), arrays, or its statements as a program")
def _save(session: Session, rest: str) -> str:
    words = _words(rest, _SAVE_USAGE)
    if len(words) == 1 and words[0].endswith(".ein"):
        text = session.statements_text()
        if not text:
            raise SessionError("nothing to save: no statement is kept (a .ein file holds the session's statements)")
        data = [name for name in session.names() if name not in session.definitions]
        header = (f"# einflow session saved with :save {words[0]}; its inputs: {', '.join(data)}\n"
                  f"# run it: einflow {words[0]} --inputs FILE.npz\n")
        atomic_write(words[0], lambda stream: stream.write((header + text + "\n").encode("utf-8")))
        left = sorted(session.stale)
        return f"saved {len(text.splitlines())} statements to {words[0]}" + \
            (f" (stale, left out: {', '.join(left)})" if left else "")
    files = [word for word in words if word.endswith((".npz", ".npy"))]
    if len(files) != 1:
        raise SessionError(f"usage: {_SAVE_USAGE}  (name the file .npz, .npy or .ein)")
    path = files[0]
    names = [word for word in words if word != path]
    record = None
    if path.endswith(".npz") and not names:  # the whole session: its arrays and its statements
        names = list(session.values)
        record = session.record()
        if not names and not record["statements"]:
            raise SessionError("nothing to save: no tensor is bound")
    if path.endswith(".npy") and len(names) != 1:
        raise SessionError("usage: :save NAME FILE.npy  (one array per .npy file)")
    arrays = {name: session.lookup(name) for name in names}
    save_arrays(path, arrays, record)
    count = len(record["statements"]) if record else 0
    kept = f" and {count} statement{'s' if count > 1 else ''}" if count else ""
    return f"saved {', '.join(names)}{kept} to {path}"


# ---------------------------------------------------------------- looking around
_begin_section("the session")


@_command("vars", ":vars", "list bound tensors: name, shape, dtype, and what defined them")
def _vars(session: Session, rest: str) -> str:
    rows = [("name", "shape", "dtype", "defined by")]
    for name in session.names():
        if name in session.values:
            array = session.values[name]
            shape, dtype = str(tuple(np.shape(array))), str(getattr(array, "dtype", type(array).__name__))
        else:
            shape, dtype = "stale", "-"
        definition = session.definitions.get(name)
        origin = definition.text if definition is not None else session.origins.get(name, "")
        rows.append((name, shape, dtype, origin))
    if len(rows) == 1:
        return "no tensors bound (bind some with :set, :randn, :load, or a statement)"
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}".rstrip()
             for row in rows]
    declarations = list(dict.fromkeys(session.sizes.values()))
    if declarations:
        from einflow.lang.ir import format_statement

        lines.append("sizes: " + "; ".join(format_statement(decl) for decl in declarations))
    return "\n".join(lines)


@_command("backend", ":backend [NAME]", "show or choose the backend: numpy, dask, cupy, auto")
def _backend(session: Session, rest: str) -> str:
    from einflow.engine.backends import get_backend, get_default_backend

    if not rest:
        return f"backend: {session.backend or get_default_backend()}"
    if rest != "auto":
        get_backend(rest)  # the API's own message for an unknown or missing backend (choices, how to install)
    session.backend = rest
    return f"backend: {rest}"


@_command("memory", ":memory [SIZE | none | default]",
          "show or set the memory limit for statements and data commands (e.g. :memory 8GiB)")
def _memory(session: Session, rest: str) -> str:
    if rest:
        word = rest.strip().lower()
        session.memory_limit = None if word in ("none", "off") else "default" if word == "default" \
            else parse_bytes(rest)
    limit = session.limit_bytes()
    if limit is None:
        return "memory limit: none (the guard is off: :memory default turns it back on)"
    how = "the default: 90% of the memory available" if session.memory_limit == "default" else "set with :memory"
    return f"memory limit: {format_bytes(limit)} ({how}); a statement or data command that would need more " \
           "is refused before anything is allocated"


@_command("style", ":style [NAME]", "show or choose the colours of typed input (einflow, none, or a pygments style)")
def _style(session: Session, rest: str) -> str:
    from einflow.shell.highlight import DEFAULT_STYLE, style_names

    if rest:
        names = style_names()
        if rest not in names:
            raise SessionError(f"style {rest!r} not found, valid options are {', '.join(names)}")
        session.style = rest
    return f"style: {session.style or DEFAULT_STYLE}  (EINFLOW_STYLE sets the one a session starts with; " \
           "NO_COLOR turns colour off)"


@_command("reset", ":reset", "forget every tensor, statement and size declaration")
def _reset(session: Session, rest: str) -> str:
    session.reset()
    return "session reset"


@_command("quit", ":quit", "leave (Ctrl-D works too)", aliases=("exit", "q"))
def _quit(session: Session, rest: str) -> Reply:
    return Reply(quit=True)


@_command("help", ":help [COMMAND]", "this list, or one command's usage")
def _help(session: Session, rest: str) -> str:
    if rest:
        command = COMMANDS.get(rest.lstrip(":"))
        if command is None:
            raise SessionError(f"no command :{rest.lstrip(':')} (:help lists them)")
        also = f"\n  also: {', '.join(':' + alias for alias in command.aliases)}" if command.aliases else ""
        return f"{command.usage}\n  {command.summary}{also}"
    lines = ["Type einflow statements to evaluate them: y[i] = A[i,j] x[j]   (targets are bound and kept)",
             "Commands (:help NAME for one):"]
    section = None
    for command in unique_commands():
        if command.section != section:
            section = command.section
            lines.append(f" {section}:")
        if len(command.usage) <= 26:
            lines.append(f"  {command.usage:<26}  {command.summary}")
        else:
            lines.extend([f"  {command.usage}", f"  {'':<26}  {command.summary}"])
    return "\n".join(lines)


# ---------------------------------------------------------------- programs: derivatives, plans, LaTeX, timing
_begin_section("derivatives and programs")


def program_of(session: Session, text: str) -> Program:
    """A kept name -> the program computing it from data; anything else -> that text as a program."""
    from einflow.program import compile as compile_text

    if re.fullmatch(r"[A-Za-z_]\w*", text) and text in session.definitions:
        return compile_text(session.program_for(text))
    statements = parse(text).statements
    return session.unit(statements, text)


def parse_wrt(rest: str, usage: str) -> tuple[str, list[str]]:
    """``L wrt X, Y`` (or ``L X Y``) -> ("L", ["X", "Y"]); a usage error otherwise."""
    words = [word for word in re.split(r"[\s,]+", rest) if word]
    if len(words) >= 2 and words[1] == "wrt":
        words = [words[0], *words[2:]]
    if len(words) < 2 or "wrt" in words:
        raise SessionError(f"usage: {usage}")
    for word in words:
        check_name(word)
    return words[0], words[1:]


def derivative_program(session: Session, kind: str, target: str, wrt: list[str], **options: Any) -> Program:
    """The ``grad``/``jacobian``/``hessian`` program of ``target`` (through the kept statements) wrt ``wrt``."""
    import einflow

    function = getattr(einflow, kind, None)
    if function is None:
        raise SessionError(f"einflow.{kind} is not available in this version of einflow")
    if kind == "hessian" and len(wrt) != 1:
        raise SessionError(f"usage: :{kind} L wrt X  (one tensor)")
    session.lookup(target)
    for name in wrt:
        session.lookup(name)
    program = einflow.compile(session.program_for(target, cut=wrt))
    for name in wrt:
        if name not in program.inputs:
            raise SessionError(f"'{target}' does not depend on '{name}' (it reads {', '.join(program.inputs)})")
    indices = program.info.targets.get(target, ())
    if kind in ("grad", "hessian") and indices:
        raise DerivativeError(f"{kind} needs a scalar value, but '{target}' has rank {len(indices)} "
                              f"({target}[{','.join(indices)}]); for the full derivative use "
                              f"{session.hint('jacobian', target, *wrt)}")
    return function(program, wrt=wrt[0] if len(wrt) == 1 else wrt, **options)


def bind_derivative(session: Session, kind: str, target: str, wrt: list[str], derivative: Program,
                    ) -> tuple[dict[str, Any], list[str]]:
    """Evaluate a derivative program with the session's values and bind its values (as data); return them and
    the session's notes."""
    values = derivative(session.values, backend=session.backend, memory_limit=session.memory_limit)
    if not derivative.info.returns_tuple:
        values = (values,)
    prefix = "d2" if kind == "hessian" else "d"
    named = {derivative.outputs[position] or f"{prefix}{target}_d{wrt[position]}": value
             for position, value in enumerate(values)}
    notes = session.bind_many(named, f":{kind} {target} wrt {', '.join(wrt)}")
    return named, notes


def _derive(session: Session, kind: str, rest: str, usage: str) -> str:
    target, wrt = parse_wrt(rest, usage)
    if kind == "hessian" and len(wrt) != 1:
        raise SessionError(f"usage: {usage}  (one tensor)")
    derivative = derivative_program(session, kind, target, wrt)
    named, notes = bind_derivative(session, kind, target, wrt, derivative)
    out = [f"# {kind} of {target} with respect to {', '.join(wrt)}", str(derivative), ""]
    out.extend(format_value(name, value, session.width) for name, value in named.items())
    return "\n".join(out + notes)


_GRAD_USAGE = ":grad L wrt X[, Y ...]"


@_command("grad", _GRAD_USAGE, "print the gradient program of scalar L, evaluate it, bind dL_dX ...")
def _grad(session: Session, rest: str) -> str:
    return _derive(session, "grad", rest, _GRAD_USAGE)


@_command("jacobian", ":jacobian Y wrt X", "print and evaluate the Jacobian of Y (shape of Y + shape of X)")
def _jacobian(session: Session, rest: str) -> str:
    return _derive(session, "jacobian", rest, ":jacobian Y wrt X")


@_command("hessian", ":hessian L wrt X", "print and evaluate the Hessian of scalar L (shape of X twice)")
def _hessian(session: Session, rest: str) -> str:
    return _derive(session, "hessian", rest, ":hessian L wrt X")


@_command("hessian_diagonal", ":hessian_diagonal L wrt X",
          "print and evaluate the diagonal of the Hessian of scalar L (shape of X), without forming it")
def _hessian_diagonal(session: Session, rest: str) -> str:
    return _derive(session, "hessian_diagonal", rest, ":hessian_diagonal L wrt X")


@_command("laplacian", ":laplacian L wrt X[, Y ...]",
          "print and evaluate the Laplacian of scalar L (the Hessian's trace), without forming the Hessian")
def _laplacian(session: Session, rest: str) -> str:
    return _derive(session, "laplacian", rest, ":laplacian L wrt X[, Y ...]")


def _along(session: Session, kind: str, rest: str, usage: str) -> str:
    """``:jvp Y wrt X along T`` / ``:hvp L wrt X along V``: T, V are bound tensors shaped like X."""
    left, _, right = rest.partition(" along ")
    tangents = [word for word in re.split(r"[\s,]+", right) if word]
    target, wrt = parse_wrt(left, usage)
    if not tangents or len(tangents) != len(wrt):
        raise SessionError(f"usage: {usage}  (one tangent per input)")
    for name in tangents:
        check_name(name)
        session.lookup(name)
    derivative = derivative_program(session, kind, target, wrt,
                                    tangent=tangents[0] if len(tangents) == 1 else tangents)
    named, notes = bind_derivative(session, kind, target, wrt, derivative)
    out = [f"# {kind} of {target} with respect to {', '.join(wrt)} along {', '.join(tangents)}", str(derivative), ""]
    out.extend(format_value(name, value, session.width) for name, value in named.items())
    return "\n".join(out + notes)


@_command("jvp", ":jvp Y wrt X along T", "print and evaluate the derivative of Y along T (T shaped like X)")
def _jvp(session: Session, rest: str) -> str:
    return _along(session, "jvp", rest, ":jvp Y wrt X along T")


@_command("hvp", ":hvp L wrt X along V", "print and evaluate the Hessian of scalar L times V, without forming it")
def _hvp(session: Session, rest: str) -> str:
    return _along(session, "hvp", rest, ":hvp L wrt X along V")


@_command("plan", ":plan STATEMENT_OR_NAME", "the contraction plan for the current shapes: FLOPs, memory")
def _plan(session: Session, rest: str) -> str:
    if not rest:
        raise SessionError("usage: :plan STATEMENT_OR_NAME")
    return str(plan_report(session, rest))


def plan_report(session: Session, text: str) -> PlanReport:
    """The plan report of a kept name (the whole program computing it) or of statement text, for the
    shapes bound in the session."""
    program = program_of(session, text)
    shapes = session.shapes(program.inputs)
    itemsize = max((to_numpy(session.values[name]).dtype.itemsize for name in program.inputs), default=8)
    backend = session.backend if session.backend not in (None, "auto") else "numpy"
    return program.plan(shapes, itemsize=itemsize, backend=backend)


@_command("latex", ":latex STATEMENT_OR_NAME", "the program as LaTeX")
def _latex(session: Session, rest: str) -> str:
    if not rest:
        raise SessionError("usage: :latex STATEMENT_OR_NAME")
    program = program_of(session, rest)
    try:
        return program.to_latex()
    except (ImportError, NotImplementedError) as error:
        raise SessionError(f"LaTeX export is not available in this version of einflow ({error})") from None


def _duration(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


@_command("time", ":time STATEMENT", "time a statement: the first call (plans) and then per call (binds nothing)")
def _time(session: Session, rest: str) -> str:
    if not rest:
        raise SessionError("usage: :time STATEMENT")
    program = session.unit(parse(rest).statements, rest)
    session.shapes(program.inputs)  # every input bound
    values, backend, limit = session.values, session.backend, session.memory_limit
    timer = timeit.Timer(lambda: program(values, backend=backend, memory_limit=limit))
    first = timer.timeit(1)
    number, total = timer.autorange()
    best = min([total, *timer.repeat(repeat=2, number=number)]) / number
    return f"first call {_duration(first)} (includes planning); then {_duration(best)} per call " \
           f"(best of 3 x {number})"


register_command_runner(run_command)  # every Session without a runner of its own runs this table
