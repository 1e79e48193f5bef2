"""Conformance with PyTorch in float64: nn.MultiheadAttention and an independent RoPE.

PyTorch's modules use the column-vector convention ``y = x @ W.T + b``, so its weights are transposed when
copied into `MultiHeadParams`. Its boolean ``attn_mask`` and ``key_padding_mask`` mark *forbidden* pairs,
the opposite of our masks.
"""

import numpy as np
import pytest

from attention_ref import MultiHeadParams, apply_rope, multi_head_attention

pytestmark = pytest.mark.torch

TOL = 1e-12  # max abs error allowed in float64


def _torch_mha(torch, embed_dim, num_heads, *, bias, kdim=None, seed=0):
    """A float64 nn.MultiheadAttention with random weights and (if any) random, non-zero biases."""
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(
        embed_dim, num_heads, bias=bias, kdim=kdim, vdim=kdim, batch_first=True, dtype=torch.float64
    )
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn_like(p))
    return mha


def _params_from_torch(mha):
    """Copy the weights of `mha` into MultiHeadParams (transposing to the row convention)."""
    E = mha.embed_dim

    def arr(t):
        return None if t is None else t.detach().numpy().copy()

    if mha._qkv_same_embed_dim:
        w = arr(mha.in_proj_weight)  # (3E, E)
        w_q, w_k, w_v = w[:E].T, w[E : 2 * E].T, w[2 * E :].T
    else:
        w_q, w_k, w_v = arr(mha.q_proj_weight).T, arr(mha.k_proj_weight).T, arr(mha.v_proj_weight).T
    b = arr(mha.in_proj_bias)
    b_q, b_k, b_v = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
    return MultiHeadParams(
        w_q=w_q,
        w_k=w_k,
        w_v=w_v,
        w_o=arr(mha.out_proj.weight).T,
        n_heads=mha.num_heads,
        b_q=b_q,
        b_k=b_k,
        b_v=b_v,
        b_o=arr(mha.out_proj.bias),
    )


def _run_torch(torch, mha, x, ctx, *, key_padding_forbidden=None, attn_forbidden=None, is_causal=False):
    t = torch.from_numpy
    out, w = mha(
        t(x),
        t(ctx),
        t(ctx),
        key_padding_mask=None if key_padding_forbidden is None else t(key_padding_forbidden),
        attn_mask=None if attn_forbidden is None else t(attn_forbidden),
        need_weights=True,
        average_attn_weights=False,
        is_causal=is_causal,
    )
    return out.detach().numpy(), w.detach().numpy()


def _max_err(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _assert_matches(ours, theirs):
    """Compare (out, weights) pairs elementwise within TOL."""
    for a, b in zip(ours, theirs, strict=True):
        assert _max_err(a, b) <= TOL


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("embed_dim", "num_heads"), [(8, 2), (6, 3), (4, 1)])
def test_self_attention_matches_torch(torch, rng, bias, embed_dim, num_heads):
    mha = _torch_mha(torch, embed_dim, num_heads, bias=bias)
    x = rng.normal(size=(2, 5, embed_dim))
    expected = _run_torch(torch, mha, x, x)
    _assert_matches(multi_head_attention(x, _params_from_torch(mha), return_weights=True), expected)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kdim", [8, 3, 11])
def test_cross_attention_with_kdim_matches_torch(torch, rng, bias, kdim):
    mha = _torch_mha(torch, 8, 4, bias=bias, kdim=kdim, seed=kdim)
    x, ctx = rng.normal(size=(3, 4, 8)), rng.normal(size=(3, 6, kdim))
    expected = _run_torch(torch, mha, x, ctx)
    params = _params_from_torch(mha)
    assert params.d_context == kdim
    _assert_matches(multi_head_attention(x, params, context=ctx, return_weights=True), expected)


