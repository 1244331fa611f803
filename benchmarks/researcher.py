"""Researcher benchmark: softmax, log_softmax, softmax cross-entropy, GELU (erf), layer norm, attention.

Each case is written twice in einflow, from primitives (exp, log, sum, sqrt) and with the built-ins
(softmax, log_softmax, logsumexp, mean, erf), and has a hand-written stable numpy gradient and a JAX
version. ``tests/test_researcher.py`` checks value, gradient and Hessian of both einflow forms against
JAX in float64 (rtol 1e-9) and float32 stability at |x| <= 200; this script times the einflow gradient
program against the hand-written numpy gradient and ``jax.jit(jax.grad)`` (medians of interleaved samples of
about 5 ms each: many calls per sample for the microsecond-sized gradients).

Run:  python benchmarks/researcher.py [n] [repeat] [--cpu]   (defaults 2048 5; about a minute; --cpu: CPU time)
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import einflow as ef  # noqa: E402

_ERF = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ERF(x), dtype=x.dtype)


def _softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@dataclass(frozen=True)
class Case:
    """One model piece: einflow texts (primitives, built-ins), the variable, inputs, numpy and JAX references."""

    name: str
    primitives: str
    builtins: str
    wrt: str
    make: Callable[[np.random.Generator, int], dict[str, np.ndarray]]
    numpy_grad: Callable[..., np.ndarray]
    jax_loss: Callable[[Any], Callable[..., Any]]  # jax.numpy module -> loss(**inputs)


def _vector(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"x": rng.normal(size=n), "w": rng.normal(size=n)}


def _softmax_grad(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    s = _softmax(x)
    return s * (w - s @ w)


def _log_softmax_grad(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return w - _softmax(x) * w.sum()


def _ce_inputs(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    batch, features, classes = max(n // 4, 2), 16, 10
    labels = rng.integers(0, classes, size=batch)
    return {"X": rng.normal(size=(batch, features)), "W": rng.normal(size=(features, classes)),
            "Y": np.eye(classes)[labels]}


def _ce_grad(X: np.ndarray, W: np.ndarray, Y: np.ndarray) -> np.ndarray:
    p = _softmax(X @ W)
    return X.T @ (p * Y.sum(1, keepdims=True) - Y)


def _gelu_grad(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return w * (0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))


def _layer_norm_grad(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    mu = x.mean()
    sigma = np.sqrt(((x - mu) ** 2).mean() + 1e-5)
    xhat = (x - mu) / sigma
    return (w - w.mean() - xhat * (w * xhat).mean()) / sigma


def _attention_inputs(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    queries, keys, dim = max(n // 8, 2), max(n // 8, 2), 16
    return {"Q": rng.normal(size=(queries, dim)), "K": rng.normal(size=(keys, dim)),
            "V": rng.normal(size=(keys, dim)), "G": rng.normal(size=(queries, dim)),
            "scale": np.asarray(1 / math.sqrt(dim))}


def _attention_grad(Q: np.ndarray, K: np.ndarray, V: np.ndarray, G: np.ndarray, scale: np.ndarray) -> np.ndarray:
    a = _softmax(Q @ K.T * scale)
    da = G @ V.T
    ds = a * (da - (da * a).sum(1, keepdims=True))
    return ds @ K * scale


CASES: tuple[Case, ...] = (
    Case("softmax",
         "L = sum[i](w[i] exp(x[i]) / sum[j](exp(x[j])))",
         "L = sum[i](w[i] softmax[i](x[i]))",
         "x", _vector, _softmax_grad,
         lambda jnp: lambda x, w: jnp.sum(w * jnp.exp(x - jnp.max(x)) / jnp.sum(jnp.exp(x - jnp.max(x))))),
    Case("log_softmax",
         "L = sum[i](w[i] (x[i] - log(sum[j](exp(x[j])))))",
         "L = sum[i](w[i] log_softmax[i](x[i]))",
         "x", _vector, _log_softmax_grad,
         lambda jnp: lambda x, w: jnp.sum(w * (x - _jax_lse(jnp, x)))),
    Case("cross-entropy of softmax",
         "Z[b,c] = X[b,f] W[f,c]\nL = -sum[b,c](Y[b,c] (Z[b,c] - log(sum[k](exp(Z[b,k])))))",
         "Z[b,c] = X[b,f] W[f,c]\nL = -sum[b,c](Y[b,c] log_softmax[c](Z[b,c]))",
         "W", _ce_inputs, _ce_grad,
         lambda jnp: lambda X, W, Y: -jnp.sum(Y * ((X @ W) - _jax_lse(jnp, X @ W, axis=1)[:, None]))),
    Case("GELU (erf)",
         "L = sum[i](0.5 w[i] x[i] (1 + erf(x[i] * 0.7071067811865476)))",
         "L = sum[i](0.5 w[i] x[i] (1 + erf(x[i] * 0.7071067811865476)))",
         "x", _vector, _gelu_grad,
         lambda jnp: lambda x, w: jnp.sum(w * 0.5 * x * (1 + _jax_erf(x * 0.7071067811865476)))),
    Case("layer norm",
         "n = sum[j](x[j] * 0 + 1)\nmu = sum[j](x[j]) / n\n"
         "L = sum[i](w[i] (x[i] - mu) / sqrt(sum[j]((x[j] - mu)^2) / n + 0.00001))",
         "L = sum[i](w[i] (x[i] - mean[j](x[j])) / sqrt(mean[j]((x[j] - mean[k](x[k]))^2) + 0.00001))",
         "x", _vector, _layer_norm_grad,
         lambda jnp: lambda x, w: jnp.sum(w * (x - jnp.mean(x)) / jnp.sqrt(jnp.mean((x - jnp.mean(x)) ** 2) + 1e-5))),
    Case("attention",
         "S[q,k] = Q[q,d] K[k,d] * scale\nE[q,k] = exp(S[q,k])\nA[q,k] = E[q,k] / sum[j](E[q,j])\n"
         "L = A[q,k] V[k,e] G[q,e]",
         "S[q,k] = Q[q,d] K[k,d] * scale\nA[q,k] = softmax[k](S[q,k])\nL = A[q,k] V[k,e] G[q,e]",
         "Q", _attention_inputs, _attention_grad,
         lambda jnp: lambda Q, K, V, G, scale: jnp.sum(_jax_softmax(jnp, Q @ K.T * scale) @ V * G)),
)


def _jax_lse(jnp: Any, z: Any, axis: int | None = None) -> Any:
    import jax

    return jax.scipy.special.logsumexp(z, axis=axis)


def _jax_softmax(jnp: Any, z: Any) -> Any:
    import jax

    return jax.nn.softmax(z, axis=1)


def _jax_erf(x: Any) -> Any:
    import jax

    return jax.scipy.special.erf(x)


def main(n: int = 2048, repeat: int = 5, cpu: bool = False) -> list[tuple[str, str, float, float, float | None]]:
    """Time every case; ``cpu``: CPU time of the process (all threads: jax's too) instead of wall time."""
    from common import calibrate, compare, machine, optional

    jax = optional("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    rows = []
    for case in CASES:
        inputs = case.make(rng, n)
        hand = case.numpy_grad(**inputs)
        jitted = None
        if jax is not None:
            function = jax.jit(jax.grad(case.jax_loss(jax.numpy), argnums=list(inputs).index(case.wrt)))
            positional = tuple(inputs.values())
            jitted = lambda f=function, a=positional: np.asarray(f(*a))  # noqa: E731
        for form in ("primitives", "builtins"):
            gradient = ef.grad(getattr(case, form), wrt=case.wrt)
            arguments = {name: inputs[name] for name in gradient.inputs}
            np.testing.assert_allclose(gradient(**arguments), hand, rtol=1e-9, atol=1e-12)
            candidates = {"einflow": lambda g=gradient, a=arguments: g(**a),
                          "numpy": lambda a=inputs, f=case.numpy_grad: f(**a)}
            if jitted is not None:
                candidates["jax.jit"] = jitted
            # each sample runs long enough (~5 ms) that a 10-30 us call is not timed against the clock's noise
            times = compare(candidates, repeat=repeat, number=calibrate(candidates["numpy"], 0.005),
                            clock=time.process_time if cpu else time.perf_counter)
            jax_ratio = times["jax.jit"] / times["einflow"] if "jax.jit" in times else None
            rows.append((case.name, form, times["einflow"], times["einflow"] / times["numpy"], jax_ratio))
            shown = "n/a" if jax_ratio is None else f"{jax_ratio:.2f}x"
            print(f"{case.name:26s} {form:10s} einflow {times['einflow'] * 1e3:8.3f} ms   "
                  f"einflow/numpy {times['einflow'] / times['numpy']:5.2f}x   jax.jit/einflow {shown}", flush=True)
    print(machine())
    return rows


if __name__ == "__main__":
    numbers = [int(argument) for argument in sys.argv[1:] if argument.isdigit()]
    main(*numbers[:2], cpu="--cpu" in sys.argv)
