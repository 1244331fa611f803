"""Program: a parsed, checked einflow program that plans once per shape signature and then runs."""

from __future__ import annotations

import difflib
import functools
import inspect
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from einflow.engine import backends as _registry
from einflow.engine.backends import get_backend, infer_backend
from einflow.engine.memory import default_memory_limit, memory_limit_bytes
from einflow.engine.plan import Plan, build_plan
from einflow.engine.precision import is_low, narrow, widen
from einflow.engine.sparse_arrays import is_sparse
from einflow.lang import ir
from einflow.lang.check import Checked, ProgramInfo, check_names, check_program
from einflow.lang.errors import ArgumentError, EinflowError, ShapeError, TensorNameError
from einflow.lang.grammar import parse
from einflow.plan_cache import MISS, PlanCache, PlanCacheInfo, numpy_signature
from einflow.report import PlanReport

__all__ = ["Program", "PlanCache", "PlanCacheInfo", "compile", "evaluate", "default_memory_limit"]

#: backend name -> how a program runs on that framework's arrays, inside its autodiff (torch autograd, jax's
#: custom_jvp): einflow.frameworks registers its runners here when einflow is imported
FRAMEWORK_CALLS: dict[str, Callable[[Program, list[Any], str, Any, Any], Any]] = {}

_CALL_OPTIONS = ("backend", "optimize", "memory_limit", "chunks", "slicing")
_PLAN_OPTIONS = ("optimize", "backend", "itemsize", "memory_limit", "slicing")
_LIMIT_TYPES = (str, int, float, type(None))


def _signature(value: Any) -> tuple[Any, Any]:
    shape = getattr(value, "shape", None)
    if shape is None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (), type(value)
        try:
            value = np.asarray(value)
        except ValueError as error:
            raise EinflowError(f"cannot use this input as an array: {error}") from None
        return value.shape, value.dtype
    return tuple(shape), value.dtype


_UNPICKLED = ("_plans", "_constants", "__weakref__")


