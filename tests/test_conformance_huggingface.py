"""Conformance with Hugging Face transformers' attention, in float64 (and float32 where the masks differ).

What is compared is transformers' own code, called as its models call it, on modules built from small configs
in code (no weights, no tokenizer, nothing downloaded):

- ``eager_attention_forward`` of Llama (grouped-query heads through ``repeat_kv``), Gemma 2 (soft cap
  ``attn_logit_softcapping``, scale ``query_pre_attn_scalar ** -0.5``) and gpt-oss (learned sinks), and
  ``integrations.sdpa_attention.sdpa_attention_forward``;
- the masks of ``masking_utils``: ``create_causal_mask`` and ``create_sliding_window_causal_mask`` from a 2-D
  ``attention_mask`` and a ``DynamicCache`` of past keys, for the eager path (additive ``torch.finfo(dtype).min``)
  and the SDPA path (boolean);
- ``apply_rotary_pos_emb`` (``rotate_half``) of Llama and gpt-oss, and the rotary embedding modules;
- whole attention layers (``LlamaAttention``, ``MistralAttention``, ``GptOssAttention``), prefill and decoding
  with a cache, and gradients by torch autograd through the eager functions.

The conventions, each asserted below:

- ``repeat_kv`` gives query head ``h`` the key/value head ``h // (Hq // Hkv)``: ``enable_gqa=True``.
- With a cache of ``P`` positions and ``L`` new queries, query ``i`` sees keys ``j <= P + i``: our
  ``causal_alignment="bottom-right"``.
- ``sliding_window=W`` allows ``q - W < k <= q``: the ``W`` most recent keys, the query's own included, which is
  ``window=(W - 1, 0)`` here (``sliding_window_mask(..., window=W)``), not ``(W, 0)``.
- A 2-D ``attention_mask`` (1 = real token) gives the 4-D mask ``causal & attention_mask[b, j]``: our
  ``causal_mask`` and ``padding_mask``.
- The eager path (Llama, Mistral, Gemma 2) computes its softmax in float32 whatever the input dtype
  (``softmax(..., dtype=torch.float32).to(query.dtype)``): in float64 it agrees with us only to float32 rounding,
  about 1e-7, compared with ``EAGER_TOL`` and kept in groups of their own, "(float32 softmax)". transformers'
  SDPA path and gpt-oss's eager path (its softmax with the sink runs in the input dtype) agree to float64
  rounding.
- Rows with no allowed key (the padded query positions of a left-padded batch, or of a right-padded one whose
  window holds only padding) are NOT equal by design, and differ between transformers' own paths: the eager path
  adds ``finfo(dtype).min`` to every score of the row, so in float32 its weights are uniform, ``1/S`` each, and
  its output is the mean of all the values, while in float64 the float32 softmax turns float64's ``finfo.min``
  into ``-inf`` and the row is NaN; the SDPA path passes the boolean mask to PyTorch's SDPA, which gives zeros
  (PyTorch 2.13), as attention_ref does; gpt-oss's eager path puts the row's whole weight on the sink and gives
  zeros too. Every row that has an allowed key agrees on every path.
- The soft cap acts on the scaled scores before the mask: ``softcap=``; sinks are one logit per query head
  appended to every row's softmax and dropped: ``sinks=``.
- RoPE pairs feature ``i`` with ``i + D/2`` (``rotate_half``): ``apply_rope(..., interleaved=False)``.
  transformers computes the angles in float32 even for a float64 model, so its rotary *embedding* differs from
  float64 angles at float32 rounding (compared with that tolerance); ``apply_rotary_pos_emb`` given float64
  cos/sin agrees to float64 rounding.

Without transformers (or torch) these tests skip locally and fail in CI (``require``); transformers is in the
``test`` extra.
"""

import inspect

import numpy as np
import pytest
from conftest import assert_finite_where, not_recorded, planted, require

import attention_ref as ar

pytestmark = pytest.mark.torch

TOL = 1e-12  # float64: max |ours - theirs| allowed (the deviations observed are about 1e-15)
TOL32 = 2e-6  # float32 outputs of size about one
# transformers' eager path computes the softmax in float32 whatever the input dtype (softmax(..., dtype=float32)
# then .to(query.dtype)), so its float64 results carry float32 rounding: about 1e-7 on outputs of size about one.
EAGER_TOL = 2e-6


