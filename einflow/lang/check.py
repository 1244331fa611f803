"""Index rules of LANGUAGE.md §3: free/contracted/bound indices, targets, names, the ambiguity guard."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

from einflow.lang import ir
from einflow.lang.errors import EinflowError, IndexRuleError, TensorNameError, located
from einflow.lang.indices import free_indices, product_split, top_level_terms

__all__ = [
    "Checked",
    "as_checked",
    "checked",
    "ProgramInfo",
    "check_name",
    "check_names",
    "check_program",
]


@dataclass(frozen=True)
class ProgramInfo:
    """What the checker learned: inputs, targets and their indices, ranks, the program's value."""

    inputs: tuple[str, ...]
    ranks: dict[str, int]
    targets: dict[str, tuple[str, ...]]
    outputs: tuple[str | None, ...]
    returns_tuple: bool
    sizes_declared: dict[str, str | int] = field(default_factory=dict)
    #: ``symmetric A`` / ``spd K`` declarations: matrix name -> "symmetric" or "spd"
    matrices: dict[str, str] = field(default_factory=dict)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_name(name: object, role: str) -> str:
    """``name`` if it is a name the language can write (ASCII letters, digits, ``_``; not reserved).

    Programs built from IR (derivatives, API arguments such as ``cotangent=``) pass through here, so a
    name prints, re-parses and exports as itself: Python would read ``ｙ`` (fullwidth) as ``y``.

    >>> check_name("W_1", "a tensor name")
    'W_1'
    """
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        hint = ""
        if isinstance(name, str):
            folded = unicodedata.normalize("NFKC", name)
            if folded != name and _IDENTIFIER.fullmatch(folded):
                hint = f" (Python would read it as {folded!r})"
        raise TensorNameError(f"{name!r} cannot be {role}: names are ASCII letters, digits and '_', not starting "
                              f"with a digit{hint}")
    if name in ir.RESERVED:
        raise TensorNameError(f"'{name}' is a reserved word and cannot be used as {role}")
    return name


def check_names(program: ir.ProgramIR) -> None:
    """Every tensor and index name of ``program`` passes ``check_name`` (TensorNameError otherwise)."""
    for statement in program.statements:
        if isinstance(statement, ir.Return):
            for name in statement.names:
                check_name(name, "a tensor name")
            continue
        if isinstance(statement, (ir.MatrixDecl, ir.PadDecl)):
            for name in statement.names:
                check_name(name, "a tensor name")
            continue
        if isinstance(statement, ir.SizeDecl):
            for name in statement.names:
                check_name(name, "an index name")
            if isinstance(statement.source, str):
                check_name(statement.source, "a tensor name")
            elif type(statement.source) is not int or not 0 <= statement.source < 2**63:
                raise IndexRuleError(f"a literal size must be an integer in [0, 2**63), not {statement.source!r}")
            continue
        if statement.target is not None:
            check_name(statement.target, "a tensor name")
        for index in statement.indices or ():
            check_name(index, "an index name")
        for node in ir.walk(statement.expr):
            if isinstance(node, ir.Tensor):
                check_name(node.name, "a tensor name")
                for index in node.indices:
                    check_name(index, "an index name")
            elif isinstance(node, (ir.Read, ir.ShiftDelta)):
                if isinstance(node, ir.Read):
                    check_name(node.name, "a tensor name")
                for index in node.indices:
                    check_name(index, "an index name")
                for gather in node.gathers:
                    check_name(gather.name, "a tensor name")
            elif isinstance(node, ir.Delta):
                check_name(node.first, "an index name")
                check_name(node.second, "an index name")
            elif isinstance(node, (ir.Reduce, ir.Normalize, ir.Linalg)):
                for index in node.indices:
                    check_name(index, "an index name")


