"""The explorable figures (docs/_ext/explorables/: the machinery in ``widgets``, one module per page's figures;
docs/_static/explorables.js).

Without a browser: each figure's table of states holds, for every setting of its controls, what attention_ref
gives for that setting (recomputed here from the definitions: scores, additive 0 / -inf, softmax), and a
downloaded notebook gets the still image in place of the cell that imports the module.

In the built book (marked ``browser``, Chromium as in tests/test_site.py): moving each control shows the values
attention_ref gives for the new setting, the controls work from the keyboard, every change is announced in the
figure's status line, and axe finds no violation with the figures in changed states, in both colour modes.
"""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ext_module, require
from test_site import SITE, _axe_in_each_mode, _missing, _switch_mode, site, visit  # noqa: F401 (the fixtures)

import attention_ref as ar

ROOT = Path(__file__).resolve().parents[1]
MINUS_INF = "\u2212\u221e"


@pytest.fixture(scope="module")
def ex():
    """The package, as the chapters and notebook_download import it."""
    return ext_module("explorables", "matplotlib")


def _submodule(name):
    """A fixture: the package's module `name` (``widgets``, or one page's figures)."""

    @pytest.fixture(scope="module", name=name)
    def module(ex):
        return getattr(ex, name)

    return module


widgets, scaling, masks, windows, lookup = map(_submodule, ["widgets", "scaling", "masks", "windows", "lookup"])


def _data(explorable):
    """The JSON table of states in an explorable's HTML."""
    html = explorable._repr_mimebundle_()[0]["text/html"]
    start = html.index('<script type="application/json" class="ex-data">') + len(
        '<script type="application/json" class="ex-data">')
    return json.loads(html[start:html.index("</script>", start)].replace("<\\/", "</"))


def _texts(grid):
    return [[cell[0] for cell in row] for row in grid]


def _formatted(weights):
    """Weights as the figures write them: two decimals, and 0 for an exact zero."""
    return [["0" if w == 0 else f"{w:.2f}" for w in row] for row in np.atleast_2d(weights)]


def _expected_masks(masks, n_queries, causal, alignment, window, length=6):
    """Additive mask and weights of one setting, from the definitions (not from the figure's own code)."""
    q, k, _ = masks.mask_problem()
    n_keys = k.shape[0]
    rows, cols = np.arange(n_queries)[:, None], np.arange(n_keys)[None, :]
    position = rows + (n_keys - n_queries if alignment == "bottom-right" else 0)  # p_i
    allowed = (cols < length) & (rows >= 0)  # (L, S)
    if causal:
        allowed = allowed & (cols <= position)
    if window != "none":
        allowed = allowed & (np.abs(cols - position) <= int(window))
    bias = np.where(allowed, 0.0, -np.inf)
    scores = q[n_keys - n_queries:] @ k.T / np.sqrt(q.shape[1])
    with np.errstate(invalid="ignore"):
        weights = ar.softmax(scores + bias)  # fully masked rows: zeros (the package's convention)
    return [["0" if ok else MINUS_INF for ok in row] for row in allowed], _formatted(weights), allowed


def _expected_inspector(masks, causal, length, pad_queries):
    """Chapter 5's inspector, one setting: additive mask, weights with each row's sum, and the allowed pairs."""
    q, k, _ = masks.mask_problem()
    n = k.shape[0]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = (j < length) & (i >= 0)
    if causal:
        allowed = allowed & (j <= i)
    if pad_queries:
        allowed = allowed & (i < length)
    with np.errstate(invalid="ignore"):
        weights = ar.softmax(q @ k.T / np.sqrt(q.shape[1]) + np.where(allowed, 0.0, -np.inf))
    sums = weights.sum(axis=-1)
    shown = [[*row, "0" if total == 0 else f"{total:.2f}"] for row, total in zip(_formatted(weights), sums,
                                                                                   strict=True)]
    return [["0" if ok else MINUS_INF for ok in row] for row in allowed], shown, allowed


# -- The tables of states ------------------------------------------------------------------------------------


