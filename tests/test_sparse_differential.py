"""Differential testing with sparse inputs (LANGUAGE.md §9.3): random programs (tests/randprog.py) run with some
of their 2-D and n-D inputs given as scipy.sparse or pydata ``sparse.COO`` arrays with random patterns (empty rows,
duplicate coordinates that are summed), compared with the same program run on the dense arrays with the zeros
written out: the value, and the derivatives ``grad``, ``value_and_grad``, ``vjp``, ``jvp``, ``hvp`` and ``hessian``
(by rotation over the seeds; every one with ``EINFLOW_SPARSE_DIFF_CHECKS=all``).

A derivative by a sparse input is the derivative by its stored values: sparse on its pattern, compared with the
dense derivative at the pattern's entries; a tangent for a sparse input is sparse on its pattern. A program einflow
refuses with :class:`einflow.SparseError` (a construct the sparse rewrite does not take, LANGUAGE.md §9.3) is
counted, not failed; every other exception, and every difference, fails.

Each seed also checks a program of a family the random programs draw seldom (:func:`family_case`): a scatter into
an output whose index order is not the sparse factor's (seeds 142, 155, 163, 168 and 288 found a scatter that
took its gathered positions in the factors' order, not the output's), a reduction over an index of the same
name as one read outside it (seed 102: the sparse rewrite's renaming joined the two), a dense factor read on its
diagonal beside the sparse one (seeds 615, 806, 903, 912: the diagonal, read at a gather, was left free) and a
scope summing every index of the sparse factor beside another term (seed 699: the entries were left to the
statement to sum, the other term broadcast over them).

Environment: ``EINFLOW_SPARSE_DIFF_N`` (default 60 programs), ``EINFLOW_SPARSE_DIFF_START`` (first seed, default 0),
``EINFLOW_SPARSE_DIFF_SEED=1234`` (one seed, every check, printed), ``EINFLOW_SPARSE_DIFF_CHECKS=all``.
Command line: ``python tests/test_sparse_differential.py START COUNT`` prints every failure and the refusals.
"""

from __future__ import annotations

import math
import os
import random
import sys
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import randprog  # noqa: E402

import einflow as ef  # noqa: E402

sp = pytest.importorskip("scipy.sparse")
sparse = pytest.importorskip("sparse")

RTOL = 1e-9
ATOL = 1e-10  # times (1 + the largest dense entry)
LIMIT = 1e6
_REPLAY = os.environ.get("EINFLOW_SPARSE_DIFF_SEED")
CHECKS = ("grad", "value_and_grad", "vjp", "jvp", "hvp", "hessian")
TENSOR_CHECKS = ("vjp", "jvp")
EVERY = os.environ.get("EINFLOW_SPARSE_DIFF_CHECKS", "rotate") == "all" or _REPLAY is not None


@dataclass
class Outcome:
    seed: int
    family: bool = False
    text: str = ""
    sparse: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def fail(self, check: str, detail: str) -> None:
        which = " (family program)" if self.family else ""
        self.failures.append(f"seed {self.seed}{which} {check} (sparse {self.sparse}):\n{_indent(self.text)}\n"
                             f"  {detail}\n"
                             f"  replay: EINFLOW_SPARSE_DIFF_SEED={self.seed} .venv/bin/python -m pytest "
                             f"tests/test_sparse_differential.py -q")


def _indent(text: Any) -> str:
    return "\n".join("    " + line for line in str(text).splitlines())


def _plain_inputs(program: randprog.Program) -> list[str]:
    """Float inputs of rank >= 2 read only with plain indices (a sparse input read at shifted or gathered positions
    is refused by design), not declared matrices, not positive (their zeros would leave the domain)."""
    shifted: set[str] = set()
    read: set[str] = set()
    for statement in program.statements:
        for node in randprog._walk(statement.expr):
            if isinstance(node, randprog.Ref):
                read.add(node.name)
                if node.positions and any(not isinstance(p, str) for p in node.positions):
                    shifted.add(node.name)
            if isinstance(node, randprog.Lin):
                shifted.add(node.matrix)
    return sorted(name for name, shape in program.inputs.items()
                  if len(shape) >= 2 and name in read and name not in shifted and name not in program.integers
                  and name not in program.matrices and name not in program.positive)


