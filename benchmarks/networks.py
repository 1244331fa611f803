"""Large tensor networks: the FLOPs of einflow's default path vs cotengra's hyper-optimised tree, and gradients.

Networks (closed, scalar results): an L x L grid with bond D on every edge, a ring (trace of N D x D
matrices), an MPS norm <psi|psi> (N sites, bond chi, physical 2) and a random 3-regular graph with bond D.
For each: the FLOPs of the path that ``Program.plan`` reports at default settings, the FLOPs of cotengra's
HyperOptimizer tree (when cotengra is installed), their ratio, and the planning time; then, for the
gradient w.r.t. one tensor (and w.r.t. all of a ring's), the gradient program's planned FLOPs divided by
the forward's.

The reference is cotengra's tree when cotengra is installed (``pip install .[bench]``), else opt_einsum's
exact 'dp' (networks of at most 16 tensors). Run:  python benchmarks/networks.py [--quick] [--full] [--seconds S]

``--scale`` (issue 27 item 2): on the 6x6 grid (bond 4), the 10x10 grid (bond 2) and a 200-node random 3-regular
graph (bond 2), einflow's default path at several seeds against cotengra's HyperOptimizer at its defaults given
the same trials and seconds; the all-input gradient's planned FLOPs over the forward's; and the all-input
gradient's time against ``jax.jit(jax.grad)`` along einflow's path (interleaved, medians).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import Row, machine  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["Network", "grid", "ring", "mps", "random_regular", "networks", "measure", "run"]


@dataclass(frozen=True)
class Network:
    """A closed tensor network: tensors (name -> index names) and each index's size."""

    name: str
    tensors: tuple[tuple[str, tuple[str, ...]], ...]
    sizes: tuple[tuple[str, int], ...]

    @property
    def text(self) -> str:
        """The network as one einflow product (a scalar)."""
        return "value = " + " ".join(f"{name}[{','.join(indices)}]" for name, indices in self.tensors)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        size = dict(self.sizes)
        return {name: tuple(size[i] for i in indices) for name, indices in self.tensors}

    def equation(self) -> tuple[str, list[tuple[int, ...]]]:
        """The network as an einsum equation (one letter per index) and its operand shapes."""
        import opt_einsum as oe

        letters = {index: oe.get_symbol(k) for k, (index, _) in enumerate(self.sizes)}
        equation = ",".join("".join(letters[i] for i in indices) for _, indices in self.tensors) + "->"
        return equation, list(self.shapes.values())


def _network(name: str, edges: list[tuple[int, int]], count: int, bond: int,
             extra: dict[int, list[tuple[str, int]]] | None = None) -> Network:
    indices: dict[int, list[str]] = {k: [] for k in range(count)}
    sizes: list[tuple[str, int]] = []
    for number, (a, b) in enumerate(edges):
        label = f"e{number}"
        indices[a].append(label)
        indices[b].append(label)
        sizes.append((label, bond))
    for k, more in (extra or {}).items():
        for label, size in more:
            indices[k].append(label)
            if label not in dict(sizes):
                sizes.append((label, size))
    return Network(name, tuple((f"T{k}", tuple(indices[k])) for k in range(count)), tuple(sizes))


def grid(side: int, bond: int) -> Network:
    """An open-boundary side x side square lattice, bond ``bond`` on every edge."""
    edges = [(r * side + c, r * side + c + 1) for r in range(side) for c in range(side - 1)]
    edges += [(r * side + c, (r + 1) * side + c) for r in range(side - 1) for c in range(side)]
    return _network(f"grid {side}x{side} bond {bond}", edges, side * side, bond)


def ring(count: int, bond: int = 16) -> Network:
    """trace(A0 A1 ... A_{N-1}) of ``count`` bond x bond matrices."""
    return _network(f"ring N={count} bond {bond}", [(k, (k + 1) % count) for k in range(count)], count, bond)


def mps(sites: int, bond: int, physical: int = 2) -> Network:
    """<psi|psi> of an open-boundary MPS: ket tensors 0..n-1, bra tensors n..2n-1 sharing physical indices."""
    edges = [(k, k + 1) for k in range(sites - 1)] + [(sites + k, sites + k + 1) for k in range(sites - 1)]
    extra = {k: [(f"p{k}", physical)] for k in range(sites)}
    extra.update({sites + k: [(f"p{k}", physical)] for k in range(sites)})
    return _network(f"mps norm n={sites} bond {bond}", edges, 2 * sites, bond, extra)


