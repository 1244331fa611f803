"""Differential operators (LANGUAGE.md §9.1): einflow's Laplacians, bi-Laplacian and Taylor mode against JAX and folx.

Rows (float64, one pinned core for every side: run under ``taskset -c 0``; interleaved medians, jax/folx each
in its own block, ``common.compare``):

* folx's README network (10 x Dense(100) + silu acting per node, x of shape (20, 100, 4), the value summed):
  einflow's ``laplacian`` (the nodes and samples are independent: derived per node) against folx's forward
  Laplacian with sparsity threshold 4 (``jax.jit``; dense asks for 102 GB); and the plan FLOPs over the forward's;
* Dangel et al.'s MLP 50-768-768-512-512-1 (tanh), batch 16: ``laplacian(..., batch="b")`` against
  ``jax.jit(vmap(trace(hessian)))`` and folx's dense forward Laplacian;
* the bi-Laplacian of a 5-128-128-1 and a 50-128-128-1 tanh MLP, batch 16, against nested jax (``trace(hessian)``
  twice) and against the Laplacian of einflow's Laplacian program (alternating order, per-round ratios);
* derive + plan + first call of the MLP Laplacian; batch 64 over batch 16; ``taylor`` of order 8 of a
  depth-3 network: plan FLOPs over the forward's.

Run:  taskset -c 0 python benchmarks/operators.py [--cpu]

``--cpu`` times with ``time.process_time`` (the CPU time of all the process's threads) instead of the wall clock:
on a machine shared with other jobs the wall clock stretches with their load, the CPU time much less.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np

#: the clock every row is timed with (``--cpu``: process CPU time)
CLOCK = time.process_time if "--cpu" in sys.argv[1:] else time.perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, format_table, machine, optional, ratio, seconds  # noqa: E402

import einflow as ef  # noqa: E402


def _mlp(sizes: list[int], batch: int, activation: str = "tanh", seed: int = 0) -> tuple[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    lines, previous = [], "x"
    arrays: dict[str, np.ndarray] = {"x": rng.standard_normal((batch, sizes[0]))}
    for k in range(1, len(sizes) - 1):
        inner, outer = f"j{k - 1}" if k > 1 else "k", f"j{k}"
        lines.append(f"h{k}[b,{outer}] = {activation}(W{k}[{outer},{inner}] {previous}[b,{inner}] + c{k}[{outer}])")
        arrays[f"W{k}"] = rng.standard_normal((sizes[k], sizes[k - 1])) / np.sqrt(sizes[k - 1])
        arrays[f"c{k}"] = 0.1 * rng.standard_normal(sizes[k])
        previous = f"h{k}"
    last = len(sizes) - 2
    lines.append(f"f[b] = v[j{last}] h{last}[b,j{last}]")
    arrays["v"] = rng.standard_normal(sizes[-2]) / np.sqrt(sizes[-2])
    return "\n".join(lines), arrays


def _jax_mlp(arrays: dict[str, np.ndarray], depth: int):  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    weights = {k: jnp.asarray(v) for k, v in arrays.items()}

    def f(x):  # type: ignore[no-untyped-def]
        h = x
        for k in range(1, depth + 1):
            h = jnp.tanh(weights[f"W{k}"] @ h + weights[f"c{k}"])
        return weights["v"] @ h

    return f


def _flops(program: ef.Program, arrays: dict[str, np.ndarray]) -> int:
    return program.plan(**{k: v.shape for k, v in arrays.items() if k in program.inputs}).flops


def folx_row(jax, folx, rows: list[list[str]]) -> None:  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    lines, previous, arrays = [], "x", {"x": rng.standard_normal((20, 100, 4))}
    sizes = [4] + [100] * 10
    for k in range(1, 11):
        inner, outer = (f"j{k - 1}" if k > 1 else "k"), f"j{k}"
        lines.append(f"z{k}[b,n,{outer}] = W{k}[{outer},{inner}] {previous}[b,n,{inner}] + c{k}[{outer}]")
        lines.append(f"h{k}[b,n,{outer}] = z{k}[b,n,{outer}] sigmoid(z{k}[b,n,{outer}])")  # silu
        arrays[f"W{k}"] = rng.standard_normal((sizes[k], sizes[k - 1])) / np.sqrt(sizes[k - 1])
        arrays[f"c{k}"] = 0.1 * rng.standard_normal(sizes[k])
        previous = f"h{k}"
    lines.append("L = sum[b,n](v[j10] h10[b,n,j10])")
    arrays["v"] = rng.standard_normal(100) / 10
    text = "\n".join(lines)
    laplacian = ef.laplacian(text, wrt="x")
    weights = {k: jnp.asarray(v) for k, v in arrays.items()}

    def f(x):  # type: ignore[no-untyped-def]
        h = x
        for k in range(1, 11):
            h = jax.nn.silu(h @ weights[f"W{k}"].T + weights[f"c{k}"])
        return jnp.sum(h @ weights["v"])

    x = jnp.asarray(arrays["x"])
    sparse = jax.jit(lambda u: folx.forward_laplacian(f, sparsity_threshold=4)(u).laplacian)
    np.testing.assert_allclose(laplacian(**arrays), sparse(x), rtol=1e-9)
    times = compare({"einflow": lambda: laplacian(**arrays), "jax.jit sparse": lambda: sparse(x).block_until_ready()},
                    repeat=7, isolate=("jax.jit sparse",), clock=CLOCK)
    plan = _flops(laplacian, arrays) / _flops(ef.compile(text), arrays)
    rows.append(["folx README net, Laplacian (20 x 100 nodes x 4)", seconds(times["einflow"]),
                 f"folx sparse {seconds(times['jax.jit sparse'])}", ratio(times["einflow"] / times["jax.jit sparse"]),
                 "folx dense: 102 GB, out of memory", f"plan {plan:.1f}x forward"])


def dangel_rows(jax, folx, rows: list[list[str]]) -> None:  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    sizes = [50, 768, 768, 512, 512, 1]
    text, arrays = _mlp(sizes, 16)
    f = _jax_mlp(arrays, 4)
    start = time.perf_counter()
    laplacian = ef.laplacian(text, wrt="x", batch="b")
    laplacian(**arrays)
    first = time.perf_counter() - start
    x = jnp.asarray(arrays["x"])
    hessian_trace = jax.jit(jax.vmap(lambda u: jnp.trace(jax.hessian(f)(u))))
    candidates = {"einflow": lambda: laplacian(**arrays), "jax.jit": lambda: hessian_trace(x).block_until_ready()}
    np.testing.assert_allclose(laplacian(**arrays), hessian_trace(x), rtol=1e-9)
    isolate: tuple[str, ...] = ("jax.jit",)
    if folx is not None:
        dense = jax.jit(jax.vmap(lambda u: folx.forward_laplacian(f, sparsity_threshold=0)(u).laplacian))
        np.testing.assert_allclose(laplacian(**arrays), dense(x), rtol=1e-9)
        candidates["folx"] = lambda: dense(x).block_until_ready()
        isolate += ("folx",)
    times = compare(candidates, repeat=7, isolate=isolate, clock=CLOCK)
    plan = _flops(laplacian, arrays) / _flops(ef.compile(text), arrays)
    rows.append(["MLP 50-768-768-512-512-1 Laplacian, batch 16", seconds(times["einflow"]),
                 f"jax hessian trace {seconds(times['jax.jit'])}", ratio(times["einflow"] / times["jax.jit"]),
                 f"folx dense {seconds(times['folx'])} ({ratio(times['einflow'] / times['folx'])})" if "folx" in times
                 else "-", f"plan {plan:.1f}x forward (D + 6 = 56)"])
    big = {**arrays, "x": np.random.default_rng(2).standard_normal((64, 50))}
    scale = compare({"16": lambda: laplacian(**arrays), "64": lambda: laplacian(**big)}, repeat=5, clock=CLOCK)
    rows.append(["  derive + plan + first call; batch 64 / batch 16", seconds(first), "-",
                 f"{scale['64'] / scale['16']:.2f}x", "-", "-"])


def _alternating(first, second, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """The median over ``rounds`` of first's time over second's, the two called in turn, the order alternating."""
    first(), second()
    found = []
    for k in range(rounds):
        pair = (first, second) if k % 2 == 0 else (second, first)
        spent = []
        for function in pair:
            start = CLOCK()
            function()
            spent.append(CLOCK() - start)
        found.append(spent[0] / spent[1] if k % 2 == 0 else spent[1] / spent[0])
    return float(np.median(found))


def bilaplacian_rows(jax, rows: list[list[str]]) -> None:  # type: ignore[no-untyped-def]
    """The collapsed bi-Laplacian (one fourth-order sweep) against nested jax and against the Laplacian of the
    Laplacian program (the nested forward Laplacian, einflow's form before), D = 5 and D = 50 inputs."""
    for inputs in (5, 50):
        _bilaplacian_row(jax, inputs, rows)


def _bilaplacian_row(jax, inputs: int, rows: list[list[str]]) -> None:  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    def lap(g):  # type: ignore[no-untyped-def]
        return lambda u: jnp.trace(jax.hessian(g)(u))

    text, arrays = _mlp([inputs, 128, 128, 1], 16)
    f = _jax_mlp(arrays, 2)
    bilaplacian = ef.bilaplacian(text, wrt="x", batch="b")
    twice = ef.laplacian(ef.laplacian(text, wrt="x", batch="b"), wrt="x", batch="b")
    nested = jax.jit(jax.vmap(lap(lap(f))))
    x = jnp.asarray(arrays["x"])
    np.testing.assert_allclose(bilaplacian(**arrays), nested(x), rtol=1e-8)
    np.testing.assert_allclose(twice(**arrays), nested(x), rtol=1e-8)
    times = compare({"einflow": lambda: bilaplacian(**arrays), "jax.jit": lambda: nested(x).block_until_ready()},
                    repeat=9, clock=CLOCK)
    against = _alternating(lambda: bilaplacian(**arrays), lambda: twice(**arrays), 15)
    forward = _flops(ef.compile(text), arrays)
    plan = f"plan {_flops(bilaplacian, arrays) / forward:.1f}x forward (nested {_flops(twice, arrays) / forward:.1f}x)"
    rows.append([f"bi-Laplacian {inputs}-128-128-1, batch 16", seconds(times["einflow"]),
                 f"nested jax {seconds(times['jax.jit'])}", ratio(times["einflow"] / times["jax.jit"]),
                 f"÷ Laplacian of Laplacian {against:.2f}", plan])


def taylor_row(rows: list[list[str]]) -> None:
    text, arrays = _mlp([16, 64, 64, 64, 1], 16)
    start = time.perf_counter()
    program = ef.taylor(text, wrt="x", direction="dx", order=8)
    derive = time.perf_counter() - start
    ratio_flops = program.plan(**{k: v.shape for k, v in arrays.items()}, dx=(16, 16)).flops / _flops(
        ef.compile(text), arrays)
    rows.append(["taylor order 8, depth-3 tanh MLP 16-64-64-64-1, batch 16", f"derive {seconds(derive)}", "-", "-",
                 "-", f"plan {ratio_flops:.1f}x forward (bound 45x)"])


def main() -> None:
    jax = optional("jax")
    folx = optional("folx")
    rows: list[list[str]] = []
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
        if folx is not None:
            folx_row(jax, folx, rows)
        dangel_rows(jax, folx, rows)
        bilaplacian_rows(jax, rows)
    taylor_row(rows)
    print(f"# differential operators, float64 ({machine()}; {'CPU' if CLOCK is time.process_time else 'wall'} time)")
    print(format_table(rows, ["row", "einflow", "peer", "einflow ÷ peer", "other", "plan"]))


if __name__ == "__main__":
    main()
