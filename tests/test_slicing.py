"""Slicing: contractions over the memory limit run in slices that fit, on numpy and dask; measured, not guessed."""

from __future__ import annotations

import gc
import math
import tracemalloc

import numpy as np
import pytest

import einflow as ef
from einflow.engine.memory import cgroup_available, default_memory_limit
from einflow.engine.slicing import choose_slicing, slice_ranges

MB = 10**6
RNG = np.random.default_rng(7)


def _peak_of(run) -> tuple[object, int]:
    """(run's value, the peak bytes traced while it ran, beyond what was allocated before)."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        value = run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return value, peak - base


# ---------------------------------------------------------------------------------------------- values
CASES = [
    # (program, shapes, results alive at once): the limit is a quarter of the way from those results' bytes
    # to the unsliced peak
    ("C[i,j] = A[i,k] B[k,l] D[l,j]", {"A": (300, 200), "B": (200, 250), "D": (250, 300)}, 1),
    ("s = A[i,j] B[j,k] C[k,i]", {"A": (300, 200), "B": (200, 300), "C": (300, 300)}, 1),  # slices are added up
    ("T[a,d] = 2.5 X[a,b,c] Y[b,c,d] z[d]", {"X": (40, 30, 50), "Y": (30, 50, 60), "z": (60,)}, 1),
    ("Y[i,j] = tanh(A[i,k] B[k,l] D[l,j]) + 1", {"A": (200, 300), "B": (300, 400), "D": (400, 100)}, 2),
    ("C[i,j] = A[i,i,k] B[k,l] D[l,j]", {"A": (50, 50, 40), "B": (40, 300), "D": (300, 60)}, 1),  # a repeated index
]


def _arrays(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    return {name: RNG.standard_normal(shape) for name, shape in shapes.items()}


@pytest.mark.parametrize(("text", "shapes", "results"), CASES, ids=[case[0] for case in CASES])
def test_sliced_values_equal_the_unsliced_run(text: str, shapes: dict, results: int) -> None:
    program = ef.compile(text)
    arrays = _arrays(shapes)
    whole = program.plan(**shapes)
    result = 8 * results * max(math.prod(shape) for shape in whole.output_shapes)
    limit = result + (whole.peak_bytes - result) / 4
    report = program.plan(**shapes, memory_limit=limit)
    assert report.sliced and report.peak_bytes <= limit
    expected = program(arrays, memory_limit=None)
    np.testing.assert_allclose(program(arrays, memory_limit=limit), expected, rtol=1e-10, atol=1e-10)


def test_a_sliced_contraction_agrees_with_numpy_einsum() -> None:
    a, b, c = RNG.standard_normal((97, 61)), RNG.standard_normal((61, 83)), RNG.standard_normal((83, 89))
    program = ef.compile("R[i,l] = a[i,j] b[j,k] c[k,l]")
    value = program(a=a, b=b, c=c, memory_limit=85_000)  # blocks of 97, 83, 89: ragged last blocks
    assert program.plan(a=a, b=b, c=c, memory_limit=85_000).sliced
    np.testing.assert_allclose(value, np.einsum("ij,jk,kl->il", a, b, c), rtol=1e-10)


def test_a_sliced_contraction_reads_a_transposed_intermediate_in_its_stored_order() -> None:
    # T is A B computed as [i,j] and viewed as [j,i]: the contraction reading it plans for its stored order, and
    # each slice cuts the axes of that order (a slice of the logical order would cut the wrong axis)
    A, B = RNG.standard_normal((150, 40)), RNG.standard_normal((40, 160))
    D, F = RNG.standard_normal((150, 300)), RNG.standard_normal((300, 120))
    program = ef.compile("T[j,i] = A[i,k] B[k,j]\nC[j,l] = T[j,i] D[i,m] F[m,l]")
    assert program.plan(A=A, B=B, D=D, F=F, memory_limit=400_000).sliced
    value = program(A=A, B=B, D=D, F=F, memory_limit=400_000)
    expected = (A @ B).T @ (D @ F)  # (numpy.einsum without a path: 3.5e10 multiply-adds)
    np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())
    assert "T.transpose((1, 0))[" in next(iter(program._plans.values())).source


def test_mixed_dtypes_accumulate_in_the_result_type() -> None:
    a = RNG.integers(-5, 5, (120, 80)).astype(np.int16)
    b = RNG.standard_normal((80, 90)).astype(np.float32)
    c = RNG.standard_normal((90, 70)).astype(np.float32)
    program = ef.compile("S[i,l] = a[i,j] b[j,k] c[k,l]")
    sliced = program(a=a, b=b, c=c, memory_limit=40_000)  # the result is 33.6 KB, unsliced the plan needs 76.8 KB
    assert program.plan(a=a.shape, b=b.shape, c=c.shape, itemsize=4, memory_limit=40_000).sliced
    assert sliced.dtype == np.einsum("ij,jk,kl->il", a, b, c).dtype == np.float32
    np.testing.assert_allclose(sliced, np.einsum("ij,jk,kl->il", a.astype(float), b, c), rtol=1e-4, atol=1e-3)


def test_a_hessian_is_sliced_like_any_program() -> None:
    a = RNG.standard_normal((400, 60)) / 10
    x = RNG.standard_normal(60)
    hessian = ef.hessian("f = sum[i](exp(A[i,j] x[j]))", wrt="x")
    expected = a.T @ (np.exp(a @ x)[:, None] * a)
    limit = 100_000  # the unsliced plan holds a 400 x 60 intermediate (192 KB)
    assert hessian.plan(A=a.shape, x=x.shape).peak_bytes > limit
    np.testing.assert_allclose(hessian(A=a, x=x, memory_limit=limit), expected, rtol=1e-10)


# ---------------------------------------------------------------------------------------------- tropical products
def test_a_tropical_product_is_computed_in_chunks_of_a_kept_index() -> None:
    a, b = RNG.standard_normal((150, 100)), RNG.standard_normal((100, 120))
    program = ef.compile("C[i,j] = max[k](A[i,k] + B[k,j])")
    limit = 1 * MB  # i x k x j is 14.4 MB
    report = program.plan(A=a.shape, B=b.shape, memory_limit=limit)
    assert report.peak_bytes <= limit and report.largest_bytes < limit
    assert [step.sliced for step in report.sliced] == [("i",), ("i",)] or report.sliced[0].sliced == ("j",)
    assert "in chunks" in str(report)
    np.testing.assert_array_equal(program(A=a, B=b, memory_limit=limit), (a[:, :, None] + b[None]).max(1))
    normalised = ef.compile("S[i,k,j] = softmax[k](A[i,k] + B[k,j])")
    expected = np.exp(a[:, :, None] + b[None])
    np.testing.assert_allclose(normalised(A=a, B=b, memory_limit=30 * MB), expected / expected.sum(1, keepdims=True),
                               rtol=1e-12)


# ---------------------------------------------------------------------------------------------- report
def test_the_report_shows_what_a_call_with_the_limit_runs() -> None:
    program = ef.compile("C[i,j] = A[i,k] B[k,l] D[l,j]")
    shapes = {"A": (400, 400), "B": (400, 400), "D": (400, 400)}
    whole = program.plan(**shapes)
    report = program.plan(**shapes, memory_limit=2 * MB)
    (step,) = report.sliced
    assert step.kind == "contract" and step.slices > 1 and step.sliced
    assert 1.0 <= step.overhead <= 1.5 and report.flops == pytest.approx(whole.flops * step.overhead, rel=1e-9)
    text = str(report)
    assert f"over [{','.join(step.sliced)}]: {step.slices} slices, FLOP overhead {step.overhead:.2f}x" in text
    assert "memory limit: 1.91 MiB; 1 step(s) sliced to fit" in text
    assert report.peak_bytes <= 2 * MB < whole.peak_bytes
    arrays = _arrays(shapes)
    program(arrays, memory_limit=2 * MB)
    (plan,) = [plan for key, plan in program._plans.items() if key[2] == 2 * MB]
    assert plan.peak_bytes == report.peak_bytes  # the call ran the reported plan


def test_the_chooser_halves_the_index_that_costs_least() -> None:
    import opt_einsum as oe

    _, info = oe.contract_path("ij,jk,kl->il", (500, 500), (500, 500), (500, 500), shapes=True)
    slicing = choose_slicing("ij,jk,kl->il", [(500, 500)] * 3, info.contraction_list, budget=100_000)
    assert slicing is not None and slicing.peak <= 100_000 and slicing.overhead <= 1.5
    assert slicing.slices == math.prod(slicing.counts)
    assert choose_slicing("ij->ij", [(500, 500)], [((0,), set(), "ij->ij", None, False)], budget=0.5) is None
    assert slice_ranges(7, 7) == [(k, k + 1) for k in range(7)]


# ---------------------------------------------------------------------------------------------- refusals
def test_refuses_when_the_output_itself_does_not_fit() -> None:
    program = ef.compile("C[i,j] = A[i,k] B[k,j]")
    with pytest.raises(ef.MemoryLimitError) as error:
        program(A=np.ones((1000, 10)), B=np.ones((10, 1000)), memory_limit=4 * MB)
    message = str(error.value)
    assert "Slicing cannot help" in message and "(1000, 1000)" in message and "nothing was allocated" in message


def test_refuses_when_an_intermediate_statement_alone_exceeds_the_limit() -> None:
    """E (2000 x 2000, 30.5 MiB) is a statement of its own, read twice later: no block of it is enough, so
    a 1 MB limit is refused, naming the array that does not fit (elementwise work is chunked only into a
    result that fits)."""
    u = np.ones(2000)
    with pytest.raises(ef.MemoryLimitError, match=r"Slicing cannot help: the result of shape .*\(30\.5 MiB\)"):
        ef.compile("E[i,j] = exp(u[i] v[j])\ns = E[i,j] E[i,j] + 1")(u=u, v=u, memory_limit=MB)


@pytest.mark.parametrize("kind", ["sum", "max", "min", "mean", "logsumexp"])
def test_a_full_reduction_is_computed_in_chunks_of_a_reduced_index(kind: str) -> None:
    u, v = RNG.standard_normal(1500) / 10, RNG.standard_normal(1000) / 10
    program = ef.compile(f"s = {kind}[i,j](exp(u[i] v[j]))")
    report = program.plan(u=u.shape, v=v.shape, memory_limit=MB)  # the expression alone is 12 MB
    assert report.peak_bytes <= MB and report.sliced[0].slices > 1
    values = np.exp(u[:, None] * v[None])
    expected = {"sum": values.sum(), "max": values.max(), "min": values.min(), "mean": values.mean(),
                "logsumexp": np.log(np.exp(values).sum())}[kind]
    value, peak = _peak_of(lambda: program(u=u, v=v, memory_limit=MB))
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    assert peak <= MB


def test_slicing_false_restores_the_refusal() -> None:
    program = ef.compile("C[i,j] = A[i,k] B[k,l] D[l,j]")
    arrays = _arrays({"A": (300, 300), "B": (300, 300), "D": (300, 300)})
    with pytest.raises(ef.MemoryLimitError, match=r"Slicing is off \(slicing=False\)"):
        program(arrays, memory_limit=1.2 * MB, slicing=False)
    with pytest.raises(ef.MemoryLimitError, match="slicing=False"):
        program.plan(A=(300, 300), B=(300, 300), D=(300, 300), memory_limit=1.2 * MB, slicing=False)
    np.testing.assert_allclose(program(arrays, memory_limit=1.2 * MB), arrays["A"] @ arrays["B"] @ arrays["D"])
    with pytest.raises(ef.EinflowError, match="slicing= must be True or False"):
        program(arrays, slicing="no")
    with pytest.raises(TypeError, match="did you mean 'slicing'"):
        program(arrays, slicng=False)


# ---------------------------------------------------------------------------------------------- measured memory
def test_measured_peak_of_sliced_runs_stays_under_the_limit() -> None:
    shapes = {"A": (1000, 600), "B": (600, 800), "D": (800, 1000)}
    arrays = _arrays(shapes)
    program = ef.compile("C[i,j] = A[i,k] B[k,l] D[l,j]")
    limit = 12 * MB  # the output alone is 8 MB; unsliced the plan needs 14.4 MB
    whole = program.plan(**shapes)
    assert whole.peak_bytes > limit
    program(arrays, memory_limit=limit)  # plan (and compile) before measuring
    program(arrays, memory_limit=None)
    unsliced, unsliced_peak = _peak_of(lambda: program(arrays, memory_limit=None))
    sliced, sliced_peak = _peak_of(lambda: program(arrays, memory_limit=limit))
    assert unsliced_peak > limit  # the measurement sees what the plan predicts
    assert sliced_peak <= limit, (sliced_peak, limit)
    np.testing.assert_allclose(sliced, unsliced, rtol=1e-10)

    a, b = RNG.standard_normal((300, 200)), RNG.standard_normal((200, 250))
    tropical = ef.compile("C[i,j] = max[k](A[i,k] + B[k,j])")
    tropical(A=a, B=b, memory_limit=4 * MB)
    value, peak = _peak_of(lambda: tropical(A=a, B=b, memory_limit=4 * MB))  # i x k x j would be 120 MB
    assert peak <= 4 * MB, peak
    np.testing.assert_array_equal(value, (a[:, :, None] + b[None]).max(1))


def test_the_default_limit_respects_a_container_limit(tmp_path) -> None:
    v1 = tmp_path / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("2147483648\n")
    (v1 / "memory.usage_in_bytes").write_text("1073741824\n")
    (v1 / "memory.stat").write_text("cache 10\ntotal_inactive_file 268435456\n")
    membership = tmp_path / "cgroup"
    membership.write_text("4:memory:/job\n0::/\n")
    assert cgroup_available(str(tmp_path), str(membership)) == 2**31 - (2**30 - 2**28)
    (tmp_path / "memory.max").write_text("max\n")  # v2 without a limit changes nothing
    assert cgroup_available(str(tmp_path), str(membership)) == 2**31 - (2**30 - 2**28)
    (tmp_path / "memory.max").write_text("1000000000\n")
    (tmp_path / "memory.current").write_text("400000000\n")
    assert cgroup_available(str(tmp_path), str(membership)) == 600_000_000
    unlimited = tmp_path / "none"
    unlimited.mkdir()
    assert cgroup_available(str(unlimited), str(membership)) is None
    with open("/proc/meminfo") as file:
        available = next(int(line.split()[1]) * 1024 for line in file if line.startswith("MemAvailable"))
    assert 0 < default_memory_limit() <= available


# ---------------------------------------------------------------------------------------------- dask
def test_dask_runs_one_task_per_slice() -> None:
    dask = pytest.importorskip("dask")
    from dask.callbacks import Callback

    shapes = {"A": (100, 400), "B": (400, 400), "D": (400, 100)}
    arrays = _arrays(shapes)
    program = ef.compile("C[i,j] = A[i,k] B[k,l] D[l,j]")
    limit = 300_000  # B alone is 1.28 MB
    report = program.plan(**shapes, backend="dask", memory_limit=limit)
    (step,) = report.sliced
    results: list[tuple[str, int]] = []

    class Sizes(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):  # noqa: ANN001 - dask's callback signature
            name = key[0] if isinstance(key, tuple) else key
            results.append((str(name), int(getattr(result, "nbytes", 0))))

    with Sizes(), dask.config.set(scheduler="threads"):
        value = program(arrays, backend="dask", chunks=50, memory_limit=limit)
    expected = arrays["A"] @ arrays["B"] @ arrays["D"]
    np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-12 * np.abs(expected).max())
    slices = [size for name, size in results if name.startswith("einflow-slice-")]
    assert len(slices) == step.slices
    assert max(size for _, size in results) <= limit  # no task holds more than a slice's worth


def test_dask_sliced_sum_and_lazy_inputs() -> None:
    da = pytest.importorskip("dask.array")
    shapes = {"A": (300, 200), "B": (200, 300), "C": (300, 300)}
    arrays = _arrays(shapes)
    program = ef.compile("s = A[i,j] B[j,k] C[k,i]")
    report = program.plan(**shapes, backend="dask", memory_limit=400_000)
    assert report.sliced and report.sliced[0].sliced
    expected = np.einsum("ij,jk,ki->", arrays["A"], arrays["B"], arrays["C"])
    np.testing.assert_allclose(program(arrays, backend="dask", memory_limit=400_000), expected, rtol=1e-10)
    lazy = program({name: da.from_array(value, chunks=100) for name, value in arrays.items()}, backend="dask",
                   memory_limit=400_000)
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-10)


def test_dask_slice_tasks_receive_only_their_blocks_of_each_operand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15 item 2: each slice's task is handed its block of every operand (operands are rechunked to the
    slices' blocks), never a whole operand, so no process holds more than one slice's worth of any of them."""
    pytest.importorskip("dask")
    from einflow.engine import slicing

    shapes = {"A": (100, 400), "B": (400, 400), "D": (400, 100)}
    arrays = _arrays(shapes)
    program = ef.compile("C[i,j] = A[i,k] B[k,l] D[l,j]")
    limit = 300_000  # B alone is 1.28 MB: it cannot travel whole
    report = program.plan(**shapes, backend="dask", memory_limit=limit)
    (step,) = report.sliced
    received: list[tuple[tuple[int, ...], ...]] = []
    call = slicing.SliceKernel.__call__

    def recording(self, *operands):  # noqa: ANN001, ANN202 - the kernel's own signature
        received.append(tuple(np.shape(operand) for operand in operands))
        assert tuple(tuple(shape) for shape in self.shapes) == received[-1]  # exactly the block the slice reads
        return call(self, *operands)

    monkeypatch.setattr(slicing.SliceKernel, "__call__", recording)
    value = program(arrays, backend="dask", chunks=400, memory_limit=limit)  # chunks: whole operands at first
    np.testing.assert_allclose(value, arrays["A"] @ arrays["B"] @ arrays["D"], rtol=1e-10)
    assert len(received) == step.slices > 1
    itemsize = 8
    for position, name in enumerate("ABD"):
        largest = max(math.prod(shapes_[position]) for shapes_ in received) * itemsize
        whole = math.prod(shapes[name]) * itemsize
        assert largest <= limit / 3, (name, largest)  # a third of the limit: a worker runs and readies tasks
        if whole > limit / 3:
            assert largest < whole  # an operand too big for a task is cut, never handed whole


