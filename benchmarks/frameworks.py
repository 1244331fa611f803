"""einflow inside PyTorch and JAX: training steps and Hessians against the frameworks' own autodiff.

    python benchmarks/frameworks.py          # about half a minute on 2 cores
    python benchmarks/frameworks.py --steps  # the torch training steps only
    python benchmarks/frameworks.py --large  # the training steps, also at sizes where compute dominates
    python benchmarks/frameworks.py --per-example  # torch.func per-example gradients only

1. A torch training step (forward, backward, SGD update) whose loss is an einflow program (backward:
   einflow's VJP program) against the same model in plain torch autograd: a two-layer MLP and a
   one-head attention layer, float32. Target: einflow / torch <= 1.2 per step.
2. Per-example gradients of a small MLP, ``torch.func.vmap(torch.func.grad(loss))``, einflow's loss
   (batched by an index under vmap, einflow's VJP program) against the same loss in torch operations.
3. Hessian-vector products by double backward through einflow's node against plain torch, and the
   Hessian of a logistic loss: einflow's ``ef.hessian`` program on torch tensors against
   ``torch.func.hessian``, and the same program in ``jax.jit`` against ``jax.jit(jax.hessian)``.

Every einflow result is checked against the framework's before timing. Medians of interleaved repeats;
torch runs with one intra-op thread (both sides alike).
"""

from __future__ import annotations

import functools
import platform
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

MLP = "L = sum[n,o]((tanh(X[n,i] W1[i,h] + b1[h]) W2[h,o] - Y[n,o])^2) / N"
ATTENTION = """
Q[n,d] = X[n,c] Wq[c,d]
K[m,d] = X[m,c] Wk[c,d]
S[n,m] = exp(Q[n,d] K[m,d] / 8)
Z[n] = sum[m](S[n,m])
O[n,e] = S[n,m] X[m,c] Wv[c,e] / Z[n]
L = sum[n,e]((O[n,e] - T[n,e])^2) / N
"""
LOGISTIC = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"


def interleaved(candidates: dict[str, Callable[[], Any]], repeat: int = 15, number: int = 3) -> dict[str, float]:
    for function in candidates.values():
        function()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, function in candidates.items():
            start = time.perf_counter()
            for _ in range(number):
                function()
            samples[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(values) for name, values in samples.items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def torch_steps(rows: list[tuple[str, str, str, str]], large: bool = False) -> None:
    """MLP and attention training steps; ``large`` (``--large``) at sizes where compute dominates."""
    import torch

    torch.manual_seed(0)
    n, i, h, o = (2048, 1024, 1024, 64) if large else (512, 256, 512, 16)
    data = {"X": torch.randn(n, i), "Y": torch.randn(n, o)}
    init = {"W1": torch.randn(i, h) / i ** 0.5, "b1": torch.zeros(h), "W2": torch.randn(h, o) / h ** 0.5}
    mlp = ef.compile(MLP)

    def plain_mlp(p: dict[str, Any]) -> Any:
        return ((torch.tanh(data["X"] @ p["W1"] + p["b1"]) @ p["W2"] - data["Y"]) ** 2).sum() / n

    def einflow_mlp(p: dict[str, Any]) -> Any:
        return mlp(data, N=n, **p)

    x, c = (1024, 256) if large else (256, 64)
    adata = {"X": torch.randn(x, c) / 2, "T": torch.randn(x, c)}
    ainit = {name: torch.randn(c, c) / c for name in ("Wq", "Wk", "Wv")}
    attention = ef.compile(ATTENTION)

    def plain_attention(p: dict[str, Any]) -> Any:
        X = adata["X"]
        S = torch.exp((X @ p["Wq"]) @ (X @ p["Wk"]).T / 8)
        O = (S @ (X @ p["Wv"])) / S.sum(dim=1, keepdim=True)
        return ((O - adata["T"]) ** 2).sum() / x

    def einflow_attention(p: dict[str, Any]) -> Any:
        return attention(adata, N=x, **p)

    for label, plain, mine, start in ((f"two-layer MLP {n}x{i}x{h}x{o}", plain_mlp, einflow_mlp, init),
                                      (f"attention {x}x{c}", plain_attention, einflow_attention, ainit)):
        params = {key: {k: v.clone().requires_grad_(True) for k, v in start.items()} for key in ("e", "t")}
        check_e, check_t = mine(params["e"]), plain(params["t"])
        grads_e = torch.autograd.grad(check_e, list(params["e"].values()))
        grads_t = torch.autograd.grad(check_t, list(params["t"].values()))
        assert torch.allclose(check_e, check_t, rtol=1e-4)
        for a, b in zip(grads_e, grads_t):
            assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)

        def step(loss: Callable[[Any], Any], p: dict[str, Any]) -> Callable[[], None]:
            def run() -> None:
                value = loss(p)
                grads = torch.autograd.grad(value, list(p.values()))
                with torch.no_grad():
                    for tensor, grad in zip(p.values(), grads):
                        tensor -= 1e-3 * grad
            return run

        times = interleaved({"einflow": step(mine, params["e"]), "torch": step(plain, params["t"])},
                            *((5, 1) if large else ()))
        rows.append((f"torch training step, {label}", ms(times["einflow"]), ms(times["torch"]),
                     f"{times['einflow'] / times['torch']:.2f}x"))


