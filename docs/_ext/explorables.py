"""Explorable figures: figures a reader can play with on the static page, every number computed by attention_ref.

Corrects: on a static site (Read the Docs, ``make docs``) every figure a chapter executes is a still image, and
MyST-NB's live code needs a kernel (Binder, ``make serve``). An explorable needs neither. A chapter cell calls
one of the functions below; it runs attention_ref for *every* setting of the figure's controls when the book is
built and returns an `Explorable`, whose MIME bundle holds

* ``text/html``: the figure's labelled controls, its tables and a status line (``aria-live``), with a JSON table
  of what each setting shows (every number already formatted). ``_static/explorables.js`` reads the controls,
  looks the setting up in that table and writes what it finds into the page: it computes nothing;
* ``image/png``: the figure's default setting drawn by matplotlib, with alt text, for whatever cannot run the
  script (a notebook front end, the PDF and EPUB builders).

The cell carries the ``explorable`` tag (and ``remove-input``: the reader sees the figure, not the call). It
imports this module, which a notebook outside the repository cannot: `still_figures` turns each such cell of a
downloaded notebook into a Markdown cell showing the still image and its alt text (``notebook_download``).

Sphinx side (public API only): ``setup`` puts this folder on the ``PYTHONPATH`` the build's kernels inherit
(as ``execution_cache`` sets their thread count), and ``html-page-context`` adds the script and its style sheet
to the pages that hold an explorable (Sphinx's documented per-page ``add_js_file``). Verified with Sphinx 9.0.4
and MyST-NB 1.4.0.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TAG = "explorable"  # the tag of a chapter cell whose output is an explorable
MIME_HTML, MIME_PNG = "text/html", "image/png"
METADATA_KEY = "attention_ref/explorable"  # output metadata: the figure's name and alt text
MINUS_INF = "\u2212\u221e"  # what a masked entry of an additive mask shows
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


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _figure(ncols, width):
    """A matplotlib Figure outside pyplot (so the cell shows only the explorable) with `ncols` axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 3.2), layout="constrained")
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _palette():
    """``[[background, text colour], ...]``: viridis at 0, 1/64, ..., 1 (as `attention_ref.plot_attention` draws
    weights), each with the text colour of higher contrast."""
    from matplotlib import colors

    from attention_ref.plotting import _colormap, _text_colour

    cmap = _colormap("viridis")
    return [[colors.to_hex(cmap(i / (PALETTE_SIZE - 1))), _text_colour(cmap(i / (PALETTE_SIZE - 1)))]
            for i in range(PALETTE_SIZE)]


def _weight_cell(weight) -> list:
    """A weight's table cell: two decimals (``0`` when it is exactly zero) on its viridis colour."""
    return [_weight_text(weight), round(float(weight) * (PALETTE_SIZE - 1))]


def _weight_text(weight) -> str:
    return "0" if weight == 0 else f"{weight:.2f}"


def _grid(weights) -> list:
    return [[_weight_cell(w) for w in row] for row in weights]


def _bars(weights) -> list:
    """``[[length, text], ...]``: bar lengths in percent of the full width (a weight of 1 fills it), and the
    weight written beside each bar."""
    return [[round(100 * float(w), 1), _weight_text(w)] for w in weights]


def _entropy(weights) -> float:
    """Entropy in nats of a row of weights (0 log 0 = 0)."""
    logs = np.log(weights, where=weights > 0, out=np.zeros_like(weights))
    return float(-(weights * logs).sum())


