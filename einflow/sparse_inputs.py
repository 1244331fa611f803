"""Calls with sparse inputs (LANGUAGE.md §9.3): the program rewritten over coordinates and values, run, and its
results on a pattern returned as sparse arrays of the inputs' kind (``einflow.engine.sparse`` rewrites)."""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from einflow.engine.backends import infer_backend
from einflow.engine.plan import PlanStep
from einflow.engine.segments import forget
from einflow.engine.sparse import Rewritten, rewrite
from einflow.engine.sparse_arrays import (
    SUPPORTED,
    SparseArray,
    is_sparse,
    same_coords,
    sparse_kind,
    spmm,
    to_coo,
    values_of,
    wrap,
)
from einflow.lang.errors import SparseError

__all__ = ["call", "plan", "prepared", "check_backend"]

# ---------------------------------------------------------------- calls
#: id of a sparse input -> (a weak reference to it, its shape and nnz, its conversion): the coordinates of an
#: input passed again are not made again (their sorting order stays cached on them, einflow.engine.segments)
_CONVERTED: dict[int, tuple[Any, tuple[int, ...], int, SparseArray]] = {}


def converted_input(name: str, value: Any) -> SparseArray:
    """The coordinates and values of a sparse input, its coordinates kept from the last call with the same array
    (its values read again: changed in place, they are seen) where its values are its own data."""
    values = values_of(value)
    hit = _CONVERTED.get(id(value))
    if values is not None and hit is not None and hit[0]() is value and hit[1] == tuple(value.shape) and \
            hit[2] == values.shape[0]:
        return replace(hit[3], values=values)
    array = to_coo(name, value)
    if values is not None:
        key = id(value)
        try:
            ref = weakref.ref(value, forget(_CONVERTED, key))
        except TypeError:  # an array without weak references is converted on every call
            return array
        _CONVERTED[key] = (ref, tuple(value.shape), array.nnz, array)
    return array


_REWRITES: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()


def prepared(program: Any, values: Mapping[str, Any], make: Any,
             matmuls: bool = True) -> tuple[Any, Rewritten, dict[str, Any], list[SparseArray]]:
    """The rewritten Program for these inputs (cached), its arrays, and the coordinates of each pattern group."""
    converted: dict[str, SparseArray] = {}
    seen: dict[int, SparseArray] = {}
    for name in program.info.inputs:
        value = values[name]
        if is_sparse(value):
            converted[name] = seen[id(value)] if id(value) in seen else converted_input(name, value)
            seen[id(value)] = converted[name]
    groups: dict[str, int] = {}
    leaders: list[SparseArray] = []
    for name, array in converted.items():
        for k, leader in enumerate(leaders):
            if same_coords(leader, array):
                groups[name] = k
                break
        else:
            groups[name] = len(leaders)
            leaders.append(array)
    sample = {}
    if program.casts is not None:
        for output, cast in zip(program.info.outputs, program.casts):
            if output is not None and cast in converted:
                sample[output] = cast
    dense = {name: _shape(values[name]) for name in program.info.inputs if name not in converted}
    # (the order of contraction reads nnz to a power of two: one rewrite per pattern size, not per pattern)
    nnz = {group: 1 << max(0, leader.nnz.bit_length() - 1) for group, leader in enumerate(leaders)}
    key = (matmuls, tuple(sorted(groups.items())), tuple((name, a.shape) for name, a in converted.items()),
           tuple(sorted(sample.items())), tuple(sorted(dense.items())), tuple(sorted(nnz.items())))
    cache = _REWRITES.setdefault(program, {})
    built = cache.get(key)
    if built is None:
        rewritten = rewrite(program.ir, program.info, groups, {n: a.shape for n, a in converted.items()}, sample,
                            matmuls, dense, nnz)
        runner = make(rewritten.program)  # einflow.program.Program (program.py calls this module)
        if program.casts is not None:
            runner.casts = tuple(rewritten.inputs[c].values if c in rewritten.inputs else c for c in program.casts)
        built = cache[key] = (runner, rewritten)
    runner, rewritten = built
    arrays = {name: value for name, value in values.items() if name not in converted}
    for name, array in converted.items():
        arrays[rewritten.inputs[name].values] = array.values
    for group, leader in enumerate(leaders):
        for coord, axis in zip(rewritten.group_coords[group], leader.coords):
            arrays[coord] = axis
    return runner, rewritten, arrays, leaders


