"""Every user mistake is an EinflowError subclass whose message names what went wrong and where."""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef


def error_of(kind: type[Exception], text: str, **arrays: object) -> Exception:
    with pytest.raises(kind) as caught:
        ef.evaluate(text, **arrays)
    assert isinstance(caught.value, ef.EinflowError)
    return caught.value


def caret_column(message: str, source_line: str) -> int:
    """The 1-based column the caret under ``source_line`` points at, read from the message."""
    lines = message.splitlines()
    for position, line in enumerate(lines[:-1]):
        if line.endswith(source_line) and line.strip() == source_line.strip() and lines[position + 1].strip() == "^":
            return lines[position + 1].index("^") - (len(line) - len(source_line)) + 1
    raise AssertionError(f"no caret under {source_line!r} in:\n{message}")


# ---------------------------------------------------------------- the hierarchy


def test_every_error_class_is_an_einflow_error() -> None:
    for kind in (ef.ParseError, ef.ShapeError, ef.IndexRuleError, ef.TensorNameError, ef.DerivativeError,
                 ef.BackendError, ef.MemoryLimitError):
        assert issubclass(kind, ef.EinflowError)
    assert issubclass(ef.EinflowError, Exception)


# ---------------------------------------------------------------- ParseError


@pytest.mark.parametrize(("text", "line", "column", "words"), [
    ("C[i,j] = A[i,k] B[k,j", 1, 22, ["unexpected end of input", "expected", "']'"]),
    ("a = x[i]\nb = y[i] )", 2, 10, ["unexpected ')'", "expected"]),
    ("y = x @ z", 1, 7, ["unexpected character '@'"]),
    ("y = x[i] 2", 1, 10, ["number", "'*'"]),
    ("y = 1.5.3", 1, 8, ["number"]),
    ("y = x[i]^y[i]", 1, 10, ["unexpected 'y'", "expected", "a number"]),
    ("a = 1\n\n  y = x +\n", 3, 10, ["expected an expression"]),
    ("y = x[]", 1, 7, ["unexpected ']'", "expected a name"]),
    ("y[i] = exp x[i]", 1, 8, ["write exp(...)", "'exp' is a reserved word"]),
    ("y = (a + b", 1, 11, ["end of input", "')'"]),
])
def test_parse_error_position_caret_and_words(text: str, line: int, column: int, words: list[str]) -> None:
    error = error_of(ef.ParseError, text)
    assert (error.line, error.column) == (line, column)
    message = str(error)
    assert message.startswith(f"line {line}, column {column}: ")
    for word in words:
        assert word in message
    source_line = text.splitlines()[line - 1]
    assert caret_column(message, source_line) == column


def test_parse_error_keeps_the_source_line() -> None:
    error = error_of(ef.ParseError, "a = 1\nb = ]")
    assert error.source_line == "b = ]"
    assert "unexpected ']'" in error.reason


def test_reserved_word_used_as_a_name() -> None:
    error = error_of(ef.ParseError, "y[i] = x[sum]")
    assert (error.line, error.column) == (1, 10)
    assert "'sum' is a reserved word" in str(error)


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "# just a comment", "# one\n\n# two\n", ";", " ; ;\n"])
def test_empty_program(text: str) -> None:
    error = error_of(ef.ParseError, text)
    assert "empty program" in str(error)
    assert (error.line, error.column) == (1, 1)


# ---------------------------------------------------------------- ShapeError


def test_size_conflict_names_index_sizes_and_tensors() -> None:
    error = error_of(ef.ShapeError, "y = A[i,j] B[j,k]", A=np.ones((2, 3)), B=np.ones((4, 5)))
    message = str(error)
    assert "'j'" in message and "3" in message and "4" in message
    assert "A" in message and "B" in message
    assert caret_column(message, "y = A[i,j] B[j,k]") >= 5


def test_size_conflict_between_terms_and_with_a_declaration() -> None:
    message = str(error_of(ef.ShapeError, "y[i] = x[i] + v[i]", x=np.ones(2), v=np.ones(3)))
    assert "'i'" in message and "2" in message and "3" in message and "x" in message and "v" in message
    message = str(error_of(ef.ShapeError, "size n = 3\ny[n] = x[n]", x=np.ones(4)))
    assert "'n'" in message and "3" in message and "4" in message and "size n = 3" in message


def test_delta_joining_different_sizes() -> None:
    message = str(error_of(ef.ShapeError, "T[i,j] = delta[i,j] A[i,k] B[j,l]", A=np.ones((2, 2)), B=np.ones((3, 3))))
    assert "delta[i,j]" in message and "2" in message and "3" in message


def test_wrong_rank_names_tensor_rank_and_index_count() -> None:
    message = str(error_of(ef.ShapeError, "y = x[i]", x=np.ones((2, 3))))
    assert "'x'" in message and "rank 2" in message and "1 indices" in message
    message = str(error_of(ef.ShapeError, "y = s x[i]", s=np.ones(3), x=np.ones(3)))
    assert "'s'" in message and "rank 1" in message and "0 indices" in message


def test_index_without_a_size_is_named() -> None:
    message = str(error_of(ef.ShapeError, "T[i,j] = delta[i,j]"))
    assert "index 'i' has no size" in message and "size i = " in message


def test_size_declaration_rank_mismatch() -> None:
    message = str(error_of(ef.ShapeError, "size p = M\ny = 1", M=np.ones((2, 3))))
    assert "'M'" in message and "rank 2" in message and "1 indices" in message


# ---------------------------------------------------------------- TensorNameError


