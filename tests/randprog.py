"""Random einflow programs for differential testing, with an independent reference evaluator.

A program is built as this module's own small tree (not einflow's IR) and turned two ways:

* ``program_text(program)``: einflow source text;
* ``evaluate(program, arrays, xp)``: its value computed directly from the rules of the language
  reference (shared/LANGUAGE.md, section 3) with an array module ``xp`` (``jax.numpy`` for
  derivatives, ``numpy`` as a fallback). Products are explicit broadcast-multiply-and-sum over
  labelled axes; nothing here calls einflow.

``generate(seed)`` builds a valid program (scope rules, ambiguity guard and size sources respected),
its input arrays (positive where a function's domain needs it) and the ``wrt`` tensors to check.

>>> case = generate(7)
>>> isinstance(program_text(case.program), str)
True
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Num", "Ref", "Delta", "Prod", "Add", "Neg", "Call", "Pow", "Reduce", "Norm", "Bin", "Lin", "MatrixDecl", "Stmt",
    "SizeDecl",
    "Program", "Case",
    "FUNCTIONS", "program_text", "expr_text", "evaluate", "labels_of", "generate", "make_arrays", "Jet", "JetNumpy",
    "jet_derivatives",
]

FUNCTIONS = ("exp", "log", "log1p", "sqrt", "sin", "cos", "tanh", "sigmoid", "abs", "relu", "sign", "step")


# ----------------------------------------------------------------------------------------------- tree
@dataclass(frozen=True)
class Num:
    value: float
    text: str


@dataclass(frozen=True)
class Ref:
    """A tensor reference; ``positions`` (index arithmetic, LANGUAGE.md 8.2), when given, has one entry per axis:
    an index, ``("affine", coefficient, index, offset)`` or ``("const", value)``; ``indices`` are then the
    indices it mentions, each once."""

    name: str
    indices: tuple[str, ...]
    positions: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Delta:
    first: str
    second: str


@dataclass(frozen=True)
class Prod:
    """An n-ary product; ``divisor[k]`` marks a factor written after ``/``, ``star[k]`` one written after ``*``."""

    factors: tuple[Any, ...]
    divisor: tuple[bool, ...]
    star: tuple[bool, ...]


@dataclass(frozen=True)
class Add:
    terms: tuple[Any, ...]
    signs: tuple[int, ...]


@dataclass(frozen=True)
class Neg:
    operand: Any


@dataclass(frozen=True)
class Call:
    function: str
    argument: Any


@dataclass(frozen=True)
class Pow:
    base: Any
    exponent: float
    text: str


@dataclass(frozen=True)
class Reduce:
    indices: tuple[str, ...]
    body: Any
    kind: str = "sum"  # sum, max, min, mean, logsumexp


@dataclass(frozen=True)
class Norm:
    """A normaliser ``softmax[k](e)`` (also log_softmax, argmax, argmin): normalises over k, k stays free."""

    kind: str
    indices: tuple[str, ...]
    body: Any


@dataclass(frozen=True)
class Bin:
    """``maximum(a, b)`` or ``minimum(a, b)``: elementwise, the operands broadcast as the terms of a sum."""

    function: str
    left: Any
    right: Any


@dataclass(frozen=True)
class Lin:
    """``inv[a,b](M[a,b])``, ``det[a,b](...)`` or ``logdet[a,b](...)`` (LANGUAGE.md 8.1) of a square input ``M``
    read as ``M[a,b]`` (``M[b,a]`` when ``transposed``), plus ``shift delta[a,b]`` when ``shift`` is given;
    ``inv`` keeps a and b free, ``det`` and ``logdet`` (log|det|) reduce them."""

    kind: str
    indices: tuple[str, str]
    matrix: str
    transposed: bool = False
    shift: Num | None = None


@dataclass(frozen=True)
class MatrixDecl:
    """``spd M`` or ``symmetric M``: a declared square input (its arrays are drawn so)."""

    kind: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Stmt:
    target: str | None  # None: a bare expression
    indices: tuple[str, ...] | None  # None: implicit target
    expr: Any
    outer_parens: bool = False


@dataclass(frozen=True)
class SizeDecl:
    names: tuple[str, ...]
    source: str | int


@dataclass
class Program:
    items: list[Any]
    sizes: dict[str, int]
    inputs: dict[str, tuple[int, ...]]  # name -> shape
    positive: set[str]  # inputs whose entries must be positive
    #: integer inputs that gathers read through (``t`` in ``E[t[b],d]``) -> the length of the axis they index
    integers: dict[str, int] = field(default_factory=dict)
    #: square inputs the linear-algebra atoms read -> how they are declared ("spd", "symmetric" or None)
    matrices: dict[str, str | None] = field(default_factory=dict)

    @property
    def statements(self) -> list[Stmt]:
        return [item for item in self.items if isinstance(item, Stmt)]


@dataclass
class Case:
    seed: int
    program: Program
    wrt: list[str]
    scalar: bool
    text: str = ""
    notes: list[str] = field(default_factory=list)
    network: bool = False  # made by generate_network (every derivative check is run on it)


# ------------------------------------------------------------------------------------------- printing
def _atomic(e: Any) -> bool:
    """Can ``e`` stand as a power base or after a juxtaposition without parentheses?"""
    if isinstance(e, Num):
        return e.value >= 0 and "e" not in e.text.lower()
    return isinstance(e, (Ref, Delta, Call, Reduce, Norm, Bin, Lin))


def _position_text(position: Any) -> str:
    if isinstance(position, str):
        return position
    if position[0] == "const":
        return str(position[1])
    if position[0] == "gather":
        return f"{position[1]}[{position[2]}]"
    _, coefficient, index, offset = position
    text = index if coefficient == 1 else f"{coefficient}*{index}"
    return text + (f"+{offset}" if offset > 0 else f"-{-offset}" if offset < 0 else "")


def _ref_text(e: Ref) -> str:
    if e.positions:
        return e.name + "[" + ",".join(_position_text(p) for p in e.positions) + "]"
    return e.name + (f"[{','.join(e.indices)}]" if e.indices else "")


def _unary_text(e: Any) -> str:
    """Text that parses as a ``unary`` (may start with a sign)."""
    if isinstance(e, (Add, Prod)):
        return f"({expr_text(e)})"
    return expr_text(e)


def _factor_text(e: Any) -> str:
    """Text that parses as a juxtaposed factor: a ``power``, never starting with a sign or a number."""
    if isinstance(e, Pow):
        return expr_text(e)
    if _atomic(e) and not isinstance(e, Num):
        return expr_text(e)
    return f"({expr_text(e)})"


def expr_text(e: Any) -> str:
    """Einflow text of an expression."""
    if isinstance(e, Num):
        return e.text
    if isinstance(e, Ref):
        return _ref_text(e)
    if isinstance(e, Delta):
        return f"delta[{e.first},{e.second}]"
    if isinstance(e, Call):
        return f"{e.function}({expr_text(e.argument)})"
    if isinstance(e, (Reduce, Norm)):
        return f"{e.kind}[{','.join(e.indices)}]({expr_text(e.body)})"
    if isinstance(e, Bin):
        return f"{e.function}({expr_text(e.left)}, {expr_text(e.right)})"
    if isinstance(e, Lin):
        a, b = e.indices
        body = f"{e.matrix}[{b},{a}]" if e.transposed else f"{e.matrix}[{a},{b}]"
        if e.shift is not None:
            body += f" + {e.shift.text} delta[{a},{b}]"
        return f"{e.kind}[{a},{b}]({body})"
    if isinstance(e, Pow):
        base = expr_text(e.base) if _atomic(e.base) else f"({expr_text(e.base)})"
        return f"{base}{e.text}"
    if isinstance(e, Neg):
        inner = e.operand
        if isinstance(inner, (Add, Neg)) or (isinstance(inner, Num) and inner.value < 0):
            return f"-({expr_text(inner)})"
        if isinstance(inner, Prod):
            return f"-({expr_text(inner)})"
        return "-" + expr_text(inner)
    if isinstance(e, Add):
        parts = []
        for k, (term, sign) in enumerate(zip(e.terms, e.signs)):
            text = f"({expr_text(term)})" if isinstance(term, (Add, Neg)) else expr_text(term)
            if k == 0:
                parts.append(("-" if sign < 0 else "") + text)
            else:
                parts.append((" - " if sign < 0 else " + ") + text)
        return "".join(parts)
    if isinstance(e, Prod):
        parts = []
        for k, (factor, div, star) in enumerate(zip(e.factors, e.divisor, e.star)):
            if k == 0:
                parts.append(_unary_text(factor) if not isinstance(factor, Neg) else expr_text(factor))
            elif div:
                parts.append(" / " + (_factor_text(factor) if not isinstance(factor, Num) else factor.text))
            elif star or isinstance(factor, Num):
                parts.append(" * " + _unary_text(factor))
            else:
                parts.append(" " + _factor_text(factor))
        return "".join(parts)
    raise TypeError(e)


def statement_text(s: Stmt | SizeDecl | MatrixDecl) -> str:
    if isinstance(s, SizeDecl):
        return f"size {', '.join(s.names)} = {s.source}"
    if isinstance(s, MatrixDecl):
        return f"{s.kind} {', '.join(s.names)}"
    body = expr_text(s.expr)
    if s.outer_parens:
        body = f"({body})"
    if s.target is None:
        return body
    if s.indices is None:
        return f"{s.target} = {body}"
    return f"{s.target}[{','.join(s.indices)}] = {body}"


def program_text(p: Program) -> str:
    return "\n".join(statement_text(s) for s in p.items)


# ------------------------------------------------------------------------------------- scope analysis
def _product_items(e: Any, divisor: bool = False) -> list[tuple[str, Any, bool]]:
    """The factors of the one product ``e`` belongs to (parenthesized and signed factors flattened).

    Items: ("ref", Ref, inverted), ("delta", Delta, False), ("scope", expr, inverted), ("num", value, False).
    """
    if isinstance(e, Prod):
        items = []
        for factor, div in zip(e.factors, e.divisor):
            if div:
                items.append(("scope", factor, True))
            else:
                items.extend(_product_items(factor))
        return items
    if isinstance(e, Neg):
        return [("num", -1.0, False), *_product_items(e.operand)]
    if isinstance(e, Num):
        return [("num", e.value, False)]
    if isinstance(e, Ref):
        return [("ref", e, False)]
    if isinstance(e, Delta):
        return [("delta", e, False)]
    return [("scope", e, False)]


def _occurrences(item: tuple[str, Any, bool], bound: frozenset[str]) -> list[str]:
    kind, node, _ = item
    if kind == "ref":
        return list(node.indices)
    if kind == "delta":
        return [node.first, node.second]
    if kind == "scope":
        return list(labels_of(node, bound))
    return []


def _product_labels(items: list[tuple[str, Any, bool]], bound: frozenset[str]) -> tuple[str, ...]:
    occurrences = [_occurrences(item, bound) for item in items]
    counts: dict[str, int] = {}
    for occ in occurrences:
        for index in occ:
            counts[index] = counts.get(index, 0) + 1
    out: list[str] = []
    for occ in occurrences:
        for index in occ:
            if (counts[index] == 1 or index in bound) and index not in out:
                out.append(index)
    return tuple(out)


def labels_of(e: Any, bound: frozenset[str]) -> tuple[str, ...]:
    """Free indices of ``e`` (bound indices that occur count as free here), in the reference's order."""
    if isinstance(e, (Prod, Neg, Ref, Delta, Num)):
        return _product_labels(_product_items(e), bound)
    if isinstance(e, Add):
        out: list[str] = []
        for term in e.terms:
            for index in labels_of(term, bound):
                if index not in out:
                    out.append(index)
        return tuple(out)
    if isinstance(e, (Call,)):
        return labels_of(e.argument, bound)
    if isinstance(e, Pow):
        return labels_of(e.base, bound)
    if isinstance(e, Reduce):
        inner = labels_of(e.body, bound | frozenset(e.indices))
        return tuple(i for i in inner if i not in e.indices)
    if isinstance(e, Norm):
        return labels_of(e.body, bound)
    if isinstance(e, Bin):
        return labels_of(Add((e.left, e.right), (1, 1)), bound)
    if isinstance(e, Lin):
        return e.indices if e.kind == "inv" else ()
    raise TypeError(e)


