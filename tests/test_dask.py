"""The dask backend: one graph per program, lazy for dask inputs, computed on a LocalCluster by the client."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import einflow as ef

da = pytest.importorskip("dask.array", reason="dask is not installed (pip install 'einflow[dask]')")
distributed = pytest.importorskip("distributed", reason="distributed is not installed (pip install 'einflow[dask]')")

import dask  # noqa: E402
from dask.callbacks import Callback  # noqa: E402

try:
    from tests.corpus import CORPUS, DERIVATIVES, Case, assert_matches, needs_grad
except ImportError:  # tests/ is not a package: pytest puts it on sys.path itself
    from corpus import CORPUS, DERIVATIVES, Case, assert_matches, needs_grad


@pytest.fixture(scope="session")
def cluster() -> Any:
    """Two worker processes with one thread each, started once for the session and closed at its end."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  memory_limit="2GiB", silence_logs=40) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster: Any) -> Any:
    """A Client the way a user makes one: it becomes dask's default scheduler until closed."""
    with distributed.Client(cluster) as connected:
        yield connected


class CountComputes(Callback):
    """Counts scheduler runs (compute calls) and tasks executed in this process."""

    def __init__(self) -> None:
        super().__init__()
        self.computes = 0
        self.tasks = 0

    def _start(self, dsk: Any) -> None:
        self.computes += 1

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        self.tasks += 1


# ---------------------------------------------------------------------------------------------- on the cluster
@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_corpus_on_local_cluster(case: Case, client: Any) -> None:
    arrays = case.arrays(seed=3)
    result = ef.compile(case.text)(arrays, backend="dask", chunks=2)
    for value in result if isinstance(result, tuple) else (result,):
        assert type(value) is np.ndarray or (type(value) is np.float64 and np.ndim(value) == 0)
    assert_matches(result, case.reference(**arrays))


@needs_grad
@pytest.mark.parametrize("name, build, shapes, reference", DERIVATIVES, ids=[d[0] for d in DERIVATIVES])
def test_derivatives_on_local_cluster(name: str, build: Any, shapes: dict[str, Any], reference: Any,
                                      client: Any) -> None:
    arrays = Case(name, "", shapes, reference).arrays(seed=4)
    assert_matches(build()(arrays, backend="dask", chunks=2), reference(**arrays))


def test_the_workers_do_the_computing(client: Any) -> None:
    p = ef.compile("y[i] = tanh(A[i,j] x[j])")
    A = np.random.default_rng(0).standard_normal((40, 30))
    x = np.ones(30)
    with distributed.get_task_stream(client) as stream:
        result = p(A=A, x=x, backend="dask", chunks=10)
    np.testing.assert_allclose(result, np.tanh(A @ x))
    workers = {task["worker"] for task in stream.data}
    assert workers and workers <= set(client.scheduler_info()["workers"])


def test_lazy_inputs_stay_on_the_cluster(client: Any) -> None:
    p = ef.compile("s[j] = X[i,j] X[i,j]")
    X = da.random.default_rng(1).standard_normal((2000, 50), chunks=(500, 50))
    lazy = p(X=X)
    assert isinstance(lazy, da.Array) and lazy.shape == (50,)
    future = client.compute(lazy)  # the user decides when to compute; only the small result comes back
    np.testing.assert_allclose(future.result(), (X ** 2).sum(axis=0).compute())


# ---------------------------------------------------------------------------------------------- one lazy graph
def test_dask_inputs_are_not_computed_by_the_call() -> None:
    p = ef.compile("h[i] = tanh(W[i,j] x[j])\nL = sum[i](h[i]^2)\nL, h")
    W = da.from_array(np.random.default_rng(2).standard_normal((6, 4)), chunks=2)
    x = np.arange(4.0)
    with dask.config.set(scheduler="sync"), CountComputes() as counter:
        value, hidden = p(W=W, x=x)
        assert counter.computes == 0 and counter.tasks == 0
        assert isinstance(value, da.Array) and isinstance(hidden, da.Array)
        got_value, got_hidden = dask.compute(value, hidden)
    reference = np.tanh(W.compute() @ x)
    np.testing.assert_allclose(got_hidden, reference)
    np.testing.assert_allclose(got_value, np.sum(reference**2))


