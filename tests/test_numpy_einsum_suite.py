"""numpy's own einsum tests (the installed ``numpy/_core/tests/test_einsum.py``), run against einflow.

The file is loaded from the installed numpy under another module name, and its ``np`` is replaced by a
namespace that is numpy except for ``einsum`` and ``einsum_path``, which are einflow's. Nothing is
vendored: whatever numpy version is installed brings its own tests. Tests deselected here, and why, are
listed in ``DESELECTED`` (and in docs/api.md).
"""

from __future__ import annotations

import importlib.util
import pathlib
import types

import numpy as np
import pytest

import einflow as ef


def _numpy_test_file() -> pathlib.Path | None:
    root = pathlib.Path(np.__file__).parent
    for folder in ("_core", "core"):  # numpy 2 / numpy 1
        candidate = root / folder / "tests" / "test_einsum.py"
        if candidate.is_file():
            return candidate
    return None


class _EinflowNumpy(types.ModuleType):
    """numpy, with einflow's einsum and einsum_path."""

    def __init__(self) -> None:
        super().__init__("numpy")
        self.einsum = ef.einsum
        self.einsum_path = ef.einsum_path

    def __getattr__(self, name: str) -> object:
        return getattr(np, name)


_PATH = _numpy_test_file()
if _PATH is None:  # pragma: no cover - a numpy wheel without its tests
    pytest.skip("this numpy installation ships no tests/test_einsum.py", allow_module_level=True)
_spec = importlib.util.spec_from_file_location("einflow_numpy_test_einsum", _PATH)
assert _spec is not None and _spec.loader is not None
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
_suite.np = _EinflowNumpy()

#: (class, test) -> why it is not run against einflow
DESELECTED: dict[tuple[str, str], str] = {}

for _name, _value in vars(_suite).items():
    if _name.startswith("test_"):
        globals()[_name] = _value
    elif _name.startswith("Test") and isinstance(_value, type):
        dropped = {test: None for (owner, test) in DESELECTED if owner == _name}
        globals()[_name] = type(_name, (_value,), dropped) if dropped else _value


def test_the_suite_calls_einflow() -> None:
    assert _suite.np.einsum is ef.einsum and _suite.np.einsum_path is ef.einsum_path
    assert _suite.np.ones is np.ones


def test_every_deselected_test_is_documented() -> None:
    """Each deselection is explained in docs/api.md (older numpy releases may not have the test at all)."""
    api = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    for owner, test in DESELECTED:
        assert f"`{owner}::{test}`" in api
        collected = globals()[owner]
        assert getattr(collected, test, None) is None  # not collected here


def test_einsum_0d_out_of_another_type_after_numpy_s_optimized_path() -> None:
    # numpy's optimized path copies its last tensordot step into out= (out[...] = ...) whatever casting=
    # says; optimize=False (and einflow's own path algorithms, which numpy does not have) apply casting=
    a = np.ones(7)
    with pytest.raises(TypeError):
        np.einsum("i,i->", a, a, out=np.array(0), optimize=False)
    for optimize in (False, "auto", "dp"):
        with pytest.raises(ef.ArgumentError, match="casting"):
            ef.einsum("i,i->", a, a, out=np.array(0), optimize=optimize)
    for optimize in (True, "greedy", "optimal", ("greedy", 10**6), ["einsum_path", (0, 1)]):
        out = np.array(0)
        want = np.einsum("i,i->", a, a, out=np.array(0), optimize=optimize)
        assert ef.einsum("i,i->", a, a, out=out, optimize=optimize) is out
        assert out == want == 7
    with pytest.raises(TypeError):  # the last step is not a tensordot: numpy applies casting= there too
        np.einsum("i,i->i", a, a, out=np.zeros(7, int), optimize=True)
    with pytest.raises(ef.ArgumentError, match="casting"):
        ef.einsum("i,i->i", a, a, out=np.zeros(7, int), optimize=True)
    out = np.array(0)
    assert ef.einsum("i,i->", a, a, out=out, casting="unsafe", optimize="auto") is out
    assert out == 7
