"""Join a cell's stream output exactly, on the pages and in the downloadable notebooks.

Corrects: how a kernel splits one ``print`` into messages is a matter of timing (``print(x)`` writes ``x``
and the newline separately), so an executed notebook is reproducible only once each stream's chunks are
joined. MyST-NB's own merge (``nb_merge_streams = True``, function ``coalesce_streams``) strips each chunk's
trailing whitespace and so turns the split ``"a" | "\\nb\\n"`` into ``"a\\n\\nb\\n"``: the pages would show
blank lines that are not in the output, and differ from build to build. `merge_streams` joins the chunks as
they are; this extension puts it in place of MyST-NB's for the pages, and ``notebook_download`` uses it for
the notebooks.

Replaces an internal: the name ``coalesce_streams`` that ``myst_nb.core.render`` imports from
``myst_nb.core.utils``. Its presence and signature are checked at load time (see ``_upstream``).
Verified with MyST-NB 1.4.0.
"""

from __future__ import annotations

import nbformat
from _upstream import require
from myst_nb.core import render

require(__name__, render, "coalesce_streams", ("outputs",), "myst-nb")


def merge_streams(outputs):
    """Join each stream's chunks (stdout, stderr) into one output, exactly; other outputs stay as they are."""
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


def _coalesce_streams(outputs):
    return [nbformat.from_dict(output) for output in merge_streams(outputs)]


def setup(app):
    app.setup_extension("myst_nb")
    render.coalesce_streams = _coalesce_streams
    return {"parallel_read_safe": True, "parallel_write_safe": True}