# ------------------------------------------------------------------ elementwise sums and diagonals in blocks
def test_a_diagonal_plus_a_large_array_is_computed_in_blocks_under_the_limit() -> None:
    """`delta[p,r] A[q,s] + B[p,q,r,s]`: unsliced, the diagonal array and the sum both exist (2x the output);
    sliced, the sum is computed in blocks of an index off the diagonal, each block's diagonal made inside the
    loop, so the measured peak stays under a limit two fifths above the output."""
    n = 30
    a, b = RNG.standard_normal((n, n)), RNG.standard_normal((n, n, n, n))
    program = ef.compile("H[p,q,r,s] = delta[p,r] A[q,s] + B[p,q,r,s]")
    output = b.nbytes  # 6.48 MB
    limit = output * 7 // 5  # the plan predicts 8.42 MB: room for what tracemalloc sees beyond the model
    report = program.plan(A=a, B=b, memory_limit=limit)
    (step,) = report.sliced
    assert step.kind == "add" and step.sliced in (("q",), ("s",)) and step.slices > 1
    assert report.peak_bytes <= limit < program.plan(A=a, B=b).peak_bytes
    program(A=a, B=b, memory_limit=limit)  # compiled outside the measurement
    value, peak = _peak_of(lambda: program(A=a, B=b, memory_limit=limit))
    _, unsliced_peak = _peak_of(lambda: program(A=a, B=b, memory_limit=None))
    expected = np.einsum("pr,qs->pqrs", np.eye(n), a) + b
    np.testing.assert_array_equal(value, expected)
    assert unsliced_peak > limit  # the measurement sees the diagonal array the unsliced plan builds
    assert peak <= limit, (peak, limit)
    with pytest.raises(ef.MemoryLimitError, match=r"the result of shape \(30, 30, 30, 30\)"):
        program(A=a, B=b, memory_limit=output * 0.9)  # the output itself does not fit: refused, saying why


