"""The render stage's rows: one per elementwise node kind and one per step kind, read by every renderer.

A node's row says how generated code computes it (``render``: text and precedence, given the renderer), the plan
report's text for it, its operations per element, the arrays ufuncs need to evaluate it and the registers it
reads. A step's row says the report's name for it (``kind``), the statements computing it and its note (the
text after its name in the code's comment and the plan report). Adding a kind is adding a row. The renderer is
any object with the renderer's methods (``einflow.engine.codegen.Source`` and its specialised form).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from einflow.engine.linalg import KEEPS_AXES, is_linalg
from einflow.engine.steps import (
    Add,
    Apply,
    Arg,
    AsFloat,
    Constant,
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Mul,
    Node,
    Number,
    Ones,
    Pow,
    Reduce,
    Scatter,
    Size,
    Solve,
    Step,
    Window,
)
from einflow.lang import ir
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import einsum_equation, index_letters

__all__ = ["NodeRule", "NODE_RULES", "StepRule", "STEP_RULES", "kind_of", "describe_node", "operations_of",
           "temporaries_of", "args_in_order", "is_divisor", "negation_of", "positive_first", "grouped",
           "diagonal_spec", "diagonal_view_labels", "FLAT_TERMS"]


def kind_of(step: Step) -> str:
    """The report's name for a step (its row of ``STEP_RULES``)."""
    return STEP_RULES[type(step)].kind(step)


def diagonal_view_labels(step: Diagonal) -> tuple[str, ...]:
    """The axes of a Diagonal step's diagonal view: its value's, then those the value is broadcast along."""
    representative = {member: group[0] for group in step.groups for member in group}
    view = dict.fromkeys(representative.get(label, label) for label in step.output)
    return step.labels + tuple(label for label in view if label not in step.labels)


def diagonal_spec(step: Diagonal) -> str:
    """The einsum equation whose result is the writable view of a Diagonal step's diagonal (its value's axes)."""
    representative = {member: group[0] for group in step.groups for member in group}
    labels = diagonal_view_labels(step)
    return einsum_equation([(representative.get(label, label) for label in step.output)], labels, index_letters(labels))


def is_divisor(factor: Node) -> bool:
    """Whether a product's factor is ``x ** -1`` (the product is rendered as a division by ``x``)."""
    return isinstance(factor, Pow) and not isinstance(factor.exponent, bool) and factor.exponent == -1


#: a sum or product of more terms is written in parenthesised groups of at most this many: Python's compiler
#: recurses once per operator of ``a + b + c + ...`` and overflows near 3,000 (the groups nest log(n) deep)
FLAT_TERMS = 64


def grouped(items: Sequence[Any], render: Callable[[Sequence[Any]], str], operator: str) -> str:
    """``render(items)``, or for more than FLAT_TERMS items, the rendered groups joined by ``operator``.

    >>> grouped([f"x{k}" for k in range(3)], " + ".join, " + ")
    'x0 + x1 + x2'
    >>> grouped([f"x{k}" for k in range(130)], " + ".join, " + ").count("(")
    3
    """
    if len(items) <= FLAT_TERMS:
        return render(items)
    size = FLAT_TERMS  # groups of a power of FLAT_TERMS items, at most FLAT_TERMS of them
    while len(items) > size * FLAT_TERMS:
        size *= FLAT_TERMS
    return operator.join(f"({grouped(items[k:k + size], render, operator)})" for k in range(0, len(items), size))


def positive_first(terms: tuple[Node, ...]) -> tuple[Node, ...]:
    """Two terms with the negative one first are swapped (``1 - x``, not ``x * (-1) + 1``): exact in floats."""
    if len(terms) == 2 and negation_of(terms[0]) is not None and negation_of(terms[1]) is None:
        return terms[1], terms[0]
    return terms


def negation_of(term: Node) -> Node | None:
    """``term`` without its negative sign, when it is a product with a negative number (else None)."""
    if isinstance(term, Number) and not isinstance(term.value, (bool, complex)) and term.value < 0:
        return Number(-term.value) if not (isinstance(term.value, int) and term.value == -(2**63)) else None
    if isinstance(term, Mul):
        numbers = [f for f in term.factors if isinstance(f, Number)]
        if len(numbers) == 1 and not isinstance(numbers[0].value, (bool, complex)) and numbers[0].value < 0:
            value = numbers[0].value
            rest = tuple(f for f in term.factors if f is not numbers[0])
            if type(value) is int and value == -1 and rest:
                return rest[0] if len(rest) == 1 else Mul(rest)
            return Mul((*rest, Number(-value)))
    return None



