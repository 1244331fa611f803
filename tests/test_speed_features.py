"""Speed features: compiled numpy contractions, released intermediates and the predicted peak, optimize=."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import opt_einsum as oe
import pytest

import einflow as ef
from einflow.engine.kernels import compile_numpy
from einflow.engine.plan import TEMPORARIES
from einflow.lang.functions import FUNCTION_RULES

# tracemalloc sees every thread: threads left by earlier tests (dask) allocate up to a few hundred kB meanwhile
SLACK = 1 << 20

# equations a contraction step may take: GEMM in every transposition, GEMV, dot, outer, batch (einsum),
# repeated and one-sided summed indices (einsum), scalars
EQUATIONS = [
    "ij,jk->ik", "ij,jk->ki", "ji,jk->ik", "ij,kj->ik", "ji,kj->ki", "ij,j->i", "j,ij->i", "i,i->", "ij,ij->",
    "ij,ji->", "i,j->ij", "bij,bjk->bik", "ijk,kj->i", "ijk,jkl->il", "ijk,lkj->li", "ii,ij->j", "ij,jk->i",
    "ab,bc,cd->ad", "ab,bc,cd,de,e->a", "abc,cd,db->a", ",ij->ij", "ij,->ji", "abcd,dcef->abef", "i,i,i->i",
    # cases that previously failed
]


def _contract(equation: str, arrays: list[np.ndarray], optimize: object = "auto") -> object:
    shapes = [a.shape for a in arrays]
    _, info = oe.contract_path(equation, *shapes, shapes=True, optimize=optimize)
    run, _ = compile_numpy(equation, shapes, info.contraction_list)
    return run(*arrays)


def _arrays(equation: str, rng: np.random.Generator, sizes: dict[str, int] | None = None) -> list[np.ndarray]:
    sizes = sizes or {label: 2 + k % 4 for k, label in enumerate("abcdefghijkl")}
    return [rng.standard_normal(tuple(sizes[c] for c in term)) for term in equation.split("->")[0].split(",")]


@pytest.mark.parametrize("equation", EQUATIONS)
def test_compiled_contraction_matches_numpy_einsum(equation: str) -> None:
    rng = np.random.default_rng(0)
    arrays = _arrays(equation, rng)
    expected = np.einsum(equation, *arrays)
    got = _contract(equation, arrays)
    assert np.shape(got) == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    # the same compiled steps must not depend on the inputs' memory order
    transposed = [np.asfortranarray(a) if a.ndim else a for a in arrays]
    np.testing.assert_allclose(_contract(equation, transposed), expected, rtol=1e-12, atol=1e-12)


def test_random_equations_every_dtype_match_opt_einsum() -> None:
    """Random equations with every path algorithm and dtype: same values, shapes and dtypes as opt_einsum."""
    r = random.Random(7)
    rng = np.random.default_rng(7)
    for _ in range(400):
        letters = "abcdef"
        sizes = {c: r.choice([0, 1, 2, 3, 4]) if r.random() < 0.1 else r.choice([2, 3, 4]) for c in letters}
        terms = ["".join(r.sample(letters, r.randint(0, 4))) for _ in range(r.randint(1, 4))]
        present = sorted(set("".join(terms)))
        equation = ",".join(terms) + "->" + "".join(r.sample(present, r.randint(0, len(present))))
        kind = r.choice(["f8", "f4", "i8", "b1", "c16"])
        arrays = [(rng.standard_normal(tuple(sizes[c] for c in t)) * 3).astype(kind) for t in terms]
        optimize = r.choice(["auto", "greedy", "optimal", "dp", False])
        got = np.asarray(_contract(equation, arrays, optimize))
        path, _ = oe.contract_path(equation, *arrays, optimize=optimize)
        want = np.asarray(oe.contract(equation, *arrays, optimize=path))
        assert got.shape == want.shape and got.dtype == want.dtype, equation
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=equation)


@pytest.mark.parametrize("equation", ["ij,jk->ik", "ji,jk->ik", "ij,kj->ik", "ab,bc,cd->ad", "ij,j->i", "bij,bjk->bik",
                                      "hqd,hkd->hqk"])
def test_compiled_gemm_allocates_only_its_result(equation: str) -> None:
    """Transposed operands go to BLAS as views: nothing but the result (and chain intermediates) is allocated."""
    rng = np.random.default_rng(1)
    arrays = _arrays(equation, rng, {**{c: 600 for c in "abcdijkq"}, "b": 3, "h": 3})
    shapes = [a.shape for a in arrays]
    _, info = oe.contract_path(equation, *shapes, shapes=True)
    run, internal = compile_numpy(equation, shapes, info.contraction_list)
    run(*arrays)
    tracemalloc.start()
    try:
        result = run(*arrays)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a copied operand would add 2.9 MB; the slack covers other threads' allocations (dask tests' workers)
    assert peak <= result.nbytes + internal * 8 + SLACK


def test_an_operand_copied_anyway_is_copied_into_the_results_order() -> None:
    # E[b,w,c] = A[t,c] T[w,t,b]: T must be copied to be a (rows, t) matrix; copied with rows (b, w), the matrix
    # product makes E contiguous, where rows (w, b) made a transposed view that a reader such as E[b,w,c] B[c,w]
    # copies again. The stored order of a transposed intermediate (T here) is what the plan reads.
    rng = np.random.default_rng(3)
    text = "T[w,t,b] = M[w,s,t] S[s,b]\nE[b,w,c] = A[t,c] T[w,t,b]\nf[b] = E[b,w,c] B[c,w]"
    arrays = {"M": rng.standard_normal((3, 4, 2)), "S": rng.standard_normal((4, 16)),
              "A": rng.standard_normal((2, 16)), "B": rng.standard_normal((16, 3))}
    program = ef.compile(text)
    want = np.einsum("wst,sb,tc,cw->b", arrays["M"], arrays["S"], arrays["A"], arrays["B"])
    np.testing.assert_allclose(program(**arrays), want, rtol=1e-12)
    source = next(iter(program._plans.values())).source
    line = next(line for line in source.splitlines() if line.strip().startswith("E = "))
    assert ".reshape((16, 3, 16))" in line and not line.split("#")[0].rstrip().endswith(")).transpose((1, 0, 2))")


def test_a_real_factor_of_a_complex_contraction_is_not_cast_first() -> None:
    # numpy multiplies float64 by complex128 in double precision as it would after a cast (a copy per call);
    # an integer factor is still cast (its pairwise product must not wrap before the complex factor joins)
    rng = np.random.default_rng(4)
    E = rng.standard_normal((4, 3, 4)) + 1j * rng.standard_normal((4, 3, 4))
    A = rng.standard_normal((4, 2, 4)) + 1j * rng.standard_normal((4, 2, 4))
    M, K = rng.standard_normal((3, 3, 2, 2)), rng.integers(-3, 3, (3, 3, 2, 2)).astype(np.int8)
    for W, cast in ((M, False), (K, True)):
        program = ef.compile("F[e,w,t,b] = E[a,v,e] conj(A[a,s,b]) W[v,w,s,t]")
        np.testing.assert_allclose(program(E=E, A=A, W=W), np.einsum("ave,asb,vwst->ewtb", E, A.conj(), W),
                                   rtol=1e-12)
        assert ("W.astype(" in list(program._plans.values())[-1].source) == cast  # (one program: a plan per dtype)


# ---------------------------------------------------------------------------- released intermediates, peak

LEAST_SQUARES = "L = sum[i,j]((A[i,k] X[k,j] - B[i,j])^2)"


def _traced_peak(function: object) -> int:
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("text, wrt", [(LEAST_SQUARES, None), (LEAST_SQUARES, "X"),
                                       ("L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", "w")])
def test_measured_peak_is_within_the_predicted_peak(text: str, wrt: str | None) -> None:
    rng = np.random.default_rng(3)
    if "A[i,k]" in text:
        arrays = dict(A=rng.standard_normal((1500, 400)), X=rng.standard_normal((400, 1000)),
                      B=rng.standard_normal((1500, 1000)))
    else:
        arrays = dict(X=rng.standard_normal((200_000, 20)), y=np.sign(rng.standard_normal(200_000)),
                      w=rng.standard_normal(20))
    program = ef.compile(text) if wrt is None else ef.value_and_grad(text, wrt=wrt)
    program(arrays)
    predicted = program.plan(arrays).peak_bytes  # the public report says what the plan predicts
    peak = _traced_peak(lambda: program(arrays))
    assert 0.9 * predicted <= peak <= 1.1 * predicted + SLACK / 4


@pytest.mark.parametrize("name", sorted(FUNCTION_RULES))
def test_the_plan_knows_each_functions_temporaries(name: str) -> None:
    """plan.TEMPORARIES must match what functions.py's value rules allocate besides their result."""
    x = np.linspace(0.1, 2.0, 2_000_000)
    rule = FUNCTION_RULES[name].value
    rule(np, x)
    peak = _traced_peak(lambda: rule(np, x))
    measured = peak / x.nbytes - 1
    assert abs(measured - TEMPORARIES.get(name, 0)) < 0.05, f"{name}: {measured:.3f} temporary arrays"


