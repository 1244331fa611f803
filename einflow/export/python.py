"""Export a program as standalone Python source that needs only numpy and opt_einsum.

The source is the lowered program (``einflow.engine.lower``: the same steps the executor runs and the plan
report lists) rendered without shapes by ``einflow.engine.codegen``: one line per step, a comment with the
einflow statement each block implements, contractions as ``opt_einsum.contract``.
"""

from __future__ import annotations

import builtins
from typing import Any

from einflow.engine.codegen import Source, usable
from einflow.engine.dialect import DIALECTS, Dialect
from einflow.engine.helpers import HELPER_KEYS, WINDOW_KEYS, WINDOW_NEEDS
from einflow.engine.lower import lower
from einflow.engine.steps import Inferred, Lowered, Scatter, SizeRef, Step, Window
from einflow.export.windows import helper_texts, scatter_data, window_data
from einflow.lang import ir
from einflow.lang.check import as_checked
from einflow.lang.errors import EinflowError
from einflow.lang.functions import FUNCTION_RULES

__all__ = ["to_source"]

# Elementwise functions as the generated code calls them (one row per function in einflow.lang.functions)
_CALLS: dict[str, str] = {name: rule.source for name, rule in FUNCTION_RULES.items()}


def _tensor_names(program: ir.ProgramIR) -> set[str]:
    """Every name the program uses for a tensor or an index (generated names must avoid them)."""
    names: set[str] = set()
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            if statement.target is not None:
                names.add(statement.target)
            names.update(node.name for node in ir.walk(statement.expr) if isinstance(node, ir.Tensor))
        elif isinstance(statement, ir.SizeDecl):
            names.update(statement.names)
            if isinstance(statement.source, str):
                names.add(statement.source)
        else:
            names.update(statement.names)
    return names


def _tuple(names: list[str]) -> str:
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


class _Exported(Source):
    """The generic rendering, with shifted and gathered reads: each statement's ranges inferred from the arrays'
    shapes at run time (``einflow.export.windows``), windows and scatter-adds by the helpers defined there."""

    def __init__(self, lowered: Lowered, taken: set[str], dialect: Dialect) -> None:
        super().__init__(lowered, taken, dialect)
        self.ranges = {entry[0]: entry for entry in lowered.ranges}
        self.range_names: dict[int, str] = {}
        self.window_helpers: dict[str, str] = {}

    def window_helper(self, key: str) -> str:
        if not self.window_helpers:
            self.window_helpers = {key: self.fresh("_" + key) for key in WINDOW_KEYS}
            for need in WINDOW_NEEDS:  # the operations they are written over
                self.helper(need)
        return self.window_helpers[key]

    def size(self, ref: SizeRef) -> str:
        if isinstance(ref, Inferred):
            return f"{self.range_names[ref.statement]}[{ref.index!r}]"
        return super().size(ref)

    def window(self, step: Window | Scatter) -> str:  # type: ignore[override]
        gathers = "".join(f", {self.var(g)}" for g in step.gathers)
        if isinstance(step, Window):
            mode = f", mode={step.mode!r}" if step.mode != "zeros" else ""
            return (f"{self.window_helper('window')}({self.var(step.arg)}, {self.shape_text(step.sizes)}, "
                    f"{window_data(step)!r}{gathers}{mode})")
        return (f"{self.window_helper('scatter')}({self.var(step.arg)}, {self.shape_text(step.sizes)}, "
                f"{scatter_data(step)!r}{gathers})")

    def step_lines(self, step: Step) -> list[str]:
        lines = []
        for statement, known, reads, padded in self.lowered.ranges:  # the ranges of this statement and before
            if statement > step.statement or statement in self.range_names:
                continue
            sizes = ", ".join(f"{index!r}: {self.size(ref)}" for index, ref in known if ref != -1)
            listed = ", ".join(f"({self.size(length)}, {terms!r}, {offset}, {lenient})"
                               for length, terms, offset, lenient in reads)
            name = self.fresh(f"_ranges{statement}")
            lines.append(f"{name} = {self.window_helper('ranges')}(({listed},), {{{sizes}}}, {padded!r})")
            self.range_names[statement] = name
        return lines + super().step_lines(step)


