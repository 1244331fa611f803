"""Improve a pairwise contraction path by re-solving its small subtrees exactly.

A pairwise path is a binary tree whose leaves are the operands. Any node of the tree, together with a
frontier of up to ``leaves`` nodes below it, is a small contraction of its own: the frontier's index sets
in, the node's index set out. Re-solving that small contraction with opt_einsum's exact dynamic
programming and keeping the result when it is cheaper never makes the whole path worse, and repeating it
over the tree's most expensive nodes removes the local mistakes a greedy or random-greedy path makes
(the idea of subtree reconfiguration from the tensor-network literature, written here for einflow).
:func:`hyper_path` asks cotengra's ``HyperOptimizer`` (when installed) for a tree, seeded.

The engine's path search (einflow/engine/paths.py) and the derivation's split of a product into its
pairwise tree (einflow/derive/tree.py) both search with these, so that the tree a gradient's shared
adjoints follow is found the way the forward's path is.

>>> import opt_einsum as oe
>>> equation = "ab,bc,cd,de,ea->"
>>> sizes = {c: 10 for c in "abcde"}
>>> inputs = [set(term) for term in equation.split("->")[0].split(",")]
>>> path = [(0, 1), (0, 1), (0, 1), (0, 1)]  # a left-to-right chain
>>> better = refine(inputs, set(), sizes, path, deadline=float("inf"))
>>> tree_flops(inputs, set(), sizes, better) <= tree_flops(inputs, set(), sizes, path)
True
"""

from __future__ import annotations

import functools
import heapq
import math
import random
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import opt_einsum as oe

__all__ = ["refine", "tree_flops", "hyper_path", "searched", "hyper_trials", "PrivateRandomGreedy", "HYPER_SEED",
           "HYPER_TRIALS", "HYPER_TRIALS_MAX", "HYPER_WORK", "REFINE_PASSES"]

Path = list[tuple[int, ...]]

#: the seed of cotengra's search (its hyper-parameter search and Python's ``random`` for its trials)
HYPER_SEED = 0
#: cotengra's trials for a large product: HYPER_WORK // operands, between HYPER_TRIALS and HYPER_TRIALS_MAX
#: (a trial's time grows with the operands: 32 trials for 16 tensors, 22 for 36, 8 for 100, 4 for 200);
#: and the passes of exact subtree re-solving of its tree
HYPER_TRIALS = 4
HYPER_TRIALS_MAX = 32
HYPER_WORK = 800
REFINE_PASSES = 2


