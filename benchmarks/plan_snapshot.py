"""Render plan sources and plan reports for a corpus of programs into one text file.

A refactoring of the engine that must not change behaviour is checked by running this before and after
and diffing the two files: ``python -m benchmarks.plan_snapshot before.txt`` (then ``after.txt``), run from
the repository root so that its einflow is the one imported.
"""

from __future__ import annotations

import math
import pathlib
import re
import sys
import warnings

import numpy as np

import einflow as ef

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from test_lower import CORPUS as LOWER_CORPUS  # noqa: E402

from einflow.engine.backends import get_backend
from einflow.engine.plan import build_plan

CORPUS: list[tuple[str, dict[str, tuple[int, ...]]]] = [*LOWER_CORPUS,  # tests/test_lower.py's corpus, then
    # more elementwise nodes and reductions
    ("y[i] = maximum(x[i], 0) + relu(x[i] - 1) + minimum(x[i], n[i]) + x[i]^3 / n[i] + exp(2 x[i])",
     dict(x=(5,), n=(5,))),
    ("s[i] = softmax[j](A[i,j])\nl[i] = logsumexp[j](A[i,j])\nm[i] = max[j](A[i,j])", dict(A=(3, 4))),
    ("y[i,j] = A[i,j] / sum[k](A[i,k])", dict(A=(3, 4))),
    # tests/test_slicing.py's cases (sliced below)
    ("C[i,j] = A[i,k] B[k,l] D[l,j]", {"A": (300, 200), "B": (200, 250), "D": (250, 300)}),
    ("s = A[i,j] B[j,k] C[k,i]", {"A": (300, 200), "B": (200, 300), "C": (300, 300)}),
    ("T[a,d] = 2.5 X[a,b,c] Y[b,c,d] z[d]", {"X": (40, 30, 50), "Y": (30, 50, 60), "z": (60,)}),
    ("Y[i,j] = tanh(A[i,k] B[k,l] D[l,j]) + 1", {"A": (200, 300), "B": (300, 400), "D": (400, 100)}),
    ("C[i,j] = A[i,i,k] B[k,l] D[l,j]", {"A": (50, 50, 40), "B": (40, 300), "D": (300, 60)}),
    ("y[i] = tanh(A[i,j]) + exp(A[i,j]) B[i,j]", {"A": (300, 400), "B": (300, 400)}),
    ("y[i,j] = tanh(A[i,j]) exp(B[i,j]) + sigmoid(A[i,j])", {"A": (300, 300), "B": (300, 300)}),  # in blocks
    # tests/test_linalg.py's examples
    ("f = logdet[i,j](A[i,j])", dict(A=(4, 4), x=(4,))),
    ("f = det[i,j](A[i,j])", dict(A=(4, 4))),
    ("f = x[i] inv[i,j](A[i,j]) x[j]", dict(A=(4, 4), x=(4,))),
    ("f = det[i,j](A[i,j] + x[i] x[j])", dict(A=(4, 4), x=(4,))),
    ("f = sum[i](tanh(inv[i,j](A[i,j]) x[j]))", dict(A=(4, 4), x=(4,))),
    ("f = logdet[i,j](A[i,k] A[j,k]) + x[i] inv[i,j](A[j,i]) x[j]", dict(A=(4, 4), x=(4,))),
    ("x[i] = inv[i,j](A[i,j]) b[j]", dict(A=(4, 4), b=(4,))),
    ("C[i,k] = inv[i,j](A[i,j]) B[j,k]", dict(A=(4, 4), B=(4, 3))),
    ("C[k,j] = B[i,k] inv[i,j](A[i,j])", dict(A=(4, 4), B=(4, 3))),
    ("f = b[i] inv[i,j](A[i,j] + A[j,i]) B[j,k] B[l,k] b[l]", dict(A=(4, 4), B=(4, 3), b=(4,))),
    ("C[i,j] = inv[i,j](A[i,j]) + inv[i,k](A[i,k]) B[k,l] B[j,l]", dict(A=(4, 4), B=(4, 3))),
    ("K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\nf = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])",
     dict(X=(5, 2), s=(), y=(5,))),
    ("d[b] = logdet[i,j](B[b,i,j])\ne[b] = d[b] + sum[i,j](inv[i,j](B[b,i,j]))", dict(B=(2, 3, 3))),
    # tests/test_index_arithmetic.py's examples
    ("d[i] = x[i + 1] - x[i]", dict(x=(10,))),
    ("y[h] = x[h + r] K[r]", dict(x=(11,), K=(3,))),
    ("y[h] = x[2*h+r] k[r]", dict(x=(11,), k=(3,))),
    ("a[i] = X[2, i]", dict(X=(3, 4))),
    ("size i = 4\nsize j = 4\nT[i,j] = w[i - j + 3]", dict(w=(7,))),
    ("size i = x\ny[i] = x[i-1] - 2 x[i] + x[i+1]", dict(x=(6,))),
    ("y[b,d] = E[t[b], d]", dict(E=(5, 3), t=(4,))),
    ("size h = 4\nsize w = 4\ny[n,o,h,w] = x[n,c,2*h+r-1,2*w+s-1] K[o,c,r,s]", dict(x=(2, 3, 8, 8), K=(4, 3, 3, 3))),
    ("v[b,k] = x[b, idx[b,k]]", dict(x=(3, 6), idx=(3, 2))),
]

