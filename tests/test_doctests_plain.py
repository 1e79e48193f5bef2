"""The docstring examples pass under the standard doctest runner against the installed package, as the README says.

The two commands of the README's "Running the doctests" block run as written: its ``pip install`` line in a copy
of the working tree (the clone: the package and the files its build reads), installing the package with pytest
(and the package's own dependencies, nothing else: no scipy-doctest, no project configuration) into a fresh
virtual environment without the system's site-packages; then its ``python -m pytest`` line with that
environment's Python, from an empty folder whose own empty ``pytest.ini`` keeps this repository's pyproject.toml
out. So every example must show exactly what NumPy prints: no tolerance, no option flags. About 20 s, most of it
installing NumPy and Matplotlib.

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
README_SECTION = "## Running the doctests"

pytestmark = pytest.mark.wheel


def _run(cmd, cwd, timeout=600):
    env = {name: value for name, value in os.environ.items() if name not in LEAKY_VARIABLES}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _cannot(what, result):
    message = f"{what} failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def readme_commands(readme=ROOT / "README.md"):
    """The README's doctest commands: the arguments of its ``pip install`` and ``python -m pytest`` lines."""
    section = readme.read_text(encoding="utf-8").split(README_SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block, f"no bash block under {README_SECTION!r} in README.md"
    lines = [line.split("#", 1)[0].split() for line in block[1].splitlines()]
    install = [words[2:] for words in lines if words[:2] == ["pip", "install"]]
    run = [words[3:] for words in lines if words[:3] == ["python", "-m", "pytest"]]
    assert len(install) == 1 and len(run) == 1, block[1]
    return install[0], run[0]


def test_the_readme_installs_from_a_clone():
    """Not from PyPI, where no package of this name is published: the clone's folder, with pytest."""
    install, run = readme_commands()
    assert install == [".", "pytest"], install
    assert run == ["--doctest-modules", "--pyargs", PACKAGE], run


@pytest.fixture(scope="module")
def clean_python(tmp_path_factory):
    """A fresh venv's python into which the README's install line, run in a copy of the clone, put the package."""
    base = tmp_path_factory.mktemp("plain_doctests")
    clone = base / "clone"
    clone.mkdir()
    for pattern in BUILD_INPUTS:
        for path in ROOT.glob(pattern):
            shutil.copy2(path, clone / path.name)
    shutil.copytree(ROOT / PACKAGE, clone / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    venv = base / "venv"
    # No pip inside (ensurepip takes longer than the installs): this interpreter's pip installs into it.
    result = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    if result.returncode != 0:
        _cannot("creating the virtual environment", result)
    python = venv / "bin" / "python"
    install, _ = readme_commands()
    result = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *install], clone)
    if result.returncode != 0:
        _cannot("the README's install line", result)
    return python


def test_docstring_examples_pass_the_plain_runner_on_the_installed_package(clean_python, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # an empty configuration, found before any pyproject.toml
    where = _run([str(clean_python), "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(clean_python.parents[1]), where.stdout  # installed, not ROOT

    _, run = readme_commands()
    cmd = [str(clean_python), "-m", "pytest", *run, "-p", "no:cacheprovider",
           "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
    result = _run(cmd, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    summary = output.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed)", summary)}
    assert counts.get("passed", 0) >= MIN_DOCTESTS, summary
    assert set(counts) == {"passed"}, summary  # nothing failed, errored or was skipped
