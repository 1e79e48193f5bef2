"""Every glued number that the book states as a bound is rounded the safe way.

A page that says "the error is at most {glue:text}`err:.2f`" over a measured 1.6005 prints "at most 1.60", which
is false: MyST-NB's ``glue:text`` rounds to nearest. This test reads every page's source (prose only: code
cells are left out, captions and admonitions kept), finds each glued number that the words around it state as
a bound, and compares the number as the page shows it with the raw value it was glued from (the built
notebooks' ``<page>.glue.json`` beside ``docs/_build/html``):

* an **upper bound** ("at most", "below", "under", "less than", "never exceeds", "no more than", "within",
  "up to", "agree to", and after the number "or better", "or less", "or fewer") must show a number >= raw;
* a **lower bound** ("at least", "above", "over", "more than", "exceeds", and after the number "or more")
  must show a number <= raw.

A bound glued as a formatted string has no raw value to compare with and fails: glue the raw float. The
roles ``{glue:up}`` and ``{glue:down}`` (``docs/_ext/bounds.py``) round outward and so always pass when their
direction matches the words; a direction that disagrees with the words fails, unless the glued value is a
*threshold* listed in `THRESHOLDS` ("float16 overflows above 11.09": true only if 11.09 is at or above the
threshold, so the words' "above" asks for rounding up). Every shown number must also appear in the built
page, so the test reads what the reader reads. Self-tests run the check on snippets that must fail, and the
test asserts it found a reasonable number of bounds, so it cannot pass by finding none.
"""

from __future__ import annotations

import doctest
import json
import math
import os
import re
import sys
from ast import literal_eval
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import EXT, require_built_book

sys.path.insert(0, str(EXT))
import bounds
from bounds import DOWN, UP, format_outward

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SITE = Path(os.environ.get("BOOK_SITE", DOCS / "_build" / "html"))
GLUE = SITE.parent / "jupyter_execute"

pytestmark = pytest.mark.docs

# The fewest bounds the book states: a scanner that finds fewer has broken, not the book improved.
MIN_BOUNDS = 25

# Glued thresholds: "X happens above T" is true when T is at or above the true threshold, so the shown value
# must round up although the word is "above" (and down for "X happens below T"). page -> {glue name: reason}.
THRESHOLDS: dict[str, dict[str, str]] = {
    "chapters/low_precision": {
        "lp_f16_logmax": "float16's e^x overflows for every x above the shown value",
        "lp_bf16_logmax": "bfloat16's e^x overflows for every x above the shown value",
        "lp_fmin_over": "adding any score of minus the shown value or less to finfo.min gives -inf",
    },
    "chapters/10_common_mistakes": {
        "ch10_lim16": "float16 overflows for every logit above the shown value",
        "ch10_lim32": "float32 overflows for every logit above the shown value",
    },
}

_ROLE = re.compile(r"\{glue(?::(?P<role>text|up|down|any|md))?\}`(?P<body>[^`]*)`")
_FILLER = r"(?:\s+(?:only|just|of|by|a|an|to|about|roughly|around))*"  # "at most about 0.14" is a bound
_UPPER_BEFORE = (
    r"at\s+most|below|under|less\s+than|fewer\s+than|smaller\s+than|lower\s+than|never\s+exceeds?"
    r"|does\s+not\s+exceed|do\s+not\s+exceed|no\s+more\s+than|no\s+larger\s+than|no\s+worse\s+than|within"
    r"|(?<!add\s)(?<!adds\s)(?<!sum\s)(?<!sums\s)(?<!added\s)up\s+to|agrees?\s+to|agreeing\s+to|bounded\s+by"
    r"|≤|&le;|\\le|\\leq|<"
)
_LOWER_BEFORE = (
    r"at\s+least|above|over|more\s+than|greater\s+than|larger\s+than|higher\s+than|exceeds?|exceeding"
    r"|no\s+less\s+than|no\s+fewer\s+than|≥|&ge;|\\ge|\\geq|>"
)
_BEFORE = re.compile(
    rf"(?<![\w-])(?:(?P<upper>{_UPPER_BEFORE})|(?P<lower>{_LOWER_BEFORE})){_FILLER}\s*(?P<sign>\$-\$|−|-)?\s*$",
    re.IGNORECASE,
)
_AFTER = re.compile(
    r"^\s*(?:[^\s.,;:]+\s+)?(?:(?P<upper>or\s+(?:better|less|fewer|lower|smaller|below))"
    r"|(?P<lower>or\s+(?:more|above|higher|greater|larger|over)))\b",
    re.IGNORECASE,
)
# A negation just before the bound's words turns it around: "no weight exceeds 0.14" is an upper bound.
_NEGATED = re.compile(r"\b(?:no|not|never|none|nothing)\b(?:\s+[\w-]+){0,2}\s*$", re.IGNORECASE)
# A pre-formatted string that holds a number: "3e-16", "1.05", "4.2 MiB", "12%".
_NUMBER_STRING = re.compile(r"^\s*[-−+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?\s*(?:%|[A-Za-z]{0,4})\s*$")
_SIGN = re.compile(r"(?:\$-\$|−|(?<![\w-])-)\s*$")  # a minus typed before the glued magnitude: "$-$16"
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")


