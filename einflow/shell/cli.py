"""The ``einflow`` command: the REPL, piped sessions, ``einflow FILE.ein``, and the run / grad / plan subcommands."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from einflow.lang.errors import EinflowError, TensorNameError

__all__ = ["main", "build_parser"]

_EPILOG = """\
examples:
  einflow                                   interactive session (a terminal), or a piped session:
  einflow < session.ein                     lines as typed at the prompt; exit 1 if any failed
  einflow -c ':set x [1.0, 2.0]
  s = x[i] x[i]'                            the same for text given here
  einflow model.ein --inputs in.npz         run a program file (a file with :commands runs as a session)
  einflow run model.ein --inputs in.npz --out out.npz --of L
  einflow grad 'L = sum[i](log(1 + exp(-y[i] X[i,f] w[f])))' --wrt w
  einflow grad model.ein --wrt w --inputs in.npz   print the gradient program, then its value
  einflow jacobian 'y[i] = tanh(A[i,j] x[j])' --wrt x --mode forward
  einflow plan 'y[i] = A[i,j] B[j,k] v[k]' --shape A=100x200 --shape B=200x300 --shape v=300
"""

SUBCOMMANDS = ("run", "grad", "jacobian", "hessian", "hessian_diagonal", "laplacian", "jvp", "hvp", "plan")


def _looks_like_a_file(text: str) -> bool:
    return "\n" not in text and (text.endswith(".ein") or os.path.isfile(text))


def _read_text(text: str) -> tuple[str, str]:
    """Program text given on the command line and where it came from: a file, ``-`` (stdin), or the text."""
    from einflow.shell.files import read_bounded, read_text_file

    if text == "-":  # as much as a program file may hold, and no more: stdin may never end
        # a text stream without bytes under it (a test's StringIO) is read as text
        return read_bounded(getattr(sys.stdin, "buffer", sys.stdin), "<stdin>"), "<stdin>"
    if _looks_like_a_file(text):  # a missing *.ein file is an error, not program text
        return read_text_file(text, "regular program files"), text
    return text, "the text"


def _shape_argument(text: str) -> tuple[str, tuple[int, ...]]:
    """``A=100x200`` -> ("A", (100, 200)); ``s=scalar`` -> ("s", ()); anything else is a usage error (exit 2)."""
    name, separator, shape = text.partition("=")
    name, shape = name.strip(), shape.strip().lower()
    if not separator or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=SHAPE such as A=100x200, got {text!r}")
    if shape in ("scalar", "()"):
        return name, ()
    parts = shape.replace("*", "x").replace(",", "x").split("x")
    if not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=SHAPE with whole sizes such as A=100x200 (a scalar: "
                                         f"s=scalar), got {text!r}")
    return name, tuple(int(part) for part in parts)


def _select(program: Any, name: str | None) -> Any:
    """The program cut down to the value ``name`` (``--of NAME``): its statement and those before it."""
    import einflow
    from einflow.lang import ir

    if name is None:
        return program
    statements: list[ir.Statement] = []
    for statement in program.ir.statements:
        if isinstance(statement, ir.Return):
            continue
        statements.append(statement)
        if isinstance(statement, ir.Assign) and statement.target == name:
            return einflow.compile(ir.format_program(ir.ProgramIR(tuple(statements))))
    targets = [s.target for s in program.ir.statements if isinstance(s, ir.Assign) and s.target]
    raise TensorNameError(f"--of {name}: the program computes no value {name!r} (its values are "
                          f"{', '.join(targets) or 'unnamed'})")


def _compile(text: str, where: str) -> Any:
    import einflow

    try:
        return einflow.compile(text)
    except EinflowError as error:
        if any(line.lstrip().startswith(":") for line in text.splitlines()):
            raise EinflowError(f"{type(error).__name__}: {error}\n{where} looks like a session script (it has "
                               f":commands); run it as a session instead: einflow < {where}") from None
        raise


def _run(args: argparse.Namespace) -> int:
    text, where = _read_text(args.file)
    program = _select(_compile(text, where), args.of)
    return _evaluate(program, args.inputs, args.backend, args.out, args.quiet)


def _evaluate(program: Any, inputs: str | None, backend: str | None, out: str | None, quiet: bool) -> int:
    """Run ``program`` on the arrays of the ``inputs`` .npz; print (and save to ``out``) its values."""
    from einflow.program import default_memory_limit
    from einflow.shell.files import load_arrays, save_arrays
    from einflow.shell.replies import format_value

    arrays = load_arrays(inputs, limit=default_memory_limit()) if inputs else {}
    missing = [name for name in program.inputs if name not in arrays]
    if missing:
        where = f"{inputs} has no array" if inputs else "no --inputs file was given for"
        raise TensorNameError(f"{where} {', '.join(repr(m) for m in missing)} (this program reads "
                              f"{', '.join(program.inputs)}; pass them in a .npz with --inputs)")
    value = program({name: arrays[name] for name in program.inputs}, backend=backend)
    values = value if program.info.returns_tuple else (value,)
    names = [name or "value" for name in program.outputs]
    if not quiet:
        print("\n".join(format_value(name, item) for name, item in zip(names, values)))
    if out:
        save_arrays(out, dict(zip(names, values)))
    return 0


def _derivative(kind: str) -> Any:
    def handler(args: argparse.Namespace) -> int:
        import einflow

        function = getattr(einflow, kind, None)
        if function is None:
            raise EinflowError(f"einflow.{kind} is not available in this version of einflow")
        program = _select(_compile(*_read_text(args.text)), args.of)
        if program.info.returns_tuple:
            raise EinflowError(f"{kind}: the program returns a tuple ({', '.join(n or '?' for n in program.outputs)})"
                               "; pick one value with --of NAME")
        wrt = args.wrt[0] if len(args.wrt) == 1 else list(args.wrt)
        options: dict[str, Any] = {"mode": args.mode} if getattr(args, "mode", None) else {}
        tangents = getattr(args, "tangent", None)
        if tangents:
            if len(tangents) != len(args.wrt):
                raise ValueError(f"{kind}: give one --tangent per --wrt ({len(args.wrt)})")
            options["tangent"] = tangents[0] if len(tangents) == 1 else list(tangents)
        derivative = function(program, wrt=wrt, **options)
        print(derivative)
        if args.inputs:  # evaluate it too: print (and save) its values
            print()
            return _evaluate(derivative, args.inputs, args.backend, args.out, quiet=False)
        return 0

    return handler


def _plan(args: argparse.Namespace) -> int:
    program = _select(_compile(*_read_text(args.text)), args.of)
    print(program.plan(dict(args.shape or ()), optimize=args.optimize))
    return 0


def _session(args: argparse.Namespace) -> int:
    from einflow.shell.session import Session, run_lines

    session = Session()
    if args.session_backend:
        reply = session.execute(f":backend {args.session_backend}")
        if not reply.ok:
            raise EinflowError(reply.text)
    if args.command_text is not None:
        return run_lines(session, args.command_text.splitlines(), sys.stdout, sys.stderr, args.echo, name="-c")
    if sys.stdin.isatty() and not args.echo:
        from einflow.shell.repl import run_repl

        return run_repl(session)
    return run_lines(session, _stdin_lines(), sys.stdout, sys.stderr, args.echo)


def _stdin_lines() -> Iterator[str]:
    """Standard input's lines, read and decoded as UTF-8 one at a time, each at most as long as a program file
    may be (a SessionError names a line that is longer, or not UTF-8)."""
    from einflow.shell.files import read_bounded_lines

    return read_bounded_lines(getattr(sys.stdin, "buffer", sys.stdin), "<stdin>")


def _first_positional(argv: list[str]) -> int | None:
    """Where the first word that is not an option (nor an option's value) is."""
    position = 0
    while position < len(argv):
        word = argv[position]
        if word in ("-c", "--backend"):
            position += 2
            continue
        if not word.startswith("-") or word == "-":
            return position
        position += 1
    return None


def _file(parser: argparse.ArgumentParser, argv: list[str], file_at: int) -> int:
    """``einflow FILE.ein [options]``: a program runs like ``einflow run``; a session script (with
    ``:commands``) runs its lines like ``einflow < FILE.ein``."""
    from einflow.shell.files import read_text_file

    path = argv[file_at]
    text = read_text_file(path, "regular program files")  # a FIFO or a device is refused, not waited on
    if any(line.lstrip().startswith(":") for line in text.splitlines()):
        from einflow.shell.session import Session, run_lines

        args = parser.parse_args(argv[:file_at] + argv[file_at + 1:])
        session = Session()
        if args.session_backend:
            reply = session.execute(f":backend {args.session_backend}")
            if not reply.ok:
                print(f"einflow: {reply.text}", file=sys.stderr)
                return 1
        return run_lines(session, text.splitlines(), sys.stdout, sys.stderr, args.echo, name=path)
    return main(["run", path, *argv[:file_at], *argv[file_at + 1:]])


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (usage errors exit with status 2)."""
    from einflow import __version__

    parser = argparse.ArgumentParser(
        prog="einflow", description="Tensor algebra in index notation: an interactive session, or one-shot tools.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"einflow {__version__}")
    parser.add_argument("-c", dest="command_text", metavar="TEXT",
                        help="run TEXT as session lines (statements and :commands), then exit")
    parser.add_argument("--echo", action="store_true", help="piped mode: print each input line after the prompt")
    parser.add_argument("--backend", dest="session_backend", metavar="B",
                        help="session backend: numpy, dask, cupy, auto")
    parser.set_defaults(handler=_session)
    commands = parser.add_subparsers(dest="subcommand", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    text_help = "einflow text, a .ein file, or - for stdin"
    of_help = "the value NAME of a program that computes several (a return line a, b): use that one"

    run = commands.add_parser("run", help="run a program (file, text or -) and print (or save) its value")
    run.add_argument("file", metavar="TEXT", help=text_help)
    run.add_argument("--inputs", metavar="IN.npz", help="arrays for the program's inputs")
    run.add_argument("--out", metavar="OUT.npz", help="save the program's value(s) here (atomically)")
    run.add_argument("--backend", metavar="B", help="numpy, dask, cupy or auto")
    run.add_argument("--of", metavar="NAME", help=of_help)
    run.add_argument("-q", "--quiet", action="store_true", help="do not print the values")
    run.set_defaults(handler=_run)

    for kind, what in (("grad", "gradient"), ("jacobian", "Jacobian"), ("hessian", "Hessian"),
                       ("hessian_diagonal", "Hessian's diagonal"), ("laplacian", "Laplacian (the Hessian's trace)"),
                       ("jvp", "Jacobian-vector product"), ("hvp", "Hessian-vector product")):
        sub = commands.add_parser(kind, help=f"print the {what} program of TEXT")
        sub.add_argument("text", metavar="TEXT", help=text_help)
        sub.add_argument("--wrt", action="append", required=True, metavar="X",
                         help="an input to differentiate with respect to (repeat for several)")
        sub.add_argument("--of", metavar="NAME", help=of_help)
        sub.add_argument("--inputs", metavar="IN.npz", help="evaluate the derivative on these arrays and print it")
        sub.add_argument("--out", metavar="OUT.npz", help="with --inputs: save the derivative's value(s) here")
        sub.add_argument("--backend", metavar="B", help="with --inputs: numpy, dask, cupy or auto")
        if kind in ("jvp", "hvp"):
            sub.add_argument("--tangent", action="append", metavar="T",
                             help="the name of the new input shaped like --wrt (repeat for several; default T)")
        if kind == "jacobian":
            sub.add_argument("--mode", choices=("auto", "forward", "reverse"), default=None,
                             help="carry tangents forward or adjoints in reverse (default: auto, fewer axes)")
        sub.set_defaults(handler=_derivative(kind))

    plan = commands.add_parser("plan", help="print the contraction plan of TEXT for given shapes")
    plan.add_argument("text", metavar="TEXT", help=text_help)
    plan.add_argument("--of", metavar="NAME", help=of_help)
    plan.add_argument("--shape", action="append", type=_shape_argument, metavar="NAME=SHAPE",
                      help="an input's shape, e.g. A=100x200 (a scalar: s=scalar)")
    plan.add_argument("--optimize", default="auto", help="opt_einsum path strategy (default: auto)")
    plan.set_defaults(handler=_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``einflow`` command; returns the exit status.

    >>> main(["plan", "s = x[i] x[i]", "--shape", "x=10"])  # doctest: +ELLIPSIS
    plan for:
    ...
    0
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        file_at = _first_positional(argv)
        if file_at is not None and argv[file_at] not in SUBCOMMANDS and _looks_like_a_file(argv[file_at]):
            return _file(parser, argv, file_at)
        args = parser.parse_args(argv)
        return args.handler(args)
    except BrokenPipeError:  # the reader went away (einflow ... | head): stop quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (EinflowError, OSError, ValueError) as error:
        name = "error" if type(error) is EinflowError else type(error).__name__
        print(f"einflow: {name}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