# ------------------------------------------------------------------------------------------ evaluation
class _Eval:
    def __init__(self, xp: Any, arrays: dict[str, Any], sizes: dict[str, int]) -> None:
        self.xp = xp
        self.arrays = arrays
        self.sizes = sizes

    def _align(self, value: Any, labels: Sequence[str], target: Sequence[str]) -> Any:
        """``value`` (axes ``labels``) transposed and reshaped to broadcast against axes ``target``."""
        xp = self.xp
        order = sorted(range(len(labels)), key=lambda k: target.index(labels[k]))
        if order != list(range(len(labels))):
            value = xp.transpose(value, order)
        present = {labels[k] for k in order}
        shape = tuple(self.sizes[t] if t in present else 1 for t in target)
        return xp.reshape(value, shape)

    def _ref(self, node: Ref) -> tuple[Any, tuple[str, ...]]:
        value = self.arrays[node.name]
        unique = tuple(dict.fromkeys(node.indices))
        if node.positions:  # a read through positions: one index array per axis over the unique labels
            index: list[Any] = []
            inside = np.ones((), dtype=bool)  # where a padded read stays inside the tensor (it reads 0 elsewhere)
            for axis, position in enumerate(node.positions):
                if isinstance(position, str) or position[0] == "affine":
                    coefficient, label, offset = (1, position, 0) if isinstance(position, str) else position[1:]
                    shape = [1] * len(unique)
                    shape[unique.index(label)] = self.sizes[label]
                    at = coefficient * np.arange(self.sizes[label]).reshape(shape) + offset
                    length = np.shape(value)[axis]
                    inside = inside & (at >= 0) & (at < length)
                    index.append(np.clip(at, 0, length - 1))
                elif position[0] == "gather":
                    shape = [1] * len(unique)
                    shape[unique.index(position[2])] = self.sizes[position[2]]
                    index.append(np.asarray(self.arrays[position[1]]).reshape(shape))
                else:
                    index.append(np.asarray(position[1]))
            read = value[tuple(np.broadcast_arrays(*index))]
            if not inside.all():
                read = read * np.broadcast_to(inside, np.shape(read))
            return read, unique
        if len(unique) == len(node.indices):
            return value, unique
        index = []
        for label in node.indices:  # gather the diagonal: one arange per axis, laid out over the unique labels
            position = unique.index(label)
            shape = [1] * len(unique)
            shape[position] = self.sizes[label]
            index.append(np.arange(self.sizes[label]).reshape(shape))
        return value[tuple(index)], unique

    def product(self, items: list[tuple[str, Any, bool]], bound: frozenset[str]) -> tuple[Any, tuple[str, ...]]:
        xp = self.xp
        out = _product_labels(items, bound)
        scale = 1.0
        operands: list[tuple[Any, tuple[str, ...]]] = []
        for kind, node, inverted in items:
            if kind == "num":
                scale *= node
                continue
            if kind == "ref":
                value, labels = self._ref(node)
            elif kind == "delta":
                n = self.sizes[node.first]
                if node.first == node.second:
                    value, labels = xp.asarray(np.ones(n)), (node.first,)
                else:
                    value, labels = xp.asarray(np.eye(n)), (node.first, node.second)
            else:
                value, labels = self.expr(node, bound)
                if inverted:
                    value = 1.0 / value
            operands.append((value, labels))
        every: list[str] = list(out)
        for _, labels in operands:
            every.extend(label for label in labels if label not in every)
        result: Any = None
        for value, labels in operands:
            aligned = self._align(value, labels, every)
            result = aligned if result is None else result * aligned
        if result is None:
            return xp.asarray(scale), ()
        summed = tuple(k for k, label in enumerate(every) if label not in out)
        if summed:
            result = xp.sum(result, axis=summed)
        result = xp.broadcast_to(result, tuple(self.sizes[label] for label in out))
        return (result * scale if scale != 1.0 else result), out

    def expr(self, e: Any, bound: frozenset[str]) -> tuple[Any, tuple[str, ...]]:
        xp = self.xp
        if isinstance(e, (Prod, Neg, Ref, Delta, Num)):
            return self.product(_product_items(e), bound)
        if isinstance(e, Add):
            labels = labels_of(e, bound)
            total: Any = 0.0
            for term, sign in zip(e.terms, e.signs):
                value, term_labels = self.expr(term, bound)
                total = total + sign * self._align(value, term_labels, labels)
            return xp.broadcast_to(total, tuple(self.sizes[label] for label in labels)), labels
        if isinstance(e, Call):
            value, labels = self.expr(e.argument, bound)
            return _apply(xp, e.function, value), labels
        if isinstance(e, Pow):
            value, labels = self.expr(e.base, bound)
            exponent = e.exponent
            if float(exponent).is_integer():
                return value ** int(exponent), labels
            return value ** exponent, labels
        if isinstance(e, Reduce):
            value, labels = self.expr(e.body, bound | frozenset(e.indices))
            axes = tuple(k for k, label in enumerate(labels) if label in e.indices)
            kept = tuple(label for label in labels if label not in e.indices)
            return _reduce(xp, e.kind, value, axes), kept
        if isinstance(e, Norm):
            value, labels = self.expr(e.body, bound)
            return _normalise(xp, e.kind, value, tuple(labels.index(k) for k in e.indices)), labels
        if isinstance(e, Bin):
            labels = labels_of(e, bound)
            shape = tuple(self.sizes[label] for label in labels)
            operands = []
            for operand in (e.left, e.right):
                value, operand_labels = self.expr(operand, bound)
                operands.append(xp.broadcast_to(self._align(value, operand_labels, labels), shape))
            return _extreme_of_two(e.function, *operands), labels
        if isinstance(e, Lin):
            matrix = self.arrays[e.matrix]
            if e.transposed:
                matrix = xp.transpose(matrix, (1, 0))
            if e.shift is not None:
                matrix = matrix + e.shift.value * np.eye(self.sizes[e.indices[0]])
            return _matrix_function(xp, e.kind, matrix), (e.indices if e.kind == "inv" else ())
        raise TypeError(e)

    def statement(self, s: Stmt) -> Any:
        xp = self.xp
        if s.indices is None:
            value, _ = self.expr(s.expr, frozenset())
            return value
        target = s.indices
        bound = frozenset(target)
        terms, signs = (s.expr.terms, s.expr.signs) if isinstance(s.expr, Add) else ((s.expr,), (1,))
        total: Any = 0.0
        for term, sign in zip(terms, signs):
            value, labels = self.expr(term, bound)
            extra = tuple(k for k, label in enumerate(labels) if label not in target)
            if extra:
                value = xp.sum(value, axis=extra)
            labels = tuple(label for label in labels if label in target)
            total = total + sign * self._align(value, labels, target)
        return xp.broadcast_to(total, tuple(self.sizes[t] for t in target))


def _matrix_function(xp: Any, kind: str, m: Any) -> Any:
    """inv, det or log|det| of the matrix ``m``: the array module's own, or exact jets (value, first and second
    derivatives from the closed forms d inv = -Y dM Y, d log|det| = tr(Y dM), with Y = inv(M))."""
    if not isinstance(m, Jet):
        module = np if xp is JetNumpy else xp
        if kind == "inv":
            return module.linalg.inv(m)
        return module.linalg.det(m) if kind == "det" else module.linalg.slogdet(m)[1]
    y = np.linalg.inv(m.v)
    ydy = np.einsum("ij,jlA->ilA", y, m.d)  # Y dM_A
    if kind == "inv":
        first = -np.einsum("ilA,lm->imA", ydy, y)  # -Y dM_A Y
        second = None
        if m.h is not None:  # Y dM_A Y dM_B Y + Y dM_B Y dM_A Y - Y d2M_AB Y
            both = np.einsum("ilA,lmB,mn->inAB", ydy, ydy, y)
            second = both + both.transpose(0, 1, 3, 2) - np.einsum("ij,jlAB,lm->imAB", y, m.h, y)
        return Jet(y, first, second)
    logdet = np.linalg.slogdet(m.v)[1]
    gradient = np.einsum("iiA->A", ydy)
    hessian = None
    if m.h is not None:  # tr(Y d2M_AB) - tr(Y dM_A Y dM_B)
        hessian = np.einsum("ij,jiAB->AB", y, m.h) - np.einsum("ilA,liB->AB", ydy, ydy)
    if kind == "logdet":
        return Jet(np.asarray(logdet), gradient, hessian)
    det = np.linalg.det(m.v)  # det = exp(log|det|) with its sign: d det = det g, d2 det = det (H + g g^T)
    return Jet(np.asarray(det), det * gradient,
               None if hessian is None else det * (hessian + np.outer(gradient, gradient)))