PER_EXAMPLE = "l = sum[o]((tanh(x[i] W1[i,h] + b1[h]) W2[h,o] + b2[o] - y[o])^2)"


def torch_per_example(rows: list[tuple[str, str, str, str]]) -> None:
    """Per-example gradients of a small MLP: ``torch.func.vmap(torch.func.grad(loss))`` over a batch.

    The einflow loss runs under ``vmap`` as one program batched by an index (its VJP program too); the
    plain loss is the same MLP in torch operations, batched by torch's own vmap rules.
    """
    import torch
    from torch.func import grad, vmap

    torch.manual_seed(2)
    loss = ef.compile(PER_EXAMPLE)
    for n, i, h, o in ((64, 32, 64, 10), (256, 128, 256, 10)):
        params = (torch.randn(i, h) / i ** 0.5, torch.zeros(h), torch.randn(h, o) / h ** 0.5, torch.zeros(o))
        xs, ys = torch.randn(n, i), torch.randn(n, o)

        def mine(W1: Any, b1: Any, W2: Any, b2: Any, x: Any, y: Any) -> Any:
            return loss(x=x, y=y, W1=W1, b1=b1, W2=W2, b2=b2)

        def plain(W1: Any, b1: Any, W2: Any, b2: Any, x: Any, y: Any) -> Any:
            return ((torch.tanh(x @ W1 + b1) @ W2 + b2 - y) ** 2).sum()

        dims = (None, None, None, None, 0, 0)
        per_example = {name: vmap(grad(f, argnums=(0, 1, 2, 3)), in_dims=dims)
                       for name, f in (("einflow", mine), ("torch", plain))}
        for a, b in zip(per_example["einflow"](*params, xs, ys), per_example["torch"](*params, xs, ys)):
            assert a.shape[0] == n and torch.allclose(a, b, rtol=1e-4, atol=1e-5)
        arguments = (*params, xs, ys)
        times = interleaved({name: functools.partial(f, *arguments) for name, f in per_example.items()})
        rows.append((f"torch.func vmap(grad) per-example gradients, MLP {n}x{i}x{h}x{o}", ms(times["einflow"]),
                     ms(times["torch"]), f"{times['einflow'] / times['torch']:.2f}x"))


