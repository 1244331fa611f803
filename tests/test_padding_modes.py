"""Padding modes (LANGUAGE.md 9.4): ``pad circular|reflect|replicate|zeros X``.

References are independent: numpy.pad (modes wrap/reflect/edge/constant) with a numpy loop or einsum,
torch.nn.Conv1d/2d/3d with ``padding_mode``, jax.grad/hessian/jvp of jnp.pad programs in float64, central
differences.
"""

from __future__ import annotations

import numpy as np
import pytest

import einflow as ef
from einflow.lang import ir
from einflow.lang.grammar import parse

torch = pytest.importorskip("torch")

MODES = ("zeros", "circular", "reflect", "replicate")
#: einflow's (torch's) mode -> numpy.pad's
NUMPY_MODE = {"zeros": "constant", "circular": "wrap", "reflect": "reflect", "replicate": "edge"}
BACKENDS = ("numpy", "torch", "jax", "dask")
RNG = np.random.default_rng(37)


def _jax():  # type: ignore[no-untyped-def]
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def _numpy(value: object) -> np.ndarray:
    if hasattr(value, "compute"):
        value = value.compute()  # type: ignore[union-attr]
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


def _run(text: str, backend: str, **arrays: np.ndarray) -> np.ndarray:
    if backend in ("jax", "dask"):
        pytest.importorskip(backend)
    if backend == "jax":
        _jax()
    return _numpy(ef.compile(text)(backend=backend, **arrays))


# ---------------------------------------------------------------- the declaration: grammar, IR, printer, checks
def test_pad_declaration_round_trips_through_text_and_marks_the_reads() -> None:
    text = "pad reflect x, u\nsize h = x\ny[h] = x[h + r - 1] k[r] + u[h + 0]"
    program = parse(text)
    assert str(program) == text
    assert parse(str(program)) == program
    reads = [node for node in ir.walk(program.statements[-1].expr) if isinstance(node, ir.Read)]  # type: ignore
    assert [read.mode for read in reads] == ["reflect", "reflect"]
    plain = "size h = x\ny[h] = x[h + r - 1] k[r]"
    assert parse(plain) != parse("pad circular x\n" + plain)


def test_unknown_padding_mode_is_a_parse_error_with_a_caret() -> None:
    with pytest.raises(ef.ParseError, match="unknown padding mode 'wrap': did you mean 'circular'") as caught:
        parse("size h = x\npad wrap x\ny[h] = x[h+1]")
    assert (caught.value.line, caught.value.column) == (2, 5)
    assert "    pad wrap x\n        ^" in str(caught.value)
    with pytest.raises(ef.ParseError, match="did you mean 'reflect'"):
        parse("pad reflekt x\ny[i] = x[i]")


def test_pad_of_a_tensor_the_program_never_reads_is_a_clear_error() -> None:
    with pytest.raises(ef.TensorNameError, match="'z' is declared pad circular but the program neither reads nor"):
        ef.compile("pad circular z\nsize h = x\ny[h] = x[h+1]")


def test_one_tensor_padded_with_two_modes_is_an_error() -> None:
    with pytest.raises(ef.IndexRuleError, match="'x' is declared pad circular and pad reflect"):
        ef.compile("pad circular x\npad reflect x\ny[i] = x[i]")


def test_pad_declaration_of_a_target_folds_its_later_reads() -> None:
    u = RNG.standard_normal(6)
    got = ef.evaluate("pad circular v\nsize i = u\nv[i] = 2 u[i]\nw[i] = v[i + 2]", u=u)
    np.testing.assert_allclose(got, np.roll(2 * u, -2))


def test_reads_without_a_size_declaration_stay_inside_whatever_the_mode() -> None:
    s = np.array([1.0, 4.0, 9.0, 16.0])
    np.testing.assert_allclose(ef.evaluate("pad reflect s\nd[i] = s[i+1] - s[i]", s=s), np.diff(s))


def test_a_delta_sized_from_a_padded_tensor_folds_its_position() -> None:
    """``delta[p, h + 2]`` with ``size p = x`` and ``pad circular x``: 1 where p is (h + 2) mod n."""
    g = RNG.standard_normal(5)
    got = ef.evaluate("pad circular x\nsize p = x\nsize h = x\ny[p] = delta[p, h + 2] g[h]", x=np.zeros(5), g=g)
    np.testing.assert_allclose(got, np.roll(g, 2))


