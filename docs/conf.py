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
import json
import os
import shutil
from pathlib import Path

from sphinx.util import logging as sphinx_logging

# Chapters that measure memory (tracemalloc) must print the same numbers on
# every build: keep attention_ref's kernels on one thread while executing them.
os.environ["ATTENTION_REF_NUM_THREADS"] = "1"

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


def _hash_files(paths) -> str:
    """Short hash of the existing files among `paths`: their names (relative to the repository) and contents."""
    digest = hashlib.sha256()
    for path in paths:
        if path.is_file():
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def source_fingerprint() -> str:
    """Hash of everything executed chapters depend on besides their own text."""
    return _hash_files([
        *sorted(PACKAGE.glob("*.py")),
        DOCS / "chapters" / "matplotlibrc",
        ROOT / "benchmarks" / "results.json",  # read by the Performance chapter
    ])


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

# Self-hosted MathJax 3: the sphinx-mathjax-offline package (docs extra) ships
# MathJax 3.2.2 and copies it to _static/mathjax/ when the build finishes, so
# no page loads anything from a CDN (checked by tests/test_site.py).
extensions.append("sphinx-mathjax-offline")
mathjax_path = "mathjax/tex-chtml.js"

# -- HTML output -----------------------------------------------------------------

html_theme = "sphinx_book_theme"
html_title = "attention_ref"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_favicon = "_static/favicon.svg"
html_last_updated_fmt = None  # reproducible pages: no build timestamps
html_copy_source = True
html_show_sourcelink = False
# No result snippets on the search page: Sphinx 9 fetches each hit's page and, for a
# heading found through a MyST slug anchor (an empty <span id>), appends null and
# throws a TypeError in the reader's console (tests/test_site.py catches it).
html_show_search_summary = False
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
# First visit (nothing in localStorage): follow the reader's system setting. Without
# this pydata-sphinx-theme logs a console error ("Got invalid theme mode").
html_context = {"default_mode": "auto"}

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


def _with_cached_outputs(app, notebook):
    """The notebook with the outputs of its executed twin in the jupyter cache.

    When a chapter's outputs come from the cache, MyST-NB writes the notebook
    to ``jupyter_execute/`` without them; the cache holds the executed copy.
    """
    import nbformat
    from jupyter_cache import get_cache

    node = nbformat.from_dict(notebook)
    try:
        _, merged = get_cache(app.config.nb_execution_cache_path).merge_match_into_notebook(node)
    except KeyError:  # executed in this build (or not cached): the file has the outputs
        return notebook
    return json.loads(nbformat.writes(merged))


def _merge_streams(outputs):
    """Join each stream's chunks (stdout, stderr) into one output, exactly.

    How a kernel splits one ``print`` into messages is a matter of timing
    (``print(x)`` writes ``x`` and the newline separately), so an executed
    notebook is only reproducible once the chunks are joined. MyST-NB's own
    merge strips each chunk's trailing whitespace and so turns the split
    ``"a" | "\\nb\\n"`` into ``"a\\n\\nb\\n"``: this join is exact instead, and
    replaces it for the pages too (see `setup`).
    """
    merged, streams = [], {}
    for output in outputs:
        if output.get("output_type") != "stream":
            merged.append(output)
        elif output["name"] in streams:
            first = streams[output["name"]]
            first["text"] = "".join(first["text"]) + "".join(output["text"])
        else:
            output = dict(output, text="".join(output["text"]))
            streams[output["name"]] = output
            merged.append(output)
    return merged


