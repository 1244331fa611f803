"""`make demo`: a short guided tour through the real `einflow` command (a piped session, then two one-liners)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["einflow_command", "main"]

HERE = Path(__file__).resolve().parent


def einflow_command() -> list[str]:
    """The installed `einflow` console script (next to this Python), else `python -m einflow.shell.cli`."""
    script = Path(sys.executable).with_name("einflow")
    if script.exists():
        return [str(script)]
    found = shutil.which("einflow")
    return [found] if found else [sys.executable, "-m", "einflow.shell.cli"]


def show(title: str, args: list[str], stdin: str | None = None) -> int:
    command = einflow_command()
    shown = " ".join(["einflow", *(f"'{a}'" if " " in a else a for a in args)])
    print(f"\n=== {title}\n$ {shown}{' < examples/tour.ein' if stdin else ''}\n", flush=True)
    done = subprocess.run([*command, *args], input=stdin, text=True)
    return done.returncode


def main() -> int:
    tour = (HERE / "tour.ein").read_text()
    statuses = [
        show("A piped session: bind data, evaluate, plan, gradient, Hessian", ["--echo"], stdin=tour),
        show("A gradient program from the command line",
             ["grad", "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", "--wrt", "w"]),
        show("A plan for shapes you do not have yet",
             ["plan", "y[i] = A[i,j] B[j,k] v[k]", "--shape", "A=1000x2000", "--shape", "B=2000x3000",
              "--shape", "v=3000"]),
    ]
    print("\nInteractive: run `einflow` in a terminal (history, Tab completion, colour; :help lists commands).")
    return max(statuses)


if __name__ == "__main__":
    sys.exit(main())
