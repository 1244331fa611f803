"""Highlighting: the pygments lexer (token kinds, lossless, plugin registration), its style; module layering."""

from __future__ import annotations

import random

import pytest
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
from pygments.token import Comment, Error, Keyword, Name, Number, Operator, String

from einflow.lang.grammar import parse
from einflow.lang.ir import FUNCTIONS, MATRIX_DECLARATIONS
from einflow.shell.highlight import EinflowLexer

PROGRAMS = [
    "C[i,j] = A[i,k] B[k,j]",
    "y[i] = sum[k](exp(A[i,k]) x[k]^2) / 2. + delta[i,j] b[j] ** -1",
    "size p, q = A\nd2f[p,q] = 2 delta[p,q]  # a Hessian",
    "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))",
    "f = x[i]^(-0.5) + .5e-3 * sigmoid(z[i]); g = relu(-f)",
    "dL_dx, dL_dA",
    "h[b,\n  o] = tanh(W[o, i] X[b, i])",
]


def tokens(text: str) -> list[tuple[object, str]]:
    return [(kind, value) for kind, value in EinflowLexer().get_tokens(text) if value.strip()]


def kinds_of(text: str, kind: object) -> list[str]:
    return [value for token, value in tokens(text) if token in kind]


@pytest.mark.parametrize("text", PROGRAMS)
def test_valid_programs_lex_without_errors_and_losslessly(text: str) -> None:
    parse(text)  # the sample really is einflow
    lexed = list(EinflowLexer().get_tokens(text))
    assert all(kind is not Error for kind, _ in lexed)
    assert "".join(value for _, value in lexed) == text + ("" if text.endswith("\n") else "\n")


def test_token_kinds() -> None:
    text = "y[i] = sum[k](exp(A[i,k]) x[k]^2) / 2. + delta[i,j] b[j] ** -1  # note"
    assert kinds_of(text, Name.Label) == ["i", "k", "i", "k", "k", "i", "j", "j"]
    assert kinds_of(text, Name.Variable) == ["y", "A", "x", "b"]
    assert kinds_of(text, Name.Builtin) == ["exp"]
    assert kinds_of(text, Keyword) == ["sum", "delta"]
    assert kinds_of(text, Number) == ["2", "2.", "1"]
    assert kinds_of(text, Operator) == ["=", "^", "/", "+", "**", "-"]
    assert kinds_of(text, Comment) == ["# note"]
    assert kinds_of("size n = x", Keyword.Declaration) == ["size"]


def test_every_matrix_declaration_is_a_declaration() -> None:
    for word in MATRIX_DECLARATIONS:  # symmetric, spd, hermitian: one list in lang/ir.py
        assert kinds_of(f"{word} A", Keyword.Declaration) == [word]


def test_every_function_name_is_a_builtin() -> None:
    for name in FUNCTIONS:
        assert kinds_of(f"f[i] = {name}(x[i])", Name.Builtin) == [name]
    assert kinds_of("exponent[i] = 2 x[i]", Name.Variable) == ["exponent", "x"]  # a prefix is not a function


def test_session_commands() -> None:
    assert kinds_of(":grad L wrt x, W", Keyword.Pseudo) == [":grad"]
    assert kinds_of(":grad L wrt x, W", Keyword) == [":grad", "wrt"]
    assert kinds_of(":save A out/run-1.npy", String) == ["out/run-1.npy"]
    assert kinds_of(":set x [1.0, -2.5e3]", Number) == ["1.0", "2.5e3"]
    assert kinds_of(":set x [1.0, -2.5e3]", Name.Label) == []  # a literal list is not an index list
    lexed = list(EinflowLexer().get_tokens(":randn A 3 4\ny[i] = A[i,j]\n"))
    assert all(kind is not Error for kind, _ in lexed)


def test_random_expressions_lex_without_errors(make_expression) -> None:
    generator = random.Random(5)
    for _ in range(200):
        text = "t = " + make_expression(generator, 4)
        assert all(kind is not Error for kind, _ in EinflowLexer().get_tokens(text)), text


def test_registered_with_pygments() -> None:
    assert isinstance(get_lexer_by_name("einflow"), EinflowLexer)
    assert isinstance(get_lexer_for_filename("model.ein"), EinflowLexer)


def test_the_default_style_uses_the_terminals_palette_and_styles_are_checked() -> None:
    from einflow.shell.highlight import DEFAULT_STYLE, EinflowStyle, get_style, style_names

    assert get_style(None) is EinflowStyle and get_style(DEFAULT_STYLE) is EinflowStyle
    assert get_style("none") is None
    for token, spec in EinflowStyle.styles.items():
        assert "#" not in spec, (token, spec)  # no fixed colours (navy #19177C vanished on dark terminals)
    assert "bold" in EinflowStyle.styles[Name.Variable]
    assert "monokai" in style_names()
    with pytest.raises(ValueError, match="valid options are einflow, none"):
        get_style("neon")


def test_commands_and_session_import_in_one_direction() -> None:
    import ast
    import pathlib

    import einflow.shell

    def imported(module: str) -> set[str]:
        tree = ast.parse((pathlib.Path(einflow.shell.__file__).parent / f"{module}.py").read_text())
        return {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}

    # the commands build on the session; the session is handed its runner (the commands register theirs)
    assert "einflow.shell.commands" not in imported("session")
    assert "einflow.shell.session" in imported("commands")
