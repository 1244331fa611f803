"""Pointers for what a user types as in Python or IPython, and how to do a thing in each front end's words."""

from __future__ import annotations

from einflow.shell.replies import NAME

__all__ = ["typed_hint", "front_end_hint"]

_HELP_HINT = "this is the einflow session: :help lists the commands, :help NAME explains one"
_QUIT_HINT = "to leave the session type :quit (or press Ctrl-D)"
_HINTS = {"help": _HELP_HINT, "?": _HELP_HINT, "exit": _QUIT_HINT, "quit": _QUIT_HINT}


def typed_hint(text: str) -> str:
    """A pointer to the session's own command for words typed as in Python or IPython ("" for none).

    >>> typed_hint("exit()")
    'to leave the session type :quit (or press Ctrl-D)'
    """
    word = text.rstrip("()").strip()
    if word in _HINTS:
        return _HINTS[word]
    if text.startswith("?") or (text.endswith("?") and NAME.match(text.rstrip("?").strip())):
        return _HINTS["?"]
    if text.startswith("%"):
        magic = text[1:].split(None, 1)[0] if len(text) > 1 else ""
        if magic in ("time", "timeit"):
            return f"%{magic} is IPython's; here it is  :time STATEMENT  (e.g. :time y[i] = A[i,j] x[j])"
        return "'%' starts an IPython magic, not an einflow statement; the session's commands start " \
               "with ':' (:help lists them)"
    return ""


def front_end_hint(front_end: str, what: str, *words: str) -> str:
    """How to do ``what`` ("bind" a name, take the "jacobian" of ``words[0]`` wrt ``words[1:]``) in a front end:
    ``:commands`` at the prompt ("repl"), Python and magics in a notebook ("notebook").

    >>> front_end_hint("repl", "jacobian", "H", "W1"), front_end_hint("notebook", "grad", "L", "W")
    (':jacobian H wrt W1', '%einflow_grad L wrt W')
    """
    notebook = front_end == "notebook"
    if what == "bind":
        return ("assign it in Python (e.g. W = np.ones((3, 4))) or compute it in an %%einflow cell" if notebook
                else "bind it with :set, :randn, :load or a statement (:vars lists what is bound)")
    target, wrt = words[0], ", ".join(words[1:])
    return f"%einflow_{what} {target} wrt {wrt}" if notebook else f":{what} {target} wrt {wrt}"