# -- HTML pieces -------------------------------------------------------------------------------------------


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _table(name, caption, columns, rows, *, corner="", row_buttons=None):
    """A table whose body cells the script fills from the state's grid `name` (``data-grid``).

    `columns` and `rows` are header texts (a header with ``data-slot`` when given as ``(text, slot)``).
    `row_buttons`: a control name; each row header is then a button that sets that control to the row's index.
    """

    def header(item, scope, index=None):
        text, slot = item if isinstance(item, tuple) else (item, None)
        inner = f'<span data-slot="{slot}">{_e(text)}</span>' if slot else _e(text)
        if row_buttons is not None and index is not None:
            inner = (f'<button type="button" class="ex-row" data-set="{row_buttons}" data-value="{index}"'
                     f' aria-pressed="false">{inner}</button>')
        return f'<th scope="{scope}">{inner}</th>'

    head = "".join([f'<th scope="col">{_e(corner)}</th>', *(header(c, "col") for c in columns)])
    cells = '<td class="ex-cell"></td>' * len(columns)
    body = "".join(f"<tr>{header(row, 'row', i)}{cells}</tr>" for i, row in enumerate(rows))
    return (f'<table class="ex-table" data-grid="{name}"><caption>{_e(caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _bar_list(name, caption, labels):
    """Labelled horizontal bars (``data-bars``), one per label, with the value written beside each."""
    items = "".join(
        f'<li><span class="ex-bar-label">{_e(label)}</span><span class="ex-bar-track" aria-hidden="true">'
        f'<span class="ex-bar"></span></span><span class="ex-bar-value"></span></li>'
        for label in labels
    )
    return (f'<figure class="ex-bars-figure"><figcaption>{_e(caption)}</figcaption>'
            f'<ol class="ex-bars" data-bars="{name}">{items}</ol></figure>')


def _select(name, label, options, default):
    """A labelled drop-down (``options``: ``[(value, text), ...]``)."""
    choices = "".join(
        f'<option value="{_e(value)}"{" selected" if value == default else ""}>{_e(text)}</option>'
        for value, text in options
    )
    return (f'<label class="ex-control">{_e(label)} <select data-control="{name}">{choices}</select></label>')


def _checkbox(name, label, default):
    checked = " checked" if default == "1" else ""
    return (f'<label class="ex-control"><input type="checkbox" data-control="{name}"{checked}> {_e(label)}</label>')


def _slider(name, label, count, default):
    return (f'<label class="ex-control ex-slider">{_e(label)} <input type="range" data-control="{name}" min="0"'
            f' max="{count - 1}" step="1" value="{default}"></label>'
            f' <output class="ex-value" data-slot="{name}-value"></output>')


def _hidden_control(name, default):
    """A control set by buttons (``data-set``) rather than by a form field."""
    return f'<input type="hidden" data-control="{name}" value="{_e(default)}">'


def _json(data) -> str:
    """`data` as JSON that cannot end the script element holding it."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/")


def _page(name, title, controls, body, states, order, default, intro="", inputs=None):
    """The explorable's ``<figure>``: controls, body, status line and the JSON table of every state.

    `order` names the controls in the order their values make a state's key (``value|value|...``).
    """
    data = {"order": order, "default": default, "palette": _palette(), "states": states}
    if inputs is not None:
        data["inputs"] = inputs
    return (
        f'<figure class="explorable" id="explorable-{name}" data-explorable="{name}">'
        f'<figcaption class="ex-title">{_e(title)}</figcaption>'
        + (f'<p class="ex-intro">{_e(intro)}</p>' if intro else "")
        + f'<div class="ex-controls">{"".join(controls)}</div>'
        f'<div class="ex-body">{body}</div>'
        f'<p class="ex-status" role="status" aria-live="polite" data-slot="status"></p>'
        f'<script type="application/json" class="ex-data">{_json(data)}</script>'
        "</figure>"
    )


def _key(*values) -> str:
    return "|".join(str(value) for value in values)


# -- 1. Scaling: one row of scores at three head sizes, with and without the divisor sqrt(d_k) ----------------

SCALING_HEAD_SIZES = (4, 64, 512)  # the selector's settings; 64 is the page's d_k
SCALING_DEFAULT = 64
SCALING_KEYS = 32  # S, as in the page's text
SCALING_SEED = 76  # the seed of the page's opening figure: at d_k = 64 the default state is that figure's row
_DK = "d\u2096"  # d with subscript k, typeset in plain text
_SQRT_DK = "\u221a" + _DK


def scaling_row(d_k, seed=SCALING_SEED, n_keys=SCALING_KEYS):
    """One query and `n_keys` keys of size `d_k` (standard normal, drawn in this order), and zero values: the
    same numbers as ``rng.standard_normal(d_k)`` then ``rng.standard_normal((n_keys, d_k))``."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, d_k))  # (L=1, E)
    k = rng.standard_normal((n_keys, d_k))  # (S, E)
    v = np.zeros((n_keys, 1))  # (S, 1): only the weights are shown
    return q, k, v


def scaling_selector(head_sizes=SCALING_HEAD_SIZES, default=SCALING_DEFAULT, seed=SCALING_SEED,
                     n_keys=SCALING_KEYS):
    """The scaling explorable: one query's weights over `n_keys` keys for each head size, with divisor 1 (no
    scaling, ``scale=1``) beside divisor ``sqrt(d_k)`` (the package's default scale ``1/sqrt(d_k)``)."""
    import attention_ref as ar

    keys = [f"k{j}" for j in range(n_keys)]
    states, rows = {}, {}
    for d_k in head_sizes:
        q, k, v = scaling_row(d_k, seed, n_keys)
        raw = (q @ k.T)[0]  # (S,) the unscaled scores, as the first column shows them
        _, w_raw = ar.scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
        _, w_scaled = ar.scaled_dot_product_attention(q, k, v, return_weights=True)  # default scale 1/sqrt(E)
        w_raw, w_scaled = w_raw[0], w_scaled[0]  # (S,) each
        root = float(np.sqrt(d_k))
        top_raw, top_scaled = int(np.argmax(w_raw)), int(np.argmax(w_scaled))
        h_raw, h_scaled = _entropy(w_raw), _entropy(w_scaled)
        states[_key(d_k)] = {
            "text": {"root": f"{root:.3g}", "sd": f"{float(raw.std()):.1f}",
                     "max-raw": f"{w_raw[top_raw]:.2f}", "arg-raw": keys[top_raw], "ent-raw": f"{h_raw:.2f}",
                     "max-scaled": f"{w_scaled[top_scaled]:.2f}", "arg-scaled": keys[top_scaled],
                     "ent-scaled": f"{h_scaled:.2f}"},
            # Both score columns with two decimals.
            "grids": {"row": [[[f"{raw[j]:.2f}", PLAIN], _weight_cell(w_raw[j]),
                               [f"{raw[j] / root:.2f}", PLAIN], _weight_cell(w_scaled[j])]
                              for j in range(n_keys)]},
            "status": f"{_DK} = {d_k}: with no scaling the largest weight is {w_raw[top_raw]:.2f} (entropy "
                      f"{h_raw:.2f} nats); divided by {_SQRT_DK} = {root:.3g} it is {w_scaled[top_scaled]:.2f} "
                      f"(entropy {h_scaled:.2f} of at most {np.log(n_keys):.2f}). The larger {_DK}, the sharper "
                      "the unscaled weights; the scaled ones stay spread.",
        }
        rows[d_k] = (w_raw, w_scaled)
    table = _table("row", f"One query's scores and weights over its {n_keys} keys",
                   ["score q\u00b7k", "weight, divisor 1 (no scaling)", f"score / {_SQRT_DK}",
                    f"weight, divisor {_SQRT_DK}"], keys, corner="key")
    summary = (f'<p class="ex-summary">Divisor 1 (no scaling): largest weight <span data-slot="max-raw"></span> on '
               '<span data-slot="arg-raw"></span>, entropy <span data-slot="ent-raw"></span> nats. Divisor '
               f'{_SQRT_DK} = <span data-slot="root"></span>: largest weight <span data-slot="max-scaled"></span> on '
               '<span data-slot="arg-scaled"></span>, entropy <span data-slot="ent-scaled"></span> nats. Uniform '
               f"weights would be {1 / n_keys:.2f} each, entropy {np.log(n_keys):.2f} nats. The unscaled scores "
               'have standard deviation <span data-slot="sd"></span> in this row.</p>')
    page = _page(
        "scaling", f"One query's weights over {n_keys} keys, with and without the divisor {_SQRT_DK}",
        [_select("dk", f"Head size {_DK}", [(str(d), str(d)) for d in head_sizes], str(default))],
        f"{summary}{table}", states, ["dk"], _key(default),
        intro=f"Choose the head size {_DK}. The two weight columns sit side by side: divisor 1 is no scaling, "
              f"divisor {_SQRT_DK} is the package's default scale 1/{_SQRT_DK}.",
    )
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.4), layout="constrained")
    axes = fig.subplots(2, len(head_sizes), sharey=True)
    for col, d_k in enumerate(head_sizes):
        for row, (w, label) in enumerate(zip(rows[d_k], ("divisor 1 (no scaling)", r"divisor $\sqrt{d_k}$"),
                                             strict=True)):
            ax = axes[row, col]
            ax.bar(range(n_keys), w)
            ax.set_ylim(0, 1)
            ax.set_title(f"$d_k$ = {d_k}, {label}", fontsize=9)
            ax.set_xlabel("key", fontsize=8)
        axes[0, col].tick_params(labelsize=7)
        axes[1, col].tick_params(labelsize=7)
    axes[0, 0].set_ylabel("weight")
    axes[1, 0].set_ylabel("weight")
    big = {d: rows[d][0].max() for d in head_sizes}
    spread = {d: rows[d][1].max() for d in head_sizes}
    assert all(np.diff([big[d] for d in head_sizes]) > 0), "the alt text says the unscaled weights sharpen"
    assert max(spread.values()) < 0.5, "the alt text says the scaled weights stay spread"
    alt = (f"Six bar charts of one query's weights over {n_keys} keys, for head sizes "
           f"{', '.join(str(d) for d in head_sizes)} left to right. Top row, no scaling: the largest weight grows "
           f"with the head size, {', '.join(f'{big[d]:.2f}' for d in head_sizes)}, until one bar holds almost all "
           "the weight. Bottom row, scores divided by the square root of the head size: the weight stays spread over "
           f"many keys, the largest {', '.join(f'{spread[d]:.2f}' for d in head_sizes)}.")
    return Explorable("scaling", page, _png(fig), alt)


