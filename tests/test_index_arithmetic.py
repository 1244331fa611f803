"""Index arithmetic (LANGUAGE.md 8.2): shifted, strided, constant and gathered reads, against numpy and torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import einflow as ef
from einflow.lang.grammar import parse

RNG = np.random.default_rng(26)
F = torch.nn.functional

# ---------------------------------------------------------------- text: parse, print, re-parse
ROUND_TRIPS = [
    "d[i] = x[i + 1] - x[i]",
    "y[h] = x[h + r] K[r]",
    "a = X[0, i]",
    "y[b,d] = E[t[b], d]",
    "y = x[n, c, 2*h + r - 1, 2*w + s - 1]",
    "z = w[i - j + 4]",
    "z = w[-j + 4] + w[2*h]",
    "v = x[b, idx[b,k]]",
]


@pytest.mark.parametrize("text", ROUND_TRIPS)
def test_printing_reparses(text: str) -> None:
    program = parse(text)
    assert str(program) == text
    assert parse(str(program)) == program


@pytest.mark.parametrize("text, message", [
    ("y[i+1] = x[i]", "a target keeps plain indices"),
    ("y = x[2.5*i]", "integer coefficients"),
    ("y = x[i/2]", r"with '\*' only"),
])
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ef.ParseError, match=message):
        parse(text)


# ---------------------------------------------------------------- ranges
def test_difference_has_one_element_fewer() -> None:
    x = RNG.standard_normal(10)
    np.testing.assert_allclose(ef.evaluate("d[i] = x[i+1] - x[i]", x=x), np.diff(x))


def test_valid_correlation_and_stride() -> None:
    x, k = RNG.standard_normal(11), RNG.standard_normal(3)
    np.testing.assert_allclose(ef.evaluate("y[h] = x[h+r] k[r]", x=x, k=k), np.correlate(x, k, "valid"))
    np.testing.assert_allclose(ef.evaluate("y[h] = x[2*h+r] k[r]", x=x, k=k), np.correlate(x, k, "valid")[::2])


def test_constant_position_and_negative_coefficient() -> None:
    X = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(ef.evaluate("a[i] = X[2, i]", X=X), X[2])
    w = RNG.standard_normal(7)
    # relative positions: T[i,j] = w[i - j + 3] for i, j < 4 (a Toeplitz matrix)
    size = "size i = 4\nsize j = 4\n"
    expected = np.array([[w[i - j + 3] for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(ef.evaluate(size + "T[i,j] = w[i - j + 3]", w=w), expected)


def test_declared_size_pads_with_zeros() -> None:
    x = RNG.standard_normal(6)
    got = ef.evaluate("size i = x\ny[i] = x[i-1] - 2 x[i] + x[i+1]", x=x)
    padded = np.concatenate([[0.0], x, [0.0]])
    np.testing.assert_allclose(got, padded[:-2] - 2 * padded[1:-1] + padded[2:])


@pytest.mark.parametrize("text, shapes, message", [
    ("z = w[i - j + 4]", {"w": (9,)}, "cannot be inferred"),
    ("a[i] = X[5, i]", {"X": (2, 3)}, r"reads position 5, outside the axis of length 2"),
    ("y[i] = x[i-1]", {"x": (4,)}, "before the axis starts"),
    ("y[i] = x[i+1] z[i]", {"x": (5,), "z": (4,)}, None),  # the intersection: i < 4, both reads inside
    ("y[i] = x[i] z[i]", {"x": (5,), "z": (4,)}, "index 'i' has size 5"),
])
def test_range_errors_name_the_read(text: str, shapes: dict, message: str | None) -> None:
    arrays = {name: RNG.standard_normal(shape) for name, shape in shapes.items()}
    if message is None:
        np.testing.assert_allclose(ef.evaluate(text, **arrays), arrays["x"][1:] * arrays["z"])
        return
    with pytest.raises(ef.ShapeError, match=message):
        ef.evaluate(text, **arrays)


# ---------------------------------------------------------------- convolutions against torch
CONV2D = {
    (1, 0): "y[n,o,h,w] = x[n,c,h+r,w+s] K[o,c,r,s]",
    (2, 0): "y[n,o,h,w] = x[n,c,2*h+r,2*w+s] K[o,c,r,s]",
    (1, "same"): "size n,c,h,w = x\ny[n,o,h,w] = x[n,c,h+r-1,w+s-1] K[o,c,r,s]",
}


@pytest.mark.parametrize("stride, padding", list(CONV2D))
@pytest.mark.parametrize("backend", ["numpy", "torch", "dask"])
def test_conv2d_matches_torch(stride: int, padding: int | str, backend: str) -> None:
    x, K = RNG.standard_normal((2, 3, 9, 8)), RNG.standard_normal((4, 3, 3, 3))
    expected = F.conv2d(torch.tensor(x), torch.tensor(K), stride=stride, padding=padding).numpy()
    got = ef.compile(CONV2D[stride, padding])(x=x, K=K, backend=backend)
    got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_conv1d_stride_two_matches_torch() -> None:
    x, K = RNG.standard_normal((2, 3, 12)), RNG.standard_normal((5, 3, 4))
    got = ef.evaluate("y[n,o,t] = x[n,c,2*t+k] K[o,c,k]", x=x, K=K)
    np.testing.assert_allclose(got, F.conv1d(torch.tensor(x), torch.tensor(K), stride=2).numpy(), rtol=1e-12)


def test_conv2d_on_jax_matches_torch() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    x, K = RNG.standard_normal((2, 3, 9, 8)), RNG.standard_normal((4, 3, 3, 3))
    got = ef.compile(CONV2D[1, "same"])(x=jax.numpy.asarray(x), K=jax.numpy.asarray(K), backend="jax")
    expected = F.conv2d(torch.tensor(x), torch.tensor(K), padding="same").numpy()
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- gathers
def test_embedding_matches_torch() -> None:
    E, t = RNG.standard_normal((50, 8)), RNG.integers(0, 50, size=(4, 6))
    got = ef.evaluate("y[b,s,d] = E[t[b,s], d]", E=E, t=t)
    np.testing.assert_allclose(got, F.embedding(torch.tensor(t), torch.tensor(E)).numpy())


def test_gather_along_an_axis_matches_torch() -> None:
    x, idx = RNG.standard_normal((3, 7)), RNG.integers(0, 7, size=(3, 4))
    got = ef.evaluate("v[b,k] = x[b, idx[b,k]]", x=x, idx=idx)
    np.testing.assert_allclose(got, torch.gather(torch.tensor(x), 1, torch.tensor(idx)).numpy())


def test_gather_then_contract() -> None:
    E, t, W = RNG.standard_normal((20, 5)), RNG.integers(0, 20, size=9), RNG.standard_normal((5, 3))
    np.testing.assert_allclose(ef.evaluate("y[b,o] = E[t[b], d] W[d,o]", E=E, t=t, W=W), E[t] @ W)


@pytest.mark.parametrize("bad", [-1, 20])
def test_gather_outside_the_axis_is_an_index_error(bad: int) -> None:
    E, t = RNG.standard_normal((20, 5)), np.array([0, bad, 3])
    with pytest.raises(ef.GatherIndexError, match=rf"axis 0 of 'E' \(length 20\) reads position {bad} at index \(1,\)"):
        ef.evaluate("y[b,d] = E[t[b], d]", E=E, t=t)
    with pytest.raises(IndexError):
        ef.evaluate("y[b,d] = E[t[b], d]", E=E, t=t, backend="torch")


def test_gather_tensor_must_hold_integers() -> None:
    with pytest.raises(ef.EinflowError, match="gather tensors hold integers"):
        ef.evaluate("y[b,d] = E[t[b], d]", E=np.ones((3, 2)), t=np.array([0.0, 1.0]))


def _example(name: str) -> object:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_heat_equation_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _example("heat_equation").main()  # type: ignore[attr-defined]
    assert "largest difference from numpy slicing" in capsys.readouterr().out


def test_convolution_example_trains(capsys: pytest.CaptureFixture[str]) -> None:
    _example("convolution").main()  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    gap = float(out.split("largest relative gap ")[1].split()[0])
    accuracy = float(out.split("accuracy on 256 new images ")[1].split()[0])
    assert gap < 1e-5 and accuracy > 0.9


# ---------------------------------------------------------------- derivatives
LOSS = "\nL = sum[n,o,h,w](T[n,o,h,w] tanh(y[n,o,h,w]))"


@pytest.mark.parametrize("stride, padding", list(CONV2D))
def test_conv2d_gradients_match_torch_autograd(stride: int, padding: int | str) -> None:
    x, K = RNG.standard_normal((2, 3, 9, 8)), RNG.standard_normal((4, 3, 3, 3))
    tx, tK = torch.tensor(x, requires_grad=True), torch.tensor(K, requires_grad=True)
    y = F.conv2d(tx, tK, stride=stride, padding=padding)
    T = RNG.standard_normal(tuple(y.shape))
    (torch.tensor(T) * torch.tanh(y)).sum().backward()
    gx, gK = ef.grad(CONV2D[stride, padding] + LOSS, wrt=["x", "K"])(x=x, K=K, T=T)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gK, tK.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_gradient_of_a_difference_is_a_scatter() -> None:
    x = RNG.standard_normal(10)
    gradient = ef.grad("d[i] = x[i+1] - x[i]\nL = d[i] d[i]", wrt="x")
    assert "delta[p, i + 1]" in str(gradient)  # the adjoint of a shifted read, in the language
    d = np.diff(x)
    expected = np.zeros(10)
    expected[1:] += 2 * d
    expected[:-1] -= 2 * d
    np.testing.assert_allclose(gradient(x=x), expected, rtol=1e-12)
    again = ef.compile(str(gradient))  # the printed derivative runs as it is
    np.testing.assert_allclose(again(x=x), expected, rtol=1e-12)


def test_embedding_gradient_matches_torch() -> None:
    E, t, W = RNG.standard_normal((50, 8)), RNG.integers(0, 50, size=(4, 6)), RNG.standard_normal((8, 3))
    gradient = ef.grad("y[b,s,o] = E[t[b,s], d] W[d,o]\nL = sum[b,s,o](tanh(y[b,s,o]))", wrt=["E", "W"])
    assert "delta[p, t[b,s]]" in str(gradient)  # a scatter-add through delta
    gE, gW = gradient(E=E, t=t, W=W)
    tE, tW = torch.tensor(E, requires_grad=True), torch.tensor(W, requires_grad=True)
    torch.tanh(F.embedding(torch.tensor(t), tE) @ tW).sum().backward()
    np.testing.assert_allclose(gE, tE.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gW, tW.grad.numpy(), rtol=1e-12, atol=1e-14)
    gE_torch = gradient(E=torch.tensor(E), t=torch.tensor(t), W=torch.tensor(W), backend="torch")[0]
    np.testing.assert_allclose(gE_torch.numpy(), tE.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_gather_tensor_cannot_be_differentiated() -> None:
    with pytest.raises(ef.DerivativeError, match="'t' holds the integer positions of a gather"):
        ef.grad("y[b,d] = E[t[b], d]\nL = y[b,d] y[b,d]", wrt="t")


def test_scatter_add_through_delta_adds_repeats() -> None:
    t, G = np.array([1, 3, 1]), RNG.standard_normal((3, 2))
    got = ef.evaluate("size v = 5\nd[v,e] = sum[b](delta[v, t[b]] G[b,e])", t=t, G=G)
    expected = np.zeros((5, 2))
    np.add.at(expected, t, G)
    np.testing.assert_allclose(got, expected)


CONV_NET = """size n,c,h,w = x
z[n,o,h,w] = x[n,c,h+r-1,w+s-1] K1[o,c,r,s]
a[n,o,h,w] = tanh(z[n,o,h,w])
u[n,m,i,j] = a[n,o,2*i+r,2*j+s] K2[m,o,r,s]
L = sum[n,m,i,j](S[n,m,i,j] u[n,m,i,j] u[n,m,i,j])"""


def test_conv_net_gradient_and_hvp_match_jax() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    x, K1 = RNG.standard_normal((2, 2, 8, 8)), RNG.standard_normal((3, 2, 3, 3))
    K2, S, V = RNG.standard_normal((2, 3, 2, 2)), RNG.standard_normal((2, 2, 4, 4)), RNG.standard_normal((3, 2, 3, 3))

    def loss(K1: object) -> object:
        z = jax.lax.conv_general_dilated(x, K1, (1, 1), "SAME")
        u = jax.lax.conv_general_dilated(jnp.tanh(z), K2, (2, 2), "VALID")
        return jnp.sum(S * u * u)

    arrays = {"x": x, "K1": K1, "K2": K2, "S": S}
    np.testing.assert_allclose(ef.compile(CONV_NET)(**arrays), loss(K1), rtol=1e-12)
    np.testing.assert_allclose(ef.grad(CONV_NET, wrt="K1")(**arrays), jax.grad(loss)(K1), rtol=1e-10, atol=1e-12)
    hvp = ef.hvp(CONV_NET, wrt="K1")
    tangent = next(name for name in hvp.inputs if name not in arrays)
    expected = jax.jvp(jax.grad(loss), (K1,), (V,))[1]
    np.testing.assert_allclose(hvp(**arrays, **{tangent: V}), expected, rtol=1e-10, atol=1e-11)


def test_latex_writes_positions_as_subscripts() -> None:
    from einflow.export.latex import to_latex

    text = to_latex(ef.compile("size n = x\nL[n] = x[n-1] - 2 x[n] + x[n+1]\ne[b,d] = E[t[b],d]"))
    assert "x_{n-1} - 2 x_{n} + x_{n+1}" in text
    assert "E_{t_{b},d}" in text
    assert r"\delta_{p,2h+r}" in to_latex(ef.grad("y[h] = x[2*h+r] k[r]\nL = y[h] y[h]", wrt="x"))


EXPORTED = [  # programs with shifted, strided, padded, constant and gathered reads, and their gradients' scatters
    ("y[n,o,h,w] = x[n,c,2*h+r,2*w+s+1] K[o,c,r,s]", {"x": (2, 3, 9, 8), "K": (4, 3, 3, 3)}),
    ("size n,c,h,w = x\ny[n,o,h,w] = x[n,c,h+r-1,w+s-1] K[o,c,r,s]", {"x": (2, 3, 6, 5), "K": (4, 3, 3, 3)}),
    ("d[i] = x[i+1] - x[i]", {"x": (7,)}),
    ("z[i] = w[-i + 4] + x[0, i]", {"w": (5,), "x": (2, 5)}),
    ("y[b,o] = E[t[b], d] W[d,o]", {"E": (10, 3), "W": (3, 2), "t": None}),
]


def _exported(program: ef.Program, target: str) -> object:
    namespace: dict = {}
    exec(compile(program.to_source("f", target=target), "<exported>", "exec"), namespace)  # noqa: S102
    return namespace["f"]


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("text, shapes", EXPORTED)
def test_to_source_exports_shifted_reads_and_their_gradients(text: str, shapes: dict, target: str) -> None:
    jnp = pytest.importorskip("jax.numpy")
    values = {name: RNG.integers(0, 10, 6) if shape is None else RNG.standard_normal(shape)
              for name, shape in shapes.items()}
    convert = {"numpy": np.asarray, "torch": torch.tensor, "jax": jnp.asarray}[target]
    program = ef.compile(text)
    target_text = text.split("\n")[-1].split("=")[0].strip()
    name, indices = target_text[:target_text.index("[")], target_text[target_text.index("[") + 1:-1]
    values["T"] = RNG.standard_normal(program(**values).shape)
    gradient = ef.grad(text + f"\nL = sum[{indices}](T[{indices}] {name}[{indices}])",
                       wrt=[tensor for tensor, shape in shapes.items() if shape is not None])
    for compiled in (program, gradient):
        expected = compiled(**{k: v for k, v in values.items() if k in compiled.inputs})
        got = _exported(compiled, target)(**{k: convert(v) for k, v in values.items() if k in compiled.inputs})
        expected, got = (expected, got) if isinstance(expected, tuple) else ((expected,), (got,))
        for ours, reference in zip(got, expected):
            np.testing.assert_allclose(np.asarray(ours), reference, rtol=1e-6, atol=1e-6)


def test_exported_ranges_follow_the_shapes_at_run_time() -> None:
    f = _exported(ef.compile("y[n,o,h] = x[n,c,2*h+r] K[o,c,r]"), "numpy")
    for length in (9, 12):  # one function, two input lengths: the ranges are inferred when it runs
        x, K = RNG.standard_normal((2, 3, length)), RNG.standard_normal((4, 3, 3))
        expected = F.conv1d(torch.tensor(x), torch.tensor(K), stride=2).numpy()
        np.testing.assert_allclose(f(x=x, K=K), expected, rtol=1e-10)
    with pytest.raises(IndexError, match="outside its axis of length 10"):
        _exported(ef.compile("y[b,d] = E[t[b], d]"), "numpy")(E=np.ones((10, 2)), t=np.array([3, 10]))


# ---------------------------------------------------------------- random programs (tests/randprog.py, language v3)
#: seeds whose v3 program still fails a derivative check (a Jacobian or Hessian program whose index is
#: sized only through an inferred range: "index ... has no size"); they must keep failing until fixed
def test_gradient_of_a_mean_over_a_strided_index_keeps_its_range() -> None:
    # the mean's count runs over an index only the strided read sizes: the gradient declares its range
    program = ef.compile("L = mean[r](x[2*r] x[2*r])")
    gradient = ef.grad(program, "x")
    assert "size" in str(gradient)
    rng = np.random.default_rng(3)
    for n in (6, 7):
        x = rng.standard_normal(n)
        step = 1e-6
        central = np.array([(float(program(x=x + step * e)) - float(program(x=x - step * e))) / (2 * step)
                            for e in np.eye(n)])
        np.testing.assert_allclose(gradient(x=x), central, atol=1e-8)


def _central_gradient(program: ef.Program, name: str, values: dict[str, np.ndarray]) -> np.ndarray:
    step = 1e-6
    found = np.zeros_like(values[name])
    for k in np.ndindex(values[name].shape):
        up, down = dict(values), dict(values)
        up[name], down[name] = values[name].copy(), values[name].copy()
        up[name][k] += step
        down[name][k] -= step
        found[k] = (float(program(**up)) - float(program(**down))) / (2 * step)
    return found


def test_range_of_an_index_only_reads_size_is_the_intersection_of_its_reads_in_derivatives() -> None:
    # r runs over the three positions both x[2*r] and y[r] allow; the mean divides by 3 in the gradient too
    program = ef.compile("L = mean[r](x[2*r] y[r])")
    rng = np.random.default_rng(4)
    values = {"x": rng.standard_normal(9), "y": rng.standard_normal(3)}
    for name in ("x", "y"):
        np.testing.assert_allclose(ef.grad(program, name)(**values), _central_gradient(program, name, values),
                                   atol=1e-8)


def test_hessian_of_a_mean_over_a_strided_index() -> None:
    program = ef.compile("L = mean[r](x[2*r] x[2*r] x[2*r])")
    gradient = ef.grad(program, "x")
    hessian = ef.hessian(program, "x")
    x = np.random.default_rng(5).standard_normal(5)
    step = 1e-6
    central = np.stack([(np.asarray(gradient(x=x + step * e)) - np.asarray(gradient(x=x - step * e))) / (2 * step)
                        for e in np.eye(5)])
    np.testing.assert_allclose(hessian(x=x), central, atol=1e-6)


@pytest.mark.parametrize("seed", list(range(24)))
def test_random_programs_with_shifted_reads(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import randprog
    import test_differential

    monkeypatch.setenv("EINFLOW_DIFF_LANGUAGE", "v2")
    plain = randprog.generate(seed).text
    monkeypatch.setenv("EINFLOW_DIFF_LANGUAGE", "v3")
    if randprog.generate(seed).text == plain:
        pytest.skip("this seed draws no shifted read")
    failures = test_differential.check_seed(seed)
    assert not failures, "\n".join(str(failure) for failure in failures)


def test_memory_model_counts_padded_copies_not_views() -> None:
    shapes = {"x": (2, 3, 9, 8), "K": (4, 3, 3, 3)}
    valid = ef.compile(CONV2D[1, 0]).plan(**shapes).peak_bytes
    same = ef.compile(CONV2D[1, "same"]).plan(**shapes).peak_bytes
    window = 2 * 3 * 7 * 3 * 6 * 3 * 8  # the valid window, float64: a view (the contraction copies it once)
    assert window <= valid < 2 * window
    assert same - valid >= 2 * 3 * 11 * 10 * 8  # the padded copy


def test_conv2d_and_embedding_gradient_on_cupy() -> None:
    cupy = pytest.importorskip("cupy")
    try:
        cupy.zeros(1)
    except Exception:  # noqa: BLE001 - cupy installed without a usable GPU
        pytest.skip("no GPU")
    x, K = RNG.standard_normal((2, 3, 9, 8)), RNG.standard_normal((4, 3, 3, 3))
    got = ef.compile(CONV2D[1, "same"])(x=cupy.asarray(x), K=cupy.asarray(K), backend="cupy")
    expected = F.conv2d(torch.tensor(x), torch.tensor(K), padding="same").numpy()
    np.testing.assert_allclose(cupy.asnumpy(got), expected, rtol=1e-10, atol=1e-12)
    E, t, G = RNG.standard_normal((20, 4)), RNG.integers(0, 20, size=7), RNG.standard_normal((7, 4))
    gradient = ef.grad("y[b,d] = E[t[b], d]\nL = y[b,d] G[b,d]", wrt="E")
    expected_E = np.zeros((20, 4))
    np.add.at(expected_E, t, G)
    got_E = gradient(E=cupy.asarray(E), t=cupy.asarray(t), G=cupy.asarray(G), backend="cupy")
    np.testing.assert_allclose(cupy.asnumpy(got_E), expected_E, rtol=1e-12)


def test_inside_torch_autograd_and_jax_grad() -> None:
    x, K = RNG.standard_normal((2, 3, 9, 8)), RNG.standard_normal((4, 3, 3, 3))
    program = ef.compile(CONV2D[1, "same"])
    tx, tK = torch.tensor(x, requires_grad=True), torch.tensor(K, requires_grad=True)
    program(x=tx, K=tK).tanh().sum().backward()  # the backward pass is einflow's own gradient program
    rx, rK = torch.tensor(x, requires_grad=True), torch.tensor(K, requires_grad=True)
    F.conv2d(rx, rK, padding="same").tanh().sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tK.grad.numpy(), rK.grad.numpy(), rtol=1e-10, atol=1e-12)
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    gradient = jax.grad(lambda k: jnp.sum(jnp.tanh(program(x=jnp.asarray(x), K=k))))(jnp.asarray(K))
    np.testing.assert_allclose(np.asarray(gradient), rK.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_declared_size_pads_a_read_whose_index_only_a_reduction_names() -> None:
    # i is neither a target index nor a plain read's: its declared size still fixes its range (padding x)
    x = np.random.default_rng(6).standard_normal(3)
    padded = np.concatenate([[0.0], x])
    assert float(ef.compile("size i = 4\nL = max[i](x[i-1])")(x=x)) == pytest.approx(padded.max())
    assert float(ef.compile("size i = 4\nL = sum[i](tanh(x[i-1]))")(x=x)) == pytest.approx(np.tanh(padded).sum())


def test_hessian_diagonal_through_a_shifted_read_inside_a_function() -> None:
    # two deltas of positions share the kept index p: both become 0/1 arrays (no scatter can hold them)
    program = ef.compile("S[k,m] = sqrt(2. M[k,q] U[m,n] y[n+1]) g[q]\nf = S[k,m] V[k,m]")
    rng = np.random.default_rng(7)
    values = {"M": rng.uniform(0.5, 1.5, (2, 3)), "U": rng.uniform(0.5, 1.5, (3, 2)), "y": rng.uniform(0.5, 1.5, 3),
              "g": rng.standard_normal(3), "V": rng.standard_normal((2, 3))}
    gradient = ef.grad(program, "y")
    step = 1e-6
    central = []
    for k, e in enumerate(np.eye(3)):
        up, down = dict(values, y=values["y"] + step * e), dict(values, y=values["y"] - step * e)
        central.append((np.asarray(gradient(**up))[k] - np.asarray(gradient(**down))[k]) / (2 * step))
    np.testing.assert_allclose(ef.hessian_diagonal(program, "y")(**values), central, atol=1e-6)


def test_laplacian_through_a_gather_sums_two_deltas_of_one_index() -> None:
    # d2/ds2 of (sum_n s[ix[n]] w[n])^2 is 2 a a^T with a = bincount(ix, w): its trace sums two deltas over v
    program = ef.compile("L = (sum[n](s[ix[n]] w[n]))^2")
    rng = np.random.default_rng(8)
    ix = np.array([0, 2, 2, 3])
    w = rng.standard_normal(4)
    a = np.bincount(ix, w, minlength=5)
    found = ef.laplacian(program, "s")(s=rng.standard_normal(5), ix=ix, w=w)
    assert float(found) == pytest.approx(2 * float(a @ a))


def test_jacobian_keeps_the_declared_range_of_a_padded_index_a_derivation_renames() -> None:
    # b is padded (v[b+1] reads 0 at b = 1); the derivation writes b as m and factors out t1[m]: m keeps size 2
    program = ef.compile("size b = 2\nL[r] = sigmoid(H[l] v[b+1] H[l] y[k] C[h,k] H[h]) M[b,r] u[m] delta[b,m]")
    rng = np.random.default_rng(9)
    values = {"H": rng.standard_normal(3), "v": rng.standard_normal(2), "y": rng.standard_normal(2),
              "C": rng.standard_normal((3, 2)), "M": rng.standard_normal((2, 4)), "u": rng.standard_normal(2)}
    step = 1e-6
    central = np.stack([(np.asarray(program(**dict(values, H=values["H"] + step * e)))
                         - np.asarray(program(**dict(values, H=values["H"] - step * e)))) / (2 * step)
                        for e in np.eye(3)], axis=-1)
    np.testing.assert_allclose(ef.jacobian(program, "H", mode="reverse")(**values), central, atol=1e-7)


def test_gradient_of_a_shifted_read_beside_a_matrix_declaration() -> None:
    program = ef.compile("symmetric A\nL = A[h,k] x[k+1] y[h]")
    rng = np.random.default_rng(10)
    A = rng.standard_normal((3, 3))
    values = {"A": A + A.T, "x": rng.standard_normal(4), "y": rng.standard_normal(3)}
    np.testing.assert_allclose(ef.grad(program, "x")(**values), _central_gradient(program, "x", values), atol=1e-8)


def test_laplacian_through_a_constant_position() -> None:
    # d2/dy[1,a]2 of (sum_a y[1,a])^2 is 2 for each a: the Laplacian sums deltas of a constant position alone
    program = ef.compile("L = sum[a](y[1,a])^2")
    y = np.random.default_rng(11).standard_normal((2, 3))
    assert float(ef.laplacian(program, "y")(y=y)) == pytest.approx(6.0)


def test_gradient_of_a_mean_over_an_index_only_a_gather_sizes() -> None:
    # the count runs over m, which only ix[m] sizes: the gradient declares it from ix (a scatter of 1/3s)
    program = ef.compile("L = mean[m](s[ix[m]])")
    ix = np.array([0, 3, 3])
    found = ef.grad(program, "s")(s=np.random.default_rng(12).standard_normal(4), ix=ix)
    np.testing.assert_allclose(found, np.bincount(ix, minlength=4) / 3)


# ---------------------------------------------------------------- native convolutions (torch's capability)
CONVOLVED = [  # (program, shapes): each product reading a window is one torch.convolution call on torch
    ("y[n,o,h] = x[n,c,h+r] K[o,c,r]", {"x": (2, 3, 11), "K": (4, 3, 3)}),
    ("y[n,o,h] = x[n,c,3*h+r] K[o,c,r]", {"x": (2, 3, 14), "K": (4, 3, 2)}),
    ("y[h] = x[h+2*r] K[r]", {"x": (12,), "K": (3,)}),
    ("y[o,h,n] = x[n,c,h+r] K[c,o,r]", {"x": (2, 3, 9), "K": (3, 4, 2)}),
    ("y[a,b,o,h] = x[a,b,c,h+r] K[o,c,r]", {"x": (2, 3, 2, 9), "K": (4, 2, 3)}),
    ("y[n,o,a,b,d] = x[n,c,a+i,b+j,d+k] K[o,c,i,j,k]", {"x": (2, 2, 5, 6, 4), "K": (3, 2, 2, 3, 2)}),
    ("size n,c,h,w = x\ny[n,o,h,w] = x[n,c,h+r-1,w+s-1] K[o,c,r,s]", {"x": (2, 3, 6, 5), "K": (4, 3, 3, 3)}),
    ("size n,c,u = x\ny[n,o,u] = x[n,c,u-r+1] K[o,c,r]", {"x": (2, 3, 8), "K": (4, 3, 3)}),
    ("size n,c,u = x\ny[n,o,u] = x[n,c,u-r] K[o,c,r]", {"x": (2, 3, 8), "K": (4, 3, 3)}),
    ("y[n,o,h,w] = x[n,c,2*h+r,w+s+1] K[o,c,r,s]", {"x": (2, 3, 9, 8), "K": (4, 3, 3, 2)}),
    ("d[o,c,r] = x[n,c,h+r] G[n,o,h]", {"x": (2, 3, 10), "G": (2, 4, 8)}),
    ("d[o,c,r] = x[n,c,2*h+r] G[n,o,h]", {"x": (2, 3, 11), "G": (2, 4, 5)}),
]


def _generated(program: ef.Program, backend: str | None = None) -> str:
    return "\n".join(plan.source for key, plan in program._plans.items() if backend in (None, key[0]))


@pytest.mark.parametrize("text, shapes", CONVOLVED)
def test_window_contractions_run_as_native_convolutions_on_torch(text: str, shapes: dict) -> None:
    program = ef.compile(text)
    values = {name: RNG.standard_normal(shape) for name, shape in shapes.items()}
    expected = program(**values)  # numpy: the einsum over the window, an independent path
    got = program(**{name: torch.tensor(value) for name, value in values.items()}, backend="torch")
    assert "_convolve(" in _generated(program)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("text, shapes", CONVOLVED[:10])
def test_gradients_through_native_convolutions_match_numpy(text: str, shapes: dict) -> None:
    target = text.split("\n")[-1].split("=")[0].strip()
    name, indices = target[:target.index("[")], target[target.index("[") + 1:-1]
    loss = f"\nL = sum[{indices}](T[{indices}] {name}[{indices}])"
    wrt = [tensor for tensor in shapes]
    program = ef.value_and_grad(text + loss, wrt=wrt)
    values = {tensor: RNG.standard_normal(shape) for tensor, shape in shapes.items()}
    values["T"] = RNG.standard_normal(ef.compile(text)(**values).shape)
    expected = program(**values)
    got = program(**{tensor: torch.tensor(value) for tensor, value in values.items()}, backend="torch")
    assert _generated(program).count("_convolve(") >= 2
    (value, gradients), (value_expected, expected_gradients) = got, expected
    np.testing.assert_allclose(value.numpy(), value_expected, rtol=1e-9)
    for ours, reference in zip(gradients, expected_gradients):
        np.testing.assert_allclose(ours.numpy(), reference, rtol=1e-9, atol=1e-9)


def test_strided_gradient_by_x_is_a_transposed_convolution() -> None:
    program = ef.grad(CONV2D[2, 0] + "\nL = sum[n,o,h,w](T[n,o,h,w] y[n,o,h,w])", wrt="x")
    x = torch.randn(2, 3, 10, 9, dtype=torch.float64)
    K = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    T = torch.randn(2, 4, 4, 4, dtype=torch.float64)
    xr = x.clone().requires_grad_(True)
    (F.conv2d(xr, K, stride=2) * T).sum().backward()
    got = program(x=x, K=K, T=T, backend="torch")
    assert "scatter" in _generated(program) and "_convolve(K, T, ('transpose'" in _generated(program)
    torch.testing.assert_close(got, xr.grad)


def test_convolution_keeps_numpys_types_and_falls_back_for_integers() -> None:
    program = ef.compile("y[n,o,h] = x[n,c,h+r] K[o,c,r]")
    x, K = RNG.standard_normal((2, 3, 9)), RNG.standard_normal((4, 3, 3))
    got = program(x=torch.tensor(x, dtype=torch.float32), K=torch.tensor(K), backend="torch")
    assert got.dtype == torch.float64  # float32 with float64 is float64, as numpy has it
    np.testing.assert_allclose(got.numpy(), program(x=x.astype(np.float32), K=K), rtol=1e-6)
    xi, Ki = RNG.integers(-3, 4, (2, 3, 9)), RNG.integers(-3, 4, (4, 3, 3))
    integers = ef.compile("z[n,o,h] = x[n,c,h+r] K[o,c,r]")
    got_int = integers(x=torch.tensor(xi), K=torch.tensor(Ki), backend="torch")
    assert "_convolve(" not in _generated(integers)
    np.testing.assert_array_equal(got_int.numpy(), integers(x=xi, K=Ki))


def test_conv_net_hvp_on_torch_matches_numpy() -> None:
    text = """size n,c,h,w = x
