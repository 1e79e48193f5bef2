"""Admonitions with the ``dropdown`` class fold on the page, as native ``<details>`` elements.

Corrects what docutils and MyST do with ``:::{admonition} Going deeper: ...`` and ``:class: dropdown``: they
write an ordinary admonition, always open. The folding that sphinx-book-theme documents for that class comes
from sphinx-togglebutton's JavaScript, which this book does not load. Here, in HTML output only, each such
admonition becomes ``<details class="admonition dropdown ...">`` whose ``<summary>`` is the admonition's title:
closed until the reader opens it, with no script, operable by keyboard and announced by screen readers as a
disclosure. Other builders (LaTeX, EPUB's text) keep the open admonition. Downloaded notebooks turn the same
markup into ``<details>`` too (``_notebook_markdown``), and the reading time leaves folded text out
(``reading_time``).

Public API only (``doctree-resolved``, ``add_node``). Verified with Sphinx 9.0.4, docutils 0.22 and MyST 5.2.
"""

from __future__ import annotations

from docutils import nodes

CLASS = "dropdown"


class folded(nodes.General, nodes.Element):  # a docutils node: its class name names its visitor
    """An admonition shown closed: its title in ``summary``, its body as children."""


def fold_dropdowns(app, doctree, docname):
    """Replace every admonition with the ``dropdown`` class by a `folded` node (HTML builders only)."""
    if app.builder.format != "html":
        return
    for admonition in list(doctree.findall(nodes.admonition)):
        if CLASS not in admonition["classes"]:
            continue
        title = admonition.next_node(nodes.title)
        summary = title.astext() if title is not None else "Details"
        body = [child for child in admonition.children if child is not title]
        node = folded(summary=summary, classes=["admonition", *admonition["classes"]], ids=admonition["ids"])
        node.extend(body)
        admonition.replace_self(node)


def visit_folded(self, node):
    self.body.append(self.starttag(node, "details"))
    self.body.append(f'<summary class="admonition-title">{self.encode(node["summary"])}</summary>\n')


def depart_folded(self, node):
    self.body.append("</details>\n")


def _unsupported(self, node):  # only HTML builders ever see a folded node
    raise nodes.SkipNode


def setup(app):
    app.add_node(folded, html=(visit_folded, depart_folded), latex=(_unsupported, None), text=(_unsupported, None))
    app.connect("doctree-resolved", fold_dropdowns)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