def tolerance(implementation):
    """(group, tol) of a float64 comparison with transformers' `implementation` of Llama-style attention."""
    if implementation == "eager":
        return "transformers eager (float32 softmax)", EAGER_TOL
    return f"transformers {implementation}", TOL
B, L, D_MODEL, HEADS, KV_HEADS, HEAD_DIM = 2, 6, 32, 4, 2, 8


@pytest.fixture(scope="module")
def hf():
    """transformers, with torch on one thread (the machine is shared)."""
    torch = require("torch")
    torch.set_num_threads(1)
    return require("transformers")


def config(hf, name, implementation="eager", **extra):
    """A small config of model `name` (llama, mistral, gemma2, gpt_oss) using `implementation`."""
    classes = {"llama": hf.LlamaConfig, "mistral": hf.MistralConfig, "gemma2": hf.Gemma2Config,
               "gpt_oss": hf.GptOssConfig}
    cfg = classes[name](hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                        head_dim=HEAD_DIM, num_hidden_layers=1, **extra)
    cfg._attn_implementation = implementation
    return cfg


def attention_module(hf, name, cfg, seed=0):
    """Model `name`'s attention layer 0 in float64, eval mode, every parameter random and non-zero."""
    import importlib

    import torch

    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    cls = {"llama": "LlamaAttention", "mistral": "MistralAttention", "gemma2": "Gemma2Attention",
           "gpt_oss": "GptOssAttention"}[name]
    module = getattr(modeling, cls)(cfg, layer_idx=0).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights scaled by 1/sqrt(fan-in): outputs of size about one, deviations comparable
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / (p.shape[-1] ** 0.5 if p.ndim == 2 else 1))
    return module, modeling


def qkv(seed, L=L, S=None, dtype=np.float64, heads=HEADS, kv_heads=KV_HEADS, spread=1.0):
    """Random (B, H, L, E) queries and (B, Hkv, S, E) keys and values."""
    gen = np.random.default_rng(seed)
    S = L if S is None else S
    q = gen.normal(size=(B, heads, L, HEAD_DIM)) * spread
    k = gen.normal(size=(B, kv_heads, S, HEAD_DIM)) * spread
    v = gen.normal(size=(B, kv_heads, S, HEAD_DIM))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def tensors(*arrays):
    import torch

    return [torch.from_numpy(np.array(a)) for a in arrays]  # copies: writable and contiguous


def heads_last(out):
    """transformers' attention output (B, L, H, E) -> ours (B, H, L, E)."""
    return out.detach().numpy().transpose(0, 2, 1, 3)


def allowed_from(mask, dtype):
    """The boolean (B, 1, L, S) pattern of a transformers 4-D mask: bool as is, or additive 0 / finfo(dtype).min."""
    import torch

    if mask.dtype == torch.bool:
        return mask.numpy()
    values = mask.numpy()
    minimum = torch.finfo(dtype).min
    assert np.all((values == 0) | (values == minimum)), "an eager mask holds only 0 and finfo(dtype).min"
    return values == 0


def make_mask(hf, cfg, n_queries, attention_mask=None, cache=None, *, sliding=False, dtype=None):
    """transformers' 4-D mask for `n_queries` new positions (create_causal_mask or its sliding-window twin)."""
    import torch
    from transformers import masking_utils

    dtype = torch.float64 if dtype is None else dtype
    embeds = torch.zeros(B, n_queries, D_MODEL, dtype=dtype)
    if attention_mask is not None:
        attention_mask = torch.from_numpy(np.asarray(attention_mask, dtype=np.int64))
    create = masking_utils.create_sliding_window_causal_mask if sliding else masking_utils.create_causal_mask
    return create(cfg, embeds, attention_mask, cache, allow_is_causal_skip=False)


def filled_cache(hf, cfg, n_past, seed=1):
    """A DynamicCache already holding `n_past` random positions in layer 0."""

    cache = hf.DynamicCache(config=cfg)
    _, k, v = qkv(seed, L=1, S=n_past)
    cache.update(*tensors(k, v), 0)
    return cache


def attention_mask_2d(lengths, n_keys, side):
    """A tokenizer's 2-D attention_mask (1 for real tokens) for sequences of `lengths` padded to `n_keys`."""
    return ar.padding_mask(np.asarray(lengths), n_keys, side=side)[:, 0].astype(np.int64)