def test_each_figure_is_html_and_a_still_png_with_alt_text(widgets, scaling, masks, windows, lookup):
    q = np.eye(3)
    figures = [scaling.scaling_selector(), masks.mask_inspector(), masks.padding_batch(),
               lookup.lookup_terms(q, q[:, :2], "abc", q, "xyz"), windows.alignment_inspector()]
    for figure in figures:
        data, metadata = figure._repr_mimebundle_()
        assert data["text/html"].startswith('<figure class="explorable"')
        assert base64.b64decode(data["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")
        assert len(metadata[widgets.METADATA_KEY]["alt"]) > 80
        table = _data(figure)
        assert table["default"] in table["states"]
        # Every key is one value per control, in the order the script joins them.
        assert all(len(key.split("|")) == len(table["order"]) for key in table["states"])
    assert len(_data(figures[0])["states"]) == len(scaling.SCALING_HEAD_SIZES) == 3
    assert len(_data(figures[1])["states"]) == 2 * 4 * 2  # causal, real tokens, padding queries masked
    assert len(_data(figures[4])["states"]) == 2 * 2 * 2 * 3  # queries, causal, alignment, window


def test_the_machinery_is_one_module_and_each_pages_figures_another(ex, widgets, scaling, masks, windows, lookup):
    """widgets alone writes the script's JSON, the Sphinx hook and the notebook side; a figure module builds from
    its pieces, so a new figure touches neither widgets nor the package's __init__."""
    folder = Path(widgets.__file__).parent
    figure_modules = sorted(p.stem for p in folder.glob("*.py") if p.stem not in {"__init__", "widgets"})
    assert figure_modules == ["lookup", "masks", "scaling", "windows"]
    machinery = Path(widgets.__file__).read_text()
    for name in figure_modules:
        source = (folder / f"{name}.py").read_text()
        assert "from . import widgets" in source, name
        for piece in ("<script", "json.dumps", "def setup", "add_js_file", "<figure", "<option"):
            assert piece not in source, (name, piece)
        assert f"{name}." not in machinery and f".{name} " not in machinery, name
    # The names the chapters import from the package are the figure modules' own.
    assert ex.scaling_selector is scaling.scaling_selector and ex.lookup_terms is lookup.lookup_terms
    assert ex.mask_inspector is masks.mask_inspector and ex.padding_batch is masks.padding_batch
    assert ex.alignment_inspector is windows.alignment_inspector and ex.setup is widgets.setup
    assert ex.still_figures is widgets.still_figures


def _scaling_expected(scaling, d_k):
    """Scores and weights of one head size, from the definitions: divisor 1 and divisor sqrt(d_k)."""
    q, k, _ = scaling.scaling_row(d_k)
    raw = (q @ k.T)[0]
    return raw, ar.softmax(raw), ar.softmax(raw / np.sqrt(d_k))


def _bar_texts(weights):
    """Bars as the figures write them: length in percent of the full width, and the weight beside it."""
    return [[round(100 * float(w), 1), text] for w, text in zip(weights, _formatted(weights)[0], strict=True)]


def test_scaling_states_are_the_softmax_of_the_row_with_and_without_the_divisor(scaling):
    table = _data(scaling.scaling_selector())
    assert scaling.SCALING_KEYS == 32 and scaling.SCALING_DEFAULT == 64  # the page's S and d_k
    assert table["default"] == "64" and table["order"] == ["dk"]
    sharpest = []
    for d_k in scaling.SCALING_HEAD_SIZES:
        state = table["states"][str(d_k)]
        raw, unscaled, scaled = _scaling_expected(scaling, d_k)
        # Two columns of bars: the weights with divisor 1, and with divisor sqrt(d_k).
        assert state["bars"]["raw"] == _bar_texts(unscaled)
        assert state["bars"]["scaled"] == _bar_texts(scaled)
        assert len(state["bars"]["raw"]) == len(state["bars"]["scaled"]) == 32
        assert state["text"]["max-raw"] == f"{unscaled.max():.2f}"
        assert state["text"]["max-scaled"] == f"{scaled.max():.2f}"
        assert state["text"]["sd"] == f"{raw.std():.1f}"
        assert state["status"].startswith(f"d\u2096 = {d_k}:")
        sharpest.append(unscaled.max())
    assert sharpest == sorted(sharpest) and sharpest[-1] > 0.99  # what the figure is for
    # The default state is the row the page describes: the seed's generator at d_k = 64 draws q, then k.
    pic = np.random.default_rng(scaling.SCALING_SEED)
    q_pic, k_pic = pic.standard_normal(64), pic.standard_normal((32, 64))
    np.testing.assert_array_equal(q_pic[None], scaling.scaling_row(64)[0])
    np.testing.assert_array_equal(k_pic, scaling.scaling_row(64)[1])
    # Bars, not a table of 32 rows to scan.
    html = scaling.scaling_selector()._repr_mimebundle_()[0]["text/html"]
    assert "data-grid" not in html and html.count('data-bars="raw"') == html.count('data-bars="scaled"') == 1


def test_scaling_labels_are_typeset_and_never_call_the_divisor_tau(scaling):
    html = scaling.scaling_selector()._repr_mimebundle_()[0]["text/html"]
    assert "d_k" not in html and "sqrt" not in html and "\u03c4" not in html
    assert "\u221ad\u2096" in html and "no scaling" in html


def test_mask_states_are_the_masks_and_weights_of_each_setting(masks):
    table = _data(masks.mask_inspector())
    blind = 0
    for causal, length, pad_queries in itertools.product((1, 0), masks.MASK_LENGTHS, (0, 1)):
        state = table["states"][f"{causal}|{length}|{pad_queries}"]
        additive, weights, allowed = _expected_inspector(masks, causal, length, pad_queries)
        assert _texts(state["grids"]["additive"]) == additive
        assert _texts(state["grids"]["weights"]) == weights
        for i, row in enumerate(allowed):
            assert state["text"][f"sees{i}"].endswith("sees no key: its weights and output are all zero.") == (
                not row.any())
        empty = not allowed.any(axis=1).all()
        blind += int(empty)
        # The status line says what to notice: an empty row's zeros where there is one, and the row sums.
        assert ("no allowed key" in state["status"]) == empty
        assert "sums to 1" in state["status"]
    assert blind == 2 * 3  # padding queries masked, with some padding: a row with no allowed key


def test_alignment_states_are_the_masks_and_weights_of_each_setting(masks, windows):
    table = _data(windows.alignment_inspector())
    settings = itertools.product((6, 3), (1, 0), windows.ALIGNMENTS, windows.MASK_WINDOWS)
    for n_queries, causal, alignment, window in settings:
        state = table["states"][f"{n_queries}|{causal}|{alignment}|{window}"]
        additive, weights, allowed = _expected_masks(masks, n_queries, causal, alignment, window)
        assert _texts(state["grids"]["additive"]) == additive
        assert _texts(state["grids"]["weights"]) == weights
        assert all(allowed.any(axis=1))  # no padding here: every query keeps a key
    # what the figure is for: with 3 queries, bottom-right lets the last one read every key, top-left does not
    assert table["states"]["3|1|bottom-right|none"]["grids"]["additive"][-1] == [["0", -2]] * 6
    assert table["states"]["3|1|top-left|none"]["grids"]["additive"][-1][-1][0] == MINUS_INF


def test_padding_states_add_the_mask_and_multiply_it(masks):
    table = _data(masks.padding_batch())
    q, k, _, mask = masks.padding_problem()
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    added = ar.softmax(np.where(mask, scores, -np.inf))
    multiplied = ar.softmax(scores * mask)
    for b in range(2):
        state = table["states"][str(b)]
        assert _texts(state["grids"]["added"]) == _formatted(added[b])
        assert _texts(state["grids"]["multiplied"]) == _formatted(multiplied[b])
    n = len(masks.BATCH[1])
    assert np.all(added[1][:, n:] == 0) and np.all(multiplied[1][:, n:] > 0.05)  # what the figure is for


def _lookup_expected(keys, values, q, temperature):
    """What the lookup figure shows for one setting, from the definitions: scores q . k_j, weights the softmax of
    the scores over T, terms alpha_j v_j, their running sum and the output."""
    keys, values, q = (np.asarray(x, dtype=float) for x in (keys, values, q))
    scores = keys @ q
    weights = ar.softmax(scores / temperature)
    terms = weights[:, None] * values
    running = np.cumsum(terms, axis=0)
    vec = lambda x: "(" + ",\u00a0".join(f"{c + 0.0:.2f}".replace("-0.00", "0.00") for c in x) + ")"  # noqa: E731
    rows = [[f"{scores[j]:.2f}", _formatted(weights[j])[0][0], vec(values[j]), vec(terms[j]), vec(running[j])]
            for j in range(len(keys))]
    return rows, vec(weights @ values), weights


def test_lookup_states_are_each_term_and_their_sum(lookup, rng):
    keys, values, queries = rng.standard_normal((5, 3)), rng.standard_normal((5, 2)), rng.standard_normal((3, 3))
    table = _data(lookup.lookup_terms(keys, values, list("vwxyz"), queries, ["a", "b", "c"], temperatures=(2.0, 0.5)))
    assert table["order"] == ["query", "temperature"] and len(table["states"]) == 3 * 2
    for a, b in itertools.product(range(3), range(2)):
        state = table["states"][f"{a}|{b}"]
        rows, output, weights = _lookup_expected(keys, values, queries[a], (2.0, 0.5)[b])
        assert _texts(state["grids"]["terms"]) == rows
        assert state["text"]["output"] == output == rows[-1][-1]  # the last running sum is the output
        assert f"{'vwxyz'[int(np.argmax(weights))]} takes {weights.max():.2f} of the weight" in state["status"]
    assert table["inputs"] == {"keys": keys.tolist(), "values": values.tolist(), "queries": queries.tolist(),
                               "temperatures": [2.0, 0.5]}
    # Labels are typeset: the symbols of the columns are HTML, not raw text.
    page = lookup.lookup_terms(keys, values, list("vwxyz"), queries, "abc")._repr_mimebundle_()[0]["text/html"]
    assert "<i>\u03b1</i><sub><i>j</i></sub>" in page and "s_j" not in page and "alpha" not in page


def test_the_json_cannot_close_its_script_element(widgets):
    assert widgets.to_json({"a": "</script><script>alert(1)</script>"}).count("</") == 0


def test_a_downloaded_notebook_shows_the_still_image_instead_of_the_cell(ex, masks, widgets):
    bundle, metadata = masks.padding_batch()._repr_mimebundle_()
    cell = {"cell_type": "code", "id": "x", "metadata": {"tags": ["remove-input", "explorable"]},
            "source": "from explorables import padding_batch\npadding_batch()",
            "outputs": [{"output_type": "execute_result", "data": bundle, "metadata": metadata}]}
    other = {"cell_type": "code", "id": "y", "metadata": {}, "source": "1", "outputs": []}
    notebook = ex.still_figures({"cells": [cell, other]})
    still, kept = notebook["cells"]
    assert kept is other
    assert still["cell_type"] == "markdown" and "import" not in still["source"]
    alt = metadata[widgets.METADATA_KEY]["alt"].replace("[", "(").replace("]", ")")
    assert still["source"] == f"![{alt}](data:image/png;base64,{bundle['image/png']})"
    with pytest.raises(ValueError, match="no still image"):
        ex.still_figures({"cells": [{**cell, "outputs": []}]})


def test_the_script_computes_nothing():
    script = (ROOT / "docs" / "_static" / "explorables.js").read_text()
    assert "Math." not in script and "exp(" not in script


# -- In the built book ---------------------------------------------------------------------------------------

_SHOWN = """figure => ({
  grids: Object.fromEntries([...figure.querySelectorAll('[data-grid]')].map(t => [t.dataset.grid,
    [...t.querySelectorAll('tbody tr')].filter(tr => !tr.hidden)
      .map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent))])),
  bars: Object.fromEntries([...figure.querySelectorAll('[data-bars]')].map(l => [l.dataset.bars,
    [...l.querySelectorAll('.ex-bar-value')].map(s => s.textContent)])),
  slots: Object.fromEntries([...figure.querySelectorAll('[data-slot]')].map(s => [s.dataset.slot,
    s.closest('[hidden]') ? null : s.textContent])),
})"""


@pytest.fixture
def chapter_page(request):
    """Open a chapter of the built book in a fresh light-mode tab (test_site's ``visit``): ``Visit`` record."""
    opener = request.getfixturevalue("visit")

    def open_chapter(chapter):
        if not (SITE / chapter).is_file():
            _missing(f"the built book ({SITE / chapter}; run `make docs`)")
        return opener(chapter)

    return open_chapter


def _shown(figure):
    return figure.evaluate(_SHOWN)


@pytest.mark.browser
def test_scaling_selector_in_the_page(scaling, chapter_page):
    seen = chapter_page("chapters/04_scaling.html")
    figure = seen.page.locator("#explorable-scaling")
    select = figure.get_by_label("Head size d\u2096")
    assert select.input_value() == "64"
    statuses = set()
    for d_k in (*scaling.SCALING_HEAD_SIZES, 64):
        select.select_option(str(d_k))
        _, unscaled, scaled = _scaling_expected(scaling, d_k)
        shown = _shown(figure)
        assert shown["bars"]["raw"] == _formatted(unscaled)[0]
        assert shown["bars"]["scaled"] == _formatted(scaled)[0]
        widths = figure.evaluate("f => [...f.querySelectorAll('[data-bars=\"raw\"] .ex-bar')].map(b => b.style.width)")
        assert widths == [f"{round(100 * float(w), 1):g}%" for w in unscaled]
        status = shown["slots"]["status"]
        assert status.startswith(f"d\u2096 = {d_k}:")
        statuses.add(status)
    assert len(statuses) == 3
    # From the keyboard: focus the drop-down, the arrow key moves to the next head size.
    select.select_option("4")
    select.focus()
    seen.page.keyboard.press("ArrowDown")
    assert select.input_value() == "64"
    assert figure.get_attribute("class") == "explorable ex-ready"
    assert seen.errors == [] and seen.foreign == []


@pytest.mark.browser
def test_mask_inspector_in_the_page(masks, chapter_page):
    seen = chapter_page("chapters/05_masks.html")
    page = seen.page
    figure = page.locator("#explorable-masks")
    causal, length = figure.get_by_label("Causal", exact=True), figure.get_by_label("Real tokens")
    pad_queries = figure.get_by_label("Mask the [pad] queries too")
    statuses = set()
    for is_causal, n, padq in itertools.product((1, 0), masks.MASK_LENGTHS, (0, 1)):
        causal.set_checked(bool(is_causal))
        length.select_option(str(n))
        pad_queries.set_checked(bool(padq))
        shown = _shown(figure)
        additive, weights, allowed = _expected_inspector(masks, is_causal, n, padq)
        assert shown["grids"]["additive"] == additive, (is_causal, n, padq)
        assert shown["grids"]["weights"] == weights, (is_causal, n, padq)
        keys = [t if j < n else "[pad]" for j, t in enumerate(masks.MASK_TOKENS)]
        for i, row in enumerate(allowed):
            seen_keys = [keys[j] for j in np.flatnonzero(row)]
            tail = ", ".join(seen_keys) + "." if seen_keys else "no key: its weights and output are all zero."
            assert shown["slots"][f"sees{i}"].endswith(tail)
        statuses.add(shown["slots"]["status"])
    # Each change announced: the first setting is the default (nothing to announce yet), and with no padding,
    # masking the padding queries changes nothing.
    assert len(statuses - {""}) == 16 - 2
    # From the keyboard: Space toggles the focused checkbox.
    causal.focus()
    page.keyboard.press("Space")
    assert causal.is_checked()
    assert _shown(figure)["slots"]["status"].startswith("Causal on, 3 real tokens and 3 [pad], [pad] queries")
    assert seen.errors == []


@pytest.mark.browser
def test_alignment_inspector_in_the_page(masks, windows, chapter_page):
    seen = chapter_page("chapters/windows_sinks_caches.html")
    page = seen.page
    figure = page.locator("#explorable-alignment")
    queries, causal = figure.get_by_label("Queries"), figure.get_by_label("Causal", exact=True)
    alignment, window = figure.get_by_label("Causal alignment"), figure.get_by_label("Window")
    statuses = set()
    for n_queries, is_causal, align, w in itertools.product((6, 3), (1, 0), windows.ALIGNMENTS, windows.MASK_WINDOWS):
        queries.select_option(str(n_queries))
        causal.set_checked(bool(is_causal))
        alignment.select_option(align)
        window.select_option(w)
        shown = _shown(figure)
        additive, weights, allowed = _expected_masks(masks, n_queries, is_causal, align, w)
        assert shown["grids"]["additive"] == additive, (n_queries, is_causal, align, w)
        assert shown["grids"]["weights"] == weights, (n_queries, is_causal, align, w)
        for i, row in enumerate(allowed):
            tail = ", ".join(masks.MASK_TOKENS[j] for j in np.flatnonzero(row)) + "."
            assert shown["slots"][f"sees{i}"].endswith(tail)
        assert [shown["slots"][f"sees{i}"] for i in range(n_queries, 6)] == [None] * (6 - n_queries)
        statuses.add(shown["slots"]["status"])
    assert len(statuses) == 24  # each change announced
    assert seen.errors == []


@pytest.mark.browser
def test_padding_batch_in_the_page(masks, chapter_page):
    seen = chapter_page("chapters/05_masks.html")
    figure = seen.page.locator("#explorable-padding")
    q, k, _, mask = masks.padding_problem()
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    for b in (0, 1):  # the default is sentence 2 (index 1): a change each time
        figure.get_by_label("Sentence").select_option(str(b))
        shown = _shown(figure)
        assert shown["grids"]["added"] == _formatted(ar.softmax(np.where(mask[b], scores[b], -np.inf)))
        assert shown["grids"]["multiplied"] == _formatted(ar.softmax(scores[b] * mask[b]))
        assert shown["slots"]["status"].startswith(f"Sentence {b + 1},")
    assert seen.errors == [] and seen.foreign == []


@pytest.mark.browser
def test_lookup_in_the_page(chapter_page):
    seen = chapter_page("chapters/01_queries_keys_values.html")
    figure = seen.page.locator("#explorable-lookup")
    inputs = json.loads(figure.locator("script.ex-data").text_content())["inputs"]
    query, temperature = figure.get_by_label("Query"), figure.get_by_label("Temperature")
    assert len(inputs["queries"]) >= 3 and len(inputs["temperatures"]) >= 2
    names = [option.text_content() for option in query.locator("option").all()]
    for a, b in itertools.product(range(len(inputs["queries"])), range(len(inputs["temperatures"]))):
        # By index: Playwright matches a string against labels too, and "1" is a temperature's label.
        query.select_option(index=a)
        temperature.select_option(index=b)
        shown = _shown(figure)
        rows, output, _ = _lookup_expected(inputs["keys"], inputs["values"], inputs["queries"][a],
                                           inputs["temperatures"][b])
        assert shown["grids"]["terms"] == rows, (a, b)
        assert shown["slots"]["output"] == output
        if (a, b) != (0, 0):  # every change is announced (the default, shown on arrival, is not)
            assert shown["slots"]["status"].startswith(f"{names[a]}, temperature {inputs['temperatures'][b]:g}:")
    assert seen.errors == [] and seen.foreign == []


@pytest.mark.browser
@pytest.mark.parametrize("chapter", ["chapters/01_queries_keys_values.html", "chapters/04_scaling.html",
                                     "chapters/05_masks.html", "chapters/windows_sinks_caches.html"])
def test_explorables_in_both_colour_modes_have_no_axe_violation(chapter_page, chapter):
    require("axe_playwright_python")
    seen = chapter_page(chapter)
    page = seen.page
    figures = page.locator("figure.explorable")
    assert figures.count() >= 1
    # Change every figure from its default state first (hidden rows, masked cells, a pressed row).
    for control in page.locator("figure.explorable select").all():
        options = control.locator("option").all()
        control.select_option(options[-1].get_attribute("value"))
    for control in page.locator("figure.explorable input[type=range]").all():
        control.fill("3")
    for button in page.locator("figure.explorable button.ex-row").all()[-1:]:
        button.focus()
    # (before axe, whose own fetches of style sheets may log 404s, as in test_site)
    assert seen.errors == [] and seen.foreign == [] and seen.bad_responses == []
    for mode, violations in _axe_in_each_mode(seen).items():
        assert violations == [], f"{chapter} ({mode}): " + "\n".join(report for _, report in violations)
    colours = {}
    for mode in ("light", "dark"):
        assert _switch_mode(page, mode) == mode
        colours[mode] = figures.first.evaluate("f => getComputedStyle(f).backgroundColor")
    assert colours["light"] != colours["dark"], "the figures do not follow the colour mode"
