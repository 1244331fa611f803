"""Products with any number of distinct indices: rings, grids and random regular graphs (issue 27).

A product's indices get opt_einsum's symbols (unicode past numpy's 52 letters) for planning; each pairwise
call receives only the indices it touches, in ASCII letters. References: a pairwise ``numpy.tensordot``
loop of this file (its own greedy order, no opt_einsum), matrix products for rings, closed forms for
deltas and gradients.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

import einflow as ef

# the networks benchmarks/networks.py measures
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
from networks import Network, grid, random_regular, ring  # noqa: E402


def arrays_for(network: Network, seed: int = 0) -> dict[str, np.ndarray]:
    """Positive entries scaled so that the network's value stays far from under- and overflow."""
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(0.5, 1.5, shape) / np.sqrt(np.prod(shape)) * 2.0
            for name, shape in network.shapes.items()}


def pairwise_reference(network: Network, arrays: dict[str, np.ndarray]) -> float:
    """The network's value by ``numpy.tensordot``, pair by pair: of the pairs sharing an index, the one
    whose result has the fewest axes first."""
    items = [(list(indices), arrays[name]) for name, indices in network.tensors]
    while len(items) > 1:
        best: tuple[int, int, int] | None = None
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                if set(items[i][0]) & set(items[j][0]):
                    rank = len(set(items[i][0]) ^ set(items[j][0]))
                    if best is None or rank < best[0]:
                        best = (rank, i, j)
        assert best is not None, "a connected network"
        _, i, j = best
        (left, a), (right, b) = items[i], items[j]
        shared = [index for index in left if index in right]
        value = np.tensordot(a, b, axes=([left.index(s) for s in shared], [right.index(s) for s in shared]))
        kept = [index for index in left if index not in shared] + [index for index in right if index not in shared]
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(kept, value)]
    return float(items[0][1])


def test_a_ring_of_1000_matrices_runs_and_matches_the_matrix_product() -> None:
    network = ring(1000, bond=2)
    arrays = arrays_for(network)
    product = arrays["T0"].T  # T0[e0,e999]: the ring closes on its second index
    for name, _ in network.tensors[1:]:
        product = product @ arrays[name]
    value = ef.compile(network.text)(arrays)
    np.testing.assert_allclose(value, np.trace(product), rtol=1e-10)


@pytest.mark.parametrize("network", [grid(6, 4), grid(10, 2), random_regular(60, 3, 2, seed=1)],
                         ids=lambda network: network.name)
def test_networks_with_more_than_52_indices_match_a_pairwise_contraction(network: Network) -> None:
    assert len(network.sizes) > 52
    arrays = arrays_for(network)
    value = ef.compile(network.text)(arrays)
    np.testing.assert_allclose(value, pairwise_reference(network, arrays), rtol=1e-10)


def test_a_200_node_random_regular_graph_plans_in_seconds() -> None:
    # 300 indices; its best known path costs ~1e13 FLOPs (too many to run here), planning stays in seconds
    network = random_regular(200, 3, 2)
    program = ef.compile(network.text)
    start = time.process_time()  # CPU seconds: the wall clock of a loaded 2-core machine is several times more
    report = program.plan(network.shapes)
    assert time.process_time() - start < 30  # 4 cotengra trials of 1-2 s each, or random-greedy's 4 s budget
    assert report.flops > 0


@pytest.mark.skipif(not os.environ.get("EINFLOW_SCALE_FULL"),
                    reason="2e10 FLOPs, minutes on 2 cores: set EINFLOW_SCALE_FULL=1")
def test_a_200_node_random_regular_graph_contracts_within_1_gib_and_matches_cotengra() -> None:
    # the planned path (4.45e10 FLOPs unsliced, a 10 GiB peak) runs sliced under a 1 GiB limit; the reference
    # is cotengra's own sliced contraction of the same tree (its einsum calls, its slicing, not einflow's)
    ctg = pytest.importorskip("cotengra")
    from einflow.engine.paths import choose_path

    network = random_regular(200, 3, 2)
    arrays = arrays_for(network)
    equation, shapes = network.equation()
    path, _, _ = choose_path(equation, shapes)
    terms = equation.split("->")[0].split(",")
    sizes = {letter: size for term, shape in zip(terms, shapes) for letter, size in zip(term, shape)}
    tree = ctg.ContractionTree.from_path(terms, "", sizes, path=path).slice(target_size=2**24)
    reference = tree.contract([arrays[name] for name, _ in network.tensors], backend="numpy")
    value = ef.compile(network.text)(arrays, memory_limit="1GiB")
    np.testing.assert_allclose(value, reference, rtol=1e-10)


