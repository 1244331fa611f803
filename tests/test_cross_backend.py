"""Cross-backend differential test: every backend gives numpy's answer, values and dtypes.

Random programs (tests/randprog.py) and one derivative of each (by rotation: grad, jacobian, hessian,
jvp, vjp) run on the numpy backend; the same programs run on torch tensors, jax arrays and dask arrays
(chunked by 2, so a size-3 axis has uneven chunks), and the ``to_source`` code of every target
(numpy, torch, jax) runs standalone. Each result must have numpy's shape and dtype and numpy's values
(to rounding: summation orders differ between libraries). Every few seeds the inputs change family:
float32 arrays, 0-d inputs passed as Python numbers, integer arrays (on programs whose functions take
any real), so the dtype rules are exercised as well as the values.

Environment: ``EINFLOW_CROSS_BACKEND=N`` runs N programs (default 150, every 10th of them on jax: about
50 s of one core; with the variable set every program runs on jax too);
``EINFLOW_CROSS_BACKEND_START`` the first seed. ``python tests/test_cross_backend.py START COUNT`` prints
every failure instead of stopping at the first.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
if __name__ == "__main__":  # run as a script: this checkout's einflow, as under pytest
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import randprog  # noqa: E402

import einflow as ef  # noqa: E402

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
da = pytest.importorskip("dask.array")
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
import jax.numpy as jnp  # noqa: E402

COUNT = int(os.environ.get("EINFLOW_CROSS_BACKEND", "150"))
#: jax compiles each operation for each new shape (70 ms apiece, four fifths of the run): in the default run
#: every 10th program runs on jax and every 10th (another) runs its exported jax code; long runs run all
JAX_EVERY = 1 if "EINFLOW_CROSS_BACKEND" in os.environ else 10
START = int(os.environ.get("EINFLOW_CROSS_BACKEND_START", "0"))
LIMIT = 1e6  # programs whose numpy values exceed this (or are not finite) are not compared: ill-conditioned
#: functions defined for every real argument (integer inputs are drawn only for programs using these alone)
_ANY_REAL = {"exp", "sin", "cos", "tanh", "sigmoid", "abs", "relu", "sign", "step", "erf", "softplus"}
DERIVATIVES = ("grad", "jacobian", "hessian", "jvp", "vjp")


def family(seed: int) -> str:
    """The inputs' family for a seed: float64 mostly, float32, Python numbers for 0-d inputs, integers."""
    return ("float64", "float32", "float64", "scalars", "float64", "integers")[seed % 6]


def _functions(text: str) -> set[str]:
    return {name for name in (*randprog.FUNCTIONS, "erf", "softplus", "log1p", "log", "sqrt") if name + "(" in text}


def inputs(case: randprog.Case, seed: int) -> dict[str, Any] | None:
    """The case's inputs in its family (None: the family does not fit this program)."""
    arrays: dict[str, Any] = randprog.make_arrays(case.program, seed)
    kind = family(seed)
    if kind == "float32":
        return {name: value.astype(np.float32) for name, value in arrays.items()}
    if kind == "scalars":
        if not any(value.ndim == 0 for value in arrays.values()):
            return None
        return {name: float(value) if value.ndim == 0 else value for name, value in arrays.items()}
    if kind == "integers":
        if not _functions(case.text) <= _ANY_REAL or "^" in case.text or "/" in case.text or "det[" in case.text \
                or "inv[" in case.text:  # (random integer matrices are singular or ill-conditioned)
            return None
        rng = np.random.default_rng(seed)
        return {name: rng.integers(1 if name in case.program.positive else -3, 4, size=value.shape,
                                   dtype=(np.int8, np.int32, np.int64)[seed % 3]) for name, value in arrays.items()}
    return arrays


def tolerance(values: dict[str, Any]) -> float:
    return 2e-4 if any(getattr(v, "dtype", None) == np.float32 for v in values.values()) else 1e-7


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if hasattr(value, "compute"):
        value = value.compute()
    return np.asarray(value)


