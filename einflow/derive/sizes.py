"""Index sizes during a derivation: which indices have equal sizes, and where a size can be read.

Sizes are a property of index *names within a statement* (LANGUAGE.md §3): every occurrence of
``m`` in one statement has one size, even when a nested scope binds ``m`` on its own. The normal
form renames every binding apart (``m_1``, ``m_2``), and rules copy sub-expressions under new
names (``m_r7``). This registry keeps those names tied to each other and to their sources:

* nodes are index names, ``("user", statement, name)`` for a name of the user's program,
  ``("axis", tensor, k)`` for a tensor's axis, and ``("size", n)`` for a literal size;
* a union-find joins nodes of equal size: an index with the tensor axes it appears on, delta
  partners, a renamed index with the index it was made from, a declared name with its source.

Two uses keep derivative programs correct: sub-expressions may be merged (like terms, common
factors, shared helpers) only when their indices have equal sizes (``key``), and an index that no
tensor of a printed statement sizes gets a ``size`` declaration from a source (``source``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable, Iterator
from contextvars import ContextVar

from einflow.lang import ir
from einflow.lang.indices import free_indices, size_links

__all__ = ["IndexSizes", "active", "activated"]


class IndexSizes:
    """A union-find over indices and size sources (see the module docstring)."""

    def __init__(self) -> None:
        self._parent: dict[Hashable, Hashable] = {}
        self._label: dict[Hashable, str] = {}  # root -> canonical text of its class
        self._sources: dict[Hashable, set[Hashable]] = {}  # root -> axis/size nodes in its class
        #: caches of the simplifier that depend on these classes (cleared when classes merge)
        self.cache: dict[Hashable, object] = {}

    def _add(self, node: Hashable) -> None:
        if node not in self._parent:
            self._parent[node] = node
            self._label[node] = _text(node)
            is_source = isinstance(node, tuple) and node[0] in ("axis", "size")
            self._sources[node] = {node} if is_source else set()

    def find(self, node: Hashable) -> Hashable:
        self._add(node)
        root = node
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[node] != root:  # path compression
            self._parent[node], node = root, self._parent[node]
        return root

    def union(self, first: Hashable, second: Hashable) -> None:
        """Record that ``first`` and ``second`` have equal sizes."""
        new = first not in self._parent
        a, b = self.find(first), self.find(second)
        if a == b:
            return
        if self._label[b] < self._label[a]:
            a, b = b, a
        self._parent[b] = a
        self._sources[a] |= self._sources.pop(b)
        self._label.pop(b)
        if not (new and b == first):
            self.cache.clear()  # keys of known indices may have changed (a new index joining changes none)

    def alias(self, new: str, old: Hashable) -> None:
        """``new`` is a renamed copy of ``old`` (same size)."""
        self.union(new, old)

    def known(self, index: str) -> bool:
        return index in self._parent

    def key(self, index: str) -> str:
        """Equal keys mean equal sizes; an index the registry does not know is its own class."""
        if index not in self._parent:
            return "?" + index
        return self._label[self.find(index)]

    def sources(self, index: str) -> list[tuple[str, int] | int]:
        """Where ``index``'s size can be read: ``(tensor, axis)`` pairs and literal sizes."""
        if index not in self._parent:
            return []
        found: list[tuple[str, int] | int] = []
        for node in sorted(self._sources[self.find(index)], key=_text):
            assert isinstance(node, tuple)
            found.append(node[1] if node[0] == "size" else (node[1], node[2]))
        return found

    def tensors(self) -> set[str]:
        """Names of the tensors whose axes give some index its size."""
        return {node[1] for nodes in self._sources.values() for node in nodes  # type: ignore[index]
                if isinstance(node, tuple) and node[0] == "axis"}

    # ------------------------------------------------------------------ building
    def add_program(self, statements: Iterable[ir.Statement], targets: dict[int, str]) -> None:
        """Tie the user's index names, statement by statement, to tensor axes, partners and declarations.

        ``targets`` names statements whose target is implicit (a bare last expression).
        """
        declared: dict[str, Hashable] = {}
        for position, statement in enumerate(statements):
            if isinstance(statement, ir.SizeDecl):
                for axis, name in enumerate(statement.names):
                    source = statement.source
                    declared[name] = ("size", source) if isinstance(source, int) else ("axis", source, axis)
                continue
            if not isinstance(statement, ir.Assign):
                continue

            def user(name: str, position: int = position) -> tuple[str, int, str]:
                return ("user", position, name)

            names: set[str] = {i for node in ir.walk(statement.expr) if isinstance(node, (ir.Reduce, ir.Linalg))
                               for i in node.indices}
            tensors, partners = size_links(statement.expr)  # the same rules as the checker's (einflow.lang.indices)
            for tensor in tensors:
                for axis, index in enumerate(tensor.indices):
                    self.union(user(index), ("axis", tensor.name, axis))
                    names.add(index)
            for first, second, _ in partners:  # a delta's partners: one class (join_partners, symbolically)
                self.union(user(first), user(second))
                names.update((first, second))
            target = statement.target if statement.target is not None else targets.get(position)
            if statement.indices is not None:
                target_indices: tuple[str, ...] = statement.indices
            else:
                target_indices = free_indices(statement.expr)
            if target is not None:
                for axis, index in enumerate(target_indices):
                    self.union(user(index), ("axis", target, axis))
            for name in names | set(target_indices):
                self.find(user(name))
                if name in declared:
                    self.union(user(name), declared[name])


def _text(node: Hashable) -> str:
    """A deterministic label; sources sort before index names so a class is named by a source."""
    if isinstance(node, tuple):
        order = {"size": "0", "axis": "1", "user": "2"}[node[0]]
        return order + ":" + ":".join(str(part) for part in node[1:])
    return "3:" + str(node)


_ACTIVE: ContextVar[IndexSizes | None] = ContextVar("einflow_index_sizes", default=None)


def active() -> IndexSizes | None:
    """The registry of the derivation in progress (None outside a derivation)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def activated(sizes: IndexSizes) -> Iterator[IndexSizes]:
    """Make ``sizes`` the registry that renaming and simplification consult while deriving."""
    token = _ACTIVE.set(sizes)
    try:
        yield sizes
    finally:
        _ACTIVE.reset(token)
