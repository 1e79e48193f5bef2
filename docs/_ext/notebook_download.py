"""Offer each chapter's executed notebook in the theme's download menu, identical from build to build.

Adds what sphinx-book-theme only does when a launch button (Binder, Colab, ...) is configured: the
executed notebook of each chapter is written to ``_sources/<page>.ipynb`` and the download menu offers it.
Corrects three things about the notebook MyST-NB leaves in ``jupyter_execute/``: when the outputs came from
the jupyter cache, the file has none (they are merged back from the cache here); cell ids are random (they
are numbered here); and execution counts are null for cached outputs (the code cells are numbered in order,
as one top-to-bottom run would have). Streams are joined exactly (``exact_streams.merge_streams``).

Public API only: the ``html-page-context`` event (before the theme builds its buttons, priority 501) and
jupyter-cache's ``merge_match_into_notebook``. Verified with Sphinx 9.0.4, sphinx-book-theme 1.4.0,
MyST-NB 1.4.0 and jupyter-cache 1.0.1.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from exact_streams import merge_streams
from jupyter_cache import get_cache


def _with_cached_outputs(app, notebook):
    """The notebook with the outputs of its executed twin in the jupyter cache (unchanged if not cached)."""
    node = nbformat.from_dict(notebook)
    try:
        _, merged = get_cache(app.config.nb_execution_cache_path).merge_match_into_notebook(node)
    except KeyError:  # executed in this build (or not cached): the file has the outputs
        return notebook
    return json.loads(nbformat.writes(merged))


def _numbered(notebook):
    """Cell ids ``cell-<index>``, code cells counted in order, streams joined: the same file every build."""
    count = 0
    for index, cell in enumerate(notebook.get("cells", [])):
        if "id" in cell:
            cell["id"] = f"cell-{index}"
        if cell.get("cell_type") == "code":
            count += 1
            cell["execution_count"] = count
            cell["outputs"] = merge_streams(cell.get("outputs", []))
            for output in cell["outputs"]:
                if "execution_count" in output:
                    output["execution_count"] = count
    return notebook


def offer_notebook_download(app, pagename, templatename, context, doctree):
    """Write the page's executed notebook to ``_sources/`` and name it in the page context for the theme."""
    if "kernelspec" not in app.env.metadata.get(pagename, {}):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.is_file():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    notebook = _numbered(_with_cached_outputs(app, json.loads(executed.read_text(encoding="utf-8"))))
    target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app):
    app.setup_extension("myst_nb")
    app.connect("html-page-context", offer_notebook_download, priority=500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