def test_the_gradient_of_a_ring_of_100_matrices_is_the_product_of_the_others() -> None:
    network = ring(100, bond=3)
    arrays = arrays_for(network, seed=2)
    names = [name for name, _ in network.tensors]
    gradient = ef.grad(ef.compile(network.text), wrt=names[0])(arrays)
    rest = np.eye(3)
    for name in names[1:]:
        rest = rest @ arrays[name]
    np.testing.assert_allclose(gradient, rest, rtol=1e-10)  # T0[e0,e99]: d tr(A^T R) / dA = R


def test_a_grid_gradient_with_60_indices_matches_central_differences() -> None:
    network = grid(6, 4)
    arrays = arrays_for(network, seed=3)
    program = ef.compile(network.text)
    gradient = ef.grad(program, wrt="T14")(arrays)
    step = 1e-6
    for position in [(0, 0, 0, 0), (1, 2, 3, 0), (3, 3, 3, 3)]:
        up, down = dict(arrays), dict(arrays)
        up["T14"] = arrays["T14"].copy()
        down["T14"] = arrays["T14"].copy()
        up["T14"][position] += step
        down["T14"][position] -= step
        expected = (pairwise_reference(network, up) - pairwise_reference(network, down)) / (2 * step)
        np.testing.assert_allclose(gradient[position], expected, rtol=1e-6)


def test_a_chain_of_80_deltas_and_its_gradient() -> None:
    count = 80
    text = "y[a0] = " + " ".join(f"x{k}[a{k}] delta[a{k},a{k + 1}]" for k in range(count)) + f" x{count}[a{count}]"
    rng = np.random.default_rng(4)
    xs = {f"x{k}": rng.uniform(0.9, 1.1, 3) for k in range(count + 1)}
    np.testing.assert_allclose(ef.compile(text)(xs), np.prod(list(xs.values()), axis=0), rtol=1e-12)
    total = ef.compile("z = sum[a0](" + text.split(" = ", 1)[1] + ")")
    others = np.prod([x for name, x in xs.items() if name != "x7"], axis=0)
    np.testing.assert_allclose(ef.grad(total, wrt="x7")(xs), others, rtol=1e-12)


@pytest.mark.parametrize("backend", ["torch", "dask"])
def test_a_ring_of_300_matrices_on_other_backends(backend: str) -> None:
    network = ring(300, bond=2)
    arrays = arrays_for(network, seed=5)
    expected = ef.compile(network.text)(arrays)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        value = ef.compile(network.text)({k: torch.tensor(v) for k, v in arrays.items()}, backend="torch")
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-10)
    else:
        da = pytest.importorskip("dask.array")
        value = ef.compile(network.text)({k: da.from_array(v) for k, v in arrays.items()}, backend="dask")
        np.testing.assert_allclose(value.compute(), expected, rtol=1e-10)


def test_an_array_of_more_than_64_axes_is_a_shape_error_naming_the_statement() -> None:
    text = "y = " + " + ".join(f"x{k}[i{k}]" for k in range(70))
    with pytest.raises(ef.ShapeError, match="70 axes .*at most 64"):
        ef.compile(text)({f"x{k}": np.ones(1) for k in range(70)})


# ------------------------------------------------------ issue 27 item 2: paths for big networks, shared adjoints

@pytest.mark.parametrize("network", [grid(6, 4), grid(10, 2), random_regular(60, 3, 2, seed=1)],
                         ids=lambda network: network.name)
def test_the_gradient_by_every_tensor_costs_about_three_forwards(network: Network) -> None:
    # reverse mode along the product's tree: each node's cotangent is its parent's contracted with its sibling,
    # so the forward's partial products are shared. Tensor by tensor it would be ~N forwards (36 on the grid;
    # the earlier greedy tree gave 41x on the 6x6 grid and 4.2x on the 10x10); the tree is searched at bond 2
    forward = ef.compile(network.text)
    names = [name for name, _ in network.tensors]
    gradient = ef.grad(forward, wrt=names)
    ratio = gradient.plan(network.shapes).flops / forward.plan(network.shapes).flops
    assert ratio <= 3.05, ratio
    assert "dvalue_dt" in str(gradient)  # the cotangents of the tree's partial products, by name