# -- 2. Masks: causal and padding (chapter 5); alignment and windows (the Part II windows page) ---------------

MASK_TOKENS = ("The", "cat", "sat", "on", "the", "mat")
MASK_LENGTHS = (6, 5, 4, 3)  # real (unpadded) tokens
MASK_QUERIES = (6, 3)  # L = S, and the last three tokens' queries (L < S)
MASK_WINDOWS = ("none", "1", "2")  # (w, w) around the query's position
ALIGNMENTS = ("top-left", "bottom-right")
PAD = "[pad]"


def mask_problem(seed=5, dim=4):
    """Queries, keys and values (shape (6, dim) each) of the six tokens of the mask figures."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((len(MASK_TOKENS), dim)) for _ in range(3))


def inspector_allowed(causal, length, pad_queries):
    """Boolean (6, 6) of chapter 5's inspector, from the mask builders of attention_ref.masks: the padding mask
    of `length` real tokens, with the causal mask if `causal`, and, if `pad_queries`, the padding queries' rows
    hidden too (what code that builds the padding mask for queries and keys alike does)."""
    import attention_ref as ar

    n = len(MASK_TOKENS)
    real = ar.padding_mask([length], n)[0, 0]  # (S,): True for a real token
    allowed = np.broadcast_to(real, (n, n))
    if causal:
        allowed = allowed & ar.causal_mask(n)
    if pad_queries:
        allowed = allowed & real[:, None]
    return allowed


def _additive_grid(allowed) -> list:
    """The additive mask's table cells: ``0`` where a key is allowed, minus infinity (masked) where it is not."""
    import attention_ref as ar

    return [[["0", PLAIN] if b == 0 else [MINUS_INF, MASKED] for b in row] for row in ar.mask_to_bias(allowed)]


