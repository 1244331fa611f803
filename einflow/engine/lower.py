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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from einflow.engine.accumulate import accumulate_diagonals
from einflow.engine.linalg import SPD_FACTORING, matrix_kind
from einflow.engine.solving import inline_inverses
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
    Inferred,
    Lowered,
    Mul,
    Node,
    Number,
    Ones,
    Pow,
    Reduce,
    Scatter,
    Size,
    SizeRef,
    Solve,
    Step,
    Window,
    node_args,
    step_inputs,
    substitute_all,
)
from einflow.lang import ir
from einflow.lang.check import check_program
from einflow.lang.contraction import eliminate_deltas, product_output, split_product
from einflow.lang.errors import EinflowError
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import (
    NOT_PLAIN,
    free_indices,
    indices_in,
    join_partners,
    product_operands,
    size_links,
    top_level_terms,
)
from einflow.lang.numbers import _fold_power, _is_unit, _weak, exact_add
from einflow.lang.positions import _mentions, read_through, solve_through
from einflow.lang.stable import stabilize_program

__all__ = ["lower", "fuse", "release"]


def _fold(func: str, value: int | float) -> int | float:
    with np.errstate(all="ignore"):
        folded = FUNCTION_RULES[func].value(np, np.asarray(value))
    return folded.item() if hasattr(folded, "item") else folded


def _align(labels: tuple[str, ...], order: tuple[str, ...]) -> tuple[int | None, ...] | None:
    """Axes taking a register with ``labels`` to ``order`` (None when it already is in that order)."""
    if not labels or labels == order:
        return None
    return tuple(labels.index(label) if label in labels else None for label in order)


def _number_types(node: Node) -> tuple[type, ...]:
    """The types of an expression's numbers: keys must tell ``x * 2`` from ``x * 2.0`` (1 == 1.0 in Python)."""
    if isinstance(node, Number):
        return (type(node.value),)
    if isinstance(node, (Arg, Size)):
        return ()
    if isinstance(node, (Apply, AsFloat)):
        return _number_types(node.arg)
    if isinstance(node, Pow):
        return (*_number_types(node.base), type(node.exponent))
    parts = node.terms if isinstance(node, Add) else node.factors
    return tuple(t for part in parts for t in _number_types(part))


@dataclass(frozen=True, slots=True)
class _Value:
    """A lowered value: a register with axis labels, or a compile-time number."""

    reg: int | None
    labels: tuple[str, ...] = ()
    const: int | float | None = None


@dataclass(frozen=True, slots=True)
class _Factor:
    """The register of a Cholesky factor and the positions (rows, columns) of its matrices' axes."""

    reg: int
    axes: tuple[int, ...]