def test_the_gradient_by_every_tensor_of_a_grid_matches_jax() -> None:
    jax = pytest.importorskip("jax", reason="jax is a test dependency (make test installs it)")
    jax.config.update("jax_enable_x64", True)
    network = grid(5, 2)  # 25 tensors: beyond derive.tree.DP_LIMIT, the tree is searched
    arrays = arrays_for(network, seed=7)
    names = [name for name, _ in network.tensors]
    got = ef.grad(ef.compile(network.text), wrt=names)(arrays)
    equation, _ = network.equation()
    terms = equation.split("->")[0].split(",")
    letters = {c: chr(ord("a") + k) for k, c in enumerate(dict.fromkeys("".join(terms)))}
    assert len(letters) <= 52
    spec = ",".join("".join(letters[c] for c in term) for term in terms) + "->"

    def value(*xs: object) -> object:
        return jax.numpy.einsum(spec, *xs, optimize="greedy")

    expected = jax.grad(value, argnums=tuple(range(len(names))))(*[arrays[name] for name in names])
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-9)


def test_the_split_tree_is_the_same_on_every_derivation() -> None:
    network = grid(6, 4)
    names = [name for name, _ in network.tensors]
    first = str(ef.grad(ef.compile(network.text), wrt=names))
    assert str(ef.grad(ef.compile(network.text), wrt=names)) == first


def test_default_paths_match_cotengras_hyper_optimiser_at_the_same_budget() -> None:
    pytest.importorskip("cotengra", reason="cotengra (the networks and test extras) plans large networks")
    import warnings

    import cotengra as ctg
    import opt_einsum as oe

    from einflow.engine import paths
    from einflow.lang import trees

    network = grid(6, 4)
    equation, shapes = network.equation()
    _, _, choice = paths._auto(equation, tuple(tuple(s) for s in shapes))
    assert choice.optimizer.startswith("cotengra hyper")  # cotengra's search ran (not the fallback)
    ours = choice.flops
    best = None
    for seed in range(2):
        optimizer = ctg.HyperOptimizer(minimize="flops", max_repeats=trees.hyper_trials(len(shapes)), parallel=False,
                                       progbar=False, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimizer)
        best = int(info.opt_cost) if best is None else min(best, int(info.opt_cost))
    assert best is not None and ours <= 1.1 * best, (ours, best)


def test_without_cotengra_paths_and_trees_fall_back_to_opt_einsum(monkeypatch: pytest.MonkeyPatch) -> None:
    from einflow.engine import paths

    monkeypatch.setitem(sys.modules, "cotengra", None)  # ``import cotengra`` raises ImportError
    network = grid(5, 3)
    equation, shapes = network.equation()
    _, info, choice = paths._auto(equation, tuple(tuple(s) for s in shapes))
    assert "cotengra" not in choice.optimizer and choice.flops == int(info.opt_cost)
    forward = ef.compile(network.text)
    names = [name for name, _ in network.tensors]
    gradient = ef.grad(forward, wrt=names)
    assert gradient.plan(network.shapes).flops <= 3.5 * forward.plan(network.shapes).flops


def test_hyper_paths_are_seeded() -> None:
    pytest.importorskip("cotengra", reason="cotengra (the networks and test extras) plans large networks")
    from einflow.lang.trees import hyper_path

    network = grid(5, 2)
    equation, shapes = network.equation()
    terms = equation.split("->")[0].split(",")
    sizes = {c: 2 for term in terms for c in term}
    first = hyper_path(terms, "", sizes, 3)
    assert first is not None and len(first) == len(terms) - 1
    assert hyper_path(terms, "", sizes, 3) == first


def test_a_split_product_with_an_index_shared_by_three_factors_matches_central_differences() -> None:
    # 22 factors (beyond derive.tree.DP_LIMIT: the tree is searched) and a hyperedge: a3 is read by T2, T3, H, V
    ring = " ".join(f"T{k}[a{k},a{(k + 1) % 20}]" for k in range(20))
    text = f"z = {ring} H[a3,a9,a15] V[a3]"
    rng = np.random.default_rng(9)
    arrays = {f"T{k}": rng.uniform(0.5, 1.5, (3, 3)) / 3 for k in range(20)}
    arrays.update(H=rng.uniform(size=(3, 3, 3)), V=rng.uniform(size=3))
    names = list(arrays)
    gradient = ef.grad(text, wrt=names)
    assert "dz_dt" in str(gradient)  # split along its tree, environments shared
    got = gradient(arrays)
    program = ef.compile(text)
    step = 1e-6
    for k, name in enumerate(names):
        up, down = dict(arrays), dict(arrays)
        up[name], down[name] = arrays[name].copy(), arrays[name].copy()
        up[name].flat[1] += step
        down[name].flat[1] -= step
        expected = (program(up) - program(down)) / (2 * step)
        np.testing.assert_allclose(got[k].flat[1], expected, rtol=1e-6)
