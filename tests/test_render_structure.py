"""The render stage's structure: the target is a value (no name compared), engine classes do not inherit, nothing
calls back up the layers on a first call."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys
from typing import Any

import numpy as np
import pytest

import einflow as ef
from einflow.engine.lower import _lower
from einflow.program import _compile_text

ROOT = pathlib.Path(__file__).resolve().parent.parent / "einflow"
ENGINE = ROOT / "engine"

#: where a dialect's name may be spelled and compared: the dialects themselves and the backends that pick one
NAMED_HERE = {ENGINE / "dialect.py", *(ENGINE / "backends").rglob("*.py")}

#: base classes a class may derive from (plain data, protocols, errors; and ``Backend``, whose class attributes
#: are a backend's capabilities, each backend a row overriding some of them)
ALLOWED_BASES = {"NamedTuple", "Protocol", "Enum", "IntEnum", "Exception", "ValueError", "TypeError",
                 "RuntimeError", "Generic", "object", "Backend"}

#: the folders whose classes may not derive from one another's: the engine, and the exporters that render its steps
DERIVING_CHECKED = (ENGINE, ROOT / "export")


def _python_files(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(folder.rglob("*.py"))


def _names(node: ast.expr) -> str:
    """The dotted text of a name or attribute (``backend.target``), else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _names(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    return ""


def _is_dialect(node: ast.expr) -> bool:
    text = _names(node)
    last = text.rsplit(".", 1)[-1]
    return last in ("target", "dialect") or text.endswith("dialect.name")


def _string_comparisons(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            strings = [side for side in sides if isinstance(side, ast.Constant) and isinstance(side.value, str)]
            if strings and any(_is_dialect(side) for side in sides):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_dialect_compared_with_a_string() -> None:
    found = [line for path in _python_files(ROOT) if path not in NAMED_HERE for line in _string_comparisons(path)]
    assert not found, "a dialect's name compared outside engine/dialect.py and engine/backends/:\n" + "\n".join(found)


def test_the_check_sees_a_comparison(tmp_path: pathlib.Path) -> None:
    written = tmp_path / "example.py"
    written.write_text('if backend.target == "torch":\n    pass\nif "jax" != self.dialect.name:\n    pass\n')
    assert len(_string_comparisons_at(written)) == 2


def _string_comparisons_at(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(_is_dialect(side) for side in [node.left, *node.comparators]):
            found.append(ast.unparse(node))
    return found


def _is_plain_data(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if _names(target).rsplit(".", 1)[-1] == "dataclass":
            return True
    return False


def _classes() -> dict[str, tuple[pathlib.Path, ast.ClassDef]]:
    classes = {}
    for folder in DERIVING_CHECKED:
        for path in _python_files(folder):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, (path, node))
    return classes


def _derived(classes: dict[str, tuple[pathlib.Path, ast.ClassDef]]) -> set[tuple[str, str]]:
    """The classes (other than dataclasses) deriving from another class of ``classes``, besides the allowed bases."""
    found = set()
    for name, (path, node) in classes.items():
        if _is_plain_data(node):
            continue
        bases = {_names(base).rsplit(".", 1)[-1] for base in node.bases} - ALLOWED_BASES
        if bases & set(classes):
            found.add((str(path.relative_to(ROOT)), name))
    return found


def test_engine_classes_do_not_derive_from_engine_classes() -> None:
    """No class of ``einflow/engine/`` or ``einflow/export/`` derives from another of them (the render stage is
    rows over a context, not a renderer and its subclasses); dataclasses, NamedTuples, Protocols, errors and the
    backends' rows of ``Backend`` aside."""
    found = _derived(_classes())
    assert not found, f"engine classes deriving from engine classes: {sorted(found)}"


def test_the_check_sees_a_subclass(tmp_path: pathlib.Path) -> None:
    written = tmp_path / "example.py"
    written.write_text("class Source:\n    pass\n\n\nclass Renderer(Source):\n    pass\n")
    node = ast.parse(written.read_text())
    classes = {item.name: (ROOT / "example.py", item) for item in node.body if isinstance(item, ast.ClassDef)}
    assert _derived(classes) == {("example.py", "Renderer")}


#: the render stage's modules (every module's and class's size: tests/test_module_sizes.py)
RENDER_STAGE = ["codegen.py", "context.py", "rows.py", "dialect.py", "helpers.py", "runtime.py", "runtime_torch.py",
                "runtime_jax.py", "specialise.py", "measure.py", "hoisting.py", "render.py", "render_steps.py",
                "render_fitted.py", "plan.py", "kernels.py", "blocks.py"]


#: the render stage's modules, as ``benchmarks/upcalls.py`` names them
RENDER_STAGE_MODULES = {f"engine.{name.removesuffix('.py')}" for name in RENDER_STAGE}


def _upcalls() -> Any:
    """``benchmarks/upcalls.py`` as a module."""
    spec = importlib.util.spec_from_file_location("_upcalls", ROOT.parent / "benchmarks" / "upcalls.py")
    assert spec is not None and spec.loader is not None
    upcalls = importlib.util.module_from_spec(spec)
    sys.modules["_upcalls"] = upcalls
    spec.loader.exec_module(upcalls)
    return upcalls


def _first_calls(text: str, arrays: dict[str, np.ndarray], wrt: str, functions: bool = False) -> list[Any]:
    """The up-calls of the first call of a program and of its gradient: the lowering's and the compiled texts'
    caches are emptied first, so that the call lowers and plans whatever another test did before."""
    upcalls = _upcalls()
    _lower.cache_clear()
    _compile_text.cache_clear()
    found = []
    for program in (ef.compile(text), ef.grad(text, wrt=wrt)):
        found.append(upcalls.count(lambda program=program: program(**arrays), functions=functions))
    return found


def _small_program() -> tuple[str, dict[str, np.ndarray]]:
    upcalls = _upcalls()
    rng = np.random.default_rng(0)
    return upcalls.PROGRAM, {name: rng.standard_normal(shape) for name, shape in upcalls.SHAPES.items()}


def test_the_render_stage_calls_nothing_back_up() -> None:
    """The first call of a small program and of its gradient makes no call from a render stage module into a module
    that imports it (``benchmarks/upcalls.py``: the rows are functions of a context, and the writers above them walk
    the steps; the ``split_product`` callbacks of the lowering are not the render stage's)."""
    text, arrays = _small_program()
    for found in _first_calls(text, arrays, "W"):
        stage = {pair: number for pair, number in found.items()
                 if set(pair.split(" -> ")) & RENDER_STAGE_MODULES}
        assert not stage, f"calls back up in the render stage: {stage}"


#: ``split_product`` (einflow.lang.contraction) sorts a product's factors for the evaluator and the lowering alike,
#: calling back the lowering of a scope-opening factor: the one call back up a first call makes
SPLIT_PRODUCT = "lang.contraction:split_product -> engine.lower:"


def test_the_only_calls_back_up_are_split_products() -> None:
    """``benchmarks/upcalls.py``'s program and its gradient: every call back up the layers is a ``split_product``
    callback (the contraction lowering calls the methods of its frozen context, never the walk that made it)."""
    text, arrays = _small_program()
    for found in _first_calls(text, arrays, "W", functions=True):
        assert found, "the counter saw no split_product callback: is it still counting?"
        others = {pair: number for pair, number in found.items() if not pair.startswith(SPLIT_PRODUCT)}
        assert not others, f"calls back up other than split_product's: {others}"


#: a feature's lowering (linear algebra, shifted reads) calls back the walk for a sub-expression's value, and only
#: for that: its steps are made by its context's methods
SUB_EXPRESSION = {"lower", "lower_product"}


@pytest.mark.parametrize("text, shapes, wrt", [
    ("spd K\nx[i] = inv[i,j](K[i,j]) y[j]\nl = logdet[i,j](K[i,j]) + y[i] x[i]", {"K": (4, 4), "y": (4,)}, "y"),
    ("y[i] = x[i+1] - x[i]\ns = sum[i](y[i]^2)", {"x": (6,)}, "x"),
])
def test_feature_lowerings_call_back_only_for_sub_expressions(text: str, shapes: dict[str, tuple[int, ...]],
                                                              wrt: str) -> None:
    rng = np.random.default_rng(1)
    arrays = {name: rng.standard_normal(shape) for name, shape in shapes.items()}
    if "K" in arrays:
        arrays["K"] = arrays["K"] @ arrays["K"].T + 4 * np.eye(4)
    for found in _first_calls(text, arrays, wrt, functions=True):
        others = {pair: number for pair, number in found.items() if not pair.startswith(SPLIT_PRODUCT)
                  and pair.rsplit(":", 1)[-1] not in SUB_EXPRESSION}
        assert not others, f"calls back up other than for a sub-expression: {others}"
