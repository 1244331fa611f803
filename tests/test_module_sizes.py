"""Every module of the package is at most 700 lines and every class at most 350 (issue 34: a module that
needs more is two modules, a class that needs more is a feature that belongs elsewhere)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "einflow"
MOST_MODULE_LINES = 700
MOST_CLASS_LINES = 350

MODULES = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py"))


def _classes(tree: ast.Module) -> list[tuple[str, int]]:
    """Each class (nested ones too) with its length in lines, decorators included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            start = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            found.append((node.name, node.end_lineno - start + 1))  # type: ignore[operator]
    return found


@pytest.mark.parametrize("module", MODULES)
def test_module_and_class_sizes(module: str) -> None:
    text = (PACKAGE / module).read_text()
    lines = len(text.splitlines())
    assert lines <= MOST_MODULE_LINES, f"einflow/{module} has {lines} lines (at most {MOST_MODULE_LINES})"
    too_long = [(name, length) for name, length in _classes(ast.parse(text)) if length > MOST_CLASS_LINES]
    assert not too_long, f"einflow/{module}: classes over {MOST_CLASS_LINES} lines: {too_long}"

