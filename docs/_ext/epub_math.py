"""Equations in the EPUB as images: the math renderer is chosen per builder.

Corrects: Sphinx picks one math renderer for every HTML builder (``html_math_renderer``), so the EPUB would load
MathJax, a script that e-readers do not run, and show the TeX source. An HTML builder first looks up
``<builder name>_math_renderer`` (``Builder.get_builder_config``), a value Sphinx does not register; this
extension registers ``epub_math_renderer`` so that ``docs/conf.py`` can give the EPUB ``sphinx.ext.imgmath``
(SVG images made by latex and dvisvgm) while the site keeps MathJax. The PDF typesets equations itself.

Public API only (a configuration value read by ``get_builder_config``). Verified with Sphinx 9.0.4.
"""

from __future__ import annotations


def setup(app):
    app.add_config_value("epub_math_renderer", None, "epub", str)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