def _mask_body(key_headers, query_rows, corner, weights_caption, weight_columns):
    """The two tables (additive mask, weights) side by side, and the list of the keys each query sees."""
    additive = _table("additive", "Additive mask: 0 where the key is allowed, \u2212\u221e where it is not",
                      key_headers, query_rows, corner=corner)
    weights = _table("weights", weights_caption, weight_columns, query_rows, corner=corner)
    sees = "".join(f'<li data-slot="sees{i}"></li>' for i in range(len(query_rows)))
    return (f'<div class="ex-pair">{additive}{weights}</div>'
            f'<p class="ex-subtitle">Which keys each query sees</p><ul class="ex-sees">{sees}</ul>')


def _draw_additive(ax, allowed, keys, queries, title):
    """The still image's additive mask: 0 on light cells, minus infinity on dark ones."""
    ax.imshow(allowed, cmap="Greys_r", vmin=-0.5, vmax=1)
    for (i, j), ok in np.ndenumerate(allowed):
        ax.text(j, i, "0" if ok else MINUS_INF, ha="center", va="center", color="black" if ok else "white")
    ax.set_xticks(range(len(keys)), keys)
    ax.set_yticks(range(len(queries)), queries)
    ax.set_title(title)


def _tokens(length):
    return [token if j < length else PAD for j, token in enumerate(MASK_TOKENS)]


def _sees(label, keys, allowed_row):
    seen = [keys[j] for j in np.flatnonzero(allowed_row)]
    if not seen:
        return f"{label} sees no key: its weights and output are all zero."
    return f"{label} sees {len(seen)}: " + ", ".join(seen) + "."


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _inspector_notice(causal, length, pad_queries, blind, sums):
    """The status line's second half: what this setting shows, each claim checked against the weights."""
    full = [i for i in range(len(sums)) if i not in blind]
    np.testing.assert_allclose(sums[full], 1.0, rtol=1e-12)
    assert np.all(sums[blind] == 0)
    if blind:
        rows = _and(f"query {i}" for i in blind)
        return (f"Notice: {rows} ({PAD}) {'has' if len(blind) == 1 else 'have'} no allowed key, every entry "
                "\u2212\u221e: the package gives such a row zero weights and a zero output (sum 0), not NaN. "
                "Every other row sums to 1.")
    if length < len(MASK_TOKENS) and causal:
        return (f"Notice: the {PAD} columns and everything above the diagonal are \u2212\u221e, so no query "
                "reads padding or a later token: those weights are exactly 0, and every row still sums to 1.")
    if length < len(MASK_TOKENS):
        return (f"Notice: the {PAD} columns are \u2212\u221e for every query, so they get weight exactly 0 and "
                f"every row still sums to 1. The {PAD} queries still read the real tokens: harmless, as long as "
                "their outputs are thrown away.")
    if causal:
        return ("Notice: above the diagonal every entry is \u2212\u221e, so no token reads a later one: those "
                "weights are exactly 0, and every row still sums to 1.")
    return "Notice: with no mask every entry is 0: every query reads all six tokens, and every row sums to 1."


