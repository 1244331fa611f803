"""Sparse operands (issue 36): the CP gradient, MTTKRP and SpMM with scipy / pydata sparse inputs.

1. the CP gradient by A, B and C of the loss on the observed entries of a sparse (2000, 1500, 1000) tensor
   (``E = X - W A B C`` on X's pattern, ``L = sum(E^2)``), rank 16: einflow vs a hand-written numpy gradient with
   sorted segment sums (argsort once per mode, ``np.add.reduceat``), and the peak memory each allocates
   (tracemalloc) beyond the inputs;
2. one MTTKRP ``M[i,r] = X[i,j,k] B[j,r] C[k,r]``: einflow vs ``sparse.einsum``;
3. SpMM of a 100k x 100k CSR matrix with nnz = 1e6 and a (100k, 32) block: einflow vs scipy's ``A @ X``;
4. the shape of pytorch#41128 at 1/10 scale (a torch sparse COO n x n matrix, n = 11,000, nnz = 86,000, times a
   dense (n, 200) block, ``.sum()``, backward by both): the resident memory the forward and the backward each add
   (peak RSS, /proc/self/status VmHWM reset before each), einflow on the torch backend vs ``torch.sparse.mm``,
   each phase in a process of its own.

Candidates are timed interleaved (medians), by wall time and by the process's CPU time.
5. ``S[i,j] B[j,k] C[k,f]`` in the order of contraction chosen from nnz against each dense factor gathered alone.

Run: python -m benchmarks.sparse_operands [--quick] [--torch] [--order]   (--quick: nnz 1e5 in the CP and MTTKRP
rows; --torch, --order: that row alone)
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import numpy as np
import scipy.sparse as sp
import sparse

import einflow as ef
from benchmarks.common import compare, machine, ratio, seconds

LOSS = """
E[i,j,k] = X[i,j,k] - W[i,j,k] A[i,r] B[j,r] C[k,r]
L = sum[i,j,k](E[i,j,k]^2)
"""


def hand_cp_gradient(X: sparse.COO, A: np.ndarray, B: np.ndarray, C: np.ndarray) -> list[np.ndarray]:
    """dL/dA, dL/dB, dL/dC by hand: gathers at the coordinates, then sorted segment sums per mode."""
    i, j, k = X.coords
    Ai, Bj, Ck = A[i], B[j], C[k]
    e = X.data - np.einsum("nr,nr,nr->n", Ai, Bj, Ck)
    grads = []
    for rows, (P, Q), n in ((i, (Bj, Ck), A.shape[0]), (j, (Ai, Ck), B.shape[0]), (k, (Ai, Bj), C.shape[0])):
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        contributions = (-2 * e)[order, None] * P[order] * Q[order]
        G = np.zeros((n, A.shape[1]))
        G[ordered[starts]] = np.add.reduceat(contributions, starts, axis=0)
        grads.append(G)
    return grads


def peak(function: Any) -> int:
    """Bytes the call allocates at its peak (tracemalloc: numpy reports its arrays to it)."""
    tracemalloc.start()
    function()
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return top


def timed(candidates: dict[str, Any], repeat: int) -> tuple[dict[str, float], dict[str, float]]:
    return compare(candidates, repeat=repeat), compare(candidates, repeat=repeat, clock=time.process_time)


def cp_row(nnz: int, rank: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    shape = (2000, 1500, 1000)
    X = sparse.COO(np.stack([rng.integers(0, n, nnz) for n in shape]), rng.standard_normal(nnz), shape=shape)
    W = sparse.COO(X.coords, np.ones(X.nnz), shape=shape)
    A, B, C = (rng.standard_normal((n, rank)) for n in shape)
    gradient = ef.grad(LOSS, wrt=["A", "B", "C"])
    ours = gradient(X=X, W=W, A=A, B=B, C=C)
    theirs = hand_cp_gradient(X, A, B, C)
    error = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(ours, theirs))
    candidates = {"einflow": lambda: gradient(X=X, W=W, A=A, B=B, C=C),
                  "hand numpy (sorted segment sums)": lambda: hand_cp_gradient(X, A, B, C)}
    wall, cpu = timed(candidates, repeat)
    budget = 4 * X.nnz * rank * 8
    print(f"\n### CP gradient by A, B, C: shape {shape}, nnz {X.nnz:,}, rank {rank} (relative difference {error:.1e})")
    print("| candidate | wall | CPU | peak memory beyond the inputs |")
    print("|---|---|---|---|")
    for name in candidates:
        print(f"| {name} | {seconds(wall[name])} | {seconds(cpu[name])} | {peak(candidates[name]) / 2**20:.0f} MiB |")
    print(f"einflow / hand: wall {ratio(wall['einflow'] / wall['hand numpy (sorted segment sums)'])}, CPU "
          f"{ratio(cpu['einflow'] / cpu['hand numpy (sorted segment sums)'])}; the issue's budget 4 nnz x rank x 8 "
          f"bytes = {budget / 2**20:.0f} MiB")


def mttkrp_row(nnz: int, rank: int, repeat: int) -> None:
    rng = np.random.default_rng(1)
    shape = (2000, 1500, 1000)
    X = sparse.COO(np.stack([rng.integers(0, n, nnz) for n in shape]), rng.standard_normal(nnz), shape=shape)
    B, C = rng.standard_normal((shape[1], rank)), rng.standard_normal((shape[2], rank))
    program = ef.compile("M[i,r] = X[i,j,k] B[j,r] C[k,r]")
    expected = sparse.einsum("ijk,jr,kr->ir", X, B, C)
    expected = expected.todense() if hasattr(expected, "todense") else np.asarray(expected)
    error = float(np.abs(program(X=X, B=B, C=C) - expected).max() / np.abs(expected).max())
    candidates = {"einflow": lambda: program(X=X, B=B, C=C),
                  "sparse.einsum": lambda: sparse.einsum("ijk,jr,kr->ir", X, B, C)}
    wall, cpu = timed(candidates, repeat)
    print(f"\n### MTTKRP: shape {shape}, nnz {X.nnz:,}, rank {rank} (relative difference {error:.1e})")
    for name in candidates:
        print(f"- {name}: wall {seconds(wall[name])}, CPU {seconds(cpu[name])}")
    print(f"sparse.einsum / einflow: wall {ratio(wall['sparse.einsum'] / wall['einflow'])}, "
          f"CPU {ratio(cpu['sparse.einsum'] / cpu['einflow'])}")


def spmm_row(repeat: int) -> None:
    rng = np.random.default_rng(2)
    n, nnz = 100_000, 1_000_000
    A = sp.coo_array((rng.standard_normal(nnz), (rng.integers(0, n, nnz), rng.integers(0, n, nnz))),
                     shape=(n, n)).tocsr()
    H = rng.standard_normal((n, 32))
    program = ef.compile("Y[i,f] = A[i,j] H[j,f]")
    error = float(np.abs(program(A=A, H=H) - A @ H).max())
    candidates = {"einflow": lambda: program(A=A, H=H), "scipy A @ X": lambda: A @ H}
    wall, cpu = timed(candidates, repeat)
    print(f"\n### SpMM: {n:,} x {n:,} CSR, nnz {A.nnz:,}, times ({n:,}, 32) (max difference {error:.1e})")
    for name in candidates:
        print(f"- {name}: wall {seconds(wall[name])}, CPU {seconds(cpu[name])}")
    print(f"einflow / scipy: wall {ratio(wall['einflow'] / wall['scipy A @ X'])}, "
          f"CPU {ratio(cpu['einflow'] / cpu['scipy A @ X'])}")


def order_row(repeat: int) -> None:
    """``S[i,j] B[j,k] C[k,f]`` in the order chosen from nnz against every dense factor gathered alone (the grouped
    order switched off: ``einflow.engine.sparse_order.GAIN = 0`` while that program is first rewritten)."""
    from einflow.engine import sparse_order

    n, k, f = 2000, 64, 32
    rng = np.random.default_rng(4)
    B, C = rng.standard_normal((n, k)), rng.standard_normal((k, f))
    print(f"\n### Order of contraction: y[i,f] = S[i,j] B[j,k] C[k,f], S {n:,} x {n:,} CSR, k {k}, f {f}")
    print("| nnz | plan FLOPs chosen / gathered | CPU time chosen / gathered |")
    print("|---|---|---|")
    for density in (0.01, 0.0002):
        S = sp.random_array((n, n), density=density, random_state=0, format="csr")
        saved, sparse_order.GAIN = sparse_order.GAIN, 0.0
        try:  # (a text of its own: compiled programs are cached by their text)
            gathered = ef.compile(f"y[i,g] = S[i,j] B[j,k] C[k,g]  # {density}")
            gathered(S=S, B=B, C=C)
        finally:
            sparse_order.GAIN = saved
        chosen = ef.compile(f"y[i,f] = S[i,j] B[j,k] C[k,f]  # {density}")
        np.testing.assert_allclose(chosen(S=S, B=B, C=C), gathered(S=S, B=B, C=C), atol=1e-9)
        flops = chosen.plan(S=S, B=B, C=C).flops, gathered.plan(S=S, B=B, C=C).flops
        arrays = {"S": S, "B": B, "C": C}
        candidates = {"chosen": functools.partial(chosen, **arrays), "gathered": functools.partial(gathered, **arrays)}
        cpu = compare(candidates, repeat=repeat, clock=time.process_time)
        print(f"| {S.nnz:,} | {flops[0]:,} / {flops[1]:,} | {ratio(cpu['chosen'] / cpu['gathered'])} "
              f"({seconds(cpu['chosen'])} / {seconds(cpu['gathered'])}) |")


def _resident() -> tuple[int, int]:
    """(resident bytes now, the peak since the last reset) of this process (Linux)."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def torch_phase(candidate: str, phase: str) -> int:
    """Bytes of resident memory the forward (``phase`` "forward") or the backward adds at its peak, for the
    pytorch#41128 shape at 1/10 scale; run in a process of its own (``--torch-phase CANDIDATE PHASE``)."""
    import torch

    torch.set_num_threads(1)
    n, nnz, columns = 11_000, 86_000, 200
    rng = np.random.default_rng(3)
    rows, cols = rng.integers(0, n, nnz), rng.integers(0, n, nnz)
    X = torch.sparse_coo_tensor(np.stack([rows, cols]), torch.randn(nnz), (n, n)).coalesce().requires_grad_(True)
    Y = torch.randn((n, columns), requires_grad=True)
    program = ef.compile("L = sum[i,f](X[i,j] Y[j,f])")

    def forward() -> Any:
        return program(X=X, Y=Y) if candidate == "einflow" else torch.sparse.mm(X, Y).sum()

    small = torch.sparse_coo_tensor([[0, 1], [1, 0]], torch.randn(2), (2, 2)).coalesce().requires_grad_(True)
    if candidate == "einflow":  # the modules a first call imports, loaded before the measured call
        program(X=small, Y=torch.randn((2, 3), requires_grad=True)).backward()
    else:
        torch.sparse.mm(small, torch.randn((2, 3), requires_grad=True)).sum().backward()
    if phase == "backward":
        loss = forward()
    open("/proc/self/clear_refs", "w").write("5")  # the peak resident size starts again from now
    start, _ = _resident()
    if phase == "forward":
        loss = forward()
    else:
        loss.backward()
        assert X.grad is not None and Y.grad is not None
    return _resident()[1] - start


