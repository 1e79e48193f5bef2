"""The code base passes the same lint and type checks as ``make lint`` (ruff over code, tests and docs; mypy)."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _paths(*names):
    return [name for name in names if (ROOT / name).exists()]


@pytest.fixture(scope="module")
def ruff():
    require("ruff")  # skips locally without it, fails in CI
    return lambda *paths: _run("ruff", "check", "--no-cache", *paths)


def test_ruff_is_clean(ruff):
    result = ruff(*_paths("attention_ref", "tests", "benchmarks", "docs"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_reports_a_seeded_error(ruff, tmp_path):
    # The check can fail: an unused import in a scratch module is reported.
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    result = ruff(str(bad))
    assert result.returncode == 1
    assert "F401" in result.stdout


def test_mypy_is_clean():
    require("mypy")
    # mypy's own incremental cache (.mypy_cache, as `make lint` uses): after the first run, only changed modules
    # and their dependents are checked again, which makes a repeated run about 20 times faster.
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