def hyper_trials(operands: int) -> int:
    """How many cotengra trials a product of ``operands`` operands gets."""
    return max(HYPER_TRIALS, min(HYPER_TRIALS_MAX, HYPER_WORK // max(operands, 1)))


class _Tree:
    """A contraction tree: leaves 0..n-1 (the operands), internal nodes with two children each."""

    def __init__(self, inputs: Sequence[Iterable[str]], output: Iterable[str], sizes: dict[str, int],
                 path: Path) -> None:
        self.sizes = sizes
        self.leaves = [frozenset(term) for term in inputs]
        self.total = Counter(index for term in self.leaves for index in term)
        self.total.update(set(output))
        self.children: dict[int, tuple[int, int]] = {}
        self.counts: dict[int, Counter[str]] = {k: Counter(term) for k, term in enumerate(self.leaves)}
        self.terms: dict[int, frozenset[str]] = dict(enumerate(self.leaves))
        self.cost: dict[int, int] = {}
        self.next = len(self.leaves)
        self.root = 0
        for a, b in oe.paths.linear_to_ssa(path):
            self.root = self.join(a, b)

    def join(self, a: int, b: int, node: int | None = None) -> int:
        """Make (or remake, when ``node`` is given) the node contracting ``a`` and ``b``."""
        if node is None:
            node, self.next = self.next, self.next + 1
        counts = self.counts[a] + self.counts[b]
        legs = frozenset(index for index, count in counts.items() if count < self.total[index])
        involved = self.terms[a] | self.terms[b]
        self.children[node] = (a, b)
        self.counts[node] = counts
        self.terms[node] = legs
        self.cost[node] = math.prod(self.sizes[i] for i in involved) * (2 if involved - legs else 1)
        return node

    def remove(self, node: int) -> None:
        for table in (self.children, self.counts, self.terms, self.cost):
            table.pop(node, None)

    def frontier(self, node: int, leaves: int) -> tuple[list[int], list[int]]:
        """Up to ``leaves`` nodes below ``node`` (expanding the costliest first), and the nodes between."""
        frontier = list(self.children[node])
        inside = [node]
        while len(frontier) < leaves:
            expandable = [f for f in frontier if f in self.children]
            if not expandable:
                break
            chosen = max(expandable, key=lambda f: self.cost[f])
            frontier.remove(chosen)
            frontier.extend(self.children[chosen])
            inside.append(chosen)
        return frontier, inside

    def resolve(self, node: int, leaves: int) -> bool:
        """Re-solve the subtree at ``node`` exactly; True when that made it cheaper."""
        frontier, inside = self.frontier(node, leaves)
        if len(frontier) < 3:
            return False
        before = sum(self.cost[n] for n in inside)
        inputs = [set(self.terms[f]) for f in frontier]
        found = oe.paths.dynamic_programming(inputs, set(self.terms[node]), self.sizes)
        if any(len(step) != 2 for step in found):
            return False
        trial = _Tree.__new__(_Tree)
        trial.sizes, trial.total = self.sizes, self.total
        trial.children, trial.cost = {}, {}
        trial.counts = {k: self.counts[f] for k, f in enumerate(frontier)}
        trial.terms = {k: self.terms[f] for k, f in enumerate(frontier)}
        trial.next = len(frontier)
        trial.root = 0
        for a, b in oe.paths.linear_to_ssa(found):
            trial.root = trial.join(a, b)
        if len(trial.children) != len(frontier) - 1 or sum(trial.cost.values()) >= before:
            return False
        for n in inside:
            self.remove(n)
        names = dict(enumerate(frontier))
        for made in sorted(trial.children):  # in creation order: children exist before their parents
            a, b = trial.children[made]
            names[made] = self.join(names[a], names[b], node if made == trial.root else None)
        return True

    def path(self) -> Path:
        """The tree as a linear (opt_einsum) path, contracting in post-order."""
        order: list[int] = []
        stack = [(self.root, False)]
        while stack:
            node, done = stack.pop()
            if node not in self.children:
                continue
            if done:
                order.append(node)
            else:
                stack.append((node, True))
                stack.extend((child, False) for child in reversed(self.children[node]))
        ssa = {k: k for k in range(len(self.leaves))}
        steps = []
        for number, node in enumerate(order):
            a, b = self.children[node]
            steps.append((ssa[a], ssa[b]))
            ssa[node] = len(self.leaves) + number
        return list(oe.paths.ssa_to_linear(steps))


def tree_flops(inputs: Sequence[Iterable[str]], output: Iterable[str], sizes: dict[str, int], path: Path) -> int:
    """The FLOPs of a pairwise path, counted as opt_einsum counts them."""
    return sum(_Tree(inputs, output, sizes, path).cost.values())


def refine(inputs: Sequence[Iterable[str]], output: Iterable[str], sizes: dict[str, int], path: Path,
           deadline: float, leaves: int = 8, passes: int | None = None) -> Path:
    """``path`` with its subtrees re-solved exactly while that helps and ``time.perf_counter() < deadline``.

    The costliest nodes are visited first; passes repeat until one finds nothing cheaper. The first pass
    always runs to its end (so the result does not depend on the machine's speed for one pass); at most
    ``passes`` run when it is given. A path that is not pairwise (a step of one or of three operands) is
    returned as it is.
    """
    if len(inputs) < 3 or any(len(step) != 2 for step in path):
        return list(path)
    tree = _Tree(inputs, output, sizes, path)
    improved = True
    done = 0
    while improved and (done == 0 or time.perf_counter() < deadline) and (passes is None or done < passes):
        improved = False
        for node in sorted(tree.children, key=lambda n: -tree.cost[n]):
            if done and time.perf_counter() >= deadline:
                break
            if node in tree.children and tree.resolve(node, leaves):
                improved = True
        done += 1
    return tree.path()


# ---------------------------------------------------------------- searches that draw from private generators
# Planning never touches Python's global ``random``: another thread's seeded stream must not change because a
# plan was searched (nor the search's result because another thread drew). cotengra's own greedy trial and
# opt_einsum's RandomGreedy draw from the global generator (opt_einsum even reseeds it), so einflow runs
# their greedy step with a ``random.Random`` of its own; cotengra's other trial methods take a ``seed``.


def _thermal_choice(queue: list[Any], remaining: Any, rng: random.Random, nbranch: int, temperature: float,
                    rel_temperature: bool) -> Any:
    """Pick one of the ``nbranch`` cheapest live candidates of a greedy step's heap, each with Boltzmann weight
    ``exp(-(cost - cheapest) / temperature)``; the others go back on the heap (opt_einsum's ``choose_fn``)."""
    candidates: list[Any] = []
    while queue and len(candidates) < nbranch:
        candidate = heapq.heappop(queue)
        if candidate[1] in remaining and candidate[2] in remaining:  # a candidate whose inputs are gone is dropped
            candidates.append(candidate)
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    costs = [candidate[0][0] for candidate in candidates]
    cheapest = costs[0]
    scale = temperature * max(1, abs(cheapest)) if rel_temperature else temperature
    weights = [float(cost == cheapest) if scale == 0 else math.exp(-(cost - cheapest) / scale) for cost in costs]
    chosen = candidates.pop(rng.choices(range(len(candidates)), weights=weights)[0])
    for candidate in candidates:
        heapq.heappush(queue, candidate)
    return chosen


def _random_greedy_trial(trial: int, inputs: list[Any], output: Any, sizes: dict[str, int], nbranch: int,
                         temperature: float, rel_temperature: bool) -> tuple[Any, int, int]:
    """One trial of :class:`PrivateRandomGreedy`: trial 0 is plain greedy (with jittered costs), the others
    choose among the cheapest steps at random; trial ``r`` draws from ``random.Random(r)``."""
    from opt_einsum.path_random import ssa_path_compute_cost

    rng = random.Random(trial)

    def jittered_cost(size12: int, size1: int, size2: int, k12: Any, k1: Any, k2: Any) -> float:
        return rng.gauss(1.0, 0.01) * (size12 - size1 - size2)

    choose = None if trial == 0 or nbranch == 1 else functools.partial(
        _thermal_choice, rng=rng, nbranch=nbranch, temperature=temperature, rel_temperature=rel_temperature)
    ssa_path = oe.paths.ssa_greedy_optimize(inputs, output, sizes, choose, jittered_cost)
    flops, size = ssa_path_compute_cost(ssa_path, inputs, output, sizes)
    return ssa_path, flops, size


class PrivateRandomGreedy(oe.RandomGreedy):
    """opt_einsum's random-greedy search (the same trials, costs and choices) whose trial ``r`` draws from its
    own ``random.Random(r)`` instead of seeding and drawing from Python's global generator."""

    def setup(self, inputs: Any, output: Any, size_dict: dict[str, int]) -> tuple[Any, Any]:
        return _random_greedy_trial, (inputs, output, size_dict, self.nbranch, self.temperature,
                                      self.rel_temperature)


def _cotengra_greedy_trial(inputs: Any, output: Any, size_dict: dict[str, int], random_strength: float = 0.0,
                           temperature: float = 0.0, costmod: float = 1.0, seed: random.Random | None = None) -> Any:
    """cotengra's ``greedy`` hyper trial (sizes jittered by ``random_strength``, Gumbel noise of ``temperature``
    on the scores) drawing from ``seed``, the search's own generator."""
    from cotengra.core import ContractionTree, jitter_dict
    from cotengra.pathfinders.path_basic import ContractionProcessor

    rng = seed if seed is not None else random.Random(HYPER_SEED)
    jittered = jitter_dict(size_dict, random_strength, rng) if random_strength else size_dict
    processor = ContractionProcessor(inputs, output, jittered)
    processor.simplify()
    processor.optimize_greedy(costmod=costmod, temperature=temperature, seed=rng)
    processor.optimize_remaining_by_size()
    return ContractionTree.from_path(inputs, output, size_dict, ssa_path=processor.ssa_path)


_GREEDY = "einflow-greedy"
_REGISTERING = threading.Lock()


def _hyper_methods(ctg: Any, rng: random.Random) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """cotengra's default trial methods, its ``greedy`` replaced by :func:`_cotengra_greedy_trial` (registered
    once, with cotengra's search space), each given ``rng`` as its seed."""
    from cotengra.hyperoptimizers import hyper

    methods = list(hyper.get_default_hq_methods())
    try:
        with _REGISTERING:
            if _GREEDY not in hyper.list_hyper_functions():
                hyper.register_hyper_function(_GREEDY, _cotengra_greedy_trial, hyper._HYPER_SEARCH_SPACE["greedy"])
        methods = [_GREEDY if method == "greedy" else method for method in methods]
    except (ImportError, AttributeError, KeyError):  # another cotengra: keep the methods that take a seed
        methods = [method for method in methods if method != "greedy"] or ["labels"]

    def random_greedy(inputs: Any, output: Any, size_dict: dict[str, int], **options: Any) -> Any:
        """The partitioning trials' joining of their parts (cotengra's preset draws from the global random)."""
        search = ctg.RandomGreedyOptimizer(max_repeats=128, seed=rng.randrange(2 ** 32), parallel=False)
        return search(inputs, output, size_dict, **options)

    constants = {method: {"seed": rng} if method == _GREEDY else {"seed": rng, "super_optimize": random_greedy}
                 for method in methods}  # the partitioning methods (labels, kahypar) join parts with random-greedy
    return methods, constants


def hyper_path(terms: Sequence[str], output: str, sizes: dict[str, int], trials: int,
               seed: int | None = None) -> Path | None:
    """The path of cotengra's ``HyperOptimizer`` at its defaults after ``trials`` trials, minimising FLOPs;
    None without cotengra.

    ``terms`` are the operands' index letters, ``output`` the result's. No clock: the same ``seed`` (default
    :data:`HYPER_SEED`) and trials give the same path. Every trial draws from one ``random.Random(seed)`` of
    this search (and the hyper-parameter search is seeded too): Python's global ``random`` is never touched,
    so searches in several threads neither disturb each other nor the threads' own seeded streams.
    """
    try:
        import cotengra as ctg
    except ImportError:
        return None
    seed = HYPER_SEED if seed is None else seed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cotengra's note that kahypar/optuna, optional for it, are missing
        methods, constants = _hyper_methods(ctg, random.Random(seed))
        optimizer = ctg.HyperOptimizer(methods=methods, constants=constants, minimize="flops", max_repeats=trials,
                                       parallel=False, progbar=False, seed=seed)
        tree = optimizer.search([tuple(term) for term in terms], tuple(output), sizes)
    return [tuple(step) for step in tree.get_path()]


def searched(terms: Sequence[str], output: str, sizes: dict[str, int], fast: Path, fast_name: str,
             seed: int | None = None) -> list[tuple[int, int, Path, str]] | None:
    """Candidate paths ``(FLOPs, rank, path, description)`` for a large product, None without cotengra:
    cotengra's tree after :func:`hyper_trials` trials, it and the heuristic path ``fast`` each refined by
    :data:`REFINE_PASSES` passes of :func:`refine`. No clock: the same product gets the same candidates,
    which is what lets a gradient's split tree (einflow/derive/tree.py) be the forward's planned path.
    """
    trials = hyper_trials(len(terms))
    found = hyper_path(terms, output, sizes, trials, seed)
    if found is None:
        return None
    inputs = [set(term) for term in terms]
    inf = float("inf")
    hyper = f"cotengra hyper ({trials} trials)"
    found_refined = refine(inputs, set(output), sizes, found, inf, passes=REFINE_PASSES)
    fast_refined = refine(inputs, set(output), sizes, fast, inf, passes=REFINE_PASSES)
    return [(tree_flops(inputs, output, sizes, found), 1, found, hyper),
            (tree_flops(inputs, output, sizes, found_refined), 2, found_refined, f"{hyper} + subtree refinement"),
            (tree_flops(inputs, output, sizes, fast_refined), 3, fast_refined, f"{fast_name} + subtree refinement")]
