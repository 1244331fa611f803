"""Convolutions, a conv net's HVP and an embedding gradient: einflow against torch on the CPU.

    python benchmarks/convolution.py            # reduced sizes (batch 4): about a minute on 2 cores
    python benchmarks/convolution.py --full     # the issue's sizes: conv2d (32, 64, 56, 56) * (64, 64, 3, 3)

1. conv2d, stride 1 and 2, forward and forward+backward: einflow's program, and its ``value_and_grad`` program
   (the loss and both gradients in one program, as autograd computes them), on torch tensors (the torch
   backend: each window contraction is one native convolution, ``einflow.engine.convolution``) and on numpy
   arrays (the numpy backend: the window contracted by BLAS) against ``torch.nn.functional.conv2d`` +
   autograd. float32.
2. A small conv net's HVP (einflow's ``hvp`` program) against its forward+backward (``grad``), numpy
   float64: the issue's target is 3x.
3. The gradient of an embedding lookup + contraction (vocabulary 50k) against torch autograd.

Every einflow result is checked against torch before timing. Medians of interleaved repeats.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import einflow as ef  # noqa: E402

__all__ = ["main"]

CONV = {1: "y[n,o,h,w] = x[n,c,h+r,w+s] K[o,c,r,s]", 2: "y[n,o,h,w] = x[n,c,2*h+r,2*w+s] K[o,c,r,s]"}
LOSS = "\nL = sum[n,o,h,w](T[n,o,h,w] y[n,o,h,w])"
NET = """size n,c,h,w = x
z[n,o,h,w] = x[n,c,h+r-1,w+s-1] K1[o,c,r,s]
a[n,o,h,w] = tanh(z[n,o,h,w])
u[n,m,i,j] = a[n,o,2*i+r,2*j+s] K2[m,o,r,s]
L = sum[n,m,i,j](S[n,m,i,j] u[n,m,i,j] u[n,m,i,j])"""
EMBEDDING = "y[b,o] = E[t[b], d] W[d,o]\nL = sum[b,o](Y[b,o] y[b,o])"


def interleaved(candidates: dict[str, Callable[[], Any]], repeat: int = 7) -> dict[str, tuple[float, float]]:
    """Median (wall, process CPU) seconds per call of each candidate: the candidates alternated, the order
    reversed every other round, after one warm-up call each."""
    for function in candidates.values():
        function()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in candidates}
    names = list(candidates)
    for round_ in range(repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start, cpu = time.perf_counter(), time.process_time()
            candidates[name]()
            times[name].append((time.perf_counter() - start, time.process_time() - cpu))
    return {name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
            for name, values in times.items()}


def conv_rows(x: Any, K: Any, stride: int, rng: np.random.Generator, repeat: int) -> list[str]:
    """einflow on torch tensors (the torch backend: native convolutions) and on numpy arrays (the numpy
    backend: the window contracted by BLAS after an im2col copy) against torch conv2d + autograd."""
    import torch

    F = torch.nn.functional
    forward = ef.compile(CONV[stride])
    T = torch.tensor(rng.standard_normal(tuple(F.conv2d(x, K, stride=stride).shape)), dtype=torch.float32)
    both = ef.value_and_grad(CONV[stride] + LOSS, wrt=["x", "K"])  # the loss and its gradient, one program
    xr, Kr = x.clone().requires_grad_(True), K.clone().requires_grad_(True)
    xn, Kn, Tn = x.numpy(), K.numpy(), T.numpy()

    def torch_backward() -> None:
        xr.grad = Kr.grad = None
        (F.conv2d(xr, Kr, stride=stride) * T).sum().backward()

    torch_backward()
    assert torch.allclose(forward(x=x, K=K, backend="torch"), F.conv2d(x, K, stride=stride), atol=1e-3)
    assert np.allclose(forward(x=xn, K=Kn), F.conv2d(x, K, stride=stride).numpy(), atol=1e-3)
    for backend, arrays in (("torch", {"x": x, "K": K, "T": T}), ("numpy", {"x": xn, "K": Kn, "T": Tn})):
        _, (gx, gK) = both(**arrays, backend=backend)
        assert np.allclose(np.asarray(gx), xr.grad.numpy(), atol=1e-3)
        assert np.allclose(np.asarray(gK), Kr.grad.numpy(), rtol=1e-3, atol=1e-2)
    times = interleaved({
        "einflow torch forward": lambda: forward(x=x, K=K, backend="torch"),
        "einflow numpy forward": lambda: forward(x=xn, K=Kn),
        "torch forward": lambda: F.conv2d(x, K, stride=stride),
        "einflow torch forward+backward": lambda: both(x=x, K=K, T=T, backend="torch"),
        "einflow numpy forward+backward": lambda: both(x=xn, K=Kn, T=Tn),
        "torch forward+backward": torch_backward,
    }, repeat)
    rows = []
    for what in ("forward", "forward+backward"):
        theirs, theirs_cpu = times[f"torch {what}"]
        for backend in ("torch", "numpy"):
            ours, ours_cpu = times[f"einflow {backend} {what}"]
            rows.append(f"| conv2d {tuple(x.shape)} * (64, 64, 3, 3), stride {stride}, {what}, einflow {backend} "
                        f"backend | {ours * 1e3:.0f} ms | {theirs * 1e3:.0f} ms | {ours / theirs:.2f}x | "
                        f"{ours_cpu / theirs_cpu:.2f}x |")
    return rows


def convolutions(batch: int, repeat: int) -> list[str]:
    import torch

    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((batch, 64, 56, 56)), dtype=torch.float32)
    K = torch.tensor(0.05 * rng.standard_normal((64, 64, 3, 3)), dtype=torch.float32)
    return [*conv_rows(x, K, 1, rng, repeat), *conv_rows(x, K, 2, rng, repeat)]


def conv_net_hvp() -> list[str]:
    rng = np.random.default_rng(1)
    arrays = {"x": rng.standard_normal((8, 3, 16, 16)), "K1": rng.standard_normal((8, 3, 3, 3)),
              "K2": rng.standard_normal((8, 8, 2, 2)), "S": rng.standard_normal((8, 8, 8, 8))}
    gradient = ef.grad(NET, wrt="K1")
    hvp = ef.hvp(NET, wrt="K1")
    tangent = next(name for name in hvp.inputs if name not in arrays)
    V = rng.standard_normal(arrays["K1"].shape)
    step = 1e-6
    plus, minus = dict(arrays, K1=arrays["K1"] + step * V), dict(arrays, K1=arrays["K1"] - step * V)
    numeric = (gradient(**plus) - gradient(**minus)) / (2 * step)
    assert np.allclose(hvp(**arrays, **{tangent: V}), numeric, rtol=1e-5, atol=1e-5)
    times = interleaved({"hvp": lambda: hvp(**arrays, **{tangent: V}), "grad": lambda: gradient(**arrays)}, 15)
    (ours, ours_cpu), (theirs, theirs_cpu) = times["hvp"], times["grad"]
    return [f"| conv net HVP by K1 (x (8, 3, 16, 16); same 3x3, strided 2x2), numpy | {ours * 1e3:.1f} ms | "
            f"{theirs * 1e3:.1f} ms (its forward+backward) | {ours / theirs:.2f}x | {ours_cpu / theirs_cpu:.2f}x |"]


def embedding_gradient() -> list[str]:
    import torch

    rng = np.random.default_rng(2)
    E = torch.tensor(rng.standard_normal((50_000, 128)), dtype=torch.float32)
    W = torch.tensor(rng.standard_normal((128, 64)), dtype=torch.float32)
    t = torch.tensor(rng.integers(0, 50_000, size=4096))
    Y = torch.tensor(rng.standard_normal((4096, 64)), dtype=torch.float32)
    gradient = ef.grad(EMBEDDING, wrt=["E", "W"])
    Er, Wr = E.clone().requires_grad_(True), W.clone().requires_grad_(True)

    def torch_backward() -> None:
        Er.grad = Wr.grad = None
        ((torch.nn.functional.embedding(t, Er) @ Wr) * Y).sum().backward()

    gE, gW = gradient(E=E, W=W, t=t, Y=Y, backend="torch")
    torch_backward()
    assert torch.allclose(gE, Er.grad, atol=1e-3) and torch.allclose(gW, Wr.grad, rtol=1e-3, atol=1e-1)
    times = interleaved({"einflow": lambda: gradient(E=E, W=W, t=t, Y=Y, backend="torch"), "torch": torch_backward},
                        15)
    (ours, ours_cpu), (theirs, theirs_cpu) = times["einflow"], times["torch"]
    return [f"| embedding (50k x 128) lookup of 4096 + contraction, gradient by E and W, torch backend | "
            f"{ours * 1e3:.1f} ms | {theirs * 1e3:.1f} ms | {ours / theirs:.2f}x | {ours_cpu / theirs_cpu:.2f}x |"]


def main() -> None:
    import torch

    batch = 32 if "--full" in sys.argv else 4
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| case | einflow | reference | ratio (wall) | ratio (CPU) |")
    print("|---|---|---|---|---|")
    for row in [*convolutions(batch, 5 if batch == 32 else 9), *conv_net_hvp(), *embedding_gradient()]:
        print(row, flush=True)


if __name__ == "__main__":
    main()
