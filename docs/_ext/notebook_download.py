"""Offer each chapter's executed notebook in the theme's download menu, identical from build to build.

Adds what sphinx-book-theme only does when a launch button (Binder, Colab, ...) is configured: the
executed notebook of each chapter is written to ``_sources/<page>.ipynb`` and the download menu offers it.
Corrects three things about the notebook MyST-NB leaves in ``jupyter_execute/``: when the outputs came from
the jupyter cache, the file has none (they are merged back from the cache here); cell ids are random (they
are numbered here); and execution counts are null for cached outputs (the code cells are numbered in order,
as one top-to-bottom run would have). Streams are joined exactly (``exact_streams.merge_streams``).
Corrects one thing about its Markdown: it is the chapter's MyST source, which no notebook front end renders;
``_notebook_markdown.for_readers`` writes the glued values in, makes roles links (to the hosted pages when the
site's address is known: ``html_baseurl``, else Read the Docs' ``READTHEDOCS_CANONICAL_URL``), admonitions
blockquotes and glued figures embedded images, and collapses the hidden solution cells;
``explorables.still_figures`` turns each explorable figure's cell into its still image. The notebook records the
chapter it was built from and that file's SHA-256 (``metadata.attention_ref``), which ``_launch_notebooks``
checks before it makes the committed notebooks from it.

Adds what a notebook needs to run outside the repository (``runnable_anywhere``, also used for the committed
notebooks of ``_launch_notebooks``): a first cell that checks ``attention_ref`` (and ``ml_dtypes`` where the
chapter imports it, or calls what needs it: ``NEEDED_THROUGH``) can be imported, installs what is missing
when it runs in Colab and the repository is known
(from the theme's ``repository_url`` and ``repository_branch``, which ``live_code`` sets), and otherwise prints
the ``%pip install`` line and raises; a stand-in for ``myst_nb.glue`` where myst-nb is missing, which shows a
value only when asked to (``display=True``), as ``glue`` does outside the book (the values the prose uses are
already written into its Markdown); and the files a chapter reads from the repository (``EMBEDDED``: the
benchmark and frameworks records) carried in the notebook, the expression that reads one replaced by its content
as a Python literal. The file is written after the theme's launch buttons (priority 502), which copy MyST-NB's
raw notebook to the same place when configured.

Public API only: the ``html-page-context`` event (named before the theme builds its buttons, priority 500;
written after them, 502), jupyter-cache's ``merge_match_into_notebook``, and for the links and included files
the standard and Python domains' data, ``env.titles``, intersphinx's ``InventoryAdapter`` and Sphinx's
``LiteralIncludeReader``. Verified with Sphinx 9.0.4, sphinx-book-theme 1.4.0,
MyST-NB 1.4.0 and jupyter-cache 1.0.1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import posixpath
import pprint
import re
from pathlib import Path

import nbformat
from _builders import is_website
from _notebook_markdown import Book, for_readers, glue_values
from exact_streams import merge_streams
from explorables import still_figures
from jupyter_cache import get_cache
from sphinx.directives.code import LiteralIncludeReader
from sphinx.ext.intersphinx import InventoryAdapter

ROOT = Path(__file__).resolve().parents[2]
# The frameworks whose results a page runs live where they can be imported (attention_ref.records).
FRAMEWORKS = ("jax", "torch", "transformers")
# Files a page's code reads from the repository (relative to ROOT), and the expression that reads one (from the
# page's own folder, some levels below ROOT).
EMBEDDED = {
    "benchmarks/results.json": r'json\.loads\(Path\("(?:\.\./)+benchmarks/results\.json"\)\.read_text\(\)\)',
    # Read by the testing page: what a check costs (benchmarks/check_speed.py).
    "benchmarks/check_speed.json": r'json\.loads\(Path\("(?:\.\./)+benchmarks/check_speed\.json"\)\.read_text\(\)\)',
    # Read by the pages that compare with PyTorch or JAX where they are missing (attention_ref.records).
    "docs/chapters/frameworks_record.json": r"json\.loads\(RECORD_FILE\.read_text\(\)\)",
    # Read by the testing page: the checkers' record on GPU kernels and their measured sensitivity.
    "docs/chapters/gpu_record.json": r"json\.loads\(GPU_RECORD_FILE\.read_text\(\)\)",
    "docs/chapters/sensitivity_record.json": r"json\.loads\(SENSITIVITY_FILE\.read_text\(\)\)",
}
# What the chapters import beyond attention_ref and its own requirements, and the pip name of each. The setup
# cell checks for the ones a notebook imports, and for the ones it needs through attention_ref (`NEEDED_THROUGH`).
OPTIONAL = {"ml_dtypes": "ml_dtypes", "hypothesis": "hypothesis"}
# Code that makes attention_ref import an optional module: its bfloat16 and fp8 dtypes are ml_dtypes'. A notebook
# that only calls ar.quantize_fp8 imports nothing itself, yet fails half-way without ml_dtypes.
NEEDED_THROUGH = {"ml_dtypes": re.compile(r"\bbfloat16\b|\bfloat8_|\bfloat[46]_|\bquantize_fp8\b|_descale\b")}
SETUP_CELL = """\
# This notebook is a page of the attention_ref book. This cell checks that what it needs can be imported.
import importlib
import importlib.util
import sys

