"""The memory guard: a plan whose largest intermediate exceeds ``memory_limit`` is refused before running."""

from __future__ import annotations

import os
import time
import tracemalloc

import numpy as np
import pytest

import einflow as ef
from einflow.program import default_memory_limit

try:
    from tests.corpus import CORPUS
except ImportError:  # tests/ is not a package: pytest puts it on sys.path itself
    from corpus import CORPUS

MILLION = 10**6


def test_refuses_a_huge_outer_product_before_allocating_anything() -> None:
    p = ef.compile("a[i] = exp(u[i])\nO[i,j] = a[i] v[j]")
    u = np.ones(MILLION)
    v = np.ones(MILLION)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(ef.MemoryLimitError) as error:
            p(u=u, v=v, memory_limit=100 * MILLION)  # statement 1 (8 MB) fits, statement 2 (8 TB) does not
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 30  # refused up front: computing 8 TB would not finish at all
    assert peak < 4 * MILLION  # not even statement 1's 8 MB result was allocated
    message = str(error.value)
    for expected in ("(1000000, 1000000)", "7.28 TiB", "O[i,j] = a[i] v[j]", "[i,j]", "nothing was allocated",
                     "backend='dask'", "optimize=", "memory_limit="):
        assert expected in message, expected
    assert isinstance(error.value, ef.EinflowError)


def test_the_default_limit_comes_from_available_memory() -> None:
    limit = default_memory_limit()
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < limit <= physical
    u = np.ones(MILLION)
    with pytest.raises(ef.MemoryLimitError, match="over the memory limit"):
        ef.compile("O[i,j] = u[i] v[j]")(u=u, v=u)


def test_elementwise_intermediates_are_guarded_too() -> None:
    u = np.ones(MILLION)
    with pytest.raises(ef.MemoryLimitError, match=r"sum\[i,j\]\(exp\(u\[i\] v\[j\]\)\)"):
        ef.compile("s = sum[i,j](exp(u[i] v[j]))")(u=u, v=u, memory_limit=10 * MILLION)


def test_the_limit_is_exact_and_none_turns_it_off() -> None:
    p = ef.compile("Outer[i,j] = u[i] v[j]")
    u = np.arange(1000.0)
    v = np.arange(1000.0) / 7
    needed = 1000 * 1000 * 8
    np.testing.assert_allclose(p(u=u, v=v, memory_limit=needed), np.multiply.outer(u, v))
    with pytest.raises(ef.MemoryLimitError, match=r"\(1000, 1000\)"):
        p(u=u, v=v, memory_limit=needed - 1)
    np.testing.assert_allclose(p(u=u, v=v, memory_limit=None), np.multiply.outer(u, v))


def test_a_refused_plan_is_not_cached() -> None:
    p = ef.compile("Refused[i,j] = u[i] v[j]")
    u = np.ones(300)
    with pytest.raises(ef.MemoryLimitError):
        p(u=u, v=u, memory_limit=1000)
    assert p.cache_info().plans == 0
    assert p(u=u, v=u, memory_limit=10 * MILLION).shape == (300, 300)
    with pytest.raises(ef.MemoryLimitError):  # the cached plan for one limit does not bypass another
        p(u=u, v=u, memory_limit=1000)


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_guard_agrees_with_the_plan_report(case: object) -> None:
    arrays = case.arrays()
    program = ef.compile(case.text)
    shapes = {name: np.shape(value) for name, value in arrays.items()}
    report = program.plan(**shapes)
    peak = report.peak_bytes
    assert peak >= report.largest_bytes or peak >= 8 * max(int(np.prod(s)) for s in report.output_shapes)
    expected = program(arrays, memory_limit=peak)  # the guard compares the plan's peak (all arrays alive at once)
    if peak > 0:
        with pytest.raises(ef.MemoryLimitError):
            program(arrays, memory_limit=peak - 1, slicing=False)
        try:  # sliced to fit, or refused: never a plan over the limit
            fitted = program.plan(**shapes, memory_limit=peak - 1)
        except ef.MemoryLimitError:
            return
        assert fitted.peak_bytes <= peak - 1 and fitted.sliced
        fitted_value = program(arrays, memory_limit=peak - 1)
        for got, want in zip(*((fitted_value, expected) if isinstance(expected, tuple) else
                               ((fitted_value,), (expected,)))):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------- dask
