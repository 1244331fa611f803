"""The grammar (LANGUAGE.md §1-2): conflict-free, every syntax form, reserved words, printer round trip."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import pytest
from lark import Lark
from lark.exceptions import GrammarError, LexError

import einflow as ef
from einflow.lang import ir
from einflow.lang.grammar import parse, parse_expression
from einflow.lang.grammar.parser import build_parser

T = ir.Tensor
N = ir.Num


def x_(*indices: str) -> ir.Tensor:
    return T("x", indices)


def only(text: str) -> ir.Statement:
    (statement,) = parse(text).statements
    return statement


# ---------------------------------------------------------------- the grammar itself


def test_lark_strict_mode_rejects_conflicts_here() -> None:
    # the check below is only meaningful if strict mode really refuses conflicts and collisions
    with pytest.raises(GrammarError):
        Lark('start: a | b\na: "x"\nb: "x"', parser="lalr", strict=True)
    with pytest.raises(LexError):
        Lark("start: A | B\nA: /x+/\nB: /xy*/", parser="lalr", strict=True)


def test_grammar_builds_in_strict_mode() -> None:
    parser = build_parser(strict=True)
    tree = parser.parse("C[i,j] = A[i,k] B[k,j]; size n = 3\nt = -x^2 + sum[i](exp(x[i]))\nC, t")
    assert tree.data == "start"


# ---------------------------------------------------------------- names and targets


def test_multi_letter_index_names() -> None:
    assert parse_expression("W[batch, hidden]") == T("W", ("batch", "hidden"))
    assert parse_expression("W_2[b1,h_x]") == T("W_2", ("b1", "h_x"))


def test_explicit_target() -> None:
    assert only("C[i,j] = A[i,k] B[k,j]") == ir.Assign(
        "C", ("i", "j"), ir.Product((T("A", ("i", "k")), T("B", ("k", "j")))))


def test_implicit_target_and_bare_expression() -> None:
    product = ir.Product((x_("i"), x_("i")))
    assert only("f = x[i] x[i]") == ir.Assign("f", None, product)
    assert only("x[i] x[i]") == ir.Assign(None, None, product)


def test_bare_names_are_zero_dimensional_tensors() -> None:
    assert parse_expression("s x[i]") == ir.Product((T("s"), x_("i")))
    assert only("t = s") == ir.Assign("t", None, T("s"))


def test_names_may_contain_reserved_words() -> None:
    expr = parse_expression("exponent[i] sums deltax size_n x[sign_] logx sum1")
    assert [factor.name for factor in expr.factors] == ["exponent", "sums", "deltax", "size_n", "x", "logx", "sum1"]
    assert expr.factors[4].indices == ("sign_",)


# ---------------------------------------------------------------- operators and precedence


def test_sum_and_difference() -> None:
    a, b, c = T("a"), T("b"), T("c")
    assert parse_expression("a + b - c") == ir.Sum((a, b, ir.negate(c)))
    assert parse_expression("a - b") == ir.Sum((a, ir.negate(b)))


def test_a_minus_b_forms() -> None:
    difference = ir.Sum((T("a"), ir.negate(T("b"))))
    assert parse_expression("a - b") == difference
    assert parse_expression("a -b") == difference
    assert parse_expression("a-b") == difference
    assert parse_expression("a (-b)") == ir.Product((T("a"), N(-1), T("b")))
    assert parse_expression("x[i] -y[i]") == ir.Sum((x_("i"), ir.negate(T("y", ("i",)))))


def test_multiplication_division_and_juxtaposition() -> None:
    a, b, c = T("a"), T("b"), T("c")
    assert parse_expression("a * b / c") == ir.Product((a, b, ir.Power(c, -1)))
    assert parse_expression("a b / c") == ir.Product((a, b, ir.Power(c, -1)))
    assert parse_expression("2 x[i]") == ir.Product((N(2), x_("i")))
    assert parse_expression("A[i,k] B[k,j]") == ir.Product((T("A", ("i", "k")), T("B", ("k", "j"))))
    assert parse_expression("A[i,k]B[k,j]") == parse_expression("A[i,k] B[k,j]")
    # a divisor is one factor: a / (b c) keeps (b c) together
    assert parse_expression("a / (b c)") == ir.Product((a, ir.Power(ir.Product((b, c)), -1)))


def test_products_flatten_through_parentheses() -> None:
    assert parse_expression("a[i] (b[i] c[i])") == parse_expression("a[i] b[i] c[i]")
    assert parse_expression("(a b) (c)") == ir.Product((T("a"), T("b"), T("c")))
    # a parenthesized sum is one factor
    assert parse_expression("a (b + c)") == ir.Product((T("a"), ir.Sum((T("b"), T("c")))))


def test_unary_minus_binds_looser_than_power() -> None:
    assert parse_expression("-x^2") == ir.Product((N(-1), ir.Power(T("x"), 2)))
    assert parse_expression("-x**2") == parse_expression("-x^2")
    assert parse_expression("-2^2") == ir.Product((N(-1), ir.Power(N(2), 2)))
    assert parse_expression("+x") == T("x")
    assert parse_expression("- -x") == ir.Product((N(1), T("x")))
    assert parse_expression("-3") == N(-3)


@pytest.mark.parametrize(("text", "exponent"), [
    ("x[i]^2", 2), ("x[i]**2", 2), ("x[i] ^ 2", 2), ("x[i]^-0.5", -0.5), ("x[i]**-0.5", -0.5), ("x[i]^+2", 2),
    ("x[i]^(-1)", -1), ("x[i]^(+3)", 3), ("x[i] ** (-0.5)", -0.5), ("x[i]^(2)", 2), ("x[i]^1e-3", 1e-3),
])
def test_power_exponents(text: str, exponent: float) -> None:
    parsed = parse_expression(text)
    assert parsed == ir.Power(x_("i"), exponent)
    assert type(parsed.exponent) is type(exponent)


def test_power_base_is_an_atom() -> None:
    assert parse_expression("(a + b)^2") == ir.Power(ir.Sum((T("a"), T("b"))), 2)
    assert parse_expression("a b^2") == ir.Product((T("a"), ir.Power(T("b"), 2)))
    assert parse_expression("exp(x)^2") == ir.Power(ir.Call("exp", T("x")), 2)


@pytest.mark.parametrize(("text", "value"), [
    ("2", 2), ("2.", 2.0), ("0.5", 0.5), (".5", 0.5), ("1e-3", 1e-3), ("2.5E+4", 2.5e4), ("10", 10), ("1E3", 1000.0),
])
def test_numbers(text: str, value: float) -> None:
    number = parse_expression(text)
    assert number == N(value)
    assert type(number.value) is type(value)


@pytest.mark.parametrize("name", ir.FUNCTIONS)
def test_every_function(name: str) -> None:
    assert len(ir.FUNCTIONS) == 19  # v4 added conj, real, imag, abs2, angle (LANGUAGE.md 9.2)
    assert parse_expression(f"{name}(x[i])") == ir.Call(name, x_("i"))
    assert parse_expression(f"{name}(x[i] + 1) y[i]") == ir.Product(
        (ir.Call(name, ir.Sum((x_("i"), N(1)))), T("y", ("i",))))


def test_sum_reduction() -> None:
    assert parse_expression("sum[i](x[i])") == ir.Reduce(("i",), x_("i"))
    assert parse_expression("sum[i, j](A[i,j])") == ir.Reduce(("i", "j"), T("A", ("i", "j")))
    assert parse_expression("sum[k](sum[j](A[j,k]))") == ir.Reduce(("k",), ir.Reduce(("j",), T("A", ("j", "k"))))


def test_delta() -> None:
    assert parse_expression("delta[i,j]") == ir.Delta("i", "j")
    assert parse_expression("2 delta[i, j] x[j]") == ir.Product((N(2), ir.Delta("i", "j"), x_("j")))


# ---------------------------------------------------------------- statements


def test_size_declarations() -> None:
    program = parse("size p, q = M\nsize n = 10\nT[p,q,n] = M[p,q] delta[n,n]")
    assert program.statements[0] == ir.SizeDecl(("p", "q"), "M")
    assert program.statements[1] == ir.SizeDecl(("n",), 10)
    assert isinstance(program.statements[1].source, int)


def test_return_lines() -> None:
    program = parse("a = x[i] x[i]\nb[i] = 2 x[i]\na, b")
    assert program.statements[-1] == ir.Return(("a", "b"))
    assert parse("a = x[i] x[i]\nt, a,").statements[-1] == ir.Return(("t", "a"))
    assert parse("t = x[i] x[i]\nt,").statements[-1] == ir.Return(("t",))


def test_comments_semicolons_and_blank_lines() -> None:
    program = parse("# leading comment\n\ny[i] = x[i] # trailing comment\n;; z = y[i] y[i];\n\n  # end\n")
    assert len(program.statements) == 2
    assert program == parse("y[i] = x[i]; z = y[i] y[i]")
    assert parse("a = x\r\nb = a") == parse("a = x\nb = a")


def test_newlines_inside_brackets_are_white_space() -> None:
    assert parse("C[i,\n  j] = A[i,\n k] B[k,j]") == parse("C[i,j] = A[i,k] B[k,j]")
    assert parse("y = (a\n + b\n)") == parse("y = (a + b)")
    assert parse("y = sum[i](\n  x[i]\n  y[i]\n)") == parse("y = sum[i](x[i] y[i])")
    assert parse("y = exp(\n x)\nz = y") == parse("y = exp(x); z = y")


def test_newline_ends_a_statement_outside_brackets() -> None:
    program = parse("a = x\n- y")
    assert len(program.statements) == 2  # the second line is its own bare statement
    assert program.statements[1] == ir.Assign(None, None, ir.negate(T("y")))


@pytest.mark.parametrize("text", ["x[i] 2", "1.5.3", "x^y", "x^2^3", "x^(y)", "y = ", "= x", "x[]", "A[i j]",
                                  "sum(x[i])", "delta[i]", "delta[i,j,k]", "size n = -1", "size n = 1.5",
                                  "size n = 2e1", "a, b = x", "x[i] @ y[i]", "exp x", "y[i] =", "(a b",
                                  "a b)", "x ^ --2", "T[i][j] = x[i]", "y = x[i]^", "2 3"])
def test_invalid_syntax_is_a_parse_error(text: str) -> None:
    with pytest.raises(ef.ParseError):
        parse(text)


# ---------------------------------------------------------------- reserved words

_NAME_POSITIONS = [
    "{w} = x", "{w}[i] = x[i]", "y = {w} x", "y[{w}] = x[{w}]", "y = x[{w}]", "y = sum[{w}](x[{w}])",
    "y = delta[{w}, i] x[i]", "y = delta[i, {w}] x[i]", "size {w} = x\ny = 1", "size n, {w} = A\ny = 1",
    "size n = {w}\ny = 1", "y = x\n{w}, y", "y = x\ny, {w}", "y = x\n{w},", "y = {w}",
]


@pytest.mark.parametrize("word", sorted(ir.RESERVED))
@pytest.mark.parametrize("position", _NAME_POSITIONS)
def test_reserved_words_are_rejected_as_names(word: str, position: str) -> None:
    assert len(ir.RESERVED) == 39  # 27, inv, det, logdet, symmetric, spd (8.1), 5 functions, hermitian, sign_det
    with pytest.raises(ef.ParseError):
        parse(position.format(w=word))


def test_reserved_word_message_names_the_word() -> None:
    with pytest.raises(ef.ParseError, match="'delta' is a reserved word") as caught:
        parse("y[i] = x[delta]")
    assert (caught.value.line, caught.value.column) == (1, 10)
    with pytest.raises(ef.ParseError, match="'exp' is a reserved word"):
        parse("exp = x")


# ---------------------------------------------------------------- round trip

CORPUS = [
    "C[i,j] = A[i,k] B[k,j]",
    "f = x[i] x[i]",
    "x[i] x[i]",
    "a - b", "a -b", "a (-b)", "-x^2", "(-x)^2", "-(x^2)", "- -x", "a - (b - c)", "a - (-b)", "(a + b) - (c + d)",
    "a / b / c", "a / (b / c)", "a / (b c)", "(a / b) c", "2 / x", "-1 / x", "x / -2", "x * -1", "2 * 3", "2 * -3",
    "(x^2)^3", "x^-0.5", "x^(-1)", "(x + 1)^-2", "2^3 x", "x * 2^3",
    "x * 2.5^2", "(-2)^2", "-2^2", "exp(x)^2", "(2 x)^2",
    "y = 0.5 + .5 + 1e-3 + 2.5E+4 + 2. + 10",
    "y = 1e999 x", "y = 12345678901234567890 x", "y = 0.1 + 0.2",
    "W[batch, hidden] b[hidden]",
    "y[i] = sum[j](A[i,j] x[j]) + c[i]",
    "sum[s](log(1 + exp(-y[s] X[s,f] w[f])))",
    "exp(x[i]) log(x[i]) log1p(x[i]) sqrt(x[i]) sin(x[i]) cos(x[i])",
    "tanh(x[i]) sigmoid(x[i]) abs(x[i]) relu(x[i]) sign(x[i]) step(x[i])",
    "T[i,j] = delta[i,j] x[j]",
    "size p, q = M\nT[p,q] = delta[p,q]",
    "size n = 10\nT[n] = delta[n,n]",
    "a = x[i] x[i]\nb[i] = a x[i]\na, b",
    "t = x[i] x[i]\nt,",
    "h[b,k] = tanh(X[b,f] W[f,k] + c[k])\nL = h[b,k] h[b,k]",
    "y[i] = -A[i,j] x[j] - 2 c[i] + 3",
    "y = -(a + b) c", "y = (a + b) (c - d)", "y = -(a - b)", "y = a + -b", "y = a * (b + c) / (d - e)",
    "y = 2 (a + b)", "y = -2 (a + b)", "y = x - 1", "y = -1 + x", "y = -1.5 x", "y = x * -1.5", "y = -x z",
]


def _random_corpus(make_expression: Any, count: int) -> list[str]:
    generator = random.Random(11)
    return [make_expression(generator, 4) for _ in range(count)]


@pytest.mark.parametrize("text", CORPUS)
def test_round_trip_parses_to_the_same_program(text: str) -> None:
    program = parse(text)
    printed = str(program)
    assert parse(printed) == program
    assert str(parse(printed)) == printed  # printing is a fixed point


def test_round_trip_of_random_expressions(make_expression: Any) -> None:
    for text in _random_corpus(make_expression, 800):
        program = parse(text)
        printed = str(program)
        assert parse(printed) == program, (text, printed)


def _arrays() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    return {"s": 1.3, "x": rng.uniform(0.5, 1.5, 3), "y": rng.uniform(0.5, 1.5, 3), "v": rng.uniform(0.5, 1.5, 4),
            "A": rng.uniform(0.5, 1.5, (3, 4)), "B": rng.uniform(0.5, 1.5, (4, 2))}


def test_round_trip_evaluates_identically(make_expression: Any) -> None:
    arrays = _arrays()
    evaluated = 0
    for text in _random_corpus(make_expression, 600):
        try:
            program = ef.compile(text)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = program(arrays)
        except (ef.IndexRuleError, ef.ShapeError):
            continue
        again = ef.compile(str(program))
        assert again.ir == program.ir
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other = again(arrays)
        assert np.shape(other) == np.shape(value)
        np.testing.assert_array_equal(other, value, err_msg=text)
        evaluated += 1
    assert evaluated > 200


@pytest.mark.parametrize("text", [t for t in CORPUS if "size" not in t and "M" not in t])
def test_corpus_round_trip_evaluates_identically(text: str) -> None:
    program = parse(text)
    names = {}
    for statement in program.statements:
        if isinstance(statement, ir.Assign):
            stack: list[ir.Expr] = [statement.expr]
            while stack:
                node = stack.pop()
                if isinstance(node, ir.Tensor):
                    names[node.name] = len(node.indices)
                for child in ("factors", "terms"):
                    stack.extend(getattr(node, child, ()))
                for child in ("arg", "base", "body"):
                    if hasattr(node, child):
                        stack.append(getattr(node, child))
    targets = {s.target for s in program.statements if isinstance(s, ir.Assign)}
    rng = np.random.default_rng(3)
    arrays = {name: rng.uniform(0.5, 1.5, (3,) * rank) for name, rank in names.items() if name not in targets}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = ef.compile(text)(arrays)
        second = ef.compile(str(program))(arrays)
    for got, want in zip(second if isinstance(second, tuple) else (second,),
                         first if isinstance(first, tuple) else (first,)):
        np.testing.assert_array_equal(got, want)


def test_spans_take_no_part_in_equality() -> None:
    first, second = parse("y  =  x[i]   x[i]"), parse("y = x[i] x[i]")
    assert first == second and hash(first) == hash(second)
    assert first.statements[0].expr.span != second.statements[0].expr.span


# ---------------------------------------------------------------- round trip of IR built in code (as autodiff does)

_IR_TENSORS = {"s": (), "x": ("i",), "y": ("i",), "v": ("j",), "A": ("i", "j")}
_IR_NUMBERS = (2, 3, -1, -2, 0.5, -0.5, 1.0, -1.0, 0, -0.0, 1e20, 12345678901234567890, 2.5e-7, 1, float("inf"))


def _random_ir(generator: random.Random, depth: int) -> ir.Expr:
    """A random valid expression node (products flat, as ir.product builds them)."""
    choice = generator.random()
    if depth <= 0 or choice < 0.3:
        if generator.random() < 0.25:
            return N(generator.choice(_IR_NUMBERS))
        name = generator.choice(list(_IR_TENSORS))
        return T(name, _IR_TENSORS[name])
    if choice < 0.5:
        return ir.product(*[_random_ir(generator, depth - 1) for _ in range(generator.randint(2, 3))])
    if choice < 0.65:
        return ir.Sum(tuple(_random_ir(generator, depth - 1) for _ in range(generator.randint(2, 3))))
    if choice < 0.75:
        return ir.Power(_random_ir(generator, depth - 1), generator.choice((2, -1, 0.5, -0.5, 3, 1, -2, 2.0)))
    if choice < 0.85:
        return ir.Call(generator.choice(ir.FUNCTIONS), _random_ir(generator, depth - 1))
    if choice < 0.9:
        return ir.Delta(generator.choice("ij"), generator.choice("ij"))
    return ir.Reduce(("k",), ir.product(_random_ir(generator, depth - 1), T("x", ("k",))))


def test_printed_ir_parses_back_to_the_same_ir() -> None:
    generator = random.Random(17)
    for _ in range(2000):
        statement = ir.Assign(generator.choice((None, "T")), None, _random_ir(generator, 4))
        program = ir.ProgramIR((statement,))
        text = ir.format_program(program)
        assert parse(text) == program, text


def test_printed_numbers_keep_value_and_type() -> None:
    for value in (0, 7, -3, 2**70, 0.1, -2.5, 1e-300, 1e300, float("inf"), -0.0, 5e-324, 1 / 3):
        text = ir.format_number(value)
        parsed = parse_expression(text)
        number = parsed if isinstance(parsed, ir.Num) else None
        assert number is not None and number.value == value and type(number.value) is type(value), text
