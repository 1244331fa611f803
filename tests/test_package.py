"""The package as installed: metadata, license, typing marker, `python -m einflow`, mypy on the public modules."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pathlib
import subprocess
import sys

import pytest

import einflow

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_metadata_names_an_spdx_license_and_classifiers():
    metadata = importlib.metadata.metadata("einflow")
    assert metadata["License-Expression"] == "MIT"
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert metadata["Version"] == einflow.__version__
    requirement = next(r for r in metadata.get_all("Requires-Dist") if r.startswith("numpy"))
    assert requirement.replace(" ", "") == "numpy>=2.0"  # the floor the suite was run on (docs/api.md)


def test_license_file_and_typing_marker_ship():
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert "einflow developers" in (ROOT / "LICENSE").read_text()
    assert (pathlib.Path(einflow.__file__).parent / "py.typed").is_file()


def test_python_dash_m_einflow_runs_the_command_line():
    done = subprocess.run([sys.executable, "-m", "einflow", "-c", "y = 2 + 3"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.split()[-1] == "5", done.stdout + done.stderr
    version = subprocess.run([sys.executable, "-m", "einflow", "--version"], capture_output=True, text=True,
                             timeout=120, check=False)
    assert version.returncode == 0 and einflow.__version__ in version.stdout + version.stderr
    plan = subprocess.run([sys.executable, "-m", "einflow", "plan", "s = x[i] x[i]", "--shape", "x=10"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert plan.returncode == 0 and "total FLOPs" in plan.stdout


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is in the test extras; not installed")
def test_public_modules_pass_mypy():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
