"""An MPS-style tensor network: the norm <psi|psi> of a matrix product state as ONE einflow product.

Written naively, the product of 2 x SITES tensors is a single loop over every index at once; einflow plans
it with opt_einsum into a chain of small pairwise contractions. The plan report shows each step's FLOPs;
the totals are compared with opt_einsum's naive cost (one loop over all indices) and with contracting
pairwise in the written order (all kets first, then the bras).

Run:  python examples/tensor_network.py
"""

from __future__ import annotations

import numpy as np
import opt_einsum as oe

import einflow as ef

SITES = 10
PHYSICAL = 2  # size of each site index s
BOND = 16  # bond dimension of the bonds a (ket) and b (bra)


def mps_norm_network(sites: int) -> list[tuple[str, tuple[str, ...]]]:
    """(tensor, indices) of <psi|psi>: the kets A1[s1,a1] A2[a1,s2,a2] ... then the bras on bonds b."""
    def chain(bond: str) -> list[tuple[str, tuple[str, ...]]]:
        refs = [("A1", ("s1", f"{bond}1"))]
        refs += [(f"A{n}", (f"{bond}{n - 1}", f"s{n}", f"{bond}{n}")) for n in range(2, sites)]
        refs.append((f"A{sites}", (f"{bond}{sites - 1}", f"s{sites}")))
        return refs
    return chain("a") + chain("b")


def transfer_matrix_norm(tensors: list[np.ndarray]) -> float:
    """Independent reference: sweep left to right with the transfer matrix E[a,b]."""
    edge = tensors[0]
    environment = edge.T @ edge  # E[a,b] = sum_s A[s,a] A[s,b]
    for tensor in tensors[1:-1]:
        environment = np.einsum("ab,asc,bsd->cd", environment, tensor, tensor)
    last = tensors[-1]
    return float(np.einsum("ab,as,bs->", environment, last, last))


def main() -> None:
    rng = np.random.default_rng(0)
    shapes = [(PHYSICAL, BOND)] + [(BOND, PHYSICAL, BOND)] * (SITES - 2) + [(BOND, PHYSICAL)]
    tensors = [rng.standard_normal(shape) / np.sqrt(BOND) for shape in shapes]
    arrays = {f"A{n + 1}": tensor for n, tensor in enumerate(tensors)}

    network = mps_norm_network(SITES)
    text = "N = " + " ".join(f"{name}[{','.join(indices)}]" for name, indices in network)
    program = ef.compile(text)
    print(text)
    print()
    report = program.plan(**{name: value.shape for name, value in arrays.items()})
    print(report)

    # the same contraction as an einsum equation, for opt_einsum's cost of other orders
    symbols: dict[str, str] = {}
    equation = ",".join("".join(symbols.setdefault(index, oe.get_symbol(len(symbols))) for index in indices)
                        for _, indices in network) + "->"
    operand_shapes = [arrays[name].shape for name, _ in network]
    _, info = oe.contract_path(equation, *operand_shapes, shapes=True)
    written_order = [(0, 1)] * (len(network) - 1)
    _, in_order = oe.contract_path(equation, *operand_shapes, shapes=True, optimize=written_order)

    value = float(program(**arrays))
    reference = transfer_matrix_norm(tensors)
    print()
    print(f"<psi|psi> = {value:.12e} (transfer-matrix reference {reference:.12e})")
    print(f"einflow plan: {report.flops:.4g} FLOPs in {report.contractions} contraction(s), "
          f"largest intermediate {report.largest_intermediate} elements")
    print(f"naive single loop over all {len(symbols)} indices: {float(info.naive_cost):.4g} FLOPs")
    print(f"pairwise in written order: {float(in_order.opt_cost):.4g} FLOPs, "
          f"largest intermediate {int(in_order.largest_intermediate)} elements")
    print(f"FLOP saving over the naive order: {float(info.naive_cost) / report.flops:.3g}x")
    print(f"FLOP saving over the written order: {float(in_order.opt_cost) / report.flops:.3g}x")


if __name__ == "__main__":
    main()
