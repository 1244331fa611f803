"""The `einflow` command: session, commands, REPL, CLI, notebook magics, highlighting."""

from einflow.shell import commands  # registers the :command table with einflow.shell.session

__all__ = ["commands"]
