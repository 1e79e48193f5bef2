"""The notebooks carry the book's text: no MyST markup in a notebook's Markdown (``docs/_ext/_notebook_markdown.py``).

Every downloaded notebook of the built site (``BOOK_SITE`` or ``docs/_build/html``, ``_sources/**/*.ipynb``) and
every committed notebook (``notebooks/``) is scanned for what only MyST understands: roles, directive fences,
colon fences, directive options, ``(label)=`` targets and substitutions. The scan is written here, apart from
the converter, and is shown to find a ``{glue:text}`` role, an admonition and a target left in a copy of a real
notebook. The converter's own cases (values, links, admonitions, figures, hidden solutions, errors) are checked
on small inputs.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
from pathlib import Path

import pytest
from conftest import IN_CI, ext_module, require

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("BOOK_SITE", ROOT / "docs" / "_build" / "html"))
COMMITTED = sorted((ROOT / "notebooks").rglob("*.ipynb"))

# What only MyST (or Sphinx) understands, outside fenced code blocks.
MYST = {
    "role": re.compile(r"\{[A-Za-z][\w:+.-]*\}`"),
    "directive fence": re.compile(r"^ {0,3}(?:`{3,}|~{3,}|:{3,})\s*\{[^}]*\}", re.MULTILINE),
    "colon fence": re.compile(r"^ {0,3}:{3,}", re.MULTILINE),
    "directive option": re.compile(r"^:[\w-]+:(?:\s|$)", re.MULTILINE),
    "target": re.compile(r"^\s*\([\w:.-]+\)=\s*$", re.MULTILINE),
    "substitution": re.compile(r"\{\{[^}]*\}\}"),
}
CODE_BLOCK = re.compile(r"^ {0,3}(`{3,}|~{3,})(?!\s*\{).*?^ {0,3}\1\s*$", re.MULTILINE | re.DOTALL)


def _source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def myst_left(notebook):
    """``[(cell index, kind, excerpt)]`` of the MyST markup left in the notebook's Markdown cells."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = CODE_BLOCK.sub("", _source(cell))
        for kind, pattern in MYST.items():
            found += [(index, kind, text[max(0, m.start() - 30):m.end() + 30]) for m in pattern.finditer(text)]
    return found


def _built():
    notebooks = sorted((SITE / "_sources").rglob("*.ipynb")) if (SITE / "_sources").is_dir() else []
    if not notebooks:
        if IN_CI:
            pytest.fail(f"no built notebooks in {SITE}/_sources")
        pytest.skip(f"no built notebooks in {SITE}/_sources (run `make docs`)")
    return notebooks


def test_no_myst_left_in_the_committed_notebooks():
    assert COMMITTED
    left = {path.relative_to(ROOT).as_posix(): myst_left(json.loads(path.read_text())) for path in COMMITTED}
    assert not any(left.values()), {path: found[:5] for path, found in left.items() if found}


@pytest.mark.docs
def test_no_myst_left_in_the_downloaded_notebooks():
    left = {path.name: myst_left(json.loads(path.read_text())) for path in _built()}
    assert not any(left.values()), {path: found[:5] for path, found in left.items() if found}


def test_the_scan_finds_markup_left_in_a_copy():
    """A real notebook, broken three ways: a glued value not written in, an admonition, a target."""
    notebook = json.loads((ROOT / "notebooks" / "chapters" / "03_softmax.ipynb").read_text())
    assert myst_left(notebook) == []
    markdown = [index for index, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "markdown"]
    for broken, kinds in [("The float16 output is off by {glue:text}`ch03_err16:.1e`.", {"role"}),
                          (":::{admonition} Exercise\nText\n:::", {"directive fence", "colon fence"}),
                          ("(ch-softmax)=\n# Softmax", {"target"}),
                          ("```{glue:figure} fig\n:alt: text\n```", {"directive fence", "directive option"})]:
        copied = copy.deepcopy(notebook)
        copied["cells"][markdown[2]]["source"] = _source(copied["cells"][markdown[2]]) + "\n\n" + broken
        assert {kind for _, kind, _ in myst_left(copied)} == kinds, broken
    # Code in a fenced block is code, not markup.
    notebook["cells"][markdown[2]]["source"] = "```python\nx = f'{glue:text}`a`'\n```"
    assert myst_left(notebook) == []


# -- The converter -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nm():
    return ext_module("_notebook_markdown", "myst_nb")


PNG = base64.b64encode(b"\x89PNG fake").decode()


def _book(nm, **links):
    glue = {"err": {"text/plain": "0.000256"}, "n": {"text/plain": "1024"}, "name": {"text/plain": "'float16'"},
            "md": {"text/markdown": "see {ref}`ch-memory`", "text/plain": "<IPython.core.display.Markdown>"},
            "fig": {"image/png": PNG + "\n", "text/plain": "<Figure>"}}
    known = {"ch-memory": ("9. The memory wall", "https://book.example/chapters/09.html#ch-memory"),
             "bridle1990": ("Bridle (1990)", None), **links}

    def link(role, target):
        if role == "ref":
            return known.get(target, (None, None))
        return (target, "https://book.example/api/" + target + ".html" if target.startswith("attention_ref") else None)

    return nm.Book(glue=glue, link=link, page="chapters/test")


