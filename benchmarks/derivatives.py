"""Derivative benchmark: einflow vs hand-derived numpy vs jax.jit / torch (when installed).

Rows: logistic-regression gradient and Hessian (2000x1000), quadratic-form Hessian (n=2000),
matrix-factorization Hessian (200x300, r=10). Medians of interleaved repeats; ratios to hand numpy.

Second table (``structure``): derivatives that must keep the forward's structure, with the plan's FLOP
ratio derivative / forward (default optimizer, plan report totals): gradients of a ring trace and a
4x4 grid network by every factor (shared adjoints), value_and_grad vs grad, a 3-layer tanh MLP
Hessian, the pairwise-energy Hessian (n=200 by default; ``--full`` runs n=2483 in a subprocess with
its peak RSS) and a softmax cross-entropy HVP (B=64, V=256).
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


def _ring(count: int) -> tuple[str, list[str]]:
    indices = [f"a{k}" for k in range(count)]
    factors = " ".join(f"A{k}[{indices[k]},{indices[(k + 1) % count]}]" for k in range(count))
    return f"L = sum[{','.join(indices)}]({factors})", [f"A{k}" for k in range(count)]


def _grid(rows: int, columns: int) -> tuple[str, dict[str, int], str]:
    """Program text, tensor ranks and the numpy einsum equation of a closed rows x columns grid."""
    factors, ranks, operands, letters = [], {}, [], {}
    for i in range(rows):
        for j in range(columns):
            legs = ([f"v{i - 1}_{j}"] if i > 0 else []) + ([f"v{i}_{j}"] if i < rows - 1 else [])
            legs += ([f"h{i}_{j - 1}"] if j > 0 else []) + ([f"h{i}_{j}"] if j < columns - 1 else [])
            factors.append(f"T{i}{j}[{','.join(legs)}]")
            ranks[f"T{i}{j}"] = len(legs)
            operands.append("".join(letters.setdefault(leg, chr(ord("a") + len(letters))) for leg in legs))
    return "L = " + " ".join(factors), ranks, ",".join(operands) + "->"


MLP3 = """h1[i] = tanh(W1[i,j] x[j])
h2[i] = tanh(W2[i,j] h1[j])
h3[i] = tanh(W3[i,j] h2[j])
L = sum[i](h3[i]^2)"""
PAIRWISE = "E = sum[i,j](exp(-sum[d]((x[i,d] - x[j,d])^2)))"
SOFTMAX_CE = """z[n,v] = W[v,f] X[n,f] + b[v]
L = sum[n](logsumexp[v](z[n,v]) - sum[v](Y[n,v] z[n,v]))"""


def _mlp_hessian_hand(W1: np.ndarray, W2: np.ndarray, W3: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The 3-layer MLP Hessian by W1 written out: the Hessian by z1 = W1 x, then the outer product with x."""
    hz = _mlp_hessian_by_z1(W1, W2, W3, x)
    return hz[:, None, :, None] * x[None, :, None, None] * x[None, None, None, :]


