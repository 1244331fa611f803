"""Count the first call's calls back up the layers: calls from an einflow module into one that imports it.

A module "above" another imports it (directly or through others, function-level imports included); a call
from a module into one above it is an up-call (the render stage calling back into its subclass, a pass calling
the pass that called it). Run from the repository root: ``python benchmarks/upcalls.py``.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import einflow as ef  # noqa: E402

PROGRAM = "h[i] = tanh(W[i,j] x[j] + b[i])\ny = sum[i](h[i] h[i])"
SHAPES = {"W": (4, 3), "x": (3,), "b": (4,)}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each einflow module's einflow imports, function-level ones included."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "einflow").rglob("*.py"):
        name = _module_name(path)
        imported = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("einflow"):
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names if alias.name.startswith("einflow"))
    return {name: {m for m in found if m in graph} for name, found in graph.items()}


def closure(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    reached: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        stack = [start]
        while stack:
            for nxt in graph[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        reached[start] = seen
    return reached


def count(run, functions: bool = False) -> collections.Counter:  # noqa: ANN001
    """The up-calls ``run()`` makes, counted by ``caller -> callee`` module (``functions``: by
    ``module:function``, so that a callback is told by the function that calls it, ``split_product``'s)."""
    below = closure(import_graph())
    found: collections.Counter = collections.Counter()

    def profile(frame, event, arg) -> None:  # noqa: ANN001
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller_frame = frame.f_back
        caller = caller_frame.f_globals.get("__name__", "") if caller_frame is not None else ""
        if callee.startswith("einflow") and caller.startswith("einflow") and callee != caller \
                and caller in below.get(callee, ()) and callee not in below.get(caller, ()):
            pair = [caller.removeprefix("einflow."), callee.removeprefix("einflow.")]
            if functions and caller_frame is not None:
                pair = [f"{pair[0]}:{caller_frame.f_code.co_name}", f"{pair[1]}:{frame.f_code.co_name}"]
            found[" -> ".join(pair)] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return found


def main() -> None:
    arrays = {name: np.random.default_rng(0).standard_normal(shape) for name, shape in SHAPES.items()}
    for label, program in (("program", ef.compile(PROGRAM)), ("gradient", ef.grad(PROGRAM, wrt="W"))):
        found = count(lambda program=program: program(**arrays), functions=True)
        print(f"{label}: {sum(found.values())} up-calls")
        for pair, number in found.most_common():
            print(f"    {number:3d}  {pair}")


if __name__ == "__main__":
    main()