def test_glued_values_are_written_as_the_book_formats_them(nm):
    book = _book(nm)
    text = "Off by {glue:text}`err:.1e` at $d_k =$ {glue:text}`n` in {glue:text}`name`; {glue}`n`, {glue:md}`md:myst`."
    assert nm.to_markdown(text, book) == (
        "Off by 2.6e-04 at $d_k =$ 1024 in float16; 1024, see "
        "[9. The memory wall](https://book.example/chapters/09.html#ch-memory).")


def test_roles_become_links_or_plain_text(nm):
    book = _book(nm)
    assert nm.to_markdown("as {ref}`bridle1990` shows", book) == "as Bridle (1990) shows"
    assert nm.to_markdown("{ref}`the wall <ch-memory>`", book) == "[the wall](https://book.example/chapters/09.html#ch-memory)"
    assert nm.to_markdown("{func}`~attention_ref.softmax` and {class}`numpy.ndarray`", book) == (
        "[`softmax()`](https://book.example/api/attention_ref.softmax.html) and `numpy.ndarray`")
    # A role may run over two lines.
    assert nm.to_markdown("In {ref}`the\nwall <ch-memory>` it", book) == (
        "In [the\nwall](https://book.example/chapters/09.html#ch-memory) it")


def test_fences_become_markdown_jupyter_renders(nm):
    book = _book(nm)
    source = ("(ch-x)=\n# Title\n% a comment\n\n:::{admonition} Exercise 3.1\nShow $J^T g$ for {glue:text}`n`.\n:::\n\n"
              ":::{note}\nA note.\n:::\n\n::::{admonition} Solution\n:class: dropdown\nIt is $1$.\n::::\n\n"
              "```python\nx = {glue:text}`n`\n```")
    assert nm.to_markdown(source, book) == (
        "# Title\n\n> **Exercise 3.1**\n>\n> Show $J^T g$ for 1024.\n\n> **Note**\n>\n> A note.\n\n"
        "<details>\n<summary>Solution</summary>\n\nIt is $1$.\n\n</details>\n\n"
        "```python\nx = {glue:text}`n`\n```")


def test_a_glued_figure_is_embedded_with_its_alt_text_and_caption(nm):
    source = "```{glue:figure} fig\n:name: fig-x\n:alt: A [line] plot.\n\nIts caption, {glue:text}`n` points.\n```"
    expected = f"![A (line) plot.](data:image/png;base64,{PNG})\n\nIts caption, 1024 points."
    assert nm.to_markdown(source, _book(nm)) == expected


def test_what_has_no_markdown_form_stops_the_build(nm):
    book = _book(nm)
    for source, message in [("{glue:text}`missing`", "no value glued as 'missing'"),
                            ("{ref}`nowhere`", "target 'nowhere' is not in the book"),
                            ("{cite}`x`", r"role \{cite\}"),
                            ("```{tab-set}\n```", r"directive \{tab-set\}"),
                            ("```{literalinclude} x.py\n```", "literalinclude of 'x.py' with no reader")]:
        with pytest.raises(nm.UnknownMarkup, match=message):
            nm.to_markdown(source, book)


def test_solutions_open_collapsed(nm):
    notebook = {"cells": [{"cell_type": "code", "metadata": {"tags": ["hide-cell"]}, "source": "1", "outputs": []},
                          {"cell_type": "code", "metadata": {"tags": ["hide-input"]}, "source": "2", "outputs": []},
                          {"cell_type": "code", "metadata": {}, "source": "3", "outputs": []},
                          {"cell_type": "markdown", "metadata": {}, "source": "{glue:text}`n`"}]}
    cells = nm.for_readers(notebook, _book(nm))["cells"]
    assert cells[0]["metadata"]["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
    assert cells[1]["metadata"]["jupyter"] == {"source_hidden": True}
    assert "jupyter" not in cells[2]["metadata"]
    assert cells[3]["source"] == "1024"


def test_glue_values_are_read_from_the_outputs(nm):
    cell = {"cell_type": "code", "outputs": [
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": "a", "mime_prefix": nm.GLUE_PREFIX}},
         "data": {nm.GLUE_PREFIX + "text/plain": "3"}},
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": "b", "mime_prefix": ""}},
         "data": {"text/plain": "4"}},
        {"output_type": "stream", "name": "stdout", "text": "5"}]}
    assert nm.glue_values({"cells": [cell]}) == {"a": {"text/plain": "3"}, "b": {"text/plain": "4"}}