def compare(record_deviation, group, ours, theirs, tol=TOL):
    assert ours.shape == theirs.shape
    assert np.all(np.isfinite(theirs)), f"{group} returned NaN or an infinity"
    assert_finite_where(ours, theirs, group)
    deviation = record_deviation(group, ours, theirs)
    assert deviation <= tol, f"{group}: max |ours - theirs| = {deviation:.3e} > {tol:.0e}"
    return deviation


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_compare_fails_on_nan_or_inf_in_ours(value):
    ours, theirs = planted(value)
    assert compare(not_recorded, "planted", theirs.copy(), theirs) == 0.0
    with pytest.raises(AssertionError):
        compare(not_recorded, "planted", ours, theirs, tol=1e300)


# ---------------------------------------------------------------------------------------------------------------
# Grouped-query heads and the causal mask with a cache


def test_repeat_kv_pairs_query_head_h_with_kv_head_h_over_group(hf):
    from transformers.models.llama.modeling_llama import repeat_kv

    _, k, _ = qkv(0, heads=6, kv_heads=2)
    repeated = repeat_kv(*tensors(k), 3).numpy()  # (B, 6, S, E)
    for h in range(6):
        np.testing.assert_array_equal(repeated[:, h], k[:, h // 3])  # PyTorch's enable_gqa mapping, and ours


@pytest.mark.parametrize("n_past", [0, 3])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_causal_with_cache_is_bottom_right(hf, record_deviation, implementation, n_past):
    import torch

    cfg = config(hf, "llama", implementation)
    module, modeling = attention_module(hf, "llama", cfg)
    cache = filled_cache(hf, cfg, n_past) if n_past else None
    mask = make_mask(hf, cfg, L, cache=cache)
    S = n_past + L
    assert mask.shape == (B, 1, L, S)
    np.testing.assert_array_equal(allowed_from(mask, torch.float64)[0, 0],
                                  ar.causal_mask(L, S, alignment="bottom-right"))
    q, k, v = qkv(2, S=S)
    theirs, _ = attend(hf, implementation, module, modeling, q, k, v, mask)
    ours = ar.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                           enable_gqa=True)
    group, tol = tolerance(implementation)
    compare(record_deviation, group, ours, theirs, tol)
    if n_past:  # the test can tell the alignments apart
        top_left = ar.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert np.max(np.abs(top_left - theirs)) > 1e-3


def test_eager_weights_are_ours(hf, record_deviation):
    cfg = config(hf, "llama")
    module, modeling = attention_module(hf, "llama", cfg)
    cache = filled_cache(hf, cfg, 2)
    q, k, v = qkv(3, S=2 + L)
    _, weights = modeling.eager_attention_forward(module, *tensors(q, k, v), make_mask(hf, cfg, L, cache=cache),
                                                  scaling=module.scaling)
    _, ours = ar.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                              enable_gqa=True, return_weights=True)
    theirs = weights.numpy()
    assert theirs.dtype == np.float64
    np.testing.assert_array_equal(theirs.astype(np.float32), theirs)  # float32 numbers: the softmax ran in float32
    deviation = compare(record_deviation, "transformers eager weights (float32 softmax)", ours, theirs, EAGER_TOL)
    assert deviation > 1e-12


# ---------------------------------------------------------------------------------------------------------------
# Padding: a 2-D attention_mask, and what the rows with no allowed key give


