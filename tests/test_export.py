"""Tests for einflow.export: standalone Python source (run without einflow), LaTeX, DOT."""

from __future__ import annotations

import ast
import doctest
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import einflow
from einflow.export import latex as latex_module
from einflow.export import python as python_module
from einflow.export import to_dot, to_latex, to_source
from einflow.lang.errors import EinflowError

# ---------------------------------------------------------------- corpus

Inputs = dict[str, Any]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _matrices(seed: int, **shapes: tuple[int, ...]) -> Inputs:
    rng = _rng(seed)
    return {name: rng.standard_normal(shape) for name, shape in shapes.items()}


def _positive(seed: int, **shapes: tuple[int, ...]) -> Inputs:
    rng = _rng(seed)
    return {name: rng.uniform(0.5, 2.0, shape) for name, shape in shapes.items()}


def _with_zeros(seed: int, n: int = 9) -> Inputs:
    x = _rng(seed).standard_normal(n)
    x[::3] = 0.0
    return {"x": x}


# (id, program text, inputs). Each construct of the language appears at least once.
CORPUS: list[tuple[str, str, Callable[[], Inputs]]] = [
    ("matmul", "C[i,j] = A[i,k] B[k,j]", lambda: _matrices(1, A=(3, 4), B=(4, 5))),
    ("trace", "t = A[i,i]", lambda: _matrices(2, A=(4, 4))),
    ("diagonal-bound", "d[i] = A[i,i]", lambda: _matrices(3, A=(4, 4))),
    ("explicit-bound", "y[i] = A[i,j] x[i]", lambda: _matrices(4, A=(3, 5), x=(3,))),
    ("explicit-per-term", "y[i] = A[i,j] + c[i]", lambda: _matrices(5, A=(3, 5), c=(3,))),
    ("transpose-and-align", "S[i,j] = A[i,j] + B[j,i] + b[j]\nU[j,i] = S[i,j]",
     lambda: _matrices(6, A=(3, 4), B=(4, 3), b=(4,))),
    ("implicit-broadcast", "T = X[b,f] + c[f] + 1", lambda: _matrices(7, X=(5, 3), c=(3,))),
    ("logistic-loss", "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))",
     lambda: {**_matrices(8, X=(6, 3), w=(3,)), "y": np.sign(_rng(9).standard_normal(6))}),
    ("layer", "H[batch,hidden] = tanh(X[batch,feat] W[feat,hidden] + c[hidden])",
     lambda: _matrices(10, X=(4, 3), W=(3, 5), c=(5,))),
    ("functions", "v[i] = sigmoid(x[i]) + relu(x[i]) + step(x[i]) + sign(x[i]) + abs(x[i]) + sin(x[i]) cos(x[i])",
     lambda: _with_zeros(11)),
    ("positive-functions", "v[i] = sqrt(x[i]) + log(x[i]) + log1p(x[i]) + exp(-x[i])", lambda: _positive(12, x=(5,))),
    ("powers", "q[i] = x[i]^3 + x[i]^-2 + x[i]^0.5 + abs(x[i])^1.5 + x[i]^(-0.5) + x[i]^2 + x[i]^1",
     lambda: _positive(13, x=(5,))),
    ("int-powers", "r[i] = k[i]^-1 + k[i]^2 + k[i]^-2 + k[i]^0.5 + k[i]^1.5 + k[i]^3",
     lambda: {"k": np.arange(1, 6)}),
    ("int-weak-literal", "y[i] = 6 * k[i] + 2", lambda: {"k": np.arange(5)}),
    ("float32-weak", "y[i] = 0.5 * x[i] + x[i] x[j] z[j] / 3",
     lambda: {name: value.astype(np.float32) for name, value in _matrices(14, x=(4,), z=(4,)).items()}),
    ("python-scalar-input", "y[i] = a x[i]\nz = a * 2 + b", lambda: {**_matrices(15, x=(3,)), "a": 2.5, "b": 3}),
    ("zero-d-array-input", "y[i] = s x[i] + s", lambda: {"x": _matrices(16, x=(3,))["x"], "s": np.float64(1.5)}),
    ("normalize", "n = sqrt(x[i] x[i])\nu[i] = x[i] / n", lambda: _matrices(17, x=(5,))),
    ("divisor-scope", "u[i] = x[i] / (y[j] y[j])", lambda: _matrices(18, x=(4,), y=(3,))),
    ("nested-dummies", "c = x[j] x[j] + y[j] y[j]", lambda: _matrices(19, x=(4,), y=(4,))),
    ("reduce-sum-body", "r[i] = sum[j](A[i,j] + B[i,j] + 1)\nm = sum[i,j](A[i,j]^2)\nr, m",
     lambda: _matrices(20, A=(3, 4), B=(3, 4))),
    ("chain", "E = a[i] B[i,j] C[j,k] d[k]", lambda: _matrices(21, a=(5,), B=(5, 6), C=(6, 7), d=(7,))),
    ("delta-substituted", "y[i] = A[i,k] delta[k,j] v[j]", lambda: _matrices(22, A=(3, 4), v=(4,))),
    ("delta-surviving", "M[i,j] = delta[i,j] x[j]", lambda: _matrices(23, x=(4,))),
    ("delta-jacobian", "J[i,j] = delta[i,j] step(x[j]) + 0 * x[i]", lambda: _with_zeros(24, 6)),
    ("delta-trace-size", "size i = x\nt = delta[i,i]", lambda: _matrices(25, x=(7,))),
    ("hessian-like", "size p = x; size q = x\nH[p,q] = 2 delta[p,q] + x[p] x[q]", lambda: _matrices(26, x=(4,))),
    ("literal-size-delta", "size a = 3\nI[a,b] = delta[a,b] + 0 * delta[a,c] delta[c,b]", lambda: {}),
    ("four-index-delta", "size p, q = X\nD[a,b,p,q] = delta[a,p] delta[b,q] X[a,b]", lambda: _matrices(27, X=(2, 3))),
    ("constants", "a = 2\nb[i] = exp(a) x[i] + 2^3 - sqrt(4) + sigmoid(0) + log(1)\nc = 3 / 2\nb, c",
     lambda: _matrices(28, x=(3,))),
    ("constant-only", "c = 2 * 3 + 1", lambda: {}),
    ("cse", "z[i] = exp(x[i]) + exp(x[i])\nw = exp(x[i]) y[i]", lambda: _matrices(29, x=(4,), y=(4,))),
    ("one-tuple", "y[i] = A[i,j] x[j]\ny,", lambda: _matrices(30, A=(3, 2), x=(2,))),
    ("bare-expression", "x[i] y[i]", lambda: _matrices(31, x=(4,), y=(4,))),
    ("negative-scaling", "y[i,j] = -A[i,j] - 2 B[j,i] * -1.5", lambda: _matrices(32, A=(2, 3), B=(3, 2))),
    # cases that previously failed (this list only grows)
    ("implicit-delta-order", "size i = x\nM = delta[i,j] y[k]\nN = y[k] delta[i,j]\nM, N",
     lambda: _matrices(34, x=(3,), y=(2,))),
    ("delta-summed-to-ones", "v[l] = sum[j](delta[j,l]) + 0 * x[l]", lambda: _matrices(35, x=(3,))),
    # the generator once kept its own copy of delta elimination, which lost the size a summed delta counts
    ("delta-summed-to-size", "size j, l = M\nc = sum[j,l](delta[j,l]) + M[i,i]", lambda: _matrices(36, M=(3, 3))),
    ("python-scalar-in-sum", "y[i] = x[i] + s", lambda: {"x": _matrices(36, x=(3,))["x"], "s": 2.5}),
    ("hostile-names",
     "f[i,j] = np[i,k] contract[k,j] + einsum[i,j] + oe[i,j] + _np[i,j] + _oe[i,j] + _input[i,j] + _t1[i,j]\n"
     "lambda[i,j] = f[i,j] * float[i] + bool[j] + None[i,j]\n"
     "sum_ = lambda[i,j] delta[i,j] len[j]\nsum_, f",
     lambda: _matrices(33, np=(3, 2), contract=(2, 3), einsum=(3, 3), oe=(3, 3), _np=(3, 3), _oe=(3, 3),
                       _input=(3, 3), _t1=(3, 3), float=(3,), bool=(3,), **{"None": (3, 3)}, len=(3,))),
]


