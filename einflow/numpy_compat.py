"""``einsum`` and ``einsum_path``: numpy's interface, contracted by einflow's compiled kernels.

Everything numpy's ``einsum`` accepts is accepted here with numpy's meaning: the subscripts string or the
sublist form, ``out=``, ``dtype=``, ``order=``, ``casting=`` and ``optimize=`` (False/True, ``'greedy'``,
``'optimal'``, a ``(name, memory_limit)`` tuple or an explicit ``['einsum_path', (0, 1), ...]`` path), plus
opt_einsum's path algorithms (``'auto'``, the default; ``'dp'``, ``'branch-2'``, ... or a PathOptimizer).
Mistakes raise einflow errors that are also the exception numpy raises (see einflow.lang.errors).

How a call runs (docs/api.md has the full table):

* the subscripts are checked and resolved here (ellipses become axis labels, implicit outputs are
  numpy's: the once-used labels sorted);
* one operand: numpy's own einsum does the work, so transposes and diagonals are views, as in numpy;
* object arrays are handed to numpy.einsum unchanged;
* otherwise every operand is cast once to the dtype numpy would compute in (``dtype=`` or the operands'
  ``numpy.result_type``) and the path is run as direct BLAS/einsum steps (einflow.engine.kernels), after the
  memory guard has checked the path's peak against the memory limit.
"""

from __future__ import annotations

import difflib
import functools
import math
import string
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import opt_einsum as oe

from einflow.engine.backends import get_backend, infer_backend
from einflow.engine.kernels import compile_numpy
from einflow.engine.paths import choose_path
from einflow.engine.precision import is_low, low_name, numpy_low
from einflow.lang.errors import ArgumentError, MemoryLimitError, PathError, ShapeError, SubscriptsError

__all__ = ["einsum", "einsum_path"]

_numpy_einsum: Callable[..., Any] = np.einsum  # numpy's stubs type einsum by dtype overloads
#: sublist labels 0..51 are these letters, as in numpy (0 -> 'A', 26 -> 'a')
_SUBLIST_LETTERS = string.ascii_uppercase + string.ascii_lowercase
_CASTING = ("no", "equiv", "safe", "same_kind", "unsafe")
_ORDERS = ("K", "A", "C", "F")
#: optimize= values whose path numpy's own path finder chooses (numpy's meaning, memory cap included)
_NUMPY_PATHS = ("greedy", "optimal")


# ---------------------------------------------------------------------------------------------- arguments
def _sublist_subscripts(arguments: Sequence[Any]) -> tuple[str, list[Any]]:
    """numpy's sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` as a subscripts string and operands."""
    operands = list(arguments[0::2])
    sublists = list(arguments[1::2])
    output = None
    if len(arguments) % 2:  # an odd count: the last argument is the output's sublist
        output = operands.pop()

    def letters(sublist: Any, where: str) -> str:
        try:
            items = list(sublist)
        except TypeError:
            raise ArgumentError(f"einsum's sublist form expects a list of axis numbers for {where}, got "
                                f"{type(sublist).__name__} (e.g. einsum(a, [0, 1], b, [1, 2], [0, 2]))") from None
        text = []
        for item in items:
            if item is Ellipsis:
                text.append("...")
                continue
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise ArgumentError(f"the sublist for {where} holds {item!r}; sublists hold axis numbers "
                                    "(0 to 51) or Ellipsis")
            if not 0 <= int(item) < len(_SUBLIST_LETTERS):
                raise SubscriptsError(f"axis number {int(item)} in the sublist for {where} is not in [0, 52)")
            text.append(_SUBLIST_LETTERS[int(item)])
        return "".join(text)

    terms = [letters(sublist, f"operand {k}") for k, sublist in enumerate(sublists)]
    subscripts = ",".join(terms)
    if output is not None:
        subscripts += "->" + letters(output, "the output")
    return subscripts, operands


def _split_arguments(operands: tuple[Any, ...]) -> tuple[str, list[Any]]:
    if not operands:
        raise SubscriptsError("einsum needs subscripts and at least one operand, e.g. einsum('ij,jk', a, b)")
    first = operands[0]
    if isinstance(first, str):
        if len(operands) == 1:
            raise SubscriptsError(f"einsum({first!r}) has no operands; the subscripts name "
                                  f"{first.count(',') + 1} (e.g. einsum('ij,jk', a, b))")
        return first, list(operands[1:])
    if len(operands) < 2:
        raise ArgumentError("einsum expects a subscripts string first, e.g. einsum('ij,jk->ik', a, b), or the "
                            "sublist form einsum(a, [0, 1], b, [1, 2], [0, 2])")
    return _sublist_subscripts(operands)


