"""Contraction paths: which pairwise order each product runs in, chosen once per (equation, shapes, optimize).

Every place in einflow that orders a contraction asks :func:`choose_path`. With ``optimize="auto"`` (the
default) a product of at most :data:`EXACT_OPERANDS` operands takes opt_einsum's exhaustive choice
(``'optimal'`` up to 4 operands, ``'branch-all'`` up to 6, or ``'greedy'`` where that is cheaper: 'optimal'
misses some orders when operands repeat an index set), which costs microseconds. A larger product first
takes opt_einsum's fast heuristic (``'branch-2'``, ``'branch-1'``, then ``'greedy'`` above 14 operands); when
that path costs at least :data:`SEARCH_FLOPS`, a search runs and the cheapest of the candidates wins:

* with cotengra installed (the ``networks`` extra), :func:`einflow.lang.trees.searched`: cotengra's
  ``HyperOptimizer`` at its defaults (greedy and label-propagation trees, tuned by its hyper-parameter
  search, each trial's tree reconfigured by exact subtree re-solving), minimising FLOPs, seeded, for a
  number of trials fixed by the operand count (``einflow.lang.trees.hyper_trials``: 32 for 16 operands,
  22 for 36, 8 for 100, 4 for 200), its tree as it is and with its subtrees of up to 8 leaves re-solved
  exactly, and the fast path re-solved the same way (``REFINE_PASSES`` passes each). It has no clock: a
  product gets the same path on any machine, and a gradient's split tree (einflow/derive/tree.py),
  searched the same way, is the forward's path when its sizes are the same. Its time is the trials'
  (about 0.05 s a trial for 36 tensors, 0.3 s for 100, 1-2 s for 200 on an idle core: seconds);
* without it, a seeded random-greedy search (opt_einsum's ``RandomGreedy`` with private generators, FLOPs,
  :data:`SEARCH_MIN_TRIALS` to :data:`SEARCH_REPEATS` trials, :data:`SEARCH_REPEATS_LARGE` for the large
  ones) whose path's subtrees are re-solved exactly (:mod:`einflow.lang.trees`), and the fast path re-solved
  the same way, within a time budget that grows with the work at stake (``flops / SEARCH_RATE`` seconds,
  between :data:`SEARCH_SECONDS_MIN` and :data:`SEARCH_SECONDS_MAX`; up to :data:`SEARCH_SECONDS_LARGE`
  for paths of :data:`SEARCH_LARGE_FLOPS` and more). The minimum trials and one refinement pass of each
  tree run even past the budget, so that a loaded machine gets the same quality.

Any other ``optimize=`` value (an opt_einsum algorithm's name, ``True``/``False``, a ``PathOptimizer``, an
explicit path) is opt_einsum's, unchanged.

Paths are cached by (equation, shapes, optimize) when ``optimize`` is a name or an explicit path, so a
second plan of the same product costs a dictionary look-up. docs/benchmarks.md ("Large networks") compares
the default with opt_einsum's ``'dp'`` and cotengra's hyper-optimiser on grids, rings, MPS and random
regular graphs.

>>> path, info, choice = choose_path("ij,jk,k->i", [(20, 30), (30, 40), (40,)])
>>> path
[(1, 2), (0, 1)]
>>> choice.optimizer
'optimal'
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import opt_einsum as oe

from einflow.lang.trees import PrivateRandomGreedy, refine, searched, tree_flops

__all__ = ["PathChoice", "choose_path", "EXACT_OPERANDS", "SEARCH_FLOPS", "SEARCH_REPEATS", "SEARCH_RATE",
           "SEARCH_SECONDS_MIN", "SEARCH_SECONDS_MAX", "SEARCH_LARGE_FLOPS", "SEARCH_SECONDS_LARGE",
           "SEARCH_REPEATS_LARGE", "SEARCH_MIN_TRIALS", "fast_choice"]

#: products of at most this many operands take opt_einsum's exhaustive path ('optimal', 'branch-all')
EXACT_OPERANDS = 6
#: a larger product whose fast path costs fewer FLOPs than this keeps it (it runs in well under a millisecond)
SEARCH_FLOPS = 1e6
#: random-greedy trials of the search (seeded by trial number: the same trials find the same path): at
#: most SEARCH_REPEATS within the budget, at least SEARCH_MIN_TRIALS whatever the time
SEARCH_REPEATS = 32
SEARCH_MIN_TRIALS = 8
#: the search's time budget is the fast path's FLOPs divided by this rate, clamped to the bounds below
SEARCH_RATE = 1e7
SEARCH_SECONDS_MIN = 0.25
SEARCH_SECONDS_MAX = 1.0
#: a path costing at least this many FLOPs (minutes of compute and more: a 200-node random regular graph)
#: may search for up to SEARCH_SECONDS_LARGE, with up to SEARCH_REPEATS_LARGE trials, instead
SEARCH_LARGE_FLOPS = 1e12
SEARCH_SECONDS_LARGE = 4.0
SEARCH_REPEATS_LARGE = 256


@dataclass(frozen=True)
class PathChoice:
    """How a product's path was chosen: the optimizer that found it, the seconds spent, what it beat.

    ``alternative`` is the fast path's optimizer and FLOPs when a search replaced it (else None).
    """

    optimizer: str
    seconds: float
    flops: int
    alternative: tuple[str, int] | None = None

    def describe(self) -> str:
        """One line for the plan report, e.g. ``path: random-greedy in 0.12 s (greedy: 10.7x the FLOPs)``."""
        text = f"path: {self.optimizer} in {self.seconds:.3g} s"
        if self.alternative is not None:
            name, flops = self.alternative
            text += f" ({name}: {flops / max(self.flops, 1):.3g}x the FLOPs)"
        return text


def fast_choice(operands: int) -> str:
    """The opt_einsum algorithm that opt_einsum's ``'auto'`` uses for ``operands`` operands."""
    if operands <= 4:
        return "optimal"
    if operands <= 6:
        return "branch-all"
    if operands <= 8:
        return "branch-2"
    return "branch-1" if operands <= 14 else "greedy"