def random_regular(count: int, degree: int, bond: int, seed: int = 0) -> Network:
    """A random ``degree``-regular graph on ``count`` nodes (configuration model, no loops or multi-edges)."""
    rng = random.Random(seed)
    while True:
        stubs = [k for k in range(count) for _ in range(degree)]
        rng.shuffle(stubs)
        edges = [(min(a, b), max(a, b)) for a, b in zip(stubs[0::2], stubs[1::2])]
        if all(a != b for a, b in edges) and len(set(edges)) == len(edges):
            return _network(f"random {degree}-regular n={count} bond {bond}", sorted(edges), count, bond)


def networks(quick: bool = False, full: bool = False) -> list[Network]:
    """The benchmark's networks (``quick``: the 4x4 grids and the rings; ``full``: three larger ones)."""
    found = [grid(4, 8), grid(4, 16), ring(12), ring(50)]
    if not quick:
        found += [grid(5, 8), mps(16, 16), random_regular(24, 3, 8)]
    if full:
        found += [grid(5, 4), mps(17, 32), random_regular(30, 3, 4, seed=1)]
    return found


def reference_flops(network: Network, seconds: float) -> tuple[float | None, str]:
    """(FLOPs, name) of an independent good path: cotengra's HyperOptimizer when cotengra is installed (the
    ``bench`` extra), else opt_einsum's exact 'dp' for networks of at most 16 tensors, else (None, '')."""
    import opt_einsum as oe

    equation, shapes = network.equation()
    try:
        import cotengra as ctg
    except ImportError:
        if len(shapes) > 16:
            return None, ""
        optimizer: object = oe.DynamicProgramming(minimize="flops", cost_cap=True)
        name = "dp"
    else:
        optimizer = ctg.HyperOptimizer(max_time=seconds, max_repeats=1024, minimize="flops", progbar=False,
                                       parallel=False)
        name = "cotengra"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cotengra's note that optional optimisers (kahypar, optuna) are missing
        _, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimizer)
    return float(info.opt_cost), name


def forward(network: Network) -> tuple[float, float, str]:
    """(planned FLOPs at default settings, planning seconds, the optimizer the report names)."""
    program = ef.compile(network.text)
    report = program.plan(network.shapes)
    step = next(step for step in report.steps if step.kind == "contract")
    assert step.path is not None
    name = re.sub(r" \(\d+ trials\)", "", step.path.optimizer).replace("subtree refinement", "refinement")
    return float(report.flops), report.planning_seconds, name


def gradient_ratio(network: Network, wrt: list[str]) -> float:
    """Planned FLOPs of the gradient program w.r.t. ``wrt`` divided by the forward's (default settings)."""
    program = ef.compile(network.text)
    forward_flops = program.plan(network.shapes).flops
    derivative = ef.grad(program, wrt=wrt if len(wrt) > 1 else wrt[0])
    return derivative.plan(network.shapes).flops / forward_flops