z[n,o,h,w] = x[n,c,h+r-1,w+s-1] K1[o,c,r,s]
a[n,o,h,w] = tanh(z[n,o,h,w])
u[n,m,i,j] = a[n,o,2*i+r,2*j+s] K2[m,o,r,s]
L = sum[n,m,i,j](S[n,m,i,j] u[n,m,i,j] u[n,m,i,j])"""
    hvp = ef.hvp(text, wrt="K1")
    values = {"x": RNG.standard_normal((2, 3, 8, 8)), "K1": RNG.standard_normal((4, 3, 3, 3)),
              "K2": RNG.standard_normal((5, 4, 2, 2)), "S": RNG.standard_normal((2, 5, 4, 4))}
    tangent = next(name for name in hvp.inputs if name not in values)
    values[tangent] = RNG.standard_normal((4, 3, 3, 3))
    got = hvp(**{name: torch.tensor(value) for name, value in values.items()}, backend="torch")
    assert "_convolve(" in _generated(hvp)
    np.testing.assert_allclose(got.numpy(), hvp(**values), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("text", [
    "L = mean[h,r](x[h+r] k[r])",
    "y[h] = mean[r](x[h+r] k[r])\nL = sum[h](y[h] y[h])",
    "L = mean[h](sum[r](x[h+r] k[r]) ** 2)",
    "L = mean[h,r](x[2*h+r] x[2*h+r] k[r])",
    "L = mean[n,h,r](X[n, h+r, 1] k[r])",
])
def test_a_mean_over_indices_only_a_two_index_position_sizes_keeps_their_ranges_in_derivatives(text: str) -> None:
    # the count of a mean over h runs over the range x[h+r] gives h; the derivative renames h, and the copy
    # gets its range from the same read (a helper `_range1[h2,r2] = x[h2 + r2] k[r2]` and a size line)
    program = ef.compile(text)
    values = {name: RNG.standard_normal(shape) for name, shape in
              {"x": (9,), "k": (3,), "X": (2, 9, 3)}.items() if name in program.inputs}
    for name in program.inputs:
        gradient = ef.grad(text, wrt=name)
        np.testing.assert_allclose(gradient(**values), _central_gradient(program, name, values), atol=1e-7)
        hessian = ef.hessian(text, wrt=name)(**values)
        step, direction = 1e-6, RNG.standard_normal(values[name].shape)
        up, down = dict(values), dict(values)
        up[name], down[name] = values[name] + step * direction, values[name] - step * direction
        numeric = (gradient(**up) - gradient(**down)) / (2 * step)
        axes = list(range(values[name].ndim))
        along = np.tensordot(hessian, direction, axes=([a + values[name].ndim for a in axes], axes))
        np.testing.assert_allclose(along, numeric, atol=1e-6)


@pytest.mark.parametrize("text, shapes", [
    ("y[b,d] = E[t[b], d]", {"E": (10, 3), "t": (6,)}),
    ("y[d,b] = E[t[b], d]", {"E": (10, 3), "t": (6,)}),
    ("y[b,d] = E[d, t[b]]", {"E": (3, 10), "t": (6,)}),
    ("y[b,k,d] = E[t[b,k], d]", {"E": (10, 3), "t": (4, 2)}),
    ("y[d,b,c] = E[c, t[b], d]", {"E": (2, 10, 3), "t": (6,)}),
])
def test_gathers_and_their_scatters_on_torch_match_numpy(text: str, shapes: dict) -> None:
    # whole rows taken (index_select) and added back (embedding backward, index_add_) where they can be
    program = ef.compile(text)
    values = {name: RNG.integers(0, 10, shape) if name == "t" else RNG.standard_normal(shape)
              for name, shape in shapes.items()}
    target = text.split("=")[0].strip()
    name, indices = target[:target.index("[")], target[target.index("[") + 1:-1]
    values["T"] = RNG.standard_normal(program(**values).shape)
    gradient = ef.grad(text + f"\nL = sum[{indices}](T[{indices}] {name}[{indices}])", wrt="E")
    for compiled in (program, gradient):
        arrays = {k: v for k, v in values.items() if k in compiled.inputs}
        got = compiled(**{k: torch.tensor(v) for k, v in arrays.items()}, backend="torch")
        np.testing.assert_allclose(got.numpy(), compiled(**arrays), rtol=1e-12)
    with pytest.raises(ef.GatherIndexError):
        program(**{k: torch.tensor(v) for k, v in values.items() if k in program.inputs} | {"t": torch.tensor(
            np.full(shapes["t"], 10))}, backend="torch")


@pytest.mark.parametrize("text, shapes", [
    ("y[n,o,h,w] = x[n,c,2*h+r,2*w+s] K[o,c,r,s]", {"x": (2, 3, 10, 9), "K": (4, 3, 3, 3)}),
    ("y[n,o,h] = x[n,c,3*h+r] K[o,c,r]", {"x": (2, 3, 14), "K": (4, 3, 2)}),
    ("y[n,o,h] = x[n,c,2*h+r+1] K[o,c,r]", {"x": (2, 3, 12), "K": (4, 3, 3)}),
    ("size n,c,h = x\ny[n,o,h] = x[n,c,2*h+r-1] K[o,c,r]", {"x": (2, 3, 11), "K": (4, 3, 3)}),
    ("y[n,o,h] = x[n,c,2*h-r+4] K[o,c,r]", {"x": (2, 3, 11), "K": (4, 3, 3)}),
])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_strided_gradients_are_transposed_convolutions_without_a_scatter(text: str, shapes: dict,
                                                                         backend: str) -> None:
    target = text.split("\n")[-1].split("=")[0].strip()
    indices = target[target.index("[") + 1:-1]
    program = ef.compile(text)
    values = {name: RNG.standard_normal(shape) for name, shape in shapes.items()}
    values["T"] = RNG.standard_normal(program(**values).shape)
    gradient = ef.grad(text + f"\nL = sum[{indices}](T[{indices}] y[{indices}])", wrt="x")
    expected = _central_gradient(ef.compile(text + f"\nL = sum[{indices}](T[{indices}] y[{indices}])"), "x", values)
    arrays = values if backend == "numpy" else {k: torch.tensor(v) for k, v in values.items()}
    got = gradient(**arrays, backend=backend)
    assert "'transpose'" in _generated(gradient)
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-7)


def test_cross_seed_12586_a_scatter_that_lands_nowhere_keeps_its_float_type() -> None:
    # w[j+2] reads only padding (w has one element), so the Hessian by w scatters onto positions outside it:
    # numpy's bincount of nothing made int64 zeros where the inputs are float64
    text = "size j = 1\nf = sum[hid](X[2,hid+2,r] * (w[j+2] * w[j] z[a] V[a,r] Q[i,i] v[hid]))"
    rng = np.random.default_rng(0)
    arrays = {"X": rng.random((4, 5, 3)), "v": rng.random(3), "w": rng.random(1), "Q": rng.random((1, 1)),
              "V": rng.random((4, 3)), "z": rng.random(4)}
    hessian = ef.hessian(text, wrt="w")
    for backend in ("numpy", "torch", "dask"):
        value = hessian(**arrays, backend=backend)
        value = np.asarray(value.compute() if hasattr(value, "compute") else value)
        assert value.dtype == np.float64 and value.tolist() == [[0.0]]


# ---------------------------------------------------------------- numpy's convolution kernel (no im2col)
@pytest.mark.parametrize("text, shapes", CONVOLVED)
def test_window_contractions_stay_einsums_on_numpy(text: str, shapes: dict) -> None:
    """numpy contracts a window as an einsum (an im2col copy and one BLAS product measured faster there than a
    convolution kernel of one product per kernel offset: einflow.engine.convolution.numpy_convolves)."""
    program = ef.compile(text)
    values = {name: RNG.standard_normal(shape) for name, shape in shapes.items()}
    got = program(**values)
    assert "_convolve(" not in _generated(program, "numpy")
    np.testing.assert_allclose(got, np.asarray(program(**values, backend="dask")), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride, padding", list(CONV2D))
@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-12), ("float32", 1e-5)])
def test_numpy_convolutions_values_and_gradients_match_torch(stride: int, padding: int | str, dtype: str,
                                                                   tolerance: float) -> None:
    program = ef.value_and_grad(CONV2D[stride, padding] + "\nL = sum[n,o,h,w](T[n,o,h,w] y[n,o,h,w])",
                                wrt=["x", "K"])
    x, K = RNG.standard_normal((2, 3, 9, 8)).astype(dtype), RNG.standard_normal((4, 3, 3, 3)).astype(dtype)
    forward = ef.compile(CONV2D[stride, padding])
    y = forward(x=x, K=K)
    T = RNG.standard_normal(y.shape).astype(dtype)
    tx, tK = torch.tensor(x, requires_grad=True), torch.tensor(K, requires_grad=True)
    reference = F.conv2d(tx, tK, stride=stride, padding=padding)
    (reference * torch.tensor(T)).sum().backward()
    value, (gx, gK) = program(x=x, K=K, T=T)
    source = _generated(program, "numpy")
    # stride 2: the gradient by x is numpy's transposed convolution; the rest are einsums over windows
    assert "_convolve(" not in _generated(forward, "numpy")
    assert "('forward'" not in source and "('weight'" not in source
    assert ("_convolve(K, T, ('transpose'" in source) == (stride == 2)
    assert y.dtype == gx.dtype == gK.dtype == np.dtype(dtype)
    np.testing.assert_allclose(y, reference.detach().numpy(), rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(value, float((reference * torch.tensor(T)).sum().detach()), rtol=tolerance)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(gK, tK.grad.numpy(), rtol=tolerance, atol=tolerance)


def test_numpy_transposed_convolution_under_a_memory_limit() -> None:
    """Within the limit numpy's transposed convolution runs (its temporaries counted); below its peak the einsum
    and its scatter are tried instead (a scatter is not sliced, so here neither fits) and MemoryLimitError says so."""
    # (programs are cached by their text: this one's own names)
    text = "Y[n,o,h,w] = X[n,c,2*h+r,2*w+s] W[o,c,r,s]\nL = sum[n,o,h,w](S[n,o,h,w] Y[n,o,h,w])"
    x, K = RNG.standard_normal((4, 8, 41, 41)), RNG.standard_normal((8, 8, 3, 3))
    T = RNG.standard_normal((4, 8, 20, 20))
    program = ef.grad(text, wrt="X")
    whole = program.plan(X=x, W=K, S=T).peak_bytes
    got = program(X=x, W=K, S=T, memory_limit=whole)
    assert "_convolve(W, S, ('transpose'" in _generated(program)
    tx = torch.tensor(x, requires_grad=True)
    (F.conv2d(tx, torch.tensor(K), stride=2) * torch.tensor(T)).sum().backward()
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    with pytest.raises(ef.MemoryLimitError, match="over the memory limit"):
        program(X=x, W=K, S=T, memory_limit=int(0.8 * whole))


def test_convolution_reads_a_window_whose_array_is_freed_before_it_runs() -> None:
    """The example network's gradient on torch: the window of ``a`` is ``a``'s last reader, so ``a`` is freed after
    it; the convolution that reads the window reads the window's name, not the freed array's (it raised
    UnboundLocalError)."""
    network = _example("convolution").NETWORK  # type: ignore[attr-defined]
    gradient = ef.grad(network, wrt=["K1", "K2", "V"])
    arrays = {"x": RNG.standard_normal((32, 1, 8, 8)), "K1": RNG.standard_normal((4, 1, 3, 3)),
              "K2": RNG.standard_normal((8, 4, 2, 2)), "V": RNG.standard_normal((8, 4, 4)),
              "label": np.sign(RNG.standard_normal(32))}
    got = gradient(**{name: torch.tensor(value) for name, value in arrays.items()}, backend="torch")
    assert _generated(gradient, "torch").count("_convolve(") >= 3
    for ours, reference in zip(got, gradient(**arrays)):
        np.testing.assert_allclose(ours.numpy(), reference, rtol=1e-10, atol=1e-12)