def attend(hf, implementation, module, modeling, q, k, v, mask):
    """transformers' attention function of `implementation` (eager: the model's own), as its layer calls it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    forward = modeling.eager_attention_forward if implementation == "eager" else sdpa_attention_forward
    out, weights = forward(module, *tensors(q, k, v), mask, scaling=module.scaling, dropout=0.0)
    return heads_last(out), weights


def mean_of_values(v, shape):
    """Every query row's output under uniform weights over all keys: the mean of its head's values."""
    return np.broadcast_to(np.repeat(v, HEADS // KV_HEADS, axis=1).mean(axis=-2, keepdims=True), shape)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("implementation", "dtype"), [("sdpa", "float64"), ("eager", "float64"),
                                                       ("eager", "float32")])
def test_padding_mask_from_a_2d_attention_mask(hf, record_deviation, implementation, dtype, side):
    """Equal on every row with an allowed key. The rows with none (left padding) differ by design: SDPA gives
    zeros as we do; eager gives the mean of the values in float32 (finfo(float32).min on every key: uniform
    weights) and NaN in float64 (finfo(float64).min becomes -inf when the float32 softmax casts the scores)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    cfg = config(hf, "llama", implementation)
    module, modeling = attention_module(hf, "llama", cfg)
    module = module.to(torch_dtype)
    lengths = np.array([L - 2, L])
    mask = make_mask(hf, cfg, L, attention_mask_2d(lengths, L, side), dtype=torch_dtype)
    allowed = ar.causal_mask(L) & ar.padding_mask(lengths, L, side=side)[:, None]  # (B, 1, L, S)
    np.testing.assert_array_equal(allowed_from(mask, torch_dtype), allowed)
    q, k, v = qkv(4, dtype=dtype)
    theirs, _ = attend(hf, implementation, module, modeling, q, k, v, mask)
    ours = ar.scaled_dot_product_attention(q, k, v, mask=allowed, enable_gqa=True)
    has_key = np.broadcast_to(allowed.any(axis=-1), ours.shape[:-1])  # (B, H, L)
    assert has_key.all() == (side == "right")  # left padding leaves query rows with no key
    group, tol = tolerance(implementation) if dtype == "float64" else ("transformers eager float32", TOL32)
    compare(record_deviation, group, ours[has_key], theirs[has_key], tol)
    np.testing.assert_array_equal(ours[~has_key], 0.0)
    if implementation == "sdpa":  # PyTorch's SDPA gives such rows zeros, as we do
        np.testing.assert_array_equal(theirs[~has_key], 0.0)
    elif dtype == "float32":
        compare(record_deviation, f"{group}, rows with no key vs the mean of the values",
                mean_of_values(v, ours.shape)[~has_key], theirs[~has_key], TOL32)
    else:
        assert np.isnan(theirs[~has_key]).all()


def test_eager_rows_with_no_key_have_uniform_weights(hf):
    import torch

    cfg = config(hf, "llama")
    module, modeling = attention_module(hf, "llama", cfg)
    module = module.to(torch.float32)
    mask = make_mask(hf, cfg, L, attention_mask_2d([2, L], L, "left"), dtype=torch.float32)
    q, k, v = qkv(5, spread=30.0, dtype="float32")  # large scores: still absorbed by finfo.min
    _, weights = attend(hf, "eager", module, modeling, q, k, v, mask)
    no_key = ~allowed_from(mask, torch.float32).any(axis=-1)[:, 0]  # (B, L)
    assert no_key.sum() == L - 2
    np.testing.assert_array_equal(weights.numpy()[no_key[:, None, :].repeat(HEADS, axis=1)], np.float32(1.0 / L))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_eager_finfo_min_mask_equals_minus_infinity_on_rows_with_a_key(hf, record_deviation, dtype):
    """finfo(dtype).min added to a score underflows to a weight of exactly zero, as -inf does."""
    import torch

    cfg = config(hf, "llama")
    module, modeling = attention_module(hf, "llama", cfg)
    module = module.to(getattr(torch, dtype))
    lengths = np.array([3, 5])
    mask = make_mask(hf, cfg, L, attention_mask_2d(lengths, L, "right"), dtype=getattr(torch, dtype))
    assert mask.dtype == getattr(torch, dtype) and mask.min().item() == torch.finfo(getattr(torch, dtype)).min
    q, k, v = qkv(6, dtype=dtype)
    out, weights = modeling.eager_attention_forward(module, *tensors(q, k, v), mask, scaling=module.scaling)
    allowed = allowed_from(mask, getattr(torch, dtype))
    assert np.all(weights.numpy()[np.broadcast_to(~allowed, weights.shape)] == 0.0)
    ours = ar.scaled_dot_product_attention(q, k, v, mask=allowed, enable_gqa=True)
    assert ours.dtype == heads_last(out).dtype == np.dtype(dtype)
    group, tol = tolerance("eager") if dtype == "float64" else ("transformers eager float32", TOL32)
    compare(record_deviation, group, ours, heads_last(out), tol)


# ---------------------------------------------------------------------------------------------------------------
# Sliding windows (Mistral, Gemma 2, gpt-oss): the edge


