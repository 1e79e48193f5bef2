"""The PDF and the EPUB: what the site folds away behind a toggle, written out in its static form.

Corrects: MyST-NB folds a cell tagged ``hide-cell`` or ``hide-input`` behind a "Show code cell" toggle in every
builder whose format is HTML, the EPUB's included (e-readers have no such toggle), and the LaTeX builder prints
the same cells as unlabelled code. In the book's two kept formats:

* a hidden cell directly after an exercise (an admonition titled "Exercise ...") is its solution (with any
  hidden cells after it): it is shown under a heading "Solution to Exercise N.M", directly after the exercise;
* a cell whose input the site hides (``hide-input``: the drawing code under a figure) shows its output only;
* any other hidden cell is shown as it is, unfolded.

The website builders (``_builders.is_website``) are left alone.

Public API only (a ``SphinxPostTransform`` that runs before MyST-NB's ``HideInputCells``, priority 199).
Verified with Sphinx 9.0.4 and MyST-NB 1.4.0.
"""

from __future__ import annotations

from _builders import is_website
from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

EXERCISE = "Exercise "


def _is_code_cell(node) -> bool:
    return isinstance(node, nodes.container) and node.get("nb_element") == "cell_code"


def exercise_title(node) -> str | None:
    """The title of `node` if it is an exercise (an admonition titled "Exercise ..."), else None."""
    if isinstance(node, nodes.admonition) and node.children and isinstance(node[0], nodes.title):
        title = node[0].astext()
        return title if title.startswith(EXERCISE) else None
    return None


def solved_exercise(cell) -> str | None:
    """The title of the exercise that hidden cell `cell` solves: the one directly before it, if any."""
    parent = cell.parent
    position = parent.index(cell)
    return exercise_title(parent[position - 1]) if position else None


class WriteOutHiddenCells(SphinxPostTransform):
    """In the PDF and the EPUB: solutions under a heading, hidden drawing code dropped, no folded cells."""

    default_priority = 150  # before MyST-NB's HideInputCells (199), which would fold them in the EPUB

    def run(self, **kwargs):
        if is_website(self.app.builder):
            return
        hidden = [cell for cell in self.document.findall(_is_code_cell) if cell.get("hide_mode")]
        for cell, mode, exercise in [(cell, cell["hide_mode"], solved_exercise(cell)) for cell in hidden]:
            del cell["hide_mode"]
            if mode == "input":
                cell.children = [child for child in cell.children if child.get("nb_element") != "cell_code_source"]
            elif exercise is not None:
                heading = f"Solution to {exercise}"
                cell.parent.insert(cell.parent.index(cell), nodes.rubric(heading, heading, classes=["solution"]))


def setup(app):
    app.add_post_transform(WriteOutHiddenCells)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