def test_key_padding_and_attn_mask_match_torch(torch, rng):
    B, L, S, E, H = 3, 4, 6, 8, 2
    mha = _torch_mha(torch, E, H, bias=True, kdim=5, seed=7)
    x, ctx = rng.normal(size=(B, L, E)), rng.normal(size=(B, S, 5))
    lengths = np.array([6, 3, 1])
    key_padding_forbidden = np.arange(S)[None, :] >= lengths[:, None]  # (B, S), True = padding
    attn_forbidden = rng.random((L, S)) < 0.3
    attn_forbidden[:, 0] = False  # every query keeps key 0, so no row is empty (torch would give NaN)
    expected = _run_torch(
        torch, mha, x, ctx, key_padding_forbidden=key_padding_forbidden, attn_forbidden=attn_forbidden
    )
    # Our polarity: True = may attend; padding broadcast over heads and queries: (B, 1, 1, S).
    allowed = ~key_padding_forbidden[:, None, None, :] & ~attn_forbidden
    _assert_matches(
        multi_head_attention(x, _params_from_torch(mha), context=ctx, mask=allowed, return_weights=True), expected
    )


def test_float_attn_mask_is_our_bias(torch, rng):
    L, E, H = 5, 6, 3
    mha = _torch_mha(torch, E, H, bias=True, seed=3)
    x = rng.normal(size=(2, L, E))
    attn_bias = rng.normal(size=(2 * H, L, L))  # torch: (B * H, L, S), batch-major
    expected = _run_torch(torch, mha, x, x, attn_forbidden=attn_bias)
    _assert_matches(
        multi_head_attention(x, _params_from_torch(mha), bias=attn_bias.reshape(2, H, L, L), return_weights=True),
        expected,
    )


def test_causal_matches_torch(torch, rng):
    L, E, H = 5, 8, 4
    mha = _torch_mha(torch, E, H, bias=True, seed=5)
    x = rng.normal(size=(2, L, E))
    forbidden = np.triu(np.ones((L, L), dtype=bool), k=1)  # torch wants the mask with is_causal as a hint
    expected = _run_torch(torch, mha, x, x, attn_forbidden=forbidden, is_causal=True)
    _assert_matches(multi_head_attention(x, _params_from_torch(mha), is_causal=True, return_weights=True), expected)


def test_gqa_matches_torch_sdpa(torch, rng):
    """Grouped-query heads against torch's enable_gqa, with projections done in torch."""
    B, L, S, E, H, Hkv, D = 2, 3, 5, 6, 4, 2, 3
    params = MultiHeadParams(
        w_q=rng.normal(size=(E, H * D)),
        w_k=rng.normal(size=(E, Hkv * D)),
        w_v=rng.normal(size=(E, Hkv * D)),
        w_o=rng.normal(size=(H * D, E)),
        n_heads=H,
        n_kv_heads=Hkv,
        b_q=rng.normal(size=H * D),
        b_k=rng.normal(size=Hkv * D),
        b_v=rng.normal(size=Hkv * D),
        b_o=rng.normal(size=E),
    )
    x, ctx = rng.normal(size=(B, L, E)), rng.normal(size=(B, S, E))
    t = torch.from_numpy

    def heads(a, w, b, n):  # (B, T, E) -> (B, n, T, D) in torch
        return (t(a) @ t(w) + t(b)).reshape(a.shape[0], a.shape[1], n, D).transpose(1, 2)

    o = torch.nn.functional.scaled_dot_product_attention(
        heads(x, params.w_q, params.b_q, H),
        heads(ctx, params.w_k, params.b_k, Hkv),
        heads(ctx, params.w_v, params.b_v, Hkv),
        enable_gqa=True,
    )
    ref = (o.transpose(1, 2).reshape(B, L, H * D) @ t(params.w_o) + t(params.b_o)).numpy()
    assert _max_err(multi_head_attention(x, params, context=ctx), ref) <= TOL


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matches_independent_torch_computation(torch, rng, interleaved):
    """Half layout: Hugging Face's rotate_half formula; interleaved: LLaMA's complex multiplication."""
    T, D, base = 7, 8, 10000.0
    x = rng.normal(size=(2, 3, T, D))
    positions = np.arange(T) + 2.0
    xt, pos = torch.from_numpy(x), torch.from_numpy(positions)
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.outer(pos, inv_freq)  # (T, D/2)
    if interleaved:
        z = torch.view_as_complex(xt.reshape(*xt.shape[:-1], D // 2, 2).contiguous())
        ref = torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
    else:
        emb = torch.cat([angles, angles], dim=-1)
        rotate_half = torch.cat([-xt[..., D // 2 :], xt[..., : D // 2]], dim=-1)
        ref = xt * emb.cos() + rotate_half * emb.sin()
    out = apply_rope(x, positions, base=base, interleaved=interleaved)
    assert _max_err(out, ref.numpy()) <= TOL
