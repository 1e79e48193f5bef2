"""The book's reading budget, and the rule that measures it (docs/_ext/reading_time.py).

Part I, the newcomer's path, must read in at most ``PART_I_MINUTES`` minutes with no page over
``PART_I_PAGE_WORDS`` words of prose. The rule is the build's own (``reading``, ``shown_outputs``), applied here to
the page sources and to the doctrees of the built book (where MyST-NB keeps the executed outputs), in the order of
the landing page's toctrees, so the budget checked here is the time the pages show. Its weights are checked
against the timed readings they were fitted on.
"""

import os
import pickle
import re
from pathlib import Path

import pytest
from conftest import ext_module, require_built_book

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SITE = Path(os.environ.get("BOOK_SITE", DOCS / "_build" / "html"))

pytestmark = pytest.mark.docs


@pytest.fixture(scope="module")
def rt():
    return ext_module("reading_time", "sphinx")


PAGE = """---
file_format: mystnb
kernelspec:
  name: python3
---

(ch-x)=
# A title of four words

One two three {ref}`ch-x` and $x^2$ here.

$$
a + b = c
$$

$q \\cdot k$

```{code-cell} ipython3
print("these words are code")
```

:::{admonition} Exercise 1.1
Read this admonition.
:::

```{code-cell} ipython3
:tags: [hide-cell]

solution = "not counted"
```

```{glue:figure} fig
:name: f
A caption of five words.
```

```python
not prose either

but code
```
"""


def test_prose_is_text_outside_code_math_and_markup(rt):
    # Title 5 words ("#" is not a word), sentence 7 (a role and a stretch of inline math are one word each),
    # "Exercise 1.1" 2, "Read this admonition." 3, the caption 5.
    assert rt.prose_words(PAGE) == 5 + 7 + 2 + 3 + 5
    # One equation, one figure, the shown cell's line and the code block's two.
    assert rt.reading(PAGE) == rt.Reading(words=22, equations=1, figures=1, code_lines=3)


TABLE = "\n| a | b |\n|---|:-:|\n| 1 | 2 |\n| 3 | 4 |\n"
EXPLORABLE = '\n```{code-cell} ipython3\n:tags: [remove-input, explorable]\nshow("it")\n```\n'


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ("```{code-cell} ipython3\nprint", "```\nprint", {}),  # a plain code block: code still, not a cell
        ("$$\na + b = c\n$$", "a + b = c", dict(words=25, equations=0)),  # display math written as prose
        ("```{glue:figure} fig", "```{code-block} fig", dict(words=17, figures=0, code_lines=4)),  # caption: code
        ("[hide-cell]", "[]", dict(code_lines=4)),  # a shown solution counts
        ("Read this admonition.", "Read this admonition." + TABLE, dict(words=28, table_rows=3)),
        ("$q \\cdot k$", EXPLORABLE, dict(explorables=1)),  # an explorable, its hidden call not code
        ("```{code-cell} ipython3\n", "```{code-cell} ipython3\n:tags: [hide-input]\n", dict(code_lines=2)),
    ],
)
def test_the_count_sees_each_kind_of_markup(rt, old, new, changed):
    assert old in PAGE
    expected = dict(words=22, equations=1, figures=1, code_lines=3) | changed
    assert rt.reading(PAGE.replace(old, new)) == rt.Reading(**expected)


def test_a_folded_box_counts_its_title_only(rt):
    folded = (":::{admonition} Going deeper\n:class: dropdown\nSix words a reader may skip.\n\n$$\nx\n$$\n\n"
              "| a |\n|---|\n\n```{glue:figure} g\nA caption.\n```\n:::\n")
    shown = folded.replace(":class: dropdown\n", "")
    assert rt.reading("Before it.\n\n" + folded + "\nAfter it.\n") == rt.Reading(words=2 + 2 + 2)
    assert rt.reading("Before it.\n\n" + shown + "\nAfter it.\n") == rt.Reading(
        words=2 + 2 + 6 + 1 + 2 + 2, equations=1, figures=1, table_rows=1)
    nested = folded.replace("Six words", "::::{note}\nInner words here.\n::::\nSix words")
    assert rt.prose_words(nested) == 2