class Program:
    """A compiled einflow program.

    >>> import numpy as np, einflow as ef
    >>> p = ef.compile("C[i,j] = A[i,k] B[k,j]")
    >>> p(A=np.eye(2), B=np.array([[1., 2.], [3., 4.]])).tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    >>> print(p)
    C[i,j] = A[i,k] B[k,j]
    """

    __slots__ = ("ir", "source", "info", "accepts", "casts", "reads", "_plans", "_constants", "__weakref__")

    def __init__(self, program_ir: ir.ProgramIR, source: str | None = None, info: ProgramInfo | None = None) -> None:
        check_names(program_ir)  # an IR-built program (derivatives, API arguments) names things as text does
        self.ir = program_ir
        self.source = source if source is not None else ir.format_program(program_ir)
        self.info = info if info is not None else check_program(program_ir, self.source)
        self._plans: PlanCache = PlanCache()
        #: names a call may pass although this program does not read them (a derivative program accepts
        #: every input of the program it was derived from); any other unknown keyword is a TypeError
        self.accepts: frozenset[str] = frozenset()
        #: for a derivative program, per output: the input whose float dtype it has (``dL_ds = 1`` has the
        #: dtype of ``s``; float32 in, float32 out), else None (``einflow.derivatives``)
        self.casts: tuple[str | None, ...] | None = None
        #: per output: the input whose elements it only reads (a copy, transpose, shift, literal or gather:
        #: nothing added or multiplied), else None; such an output keeps a boolean input's type
        self.reads: tuple[str | None, ...] = element_reads(self.ir, self.info)

    # ------------------------------------------------------------------ pickling and the plan cache
    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps: the program (plans hold compiled closures; the receiver plans again)."""
        state = {}
        for cls in type(self).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot not in _UNPICKLED and hasattr(self, slot):
                    state[slot] = getattr(self, slot)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for slot, value in state.items():
            object.__setattr__(self, slot, value)
        self._plans = PlanCache()

    def cache_info(self) -> PlanCacheInfo:
        """How many plans (one per backend, option and input shape/dtype signature) this program holds.

        >>> import numpy as np, einflow as ef
        >>> p = ef.compile("s = w[i] w[i]")
        >>> _ = p(w=np.ones(3)); _ = p(w=np.ones(3)); _ = p(w=np.ones(4))
        >>> p.cache_info()
        PlanCacheInfo(plans=2, maxsize=64)
        """
        return PlanCacheInfo(len(self._plans), self._plans.maxsize)

    # ------------------------------------------------------------------ description
    @property
    def inputs(self) -> tuple[str, ...]:
        """Names of the tensors the program reads, in order of first use."""
        return self.info.inputs

    @property
    def outputs(self) -> tuple[str | None, ...]:
        """Names of the values returned (a tuple when the program ends with a return line)."""
        return self.info.outputs

    @property
    def checked(self) -> Checked:
        """The checked program data (IR, text, what the checker learned) that derivations take and return."""
        return Checked(self.ir, self.source, self.info)

    @property
    def text(self) -> str:
        """The program as einflow text (re-parsable)."""
        return ir.format_program(self.ir)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        text = self.text
        if "\n" in text:
            body = "\n".join("    " + line for line in text.splitlines())
            return f'einflow.compile("""\n{body}\n""")'
        return f"einflow.compile({text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and other.ir == self.ir

    def __hash__(self) -> int:
        return hash(self.ir)

    def _repr_latex_(self) -> str:
        from einflow.export.latex import to_latex

        return "$$" + to_latex(self) + "$$"

    def to_latex(self) -> str:
        """The program in index notation as LaTeX (see einflow.export.latex)."""
        from einflow.export.latex import to_latex

        return to_latex(self)

    def to_source(self, name: str = "f", target: str = "numpy") -> str:
        """Standalone Python source (numpy, torch or jax.numpy, and opt_einsum) computing this program."""
        from einflow.export.python import to_source

        return to_source(self, name, target)

    # ------------------------------------------------------------------ evaluation
    def __call__(self, /, *args: Any, **arrays: Any) -> Any:
        # (documented at _call, whose options and signature it has: the signature called last, by keyword, with
        # the default options, runs as one generated function, einflow.plan_cache.fast_call)
        plans = self._plans
        fast = plans.fast
        if fast is not None and not args and plans.fast_name == _registry._default:
            result = fast(arrays)
            if result is not MISS:
                return result
        return self._call(args, **arrays)

    def _call(self, args: tuple[Any, ...], /, backend: str | None = None, optimize: Any = "auto",
              memory_limit: float | None | str = "default", chunks: Any = None, slicing: bool = True,
              **arrays: Any) -> Any:
        """Evaluate with arrays given by keyword, by position (in ``p.inputs`` order) or in one mapping.

        Returns the program's value (a tuple for a program ending in a return line); a scalar value is a
        numpy scalar. ``backend``: ``"auto"`` (the default: from the input arrays), ``"numpy"``,
        ``"cupy"`` or ``"dask"``; ``chunks``: how the dask backend chunks numpy inputs (see
        docs/backends.md). A keyword that is neither an input nor an option is a TypeError.

        ``backend``: ``"auto"`` (the default: from the input arrays; torch tensors and jax arrays come back
        as such, see docs/frameworks.md), ``"numpy"``, ``"cupy"``, ``"dask"``, ``"torch"`` or ``"jax"``;
        ``chunks``: how the dask backend chunks numpy inputs (see docs/backends.md).
        ``memory_limit``: a contraction over it is sliced to fit (``slicing=False``: refused instead; see
        docs/backends.md).

        >>> import numpy as np, einflow as ef
        >>> p = ef.compile("y[i] = A[i,j] x[j]")
        >>> p(A=np.eye(2), x=np.array([1.0, 2.0]), backend="numpy").tolist()
        [1.0, 2.0]
        >>> p(np.eye(2), np.array([1.0, 2.0])).tolist()
        [1.0, 2.0]
        """
        plans = self._plans
        calls = plans.calls
        if calls and chunks is None and slicing is True and type(optimize) is str and \
                type(memory_limit) in _LIMIT_TYPES:
            # a repeated signature of numpy arrays and Python numbers: its plan's function straight away
            values: Any = None
            bound: Any = arrays
            if not args:
                if len(arrays) == plans.count:
                    try:
                        values = plans.take(arrays)  # type: ignore[misc]
                    except KeyError:
                        pass
            else:
                values, bound = plans.by_position(args, arrays)
            if values is not None:
                call = plans.shortcut(values, backend or _registry._default, optimize, memory_limit)
                if call is not None:
                    try:
                        result = call.function(*values)
                    except (NotImplementedError, OverflowError, TypeError):
                        result = call.plan.run(list(values))  # raises it as the general path does
                    if call.after:
                        result = self._after(result, bound if bound is not None else
                                             dict(zip(self.info.inputs, values)))
                    if call.plan.returns_tuple:
                        return tuple(map(_scalar, result))
                    return result[()] if type(result) is np.ndarray and not result.ndim else result
        inputs = self.info.inputs
        checked = bool(args) or len(arrays) != len(inputs)  # (as many keywords as inputs, all inputs: none unknown)
        if checked:
            arrays = _bind(inputs, args, arrays, _CALL_OPTIONS, "call", self.accepts)
        try:
            values = [arrays[name] for name in inputs]
        except KeyError:
            if not checked:
                _bind(inputs, (), arrays, _CALL_OPTIONS, "call", self.accepts)  # an unknown keyword first
            missing = [name for name in inputs if name not in arrays]
            raise TensorNameError(
                f"tensor {missing[0]!r} is not bound: pass it as {missing[0]}=array "
                f"(this program reads {', '.join(inputs)})") from None
        name = backend or _registry._default
        key = None
        if (name == "auto" or name == "numpy") and type(optimize) is str and chunks is None and \
                type(memory_limit) in _LIMIT_TYPES and (slicing is True or slicing is False):
            signature = numpy_signature(values)
            if signature is not None:
                key = (name, optimize, memory_limit if slicing else ("unsliced", memory_limit), signature)
        if type(memory_limit) not in _LIMIT_TYPES:
            memory_limit_bytes(memory_limit)  # an EinflowError for anything that is not a size
        if not isinstance(slicing, bool):
            raise EinflowError(f"slicing= must be True or False, not {slicing!r}")
        if any(map(is_sparse, values)):  # scipy / pydata sparse inputs: LANGUAGE.md 9.3, einflow.sparse_inputs
            from einflow import sparse_inputs

            return sparse_inputs.call(self, dict(zip(self.info.inputs, values)), name, dict(
                optimize=optimize, memory_limit=memory_limit, chunks=chunks, slicing=slicing), Program)
        values, low = widen(values)  # float16 and bfloat16 run in float32 (einflow.engine.precision)
        result = self._evaluate(values, name, optimize, memory_limit, chunks, slicing)
        if low is not None:
            result = narrow(result, low)
        finished = self._after(result, arrays)
        if key is not None and low is None:
            self._learn(key, result, finished)
        return tuple(map(_scalar, finished)) if type(finished) is tuple else _scalar(finished)

    def _after(self, result: Any, arrays: Mapping[str, Any]) -> Any:
        """The outputs in the dtypes the inputs ask for: a derivative's in its input's float type, an output that
        only reads a boolean input's elements boolean."""
        if self.casts is not None:
            result = _cast(result, self.casts, arrays)
        if any(self.reads):
            result = _kept_booleans(result, self.reads, arrays)
        return result

    def _learn(self, key: Any, result: Any, finished: Any) -> None:
        """Keep the shortcut for a numpy call of signature ``key`` that ran a plan of its own (its inputs used as
        they came): whether :meth:`_after` changed any output decides whether a repeated call needs it (always,
        where a derivative's dtype comes from an input it does not read, which the signature does not hold)."""
        outputs = result if type(result) is tuple else (result,)
        kept = finished if type(finished) is tuple else (finished,)
        after = len(outputs) != len(kept) or any(a is not b for a, b in zip(outputs, kept)) or \
            any(name is not None and name not in self.info.inputs for name in self.casts or ())  # (not in the key)
        self._plans.learn(key, after, self.info.inputs, keywords=not set(self.info.inputs) & set(_CALL_OPTIONS))

    def _evaluate(self, values: list[Any], name: str, optimize: Any, memory_limit: Any, chunks: Any,
                  slicing: bool = True) -> Any:
        """The general call: pick the backend, convert inputs once, plan (cached), run, convert results."""
        if name == "auto":
            name = infer_backend(values)
        if name in FRAMEWORK_CALLS:  # tensors in, tensors out; autograd / custom_jvp (einflow.frameworks)
            return FRAMEWORK_CALLS[name](self, values, name, optimize, memory_limit)
        engine: Any = get_backend(name)  # the dask backend adds chunks_for and check_client_memory
        # a lazy backend given its own arrays returns a lazy result (dask arrays in, dask arrays out)
        lazy = engine.lazy and any(type(value).__module__.startswith(name) for value in values)
        converted: dict[Any, Any] = {}
        for position, (tensor, value) in enumerate(zip(self.info.inputs, values)):
            spec = engine.chunks_for(tensor, chunks) if engine.lazy else None
            known = (id(value), repr(spec))  # the same array passed twice is converted once
            if known not in converted:
                try:
                    converted[known] = engine.asarray(value, spec)
                except (ValueError, TypeError) as error:
                    raise EinflowError(f"tensor {tensor!r}: cannot use this input as an array ({error})") from None
            values[position] = converted[known]
        signature = tuple(map(_signature, values))
        for tensor, (_, dtype) in zip(self.info.inputs, signature):
            if not isinstance(dtype, type) and np.dtype(dtype).kind not in "biufc":
                raise EinflowError(f"tensor {tensor!r} has dtype {dtype}; einflow computes with numbers "
                                   "(bool, int, float or complex arrays)")
        if isinstance(optimize, (str, bool)):
            optimize_key: Any = optimize
        elif isinstance(optimize, (list, tuple)):
            optimize_key = tuple(tuple(step) if isinstance(step, (list, tuple)) else step for step in optimize)
        elif getattr(type(optimize), "__hash__", None) is not None:
            optimize_key = ("object", optimize)  # a PathOptimizer: the key holds it, no later object reuses its id
        else:
            optimize_key = ("object", id(optimize))
        # dask keeps intermediates in chunks on the workers: the whole-array guard is not applied to them, but a
        # contraction over the limit is sliced into tasks
        key = (name, optimize_key, memory_limit if slicing else ("unsliced", memory_limit), signature)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build(key, name, values, optimize, memory_limit if slicing or not engine.lazy else None,
                               slicing)
        if engine.lazy:  # no task's output outgrows the inputs' largest chunk much (dask_ops.chunk_floor)
            with engine.chunk_floor(values):
                result = plan.run(values)
        else:
            result = plan.run(values)
        outputs = result if plan.returns_tuple else (result,)
        if engine.lazy and not lazy:
            limit = memory_limit_bytes(memory_limit)
            engine.check_client_memory(self.info.outputs, outputs, limit)
        if plan.returns_tuple:
            return engine.results(outputs, lazy)
        return engine.result(result, lazy)

    def _build(self, key: Any, backend_name: str, values: list[Any], optimize: Any, memory_limit: Any,
               slicing: bool = True) -> Plan:
        shapes = {}
        itemsize = 1
        for name, value in zip(self.info.inputs, values):
            shape, dtype = _signature(value)
            shapes[name] = shape
            itemsize = max(itemsize, np.dtype(dtype).itemsize if not isinstance(dtype, type) else 8)
        limit = memory_limit_bytes(memory_limit)
        floats = [v.dtype for v in values if getattr(v, "dtype", None) is not None and v.dtype.kind == "f"]
        dtypes = {name: _signature(value)[1] for name, value in zip(self.info.inputs, values)}
        plan = build_plan(self.ir, self.info, shapes, itemsize, get_backend(backend_name), optimize, limit,
                          self.source, float_dtype=np.result_type(*floats) if floats else None, dtypes=dtypes,
                          slicing=slicing)
        self._plans[key] = plan
        return plan

    def plan(self, /, *args: Any, optimize: Any = "auto", backend: str = "numpy", itemsize: int = 8,
             memory_limit: float | str | None = None, slicing: bool = True, **shapes: Any) -> PlanReport:
        """The plan for these input shapes (tuples, ``'100x200'`` strings, or arrays): steps, FLOPs, memory.

        Shapes are given like arrays to a call: by keyword, by position or in one mapping.
        ``memory_limit`` (default None: not checked): the plan a call with that limit runs, its contractions
        sliced to fit (the report shows the sliced indices, the slices and the FLOP overhead); MemoryLimitError
        when no slicing fits, or with ``slicing=False`` for any plan over the limit.

        >>> import einflow as ef
        >>> report = ef.compile("y[i] = A[i,j] B[j,k] v[k]").plan(A=(100, 200), B=(200, 300), v=(300,))
        >>> report.flops < 2 * 100 * 200 * 300
        True
        """
        if shapes or args:
            shapes = _bind(self.info.inputs, args, shapes, _PLAN_OPTIONS, "plan", self.accepts)
        if any(is_sparse(shapes.get(name)) for name in self.info.inputs):  # their nnz sets FLOPs and memory
            from einflow import sparse_inputs

            return sparse_inputs.plan(self, shapes, Program, dict(optimize=optimize, backend=backend,
                                      itemsize=itemsize, memory_limit=memory_limit, slicing=slicing))
        resolved: dict[str, tuple[int, ...]] = {}
        for name in self.info.inputs:
            if name not in shapes:
                raise TensorNameError(f"no shape given for tensor {name!r} (this program reads "
                                      f"{', '.join(self.info.inputs)})")
            resolved[name] = _parse_shape(name, shapes[name])
        limit = None if memory_limit is None else memory_limit_bytes(memory_limit)
        if not isinstance(slicing, bool):
            raise EinflowError(f"slicing= must be True or False, not {slicing!r}")
        plan = build_plan(self.ir, self.info, resolved, itemsize, get_backend(backend), optimize, limit,
                          self.source, slicing=slicing)
        return PlanReport(self.text, plan.steps, plan.output_shapes, plan.peak_bytes, limit)


