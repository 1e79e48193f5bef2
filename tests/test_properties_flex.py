"""Hypothesis properties: flex_attention with random mods built from the blocks equals dense attention.

The dense side is the independent float64 formula of conftest.py, given the mask and the additive term that
the same mods give over the whole (L, S) matrix; the gradients are checked against attention_backward with
that dense mask and bias.
"""

import numpy as np
from conftest import _reference_attention
from hypothesis import given, settings
from hypothesis import strategies as st

import attention_ref as ar

SETTINGS = settings(max_examples=60, deadline=None)
ATOL = 1e-12


@st.composite
def mask_mods(draw, L, S, B):
    """A random mask_mod: one of the building blocks, or an and/or of two."""
    alignment = draw(st.sampled_from(["top-left", "bottom-right"]))
    side = st.one_of(st.none(), st.integers(0, 6))
    n = max(L, S)
    choices = [
        lambda: ar.noop_mask,
        lambda: ar.causal_mask_mod(alignment, (L, S)),
        lambda: ar.sliding_window_mask_mod((draw(side), draw(side)), alignment, (L, S)),
        lambda: ar.document_mask_mod(np.sort(np.random.default_rng(draw(st.integers(0, 99))).integers(0, 4, (B, n)))),
        lambda: ar.prefix_lm_mask_mod(draw(st.integers(0, n))),
        lambda: ar.chunked_mask_mod(draw(st.integers(1, 6)), causal=draw(st.booleans())),
    ]
    first = draw(st.sampled_from(choices))()
    combine = draw(st.sampled_from([None, ar.and_masks, ar.or_masks]))
    return first if combine is None else combine(first, draw(st.sampled_from(choices))())


@st.composite
def score_mods(draw, H):
    """A random score_mod: none, one block, or a chain of two."""
    alignment = draw(st.sampled_from(["top-left", "bottom-right"]))
    reach = draw(st.integers(0, 4))
    seed = draw(st.integers(0, 99))
    choices = [
        lambda L, S: ar.softcap_score_mod(draw(st.floats(0.1, 20.0))),
        lambda L, S: ar.alibi_score_mod(ar.alibi_slopes(H), alignment, (L, S)),
        lambda L, S: ar.relative_bias_score_mod(np.random.default_rng(seed).normal(size=(H, 2 * reach + 1)), reach),
        # a large bias: exp of it over- or underflows unless the row maximum is subtracted
        lambda L, S: ar.relative_bias_score_mod(np.random.default_rng(seed).choice([-800.0, 0.0, 800.0],
                                                                                   size=(H, 2 * reach + 1)), reach),
    ]
    picked = draw(st.lists(st.sampled_from(choices), min_size=0, max_size=2))
    return lambda L, S: None if not picked else ar.chain_score_mods(*(make(L, S) for make in picked))


@st.composite
def problems(draw):
    B, H, kv_heads = draw(st.sampled_from([(1, 1, 1), (2, 2, 1), (1, 4, 2), (2, 2, 2)]))
    L, S = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    E, Ev = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = 2.0 * rng.standard_normal((B, H, L, E))
    k = 2.0 * rng.standard_normal((B, kv_heads, S, E))
    v = rng.standard_normal((B, kv_heads, S, Ev))
    mask_mod = draw(st.one_of(st.none(), mask_mods(L, S, B)))
    score_mod = draw(score_mods(H))(L, S)
    block = draw(st.one_of(st.integers(1, 8), st.tuples(st.integers(1, 8), st.integers(1, 8))))
    return q, k, v, score_mod, mask_mod, block


def dense_form(q, k, score_mod, mask_mod):
    """The dense (B, H, L, S) mask and post-mod scores of the same mods, and the expanded keys' head map."""
    B, H, L, _ = q.shape
    S = k.shape[-2]
    index = (np.arange(B).reshape(-1, 1, 1, 1), np.arange(H).reshape(1, -1, 1, 1),
             np.arange(L).reshape(1, 1, -1, 1), np.arange(S).reshape(1, 1, 1, -1))
    mask = np.ones((B, H, L, S), bool) if mask_mod is None else np.broadcast_to(mask_mod(*index), (B, H, L, S))
    k_full = np.repeat(k, H // k.shape[1], axis=1)
    raw = q @ np.swapaxes(k_full, -1, -2) / np.sqrt(q.shape[-1])
    scores = raw if score_mod is None else score_mod(raw.copy(), *index)
    return mask, scores


@SETTINGS
@given(problems())
def test_flex_equals_dense_attention_with_the_same_mods(problem):
    q, k, v, score_mod, mask_mod, block = problem
    H = q.shape[1]
    out, lse = ar.flex_attention(q, k, v, score_mod, mask_mod, enable_gqa=True, return_lse=True, block_size=block)
    mask, scores = dense_form(q, k, score_mod, mask_mod)
    v_full = np.repeat(v, H // v.shape[1], axis=1)
    # the post-mod scores enter the formula as a bias on zero scores
    zeros_q, zeros_k = np.zeros_like(q), np.zeros((q.shape[0], H, k.shape[2], q.shape[3]))
    theirs, _ = _reference_attention(zeros_q, zeros_k, v_full, allowed=mask, bias=scores)
    # scores of 800 carry about 800 eps of rounding into each weight's exponent
    tol = ATOL * max(1.0, np.abs(np.where(mask, scores, 0.0)).max(initial=0.0) / 10)
    np.testing.assert_allclose(out, theirs, rtol=0, atol=tol)
    np.testing.assert_allclose(lse, ar.logsumexp(np.where(mask, scores, -np.inf)), rtol=0, atol=tol)


@SETTINGS
@given(problems(), st.booleans(), st.sampled_from(["top-left", "bottom-right"]))
def test_flex_gradients_equal_the_dense_backward(problem, alibi, alignment):
    q, k, v, _, mask_mod, block = problem
    H, L, S = q.shape[1], q.shape[2], k.shape[2]
    slopes = ar.alibi_slopes(H)
    score_mod = ar.alibi_score_mod(slopes, alignment, (L, S)) if alibi else None
    dout = np.random.default_rng(0).standard_normal((*q.shape[:3], v.shape[-1]))
    ours = ar.flex_attention_backward(q, k, v, dout, score_mod, mask_mod, enable_gqa=True, block_size=block)
    mask, _ = dense_form(q, k, None, mask_mod)
    options = {"alibi_slopes": slopes, "causal_alignment": alignment} if alibi else {}
    theirs = ar.attention_backward(q, k, v, dout, mask=mask, enable_gqa=True, **options)
    for a, b in zip(ours[:3], theirs[:3], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=ATOL)
