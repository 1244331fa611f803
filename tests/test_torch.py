"""einflow inside PyTorch: the torch backend (type, dtype, device in = out) and autograd through einflow's VJP.

References: the same computation in plain torch (autograd included), numpy, and torch.autograd.gradcheck /
gradgradcheck (central finite differences in float64).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import einflow as ef
from einflow.frameworks import function, value_and_grad_program, vjp_program
from einflow.lang.functions import FUNCTION_RULES

F64 = torch.float64


def rand(*shape: int, seed: int = 0, grad: bool = True, dtype: torch.dtype = F64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_(grad)


# ---------------------------------------------------------------------------------------------- backend
def test_tensors_in_tensors_out_dtype_kept() -> None:
    p = ef.compile("C[i,k] = A[i,j] B[j,k]")
    for dtype in (torch.float32, F64):
        A, B = rand(3, 4, grad=False, dtype=dtype), rand(4, 2, grad=False, dtype=dtype)
        C = p(A=A, B=B)
        assert isinstance(C, torch.Tensor) and C.dtype == dtype and C.device == A.device
        torch.testing.assert_close(C, A @ B)


def test_numpy_arrays_and_numbers_join_torch_tensors() -> None:
    p = ef.compile("y[i] = s A[i,j] x[j]")
    A = np.arange(6.0).reshape(2, 3)
    x = rand(3, grad=False)
    y = p(A=A, x=x, s=2.0)
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), 2.0 * A @ x.numpy())


def test_explicit_backend_turns_numpy_into_tensors() -> None:
    y = ef.compile("y[i] = exp(x[i])")(x=np.zeros(3), backend="torch")
    assert isinstance(y, torch.Tensor) and y.tolist() == [1.0, 1.0, 1.0]


def test_explicit_numpy_backend_takes_tensors_that_require_grad() -> None:
    x = rand(3)
    y = ef.compile("y[i] = 2 x[i]")(x=x, backend="numpy")
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, 2 * x.detach().numpy())


def test_mixed_frameworks_are_a_backend_error() -> None:
    jnp = pytest.importorskip("jax.numpy")
    p = ef.compile("C[i,k] = A[i,j] B[j,k]")
    with pytest.raises(ef.BackendError, match="mix arrays of jax and torch"):
        p(A=torch.ones(2, 2), B=jnp.ones((2, 2)))
    with pytest.raises(ef.BackendError, match="mix arrays"):
        ef.einsum("ij,jk", torch.ones(2, 2), jnp.ones((2, 2)))


def test_einsum_and_program_follow_one_rule() -> None:
    A, B = rand(2, 3, grad=False, dtype=torch.float32), np.ones((3, 2), dtype=np.float32)
    by_einsum = ef.einsum("ij,jk->ik", A, B)
    by_program = ef.compile("C[i,k] = A[i,j] B[j,k]")(A=A, B=B)
    assert type(by_einsum) is type(by_program) is torch.Tensor
    assert by_einsum.dtype == by_program.dtype == torch.float32
    torch.testing.assert_close(by_einsum, by_program)


@pytest.mark.parametrize("name", sorted(FUNCTION_RULES))
def test_every_function_matches_numpy(name: str) -> None:
    x = np.array([-2.0, -0.5, 0.0, 0.25, 1.5])
    if name in ("log", "sqrt"):
        x = np.abs(x) + 0.5
    if name == "log1p":
        x = np.abs(x)
    p = ef.compile(f"y[i] = {name}(x[i])")
    expected = p(x=x)
    got = p(x=torch.tensor(x))
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_surviving_delta_and_integer_inputs() -> None:
    p = ef.compile("H[i,j] = delta[i,j] x[i]^2")
    x = torch.tensor([1, 2, 3])
    H = p(x=x)
    assert isinstance(H, torch.Tensor)
    assert H.tolist() == np.diag([1, 4, 9]).tolist()


# ---------------------------------------------------------------------------------------------- autograd
CORPUS = {
    "mlp loss": ("L = sum[n,o]((tanh(X[n,i] W1[i,h] + b1[h]) W2[h,o] - Y[n,o])^2)",
                 {"X": (5, 3), "W1": (3, 4), "b1": (4,), "W2": (4, 2), "Y": (5, 2)}),
    "attention": ("S[q,k] = exp(Q[q,d] K[k,d])\nZ[q] = sum[k](S[q,k])\nO[q,e] = S[q,k] V[k,e] / Z[q]",
                  {"Q": (3, 2), "K": (4, 2), "V": (4, 3)}),
    "matrix factorisation": ("L = sum[i,j]((U[i,r] V[j,r] - M[i,j])^2) + 0.1 U[i,r] U[i,r]",
                             {"U": (4, 2), "V": (3, 2), "M": (4, 3)}),
    "size declarations": ("size p = x\nsize q = x\nH[p,q] = delta[p,q] x[p]^3 + 2 x[p] x[q]", {"x": (4,)}),
    "surviving delta": ("H[i,j] = delta[i,j] exp(x[i]) + x[i] x[j]", {"x": (3,)}),
    "scalar output with numbers": ("f = sum[i](a[i]^3) / 2.5 + 3", {"a": (4,)}),
}


def _inputs(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    return {name: rand(*shape, seed=k) for k, (name, shape) in enumerate(shapes.items())}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_gradcheck_and_gradgradcheck(case: str) -> None:
    text, shapes = CORPUS[case]
    program = ef.compile(text)
    inputs = _inputs(shapes)
    names = list(inputs)

    def f(*arrays: torch.Tensor) -> torch.Tensor:
        return program(dict(zip(names, arrays)))

    arrays = tuple(inputs.values())
    assert f(*arrays).grad_fn.name() == "EinflowFunctionBackward"
    assert torch.autograd.gradcheck(f, arrays)
    assert torch.autograd.gradgradcheck(f, arrays)


@pytest.mark.parametrize("name", sorted(FUNCTION_RULES))
def test_gradcheck_every_function(name: str) -> None:
    program = ef.compile(f"y[i] = {name}(x[i]) x[i]")
    x = torch.tensor([-1.3, -0.4, 0.35, 0.8, 1.7], dtype=F64)
    if name in ("log", "sqrt"):
        x = x.abs() + 0.5
    if name == "log1p":
        x = x.abs()
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: program(x=x), (x,))
    assert torch.autograd.gradgradcheck(lambda x: program(x=x), (x,))


def test_gradients_equal_torch_autograd_and_backward_is_einflow() -> None:
    program = ef.compile(CORPUS["mlp loss"][0])
    inputs = _inputs(CORPUS["mlp loss"][1])
    loss = program(inputs)
    mine = torch.autograd.grad(loss, [inputs["W1"], inputs["b1"]], create_graph=True)
    X, W1, b1, W2, Y = (inputs[k] for k in ("X", "W1", "b1", "W2", "Y"))
    reference = torch.autograd.grad(((torch.tanh(X @ W1 + b1) @ W2 - Y) ** 2).sum(), [W1, b1], create_graph=True)
    for a, b in zip(mine, reference):
        torch.testing.assert_close(a, b)
    # the first derivative is itself an einflow node: double backward runs einflow's second derivative
    assert mine[0].grad_fn.name() == "EinflowFunctionBackward"
    second = torch.autograd.grad(mine[0].sum(), W2)[0]
    torch.testing.assert_close(second, torch.autograd.grad(reference[0].sum(), W2)[0])


def test_derivative_programs_are_derived_once() -> None:
    # a scalar program: value and gradient in the forward pass (value_and_grad), cached per wrt set
    program = ef.compile("s = sum[i](sin(w[i]) v[i])")
    w, v = rand(5), rand(5, grad=False)
    program(w=w, v=v).backward()
    before = value_and_grad_program.cache_info()
    for _ in range(3):
        program(w=w, v=v).backward()
    after = value_and_grad_program.cache_info()
    assert after.misses == before.misses  # later calls find the fused program (and its plan) on the plan
    torch.testing.assert_close(w.grad, 4 * torch.cos(w.detach()) * v)
    # a vector program: the VJP program, cached per wrt set
    vector = ef.compile("y[i] = sin(w[i]) v[i]")
    vector(w=w, v=v).sum().backward()
    before = vjp_program.cache_info()
    for _ in range(3):
        vector(w=w, v=v).sum().backward()
    after = vjp_program.cache_info()
    assert after.misses == before.misses and after.hits >= before.hits + 3


def test_fused_gradients_equal_the_vjp_path() -> None:
    program = ef.compile(CORPUS["attention"][0] + "\nL = sum[q,e](O[q,e]^2)")
    inputs = _inputs(CORPUS["attention"][1])
    fused = torch.autograd.grad(program(inputs), list(inputs.values()))
    by_vjp = torch.autograd.grad(program(inputs), list(inputs.values()), create_graph=True)
    for a, b in zip(fused, by_vjp):
        torch.testing.assert_close(a, b)


def test_function_wrapper_in_a_module() -> None:
    affine = function("y[n,o] = x[n,i] W[o,i] + b[o]")

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W = torch.nn.Parameter(rand(2, 3, grad=False))
            self.b = torch.nn.Parameter(torch.zeros(2, dtype=F64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return affine(x, self.W, self.b)

    layer = Layer()
    x = rand(4, 3, grad=False)
    layer(x).pow(2).sum().backward()
    expected = 2 * (x @ layer.W.detach().T + layer.b.detach()).T @ x
    torch.testing.assert_close(layer.W.grad, expected)
    with pytest.raises(ef.EinflowError, match="reads 3 tensors"):
        affine(x, x, x, x)


def test_tuple_results_are_differentiable_by_torch() -> None:
    program = ef.value_and_grad("f = sum[i](w[i]^3)", wrt="w")
    w = rand(3)
    value, gradient = program(w=w)
    torch.testing.assert_close(value, (w.detach() ** 3).sum())
    torch.testing.assert_close(torch.autograd.grad(gradient.sum(), w)[0], 6 * w.detach())


def test_no_grad_mode_builds_no_graph() -> None:
    with torch.no_grad():
        y = ef.compile("y[i] = exp(x[i])")(x=rand(3))
    assert y.grad_fn is None and not y.requires_grad


# ---------------------------------------------------------------------------------------------- export
BLOCK = "import sys; sys.modules['einflow'] = None\n"


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_exported_source_runs_without_einflow(target: str, tmp_path) -> None:
    program = ef.compile("H[i,j] = delta[i,j] exp(x[i]) + x[i] x[j] + relu(x[i]) sigmoid(x[j]) / 2")
    source = program.to_source("hess", target=target)
    assert "import einflow" not in source and "from einflow" not in source
    x = np.array([-1.0, 0.5, 2.0])
    expected = program(x=x)
    script = tmp_path / "run.py"
    module = "torch" if target == "torch" else "numpy"
    script.write_text(BLOCK + source + f"\nimport {module}, numpy\nx = {module}.tensor({x.tolist()!r}, dtype="
                      f"{module}.float64) if '{module}' == 'torch' else numpy.array({x.tolist()!r})\n"
                      "out = hess(x=x)\nprint(type(out).__module__.split('.')[0])\n"
                      "print(repr(numpy.asarray(out).tolist()))\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    kind, values = result.stdout.split("\n")[:2]
    assert kind == module
    np.testing.assert_allclose(np.array(eval(values)), expected, rtol=1e-12)


def test_to_source_unknown_target() -> None:
    with pytest.raises(ef.EinflowError, match="target"):
        ef.compile("y = x[i] x[i]").to_source("f", target="tensorflow")


def test_torch_training_example() -> None:
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "examples" / "torch_training.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert lines["backward node"] == "EinflowFunctionBackward"
    assert float(lines["max gradient difference vs torch autograd"]) < 1e-12
    assert float(lines["final loss"]) < 0.1 * float(lines["initial loss"])


def test_reductions_and_normalisers_in_autograd() -> None:
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    program = ef.compile("L = logsumexp[i](x[i]) + max[i](x[i]) + mean[i](x[i])")
    value = program(x=x)
    value.backward()
    reference = torch.logsumexp(x.detach(), 0) + 3.0 + 2.0
    assert torch.allclose(value.detach(), reference)
    expected = torch.softmax(x.detach(), 0) + torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64) + 1 / 3
    assert torch.allclose(x.grad, expected)
    far = ef.compile("s[i] = softmax[i](x[i])")(x=torch.tensor([1000.0, 999.0, 1.0], dtype=torch.float64))
    assert torch.allclose(far, torch.softmax(torch.tensor([1000.0, 999.0, 1.0], dtype=torch.float64), 0))


def test_a_python_int_divisor_keeps_float32_tensors_float32() -> None:
    # 1 / N of a weak Python int is a weak number: no float64 promotion, no numpy-only casts on tensors
    program = ef.compile("y[i,k] = A[i,j] B[j,k] / N")
    A, B = torch.ones(2, 3), torch.full((3, 2), 2.0)
    y = program(A=A, B=B, N=4)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, A @ B / 4)


def test_a_training_step_reuses_the_fused_gradient_plan() -> None:
    program = ef.compile("L = sum[n,o]((tanh(X[n,i] W[i,o]) - Y[n,o])^2) / N")
    X, Y = rand(6, 3, grad=False, seed=1), rand(6, 2, grad=False, seed=2)
    W = rand(3, 2, seed=3)
    for _ in range(3):
        (gradient,) = torch.autograd.grad(program(X=X, W=W, Y=Y, N=6), W)
    plans = list(program._plans.values())
    assert len(plans) == 1 and list(plans[0].derived) == [("value_and_grad", ("W",))]
    W_ = W.detach().clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(((torch.tanh(X @ W_) - Y) ** 2).sum() / 6, W_)
    torch.testing.assert_close(gradient, expected)