def _documented_call(self: Program, /, *args: Any, backend: str | None = None, optimize: Any = "auto",
                     memory_limit: float | None | str = "default", chunks: Any = None, slicing: bool = True,
                     **arrays: Any) -> Any:
    """``Program.__call__``'s signature as help() and inspect show it (the options are ``Program._call``'s)."""


Program.__call__.__doc__ = Program._call.__doc__
Program.__call__.__signature__ = inspect.signature(_documented_call)  # type: ignore[attr-defined]


def _name(dtype: Any) -> str:
    """A dtype's name as numpy spells it (``torch.float32`` is ``float32``)."""
    return str(dtype).removeprefix("torch.")


def _kind(dtype: Any) -> str:
    """numpy's kind letter of a numpy, jax, dask or torch dtype."""
    if type(dtype).__module__.startswith("torch"):
        return "f" if dtype.is_floating_point else "c" if dtype.is_complex else "b" if _name(dtype) == "bool" else "i"
    return "f" if is_low(dtype) else np.dtype(dtype).kind  # (ml_dtypes' bfloat16 is of kind 'V' to numpy)


def element_reads(program: ir.ProgramIR, info: ProgramInfo) -> tuple[str | None, ...]:
    """Per output, the input whose elements it is, read through positions with nothing summed, added or
    multiplied (``y[b,d] = E[t[b], d]``, ``y[j,i] = x[i,j]``, ``d[i] = x[i+1]``, chains of such), else None.

    >>> element_reads(parse("y[b,d] = E[t[b], d]"), check_program(parse("y[b,d] = E[t[b], d]")))
    ('E',)
    """
    sources: dict[str, str] = {name: name for name in info.inputs}
    for statement in program.statements:
        if not isinstance(statement, ir.Assign) or statement.target is None:
            continue
        expr = statement.expr
        if not isinstance(expr, (ir.Tensor, ir.Read)) or expr.name not in sources:
            continue
        read = expr.indices
        kept = statement.indices if statement.indices is not None else tuple(
            index for index in read if sum(ir.position_indices(p).count(index) if not isinstance(p, ir.Gather)
                                           else 0 for p in getattr(expr, "positions", read)) <= 1)
        if set(read) <= set(kept):  # nothing summed
            sources[statement.target] = sources[expr.name]
    return tuple(sources.get(name) if name is not None and name not in info.inputs else None
                 for name in info.outputs)


