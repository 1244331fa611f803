"""The ``einflow`` command line, run as a real subprocess: subcommands, output, exit statuses."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import einflow
from einflow.shell.cli import main

EINFLOW = Path(sys.executable).with_name("einflow")


def einflow_command(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(EINFLOW), *args], input=stdin if stdin is not None else "", capture_output=True,
                          text=True, timeout=60, cwd=cwd)


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    program = tmp_path / "model.ein"
    program.write_text("# a two-layer value\nh[i] = tanh(W[i,j] x[j])\nL = sum[i](h[i]^2)\nh, L\n")
    rng = np.random.default_rng(3)
    arrays = {"W": rng.standard_normal((3, 2)), "x": rng.standard_normal(2)}
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **arrays)
    return program, inputs, arrays


def test_run_prints_and_saves_the_values(model, tmp_path: Path) -> None:
    program, inputs, arrays = model
    out = tmp_path / "out.npz"
    done = einflow_command("run", str(program), "--inputs", str(inputs), "--out", str(out), "--backend", "numpy")
    assert done.returncode == 0, done.stderr
    h = np.tanh(arrays["W"] @ arrays["x"])
    assert done.stdout.startswith("h: (3,) float64\n") and "L: () float64" in done.stdout
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["h"], h)
        np.testing.assert_allclose(saved["L"], np.sum(h ** 2))
        assert sorted(saved.files) == ["L", "h"]


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """``einflow ARGS`` in this process (fast); the subprocess tests cover the installed command itself."""
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_run_user_errors_exit_1_with_the_message_on_stderr(model, tmp_path: Path, capsys) -> None:
    program, inputs, _ = model
    done = einflow_command("run", str(program))
    assert done.returncode == 1 and done.stdout == ""
    assert "'W', 'x'" in done.stderr and "--inputs" in done.stderr and "Traceback" not in done.stderr
    broken = tmp_path / "broken.ein"
    broken.write_text("y[i] = A[i,j] x[j\n")
    status, out, err = cli(capsys, "run", str(broken), "--inputs", str(inputs))
    assert status == 1 and "ParseError" in err and "^" in err
    script = tmp_path / "session.ein"
    script.write_text(":set x [1.0]\ny = 2 x[i]\n")
    status, out, err = cli(capsys, "run", str(script))
    assert status == 1 and "einflow < " in err
    status, out, err = cli(capsys, "run", str(tmp_path / "missing.ein"))
    assert status == 1 and "No such file" in err
    status, out, err = cli(capsys, "run", str(program), "--inputs", str(inputs), "--backend", "tpu")
    assert status == 1 and "valid options" in err


def test_dash_c_runs_session_lines(capsys) -> None:
    done = einflow_command("-c", ":set x [3.0, 4.0]\nn = sqrt(x[i] x[i])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("n: () float64\n5.0\n")
    status, out, err = cli(capsys, "-c", ":set x [3.0, 4.0]\nn = sqrt(x[i] x[i]\n:vars")
    assert status == 1 and err.startswith("-c:2:19: ParseError")
    assert "x     (2,)" in out  # later lines still ran


def test_piped_session_with_echo_reads_like_a_transcript() -> None:
    done = einflow_command("--echo", stdin="# tour\n:set x [1.0, 2.0]\ns = x[i] x[i]\n")
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["ein> # tour", "ein> :set x [1.0, 2.0]", "x: (2,) float64", "[1. 2.]",
                                        "ein> s = x[i] x[i]", "s: () float64", "5.0"]


def test_grad_prints_a_program_that_computes_the_gradient() -> None:
    done = einflow_command("grad", "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", "--wrt", "w")
    assert done.returncode == 0, done.stderr
    rng = np.random.default_rng(0)
    X, y, w = rng.standard_normal((5, 3)), np.sign(rng.standard_normal(5)), rng.standard_normal(3)
    gradient = einflow.evaluate(done.stdout, X=X, y=y, w=w)
    margin = y * (X @ w)
    expected = X.T @ (-y / (1 + np.exp(margin)))  # closed form of the logistic loss gradient
    np.testing.assert_allclose(gradient, expected, rtol=1e-10)


def test_grad_with_several_wrt_and_stdin_text(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("L = x[i] A[i,j] x[j]\n"))
    status, out, err = cli(capsys, "grad", "-", "--wrt", "x", "--wrt", "A")
    assert status == 0, err
    A, x = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.5, -1.0])
    dx, dA = einflow.evaluate(out, A=A, x=x)
    np.testing.assert_allclose(dx, (A + A.T) @ x)
    np.testing.assert_allclose(dA, np.outer(x, x))
    status, out, err = cli(capsys, "grad", "L = x[i] x[i]", "--wrt", "q")
    assert status == 1 and "q" in err and out == ""


def test_jacobian_and_hessian_print_programs(capsys) -> None:
    done = einflow_command("hessian", "f = x[i] x[i] x[j] x[j]", "--wrt", "x")
    assert done.returncode == 0, done.stderr
    x = np.array([1.0, 2.0])
    expected = 4 * np.dot(x, x) * np.eye(2) + 8 * np.outer(x, x)  # Hessian of |x|^4
    np.testing.assert_allclose(einflow.evaluate(done.stdout, x=x), expected)
    status, out, err = cli(capsys, "jacobian", "y[i] = A[i,j] x[j]", "--wrt", "x")
    assert status == 0, err
    A = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(einflow.evaluate(out, A=A, x=np.ones(3)), A)


def test_plan_reads_shapes_like_100x200(capsys) -> None:
    done = einflow_command("plan", "y[i] = A[i,j] B[j,k] v[k]", "--shape", "A=100x200", "--shape", "B=200x300",
                           "--shape", "v=300")
    assert done.returncode == 0, done.stderr
    assert "(100,)" in done.stdout and "total FLOPs" in done.stdout
    # A (B v) costs 2*(200*300 + 100*200) = 160K; the (A B) v order would cost over 12M
    assert "total FLOPs: 160K" in done.stdout
    status, out, err = cli(capsys, "plan", "y[i] = A[i,j] x[j]", "--shape", "A=100x200")
    assert status == 1 and "no shape given for tensor 'x'" in err


def test_usage_errors_exit_2(capsys) -> None:
    done = einflow_command("frobnicate")
    assert done.returncode == 2 and "invalid choice" in done.stderr
    for args in (["plan", "y = x[i]", "--shape", "x"], ["grad", "L = x[i] x[i]"], ["run"]):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"einflow {einflow.__version__}"


# ---------------------------------------------------------------- issue 17: one way to name a program everywhere


def test_a_file_given_alone_runs_as_a_program_or_as_a_session(model, tmp_path: Path) -> None:
    program, inputs, arrays = model
    done = einflow_command(str(program), "--inputs", str(inputs), "--of", "L")
    assert done.returncode == 0, done.stderr
    h = np.tanh(arrays["W"] @ arrays["x"])
    assert done.stdout.startswith("L: () float64\n")
    assert float(done.stdout.splitlines()[1]) == pytest.approx(np.sum(h ** 2), rel=1e-12)
    script = tmp_path / "tour.ein"
    script.write_text(":set x [3.0, 4.0]\nn = sqrt(x[i] x[i])\nbad = 2 3\n")
    done = einflow_command(str(script))
    assert done.returncode == 1 and "n: () float64\n5.0" in done.stdout
    assert done.stderr.startswith(f"{script}:3:9: ParseError")


def test_run_takes_text_and_stdin_like_grad_and_plan(tmp_path: Path) -> None:
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.array([3.0, 4.0]))
    done = einflow_command("run", "n = sqrt(x[i] x[i])", "--inputs", str(inputs))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "n: () float64\n5.0\n"
    done = einflow_command("run", "-", "--inputs", str(inputs), stdin="y[i] = 2 x[i]\n")
    assert done.returncode == 0 and done.stdout == "y: (2,) float64\n[6. 8.]\n"


def test_of_picks_one_value_of_a_program_that_returns_a_tuple(model, capsys) -> None:
    program, inputs, arrays = model
    status, out, err = cli(capsys, "grad", str(program), "--wrt", "W")
    assert status == 1 and "--of NAME" in err
    status, out, err = cli(capsys, "grad", str(program), "--of", "L", "--wrt", "W")
    assert status == 0, err
    W, x = arrays["W"], arrays["x"]
    h = np.tanh(W @ x)
    np.testing.assert_allclose(einflow.evaluate(out, W=W, x=x), np.outer(2 * h * (1 - h ** 2), x), rtol=1e-12)
    status, out, err = cli(capsys, "plan", str(program), "--of", "h", "--shape", "W=3x2", "--shape", "x=2")
    assert status == 0 and "L =" not in out and "(3,)" in out
    status, out, err = cli(capsys, "run", str(program), "--of", "nope", "--inputs", str(inputs))
    assert status == 1 and "no value 'nope'" in err and "h, L" in err


def test_jacobian_mode_forward_and_reverse_agree(capsys) -> None:
    text = "y[i] = tanh(A[i,j] x[j])"
    A, x = np.arange(6.0).reshape(2, 3) / 10, np.array([0.5, -1.0, 2.0])
    expected = (1 - np.tanh(A @ x) ** 2)[:, None] * A  # closed form
    for mode in ("forward", "reverse", "auto"):
        status, out, err = cli(capsys, "jacobian", text, "--wrt", "x", "--mode", mode)
        assert status == 0, err
        np.testing.assert_allclose(einflow.evaluate(out, A=A, x=x), expected, rtol=1e-12)
    with pytest.raises(SystemExit) as exit_info:
        main(["jacobian", text, "--wrt", "x", "--mode", "sideways"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("shape", ["A=10xq", "A=", "=10", "A=10x-2", "A10"])
def test_a_malformed_shape_is_a_usage_error(shape: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "y[i] = A[i,j] x[j]", "--shape", shape, "--shape", "x=10"])
    assert exit_info.value.code == 2
    assert "NAME=SHAPE" in capsys.readouterr().err


def test_plan_shapes_scalar_and_commas(capsys) -> None:
    status, out, err = cli(capsys, "plan", "y[i] = s A[i,j] x[j]", "--shape", "A=4,5", "--shape", "x=5",
                           "--shape", "s=scalar")
    assert status == 0, err
    assert "(4,)" in out
