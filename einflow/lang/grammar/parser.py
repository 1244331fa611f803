"""Build the Lark parser once and transform its trees into IR nodes."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import unicodedata
from collections.abc import Iterator
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from einflow.lang import ir
from einflow.lang.errors import ParseError, source_line
from einflow.lang.padding import resolve_pads

__all__ = ["parse", "parse_expression", "build_parser"]

_OPENERS = {"LPAR", "LSQB"}
_MAX_SIZE = 2**63
_CLOSERS = {"RPAR", "RSQB"}


#: brackets nest at most this deep: deeper text is refused as soon as the lexer reaches the bracket, in time
#: proportional to the depth reached (the parse tree of ~170 levels already outgrows Python's recursion limit)
MAX_NESTING = 200


class _TooDeep(Exception):
    """Raised by the post-lexer at the first bracket nested more than MAX_NESTING deep (line, column)."""


class _BracketNewlines:
    """Post-lexer: newlines inside ( ) or [ ] are plain white space; brackets nest at most MAX_NESTING deep."""

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0
        for token in stream:
            if token.type in _OPENERS:
                depth += 1
                if depth > MAX_NESTING:
                    raise _TooDeep(token.line or 1, token.column or 1)
            elif token.type in _CLOSERS:
                depth = max(depth - 1, 0)
            elif token.type == "_NL" and depth > 0:
                continue
            yield token


@functools.cache
def build_parser(strict: bool = False) -> Lark:
    """The LALR parser (built once; ``strict=True`` makes Lark reject any grammar conflict)."""
    return Lark.open_from_package(
        "einflow.lang.grammar",
        "einflow.lark",
        parser="lalr",
        propagate_positions=True,
        postlex=_BracketNewlines(),
        maybe_placeholders=False,
        strict=strict,
        # the built parser is cached on disk: building it (with Lark's regex checks) costs ~1 s per process
        cache=not strict,
    )


def _span(meta_or_token: Any) -> ir.Span | None:
    line = getattr(meta_or_token, "line", None)
    if line is None:
        return None
    return ir.Span(line, meta_or_token.column, getattr(meta_or_token, "end_line", 0) or 0,
                   getattr(meta_or_token, "end_column", 0) or 0)


# Python refuses to read integers of more than 4300 digits (sys.get_int_max_str_digits); such a literal is far
# beyond float range, where every integer literal ends up anyway (inf, as numbers.py folds it)
_MAX_INT_DIGITS = 4000


def _number(token: Token) -> int | float:
    text = str(token)
    if text[-1] in "jJ":  # an imaginary literal, as Python writes it (LANGUAGE.md 9.2)
        return complex(0, float(text[:-1]))  # type: ignore[return-value]
    if any(c in text for c in ".eE"):
        return float(text)
    digits = text.lstrip("0") or "0"
    if len(digits) > _MAX_INT_DIGITS:
        return math.inf
    return int(digits)


def _negated(expr: ir.Expr, sign: Token) -> ir.Expr:
    """``-expr``; a node the negation builds points at the sign, so errors about it have a position."""
    negated = ir.negate(expr)
    if negated is not expr and getattr(negated, "span", None) is None:
        negated = dataclasses.replace(negated, span=getattr(expr, "span", None) or _span(sign))
    return negated


class _Paren:
    """Marks a parenthesized expression while building products (removed afterwards)."""

    __slots__ = ("expr",)

    def __init__(self, expr: ir.Expr) -> None:
        self.expr = expr


def _unparen(value: Any) -> ir.Expr:
    return value.expr if isinstance(value, _Paren) else value


class _ToIR(Transformer):
    """Lark tree -> IR. Products flatten through parentheses; sums keep parenthesized terms whole."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def _name(self, token: Token, role: str) -> str:
        """The token's text; a reserved word (function name, sum, delta, size) is rejected as a name."""
        text = str(token)
        if text in ir.RESERVED:
            hint = ""
            if role != "a tensor name":
                pass
            elif text in ir.CALLABLE:
                hint = f" (it is a function: write {text}(...) with no space before '(')"
            elif text in ir.REDUCTIONS or text in ir.NORMALISERS or text in ir.LINALG:
                hint = f" (write {text}[k](...) with no space before '[')"
            raise ParseError(f"'{text}' is a reserved word and cannot be used as {role}{hint}", token.line or 1,
                             token.column or 1, _line_of(self.source, token.line or 1))
        return text

    # ---- statements
    def start(self, items: list[Any]) -> ir.ProgramIR:
        return resolve_pads(ir.ProgramIR(tuple(items)))

    @v_args(meta=True)
    def assign_indexed(self, meta: Any, items: list[Any]) -> ir.Assign:
        name, indices, expr = items
        for position in indices:
            if not isinstance(position, str):
                raise ParseError(f"a target keeps plain indices: {str(name)}[...] cannot hold "
                                 f"'{ir.format_position(position)}' (shifted, constant and gathered positions are "
                                 "for reads)", meta.line, meta.column, _line_of(self.source, meta.line))
        return ir.Assign(self._name(name, "a tensor name"), indices, _unparen(expr), span=_span(meta))

    @v_args(meta=True)
    def assign_implicit(self, meta: Any, items: list[Any]) -> ir.Assign:
        name, expr = items
        return ir.Assign(self._name(name, "a tensor name"), None, _unparen(expr), span=_span(meta))

    @v_args(meta=True)
    def bare(self, meta: Any, items: list[Any]) -> ir.Assign:
        return ir.Assign(None, None, _unparen(items[0]), span=_span(meta))

    @v_args(meta=True)
    def size_decl(self, meta: Any, items: list[Token]) -> ir.SizeDecl:
        *names, source = items
        if source.type == "NUMBER":
            text = str(source)
            where = (source.line, source.column, _line_of(self.source, source.line))
            if not text.isdigit():
                raise ParseError("a literal size must be a non-negative integer", *where)
            digits = text.lstrip("0") or "0"
            if len(digits) > 19 or int(digits) >= _MAX_SIZE:
                raise ParseError(f"a literal size must be below 2**63 (arrays index with int64); this one has "
                                 f"{len(digits)} digits", *where)
            value = int(digits)
            src: str | int = value
        else:
            src = self._name(source, "a tensor name")
        return ir.SizeDecl(tuple(self._name(n, "an index name") for n in names), src, span=_span(meta))

    @v_args(meta=True)
    def return_line(self, meta: Any, items: list[Token]) -> ir.Return:
        return ir.Return(tuple(self._name(n, "a tensor name") for n in items), span=_span(meta))

    def index_list(self, items: list[Token]) -> tuple[str, ...]:
        return tuple(self._name(t, "an index name") for t in items)

    # ---- expressions
    @v_args(meta=True)
    def sum(self, meta: Any, items: list[Any]) -> ir.Expr:
        if len(items) == 1:
            return items[0]
        terms = [_unparen(items[0])]
        for sign, term in zip(items[1::2], items[2::2]):
            term = _unparen(term)
            terms.append(_negated(term, sign) if sign == "-" else term)
        return ir.Sum(tuple(terms), span=_span(meta))

    @v_args(meta=True)
    def product(self, meta: Any, items: list[Any]) -> Any:
        if len(items) == 1:
            return items[0]
        factors: list[ir.Expr] = [_unparen(items[0])]
        position = 1
        while position < len(items):
            item = items[position]
            if isinstance(item, Token) and item.type == "MULOP":
                operand = _unparen(items[position + 1])
                factors.append(operand if item == "*" else ir.Power(operand, -1, span=_span(item)))
                position += 2
            else:
                factors.append(_unparen(item))
                position += 1
        built = ir.product(*factors)
        if isinstance(built, ir.Product):
            built = ir.Product(built.factors, span=_span(meta))
        return built

    def signed(self, items: list[Any]) -> ir.Expr:
        sign, operand = items
        operand = _unparen(operand)
        return _negated(operand, sign) if sign == "-" else operand

    @v_args(meta=True)
    def power(self, meta: Any, items: list[Any]) -> ir.Power:
        base, _op, exponent = items
        return ir.Power(_unparen(base), exponent, span=_span(meta))

    def exponent(self, items: list[Token]) -> int | float:
        value = _number(items[-1])
        if isinstance(value, complex):
            token = items[-1]
            raise ParseError(f"an exponent is a real number, not {str(token)!r}", token.line or 1, token.column or 1,
                             _line_of(self.source, token.line or 1))
        return -value if len(items) == 2 and items[0] == "-" else value

    def number(self, items: list[Token]) -> ir.Num:
        return ir.Num(_number(items[0]), span=_span(items[0]))

    @v_args(meta=True)
    def tensor(self, meta: Any, items: list[Any]) -> ir.Tensor | ir.Read:
        name = self._name(items[0], "a tensor name")
        positions = items[1]
        if all(isinstance(position, str) for position in positions):
            return ir.Tensor(name, positions, span=_span(meta))
        return ir.Read(name, positions, span=_span(meta))

    # ---- index arithmetic (LANGUAGE.md 8.2)
    def position_list(self, items: list[Any]) -> tuple[ir.Position, ...]:
        return tuple(items)

    def gather_position(self, items: list[Any]) -> ir.Gather:
        return ir.Gather(self._name(items[0], "a tensor name"), items[1])

    def affine_position(self, items: list[Any]) -> ir.Position:
        sign = 1
        coefficients: dict[str, int] = {}
        offset = 0
        explicit = False  # `i + 0` is a shifted read by 0 (zero outside), kept apart from the plain `i`
        for item in items:
            if isinstance(item, Token) and item.type == "SIGN":
                sign = -1 if item == "-" else 1
                continue
            coefficient, index = item
            if index is None:
                offset += sign * coefficient
                explicit = True
            else:
                coefficients[index] = coefficients.get(index, 0) + sign * coefficient
            sign = 1
        terms = tuple((c, index) for index, c in coefficients.items() if c != 0)
        if len(terms) == 1 and terms[0][0] == 1 and offset == 0 and not explicit:
            return terms[0][1]  # a plain index
        return ir.Affine(terms, offset)

    def position_term(self, items: list[Token]) -> Any:
        numbers = [t for t in items if t.type == "NUMBER"]
        names = [t for t in items if t.type == "NAME"]
        operators = [t for t in items if t.type == "MULOP"]
        for number in numbers:
            if str(number).isdigit() and len(str(number).lstrip("0")) > 18:
                raise ParseError(f"an index position's integer must be below 10**18, not a {len(str(number))}-digit "
                                 "number", number.line or 1, number.column or 1,
                                 _line_of(self.source, number.line or 1))
            if not str(number).isdigit():
                raise ParseError(f"an index position takes integer coefficients and offsets, not {str(number)!r}",
                                 number.line or 1, number.column or 1, _line_of(self.source, number.line or 1))
        for operator in operators:
            if operator != "*":
                raise ParseError("an index position multiplies an index by an integer with '*' only",
                                 operator.line or 1, operator.column or 1, _line_of(self.source, operator.line or 1))
        value = int(str(numbers[0]).lstrip("0") or "0") if numbers else 1
        index = self._name(names[0], "an index name") if names else None
        return (value, index)

    def scalar(self, items: list[Token]) -> ir.Tensor:
        return ir.Tensor(self._name(items[0], "a tensor name"), (), span=_span(items[0]))

    @v_args(meta=True)
    def call(self, meta: Any, items: list[Any]) -> ir.Expr:
        token, *args = items
        name = str(token)
        args = [_unparen(a) for a in args]
        where = (token.line or 1, token.column or 1, _line_of(self.source, token.line or 1))
        if name in ir.REDUCTIONS or name in ir.NORMALISERS:
            raise ParseError(f"'{name}' needs the indices it works over: write {name}[k](...)", *where)
        if name in ir.LINALG:
            raise ParseError(f"'{name}' needs the matrix's row and column indices: write {name}[i,j](...)", *where)
        if name not in ir.CALLABLE:
            raise ParseError(unknown_function_message(name), *where)
        wanted = 2 if name in ir.BINARY_FUNCTIONS else 1
        if len(args) != wanted:
            raise ParseError(f"'{name}' takes {wanted} argument{'s' if wanted > 1 else ''}, not {len(args)}", *where)
        if wanted == 2:
            return ir.Binary(name, args[0], args[1], span=_span(meta))
        return ir.Call(name, args[0], span=_span(meta))

    @v_args(meta=True)
    def reduce(self, meta: Any, items: list[Any]) -> ir.Expr:
        kind = str(items[0])
        if kind in ir.NORMALISERS:
            return ir.Normalize(kind, items[1], _unparen(items[2]), span=_span(meta))
        return ir.Reduce(items[1], _unparen(items[2]), kind, span=_span(meta))

    # ---- linear algebra (LANGUAGE.md 8.1)
    @v_args(meta=True)
    def linalg(self, meta: Any, items: list[Any]) -> ir.Linalg:
        kind, row, column, body = items
        indices = (self._name(row, "an index name"), self._name(column, "an index name"))
        if indices[0] == indices[1]:
            raise ParseError(f"{kind}[{row},{column}](...) needs two different indices (the matrix's rows and "
                             "columns)", row.line or 1, row.column or 1, _line_of(self.source, row.line or 1))
        return ir.Linalg(str(kind), indices, _unparen(body), span=_span(meta))

    @v_args(meta=True)
    def matrix_decl(self, meta: Any, items: list[Any]) -> ir.MatrixDecl:
        kind, *names = items
        return ir.MatrixDecl(str(kind), tuple(self._name(name, "a matrix name") for name in names), span=_span(meta))

    @v_args(meta=True)
    def pad_decl(self, meta: Any, items: list[Any]) -> ir.PadDecl:
        _, mode, *names = items
        if str(mode) not in ir.PAD_MODES:
            numpy_names = {"wrap": "circular", "edge": "replicate", "constant": "zeros", "zero": "zeros"}
            close = [numpy_names[str(mode)]] if str(mode) in numpy_names else \
                difflib.get_close_matches(str(mode), ir.PAD_MODES, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ParseError(f"unknown padding mode '{mode}': {hint}the modes are {', '.join(ir.PAD_MODES)} "
                             "(torch's padding_mode names)", mode.line or 1, mode.column or 1,
                             _line_of(self.source, mode.line or 1))
        return ir.PadDecl(str(mode), tuple(self._name(name, "a tensor name") for name in names), span=_span(meta))

    @v_args(meta=True)
    def unknown_reduce(self, meta: Any, items: list[Any]) -> ir.Expr:
        token = items[0]
        raise ParseError(unknown_reduction_message(str(token)), token.line or 1, token.column or 1,
                         _line_of(self.source, token.line or 1))

    @v_args(meta=True)
    def delta(self, meta: Any, items: list[Any]) -> ir.Delta | ir.ShiftDelta:
        first = self._name(items[0], "an index name")
        if isinstance(items[1], str):
            return ir.Delta(first, items[1], span=_span(meta))
        return ir.ShiftDelta(first, items[1], span=_span(meta))

    def paren(self, items: list[Any]) -> _Paren:
        inner = _unparen(items[0])
        # A parenthesized product is the same product; a parenthesized sum stays one term.
        return _Paren(inner)


def unknown_reduction_message(name: str) -> str:
    """``unknown reduction 'softmaxx'; did you mean 'softmax'?`` for a name written as ``name[k](...)``.

    >>> unknown_reduction_message("softmaxx")
    "unknown reduction 'softmaxx'; did you mean 'softmax' or 'log_softmax'?"
    """
    known = sorted(set(ir.REDUCTIONS) | set(ir.NORMALISERS))
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    message = f"unknown reduction '{name}'"
    if close:
        return message + "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return message + (f" (known: {', '.join(known)}; a name followed by '[...](' is a reduction: write "
                      f"'{name}[...] (...)' with a space or '{name}[...] * (...)' to multiply)")


def unknown_function_message(name: str) -> str:
    """``unknown function 'exq'; did you mean 'exp'?`` (the closest known names, when any are close).

    >>> unknown_function_message("exq")
    "unknown function 'exq'; did you mean 'exp'?"
    """
    known = sorted(ir.CALLABLE | set(ir.REDUCTIONS) | set(ir.NORMALISERS) | set(ir.LINALG))
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    message = f"unknown function '{name}'"
    if close:
        message += "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    else:
        message += f" (known: {', '.join(sorted(ir.CALLABLE))}; a name followed by '(' is a call: write "\
                   f"'{name} (...)' with a space or '{name} * (...)' to multiply)"
    return message


@functools.lru_cache(maxsize=64)
def _line_of(source: str, line: int) -> str:
    # (cached: the transformer asks for a call's line eagerly, and a line of n calls would cost n^2)
    return source_line(source, line)


_TOKEN_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "LSQB": "'['",
    "RSQB": "']'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "EQUAL": "'='",
    "SIGN": "'+' or '-'",
    "MULOP": "'*' or '/'",
    "POW": "'^'",
    "_NL": "a new line",
    "SEMICOLON": "';'",
    "REDUCER": "a reduction",
    "CALLNAME": "a function",
    "DELTA": "'delta'",
    "SIZE": "'size'",
    "$END": "the end of the input",
}


