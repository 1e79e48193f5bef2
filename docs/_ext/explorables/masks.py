"""Chapter 5's explorable figures (Masks): the mask inspector (causal mask and padding) and the padded batch
(the padding mask added, and multiplied the wrong way), with the mask pieces the Part II windows page's figure
(``windows``) shares: the six tokens, their queries, keys and values, and the additive mask's table and drawing."""

from __future__ import annotations

import itertools

import numpy as np

from . import widgets

MINUS_INF = "\u2212\u221e"  # what a masked entry of an additive mask shows
MASK_TOKENS = ("The", "cat", "sat", "on", "the", "mat")
MASK_LENGTHS = (6, 5, 4, 3)  # real (unpadded) tokens
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


def additive_grid(allowed) -> list:
    """The additive mask's table cells: ``0`` where a key is allowed, minus infinity (masked) where it is not."""
    import attention_ref as ar

    return [[["0", widgets.PLAIN] if b == 0 else [MINUS_INF, widgets.MASKED] for b in row]
            for row in ar.mask_to_bias(allowed)]


def mask_tables(key_headers, query_rows, corner, weights_caption, weight_columns):
    """The two tables (additive mask, weights) side by side, and the list of the keys each query sees."""
    additive = widgets.table("additive", "Additive mask: 0 where the key is allowed, \u2212\u221e where it is not",
                             key_headers, query_rows, corner=corner)
    weights = widgets.table("weights", weights_caption, weight_columns, query_rows, corner=corner)
    sees = "".join(f'<li data-slot="sees{i}"></li>' for i in range(len(query_rows)))
    return (f'<div class="ex-pair">{additive}{weights}</div>'
            f'<p class="ex-subtitle">Which keys each query sees</p><ul class="ex-sees">{sees}</ul>')


def draw_additive(ax, allowed, keys, queries, title):
    """The still image's additive mask: 0 on light cells, minus infinity on dark ones."""
    ax.imshow(allowed, cmap="Greys_r", vmin=-0.5, vmax=1)
    for (i, j), ok in np.ndenumerate(allowed):
        ax.text(j, i, "0" if ok else MINUS_INF, ha="center", va="center", color="black" if ok else "white")
    ax.set_xticks(range(len(keys)), keys)
    ax.set_yticks(range(len(queries)), queries)
    ax.set_title(title)


def _tokens(length):
    return [token if j < length else PAD for j, token in enumerate(MASK_TOKENS)]


def sees_line(label, keys, allowed_row):
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


# -- The mask inspector ---------------------------------------------------------------------------------------


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
        text |= {f"sees{i}": sees_line(labels[i], tokens, allowed[i]) for i in range(n)}
        setting = (f"Causal {'on' if causal else 'off'}, {length} real tokens"
                   + (f" and {n - length} {PAD}" if length < n else "")
                   + (f", {PAD} queries masked too" if pad_queries and length < n else "")
                   + f": {int(allowed.sum())} of {allowed.size} pairs allowed. ")
        states[widgets.key(int(causal), length, int(pad_queries))] = {
            "text": text,
            "grids": {
                "additive": additive_grid(allowed),
                "weights": [[*cells, ["0" if s == 0 else f"{s:.2f}", widgets.PLAIN]]
                            for cells, s in zip(widgets.grid(weights), sums, strict=True)],
            },
            "status": setting + _inspector_notice(causal, length, pad_queries, blind, sums),
        }
    key_headers = [(token, f"key{j}") for j, token in enumerate(MASK_TOKENS)]  # a slot may appear twice
    query_rows = [(token, f"query{i}") for i, token in enumerate(MASK_TOKENS)]
    body = mask_tables(key_headers, query_rows, "query \\ key",
                       "Weights: softmax(scores + mask), row by row, and each row's sum", [*key_headers, "sum"])
    controls = [
        widgets.checkbox("causal", "Causal", "1"),
        widgets.select("length", "Real tokens", [(str(m), f"{m} of 6" + ("" if m == 6 else f" ({6 - m} {PAD})"))
                                                 for m in MASK_LENGTHS], "6"),
        widgets.checkbox("padq", f"Mask the {PAD} queries too", "0"),
    ]
    page = widgets.page(
        "masks", "Mask inspector: the additive mask, the weights, and the keys each query sees", controls, body,
        states, ["causal", "length", "padq"], widgets.key(1, 6, 0),
        intro="Each setting's mask is built by attention_ref.masks and its weights by "
              "scaled_dot_product_attention when the book is built. The status line says what to notice.",
    )
    allowed = inspector_allowed(True, 6, False)
    _, w_default = ar.scaled_dot_product_attention(q, k, v, mask=allowed, return_weights=True)
    fig, (mask_ax, weight_ax) = widgets.figure(2, 9)
    draw_additive(mask_ax, allowed, MASK_TOKENS, MASK_TOKENS, "additive causal mask")
    ar.plot_attention(w_default, list(MASK_TOKENS), list(MASK_TOKENS), ax=weight_ax, title="weights",
                      colorbar=False)
    alt = ("Left: the additive causal mask of six tokens, zero on and below the diagonal and minus infinity above "
           "it. Right: the attention weights as a heatmap, zero above the diagonal; the first query puts all its "
           "weight on the first token.")
    return widgets.Explorable("masks", page, widgets.png_of(fig), alt)


