"""GPU check: the backend test corpus and derivative programs on CuPy against numpy, then timings of a
large contraction and a Hessian against plain CuPy (and torch on CUDA, when installed).

Run on a machine with a CUDA GPU and cupy (``pip install 'einflow[cupy]'``; the corpus lives in
tests/test_backends.py, so pytest must be importable):

    python benchmarks/gpu_check.py            # under a minute on a current GPU; exit status 1 on a mismatch

Without cupy or a usable GPU it says why and exits with status 0 having checked nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import einflow as ef

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
HESSIAN_LOSS = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"
NETWORK = "R[a,e] = T[a,b,c] U[b,c,d] V[d,e]"


def load_corpus() -> Any:
    """tests/test_backends.py as a module (its CORPUS and DERIVATIVES lists)."""
    spec = importlib.util.spec_from_file_location("einflow_backend_corpus", ROOT / "tests" / "test_backends.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def gpu() -> Any:
    """cupy, or None with the reason printed."""
    try:
        import cupy
    except ImportError:
        print("SKIPPED: cupy is not installed (pip install 'einflow[cupy]'); nothing was checked")
        return None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # CUDARuntimeError without a driver
        print(f"SKIPPED: no usable CUDA device ({error}); nothing was checked")
        return None
    if count < 1:
        print("SKIPPED: no CUDA device found; nothing was checked")
        return None
    return cupy


def relative_error(got: Any, want: Any) -> float:
    if isinstance(want, tuple):
        return max(relative_error(g, w) for g, w in zip(got, want))
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
    return float(np.max(np.abs(got - want), initial=0.0)) / scale


def check_programs(cupy: Any) -> tuple[list[list[str]], bool]:
    """Each corpus program and derivative program: cupy (numpy inputs, and cupy inputs with auto) vs numpy."""
    corpus = load_corpus()

    def to_host(value: Any) -> Any:
        return tuple(cupy.asnumpy(x) for x in value) if isinstance(value, tuple) else cupy.asnumpy(value)

    cases: list[tuple[str, Any, dict[str, Any], Any]] = []
    for case in corpus.CORPUS:
        arrays = case.arrays(seed=11)
        cases.append((case.name, ef.compile(case.text), arrays, case.reference(**arrays)))
    try:
        from einflow import grad, hessian  # noqa: F401 - present once derivatives exist
    except ImportError:
        print("note: einflow.grad/hessian not importable: derivative programs not checked")
    else:
        for name, build, shapes, reference in corpus.DERIVATIVES:
            arrays = corpus.Case(name, "", shapes, reference).arrays(seed=12)
            cases.append((name, build(), arrays, reference(**arrays)))
    rows, ok = [], True
    for name, program, arrays, reference in cases:
        on_numpy = program(arrays, backend="numpy")
        on_gpu = program(arrays, backend="cupy")
        device = {k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
        on_gpu_auto = program(device)
        outputs = on_gpu_auto if isinstance(on_gpu_auto, tuple) else (on_gpu_auto,)
        stays = all(isinstance(value, cupy.ndarray) for value in outputs)
        errors = [relative_error(on_numpy, reference), relative_error(to_host(on_gpu), reference),
                  relative_error(to_host(on_gpu_auto), reference)]
        passed = stays and max(errors) < 1e-9
        ok &= passed
        rows.append([name, f"{errors[0]:.1e}", f"{errors[1]:.1e}", f"{errors[2]:.1e}", "yes" if stays else "NO",
                     "ok" if passed else "FAIL"])
    return rows, ok


def median_seconds(function: Callable[[], Any], sync: Callable[[], None], repeat: int = 5) -> float:
    function()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timings(cupy: Any, scale: int = 1) -> list[list[str]]:
    """A large tensor-network contraction and a logistic-loss Hessian: einflow on cupy vs cupy and torch.

    ``scale`` divides the sizes (``--quick`` uses 8: a smoke run of this code, not a measurement).
    """
    sync = cupy.cuda.Device().synchronize
    rng = cupy.random.default_rng(0)
    rows: list[list[str]] = []
    a, b, samples, features = 1024 // scale, 64 // scale, 50_000 // scale, 1000 // scale
    T = rng.standard_normal((a, b, b), dtype=cupy.float32)
    U = rng.standard_normal((b, b, a), dtype=cupy.float32)
    V = rng.standard_normal((a, a), dtype=cupy.float32)
    network = ef.compile(NETWORK)
    candidates: dict[str, Callable[[], Any]] = {
        "einflow (cupy)": lambda: network(T=T, U=U, V=V),
        "cupy.einsum (optimize=True)": lambda: cupy.einsum("abc,bcd,de->ae", T, U, V, optimize=True),
    }
    X = rng.standard_normal((samples, features)) / 30
    y = cupy.sign(rng.standard_normal(samples))
    w = rng.standard_normal(features) / 30
    try:
        hessian_program = ef.hessian(HESSIAN_LOSS, wrt="w")
    except (AttributeError, ImportError):
        hessian_program = None

    def closed_form() -> Any:  # X^T diag(s (1 - s)) X with s = sigmoid(-y Xw): the Matrix Cookbook form
        s = 1 / (1 + cupy.exp(y * (X @ w)))
        return (X * (s * (1 - s))[:, None]).T @ X

    hessians: dict[str, Callable[[], Any]] = {"CuPy closed form": closed_form}
    if hessian_program is not None:
        hessians["einflow hessian (cupy)"] = lambda: hessian_program(X=X, y=y, w=w)
        error = relative_error(cupy.asnumpy(hessians["einflow hessian (cupy)"]()), cupy.asnumpy(closed_form()))
        rows.append(["hessian check", "einflow vs closed form", f"rel. error {error:.1e}"])
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        tT, tU, tV = (torch.as_tensor(a, device="cuda") for a in (T, U, V))
        candidates["torch.einsum"] = lambda: torch.einsum("abc,bcd,de->ae", tT, tU, tV)
        tX, ty, tw = (torch.as_tensor(a, device="cuda") for a in (X, y, w))

        def torch_loss(weights: Any) -> Any:
            return torch.nn.functional.softplus(-ty * (tX @ weights)).sum()

        hessians["torch.autograd hessian"] = lambda: torch.autograd.functional.hessian(torch_loss, tw)
    else:
        rows.append(["torch", "not installed or no CUDA", "-"])

    def both_sync() -> None:
        sync()
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()

    for name, function in candidates.items():
        rows.append([f"{NETWORK}, a={a} b=c={b} d={a} e={a} (float32)", name,
                     f"{median_seconds(function, both_sync) * 1e3:.2f} ms"])
    for name, function in hessians.items():
        rows.append([f"Hessian of logistic loss, X {samples} x {features} (float64)", name,
                     f"{median_seconds(function, both_sync) * 1e3:.2f} ms"])
    return rows


def check_torch_cuda() -> tuple[list[list[str]], bool] | None:
    """einflow on CUDA tensors: results stay on the device in the inputs' dtype, values and gradients
    (EinflowFunction's backward, double backward) match torch on the same device. None without torch/CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    rows: list[list[str]] = []
    ok = True
    generator = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int, dtype: Any = torch.float64) -> Any:
        return torch.randn(*shape, generator=generator, device="cuda", dtype=dtype).requires_grad_(True)

    cases = {
        "mlp loss": ("L = sum[n,o]((tanh(X[n,i] W[i,h] + b[h]) V[h,o] - Y[n,o])^2)",
                     lambda X, W, b, V, Y: ((torch.tanh(X @ W + b) @ V - Y) ** 2).sum(),
                     {"X": (64, 32), "W": (32, 48), "b": (48,), "V": (48, 8), "Y": (64, 8)}),
        "surviving delta": ("H[i,j] = delta[i,j] exp(x[i]) + x[i] x[j]",
                            lambda x: torch.diag(torch.exp(x)) + torch.outer(x, x), {"x": (16,)}),
        "attention": ("S[q,k] = exp(Q[q,d] K[k,d])\nZ[q] = sum[k](S[q,k])\nO[q,e] = S[q,k] V[k,e] / Z[q]",
                      lambda Q, K, V: torch.softmax(Q @ K.T, dim=1) @ V, {"Q": (8, 4), "K": (12, 4), "V": (12, 5)}),
    }
    for label, (text, reference, shapes) in cases.items():
        program = ef.compile(text)
        for dtype in (torch.float32, torch.float64):
            inputs = {name: rand(*shape, dtype=dtype) for name, shape in shapes.items()}
            got = program(inputs)
            want = reference(*inputs.values())
            stays = got.device.type == "cuda" and got.dtype == dtype
            value_err = float(((got - want).abs().max() / (want.abs().max() + 1e-30)).detach())
            cotangent = torch.randn_like(want)
            grads = torch.autograd.grad(got, list(inputs.values()), cotangent, create_graph=True)
            wanted = torch.autograd.grad(want, list(inputs.values()), cotangent, create_graph=True)
            grad_err = max(float((a - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in zip(grads, wanted))
            second = torch.autograd.grad(sum(g.sum() for g in grads), list(inputs.values()), allow_unused=True)
            second_want = torch.autograd.grad(sum(g.sum() for g in wanted), list(inputs.values()), allow_unused=True)
            second_err = max((float((a - b).abs().max() / (b.abs().max() + 1e-30)) for a, b in
                              zip(second, second_want) if a is not None and b is not None), default=0.0)
            tolerance = 1e-4 if dtype == torch.float32 else 1e-10
            good = stays and max(value_err, grad_err, second_err) < tolerance
            ok = ok and good
            rows.append([f"{label} ({str(dtype).split('.')[1]})", f"{value_err:.1e}", f"{grad_err:.1e}",
                         f"{second_err:.1e}", "yes" if stays else "NO", "ok" if good else "MISMATCH"])
    return rows, ok


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[k])) for r in [header, *rows]) for k in range(len(header))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small timing sizes: a smoke run, not a measurement")
    args = parser.parse_args()
    torch_cuda = check_torch_cuda()
    if torch_cuda is not None:
        print("## torch on CUDA: einflow programs, autograd through einflow's VJP\n")
        print(table(torch_cuda[0], ["program", "value err", "grad err", "2nd-order err", "stays on device",
                                    "result"]))
        print(f"\ntorch CUDA programs match torch: {'yes' if torch_cuda[1] else 'NO'}\n")
    cupy = gpu()
    if cupy is None:
        return 0 if torch_cuda is None or torch_cuda[1] else 1
    start = time.perf_counter()
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    print(f"## GPU check\n\n{name.decode() if isinstance(name, bytes) else name}, cupy {cupy.__version__}\n")
    rows, ok = check_programs(cupy)
    print(table(rows, ["program", "numpy err", "cupy err", "cupy auto err", "stays on device", "result"]))
    print()
    print(table(timings(cupy, 8 if args.quick else 1), ["task", "implementation", "median"]))
    print(f"\nall programs match numpy: {'yes' if ok else 'NO'}; {time.perf_counter() - start:.0f} s in all")
    return 0 if ok and (torch_cuda is None or torch_cuda[1]) else 1


if __name__ == "__main__":
    sys.exit(main())
