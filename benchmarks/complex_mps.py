"""The gradient of a complex MPS energy <psi|H|psi> / <psi|psi> against jax.jit(jax.grad) (issue 35).

L = 16 sites, bond dimension 16, physical dimension 2, the transverse-field Ising chain as a nearest-neighbour
MPO (bond 3); complex128 site tensors. einflow: ``ef.grad(energy, wrt=[A1, ..., A16])`` on numpy arrays (PyTorch's
convention, dE/dRe + i dE/dIm); jax: ``jax.jit(jax.grad(energy, argnums=all))`` of the same contraction order in
jax.numpy, whose answer is the conjugate (checked before timing). One pinned core for both sides, paired and
interleaved (the order alternates), medians of the times and of the per-pair ratios. Target: einflow / jax <= 1.0.

Each call's minor page faults are counted too (``getrusage``). On this machine (glibc), once jax (or scipy.linalg)
is imported, glibc gives the top of the heap back to the system as each einflow call frees its intermediates, and
the next call faults those pages in again (400-500 faults per call, 1-2 ms); the same process before that import
runs the same plan without a fault. ``--steady-heap`` fixes glibc's trim and mmap thresholds (``mallopt``) for the
whole process, both sides alike, before anything is timed, so that neither gives memory back between calls; the
default leaves the allocator as it is.

Run:  taskset -c 0 python benchmarks/complex_mps.py [repeat] [--steady-heap]
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import statistics
import sys
import time
from pathlib import Path

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine, ratio, seconds  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["main", "energy_program"]

SITES, BOND, PHYSICAL, FIELD = 16, 16, 2, 1.0


def energy_program(sites: int = SITES) -> str:
    """<psi|H|psi> / <psi|psi>, contracted site by site from the left (as examples/mps_ground_state.py)."""
    lines = ["N1[b,c] = conj(A1[s,b]) A1[s,c]", "E1[b,w,c] = conj(A1[s,b]) M1[w,s,t] A1[t,c]"]
    for k in range(2, sites):
        lines.append(f"N{k}[b,c] = N{k - 1}[a,e] conj(A{k}[a,s,b]) A{k}[e,s,c]")
        lines.append(f"E{k}[b,w,c] = E{k - 1}[a,v,e] conj(A{k}[a,s,b]) M{k}[v,w,s,t] A{k}[e,t,c]")
    lines.append(f"norm = real(N{sites - 1}[a,e] conj(A{sites}[a,s]) A{sites}[e,s])")
    lines.append(f"f = real(E{sites - 1}[a,v,e] conj(A{sites}[a,s]) M{sites}[v,s,t] A{sites}[e,t]) / norm")
    return "\n".join(lines)


def mpo(sites: int = SITES) -> list[np.ndarray]:
    """H = -sum Z_k Z_k+1 - g sum X_k as MPO tensors W[left, right, s, t] (bond 3); the ends as W[w,s,t]."""
    X, Z, I2 = np.array([[0.0, 1.0], [1.0, 0.0]]), np.diag([1.0, -1.0]), np.eye(2)
    W = np.zeros((3, 3, 2, 2))
    W[0, 0], W[1, 0], W[2, 0] = I2, Z, -FIELD * X
    W[2, 1], W[2, 2] = -Z, I2
    return [W[2]] + [W] * (sites - 2) + [W[:, 0]]


def arrays(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the site tensors A1..AL, the MPO tensors M1..ML)."""
    rng = np.random.default_rng(seed)
    shapes = [(PHYSICAL, BOND)] + [(BOND, PHYSICAL, BOND)] * (SITES - 2) + [(BOND, PHYSICAL)]
    sites = {
        f"A{k + 1}": (rng.normal(size=s) + 1j * rng.normal(size=s)) / np.sqrt(2 * BOND) for k, s in enumerate(shapes)
    }
    return sites, {f"M{k + 1}": w for k, w in enumerate(mpo())}