# Each module this notebook imports that may be missing, and pip's requirement for it (None for attention_ref
# when the repository was not known as the notebook was written).
NEEDS = {needs!r}
missing = {{name: spec for name, spec in NEEDS.items() if importlib.util.find_spec(name) is None}}
command = "%pip install " + " ".join(
    '"' + (spec or name + " @ git+<the repository's URL>") + '"' for name, spec in missing.items())
if missing and all(missing.values()) and "google.colab" in sys.modules:  # Colab: install into this runtime
    get_ipython().run_line_magic("pip", command.removeprefix("%pip ") + " -q")
    importlib.invalidate_caches()
elif missing:
    print("Install what this notebook needs into this kernel's environment, then restart the kernel:\\n    "
          + command + "\\n(or, in a clone of the repository: pip install -e .)")
    raise ModuleNotFoundError("this notebook needs " + ", ".join(missing))

if importlib.util.find_spec("myst_nb") is None:  # myst-nb's glue() puts a value in the book's text: show it here
    from types import SimpleNamespace

    from IPython.display import display as show

    sys.modules["myst_nb"] = SimpleNamespace(glue=lambda name, variable, display=True: display and show(variable))
"""


def install_spec(repository_url, branch):
    """The pip requirement that installs attention_ref from `repository_url` (a web URL) at `branch`, or None."""
    if not repository_url:
        return None
    return f"attention_ref @ git+{repository_url.rstrip('/')}.git@{branch or 'main'}"


def _imported(source):
    """Top-level names of the modules the code `source` imports, itself or through attention_ref."""
    found = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", source, flags=re.MULTILINE))
    return found | {name for name, uses in NEEDED_THROUGH.items() if uses.search(source)}


def _setup_cell(install, others):
    return {"cell_type": "code", "id": "setup", "metadata": {"tags": ["setup"]}, "outputs": [],
            "execution_count": None, "source": SETUP_CELL.format(needs={"attention_ref": install, **others})}


class _NonFinite(float):
    """NaN or an infinity, written as Python reads it back (``float("nan")``; a bare ``nan`` is a NameError)."""

    def __repr__(self):
        return f'float("{float.__repr__(self)}")'


def _python(value):
    """JSON data `value` with its non-finite numbers as `_NonFinite`, so its ``pprint`` is valid Python."""
    if isinstance(value, dict):
        return {key: _python(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_python(item) for item in value]
    return _NonFinite(value) if isinstance(value, float) and not math.isfinite(value) else value


def _embedded(source):
    """`source` with each read of a file listed in `EMBEDDED` replaced by the file's content, as a literal."""
    for path, read in EMBEDDED.items():
        if re.search(read, source):
            data = _python(json.loads((ROOT / path).read_text(encoding="utf-8")))
            record = pprint.pformat(data, sort_dicts=False)
            literal = f"(  # {path}, as recorded when this notebook was built\n{record})"
            source = re.sub(read, lambda _, literal=literal: literal, source)
    return source


def runnable_anywhere(notebook, install=None):
    """The notebook with a setup check first (installing from `install` in Colab) and repository files embedded."""
    imported = set()
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = _embedded(source)
            imported |= _imported(source)
    others = {name: spec for name, spec in OPTIONAL.items() if name in imported}
    notebook["cells"] = [_setup_cell(install, others), *notebook.get("cells", [])]
    return notebook


