"""``python -m einflow``: the einflow command line (the same as the ``einflow`` command)."""

from __future__ import annotations

import sys

from einflow.shell.cli import main

if __name__ == "__main__":
    sys.exit(main())