def _cell(tags=(), hide_mode=None, outputs=()):
    """A code cell as MyST-NB puts it in the doctree at doctree-read: source, then its outputs."""
    from docutils import nodes

    cell = nodes.container(nb_element="cell_code", cell_metadata={"tags": list(tags)}, classes=["cell"])
    if hide_mode:
        cell["hide_mode"] = hide_mode
    cell += nodes.container("", nodes.literal_block("x = 1", "x = 1"), nb_element="cell_code_source")
    if outputs:
        cell += nodes.container("", *outputs, nb_element="cell_code_output")
    return cell


def _stream(lines):
    from docutils import nodes

    text = "\n".join(f"line {i}" for i in range(lines))
    return nodes.literal_block(text, text, classes=["output", "stream"])


def _bundle(*kinds):
    from docutils import nodes

    parts = [nodes.container("", nodes.literal_block("a\nb", "a\nb"), mime_type=kind) for kind in kinds]
    return nodes.container("", *parts, nb_element="mime_bundle")


def test_shown_outputs_counts_lines_and_figures_that_are_not_folded(rt):
    from docutils import nodes
    from docutils.utils import new_document

    doctree = new_document("page")
    doctree += _cell(outputs=[_stream(3), _bundle("text/plain")])  # 3 + 2 lines
    doctree += _cell(outputs=[_bundle("image/png", "text/plain")])  # a figure, its text not counted
    doctree += _cell(hide_mode="input", outputs=[_stream(4)])  # code hidden, output shown: 4 lines
    doctree += _cell(hide_mode="output", outputs=[_stream(50)])  # folded
    doctree += _cell(hide_mode="all", outputs=[_bundle("image/png")])  # a folded solution
    doctree += _cell(tags=["explorable"], outputs=[_bundle("text/html", "image/png")])  # counted from the source
    box = nodes.admonition("", nodes.title("Going deeper", "Going deeper"), classes=["dropdown"])
    box += _cell(outputs=[_stream(7)])
    doctree += box
    assert rt.shown_outputs(doctree) == rt.Outputs(lines=3 + 2 + 4, figures=1)
    assert rt.reading("", rt.Outputs(lines=9, figures=1)) == rt.Reading(output_lines=9, figures=1)


def test_the_line_names_only_what_the_page_has(rt):
    line = rt.line_text(rt.Reading(words=1200, code_lines=1))
    assert line == "Reading time: about 9 minutes (1,200 words of prose, 1 line of code)"
    assert "figure" not in line and "output" not in line
    assert rt.line_text(rt.Reading(figures=2, explorables=1)).endswith("(2 figures, 1 explorable)")


def test_minutes_follow_the_stated_rule(rt):
    page = rt.Reading(words=100, equations=2, figures=3, code_lines=10, output_lines=4, table_rows=5,
                      explorables=1)
    seconds = rt.SECONDS
    expected = (100 * seconds["words"] + 2 * seconds["equations"] + 3 * seconds["figures"]
                + 10 * seconds["code_lines"] + 4 * seconds["output_lines"] + 5 * seconds["table_rows"]
                + seconds["explorables"])
    assert page.minutes == pytest.approx(expected / 60)
    assert rt.minutes_text(0.2) == "about 1 minute"
    assert rt.minutes_text(12.49) == "about 12 minutes"
    assert rt.minutes_text(12.5) == "about 13 minutes"
    rule = rt.rule_text()
    for name, value in seconds.items():
        assert f"{value:g} s per {rt._NAMES[name][0]}" in rule


# -- The calibration ----------------------------------------------------------------------------------------


def _three_figures(value):
    return float(f"{value:.3g}")


def test_the_weights_are_the_fit_of_the_timed_readings(rt):
    fitted = rt.calibrate()
    assert {name: _three_figures(value) for name, value in fitted.items()} == rt.SECONDS
    assert all(value > 0 for value in fitted.values())


def test_the_rule_meets_every_timed_page_within_15_percent(rt):
    errors = {}
    for page, (counts, times) in rt.CALIBRATION.items():
        mean = sum(times) / len(times)
        errors[page] = (rt.Reading(*counts).minutes - mean) / mean
    assert len(errors) == 12
    assert max(abs(e) for e in errors.values()) <= 0.15, errors


def test_the_calibration_check_can_fail(rt):
    # Readers twice as slow on one page: the fit moves, and the weights no longer match it.
    slower = dict(rt.CALIBRATION)
    counts, times = slower["Worked example"]
    slower["Worked example"] = (counts, tuple(2 * t for t in times))
    refit = rt.calibrate(slower)
    assert {name: _three_figures(value) for name, value in refit.items()} != rt.SECONDS