def _as_operand(position: int, value: Any) -> Any:
    if isinstance(value, np.ma.MaskedArray):  # numpy.einsum computes with the data and drops the mask alike
        return value.data
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic):
        return value  # numpy, cupy, dask, ... arrays as they are
    try:
        return np.asanyarray(value)
    except (ValueError, TypeError) as error:  # a ragged nested list
        raise ShapeError(f"operand {position} is not an array: {error}") from None


# ---------------------------------------------------------------------------------------------- subscripts
def _check_term(term: str, where: str, subscripts: str) -> None:
    for char in term:
        if char != "." and not (char.isascii() and char.isalpha()):
            raise SubscriptsError(f"invalid einsum subscripts {subscripts!r}: {char!r} in {where} is not a letter "
                                  "(subscripts are the letters a-z and A-Z, with ',', '->' and '...')")
    if "." in term and (term.count(".") != 3 or "..." not in term):
        raise SubscriptsError(f"invalid einsum subscripts {subscripts!r}: {where} has a '.' that is not part of "
                              "one '...' ellipsis")


def _split_subscripts(subscripts: str) -> tuple[list[str], str | None]:
    """Input terms and the output term (None: implicit), spaces removed, characters and ``->`` checked."""
    for position, char in enumerate(subscripts):
        if char == "-" and subscripts[position + 1: position + 2] != ">" or \
                char == ">" and subscripts[position - 1: position] != "-":
            raise SubscriptsError(f"invalid einsum subscripts {subscripts!r}: '-' and '>' must appear together "
                                  "as '->' (no space between them)")
    if "." in subscripts.replace("...", ""):  # numpy reads an ellipsis before it drops spaces ('. ..' is not one)
        raise SubscriptsError(f"invalid einsum subscripts {subscripts!r}: a '.' that is not part of one '...' "
                              "ellipsis (write the three dots together)")
    if subscripts.count("->") > 1:
        raise SubscriptsError(f"invalid einsum subscripts {subscripts!r}: more than one '->'")
    text = subscripts.replace(" ", "")
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    for position, term in enumerate(terms):
        _check_term(term, f"operand {position}'s subscripts {term!r}", subscripts)
    if arrow:
        if "," in output:
            raise SubscriptsError(f"invalid einsum subscripts {subscripts!r}: the output after '->' has a ','")
        _check_term(output, f"the output {output!r}", subscripts)
        return terms, output
    return terms, None


