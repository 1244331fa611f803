"""A program in normal form, ready for the derivative sweeps, and the assembly of the finished derivative program."""

from __future__ import annotations

from einflow.derive.conjugate import holomorphic_obstacle
from einflow.derive.cse import coefficients_out, hoist_repeated, hoist_shared_products, reuse_forward
from einflow.derive.normal import (
    Fresh,
    all_index_names,
    lift_deep_calls,
    readable,
    stem_of,
    tensor_names,
    to_normal,
)
from einflow.derive.outer import factor_outer
from einflow.derive.sizes import active
from einflow.derive.sweep import Work, name_factors
from einflow.lang import ir
from einflow.lang.check import Checked, checked
from einflow.lang.errors import DerivativeError, EinflowError
from einflow.lang.indices import indices_in
from einflow.lang.stable import stabilize_program

__all__ = ["Setup", "mark_missing_targets"]


class Setup:
    """A program in normal form, ready for sweeps."""

    def __init__(self, program: Checked, what: str) -> None:
        if program.info.returns_tuple:
            raise DerivativeError(f"{what}: the program returns a tuple; differentiate one value at a time")
        self.program = program
        # symmetric/spd declarations (LANGUAGE.md 8.1) are statements the sweeps do not see: kept aside, put back
        # into the derived program; a declared input is read through its symmetric part (below)
        self.matrix_decls = [s for s in program.ir.statements if isinstance(s, ir.MatrixDecl)]
        source_ir = ir.ProgramIR(tuple(s for s in program.ir.statements if not isinstance(s, ir.MatrixDecl)))
        # new tensors (helpers, derivatives) avoid the user's index names too, so no name means two things
        self.user_indices = all_index_names(program.ir)
        self.tensor_names = Fresh(set(program.info.inputs) | set(program.info.targets) | self.user_indices)
        last = len(program.ir.statements) - 1
        statement = program.ir.statements[last]
        assert isinstance(statement, ir.Assign)
        self.value = statement.target or self.tensor_names.pick(["f", "L", "y"], "f")
        self.bare_position = last if statement.target is None else None
        # the value's statement by its position among the statements the sweeps see (declarations left out):
        # the sizes' ("user", position, index) nodes are the ones einflow.derive.normal names
        source_names = {len(source_ir.statements) - 1: self.value}
        sizes = active()
        assert sizes is not None, "derivations run under @_deriving"
        self.sizes = sizes
        self.sizes.add_program(source_ir.statements, source_names)
        # fresh indices avoid tensor names too, so a printed program never reads `v[v]`
        fresh = Fresh(all_index_names(program.ir) | set(program.info.inputs) | set(program.info.targets) | {self.value},
                      self.sizes)
        ranks = dict(program.info.ranks)
        # stable forms of written-out log-sum-exp, softplus, log-sigmoid are what gets differentiated
        links: set[str] = set()
        normal = lift_deep_calls(to_normal(stabilize_program(source_ir), fresh, source_names), fresh,
                                 self.tensor_names, ranks, lifted_names=links)
        ranks[self.value] = len(normal[-1].indices or ())
        self.work = Work(normal, program.info.inputs, ranks, fresh, self.tensor_names, forward_count=len(normal),
                         symmetric=frozenset(n for s in self.matrix_decls for n in s.names if n in program.info.inputs),
                         links=frozenset(links))
        name_factors(self.work)
        #: the function that makes the program non-holomorphic (conj, real, imag, abs, abs2, angle), or None
        self.obstacle = holomorphic_obstacle([s.expr for s in normal])
        self._normal = tuple(normal)  # the statements as normal form gave them (a split product is another)
        self.user_sizes = [s for s in program.ir.statements if isinstance(s, ir.SizeDecl)]
        self.declared = {n for s in self.user_sizes for n in s.names}

    @property
    def forward_count(self) -> int:
        """How many of the work's statements compute the program's own values (split products included)."""
        return self.work.forward_count

    @property
    def value_rank(self) -> int:
        return self.work.ranks[self.value]

    def assemble(self, outputs: list[str], returns_tuple: bool) -> Checked:
        """The finished program: needed forward statements, shared helpers, derivative statements."""
        work = self.work
        forward = work.statements[: self.forward_count]
        derived = reuse_forward(forward, work.statements[self.forward_count:])
        # repeated sub-expressions (across the forward statements too) get one statement each; the forward
        # statements are compared with coefficients outside sums, as the simplifier writes derivatives
        read = set(outputs).union(*(tensor_names(s.expr) for s in derived))
        for statement in reversed(forward):
            if statement.target in read:
                read |= tensor_names(statement.expr)
        outside = [coefficients_out(s) if s.target in read else s for s in forward]
        combined = hoist_repeated(outside + derived, work.fresh, work.tensor_fresh, work.ranks)
        untouched = {moved: s for moved, s in zip(outside, forward) if moved is not s}
        combined = [untouched.get(s, s) for s in combined]
        targets = {s.target for s in combined}
        size_position = {name: k for k, size in enumerate(work.sizes) for name in size.names}
        needed = set(outputs)
        kept: list[ir.Assign] = []
        for statement in reversed(combined):
            if statement.target in needed:
                kept.append(statement)
                needed |= tensor_names(statement.expr)
                for index in _unsized(statement, set(work.size_of)):
                    source = self._size_source(index, targets)
                    if isinstance(source, tuple):
                        needed.add(source[0])  # a size read from a tensor the program must then compute
                # a size declaration a statement relies on reads its tensor too
                mentioned = set(statement.indices or ()) | _indices(statement.expr)
                needed |= {work.sizes[size_position[i]].source for i in mentioned if i in size_position}  # type: ignore[misc]
                stems = {stem_of(index) for index in mentioned}
                needed |= {size.source for size in self.user_sizes  # type: ignore[misc]
                           if set(size.names) & stems and isinstance(size.source, str)}
        kept.reverse()
        original = {s.target if s.target is not None else self.value: s
                    for s in self.program.ir.statements if isinstance(s, ir.Assign)}
        # a factor that only multiplies a derivative statement (the input behind a weight) is multiplied in
        # by its readers, so intermediates keep the indices the result needs and no more
        # (the user's statements, the forward's and any statement an index reads its size from keep their axes)
        fixed = set(original) | {s.target for s in forward} | self.sizes.tensors() | {
            s.source for s in work.sizes if isinstance(s.source, str)}
        kept = factor_outer(kept, set(outputs), fixed, work.tensor_fresh, work.ranks)
        # groups of factors that several of the kept products share (an adjoint through a function, read by
        # the gradients of every input behind it) are computed once
        kept = hoist_shared_products(kept, work.fresh, work.tensor_fresh, work.ranks)
        unchanged = {s.target for s in forward if s in self._normal and s in kept and s.target in original}
        declared = set(self.declared) | set(work.size_of)
        pending_sizes = [s for s in self.program.ir.statements if isinstance(s, ir.SizeDecl)]
        positions = {s.target if s.target is not None else self.value: k
                     for k, s in enumerate(self.program.ir.statements) if isinstance(s, ir.Assign)}
        body: list[ir.Statement] = []
        emitted_sizes: set[str] = set()
        mentioned_stems = {stem_of(i) for s in kept for i in set(s.indices or ()) | _indices(s.expr)}
        for statement in kept:
            target = statement.target
            if target not in original and pending_sizes:
                # the user's declarations that derivative statements rely on come before them
                body.extend(size for size in pending_sizes if set(size.names) & mentioned_stems)
                pending_sizes = []
            if target in original:
                # the user's own size declarations stay before the statements that follow them
                here = positions[target]
                for size in list(pending_sizes):
                    if self.program.ir.statements.index(size) < here:
                        body.append(size)
                        pending_sizes.remove(size)
            if target in unchanged:
                source = original[target]
                body.append(ir.Assign(target, source.indices, source.expr))
                continue
            statement = mark_missing_targets(statement)
            pretty, mapping = readable(statement, declared, frozenset(self.declared),
                                      work.tensor_fresh.taken - self.user_indices)
            mentioned = set(pretty.indices or ()) | _indices(pretty.expr)
            for position in sorted({size_position[i] for i in mentioned if i in size_position}):
                size = work.sizes[position]
                if size.names[0] not in emitted_sizes:
                    body.append(size)
                    emitted_sizes.update(size.names)
            body.extend(self._size_unsized(pretty, mapping, declared, targets))
            body.append(pretty)
        read = {s.target for s in body if isinstance(s, ir.Assign)}.union(
            *(tensor_names(s.expr) for s in body if isinstance(s, ir.Assign)))
        for decl in self.matrix_decls:  # before the last statement: a program cannot end with a declaration
            names = tuple(name for name in decl.names if name in read)
            if names:
                body.insert(len(body) - 1, ir.MatrixDecl(decl.kind, names))
        if returns_tuple:
            body.append(ir.Return(tuple(outputs)))
        program_ir = ir.ProgramIR(tuple(body))
        text = ir.format_program(program_ir)
        try:
            return checked(program_ir, text)
        except EinflowError as error:  # pragma: no cover - a bug in einflow, not the user's
            raise EinflowError(f"internal error: derivative program does not check:\n{text}\n{error}") from error

    def _size_source(self, index: str, targets: set[str | None]) -> tuple[str, int] | int | None:
        """Where a printed program reads ``index``'s size: an input's axis, else a literal, else a target's axis."""
        sources = self.sizes.sources(index)
        ranked = sorted(sources, key=lambda s: 0 if isinstance(s, tuple) and s[0] not in targets else
                        1 if isinstance(s, int) else 2)
        for source in ranked:
            if isinstance(source, int) or source[0] in self.work.ranks or source[0] in targets:
                return source
        return None

    def _size_unsized(self, statement: ir.Assign, mapping: dict[str, str], declared: set[str],
                      targets: set[str | None]) -> list[ir.SizeDecl]:
        """Size declarations for indices no tensor in ``statement`` gives a size to (traced to a source)."""
        inverse = {new: old for old, new in mapping.items()}
        decls = []
        for index in _unsized(statement, declared):
            source = self._size_source(inverse.get(index, index), targets)
            if source is None:
                continue  # a delta partner may still size it; the checker reports it otherwise
            if isinstance(source, int):
                declared.add(index)
                decls.append(ir.SizeDecl((index,), source))
                continue
            tensor, axis = source
            names = [self.work.fresh.index("z") for _ in range(self.work.ranks[tensor])]
            names[axis] = index
            declared.update(names)
            decls.append(ir.SizeDecl(tuple(names), tensor))
        return decls


def _unsized(statement: ir.Assign, declared: set[str]) -> list[str]:
    """The indices of ``statement`` that no tensor in it gives a size to (and no declaration in force)."""
    sized = declared | _tensor_axis_indices(statement.expr)
    return sorted(index for index in set(statement.indices or ()) | _indices(statement.expr) if index not in sized)


def _tensor_axis_indices(expr: ir.Expr) -> set[str]:
    """Indices that some tensor in ``expr`` gives a size to."""
    return {index for node in ir.walk(expr) if isinstance(node, ir.Tensor) for index in node.indices}


def mark_missing_targets(statement: ir.Assign) -> ir.Assign:
    """A target index the right side lost (a constant derivative) is kept by a delta[p,p] (= 1) factor."""
    present = _indices(statement.expr)
    missing = [i for i in statement.indices or () if i not in present]
    if not missing:
        return statement
    markers = [ir.Delta(i, i) for i in missing]
    expr = statement.expr
    factors = markers if isinstance(expr, ir.Num) and expr.value == 1 else [expr, *markers]
    return ir.Assign(statement.target, statement.indices, ir.product(*factors))


def _indices(expr: ir.Expr) -> set[str]:
    return set(indices_in(expr))
