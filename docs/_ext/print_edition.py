"""The PDF and the EPUB: what the site folds away behind a toggle, written out in its static form.

Corrects: MyST-NB folds a cell tagged ``hide-cell`` or ``hide-input`` behind a "Show code cell" toggle in every
builder whose format is HTML, the EPUB's included (e-readers have no such toggle), and the LaTeX builder prints
the same cells as unlabelled code. In the book's two kept formats:

* a hidden cell directly after an exercise (an admonition titled "Exercise ...") is its solution (with any
  hidden cells after it): it is shown under a heading "Solution to Exercise N.M", directly after the exercise;
* a cell whose input the site hides (``hide-input``: the drawing code under a figure) shows its output only;
* any other folded cell (``hide-cell``: the checks against the package, which the site folds away with their
  output) becomes a one-line note saying where to find it (:data:`FOLDED_NOTE`), not 20 lines of code.

Corrects too: an explorable figure (``explorables``) is, in these formats, its still image alone, with no caption;
the image repeats the figure before it without saying what it is. Each still gets the explorable's title as its
caption, followed by :data:`STILL_NOTE`.

The website builders (``_builders.is_website``) are left alone. Solutions are the cells ``solutions`` finds.

Public API only (``SphinxPostTransform``: one before MyST-NB's ``HideInputCells``, priority 199; one before its
``SelectMimeType``, priority 4, which drops the explorable's HTML, where its title is). Verified with Sphinx 9.0.4
and MyST-NB 1.4.0.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from _builders import is_website
from docutils import nodes
from solutions import exercise_title, is_code_cell, solution_cells
from sphinx.transforms.post_transforms import SphinxPostTransform

FOLDED_NOTE = "A folded code cell stands here on the website and in the notebook."
STILL_NOTE = "The still of an explorable figure at its first setting; on the website its controls change it."
EXPLORABLE_TAG = "explorable"
_TITLE = re.compile(r'<figcaption class="ex-title">(?P<title>.*?)</figcaption>', re.DOTALL)


class WriteOutHiddenCells(SphinxPostTransform):
    """In the PDF and the EPUB: solutions under a heading, hidden drawing code dropped, folded cells a note."""

    default_priority = 150  # before MyST-NB's HideInputCells (199), which would fold them in the EPUB

    def run(self, **kwargs):
        if is_website(self.app.builder):
            return
        solutions = {id(cell): title for cell, title in solution_cells(self.document)}
        hidden = [cell for cell in self.document.findall(is_code_cell) if cell.get("hide_mode")]
        for cell in hidden:
            mode = cell["hide_mode"]
            del cell["hide_mode"]
            if mode == "input":
                cell.children = [child for child in cell.children if child.get("nb_element") != "cell_code_source"]
            elif id(cell) in solutions:
                if exercise_title(cell.parent[cell.parent.index(cell) - 1]):  # the first cell of the solution
                    heading = f"Solution to {solutions[id(cell)]}"
                    cell.parent.insert(cell.parent.index(cell), nodes.rubric(heading, heading, classes=["solution"]))
            elif mode == "all":
                cell.replace_self(nodes.paragraph(FOLDED_NOTE, "", nodes.emphasis(FOLDED_NOTE, FOLDED_NOTE),
                                                  classes=["folded-cell"]))


_KINDS = {"i": nodes.emphasis, "em": nodes.emphasis, "sub": nodes.subscript, "sup": nodes.superscript,
          "b": nodes.strong, "strong": nodes.strong}


class _Inline(HTMLParser):
    """An explorable's title (escaped HTML with ``<i>``, ``<sub>``, ``<sup>``) as docutils inline nodes."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = [nodes.inline()]

    def handle_starttag(self, tag, attrs):
        node = _KINDS.get(tag, nodes.inline)()
        self.stack[-1] += node
        self.stack.append(node)

    def handle_endtag(self, tag):
        if len(self.stack) > 1:
            self.stack.pop()

    def handle_data(self, data):
        self.stack[-1] += nodes.Text(data)


def title_nodes(markup: str) -> list[nodes.Node]:
    """The inline nodes of an explorable's title, given as the HTML of its ``figcaption``."""
    parser = _Inline()
    parser.feed(markup)
    parser.close()
    return list(parser.stack[0].children)


def explorable_title(cell) -> str | None:
    """The title (HTML) of the explorable whose cell is `cell`, from its output's HTML alternative, or None."""
    for raw in cell.findall(nodes.raw):
        if raw.get("format") == "html":
            match = _TITLE.search(raw.astext())
            if match:
                return match["title"]
    return None


class CaptionExplorableStills(SphinxPostTransform):
    """In the PDF and the EPUB: under each explorable's still image, its title and what the still is."""

    default_priority = 3  # before MyST-NB's SelectMimeType (4) drops the HTML the title is read from

    def run(self, **kwargs):
        if is_website(self.app.builder):
            return
        for cell in list(self.document.findall(is_code_cell)):
            if EXPLORABLE_TAG not in cell.get("cell_metadata", {}).get("tags", []):
                continue
            title = explorable_title(cell)
            caption = nodes.paragraph("", "", classes=["explorable-caption"])
            if title:
                caption += nodes.strong("", "", *title_nodes(title))
                caption += nodes.Text(". ")
            caption += nodes.Text(STILL_NOTE)
            cell.parent.insert(cell.parent.index(cell) + 1, caption)


def setup(app):
    app.add_post_transform(CaptionExplorableStills)
    app.add_post_transform(WriteOutHiddenCells)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
