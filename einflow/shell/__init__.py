"""The `einflow` command: session, commands, REPL, CLI, notebook magics, highlighting."""
