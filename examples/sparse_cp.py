"""Sparse CP completion: fit a rank-3 CP model to the observed entries of a sparse 3-D tensor.

The tensor is a pydata ``sparse.COO`` (coordinates and values); W holds ones on the same pattern. The loss

    E[i,j,k] = X[i,j,k] - W[i,j,k] A[i,r] B[j,r] C[k,r]
    L = sum[i,j,k](E[i,j,k]^2)

is computed on the stored entries only: E is a sparse tensor on X's pattern, and the gradients by A, B and C
are gathers of the factors at each entry's coordinates and sums into their rows, in O(nnz x rank) — the dense
(60, 50, 40) tensor is never formed. The plan report shows FLOPs that follow nnz. Adam steps recover factors
whose error on held-out entries is printed as it falls.

Last, the plan of a graph layer ``Y[i,g] = A[i,j] H[j,f] W[f,g]`` with a sparse adjacency A shows the order of
contraction chosen from nnz: with many neighbours per node, ``H W`` first (a statement of its own) and one
gather of it per edge; with few, each edge gathers a row of H.

Run:  python examples/sparse_cp.py
"""

from __future__ import annotations

import numpy as np
import sparse

import einflow as ef

LOSS = """
E[i,j,k] = X[i,j,k] - W[i,j,k] A[i,r] B[j,r] C[k,r]
L = sum[i,j,k](E[i,j,k]^2)
"""
RANK = 3


def observed(truth: list[np.ndarray], coords: np.ndarray, shape: tuple[int, ...]) -> sparse.COO:
    """The entries of the CP tensor of ``truth`` at ``coords`` as a sparse tensor (duplicates dropped)."""
    coords = np.unique(coords, axis=1)
    values = np.einsum("nr,nr,nr->n", truth[0][coords[0]], truth[1][coords[1]], truth[2][coords[2]])
    return sparse.COO(coords, values, shape=shape)


def main(steps: int = 500, learning_rate: float = 0.05, shape: tuple[int, int, int] = (60, 50, 40),
         nnz: int = 6000) -> None:
    rng = np.random.default_rng(0)
    truth = [rng.standard_normal((size, RANK)) for size in shape]
    X = observed(truth, np.stack([rng.integers(0, n, nnz) for n in shape]), shape)
    held_out = observed(truth, np.stack([rng.integers(0, n, 500) for n in shape]), shape)
    W = sparse.COO(X.coords, np.ones(X.nnz), shape=shape)
    print(f"observed entries: {X.nnz} of {np.prod(shape)} ({100 * X.nnz / np.prod(shape):.1f}%)")

    value_and_grad = ef.value_and_grad(LOSS, wrt=["A", "B", "C"])
    factors = [0.5 * rng.standard_normal((size, RANK)) for size in shape]
    print("plan of the loss (FLOPs from nnz):")
    report = ef.compile(LOSS).plan(X=X, W=W, A=factors[0].shape, B=factors[1].shape, C=factors[2].shape)
    print(f"  total FLOPs: {report.flops:,}   (the dense loss would need about {2 * 4 * RANK * np.prod(shape):,})")

    first = [np.zeros_like(f) for f in factors]
    second = [np.zeros_like(f) for f in factors]
    for step in range(1, steps + 1):
        loss, grads = value_and_grad(X=X, W=W, A=factors[0], B=factors[1], C=factors[2])
        rate = learning_rate / (1 + step / 300)
        for f, g, m, v in zip(factors, grads, first, second):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            f -= rate * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
        if step % 100 == 0 or step == 1:
            c = held_out.coords
            predicted = np.einsum("nr,nr,nr->n", factors[0][c[0]], factors[1][c[1]], factors[2][c[2]])
            error = np.linalg.norm(predicted - held_out.data) / np.linalg.norm(held_out.data)
            print(f"step {step:4d}  loss {float(loss):12.6f}  held-out relative error {error:.4f}")
    print(f"final held-out relative error: {error:.4f}")


def graph_layer_order(nodes: int = 2000, features: int = 64, out: int = 16) -> None:
    """The plan of ``A H W`` for a dense-ish and a very sparse adjacency: the first step shows the order."""
    import scipy.sparse as sp

    layer = ef.compile("Y[i,g] = A[i,j] H[j,f] W[f,g]")
    for neighbours in (20, 0.2):
        A = sp.random_array((nodes, nodes), density=neighbours / nodes, random_state=0, format="csr")
        report = layer.plan(A=A, H=(nodes, features), W=(features, out))
        first = report.steps[0]
        print(f"{neighbours} neighbours a node (nnz {A.nnz}): first step {first.kind} {first.equation}, "
              f"total FLOPs {report.flops:,} (each edge times H W: {2 * A.nnz * features * out:,})")


if __name__ == "__main__":
    main()
    graph_layer_order()
