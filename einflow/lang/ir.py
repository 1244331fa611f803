"""The einflow IR: immutable expression and statement nodes, and a printer whose text re-parses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeGuard, Union

__all__ = [
    "Span",
    "is_negative",
    "Num",
    "Tensor",
    "Delta",
    "Product",
    "Sum",
    "Call",
    "Power",
    "Reduce",
    "Normalize",
    "Binary",
    "Linalg",
    "Affine",
    "Gather",
    "Position",
    "Read",
    "ShiftDelta",
    "Expr",
    "Assign",
    "SizeDecl",
    "Return",
    "Statement",
    "ProgramIR",
    "children",
    "walk",
    "tensors_read",
    "with_children",
    "FUNCTIONS",
    "REDUCTIONS",
    "NORMALISERS",
    "BINARY_FUNCTIONS",
    "LINALG",
    "LINALG_REDUCES",
    "reduced_indices",
    "reduces",
    "keeps_indices",
    "MATRIX_DECLARATIONS",
    "MatrixDecl",
    "PadDecl",
    "PAD_MODES",
    "CALLABLE",
    "RESERVED",
    "product",
    "negate",
    "format_expr",
    "format_position",
    "position_indices",
    "format_statement",
    "format_program",
]

FUNCTIONS = (
    "exp", "log", "log1p", "sqrt", "sin", "cos", "tanh", "sigmoid", "abs", "relu", "sign", "step", "erf", "softplus",
    "conj", "real", "imag", "abs2", "angle",
)
#: ``kind[k](e)``: bind k inside e and reduce it away
REDUCTIONS = ("sum", "max", "min", "mean", "logsumexp")
#: ``kind[k](e)``: normalise e over k; k stays free (argmax/argmin: the indicator of the arg-max/arg-min,
#: ties split equally, so that the weights sum to 1: the derivative of max/min)
NORMALISERS = ("softmax", "log_softmax", "argmax", "argmin")
#: two-argument elementwise functions
BINARY_FUNCTIONS = ("maximum", "minimum")
#: every name that may be followed directly by ``(``
CALLABLE = frozenset(FUNCTIONS) | frozenset(BINARY_FUNCTIONS)
#: linear algebra (LANGUAGE.md 8.1, 9.4), each kind with whether it reduces its two indices: ``inv[i,j](e)``
#: keeps i, j free (the inverse's rows and columns, bound as a normaliser binds); ``det``/``logdet``/``sign_det``
#: reduce them (as a reduction does). :attr:`Linalg.reduces` reads it.
LINALG_REDUCES: dict[str, bool] = {"inv": False, "det": True, "logdet": True, "sign_det": True}
#: the linear-algebra kinds (the one list: the grammar's keywords, the lowering's atoms)
LINALG = tuple(LINALG_REDUCES)
#: ``symmetric A`` / ``spd A``: statements declaring square rank-2 inputs or targets
MATRIX_DECLARATIONS = ("symmetric", "spd", "hermitian")
#: ``pad MODE X`` (LANGUAGE.md 9.4): how reads of X outside its axes read (torch's padding modes)
PAD_MODES = ("zeros", "circular", "reflect", "replicate")
RESERVED = frozenset(FUNCTIONS) | frozenset(REDUCTIONS) | frozenset(NORMALISERS) | frozenset(BINARY_FUNCTIONS) | {
    "delta", "size"} | frozenset(LINALG) | frozenset(MATRIX_DECLARATIONS)


@dataclass(frozen=True, slots=True)
class Span:
    """Where a node came from in the source (1-based line and column)."""

    line: int
    column: int
    end_line: int = 0
    end_column: int = 0


def _span() -> Span | None:
    return field(default=None, compare=False, hash=False, repr=False, kw_only=True)  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Num:
    """A number literal (int or float, kept apart like Python's; an imaginary literal ``0.5j`` is a complex)."""

    value: int | float
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor reference ``A[i,j]``; ``indices == ()`` is a 0-d tensor written as a bare name."""

    name: str
    indices: tuple[str, ...] = ()
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Delta:
    """The Kronecker delta ``delta[i,j]``."""

    first: str
    second: str
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Product:
    """An n-ary product: one contraction (never nested directly inside another Product)."""

    factors: tuple[Expr, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Sum:
    """An n-ary sum; each term is its own scope and is broadcast over the union of free indices."""

    terms: tuple[Expr, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Call:
    """An elementwise function applied to an expression: ``tanh(e)``."""

    func: str
    arg: Expr
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Power:
    """``base ^ exponent`` with a number-literal exponent; the base is its own scope."""

    base: Expr
    exponent: int | float
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Reduce:
    """``sum[k,...](body)``: binds the indices inside ``body`` and then reduces over them.

    ``kind`` is one of :data:`REDUCTIONS`: ``sum``, ``max``, ``min``, ``mean`` or ``logsumexp``.
    """

    indices: tuple[str, ...]
    body: Expr
    kind: str = "sum"
    span: Span | None = _span()

    #: a reduction binds its indices inside its body and reduces them away
    reduces = True


@dataclass(frozen=True, slots=True)
class Normalize:
    """``softmax[k](body)`` / ``log_softmax[k](body)``: normalise ``body`` over ``k``; k stays free.

    ``body`` is its own scope (as a function argument); the result has the body's free indices.
    """

    kind: str
    indices: tuple[str, ...]
    body: Expr
    span: Span | None = _span()

    #: a normaliser's indices are occurrences of indices bound around it: they stay free
    reduces = False


@dataclass(frozen=True, slots=True)
class Binary:
    """``maximum(a, b)`` / ``minimum(a, b)``: elementwise; each argument is its own scope (as a sum's terms)."""

    func: str
    left: Expr
    right: Expr
    span: Span | None = _span()


# ---- linear algebra (LANGUAGE.md 8.1)
@dataclass(frozen=True, slots=True)
class Linalg:
    """``inv[i,j](body)``, ``det[i,j](body)``, ``logdet[i,j](body)`` or ``sign_det[i,j](body)`` (``kind``): the
    matrix ``M[i,j] = body`` (rows ``indices[0]``, columns ``indices[1]``), batched over the body's other free
    indices.

    ``inv`` keeps both indices free (row, column of the inverse); ``det``, ``logdet`` (log|det|) and ``sign_det``
    (det / |det|, 0 for a singular matrix) reduce them.
    As in a normaliser, the indices are bound inside the body and the body is its own scope.
    """

    kind: str
    indices: tuple[str, str]
    body: Expr
    span: Span | None = _span()

    @property
    def reduces(self) -> bool:
        """Whether the kind reduces its indices (``det``, ``logdet``, ``sign_det``) or keeps them free (``inv``)."""
        return LINALG_REDUCES[self.kind]


def reduced_indices(node: Expr) -> tuple[str, ...]:
    """The indices ``node`` binds and reduces away: a reduction's, ``det``'s, ``logdet``'s and ``sign_det``'s; none
    for any other node (a normaliser's and ``inv``'s indices stay free).

    >>> reduced_indices(Linalg("det", ("i", "j"), Tensor("A", ("i", "j")))), reduced_indices(
    ...     Linalg("inv", ("i", "j"), Tensor("A", ("i", "j"))))
    (('i', 'j'), ())
    """
    return node.indices if reduces(node) else ()


def reduces(node: Expr) -> TypeGuard[Reduce | Normalize | Linalg]:
    """Whether ``node`` binds indices inside its body and reduces them away (see :func:`reduced_indices`)."""
    return isinstance(node, (Reduce, Normalize, Linalg)) and node.reduces


def keeps_indices(node: Expr) -> bool:
    """A normaliser or an inverse: its indices are occurrences of indices bound around it, kept free."""
    return isinstance(node, (Normalize, Linalg)) and not node.reduces



# ---------------------------------------------------------------- index arithmetic (LANGUAGE.md §8.2)
@dataclass(frozen=True, slots=True)
class Affine:
    """An index position ``2*h + r - 1``: ``terms`` are (coefficient, index) pairs, nonzero, each index once;
    an integer literal position is ``Affine((), value)``."""

    terms: tuple[tuple[int, str], ...]
    offset: int = 0

    @property
    def indices(self) -> tuple[str, ...]:
        return tuple(index for _, index in self.terms)


@dataclass(frozen=True, slots=True)
class Gather:
    """An index position read from an integer tensor: ``t[b]`` in ``E[t[b], d]`` (plain indices only)."""

    name: str
    indices: tuple[str, ...]


#: one position of a :class:`Read`: a plain index, an affine expression of indices, or a gather
Position = Union[str, Affine, Gather]


@dataclass(frozen=True, slots=True)
class Read:
    """A tensor reference with at least one non-plain position: ``x[h+r]``, ``X[0,i]``, ``E[t[b],d]``.

    ``indices`` are the distinct indices its positions mention, in order of first occurrence (the axes of the
    array it reads: ``x[i+1, i]`` is a shifted diagonal, one axis ``i``); a Read is a leaf, like :class:`Tensor`.
    """

    name: str
    positions: tuple[Position, ...]
    #: where an affine position leaves the axis: ``zeros`` reads 0, ``circular`` wraps, ``reflect`` mirrors
    #: (the edge once), ``replicate`` repeats the edge (from a ``pad`` declaration of the tensor)
    mode: str = "zeros"
    span: Span | None = _span()

    @property
    def indices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(index for position in self.positions for index in position_indices(position)))

    @property
    def gathers(self) -> tuple[Gather, ...]:
        return tuple(position for position in self.positions if isinstance(position, Gather))


@dataclass(frozen=True, slots=True)
class ShiftDelta:
    """``delta[p, h + r]`` or ``delta[v, t[b]]``: 1 where ``index`` equals the position's value, else 0.

    Summed against a tensor it reads (``x[p] delta[p, h+r]`` is ``x[h+r]``, zero outside ``x``); kept, it
    scatters (``delta[v, t[b]] g[b,d]`` adds each ``g[b,:]`` into row ``t[b]``). Its indices need not have equal
    sizes: that is what the adjoint of a shifted read is made of.
    """

    index: str
    position: Affine | Gather
    #: a position outside ``index``'s range folds back as a read of a tensor padded so would (``zeros``: none
    #: matches); from a ``pad`` declaration of the tensor whose axis sizes ``index``
    mode: str = "zeros"
    span: Span | None = _span()

    @property
    def indices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.index, *self.position.indices)))

    @property
    def gathers(self) -> tuple[Gather, ...]:
        return (self.position,) if isinstance(self.position, Gather) else ()


