"""The render stage's facts per kind: one row per elementwise node kind and one per step kind.

A node's row says the plan report's text for it, its operations per element, the arrays ufuncs need to evaluate
it and the registers it reads. A step's row says the report's name for it (``kind``) and its note (the text
after its name in the code's comment and the plan report). Adding a kind is adding a row here and one in
``einflow.engine.codegen`` (``NODE_TEXT``, ``STEP_TEXT``: how the generated code computes it). The rows that
name registers take the rendering's context (``einflow.engine.context.RenderContext``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from einflow.engine.linalg import KEEPS_AXES
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
           "temporaries_of", "args_in_order", "is_divisor", "negation_of", "positive_first",
           "diagonal_spec", "diagonal_view_labels"]


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
# One row per elementwise expression node: the plan report's text (``describe``), its operations per element
# (``operations``), the arrays ufuncs need to evaluate it (``temporaries``, the memory model) and the registers
# it reads in the order its operations meet them (``args``). The generated code's text for it is
# ``einflow.engine.codegen.NODE_TEXT``.


def _describe_arg(node: Arg, labels: tuple[str, ...], context: Any) -> str:
    rank = len(context.record.shapes[node.register])
    axes = node.axes if node.axes is not None else tuple(range(rank)) if rank else ()
    own = [label for _, label in sorted((axis, labels[k]) for k, axis in enumerate(axes) if axis is not None)]
    name = context.var(node.register)
    return f"{name}[{','.join(own)}]" if own else name


def _describe_apply(node: Apply, labels: tuple[str, ...], context: Any) -> str:
    if node.other is not None:
        other = describe_node(node.other, labels, context)
        return f"{node.func}({describe_node(node.arg, labels, context)}, {other})"
    return f"{node.func}({describe_node(node.arg, labels, context)})"


def _describe_pow(node: Pow, labels: tuple[str, ...], context: Any) -> str:
    base = describe_node(node.base, labels, context)
    return f"({base})^{node.exponent}" if " " in base else f"{base}^{node.exponent}"


def _describe_mul(node: Mul, labels: tuple[str, ...], context: Any) -> str:
    factors = sorted(node.factors, key=lambda factor: not isinstance(factor, Number))  # the number first
    return " ".join(f"({describe_node(f, labels, context)})" if isinstance(f, Add) else
                    describe_node(f, labels, context) for f in factors)


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
    """One elementwise expression node kind: ``describe(node, labels, context)`` the plan report's text (the
    context names the registers as the code does); ``operations(node, call, leaves)`` its
    operations per element (see ``operations_of``); ``temporaries(node)`` (arrays needed, counting the result;
    extra temporaries of functions); ``args(node)`` the registers it reads, in the order its operations meet them.

    >>> NODE_RULES[Add].describe(Add((Number(1), Number(2.5))), (), None)
    '1 + 2.5'
    """

    describe: Callable[[Any, tuple[str, ...], Any], str]
    operations: Callable[[Any, int | None, Any], int]
    temporaries: Callable[[Any], tuple[int, float]]
    args: Callable[[Any], list[Arg]]


NODE_RULES: dict[type, NodeRule] = {
    Arg: NodeRule(
        describe=_describe_arg,
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: [node]),
    Number: NodeRule(
        describe=lambda node, labels, context: repr(node.value),
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: []),
    Size: NodeRule(
        describe=lambda node, labels, context: repr(context.resolve(node.ref)),
        operations=_no_operations,
        temporaries=_no_temporaries,
        args=lambda node: []),
    Apply: NodeRule(
        describe=_describe_apply,
        operations=_operations_apply,
        temporaries=_temporaries_apply,
        args=lambda node: args_in_order(node.arg) + ([] if node.other is None else args_in_order(node.other))),
    AsFloat: NodeRule(
        describe=lambda node, labels, context: describe_node(node.arg, labels, context),
        operations=lambda node, call, leaves: 1 + operations_of(node.arg, call, leaves),
        temporaries=lambda node: _temporaries_unary(node.arg),
        args=lambda node: args_in_order(node.arg)),
    Pow: NodeRule(
        describe=_describe_pow,
        operations=lambda node, call, leaves: 1 + operations_of(node.base, call, leaves),
        temporaries=lambda node: _temporaries_unary(node.base),
        args=lambda node: args_in_order(node.base)),
    Add: NodeRule(
        describe=lambda node, labels, context: " + ".join(describe_node(term, labels, context)
                                                              for term in node.terms),
        operations=lambda node, call, leaves: _operations_of_parts(node.terms, call, leaves),
        temporaries=lambda node: _temporaries_of_parts(node.terms),
        args=lambda node: [arg for part in positive_first(node.terms) for arg in args_in_order(part)]),
    Mul: NodeRule(
        describe=_describe_mul,
        operations=lambda node, call, leaves: _operations_of_parts(node.factors, call, leaves),
        temporaries=lambda node: _temporaries_of_parts(node.factors),
        args=lambda node: [arg for part in node.factors for arg in args_in_order(part)]),
}

assert set(NODE_RULES) == set(Node.__args__)  # type: ignore[attr-defined]


def describe_node(node: Node, labels: tuple[str, ...], context: Any) -> str:
    """An elementwise expression in einflow-like text: ``tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])``."""
    return NODE_RULES[type(node)].describe(node, labels, context)


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
# One row per step kind: the report's name for it (``kind``) and the text after the name in its comment and
# the plan report (``note``, given the rendering's context). The statements computing it are
# ``einflow.engine.codegen.STEP_TEXT``. The specialised rows are ``einflow.engine.measure.PLAN_RULES`` (shapes,
# dtypes, FLOPs, memory) and ``einflow.engine.render.RENDER_RULES`` (lines with shapes).


def _reduce_note(context: Any, step: Reduce) -> str:
    keeps = (*ir.NORMALISERS, *KEEPS_AXES)
    kept = step.labels if step.kind in keeps else tuple(
        label for k, label in enumerate(step.labels) if k not in step.axes)
    return f"[{','.join(step.labels)}] -> [{','.join(kept)}]"


def _solve_note(context: Any, step: Solve) -> str:
    over = "rows" if step.transposed else "columns"
    return f"inv({context.var(step.matrix)}) {context.var(step.rhs)} over its {over} -> [{','.join(step.labels)}]"


def _diagonal_note(context: Any, step: Diagonal) -> str:
    text = "delta " + ", ".join("=".join(group) for group in step.groups)
    if step.base is not None:
        text = f"{context.var(step.base)} + {text}"
    return text


def _scatter_note(context: Any, step: Scatter) -> str:
    written = ", ".join(ir.format_position(position) for position in step.positions)
    return f"[{','.join(step.arg_labels)}] -> [{written}] of [{','.join(step.labels)}]"


def _window_note(context: Any, step: Window) -> str:
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


def _no_note(context: Any, step: Step) -> str:
    return ""


@dataclass(frozen=True)
class StepRule:
    """One step kind: ``kind(step)`` the report's name for it; ``note(context, step)`` the text after the name in
    its comment in the generated code and in the plan report (e.g. ``[i,k] [k,j] -> [i,j]``).

    >>> STEP_RULES[Contract].kind(Contract(0, 2, (0, 1), (("i", "k"), ("k", "j")), ("i", "j"), (), ()))
    'contract'
    """

    kind: Callable[[Any], str]
    note: Callable[[Any, Any], str]


STEP_RULES: dict[type, StepRule] = {
    Constant: StepRule(
        kind=lambda step: "constant",
        note=_no_note),
    Ones: StepRule(
        kind=lambda step: "ones",
        note=_no_note),
    Contract: StepRule(
        kind=lambda step: "contract",
        note=lambda source, step: " ".join(f"[{','.join(labels)}]" for labels in step.operands)
        + f" -> [{','.join(step.output)}]"),
    Reduce: StepRule(  # plain reductions, the normalisers and the linear-algebra kinds (einflow.engine.linalg)
        kind=lambda step: step.kind,
        note=_reduce_note),
    Solve: StepRule(
        kind=lambda step: step.kind,
        note=_solve_note),
    Elementwise: StepRule(
        kind=_elementwise_kind,
        note=lambda source, step: f"[{','.join(step.labels)}]"),
    Diagonal: StepRule(
        kind=lambda step: "diagonal",
        note=_diagonal_note),
    Window: StepRule(
        kind=lambda step: "window",
        note=_window_note),
    Scatter: StepRule(
        kind=lambda step: "scatter",
        note=_scatter_note),
    Free: StepRule(
        kind=lambda step: "free",
        note=_no_note),
}

assert set(STEP_RULES) == set(Step.__args__)  # type: ignore[attr-defined]
