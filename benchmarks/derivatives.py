"""Derivative benchmark: einflow vs hand-derived numpy vs jax.jit / torch (when installed).

Rows: logistic-regression gradient and Hessian (2000x1000), quadratic-form Hessian (n=2000),
matrix-factorization Hessian (200x300, r=10). Medians of interleaved repeats; ratios to hand numpy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, format_table, machine, optional  # noqa: E402

import einflow as ef  # noqa: E402

LOGISTIC = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"
QUADRATIC = "f = x[i] A[i,j] x[j]"
FACTOR = "L = sum[i,j]((T[i,j] - U[i,r] V[j,r])^2)"


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * z) + 1)


def _torch_gradient(th, function, args):  # noqa: ANN001 - torch is optional
    """Gradient of ``function`` in its first argument with torch autograd (one backward pass)."""
    first = args[0].clone().requires_grad_(True)
    (gradient,) = th.autograd.grad(function(first, *args[1:]), first)
    return gradient


def cases(rng: np.random.Generator) -> list[dict]:
    n, d = 2000, 1000
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    y = np.sign(rng.normal(size=n))
    w = rng.normal(size=d)
    A = rng.normal(size=(2000, 2000))
    x = rng.normal(size=2000)
    T = rng.normal(size=(200, 300))
    U = rng.normal(size=(200, 10))
    V = rng.normal(size=(300, 10))

    def logistic_grad() -> np.ndarray:
        z = -y * (X @ w)
        return X.T @ (-y * _sigmoid(z))

    def logistic_hessian() -> np.ndarray:
        z = -y * (X @ w)
        s = _sigmoid(z)
        return X.T @ ((s * (1 - s))[:, None] * X)

    def quadratic_hessian() -> np.ndarray:
        return A + A.T

    def factor_hessian() -> np.ndarray:
        block = 2 * V.T @ V
        H = np.zeros((200, 10, 200, 10))
        for i in range(200):
            H[i, :, i, :] = block
        return H

    return [
        dict(name="logistic gradient (2000x1000)", kind="grad", text=LOGISTIC, wrt="w",
             arrays=dict(X=X, y=y, w=w), hand=logistic_grad,
             jax=lambda jnp: lambda w_, X_, y_: jnp.sum(jnp.logaddexp(0.0, -y_ * (X_ @ w_))), argnames=("w", "X", "y"),
             torch=lambda th: lambda w_, X_, y_: th.nn.functional.softplus(-y_ * (X_ @ w_)).sum()),
        dict(name="logistic Hessian (2000x1000)", kind="hessian", text=LOGISTIC, wrt="w",
             arrays=dict(X=X, y=y, w=w), hand=logistic_hessian,
             jax=lambda jnp: lambda w_, X_, y_: jnp.sum(jnp.logaddexp(0.0, -y_ * (X_ @ w_))), argnames=("w", "X", "y"),
             torch=lambda th: lambda w_, X_, y_: th.nn.functional.softplus(-y_ * (X_ @ w_)).sum()),
        dict(name="quadratic-form Hessian (n=2000)", kind="hessian", text=QUADRATIC, wrt="x",
             arrays=dict(x=x, A=A), hand=quadratic_hessian,
             jax=lambda jnp: lambda x_, A_: x_ @ A_ @ x_, argnames=("x", "A"),
             torch=lambda th: lambda x_, A_: x_ @ A_ @ x_),
        dict(name="matrix-factorization Hessian (200x300, r=10)", kind="hessian", text=FACTOR, wrt="U",
             arrays=dict(U=U, T=T, V=V), hand=factor_hessian,
             jax=lambda jnp: lambda U_, T_, V_: jnp.sum((T_ - U_ @ V_.T) ** 2), argnames=("U", "T", "V"),
             torch=lambda th: lambda U_, T_, V_: ((T_ - U_ @ V_.T) ** 2).sum()),
    ]


def run(repeat: int = 7, torch_hessians: bool = False) -> tuple[str, list[list[str]]]:
    """Measure every case; returns (markdown table, rows).

    torch's Hessians (``torch.autograd.functional.hessian``, one backward pass per row) take 10-40 s per
    call here, so they are measured only when ``torch_hessians`` is set, and then with 3 repeats.
    """
    rng = np.random.default_rng(0)
    jax = optional("jax")
    torch = optional("torch")
    rows = []
    for case in cases(rng):
        derive = ef.grad if case["kind"] == "grad" else ef.hessian
        program = derive(case["text"], wrt=case["wrt"])
        arrays = case["arrays"]
        ours = program(arrays)
        reference = case["hand"]()
        assert np.allclose(ours, reference, rtol=1e-7, atol=1e-8), case["name"]
        candidates = {"einflow": lambda p=program, a=arrays: p(a), "numpy (hand)": case["hand"]}
        if jax is not None:
            import jax.numpy as jnp

            jax.config.update("jax_enable_x64", True)
            f = case["jax"](jnp)
            transform = jax.grad if case["kind"] == "grad" else jax.hessian
            compiled = jax.jit(transform(f))
            args = [jnp.asarray(arrays[n]) for n in case["argnames"]]
            check = np.asarray(compiled(*args))
            assert np.allclose(check, reference, rtol=1e-6, atol=1e-6), case["name"] + " (jax)"
            candidates["jax.jit"] = lambda c=compiled, a=args: c(*a).block_until_ready()
        if torch is not None and (case["kind"] == "grad" or torch_hessians):
            import torch as th

            targs = [th.from_numpy(arrays[n]) for n in case["argnames"]]
            tf = case["torch"](th)
            if case["kind"] == "hessian":
                candidates["torch"] = lambda f=tf, a=targs: th.autograd.functional.hessian(
                    lambda first: f(first, *a[1:]), a[0])
            else:
                candidates["torch"] = lambda f=tf, a=targs: _torch_gradient(th, f, a)
            check = candidates["torch"]()
            check = check[0] if isinstance(check, tuple) else check
            assert np.allclose(check.detach().numpy(), reference, rtol=1e-6, atol=1e-6), case["name"] + " (torch)"
        slow = {"torch"} if case["kind"] == "hessian" else set()
        times = compare({k: v for k, v in candidates.items() if k not in slow}, repeat=repeat)
        if slow & candidates.keys():
            times.update(compare({k: candidates[k] for k in slow & candidates.keys()}, repeat=3))
        base = times["numpy (hand)"]
        row = [case["name"], f"{times['einflow'] * 1e3:.2f} ms", f"{times['einflow'] / base:.2f}x"]
        row.append(f"{times['jax.jit'] / times['einflow']:.1f}x" if "jax.jit" in times else "n/a")
        row.append(f"{times['torch'] / times['einflow']:.1f}x" if "torch" in times else "n/a")
        rows.append(row)
    header = ["case", "einflow", "einflow / hand numpy", "jax.jit / einflow", "torch / einflow"]
    return format_table(rows, header), rows


def main() -> None:
    table, _ = run(torch_hessians="--torch-hessians" in sys.argv)
    print(f"## Derivatives ({machine()})\n")
    print(table)


if __name__ == "__main__":
    main()