def test_a_sum_under_other_index_names_is_computed_once() -> None:
    program = ef.compile("u[i,j] = (1 - h[i,j]^2) x[i,j]\nv[k,l] = (1 - h[k,l]^2) y[k,l]\nu, v")
    report = program.plan(h=(3, 4), x=(3, 4), y=(3, 4))
    assert [step.kind for step in report.steps].count("add") == 1
    # h^2 is fused into the sum; the two products are elementwise (never einsum)
    assert [step.kind for step in report.steps] == ["add", "product", "product"]
    rng = np.random.default_rng(9)
    h, x, y = (rng.standard_normal((3, 4)) for _ in range(3))
    u, v = program(h=h, x=x, y=y)
    np.testing.assert_allclose(u, (1 - h**2) * x, rtol=1e-12)
    np.testing.assert_allclose(v, (1 - h**2) * y, rtol=1e-12)


def test_dead_intermediates_are_released() -> None:
    """Three 8 MB statements in a row: each is dropped after its last use, so the peak stays near two of them."""
    program = ef.compile("a[i,j] = exp(x[i,j])\nb[i,j] = a[i,j] * 2\nc[i,j] = sin(b[i,j])\nd = sum[i,j](c[i,j])")
    x = np.random.default_rng(4).standard_normal((1000, 1000))
    value = program(x=x)
    peak = _traced_peak(lambda: program(x=x))
    assert peak < 2.3 * x.nbytes
    np.testing.assert_allclose(value, np.sin(np.exp(x) * 2).sum(), rtol=1e-10)