# ---------------------------------------------------------------------------------------------- node rules
# One row per elementwise expression node: how the generated code computes it (``render``: text and
# precedence, children through ``source.node`` so a renderer's overrides apply), the plan report's text
# (``describe``), its operations per element (``operations``), the arrays ufuncs need to evaluate it
# (``temporaries``, the memory model) and the registers it reads in the order its operations meet them
# (``args``). Adding a node kind is adding a row.


def _render_number(source: Any, node: Number) -> tuple[str, int]:
    if source.tensor_literals and isinstance(node.value, float):
        return source.torch_number(node.value), 4
    text = source.number(node.value)
    return text, 1 if text.startswith("-") else 4


def _render_apply(source: Any, node: Apply) -> tuple[str, int]:
    if node.other is not None:
        operands = [source.node(part)[0] if not source.dialect.typed_literals or not isinstance(part, Number)
                    else source.torch_number(part.value) for part in (node.arg, node.other)]
        return f"{source.alias['np']}.{node.func}({operands[0]}, {operands[1]})", 4
    inner = source.node(node.arg)[0]
    # a promoting function's result is already floating: no second promotion around it
    computed_float = (isinstance(node.arg, Apply) and node.arg.other is None  # maximum(a, b) keeps ints
                      and FUNCTION_RULES[node.arg.func].promotes)
    return source.call(node.func, inner, promote=not computed_float), 4


def _render_as_float(source: Any, node: AsFloat) -> tuple[str, int]:
    if isinstance(node.arg, Size):
        return source.count(source.size(node.arg.ref)), 4
    return source.as_float(source.node(node.arg)[0]), 4


def _render_mul(source: Any, node: Mul) -> tuple[str, int]:
    factors = []
    casts = source.product_casts(node)
    divisors = [f.base for f in node.factors if is_divisor(f)]  # type: ignore[union-attr]
    if len(divisors) == len(node.factors):
        divisors = []  # reciprocals alone: 1 / x is the reciprocal
    for position in source.product_order(node):
        factor = node.factors[position]
        if divisors and is_divisor(factor):
            continue
        text, level = source.node(factor)
        if position in casts:
            text, level = source.astype(text if level >= 4 else f"({text})", casts[position]), 4
        factors.append(f"({text})" if level < 2 else text)
    product = grouped(factors, " * ".join, " * ")
    if divisors:  # division is division (x / x is 1 where x * (1 / x) may not be)
        return source.divided(node, product, divisors), 2
    return product, 2


def _describe_arg(node: Arg, labels: tuple[str, ...], specialiser: Any) -> str:
    rank = len(specialiser.shape[node.register])
    axes = node.axes if node.axes is not None else tuple(range(rank)) if rank else ()
    own = [label for _, label in sorted((axis, labels[k]) for k, axis in enumerate(axes) if axis is not None)]
    name = specialiser.var(node.register)
    return f"{name}[{','.join(own)}]" if own else name


def _describe_apply(node: Apply, labels: tuple[str, ...], specialiser: Any) -> str:
    if node.other is not None:
        other = describe_node(node.other, labels, specialiser)
        return f"{node.func}({describe_node(node.arg, labels, specialiser)}, {other})"
    return f"{node.func}({describe_node(node.arg, labels, specialiser)})"


def _describe_pow(node: Pow, labels: tuple[str, ...], specialiser: Any) -> str:
    base = describe_node(node.base, labels, specialiser)
    return f"({base})^{node.exponent}" if " " in base else f"{base}^{node.exponent}"


def _describe_mul(node: Mul, labels: tuple[str, ...], specialiser: Any) -> str:
    factors = sorted(node.factors, key=lambda factor: not isinstance(factor, Number))  # the number first
    return " ".join(f"({describe_node(f, labels, specialiser)})" if isinstance(f, Add) else
                    describe_node(f, labels, specialiser) for f in factors)


