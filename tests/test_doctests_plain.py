"""The package as a user installs it: its wheel, its bare install, and its docstring examples under the standard runner.

Three things are checked in fresh virtual environments, made without the system's site-packages, from a copy of the
working tree (the clone: the package and the files its build reads):

- The wheel and the sdist: the wheel's metadata requires NumPy and threadpoolctl only (matplotlib in the ``plot``
  extra) and it ships LICENSE; the sdist holds LICENSE, CHANGELOG.md and CITATION.cff.
- The bare install, ``pip install attention_ref`` (here the built wheel): NumPy and threadpoolctl come with it and
  nothing else, so no matplotlib, PyTorch or JAX. There ``import attention_ref`` and ``attention_ref.testing`` work,
  a checker passes a float16 kernel and fails a wrong one, and a plotting call raises an ImportError naming the
  ``plot`` extra: what a kernel's test suite that depends on the package gets.
- The README's "Running the doctests" block, as written: its ``pip install`` line in the clone (the package with
  its ``plot`` extra, since the plotting examples draw, and pytest; nothing else: no scipy-doctest, no project
  configuration), then its ``python -m pytest`` line with that environment's Python, from an empty folder whose own
  empty ``pytest.ini`` keeps this repository's pyproject.toml out. So every example, the plotting ones included,
  must show exactly what NumPy prints: no tolerance, no option flags, nothing skipped. The examples outside
  plotting.py need no matplotlib (none of them imports it, and the bare environment above shows the package runs
  without it), but they are run once, here, with everything the README installs.

About 20 s, most of it installing NumPy and matplotlib (from pip's cache when it has them). Without a wheel or an
environment (no build backend or package index reachable) the tests skip, and fail in CI.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "attention_ref"
# What the wheel and the sdist are built from: the package, the files pyproject.toml names (readme, license-files),
# what MANIFEST.in adds to the sdist, and any other licence files.
BUILD_INPUTS = ("pyproject.toml", "README.md", "MANIFEST.in", "CHANGELOG.md", "CITATION.cff",
                "LICENSE*", "LICENCE*", "COPYING*", "NOTICE*", "AUTHORS*")
# Variables that would let this repository or its pytest set-up into the clean run.
LEAKY_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
MIN_DOCTESTS = 20
README_SECTION = "## Running the doctests"
# What `pip install attention_ref` puts in an empty environment: the package and its two dependencies.
BARE_INSTALL = {"attention-ref", "numpy", "threadpoolctl"}
NEEDS_PLOT_EXTRA = "needs matplotlib, an optional dependency: pip install 'attention_ref[plot]'"

pytestmark = pytest.mark.wheel


def _run(cmd, cwd, timeout=600):
    env = {name: value for name, value in os.environ.items() if name not in LEAKY_VARIABLES}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _cannot(what, result):
    message = f"{what} failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def readme_commands(readme=ROOT / "README.md"):
    """The README's doctest commands: the arguments of its ``pip install`` and ``python -m pytest`` lines, split
    as the shell splits them (quotes removed)."""
    section = readme.read_text(encoding="utf-8").split(README_SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block, f"no bash block under {README_SECTION!r} in README.md"
    lines = [shlex.split(line, comments=True) for line in block[1].splitlines()]
    install = [words[2:] for words in lines if words[:2] == ["pip", "install"]]
    run = [words[3:] for words in lines if words[:3] == ["python", "-m", "pytest"]]
    assert len(install) == 1 and len(run) == 1, block[1]
    return install[0], run[0]


def test_the_readme_installs_from_a_clone():
    """Not from PyPI, where no package of this name is published: the clone's folder with the plot extra (the
    plotting examples draw) and the strategies extra (hypothesis, for attention_ref.testing.strategies), and
    pytest."""
    install, run = readme_commands()
    assert install == [".[plot,strategies]", "pytest"], install
    assert run == ["--doctest-modules", "--pyargs", PACKAGE], run


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A copy of what a clone holds for the build: the package and the files the build reads."""
    clone = tmp_path_factory.mktemp("clone") / "clone"
    clone.mkdir()
    for pattern in BUILD_INPUTS:
        for path in ROOT.glob(pattern):
            shutil.copy2(path, clone / path.name)
    shutil.copytree(ROOT / PACKAGE, clone / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return clone


def _fresh_venv(base):
    """The python of a new virtual environment in `base` / venv, without pip (ensurepip takes longer than the
    installs: this interpreter's pip installs into it) and without the system's site-packages."""
    venv = base / "venv"
    result = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    if result.returncode != 0:
        _cannot("creating the virtual environment", result)
    return venv / "bin" / "python"


def _pip_install(python, args, cwd, what):
    result = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", *args], cwd)
    if result.returncode != 0:
        _cannot(what, result)


@pytest.fixture(scope="module")
def wheel(clone, tmp_path_factory):
    """The wheel pip builds from the clone with this environment's setuptools (no isolated build environment, which
    saves installing setuptools again: the README's install line builds in one, as a user's pip does)."""
    dist = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist)]
    result = _run([*command, str(clone)], dist)
    if result.returncode != 0:
        _cannot("building the wheel", result)
    (path,) = dist.glob(f"{PACKAGE}-*.whl")
    return path


