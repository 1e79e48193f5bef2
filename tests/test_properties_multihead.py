"""Property tests for multi-head attention and rotary embeddings (hypothesis, small arrays)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_multihead import _params

from attention_ref import MultiHeadParams, apply_rope, multi_head_attention

SETTINGS = settings(max_examples=25, deadline=None)


def _naive_attention(q, k, v, allowed=None):
    """softmax(q k^T / sqrt(d)) v for 2-D q, k, v, written out with explicit loops over rows."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    out = np.zeros((q.shape[0], v.shape[1]))
    weights = np.zeros((q.shape[0], k.shape[0]))
    for i in range(q.shape[0]):
        keys = range(k.shape[0]) if allowed is None else [j for j in range(k.shape[0]) if allowed[i, j]]
        s = np.array([scale * q[i] @ k[j] for j in keys])
        if len(s) == 0:
            continue
        e = np.exp(s - s.max())
        for j, w in zip(keys, e / e.sum(), strict=True):
            weights[i, j] = w
            out[i] += w * v[j]
    return out, weights


@st.composite
def layers(draw, gqa=False):
    """Random parameters (with random biases) plus an input x (L, d_model) and a context (S, d_context)."""
    seed = draw(st.integers(0, 2**32 - 1))
    n_kv = draw(st.integers(1, 3))
    n_heads = n_kv * (draw(st.integers(1, 3)) if gqa else 1)
    d_head = draw(st.integers(1, 4))
    d_model = draw(st.integers(1, 6))
    d_context = draw(st.sampled_from([d_model, draw(st.integers(1, 6))]))
    L, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    with_bias = draw(st.booleans())
    rng = np.random.default_rng(seed)
    params = _params(rng, d_model, n_heads, d_head, n_kv_heads=n_kv, d_context=d_context, bias=with_bias)
    x, ctx = rng.normal(size=(L, d_model)), rng.normal(size=(S, d_context))
    mask = rng.random((L, S)) < 0.7 if draw(st.booleans()) else None
    return params, x, ctx, mask


def _affine(x, w, b):
    return x @ w if b is None else x @ w + b