def _derivative_cases() -> list[tuple[str, Callable[[], Any], Callable[[], Inputs]]]:
    """(id, program factory, inputs) for derivative programs built by einflow.grad & co."""
    loss = "L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))"
    labels = lambda: {**_matrices(40, X=(6, 3), w=(3,)), "y": np.sign(_rng(41).standard_normal(6))}  # noqa: E731
    net = "H[b,h] = tanh(X[b,f] W[f,h])\nP[b] = H[b,h] v[h]\nL = sum[b]((P[b] - t[b])^2)"
    net_inputs = lambda: _matrices(42, X=(5, 3), W=(3, 4), v=(4,), t=(5,))  # noqa: E731
    cp = "L = sum[i,j,k]((A[i,r] B[j,r] C[k,r] - T[i,j,k])^2)"
    attention = "E[q,k] = exp(Q[q,d] K[k,d] * scale)\nA[q,k] = E[q,k] / sum[j](E[q,j])\nL = A[q,k] V[k,e] G[q,e]"
    return [
        ("grad-logistic", lambda: einflow.grad(loss, wrt="w"), labels),
        ("hessian-logistic", lambda: einflow.hessian(loss, wrt="w"), labels),
        ("hessian-norm", lambda: einflow.hessian("f = x[i] x[i]", wrt="x"), lambda: _matrices(43, x=(4,))),
        ("grad-net-multi", lambda: einflow.grad(net, wrt=["W", "v"]), net_inputs),
        ("value-and-grad-net", lambda: einflow.value_and_grad(net, wrt="W"), net_inputs),
        ("value-and-grad-multi", lambda: einflow.value_and_grad(net, wrt=["W", "v", "t"]), net_inputs),
        ("value-and-grad-cp", lambda: einflow.value_and_grad(cp, wrt=["A", "B", "C"]),
         lambda: _matrices(46, A=(3, 2), B=(4, 2), C=(5, 2), T=(3, 4, 5))),
        ("grad-softmax-attention", lambda: einflow.grad(attention, wrt=["Q", "K", "V"]),
         lambda: {**_matrices(47, Q=(3, 2), K=(4, 2), V=(4, 3), G=(3, 3)), "scale": 0.7}),
        ("jacobian-matrix", lambda: einflow.jacobian("y[i] = tanh(A[i,j] x[j])", wrt="A"),
         lambda: _matrices(48, A=(3, 4), x=(4,))),
        ("hessian-mixed", lambda: einflow.hessian("f = sum[i](log(1 + exp(x[i])) x[i]^2) + x[i] A[i,j] x[j]",
                                                  wrt="x"), lambda: _matrices(49, A=(4, 4), x=(4,))),
        ("vjp-sigmoid", lambda: einflow.vjp("y[i] = sigmoid(A[i,j] x[j])", wrt="x", cotangent="G"),
         lambda: _matrices(50, A=(3, 4), x=(4,), G=(3,))),
        ("jacobian-elementwise-matrix", lambda: einflow.jacobian("Y[i,j] = relu(X[i,j])", wrt="X"),
         lambda: _matrices(51, X=(3, 4))),
        ("jacobian-relu", lambda: einflow.jacobian("y[i] = relu(x[i])", wrt="x"), lambda: _with_zeros(44, 6)),
        ("grad-abs-sigmoid", lambda: einflow.grad("f = sum[i](abs(x[i]) sigmoid(x[i]))", wrt="x"),
         lambda: _with_zeros(45, 6)),
    ]


