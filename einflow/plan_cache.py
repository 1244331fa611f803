"""A program's plans by call signature (least recently used dropped), and the shortcut a repeated numpy call
of one signature takes straight to its plan's function."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from einflow.engine.plan import Plan

__all__ = ["PlanCache", "PlanCacheInfo", "Call", "numpy_signature", "MISS", "fast_call"]

#: what :attr:`PlanCache.fast` returns for a call it does not take (the general path runs it instead)
MISS = object()


class PlanCacheInfo(NamedTuple):
    """``Program.cache_info()``: plans held now, and the most a program keeps."""

    plans: int
    maxsize: int


class PlanCache(OrderedDict):  # type: ignore[type-arg]
    """A program's plans by call signature; beyond ``maxsize`` the least recently used plan is dropped.

    A long-running service calling one program with ever new shapes keeps at most ``maxsize`` plans.
    """

    #: plans one program keeps (``PlanCache.maxsize = n`` changes it for programs built afterwards)
    maxsize = 64

    def __init__(self) -> None:
        super().__init__()
        self.maxsize = type(self).maxsize
        #: the call path's shortcut, by the same keys: a numpy plan's :class:`Call` (what a repeated call of one
        #: signature runs, and which of the call's after-steps it needs); an entry goes with its plan
        self.calls: dict[Any, Call] = {}
        #: the program's inputs out of a call's keywords, as a tuple (set with the first shortcut), and their count
        self.take: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
        self.count = 0
        #: the shortcut that ran last while its plan is the most recently used one (any other use resets it)
        self.last: Call | None = None
        #: that shortcut's :func:`fast_call` when it was a call by keyword with the default options (backend, the
        #: call's name for it; optimize "auto", memory limit "default") whose outputs need no dtype steps
        self.fast: Callable[[Mapping[str, Any]], Any] | None = None
        self.fast_name: str | None = None

    def get(self, key: Any, default: Any = None) -> Any:
        self.last = self.fast = None
        try:
            self.move_to_end(key)
            return self[key]
        except KeyError:  # absent, or dropped by another thread in between
            return default

    def __setitem__(self, key: Any, value: Any) -> None:
        self.last = self.fast = None
        super().__setitem__(key, value)
        while len(self) > self.maxsize:
            try:
                dropped, _ = self.popitem(last=False)
            except KeyError:  # pragma: no cover - emptied by another thread
                break
            self.calls = {known: call for known, call in self.calls.items() if call.key != dropped}

    def clear(self) -> None:
        super().clear()
        self.calls = {}
        self.last = self.fast = None

    def by_position(self, args: tuple[Any, ...], arrays: dict[str, Any]) -> tuple[Any, Any]:
        """``(input values, inputs by name or None)`` of a call by position (every input) or with one dict,
        else ``(None, None)``."""
        if arrays or self.take is None:
            return None, None
        if len(args) == self.count and type(args[0]) is not dict:
            return args, None
        if len(args) == 1 and type(args[0]) is dict:
            try:
                return self.take(args[0]), args[0]
            except KeyError:
                return None, None
        return None, None


    def shortcut(self, values: tuple[Any, ...], name: str, optimize: str, memory_limit: Any) -> Call | None:
        """The learned call of these input values' signature with these options, or None (then the general path
        runs); the one used last is checked first, by its signature alone."""
        last = self.last  # the plan used last, by this path: no need to mark it again
        if last is not None and last.name == name and last.optimize == optimize and last.memory_limit == memory_limit:
            for value, (shape, dtype) in zip(values, last.signature):
                if type(value) is np.ndarray:
                    if value.dtype is not dtype or value.shape != shape:
                        break
                elif type(value) is not dtype:
                    break
            else:
                return last
        signature = numpy_signature(values)
        if signature is None:
            return None
        call = self.calls.get((name, optimize, memory_limit, signature))
        if call is not None:
            try:
                self.move_to_end(call.key)
            except KeyError:  # pragma: no cover - dropped by another thread in between
                return None
            self.last = call
            if call.fast is not None and optimize == "auto" and memory_limit == "default":
                self.fast, self.fast_name = call.fast, name
        return call

    def learn(self, key: Any, after: bool, inputs: tuple[str, ...], keywords: bool = True) -> None:
        """Keep the shortcut for a numpy call ``key`` = (backend, optimize, memory_limit, signature) whose plan is
        cached (``after``: whether its outputs need the program's dtype steps; ``keywords``: whether a call's
        keywords are its inputs alone when they are as many, no input being named like a call option)."""
        plan_key = ("numpy", *key[1:])
        plan = self.get(plan_key)
        if plan is None or plan.backend.name != "numpy":
            return
        if self.take is None:
            self.take, self.count = taker(inputs), len(inputs)
        name, optimize, memory_limit, signature = key
        fast = None if after or not keywords else fast_call(plan.function, inputs, signature, plan.returns_tuple,
                                            plan.output_shapes)
        self.calls[key] = Call(plan_key, name, optimize, memory_limit, signature, plan.function, plan, after, fast)


class Call(NamedTuple):
    """A repeated numpy call of one signature: the plan's function and what the general path would do after it,
    learned on the first call of that signature (the results' dtypes depend on the inputs' only)."""

    #: the plan cache's key of the plan (kept up to date as the most recently used on each call)
    key: Any
    #: the call's backend name, optimize and memory_limit options and its inputs' ``(shape, dtype)`` (a Python
    #: number's ``((), int or float)``)
    name: str
    optimize: str
    memory_limit: Any
    signature: tuple[tuple[Any, Any], ...]
    function: Callable[..., Any]
    plan: Plan
    #: whether the outputs need :func:`_cast` / :func:`_kept_booleans` (a dtype that changes)
    after: bool
    #: the call by keyword (:func:`fast_call`), where ``after`` is false
    fast: Callable[[Mapping[str, Any]], Any] | None = None

def numpy_signature(values: Sequence[Any]) -> tuple[Any, ...] | None:
    """``((shape, dtype), ...)`` of numpy arrays and ``((), int or float)`` of Python numbers; None for anything
    else (the call's shortcut is for these only)."""
    signature = []
    for value in values:
        kind = type(value)
        if kind is np.ndarray:
            signature.append((value.shape, value.dtype))
        elif kind is float or kind is int:
            signature.append(((), kind))
        else:
            return None
    return tuple(signature)


def taker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A function taking ``names``' values out of a mapping as a tuple (KeyError for a missing one)."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    if names:
        (name,) = names
        return lambda arrays: (arrays[name],)
    return lambda arrays: ()


def fast_call(function: Callable[..., Any], inputs: tuple[str, ...], signature: tuple[tuple[Any, Any], ...],
              returns_tuple: bool, output_shapes: tuple[tuple[int, ...], ...]) -> Callable[[Mapping[str, Any]], Any]:
    """A call by keyword of one signature in one generated function: it takes the inputs out of the keywords,
    checks each one's type, shape and dtype against ``signature``, runs ``function`` and returns its value as
    ``Program.__call__`` does (a 0-d numpy result as numpy's scalar); :data:`MISS` for keywords of another
    signature (or other names), or when ``function`` raises (the general path then runs the call and raises).

    >>> import numpy as np
    >>> fast = fast_call(lambda x: x.sum(), ("x",), (((2,), np.dtype("float64")),), False, ((),))
    >>> fast({"x": np.ones(2)}), fast({"x": np.ones(3)}) is MISS, fast({"y": np.ones(2)}) is MISS
    (np.float64(2.0), True, True)
    """
    names = [f"_v{k}" for k in range(len(inputs))]
    namespace: dict[str, Any] = {"_function": function, "_MISS": MISS, "_ndarray": np.ndarray, "_scalar": _scalar,
                                 "KeyError": KeyError, "NotImplementedError": NotImplementedError,
                                 "OverflowError": OverflowError, "TypeError": TypeError, "len": len,
                                 "tuple": tuple, "map": map, "type": type}
    checks = []
    for k, (name, (shape, dtype)) in enumerate(zip(names, signature)):
        if isinstance(dtype, type):  # a Python number
            namespace[f"_T{k}"] = dtype
            checks.append(f"type({name}) is _T{k}")
        else:
            namespace[f"_D{k}"], namespace[f"_S{k}"] = dtype, shape
            checks.append(f"type({name}) is _ndarray and {name}.dtype is _D{k} and {name}.shape == _S{k}")
    if returns_tuple:
        value = "tuple(map(_scalar, _result))"
    elif output_shapes and output_shapes[0] == ():
        value = "_result[()] if type(_result) is _ndarray else _result"
    else:
        value = "_result"
    lines = ["def _fast(arrays):",
             f"    if len(arrays) != {len(inputs)}:",
             "        return _MISS",
             "    try:",
             *(f"        {name} = arrays[{tensor!r}]" for name, tensor in zip(names, inputs)),
             "        pass",
             "    except KeyError:",
             "        return _MISS",
             f"    if not ({' and '.join(checks) or 'True'}):",
             "        return _MISS",
             "    try:",
             f"        _result = _function({', '.join(names)})",
             "    except (NotImplementedError, OverflowError, TypeError):",
             "        return _MISS",
             f"    return {value}"]
    exec("\n".join(lines), namespace)  # noqa: S102 - generated here from input names and dtypes
    return namespace["_fast"]  # type: ignore[no-any-return]


def _scalar(value: Any) -> Any:
    """numpy's scalar type for a 0-d numpy result (what numpy returns for a full reduction)."""
    return value[()] if type(value) is np.ndarray and not value.ndim else value