def _reduce(xp: Any, kind: str, value: Any, axes: tuple[int, ...]) -> Any:
    """The reference reductions, written independently of einflow: a numpy max-shift (no derivative flows
    through the shift), the arg-max indicator with ties split equally as fixed weights."""
    if kind == "sum":
        return xp.sum(value, axis=axes)
    raw, rp = _raw(value)
    count = int(np.prod([raw.shape[a] for a in axes]))
    if kind == "mean":
        return xp.sum(value, axis=axes) * (1.0 / count)
    if kind == "logsumexp":
        _note_normalised(raw, rp)
        shift = rp.max(raw, axis=axes, keepdims=True)
        return xp.log(xp.sum(xp.exp(value - shift), axis=axes)) + rp.squeeze(shift, axis=axes)
    extreme = (rp.max if kind == "max" else rp.min)(raw, axis=axes, keepdims=True)
    hits = (raw == extreme).astype(float)
    weights = hits / rp.sum(hits, axis=axes, keepdims=True)
    return xp.sum(value * weights, axis=axes)


def _raw(value: Any) -> tuple[Any, Any]:
    """The value no derivative flows through (a shift, an indicator) and the array module for it: numpy for
    numbers and jets; under JAX's tracing (the ``EINFLOW_DIFF_REFERENCE=jax`` reference) a stopped-gradient
    jax array and jax.numpy."""
    if isinstance(value, Jet):
        return value.v, np
    if type(value).__module__.startswith("jax"):
        import jax

        return jax.lax.stop_gradient(value), jax.numpy
    return np.asarray(value), np


def _normalise(xp: Any, kind: str, value: Any, axes: tuple[int, ...]) -> Any:
    """softmax, log_softmax (max-shifted, no derivative through the shift) and the argmax/argmin indicator
    (ties split equally, constant) over ``axes``, keeping every axis."""
    raw, rp = _raw(value)
    _note_normalised(raw, rp)
    if kind in ("argmax", "argmin"):
        extreme = (rp.max if kind == "argmax" else rp.min)(raw, axis=axes, keepdims=True)
        close = rp.abs(raw - extreme) <= 1e-9 * (1 + rp.abs(extreme))
        # (a tie, or nearly: rounding decides which entry wins; seen on the numpy evaluation of the value)
        if rp is np and np.any(np.sum(close, axis=axes) > 1):
            NEAR_TIE[0] = True
        hits = (raw == extreme).astype(float)
        return xp.asarray(hits / rp.sum(hits, axis=axes, keepdims=True))
    kept_shape = tuple(1 if k in axes else n for k, n in enumerate(raw.shape))
    shifted = value - rp.max(raw, axis=axes, keepdims=True)
    log_total = xp.reshape(xp.log(xp.sum(xp.exp(shifted), axis=axes)), kept_shape)
    log_softmax = shifted - log_total
    return log_softmax if kind == "log_softmax" else xp.exp(log_softmax)


def _extreme_of_two(function: str, left: Any, right: Any) -> Any:
    """maximum / minimum with the derivative of JAX: the larger (smaller) operand's, ties split equally."""
    (a, _), (b, _) = _raw(left), _raw(right)
    wins = (a > b) if function == "maximum" else (a < b)
    weight = wins.astype(float) + 0.5 * (a == b)
    return left * weight + right * (1.0 - weight)


#: set when an argmax/argmin in the last evaluation had (nearly) tied entries: the indicator is discontinuous
#: there, so two correct evaluations that round differently give different values
NEAR_TIE = [False]

#: the largest magnitude a softmax, log_softmax, logsumexp or argmax/argmin was applied to in the last numpy
#: evaluation: with logits of a million, probabilities of 1e-60000 and derivatives that cancel terms of 1e9
#: and more, two correct float64 second derivatives can differ in their third digit
NORMALISED_ARGUMENT = [0.0]


def _note_normalised(raw: Any, rp: Any) -> None:
    if rp is np:
        finite = np.abs(np.asarray(raw, dtype=float))
        finite = finite[np.isfinite(finite)]
        NORMALISED_ARGUMENT[0] = max(NORMALISED_ARGUMENT[0], float(finite.max(initial=0.0)))


#: the largest magnitude a periodic function (sin, cos) was applied to in the last numpy evaluation: far out
#: the function's value depends on the argument's last bits, so two correct evaluations need not agree
PERIODIC_ARGUMENT = [0.0]


def _apply(xp: Any, name: str, x: Any) -> Any:
    if name in ("sin", "cos") and xp is np:
        finite = np.abs(np.asarray(x, dtype=float))
        finite = finite[np.isfinite(finite)]
        PERIODIC_ARGUMENT[0] = max(PERIODIC_ARGUMENT[0], float(finite.max(initial=0.0)))
    on_jax = getattr(xp, "__name__", "") == "jax.numpy"  # the EINFLOW_DIFF_REFERENCE=jax reference
    if name == "softplus":
        return xp.logaddexp(0.0, x) if xp is np or on_jax else xp.softplus(x)
    if name == "erf":
        if on_jax:
            import jax.scipy.special

            return jax.scipy.special.erf(x)
        return np.vectorize(math.erf)(x) if xp is np else xp.erf(x)
    if name == "sigmoid":
        return 1.0 / (1.0 + xp.exp(-x))
    if name == "relu":
        return xp.where(x > 0, x, 0.0 * x)
    if name == "step":
        return xp.where(x > 0, 1.0, 0.0) + 0.0 * x
    if name == "sign":
        return xp.sign(x)
    return getattr(xp, name)(x)


def evaluate(p: Program, arrays: dict[str, Any], xp: Any = np) -> Any:
    """The program's value by the reference rules (the last statement's value)."""
    env = dict(arrays)
    evaluator = _Eval(xp, env, p.sizes)
    value = None
    for s in p.statements:
        value = evaluator.statement(s)
        if s.target is not None:
            env[s.target] = value
    return value


# ------------------------------------------------------------------------------------------ generation
_INDEX_POOL = ("i", "j", "k", "l", "m", "n", "a", "b", "c", "p", "q", "r", "hid", "t2")
_INPUT_POOL = ("x", "y", "z", "u", "v", "w", "A", "B", "C", "M", "W", "P", "Q", "R", "s", "g", "e", "X", "U", "V")
_TARGET_POOL = ("h", "T", "H", "S", "G", "Y", "Z", "h2", "T1")
_ANY_FUNCTIONS = ("exp", "sin", "cos", "tanh", "sigmoid", "abs", "relu", "sign", "step")
#: drawn instead of an _ANY_FUNCTIONS function now and then (from the generator's second stream)
_NEW_FUNCTIONS = ("softplus", "erf")
#: reductions other than sum, drawn now and then (each binds its indices exactly as sum does)
_REDUCTION_KINDS = ("sum",) * 8 + ("max", "min", "mean", "logsumexp")
#: normalisers (softmax[k](e) and kin: k stays free), drawn from the second stream like maximum/minimum
_NORMALISER_KINDS = ("softmax", "softmax", "log_softmax", "log_softmax", "argmax", "argmin")
_POS_FUNCTIONS = ("exp", "sigmoid", "sqrt", "log1p")
_INT_EXPONENTS = (("^2", 2), ("^3", 3), ("**2", 2), ("^(+2)", 2), ("^+3", 3), ("^1", 1))
_POS_EXPONENTS = (("^-1", -1), ("^(-1)", -1), ("^-2", -2), ("^0.5", 0.5), ("^-0.5", -0.5), ("^.5", 0.5),
                  ("^1.5", 1.5), ("** -1.5", -1.5), ("^(-0.25)", -0.25), ("^2.5", 2.5))
_NUMBERS = (("2", 2.0), ("3", 3.0), ("0.5", 0.5), (".25", 0.25), ("2.", 2.0), ("1.5", 1.5), ("1e-1", 0.1),
            ("1", 1.0), ("2.5E+0", 2.5))


@dataclass(frozen=True)
class _Ctx:
    bound: frozenset[str]
    outer_free: frozenset[str]
    depth: int
    positive: bool


