"""The interactive front end on prompt_toolkit: the prompt loop, history, Tab completion, highlighting."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator

from prompt_toolkit.completion import CompleteEvent, Completer, Completion, PathCompleter
from prompt_toolkit.document import Document

from einflow.commands import COMMANDS
from einflow.ir import FUNCTIONS
from einflow.session import CONTINUATION, PROMPT, Reply, Session, needs_more

__all__ = ["EinflowCompleter", "history_path", "run_repl"]

HISTORY_VARIABLE = "EINFLOW_HISTORY"
_KEYWORDS = ("sum", "delta", "size")


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
        elif command == "backend":
            from einflow.backends import BACKENDS

            candidates = BACKENDS
        else:
            candidates = [*self.session.names(), *FUNCTIONS, *_KEYWORDS]
            if command in ("grad", "jacobian", "hessian"):
                candidates.append("wrt")
        if not word:
            return
        for candidate in dict.fromkeys(candidates):
            if candidate.startswith(word) and candidate != word:
                meta = "function" if candidate in FUNCTIONS else ""
                yield Completion(candidate, start_position=-len(word), display_meta=meta)


def _print_reply(reply: Reply) -> None:
    from prompt_toolkit import print_formatted_text
    from prompt_toolkit.formatted_text import FormattedText

    if not reply.text:
        return
    plain = "NO_COLOR" in os.environ or os.environ.get("TERM", "") in ("dumb", "unknown")
    if reply.ok or plain:
        print(reply.text, flush=True)
    else:
        print_formatted_text(FormattedText([("ansired", reply.text)]))


def _prompt_session(session: Session):  # type: ignore[no-untyped-def]
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.lexers import PygmentsLexer

    from einflow.lexer import EinflowLexer

    path = history_path()
    history = InMemoryHistory()
    if path:
        try:
            folder = os.path.dirname(path)
            if folder:
                os.makedirs(folder, exist_ok=True)
            with open(path, "a", encoding="utf-8"):
                pass
            history = FileHistory(path)
        except OSError as error:
            print(f"note: history is not kept ({error}); set {HISTORY_VARIABLE} to a writable file", file=sys.stderr)
    return PromptSession(history=history, completer=EinflowCompleter(session), lexer=PygmentsLexer(EinflowLexer),
                         complete_while_typing=False, enable_history_search=True)


def run_repl(session: Session | None = None) -> int:
    """The interactive loop: Ctrl-C cancels the line (or a running statement), Ctrl-D or :quit leaves."""
    session = session or Session()
    prompt = _prompt_session(session)
    print("einflow: type statements like  y[i] = A[i,j] x[j]  or :help;  Ctrl-D or :quit leaves")
    while True:
        try:
            text = prompt.prompt(PROMPT)
            while needs_more(text):
                more = prompt.prompt(CONTINUATION)
                if not more.strip():  # an empty line ends an unfinished statement: its error shows
                    break
                text += "\n" + more
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
        if reply.quit:
            break
    return 0
