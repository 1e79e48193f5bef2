"""Equations in the EPUB as SVG images: the math renderer chosen per builder, and every image made in one run.

Corrects two things:

* Sphinx picks one math renderer for every HTML builder (``html_math_renderer``), so the EPUB would load MathJax,
  a script that e-readers do not run, and show the TeX source. An HTML builder first looks up
  ``<builder name>_math_renderer`` (``Builder.get_builder_config``), a value Sphinx does not register; this
  extension registers ``epub_math_renderer`` so that ``docs/conf.py`` can give the EPUB ``sphinx.ext.imgmath``
  (SVG images made by latex and dvisvgm) while the site keeps MathJax. The PDF typesets equations itself.
* imgmath runs latex and dvisvgm once per equation, about 1,500 times for this book (over half an hour on two
  busy cores). Before the EPUB's pages are written, every equation of the book is set in one LaTeX document, a
  page each, which one latex run and one dvisvgm run turn into all the images, stored under the names imgmath
  gives them; imgmath then finds each image made and only renders what this missed (none, as a rule).

Relies on imgmath's private ``generate_latex_macro`` (the document it writes for one equation, whose hash names
the image), checked at load time (``_upstream``); the rest is public API (``builder-inited``, configuration
values). Verified with Sphinx 9.0.4.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

from _upstream import require
from docutils import nodes
from sphinx.ext import imgmath
from sphinx.util import logging
from sphinx.util.math import wrap_displaymath

logger = logging.getLogger(__name__)
generate_latex_macro = require(
    __name__, imgmath, "generate_latex_macro", ("image_format", "math", "config", "confdir"), "sphinx"
)
BEGIN, END = "\\begin{document}", "\\end{document}"


def imgmath_sources(doctree) -> list[str]:
    """The LaTeX imgmath renders for each equation of `doctree`: ``$...$`` inline, wrapped display math."""
    found = [f"${node.astext()}$" for node in doctree.findall(nodes.math)]
    for node in doctree.findall(nodes.math_block):
        nowrap = node.get("no-wrap", node.get("nowrap", False))
        found.append(node.astext() if nowrap else wrap_displaymath(node.astext(), None, False))
    return found


def batch_document(documents: list[str]) -> str:
    """One LaTeX document holding the bodies of `documents` (imgmath's, which share a preamble), a page each."""
    preamble = documents[0].split(BEGIN)[0]
    bodies = [document.split(BEGIN, 1)[1].rsplit(END, 1)[0].strip() for document in documents]
    return preamble + BEGIN + "\n" + "\n\\newpage\n".join(bodies) + "\n" + END + "\n"


def render_all_at_once(app):
    """Make the SVG image of every equation the EPUB will show that is not there yet, with one latex run."""
    config = app.config
    if app.builder.name != "epub" or config.epub_math_renderer != "imgmath":
        return
    fmt = config.imgmath_image_format.lower()
    folder = Path(app.builder.outdir) / app.builder.imagedir / "math"
    wanted = {}
    for docname in sorted(app.env.found_docs & set(app.env.all_docs)):
        for math in imgmath_sources(app.env.get_doctree(docname)):
            document = generate_latex_macro(fmt, math, config, app.builder.confdir)
            name = f"{hashlib.sha1(document.encode(), usedforsecurity=False).hexdigest()}.{fmt}"
            if not (folder / name).is_file():
                wanted[name] = document
    if not wanted or fmt != "svg":
        return
    folder.mkdir(parents=True, exist_ok=True)
    names = list(wanted)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "math.tex").write_text(batch_document([wanted[name] for name in names]), encoding="utf-8")
        latex = subprocess.run([config.imgmath_latex, "--interaction=nonstopmode", *config.imgmath_latex_args,
                                "math.tex"], cwd=tmp, capture_output=True, text=True, errors="replace")
        if latex.returncode != 0:  # imgmath renders each equation alone, and reports the one that fails
            logger.info("epub_math: the batch of %d equations did not compile; imgmath renders them one by one",
                        len(names))
            return
        subprocess.run([config.imgmath_dvisvgm, *config.imgmath_dvisvgm_args, "--page=1-", "--output=%p.svg",
                        "math.dvi"], cwd=tmp, capture_output=True, check=True)
        width = len(str(len(names)))
        for page, name in enumerate(names, 1):
            made = Path(tmp) / f"{page:0{width}d}.svg"
            if not made.is_file():
                made = Path(tmp) / f"{page}.svg"
            if made.is_file():
                made.replace(folder / name)
    logger.info("epub_math: %d equation images made in one latex run", len(names))


def setup(app):
    app.setup_extension("sphinx.ext.imgmath")
    app.add_config_value("epub_math_renderer", None, "epub", str)
    app.connect("builder-inited", render_all_at_once)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