class _Generator:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        # the reductions and functions added later are drawn from their own stream, so that the programs of
        # the main stream (the seeds the suite has always run) keep their shape
        self.extra = random.Random(seed * 104729 + 7)
        # EINFLOW_DIFF_LANGUAGE=v1: without the reductions and functions added later (the same programs as
        # the v1 generator drew for each seed)
        self.v2 = os.environ.get("EINFLOW_DIFF_LANGUAGE", "v2") != "v1"
        # language v3 (the default; EINFLOW_DIFF_LANGUAGE=v1 or v2 leave it out): also reads through shifted,
        # strided and constant positions (LANGUAGE.md 8.2), in range, drawn from a stream of their own, so
        # that the main stream's programs keep their shape (a declared size makes them padded reads, all
        # still in range)
        self.v3 = os.environ.get("EINFLOW_DIFF_LANGUAGE", "v3") not in ("v1", "v2")
        self.shifts = random.Random(seed * 7919 + 26)
        # language v4 (the default; EINFLOW_DIFF_LANGUAGE=v1, v2 or v3 leave it out): inv, det and logdet of
        # well-conditioned square inputs, some declared spd or symmetric, and products with them (LANGUAGE.md
        # 8.1), drawn from a stream of their own so that the other programs of each seed keep their shape
        self.v4 = os.environ.get("EINFLOW_DIFF_LANGUAGE", "v4") not in ("v1", "v2", "v3")
        self.linalg = random.Random(seed * 6007 + 41)
        self.matrices: dict[str, str | None] = {}
        self.integers: dict[str, int] = {}
        self.padded: set[str] = set()  # indices read past an end (they get a ``size`` line)
        self.sizes: dict[str, int] = {}
        self.inputs: dict[str, tuple[int, ...]] = {}
        self.positive: set[str] = set()
        self.targets: dict[str, tuple[int, ...]] = {}
        self.positive_targets: set[str] = set()
        self.statement_indices: list[str] = []  # index names used in the current statement (to reuse)
        self.ref_budget = 0

    # -- indices and tensors
    def size_of(self, index: str) -> int:
        if index not in self.sizes:
            self.sizes[index] = self.r.choice((2, 2, 3, 3, 3, 1, 4)) if len(self.sizes) > 1 else self.r.choice((2, 3))
        return self.sizes[index]

    def pick_index(self, exclude: set[str] | frozenset[str], size: int | None = None) -> str:
        r = self.r
        reuse = [i for i in self.statement_indices if i not in exclude and (size is None or self.sizes[i] == size)]
        if reuse and r.random() < 0.5:
            name = r.choice(reuse)
        else:
            choices = [i for i in _INDEX_POOL if i not in exclude and (size is None or self.sizes.get(i, size) == size)]
            name = r.choice(choices)
            if size is not None:
                self.sizes.setdefault(name, size)
        self.size_of(name)
        if name not in self.statement_indices:
            self.statement_indices.append(name)
        return name

    def ref(self, indices: list[str], positive: bool) -> Ref:
        r = self.r
        shape = tuple(self.size_of(i) for i in indices)
        targets = [t for t, s in self.targets.items() if s == shape and (not positive or t in self.positive_targets)]
        if targets and r.random() < 0.8:
            return Ref(r.choice(targets), tuple(indices))
        existing = [n for n, s in self.inputs.items() if s == shape and (not positive or n in self.positive)
                    and n not in self.integers]
        if existing and r.random() < 0.6:
            return Ref(r.choice(existing), tuple(indices))
        free = [n for n in _INPUT_POOL if n not in self.inputs and n not in self.targets]
        if not free:
            if existing:
                return Ref(r.choice(existing), tuple(indices))
            free = [f"in{len(self.inputs)}"]
        if len(indices) == 0:
            preferred = [n for n in free if n in ("s", "g", "e")]
        elif len(indices) == 1:
            preferred = [n for n in free if n.islower()]
        else:
            preferred = [n for n in free if n.isupper()]
        name = r.choice(preferred or free)
        self.inputs[name] = shape
        if positive or r.random() < 0.3:
            self.positive.add(name)
        if self.v3 and indices and len(set(indices)) == len(indices) and self.shifts.random() < 0.12:
            return self.shifted_ref(name, list(indices))
        return Ref(name, tuple(indices))

    def shifted_ref(self, name: str, indices: list[str]) -> Ref:
        """A new input read through a shifted (``x[i+1]``), strided (``x[2*i+1]``) or constant (``X[2,i]``)
        position or gathered through an integer input (``E[t[b],d]``), its axis exactly as long as the index's range
        needs (in range, nothing inferred smaller); or, one shifted or strided read in four, a padded one: the axis
        as long as the index's range, the read past an end reading 0, and a ``size`` line for the index."""
        r = self.shifts
        axis = r.randrange(len(indices))
        index = indices[axis]
        n = self.size_of(index)
        kind = r.choice(("shift", "shift", "stride", "const", "gather"))
        positions: list[Any] = list(indices)
        shape = [self.size_of(i) for i in indices]
        # a padded read reads zeros: never of an input a divisor, log or root needs positive
        padded = kind in ("shift", "stride") and r.random() < 0.25 and name not in self.positive
        if kind == "shift":
            offset = r.choice((1, 2, -1) if padded else (1, 2))
            positions[axis] = ("affine", 1, index, offset)
            shape[axis] = n if padded else n + offset
        elif kind == "stride":
            offset = r.choice((0, 1))
            positions[axis] = ("affine", 2, index, offset)
            shape[axis] = n if padded else 2 * (n - 1) + offset + 1
        if kind == "shift" and not padded and len(indices) > 1 and r.random() < 0.4:
            # a second axis shifted by another offset (U[a+1, b+2]): the 2-D stencil family
            second = r.choice([k for k in range(len(indices)) if k != axis])
            other = r.choice((1, 2))
            positions[second] = ("affine", 1, indices[second], other)
            shape[second] = self.size_of(indices[second]) + other
        if padded:
            self.padded.add(index)
        elif kind == "gather":  # E[t[b],d]: t an integer input with values in the axis, repeats allowed
            gather = next(f"ix{k}" for k in range(1, 100) if f"ix{k}" not in self.inputs)
            length = r.choice((2, 3, 4))
            self.inputs[gather] = (n,)
            self.integers[gather] = length
            positions[axis] = ("gather", gather, index)
            shape[axis] = length
        else:
            value = r.choice((0, 1, 2))
            positions.insert(axis, ("const", value))
            shape.insert(axis, value + 1 + r.choice((0, 1)))
        self.inputs[name] = tuple(shape)
        return Ref(name, tuple(indices), tuple(positions))

    def matrix_atom(self, exclude: set[str]) -> Any:
        """A scalar factor over a square input M (n = 2..4) on two fresh indices: ``logdet[a,b](M)``,
        ``det[a,b](M)``, ``u[a] inv[a,b](M) w[b]`` or ``inv[a,b](M) B[a,b]``, M read as ``M[a,b]``, ``M[b,a]`` or
        ``M[a,b] + c delta[a,b]``. Conditioning: M's arrays are ``well_conditioned_matrix`` draws (condition
        number below about 5) and c >= 0.5 is added only to matrices whose eigenvalues are positive (an
        undeclared ``3 I + G/sqrt(n)`` or an spd one), so every atom's matrix stays well away from singular."""
        r = self.linalg
        free = [i for i in _INDEX_POOL if i not in exclude and i not in self.statement_indices]
        if len(free) < 2:
            return None
        a = r.choice(free)
        n = self.sizes.get(a) or r.choice((2, 3, 4))
        partners = [i for i in free if i != a and self.sizes.get(i, n) == n]
        if not partners:
            return None
        b = r.choice(partners)
        for index in (a, b):
            self.sizes.setdefault(index, n)
            self.statement_indices.append(index)
        same = [name for name, kind in self.matrices.items() if self.inputs[name] == (n, n)]
        if same and r.random() < 0.4:
            matrix = r.choice(same)
        else:
            names = [name for name in _INPUT_POOL if name.isupper() and name not in self.inputs
                     and name not in self.targets]
            matrix = names[0] if names else f"in{len(self.inputs)}"
            self.inputs[matrix] = (n, n)
            self.matrices[matrix] = r.choice((None, None, "spd", "symmetric"))
        shift = None
        if self.matrices[matrix] != "symmetric" and r.random() < 0.3:
            shift = r.choice((Num(0.5, "0.5"), Num(1.0, "1")))
        kind = r.choice(("logdet", "det", "inv", "inv"))
        atom = Lin(kind, (a, b), matrix, r.random() < 0.3, shift)
        if kind != "inv":
            return atom
        if r.random() < 0.5:
            return Prod((self.matrix_operand((n,), a), atom, self.matrix_operand((n,), b)), (False,) * 3, (False,) * 3)
        return Prod((atom, self.matrix_operand((n, n), a, b)), (False,) * 2, (False,) * 2)

    def matrix_operand(self, shape: tuple[int, ...], *indices: str) -> Ref:
        """An input of ``shape`` (an existing one now and then) read on ``indices``, from the linear-algebra stream."""
        existing = [name for name, s in self.inputs.items() if s == shape and name not in self.integers
                    and name not in self.matrices]
        if existing and self.linalg.random() < 0.5:
            return Ref(self.linalg.choice(existing), indices)
        names = [name for name in _INPUT_POOL if name not in self.inputs and name not in self.targets
                 and name.islower() == (len(shape) == 1)]
        name = names[0] if names else f"in{len(self.inputs)}"
        self.inputs[name] = shape
        return Ref(name, indices)

    def number(self, positive: bool) -> Num:
        text, value = self.r.choice(_NUMBERS)
        return Num(value, text)

    # -- expressions
    def expr(self, out: list[str], must: list[str], ctx: _Ctx) -> Any:
        """An expression in which each of ``out`` is free (occurs once) and each bound index of ``must`` occurs."""
        r = self.r
        if ctx.depth <= 0 or self.ref_budget <= 0:
            return self.product(out, must, ctx, leaf=True)
        choice = r.random()
        if choice < 0.40:
            return self.product(out, must, ctx, leaf=False)
        if choice < 0.53:
            return self.add(out, must, ctx)
        if choice < 0.68:
            return self.call(out, must, ctx)
        if choice < 0.79:
            return self.power(out, must, ctx)
        if choice < 0.95:
            return self.reduce(out, must, ctx)
        if ctx.positive:
            return self.product(out, must, ctx, leaf=False)
        return Neg(self.expr(out, must, _Ctx(ctx.bound, ctx.outer_free, ctx.depth - 1, False)))

    def deeper(self, ctx: _Ctx, out: list[str], positive: bool | None = None) -> _Ctx:
        return _Ctx(ctx.bound, ctx.outer_free | frozenset(out), ctx.depth - 1,
                    ctx.positive if positive is None else positive)

    def product(self, out: list[str], must: list[str], ctx: _Ctx, leaf: bool) -> Any:
        r = self.r
        child_ctx = self.deeper(ctx, out)
        # contracted indices: never bound, never free in this product or an enclosing one
        exclude = set(ctx.bound) | set(ctx.outer_free) | set(out)
        contracted = []
        for _ in range(r.choice((0, 0, 1, 1, 1, 2, 2, 3)) if self.ref_budget > 0 else 0):
            contracted.append(self.pick_index(exclude | set(contracted)))
        occurrences: list[str] = list(out) + list(must)
        for index in contracted:
            occurrences += [index] * r.choice((2, 2, 2, 2, 3))
        factors: list[Any] = []
        divisor: list[bool] = []
        readable = [t for t in self.targets if not ctx.positive or t in self.positive_targets]
        if readable and self.ref_budget > 0 and r.random() < 0.5:
            # read an earlier result: its axes contracted with the rest of this product
            target = r.choice(readable)
            indices: list[str] = []
            for size in self.targets[target]:
                choices = [i for i in _INDEX_POOL if i not in exclude and i not in contracted and i not in indices
                           and self.sizes.get(i, size) == size]
                if not choices:
                    break
                indices.append(self.pick_index(exclude | set(contracted) | set(indices), size=size)
                               if r.random() < 0.5 else r.choice(choices))
                self.sizes.setdefault(indices[-1], size)
            if len(indices) == len(self.targets[target]):
                factors.append(Ref(target, tuple(indices)))
                divisor.append(False)
                occurrences += list(indices)
                self.ref_budget -= 1
        if ctx.bound and r.random() < 0.3:
            occurrences.append(r.choice(sorted(ctx.bound)))  # a loop variable read twice: never contracted
        r.shuffle(occurrences)
        # group occurrences into factors: tensor refs take any multiset, deltas two of one size,
        # nested scopes a set (each index counts once there)
        pending = list(occurrences)
        while pending or not factors:
            kind = r.random()
            if not ctx.positive and len(pending) >= 2 and kind < 0.15:
                first = pending[0]
                partners = [k for k, i in enumerate(pending[1:], 1) if self.sizes[i] == self.sizes[first]]
                if partners and (pending[partners[0]] != first or first in ctx.bound or first in contracted):
                    second = pending.pop(partners[0])
                    pending.pop(0)
                    factors.append(Delta(first, second))
                    divisor.append(False)
                    continue
            if not leaf and kind > 0.55 and self.ref_budget > 0:
                take = []
                for index in list(pending):
                    if index not in take and len(take) < 3 and r.random() < 0.7:
                        take.append(index)
                        pending.remove(index)
                nested_out = [i for i in take if i not in ctx.bound]
                nested_must = [i for i in take if i in ctx.bound]
                is_divisor = bool(factors) and r.random() < 0.3
                sub = _Ctx(child_ctx.bound, child_ctx.outer_free, child_ctx.depth,
                           True if is_divisor else ctx.positive)
                node = self.expr(nested_out, nested_must, sub)
                factors.append(node)
                divisor.append(is_divisor)
                continue
            rank = min(len(pending), r.choice((0, 1, 1, 2, 2, 2, 3)))
            if rank == 0 and pending:
                rank = 1
            take = pending[:rank]
            del pending[:rank]
            r.shuffle(take)
            factors.append(self.ref(take, ctx.positive))
            self.ref_budget -= 1
            divisor.append(False)
        if self.v4 and not ctx.positive and self.linalg.random() < 0.06:
            atom = self.matrix_atom(exclude | set(contracted) | set(occurrences))
            if atom is not None:
                factors.append(atom)
                divisor.append(False)
        if r.random() < 0.08:
            factors.append(self.ref([], ctx.positive))
            divisor.append(False)
        if not ctx.positive and r.random() < 0.1:
            factors.insert(0, Neg(self.number(True)) if r.random() < 0.3 else self.number(True))
            divisor.insert(0, False)
        elif r.random() < 0.2:
            factors.insert(0, self.number(True))
            divisor.insert(0, False)
        if divisor[0]:
            divisor[0] = False
        if len(factors) == 1:
            return factors[0]
        # sometimes group a run of factors in parentheses (still one product) or sign one
        if len(factors) >= 3 and r.random() < 0.2 and not any(divisor[1:3]):
            inner = Prod(tuple(factors[1:3]), (False, False), (False, False))
            factors[1:3] = [Neg(inner) if not ctx.positive and r.random() < 0.5 else inner]
            divisor[1:3] = [False]
        star = tuple(r.random() < 0.25 for _ in factors)
        return Prod(tuple(factors), tuple(divisor), star)

    def add(self, out: list[str], must: list[str], ctx: _Ctx) -> Any:
        r = self.r
        count = r.choice((2, 2, 3))
        outs: list[list[str]] = [[] for _ in range(count)]
        musts: list[list[str]] = [[] for _ in range(count)]
        for index in out:
            for k in range(count):
                if r.random() < 0.6:
                    outs[k].append(index)
            if not any(index in o for o in outs):
                outs[r.randrange(count)].append(index)
        for index in must:
            chosen = [k for k in range(count) if r.random() < 0.6] or [r.randrange(count)]
            for k in chosen:
                musts[k].append(index)
        child = self.deeper(ctx, out)
        terms = [self.expr(o, m, child) for o, m in zip(outs, musts)]
        if r.random() < 0.25:  # a scalar term, broadcast over the others' indices (`x[k] z[m] + s`)
            terms.append(self.ref([], ctx.positive) if r.random() < 0.7 else self.number(True))
        terms = tuple(terms)
        signs = tuple(1 if ctx.positive or r.random() < 0.6 else -1 for _ in terms)
        return Add(terms, signs)

    def call(self, out: list[str], must: list[str], ctx: _Ctx) -> Any:
        r = self.r
        if self.v2:
            draw = self.extra.random()
            if draw < 0.12 and (out or must):
                return self.normaliser(out, must, ctx)
            if draw < 0.2:
                return self.binary(out, must, ctx)
        if ctx.positive or r.random() < 0.35:
            function = r.choice(_POS_FUNCTIONS if ctx.positive else _POS_FUNCTIONS + ("log",))
            positive_argument = function in ("sqrt", "log1p", "log")
        else:
            function = r.choice(_ANY_FUNCTIONS)
            if self.v2 and self.extra.random() < 0.15:
                function = self.extra.choice(_NEW_FUNCTIONS)
            positive_argument = False
        argument_ctx = self.deeper(ctx, out, positive_argument)
        if function == "exp" and argument_ctx.depth > 1:
            argument_ctx = _Ctx(argument_ctx.bound, argument_ctx.outer_free, 1, False)
        return Call(function, self.expr(out, must, argument_ctx))

    def normaliser(self, out: list[str], must: list[str], ctx: _Ctx) -> Any:
        """``softmax[k](e)`` and its kin over one or two of the indices the body leaves free (or reads bound)."""
        kind = "softmax" if ctx.positive else self.extra.choice(_NORMALISER_KINDS)
        candidates = list(out) + list(must)
        count = min(len(candidates), self.extra.choice((1, 1, 1, 2)))
        indices = tuple(self.extra.sample(candidates, count))
        return Norm(kind, indices, self.expr(out, must, self.deeper(ctx, out, False)))

    def binary(self, out: list[str], must: list[str], ctx: _Ctx) -> Any:
        """``maximum(a, b)`` / ``minimum(a, b)``: each free (bound) index in one operand at least."""
        function = self.extra.choice(("maximum", "minimum"))
        sides: list[tuple[list[str], list[str]]] = [([], []), ([], [])]
        for position, indices in ((0, out), (1, must)):
            for index in indices:
                chosen = [k for k in (0, 1) if self.extra.random() < 0.6] or [self.extra.randrange(2)]
                for k in chosen:
                    sides[k][position].append(index)
        child = self.deeper(ctx, out)
        left, right = (self.expr(o, m, child) for o, m in sides)
        return Bin(function, left, right)

    def power(self, out: list[str], must: list[str], ctx: _Ctx) -> Any:
        r = self.r
        if ctx.positive or r.random() < 0.5:
            text, exponent = r.choice(_POS_EXPONENTS + _INT_EXPONENTS)
            positive_base = True
        else:
            text, exponent = r.choice(_INT_EXPONENTS)
            positive_base = False
        base = self.expr(out, must, self.deeper(ctx, out, positive_base))
        return Pow(base, exponent, text)

    def reduce(self, out: list[str], must: list[str], ctx: _Ctx) -> Any:
        r = self.r
        # the reduced name may be free around the sum (`x[k] sum[k](y[k])`), never bound or free here
        exclude = set(ctx.bound) | set(out) | (set() if r.random() < 0.3 else set(ctx.outer_free))
        reduced: list[str] = []
        for _ in range(r.choice((1, 1, 1, 2))):
            reduced.append(self.pick_index(exclude | set(reduced)))
        inner = _Ctx(ctx.bound | frozenset(reduced), ctx.outer_free | frozenset(out), ctx.depth - 1, ctx.positive)
        kind = self.extra.choice(_REDUCTION_KINDS) if self.v2 else "sum"
        return Reduce(tuple(reduced), self.expr(out, must + reduced, inner), kind)

    # -- statements
    def statement(self, target: str, last: bool, scalar: bool) -> Stmt:
        r = self.r
        self.statement_indices = []
        depth = r.choice((1, 2, 2, 3, 3, 4))
        self.ref_budget = r.choice((3, 4, 5, 6, 8))
        if last and scalar:
            ctx = _Ctx(frozenset(), frozenset(), depth, False)
            expr = self.expr([], [], ctx)
            if r.random() < 0.15:
                return Stmt(None, None, expr)
            return Stmt(target, None, expr)
        rank = r.choice((1, 1, 2, 2, 3)) if not last else r.choice((1, 1, 2))
        indices: list[str] = []
        for _ in range(rank):
            indices.append(self.pick_index(set(indices)))
        if r.random() < 0.5:  # implicit target: the free indices, in the order the rules give
            ctx = _Ctx(frozenset(), frozenset(), depth, False)
            expr = self.expr(indices, [], ctx)
            return Stmt(target, None, expr)
        # explicit target: indices bound in the whole statement; each top-level term reduced on its own
        bound = frozenset(indices)
        count = r.choice((1, 1, 2, 2, 3))
        terms, signs = [], []
        placed: set[str] = set()
        for k in range(count):
            must = [i for i in indices if r.random() < 0.6]
            if k == count - 1:
                must += [i for i in indices if i not in placed and i not in must]
            placed |= set(must)
            self.statement_indices = list(indices)
            extra = [self.pick_index(set(indices)) for _ in range(r.choice((0, 0, 1, 1, 2)))]
            extra = list(dict.fromkeys(extra))
            ctx = _Ctx(bound, frozenset(), depth, False)
            terms.append(self.expr(extra, must, ctx))
            signs.append(1 if r.random() < 0.65 else -1)
        expr = terms[0] if count == 1 and signs[0] == 1 else Add(tuple(terms), tuple(signs))
        return Stmt(target, tuple(indices), expr, outer_parens=isinstance(expr, Add) and r.random() < 0.15)

    def program(self, scalar: bool) -> Program:
        r = self.r
        count = r.choice((1, 1, 2, 2, 3, 3, 4))
        names = r.sample(_TARGET_POOL, count - 1) + [r.choice(("f", "L", "loss"))]
        items: list[Any] = []
        declared: set[str] = set()
        for k, name in enumerate(names):
            for _attempt in range(6):  # later statements should read earlier results
                s = self.statement(name, k == count - 1, scalar)
                if not self.targets or any(isinstance(n, Ref) and n.name in self.targets for n in _walk(s.expr)):
                    break
            for decl in self.size_declarations(s, declared):
                items.append(decl)
            items.append(s)
            if s.target is not None and k < count - 1:
                labels = labels_of(s.expr, frozenset()) if s.indices is None else s.indices
                self.targets[s.target] = tuple(self.sizes[i] for i in labels)
                if _is_positive(s.expr, self.positive, self.positive_targets):
                    self.positive_targets.add(s.target)
        read = {node.name for item in items if isinstance(item, Stmt) for node in _walk(item.expr)
                if isinstance(node, Ref)}
        self.matrices = {name: kind for name, kind in self.matrices.items() if name in read}  # (a retried statement's)
        declared: dict[str, list[str]] = {}
        for name, kind in self.matrices.items():
            if kind is not None:
                declared.setdefault(kind, []).append(name)
        items[:0] = [MatrixDecl(kind, tuple(names)) for kind, names in sorted(declared.items())]
        return Program(items, dict(self.sizes), dict(self.inputs), set(self.positive), dict(self.integers),
                       dict(self.matrices))

    def size_declarations(self, s: Stmt, declared: set[str]) -> list[SizeDecl]:
        """``size`` lines for the statement's indices no tensor sizes (and, sometimes, redundant ones)."""
        r = self.r
        used: set[str] = set(s.indices or ())
        sized: set[str] = set()
        partners: list[tuple[str, str]] = []
        for node in _walk(s.expr):
            if isinstance(node, Ref):
                sized |= set(node.indices)
                used |= set(node.indices)
            elif isinstance(node, Delta):
                partners.append((node.first, node.second))
                used |= {node.first, node.second}
            elif isinstance(node, Reduce):
                used |= set(node.indices)
        sized |= declared
        changed = True
        while changed:
            changed = False
            for a, b in partners:
                if (a in sized) != (b in sized):
                    sized |= {a, b}
                    changed = True
        need = sorted(used - sized)
        if not need and r.random() < 0.1:
            need = [i for i in sorted(used - declared) if r.random() < 0.5][:2]
        decls = []
        for index in need:
            if index in declared:
                continue
            candidates = [(n, shape) for n, shape in self.inputs.items()
                          if shape and all(self.sizes[index] == d or True for d in shape)
                          and self.sizes[index] in shape]
            if candidates and r.random() < 0.6:
                name, shape = r.choice(candidates)
                names = []
                for axis_size in shape:
                    if axis_size == self.sizes[index] and index not in names:
                        names.append(index)
                    else:
                        filler = next(n for n in (f"z{k}" for k in range(99)) if n not in self.sizes and n not in names)
                        self.sizes[filler] = axis_size
                        names.append(filler)
                decls.append(SizeDecl(tuple(names), name))
                declared.update(names)
            else:
                decls.append(SizeDecl((index,), self.sizes[index]))
                declared.add(index)
        for index in sorted(self.padded & used - declared):  # no draw: the main stream's programs stay as they were
            decls.append(SizeDecl((index,), self.sizes[index]))
            declared.add(index)
        return decls