@dataclass
class Bound:
    page: str
    line: int
    name: str
    role: str  # text, up or down
    spec: str
    direction: str  # UP: shown must be >= raw; DOWN: shown must be <= raw
    phrase: str
    raw: object
    shown: str | None
    problem: str | None


def prose(source: str) -> str:
    """The page's source with code cells and code blocks blanked (their lines kept, for line numbers).

    A fence with an info string opens a block (a directive such as ``{figure}`` keeps its text, any other is
    code); a bare fence closes the innermost open block, or opens a code block when none is open."""
    out, stack = [], []  # stack: (fence, is_code)
    for line in source.split("\n"):
        match = _FENCE.match(line)
        if match:
            info = match[2].strip()
            if not info and stack and match[1].startswith(stack[-1][0]):
                stack.pop()
            else:
                is_code = not info.startswith("{") or info.startswith("{code-cell}")
                stack.append((match[1], is_code))
            out.append("")
            continue
        out.append("" if any(code for _, code in stack) else re.sub(r"<!--.*?-->", "", line))
    return "\n".join(out)


def shown_number(text: str) -> float:
    """The number a reader sees in `text` ("1,234", "3.5e-04", "12.5%", "−3")."""
    text = text.replace(",", "").replace("−", "-").strip()
    if text.endswith("%"):
        return float(text[:-1]) / 100
    return float(text)


def find_bounds(source: str, glue: dict, page: str) -> list[Bound]:
    """Every glued number in `source`'s prose that its words state as a bound, with the shown value checked."""
    text = prose(source)
    found = []
    for match in _ROLE.finditer(text):
        before = _BEFORE.search(text[max(0, match.start() - 80): match.start()])
        after = _AFTER.search(text[match.end(): match.end() + 60])
        kinds = {k for m in (before, after) if m for k in ("upper", "lower") if m[k]}
        if not kinds:
            continue
        role, body = match["role"] or "any", match["body"]
        name, _, spec = body.rpartition(":") if ":" in body.replace("::", "") else (body, "", "")
        phrase = (before[0] if before else "") + "…" + (after[0] if after else "")
        where = text.count("\n", 0, match.start()) + 1
        if len(kinds) == 2:
            found.append(Bound(page, where, name, role, spec, UP, phrase, None, None,
                               f"both an upper and a lower bound in {phrase!r}: reword"))
            continue
        direction = UP if "upper" in kinds else DOWN
        if before and _NEGATED.search(text[max(0, match.start() - 120): match.start() - len(before[0])]):
            direction = DOWN if direction == UP else UP  # "no weight exceeds", "never below"
        negative = bool(_SIGN.search(text[max(0, match.start() - 4): match.start()]))
        if name in THRESHOLDS.get(page, {}):
            direction = DOWN if direction == UP else UP
        found.append(check(Bound(page, where, name, role, spec, direction, phrase, None, None, None), glue, negative))
    return found


