"""The torch plans and the derivative programs a training step runs: what their code computes, and how.

Values: random programs (tests/randprog.py) on torch tensors against the numpy backend (float64), with
gradients through torch autograd (einflow's fused value-and-gradient plan) against ``ef.grad`` on numpy;
the MLP and attention training steps against plain torch autograd. Structure: the generated torch source
of those steps (matrix products as matmul on views, elementwise products as ``*``, no einsum), and the
derivative programs (the adjoint through ``tanh`` computed once; attention's backward reads the
forward's ``exp`` instead of recomputing it).
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
import torch

import einflow as ef
from einflow.frameworks import value_and_grad_program

sys.path.insert(0, os.path.dirname(__file__))

import randprog  # noqa: E402

# the training-step programs benchmarks/frameworks.py measures
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
from frameworks import ATTENTION, MLP  # noqa: E402


def _mlp_inputs(dtype: torch.dtype = torch.float64) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    data = {"X": torch.randn(7, 5, generator=generator, dtype=dtype),
            "Y": torch.randn(7, 3, generator=generator, dtype=dtype)}
    params = {"W1": torch.randn(5, 6, generator=generator, dtype=dtype),
              "b1": torch.randn(6, generator=generator, dtype=dtype),
              "W2": torch.randn(6, 3, generator=generator, dtype=dtype)}
    return data, params


def _attention_inputs(dtype: torch.dtype = torch.float64) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    data = {"X": torch.randn(6, 4, generator=generator, dtype=dtype) / 2,
            "T": torch.randn(6, 4, generator=generator, dtype=dtype)}
    params = {name: torch.randn(4, 4, generator=generator, dtype=dtype) / 2 for name in ("Wq", "Wk", "Wv")}
    return data, params


def _fused_source(text: str, data: dict[str, torch.Tensor], params: dict[str, torch.Tensor], count: int) -> str:
    """The generated torch source a training step's forward runs (the fused value-and-gradient plan)."""
    program = ef.compile(text)
    leaves = {name: value.clone().requires_grad_(True) for name, value in params.items()}
    program(data, N=count, **leaves).backward()
    sources = [fused.source for plan in program._plans.values() for fused, _ in plan.derived.values()]
    assert len(sources) == 1
    return sources[0]


def _plain_mlp(data: dict[str, torch.Tensor], p: dict[str, torch.Tensor]) -> torch.Tensor:
    hidden = torch.tanh(data["X"] @ p["W1"] + p["b1"])
    return ((hidden @ p["W2"] - data["Y"]) ** 2).sum() / data["X"].shape[0]


def _plain_attention(data: dict[str, torch.Tensor], p: dict[str, torch.Tensor]) -> torch.Tensor:
    X = data["X"]
    S = torch.exp((X @ p["Wq"]) @ (X @ p["Wk"]).T / 8)
    O = (S @ (X @ p["Wv"])) / S.sum(dim=1, keepdim=True)
    return ((O - data["T"]) ** 2).sum() / X.shape[0]


@pytest.mark.parametrize("case", ["mlp", "attention"])
def test_training_step_gradients_equal_plain_torch(case: str) -> None:
    text, (data, params), plain = ((MLP, _mlp_inputs(), _plain_mlp) if case == "mlp"
                                   else (ATTENTION, _attention_inputs(), _plain_attention))
    program = ef.compile(text)
    mine = {name: value.clone().requires_grad_(True) for name, value in params.items()}
    theirs = {name: value.clone().requires_grad_(True) for name, value in params.items()}
    count = data["X"].shape[0]
    loss = program(data, N=count, **mine)
    reference = plain(data, theirs)
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    for name, value in {**data, **mine}.items():  # work done in place never touches an input
        torch.testing.assert_close(value.detach(), {**data, **params}[name], rtol=0, atol=0)
    got = torch.autograd.grad(loss, list(mine.values()))
    expected = torch.autograd.grad(reference, list(theirs.values()))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        assert a.is_contiguous()  # gradients come back in their own layout (an SGD update reads them alike)


def test_mlp_gradient_program_computes_the_adjoint_through_tanh_once() -> None:
    fused = value_and_grad_program(ef.compile(MLP), ("W1", "b1", "W2"))
    statements = {line.split("[")[0]: line for line in str(fused).splitlines() if "=" in line and "[" in line}
    # the adjoint of tanh's argument, W2[h,o] t1[o,n] (1 - tanh^2) / N, is one statement read by both gradients
    shared = [name for name, line in statements.items() if "W2" in line.split("=", 1)[1]
              and name not in ("dL_dW1", "dL_db1", "dL_dW2", "t1", "L")]
    assert len(shared) == 1, str(fused)
    for gradient in ("dL_dW1", "dL_db1"):
        right = statements[gradient].split("=", 1)[1]
        assert f"{shared[0]}[" in right and "W2" not in right, str(fused)