def torch_second_order(rows: list[tuple[str, str, str, str]]) -> None:
    import torch

    torch.manual_seed(1)
    s, f = 2000, 200
    X = torch.randn(s, f, dtype=torch.float64) / f ** 0.5
    y = torch.sign(torch.randn(s, dtype=torch.float64))
    w0 = torch.randn(f, dtype=torch.float64)
    v = torch.randn(f, dtype=torch.float64)
    loss = ef.compile(LOGISTIC)
    hessian = ef.hessian(LOGISTIC, wrt="w")

    def plain(w: Any) -> Any:
        return torch.nn.functional.softplus(-y * (X @ w)).sum()

    def hvp_einflow() -> Any:
        w = w0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(loss(X=X, y=y, w=w), w, create_graph=True)
        return torch.autograd.grad(g, w, v)[0]

    def hvp_torch() -> Any:
        w = w0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(plain(w), w, create_graph=True)
        return torch.autograd.grad(g, w, v)[0]

    assert torch.allclose(hvp_einflow(), hvp_torch(), rtol=1e-9)
    times = interleaved({"einflow": hvp_einflow, "torch": hvp_torch})
    rows.append((f"torch HVP by double backward, logistic {s}x{f}", ms(times["einflow"]), ms(times["torch"]),
                 f"{times['einflow'] / times['torch']:.2f}x"))

    def hessian_einflow() -> Any:
        return hessian(X=X, y=y, w=w0)

    hessian_torch = torch.func.hessian(plain)
    assert torch.allclose(hessian_einflow(), hessian_torch(w0), rtol=1e-9, atol=1e-12)
    times = interleaved({"einflow": hessian_einflow, "torch": lambda: hessian_torch(w0)}, repeat=7, number=1)
    rows.append((f"torch Hessian (ef.hessian vs torch.func.hessian), logistic {s}x{f}", ms(times["einflow"]),
                 ms(times["torch"]), f"{times['einflow'] / times['torch']:.2f}x"))


def jax_second_order(rows: list[tuple[str, str, str, str]]) -> None:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(2)
    s, f = 2000, 200
    X = jnp.asarray(rng.standard_normal((s, f)) / f ** 0.5)
    y = jnp.asarray(np.sign(rng.standard_normal(s)))
    w = jnp.asarray(rng.standard_normal(f))
    hessian = ef.hessian(LOGISTIC, wrt="w")

    def plain(w: Any) -> Any:
        return jnp.sum(jnp.logaddexp(0.0, -y * (X @ w)))

    mine = jax.jit(lambda w: hessian(X=X, y=y, w=w))
    reference = jax.jit(jax.hessian(plain))
    assert np.allclose(mine(w), reference(w), rtol=1e-9, atol=1e-12)
    times = interleaved({"einflow": lambda: mine(w).block_until_ready(),
                         "jax": lambda: reference(w).block_until_ready()})
    rows.append((f"jax.jit Hessian (ef.hessian vs jax.hessian), logistic {s}x{f}", ms(times["einflow"]),
                 ms(times["jax"]), f"{times['einflow'] / times['jax']:.2f}x"))
    loss = ef.compile(LOGISTIC)
    mine_grad = jax.jit(jax.grad(lambda w: loss(X=X, y=y, w=w)))
    reference_grad = jax.jit(jax.grad(plain))
    assert np.allclose(mine_grad(w), reference_grad(w), rtol=1e-9)
    times = interleaved({"einflow": lambda: mine_grad(w).block_until_ready(),
                         "jax": lambda: reference_grad(w).block_until_ready()})
    rows.append((f"jax.jit(jax.grad) through einflow's VJP, logistic {s}x{f}", ms(times["einflow"]),
                 ms(times["jax"]), f"{times['einflow'] / times['jax']:.2f}x"))


def main() -> None:
    import jax
    import torch

    # one intra-op thread on both sides: on a shared 2-core machine torch's thread pool waits on busy cores
    torch.set_num_threads(1)
    rows: list[tuple[str, str, str, str]] = []
    start = time.perf_counter()
    if "--per-example" in sys.argv:  # torch.func per-example gradients only
        torch_per_example(rows)
    elif "--steps" in sys.argv or "--large" in sys.argv:  # the training steps only (at the larger sizes too)
        torch_steps(rows)
        if "--large" in sys.argv:
            torch_steps(rows, large=True)
    else:
        torch_steps(rows)
        torch_per_example(rows)
        torch_second_order(rows)
        jax_second_order(rows)
    print(f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
          f"jax {jax.__version__}, {platform.machine()}; {time.perf_counter() - start:.0f} s")
    print("| case | einflow | framework | einflow / framework |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
