"""Jupyter and IPython: ``%load_ext einflow`` adds the ``%%einflow`` cell magic and derivation line magics.

``%%einflow`` runs a cell of einflow statements with the notebook's variables as inputs, stores every
value it computes back into the notebook under its name, and shows the program as LaTeX with the values.
``%einflow_grad L wrt W`` (``%einflow_jacobian``, ``%einflow_hessian``) shows the derivative program of a
value computed in earlier cells, as LaTeX and as text, and stores its values (``dL_dW``);
``%einflow_plan NAME_OR_STATEMENT`` shows the plan report (an HTML table in Jupyter).

Behind the magics is one einflow session (``einflow.shell.session.Session``), so cells build up a program the
way lines do at the ``ein>`` prompt: a value keeps the statement that computed it, and a derivative works
through every statement it depends on, across cells. IPython is imported only by IPython itself.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import numpy as np

from einflow.lang import ir
from einflow.lang.errors import EinflowError
from einflow.shell.replies import format_value, to_numpy

__all__ = ["load_ipython_extension", "EinflowMagics", "Shown", "latex_of_value"]

_LARGEST_SHOWN = 8  # arrays with an axis longer than this (or more than two axes) are shown by their shape


def _latex_name(name: str) -> str:
    return r"\mathrm{" + name.replace("_", r"\_") + "}"


def _latex_number(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(int(value))
    if isinstance(value, (complex, np.complexfloating)):
        return f"{value.real:.4g}{value.imag:+.4g}i"
    return f"{value:.4g}".replace("inf", r"\infty").replace("nan", r"\mathrm{NaN}")


def latex_of_value(name: str, value: Any) -> str:
    """One value as a line of an ``aligned`` block: a number, a small matrix, or its shape.

    >>> print(latex_of_value("x", np.array([1.0, 2.5])))
    \\mathrm{x} &= \\begin{bmatrix} 1 & 2.5 \\end{bmatrix}
    >>> print(latex_of_value("A", np.zeros((20, 3))))
    \\mathrm{A} &\\in \\mathbb{R}^{20 \\times 3} \\quad \\text{(float64)}
    """
    array = to_numpy(value)
    head = _latex_name(name)
    if array.ndim == 0:
        return f"{head} &= {_latex_number(array[()])}"
    if array.ndim <= 2 and max(array.shape) <= _LARGEST_SHOWN and array.size:
        rows = array.reshape(1, -1) if array.ndim == 1 else array
        body = r" \\ ".join(" & ".join(_latex_number(item) for item in row) for row in rows)
        return f"{head} &= \\begin{{bmatrix}} {body} \\end{{bmatrix}}"
    field = r"\mathbb{C}" if array.dtype.kind == "c" else r"\mathbb{R}"
    shape = r" \times ".join(str(size) for size in array.shape) or "1"
    return f"{head} &\\in {field}^{{{shape}}} \\quad \\text{{({array.dtype})}}"


class Shown:
    """What a magic displays: a program (as LaTeX and as text) and the values it computed.

    Jupyter shows the LaTeX (``text/latex``); a terminal shows the text. ``program`` is the einflow text.
    """

    def __init__(self, program: Any, values: Mapping[str, Any], title: str = "", text_too: bool = False) -> None:
        self.program = program
        self.values = dict(values)
        self.title = title
        self.text_too = text_too  # Jupyter shows the einflow text under the LaTeX (a Markdown output)

    def latex(self) -> str:
        """The program's LaTeX, then one line per value."""
        program = self.program.to_latex()
        lines = [latex_of_value(name, value) for name, value in self.values.items()]
        if not lines:
            return f"$${program}$$"
        values = r" \\ ".join(lines)
        return f"$${program}$$\n$$\\begin{{aligned}} {values} \\end{{aligned}}$$"

    def text(self) -> str:
        """The program's einflow text, then each value as the ``ein>`` prompt prints it."""
        parts = ([f"# {self.title}"] if self.title else []) + [str(self.program)]
        parts.extend(format_value(name, value) for name, value in self.values.items())
        return "\n".join(parts)

    def markdown(self) -> str:
        """The LaTeX, then the einflow text of the program in a code block (copy it, paste it, run it)."""
        title = f"**{self.title}**\n\n" if self.title else ""
        return f"{title}{self.latex()}\n\n```\n{self.program}\n```\n"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        bundle = {"text/plain": self.text(), "text/latex": self.latex()}
        if self.text_too:
            bundle["text/markdown"] = self.markdown()
        return bundle

    def __repr__(self) -> str:
        return self.text()


def _usage_error(message: str) -> Exception:
    from IPython.core.error import UsageError

    return UsageError(message)