def steady_heap() -> bool:
    """Keep freed memory in the process (glibc: trim threshold 256 MiB, mmap threshold 32 MiB); False elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
    return bool(libc.mallopt(M_TRIM_THRESHOLD, 256 << 20)) and bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20))


def jax_energy(jnp):  # type: ignore[no-untyped-def]
    """The same contraction in jax.numpy: f(sites..., mpos...)."""

    def energy(sites, mpos):  # type: ignore[no-untyped-def]
        A, M = sites, mpos
        N = jnp.einsum("sb,sc->bc", jnp.conj(A[0]), A[0])
        E = jnp.einsum("sb,wst,tc->bwc", jnp.conj(A[0]), M[0], A[0])
        for k in range(1, SITES - 1):
            N = jnp.einsum("ae,asb,esc->bc", N, jnp.conj(A[k]), A[k])
            E = jnp.einsum("ave,asb,vwst,etc->bwc", E, jnp.conj(A[k]), M[k], A[k])
        norm = jnp.real(jnp.einsum("ae,as,es->", N, jnp.conj(A[-1]), A[-1]))
        return jnp.real(jnp.einsum("ave,as,vst,et->", E, jnp.conj(A[-1]), M[-1], A[-1])) / norm

    return energy


def main(repeat: int = 21, steady: bool = False) -> None:
    heap = "glibc thresholds fixed (--steady-heap)" if steady and steady_heap() else "allocator as it is"
    import jax

    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    sites, mpos = arrays()
    names = list(sites)
    gradient = ef.grad(energy_program(), wrt=names)
    data = {**sites, **mpos}
    energy = jax_energy(jnp)
    by_jax = jax.jit(jax.grad(energy))
    j_sites = [jnp.asarray(sites[n]) for n in names]
    j_mpos = [jnp.asarray(mpos[f"M{k + 1}"]) for k in range(SITES)]

    def run_einflow():  # type: ignore[no-untyped-def]
        return gradient(**data)

    def run_jax():  # type: ignore[no-untyped-def]
        return jax.block_until_ready(by_jax(j_sites, j_mpos))

    # einflow's same gradient program on jax arrays, compiled by jax.jit (its jax backend: one XLA executable)
    j_data = {f"M{k + 1}": m for k, m in enumerate(j_mpos)}
    on_jax = jax.jit(lambda s: gradient(**s, **j_data))
    j_named = dict(zip(names, j_sites))

    def run_einflow_jit():  # type: ignore[no-untyped-def]
        return jax.block_until_ready(on_jax(j_named))

    ours, theirs = run_einflow(), run_jax()
    worst = max(float(np.abs(a - np.conj(np.asarray(b))).max()) for a, b in zip(ours, theirs))
    scale = max(float(np.abs(a).max()) for a in ours)
    assert worst <= 1e-10 * scale, f"einflow and conj(jax) differ by {worst:.3g} (scale {scale:.3g})"
    jitted = max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(run_einflow_jit(), ours))
    assert jitted <= 1e-10 * scale, f"einflow under jax.jit differs by {jitted:.3g}"
    candidates = {"einflow": run_einflow, "einflow in jax.jit": run_einflow_jit, "jax": run_jax}
    # wall time, and CPU time (time.process_time: not stretched by other jobs on a shared machine)
    times = {(clock, name): [] for clock in ("wall", "cpu", "faults") for name in candidates}  # type: ignore[var-annotated]
    pairs: dict[tuple[str, str], list[float]] = {
        (clock, name): [] for clock in ("wall", "cpu") for name in ("einflow", "einflow in jax.jit")
    }
    for _ in range(3):  # warm-up
        for function in candidates.values():
            function()
    gc.collect()
    gc.disable()  # as timeit: a collection of jax's garbage is not charged to whichever call runs next
    for k in range(repeat):
        order = list(candidates.items())
        order = order[k % 3 :] + order[: k % 3]  # each candidate first, second and third in turn
        pair = {}
        for name, function in order:
            time.sleep(0.05)  # jax's runtime threads spin a while after a call: idle before each timing
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            wall, cpu = time.perf_counter(), time.process_time()
            function()
            pair["wall", name], pair["cpu", name] = time.perf_counter() - wall, time.process_time() - cpu
            pair["faults", name] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        for key, value in pair.items():
            times[key].append(value)
        for clock, name in pairs:
            pairs[clock, name].append(pair[clock, name] / pair[clock, "jax"])
    gc.enable()
    print(
        f"# complex MPS energy gradient, L = {SITES}, bond {BOND}, d = {PHYSICAL}, MPO bond 3 ({machine()}); "
        f"max |einflow - conj(jax)| = {worst:.2g}; {heap}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "minor page faults per call (median): "
        + ", ".join(f"{name} {statistics.median(times['faults', name]):.0f}" for name in candidates)
    )
    for clock in ("wall", "cpu"):
        jaxs = statistics.median(times[clock, "jax"])
        for name, label in (("einflow", "einflow ef.grad (numpy)"), ("einflow in jax.jit", "its program in jax.jit")):
            mine = statistics.median(times[clock, name])
            print(
                f"{clock:4s}: {label} {seconds(mine)}, jax.jit(jax.grad) {seconds(jaxs)}: ratio of medians "
                f"{ratio(mine / jaxs)}, median paired ratio {ratio(statistics.median(pairs[clock, name]))} "
                "(target <= 1.0)"
            )


if __name__ == "__main__":
    numbers = [argument for argument in sys.argv[1:] if argument.isdigit()]
    main(int(numbers[0]) if numbers else 21, "--steady-heap" in sys.argv[1:])
