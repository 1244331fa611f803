"""Differential testing: random programs (tests/randprog.py) checked against an independent float64 reference.

Each random program is compiled and run, and its value compared with tests/randprog.py's evaluator, which
implements the language rules directly; einflow's printing of it must re-parse to the same value. Then its
``grad`` (one and several ``wrt``), ``value_and_grad``, ``jacobian`` in both modes, ``hessian``, ``vjp``, ``jvp`` and
``hvp`` are compared with exact float64 derivatives of that evaluator (forward-mode jets, ``randprog.Jet``; checked
against JAX ``jacrev``/``hessian`` in ``test_jet_reference_agrees_with_jax``), and every derivative program
is printed, re-parsed and run again. Any exception that is not an EinflowError fails, and so does an
EinflowError on a program the generator made (the generator only makes valid programs).

Every 8th seed also draws a tensor network (``randprog.generate_network``: rings, chains and random graphs
whose products have several varying factors, so gradients go through the shared-adjoint split of
``einflow/derive/tree.py``), with its own rotation of derivative checks.

By default each program gets one derivative check, by rotation over the seeds (the whole run then
takes about 2.5 minutes of one core); the failure message gives the seed, the program, what was
expected and what came out, and a one-line replay command.

Environment:

* ``EINFLOW_DIFF_N``: how many programs (default 2000); ``EINFLOW_DIFF_START``: first seed (default 0);
* ``EINFLOW_DIFF_SEED=1234``: replay one seed with every check, printing each program;
* ``EINFLOW_DIFF_LANGUAGE=v1``: programs without the reductions (max, min, mean, logsumexp), normalisers
  (softmax, log_softmax, argmax, argmin) and functions (maximum, minimum, erf, softplus) added in language v2;
* language v3: also reads through shifted, strided, constant and gathered positions
  (``x[i+1]``, ``x[2*i+1]``, ``X[2,i]``, ``E[ix1[b],d]`` with integer positions inside the axis; LANGUAGE.md
  8.2), drawn for about one new input in eight from a stream of their own; ``EINFLOW_DIFF_LANGUAGE=v2``
  leaves them out (the programs each seed drew before);
* language v4 (the default): also ``inv``/``det``/``logdet`` (LANGUAGE.md 8.1) of square inputs, some declared
  ``spd`` or ``symmetric``, as scalar factors of products (``logdet[a,b](M[a,b])``, ``u[a] inv[a,b](M[b,a]) w[b]``,
  ``inv[a,b](M[a,b] + 0.5 delta[a,b]) B[a,b]``), drawn for about one product in sixteen from a stream of their
  own (one program in five has one); the matrices are well conditioned (condition number below about 5:
  randprog.well_conditioned_matrix, and a shift only where the eigenvalues are positive), derivatives are not
  taken by a declared matrix; ``EINFLOW_DIFF_LANGUAGE=v3`` leaves them out (the programs each seed drew before);
* ``EINFLOW_DIFF_CHECKS=all``: every derivative check on every program (the long run:
  ``EINFLOW_DIFF_N=20000 EINFLOW_DIFF_CHECKS=all``);
* ``EINFLOW_DIFF_REFERENCE=jax``: JAX float64 as the reference for every program (slow: XLA compiles
  each operation; central differences when JAX is missing).

Command line (no pytest): ``python tests/test_differential.py START COUNT`` prints every failure;
``python tests/test_differential.py --shrink SEED [CHECK]`` prints a smaller program failing the same way.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import randprog  # noqa: E402

import einflow as ef  # noqa: E402

try:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
except ImportError:  # pragma: no cover - `make test` installs jax; central differences otherwise
    jax = None
    jnp = None

RTOL = 1e-7
ATOL = 1e-9  # times (1 + the largest reference entry)
_REPLAY = os.environ.get("EINFLOW_DIFF_SEED")
USE_JAX = os.environ.get("EINFLOW_DIFF_REFERENCE", "jets") == "jax"
CHECKS = os.environ.get("EINFLOW_DIFF_CHECKS", "rotate")  # "all": every derivative check on every program
SCALAR_CHECKS = ("grad", "value_and_grad", "hessian", "jacobian(forward)", "jacobian(reverse)", "vjp", "jvp", "hvp",
                 "hessian_diagonal", "laplacian")
TENSOR_CHECKS = ("jacobian(forward)", "jacobian(reverse)", "vjp", "jvp")
# one check per program by default (the Hessian is the costliest, so it comes round less often)
SCALAR_ROTATION = ("grad", "value_and_grad", "hessian", "jacobian(forward)", "grad", "jacobian(reverse)", "vjp",
                   "jvp", "hvp", "hessian_diagonal", "laplacian")
LIMIT = 1e6  # programs whose reference values exceed this are skipped (badly conditioned, not wrong)
# sin/cos of an argument this large: the argument's own rounding (1e-13 relative after a few operations)
# moves the value by more than the tolerance, so two correct evaluations need not agree
PERIODIC_LIMIT = 1e4


@dataclass
class Failure:
    seed: int
    check: str
    detail: str
    text: str
    wrt: list[str]

    def __str__(self) -> str:
        program = "\n".join("    " + line for line in self.text.splitlines())
        return (f"seed {self.seed}: {self.check} (wrt={self.wrt})\n{program}\n  {self.detail}\n"
                f"  replay: EINFLOW_DIFF_SEED={self.seed} .venv/bin/python -m pytest tests/test_differential.py -q")


class _Skip(Exception):
    """The reference itself is not finite or is huge: the program says nothing."""


def _close(got: Any, expected: Any) -> str | None:
    """None when ``got`` matches ``expected``; otherwise a short description of the difference."""
    got = np.asarray(got, dtype=np.float64) if not isinstance(got, tuple) else got
    expected = np.asarray(expected, dtype=np.float64)
    if isinstance(got, tuple) or got.shape != expected.shape:
        shape = tuple(np.shape(g) for g in got) if isinstance(got, tuple) else got.shape
        return f"shape {shape}, expected {expected.shape}"
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    if np.allclose(got, expected, rtol=RTOL, atol=ATOL * (1 + scale), equal_nan=False):
        return None
    return f"expected {np.array2string(expected, precision=6)}\n  got      {np.array2string(got, precision=6)}"


class _Reference:
    """Reference value and derivatives of one program, from the independent evaluator in randprog.

    By default exact forward-mode jets in numpy float64 (randprog.Jet); with EINFLOW_DIFF_REFERENCE=jax,
    JAX float64 (jacrev, hessian); without JAX and with that setting, central differences.
    """

    def __init__(self, case: randprog.Case, arrays: dict[str, np.ndarray]) -> None:
        self.case = case
        self.arrays = arrays
        randprog.PERIODIC_ARGUMENT[0] = 0.0
        randprog.NORMALISED_ARGUMENT[0] = 0.0
        randprog.NEAR_TIE[0] = False
        self.value = np.asarray(randprog.evaluate(case.program, arrays, np))
        _finite(self.value)
        if randprog.PERIODIC_ARGUMENT[0] > PERIODIC_LIMIT:  # rounding of the argument decides the value
            raise _Skip
        if randprog.NORMALISED_ARGUMENT[0] > LIMIT:  # logits of a million: derivatives cancel beyond float64
            raise _Skip
        if randprog.NEAR_TIE[0]:  # rounding decides an argmax/argmin indicator (symmetric or cancelling bodies)
            raise _Skip
        self._jacobians: list[np.ndarray] | None = None
        self._hessian: list[np.ndarray] | None = None

    def function(self, *wrt_values: Any) -> Any:
        arrays: dict[str, Any] = dict(self.arrays)
        arrays.update(zip(self.case.wrt, wrt_values))
        return randprog.evaluate(self.case.program, arrays, np if jnp is None else jnp)

    def _jets(self, second: bool) -> None:
        _, jacobians, hessians = randprog.jet_derivatives(self.case.program, self.arrays, self.case.wrt, second)
        for block in jacobians + hessians:
            _finite(block)  # raises _Skip before anything is kept
        self._jacobians = jacobians
        if second:
            self._hessian = hessians

    def jacobians(self) -> list[np.ndarray]:
        """d value / d x for each wrt x: shape value.shape + x.shape."""
        if self._jacobians is None:
            args = [self.arrays[x] for x in self.case.wrt]
            if not USE_JAX:
                self._jets(second=False)
            elif jax is not None:
                result = jax.jacrev(self.function, argnums=tuple(range(len(args))))(*args)
                self._jacobians = [np.asarray(r) for r in result]
            else:  # pragma: no cover
                self._jacobians = [_central(self.function, args, k) for k in range(len(args))]
            for jac in self._jacobians:
                if not np.all(np.isfinite(jac)) or np.max(np.abs(jac), initial=0) > LIMIT:
                    self._jacobians = None
                    raise _Skip
        return self._jacobians

    def hessian_blocks(self) -> list[np.ndarray]:
        if self._hessian is None:
            args = [self.arrays[x] for x in self.case.wrt]
            n = len(args)
            if not USE_JAX:
                self._jets(second=True)
            elif jax is not None:
                result = jax.hessian(self.function, argnums=tuple(range(n)))(*args)
                self._hessian = [np.asarray(result[a][b]) for a in range(n) for b in range(n)]
            else:  # pragma: no cover
                blocks = []
                for a in range(n):
                    def gradient(*values: Any, a: int = a) -> Any:
                        return _central(self.function, list(values), a)
                    for b in range(n):
                        blocks.append(_central(gradient, args, b))
                self._hessian = blocks
            assert self._hessian is not None
            for block in self._hessian:
                if not np.all(np.isfinite(block)) or np.max(np.abs(block), initial=0) > LIMIT:
                    self._hessian = None
                    raise _Skip
        return self._hessian


def _finite(array: np.ndarray) -> None:
    if not np.all(np.isfinite(array)) or np.max(np.abs(array), initial=0) > LIMIT:
        raise _Skip


def _central(function: Callable[..., Any], args: list[np.ndarray], k: int, h: float = 1e-6) -> np.ndarray:
    """d function / d args[k] by central differences (shape value.shape + args[k].shape)."""
    base = np.asarray(function(*args))
    out = np.zeros(base.shape + args[k].shape)
    for position in np.ndindex(args[k].shape):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[k][position] += h
        minus[k][position] -= h
        out[(...,) + position] = (np.asarray(function(*plus)) - np.asarray(function(*minus))) / (2 * h)
    return out


def _as_list(result: Any, count: int) -> list[Any]:
    if count == 1 and not isinstance(result, tuple):
        return [result]
    return list(result) if isinstance(result, tuple) else [result]


class _Checker:
    def __init__(self, case: randprog.Case, verbose: bool = False, only: str | None = None) -> None:
        self.case = case
        self.verbose = verbose
        self.only = only
        self.failures: list[Failure] = []
        self.arrays = randprog.make_arrays(case.program, case.seed)

    def fail(self, check: str, detail: str) -> None:
        self.failures.append(Failure(self.case.seed, check, detail, self.case.text, list(self.case.wrt)))

    def run(self, check: str, build: Callable[[], Any], expected: Callable[[], list[np.ndarray]],
            inputs: dict[str, Any] | None = None, pair: bool = False) -> None:
        """Build a derivative program, run it, compare; then print, re-parse and run it again."""
        try:
            program = build()
        except ef.EinflowError as error:
            self.fail(check, f"raised {type(error).__name__} building it: {_short(error)}")
            return
        except Exception as error:  # noqa: BLE001 - a raw exception is the finding
            self.fail(check, f"raw {type(error).__name__} building it: {_short(error)}{_where(error)}")
            return
        try:
            want = expected()
        except _Skip:
            return
        inputs = self.arrays if inputs is None else inputs
        results = self._call(check, program, inputs, pair)
        if results is None:
            return
        if self.verbose:
            print(f"--- {check}\n{program}")
        before = len(self.failures)
        self._compare(check, program, results, want)
        if len(self.failures) == before:
            self._reparse(check, program, results, inputs)

    def _call(self, check: str, program: Any, inputs: dict[str, Any], pair: bool) -> list[Any] | None:
        try:
            result = program(inputs)
        except ef.EinflowError as error:
            self.fail(check, f"raised {type(error).__name__} running it: {_short(error)}\n"
                      f"  program:\n{_indent(program)}")
            return None
        except Exception as error:  # noqa: BLE001
            self.fail(check, f"raw {type(error).__name__} running it: {_short(error)}{_where(error)}\n"
                      f"  program:\n{_indent(program)}")
            return None
        return _flatten_vag(result) if pair else _as_list(result, len(self.case.wrt))

    def _compare(self, check: str, program: Any, results: list[Any], want: list[np.ndarray]) -> None:
        if len(results) != len(want):
            self.fail(check, f"{len(results)} results, expected {len(want)}\n  program:\n{_indent(program)}")
            return
        for k, (got, expected) in enumerate(zip(results, want)):
            problem = _close(got, expected)
            if problem:
                label = f"[{k}] " if len(want) > 1 else ""
                self.fail(check, f"{label}{problem}\n  program:\n{_indent(program)}")
                return

    def _reparse(self, check: str, program: Any, results: list[Any], inputs: dict[str, Any]) -> None:
        text = str(program)
        try:
            again = ef.compile(text)
        except Exception as error:  # noqa: BLE001
            self.fail(check + " reparse", f"printed program does not compile: {type(error).__name__}: "
                      f"{_short(error)}\n  program:\n{_indent(program)}")
            return
        try:
            raw = again(inputs)
        except Exception as error:  # noqa: BLE001
            self.fail(check + " reparse", f"printed program does not run: {type(error).__name__}: {_short(error)}\n"
                      f"  program:\n{_indent(program)}")
            return
        # a plain program returns one array or a flat tuple (value_and_grad: value, g1, g2, ...)
        again_results = list(raw) if isinstance(raw, tuple) else [raw]
        if len(again_results) != len(results):
            self.fail(check + " reparse", f"printed program returns {len(again_results)} values, not {len(results)}")
            return
        for got, first in zip(again_results, results):
            if np.shape(got) != np.shape(first) or not np.allclose(got, first, rtol=1e-12, atol=1e-12):
                self.fail(check + " reparse", f"printed program gives other numbers: {np.asarray(got)} vs "
                          f"{np.asarray(first)}\n  program:\n{_indent(program)}")
                return

    def checks(self) -> tuple[str, ...]:
        """The derivative checks for this program: all of them, or (default) one by rotation over seeds."""
        every = SCALAR_CHECKS if self.case.scalar else TENSOR_CHECKS
        if CHECKS == "all" or _REPLAY is not None:
            return every
        if self.case.network:
            # the derivatives that go through a split product (shared adjoints), in turn
            rotation = NETWORK_ROTATION if self.case.scalar else TENSOR_CHECKS
            return (rotation[(self.case.seed // NETWORK_EVERY) % len(rotation)],)
        rotation = SCALAR_ROTATION if self.case.scalar else TENSOR_CHECKS
        chosen = rotation[self.case.seed % len(rotation)]
        if chosen in ("hessian", "hessian_diagonal", "laplacian") and len(self.case.text) > 130:
            # einflow's Hessians of long programs can take many seconds to build (see diff_failures);
            # the default run keeps them to short programs, EINFLOW_DIFF_CHECKS=all takes every one
            chosen = "grad"
        return (chosen,)

    def check(self) -> list[Failure]:
        case = self.case
        text = case.text
        try:
            program = ef.compile(text)
        except ef.EinflowError as error:
            self.fail("compile", f"raised {type(error).__name__}: {_short(error)}")
            return self.failures
        except Exception as error:  # noqa: BLE001
            self.fail("compile", f"raw {type(error).__name__}: {_short(error)}{_where(error)}")
            return self.failures
        try:
            reference = _Reference(case, self.arrays)
        except _Skip:
            return self.failures
        try:
            value = program(self.arrays)
        except Exception as error:  # noqa: BLE001
            self.fail("value", f"{type(error).__name__}: {_short(error)}{_where(error)}")
            return self.failures
        problem = _close(value, reference.value)
        if problem:
            self.fail("value", problem)
            return self.failures  # derivatives of a wrongly evaluated program say little more
        try:  # einflow's own printing of the program re-parses to the same value
            again = ef.compile(str(program))(self.arrays)
            problem = _close(again, reference.value)
        except Exception as error:  # noqa: BLE001
            problem = f"{type(error).__name__}: {_short(error)}"
        if problem:
            self.fail("value reparse", f"{problem}\n  printed as:\n{_indent(program)}")
        wrt = case.wrt
        many = len(wrt) > 1
        wanted = (self.only.split(" ")[0].replace("grad(list)", "grad"),) if self.only else self.checks()

        def jac() -> list[np.ndarray]:
            return list(reference.jacobians())

        if "grad" in wanted:
            self.run("grad", lambda: ef.grad(text, wrt=wrt[0]), lambda: jac()[:1])
            if many:
                self.run("grad(list)", lambda: ef.grad(text, wrt=wrt), jac)
        if "value_and_grad" in wanted:
            self.run("value_and_grad", lambda: ef.value_and_grad(text, wrt=wrt if many else wrt[0]),
                     lambda: [reference.value, *jac()], pair=True)
        if "hessian" in wanted:
            self.run("hessian", lambda: ef.hessian(text, wrt=wrt if many else wrt[0]), reference.hessian_blocks)

        def diagonals() -> list[np.ndarray]:
            blocks = list(reference.hessian_blocks())
            found = []
            for k, x in enumerate(wrt):
                shape = np.shape(self.arrays[x])
                size = int(np.prod(shape))
                found.append(np.diagonal(np.reshape(blocks[k * len(wrt) + k], (size, size))).reshape(shape))
            return found

        if "hessian_diagonal" in wanted:
            self.run("hessian_diagonal", lambda: ef.hessian_diagonal(text, wrt=wrt if many else wrt[0]), diagonals)
        if "laplacian" in wanted:
            self.run("laplacian", lambda: ef.laplacian(text, wrt=wrt if many else wrt[0]),
                     lambda: [sum(np.sum(d) for d in diagonals())])
        for mode in ("forward", "reverse"):
            if f"jacobian({mode})" in wanted:
                self.run(f"jacobian({mode})",
                         lambda mode=mode: ef.jacobian(text, wrt=wrt if many else wrt[0], mode=mode), jac)
        if "vjp" in wanted:
            cotangent_name = "G0"
            rng = np.random.default_rng(case.seed + 17)
            cotangent = rng.uniform(-1, 1, size=np.shape(reference.value))

            def vjp_expected() -> list[np.ndarray]:
                return [np.tensordot(cotangent, j, axes=np.ndim(reference.value)) for j in jac()]

            self.run("vjp", lambda: ef.vjp(text, wrt=wrt if many else wrt[0], cotangent=cotangent_name),
                     vjp_expected, {**self.arrays, cotangent_name: cotangent})
        if "jvp" in wanted or "hvp" in wanted:
            rng = np.random.default_rng(case.seed + 23)
            names = [f"T_{x}" for x in wrt]
            tangents = {name: rng.uniform(-1, 1, size=np.shape(self.arrays[x])) for name, x in zip(names, wrt)}
            inputs = {**self.arrays, **tangents}
            chosen = names if many else names[0]

            def jvp_expected() -> list[np.ndarray]:
                return [sum(np.tensordot(j, tangents[name], axes=np.ndim(self.arrays[x]))
                            for j, name, x in zip(jac(), names, wrt))]

            def hvp_expected() -> list[np.ndarray]:
                blocks = list(reference.hessian_blocks())
                rows = []
                for first in range(len(wrt)):
                    rows.append(sum(np.tensordot(blocks[first * len(wrt) + second], tangents[names[second]],
                                                 axes=np.ndim(self.arrays[wrt[second]]))
                                    for second in range(len(wrt))))
                return rows

            if "jvp" in wanted:
                self.run("jvp", lambda: ef.jvp(text, wrt=wrt if many else wrt[0], tangent=chosen), jvp_expected,
                         inputs)
            if "hvp" in wanted:
                self.run("hvp", lambda: ef.hvp(text, wrt=wrt if many else wrt[0], tangent=chosen), hvp_expected,
                         inputs)
        return self.failures


def _flatten_vag(result: Any) -> list[Any]:
    value, gradients = result
    return [value, *(gradients if isinstance(gradients, tuple) else (gradients,))]


def _short(error: BaseException) -> str:
    text = str(error).strip().replace("\n", " | ")
    return text if len(text) < 300 else text[:300] + " ..."


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    inside = [f for f in frames if "einflow" in f.filename and "tests" not in f.filename]
    frame = inside[-1] if inside else (frames[-1] if frames else None)
    return f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})" if frame else ""


def _indent(program: Any) -> str:
    return "\n".join("      " + line for line in str(program).splitlines())


#: every NETWORK_EVERY-th seed also checks a tensor network (randprog.generate_network): products with
#: several varying factors, whose gradients share adjoints along a pairwise tree
NETWORK_EVERY = 8
NETWORK_ROTATION = ("grad", "value_and_grad", "hessian", "hvp", "vjp", "jacobian(reverse)", "jvp", "hessian_diagonal")


def check_seed(seed: int, verbose: bool = False) -> list[Failure]:
    """Every check of one random program (and, every NETWORK_EVERY-th seed, of a tensor network)."""
    cases = [randprog.generate(seed)]
    if seed % NETWORK_EVERY == 0:
        cases.append(randprog.generate_network(seed))
    failures: list[Failure] = []
    for case in cases:
        if verbose:
            print(f"seed {seed}, wrt={case.wrt}, scalar={case.scalar}\n{case.text}")
        # overflow in a program that is then skipped (reference not finite) is not worth a warning
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            failures += _Checker(case, verbose).check()
    return failures


def _signature(failure: Failure) -> tuple[str, str]:
    """What kind of failure: the check and 'mismatch' or the exception class and where it was raised."""
    detail = failure.detail.split("\n")[0]
    if "expected" in detail:
        return failure.check, "mismatch"
    # the exception and the shape of its message: names and numbers left out
    words = re.sub(r"'[^']*'|\d+", "_", detail).split()[:10]
    return failure.check, " ".join(words)


def shrink(seed: int, check: str | None = None, budget: int = 400) -> tuple[randprog.Case, list[Failure]]:
    """A smaller program failing the same check the same way (greedy: drop factors, terms, scopes, statements)."""
    case = randprog.generate(seed)
    failures = _Checker(case, only=check).check() if check else check_seed(seed)
    if not failures:
        return case, []
    target = _signature(failures[0])
    check = failures[0].check
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        smaller = [(p, case.wrt) for p in _smaller_programs(case.program)]
        smaller += [(case.program, [x for x in case.wrt if x != drop]) for drop in case.wrt if len(case.wrt) > 1]
        for candidate, wrt in sorted(smaller, key=lambda c: (len(randprog.program_text(c[0])), len(c[1]))):
            tries += 1
            if tries > budget:
                break
            text = randprog.program_text(candidate)
            if (len(text), len(wrt)) >= (len(case.text), len(case.wrt)):
                continue
            used = {n.name for st in candidate.statements for n in randprog._walk(st.expr)
                    if isinstance(n, randprog.Ref)}
            if not set(wrt) <= used:
                continue
            trial = randprog.Case(seed, candidate, list(wrt), case.scalar, text)
            try:
                value = randprog.evaluate(candidate, randprog.make_arrays(candidate, seed), np)
                ef.compile(text)
            except Exception:  # noqa: BLE001 - an invalid candidate
                continue
            if (np.ndim(value) == 0) != case.scalar:
                continue
            found = [f for f in _Checker(trial, only=check).check() if _signature(f) == target]
            if found:
                case, failures, improved = trial, found, True
                break
    return case, failures


def _smaller_programs(program: randprog.Program):  # type: ignore[no-untyped-def]
    statements = program.statements
    targets_read = {n.name for st in statements for n in randprog._walk(st.expr) if isinstance(n, randprog.Ref)}
    for k, item in enumerate(program.items):
        if isinstance(item, randprog.Stmt) and item is not statements[-1] and item.target not in targets_read:
            yield randprog.Program(program.items[:k] + program.items[k + 1:], program.sizes, program.inputs,
                                   program.positive, program.integers)
        if isinstance(item, randprog.SizeDecl):
            yield randprog.Program(program.items[:k] + program.items[k + 1:], program.sizes, program.inputs,
                                   program.positive, program.integers)
    for k, item in enumerate(program.items):
        if not isinstance(item, randprog.Stmt):
            continue
        for expr in _smaller_exprs(item.expr):
            parens = item.outer_parens and isinstance(expr, randprog.Add)
            statement = randprog.Stmt(item.target, item.indices, expr, parens)
            yield randprog.Program(program.items[:k] + [statement] + program.items[k + 1:], program.sizes,
                                   program.inputs, program.positive, program.integers)


def _smaller_exprs(e: Any):  # type: ignore[no-untyped-def]
    R = randprog
    if not isinstance(e, R.Num):
        yield R.Num(2.0, "2")
    if isinstance(e, R.Prod):
        n = len(e.factors)
        for k in range(n):
            keep = [j for j in range(n) if j != k]
            if len(keep) == 1 and not e.divisor[keep[0]]:
                yield e.factors[keep[0]]
            elif len(keep) > 1 and not e.divisor[keep[0]]:
                yield R.Prod(tuple(e.factors[j] for j in keep), tuple(e.divisor[j] for j in keep),
                             tuple(e.star[j] for j in keep))
        for k in range(n):
            for smaller in _smaller_exprs(e.factors[k]):
                yield R.Prod(e.factors[:k] + (smaller,) + e.factors[k + 1:], e.divisor, e.star)
    elif isinstance(e, R.Add):
        n = len(e.terms)
        for k in range(n):
            keep = [j for j in range(n) if j != k]
            if len(keep) == 1:
                only = e.terms[keep[0]]
                yield only if e.signs[keep[0]] > 0 else R.Neg(only)
            else:
                yield R.Add(tuple(e.terms[j] for j in keep), tuple(e.signs[j] for j in keep))
        for k in range(n):
            for smaller in _smaller_exprs(e.terms[k]):
                yield R.Add(e.terms[:k] + (smaller,) + e.terms[k + 1:], e.signs)
    elif isinstance(e, R.Neg):
        yield e.operand
        for smaller in _smaller_exprs(e.operand):
            yield R.Neg(smaller)
    elif isinstance(e, R.Call):
        yield e.argument
        for smaller in _smaller_exprs(e.argument):
            yield R.Call(e.function, smaller)
    elif isinstance(e, R.Pow):
        yield e.base
        for smaller in _smaller_exprs(e.base):
            yield R.Pow(smaller, e.exponent, e.text)
    elif isinstance(e, R.Reduce):
        yield e.body
        if len(e.indices) > 1:
            for k in range(len(e.indices)):
                yield R.Reduce(e.indices[:k] + e.indices[k + 1:], e.body)
        for smaller in _smaller_exprs(e.body):
            yield R.Reduce(e.indices, smaller)


# ------------------------------------------------------------------------------------------------ pytest
_COUNT = int(os.environ.get("EINFLOW_DIFF_N", "2000"))
_START = int(os.environ.get("EINFLOW_DIFF_START", "0"))
_CHUNK = 100


def _chunks() -> list[tuple[int, int]]:
    if _REPLAY is not None:
        return [(int(_REPLAY), 1)]
    return [(start, min(_CHUNK, _START + _COUNT - start)) for start in range(_START, _START + _COUNT, _CHUNK)]


@pytest.mark.parametrize(("start", "count"), _chunks(), ids=lambda v: str(v))
def test_random_programs_match_reference(start: int, count: int) -> None:
    failures: list[Failure] = []
    for seed in range(start, start + count):
        failures += check_seed(seed, verbose=_REPLAY is not None)
    if failures:
        seeds = sorted({f.seed for f in failures})
        shown = "\n\n".join(str(f) for f in failures[:8])
        more = f"\n\n... and {len(failures) - 8} more" if len(failures) > 8 else ""
        pytest.fail(f"{len(failures)} failed checks in {len(seeds)} of {count} programs (seeds {seeds})\n\n"
                    f"{shown}{more}", pytrace=False)


def test_reference_agrees_with_numpy_einsum_on_plain_contractions() -> None:
    """The reference evaluator itself: a few programs whose meaning is a single numpy.einsum."""
    rng = np.random.default_rng(0)
    A, B, x = rng.normal(size=(3, 3)), rng.normal(size=(3, 2)), rng.normal(size=3)
    sizes = {"i": 3, "j": 3, "k": 2}
    cases = [
        (randprog.Prod((randprog.Ref("A", ("i", "j")), randprog.Ref("B", ("j", "k"))), (False, False), (False, False)),
         None, np.einsum("ij,jk->ik", A, B)),
        (randprog.Ref("A", ("i", "i")), None, np.trace(A)),
        (randprog.Prod((randprog.Ref("A", ("i", "j")), randprog.Ref("x", ("i",))), (False, False), (False, False)),
         ("i",), np.einsum("ij,i->i", A, x)),
        (randprog.Ref("A", ("i", "i")), ("i",), np.diag(A)),
        (randprog.Prod((randprog.Delta("i", "i"), randprog.Delta("j", "j")), (False, False), (False, False)),
         None, 9.0),
    ]
    for expr, target, expected in cases:
        statement = randprog.Stmt("y", target, expr)
        program = randprog.Program([statement], sizes, {"A": (3, 3), "B": (3, 2), "x": (3,)}, set())
        got = randprog.evaluate(program, {"A": A, "B": B, "x": x}, np)
        assert np.allclose(got, expected), randprog.program_text(program)


_FEATURES = (
    "reuses an earlier result", "size declaration", "several wrt", "explicit target reducing a term",
    "term broadcast to the target", "term broadcast across +", "tensor used several times", "permuted index order",
    "same dummy name contracted in nested and enclosing scopes", "index occurring three times",
    "trace (repeated contracted index)", "diagonal (repeated bound index)", "scalar tensor", "delta", "delta[i,i]",
    "division", "parenthesized product inside a product", "signed factor", "sum of terms", "sum[...]",
    "nested sum[...]", "integer power", "negative power", "fractional power",
    *(f"function {name}" for name in randprog.FUNCTIONS),
)
# language v2 (drawn unless EINFLOW_DIFF_LANGUAGE=v1): every reduction, normaliser and new function
_V2_FEATURES = (
    *(f"reduction {kind}" for kind in ("max", "min", "mean", "logsumexp")), "reduction over several indices",
    *(f"normaliser {kind}" for kind in ("softmax", "log_softmax", "argmax", "argmin")),
    *(f"function {name}" for name in ("maximum", "minimum", "softplus", "erf")),
)

# language v3 (drawn unless EINFLOW_DIFF_LANGUAGE=v1 or v2): reads through positions (LANGUAGE.md 8.2)
_V3_FEATURES = ("shifted read", "strided read", "constant read", "gathered read", "padded read")
# language v4 (the default): linear algebra atoms and declared matrices (LANGUAGE.md 8.1)
_V4_FEATURES = ("linalg inv", "linalg det", "linalg logdet", "spd matrix", "symmetric matrix", "undeclared matrix",
                "derivative by a matrix")


def test_generator_covers_the_language() -> None:
    """Every feature the differential test is meant to exercise occurs in the default run's programs."""
    language = os.environ.get("EINFLOW_DIFF_LANGUAGE", "v4")
    wanted = _FEATURES + (() if language == "v1" else _V2_FEATURES) + (
        _V3_FEATURES if language in ("v3", "v4") else ()) + (_V4_FEATURES if language == "v4" else ())
    seen: dict[str, int] = dict.fromkeys(wanted, 0)
    count = 400
    for seed in range(count):
        for feature in randprog.features(randprog.generate(seed)):
            seen[feature] = seen.get(feature, 0) + 1
    rare = {feature: n for feature, n in seen.items() if feature in wanted and n < 3}
    assert not rare, f"features (almost) never generated in {count} programs: {rare}"
    multi = sum(len(randprog.generate(seed).program.statements) > 1 for seed in range(100))
    assert multi > 50


