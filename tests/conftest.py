"""Shared test fixtures: a seeded generator of random einflow expression text."""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest

__all__ = ["RANDOM_TENSORS", "random_expression", "SLOW_FILES"]

#: The test files that take longest (random-program and property runs, numpy's own einsum suite, examples
#: and sessions run in subprocesses). Each of their tests is marked ``slow`` and runs after every other
#: file, so a failure elsewhere shows first; ``make test`` runs them with fewer random programs
#: (``EINFLOW_DIFF_N``, ``EINFLOW_TORCH_RANDOM_N``), ``make test-quick`` leaves them out (``-m "not slow"``)
#: and ``make test-full`` runs everything at full size. Every backend keeps fast tests outside this list.
SLOW_FILES = frozenset({
    "test_differential.py", "test_torch_steps.py", "test_numpy_einsum_suite.py", "test_einsum_parity.py",
    "test_derivative_properties.py", "test_fuzz.py", "test_examples.py", "test_researcher.py",
    "test_shifted_families.py",
})


#: CPU seconds of the longest files under ``make test``'s sizes (measured one file at a time, user + sys, with
#: the imports and their subprocesses; 2026-12-07; test_peer_suites before its last trim). ``make test`` runs
#: the files on two pytest-xdist workers, whole files in the order given here: longest first, so that no long
#: file starts last while the other worker has nothing left (a file not listed counts as short and keeps its
#: place). Only the order depends on these numbers.
FILE_SECONDS = {
    "test_differential.py": 126,
    "test_taylor_collapsed.py": 90,
    "test_cross_backend.py": 121,
    "test_jax.py": 87,
    "test_dask.py": 84,
    "test_shifted_families.py": 54,
    "test_operators_memory.py": 40,
    "test_peer_linalg.py": 54,
    "test_shifted_regressions.py": 54,
    "test_index_arithmetic.py": 46,
    "test_raw_errors.py": 44,
    "test_repl.py": 40,
    "test_torch.py": 36,
    "test_researcher.py": 35,
    "test_padding_modes.py": 39,
    "test_torch_func.py": 31,
    "test_examples.py": 29,
    "test_complex.py": 24,
    "test_scale.py": 23,
    "test_shared_adjoints.py": 22,
    "test_complex_random.py": 21,
    "test_workbench.py": 21,
    "test_peer_suites.py": 20,
    "test_torch_steps.py": 17,
    "test_cli.py": 16,
    "test_blocks.py": 16,
    "test_docs.py": 15,
    "test_fuzz.py": 15,
    "test_backends.py": 15,
    "test_speed_features.py": 14,
    "test_derivative_properties.py": 14,
    "test_slicing.py": 12,
    "test_numpy_einsum_suite.py": 12,
    "test_hardening.py": 11,
    "test_session_hardening.py": 11,
    "test_complex_aliasing.py": 9,
    "test_semantics.py": 8,
    "test_dask_einsum_chunks.py": 7,
    "test_export.py": 6,
    "test_einsum_parity.py": 5,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SLOW_FILES` ``slow``; in one process move those files last, so that a failure
    elsewhere shows first; on pytest-xdist's workers (``make test``) order the files longest first
    (:data:`FILE_SECONDS`). Each file stays whole (the sorts are stable)."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike, so their collections agree
        items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0.0))
    else:
        items.sort(key=lambda item: item.path.name in SLOW_FILES)

#: tensors the random expressions read: name -> index names used by default
RANDOM_TENSORS: dict[str, tuple[str, ...]] = {
    "s": (), "x": ("i",), "y": ("i",), "v": ("j",), "A": ("i", "j"), "B": ("j", "k"),
}
_FUNCTIONS = ("exp", "log", "log1p", "sqrt", "sin", "cos", "tanh", "sigmoid", "abs", "relu", "sign", "step")
_NUMBERS = ("2", "3", "0.5", ".25", "2.", "1e-1", "2.5E+0", "1", "0")
_EXPONENTS = ("2", "-1", "0.5", "3", "-0.5", "(-1)", "(+2)", "+2", "1", "** 2")


def _expression(r: random.Random, depth: int) -> str:
    if depth <= 0 or r.random() < 0.25:
        return _atom(r, 0)
    if r.random() < 0.3:
        return _expression(r, depth - 1) + r.choice((" + ", " - ", " -", "+")) + _term(r, depth - 1)
    return _term(r, depth)


def _term(r: random.Random, depth: int) -> str:
    if depth <= 0 or r.random() < 0.3:
        return _unary(r, depth - 1)
    operator = r.choice((" * ", " / ", " ", " ", "*", "/"))
    right = _unary(r, depth - 1) if operator.strip() else _power(r, depth - 1, juxtaposed=True)
    return _term(r, depth - 1) + operator + right


def _unary(r: random.Random, depth: int) -> str:
    if r.random() < 0.15:
        return r.choice(("-", "+", "- ")) + _unary(r, depth - 1)
    return _power(r, depth)


def _power(r: random.Random, depth: int, juxtaposed: bool = False) -> str:
    base = _atom(r, depth, juxtaposed)
    if r.random() < 0.2:
        exponent = r.choice(_EXPONENTS)
        return base + (exponent if exponent.startswith("**") else r.choice(("^", " ^ ", "**")) + exponent)
    return base


def _atom(r: random.Random, depth: int, juxtaposed: bool = False) -> str:
    choice = r.random()
    if depth <= 0 or choice < 0.5:
        if not juxtaposed and r.random() < 0.2:
            return r.choice(_NUMBERS)
        name = r.choice(list(RANDOM_TENSORS))
        indices = RANDOM_TENSORS[name]
        if indices and r.random() < 0.3:
            indices = tuple(r.choice("ijkl") for _ in indices)
        return name + ("[" + ",".join(indices) + "]" if indices else "")
    if choice < 0.65:
        return r.choice(_FUNCTIONS) + "(" + _expression(r, depth - 1) + ")"
    if choice < 0.75:
        return f"sum[{r.choice('ijk')}](" + _expression(r, depth - 1) + ")"
    if choice < 0.8:
        return f"delta[{r.choice('ijkl')},{r.choice('ijkl')}]"
    return "(" + _expression(r, depth - 1) + ")"


def random_expression(r: random.Random, depth: int = 4) -> str:
    """A random expression in valid syntax over RANDOM_TENSORS (index rules and sizes may still fail)."""
    return _expression(r, depth)


@pytest.fixture
def make_expression() -> Callable[[random.Random, int], str]:
    """The random expression generator (seed the Random you pass for reproducible cases)."""
    return random_expression
