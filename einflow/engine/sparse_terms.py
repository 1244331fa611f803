"""Index substitution and inlining for the sparse rewrite (``einflow.engine.sparse``, LANGUAGE.md §9.3): indices
replaced by gathers at a sparse tensor's coordinates, respecting the scopes an index is summed in, and products of
plain tensors put back into the products that read them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from einflow.lang import ir
from einflow.lang.check import ProgramInfo
from einflow.lang.errors import SparseError
from einflow.lang.indices import free_indices, indices_in

__all__ = ["walk", "around", "scoped", "substitute", "Inliner", "live", "tensor_names", "map_children", "unshadow",
           "beside"]


def walk(expr: ir.Expr) -> Any:
    yield expr
    for child in ir.children(expr):
        yield from walk(child)


def around(factors: tuple[ir.Expr, ...], k: int, bound: frozenset[str]) -> frozenset[str]:
    """The k-th factor's free indices that the product's other factors read: they are not summed inside it
    (``e[r] (T[a,r] S[r,b] + ...)``: a sparse tensor in the sum scatters r, which the product then sums)."""
    found: set[str] = set()
    for other in factors[:k] + factors[k + 1:]:
        found.update(i for i in (other.indices if isinstance(other, ir.Tensor) else free_indices(other, bound))
                     if isinstance(i, str))
    own = frozenset(free_indices(factors[k], bound))  # an index summed inside the factor stays its own
    return frozenset(found) & own


def scoped(factor: ir.Expr, mapping: Mapping[str, Any], bound: frozenset[str]) -> Mapping[str, Any]:
    """The part of a gather ``mapping`` that reaches into a product's ``factor``: an index summed inside a factor
    of its own (``W[c,c]`` in ``u[c] A[m,c] / W[c,c]``, a trace) is another index than the product's."""
    if isinstance(factor, (ir.Num, ir.Tensor, ir.Read, ir.Delta, ir.ShiftDelta)) or \
            all(isinstance(value, str) for value in mapping.values()):
        return mapping
    free = frozenset(free_indices(factor, bound))
    return {index: value for index, value in mapping.items() if index in free}