def _with_cached_outputs(app, notebook):
    """The notebook with the outputs of its executed twin in the jupyter cache (unchanged if not cached)."""
    node = nbformat.from_dict(notebook)
    try:
        _, merged = get_cache(app.config.nb_execution_cache_path).merge_match_into_notebook(node)
    except KeyError:  # executed in this build (or not cached): the file has the outputs
        return notebook
    return json.loads(nbformat.writes(merged))


def numbered(notebook):
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


def _executed(app, pagename):
    """MyST-NB's executed notebook of the page, if the page is a notebook of the site (else None: the EPUB offers
    no downloads)."""
    if not is_website(app.builder) or "kernelspec" not in app.env.metadata.get(pagename, {}):
        return None
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    return executed if executed.is_file() else None


def offer_notebook_download(app, pagename, templatename, context, doctree):
    """Name the page's notebook in the page context, for the theme's download menu."""
    if _executed(app, pagename):
        context["ipynb_source"] = f"{pagename}.ipynb"


def site_url(app):
    """The address the site is published at (``html_baseurl``, else Read the Docs' canonical URL), or ''."""
    return (app.config.html_baseurl or os.environ.get("READTHEDOCS_CANONICAL_URL", "")).rstrip("/")


def _external(env, target):
    """The URL intersphinx knows for the Python object `target` (Python's, NumPy's, Matplotlib's pages), or None."""
    for objtype, items in InventoryAdapter(env).main_inventory.items():
        if objtype.startswith("py:") and target in items:
            item = items[target]
            return item.uri if hasattr(item, "uri") else item[2]
    return None


def book_for(app, pagename, notebook):
    """The `Book` of page `pagename`: its glued values, the links of its roles, its included files."""
    env, base = app.env, site_url(app)

    def url(docname, anchor=""):
        return f"{base}/{app.builder.get_target_uri(docname)}" + (f"#{anchor}" if anchor else "") if base else None

    def link(role, target):
        if role in ("ref", "numref", "any"):
            docname, anchor, title = env.get_domain("std").labels.get(target, (None, None, None))
            return (title, url(docname, anchor)) if docname else (None, None)
        if role == "doc":
            docname = posixpath.normpath(target.lstrip("/") if target.startswith("/")
                                         else posixpath.join(posixpath.dirname(pagename), target))
            return (env.titles[docname].astext(), url(docname)) if docname in env.titles else (None, None)
        entry = env.get_domain("py").objects.get(target)
        return (target, url(entry.docname, entry.node_id)) if entry else (target, _external(env, target))

    def include(argument, options):
        _, path = env.relfn2path(argument, pagename)
        text, _ = LiteralIncludeReader(path, options, app.config).read()
        return text, options.get("language", "")

    return Book(glue=glue_values(notebook), link=link, include=include, page=pagename)


def frameworks_installed():
    """The frameworks the book's pages compare with (``FRAMEWORKS``) that this build could import: which of them ran
    live. A notebook records it, so that a check compares notebooks of like builds (``_launch_notebooks``)."""
    return [name for name in FRAMEWORKS if importlib.util.find_spec(name) is not None]


def source_digest(path):
    """SHA-256 of a chapter's source file: recorded in its notebook, so a copy can tell which text it was made from."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_notebook(app, pagename, templatename, context, doctree):
    """Write the page's executed notebook to ``_sources/``."""
    executed = _executed(app, pagename)
    if not executed:
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    notebook = json.loads(executed.read_text(encoding="utf-8"))
    options = app.config.html_theme_options  # the repository, as live_code (or conf.py) set it
    install = install_spec(options.get("repository_url"), options.get("repository_branch"))
    notebook = _with_cached_outputs(app, notebook)
    notebook = still_figures(for_readers(notebook, book_for(app, pagename, notebook)))
    notebook = numbered(runnable_anywhere(notebook, install))
    source = Path(app.env.doc2path(pagename))
    notebook["metadata"]["attention_ref"] = {
        "source": Path(app.srcdir).name + "/" + source.relative_to(app.srcdir).as_posix(),
        "source_sha256": source_digest(source), "install": install, "frameworks": frameworks_installed()}
    target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def setup(app):
    app.setup_extension("myst_nb")
    app.connect("html-page-context", offer_notebook_download, priority=500)
    app.connect("html-page-context", write_notebook, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