def _offer_notebook_download(app, pagename, templatename, context, doctree):
    """Put each chapter's executed notebook in ``_sources/`` and let the theme's download menu offer it.

    sphinx-book-theme only does this when a launch button (Binder, Colab, ...)
    is configured; we have none (nothing reaches out), so do the same here,
    before the theme builds its buttons (priority 501).
    """
    if "kernelspec" not in app.env.metadata.get(pagename, {}):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if executed.is_file():
        target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        # Cell ids are random when MyST-NB reads a text notebook: number them so
        # that every build offers byte-identical notebooks.
        # Execution counts are null when the outputs come from the cache: number
        # the code cells in order, as one top-to-bottom run would have.
        notebook = _with_cached_outputs(app, json.loads(executed.read_text(encoding="utf-8")))
        count = 0
        for index, cell in enumerate(notebook.get("cells", [])):
            if "id" in cell:
                cell["id"] = f"cell-{index}"
            if cell.get("cell_type") == "code":
                count += 1
                cell["execution_count"] = count
                cell["outputs"] = _merge_streams(cell.get("outputs", []))
                for output in cell["outputs"]:
                    if "execution_count" in output:
                        output["execution_count"] = count
        target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        context["ipynb_source"] = f"{pagename}.ipynb"


def _fix_citation_roles(app, pagename, templatename, context, doctree):
    """Mark citations (numpydoc's References) as list items of their ``role="list"`` container.

    Docutils gives each one the deprecated DPUB role ``doc-biblioentry``, which
    axe reports (aria-deprecated-role, aria-required-children).
    """
    if "body" in context:
        context["body"] = context["body"].replace('role="doc-biblioentry"', 'role="listitem"')


def _copy_late_assets_early(app):
    """Copy MathJax's and MyST-NB's files into ``_static/`` before any page is written.

    Both extensions copy them when the build finishes, so a clean build writes
    ``tex-chtml.js`` without the ``?v=<checksum>`` that an incremental build
    adds (the file exists by then): the two builds' pages would differ.
    """
    if app.builder.format != "html":
        return
    import importlib

    from myst_nb.sphinx_ext import add_global_html_resources

    (Path(app.outdir) / "_static").mkdir(parents=True, exist_ok=True)
    importlib.import_module("sphinx-mathjax-offline").copy_mathjax_files(app, None)
    add_global_html_resources(app, None)


def _execute_chapters_side_by_side(app, env, docnames):
    """Execute the chapters this build must run, one kernel per core, before Sphinx reads them.

    Sphinx reads documents one after another, and MyST-NB executes each
    notebook as it is read (Sphinx's parallel mode, -j, made no difference:
    it hands out neighbouring documents in batches, and the chapters sit
    together in the same batch). Here the notebooks missing from the
    jupyter cache are read the way MyST-NB reads them and executed side by side
    into the cache; MyST-NB then finds every one of them there, exactly as in a
    warm build. A notebook that fails is left out of the cache, so MyST-NB runs
    it again and reports the failure, naming the chapter and the cell, as usual.
    """
    config = env.mystnb_config
    workers = os.cpu_count() or 1
    if config.execution_mode != "cache" or workers < 2:
        return
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import nullcontext
    from tempfile import TemporaryDirectory

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from jupyter_cache.executors.utils import single_nb_execution
    from myst_nb.core.read import create_nb_reader

    cache = get_cache(config.execution_cache_path)
    missing = []  # (path, notebook, read format)
    for docname in sorted(docnames):
        path = Path(env.doc2path(docname))
        text = path.read_text(encoding="utf-8")
        reader = create_nb_reader(str(path), env.myst_config, config, text)
        if reader is None:  # plain Markdown, no code to run
            continue
        notebook = reader.read(text)
        own = notebook.metadata.get(config.metadata_key, {})  # a notebook's own settings, as MyST-NB applies them
        if own.get("execution_mode", config.execution_mode) != "cache":
            continue
        try:
            cache.match_cache_notebook(notebook)
        except KeyError:
            missing.append((path, notebook, reader.read_fmt))
    if len(missing) < 2:  # nothing to run side by side: MyST-NB runs it while reading
        return

    def execute(item):
        path, notebook, _ = item
        with TemporaryDirectory() if config.execution_in_temp else nullcontext(str(path.parent)) as cwd:
            return single_nb_execution(
                notebook, cwd=cwd, allow_errors=config.execution_allow_errors, timeout=config.execution_timeout
            )

    threads = min(workers, len(missing))
    sphinx_logging.getLogger(__name__).info("executing %d notebooks on %d cores", len(missing), threads)
    with ThreadPoolExecutor(threads) as pool:  # the kernels are processes; the threads only wait for them
        results = list(pool.map(execute, missing))
    for (path, notebook, read_fmt), result in zip(missing, results, strict=True):
        if result.err is None:  # as MyST-NB caches a notebook it executed itself
            staged = cache.add_nb_to_project(str(path), read_data=read_fmt)
            bundle = CacheBundleIn(notebook, staged.uri, data={"execution_seconds": result.time})
            cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)