def _walk(e: Any):  # type: ignore[no-untyped-def]
    yield e
    if isinstance(e, Prod):
        for factor in e.factors:
            yield from _walk(factor)
    elif isinstance(e, Add):
        for term in e.terms:
            yield from _walk(term)
    elif isinstance(e, Neg):
        yield from _walk(e.operand)
    elif isinstance(e, Call):
        yield from _walk(e.argument)
    elif isinstance(e, Pow):
        yield from _walk(e.base)
    elif isinstance(e, (Reduce, Norm)):
        yield from _walk(e.body)
    elif isinstance(e, Bin):
        yield from _walk(e.left)
        yield from _walk(e.right)
    elif isinstance(e, Lin):  # its matrix, as read
        yield Ref(e.matrix, e.indices[::-1] if e.transposed else e.indices)


def _is_positive(e: Any, positive_inputs: set[str], positive_targets: set[str]) -> bool:
    """Conservative: is every entry of ``e`` positive whatever the (sign-respecting) inputs?"""
    if isinstance(e, Num):
        return e.value > 0
    if isinstance(e, Ref):
        return e.name in positive_inputs or e.name in positive_targets
    if isinstance(e, Prod):
        return all(_is_positive(f, positive_inputs, positive_targets) for f in e.factors)
    if isinstance(e, Add):
        return all(s > 0 for s in e.signs) and all(_is_positive(t, positive_inputs, positive_targets) for t in e.terms)
    if isinstance(e, Call):
        if e.function in ("exp", "sigmoid", "softplus"):
            return True
        if e.function in ("sqrt", "log1p"):
            return _is_positive(e.argument, positive_inputs, positive_targets)
        return False
    if isinstance(e, Pow):
        return _is_positive(e.base, positive_inputs, positive_targets)
    if isinstance(e, Reduce):
        return _is_positive(e.body, positive_inputs, positive_targets)
    if isinstance(e, Norm):
        return e.kind == "softmax"
    if isinstance(e, Bin):
        sides = (_is_positive(e.left, positive_inputs, positive_targets),
                 _is_positive(e.right, positive_inputs, positive_targets))
        return any(sides) if e.function == "maximum" else all(sides)
    return False


