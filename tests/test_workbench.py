"""A workbench that keeps a session: save and load a live session, programs out of a session, hints in the
front end's words, close matches with positions, and the CLI's refusal of FIFOs, devices and invalid UTF-8.

Each test is named after the reproducer it guards (issue 28, "The workbench"). References: numpy on the
same arrays, closed-form derivatives.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import einflow as ef
from einflow.shell.files import SESSION_MEMBER, load_session_record
from einflow.shell.repl import check_history
from einflow.shell.session import Session

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, stdin: bytes | None = None, timeout: float = 60, cwd: Path = ROOT,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """``python -m einflow.shell.cli ARGS`` with this checkout's einflow."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "einflow.shell.cli", *args], input=stdin, capture_output=True,
                          timeout=timeout, cwd=cwd, env=environment)


def network(session: Session) -> None:
    for line in (":set W1 [[1.0, -2.0], [0.5, 3.0], [0.0, 1.0]]", ":set W2 [[1.0], [2.0]]", ":set x [1.0, 2.0, -1.0]",
                 "size j = W2", "H[h] = tanh(x[i] W1[i,h])", "Y[o] = H[h] W2[h,o]", "L = Y[o] Y[o]"):
        reply = session.execute(line)
        assert reply.ok, reply.text


def reference_loss(W1: np.ndarray, W2: np.ndarray, x: np.ndarray) -> float:
    Y = np.tanh(x @ W1) @ W2
    return float(Y @ Y)


# ---------------------------------------------------------------- :save, :reset, :load keeps the statements
def test_save_reset_load_restores_a_live_session(tmp_path: Path) -> None:
    session = Session()
    network(session)
    path = tmp_path / "s.npz"
    assert "and 3 statements" in session.execute(f":save {path}").text
    assert session.execute(":reset").ok and not session.values
    reply = session.execute(f":load {path}")
    assert reply.ok and "statements restored" in reply.text and "H, Y, L" in reply.text
    assert set(session.definitions) == {"H", "Y", "L"}
    W1 = np.array([[0.5, 1.0], [1.0, -1.0], [2.0, 0.0]])
    reply = session.execute(":set W1 [[0.5, 1.0], [1.0, -1.0], [2.0, 0.0]]")
    assert "re-evaluated: H, Y, L" in reply.text  # the statements came back alive
    np.testing.assert_allclose(session.values["L"], reference_loss(W1, session.values["W2"], session.values["x"]))
    assert session.sizes["j"].source == "W2"  # size declarations come back too


def test_load_chooses_the_saved_backend_again(tmp_path: Path) -> None:
    pytest.importorskip("dask")
    session = Session()
    network(session)
    assert session.execute(":backend dask").ok
    path = tmp_path / "s.npz"
    session.execute(f":save {path}")
    restored = Session()
    reply = restored.execute(f":load {path}")
    assert reply.ok and "backend: dask" in reply.text and restored.backend == "dask"
    assert restored.execute(":backend").text == "backend: dask"
    np.testing.assert_allclose(np.asarray(restored.values["L"]), np.asarray(session.values["L"]))
    # a backend this machine lacks is named, and the session stays on its own backend
    record = load_session_record(str(path))
    assert record is not None
    with np.load(path) as arrays:
        notes = Session().restore(dict(arrays), {**record, "backend": "no-such-backend"}, "test")
    assert any("saved backend 'no-such-backend' is not available here" in note for note in notes)


def test_a_session_npz_stays_a_plain_npz_of_arrays(tmp_path: Path) -> None:
    session = Session()
    network(session)
    path = tmp_path / "s.npz"
    session.execute(f":save {path}")
    with np.load(path) as saved:
        np.testing.assert_allclose(saved["L"], session.values["L"])
    record = load_session_record(str(path))
    assert record is not None and [entry["name"] for entry in record["statements"]] == ["H", "Y", "L"]
    # naming arrays loads only those arrays, as before
    fresh = Session()
    assert fresh.execute(f":load {path} W1 x").ok and not fresh.definitions and set(fresh.values) == {"W1", "x"}
    # a plain .npz (written by numpy) has no record and loads as arrays
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    assert load_session_record(str(tmp_path / "plain.npz")) is None
    assert Session().execute(f":load {tmp_path / 'plain.npz'}").ok


