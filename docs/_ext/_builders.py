"""Which output a builder writes: the website, or a book to keep (PDF, EPUB).

The EPUB builder is an HTML builder (``builder.format == "html"``) that embeds its pages in a container without
the site's scripts, so ``format`` alone cannot tell the site from the EPUB; Sphinx marks such builders with
``embedded = True``.
"""

from __future__ import annotations


def is_website(builder) -> bool:
    """True for the builders that write the site (html, dirhtml, singlehtml), False for LaTeX, EPUB and others."""
    return builder.format == "html" and not getattr(builder, "embedded", False)
