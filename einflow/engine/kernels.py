"""Contractions compiled for numpy: opt_einsum's pairwise path run as direct BLAS or einsum calls.

opt_einsum's ``ContractExpression`` re-reads every pairwise step's equation on each call and always
multiplies in the axis order its path chose, which can make BLAS transpose both operands. Here each
pairwise step is decided once: which operand goes first, in which order the summed axes are flattened,
and whether an operand is passed as a transposed view, so that the call is ``numpy.dot`` on reshaped
views (no copies when the layouts allow it) and, where they allow it, an untransposed GEMM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from opt_einsum.blas import can_blas

from einflow.engine.dialect import NUMPY, Dialect
from einflow.lang.indices import einsum_equation

__all__ = ["compile_numpy", "contraction_text"]

#: a contraction's pairwise calls nest at most this deep in one expression; deeper intermediates are named
#: (with an identifier no einflow tensor can have: einflow names are ASCII) and computed first
_HOIST_DEPTH = 24

# relative extra cost of a transposed operand in a GEMM, and of copying one element (in units of one
# multiply-add): measured on OpenBLAS, a transposed operand costs 10-15% more; a strided copy ~40 FMAs
_TRANSPOSED = 0.15
_COPY = 40.0


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


def _as_matrix(labels: str, rows: str, columns: str, layout: str, sizes: dict[str, int], vector: bool) -> str:
    """Text turning an operand ``{x}`` with axes ``labels`` into a (rows, columns) matrix (or a vector)."""
    row_count = math.prod(sizes[c] for c in rows)
    column_count = math.prod(sizes[c] for c in columns)
    if vector:  # one side has no free axes: a 1-D operand makes numpy.dot call GEMV
        count = row_count * column_count
        if labels == rows + columns:
            return "{x}" if len(labels) == 1 else f"{{x}}.reshape({count})"
        permutation = tuple(labels.index(c) for c in rows + columns)
        return f"{{x}}.transpose({permutation}).reshape({count})"
    if layout == "N":
        if len(rows) == 1 and len(columns) == 1:
            return "{x}"
        return f"{{x}}.reshape(({row_count}, {column_count}))"
    if layout == "T":
        if len(rows) == 1 and len(columns) == 1:
            return "{x}.T"
        return f"{{x}}.reshape(({column_count}, {row_count})).T"
    permutation = tuple(labels.index(c) for c in rows + columns)
    return f"{{x}}.transpose({permutation}).reshape(({row_count}, {column_count}))"


def _copy_weight(labels: str, order: str, sizes: dict[str, int]) -> float:
    """The cost of copying an array with axes ``labels`` into ``order``, per element, relative to a strided copy:
    numpy copies runs of the axes both orders end with, so a copy that keeps a long last run costs a fraction
    (measured: 1536 complex elements in 3.2 us keeping a run of 16, 8.2 us with none)."""
    run = 1
    for a, b in zip(reversed(labels), reversed(order)):
        if a != b:
            break
        run *= sizes[a]
    return 0.25 + 0.75 / run


def _free_orders(left: str, right: str, first: str, second: str, removed: frozenset[str],
                 wanted: str | None) -> list[tuple[str, str, str]]:
    """The (summed, left free, right free) orders a matrix product may flatten its operands in: each operand's
    own order, and, where the result is asked for in an order (``wanted``), its free axes in that order (an
    operand copied anyway is then copied into the order that leaves the result contiguous, not a transposed
    view its reader copies again)."""
    own = ("".join(c for c in left if c not in removed), "".join(c for c in right if c not in removed))
    frees = [own]
    if wanted is not None and sorted(wanted) == sorted(own[0] + own[1]):
        asked = ("".join(c for c in wanted if c in own[0]), "".join(c for c in wanted if c in own[1]))
        frees += [f for f in ((asked[0], own[1]), (own[0], asked[1]), asked) if f not in frees]
    return [(summed, *free) for summed in dict.fromkeys(("".join(c for c in first if c in removed),
                                                         "".join(c for c in second if c in removed)))
            for free in frees]


def _gemm(first: str, second: str, removed: frozenset[str], wanted: str | None,
          sizes: dict[str, int]) -> tuple[str, str, int]:
    """Plan one pairwise contraction as ``numpy.dot``: (text with ``{0}``/``{1}``, result labels, copies)."""
    best: tuple[tuple[float, float, bool], Any] | None = None
    for order, (left, right) in (((0, 1), (first, second)), ((1, 0), (second, first))):
        for summed, left_free, right_free in _free_orders(left, right, first, second, removed, wanted):
            left_layout = _left_layout(left, left_free, summed)
            right_layout = _right_layout(right, right_free, summed)
            rows = math.prod(sizes[c] for c in left_free)
            columns = math.prod(sizes[c] for c in right_free)
            inner = math.prod(sizes[c] for c in summed)
            cost = float(rows * columns * inner)
            cost *= 1 + _TRANSPOSED * ((left_layout == "T" and bool(left_free))
                                       + (right_layout == "T" and bool(right_free)))
            copied = (rows * inner if left_layout == "copy" else 0) + (inner * columns if right_layout == "copy" else 0)
            cost += _COPY * ((rows * inner * _copy_weight(left, left_free + summed, sizes) if left_layout == "copy"
                              else 0) + (inner * columns * _copy_weight(right, summed + right_free, sizes)
                                         if right_layout == "copy" else 0))
            # on a tie, the copies whose innermost axes are longest (a window's copy reads runs of its last axis),
            # then the asked-for order of the result (a transposed result is free)
            runs = (rows * inner / max(1, sizes.get((left_free + summed)[-1:], 1)) if left_layout == "copy" else 0) + \
                (inner * columns / max(1, sizes.get((summed + right_free)[-1:], 1)) if right_layout == "copy" else 0)
            key = (cost, runs, wanted is not None and left_free + right_free != wanted)
            if best is None or key < best[0]:
                best = (key, (order, left, right, left_free, right_free, summed, left_layout, right_layout, copied))
    assert best is not None
    order, left, right, left_free, right_free, summed, left_layout, right_layout, copied = best[1]
    both_empty = not left_free and not right_free  # a full contraction: (1, K) @ (K, 1) keeps a 0-d result
    prepare_left = _as_matrix(left, left_free, summed, left_layout, sizes, vector=not left_free and not both_empty)
    prepare_right = _as_matrix(right, summed, right_free, right_layout, sizes,
                               vector=not right_free and not both_empty)
    left_slot, right_slot = ("{1}", "{0}") if order == (1, 0) else ("{0}", "{1}")
    text = f"_np.dot({prepare_left.replace('{x}', left_slot)}, {prepare_right.replace('{x}', right_slot)})"
    if len(left_free) > 1 or len(right_free) > 1 or both_empty:
        text += f".reshape({tuple(sizes[c] for c in left_free + right_free)})"
    return text, left_free + right_free, copied


def _batch_layout(labels: str, batch: str, first: str, second: str) -> str:
    """How an operand becomes a stack of (first, second) matrices: as is, transposed views, or by copying."""
    if labels == batch + first + second:
        return "N"
    if labels == batch + second + first:
        return "T"
    return "copy"


def _as_stack(labels: str, batch: str, rows: str, columns: str, layout: str, sizes: dict[str, int]) -> str:
    """Text reshaping an operand ``{x}`` into a (batch, rows, columns) stack of matrices."""
    stack, row_count, column_count = (math.prod(sizes[c] for c in part) for part in (batch, rows, columns))
    if layout == "N":
        return f"{{x}}.reshape(({stack}, {row_count}, {column_count}))"
    if layout == "T":
        return f"{{x}}.reshape(({stack}, {column_count}, {row_count})).transpose(0, 2, 1)"
    permutation = tuple(labels.index(c) for c in batch + rows + columns)
    return f"{{x}}.transpose({permutation}).reshape(({stack}, {row_count}, {column_count}))"


def _batched(first: str, second: str, batch_labels: frozenset[str], removed: frozenset[str], wanted: str | None,
             sizes: dict[str, int]) -> tuple[str, str, int]:
    """A contraction with batch indices (kept, in both operands) as one ``numpy.matmul`` on matrix stacks."""
    best: tuple[tuple[float, float, bool], Any] | None = None
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
                cost += _COPY * ((rows * inner * _copy_weight(left, left_free + summed, sizes) if left_layout == "copy"
                              else 0) + (inner * columns * _copy_weight(right, summed + right_free, sizes)
                                         if right_layout == "copy" else 0))
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
    left_slot, right_slot = ("{1}", "{0}") if order == (1, 0) else ("{0}", "{1}")
    text = (f"_np.matmul({prepare_left.replace('{x}', left_slot)}, {prepare_right.replace('{x}', right_slot)})"
            f".reshape({tuple(sizes[c] for c in labels)})")
    return text, labels, copied


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


def _for_last_step(labels: str, output: str, summed: frozenset[str]) -> str:
    """The axis order for an intermediate that the last pairwise step reads: the indices it keeps, in the output's
    order, then those it sums (a (rows, summed) matrix as it is, for ``numpy.dot``).

    >>> _for_last_step("bjp", "bpk", frozenset("j"))
    'bpj'
    """
    kept = [c for c in output if c in labels]
    rest = [c for c in labels if c not in output and c not in summed]
    return "".join(kept + rest + [c for c in labels if c in summed])


def _ascii_spec(operand_labels: Sequence[str], result: str) -> str:
    """One pairwise step's einsum equation in ASCII letters: a product's own symbols go past numpy's 52
    letters (opt_einsum's ``get_symbol``), but one step touches only the few indices of its operands.

    >>> _ascii_spec(["\u0100b", "b\u0101"], "\u0100\u0101")
    'ab,bc->ac'
    """
    return einsum_equation(operand_labels, result)


def _broadcast(text: str, labels: str, result: str) -> str:
    """``text`` (axes ``labels``) transposed to ``result``'s order, with new axes where it lacks one."""
    if not labels:
        return text
    present = [c for c in result if c in labels]
    if present != list(labels):
        text += f".transpose({tuple(labels.index(c) for c in present)})"
    if len(present) < len(result):
        text += "[" + ", ".join(":" if c in labels else "None" for c in result) + "]"
    return text


def _spelled(template: str, dialect: Dialect, ops_alias: str) -> str:
    """A template's numpy calls in the array module's ``dialect`` (its ``kernel_spelling``)."""
    if dialect.kernel_spelling:
        for numpy_text, torch_text in dialect.kernel_spelling:
            template = template.replace(numpy_text, torch_text)
        template = template.replace("_ops.", ops_alias + ".")
    return template


def contraction_text(equation: str, shapes: Sequence[tuple[int, ...]], contraction_list: Sequence[tuple[Any, ...]],
                     operands: Sequence[str], np_alias: str = "_np", dialect: Dialect = NUMPY,
                     ops_alias: str = "_ops", scale: str | None = None) -> tuple[str, int]:
    """One Python expression computing ``equation`` (explicit ``->`` form) on the operand expressions ``operands``.

    Each pairwise step of opt_einsum's ``contraction_list`` becomes a ``numpy.dot``/``matmul``/``einsum`` call
    (an elementwise product a multiplication), nested so that intermediates are released as soon as the
    next step has read them. ``np_alias`` is the array module; ``dialect=TORCH`` writes the same
    steps for torch tensors: ``matmul`` and ``einsum`` of :mod:`einflow.engine.backends.torch_ops` (``ops_alias``),
    ``permute`` for ``transpose``. ``scale`` (the text multiplying a value: ``" * c"``) multiplies the smallest
    of the operands, the intermediates and the result, the first of them on a tie: one pass over the fewest
    elements (``w[i] t[i] t[p] * (-1)`` scales the dot product, not the vector). Returns the text and the most
    elements the contraction's own intermediates hold at once (the result itself not counted).

    >>> import opt_einsum as oe
    >>> _, info = oe.contract_path("ij,jk,k->i", (2, 3), (3, 4), (4,), shapes=True)
    >>> contraction_text("ij,jk,k->i", [(2, 3), (3, 4), (4,)], info.contraction_list, ["A", "B", "v"])
    ('_np.dot(A, _np.dot(B, v))', 3)
    >>> _, info = oe.contract_path("i,i,p->p", (4,), (4,), (4,), shapes=True)
    >>> contraction_text("i,i,p->p", [(4,), (4,), (4,)], info.contraction_list, ["w", "t", "s"], scale=" * c")
    ('((_np.dot(t.reshape((1, 4)), w.reshape((4, 1))).reshape(()) * c) * s)', 1)
    """
    text, peak, _, _ = contraction_steps(equation, shapes, contraction_list, operands, np_alias, dialect, ops_alias,
                                         scale=scale)
    return text, peak


def contraction_steps(equation: str, shapes: Sequence[tuple[int, ...]], contraction_list: Sequence[tuple[Any, ...]],
                      operands: Sequence[str], np_alias: str = "_np", dialect: Dialect = NUMPY,
                      ops_alias: str = "_ops", in_place: bool = False,
                      scale: str | None = None) -> tuple[str, int, str, bool]:
    """:func:`contraction_text`, the order (letters) the last step computes the result in (the text views it
    in the output's order: a result computed in another order is that order's transposed view), and whether
    the result is an array the text itself made (a matrix product or a multiplication: it may be scaled in
    place). ``in_place`` (torch, operands of one type): an elementwise product with an intermediate of an
    earlier step multiplies that intermediate in place."""
    if scale is None:
        return _contraction_steps(equation, shapes, contraction_list, operands, np_alias, dialect, ops_alias,
                                  in_place, None, None)
    elements: list[int] = []
    _contraction_steps(equation, shapes, contraction_list, operands, np_alias, dialect, ops_alias, in_place,
                       None, elements)
    where = min(range(len(elements)), key=elements.__getitem__)
    text, peak, final, _ = _contraction_steps(equation, shapes, contraction_list, operands, np_alias, dialect,
                                              ops_alias, in_place, (where, scale), None)
    return text, peak, final, False


def _contraction_steps(equation: str, shapes: Sequence[tuple[int, ...]], contraction_list: Sequence[tuple[Any, ...]],
                       operands: Sequence[str], np_alias: str, dialect: Dialect, ops_alias: str, in_place: bool,
                       scale: tuple[int, str] | None, elements: list[int] | None) -> tuple[str, int, str, bool]:
    """:func:`contraction_steps`; ``scale``: (node, multiplying text), the node numbered as ``elements`` lists
    them (the operands, then each pairwise result); ``elements``: filled with each node's element count."""
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for label, size in zip(term, shape):
            if sizes.get(label, 1) == 1:
                sizes[label] = size
    # an axis of size 1 against a longer one broadcasts: only einsum does that
    broadcast = any(size != sizes[label] for term, shape in zip(terms, shapes) for label, size in zip(term, shape))
    # (labels, elements, text, whether the text is an array this contraction made)
    live: list[tuple[str, int, str, bool]] = [(term, 0, text, False) for term, text in zip(terms, operands)]
    depths = [0] * len(live)  # how many pairwise calls each live text nests
    parts: list[str] = []  # the deep intermediates computed first (see _HOIST_DEPTH)
    if elements is not None:
        elements.extend(math.prod(shape) for shape in shapes)
    if scale is not None and scale[0] < len(live):
        term, count, text, _ = live[scale[0]]
        live[scale[0]] = (term, count, f"({text}{scale[1]})", False)
    peak = 0
    live_total = 0  # the elements the live intermediates hold (the operands count 0: they are the caller's)
    for number, contraction in enumerate(contraction_list):
        positions, removed, einsum_text = contraction[0], frozenset(contraction[1]), contraction[2]
        result = einsum_text.split("->")[1]
        taken = [live.pop(position) for position in positions]
        held = sum(count for _, count, _, _ in taken)
        live_total -= held
        depth = 1 + max(depths.pop(position) for position in positions)
        operand_labels = [labels for labels, _, _, _ in taken]
        last = number == len(contraction_list) - 1
        blas = can_blas(operand_labels, result, removed) if len(taken) == 2 and not broadcast else False
        batch = _batch_indices(operand_labels, result, removed) if len(taken) == 2 and not broadcast else None
        copied = 0
        hadamard = (len(taken) == 2 and not removed and not broadcast
                    and all(len(set(labels)) == len(labels) == len(result) and set(labels) == set(result)
                            for labels in operand_labels))
        outer = (len(taken) == 2 and not removed and not broadcast and not hadamard
                 and all(len(set(labels)) == len(labels) and set(labels) <= set(result) for labels in operand_labels)
                 and set(operand_labels[0]) | set(operand_labels[1]) == set(result))
        fresh = True
        if hadamard:  # an elementwise product inside the contraction: a multiplication, not einsum
            first, second = operand_labels
            made = [made_here for _, _, _, made_here in taken]  # new arrays of earlier steps (not operands)
            if in_place and dialect.in_place and any(made):
                if not made[0]:  # multiply the intermediate in place, the other factor in its axis order
                    taken.reverse()
                    operand_labels.reverse()
                    first, second = operand_labels
                template = "{0}.mul_({1})" if first == second else \
                    f"{{0}}.mul_({{1}}.transpose({tuple(second.index(c) for c in first)}))"
            else:
                template = "{0} * {1}" if first == second else \
                    f"{{0}} * {{1}}.transpose({tuple(second.index(c) for c in first)})"
                template = f"({template})"
            labels = first
        elif outer:  # nothing summed (a scalar times an array, an outer product): a broadcast multiplication
            if number == len(contraction_list) - 2 and len(contraction_list[-1][0]) == 2:
                # the last step contracts it: made in the order that step's matrix product reads without a copy
                # (the kept indices in the output's order, then the summed ones)
                result = _for_last_step(result, output, frozenset(contraction_list[-1][1]))
            template = "(" + " * ".join(_broadcast(f"{{{k}}}", labels, result)
                                        for k, labels in enumerate(operand_labels)) + ")"
            labels = result
        elif blas and "EINSUM" not in blas:
            template, labels, copied = _gemm(operand_labels[0], operand_labels[1], removed,
                                             output if last else None, sizes)
        elif batch and (dialect.batched_sums_by_matmul or
                        not all(set(labels) <= batch | removed for labels in operand_labels)):
            # (numpy: an elementwise product summed, nothing kept but batch indices, is one einsum pass below;
            # matmul on 1 x K stacks copies an operand whose summed axes are not last: 18 ms against 0.55 ms
            # for [20,100,4,100] summed over its third axis)
            template, labels, copied = _batched(operand_labels[0], operand_labels[1], batch, removed,
                                                output if last else None, sizes)
        else:
            spec = _ascii_spec(operand_labels, result)
            template = f"_np.einsum({spec!r}, " + ", ".join(f"{{{k}}}" for k in range(len(taken))) + ")"
            labels = result
            fresh = False  # einsum may return a view of its operand ("ii->i")
        template = _spelled(template, dialect, ops_alias)
        text = template.replace("_np.", np_alias + ".").format(*(operand for _, _, operand, _ in taken))
        size_made = math.prod(sizes[c] for c in labels)
        if elements is not None:
            elements.append(size_made)
        if scale is not None and scale[0] == len(terms) + number:
            text, fresh = f"({text}{scale[1]})", False
        in_use = live_total + held + copied
        peak = max(peak, in_use + (size_made if not last else 0))
        if depth >= _HOIST_DEPTH and not last:
            # a long chain of calls nested in one expression overflows Python's parser: the intermediate is
            # bound to a name first and read once, releasing the name as it is read (as a nested call would)
            name = f"_\u03b6{len(parts)}"
            parts.append(f"({name} := {text}) is None")
            text, depth = f"({name}, {name} := None)[0]", 0
        live.append((labels, size_made, text, fresh))
        live_total += size_made
        depths.append(depth)
    final, _, text, fresh = live[0]
    if parts:  # `a or b or ... or result`: flat, and every part is an array (never None), so all run in order
        text = "(" + " or ".join((*parts, text)) + ")"
    if final != output:
        text += _spelled(f".transpose({tuple(final.index(c) for c in output)})", dialect, ops_alias)
    return text, peak, final, fresh


def compile_numpy(equation: str, shapes: Sequence[tuple[int, ...]],
                  contraction_list: Sequence[tuple[Any, ...]], strided: bool = False) -> tuple[Callable[..., Any], int]:
    """Compile ``equation`` (explicit ``->`` form) along opt_einsum's ``contraction_list`` for these shapes.

    Returns the function computing it (generated from :func:`contraction_text`) and the most elements its
    own intermediates hold at once (the result itself not counted). ``strided``: the operands may be blocks
    cut from larger arrays (strided views); matrix products then call ``numpy.matmul``, which hands BLAS a
    strided matrix as it is, where ``numpy.dot`` copies it first.

    >>> import numpy as np
    >>> import opt_einsum as oe
    >>> _, info = oe.contract_path("ij,jk,k->i", (2, 3), (3, 4), (4,), shapes=True)
    >>> contract, peak = compile_numpy("ij,jk,k->i", [(2, 3), (3, 4), (4,)], info.contraction_list)
    >>> a, b, v = np.ones((2, 3)), np.ones((3, 4)), np.arange(4.0)
    >>> contract(a, b, v).tolist(), peak
    ([18.0, 18.0], 3)
    """
    names = [f"_a{k}" for k in range(len(shapes))]
    text, peak = contraction_text(equation, shapes, contraction_list, names)
    if strided:
        text = text.replace("_np.dot(", "_np.matmul(")
    namespace: dict[str, Any] = {"_np": np}
    exec(f"def _contract({', '.join(names)}):\n    return {text}\n", namespace)  # noqa: S102 - generated here
    return namespace["_contract"], peak