HAS_GRAD = hasattr(einflow, "grad")

# ---------------------------------------------------------------- running exported code without einflow

DRIVER = textwrap.dedent('''
    import importlib.util, json, sys
    from pathlib import Path
    sys.modules["einflow"] = None  # any attempt to import einflow now fails
    try:
        import einflow  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("einflow is importable in the driver")
    import numpy as np
    here = Path.cwd()
    cases = json.loads((here / "cases.json").read_text())
    report = {}
    for case in cases:
        spec = importlib.util.spec_from_file_location("exported_" + case["key"], here / case["module"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        arrays = dict(np.load(here / case["arrays"])) if case["arrays"] else {}
        arrays.update(case["scalars"])
        try:
            result = getattr(module, case["function"])(**arrays)
        except Exception as error:  # reported, and the test fails with it
            report[case["key"]] = {"error": f"{type(error).__name__}: {error}"}
            continue
        values = []
        def flatten(value):  # the nesting as text, the leaves in order
            if isinstance(value, tuple):
                return "(" + ",".join(flatten(item) for item in value) + ")"
            values.append(value)
            return "*"
        structure = flatten(result)
        np.savez(here / (case["key"] + "_out.npz"), *[np.asarray(v) for v in values])
        report[case["key"]] = {"structure": structure, "types": [type(v).__name__ for v in values]}
    (here / "report.json").write_text(json.dumps(report))
    print("einflow" in sys.modules and sys.modules["einflow"] is not None)
''')


