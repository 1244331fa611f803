"""The render stage's structure: the target is a value (no name compared), engine classes do not inherit, nothing
calls back up the layers on a first call."""

from __future__ import annotations

import ast
import pathlib

import pytest

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


#: the render stage's modules (engine/lower.py, the lowering, is split under issue 34's third item)
RENDER_STAGE = ["codegen.py", "context.py", "rows.py", "dialect.py", "helpers.py", "runtime.py", "runtime_torch.py",
                "runtime_jax.py", "specialise.py", "measure.py", "hoisting.py", "render.py", "render_steps.py",
                "render_fitted.py", "plan.py", "kernels.py", "blocks.py"]


@pytest.mark.parametrize("module", RENDER_STAGE)
def test_render_stage_modules_and_classes_stay_small(module: str) -> None:
    text = (ENGINE / module).read_text()
    assert text.count("\n") <= 700, f"{module} has {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            assert node.end_lineno - node.lineno + 1 <= 350, f"class {node.name} of {module}"


#: the render stage's modules, as ``benchmarks/upcalls.py`` names them
RENDER_STAGE_MODULES = {f"engine.{name.removesuffix('.py')}" for name in RENDER_STAGE}


def test_the_render_stage_calls_nothing_back_up() -> None:
    """The first call of a small program and of its gradient makes no call from a render stage module into a module
    that imports it (``benchmarks/upcalls.py``: the rows are functions of a context, and the writers above them walk
    the steps; the ``split_product`` callbacks of the lowering are not the render stage's)."""
    import importlib.util
    import sys

    import numpy as np

    import einflow as ef

    spec = importlib.util.spec_from_file_location("_upcalls", ROOT.parent / "benchmarks" / "upcalls.py")
    assert spec is not None and spec.loader is not None
    upcalls = importlib.util.module_from_spec(spec)
    sys.modules["_upcalls"] = upcalls
    spec.loader.exec_module(upcalls)
    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal(shape) for name, shape in upcalls.SHAPES.items()}
    for program in (ef.compile(upcalls.PROGRAM), ef.grad(upcalls.PROGRAM, wrt="W")):
        found = upcalls.count(lambda program=program: program(**arrays))
        stage = {pair: number for pair, number in found.items()
                 if set(pair.split(" -> ")) & RENDER_STAGE_MODULES}
        assert not stage, f"calls back up in the render stage: {stage}"
