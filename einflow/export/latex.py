"""Render a program as LaTeX index notation, with implicit contractions written as explicit sums."""

from __future__ import annotations

import re
from typing import Any

from einflow.lang import ir
from einflow.lang.check import as_checked
from einflow.lang.contraction import product_output
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import free_indices, product_operands, top_level_terms

__all__ = ["to_latex", "render_name", "render_expression"]

_GREEK = frozenset({
    "alpha", "beta", "gamma", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "pi", "rho", "varrho", "sigma", "tau", "upsilon", "phi", "varphi", "chi", "psi",
    "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega",
})

# How each elementwise function is written; @ stands for the rendered argument (one row per function).
_FUNCTIONS: dict[str, str] = {name: rule.latex for name, rule in FUNCTION_RULES.items()}
_REDUCTIONS: dict[str, str] = {"max": r"\max", "min": r"\min", "mean": r"\operatorname{mean}",
                               "logsumexp": r"\operatorname{logsumexp}", "softmax": r"\operatorname{softmax}",
                               "log_softmax": r"\operatorname{log\,softmax}", "argmax": r"\operatorname{argmax}",
                               "argmin": r"\operatorname{argmin}"}

# Kinds of rendered text, for parenthesization: a sum (top-level + or -), a leading minus,
# a leading \sum (extends to the right), a product of several factors, an atom.
_SUM, _NEGATIVE, _SIGMA, _PRODUCT, _ATOM = "sum", "negative", "sigma", "product", "atom"

_SECOND_DERIVATIVE = re.compile(r"d2(?P<value>[A-Za-z]\w*?)_d(?P<wrt>[A-Za-z]\w*)2")


def _escape(text: str) -> str:
    return text.replace("_", r"\_")


def render_name(name: str) -> str:
    """A tensor name in LaTeX: one letter as is, Greek names as symbols, longer names upright-italic words.

    >>> render_name("W"), render_name("alpha"), render_name("loss"), render_name("W_1")
    ('W', '\\\\alpha', '\\\\mathit{loss}', '\\\\mathit{W\\\\_1}')
    """
    if len(name) == 1:
        return name
    if name in _GREEK:
        return "\\" + name
    return r"\mathit{" + _escape(name) + "}"


def _subscript(indices: tuple[str, ...]) -> str:
    if not indices:
        return ""
    if all(len(index) == 1 for index in indices):
        return "_{" + "".join(indices) + "}"
    return "_{" + ",".join(_escape(index) for index in indices) + "}"


def _positions(positions: tuple[ir.Position, ...]) -> str:
    """The subscript of a read through positions: ``_{i+1}``, ``_{2h+r-1,w}``, ``_{t_{b},d}``."""
    texts = []
    for position in positions:
        if isinstance(position, ir.Gather):
            texts.append(render_name(position.name) + _subscript(position.indices))
        else:
            texts.append(_escape(ir.format_position(position).replace(" ", "").replace("*", "")))
    return "_{" + ",".join(texts) + "}"


def _sum_symbol(indices: list[str]) -> str:
    return r"\sum_{" + ",".join(_escape(index) for index in indices) + "} "


def _number(value: int | float) -> str:
    """A non-negative number."""
    if isinstance(value, bool) or isinstance(value, int):
        return str(int(value))
    if value != value:
        return r"\mathrm{NaN}"
    if value == float("inf"):
        return r"\infty"
    text = repr(float(value))
    if "e" in text:
        mantissa, exponent = text.split("e")
        power = "10^{" + str(int(exponent)) + "}"
        return power if float(mantissa) == 1 else f"{mantissa} \\times {power}"
    return text


