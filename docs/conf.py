"""Sphinx configuration for the attention_ref book.

The build is strict (``make docs`` runs ``sphinx -W --keep-going -n``: every
warning, including every unresolved cross-reference, is an error) and works
offline: intersphinx reads inventories shipped in ``_inventories/`` and the
theme loads no external assets.

Chapters are MyST-NB notebooks executed at build time through jupyter-cache.
The cache lives in the build's doctree folder, in a sub-folder named after a
hash of the package source (and of the figure style), so editing
``attention_ref`` re-executes every chapter while an unchanged rebuild reuses
the stored outputs.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PACKAGE = ROOT / "attention_ref"

# -- Project -------------------------------------------------------------------

project = "attention_ref"
author = "The attention_ref developers"
copyright = "2026, The attention_ref developers"
try:
    from attention_ref import __version__ as release
except ImportError:  # pragma: no cover - the package is installed by `make docs`
    release = "0.1.0"
version = release

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "jupyter_execute", "_inventories", "_templates"]
templates_path = ["_templates"]
nitpicky = True
# Words in numpydoc type descriptions that are not objects (kept short on purpose:
# prefer numpydoc_xref_aliases below, which turns the real types into links).
nitpick_ignore: list[tuple[str, str]] = []

# -- MyST / MyST-NB ------------------------------------------------------------

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "substitution"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

nb_execution_mode = "cache"
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 180  # seconds per cell; chapters are designed to run in well under 10 s in total
nb_execution_in_temp = False  # run in docs/chapters/ so docs/chapters/matplotlibrc styles every figure
nb_merge_streams = True
# Anything a cell writes to stderr (a warning, a stray log line) becomes a Sphinx
# warning, i.e. a build error under -W: every cell must run cleanly.
nb_output_stderr = "warn"
# Set per build in _configure_execution_cache() below; "" would mean "<outdir>/../.jupyter_cache".
nb_execution_cache_path = ""


def source_fingerprint() -> str:
    """Hash of everything executed chapters depend on besides their own text."""
    digest = hashlib.sha256()
    inputs = [*sorted(PACKAGE.glob("*.py")), DOCS / "chapters" / "matplotlibrc"]
    for path in inputs:
        if path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def _configure_execution_cache(app, config):
    """Point jupyter-cache at ``<doctreedir>/jupyter_cache/<fingerprint>``.

    jupyter-cache keys executed notebooks on their own content only. Putting
    the package fingerprint in the path makes a source change start from an
    empty cache; and because ``nb_execution_cache_path`` is an "env" config
    value, Sphinx also re-reads every document when it changes. Caches of
    older fingerprints are removed. Each output folder has its own cache, so
    parallel builds into different folders do not share a database.
    """
    if config.nb_execution_cache_path:  # set explicitly (e.g. -D on the command line)
        return
    root = Path(app.doctreedir) / "jupyter_cache"
    fingerprint = source_fingerprint()
    if root.is_dir():
        for stale in root.iterdir():
            if stale.name != fingerprint:
                shutil.rmtree(stale, ignore_errors=True)
    config.nb_execution_cache_path = str(root / fingerprint)


# -- API reference (autodoc, autosummary, numpydoc) -----------------------------

autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"
autodoc_default_options = {"members": False}
add_module_names = False

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = True
# Only words listed here (and numpydoc's own defaults: int, float, bool, str,
# tuple, None, ndarray, array_like, ...) become links; shape descriptions such
# as "shape (..., L, E)" and words like "optional" stay plain text.
numpydoc_xref_ignore = "all"
def _xref(role: str, target: str) -> str:
    """An explicit role: numpydoc leaves an alias that maps a name to itself unlinked under xref_ignore="all"."""
    return f":{role}:`{target}`"


numpydoc_xref_aliases = {
    "Generator": "numpy.random.Generator",
    "numpy.random.Generator": _xref("class", "numpy.random.Generator"),
    "dtype": "numpy.dtype",
    "numpy.dtype": _xref("class", "numpy.dtype"),
    "data-type": "numpy.dtype",
    "float16": "numpy.float16",
    "float32": "numpy.float32",
    "float64": "numpy.float64",
    "numpy.float16": _xref("class", "numpy.float16"),
    "numpy.float32": _xref("class", "numpy.float32"),
    "numpy.float64": _xref("class", "numpy.float64"),
    "numpy.ndarray": _xref("class", "numpy.ndarray"),
    "Axes": "matplotlib.axes.Axes",
    "matplotlib.axes.Axes": _xref("class", "matplotlib.axes.Axes"),
    "Figure": "matplotlib.figure.Figure",
    "matplotlib.figure.Figure": _xref("class", "matplotlib.figure.Figure"),
    "Colormap": "matplotlib.colors.Colormap",
    "matplotlib.colors.Colormap": _xref("class", "matplotlib.colors.Colormap"),
    "MultiHeadParams": "attention_ref.MultiHeadParams",
    "attention_ref.MultiHeadParams": _xref("class", "attention_ref.MultiHeadParams"),
    "KVCache": "attention_ref.KVCache",
    "attention_ref.KVCache": _xref("class", "attention_ref.KVCache"),
}

# -- Intersphinx: offline, from inventories shipped in _inventories/ -------------

intersphinx_mapping = {
    "python": ("https://docs.python.org/3", str(DOCS / "_inventories" / "python.inv")),
    "numpy": ("https://numpy.org/doc/stable", str(DOCS / "_inventories" / "numpy.inv")),
    "matplotlib": ("https://matplotlib.org/stable", str(DOCS / "_inventories" / "matplotlib.inv")),
}

# -- Math ----------------------------------------------------------------------

# HOOK for self-hosted MathJax: if docs/_static/mathjax/tex-chtml.js exists
# (H8 vendors it), the book uses it and loads nothing from a CDN; otherwise
# Sphinx's default CDN URL is used.
_LOCAL_MATHJAX = DOCS / "_static" / "mathjax" / "tex-chtml.js"
if _LOCAL_MATHJAX.is_file():
    mathjax_path = "mathjax/tex-chtml.js"

# -- HTML output -----------------------------------------------------------------

html_theme = "sphinx_book_theme"
html_title = "attention_ref"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_last_updated_fmt = None  # reproducible pages: no build timestamps
html_copy_source = True
html_show_sourcelink = False
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": True,
    "use_repository_button": False,
    "use_issues_button": False,
    "use_edit_page_button": False,
    "use_source_button": False,
    "launch_buttons": {},  # no Binder/Colab/Thebe: nothing reaches out
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
}

copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True


def _warm_matplotlib(app, config):
    """Build matplotlib's font cache before any chapter runs.

    On a fresh machine matplotlib announces the (slow) cache build on stderr,
    which ``nb_output_stderr = "warn"`` would turn into a build error.
    """
    try:
        import matplotlib.font_manager  # noqa: F401
    except ImportError:  # pragma: no cover
        pass


def setup(app):
    app.connect("config-inited", _configure_execution_cache)
    app.connect("config-inited", _warm_matplotlib)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
