"""Export a program as standalone Python source that needs only numpy and opt_einsum.

The generator walks the IR with the same index rules as einflow.plan (products are one
contraction, deltas are substituted where an index is summed and written into a diagonal of a
zeroed output where they survive, sums align their terms by index name, explicit targets reduce
each top-level term on its own), so the generated function computes the same numbers.
"""

from __future__ import annotations

import builtins
import keyword
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import opt_einsum as oe

from einflow import ir
from einflow.check import free_indices, top_level_terms
from einflow.contraction import eliminate_deltas, product_output, split_product
from einflow.errors import EinflowError, ShapeError
from einflow.numbers import _fold_power, _is_unit, _weak

__all__ = ["to_source"]

# Elementwise functions, written exactly as einflow.functions evaluates them ({np}: numpy's alias).
_CALLS: dict[str, str] = {
    "exp": "{np}.exp({x})",
    "log": "{np}.log({x})",
    "log1p": "{np}.log1p({x})",
    "sqrt": "{np}.sqrt({x})",
    "sin": "{np}.sin({x})",
    "cos": "{np}.cos({x})",
    "tanh": "{np}.tanh({x})",
    "sigmoid": "{sigmoid}({x})",  # a generated helper, the same formula as einflow.functions
    "abs": "{np}.abs({x})",
    "relu": "{np}.maximum({x}, 0)",
    "sign": "{np}.sign({x})",
    "step": "{np}.greater({x}, 0).astype({np}.result_type({x}))",
}

# Private helpers the generated module may need; {np} and the helper names are substituted.
_HELPERS: dict[str, str] = {
    "input": '''def {input}(x):
    """An input as einflow receives it: Python int/float stay weak scalars, the rest become arrays."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x
    return {np}.asarray(x)''',
    "as_float": '''def {as_float}(x):
    """Integer (and bool) values promoted to float64, as einflow does for negative or fractional powers."""
    if {np}.result_type(x).kind in "biu":
        return x.astype({np}.float64) if hasattr(x, "astype") else float(x)
    return x''',
    "reciprocal": '''def {reciprocal}(x):
    """x ** -1 with einflow's promotion of integers to float64."""
    if isinstance(x, (int, float)):
        return 1.0 / x if x != 0 else float({np}.copysign({np}.inf, x))
    return {np}.reciprocal({as_float}(x))''',
    "sigmoid": '''def {sigmoid}(x):
    """1 / (1 + exp(-x)) without overflow, accurate in both tails (as einflow computes it)."""
    e = {np}.exp(-1 * {np}.abs(x))
    r = 1 / (1 + e)
    return {np}.where(x >= 0, r, e * r)''',
    "delta_scale": '''def {delta_scale}(x, c, *inputs):
    """Deltas alone, scaled by c: numbers of the inputs' floating type when they have one (as einflow does)."""
    floats = [a.dtype for a in inputs if getattr(a, "dtype", None) is not None and a.dtype.kind == "f"]
    return (x.astype({np}.result_type(*floats)) if floats else x) * c''',
}
_HELPER_NEEDS = {"reciprocal": ("as_float",)}


class _Var:
    """A Python variable of the generated function; renamed in place when a statement's result gets its name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


Part = str | _Var


@dataclass(frozen=True)
class _Value:
    """A generated value: a variable with axis labels, or a compile-time number."""

    var: _Var | None
    labels: tuple[str, ...] = ()
    const: int | float | None = None


@dataclass
class _Line:
    """One line of the function body; ``parts`` mix text and variables."""

    parts: list[Part]
    note: str = ""

    def render(self) -> str:
        text = "".join(part.name if isinstance(part, _Var) else part for part in self.parts)
        return f"    {text}  # {self.note}" if self.note else f"    {text}"


def _usable(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and name != "__debug__"


def _number(value: int | float, np_alias: str) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return repr(value)
    if math.isnan(value):
        return f"{np_alias}.nan"
    if math.isinf(value):
        return f"{np_alias}.inf" if value > 0 else f"-{np_alias}.inf"
    return repr(float(value))


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


def _has_delta(expr: ir.Expr) -> bool:
    return any(isinstance(node, ir.Delta) for node in ir.walk(expr))


def _mentioned(expr: ir.Expr) -> frozenset[str]:
    if isinstance(expr, ir.Tensor):
        return frozenset(expr.indices)
    if isinstance(expr, ir.Delta):
        return frozenset((expr.first, expr.second))
    if isinstance(expr, ir.Product):
        return frozenset().union(*(_mentioned(f) for f in expr.factors))
    if isinstance(expr, ir.Sum):
        return frozenset().union(*(_mentioned(t) for t in expr.terms))
    if isinstance(expr, ir.Call):
        return _mentioned(expr.arg)
    if isinstance(expr, ir.Power):
        return _mentioned(expr.base)
    if isinstance(expr, ir.Reduce):
        return _mentioned(expr.body) | frozenset(expr.indices)
    return frozenset()


@dataclass
class _Statement:
    """Per-statement state: where each index's size can be read at run time."""

    number: int
    sizes: dict[str, list[Part]] = field(default_factory=dict)
    partners: list[tuple[str, str]] = field(default_factory=list)
    created: set[int] = field(default_factory=set)