def _budget(flops: float) -> float:
    most = SEARCH_SECONDS_LARGE if flops >= SEARCH_LARGE_FLOPS else SEARCH_SECONDS_MAX
    return min(most, max(SEARCH_SECONDS_MIN, flops / SEARCH_RATE))


def _sizes(equation: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[list[str], str, dict[str, int]]:
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for letter, size in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), size)
    return terms, output, sizes


def _auto(equation: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[Any, Any, PathChoice]:
    start = time.perf_counter()
    name = fast_choice(len(shapes))
    path, info = oe.contract_path(equation, *shapes, shapes=True, optimize=name)
    flops = int(info.opt_cost)
    if len(shapes) <= EXACT_OPERANDS:
        # opt_einsum's 'optimal' can miss the best order when operands repeat an index set: for
        # ``is,i,i,iv->sv`` it forms the 3-index ``isv`` (1.5x the FLOPs) where greedy multiplies the two
        # vectors first; greedy costs tens of microseconds, and the cheaper path wins
        greedy_path, greedy_info = oe.contract_path(equation, *shapes, shapes=True, optimize="greedy")
        if int(greedy_info.opt_cost) < flops:
            return greedy_path, greedy_info, PathChoice("greedy", time.perf_counter() - start,
                                                        int(greedy_info.opt_cost), (name, flops))
        return path, info, PathChoice(name, time.perf_counter() - start, flops)
    if flops < SEARCH_FLOPS:
        return path, info, PathChoice(name, time.perf_counter() - start, flops)
    terms, output, sizes = _sizes(equation, shapes)
    candidates = [(flops, 0, path, name)]
    found = searched(terms, output, sizes, path, name)
    if found is not None:
        # cotengra's tree, it refined, the fast path refined: no clock, so that a gradient's split tree
        # (einflow/derive/tree.py), searched the same way, is this path when the sizes are the same
        candidates += found
    else:
        budget = _budget(flops)
        # random-greedy's best, it refined, and the fast path refined. At least SEARCH_MIN_TRIALS trials and
        # one refinement pass each run whatever the clock says, so the result does not hinge on the
        # machine's load; the rest stops at the budget.
        search = PrivateRandomGreedy(max_repeats=SEARCH_MIN_TRIALS, minimize="flops")  # global random untouched
        greedy = search([set(term) for term in terms], set(output), sizes)
        left = start + budget / 3 - time.perf_counter()
        repeats = SEARCH_REPEATS_LARGE if flops >= SEARCH_LARGE_FLOPS else SEARCH_REPEATS
        if left > 0 and repeats > SEARCH_MIN_TRIALS:
            search.max_repeats, search.max_time = repeats - SEARCH_MIN_TRIALS, left
            greedy = search([set(term) for term in terms], set(output), sizes)
        trials = f"random-greedy ({len(search.costs)} trials)"
        candidates.append((tree_flops(terms, output, sizes, greedy), 1, greedy, trials))
        refined = refine(terms, output, sizes, greedy, deadline=start + 2 * budget / 3)
        candidates.append((tree_flops(terms, output, sizes, refined), 2, refined,
                           f"{trials} + subtree refinement"))
        refined = refine(terms, output, sizes, path, deadline=start + budget)
        candidates.append((tree_flops(terms, output, sizes, refined), 3, refined, f"{name} + subtree refinement"))
    best, _, best_path, best_name = min(candidates)
    if best >= flops:
        return path, info, PathChoice(f"{name} (searched: found no cheaper path)", time.perf_counter() - start,
                                      flops)
    best_path, best_info = oe.contract_path(equation, *shapes, shapes=True, optimize=best_path)
    return best_path, best_info, PathChoice(best_name, time.perf_counter() - start, int(best_info.opt_cost),
                                            (name, flops))


def _named(equation: str, shapes: tuple[tuple[int, ...], ...], optimize: Any) -> tuple[Any, Any, PathChoice]:
    if optimize == "auto":
        return _auto(equation, shapes)
    start = time.perf_counter()
    path, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimize)
    if isinstance(optimize, str):
        name = optimize
    else:
        name = "none (one einsum)" if optimize is False else "explicit path"
    return path, info, PathChoice(name, time.perf_counter() - start, int(info.opt_cost))


