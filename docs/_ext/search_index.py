"""Keep ``searchindex.js`` complete and make incremental builds write the same site as clean ones.

Corrects two behaviours of Sphinx's incremental HTML build:

* It rebuilds the search index from the old ``searchindex.js`` plus the pages it writes, and loading the old
  file loses its index entries (the API pages' objects) and keeps the terms of removed text. So whenever any
  document or static file changed, every document is read and written again (cheap: executed chapters come
  from the execution cache, only a changed notebook runs) and the index is made afresh.
* It does not rewrite unchanged pages when only a static file changed, so they keep linking the old
  ``custom.css?v=<checksum>``; the static files' hash counts as a change here.

A build that writes no page (nothing changed) keeps the index it has.

Replaces two methods of the HTML builder instance, ``prepare_writing(docnames)`` and
``dump_search_index()``, wrapping Sphinx's own; both are checked at load time (see ``_upstream``). Verified
with Sphinx 9.0.4.
"""

from __future__ import annotations

from pathlib import Path

from _upstream import require
from execution_cache import DOCS, hash_files
from sphinx.builders.html import StandaloneHTMLBuilder

require(__name__, StandaloneHTMLBuilder, "prepare_writing", ("self", "docnames"), "sphinx")
require(__name__, StandaloneHTMLBuilder, "dump_search_index", ("self",), "sphinx")


def reread_everything_if_anything_changed(app, env, added, changed, removed):
    """On any change (a document, a static file, an outdated page), read every document and drop the old index."""
    static = hash_files(sorted((DOCS / "_static").rglob("*")))  # pages link these with a checksum
    static_changed = getattr(env, "attention_ref_static_hash", None) != static
    env.attention_ref_static_hash = static
    # Pages the builder will rewrite anyway (an output file older than its source or a template): writing only
    # some of them would also leave searchindex.js without the other pages' index entries.
    rewrite = set(app.builder.get_outdated_docs()) if app.builder.format == "html" else set()
    if added or changed or removed or static_changed or rewrite:
        (Path(app.outdir) / "searchindex.js").unlink(missing_ok=True)
        return sorted(env.found_docs - set(added) - set(changed))
    return []


def keep_the_complete_search_index(app):
    """Let the HTML builder write ``searchindex.js`` only when it wrote pages (or there is none yet)."""
    builder = app.builder
    if not isinstance(builder, StandaloneHTMLBuilder):
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
    app.connect("env-get-outdated", reread_everything_if_anything_changed)
    app.connect("builder-inited", keep_the_complete_search_index)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