# -- The padded batch: two sentences, the mask added and multiplied --------------------------------------------

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
        text |= {"sentence": " ".join(tokens), "leak": widgets.weight_text(leak)}
        states[widgets.key(b)] = {
            "text": text,
            "grids": {"added": widgets.grid(added[b]), "multiplied": widgets.grid(multiplied[b])},
            "status": (f"Sentence {b + 1}, {len(sentence)} real tokens and {n_keys - len(sentence)} padding: "
                       f"added mask, weight on padding 0; multiplied, up to {widgets.weight_text(leak)}."),
        }

    def table(side, caption):
        return widgets.table(side, caption, [("", f"{side}-key{j}") for j in range(n_keys)],
                             [("", f"{side}-query{i}") for i in range(n_keys)], corner="query \\ key")

    added_table = table("added", f"Mask added (0 / {MINUS_INF}): right")
    multiplied_table = table("multiplied", "Scores multiplied by the 0/1 mask: wrong")
    body = (
        '<p class="ex-summary">Tokens: <span data-slot="sentence"></span>. The most weight a real token puts '
        'on padding when the mask is multiplied: <span data-slot="leak"></span>.</p>'
        f'<div class="ex-pair">{added_table}{multiplied_table}</div>'
    )
    options = [(str(b), f"{b + 1}: {' '.join(s)} ({len(s)} tokens)") for b, s in enumerate(BATCH)]
    page = widgets.page(
        "padding", "A padded batch of two sentences: the padding mask added, and multiplied",
        [widgets.select("sentence", "Sentence", options, "1")], body, states, ["sentence"], widgets.key(1),
        intro=f"Both sentences are padded to {n_keys} tokens. Multiplying a score by 0 leaves e\u2070 = 1 in the "
              "softmax, so the padding still gets weight; adding \u2212\u221e gives it exactly none.",
    )
    fig, axes = widgets.figure(2, 9)
    import attention_ref as ar

    tokens = [*BATCH[1], *["[pad]"] * (n_keys - len(BATCH[1]))]
    for ax, weights, title in ((axes[0], added[1], "mask added (right)"),
                               (axes[1], multiplied[1], "scores \u00d7 mask (wrong)")):
        ar.plot_attention(weights, tokens, tokens, ax=ax, title=title, colorbar=False, vmax=1.0)
    alt = (f"Two heatmaps of the weights of the sentence '{' '.join(BATCH[1])}' padded to {n_keys} tokens. Left, "
           "with the mask added: the padding columns are zero. Right, with the scores multiplied by the mask: the "
           "padding columns get weight too.")
    return widgets.Explorable("padding", page, widgets.png_of(fig), alt)