# ---------------------------------------------------------------- values: stencils
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
def test_second_difference_with_each_boundary_matches_numpy_pad(mode: str, backend: str) -> None:
    s = RNG.standard_normal(7)
    got = _run(f"pad {mode} s\nsize i = s\nL[i] = s[i-1] - 2 s[i] + s[i+1]", backend, s=s)
    padded = np.pad(s, 1, mode=NUMPY_MODE[mode])  # type: ignore[call-overload]
    np.testing.assert_allclose(got, padded[:-2] - 2 * padded[1:-1] + padded[2:], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ("numpy", "torch"))
@pytest.mark.parametrize("mode", MODES)
def test_five_point_laplacian_on_a_grid_matches_numpy_pad(mode: str, backend: str) -> None:
    u = RNG.standard_normal((5, 6))
    text = f"pad {mode} u\nsize i, j = u\nL[i,j] = u[i-1,j+0] + u[i+1,j+0] + u[i+0,j-1] + u[i+0,j+1] - 4 u[i,j]"
    p = np.pad(u, 1, mode=NUMPY_MODE[mode])  # type: ignore[call-overload]
    expected = p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u
    np.testing.assert_allclose(_run(text, backend, u=u), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_three_dimensional_stencil_matches_numpy_pad(mode: str) -> None:
    x, K = RNG.standard_normal((4, 5, 3)), RNG.standard_normal((3, 3, 3))
    got = ef.evaluate(f"pad {mode} x\nsize a, b, c = x\ny[a,b,c] = x[a+p-1, b+q-1, c+r-1] K[p,q,r]", x=x, K=K)
    padded = np.pad(x, 1, mode=NUMPY_MODE[mode])  # type: ignore[call-overload]
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3, 3))
    np.testing.assert_allclose(got, np.einsum("abcpqr,pqr->abc", windows, K), rtol=1e-12)


# ---------------------------------------------------------------- values: convolutions against torch's padding_mode
CONV2D = "pad {mode} x\nsize n, c, h, w = x\ny[n,o,h,w] = x[n,c,h+r-1,w+s-1] K[o,c,r,s]"


