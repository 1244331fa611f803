"""Export einflow programs: standalone Python source, LaTeX index notation, Graphviz DOT text."""

from einflow.export.dot import to_dot
from einflow.export.latex import to_latex
from einflow.export.python import to_source

__all__ = ["to_source", "to_latex", "to_dot"]