class EinflowMagics:
    """The magics of one IPython shell, over one einflow session whose data comes from the shell's namespace."""

    def __init__(self, shell: Any) -> None:
        from einflow.shell.session import Session

        self.shell = shell
        self.session = Session()
        self.session.front_end = "notebook"  # hints in Python's and the magics' words
        self.stored: dict[str, Any] = {}  # name -> the value a magic last put into the namespace

    # ------------------------------------------------------------------ namespace <-> session
    def _take_inputs(self, names: list[str]) -> None:
        """Bind the notebook's current value of each input name the session does not already hold as is."""
        namespace = self.shell.user_ns
        fresh: dict[str, Any] = {}
        for name in names:
            if name not in namespace:
                continue
            value = namespace[name]
            if self.session.values.get(name) is value:
                continue
            fresh[name] = value if hasattr(value, "shape") else np.asarray(value)
        if fresh:
            self.session.bind_many(fresh, "the notebook")

    def _store(self, values: Mapping[str, Any]) -> None:
        """Put values into the namespace, and refresh every value a magic stored earlier that the session has
        since re-evaluated (unless the notebook has rebound that name itself)."""
        namespace = self.shell.user_ns
        for name, old in list(self.stored.items()):
            new = self.session.values.get(name)
            if new is not None and new is not old and namespace.get(name) is old:
                namespace[name] = self.stored[name] = new
        for name, value in values.items():
            namespace[name] = self.stored[name] = value

    def _reply(self, run: Any) -> Any:
        """Run ``run()`` all-or-nothing on the session; einflow errors become one-line IPython usage errors."""
        try:
            with self.session.all_or_nothing():
                return run()
        except (EinflowError, OSError, ValueError) as error:
            raise _usage_error(f"{type(error).__name__}: {error}") from None

    def _show(self, shown: Shown) -> None:
        from IPython.display import display

        display(shown)

    # ------------------------------------------------------------------ magics
    def cell(self, line: str, cell: str) -> None:
        """``%%einflow [--quiet] [--backend B]``: run the cell's statements, store its values, show them."""
        options = self._options(line, {"--quiet": False, "-q": False}, {"--backend": None, "-b": None})
        if options["--backend"] or options["-b"]:
            reply = self.session.execute(f":backend {options['--backend'] or options['-b']}")
            if not reply.ok:
                raise _usage_error(reply.text)

        def run() -> Shown:
            from einflow.lang.grammar import parse

            program_ir = parse(cell)
            defined = {s.target for s in program_ir.statements if isinstance(s, ir.Assign) and s.target}
            reads = {name for s in program_ir.statements if isinstance(s, ir.Assign)
                     for name in ir.tensors_read(s.expr)}
            sources = {s.source for s in program_ir.statements
                       if isinstance(s, ir.SizeDecl) and isinstance(s.source, str)}
            self._take_inputs(sorted((reads | sources) - defined))
            self.session.run_statements(cell)
            shown_names: list[str] = []
            for statement in program_ir.statements:
                if isinstance(statement, ir.Assign) and statement.target:
                    shown_names.append(statement.target)
                elif isinstance(statement, ir.Return):
                    shown_names.extend(statement.names)
            values = {name: self.session.values[name] for name in dict.fromkeys(shown_names)}
            for statement in program_ir.statements:  # a bare expression: shown as "value", not stored
                if isinstance(statement, ir.Assign) and statement.target is None:
                    values["value"] = self.session.evaluate(statement, cell)
            return Shown(self.session.unit(program_ir.statements, cell), values)

        shown = self._reply(run)
        self._store({name: value for name, value in shown.values.items() if name in self.session.values})
        if not (options["--quiet"] or options["-q"]):
            self._show(shown)

    def derivative(self, kind: str, line: str) -> None:
        """``%einflow_grad L wrt W``: show the derivative program (LaTeX and text), store its values."""
        from einflow.program import compile as compile_text
        from einflow.shell.commands import bind_derivative, derivative_program, parse_wrt

        usage = f"%einflow_{kind} L wrt X" + ("[, Y ...]" if kind == "grad" else "")

        def run() -> Shown:
            target, wrt = parse_wrt(line, usage)
            if target not in self.session.definitions:
                raise EinflowError(f"'{target}' was not computed by an %%einflow cell; run a cell that defines it "
                                   f"first (this session knows: {', '.join(self.session.definitions) or 'nothing'})")
            inputs = compile_text(self.session.program_for(target, cut=wrt)).inputs
            self._take_inputs(list(inputs))
            derivative = derivative_program(self.session, kind, target, wrt)
            named, _ = bind_derivative(self.session, kind, target, wrt, derivative)
            return Shown(derivative, named, f"{kind} of {target} with respect to {', '.join(wrt)}", text_too=True)

        shown = self._reply(run)
        self._store(shown.values)
        self._show(shown)

    def plan(self, line: str) -> None:
        """``%einflow_plan NAME_OR_STATEMENT``: show the plan report for the notebook's current shapes."""
        from einflow.shell.commands import plan_report, program_of

        text = line.strip()
        if not text:
            raise _usage_error("usage: %einflow_plan NAME_OR_STATEMENT")

        def run() -> Any:
            self._take_inputs(list(program_of(self.session, text).inputs))
            return plan_report(self.session, text)

        from IPython.display import display

        report = self._reply(run)
        self._store({})
        display(report)

    @staticmethod
    def _options(line: str, flags: dict[str, bool], values: dict[str, str | None]) -> dict[str, Any]:
        words = shlex.split(line)
        options: dict[str, Any] = {**flags, **values}
        position = 0
        while position < len(words):
            word = words[position]
            if word in flags:
                options[word] = True
            elif word in values and position + 1 < len(words):
                options[word] = words[position + 1]
                position += 1
            else:
                known = ", ".join([*flags, *values])
                raise _usage_error(f"%%einflow: unknown option {word!r} (options: {known})")
            position += 1
        return options


def load_ipython_extension(shell: Any) -> None:
    """Called by ``%load_ext einflow``: register ``%%einflow`` and ``%einflow_grad/_jacobian/_hessian/_plan``."""
    magics = EinflowMagics(shell)
    shell.register_magic_function(magics.cell, magic_kind="cell", magic_name="einflow")
    for kind in ("grad", "jacobian", "hessian"):
        def derivative(line: str, kind: str = kind) -> None:
            magics.derivative(kind, line)

        derivative.__doc__ = f"%einflow_{kind} L wrt X: the {kind} program of L (LaTeX and text); stores its values"
        shell.register_magic_function(derivative, magic_kind="line", magic_name=f"einflow_{kind}")
    shell.register_magic_function(magics.plan, magic_kind="line", magic_name="einflow_plan")