SECONDS = re.compile(r"seconds=[0-9.e-]+")

DERIVATIVES = [  # (program, wrt, shapes)
    ("h[j] = tanh(W1[j,k] x[k])\nL = 0.5 * sum[i]((W2[i,j] h[j] - t[i])^2)", "W1",
     dict(W1=(3, 4), x=(4,), W2=(2, 3), t=(2,))),
    ("L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", "w", dict(X=(6, 3), y=(6,), w=(3,))),
    ("f = logdet[i,j](A[i,k] A[j,k]) + x[i] inv[i,j](A[j,i]) x[j]", "A", dict(A=(4, 4), x=(4,))),
    ("f = sum[i](softmax[j](A[i,j]) B[i,j])", "A", dict(A=(3, 4), B=(3, 4))),
    ("f = sum[h]((x[h + r] K[r])^2)", "K", dict(x=(11,), K=(3,))),
]


def _indexed(shapes: dict[str, tuple[int, ...]], name: str) -> bool:
    return name in ("t", "idx")


def _arrays(program: ef.Program, shapes: dict[str, tuple[int, ...]], dtype: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {}
    for name in program.info.inputs:
        shape = shapes[name]
        if _indexed(shapes, name):
            arrays[name] = rng.integers(0, 2, shape)
        elif name == "A" and len(shape) == 2 and shape[0] == shape[1]:  # well conditioned
            arrays[name] = (rng.uniform(-0.1, 0.1, shape) + 2 * np.eye(shape[-1])).astype(dtype)
        else:
            arrays[name] = rng.uniform(0.5, 1.5, shape).astype(dtype)
    return arrays


def _write(out: list[str], title: str, run) -> None:  # noqa: ANN001
    out.append(f"==== {title}")
    try:
        out.append(str(run()))
    except Exception as error:  # noqa: BLE001 - the snapshot records errors too
        out.append(f"ERROR {type(error).__name__}: {error}")


def snapshot(program: ef.Program, label: str, shapes: dict[str, tuple[int, ...]], out: list[str]) -> None:
    shapes = {name: shapes[name] for name in program.info.inputs}
    _write(out, f"{label} generic source", program.to_source)
    for backend in ("numpy", "torch"):
        whole = None

        def report(limit: float | None, backend: str = backend) -> object:
            result = program.plan(shapes, backend=backend, memory_limit=limit)
            lines = [str(result), f"peak {result.peak_bytes} shapes {result.output_shapes}"]
            lines += [SECONDS.sub("seconds=*", repr(step)) for step in result.steps]  # the path search's time
            return "\n".join(lines)

        _write(out, f"{label} {backend} report", lambda: report(None))
        try:
            whole = program.plan(shapes, backend=backend)
        except Exception:  # noqa: BLE001
            whole = None
        limits: list[float | None] = [None]
        if whole is not None and whole.peak_bytes > 100_000:
            result = 8 * max(math.prod(shape) for shape in whole.output_shapes)
            limits.append(result + (whole.peak_bytes - result) / 4)
            _write(out, f"{label} {backend} sliced report", lambda limit=limits[1]: report(limit))
        for limit in limits:
            limit_bytes = None if limit is None else int(limit)

            def source(limit_bytes: int | None = limit_bytes, backend: str = backend) -> str:
                plan = build_plan(program.ir, program.info, shapes, 8, get_backend(backend), "auto", limit_bytes,
                                  program.source)
                return f"peak {plan.peak_bytes}\n{plan.source}"

            _write(out, f"{label} {backend} plan source limit={limit_bytes}", source)
        for dtype in ("float64", "float32"):
            def called(dtype: str = dtype, backend: str = backend) -> str:
                program._plans.clear()
                program(_arrays(program, shapes, dtype), backend=backend)
                return "\n".join(plan.source for plan in program._plans.values())

            _write(out, f"{label} {backend} {dtype} called source", called)


def main(path: str) -> None:
    assert ef.__file__.startswith(__file__.rsplit("/benchmarks/", 1)[0]), f"imported {ef.__file__}"
    warnings.simplefilter("ignore")
    out: list[str] = []
    for text, shapes in CORPUS:
        _write(out, text, lambda text=text, shapes=shapes: snapshot(ef.compile(text), text, shapes, out))
    for text, wrt, shapes in DERIVATIVES:
        _write(out, f"grad {text} wrt {wrt}", lambda text=text, wrt=wrt, shapes=shapes:
               snapshot(ef.grad(text, wrt=wrt), f"grad {text} wrt {wrt}", shapes, out))
    with open(path, "w") as file:
        file.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "plan_snapshot.txt")
