"""A pygments lexer for einflow programs and sessions (statements, ``:commands``, comments).

Registered as the pygments lexer ``einflow`` (files ``*.ein``), so docs can use ```` ```einflow ```` blocks.
"""

from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, default, words
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Whitespace

from einflow.ir import FUNCTIONS

__all__ = ["EinflowLexer"]

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
            (r"\bsize\b", Keyword.Declaration),
            (r"\b(sum|delta|wrt)\b", Keyword),
            (words(FUNCTIONS, prefix=r"\b", suffix=r"\b"), Name.Builtin),
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