def test_released_registers_do_not_touch_outputs_or_views() -> None:
    """A returned value that is a transposed view of an intermediate still holds the right numbers."""
    program = ef.compile("t[j,i] = A[i,k] B[k,j]\nu[i,j] = t[j,i] + 1\nt, u")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    t, u = program(A=a, B=b)
    np.testing.assert_allclose(t, (a @ b).T, rtol=1e-12)
    np.testing.assert_allclose(u, a @ b + 1, rtol=1e-12)


# ---------------------------------------------------------------------------- optimize=

class RecordingGreedy(oe.paths.PathOptimizer):
    """A custom path optimizer: greedy, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, inputs, output, size_dict, memory_limit=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return oe.paths.greedy(inputs, output, size_dict, memory_limit)


def test_a_custom_path_optimizer_is_used_once_per_shape_signature() -> None:
    program = ef.compile("y[i] = A[i,j] B[j,k] C[k,l] v[l]")
    rng = np.random.default_rng(6)
    arrays = dict(A=rng.standard_normal((5, 6)), B=rng.standard_normal((6, 7)), C=rng.standard_normal((7, 8)),
                  v=rng.standard_normal(8))
    expected = arrays["A"] @ arrays["B"] @ arrays["C"] @ arrays["v"]
    optimizer = RecordingGreedy()
    np.testing.assert_allclose(program(arrays, optimize=optimizer), expected, rtol=1e-12)
    assert optimizer.calls == 1
    program(arrays, optimize=optimizer)
    assert optimizer.calls == 1  # the plan was cached for this optimizer object
    other = RecordingGreedy()
    program(arrays, optimize=other)
    assert other.calls == 1  # another optimizer object gets its own plan
    program.plan(arrays, optimize=optimizer)
    assert optimizer.calls == 2


@pytest.mark.parametrize("optimize", ["auto", "greedy", "dp", "optimal", "branch-2", "random-greedy", True, False])
def test_every_path_algorithm_gives_the_same_value(optimize: object) -> None:
    program = ef.compile("y[i] = A[i,j] B[j,k] C[k,l] v[l]")
    rng = np.random.default_rng(8)
    arrays = dict(A=rng.standard_normal((5, 6)), B=rng.standard_normal((6, 7)), C=rng.standard_normal((7, 8)),
                  v=rng.standard_normal(8))
    expected = arrays["A"] @ arrays["B"] @ arrays["C"] @ arrays["v"]
    np.testing.assert_allclose(program(arrays, optimize=optimize), expected, rtol=1e-12)


def test_optimize_false_plans_one_einsum_and_auto_plans_pairs() -> None:
    program = ef.compile("y[i] = A[i,j] B[j,k] v[k]")
    shapes = dict(A=(50, 60), B=(60, 70), v=(70,))
    assert len(program.plan(shapes, optimize=False).steps[0].pairwise) == 1
    assert len(program.plan(shapes, optimize="auto").steps[0].pairwise) == 2
    assert program.plan(shapes, optimize="auto").flops < program.plan(shapes, optimize=False).flops


@pytest.mark.parametrize("optimize", ["bogus", 3.5, object()])
def test_a_wrong_optimize_is_an_einflow_error(optimize: object) -> None:
    program = ef.compile("y[i] = A[i,j] v[j]")
    with pytest.raises(ef.EinflowError, match="optimize="):
        program(A=np.ones((2, 2)), v=np.ones(2), optimize=optimize)


def test_nothing_summed_pairwise_steps_are_broadcast_multiplications() -> None:
    import opt_einsum as oe

    from einflow.engine.kernels import compile_numpy, contraction_text

    rng = np.random.default_rng(0)
    for equation, shapes in [(",b->b", [(), (5,)]), ("a,b->ab", [(3,), (4,)]), ("ba,c->acb", [(2, 3), (4,)]),
                             ("a,a,b->b", [(5,), (5,), (6,)]), ("ij,k->kji", [(2, 3), (4,)])]:
        _, info = oe.contract_path(equation, *shapes, shapes=True)
        text, _ = contraction_text(equation, shapes, info.contraction_list, [f"x{k}" for k in range(len(shapes))])
        assert "einsum" not in text, (equation, text)
        contract, _ = compile_numpy(equation, shapes, info.contraction_list)
        arrays = [rng.standard_normal(shape) for shape in shapes]
        expected = np.einsum(equation, *arrays)
        result = contract(*arrays)
        assert result.shape == expected.shape
        np.testing.assert_allclose(result, expected, rtol=1e-14)


def test_a_contractions_scalar_factors_are_multiplied_first_when_the_type_allows() -> None:
    program = ef.compile("s = x[j] x[j]\nt = sqrt(s)\ny[p] = w[i] x[i] x[p] t s / 2")
    x, w = np.arange(1.0, 5.0), np.linspace(-1, 1, 4)
    program(x=x, w=w)
    source = next(iter(program._plans.values())).source
    line = source.split("y = ")[1].split("\n")[0]
    assert "einsum" not in line and ") * (t * s * 0.5)" in line  # one pass over the vector for the scale
    s = x @ x
    np.testing.assert_allclose(program(x=x, w=w), (w @ x) * x * np.sqrt(s) * s / 2, rtol=1e-14)
    # float32 arrays with a float64 scalar: numpy's left-to-right type (float64) is kept
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    assert program(x=x32, w=w32).dtype == np.result_type(np.float32, np.float32)


@pytest.mark.parametrize("text", ["s[i,j] = softmax[j](X[i,j])", "s[i,j] = log_softmax[j](X[i,j])",
                                  "z[i] = logsumexp[j](X[i,j])", "s[i,j] = softmax[i](X[i,j])"])
def test_written_out_normalisers_equal_the_stable_reference(text: str) -> None:
    X = np.random.default_rng(3).standard_normal((4, 5)) * 300
    X[1, 2] = -np.inf
    axis = 0 if "softmax[i]" in text else 1
    shifted = X - X.max(axis=axis, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    expected = {"softmax": np.exp(shifted - log_total), "log_softmax": shifted - log_total,
                "logsumexp": (log_total + X.max(axis=axis, keepdims=True)).squeeze(axis)}
    kind = text.split("=")[1].split("[")[0].strip()
    program = ef.compile(text)
    with np.errstate(over="raise", invalid="raise"):
        np.testing.assert_allclose(program(X=X), expected[kind], rtol=1e-13, atol=0)
        assert program(X=X.astype(np.float32)).dtype == np.float32
    assert "_shift" in next(iter(program._plans.values())).source  # written out, not the generic helper
