"""Differential test of derivatives through shifted, windowed and gathered reads (``tests/stencils.py``).

Random programs of the families the first generator missed (reads shifted on several axes at once, windows
inside elementwise functions, weighted stencils, reductions over windows and gathers, plain reads of other
lengths, Python-float scalars, declarations at the end, inputs the value does not depend on) are compared
with JAX in float64: the value, the gradient by every input, the Hessian, the hvp, jvp and vjp, and the
gradient's exported numpy source; float32 inputs give float32 gradients. ``EINFLOW_FAMILY_N`` sets the
number of programs (``EINFLOW_FAMILY_N=20000`` for the long run), ``EINFLOW_FAMILY_START`` the first seed.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import pytest
from stencils import generate_family

import einflow as ef

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

COUNT = int(os.environ.get("EINFLOW_FAMILY_N", "300"))
START = int(os.environ.get("EINFLOW_FAMILY_START", "0"))


@dataclass(frozen=True)
class _Reference:
    value: np.ndarray
    gradients: dict[str, np.ndarray]  # by every input of ``family.wrt``
    hessian: np.ndarray  # by ``family.wrt[0]``


@functools.lru_cache(maxsize=4096)
def _reference(seed: int) -> _Reference:
    """JAX's value, gradients and Hessian of program ``seed``, from one jitted function (one XLA compile per
    program; op-by-op JAX compiled every primitive of every new shape and took most of the test's time)."""
    family = generate_family(seed)
    arrays = family.arrays(seed)
    floats = {k: jnp.asarray(v) for k, v in arrays.items() if k not in family.integers}
    first = family.wrt[0]

    def value(inputs):  # type: ignore[no-untyped-def]
        return family.reference({**inputs, **family.integers})

    def everything(inputs):  # type: ignore[no-untyped-def]
        hessian = jax.hessian(lambda u: value({**inputs, first: u}))(inputs[first])
        return value(inputs), jax.grad(value)(inputs), hessian

    got, gradients, hessian = jax.jit(everything)(floats)
    return _Reference(np.asarray(got), {k: np.asarray(gradients[k]) for k in family.wrt}, np.asarray(hessian))


def _reference_gradient(seed: int, name: str) -> np.ndarray:
    return _reference(seed).gradients[name]


@pytest.mark.parametrize("seed", range(START, START + COUNT))
def test_family_matches_jax(seed: int) -> None:
    family = generate_family(seed)
    arrays = family.arrays(seed)
    want = _reference(seed)
    program = ef.compile(family.text)
    np.testing.assert_allclose(program(**arrays), want.value, rtol=1e-10, atol=1e-10)
    gradients = ef.grad(program, wrt=list(family.wrt))(**arrays)
    for name, got in zip(family.wrt, gradients):
        np.testing.assert_allclose(got, want.gradients[name], rtol=1e-9, atol=1e-9,
                                   err_msg=f"d/d{name} of\n{family.text}")
    first = family.wrt[0]
    hessian = ef.hessian(program, wrt=first)(**arrays)
    np.testing.assert_allclose(hessian, want.hessian, rtol=1e-8, atol=1e-8, err_msg=family.text)
    tangent = np.random.default_rng(seed + 1).standard_normal(np.shape(arrays[first]))
    hvp = ef.hvp(program, wrt=first, tangent="Tv")(**arrays, Tv=tangent)
    np.testing.assert_allclose(hvp, np.tensordot(want.hessian, tangent, axes=np.ndim(tangent)), rtol=1e-8,
                               atol=1e-8)
    jvp = ef.jvp(program, wrt=first, tangent="Tv")(**arrays, Tv=tangent)
    np.testing.assert_allclose(jvp, np.sum(want.gradients[first] * tangent), rtol=1e-8, atol=1e-8)
    vjp = ef.vjp(program, wrt=first, cotangent="Gv")(**arrays, Gv=np.float64(2.0))
    np.testing.assert_allclose(vjp, 2.0 * want.gradients[first], rtol=1e-9, atol=1e-9)
    # the gradient's exported numpy source computes the same
    gradient = ef.grad(program, wrt=first)
    namespace: dict = {}
    exec(gradient.to_source("gradient"), namespace)
    np.testing.assert_allclose(namespace["gradient"](**{k: arrays[k] for k in gradient.inputs}),
                               want.gradients[first], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", range(START, START + COUNT, 3))
def test_family_float32_gradients_are_float32(seed: int) -> None:
    family = generate_family(seed)
    arrays = family.arrays(seed)
    single = {k: (v.astype(np.float32) if k in family.shapes else v) for k, v in arrays.items()}
    names = [name for name in family.wrt if name in family.shapes]
    gradients = ef.grad(family.text, wrt=names)(**single)
    for name, got in zip(names, gradients):
        assert got.dtype == np.float32, (name, got.dtype, family.text)
        np.testing.assert_allclose(got, _reference_gradient(seed, name), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("seed", range(START + 2, START + COUNT, 4))
@pytest.mark.parametrize("target", ["torch", "jax"])
def test_family_gradient_source_for_torch_and_jax(seed: int, target: str) -> None:
    module = pytest.importorskip(target)
    family = generate_family(seed)
    arrays = family.arrays(seed)
    gradient = ef.grad(family.text, wrt=family.wrt[0])
    namespace: dict = {}
    exec(gradient.to_source("gradient", target=target), namespace)
    inputs = {k: arrays[k] for k in gradient.inputs}
    if target == "torch":
        got = namespace["gradient"](**{k: module.as_tensor(v) if not isinstance(v, float) else v
                                       for k, v in inputs.items()}).numpy()
    else:
        got = np.asarray(namespace["gradient"](**inputs))
    np.testing.assert_allclose(got, _reference_gradient(seed, family.wrt[0]), rtol=1e-9, atol=1e-9,
                               err_msg=family.text)


@pytest.mark.parametrize("seed", range(START + 1, START + COUNT, 5))
def test_family_gradients_on_torch(seed: int) -> None:
    torch = pytest.importorskip("torch")
    family = generate_family(seed)
    arrays = family.arrays(seed)
    tensors = {k: torch.as_tensor(v) if not isinstance(v, float) else v for k, v in arrays.items()}
    names = [name for name in family.wrt if name in family.shapes]
    gradients = ef.grad(family.text, wrt=names)(**tensors)
    for name, got in zip(names, gradients):
        np.testing.assert_allclose(got.numpy(), _reference_gradient(seed, name), rtol=1e-9, atol=1e-9)
