"""Contractions compiled for numpy: opt_einsum's pairwise path run as direct BLAS or einsum calls.

opt_einsum's ``ContractExpression`` re-reads every pairwise step's equation on each call and always
multiplies in the axis order its path chose, which can make BLAS transpose both operands. Here each
pairwise step is decided once: which operand goes first, in which order the summed axes are flattened,
and whether an operand is passed as a transposed view, so that the call is ``numpy.dot`` on reshaped
views (no copies when the layouts allow it) and, where they allow it, an untransposed GEMM.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from opt_einsum.blas import can_blas

__all__ = ["compile_numpy"]

# relative extra cost of a transposed operand in a GEMM, and of copying one element (in units of one
# multiply-add): measured on OpenBLAS, a transposed operand costs 10-15% more; a strided copy ~40 FMAs
_TRANSPOSED = 0.15
_COPY = 40.0

Step = Callable[..., Any]


def _runner(steps: list[tuple[tuple[int, ...], Step]], finish: tuple[int, ...] | None) -> Callable[..., Any]:
    """The fastest call for the common shapes of a plan: one step, or one step and an output transpose."""
    if len(steps) == 1:
        positions, step = steps[0]
        if positions == (1, 0) and finish is None:
            return lambda a, b: step(b, a)
        if positions == (1, 0):
            return lambda a, b: step(b, a).transpose(finish)
        if positions == (0,) and finish is None:
            return step

    def run(*arrays: Any) -> Any:
        operands = list(arrays)
        for positions, one in steps:
            operands.append(one(*[operands.pop(position) for position in positions]))
        result = operands[0]
        return result if finish is None else result.transpose(finish)

    return run


def _left_layout(labels: str, free: str, summed: str) -> str:
    """How an operand becomes the (M, K) left matrix: as is, as a transposed view, or by copying."""
    if labels == free + summed:
        return "N"
    if labels == summed + free:
        return "T"
    return "copy"


def _right_layout(labels: str, free: str, summed: str) -> str:
    """How an operand becomes the (K, N) right matrix."""
    if labels == summed + free:
        return "N"
    if labels == free + summed:
        return "T"
    return "copy"


def _as_matrix(labels: str, rows: str, columns: str, layout: str, sizes: dict[str, int],
               vector: bool) -> Callable[[Any], Any] | None:
    """A function reshaping an operand with axes ``labels`` into a (rows, columns) matrix (or a vector).

    None when the operand already is that matrix (or vector): the step then passes it to BLAS as it is.
    """
    row_count = math.prod(sizes[c] for c in rows)
    column_count = math.prod(sizes[c] for c in columns)
    if vector:  # one side has no free axes: a 1-D operand makes numpy.dot call GEMV
        count = row_count * column_count
        if labels == rows + columns:
            return None if len(labels) == 1 else (lambda x: x.reshape(count))
        permutation = tuple(labels.index(c) for c in rows + columns)
        return lambda x: x.transpose(permutation).reshape(count)
    if layout == "N":
        if len(rows) == 1 and len(columns) == 1:
            return None
        shape = (row_count, column_count)
        return lambda x: x.reshape(shape)
    if layout == "T":
        if len(rows) == 1 and len(columns) == 1:
            return lambda x: x.T
        shape = (column_count, row_count)
        return lambda x: x.reshape(shape).T
    permutation = tuple(labels.index(c) for c in rows + columns)
    shape = (row_count, column_count)
    return lambda x: x.transpose(permutation).reshape(shape)


def _same(x: Any) -> Any:
    return x


def _gemm(first: str, second: str, removed: frozenset[str], wanted: str | None,
          sizes: dict[str, int]) -> tuple[Step, str, int]:
    """Plan one pairwise contraction as ``numpy.dot``; returns (step(first, second), result labels, copies)."""
    best: tuple[float, Any] | None = None
    for order, (left, right) in (((0, 1), (first, second)), ((1, 0), (second, first))):
        for summed in dict.fromkeys(("".join(c for c in first if c in removed),
                                     "".join(c for c in second if c in removed))):
            left_free = "".join(c for c in left if c not in removed)
            right_free = "".join(c for c in right if c not in removed)
            left_layout = _left_layout(left, left_free, summed)
            right_layout = _right_layout(right, right_free, summed)
            rows = math.prod(sizes[c] for c in left_free)
            columns = math.prod(sizes[c] for c in right_free)
            inner = math.prod(sizes[c] for c in summed)
            cost = float(rows * columns * inner)
            cost *= 1 + _TRANSPOSED * ((left_layout == "T" and bool(left_free))
                                       + (right_layout == "T" and bool(right_free)))
            copied = (rows * inner if left_layout == "copy" else 0) + (inner * columns if right_layout == "copy" else 0)
            cost += _COPY * copied
            if wanted is not None and left_free + right_free != wanted:
                cost += 1  # a transposed result is free, but prefer the asked-for order on a tie
            if best is None or cost < best[0]:
                best = (cost, (order, left, right, left_free, right_free, summed, left_layout, right_layout,
                               copied))
    assert best is not None
    order, left, right, left_free, right_free, summed, left_layout, right_layout, copied = best[1]
    both_empty = not left_free and not right_free  # a full contraction: (1, K) @ (K, 1) keeps a 0-d result
    prepare_left = _as_matrix(left, left_free, summed, left_layout, sizes, vector=not left_free and not both_empty)
    prepare_right = _as_matrix(right, summed, right_free, right_layout, sizes,
                               vector=not right_free and not both_empty)
    result_shape = tuple(sizes[c] for c in left_free + right_free)
    reshaped = len(left_free) > 1 or len(right_free) > 1 or both_empty
    dot = np.dot
    swapped = order == (1, 0)
    if prepare_left is None and prepare_right is None and not reshaped:
        # already a matrix/vector pair: the step is numpy.dot itself
        if swapped:
            def step(x: Any, y: Any) -> Any:
                return dot(y, x)
        else:
            step = dot
        return step, left_free + right_free, copied
    prepare_left = prepare_left or _same
    prepare_right = prepare_right or _same

    # the step takes (first, second) in the caller's order; ``swapped`` puts ``second`` on the left
    if reshaped and swapped:
        def step(x: Any, y: Any) -> Any:
            return dot(prepare_left(y), prepare_right(x)).reshape(result_shape)
    elif reshaped:
        def step(x: Any, y: Any) -> Any:
            return dot(prepare_left(x), prepare_right(y)).reshape(result_shape)
    elif swapped:
        def step(x: Any, y: Any) -> Any:
            return dot(prepare_left(y), prepare_right(x))
    else:
        def step(x: Any, y: Any) -> Any:
            return dot(prepare_left(x), prepare_right(y))

    return step, left_free + right_free, copied


def _batch_layout(labels: str, batch: str, first: str, second: str) -> str:
    """How an operand becomes a stack of (first, second) matrices: as is, transposed views, or by copying."""
    if labels == batch + first + second:
        return "N"
    if labels == batch + second + first:
        return "T"
    return "copy"


def _as_stack(labels: str, batch: str, rows: str, columns: str, layout: str,
              sizes: dict[str, int]) -> Callable[[Any], Any]:
    """A function reshaping an operand into a (batch, rows, columns) stack of matrices."""
    stack, row_count, column_count = (math.prod(sizes[c] for c in part) for part in (batch, rows, columns))
    if layout == "N":
        shape = (stack, row_count, column_count)
        return lambda x: x.reshape(shape)
    if layout == "T":
        shape = (stack, column_count, row_count)
        return lambda x: x.reshape(shape).transpose(0, 2, 1)
    permutation = tuple(labels.index(c) for c in batch + rows + columns)
    shape = (stack, row_count, column_count)
    return lambda x: x.transpose(permutation).reshape(shape)


def _batched(first: str, second: str, batch_labels: frozenset[str], removed: frozenset[str], wanted: str | None,
             sizes: dict[str, int]) -> tuple[Step, str, int]:
    """A contraction with batch indices (kept, in both operands) as one ``numpy.matmul`` on matrix stacks."""
    best: tuple[float, Any] | None = None
    for order, (left, right) in (((0, 1), (first, second)), ((1, 0), (second, first))):
        for batch in dict.fromkeys("".join(c for c in term if c in batch_labels) for term in (first, second)):
            for summed in dict.fromkeys("".join(c for c in term if c in removed) for term in (first, second)):
                left_free = "".join(c for c in left if c not in removed and c not in batch_labels)
                right_free = "".join(c for c in right if c not in removed and c not in batch_labels)
                left_layout = _batch_layout(left, batch, left_free, summed)
                right_layout = _batch_layout(right, batch, summed, right_free)
                stack, rows, columns, inner = (math.prod(sizes[c] for c in part)
                                               for part in (batch, left_free, right_free, summed))
                cost = float(stack * rows * columns * inner)
                cost *= 1 + _TRANSPOSED * ((left_layout == "T") + (right_layout == "T"))
                copied = stack * ((rows * inner if left_layout == "copy" else 0)
                                  + (inner * columns if right_layout == "copy" else 0))
                cost += _COPY * copied
                if wanted is not None and batch + left_free + right_free != wanted:
                    cost += 1
                if best is None or cost < best[0]:
                    best = (cost, (order, left, right, batch, left_free, right_free, summed, left_layout,
                                   right_layout, copied))
    assert best is not None
    order, left, right, batch, left_free, right_free, summed, left_layout, right_layout, copied = best[1]
    prepare_left = _as_stack(left, batch, left_free, summed, left_layout, sizes)
    prepare_right = _as_stack(right, batch, summed, right_free, right_layout, sizes)
    labels = batch + left_free + right_free
    shape = tuple(sizes[c] for c in labels)
    matmul = np.matmul
    if order == (1, 0):
        def step(x: Any, y: Any) -> Any:
            return matmul(prepare_left(y), prepare_right(x)).reshape(shape)
    else:
        def step(x: Any, y: Any) -> Any:
            return matmul(prepare_left(x), prepare_right(y)).reshape(shape)
    return step, labels, copied


def _batch_indices(labels: list[str], result: str, removed: frozenset[str]) -> frozenset[str]:
    """The batch indices of a two-operand step that matmul stacks can compute, or an empty set.

    Each index must be summed (in both), kept in both (batch) or kept in one: no repeated index, none
    summed inside one operand, and something must be summed (else it is an elementwise product).
    """
    first, second = labels
    if len(set(first)) != len(first) or len(set(second)) != len(second) or not removed:
        return frozenset()
    batch = set(first) & set(second) & set(result)
    for c in set(first) ^ set(second):
        if c not in result:
            return frozenset()
    if not removed <= set(first) & set(second):
        return frozenset()
    return frozenset(batch)


def compile_numpy(equation: str, shapes: Sequence[tuple[int, ...]],
                  contraction_list: Sequence[tuple[Any, ...]]) -> tuple[Callable[..., Any], int]:
    """Compile ``equation`` (explicit ``->`` form) along opt_einsum's ``contraction_list`` for these shapes.

    Returns the function computing it and the most elements its own intermediates hold at once (the
    result itself not counted).

    >>> import numpy as np
    >>> import opt_einsum as oe
    >>> _, info = oe.contract_path("ij,jk,k->i", (2, 3), (3, 4), (4,), shapes=True)
    >>> contract, peak = compile_numpy("ij,jk,k->i", [(2, 3), (3, 4), (4,)], info.contraction_list)
    >>> a, b, v = np.ones((2, 3)), np.ones((3, 4)), np.arange(4.0)
    >>> contract(a, b, v).tolist(), peak
    ([18.0, 18.0], 3)
    """
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for label, size in zip(term, shape):
            if sizes.get(label, 1) == 1:
                sizes[label] = size
    # an axis of size 1 against a longer one broadcasts: only einsum does that
    broadcast = any(size != sizes[label] for term, shape in zip(terms, shapes) for label, size in zip(term, shape))
    live: list[tuple[str, int]] = [(term, 0) for term in terms]  # labels, elements if an intermediate
    steps: list[tuple[tuple[int, ...], Step]] = []
    peak = 0
    for number, contraction in enumerate(contraction_list):
        positions, removed, einsum_text = contraction[0], frozenset(contraction[1]), contraction[2]
        result = einsum_text.split("->")[1]
        taken = [live.pop(position) for position in positions]
        operand_labels = [labels for labels, _ in taken]
        last = number == len(contraction_list) - 1
        blas = can_blas(operand_labels, result, removed) if len(taken) == 2 and not broadcast else False
        batch = _batch_indices(operand_labels, result, removed) if len(taken) == 2 and not broadcast else None
        copied = 0
        if blas and "EINSUM" not in blas:
            step, labels, copied = _gemm(operand_labels[0], operand_labels[1], removed,
                                         output if last else None, sizes)
        elif batch:
            step, labels, copied = _batched(operand_labels[0], operand_labels[1], batch, removed,
                                            output if last else None, sizes)
        else:
            text = ",".join(operand_labels) + "->" + result
            step = functools.partial(np.einsum, text)
            labels = result
        steps.append((tuple(positions), step))
        elements = math.prod(sizes[c] for c in labels)
        in_use = sum(count for _, count in live) + sum(count for _, count in taken) + copied
        peak = max(peak, in_use + (elements if not last else 0))
        live.append((labels, elements))
    final = live[0][0]
    finish = None if final == output else tuple(final.index(c) for c in output)
    return _runner(steps, finish), peak