def _operations_apply(node: Apply, call: int | None, leaves: Any) -> int:
    if node.other is not None:
        return 1 + operations_of(node.arg, call, leaves) + operations_of(node.other, call, leaves)
    return (FUNCTION_RULES[node.func].cost if call is None else call) + operations_of(node.arg, call, leaves)


def _operations_of_parts(parts: tuple[Node, ...], call: int | None, leaves: Any) -> int:
    return len(parts) - 1 + sum(operations_of(part, call, leaves) for part in parts)


def _temporaries_apply(node: Apply) -> tuple[int, float]:
    if node.other is not None:
        return temporaries_of(Add((node.arg, node.other)))
    return _temporaries_unary(node.arg, FUNCTION_RULES[node.func].temporaries)


def _temporaries_unary(arg: Node, own: float = 0.0) -> tuple[int, float]:
    inner, extra = temporaries_of(arg)
    return max(inner, 1), max(extra, own + inner)


def _temporaries_of_parts(parts: tuple[Node, ...]) -> tuple[int, float]:
    need = 0
    extra = 0.0
    for position, part in enumerate(parts):
        count, more = temporaries_of(part)
        # earlier partial results stay alive while this operand is computed
        need = max(need, count + (1 if position > 1 else 0), 1)
        extra = max(extra, more)
    return need, extra


def _no_temporaries(node: Node) -> tuple[int, float]:
    return 0, 0.0


def _no_operations(node: Node, call: int | None, leaves: Any) -> int:
    return 0


@dataclass(frozen=True)
class NodeRule:
    """One elementwise expression node kind: ``render(source, node)`` the generated code's (text, precedence);
    ``describe(node, labels, specialiser)`` the plan report's text; ``operations(node, call, leaves)`` its
    operations per element (see ``operations_of``); ``temporaries(node)`` (arrays needed, counting the result;
    extra temporaries of functions); ``args(node)`` the registers it reads, in the order its operations meet them.

    >>> NODE_RULES[Add].describe(Add((Number(1), Number(2.5))), (), None)
    '1 + 2.5'
    """

    render: Callable[[Any, Any], tuple[str, int]]
    describe: Callable[[Any, tuple[str, ...], Any], str]
    operations: Callable[[Any, int | None, Any], int]
    temporaries: Callable[[Any], tuple[int, float]]
    args: Callable[[Any], list[Arg]]


NODE_RULES: dict[type, NodeRule] = {
    Arg: NodeRule(
        render=lambda source, node: (source.arg(node), 4),
        describe=_describe_arg,
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: [node]),
    Number: NodeRule(
        render=_render_number,
        describe=lambda node, labels, specialiser: repr(node.value),
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: []),
    Size: NodeRule(
        render=lambda source, node: (source.size(node.ref), 4),
        describe=lambda node, labels, specialiser: repr(specialiser.resolve(node.ref)),
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: []),
    Apply: NodeRule(
        render=_render_apply,
        describe=_describe_apply,
        operations=_operations_apply,
        temporaries=_temporaries_apply,
        args=lambda node: args_in_order(node.arg) + ([] if node.other is None else args_in_order(node.other))),
    AsFloat: NodeRule(
        render=_render_as_float,
        describe=lambda node, labels, specialiser: describe_node(node.arg, labels, specialiser),
        operations=lambda node, call, leaves: 1 + operations_of(node.arg, call, leaves),
        temporaries=lambda node: _temporaries_unary(node.arg),
        args=lambda node: args_in_order(node.arg)),
    Pow: NodeRule(
        render=lambda source, node: (source.power(node), 4),
        describe=_describe_pow,
        operations=lambda node, call, leaves: 1 + operations_of(node.base, call, leaves),
        temporaries=lambda node: _temporaries_unary(node.base),
        args=lambda node: args_in_order(node.base)),
    Add: NodeRule(
        render=lambda source, node: (grouped(positive_first(node.terms), source.add_terms, " + "), 1),
        describe=lambda node, labels, specialiser: " + ".join(describe_node(term, labels, specialiser)
                                                              for term in node.terms),
        operations=lambda node, call, leaves: _operations_of_parts(node.terms, call, leaves),
        temporaries=lambda node: _temporaries_of_parts(node.terms),
        args=lambda node: [arg for part in positive_first(node.terms) for arg in args_in_order(part)]),
    Mul: NodeRule(
        render=_render_mul,
        describe=_describe_mul,
        operations=lambda node, call, leaves: _operations_of_parts(node.factors, call, leaves),
        temporaries=lambda node: _temporaries_of_parts(node.factors),
        args=lambda node: [arg for part in node.factors for arg in args_in_order(part)]),
}