def _kept_booleans(result: Any, reads: tuple[str | None, ...], arrays: Mapping[str, Any]) -> Any:
    """The outputs that only read a boolean input's elements, as booleans: programs compute with booleans as
    the numbers 0 and 1, but a gather, shift or copy of a boolean array is one, as numpy's and torch's are."""
    outputs = list(result) if type(result) is tuple else [result]
    for k, name in enumerate(reads):
        like = arrays.get(name) if name is not None else None
        dtype = getattr(like, "dtype", None)
        if like is None or k >= len(outputs) or (np.dtype(type(like)) if type(like) is bool else dtype) is None:
            continue
        if type(like) is not bool and _name(dtype) != "bool":
            continue
        value = outputs[k]
        if type(value).__module__.startswith("torch"):
            outputs[k] = value.bool()
        elif hasattr(value, "astype"):
            outputs[k] = value.astype(bool)
    return tuple(outputs) if type(result) is tuple else outputs[0]


def _cast(result: Any, casts: tuple[str | None, ...], arrays: Mapping[str, Any]) -> Any:
    """Each output of a derivative program in the float dtype of the input it is taken by, as jax gives it:
    float32 in, float32 out, where a constant of the derivative (an integer count, ``dL_ds = 1``) or a float64
    one would make it wider. A complex derivative by a real input is its real part (the derivative along the
    real axis, as torch gives it); a real one by a complex input stays real."""
    outputs = list(result) if type(result) is tuple else [result]
    for k, name in enumerate(casts):
        like = arrays.get(name) if name is not None else None
        dtype: Any = np.dtype(type(like)) if type(like) in (float, complex) else getattr(like, "dtype", None)
        if dtype is None or k >= len(outputs) or _kind(dtype) not in "fc":
            continue
        value = outputs[k]
        own = getattr(value, "dtype", None)
        own = own if own is not None else np.result_type(value)
        if _kind(own) == "c" and _kind(dtype) == "f":  # by a real input: the real part (LANGUAGE.md 9.2, as torch)
            value = outputs[k] = value.real
            own = getattr(value, "dtype", None)
            own = own if own is not None else np.result_type(value)
        if _name(own) == _name(dtype) or not (_kind(own) in "biu" or _kind(own) == _kind(dtype)):
            continue
        module = type(like).__module__.split(".")[0]
        if type(value).__module__.startswith("torch"):
            import torch

            outputs[k] = value.to(getattr(torch, _name(dtype)))
        elif module == "torch":
            import torch

            outputs[k] = torch.as_tensor(np.asarray(value), dtype=dtype, device=getattr(like, "device", None))
        elif module in ("jax", "jaxlib") and type(value).__module__.startswith("numpy"):
            import jax.numpy as jnp

            outputs[k] = jnp.asarray(value, dtype=dtype)
        elif hasattr(value, "astype"):
            outputs[k] = value.astype(dtype)
        else:
            outputs[k] = np.asarray(value, dtype=dtype)
    return tuple(outputs) if type(result) is tuple else outputs[0]