def test_a_stale_statement_is_saved_and_comes_back_stale(tmp_path: Path) -> None:
    session = Session()
    network(session)
    session.execute(":set x [1.0, 2.0]")  # H no longer evaluates: stale, and Y, L with it
    assert "H" in session.stale
    session.execute(f":save {tmp_path / 's.npz'}")
    restored = Session()
    reply = restored.execute(f":load {tmp_path / 's.npz'}")
    assert reply.ok and "stale: H" in reply.text and set(restored.stale) == {"H", "Y", "L"}
    assert "re-evaluated: H, Y, L" in restored.execute(":set x [1.0, 2.0, 3.0]").text


def test_a_damaged_session_record_is_a_session_error(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "s.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.npy", b"")
        archive.writestr(SESSION_MEMBER, b"{not json")
    reply = Session().execute(f":load {path}")
    assert not reply.ok and "SessionError" in reply.text and "not a session record" in reply.text


# ---------------------------------------------------------------- :save prog.ein, einflow prog.ein
def test_save_prog_ein_writes_a_program_that_einflow_runs(tmp_path: Path) -> None:
    session = Session()
    network(session)
    assert session.execute(f":save {tmp_path / 'prog.ein'}").text.startswith("saved 3 statements")
    assert session.execute(f":save {tmp_path / 'in.npz'} W1 W2 x").ok
    text = (tmp_path / "prog.ein").read_text()
    assert "H[h] = tanh(x[i] W1[i,h])\nY[o] = H[h] W2[h,o]\nL = Y[o] Y[o]" in text
    done = cli(str(tmp_path / "prog.ein"), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"))
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["L"], reference_loss(*(session.values[n] for n in ("W1", "W2", "x"))))
    # saving again replaces the file whole (atomic write), and an empty session has nothing to save
    session.execute("Z = 2 L")
    session.execute(f":save {tmp_path / 'prog.ein'}")
    assert (tmp_path / "prog.ein").read_text().rstrip().endswith("Z = 2 L")
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert "nothing to save" in Session().execute(f":save {tmp_path / 'empty.ein'}").text


def test_einflow_grad_with_inputs_evaluates(tmp_path: Path) -> None:
    X, y, w = np.array([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]]), np.array([1.0, -1.0, 1.0]), np.array([0.3, -0.2])
    np.savez(tmp_path / "in.npz", X=X, y=y, w=w)
    done = cli("grad", "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", "--wrt", "w",
               "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "g.npz"))
    assert done.returncode == 0, done.stderr
    assert b"dL_dw" in done.stdout
    margin = y * (X @ w)
    expected = -(X * (y / (1 + np.exp(margin)))[:, None]).sum(axis=0)  # closed form of the logistic gradient
    with np.load(tmp_path / "g.npz") as out:
        np.testing.assert_allclose(out["dL_dw"], expected, rtol=1e-12)
    missing = cli("grad", "L = sum[s](X[s,f] w[f])", "--wrt", "w", "--inputs", str(tmp_path / "plain.npz"))
    assert missing.returncode == 1 and b"FileNotFoundError" in missing.stderr


# ---------------------------------------------------------------- hints in the front end's words
def test_grad_of_a_non_scalar_in_the_repl_suggests_the_jacobian_command() -> None:
    session = Session()
    network(session)
    reply = session.execute(":grad H wrt W1")
    assert not reply.ok and "DerivativeError" in reply.text
    assert ":jacobian H wrt W1" in reply.text and "jacobian(...)" not in reply.text
    assert session.execute(":jacobian H wrt W1").ok  # the suggestion works


def test_hints_in_a_notebook_use_python_and_the_magics() -> None:
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "einflow")
        shell.user_ns.update(W1=np.ones((3, 2)), W2=np.ones((2, 1)), x=np.ones(3))
        with capture_output() as captured:
            shell.run_cell("%%einflow -q\nH[h] = tanh(x[i] W1[i,h])")
            shell.run_cell("%einflow_grad H wrt W1")
            shell.run_cell("%%einflow -q\nY[o] = H[h] W3[h,o]")
        text = captured.stdout + captured.stderr
        assert "%einflow_jacobian H wrt W1" in text and ":jacobian" not in text
        assert "did you mean 'W1'" in text and "assign it in Python" in text and ":set" not in text
    finally:
        InteractiveShell.clear_instance()