def test_a_tuple_result_is_computed_in_one_pass() -> None:
    p = ef.compile("h[i] = exp(W[i,j] x[j])\nL = sum[i](h[i])\nL, h")
    W = np.random.default_rng(3).standard_normal((6, 4))
    x = np.arange(4.0) / 4
    with dask.config.set(scheduler="sync"), CountComputes() as counter:
        value, hidden = p(W=W, x=x, backend="dask", chunks=3)
    assert counter.computes == 1
    np.testing.assert_allclose(hidden, np.exp(W @ x))
    np.testing.assert_allclose(value, np.exp(W @ x).sum())


def test_contractions_follow_the_opt_einsum_plan() -> None:
    text = "y[i] = A[i,j] B[j,k] C[k,l] x[l]"
    p = ef.compile(text)
    shapes = {"A": (30, 4), "B": (4, 30), "C": (30, 30), "x": (30,)}
    report = p.plan(**shapes)
    pairwise = sum(len(step.pairwise) for step in report.steps if step.kind == "contract")
    rng = np.random.default_rng(4)
    arrays = {name: da.from_array(rng.standard_normal(shape), chunks=10) for name, shape in shapes.items()}
    lazy = p(arrays)
    contraction_layers = [name for name in lazy.dask.layers if name.split("-")[0] in ("tensordot", "einsum")]
    assert pairwise == 3 and len(contraction_layers) == pairwise
    computed = {name: value.compute() for name, value in arrays.items()}
    np.testing.assert_allclose(lazy.compute(), computed["A"] @ computed["B"] @ computed["C"] @ computed["x"])


def test_surviving_deltas_select_the_diagonal_on_dask() -> None:
    p = ef.compile("J[i,j] = delta[i,j] exp(x[i])")
    values = np.linspace(-1, 1, 7)
    values[2], values[4] = np.inf, np.nan
    lazy = p(x=da.from_array(values, chunks=3))
    assert any(name.startswith("where") for name in lazy.dask.layers)  # selected, not multiplied by an identity
    expected = np.zeros((7, 7))
    np.fill_diagonal(expected, np.exp(values))  # inf and nan on the diagonal only, as numpy's strided write
    np.testing.assert_array_equal(lazy.compute(), expected)
    np.testing.assert_array_equal(p(x=values), expected)


# ---------------------------------------------------------------------------------------------- chunks
def test_chunks_option_and_per_tensor_chunks() -> None:
    p = ef.compile("y[i] = A[i,j] x[j]")
    A = np.arange(48.0).reshape(8, 6)
    x = np.ones(6)
    backend = ef.engine.backends.get_backend("dask")
    assert backend.asarray(A, backend.chunks_for("A", {"A": (4, 3)})).chunks == ((4, 4), (3, 3))
    assert backend.asarray(x, backend.chunks_for("x", {"A": (4, 3)})).chunks == ((6,),)
    with dask.config.set(scheduler="sync"), CountComputes() as small:
        np.testing.assert_allclose(p(A=A, x=x, backend="dask", chunks={"A": (2, 3), "x": 3}), A @ x)
    with dask.config.set(scheduler="sync"), CountComputes() as large:
        np.testing.assert_allclose(p(A=A, x=x, backend="dask", chunks=-1), A @ x)
    assert small.tasks > large.tasks  # smaller chunks, more tasks: the option reached dask


def test_unknown_shapes_are_refused() -> None:
    x = da.from_array(np.arange(6.0), chunks=2)
    filtered = x[x > 2]  # shape (nan,)
    with pytest.raises(ef.BackendError, match="compute_chunk_sizes"):
        ef.compile("s = x[i] x[i]")(x=filtered)


@pytest.mark.filterwarnings("ignore:Increasing number of chunks")
def test_dask_scales_past_memory_without_computing() -> None:
    p = ef.compile("O[i,j] = u[i] v[j]")
    u = da.ones(10**5, chunks=10**4)  # the result would take 80 GB in one piece
    start = time.perf_counter()
    lazy = p(u=u, v=u, memory_limit=10**6)  # lazy: intermediates and results stay in chunks
    assert time.perf_counter() - start < 30  # lazy: computing 80 GB would not finish in time
    assert lazy.shape == (10**5, 10**5)
    assert float(lazy[:2, :3].sum().compute()) == 6.0