def check(bound: Bound, glue: dict, negative: bool = False) -> Bound:
    """Fill in the raw and shown values of `bound`, and its problem if the shown number is on the unsafe side."""
    if "::" in bound.name:
        bound.problem = "a bound glued from another page (page::name): glue it on this page"
        return bound
    if bound.role not in ("text", "up", "down"):
        bound.problem = f"a bound printed by {{glue:{bound.role}}}: use glue:text, glue:up or glue:down"
        return bound
    if bound.name not in glue:
        bound.problem = f"no glued value {bound.name!r} in the built notebook"
        return bound
    plain = glue[bound.name].get("data", {}).get("text/plain", "")
    try:
        raw = literal_eval(plain)
    except (SyntaxError, ValueError):
        raw = plain
    bound.raw = raw
    if isinstance(raw, str) or isinstance(raw, bool) or not isinstance(raw, (int, float)):
        if isinstance(raw, str) and not _NUMBER_STRING.match(raw):
            bound.problem = None  # words, not a number: "above {glue:text}`record`"
            bound.shown = raw
            return bound
        bound.problem = f"a bound glued as {plain!r}, not a number: glue the raw value and format it in the role"
        return bound
    if bound.role == "text":
        from myst_nb.core.variables import format_plain_text

        bound.shown = format_plain_text(plain, bound.spec or "")
    else:
        # A magnitude after a typed minus rounds the other way: "-17 or less" needs the magnitude rounded up.
        needed = bound.direction if not negative else (DOWN if bound.direction == UP else UP)
        if bound.role != needed:
            bound.problem = (f"{{glue:{bound.role}}} where the words ({bound.phrase!r}) state a bound that needs "
                             f"{{glue:{needed}}}")
        bound.shown = format_outward(raw, bound.spec, bound.role)
    shown = shown_number(bound.shown)
    value, shown_value = (-raw, -shown) if negative else (raw, shown)
    if math.isnan(raw):
        bound.problem = bound.problem or "a bound glued as NaN"
    elif bound.direction == UP and shown_value < value:
        bound.problem = bound.problem or (f"upper bound {bound.phrase!r} shows {bound.shown} below the raw {raw!r}: "
                                          f"use {{glue:up}}`{bound.name}:{bound.spec}`")
    elif bound.direction == DOWN and shown_value > value:
        bound.problem = bound.problem or (f"lower bound {bound.phrase!r} shows {bound.shown} above the raw {raw!r}: "
                                          f"use {{glue:down}}`{bound.name}:{bound.spec}`")
    return bound


# -- the built book ------------------------------------------------------------------------------------------------


def _pages():
    for path in sorted(DOCS.rglob("*.md")):
        relative = path.relative_to(DOCS)
        if relative.parts[0].startswith("_"):
            continue
        source = path.read_text(encoding="utf-8")
        if "{glue" in source:
            yield relative.with_suffix("").as_posix(), source


def _built_glue(page):
    path = GLUE / f"{page}.glue.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@pytest.fixture(scope="module")
def book_bounds():
    require_built_book(SITE)
    found = []
    for page, source in _pages():
        found.extend(find_bounds(source, _built_glue(page), page))
    return found


def test_every_bound_is_rounded_the_safe_way(book_bounds):
    numeric = [b for b in book_bounds if not isinstance(b.raw, str) or b.problem]
    assert len(numeric) >= MIN_BOUNDS, f"found only {len(numeric)} glued bounds: the scanner has broken"
    problems = [f"docs/{b.page}.md:{b.line}: {b.problem}" for b in book_bounds if b.problem]
    assert not problems, f"{len(problems)} bounds rounded the unsafe way:\n" + "\n".join(problems)


def test_every_shown_bound_is_on_its_page(book_bounds):
    """The shown values computed here are the ones the built pages print (so this test reads the site)."""
    missing, checked = [], 0
    for bound in book_bounds:
        if bound.shown is None or isinstance(bound.raw, str):
            continue
        checked += 1
        html = (SITE / f"{bound.page}.html").read_text(encoding="utf-8")
        if not re.search(f'class="pasted-text[^"]*">{re.escape(bound.shown)}<', html):  # glued_numbers adds a class
            missing.append(f"docs/{bound.page}.md:{bound.line}: {bound.name} shown as {bound.shown!r}")
    # As many as the book states (a bound with no shown value has a problem the test above reports).
    assert checked == sum(isinstance(b.raw, (int, float)) and b.shown is not None for b in book_bounds)
    assert checked >= MIN_BOUNDS, f"checked only {checked} shown bounds against their pages: the scanner has broken"
    assert not missing, "bounds not found in the built page as computed:\n" + "\n".join(missing)


def test_thresholds_are_still_bounds():
    """Each listed threshold is still glued as a bound on its page: the list cannot go stale."""
    stale = []
    for page, names in THRESHOLDS.items():
        source = (DOCS / f"{page}.md").read_text(encoding="utf-8")
        bounds = {b.name for b in find_bounds(source, {}, page)}
        stale += [f"{page}: {name}" for name in names if name not in bounds]
    assert not stale, "THRESHOLDS lists glued values that no page states as a bound:\n" + "\n".join(stale)


# -- self-tests -------------------------------------------------------------------------------------------------------