def make_arrays(program: Program, seed: int) -> dict[str, np.ndarray]:
    """Float64 inputs: positive tensors in [0.5, 1.5], the others in [-1, 1]."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in sorted(program.inputs.items()):
        if name in program.matrices:  # condition number below about 5 (see matrix_atom)
            arrays[name] = well_conditioned_matrix(rng, shape[0], program.matrices[name])
        elif name in program.integers:  # gather positions, inside the axis they index
            arrays[name] = rng.integers(0, program.integers[name], size=shape)
        elif name in program.positive:
            arrays[name] = rng.uniform(0.5, 1.5, size=shape)
        else:
            arrays[name] = rng.uniform(-1.0, 1.0, size=shape)
    return arrays


def generate(seed: int) -> Case:
    """A valid random program with its ``wrt`` tensors; deterministic in ``seed``."""
    r = random.Random(seed * 7919 + 1)
    scalar = r.random() < 0.8
    for attempt in range(50):
        generator = _Generator(seed * 1000 + attempt)
        program = generator.program(scalar)
        used = sorted({n.name for s in program.statements for n in _walk(s.expr) if isinstance(n, Ref)}
                      & set(program.inputs))
        # derivatives by a declared matrix are the symmetric projection (LANGUAGE.md 8.1): not taken here
        used = [name for name in used if program.matrices.get(name) is None]
        if not used:
            continue
        if sum(math.prod(program.inputs[n]) for n in used) > 90:
            continue
        # derivatives by at most 30 entries in all (Hessians stay small)
        wrt = [n for n in r.sample(used, len(used)) if math.prod(program.inputs[n]) <= 30]
        wrt = wrt[:r.choice((1, 1, 2, 2, 3))]
        while sum(math.prod(program.inputs[n]) for n in wrt) > 30:
            wrt.pop()
        if not wrt:
            continue
        case = Case(seed, program, wrt, scalar)
        case.text = program_text(program)
        return case
    raise RuntimeError(f"no program for seed {seed}")


def generate_network(seed: int) -> Case:
    """A tensor network with several varying factors: a ring, a chain or a random graph of 3-6 tensors.

    These are the products whose gradients share adjoints along a pairwise tree (einflow/derive/tree.py):
    inputs are often read at several positions, an index may join three factors, the value may keep open
    indices, a factor may be a computed tensor (``P = tanh(X)``) and the product may feed a later statement.
    Deterministic in ``seed`` and drawn from its own stream (``generate`` is unchanged).
    """
    r = random.Random(seed * 15485863 + 3)
    count = r.randint(3, 6)
    kind = r.choice(("ring", "chain", "graph"))
    names = [f"a{k}" for k in range(count + 1)]
    if kind == "ring":
        legs = [[names[k], names[(k + 1) % count]] for k in range(count)]
    elif kind == "chain":
        legs = [[names[k], names[k + 1]] for k in range(count)]
    else:
        legs = [[] for _ in range(count)]
        edges = 0
        for first in range(count):
            for second in range(first + 1, count):
                if r.random() < 0.45:
                    index = f"e{edges}"
                    edges += 1
                    legs[first].append(index)
                    legs[second].append(index)
        for k, leg in enumerate(legs):
            if not leg:  # join an isolated tensor to its neighbour
                index = f"e{edges}"
                edges += 1
                leg.append(index)
                legs[(k + 1) % count].append(index)
    if r.random() < 0.3:  # a hyperedge: one index on three factors
        for k in r.sample(range(count), 3):
            legs[k].append("hy")
    sizes: dict[str, int] = {}
    for leg in legs:
        for index in leg:
            sizes.setdefault(index, r.choice((1, 2, 2, 3, 3)))
    inputs: dict[str, tuple[int, ...]] = {}
    factors: list[Ref] = []
    pool = ["A", "B", "C", "D", "E", "F", "G", "M"]
    for leg in legs:
        shape = tuple(sizes[i] for i in leg)
        same = [n for n, s in inputs.items() if s == shape]
        if same and r.random() < 0.4:  # the same input at another position (a repeated wrt factor)
            factors.append(Ref(r.choice(same), tuple(leg)))
            continue
        name = pool[len(inputs)]
        inputs[name] = shape
        factors.append(Ref(name, tuple(leg)))
    items: list[Any] = []
    if r.random() < 0.3:  # one factor is a computed tensor
        k = r.randrange(count)
        leg = factors[k].indices
        items.append(Stmt("P", leg, Call("tanh", Ref("X", leg))))
        inputs["X"] = tuple(sizes[i] for i in leg)
        factors[k] = Ref("P", leg)
        read = {f.name for f in factors} | {"X"}
        inputs = {n: shape for n, shape in inputs.items() if n in read}
    occurrences: dict[str, int] = {}
    for leg in legs:
        for index in leg:
            occurrences[index] = occurrences.get(index, 0) + 1
    product = Prod(tuple(factors), (False,) * count, (False,) * count)
    opened = [i for i in occurrences if occurrences[i] == 1]
    scalar = r.random() < 0.75
    if scalar:
        if r.random() < 0.5 and not opened:
            statement = Stmt("L", None, product)  # implicit: every index occurs twice or more
        else:
            statement = Stmt("L", None, Reduce(tuple(occurrences), product))
        items.append(statement)
        if r.random() < 0.3:
            last = items.pop()
            items.append(Stmt("N", None, last.expr))
            items.append(Stmt("L", None, Prod((Ref("N", ()), Call("sin", Ref("N", ()))), (False, False),
                                               (False, False))))
    else:
        kept = tuple(opened) or (r.choice(list(occurrences)),)
        items.append(Stmt("y", kept, product))
    program = Program(items, sizes, inputs, set())
    wrt = [n for n in r.sample(sorted(inputs), len(inputs))]
    while sum(math.prod(inputs[n]) for n in wrt) > 30 and len(wrt) > 1:
        wrt.pop()
    case = Case(seed, program, wrt, scalar, network=True)
    case.text = program_text(program)
    return case


if __name__ == "__main__":  # pragma: no cover - a quick look at what the generator makes
    import sys

    for s in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
        c = generate(s)
        print(f"# seed {s} wrt={c.wrt}\n{c.text}\n")


# --------------------------------------------------------------------------- exact derivatives (jets)
class Jet:
    """A float64 array with its exact first (``d``: shape + (n,)) and second (``h``: shape + (n, n)) derivatives.

    Forward-mode arithmetic on truncated Taylor series: an independent, exact reference for Jacobians and
    Hessians that needs no compiler (JAX cross-checks it in tests/test_differential.py).
    """

    __array_ufunc__ = None  # numpy arrays defer to Jet's operators

    def __init__(self, v: np.ndarray, d: np.ndarray, h: np.ndarray | None) -> None:
        self.v, self.d, self.h = v, d, h

    # -- helpers
    @staticmethod
    def lift(x: Any, like: Jet) -> Jet:
        if isinstance(x, Jet):
            return x
        v = np.asarray(x, dtype=np.float64)
        n = like.d.shape[-1]
        d = np.zeros(v.shape + (n,))
        return Jet(v, d, None if like.h is None else np.zeros(v.shape + (n, n)))

    def _chain(self, value: np.ndarray, first: np.ndarray, second: np.ndarray | None) -> Jet:
        """f(self) from f = value, f' = first, f'' = second (elementwise)."""
        d = first[..., None] * self.d
        h = None
        if self.h is not None:
            h = first[..., None, None] * self.h
            if second is not None:
                h = h + second[..., None, None] * self.d[..., :, None] * self.d[..., None, :]
        return Jet(value, d, h)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.v.shape

    @property
    def ndim(self) -> int:
        return self.v.ndim

    # -- arithmetic
    def __add__(self, other: Any) -> Jet:
        o = Jet.lift(other, self)
        h = None if self.h is None else self.h + o.h
        return Jet(self.v + o.v, self.d + o.d, h)

    __radd__ = __add__

    def __neg__(self) -> Jet:
        return Jet(-self.v, -self.d, None if self.h is None else -self.h)

    def __sub__(self, other: Any) -> Jet:
        return self + (-Jet.lift(other, self))

    def __rsub__(self, other: Any) -> Jet:
        return Jet.lift(other, self) + (-self)

    def __mul__(self, other: Any) -> Jet:
        if not isinstance(other, Jet):
            c = np.asarray(other, dtype=np.float64)
            return Jet(self.v * c, self.d * c[..., None], None if self.h is None else self.h * c[..., None, None])
        a, b = self, other
        d = a.d * b.v[..., None] + a.v[..., None] * b.d
        h = None
        if a.h is not None:
            cross = a.d[..., :, None] * b.d[..., None, :]
            h = a.h * b.v[..., None, None] + a.v[..., None, None] * b.h + cross + np.swapaxes(cross, -1, -2)
        return Jet(a.v * b.v, d, h)

    __rmul__ = __mul__

    def __pow__(self, p: float) -> Jet:
        v = self.v
        if p == 0:
            return Jet.lift(np.ones_like(v), self)
        first = p * v ** (p - 1) if p != 1 else np.ones_like(v)
        second = None if p == 1 else (p * (p - 1) * (v ** (p - 2) if p != 2 else np.ones_like(v)))
        return self._chain(v ** p, first, second)

    def __truediv__(self, other: Any) -> Jet:
        return self * (Jet.lift(other, self) ** -1)

    def __rtruediv__(self, other: Any) -> Jet:
        return (self ** -1) * other

    def __gt__(self, other: Any) -> np.ndarray:
        return self.v > other

    def __getitem__(self, index: Any) -> Jet:
        index = index if isinstance(index, tuple) else (index,)
        h = None if self.h is None else self.h[index + (slice(None), slice(None))]
        return Jet(self.v[index], self.d[index + (slice(None),)], h)