def _every_function_program() -> tuple[randprog.Program, dict[str, np.ndarray]]:
    """A fixed program with every function, powers, a divisor, a reduction, a trace, a diagonal and deltas."""
    R = randprog

    def prod(*factors: Any, divisor: tuple[bool, ...] | None = None) -> R.Prod:
        return R.Prod(tuple(factors), divisor or (False,) * len(factors), (False,) * len(factors))

    x, y, s = R.Ref("x", ("i",)), R.Ref("y", ("i",)), R.Ref("s", ())
    first = R.Stmt("T", ("i",), R.Add((
        prod(R.Call("exp", x), R.Call("sin", prod(R.Ref("A", ("i", "j")), R.Ref("y", ("j",))))),
        R.Call("cos", R.Ref("A", ("i", "i"))),
        prod(R.Call("tanh", s), x)), (1, 1, -1)))
    xk, yk = R.Ref("x", ("k",)), R.Ref("y", ("k",))
    second = R.Stmt("f", None, R.Add((
        R.Reduce(("i",), prod(R.Pow(R.Ref("T", ("i",)), 2, "^2"), R.Call("sigmoid", prod(x, y)),
                              R.Pow(R.Add((R.Num(1.0, "1"), y), (1, 1)), 0.5, "^0.5"), divisor=(False, False, True))),
        prod(R.Call("log", prod(xk, yk)), R.Call("sqrt", prod(xk, xk))),
        prod(R.Call("log1p", prod(R.Ref("y", ("j",)), R.Ref("y", ("j",)))),
             R.Call("abs", prod(R.Ref("T", ("m",)), R.Ref("x", ("m",))))),
        R.Call("relu", R.Ref("A", ("k", "k"))),
        R.Call("sign", s), R.Call("step", s),
        prod(R.Delta("i", "j"), R.Ref("A", ("i", "j")), R.Pow(s, -1, "^-1"))), (1, 1, -1, 1, 1, 1, 1)))
    program = R.Program([first, second], {"i": 3, "j": 3, "k": 3, "m": 3},
                        {"x": (3,), "y": (3,), "A": (3, 3), "s": ()}, {"x", "y"})
    rng = np.random.default_rng(3)
    arrays = {"x": rng.uniform(0.5, 1.5, 3), "y": rng.uniform(0.5, 1.5, 3), "A": rng.uniform(-1, 1, (3, 3)),
              "s": np.array(0.7)}
    return program, arrays