# ---------------------------------------------------------------------------------------------- pickling, failures
def test_programs_travel_to_dask_workers(client: Any) -> None:
    program = ef.value_and_grad("f = sum[i](exp(x[i]))", wrt="x")
    program(x=np.zeros(2))  # holds a plan: pickling leaves it behind
    value, gradient = client.submit(lambda p, x: p(x=x), program, np.zeros(3)).result()
    assert value == 3.0 and gradient.tolist() == [1.0, 1.0, 1.0]


def test_a_dead_scheduler_is_a_backend_error_saying_the_cluster_is_gone(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    dask_command = str(Path(sys.executable).with_name("dask"))
    scheduler_file = tmp_path / "scheduler.json"
    scheduler = subprocess.Popen([dask_command, "scheduler", "--scheduler-file", str(scheduler_file), "--port", "0",
                                  "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([dask_command, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1",
                               "--no-dashboard", "--no-nanny"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        with distributed.Client(scheduler_file=str(scheduler_file), timeout=5) as remote:
            remote.wait_for_workers(1, timeout=60)
            program = ef.compile("y[i] = A[i,j] x[j]")
            assert program(A=np.eye(3), x=np.ones(3), backend="dask").tolist() == [1.0, 1.0, 1.0]
            scheduler.kill()
            scheduler.wait()
            with pytest.raises(ef.BackendError, match="the dask cluster is gone"):
                program(A=np.eye(4), x=np.ones(4), backend="dask")
    finally:
        for process in (scheduler, worker):
            process.kill()
            process.wait()


# ---------------------------------------------------------------------------------------------- output chunks
OUTER = "O[i,j,k,l,m,n,o,q] = A[a,i,j,k,l] B[a,m,n,o,q]"


def test_outer_output_chunks_are_no_coarser_than_dask_einsums(client: Any) -> None:
    # dask's own regression test for einsum: chunks of 1 in, (1,...) out (a tensordot keeping the chunks
    # would make (1,2,2,2,...)-sized blocks from the summed axis' neighbours)
    rng = da.random.default_rng(0)
    a, b = rng.random((2, 2, 3, 2, 2), chunks=1), rng.random((2, 3, 2, 2, 2), chunks=1)
    value = ef.compile(OUTER)(A=a, B=b, backend="dask")
    reference = da.einsum("aijkl,amnop->ijklmnop", a, b)
    assert value.chunks == reference.chunks
    np.testing.assert_allclose(client.compute(value).result(), client.compute(reference).result(), rtol=1e-12)


def test_a_large_outer_product_of_one_chunk_is_cut_like_dask_einsums() -> None:
    a = da.ones((64, 8, 8, 8, 8), chunks=-1)  # one 1 MiB chunk: the 128 MiB result was one chunk
    value = ef.compile(OUTER)(A=a, B=a, backend="dask")
    reference = da.einsum("aijkl,amnop->ijklmnop", a, a)
    assert value.chunks == reference.chunks  # 512 KiB chunks
    assert int(np.prod(value.chunksize)) * 8 <= 1.25 * a.nbytes


# cases that previously failed: the cross-backend differential test's seeds 1500, 1760, 5043, 5120, 5316, 5494
# raised "dimensions in operand 0 for collapsing index 'a' don't match (2 != 3)": a statement's array was
# chunked (2, 1) along one axis and (3,) along another (a numpy array of ones broadcast against a chunked
# one), and dask's einsum cannot take the trace or diagonal of axes chunked differently
CROSS_SEED_5494 = """size b = z
G[k,b] = -delta[b,b] z[k] * e
size p = 2
L = G[i,t2] delta[p,p] logsumexp[b](G[t2,hid] G[t2,b] u[hid]) delta[i,t2]"""


def test_a_trace_over_axes_chunked_differently_gives_numpys_value() -> None:
    rng = np.random.default_rng(5494)
    z, u = rng.normal(size=3), rng.normal(size=3)
    program = ef.compile(CROSS_SEED_5494)
    expected = program(z=z, u=u, e=0.7)
    value = program(z=da.from_array(z, chunks=2), u=da.from_array(u, chunks=2), e=0.7)
    np.testing.assert_allclose(value.compute(), expected, rtol=1e-12)
    trace = ef.compile("t = A[i,i]")(A=da.from_array(np.eye(3), chunks=((2, 1), (3,))))
    assert float(trace.compute()) == 3.0
