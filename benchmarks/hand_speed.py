"""The numpy backend against straight-line hand-written numpy/scipy (issue 34, item 4), one core for every side.

Rows (einflow's program on numpy arrays ÷ the same computation written by hand, target 1.1x):

1. a 10-statement program on 4-element vectors (``overhead.straight_line``): the per-call overhead;
2. the logistic-regression gradient, X 2000 x 1000 (float64);
3. an MLP's ``value_and_grad`` (784-512-10, relu, softmax cross-entropy, batch 256, float32), loss and the four
   parameter gradients;
4. the Gaussian-process negative log likelihood's gradient by X (n = 2000, d = 50, float64) against one
   Cholesky factor and one ``scipy.linalg.cho_solve`` of ``[y, X]``;

and (target 1.5x) 3x3 convolutions on numpy arrays, (8, 64, 56, 56) * (64, 64, 3, 3) float32, forward and
forward+backward (``value_and_grad`` of ``sum(T * conv)`` by x and K), against torch's ``conv2d`` (+ autograd).

Each pair is timed in one process, interleaved, the order reversed every other round, after a warm-up; the
medians are printed with their ratio. Run pinned to one core with one BLAS thread:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 0 python benchmarks/hand_speed.py

(the script sets the thread variables itself when they are unset, before numpy is imported).
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import Row, calibrate, combined_table, machine, seconds  # noqa: E402
from overhead import straight_line  # noqa: E402

import einflow as ef  # noqa: E402

__all__ = ["run", "main", "paired", "CASES"]

LOGISTIC = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"
MLP = """h[n,j] = relu(X[n,i] W1[i,j] + b1[j])
z[n,k] = h[n,j] W2[j,k] + b2[k]
L = sum[n](logsumexp[k](z[n,k])) - sum[n,k](Y[n,k] z[n,k])"""
GP = ("K[i,j] = X[i,d] X[j,d] + s delta[i,j]\nspd K\n"
      "f = 0.5 y[i] inv[i,j](K[i,j]) y[j] + 0.5 logdet[i,j](K[i,j])")
CONV = "y[n,o,h,w] = x[n,c,h+r,w+s] K[o,c,r,s]"
CONV_LOSS = CONV + "\nL = sum[n,o,h,w](T[n,o,h,w] y[n,o,h,w])"


def paired(candidates: dict[str, Callable[[], Any]], repeat: int, number: int = 1,
           clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per call of each candidate: one warm-up each, then ``repeat`` rounds of ``number`` calls
    each, the candidates alternated and the order reversed every other round."""
    for function in candidates.values():
        function()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for round_ in range(repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            function = candidates[name]
            start = clock()
            for _ in range(number):
                function()
            samples[name].append((clock() - start) / number)
    return {name: statistics.median(values) for name, values in samples.items()}


# ---------------------------------------------------------------------------------------------------- the cases
def straight_case() -> tuple[Callable[[], Any], Callable[[], Any], str]:
    text, hand_text = straight_line(10)
    namespace: dict[str, Any] = {"np": np}
    exec(hand_text, namespace)  # noqa: S102 - the benchmark's own reference
    hand = namespace["hand"]
    program = ef.compile(text)
    rng = np.random.default_rng(0)
    inputs = dict(W=rng.standard_normal((4, 4)) / 2, x=rng.standard_normal(4), y=rng.standard_normal(4))
    assert np.allclose(program(inputs), hand(**inputs))
    return (lambda: program(**inputs)), (lambda: hand(**inputs)), "10-statement program, 4-element vectors"


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * z) + 1)


def logistic_case() -> tuple[Callable[[], Any], Callable[[], Any], str]:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2000, 1000)) / np.sqrt(1000)
    y = np.sign(rng.standard_normal(2000))
    w = rng.standard_normal(1000)
    gradient = ef.grad(LOGISTIC, wrt="w")

    def hand() -> np.ndarray:
        return X.T @ (-y * _sigmoid(-y * (X @ w)))

    assert np.allclose(gradient(X=X, y=y, w=w), hand(), rtol=1e-10, atol=1e-12)
    return (lambda: gradient(X=X, y=y, w=w)), hand, "logistic-regression gradient, X 2000 x 1000, float64"


def mlp_case() -> tuple[Callable[[], Any], Callable[[], Any], str]:
    rng = np.random.default_rng(2)
    f32 = np.float32
    X = rng.standard_normal((256, 784)).astype(f32)
    Y = np.eye(10, dtype=f32)[rng.integers(0, 10, 256)]
    W1 = (rng.standard_normal((784, 512)) / 28).astype(f32)
    b1 = (0.1 * rng.standard_normal(512)).astype(f32)
    W2 = (rng.standard_normal((512, 10)) / 22).astype(f32)
    b2 = (0.1 * rng.standard_normal(10)).astype(f32)
    both = ef.value_and_grad(MLP, wrt=["W1", "b1", "W2", "b2"])

    def hand() -> tuple[Any, ...]:
        a = X @ W1 + b1
        h = np.maximum(a, 0)
        z = h @ W2 + b2
        top = z.max(axis=1, keepdims=True)
        e = np.exp(z - top)
        total = e.sum(axis=1, keepdims=True)
        loss = np.sum(np.log(total) + top) - np.sum(Y * z)
        dz = e / total - Y
        dh = dz @ W2.T
        da = dh * (a > 0)
        return loss, (X.T @ da, da.sum(axis=0), h.T @ dz, dz.sum(axis=0))

    value, grads = both(X=X, Y=Y, W1=W1, b1=b1, W2=W2, b2=b2)
    loss, expected = hand()
    assert np.allclose(value, loss, rtol=1e-4)
    for mine, theirs in zip(grads, expected):
        assert mine.dtype == np.float32 and np.allclose(mine, theirs, rtol=1e-3, atol=1e-3)
    return (lambda: both(X=X, Y=Y, W1=W1, b1=b1, W2=W2, b2=b2)), hand, \
        "MLP value_and_grad 784-512-10 (relu, softmax cross-entropy), batch 256, float32"