def _reread_everything_if_anything_changed(app, env, added, changed, removed):
    """Re-read every document whenever one (or a static file) changed, so incremental builds equal clean ones.

    Sphinx's incremental build drops the index entries of documents it does not
    re-read from ``searchindex.js`` (the API pages' entries vanish after editing
    one chapter, or when only some pages are rewritten), and it does not
    rewrite unchanged pages when only a static file changed, so they keep
    linking the old ``custom.css?v=<checksum>``.
    Re-reading is cheap: executed chapters come from the cache, so only a
    changed notebook runs again; a rebuild with nothing changed still reads
    nothing.
    """
    static = _hash_files(sorted((DOCS / "_static").rglob("*")))  # pages link these with a checksum
    static_changed = getattr(env, "attention_ref_static_hash", None) != static
    env.attention_ref_static_hash = static
    # Pages the builder will rewrite anyway (an output file older than its source or a template): writing only
    # some of them would also leave searchindex.js without the other pages' index entries.
    rewrite = set(app.builder.get_outdated_docs()) if app.builder.format == "html" else set()
    if added or changed or removed or static_changed or rewrite:
        # Every page will be written again: let Sphinx index them afresh instead of
        # patching the old searchindex.js, which keeps terms of removed text (with
        # no pages) and loses the API pages' index entries.
        (Path(app.outdir) / "searchindex.js").unlink(missing_ok=True)
        return sorted(env.found_docs - set(added) - set(changed))
    return []


def _keep_the_complete_search_index(app):
    """Leave searchindex.js alone when a build writes no page.

    Sphinx rewrites the search index on every build, from the old file plus
    the pages it writes; loading the old file loses its index entries (the API
    pages' objects) and keeps terms of removed text. With every page rewritten
    whenever anything changed (above), only a build that writes nothing would
    still degrade the index, so that build keeps the file it has.
    """
    builder = app.builder
    if not hasattr(builder, "dump_search_index"):
        return
    prepare_writing, dump_search_index = builder.prepare_writing, builder.dump_search_index
    written: list = []

    def prepare(docnames):
        written.extend(docnames)
        prepare_writing(docnames)

    def dump():
        if written or not (Path(builder.outdir) / builder.searchindex_filename).is_file():
            dump_search_index()

    builder.prepare_writing, builder.dump_search_index = prepare, dump


def setup(app):
    import nbformat
    from myst_nb.core import render

    # Pages render merged streams through the same exact join as the notebooks.
    render.coalesce_streams = lambda outputs: [nbformat.from_dict(o) for o in _merge_streams(outputs)]
    app.connect("env-get-outdated", _reread_everything_if_anything_changed)
    app.connect("env-before-read-docs", _execute_chapters_side_by_side)
    app.connect("html-page-context", _fix_citation_roles)
    app.connect("builder-inited", _copy_late_assets_early, priority=900)
    app.connect("builder-inited", _keep_the_complete_search_index)
    app.connect("config-inited", _configure_execution_cache)
    app.connect("config-inited", _warm_matplotlib)
    app.connect("html-page-context", _offer_notebook_download, priority=500)
    # Load MathJax on every page, not only on pages with equations: the sidebar
    # shows chapter titles that contain math (e.g. chapter 4's \sqrt{d_k}).
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
