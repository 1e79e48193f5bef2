"""The PDF's structure is the site's: every page a chapter, each captioned toctree of the landing page a part.

Corrects: Sphinx's LaTeX builder inlines each toctree where it stands, so the pages listed by the toctrees at the
end of the landing page's last section ("Building the book locally") became sections of that chapter, and the
toctrees' captions ("Part I. Attention", ...), which the site shows in its navigation, were dropped. After the
builder has assembled the book (the ``doctree-resolved`` event of the root document, LaTeX builder only), each
page inlined by one of the landing page's toctrees is moved up to the top level, where its title becomes a
``\\chapter``, and each toctree's caption becomes a part before its first page. New pages and new parts need
nothing here: they are read from the landing page's toctrees.

Corrects too: a caption carries its own number ("Part I. Attention"), and LaTeX numbered the parts again (the
contents read "II Part I. Attention"); a part is unnumbered, with its own contents line, as the caption reads.
Nor is a part a page of its own: ``docs/_latex/attention_ref.sty`` sets its title at the top of the page where
its first chapter begins (a page for one line, then a blank page, opened Part I).

Public API only (``doctree-resolved``; ``addnodes.start_of_file``, which wraps each inlined page). Verified with
Sphinx 9.0.4.
"""

from __future__ import annotations

from docutils import nodes
from sphinx import addnodes
from sphinx.util.texescape import escape


def landing_toctrees(env):
    """``(caption or None, [docname, ...])`` of each toctree of the landing page, in order."""
    tree = env.get_doctree(env.config.root_doc)
    return [
        (node.get("caption"), [str(name) for name in node["includefiles"]]) for node in tree.findall(addnodes.toctree)
    ]


def part_latex(caption: str) -> str:
    """The LaTeX of a part titled `caption`: ``\\AttnRefPart`` (``docs/_latex/attention_ref.sty``), unnumbered (the
    caption has its number), with a contents line, on the page of its first chapter."""
    return f"\\AttnRefPart{{{escape(caption)}}}\n"


def lift_pages_to_chapters(app, doctree, docname):
    if app.builder.name != "latex" or docname != app.config.root_doc:
        return
    top = next(iter(doctree.findall(nodes.section)), None)  # the landing page: its title is the book's title
    if top is None:
        return
    inlined = {node["docname"]: node for node in top.findall(addnodes.start_of_file)}
    for caption, docnames in landing_toctrees(app.env):
        pages = [inlined[name] for name in docnames if name in inlined]
        if pages and caption:
            top += nodes.raw("", part_latex(caption), format="latex")
        for page in pages:
            wrapper = page.parent
            wrapper.remove(page)
            top += page
            if isinstance(wrapper, nodes.compound) and not wrapper.children:
                wrapper.parent.remove(wrapper)


def setup(app):
    app.connect("doctree-resolved", lift_pages_to_chapters)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
