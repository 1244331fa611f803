"""Export a program as standalone Python source that needs only numpy and opt_einsum.

The source is the lowered program (``einflow.engine.lower``: the same steps the executor runs and the plan
report lists) rendered without shapes by the rows of ``einflow.engine.codegen`` over a shape-free context: one
line per step, a comment with the einflow statement each block implements, contractions as
``opt_einsum.contract``; shifted and gathered reads by the helpers of ``einflow.export.windows``.
"""

from __future__ import annotations

import builtins
from typing import Any

from einflow.engine import codegen
from einflow.engine.context import Names, RenderContext, generic_booleans, usable
from einflow.engine.dialect import DIALECTS
from einflow.engine.helpers import HELPER_KEYS, WINDOW_KEYS, defined_helpers, helper_text
from einflow.engine.lower import lower
from einflow.engine.steps import Scatter, Step, Window
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


def _window_text(cx: RenderContext, step: Window | Scatter) -> str:
    """A shifted or gathered read without shapes: the helpers of ``einflow.export.windows`` over the ranges its
    statement inferred from the arrays' shapes when the code runs."""
    gathers = "".join(f", {cx.var(g)}" for g in step.gathers)
    helpers = cx.names.once
    if "ranges" not in helpers:
        _name_window_helpers(cx)
    cx.names.used_helpers.add("window" if isinstance(step, Window) else "scatter")
    if isinstance(step, Window):
        mode = f", mode={step.mode!r}" if step.mode != "zeros" else ""
        return (f"{helpers['window']}({cx.var(step.arg)}, {codegen.shape_text(cx, step.sizes)}, "
                f"{window_data(step)!r}{gathers}{mode})")
    return (f"{helpers['scatter']}({cx.var(step.arg)}, {codegen.shape_text(cx, step.sizes)}, "
            f"{scatter_data(step)!r}{gathers})")


def _name_window_helpers(cx: RenderContext) -> None:
    """Name the window helpers (``einflow.export.windows``), once, the first time a read needs them (the source
    defines those its code calls, ``ranges``, ``window``, ``scatter``, and what they call)."""
    for key in WINDOW_KEYS:
        cx.names.once[key] = cx.fresh("_" + key)


def _step_lines(cx: RenderContext, step: Step) -> list[str]:
    """A step's lines without shapes, after the ranges of its statement and those before (shifted reads: each
    statement's ranges inferred from the arrays' shapes at run time)."""
    lines = []
    for statement, known, reads, padded in cx.lowered.ranges:
        if statement > step.statement or statement in cx.range_names:
            continue
        sizes = ", ".join(f"{index!r}: {codegen.size(cx, ref)}" for index, ref in known if ref != -1)
        listed = ", ".join(f"({codegen.size(cx, length)}, {terms!r}, {offset}, {lenient})"
                           for length, terms, offset, lenient in reads)
        name = cx.fresh(f"_ranges{statement}")
        if "ranges" not in cx.names.once:
            _name_window_helpers(cx)
        lines.append(f"{name} = {cx.names.once['ranges']}(({listed},), {{{sizes}}}, {padded!r})")
        cx.names.used_helpers.add("ranges")
        cx.range_names[statement] = name
    if isinstance(step, (Window, Scatter)):
        return [*lines, f"{cx.var(step.out)} = {_window_text(cx, step)}"]
    return lines + codegen.step_lines(cx, step)


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
    names = Names(lowered, _tensor_names(program.ir) | {name})
    cx = RenderContext(names, lowered, dialect, generic_booleans(lowered), tensor_literals=dialect.typed_literals)
    body: list[str] = []
    inputs = [names.vars[k] for k in range(len(lowered.inputs))]
    if names.keyword_inputs:
        kwargs = names.fresh("_arrays")
        for tensor, var in names.keyword_inputs:
            body.append(f"    {var} = {kwargs}.pop({tensor!r})")
        body.append(f"    if {kwargs}:")
        body.append(f"        raise TypeError(f\"unexpected arguments: {{sorted({kwargs})}}\")")
    if inputs:
        convert = names.helper("input")
        body.append("    # inputs as einflow sees them: arrays, with Python int/float kept as weak scalars")
        line = f"    {', '.join(inputs)} = " + ", ".join(f"{convert}({var})" for var in inputs)
        body.extend([line] if len(line) <= 100 else [f"    {var} = {convert}({var})" for var in inputs])
    number = 0
    for comment, steps in codegen.statement_steps(lowered):
        body.append(comment)
        for step in steps:
            number = codegen.annotate(cx, step, _step_lines(cx, step), number, body)
    output = names.helper("output")
    returned = [f"{output}({value})" for value in codegen.returned(cx)]
    # value_and_grad programs group their gradients when called (einflow.derivatives.ValueAndGrad)
    if lowered.returns_tuple and grouped is not None and len(returned) > 1:
        rest = _tuple(returned[1:]) if grouped else returned[1]
        body.append(f"    return ({returned[0]}, {rest})")
    elif lowered.returns_tuple:
        body.append(f"    return {_tuple(returned)}")
    else:
        body.append(f"    return {returned[0]}")
    alias = names.alias
    module = dialect.module
    header = [f'"""Generated by einflow.export.to_source: needs only {module} and opt_einsum."""', "",
              f"import {module} as {alias['np']}", f"import opt_einsum as {alias['oe']}", ""]
    defined = defined_helpers(dialect, names.used_helpers)  # and what they call, in this dialect
    for key in HELPER_KEYS:
        if key in defined:
            header.extend(["", helper_text(dialect, key, alias), ""])
    if "ranges" in names.once:
        window_helpers = {key: names.once[key] for key in WINDOW_KEYS}
        texts = helper_texts(dialect, {**alias, **window_helpers})
        header.extend(line for key in WINDOW_KEYS if key in defined for line in ("", texts[key], ""))
    parameters = list(names.parameters)
    if names.keyword_inputs:
        parameters.append("**" + kwargs)
    signature = f"*, {', '.join(parameters)}" if names.parameters else ", ".join(parameters)
    program_text = ir.format_program(program.ir).replace("\\", "\\\\")
    doc = "\n".join("        " + line for line in program_text.splitlines())
    header.extend(["", f"def {name}({signature}):", '    """Compute the einflow program', "", doc, '    """'])
    return "\n".join(header + body) + "\n"