class _Checker:
    def __init__(self, source: str | None) -> None:
        self.source = source

    def fail(self, error: type[Exception], message: str, node: object) -> None:
        raise error(located(message, getattr(node, "span", None), self.source))

    def analyze(self, expr: ir.Expr, bound: frozenset[str]) -> set[str]:
        """Check ``expr`` and return the indices contracted anywhere inside it."""
        if isinstance(expr, (ir.Num, ir.Tensor, ir.Delta, ir.Read, ir.ShiftDelta)):
            if isinstance(expr, (ir.Tensor, ir.Delta, ir.Read, ir.ShiftDelta)):
                return product_split((expr,), bound)[1]
            return set()
        if isinstance(expr, ir.Product):
            free, contracted = product_split(expr.factors, bound)
            inner = set(contracted)
            for factor in expr.factors:
                if isinstance(factor, (ir.Num, ir.Tensor, ir.Delta, ir.Read, ir.ShiftDelta)):
                    continue
                nested = self.analyze(factor, bound)
                clash = nested & set(free)
                if clash:
                    self._ambiguous(sorted(clash)[0], factor, "a factor")
                inner |= nested
            return inner
        if isinstance(expr, ir.Sum):
            free = set(free_indices(expr, bound))
            inner: set[str] = set()
            for term in expr.terms:
                nested = self.analyze(term, bound)
                clash = nested & free
                if clash:
                    self._ambiguous(sorted(clash)[0], term, "a term of a sum")
                inner |= nested
            return inner
        if isinstance(expr, ir.Call):
            return self.analyze(expr.arg, bound)
        if isinstance(expr, ir.Power):
            return self.analyze(expr.base, bound)
        if isinstance(expr, ir.Binary):
            return self.analyze(ir.Sum((expr.left, expr.right)), bound)
        if isinstance(expr, ir.Normalize):
            if len(set(expr.indices)) != len(expr.indices):
                self.fail(IndexRuleError, f"{expr.kind}[{','.join(expr.indices)}] names an index twice", expr)
            body_free = free_indices(expr.body, bound)
            for index in expr.indices:
                if index not in body_free:
                    self.fail(IndexRuleError, f"{expr.kind}[{index}](...) normalises over '{index}', which is not "
                              "a free index of its body", expr)
            return self.analyze(expr.body, bound)
        if isinstance(expr, ir.Linalg):
            return self.analyze_linalg(expr, bound)
        if isinstance(expr, ir.Reduce):
            kind = expr.kind
            verb = "sums" if kind == "sum" else "reduces"
            if len(set(expr.indices)) != len(expr.indices):
                self.fail(IndexRuleError, f"{kind}[{','.join(expr.indices)}] names an index twice", expr)
            for index in expr.indices:
                if index in bound:
                    self.fail(IndexRuleError,
                              f"{kind}[{index}] {verb} index '{index}', which is already bound here "
                              "(by the target or an enclosing reduction); use another index name", expr)
            inner_bound = bound | frozenset(expr.indices)
            body_free = free_indices(expr.body, inner_bound)
            for index in expr.indices:
                if index not in body_free:
                    self.fail(IndexRuleError, f"{kind}[{index}](...) {verb} '{index}', which does not occur in "
                              "its body", expr)
            return self.analyze(expr.body, inner_bound)
        raise TypeError(f"not an expression: {expr!r}")

    # ---- linear algebra (LANGUAGE.md 8.1)
    def analyze_linalg(self, expr: ir.Linalg, bound: frozenset[str]) -> set[str]:
        """``inv[i,j](e)``: i and j free in e (binding as a normaliser does); ``det``/``logdet`` also reduce them,
        so they may not be bound around it. The sizes (square) are checked with the shapes (``statement_sizes``)."""
        row, column = expr.indices
        reduces = expr.reduces
        if reduces:
            for index in expr.indices:
                if index in bound:
                    self.fail(IndexRuleError, f"{expr.kind}[{row},{column}] reduces index '{index}', which is already "
                              "bound here (by the target or an enclosing reduction); use another index name", expr)
        inner = bound | frozenset(expr.indices) if reduces else bound
        body_free = free_indices(expr.body, inner)
        for index in expr.indices:
            if index not in body_free:
                self.fail(IndexRuleError, f"{expr.kind}[{row},{column}](...) needs '{index}' free in its body (the "
                          f"matrix's {'rows' if index == row else 'columns'}), but it is not", expr)
        return self.analyze(expr.body, inner)

    def _ambiguous(self, index: str, node: object, where: str) -> None:
        self.fail(IndexRuleError,
                  f"ambiguous index '{index}': it is summed inside {where} and also free around it; "
                  f"rename one of them, or make the intent explicit with a target or sum[{index}](...)", node)

    def tensor_refs(self, expr: ir.Expr) -> list[ir.Tensor]:
        """Every tensor the expression reads, as plain references of its rank (a Read's tensor and gathers too)."""
        refs: list[ir.Tensor] = []
        for node in ir.walk(expr):
            if isinstance(node, ir.Tensor):
                refs.append(node)
            elif isinstance(node, (ir.Read, ir.ShiftDelta)):
                if isinstance(node, ir.Read):
                    refs.append(ir.Tensor(node.name, tuple(f"_{k}" for k in range(len(node.positions))),
                                          span=node.span))
                refs.extend(ir.Tensor(gather.name, gather.indices, span=node.span) for gather in node.gathers)
        return refs

    def check(self, program: ir.ProgramIR) -> ProgramInfo:
        inputs: dict[str, None] = {}
        ranks: dict[str, int] = {}
        targets: dict[str, tuple[str, ...]] = {}
        declared: dict[str, str | int] = {}
        matrices: dict[str, tuple[str, ir.MatrixDecl]] = {}
        pads: dict[str, ir.PadDecl] = {}
        outputs: tuple[str | None, ...] = ()
        returns_tuple = False
        count = len(program.statements)
        for position, statement in enumerate(program.statements):
            last = position == count - 1
            if isinstance(statement, ir.Return):
                if not last:
                    self.fail(IndexRuleError, "a return line must be the last statement", statement)
                for name in statement.names:
                    if name not in targets:
                        self.fail(TensorNameError, f"return line names '{name}', which no statement assigns",
                                  statement)
                outputs = statement.names
                returns_tuple = True
                continue
            if isinstance(statement, ir.MatrixDecl):
                for name in statement.names:
                    if name in matrices:
                        self.fail(IndexRuleError, f"'{name}' is declared {matrices[name][0]} twice", statement)
                    matrices[name] = (statement.kind, statement)
                continue  # declarations stand anywhere, the last line too: the value is the last statement's
            if isinstance(statement, ir.PadDecl):
                if statement.mode not in ir.PAD_MODES:
                    self.fail(IndexRuleError, f"unknown padding mode '{statement.mode}': the modes are "
                              f"{', '.join(ir.PAD_MODES)}", statement)
                for name in statement.names:
                    if name in pads:
                        self.fail(IndexRuleError, f"'{name}' is declared pad {pads[name].mode} and pad "
                                  f"{statement.mode}; declare one mode per tensor", statement)
                    pads[name] = statement
                continue  # (like symmetric: for the whole program)
            if isinstance(statement, ir.SizeDecl):
                for name in statement.names:
                    if name in declared:
                        self.fail(IndexRuleError, f"size of index '{name}' is declared twice", statement)
                    declared[name] = statement.source
                if isinstance(statement.source, str):
                    source = statement.source
                    if source not in targets and source not in inputs:
                        inputs[source] = None
                    known = ranks.get(source)
                    if known is not None and known != len(statement.names):
                        self.fail(IndexRuleError,
                                  f"size declaration names {len(statement.names)} indices but '{source}' has "
                                  f"rank {known}", statement)
                    ranks.setdefault(source, len(statement.names))
                continue
            self.check_assign(statement, inputs, ranks, targets)
            if not returns_tuple:
                outputs = (statement.target,)
        for name, declaration in pads.items():
            if name not in inputs and name not in targets:
                self.fail(TensorNameError, f"'{name}' is declared pad {declaration.mode} but the program neither "
                          "reads nor assigns it", declaration)
        for name, (kind, statement) in matrices.items():
            if name not in inputs and name not in targets:
                self.fail(TensorNameError, f"'{name}' is declared {kind} but is neither an input nor a target",
                          statement)
            if ranks.get(name) != 2:
                self.fail(IndexRuleError, f"'{name}' is declared {kind} but has rank {ranks.get(name)}; only "
                          "square rank-2 matrices can be", statement)
        return ProgramInfo(tuple(inputs), ranks, targets, outputs, returns_tuple, declared,
                           {name: kind for name, (kind, _) in matrices.items()})

    def check_assign(self, statement: ir.Assign, inputs: dict[str, None], ranks: dict[str, int],
                     targets: dict[str, tuple[str, ...]]) -> None:
        for ref in self.tensor_refs(statement.expr):
            if ref.name == statement.target:
                self.fail(TensorNameError, f"'{ref.name}' is used on the right side of its own assignment", ref)
            known = ranks.get(ref.name)
            if known is not None and known != len(ref.indices):
                self.fail(IndexRuleError,
                          f"tensor '{ref.name}' is used with {len(ref.indices)} indices here but has rank {known}",
                          ref)
            ranks[ref.name] = len(ref.indices)
            if ref.name not in targets:
                inputs.setdefault(ref.name, None)
        target = statement.target
        if statement.indices is not None:
            if len(set(statement.indices)) != len(statement.indices):
                repeated = [i for i, n in Counter(statement.indices).items() if n > 1][0]
                self.fail(IndexRuleError, f"target index '{repeated}' is repeated in {target}[...]", statement)
            bound = frozenset(statement.indices)
            present: set[str] = set()
            for term in top_level_terms(statement.expr):
                self.analyze(term, bound)
                present |= set(free_indices(term, bound))
            for index in statement.indices:
                if index not in present:
                    self.fail(IndexRuleError,
                              f"target index '{index}' of {target} does not occur on the right side", statement)
            indices = statement.indices
        else:
            self.analyze(statement.expr, frozenset())
            indices = free_indices(statement.expr)
        if target is not None:
            if target in targets:
                self.fail(TensorNameError, f"'{target}' is assigned twice; each name is assigned once", statement)
            if target in inputs:
                self.fail(TensorNameError,
                          f"'{target}' is an input of an earlier statement and cannot also be assigned", statement)
            targets[target] = indices
            ranks[target] = len(indices)