assert set(NODE_RULES) == set(Node.__args__)  # type: ignore[attr-defined]


def describe_node(node: Node, labels: tuple[str, ...], specialiser: Any) -> str:
    """An elementwise expression in einflow-like text: ``tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])``."""
    return NODE_RULES[type(node)].describe(node, labels, specialiser)


def operations_of(node: Node, call: int | None = None, leaves: Any = ()) -> int:
    """Operations per element (a function counts its ``cost``, or ``call`` when given; ``leaves``: nodes computed
    apart, which count none)."""
    if node in leaves:
        return 0
    return NODE_RULES[type(node)].operations(node, call, leaves)


def temporaries_of(node: Node) -> tuple[int, float]:
    """(arrays needed to evaluate ``node`` with ufuncs, counting the result; extra temporaries of functions)."""
    return NODE_RULES[type(node)].temporaries(node)


def args_in_order(node: Node) -> list[Arg]:
    """The registers an expression reads, in the order its operations meet them."""
    return NODE_RULES[type(node)].args(node)


# ---------------------------------------------------------------------------------------------- step rules
# One row per step kind: the report's name for it (``kind``), the statements computing it (``render``, given
# the renderer and the name of its result) and the text after the name in its comment and the plan report
# (``note``). The specialised rows are ``einflow.engine.measure.PLAN_RULES`` (shapes, dtypes, FLOPs, memory) and
# ``einflow.engine.render.RENDER_RULES`` (lines with shapes).


def _free_lines(source: Any, step: Free, out: str) -> list[str]:
    names = [source.vars[r] for r in step.registers if r in source.vars]
    return [f"del {', '.join(names)}"] if names else []


def _constant_lines(source: Any, step: Constant, out: str) -> list[str]:
    np_ = source.alias["np"]
    if source.dialect.typed_literals:  # a 0-d tensor (numpy's default types; 0-d tensors do not widen others)
        dtype = "float64" if isinstance(step.value, float) else "int64"
        return [f"{out} = {np_}.tensor({source.number(step.value)}, dtype={np_}.{dtype})"]
    return [f"{out} = {np_}.asarray({source.number(step.value)})"]


def _ones_lines(source: Any, step: Ones, out: str) -> list[str]:
    np_ = source.alias["np"]
    if source.dialect.devices:
        return [f"{out} = {np_}.ones(({source.size(step.size)},), dtype={np_}.bool, device={source.device()})"]
    return [f"{out} = {np_}.ones(({source.size(step.size)},), dtype=\"bool\")"]


def _reduce_lines(source: Any, step: Reduce, out: str) -> list[str]:
    if step.kind == "sum":
        return [f"{out} = {source.reduce(source.var(step.arg), step.axes)}"]
    if is_linalg(step):
        name = source.matrix_name(step.arg)  # named in the errors (singular, not positive definite)
        extra = f", {name!r}" if name is not None and not step.kind.startswith("cho_") else ""
        return [f"{out} = {source.helper('linalg')}({step.kind!r}, {source.var(step.arg)}, {step.axes!r}{extra})"]
    return [f"{out} = {source.helper('reduce')}({step.kind!r}, {source.var(step.arg)}, {step.axes!r})"]


def _solve_lines(source: Any, step: Solve, out: str) -> list[str]:
    name = source.matrix_name(step.matrix) if step.kind != "cho_solve" else None
    extra = f", name={name!r}" if name is not None else ""
    extra += f", batch={step.batch!r}" if step.batch else ""
    return [f"{out} = {source.helper('solve')}({step.kind!r}, {source.var(step.matrix)}, {step.axes!r}, "
            f"{source.var(step.rhs)}, {step.rhs_axis}, {step.transposed}{extra})"]