def test_unbound_tensor_is_named() -> None:
    error = error_of(ef.TensorNameError, "y = A[i,j] B[j,k]", A=np.ones((2, 3)))
    assert "'B'" in str(error) and "not bound" in str(error)


def test_a_name_is_assigned_once() -> None:
    message = str(error_of(ef.TensorNameError, "a = x[i] x[i]\na = 2", x=np.ones(2)))
    assert "'a'" in message and "assigned twice" in message
    assert caret_column(message, "a = 2") == 1


def test_a_target_may_not_reuse_an_input_name() -> None:
    message = str(error_of(ef.TensorNameError, "y = x[i] x[i]\nx = 2 y", x=np.ones(2)))
    assert "'x'" in message and "input" in message
    message = str(error_of(ef.TensorNameError, "y = x + y", x=1.0, y=2.0))
    assert "'y'" in message and "own assignment" in message


def test_return_line_naming_an_unknown_target() -> None:
    message = str(error_of(ef.TensorNameError, "a = x[i] x[i]\na, b", x=np.ones(2)))
    assert "'b'" in message


# ---------------------------------------------------------------- IndexRuleError (compile time)


def compile_error(text: str) -> str:
    with pytest.raises(ef.IndexRuleError) as caught:
        ef.compile(text)
    return str(caught.value)


def test_target_index_missing_on_the_right_side() -> None:
    message = compile_error("y[i,k] = A[i,j]")
    assert "target index 'k'" in message and "y" in message


def test_summing_a_bound_index() -> None:
    assert "'k'" in compile_error("y[k] = sum[k](x[k])") and "bound" in compile_error("y[k] = sum[k](x[k])")
    assert "bound" in compile_error("c = sum[i](x[i] sum[i](y[i]))")


def test_repeated_target_index() -> None:
    assert "'i' is repeated" in compile_error("T[i,i] = A[i,j]")


@pytest.mark.parametrize("text", [
    "c = x[i] + y[i] z[i]",  # contracted in one term of a sum, free in the sum
    "c = x[i] exp(y[i] z[i])",  # contracted in a function argument, free in the product
    "c = exp(y[i] z[i]) x[i]",
    "c = x[i] (y[i] z[i])^2",  # power base
    "c = x[i] / (y[i] z[i])",  # divisor
    "c[j] = v[j] (x[i] + y[i] z[i])",  # inside one term of an explicit statement
])
def test_ambiguity_guard(text: str) -> None:
    message = compile_error(text)
    assert "ambiguous index 'i'" in message and "rename" in message
    assert "^" in message  # points into the source


@pytest.mark.parametrize("text", [
    "c[i] = x[i] + y[i] z[i]",  # the target binds i: nothing is contracted
    "c = x[i] + sum[i](y[i] z[i])",  # sum binds i
    "c = x[i] + y[j] z[j]",  # another dummy name
    "c = x[j] x[j] + y[j] y[j]",  # sibling scopes reuse a dummy
    "y[i] = A[i,j] x[j] + v[j]",  # top-level terms of an explicit statement are exempt
    "c = sum[i](x[i]) + sum[i](y[i]) x[j]",
])
def test_what_the_ambiguity_guard_allows(text: str) -> None:
    ef.compile(text)


def test_other_compile_time_rules() -> None:
    assert "rank" in compile_error("A[i] + A[i,j]")
    assert "does not occur in its body" in compile_error("sum[k](x[i])")
    assert "twice" in compile_error("sum[i,i](A[i,i])")
    assert "last statement" in compile_error("a = x\na,\nb = a")
    assert "size declaration names" in compile_error("a = x[i]\nsize n, m = x")


# ---------------------------------------------------------------- other error classes


def test_derivative_errors() -> None:
    with pytest.raises(ef.DerivativeError, match="scalar"):
        ef.grad("y[i] = 2 x[i]", wrt="x")
    with pytest.raises(ef.DerivativeError, match="'z'"):
        ef.grad("f = x[i] x[i]", wrt="z")


def test_backend_error_lists_the_choices() -> None:
    with pytest.raises(ef.BackendError, match="'nope'.*numpy"):
        ef.compile("f = x[i] x[i]")(x=np.ones(3), backend="nope")


def test_memory_limit_error_names_the_shape_and_allocates_nothing() -> None:
    program = ef.compile("C[i,k] = A[i,j] B[j,k]")
    with pytest.raises(ef.MemoryLimitError, match=r"\(100, 100\)"):
        program(A=np.ones((100, 10)), B=np.ones((10, 100)), memory_limit=1000)


def test_non_text_and_non_numeric_inputs() -> None:
    with pytest.raises(ef.EinflowError, match="einflow text"):
        ef.compile(3)  # type: ignore[arg-type]
    with pytest.raises(ef.EinflowError, match="'x'"):
        ef.evaluate("y = x[i] x[i]", x=np.array(["a", "b"]))


def test_einsum_errors() -> None:
    with pytest.raises(ef.ShapeError, match="'j'"):
        ef.einsum("ij,jk", np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ef.EinflowError, match="not a letter"):
        ef.einsum("i$", np.ones((2, 2)))


def test_dtypes_numpy_refuses_are_einflow_errors() -> None:
    # numpy will not mix the literal -1 with uint8 arrays (booleans enter as int64: their sign is defined)
    with pytest.raises(ef.EinflowError, match="dtypes"):
        ef.evaluate("y[i] = -x[i]", x=np.arange(3, dtype=np.uint8))
    assert ef.evaluate("y[i] = sign(x[i])", x=np.array([True, False])).tolist() == [1, 0]
    with pytest.raises(ef.EinflowError, match="dtypes"):
        ef.evaluate("y[i] = 99999999999999 x[i]", x=np.arange(3, dtype=np.int32))