def gp_case() -> tuple[Callable[[], Any], Callable[[], Any], str]:
    rng = np.random.default_rng(3)
    n, d, s = 2000, 50, 0.5
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    y = rng.standard_normal(n)
    gradient = ef.grad(GP, wrt="X")

    def hand() -> np.ndarray:
        K = X @ X.T
        K[np.diag_indices_from(K)] += s
        factor = scipy.linalg.cho_factor(K, lower=True, overwrite_a=True, check_finite=False)
        solved = scipy.linalg.cho_solve(factor, np.column_stack([y, X]), check_finite=False)
        alpha = solved[:, 0]
        return solved[:, 1:] - np.outer(alpha, alpha @ X)

    assert np.allclose(gradient(X=X, y=y, s=s), hand(), rtol=1e-7, atol=1e-8)
    return (lambda: gradient(X=X, y=y, s=s)), hand, "GP likelihood gradient by X, n = 2000, d = 50, float64"


CASES = {"straight": straight_case, "logistic": logistic_case, "mlp": mlp_case, "gp": gp_case}


def convolution_rows(batch: int, repeat: int, clock: Callable[[], float] = time.process_time) -> list[Row]:
    """einflow's numpy backend on a 3x3 convolution against torch's conv2d (one thread), forward and
    forward+backward."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _convolution_rows(torch, batch, repeat, clock)
    finally:
        torch.set_num_threads(threads)


def _convolution_rows(torch: Any, batch: int, repeat: int, clock: Callable[[], float]) -> list[Row]:
    F = torch.nn.functional
    rng = np.random.default_rng(4)
    xn = rng.standard_normal((batch, 64, 56, 56)).astype(np.float32)
    Kn = (0.05 * rng.standard_normal((64, 64, 3, 3))).astype(np.float32)
    Tn = rng.standard_normal((batch, 64, 54, 54)).astype(np.float32)
    x, K, T = torch.from_numpy(xn), torch.from_numpy(Kn), torch.from_numpy(Tn)
    forward = ef.compile(CONV)
    both = ef.value_and_grad(CONV_LOSS, wrt=["x", "K"])
    xr, Kr = x.clone().requires_grad_(True), K.clone().requires_grad_(True)

    def torch_both() -> None:
        xr.grad = Kr.grad = None
        (F.conv2d(xr, Kr) * T).sum().backward()

    torch_both()
    assert np.allclose(forward(x=xn, K=Kn), F.conv2d(x, K).numpy(), atol=1e-3)
    _, (gx, gK) = both(x=xn, K=Kn, T=Tn)
    assert np.allclose(gx, xr.grad.numpy(), atol=1e-3)
    assert np.allclose(gK, Kr.grad.numpy(), rtol=1e-3, atol=1e-2)
    rows = []
    with torch.no_grad():
        times = paired({"einflow": lambda: forward(x=xn, K=Kn), "torch": lambda: F.conv2d(x, K)}, repeat, 1, clock)
    rows.append(Row("hand speed", f"conv2d ({batch}, 64, 56, 56) * (64, 64, 3, 3) float32, forward",
                    seconds(times["einflow"]), f"torch conv2d {seconds(times['torch'])}",
                    times["einflow"] / times["torch"], 1.5))
    times = paired({"einflow": lambda: both(x=xn, K=Kn, T=Tn), "torch": torch_both}, repeat, 1, clock)
    rows.append(Row("hand speed", f"conv2d ({batch}, 64, 56, 56) same, forward+backward (value_and_grad by x, K)",
                    seconds(times["einflow"]), f"torch conv2d + backward {seconds(times['torch'])}",
                    times["einflow"] / times["torch"], 1.5))
    return rows


def run(repeat: int = 15, only: tuple[str, ...] = (), batch: int = 8,
        clock: Callable[[], float] = time.process_time) -> tuple[str, list[Row]]:
    """Every row (``only``: the named cases, ``conv`` for the convolutions); returns the table and its rows.
    ``clock``: the process's CPU time by default (one thread everywhere; not stretched by other jobs on a shared
    machine), ``time.perf_counter`` for wall time."""
    rows = []
    for name, case in CASES.items():
        if only and name not in only:
            continue
        mine, hand, label = case()
        number = calibrate(mine, 0.05)
        times = paired({"einflow": mine, "hand": hand}, repeat, number, clock)
        rows.append(Row("hand speed", label, seconds(times["einflow"]), f"hand numpy/scipy {seconds(times['hand'])}",
                        times["einflow"] / times["hand"], 1.1))
    if not only or "conv" in only:
        rows.extend(convolution_rows(batch, max(9, repeat // 3), clock))  # (medians of 9 rounds at least)
    return combined_table(rows), rows


def main() -> None:
    only = tuple(argument for argument in sys.argv[1:] if not argument.startswith("-"))
    repeat = 5 if "--quick" in sys.argv else 15
    clock = time.perf_counter if "--wall" in sys.argv else time.process_time
    table, _ = run(repeat, only, clock=clock)
    print(f"## The numpy backend against hand-written numpy ({machine()}, load {os.getloadavg()[0]:.1f}, "
          f"{'wall' if '--wall' in sys.argv else 'CPU'} time)\n")
    print(table)


if __name__ == "__main__":
    main()