class _Generator:
    def __init__(self, program: Any, name: str) -> None:
        self.program_ir: ir.ProgramIR = program.ir
        # value_and_grad programs group their gradients when called (einflow.autodiff's _ValueAndGrad)
        self.gradients_as_tuple: bool | None = getattr(program, "gradients_as_tuple", None)
        self.info = program.info
        self.function_name = name
        self.taken = _tensor_names(self.program_ir) | {name} | set(dir(builtins))
        self.alias = {key: self.fresh(value) for key, value in (
            ("np", "_np"), ("oe", "_oe"), ("input", "_input"), ("as_float", "_as_float"),
            ("reciprocal", "_reciprocal"), ("delta_scale", "_delta_scale"), ("sigmoid", "_sigmoid"))}
        self.used_helpers: set[str] = set()
        self.lines: list[_Line] = []
        self.names: dict[str, _Value] = {}
        self.memo: dict[Any, _Value] = {}
        self.declared: dict[str, list[Part]] = {}
        self.temp_count = 0
        self.statement = _Statement(0)
        self.fold_namespace: dict[str, Any] | None = None
        self.synthetic: set[int] = set()  # ids of the boolean ones that stand in for deltas

    # ------------------------------------------------------------------ names and lines
    def fresh(self, base: str) -> str:
        candidate, number = base, 0
        while candidate in self.taken or not _usable(candidate):
            number += 1
            candidate = f"{base}_{number}"
        self.taken.add(candidate)
        return candidate

    def temp(self) -> _Var:
        self.temp_count += 1
        var = _Var(self.fresh(f"_t{self.temp_count}"))
        self.statement.created.add(id(var))
        return var

    def emit(self, parts: list[Part], note: str = "") -> _Var:
        """Emit ``var = parts`` and return the new variable."""
        var = self.temp()
        self.lines.append(_Line([var, " = ", *parts], note))
        return var

    def helper(self, key: str) -> str:
        self.used_helpers.add(key)
        for need in _HELPER_NEEDS.get(key, ()):
            self.used_helpers.add(need)
        return self.alias[key]

    def number(self, value: int | float) -> str:
        return _number(value, self.alias["np"])

    def fold(self, template: str, const: int | float) -> int | float:
        """Evaluate an elementwise template on a compile-time number, as einflow.plan folds it."""
        if self.fold_namespace is None:
            namespace: dict[str, Any] = {self.alias["np"]: np}
            for key in ("as_float", "reciprocal", "sigmoid"):
                exec(self.render_helper(key), namespace)  # noqa: S102 - our own helper text
            self.fold_namespace = namespace
        with np.errstate(all="ignore"):
            code = template.format(np=self.alias["np"], x="_x_", sigmoid=self.alias["sigmoid"])
            folded = eval(code, {**self.fold_namespace, "_x_": np.asarray(const)})  # noqa: S307 - our own template
        return folded.item() if hasattr(folded, "item") else folded

    def render_helper(self, key: str) -> str:
        return _HELPERS[key].format(**self.alias)

    # ------------------------------------------------------------------ sizes
    def note_sizes(self, statement: ir.Assign) -> None:
        sizes: dict[str, list[Part]] = {}
        stack: list[ir.Expr] = [statement.expr]
        while stack:
            node = stack.pop()
            if isinstance(node, ir.Tensor):
                value = self.names[node.name]
                if value.var is not None:
                    for axis, index in enumerate(node.indices):
                        sizes.setdefault(index, [value.var, f".shape[{axis}]"])
            elif isinstance(node, ir.Delta):
                self.statement.partners.append((node.first, node.second))
            elif isinstance(node, ir.Product):
                stack.extend(node.factors)
            elif isinstance(node, ir.Sum):
                stack.extend(node.terms)
            elif isinstance(node, ir.Call):
                stack.append(node.arg)
            elif isinstance(node, ir.Power):
                stack.append(node.base)
            elif isinstance(node, ir.Reduce):
                stack.append(node.body)
        for index, source in self.declared.items():
            sizes.setdefault(index, source)
        changed = True
        while changed:
            changed = False
            for first, second in self.statement.partners:
                if first in sizes and second not in sizes:
                    sizes[second] = sizes[first]
                    changed = True
                elif second in sizes and first not in sizes:
                    sizes[first] = sizes[second]
                    changed = True
        self.statement.sizes = sizes

    def size(self, label: str) -> list[Part]:
        found = self.statement.sizes.get(label)
        if found is None:
            raise ShapeError(f"index '{label}' has no size source: declare it with 'size {label} = ...'")
        return found

    def declare(self, statement: ir.SizeDecl) -> None:
        if isinstance(statement.source, int):
            for name in statement.names:
                self.declared[name] = [repr(statement.source)]
            return
        value = self.names[statement.source]
        for axis, name in enumerate(statement.names):
            self.declared[name] = [value.var, f".shape[{axis}]"] if value.var is not None else ["1"]

    # ------------------------------------------------------------------ program
    def generate(self) -> str:
        body: list[str] = []
        self.bind_inputs(body)
        final: _Value | None = None
        returned: list[_Value] = []
        returns_tuple = False
        for number, statement in enumerate(self.program_ir.statements):
            self.statement = _Statement(number)
            self.lines.append(_Line([f"# {ir.format_statement(statement)}"]))
            if isinstance(statement, ir.SizeDecl):
                self.declare(statement)
                continue
            if isinstance(statement, ir.Return):
                returned = [self.materialize(self.names[name]) for name in statement.names]
                returns_tuple = True
                continue
            self.note_sizes(statement)
            value = self.lower_statement(statement)
            if statement.target is not None:
                value = self.name_result(statement.target, value)
                self.names[statement.target] = value
            final = value
        if not returns_tuple:
            assert final is not None
            returned = [self.materialize(final)]
        result: list[Part] = ["return "]
        if returns_tuple and self.gradients_as_tuple is not None and len(returned) > 1:
            # a value_and_grad program: its call returns (value, gradient) or (value, (gradients...))
            result.extend(["(", returned[0].var, ", "])  # type: ignore[list-item]
            result.extend(_tuple_parts([value.var for value in returned[1:]])  # type: ignore[misc]
                          if self.gradients_as_tuple else [returned[1].var])  # type: ignore[list-item]
            result.append(")")
        elif returns_tuple:
            result.extend(_tuple_parts([value.var for value in returned]))  # type: ignore[misc]
        else:
            result.append(returned[0].var)  # type: ignore[arg-type]
        self.lines.append(_Line(result))
        body.extend(line.render() for line in self.lines)
        return self.assemble(body)

    def bind_inputs(self, body: list[str]) -> None:
        self.parameters: list[str] = []
        self.keyword_inputs: list[tuple[str, str]] = []
        converted: list[str] = []
        for name in self.info.inputs:
            if _usable(name):
                var = _Var(name)
                self.parameters.append(name)
            else:
                var = _Var(self.fresh(name + "_"))
                self.keyword_inputs.append((name, var.name))
            self.names[name] = _Value(var)
            converted.append(var.name)
        self.input_vars = list(converted)
        if self.keyword_inputs:
            self.kwargs = self.fresh("_arrays")
            for name, var in self.keyword_inputs:
                body.append(f"    {var} = {self.kwargs}.pop({name!r})")
            body.append(f"    if {self.kwargs}:")
            body.append(f"        raise TypeError(f\"unexpected arguments: {{sorted({self.kwargs})}}\")")
        if converted:
            convert = self.helper("input")
            body.append("    # inputs as einflow sees them: arrays, with Python int/float kept as weak scalars")
            line = f"    {', '.join(converted)} = " + ", ".join(f"{convert}({var})" for var in converted)
            if len(line) <= 100:
                body.append(line)
            else:
                body.extend(f"    {var} = {convert}({var})" for var in converted)

    def assemble(self, body: list[str]) -> str:
        header = [
            '"""Generated by einflow.export.to_source: needs only numpy and opt_einsum."""',
            "",
            f"import numpy as {self.alias['np']}",
            f"import opt_einsum as {self.alias['oe']}",
            "",
        ]
        for key in ("input", "as_float", "reciprocal", "sigmoid", "delta_scale"):
            if key in self.used_helpers:
                header.extend(["", self.render_helper(key), ""])
        parameters = list(self.parameters)
        if self.keyword_inputs:
            parameters.append("**" + self.kwargs)
        signature = f"*, {', '.join(parameters)}" if self.parameters else ", ".join(parameters)
        program_text = ir.format_program(self.program_ir).replace("\\", "\\\\")
        doc = "\n".join("        " + line for line in program_text.splitlines())
        header.extend([
            "",
            f"def {self.function_name}({signature}):",
            '    """Compute the einflow program',
            "",
            doc,
            '    """',
        ])
        return "\n".join(header + body) + "\n"

    def name_result(self, target: str, value: _Value) -> _Value:
        """Give a statement's result the target's name (renaming the last temporary, or an assignment)."""
        wanted = target if _usable(target) and target not in self.alias.values() else None
        if value.var is None:
            var = _Var(wanted or self.fresh(target + "_"))
            self.lines.append(_Line([var, " = ", self.number(value.const)]))  # type: ignore[arg-type]
            return value
        if id(value.var) in self.statement.created and value.var.name.startswith("_t"):
            self.taken.discard(value.var.name)
            if value.var.name == f"_t{self.temp_count}":
                self.temp_count -= 1  # keep the numbering of temporaries dense
            value.var.name = wanted or self.fresh(target + "_")
            return value
        var = _Var(wanted or self.fresh(target + "_"))
        self.lines.append(_Line([var, " = ", value.var]))
        return _Value(var, value.labels)

    def materialize(self, value: _Value) -> _Value:
        if value.var is not None:
            return value
        var = self.emit([f"{self.alias['np']}.asarray({self.number(value.const)})"])  # type: ignore[arg-type]
        return _Value(var, ())

    def lower_statement(self, statement: ir.Assign) -> _Value:
        if statement.indices is None:
            return self.lower(statement.expr, frozenset(), frozenset())
        bound = frozenset(statement.indices)
        terms = []
        for term in top_level_terms(statement.expr):
            extra = frozenset(free_indices(term, bound)) - bound
            if isinstance(term, (ir.Product, ir.Tensor, ir.Delta)):
                # a product term is contracted straight into the target's axis order
                factors = term.factors if isinstance(term, ir.Product) else (term,)
                terms.append(self.lower_product(factors, bound, extra, statement.indices))
            else:
                terms.append(self.lower(term, bound, extra))
        return self.add(terms, statement.indices)

    # ------------------------------------------------------------------ expressions
    def lower(self, expr: ir.Expr, bound: frozenset[str], reduce: frozenset[str]) -> _Value:
        if isinstance(expr, ir.Num):
            return _Value(None, (), _weak(expr.value))
        mentioned = _mentioned(expr)
        key = (expr, bound & mentioned, reduce, self.statement.number if _has_delta(expr) else None)
        found = self.memo.get(key)
        if found is not None:
            return found
        if isinstance(expr, (ir.Tensor, ir.Delta)):
            value = self.lower_product((expr,), bound, reduce)
        elif isinstance(expr, ir.Product):
            value = self.lower_product(expr.factors, bound, reduce)
        elif isinstance(expr, ir.Reduce):
            inner = frozenset(expr.indices)
            value = self.lower(expr.body, bound | inner, reduce | inner)
        elif isinstance(expr, ir.Sum):
            order = free_indices(expr, bound)
            value = self.add([self.lower(term, bound, frozenset()) for term in expr.terms], order)
            value = self.sum_axes(value, reduce)
        elif isinstance(expr, ir.Call):
            template = _CALLS[expr.func]
            if expr.func == "sigmoid":
                template = self.helper("sigmoid") + "({x})"
            value = self.elementwise(template, self.lower(expr.arg, bound, frozenset()), f"{expr.func}(...)")
            value = self.sum_axes(value, reduce)
        elif isinstance(expr, ir.Power):
            value = self.power(self.lower(expr.base, bound, frozenset()), expr.exponent)
            value = self.sum_axes(value, reduce)
        else:  # pragma: no cover
            raise TypeError(expr)
        self.memo[key] = value
        return value

    def elementwise(self, template: str, arg: _Value, note: str) -> _Value:
        if arg.var is None:
            return _Value(None, (), self.fold(template, arg.const))  # type: ignore[arg-type]
        parts = _fill(template.format(np=self.alias["np"], x="\0", sigmoid=self.alias["sigmoid"]), arg.var)
        return _Value(self.emit(parts, f"{note} [{','.join(arg.labels)}]"), arg.labels)

    def power(self, base: _Value, exponent: int | float) -> _Value:
        if base.var is None:
            return _Value(None, (), _fold_power(base.const, exponent))  # type: ignore[arg-type]
        integral = isinstance(exponent, int) or float(exponent).is_integer()
        needs_float = not integral or exponent < 0
        if exponent == 1:
            return base
        if exponent == 2:
            template = "{x} * {x}"
        elif exponent == -1:
            template = self.helper("reciprocal") + "({x})"
        elif exponent == 0.5:
            template = "{np}.sqrt({x})"
        elif needs_float:
            template = "{np}.power(" + self.helper("as_float") + "({x}), " + self.number(exponent) + ")"
        else:
            template = "{np}.power({x}, " + self.number(exponent) + ")"
        return self.elementwise(template, base, f"^{exponent}")

    def sum_axes(self, value: _Value, reduce: frozenset[str]) -> _Value:
        axes = tuple(position for position, label in enumerate(value.labels) if label in reduce)
        if not reduce or not axes or value.var is None:
            return value
        labels = tuple(label for label in value.labels if label not in reduce)
        summed = ",".join(label for label in value.labels if label in reduce)
        var = self.emit([value.var, f".sum(axis={axes!r})"], f"sum over {summed}")
        return _Value(var, labels)

    def add(self, terms: list[_Value], order: tuple[str, ...]) -> _Value:
        constant: int | float = 0
        arrays: list[_Value] = []
        for term in terms:
            if term.var is None:
                constant = _weak(constant + term.const)  # type: ignore[operator]
            else:
                arrays.append(term)
        if not arrays:
            return _Value(None, (), constant)
        has_constant = constant != 0 or isinstance(constant, float)  # + 0.0 still promotes integer arrays
        pieces: list[list[Part]] = []
        for term in arrays:
            present = [label for label in order if label in term.labels]
            permutation = tuple(term.labels.index(label) for label in present)
            piece: list[Part] = [term.var]  # type: ignore[list-item]
            if permutation != tuple(range(len(term.labels))):
                piece.append(f".transpose({permutation!r})")
            if len(present) != len(order) and term.labels:
                piece.append("[" + ", ".join(":" if label in term.labels else "None" for label in order) + "]")
            pieces.append(piece)
        if len(arrays) == 1 and len(pieces[0]) == 1 and not has_constant:
            return arrays[0]
        parts: list[Part] = []
        for position, piece in enumerate(pieces):
            parts.extend(([" + "] if position else []) + piece)
        if has_constant:
            constant_text = self.number(constant)
            parts.append(f" + ({constant_text})" if constant_text.startswith("-") else f" + {constant_text}")
        note = " + ".join(f"[{','.join(term.labels)}]" for term in arrays) + f" -> [{','.join(order)}]"
        return _Value(self.emit(parts, note), tuple(order))

    # ------------------------------------------------------------------ products
    def lower_product(self, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
                      preferred: tuple[str, ...] = ()) -> _Value:
        parts = split_product(factors, self.names.__getitem__, lambda factor: self.lower(factor, bound, frozenset()),
                              lambda value: value.const if value.var is None else None, lambda value: value.labels)
        output, summed = product_output(parts.sequence, bound, reduce, preferred)
        classes = self.eliminate_deltas(parts.operands, parts.deltas, summed, output, parts.scalars)
        return self.contract(parts.operands, output, classes, parts.coefficient, parts.scalars)

    def eliminate_deltas(self, operands: list[tuple[_Value, list[str]]], deltas: list[list[str]],
                         summed: Collection[str], output: list[str], scalars: list[_Value]) -> dict[str, list[str]]:
        """Substitute deltas where an index is summed (as einflow.plan does); ones for uncarried kept labels,
        the size itself (a scalar factor) for uncarried summed ones."""
        classes, missing, counted = eliminate_deltas([labels for _, labels in operands], deltas, summed, output)
        operands.extend((self.ones(label), [label]) for label in missing)
        if counted and not operands:
            operands.append((self.ones(None), []))  # a count alone still has the deltas' numeric type
        for label in counted:
            count = _Value(self.emit(["(", *self.size(label), ")"], f"delta: the size of {label}"), ())
            self.synthetic.add(id(count))
            scalars.append(count)
        return classes

    def ones(self, label: str | None) -> _Value:
        key = ("ones", label, self.statement.number)
        found = self.memo.get(key)
        if found is None:
            shape = ["()"] if label is None else ["(", *self.size(label), ",)"]
            var = self.emit([f"{self.alias['np']}.ones(", *shape, f", dtype={self.alias['np']}.bool_)"],
                            f"delta: ones over {label}" if label else "delta: a count")
            found = self.memo[key] = _Value(var, (label,) if label else ())
            self.synthetic.add(id(found))
        return found

    def contract(self, operands: list[tuple[_Value, list[str]]], output: list[str], classes: dict[str, list[str]],
                 coefficient: int | float, scalars: list[_Value]) -> _Value:
        partners = {member for representative, members in classes.items() for member in members
                    if member != representative}
        inner_output = tuple(label for label in output if label not in partners)
        if not operands:
            if not scalars:
                return _Value(None, (), coefficient)
            parts: list[Part] = []
            for position, scalar in enumerate(scalars):
                parts.extend([" * " if position else "", scalar.var])  # type: ignore[list-item]
            if not _is_unit(coefficient):
                parts.append(" * " + self._factor(coefficient))
            return _Value(self.emit(parts, "scalar product"), ())
        if all(id(value) in self.synthetic for value, _ in [*operands, *((s, ()) for s in scalars)]):
            # deltas alone are booleans: scaling one of them first (even by the int 1) makes the product count
            value, labels = operands[0]
            scale = self.helper("delta_scale")
            counts: list[Part] = []
            for count in scalars:
                counts.extend([" * ", count.var])  # type: ignore[list-item]
            scaled = self.emit([f"{scale}(", value.var, ", " + self.number(coefficient), *counts,  # type: ignore[list-item]
                                *[", " + var for var in self.input_vars], ")"],
                               "deltas alone: numbers of the inputs' floating type")
            operands[0] = (_Value(scaled, value.labels), labels)
            return self.diagonal(self.einsum(operands, inner_output), output, classes)
        result = self.einsum(operands, inner_output)
        if scalars or not _is_unit(coefficient):
            parts = [result.var]  # type: ignore[list-item]
            for scalar in scalars:
                parts.extend([" * ", scalar.var])  # type: ignore[list-item]
            if not _is_unit(coefficient):
                parts.append(" * " + self._factor(coefficient))
            result = _Value(self.emit(parts, "scale"), result.labels)
        return self.diagonal(result, output, classes)

    def _factor(self, value: int | float) -> str:
        text = self.number(value)
        return f"({text})" if text.startswith("-") else text

    def einsum(self, operands: list[tuple[_Value, list[str]]], output: tuple[str, ...]) -> _Value:
        if len(operands) == 1:
            value, labels = operands[0]
            if len(set(labels)) == len(labels):
                keep = tuple(label for label in labels if label in output)
                axes = tuple(position for position, label in enumerate(labels) if label not in output)
                if axes:
                    summed = ",".join(label for label in labels if label not in output)
                    value = _Value(self.emit([value.var, f".sum(axis={axes!r})"],  # type: ignore[list-item]
                                             f"[{','.join(labels)}] -> [{','.join(keep)}]: sum over {summed}"),
                                   keep)
                if keep == output:
                    return _Value(value.var, output)
                permutation = tuple(keep.index(label) for label in output)
                var = self.emit([value.var, f".transpose({permutation!r})"],  # type: ignore[list-item]
                                f"[{','.join(keep)}] -> [{','.join(output)}]")
                return _Value(var, output)
        everything: list[str] = []
        for _, labels in operands:
            for label in labels:
                if label not in everything:
                    everything.append(label)
        letters = {label: oe.get_symbol(position) for position, label in enumerate(everything)}
        equation = ",".join("".join(letters[label] for label in labels) for _, labels in operands)
        equation += "->" + "".join(letters[label] for label in output)
        parts: list[Part] = [f"{self.alias['oe']}.contract({equation!r}"]
        for value, _ in operands:
            parts.extend([", ", value.var])  # type: ignore[list-item]
        parts.append(")")
        note = " ".join(f"[{','.join(labels)}]" for _, labels in operands) + f" -> [{','.join(output)}]"
        return _Value(self.emit(parts, note), output)

    def diagonal(self, value: _Value, output: list[str], classes: dict[str, list[str]]) -> _Value:
        if not classes:
            return value
        value = self.materialize(value)
        representative_of = {member: rep for rep, members in classes.items() for member in members}
        letters = {label: oe.get_symbol(position) for position, label in enumerate(value.labels)}
        spec = "".join(letters[representative_of.get(label, label)] for label in output)
        spec += "->" + "".join(letters[label] for label in value.labels)
        shape: list[Part] = ["("]
        for position, label in enumerate(output):
            shape.extend(([", "] if position else []) + self.size(label))
        shape.append(",)" if len(output) == 1 else ")")
        np_alias = self.alias["np"]
        out = self.emit([f"{np_alias}.zeros(", *shape, ", dtype=", value.var, ".dtype)"],  # type: ignore[list-item]
                        "surviving delta: zeroed output")
        groups = ", ".join("=".join(members) for members in classes.values())
        self.lines.append(_Line([f"{np_alias}.einsum({spec!r}, ", out, ")[...] = ", value.var],  # type: ignore[list-item]
                                f"write the diagonal {groups}"))
        return _Value(out, tuple(output))