def mask_inspector(seed=5, dim=4):
    """Chapter 5's mask explorable: the additive mask, the weights and the keys each query sees, for the causal
    mask and padding (and padding queries hidden too, which leaves rows with no allowed key)."""
    import attention_ref as ar

    q, k, v = mask_problem(seed, dim)
    n = len(MASK_TOKENS)
    states = {}
    for causal, length, pad_queries in itertools.product((True, False), MASK_LENGTHS, (False, True)):
        allowed = inspector_allowed(causal, length, pad_queries)
        out, weights = ar.scaled_dot_product_attention(q, k, v, mask=allowed, return_weights=True)  # (6, 6)
        np.testing.assert_array_equal(weights > 0, allowed)  # the figure's two views agree
        blind = [i for i, row in enumerate(allowed) if not row.any()]
        assert np.all(out[blind] == 0)
        sums = weights.sum(axis=-1)
        tokens = _tokens(length)
        labels = [f"{tokens[i]} (query {i})" for i in range(n)]
        text = {f"key{j}": tokens[j] for j in range(n)} | {f"query{i}": labels[i] for i in range(n)}
        text |= {f"sees{i}": _sees(labels[i], tokens, allowed[i]) for i in range(n)}
        setting = (f"Causal {'on' if causal else 'off'}, {length} real tokens"
                   + (f" and {n - length} {PAD}" if length < n else "")
                   + (f", {PAD} queries masked too" if pad_queries and length < n else "")
                   + f": {int(allowed.sum())} of {allowed.size} pairs allowed. ")
        states[_key(int(causal), length, int(pad_queries))] = {
            "text": text,
            "grids": {
                "additive": _additive_grid(allowed),
                "weights": [[*cells, ["0" if s == 0 else f"{s:.2f}", PLAIN]]
                            for cells, s in zip(_grid(weights), sums, strict=True)],
            },
            "status": setting + _inspector_notice(causal, length, pad_queries, blind, sums),
        }
    key_headers = [(token, f"key{j}") for j, token in enumerate(MASK_TOKENS)]  # a slot may appear twice
    query_rows = [(token, f"query{i}") for i, token in enumerate(MASK_TOKENS)]
    body = _mask_body(key_headers, query_rows, "query \\ key",
                      "Weights: softmax(scores + mask), row by row, and each row's sum", [*key_headers, "sum"])
    controls = [
        _checkbox("causal", "Causal", "1"),
        _select("length", "Real tokens", [(str(m), f"{m} of 6" + ("" if m == 6 else f" ({6 - m} {PAD})"))
                                          for m in MASK_LENGTHS], "6"),
        _checkbox("padq", f"Mask the {PAD} queries too", "0"),
    ]
    page = _page(
        "masks", "Mask inspector: the additive mask, the weights, and the keys each query sees", controls, body,
        states, ["causal", "length", "padq"], _key(1, 6, 0),
        intro="Each setting's mask is built by attention_ref.masks and its weights by "
              "scaled_dot_product_attention when the book is built. The status line says what to notice.",
    )
    allowed = inspector_allowed(True, 6, False)
    _, w_default = ar.scaled_dot_product_attention(q, k, v, mask=allowed, return_weights=True)
    fig, (mask_ax, weight_ax) = _figure(2, 9)
    _draw_additive(mask_ax, allowed, MASK_TOKENS, MASK_TOKENS, "additive causal mask")
    ar.plot_attention(w_default, list(MASK_TOKENS), list(MASK_TOKENS), ax=weight_ax, title="weights",
                      colorbar=False)
    alt = ("Left: the additive causal mask of six tokens, zero on and below the diagonal and minus infinity above "
           "it. Right: the attention weights as a heatmap, zero above the diagonal; the first query puts all its "
           "weight on the first token.")
    return Explorable("masks", page, _png(fig), alt)


def alignment_setting(n_queries, causal, alignment, window):
    """``(queries' slice, options of scaled_dot_product_attention)`` for one setting of the alignment figure."""
    n_keys = len(MASK_TOKENS)
    options = {"is_causal": causal, "causal_alignment": alignment}
    if window != "none":
        options["window"] = (int(window), int(window))
    return slice(n_keys - n_queries, n_keys), options


def alignment_allowed(n_queries, causal, alignment, window):
    """Boolean (L, S): which keys each query sees, from the mask builders of attention_ref.masks."""
    import attention_ref as ar

    n_keys = len(MASK_TOKENS)
    allowed = np.ones((n_queries, n_keys), dtype=bool)
    if causal:
        allowed = allowed & ar.causal_mask(n_queries, n_keys, alignment=alignment)
    if window != "none":
        w = int(window)
        allowed = allowed & ar.sliding_window_mask(n_queries, n_keys, window=(w, w), alignment=alignment)
    return allowed


def _positions(n_queries, n_keys, alignment):
    """Key position p_i of each query: i (top-left) or i + S - L (bottom-right)."""
    return np.arange(n_queries) + (n_keys - n_queries if alignment == "bottom-right" else 0)


def _alignment_notice(n_queries, n_keys, causal, alignment, window, positions):
    """The status line's second half: what this setting shows."""
    if not causal and window == "none":
        return "With no causal mask and no window, every query reads every key, wherever it sits."
    if n_queries == n_keys:
        notice = "With as many queries as keys, each query sits at its own position and the alignments agree."
    elif alignment == "top-left":
        notice = (f"Top-left puts the {n_queries} queries at key positions {positions[0]} to {positions[-1]}, as "
                  "if they were the first tokens" + (": the last keys are never read." if causal else "."))
    else:
        notice = (f"Bottom-right puts the {n_queries} queries at key positions {positions[0]} to "
                  f"{positions[-1]}, the last tokens" + (": the last query reads every key, as decoding with a "
                                                         "cache needs." if causal and window == "none" else "."))
    if window != "none":
        notice += (f" The window keeps the keys within {window} of each query's position"
                   + (", on the left only, because the causal mask cuts the right side." if causal else
                      ", on both sides."))
    return notice