def measure(network: Network, seconds: float) -> dict[str, object]:
    """One network's row: default FLOPs, optimizer, planning time, reference FLOPs, gradient ratios."""
    flops, planning, optimizer = forward(network)
    reference, name = reference_flops(network, seconds)
    names = [tensor for tensor, _ in network.tensors]
    # the gradient w.r.t. one tensor: a corner (first) and a middle one, the larger ratio
    one = max(gradient_ratio(network, [names[0]]), gradient_ratio(network, [names[len(names) // 2]]))
    every = gradient_ratio(network, names) if network.name.startswith("ring") else None
    return {"network": network.name, "tensors": len(names), "flops": flops, "optimizer": optimizer,
            "planning": planning, "reference": reference, "reference_name": name,
            "ratio": flops / reference if reference else None, "one": one, "every": every}


def table(results: list[dict[str, object]]) -> str:
    lines = ["| network | tensors | default FLOPs | optimizer | planning | reference FLOPs | default / reference | "
             "grad(one) / fwd | grad(all) / fwd |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        reference = f"{r['reference']:.3g} ({r['reference_name']})" if r["reference"] else "n/a"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "n/a"
        every = f"{r['every']:.1f}" if r["every"] is not None else ""
        lines.append(f"| {r['network']} | {r['tensors']} | {r['flops']:.3g} | {r['optimizer']} | "
                     f"{r['planning']:.2f} s | {reference} | {ratio} | {r['one']:.2f} | {every} |")
    return "\n".join(lines)


def run(repeat: int = 1, quick: bool = False, seconds: float | None = None) -> tuple[str, list[Row]]:
    """The table (text) and the rows of run_all's combined table (targets: 1.5x the reference, 3x forward)."""
    seconds = seconds if seconds is not None else (1.0 if quick else 2.0)
    results = []
    rows = []
    for network in networks(quick):
        r = measure(network, seconds)
        results.append(r)
        if r["ratio"] is not None:
            rows.append(Row("networks", f"{network.name}: default path FLOPs", f"{r['flops']:.3g}",
                            f"{r['reference_name']} path", float(r["ratio"]), 1.5))  # type: ignore[arg-type]
        rows.append(Row("networks", f"{network.name}: grad w.r.t. one tensor", f"{r['one']:.2f}x fwd FLOPs",
                        "forward FLOPs", float(r["one"]), 3.0))  # type: ignore[arg-type]
    return table(results), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 4x4 grids and the rings only")
    parser.add_argument("--full", action="store_true", help="also a 5x5 grid of bond 4, a longer MPS, a larger graph")
    parser.add_argument("--seconds", type=float, default=2.0, help="cotengra's time budget per network")
    parser.add_argument("--scale", action="store_true",
                        help="issue 27 item 2: default paths vs cotengra at the same budget, all-input gradient "
                             "FLOPs, and their time against jax.jit(jax.grad)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of each search (--scale)")
    parser.add_argument("--rounds", type=int, default=21, help="timed calls of each side (--scale)")
    args = parser.parse_args()
    if args.scale:
        scale_main(args.seeds, args.rounds)
        return
    print(f"Measured {machine()}\n", flush=True)
    results = []
    for network in networks(args.quick, args.full):
        results.append(measure(network, args.seconds))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print("\n" + table(results))



# ---------------------------------------------------------------- issue 27 item 2: big networks, all-input gradients

def scale_networks() -> list[Network]:
    """The networks of issue 27 item 2 (and the 60-node graph of tests/test_networks.py, small enough to run)."""
    return [grid(6, 4), grid(10, 2), random_regular(60, 3, 2, seed=1), random_regular(200, 3, 2)]


def versus_cotengra(network: Network, seeds: int) -> dict[str, object]:
    """einflow's default path search (einflow.engine.paths, uncached) at ``seeds`` seeds of its cotengra search,
    and cotengra's own HyperOptimizer at its defaults given, seed for seed, the same trials and seconds."""
    import random
    import statistics
    import time

    import cotengra as ctg
    import opt_einsum as oe

    from einflow.engine import paths
    from einflow.lang import trees

    equation, shapes = network.equation()
    ours, theirs, budgets = [], [], []
    for seed in range(seeds):
        trees.HYPER_SEED = seed
        try:
            _, _, choice = paths._auto(equation, tuple(tuple(s) for s in shapes))
        finally:
            trees.HYPER_SEED = 0
        trials = trees.hyper_trials(len(shapes))
        ours.append(choice.flops)
        budgets.append((trials, choice.seconds))
        state = random.getstate()
        random.seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimizer = ctg.HyperOptimizer(minimize="flops", max_repeats=trials, max_time=choice.seconds,
                                           parallel=False, progbar=False, seed=seed)
            start = time.perf_counter()
            _, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimizer)
            theirs.append((int(info.opt_cost), time.perf_counter() - start))
        random.setstate(state)
    return {"network": network.name, "ours": ours, "theirs": [f for f, _ in theirs], "budgets": budgets,
            "their_seconds": [s for _, s in theirs],
            "best": min(ours) / min(f for f, _ in theirs),
            "median": statistics.median(ours) / statistics.median([f for f, _ in theirs])}


def all_gradient_ratio(network: Network) -> tuple[float, float, float, float]:
    """(forward FLOPs, all-input gradient FLOPs, their ratio, derivation seconds) at default settings."""
    import time

    program = ef.compile(network.text)
    forward = program.plan(network.shapes).flops
    start = time.perf_counter()
    derivative = ef.grad(program, wrt=[name for name, _ in network.tensors])
    seconds = time.perf_counter() - start
    flops = derivative.plan(network.shapes).flops
    return float(forward), float(flops), flops / forward, seconds


def jax_gradient(network: Network) -> object:
    """``jax.jit(jax.grad)`` of the network contracted pair by pair along einflow's forward path (jnp.einsum
    per pairwise step, each with only the indices it touches)."""
    import jax
    import jax.numpy as jnp

    from einflow.engine.paths import choose_path

    equation, shapes = network.equation()
    path, _, _ = choose_path(equation, shapes)
    terms = equation.split("->")[0].split(",")

    def value(*arrays: object) -> object:
        items = list(zip(terms, arrays))
        for step in path:
            picked = [items[k] for k in step]
            for k in sorted(step, reverse=True):
                del items[k]
            (left, a), (right, b) = picked
            rest = "".join(term for term, _ in items)
            kept = "".join(dict.fromkeys(c for c in left + right if c in rest))
            letters = {c: chr(ord("a") + k) for k, c in enumerate(dict.fromkeys(left + right))}
            spec = "".join(letters[c] for c in left) + "," + "".join(letters[c] for c in right) + "->"
            items.append((kept, jnp.einsum(spec + "".join(letters[c] for c in kept), a, b)))
        return items[0][1]

    return jax.jit(jax.grad(value, argnums=tuple(range(len(terms)))))


def time_gradients(network: Network, rounds: int) -> dict[str, float]:
    """Median seconds (wall and process CPU) of einflow's all-input gradient and jax.jit(jax.grad) along the
    same path, interleaved, order alternating; first calls (compilation) excluded."""
    import statistics
    import time

    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    arrays = {name: rng.uniform(0.5, 1.5, shape) / np.sqrt(np.prod(shape)) * 2.0
              for name, shape in network.shapes.items()}
    names = [name for name, _ in network.tensors]
    ours = ef.grad(ef.compile(network.text), wrt=names)
    theirs = jax_gradient(network)
    inputs = [jax.numpy.asarray(arrays[name]) for name in names]
    first = ours(arrays)
    second = theirs(*inputs)
    for a, b in zip(first, second):  # the same gradients
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-8)

    def run_ours() -> None:
        ours(arrays)

    def run_theirs() -> None:
        jax.block_until_ready(theirs(*inputs))

    wall: dict[str, list[float]] = {"einflow": [], "jax": []}
    cpu: dict[str, list[float]] = {"einflow": [], "jax": []}
    for k in range(rounds):
        order = [("einflow", run_ours), ("jax", run_theirs)]
        for name, call in order if k % 2 == 0 else order[::-1]:
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {f"{side} {kind}": statistics.median(values[side]) for kind, values in (("wall", wall), ("cpu", cpu))
            for side in ("einflow", "jax")}


def scale_main(seeds: int, rounds: int) -> None:
    print(f"Measured {machine()}\n", flush=True)
    print("| network | einflow FLOPs by seed | cotengra FLOPs, same trials and seconds | budget (trials, s) | "
          "best / best | median / median |\n|---|---|---|---|---|---|")
    for network in [grid(6, 4), grid(10, 2), random_regular(200, 3, 2)]:
        r = versus_cotengra(network, seeds)
        budgets = ", ".join(f"{t}, {s:.1f}" for t, s in r["budgets"])  # type: ignore[attr-defined]
        print(f"| {r['network']} | {', '.join(f'{f:.3g}' for f in r['ours'])} | "  # type: ignore[attr-defined]
              f"{', '.join(f'{f:.3g}' for f in r['theirs'])} | {budgets} | {r['best']:.3f} | "  # type: ignore[attr-defined]
              f"{r['median']:.3f} |", flush=True)
    print("\n| network | forward FLOPs | grad (all inputs) FLOPs | ratio | derivation |\n|---|---|---|---|---|")
    for network in scale_networks():
        forward, flops, ratio, seconds = all_gradient_ratio(network)
        print(f"| {network.name} | {forward:.4g} | {flops:.4g} | {ratio:.4f} | {seconds:.1f} s |", flush=True)
    print("\n| network | einflow grad (wall, cpu) | jax.jit(jax.grad) (wall, cpu) | wall ratio |\n|---|---|---|---|")
    for network in scale_networks()[:3]:
        t = time_gradients(network, rounds)
        print(f"| {network.name} | {t['einflow wall'] * 1e3:.2f} ms, {t['einflow cpu'] * 1e3:.2f} ms | "
              f"{t['jax wall'] * 1e3:.2f} ms, {t['jax cpu'] * 1e3:.2f} ms | "
              f"{t['einflow wall'] / t['jax wall']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
