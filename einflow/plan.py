"""IR -> Plan: a flat list of instructions, one opt_einsum ContractExpression per product.

A Plan is built once per (program, backend, input shapes and dtypes) and then only executed.
Each register holds an array whose axes are labelled by index names; products become one
contraction, sums align their terms by index name, surviving deltas write into a diagonal view.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import opt_einsum as oe

from einflow import ir
from einflow.backends.base import Backend
from einflow.check import ProgramInfo, free_indices, top_level_terms
from einflow.contraction import eliminate_deltas, product_output, split_product
from einflow.errors import EinflowError, MemoryLimitError, ShapeError, TensorNameError, located
from einflow.kernels import compile_numpy
from einflow.numbers import _fold_power, _is_unit, _weak

__all__ = ["Plan", "PlanStep", "build_plan", "indices_in"]


@dataclass(frozen=True, slots=True)
class Value:
    """A lowered value: register number, axis labels, shape; or a compile-time number."""

    reg: int
    labels: tuple[str, ...]
    shape: tuple[int, ...]
    const: int | float | None = None


@dataclass
class PlanStep:
    """One line of the plan report."""

    statement: str
    kind: str
    equation: str
    flops: int
    shape: tuple[int, ...]
    itemsize: int
    pairwise: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    largest: int = 0  # elements of the largest intermediate inside this step

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass
class Plan:
    """Executable program for one shape signature."""

    instructions: list[tuple[Any, int, tuple[int, ...]]]
    register_count: int
    outputs: tuple[int, ...]
    returns_tuple: bool
    steps: list[PlanStep]
    backend: Backend
    output_shapes: tuple[tuple[int, ...], ...]
    #: bytes each instruction's result allocates (by register); views are in ``views`` instead
    allocations: dict[int, int] = field(default_factory=dict)
    #: register -> the register whose memory it shares (a transposed or reshaped view)
    views: dict[int, int] = field(default_factory=dict)
    #: bytes alive only while a register is computed (intermediates inside a contraction)
    transients: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.schedule = _release_schedule(self.instructions, self.outputs, self.views)

    @property
    def peak_bytes(self) -> int:
        """Predicted peak of the memory one run allocates: results and the intermediates alive at once.

        Each intermediate is released after its last use (a view keeps the array it views); inputs are
        the caller's and not counted; temporaries inside elementwise functions count as ``TEMPORARIES`` says.
        """
        live = peak = 0
        for _, out, _, dead in self.schedule:
            made = self.allocations.get(out, 0)
            peak = max(peak, live + made + self.transients.get(out, 0))
            live += made
            live -= sum(self.allocations.get(register, 0) for register in dead)
        return peak

    def run(self, values: list[Any]) -> Any:
        registers = values + [None] * (self.register_count - len(values))
        try:
            for function, out, args, dead in self.schedule:
                registers[out] = function(*[registers[a] for a in args])
                for register in dead:  # released after its last use: peak memory is the live set
                    registers[register] = None
        except (OverflowError, TypeError) as error:
            # numpy refusing a dtype (`-x` for uint8 x, sign of booleans) is the user's to fix, not a crash
            if not isinstance(error, OverflowError) and "ufunc" not in f"{type(error).__name__} {error}".lower():
                raise
            raise EinflowError(f"cannot compute this program for inputs of these dtypes: {error}; cast the inputs "
                               "(e.g. to float64) first") from None
        if self.returns_tuple:
            return tuple(registers[o] for o in self.outputs)
        return registers[self.outputs[0]]


def _release_schedule(instructions: list[tuple[Any, int, tuple[int, ...]]], outputs: tuple[int, ...],
                      views: dict[int, int]) -> list[tuple[Any, int, tuple[int, ...], tuple[int, ...]]]:
    """Instructions with the registers that die after each: last use, extended to the last use of any view."""
    last: dict[int, int] = {}
    for position, (_, out, args) in enumerate(instructions):
        last[out] = position  # a result nobody reads is released at once
        for register in args:
            last[register] = position
    for register in outputs:
        last[register] = len(instructions)
    for _, out, _ in reversed(instructions):  # views come after what they view: one backward pass suffices
        base = views.get(out)
        if base is not None and base in last:
            last[base] = max(last[base], last[out])
    dead: list[list[int]] = [[] for _ in instructions]
    produced = {out for _, out, _ in instructions}
    for register, position in last.items():
        if register in produced and position < len(instructions):
            dead[position].append(register)
    return [(function, out, args, tuple(dead[position]))
            for position, (function, out, args) in enumerate(instructions)]


@functools.lru_cache(maxsize=4096)
def indices_in(expr: ir.Expr) -> frozenset[str]:
    """Every index name occurring anywhere in ``expr``."""
    if isinstance(expr, ir.Tensor):
        return frozenset(expr.indices)
    if isinstance(expr, ir.Delta):
        return frozenset((expr.first, expr.second))
    found = frozenset().union(*(indices_in(child) for child in ir.children(expr)))
    return found | frozenset(expr.indices) if isinstance(expr, ir.Reduce) else found

def _reciprocal_scalar(x: int | float) -> float:
    if x == 0:
        return math.copysign(math.inf, x) if isinstance(x, float) else math.inf
    return 1.0 / x


def _power_function(exponent: int | float, xp: Any) -> Any:
    integral = isinstance(exponent, int) or float(exponent).is_integer()
    needs_float = not integral or exponent < 0

    def as_float(x: Any) -> Any:
        if needs_float and xp.result_type(x).kind in "biu":
            return x.astype(np.float64) if hasattr(x, "astype") else float(x)
        return x

    if exponent == 1:
        return lambda x: x
    if exponent == 2:
        return lambda x: x * x
    if exponent == -1:
        return lambda x: _reciprocal_scalar(x) if isinstance(x, (int, float)) else xp.reciprocal(as_float(x))
    if exponent == 0.5:
        return lambda x: xp.sqrt(x)
    return lambda x: xp.power(as_float(x), exponent)


# temporaries (in arrays of the argument's size, float64) that functions.py's value rules build besides
# their result: sigmoid keeps exp(-|x|), 1/(1+e), e*r and a boolean mask; step a boolean mask.
# tests/test_speed_features.py measures them, so a change in functions.py shows up there.
TEMPORARIES: dict[str, float] = {"sigmoid": 3.125, "step": 0.125}


def _letters(labels: list[str]) -> dict[str, str]:
    return {label: oe.get_symbol(position) for position, label in enumerate(labels)}


class _Lowering:
    def __init__(self, program: ir.ProgramIR, info: ProgramInfo, shapes: dict[str, tuple[int, ...]],
                 itemsize: int, backend: Backend, optimize: Any, memory_limit: float | None,
                 source: str | None) -> None:
        self.program = program
        self.info = info
        self.shapes = dict(shapes)
        self.itemsize = itemsize
        self.backend = backend
        self.xp = backend.xp
        self.optimize = optimize
        self.memory_limit = memory_limit
        self.source = source
        self.instructions: list[tuple[Any, int, tuple[int, ...]]] = []
        self.memo: dict[Any, Value] = {}
        self.count = len(info.inputs)
        self.names: dict[str, Value] = {}
        for slot, name in enumerate(info.inputs):
            self.names[name] = Value(slot, (), tuple(shapes[name]))
        self.declared: dict[str, tuple[int, str]] = {}
        self.sizes: dict[str, int] = {}
        self.steps: list[PlanStep] = []
        self.allocations: dict[int, int] = {}
        self.views: dict[int, int] = {}
        self.transients: dict[int, int] = {}
        self.statement_text = ""
        self.synthetic: set[int] = set()  # registers of boolean ones/identities that stand in for deltas
        self.float_dtype: Any = None

    # ------------------------------------------------------------------ registers
    def emit(self, key: Any, function: Any, args: tuple[int, ...], labels: tuple[str, ...],
             shape: tuple[int, ...], view: bool = False, transient: int = 0) -> Value:
        """Append an instruction (unless ``key`` was seen); ``view``: its result shares ``args[0]``'s memory."""
        if key is not None:
            found = self.memo.get(key)
            if found is not None:
                # keys are positional: the same register may carry other names (`y[i]^2` and `y[l]^2`)
                return Value(found.reg, labels, shape)
        self.guard(shape, "intermediate")
        register = self.count
        self.count += 1
        self.instructions.append((function, register, args))
        if view:
            self.views[register] = args[0]
        else:
            self.allocations[register] = math.prod(shape) * self.itemsize
        if transient:
            self.transients[register] = transient * self.itemsize
        value = Value(register, labels, shape)
        if key is not None:
            self.memo[key] = value
        return value

    def guard(self, shape: tuple[int, ...], what: str, elements: int | None = None) -> None:
        if self.memory_limit is None:
            return
        count = math.prod(shape) if elements is None else elements
        needed = count * self.itemsize
        if needed > self.memory_limit:
            article = "an" if what[0] in "aeiou" else "a"
            raise MemoryLimitError(
                f"the plan needs {article} {what} of shape {tuple(shape)} ({_bytes(needed)}) in statement "
                f"'{self.statement_text}', over the memory limit of {_bytes(self.memory_limit)}; nothing was "
                "allocated. Use backend='dask' to compute in chunks, try another optimize= choice, "
                "raise memory_limit=, or shrink the problem")

    def shape_of(self, labels: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(self.sizes[label] for label in labels)

    # ------------------------------------------------------------------ sizes
    def resolve_sizes(self, statement: ir.Assign) -> None:
        found: dict[str, tuple[int, str]] = {}
        partners: list[tuple[str, str, ir.Delta]] = []
        mentioned: dict[str, None] = {}

        def note(index: str, size: int, where: str, node: Any) -> None:
            known = found.get(index)
            if known is None:
                found[index] = (size, where)
            elif known[0] != size:
                raise ShapeError(located(
                    f"index '{index}' has size {known[0]} in {known[1]} but size {size} in {where}",
                    getattr(node, "span", None), self.source))

        for node in ir.walk(statement.expr):  # source order: the first use is reported first
            if isinstance(node, ir.Tensor):
                shape = self.shapes.get(node.name)
                if shape is None:
                    raise TensorNameError(located(f"tensor '{node.name}' is not bound", node.span, self.source))
                if len(shape) != len(node.indices):
                    raise ShapeError(located(
                        f"tensor '{node.name}' has rank {len(shape)} (shape {tuple(shape)}) but is used with "
                        f"{len(node.indices)} indices", node.span, self.source))
                for axis, (index, size) in enumerate(zip(node.indices, shape)):
                    mentioned.setdefault(index, None)
                    note(index, size, f"{node.name} (axis {axis})", node)
            elif isinstance(node, ir.Delta):
                partners.append((node.first, node.second, node))
                mentioned.setdefault(node.first, None)
                mentioned.setdefault(node.second, None)
        for index in statement.indices or ():
            mentioned.setdefault(index, None)
        for index in mentioned:
            if index in self.declared:
                size, where = self.declared[index]
                note(index, size, where, statement)
        changed = True
        while changed:
            changed = False
            for first, second, node in partners:
                if first in found and second not in found:
                    note(second, found[first][0], f"delta[{first},{second}] (partner of '{first}')", node)
                    changed = True
                elif second in found and first not in found:
                    note(first, found[second][0], f"delta[{first},{second}] (partner of '{second}')", node)
                    changed = True
                elif first in found and second in found and found[first][0] != found[second][0]:
                    raise ShapeError(located(
                        f"delta[{first},{second}] joins index '{first}' of size {found[first][0]} "
                        f"({found[first][1]}) with index '{second}' of size {found[second][0]} ({found[second][1]})",
                        node.span, self.source))
        for index in mentioned:
            if index not in found:
                raise ShapeError(located(
                    f"index '{index}' has no size: it is not an axis of any tensor; declare it with "
                    f"'size {index} = ...'", statement.span, self.source))
        self.sizes = {index: size for index, (size, _) in found.items()}

    def declare(self, statement: ir.SizeDecl) -> None:
        if isinstance(statement.source, int):
            for name in statement.names:
                self.declared[name] = (statement.source, f"'size {name} = {statement.source}'")
            return
        shape = self.shapes.get(statement.source)
        if shape is None:
            raise TensorNameError(located(f"tensor '{statement.source}' is not bound", statement.span, self.source))
        if len(shape) != len(statement.names):
            raise ShapeError(located(
                f"size declaration names {len(statement.names)} indices but '{statement.source}' has rank "
                f"{len(shape)} (shape {tuple(shape)})", statement.span, self.source))
        for axis, (name, size) in enumerate(zip(statement.names, shape)):
            self.declared[name] = (size, f"'size' of {statement.source} (axis {axis})")

    # ------------------------------------------------------------------ statements
    def lower_program(self) -> Plan:
        outputs: list[int] = []
        output_shapes: list[tuple[int, ...]] = []
        final: Value | None = None
        for statement in self.program.statements:
            if isinstance(statement, ir.SizeDecl):
                self.declare(statement)
                continue
            if isinstance(statement, ir.Return):
                for name in statement.names:
                    value = self.materialize(self.names[name])
                    outputs.append(value.reg)
                    output_shapes.append(value.shape)
                continue
            self.statement_text = ir.format_statement(statement)
            self.resolve_sizes(statement)
            value = self.lower_statement(statement)
            if statement.target is not None:
                self.names[statement.target] = value
                self.shapes[statement.target] = value.shape
            final = value
        if not outputs:
            assert final is not None
            value = self.materialize(final)
            outputs.append(value.reg)
            output_shapes.append(value.shape)
        return Plan(self.instructions, self.count, tuple(outputs), self.info.returns_tuple, self.steps,
                    self.backend, tuple(output_shapes), self.allocations, self.views, self.transients)

    def materialize(self, value: Value) -> Value:
        if value.const is None:
            return value
        constant = value.const
        xp = self.xp
        return self.emit(("const", type(constant), constant), lambda: xp.asarray(constant), (), (), ())

    def lower_statement(self, statement: ir.Assign) -> Value:
        if statement.indices is None:
            value = self.lower(statement.expr, frozenset(), frozenset())
            return value
        target = statement.indices
        bound = frozenset(target)
        terms = []
        for term in top_level_terms(statement.expr):
            extra = frozenset(free_indices(term, bound)) - bound
            if isinstance(term, (ir.Product, ir.Tensor, ir.Delta)):
                # a product term is produced directly in the target's axis order (no transpose after)
                factors = term.factors if isinstance(term, ir.Product) else (term,)
                terms.append(self.lower_product(factors, bound, extra, target))
            else:
                terms.append(self.lower(term, bound, extra))
        return self.add(terms, target)

    # ------------------------------------------------------------------ expressions
    def key(self, expr: ir.Expr, bound: frozenset[str], reduce: frozenset[str]) -> Any:
        mentioned = indices_in(expr)
        return (expr, bound & mentioned, reduce, tuple(sorted((i, self.sizes[i]) for i in mentioned)))

    def lower(self, expr: ir.Expr, bound: frozenset[str], reduce: frozenset[str]) -> Value:
        if isinstance(expr, ir.Num):
            return Value(-1, (), (), _weak(expr.value))
        if isinstance(expr, (ir.Tensor, ir.Delta)):
            return self.lower_product((expr,), bound, reduce)
        if isinstance(expr, ir.Product):
            return self.lower_product(expr.factors, bound, reduce)
        key = self.key(expr, bound, reduce)
        found = self.memo.get(key)
        if found is not None:
            return found
        if isinstance(expr, ir.Reduce):
            inner = frozenset(expr.indices)
            value = self.lower(expr.body, bound | inner, reduce | inner)
        elif isinstance(expr, ir.Sum):
            order = free_indices(expr, bound)
            value = self.add([self.lower(t, bound, frozenset()) for t in expr.terms], order)
            value = self.sum_axes(value, reduce)
        elif isinstance(expr, ir.Call):
            arg = self.lower(expr.arg, bound, frozenset())
            value = self.elementwise(("call", expr.func), self.backend.function(expr.func), arg, expr.func)
            value = self.sum_axes(value, reduce)
        elif isinstance(expr, ir.Power):
            base = self.lower(expr.base, bound, frozenset())
            if base.const is not None:
                return Value(-1, (), (), _fold_power(base.const, expr.exponent))
            value = self.elementwise(("pow", expr.exponent), _power_function(expr.exponent, self.xp), base,
                                     f"^{expr.exponent}")
            value = self.sum_axes(value, reduce)
        else:  # pragma: no cover
            raise TypeError(expr)
        self.memo[key] = value
        return value

    def elementwise(self, key: Any, function: Any, arg: Value, name: str) -> Value:
        if arg.const is not None:
            folded = function(np.asarray(arg.const))
            result = folded.item() if hasattr(folded, "item") else folded
            return Value(-1, (), (), result)
        if (key, arg.reg) not in self.memo:  # a repeat is not computed again: not reported again
            self.steps.append(PlanStep(self.statement_text, "elementwise", f"{name}[{','.join(arg.labels)}]",
                                       math.prod(arg.shape), arg.shape, self.itemsize))
        temporary = int(math.prod(arg.shape) * TEMPORARIES.get(key[1], 0)) if key[0] == "call" else 0
        return self.emit((key, arg.reg), function, (arg.reg,), arg.labels, arg.shape, view=key == ("pow", 1),
                         transient=temporary)

    def sum_axes(self, value: Value, reduce: frozenset[str]) -> Value:
        if not reduce:
            return value
        axes = tuple(position for position, label in enumerate(value.labels) if label in reduce)
        labels = tuple(label for label in value.labels if label not in reduce)
        if not axes:
            return value
        self.steps.append(PlanStep(self.statement_text, "sum", f"sum[{','.join(sorted(reduce))}]",
                                   math.prod(value.shape), self.shape_of(labels), self.itemsize))
        return self.emit(("sum", value.reg, axes), lambda x: x.sum(axis=axes), (value.reg,), labels,
                         self.shape_of(labels))

    def add(self, terms: list[Value], order: tuple[str, ...]) -> Value:
        constant: int | float = 0
        arrays: list[Value] = []
        for term in terms:
            if term.const is not None:
                constant = _weak(constant + term.const)
            else:
                arrays.append(term)
        if not arrays:
            return Value(-1, (), (), constant)
        aligned: list[Any] = []
        for term in arrays:
            present = [label for label in order if label in term.labels]
            permutation = tuple(term.labels.index(label) for label in present)
            shape = tuple(self.sizes[label] if label in term.labels else 1 for label in order)
            identity = permutation == tuple(range(len(term.labels)))
            if identity and len(present) == len(order) or not term.labels:
                aligned.append(None)  # a 0-d term (maybe a weak Python number) broadcasts as it is
            elif identity:
                aligned.append(lambda x, shape=shape: x.reshape(shape))
            else:
                aligned.append(lambda x, p=permutation, shape=shape: x.transpose(p).reshape(shape))
        has_constant = constant != 0 or isinstance(constant, float)  # + 0.0 still promotes integer arrays
        if len(arrays) == 1 and aligned[0] is None and not has_constant:
            return arrays[0]

        def add_terms(*xs: Any) -> Any:
            total = None
            for x, align in zip(xs, aligned):
                x = x if align is None else align(x)
                total = x if total is None else total + x
            if has_constant:
                total = total + constant
            return total

        shape = self.shape_of(order)
        # positional: the same sum under other index names (`1 - h[b,i]^2`, `1 - h[w,i]^2`) is computed once
        key = ("add", tuple((t.reg, tuple(order.index(label) for label in t.labels)) for t in arrays), len(order),
               constant, type(constant))
        if key not in self.memo:
            self.steps.append(PlanStep(self.statement_text, "add", " + ".join(
                f"[{','.join(t.labels)}]" for t in arrays), math.prod(shape) * len(arrays), shape, self.itemsize))
        # one term without a constant is only aligned: a transposed/reshaped view of it
        return self.emit(key, add_terms, tuple(t.reg for t in arrays), order, shape,
                         view=len(arrays) == 1 and not has_constant)

    # ------------------------------------------------------------------ products
    def lower_product(self, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
                      preferred: tuple[str, ...] = ()) -> Value:
        parts = split_product(factors, self.names.__getitem__, lambda factor: self.lower(factor, bound, frozenset()),
                              lambda value: value.const, lambda value: value.labels)
        output, summed = product_output(parts.sequence, bound, reduce, preferred)
        classes = self.eliminate_deltas(parts.operands, parts.deltas, summed, output)
        return self.contract(parts.operands, output, classes, parts.coefficient, parts.scalars)

    def eliminate_deltas(self, operands: list[tuple[Value, list[str]]], deltas: list[list[str]],
                         summed: Collection[str], output: list[str]) -> dict[str, list[str]]:
        """Substitute deltas away where an index is summed; supply ones for labels left uncarried."""
        classes, missing = eliminate_deltas([labels for _, labels in operands], deltas, summed, output)
        operands.extend((self.ones(label), [label]) for label in missing)
        return classes

    def ones(self, label: str) -> Value:
        size = self.sizes[label]
        backend = self.backend
        value = self.emit(("ones", size), lambda: backend.ones((size,), dtype=bool), (), (label,), (size,))
        self.synthetic.add(value.reg)
        return value

    def contract(self, operands: list[tuple[Value, list[str]]], output: list[str],
                 classes: dict[str, list[str]], coefficient: int | float, scalars: list[Value]) -> Value:
        partners = {member for rep, members in classes.items() for member in members if member != rep}
        if classes and not self.backend.strided_writes:
            for representative, members in classes.items():
                for member in members:
                    if member != representative:
                        eye = self.emit(("eye", self.sizes[member]), functools.partial(
                            self.backend.eye, self.sizes[member], bool), (), (representative, member),
                            (self.sizes[member],) * 2)
                        self.synthetic.add(eye.reg)
                        operands.append((eye, [representative, member]))
            partners = set()
            classes = {}
        inner_output = tuple(label for label in output if label not in partners)
        if not operands:
            value = Value(-1, (), (), coefficient)
            if scalars:
                value = self.scale(None, scalars, coefficient, ())
            return self.diagonal(value, output, classes)
        # apply the scale to the smallest operand when that is cheaper than scaling the result
        # deltas alone are booleans: scaling one by the int 1 first makes the product count (integers, like 1)
        delta_only = not scalars and all(value.reg in self.synthetic for value, _ in operands)
        needs_scale = bool(scalars) or not _is_unit(coefficient) or delta_only
        out_size = math.prod(self.sizes[label] for label in inner_output)
        if needs_scale:
            smallest = min(range(len(operands)), key=lambda k: math.prod(operands[k][0].shape))
            if math.prod(operands[smallest][0].shape) < out_size or delta_only:
                value, labels = operands[smallest]
                if delta_only and self.float_dtype is not None:
                    dtype = self.float_dtype
                    value = self.emit(("astype", value.reg, str(dtype)), lambda x: x.astype(dtype), (value.reg,),
                                      value.labels, value.shape)
                operands[smallest] = (self.scale(value, scalars, coefficient, value.labels), labels)
                needs_scale = False
        # numpy's dtype rule: the contraction computes in the result type of all its factors, the scalars
        # applied after it included (a bool or int8 pair must not saturate before a float scalar joins it)
        result = self.einsum(operands, inner_output, scalars if needs_scale else [],
                             coefficient if needs_scale and not _is_unit(coefficient) else None)
        if needs_scale:
            result = self.scale(result, scalars, coefficient, result.labels)
        return self.diagonal(result, output, classes)

    def scale(self, value: Value | None, scalars: list[Value], coefficient: int | float,
              labels: tuple[str, ...]) -> Value:
        args = tuple(s.reg for s in scalars)
        if value is None:
            def product_of(*xs: Any) -> Any:
                return functools.reduce(operator.mul, xs) * coefficient if not _is_unit(coefficient) else \
                    functools.reduce(operator.mul, xs)
            return self.emit(("scale", None, args, coefficient, type(coefficient)), product_of, args, (), ())
        if _is_unit(coefficient) and scalars:
            def scaled(x: Any, *xs: Any) -> Any:
                for s in xs:
                    x = x * s
                return x
        else:
            def scaled(x: Any, *xs: Any) -> Any:
                for s in xs:
                    x = x * s
                return x * coefficient
        factors = [repr(coefficient)] if not _is_unit(coefficient) else []
        self.steps.append(PlanStep(self.statement_text, "scale", "by " + " * ".join(
            [*factors, *(["a scalar"] * len(scalars))]), math.prod(value.shape), value.shape, self.itemsize))
        return self.emit(("scale", value.reg, args, coefficient, type(coefficient)), scaled, (value.reg,) + args,
                         labels, value.shape)

    def einsum(self, operands: list[tuple[Value, list[str]]], output: tuple[str, ...],
               scalars: list[Value] | None = None, coefficient: int | float | None = None) -> Value:
        shape = self.shape_of(output)
        if len(operands) == 1:
            value, labels = operands[0]
            if len(set(labels)) == len(labels):
                keep = [label for label in labels if label in output]
                axes = tuple(position for position, label in enumerate(labels) if label not in output)
                if axes:
                    value = self.emit(("sum", value.reg, axes), lambda x, axes=axes: x.sum(axis=axes),
                                      (value.reg,), tuple(keep), self.shape_of(tuple(keep)))
                    self.steps.append(PlanStep(self.statement_text, "sum", f"[{','.join(labels)}] -> "
                                               f"[{','.join(keep)}]", math.prod(self.shape_of(tuple(labels))),
                                               self.shape_of(tuple(keep)), self.itemsize))
                if tuple(keep) == output:
                    return Value(value.reg, output, shape)  # labels as renamed by delta substitution
                permutation = tuple(keep.index(label) for label in output)
                return self.emit(("transpose", value.reg, permutation), lambda x: x.transpose(permutation),
                                 (value.reg,), output, shape, view=True)
        everything: list[str] = []
        for _, labels in operands:
            for label in labels:
                if label not in everything:
                    everything.append(label)
        letters = _letters(everything)
        equation = ",".join("".join(letters[label] for label in labels) for _, labels in operands)
        equation += "->" + "".join(letters[label] for label in output)
        shapes = [tuple(self.sizes[label] for label in labels) for _, labels in operands]
        path, info = oe.contract_path(equation, *shapes, shapes=True, optimize=self.optimize)
        names = {letter: label for label, letter in letters.items()}
        pairwise = []
        for contraction in info.contraction_list:
            inds, removed, einsum_str, _remaining, _blas = contraction[:5]
            inputs, result = einsum_str.split("->")
            step_flops = oe.helpers.flop_count(set(inputs.replace(",", "")), bool(removed), len(inds),
                                               info.size_dict)
            readable = ",".join("[" + ",".join(names[c] for c in part) + "]" for part in inputs.split(","))
            readable += " -> [" + ",".join(names[c] for c in result) + "]"
            pairwise.append((readable, int(step_flops), tuple(info.size_dict[c] for c in result)))
        if pairwise:  # refuse before anything is allocated, naming the largest pairwise step and its shape
            step, _, step_shape = max(pairwise, key=lambda entry: math.prod(entry[2]))
            self.guard(step_shape, f"contraction intermediate {step}")
        pretty = " ".join(f"[{','.join(labels)}]" for _, labels in operands) + f" -> [{','.join(output)}]"
        self.steps.append(PlanStep(self.statement_text, "contract", pretty, int(info.opt_cost), shape,
                                   self.itemsize, pairwise, int(info.largest_intermediate)))
        internal = max((math.prod(step_shape) for _, _, step_shape in pairwise[:-1]), default=0)
        if self.backend.name == "numpy":
            # each pairwise step decided once: direct numpy.dot/einsum calls (see einflow/kernels.py)
            run, internal = compile_numpy(equation, shapes, info.contraction_list)
        else:
            expression = oe.contract_expression(equation, *shapes, optimize=path)
            backend_name = self.backend.einsum_backend

            def run(*arrays: Any) -> Any:
                return expression(*arrays, backend=backend_name)

        args = tuple(v.reg for v, _ in operands)
        if len(operands) > 2 or scalars or coefficient is not None:
            # two arrays alone already promote like numpy (dot/matmul/einsum of a pair)
            run = _in_common_dtype(run, len(operands), coefficient)
            args += tuple(s.reg for s in scalars or ())
        key = ("einsum", equation, args, coefficient, type(coefficient))
        return self.emit(key, run, args, output, shape, transient=internal)

    def diagonal(self, value: Value, output: list[str], classes: dict[str, list[str]]) -> Value:
        if not classes:
            return value
        value = self.materialize(value)
        full = tuple(output)
        full_shape = self.shape_of(full)
        groups = []
        for label in value.labels:
            members = classes.get(label, [label])
            groups.append(tuple(full.index(m) for m in members))
        view_shape = value.shape
        backend = self.backend

        def write(result: Any) -> Any:
            out = backend.zeros(full_shape, result.dtype)
            strides = tuple(sum(out.strides[k] for k in group) for group in groups)
            view = backend.diagonal_view(out, view_shape, strides)
            view[...] = result
            return out

        self.steps.append(PlanStep(self.statement_text, "diagonal", "delta " + ", ".join(
            "=".join(members) for members in classes.values()), math.prod(view_shape), full_shape, self.itemsize))
        return self.emit(("diag", value.reg, full, tuple(map(tuple, classes.values()))), write, (value.reg,),
                         full, full_shape)


def _in_common_dtype(run: Any, count: int, coefficient: int | float | None) -> Any:
    """``run`` on its first ``count`` arguments, each cast to numpy's result type of all arguments.

    The arguments after ``count`` (scalars multiplied in later) and the weak ``coefficient`` only take part
    in the type; Python numbers stay weak, as in numpy.
    """
    weak = () if coefficient is None else (coefficient,)

    def typed(*values: Any) -> Any:
        arrays = values[:count]
        common = np.result_type(*[getattr(value, "dtype", value) for value in values], *weak)
        if all(getattr(array, "dtype", common) == common for array in arrays):
            return run(*arrays)
        return run(*[array.astype(common) if getattr(array, "dtype", common) != common else array
                     for array in arrays])

    return typed


def _bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count} B"  # pragma: no cover