def alignment_inspector(seed=5, dim=4):
    """The Part II mask explorable: where the causal diagonal sits (top-left or bottom-right) when there are
    fewer queries than keys, and a window around each query's position, with the weights of each setting."""
    import attention_ref as ar

    q, k, v = mask_problem(seed, dim)
    n_keys = len(MASK_TOKENS)
    states = {}
    for n_queries, causal, alignment, window in itertools.product(
        MASK_QUERIES, (True, False), ALIGNMENTS, MASK_WINDOWS
    ):
        rows, options = alignment_setting(n_queries, causal, alignment, window)
        _, weights = ar.scaled_dot_product_attention(q[rows], k, v, return_weights=True, **options)  # (L, S)
        allowed = alignment_allowed(n_queries, causal, alignment, window)
        np.testing.assert_array_equal(weights > 0, allowed)  # the figure's two views agree
        positions = _positions(n_queries, n_keys, alignment)
        labels = [f"query {i} at {positions[i]}" for i in range(n_queries)]
        text = {f"key{j}": f"{token} ({j})" for j, token in enumerate(MASK_TOKENS)}
        text |= {f"query{i}": labels[i] for i in range(n_queries)}
        text |= {f"sees{i}": _sees(labels[i], MASK_TOKENS, allowed[i]) for i in range(n_queries)}
        window_text = "no window" if window == "none" else f"window {window} either side"
        states[_key(n_queries, int(causal), alignment, window)] = {
            "text": text,
            "grids": {
                "additive": _additive_grid(allowed),
                "weights": _grid(weights),
            },
            "status": (f"{n_queries} queries, {n_keys} keys, {alignment}, causal {'on' if causal else 'off'}, "
                       f"{window_text}: {int(allowed.sum())} of {allowed.size} pairs allowed. "
                       + _alignment_notice(n_queries, n_keys, causal, alignment, window, positions)),
        }
    key_headers = [(f"{token} ({j})", f"key{j}") for j, token in enumerate(MASK_TOKENS)]
    query_rows = [(f"query {i}", f"query{i}") for i in range(n_keys)]
    body = _mask_body(key_headers, query_rows, "query \\ key (position)",
                      "Weights: softmax(scores + mask), row by row", key_headers)
    controls = [
        _select("queries", "Queries", [("6", "6 (every token)"), ("3", "3 (the last three tokens)")], "3"),
        _checkbox("causal", "Causal", "1"),
        _select("alignment", "Causal alignment", [(a, a) for a in ALIGNMENTS], "top-left"),
        _select("window", "Window", [(w, "none" if w == "none" else f"{w} either side") for w in MASK_WINDOWS],
                "none"),
    ]
    default = _key(3, 1, "top-left", "none")
    page = _page(
        "alignment", "Causal alignment and windows: the additive mask, the weights, and the keys each query sees",
        controls, body, states, ["queries", "causal", "alignment", "window"], default,
        intro="Each setting's mask is built by attention_ref.masks and its weights by "
              "scaled_dot_product_attention when the book is built; a query's position is the key position its "
              "causal diagonal and its window are measured from.",
    )
    fig, axes = _figure(2, 9)
    for ax, alignment in zip(axes, ALIGNMENTS, strict=True):
        _draw_additive(ax, alignment_allowed(3, True, alignment, "none"), MASK_TOKENS,
                       [f"query {i}" for i in range(3)], f"causal, {alignment}")
    alt = ("Two additive causal masks of three queries over six keys, zero where a query may read a key and minus "
           "infinity where it may not. Left, top-left alignment: the allowed zeros form a triangle in the left "
           "corner, and the last three keys are never read. Right, bottom-right alignment: the triangle is shifted "
           "right, and the last query reads all six keys.")
    return Explorable("alignment", page, _png(fig), alt)


# -- 2b. Padding: a batch of two sentences, the mask added and multiplied ------------------------------------

BATCH = (("the", "cat", "sat", "on", "mats"), ("dogs", "bark", "loud"))


def padding_problem(seed=7, dim=4):
    """Queries, keys and values of the padded batch, shape (2, 5, dim) each, and its padding mask (2, 1, 5)."""
    import attention_ref as ar

    rng = np.random.default_rng(seed)
    n_keys = max(len(s) for s in BATCH)
    q, k, v = (rng.standard_normal((len(BATCH), n_keys, dim)) for _ in range(3))
    return q, k, v, ar.padding_mask([len(s) for s in BATCH], n_keys)


def padding_weights(seed=7, dim=4):
    """``(added, multiplied)`` weights of the batch, shape (2, 5, 5) each: the mask as an additive 0 / -inf
    (attention_ref) and, the wrong way, the scores multiplied by the 0/1 mask before the softmax."""
    import attention_ref as ar

    q, k, v, mask = padding_problem(seed, dim)
    _, added = ar.scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    _, unmasked = ar.scaled_dot_product_attention(q, k, v, return_weights=True)
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (B, L, S)
    np.testing.assert_allclose(ar.softmax(scores), unmasked, rtol=1e-12)  # these are the package's scores
    return added, ar.softmax(scores * mask)


