"""Lowering linear algebra (LANGUAGE.md 8.1): ``inv``/``det``/``logdet`` atoms as steps, ``det(M) inv(M)`` as M's
adjugate, ``inv(M) B`` as a solve, declared matrices checked, and the passes over the steps that share
factorisations. Each function is passed the statement's :class:`~einflow.engine.lower_context.LoweringContext`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

from einflow.engine.linalg import CHECK_KINDS, KEEPS_AXES, SPD_FACTORING, matrix_kind
from einflow.engine.lower_context import Factor, LoweringContext, Value
from einflow.engine.steps import (
    Add,
    Arg,
    Contract,
    Diagonal,
    Elementwise,
    Free,
    Reduce,
    Solve,
    Step,
    arg_nodes,
    node_args,
)
from einflow.lang import ir
from einflow.lang.indices import free_indices, product_operands

__all__ = ["lower_linalg", "check_matrix", "cholesky_factor", "linalg_step", "adjugates", "solves",
           "shared_factorisations", "factored_checks", "symmetric_registers", "owned_factorisations"]


def lower_linalg(cx: LoweringContext, expr: ir.Linalg, bound: frozenset[str], reduce: frozenset[str]) -> Value:
    """``inv``/``det``/``logdet``/``sign_det`` of a matrix expression (an spd matrix's from its Cholesky factor)."""
    inner = frozenset(ir.reduced_indices(expr))
    body = cx.lower(expr.body, bound | inner, frozenset())
    declared = cx.matrices.get(expr.body.name) if isinstance(expr.body, ir.Tensor) and set(
        expr.body.indices) == set(expr.indices) else None
    kind = matrix_kind(expr.kind, declared)
    if kind.startswith("spd_"):  # from the matrix's one Cholesky factor, which its solves share too
        factor = cholesky_factor(cx, body, expr.indices)
        value = linalg_step(cx, "cho_" + expr.kind, Value(factor.reg, body.labels), expr.indices, factor.axes)
    else:
        value = linalg_step(cx, kind, body, expr.indices)
    return cx.sum_axes(value, reduce)


def check_matrix(cx: LoweringContext, name: str) -> None:
    """A step checking the declared matrix ``name`` at call time; later statements read its value."""
    value = cx.names[name]
    reg, kind = value.reg, cx.matrices[name]
    assert reg is not None
    sizes = cx.register_sizes[reg]
    labels = tuple(f"_{k}" for k in range(len(sizes)))
    checked = cx.emit((kind, "check", reg), value.labels, Reduce, reg, labels, (0, 1), sizes, kind)
    cx.names[name] = checked


def cholesky_factor(cx: LoweringContext, value: Value, indices: tuple[str, str]) -> Factor:
    """The lower Cholesky factor of the spd matrices on the axes ``indices`` of a lowered value: one step per
    matrix register, whichever orientation reads it (the matrix is symmetric)."""
    reg = value.reg
    assert reg is not None
    axes = tuple(sorted((value.labels.index(indices[0]), value.labels.index(indices[1]))))
    sizes = cx.register_sizes[reg]
    labels = tuple(f"_{k}" for k in range(len(sizes)))
    made = cx.emit(("spd_factor", reg, axes), labels, Reduce, reg, labels, axes, sizes, "spd_factor")
    return Factor(made.reg, axes)  # type: ignore[arg-type]


def linalg_step(cx: LoweringContext, kind: str, value: Value, indices: tuple[str, str],
           axes: tuple[int, ...] | None = None) -> Value:
    """inv/det/logdet of the matrices on the axes ``indices`` (rows, columns) of a lowered value (``axes``:
    their positions, given for a Cholesky factor, whose orientation is its own)."""
    if value.reg is None:  # the checker requires both indices free in the body: unreachable
        raise AssertionError("a matrix function of a constant")
    if axes is None:
        axes = (value.labels.index(indices[0]), value.labels.index(indices[1]))
    keeps = kind in KEEPS_AXES
    labels = value.labels if keeps else tuple(label for label in value.labels if label not in indices)
    sizes = cx.sizes_of(labels)
    reg = value.reg
    # the result's shape is the argument's (less the two axes): one step per matrix, whatever indices name it
    made = cx.emit((kind, reg, axes), labels, Reduce, reg, value.labels, axes, sizes, kind)
    if kind == "det":
        cx.determinants[made.reg] = (reg, axes)  # type: ignore[index]
    return made


def adjugates(cx: LoweringContext, factors: tuple[ir.Expr, ...], bound: frozenset[str]) -> tuple[ir.Expr, ...]:
    """``det(M) inv[i,j](M)`` in one product (the derivative of ``det``, ``f inv[q,p](A[q,p])`` with ``f`` a
    statement's ``det[i,j](A[i,j])``) is M's adjugate: one step, defined where M is singular too (the
    derivative exists there). The det factor goes, the inverse becomes a reference to the adjugate."""
    factors = list(factors)
    for position, factor in enumerate(factors):
        if not isinstance(factor, ir.Linalg) or factor.kind != "inv" or declared_kind(cx, factor) == "spd":
            continue
        matrix = cx.lower(factor.body, bound, frozenset())
        if matrix.reg is None:
            continue
        axes = (matrix.labels.index(factor.indices[0]), matrix.labels.index(factor.indices[1]))
        partner = next((k for k, other in enumerate(factors)
                        if k != position and is_det_of(cx, other, matrix, axes, bound)), None)
        if partner is None:
            continue
        made = linalg_step(cx, "adj", matrix, factor.indices)
        name = f"adj#{made.reg}"  # not a name the language can write: never a user's tensor
        cx.names[name] = Value(made.reg, made.labels)
        factors[position] = ir.Tensor(name, made.labels)
        del factors[partner]
        return adjugates(cx, tuple(factors), bound)
    return tuple(factors)


def declared_kind(cx: LoweringContext, atom: ir.Linalg) -> str | None:
    """How the matrix of ``atom`` is declared (``spd``, ``symmetric``; None: not declared)."""
    body = atom.body
    if isinstance(body, ir.Tensor) and set(body.indices) == set(atom.indices):
        return cx.matrices.get(body.name)
    return None


def is_det_of(cx: LoweringContext, factor: ir.Expr, matrix: Value, axes: tuple[int, int],
              bound: frozenset[str]) -> bool:
    """Whether ``factor`` is the determinant of the matrices on ``axes`` of the lowered ``matrix``, batch
    index for batch index: ``det[a,b](M)`` itself, or a reference to a statement's value that is one."""
    batch = [k for k in range(len(matrix.labels)) if k not in axes]
    if isinstance(factor, ir.Linalg) and factor.kind == "det" and declared_kind(cx, factor) != "spd":
        body = cx.lower(factor.body, bound | frozenset(factor.indices), frozenset())
        if body.reg != matrix.reg or body.reg is None:
            return False
        own = {body.labels.index(factor.indices[0]), body.labels.index(factor.indices[1])}
        return own == set(axes) and all(body.labels[k] == matrix.labels[k] for k in batch)
    if not isinstance(factor, ir.Tensor) or len(set(factor.indices)) != len(factor.indices):
        return False
    value = cx.names.get(factor.name)
    found = cx.determinants.get(value.reg) if value is not None and value.reg is not None else None
    if found is None or found[0] != matrix.reg or set(found[1]) != set(axes):
        return False
    return factor.indices == tuple(matrix.labels[k] for k in batch)


def solves(cx: LoweringContext, factors: tuple[ir.Expr, ...], bound: frozenset[str], reduce: frozenset[str],
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
                        or cx.names[rhs.name].reg is None or len(set(rhs.indices)) != len(rhs.indices):
                    continue
                width = len(rhs.indices) - 1 - len(batch & set(rhs.indices))  # the right-hand sides' axes
                if best is None or width < best[0]:
                    best = (width, position, partner, index, other, transposed)  # type: ignore[assignment]
        if best is None:
            return tuple(factors)
        _, position, partner, index, other, transposed = best
        solved = solve(cx, factors[position], factors[partner], index, other, transposed,  # type: ignore
                            bound)
        factors = [f for k, f in enumerate(factors) if k not in (position, partner)] + [solved]


def solve(cx: LoweringContext, inverse: ir.Linalg, rhs: ir.Tensor, index: str, other: str, transposed: bool,
          bound: frozenset[str]) -> ir.Tensor:
    """The Solve step for ``inv(M) rhs`` over ``index``; a reference to its value (labels: M's batch indices,
    other, then rhs's)."""
    matrix = cx.lower(inverse.body, bound, frozenset())
    assert matrix.reg is not None
    declared = cx.matrices.get(inverse.body.name) if isinstance(inverse.body, ir.Tensor) else None
    kind = "spd_solve" if declared == "spd" else "solve"
    # an spd matrix keeps the orientation it is read in: a complex (Hermitian) one's transpose is its conjugate;
    # a real one is its own transpose, and a symmetric one (real or complex) too: one solve for both readings
    if declared == "symmetric" or declared in ("spd", "hermitian") and cx.real:
        transposed = False
    axes = (matrix.labels.index(inverse.indices[0]), matrix.labels.index(inverse.indices[1]))
    solved = matrix.reg
    if kind == "spd_solve":  # one Cholesky factor, shared by every solve with this matrix (either orientation)
        factor = cholesky_factor(cx, matrix, inverse.indices)
        kind, axes, solved = "cho_solve", factor.axes, factor.reg  # type: ignore[assignment]
    batch_labels = tuple(label for label in matrix.labels if label not in inverse.indices)
    batch = tuple((matrix.labels.index(label), rhs.indices.index(label) if label in rhs.indices else None)
                  for label in batch_labels)
    rest = tuple(label for label in rhs.indices if label != index and label not in batch_labels)
    labels = (*batch_labels, other, *rest)
    rhs_reg = cx.names[rhs.name].reg
    rhs_axis = rhs.indices.index(index)
    sizes = cx.sizes_of(labels)
    made = cx.emit(("solve", kind, solved, axes, rhs_reg, rhs_axis, transposed, batch), labels, Solve, solved,
                   rhs_reg, axes, rhs_axis, transposed, labels, sizes, kind, batch)
    name = f"solve#{made.reg}"  # not a name the language can write: never a user's tensor
    cx.names[name] = Value(made.reg, labels)
    return ir.Tensor(name, labels)


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


def factored_checks(steps: list[Step], ranks: dict[int, int] | None = None, real: bool = False) -> list[Step]:
    """An spd matrix that a later step factorises (Cholesky) is checked for symmetry only: the factorisation
    finds a matrix that is not positive definite (and names it), so the check does not factorise it again.

    A matrix symmetric by construction (:func:`symmetric_registers`; ``ranks``: each register's) is not checked
    for symmetry at all: declared ``symmetric``, or, in a program of real values (``real``), ``hermitian``, or
    ``spd`` where a later step factorises it; the check's value is then the matrix itself."""
    factorised = {step.matrix if isinstance(step, Solve) else step.arg for step in steps  # type: ignore[union-attr]
                  if getattr(step, "kind", "") in SPD_FACTORING}
    symmetric = symmetric_registers(steps, ranks, real) if ranks is not None else set()
    result: list[Step] = []
    for step in steps:
        if isinstance(step, Reduce) and step.kind in CHECK_KINDS and step.arg in symmetric and (
                step.kind == "symmetric" or real and (step.kind == "hermitian" or step.out in factorised)):
            step = Elementwise(step.statement, step.out, Arg(step.arg), step.labels, step.sizes)
        elif isinstance(step, Reduce) and step.kind == "spd" and step.out in factorised:
            step = replace(step, kind="spd_by_factor")
        result.append(step)
    return result


def symmetric_registers(steps: list[Step], ranks: dict[int, int], real: bool) -> set[int]:
    """The matrices (registers of two axes) that are symmetric by how the steps make them: a product invariant
    under swapping its two output indices (``X[i,d] X[j,d]``, ``A[i,k] S[k,l] A[j,l]`` with S symmetric), values on
    the diagonal (``s delta[i,j]``), elementwise functions of symmetric matrices and scalars (``exp(-D[i,j])``,
    ``K + L``, ``2 K``), and checked declared matrices (``symmetric``; any declared one in a real program)."""
    symmetric: set[int] = set()
    for step in steps:
        if isinstance(step, Contract) and len(step.output) == 2 and len(step.args) > 1:
            if _swap_invariant(step, symmetric, ranks):
                symmetric.add(step.out)
        elif isinstance(step, Diagonal) and len(step.output) == 2:
            on_diagonal = any(set(step.output) <= set(group) for group in step.groups)
            if on_diagonal and (step.base is None or step.base in symmetric):
                symmetric.add(step.out)
        elif isinstance(step, Elementwise) and len(step.labels) == 2:
            if all(ranks.get(arg.register) == 0 or arg.register in symmetric and arg.axes in (None, (0, 1), (1, 0))
                   for arg in arg_nodes(step.expr)):
                symmetric.add(step.out)
        elif isinstance(step, Reduce) and step.kind in CHECK_KINDS and len(step.labels) == 2:
            if step.kind == "symmetric" or real or step.arg in symmetric:
                symmetric.add(step.out)
    return symmetric


def _swap_invariant(step: Contract, symmetric: set[int], ranks: dict[int, int]) -> bool:
    """Whether a product of two output indices is the same product with the two swapped (its summed indices
    renamed as need be; a symmetric matrix's two indices read in either order)."""
    first, second = step.output
    if any(ranks.get(arg) != 0 for factor in step.scale for arg in node_args(factor)):
        return False

    def operands(mapping: dict[str, str]) -> Counter[tuple[int, tuple[str, ...]]]:
        found: Counter[tuple[int, tuple[str, ...]]] = Counter()
        for arg, labels in zip(step.args, step.operands):
            renamed = tuple(mapping.get(label, label) for label in labels)
            found[(arg, tuple(sorted(renamed)) if arg in symmetric and len(renamed) == 2 else renamed)] += 1
        return found

    summed = sorted({label for labels in step.operands for label in labels} - {first, second})
    if len(summed) > 4:
        return False
    plain = operands({})
    return any(operands({first: second, second: first, **dict(zip(summed, order))}) == plain
               for order in itertools.permutations(summed))


def owned_factorisations(steps: list[Step]) -> list[Step]:
    """A Cholesky factorisation of a matrix that no later step reads, made by the program itself (a product, a sum,
    a diagonal array, read directly or through aliases: a checked or transposed view, a diagonal added in place),
    factorises it in its own memory ("spd_factor_in_place": numpy, real matrices; no copy of the matrix).

    ``steps``: with their :class:`Free` steps (``release``): the matrix and what it views are freed right after."""
    made = {step.out: step for step in steps if not isinstance(step, Free)}
    result = list(steps)
    for k, step in enumerate(steps):
        if not (isinstance(step, Reduce) and step.kind == "spd_factor" and len(step.labels) == 2):
            continue
        freed = steps[k + 1].registers if k + 1 < len(steps) and isinstance(steps[k + 1], Free) else ()
        register: int | None = step.arg
        while register is not None and register in freed:
            producer = made.get(register)
            if isinstance(producer, Elementwise) and isinstance(producer.expr, Arg):
                register = producer.expr.register  # an alias, or a transposed view
            elif isinstance(producer, Diagonal) and producer.base is not None:
                register = producer.base  # added into its base's diagonal (in place where numpy can)
            elif isinstance(producer, Reduce) and producer.kind in (*CHECK_KINDS, "spd_by_factor"):
                register = producer.arg  # a check's value is its matrix
            else:
                fresh = isinstance(producer, Contract) and len(producer.args) > 1 or \
                    isinstance(producer, Diagonal) or isinstance(producer, Elementwise) and \
                    isinstance(producer.expr, Add)
                if fresh:
                    result[k] = replace(step, kind="spd_factor_in_place")
                register = None
    return result