@pytest.mark.parametrize("W", [1, 2, 3, 5])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_sliding_window_is_the_w_most_recent_keys(hf, implementation, W):
    import torch

    cfg = config(hf, "mistral", implementation, sliding_window=W)
    allowed = allowed_from(make_mask(hf, cfg, L, sliding=True), torch.float64)[0, 0]
    np.testing.assert_array_equal(allowed, ar.sliding_window_mask(L, window=W))
    np.testing.assert_array_equal(allowed, ar.sliding_window_mask(L, window=(W - 1, 0)))
    assert not np.array_equal(allowed, ar.sliding_window_mask(L, window=(W, 0)))  # the off-by-one is visible


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_sliding_window_with_a_sliding_cache(hf, record_deviation, implementation):
    """A sliding-window layer's cache keeps the last W - 1 positions; the mask is bottom-right over what it keeps."""
    import torch

    W, n_past, n_new = 4, 7, 3
    cfg = config(hf, "mistral", implementation, sliding_window=W)
    module, modeling = attention_module(hf, "mistral", cfg)
    cache = filled_cache(hf, cfg, n_past)
    kept = cache.layers[0].keys.shape[-2]
    assert kept == W - 1
    mask = make_mask(hf, cfg, n_new, cache=cache, sliding=True)
    S = kept + n_new
    allowed = allowed_from(mask, torch.float64)[0, 0]
    np.testing.assert_array_equal(allowed, ar.sliding_window_mask(n_new, S, window=W, alignment="bottom-right"))
    q, k, v = qkv(7, L=n_new, S=S)
    theirs, _ = attend(hf, implementation, module, modeling, q, k, v, mask)
    ours = ar.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right",
                                           window=(W - 1, 0), enable_gqa=True)
    group, tol = tolerance(implementation)
    compare(record_deviation, group, ours, theirs, tol)


# ---------------------------------------------------------------------------------------------------------------
# Gemma 2's soft cap and scale, gpt-oss's sinks


def gemma2(hf, W=3, cap=2.0, pre_attn=20):
    cfg = config(hf, "gemma2", sliding_window=W, attn_logit_softcapping=cap, query_pre_attn_scalar=pre_attn,
                 layer_types=["sliding_attention"])
    module, modeling = attention_module(hf, "gemma2", cfg)
    return cfg, module, modeling


def test_gemma2_soft_cap_scale_and_window(hf, record_deviation):
    cfg, module, modeling = gemma2(hf)
    assert module.sliding_window == 3 and module.scaling == 20**-0.5  # not 1/sqrt(head_dim)
    q, k, v = qkv(8, spread=3.0)  # scores of several units: the cap of 2 bends them
    out, weights = modeling.eager_attention_forward(
        module, *tensors(q, k, v), make_mask(hf, cfg, L, sliding=True), scaling=module.scaling,
        softcap=module.attn_logit_softcapping)
    ours, our_weights = ar.scaled_dot_product_attention(
        q, k, v, scale=module.scaling, softcap=2.0, is_causal=True, window=(2, 0), enable_gqa=True,
        return_weights=True)
    compare(record_deviation, "transformers gemma2 eager (float32 softmax)", ours, heads_last(out), EAGER_TOL)
    compare(record_deviation, "transformers gemma2 eager (float32 softmax)", our_weights, weights.numpy(), EAGER_TOL)
    uncapped = ar.scaled_dot_product_attention(q, k, v, scale=module.scaling, is_causal=True, window=(2, 0),
                                               enable_gqa=True)
    assert np.max(np.abs(uncapped - ours)) > 1e-2  # the cap matters here


def gpt_oss(hf, implementation="eager", seed=0):
    cfg = config(hf, "gpt_oss", implementation, sliding_window=3, layer_types=["sliding_attention"])
    module, modeling = attention_module(hf, "gpt_oss", cfg, seed=seed)
    return cfg, module, modeling