@pytest.fixture(scope="module")
def bare_python(wheel, tmp_path_factory):
    """A fresh venv's python holding the wheel and the dependencies pip installed with it, nothing else."""
    python = _fresh_venv(tmp_path_factory.mktemp("bare"))
    _pip_install(python, [str(wheel)], wheel.parent, "installing the wheel")
    return python


@pytest.fixture(scope="module")
def clean_python(clone, tmp_path_factory):
    """A fresh venv's python into which the README's install line, run in the clone, put the package."""
    python = _fresh_venv(tmp_path_factory.mktemp("plain_doctests"))
    install, _ = readme_commands()
    _pip_install(python, install, clone, "the README's install line")
    return python


def _metadata(wheel):
    """(the METADATA file's lines, the wheel's file names) of `wheel`."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        return archive.read(metadata).decode("utf-8").splitlines(), names


def test_the_wheel_requires_numpy_and_threadpoolctl_only_and_ships_the_licence(wheel):
    lines, names = _metadata(wheel)
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    unconditional = sorted(r for r in requires if "extra ==" not in r)
    assert [re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in unconditional] == ["numpy", "threadpoolctl"], requires
    assert 'matplotlib>=3.8; extra == "plot"' in requires, requires
    assert "Provides-Extra: plot" in lines
    assert "License-Expression: BSD-3-Clause" in lines
    assert "License-File: LICENSE" in lines
    (licence,) = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(licence) == (ROOT / "LICENSE").read_bytes()


def test_the_sdist_holds_the_licence_changelog_and_citation(clone, tmp_path):
    """Built with this environment's setuptools through the PEP 517 hook (no isolated build, no index)."""
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    result = _run([sys.executable, "-c", code], clone)
    if result.returncode != 0:
        _cannot("building the sdist", result)
    with tarfile.open(tmp_path / result.stdout.strip().splitlines()[-1]) as archive:
        top = {Path(name).relative_to(Path(name).parts[0]).as_posix() for name in archive.getnames()}
    for name in ("LICENSE", "CHANGELOG.md", "CITATION.cff", "README.md", "pyproject.toml",
                 f"{PACKAGE}/__init__.py", f"{PACKAGE}/testing/__init__.py"):
        assert name in top, f"the sdist lacks {name}"


def test_the_bare_install_holds_numpy_and_threadpoolctl_and_no_matplotlib(bare_python):
    code = "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
    result = _run([str(bare_python), "-c", code], bare_python.parent)
    assert result.returncode == 0, result.stderr
    assert {_canonical(name) for name in json.loads(result.stdout)} == BARE_INSTALL
    result = _run([str(bare_python), "-c", "import matplotlib"], bare_python.parent)
    assert result.returncode != 0 and "No module named 'matplotlib'" in result.stderr, result.stderr


# Run in the bare environment: a kernel's test suite using the checkers, and a plotting call. Prints JSON.
BARE_USE = r"""
import json, sys
import numpy as np
import attention_ref as ar
from attention_ref.testing import assert_attention_close

rng = np.random.default_rng(0)
q, k, v = rng.standard_normal((3, 2, 64, 16)).astype(np.float16)  # (heads, L, E) each
out = ar.blockwise_attention(q, k, v, is_causal=True, block_size=16)  # (2, 64, 16) float16
assert_attention_close(out, q, k, v, is_causal=True)  # an AssertionError here fails the script
wrong = ar.blockwise_attention(q, k, v, block_size=16)  # the causal mask forgotten
report = {"file": ar.__file__, "dtype": str(out.dtype)}
try:
    assert_attention_close(wrong, q, k, v, is_causal=True)
except AssertionError as exc:
    report["wrong_kernel"] = str(exc)
try:
    ar.plot_attention(np.eye(2))
except ImportError as exc:
    report["plot_error"] = [type(exc).__name__, str(exc)]
report["imported"] = sorted(m for m in ("matplotlib", "torch", "jax", "hypothesis") if m in sys.modules)
print(json.dumps(report))
"""


def test_the_checkers_work_in_the_bare_install_and_plotting_names_its_extra(bare_python, tmp_path):
    result = _run([str(bare_python), "-c", BARE_USE], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert Path(report["file"]).is_relative_to(bare_python.parents[1]), report["file"]  # installed, not ROOT
    assert report["dtype"] == "float16"
    assert "wrong_kernel" in report, "a kernel without its causal mask passed assert_attention_close"
    assert "too far from the float64 reference" in report["wrong_kernel"], report["wrong_kernel"]
    assert report["plot_error"] == ["ModuleNotFoundError", f"plot_attention {NEEDS_PLOT_EXTRA}"]
    assert report["imported"] == []


def test_docstring_examples_pass_the_plain_runner_on_the_installed_package(clean_python, tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # an empty configuration, found before any pyproject.toml
    where = _run([str(clean_python), "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(clean_python.parents[1]), where.stdout  # installed, not ROOT

    _, run = readme_commands()
    cmd = [str(clean_python), "-m", "pytest", *run, "-v", "-p", "no:cacheprovider",
           "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
    result = _run(cmd, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    summary = output.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed)", summary)}
    assert counts.get("passed", 0) >= MIN_DOCTESTS, summary
    assert set(counts) == {"passed"}, summary  # nothing failed, errored or was skipped
    for function in ("plot_attention", "plot_heads"):  # the plotting examples ran, with the plot extra
        assert f"plotting.py::{PACKAGE}.plotting.{function} PASSED" in output, output[-8000:]
