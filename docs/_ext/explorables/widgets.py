"""The machinery of the explorable figures: what a chapter cell returns, the HTML of the controls and tables, the
still image, and the Sphinx and notebook sides. It holds no figure: each chapter's figures are modules of their
own beside this one (``lookup``, ``scaling``, ``masks``, ``windows``), built from the pieces below.

A figure module runs attention_ref for *every* setting of its controls when the book is built and returns an
`Explorable`, whose MIME bundle holds

* ``text/html``: the figure's labelled controls, its tables or bars and a status line (``aria-live``), with a JSON
  table of what each setting shows (every number already formatted). ``_static/explorables.js`` reads the
  controls, looks the setting up in that table and writes what it finds into the page: it computes nothing;
* ``image/png``: the figure's default setting drawn by matplotlib, with alt text, for whatever cannot run the
  script (a notebook front end, the PDF and EPUB builders).

A state of the JSON table is ``{"text": {slot: text}, "grids": {name: rows}, "bars": {name: bars}, "status":
text}``: ``text`` fills the elements with ``data-slot``, ``grids`` the tables of `table` (each cell ``[text,
colour]``, colour an index into `palette` or `MASKED` / `PLAIN`), ``bars`` the lists of `bar_list` (each bar
``[length in percent, text]``, as `bars` writes them).
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # docs/_ext: where chapter kernels import ``explorables`` from
TAG = "explorable"  # the tag of a chapter cell whose output is an explorable
MIME_HTML, MIME_PNG = "text/html", "image/png"
METADATA_KEY = "attention_ref/explorable"  # output metadata: the figure's name and alt text
PALETTE_SIZE = 65  # weights in [0, 1] are coloured in steps of 1/64
# A table cell of the JSON: [text, colour], colour an index into the palette or one of these.
MASKED, PLAIN = -1, -2


# -- What a cell returns ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Explorable:
    """An explorable figure: the page's interactive HTML and the still PNG of its default setting."""

    name: str
    html: str
    png: bytes
    alt: str

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = {
            MIME_HTML: self.html,
            MIME_PNG: base64.b64encode(self.png).decode("ascii"),
            "text/plain": f"Explorable figure ({self.name}): {self.alt}",
        }
        return data, {METADATA_KEY: {"name": self.name, "alt": self.alt}}