def test_the_softmax_regression_hessian_fits_by_computing_its_diagonal_term_in_blocks() -> None:
    """The Hessian's statement `Y[r,c] (delta[s,v] X[r,u] - X[r,u] t1[r,v]) t1[r,s]` builds a diagonal array
    as large as its result before multiplying; under a limit that holds the result but not both, it is
    computed in blocks (it was refused: "a diagonal step is not sliced")."""
    hessian = ef.hessian("Z[b,c] = X[b,f] W[f,c]\nL = -sum[b,c](Y[b,c] log_softmax[c](Z[b,c]))", wrt="W")
    samples, features, classes = 150, 24, 16
    x, w = RNG.standard_normal((samples, features)), RNG.standard_normal((features, classes))
    y = np.eye(classes)[RNG.integers(0, classes, samples)]
    largest = samples * classes * features * classes * 8  # the statement's result: 7.4 MB
    limit = largest * 3 // 2
    assert hessian.plan(X=x, W=w, Y=y).peak_bytes > limit
    report = hessian.plan(X=x, W=w, Y=y, memory_limit=limit)
    assert [step.kind for step in report.sliced] == ["product"]
    hessian(X=x, W=w, Y=y, memory_limit=limit)
    value, peak = _peak_of(lambda: hessian(X=x, W=w, Y=y, memory_limit=limit))
    assert peak <= limit, (peak, limit)
    p = np.exp(x @ w - (x @ w).max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    weights = y.sum(1)[:, None, None] * (np.einsum("bs,sv->bsv", p, np.eye(classes)) - np.einsum("bs,bv->bsv", p, p))
    expected = np.einsum("bp,bu,bqv->pquv", x, x, weights)
    np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-10)