def position_indices(position: Position) -> tuple[str, ...]:
    """The indices one position mentions (a plain index is itself)."""
    return (position,) if isinstance(position, str) else position.indices


def format_position(position: Position) -> str:
    """``2*h + r - 1``, ``t[b]``, ``0``: a position as it is written."""
    if isinstance(position, str):
        return position
    if isinstance(position, Gather):
        return position.name + _indices(position.indices)
    if position.offset == 0 and len(position.terms) == 1 and position.terms[0][0] == 1:
        return f"{position.terms[0][1]} + 0"  # a shifted read by 0 (zero outside), not a plain index
    parts: list[str] = []
    for coefficient, index in position.terms:
        magnitude = abs(coefficient)
        text = index if magnitude == 1 else f"{magnitude}*{index}"
        if not parts:
            parts.append(("-" if coefficient < 0 else "") + text)
        else:
            parts.append(("- " if coefficient < 0 else "+ ") + text)
    if position.offset or not parts:
        if not parts:
            parts.append(str(position.offset))
        else:
            parts.append(("- " if position.offset < 0 else "+ ") + str(abs(position.offset)))
    return " ".join(parts)


Expr = Union[Num, Tensor, Delta, Product, Sum, Call, Power, Reduce, Normalize, Binary, Linalg, Read, ShiftDelta]