@pytest.mark.filterwarnings("ignore:Increasing number of chunks")
def test_dask_guards_what_it_gathers_on_the_client() -> None:
    pytest.importorskip("dask.array", reason="dask is not installed (pip install 'einflow[dask]')")
    u = np.ones(MILLION)
    start = time.perf_counter()
    with pytest.raises(ef.MemoryLimitError, match="client") as error:
        ef.compile("O[i,j] = u[i] v[j]")(u=u, v=u, backend="dask", memory_limit=100 * MILLION)
    assert time.perf_counter() - start < 30  # refused before computing 8 TB
    assert "(1000000, 1000000)" in str(error.value) and "'O'" in str(error.value)


def test_dask_does_not_guard_chunked_intermediates() -> None:
    pytest.importorskip("dask.array", reason="dask is not installed (pip install 'einflow[dask]')")
    rng = np.random.default_rng(0)
    A = rng.standard_normal((1000, 2)) / 4
    B = rng.standard_normal((2, 1000)) / 4
    p = ef.compile("s = sum[i,j](exp(A[i,k] B[k,j]))")
    with pytest.raises(ef.MemoryLimitError):
        p(A=A, B=B, memory_limit=MILLION)  # numpy: an 8 MB intermediate over a 1 MB limit
    result = p(A=A, B=B, backend="dask", chunks={"A": (250, 2), "B": (2, 250)}, memory_limit=MILLION)
    np.testing.assert_allclose(result, np.exp(A @ B).sum())


# ---------------------------------------------------------------------------------------------- the peak guard
def test_memory_limit_values_are_sizes_or_errors() -> None:
    from einflow.engine.memory import available_memory, memory_limit_bytes

    assert memory_limit_bytes("1GB") == 10**9 and memory_limit_bytes("100 MiB") == 100 * 2**20
    assert 0 < memory_limit_bytes("default") <= available_memory()
    p = ef.compile("G[i,j] = u[i] v[j]")
    u = np.ones(10)
    for bad in (float("nan"), [1], "lots", -5, True):
        with pytest.raises(ef.EinflowError):
            p(u=u, v=u, memory_limit=bad)
    with pytest.raises(ef.MemoryLimitError):
        p(u=u, v=u, memory_limit="500B")  # 800 bytes needed
    assert p(u=u, v=u, memory_limit="1KB").shape == (10, 10)


def test_the_guard_counts_the_result_dtype() -> None:
    p = ef.compile("F[i,j] = 0.5 b[i] b[j]")
    b = np.ones(1000, dtype=bool)
    needed = 1000 * 1000 * 8  # float64 result from bool inputs
    with pytest.raises(ef.MemoryLimitError):
        p(b=b, memory_limit=needed // 2)


# the peak resident memory of this process image (VmHWM): getrusage's ru_maxrss would keep the parent's
# (pytest's) peak across fork+exec, and a run smaller than the parent would measure nothing
_RSS_SCRIPT = """
import sys, numpy as np, einflow as ef
def peak_rss():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) * 1024
u = np.ones(4000)
base = peak_rss()
text = "A[i,j] = u[i] u[j]\\nB[i,j] = exp(A[i,j]) + A[i,j] A[j,i]\\nL = B[i,j] B[i,j]"
try:
    ef.compile(text)(u=u, memory_limit=int(sys.argv[1]))
    outcome = "ran"
except ef.MemoryLimitError:
    outcome = "refused"
peak = peak_rss()
print(outcome, peak - base)
"""


@pytest.mark.parametrize("limit_mib", [100, 1000])
def test_a_run_under_a_limit_stays_under_it_or_is_refused(limit_mib: int) -> None:
    import subprocess
    import sys

    limit = limit_mib * 2**20
    completed = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(limit)], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr
    outcome, grown = completed.stdout.split()
    assert int(grown) <= limit  # measured peak RSS growth of the run
    if limit_mib == 1000:  # the measurement sees the run: two 122 MiB arrays at least
        assert int(grown) >= 2 * 4000 * 4000 * 8, grown
    # 4000x4000 float64 arrays are 122 MiB each: 100 MiB is refused, 1000 MiB runs
    assert outcome == ("refused" if limit_mib == 100 else "ran")
