"""Shared work: one derivative program computing several results against computing them one by one.

Rows: value_and_grad of a least-squares loss against the value program plus the gradient program
(target: at most 0.8x, since the residual is computed once); the gradients with respect to two inputs
from one program against two gradient programs; an 8-layer tanh network's gradient (per call against
hand-written numpy backpropagation, jax.jit(jax.grad) and torch autograd; and cold: derive + plan +
first call in a fresh interpreter, target under 0.5 s).

Run:  python benchmarks/shared_work.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, calibrate, combined_table, compare, machine, optional, seconds  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["LEAST_SQUARES", "network", "run", "main"]

LEAST_SQUARES = "L = sum[i,j]((A[i,k] X[k,j] - B[i,j])^2)"
LAYERS, WIDTH, BATCH = 8, 256, 256


def network(layers: int = LAYERS) -> str:
    """An MLP with tanh layers and a squared-error loss, in einflow."""
    lines = ["h1[b,i] = tanh(W1[i,j] x[b,j])"]
    lines += [f"h{k}[b,i] = tanh(W{k}[i,j] h{k - 1}[b,j])" for k in range(2, layers + 1)]
    lines.append(f"L = sum[b,i]((h{layers}[b,i] - y[b,i])^2)")
    return "\n".join(lines)


def _network_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays = {f"W{k}": rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH) for k in range(1, LAYERS + 1)}
    arrays["x"] = rng.standard_normal((BATCH, WIDTH))
    arrays["y"] = rng.standard_normal((BATCH, WIDTH))
    return arrays


def _hand_network_gradient(arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Backpropagation written by hand in numpy."""
    hidden = [arrays["x"]]
    for k in range(1, LAYERS + 1):
        hidden.append(np.tanh(hidden[-1] @ arrays[f"W{k}"].T))
    upstream = 2 * (hidden[-1] - arrays["y"])
    gradients = []
    for k in range(LAYERS, 0, -1):
        delta = upstream * (1 - hidden[k] ** 2)
        gradients.append(delta.T @ hidden[k - 1])
        upstream = delta @ arrays[f"W{k}"]
    return gradients[::-1]


_COLD = """
import json, sys, time
import numpy as np
import einflow as ef
sys.path.insert(0, {folder!r})
from shared_work import _network_arrays, network, LAYERS
arrays = _network_arrays(np.random.default_rng(0))
start = time.perf_counter()
program = ef.grad(network(), wrt=[f"W{{k}}" for k in range(1, LAYERS + 1)])
derived = time.perf_counter()
program(arrays)
done = time.perf_counter()
print(json.dumps([derived - start, done - derived]))
"""


def _cold_network_gradient(repeat: int) -> tuple[float, float]:
    """Median (derive, plan + first call) seconds, each in a fresh interpreter (imports not counted)."""
    samples = []
    for _ in range(repeat):
        code = _COLD.format(folder=str(Path(__file__).resolve().parent))
        output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        samples.append(json.loads(output.strip().splitlines()[-1]))
    total = statistics.median(derive + first for derive, first in samples)
    return total, statistics.median(derive for derive, _ in samples)


def _jax_value_and_grad(arrays: dict[str, np.ndarray]) -> Callable[[], Any] | None:
    jax = optional("jax")
    if jax is None:
        return None
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    compiled = jax.jit(jax.value_and_grad(lambda X, A, B: jnp.sum((A @ X - B) ** 2)))
    X, A, B = (jnp.asarray(arrays[n]) for n in "XAB")
    return lambda: jax.block_until_ready(compiled(X, A, B))


def _torch_value_and_grad(arrays: dict[str, np.ndarray]) -> Callable[[], Any] | None:
    torch = optional("torch")
    if torch is None:
        return None
    A, B = torch.from_numpy(arrays["A"]), torch.from_numpy(arrays["B"])
    X0 = torch.from_numpy(arrays["X"])

    def value_and_grad() -> Any:
        X = X0.clone().requires_grad_(True)
        loss = ((A @ X - B) ** 2).sum()
        loss.backward()
        return loss.detach(), X.grad

    return value_and_grad


