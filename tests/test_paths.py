"""Path choice (einflow/engine/paths.py): large networks planned well by default, small ones exactly, paths cached.

References: opt_einsum's dynamic programming ('dp', exact for FLOPs) for path quality, numpy.einsum (on a
path of its own) for values.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import opt_einsum as oe
import pytest

import einflow as ef
from einflow.engine import paths
from einflow.engine.paths import choose_path
from einflow.lang import trees as subtrees


def grid(side: int, bond: int) -> tuple[str, dict[str, tuple[int, ...]], str, list[tuple[int, ...]]]:
    """An open-boundary side x side lattice: (einflow text, shapes by name, einsum equation, shapes)."""
    edges = [(r * side + c, r * side + c + 1) for r in range(side) for c in range(side - 1)]
    edges += [(r * side + c, (r + 1) * side + c) for r in range(side - 1) for c in range(side)]
    labels: dict[int, list[int]] = {k: [] for k in range(side * side)}
    for number, (a, b) in enumerate(edges):
        labels[a].append(number)
        labels[b].append(number)
    text = "value = " + " ".join(f"T{k}[{','.join(f'e{i}' for i in labels[k])}]" for k in labels)
    shapes = {f"T{k}": (bond,) * len(labels[k]) for k in labels}
    equation = ",".join("".join(oe.get_symbol(i) for i in labels[k]) for k in labels) + "->"
    return text, shapes, equation, list(shapes.values())


def dp_flops(equation: str, shapes: list[tuple[int, ...]]) -> float:
    _, info = oe.contract_path(equation, *shapes, shapes=True,
                               optimize=oe.DynamicProgramming(minimize="flops", cost_cap=True))
    return float(info.opt_cost)


@pytest.mark.parametrize("bond", [8, 16])
def test_grid_default_path_is_within_1_5x_of_dp(bond: int) -> None:
    text, shapes, equation, operands = grid(4, bond)
    report = ef.compile(text).plan(shapes)
    reference = dp_flops(equation, operands)
    assert report.flops <= 1.5 * reference
    # opt_einsum's own 'auto' (greedy above 14 operands) is far off here: the default is not it
    _, greedy = oe.contract_path(equation, *operands, shapes=True, optimize="auto")
    assert greedy.opt_cost > 3 * reference
    step = next(step for step in report.steps if step.kind == "contract")
    assert step.path is not None and step.path.alternative == ("greedy", int(greedy.opt_cost))  # searched
    assert f"path: {step.path.optimizer} in " in str(report) and "(greedy: " in str(report)
    assert report.large_products() == [step] and report.planning_seconds > 0


def test_searched_path_computes_numpy_einsum_value() -> None:
    text, shapes, equation, operands = grid(4, 6)
    rng = np.random.default_rng(0)
    arrays = {name: rng.uniform(0.5, 1.5, shape) / 6 for name, shape in shapes.items()}
    program = ef.compile(text)
    step = next(step for step in program.plan(shapes).steps if step.kind == "contract")
    assert step.path is not None and step.path.alternative is not None  # the search found a cheaper path
    path, _ = oe.contract_path(equation, *operands, shapes=True, optimize="dp")
    expected = np.einsum(equation, *arrays.values(), optimize=["einsum_path", *path])
    np.testing.assert_allclose(program(**arrays), expected, rtol=1e-10)
    np.testing.assert_allclose(ef.einsum(equation, *arrays.values()), expected, rtol=1e-10)


@pytest.mark.parametrize("count, name", [(2, "optimal"), (4, "optimal"), (5, "branch-all"), (6, "branch-all")])
def test_small_products_take_the_exact_path(count: int, name: str) -> None:
    rng = np.random.default_rng(count)
    letters = "abcdefgh"
    equation = ",".join(letters[k] + letters[k + 1] for k in range(count)) + "->" + letters[0] + letters[count]
    shapes = [(int(rng.integers(2, 40)), int(rng.integers(2, 40))) for _ in range(count)]
    for k in range(count - 1):  # chain sizes agree
        shapes[k + 1] = (shapes[k][1], shapes[k + 1][1])
    path, info, choice = choose_path(equation, shapes)
    assert choice.optimizer == name and choice.alternative is None
    _, exact = oe.contract_path(equation, *shapes, shapes=True, optimize="optimal")
    assert info.opt_cost == exact.opt_cost


def test_a_small_product_where_optimal_misses_takes_greedy() -> None:
    """``W3[i,s] a[i] b[i] D[i,v]`` (from a Hessian): opt_einsum's 'optimal' forms ``isv`` first; the two
    vectors multiplied first cost 2/3 of that, and no intermediate has three indices."""
    shapes = [(48, 48), (48,), (48,), (48, 48)]
    _, optimal = oe.contract_path("is,i,i,iv->sv", *shapes, shapes=True, optimize="optimal")
    _, dp = oe.contract_path("is,i,i,iv->sv", *shapes, shapes=True, optimize="dp")
    path, info, choice = choose_path("is,i,i,iv->sv", shapes)
    assert info.opt_cost == dp.opt_cost <= optimal.opt_cost
    if dp.opt_cost < optimal.opt_cost:  # opt_einsum 3.4's 'optimal'
        assert choice.optimizer == "greedy" and choice.alternative == ("optimal", optimal.opt_cost)
    assert max(info.size_list) == 48 * 48
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=shape) for shape in shapes]
    np.testing.assert_allclose(ef.einsum("is,i,i,iv->sv", *arrays), np.einsum("is,i,i,iv->sv", *arrays), rtol=1e-12)


def test_cheap_large_product_keeps_the_fast_path() -> None:
    # a ring of ten 4x4 matrices costs a few thousand FLOPs: searching could not pay for itself
    equation = ",".join(oe.get_symbol(k) + oe.get_symbol((k + 1) % 10) for k in range(10)) + "->"
    _, info, choice = choose_path(equation, [(4, 4)] * 10)
    assert choice.optimizer == "branch-1" and info.opt_cost < paths.SEARCH_FLOPS


def test_paths_are_cached_by_equation_and_shapes() -> None:
    _, _, equation, operands = grid(4, 9)
    first = choose_path(equation, operands)
    start = time.perf_counter()
    second = choose_path(equation, [list(shape) for shape in operands])  # the same shapes as lists
    assert time.perf_counter() - start < 0.01
    assert second is first
    # a PathOptimizer object may keep state: it is asked again
    optimizer = oe.RandomGreedy(max_repeats=4)
    choose_path(equation, operands, optimizer)
    choose_path(equation, operands, optimizer)
    assert len(optimizer.costs) == 8


def test_planning_time_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "SEARCH_REPEATS", 100_000)
    monkeypatch.setattr(paths, "SEARCH_SECONDS_MIN", 0.2)
    monkeypatch.setattr(paths, "SEARCH_SECONDS_MAX", 0.2)
    monkeypatch.setitem(sys.modules, "cotengra", None)  # the clocked search (cotengra's runs fixed trials)
    _, _, equation, operands = grid(5, 7)  # not planned before: no cached path
    _, info, choice = choose_path(equation, operands)
    # the budget, plus one trial and the fast path, with room for a loaded machine (unbounded, 100,000 repeats take
    # minutes)
    assert choice.seconds < 0.2 + 4.0
    assert choice.flops == int(info.opt_cost) <= (choice.alternative or ("", choice.flops))[1]


def test_other_optimize_values_are_opt_einsums() -> None:
    _, _, equation, operands = grid(4, 8)
    _, info, choice = choose_path(equation, operands, "greedy")
    _, expected = oe.contract_path(equation, *operands, shapes=True, optimize="greedy")
    assert choice.optimizer == "greedy" and info.opt_cost == expected.opt_cost
    path = [(0, 1)] * (len(operands) - 1)
    _, info, choice = choose_path(equation, operands, path)
    assert choice.optimizer == "explicit path"
    with pytest.raises(ef.EinflowError, match="not a path algorithm"):
        ef.compile("C[i,j] = A[i,k] B[k,j]").plan({"A": (2, 3), "B": (3, 4)}, optimize="best")


def test_numpy_optimize_values_keep_numpys_path() -> None:
    _, shapes, equation, operands = grid(4, 8)
    arrays = [np.broadcast_to(np.zeros(()), shape) for shape in operands]
    assert ef.einsum_path(equation, *arrays)[0] == np.einsum_path(equation, *arrays, optimize="greedy")[0]


@pytest.mark.parametrize("bond", [8, 16])
def test_gradient_of_one_grid_tensor_costs_at_most_3x_the_forward(bond: int) -> None:
    text, shapes, _, _ = grid(4, bond)
    program = ef.compile(text)
    forward = program.plan(shapes).flops
    for wrt in ("T5", "T0"):  # an inner and a corner tensor
        assert ef.grad(program, wrt=wrt).plan(shapes).flops <= 3 * forward


# ---------------------------------------------------------------------------------------------- subtrees
def test_subtree_refinement_repairs_a_bad_order() -> None:
    # y = A B C v left to right costs two matrix products; right to left, three matrix-vector products
    inputs, sizes = ["ab", "bc", "cd", "d"], dict.fromkeys("abcd", 100)
    left_to_right = [(0, 1), (0, 1), (0, 1)]
    better = subtrees.refine(inputs, "a", sizes, left_to_right, deadline=float("inf"))
    _, exact = oe.contract_path("ab,bc,cd,d->a", *[(100, 100)] * 3, (100,), shapes=True, optimize="optimal")
    assert subtrees.tree_flops(inputs, "a", sizes, better) == exact.opt_cost
    assert subtrees.tree_flops(inputs, "a", sizes, left_to_right) > 30 * exact.opt_cost


@pytest.mark.parametrize("seed", range(4))
def test_refined_paths_are_never_worse_and_compute_the_same_value(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = 12
    labels = [oe.get_symbol(k) for k in range(18)]
    terms = ["".join(rng.choice(labels, size=int(rng.integers(1, 4)), replace=False)) for _ in range(count)]
    output = "".join(sorted(set("".join(terms)))[:2])
    equation = ",".join(terms) + "->" + output
    sizes = {letter: int(rng.integers(2, 5)) for letter in labels}
    shapes = [tuple(sizes[c] for c in term) for term in terms]
    start, info = oe.contract_path(equation, *shapes, shapes=True, optimize="greedy")
    assert subtrees.tree_flops(terms, output, sizes, start) == info.opt_cost  # opt_einsum's count
    refined = subtrees.refine(terms, output, sizes, start, deadline=float("inf"))
    _, refined_info = oe.contract_path(equation, *shapes, shapes=True, optimize=refined)
    assert refined_info.opt_cost == subtrees.tree_flops(terms, output, sizes, refined) <= info.opt_cost
    arrays = [rng.standard_normal(shape) for shape in shapes]
    np.testing.assert_allclose(oe.contract(equation, *arrays, optimize=refined),
                               np.einsum(equation, *arrays, optimize="greedy"), rtol=1e-9, atol=1e-12)