def _glue(**values):
    return {name: {"data": {"text/plain": repr(value)}} for name, value in values.items()}


@pytest.mark.parametrize(
    ("snippet", "values"),
    [
        ("The error is at most {glue:text}`e:.2f` of the scale.", {"e": 1.6005}),
        ("Every row agrees to\n{glue:text}`e:.0e` or better.", {"e": 3.3e-16}),
        ("The peak never exceeds\n{glue:text}`t:.1f` tiles.", {"t": 2.815}),
        ("Each weight is at least {glue:text}`w:.2f` on the match.", {"w": 0.4675}),
        ("The two agree to {glue:text}`d`: the same sum.", {"d": "3e-16"}),
        ("The shift is at most {glue:down}`e:.2f` here.", {"e": 1.6005}),
        ("Off by no more than {glue:text}`e:.0%`.", {"e": 0.0149}),
        ("```{code-cell} ipython3\nx = 1\n```\nBelow {glue:text}`e:.1e`, always.", {"e": 3.54e-4}),
        ("No weight exceeds {glue:text}`w:.2f`.", {"w": 0.1336}),  # a negated lower bound's words: an upper bound
        ("No weight exceeds {glue:down}`w:.2f`.", {"w": 0.1336}),
        ("The error is at most about {glue:text}`e:.2f`.", {"e": 1.6005}),
        ("The log-weight is at most {glue:text}`l:.2f`.", {"l": -0.1364}),  # a negative value, to nearest: -0.14
        ("The log-weight is at least {glue:up}`l:.2f`.", {"l": -0.1336}),
    ],
)
def test_an_unsafe_bound_fails(snippet, values):
    found = find_bounds(snippet, _glue(**values), "snippet")
    assert found and all(bound.problem for bound in found), found


@pytest.mark.parametrize(
    ("snippet", "values"),
    [
        ("The error is at most {glue:up}`e:.2f` of the scale.", {"e": 1.6005}),
        ("Each weight is at least {glue:down}`w:.2f` on the match.", {"w": 0.4675}),
        ("The error is at most {glue:text}`e:.2f` of the scale.", {"e": 1.6}),
        ("A sum over {glue:text}`n` keys.", {"n": 128}),
        ("The PyTorch results above {glue:text}`r`.", {"r": "ran live with PyTorch"}),
        ("```{code-cell} ipython3\nprint('at most', 1)\n```\nit is {glue:text}`e:.2f`.", {"e": 1.6005}),
        ("which add up to {glue:text}`z:.4f`.", {"z": 0.99996}),
        ("No weight exceeds {glue:up}`w:.2f`.", {"w": 0.1336}),
        ("The error is at most about {glue:up}`e:.2f`.", {"e": 1.6005}),
        ("The log-weight is at most {glue:up}`l:.2f`.", {"l": -0.1364}),  # -0.13
        ("The log-weight is at least {glue:down}`l:.2f`.", {"l": -0.1336}),  # -0.14
        ("Off by at most {glue:up}`e:.1%`.", {"e": 0.0131}),  # 1.4%
    ],
)
def test_a_safe_bound_passes(snippet, values):
    found = find_bounds(snippet, _glue(**values), "snippet")
    assert not [bound for bound in found if bound.problem], found


def test_the_bound_formatting_doctests_pass():
    """docs/_ext is outside pytest's doctest paths: its examples (negative values, percents) run here."""
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(verbose=False)
    for test in finder.find(bounds):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, result
    assert result.attempted >= 9, result  # they cannot pass by being lost


def test_the_scanner_finds_bounds_across_lines_and_markup():
    snippet = "The float16 error is flat and below\n{glue:text}`a:.2f` $\\varepsilon$, and over {glue:text}`b:.1f`."
    found = find_bounds(snippet, _glue(a=0.4625, b=2.04), "snippet")
    assert [(b.name, b.direction, bool(b.problem)) for b in found] == [("a", UP, True), ("b", DOWN, False)]


def test_a_threshold_rounds_the_other_way():
    snippet = "Float16 overflows for logits above {glue:text}`ch10_lim16:.2f`."
    unsafe = find_bounds(snippet, _glue(ch10_lim16=11.0906), "chapters/10_common_mistakes")
    safe = find_bounds(snippet.replace("text", "up"), _glue(ch10_lim16=11.0906), "chapters/10_common_mistakes")
    assert unsafe[0].problem and not safe[0].problem, (unsafe, safe)