def to_source(program: Any, name: str = "f", target: str = "numpy") -> str:
    """Standalone Python source of one function ``name(*, <inputs>)`` computing ``program``.

    The source imports only the array module of ``target`` (``"numpy"``, ``"torch"`` or ``"jax"``,
    i.e. ``jax.numpy``) and opt_einsum (under private aliases), has one line per contraction or
    elementwise step, and a comment with the einflow statement each block implements. The torch and
    jax versions take and return tensors / jax arrays and are differentiable by their framework.

    >>> import numpy as np, einflow as ef
    >>> source = ef.compile("C[i,j] = A[i,k] B[k,j]").to_source("matmul")
    >>> namespace = {}
    >>> exec(source, namespace)
    >>> namespace["matmul"](A=np.eye(2), B=np.ones((2, 3))).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """
    grouped = getattr(program, "gradients_as_tuple", None)
    program = as_checked(program)
    if not isinstance(name, str) or not usable(name) or name in dir(builtins):
        raise EinflowError(f"cannot name the generated function {name!r}: use a Python identifier that is not a "
                           "keyword or a builtin name")
    dialect = DIALECTS.get(target) if isinstance(target, str) else None
    if dialect is None:
        raise EinflowError(f"to_source: target={target!r} is not one of {', '.join(map(repr, DIALECTS))}")
    lowered = lower(program)
    source = _Exported(lowered, _tensor_names(program.ir) | {name}, dialect)
    body: list[str] = []
    inputs = [source.vars[k] for k in range(len(lowered.inputs))]
    if source.keyword_inputs:
        kwargs = source.fresh("_arrays")
        for tensor, var in source.keyword_inputs:
            body.append(f"    {var} = {kwargs}.pop({tensor!r})")
        body.append(f"    if {kwargs}:")
        body.append(f"        raise TypeError(f\"unexpected arguments: {{sorted({kwargs})}}\")")
    if inputs:
        convert = source.helper("input")
        body.append("    # inputs as einflow sees them: arrays, with Python int/float kept as weak scalars")
        line = f"    {', '.join(inputs)} = " + ", ".join(f"{convert}({var})" for var in inputs)
        body.extend([line] if len(line) <= 100 else [f"    {var} = {convert}({var})" for var in inputs])
    body.extend(source.body())
    output = source.helper("output")
    returned = [f"{output}({value})" for value in source.returned()]
    # value_and_grad programs group their gradients when called (einflow.derivatives.ValueAndGrad)
    if lowered.returns_tuple and grouped is not None and len(returned) > 1:
        rest = _tuple(returned[1:]) if grouped else returned[1]
        body.append(f"    return ({returned[0]}, {rest})")
    elif lowered.returns_tuple:
        body.append(f"    return {_tuple(returned)}")
    else:
        body.append(f"    return {returned[0]}")
    alias = source.alias
    module = dialect.module
    header = [f'"""Generated by einflow.export.to_source: needs only {module} and opt_einsum."""', "",
              f"import {module} as {alias['np']}", f"import opt_einsum as {alias['oe']}", ""]
    for key in HELPER_KEYS:
        if key in source.used_helpers:
            header.extend(["", source.helper_text(key), ""])
    if source.window_helpers:
        texts = helper_texts(dialect, {**alias, **source.window_helpers})
        header.extend(line for key in WINDOW_KEYS for line in ("", texts[key], ""))
    parameters = list(source.parameters)
    if source.keyword_inputs:
        parameters.append("**" + kwargs)
    signature = f"*, {', '.join(parameters)}" if source.parameters else ", ".join(parameters)
    program_text = ir.format_program(program.ir).replace("\\", "\\\\")
    doc = "\n".join("        " + line for line in program_text.splitlines())
    header.extend(["", f"def {name}({signature}):", '    """Compute the einflow program', "", doc, '    """'])
    return "\n".join(header + body) + "\n"
