"""Large tensor networks: the FLOPs of einflow's default path vs cotengra's hyper-optimised tree, and gradients.

Networks (closed, scalar results): an L x L grid with bond D on every edge, a ring (trace of N D x D
matrices), an MPS norm <psi|psi> (N sites, bond chi, physical 2) and a random 3-regular graph with bond D.
For each: the FLOPs of the path that ``Program.plan`` reports at default settings, the FLOPs of cotengra's
HyperOptimizer tree (when cotengra is installed), their ratio, and the planning time; then, for the
gradient w.r.t. one tensor (and w.r.t. all of a ring's), the gradient program's planned FLOPs divided by
the forward's.

Run:  python benchmarks/networks.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import Row, machine  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["Network", "grid", "ring", "mps", "random_regular", "NETWORKS", "run"]


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


def networks(quick: bool = False) -> list[Network]:
    found = [grid(4, 8), grid(4, 16), grid(5, 8), ring(12), ring(50), mps(16, 16), random_regular(24, 3, 8)]
    if not quick:
        found += [grid(5, 4), mps(24, 32), random_regular(30, 3, 4, seed=1)]
    return found


NETWORKS = networks


def cotengra_flops(network: Network, seconds: float = 10.0) -> float | None:
    """FLOPs (opt_einsum's count) of cotengra's HyperOptimizer path; None without cotengra."""
    try:
        import cotengra as ctg
    except ImportError:
        return None
    import opt_einsum as oe

    equation, shapes = network.equation()
    optimizer = ctg.HyperOptimizer(max_time=seconds, max_repeats=256, minimize="flops", progbar=False,
                                   parallel=False)
    _, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimizer)
    return float(info.opt_cost)


def forward(network: Network) -> tuple[float, float, str]:
    """(planned FLOPs at default settings, planning seconds, the optimizer the report names)."""
    program = ef.compile(network.text)
    start = time.perf_counter()
    report = program.plan(network.shapes)
    seconds = time.perf_counter() - start
    step = next(step for step in report.steps if step.kind == "contract")
    return float(report.flops), seconds, getattr(step, "optimizer", "")


def gradient_ratio(network: Network, wrt: list[str]) -> float:
    """Planned FLOPs of the gradient program w.r.t. ``wrt`` divided by the forward's."""
    program = ef.compile(network.text)
    shapes = network.shapes
    forward_flops = program.plan(shapes).flops
    derivative = ef.grad(program, wrt=wrt if len(wrt) > 1 else wrt[0])
    needed = {name: shape for name, shape in shapes.items()}
    return derivative.plan(needed).flops / forward_flops


def run(repeat: int = 1, quick: bool = False, seconds: float = 5.0) -> tuple[str, list[Row]]:
    """The table of forward FLOPs vs cotengra and the gradient ratios, as text and as rows."""
    lines = ["| network | tensors | default FLOPs | optimizer | planning s | cotengra FLOPs | ratio | "
             "grad(one) / fwd | grad(all) / fwd |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for network in networks(quick):
        flops, planning, optimizer = forward(network)
        reference = cotengra_flops(network, seconds)
        ratio = flops / reference if reference else None
        names = [name for name, _ in network.tensors]
        one = gradient_ratio(network, [names[len(names) // 2]])
        every = gradient_ratio(network, names) if network.name.startswith("ring") else None
        lines.append(f"| {network.name} | {len(names)} | {flops:.3g} | {optimizer} | {planning:.2f} | "
                     f"{reference or float('nan'):.3g} | {'n/a' if ratio is None else f'{ratio:.2f}'} | {one:.2f} | "
                     f"{'' if every is None else f'{every:.2f}'} |")
        print(lines[-1], flush=True)
        if ratio is not None:
            rows.append(Row("networks", network.name, f"{flops:.3g} FLOPs", "cotengra tree", ratio))
        rows.append(Row("networks", f"{network.name}: grad one tensor", f"{one:.2f}x fwd", "forward FLOPs", one))
    return "\n".join(lines), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float, default=5.0, help="cotengra's time budget per network")
    args = parser.parse_args()
    print(f"Measured {machine()}\n")
    table, _ = run(quick=args.quick, seconds=args.seconds)
    print("\n" + table)


if __name__ == "__main__":
    main()
