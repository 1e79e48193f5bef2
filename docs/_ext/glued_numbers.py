"""A glued number stays whole on every channel: "4.1e-05" never breaks after its hyphen.

Corrects: a line may break after a hyphen, and the text MyST-NB pastes for ``{glue:text}`` (an inline node of
class ``pasted-text``) is plain text, so a glued number such as ``4.1e-05`` could end one line with "4.1e-" and
start the next with "05". Each channel is kept from it in its own way:

* the site: ``span.pasted-text { white-space: nowrap }`` in ``_static/custom.css``;
* the PDF: Sphinx's LaTeX writer wraps a classed inline node in ``\\DUrole{pasted-text}{...}``, which
  ``_latex/attention_ref.sty`` defines as an ``\\mbox`` (no break inside);
* the EPUB, which carries none of the site's stylesheets (``epub_styles``): this post-transform writes each
  hyphen of pasted text as U+2011 NON-BREAKING HYPHEN, which looks the same and does not break.

Public API only (a post-transform restricted to the EPUB builder). Verified with Sphinx 9.0.4, docutils 0.22
and MyST-NB 1.4.0.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

PASTED = "pasted-text"  # the class MyST-NB (and bounds.py) give a glued number's inline node
NON_BREAKING_HYPHEN = "\u2011"


def unbreakable(text: str) -> str:
    """`text` with every hyphen-minus a non-breaking hyphen."""
    return text.replace("-", NON_BREAKING_HYPHEN)


class GluedNumbersWhole(SphinxPostTransform):
    """EPUB only: the hyphens of pasted glue text become non-breaking hyphens."""

    default_priority = 900
    builders = ("epub",)

    def run(self, **kwargs) -> None:
        for inline in self.document.findall(nodes.inline):
            if PASTED not in inline.get("classes", []):
                continue
            for text in list(inline.findall(nodes.Text)):
                if "-" in text:
                    text.parent.replace(text, nodes.Text(unbreakable(str(text))))


def setup(app):
    app.add_post_transform(GluedNumbersWhole)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