def test_an_unbound_name_gets_close_matches_and_its_position() -> None:
    session = Session()
    network(session)
    reply = session.execute("Z[o] = H[h] W3[h,o]")
    assert not reply.ok and "TensorNameError: 'W3' is not bound" in reply.text
    assert "did you mean 'W2' or 'W1'?" in reply.text
    assert "at line 1, column 13:\n    Z[o] = H[h] W3[h,o]\n                ^" in reply.text
    assert "did you mean" not in Session().execute("z = q").text  # nothing close: the plain hint


def test_an_unknown_reduction_is_a_parse_error_with_close_matches() -> None:
    with pytest.raises(ef.ParseError, match=r"unknown reduction 'softmaxx'; did you mean 'softmax'") as caught:
        ef.compile("y[i] = softmaxx[i](x[i])")
    assert (caught.value.line, caught.value.column) == (1, 8)
    with pytest.raises(ef.ParseError, match="unknown reduction 'summ'; did you mean 'sum'"):
        ef.compile("s = summ[i](x[i])")
    # with a space (or *) it is juxtaposition, as for calls
    x, A = np.array([1.0, 2.0]), np.array([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_allclose(ef.evaluate("y[i] = A[i,j] (x[j] + 1)", A=A, x=x), A @ (x + 1))
    np.testing.assert_allclose(ef.evaluate("y[i] = A[i,j] * (x[j] + 1)", A=A, x=x), A @ (x + 1))


def test_size_and_sum_as_names_say_reserved_word_alike() -> None:
    for text, word in (("size = 3", "size"), ("sum = 3", "sum"), ("  size[i] = x[i]", "size")):
        with pytest.raises(ef.ParseError, match=f"'{word}' is a reserved word and cannot be used as a tensor name") \
                as caught:
            ef.compile(text)
        assert caught.value.column == text.index(word) + 1


# ---------------------------------------------------------------- the CLI refuses FIFOs, devices, invalid UTF-8
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_cli_refuses_a_fifo_program_file_and_fifo_inputs(tmp_path: Path) -> None:
    fifo = tmp_path / "prog.ein"
    os.mkfifo(fifo)
    for args in ((str(fifo),), ("run", str(fifo)), ("grad", str(fifo), "--wrt", "x")):
        done = cli(*args, timeout=30)
        assert done.returncode == 1 and b"SessionError" in done.stderr and b"is a FIFO" in done.stderr, args
    inputs = tmp_path / "in.npz"
    os.mkfifo(inputs)
    done = cli("run", "y[i] = 2 x[i]", "--inputs", str(inputs), timeout=30)
    assert done.returncode == 1 and b"is a FIFO" in done.stderr


def test_cli_refuses_invalid_utf8_in_program_files_and_stdin(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ein"
    bad.write_bytes(b"y[i] = 2 x[i]\nz = \xff\n")
    for args, stdin in (((str(bad),), None), (("run", "-"), b"y = \xfe"), ((), b":set x [1.0]\ny = \xff x\n")):
        done = cli(*args, stdin=stdin)
        assert done.returncode == 1, args
        assert b"SessionError" in done.stderr and b"is not UTF-8 text: byte 0x" in done.stderr, done.stderr
        assert b"Traceback" not in done.stderr
    assert b"line 2, column 5" in cli(str(bad)).stderr


def test_a_history_file_that_is_a_device_or_fifo_is_refused(tmp_path: Path) -> None:
    from einflow.shell.replies import SessionError

    with pytest.raises(SessionError, match="is a device"):
        check_history("/dev/zero")
    bad = tmp_path / "history"
    bad.write_bytes(b"\n# 2026\n+\xff\n")
    with pytest.raises(SessionError, match="not UTF-8"):
        check_history(str(bad))
    check_history(str(tmp_path / "missing"))  # created on first use


@pytest.mark.parametrize("history", ["/dev/zero", "fifo"])
def test_einflow_history_dev_zero_prompts_and_quits(tmp_path: Path, history: str) -> None:
    """EINFLOW_HISTORY=/dev/zero (or a FIFO) once read forever before the first prompt; now it keeps no history."""
    pexpect = pytest.importorskip("pexpect")
    if history == "fifo":
        history = str(tmp_path / "fifo")
        os.mkfifo(history)
    env = dict(os.environ, TERM="dumb", HOME=str(tmp_path), EINFLOW_HISTORY=history, PYTHONPATH=str(ROOT),
               PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(sys.executable, ["-m", "einflow.shell.cli"], env=env, encoding="utf-8", timeout=30,
                          cwd=str(ROOT), dimensions=(40, 120))
    child.expect_exact("ein> ")
    assert "history is not kept" in child.before
    child.sendline(":quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