def _tuple_parts(variables: list[_Var]) -> list[Part]:
    parts: list[Part] = ["("]
    for position, var in enumerate(variables):
        parts.extend([", " if position else "", var])
    parts.append(",)" if len(variables) == 1 else ")")
    return parts


def _fill(template: str, var: _Var) -> list[Part]:
    """Split a template on the placeholder NUL character, putting ``var`` in each hole."""
    pieces = template.split("\0")
    parts: list[Part] = [pieces[0]]
    for piece in pieces[1:]:
        parts.extend([var, piece])
    return [part for part in parts if part != ""]


def to_source(program: Any, name: str = "f") -> str:
    """Standalone Python source of one function ``name(*, <inputs>)`` computing ``program``.

    The source imports only numpy and opt_einsum (under private aliases), has one line per
    contraction or elementwise step, and a comment with the einflow statement each block implements.

    >>> import numpy as np, einflow as ef
    >>> source = ef.compile("C[i,j] = A[i,k] B[k,j]").to_source("matmul")
    >>> namespace = {}
    >>> exec(source, namespace)
    >>> namespace["matmul"](A=np.eye(2), B=np.ones((2, 3))).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """
    from einflow.program import compile as compile_program

    program = compile_program(program)
    if not isinstance(name, str) or not _usable(name) or name in dir(builtins):
        raise EinflowError(f"cannot name the generated function {name!r}: use a Python identifier that is not a "
                           "keyword or a builtin name")
    return _Generator(program, name).generate()