def test_mlp_training_step_source_has_one_product_per_matrix_product() -> None:
    data, params = _mlp_inputs()
    source = _fused_source(MLP, data, params, 7)
    # forward X W1 and t3 W2, backward: the adjoint (t1 W2^T), dL_dW1 (X^T a), dL_dW2 (t3^T t1): five GEMMs
    assert source.count(".matmul(") == 5, source
    assert "einsum" not in source and "_contract" not in source, source
    # the elementwise product of the backward pass (1 - tanh^2 times the adjoint) is a multiplication, done
    # in place on the matrix product's new array, as are tanh of the pre-activation and 1 - tanh^2
    assert re.search(r"\)\.mul_\(t\d", source), source
    assert ").tanh_()" in source and ".neg_().add_(1)" in source, source


def test_attention_backward_reads_the_forward_softmax_numerator() -> None:
    fused = value_and_grad_program(ef.compile(ATTENTION), ("Wq", "Wk", "Wv"))
    text = str(fused)
    assert text.count("exp(") == 1, text  # S's own statement; the backward reads S
    lines = {line.split("[")[0]: line for line in text.splitlines() if "=" in line and "[" in line}
    # dL_dK and dL_dQ read one shared product dL_dS * S (the adjoint of Q K^T)
    shared = [name for name, line in lines.items() if re.search(r"dL_dS\[[^]]*\] S\[", line)]
    assert len(shared) == 1, text
    for gradient in ("dL_dK", "dL_dQ"):
        assert f"{shared[0]}[" in lines[gradient] and "dL_dS" not in lines[gradient].split("=", 1)[1], text


def test_attention_training_step_source_has_no_einsum() -> None:
    data, params = _attention_inputs()
    source = _fused_source(ATTENTION, data, params, 6)
    assert "einsum" not in source and "_contract" not in source, source
    assert source.count(".exp(") == 1, source
    # S X is computed once (forward and the Wv gradient share it)
    assert len(re.findall(r"matmul\(S, X\)", source)) == 1, source


def test_elementwise_product_inside_a_contraction_is_a_multiplication() -> None:
    # C D is a matrix product; A and B multiply its result elementwise (no summed index left for them)
    program = ef.compile("Z[i,j] = A[i,j] B[j,i] C[i,k] D[k,j]")
    generator = torch.Generator().manual_seed(2)
    A, B, C, D = (torch.randn(*shape, generator=generator, dtype=torch.float64)
                  for shape in ((3, 4), (4, 3), (3, 5), (5, 4)))
    torch.testing.assert_close(program(A=A, B=B, C=C, D=D), A * B.T * (C @ D))
    plan = next(p for key, p in program._plans.items() if key[0] == "torch")
    line = next(line for line in plan.source.splitlines() if line.strip().startswith("Z ="))
    assert "einsum" not in line and line.count(".matmul(") == 1, line
    assert line.count(" * ") + line.count(".mul_(") == 2, line


def test_a_shared_matrix_product_is_not_formed_where_a_reader_contracts_a_vector() -> None:
    # x^T A B y: the gradients A B y and B^T A^T x share {A, B}, but forming A B (a matrix-matrix
    # product) would cost more than the matrix-vector products each gradient does on its own
    grads = ef.grad("f = x[i] A[i,j] B[j,k] y[k]", wrt=["x", "y"])
    assert "t1" not in str(grads), str(grads)
    rng = np.random.default_rng(0)
    A, B, x, y = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=3), rng.normal(size=5)
    gx, gy = grads(A=A, B=B, x=x, y=y)
    np.testing.assert_allclose(gx, A @ B @ y, rtol=1e-12)
    np.testing.assert_allclose(gy, B.T @ A.T @ x, rtol=1e-12)


def test_mixed_dtypes_in_a_torch_matrix_product() -> None:
    program = ef.compile("y[i,k] = A[i,j] B[j,k]")
    A = torch.randn(3, 4, dtype=torch.float32)
    B = torch.randn(4, 2, dtype=torch.float64)
    got = program(A=A, B=B)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, A.double() @ B)
    integers = program(A=torch.arange(12).reshape(3, 4), B=torch.ones(4, 2, dtype=torch.bool))
    assert integers.tolist() == (np.arange(12).reshape(3, 4) @ np.ones((4, 2), dtype=int)).tolist()