def substitute(expr: ir.Expr, mapping: Mapping[str, Any], sparse: Mapping[str, Any],
               bound: frozenset[str] = frozenset(), around: frozenset[str] = frozenset()) -> ir.Expr:
    """``expr`` with indices replaced: by another index (a str) or by a gather (an ir.Gather). A sparse tensor
    read at exactly its own coordinates becomes its values. ``bound``: the indices bound around ``expr`` (an index
    summed inside a factor of a product is not replaced there); ``around``: the indices the factors beside it in
    its product read.

    A tensor read on a diagonal (``W[t,t,p]``, t summed) and at a gather becomes a read that names t once: where
    no factor beside it reads t (t summed in its own product), the sum over t is written out
    (``sum[t](W[t,t,P_i0[z]])``), or t would stay free."""
    if not mapping:
        return expr
    if isinstance(expr, ir.Num):
        return expr
    if isinstance(expr, ir.Tensor):
        if not any(index in mapping for index in expr.indices):
            return expr
        positions = tuple(mapping.get(index, index) for index in expr.indices)
        if expr.name in sparse:
            own = sparse[expr.name]
            gathers = [p for p in positions if isinstance(p, ir.Gather)]
            if len(gathers) == len(positions) and tuple(p.name for p in gathers) == own.coords \
                    and len({p.indices for p in gathers}) == 1:
                return ir.Tensor(own.values, gathers[0].indices, span=expr.span)
            if gathers:
                raise SparseError(f"tensor {expr.name!r} is sparse and is read where another sparse tensor's "
                                  "entries are: a product of two sparse tensors on different patterns is not "
                                  "supported")
            return replace(expr, indices=positions)
        if all(isinstance(p, str) for p in positions):
            return replace(expr, indices=positions)
        read = ir.Read(expr.name, positions, span=expr.span)
        plain = [p for p in positions if isinstance(p, str)]
        diagonal = tuple(i for i in dict.fromkeys(plain) if plain.count(i) > 1 and i not in bound and i not in around)
        return ir.Reduce(diagonal, read, span=expr.span) if diagonal else read
    if isinstance(expr, ir.Read):
        positions_out: list[ir.Position] = []
        for position in expr.positions:
            if isinstance(position, str):
                positions_out.append(mapping.get(position, position))
            elif any(index in mapping for index in ir.position_indices(position)):
                if any(not isinstance(mapping[i], str) for i in ir.position_indices(position) if i in mapping):
                    raise SparseError(f"{ir.format_expr(expr)}: a shifted or gathered read at a sparse tensor's "
                                      "coordinates is not supported")
                positions_out.append(rename_position(position, mapping))
            else:
                positions_out.append(position)
        return replace(expr, positions=tuple(positions_out))
    if isinstance(expr, ir.Delta):
        first, second = mapping.get(expr.first, expr.first), mapping.get(expr.second, expr.second)
        if isinstance(first, str) and isinstance(second, str):
            return replace(expr, first=first, second=second)
        if first == second:
            return ir.Num(1)  # delta[p,p] with p bound (a broadcast over p): 1 on every entry
        if isinstance(first, str):
            return ir.ShiftDelta(first, second, span=expr.span)
        if isinstance(second, str):
            return ir.ShiftDelta(second, first, span=expr.span)
        raise SparseError(f"{ir.format_expr(expr)} between two coordinates of a sparse tensor is not supported")
    if isinstance(expr, ir.ShiftDelta):
        index = mapping.get(expr.index, expr.index)
        if not isinstance(index, str) or any(not isinstance(mapping.get(i, i), str)
                                             for i in ir.position_indices(expr.position)):
            raise SparseError(f"{ir.format_expr(expr)} at a sparse tensor's coordinates is not supported")
        return replace(expr, index=index, position=rename_position(expr.position, mapping))
    if isinstance(expr, ir.Product):
        return replace(expr, factors=tuple(
            substitute(f, scoped(f, mapping, bound), sparse, bound, beside(expr.factors, k))
            for k, f in enumerate(expr.factors)))
    if isinstance(expr, ir.Sum):
        return replace(expr, terms=tuple(substitute(t, mapping, sparse, bound) for t in expr.terms))
    if isinstance(expr, ir.Call):
        return replace(expr, arg=substitute(expr.arg, mapping, sparse, bound))
    if isinstance(expr, ir.Power):
        return replace(expr, base=substitute(expr.base, mapping, sparse, bound))
    if isinstance(expr, ir.Binary):
        return replace(expr, left=substitute(expr.left, mapping, sparse, bound),
                       right=substitute(expr.right, mapping, sparse, bound))
    if isinstance(expr, (ir.Reduce, ir.Normalize, ir.Linalg)):
        inner = {k: v for k, v in mapping.items() if k not in expr.indices}  # the scope's own indices shadow
        renamed = tuple(mapping.get(i, i) if isinstance(mapping.get(i, i), str) else i for i in expr.indices) \
            if all(isinstance(v, str) for v in mapping.values()) else expr.indices
        if renamed != expr.indices:
            inner = dict(mapping)
        return replace(expr, indices=renamed,  # type: ignore[arg-type]
                       body=substitute(expr.body, inner, sparse, bound | frozenset(expr.indices)))
    raise SparseError(f"a sparse tensor's coordinates inside {ir.format_expr(expr)} are not supported")


def unshadow(expr: ir.Expr, target: frozenset[str], fresh: Callable[[str], str], aliases: dict[str, str]) -> ir.Expr:
    """``expr`` with each scope that reduces an index of the ``target`` (``Y = mean[j,i](S[h,i] delta[h,j]) + w[j]``,
    its target implicit: ``[h,j]``) reducing it under a new name (by ``fresh``): the statement rewritten names its
    target's indices, which no scope inside may reduce, and the scope's index is another index than the target's
    when the indices a sparse factor keeps are renamed statement-wide. ``aliases`` gets each new name's old one
    (one name has one size in a statement: the target's index may take its size from the scope's tensors)."""
    if ir.reduces(expr):
        mapping = {index: fresh(index) for index in expr.indices if index in target}
        if mapping:
            expr = replace(expr, indices=tuple(mapping.get(i, i) for i in expr.indices),  # type: ignore[arg-type]
                           body=substitute(expr.body, mapping, {}))
            aliases.update({new: old for old, new in mapping.items()})
    return map_children(expr, lambda child: unshadow(child, target, fresh, aliases))


