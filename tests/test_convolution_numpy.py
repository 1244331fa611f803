"""numpy's 3x3 convolutions by Winograd's F(2x2, 3x3) (einflow.engine.convolution.winograd_3x3 and its kernel
gradient): values against torch's conv2d and autograd in float64, the float32 error against float64, and
gradients of convolutions over an empty batch."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import einflow as ef
from einflow.engine.convolution import winograd_3x3, winograd_3x3_weight

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize(
    ("shape", "pad"),
    [
        ((2, 8, 9, 11), 0),
        ((1, 8, 8, 8), 1),
        ((2, 9, 7, 6), 2),
        ((1, 8, 4, 5), 0),
        ((3, 16, 12, 10), 1),
        ((0, 8, 6, 6), 0),
        # blocks (convolution._blocks) of 4 images (5 = 4 + 1), of 8 tile
        # rows (19 = 8 + 8 + 3) with the padding at the first and last, and
        # the kernel gradient's blocks of 8 tile rows of one image
        ((5, 64, 10, 10), 1),
        ((2, 16, 40, 62), 1),
        ((1, 64, 40, 130), 2),
    ],
)
def test_winograd_forward_and_kernel_gradient_against_torch(shape: tuple[int, ...], pad: int) -> None:
    rng = np.random.default_rng(sum(shape) + pad)
    x = rng.standard_normal(shape)
    K = rng.standard_normal((10, shape[1], 3, 3))
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(K), padding=pad).numpy()
    got = winograd_3x3(x, K, ((pad, pad), (pad, pad)), *expected.shape[2:])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    grad = rng.standard_normal(expected.shape)
    kernel = torch.from_numpy(K).requires_grad_(True)
    (F.conv2d(torch.from_numpy(x), kernel, padding=pad) * torch.from_numpy(grad)).sum().backward()
    np.testing.assert_allclose(
        winograd_3x3_weight(x, grad, ((pad, pad), (pad, pad))), kernel.grad.numpy(), rtol=1e-11, atol=1e-11
    )


CONV = "y[n,o,h,w] = x[n,c,h+r,w+s] K[o,c,r,s]"
SAME = "size n,c,h,w = x\ny[n,o,h,w] = x[n,c,h+r-1,w+s-1] K[o,c,r,s]"
LOSS = "\nL = sum[n,o,h,w](T[n,o,h,w] y[n,o,h,w])"


def _sources(program: ef.Program) -> str:
    return "\n".join(plan.source for plan in program._plans.values())


@pytest.mark.parametrize(("text", "pad"), [(CONV, 0), (SAME, 1)])
def test_programs_convolve_by_winograd_on_numpy(text: str, pad: int) -> None:
    rng = np.random.default_rng(pad)
    x = rng.standard_normal((2, 12, 10, 9))
    K = rng.standard_normal((16, 12, 3, 3))
    forward = ef.compile(text)
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(K), padding=pad)
    np.testing.assert_allclose(forward(x=x, K=K), expected.numpy(), rtol=1e-12, atol=1e-12)
    assert "'forward'" in _sources(forward)
    T = rng.standard_normal(tuple(expected.shape))
    both = ef.value_and_grad(text + LOSS, wrt=["x", "K"])
    value, (gx, gK) = both(x=x, K=K, T=T)
    xr, Kr = torch.from_numpy(x).requires_grad_(True), torch.from_numpy(K).requires_grad_(True)
    loss = (F.conv2d(xr, Kr, padding=pad) * torch.from_numpy(T)).sum()
    loss.backward()
    assert value == pytest.approx(float(loss), rel=1e-12)
    np.testing.assert_allclose(gx, xr.grad.numpy(), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(gK, Kr.grad.numpy(), rtol=1e-11, atol=1e-11)
    source = _sources(both)
    assert source.count("_convolve(") == 3 and "'weight'" in source  # the forward, both gradients


def test_winograd_holds_one_block_of_tiles_and_the_plan_counts_it() -> None:
    """The transforms and products go block by block (convolution._blocks), so a call holds one block's tiles, not the
    whole batch's (16 x C per 2x2 output tile) nor an im2col window (9 x the input): the plan's peak is within 1.25x
    of what tracemalloc measures, and under a third of the window."""
    rng = np.random.default_rng(6)
    x, K = rng.standard_normal((8, 8, 64, 64)), rng.standard_normal((8, 8, 3, 3))
    program = ef.Program(ef.compile(SAME).ir)
    predicted = program.plan(x=x, K=K).peak_bytes
    program(x=x, K=K)
    tracemalloc.start()
    try:
        value = program(x=x, K=K)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "_convolve(" in _sources(program)
    assert predicted / 1.25 <= peak <= 1.25 * predicted, (peak, predicted)
    assert peak < 9 * x.nbytes / 3
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(K), padding=1).numpy()
    np.testing.assert_allclose(value, expected, rtol=1e-12, atol=1e-12)


def test_float32_error_against_float64() -> None:
    """F(2x2, 3x3) in float32: within 2e-6 of the float64 convolution relative to its largest entry (torch's own
    float32 conv2d measured 1e-6 on these arrays), and so are both gradients."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 64, 20, 20))
    K = 0.05 * rng.standard_normal((64, 64, 3, 3))
    exact = F.conv2d(torch.from_numpy(x), torch.from_numpy(K)).numpy()
    program = ef.compile(CONV)
    single = program(x=x.astype(np.float32), K=K.astype(np.float32))
    assert single.dtype == np.float32
    assert np.abs(single - exact).max() <= 2e-6 * np.abs(exact).max()
    T = rng.standard_normal(exact.shape)
    kernel = torch.from_numpy(K).requires_grad_(True)
    (F.conv2d(torch.from_numpy(x), kernel) * torch.from_numpy(T)).sum().backward()
    gradient = ef.grad(CONV + LOSS, wrt="K")(x=x.astype(np.float32), K=K.astype(np.float32), T=T.astype(np.float32))
    assert np.abs(gradient - kernel.grad.numpy()).max() <= 2e-6 * np.abs(kernel.grad.numpy()).max()
    xr = torch.from_numpy(x).requires_grad_(True)
    (F.conv2d(xr, torch.from_numpy(K)) * torch.from_numpy(T)).sum().backward()
    single = ef.grad(CONV + LOSS, wrt="x")(x=x.astype(np.float32), K=K.astype(np.float32), T=T.astype(np.float32))
    assert single.dtype == np.float32
    assert np.abs(single - xr.grad.numpy()).max() <= 2e-6 * np.abs(xr.grad.numpy()).max()


