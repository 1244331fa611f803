"""Render a program's data flow (and, given shapes, its plan's FLOPs) as Graphviz DOT text."""

from __future__ import annotations

from typing import Any

from einflow.engine.backends import get_backend
from einflow.engine.plan import build_plan
from einflow.lang import ir
from einflow.lang.check import as_checked

__all__ = ["to_dot"]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _references(expr: ir.Expr) -> list[str]:
    return list(dict.fromkeys(node.name for node in ir.walk(expr) if isinstance(node, ir.Tensor)))


def to_dot(program: Any, **shapes: Any) -> str:
    """Graphviz DOT text: inputs as ellipses, each statement as a box fed by the tensors it reads.

    Given input shapes (as for ``Program.plan``), each box also shows the FLOPs of its plan steps.
    No graphviz package is needed; render the text with ``dot -Tsvg``.

    >>> import einflow as ef
    >>> print(to_dot(ef.compile("y[i] = A[i,j] x[j]")))
    digraph einflow {
      rankdir=LR;
      node [fontname="monospace"];
      "A" [shape=ellipse];
      "x" [shape=ellipse];
      "y" [shape=box, peripheries=2, label="y[i] = A[i,j] x[j]"];
      "A" -> "y";
      "x" -> "y";
    }
    """
    flops: dict[str, int] = {}
    if shapes:
        for step in _plan_steps(program, shapes):
            flops[step.statement] = flops.get(step.statement, 0) + step.flops
    program = as_checked(program)
    outputs = set(program.info.outputs)
    lines = ["digraph einflow {", "  rankdir=LR;", '  node [fontname="monospace"];']
    for name in program.inputs:
        lines.append(f"  {_quote(name)} [shape=ellipse];")
    edges: list[str] = []
    for number, statement in enumerate(program.ir.statements):
        if not isinstance(statement, ir.Assign):
            continue
        text = ir.format_statement(statement)
        node = statement.target if statement.target is not None else f"(value {number + 1})"
        label = text + (f"\n{flops[text]:,} FLOPs" if text in flops else "")
        border = ", peripheries=2" if statement.target in outputs or statement.target is None else ""
        lines.append(f"  {_quote(node)} [shape=box{border}, label={_quote(label)}];")
        edges.extend(f"  {_quote(source)} -> {_quote(node)};" for source in _references(statement.expr))
    return "\n".join(lines + edges + ["}"])


def _plan_steps(program: Any, shapes: dict[str, Any]) -> Any:
    """The plan's steps for these shapes: ``Program.plan`` for a program, the engine's plan for text."""
    if hasattr(program, "plan"):
        return program.plan(**shapes).steps
    data = as_checked(program)
    sized = {name: tuple(shapes[name]) for name in data.inputs}
    return build_plan(data.ir, data.info, sized, 8, get_backend("numpy"), "auto", None, data.source).steps
