"""IR -> Steps: the one lowering. A checked program becomes a flat tuple of plain-data steps (einflow.engine.steps).

Products become one :class:`~einflow.engine.steps.Contract` (or, without a summed index, an elementwise
multiplication), sums align their terms by index name, surviving deltas become diagonal writes; equal
work is numbered once (positional keys: ``x[i] y[i]`` and ``x[j] y[j]`` are one contraction). Three passes
follow: :func:`fuse` inlines elementwise results read once into their reader,
:func:`einflow.engine.accumulate.accumulate_diagonals` adds the delta terms of a sum into the diagonal of its other
terms (no zeroed array per term), :func:`release` frees each intermediate after its last use. Nothing here
knows shapes (``einflow.engine.plan`` specialises the steps).

>>> from einflow.program import compile
>>> lowered = lower(compile("a = x[i] y[i]\\nb = x[j] y[j]\\na, b"))
>>> [type(step).__name__ for step in lowered.steps], lowered.outputs
(['Contract'], (2, 2))
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from einflow.engine.accumulate import accumulate_diagonals
from einflow.engine.affine_lower import lower_shifted, window
from einflow.engine.contract_lower import contract, diagonal
from einflow.engine.linalg_lower import (
    adjugates,
    check_matrix,
    factored_checks,
    lower_linalg,
    owned_factorisations,
    shared_factorisations,
    solves,
)
from einflow.engine.lower_context import LoweringContext, Value, align, number_types
from einflow.engine.lower_sizes import declare_sizes, statement_size_refs
from einflow.engine.solving import inline_inverses
from einflow.engine.steps import (
    Add,
    Apply,
    Arg,
    AsFloat,
    Diagonal,
    Elementwise,
    Free,
    Lowered,
    Mul,
    Node,
    Number,
    Pow,
    Reduce,
    Size,
    SizeRef,
    Step,
    node_args,
    step_inputs,
    substitute_all,
)
from einflow.lang import ir
from einflow.lang.check import check_program
from einflow.lang.contraction import eliminate_deltas, product_output, split_product
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import (
    free_indices,
    indices_in,
    top_level_terms,
)
from einflow.lang.numbers import _fold_power, _is_unit, _weak, exact_add
from einflow.lang.stable import stabilize_program

__all__ = ["lower", "fuse", "release"]


def _fold(func: str, value: int | float) -> int | float:
    with np.errstate(all="ignore"):
        folded = FUNCTION_RULES[func].value(np, np.asarray(value))
    return folded.item() if hasattr(folded, "item") else folded


class _Lowering:
    def __init__(self, program: ir.ProgramIR, inputs: tuple[str, ...], ranks: tuple[int, ...], real: bool) -> None:
        self.program = program
        self.real = real
        self.steps: list[Step] = []
        #: the register of the first step (the inputs are registers 0 .. first - 1)
        self.first = len(inputs)
        self.names: dict[str, Value] = {name: Value(k) for k, name in enumerate(inputs)}
        self.register_sizes: dict[int, tuple[SizeRef, ...]] = {
            k: tuple((k, axis) for axis in range(rank)) for k, rank in enumerate(ranks)}
        self.numbering: dict[Any, int] = {}
        self.memo: dict[Any, Value] = {}
        self.declared: dict[str, SizeRef] = {}
        self.sizes: dict[str, SizeRef] = {}
        self.synthetic: set[int] = set()
        self.statement = 0
        self.target_names: dict[int, str] = {}
        self.bindings: list[tuple[int, str, int | None]] = []
        #: (statement, its known sizes, its affine reads as (axis length, terms, offset, a delta's), declared
        #: indices among them) for each statement with shifted reads (``Lowered.ranges``)
        self.ranges: list[Any] = []
        # ---- linear algebra: ``symmetric A`` / ``spd K`` hold for the whole program (LANGUAGE.md 8.1)
        self.input_names = frozenset(inputs)
        self.matrices = {name: statement.kind for statement in program.statements
                         if isinstance(statement, ir.MatrixDecl) for name in statement.names}
        #: det steps: their register -> (the matrix's register, its (row, column) axes), for det(M) inv(M) products
        self.determinants: dict[int, tuple[int, tuple[int, ...]]] = {}
        #: the indices of the current statement that shifted reads size (LANGUAGE.md 8.2)
        self.shifted: frozenset[str] = frozenset()
        #: targets only ``size`` declarations read: the sizes of their axes (their statements compute nothing)
        self.shape_only: dict[str, tuple[SizeRef, ...]] = {}
        #: the arguments u whose sigmoid(u) and sigmoid(-u) both occur: both are read off one exp(-|u|)
        self.paired_sigmoids = _paired_sigmoids(program)

        #: what the features' lowerings (linear algebra, shifted reads) are passed: remade for each statement
        self.cx = self.context()

    def context(self) -> LoweringContext:
        """The current statement's :class:`LoweringContext`."""
        return LoweringContext(self.statement, self.sizes, self.first, self.steps, self.numbering, self.lower,
                               self.lower_product, self.names, self.register_sizes, self.matrices, self.determinants,
                               self.declared, self.ranges, self.synthetic, self.real)

    @property
    def count(self) -> int:
        """The next register a step makes."""
        return self.first + len(self.steps)

    # ------------------------------------------------------------------ program
    def run(self, returns_tuple: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
        outputs: list[int] = []
        texts: list[str] = []
        final: Value | None = None
        for name in self.matrices:  # declared inputs: checked before any statement reads them
            if name in self.input_names:
                check_matrix(self.cx, name)
        statements = self.program.statements
        assigns = [statement for statement in statements if isinstance(statement, ir.Assign)]
        returned = {name for statement in statements if isinstance(statement, ir.Return) for name in statement.names}
        if not returns_tuple and assigns and assigns[-1].target is not None:
            returned.add(assigns[-1].target)
        # intermediates carrying inverses are computed inside their readers, where the inverses become solves
        inlining = inline_inverses(self.program, frozenset(returned))
        rewritten = dict(inlining.rewritten)
        # a target only ``size`` declarations read (a derivative's range helper, ``_range1[a,b] = ...``): its
        # shape is what they need, so its indices' sizes are noted and nothing is computed
        read = {node.name for statement in assigns for node in ir.walk(statement.expr)
                if isinstance(node, (ir.Tensor, ir.Read))}
        read |= {gather.name for statement in assigns for node in ir.walk(statement.expr)
                 if isinstance(node, (ir.Read, ir.ShiftDelta)) for gather in node.gathers}
        sources = {statement.source for statement in statements if isinstance(statement, ir.SizeDecl)}
        size_only = {statement.target for statement in assigns if statement.target in sources
                     and statement.target not in read | returned and statement.target not in self.matrices
                     and statement.indices is not None}
        for number, statement in enumerate(statements):
            self.statement = number
            self.cx = self.context()
            texts.append(ir.format_statement(statement))
            if number in inlining.skipped:
                continue
            if number in rewritten:
                statement = replace(statement, expr=rewritten[number])  # type: ignore[arg-type]
            if isinstance(statement, ir.SizeDecl):
                declare_sizes(self.cx, statement, self.shape_only)
                continue
            if isinstance(statement, (ir.MatrixDecl, ir.PadDecl)):  # matrices: inputs checked first, targets
                continue  # where assigned; pads: the reads carry their modes
            if isinstance(statement, ir.Return):
                outputs.extend(self.cx.materialize(self.names[name]).reg for name in statement.names)  # type: ignore[misc]
                continue
            self.sizes, self.shifted = statement_size_refs(self.cx, statement)
            self.cx = self.context()  # with the statement's index sizes
            if statement.target in size_only:
                self.shape_only[statement.target or ""] = self.cx.sizes_of(statement.indices or ())
                continue
            first_new = self.count
            value = self.lower_statement(statement)
            if statement.target is not None:
                self.names[statement.target] = value
                if value.reg is not None and value.reg >= first_new:
                    self.target_names.setdefault(value.reg, statement.target)
                if statement.target in self.matrices and value.reg is not None:
                    check_matrix(self.cx, statement.target)
                    value = self.names[statement.target]
                self.bindings.append((number, statement.target, value.reg))
            final = value
        if not returns_tuple:
            assert final is not None
            outputs.append(self.cx.materialize(final).reg)  # type: ignore[arg-type]
        return tuple(outputs), tuple(texts)

    def lower_statement(self, statement: ir.Assign) -> Value:
        if statement.indices is None:
            return self.lower(statement.expr, frozenset(), frozenset())
        bound = frozenset(statement.indices)
        shared = _shared_factor(top_level_terms(statement.expr), bound)
        if shared is not None and self.names.get(shared[0].name, Value(None)).reg in self.determinants and any(
                isinstance(node, ir.Linalg) and node.kind == "inv" for node in ir.walk(statement.expr)):
            shared = None  # det(M) stays beside each inv(M) it multiplies: their product is M's adjugate
        if shared is not None:
            # `w[p] t[p] - w[i] t[i] t[p]` is computed as `t[p] (w[p] - sum[i](w[i] t[i]))`: one product by t
            common, remainders = shared
            inner = ir.Sum(tuple(ir.Reduce(tuple(sorted(extra)), rest) if extra else rest
                                 for rest, extra in remainders))
            return self.add([self.lower_product((common, inner), bound, frozenset(), statement.indices)],
                            statement.indices)
        terms = []
        for term in top_level_terms(statement.expr):
            extra = frozenset(free_indices(term, bound)) - bound
            if isinstance(term, (ir.Product, ir.Tensor, ir.Delta, ir.Read, ir.ShiftDelta)):
                # a product term is produced directly in the target's axis order (no transpose after)
                factors = term.factors if isinstance(term, ir.Product) else (term,)
                terms.append(self.lower_product(factors, bound, extra, statement.indices))
            else:
                terms.append(self.lower(term, bound, extra))
        return self.add(terms, statement.indices)

    # ------------------------------------------------------------------ expressions
    def lower(self, expr: ir.Expr, bound: frozenset[str], reduce: frozenset[str]) -> Value:
        if isinstance(expr, ir.Num):
            return Value(None, (), expr.value)  # exact while folding; _weak where it is used
        if isinstance(expr, ir.Read):
            return self.cx.sum_axes(window(self.cx, expr), reduce)
        if isinstance(expr, (ir.Tensor, ir.Delta, ir.ShiftDelta)):
            return self.lower_product((expr,), bound, reduce)
        if isinstance(expr, ir.Product):
            return self.lower_product(expr.factors, bound, reduce)
        mentioned = indices_in(expr)
        key = (expr, bound & mentioned, reduce, tuple(sorted((i, self.sizes.get(i)) for i in mentioned)))
        found = self.memo.get(key)
        if found is not None:
            return found
        if isinstance(expr, ir.Reduce) and expr.kind == "sum":
            inner = frozenset(expr.indices)
            value = self.lower(expr.body, bound | inner, reduce | inner)
        elif isinstance(expr, ir.Reduce):
            inner = frozenset(expr.indices)
            body = self.lower(expr.body, bound | inner, frozenset())
            value = self.cx.sum_axes(self.reduce_axes(expr.kind, body, inner), reduce)
        elif isinstance(expr, ir.Normalize):
            body = self.lower(expr.body, bound, frozenset())
            value = self.cx.sum_axes(self.reduce_axes(expr.kind, body, frozenset(expr.indices)), reduce)
        elif isinstance(expr, ir.Linalg):
            value = lower_linalg(self.cx, expr, bound, reduce)
        elif isinstance(expr, ir.Binary):
            order = free_indices(expr, bound)
            left = self.lower(expr.left, bound, frozenset())
            right = self.lower(expr.right, bound, frozenset())
            value = self.cx.sum_axes(self.binary(expr.func, left, right, order), reduce)
        elif isinstance(expr, ir.Sum) and len(free_indices(expr, bound)) > _MOST_AXES and \
                reduce & set(free_indices(expr, bound)):
            value = self.sum_of_term_sums(expr, bound, reduce)
        elif isinstance(expr, ir.Sum):
            order = free_indices(expr, bound)
            value = self.add([self.lower(term, bound, frozenset()) for term in expr.terms], order)
            value = self.cx.sum_axes(value, reduce)
        elif isinstance(expr, ir.Call) and expr.func == "sigmoid" and _signed(expr.arg)[1] in self.paired_sigmoids:
            negated, inner = _signed(expr.arg)
            value = self.cx.sum_axes(_sigmoid(self, self.lower(inner, bound, frozenset()), negated), reduce)
        elif isinstance(expr, ir.Call):
            value = self.apply(expr.func, self.lower(expr.arg, bound, frozenset()))
            value = self.cx.sum_axes(value, reduce)
        elif isinstance(expr, ir.Power) and expr.exponent == 2 and reduce & indices_in(expr.base) and \
                free_indices(expr.base, bound) and not set(free_indices(expr.base, bound)) <= reduce:
            # a sum of squares over some of the base's indices (a Laplacian's sum[p](dz[b,p,j]^2)) is the base
            # contracted with itself: one einsum pass, no array of the squares (a sum over all of them, a loss,
            # stays squares then a sum: a dot product of reshaped views would copy a transposed operand)
            # (the indices it keeps are bound for the product: an index of both factors would be summed)
            kept = frozenset(free_indices(expr.base, bound)) - reduce
            value = self.lower_product((expr.base, expr.base), bound | kept, reduce)
        elif isinstance(expr, ir.Power):
            value = self.power(self.lower(expr.base, bound, frozenset()), expr.exponent)
            value = self.cx.sum_axes(value, reduce)
        else:  # pragma: no cover
            raise TypeError(expr)
        self.memo[key] = value
        return value

    def sum_of_term_sums(self, expr: ir.Sum, bound: frozenset[str], reduce: frozenset[str]) -> Value:
        """A sum of terms summed over indices: each term summed over its own, times the sizes of those it lacks
        (``sum[i,j](a[i] + b[j])`` is ``|j| sum[i](a[i]) + |i| sum[j](b[j])``), so the broadcast sum of all the
        indices, an array of more axes than arrays have, is never formed."""
        order = tuple(index for index in free_indices(expr, bound) if index not in reduce)
        summed = reduce & set(free_indices(expr, bound))
        values = []
        for term in expr.terms:
            own = frozenset(free_indices(term, bound))
            value = self.lower(term, bound, reduce & own)
            sizes = tuple(Size(self.sizes.get(label, -1)) for label in sorted(summed - own))
            if sizes:
                # (a number counted over more than 64 indices is a float: the count leaves int64's range)
                operand: Node = Number(float(_weak(value.const))) if value.reg is None else Arg(value.reg)  # type: ignore
                product = Mul((operand, *sizes))
                value = self.cx.elementwise(("counted", product, number_types(product)), product, value.labels)
            values.append(value)
        return self.add(values, order)

    def apply(self, func: str, arg: Value) -> Value:
        if arg.reg is None:
            return Value(None, (), _fold(func, _weak(arg.const)))  # type: ignore[arg-type]
        # keys are positional: the same register may carry other names (`tanh(y[i])` and `tanh(y[l])`)
        value = self.cx.elementwise(("apply", func, arg.reg), Apply(func, Arg(arg.reg)), arg.labels)
        return Value(value.reg, arg.labels)

    def binary(self, func: str, left: Value, right: Value, order: tuple[str, ...]) -> Value:
        if left.reg is None and right.reg is None:
            pick = max if func == "maximum" else min
            return Value(None, (), _weak(pick(left.const, right.const)))  # type: ignore[type-var]
        parts = [Number(_weak(v.const)) if v.reg is None else Arg(v.reg, align(v.labels, order))  # type: ignore
                 for v in (left, right)]
        expr = Apply(func, parts[0], parts[1])
        return self.cx.elementwise(("binary", expr, self.cx.sizes_of(order)), expr, order)

    def reduce_axes(self, kind: str, value: Value, over: frozenset[str]) -> Value:
        """A non-sum reduction (the axes ``over`` go away) or a normaliser (they stay) of a lowered value."""
        normalise = kind in ir.NORMALISERS
        if value.reg is None:  # a constant body cannot carry the indices (the checker requires them): unreachable
            raise AssertionError("a reduction of a constant")
        axes = tuple(position for position, label in enumerate(value.labels) if label in over)
        labels = value.labels if normalise else tuple(label for label in value.labels if label not in over)
        sizes = self.cx.sizes_of(labels)
        reg = value.reg
        return self.cx.emit((kind, reg, axes, sizes), labels, Reduce, reg, value.labels, axes, sizes, kind)

    def power(self, base: Value, exponent: int | float) -> Value:
        if base.reg is None:
            return Value(None, (), _fold_power(base.const, exponent))  # type: ignore[arg-type]
        if exponent == 1:
            return base
        value = self.cx.elementwise(("pow", exponent, type(exponent), base.reg), Pow(Arg(base.reg), exponent),
                                 base.labels)
        return Value(value.reg, base.labels)

    def add(self, terms: list[Value], order: tuple[str, ...]) -> Value:
        constant: int | float = 0
        arrays: list[Value] = []
        for term in terms:
            if term.reg is None:
                constant = exact_add(constant, term.const)  # type: ignore[arg-type]
            else:
                arrays.append(term)
        if not arrays:
            return Value(None, (), constant)
        order = tuple(order)
        has_constant = constant != 0 or isinstance(constant, float)  # + 0.0 still promotes integer arrays
        args = [Arg(term.reg, align(term.labels, order)) for term in arrays]  # type: ignore[arg-type]
        if len(args) == 1 and not has_constant:
            if args[0].axes is None:
                return Value(arrays[0].reg, order)
            return self.cx.aligned(args[0], order)
        expr = Add((*args, Number(_weak(constant)))) if has_constant else Add(tuple(args))
        # positional: the same sum under other index names (`1 - h[b,i]^2`, `1 - h[w,i]^2`) is computed once
        return self.cx.elementwise(("add", expr, number_types(expr)), expr, order)

    # ------------------------------------------------------------------ products
    def lower_product(self, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
                      preferred: tuple[str, ...] = ()) -> Value:
        if any(isinstance(factor, ir.Linalg) and factor.kind == "inv" for factor in factors):
            factors = adjugates(self.cx, factors, bound)
        if any(isinstance(factor, ir.Linalg) for factor in factors):
            factors = solves(self.cx, factors, bound, reduce, preferred)
        if any(isinstance(factor, ir.ShiftDelta) for factor in factors):
            return lower_shifted(self.cx, factors, bound, reduce, preferred)
        if self.shifted:  # a plain read of an index that shifted reads size is a (sliced) window too
            factors = tuple(ir.Read(f.name, f.indices) if isinstance(f, ir.Tensor) and set(f.indices) & self.shifted
                            and len(set(f.indices)) == len(f.indices) else f for f in factors)
        parts = split_product(factors, self.names.__getitem__, lambda factor: self.lower(factor, bound, frozenset()),
                              lambda value: value.const if value.reg is None else None, lambda value: value.labels)
        output, summed = product_output(parts.sequence, bound, reduce, preferred)
        classes, missing, counted = eliminate_deltas([labels for _, labels in parts.operands], parts.deltas, summed,
                                                     output)
        parts.operands.extend((self.cx.ones(label), [label]) for label in missing)
        # a summed index that only counts multiplies the product by its size (contracting booleans would saturate)
        counts = [Size(self.sizes.get(label, -1)) for label in counted]
        if counts and not parts.operands and not parts.scalars:
            # deltas alone, all summed (`delta[j,j]`, mean's 1/n): their count, a number of the inputs' floating
            # type, from the sizes alone (never a vector of ones summed)
            factors: list[Node] = [AsFloat(counts[0]), *counts[1:]]
            if not _is_unit(parts.coefficient):
                factors.append(Number(_weak(parts.coefficient)))
            expr = Mul(tuple(factors)) if len(factors) > 1 else factors[0]
            value = self.cx.elementwise(("count", expr, number_types(expr)), expr, ())
            return diagonal(self.cx, value, output, classes)
        return contract(self.cx, parts.operands, output, classes, parts.coefficient, parts.scalars, counts)

#: the most axes an array has (numpy's limit; ``einflow.engine.specialise.MAX_AXES``): a sum of terms with more
#: free indices, summed over some, is summed term by term
_MOST_AXES = 64


# ---------------------------------------------------------------- passes after lowering
def fuse(steps: list[Step], outputs: tuple[int, ...], ranks: dict[int, int]) -> list[Step]:
    """Inline an elementwise result read once, by an elementwise step of the same statement, into its reader.

    The fused expression is evaluated in one line (or block by block, ``einflow.engine.blocks``).
    """
    uses: Counter[int] = Counter()
    for step in steps:
        uses.update(step_inputs(step))
    uses.update(outputs)
    uses.update(outputs)  # an output is never inlined
    readers: dict[int, int] = {}
    for k, step in enumerate(steps):
        for register in step_inputs(step):
            readers[register] = k
    result: list[Step | None] = list(steps)
    # the expressions inlined into each step, substituted in one walk when the step is reached (a product of n
    # inlined factors is one pass over it, not n)
    pending: dict[int, dict[int, Node]] = {}
    for k in range(len(steps)):
        current = result[k]
        if isinstance(current, Elementwise) and k in pending:
            current = result[k] = replace(current, expr=substitute_all(current.expr, pending.pop(k), ranks))
        if not isinstance(current, Elementwise) or uses[current.out] != 1:
            continue
        reader_position = readers.get(current.out)
        if reader_position is None or reader_position <= k:
            continue
        reader = result[reader_position]
        if not isinstance(reader, Elementwise) or reader.statement != current.statement:
            continue
        if len(reader.labels) > len(current.labels) and _operations(current.expr) > 1:
            # the reader broadcasts it over more axes: inlined, its work would repeat for every element of
            # those axes (`dz[b,p,j] (y[b,j] + t[b,j] h[b,j])` would add and multiply p times per (b, j))
            continue
        pending.setdefault(reader_position, {})[current.out] = current.expr
        for register in node_args(current.expr):
            readers[register] = reader_position
        result[k] = None
    return [step for step in result if step is not None]


def _sigmoid(self: _Lowering, arg: Value, negated: bool) -> Value:
    """sigmoid(u) or sigmoid(-u) as the helper computes it, ``max(e, [±u > 0]) / (1 + e)`` with e = exp(-|u|), from
    one step e shared by both signs: a sigmoid's derivative sigmoid(u) sigmoid(-u) costs one exp, not two."""
    if arg.reg is None:
        return self.apply("sigmoid", Value(None, (), _weak(-arg.const) if negated else arg.const))  # type: ignore
    e = self.cx.elementwise(("sigmoid exp", arg.reg), Apply("exp", Mul((Number(-1), Apply("abs", Arg(arg.reg))))),
                         arg.labels)
    sign: Node = Mul((Number(-1), Arg(arg.reg))) if negated else Arg(arg.reg)
    expr = Mul((Apply("maximum", Arg(e.reg), Apply("step", sign)),  # type: ignore[arg-type]
                Pow(Add((Arg(e.reg), Number(1))), -1)))  # type: ignore[arg-type]
    value = self.cx.elementwise(("sigmoid", negated, arg.reg), expr, arg.labels)
    return Value(value.reg, arg.labels)


def _operations(node: Node) -> int:
    """How many elementwise operations evaluating ``node`` takes per element (a register or number: none)."""
    if isinstance(node, Apply):
        return 1 + _operations(node.arg) + (_operations(node.other) if node.other is not None else 0)
    if isinstance(node, Pow):
        return 1 + _operations(node.base)
    if isinstance(node, (Add, Mul)):
        parts = node.terms if isinstance(node, Add) else node.factors
        return len(parts) - 1 + sum(_operations(part) for part in parts)
    if isinstance(node, AsFloat):
        return _operations(node.arg)
    return 0


def _signed(arg: ir.Expr) -> tuple[bool, ir.Expr]:
    """``-u`` as (True, u); any other argument as (False, itself)."""
    if isinstance(arg, ir.Product) and arg.factors and arg.factors[0] == ir.Num(-1):
        rest = arg.factors[1:]
        return True, rest[0] if len(rest) == 1 else ir.Product(rest)
    return False, arg


def _paired_sigmoids(program: ir.ProgramIR) -> frozenset[ir.Expr]:
    """The arguments u of a program whose sigmoid(u) and sigmoid(-u) both occur (a sigmoid's derivatives)."""
    seen: dict[ir.Expr, set[bool]] = {}
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            for node in ir.walk(statement.expr):
                if isinstance(node, ir.Call) and node.func == "sigmoid":
                    negated, inner = _signed(node.arg)
                    seen.setdefault(inner, set()).add(negated)
    return frozenset(inner for inner, signs in seen.items() if len(signs) == 2)


def release(steps: list[Step], outputs: tuple[int, ...], inputs: int) -> list[Step]:
    """Insert :class:`Free` steps: each intermediate is released after its last use (a view after its viewer's)."""
    last: dict[int, int] = {}
    view_of: dict[int, int] = {}
    for k, step in enumerate(steps):
        last.setdefault(step.out, k)  # type: ignore[union-attr]
        for register in step_inputs(step):
            last[register] = k
        if isinstance(step, Elementwise) and isinstance(step.expr, Arg):
            view_of[step.out] = step.expr.register
        elif isinstance(step, Diagonal) and step.base is not None:  # added into its base's array, in place
            view_of[step.out] = step.base
    for register in outputs:
        last[register] = len(steps)
    for step in reversed(steps):  # views come after what they view: one backward pass suffices
        base = view_of.get(step.out)  # type: ignore[union-attr]
        if base is not None:
            last[base] = max(last[base], last[step.out])  # type: ignore[union-attr]
    dead: dict[int, list[int]] = {}
    for register, k in last.items():
        if register >= inputs and k < len(steps):
            dead.setdefault(k, []).append(register)
    result: list[Step] = []
    for k, step in enumerate(steps):
        result.append(step)
        if k in dead:
            result.append(Free(step.statement, tuple(sorted(dead[k]))))
    return result


def _shared_factor(terms: tuple[ir.Expr, ...], bound: frozenset[str]) -> tuple[
        ir.Tensor, list[tuple[ir.Expr, frozenset[str]]]] | None:
    """A tensor factor every top-level term of an explicit statement has, carrying target indices only (each
    once), and each term without it with the indices that term sums; None when there is none.

    The target's indices are never summed inside a term, so taking such a factor out of every term changes
    no term's summation: ``sum_t f * rest_t`` is ``f * sum_t rest_t``.
    """
    if len(terms) < 2:
        return None
    lists = []
    for term in terms:
        if isinstance(term, ir.Tensor):
            lists.append([term])
        elif isinstance(term, ir.Product):
            lists.append(list(term.factors))
        else:
            return None
    if any(isinstance(factor, ir.Delta) and {factor.first, factor.second} & bound for factors in lists
           for factor in factors):
        # a delta term stays a term of the sum: it is added onto the diagonal of the others (einflow.engine.accumulate)
        # rather than multiplied, as a zeroed array of the target's shape, by the factor taken out
        return None
    for candidate in lists[0]:
        if not (isinstance(candidate, ir.Tensor) and set(candidate.indices) <= bound
                and len(set(candidate.indices)) == len(candidate.indices)):
            continue
        if all(candidate in factors for factors in lists[1:]):
            remainders = []
            for term, factors in zip(terms, lists):
                rest = list(factors)
                rest.remove(candidate)
                extra = frozenset(free_indices(term, bound)) - bound
                remainders.append((ir.product(*rest) if rest else ir.Num(1), extra))
            return candidate, remainders
    return None


def lower(program: Any, real: bool = False) -> Lowered:
    """Lower a compiled program (an ``einflow.Program`` or its checked IR) to steps, fused and freed.

    ``real``: every value the program computes is real (no complex input, no imaginary literal), so that a
    symmetric matrix read transposed is the same matrix (one solve for both orientations)."""
    return _lower(program if isinstance(program, ir.ProgramIR) else program.ir, real)


def computes_real(program: ir.ProgramIR, dtypes: Any) -> bool:
    """Whether a program computes real values only for inputs of these ``dtypes`` (numpy's, torch's, or Python
    number types): none of them complex, and no imaginary literal in the program.

    >>> from einflow.lang.grammar import parse
    >>> computes_real(parse("y = 2 x[i]"), {"x": np.dtype("float32")}), computes_real(parse("y = 2j x[i]"), {})
    (True, False)
    """
    for dtype in dtypes.values():
        if dtype is complex or getattr(dtype, "is_complex", False) is True:
            return False
        if not isinstance(dtype, type):
            try:
                if np.dtype(dtype).kind == "c":
                    return False
            except TypeError:  # a library's dtype numpy does not know (torch's: is_complex above)
                pass
    return not any(isinstance(node, ir.Num) and isinstance(node.value, complex)
                   for statement in program.statements if isinstance(statement, ir.Assign)
                   for node in ir.walk(statement.expr))


@functools.lru_cache(maxsize=256)
def _lower(program: ir.ProgramIR, real: bool = False) -> Lowered:
    program = stabilize_program(program)  # written-out log-sum-exp, softplus, log-sigmoid: their stable forms
    info = check_program(program)
    ranks = tuple(info.ranks.get(name, 0) for name in info.inputs)
    lowering = _Lowering(program, info.inputs, ranks, real)
    outputs, statements = lowering.run(info.returns_tuple)
    register_ranks = {register: len(sizes) for register, sizes in lowering.register_sizes.items()}
    # a register a statement binds to its target is never inlined away (a later statement, or the plan's
    # size check, reads it by name even when the lowering found it already computed by an earlier statement)
    bound = tuple(register for _, _, register in lowering.bindings if register is not None)
    shared = shared_factorisations(lowering.steps)
    checked = factored_checks(shared, register_ranks, real)
    for before, after in zip(shared, checked):  # a check found needless: its value is the matrix, by its name
        if isinstance(before, Reduce) and isinstance(after, Elementwise) and before.arg in lowering.target_names:
            lowering.target_names[after.out] = lowering.target_names.pop(before.arg)
    steps = fuse(checked, (*outputs, *bound), register_ranks)
    steps, count = accumulate_diagonals(steps, (*outputs, *bound), register_ranks, lowering.count)
    steps = owned_factorisations(release(steps, outputs, len(info.inputs)))
    made = {getattr(step, "out", None) for step in steps}
    names = tuple((register, name) for register, name in lowering.target_names.items() if register in made)
    return Lowered(info.inputs, ranks, tuple(steps), outputs, info.returns_tuple, statements, names,
                   count, tuple(lowering.bindings), tuple(lowering.ranges))

