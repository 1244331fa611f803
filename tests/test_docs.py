"""The documentation's examples run: doctests in docs/api.md and in every einflow module's docstrings."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
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
