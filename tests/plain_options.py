"""The attention options written out in plain NumPy, for the tests to compare attention_ref against.

Nothing here calls attention_ref. Each option is spelt out from its definition and then handed to the
independent float64 formula of conftest (``reference_attention``) as an explicit mask or bias:

- a window ``(left, right)`` is the boolean matrix ``p_i - left <= j <= p_i + right``;
- ALiBi is the explicit bias ``-m_h |p_i - j|``;
- the soft cap is applied to explicitly computed scores, which enter as a bias with ``scale=0``;
- a sink is one more key whose score is the sink and whose value is zero.

``p_i`` is the key position of query ``i``: ``i`` (top-left) or ``i + S - L`` (bottom-right).
"""

import numpy as np


def query_positions(L, S, alignment="top-left"):
    """``(p, j)``: the key position of each query, shape (L, 1), and each key index, shape (1, S)."""
    offset = 0 if alignment == "top-left" else S - L
    return np.arange(L)[:, None] + offset, np.arange(S)[None, :]


def window_allowed(L, S, window=None, alignment="top-left", is_causal=False):
    """Boolean (L, S): the keys a window ``(left, right)`` (None sides unbounded) and causality allow."""
    p, j = query_positions(L, S, alignment)
    left, right = (None, None) if window is None else window
    allowed = np.ones((L, S), dtype=bool)
    if left is not None:
        allowed &= j >= p - left
    if right is not None:
        allowed &= j <= p + right
    if is_causal:
        allowed &= j <= p
    return allowed


def alibi_plain(slopes, L, S, alignment="top-left"):
    """Explicit ALiBi bias ``-m_h |p_i - j|``, shape ``(*slopes.shape, L, S)``."""
    p, j = query_positions(L, S, alignment)
    return -np.asarray(slopes, dtype=np.float64)[..., None, None] * np.abs(p - j)


def reference_with_options(
    reference_attention,
    q,
    k,
    v,
    *,
    mask=None,
    bias=None,
    is_causal=False,
    causal_alignment="top-left",
    window=None,
    scale=None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    enable_gqa=False,
):
    """``(out, weights, lse)`` of attention with every option, in float64, from the independent formula.

    The sink enters as key ``S`` (score = sink, value 0, never masked) and is dropped from the weights.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("...le,...se->...ls", q, k) * scale
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    if bias is not None:
        scores = scores + np.asarray(bias, dtype=np.float64)
    if alibi_slopes is not None:
        scores = scores + alibi_plain(alibi_slopes, L, S, causal_alignment)
    allowed = window_allowed(L, S, window, causal_alignment, is_causal)
    if mask is not None:
        allowed = allowed & mask
    shape = np.broadcast_shapes(scores.shape, allowed.shape)
    scores, allowed = np.broadcast_to(scores, shape), np.broadcast_to(allowed, shape)
    v = np.broadcast_to(v, (*np.broadcast_shapes(shape[:-2], v.shape[:-2]), S, v.shape[-1]))
    if sinks is not None:
        sink_column = np.broadcast_to(np.asarray(sinks, dtype=np.float64)[..., None, None], (*shape[:-1], 1))
        scores = np.concatenate([scores, sink_column], axis=-1)
        allowed = np.concatenate([allowed, np.ones((*shape[:-1], 1), dtype=bool)], axis=-1)
        v = np.concatenate([v, np.zeros((*v.shape[:-2], 1, v.shape[-1]))], axis=-2)
    # The scores travel as the bias; scale 0 zeroes the formula's own q k^T (q and k only set the shapes).
    q0 = np.zeros((*shape[:-2], L, 1))
    k0 = np.zeros((*shape[:-2], scores.shape[-1], 1))
    out, weights = reference_attention(q0, k0, v, allowed=allowed, bias=scores, scale=0.0)
    kept = np.where(allowed, scores, -np.inf)
    top = kept.max(axis=-1, initial=-np.inf)
    finite_top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # log(0) = -inf for a row with nothing allowed
        lse = finite_top + np.log(np.exp(kept - finite_top[..., None]).sum(axis=-1))
    return out, weights[..., :S], lse
