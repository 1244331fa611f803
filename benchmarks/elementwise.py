"""Fused elementwise work: einflow against numpy and jax.jit on the same function, and memory bandwidth.

``y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])`` at 2000x2000 (float64): einflow lowers it to one
fused step, evaluated in one pass by numexpr when installed. The bandwidth fraction is the time of a
plain streaming ``A + B -> C`` (the same three arrays' worth of memory traffic) over the program's time.

Run:  python benchmarks/elementwise.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, combined_table, compare, machine, optional, seconds  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["run", "main"]

TEXT = "y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])"


def run(repeat: int = 5, n: int = 2000) -> tuple[str, list[Row]]:
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    program = ef.compile(TEXT)
    out = np.empty_like(A)

    def numpy_version() -> np.ndarray:
        e = np.exp(-np.abs(A))
        r = 1 / (1 + e)
        return np.tanh(A) * np.exp(B) + np.where(A >= 0, r, e * r)

    np.testing.assert_allclose(program(A=A, B=B), numpy_version(), rtol=1e-12, atol=1e-14)
    candidates = {"einflow": lambda: program(A=A, B=B), "numpy": numpy_version,
                  "stream": lambda: np.add(A, B, out=out)}
    jax = optional("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
        jnp = jax.numpy
        function = jax.jit(lambda a, b: jnp.tanh(a) * jnp.exp(b) + jax.nn.sigmoid(a))
        ja, jb = jnp.asarray(A), jnp.asarray(B)
        candidates["jax.jit"] = lambda: function(ja, jb).block_until_ready()
    times = compare(candidates, repeat=repeat)
    peers = {"numpy (unfused)": times["einflow"] / times["numpy"]}
    rows = []
    if "jax.jit" in times:
        rows.append(Row("elementwise", f"{TEXT} at {n}x{n} float64", seconds(times["einflow"]), "jax.jit (x64)",
                        times["einflow"] / times["jax.jit"], 1.2, peers))
    fraction = times["stream"] / times["einflow"]
    rows.append(Row("elementwise", "fraction of streaming bandwidth (A + B -> C time / program time)",
                    f"{fraction:.1%}", "np.add(A, B, out=C)", times["einflow"] / times["stream"]))
    return combined_table(rows), rows


def main() -> None:
    table, _ = run()
    print(f"## Fused elementwise work ({machine()})\n")
    print(table)


if __name__ == "__main__":
    main()