def _scalar(value: Any) -> Any:
    """numpy's scalar type for a 0-d numpy result (what numpy returns for a full reduction)."""
    return value[()] if type(value) is np.ndarray and not value.ndim else value


def _bind(inputs: tuple[str, ...], args: tuple[Any, ...], keywords: dict[str, Any], options: tuple[str, ...],
          what: str, accepts: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Input name -> value from positional values (in ``inputs`` order, or one mapping) and keywords.

    Entries of a mapping the program does not read are ignored; a keyword must be an input or an option.
    """
    names = frozenset(inputs)
    for keyword in keywords:
        if keyword not in names and keyword not in accepts:
            _unexpected(keyword, inputs, options, what)
    if not args:
        return keywords
    if len(args) == 1 and isinstance(args[0], Mapping):
        return {**args[0], **keywords}
    if len(args) > len(inputs):
        raise ArgumentError(f"{what}() takes {len(inputs)} positional input(s) ({', '.join(inputs)}) but "
                            f"{len(args)} were given")
    bound = dict(zip(inputs, args))
    for keyword in keywords:
        if keyword in bound:
            raise ArgumentError(f"{what}() got input {keyword!r} both by position and by keyword")
    bound.update(keywords)
    return bound


def _unexpected(keyword: str, inputs: tuple[str, ...], options: tuple[str, ...], what: str) -> None:
    """Raise the TypeError for a keyword that is neither an input nor an option, with a close match."""
    close = difflib.get_close_matches(keyword, [*inputs, *options], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(inputs) if inputs else "none"
    raise ArgumentError(f"{what}() got an unexpected keyword {keyword!r}{hint} (this program reads {listed}; "
                        f"the options are {', '.join(options)})")


def _parse_shape(name: str, shape: Any) -> tuple[int, ...]:
    dims = _read_shape(name, shape)
    for size in dims:
        if not 0 <= size < 2**63:
            raise ShapeError(f"shape {shape!r} for {name}: sizes are integers from 0 to 2**63 - 1, not {size}")
    return dims


def _read_shape(name: str, shape: Any) -> tuple[int, ...]:
    if hasattr(shape, "shape"):
        return tuple(shape.shape)
    if isinstance(shape, str):
        text = shape.strip()
        if text in ("", "()", "scalar"):
            return ()
        try:
            return tuple(int(part) for part in text.lower().split("x"))
        except ValueError:
            raise EinflowError(f"cannot read shape {shape!r} for {name}: write it like 100x200") from None
    if isinstance(shape, int) and not isinstance(shape, bool):
        return (shape,)
    try:
        return tuple(operator.index(n) for n in shape)
    except (TypeError, ValueError):
        raise EinflowError(f"cannot read shape {shape!r} for {name}: give a tuple like (100, 200), a string "
                           "like '100x200', or an array") from None


@functools.lru_cache(maxsize=256)
def _compile_text(text: str) -> Program:
    return Program(parse(text), text)


def compile(text: str | Program) -> Program:  # noqa: A001 - the natural name
    """Parse and check einflow text; the result is cached by text.

    >>> import einflow as ef
    >>> ef.compile("f = x[i] x[i]").inputs
    ('x',)
    """
    if isinstance(text, Program):
        return text
    if not isinstance(text, str):
        raise EinflowError(f"expected einflow text or a Program, got {type(text).__name__}")
    return _compile_text(text)


def evaluate(text: str, mapping: Mapping[str, Any] | None = None, /, **arrays: Any) -> Any:
    """Compile and run in one call.

    >>> import numpy as np, einflow as ef
    >>> float(ef.evaluate("s = x[i] x[i]", x=np.array([3.0, 4.0])))
    25.0
    """
    return compile(text)(mapping, **arrays) if mapping is not None else compile(text)(**arrays)
