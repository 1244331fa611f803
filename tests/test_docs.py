"""The documentation's examples run: doctests in docs/api.md and in every einflow module's docstrings."""

from __future__ import annotations

import builtins
import doctest
import importlib
import pkgutil
import re
import symtable
from pathlib import Path

import pytest

import einflow

DOCS = Path(__file__).resolve().parent.parent / "docs"
MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages(einflow.__path__, "einflow.")
    if not name.endswith(("cupy_backend", "repl"))
)


def test_api_page_examples():
    result = doctest.testfile(str(DOCS / "api.md"), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 20
    assert result.failed == 0


@pytest.mark.parametrize("name", MODULES)
def test_module_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


# ---------------------------------------------------------------- code blocks can be pasted
_PYTHON_BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
PAGES = sorted(DOCS.glob("*.md")) + [DOCS.parent / "README.md"]


def _names_used_and_bound(code: str, where: str) -> tuple[set[str], set[str]]:
    """The global names a block of Python reads (at its top level or inside its functions and classes) and the
    names it binds at its top level."""
    table = symtable.symtable(code, where, "exec")
    bound = {symbol.get_name() for symbol in table.get_symbols()
             if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()}
    used: set[str] = set()
    tables = [table]
    while tables:
        current = tables.pop()
        tables.extend(current.get_children())
        for symbol in current.get_symbols():
            top = current is table and symbol.is_referenced() and not symbol.is_assigned()
            if top or (current is not table and symbol.is_global()):
                used.add(symbol.get_name())
    return used, bound


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_python_block_of_the_docs_can_be_pasted(page: Path) -> None:
    """A ```python block (not a ``>>>`` session, which doctest runs) reads only names that it or an earlier block
    of its page defines, so that pasting the page's blocks in order runs; a block that shows a piece of a larger
    program says so on its fence: ```python fragment."""
    text = page.read_text()
    defined = set(dir(builtins))
    for match in _PYTHON_BLOCK.finditer(text):
        info, code = match.group(1).strip(), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        if ">>>" in code or info == "fragment":
            continue
        assert not info, f"{page.name}:{line}: a python block's fence says 'python' or 'python fragment', not {info!r}"
        used, bound = _names_used_and_bound(code, f"{page.name}:{line}")
        defined |= bound
        missing = sorted(used - defined)
        assert not missing, (f"{page.name}:{line}: the block reads {', '.join(missing)}, which no block of the page "
                             "defines before it; define them, or mark the block ```python fragment")