def _dtype(value: Any) -> Any:
    """The dtype of a result (a Python number's type for weak results)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return type(value)
    return _numpy(value).dtype


def mismatch(got: Any, want: Any, rtol: float, exact_dtype: bool = True) -> str | None:
    """None when ``got`` is numpy's ``want`` (dtype, shape, values to rtol), else what differs."""
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"got {type(got).__name__}, expected a tuple of {len(want)}"
        for g, w in zip(got, want):
            found = mismatch(g, w, rtol, exact_dtype)
            if found:
                return found
        return None
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        # a weak Python number from numpy: a 0-d result of Python's float/int type elsewhere
        want_dtype = np.dtype(np.float64 if isinstance(want, float) else np.int64)
    else:
        want_dtype = np.asarray(want).dtype
    array = _numpy(got)
    if exact_dtype and array.dtype != want_dtype:
        return f"dtype {array.dtype}, numpy gives {want_dtype}"
    want_array = np.asarray(want)
    if array.shape != want_array.shape:
        return f"shape {array.shape}, numpy gives {want_array.shape}"
    scale = float(np.max(np.abs(want_array))) if want_array.size else 0.0
    if not np.allclose(array.astype(np.complex128), want_array.astype(np.complex128), rtol=rtol,
                       atol=rtol * (1 + scale), equal_nan=True):
        return f"values\n    {array!r}\n  numpy gives\n    {want_array!r}"
    return None


def on_backend(values: dict[str, Any], backend: str) -> dict[str, Any]:
    """The inputs as the backend's own arrays (Python numbers stay Python numbers)."""
    converted = {}
    for name, value in values.items():
        if not isinstance(value, np.ndarray):
            converted[name] = value
        elif backend == "torch":
            converted[name] = torch.from_numpy(value)
        elif backend == "jax":
            converted[name] = jnp.asarray(value)
        else:
            converted[name] = da.from_array(value, chunks=2)
    return converted