@pytest.mark.parametrize("side", ["left", "right"])
def test_gpt_oss_sinks_and_padded_rows(hf, record_deviation, side):
    import torch

    cfg, module, modeling = gpt_oss(hf)
    sinks = module.sinks.detach().numpy()
    mask = make_mask(hf, cfg, L, attention_mask_2d([2, L], L, side), sliding=True)
    allowed = allowed_from(mask, torch.float64)
    q, k, v = qkv(9)
    out, _ = modeling.eager_attention_forward(module, *tensors(q, k, v), mask, scaling=module.scaling)
    ours = ar.scaled_dot_product_attention(q, k, v, mask=allowed, sinks=sinks, enable_gqa=True)
    # Rows with no key (left padding's padded queries; with right padding, the padded queries whose window holds
    # only padding): the sink takes the whole weight, so transformers gives zeros there too.
    compare(record_deviation, "transformers gpt_oss eager", ours, heads_last(out))
    no_key = np.broadcast_to(~allowed.any(axis=-1), ours.shape[:-1])
    assert no_key.any()
    np.testing.assert_array_equal(heads_last(out)[no_key], 0.0)
    without_sinks = ar.scaled_dot_product_attention(q, k, v, mask=allowed, enable_gqa=True)
    assert np.max(np.abs(without_sinks - ours)) > 1e-2


# ---------------------------------------------------------------------------------------------------------------
# RoPE


def float64_angles(positions, head_dim, base):
    """cos and sin of the angles in transformers' layout, (B, T, D): the frequencies repeated, [theta, theta]."""
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.asarray(positions, dtype=np.float64)[..., None] * theta
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


POSITIONS = np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])  # the second: left padding, positions from 0