def _split_inputs(inputs: Inputs) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays = {k: v for k, v in inputs.items() if not isinstance(v, (int, float)) or isinstance(v, np.generic)}
    scalars = {k: v for k, v in inputs.items() if k not in arrays}
    return arrays, scalars


def _all_cases() -> list[tuple[str, Any, Inputs]]:
    cases = [(key, einflow.compile(text), make()) for key, text, make in CORPUS]
    if HAS_GRAD:
        cases += [(key, factory(), make()) for key, factory, make in _derivative_cases()]
    return cases


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Export every case, run them all in one isolated interpreter, return per-case results."""
    folder = tmp_path_factory.mktemp("exported")
    manifest = []
    expected: dict[str, Any] = {}
    for number, (key, program, inputs) in enumerate(_all_cases()):
        function = "f" if number % 2 or key == "hostile-names" else f"case_{number}"
        module = f"case_{number}.py"
        (folder / module).write_text(to_source(program, function), encoding="utf-8")
        arrays, scalars = _split_inputs(inputs)
        arrays_file = f"case_{number}_in.npz" if arrays else ""
        if arrays:
            np.savez(folder / arrays_file, **arrays)
        manifest.append({"key": key, "module": module, "function": function, "arrays": arrays_file,
                         "scalars": scalars})
        expected[key] = (program, inputs, number)
    (folder / "cases.json").write_text(json.dumps(manifest))
    (folder / "driver.py").write_text(DRIVER)
    completed = subprocess.run([sys.executable, "-I", "driver.py"], cwd=folder, capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "False"
    report = json.loads((folder / "report.json").read_text())
    return {"folder": folder, "report": report, "expected": expected}


def _check_same(key: str, exported: dict[str, Any]) -> None:
    program, inputs, _ = exported["expected"][key]
    outcome = exported["report"][key]
    assert "error" not in outcome, outcome.get("error")
    reference = program(**inputs)
    reference_values: list[Any] = []

    def flatten(value: Any) -> str:
        if isinstance(value, tuple):
            return "(" + ",".join(flatten(item) for item in value) + ")"
        reference_values.append(value)
        return "*"

    assert outcome["structure"] == flatten(reference)
    # einflow and the exported source both give a numpy scalar for a scalar value
    assert len(outcome["types"]) == len(reference_values)
    for name, want in zip(outcome["types"], reference_values):
        assert name == type(want).__name__
    with np.load(exported["folder"] / f"{key}_out.npz") as saved:
        values = [saved[f"arr_{n}"] for n in range(len(saved.files))]
    assert len(values) == len(reference_values)
    for got, want in zip(values, reference_values):
        want = np.asarray(want)
        assert got.shape == want.shape
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("key", [case[0] for case in CORPUS])
def test_exported_source_matches_einflow_without_einflow(key: str, exported: dict[str, Any]) -> None:
    _check_same(key, exported)


@pytest.mark.skipif(not HAS_GRAD, reason="einflow.grad/hessian are not available yet (issue #2)")
@pytest.mark.parametrize("key", [case[0] for case in _derivative_cases()])
def test_exported_derivative_programs_match(key: str, exported: dict[str, Any]) -> None:
    _check_same(key, exported)


def test_generated_source_imports_only_numpy_and_opt_einsum() -> None:
    for key, text, _ in CORPUS:
        tree = ast.parse(to_source(einflow.compile(text)))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
        assert imported == {"numpy", "opt_einsum"}, key


def test_signature_is_keyword_only_and_named_after_inputs() -> None:
    program = einflow.compile("size n = v\nC[i,j] = A[i,k] B[k,j] + 0 * delta[i,n] v[n]")
    tree = ast.parse(to_source(program, "matmul"))
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "matmul")
    assert [arg.arg for arg in function.args.kwonlyargs] == list(program.inputs)
    assert function.args.args == [] and function.args.vararg is None


def test_python_keyword_inputs_are_passed_by_mapping() -> None:
    program = einflow.compile("y[i] = lambda[i] in[i]")
    namespace: dict[str, Any] = {}
    exec(to_source(program), namespace)
    a, b = np.arange(3.0), np.arange(3.0) + 1
    np.testing.assert_array_equal(namespace["f"](**{"lambda": a, "in": b}), a * b)
    with pytest.raises(TypeError, match="unexpected"):
        namespace["f"](**{"lambda": a, "in": b, "other": a})


def test_every_statement_is_commented_and_each_contraction_is_one_line() -> None:
    text = "H[b,h] = tanh(X[b,f] W[f,h])\nP[b] = H[b,h] v[h]\nL = sum[b]((P[b] - t[b])^2)"
    source = to_source(einflow.compile(text))
    for statement in text.splitlines():
        assert f"# {statement}" in source
    contraction_lines = [line for line in source.splitlines() if "_oe.contract(" in line]
    assert len(contraction_lines) == 2
    assert all("  # [" in line for line in contraction_lines)


def test_function_name_must_be_an_identifier() -> None:
    for bad in ("", "1f", "lambda", "my-func", "sum"):
        with pytest.raises(EinflowError):
            to_source(einflow.compile("y = x[i]"), bad)


def test_program_to_source_hook() -> None:
    program = einflow.compile("C[i,j] = A[i,k] B[k,j]")
    assert program.to_source("g") == to_source(program, "g")


def test_text_and_program_are_both_accepted() -> None:
    assert to_source("C[i,j] = A[i,k] B[k,j]") == to_source(einflow.compile("C[i,j] = A[i,k] B[k,j]"))


def test_elementwise_table_matches_the_language() -> None:
    assert set(python_module._CALLS) == set(einflow.lang.ir.FUNCTIONS)


def test_docstring_examples() -> None:
    for module in (python_module, latex_module, sys.modules["einflow.export.dot"]):
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0, module.__name__


# ---------------------------------------------------------------- LaTeX

LATEX_CASES = [
    ("C[i,j] = A[i,k] B[k,j]", r"C_{ij} = \sum_{k} A_{ik} B_{kj}"),
    ("C = A[i,k] B[k,j]", r"C_{ij} = \sum_{k} A_{ik} B_{kj}"),
    ("y[i] = A[i,j] + c[i]", r"y_{i} = \sum_{j} A_{ij} + c_{i}"),
    ("t = A[i,i]", r"t = \sum_{i} A_{ii}"),
    ("H[batch,hidden] = relu(X[batch,feat] W[feat,hidden])",
     r"H_{batch,hidden} = \operatorname{relu}\left(\sum_{feat} X_{batch,feat} W_{feat,hidden}\right)"),
    ("L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))",
     r"L = \sum_{s} \log\left(1 + \exp\left(-\sum_{f} y_{s} X_{sf} w_{f}\right)\right)"),
    ("p[i] = sigmoid(z[i]) + tanh(z[i])", r"p_{i} = \sigma\left(z_{i}\right) + \tanh\left(z_{i}\right)"),
    ("u[i] = x[i] / sqrt(x[j] x[j])", r"u_{i} = \frac{x_{i}}{\sqrt{\sum_{j} x_{j} x_{j}}}"),
    ("q[i] = x[i]^2 - 3 x[i]^-0.5", r"q_{i} = x_{i}^{2} - \frac{3}{\sqrt{x_{i}}}"),
    ("size p = x; size q = x\nd2f_dx2[p,q] = 2 delta[p,q]",
     r"\frac{\partial^2 f}{\partial x_{p}\partial x_{q}} = 2 \delta_{pq}"),
    ("dL_dW[j,k] = X[b,j] G[b,k]", r"\frac{\partial L}{\partial W_{jk}} = \sum_{b} X_{bj} G_{bk}"),
    ("n = sqrt(x[i] x[i])\nu[i] = x[i] / n",
     "\\begin{aligned}\nn &= \\sqrt{\\sum_{i} x_{i} x_{i}} \\\\\nu_{i} &= \\frac{x_{i}}{n}\n\\end{aligned}"),
    ("a[i] = abs(x[i]) + step(x[i]) sign(x[i])",
     r"a_{i} = \left|x_{i}\right| + \operatorname{step}\left(x_{i}\right) \operatorname{sign}\left(x_{i}\right)"),
    ("r[i] = sum[j](A[i,j] + B[i,j])", r"r_{i} = \sum_{j} \left(A_{ij} + B_{ij}\right)"),
    ("loss = sum[i](0.5 * (p[i] - t[i])^2)", r"\mathit{loss} = \sum_{i} 0.5 \left(p_{i} - t_{i}\right)^{2}"),
]


@pytest.mark.parametrize(("text", "expected"), LATEX_CASES)
def test_latex_exact(text: str, expected: str) -> None:
    assert to_latex(einflow.compile(text)) == expected


def _tensors(expr: Any) -> list[Any]:
    ir = einflow.lang.ir
    if isinstance(expr, ir.Tensor):
        return [expr]
    children = {ir.Product: "factors", ir.Sum: "terms"}
    for kind, attribute in children.items():
        if isinstance(expr, kind):
            return [t for child in getattr(expr, attribute) for t in _tensors(child)]
    for kind, attribute in ((ir.Call, "arg"), (ir.Power, "base"), (ir.Reduce, "body")):
        if isinstance(expr, kind):
            return _tensors(getattr(expr, attribute))
    return []


def _balanced(text: str) -> bool:
    depth = 0
    for position, char in enumerate(text):
        if char in "{}" and position and text[position - 1] == "\\":
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


@pytest.mark.parametrize("key", [case[0] for case in CORPUS])
def test_latex_structure_over_corpus(key: str) -> None:
    text = next(text for k, text, _ in CORPUS if k == key)
    program = einflow.compile(text)
    rendered = to_latex(program)
    assert _balanced(rendered)
    assert rendered.count(r"\left") == rendered.count(r"\right")
    assignments = [s for s in program.ir.statements if isinstance(s, einflow.lang.ir.Assign)]
    assert rendered.count("=") == sum(1 for s in assignments if s.target is not None)
    assert ("aligned" in rendered) == (len(assignments) > 1)
    referenced = {node.name for s in assignments for node in _tensors(s.expr)}
    for name in referenced | set(program.info.targets):
        plain = latex_module.render_name(name)
        assert plain in rendered or re.match(r"d\w+_d\w+", name), name


def test_repr_latex_is_display_math() -> None:
    program = einflow.compile("C[i,j] = A[i,k] B[k,j]")
    assert program._repr_latex_() == "$$" + to_latex(program) + "$$"
    assert "C[i,j] = A[i,k] B[k,j]" in repr(program)


@pytest.mark.skipif(not HAS_GRAD, reason="einflow.grad/hessian are not available yet (issue #2)")
def test_latex_of_derivative_programs() -> None:
    gradient = einflow.grad("L = sum[s](log(1 + exp(-y[s] X[s,f] w[f])))", wrt="w")
    rendered = to_latex(gradient)
    assert r"\frac{\partial L}{\partial w_{" in rendered
    assert _balanced(rendered)
    hessian = einflow.hessian("f = x[i] x[i]", wrt="x")
    assert r"\frac{\partial^2 f}{\partial x_{" in to_latex(hessian)


# ---------------------------------------------------------------- DOT


def test_dot_graph_lists_tensors_and_dependencies() -> None:
    program = einflow.compile("H[b,h] = tanh(X[b,f] W[f,h])\nP[b] = H[b,h] v[h]\nL = sum[b]((P[b] - t[b])^2)")
    dot = to_dot(program)
    assert dot.startswith("digraph einflow {") and dot.rstrip().endswith("}")
    edges = set(re.findall(r'"(\w+)" -> "(\w+)"', dot))
    assert edges == {("X", "H"), ("W", "H"), ("H", "P"), ("v", "P"), ("P", "L"), ("t", "L")}
    assert dot.count("{") == dot.count("}")


def test_dot_graph_with_shapes_shows_flops() -> None:
    program = einflow.compile("C[i,j] = A[i,k] B[k,j]\nd = C[i,j] C[i,j]")
    dot = to_dot(program, A=(10, 20), B=(20, 30))
    report = program.plan(A=(10, 20), B=(20, 30))
    matmul_flops = next(step.flops for step in report.steps if step.statement.startswith("C["))
    assert f"{matmul_flops:,} FLOPs" in dot
