"""Sparse operands (LANGUAGE.md §9.3): a COO tensor is coordinates and values, a product with it a gather.

A call that passes a scipy.sparse array or matrix, or a pydata ``sparse.COO``, runs a rewritten program:

- the sparse input ``S`` of rank d becomes its values ``S_v[z]`` and one integer coordinate vector per axis
  (``S_i0[z]``, ...), z over its stored entries (duplicates summed once, on conversion);
- in a product, ``S[i,j] H[j,f]`` becomes ``S_v[z] delta[i, S_i0[z]] H[S_i1[z], f]``: an index of ``S``
  summed in the product is substituted by a gather of its coordinate in the other factors, an index kept
  (in the output, or bound outside) becomes a scatter-add through ``delta``. Nothing of the dense size is
  made: the work is O(nnz x the other indices);
- a statement whose value is zero wherever a sparse factor is (a product with it, ``f(S)`` with f(0) = 0,
  ``S^p``), and whose indices are that factor's, is computed on its pattern only (SDDMM, masks): its value is
  a sparse tensor with the factor's coordinates, returned as the same kind of sparse array;
- a derivative program's output taken by a sparse input (``grad(p, wrt="S")``) is sampled on ``S``'s pattern:
  the derivative with respect to the stored values, returned sparse.

The rewrite happens once per (program, sparse shapes, shared patterns) and its program plans like any other;
its derivative programs are einflow programs and run through the same rewrite. Libraries are imported only when
a sparse input arrives (their type's module is read without importing it).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from einflow.engine.sparse_arrays import SpMM
from einflow.engine.sparse_order import dense_groups
from einflow.engine.sparse_terms import Inliner, around, beside, map_children, scoped, substitute, unshadow, walk
from einflow.lang import ir
from einflow.lang.check import ProgramInfo
from einflow.lang.errors import SparseError
from einflow.lang.functions import FUNCTION_RULES
from einflow.lang.indices import free_indices, indices_in

__all__ = ["Pattern", "Rewritten", "rewrite"]

# ---------------------------------------------------------------- the rewrite
@dataclass(frozen=True)
class Pattern:
    """A sparse tensor of the rewritten program: its values' name and its coordinates' names, axis by axis."""

    values: str
    coords: tuple[str, ...]
    shape: tuple[int, ...]
    #: the group of inputs sharing these coordinates (the coordinate arrays passed once)
    group: int


@dataclass(frozen=True)
class Rewritten:
    """A program with sparse inputs rewritten over their coordinates and values.

    ``inputs``: sparse input -> its :class:`Pattern`; ``outputs``: per output of the program, None (dense)
    or (the pattern group it lies on, the axis of that group's coordinates each of its axes reads, its shape).
    """

    program: ir.ProgramIR
    inputs: Mapping[str, Pattern]
    group_coords: tuple[tuple[str, ...], ...]
    outputs: tuple[tuple[int, tuple[int, ...], tuple[int, ...]] | None, ...]
    #: sparse-dense matrix products computed before the program (SpMM through scipy)
    products: tuple[SpMM, ...] = ()


@functools.cache
def keeps_zero(function: str) -> bool:
    """Whether the elementwise ``function`` maps 0 to 0 (it then stays on a sparse pattern)."""
    rule = FUNCTION_RULES.get(function)
    if rule is None:
        return False
    try:
        with np.errstate(all="ignore"):
            return bool(np.all(np.asarray(rule.value(np, np.zeros(1))) == 0))
    except Exception:  # noqa: BLE001 - a function that cannot be evaluated at 0 does not keep it
        return False


class _Rewriter:
    def __init__(self, program: ir.ProgramIR, info: ProgramInfo, groups: Mapping[str, int],
                 shapes: Mapping[str, tuple[int, ...]], sample: Mapping[str, str], matmuls: bool = True,
                 dense: Mapping[str, tuple[int, ...]] | None = None, nnz: Mapping[int, int] | None = None) -> None:
        self.info = info
        self.matmuls = matmuls
        #: the dense inputs' shapes and each pattern group's entries (an order of contraction by cost, sparse_order)
        self.dense = dense or {}
        self.nnz = nnz or {}
        self.used = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", ir.format_program(program)))
        self.sample = sample
        group_coords: dict[int, tuple[str, ...]] = {}
        self.sparse: dict[str, Pattern] = {}
        for name, group in groups.items():
            shape = shapes[name]
            if group not in group_coords:
                group_coords[group] = tuple(self.fresh(f"{name}_i{axis}") for axis in range(len(shape)))
            self.sparse[name] = Pattern(self.fresh(f"{name}_v"), group_coords[group], shape, group)
        self.inputs = dict(self.sparse)
        self.group_coords = tuple(group_coords[k] for k in sorted(group_coords))
        self.kept: dict[str, int] = {}
        #: indices read through a gather in the statement being rewritten, with their sizes
        self.gathered: dict[str, int] = {}
        #: statements computing hoisted values on a pattern, to go before the statement being rewritten
        self.pending: list[ir.Statement] = []
        self.products: list[SpMM] = []
        #: the statement being rewritten (a scope computed on its own takes its indices' sizes from it)
        self.whole: ir.Expr = ir.Num(0)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}{k}", k + 1
        self.used.add(name)
        return name

    # ------------------------------------------------------------ statements
    def statements(self, program: ir.ProgramIR) -> list[ir.Statement]:
        out: list[ir.Statement] = []
        for statement in program.statements:
            if isinstance(statement, ir.SizeDecl) and statement.source in self.sparse:
                shape = self.sparse[statement.source].shape  # type: ignore[index]
                out.extend(ir.SizeDecl((name,), size) for name, size in zip(statement.names, shape))
            elif isinstance(statement, ir.Return):
                out.append(replace(statement, names=tuple(
                    self.sparse[name].values if name in self.sparse else name for name in statement.names)))
            elif isinstance(statement, (ir.PadDecl, ir.MatrixDecl)):
                what = statement.kind if isinstance(statement, ir.MatrixDecl) else "pad"
                for name in statement.names:
                    if name in self.sparse:
                        raise SparseError(f"tensor {name!r} is sparse: a {what} declaration of it is not supported")
                out.append(statement)
            elif isinstance(statement, ir.Assign):
                self.pending = []
                new = self.assign(statement)
                out.extend(self.pending)
                out.extend(new)
            else:
                out.append(statement)
        return out

    def assign(self, statement: ir.Assign) -> list[ir.Statement]:
        expr = statement.expr
        if statement.indices is not None:
            indices = statement.indices
        elif statement.target is not None:
            indices = self.info.targets.get(statement.target, free_indices(expr))
        else:
            indices = free_indices(expr)
        if not self._mentions_sparse(expr) and statement.target not in self.sample:
            return [statement]
        aliases: dict[str, str] = {}
        expr = unshadow(expr, frozenset(indices), self.fresh, aliases)
        statement = replace(statement, expr=expr)
        self.whole = expr
        product = self._spmm(expr, indices) if self.matmuls else None
        if product is not None:
            self.products.append(product)
            return [ir.Assign(statement.target, tuple(indices), ir.Tensor(product.name, tuple(indices)),
                              span=statement.span)]
        pattern = self._pattern_of(statement, indices)
        self.kept = {}
        self.gathered = {}
        if pattern is not None:
            coords, shape, group = pattern
            z = self.fresh("z")
            mapping: dict[str, Any] = {index: ir.Gather(coord, (z,)) for index, coord in zip(indices, coords)}
            expr = self._hoist_scopes(expr, frozenset(indices), frozenset(indices))
            body = self.expr(substitute(expr, mapping, self.sparse, frozenset(indices)), frozenset({z}),
                             frozenset())
            if z not in indices_in(body):  # the same value on every entry: broadcast it over z
                ones = ir.Sum((ir.Num(1), ir.Product((ir.Num(0), ir.Tensor(coords[0], (z,))))))
                body = ir.Product((body, ones))
            values = self.fresh(f"{statement.target or 'value'}_v")
            if statement.target is not None:
                self.sparse[statement.target] = Pattern(values, coords, shape, group)
            new = ir.Assign(values, (z,), body, span=statement.span)
        else:
            consumed = frozenset(indices_in(expr)) - frozenset(indices)
            terms = expr.terms if isinstance(expr, ir.Sum) else (expr,)
            new_terms = tuple(self.expr(term, frozenset(indices), consumed) for term in terms)
            body = ir.Sum(new_terms, span=expr.span) if isinstance(expr, ir.Sum) else new_terms[0]
            new = ir.Assign(statement.target, tuple(indices), body, span=statement.span)
        left = indices_in(new.expr)
        for index, size in self.gathered.items():  # still read elsewhere in the statement: its size declared
            if index in left:
                self.kept.setdefault(index, size)
        for index, size in [*self.gathered.items(), *self.kept.items()]:  # the same for a scope's index renamed
            if aliases.get(index) in left:
                self.kept.setdefault(aliases[index], size)
        if not self.kept:
            return [new]
        renames = {index: self.fresh(f"{index}_") for index in self.kept}
        declarations: list[ir.Statement] = [ir.SizeDecl((renames[index],), size) for index, size in self.kept.items()]
        renamed = substitute(new.expr, renames, {})
        target_indices = tuple(renames.get(index, index) for index in new.indices or ())
        return [*declarations, replace(new, indices=target_indices, expr=renamed)]

    def _spmm(self, expr: ir.Expr, indices: tuple[str, ...]) -> SpMM | None:
        """The statement as a sparse-dense matrix product of two inputs (``S[i,j] D[j,f]``, ``S[i,j] D[i,f]``)
        with the output indices in order (``[i,f]``, ``[j,f]``), else None."""
        if not isinstance(expr, ir.Product) or len(expr.factors) != 2 or \
                not all(isinstance(f, ir.Tensor) for f in expr.factors):
            return None
        first, second = expr.factors
        assert isinstance(first, ir.Tensor) and isinstance(second, ir.Tensor)
        sparse, dense = (first, second) if first.name in self.inputs else (second, first)
        if sparse.name not in self.inputs or len(sparse.indices) != 2 or dense.name in self.sparse or \
                dense.name not in self.info.inputs or len(set(sparse.indices)) != 2 or \
                len(set(dense.indices)) != len(dense.indices):
            return None
        summed = [index for index in sparse.indices if index in dense.indices]
        if len(summed) != 1:
            return None
        kept = next(index for index in sparse.indices if index != summed[0])
        others = tuple(index for index in dense.indices if index != summed[0])
        if kept in others or tuple(indices) != (kept, *others):
            return None
        name = self.fresh(f"{sparse.name}_{dense.name}")
        return SpMM(name, sparse.name, dense.name, sparse.indices[0] == summed[0], dense.indices.index(summed[0]))

    def _mentions_sparse(self, expr: ir.Expr) -> bool:
        if isinstance(expr, (ir.Tensor, ir.Read)):
            return expr.name in self.sparse
        return any(self._mentions_sparse(child) for child in ir.children(expr))

    def _pattern_of(self, statement: ir.Assign, indices: tuple[str, ...]
                    ) -> tuple[tuple[str, ...], tuple[int, ...], int] | None:
        """The coordinates (in the target's axis order), shape and group of the pattern a statement's value lies
        on: a derivative by a sparse input, or a value that is zero off one sparse factor with its indices."""
        if statement.target in self.sample:
            source = self.sparse[self.sample[statement.target]]  # type: ignore[index]
            if len(indices) != len(source.coords):
                return None
            return source.coords, source.shape, source.group
        found = self._zero_off(statement.expr)
        if found is None or len(set(indices)) != len(indices) or set(found[1]) != set(indices):
            return None
        source = self.sparse[found[0]]
        axes = [found[1].index(index) for index in indices]
        return (tuple(source.coords[axis] for axis in axes), tuple(source.shape[axis] for axis in axes),
                source.group)

    def _zero_off(self, expr: ir.Expr) -> tuple[str, tuple[str, ...]] | None:
        """(sparse tensor, its indices) such that ``expr`` is 0 wherever that tensor has no entry, or None."""
        if isinstance(expr, ir.Tensor):
            if expr.name in self.sparse and len(set(expr.indices)) == len(expr.indices):
                return expr.name, expr.indices
            return None
        if isinstance(expr, ir.Product):
            for factor in expr.factors:
                found = self._zero_off(factor)
                if found is not None:
                    return found
            return None
        if isinstance(expr, ir.Call):
            return self._zero_off(expr.arg) if keeps_zero(expr.func) else None
        if isinstance(expr, ir.Power):
            return self._zero_off(expr.base) if expr.exponent > 0 else None
        if isinstance(expr, ir.Sum):
            terms = [self._zero_off(term) for term in expr.terms]
            first = terms[0]
            if first is None or any(other is None or self.sparse[other[0]].coords != self.sparse[first[0]].coords
                                    or other[1] != first[1] for other in terms):
                return None
            return first
        if isinstance(expr, ir.Reduce) and expr.kind == "sum":
            found = self._zero_off(expr.body)
            return found if found is not None and not set(found[1]) & set(expr.indices) else None
        return None

    # ------------------------------------------------------------ expressions
    def expr(self, expr: ir.Expr, bound: frozenset[str], consumed: frozenset[str]) -> ir.Expr:
        if not self._mentions_sparse(expr):
            return expr
        if isinstance(expr, ir.Tensor):
            return self.product((expr,), bound, consumed, expr.span)
        if isinstance(expr, ir.Product):
            return self.product(expr.factors, bound, consumed, expr.span)
        if isinstance(expr, ir.Read):
            raise SparseError(f"tensor {expr.name!r} is sparse: reading it at shifted or gathered positions "
                              f"({ir.format_expr(expr)}) is not supported; read it with plain indices")
        if isinstance(expr, ir.Reduce):
            inner = self._hoist(expr.body) if isinstance(expr.body, (ir.Call, ir.Power)) else None
            if inner is not None:
                expr = replace(expr, body=inner)
            if expr.kind == "sum" and isinstance(expr.body, (ir.Product, ir.Tensor)):
                scope = bound | frozenset(expr.indices)
                body = self.expr(expr.body, scope, consumed | frozenset(expr.indices))
                # the entries' index of a sparse factor, left free in the body, is summed here too (not by the
                # statement, where a term beside the scope would be broadcast over it)
                entries = tuple(i for i in free_indices(body, scope) if i not in indices_in(expr.body))
                left = tuple(index for index in expr.indices if index in indices_in(body)) + entries
                return replace(expr, indices=left, body=body) if left else body
            return replace(expr, body=self.expr(expr.body, bound | frozenset(expr.indices), frozenset()))
        if isinstance(expr, (ir.Normalize, ir.Linalg)):
            return replace(expr, body=self.expr(expr.body, bound | frozenset(expr.indices), frozenset()))
        if isinstance(expr, ir.Sum):
            return replace(expr, terms=tuple(self.expr(term, bound, frozenset()) for term in expr.terms))
        if isinstance(expr, (ir.Call, ir.Power)):
            hoisted = self._hoist(expr)
            if hoisted is not None:
                return self.expr(hoisted, bound, consumed)
        if isinstance(expr, ir.Call):
            return replace(expr, arg=self.expr(expr.arg, bound, frozenset()))
        if isinstance(expr, ir.Power):
            return replace(expr, base=self.expr(expr.base, bound, frozenset()))
        if isinstance(expr, ir.Binary):
            return replace(expr, left=self.expr(expr.left, bound, frozenset()),
                           right=self.expr(expr.right, bound, frozenset()))
        raise SparseError(f"a sparse tensor inside {ir.format_expr(expr)} is not supported")

    def _hoist(self, expr: ir.Expr) -> ir.Tensor | None:
        """``f(S[i,j])`` with f(0) = 0 (or ``S[i,j]^p``, p > 0) as a statement of its own on ``S``'s pattern (computed
        on the entries only), read back as a sparse tensor; None where ``expr`` is not zero off one pattern."""
        found = self._zero_off(expr)
        if found is None or set(free_indices(expr)) != set(found[1]):
            return None
        name = self.fresh("t")
        kept, gathered = self.kept, self.gathered
        self.pending.extend(self.assign(ir.Assign(name, found[1], expr)))
        self.kept, self.gathered = kept, gathered
        return ir.Tensor(name, found[1])

    def _hoist_scopes(self, expr: ir.Expr, keys: frozenset[str], bound: frozenset[str]) -> ir.Expr:
        """``expr`` with each normaliser or matrix function over an index in ``keys`` (an index about to be read at
        a sparse tensor's coordinates: ``softmax[j](X[i,j])``, ``inv[a,b](M[a,b])``) computed densely as a statement
        of its own, to be gathered from: its indices are taken whole inside it, not entry by entry."""
        if not keys & indices_in(expr):
            return expr
        if isinstance(expr, (ir.Normalize, ir.Linalg)) and not expr.reduces and keys & set(expr.indices):
            indices = free_indices(expr, bound)
            name = self.fresh("t")
            kept, gathered, whole = self.kept, self.gathered, self.whole
            declarations, sized = _sizes_from(self, expr)
            self.pending.extend(declarations)
            self.pending.extend(self.assign(ir.Assign(name, indices, sized)))
            self.kept, self.gathered, self.whole = kept, gathered, whole
            return ir.Tensor(name, indices, span=expr.span)
        if isinstance(expr, (ir.Reduce, ir.Linalg)) and expr.reduces:
            return replace(expr, body=self._hoist_scopes(expr.body, keys - set(expr.indices),
                                                         bound | frozenset(expr.indices)))
        return map_children(expr, lambda child: self._hoist_scopes(child, keys, bound))

    def product(self, factors: tuple[ir.Expr, ...], bound: frozenset[str], consumed: frozenset[str],
                span: Any) -> ir.Expr:
        """A product with a sparse factor as a gather over its coordinates (and a scatter for kept indices)."""
        factors = tuple((self._hoist(f) or f) if isinstance(f, (ir.Call, ir.Power)) else f for f in factors)
        position = next((k for k, factor in enumerate(factors)
                         if isinstance(factor, ir.Tensor) and factor.name in self.sparse), None)
        if position is None:
            plain = tuple(self.expr(factor, bound | around(factors, k, bound), frozenset())
                          for k, factor in enumerate(factors))
            return ir.Product(plain, span=span) if len(plain) > 1 else plain[0]
        factor = factors[position]
        assert isinstance(factor, ir.Tensor)
        pattern = self.sparse[factor.name]
        if len(set(factor.indices)) != len(factor.indices):
            raise SparseError(f"tensor {factor.name!r} is sparse: reading its diagonal ({ir.format_expr(factor)}) "
                              "is not supported")
        z = self.fresh("z")
        mapping: dict[str, Any] = {index: ir.Gather(coord, (z,)) for index, coord in zip(factor.indices,
                                                                                          pattern.coords)}
        others = tuple(self._hoist_scopes(other, frozenset(factor.indices), bound)
                       for other in factors[:position] + factors[position + 1:])
        others = _order(self, others, factor, pattern, bound - consumed)
        elsewhere = frozenset().union(*(indices_in(other) for other in others)) if others else frozenset()
        substituted = tuple(substitute(other, scoped(other, mapping, bound), self.sparse, bound, beside(others, k))
                            for k, other in enumerate(others))
        for other in substituted:  # delta[h, m] with m a coordinate: h scattered, its size the coordinate's axis
            for node in walk(other):
                if isinstance(node, ir.ShiftDelta) and isinstance(node.position, ir.Gather) and \
                        node.position.name in pattern.coords:
                    self.kept.setdefault(node.index, pattern.shape[pattern.coords.index(node.position.name)])
        rest = tuple(self.expr(other, bound | {z} | around(substituted, k, bound), frozenset())
                     for k, other in enumerate(substituted))
        new: list[ir.Expr] = [ir.Tensor(pattern.values, (z,), span=factor.span)]
        for axis, index in enumerate(factor.indices):
            if index in consumed or (index not in bound and index in elsewhere):
                self.gathered.setdefault(index, pattern.shape[axis])
                continue  # summed here: the other factors read it through the gather
            self.kept[index] = pattern.shape[axis]
            new.append(ir.ShiftDelta(index, ir.Gather(pattern.coords[axis], (z,))))
        new.extend(rest)
        if len(new) == 1:  # every index summed: the sum of the entries
            return ir.Reduce((z,), new[0], span=span)
        if any(not isinstance(f, (ir.Num, ir.Tensor, ir.Read, ir.ShiftDelta)) and z in indices_in(f) for f in new):
            # z inside a sum or a function: bound by a scope of its own, so that a term reading two gathers at z
            # does not sum over z inside the term
            return ir.Reduce((z,), ir.Product(tuple(new), span=span), span=span)
        return ir.Product(tuple(new), span=span)


def _sizes_from(rewriter: _Rewriter, expr: ir.Expr) -> tuple[list[ir.Statement], ir.Expr]:
    """For a scope about to become a statement of its own: each index it reads on no tensor's axis (only in a
    delta, ``delta[q,q]``) renamed, and declared from an input that reads it elsewhere in the statement."""
    sized = {i for node in walk(expr) if isinstance(node, (ir.Tensor, ir.Read))
             for i in (node.indices if isinstance(node, ir.Tensor) else node.positions) if isinstance(i, str)}
    declarations: list[ir.Statement] = []
    renames: dict[str, str] = {}
    for index in sorted(indices_in(expr) - sized):
        source = next((node for node in walk(rewriter.whole) if isinstance(node, ir.Tensor) and index in node.indices
                       and (node.name in rewriter.info.inputs or node.name in rewriter.sparse)), None)
        if source is None:
            continue
        axis = source.indices.index(index)
        renames[index] = rewriter.fresh(f"{index}_")
        if source.name in rewriter.sparse:
            declarations.append(ir.SizeDecl((renames[index],), rewriter.sparse[source.name].shape[axis]))
        else:
            names = tuple(renames[index] if k == axis else rewriter.fresh("_axis") for k in range(len(source.indices)))
            declarations.append(ir.SizeDecl(names, source.name))
    return declarations, substitute(expr, renames, {}) if renames else expr


def _order(rewriter: _Rewriter, others: tuple[ir.Expr, ...], factor: ir.Tensor, pattern: Pattern,
           kept: frozenset[str]) -> tuple[ir.Expr, ...]:
    """``others`` (the factors beside a sparse one) with the dense inputs that are cheaper contracted with each
    other first (``B[j,k] C[k,f]`` beside ``S[i,j]`` with many entries per row) computed by a statement of
    their own, read as one factor (``einflow.engine.sparse_order``); ``kept``: the indices the product keeps."""
    nnz = rewriter.nnz.get(pattern.group)
    candidates = [k for k, other in enumerate(others) if isinstance(other, ir.Tensor)
                  and other.name in rewriter.dense and other.name not in rewriter.sparse
                  and len(set(other.indices)) == len(other.indices) == len(rewriter.dense[other.name])]
    if nnz is None or len(candidates) < 2:
        return others
    sizes = dict(zip(factor.indices, pattern.shape))
    tensors = [others[k] for k in candidates]
    for tensor in tensors:
        assert isinstance(tensor, ir.Tensor)
        sizes.update(zip(tensor.indices, rewriter.dense[tensor.name]))
    rest = frozenset().union(*(indices_in(other) for k, other in enumerate(others) if k not in candidates))
    operands = [frozenset(indices_in(tensor)) for tensor in tensors]
    groups = dense_groups(frozenset(factor.indices), operands, kept | rest, sizes, nnz)
    if not groups:
        return others
    # (an index summed inside a group and read elsewhere in the statement, if only in a delta, keeps the group's
    # tensors in the statement: they give it its size)
    mentions = Counter(i for node in walk(rewriter.whole) if isinstance(node, (ir.Tensor, ir.Read, ir.Delta))
                       for i in set(indices_in(node)))
    chosen: list[tuple[tuple[int, ...], tuple[str, ...]]] = []
    for group in groups:
        outside = frozenset(factor.indices) | kept | rest | frozenset().union(
            *(operands[k] for k in range(len(operands)) if k not in group))
        keep = tuple(dict.fromkeys(i for k in group for i in indices_in(tensors[k]) if i in outside))
        inside = frozenset().union(*(operands[k] for k in group)) - frozenset(keep)
        if all(mentions[i] <= sum(i in operands[k] for k in group) for i in inside):
            chosen.append((group, keep))
    taken = {candidates[k] for group, _ in chosen for k in group}
    new = [other for k, other in enumerate(others) if k not in taken]
    for group, keep in chosen:
        name = rewriter.fresh("t")
        rewriter.pending.append(ir.Assign(name, keep, ir.Product(tuple(tensors[k] for k in group))))
        new.append(ir.Tensor(name, keep))
    return tuple(new)


def _gather_key(read: ir.Read, coords: frozenset[str]) -> tuple[Any, ...] | None:
    """(tensor, axis, coordinate, rank) of a read with one gather of a pattern's coordinates, else None."""
    gathers = [(axis, p) for axis, p in enumerate(read.positions) if not isinstance(p, str)]
    if len(gathers) != 1 or not isinstance(gathers[0][1], ir.Gather) or gathers[0][1].name not in coords:
        return None
    plain = [p for p in read.positions if isinstance(p, str)]
    if len(set(plain)) != len(plain) or len(gathers[0][1].indices) != 1 or gathers[0][1].indices[0] in plain:
        return None
    return read.name, gathers[0][0], gathers[0][1].name, len(read.positions), read.mode


def _reads(expr: ir.Expr) -> list[ir.Read]:
    found = [expr] if isinstance(expr, ir.Read) else []
    for child in ir.children(expr):
        found.extend(_reads(child))
    return found


def _shared_gathers(statements: list[ir.Statement], rewriter: _Rewriter) -> list[ir.Statement]:
    """A dense tensor gathered at one pattern's coordinates by several statements (the CP gradient gathers each
    factor once per mode) gathered once, into a statement of its own that the others read."""
    coords = frozenset(name for group in rewriter.group_coords for name in group)
    uses: dict[tuple[Any, ...], int] = {}
    for statement in statements:
        if isinstance(statement, ir.Assign):
            for read in _reads(statement.expr):
                key = _gather_key(read, coords)
                if key is not None:
                    uses[key] = uses.get(key, 0) + 1
    shared = {key: rewriter.fresh(f"{key[0]}_at_{key[2]}") for key, count in uses.items() if count > 1}
    if not shared:
        return statements
    out: list[ir.Statement] = []
    emitted: set[tuple[Any, ...]] = set()

    def replace_reads(expr: ir.Expr) -> ir.Expr:
        if isinstance(expr, ir.Read):
            key = _gather_key(expr, coords)
            if key in shared:
                axis = key[1]
                gather = expr.positions[axis]
                assert isinstance(gather, ir.Gather)
                plain = tuple(p for p in expr.positions if isinstance(p, str))
                return ir.Tensor(shared[key], (gather.indices[0], *plain), span=expr.span)
            return expr
        return map_children(expr, replace_reads)

    for statement in statements:
        if isinstance(statement, ir.Assign):
            for read in _reads(statement.expr):
                key = _gather_key(read, coords)
                if key in shared and key not in emitted:
                    emitted.add(key)
                    name, axis, coord, rank, mode = key
                    z = rewriter.fresh("z")
                    plain = tuple(rewriter.fresh(f"a{k}") for k in range(rank - 1))
                    positions: list[ir.Position] = list(plain)
                    positions.insert(axis, ir.Gather(coord, (z,)))
                    out.append(ir.Assign(shared[key], (z, *plain), ir.Read(name, tuple(positions), mode=mode)))
            statement = replace(statement, expr=replace_reads(statement.expr))
        out.append(statement)
    return out


def rewrite(program: ir.ProgramIR, info: ProgramInfo, groups: Mapping[str, int],
            shapes: Mapping[str, tuple[int, ...]], sample: Mapping[str, str], matmuls: bool = True,
            dense: Mapping[str, tuple[int, ...]] | None = None, nnz: Mapping[int, int] | None = None) -> Rewritten:
    """``program`` over the coordinates and values of its sparse inputs (``groups``: sparse input -> the group of
    inputs with the same coordinates; ``sample``: output -> the sparse input whose pattern it is sampled on;
    ``matmuls``: sparse-dense matrix products of inputs computed before the program by scipy, :class:`SpMM`;
    ``dense``, ``nnz``: the dense inputs' shapes and each group's entries, for the order of contraction)."""
    used = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", ir.format_program(program)))
    keep = frozenset(name for name in info.outputs if name is not None) | frozenset(sample)
    program = Inliner(program, info, keep, used, frozenset(groups)).run(program)
    rewriter = _Rewriter(program, info, groups, shapes, sample, matmuls, dense, nnz)
    statements = rewriter.statements(program)
    statements = _shared_gathers(statements, rewriter)
    outputs: list[tuple[int, tuple[int, ...], tuple[int, ...]] | None] = []
    for name in info.outputs:
        pattern = rewriter.sparse.get(name) if name is not None and name not in rewriter.inputs else None
        if name is None and statements and isinstance(statements[-1], ir.Assign) \
                and statements[-1].target is not None and statements[-1].target not in info.targets:
            last = statements[-1]  # a bare last statement computed on a pattern got a name
            pattern = next((p for p in rewriter.sparse.values() if p.values == last.target), None)
        if pattern is None:
            outputs.append(None)
            continue
        coords = rewriter.group_coords[pattern.group]
        outputs.append((pattern.group, tuple(coords.index(c) for c in pattern.coords), pattern.shape))
    return Rewritten(ir.ProgramIR(tuple(statements)), rewriter.inputs, rewriter.group_coords, tuple(outputs),
                     tuple(rewriter.products))