def _describe_expected(expected: set[str]) -> str:
    names = set(expected)
    if "SEMICOLON" not in names:
        names.discard("_NL")  # the bracket post-lexer makes Lark list a new line everywhere; it ends statements only
    words: list[str] = []
    if names & {"NAME", "NUMBER", "LPAR", "REDUCER", "CALLNAME", "DELTA", "SIGN"} and len(names) > 4:
        words.append("an expression")
        names -= {"NAME", "NUMBER", "LPAR", "REDUCER", "CALLNAME", "DELTA", "SIGN"}
        names = {n for n in names if not n.isupper() or n in _TOKEN_WORDS}
        names -= {"EXP", "LOG", "LOG1P", "SQRT", "SIN", "COS", "TANH", "SIGMOID", "ABS", "RELU", "STEP"}
    for name in sorted(names):
        if name in {"EXP", "LOG", "LOG1P", "SQRT", "SIN", "COS", "TANH", "SIGMOID", "ABS", "RELU", "STEP"}:
            continue
        words.append(_TOKEN_WORDS.get(name, f"'{name.lower()}'"))
    if not words:
        return "something else"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _friendly(error: UnexpectedInput, source: str) -> ParseError:
    line = getattr(error, "line", 0) or 1
    column = getattr(error, "column", 0) or 1
    source_line = _line_of(source, line)
    if isinstance(error, UnexpectedCharacters):
        char = error.char
        if char.isprintable() and not char.isspace():
            message = f"unexpected character {char!r}" + ("" if char.isascii() else f" (U+{ord(char):04X})")
        else:  # a line break Python knows but the language does not, or a control character: name it
            message = f"unexpected character U+{ord(char):04X} ({unicodedata.name(char, 'a control character')})"
    elif isinstance(error, UnexpectedToken):
        token = error.token
        expected = _describe_expected(set(error.expected))
        if token.type == "$END":
            line = source.rstrip("\r\n").count("\n") + 1  # the last line with text, as the user sees it
            source_line = _line_of(source, line)
            column = len(source_line) + 1
            message = f"unexpected end of input, expected {expected}"
        elif token.type == "_NL":
            message = f"unexpected end of line, expected {expected}"
            column = len(source_line) + 1 if column > len(source_line) else column
        else:
            text = str(token)
            if token.type == "NUMBER" and "NUMBER" not in error.expected:
                message = (f"unexpected number {text!r}: a number cannot follow a factor without '*'"
                           if error.expected & {"MULOP", "SIGN"}
                           else f"unexpected number {text!r}, expected {expected}")
            else:
                message = f"unexpected {text!r}, expected {expected}"
            before = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", source_line[:column - 1])
            declared = re.fullmatch(r"(\s*)size\s*", source_line[:column - 1])
            if declared and text in ("=", "["):  # `size = 3` reads as a tensor named size: say so as for `sum = 3`
                column = len(declared.group(1)) + 1
                message = ("'size' is a reserved word and cannot be used as a tensor name (it declares index "
                           "sizes: size n = 10, size p, q = M)")
            elif before and before.group(1) in ir.RESERVED and error.expected <= {"LPAR", "LSQB", "_NL"}:
                message += f" ('{before.group(1)}' is a reserved word and cannot be used as a name)"
    elif isinstance(error, UnexpectedEOF):
        message = "unexpected end of input"
    else:  # pragma: no cover - Lark has no other kinds
        message = str(error)
    return ParseError(message, line, column, source_line)