_cached = functools.lru_cache(maxsize=4096)(_named)


def _key(optimize: Any) -> Any:
    """A hashable form of ``optimize`` for the cache, or None when it must not be cached (an optimizer object)."""
    if isinstance(optimize, (str, bool)):
        return optimize
    if isinstance(optimize, (list, tuple)) and all(isinstance(step, (list, tuple)) for step in optimize):
        return tuple(tuple(step) for step in optimize)
    return None


def choose_path(equation: str, shapes: Sequence[Sequence[int]], optimize: Any = "auto"
                ) -> tuple[Any, Any, PathChoice]:
    """``(path, PathInfo, PathChoice)`` for an einsum ``equation`` on operands of these ``shapes``.

    ``optimize`` is einflow's ``"auto"`` (the default, also meant by True and None; see the module text) or
    any other value opt_einsum's ``contract_path`` takes. A ``PathOptimizer`` object runs each time (it may
    keep state); names and explicit paths are cached.

    >>> _, info, choice = choose_path("ab,bc,cd,de,ef,fg,gh,hi->ai", [(8, 8)] * 8)
    >>> choice.optimizer, int(info.opt_cost) == choice.flops
    ('branch-2', True)
    """
    shapes = tuple(tuple(int(size) for size in shape) for shape in shapes)
    if optimize is True or optimize is None:  # "optimise it": the default
        optimize = "auto"
    key = _key(optimize)
    if key is None:
        start = time.perf_counter()
        path, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimize)
        name = getattr(optimize, "__name__", type(optimize).__name__)
        return path, info, PathChoice(name, time.perf_counter() - start, int(info.opt_cost))
    return _cached(equation, shapes, key)
