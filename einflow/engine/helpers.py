"""The generated code's helpers: each runtime function's own source, under the names the generated code uses.

One implementation per algorithm: the helpers are the real functions of :mod:`einflow.engine.runtime` (and of
a dialect's own runtime module, ``Dialect.runtime``, for those its library spells differently). Their source is
read from the module's file for exported source (without importing it: torch's module needs torch), its global
names renamed to the generated code's (``xp`` to the array module's alias, ``reduce`` to ``_reduce`` ...); the
plan's generated code calls the functions themselves, their globals bound to its array module (:func:`helpers`).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import types
from collections.abc import Iterable, Mapping
from typing import Any

from einflow.engine.dialect import Dialect
from einflow.lang.errors import MatrixError

__all__ = ["HELPER_KEYS", "WINDOW_KEYS", "helper_needs", "defined_helpers", "helper_text", "helpers", "bound_helpers",
           "function_source"]

#: the helpers in the order generated code defines them: the algorithms, then the operations they are written
#: over that are not helpers themselves (``einflow.engine.runtime_numpy``'s table)
HELPER_KEYS = ("output", "input", "as_float", "reciprocal", "divide", "sigmoid", "step", "sign", "as_input_float",
               "diagonal", "owned", "contract", "device", "erf", "reduce", "linalg", "solve", "conj", "real", "imag",
               "abs2", "flagged", "svd_adjugate", "dtype_kind", "astype", "arange_on", "zeros_on",
               "asarray_on", "as_index", "permuted", "written", "added_at", "zero_padded", "taken", "strided_view",
               "extreme", "constant", "true_divide", "outside", "cholesky_lower", "cholesky_solved",
               "cholesky_inverted", "spd_inverted", "lu_inverted", "lu_solved", "adjugate")
#: the helpers of exported code with shifted, strided or gathered reads (``einflow.export.windows``), in the
#: order it defines them (``fold`` is ``einflow.lang.padding.fold``)
WINDOW_KEYS = ("ranges", "gather_view", "flat", "fold", "window", "scatter_positions", "scatter")
#: the module every dialect's algorithms come from, and the module of the operations they are written over as
#: numpy spells them (a dialect's own module, ``Dialect.runtime``, respells some of those)
RUNTIME, TABLE = "einflow.engine.runtime", "einflow.engine.runtime_numpy"
#: the global names a helper's source may use that the generated code names its own way
_GLOBALS = frozenset({"xp", "oe", *HELPER_KEYS, *WINDOW_KEYS})


@functools.cache
def _module_tree(module: str) -> tuple[list[str], ast.Module]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    with open(spec.origin, encoding="utf-8") as file:
        text = file.read()
    return text.splitlines(), ast.parse(text)


@functools.cache
def function_source(module: str, name: str) -> tuple[str, tuple[tuple[int, int, str], ...]] | None:
    """The source of the top-level function ``name`` of ``module`` (None: it has none) and where it names the
    globals the generated code renames: (row, column, name), rows from 1 (its own name, and each global it
    reads that no local variable of the same name hides; never an attribute or a keyword argument)."""
    lines, tree = _module_tree(module)
    node = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)
    if node is None:
        return None
    assert node.end_lineno is not None
    text = "\n".join(lines[node.lineno - 1:node.end_lineno])
    nodes = list(ast.walk(node))
    local = {found.id for found in nodes if isinstance(found, ast.Name) and isinstance(found.ctx, ast.Store)}
    local |= {found.arg for found in nodes if isinstance(found, ast.arg)}
    local |= {(found.asname or found.name).split(".")[0] for found in nodes if isinstance(found, ast.alias)}
    renamed = _GLOBALS - local  # (a local variable of a helper's name keeps its name)
    in_strings = {id(inner) for found in nodes if isinstance(found, ast.JoinedStr) for inner in ast.walk(found)}
    found = [(1, lines[node.lineno - 1].index("def ") + 4, name)]
    found += sorted((inner.lineno - node.lineno + 1, inner.col_offset, inner.id) for inner in nodes
                    if isinstance(inner, ast.Name) and inner.id in renamed and id(inner) not in in_strings)
    return text, tuple(found)


def _modules(dialect: Dialect) -> tuple[str, ...]:
    """Where ``dialect``'s helpers are looked up, first first: its own module, the table's, the algorithms'."""
    return (*((dialect.runtime,) if dialect.runtime is not None else ()), TABLE, RUNTIME)


