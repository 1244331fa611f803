"""The interactive front end on prompt_toolkit: the prompt loop, history, Tab completion, highlighting."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator

from prompt_toolkit.completion import CompleteEvent, Completer, Completion, PathCompleter
from prompt_toolkit.document import Document

from einflow.lang.errors import EinflowError
from einflow.lang.ir import BINARY_FUNCTIONS, FUNCTIONS, LINALG, MATRIX_DECLARATIONS, NORMALISERS, REDUCTIONS
from einflow.shell.commands import COMMANDS
from einflow.shell.files import read_text_file
from einflow.shell.session import CONTINUATION, PROMPT, Reply, Session, needs_more

__all__ = ["EinflowCompleter", "history_path", "check_history", "run_repl", "colour_off", "BANNER"]

HISTORY_VARIABLE = "EINFLOW_HISTORY"
STYLE_VARIABLE = "EINFLOW_STYLE"
_KEYWORDS = ("delta", "size", *REDUCTIONS, *NORMALISERS, *BINARY_FUNCTIONS, *LINALG, *MATRIX_DECLARATIONS)


def history_path() -> str | None:
    """Where history is kept: ``$EINFLOW_HISTORY`` if set (empty: keep none), else ``~/.einflow_history``."""
    configured = os.environ.get(HISTORY_VARIABLE)
    if configured is not None:
        return os.path.expanduser(configured) or None
    return os.path.join(os.path.expanduser("~"), ".einflow_history")


class EinflowCompleter(Completer):
    """Completes ``:commands``, bound tensor names, function names and keywords, and file names for :load/:save.

    >>> from prompt_toolkit.document import Document
    >>> session = Session(); _ = session.execute(":zeros weights 3")
    >>> [c.text for c in EinflowCompleter(session).get_completions(Document("2 wei"), None)]
    ['weights']
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.paths = PathCompleter(expanduser=True)

    def get_completions(self, document: Document, complete_event: CompleteEvent | None) -> Iterator[Completion]:
        before = document.text_before_cursor
        stripped = before.lstrip()
        if stripped.startswith(":") and " " not in stripped:
            word = stripped[1:]
            for name in sorted(COMMANDS):
                if name.startswith(word):
                    yield Completion(":" + name, start_position=-len(stripped), display_meta=COMMANDS[name].summary)
            return
        command = stripped[1:].split(" ", 1)[0] if stripped.startswith(":") else ""
        word_match = re.search(r"[A-Za-z_][A-Za-z0-9_]*$", before)
        word = word_match.group(0) if word_match else ""
        if command in ("load", "save"):
            token = before.rsplit(" ", 1)[-1]
            yield from self.paths.get_completions(Document(token, len(token)), complete_event or CompleteEvent())
            if word != token:
                return
        if command == "help":
            candidates: Iterable[str] = sorted(COMMANDS)
        elif command == "style":
            from einflow.shell.highlight import style_names

            candidates = style_names()
        elif command == "backend":
            from einflow.engine.backends import BACKENDS

            candidates = BACKENDS
        else:
            candidates = [*self.session.names(), *FUNCTIONS, *_KEYWORDS]
            if command in ("grad", "jacobian", "hessian", "hessian_diagonal", "laplacian", "jvp", "hvp"):
                candidates.append("wrt")
        if not word:
            return
        for candidate in dict.fromkeys(candidates):
            if candidate.startswith(word) and candidate != word:
                meta = "function" if candidate in FUNCTIONS else ""
                yield Completion(candidate, start_position=-len(word), display_meta=meta)


BANNER = "einflow: type statements like  y[i] = A[i,j] x[j]  or :help;  Ctrl-D or :quit leaves"


def colour_off() -> bool:
    """Whether to draw without colour: ``NO_COLOR`` is set (https://no-color.org) or the terminal is dumb."""
    return bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM", "") in ("dumb", "unknown")


def _print_reply(reply: Reply) -> None:
    from prompt_toolkit import print_formatted_text
    from prompt_toolkit.formatted_text import FormattedText

    if not reply.text:
        return
    if reply.ok or colour_off():
        print(reply.text, flush=True)
    else:
        print_formatted_text(FormattedText([("ansired", reply.text)]))


