"""Copy MathJax's and MyST-NB's static files before any page is written, so clean and incremental builds agree.

Corrects: sphinx-mathjax-offline and MyST-NB copy their files into ``_static/`` when the build finishes, so
a clean build writes pages linking ``tex-chtml.js`` without the ``?v=<checksum>`` that an incremental build
adds (the file exists by then): the two builds' pages would differ. Running the same copy steps when the
builder starts makes every build see the files. MathJax is also loaded on every page, not only on pages with
equations, because the sidebar shows chapter titles that may contain math.

Calls the two packages' own build-finished handlers, ``copy_mathjax_files(app, exc)`` of
sphinx-mathjax-offline and ``myst_nb.sphinx_ext.add_global_html_resources(app, exception)``, checked at load
time (see ``_upstream``). Verified with sphinx-mathjax-offline 0.0.2, MyST-NB 1.4.0 and Sphinx 9.0.4.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from _builders import is_website
from _upstream import require
from myst_nb import sphinx_ext

copy_mathjax_files = require(
    __name__, importlib.import_module("sphinx-mathjax-offline"), "copy_mathjax_files", ("app", "exc"),
    "sphinx-mathjax-offline",
)
add_global_html_resources = require(
    __name__, sphinx_ext, "add_global_html_resources", ("app", "exception"), "myst-nb"
)


def copy_late_assets_early(app):
    if not is_website(app.builder):
        return
    (Path(app.outdir) / "_static").mkdir(parents=True, exist_ok=True)
    copy_mathjax_files(app, None)
    add_global_html_resources(app, None)


def setup(app):
    app.setup_extension("myst_nb")
    app.setup_extension("sphinx-mathjax-offline")
    app.connect("builder-inited", copy_late_assets_early, priority=900)
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