def derivative(case: randprog.Case, program: ef.Program, seed: int) -> tuple[str, ef.Program] | None:
    """One derivative program by rotation over the seeds (None when the rotation's kind does not apply)."""
    kind = DERIVATIVES[(seed // 6) % len(DERIVATIVES)]
    wrt = case.wrt[0]
    if kind in ("grad", "hessian") and not case.scalar:
        kind = "jacobian"
    if kind == "grad":
        return kind, ef.grad(program, wrt)
    if kind == "hessian":
        return kind, ef.hessian(program, wrt)
    if kind == "jacobian":
        return kind, ef.jacobian(program, wrt)
    if kind == "jvp":
        return kind, ef.jvp(program, wrt)
    return kind, ef.vjp(program, wrt)


def extras(kind: str, derived: ef.Program, values: dict[str, Any], wrt: str, value_shape: tuple[int, ...],
           seed: int) -> dict[str, Any]:
    """``values`` with a jvp's tangent (the shape of ``wrt``) or a vjp's cotangent (the value's shape)."""
    rng = np.random.default_rng(seed + 1)
    dtype = np.float32 if any(getattr(v, "dtype", None) == np.float32 for v in values.values()) else np.float64
    complete = dict(values)
    for name in derived.inputs:
        if name not in complete:
            shape = np.shape(values[wrt]) if kind == "jvp" else value_shape
            complete[name] = rng.uniform(-1, 1, shape).astype(dtype)
    return complete


def _generate(seed: int) -> randprog.Case:
    """The seed's program, shifted, strided, constant and gathered reads included (as the differential test
    draws them; EINFLOW_DIFF_LANGUAGE=v2 draws the programs of before)."""
    return randprog.generate(seed)


def check(seed: int) -> str | None:
    """None when every backend and every exported source gives numpy's answer for seed's program."""
    case = _generate(seed)
    values = inputs(case, seed)
    if values is None:
        return None
    try:
        program = ef.compile(case.text)
    except ef.EinflowError as error:
        return f"the generated program does not compile: {error}"
    rtol = tolerance(values)
    programs: list[tuple[str, ef.Program, dict[str, Any]]] = [("value", program, values)]
    try:
        found = derivative(case, program, seed)
    except ef.EinflowError:
        found = None
    value_shape: tuple[int, ...] = ()
    while programs:
        kind, compiled, given = programs.pop(0)
        given = {name: given[name] for name in compiled.inputs}
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                want = compiled(**given, backend="numpy")
            except ef.EinflowError:
                continue  # refused on numpy (e.g. a dtype numpy refuses): the others are checked by the unit tests
        if kind == "value" and found is not None:
            value_shape = np.shape(want[0] if isinstance(want, tuple) else want)
            derived_kind, derived = found
            programs.append((derived_kind, derived,
                             extras(derived_kind, derived, values, case.wrt[0], value_shape, seed)))
        wants = want if isinstance(want, tuple) else (want,)
        if any(not np.all(np.isfinite(_numpy(w))) or np.max(np.abs(_numpy(w)), initial=0) > LIMIT for w in wants):
            continue
        if not well_conditioned(compiled, given, want, rtol, seed):
            continue  # numpy's answer is not stable to rtol: there is nothing to compare with
        for backend in ("torch", "jax", "dask"):
            if backend == "jax" and seed % JAX_EVERY:
                continue
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                try:
                    got = compiled(**on_backend(given, backend))
                    if backend == "dask":  # computed here: a dask graph raises when it runs
                        got = tuple(map(_numpy, got)) if isinstance(got, tuple) else _numpy(got)
                except Exception as error:  # noqa: BLE001 - any difference is the finding
                    return f"{kind} on {backend}: {type(error).__name__}: {error}"
            found_difference = mismatch(got, want, rtol)
            if found_difference:
                return f"{kind} on {backend}: {found_difference}"
        if kind != "value":
            continue
        for target in ("numpy", "torch", "jax"):
            if target == "jax" and (seed + 2) % JAX_EVERY:
                continue
            source = compiled.to_source("f", target=target)
            namespace: dict[str, Any] = {}
            exec(compile(source, f"<to_source {target}>", "exec"), namespace)  # noqa: S102 - einflow's own output
            arrays = given if target == "numpy" else on_backend(given, target)
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                try:
                    got = namespace["f"](**arrays)
                except Exception as error:  # noqa: BLE001
                    return f"to_source(target={target!r}): {type(error).__name__}: {error}"
            # exported code is shape-generic: its dtypes follow the target library's own rules for 0-d values
            found_difference = mismatch(got, want, rtol, exact_dtype=target == "numpy" and family(seed) != "scalars")
            if found_difference:
                return f"to_source(target={target!r}): {found_difference}"
    return None


def well_conditioned(compiled: ef.Program, given: dict[str, Any], want: Any, rtol: float, seed: int) -> bool:
    """Whether numpy's own answer is stable enough to compare the other backends with, to ``rtol``.

    float32 inputs: numpy's float32 answer must be its float64 answer (seed 5605: a vjp whose two terms cancel
    exactly, so the float32 result is rounding noise of size 35 on a value of 5e8). float64 inputs: the answer
    must not move when the inputs move by a relative 1e-11 (seed 5163: cos of an argument near 1e12, where the
    last bits of the argument decide the value). Integer inputs are exact and always compared."""
    rng = np.random.default_rng(seed + 2)
    floating = {name: value for name, value in given.items()
                if isinstance(value, float) or (isinstance(value, np.ndarray) and value.dtype.kind == "f")}
    if not floating:
        return True
    if family(seed) == "float32":
        moved = {name: np.asarray(value, np.float64) for name, value in floating.items()}
    else:
        moved = {name: value * (1 + 1e-11 * rng.uniform(-1, 1, np.shape(value))) for name, value in floating.items()}
        moved = {name: float(value) if isinstance(given[name], float) else value for name, value in moved.items()}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            other = compiled(**{**given, **moved}, backend="numpy")
        except ef.EinflowError:
            return False
    return mismatch(want, other, rtol, exact_dtype=False) is None


def _report(seed: int, problem: str) -> str:
    case = _generate(seed)
    program = "\n".join("    " + line for line in case.text.splitlines())
    return (f"seed {seed} ({family(seed)} inputs):\n{program}\n  {problem}\n"
            f"  replay: EINFLOW_CROSS_BACKEND_START={seed} EINFLOW_CROSS_BACKEND=1 "
            ".venv/bin/python -m pytest tests/test_cross_backend.py -q")


def test_random_programs_agree_on_every_backend() -> None:
    failures = []
    for seed in range(START, START + COUNT):
        problem = check(seed)
        if problem is not None:
            failures.append(_report(seed, problem))
            break
    assert not failures, failures[0]


if __name__ == "__main__":  # python tests/test_cross_backend.py START COUNT: every failure, then a count
    first, count = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (START, COUNT)
    failed = 0
    for seed in range(first, first + count):
        problem = check(seed)
        if problem is not None:
            failed += 1
            print(_report(seed, problem), flush=True)
        if (seed - first + 1) % 50 == 0:
            print(f"{seed - first + 1} programs, {failed} differ (seeds {first}..{seed})", flush=True)
    print(f"{failed} of {count} programs differ between backends")