@functools.lru_cache(maxsize=2048)
def _resolve(subscripts: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[str, dict[str, int], bool]:
    """``(equation, sizes, broadcast)``: explicit letters-only equation with ellipses as letters.

    Every check numpy makes is made here, so that numpy never raises for a call einflow accepted.
    """
    terms, output = _split_subscripts(subscripts)
    if len(terms) != len(shapes):
        raise SubscriptsError(f"einsum subscripts {subscripts!r} name {len(terms)} operand(s) but "
                              f"{len(shapes)} were given")
    used = set(subscripts)
    free = [c for c in string.ascii_letters if c not in used]
    ranks = []
    for position, (term, shape) in enumerate(zip(terms, shapes)):
        named = len(term.replace("...", ""))
        if "..." not in term and named != len(shape):
            raise ShapeError(f"operand {position} has {len(shape)} dimension(s) (shape {shape}) but subscripts "
                             f"{term!r} name {named}")
        if named > len(shape):
            raise ShapeError(f"operand {position} has {len(shape)} dimension(s) (shape {shape}) but subscripts "
                             f"{term!r} name {named} besides the ellipsis")
        ranks.append(len(shape) - named)
    width = max((rank for term, rank in zip(terms, ranks) if "..." in term), default=0)
    if width > len(free):
        raise SubscriptsError(f"einsum subscripts {subscripts!r} need {width} ellipsis axes besides their "
                              f"letters; only {len(free)} labels are left (numpy allows 52 labels)")
    ellipsis = "".join(free[:width])
    expanded = [term.replace("...", ellipsis[width - rank:] if rank else "") for term, rank in zip(terms, ranks)]
    sizes: dict[str, int] = {}
    where: dict[str, int] = {}
    broadcast = False
    for position, (term, shape) in enumerate(zip(expanded, shapes)):
        own: dict[str, int] = {}
        for label, size in zip(term, shape):
            if own.setdefault(label, size) != size:
                raise ShapeError(f"index {label!r} is repeated in operand {position} (subscripts "
                                 f"{terms[position]!r}, shape {shape}) with sizes {own[label]} and {size}; "
                                 "a repeated index takes a diagonal and needs equal sizes")
            known = sizes.get(label)
            if known is None or known == 1:
                if known == 1 and size != 1:
                    broadcast = True
                sizes[label] = size
                where[label] = position
            elif size != known:
                if size != 1:
                    kind = "ellipsis axis" if label in ellipsis else "index"
                    name = "" if label in ellipsis else f" {label!r}"
                    raise ShapeError(f"{kind}{name} has size {known} in operand {where[label]} but size {size} "
                                     f"in operand {position}; sizes must agree (or be 1, which broadcasts)")
                broadcast = True
    if output is None:
        counts: dict[str, int] = {}
        for term in terms:
            for label in term.replace("...", ""):
                counts[label] = counts.get(label, 0) + 1
        result = ellipsis + "".join(sorted(label for label, count in counts.items() if count == 1))
    else:
        named_output = output.replace("...", "")
        for label in named_output:
            if named_output.count(label) > 1:
                raise SubscriptsError(f"einsum subscripts {subscripts!r}: output index {label!r} appears more "
                                      "than once")
            if label not in sizes:
                raise SubscriptsError(f"einsum subscripts {subscripts!r}: output index {label!r} does not appear "
                                      "in any operand")
        if "..." not in output and width:
            raise SubscriptsError(f"einsum subscripts {subscripts!r}: the ellipsis covers {width} axis(es) that "
                                  "the output does not keep; write '...' in the output (or sum those axes with "
                                  "letters)")
        result = output.replace("...", ellipsis)
    return ",".join(expanded) + "->" + result, sizes, broadcast


# ---------------------------------------------------------------------------------------------- paths
def _explicit_path(optimize: Sequence[Any], count: int) -> tuple[tuple[int, ...], ...]:
    """An explicit path (numpy's ``['einsum_path', (0, 1), ...]`` or opt_einsum's ``[(0, 1), ...]``), checked."""
    steps = list(optimize)
    if steps and steps[0] == "einsum_path":
        steps = steps[1:]
    path = []
    remaining = count
    for step in steps:
        if not isinstance(step, (tuple, list)) or not all(
                isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in step):
            raise PathError(f"invalid contraction path {list(optimize)!r}: each step is a tuple of operand "
                            f"positions, got {step!r}")
        positions = tuple(int(k) for k in step)
        if not positions or len(set(positions)) != len(positions) or \
                any(not 0 <= k < remaining for k in positions):
            raise PathError(f"invalid contraction path {list(optimize)!r}: step {step!r} must name distinct "
                            f"operands among the {remaining} present at that point")
        path.append(positions)
        remaining -= len(positions) - 1
    if remaining != 1:
        raise PathError(f"invalid contraction path {list(optimize)!r}: it leaves {remaining} operands; a path "
                        "must contract all operands into one (numpy: 'Invalid einsum_path is specified')")
    return tuple(path)


def _optimize_key(optimize: Any) -> Any:
    """A hashable form of ``optimize=`` for the plan cache (after checking it)."""
    if optimize is None or isinstance(optimize, bool):
        return bool(optimize)
    if isinstance(optimize, str):
        if optimize not in _NUMPY_PATHS:
            try:
                oe.paths.get_path_fn(optimize)
            except KeyError:
                names = ", ".join(repr(name) for name in sorted(oe.paths._PATH_OPTIONS))
                raise ArgumentError(f"optimize={optimize!r} is not a path algorithm; valid options are "
                                    f"False/True, {names}, a (name, memory_limit) tuple or an explicit path "
                                    "['einsum_path', (0, 1), ...]") from None
        return optimize
    if isinstance(optimize, tuple) and len(optimize) == 2 and isinstance(optimize[0], str) and \
            not isinstance(optimize[1], (tuple, list)):
        name, memory = optimize
        if name not in _NUMPY_PATHS or isinstance(memory, bool) or not isinstance(memory, (int, float, np.number)):
            raise ArgumentError(f"optimize={optimize!r}: a tuple is ('greedy' or 'optimal', memory_limit in "
                                "elements), e.g. ('greedy', 10**6)")
        return ("memory", name, memory)
    if isinstance(optimize, (list, tuple)):
        return ("path", tuple(tuple(step) if isinstance(step, (list, tuple)) else step for step in optimize))
    if callable(optimize) or isinstance(optimize, oe.paths.PathOptimizer):
        return ("object", optimize)
    raise ArgumentError(f"optimize= must be False/True, a path algorithm's name ('greedy', 'optimal', 'auto', "
                        f"'dp', ...), a (name, memory_limit) tuple, an explicit path or an opt_einsum "
                        f"PathOptimizer, not {type(optimize).__name__}")


def _path(equation: str, shapes: tuple[tuple[int, ...], ...], key: Any) -> Any:
    """The contraction path: numpy's path finder for numpy's option values, opt_einsum's for the others."""
    count = len(shapes)
    if isinstance(key, tuple) and key[0] == "path":
        return list(_explicit_path(key[1], count))
    if key is False or count == 1:
        return [tuple(range(count))]
    if isinstance(key, tuple) and key[0] == "object":
        return key[1]
    if key is True or key in _NUMPY_PATHS or isinstance(key, tuple):  # numpy's values: numpy's path finder
        name = "greedy" if key is True else key if isinstance(key, str) else (key[1], key[2])
        # shapes only: read-only zero-stride views allocate nothing
        dummies = [np.broadcast_to(np.zeros((), np.float64), shape) for shape in shapes]
        path, _ = np.einsum_path(equation, *dummies, optimize=name)
        return [tuple(step) for step in path[1:]]
    return key  # an opt_einsum algorithm's name


def _plan_uncached(equation: str, shapes: tuple[tuple[int, ...], ...], key: Any) -> tuple[Any, Any]:
    path = _path(equation, shapes, key)
    try:
        if isinstance(path, str):  # an opt_einsum algorithm's name ('auto': einflow's default search)
            path, info, _ = choose_path(equation, shapes, path)
            return path, info
        path, info = oe.contract_path(equation, *shapes, shapes=True, optimize=path)
    except (ValueError, KeyError, TypeError) as error:
        raise PathError(f"cannot plan {equation!r}: {error}") from None
    return path, info


_plan_cached = functools.lru_cache(maxsize=1024)(_plan_uncached)


def _plan(equation: str, shapes: tuple[tuple[int, ...], ...], key: Any) -> tuple[Any, Any]:
    """``(path, PathInfo)`` for this equation, shapes and ``optimize=`` key (cached when the key hashes)."""
    try:
        hash(key)
    except TypeError:  # an unhashable PathOptimizer
        return _plan_uncached(equation, shapes, key)
    return _plan_cached(equation, shapes, key)


def _kernel_uncached(equation: str, shapes: tuple[tuple[int, ...], ...], key: Any) -> tuple[Callable[..., Any], int]:
    _, info = _plan(equation, shapes, key)
    return compile_numpy(equation, shapes, info.contraction_list)


_kernel_cached = functools.lru_cache(maxsize=1024)(_kernel_uncached)


def _numpy_kernel(equation: str, shapes: tuple[tuple[int, ...], ...], key: Any) -> tuple[Callable[..., Any], int]:
    try:
        hash(key)
    except TypeError:
        return _kernel_uncached(equation, shapes, key)
    return _kernel_cached(equation, shapes, key)


def _guard(equation: str, sizes: dict[str, int], peak_elements: int, itemsize: int) -> None:
    """einflow's memory guard (the limit Program calls use): refuse a call whose peak is over the limit."""
    from einflow.engine.memory import format_bytes
    from einflow.program import default_memory_limit

    output = equation.split("->")[1]
    needed = (peak_elements + math.prod(sizes[c] for c in output)) * itemsize
    limit = default_memory_limit()
    if needed > limit:
        raise MemoryLimitError(f"einsum {equation!r} needs {format_bytes(needed)} (result and intermediates), over the "
                               f"memory limit of {format_bytes(limit)}; nothing was allocated. Compute it in chunks "
                               "(an einflow program with backend='dask') or shrink the problem")


# ---------------------------------------------------------------------------------------------- options
def _check_options(out: Any, dtype: Any, order: Any, casting: Any) -> tuple[Any, str, str]:
    if out is not None and not isinstance(out, np.ndarray):
        raise ArgumentError(f"out= must be a numpy array, got {type(out).__name__}")
    if not isinstance(order, str) or order.upper() not in _ORDERS:
        raise SubscriptsError(f"order={order!r} is not one of 'K', 'A', 'C', 'F'") \
            if isinstance(order, str) else ArgumentError(f"order= must be a string, not {type(order).__name__}")
    if not isinstance(casting, str) or casting not in _CASTING:
        if not isinstance(casting, str):
            raise ArgumentError(f"casting= must be a string, not {type(casting).__name__}")
        raise SubscriptsError(f"casting={casting!r} is not one of {', '.join(map(repr, _CASTING))}")
    if dtype is not None:
        try:
            dtype = np.dtype(dtype)
        except (TypeError, ValueError):
            raise ArgumentError(f"dtype={dtype!r} is not a numpy dtype") from None
    return dtype, order.upper(), casting


def _cast_check(source: Any, target: Any, casting: Any, what: str) -> None:
    if not np.can_cast(source, target, casting=casting):
        raise ArgumentError(f"cannot cast {what} from {np.dtype(source)} to {np.dtype(target)} under "
                            f"casting={casting!r}")


def _apply_order(result: Any, order: str, arrays: list[Any]) -> Any:
    if order == "A":
        fortran = all(a.flags.f_contiguous and not a.flags.c_contiguous or a.ndim < 2 for a in arrays) and \
            any(a.ndim >= 2 for a in arrays)
        order = "F" if fortran else "C"
    if order == "C" and not result.flags.c_contiguous:
        return np.ascontiguousarray(result)
    if order == "F" and not result.flags.f_contiguous:
        return np.asfortranarray(result)
    return result


def _finish(result: Any, out: Any, casting: str) -> Any:
    if out is None:
        return result[()] if type(result) is np.ndarray and result.ndim == 0 else result
    if out.shape != np.shape(result):
        raise ShapeError(f"out= has shape {out.shape} but the result has shape {np.shape(result)}")
    _cast_check(np.asarray(result).dtype, out.dtype, casting, "the result into out=")
    np.copyto(out, result, casting="unsafe")
    return out


# ---------------------------------------------------------------------------------------------- public API
def einsum(*operands: Any, out: Any = None, dtype: Any = None, order: str = "K", casting: str = "safe",
           optimize: Any = "auto", preferred_element_type: Any = None, **unexpected: Any) -> Any:
    """numpy.einsum's interface, planned once per (subscripts, shapes, optimize) and run by einflow's kernels.

    Accepts what numpy.einsum accepts (subscripts or sublists, ``out=``, ``dtype=``, ``order=``,
    ``casting=``, numpy's ``optimize=`` values) and opt_einsum's path algorithms; ``optimize`` defaults to
    ``'auto'`` (opt_einsum's choice). Every pairwise step computes in the dtype numpy would use.
    ``preferred_element_type`` (jax.numpy.einsum's option, on every backend): the result's dtype, accumulated
    in at least its precision. float16 and bfloat16 accumulate in float32 (numpy arrays: the path runs in
    float32 and the result is rounded once; torch and jax accumulate so natively).

    >>> import numpy as np, einflow as ef
    >>> ef.einsum("ij,jk", np.eye(2), np.ones((2, 3))).shape
    (2, 3)
    >>> float(ef.einsum("ii", np.eye(3)))
    3.0
    >>> ef.einsum(np.eye(2), [0, 1], np.ones((2, 3)), [1, 2], [0, 2]).shape
    (2, 3)
    >>> float(ef.einsum("i,i,->", np.ones(3, bool), np.ones(3, bool), 1.0))
    3.0
    """
    if out is None and dtype is None and order == "K" and casting == "safe" and type(optimize) is str and \
            preferred_element_type is None and len(operands) > 2 and type(operands[0]) is str:
        # fast path: a repeat of a plain call on numpy arrays runs its prepared kernel directly
        signature = []
        for value in operands[1:]:
            if type(value) is not np.ndarray:
                break
            signature.append((value.shape, value.dtype))
        else:
            prepared = _PREPARED.get((operands[0], optimize, tuple(signature)))
            if prepared is not None:
                return prepared(operands[1:])
    if unexpected:
        _unexpected_keyword("einsum", next(iter(unexpected)), ("out", "dtype", "order", "casting", "optimize",
                                                               "preferred_element_type"))
    subscripts, values = _split_arguments(operands)
    dtype, order, casting = _check_options(out, dtype, order, casting)
    preferred = _check_preferred(preferred_element_type)
    key = _optimize_key(optimize)
    arrays = [_as_operand(position, value) for position, value in enumerate(values)]
    shapes = tuple(tuple(a.shape) for a in arrays)
    equation, sizes, broadcast = _resolve(subscripts, shapes)
    numpy_arrays = all(isinstance(a, np.ndarray) for a in arrays)
    options = {"dtype": dtype, "order": order, "casting": casting}
    if not numpy_arrays:
        # the rule Program.__call__ follows: the inputs' array library picks the backend (mixing two is an error)
        name = infer_backend(arrays)
        if name in ("torch", "jax"):
            if out is not None or dtype is not None:
                raise ArgumentError("out= and dtype= need numpy arrays; cast the result instead")
            engine: Any = get_backend(name)  # the torch backend's asarray also takes device=
            device = next((a.device for a in arrays if type(a).__module__.startswith("torch")), None)
            # (jax arrays pass as they are, booleans too: dot_general takes them beside a wider result type)
            converted = [engine.asarray(a, device=device) if name == "torch" else
                         a if type(a).__module__.startswith(("jax", "jaxlib")) else engine.asarray(a) for a in arrays]
            path, _ = _plan(equation, shapes, key)
            # numpy's dtype rule: the operands' result type (bool stays bool: products are 'and', sums 'or')
            common = np.result_type(*[_numpy_dtype(a.dtype, name) for a in arrays])
            work = np.dtype(np.int64) if common == np.bool_ else common
            if preferred is not None:
                work = np.result_type(work, preferred)
            native = _native_dtype(work, name)
            if name == "jax":
                # jax.numpy.einsum on einflow's path: one lax.dot_general per pairwise step, mixed operand dtypes
                # passed as they are (no convert before a dot) and the result type as dot_general's
                # preferred_element_type
                result = _jax_einsum(equation, converted, path, native)
            else:
                converted = [a if a.dtype == native else a.to(native) for a in converted]
                result = oe.contract(equation, *converted, optimize=path, backend=engine.einsum_backend)
            if common == np.bool_ and preferred is None:
                return result != 0
            if preferred is not None and preferred != work:
                target = _native_dtype(preferred, name)
                result = result.to(target) if name == "torch" else result.astype(target)
            return result
    if numpy_arrays and any(a.dtype.kind not in "biufc" and not is_low(a.dtype) for a in arrays):
        if any(a.dtype.kind == "O" for a in arrays):  # Python objects: numpy's own loops
            numpy_optimize = optimize if isinstance(key, bool) or key in _NUMPY_PATHS or (
                isinstance(key, tuple) and key[0] in ("memory", "path")) else False
            return _numpy_einsum(*operands, out=out, optimize=numpy_optimize, **options)
        strange = next(a.dtype for a in arrays if a.dtype.kind not in "biufc" and not is_low(a.dtype))
        raise ArgumentError(f"einsum computes with numbers (bool, int, float, complex); an operand has dtype "
                            f"{strange}")
    if not numpy_arrays:  # cupy, dask, ...: opt_einsum dispatches to the arrays' own library
        if out is not None or dtype is not None:
            raise ArgumentError("out= and dtype= need numpy arrays; cast the result instead")
        path, _ = _plan(equation, shapes, key)
        common = np.result_type(*[a.dtype for a in arrays])  # numpy's dtype rule here too
        # (dask sums small integers and booleans into int64: computed so and brought back to numpy's type;
        # booleans as 'and' and 'or', integers wrapping as numpy's would; float16 and bfloat16 in float32)
        final = common if preferred is None else preferred
        work = np.dtype(np.int64) if common == np.bool_ else common
        if preferred is not None:
            work = np.result_type(work, preferred)
        work = np.dtype(np.float32) if is_low(work) else work
        arrays = [a if a.dtype == work else a.astype(work) for a in arrays]
        if name == "dask":  # each step's output chunks bounded as dask.array.einsum bounds the call's (dask_ops)
            from einflow.engine.backends.dask_ops import chunk_floor

            with chunk_floor(arrays):
                result = oe.contract(equation, *arrays, optimize=path, backend=get_backend("dask").einsum_backend)
        else:
            result = oe.contract(equation, *arrays, optimize=path)
        if common == np.bool_ and preferred is None:
            return result != 0
        return result if result.dtype == final else result.astype(final)
    if dtype is not None:
        for position, a in enumerate(arrays):
            _cast_check(a.dtype, dtype, casting, f"operand {position}")
        compute = dtype
    else:
        compute = np.result_type(*arrays)
        for position, a in enumerate(arrays):
            _cast_check(a.dtype, compute, casting, f"operand {position}")
    if preferred is not None or is_low(compute):
        # float16 and bfloat16 accumulate in float32 and are rounded once; preferred_element_type= accumulates in
        # at least its own precision and is the result's type
        final = compute if preferred is None else preferred
        wide = np.result_type(compute, final) if preferred is not None else compute
        work = np.dtype(np.float32) if is_low(wide) else wide
        if len(arrays) == 1 and not _sums(equation):
            # a transpose or a diagonal moves items without arithmetic: numpy's view (of 2-byte items as uint16)
            source = arrays[0] if arrays[0].dtype == compute else arrays[0].astype(compute)
            moved = _numpy_einsum(equation, source.view(np.uint16)).view(compute) if is_low(compute) else \
                _numpy_einsum(equation, source)
            moved = moved if moved.dtype == final else moved.astype(final)
            return _finish(_apply_order(moved, order, arrays), out, "unsafe" if preferred is not None else casting)
        arrays = [a if a.dtype == work else a.astype(work) for a in arrays]
        result = einsum(equation, *arrays, order=order, optimize=optimize)
        result = np.asarray(result).astype(final, copy=False)
        return _finish(result, out, "unsafe" if preferred is not None else casting)
    if len(arrays) == 1:
        # one operand: numpy's einsum returns views for transposes and diagonals; the checks above are einflow's
        result = _numpy_einsum(equation, arrays[0], dtype=dtype, order=order, casting=casting)
        return _finish(_apply_order(result, order, arrays), out, casting)
    numpy_optimized = key is True or key in _NUMPY_PATHS or isinstance(key, tuple) and (
        key[0] == "memory" or key[0] == "path" and key[1][:1] == ("einsum_path",))
    if out is not None and len(arrays) > 1 and numpy_optimized and \
            not np.can_cast(compute, out.dtype, casting=casting):  # type: ignore[arg-type]
        # numpy's optimized einsum (numpy's own optimize= values) copies a last BLAS step into out= whatever
        # casting= says (optimize=False refuses): such a call gets numpy's answer, or its refusal typed
        try:
            return _numpy_einsum(equation, *arrays, out=out, optimize=optimize, **options)
        except TypeError as error:
            raise ArgumentError(f"cannot cast the result into out= from {compute} to {out.dtype} under "
                                f"casting={casting!r} ({error})") from None
    kernel, peak = _numpy_kernel(equation, shapes, key)
    _guard(equation, sizes, peak, compute.itemsize)
    prepared = _prepare(kernel, compute, tuple(a.dtype != compute for a in arrays))
    if out is None and dtype is None and order == "K" and casting == "safe" and type(optimize) is str and \
            isinstance(subscripts, str) and type(operands[0]) is str and \
            all(type(value) is np.ndarray for value in operands[1:]):
        if len(_PREPARED) >= 4096:
            _PREPARED.clear()
        _PREPARED[(subscripts, optimize, tuple((a.shape, a.dtype) for a in arrays))] = prepared
    if out is None and order == "K":
        return prepared(arrays)
    result = prepared(arrays)
    return _finish(_apply_order(np.asarray(result), order, arrays), out, casting)


def _sums(equation: str) -> bool:
    """Whether an equation sums an index (else it only moves, broadcasts or takes diagonals)."""
    inputs, output = equation.split("->")
    return bool(set(inputs.replace(",", "")) - set(output))


def _check_preferred(preferred: Any) -> np.dtype | None:
    """``preferred_element_type=`` as a numpy dtype of numbers (jax's spellings: 'float32', jnp.bfloat16, ...)."""
    if preferred is None:
        return None
    try:
        found = np.dtype(preferred)
    except (TypeError, ValueError):
        found = None
    if found is None and low_name(preferred) is not None:  # torch.bfloat16 and torch.float16
        found = numpy_low(low_name(preferred) or "")
    if found is None:
        raise ArgumentError(f"preferred_element_type={preferred!r} is not a dtype (e.g. 'float32' or "
                            "jnp.bfloat16)")
    if found.kind not in "biufc" and not is_low(found):
        raise ArgumentError(f"preferred_element_type={preferred!r}: einsum computes with numbers (bool, int, "
                            "float, complex)")
    return found


def _jax_einsum(equation: str, operands: list[Any], path: Any, preferred: Any) -> Any:
    """jax.numpy.einsum on this path: a dot_general per pairwise step, accumulating in ``preferred``."""
    import jax.numpy as jnp

    return jnp.einsum(equation, *operands, optimize=[tuple(step) for step in path],
                      preferred_element_type=preferred)


def _numpy_dtype(dtype: Any, backend: str) -> np.dtype:
    """The numpy dtype of a torch or jax array's dtype."""
    if isinstance(dtype, np.dtype):  # a numpy array passed with the tensors
        return dtype
    if backend == "torch":
        from einflow.engine.backends.torch_backend import numpy_dtype

        return numpy_dtype(dtype)
    return np.dtype(dtype)


def _native_dtype(dtype: np.dtype, backend: str) -> Any:
    """A numpy dtype as the torch or jax arrays' dtype."""
    if backend == "torch":
        import torch

        return getattr(torch, dtype.name)
    import jax

    return jax.dtypes.canonicalize_dtype(dtype)


#: (subscripts, optimize, ((shape, dtype), ...)) -> the prepared call, for plain calls on numpy arrays
_PREPARED: dict[Any, Callable[[Sequence[Any]], Any]] = {}


def _prepare(kernel: Callable[..., Any], compute: Any, casts: tuple[bool, ...]) -> Callable[[Sequence[Any]], Any]:
    """The call for one signature: cast the operands that need it, run the kernel, give numpy's result type."""
    cast = any(casts)

    def run(arrays: Sequence[Any]) -> Any:
        if cast:
            arrays = [a.astype(compute) if needs else a for a, needs in zip(arrays, casts)]
        result = kernel(*arrays)
        if type(result) is not np.ndarray:
            result = np.asarray(result)
        if result.dtype != compute:  # e.g. numpy.dot of booleans and a 0-d product
            result = result.astype(compute)
        return result[()] if result.ndim == 0 else result

    return run


def einsum_path(*operands: Any, optimize: Any = "greedy", **unexpected: Any) -> tuple[list[Any], str]:
    """numpy.einsum_path's interface: ``(['einsum_path', (i, j), ...], report)`` for the path einsum would take.

    ``optimize`` takes the values of ``einsum`` (numpy's default here is ``'greedy'``); the path is the one
    ``einflow.einsum(..., optimize=optimize)`` runs.

    >>> import numpy as np, einflow as ef
    >>> path, report = ef.einsum_path("ij,jk,kl->il", np.ones((2, 3)), np.ones((3, 4)), np.ones((4, 5)))
    >>> path
    ['einsum_path', (1, 2), (0, 1)]
    >>> print(report.splitlines()[0])
      Complete contraction:  ij,jk,kl->il
    """
    if unexpected:
        _unexpected_keyword("einsum_path", next(iter(unexpected)), ("optimize",))
    subscripts, values = _split_arguments(operands)
    key = _optimize_key(optimize)
    arrays = [_as_operand(position, value) for position, value in enumerate(values)]
    shapes = tuple(tuple(a.shape) for a in arrays)
    equation, sizes, _ = _resolve(subscripts, shapes)
    path, info = _plan(equation, shapes, key)
    return ["einsum_path", *[tuple(step) for step in path]], _report(equation, sizes, info)


def _unexpected_keyword(function: str, keyword: str, options: tuple[str, ...]) -> None:
    close = difflib.get_close_matches(keyword, options, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ArgumentError(f"{function}() got an unexpected keyword {keyword!r}{hint} (its options are "
                        f"{', '.join(options)})")


def _report(equation: str, sizes: dict[str, int], info: Any) -> str:
    """The path report in numpy.einsum_path's layout (a header, then one line per contraction)."""
    inputs, output = equation.split("->")
    labels = set(inputs.replace(",", ""))
    naive_flops = math.prod(sizes[c] for c in labels) * max(1, len(inputs.split(",")))
    optimized = int(info.opt_cost)
    largest = int(info.largest_intermediate)
    speedup = naive_flops / max(optimized, 1)
    scaling = max((len(set(step[2].split("->")[0].replace(",", ""))) for step in info.contraction_list),
                  default=0)
    lines = [
        f"  Complete contraction:  {equation}",
        f"         Naive scaling:  {len(labels)}",
        f"     Optimized scaling:  {scaling}",
        f"      Naive FLOP count:  {naive_flops:.3e}",
        f"  Optimized FLOP count:  {optimized:.3e}",
        f"   Theoretical speedup:  {speedup:3.3f}",
        f"  Largest intermediate:  {largest:.3e} elements",
        "-" * 74,
        f"{'scaling':>7}{'current':>26}{'remaining':>40}",
        "-" * 74,
    ]
    remaining = inputs.split(",")
    for step in info.contraction_list:
        positions, text = step[0], step[2]
        for position in sorted(positions, reverse=True):
            remaining.pop(position)
        remaining.append(text.split("->")[1])
        rest = ",".join(remaining) + "->" + output
        step_scaling = len(set(text.split("->")[0].replace(",", "")))
        lines.append(f"{step_scaling:>4}    {text:>24} {rest:>40}")
    return "\n".join(lines)
