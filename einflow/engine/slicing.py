"""Slicing a contraction that does not fit: which indices to cut into blocks, and the slices to loop over.

A contraction planned pairwise along a path builds intermediates; when they (with the result) would exceed
the memory limit, the same path is run once per *slice*: a block of some indices' values. Slicing a summed
index adds the slices' results up; slicing a kept index writes each slice's result into its block of the
output. Steps of the path that do not carry a sliced index are repeated in every slice, which is the
FLOP overhead of slicing.

:func:`choose_slicing` picks the indices greedily over the path's own pairwise steps: at each round it
halves the block of the index whose halving cuts the per-slice peak most for the least extra FLOPs (the
ratio of the logarithms), until the peak fits the budget. Blocks need not divide the index: the last block
of an index is shorter, and each distinct combination of block shapes gets its own compiled kernel.

>>> import opt_einsum as oe
>>> _, info = oe.contract_path("ik,kj->ij", (1000, 4000), (4000, 1000), shapes=True)
>>> plan = choose_slicing("ik,kj->ij", [(1000, 4000), (4000, 1000)], info.contraction_list, budget=300_000)
>>> plan.labels, plan.counts, plan.slices, round(plan.overhead, 2)
(('i',), (4,), 4, 1.0)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opt_einsum.helpers import flop_count

from einflow.engine.kernels import compile_numpy, contraction_text

__all__ = ["Slicing", "SliceKernel", "choose_slicing", "slice_peak", "slice_ranges", "slice_table", "window_block",
           "scatter_chunks", "window_chunks",
           "SCATTER_CHUNK_BYTES"]


@dataclass(frozen=True)
class Slicing:
    """How a contraction is sliced: ``counts[k]`` blocks of index ``labels[k]`` (each ``blocks[k]`` long at most).

    ``peak`` is the elements one slice keeps alive besides the full output (its intermediates, its own result
    and copies of its operand blocks); ``flops`` counts all slices together, ``unsliced_flops`` the contraction
    run whole.
    """

    labels: tuple[str, ...]
    counts: tuple[int, ...]
    blocks: tuple[int, ...]
    flops: int
    unsliced_flops: int
    peak: int
    unsliced_peak: int
    #: elements of the largest intermediate of one slice (its result included)
    largest: int
    #: whether a summed index is sliced (slices are added up, not written side by side)
    accumulates: bool

    @property
    def slices(self) -> int:
        return math.prod(self.counts)

    @property
    def overhead(self) -> float:
        """FLOPs of all slices over the FLOPs of the contraction run whole (1.0: no extra work)."""
        return self.flops / self.unsliced_flops if self.unsliced_flops else 1.0


def _sizes(terms: Sequence[str], shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for label, size in zip(term, shape):
            if sizes.get(label, 1) == 1:
                sizes[label] = size
    return sizes


def _cost(contraction_list: Sequence[tuple[Any, ...]], sizes: dict[str, int], counts: dict[str, int]) -> int:
    """FLOPs of all slices together: a pairwise step is repeated once per block of each sliced index it lacks."""
    total = 0
    for contraction in contraction_list:
        labels = set(contraction[2].split("->")[0].replace(",", ""))
        repeats = math.prod(count for label, count in counts.items() if label not in labels)
        total += flop_count(labels, bool(contraction[1]), len(contraction[0]), sizes) * repeats
    return total


def sliced_shapes(terms: Sequence[str], shapes: Sequence[tuple[int, ...]],
                  blocks: dict[str, int]) -> list[tuple[int, ...]]:
    """Operand shapes with each sliced index cut to its block (an axis of size 1 that broadcasts stays 1)."""
    return [tuple(size if size == 1 or label not in blocks else min(size, blocks[label])
                  for label, size in zip(term, shape)) for term, shape in zip(terms, shapes)]


def _peak(equation: str, shapes: Sequence[tuple[int, ...]], contraction_list: Sequence[tuple[Any, ...]],
          blocks: dict[str, int], holds_operands: bool = False,
          made: Sequence[float] = (), strided: Sequence[bool] = ()) -> tuple[int, int]:
    """Elements one slice keeps alive: its intermediates and its result, and that plus copies of the operand
    blocks it cuts (a cut operand may need a copy to be reshaped into a matrix). ``made[k]`` (when non-zero):
    operand k's block is made for each slice (a gathered window), ``made[k]`` elements per element of it;
    ``strided[k]``: operand k is a strided window whose elements overlap, copied whole by the kernel."""
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    cut = sliced_shapes(terms, shapes, blocks)
    text, internal = contraction_text(equation, cut, contraction_list, [f"_a{k}" for k in range(len(terms))])
    sizes = _sizes(terms, cut)
    result = math.prod(sizes[label] for label in output)
    weights = list(made) + [0.0] * (len(terms) - len(made))
    # a made block, with its copy when the kernel flattens its axes (it is laid out in its own index order)
    built = math.ceil(sum(weight * math.prod(shape) + (math.prod(shape) if len(term) > 2 else 0)
                          for term, shape, weight in zip(terms, cut, weights) if weight))
    # a block cut from a leading axis, or from a matrix (the kernel's matmul hands BLAS strided rows), is a view;
    # a block cut from an inner axis of a higher-rank operand is copied when the kernel flattens its axes
    # (a strided window the kernel transposes is copied by the pairwise step, counted in ``internal``)
    overlapping = [bool(view) and f"_a{k}.transpose(" not in text
                   for k, view in enumerate(list(strided) + [False] * (len(terms) - len(strided)))]
    copies = sum(math.prod(shape) for term, shape, weight, view in zip(terms, cut, weights, overlapping)
                 if not weight and (holds_operands or view or len(term) > 2 and any(label in blocks
                                                                                     for label in term[1:])))
    return internal + result + built, internal + result + built + copies


def slice_peak(equation: str, shapes: Sequence[tuple[int, ...]], contraction_list: Sequence[tuple[Any, ...]],
                holds_operands: bool = False) -> int:
    """Elements the contraction keeps alive run whole (with its operands when ``holds_operands``)."""
    return _peak(equation, shapes, contraction_list, {}, holds_operands)[1]


def choose_slicing(equation: str, shapes: Sequence[tuple[int, ...]], contraction_list: Sequence[tuple[Any, ...]],
                   budget: float, holds_operands: bool = False, max_slices: int = 1 << 16,
                   made: Sequence[float] = (), strided: Sequence[bool] = ()) -> Slicing | None:
    """The slicing whose per-slice peak (elements, see :class:`Slicing`) fits ``budget``, or None if none fits.

    Blocks are halved one index at a time, choosing the index that lowers the per-slice peak the most for
    the least FLOP overhead; an index of size 1 cannot be cut. The path (``contraction_list``) stays fixed.
    ``holds_operands``: a slice also holds its blocks of every operand (a dask task does); a slicing into more
    than ``max_slices`` slices does not count as fitting. ``made``: the operands whose blocks each slice makes
    and the strided windows copied whole (see :func:`_peak`).
    """
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    sizes = _sizes(terms, shapes)
    unsliced_flops = _cost(contraction_list, sizes, {})
    unsliced_peak = _peak(equation, shapes, contraction_list, {}, holds_operands, made, strided)[1]
    counts: dict[str, int] = {}

    def measure(trial: dict[str, int]) -> tuple[int, int, int]:
        blocks = {label: -(-sizes[label] // count) for label, count in trial.items()}
        peak, with_copies = _peak(equation, shapes, contraction_list, blocks, holds_operands, made, strided)
        flops = _cost(contraction_list, sizes, trial)
        return peak, with_copies, flops

    # progress is judged without the copies (the first cut of an operand adds one), the fit with them
    peak, with_copies = _peak(equation, shapes, contraction_list, {}, holds_operands, made, strided)
    flops = unsliced_flops
    while with_copies > budget:
        best: tuple[int, float, int, dict[str, int], int, int] | None = None
        for label in sizes:
            block = -(-sizes[label] // counts.get(label, 1))
            if block <= 1:
                continue
            count = -(-sizes[label] // -(-block // 2))  # blocks of half the length
            trial = {**counts, label: count}
            if math.prod(trial.values()) > max_slices:
                continue
            new_peak, new_with_copies, new_flops = measure(trial)
            # a cut that lowers the measure of fit first; one that lowers the peak only at the price of a copy after
            if new_with_copies < with_copies:
                rank, gain = 0, math.log(with_copies / max(new_with_copies, 1))
            elif new_peak < peak:
                rank, gain = 1, math.log(peak / max(new_peak, 1))
            else:
                continue
            score = math.log(max(new_flops, 1) / max(flops, 1)) / gain
            if best is None or (rank, score, new_with_copies) < best[:3]:
                best = (rank, score, new_with_copies, trial, new_peak, new_flops)
        if best is None:
            return None
        _, _, with_copies, counts, peak, flops = best
    labels = tuple(label for label in sizes if counts.get(label, 1) > 1)
    blocks = {**sizes, **{label: -(-sizes[label] // counts[label]) for label in labels}}
    largest = max((math.prod(blocks[c] for c in contraction[2].split("->")[1]) for contraction in contraction_list),
                  default=0)
    return Slicing(labels, tuple(counts[label] for label in labels), tuple(blocks[label] for label in labels), flops,
                   unsliced_flops, with_copies, unsliced_peak, largest, any(label not in output for label in labels))


def slice_ranges(size: int, count: int) -> list[tuple[int, int]]:
    """``count`` consecutive blocks covering ``range(size)``, all as long as the first but the last.

    >>> slice_ranges(10, 3)
    [(0, 4), (4, 8), (8, 10)]
    """
    block = -(-size // count)
    return [(start, min(start + block, size)) for start in range(0, size, block)]


def slice_table(equation: str, shapes: Sequence[tuple[int, ...]],
                slicing: Slicing) -> list[tuple[tuple[Any, ...], tuple[tuple[Any, ...], ...], tuple[Any, ...]]]:
    """Each slice as (output index, operand indices, the operands' block shapes): what the generated loop reads.

    Operand and output indices are tuples of ``slice`` objects (a broadcast axis of size 1 is not cut).
    """
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    sizes = _sizes(terms, shapes)
    ranges = [slice_ranges(sizes[label], count) for label, count in zip(slicing.labels, slicing.counts)]
    table = []
    for choice in itertools.product(*ranges):
        bounds = dict(zip(slicing.labels, choice))
        operand_index = tuple(tuple(slice(*bounds[label]) if label in bounds and size != 1 else slice(None)
                                    for label, size in zip(term, shape)) for term, shape in zip(terms, shapes))
        shapes_here = tuple(tuple(bounds[label][1] - bounds[label][0] if label in bounds and size != 1 else size
                                  for label, size in zip(term, shape)) for term, shape in zip(terms, shapes))
        output_index = tuple(slice(*bounds[label]) if label in bounds else slice(None) for label in output)
        table.append((output_index, operand_index, shapes_here))
    return table


class SliceKernel:
    """The numpy function contracting one block shape of a sliced contraction, compiled on first use.

    It pickles as its plain data (equation, block shapes, pairwise steps), so a dask task carries a few
    hundred bytes, not a function; each process compiles it once.
    """

    def __init__(self, equation: str, shapes: Sequence[tuple[int, ...]], contraction_list: Sequence[tuple[Any, ...]]):
        self.equation = equation
        self.shapes = tuple(tuple(shape) for shape in shapes)
        self.steps = tuple((tuple(c[0]), frozenset(c[1]), c[2], None, c[4]) for c in contraction_list)
        self._function: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"equation": self.equation, "shapes": self.shapes, "steps": self.steps}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _function=None)

    def __call__(self, *operands: Any) -> Any:
        if self._function is None:
            self._function = compile_numpy(self.equation, self.shapes, self.steps, strided=True)[0]
        return self._function(*operands)


def window_block(kernel: Any, array: Any, spec: Any, index: tuple[slice, ...], *gathers: Any) -> Any:
    """The block ``index`` (a slice per axis of the window) of a gathered window (``einflow.engine.affine``'s
    ``WindowSpec``), made by ``kernel`` from the blocks of its position tensors alone: a sliced contraction
    reading it never holds the whole window.

    >>> import numpy as np
    >>> from einflow.engine.affine import window_numpy, window_spec
    >>> spec = window_spec(("b", "d"), (4, 3), (5, 3), (("gather", 0, (0,)), ("affine", ((1, 1),), 0)), ((4,),))
    >>> E, t = np.arange(15.0).reshape(5, 3), np.array([4, 0, 2, 2])
    >>> window_block(window_numpy, E, spec, (slice(1, 3), slice(None)), t)
    array([[0., 1., 2.],
           [6., 7., 8.]])
    """
    shape, pads, positions, name, mode = spec
    starts = [0 if part.start is None else part.start for part in index]
    sizes = tuple(len(range(*part.indices(size))) for part, size in zip(index, shape))
    moved: list[Any] = []
    taken: list[Any] = list(gathers)
    for position in positions:
        if position[0] == "affine":
            _, terms, offset = position
            moved.append(("affine", terms, offset + sum(c * starts[label] for label, c in terms)))
        else:
            _, k, axes, length = position
            taken[k] = gathers[k][tuple(index[axis] for axis in axes)]
            moved.append(position)
    return kernel(array, (sizes, pads, tuple(moved), name, mode), *taken)


#: bytes a chunked scatter-add (:func:`scatter_chunks`) allocates per element of a chunk besides its value's
#: copy: int64 flat positions, the product building them, the mask and the positions kept
SCATTER_CHUNK_BYTES = 8 + 8 + 1 + 8


def scatter_chunks(value: Any, spec: Any, rows: int, *gathers: Any) -> Any:
    """A scatter-add (``einflow.engine.affine``'s ``ScatterSpec``) computed ``rows`` values of the value's first
    axis at a time, each chunk's positions made and added (``add.at``) into the one zeroed result: the
    temporaries of a chunk (:data:`SCATTER_CHUNK_BYTES` an element, and its flat copy) instead of the whole's.

    >>> import numpy as np
    >>> from einflow.engine.affine import scatter_numpy
    >>> spec = ((4,), (3, 2), (("affine", ((0, 1), (1, 1)), 0),), "x")
    >>> scatter_chunks(np.ones((3, 2)), spec, 1), scatter_numpy(np.ones((3, 2)), spec)
    (array([1., 2., 2., 1.]), array([1., 2., 2., 1.]))
    """
    import numpy as np

    from einflow.engine.affine import _scatter_positions

    out_shape, value_shape, positions, name = spec
    out = np.zeros(math.prod(out_shape), dtype=value.dtype)
    for start in range(0, value_shape[0], rows):
        stop = min(start + rows, value_shape[0])
        moved: list[Any] = []
        taken = list(gathers)
        for position in positions:
            if position[0] == "plain":  # along the chunked axis: shifted by the chunk's start
                moved.append(("affine", ((0, 1),), start) if position[1] == 0 else position)
            elif position[0] == "affine":
                moved.append(("affine", position[1], position[2] + sum(c * start for a, c in position[1] if not a),
                              *position[3:]))  # (a fold's mode, if any, stays)
            else:
                _, k, axes, _ = position
                taken[k] = gathers[k][tuple(slice(start, stop) if not a else slice(None) for a in axes)]
                moved.append(position)
        part = value[start:stop]
        flat, inside = _scatter_positions(np, (out_shape, tuple(part.shape), tuple(moved), name), tuple(taken))
        flat = np.broadcast_to(flat, part.shape).reshape(-1)
        weights = part.reshape(-1)
        if inside is not None:
            keep = np.broadcast_to(inside, part.shape).reshape(-1)
            flat, weights = flat[keep], weights[keep]
        np.add.at(out, flat, weights)
    return out.reshape(out_shape)


def window_chunks(kernel: Any, array: Any, spec: Any, rows: int, *gathers: Any) -> Any:
    """A gathered window taken ``rows`` rows of its first axis at a time into its result (each block's positions
    alone exist at once, not the whole window's).

    >>> import numpy as np
    >>> from einflow.engine.affine import window_numpy, window_spec
    >>> spec = window_spec(("b", "d"), (3, 2), (4, 2), (("gather", 0, (0,)), ("affine", ((1, 1),), 0)), ((3,),))
    >>> window_chunks(window_numpy, np.arange(8.0).reshape(4, 2), spec, 2, np.array([3, 0, 3]))
    array([[6., 7.],
           [0., 1.],
           [6., 7.]])
    """
    import numpy as np

    shape = spec[0]
    out = np.empty(shape, dtype=array.dtype)
    rest = (slice(None),) * (len(shape) - 1)
    for start in range(0, shape[0], rows):
        out[start:start + rows] = window_block(kernel, array, spec, (slice(start, min(start + rows, shape[0])),
                                                                     *rest), *gathers)
    return out
