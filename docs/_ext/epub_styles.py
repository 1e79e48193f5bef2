"""The EPUB carries only the stylesheets of its own theme: the site's are not valid EPUB CSS.

Corrects: every stylesheet the site adds (``html_css_files`` in conf.py, and those extensions add, such as
MyST-NB's) is linked from the EPUB's pages and packed into it, and epubcheck rejects them (CSS-008: selectors
and values newer than the CSS e-readers must parse). For the EPUB builder only, they are taken off the pages and
left out of the package (``epub_exclude_files``); the EPUB theme's own stylesheet and Pygments' stay.

Public API only: ``builder-inited`` (after the extensions' handlers, priority 900), ``html-page-context``
and the registry's list of the stylesheets the extensions added. Verified with Sphinx 9.0.4 and MyST-NB 1.4.0.
"""

from __future__ import annotations


def site_stylesheets(app) -> set[str]:
    """The stylesheets the configuration and the extensions add, as named under ``_static/``."""
    configured = [entry[0] if isinstance(entry, (tuple, list)) else entry for entry in app.config.html_css_files]
    return {str(name) for name in configured} | {str(name) for name, _ in app.registry.css_files}


def leave_out_site_stylesheets(app):
    """Keep the site's stylesheets out of the EPUB package."""
    if app.builder.name == "epub":
        site = sorted(f"_static/{name}" for name in site_stylesheets(app))
        app.config.epub_exclude_files = [*app.config.epub_exclude_files, *site]


def unlink_site_stylesheets(app, pagename, templatename, context, doctree):
    """Take the site's stylesheets off an EPUB page."""
    if app.builder.name == "epub" and "css_files" in context:
        site = {f"_static/{name}" for name in site_stylesheets(app)}
        context["css_files"] = [css for css in context["css_files"] if str(getattr(css, "filename", css)) not in site]


def setup(app):
    app.connect("builder-inited", leave_out_site_stylesheets, priority=900)
    app.connect("html-page-context", unlink_site_stylesheets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
