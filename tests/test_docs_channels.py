"""Every channel as clean as the site: what issue 35 found in the built site, the PDF's LaTeX and the notebooks.

Unit checks of the extensions that correct it (``citation_parentheses``, ``solutions``, ``print_edition``,
``latex_book``, ``_notebook_markdown``, ``notebook_download``), then the same properties read from the built site
(``BOOK_SITE`` or ``docs/_build/html``) and the committed notebooks (``notebooks/``):

* a citation inside parentheses is bracketed once ("(Vaswani et al., 2017)");
* a solution's fold says "Solution", and no solution a reader opens (site or notebook) holds a ``glue(`` call;
* in a notebook a solution is a Colab form cell (code hidden until asked for) with no outputs;
* every notebook's first cell checks everything the notebook needs, ml_dtypes where the package needs it;
* a page without code cells says nothing about code cells in its reading time;
* "Start here" is gone from the sidebar: Part I begins where the landing page says it does.

Without a built site the site checks skip locally and fail in CI (``CI=true``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import ext_module, require_built_book

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "docs" / "_build" / "html"))
COMMITTED = sorted((ROOT / "notebooks").rglob("*.ipynb"))

pytestmark = pytest.mark.docs


@pytest.fixture(scope="module")
def ext():
    return lambda name: ext_module(name, "sphinx", "myst_nb")


def _site():
    return require_built_book(SITE)


def _pages():
    return sorted(path for path in _site().rglob("*.html") if "_static" not in path.parts)


# -- Citations ------------------------------------------------------------------------------------------------


def test_a_citation_in_parentheses_loses_its_own_brackets(ext):
    cp = ext("citation_parentheses")
    assert cp.parenthetical("Vaswani et al. (2017)") == "Vaswani et al., 2017"
    assert cp.parenthetical("Press, Smith and Lewis (2022)") == "Press, Smith and Lewis, 2022"
    assert cp.parenthetical("Liu (2023a)") == "Liu, 2023a"
    assert cp.parenthetical("Softmax, stably") is None
    assert cp.open_parentheses("multi-head attention (") == 1
    assert cp.open_parentheses("the scale (see above) and ") == 0
    assert cp.open_parentheses("(GQA, ") == 1


def test_a_citation_in_parentheses_transforms_in_a_doctree(ext):
    from docutils import nodes

    cp = ext("citation_parentheses")

    def paragraph(before, after):
        link = nodes.reference("", "", nodes.inline("", "Vaswani et al. (2017)"), internal=True, refuri="r.html#v")
        return nodes.paragraph("", "", nodes.Text(before), link, nodes.Text(after))

    document = nodes.section("", paragraph("Attention (", ") runs"), paragraph("As ", " showed,"),
                             paragraph("With $(x$ ", " too"))
    document[2].insert(1, nodes.math("", "f(x"))  # a bracket in math is not prose
    cp.unparenthesize_citations(None, document, "page")
    assert [p.astext() for p in document.children] == [
        "Attention (Vaswani et al., 2017) runs", "As Vaswani et al. (2017) showed,",
        "With $(x$ f(xVaswani et al., 2017 too"]


DOUBLED = re.compile(r"\(\s*<a [^>]*><span[^>]*>[^<]*\(\d{4}[a-z]?\)</span></a>\s*[);,]")


def test_no_citation_on_the_site_is_bracketed_twice():
    found = [f"{page.relative_to(SITE)}: {match.group(0)}" for page in _pages()
             for match in DOUBLED.finditer(page.read_text(encoding="utf-8"))]
    assert found == []


def test_the_doubled_bracket_check_can_fail():
    doubled = ('(<a class="reference internal" href="../references.html#vaswani2017"><span class="std std-ref">'
               "Vaswani et al. (2017)</span></a>) runs")
    assert DOUBLED.search(doubled)
    assert not DOUBLED.search(doubled.replace(" (2017)", ", 2017"))


# -- Solutions ------------------------------------------------------------------------------------------------


def test_glue_statements_leave_a_solution(ext):
    sol = ext("solutions")
    source = 'x = 1\nglue("a", x,\n     display=False)\nif x:\n    glue("b", 2)\n    y = 3\nprint(x)\n'
    assert sol.without_glue(source) == "x = 1\nif x:\n    y = 3\nprint(x)\n"
    loop = 'for i in range(2):\n    glue(f"b{i}", i)\nz = 0\n'
    assert sol.without_glue(loop) == "z = 0\n"  # a loop that only glues goes with its glue
    alone = 'if x:\n    glue("b", 1)\n'
    assert sol.without_glue(alone) == alone  # taking it out would leave no body: kept (and a test reports it)
    assert sol.without_glue("not python (") == "not python ("


_SOLUTION_CELL = re.compile(
    r'<p class="admonition-title">(?P<title>Exercise[^<]*)</p>(?:(?!admonition-title).)*?</div>\s*'
    r'<div class="cell tag_hide-cell[^"]*"[^>]*>\s*<details class="[^"]*above-input">\s*<summary[^>]*>\s*'
    r'<p class="collapsed admonition-title">(?P<show>[^<]*)</p>.*?</summary>(?P<body>.*?)</details>', re.DOTALL)


def _solutions_on(page):
    return list(_SOLUTION_CELL.finditer(page.read_text(encoding="utf-8")))


def test_solution_folds_say_solution_and_hold_no_glue():
    found, problems = 0, []
    for page in _pages():
        for match in _solutions_on(page):
            found += 1
            if match["show"].strip() != "Solution":
                problems.append(f"{page.relative_to(SITE)} {match['title']}: fold says {match['show']!r}")
            code = re.sub(r"<[^>]+>", "", match["body"])
            if "glue(" in code:
                problems.append(f"{page.relative_to(SITE)} {match['title']}: glue( in the solution")
    assert found >= 20, found
    assert problems == []


# -- Notebooks ------------------------------------------------------------------------------------------------


def _cells(markdown_then_code):
    return [{"cell_type": kind, "metadata": {"tags": tags}, "source": source, "outputs": [{"output_type": "x"}]}
            for kind, tags, source in markdown_then_code]


def test_a_solution_becomes_a_colab_form_without_glue_or_outputs(ext):
    nm = ext("_notebook_markdown")
    cells = _cells([("markdown", [], "Text.\n\n:::{admonition} Exercise 4.2\nDo it.\n:::\n"),
                    ("code", ["hide-cell"], 'x = 1\nglue("x", x, display=False)\nassert x'),
                    ("code", ["hide-cell"], "y = 2"),
                    ("code", ["hide-cell"], "a check, not a solution"),
                    ("markdown", [], ":::{admonition} Exercise 4.3\nDo it.\n:::\n\nMore prose after it."),
                    ("code", ["hide-cell"], "not a solution either")])
    cells[3]["cell_type"] = "markdown"
    cells[3]["source"] = "Prose between."
    cells.insert(4, {"cell_type": "code", "metadata": {"tags": ["hide-cell"]}, "source": "z", "outputs": []})
    assert nm.solution_titles(cells) == {1: "Exercise 4.2", 2: "Exercise 4.2"}
    solution = nm.as_solution(cells[1], "Exercise 4.2")
    assert solution["source"] == '#@title Solution to Exercise 4.2 { display-mode: "form" }\nx = 1\nassert x'
    assert solution["outputs"] == []
    assert solution["metadata"]["cellView"] == "form"
    assert solution["metadata"]["jupyter"] == {"source_hidden": True, "outputs_hidden": True}


def _notebooks():
    built = sorted((_site() / "_sources").rglob("*.ipynb"))
    return [*built, *COMMITTED]


def _solutions_of(notebook):
    return [cell for cell in notebook["cells"] if cell.get("metadata", {}).get("cellView") == "form"]


def test_no_notebook_shows_a_solution_unasked_or_holds_glue_in_one():
    problems, found = [], 0
    for path in _notebooks():
        notebook = json.loads(path.read_text(encoding="utf-8"))
        for cell in _solutions_of(notebook):
            found += 1
            source = "".join(cell["source"])
            if not source.startswith("#@title Solution to Exercise"):
                problems.append(f"{path}: a form cell that is no titled solution: {source[:60]!r}")
            if "glue(" in source:
                problems.append(f"{path}: glue( in {source.splitlines()[0]}")
            if cell.get("outputs"):
                problems.append(f"{path}: {source.splitlines()[0]} shows its outputs")
    assert found >= 40, found
    assert problems == []


def test_every_notebook_checks_all_it_needs_in_its_first_cell(ext):
    nd = ext("notebook_download")
    problems = []
    for path in _notebooks():
        notebook = json.loads(path.read_text(encoding="utf-8"))
        first = "".join(notebook["cells"][0]["source"])
        needs = set(json.loads(re.search(r"^NEEDS = (\{.*\})$", first, re.MULTILINE)[1].replace("'", '"')
                               .replace("None", "null")))
        code = "\n".join("".join(cell["source"]) for cell in notebook["cells"][1:] if cell["cell_type"] == "code")
        wanted = {"attention_ref"} | (nd._imported(code) & set(nd.OPTIONAL))
        if wanted - needs:
            problems.append(f"{path}: the first cell does not check {sorted(wanted - needs)}")
    assert problems == []


def test_fp8_code_needs_ml_dtypes(ext):
    nd = ext("notebook_download")
    assert "ml_dtypes" in nd._imported("q8, qd = ar.quantize_fp8(q)")
    assert "ml_dtypes" in nd._imported('x.astype("bfloat16")')
    assert "ml_dtypes" not in nd._imported("ar.attention(q, k, v)")


# -- Reading time, sidebar, PDF structure ---------------------------------------------------------------------


def test_a_page_without_code_cells_says_nothing_about_them():
    text = (_site() / "symbols.html").read_text(encoding="utf-8")
    line = re.search(r'<p class="reading-time">([^<]*)</p>', text)[1]
    assert "code cell" not in line, line


def test_part_one_begins_where_the_landing_page_says():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    captions = re.findall(r"^:caption: (.*)$", index, re.MULTILINE)
    assert captions[0].startswith("Part I."), captions
    assert "Start here" not in captions
    reference = index[index.index(":caption: Reference"):]
    assert "\nsymbols\n" in reference


def test_a_part_is_numbered_once(ext):
    lb = ext("latex_book")
    assert lb.part_latex("Part I. Attention") == "\\AttnRefPart{Part I. Attention}\n"
    sty = (ROOT / "docs" / "_latex" / "attention_ref.sty").read_text(encoding="utf-8")
    assert r"\addcontentsline{toc}{part}{#1}" in sty and r"\newcommand\AttnRefPart[1]" in sty


def test_an_explorables_title_becomes_a_typeset_caption(ext):
    pe = ext("print_edition")
    title = pe.title_nodes("Weights at <i>d</i><sub>k</sub> = 64 &amp; more")
    assert "".join(node.astext() for node in title) == "Weights at dk = 64 & more"
    assert [type(node).__name__ for node in title] == ["Text", "emphasis", "subscript", "Text"]
