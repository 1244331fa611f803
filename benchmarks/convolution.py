"""Convolutions, a conv net's HVP and an embedding gradient: einflow against torch on the CPU.

    python benchmarks/convolution.py            # reduced sizes (batch 4): about a minute on 2 cores
    python benchmarks/convolution.py --full     # the issue's sizes: conv2d (32, 64, 56, 56) * (64, 64, 3, 3)

1. conv2d, stride 1 and 2, forward and forward+backward: einflow's program on torch tensors (a strided
   view contracted by torch.matmul; the backward is einflow's gradient program, scatter-adds included)
   against ``torch.nn.functional.conv2d`` + autograd. float32.
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


def interleaved(candidates: dict[str, Callable[[], Any]], repeat: int = 7) -> dict[str, float]:
    """Median seconds per call of each candidate, the candidates alternated (after one warm-up call each)."""
    for function in candidates.values():
        function()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, function in candidates.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def conv_rows(x: Any, K: Any, stride: int, rng: np.random.Generator) -> list[str]:
    import torch

    F = torch.nn.functional
    forward = ef.compile(CONV[stride])
    T = torch.tensor(rng.standard_normal(tuple(F.conv2d(x, K, stride=stride).shape)), dtype=torch.float32)
    gradient = ef.grad(CONV[stride] + LOSS, wrt=["x", "K"])
    xr, Kr = x.clone().requires_grad_(True), K.clone().requires_grad_(True)

    def torch_backward() -> None:
        xr.grad = Kr.grad = None
        (F.conv2d(xr, Kr, stride=stride) * T).sum().backward()

    got = forward(x=x, K=K, backend="torch")
    assert torch.allclose(got, F.conv2d(x, K, stride=stride), atol=1e-3)
    gx, gK = gradient(x=x, K=K, T=T, backend="torch")
    torch_backward()
    assert torch.allclose(gx, xr.grad, atol=1e-3) and torch.allclose(gK, Kr.grad, rtol=1e-3, atol=1e-2)
    times = interleaved({
        "einflow forward": lambda: forward(x=x, K=K, backend="torch"),
        "torch forward": lambda: F.conv2d(x, K, stride=stride),
        "einflow forward+backward": lambda: (forward(x=x, K=K, backend="torch"),
                                             gradient(x=x, K=K, T=T, backend="torch")),
        "torch forward+backward": torch_backward,
    })
    rows = []
    for what in ("forward", "forward+backward"):
        ours, theirs = times[f"einflow {what}"], times[f"torch {what}"]
        rows.append(f"| conv2d {tuple(x.shape)} * (64, 64, 3, 3), stride {stride}, {what} | "
                    f"{ours * 1e3:.0f} ms | {theirs * 1e3:.0f} ms | {ours / theirs:.2f}x |")
    return rows


def convolutions(batch: int) -> list[str]:
    import torch

    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((batch, 64, 56, 56)), dtype=torch.float32)
    K = torch.tensor(0.05 * rng.standard_normal((64, 64, 3, 3)), dtype=torch.float32)
    return [*conv_rows(x, K, 1, rng), *conv_rows(x, K, 2, rng)]


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
    times = interleaved({"hvp": lambda: hvp(**arrays, **{tangent: V}), "grad": lambda: gradient(**arrays)})
    return [f"| conv net HVP by K1 (x (8, 3, 16, 16); same 3x3, strided 2x2) | {times['hvp'] * 1e3:.1f} ms | "
            f"{times['grad'] * 1e3:.1f} ms (its forward+backward) | {times['hvp'] / times['grad']:.2f}x |"]


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
    times = interleaved({"einflow": lambda: gradient(E=E, W=W, t=t, Y=Y, backend="torch"), "torch": torch_backward})
    return [f"| embedding (50k x 128) lookup of 4096 + contraction, gradient by E and W | "
            f"{times['einflow'] * 1e3:.1f} ms | {times['torch'] * 1e3:.1f} ms | "
            f"{times['einflow'] / times['torch']:.2f}x |"]


def main() -> None:
    import torch

    batch = 32 if "--full" in sys.argv else 4
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| case | einflow | reference | ratio |")
    print("|---|---|---|---|")
    for row in [*convolutions(batch), *conv_net_hvp(), *embedding_gradient()]:
        print(row, flush=True)


if __name__ == "__main__":
    main()