class _Renderer:
    def __init__(self, ranks: dict[str, int], known: set[str]) -> None:
        self.ranks = ranks
        self.known = known

    # ------------------------------------------------------------------ names
    def tensor(self, name: str, indices: tuple[str, ...]) -> str:
        derivative = self.derivative(name, indices)
        return derivative if derivative is not None else render_name(name) + _subscript(indices)

    def derivative(self, name: str, indices: tuple[str, ...]) -> str | None:
        """``dL_dW[j,k]`` as a partial derivative; ``d2L_dX2[p,q]`` as a second one; None otherwise."""
        second = _SECOND_DERIVATIVE.fullmatch(name)
        if second is not None:  # "d2..." cannot be a first derivative: a value name starts with a letter
            value, wrt = second["value"], second["wrt"]
            rank = self.ranks.get(wrt, len(indices) // 2)
            if 2 * rank > len(indices):
                rank = len(indices) // 2
            head = len(indices) - 2 * rank
            first_axes, second_axes = indices[head:head + rank], indices[head + rank:]
            return (r"\frac{\partial^2 " + self.tensor(value, indices[:head]) + r"}{\partial "
                    + self.tensor(wrt, first_axes) + r"\partial " + self.tensor(wrt, second_axes) + "}")
        readings = _splits(name)
        preferred = [reading for reading in readings if reading[1] in self.known]
        for value, wrt in preferred or readings:
            rank = min(self.ranks.get(wrt, len(indices)), len(indices))
            head = len(indices) - rank
            return (r"\frac{\partial " + self.tensor(value, indices[:head]) + r"}{\partial "
                    + self.tensor(wrt, indices[head:]) + "}")
        return None
    # ------------------------------------------------------------------ expressions
    def render(self, expr: ir.Expr, bound: frozenset[str], extra: tuple[str, ...] = ()) -> tuple[str, str]:
        """(text, kind) of ``expr`` with ``extra`` indices summed around it."""
        if isinstance(expr, ir.Reduce) and expr.kind == "sum":
            inner = bound | frozenset(expr.indices)
            return self.render(expr.body, inner, _merge(extra, expr.indices))
        if isinstance(expr, (ir.Product, ir.Tensor, ir.Delta, ir.Read, ir.ShiftDelta)):
            factors = expr.factors if isinstance(expr, ir.Product) else (expr,)
            negative, text, kind = self.product(factors, bound, extra)
            return ("-" + text, _NEGATIVE) if negative else (text, kind)
        if extra:
            body, kind = self.render(expr, bound)
            if kind in (_SUM, _NEGATIVE):
                body = r"\left(" + body + r"\right)"
            return _sum_symbol(list(extra)) + body, _SIGMA
        if isinstance(expr, ir.Num):
            text = _number(abs(expr.value))
            return ("-" + text, _NEGATIVE) if expr.value < 0 else (text, _ATOM)
        if isinstance(expr, ir.Sum):
            return self.sum(expr.terms, bound, [()] * len(expr.terms)), _SUM
        if isinstance(expr, ir.Call):
            argument, _ = self.render(expr.arg, bound)
            return _FUNCTIONS[expr.func].replace("@", argument), _ATOM
        if isinstance(expr, (ir.Reduce, ir.Normalize)):
            inner = bound | frozenset(expr.indices) if isinstance(expr, ir.Reduce) else bound
            argument, _ = self.render(expr.body, inner)
            name = _REDUCTIONS[expr.kind]
            return name + "_{" + ",".join(expr.indices) + r"}\left(" + argument + r"\right)", _ATOM
        if isinstance(expr, ir.Linalg):
            return self.linalg(expr, bound), _ATOM
        if isinstance(expr, ir.Binary):
            left, _ = self.render(expr.left, bound)
            right, _ = self.render(expr.right, bound)
            name = r"\max" if expr.func == "maximum" else r"\min"
            return name + r"\left(" + left + ", " + right + r"\right)", _ATOM
        if isinstance(expr, ir.Power):
            return self.power(expr, bound)
        raise TypeError(f"not an einflow expression: {expr!r}")

    # ---- linear algebra (LANGUAGE.md 8.1): A^{-1}, \det A, \log\lvert\det A\rvert
    def linalg(self, expr: ir.Linalg, bound: frozenset[str]) -> str:
        r"""``(A^{-1})_{i,j}``, ``\det A``, ``\log\lvert\det A\rvert``; a matrix other than a tensor read as
        ``A[i,j]`` (or ``A[j,i]``: ``A^T``) is written ``[e]_{i,j}``."""
        row, column = expr.indices
        body = expr.body
        if isinstance(body, ir.Tensor) and body.indices in ((row, column), (column, row)):
            matrix = render_name(body.name) + ("^{T}" if body.indices == (column, row) else "")
        else:
            inner = bound | frozenset(ir.reduced_indices(expr))
            text, _ = self.render(body, inner)
            matrix = r"\left[" + text + r"\right]_{" + row + "," + column + "}"
        if expr.kind == "inv":
            return r"\left(" + matrix + r"^{-1}\right)_{" + row + "," + column + "}"
        if expr.kind == "det":
            return r"\det " + matrix
        if expr.kind == "sign_det":
            return r"\operatorname{sgn}\det " + matrix
        return r"\log\lvert\det " + matrix + r"\rvert"

    def sum(self, terms: tuple[ir.Expr, ...], bound: frozenset[str], extras: list[tuple[str, ...]]) -> str:
        pieces: list[str] = []
        for position, (term, extra) in enumerate(zip(terms, extras)):
            text, kind = self.render(term, bound, extra)
            negative = kind == _NEGATIVE
            if negative:
                text = text[1:]
            if kind == _SUM:
                text = r"\left(" + text + r"\right)"
            if position == 0:
                pieces.append(("-" if negative else "") + text)
            else:
                pieces.append(("- " if negative else "+ ") + text)
        return " ".join(pieces)

    def power(self, expr: ir.Power, bound: frozenset[str]) -> tuple[str, str]:
        if expr.exponent < 0:
            return r"\frac{1}{" + self.power_text(expr.base, -expr.exponent, bound) + "}", _ATOM
        return self.power_text(expr.base, expr.exponent, bound), _ATOM

    def power_text(self, base: ir.Expr, exponent: int | float, bound: frozenset[str]) -> str:
        text, kind = self.render(base, bound)
        if exponent == 0.5:
            return r"\sqrt{" + text + "}"
        if exponent == 1:
            return text
        if kind != _ATOM or isinstance(base, ir.Power):  # (x^2)^3 keeps its parentheses
            text = r"\left(" + text + r"\right)"
        return text + "^{" + _number(exponent) + "}"

    def product(self, factors: tuple[ir.Expr, ...], bound: frozenset[str],
                extra: tuple[str, ...]) -> tuple[bool, str, str]:
        """(negative, text without the sign, kind) of a product, its contractions written as a sum."""
        _, contracted = product_output(product_operands(factors, bound), bound, frozenset())
        summed = _merge(extra, tuple(contracted))
        negative = False
        numerator: list[str] = []
        denominator: list[str] = []
        signs = 1 if isinstance(factors[0], ir.Num) and abs(factors[0].value) == 1 else 0
        several = len(factors) - signs > 1  # -sum[s](...) needs no parentheses around the sum
        for position, factor in enumerate(factors):
            if isinstance(factor, ir.Num):
                value = factor.value
                if position == 0 and value < 0:
                    negative, value = True, -value
                if position == 0 and value == 1 and len(factors) > 1:  # dtype matters to numpy, not in print
                    continue
                text = _number(value)
                if numerator and not numerator[-1].startswith(r"\cdot"):
                    text = r"\cdot " + text
                numerator.append(text)
            elif isinstance(factor, ir.Power) and factor.exponent < 0:
                denominator.append(self.power_text(factor.base, -factor.exponent, bound))
            elif isinstance(factor, ir.Tensor):
                numerator.append(self.tensor(factor.name, factor.indices))
            elif isinstance(factor, ir.Delta):
                numerator.append(r"\delta" + _subscript((factor.first, factor.second)))
            elif isinstance(factor, ir.Read):  # x_{i+1}, E_{t_{b},d}
                numerator.append(render_name(factor.name) + _positions(factor.positions))
            elif isinstance(factor, ir.ShiftDelta):
                numerator.append(r"\delta" + _positions((factor.index, factor.position)))
            else:
                text, kind = self.render(factor, bound)
                if several and kind in (_SUM, _NEGATIVE, _SIGMA):
                    text = r"\left(" + text + r"\right)"
                numerator.append(text)
        if denominator:
            body = r"\frac{" + (" ".join(numerator) or "1") + "}{" + " ".join(denominator) + "}"
        else:
            body = " ".join(numerator) or "1"
        kind = _PRODUCT if len(numerator) + len(denominator) > 1 else _ATOM
        if summed:
            return negative, _sum_symbol(list(summed)) + body, _SIGMA
        return negative, body, kind

    # ------------------------------------------------------------------ statements
    def statement(self, statement: ir.Assign, targets: dict[str, tuple[str, ...]]) -> tuple[str | None, str]:
        if statement.indices is not None:
            bound = frozenset(statement.indices)
            terms = top_level_terms(statement.expr)
            extras = [tuple(i for i in free_indices(term, bound) if i not in bound) for term in terms]
            if len(terms) == 1:
                right, _ = self.render(terms[0], bound, extras[0])
            else:
                right = self.sum(terms, bound, extras)
        else:
            right, _ = self.render(statement.expr, frozenset())
        if statement.target is None:
            return None, right
        indices = statement.indices if statement.indices is not None else targets.get(statement.target, ())
        return self.tensor(statement.target, tuple(indices)), right


def _merge(first: tuple[str, ...], second: tuple[str, ...]) -> tuple[str, ...]:
    return first + tuple(index for index in second if index not in first)


def _splits(name: str) -> list[tuple[str, str]]:
    """Every way to read ``name`` as d<value>_d<wrt>."""
    found: list[tuple[str, str]] = []
    if not name.startswith("d"):
        return found
    for position in range(2, len(name)):
        if name.startswith("_d", position):
            value, wrt = name[1:position], name[position + 2:]
            if re.fullmatch(r"[A-Za-z]\w*", value) and re.fullmatch(r"[A-Za-z]\w*", wrt):
                found.append((value, wrt))
    return found


def render_expression(expr: ir.Expr) -> str:
    """One expression in LaTeX, contractions made explicit.

    >>> from einflow.lang.grammar import parse_expression
    >>> render_expression(parse_expression("A[i,k] B[k,j]"))
    '\\\\sum_{k} A_{ik} B_{kj}'
    """
    text, _ = _Renderer({}, set()).render(expr, frozenset())
    return text


def to_latex(program: Any) -> str:
    r"""The program in index notation: one line per statement, joined in an ``aligned`` environment.

    Implicit contractions become explicit sums, functions are ``\tanh``, ``\exp``, ``\sigma`` (sigmoid)
    and friends, divisions are fractions, and derivative targets ``dL_dW`` read as partial derivatives.
    Size declarations and the return line are not printed (they carry no algebra); a ``pad`` declaration
    other than ``zeros`` is, as a last row (``\text{circular padding: } u``).

    >>> import einflow as ef
    >>> print(ef.compile("C[i,j] = A[i,k] B[k,j]").to_latex())
    C_{ij} = \sum_{k} A_{ik} B_{kj}
    >>> print(ef.compile("size p = x\ndf_dx[p] = 2 x[p]").to_latex())
    \frac{\partial f}{\partial x_{p}} = 2 x_{p}
    """
    program = as_checked(program)
    info = program.info
    known = set(info.inputs) | set(info.targets)
    renderer = _Renderer(dict(info.ranks), known)
    rows = [renderer.statement(statement, info.targets) for statement in program.ir.statements
            if isinstance(statement, ir.Assign)]
    # a padding mode changes what the reads mean, so it is printed (zeros, the default, is not)
    rows += [(None, rf"\text{{{statement.mode} padding: }} " + ", ".join(render_name(name) for name in statement.names))
             for statement in program.ir.statements if isinstance(statement, ir.PadDecl) and statement.mode != "zeros"]
    if len(rows) == 1:
        left, right = rows[0]
        return right if left is None else f"{left} = {right}"
    lines = [(f"{left} &= {right}" if left is not None else f"&{right}") for left, right in rows]
    return "\\begin{aligned}\n" + " \\\\\n".join(lines) + "\n\\end{aligned}"