def _reduce_note(source: Any, step: Reduce) -> str:
    keeps = (*ir.NORMALISERS, *KEEPS_AXES)
    kept = step.labels if step.kind in keeps else tuple(
        label for k, label in enumerate(step.labels) if k not in step.axes)
    return f"[{','.join(step.labels)}] -> [{','.join(kept)}]"


def _solve_note(source: Any, step: Solve) -> str:
    over = "rows" if step.transposed else "columns"
    return f"inv({source.var(step.matrix)}) {source.var(step.rhs)} over its {over} -> [{','.join(step.labels)}]"


def _diagonal_note(source: Any, step: Diagonal) -> str:
    text = "delta " + ", ".join("=".join(group) for group in step.groups)
    if step.base is not None:
        text = f"{source.var(step.base)} + {text}"
    return text


def _scatter_note(source: Any, step: Scatter) -> str:
    written = ", ".join(ir.format_position(position) for position in step.positions)
    return f"[{','.join(step.arg_labels)}] -> [{written}] of [{','.join(step.labels)}]"


def _window_note(source: Any, step: Window) -> str:
    read = ", ".join(ir.format_position(position) for position in step.positions)
    return f"{step.name}[{read}] -> [{','.join(step.labels)}]"


def _elementwise_kind(step: Elementwise) -> str:
    expr = step.expr
    if isinstance(expr, Arg):
        return "transpose"
    if isinstance(expr, Add):
        return "add"
    if isinstance(expr, Mul):
        arrays = [f for f in expr.factors if isinstance(f, (Arg, AsFloat)) or not isinstance(f, (Number, Size))]
        return "scale" if len(arrays) <= 1 or all(isinstance(f, (Number, Size, AsFloat)) for f in arrays) else "product"
    return "elementwise"


def _no_note(source: Any, step: Step) -> str:
    return ""


@dataclass(frozen=True)
class StepRule:
    """One step kind: ``kind(step)`` the report's name for it; ``render(source, step, out)`` the statements
    computing it (``out`` the name of its result); ``note(source, step)`` the text after the name in its comment
    in the generated code and in the plan report (e.g. ``[i,k] [k,j] -> [i,j]``).

    >>> STEP_RULES[Contract].kind(Contract(0, 2, (0, 1), (("i", "k"), ("k", "j")), ("i", "j"), (), ()))
    'contract'
    """

    kind: Callable[[Any], str]
    render: Callable[[Any, Any, str], list[str]]
    note: Callable[[Any, Any], str]


STEP_RULES: dict[type, StepRule] = {
    Constant: StepRule(
        kind=lambda step: "constant",
        render=_constant_lines,
        note=_no_note),
    Ones: StepRule(
        kind=lambda step: "ones",
        render=_ones_lines,
        note=_no_note),
    Contract: StepRule(
        kind=lambda step: "contract",
        render=lambda source, step, out: [f"{out} = {source.contract(step)}"],
        note=lambda source, step: " ".join(f"[{','.join(labels)}]" for labels in step.operands)
        + f" -> [{','.join(step.output)}]"),
    Reduce: StepRule(  # plain reductions, the normalisers and the linear-algebra kinds (einflow.engine.linalg)
        kind=lambda step: step.kind,
        render=_reduce_lines,
        note=_reduce_note),
    Solve: StepRule(
        kind=lambda step: step.kind,
        render=_solve_lines,
        note=_solve_note),
    Elementwise: StepRule(
        kind=_elementwise_kind,
        render=lambda source, step, out: [f"{out} = {source.elementwise(step)}"],
        note=lambda source, step: f"[{','.join(step.labels)}]"),
    Diagonal: StepRule(
        kind=lambda step: "diagonal",
        render=lambda source, step, out: source.diagonal(step, out),
        note=_diagonal_note),
    Window: StepRule(
        kind=lambda step: "window",
        render=lambda source, step, out: [f"{out} = {source.window(step)}"],
        note=_window_note),
    Scatter: StepRule(
        kind=lambda step: "scatter",
        render=lambda source, step, out: [f"{out} = {source.window(step)}"],
        note=_scatter_note),
    Free: StepRule(
        kind=lambda step: "free",
        render=_free_lines,
        note=_no_note),
}

assert set(STEP_RULES) == set(Step.__args__)  # type: ignore[attr-defined]
