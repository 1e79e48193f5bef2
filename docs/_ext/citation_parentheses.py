"""A citation written inside parentheses reads "(Vaswani et al., 2017)", not "(Vaswani et al. (2017))".

Corrects: the book cites a paper with ``{ref}`vaswani2017```, a reference to the paper's section on the
references page, and Sphinx writes the section's title, "Vaswani et al. (2017)", as the link text. That reads
well in a sentence ("Vaswani et al. (2017) showed ..."), but a citation in parentheses, the usual author-year
form, then carries a second pair: "(Vaswani et al. (2017))". Here, once references are resolved (every
builder), a link whose text is "<authors> (<year>)" and which stands inside an open parenthesis of its paragraph
becomes "<authors>, <year>". A citation in running text keeps its title.

Public API only (``doctree-resolved``). Verified with Sphinx 9.0.4 and docutils 0.22.
"""

from __future__ import annotations

import re

from docutils import nodes

# A reference page's section title: authors, then the year in parentheses (2017, 2023a).
AUTHOR_YEAR = re.compile(r"^(?P<authors>.+\S) \((?P<year>\d{4}[a-z]?)\)$")
_NOT_PROSE = (nodes.math, nodes.literal, nodes.math_block, nodes.literal_block, nodes.raw)


def parenthetical(text: str) -> str | None:
    """`text` in the form a citation takes inside parentheses ("Vaswani et al., 2017"), or None if it is no
    author-year title."""
    match = AUTHOR_YEAR.match(text)
    return f"{match['authors']}, {match['year']}" if match else None


def open_parentheses(before: str) -> int:
    """How many parentheses `before` (the prose ahead of a link) leaves open."""
    depth = 0
    for char in before:
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
    return depth


def _prose_before(paragraph, reference) -> str:
    """The paragraph's prose text ahead of `reference` (math and code left out: their brackets are not prose)."""
    parts = []
    for text in paragraph.findall(nodes.Text):
        if reference in _ancestors(text):
            break
        if not any(isinstance(node, _NOT_PROSE) for node in _ancestors(text)):
            parts.append(str(text))
    return "".join(parts)


def _ancestors(node):
    while node is not None:
        yield node
        node = node.parent


def unparenthesize_citations(app, doctree, docname):
    for reference in list(doctree.findall(nodes.reference)):
        replacement = parenthetical(reference.astext())
        paragraph = reference.parent
        while paragraph is not None and not isinstance(paragraph, nodes.TextElement):
            paragraph = paragraph.parent
        if replacement is None or paragraph is None:
            continue
        if not open_parentheses(_prose_before(paragraph, reference)):
            continue
        texts = list(reference.findall(nodes.Text))
        if len(texts) == 1:  # the title as one text node (in an inline): replace it where it stands
            texts[0].parent.replace(texts[0], nodes.Text(replacement))


def setup(app):
    app.connect("doctree-resolved", unparenthesize_citations)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