class _Lowering:
    def __init__(self, program: ir.ProgramIR, inputs: tuple[str, ...], ranks: tuple[int, ...]) -> None:
        self.program = program
        self.steps: list[Step] = []
        self.count = len(inputs)
        self.names: dict[str, _Value] = {name: _Value(k) for k, name in enumerate(inputs)}
        self.register_sizes: dict[int, tuple[SizeRef, ...]] = {
            k: tuple((k, axis) for axis in range(rank)) for k, rank in enumerate(ranks)}
        self.numbering: dict[Any, int] = {}
        self.memo: dict[Any, _Value] = {}
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

    # ------------------------------------------------------------------ registers
    def emit(self, key: Any, make: Any, labels: tuple[str, ...]) -> _Value:
        """Append the step ``make(register)`` unless an equal one (by ``key``) exists; its value has ``labels``."""
        register = self.numbering.get(key)
        if register is None:
            register = self.count
            self.count += 1
            step = make(register)
            self.steps.append(step)
            self.register_sizes[register] = getattr(step, "sizes", ())
            self.numbering[key] = register
        return _Value(register, labels)

    def sizes_of(self, labels: tuple[str, ...]) -> tuple[SizeRef, ...]:
        return tuple(self.sizes.get(label, -1) for label in labels)  # -1: none; specialising says so

    # ------------------------------------------------------------------ sizes
    def note_sizes(self, statement: ir.Assign) -> None:
        """Where each index of the statement gets its size (the checks are einflow.lang.indices.statement_sizes)."""
        sizes: dict[str, SizeRef] = {}
        tensors, partners = size_links(statement.expr)
        for node in tensors:
            value = self.names[node.name]
            if value.reg is not None:
                known = self.register_sizes[value.reg]
                for axis, index in enumerate(node.indices):
                    if axis < len(known) and index != NOT_PLAIN:
                        sizes.setdefault(index, known[axis])
        for index, source in self.declared.items():
            sizes.setdefault(index, source)
        self.note_ranges(statement, sizes)
        # index arithmetic: an index of a shifted read without a declared size has the range its reads allow
        self.shifted = frozenset(index for node in ir.walk(statement.expr) if isinstance(node, ir.Read)
                                 for position in node.positions if isinstance(position, ir.Affine)
                                 for index in position.indices if index not in self.declared)
        for index in self.shifted:
            sizes[index] = Inferred(self.statement, index)
        for node in ir.walk(statement.expr):  # a delta's position sizes only the indices nothing else sizes
            if isinstance(node, ir.ShiftDelta):
                for index in node.position.indices:
                    if index not in sizes and index not in self.declared:
                        sizes[index] = Inferred(self.statement, index)
        self.sizes = join_partners(sizes, partners)

    def declare(self, statement: ir.SizeDecl) -> None:
        if isinstance(statement.source, int):
            for name in statement.names:
                self.declared[name] = statement.source
            return
        if statement.source in self.shape_only:
            known: tuple[SizeRef, ...] = self.shape_only[statement.source]
        else:
            value = self.names[statement.source]
            known = self.register_sizes.get(value.reg, ()) if value.reg is not None else ()
        for axis, name in enumerate(statement.names):
            self.declared[name] = known[axis] if axis < len(known) else 1

    def note_ranges(self, statement: ir.Assign, known: dict[str, SizeRef]) -> None:
        """For a statement with shifted reads, what its ranges are inferred from when the shapes are known
        (``Lowered.ranges``: exported code infers them at run time as ``statement_sizes`` does)."""
        reads: list[tuple[SizeRef, tuple[tuple[int, str], ...], int, bool]] = []
        for node in ir.walk(statement.expr):
            if isinstance(node, ir.Read):
                value = self.names[node.name]
                lengths = self.register_sizes.get(value.reg, ()) if value.reg is not None else ()
                reads.extend((lengths[axis], position.terms, position.offset, False)
                             for axis, position in enumerate(node.positions)
                             if isinstance(position, ir.Affine) and axis < len(lengths))
            elif isinstance(node, ir.ShiftDelta) and node.index in known and isinstance(node.position, ir.Affine):
                reads.append((known[node.index], node.position.terms, node.position.offset, True))
        if reads:
            padded = tuple(sorted({index for _, terms, _, _ in reads for _, index in terms} & self.declared.keys()))
            named = {index for _, terms, _, _ in reads for _, index in terms}
            self.ranges.append((self.statement, tuple((index, size) for index, size in known.items()
                                                      if index in named), tuple(reads), padded))

    # ------------------------------------------------------------------ program
    def run(self, returns_tuple: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
        outputs: list[int] = []
        texts: list[str] = []
        final: _Value | None = None
        for name in self.matrices:  # declared inputs: checked before any statement reads them
            if name in self.input_names:
                self.check_matrix(name)
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
            texts.append(ir.format_statement(statement))
            if number in inlining.skipped:
                continue
            if number in rewritten:
                statement = replace(statement, expr=rewritten[number])  # type: ignore[arg-type]
            if isinstance(statement, ir.SizeDecl):
                self.declare(statement)
                continue
            if isinstance(statement, (ir.MatrixDecl, ir.PadDecl)):  # matrices: inputs checked first, targets
                continue  # where assigned; pads: the reads carry their modes
            if isinstance(statement, ir.Return):
                outputs.extend(self.materialize(self.names[name]).reg for name in statement.names)  # type: ignore[misc]
                continue
            self.note_sizes(statement)
            if statement.target in size_only:
                self.shape_only[statement.target or ""] = self.sizes_of(statement.indices or ())
                continue
            first_new = self.count
            value = self.lower_statement(statement)
            if statement.target is not None:
                self.names[statement.target] = value
                if value.reg is not None and value.reg >= first_new:
                    self.target_names.setdefault(value.reg, statement.target)
                if statement.target in self.matrices and value.reg is not None:
                    self.check_matrix(statement.target)
                    value = self.names[statement.target]
                self.bindings.append((number, statement.target, value.reg))
            final = value
        if not returns_tuple:
            assert final is not None
            outputs.append(self.materialize(final).reg)  # type: ignore[arg-type]
        return tuple(outputs), tuple(texts)

    def materialize(self, value: _Value) -> _Value:
        if value.const is None:
            return value
        constant = _weak(value.const)  # type: ignore[arg-type]
        return self.emit(("const", type(constant), constant),
                         lambda out: Constant(self.statement, out, constant), ())

    def lower_statement(self, statement: ir.Assign) -> _Value:
        if statement.indices is None:
            return self.lower(statement.expr, frozenset(), frozenset())
        bound = frozenset(statement.indices)
        shared = _shared_factor(top_level_terms(statement.expr), bound)
        if shared is not None and self.names.get(shared[0].name, _Value(None)).reg in self.determinants and any(
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
    def lower(self, expr: ir.Expr, bound: frozenset[str], reduce: frozenset[str]) -> _Value:
        if isinstance(expr, ir.Num):
            return _Value(None, (), expr.value)  # exact while folding; _weak where it is used
        if isinstance(expr, ir.Read):
            return self.sum_axes(self.window(expr), reduce)
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
            value = self.sum_axes(self.reduce_axes(expr.kind, body, inner), reduce)
        elif isinstance(expr, ir.Normalize):
            body = self.lower(expr.body, bound, frozenset())
            value = self.sum_axes(self.reduce_axes(expr.kind, body, frozenset(expr.indices)), reduce)
        elif isinstance(expr, ir.Linalg):  # inv keeps its indices (bound as a normaliser's); det/logdet reduce
            inner = frozenset(expr.indices) if expr.kind != "inv" else frozenset()
            body = self.lower(expr.body, bound | inner, frozenset())
            declared = self.matrices.get(expr.body.name) if isinstance(expr.body, ir.Tensor) and set(
                expr.body.indices) == set(expr.indices) else None
            kind = matrix_kind(expr.kind, declared)
            if kind.startswith("spd_"):  # from the matrix's one Cholesky factor, which its solves share too
                factor = self.factor(body, expr.indices)
                value = self.linalg("cho_" + expr.kind, _Value(factor.reg, body.labels), expr.indices, factor.axes)
            else:
                value = self.linalg(kind, body, expr.indices)
            value = self.sum_axes(value, reduce)
        elif isinstance(expr, ir.Binary):
            order = free_indices(expr, bound)
            left = self.lower(expr.left, bound, frozenset())
            right = self.lower(expr.right, bound, frozenset())
            value = self.sum_axes(self.binary(expr.func, left, right, order), reduce)
        elif isinstance(expr, ir.Sum) and len(free_indices(expr, bound)) > _MOST_AXES and \
                reduce & set(free_indices(expr, bound)):
            value = self.sum_of_term_sums(expr, bound, reduce)
        elif isinstance(expr, ir.Sum):
            order = free_indices(expr, bound)
            value = self.add([self.lower(term, bound, frozenset()) for term in expr.terms], order)
            value = self.sum_axes(value, reduce)
        elif isinstance(expr, ir.Call):
            value = self.apply(expr.func, self.lower(expr.arg, bound, frozenset()))
            value = self.sum_axes(value, reduce)
        elif isinstance(expr, ir.Power):
            value = self.power(self.lower(expr.base, bound, frozenset()), expr.exponent)
            value = self.sum_axes(value, reduce)
        else:  # pragma: no cover
            raise TypeError(expr)
        self.memo[key] = value
        return value

    def sum_of_term_sums(self, expr: ir.Sum, bound: frozenset[str], reduce: frozenset[str]) -> _Value:
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
                value = self.elementwise(("counted", product, _number_types(product)), product, value.labels)
            values.append(value)
        return self.add(values, order)

    def elementwise(self, key: Any, expr: Node, labels: tuple[str, ...]) -> _Value:
        sizes = self.sizes_of(labels)
        return self.emit(key, lambda out: Elementwise(self.statement, out, expr, labels, sizes), labels)

    def apply(self, func: str, arg: _Value) -> _Value:
        if arg.reg is None:
            return _Value(None, (), _fold(func, _weak(arg.const)))  # type: ignore[arg-type]
        # keys are positional: the same register may carry other names (`tanh(y[i])` and `tanh(y[l])`)
        value = self.elementwise(("apply", func, arg.reg), Apply(func, Arg(arg.reg)), arg.labels)
        return _Value(value.reg, arg.labels)

    def binary(self, func: str, left: _Value, right: _Value, order: tuple[str, ...]) -> _Value:
        if left.reg is None and right.reg is None:
            pick = max if func == "maximum" else min
            return _Value(None, (), _weak(pick(left.const, right.const)))  # type: ignore[type-var]
        parts = [Number(_weak(v.const)) if v.reg is None else Arg(v.reg, _align(v.labels, order))  # type: ignore
                 for v in (left, right)]
        expr = Apply(func, parts[0], parts[1])
        return self.elementwise(("binary", expr, self.sizes_of(order)), expr, order)

    def reduce_axes(self, kind: str, value: _Value, over: frozenset[str]) -> _Value:
        """A non-sum reduction (the axes ``over`` go away) or a normaliser (they stay) of a lowered value."""
        normalise = kind in ir.NORMALISERS
        if value.reg is None:  # a constant body cannot carry the indices (the checker requires them): unreachable
            raise AssertionError("a reduction of a constant")
        axes = tuple(position for position, label in enumerate(value.labels) if label in over)
        labels = value.labels if normalise else tuple(label for label in value.labels if label not in over)
        sizes = self.sizes_of(labels)
        reg = value.reg
        return self.emit((kind, reg, axes, sizes),
                         lambda out: Reduce(self.statement, out, reg, value.labels, axes, sizes, kind), labels)

    def check_matrix(self, name: str) -> None:
        """A step checking the declared matrix ``name`` at call time; later statements read its value."""
        value = self.names[name]
        reg, kind = value.reg, self.matrices[name]
        assert reg is not None
        sizes = self.register_sizes[reg]
        labels = tuple(f"_{k}" for k in range(len(sizes)))
        checked = self.emit((kind, "check", reg), lambda out: Reduce(self.statement, out, reg, labels, (0, 1), sizes,
                                                                      kind), value.labels)
        self.names[name] = checked

    def factor(self, value: _Value, indices: tuple[str, str]) -> _Factor:
        """The lower Cholesky factor of the spd matrices on the axes ``indices`` of a lowered value: one step per
        matrix register, whichever orientation reads it (the matrix is symmetric)."""
        reg = value.reg
        assert reg is not None
        axes = tuple(sorted((value.labels.index(indices[0]), value.labels.index(indices[1]))))
        sizes = self.register_sizes[reg]
        labels = tuple(f"_{k}" for k in range(len(sizes)))
        made = self.emit(("spd_factor", reg, axes), lambda out: Reduce(self.statement, out, reg, labels, axes, sizes,
                                                                      "spd_factor"), labels)
        return _Factor(made.reg, axes)  # type: ignore[arg-type]

    def linalg(self, kind: str, value: _Value, indices: tuple[str, str],
               axes: tuple[int, ...] | None = None) -> _Value:
        """inv/det/logdet of the matrices on the axes ``indices`` (rows, columns) of a lowered value (``axes``:
        their positions, given for a Cholesky factor, whose orientation is its own)."""
        if value.reg is None:  # the checker requires both indices free in the body: unreachable
            raise AssertionError("a matrix function of a constant")
        if axes is None:
            axes = (value.labels.index(indices[0]), value.labels.index(indices[1]))
        keeps = kind.endswith("inv") or kind == "adj"
        labels = value.labels if keeps else tuple(label for label in value.labels if label not in indices)
        sizes = self.sizes_of(labels)
        reg = value.reg
        # the result's shape is the argument's (less the two axes): one step per matrix, whatever indices name it
        made = self.emit((kind, reg, axes),
                         lambda out: Reduce(self.statement, out, reg, value.labels, axes, sizes, kind), labels)
        if kind == "det":
            self.determinants[made.reg] = (reg, axes)  # type: ignore[index]
        return made

    def power(self, base: _Value, exponent: int | float) -> _Value:
        if base.reg is None:
            return _Value(None, (), _fold_power(base.const, exponent))  # type: ignore[arg-type]
        if exponent == 1:
            return base
        value = self.elementwise(("pow", exponent, type(exponent), base.reg), Pow(Arg(base.reg), exponent),
                                 base.labels)
        return _Value(value.reg, base.labels)

    def sum_axes(self, value: _Value, reduce: frozenset[str]) -> _Value:
        axes = tuple(position for position, label in enumerate(value.labels) if label in reduce)
        if not axes or value.reg is None:
            return value
        labels = tuple(label for label in value.labels if label not in reduce)
        sizes = self.sizes_of(labels)
        reg = value.reg
        return self.emit(("sum", reg, axes),
                         lambda out: Reduce(self.statement, out, reg, value.labels, axes, sizes), labels)

    def add(self, terms: list[_Value], order: tuple[str, ...]) -> _Value:
        constant: int | float = 0
        arrays: list[_Value] = []
        for term in terms:
            if term.reg is None:
                constant = exact_add(constant, term.const)  # type: ignore[arg-type]
            else:
                arrays.append(term)
        if not arrays:
            return _Value(None, (), constant)
        order = tuple(order)
        has_constant = constant != 0 or isinstance(constant, float)  # + 0.0 still promotes integer arrays
        args = [Arg(term.reg, _align(term.labels, order)) for term in arrays]  # type: ignore[arg-type]
        if len(args) == 1 and not has_constant:
            if args[0].axes is None:
                return _Value(arrays[0].reg, order)
            return self.aligned(args[0], order)
        expr = Add((*args, Number(_weak(constant)))) if has_constant else Add(tuple(args))
        # positional: the same sum under other index names (`1 - h[b,i]^2`, `1 - h[w,i]^2`) is computed once
        return self.elementwise(("add", expr, _number_types(expr)), expr, order)

    def aligned(self, arg: Arg, order: tuple[str, ...]) -> _Value:
        """A register transposed (a view): one step, so that the report and the code show it."""
        return self.elementwise(("align", arg), arg, order)

    # ------------------------------------------------------------------ products
    def lower_product(self, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
                      preferred: tuple[str, ...] = ()) -> _Value:
        if any(isinstance(factor, ir.Linalg) and factor.kind == "inv" for factor in factors):
            factors = self.adjugates(factors, bound)
        if any(isinstance(factor, ir.Linalg) for factor in factors):
            factors = self.solves(factors, bound, reduce, preferred)
        if any(isinstance(factor, ir.ShiftDelta) for factor in factors):
            return self.lower_shifted(factors, bound, reduce, preferred)
        if self.shifted:  # a plain read of an index that shifted reads size is a (sliced) window too
            factors = tuple(ir.Read(f.name, f.indices) if isinstance(f, ir.Tensor) and set(f.indices) & self.shifted
                            and len(set(f.indices)) == len(f.indices) else f for f in factors)
        parts = split_product(factors, self.names.__getitem__, lambda factor: self.lower(factor, bound, frozenset()),
                              lambda value: value.const if value.reg is None else None, lambda value: value.labels)
        output, summed = product_output(parts.sequence, bound, reduce, preferred)
        classes, missing, counted = eliminate_deltas([labels for _, labels in parts.operands], parts.deltas, summed,
                                                     output)
        parts.operands.extend((self.ones(label), [label]) for label in missing)
        # a summed index that only counts multiplies the product by its size (contracting booleans would saturate)
        counts = [Size(self.sizes.get(label, -1)) for label in counted]
        if counts and not parts.operands and not parts.scalars:
            # deltas alone, all summed (`delta[j,j]`, mean's 1/n): their count, a number of the inputs' floating
            # type, from the sizes alone (never a vector of ones summed)
            factors: list[Node] = [AsFloat(counts[0]), *counts[1:]]
            if not _is_unit(parts.coefficient):
                factors.append(Number(_weak(parts.coefficient)))
            expr = Mul(tuple(factors)) if len(factors) > 1 else factors[0]
            value = self.elementwise(("count", expr, _number_types(expr)), expr, ())
            return self.diagonal(value, output, classes)
        return self.contract(parts.operands, output, classes, parts.coefficient, parts.scalars, counts)

    # ------------------------------------------------------------------ linear algebra (LANGUAGE.md 8.1)
    def adjugates(self, factors: tuple[ir.Expr, ...], bound: frozenset[str]) -> tuple[ir.Expr, ...]:
        """``det(M) inv[i,j](M)`` in one product (the derivative of ``det``, ``f inv[q,p](A[q,p])`` with ``f`` a
        statement's ``det[i,j](A[i,j])``) is M's adjugate: one step, defined where M is singular too (the
        derivative exists there). The det factor goes, the inverse becomes a reference to the adjugate."""
        factors = list(factors)
        for position, factor in enumerate(factors):
            if not isinstance(factor, ir.Linalg) or factor.kind != "inv" or self.declared_kind(factor) == "spd":
                continue
            matrix = self.lower(factor.body, bound, frozenset())
            if matrix.reg is None:
                continue
            axes = (matrix.labels.index(factor.indices[0]), matrix.labels.index(factor.indices[1]))
            partner = next((k for k, other in enumerate(factors)
                            if k != position and self.is_det_of(other, matrix, axes, bound)), None)
            if partner is None:
                continue
            made = self.linalg("adj", matrix, factor.indices)
            name = f"adj#{made.reg}"  # not a name the language can write: never a user's tensor
            self.names[name] = _Value(made.reg, made.labels)
            factors[position] = ir.Tensor(name, made.labels)
            del factors[partner]
            return self.adjugates(tuple(factors), bound)
        return tuple(factors)

    def declared_kind(self, atom: ir.Linalg) -> str | None:
        """How the matrix of ``atom`` is declared (``spd``, ``symmetric``; None: not declared)."""
        body = atom.body
        if isinstance(body, ir.Tensor) and set(body.indices) == set(atom.indices):
            return self.matrices.get(body.name)
        return None

    def is_det_of(self, factor: ir.Expr, matrix: _Value, axes: tuple[int, int], bound: frozenset[str]) -> bool:
        """Whether ``factor`` is the determinant of the matrices on ``axes`` of the lowered ``matrix``, batch
        index for batch index: ``det[a,b](M)`` itself, or a reference to a statement's value that is one."""
        batch = [k for k in range(len(matrix.labels)) if k not in axes]
        if isinstance(factor, ir.Linalg) and factor.kind == "det" and self.declared_kind(factor) != "spd":
            body = self.lower(factor.body, bound | frozenset(factor.indices), frozenset())
            if body.reg != matrix.reg or body.reg is None:
                return False
            own = {body.labels.index(factor.indices[0]), body.labels.index(factor.indices[1])}
            return own == set(axes) and all(body.labels[k] == matrix.labels[k] for k in batch)
        if not isinstance(factor, ir.Tensor) or len(set(factor.indices)) != len(factor.indices):
            return False
        value = self.names.get(factor.name)
        found = self.determinants.get(value.reg) if value is not None and value.reg is not None else None
        if found is None or found[0] != matrix.reg or set(found[1]) != set(axes):
            return False
        return factor.indices == tuple(matrix.labels[k] for k in batch)

    def solves(self, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
               preferred: tuple[str, ...]) -> tuple[ir.Expr, ...]:
        """``inv[i,j](M) B[..j..]`` with ``j`` summed here and read by B alone: one Solve step instead of the
        inverse (``B[..i..] inv[i,j](M)`` solves with M's transpose); the solved value stands in the product as a
        tensor reference. M's other indices (a batch of matrices) must be B's too; its other index may not be.
        Of the candidates, the thinnest B goes first (fewest other axes: a vector before a matrix)."""
        factors = list(factors)
        while True:
            operands = product_operands(tuple(factors), bound)
            counts = Counter(label for labels in operands for label in labels)
            best: tuple[int, int, int, str, str, bool] | None = None
            for position, factor in enumerate(factors):
                if not isinstance(factor, ir.Linalg) or factor.kind != "inv":
                    continue
                row, column = factor.indices
                batch = set(free_indices(factor.body, bound)) - {row, column}
                for index, other, transposed in ((column, row, False), (row, column, True)):
                    summed = index in reduce or (index not in bound and index not in preferred)
                    if not summed or counts[index] != 2 or index in batch:
                        continue
                    partner = next((k for k, labels in enumerate(operands) if k != position and index in labels), None)
                    rhs = factors[partner] if partner is not None else None
                    # (a batch index B lacks: B is the same right-hand side for every matrix, broadcast)
                    if not isinstance(rhs, ir.Tensor) or rhs.indices.count(index) != 1 or other in rhs.indices \
                            or self.names[rhs.name].reg is None or len(set(rhs.indices)) != len(rhs.indices):
                        continue
                    width = len(rhs.indices) - 1 - len(batch & set(rhs.indices))  # the right-hand sides' axes
                    if best is None or width < best[0]:
                        best = (width, position, partner, index, other, transposed)  # type: ignore[assignment]
            if best is None:
                return tuple(factors)
            _, position, partner, index, other, transposed = best
            solved = self.solve(factors[position], factors[partner], index, other, transposed,  # type: ignore
                                bound)
            factors = [f for k, f in enumerate(factors) if k not in (position, partner)] + [solved]

    def solve(self, inverse: ir.Linalg, rhs: ir.Tensor, index: str, other: str, transposed: bool,
              bound: frozenset[str]) -> ir.Tensor:
        """The Solve step for ``inv(M) rhs`` over ``index``; a reference to its value (labels: M's batch indices,
        other, then rhs's)."""
        matrix = self.lower(inverse.body, bound, frozenset())
        assert matrix.reg is not None
        declared = self.matrices.get(inverse.body.name) if isinstance(inverse.body, ir.Tensor) else None
        kind = "spd_solve" if declared == "spd" else "solve"
        # an spd matrix keeps the orientation it is read in: a complex (Hermitian) one's transpose is its conjugate
        axes = (matrix.labels.index(inverse.indices[0]), matrix.labels.index(inverse.indices[1]))
        solved = matrix.reg
        if kind == "spd_solve":  # one Cholesky factor, shared by every solve with this matrix (either orientation)
            factor = self.factor(matrix, inverse.indices)
            kind, axes, solved = "cho_solve", factor.axes, factor.reg  # type: ignore[assignment]
        batch_labels = tuple(label for label in matrix.labels if label not in inverse.indices)
        batch = tuple((matrix.labels.index(label), rhs.indices.index(label) if label in rhs.indices else None)
                      for label in batch_labels)
        rest = tuple(label for label in rhs.indices if label != index and label not in batch_labels)
        labels = (*batch_labels, other, *rest)
        rhs_reg = self.names[rhs.name].reg
        rhs_axis = rhs.indices.index(index)
        sizes = self.sizes_of(labels)
        made = self.emit(("solve", kind, solved, axes, rhs_reg, rhs_axis, transposed, batch),
                         lambda out: Solve(self.statement, out, solved, rhs_reg, axes, rhs_axis,  # type: ignore
                                           transposed, labels, sizes, kind, batch), labels)
        name = f"solve#{made.reg}"  # not a name the language can write: never a user's tensor
        self.names[name] = _Value(made.reg, labels)
        return ir.Tensor(name, labels)

    def lower_shifted(self, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
                      preferred: tuple[str, ...]) -> _Value:
        """A product with deltas of positions: a summed one is read through (``x[p] delta[p, h+r]`` is the
        padded read ``x[h+r]``), a kept one scatters the product of the other factors (:class:`Scatter`)."""
        output, summed = product_output(product_operands(factors, bound), bound, reduce, preferred)
        through = {f.index for f in factors if isinstance(f, ir.ShiftDelta)} & set(summed)
        leaves = (ir.Num, ir.Tensor, ir.Read, ir.Delta, ir.ShiftDelta)
        named: list[ir.Expr] = []
        for factor in factors:  # a scope read through a delta is computed first, then read as a named array
            if not isinstance(factor, leaves) and indices_in(factor) & through:
                value = self.materialize(self.lower(factor, bound, frozenset()))
                name = f"#{value.reg}"
                self.names[name] = _Value(value.reg, value.labels)
                factor = ir.Tensor(name, value.labels)
            named.append(factor)
        factors, shifts = read_through(solve_through(tuple(named), frozenset(summed)), frozenset(summed))
        stuck = {id(shift): self.indicator(shift) for shift in shifts if shift.index in summed}
        if stuck:  # a summed delta nothing reads through (``delta[v, t[n]] delta[v, t[m]]``): a dense 0/1 array
            factors = tuple(stuck.get(id(factor), factor) for factor in factors)
            shifts = [shift for shift in shifts if id(shift) not in stuck]
        reduce = reduce | frozenset(summed)  # substituting changes how often an index occurs, not whether it sums
        repeated = {index for index, count in Counter(shift.index for shift in shifts).items() if count > 1}
        dense: dict[int, ir.Expr] = {}
        for shift in shifts:  # a delta whose index other factors read too (or other deltas, all of them): 0/1 arrays
            others = {i for f in factors if f is not shift and not isinstance(f, ir.ShiftDelta) for i in _mentions(f)}
            if shift.index in others or shift.index in repeated or shift.index in shift.position.indices:
                # (``delta[s, t[s]]``, a diagonal of a scatter, as a Laplacian makes it: a 0/1 mask over s)
                dense[id(shift)] = self.indicator(shift)
        if dense:
            factors = tuple(dense.get(id(factor), factor) for factor in factors)
            shifts = [f for f in factors if isinstance(f, ir.ShiftDelta)]
        if not shifts:
            return self.lower_product(factors, bound, reduce, preferred)
        rest = tuple(factor for factor in factors if not isinstance(factor, ir.ShiftDelta))
        targets = [shift.index for shift in shifts]
        needed = tuple(dict.fromkeys([*(label for label in output if label not in targets),
                                      *(index for shift in shifts for index in shift.position.indices)]))
        value = self.materialize(self.lower_product(rest, bound | frozenset(needed), reduce - frozenset(needed),
                                                    needed)) if rest else _Value(None, (), 1)
        if value.reg is None and not needed:  # deltas of constant positions alone (``delta[p, 1]``): the number
            value = self.materialize(_Value(None, (), value.const))
        elif value.reg is None:  # deltas alone: ones of the inputs' floating type, times the number
            ones = [self.ones(label) for label in needed]
            node: Node = Mul(tuple(Arg(one.reg, _align((label,), needed)) for one, label in zip(ones, needed)))  # type: ignore
            node = Mul((AsFloat(node), Number(_weak(value.const))))  # type: ignore[arg-type]
            value = self.elementwise(("mul", node, _number_types(node)), node, needed)
        missing = [label for label in needed if label not in value.labels]
        if missing and value.reg is not None:  # broadcast over what the value lacks (a Toeplitz matrix of K)
            ones = [self.ones(label) for label in missing]
            product = Mul((Arg(value.reg, _align(value.labels, needed)),  # type: ignore[arg-type]
                           *(Arg(one.reg, _align((label,), needed)) for one, label in zip(ones, missing))))  # type: ignore
            value = self.elementwise(("mul", product, _number_types(product)), product, needed)
        if (len(set(targets)) != len(targets) or value.reg is None or set(targets) & set(value.labels)
                or set(needed) - set(value.labels)):
            raise EinflowError("this product of deltas of positions cannot be computed yet: "
                               + ir.format_expr(ir.Product(factors)))
        by_target = {shift.index: shift for shift in shifts}
        positions = tuple(by_target[label].position if label in by_target else label for label in output)
        modes = tuple(by_target[label].mode if label in by_target else "zeros" for label in output)
        modes = modes if any(mode != "zeros" for mode in modes) else ()
        gathers = tuple(self.materialize(self.names[g.name]).reg for shift in shifts for g in shift.gathers)
        labels = tuple(output)
        sizes = self.sizes_of(labels)
        key = ("scatter", value.reg, value.labels, positions, gathers, labels, sizes, modes)
        return self.emit(key, lambda out: Scatter(self.statement, out, value.reg, value.labels,  # type: ignore
                                                  positions, gathers, labels, sizes, modes), labels)  # type: ignore

    def indicator(self, shift: ir.ShiftDelta) -> ir.Tensor:
        """``delta[p, 2*k + 1]`` as a dense 0/1 array over ``p`` and the position's indices (a scatter of ones),
        named so that a product reads it like any tensor."""
        labels = tuple(shift.position.indices)
        ones = [self.ones(label) for label in labels]
        if ones:
            node: Node = AsFloat(Mul(tuple(Arg(one.reg, _align((label,), labels))  # type: ignore[arg-type]
                                           for one, label in zip(ones, labels))))
            value = self.elementwise(("mul", node, _number_types(node)), node, labels)
        else:  # a constant position: one 1.0 put at it
            value = self.materialize(_Value(None, (), 1.0))
        output = (shift.index, *labels)
        gathers = tuple(self.materialize(self.names[g.name]).reg for g in shift.gathers)
        sizes = self.sizes_of(output)
        positions = (shift.position, *labels)
        modes = (shift.mode, *("zeros" for _ in labels)) if shift.mode != "zeros" else ()
        key = ("scatter", value.reg, labels, positions, gathers, output, sizes, modes)
        result = self.emit(key, lambda out: Scatter(self.statement, out, value.reg, labels,  # type: ignore[arg-type]
                                                    positions, gathers, output, sizes, modes), output)
        name = f"#{result.reg}"
        self.names[name] = _Value(result.reg, output)
        return ir.Tensor(name, output)

    def window(self, read: ir.Read) -> _Value:
        """A shifted, strided, constant or gathered read: one :class:`Window` step (``einflow.engine.affine``)."""
        source = self.materialize(self.names[read.name])
        gathers = tuple(self.materialize(self.names[gather.name]).reg for gather in read.gathers)
        labels = read.indices
        sizes = self.sizes_of(labels)
        key = ("window", source.reg, read.positions, gathers, labels, sizes, read.mode)
        return self.emit(key, lambda out: Window(self.statement, out, source.reg, read.name,  # type: ignore[arg-type]
                                                 read.positions, gathers, labels, sizes, read.mode), labels)  # type: ignore

    def ones(self, label: str) -> _Value:
        size = self.sizes.get(label, -1)
        value = self.emit(("ones", size), lambda out: Ones(self.statement, out, size), (label,))
        self.register_sizes[value.reg] = (size,)  # type: ignore[index]
        self.synthetic.add(value.reg)  # type: ignore[arg-type]
        return value

    def contract(self, operands: list[tuple[_Value, list[str]]], output: list[str], classes: dict[str, list[str]],
                 coefficient: int | float, scalars: list[_Value], counts: list[Size]) -> _Value:
        operands, scalars = self.presum(operands, output, scalars)
        partners = {member for rep, members in classes.items() for member in members if member != rep}
        inner = tuple(label for label in output if label not in partners)
        scale: list[Node] = [Arg(s.reg) for s in scalars] + counts  # type: ignore[arg-type]
        if not _is_unit(coefficient):
            scale.append(Number(_weak(coefficient)))
        if not operands:
            if not scalars:
                return self.diagonal(_Value(None, (), coefficient), output, classes)
            if len(scale) == 1 and isinstance(scale[0], Arg):
                return self.diagonal(_Value(scale[0].register, ()), output, classes)
            product = Mul(tuple(scale))
            value = self.elementwise(("mul", product, _number_types(product)), product, ())
            return self.diagonal(value, output, classes)
        if not scalars and all(value.reg in self.synthetic for value, _ in operands):
            # deltas alone are booleans: in the inputs' floating type (scaled even by the int 1: numbers, not bools)
            value, labels = operands[0]
            expr = Mul((AsFloat(Arg(value.reg)), Number(_weak(coefficient)), *counts))  # type: ignore[arg-type]
            operands[0] = (self.elementwise(("mul", expr, _number_types(expr)), expr, value.labels), labels)
            scale = []
        keys = [tuple(labels) for _, labels in operands]
        everything = [label for labels in keys for label in labels]
        repeated = any(len(set(labels)) != len(labels) for labels in keys)
        summed = set(everything) - set(inner)
        if not repeated and not summed:
            # an elementwise product (outer products included): broadcasting, never einsum
            factors = [Arg(value.reg, _align(labels, inner)) for (value, _), labels in zip(operands, keys)]
            if len(factors) == 1 and not scale:
                if factors[0].axes is None:
                    result = _Value(operands[0][0].reg, inner)
                else:
                    result = self.aligned(factors[0], inner)  # type: ignore[arg-type]
            else:
                expr = Mul((*factors, *scale))  # type: ignore[arg-type]
                result = self.elementwise(("mul", expr, _number_types(expr)), expr, inner)
            return self.diagonal(result, output, classes)
        if len(operands) == 1 and not repeated:
            value, labels = operands[0]
            keep = tuple(label for label in keys[0] if label in inner)
            axes = tuple(position for position, label in enumerate(keys[0]) if label not in inner)
            reduced = self.sum_axes(_Value(value.reg, keys[0]), frozenset(keys[0][a] for a in axes))
            reduced = _Value(reduced.reg, keep)
            expr: Node = Arg(reduced.reg, _align(keep, inner))  # type: ignore[arg-type]
            if scale:
                expr = Mul((expr, *scale))
            elif expr.axes is None:  # type: ignore[union-attr]
                return self.diagonal(_Value(reduced.reg, inner), output, classes)
            return self.diagonal(self.elementwise(("mul", expr, _number_types(expr)), expr, inner), output,
                                 classes)
        args = tuple(value.reg for value, _ in operands)
        sizes = self.sizes_of(inner)
        # positional: the same contraction under other index names is computed once
        letters = {label: chr(97 + k) for k, label in enumerate(dict.fromkeys(everything))}
        equation = (tuple("".join(letters[label] for label in labels) for labels in keys),
                    "".join(letters[label] for label in inner))
        key = ("contract", equation, args, tuple(scale), _number_types(Mul(tuple(scale))))
        result = self.emit(key, lambda out: Contract(  # type: ignore[arg-type]
            self.statement, out, args, tuple(keys), inner, sizes, tuple(scale)), inner)
        return self.diagonal(result, output, classes)

    def presum(self, operands: list[tuple[_Value, list[str]]], output: list[str],
               scalars: list[_Value]) -> tuple[list[tuple[_Value, list[str]]], list[_Value]]:
        """An operand whose indices are all summed and occur nowhere else is summed on its own first: a scalar
        factor (``sum[i](w[i] s[p])`` is ``sum(w) * s``, not an ``i,p->p`` outer product); an operand's indices
        that occur nowhere else are summed on it first too."""
        if len(operands) < 2:
            return operands, scalars
        kept: list[tuple[_Value, list[str]]] = []
        scalars = list(scalars)
        # how many operands carry each index: an operand's index is elsewhere when another one carries it too
        carriers = Counter(label for _, own in operands for label in set(own))
        for position, (value, labels) in enumerate(operands):
            shared = {label for label in labels if carriers[label] > 1}
            alone = (labels and len(set(labels)) == len(labels) and not set(labels) & (shared | set(output))
                     and value.reg not in self.synthetic)
            private = frozenset(labels) - shared - set(output)
            if alone and (kept or position < len(operands) - 1):
                reduced = self.sum_axes(_Value(value.reg, tuple(labels)), frozenset(labels))
                scalars.append(_Value(reduced.reg, ()))
            elif private and len(set(labels)) == len(labels) and value.reg not in self.synthetic:
                # indices only this operand carries are summed on it first (`Y[r,c] t[r,s]`: the row sums of Y
                # times t, a broadcast product, not an `rc,rs->rs` einsum)
                reduced = self.sum_axes(_Value(value.reg, tuple(labels)), private)
                kept.append((reduced, [label for label in labels if label not in private]))
            else:
                kept.append((value, labels))
        return kept, scalars

    def diagonal(self, value: _Value, output: list[str], classes: dict[str, list[str]]) -> _Value:
        if not classes:
            return value
        value = self.materialize(value)
        full = tuple(output)
        groups = tuple(tuple(members) for members in classes.values())
        sizes = self.sizes_of(full)
        reg, labels = value.reg, value.labels
        return self.emit(("diag", reg, labels, full, groups, sizes), lambda out: Diagonal(
            self.statement, out, reg, labels, full, groups, sizes), full)  # type: ignore[arg-type]


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
        pending.setdefault(reader_position, {})[current.out] = current.expr
        for register in node_args(current.expr):
            readers[register] = reader_position
        result[k] = None
    return [step for step in result if step is not None]


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


def lower(program: Any) -> Lowered:
    """Lower a compiled program (an ``einflow.Program`` or its checked IR) to steps, fused and freed."""
    return _lower(program if isinstance(program, ir.ProgramIR) else program.ir)


def shared_factorisations(steps: list[Step]) -> list[Step]:
    """A solve with a matrix whose inverse the program forms anyway is a product with that inverse (n^2 work per
    right-hand side instead of a second factorisation): the inverse step moves up to the first such solve."""
    inverses = {step.arg: step for step in steps if isinstance(step, Reduce) and step.kind in ("inv", "spd_inv")
                and len(step.labels) == 2}
    if not any(isinstance(step, Solve) and step.matrix in inverses and not step.batch for step in steps):
        return steps
    made = {inverse.out for inverse in inverses.values()}
    result: list[Step] = []
    placed: set[int] = set()
    for step in steps:
        if isinstance(step, Reduce) and step.out in made:
            if step.out not in placed:  # else already moved up to a solve before it
                placed.add(step.out)
                result.append(step)
            continue
        if isinstance(step, Solve) and step.matrix in inverses and not step.batch:
            inverse = inverses[step.matrix]  # its value is inv(matrix register), whichever axes it read
            if inverse.out not in placed:
                result.append(replace(inverse, statement=step.statement))
                placed.add(inverse.out)
            other, rest = step.labels[0], step.labels[1:]
            transposed = (step.axes == (1, 0)) != step.transposed
            summed = other + "#"  # not a name the language can write
            remaining = iter(rest)
            rhs = tuple(summed if axis == step.rhs_axis else next(remaining) for axis in range(len(rest) + 1))
            result.append(Contract(step.statement, step.out, (inverse.out, step.rhs),
                                   ((summed, other) if transposed else (other, summed), rhs), step.labels,
                                   step.sizes))
            continue
        result.append(step)
    return result


def factored_checks(steps: list[Step]) -> list[Step]:
    """An spd matrix that a later step factorises (Cholesky) is checked for symmetry only: the factorisation
    finds a matrix that is not positive definite (and names it), so the check does not factorise it again."""
    factorised = {step.matrix if isinstance(step, Solve) else step.arg for step in steps  # type: ignore[union-attr]
                  if getattr(step, "kind", "") in SPD_FACTORING}
    return [replace(step, kind="spd_by_factor") if isinstance(step, Reduce) and step.kind == "spd"
            and step.out in factorised else step for step in steps]


@functools.lru_cache(maxsize=256)
def _lower(program: ir.ProgramIR) -> Lowered:
    program = stabilize_program(program)  # written-out log-sum-exp, softplus, log-sigmoid: their stable forms
    info = check_program(program)
    ranks = tuple(info.ranks.get(name, 0) for name in info.inputs)
    lowering = _Lowering(program, info.inputs, ranks)
    outputs, statements = lowering.run(info.returns_tuple)
    register_ranks = {register: len(sizes) for register, sizes in lowering.register_sizes.items()}
    # a register a statement binds to its target is never inlined away (a later statement, or the plan's
    # size check, reads it by name even when the lowering found it already computed by an earlier statement)
    bound = tuple(register for _, _, register in lowering.bindings if register is not None)
    steps = fuse(factored_checks(shared_factorisations(lowering.steps)), (*outputs, *bound), register_ranks)
    steps, count = accumulate_diagonals(steps, (*outputs, *bound), register_ranks, lowering.count)
    steps = release(steps, outputs, len(info.inputs))
    made = {getattr(step, "out", None) for step in steps}
    names = tuple((register, name) for register, name in lowering.target_names.items() if register in made)
    return Lowered(info.inputs, ranks, tuple(steps), outputs, info.returns_tuple, statements, names,
                   count, tuple(lowering.bindings), tuple(lowering.ranges))