class JetNumpy:
    """The few array functions the reference evaluator calls, for numpy arrays and Jets alike."""

    @staticmethod
    def asarray(x: Any) -> Any:
        return x if isinstance(x, Jet) else np.asarray(x, dtype=np.float64)

    @staticmethod
    def transpose(x: Any, order: Sequence[int]) -> Any:
        if not isinstance(x, Jet):
            return np.transpose(x, order)
        n = x.ndim
        order = list(order)
        h = None if x.h is None else np.transpose(x.h, order + [n, n + 1])
        return Jet(np.transpose(x.v, order), np.transpose(x.d, order + [n]), h)

    @staticmethod
    def reshape(x: Any, shape: tuple[int, ...]) -> Any:
        if not isinstance(x, Jet):
            return np.reshape(x, shape)
        tail = x.d.shape[-1:]
        h = None if x.h is None else np.reshape(x.h, shape + tail * 2)
        return Jet(np.reshape(x.v, shape), np.reshape(x.d, shape + tail), h)

    @staticmethod
    def sum(x: Any, axis: tuple[int, ...]) -> Any:
        if not isinstance(x, Jet):
            return np.sum(x, axis=axis)
        return Jet(np.sum(x.v, axis=axis), np.sum(x.d, axis=axis), None if x.h is None else np.sum(x.h, axis=axis))

    @staticmethod
    def broadcast_to(x: Any, shape: tuple[int, ...]) -> Any:
        if not isinstance(x, Jet):
            return np.broadcast_to(x, shape)
        if x.ndim < len(shape):  # a scalar jet: add leading axes first
            x = JetNumpy.reshape(x, (1,) * (len(shape) - x.ndim) + x.shape)
        tail = x.d.shape[-1:]
        h = None if x.h is None else np.broadcast_to(x.h, shape + tail * 2)
        return Jet(np.broadcast_to(x.v, shape), np.broadcast_to(x.d, shape + tail), h)

    @staticmethod
    def where(condition: np.ndarray, a: Any, b: Any) -> Any:
        like = a if isinstance(a, Jet) else b if isinstance(b, Jet) else None
        if like is None:
            return np.where(condition, a, b)
        a, b = Jet.lift(a, like), Jet.lift(b, like)
        c = np.asarray(condition)
        h = None if a.h is None else np.where(c[..., None, None], a.h, b.h)
        return Jet(np.where(c, a.v, b.v), np.where(c[..., None], a.d, b.d), h)

    @staticmethod
    def _elementwise(x: Any, value: Any, first: Any, second: Any) -> Any:
        if not isinstance(x, Jet):
            return value(x)
        v = x.v
        return x._chain(value(v), first(v), second(v) if x.h is not None else None)

    @staticmethod
    def exp(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.exp, np.exp, np.exp)

    @staticmethod
    def log(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.log, lambda v: 1 / v, lambda v: -1 / v**2)

    @staticmethod
    def log1p(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.log1p, lambda v: 1 / (1 + v), lambda v: -1 / (1 + v) ** 2)

    @staticmethod
    def sqrt(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.sqrt, lambda v: 0.5 / np.sqrt(v), lambda v: -0.25 * v**-1.5)

    @staticmethod
    def sin(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.sin, np.cos, lambda v: -np.sin(v))

    @staticmethod
    def cos(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.cos, lambda v: -np.sin(v), lambda v: -np.cos(v))

    @staticmethod
    def tanh(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.tanh, lambda v: 1 - np.tanh(v) ** 2,
                                     lambda v: -2 * np.tanh(v) * (1 - np.tanh(v) ** 2))

    @staticmethod
    def abs(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.abs, np.sign, np.zeros_like)

    @staticmethod
    def sign(x: Any) -> Any:
        return JetNumpy._elementwise(x, np.sign, np.zeros_like, np.zeros_like)

    @staticmethod
    def softplus(x: Any) -> Any:
        def sigmoid(v: Any) -> Any:
            return 1 / (1 + np.exp(-v))

        return JetNumpy._elementwise(x, lambda v: np.logaddexp(0.0, v), sigmoid,
                                     lambda v: sigmoid(v) * sigmoid(-v))

    @staticmethod
    def erf(x: Any) -> Any:
        c = 2 / math.sqrt(math.pi)
        return JetNumpy._elementwise(x, np.vectorize(math.erf), lambda v: c * np.exp(-v * v),
                                     lambda v: -2 * v * c * np.exp(-v * v))


