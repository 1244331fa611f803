"""Resident-memory peaks measured in a child process: VmHWM after a reset through /proc/self/clear_refs."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["resident_growth", "run_child"]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _field(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key + ":"))


def resident_growth(call: Callable[[], Any]) -> int:
    """Bytes the resident set grows by while ``call()`` runs, after one warm-up call (plans, first pages)."""
    value = call()
    del value
    gc.collect()
    before = _field("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS
    value = call()
    grown = _field("VmHWM") - before
    del value
    return grown


def run_child(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """Run ``code`` in a fresh interpreter (this folder importable, one BLAS thread) and decode the JSON its
    last printed line holds."""
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([ROOT, HERE]), **(env or {})}
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                               cwd=ROOT, env=environment)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])