def png_of(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def figure(ncols, width):
    """A matplotlib Figure outside pyplot (so the cell shows only the explorable) with `ncols` axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 3.2), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def palette():
    """``[[background, text colour], ...]``: viridis at 0, 1/64, ..., 1 (as `attention_ref.plot_attention` draws
    weights), each with the text colour of higher contrast."""
    from matplotlib import colors

    from attention_ref.plotting import resolved_colormap, text_colour

    cmap = resolved_colormap("viridis")
    return [[colors.to_hex(cmap(i / (PALETTE_SIZE - 1))), text_colour(cmap(i / (PALETTE_SIZE - 1)))]
            for i in range(PALETTE_SIZE)]


def weight_cell(weight) -> list:
    """A weight's table cell: two decimals (``0`` when it is exactly zero) on its viridis colour."""
    return [weight_text(weight), round(float(weight) * (PALETTE_SIZE - 1))]


def weight_text(weight) -> str:
    return "0" if weight == 0 else f"{weight:.2f}"


def grid(weights) -> list:
    return [[weight_cell(w) for w in row] for row in weights]


def bars(weights) -> list:
    """``[[length, text], ...]``: bar lengths in percent of the full width (a weight of 1 fills it), and the
    weight written beside each bar."""
    return [[round(100 * float(w), 1), weight_text(w)] for w in weights]


# -- HTML pieces -------------------------------------------------------------------------------------------


def escape(text) -> str:
    return html.escape(str(text), quote=True)


def table(name, caption, columns, rows, *, corner="", row_buttons=None):
    """A table whose body cells the script fills from the state's grid `name` (``data-grid``).

    `columns` and `rows` are header texts (a header with ``data-slot`` when given as ``(text, slot)``).
    `row_buttons`: a control name; each row header is then a button that sets that control to the row's index.
    """

    def header(item, scope, index=None):
        text, slot = item if isinstance(item, tuple) else (item, None)
        inner = f'<span data-slot="{slot}">{escape(text)}</span>' if slot else escape(text)
        if row_buttons is not None and index is not None:
            inner = (f'<button type="button" class="ex-row" data-set="{row_buttons}" data-value="{index}"'
                     f' aria-pressed="false">{inner}</button>')
        return f'<th scope="{scope}">{inner}</th>'

    head = "".join([f'<th scope="col">{escape(corner)}</th>', *(header(c, "col") for c in columns)])
    cells = '<td class="ex-cell"></td>' * len(columns)
    body = "".join(f"<tr>{header(row, 'row', i)}{cells}</tr>" for i, row in enumerate(rows))
    return (f'<table class="ex-table" data-grid="{name}"><caption>{escape(caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def html_table(name, caption, columns, rows, corner):
    """A table whose body cells the script fills from the state's grid `name`; `columns` are trusted HTML
    (typeset symbols), `rows` and `corner` plain text."""
    head = f'<th scope="col">{escape(corner)}</th>' + "".join(f'<th scope="col">{c}</th>' for c in columns)
    cells = '<td class="ex-cell"></td>' * len(columns)
    body = "".join(f'<tr><th scope="row">{escape(row)}</th>{cells}</tr>' for row in rows)
    return (f'<table class="ex-table" data-grid="{name}"><caption>{escape(caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def bar_list(name, caption, labels):
    """Labelled horizontal bars (``data-bars``), one per label, with the value written beside each."""
    items = "".join(
        f'<li><span class="ex-bar-label">{escape(label)}</span><span class="ex-bar-track" aria-hidden="true">'
        f'<span class="ex-bar"></span></span><span class="ex-bar-value"></span></li>'
        for label in labels
    )
    return (f'<figure class="ex-bars-figure"><figcaption>{escape(caption)}</figcaption>'
            f'<ol class="ex-bars" data-bars="{name}">{items}</ol></figure>')


def select(name, label, options, default):
    """A labelled drop-down (``options``: ``[(value, text), ...]``)."""
    choices = "".join(
        f'<option value="{escape(value)}"{" selected" if value == default else ""}>{escape(text)}</option>'
        for value, text in options
    )
    return (f'<label class="ex-control">{escape(label)} <select data-control="{name}">{choices}</select></label>')


def checkbox(name, label, default):
    checked = " checked" if default == "1" else ""
    return (f'<label class="ex-control"><input type="checkbox" data-control="{name}"{checked}> {escape(label)}</label>')


def slider(name, label, count, default):
    return (f'<label class="ex-control ex-slider">{escape(label)} <input type="range" data-control="{name}" min="0"'
            f' max="{count - 1}" step="1" value="{default}"></label>'
            f' <output class="ex-value" data-slot="{name}-value"></output>')


def hidden_control(name, default):
    """A control set by buttons (``data-set``) rather than by a form field."""
    return f'<input type="hidden" data-control="{name}" value="{escape(default)}">'


def to_json(data) -> str:
    """`data` as JSON that cannot end the script element holding it."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/")


def page(name, title, controls, body, states, order, default, intro="", inputs=None):
    """The explorable's ``<figure>``: controls, body, status line and the JSON table of every state.

    `order` names the controls in the order their values make a state's key (``value|value|...``).
    """
    data = {"order": order, "default": default, "palette": palette(), "states": states}
    if inputs is not None:
        data["inputs"] = inputs
    return (
        f'<figure class="explorable" id="explorable-{name}" data-explorable="{name}">'
        f'<figcaption class="ex-title">{escape(title)}</figcaption>'
        + (f'<p class="ex-intro">{escape(intro)}</p>' if intro else "")
        + f'<div class="ex-controls">{"".join(controls)}</div>'
        f'<div class="ex-body">{body}</div>'
        f'<p class="ex-status" role="status" aria-live="polite" data-slot="status"></p>'
        f'<script type="application/json" class="ex-data">{to_json(data)}</script>'
        "</figure>"
    )


def key(*values) -> str:
    return "|".join(str(value) for value in values)



# -- The notebook and Sphinx sides ---------------------------------------------------------------------------


def still_figures(notebook):
    """The notebook with each explorable cell (tag ``explorable``) a Markdown cell showing its still image.

    The cell's code imports the ``explorables`` package, which exists only in the book's repository; its output's
    PNG and alt text carry over as ``![alt](data:image/png;base64,...)``, as ``_notebook_markdown`` shows glued
    figures.
    """
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code" or TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        found = [o for o in cell.get("outputs", []) if MIME_PNG in o.get("data", {})]
        if not found:
            raise ValueError(f"explorable cell {index} has no still image: was the notebook executed?")
        output = found[0]
        alt = output.get("metadata", {}).get(METADATA_KEY, {}).get("alt", "")
        png = "".join(output["data"][MIME_PNG]).replace("\n", "")
        alt = alt.replace("[", "(").replace("]", ")")
        notebook["cells"][index] = {"cell_type": "markdown", "id": cell.get("id", f"explorable-{index}"),
                                    "metadata": {"tags": [TAG]}, "source": f"![{alt}](data:{MIME_PNG};base64,{png})"}
    return notebook


def add_assets(app, pagename, templatename, context, doctree):
    """Add the script and style sheet to a page that holds an explorable."""
    if 'class="explorable"' in context.get("body", ""):
        app.add_css_file("explorables.css")
        app.add_js_file("explorables.js", defer="defer")


def setup(app):
    # Chapter kernels (started by this build, inheriting its environment) import the explorables package.
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    app.connect("html-page-context", add_assets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