def padding_batch(seed=7, dim=4):
    """The padding explorable: each sentence of a padded batch, the mask added beside the mask multiplied."""
    added, multiplied = padding_weights(seed, dim)
    n_keys = added.shape[-1]
    states = {}
    for b, sentence in enumerate(BATCH):
        tokens = [*sentence, *["[pad]"] * (n_keys - len(sentence))]
        leak = multiplied[b][: len(sentence), len(sentence):].sum(axis=-1).max()  # real queries' weight on padding
        text = {f"{side}-key{j}": tokens[j] for side in ("added", "multiplied") for j in range(n_keys)}
        text |= {f"{side}-query{i}": tokens[i] for side in ("added", "multiplied") for i in range(n_keys)}
        text |= {"sentence": " ".join(tokens), "leak": _weight_text(leak)}
        states[_key(b)] = {
            "text": text,
            "grids": {"added": _grid(added[b]), "multiplied": _grid(multiplied[b])},
            "status": (f"Sentence {b + 1}, {len(sentence)} real tokens and {n_keys - len(sentence)} padding: "
                       f"added mask, weight on padding 0; multiplied, up to {_weight_text(leak)}."),
        }

    def table(side, caption):
        return _table(side, caption, [("", f"{side}-key{j}") for j in range(n_keys)],
                      [("", f"{side}-query{i}") for i in range(n_keys)], corner="query \\ key")

    added_table = table("added", f"Mask added (0 / {MINUS_INF}): right")
    multiplied_table = table("multiplied", "Scores multiplied by the 0/1 mask: wrong")
    body = (
        '<p class="ex-summary">Tokens: <span data-slot="sentence"></span>. The most weight a real token puts '
        'on padding when the mask is multiplied: <span data-slot="leak"></span>.</p>'
        f'<div class="ex-pair">{added_table}{multiplied_table}</div>'
    )
    options = [(str(b), f"{b + 1}: {' '.join(s)} ({len(s)} tokens)") for b, s in enumerate(BATCH)]
    page = _page(
        "padding", "A padded batch of two sentences: the padding mask added, and multiplied",
        [_select("sentence", "Sentence", options, "1")], body, states, ["sentence"], _key(1),
        intro=f"Both sentences are padded to {n_keys} tokens. Multiplying a score by 0 leaves e\u2070 = 1 in the "
              "softmax, so the padding still gets weight; adding \u2212\u221e gives it exactly none.",
    )
    fig, axes = _figure(2, 9)
    import attention_ref as ar

    tokens = [*BATCH[1], *["[pad]"] * (n_keys - len(BATCH[1]))]
    for ax, weights, title in ((axes[0], added[1], "mask added (right)"),
                               (axes[1], multiplied[1], "scores \u00d7 mask (wrong)")):
        ar.plot_attention(weights, tokens, tokens, ax=ax, title=title, colorbar=False, vmax=1.0)
    alt = (f"Two heatmaps of the weights of the sentence '{' '.join(BATCH[1])}' padded to {n_keys} tokens. Left, "
           "with the mask added: the padding columns are zero. Right, with the scores multiplied by the mask: the "
           "padding columns get weight too.")
    return Explorable("padding", page, _png(fig), alt)


# -- 3. The soft lookup term by term: each weight x value adds up to the output -----------------------------


def _vector(x) -> str:
    """A short vector to two decimals, kept on one line (a no-break space after each comma); no "-0.00"."""
    return "(" + ",\u00a0".join(f"{c:.2f}".replace("-0.00", "0.00") for c in x) + ")"


_SUB_J = "<sub><i>j</i></sub>"  # the key index, typeset


