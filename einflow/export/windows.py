"""Shifted, strided and gathered reads in exported source (LANGUAGE.md 8.2): the helpers the generated function
defines (``einflow.engine.runtime``'s functions, per dialect) and the plain data its calls pass them.

The engine plans a window with the shapes known (``einflow.engine.affine``); exported code does the same at run
time: ``ranges`` infers each statement's ranges from the arrays' shapes by Tullio's rule, as
``einflow.lang.indices.infer_ranges`` does (without its error messages: a read that cannot fit raises
ValueError), ``window`` reads through positions (a strided view on numpy and torch, zero-padded where a declared
size lets the reads leave the array; one take at flat positions on jax and for gathers), ``scatter`` adds into
a zeroed array (``numpy.add.at``, ``Tensor.index_add_``, ``.at[].add``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from einflow.engine.affine import plain_positions
from einflow.engine.dialect import Dialect
from einflow.engine.helpers import WINDOW_KEYS, helper_text
from einflow.engine.steps import Scatter, Window
from einflow.lang import ir
from einflow.lang.padding import fold

__all__ = ["helper_texts", "window_data", "scatter_data"]

def _fold_text() -> str:
    """``einflow.lang.padding.fold`` itself (one implementation: operators only, so any array module runs it),
    its signature without annotations and its name a placeholder."""
    text = inspect.getsource(fold)
    return re.sub(r"def fold\(.*?\) -> Any:", "def {fold}(position, length, mode):", text, count=1, flags=re.S)


def helper_texts(dialect: Dialect, names: dict[str, str]) -> dict[str, str]:
    """The helpers' texts in ``dialect`` (``names``: np, ranges, flat, fold, window, scatter -> their names here):
    the runtime functions themselves (``einflow.engine.runtime``, a dialect's own where its library differs)."""
    texts = {key: helper_text(dialect, key, names) for key in WINDOW_KEYS if key != "fold"}
    texts["fold"] = _fold_text().replace("{fold}", names["fold"])
    return texts


def window_data(step: Window) -> Any:
    """The window's positions as plain data over its label axes (``einflow.engine.affine.plain_positions``)."""
    return plain_positions(step.positions, step.labels)


def scatter_data(step: Scatter) -> Any:
    """The scatter's positions as plain data over its value's axes: ("plain", axis), ("affine", ((axis,
    coefficient), ...), offset) or ("gather", k, axes)."""
    planned: list[Any] = []
    gather = 0
    for position in step.positions:
        if isinstance(position, str):
            planned.append(("plain", step.arg_labels.index(position)))
        elif isinstance(position, ir.Affine):
            planned.append(("affine", tuple((step.arg_labels.index(i), c) for c, i in position.terms),
                            position.offset))
            if step.modes and step.modes[len(planned) - 1] != "zeros":  # folded (``pad`` modes)
                planned[-1] = (*planned[-1], step.modes[len(planned) - 1])
        else:
            planned.append(("gather", gather, tuple(step.arg_labels.index(i) for i in position.indices)))
            gather += 1
    return tuple(planned)