def jet_derivatives(program: Program, arrays: dict[str, np.ndarray], wrt: Sequence[str],
                    second: bool) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Value, Jacobians (value shape + x shape, per wrt) and, if ``second``, Hessian blocks (row-major pairs)."""
    sizes = [arrays[x].size for x in wrt]
    n = sum(sizes)
    offsets = np.cumsum([0] + sizes)
    seeded: dict[str, Any] = dict(arrays)
    for k, x in enumerate(wrt):
        value = np.asarray(arrays[x], dtype=np.float64)
        d = np.zeros((value.size, n))
        d[np.arange(value.size), offsets[k] + np.arange(value.size)] = 1.0
        h = np.zeros(value.shape + (n, n)) if second else None
        seeded[x] = Jet(value, d.reshape(value.shape + (n,)), h)
    result = evaluate(program, seeded, JetNumpy)
    if not isinstance(result, Jet):
        result = Jet(np.asarray(result, dtype=np.float64), np.zeros(np.shape(result) + (n,)),
                     np.zeros(np.shape(result) + (n, n)) if second else None)
    shape = result.v.shape
    jacobians = [np.asarray(result.d[..., offsets[k]:offsets[k + 1]]).reshape(shape + arrays[x].shape)
                 for k, x in enumerate(wrt)]
    hessians = []
    if second:
        assert result.h is not None
        for a, xa in enumerate(wrt):
            for b, xb in enumerate(wrt):
                block = result.h[..., offsets[a]:offsets[a + 1], offsets[b]:offsets[b + 1]]
                hessians.append(np.asarray(block).reshape(shape + arrays[xa].shape + arrays[xb].shape))
    return np.asarray(result.v), jacobians, hessians


# ----------------------------------------------------------------------------------------------- coverage
def features(case: Case) -> set[str]:
    """Which of the language features the issue asks the generator to cover this program exercises."""
    found: set[str] = set()
    program = case.program
    statements = program.statements
    targets = {s.target for s in statements if s.target}
    if len(statements) > 1 and any(isinstance(n, Ref) and n.name in targets for s in statements
                                   for n in _walk(s.expr)):
        found.add("reuses an earlier result")
    if any(isinstance(item, SizeDecl) for item in program.items):
        found.add("size declaration")
    if len(case.wrt) > 1:
        found.add("several wrt")
    orders: dict[str, set[tuple[str, ...]]] = {}
    uses: dict[str, int] = {}
    for s in statements:
        bound = frozenset(s.indices or ())
        if s.indices is not None:
            terms = s.expr.terms if isinstance(s.expr, Add) else (s.expr,)
            if any(set(labels_of(t, bound)) - bound for t in terms):
                found.add("explicit target reducing a term")
            if any(set(s.indices) - set(labels_of(t, bound)) for t in terms):
                found.add("term broadcast to the target")
        _scan(s.expr, bound, frozenset(), found, orders, uses)
    if any(c > 1 for c in uses.values()):
        found.add("tensor used several times")
    declared = {name for item in program.items if isinstance(item, SizeDecl) for name in item.names}
    for s in statements:
        for node in _walk(s.expr):
            for position in node.positions if isinstance(node, Ref) else ():
                if isinstance(position, str):
                    continue
                if position[0] == "affine":
                    found.add("strided read" if position[1] != 1 else "shifted read")
                    if position[2] in declared:
                        found.add("padded read")
                else:
                    found.add(f"{'gathered' if position[0] == 'gather' else 'constant'} read")
    for name, kind in program.matrices.items():
        found.add(f"{kind} matrix" if kind else "undeclared matrix")
        if kind is None and name in case.wrt:
            found.add("derivative by a matrix")
    if any(len({tuple(sorted(set(o), key=o.index)) for o in v}) > 1 and any(len(set(o)) > 1 for o in v)
           for v in orders.values()):
        found.add("permuted index order")
    return found


def _scan(e: Any, bound: frozenset[str], contracted_above: frozenset[str], found: set[str],
          orders: dict[str, set[tuple[str, ...]]], uses: dict[str, int], depth: int = 0) -> None:
    if isinstance(e, (Prod, Neg, Ref, Delta, Num)):
        items = _product_items(e)
        occurrences = [_occurrences(item, bound) for item in items]
        counts: dict[str, int] = {}
        for occ in occurrences:
            for index in occ:
                counts[index] = counts.get(index, 0) + 1
        contracted = frozenset(i for i, c in counts.items() if c > 1 and i not in bound)
        if contracted & contracted_above:
            found.add("same dummy name contracted in nested and enclosing scopes")
        if any(c > 2 for i, c in counts.items() if i not in bound):
            found.add("index occurring three times")
        if len(items) > 1 and any(kind == "num" and value < 0 for kind, value, _ in items):
            found.add("signed factor")
        for kind, node, inverted in items:
            if kind == "ref":
                uses[node.name] = uses.get(node.name, 0) + 1
                orders.setdefault(node.name, set()).add(node.indices)
                repeated = {i for i in node.indices if node.indices.count(i) > 1}
                if repeated - bound:
                    found.add("trace (repeated contracted index)")
                if repeated & bound:
                    found.add("diagonal (repeated bound index)")
                if not node.indices:
                    found.add("scalar tensor")
            elif kind == "delta":
                found.add("delta")
                if node.first == node.second:
                    found.add("delta[i,i]")
            elif kind == "scope":
                if inverted:
                    found.add("division")
                _scan(node, bound, contracted_above | contracted, found, orders, uses, depth + 1)
        if isinstance(e, Prod) and any(isinstance(f, (Prod, Neg)) for f in e.factors[1:]):
            found.add("parenthesized product inside a product")
        return
    if isinstance(e, Add):
        found.add("sum of terms")
        if any(set(labels_of(e, bound)) - set(labels_of(t, bound)) for t in e.terms):
            found.add("term broadcast across +")
        for term in e.terms:
            _scan(term, bound, contracted_above, found, orders, uses, depth + 1)
        return
    if isinstance(e, Call):
        found.add(f"function {e.function}")
        _scan(e.argument, bound, contracted_above, found, orders, uses, depth + 1)
        return
    if isinstance(e, Pow):
        kind = ("integer" if e.exponent > 0 else "negative") if float(e.exponent).is_integer() else "fractional"
        found.add(f"{kind} power")
        _scan(e.base, bound, contracted_above, found, orders, uses, depth + 1)
        return
    if isinstance(e, Norm):
        found.add(f"normaliser {e.kind}")
        _scan(e.body, bound, contracted_above, found, orders, uses, depth + 1)
        return
    if isinstance(e, Bin):
        found.add(f"function {e.function}")
        for operand in (e.left, e.right):
            _scan(operand, bound, contracted_above, found, orders, uses, depth + 1)
        return
    if isinstance(e, Lin):
        found.add(f"linalg {e.kind}")
        return
    if isinstance(e, Reduce):
        found.add("sum[...]" if e.kind == "sum" else f"reduction {e.kind}")
        if len(e.indices) > 1 and e.kind != "sum":
            found.add("reduction over several indices")
        if depth and any(isinstance(n, Reduce) for n in _walk(e.body) if n is not e):
            found.add("nested sum[...]")
        if any(isinstance(n, Reduce) for n in _walk(e.body) if n is not e):
            found.add("nested sum[...]")
        _scan(e.body, bound | frozenset(e.indices), contracted_above, found, orders, uses, depth + 1)
        return


# ---------------------------------------------------------------- linear algebra programs (LANGUAGE.md 8.1)
@dataclass
class LinalgCase:
    """A random scalar program over inv/det/logdet, its jax.numpy twin and well-conditioned inputs."""

    seed: int
    text: str
    twin: Callable[..., Any]  # twin(**arrays as jax arrays) -> scalar
    arrays: dict[str, np.ndarray]
    declared: str | None  # "spd", "symmetric" or None: how A is declared


def well_conditioned_matrix(rng: np.random.Generator, n: int, kind: str | None) -> np.ndarray:
    """A matrix whose condition number stays below about 5: ``3 I + G/sqrt(n)`` (G standard normal, so its
    spectral norm is below about 2); spd: ``Q diag(0.5..2) Q^T``; symmetric: the same with random signs."""
    if kind is None:
        return 3 * np.eye(n) + rng.standard_normal((n, n)) / np.sqrt(n)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    d = rng.uniform(0.5, 2.0, n)
    if kind == "symmetric":
        d = d * rng.choice([-1.0, 1.0], n)
    return (q * d) @ q.T


def generate_linalg(seed: int) -> LinalgCase:
    """One scalar program of 1 to 3 terms, each an atom of a matrix built from A (well conditioned: adding
    ``c delta`` with c >= 0 or ``u u^T`` keeps an spd matrix spd and moves the others' eigenvalues little)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    declared = [None, "spd", "symmetric"][int(rng.integers(3))]
    arrays = {"A": well_conditioned_matrix(rng, n, declared), "x": rng.standard_normal(n),
              "u": 0.3 * rng.standard_normal(n), "B": rng.standard_normal((n, n))}
    matrices = [("A[i,j]", lambda a: a["A"]), ("A[j,i]", lambda a: a["A"].T)]
    c = round(float(rng.uniform(0.1, 1.0)), 3)
    matrices.append((f"A[i,j] + {c} delta[i,j]", lambda a, c=c: a["A"] + c * jnp.eye(n)))
    if declared != "symmetric":  # an indefinite matrix plus u u^T may come near singular
        matrices.append(("A[i,j] + u[i] u[j]", lambda a: a["A"] + jnp.outer(a["u"], a["u"])))

    def logdet(m: Any) -> Any:
        return jnp.linalg.slogdet(m)[1]

    atoms = [
        ("logdet[i,j]({M})", lambda m, a: logdet(m)),
        ("det[i,j]({M})", lambda m, a: jnp.linalg.det(m)),
        ("x[i] inv[i,j]({M}) x[j]", lambda m, a: a["x"] @ jnp.linalg.solve(m, a["x"])),
        ("sum[i](tanh(inv[i,j]({M}) x[j]))", lambda m, a: jnp.sum(jnp.tanh(jnp.linalg.solve(m, a["x"])))),
        ("sum[i,j](inv[i,j]({M}) B[i,j])", lambda m, a: jnp.sum(jnp.linalg.inv(m) * a["B"])),
        ("logdet[i,j]({M})^2", lambda m, a: logdet(m) ** 2),
    ]
    terms, parts = [], []
    for _ in range(int(rng.integers(1, 4))):
        text, build = matrices[int(rng.integers(len(matrices)))]
        atom, value = atoms[int(rng.integers(len(atoms)))]
        coefficient = round(float(rng.uniform(0.2, 1.5)), 3)
        terms.append(f"{coefficient} {atom.format(M=text)}")
        parts.append((coefficient, build, value))

    def twin(**a: Any) -> Any:
        if declared is not None:  # derivatives on the symmetric matrices: jax's of f((A + A^T)/2)
            a = {**a, "A": (a["A"] + a["A"].T) / 2}
        return sum(coefficient * value(build(a), a) for coefficient, build, value in parts)

    text = (f"{declared} A\n" if declared else "") + "f = " + " + ".join(terms)
    return LinalgCase(seed, text, twin, arrays, declared)
