"""The IPython extension, run in a real ``InteractiveShell``: ``%%einflow``, the derivation magics, plan HTML."""

from __future__ import annotations

import re

import numpy as np
import pytest
from transcripts import matches

import einflow

InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell
capture_output = pytest.importorskip("IPython.utils.capture").capture_output


@pytest.fixture
def shell():
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "einflow")
    yield shell
    InteractiveShell.clear_instance()


def run_cell(shell, text: str) -> tuple[object, list[dict[str, str]], str]:
    """Run a cell; return the result, the rich outputs it displayed (mime bundles), and what it printed."""
    with capture_output() as captured:
        result = shell.run_cell(text)
    return result, [output.data for output in captured.outputs], captured.stdout + captured.stderr


def central_difference(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for position in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[position] += h
        down[position] -= h
        grad[position] = (f(up) - f(down)) / (2 * h)
    return grad


def loss(W: np.ndarray, x: np.ndarray) -> float:
    return 0.5 * float(np.sum(np.tanh(W @ x) ** 2))


@pytest.fixture
def layer(shell):
    rng = np.random.default_rng(0)
    shell.user_ns.update(W=rng.standard_normal((3, 4)), x=rng.standard_normal(4))
    result, outputs, printed = run_cell(shell, "%%einflow\nh[j] = tanh(W[j,k] x[k])\nL = 0.5 sum[j](h[j]^2)\n")
    assert result.success, printed
    return shell, outputs


def test_cell_magic_binds_inputs_from_the_notebook_and_stores_results_by_name(layer) -> None:
    shell, outputs = layer
    W, x = shell.user_ns["W"], shell.user_ns["x"]
    np.testing.assert_allclose(shell.user_ns["h"], np.tanh(W @ x), rtol=1e-12)
    assert shell.user_ns["L"] == pytest.approx(loss(W, x), rel=1e-12)
    (bundle,) = outputs
    assert r"\tanh\left(\sum_{k} W_{jk} x_{k}\right)" in bundle["text/latex"]  # the program as LaTeX ...
    assert re.search(r"\\mathrm\{L\} &= [0-9.]+", bundle["text/latex"])  # ... with its values
    assert bundle["text/plain"].startswith("h[j] = tanh(W[j,k] x[k])\nL = 0.5 sum[j](h[j]^2)\nh: (3,) float64")


def test_later_cells_read_earlier_values_and_follow_the_notebook(layer) -> None:
    shell, _ = layer
    result, _, printed = run_cell(shell, "%%einflow --quiet\ns = 2 L\n")
    assert result.success, printed
    assert shell.user_ns["s"] == pytest.approx(2 * shell.user_ns["L"])
    shell.user_ns["x"] = np.ones(4)  # rebinding an input in Python: the next magic re-evaluates what uses it
    result, _, printed = run_cell(shell, "%einflow_grad L wrt W")
    assert result.success, printed
    assert shell.user_ns["L"] == pytest.approx(loss(shell.user_ns["W"], np.ones(4)), rel=1e-12)
    assert shell.user_ns["s"] == pytest.approx(2 * shell.user_ns["L"])


def test_grad_magic_shows_the_program_as_latex_and_text_and_stores_the_gradient(layer) -> None:
    shell, _ = layer
    result, outputs, printed = run_cell(shell, "%einflow_grad L wrt W")
    assert result.success, printed
    (bundle,) = outputs
    W, x = shell.user_ns["W"], shell.user_ns["x"]
    expected = central_difference(lambda w: loss(w, x), W)
    np.testing.assert_allclose(shell.user_ns["dL_dW"], expected, rtol=1e-6, atol=1e-9)
    program_text = bundle["text/plain"].split("\n", 1)[1].split("\ndL_dW: ")[0]
    assert "dL_dW[p,q] = " in program_text
    np.testing.assert_allclose(einflow.evaluate(program_text, W=W, x=x), expected, rtol=1e-6, atol=1e-9)
    assert r"\begin{aligned}" in bundle["text/latex"]
    assert program_text in bundle["text/markdown"] and "$$" in bundle["text/markdown"]  # LaTeX and text together


def test_hessian_and_jacobian_magics(shell) -> None:
    A = np.array([[2.0, 1.0], [0.0, 3.0]])
    shell.user_ns.update(A=A, v=np.array([0.5, -1.0]))
    assert run_cell(shell, "%%einflow -q\nf = v[i] A[i,j] v[j]\ny[i] = A[i,j] v[j]\n")[0].success
    result, outputs, printed = run_cell(shell, "%einflow_hessian f wrt v")
    assert result.success, printed
    np.testing.assert_allclose(shell.user_ns["d2f_dv2"], A + A.T)  # closed form
    result, outputs, printed = run_cell(shell, "%einflow_jacobian y wrt v")
    assert result.success, printed
    np.testing.assert_allclose(shell.user_ns["dy_dv"], A)


def test_plan_magic_and_the_plan_report_in_html(layer) -> None:
    shell, _ = layer
    result, outputs, printed = run_cell(shell, "%einflow_plan L")
    assert result.success, printed
    (bundle,) = outputs
    report = einflow.compile("h[j] = tanh(W[j,k] x[k])\nL = 0.5 sum[j](h[j]^2)").plan(W=(3, 4), x=(4,))
    assert bundle["text/plain"] == str(report)
    html = bundle["text/html"]
    assert html == report._repr_html_()
    assert html.count("<tr>") == 1 + len(report.steps) + len({step.statement for step in report.steps})
    assert f"total FLOPs: {report.flops:,}" in html and "<table>" in html


def test_errors_are_one_line_and_change_nothing(layer) -> None:
    shell, _ = layer
    before = dict(shell.user_ns)
    result, outputs, printed = run_cell(shell, "%%einflow\nz = 2 3\n")
    assert not result.success and outputs == []
    assert "ParseError: line 1, column 7" in printed and "Traceback" not in printed
    result, _, printed = run_cell(shell, "%%einflow\nq[i] = h[i] missing[i]\n")
    assert not result.success and "'missing' is not bound" in printed
    result, _, printed = run_cell(shell, "%einflow_grad nothing wrt W")
    assert not result.success and "not computed by an %%einflow cell" in printed
    result, _, printed = run_cell(shell, "%einflow_grad L wrt")
    assert not result.success and "usage: %einflow_grad L wrt X" in printed
    result, _, printed = run_cell(shell, "%%einflow --frobnicate\ns = 1\n")
    assert not result.success and "unknown option" in printed
    assert {name for name in shell.user_ns if not name.startswith("_")} == \
        {name for name in before if not name.startswith("_")}


# ---------------------------------------------------------------- docs/notebook.md is a real session

NOTEBOOK_PAGE = __import__("pathlib").Path(__file__).resolve().parent.parent / "docs" / "notebook.md"
IN = re.compile(r"^In \[(\d+)\]: ", re.M)


def documented_cells() -> list[tuple[int, str, str]]:
    """(number, cell source, output shown) for each ``In [n]:`` of docs/notebook.md, in order."""
    cells: list[tuple[int, str, list[str]]] = []
    for block in re.findall(r"^```ipython\n(.*?)^```", NOTEBOOK_PAGE.read_text(), re.S | re.M):
        for line in block.rstrip("\n").split("\n"):
            match = IN.match(line)
            if match:
                cells.append((int(match.group(1)), line[match.end():], []))
            elif re.match(r"^ +\.\.\.: ", line) and not cells[-1][2]:
                number, source, _ = cells[-1]
                cells[-1] = (number, source + "\n" + line.split("...: ", 1)[1], [])
            else:
                cells[-1][2].append(line)
    return [(number, source, "\n".join(output)) for number, source, output in cells]


def test_every_cell_of_docs_notebook_md_shows_what_the_page_says(shell) -> None:
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()  # a fresh shell: the page loads the extension itself
    cells = documented_cells()
    assert [number for number, _, _ in cells] == list(range(1, len(cells) + 1))
    latex = {int(number): text.strip() for number, text in
             re.findall(r"^```latex\n% In \[(\d+)\]\n(.*?)^```", NOTEBOOK_PAGE.read_text(), re.S | re.M)}
    assert latex
    for number, source, expected in cells:
        result, outputs, printed = run_cell(shell, source)
        got = printed + "".join(bundle["text/plain"] + "\n" for bundle in outputs)
        assert matches(expected, got), f"In [{number}]: {source}\nexpected:\n{expected}\ngot:\n{got}"
        if number in latex:
            assert outputs[0]["text/latex"] == latex[number]