def check_history(path: str) -> None:
    """Refuse (SessionError) a history file that is not a regular UTF-8 text file: a FIFO would block the
    prompt, a device such as /dev/zero would be read forever. A missing file is fine (it is created).

    >>> check_history("/dev/zero")
    Traceback (most recent call last):
    einflow.shell.replies.SessionError: /dev/zero is a device; only regular history files are read
    """
    if os.path.lexists(path):
        read_text_file(path, "regular history files")


def _open_history(path: str) -> None:
    """Create the history file readable by its owner only (0600); an existing file is left as it is."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))


def _style_of(name: str | None):  # type: ignore[no-untyped-def]
    """The prompt_toolkit style for a highlighting style name (``none``: no colours at all)."""
    from prompt_toolkit.styles import Style, style_from_pygments_cls

    from einflow.shell.highlight import get_style

    style = None if colour_off() else get_style(name)
    return Style([]) if style is None else style_from_pygments_cls(style)


def _enter_bindings(prompt):  # type: ignore[no-untyped-def]
    """Enter runs the statement, unless a bracket is still open: then it starts a ``...>`` line.

    The whole statement is one entry of the buffer (and of the history), so Up recalls all of its lines.
    An empty line ends an unfinished statement (its error shows).
    """
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.utils import is_dumb_terminal

    bindings = KeyBindings()

    @bindings.add("enter")
    def _enter(event) -> None:  # type: ignore[no-untyped-def]
        buffer = event.current_buffer
        text = buffer.text
        at_end = buffer.cursor_position == len(text)
        if at_end and needs_more(text) and text.rsplit("\n", 1)[-1].strip():
            buffer.insert_text("\n")
            if is_dumb_terminal():  # a dumb terminal draws no continuation prompt: write it
                prompt.output.write_raw("\r" + CONTINUATION)
                prompt.output.flush()
            return
        buffer.text = text.rstrip()
        buffer.validate_and_handle()

    return bindings


def _prompt_session(session: Session):  # type: ignore[no-untyped-def]
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.lexers import PygmentsLexer

    from einflow.shell.highlight import EinflowLexer

    path = history_path()
    history = InMemoryHistory()
    if path:
        try:
            check_history(path)
            _open_history(path)
            history = FileHistory(path)
        except (OSError, EinflowError) as error:
            print(f"note: history is not kept ({error}); set {HISTORY_VARIABLE} to a writable file", file=sys.stderr)
    configured = os.environ.get(STYLE_VARIABLE)
    if configured:
        from einflow.shell.highlight import style_names

        if configured in style_names():
            session.style = configured
        else:
            print(f"note: {STYLE_VARIABLE}={configured!r} is not a style; using the default (:style lists them)",
                  file=sys.stderr)
    prompt = PromptSession(history=history, completer=EinflowCompleter(session), lexer=PygmentsLexer(EinflowLexer),
                           style=_style_of(session.style), include_default_pygments_style=False,
                           complete_while_typing=False, enable_history_search=True, multiline=True,
                           prompt_continuation=lambda width, line, soft_wrap: CONTINUATION.rjust(width))
    prompt.key_bindings = _enter_bindings(prompt)
    return prompt


def run_repl(session: Session | None = None) -> int:
    """The interactive loop: Ctrl-C cancels the line (or a running statement), Ctrl-D or :quit leaves."""
    session = session or Session()
    prompt = _prompt_session(session)
    style = session.style
    print(BANNER)
    while True:
        try:
            text = prompt.prompt(PROMPT)
        except KeyboardInterrupt:
            continue
        except EOFError:
            break
        try:
            reply = session.execute(text)
        except KeyboardInterrupt:
            print("interrupted (nothing was changed)", flush=True)
            continue
        _print_reply(reply)
        if session.style != style:  # :style changed it
            style = session.style
            prompt.style = _style_of(style)
        if reply.quit:
            break
    return 0