def _pattern(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A random pattern: about half the entries, one empty slice along the first axis, at least one entry."""
    mask = rng.random(shape) < rng.uniform(0.2, 0.7)
    if shape[0] > 1:
        mask[rng.integers(shape[0])] = False
    if not mask.any():
        mask[tuple(rng.integers(n) for n in shape)] = True
    return mask


def _sparse_of(rng: np.random.Generator, dense: np.ndarray, mask: np.ndarray, kind: str) -> Any:
    """``dense`` (zero off ``mask``) as a sparse array of ``kind``, some entries stored as two duplicates."""
    coords = np.nonzero(mask)
    values = dense[coords]
    split = rng.random(values.shape[0]) < 0.3  # these entries stored twice, the parts summing to the value
    part = rng.uniform(-1, 1, size=int(np.count_nonzero(split)))
    all_coords = tuple(np.concatenate([c, c[split]]) for c in coords)
    kept = values.copy()
    kept[split] -= part
    all_values = np.concatenate([kept, part])
    order = rng.permutation(all_values.shape[0])
    all_coords = tuple(c[order] for c in all_coords)
    all_values = all_values[order]
    if kind == "pydata" or dense.ndim != 2:
        return sparse.COO(np.stack(all_coords), all_values, shape=dense.shape)  # sums the duplicates
    coo = sp.coo_array((all_values, all_coords), shape=dense.shape)
    if kind == "coo":
        return coo
    if kind == "csr_matrix":
        return sp.csr_matrix(coo)
    return coo.asformat(kind)


def _dense(value: Any) -> np.ndarray:
    if isinstance(value, sparse.SparseArray):
        return np.asarray(value.todense())
    if sp.issparse(value):
        return value.toarray()
    return np.asarray(value)


def _close(got: Any, expected: Any) -> str | None:
    got, expected = _dense(got), _dense(expected)
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    if np.allclose(got, expected, rtol=RTOL, atol=ATOL * (1 + scale)):
        return None
    return f"expected {np.array2string(expected, precision=6)}\n  got      {np.array2string(got, precision=6)}"


def _results(result: Any, pair: bool) -> list[Any]:
    if pair:
        value, gradients = result
        return [value, *(gradients if isinstance(gradients, tuple) else (gradients,))]
    return list(result) if isinstance(result, tuple) else [result]


def _rewritten(program: Any, inputs: dict[str, Any]) -> str:
    """The program over coordinates and values that runs for these sparse inputs (einflow.engine.sparse)."""
    from einflow import sparse_inputs
    from einflow.program import Program

    runner, rewritten, _, _ = sparse_inputs.prepared(program, inputs, Program)
    products = "".join(f"\n{product}" for product in rewritten.products)
    return f"{runner}{products}"


def _huge(values: list[Any]) -> bool:
    return any(not np.all(np.isfinite(_dense(v))) or np.max(np.abs(_dense(v)), initial=0) > LIMIT for v in values)


def _ref(name: str, *indices: str) -> randprog.Ref:
    return randprog.Ref(name, tuple(indices))


def _prod(*factors: Any) -> randprog.Prod:
    return randprog.Prod(tuple(factors), (False,) * len(factors), (False,) * len(factors))


def _scatter_family(r: random.Random, sizes: dict[str, int]) -> tuple[list[randprog.Stmt], dict[str, Any]]:
    """``Y[<a permutation>] = S[h,k(,m)] D[<some of S's indices, l>] (- E[...])``: a product with a sparse factor
    whose kept indices are written in another order than the factor's (each kept index a scatter of one of its
    coordinates), the dense factor gathered at its coordinates in an order of its own."""
    own = ["h", "k", "m"][:r.choice((2, 2, 3))]
    r.shuffle(own)
    read = r.sample(own, r.randint(1, len(own)))
    extra = ["l"] if r.random() < 0.6 else []
    dense = read + extra
    r.shuffle(dense)
    summed = set(r.sample(own, r.randint(0, len(own) - 1)))
    out = [index for index in own + extra if index not in summed]
    r.shuffle(out)
    shapes = {"S": tuple(sizes[i] for i in own), "D": tuple(sizes[i] for i in dense)}
    expr: Any = _prod(_ref("S", *own), _ref("D", *dense))
    if r.random() < 0.5:  # a dense term beside it (the sparse product's indices renamed statement-wide)
        kept = r.sample(out, r.randint(1, len(out)))
        shapes["E"] = tuple(sizes[i] for i in kept)
        expr = randprog.Add((expr, _ref("E", *kept)), (1, -1))
    return [randprog.Stmt("Y", tuple(out), expr)], shapes


def _shadow_family(r: random.Random, sizes: dict[str, int]) -> tuple[list[randprog.Stmt], dict[str, Any]]:
    """``Y = mean[j,i](delta[h,j] S[h,i] (D[i])) + w[j]``: a reduction over an index of the same name as one read
    outside it, the sparse factor inside scattering a coordinate into it."""
    first, second = r.sample(["h", "i"], 2)
    tied = r.choice(("h", "i"))
    sizes["j"] = sizes[tied]
    kind = r.choice(("sum", "mean", "max"))
    inner: list[Any] = [randprog.Delta(tied, "j"), _ref("S", first, second)]
    shapes = {"S": (sizes[first], sizes[second]), "w": (sizes["j"],)}
    if r.random() < 0.5:
        inner.append(_ref("D", "i"))
        shapes["D"] = (sizes["i"],)
    reduced = randprog.Reduce(("j", "i"), _prod(*inner), kind)
    expr = randprog.Add((reduced, _ref("w", "j")), (1, 1))
    return [randprog.Stmt("Y", None, expr)], shapes


def _diagonal_family(r: random.Random, sizes: dict[str, int]) -> tuple[list[randprog.Stmt], dict[str, Any]]:
    """``Y[h] = log_softmax[h](S[p,h] g[p] M[t,t,p])`` (or the product in a function, or alone): a dense factor
    read on its diagonal beside a sparse one (the diagonal summed in its own product, read at a gather), and
    ``Y = c (sum[q,p,h](S[p,h] w[q]) + u[q] v[q])``: a scope summing all of the sparse factor's indices beside a
    term."""
    shapes: dict[str, Any] = {"S": (sizes["i"], sizes["h"])}
    if r.random() < 0.5:
        shapes.update(g=(sizes["i"],), M=(sizes["k"], sizes["k"], sizes["i"]))
        inner: Any = _prod(_ref("S", "i", "h"), _ref("g", "i"), _ref("M", "k", "k", "i"))
        wrap = r.choice(("log_softmax", "tanh", ""))
        expr = randprog.Norm(wrap, ("h",), inner) if wrap == "log_softmax" else \
            randprog.Call(wrap, inner) if wrap else inner
        return [randprog.Stmt("Y", ("h",), expr)], shapes
    shapes.update(c=(), w=(sizes["l"],), u=(sizes["l"],), v=(sizes["l"],))
    summed = randprog.Reduce(("l", "i", "h"), _prod(_ref("S", "i", "h"), _ref("w", "l")))
    expr = _prod(_ref("c"), randprog.Add((summed, _prod(_ref("u", "l"), _ref("v", "l"))), (1, 1)))
    return [randprog.Stmt("Y", None, expr)], shapes


def family_case(seed: int) -> tuple[randprog.Case, tuple[str, ...]]:
    """A program of one of the families the random programs draw too seldom (a scatter into an output whose order
    is not the sparse factor's; a reduction shadowing an index read outside it; a diagonal or a whole-pattern sum
    beside the sparse factor), its value a tensor or (half the time) a scalar ``loss``, and the inputs to pass
    sparse."""
    r = random.Random(seed * 104729 + 11)
    sizes = {index: r.randint(2, 4) for index in ("h", "i", "k", "l", "m")}
    family = (_scatter_family, _shadow_family, _diagonal_family)[seed % 3]
    statements, shapes = family(r, sizes)
    scalar = r.random() < 0.5
    if scalar and statements[0].indices != ():
        labels = randprog.labels_of(statements[0].expr, frozenset()) if statements[0].indices is None \
            else statements[0].indices
        shapes["W"] = tuple(sizes[i] for i in labels)
        statements.append(randprog.Stmt("loss", None, randprog.Call("tanh", _prod(_ref("Y", *labels),
                                                                                   _ref("W", *labels)))))
    program = randprog.Program(list(statements), dict(sizes), shapes, set())
    used = [name for name in shapes if math.prod(shapes[name]) <= 30] or [min(shapes, key=lambda n: shapes[n])]
    wrt = r.sample(used, min(len(used), r.choice((1, 2, 2))))
    case = randprog.Case(seed, program, wrt, scalar)
    case.text = randprog.program_text(program)
    return case, ("S",)


class _Checker:
    def __init__(self, seed: int, family: bool = False) -> None:
        self.seed = seed
        forced: tuple[str, ...] = ()
        if family:
            self.case, forced = family_case(seed)
        else:
            self.case = randprog.generate(seed)
        self.family = family
        self.outcome = Outcome(seed, family, self.case.text)
        r = random.Random(seed * 31 + 5)
        rng = np.random.default_rng(seed + 101)
        arrays = randprog.make_arrays(self.case.program, seed)
        candidates = _plain_inputs(self.case.program)
        chosen = list(forced) or r.sample(candidates, min(len(candidates), r.choice((1, 1, 2))))
        self.masks: dict[str, np.ndarray] = {}
        self.dense = dict(arrays)
        self.sparse = dict(arrays)
        for name in chosen:
            mask = _pattern(rng, arrays[name].shape)
            self.masks[name] = mask
            self.dense[name] = np.where(mask, arrays[name], 0.0)
            kind = r.choice(("coo", "csr", "csc", "csr_matrix", "pydata")) if mask.ndim == 2 else "pydata"
            self.sparse[name] = _sparse_of(rng, self.dense[name], mask, kind)
            self.outcome.sparse[name] = kind

    def _run(self, check: str, build: Callable[[], Any], extra_dense: dict[str, Any] | None = None,
             extra_sparse: dict[str, Any] | None = None, pair: bool = False,
             sample: tuple[str, ...] = ()) -> None:
        """Run the program ``build`` makes on the dense and on the sparse inputs and compare; ``sample``: per result,
        the sparse input whose pattern it lies on ("" for none): the dense result is taken at its entries."""
        outcome = self.outcome
        try:
            program = build()
        except ef.EinflowError as error:
            outcome.fail(check, f"raised {type(error).__name__} building it: {error}")
            return
        try:
            want = _results(program({**self.dense, **(extra_dense or {})}), pair)
        except ef.EinflowError as error:
            if self.family:  # (a random program einflow refuses is the differential test's business)
                outcome.fail(check, f"the dense program raised {type(error).__name__}: {error}")
            return
        if _huge(want):
            return
        try:
            got = _results(program({**self.sparse, **(extra_sparse or {})}), pair)
        except ef.SparseError as error:
            outcome.refused.append(f"{check}: {str(error).splitlines()[0][:120]}")
            return
        except Exception as error:  # noqa: BLE001 - the finding
            frames = [f for f in traceback.extract_tb(error.__traceback__) if "einflow" in f.filename]
            where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
            outcome.fail(check, f"{type(error).__name__} on sparse inputs: {str(error)[:300]}{where}\n"
                         f"  program:\n{_indent(program)}")
            return
        outcome.checked.append(check)
        if len(got) != len(want):
            outcome.fail(check, f"{len(got)} results, expected {len(want)}")
            return
        for k, (g, w) in enumerate(zip(got, want)):
            on = sample[k] if k < len(sample) else ""
            if on:
                if not (sp.issparse(g) or isinstance(g, sparse.SparseArray)):
                    outcome.fail(check, f"[{k}] a derivative by sparse {on!r} came back {type(g).__name__}")
                    return
                w = np.where(self.masks[on], w, 0.0)
            problem = _close(g, w)
            if problem:
                outcome.fail(check, f"[{k}] {problem}\n  program:\n{_indent(program)}\n  rewritten:\n"
                             f"{_indent(_rewritten(program, {**self.sparse, **(extra_sparse or {})}))}")
                return

    def checks(self) -> tuple[str, ...]:
        every = CHECKS if self.case.scalar else TENSOR_CHECKS
        if EVERY:
            return every
        return (every[self.seed % len(every)],)

    def check(self) -> Outcome:
        text, wrt = self.case.text, self.case.wrt
        if not self.masks:
            return self.outcome
        self._run("value", lambda: ef.compile(text))
        wanted = self.checks()
        many = wrt if len(wrt) > 1 else wrt[0]
        on = tuple(name if name in self.masks else "" for name in wrt)
        if "grad" in wanted:
            self._run("grad", lambda: ef.grad(text, wrt=many), sample=on)
        if "value_and_grad" in wanted:
            self._run("value_and_grad", lambda: ef.value_and_grad(text, wrt=many), pair=True, sample=("", *on))
        if "vjp" in wanted:
            value = np.asarray(ef.compile(text)(self.dense))
            cotangent = np.random.default_rng(self.seed + 17).uniform(-1, 1, size=np.shape(value))
            self._run("vjp", lambda: ef.vjp(text, wrt=many, cotangent="G0"), {"G0": cotangent}, {"G0": cotangent},
                      sample=on)
        if "jvp" in wanted or "hvp" in wanted:
            rng = np.random.default_rng(self.seed + 23)
            names = [f"T_{x}" for x in wrt]
            dense_t: dict[str, Any] = {}
            sparse_t: dict[str, Any] = {}
            for name, x in zip(names, wrt):
                tangent = rng.uniform(-1, 1, size=np.shape(self.dense[x]))
                if x in self.masks:  # a tangent of the stored values: on the pattern
                    tangent = np.where(self.masks[x], tangent, 0.0)
                    sparse_t[name] = _sparse_of(rng, tangent, self.masks[x], self.outcome.sparse[x])
                else:
                    sparse_t[name] = tangent
                dense_t[name] = tangent
            chosen = names if len(wrt) > 1 else names[0]
            if "jvp" in wanted:
                self._run("jvp", lambda: ef.jvp(text, wrt=many, tangent=chosen), dense_t, sparse_t)
            if "hvp" in wanted:
                self._run("hvp", lambda: ef.hvp(text, wrt=many, tangent=chosen), dense_t, sparse_t, sample=on)
        if "hessian" in wanted and not any(x in self.masks for x in wrt):
            self._run("hessian", lambda: ef.hessian(text, wrt=many))
        return self.outcome


def check_seed(seed: int) -> list[Outcome]:
    """The random program of ``seed`` and the family program of ``seed`` (:func:`family_case`), checked."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [_Checker(seed).check(), _Checker(seed, family=True).check()]


START = int(os.environ.get("EINFLOW_SPARSE_DIFF_START", "0"))
COUNT = int(os.environ.get("EINFLOW_SPARSE_DIFF_N", "60"))
SEEDS = [int(_REPLAY)] if _REPLAY is not None else list(range(START, START + COUNT))


@pytest.mark.parametrize("seed", SEEDS)
def test_sparse_inputs_match_dense(seed: int) -> None:
    outcomes = check_seed(seed)
    for outcome in outcomes if _REPLAY is not None else ():
        print(outcome.text, outcome.sparse, outcome.checked, outcome.refused, sep="\n")
    failures = [failure for outcome in outcomes for failure in outcome.failures]
    assert not failures, "\n\n".join(failures)
    family = outcomes[1]
    assert family.checked or family.refused, f"the family program of seed {seed} was not checked:\n{family.text}"


def main(start: int, count: int) -> None:
    checked: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    drawn = failed = 0
    for seed in range(start, start + count):
        for outcome in check_seed(seed):
            drawn += bool(outcome.sparse)
            checked.update(outcome.checked)
            for reason in outcome.refused:
                refused[reason.split(":", 1)[1].strip()[:90]] += 1
            for failure in outcome.failures:
                failed += 1
                print(failure, "\n")
    print(f"{count} seeds ({count} random programs and {count} family programs), {drawn} with sparse inputs, "
          f"{failed} failures; checked: {dict(checked)}")
    for reason, n in refused.most_common():
        print(f"  refused {n}x: {reason}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