@SETTINGS
@given(layers(gqa=True))
def test_mha_equals_loop_over_heads_of_plain_attention(case):
    """The definition: head h uses column block h of w_q and block h // g of w_k, w_v; concat; project."""
    p, x, ctx, mask = case
    d, g = p.d_head, p.n_heads // p.n_kv_heads
    q_all, k_all, v_all = _affine(x, p.w_q, p.b_q), _affine(ctx, p.w_k, p.b_k), _affine(ctx, p.w_v, p.b_v)
    heads, head_weights = [], []
    for h in range(p.n_heads):
        kv = h // g
        out_h, w_h = _naive_attention(
            q_all[:, h * d : (h + 1) * d], k_all[:, kv * d : (kv + 1) * d], v_all[:, kv * d : (kv + 1) * d], mask
        )
        heads.append(out_h)
        head_weights.append(w_h)
    expected = _affine(np.concatenate(heads, axis=-1), p.w_o, p.b_o)
    out, weights = multi_head_attention(x, p, context=ctx, mask=mask, return_weights=True)
    np.testing.assert_allclose(out, expected, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(weights, np.stack(head_weights), rtol=1e-11, atol=1e-13)


@SETTINGS
@given(layers(gqa=True))
def test_gqa_equals_mha_with_repeated_kv_columns(case):
    """Grouped-query attention is ordinary MHA whose key/value heads are copied g times."""
    p, x, ctx, mask = case
    g, d = p.n_heads // p.n_kv_heads, p.d_head

    def repeat_heads(a):  # (..., n_kv * d) -> (..., n_heads * d), each head block g times in a row
        if a is None:
            return None
        blocks = [a[..., kv * d : (kv + 1) * d] for kv in range(p.n_kv_heads) for _ in range(g)]
        return np.concatenate(blocks, axis=-1)

    full = MultiHeadParams(
        w_q=p.w_q,
        w_k=repeat_heads(p.w_k),
        w_v=repeat_heads(p.w_v),
        w_o=p.w_o,
        n_heads=p.n_heads,
        b_q=p.b_q,
        b_k=repeat_heads(p.b_k),
        b_v=repeat_heads(p.b_v),
        b_o=p.b_o,
    )
    np.testing.assert_allclose(
        multi_head_attention(x, p, context=ctx, mask=mask),
        multi_head_attention(x, full, context=ctx, mask=mask),
        rtol=1e-12,
        atol=1e-12,
    )


@SETTINGS
@given(layers(), st.randoms(use_true_random=False))
def test_batched_equals_one_sequence_at_a_time(case, random):
    p, x, ctx, mask = case
    rng = np.random.default_rng(random.getrandbits(32))
    xs = np.stack([x, rng.normal(size=x.shape)])
    ctxs = np.stack([ctx, rng.normal(size=ctx.shape)])
    batched = multi_head_attention(xs, p, context=ctxs, mask=mask)
    for b in range(2):
        np.testing.assert_allclose(
            batched[b], multi_head_attention(xs[b], p, context=ctxs[b], mask=mask), rtol=1e-12, atol=1e-12
        )


@SETTINGS
@given(layers(), st.randoms(use_true_random=False))
def test_permutation_equivariance_without_positions(case, random):
    """Self-attention has no notion of order: permuting the tokens permutes the output rows."""
    p, x, _, _ = case
    if p.d_context != p.d_model:
        p = MultiHeadParams(w_q=p.w_q, w_k=p.w_q, w_v=p.w_q, w_o=p.w_o, n_heads=p.n_heads)
    perm = np.random.default_rng(random.getrandbits(32)).permutation(x.shape[0])
    out, w = multi_head_attention(x, p, return_weights=True)
    out_p, w_p = multi_head_attention(x[perm], p, return_weights=True)
    np.testing.assert_allclose(out_p, out[perm], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w_p, w[:, perm][:, :, perm], rtol=1e-12, atol=1e-13)


@SETTINGS
@given(layers())
def test_cross_attention_permuting_context_changes_nothing(case):
    p, x, ctx, _ = case
    perm = np.arange(ctx.shape[0])[::-1]
    np.testing.assert_allclose(
        multi_head_attention(x, p, context=ctx[perm]), multi_head_attention(x, p, context=ctx), rtol=1e-12, atol=1e-12
    )


# ---------------------------------------------------------------- RoPE

_positions = st.integers(-50, 50)
_halves = st.integers(1, 8)


@SETTINGS
@given(st.integers(0, 2**32 - 1), _halves, _positions, _positions, _positions, st.booleans())
def test_rope_scores_depend_only_on_relative_position(seed, half, m, n, shift, interleaved):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(1, 2 * half)), rng.normal(size=(1, 2 * half))
    score = (apply_rope(q, [m], interleaved=interleaved) @ apply_rope(k, [n], interleaved=interleaved).T).item()
    shifted = (
        apply_rope(q, [m + shift], interleaved=interleaved) @ apply_rope(k, [n + shift], interleaved=interleaved).T
    ).item()
    relative = (q @ apply_rope(k, [n - m], interleaved=interleaved).T).item()
    scale = np.linalg.norm(q) * np.linalg.norm(k)
    assert abs(score - shifted) <= 1e-12 * scale
    assert abs(score - relative) <= 1e-12 * scale


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 4),
    _halves,
    st.floats(-1e3, 1e3, allow_nan=False),
    st.booleans(),
    st.sampled_from([10000.0, 500000.0, 10.0]),
)
def test_rope_preserves_norms_per_pair(seed, t, half, start, interleaved, base):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, t, 2 * half))
    positions = start + np.arange(t) * 0.5  # non-integer positions too
    y = apply_rope(x, positions, base=base, interleaved=interleaved)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)
    pairs = (
        (lambda a: a[..., 0::2] ** 2 + a[..., 1::2] ** 2)
        if interleaved
        else (lambda a: a[..., :half] ** 2 + a[..., half:] ** 2)
    )
    np.testing.assert_allclose(pairs(y), pairs(x), rtol=1e-12, atol=1e-15)


@SETTINGS
@given(st.integers(0, 2**32 - 1), _halves, _positions, _positions, st.booleans())
def test_rope_composes_additively(seed, half, a, b, interleaved):
    """Rotating by a and then by b is rotating by a + b."""
    x = np.random.default_rng(seed).normal(size=(1, 2 * half))
    twice = apply_rope(apply_rope(x, [a], interleaved=interleaved), [b], interleaved=interleaved)
    np.testing.assert_allclose(twice, apply_rope(x, [a + b], interleaved=interleaved), atol=1e-12)