def _torch_conv(dims: int, mode: str, K: np.ndarray, padding: int = 1, stride: int = 1) -> torch.nn.Module:
    conv = getattr(torch.nn, f"Conv{dims}d")(K.shape[1], K.shape[0], K.shape[2:], padding=padding, stride=stride,
                                             bias=False, padding_mode=mode).double()
    conv.weight.data = torch.tensor(K)
    return conv


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
def test_same_conv2d_matches_torch_conv2d_padding_mode(mode: str, backend: str) -> None:
    x, K = RNG.standard_normal((2, 3, 6, 5)), RNG.standard_normal((4, 3, 3, 3))
    expected = _torch_conv(2, mode, K)(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(_run(CONV2D.format(mode=mode), backend, x=x, K=K), expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_conv1d_and_conv3d_match_torch_padding_mode(mode: str) -> None:
    x, K = RNG.standard_normal((2, 3, 9)), RNG.standard_normal((4, 3, 5))
    got = ef.evaluate(f"pad {mode} x\nsize n, c, t = x\ny[n,o,t] = x[n,c,t+k-2] K[o,c,k]", x=x, K=K)
    np.testing.assert_allclose(got, _torch_conv(1, mode, K, padding=2)(torch.tensor(x)).detach().numpy(), rtol=1e-11)
    x3, K3 = RNG.standard_normal((1, 2, 4, 3, 5)), RNG.standard_normal((2, 2, 3, 3, 3))
    got = ef.evaluate(f"pad {mode} x\nsize n, c, d, h, w = x\n"
                      "y[n,o,d,h,w] = x[n,c,d+p-1,h+q-1,w+r-1] K[o,c,p,q,r]", x=x3, K=K3)
    np.testing.assert_allclose(got, _torch_conv(3, mode, K3)(torch.tensor(x3)).detach().numpy(), rtol=1e-11)


@pytest.mark.parametrize("mode", MODES)
def test_strided_padded_conv2d_matches_torch(mode: str) -> None:
    x, K = RNG.standard_normal((1, 2, 7, 6)), RNG.standard_normal((3, 2, 3, 3))
    expected = _torch_conv(2, mode, K, stride=2)(torch.tensor(x)).detach().numpy()
    text = (f"pad {mode} x\nsize n, c, hx, wx = x\nsize h = {expected.shape[2]}\nsize w = {expected.shape[3]}\n"
            "y[n,o,h,w] = x[n,c,2*h+r-1,2*w+s-1] K[o,c,r,s]")
    np.testing.assert_allclose(ef.evaluate(text, x=x, K=K), expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("mode", ("circular", "reflect", "replicate"))
def test_padding_wider_than_the_axis_follows_numpy_pad(mode: str) -> None:
    """torch refuses reflect padding >= the axis (and circular > it); einflow follows numpy.pad, which repeats."""
    s, k = RNG.standard_normal(3), RNG.standard_normal(9)
    got = ef.evaluate(f"pad {mode} s\nsize h = s\ny[h] = s[h+r-4] k[r]", s=s, k=k)
    padded = np.pad(s, 4, mode=NUMPY_MODE[mode])  # type: ignore[call-overload]
    np.testing.assert_allclose(got, [padded[h:h + 9] @ k for h in range(3)], rtol=1e-12)
    one = ef.evaluate(f"pad {mode} s\nsize h = s\ny[h] = s[h+r-1] k[r]", s=s[:1], k=k[:3])
    np.testing.assert_allclose(one, np.pad(s[:1], 1, mode=NUMPY_MODE[mode]) @ k[:3])  # type: ignore[call-overload]


def test_padded_read_of_an_empty_axis_is_a_shape_error() -> None:
    with pytest.raises(ef.ShapeError, match="'s' is declared pad reflect, but its axis 0 is empty"):
        ef.evaluate("pad reflect s\nsize h = 2\ny[h] = s[h+r-1] k[r]", s=np.zeros(0), k=np.ones(3))


# ---------------------------------------------------------------- derivatives
LOSS = CONV2D + "\nL = sum[n,o,h,w](sin(y[n,o,h,w]))"


def _jax_loss(mode: str, K: np.ndarray):  # type: ignore[no-untyped-def]
    jax = _jax()
    jnp = jax.numpy

    def loss(x):  # type: ignore[no-untyped-def]
        padded = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode=NUMPY_MODE[mode])
        y = jax.lax.conv_general_dilated(padded, jnp.asarray(K), (1, 1), "VALID", precision="highest")
        return jnp.sum(jnp.sin(y))

    return jax, loss


@pytest.mark.parametrize("mode", ("circular", "reflect", "replicate"))  # (zeros: tests/test_index_arithmetic.py)
def test_grad_hessian_jvp_hvp_of_padded_conv2d_match_jax(mode: str) -> None:
    x, K, v = RNG.standard_normal((1, 2, 4, 3)), RNG.standard_normal((2, 2, 3, 3)), RNG.standard_normal((1, 2, 4, 3))
    jax, loss = _jax_loss(mode, K)
    text = LOSS.format(mode=mode)
    np.testing.assert_allclose(ef.grad(text, wrt="x")(x=x, K=K), jax.grad(loss)(x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ef.hessian(text, wrt="x")(x=x, K=K), jax.hessian(loss)(x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ef.jvp(text, wrt="x", tangent="v")(x=x, K=K, v=v), jax.jvp(loss, (x,), (v,))[1],
                               rtol=1e-10, atol=1e-12)
    expected = jax.jvp(jax.grad(loss), (x,), (v,))[1]
    np.testing.assert_allclose(ef.hvp(text, wrt="x", tangent="v")(x=x, K=K, v=v), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ("torch", "dask"))  # (jax: jax.grad through the jax backend, below)
@pytest.mark.parametrize("mode", ("circular", "reflect", "replicate"))
def test_grad_of_padded_conv2d_on_every_backend_matches_torch_autograd(mode: str, backend: str) -> None:
    x, K = RNG.standard_normal((2, 2, 5, 4)), RNG.standard_normal((3, 2, 3, 3))
    G = RNG.standard_normal((2, 3, 5, 4))
    xt = torch.tensor(x, requires_grad=True)
    (_torch_conv(2, mode, K)(xt) * torch.tensor(G)).sum().backward()
    text = CONV2D.format(mode=mode) + "\nL = y[n,o,h,w] G[n,o,h,w]"
    got = _run(str(ef.grad(text, wrt="x")), backend, x=x, K=K, G=G)
    np.testing.assert_allclose(got, xt.grad.numpy(), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("mode", ("circular", "reflect", "replicate"))
def test_grad_and_hessian_of_a_padded_stencil_match_central_differences(mode: str) -> None:
    s, k = RNG.standard_normal(6), RNG.standard_normal(3)
    text = f"pad {mode} s\nsize h = s\ny[h] = s[h+r-1] k[r]\nL = sum[h](y[h]^2 + y[h]^3)"

    def loss(values: np.ndarray) -> float:
        padded = np.pad(values, 1, mode=NUMPY_MODE[mode])  # type: ignore[call-overload]
        y = np.array([padded[h:h + 3] @ k for h in range(6)])
        return float(np.sum(y**2 + y**3))

    eps, eye = 1e-5, np.eye(6)
    numeric = [(loss(s + eps * e) - loss(s - eps * e)) / (2 * eps) for e in eye]
    np.testing.assert_allclose(ef.grad(text, wrt="s")(s=s, k=k), numeric, rtol=1e-7, atol=1e-8)
    g = ef.grad(text, wrt="s")
    numeric_h = np.array([(g(s=s + eps * e, k=k) - g(s=s - eps * e, k=k)) / (2 * eps) for e in eye])
    np.testing.assert_allclose(ef.hessian(text, wrt="s")(s=s, k=k), numeric_h, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("mode", ("circular", "reflect", "replicate"))
def test_derivative_programs_of_padded_reads_print_and_reparse_to_themselves(mode: str) -> None:
    text = f"pad {mode} x\nsize h = x\ny[h] = x[h+r-1] k[r]\nL = sum[h](sin(y[h]))"
    for derived in (ef.grad(text, wrt="x"), ef.hessian(text, wrt="x"), ef.jvp(text, wrt="x", tangent="v"),
                    ef.hvp(text, wrt="x", tangent="v")):
        assert str(derived).startswith(f"pad {mode} x\n")
        assert parse(str(derived)) == derived.checked.ir
    printed = str(ef.grad(text, wrt="x"))
    assert printed.endswith("size p = x\ndL_dx[p] = delta[p, h + r - 1] dL_dy[h] k[r]")


# ---------------------------------------------------------------- export
@pytest.mark.parametrize("target", ("numpy", "torch", "jax"))
def test_exported_source_of_a_padded_conv_and_its_gradient_matches(target: str) -> None:
    if target == "jax":
        _jax()
    x, k = RNG.standard_normal((2, 5)), RNG.standard_normal((3, 2))
    text = "pad reflect x\nsize a, h = x\ny[a,h] = x[a, h+r-1] k[r,a]\nL = sum[a,h](y[a,h]^2)"
    for program in (ef.compile(text), ef.grad(text, wrt="x")):
        namespace: dict[str, object] = {}
        exec(program.to_source("padded", target=target), namespace)  # noqa: S102 - the code einflow wrote
        function = namespace["padded"]
        convert = torch.tensor if target == "torch" else np.asarray
        got = _numpy(function(x=convert(x), k=convert(k)))  # type: ignore[operator]
        np.testing.assert_allclose(got, program(x=x, k=k), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- the REPL session
def test_session_pad_declaration_folds_the_reads_of_later_statements() -> None:
    from einflow.shell.session import Session

    session, u = Session(), RNG.standard_normal(5)
    assert session.run_statements("pad reflect u") == "u: declared pad reflect"
    session.bind("u", u, "test")
    session.run_statements("size i = u")
    session.run_statements("L[i] = u[i-1] - 2 u[i] + u[i+1]")
    padded = np.pad(u, 1, mode="reflect")
    np.testing.assert_allclose(session.lookup("L"), padded[:-2] - 2 * u + padded[2:], rtol=1e-12)


# ---------------------------------------------------------------- torch: its own padding_mode in the convolution
@pytest.mark.parametrize("mode", ("circular", "reflect", "replicate"))
def test_padded_conv2d_on_torch_is_one_native_convolution_with_its_padding_mode(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import einflow.engine.convolution as convolution

    seen: list[object] = []
    native = convolution.convolve_torch

    def spy(*args: object) -> object:
        seen.append(args[2][-1])  # type: ignore[index]
        return native(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(convolution, "convolve_torch", spy)
    x, W = torch.randn(2, 3, 6, 5, dtype=torch.float64), torch.randn(4, 3, 3, 3, dtype=torch.float64)
    forward = CONV2D.format(mode=mode).replace("K", "W")  # (a program of its own: planned with the spy bound)
    np.testing.assert_allclose(ef.compile(forward)(x=x, W=W).numpy(),
                               _torch_conv(2, mode, W.numpy())(x).detach().numpy(), rtol=1e-12, atol=1e-12)
    assert seen == [mode]
    conv = _torch_conv(2, mode, W.numpy())
    (conv(x) ** 2).sum().backward()
    text = forward + "\nL = sum[n,o,h,w](y[n,o,h,w]^2)"
    np.testing.assert_allclose(ef.grad(text, wrt="W")(x=x, W=W).numpy(), conv.weight.grad.numpy(), rtol=1e-11)
    assert seen[-1] == mode  # the kernel's gradient: torch's weight gradient of the padded input


def test_reflect_padding_as_wide_as_the_axis_on_torch_leaves_torch_native_padding() -> None:
    """torch's reflect needs padding < the axis; wider reads are still numpy.pad's reflect (the window's einsum)."""
    x, K = RNG.standard_normal((1, 1, 2, 2)), RNG.standard_normal((1, 1, 5, 5))
    text = "pad reflect x\nsize n, c, h, w = x\ny[n,o,h,w] = x[n,c,h+r-2,w+s-2] K[o,c,r,s]"
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), mode="reflect")
    expected = np.einsum("nchrws,ocrs->nohw", np.lib.stride_tricks.sliding_window_view(
        padded, (5, 5), axis=(2, 3)).transpose(0, 1, 2, 4, 3, 5), K)
    got = ef.compile(text)(x=torch.tensor(x), K=torch.tensor(K)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_heat_equation_example_insulated_rod_keeps_its_heat(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "heat_equation.py"
    spec = importlib.util.spec_from_file_location("heat_equation_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()  # asserts against numpy.pad(mode="edge") and that the total heat is kept
    assert "insulated rod (pad replicate)" in capsys.readouterr().out


# ---------------------------------------------------------------- inside torch autograd and jax.grad
def test_padded_program_inside_torch_autograd_and_jax_grad_matches_numpy_pad() -> None:
    jax = _jax()
    s, k = RNG.standard_normal(6), RNG.standard_normal(3)
    program = ef.compile("pad reflect s\nsize h = s\ny[h] = s[h+r-1] k[r]\nL = sum[h](sin(y[h]))")

    def loss(values):  # type: ignore[no-untyped-def]
        padded = jax.numpy.pad(values, 1, mode="reflect")
        return jax.numpy.sum(jax.numpy.sin(jax.numpy.stack([padded[h:h + 3] @ k for h in range(6)])))

    expected = np.asarray(jax.grad(loss)(s))
    st = torch.tensor(s, requires_grad=True)
    program(s=st, k=torch.tensor(k)).backward()
    np.testing.assert_allclose(st.grad.numpy(), expected, rtol=1e-12, atol=1e-12)
    got = jax.grad(lambda values: program(s=values, k=jax.numpy.asarray(k)))(jax.numpy.asarray(s))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12)


def test_highlighter_marks_the_pad_declaration_and_its_mode() -> None:
    pytest.importorskip("pygments")
    from pygments.token import Keyword, Name, Whitespace

    from einflow.shell.highlight import EinflowLexer

    tokens = list(EinflowLexer().get_tokens("size i = u\npad reflect u, v\nL[i] = u[i-1] + v[i+1]\n"))
    assert [value for token, value in tokens if token in Keyword.Declaration] == ["size", "pad", "reflect"]
    after = [value for token, value in tokens if token not in Whitespace]
    assert after[after.index("reflect") + 1] == "u" and (Name.Variable, "u") in tokens
