"""Index semantics (LANGUAGE.md §3-4) against numpy references, plus a random check against a dense oracle."""

from __future__ import annotations

import random
import warnings
from collections import Counter
from typing import Any

import numpy as np
import opt_einsum
import pytest

import einflow as ef
import einflow.engine.plan
import einflow.program
from einflow.lang import ir
from einflow.lang.grammar import parse_expression

RNG = np.random.default_rng(20240611)


def rand(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape)


def positive(*shape: int) -> np.ndarray:
    return RNG.uniform(0.5, 1.5, size=shape)


def close(got: Any, want: Any) -> None:
    got_array, want_array = np.asarray(got), np.asarray(want)
    assert got_array.shape == want_array.shape
    np.testing.assert_allclose(got_array, want_array, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- products are n-ary


def test_products_flatten_through_parentheses() -> None:
    a, b, c = rand(4), rand(4), rand(4)
    assert parse_expression("a[i] (b[i] c[i])") == parse_expression("a[i] b[i] c[i]")
    close(ef.evaluate("a[i] (b[i] c[i])", a=a, b=b, c=c), np.sum(a * b * c))
    close(ef.evaluate("(a[i] b[i]) c[i]", a=a, b=b, c=c), np.sum(a * b * c))


def test_signed_factor_stays_in_the_product() -> None:
    a, b, c = rand(4), rand(4), rand(4)
    # one product: i occurs three times and is contracted once, the sign is a coefficient
    close(ef.evaluate("a[i] (-b[i]) c[i]", a=a, b=b, c=c), -np.sum(a * b * c))
    close(ef.evaluate("a[i] * -b[i] * c[i]", a=a, b=b, c=c), -np.sum(a * b * c))


def test_division_is_a_product_with_a_scoped_divisor() -> None:
    a, b, c = rand(3), positive(5), positive(5)
    close(ef.evaluate("a[i] / (b[j] c[j])", a=a, b=b, c=c), a / np.dot(b, c))
    x, y = rand(5), positive(5)
    # the divisor's free i meets a[i] in the product: contracted
    close(ef.evaluate("x[i] / y[i]", x=x, y=y), np.sum(x / y))
    close(ef.evaluate("r[i] = x[i] / y[i]", x=x, y=y), x / y)


def test_power_base_is_its_own_scope() -> None:
    x = rand(5)
    close(ef.evaluate("(x[i] x[i])^2", x=x), np.dot(x, x) ** 2)
    close(ef.evaluate("x[i]^2 x[i]^2", x=x), np.sum(x**4))
    close(ef.evaluate("r[i] = x[i]^3", x=x), x**3)


def test_function_argument_is_its_own_scope() -> None:
    x, y = rand(4) / 3, rand(4) / 3
    close(ef.evaluate("exp(x[i] y[i])", x=x, y=y), np.exp(np.dot(x, y)))
    close(ef.evaluate("exp(x[i]) y[i]", x=x, y=y), np.sum(np.exp(x) * y))
    close(ef.evaluate("tanh(x[i]) tanh(y[j])", x=x, y=y), np.outer(np.tanh(x), np.tanh(y)))


def test_sum_body_is_its_own_scope() -> None:
    x, v = rand(3), rand(4)
    close(ef.evaluate("sum[i](x[i]) v[j]", x=x, v=v), x.sum() * v)
    # the body's i is bound, so x[i] x[i] inside is elementwise before the sum
    close(ef.evaluate("sum[i](x[i] x[i] x[i])", x=x), np.sum(x**3))


def test_terms_of_a_sum_are_separate_scopes() -> None:
    x, y = rand(4), rand(4)
    # sibling terms may reuse the dummy j
    close(ef.evaluate("x[j] x[j] + y[j] y[j]", x=x, y=y), x @ x + y @ y)
    close(ef.evaluate("x[i] + y[i]", x=x, y=y), x + y)


# ---------------------------------------------------------------- multiplicity


def test_repeated_index_in_one_reference_is_a_trace() -> None:
    A = rand(4, 4)
    close(ef.evaluate("A[i,i]", A=A), np.trace(A))
    close(ef.evaluate("A[i,i]", A=A), np.einsum("ii", A))


def test_bound_repeated_index_reads_the_diagonal() -> None:
    A = rand(4, 4)
    close(ef.evaluate("d[i] = A[i,i]", A=A), np.diag(A))
    close(ef.evaluate("sum[i](A[i,i])", A=A), np.trace(A))


def test_three_occurrences_contract_once() -> None:
    x, A = rand(5), rand(5, 5)
    close(ef.evaluate("x[i] x[i] x[i]", x=x), np.sum(x**3))
    close(ef.evaluate("c[i] = x[i] x[i] x[i]", x=x), x**3)
    close(ef.evaluate("A[i,i] x[i]", A=A, x=x), np.einsum("ii,i", A, x))
    B = rand(5, 3)
    close(ef.evaluate("T[i,j] = A[i,i] B[i,j]", A=A, B=B), np.einsum("ii,ij->ij", A, B))


# ---------------------------------------------------------------- sums broadcast by index name


def test_sum_broadcasts_terms_by_index_name() -> None:
    X, c = rand(3, 4), rand(4)
    close(ef.evaluate("X[b,f] + c[f]", X=X, c=c), X + c)
    close(ef.evaluate("c[f] + X[b,f]", X=X, c=c), (X + c).T)  # order of first occurrence: f, b
    z = rand(6)
    close(ef.evaluate("1 + exp(z[s])", z=z), 1 + np.exp(z))
    x, v = rand(3), rand(5)
    close(ef.evaluate("x[i] + v[j]", x=x, v=v), x[:, None] + v[None, :])
    close(ef.evaluate("v[j] - x[i]", x=x, v=v), v[:, None] - x[None, :])


def test_scalar_inputs_broadcast_in_sums() -> None:
    x = rand(4)
    close(ef.evaluate("s + x[i]", s=np.float64(2.5), x=x), 2.5 + x)
    close(ef.evaluate("s + x[i]", s=2.5, x=x), 2.5 + x)  # a weak Python number
    close(ef.evaluate("x[i] - s", s=3, x=x), x - 3)


# ---------------------------------------------------------------- binding


def test_sum_binds_its_index() -> None:
    x, y = rand(5), rand(5)
    close(ef.evaluate("sum[i](x[i] y[i])", x=x, y=y), np.dot(x, y))
    # bound at any depth: the product inside exp is elementwise, then summed
    close(ef.evaluate("sum[k](exp(x[k] y[k]))", x=x, y=y), np.sum(np.exp(x * y)))
    A, B = rand(3, 4), rand(4, 3)
    close(ef.evaluate("sum[i,j](A[i,j] B[j,i])", A=A, B=B), np.trace(A @ B))


def test_logistic_loss_with_sum() -> None:
    X, w = rand(6, 3), rand(3)
    y = np.sign(rand(6))
    want = np.sum(np.log(1 + np.exp(-y * (X @ w))))
    close(ef.evaluate("sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", X=X, y=y, w=w), want)


def test_explicit_target_binds_its_indices() -> None:
    A, x = rand(3, 4), rand(3)
    close(ef.evaluate("y[i] = A[i,j] x[i]", A=A, x=x), np.einsum("ij,i->i", A, x))
    y = rand(3)
    close(ef.evaluate("t[i] = exp(x[i] y[i])", x=x, y=y), np.exp(x * y))


def test_explicit_mode_reduces_each_term_on_its_own() -> None:
    A, c = rand(3, 4), rand(3)
    close(ef.evaluate("y[i] = A[i,j] + c[i]", A=A, c=c), A.sum(axis=1) + c)
    # parentheses around the whole right side are transparent
    close(ef.evaluate("y[i] = (A[i,j] + c[i])", A=A, c=c), A.sum(axis=1) + c)
    # a scaled or signed parenthesized sum is ONE term: c[i] is broadcast over j before j is summed
    close(ef.evaluate("y[i] = 2 (A[i,j] + c[i])", A=A, c=c), 2 * (A.sum(axis=1) + 4 * c))
    close(ef.evaluate("y[i] = -(A[i,j] + c[i])", A=A, c=c), -(A.sum(axis=1) + 4 * c))


def test_explicit_target_broadcasts_terms_that_lack_an_index() -> None:
    x, v = rand(3), rand(4)
    close(ef.evaluate("T[i,j] = x[i] + v[j]", x=x, v=v), x[:, None] + v[None, :])
    close(ef.evaluate("T[j,i] = x[i] + 2 v[j]", x=x, v=v), x[None, :] + 2 * v[:, None])
    close(ef.evaluate("size j = 4\nT[i,j] = x[i] + delta[j,j] - 1", x=x), np.broadcast_to(x[:, None], (3, 4)))


def test_explicit_target_order_transposes() -> None:
    A = rand(3, 4)
    close(ef.evaluate("T[j,i] = A[i,j]", A=A), A.T)
    B = rand(4, 5)
    close(ef.evaluate("C[k,i] = A[i,j] B[j,k]", A=A, B=B), (A @ B).T)


def test_implicit_target_uses_order_of_first_occurrence() -> None:
    A, B = rand(3, 4), rand(5, 3)
    close(ef.evaluate("B[j,k] A[k,i]", A=A, B=B), np.einsum("jk,ki->ji", B, A))
    close(ef.evaluate("A[k,i] B[j,k]", A=A, B=B), np.einsum("ki,jk->ij", A, B))
    x, v = rand(3), rand(4)
    close(ef.evaluate("T = v[j] x[i]", x=x, v=v), np.outer(v, x))
    assert ef.evaluate("T = x[i] x[i]", x=x).shape == ()


# ---------------------------------------------------------------- delta


def test_delta_substitutes_a_contracted_index() -> None:
    x, A = rand(4), rand(4, 4)
    close(ef.evaluate("x[i] delta[i,j]", x=x), x)
    close(ef.evaluate("A[i,j] delta[i,j]", A=A), np.trace(A))
    close(ef.evaluate("T[i,k] = A[i,j] delta[j,k]", A=A), A)


def test_surviving_delta_is_a_diagonal() -> None:
    x = rand(4)
    close(ef.evaluate("T[i,j] = delta[i,j] x[j]", x=x), np.diag(x))
    close(ef.evaluate("T[i,j] = x[i] delta[i,j]", x=x), np.diag(x))
    close(ef.evaluate("T[i,j,k] = delta[i,j] delta[j,k] x[k]", x=x), np.einsum("ij,jk,k->ijk", np.eye(4), np.eye(4), x))


def test_delta_partner_gives_the_size() -> None:
    close(ef.evaluate("size n = 3\nT[n,m] = delta[n,m]"), np.eye(3, dtype=np.int64))
    x = rand(4)
    close(ef.evaluate("T[i,j] = 2 delta[i,j] + x[j] - x[j]", x=x), 2 * np.eye(4))


def test_summed_delta_counts_the_size() -> None:
    close(ef.evaluate("size n = 4\nt = delta[n,n]"), 4)
    # summing k and j over delta[k,j] counts the size of j, for every i
    close(ef.evaluate("size k = 5\nT[i] = x[i] delta[k,j]", x=np.ones(3)), 5 * np.ones(3))
    A, x = rand(3, 3), rand(3)
    close(ef.evaluate("T[i] = x[i] delta[k,j] + A[k,j] x[i]", x=x, A=A), 3 * x + A.sum() * x)
    close(ef.evaluate("T[l] = delta[j,l] + x[l]", x=x), 1 + x)


def test_delta_only_products_are_integers() -> None:
    eye = ef.evaluate("size n = 3\nT[n,m] = delta[n,m]")
    assert eye.dtype == np.int64
    close(eye, np.eye(3))
    assert ef.evaluate("size n = 3\nT[n] = delta[n,n]").dtype == np.int64
    assert ef.evaluate("size n = 3; size m = 2\nt = delta[n,n] delta[m,m]") == 6


# ---------------------------------------------------------------- size declarations


def test_size_declaration_from_a_tensor() -> None:
    M = rand(3, 5)
    got = ef.evaluate("size p, q = M\nT[p,q] = M[p,q] + delta[p,p] - 1", M=M)
    close(got, M)
    x = rand(4)
    close(ef.evaluate("size p = x; size q = x\nH[p,q] = 2 delta[p,q]", x=x), 2 * np.eye(4))


def test_size_literal_and_later_statements() -> None:
    program = "size n = 3\na[n,m] = delta[n,m]\nb[n] = a[n,n]\nc = b[n] b[n]"
    close(ef.evaluate(program), 3)
    close(ef.evaluate("size n = 5\nT[n] = delta[n,n]"), np.ones(5))


# ---------------------------------------------------------------- statements


def test_multi_statement_program() -> None:
    X, W, V = rand(6, 4), rand(4, 5), rand(5, 2)
    program = """
        h[b,k] = X[b,f] W[f,k]
        a[b,k] = tanh(h[b,k])
        o[b,c] = a[b,k] V[k,c]
        L = o[b,c] o[b,c]
    """
    out = np.tanh(X @ W) @ V
    close(ef.evaluate(program, X=X, W=W, V=V), np.sum(out**2))


def test_return_line_gives_a_tuple() -> None:
    A, x = rand(3, 3), rand(3)
    first, second = ef.evaluate("a[i] = A[i,j] x[j]\nb = a[i] a[i]\na, b", A=A, x=x)
    close(first, A @ x)
    close(second, (A @ x) @ (A @ x))
    single = ef.evaluate("a[i] = 2 x[i]\na,", x=x)
    assert isinstance(single, tuple) and len(single) == 1
    close(single[0], 2 * x)
    three = ef.evaluate("a[i] = 2 x[i]; b[i] = 3 x[i]; c = a[i] b[i]\nc, a, b,", x=x)
    assert len(three) == 3
    close(three[0], 6 * x @ x)


def test_semicolons_and_newlines_separate_statements() -> None:
    x = rand(3)
    assert np.allclose(ef.evaluate("a[i] = 2 x[i]; b = a[i] x[i]", x=x), 2 * x @ x)
    assert np.allclose(ef.evaluate("a[i] = 2 x[i]\n\n# note\nb = a[i] x[i]\n", x=x), 2 * x @ x)


# ---------------------------------------------------------------- types: weak scalars


def test_float_literal_keeps_float32() -> None:
    x = rand(4).astype(np.float32)
    assert ef.evaluate("y[i] = 0.5 * x[i]", x=x).dtype == np.float32
    assert ef.evaluate("y[i] = x[i] / 2", x=x).dtype == np.float32
    assert ef.evaluate("y[i] = x[i] + 1.5", x=x).dtype == np.float32
    assert ef.evaluate("y[i] = exp(x[i])", x=x).dtype == np.float32
    assert ef.evaluate("y[i] = x[i]^-0.5", x=np.abs(x) + 1).dtype == np.float32
    assert ef.evaluate("y[i] = sigmoid(x[i])", x=x).dtype == np.float32


def test_python_number_arguments_are_weak() -> None:
    x32 = rand(4).astype(np.float32)
    assert ef.evaluate("y[i] = s x[i]", s=0.5, x=x32).dtype == np.float32
    assert ef.evaluate("y[i] = s + x[i]", s=2.0, x=x32).dtype == np.float32
    i32 = np.arange(4, dtype=np.int32)
    assert ef.evaluate("y[i] = n x[i]", n=3, x=i32).dtype == np.int32
    # a numpy float64 scalar is not weak: numpy promotes, and so does einflow
    assert ef.evaluate("y[i] = s x[i]", s=np.float64(0.5), x=x32).dtype == (np.float64(0.5) * x32).dtype


def test_integer_literal_keeps_integers() -> None:
    x = np.arange(4)
    got = ef.evaluate("y[i] = 6 * x[i]", x=x)
    assert got.dtype == np.int64
    assert got.tolist() == (6 * x).tolist()
    assert ef.evaluate("y[i] = 6 x[i]", x=x.astype(np.int32)).dtype == np.int32
    assert ef.evaluate("y[i] = x[i]^2", x=x).dtype == np.int64
    assert ef.evaluate("y[i] = x[i] + 2", x=x).dtype == np.int64


def test_float_literals_promote_integers_like_numpy() -> None:
    x = np.arange(4)
    assert ef.evaluate("y[i] = 1.0 * x[i]", x=x).dtype == (1.0 * x).dtype
    assert ef.evaluate("y[i] = x[i] + 0.0", x=x).dtype == (x + 0.0).dtype
    assert ef.evaluate("y[i] = x[i] / 2", x=x).dtype == np.float64


@pytest.mark.parametrize("text", ["exp(x[i])", "log(x[i])", "log1p(x[i])", "sqrt(x[i])", "sin(x[i])", "cos(x[i])",
                                  "tanh(x[i])", "sigmoid(x[i])", "x[i]^-1", "x[i]^0.5", "x[i]^-2", "x[i]^1.5"])
def test_integers_are_promoted_by_transcendental_functions_and_negative_powers(text: str) -> None:
    x = np.arange(1, 5)
    got = ef.evaluate(f"y[i] = {text}", x=x)
    assert got.dtype == np.float64
    want = ef.evaluate(f"y[i] = {text}", x=x.astype(np.float64))
    close(got, want)


@pytest.mark.parametrize("text", ["abs(x[i])", "relu(x[i])", "sign(x[i])", "step(x[i])"])
def test_piecewise_functions_keep_integers(text: str) -> None:
    x = np.arange(-2, 3)
    got = ef.evaluate(f"y[i] = {text}", x=x)
    assert got.dtype.kind == "i"
    reference = {"abs": np.abs(x), "relu": np.maximum(x, 0), "sign": np.sign(x), "step": (x > 0).astype(int)}
    assert got.tolist() == reference[text.split("(")[0]].tolist()


def test_elementwise_functions_match_numpy() -> None:
    x = positive(5)
    z = rand(5)
    for name, reference in [("exp", np.exp(z)), ("log", np.log(x)), ("log1p", np.log1p(x)), ("sqrt", np.sqrt(x)),
                            ("sin", np.sin(z)), ("cos", np.cos(z)), ("tanh", np.tanh(z)),
                            ("sigmoid", 1 / (1 + np.exp(-z))), ("abs", np.abs(z)), ("relu", np.maximum(z, 0)),
                            ("sign", np.sign(z)), ("step", (z > 0) * 1.0)]:
        argument = x if name in ("log", "log1p", "sqrt") else z
        close(ef.evaluate(f"y[i] = {name}(x[i])", x=argument), reference)
    assert ef.evaluate("y = step(x)", x=0.0) == 0.0  # Heaviside with step(0) = 0


# ---------------------------------------------------------------- constant folding


def test_constant_folding_keeps_python_int_and_float() -> None:
    six = ef.evaluate("y = 2*3")
    assert six == 6 and np.asarray(six).dtype.kind == "i"
    half = ef.evaluate("y = 2/4")
    assert half == 0.5 and np.asarray(half).dtype.kind == "f"
    assert np.asarray(ef.evaluate("y = 2^0.5")).dtype.kind == "f"
    assert np.asarray(ef.evaluate("y = 2^3")).dtype.kind == "i"
    assert ef.evaluate("y = 2^3") == 8
    assert ef.evaluate("y = 2^-1") == 0.5


def test_constant_folding_never_raises() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = ef.evaluate("y = 9223372036854775807 + 1")
        assert np.asarray(big).dtype == np.float64 and big == 2.0**63
        assert np.asarray(ef.evaluate("y = 3^50")).dtype == np.float64
        assert ef.evaluate("y = 3^50") == pytest.approx(3.0**50)
        assert ef.evaluate("y = 10^400") == np.inf
        assert ef.evaluate("y = 1e308 * 10") == np.inf
        assert ef.evaluate("y = 1/0") == np.inf
        assert np.isnan(ef.evaluate("y = (-8)^0.5"))
        assert ef.evaluate("y = 99999999999999999999") == 1e20


def test_folded_constants_scale_without_extra_steps() -> None:
    x = rand(5)
    program = ef.compile("y[i] = x[i] (2^3 + 1) / 3")
    close(program(x=x), 3 * x)
    kinds = [step.kind for step in program.plan(x=(5,)).steps]
    assert "elementwise" not in kinds and "add" not in kinds
    close(ef.evaluate("y[i] = exp(0) x[i] + log(1)", x=x), x)


# ---------------------------------------------------------------- calling: pay once, extra arrays, mappings


def test_second_call_with_same_shapes_does_not_replan(monkeypatch: pytest.MonkeyPatch) -> None:
    program = ef.compile("C[i,k] = A[i,j] B[j,k] + A[i,j] B[j,l] D[l,k]")
    arrays = {"A": rand(3, 4), "B": rand(4, 5), "D": rand(5, 5)}
    first = program(arrays)
    assert program.cache_info().plans == 1
    calls: Counter[str] = Counter()

    def counting(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(einflow.program, "build_plan", counting("build_plan", einflow.program.build_plan))
    monkeypatch.setattr(einflow.engine.plan, "build_plan", counting("build_plan", einflow.engine.plan.build_plan))
    monkeypatch.setattr(opt_einsum, "contract_path", counting("contract_path", opt_einsum.contract_path))
    monkeypatch.setattr(einflow.engine.plan.oe, "contract_path", counting("contract_path", opt_einsum.contract_path))
    monkeypatch.setattr(einflow.program, "parse", counting("parse", einflow.program.parse))
    monkeypatch.setattr(einflow.program, "check_program", counting("check", einflow.program.check_program))
    again = {name: value.copy() for name, value in arrays.items()}
    second = program(again)
    close(second, first)
    assert ef.compile("C[i,k] = A[i,j] B[j,k] + A[i,j] B[j,l] D[l,k]") is program  # compiled once per text
    assert calls == Counter()
    assert program.cache_info().plans == 1
    # new shapes do plan again (so the counters above would have seen it)
    program(A=rand(2, 4), B=rand(4, 5), D=rand(5, 5))
    assert calls["build_plan"] >= 1 and calls["contract_path"] >= 1
    assert program.cache_info().plans == 2


def test_extra_arrays_in_a_mapping_are_ignored_extra_keywords_are_type_errors() -> None:
    x = rand(3)
    close(ef.evaluate("y = x[i] x[i]", {"x": x, "unused": rand(7, 7), "W": np.ones(2)}), x @ x)
    close(ef.compile("y = x[i] x[i]")({"x": x, "other": 1.0}), x @ x)
    with pytest.raises(TypeError, match="unused"):
        ef.evaluate("y = x[i] x[i]", x=x, unused=rand(7, 7))


def test_a_mapping_works_for_any_tensor_name() -> None:
    a, b = rand(3), rand(3)
    program = ef.compile("y = backend[i] optimize[i] + memory_limit")
    close(program({"backend": a, "optimize": b, "memory_limit": 1.0}), a @ b + 1)
    close(ef.evaluate("y[i] = mapping[i] + text[i]", {"mapping": a, "text": b}), a + b)


# ---------------------------------------------------------------- random programs against a dense oracle

_REFERENCE = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos,
    "tanh": np.tanh, "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)), "abs": np.abs,
    "relu": lambda a: np.maximum(a, 0.0), "sign": np.sign, "step": lambda a: (a > 0) * 1.0,
}
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _align(array: np.ndarray, labels: tuple[str, ...], order: tuple[str, ...]) -> np.ndarray:
    present = [label for label in order if label in labels]
    array = np.transpose(array, [labels.index(label) for label in present]) if labels else np.asarray(array)
    return array.reshape([array.shape[present.index(label)] if label in present else 1 for label in order])


def _oracle(expr: ir.Expr, bound: frozenset[str], env: dict[str, Any], sizes: dict[str, int]
            ) -> tuple[Any, tuple[str, ...]]:
    """LANGUAGE.md §3 read literally: dense deltas, one np.einsum per product, explicit broadcasting."""
    if isinstance(expr, ir.Num):
        return np.asarray(float(expr.value)), ()
    if isinstance(expr, (ir.Tensor, ir.Delta)):
        return _oracle(ir.Product((expr,)), bound, env, sizes)
    if isinstance(expr, ir.Product):
        coefficient = 1.0
        operands: list[tuple[Any, tuple[str, ...]]] = []
        for factor in expr.factors:
            if isinstance(factor, ir.Num):
                coefficient *= factor.value
            elif isinstance(factor, ir.Tensor):
                operands.append((np.asarray(env[factor.name], dtype=float), factor.indices))
            elif isinstance(factor, ir.Delta):
                identity = np.eye(sizes[factor.first], sizes[factor.second])
                operands.append((identity, (factor.first, factor.second)))
            else:
                operands.append(_oracle(factor, bound, env, sizes))
        counts = Counter(label for _, labels in operands for label in labels)
        order = list(dict.fromkeys(label for _, labels in operands for label in labels))
        output = tuple(label for label in order if counts[label] == 1 or label in bound)
        letter = {label: _LETTERS[n] for n, label in enumerate(order)}
        equation = ",".join("".join(letter[label] for label in labels) for _, labels in operands)
        equation += "->" + "".join(letter[label] for label in output)
        value = np.einsum(equation, *[array for array, _ in operands]) if operands else np.asarray(1.0)
        return value * coefficient, output
    if isinstance(expr, ir.Sum):
        parts = [_oracle(term, bound, env, sizes) for term in expr.terms]
        order = tuple(dict.fromkeys(label for _, labels in parts for label in labels))
        total = sum(_align(array, labels, order) for array, labels in parts)
        return np.broadcast_to(total, [sizes[label] for label in order]), order
    if isinstance(expr, ir.Call):
        value, labels = _oracle(expr.arg, bound, env, sizes)
        return _REFERENCE[expr.func](value), labels
    if isinstance(expr, ir.Power):
        value, labels = _oracle(expr.base, bound, env, sizes)
        return np.power(value, float(expr.exponent)), labels
    if isinstance(expr, ir.Reduce):
        value, labels = _oracle(expr.body, bound | frozenset(expr.indices), env, sizes)
        axes = tuple(n for n, label in enumerate(labels) if label in expr.indices)
        return value.sum(axis=axes), tuple(label for label in labels if label not in expr.indices)
    raise TypeError(expr)


def _oracle_sizes(statement: ir.Assign, env: dict[str, Any]) -> dict[str, int] | None:
    """Each index's size from the axes it labels and from delta partners; None when they disagree or lack one."""
    sizes: dict[str, int] = {}
    pairs: list[tuple[str, str]] = []
    stack: list[Any] = [statement.expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ir.Tensor):
            for index, size in zip(node.indices, np.shape(env[node.name])):
                if sizes.setdefault(index, size) != size:
                    return None
        elif isinstance(node, ir.Delta):
            pairs.append((node.first, node.second))
        stack.extend(getattr(node, "factors", ()) + getattr(node, "terms", ()))
        stack.extend(getattr(node, child) for child in ("arg", "base", "body") if hasattr(node, child))
    for _ in pairs:  # enough rounds to carry a size along any chain of deltas
        for first, second in pairs:
            known = sizes.get(first, sizes.get(second))
            if known is not None and sizes.setdefault(first, known) != sizes.setdefault(second, known):
                return None
    indices = {i for p in pairs for i in p} | set(statement.indices or ())
    return sizes if indices <= set(sizes) else None


def _oracle_statement(statement: ir.Assign, env: dict[str, Any], sizes: dict[str, int]) -> Any:
    if statement.indices is None:
        return _oracle(statement.expr, frozenset(), env, sizes)[0]
    target = statement.indices
    terms = statement.expr.terms if isinstance(statement.expr, ir.Sum) else (statement.expr,)
    total = np.zeros([sizes[label] for label in target])
    for term in terms:
        value, labels = _oracle(term, frozenset(target), env, sizes)
        value = value.sum(axis=tuple(n for n, label in enumerate(labels) if label not in target))
        total = total + _align(value, tuple(label for label in labels if label in target), target)
    return total


def test_random_programs_match_a_dense_oracle(make_expression: Any) -> None:
    # distinct sizes per index (i: 2, j: 3, k: 4), so that mixing up two indices cannot go unnoticed
    env = {"s": 1.3, "x": positive(2), "y": positive(2), "v": positive(3), "A": positive(2, 3), "B": positive(3, 4)}
    generator = random.Random(7)
    compared = 0
    for _ in range(600):
        text = make_expression(generator, 4)
        names = sorted({c for c in "ijkl" if f"{c}]" in text or f"{c}," in text})
        forms = [text]
        if names:
            generator.shuffle(names)
            forms.append(f"T[{','.join(names[:generator.randint(1, len(names))])}] = {text}")
        for form in forms:
            try:
                program = ef.compile(form)
            except ef.IndexRuleError:
                continue
            statement = program.ir.statements[0]
            sizes = _oracle_sizes(statement, env)
            with np.errstate(all="ignore"):
                if sizes is None:  # the language refuses it too
                    with pytest.raises(ef.ShapeError):
                        program(env)
                    continue
                want = _oracle_statement(statement, env, sizes)
                if not np.all(np.isfinite(want)) or np.max(np.abs(want), initial=0) > 1e8:
                    continue  # ill-conditioned (division by a delta's zeros, overflow): not about indices
                got = program(env)
            assert np.shape(got) == np.shape(want), form
            np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10, err_msg=form)
            compared += 1
    assert compared > 300


# ---------------------------------------------------------------- the user docs run


def test_language_doc_examples() -> None:
    import doctest
    import pathlib
    import re

    path = pathlib.Path(__file__).resolve().parent.parent / "docs" / "language.md"
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)
    assert len(blocks) > 20
    text = "\n\n".join(block for block in blocks if ">>>" in block)
    test = doctest.DocTestParser().get_doctest(text, {}, "docs/language.md", str(path), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.run(test, out=lambda report: print(report, end=""))
    assert test.examples and runner.failures == 0
