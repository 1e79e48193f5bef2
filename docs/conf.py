"""Sphinx configuration for the attention_ref book: settings only.

The build is strict (``make docs`` runs ``sphinx -W --keep-going -n``: every warning, including every
unresolved cross-reference, is an error) and works offline: intersphinx reads inventories shipped in
``_inventories/``, MathJax is self-hosted, and the theme loads no external assets.

What the build does beyond these settings lives in small local extensions in ``_ext/``, one concern each,
loaded by name below; each module's docstring says which upstream behaviour it corrects.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

# -- Project -------------------------------------------------------------------

project = "attention_ref"
author = "The attention_ref developers"
copyright = "2026, The attention_ref developers"
from attention_ref import __version__ as release  # make docs installs the package

version = release

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.imgmath",  # the EPUB's equations, as SVG images (epub_math_renderer below)
    "sphinx_copybutton",
    # Local extensions (_ext/):
    "execution_cache",  # execution cache keyed on the package source; deterministic, quiet chapter runs
    "chapter_execution",  # chapters missing from the cache run side by side, over encrypted kernel channels
    "exact_streams",  # a cell's printed output joined exactly, as the kernel wrote it
    "notebook_download",  # each chapter's executed notebook in the download menu, its Markdown made plain
    "search_index",  # incremental builds keep searchindex.js complete and equal clean builds
    "early_assets",  # MathJax's and MyST-NB's files in place before pages are written
    "mathjax_prune",  # MathJax 3 self-hosted (sphinx-mathjax-offline): only the files tex-chtml.js can request
    "citation_roles",  # citations get an ARIA role axe accepts
    "citation_parentheses",  # a citation inside parentheses reads "(Vaswani et al., 2017)", not doubly bracketed
    "live_code",  # "Live code" button: cells run on make serve's kernel or Binder; launch menu when the repo is known
    "reading_time",  # each page's reading time under its title; the reading paths' totals on the landing page
    "explorables",  # figures to play with on the static page: every state computed at build time, shown by a script
    "dropdowns",  # admonitions with the dropdown class ("Going deeper") fold as <details>, with no script
    "solutions",  # solution folds say "Solution"; no glue() call in a solution's shown source
    "print_edition",  # PDF and EPUB: solutions under a heading after their exercise, no folded cells
    "epub_math",  # the EPUB's equations as images (epub_math_renderer), the site's with MathJax
    "epub_styles",  # the EPUB: its theme's stylesheets only (epubcheck rejects the site's)
    "latex_book",  # the PDF: every page a chapter, each toctree caption of the landing page a part
    "bounds",  # {glue:up} and {glue:down}: a glued number stated as a bound, rounded outward, not to nearest
    "glued_numbers",  # a glued number never breaks at its hyphen (the EPUB's; the site's and PDF's by style)
]

exclude_patterns = [
    "_build", "_ext", "_latex", "**.ipynb_checkpoints", "jupyter_execute", "_inventories", "_templates"
]
templates_path = ["_templates"]
nitpicky = True
nitpick_ignore: list[tuple[str, str]] = []  # kept empty on purpose: prefer numpydoc_xref_aliases below
# -- MyST / MyST-NB ------------------------------------------------------------

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "substitution"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

nb_execution_mode = "cache"  # the cache's location is set per build by _ext/execution_cache.py
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 180  # seconds per cell; chapters are designed to run in well under 10 s in total
nb_execution_in_temp = False  # run in docs/chapters/ so docs/chapters/matplotlibrc styles every figure
nb_merge_streams = True
# Anything a cell writes to stderr (a warning, a stray log line) becomes a Sphinx warning, i.e. a build
# error under -W: every cell must run cleanly.
nb_output_stderr = "warn"
# A cell output offering an interactive view (text/html, scripts, widgets) and a still one (image/png) shows the
# still one in the EPUB, as the LaTeX builder does already (it renders no HTML): e-readers run no page scripts.
nb_mime_priority_overrides = [
    ("epub", "application/vnd.jupyter.widget-view+json", None),
    ("epub", "application/javascript", None),
    ("epub", "text/html", 70),  # after image/png (50), image/jpeg (60); before text/markdown and text/plain
]

# -- API reference (autodoc, autosummary, numpydoc) -----------------------------

autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"
add_module_names = False

numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = True
# Only words listed here (and numpydoc's defaults: int, float, bool, str, tuple, None, ndarray, array_like, ...)
# become links; "shape (..., L, E)" and "optional" stay plain text. Under xref_ignore="all" an alias that maps a
# name to itself is left unlinked, so the full names map to explicit roles.
numpydoc_xref_ignore = "all"
numpydoc_xref_aliases = {
    "Generator": "numpy.random.Generator",
    "numpy.random.Generator": ":class:`numpy.random.Generator`",
    "dtype": "numpy.dtype",
    "numpy.dtype": ":class:`numpy.dtype`",
    "data-type": "numpy.dtype",
    "float16": "numpy.float16",
    "float32": "numpy.float32",
    "float64": "numpy.float64",
    "numpy.float16": ":class:`numpy.float16`",
    "numpy.float32": ":class:`numpy.float32`",
    "numpy.float64": ":class:`numpy.float64`",
    "numpy.ndarray": ":class:`numpy.ndarray`",
    "Axes": "matplotlib.axes.Axes",
    "matplotlib.axes.Axes": ":class:`matplotlib.axes.Axes`",
    "Figure": "matplotlib.figure.Figure",
    "matplotlib.figure.Figure": ":class:`matplotlib.figure.Figure`",
    "Colormap": "matplotlib.colors.Colormap",
    "matplotlib.colors.Colormap": ":class:`matplotlib.colors.Colormap`",
    "MultiHeadParams": "attention_ref.MultiHeadParams",
    "attention_ref.MultiHeadParams": ":class:`attention_ref.MultiHeadParams`",
    "KVCache": "attention_ref.KVCache",
    "attention_ref.KVCache": ":class:`attention_ref.KVCache`",
}

# -- Intersphinx: offline, from inventories shipped in _inventories/ -------------

_INVENTORIES = Path(__file__).resolve().parent / "_inventories"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", str(_INVENTORIES / "python.inv")),
    "numpy": ("https://numpy.org/doc/stable", str(_INVENTORIES / "numpy.inv")),
    "matplotlib": ("https://matplotlib.org/stable", str(_INVENTORIES / "matplotlib.inv")),
}

# -- Math ----------------------------------------------------------------------

mathjax_path = "mathjax/tex-chtml.js"  # the copy sphinx-mathjax-offline (MathJax 3.2.2) puts in _static/
html_math_renderer = "mathjax"  # the site; LaTeX typesets the PDF's
epub_math_renderer = "imgmath"  # e-readers run no MathJax (_ext/epub_math.py)
imgmath_image_format = "svg"  # latex + dvisvgm (Debian's TeX Live, make tex)
imgmath_font_size = 14

# -- HTML output -----------------------------------------------------------------

html_theme = "sphinx_book_theme"
html_title = "attention_ref"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_favicon = "_static/favicon.svg"
html_last_updated_fmt = None  # reproducible pages: no build timestamps
html_copy_source = True
html_show_sourcelink = False
# No result snippets on the search page: Sphinx 9 fetches each hit's page and, for a heading found through a
# MyST slug anchor (an empty <span id>), appends null and throws a TypeError in the reader's console.
html_show_search_summary = False
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": True,
    "use_repository_button": False,
    "use_issues_button": False,
    "use_edit_page_button": False,
    "use_source_button": False,
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
}
# First visit (nothing stored): follow the system setting; without it the theme logs "Got invalid theme mode".
html_context = {"default_mode": "auto"}

copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

# -- PDF (LaTeX) and EPUB: the same executed doctrees, `make pdf` and `make epub` ----------------------

latex_engine = "xelatex"  # as Read the Docs builds PDFs: latexmk with XeLaTeX
# Title and author are LaTeX.
latex_documents = [("index", "attention_ref.tex", r"attention\_ref", r"The attention\_ref developers", "manual")]
latex_show_urls = "footnote"
latex_additional_files = ["_latex/attention_ref.sty"]  # fonts (DejaVu), tables, breaks in inline code
latex_elements = {
    "fontpkg": "",  # attention_ref.sty sets the fonts
    "preamble": r"\usepackage{attention_ref}",
    # Sphinx titles the table of contents with the first toctree's caption ("Part I. Attention"): it is the contents.
    "tableofcontents": r"\renewcommand{\contentsname}{Contents}\sphinxtableofcontents",
    # A figure goes where it fits, here or at the top of the next page: "H" (exactly here) left the rest of a page
    # blank whenever a figure was taller than it, as on Part I's opening page.
    "figure_align": "htbp",
    "sphinxsetup": "verbatimwrapslines=true, verbatimforcewraps=true, verbatimmaxunderfull=0",
}
epub_basename = "attention_ref"
epub_show_urls = "no"
epub_use_index = False