def _check_optimize(optimize: Any) -> None:
    """``optimize=``: an opt_einsum path algorithm's name, True/False/None, a PathOptimizer or path function."""
    if optimize is None or isinstance(optimize, bool) or callable(optimize):
        return
    if isinstance(optimize, str):
        try:
            oe.paths.get_path_fn(optimize)
        except KeyError:
            names = ", ".join(repr(name) for name in sorted(oe.paths._PATH_OPTIONS))
            raise EinflowError(f"optimize={optimize!r} is not a path algorithm; valid options are {names}, "
                               "True/False, or an opt_einsum PathOptimizer") from None
        return
    if isinstance(optimize, (list, tuple)) and all(isinstance(step, (list, tuple)) for step in optimize):
        return  # an explicit contraction path
    raise EinflowError(f"optimize= must be a path algorithm's name (e.g. 'greedy', 'dp', 'optimal'), True/False, "
                       f"or an opt_einsum PathOptimizer, not {type(optimize).__name__}")


def build_plan(program: ir.ProgramIR, info: ProgramInfo, shapes: dict[str, tuple[int, ...]], itemsize: int,
               backend: Backend, optimize: Any = "auto", memory_limit: float | None = None,
               source: str | None = None, float_dtype: Any = None) -> Plan:
    """Lower a checked program for concrete input shapes.

    ``float_dtype`` (the inputs' floating type, if any) is the type of products made of deltas alone,
    so that a Hessian like ``2 delta[p,q]`` has the type of the ``x`` it was taken for.
    """
    _check_optimize(optimize)
    lowering = _Lowering(program, info, shapes, itemsize, backend, optimize, memory_limit, source)
    lowering.float_dtype = float_dtype
    return lowering.lower_program()