def beside(factors: tuple[ir.Expr, ...], k: int) -> frozenset[str]:
    """The indices the factors of a product other than the k-th read."""
    return frozenset().union(*(indices_in(f) for j, f in enumerate(factors) if j != k))


def rename_position(position: Any, mapping: Mapping[str, Any]) -> Any:
    if isinstance(position, ir.Gather):
        return replace(position, indices=tuple(mapping.get(i, i) for i in position.indices))
    return replace(position, terms=tuple((c, mapping.get(i, i)) for c, i in position.terms))


class Inliner:
    """Products of plain tensors computed into intermediates (a derivative's shared outer products,
    ``t2[i,r,k] = A[i,r] C[k,r]``, or a contraction with a sparse factor) put back into the products reading them,
    so that a sparse factor there gathers them per entry instead of reading a dense intermediate."""

    def __init__(self, program: ir.ProgramIR, info: ProgramInfo, keep: frozenset[str], used: set[str],
                 sparse: frozenset[str]) -> None:
        self.info = info
        #: the sparse inputs and the values computed from them
        self.touched = set(sparse)
        self.used = used
        self.defs: dict[str, tuple[tuple[str, ...], tuple[ir.Expr, ...]]] = {}
        #: the definitions with a sparse factor: put back into products only (read alone, as a function's
        #: argument, they stay a statement of their own, which may run as one SpMM)
        self.sparse_defs: set[str] = set()
        blocked: set[str] = set(keep)
        for statement in program.statements:
            if isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str):
                blocked.add(statement.source)
            elif isinstance(statement, ir.Assign):
                blocked.update(indirect_names(statement.expr))
        self.blocked = blocked

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}{k}", k + 1
        self.used.add(name)
        return name

    def run(self, program: ir.ProgramIR) -> ir.ProgramIR:
        out: list[ir.Statement] = []
        for statement in program.statements:
            if isinstance(statement, ir.Assign):
                statement = replace(statement, expr=self.expr(statement.expr, frozenset(statement.indices or ()),
                                                               True))
                self._learn(statement)
            out.append(statement)
        return ir.ProgramIR(tuple(live(out, self.info)))

    def _learn(self, statement: ir.Assign) -> None:
        target = statement.target
        mentions = bool(tensor_names(statement.expr) & self.touched)
        if mentions and target is not None:
            self.touched.add(target)
        if target is None or target in self.blocked:
            return
        indices = statement.indices if statement.indices is not None else self.info.targets.get(target)
        expr = statement.expr
        factors = expr.factors if isinstance(expr, ir.Product) else (expr,)
        if indices is None or len(set(indices)) != len(indices) or not all(
                isinstance(f, (ir.Num, ir.Tensor)) for f in factors):
            return
        if set(free_indices(expr, frozenset(indices))) != set(indices) or \
                set(free_indices(expr)) - set(indices):  # every other index is summed inside the product
            return
        if not mentions and set(indices_in(expr)) - set(indices):
            return  # a dense contraction stays computed once; a dense outer product is gathered where it is read
        self.defs[target] = (tuple(indices), tuple(factors))
        if mentions:
            self.sparse_defs.add(target)

    def _body(self, read: ir.Tensor) -> tuple[ir.Expr, ...]:
        indices, factors = self.defs[read.name]
        mapping = dict(zip(indices, read.indices))
        for factor in factors:
            for index in getattr(factor, "indices", ()):
                if index not in mapping:
                    mapping[index] = self.fresh(index)
        return tuple(substitute(factor, mapping, {}) for factor in factors)

    def _fits(self, read: ir.Tensor, others: tuple[ir.Expr, ...], bound: frozenset[str], top: bool) -> bool:
        """Whether splicing the definition of ``read`` into its product keeps every index free or summed as it
        was: a target index occurring twice in the definition must be bound, or summed here anyway."""
        if read.name in self.sparse_defs and any(tensor_names(other) & self.touched for other in others):
            return False  # a second sparse factor in one product: it stays a statement of its own
        if read.name not in self.defs or top:
            return read.name in self.defs
        indices, factors = self.defs[read.name]
        around = frozenset().union(*(indices_in(other) for other in others)) if others else frozenset()
        for index, outer in zip(indices, read.indices):
            count = sum(getattr(f, "indices", ()).count(index) for f in factors)
            if count > 1 and outer not in bound and outer not in around:
                return False
        return True

    def expr(self, expr: ir.Expr, bound: frozenset[str], top: bool) -> ir.Expr:
        if isinstance(expr, ir.Tensor):
            if expr.name not in self.sparse_defs and self._fits(expr, (), bound, top):
                body = self._body(expr)
                return ir.Product(body) if len(body) > 1 else body[0]
            return expr
        if isinstance(expr, ir.Product):
            factors: list[ir.Expr] = []
            for k, factor in enumerate(expr.factors):
                others = expr.factors[:k] + expr.factors[k + 1:]
                if isinstance(factor, ir.Tensor) and self._fits(factor, others, bound, top):
                    factors.extend(self._body(factor))
                else:
                    factors.append(self.expr(factor, bound, False))
            return replace(expr, factors=tuple(factors))
        if isinstance(expr, ir.Sum):
            return replace(expr, terms=tuple(self.expr(term, bound, top) for term in expr.terms))
        if isinstance(expr, ir.Reduce):
            return replace(expr, body=self.expr(expr.body, bound | frozenset(expr.indices), top))
        if isinstance(expr, (ir.Normalize, ir.Linalg)):
            return replace(expr, body=self.expr(expr.body, bound | frozenset(expr.indices), False))
        if isinstance(expr, ir.Call):
            return replace(expr, arg=self.expr(expr.arg, bound, False))
        if isinstance(expr, ir.Power):
            return replace(expr, base=self.expr(expr.base, bound, False))
        if isinstance(expr, ir.Binary):
            return replace(expr, left=self.expr(expr.left, bound, False), right=self.expr(expr.right, bound, False))
        return expr


