"""The docstring examples pass under the standard doctest runner against the installed wheel, as a user runs them.

The wheel is built from a copy of the working tree, installed with pytest (and the package's own dependencies,
nothing else: no scipy-doctest, no project configuration) into a fresh virtual environment without the system's
site-packages, and ``pytest --doctest-modules --pyargs attention_ref`` runs there from an empty folder whose own
empty ``pytest.ini`` keeps this repository's pyproject.toml out. So every example must show exactly what NumPy
prints: no tolerance, no option flags. About 20 s, most of it installing NumPy and Matplotlib.

Without a wheel or an environment (no build backend or package index reachable) the test skips, and fails in CI.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "attention_ref"
# What the wheel is built from: the package and the files pyproject.toml names (readme), plus any licence files.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE*", "LICENCE*", "COPYING*", "NOTICE*", "AUTHORS*")
# Variables that would let this repository or its pytest set-up into the clean run.
LEAKY_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
MIN_DOCTESTS = 20

pytestmark = pytest.mark.wheel


def _run(cmd, cwd, timeout=600):
    env = {name: value for name, value in os.environ.items() if name not in LEAKY_VARIABLES}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _cannot(what, result):
    message = f"{what} failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def clean_python(tmp_path_factory):
    """A fresh venv's python holding only the wheel built from the working tree, its dependencies and pytest."""
    base = tmp_path_factory.mktemp("plain_doctests")
    src = base / "src"
    src.mkdir()
    for pattern in BUILD_INPUTS:
        for path in ROOT.glob(pattern):
            shutil.copy2(path, src / path.name)
    shutil.copytree(ROOT / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = base / "wheels"
    result = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(src)], base)
    if result.returncode != 0:
        _cannot("building the wheel", result)
    (wheel,) = wheels.glob(f"{PACKAGE}-*.whl")

    venv = base / "venv"
    # No pip inside (ensurepip takes longer than the installs): this interpreter's pip installs into it.
    result = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    if result.returncode != 0:
        _cannot("creating the virtual environment", result)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel), "pytest"]
    result = _run(install, base)
    if result.returncode != 0:
        _cannot("installing the wheel and pytest", result)
    return python


def test_docstring_examples_pass_the_plain_runner_on_the_installed_wheel(clean_python, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # an empty configuration, found before any pyproject.toml
    where = _run([str(clean_python), "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(clean_python.parents[1]), where.stdout  # the wheel, not ROOT

    cmd = [str(clean_python), "-m", "pytest", "--doctest-modules", "--pyargs", PACKAGE, "-p", "no:cacheprovider",
           "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
    result = _run(cmd, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    summary = output.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed)", summary)}
    assert counts.get("passed", 0) >= MIN_DOCTESTS, summary
    assert set(counts) == {"passed"}, summary  # nothing failed, errored or was skipped