def torch_backward_row() -> None:
    """Forward and backward memory of the pytorch#41128 shape at 1/10 scale, each phase in a fresh process."""
    found: dict[tuple[str, str], int] = {}
    for candidate in ("einflow", "torch.sparse.mm"):
        for phase in ("forward", "backward"):
            done = subprocess.run([sys.executable, "-m", "benchmarks.sparse_operands", "--torch-phase", candidate,
                                   phase], capture_output=True, text=True, check=True)
            found[candidate, phase] = int(done.stdout.split()[-1])
    print("\n### pytorch#41128 at 1/10 scale: torch sparse COO 11,000 x 11,000, nnz 86,000, times (11,000, 200), "
          "sum, backward by both")
    print("| candidate | forward adds | backward adds | backward / forward |")
    print("|---|---|---|---|")
    for candidate in ("einflow", "torch.sparse.mm"):
        forward, backward = found[candidate, "forward"], found[candidate, "backward"]
        print(f"| {candidate} | {forward / 2**20:.0f} MiB | {backward / 2**20:.0f} MiB | "
              f"{ratio(backward / max(forward, 1))} |")


def main() -> None:
    if "--torch-phase" in sys.argv:
        at = sys.argv.index("--torch-phase")
        print(torch_phase(sys.argv[at + 1], sys.argv[at + 2]))
        return
    quick = "--quick" in sys.argv
    print(f"## Sparse operands ({machine()})")
    if "--torch" in sys.argv:  # the pytorch#41128 row alone
        torch_backward_row()
        return
    if "--order" in sys.argv:  # the order-of-contraction row alone
        order_row(15)
        return
    nnz = 100_000 if quick else 1_000_000
    repeat = 3 if quick else 5
    cp_row(nnz, 16, repeat)
    mttkrp_row(nnz, 16, repeat)
    spmm_row(repeat)
    order_row(15)
    torch_backward_row()


if __name__ == "__main__":
    main()
