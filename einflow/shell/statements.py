"""A session's kept statements as a program: what each reads, an order that runs, and the program's text."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from einflow.lang import ir
from einflow.lang.indices import indices_in
from einflow.shell.replies import SessionError

__all__ = ["Definition", "indices_of", "reads_of", "decls_for", "path_to", "topological", "program_text",
           "needed_for", "affected_by", "declarations_for"]


@dataclass(frozen=True)
class Definition:
    """A kept statement: the assignment, the text it was typed in, the names and indices it uses."""

    statement: ir.Assign
    source: str
    reads: frozenset[str]
    indices: frozenset[str]

    @property
    def text(self) -> str:
        return ir.format_statement(self.statement)


def decls_for(sizes: Mapping[str, ir.SizeDecl], indices: Iterable[str]) -> list[ir.SizeDecl]:
    """The size declarations in force (``sizes``: index -> its declaration) for ``indices``, each once."""
    decls: list[ir.SizeDecl] = []
    for index in sorted(indices):
        decl = sizes.get(index)
        if decl is not None and decl not in decls:
            decls.append(decl)
    return decls


def indices_of(statement: ir.Assign) -> frozenset[str]:
    return frozenset(indices_in(statement.expr)) | frozenset(statement.indices or ())


def reads_of(statement: ir.Assign, sizes: Mapping[str, ir.SizeDecl]) -> frozenset[str]:
    """The tensors ``statement`` reads, and those its indices' size declarations read."""
    sources = {decl.source for decl in decls_for(sizes, indices_of(statement)) if isinstance(decl.source, str)}
    return frozenset(ir.tensors_read(statement.expr)) | sources


def path_to(definitions: Mapping[str, Definition], name: str, reads: Iterable[str]) -> list[str]:
    """A chain of kept statements leading from ``reads`` back to ``name`` (empty when there is none)."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[str, str | None]] = [(read, None) for read in reads]
    while stack:
        current, parent = stack.pop()
        if current in parents:
            continue
        parents[current] = parent
        if current == name:
            chain = []
            node: str | None = parent
            while node is not None:
                chain.append(node)
                node = parents[node]
            return [*reversed(chain), name]
        definition = definitions.get(current)
        if definition is not None:
            stack.extend((read, current) for read in definition.reads)
    return []


def topological(definitions: Mapping[str, Definition], names: set[str]) -> list[str]:
    """``names`` (kept statements) in an order that runs: each after the statements of ``names`` it reads."""
    order: list[str] = []
    seen: set[str] = set()
    for root in definitions:
        if root not in names or root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(sorted(definitions[root].reads)))]  # no recursion: chains may be long
        while stack:
            name, pending = stack[-1]
            read = next((read for read in pending if read in names and read not in seen), None)
            if read is None:
                stack.pop()
                order.append(name)
            else:
                seen.add(read)
                stack.append((read, iter(sorted(definitions[read].reads))))
    return order


def program_text(definitions: Mapping[str, Definition], sizes: Mapping[str, ir.SizeDecl], names: set[str],
                 matrices: Mapping[str, str] | None = None, pads: Mapping[str, str] | None = None) -> str:
    """The statements of ``names`` in an order that runs, each after the size declarations it uses, after the
    ``symmetric``/``spd``/``hermitian`` (``matrices``) and ``pad`` (``pads``) declarations of tensors they read."""
    lines: list[str] = []
    emitted: list[ir.SizeDecl] = []
    order = topological(definitions, names)
    statements = [definitions[name].statement for name in order]
    for decl in declarations_for(statements, {}, matrices or {}, pads or {}):
        lines.append(ir.format_statement(decl))
    for name in order:
        definition = definitions[name]
        for decl in decls_for(sizes, definition.indices):
            if decl not in emitted:
                emitted.append(decl)
                lines.append(ir.format_statement(decl))
        lines.append(definition.text)
    return "\n".join(lines)


def needed_for(definitions: Mapping[str, Definition], stale: Mapping[str, str], target: str, cut: set[str]) -> set[str]:
    """The kept statements that compute ``target`` from data (names in ``cut`` taken as inputs); a stale one on
    the way is refused (SessionError)."""
    needed: set[str] = set()
    stack = [target]
    while stack:
        name = stack.pop()
        if name in needed or name in cut or name not in definitions:
            continue
        if name in stale:
            raise SessionError(f"'{name}' is stale ({stale[name]}); redefine it first")
        needed.add(name)
        stack.extend(definitions[name].reads)
    return needed


def affected_by(definitions: Mapping[str, Definition], names: Iterable[str], indices: set[str],
                current: set[str]) -> set[str]:
    """The kept statements that read ``names`` (or use ``indices``), directly or through others; a statement in
    ``current`` (just evaluated in an order that runs) only when it reads one that is not."""
    readers: dict[str, list[str]] = {}
    for other, definition in definitions.items():
        for read in definition.reads:
            readers.setdefault(read, []).append(other)
    affected = {other for other, definition in definitions.items()
                if other not in current and definition.indices & indices} if indices else set()
    frontier = [*names, *affected]
    while frontier:
        name = frontier.pop()
        for reader in readers.get(name, ()):
            if reader not in affected and not (reader in current and name in current):
                affected.add(reader)
                frontier.append(reader)
    return affected


def declarations_for(statements: Sequence[ir.Statement], sizes: Mapping[str, ir.SizeDecl],
                     matrices: Mapping[str, str], pads: Mapping[str, str]) -> tuple[ir.Statement, ...]:
    """The session's declarations that ``statements`` rely on: the sizes of the indices they use (unless they
    declare them), the ``symmetric``/``spd`` matrices and the padded tensors (LANGUAGE 9.4) they mention."""
    own = {name for statement in statements if isinstance(statement, ir.SizeDecl) for name in statement.names}
    used: set[str] = set()
    for statement in statements:
        if isinstance(statement, ir.Assign):
            used |= indices_of(statement)
    decls: tuple[ir.Statement, ...] = tuple(replace(decl, span=None) for decl in decls_for(sizes, used - own))
    names: set[str] = set()
    for statement in statements:
        if isinstance(statement, ir.Assign):
            names |= set(ir.tensors_read(statement.expr))
            names.add(statement.target or "")
    kinds = sorted({kind for name, kind in matrices.items() if name in names})
    decls += tuple(ir.MatrixDecl(kind, tuple(sorted(n for n, k in matrices.items()
                                                     if k == kind and n in names))) for kind in kinds)
    padded = {node.name for statement in statements if isinstance(statement, ir.Assign)
              for node in ir.walk(statement.expr) if isinstance(node, ir.Read)} & pads.keys()
    decls += tuple(ir.PadDecl(mode, tuple(sorted(n for n in padded if pads[n] == mode)))
                   for mode in sorted({pads[n] for n in padded}))
    return decls
