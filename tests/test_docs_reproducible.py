"""Building the book twice gives byte-identical pages, figures and notebooks.

The main build (``docs/_build/html``, made by ``make docs`` just before the tests in ``make test``) is compared
with a second, clean build into a temporary folder: same sources, same ``SOURCE_DATE_EPOCH``, but a fresh
execution cache, so every chapter runs again. Comparing with the build that already exists makes the check cost
one build instead of two.

What keeps the two identical: SOURCE_DATE_EPOCH (exported by the Makefile; Sphinx uses it for dates),
``svg.hashsalt`` and fixed metadata in docs/chapters/matplotlibrc, no "last updated" stamps, and seeded chapters.
"""

import difflib
import filecmp
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# BOOK_SITE: compare another build folder instead (as in tests/test_site.py).
MAIN = Path(os.environ.get("BOOK_SITE", DOCS / "_build" / "html"))
# Build bookkeeping, not part of the site a reader gets: the build-info stamp. (Sphinx's doctrees and the
# execution cache live beside the site, in docs/_build/doctrees: see the Makefile.)
IGNORED_TOP = {".buildinfo", ".buildinfo.bak"}

pytestmark = pytest.mark.docs
# A line that reads as a warning: Sphinx's and logging's "WARNING", or a Python warning ("UserWarning: ...").
WARNING_LINE = re.compile(r"\bWARNING\b|\w+Warning: ")


def _site_files(root):
    return {
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and path.relative_to(root).parts[0] not in IGNORED_TOP
    }


def _source_date_epoch():
    if "SOURCE_DATE_EPOCH" in os.environ:
        return os.environ["SOURCE_DATE_EPOCH"]
    result = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() or "1700000000"  # the Makefile's rule


def _first_difference(a, b):
    try:
        lines_a, lines_b = a.read_text().splitlines(), b.read_text().splitlines()
    except UnicodeDecodeError:
        return "    (binary files differ)"
    diff = list(difflib.unified_diff(lines_a, lines_b, "main", "rebuild", n=0, lineterm=""))
    return "\n".join("    " + line[:200] for line in diff[2:8])


def test_a_second_clean_build_is_byte_identical(tmp_path):
    if not (MAIN / "index.html").is_file():
        if IN_CI:
            pytest.fail(f"the main build {MAIN} is required in CI (make docs)")
        pytest.skip(f"{MAIN} not built (make docs)")
    out = tmp_path / "_build" / "html"
    env = {**os.environ, "SOURCE_DATE_EPOCH": _source_date_epoch()}
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-b", "html",
         "-d", str(tmp_path / "_build" / "doctrees"), str(DOCS), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    # A clean build prints progress and nothing that looks like a warning, and publishes only the site.
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if WARNING_LINE.search(line)]
    assert warnings == [], warnings
    assert not (out / ".doctrees").exists() and not (MAIN / ".doctrees").exists(), "doctrees inside the site"

    rebuilt = _site_files(out)
    main = _site_files(MAIN)
    # A file in one tree only (e.g. a figure whose hashed name changed, or a page the other build did not write).
    only_rebuilt = sorted(rebuilt - main)
    only_main = sorted(main - rebuilt)
    # Every file in both, compared byte for byte in one pass (errors: a file that could not be read).
    _, differing, unreadable = filecmp.cmpfiles(MAIN, out, sorted(rebuilt & main), shallow=False)
    report = [f"only in the rebuild: {name}" for name in only_rebuilt]
    report += [f"only in the main build: {name}" for name in only_main]
    report += [f"differs: {name}\n{_first_difference(MAIN / name, out / name)}" for name in differing]
    report += [f"could not compare: {name}" for name in unreadable]
    assert not report, f"{len(report)} of {len(rebuilt | main)} files differ:\n" + "\n".join(report)
    # Sanity: the comparison covered what a reader gets.
    assert any(name.startswith("_images/") for name in rebuilt)
    assert any(name.endswith(".ipynb") for name in rebuilt)
    assert "index.html" in rebuilt