def _mlp_hessian_diagonal_hand(W1: np.ndarray, W2: np.ndarray, W3: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Its diagonal: H[p,q,p,q] = Hz[p,p] x[q]^2."""
    return np.outer(np.diagonal(_mlp_hessian_by_z1(W1, W2, W3, x)), x * x)


def _mlp_hessian_by_z1(W1: np.ndarray, W2: np.ndarray, W3: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The 3-layer MLP's Hessian by z1 = W1 x (a matrix)."""
    h1 = np.tanh(W1 @ x)
    h2 = np.tanh(W2 @ h1)
    h3 = np.tanh(W3 @ h2)
    a1, a2, a3 = 1 - h1**2, 1 - h2**2, 1 - h3**2
    u = W2 * a1[None, :]  # dz2/dz1
    g = W3 @ (a2[:, None] * u)  # dz3/dz1
    j3 = a3[:, None] * g  # dh3/dz1
    c3 = 2 * h3  # dL/dh3
    # d2L/dz1^2 = J3^T 2 J3 + sum_i c3_i d2h3_i
    hz = 2 * j3.T @ j3
    hz += -2 * (g.T * (c3 * h3 * a3)) @ g
    c2 = W3.T @ (c3 * a3)  # dL/dh2 through h3
    hz += -2 * (u.T * (c2 * h2 * a2)) @ u
    c1 = W2.T @ (c2 * a2)  # dL/dh1
    hz += np.diag(-2 * c1 * h1 * a1)
    return hz


def _pairwise_hessian_hand(x: np.ndarray) -> np.ndarray:
    d = x[:, None, :] - x[None, :, :]
    k = np.exp(-np.sum(d**2, axis=2))
    n, dims = x.shape
    off = -8 * k[:, None, :, None] * d.transpose(0, 2, 1)[:, :, :, None] * d[:, None, :, :]
    off += 4 * k[:, None, :, None] * np.eye(dims)[None, :, None, :]
    rows = np.arange(n)
    diagonal = off.sum(axis=2)
    off[rows, :, rows, :] -= diagonal
    return off


def _softmax_hvp_hand(W: np.ndarray, b: np.ndarray, X: np.ndarray, Y: np.ndarray, T: np.ndarray) -> np.ndarray:
    z = X @ W.T + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dz = X @ T.T
    dp = p * (dz - np.sum(p * dz, axis=1, keepdims=True))
    return dp.T @ X


def _flops(program: ef.Program, **arrays: np.ndarray) -> int:
    return program.plan(**{k: v.shape for k, v in arrays.items()}).flops


def structure(repeat: int = 5, full: bool = False) -> tuple[str, list[list[str]]]:
    """FLOP ratios (derivative / forward) and times of the derivatives that share the forward's structure."""
    rng = np.random.default_rng(1)
    jax = optional("jax")
    if jax is not None:
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
    rows: list[list[str]] = []

    def measure(name: str, derived: ef.Program, forward: ef.Program, arrays: dict, hand, jax_fn,  # noqa: ANN001
                ratio_note: str = "") -> None:
        shapes = {k: v.shape for k, v in arrays.items() if k in forward.inputs}
        ratio = derived.plan(**{k: v.shape for k, v in arrays.items() if k in derived.inputs}).flops
        ratio /= forward.plan(**shapes).flops
        candidates = {"einflow": lambda: derived(arrays)}
        if hand is not None:
            candidates["numpy (hand)"] = hand
        if jax_fn is not None:
            candidates["jax.jit"] = jax_fn
        times = compare(candidates, repeat=repeat)
        ours = times["einflow"]
        rows.append([name, f"{ratio:.2f}{ratio_note}", f"{ours * 1e3:.2f} ms",
                     f"{ours / times['numpy (hand)']:.2f}x" if "numpy (hand)" in times else "n/a",
                     f"{times['jax.jit'] / ours:.1f}x" if "jax.jit" in times else "n/a"])

    # rings: gradient by all N factors (16x16)
    for count in (12, 50):
        text, names = _ring(count)
        arrays = {n: rng.normal(size=(16, 16)) / 4 for n in names}
        gradient = ef.grad(text, wrt=names)

        def hand(arrays: dict = arrays, names: list = names) -> list:
            mats = [arrays[n] for n in names]
            prefix = [np.eye(16)]
            for m in mats[:-1]:
                prefix.append(prefix[-1] @ m)
            suffix = np.eye(16)
            grads = [None] * len(mats)
            for k in range(len(mats) - 1, -1, -1):
                grads[k] = (suffix @ prefix[k]).T
                suffix = mats[k] @ suffix
            return grads

        reference = hand()
        got = gradient(arrays)
        assert all(np.allclose(g, r, rtol=1e-8, atol=1e-10) for g, r in zip(got, reference)), "ring"
        jax_fn = None
        if jax is not None:
            def trace(*ms):  # noqa: ANN002, ANN202
                out = ms[0]
                for m in ms[1:]:
                    out = out @ m
                return jnp.trace(out)

            compiled = jax.jit(jax.grad(trace, argnums=tuple(range(count))))
            jargs = [jnp.asarray(arrays[n]) for n in names]
            jax_fn = lambda c=compiled, a=jargs: jax.block_until_ready(c(*a))  # noqa: E731
        measure(f"ring N={count} (16x16), grad by all N", gradient, ef.compile(text), arrays, hand, jax_fn)
    # 4x4 grid, bond 8: gradient by all 16 tensors
    text, ranks, equation = _grid(4, 4)
    arrays = {n: rng.normal(size=(8,) * r) / 3 for n, r in ranks.items()}
    gradient = ef.grad(text, wrt=list(ranks))
    jax_fn = None
    if jax is not None:
        compiled = jax.jit(jax.grad(lambda *t: jnp.einsum(equation, *t, optimize="dp"),
                                    argnums=tuple(range(16))))
        jargs = [jnp.asarray(arrays[n]) for n in ranks]
        jax_fn = lambda c=compiled, a=jargs: jax.block_until_ready(c(*a))  # noqa: E731
    forward = ef.compile(text)
    shapes = {n: a.shape for n, a in arrays.items()}
    dp_ratio = gradient.plan(**shapes).flops / forward.plan(optimize="dp", **shapes).flops
    measure("4x4 grid (bond 8), grad by all 16", gradient, forward, arrays, None, jax_fn,
            f" (vs dp forward: {dp_ratio:.2f})")
    # value_and_grad vs grad (logistic regression)
    X = rng.normal(size=(2000, 1000)) / np.sqrt(1000)
    y = np.sign(rng.normal(size=2000))
    w = rng.normal(size=1000)
    both = ef.value_and_grad(LOGISTIC, wrt="w")
    grad_alone = _flops(ef.grad(LOGISTIC, wrt="w"), X=X, y=y, w=w) / _flops(ef.compile(LOGISTIC), X=X, y=y, w=w)
    measure("logistic value_and_grad (2000x1000)", both, ef.compile(LOGISTIC), dict(X=X, y=y, w=w),
            lambda: (np.sum(np.logaddexp(0, -y * (X @ w))), X.T @ (-y * _sigmoid(y * (X @ w) * -1))), None,
            f" (grad alone: {grad_alone:.2f})")
    # 3-layer tanh MLP Hessian by W1 (48 units)
    arrays = {"x": rng.normal(size=48)}
    for k in range(1, 4):
        arrays[f"W{k}"] = rng.normal(size=(48, 48)) / 7
    hessian = ef.hessian(MLP3, wrt="W1")
    reference = _mlp_hessian_hand(arrays["W1"], arrays["W2"], arrays["W3"], arrays["x"])
    assert np.allclose(hessian(arrays), reference, rtol=1e-8, atol=1e-10), "mlp"
    jax_fn = None
    if jax is not None:
        def mlp(W1, W2, W3, x):  # noqa: ANN001, ANN202
            return jnp.sum(jnp.tanh(W3 @ jnp.tanh(W2 @ jnp.tanh(W1 @ x))) ** 2)

        compiled = jax.jit(jax.hessian(mlp))
        jargs = [jnp.asarray(arrays[n]) for n in ("W1", "W2", "W3", "x")]
        jax_fn = lambda c=compiled, a=jargs: jax.block_until_ready(c(*a))  # noqa: E731
    measure("3-layer tanh MLP Hessian by W1 (48 units)", hessian, ef.compile(MLP3), arrays,
            lambda a=arrays: _mlp_hessian_hand(a["W1"], a["W2"], a["W3"], a["x"]), jax_fn)
    diagonal = ef.hessian_diagonal(MLP3, wrt="W1")
    reference = _mlp_hessian_diagonal_hand(arrays["W1"], arrays["W2"], arrays["W3"], arrays["x"])
    assert np.allclose(diagonal(arrays), reference, rtol=1e-8, atol=1e-10), "mlp diagonal"
    jax_fn = None
    if jax is not None:
        diagonal_of = jax.jit(lambda *a: jnp.diagonal(jax.hessian(mlp)(*a).reshape(48 * 48, 48 * 48)).reshape(48, 48))
        jax_fn = lambda c=diagonal_of, a=jargs: jax.block_until_ready(c(*a))  # noqa: E731
    measure("same, Hessian diagonal only", diagonal, ef.compile(MLP3), arrays,
            lambda a=arrays: _mlp_hessian_diagonal_hand(a["W1"], a["W2"], a["W3"], a["x"]), jax_fn)
    # pairwise energy Hessian
    n = 200  # jax.hessian builds n*3 tangents of n x n x 3 (15 GB at n=600)
    x = rng.normal(size=(n, 3))
    hessian = ef.hessian(PAIRWISE, wrt="x")
    assert np.allclose(hessian(x=x), _pairwise_hessian_hand(x), rtol=1e-8, atol=1e-8), "pairwise"
    jax_fn = None
    if jax is not None:
        def energy(x_):  # noqa: ANN001, ANN202
            return jnp.sum(jnp.exp(-jnp.sum((x_[:, None, :] - x_[None, :, :]) ** 2, axis=2)))

        compiled = jax.jit(jax.hessian(energy))
        jx = jnp.asarray(x)
        jax_fn = lambda c=compiled, a=jx: jax.block_until_ready(c(a))  # noqa: E731
    measure(f"pairwise-energy Hessian (n={n}, d=3)", hessian, ef.compile(PAIRWISE), {"x": x},
            lambda: _pairwise_hessian_hand(x), jax_fn)
    # softmax cross-entropy HVP (B=64, V=256, F=128)
    B, V, F = 64, 256, 128
    arrays = {"X": rng.normal(size=(B, F)), "W": rng.normal(size=(V, F)) / 10, "b": rng.normal(size=V),
              "Y": np.eye(V)[rng.integers(0, V, B)], "T": rng.normal(size=(V, F))}
    product = ef.hvp(SOFTMAX_CE, wrt="W", tangent="T")
    a = arrays
    assert np.allclose(product(arrays), _softmax_hvp_hand(a["W"], a["b"], a["X"], a["Y"], a["T"]), rtol=1e-8,
                       atol=1e-10), "hvp"
    jax_fn = None
    if jax is not None:
        def loss(W_):  # noqa: ANN001, ANN202
            z = jnp.asarray(a["X"]) @ W_.T + a["b"]
            return jnp.sum(jax.scipy.special.logsumexp(z, axis=1) - jnp.sum(a["Y"] * z, axis=1))

        compiled = jax.jit(lambda W_, T_: jax.jvp(jax.grad(loss), (W_,), (T_,))[1])
        jargs = [jnp.asarray(a["W"]), jnp.asarray(a["T"])]
        jax_fn = lambda c=compiled, j=jargs: jax.block_until_ready(c(*j))  # noqa: E731
    measure(f"softmax cross-entropy HVP (B={B}, V={V}, F={F})", product, ef.compile(SOFTMAX_CE), arrays,
            lambda: _softmax_hvp_hand(a["W"], a["b"], a["X"], a["Y"], a["T"]), jax_fn)
    header = ["case", "FLOPs derivative / forward", "einflow", "einflow / hand numpy", "jax.jit / einflow"]
    table = format_table(rows, header)
    if full:
        table += "\n\n" + _pairwise_full()
    return table, rows


def _pairwise_full() -> str:
    """The pairwise-energy Hessian at n=2483 in a fresh process: time of the second call and peak RSS."""
    import subprocess

    script = (
        "import time, numpy as np, einflow as ef\n"
        f"h = ef.hessian({PAIRWISE!r}, wrt='x')\n"
        "x = np.random.default_rng(0).normal(size=(2483, 3))\n"
        "h(x=x); cpu = time.process_time(); start = time.perf_counter(); H = h(x=x)\n"
        "took, cpu = time.perf_counter() - start, time.process_time() - cpu\n"
        # VmHWM is this process image's own peak: getrusage's ru_maxrss keeps the parent's peak across fork+exec
        "hwm = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM'))\n"
        "print(f'{took:.1f} s ({cpu:.1f} s CPU, all threads), peak RSS "
        "{hwm / 1e6:.2f} GB, result {H.nbytes / 1e9:.2f} GB')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    return f"pairwise-energy Hessian at n=2483 (second call, own process): {done.stdout.strip() or done.stderr[-300:]}"


def main() -> None:
    table, _ = run(torch_hessians="--torch-hessians" in sys.argv)
    print(f"## Derivatives ({machine()})\n")
    print(table)
    table, _ = structure(full="--full" in sys.argv)
    print("\n### Structure: shared adjoints, lean Hessians, HVP (FLOP ratios from the plan report)\n")
    print(table)


if __name__ == "__main__":
    main()