def test_jet_reference_agrees_with_jax() -> None:
    """The exact jets that serve as the default reference give JAX's float64 Jacobian and Hessian."""
    if jax is None:  # pragma: no cover - `make test` installs jax
        pytest.skip("jax is not installed")
    program, arrays = _every_function_program()
    wrt = ["x", "A", "s"]
    value, jacobians, hessians = randprog.jet_derivatives(program, arrays, wrt, second=True)

    def f(*values: Any) -> Any:
        return randprog.evaluate(program, {**arrays, **dict(zip(wrt, values))}, jnp)

    argnums = tuple(range(len(wrt)))
    both = jax.jit(lambda *v: (f(*v), jax.jacrev(f, argnums)(*v), jax.hessian(f, argnums)(*v)))
    jax_value, jax_jacobians, jax_hessian = both(*(arrays[x] for x in wrt))
    np.testing.assert_allclose(value, jax_value, rtol=1e-12)
    for mine, theirs in zip(jacobians, jax_jacobians):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    blocks = [jax_hessian[a][b] for a in argnums for b in argnums]
    for mine, theirs in zip(hessians, blocks):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    # and einflow agrees on this program: value and every derivative check
    case = randprog.Case(0, program, wrt, True, randprog.program_text(program))
    checker = _Checker(case, only=None)
    checker.arrays = arrays
    checker.checks = lambda: SCALAR_CHECKS  # type: ignore[method-assign]
    failures = checker.check()
    assert not failures, "\n\n".join(str(f) for f in failures)


