"""The package's folders are the pipeline's layers, and a module imports only its own layer or lower ones.

lang (text -> checked IR) is the floor; derive (IR -> IR) and engine (IR -> steps -> plan -> arrays) stand on
it side by side and never import each other; the faces (the modules at the package root: Program, einsum,
report, export, frameworks) stand on those; the shell (REPL, CLI, notebook) on everything. Every import
counts, those inside functions too; imports under ``if TYPE_CHECKING:`` (annotations only) do not, and nor
does the implicit import of a parent package that Python performs. No two modules import each other,
directly or through others.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "einflow"

# which layers a module of each layer may import (its own included)
MAY_IMPORT = {
    "lang": {"lang"},
    "derive": {"lang", "derive"},
    "engine": {"lang", "engine"},
    "faces": {"lang", "derive", "engine", "faces"},
    "shell": {"lang", "derive", "engine", "faces", "shell"},
}

# (importer, imported) pairs allowed across the rule; this list may only shrink
ALLOWED = {
    # `%load_ext einflow` looks for load_ipython_extension at the package root; it hands over to the shell
    ("einflow", "einflow.shell.notebook"),
}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def layer(module: str) -> str:
    parts = module.split(".")
    if module == "einflow.__main__":
        return "shell"  # `python -m einflow` starts the command line
    if len(parts) > 1 and parts[1] in ("lang", "derive", "engine", "shell"):
        return parts[1]
    return "faces"


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of import nodes under ``if TYPE_CHECKING:``."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(inner) for inner in ast.walk(node)}
    return skipped


def _imports(module: str) -> set[str]:
    """The einflow modules ``module`` imports (at its top or inside functions)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    found.add(f"{source}.{alias.name}")
                elif source in MODULES:
                    found.add(source)
    found.discard(module)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def test_the_folders_are_the_layers() -> None:
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert {"lang", "derive", "engine", "shell"} <= folders
    assert all(layer(m) in MAY_IMPORT for m in MODULES)
    assert "einflow.lang.grammar.parser" in MODULES and "einflow.engine.plan" in MODULES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_own_layer_or_lower(module: str) -> None:
    wrong = sorted(imported for imported in GRAPH[module]
                   if layer(imported) not in MAY_IMPORT[layer(module)] and (module, imported) not in ALLOWED)
    assert not wrong, f"{module} ({layer(module)}) imports {', '.join(wrong)} from a layer above or beside it"


def test_the_allow_list_has_no_stale_entries() -> None:
    for importer, imported in ALLOWED:
        assert imported in GRAPH[importer], f"({importer}, {imported}) is allowed but no longer imported: remove it"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def test_no_import_cycle() -> None:
    graph = {m: {i for i in imported if (m, i) not in ALLOWED} for m, imported in GRAPH.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