@pytest.mark.parametrize("name", ["llama", "gpt_oss"])
def test_apply_rotary_pos_emb_is_rotate_half(hf, record_deviation, name):
    import importlib

    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    q, k, _ = qkv(10)
    cos, sin = float64_angles(POSITIONS, HEAD_DIM, 10000.0)
    if name == "gpt_oss":  # its cos and sin hold each frequency once, (B, T, D/2)
        cos, sin = cos[..., : HEAD_DIM // 2], sin[..., : HEAD_DIM // 2]
    q_rot, k_rot = modeling.apply_rotary_pos_emb(*tensors(q, k, cos, sin))
    positions = POSITIONS[:, None, :]  # (B, 1, T): every head
    compare(record_deviation, "transformers rope", ar.apply_rope(q, positions), q_rot.numpy())
    compare(record_deviation, "transformers rope", ar.apply_rope(k, positions), k_rot.numpy())
    interleaved = ar.apply_rope(q, positions, interleaved=True)
    assert np.max(np.abs(interleaved - q_rot.numpy())) > 1e-2  # the layout matters


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rotary_embedding_computes_its_angles_in_float32(hf, theta):
    """cos and sin of LlamaRotaryEmbedding for a float64 model: float64 values of float32 angles. (A property of
    transformers, not a comparison of ours: not recorded among the deviations.)"""
    import torch

    cfg = config(hf, "llama", rope_parameters={"rope_type": "default", "rope_theta": theta})
    rotary = hf.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    positions = np.array([[0, 1, 2, 3, 100, 1000]])
    cos, sin = rotary(torch.zeros(1, dtype=torch.float64), torch.from_numpy(positions))
    assert cos.dtype == torch.float64
    cos64, sin64 = float64_angles(positions, HEAD_DIM, theta)
    deviation = np.max(np.abs(np.concatenate([cos64, sin64]) - np.concatenate([cos.numpy(), sin.numpy()])))
    assert 1e-9 < deviation < 1e-4  # not float64 angles: float32 rounding of angles up to 1000 radians


# ---------------------------------------------------------------------------------------------------------------
# Whole layers: projections, RoPE, heads, the output projection; prefill and decoding with a cache


def rotary(hf, cfg, positions):
    """transformers' cos and sin for `positions` (B, T), float64."""
    import torch

    module = hf.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    return module(torch.zeros(1, dtype=torch.float64), *tensors(positions))


def weights_of(linear):
    """nn.Linear ``y = x W^T + b`` in our row convention: (W^T, b)."""
    bias = None if linear.bias is None else linear.bias.detach().numpy()
    return linear.weight.detach().numpy().T, bias


def params_of(module):
    (w_q, b_q), (w_k, b_k), (w_v, b_v), (w_o, b_o) = (
        weights_of(p) for p in (module.q_proj, module.k_proj, module.v_proj, module.o_proj))
    return ar.MultiHeadParams(w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o,
                              n_heads=HEADS, n_kv_heads=KV_HEADS)


def our_layer(params, x, cos, sin, positions, cache=None, **options):
    """Llama's attention layer from our parts: project, split heads, RoPE with transformers' cos/sin (float32
    angles: both sides rotate by the same numbers), attend, merge heads, project out."""
    def rope(t):  # apply_rope is checked against rotate_half above; rotate by the given cos and sin here
        half = t.shape[-1] // 2
        rotated = np.concatenate([-t[..., half:], t[..., :half]], axis=-1)
        return t * cos[:, None] + rotated * sin[:, None]

    q = rope(ar.split_heads(x @ params.w_q + (0 if params.b_q is None else params.b_q), HEADS))
    k = rope(ar.split_heads(x @ params.w_k + (0 if params.b_k is None else params.b_k), KV_HEADS))
    v = ar.split_heads(x @ params.w_v + (0 if params.b_v is None else params.b_v), KV_HEADS)
    if cache is None:
        out = ar.scaled_dot_product_attention(q, k, v, enable_gqa=True, **options)
    else:
        out = ar.decode_step(q, k, v, cache, enable_gqa=True, **options)
    return ar.merge_heads(out) @ params.w_o + (0 if params.b_o is None else params.b_o)


def test_our_rope_with_float32_angles_is_apply_rope_to_rounding(hf):
    """`our_layer` rotates with transformers' own cos and sin; with float64 ones it is apply_rope."""
    q, _, _ = qkv(11)
    cos, sin = float64_angles(POSITIONS, HEAD_DIM, 10000.0)
    params = ar.MultiHeadParams(w_q=np.eye(D_MODEL), w_k=np.eye(D_MODEL)[:, :16], w_v=np.eye(D_MODEL)[:, :16],
                                w_o=np.eye(D_MODEL), n_heads=HEADS, n_kv_heads=KV_HEADS)
    x = ar.merge_heads(q)
    expected = ar.merge_heads(ar.scaled_dot_product_attention(
        ar.apply_rope(q, POSITIONS[:, None]), ar.apply_rope(ar.split_heads(x[..., :16], KV_HEADS), POSITIONS[:, None]),
        ar.split_heads(x[..., :16], KV_HEADS), enable_gqa=True, is_causal=True))
    np.testing.assert_allclose(our_layer(params, x, cos, sin, POSITIONS, is_causal=True), expected, atol=1e-13)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_layer_prefill_then_decode_with_a_cache(hf, record_deviation, name):
    """The layer over a prompt, then one token at a time with DynamicCache; ours with KVCache and decode_step.
    Mistral's sliding window W: DynamicCache keeps W - 1 positions, KVCache(max_len=W) keeps W; both attend each
    query to its W most recent positions."""
    import torch

    W = 3
    cfg = config(hf, name, "sdpa", **({"sliding_window": W} if name == "mistral" else {}))
    module, _ = attention_module(hf, name, cfg)
    params = params_of(module)
    gen = np.random.default_rng(12)
    x = gen.normal(size=(B, L + 3, D_MODEL))
    positions = np.broadcast_to(np.arange(L + 3), (B, L + 3))
    cos, sin = (t.numpy() for t in rotary(hf, cfg, positions))
    hf_cache, our_cache = hf.DynamicCache(config=cfg), ar.KVCache(max_len=W if name == "mistral" else None)
    steps = [slice(0, L), *(slice(t, t + 1) for t in range(L, L + 3))]
    # transformers 5.24 renamed the attention modules' `past_key_values` argument `cache` (the old name now warns,
    # an error here); 5.23 knows only `past_key_values`.
    cache_keyword = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
    for step in steps:
        rows = positions[:, step]
        mask = make_mask(hf, cfg, rows.shape[1], cache=hf_cache, sliding=name == "mistral")
        with torch.no_grad():
            out, _ = module(torch.from_numpy(x[:, step]), (torch.from_numpy(cos[:, step]),
                                                           torch.from_numpy(sin[:, step])),
                            mask, **{cache_keyword: hf_cache})
        ours = our_layer(params, x[:, step], cos[:, step], sin[:, step], rows, cache=our_cache)
        compare(record_deviation, f"transformers {name} layer with cache", ours, out.numpy())
    full = our_layer(params, x, cos, sin, positions, is_causal=True,
                     **({"window": (W - 1, 0)} if name == "mistral" else {}))
    compare(record_deviation, f"transformers {name} layer with cache", full[:, -1:], out.numpy())


def test_gpt_oss_layer_is_multi_head_attention_with_sinks(hf, record_deviation):
    """GptOssAttention (biased projections, grouped heads, window, sinks) with RoPE at position 0 (cos 1, sin 0)
    is our multi_head_attention."""
    import torch

    cfg, module, _ = gpt_oss(hf, seed=3)
    x = np.random.default_rng(13).normal(size=(B, L, D_MODEL))
    ones = torch.ones(B, L, HEAD_DIM // 2, dtype=torch.float64)  # gpt-oss: each frequency once
    mask = make_mask(hf, cfg, L, sliding=True)
    with torch.no_grad():
        out, _ = module(torch.from_numpy(x), (ones, torch.zeros_like(ones)), mask)
    ours = ar.multi_head_attention(x, params_of(module), is_causal=True, window=(2, 0),
                                   sinks=module.sinks.detach().numpy())
    compare(record_deviation, "transformers gpt_oss layer", ours, out.numpy())


# ---------------------------------------------------------------------------------------------------------------
# Gradients: torch autograd through transformers' eager functions


def autograd(forward, arrays, dout, extra=()):
    """Gradients of <forward(*arrays), dout> with respect to `arrays` and the tensors in `extra`."""
    import torch

    leaves = [t.requires_grad_() for t in tensors(*arrays)]
    out = forward(*leaves)
    out.backward(torch.from_numpy(dout))
    return [t.grad.numpy() for t in (*leaves, *extra)]


def test_backward_gemma2_soft_cap_window_gqa(hf, record_deviation):
    cfg, module, modeling = gemma2(hf)
    mask = make_mask(hf, cfg, L, sliding=True)
    q, k, v = qkv(14, spread=3.0)
    dout = np.random.default_rng(15).normal(size=(B, L, HEADS, HEAD_DIM))
    theirs = autograd(lambda *t: modeling.eager_attention_forward(
        module, *t, mask, scaling=module.scaling, softcap=module.attn_logit_softcapping)[0], (q, k, v), dout)
    ours = ar.attention_backward(q, k, v, dout.transpose(0, 2, 1, 3), scale=module.scaling, softcap=2.0,
                                 is_causal=True, window=(2, 0), enable_gqa=True)
    for mine, their in zip(ours[:3], theirs, strict=True):
        compare(record_deviation, "transformers gemma2 eager backward (float32 softmax)", mine, their, EAGER_TOL)


def test_backward_gpt_oss_sinks_and_left_padding(hf, record_deviation):
    import torch

    cfg, module, modeling = gpt_oss(hf)
    mask = make_mask(hf, cfg, L, attention_mask_2d([2, L], L, "left"), sliding=True)
    q, k, v = qkv(16)
    dout = np.random.default_rng(17).normal(size=(B, L, HEADS, HEAD_DIM))
    module.sinks.grad = None
    theirs = autograd(lambda *t: modeling.eager_attention_forward(module, *t, mask, scaling=module.scaling)[0],
                      (q, k, v), dout, extra=(module.sinks,))
    ours = ar.attention_backward(q, k, v, dout.transpose(0, 2, 1, 3), mask=allowed_from(mask, torch.float64),
                                 sinks=module.sinks.detach().numpy(), enable_gqa=True)
    for mine, their in zip((*ours[:3], ours.dsinks), theirs, strict=True):
        compare(record_deviation, "transformers gpt_oss eager backward", mine, their)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_backward_llama_causal_with_cache(hf, record_deviation, implementation):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cfg = config(hf, "llama", implementation)
    module, modeling = attention_module(hf, "llama", cfg)
    mask = make_mask(hf, cfg, L, cache=filled_cache(hf, cfg, 3))
    q, k, v = qkv(18, S=3 + L)
    dout = np.random.default_rng(19).normal(size=(B, L, HEADS, HEAD_DIM))
    forward = modeling.eager_attention_forward if implementation == "eager" else sdpa_attention_forward
    theirs = autograd(lambda *t: forward(module, *t, mask, scaling=module.scaling)[0], (q, k, v), dout)
    group, tol = tolerance(implementation)
    ours = ar.attention_backward(q, k, v, dout.transpose(0, 2, 1, 3), is_causal=True,
                                 causal_alignment="bottom-right", enable_gqa=True)
    for mine, their in zip(ours[:3], theirs, strict=True):  # dk, dv: summed over each key/value head's group
        compare(record_deviation, f"{group} backward", mine, their, tol)
