"""A glued number stays whole on every channel: "4.1e-05" never breaks after its hyphen.

Corrects: a line may break after a hyphen, and the text MyST-NB pastes for ``{glue:text}`` (an inline node of
class ``pasted-text``) is plain text, so a glued number such as ``4.1e-05`` could end one line with "4.1e-" and
start the next with "05". A post-transform marks each pasted text that is one word with a hyphen (a number, not
a glued sentence, which must still wrap) with the class ``glued-number``, and each channel keeps those whole:

* the site: ``span.glued-number { white-space: nowrap }`` in ``_static/custom.css``;
* the PDF: Sphinx's LaTeX writer wraps a classed inline node in ``\\DUrole{glued-number}{...}``, which
  ``_latex/attention_ref.sty`` defines as an ``\\mbox`` (no break inside);
* the EPUB, which carries none of the site's stylesheets (``epub_styles``): its hyphens are written as U+2011
  NON-BREAKING HYPHEN, which looks the same and does not break.

Public API only (a post-transform). Verified with Sphinx 9.0.4, docutils 0.22 and MyST-NB 1.4.0.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

PASTED = "pasted-text"  # the class MyST-NB (and bounds.py) give the inline node of a glued text
NUMBER = "glued-number"  # the class this module adds to the one-word glued texts with a hyphen
NON_BREAKING_HYPHEN = "\u2011"


def is_glued_number(text: str) -> bool:
    """Whether a glued text is one word with a hyphen in it ("4.1e-05", "-93.5"), which must not break."""
    return "-" in text and not any(c.isspace() for c in text)


class GluedNumbersWhole(SphinxPostTransform):
    """Mark the glued numbers; in the EPUB, also write their hyphens as non-breaking hyphens."""

    default_priority = 900

    def run(self, **kwargs) -> None:
        epub = self.app.builder.name == "epub"
        for inline in self.document.findall(nodes.inline):
            if PASTED not in inline.get("classes", []) or not is_glued_number(inline.astext()):
                continue
            inline["classes"].append(NUMBER)
            if epub:
                for text in list(inline.findall(nodes.Text)):
                    text.parent.replace(text, nodes.Text(str(text).replace("-", NON_BREAKING_HYPHEN)))


def setup(app):
    app.add_post_transform(GluedNumbersWhole)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