def test_jet_reference_of_normalisers_and_maximum_agrees_with_jax() -> None:
    """The v2 reference (softmax, log_softmax, maximum, minimum) against the same function written in jnp."""
    if jax is None:  # pragma: no cover - `make test` installs jax
        pytest.skip("jax is not installed")
    R = randprog

    def prod(*factors: Any) -> R.Prod:
        return R.Prod(tuple(factors), (False,) * len(factors), (False,) * len(factors))

    Ax = prod(R.Ref("A", ("i", "j")), R.Ref("x", ("j",)))
    body = R.Add((prod(R.Norm("softmax", ("i",), Ax), R.Ref("y", ("i",))),
                  prod(R.Norm("log_softmax", ("i",), Ax), R.Ref("y", ("i",))),
                  R.Bin("maximum", R.Ref("x", ("i",)), R.Ref("y", ("i",))),
                  R.Bin("minimum", prod(R.Ref("x", ("i",)), R.Ref("x", ("i",))), R.Ref("y", ("i",)))), (1, 1, 1, -1))
    program = R.Program([R.Stmt("f", None, R.Reduce(("i",), body))], {"i": 3, "j": 3},
                        {"x": (3,), "y": (3,), "A": (3, 3)}, set())
    rng = np.random.default_rng(4)
    arrays = {"x": rng.uniform(-1, 1, 3), "y": rng.uniform(-1, 1, 3), "A": rng.uniform(-1, 1, (3, 3))}
    wrt = ["x", "A"]
    value, jacobians, hessians = randprog.jet_derivatives(program, arrays, wrt, second=True)

    def f(x: Any, A: Any) -> Any:
        z, y = A @ x, arrays["y"]
        return (jnp.sum(jax.nn.softmax(z) * y) + jnp.sum(jax.nn.log_softmax(z) * y) + jnp.sum(jnp.maximum(x, y))
                - jnp.sum(jnp.minimum(x * x, y)))

    np.testing.assert_allclose(value, f(arrays["x"], arrays["A"]), rtol=1e-12)
    for mine, theirs in zip(jacobians, jax.jacrev(f, (0, 1))(arrays["x"], arrays["A"])):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    blocks = jax.hessian(f, (0, 1))(arrays["x"], arrays["A"])
    for mine, theirs in zip(hessians, [blocks[a][b] for a in range(2) for b in range(2)]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--shrink":  # pragma: no cover
    # python tests/test_differential.py --shrink SEED [CHECK]
    small, found = shrink(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
    for f in found[:1]:
        print(f)
    sys.exit(0)

if __name__ == "__main__":  # pragma: no cover
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    total = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    bad = 0
    for s in range(first, first + total):
        found = check_seed(s)
        bad += bool(found)
        for f in found:
            print(f, "\n", flush=True)
    print(f"# {bad} of {total} programs failed", file=sys.stderr)


# ---------------------------------------------------------------- linear algebra (LANGUAGE.md 8.1, issue 25)
_LINALG_N = int(os.environ.get("EINFLOW_DIFF_LINALG_N", "12"))


@pytest.mark.skipif(jax is None, reason="the linear-algebra reference is jax.numpy.linalg")
@pytest.mark.parametrize("seed", range(_LINALG_N))
def test_random_linear_algebra_programs_match_jax(seed: int) -> None:
    """Random sums of inv/det/logdet atoms of matrices built from a well-conditioned A (randprog.generate_linalg:
    condition numbers below about 5), A undeclared, spd or symmetric: value, gradient, Hessian and hvp against
    jax.numpy.linalg in float64, the gradient against central differences of the value, and the printed
    derivative programs re-parse to the same values."""
    case = randprog.generate_linalg(seed)
    data = {name: case.arrays[name] for name in ("A", "x", "u", "B")}
    program = ef.compile(case.text)

    def call(p: ef.Program, **extra: np.ndarray) -> Any:
        return p(**{name: {**data, **extra}[name] for name in p.inputs})

    jdata = {name: jnp.asarray(value) for name, value in data.items()}
    message = f"seed {seed}: {case.text!r}"
    assert np.isclose(call(program), float(case.twin(**jdata)), rtol=1e-10, atol=1e-10), message
    gradient = ef.grad(program, wrt="A")
    expected = np.asarray(jax.grad(lambda a: case.twin(**{**jdata, "A": a}))(jdata["A"]))
    assert np.allclose(call(gradient), expected, rtol=1e-8, atol=1e-9), message
    assert np.allclose(call(ef.compile(str(gradient))), expected, rtol=1e-8, atol=1e-9), message  # re-parsed
    hessian = np.asarray(jax.hessian(lambda a: case.twin(**{**jdata, "A": a}))(jdata["A"]))
    assert np.allclose(call(ef.hessian(program, wrt="A")), hessian, rtol=1e-7, atol=1e-8), message
    T = np.random.default_rng(seed).standard_normal(data["A"].shape)
    hvp = np.tensordot(hessian, T, axes=2)
    assert np.allclose(call(ef.hvp(program, wrt="A", tangent="T"), T=T), hvp, rtol=1e-7, atol=1e-8), message
    if case.declared is None:  # central differences move A off the declared set otherwise
        h = 1e-6
        central = np.zeros_like(data["A"])
        for index in np.ndindex(central.shape):
            step = np.zeros_like(central)
            step[index] = h
            central[index] = (call(program, A=data["A"] + step) - call(program, A=data["A"] - step)) / (2 * h)
        assert np.allclose(call(gradient), central, rtol=1e-5, atol=1e-6), message