@dataclass(frozen=True, slots=True)
class Assign:
    """``T[i,j] = e`` (indices given), ``T = e`` (indices None: implicit) or a bare ``e`` (target None)."""

    target: str | None
    indices: tuple[str, ...] | None
    expr: Expr
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class SizeDecl:
    """``size p, q = M`` (sizes of M's axes) or ``size n = 10`` (a literal size)."""

    names: tuple[str, ...]
    source: str | int
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Return:
    """A final return line ``a, b``: the program's value is this tuple."""

    names: tuple[str, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class MatrixDecl:
    """``symmetric A, B`` or ``spd K`` (``kind``): square rank-2 inputs or targets checked at call time."""

    kind: str
    names: tuple[str, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class PadDecl:
    """``pad reflect x, y`` (LANGUAGE.md 9.4): reads of the tensors outside their axes fold by ``mode``
    (one of :data:`PAD_MODES`); the declaration holds for the whole program, as ``symmetric`` does."""

    mode: str
    names: tuple[str, ...]
    span: Span | None = _span()


Statement = Union[Assign, SizeDecl, Return, MatrixDecl, PadDecl]


@dataclass(frozen=True, slots=True)
class ProgramIR:
    """A whole program: statements in order."""

    statements: tuple[Statement, ...]

    def __str__(self) -> str:
        return format_program(self)


# ---------------------------------------------------------------- traversal


def children(expr: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of ``expr`` (leaves have none)."""
    if isinstance(expr, Product):
        return expr.factors
    if isinstance(expr, Sum):
        return expr.terms
    if isinstance(expr, Call):
        return (expr.arg,)
    if isinstance(expr, Power):
        return (expr.base,)
    if isinstance(expr, (Reduce, Normalize, Linalg)):
        return (expr.body,)
    if isinstance(expr, Binary):
        return (expr.left, expr.right)
    return ()


def walk(expr: Expr) -> list[Expr]:
    """Every node of ``expr``, parents before children, left to right (source order).

    A list, not a generator: callers read every node, and a generator's every resumption is a call.
    """
    found = []
    stack = [expr]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(reversed(children(node)))
    return found


def tensors_read(expr: Expr) -> tuple[str, ...]:
    """The name of every tensor ``expr`` reads, once each, in source order: plain references, shifted and
    literal reads (``u[i+1]``, ``A[0, j]``), and the position tensors of gathers (``t`` in ``E[t[b], d]``).

    >>> from einflow.lang.grammar import parse
    >>> tensors_read(parse("y[b] = E[t[b], 0] + u[b+1] w[b]").statements[0].expr)
    ('E', 't', 'u', 'w')
    """
    names: dict[str, None] = {}
    for node in walk(expr):
        if isinstance(node, (Tensor, Read)):
            names[node.name] = None
        if isinstance(node, (Read, ShiftDelta)):
            names.update(dict.fromkeys(gather.name for gather in node.gathers))
    return tuple(names)


def with_children(expr: Expr, new: tuple[Expr, ...]) -> Expr:
    """``expr`` rebuilt around new direct sub-expressions (same kind, same indices/exponent/function)."""
    if isinstance(expr, Product):
        return Product(new)
    if isinstance(expr, Sum):
        return Sum(new)
    if isinstance(expr, Call):
        return Call(expr.func, new[0])
    if isinstance(expr, Power):
        return Power(new[0], expr.exponent)
    if isinstance(expr, Reduce):
        return Reduce(expr.indices, new[0], expr.kind)
    if isinstance(expr, Normalize):
        return Normalize(expr.kind, expr.indices, new[0])
    if isinstance(expr, Linalg):
        return Linalg(expr.kind, expr.indices, new[0])
    if isinstance(expr, Binary):
        return Binary(expr.func, new[0], new[1])
    return expr


# ---------------------------------------------------------------- smart constructors


def product(*factors: Expr) -> Expr:
    """Build a flat product (nested products are merged; a single factor is returned as is)."""
    flat: list[Expr] = []
    for factor in factors:
        if isinstance(factor, Product):
            flat.extend(factor.factors)
        else:
            flat.append(factor)
    if len(flat) == 1:
        return flat[0]
    return Product(tuple(flat))


def negate(expr: Expr) -> Expr:
    """``-expr`` in the parser's canonical form: a leading number absorbs the sign."""
    if isinstance(expr, Num):
        return Num(-expr.value)
    if isinstance(expr, Product) and isinstance(expr.factors[0], Num):
        return Product((Num(-expr.factors[0].value),) + expr.factors[1:])
    return product(Num(-1), expr)


# ---------------------------------------------------------------- printer

_SUM, _PRODUCT, _UNARY, _POWER, _ATOM = range(5)


def is_negative(value: int | float | complex) -> bool:
    """Whether a number prints with a leading minus: a negative real, or an imaginary one (``-0.5j``)."""
    if isinstance(value, complex):
        return value.imag < 0 if value.real == 0 else value.real < 0
    return value < 0


def format_number(value: int | float | complex) -> str:
    """Print a number literal so that it re-parses to the same value and type (``0.5j`` for an imaginary one)."""
    if isinstance(value, complex):
        if value.real == 0:
            return format_number(value.imag) + "j"
        imaginary = format_number(abs(value.imag)) + "j"
        return f"({format_number(value.real)} {'-' if value.imag < 0 else '+'} {imaginary})"
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "1e999" if value > 0 else "-1e999"
    if math.isnan(value):
        raise ValueError("nan cannot be written in the einflow language")
    text = repr(float(value))
    return text


def _indices(indices: tuple[str, ...]) -> str:
    return "[" + ",".join(indices) + "]"


def _precedence(expr: Expr) -> int:
    if isinstance(expr, Sum):
        return _SUM
    if isinstance(expr, Product):
        first = expr.factors[0]
        if isinstance(first, Num) and is_negative(first.value):
            return _UNARY
        return _PRODUCT
    if isinstance(expr, Num):
        return _UNARY if is_negative(expr.value) or format_number(expr.value).startswith("-") else _ATOM
    if isinstance(expr, Power):
        return _POWER
    return _ATOM


def _wrap(expr: Expr, minimum: int) -> str:
    text = format_expr(expr)
    return f"({text})" if _precedence(expr) < minimum else text


def _format_product(factors: tuple[Expr, ...]) -> str:
    first = factors[0]
    rest = factors[1:]
    if isinstance(first, Num) and first.value == -1 and rest and not isinstance(rest[0], Num):
        # -x y: the sign applies to the whole product (which is the same product).
        head = "-" + _format_factor_first(rest[0])
        rest = rest[1:]
    else:
        head = _format_factor_first(first)
    parts = [head]
    for factor in rest:
        if isinstance(factor, Power) and factor.exponent == -1:
            parts.append("/ " + _wrap(factor.base, _POWER + 1 if not _is_plain_atom(factor.base) else _ATOM))
        elif isinstance(factor, Num) or _precedence(factor) == _UNARY:
            parts.append("* " + _wrap(factor, _UNARY))
        else:
            text = _wrap(factor, _POWER)
            # a juxtaposed factor may not start with a number (`x 2^3` does not parse): write `x * 2^3`
            parts.append(("* " + text) if text[0].isdigit() or text[0] == "." else text)
    return " ".join(parts)


def _is_plain_atom(expr: Expr) -> bool:
    return _precedence(expr) >= _POWER


def _format_factor_first(factor: Expr) -> str:
    if isinstance(factor, Num):
        return format_number(factor.value)
    return _wrap(factor, _UNARY)


def format_expr(expr: Expr) -> str:
    """Print an expression in einflow syntax (minimal parentheses, re-parsable)."""
    if isinstance(expr, Num):
        return format_number(expr.value)
    if isinstance(expr, Tensor):
        return expr.name + (_indices(expr.indices) if expr.indices else "")
    if isinstance(expr, Delta):
        return f"delta[{expr.first},{expr.second}]"
    if isinstance(expr, Read):
        return expr.name + "[" + ", ".join(format_position(position) for position in expr.positions) + "]"
    if isinstance(expr, ShiftDelta):
        return f"delta[{expr.index}, {format_position(expr.position)}]"
    if isinstance(expr, Call):
        return f"{expr.func}({format_expr(expr.arg)})"
    if isinstance(expr, (Reduce, Normalize, Linalg)):
        return f"{expr.kind}{_indices(expr.indices)}({format_expr(expr.body)})"
    if isinstance(expr, Binary):
        return f"{expr.func}({format_expr(expr.left)}, {format_expr(expr.right)})"
    if isinstance(expr, Power):
        base = expr.base
        base_text = format_expr(base)
        if not _is_plain_atom(base) or isinstance(base, Power):
            base_text = f"({base_text})"
        exponent = format_number(expr.exponent)
        return f"{base_text}^{exponent}"
    if isinstance(expr, Product):
        return _format_product(expr.factors)
    if isinstance(expr, Sum):
        parts: list[str] = []
        for position, term in enumerate(expr.terms):
            text, negative = _format_term(term)
            if position == 0:
                parts.append(("-" + text) if negative else text)
            else:
                parts.append(("- " if negative else "+ ") + text)
        return " ".join(parts)
    raise TypeError(f"not an einflow expression: {expr!r}")


def _format_term(term: Expr) -> tuple[str, bool]:
    """A sum's term as (text, is_subtracted)."""
    if isinstance(term, Sum):
        return f"({format_expr(term)})", False
    if isinstance(term, Num) and is_negative(term.value):
        return format_number(-term.value), True
    if isinstance(term, Product) and isinstance(term.factors[0], Num) and is_negative(term.factors[0].value):
        coefficient = -term.factors[0].value
        rest = term.factors[1:]
        if coefficient == 1 and not isinstance(coefficient, float) and rest and not isinstance(rest[0], Num):
            return _format_product(rest), True
        return _format_product((Num(coefficient),) + rest), True
    return format_expr(term), False


def format_statement(statement: Statement) -> str:
    """Print one statement."""
    if isinstance(statement, SizeDecl):
        return f"size {', '.join(statement.names)} = {statement.source}"
    if isinstance(statement, MatrixDecl):
        return f"{statement.kind} {', '.join(statement.names)}"
    if isinstance(statement, PadDecl):
        return f"pad {statement.mode} {', '.join(statement.names)}"
    if isinstance(statement, Return):
        if len(statement.names) == 1:
            return statement.names[0] + ","
        return ", ".join(statement.names)
    body = format_expr(statement.expr)
    if statement.target is None:
        return body
    target = statement.target + (_indices(statement.indices) if statement.indices else "")
    return f"{target} = {body}"


def format_program(program: ProgramIR) -> str:
    """Print a whole program, one statement per line."""
    return "\n".join(format_statement(statement) for statement in program.statements)