def _html_table(name, caption, columns, rows, corner):
    """A table whose body cells the script fills from the state's grid `name`; `columns` are trusted HTML
    (typeset symbols), `rows` and `corner` plain text."""
    head = f'<th scope="col">{_e(corner)}</th>' + "".join(f'<th scope="col">{c}</th>' for c in columns)
    cells = '<td class="ex-cell"></td>' * len(columns)
    body = "".join(f'<tr><th scope="row">{_e(row)}</th>{cells}</tr>' for row in rows)
    return (f'<table class="ex-table" data-grid="{name}"><caption>{_e(caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def lookup_state(q, k, v, temperature):
    """One setting of the lookup explorable, from the package: scores ``s_j = q . k_j`` (shown unscaled), the
    weights (softmax of ``s_j / T``), each term ``alpha_j v_j``, their running sum and the output."""
    import attention_ref as ar

    out, weights = ar.scaled_dot_product_attention(q[None, :], k, v, scale=1 / temperature, return_weights=True)
    weights, out = weights[0], out[0]  # (S,), (Ev,)
    terms = weights[:, None] * v  # (S, Ev)
    return k @ q, weights, terms, np.cumsum(terms, axis=0), out


def lookup_terms(keys, values, key_labels, queries, query_labels, temperatures=(1.0, 0.3, 0.1)):
    """The lookup explorable: the reader picks a query (and a temperature) and sees each weight x value term
    ``alpha_j v_j`` and their running sum, which ends at the output of attention.

    `keys` (S, E), `values` (S, Ev), `queries` (n, E): n query settings named by `query_labels`. Every number is
    computed by `attention_ref.scaled_dot_product_attention` here; the inputs are carried in the page
    (``inputs``) so a test can recompute what each setting shows.
    """
    k, v, qs = (np.asarray(x, dtype=np.float64) for x in (keys, values, queries))
    books, names = list(map(str, key_labels)), list(map(str, query_labels))
    temperatures = [float(t) for t in temperatures]
    states = {}
    for (a, q), (b, temperature) in itertools.product(enumerate(qs), enumerate(temperatures)):
        scores, weights, terms, running, out = lookup_state(q, k, v, temperature)
        top = int(np.argmax(weights))
        distance = float(np.linalg.norm(out - v[top]))
        grid = [[[f"{scores[j]:.2f}", PLAIN], _weight_cell(weights[j]), [_vector(v[j]), PLAIN],
                 [_vector(terms[j]), PLAIN], [_vector(running[j]), PLAIN]] for j in range(len(books))]
        states[_key(a, b)] = {
            "text": {"output": _vector(out)},
            "grids": {"terms": grid},
            "status": f"{names[a]}, temperature {temperature:g}: {books[top]} takes {weights[top]:.2f} of the "
                      f"weight, and the output {_vector(out)} lies {distance:.2f} from its value "
                      f"{_vector(v[top])}.",
        }
    columns = [f"score <i>s</i>{_SUB_J}", f"weight <i>\u03b1</i>{_SUB_J}", f"value <i>v</i>{_SUB_J}",
               f"term <i>\u03b1</i>{_SUB_J}<i>v</i>{_SUB_J}", "running sum"]
    table = _html_table("terms", "Each book's share of the output, top to bottom", columns, books, "book")
    summary = ('<p class="ex-summary">Output = \u03a3 <i>\u03b1</i><sub><i>j</i></sub> <i>v</i><sub><i>j</i>'
               '</sub> = <span data-slot="output"></span>: the last running sum.</p>')
    controls = [_select("query", "Query", [(str(a), n) for a, n in enumerate(names)], "0"),
                _select("temperature", "Temperature", [(str(b), f"{t:g}") for b, t in enumerate(temperatures)],
                        "0")]
    inputs = {"keys": k.tolist(), "values": v.tolist(), "queries": qs.tolist(), "temperatures": temperatures}
    page = _page(
        "lookup", "The soft lookup term by term: weight \u00d7 value, added up", controls, table + summary,
        states, ["query", "temperature"], _key(0, 0), inputs=inputs,
        intro="Choose a query and a temperature: each book's value, times its weight, adds one term to the "
              "running sum, and the last sum is the output.",
    )
    # The still image (notebooks, PDF, EPUB): the default setting drawn in the plane of the values.
    scores, weights, terms, running, out = lookup_state(qs[0], k, v, temperatures[0])
    fig, (plane, bars) = _figure(2, 8)
    colours = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]
    start, labels = np.zeros(v.shape[1]), []
    for j, book in enumerate(books):
        colour = colours[j % len(colours)]
        plane.plot(*v[j, :2], "o", color=colour)
        above = v[j, 1] > 0  # labels away from the origin, where the arrows run
        labels.append(plane.annotate(book, v[j, :2], xytext=(0, 6 if above else -6), textcoords="offset points",
                                     ha="center", va="bottom" if above else "top", fontsize=7, color="#222222"))
        plane.annotate("", xy=running[j, :2], xytext=start[:2],
                       arrowprops=dict(arrowstyle="-|>", color=colour, lw=2))
        start = running[j]
    plane.plot(*out[:2], "*", color="#222222", markersize=12)
    plane.margins(0.25)
    plane.set_aspect("equal", adjustable="datalim")
    plane.set_title("the terms head to tail; \u2605 the output", fontsize=9)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [label.get_window_extent(renderer) for label in labels]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2)), "value labels overlap"
    bars.barh(books[::-1], weights[::-1], color="#0072B2")
    bars.set_xlim(0, 1)
    bars.set_xlabel("weight")
    bars.set_title(f"weights at temperature {temperatures[0]:g}", fontsize=9)
    alt = (f"Left: the values of the {len(books)} books as labelled coloured dots in the plane, and the terms "
           f"weight times value drawn head to tail from the origin, one arrow per book in its colour, ending on a "
           f"star "
           f"at the output {_vector(out)} for the query {names[0]}. Right: the {len(books)} weights as bars, "
           f"the largest {weights.max():.2f} on {books[int(np.argmax(weights))]}.")
    return Explorable("lookup", page, _png(fig), alt)


# -- The notebook and Sphinx sides ---------------------------------------------------------------------------


def still_figures(notebook):
    """The notebook with each explorable cell (tag ``explorable``) a Markdown cell showing its still image.

    The cell's code imports this module, which exists only in the book's repository; its output's PNG and alt
    text carry over as ``![alt](data:image/png;base64,...)``, as ``_notebook_markdown`` shows glued figures.
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
    # Chapter kernels (started by this build, inheriting its environment) import this module.
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    app.connect("html-page-context", add_assets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
