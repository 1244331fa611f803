"""Program: a parsed, checked einflow program that plans once per shape signature and then runs."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from einflow import ir
from einflow.backends import get_backend, get_default_backend, infer_backend
from einflow.check import ProgramInfo, check_program
from einflow.errors import EinflowError, TensorNameError
from einflow.grammar import parse
from einflow.plan import Plan, build_plan
from einflow.report import PlanReport

__all__ = ["Program", "compile", "evaluate", "default_memory_limit"]

_OPTIONS = ("backend", "optimize", "memory_limit")


@functools.lru_cache(maxsize=1)
def default_memory_limit() -> int:
    """Bytes one intermediate may take by default: 90% of the memory available when first asked."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        available = 8 << 30
    return int(available * 0.9)


def _signature(value: Any) -> tuple[Any, Any]:
    shape = getattr(value, "shape", None)
    if shape is None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (), type(value)
        value = np.asarray(value)
        return value.shape, value.dtype
    return tuple(shape), value.dtype


class Program:
    """A compiled einflow program.

    >>> import numpy as np, einflow as ef
    >>> p = ef.compile("C[i,j] = A[i,k] B[k,j]")
    >>> p(A=np.eye(2), B=np.array([[1., 2.], [3., 4.]])).tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    >>> print(p)
    C[i,j] = A[i,k] B[k,j]
    """

    __slots__ = ("ir", "source", "info", "_plans", "_constants", "__weakref__")

    def __init__(self, program_ir: ir.ProgramIR, source: str | None = None, info: ProgramInfo | None = None) -> None:
        self.ir = program_ir
        self.source = source if source is not None else ir.format_program(program_ir)
        self.info = info if info is not None else check_program(program_ir, self.source)
        self._plans: dict[Any, Plan] = {}

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

    def to_source(self, name: str = "f") -> str:
        """Standalone Python source (numpy + opt_einsum only) computing this program."""
        from einflow.export.python import to_source

        return to_source(self, name)

    # ------------------------------------------------------------------ evaluation
    def __call__(self, mapping: Mapping[str, Any] | None = None, /, *, backend: str | None = None,
                 optimize: Any = "auto", memory_limit: float | None | str = "default", **arrays: Any) -> Any:
        """Evaluate with arrays given by keyword or in a mapping; returns the program's value."""
        if mapping is not None:
            arrays = {**mapping, **arrays}
        try:
            values = [arrays[name] for name in self.info.inputs]
        except KeyError:
            missing = [name for name in self.info.inputs if name not in arrays]
            raise TensorNameError(
                f"tensor {missing[0]!r} is not bound: pass it as {missing[0]}=array "
                f"(this program reads {', '.join(self.info.inputs)})") from None
        name = backend or get_default_backend()
        if name == "auto":
            name = infer_backend(values)
        key = (name, optimize if isinstance(optimize, (str, bool)) else id(optimize), memory_limit,
               tuple(map(_signature, values)))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build(key, name, values, optimize, memory_limit)
        engine = plan.backend
        if name != "numpy" or not all(type(v) is np.ndarray for v in values):
            values = [engine.asarray(v) for v in values]
        result = plan.run(values)
        if name != "numpy":
            native = all(type(v).__module__.split(".")[0] == name.split("_")[0] or isinstance(v, (int, float))
                         for v in arrays.values() if v is not None)
            if plan.returns_tuple:
                return tuple(engine.result(r, native) for r in result)
            return engine.result(result, native)
        return result

    def _build(self, key: Any, backend_name: str, values: list[Any], optimize: Any, memory_limit: Any) -> Plan:
        shapes = {}
        itemsize = 1
        for name, value in zip(self.info.inputs, values):
            shape, dtype = _signature(value)
            shapes[name] = shape
            itemsize = max(itemsize, np.dtype(dtype).itemsize if not isinstance(dtype, type) else 8)
        limit = default_memory_limit() if memory_limit == "default" else memory_limit
        plan = build_plan(self.ir, self.info, shapes, itemsize, get_backend(backend_name), optimize, limit,
                          self.source)
        self._plans[key] = plan
        return plan

    def plan(self, mapping: Mapping[str, Any] | None = None, /, *, optimize: Any = "auto",
             backend: str = "numpy", itemsize: int = 8, **shapes: Any) -> PlanReport:
        """The plan for these input shapes (tuples, ``'100x200'`` strings, or arrays): steps, FLOPs, memory.

        >>> import einflow as ef
        >>> report = ef.compile("y[i] = A[i,j] B[j,k] v[k]").plan(A=(100, 200), B=(200, 300), v=(300,))
        >>> report.flops < 2 * 100 * 200 * 300
        True
        """
        if mapping is not None:
            shapes = {**mapping, **shapes}
        resolved: dict[str, tuple[int, ...]] = {}
        for name in self.info.inputs:
            if name not in shapes:
                raise TensorNameError(f"no shape given for tensor {name!r} (this program reads "
                                      f"{', '.join(self.info.inputs)})")
            resolved[name] = _parse_shape(name, shapes[name])
        plan = build_plan(self.ir, self.info, resolved, itemsize, get_backend(backend), optimize, None, self.source)
        return PlanReport(self.text, plan.steps, plan.output_shapes)


def _parse_shape(name: str, shape: Any) -> tuple[int, ...]:
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
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(n) for n in shape)


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
    return compile(text)(mapping, **arrays)
