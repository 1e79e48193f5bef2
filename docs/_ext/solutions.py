"""Exercise solutions: labelled "Solution" on the site, and with no ``glue(...)`` call wherever a reader opens one.

Corrects two things MyST-NB does with the hidden cell that follows an exercise (an admonition titled
"Exercise ..."), the book's solution:

* its fold on the site says "Show code cell content", as every folded cell does. Here, on the website builders
  (``_builders.is_website``), the fold of each solution cell says "Solution" ("Hide solution" when open): the
  per-cell ``code_prompt_show``/``code_prompt_hide`` that MyST-NB's ``HideInputCells`` reads, set before it runs;
* its source is shown as the chapter wrote it, ``glue(...)`` calls included: the book's plumbing for putting a
  number in the prose, which means nothing to a reader checking an answer. The chapters keep glue out of their
  solutions (``tests/test_docs_prose.py``); as a safety net, every builder here shows a solution's source without
  its ``glue(...)`` statements (`without_glue`), and ``notebook_download`` does the same in the notebooks.

A solution is the hidden cell directly after an exercise, with any hidden cells directly after it
(`solution_cells`). Public API only (a ``SphinxPostTransform``, priority 140: before ``print_edition`` (150) and
MyST-NB's ``HideInputCells`` (199)). Verified with Sphinx 9.0.4 and MyST-NB 1.4.0.
"""

from __future__ import annotations

import ast

from _builders import is_website
from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

EXERCISE = "Exercise "
PROMPT_SHOW, PROMPT_HIDE = "Solution", "Hide solution"


def is_code_cell(node) -> bool:
    return isinstance(node, nodes.container) and node.get("nb_element") == "cell_code"


def exercise_title(node) -> str | None:
    """The title of `node` if it is an exercise (an admonition titled "Exercise ..."), else None."""
    if isinstance(node, nodes.admonition) and node.children and isinstance(node[0], nodes.title):
        title = node[0].astext()
        return title if title.startswith(EXERCISE) else None
    return None


def solution_cells(document) -> list[tuple[nodes.Element, str]]:
    """``(cell, exercise title)`` for every solution cell of `document`: each hidden code cell directly after an
    exercise, and each hidden code cell directly after one of those."""
    found = []
    for cell in document.findall(is_code_cell):
        if not cell.get("hide_mode"):
            continue
        parent = cell.parent
        position = parent.index(cell)
        before = parent[position - 1] if position else None
        title = exercise_title(before)
        if title is None and found and found[-1][0] is before:
            title = found[-1][1]
        if title is not None:
            found.append((cell, title))
    return found


def _is_glue_call(statement) -> bool:
    if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
        return False
    func = statement.value.func
    return (isinstance(func, ast.Name) and func.id == "glue") or (isinstance(func, ast.Attribute)
                                                                   and func.attr == "glue")


def _only_glue(statement) -> bool:
    """A glue() call, or a loop whose body is glue() calls only (``for name, value in ...: glue(...)``)."""
    if _is_glue_call(statement):
        return True
    return (isinstance(statement, ast.For) and not statement.orelse
            and all(_only_glue(inner) for inner in statement.body))


def without_glue(source: str) -> str:
    """Python `source` without its ``glue(...)`` statements and loops of them (at any depth), or unchanged if it
    does not parse or would not parse without them (a glue call alone in an ``if``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    drop = set()
    for node in ast.walk(tree):
        blocks = (getattr(node, field, None) for field in ("body", "orelse", "finalbody"))
        for statement in (item for block in blocks if isinstance(block, list) for item in block):
            if _only_glue(statement):
                drop.update(range(statement.lineno, statement.end_lineno + 1))
    if not drop:
        return source
    lines = source.split("\n")
    kept = "\n".join(line for number, line in enumerate(lines, start=1) if number not in drop)
    try:
        ast.parse(kept)
    except SyntaxError:
        return source
    return kept.rstrip("\n") + ("\n" if source.endswith("\n") else "")


def _strip_glue(cell):
    for block in cell.findall(nodes.literal_block):
        if block.parent.get("nb_element") != "cell_code_source":
            continue
        text = block.astext()
        kept = without_glue(text)
        if kept != text:
            block.children = [nodes.Text(kept)]
            block["rawsource"] = kept


class LabelSolutions(SphinxPostTransform):
    """Solution folds say "Solution"; a solution's shown source has no glue() call."""

    default_priority = 140

    def run(self, **kwargs):
        website = is_website(self.app.builder)
        for cell, _ in solution_cells(self.document):
            _strip_glue(cell)
            if website:
                cell["prompt_show"], cell["prompt_hide"] = PROMPT_SHOW, PROMPT_HIDE


def setup(app):
    app.add_post_transform(LabelSolutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