def _shape(value: Any) -> tuple[int, ...]:
    """The shape of a dense input: an array's, or the shape ``plan`` was given."""
    if hasattr(value, "shape"):
        return tuple(int(n) for n in value.shape)
    if isinstance(value, (tuple, list)):
        return tuple(int(n) for n in value)
    return ()


def check_backend(program: Any, values: Mapping[str, Any], backend: str) -> str:
    """The backend a call with sparse inputs runs on (numpy for scipy and pydata inputs, torch for torch sparse
    tensors), or a SparseError for a sparse input that backend cannot take."""
    wanted: str | None = None
    for name in program.info.inputs:
        value = values[name]
        kind = sparse_kind(value)
        if kind is None:
            continue
        if kind == "jax":
            raise SparseError(f"tensor {name!r} is a jax sparse tensor (BCOO); sparse inputs are supported as "
                              f"{SUPPORTED} (pass it dense: jax.experimental.sparse's own operations take BCOO)")
        home = "torch" if kind == "torch" else "numpy"
        if backend not in ("auto", home):
            raise SparseError(f"tensor {name!r} is sparse; the {backend} backend does not take it: sparse inputs "
                              f"are supported as {SUPPORTED}")
        if wanted is not None and wanted != home:
            raise SparseError(f"tensor {name!r} is a {kind} sparse array beside sparse arrays of another library; "
                              "pass them all as one library's (scipy/pydata, or torch)")
        wanted = home
    return wanted or "numpy"


def call(program: Any, values: Mapping[str, Any], backend: str, options: Mapping[str, Any], make: Any) -> Any:
    """Run ``program`` with sparse inputs among ``values``: the rewritten program (built by ``make``, the Program
    class), sparse results wrapped."""
    home = check_backend(program, values, backend)
    runner, rewritten, arrays, leaders = prepared(program, values, make, matmuls=home == "numpy")
    if backend == "auto":
        found = infer_backend(arrays.values())
        if found != home:
            names = ", ".join(repr(name) for name in rewritten.inputs)
            beside = "numpy arrays" if home == "numpy" else "torch tensors"
            raise SparseError(f"tensor {names} is sparse and the other inputs are {found} arrays; sparse inputs "
                              f"are supported as {SUPPORTED} (pass {beside} beside them)")
    for product in rewritten.products:  # SpMM through scipy's kernel (einflow.engine.sparse_arrays.spmm)
        arrays[product.name] = spmm(product, values[product.sparse], values[product.dense])
    result = runner(arrays, backend=home, **options)
    outputs = list(result) if type(result) is tuple else [result]
    for k, where in enumerate(rewritten.outputs):
        if where is None or k >= len(outputs):
            continue
        group, axes, shape = where
        leader = leaders[group]
        outputs[k] = wrap(outputs[k], tuple(leader.coords[axis] for axis in axes), shape, leader.like)
    return tuple(outputs) if type(result) is tuple else outputs[0]


def plan(program: Any, shapes: Mapping[str, Any], make: Any, options: Mapping[str, Any]) -> Any:
    """``Program.plan`` given sparse arrays: the report of the program that runs for them, FLOPs and memory from
    nnz, with a first step per sparse-dense matrix product computed by scipy's CSR kernel before the program."""
    home = "torch" if any(sparse_kind(shapes.get(name)) == "torch" for name in program.info.inputs) else "numpy"
    runner, rewritten, arrays, leaders = prepared(program, shapes, make, matmuls=home == "numpy")
    given = {name: value for name, value in arrays.items() if name in runner.info.inputs}
    steps = []
    extra = 0
    for product in rewritten.products:
        matrix, other = shapes[product.sparse], shapes[product.dense]
        other_shape = tuple(other) if isinstance(other, (tuple, list)) else tuple(other.shape)
        rest = other_shape[:product.axis] + other_shape[product.axis + 1:]
        shape = (int(matrix.shape[1 if product.transpose else 0]), *rest)
        given[product.name] = shape
        nnz = int(getattr(matrix, "nnz", 0))
        itemsize = int(options.get("itemsize") or 8)
        read = f"{product.sparse}^T" if product.transpose else product.sparse
        steps.append(PlanStep(f"{product.name} = {read} @ {product.dense} (scipy CSR kernel, before the program)",
                              "spmm", f"{read} @ {product.dense} -> {product.name}", 2 * nnz * math.prod(rest),
                              shape, itemsize))
        extra += math.prod(shape) * itemsize
    report = runner.plan(given, **options)
    report.steps[:0] = steps
    report.peak_bytes += extra
    return report
