"""The strict book build fails loudly, naming the culprit, on the mistakes a chapter author makes.

A tiny book is written to a temporary directory and built with the project's own ``docs/conf.py`` (``-c docs``)
and the Makefile's ``SPHINXOPTS``: a control copy must build cleanly, and a broken copy must fail with messages
that name the chapter and the cell or line. Docstring examples are checked by pytest's ``--doctest-modules``
(configured in pyproject.toml); a wrong example in a scratch module must make that run fail.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

pytestmark = pytest.mark.docs
# A line that reads as a warning: Sphinx's and logging's "WARNING", or a Python warning ("UserWarning: ...").
WARNING_LINE = re.compile(r"\bWARNING\b|\w+Warning: ")

NOTEBOOK_HEADER = """\
---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---
"""


def _sphinxopts():
    """The strict options ``make docs`` uses, read from the Makefile so the two cannot drift apart."""
    match = re.search(r"^SPHINXOPTS\s*\?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, "SPHINXOPTS not found in the Makefile"
    options = match.group(1).split()
    assert "-W" in options and "-n" in options, options
    return options


def _write_book(src, *, cell="x = 1 + 1\nassert x == 2", target="ch-tiny", notebooks=2, prose=""):
    """A tiny book: up to two executed chapters (the first runs `cell`) and a prose page referring to `target`.

    With two notebooks the build executes them side by side before reading (docs/conf.py) on a machine with
    two cores or more.
    """
    (src / "chapters").mkdir(parents=True)
    names = ["tiny", "tiny2"][:notebooks]
    pages = [f"chapters/{name}" for name in names] + ["chapters/prose"]
    (src / "index.md").write_text("# Tiny book\n\n```{toctree}\n" + "\n".join(pages) + "\n```\n")
    for name, code in zip(names, [cell, "y = 2 * 3\nassert y == 6"], strict=False):
        (src / "chapters" / f"{name}.md").write_text(
            NOTEBOOK_HEADER
            + f"\n(ch-{name})=\n# A tiny chapter\n\nSome text.\n\n"
            + "```{code-cell} ipython3\nimport numpy as np\n```\n\n"
            + f"```{{code-cell}} ipython3\n{code}\n```\n"
        )
    (src / "chapters" / "prose.md").write_text(
        f"(ch-prose)=\n# Prose\n\nFirst line.\n\nSee {{ref}}`{target}` here.\n" + prose
    )


def _build(tmp_path, **book):
    src = tmp_path / "src"
    _write_book(src, **book)
    return _run_sphinx(src, tmp_path / "_build" / "html"), src


def _run_sphinx(src, out):
    cmd = [
        sys.executable, "-m", "sphinx", *_sphinxopts(), "--no-color", "-c", str(DOCS), "-b", "html", str(src), str(out)
    ]
    env = {**os.environ, "NO_COLOR": "1"}  # messages are matched as plain text (xdist workers may force colour)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _sphinx_messages(log):
    """Sphinx's own warnings and errors (``path:line: WARNING: ...``), not the kernel's chatter."""
    return [line for line in log.splitlines() if re.search(r": (WARNING|ERROR|CRITICAL): ", line)]


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("good"))


def test_control_book_builds_cleanly(control):
    result, _ = control
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert _sphinx_messages(result.stderr) == []
    # A clean log: nothing that looks like a warning, from Sphinx, an extension or a kernel (ipykernel warns
    # about unencrypted TCP channels unless the kernel manager provisions keys: docs/_ext/chapter_execution.py).
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if WARNING_LINE.search(line)]
    assert warnings == [], warnings
    # Each chapter ran once: side by side before reading (given two cores), then MyST-NB took it from the cache.
    if (os.cpu_count() or 1) >= 2:
        assert "executing 2 notebooks on 2 cores" in result.stdout, result.stdout[-3000:]
        assert result.stdout.count("Using cached notebook") == 2, result.stdout[-3000:]
        assert "Executing notebook" not in result.stdout, result.stdout[-3000:]


def test_raising_cell_fails_naming_chapter_and_cell(tmp_path):
    # (The failing chapter is executed side by side with a good one first; MyST-NB then runs it again and reports.)
    result, src = _build(tmp_path, cell="1 / 0  # seeded failure")
    assert result.returncode != 0
    log = result.stderr
    # myst-nb names the chapter file, prints the failing cell's source and the exception.
    assert f"{src / 'chapters' / 'tiny.md'}: WARNING: Executing notebook failed" in log, log
    assert "1 / 0  # seeded failure" in log, log
    assert "ZeroDivisionError" in log, log


def test_broken_reference_fails_naming_chapter_and_line(tmp_path):
    result, src = _build(tmp_path, target="ch-does-not-exist", notebooks=0)
    assert result.returncode != 0
    messages = _sphinx_messages(result.stderr)
    expected = re.escape(str(src / "chapters" / "prose.md")) + r":6: WARNING: undefined label: 'ch-does-not-exist'"
    assert any(re.match(expected, line) for line in messages), result.stderr


def test_incremental_builds_keep_the_search_index_whole(tmp_path):
    # Left to itself, Sphinx rebuilds searchindex.js from the old file plus the pages it writes, and loses the
    # index entries (the API reference's objects) of every page it does not write; docs/conf.py prevents that.
    entry = "\n```{index} single: tiny index entry\n```\n\nIndexed.\n"
    result, src = _build(tmp_path, notebooks=0, target="ch-prose", prose=entry)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "_build" / "html"
    clean = (out / "searchindex.js").read_text()
    clean_page = (out / "index.html").read_text()
    assert "tiny index entry" in clean
    assert _run_sphinx(src, out).returncode == 0  # nothing changed: no page written
    assert (out / "searchindex.js").read_text() == clean
    os.utime(out / "index.html", (0, 0))  # an output older than its source: that page gets rewritten
    assert _run_sphinx(src, out).returncode == 0
    assert (out / "searchindex.js").read_text() == clean
    # The rewritten page links MathJax and MyST-NB's files exactly as the clean build's page did (the files are
    # in _static before any page is written: docs/_ext/early_assets.py).
    assert (out / "index.html").read_text() == clean_page


def test_wrong_docstring_example_fails_the_doctest_run(tmp_path):
    # Three scratch modules, one example each: two float outputs 0.5 % off the printed value, one too large and one
    # too small, that must fail, and the corrected example that must pass in the same run (so the failures are the
    # examples' fault, not the set-up's). 0.5 % lies inside scipy-doctest's default rtol of 1e-2 and, for the
    # `1.0` shown against a printed `1.005`, inside the tolerance of doctest's NUMBER flag (0.1 for one decimal):
    # neither may be in force.
    cases = (("scratch_high", "1.01"), ("scratch_low", "1.0"), ("scratch_right", "1.005"))  # double(0.5025) = 1.005
    for name, shown in cases:
        (tmp_path / f"{name}.py").write_text(
            textwrap.dedent(
                f'''\
                def double(x):
                    """Twice x.

                    Examples
                    --------
                    >>> from {name} import double
                    >>> double(0.5025)
                    {shown}
                    """
                    return 2 * x
                '''
            )
        )
    # The project's pytest configuration (doctest flags, --doctest-modules) applies: same rootdir/config file.
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
           "--rootdir", str(tmp_path), *(f"{name}.py" for name, _ in cases)]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout
    for name, shown in cases[:2]:
        assert f"FAILED {name}.py::{name}.double" in result.stdout, result.stdout
        assert re.search(rf"Expected:\s+{re.escape(shown)}\s+Got:\s+1\.005\n", result.stdout), result.stdout
    assert "2 failed, 1 passed" in result.stdout, result.stdout
