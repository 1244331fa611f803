"""Large fused elementwise steps computed block by block on threads (engine.blocks): same numbers, real speed-ups.

The block form must give exactly the numbers of the one-expression form (the same ufuncs in the same
order and dtype), which the function table's tests compare with numpy and closed forms; here both forms
run on edge values (signed zeros, subnormals, huge values, infinities, NaN) in float32 and float64, and
sigmoid, tanh and exp are compared with 80-bit references to within a few ulp.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import einflow as ef
import einflow.engine.blocks as blocks
import einflow.engine.measure as specialise_module
import einflow.engine.plan as plan_module
from einflow.engine.backends import get_backend
from einflow.engine.plan import build_plan
from einflow.lang.functions import FUNCTION_RULES

RNG = np.random.default_rng(7)
EDGES = [0.0, -0.0, 5e-324, -5e-324, 1e-310, 1e-300, -1e-300, 1e-20, -1e-20, 1e-8, -1e-8, 0.5, -0.5, 1.0, -1.0,
         19.0, -19.0, 20.0, 40.0, -40.0, 88.0, -88.0, 104.0, -104.0, 709.0, -709.0, 710.0, -745.0, -746.0, 1e300,
         -1e300, np.inf, -np.inf, np.nan]


def _values(dtype: type, count: int) -> np.ndarray:
    """Edge values, then a wide spread of magnitudes of both signs (logarithmically, 1e-30 .. 1e3)."""
    spread = np.exp(RNG.uniform(np.log(1e-30), np.log(1e3), count - len(EDGES))) * RNG.choice([-1.0, 1.0],
                                                                                           count - len(EDGES))
    with np.errstate(over="ignore", under="ignore"):
        return np.concatenate([np.array(EDGES), spread]).astype(dtype)


def _plan(text: str, arrays: dict[str, np.ndarray]) -> plan_module.Plan:
    program = ef.compile(text)
    return build_plan(program.ir, program.info, {name: np.shape(a) for name, a in arrays.items()}, 8,
                      get_backend("numpy"), dtypes={name: np.asarray(a).dtype if not isinstance(a, float) else float
                                                    for name, a in arrays.items()})


def _one_expression(text: str, arrays: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """The program computed as one numpy expression (block evaluation switched off)."""
    with monkeypatch.context() as patch:
        patch.setattr(specialise_module, "BLOCK_ELEMENTS", 1 << 62)
        plan = _plan(text, arrays)
        assert "_run_blocks(" not in plan.source
        return plan.run(list(arrays.values()))


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 4 KiB and threads from 4096 elements on: many blocks on two threads for small test arrays."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(blocks, "THREAD_ELEMENTS", 4096)
    monkeypatch.setattr(blocks, "THREADS", 2)
    monkeypatch.setattr(specialise_module, "BLOCK_ELEMENTS", 4096)


BLOCK_FUNCTIONS = sorted(name for name, rule in FUNCTION_RULES.items() if rule.block is not None)


def test_every_function_but_erf_has_a_block_form() -> None:
    # erf is math.erf per element; imag of a block's real floats is zeros (no pass to fuse)
    assert set(FUNCTION_RULES) - set(BLOCK_FUNCTIONS) == {"erf", "imag"}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", BLOCK_FUNCTIONS)
def test_each_function_in_blocks_gives_the_one_expression_numbers(name: str, dtype: type, small_blocks: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    x = _values(dtype, 300 * 64).reshape(300, 64)
    text = f"y[i,j] = 2 {name}(x[i,j]) + x[i,j]"  # two operations: computed in blocks
    with np.errstate(all="ignore"):
        plan = _plan(text, {"x": x})
        assert "_run_blocks(" in plan.source
        got = plan.run([x])
        want = _one_expression(text, {"x": x}, monkeypatch)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(got, want)  # bit for bit, NaN where NaN, -0.0 where -0.0
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tanh_exp_sigmoid_in_blocks_are_within_a_few_ulp_of_80_bit_references(dtype: type, small_blocks: None) -> None:
    x = _values(dtype, 64 * 128).reshape(64, 128)
    wide = x.astype(np.longdouble)
    with np.errstate(all="ignore"):
        references = {"tanh": np.tanh(wide), "exp": np.exp(wide), "sigmoid": 1 / (1 + np.exp(-wide))}
        for name, reference in references.items():
            plan = _plan(f"y[i,j] = {name}(x[i,j]) * 1.0 + 0.0", {"x": x})
            assert "_run_blocks(" in plan.source
            got = plan.run([x])
            rounded = reference.astype(dtype)
            finite = np.isfinite(rounded)
            assert np.array_equal(np.isnan(got), np.isnan(rounded)), name
            assert np.array_equal(got[~finite & ~np.isnan(rounded)], rounded[~finite & ~np.isnan(rounded)]), name
            ulps = np.abs(got[finite].astype(np.longdouble) - reference[finite]) / np.spacing(
                np.abs(rounded[finite])).astype(np.longdouble)
            assert ulps.max() <= 4, (name, float(ulps.max()), x[finite][np.argmax(ulps)])
        # the tails that a naive formula loses: sigmoid(-40) = 4.2e-18, sigmoid(-745) subnormal in float64
        sigmoid = _plan("y[i,j] = sigmoid(x[i,j]) * 1.0 + 0.0", {"x": x}).run([x])
    at = {float(v): float(s) for v, s in zip(x.ravel(), sigmoid.ravel()) if v in (-40.0, -745.0, 40.0)}
    assert at[-40.0] == pytest.approx(4.248354255291589e-18, rel=1e-6)
    assert at[40.0] == 1.0
    assert at[-745.0] == (5e-324 if dtype == np.float64 else 0.0)


def test_the_issues_program_in_blocks_on_two_threads_equals_numpy_bit_for_bit(small_blocks: None) -> None:
    A, B = RNG.normal(size=(257, 33)) * 30, RNG.normal(size=(257, 33))  # 257 rows: a short last block
    plan = _plan("y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])", {"A": A, "B": B})
    assert "_run_blocks(" in plan.source and blocks.threads_for((257, 33), blocks.block_rows((257, 33), 8)) == 2
    e = np.exp(-np.abs(A))
    expected = np.tanh(A) * np.exp(B) + np.maximum(e, A >= 0) / (1 + e)
    np.testing.assert_array_equal(plan.run([A, B]), expected)


@pytest.mark.parametrize("text, shapes, expected", [
    # transposed operand, broadcast vector along the first axis and along the second, 0-d, Python number
    ("y[i,j] = A[j,i] B[i,j] - exp(v[j])", {"A": (40, 300), "B": (300, 40), "v": (40,)},
     lambda a: a["A"].T * a["B"] - np.exp(a["v"])[None, :]),
    ("y[i,j] = tanh(B[i,j] + u[i]) s", {"B": (300, 40), "u": (300,), "s": ()},
     lambda a: np.tanh(a["B"] + a["u"][:, None]) * a["s"]),
    ("y[i,j] = sqrt(abs(B[i,j])) + c^2", {"B": (300, 40), "c": "number"},
     lambda a: np.sqrt(np.abs(a["B"])) + a["c"] ** 2),
])
def test_operands_that_are_transposed_broadcast_or_numbers(text: str, shapes: dict, expected, small_blocks: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = {name: 1.5 if shape == "number" else RNG.normal(size=shape) for name, shape in shapes.items()}
    plan = _plan(text, arrays)
    assert "_run_blocks(" in plan.source
    got = plan.run(list(arrays.values()))
    np.testing.assert_allclose(got, expected(arrays), rtol=1e-15, atol=1e-15)
    np.testing.assert_array_equal(got, _one_expression(text, arrays, monkeypatch))


def test_float32_stays_float32_and_mixed_types_are_one_expression(small_blocks: None) -> None:
    A = RNG.normal(size=(200, 64)).astype(np.float32)
    plan = _plan("y[i,j] = 0.5 tanh(A[i,j]) + 1", {"A": A})
    assert "_run_blocks(" in plan.source and plan.run([A]).dtype == np.float32
    mixed = _plan("y[i,j] = tanh(A[i,j]) B[i,j] + 1", {"A": A, "B": A.astype(np.float64)})
    assert "_run_blocks(" not in mixed.source  # float32 and float64: numpy's promotion in one expression
    assert _plan("y[i,j] = erf(A[i,j]) + 1", {"A": A}).source.count("_run_blocks(") == 0


def test_small_inputs_pay_nothing_for_blocks() -> None:
    x = RNG.normal(size=(8, 8))
    plan = _plan("y[i,j] = tanh(x[i,j]) exp(x[i,j]) + sigmoid(x[i,j])", {"x": x})
    assert "_run_blocks(" not in plan.source and "def _kernel" not in plan.source


def test_the_callers_error_state_holds_on_every_thread(small_blocks: None) -> None:
    x = np.full((200, 64), 1000.0)
    plan = _plan("y[i,j] = exp(x[i,j]) + 1", {"x": x})
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        plan.run([x])
    with np.errstate(over="ignore"):
        assert np.isinf(plan.run([x])).all()


def test_memory_is_the_result_and_a_few_blocks_as_the_plan_predicts() -> None:
    A, B = RNG.normal(size=(1000, 1000)), RNG.normal(size=(1000, 1000))  # 8 MB each, above the thread size
    plan = _plan("y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])", {"A": A, "B": B})
    (transient,) = plan.transients.values()
    rows = blocks.block_rows((1000, 1000), 8)
    assert transient == blocks.threads_for((1000, 1000), rows) * 3 * rows * 1000 * 8
    assert transient < A.nbytes  # one-expression form: four temporaries of A's size
    plan.run([A, B])
    tracemalloc.start()
    try:
        plan.run([A, B])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= A.nbytes + transient + 300_000


def _random_cases(count: int):  # type: ignore[no-untyped-def]
    import randprog

    for seed in range(count):
        case = randprog.generate(seed)
        yield seed, case.text, randprog.make_arrays(case.program, seed), case.wrt, case.scalar


def test_random_programs_and_their_gradients_give_the_same_numbers_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Differential: every fused step of 150 random programs (and their derivatives) computed one row per block on
    two threads, against the one-expression form of the same plan. To rounding only: a block result is
    C-ordered where numpy may give a transposed operand's order, so a later sum may add in another order."""
    compared = 0
    for seed, text, arrays, wrt, scalar in _random_cases(150):
        derivative = ef.grad(text, wrt=wrt[0]) if scalar else ef.jacobian(text, wrt=wrt[0])
        for program in (ef.compile(text), derivative):
            inputs = {name: arrays[name] for name in program.info.inputs}
            shapes = {name: value.shape for name, value in inputs.items()}
            dtypes = {name: value.dtype for name, value in inputs.items()}
            results = []
            for blocked in (False, True):
                with monkeypatch.context() as patch:
                    patch.setattr(specialise_module, "BLOCK_ELEMENTS", 2 if blocked else 1 << 62)
                    patch.setattr(blocks, "BLOCK_BYTES", 8)
                    patch.setattr(blocks, "THREAD_ELEMENTS", 2)
                    patch.setattr(blocks, "THREADS", 2)
                    plan = build_plan(program.ir, program.info, shapes, 8, get_backend("numpy"), dtypes=dtypes)
                    compared += blocked and "_run_blocks(" in plan.source
                    with np.errstate(all="ignore"):
                        value = plan.run(list(inputs.values()))
                results.append(value if isinstance(value, tuple) else (value,))
            for one, other in zip(*results):
                np.testing.assert_allclose(one, other, rtol=1e-12, atol=1e-300, err_msg=f"seed {seed}: {text}")
    assert compared >= 50  # most programs have a fused step of two or more operations