def test_values_glued_for_the_book_only_leave_the_outputs(nm):
    """A ``display=False`` glue has no MIME type a notebook front end renders: dropped (its value is in the text).
    A displayed glue, a figure and a stream stay."""
    hidden = {"output_type": "display_data", "metadata": {"scrapbook": {"name": "a", "mime_prefix": nm.GLUE_PREFIX}},
              "data": {nm.GLUE_PREFIX + "text/plain": "3"}}
    shown = {"output_type": "display_data", "metadata": {"scrapbook": {"name": "b", "mime_prefix": ""}},
             "data": {"text/plain": "4"}}
    figure = {"output_type": "display_data", "metadata": {}, "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}}
    stream = {"output_type": "stream", "name": "stdout", "text": "5"}
    cell = {"cell_type": "code", "metadata": {}, "source": "x", "outputs": [hidden, shown, figure, stream]}
    notebook = {"cells": [cell]}
    assert nm.for_readers(notebook, _book(nm))["cells"][0]["outputs"] == [shown, figure, stream]


@pytest.mark.docs
def test_every_downloaded_notebook_shows_the_books_figures_and_numbers():
    """Each glued figure the chapter's prose shows, and each explorable figure's still image, is an embedded
    image; the glued numbers are in the text."""
    for path in _built():
        notebook = json.loads(path.read_text())
        chapter = (ROOT / notebook["metadata"]["attention_ref"]["source"]).read_text()
        markdown = "\n".join(_source(cell) for cell in notebook["cells"] if cell["cell_type"] == "markdown")
        figures = len(re.findall(r"^`{3,}\{glue:figure\}", chapter, flags=re.MULTILINE))
        figures += len(re.findall(r"^:tags: \[.*\bexplorable\b.*\]$", chapter, flags=re.MULTILINE))
        assert len(re.findall(r"!\[[^\]]+\]\(data:image/png;base64,", markdown)) == figures, path.name
        solutions = [cell for cell in notebook["cells"] if "hide-cell" in cell["metadata"].get("tags", [])]
        assert all(cell["metadata"]["jupyter"]["source_hidden"] for cell in solutions), path.name


@pytest.mark.docs
def test_a_built_notebook_links_the_hosted_pages(tmp_path):
    """A tiny book built with the site's address known (``html_baseurl``): its downloaded notebook carries the
    glued value, a glued figure, links to the hosted pages and to Python's documentation, and no MyST."""
    import subprocess
    import sys

    require("sphinx")  # the docs extra builds it: skips without it (fails in CI)
    require("myst_nb")
    ext, inventory = ROOT / "docs" / "_ext", ROOT / "docs" / "_inventories" / "python.inv"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ext)!r})\n"
        "extensions = ['myst_nb', 'sphinx.ext.intersphinx', 'notebook_download']\n"
        f"intersphinx_mapping = {{'python': ('https://docs.python.org/3', {str(inventory)!r})}}\n"
        "html_baseurl = 'https://book.example/en/latest/'\n"
        "myst_enable_extensions = ['colon_fence', 'dollarmath']\n"
        f"nb_execution_mode = 'cache'\nnb_execution_cache_path = {str(tmp_path / 'cache')!r}\n"
        "exclude_patterns = ['_build']\n")
    (docs / "index.md").write_text("# Book\n\n```{toctree}\nch\n```\n")
    (docs / "ch.md").write_text(
        "---\nfile_format: mystnb\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n(ch-one)=\n# One\n\n"
        "```{code-cell} ipython3\nimport matplotlib.pyplot as plt\n"
        "from myst_nb import glue\nglue('x', 3.14159, display=False)\nfig, ax = plt.subplots()\n"
        "glue('fig', fig, display=False)\nplt.close(fig)\n```\n\n"
        "Pi is {glue:text}`x:.2f` ($\\pi$); see {ref}`ch-one`, {doc}`index` and {func}`len`.\n\n"
        ":::{note}\nA note.\n:::\n\n```{glue:figure} fig\n:alt: An empty plot.\n\nIts caption.\n```\n")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(docs), str(tmp_path / "html")],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    notebook = json.loads((tmp_path / "html" / "_sources" / "ch.ipynb").read_text())
    markdown = "\n\n".join(_source(cell) for cell in notebook["cells"] if cell["cell_type"] == "markdown")
    assert myst_left(notebook) == []
    assert ("Pi is 3.14 ($\\pi$); see [One](https://book.example/en/latest/ch.html#ch-one), "
            "[Book](https://book.example/en/latest/index.html) and "
            "[`len()`](https://docs.python.org/3/library/functions.html#len).") in markdown, markdown
    assert "> **Note**\n>\n> A note." in markdown
    assert re.search(r"!\[An empty plot\.\]\(data:image/png;base64,[A-Za-z0-9+/=]{100,}\)\n\nIts caption\.", markdown)
    assert notebook["metadata"]["attention_ref"]["source"] == "docs/ch.md"
