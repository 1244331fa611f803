"""The einflow session: Session logic, commands, completion, the piped mode, and the REPL in a real terminal."""

from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from transcripts import fail, matches, run

import einflow
from einflow.shell.commands import COMMANDS
from einflow.shell.files import atomic_write
from einflow.shell.repl import EinflowCompleter, history_path
from einflow.shell.session import Session, format_value, logical_lines, needs_more, run_lines

EINFLOW = Path(sys.executable).with_name("einflow")




def central_difference(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f / d x by float64 central differences (f returns a scalar)."""
    grad = np.zeros_like(x, dtype=np.float64)
    for position in np.ndindex(x.shape):
        up, down = x.astype(np.float64).copy(), x.astype(np.float64).copy()
        up[position] += h
        down[position] -= h
        grad[position] = (f(up) - f(down)) / (2 * h)
    return grad


@pytest.fixture
def session() -> Session:
    return Session(width=100, seed=1)


# ---------------------------------------------------------------- statements and bindings


def test_statement_is_evaluated_bound_and_printed_with_a_header(session: Session) -> None:
    run(session, ":randn A 3 4")
    run(session, ":randn x 4")
    text = run(session, "y[i] = A[i,j] x[j]")
    expected = np.einsum("ij,j->i", session.values["A"], session.values["x"])
    np.testing.assert_allclose(session.values["y"], expected)
    assert text.splitlines()[0] == "y: (3,) float64"
    assert "y" in session.definitions and session.definitions["y"].text == "y[i] = A[i,j] x[j]"


def test_bare_expression_prints_without_binding_and_a_bare_name_prints_its_value(session: Session) -> None:
    run(session, ":set x [1.0, 2.0, 3.0]")
    text = run(session, "x[i] x[i]")
    assert text.splitlines() == ["() float64", "14.0"]
    assert set(session.values) == {"x"}
    assert run(session, "x").splitlines() == ["x: (3,) float64", "[1. 2. 3.]"]


def test_large_arrays_are_summarized(session: Session) -> None:
    run(session, ":zeros Z 100 100")
    text = run(session, "Z")
    assert "..." in text and len(text.splitlines()) < 12


def test_set_uses_literal_eval_never_eval(session: Session, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    message = fail(session, f":set x __import__('os').mkdir({str(marker)!r})")
    assert "literal" in message
    assert not marker.exists() and "x" not in session.values
    run(session, ":set M [[1, 2], [3, 4]]")
    assert session.values["M"].tolist() == [[1, 2], [3, 4]]
    assert "expected numbers" in fail(session, ":set s 'text'")
    assert "reserved" in fail(session, ":set exp 1.0")


def test_random_and_constant_arrays(session: Session) -> None:
    run(session, ":seed 7")
    run(session, ":randn a 2 3")
    np.testing.assert_array_equal(session.values["a"], np.random.default_rng(7).standard_normal((2, 3)))
    run(session, ":rand u 5")
    assert session.values["u"].shape == (5,) and np.all((session.values["u"] >= 0) & (session.values["u"] < 1))
    run(session, ":zeros z 2")
    run(session, ":ones o 2 2")
    assert session.values["z"].tolist() == [0.0, 0.0] and session.values["o"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert "whole numbers" in fail(session, ":zeros z 2.5")


def test_redefinition_re_evaluates_dependents_and_marks_stale_ones(session: Session) -> None:
    run(session, ":set x [1.0, 2.0]")
    run(session, "y[i] = 3 x[i]")
    run(session, "s = y[i] y[i]")
    text = run(session, ":set x [2.0, 0.0]")
    assert "re-evaluated: y, s" in text
    assert float(session.values["s"]) == pytest.approx(36.0)
    run(session, "y[i] = x[i] + 1")  # redefine y: its statement is replaced, s follows
    assert float(session.values["s"]) == pytest.approx(10.0)
    run(session, ":set A [[1.0, 0.0], [0.0, 1.0]]")
    run(session, "z[i] = A[i,j] x[j]")
    text = run(session, ":set x [1.0, 2.0, 3.0]")  # z can no longer be evaluated
    assert "stale: z (ShapeError" in text
    assert "z" not in session.values and "z" in session.stale
    assert "stale" in fail(session, "w = 2 z[i]")
    run(session, ":set A [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]")  # fixing the input brings z back
    np.testing.assert_allclose(session.values["z"], [1.0, 4.0])


def test_a_redefinition_that_would_make_a_cycle_is_refused(session: Session) -> None:
    run(session, ":set x [1.0]")
    run(session, "y[i] = 2 x[i]")
    run(session, "z[i] = y[i] + 1")
    message = fail(session, "y[i] = z[i]")
    assert "y -> z -> y" in message
    np.testing.assert_allclose(session.values["y"], [2.0])


def test_a_failed_line_changes_nothing(session: Session) -> None:
    run(session, ":set x [1.0, 2.0]")
    before = dict(session.values)
    message = fail(session, "a = 2 x[i]; b[i] = x[i] q[i]")  # the second statement fails: the line is undone
    assert "'q' is not bound" in message
    assert session.values.keys() == before.keys() and "a" not in session.definitions


def test_errors_show_the_caret_and_the_session_goes_on(session: Session) -> None:
    run(session, ":set x [1.0, 2.0]")
    message = fail(session, "y[i] = x[i")
    assert message.startswith("ParseError: line 1, column 11")
    lines = message.splitlines()
    assert lines[-2].strip() == "y[i] = x[i" and lines[-1].index("^") == lines[-2].index("x[i") + 3
    run(session, ":set A [[1.0, 2.0, 3.0]]")
    message = fail(session, "v[i] = A[i,j] x[j]")
    assert message.startswith("ShapeError") and "^" in message
    assert run(session, "s = x[i] x[i]").endswith("5.0")


def test_size_declarations_hold_for_the_session(session: Session) -> None:
    run(session, ":set x [1.0, 2.0, 3.0]")
    run(session, "size n = 3")
    run(session, "t[i] = x[i] + 0 delta[i,n]")
    np.testing.assert_allclose(session.values["t"], [1.0, 2.0, 3.0])
    assert "size n = 3" in run(session, ":vars")
    text = run(session, "size n = 4")  # now t's statement conflicts: it becomes stale
    assert "stale: t" in text


def test_needs_more_waits_only_for_an_unfinished_statement() -> None:
    assert needs_more("y[i] = sum[j](A[i,j]")
    assert needs_more("y[i] = A[i,\n")
    assert not needs_more("y[i = 2")
    assert not needs_more(":set x [1.0,")
    assert [text for _, text in logical_lines(["a = sum[i](", "  x[i])", "b = 2"])] == ["a = sum[i](\n  x[i])", "b = 2"]


# ---------------------------------------------------------------- derivatives through the session's history


def test_grad_through_history_matches_finite_differences(session: Session) -> None:
    run(session, ":randn W 3 4")
    run(session, ":randn x 4")
    run(session, "h[i] = tanh(W[i,j] x[j])")
    run(session, "L = sum[i](h[i]^2)")
    text = run(session, ":grad L wrt x, W")
    W, x = session.values["W"], session.values["x"]

    def loss(W: np.ndarray, x: np.ndarray) -> float:
        return float(np.sum(np.tanh(W @ x) ** 2))

    assert "dL_dx" in text and "dL_dW" in text and "# grad of L with respect to x, W" in text
    np.testing.assert_allclose(session.values["dL_dx"], central_difference(lambda v: loss(W, v), x), rtol=1e-6)
    np.testing.assert_allclose(session.values["dL_dW"], central_difference(lambda m: loss(m, x), W), rtol=1e-6)
    assert session.origins["dL_dx"] == ":grad L wrt x, W"


def test_grad_program_printed_is_the_one_that_was_evaluated(session: Session) -> None:
    run(session, ":set x [1.0, 2.0, 3.0]")
    run(session, "L = x[i] x[i]")
    text = run(session, ":grad L wrt x")
    program_text = text.split("\n\n")[0].split("\n", 1)[1]
    np.testing.assert_allclose(einflow.evaluate(program_text, x=session.values["x"]), [2.0, 4.0, 6.0])
    np.testing.assert_allclose(session.values["dL_dx"], [2.0, 4.0, 6.0])


def test_grad_with_respect_to_an_intermediate_holds_the_rest_fixed(session: Session) -> None:
    run(session, ":set x [0.5, -1.0]")
    run(session, "h[i] = sin(x[i])")
    run(session, "L = h[i] h[i] + x[i] x[i]")
    run(session, ":grad L wrt h")
    np.testing.assert_allclose(session.values["dL_dh"], 2 * np.sin([0.5, -1.0]))
    assert "does not depend on" in fail(session, ":grad h wrt L")


def test_hessian_and_jacobian(session: Session) -> None:
    run(session, ":set A [[2.0, 1.0], [0.0, 3.0]]")
    run(session, ":set x [1.0, -1.0]")
    run(session, "f = x[i] A[i,j] x[j]")
    run(session, ":hessian f wrt x")
    (name,) = [n for n in session.values if n.startswith("d2f")]
    A = session.values["A"]
    np.testing.assert_allclose(session.values[name], A + A.T)
    run(session, "y[i] = exp(x[i])")
    run(session, ":jacobian y wrt x")
    np.testing.assert_allclose(session.values["dy_dx"], np.diag(np.exp([1.0, -1.0])))


def test_history_program_recomputes_the_session_value(session: Session) -> None:
    run(session, ":randn A 3 3")
    run(session, ":randn b 3")
    run(session, "size p, q = A")
    run(session, "u[p] = A[p,q] b[q]")
    run(session, "v[i] = relu(u[i]) + b[i]")
    run(session, "r = sum[i](v[i] u[i])")
    text = session.program_for("r")
    assert text.splitlines()[0] == "size p, q = A"
    value = einflow.evaluate(text, A=session.values["A"], b=session.values["b"])
    A, b = session.values["A"], session.values["b"]
    u = A @ b
    np.testing.assert_allclose(value, np.sum((np.maximum(u, 0) + b) * u))
    assert "is data" in fail(session, ":grad A wrt b")


# ---------------------------------------------------------------- files


def test_save_and_load_round_trip(session: Session, tmp_path: Path) -> None:
    run(session, ":randn A 2 3")
    run(session, "s = A[i,j] A[i,j]")
    npz, npy = tmp_path / "all.npz", tmp_path / "A.npy"
    assert run(session, f":save {npz}") == f"saved A, s and 1 statement to {npz}"
    run(session, f":save A {npy}")
    with np.load(npz) as archive:
        np.testing.assert_array_equal(archive["A"], session.values["A"])
        assert archive["s"].shape == ()
    fresh = Session()
    run(fresh, f":load {npz}")
    run(fresh, f":load B {npy}")
    np.testing.assert_array_equal(fresh.values["B"], session.values["A"])
    np.testing.assert_array_equal(fresh.values["s"], session.values["s"])
    run(fresh, f":load {npy}")  # the file's stem names it
    assert "A" in fresh.values
    assert sorted(os.listdir(tmp_path)) == ["A.npy", "all.npz"]  # no temporary files left behind


def test_names_that_clash_with_numpy_keywords_save_fine(session: Session, tmp_path: Path) -> None:
    run(session, ":set file [1.0]")
    run(session, ":set allow_pickle [2.0]")
    run(session, f":save {tmp_path / 'k.npz'}")
    with np.load(tmp_path / "k.npz") as archive:
        assert archive["file"].tolist() == [1.0] and archive["allow_pickle"].tolist() == [2.0]


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "x.npy"
    np.save(target, np.arange(3))

    def broken(stream) -> None:
        stream.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(str(target), broken)
    np.testing.assert_array_equal(np.load(target), np.arange(3))
    assert os.listdir(tmp_path) == ["x.npy"]


def test_load_refuses_pickles_and_missing_files(session: Session, tmp_path: Path) -> None:
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert "allow_pickle" in fail(session, f":load o {tmp_path / 'obj.npy'}")
    assert "No such file" in fail(session, f":load {tmp_path / 'missing.npz'}")
    run(session, ":ones p 2")
    message = fail(session, f":save {tmp_path / 'no' / 'x.npz'}")
    assert f"cannot write {tmp_path / 'no' / 'x.npz'}" in message
    assert "o" not in session.values


# ---------------------------------------------------------------- other commands


def test_vars_lists_names_shapes_dtypes_and_origins(session: Session) -> None:
    assert "no tensors bound" in run(session, ":vars")
    run(session, ":zeros x 2 3")
    run(session, "y[i] = x[i,j]")
    lines = run(session, ":vars").splitlines()
    assert lines[0].split() == ["name", "shape", "dtype", "defined", "by"]
    assert lines[1].split() == ["x", "(2,", "3)", "float64", ":zeros", "2", "3"]
    assert lines[2].split()[:3] == ["y", "(2,)", "float64"] and lines[2].endswith("y[i] = x[i,j]")


def test_plan_of_a_name_and_of_a_statement(session: Session) -> None:
    run(session, ":zeros A 10 20")
    run(session, ":zeros B 20 30")
    run(session, "C[i,k] = A[i,j] B[j,k]")
    report = run(session, ":plan C")
    assert "C[i,k] = A[i,j] B[j,k]" in report and "total FLOPs" in report
    assert "(10, 30)" in report
    report = run(session, ":plan D[i,j] = A[i,k] A[j,k]")
    assert "(10, 10)" in report
    assert "not bound" in fail(session, ":plan q[i] = Q[i,j]")


def test_time_binds_nothing_and_reports_per_call(session: Session) -> None:
    run(session, ":randn x 50")
    text = run(session, ":time s = x[i] x[i]")
    assert re.match(r"first call .* then [\d.]+ (s|ms|µs|ns) per call \(best of 3 x \d+\)", text)
    assert "s" not in session.values


def test_backend_command(session: Session) -> None:
    assert "valid options" in fail(session, ":backend tpu")
    run(session, ":backend numpy")
    assert session.backend == "numpy"
    run(session, ":set x [1.0, 2.0]")
    assert run(session, "n = x[i] x[i]").endswith("5.0")
    assert run(session, ":backend") == "backend: numpy"


def test_latex_prints_the_programs_latex(session: Session) -> None:
    run(session, ":set x [1.0]")
    run(session, "n = x[i] x[i]")
    reply = session.execute(":latex n")
    assert reply.ok, reply.text
    assert reply.text == einflow.compile("n = x[i] x[i]").to_latex() and "\\sum" in reply.text


def test_reset_help_quit_and_unknown_commands(session: Session) -> None:
    run(session, ":set x [1.0]")
    run(session, "size n = x")
    run(session, ":reset")
    assert not session.values and not session.definitions and not session.sizes
    text = run(session, ":help")
    for name in ("set", "randn", "rand", "zeros", "ones", "load", "save", "vars", "grad", "jacobian", "hessian",
                 "plan", "latex", "backend", "time", "reset", "help", "quit"):
        assert f":{name}" in text
    assert run(session, ":help grad").startswith(":grad L wrt X")
    assert session.execute(":quit").quit and session.execute(":exit").quit
    assert "did you mean :grad?" in fail(session, ":gard L wrt x")


def test_format_value_header() -> None:
    assert format_value("v", np.arange(3, dtype=np.float32)).splitlines() == ["v: (3,) float32", "[0. 1. 2.]"]


# ---------------------------------------------------------------- completion and history


def completions(completer: EinflowCompleter, text: str) -> list[str]:
    """The words the completions would produce (the text they replace plus what they insert)."""
    found = completer.get_completions(Document(text, len(text)), CompleteEvent())
    return [(text[:len(text) + c.start_position] + c.text).split(" ")[-1] for c in found]


def test_completion_of_commands_names_functions_and_files(session: Session, tmp_path: Path) -> None:
    completer = EinflowCompleter(session)
    assert completions(completer, ":gr") == [":grad"]
    assert set(completions(completer, ":s")) == {":save", ":seed", ":set", ":style"}
    run(session, ":zeros weights 2")
    run(session, ":zeros width 2")
    assert set(completions(completer, "y[i] = w")) == {"weights", "width"}
    assert completions(completer, "y[i] = tan") == ["tanh"]
    assert "wrt" in completions(completer, ":grad L w")
    (tmp_path / "data.npz").write_bytes(b"")
    assert f"{tmp_path}/data.npz" in completions(completer, f":load {tmp_path}/da")
    assert set(completions(completer, ":backend da")) == {"dask"}
    assert set(COMMANDS) >= {c.lstrip(":") for c in completions(completer, ":")}


def test_history_path_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EINFLOW_HISTORY", str(tmp_path / "h"))
    assert history_path() == str(tmp_path / "h")
    monkeypatch.setenv("EINFLOW_HISTORY", "")
    assert history_path() is None
    monkeypatch.delenv("EINFLOW_HISTORY")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert history_path() == str(tmp_path / ".einflow_history")


# ---------------------------------------------------------------- piped mode


def test_run_lines_reports_failures_with_line_numbers(session: Session) -> None:
    import io

    out, err = io.StringIO(), io.StringIO()
    status = run_lines(session, [":set x [1.0, 2.0]\n", "bad = 2 3\n", "s = x[i] x[i]\n"], out, err)
    assert status == 1
    assert err.getvalue().startswith("<stdin>:2:9: ParseError: unexpected number")  # one position: file line, column
    assert "s: () float64\n5.0" in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert run_lines(session, ["# a comment", "s"], out, err, echo=True) == 0
    assert out.getvalue().startswith("ein> # a comment\nein> s\ns: () float64")


def test_piped_stdin_through_the_command(tmp_path: Path) -> None:
    script = ":set x [1.0, 2.0, 3.0]\nL = x[i] x[i]\n:grad L wrt x\n"
    done = subprocess.run([str(EINFLOW)], input=script, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "L: () float64\n14.0" in done.stdout and "dL_dx: (3,) float64\n[2. 4. 6.]" in done.stdout
    done = subprocess.run([str(EINFLOW)], input=script + "oops[\n:vars\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "<stdin>:4:6: ParseError" in done.stderr and "dL_dx" in done.stdout.split("name")[-1]


# ---------------------------------------------------------------- the REPL in a real pseudo-terminal

pexpect = pytest.importorskip("pexpect")


def spawn(tmp_path: Path, term: str = "dumb", **extra: str):
    env = dict(os.environ, TERM=term, HOME=str(tmp_path), EINFLOW_HISTORY=str(tmp_path / "history"),
               PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="120", LINES="40")
    env.pop("NO_COLOR", None)
    env.pop("EINFLOW_STYLE", None)
    env.update(extra)
    child = pexpect.spawn(str(EINFLOW), env=env, encoding="utf-8", timeout=15, dimensions=(40, 120),
                          cwd=str(tmp_path))
    return child


def ready(child, prompt: str = "ein> ") -> str:
    """Wait for the prompt and for prompt_toolkit to take the terminal (raw mode: echo off)."""
    child.expect_exact(prompt)
    child.waitnoecho(timeout=10)
    return child.before


def test_repl_binds_evaluates_differentiates_recovers_from_errors_and_quits(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    ready(child)
    child.sendline(":set x [1.0, 2.0, 3.0]")
    ready(child)
    child.sendline("L = x[i] x[i]")
    assert "L: () float64\r\n14.0" in ready(child)
    child.sendline("y[i] = 2 3 x[i]")
    text = ready(child)
    assert "ParseError: line 1, column 10" in text
    assert "    y[i] = 2 3 x[i]\r\n             ^" in text
    child.sendline(":grad L wrt x")  # the prompt works after the error
    text = ready(child)
    assert "dL_dx" in text and "dL_dx: (3,) float64\r\n[2. 4. 6.]" in text
    child.sendline(":quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    history = (tmp_path / "history").read_text()
    assert ":grad L wrt x" in history and "L = x[i] x[i]" in history


def test_repl_save_load_round_trip_and_ctrl_d(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    ready(child)
    child.sendline(":set A [[1.5, -2.0], [0.25, 4.0]]")
    ready(child)
    child.sendline(":save A saved.npy")
    assert "saved A to saved.npy" in ready(child)
    np.testing.assert_array_equal(np.load(tmp_path / "saved.npy"), [[1.5, -2.0], [0.25, 4.0]])
    child.sendline(":reset")
    ready(child)
    child.sendline(":load B saved.npy")
    ready(child)
    child.sendline("t = B[i,i]")
    assert "t: () float64\r\n5.5" in ready(child)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_repl_ctrl_c_cancels_the_line_and_tab_completes(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    ready(child)
    child.sendline(":zeros weights 2")
    ready(child)
    child.send("L = 1 / 0")
    child.sendintr()  # cancels the typed line: nothing is evaluated
    ready(child)
    child.sendline("s = sum[i](")  # an open bracket continues on the next line ...
    ready(child, "...> ")
    child.sendline("")  # ... and an empty line ends it, showing the error
    assert "ParseError: line 1, column 12: unexpected end of input" in ready(child)
    child.send("wei\t")
    child.expect_exact("s")  # the dumb terminal echoes the last character of the completed word
    child.send("\r")
    assert "weights: (2,) float64" in ready(child)
    child.sendline(":vars")
    assert "L " not in ready(child)
    child.sendline(":quit")
    child.expect(pexpect.EOF)


def test_repl_in_a_colour_terminal_highlights_and_completes(tmp_path: Path) -> None:
    child = spawn(tmp_path, term="xterm-256color")
    child.expect_exact("ein>")
    child.waitnoecho(timeout=10)
    child.send(":ones vector 3")
    child.expect(r"\x1b\[[0-9;]*m:ones")  # the command word is drawn in colour by the pygments lexer
    child.send("\r")
    child.expect_exact("vector: (3,) float64")
    child.expect_exact("ein>")
    child.waitnoecho(timeout=10)
    child.send("2 vec\t")
    deadline = time.monotonic() + 5
    child.expect_exact("tor")  # completion redraws the line with the full name
    assert time.monotonic() < deadline
    child.send("[i]\r")
    child.expect_exact("(3,) float64")
    child.expect_exact("[2. 2. 2.]")
    child.sendline(":quit")
    child.expect(pexpect.EOF)


# ---------------------------------------------------------------- issue 17: what tripped new users up

SGR = re.compile(r"\x1b\[([0-9;]*)m")


def colours_drawn(text: str) -> set[str]:
    """The foreground colours in SGR sequences: '3N'/'9N' (the terminal's palette) or '38;5;N'/'38;2;...'."""
    found: set[str] = set()
    for codes in SGR.findall(text):
        parts = codes.split(";")
        for position, part in enumerate(parts):
            if part == "38":
                found.add(";".join(parts[position:position + (3 if parts[position + 1] == "5" else 5)]))
                break
            if len(part) == 2 and part[0] in "39" and part[1] in "01234567":
                found.add(part)
    return found


def drain(child, quiet: float = 0.5) -> str:
    """Everything the terminal receives until it has been quiet for ``quiet`` seconds."""
    drawn = ""
    while True:
        try:
            drawn += child.read_nonblocking(100000, timeout=quiet)
        except pexpect.TIMEOUT:
            return drawn


def typed_in_colour(tmp_path: Path, text: str, **extra: str) -> str:
    """What the terminal draws while ``text`` is typed at a colour prompt (before it is run)."""
    child = spawn(tmp_path, term="xterm-256color", **extra)
    child.expect_exact("ein>")
    child.waitnoecho(timeout=10)
    child.send(text)
    drawn = drain(child)
    assert SGR.sub("", drawn).count(text[-4:]) >= 1  # the whole line was drawn
    child.send("\x03")  # Ctrl-C drops the line
    child.sendline(":quit")
    child.expect(pexpect.EOF)
    return drawn


def test_repl_default_colours_read_on_dark_and_light_and_a_style_can_be_chosen(tmp_path: Path) -> None:
    navy = "38;5;18"  # pygments' default style draws tensor names #19177C: this is it in 256 colours
    line = "y[i] = tanh(Weights[i,j]) x[j]"
    default = colours_drawn(typed_in_colour(tmp_path, line))
    assert default and all(not code.startswith("38") for code in default), default  # only the palette's colours
    assert "34" not in default  # and no dark blue
    pygments_default = colours_drawn(typed_in_colour(tmp_path, line, EINFLOW_STYLE="default"))
    assert any(code.startswith("38;5;") for code in pygments_default)
    assert navy in pygments_default or "38;5;17" in pygments_default
    assert colours_drawn(typed_in_colour(tmp_path, line, NO_COLOR="1")) == set()


def test_style_command_validates_and_the_prompt_redraws(tmp_path: Path, session: Session) -> None:
    assert "valid options are einflow, none" in fail(session, ":style neon")
    assert run(session, ":style monokai").startswith("style: monokai")
    child = spawn(tmp_path, term="xterm-256color")
    child.expect_exact("ein>")
    child.waitnoecho(timeout=10)
    child.send(":style monokai\r")
    child.expect_exact("style: monokai")
    child.expect_exact("ein>")
    child.waitnoecho(timeout=10)
    child.send("abc = 1")
    assert any(code.startswith("38;5;") for code in colours_drawn(drain(child)))
    child.send("\x03")
    child.sendline(":quit")
    child.expect(pexpect.EOF)


def test_repl_keeps_a_statement_over_several_lines_as_one_history_entry(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    ready(child)
    child.sendline(":set x [1.0, 2.0]")
    ready(child)
    child.sendline("s = sum[i](")
    ready(child, "...> ")
    child.sendline("  x[i] x[i])")
    assert "s: () float64\r\n5.0" in ready(child)
    child.sendline(":set x [3.0, 4.0]")
    ready(child)
    child.send("\x1b[A")  # Up: the :set line
    child.send("\x1b[A")  # Up again: the whole two-line statement, not only its last line
    child.send("\r")
    assert "s: () float64\r\n25.0" in ready(child)
    child.sendline(":quit")
    child.expect(pexpect.EOF)
    entries = [entry for entry in (tmp_path / "history").read_text().split("\n# ") if entry.strip()]
    statement = [entry for entry in entries if "sum[i](" in entry]
    assert statement and all("+s = sum[i](\n+  x[i] x[i])" in entry for entry in statement)
    assert not any(entry.strip().endswith("+  x[i] x[i])") and "sum" not in entry for entry in entries)


def test_repl_answers_python_and_ipython_habits_with_a_hint(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    ready(child)
    for typed, hint in [("help", ":help lists the commands"), ("?", ":help lists the commands"),
                        ("exit", "type :quit"), ("quit", "type :quit"), ("exit()", "type :quit"),
                        ("%timeit x[i] x[i]", ":time STATEMENT")]:
        child.sendline(typed)
        text = ready(child)
        assert hint in text and "ParseError" not in text and "not bound" not in text, (typed, text)
    child.sendline(":quit")
    child.expect(pexpect.EOF)
    session = Session()
    run(session, ":set help [1.0]")  # a tensor may still be called help
    assert run(session, "help").startswith("help: (1,)")


def test_repl_data_commands_go_through_the_memory_guard_and_memory_sets_it(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    ready(child)
    child.sendline(":zeros z 100000 100000")
    text = ready(child)
    assert "MemoryLimitError: :zeros z 100000 100000 needs 74.5 GiB" in text and ":memory" in text
    assert "internal error" not in text
    child.sendline(":memory 1MiB")
    assert "memory limit: 1 MiB" in ready(child)
    child.sendline(":zeros z 1000")  # 7.8 KiB: fine
    ready(child)
    child.sendline("o[i,j] = z[i] z[j]")  # 7.6 MiB: the plan's guard uses the session's limit
    text = ready(child)
    assert "MemoryLimitError" in text and "memory limit of 1" in text and ":memory" in text
    child.sendline(":memory none")
    assert "the guard is off" in ready(child)
    child.sendline("o[i,j] = z[i] z[j]")
    assert "o: (1000, 1000) float64" in ready(child)
    child.sendline(":quit")
    child.expect(pexpect.EOF)


def test_repl_messages_reuse_the_api_and_give_usage_lines(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    ready(child)
    child.sendline(":backend tensorflow")
    text = ready(child)
    assert "valid options are 'numpy', 'cupy', 'dask', 'torch', 'jax', 'auto'" in text and "pip install" in text
    assert "{" not in text
    child.sendline(":set y np.ones(3)")
    text = ready(child)
    assert "<ast." not in text and "no names or calls" in text and ":ones" in text
    child.sendline(":grad c wrt")
    assert "usage: :grad L wrt X" in ready(child)
    child.sendline(":quit")
    child.expect(pexpect.EOF)


def test_piped_errors_have_one_position_counted_in_the_file() -> None:
    script = ":set x [1.0, 2.0]\n:set A [[1.0, 2.0, 3.0]]\n\ny[i] = sum[j](A[i,j]\n  x[j])\n"
    done = subprocess.run([str(EINFLOW)], input=script, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    assert re.match(r"<stdin>:\d+:\d+: ShapeError: ", first), done.stderr
    assert "line 1" not in done.stderr and "at line" not in done.stderr
    done = subprocess.run([str(EINFLOW)], input="\n\nz = sum[i](\n  2 3)\n", capture_output=True, text=True,
                          timeout=60)
    assert done.stderr.startswith("<stdin>:4:5: ParseError: unexpected number '3'"), done.stderr


# ---------------------------------------------------------------- issue 18 item 9: files


def test_save_keeps_the_mode_of_the_file_it_replaces(session: Session, tmp_path: Path) -> None:
    target = tmp_path / "secret.npy"
    np.save(target, np.zeros(2))
    os.chmod(target, 0o600)
    run(session, ":set x [1.0, 2.0]")
    run(session, f":save x {target}")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    np.testing.assert_array_equal(np.load(target), [1.0, 2.0])


def test_save_writes_through_a_symlink(session: Session, tmp_path: Path) -> None:
    real = tmp_path / "data" / "real.npz"
    real.parent.mkdir()
    np.savez(real, old=np.zeros(1))
    link = tmp_path / "link.npz"
    link.symlink_to(real)
    run(session, ":set x [1.0, 2.0]")
    run(session, f":save {link} x")
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link stays a link ...
    with np.load(real) as saved:  # ... and the file it points to holds the new arrays
        assert saved.files == ["x"] and saved["x"].tolist() == [1.0, 2.0]
    assert sorted(os.listdir(real.parent)) == ["real.npz"]


def test_a_killed_save_leaves_a_temporary_the_next_save_removes_and_sigterm_none(session: Session,
                                                                                 tmp_path: Path) -> None:
    target = tmp_path / "big.npy"
    writer = (
        "import sys, time\n"
        "from einflow.shell.files import atomic_write\n"
        "def write(stream):\n"
        "    stream.write(b'x' * 4096); stream.flush(); print('writing', flush=True); time.sleep(60)\n"
        f"atomic_write({str(target)!r}, write)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    child.kill()  # SIGKILL: no clean-up can run
    child.wait(timeout=10)
    left = [name for name in os.listdir(tmp_path) if name.startswith(".big.npy")]
    assert len(left) == 1 and str(child.pid) in left[0]
    run(session, ":set x [1.0]")
    run(session, f":save x {target}")
    assert os.listdir(tmp_path) == ["big.npy"]
    child = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    child.terminate()  # SIGTERM: the save removes its own temporary on the way out
    assert child.wait(timeout=10) == 128 + 15
    assert os.listdir(tmp_path) == ["big.npy"]
    np.testing.assert_array_equal(np.load(target), [1.0])  # the old file is untouched


def npy_header(shape: tuple[int, ...]) -> bytes:
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return stream.getvalue()


def test_load_checks_the_declared_size_before_reading(session: Session, tmp_path: Path) -> None:
    liar = tmp_path / "liar.npy"
    liar.write_bytes(npy_header((100000, 100000)) + b"\0" * 64)  # declares 74.5 GiB, holds 64 bytes
    text = fail(session, f":load x {liar}")
    assert "declares an array of shape (100000, 100000)" in text and "internal error" not in text
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("z.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, np.zeros(8 << 20))  # 64 MiB that compress to ~64 KiB
    assert bomb.stat().st_size < 1 << 20
    run(session, ":memory 16MiB")
    text = fail(session, f":load {bomb}")
    assert "MemoryLimitError" in text and "64 MiB" in text and "nothing was read" in text
    run(session, ":memory default")
    assert run(session, f":load {bomb}").startswith("z: (8388608,) float64")


def test_load_refuses_a_fifo_without_blocking(session: Session, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    replies: list[str] = []
    worker = threading.Thread(target=lambda: replies.append(fail(session, f":load x {fifo}")), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), ":load blocked on a FIFO"
    assert "is a FIFO" in replies[0]


# ---------------------------------------------------------------- the docs' transcripts are real

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)


def transcripts(path: Path, start: str) -> list[str]:
    """Fenced blocks of ``path`` whose first line starts with ``start`` (``ein> `` or ``$ einflow``)."""
    return [block for block in FENCE.findall(path.read_text()) if block.startswith(start)]


def session_steps(block: str) -> list[tuple[str, str]]:
    """(input, the output shown after it) for each ``ein>`` prompt of a transcript."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.rstrip("\n").split("\n"):
        if line.startswith("ein> "):
            steps.append((line[5:], []))
        elif line.startswith("...> ") and steps and not steps[-1][1]:
            steps[-1] = (steps[-1][0] + "\n" + line[5:], [])
        else:
            steps[-1][1].append(line)
    return [(text, "\n".join(output)) for text, output in steps if text.strip()]


@pytest.mark.parametrize("page", ["docs/repl.md", "README.md"])
def test_every_session_transcript_in_the_docs_is_what_the_session_prints(page: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = transcripts(ROOT / page, "ein> ")
    assert blocks, f"{page} has no ein> transcript"
    for block in blocks:
        session = Session(width=80)
        for text, expected in session_steps(block):
            reply = session.execute(text)
            assert matches(expected, reply.text), f"{page}: ein> {text}\nexpected:\n{expected}\ngot:\n{reply.text}"


def shell_steps(block: str) -> list[tuple[str, str]]:
    """(command, its output) for each ``$ `` line of a console block (a quoted argument may span lines)."""
    import shlex

    steps: list[tuple[str, list[str]]] = []
    pending: str | None = None
    for line in block.rstrip("\n").split("\n"):
        if pending is not None:
            pending += "\n" + line
        elif line.startswith("$ "):
            pending = line[2:]
        else:
            steps[-1][1].append(line)
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        steps.append((pending, []))
        pending = None
    return [(command, "\n".join(output)) for command, output in steps]


def test_every_command_line_transcript_in_docs_repl_md_is_what_the_command_prints() -> None:
    from einflow.shell.repl import BANNER

    blocks = transcripts(ROOT / "docs/repl.md", "$ einflow")
    assert len(blocks) >= 3
    env = dict(os.environ, PATH=f"{EINFLOW.parent}{os.pathsep}{os.environ['PATH']}", COLUMNS="80")
    env.pop("NO_COLOR", None)
    for block in blocks:
        for command, expected in shell_steps(block):
            if command == "einflow":  # the interactive start: checked against the REPL in a terminal below
                assert expected.split("\n")[0] == BANNER
                continue
            done = subprocess.run(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=120, cwd=ROOT, env=env)
            got = done.stdout  # standard error merged in, in order
            assert matches(expected, got), f"$ {command}\nexpected:\n{expected}\ngot:\n{got}"


def test_the_repl_starts_with_the_banner_the_docs_show_and_a_private_history(tmp_path: Path) -> None:
    from einflow.shell.repl import BANNER

    child = spawn(tmp_path)
    assert BANNER in ready(child)
    child.sendline(":quit")
    child.expect(pexpect.EOF)
    assert stat.S_IMODE(os.stat(tmp_path / "history").st_mode) == 0o600  # created readable by its owner only


def test_every_command_is_documented_in_docs_repl_md() -> None:
    from einflow.shell.commands import unique_commands

    page = (ROOT / "docs/repl.md").read_text()
    missing = [command.name for command in unique_commands() if f"`:{command.name}" not in page]
    assert not missing, f"docs/repl.md does not describe :{', :'.join(missing)}"
