"""The committed framework record still matches a live run of each page's own code, and reads the same.

Where PyTorch or JAX is missing (``make docs`` and Read the Docs install neither), the pages that compare the
package with them take the frameworks' results from ``docs/chapters/frameworks_record.json`` instead
(``attention_ref.records.FrameworkRecord``, one section per page). For every such page this test runs the page's
code cells, as a script, against the installed frameworks with ``FRAMEWORKS_RECORD`` pointing at a scratch file,
and compares what that live run records with the committed section: the same cases and results, strings word for
word, and every number within a factor of ten of the recorded one (rounding differs between machines and BLAS
builds; a changed convention moves a difference by many orders of magnitude). It also runs each page with the
frameworks hidden, as under ``make docs``, and checks it prints what the live run printed.

Without torch, jax or transformers the live checks skip locally and fail in CI (``require``). The pages also import
``IPython.display`` and ``myst_nb`` (the book's display layer, in the ``docs`` extra, not the ``test`` one): where
they are missing the script runs with stand-ins that print what the page would display (see ``STAND_INS``). To
renew the record after a deliberate change, run ``python tests/test_frameworks_record.py`` (every page's live run
writes its section).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "docs" / "chapters"
RECORD = CHAPTERS / "frameworks_record.json"
FLOOR = 2.0**-52  # differences below float64 epsilon count as equal

_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
# A page that reads the record names its section and the frameworks it needs: FrameworkRecord("page", ..., needs=...).
_USES_RECORD = re.compile(r"FrameworkRecord\(\s*\"([^\"]+)\"")


def recorded_pages():
    """{section: page file} for every page of the book that reads the record."""
    pages = {}
    for path in sorted((ROOT / "docs").rglob("*.md")):
        if "_build" not in path.parts:
            for section in _USES_RECORD.findall(path.read_text(encoding="utf-8")):
                pages[section] = path
    return pages


PAGES = recorded_pages()


def page_code(text):
    """The code cells of a MyST-NB page joined into one script (cell options, ``:key: value`` lines, dropped)."""
    cells = []
    for body in _CELL.findall(text):
        lines = body.splitlines()
        while lines and lines[0].startswith(":"):
            lines.pop(0)
        cells.append("\n".join(lines))
    return "\n\n".join(cells) + "\n"


#: Where IPython or myst-nb is missing, ``display(Markdown(text))`` and ``glue(name, value)`` print (glue only
#: when it would display), as a chapter's glue does without myst-nb; the page's computations are untouched.
STAND_INS = """\
import importlib.util, sys, types
if importlib.util.find_spec("IPython") is None:
    _display = types.ModuleType("IPython.display")
    _display.Markdown, _display.display = str, print
    sys.modules["IPython"], sys.modules["IPython.display"] = types.ModuleType("IPython"), _display
if importlib.util.find_spec("myst_nb") is None:
    _myst_nb = types.ModuleType("myst_nb")
    _myst_nb.glue = lambda name, value, display=True: print(value) if display else None
    sys.modules["myst_nb"] = _myst_nb
