"""Syntax highlighting for einflow programs and sessions: the pygments lexer (statements, ``:commands``, comments).

Registered as the pygments lexer ``einflow`` (files ``*.ein``), so docs can use ```` ```einflow ```` blocks.
"""

from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, default, words
from pygments.style import Style
from pygments.styles import get_all_styles, get_style_by_name
from pygments.token import Comment, Error, Keyword, Name, Number, Operator, Punctuation, String, Whitespace

from einflow.lang.ir import BINARY_FUNCTIONS, FUNCTIONS, LINALG, MATRIX_DECLARATIONS, NORMALISERS, REDUCTIONS

__all__ = ["EinflowLexer", "EinflowStyle", "DEFAULT_STYLE", "style_names", "get_style"]

DEFAULT_STYLE = "einflow"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_FLOAT = r"(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|\d+[eE][+-]?\d+"


class EinflowLexer(RegexLexer):
    """Tokens: tensor names, index names (inside ``[...]``), functions, keywords, numbers, ``:commands``.

    >>> from pygments.token import Name
    >>> [value for token, value in EinflowLexer().get_tokens("y[i] = A[i,j] x[j]") if token is Name.Label]
    ['i', 'i', 'j', 'j']
    """

    name = "einflow"
    aliases = ["einflow", "ein"]
    filenames = ["*.ein"]
    mimetypes = ["text/x-einflow"]
    url = "https://pypi.org/project/einflow/"

    tokens = {
        "root": [
            (r"^([ \t]*)(:[A-Za-z]+)", bygroups(Whitespace, Keyword.Pseudo)),  # a session command
            (r"\s+", Whitespace),
            (r"#.*?$", Comment.Single),
            (words(("size", *MATRIX_DECLARATIONS), prefix=r"\b", suffix=r"\b"), Keyword.Declaration),
            (r"^([ \t]*)(pad)([ \t]+)(zeros|circular|reflect|replicate)\b",  # `pad reflect u` (LANGUAGE.md 9.4)
             bygroups(Whitespace, Keyword.Declaration, Whitespace, Keyword.Declaration)),
            (r"\b(sum|delta|wrt)\b", Keyword),
            (words(REDUCTIONS + NORMALISERS + LINALG, prefix=r"\b", suffix=r"\b"), Keyword),
            (words(FUNCTIONS + BINARY_FUNCTIONS, prefix=r"\b", suffix=r"\b"), Name.Builtin),
            (r"[^\s\[\](){}=,;#'\"]*\.(npy|npz|ein)\b", String),  # file names in :load/:save
            (r"'[^'\n]*'|\"[^\"\n]*\"", String),
            (_FLOAT, Number.Float),
            (r"\d+", Number.Integer),
            (_NAME, Name.Variable),
            (r"\[", Punctuation, "indices"),
            (r"\*\*|[-+*/^=]", Operator),
            (r"[(),;\]{}:]", Punctuation),
        ],
        "indices": [
            (r"\s+", Whitespace),
            (_NAME, Name.Label),
            (r",", Punctuation),
            (r"\]", Punctuation, "#pop"),
            default("#pop"),  # not an index list (a literal like [1.0, 2.0]): lex it as ordinary text
        ],
    }


class EinflowStyle(Style):
    """Colours from the terminal's own palette (and bold), so input reads on dark and light backgrounds alike.

    Tensor names are bold in the terminal's foreground colour; indices cyan, functions green, keywords and
    ``:commands`` magenta, comments grey.
    """

    styles = {
        Name.Variable: "bold",
        Name.Label: "ansicyan",
        Name.Builtin: "ansigreen",
        Keyword: "ansimagenta",
        Keyword.Pseudo: "bold ansimagenta",
        String: "underline",
        Comment: "italic ansibrightblack",
        Error: "ansired",
    }


def style_names() -> list[str]:
    """The styles ``:style`` and ``EINFLOW_STYLE`` accept: ``einflow`` (the default), ``none``, pygments' styles.

    >>> style_names()[:2]
    ['einflow', 'none']
    """
    return [DEFAULT_STYLE, "none", *sorted(get_all_styles())]


def get_style(name: str | None) -> type[Style] | None:
    """The pygments style class called ``name`` (None for ``none``: no colour). Raises ValueError if unknown."""
    name = name or DEFAULT_STYLE
    if name == DEFAULT_STYLE:
        return EinflowStyle
    if name == "none":
        return None
    if name not in style_names():
        raise ValueError(f"style {name!r} not found, valid options are {', '.join(style_names())}")
    return get_style_by_name(name)