def check_program(program: ir.ProgramIR, source: str | None = None) -> ProgramInfo:
    """Check every compile-time rule; raise an EinflowError subclass on the first violation."""
    return _Checker(source).check(program)


@dataclass(frozen=True, eq=False)
class Checked:
    """A program that passed every compile-time rule: its IR, its text and what the checker learned.

    What the derivation takes and returns (IR -> IR); ``einflow.Program`` wraps one. Equal and hashed by
    the IR alone, as programs are.
    """

    ir: ir.ProgramIR
    source: str
    info: ProgramInfo

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.info.inputs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checked) and other.ir == self.ir

    def __hash__(self) -> int:
        return hash(self.ir)


def checked(program: ir.ProgramIR, source: str | None = None) -> Checked:
    """``program`` checked: names as text writes them (programs built from IR too), then the index rules.

    >>> from einflow.lang.grammar import parse
    >>> checked(parse("y[i] = A[i,j] x[j]")).inputs
    ('A', 'x')
    """
    check_names(program)
    text = source if source is not None else ir.format_program(program)
    return Checked(program, text, check_program(program, text))


def as_checked(program: object) -> Checked:
    """Checked program data from einflow text, a ``Checked``, or anything holding one (a ``Program``).

    >>> as_checked("s = x[i] x[i]").inputs
    ('x',)
    """
    if isinstance(program, Checked):
        return program
    held = getattr(program, "checked", None)
    if isinstance(held, Checked):
        return held
    if isinstance(program, str):
        from einflow.lang.grammar import parse

        return checked(parse(program), program)
    raise EinflowError(f"expected einflow text or a Program, got {type(program).__name__}")