@pytest.mark.parametrize(
    ("text", "x_shape", "k_shape"),
    [
        ("y[n,o,h] = x[n,c,h+r] K[o,c,r]", (0, 3, 6), (4, 3, 3)),
        (CONV, (0, 3, 6, 6), (4, 3, 3, 3)),
        (CONV, (0, 8, 6, 7), (8, 8, 3, 3)),  # (Winograd's shape, were the batch not empty)
    ],
)
def test_gradients_over_an_empty_batch(text: str, x_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> None:
    """An unpadded convolution of no images: the kernel's gradient is zeros of its shape and the input's an empty
    array (torch's autograd gives the same); the kernel's once raised a ShapeError from a range helper that read
    position 0 of the empty batch axis."""
    rng = np.random.default_rng(5)
    K = rng.standard_normal(k_shape)
    x = np.zeros(x_shape)
    spatial = len(x_shape) - 2
    conv = F.conv1d if spatial == 1 else F.conv2d
    out = conv(torch.from_numpy(x), torch.from_numpy(K)).numpy()
    T = rng.standard_normal(out.shape)
    xr, Kr = torch.from_numpy(x).requires_grad_(True), torch.from_numpy(K).requires_grad_(True)
    (conv(xr, Kr) * torch.from_numpy(T)).sum().backward()
    indices = "n,o,h" if spatial == 1 else "n,o,h,w"
    both = ef.value_and_grad(f"{text}\nL = sum[{indices}](T[{indices}] y[{indices}])", wrt=["x", "K"])
    value, (gx, gK) = both(x=x, K=K, T=T)
    assert value == 0
    assert gK.shape == K.shape and gx.shape == x.shape
    np.testing.assert_array_equal(gK, Kr.grad.numpy())
    np.testing.assert_array_equal(gK, np.zeros(K.shape))
    assert (
        np.asarray(ef.grad(f"{text}\nL = sum[{indices}](T[{indices}] y[{indices}])", wrt="K")(x=x, K=K, T=T)).shape
        == K.shape
    )


def test_small_or_strided_convolutions_stay_einsums() -> None:
    rng = np.random.default_rng(3)
    x, K = rng.standard_normal((1, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3))  # 3 channels in: im2col
    program = ef.Program(ef.compile(CONV).ir)  # (a plan cache of its own)
    np.testing.assert_allclose(
        program(x=x, K=K), F.conv2d(torch.from_numpy(x), torch.from_numpy(K)).numpy(), rtol=1e-12, atol=1e-12
    )
    assert "_convolve(" not in _sources(program)
    strided = ef.Program(ef.compile("y[n,o,h,w] = x[n,c,2*h+r,2*w+s] K[o,c,r,s]").ir)  # (its own cache too)
    x, K = rng.standard_normal((1, 8, 9, 9)), rng.standard_normal((8, 8, 3, 3))
    np.testing.assert_allclose(
        strided(x=x, K=K), F.conv2d(torch.from_numpy(x), torch.from_numpy(K), stride=2).numpy(), rtol=1e-12, atol=1e-12
    )
    assert "_convolve(" not in _sources(strided)
