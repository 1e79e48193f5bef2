"""Explorable figures: figures a reader can play with on the static page, every number computed by attention_ref.

Corrects: on a static site (Read the Docs, ``make docs``) every figure a chapter executes is a still image, and
MyST-NB's live code needs a kernel (Binder, ``make serve``). An explorable needs neither. A chapter cell calls
one of the figure functions; it runs attention_ref for *every* setting of the figure's controls when the book is
built and returns an `~explorables.widgets.Explorable`: the figure's controls and a JSON table of what each
setting shows, which ``_static/explorables.js`` looks up (it computes nothing), and a still image of the
default setting, with alt text, for whatever cannot run the script.

The package is split by concern:

* ``widgets``: the machinery, and the only module that knows HTML, the JSON table, the still image's PNG, the
  Sphinx side and the notebook side;
* one module per page with figures, each built from ``widgets``' pieces: ``lookup`` (chapter 1), ``scaling``
  (chapter 4), ``masks`` (chapter 5), ``windows`` (the Part II page on windows, sinks and caches).

A new figure is a new module beside these (or a function in its page's module), which its chapter imports as
``from explorables.<module> import <figure>``; it touches neither ``widgets`` nor this file. The names below are
kept for the chapters that import them from the package.

The cell carries the ``explorable`` tag (and ``remove-input``: the reader sees the figure, not the call). It
imports this package, which a notebook outside the repository cannot: `still_figures` turns each such cell of a
downloaded notebook into a Markdown cell showing the still image and its alt text (``notebook_download``).

Sphinx side (public API only): ``setup`` puts ``docs/_ext`` on the ``PYTHONPATH`` the build's kernels inherit
(as ``execution_cache`` sets their thread count), and ``html-page-context`` adds the script and its style sheet
to the pages that hold an explorable (Sphinx's documented per-page ``add_js_file``). Verified with Sphinx 9.0.4
and MyST-NB 1.4.0.
"""

from .lookup import lookup_terms
from .masks import mask_inspector, padding_batch
from .scaling import scaling_selector
from .widgets import Explorable, setup, still_figures
from .windows import alignment_inspector

__all__ = [
    "Explorable",
    "alignment_inspector",
    "lookup_terms",
    "mask_inspector",
    "padding_batch",
    "scaling_selector",
    "setup",
    "still_figures",
]
