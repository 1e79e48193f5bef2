"""The Part II windows page's explorable figure (Windows, sinks and caches): where the causal diagonal sits
(top-left or bottom-right) when there are fewer queries than keys, and a window around each query's position. It
uses chapter 5's six tokens and additive-mask pieces (``masks``)."""

from __future__ import annotations

import itertools

import numpy as np

from . import widgets
from .masks import MASK_TOKENS, additive_grid, draw_additive, mask_problem, mask_tables, sees_line

MASK_QUERIES = (6, 3)  # L = S, and the last three tokens' queries (L < S)
MASK_WINDOWS = ("none", "1", "2")  # (w, w) around the query's position
ALIGNMENTS = ("top-left", "bottom-right")


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
        text |= {f"sees{i}": sees_line(labels[i], MASK_TOKENS, allowed[i]) for i in range(n_queries)}
        window_text = "no window" if window == "none" else f"window {window} either side"
        states[widgets.key(n_queries, int(causal), alignment, window)] = {
            "text": text,
            "grids": {
                "additive": additive_grid(allowed),
                "weights": widgets.grid(weights),
            },
            "status": (f"{n_queries} queries, {n_keys} keys, {alignment}, causal {'on' if causal else 'off'}, "
                       f"{window_text}: {int(allowed.sum())} of {allowed.size} pairs allowed. "
                       + _alignment_notice(n_queries, n_keys, causal, alignment, window, positions)),
        }
    key_headers = [(f"{token} ({j})", f"key{j}") for j, token in enumerate(MASK_TOKENS)]
    query_rows = [(f"query {i}", f"query{i}") for i in range(n_keys)]
    body = mask_tables(key_headers, query_rows, "query \\ key (position)",
                       "Weights: softmax(scores + mask), row by row", key_headers)
    controls = [
        widgets.select("queries", "Queries", [("6", "6 (every token)"), ("3", "3 (the last three tokens)")], "3"),
        widgets.checkbox("causal", "Causal", "1"),
        widgets.select("alignment", "Causal alignment", [(a, a) for a in ALIGNMENTS], "top-left"),
        widgets.select("window", "Window",
                       [(w, "none" if w == "none" else f"{w} either side") for w in MASK_WINDOWS], "none"),
    ]
    default = widgets.key(3, 1, "top-left", "none")
    page = widgets.page(
        "alignment", "Causal alignment and windows: the additive mask, the weights, and the keys each query sees",
        controls, body, states, ["queries", "causal", "alignment", "window"], default,
        intro="Each setting's mask is built by attention_ref.masks and its weights by "
              "scaled_dot_product_attention when the book is built; a query's position is the key position its "
              "causal diagonal and its window are measured from.",
    )
    fig, axes = widgets.figure(2, 9)
    for ax, alignment in zip(axes, ALIGNMENTS, strict=True):
        draw_additive(ax, alignment_allowed(3, True, alignment, "none"), MASK_TOKENS,
                       [f"query {i}" for i in range(3)], f"causal, {alignment}")
    alt = ("Two additive causal masks of three queries over six keys, zero where a query may read a key and minus "
           "infinity where it may not. Left, top-left alignment: the allowed zeros form a triangle in the left "
           "corner, and the last three keys are never read. Right, bottom-right alignment: the triangle is shifted "
           "right, and the last query reads all six keys.")
    return widgets.Explorable("alignment", page, widgets.png_of(fig), alt)
