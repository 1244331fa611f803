"""The render stage's structure: the target is a value (no name compared), engine classes do not inherit."""

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

#: engine classes that still derive from another engine class (issue 34: the renderer is to become rows over a
#: context); this list only ever shrinks
STILL_DERIVED = {("render.py", "Renderer")}


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


def _engine_classes() -> dict[str, tuple[pathlib.Path, ast.ClassDef]]:
    classes = {}
    for path in _python_files(ENGINE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (path, node))
    return classes


def test_engine_classes_do_not_derive_from_engine_classes() -> None:
    classes = _engine_classes()
    found = set()
    for name, (path, node) in classes.items():
        if _is_plain_data(node):
            continue
        bases = {_names(base).rsplit(".", 1)[-1] for base in node.bases} - ALLOWED_BASES
        if bases & set(classes):
            found.add((str(path.relative_to(ENGINE)), name))
    assert found <= STILL_DERIVED, f"engine classes deriving from engine classes: {sorted(found - STILL_DERIVED)}"
    stale = STILL_DERIVED - found
    assert not stale, f"no longer derived (remove them from STILL_DERIVED): {sorted(stale)}"


#: the render stage's modules (engine/lower.py, the lowering, is split under issue 34's third item)
RENDER_STAGE = ["codegen.py", "rows.py", "dialect.py", "helpers.py", "runtime.py", "runtime_torch.py",
                "runtime_jax.py", "specialise.py", "measure.py", "hoisting.py", "render.py", "render_fitted.py",
                "plan.py", "kernels.py", "blocks.py"]


@pytest.mark.parametrize("module", RENDER_STAGE)
def test_render_stage_modules_and_classes_stay_small(module: str) -> None:
    text = (ENGINE / module).read_text()
    assert text.count("\n") <= 700, f"{module} has {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            assert node.end_lineno - node.lineno + 1 <= 350, f"class {node.name} of {module}"
