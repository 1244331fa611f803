"""Complex programs against jax, beside the same programs on real arrays (issue 35, deliver item 5, second half).

Each row is one einflow program text and its gradient ``ef.grad`` on numpy arrays, timed against
``jax.jit(jax.grad)`` of the same function in jax.numpy, once with float64 and once with complex128 inputs (jax's
complex gradient is the conjugate of einflow's: checked before timing). The question is whether a complex program
stays within the ratio to jax that the same real program has. One pinned core, BLAS and XLA single-threaded; the
candidates interleaved, CPU time (``time.process_time``: the machine is shared), medians.

Run:  taskset -c 0 python benchmarks/complex_vs_real.py [repeat]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine, ratio, seconds  # noqa: E402
from complex_mps import arrays as mps_arrays  # noqa: E402
from complex_mps import energy_program, jax_energy  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["main"]

MLP = "h[b,j] = tanh(W1[j,k] x[b,k])\nf = sum[b,i](abs2(W2[i,j] h[b,j]))"
BATCH, IN, HIDDEN, OUT = 64, 64, 128, 32


def _mlp_data(rng: np.random.Generator, complex_: bool) -> dict[str, np.ndarray]:
    def draw(*shape: int) -> np.ndarray:
        value = rng.normal(size=shape) / np.sqrt(shape[-1])
        return value + 1j * rng.normal(size=shape) / np.sqrt(shape[-1]) if complex_ else value

    return {"W1": draw(HIDDEN, IN), "W2": draw(OUT, HIDDEN), "x": draw(BATCH, IN)}


def _cases(jax: Any) -> list[tuple[str, str, list[str], Callable[[bool], dict[str, np.ndarray]], Callable[..., Any]]]:
    jnp = jax.numpy
    energy = jax_energy(jnp)
    sites = [f"A{k + 1}" for k in range(16)]

    def mps(complex_: bool) -> dict[str, np.ndarray]:
        site_arrays, mpos = mps_arrays()
        if not complex_:
            site_arrays = {name: np.ascontiguousarray(value.real) for name, value in site_arrays.items()}
        return {**site_arrays, **mpos}

    def mps_jax(data: dict[str, Any]) -> Any:
        grad = jax.jit(jax.grad(lambda s, m: energy(s, m)))
        s = [jnp.asarray(data[n]) for n in sites]
        m = [jnp.asarray(data[f"M{k + 1}"]) for k in range(16)]
        return lambda: grad(s, m)

    def mlp_jax(data: dict[str, Any]) -> Any:
        def f(W1: Any, W2: Any, x: Any) -> Any:
            return jnp.sum(jnp.abs(jnp.tanh(x @ W1.T) @ W2.T) ** 2)

        grad = jax.jit(jax.grad(f, argnums=(0, 1)))
        arrays = [jnp.asarray(data[n]) for n in ("W1", "W2", "x")]
        return lambda: grad(*arrays)

    return [
        ("MPS energy gradient (L 16, bond 16)", energy_program(), sites, mps, mps_jax),
        (f"MLP abs2(W2 tanh(W1 x)) gradient (batch {BATCH}, {IN}-{HIDDEN}-{OUT})", MLP, ["W1", "W2"],
         lambda complex_: _mlp_data(np.random.default_rng(1), complex_), mlp_jax),
    ]


def main(repeat: int = 15) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    print(f"# complex vs real programs against jax.jit(jax.grad), CPU time, medians of {repeat} ({machine()})")
    print("| program | dtype | einflow | jax.jit(jax.grad) | einflow / jax (median paired) |")
    print("|---|---|---|---|---|")
    for label, text, wrt, data_of, jax_of in _cases(jax):
        gradient = ef.grad(text, wrt=wrt)
        for complex_ in (False, True):
            data = data_of(complex_)
            ours = gradient(**data)
            by_jax = jax_of(data)
            theirs = by_jax()
            for a, b in zip(ours, theirs):
                assert np.allclose(a, np.conj(np.asarray(b)), rtol=1e-9, atol=1e-12), label

            def run_einflow(data: dict[str, np.ndarray] = data, gradient: ef.Program = gradient) -> Any:
                return gradient(**data)

            def run_jax(by_jax: Callable[[], Any] = by_jax) -> Any:
                return jax.block_until_ready(by_jax())

            for _ in range(3):
                run_einflow()
                run_jax()
            mine, others, pairs = [], [], []
            for k in range(repeat):
                pair = {}
                order = [("einflow", run_einflow), ("jax", run_jax)]
                for name, function in (order if k % 2 == 0 else order[::-1]):
                    time.sleep(0.02)
                    start = time.process_time()
                    function()
                    pair[name] = time.process_time() - start
                mine.append(pair["einflow"])
                others.append(pair["jax"])
                pairs.append(pair["einflow"] / pair["jax"])
            print(f"| {label} | {'complex128' if complex_ else 'float64'} | {seconds(statistics.median(mine))} | "
                  f"{seconds(statistics.median(others))} | {ratio(statistics.median(pairs))} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