def test_concurrent_calls_and_a_forked_child_get_their_blocks_computed(small_blocks: None) -> None:
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    A = RNG.normal(size=(400, 64))
    program = ef.compile("y[i,j] = tanh(A[i,j]) + exp(A[i,j]) A[i,j]")
    expected = np.tanh(A) + np.exp(A) * A
    with ThreadPoolExecutor(4) as callers:  # four calls at once share the block threads
        for got in callers.map(lambda _: program(A=A), range(8)):
            np.testing.assert_array_equal(got, expected)
    if not hasattr(os, "fork"):
        return
    time.sleep(0.1)  # the pool's thread idle: a child that reused the pool would wait for it forever
    child = os.fork()
    if child == 0:  # the parent's pool threads do not exist in the child
        os._exit(0 if np.array_equal(program(A=A), expected) else 1)
    for _ in range(600):
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(child, 9)
    os.waitpid(child, 0)
    raise AssertionError("the forked child's call did not finish in 30 s")


def test_no_pool_thread_keeps_an_operand_alive_after_the_call(small_blocks: None) -> None:
    """The caller frees an intermediate right after the step that reads it; a pool thread that has not yet
    dropped its finished task must not hold it (a 12 MB array outlived its ``del`` and the measured peak
    exceeded the plan's)."""
    import weakref

    plan = _plan("y[i,j] = tanh(A[i,j]) + exp(A[i,j])", {"A": np.ones((400, 64))})
    for _ in range(30):
        A = RNG.normal(size=(400, 64))
        alive = weakref.ref(A)
        plan.run([A])
        del A
        assert alive() is None


def test_an_outer_product_is_one_expression_and_a_function_of_it_runs_in_blocks() -> None:
    """``A[p,v] x[q] x[w]``: multiplying the small factors first makes the one expression a single pass over the
    result, and a kernel would spread them over whole blocks (two passes); a function on top still pays."""
    A, x = RNG.normal(size=(20, 20)), RNG.normal(size=20)
    outer = _plan("y[p,q,v,w] = A[p,v] x[q] x[w]", {"A": A, "x": x})
    assert "_run_blocks(" not in outer.source
    np.testing.assert_allclose(outer.run([A, x]), np.einsum("pv,q,w->pqvw", A, x, x), rtol=1e-14)
    B = RNG.normal(size=(20, 20, 20, 20))
    text = "y[p,q,v,w] = tanh(B[p,q,v,w]) + A[p,v] x[q] x[w]"
    applied = _plan(text, {"B": B, "A": A, "x": x})
    assert "_run_blocks(" in applied.source
    np.testing.assert_allclose(applied.run([B, A, x]), np.tanh(B) + np.einsum("pv,q,w->pqvw", A, x, x),
                               rtol=1e-13, atol=1e-15)