# -- The budget ---------------------------------------------------------------------------------------------


def _parts(rt):
    return dict(rt.parts((DOCS / "index.md").read_text()))


def _part_one(rt):
    return next(pages for caption, pages in _parts(rt).items() if caption.startswith("Part I."))


def test_the_landing_page_has_both_parts_in_reading_order(rt):
    parts = _parts(rt)
    part_one = _part_one(rt)
    part_two = next(pages for caption, pages in parts.items() if caption.startswith("Part II."))
    assert part_one[:2] == ["chapters/big_picture", "chapters/01_queries_keys_values"]
    assert {"chapters/09_memory_wall", "chapters/frameworks", "chapters/performance"} <= set(part_two)
    assert not set(part_one) & set(part_two)
    for page in part_one + part_two:
        assert (DOCS / f"{page}.md").is_file(), page


def _budget_problems(rt, readings):
    """What breaks Part I's budget, for readings {page: Reading}: pages over the word limit, a total out of range."""
    problems = [f"{page}: {r.words} words of prose" for page, r in readings.items() if r.words > rt.PART_I_PAGE_WORDS]
    total = sum(r.minutes for r in readings.values())
    if total > rt.PART_I_MINUTES:
        problems.append(f"Part I reads in {total:.1f} minutes, more than {rt.PART_I_MINUTES}")
    return problems


def test_a_short_part_one_is_within_budget(rt):
    assert _budget_problems(rt, {"page": rt.Reading(words=200, code_lines=40)}) == []


@pytest.mark.parametrize(
    ("pages", "problem"),
    [
        ("calibration", "114.6 minutes"),  # Part I as the readers timed it
        ([(10_181, 0, 0, 0, 0, 0, 0)], "75.0 minutes"),  # just over the limit
        ([(1601, 0, 0, 0, 0, 0, 0)], "1601 words"),  # one page over the word limit
    ],
)
def test_the_budget_check_can_fail(rt, pages, problem):
    if pages == "calibration":
        pages = [counts for counts, _ in rt.CALIBRATION.values()]
    readings = {f"page{i}": rt.Reading(*counts) for i, counts in enumerate(pages)}
    problems = _budget_problems(rt, readings)
    assert any(problem in p for p in problems), problems


@pytest.fixture(scope="module")
def built(rt):
    """Part I's pages as the built book shows them: {page: (Reading, the line under its title)}."""
    site = require_built_book(SITE)
    doctrees = site.parent / "doctrees"
    found = {}
    for page in _part_one(rt):
        with open(doctrees / f"{page}.doctree", "rb") as file:
            doctree = pickle.load(file)
        reading = rt.reading((DOCS / f"{page}.md").read_text(), rt.shown_outputs(doctree))
        html = (site / f"{page}.html").read_text(encoding="utf-8")
        found[page] = reading, re.search(r'<p class="reading-time">([^<]*)</p>', html)[1]
    return found


def test_part_one_keeps_to_its_budget(rt, built):
    readings = {page: reading for page, (reading, _) in built.items()}
    assert len(readings) == 12
    assert not _budget_problems(rt, readings)


def test_every_page_shows_the_reading_the_rule_gives(rt, built):
    for page, (reading, line) in built.items():
        assert line == rt.line_text(reading), page
    assert sum(reading.output_lines for reading, _ in built.values()) > 0  # the executed outputs were found


def test_the_landing_page_states_part_ones_total(rt, built):
    total = sum(reading.minutes for reading, _ in built.values())
    html = (SITE / "index.html").read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", "", html)
    assert f"Part I. Attention: 12 pages, {rt.minutes_text(total)}" in text


def test_every_part_one_page_says_what_it_teaches_and_sums_up(rt):
    problems = []
    for page in _part_one(rt):
        text = (DOCS / f"{page}.md").read_text()
        title = text.index("\n# ")
        first = text[title + 1 :].split("\n\n")[1]  # the paragraph after the title
        if not first.startswith("**On this page** you will"):
            problems.append(f"{page}: opens with {first[:60]!r}, not with what the reader will learn")
        if "\n## Summary\n" not in text:
            problems.append(f"{page}: no Summary section")
    assert problems == []
