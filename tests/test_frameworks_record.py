"""The committed record of docs/chapters/frameworks.md still matches a live run of the page's own code.

Where PyTorch or JAX is missing (``make docs`` installs neither), the page shows the framework results stored in
``docs/chapters/frameworks_record.json`` instead of running them. This test runs the page's code cells, as a
script, against the installed frameworks with ``FRAMEWORKS_RECORD`` pointing at a scratch file, and compares
what that live run writes with the committed record: the same cases, the same comparisons, the same behaviours
word for word, and every difference within a factor of ten of the recorded one (rounding differs between
machines and BLAS builds; a changed convention moves a difference by many orders of magnitude).

Without torch or jax it skips locally and fails in CI (``require``). The page also imports ``IPython.display`` and
``myst_nb`` (the book's display layer, in the ``docs`` extra, not the ``test`` one): where they are missing the
script runs with stand-ins that print what the page would display (see ``STAND_INS``); the results compared come
from the page's own computations either way. To renew the record after a deliberate
change, run the page's code with ``FRAMEWORKS_RECORD=docs/chapters/frameworks_record.json`` (``python
tests/test_frameworks_record.py`` does that).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import require

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "docs" / "chapters"
PAGE = CHAPTERS / "frameworks.md"
RECORD = CHAPTERS / "frameworks_record.json"
FLOOR = 2.0**-52  # differences below float64 epsilon count as equal

_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


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


def run_page(target=None, *, hide_frameworks=False, hide=()):
    """Run the page's code in a fresh interpreter, in docs/chapters/ as the book does; return what it printed.

    With `target`, the live run records its results there. With `hide_frameworks`, torch and jax look
    uninstalled (``find_spec`` returns None for a module set to None in ``sys.modules``), as under ``make docs``;
    the modules named in `hide` look uninstalled in the same way.
    """
    env = {**os.environ, "MPLBACKEND": "Agg", "JAX_PLATFORMS": "cpu"}
    env.pop("FRAMEWORKS_RECORD", None)
    if target is not None:
        env["FRAMEWORKS_RECORD"] = str(target)
    hidden = [*hide, *(("torch", "jax") if hide_frameworks else ())]
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in hidden) + STAND_INS
    result = subprocess.run(
        [sys.executable, "-c", prelude + page_code(PAGE.read_text(encoding="utf-8"))],
        cwd=CHAPTERS, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, f"the page's code failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.stderr == "", f"the page's code wrote to stderr (the book build would fail):\n{result.stderr}"
    return result.stdout


def mismatches(recorded, live):
    """What differs between two records, as readable lines (versions are reported, not compared)."""
    problems = []
    if recorded["cases"].keys() != live["cases"].keys():
        return [f"cases differ: recorded {sorted(recorded['cases'])}, live {sorted(live['cases'])}"]
    for case, results in recorded["cases"].items():
        now = live["cases"][case]
        if results.keys() != now.keys():
            problems.append(f"{case}: comparisons differ: recorded {sorted(results)}, live {sorted(now)}")
            continue
        for who, value in results.items():
            if isinstance(value, float) != isinstance(now[who], float):
                problems.append(f"{case} / {who}: recorded {value!r}, live {now[who]!r}")
            elif isinstance(value, float):
                if abs(math.log10(max(value, FLOOR)) - math.log10(max(now[who], FLOOR))) > 1:
                    problems.append(f"{case} / {who}: recorded {value:.1e}, live {now[who]:.1e}")
            elif value != now[who]:
                problems.append(f"{case} / {who}: recorded {value!r}, live {now[who]!r}")
    return problems


def test_page_code_is_the_page():
    code = page_code(PAGE.read_text(encoding="utf-8"))
    assert "def compare(case, run)" in code and "FRAMEWORKS_RECORD" in code
    assert ":tags:" not in code and "```" not in code
    compile(code, str(PAGE), "exec")


def test_record_matches_a_live_run(tmp_path):
    require("torch")
    require("jax")
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    run_page(tmp_path / "record.json")
    live = json.loads((tmp_path / "record.json").read_text(encoding="utf-8"))
    problems = mismatches(recorded, live)
    versions = f"recorded with {recorded['versions']}, live with {live['versions']}"
    assert not problems, (
        f"{RECORD.name} no longer matches the page's live results ({versions}):\n"
        + "\n".join(problems)
        + "\nIf the change is intended, renew the record: python tests/test_frameworks_record.py"
    )


def test_page_runs_from_the_record_without_frameworks():
    """The make-docs path: no torch, no jax; every check on the page passes on the record's results."""
    printed = run_page(hide_frameworks=True)
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))["versions"]
    assert f"PyTorch {recorded['torch']}, JAX {recorded['jax']}: the framework results below are recorded" in printed


def test_page_runs_with_only_the_test_extra():
    """Without IPython and myst-nb (the ``test`` extra has neither) the stand-ins let the page's code run and print
    what it would display."""
    printed = run_page(hide_frameworks=True, hide=("IPython", "IPython.display", "myst_nb"))
    assert "the framework results below are recorded" in printed
    assert "PyTorch" in printed and "<IPython" not in printed


def test_selftest_a_changed_record_is_caught():
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    assert mismatches(recorded, recorded) == []
    changed = json.loads(json.dumps(recorded))
    changed["cases"]["plain"]["torch SDPA"] = 1e-3
    changed["cases"]["no_key"]["torch SDPA"] = "NaN"
    problems = mismatches(recorded, changed)
    assert len(problems) == 2 and "plain / torch SDPA" in problems[0] and "'NaN'" in problems[1], problems
    del changed["cases"]["gqa"]
    assert "cases differ" in mismatches(recorded, changed)[0]


if __name__ == "__main__":  # renew the committed record from a live run
    run_page(RECORD)
    print(f"wrote {RECORD} with {json.loads(RECORD.read_text(encoding='utf-8'))['versions']}")