def _network_peers(arrays: dict[str, np.ndarray]) -> dict[str, Callable[[], Any]]:
    peers: dict[str, Callable[[], Any]] = {}
    jax = optional("jax")
    if jax is not None:
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)

        def loss(weights: list[Any], x: Any, y: Any) -> Any:
            h = x
            for W in weights:
                h = jnp.tanh(h @ W.T)
            return jnp.sum((h - y) ** 2)

        compiled = jax.jit(jax.grad(loss))
        weights = [jnp.asarray(arrays[f"W{k}"]) for k in range(1, LAYERS + 1)]
        x, y = jnp.asarray(arrays["x"]), jnp.asarray(arrays["y"])
        peers["jax.jit"] = lambda: jax.block_until_ready(compiled(weights, x, y))
    torch = optional("torch")
    if torch is not None:
        weights0 = [torch.from_numpy(arrays[f"W{k}"]) for k in range(1, LAYERS + 1)]
        tx, ty = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])

        def torch_gradient() -> Any:
            weights = [W.clone().requires_grad_(True) for W in weights0]
            h = tx
            for W in weights:
                h = torch.tanh(h @ W.T)
            ((h - ty) ** 2).sum().backward()
            return [W.grad for W in weights]

        peers["torch"] = torch_gradient
    return peers


def run(repeat: int = 9) -> tuple[str, list[Row]]:
    """Time the shared-work cases; returns the section's table and its rows."""
    rng = np.random.default_rng(0)
    rows = []

    arrays = dict(A=rng.standard_normal((1500, 1000)), X=rng.standard_normal((1000, 800)),
                  B=rng.standard_normal((1500, 800)))
    both = ef.value_and_grad(LEAST_SQUARES, wrt="X")
    value, gradient = ef.compile(LEAST_SQUARES), ef.grad(LEAST_SQUARES, wrt="X")
    residual = arrays["A"] @ arrays["X"] - arrays["B"]
    got_value, got_gradient = both(arrays)
    assert np.isclose(got_value, np.sum(residual**2), rtol=1e-10)
    assert np.allclose(got_gradient, 2 * arrays["A"].T @ residual, rtol=1e-10, atol=1e-8)
    candidates: dict[str, Callable[[], Any]] = {
        "einflow": lambda: both(arrays), "reference": lambda: (value(arrays), gradient(arrays))}
    for name, peer in (("jax.jit", _jax_value_and_grad(arrays)), ("torch", _torch_value_and_grad(arrays))):
        if peer is not None:
            candidates[name] = peer
    times = compare(candidates, repeat=repeat, number=calibrate(candidates["einflow"], 0.1))
    rows.append(Row("shared work", "value_and_grad, least squares 1500x1000 @ 1000x800", seconds(times["einflow"]),
                    "value + grad programs", times["einflow"] / times["reference"], 0.8,
                    {name: times["einflow"] / times[name] for name in ("jax.jit", "torch") if name in times}))

    two = ef.grad(LEAST_SQUARES, wrt=["A", "X"])
    grad_a = ef.grad(LEAST_SQUARES, wrt="A")
    together = two(arrays)
    assert np.allclose(together[0], grad_a(arrays)) and np.allclose(together[1], gradient(arrays))
    candidates = {"einflow": lambda: two(arrays), "reference": lambda: (grad_a(arrays), gradient(arrays))}
    times = compare(candidates, repeat=repeat, number=calibrate(candidates["einflow"], 0.1))
    rows.append(Row("shared work", "grad wrt [A, X] in one program, least squares", seconds(times["einflow"]),
                    "grad A + grad X programs", times["einflow"] / times["reference"]))

    net = _network_arrays(rng)
    program = ef.grad(network(), wrt=[f"W{k}" for k in range(1, LAYERS + 1)])
    ours, hand = program(net), _hand_network_gradient(net)
    assert all(np.allclose(a, b, rtol=1e-9, atol=1e-9) for a, b in zip(ours, hand))
    candidates = {"einflow": lambda: program(net), "reference": lambda: _hand_network_gradient(net),
                  **_network_peers(net)}
    times = compare(candidates, repeat=repeat, number=calibrate(candidates["einflow"], 0.1))
    rows.append(Row("shared work", f"{LAYERS}-layer tanh net gradient, batch {BATCH}, width {WIDTH}",
                    seconds(times["einflow"]), "hand numpy backprop", times["einflow"] / times["reference"], None,
                    {name: times["einflow"] / times[name] for name in ("jax.jit", "torch") if name in times}))

    total, derive = _cold_network_gradient(max(3, repeat // 3))
    rows.append(Row("shared work", f"{LAYERS}-layer net: derive ({seconds(derive)}) + plan + first call, cold",
                    seconds(total), "budget 0.5 s", total / 0.5, 1.0))
    return combined_table(rows), rows


def main() -> None:
    table, _ = run()
    print(f"## Shared work ({machine()})\n")
    print(table)


if __name__ == "__main__":
    main()
