"""The plan report: each step with its FLOPs and intermediate size, totals, the largest intermediate."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from einflow.engine.memory import format_bytes
from einflow.engine.paths import EXACT_OPERANDS
from einflow.engine.plan import PlanStep

__all__ = ["PlanReport"]


def _human(count: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(count) < 1000 or unit == "T":
            return f"{count:.3g}{unit}"
        count /= 1000
    return str(count)  # pragma: no cover




@dataclass
class PlanReport:
    """What a program will do for given shapes. ``str(report)`` is a readable table."""

    program: str
    steps: list[PlanStep]
    output_shapes: tuple[tuple[int, ...], ...]
    #: predicted peak bytes of one run: results and intermediates alive at once (what the memory guard compares)
    peak_bytes: int = 0
    #: the memory limit the plan was made for (bytes; None: not checked)
    memory_limit: float | None = None

    @property
    def flops(self) -> int:
        """Total floating point operations (opt_einsum's count for contractions, one per element otherwise)."""
        return sum(step.flops for step in self.steps)

    @property
    def largest_intermediate(self) -> int:
        """Elements in the largest array any step creates (including inside a contraction)."""
        sizes = [step.largest if step.chunked else max(step.largest, math.prod(step.shape)) for step in self.steps]
        return max(sizes, default=0)

    @property
    def largest_bytes(self) -> int:
        """Bytes of the largest intermediate."""
        return max(((step.largest if step.chunked else max(step.largest, math.prod(step.shape))) * step.itemsize
                    for step in self.steps), default=0)

    @property
    def sliced(self) -> list[PlanStep]:
        """The steps sliced (or computed in chunks) to fit the memory limit."""
        return [step for step in self.steps if step.slices > 1]

    @property
    def planning_seconds(self) -> float:
        """Seconds spent choosing the contraction paths (when first planned; a cached path costs nothing)."""
        return sum(step.path.seconds for step in self.steps if step.path is not None)

    def large_products(self) -> list[PlanStep]:
        """The contractions of more than ``EXACT_OPERANDS`` operands, whose path a heuristic or search chose."""
        return [step for step in self.steps if step.path is not None and len(step.pairwise) >= EXACT_OPERANDS]

    @property
    def contractions(self) -> int:
        return sum(1 for step in self.steps if step.kind == "contract")

    def __str__(self) -> str:
        lines = ["plan for:", *("  " + line for line in self.program.splitlines()), ""]
        header = f"  {'#':>3}  {'kind':<11} {'FLOPs':>9}  {'output shape':<16} step"
        lines.append(header)
        lines.append("  " + "-" * (len(header) + 20))
        current = None
        for number, step in enumerate(self.steps, 1):
            if step.statement != current:
                current = step.statement
                lines.append(f"  {current}")
            lines.append(f"  {number:>3}  {step.kind:<11} {_human(step.flops):>9}  {str(step.shape):<16} "
                         f"{step.equation}")
            if len(step.pairwise) > 1:
                for pair, flops, shape in step.pairwise:
                    lines.append(f"  {'':>3}  {'  pairwise':<11} {_human(flops):>9}  {str(shape):<16}   {pair}")
            if step.path is not None and len(step.pairwise) >= EXACT_OPERANDS:  # a large product
                lines.append(f"  {'':>3}  {'':<11} {'':>9}  {'':<16}   {step.path.describe()}")
            if step.slices > 1:
                how = "sliced" if step.kind == "contract" else "in chunks"
                lines.append(f"  {'':>3}  {'  ' + how:<11} {'':>9}  {'':<16}   over [{','.join(step.sliced)}]: "
                             f"{step.slices} slices, FLOP overhead {step.overhead:.2f}x")
        lines.append("")
        lines.append(f"  total FLOPs: {_human(self.flops)}   contractions: {self.contractions}   "
                     f"largest intermediate: {_human(self.largest_intermediate)} elements "
                     f"({format_bytes(self.largest_bytes)})   peak memory: {format_bytes(self.peak_bytes)}")
        if self.memory_limit is not None:
            sliced = f"; {len(self.sliced)} step(s) sliced to fit" if self.sliced else ""
            lines.append(f"  memory limit: {format_bytes(self.memory_limit)}{sliced}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:  # Jupyter: the same report as an HTML table
        return _html(self)


def _html(report: PlanReport) -> str:
    """The plan report as an HTML table: one row per step (FLOPs, output shape, the step), then totals."""
    cells = "padding:2px 8px;text-align:{}"
    out = ['<div class="einflow-plan">',
           f"<pre style='margin:0 0 4px 0'>{html.escape(report.program)}</pre>",
           "<table><thead><tr>" + "".join(f"<th style='{cells.format(align)}'>{title}</th>" for title, align in
                                          (("#", "right"), ("kind", "left"), ("FLOPs", "right"),
                                           ("output shape", "left"), ("step", "left"))) + "</tr></thead><tbody>"]
    current = None
    for number, step in enumerate(report.steps, 1):
        if step.statement != current:
            current = step.statement
            out.append(f"<tr><td colspan='5' style='{cells.format('left')}'><code>{html.escape(current)}</code>"
                       "</td></tr>")
        row = [str(number), step.kind, f"{step.flops:,}", str(tuple(step.shape)), step.equation]
        aligns = ("right", "left", "right", "left", "left")
        out.append("<tr>" + "".join(f"<td style='{cells.format(align)}'>{html.escape(text)}</td>"
                                    for text, align in zip(row, aligns)) + "</tr>")
    largest = max((max(step.largest, math.prod(step.shape)) for step in report.steps), default=0)
    out.append("</tbody></table>")
    out.append(f"<p>total FLOPs: {report.flops:,} &nbsp; contractions: {report.contractions} &nbsp; "
               f"largest intermediate: {largest:,} elements ({report.largest_bytes:,} bytes)</p></div>")
    return "\n".join(out)