SEEDS = int(os.environ.get("EINFLOW_TORCH_RANDOM_N", "120"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_programs_on_torch_equal_numpy(seed: int) -> None:
    case = randprog.generate(seed)
    text = randprog.program_text(case.program)
    program = ef.compile(text)
    arrays = {name: value for name, value in randprog.make_arrays(case.program, seed).items() if name in program.inputs}
    expected = program(**arrays)
    tensors = {name: torch.from_numpy(value) for name, value in arrays.items()}
    got = program(**tensors)
    pairs = zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,))
    for a, b in pairs:
        assert isinstance(a, torch.Tensor)
        np.testing.assert_allclose(a.numpy(), np.asarray(b), rtol=1e-9, atol=1e-11, err_msg=text)
    if not case.scalar or isinstance(expected, tuple) or np.ndim(expected) or not case.wrt:
        return
    with np.errstate(all="ignore"):
        gradients = ef.grad(program, wrt=list(case.wrt))(**arrays)
    leaves = {name: value.clone().requires_grad_(name in case.wrt) for name, value in tensors.items()}
    value = program(**leaves)
    got_gradients = torch.autograd.grad(value, [leaves[name] for name in case.wrt], allow_unused=True)
    for name, a, b in zip(case.wrt, got_gradients, gradients):
        a = torch.zeros_like(leaves[name]) if a is None else a
        np.testing.assert_allclose(a.detach().numpy(), np.broadcast_to(b, a.shape), rtol=1e-8, atol=1e-10,
                                   err_msg=f"d/d{name} of\n{text}")


def test_repeated_backward_accumulates_the_fused_gradients() -> None:
    # a loss's backward hands out the gradients computed with its value (a seed of 1 skips the scaling):
    # accumulating them into .grad three times must give three times the gradient, never an aliased copy
    data, params = _mlp_inputs()
    program = ef.compile(MLP)
    leaves = {name: value.clone().requires_grad_(True) for name, value in params.items()}
    loss = program(data, N=7, **leaves)
    loss.backward(retain_graph=True)
    first = {name: leaf.grad.clone() for name, leaf in leaves.items()}
    loss.backward(retain_graph=True)
    (2 * loss).backward()
    for name, leaf in leaves.items():
        torch.testing.assert_close(leaf.grad, 4 * first[name], rtol=1e-12, atol=1e-12)
    reference = {name: value.clone().requires_grad_(True) for name, value in params.items()}
    _plain_mlp(data, reference).backward()
    for name, leaf in reference.items():
        torch.testing.assert_close(first[name], leaf.grad, rtol=1e-10, atol=1e-12)


def test_a_product_of_mixed_integer_and_float_tensors_casts_with_torch() -> None:
    # an elementwise product of three arrays computes in numpy's type of all of them (float32 here): the
    # generated torch code casts with .to(), not numpy's .astype
    program = ef.compile("y[i] = a[i] b[i] c[i]")
    a = torch.tensor([100, -100, 7], dtype=torch.int8)
    b = torch.tensor([300, 300, -2], dtype=torch.int16)
    c = torch.tensor([0.5, 0.25, 1.0], dtype=torch.float32)
    got = program(a=a, b=b, c=c)
    assert got.dtype == torch.float32
    expected = np.array([100, -100, 7], dtype=np.float32) * np.array([300, 300, -2], dtype=np.float32) * c.numpy()
    np.testing.assert_array_equal(got.numpy(), expected)


def test_work_in_place_keeps_torch_autograd_correct() -> None:
    # a program with several results runs as torch code under autograd: the in-place steps (tanh of a
    # sum, 1 - a product, a scaled matrix product, a product with an intermediate) must differentiate
    program = ef.compile("a[i] = tanh(x[i] + y[i])\nb[i] = 1 - x[i] y[i]\nc[i] = 2 A[i,j] B[j,k] x[k] y[i]\na, b, c")
    generator = torch.Generator().manual_seed(3)
    inputs = tuple(torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
                   for shape in ((3,), (3,), (3, 4), (4, 3)))

    def f(x: torch.Tensor, y: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return program(x=x, y=y, A=A, B=B)

    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)
    source = next(p.source for key, p in program._plans.items() if key[0] == "torch")
    assert ".tanh_()" in source and ".neg_().add_(1)" in source and ".mul_(" in source, source