def indirect_names(expr: ir.Expr) -> set[str]:
    """Tensors read other than plainly: at shifted or gathered positions, or as gather positions."""
    found: set[str] = set()
    if isinstance(expr, ir.Read):
        found.add(expr.name)
    if isinstance(expr, (ir.Read, ir.ShiftDelta)):
        found.update(gather.name for gather in expr.gathers)
    for child in ir.children(expr):
        found |= indirect_names(child)
    return found


def tensor_names(expr: ir.Expr) -> set[str]:
    found = {expr.name} if isinstance(expr, (ir.Tensor, ir.Read)) else set()
    if isinstance(expr, (ir.Read, ir.ShiftDelta)):
        found.update(gather.name for gather in expr.gathers)
    for child in ir.children(expr):
        found |= tensor_names(child)
    return found


def live(statements: list[ir.Statement], info: ProgramInfo) -> list[ir.Statement]:
    """The statements without assignments nothing reads (the program's outputs are read)."""
    needed = {name for name in info.outputs if name is not None}
    kept: list[ir.Statement] = []
    for statement in reversed(statements):
        if isinstance(statement, ir.Assign):
            if statement.target is not None and statement.target not in needed and statement is not statements[-1]:
                continue
            needed |= tensor_names(statement.expr)
        elif isinstance(statement, ir.SizeDecl) and isinstance(statement.source, str):
            needed.add(statement.source)
        elif isinstance(statement, (ir.MatrixDecl, ir.PadDecl)):  # a declaration of tensors no longer read goes
            names = tuple(name for name in statement.names if name in needed)
            if not names:
                continue
            statement = replace(statement, names=names)
        kept.append(statement)
    return kept[::-1]


def map_children(expr: ir.Expr, function: Any) -> ir.Expr:
    if isinstance(expr, ir.Product):
        return replace(expr, factors=tuple(map(function, expr.factors)))
    if isinstance(expr, ir.Sum):
        return replace(expr, terms=tuple(map(function, expr.terms)))
    if isinstance(expr, ir.Call):
        return replace(expr, arg=function(expr.arg))
    if isinstance(expr, ir.Power):
        return replace(expr, base=function(expr.base))
    if isinstance(expr, (ir.Reduce, ir.Normalize, ir.Linalg)):
        return replace(expr, body=function(expr.body))
    if isinstance(expr, ir.Binary):
        return replace(expr, left=function(expr.left), right=function(expr.right))
    return expr