def _source(dialect: Dialect, key: str) -> tuple[str, tuple[tuple[int, int, str], ...]]:
    for module in _modules(dialect):
        found = function_source(module, key)
        if found is not None:
            return found
    raise AssertionError(key)


def _called(dialect: Dialect, key: str) -> frozenset[str]:
    """The helpers (algorithms, operations, window helpers, ``fold``) the source of ``key`` calls in ``dialect``."""
    return frozenset(name for _, _, name in _source(dialect, key)[1][1:] if name not in ("xp", "oe", key))


def helper_needs(dialect: Dialect, key: str) -> frozenset[str]:
    """The helpers ``key`` calls in ``dialect``, and those they call (not ``key`` itself; ``fold``, which is
    ``einflow.lang.padding``'s, neither)."""
    return defined_helpers(dialect, (key,)) - {key, "fold"}


@functools.cache
def _closure(dialect: Dialect, keys: frozenset[str]) -> frozenset[str]:
    found = set(keys)
    todo = [key for key in keys if key != "fold"]
    while todo:
        for name in _called(dialect, todo.pop()):
            if name not in found:
                found.add(name)
                if name != "fold":  # (einflow.lang.padding's: it calls no helper)
                    todo.append(name)
    return frozenset(found)


def defined_helpers(dialect: Dialect, used: Iterable[str]) -> frozenset[str]:
    """What exported source in ``dialect`` defines for the helpers its code calls (``used``): those, and the
    helpers they call in ``dialect``, transitively; each dialect's own (numpy's source never defines the
    ``flagged`` that only jax's linear algebra calls)."""
    return _closure(dialect, frozenset(used))


def helper_text(dialect: Dialect, key: str, alias: Mapping[str, str]) -> str:
    """The helper ``key`` as ``dialect``'s generated code defines it: its runtime function's source with the
    generated code's names (``alias``: ``np`` and ``oe`` for the modules, each helper key it calls for its
    helper)."""
    text, names = _source(dialect, key)
    names_of = {**alias, "xp": alias["np"]}
    lines = text.split("\n")
    for row, column, name in reversed(names):
        line = lines[row - 1]
        lines[row - 1] = line[:column] + names_of[name] + line[column + len(name):]
    return "\n".join(lines)


_BOUND: dict[tuple[str, str], dict[str, Any]] = {}


def bound_helpers(dialect: Dialect, xp: Any) -> dict[str, Any]:
    """The runtime functions (a dialect's own first) with their globals bound for the array module ``xp``: the
    same code objects, sharing one globals mapping in which ``xp`` is ``xp`` and each helper name is the bound
    helper (cached per array module and dialect)."""
    key = (xp.__name__, dialect.name)
    found = _BOUND.get(key)
    if found is None:
        base = importlib.import_module(RUNTIME)
        own = importlib.import_module(dialect.runtime) if dialect.runtime is not None else None
        space = {**vars(base), "xp": xp, "MatrixError": MatrixError}  # (raised by the linalg helper's checks)
        if xp.__name__.startswith("dask"):  # the linalg and solve helpers hand dask arrays to one numpy task
            import numpy

            from einflow.engine.backends.dask_linalg import linalg_task, solve_task

            on_numpy = bound_helpers(dialect, numpy)
            space.update(_dask_linalg=functools.partial(linalg_task, on_numpy["linalg"]),
                         _dask_solve=functools.partial(solve_task, on_numpy["solve"]))
        found = {}
        for name in (*HELPER_KEYS, *WINDOW_KEYS):
            function = getattr(own, name, None) if own is not None else None
            if function is None or getattr(function, "__module__", None) != dialect.runtime:
                function = getattr(base, name)
            copy = types.FunctionType(function.__code__, space, name, function.__defaults__, function.__closure__)
            copy.__kwdefaults__ = function.__kwdefaults__
            copy.__doc__, copy.__qualname__, copy.__module__ = function.__doc__, function.__qualname__, RUNTIME
            space[name] = found[name] = copy
        _BOUND[key] = found
    return found


def helpers(alias: Mapping[str, str], dialect: Dialect, xp: Any) -> dict[str, Any]:
    """The generated code's helper functions under its names (``alias``), bound for the array module ``xp``:
    the runtime functions themselves (``bound_helpers``)."""
    bound = bound_helpers(dialect, xp)
    return {alias["np"]: xp, "MatrixError": MatrixError, **{alias[key]: bound[key] for key in HELPER_KEYS}}