"""


def run_page(page, target=None, *, hide_frameworks=False, hide=()):
    """Run the page's code in a fresh interpreter, in its folder as the book does; return what it printed.

    With `target`, the live run records its section there. With `hide_frameworks`, torch, jax and transformers look
    uninstalled (``find_spec`` returns None for a module set to None in ``sys.modules``), as under ``make docs``;
    the modules named in `hide` look uninstalled in the same way.
    """
    env = {**os.environ, "MPLBACKEND": "Agg", "JAX_PLATFORMS": "cpu"}
    env.pop("FRAMEWORKS_RECORD", None)
    if target is not None:
        env["FRAMEWORKS_RECORD"] = str(target)
    hidden = [*hide, *(("torch", "jax", "transformers") if hide_frameworks else ())]
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in hidden) + STAND_INS
    result = subprocess.run(
        [sys.executable, "-c", prelude + page_code(page.read_text(encoding="utf-8"))],
        cwd=page.parent, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, f"{page.name}'s code failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.stderr == "", f"{page.name}'s code wrote to stderr (the book build would fail):\n{result.stderr}"
    return result.stdout


def _differ(recorded, live):
    """Whether two recorded values differ beyond rounding: numbers by more than a factor of ten."""
    if isinstance(recorded, float) and isinstance(live, float):
        if math.isnan(recorded) or math.isnan(live):
            return math.isnan(recorded) != math.isnan(live)
        return abs(math.log10(max(abs(recorded), FLOOR)) - math.log10(max(abs(live), FLOOR))) > 1
    if isinstance(recorded, list) and isinstance(live, list):
        return len(recorded) != len(live) or any(_differ(a, b) for a, b in zip(recorded, live, strict=True))
    return type(recorded) is not type(live) or recorded != live


def mismatches(recorded, live):
    """What differs between two sections of the record, as readable lines (versions are reported, not compared)."""
    problems = []
    if recorded["cases"].keys() != live["cases"].keys():
        return [f"cases differ: recorded {sorted(recorded['cases'])}, live {sorted(live['cases'])}"]
    for case, results in recorded["cases"].items():
        now = live["cases"][case]
        if results.keys() != now.keys():
            problems.append(f"{case}: comparisons differ: recorded {sorted(results)}, live {sorted(now)}")
            continue
        problems += [f"{case} / {who}: recorded {value!r}, live {now[who]!r}"
                     for who, value in results.items() if _differ(value, now[who])]
    return problems


@pytest.fixture(scope="module")
def live_runs(tmp_path_factory):
    """{section: (what the page printed, the section it recorded)} from a live run of every page."""
    require("torch")
    require("jax")
    require("transformers")
    runs = {}
    for section, page in PAGES.items():
        target = tmp_path_factory.mktemp("record") / "record.json"
        printed = run_page(page, target)
        runs[section] = printed, json.loads(target.read_text(encoding="utf-8"))[section]
    return runs


def test_the_pages_that_read_the_record_are_found():
    assert {"frameworks", "frameworks_huggingface", "11_checking_your_implementation"} <= PAGES.keys()
    assert PAGES.keys() == json.loads(RECORD.read_text(encoding="utf-8")).keys(), "a section without its page"
    for page in PAGES.values():
        code = page_code(page.read_text(encoding="utf-8"))
        assert "save_if_requested()" in code and ":tags:" not in code and "```" not in code
        compile(code, str(page), "exec")


@pytest.mark.parametrize("section", sorted(PAGES))
def test_record_matches_a_live_run(section, live_runs):
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))[section]
    live = live_runs[section][1]
    problems = mismatches(recorded, live)
    versions = f"recorded with {recorded['versions']}, live with {live['versions']}"
    assert not problems, (
        f"{RECORD.name}'s section {section!r} no longer matches the page's live results ({versions}):\n"
        + "\n".join(problems)
        + "\nIf the change is intended, renew the record: python tests/test_frameworks_record.py"
    )


@pytest.mark.parametrize("section", sorted(PAGES))
def test_page_prints_the_same_from_the_record(section, live_runs):
    """The make-docs path: no torch, no jax; every check passes on the record and the page prints what it did live."""
    printed = run_page(PAGES[section], hide_frameworks=True)
    assert printed == live_runs[section][0], (
        f"{PAGES[section].name} prints differently from the record than live; renew the record if the live "
        "results changed: python tests/test_frameworks_record.py"
    )


def test_page_runs_with_only_the_test_extra():
    """Without IPython and myst-nb (the ``test`` extra has neither) the stand-ins let the page's code run and print
    what it would display."""
    printed = run_page(PAGES["frameworks"], hide_frameworks=True, hide=("IPython", "IPython.display", "myst_nb"))
    assert "torch SDPA" in printed  # the recorded PyTorch results, displayed by the stand-in
    assert "PyTorch" in printed and "<IPython" not in printed


def test_selftest_a_changed_record_is_caught():
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    for section in recorded.values():
        assert mismatches(section, section) == []
    frameworks = recorded["frameworks"]
    changed = json.loads(json.dumps(frameworks))
    changed["cases"]["plain"]["torch SDPA"] = 1e-3
    changed["cases"]["no_key"]["torch SDPA"] = "NaN"
    problems = mismatches(frameworks, changed)
    assert len(problems) == 2 and "plain / torch SDPA" in problems[0] and "'NaN'" in problems[1], problems
    del changed["cases"]["gqa"]
    assert "cases differ" in mismatches(frameworks, changed)[0]
    # A section as the softmax chapter once recorded it: strings and numbers are reported as they read.
    softmax = {"cases": {"empty_row": {"torch.softmax": "NaN", "torch SDPA": "zeros", "query 0": 2.2e-16}}}
    changed = json.loads(json.dumps(softmax))
    changed["cases"]["empty_row"]["torch SDPA"] = "not zeros: [nan, nan]"
    changed["cases"]["empty_row"]["query 0"] = 1e-9
    assert mismatches(softmax, changed) == [
        "empty_row / torch SDPA: recorded 'zeros', live 'not zeros: [nan, nan]'",
        f"empty_row / query 0: recorded {softmax['cases']['empty_row']['query 0']!r}, live 1e-09"]
    assert _differ([1.0, 2.0], [1.0, 200.0]) and not _differ([1.0, 2.0], [1.0, 3.0]) and _differ([1.0], [1.0, 1.0])


if __name__ == "__main__":  # renew the committed record from a live run of every page
    for section, page in PAGES.items():
        run_page(page, RECORD)
        versions = json.loads(RECORD.read_text(encoding="utf-8"))[section]["versions"]
        print(f"wrote {section!r} into {RECORD} with {versions}")