def _too_deep(source: str, line: int = 1, column: int = 1) -> ParseError:
    return ParseError("the expression is nested too deeply (parentheses or function calls inside one another); "
                      "split it into several statements", line, column, _line_of(source, line))


@functools.lru_cache(maxsize=512)
def parse(text: str) -> ir.ProgramIR:
    """Parse einflow source into a ProgramIR (cached by text).

    >>> str(parse("C[i,j] = A[i,k] B[k,j]"))
    'C[i,j] = A[i,k] B[k,j]'
    """
    if not isinstance(text, str):
        raise TypeError(f"einflow source must be a string, not {type(text).__name__}")
    try:
        tree = build_parser().parse(text)
        program = _ToIR(text).transform(tree)
    except UnexpectedInput as error:
        raise _friendly(error, text) from None
    except VisitError as error:
        if isinstance(error.orig_exc, ParseError):
            raise error.orig_exc from None
        if isinstance(error.orig_exc, RecursionError):
            raise _too_deep(text) from None
        raise
    except RecursionError:
        raise _too_deep(text) from None
    except _TooDeep as error:
        raise _too_deep(text, *error.args) from None
    if not program.statements:
        raise ParseError("empty program: write at least one statement", 1, 1, _line_of(text, 1))
    return program


def parse_expression(text: str) -> ir.Expr:
    """Parse a single bare expression."""
    program = parse(text)
    statement = program.statements[0]
    if len(program.statements) != 1 or not isinstance(statement, ir.Assign) or statement.target is not None:
        raise ParseError("expected a single expression", 1, 1, _line_of(text, 1))
    return statement.expr
