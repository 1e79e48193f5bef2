"""flex_attention, flex_attention_backward and block_mask_to_dense.

Against PyTorch's FlexAttention (CPU, float64, eager, a BlockMask from create_block_mask) on every building
block, on combinations and on attention-gym's variants, each written a second time in torch here; against
scaled_dot_product_attention with the dense mask and bias the same functions give; tile skipping counted;
the memory bound at L = 16,384; bad mods; gradients against torch autograd through the function Flex's CPU path
runs. Mods written for torch (captured tensors, autograd derivatives, the device tried next) against the NumPy
ones; torch's BlockMask read as it is; torch never imported for NumPy mods. The largest deviation per building
block is printed at the end of the session (conftest.py).
"""

import math
import subprocess
import sys
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_finite_where, not_recorded, planted

import attention_ref as ar
from attention_ref import flex
from attention_ref._validation import bfloat16_dtype

TOL = 1e-12
B, H, L, S, E, EV = 2, 4, 29, 41, 8, 5
OFFSET = S - L  # bottom-right: query i sits at key position i + S - L
IDS = np.repeat(np.arange(5), [9, 3, 12, 6, 11])  # document of each of S = 41 positions (queries use the first L)
IDS_PER_BATCH = np.stack([IDS, np.repeat(np.arange(3), [20, 1, 20])])
SLOPES = np.array([0.5, 0.25, 0.125, 0.0625])
TABLE = np.random.default_rng(3).standard_normal((H, 2 * 6 + 1))  # relative positions -6..6


# --- the cases: our NumPy mods and the same in torch ----------------------------------------------------


def gym_doc_ids(lengths):
    return np.repeat(np.arange(len(lengths)), lengths), np.concatenate([[0], np.cumsum(lengths)])


def cases(torch):
    """``{name: (score_mod, mask_mod, torch_score_mod, torch_mask_mod)}`` for (B, H, L, S) problems."""
    from torch.nn.attention.flex_attention import and_masks, noop_mask, or_masks

    ids, ids2 = torch.from_numpy(IDS), torch.from_numpy(IDS_PER_BATCH)
    slopes, table = torch.from_numpy(SLOPES), torch.from_numpy(TABLE)

    def t_causal(offset):
        return lambda b, h, i, j: j <= i + offset

    def t_window(left, right, offset=0):
        return lambda b, h, i, j: (j >= i + offset - left) & (j <= i + offset + right)

    def t_document(b, h, i, j):
        return ids[i] == ids[j]

    def t_softcap(s, b, h, i, j):
        return 2.5 * torch.tanh(s / 2.5)

    def t_alibi(offset):
        return lambda s, b, h, i, j: s - slopes[h] * (i + offset - j).abs()

    def t_relative(s, b, h, i, j):
        return s + table[h, (j - i).clamp(-6, 6) + 6]

    # attention-gym variants, in NumPy (as a user would port them) and in torch (as attention-gym writes them)
    doc_id, offsets = gym_doc_ids([7, 10, 4, 20])

    def gym_doc_np(b, h, i, j):
        inner = (i - offsets[doc_id[i]]) >= (j - offsets[doc_id[j]])
        return (doc_id[i] == doc_id[j]) & inner

    t_doc_id, t_offsets = torch.from_numpy(doc_id), torch.from_numpy(offsets)

    def gym_doc_t(b, h, i, j):
        inner = (i - t_offsets[t_doc_id[i]]) >= (j - t_offsets[t_doc_id[j]])
        return (t_doc_id[i] == t_doc_id[j]) & inner

    def gym_alibi_np(s, b, h, i, j):
        return s + (j - i) * np.exp2(-((h + 1) * 8.0 / H))

    def gym_alibi_t(s, b, h, i, j):
        return s + (j - i) * torch.exp2(-((h + 1) * 8.0 / H))

    def natten(xp_clip, xp_abs):
        width, kernel = 7, 3  # a 7-wide canvas of 6 rows (42 >= S positions)

        def mask(b, h, i, j):
            qx, qy, kx, ky = i % width, i // width, j % width, j // width
            cx, cy = xp_clip(qx, kernel // 2, width - 1 - kernel // 2), xp_clip(qy, kernel // 2, 5 - kernel // 2)
            return (xp_abs(cx - kx) <= kernel // 2) & (xp_abs(cy - ky) <= kernel // 2)

        return mask

    def dilated(xp_abs):
        return lambda b, h, i, j: (xp_abs(i - j) <= 12) & ((i - j) % 3 == 0)

    def gym_tanh_np(s, b, h, i, j):
        return 30.0 * np.tanh(s / 30.0)

    def gym_tanh_t(s, b, h, i, j):
        return 30.0 * torch.tanh(s / 30.0)

    def gym_prefix_np(b, h, i, j):
        return j < 6

    def gym_prefix_t(b, h, i, j):
        return j < 6

    causal_np = ar.causal_mask_mod()
    return {
        "noop_mask": (None, ar.noop_mask, None, noop_mask),
        "causal top-left": (None, causal_np, None, t_causal(0)),
        "causal bottom-right": (None, ar.causal_mask_mod("bottom-right", (L, S)), None, t_causal(OFFSET)),
        "sliding window": (None, ar.sliding_window_mask_mod((5, 2)), None, t_window(5, 2)),
        "sliding window bottom-right": (None, ar.sliding_window_mask_mod((4, 0), "bottom-right", (L, S)), None,
                                        t_window(4, 0, OFFSET)),
        "document": (None, ar.document_mask_mod(IDS), None, t_document),
        "document per batch": (None, ar.document_mask_mod(IDS_PER_BATCH), None,
                               lambda b, h, i, j: ids2[b, i] == ids2[b, j]),
        "prefix-LM": (None, ar.prefix_lm_mask_mod(6), None, lambda b, h, i, j: (j < 6) | (j <= i)),
        "chunked": (None, ar.chunked_mask_mod(8), None, lambda b, h, i, j: (i // 8 == j // 8) & (j <= i)),
        "softcap": (ar.softcap_score_mod(2.5), None, t_softcap, None),
        "alibi": (ar.alibi_score_mod(SLOPES), None, t_alibi(0), None),
        "alibi bottom-right": (ar.alibi_score_mod(SLOPES, "bottom-right", (L, S)), None, t_alibi(OFFSET), None),
        "relative bias": (ar.relative_bias_score_mod(TABLE, 6), None, t_relative, None),
        "and_masks": (None, ar.and_masks(causal_np, ar.document_mask_mod(IDS)), None,
                      and_masks(t_causal(0), t_document)),
        "or_masks": (None, ar.or_masks(ar.sliding_window_mask_mod((2, 2)), ar.document_mask_mod(IDS)), None,
                     or_masks(t_window(2, 2), t_document)),
        "softcap, alibi, window": (
            ar.chain_score_mods(ar.softcap_score_mod(2.5), ar.alibi_score_mod(SLOPES)),
            ar.sliding_window_mask_mod((7, 0)),
            lambda s, b, h, i, j: t_alibi(0)(t_softcap(s, b, h, i, j), b, h, i, j), t_window(7, 0)),
        "relative bias, causal document": (ar.relative_bias_score_mod(TABLE, 6), ar.and_masks(
            causal_np, ar.document_mask_mod(IDS)), t_relative, and_masks(t_causal(0), t_document)),
        "gym document causal": (None, gym_doc_np, None, gym_doc_t),
        "gym alibi causal": (gym_alibi_np, causal_np, gym_alibi_t, t_causal(0)),
        "gym natten": (None, natten(np.clip, np.abs), None, natten(torch.clamp, torch.abs)),
        "gym dilated window": (None, dilated(np.abs), None, dilated(torch.abs)),
        "gym tanh softcap causal": (gym_tanh_np, causal_np, gym_tanh_t, t_causal(0)),
        "gym prefix-LM": (None, ar.or_masks(gym_prefix_np, causal_np), None, or_masks(gym_prefix_t, t_causal(0))),
    }


CASE_NAMES = [
    "noop_mask", "causal top-left", "causal bottom-right", "sliding window", "sliding window bottom-right",
    "document", "document per batch", "prefix-LM", "chunked", "softcap", "alibi", "alibi bottom-right",
    "relative bias", "and_masks", "or_masks", "softcap, alibi, window", "relative bias, causal document",
    "gym document causal", "gym alibi causal", "gym natten", "gym dilated window", "gym tanh softcap causal",
    "gym prefix-LM",
]


def problem(seed=0, dtype=np.float64, kv_heads=H):
    gen = np.random.default_rng(seed)
    q = 2 * gen.standard_normal((B, H, L, E))
    k = gen.standard_normal((B, kv_heads, S, E))
    v = gen.standard_normal((B, kv_heads, S, EV))
    return tuple(a.astype(dtype) for a in (q, k, v))


def torch_flex(torch, q, k, v, score_mod, mask_mod, **kwargs):
    """PyTorch's FlexAttention, eager on the CPU: ``(out, lse)`` as NumPy arrays."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as flex_t

    Lq, Sk = q.shape[-2], k.shape[-2]
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, q.shape[0], None, Lq, Sk, device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
        out, aux = flex_t(*(torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v)), score_mod=score_mod,
                          block_mask=block_mask, return_aux=AuxRequest(lse=True), **kwargs)
    return out.numpy(), aux.lse.numpy()


@pytest.fixture
def tt(torch):
    torch.set_num_threads(1)
    return torch


def assert_same(record_deviation, group, ours, theirs, ours_lse, theirs_lse):
    """Outputs and log-sum-exps equal within TOL; rows empty in one are empty in the other (zeros, -inf)."""
    empty = np.isneginf(theirs_lse)
    assert np.all(np.isfinite(theirs)) and np.all(np.isfinite(theirs_lse[~empty])), f"torch {group}: NaN or inf"
    assert_finite_where(ours, theirs, f"torch {group}")
    assert_finite_where(ours_lse[~empty], theirs_lse[~empty], f"torch {group}")
    np.testing.assert_array_equal(np.isneginf(ours_lse), empty)
    np.testing.assert_array_equal(ours[empty], 0.0)
    np.testing.assert_array_equal(theirs[empty], 0.0)
    assert record_deviation(f"flex {group}", ours, theirs) <= TOL
    assert record_deviation(f"flex {group} lse", ours_lse[~empty], theirs_lse[~empty]) <= TOL


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("planted_in", ["out", "lse"])
def test_assert_same_fails_on_nan_or_inf_in_ours(value, planted_in):
    out, theirs = planted(value)
    lse, theirs_lse = planted(value, shape=(2, 3), where=(1, 2))
    theirs_lse[0, 0] = -np.inf  # an empty row, zeros on both sides
    theirs[0, 0] = 0.0
    out[0, 0], lse[0, 0] = 0.0, -np.inf
    assert_same(not_recorded, "planted", theirs.copy(), theirs, theirs_lse.copy(), theirs_lse)
    ours, ours_lse = (out, theirs_lse.copy()) if planted_in == "out" else (theirs.copy(), lse)
    with pytest.raises(AssertionError):
        assert_same(not_recorded, "planted", ours, theirs, ours_lse, theirs_lse)


# --- against PyTorch's FlexAttention ------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("name", CASE_NAMES)
def test_matches_torch_flex_attention(tt, record_deviation, name):
    score_mod, mask_mod, t_score, t_mask = cases(tt)[name]
    q, k, v = problem()
    theirs, theirs_lse = torch_flex(tt, q, k, v, t_score, t_mask)
    ours, ours_lse = ar.flex_attention(q, k, v, score_mod, mask_mod, return_lse=True, block_size=(8, 16))
    assert_same(record_deviation, name, ours, theirs, ours_lse, theirs_lse)


@pytest.mark.torch
def test_case_list_is_complete(torch):
    assert sorted(CASE_NAMES) == sorted(cases(torch))


@pytest.mark.torch
@pytest.mark.parametrize("name", ["softcap, alibi, window", "relative bias, causal document", "gym natten"])
def test_grouped_query_heads_and_scale_match_torch(tt, record_deviation, name):
    score_mod, mask_mod, t_score, t_mask = cases(tt)[name]
    q, k, v = problem(seed=1, kv_heads=2)
    theirs, theirs_lse = torch_flex(tt, q, k, v, t_score, t_mask, enable_gqa=True, scale=0.3)
    ours, ours_lse = ar.flex_attention(q, k, v, score_mod, mask_mod, enable_gqa=True, scale=0.3, return_lse=True,
                                       block_size=7)
    assert_same(record_deviation, f"{name} gqa", ours, theirs, ours_lse, theirs_lse)


@pytest.mark.torch
def test_float32_matches_torch_flex_in_float32(tt):
    score_mod, mask_mod, t_score, t_mask = cases(tt)["softcap, alibi, window"]
    q, k, v = problem(seed=2, dtype=np.float32)
    theirs, _ = torch_flex(tt, q, k, v, t_score, t_mask)
    ours = ar.flex_attention(q, k, v, score_mod, mask_mod, block_size=8)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-6)


# --- against scaled_dot_product_attention with the dense mask and bias ------------------------------------


def dense_of(mask_mod, score_mod, shape):
    """The (B, H, L, S) mask and additive term a mask_mod and an additive score_mod give on the whole matrix."""
    Bq, Hq, Lq, Sk = shape
    index = (np.arange(Bq).reshape(-1, 1, 1, 1), np.arange(Hq).reshape(1, -1, 1, 1),
             np.arange(Lq).reshape(1, 1, -1, 1), np.arange(Sk).reshape(1, 1, 1, -1))
    mask = np.ones(shape, bool) if mask_mod is None else np.broadcast_to(mask_mod(*index), shape)
    bias = np.zeros(shape) if score_mod is None else score_mod(np.zeros(shape), *index)
    return mask, bias


ADDITIVE = ["noop_mask", "causal bottom-right", "sliding window", "document per batch", "prefix-LM", "chunked",
            "alibi", "alibi bottom-right", "relative bias", "or_masks", "relative bias, causal document",
            "gym document causal", "gym alibi causal", "gym natten", "gym dilated window", "gym prefix-LM"]


@pytest.mark.torch
@pytest.mark.parametrize("name", ADDITIVE)
def test_matches_torch_sdpa_with_the_dense_mask_and_bias(tt, record_deviation, name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    score_mod, mask_mod, _, _ = cases(tt)[name]
    q, k, v = problem(seed=4)
    mask, bias = dense_of(mask_mod, score_mod, (B, H, L, S))
    with sdpa_kernel(SDPBackend.MATH):
        theirs = tt.nn.functional.scaled_dot_product_attention(
            *(tt.from_numpy(a) for a in (q, k, v)), attn_mask=tt.from_numpy(np.where(mask, bias, -np.inf))).numpy()
    ours = ar.flex_attention(q, k, v, score_mod, mask_mod, block_size=(16, 8))
    empty = ~mask.any(axis=-1)
    np.testing.assert_array_equal(ours[empty], 0.0)
    assert record_deviation(f"sdpa dense {name}", ours[~empty], theirs[~empty]) <= TOL


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_building_blocks_equal_the_built_in_options(alignment):
    q, k, v = problem(seed=5)
    lengths = (L, S)
    window = (6, 1)
    mods = ar.chain_score_mods(ar.softcap_score_mod(1.5), ar.alibi_score_mod(SLOPES, alignment, lengths))
    ours = ar.flex_attention(q, k, v, mods, ar.sliding_window_mask_mod(window, alignment, lengths), block_size=8)
    theirs = ar.scaled_dot_product_attention(q, k, v, window=window, softcap=1.5, alibi_slopes=SLOPES,
                                             causal_alignment=alignment)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-15)
    ours = ar.flex_attention(q, k, v, mask_mod=ar.causal_mask_mod(alignment, lengths))
    theirs = ar.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment=alignment)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-15)


def test_dense_mask_and_bias_give_the_same_attention(reference_attention):
    mask_mod = ar.and_masks(ar.causal_mask_mod(), ar.document_mask_mod(IDS))
    score_mod = ar.relative_bias_score_mod(TABLE, 6)
    q, k, v = problem(seed=6)
    mask, bias = dense_of(mask_mod, score_mod, (B, H, L, S))
    theirs, _ = reference_attention(q, k, v, allowed=mask, bias=bias)
    for block_size in (1, 5, (3, 11), 256):
        ours = ar.flex_attention(q, k, v, score_mod, mask_mod, block_size=block_size)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-14)


# --- semantics: empty rows, dtypes, broadcasting ------------------------------------------------------


def test_rows_scored_minus_inf_everywhere_behave_as_masked():
    q, k, v = problem(seed=7)

    def hide_odd_rows(score, b, h, q_idx, kv_idx):
        return np.where(q_idx % 2 == 1, -np.inf, score)

    out, lse = ar.flex_attention(q, k, v, hide_odd_rows, return_lse=True, block_size=4)
    np.testing.assert_array_equal(out[:, :, 1::2], 0.0)
    assert np.isneginf(lse[:, :, 1::2]).all() and np.isfinite(lse[:, :, ::2]).all()
    np.testing.assert_allclose(out[:, :, ::2], ar.scaled_dot_product_attention(q, k, v)[:, :, ::2], rtol=0,
                               atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_in_gives_its_dtype_out_without_warnings(dtype):
    q, k, v = problem(seed=8, dtype=dtype)
    mask_mod = ar.and_masks(ar.causal_mask_mod(), ar.document_mask_mod(IDS))
    out, lse = ar.flex_attention(q, k, v, ar.softcap_score_mod(3.0), mask_mod, return_lse=True, block_size=8)
    assert out.dtype == dtype and lse.dtype == np.float32
    exact = ar.flex_attention(*(a.astype(np.float64) for a in (q, k, v)), ar.softcap_score_mod(3.0), mask_mod)
    np.testing.assert_allclose(out, exact, rtol=0, atol=2e-3 if dtype == np.float16 else 2e-6)


def test_key_batch_of_one_broadcasts_as_in_torch():
    q, k, v = problem(seed=9)
    out = ar.flex_attention(q, k[:1], v[:1], mask_mod=ar.causal_mask_mod(), block_size=8)
    same = ar.flex_attention(q, np.repeat(k[:1], B, 0), np.repeat(v[:1], B, 0), mask_mod=ar.causal_mask_mod())
    np.testing.assert_allclose(out, same, rtol=0, atol=1e-15)


def test_huge_values_do_not_overflow():
    q, k, v = problem(seed=10)
    v = v * 1e306
    out = ar.flex_attention(q, k, v, mask_mod=ar.causal_mask_mod(), block_size=8)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out / 1e306, ar.flex_attention(q, k, v / 1e306, mask_mod=ar.causal_mask_mod()),
                               rtol=1e-13, atol=0)


# --- tile skipping and memory -------------------------------------------------------------------------


def count_products(monkeypatch):
    calls = []
    original = flex._tile_products

    def counted(a, b):
        calls.append(a.shape)
        return original(a, b)

    monkeypatch.setattr(flex, "_tile_products", counted)
    return calls


def test_tiles_the_mask_hides_cost_no_product_and_no_score_mod(monkeypatch):
    q, k, v = (np.ones((1, 1, 64, 4)) for _ in range(3))
    calls = count_products(monkeypatch)
    seen = []

    def score_mod(score, b, h, q_idx, kv_idx):
        seen.append((int(q_idx.min()), int(kv_idx.min())))
        return score

    ar.flex_attention(q, k, v, score_mod, block_size=8)
    full = len(calls)
    assert full == 8 * 8  # the scores of every tile (its output product follows in the online softmax)
    calls.clear()
    seen.clear()
    # documents of 16 positions, aligned to tiles of 8: 16 of the 64 tiles are visited
    ids = np.repeat(np.arange(4), 16)
    ar.flex_attention(q, k, v, score_mod, ar.document_mask_mod(ids), block_size=8)
    assert len(calls) == full // 4
    assert sorted(seen) == sorted((r, c) for r in range(0, 64, 8) for c in range(0, 64, 8) if r // 16 == c // 16)
    calls.clear()
    # a causal mask hides the 28 tiles above the diagonal: 36 of 64 are computed, about half
    ar.flex_attention(q, k, v, mask_mod=ar.causal_mask_mod(), block_size=8)
    assert len(calls) == 36


def test_backward_skips_the_same_tiles(monkeypatch):
    q, k, v = (np.ones((1, 1, 64, 4)) for _ in range(3))
    calls = count_products(monkeypatch)
    ids = np.repeat(np.arange(4), 16)
    ar.flex_attention_backward(q, k, v, v, mask_mod=ar.document_mask_mod(ids), block_size=8)
    forward = 16  # the scores of the forward the backward runs for its log-sum-exp
    assert len(calls) == forward + 5 * 16  # scores, dP, dQ, dK, dV per visited tile


def test_memory_stays_linear_at_16k_queries():
    n, e = 16_384, 4
    gen = np.random.default_rng(11)
    q, k, v = (gen.standard_normal((1, 1, n, e)) for _ in range(3))
    tracemalloc.start()
    try:
        out = ar.flex_attention(q, k, v, mask_mod=ar.causal_mask_mod(), block_size=256)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    dense = n * n * 8  # one float64 score matrix: 2 GiB
    tile = 256 * 256 * 8  # one tile of scores: 0.5 MiB
    assert peak < 40 * tile, f"peak {peak / 2**20:.1f} MiB; the dense matrix would take {dense / 2**30:.0f} GiB"
    rows = np.r_[0:3, n - 3:n]  # spot rows checked against the dense formula on their keys
    for i in rows:
        scores = q[0, 0, i] @ k[0, 0, : i + 1].T / 2.0
        weights = np.exp(scores - scores.max())
        np.testing.assert_allclose(out[0, 0, i], weights @ v[0, 0, : i + 1] / weights.sum(), rtol=0, atol=1e-13)


# --- bad mods --------------------------------------------------------------------------------------------


def test_bad_mask_results_name_the_function():
    q, k, v = problem()

    def as_ints(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx).astype(int)

    def too_long(b, h, q_idx, kv_idx):
        return np.ones((1, 1, 1, kv_idx.size + 1), bool)

    with pytest.raises(TypeError, match=r"mask_mod 'as_ints' must return booleans .* got dtype int64"):
        ar.flex_attention(q, k, v, mask_mod=as_ints)
    with pytest.raises(TypeError, match=r"mask_mod 'floats' must return booleans .* got dtype float64"):
        ar.flex_attention(q, k, v, mask_mod=lambda_named("floats", lambda b, h, i, j: (j <= i) * 1.0))
    with pytest.raises(ValueError, match=r"mask_mod 'too_long' must return an array that broadcasts to "
                                         r"\(2, 4, 29, 41\) .*got shape \(1, 1, 1, 42\)"):
        ar.flex_attention(q, k, v, mask_mod=too_long)


def lambda_named(name, fn):
    fn.__name__ = name
    return fn


def test_bad_score_results_name_the_function():
    q, k, v = problem()
    with pytest.raises(TypeError, match="score_mod 'rotate' must return real scores"):
        ar.flex_attention(q, k, v, lambda_named("rotate", lambda s, b, h, i, j: s * 1j))
    with pytest.raises(ValueError, match=r"score_mod must return an array that broadcasts to \(2, 4, 8, 8\)"):
        ar.flex_attention(q, k, v, lambda s, b, h, i, j: s[..., :1, :].T, block_size=8)


def test_exceptions_inside_a_mod_name_it_and_chain_the_original():
    q, k, v = problem()
    short_ids = ar.document_mask_mod(np.zeros(10, int))  # positions past 10 raise IndexError
    with pytest.raises(ValueError, match="mask_mod 'document' raised IndexError") as info:
        ar.flex_attention(q, k, v, mask_mod=short_ids, block_size=8)
    assert isinstance(info.value.__cause__, IndexError)
    assert "keys 8:16" in str(info.value)

    def typo(score, b, h, q_idx, kv_idx):
        return score + "1"

    with pytest.raises(TypeError, match="score_mod 'typo' raised") as info:
        ar.flex_attention(q, k, v, typo)
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"score_mod": 3}, TypeError, "score_mod must be a function or None; got int"),
    ({"mask_mod": "causal"}, TypeError, "mask_mod must be a function or None; got str"),
    ({"block_size": 0}, ValueError, "block_size must be >= 1"),
    ({"return_lse": 1}, TypeError, "return_lse must be True or False"),
    ({"enable_gqa": True, "k": np.zeros((2, 3, 41, 8)), "v": np.zeros((2, 3, 41, 5))}, ValueError,
     "must be a multiple of k's heads Hkv=3"),
    ({"k": np.zeros((2, 2, 41, 8)), "v": np.zeros((2, 2, 41, 5))}, ValueError, "or pass enable_gqa=True"),
    ({"q": np.zeros((4, 29, 8))}, ValueError, "q must have exactly 4 dimensions"),
    ({"v": np.zeros((2, 4, 40, 5))}, ValueError, "v must have the batch, heads and length of k"),
    ({"k": np.zeros((3, 4, 41, 8)), "v": np.zeros((3, 4, 41, 5))}, ValueError, "batch size B, or 1"),
])
def test_bad_arguments_name_themselves(kwargs, error, match):
    q, k, v = problem()
    args = {"q": q, "k": k, "v": v, **kwargs}
    with pytest.raises(error, match=match):
        ar.flex_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


# --- gradients ---------------------------------------------------------------------------------------------


GRAD_CASES = ["causal bottom-right", "document per batch", "softcap", "alibi", "relative bias",
              "softcap, alibi, window", "relative bias, causal document", "gym natten"]


@pytest.mark.torch
@pytest.mark.parametrize("name", GRAD_CASES)
def test_gradients_match_torch_autograd_through_flex_math_attention(tt, record_deviation, name):
    import importlib

    from torch.nn.attention.flex_attention import create_block_mask, noop_mask

    hop = importlib.import_module("torch._higher_order_ops.flex_attention")
    score_mod, mask_mod, t_score, t_mask = cases(tt)[name]
    q, k, v = problem(seed=12, kv_heads=2)
    dout = np.random.default_rng(13).standard_normal((B, H, L, EV))
    public, _ = torch_flex(tt, q, k, v, t_score, t_mask, enable_gqa=True)
    tensors = [tt.from_numpy(a).requires_grad_() for a in (q, k, v)]
    block_mask = create_block_mask(t_mask or noop_mask, B, None, L, S, device="cpu")
    out, _, _ = hop.math_attention(*tensors, t_score or (lambda s, b, h, i, j: s), block_mask.as_tuple(),
                                   1.0 / math.sqrt(E), {})
    assert np.array_equal(out.detach().numpy(), public)  # the function the public call runs, bit for bit
    out.backward(tt.from_numpy(dout))
    ours = ar.flex_attention_backward(q, k, v, dout, score_mod, mask_mod, enable_gqa=True, block_size=(8, 16))
    for got, tensor, label in zip(ours, tensors, ("dq", "dk", "dv"), strict=False):
        assert got.shape == tensor.shape
        assert record_deviation(f"flex grad {name}", got, tensor.grad.numpy()) <= TOL, label


def test_gradients_match_the_built_in_backward():
    q, k, v = problem(seed=14)
    dout = np.random.default_rng(15).standard_normal((B, H, L, EV))
    mods = ar.chain_score_mods(ar.softcap_score_mod(1.5), ar.alibi_score_mod(SLOPES))
    ours = ar.flex_attention_backward(q, k, v, dout, mods, ar.sliding_window_mask_mod((4, 2)), block_size=(4, 8))
    theirs = ar.attention_backward(q, k, v, dout, softcap=1.5, alibi_slopes=SLOPES, window=(4, 2))
    for a, b in zip(ours[:3], theirs[:3], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)
    assert ours.dq is ours[0] and ours.dbias is None and ours.dsinks is None


def test_user_score_mod_needs_its_derivative():
    q, k, v = problem()

    def double(score, b, h, q_idx, kv_idx):  # NumPy's function: torch's autograd cannot go through it
        return np.multiply(score, 2.0)

    with pytest.raises(TypeError, match="score_mod 'double' has no derivative: pass score_mod_grad"):
        ar.flex_attention_backward(q, k, v, np.zeros((B, H, L, EV)), double)
    grads = ar.flex_attention_backward(q, k, v, np.ones((B, H, L, EV)), double,
                                       score_mod_grad=lambda s, b, h, i, j: np.full_like(s, 2.0))
    same = ar.attention_backward(q, k, v, np.ones((B, H, L, EV)), scale=2 / math.sqrt(E))
    np.testing.assert_allclose(grads.dq, same.dq, rtol=0, atol=1e-13)
    np.testing.assert_allclose(grads.dk, same.dk, rtol=0, atol=1e-13)


@pytest.mark.parametrize("block_size", [(8, 16), 64])
def test_backward_with_scores_of_plus_or_minus_800(block_size):
    # exp(x) alone overflows (x = 800) or underflows to 0 for a whole row (x = -800): the tile weights must be
    # exp(x - lse), as in attention_backward with the same bias.
    q, k, v = problem(seed=17)
    dout = np.random.default_rng(18).standard_normal((B, H, L, EV))
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    bias = np.where(i < L // 2, 800.0, -800.0) + np.where((i + j) % 3 == 0, 0.0, -2.0)  # (L, S)

    def plus_or_minus_800(score, b, h, q_idx, kv_idx):
        return score + bias[q_idx, kv_idx]

    grads = ar.flex_attention_backward(q, k, v, dout, plus_or_minus_800, block_size=block_size,
                                       score_mod_grad=lambda score, b, h, q_idx, kv_idx: np.ones_like(score))
    want = ar.attention_backward(q, k, v, dout, bias=bias)
    for name in ("dq", "dk", "dv"):
        assert np.all(np.isfinite(getattr(grads, name))), name
        np.testing.assert_allclose(getattr(grads, name), getattr(want, name), rtol=0, atol=1e-12, err_msg=name)


def test_masked_rows_have_zero_gradients_and_low_precision_keeps_its_dtype():
    q, k, v = problem(seed=16, dtype=np.float16)
    mask_mod = lambda_named("upper", lambda b, h, i, j: (i < 10) & (j <= i))
    grads = ar.flex_attention_backward(q, k, v, np.ones((B, H, L, EV)), mask_mod=mask_mod, block_size=8)
    assert [g.dtype for g in grads[:3]] == [np.float16] * 3
    np.testing.assert_array_equal(grads.dq[:, :, 10:], 0.0)
    np.testing.assert_array_equal(grads.dv[:, :, 10:], 0.0)


# --- block masks -------------------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("name", ["causal bottom-right", "document per batch", "sliding window", "gym natten",
                                  "chunked"])
@pytest.mark.parametrize("block", [(8, 16), 16])
def test_block_mask_to_dense_matches_torch_create_mask(tt, name, block):
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    _, mask_mod, _, t_mask = cases(tt)[name]
    block_mask = create_block_mask(t_mask, B, H, L, S, device="cpu", BLOCK_SIZE=block)
    fields = {name: getattr(block_mask, name) for name in
              ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")}
    ours = ar.block_mask_to_dense(**{key: value.numpy() for key, value in fields.items()},
                                  BLOCK_SIZE=block_mask.BLOCK_SIZE, mask_mod=mask_mod,
                                  seq_lengths=block_mask.seq_lengths)
    theirs = create_mask(t_mask, B, H, L, S, device="cpu").numpy()
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ar.block_mask_to_dense(block_mask), theirs)  # the BlockMask itself, torch mask_mod
    np.testing.assert_array_equal(ours, np.broadcast_to(dense_of(mask_mod, None, (B, H, L, S))[0], ours.shape))


def test_block_mask_to_dense_keeps_a_full_block_whole_that_mask_mod_would_deny():
    # A hand-made description, not one create_block_mask would give: query block 0 lists key block 1 as full
    # although the causal mask_mod denies all of it, and key block 0 as partial. Full blocks are all True.
    fields = dict(kv_num_blocks=np.array([[[1, 1]]]), kv_indices=np.array([[[[0], [1]]]]),
                  full_kv_num_blocks=np.array([[[1, 1]]]), full_kv_indices=np.array([[[[1], [0]]]]),
                  BLOCK_SIZE=(2, 3), mask_mod=ar.causal_mask_mod(), seq_lengths=(4, 6))
    expected = np.zeros((4, 6), dtype=bool)
    expected[:2, 3:] = True  # query block 0, key block 1: full, although every key is after every query
    expected[:2, :3] = np.arange(2)[:, None] >= np.arange(3)  # query block 0, key block 0: partial, causal
    expected[2:, :3] = True  # query block 1, key block 0: full
    expected[2:, 3:] = np.arange(2, 4)[:, None] >= np.arange(3, 6)  # query block 1, key block 1: partial, causal
    np.testing.assert_array_equal(ar.block_mask_to_dense(**fields)[0, 0], expected)


def test_block_mask_to_dense_ignores_entries_past_each_count_and_flags_out_of_range_blocks():
    counts = np.array([[[1, 0]]])
    indices = np.array([[[[1, 99]], [[99, 99]]]]).reshape(1, 1, 2, 2)
    dense = ar.block_mask_to_dense(kv_num_blocks=counts, kv_indices=indices, BLOCK_SIZE=(2, 3), seq_lengths=(3, 5))
    expected = np.zeros((3, 5), bool)
    expected[:2, 3:] = True  # query block 0, key block 1 (columns 3..4), no mask_mod: all True
    np.testing.assert_array_equal(dense[0, 0], expected)
    with pytest.raises(ValueError, match=r"a listed key block must be in \[0, 2\); got 1 to 99"):
        ar.block_mask_to_dense(kv_num_blocks=np.array([[[2, 0]]]), kv_indices=indices, BLOCK_SIZE=(2, 3),
                               seq_lengths=(3, 5))
    with pytest.raises(ValueError, match="must have shape \\(1, 1, 3\\)"):
        ar.block_mask_to_dense(kv_num_blocks=counts, kv_indices=indices, BLOCK_SIZE=1, seq_lengths=(3, 5))


def test_a_block_sparse_kernel_can_be_checked_against_its_pattern():
    # A kernel that computes only the diagonal block pairs of a causal mask misses the blocks below it:
    # block_mask_to_dense shows exactly which pairs it left out.
    counts, indices = np.array([[[1, 1]]]), np.array([[[[0], [1]]]])
    dense = ar.block_mask_to_dense(kv_num_blocks=counts, kv_indices=indices, BLOCK_SIZE=4,
                                   mask_mod=ar.causal_mask_mod(), seq_lengths=(8, 8))
    missing = ar.causal_mask(8) & ~dense[0, 0]
    np.testing.assert_array_equal(np.argwhere(missing)[:, 0] >= 4, True)
    assert missing.sum() == 16


# --- mods written for torch ----------------------------------------------------------------------------------


TORCH_MOD_CASES = ["document per batch", "softcap, alibi, window", "relative bias, causal document", "gym natten",
                   "alibi bottom-right"]


@pytest.mark.torch
@pytest.mark.parametrize("name", TORCH_MOD_CASES)
def test_torch_mods_give_what_the_numpy_mods_give(tt, record_deviation, name):
    score_mod, mask_mod, t_score, t_mask = cases(tt)[name]
    q, k, v = problem(seed=20, kv_heads=2)
    dout = np.random.default_rng(21).standard_normal((B, H, L, EV))
    kwargs = {"enable_gqa": True, "block_size": (8, 16)}
    ours, ours_lse = ar.flex_attention(q, k, v, t_score, t_mask, return_lse=True, **kwargs)
    numpy_out, numpy_lse = ar.flex_attention(q, k, v, score_mod, mask_mod, return_lse=True, **kwargs)
    assert_same(record_deviation, f"{name} torch mods", ours, numpy_out, ours_lse, numpy_lse)
    grads = ar.flex_attention_backward(q, k, v, dout, t_score, t_mask, **kwargs)  # t_score: by torch autograd
    numpy_grads = ar.flex_attention_backward(q, k, v, dout, score_mod, mask_mod, **kwargs)
    for got, want, label in zip(grads[:3], numpy_grads[:3], ("dq", "dk", "dv"), strict=True):
        assert record_deviation(f"flex grad {name} torch mods", got, want) <= TOL, label
    for mod in (t_score, t_mask if name in ("document per batch", "gym natten") else None):  # the others: NumPy runs
        assert mod is None or flex._known_device(mod) == tt.device("cpu")  # found to be a torch mod, and remembered


def torch_index(tt, shape):
    """(b, h, q_idx, kv_idx) of a whole (B, H, L, S) problem as int64 tensors, broadcastable as on a tile."""
    return tuple(tt.arange(n).reshape([-1 if axis == i else 1 for i in range(4)]) for axis, n in enumerate(shape))


@pytest.mark.torch
def test_torch_mods_capture_tensors_and_see_the_working_dtype(tt):
    ids = tt.from_numpy(IDS)
    seen = []

    def document(b, h, q_idx, kv_idx):
        seen.append(type(q_idx).__module__.split(".")[0])
        return ids[q_idx] == ids[kv_idx]

    def bias(score, b, h, q_idx, kv_idx):
        seen.append("numpy" if isinstance(score, np.ndarray) else score.dtype)
        return score + tt.where(q_idx >= kv_idx, 0.0, -1.0)

    q, k, v = problem(seed=22)
    ours = ar.flex_attention(q, k, v, bias, document, block_size=8)
    dense_mask = IDS[:L, None] == IDS[None, :]
    np.testing.assert_allclose(ours, ar.scaled_dot_product_attention(
        q, k, v, mask=dense_mask, bias=np.where(np.arange(L)[:, None] >= np.arange(S), 0.0, -1.0)), rtol=0,
        atol=1e-14)
    assert seen.count("numpy") == 2 and seen.count("torch") == 4 * 6  # NumPy tried once per mod; mask: 4 x 6 tiles
    assert set(seen) == {"numpy", "torch", tt.float64}
    for dtype, forward, backward in ((np.float32, tt.float32, tt.float32), (np.float16, tt.float32, tt.float64)):
        seen.clear()
        q, k, v = problem(seed=23, dtype=dtype)
        ar.flex_attention(q, k, v, bias, block_size=16)
        assert set(seen) == {forward}
        seen.clear()
        ar.flex_attention_backward(q, k, v, np.ones((B, H, L, EV), dtype), bias, block_size=16)
        assert set(seen) == {backward}
    scores = np.linspace(-2, 2, 6, dtype=bfloat16_dtype()).reshape(1, 1, 2, 3)  # the checkers' helper, bfloat16
    index = (np.zeros((1, 1, 1, 1), int), np.zeros((1, 1, 1, 1), int), np.arange(2).reshape(1, 1, 2, 1),
             np.arange(3).reshape(1, 1, 1, 3))
    got = flex.tile_score(bias, scores, index, "in the test")
    assert got.dtype == scores.dtype and seen[-1] == tt.bfloat16
    want = (scores.astype(float) - (index[2] < index[3])).astype(scores.dtype)  # rounded to bfloat16, as torch does
    np.testing.assert_array_equal(got.astype(float), want.astype(float))
    index = (*index[:2], np.arange(7, 10).reshape(1, 1, 3, 1), np.arange(8, 12).reshape(1, 1, 1, 4))
    allowed = flex.tile_mask(document, index, (1, 1, 3, 4), "in the test")
    np.testing.assert_array_equal(allowed, (IDS[7:10, None] == IDS[8:12])[None, None])
    assert allowed.any() and not allowed.all()


@pytest.mark.torch
@pytest.mark.parametrize("name", ["softcap", "alibi"])
def test_autograd_derivative_of_a_torch_score_mod_equals_score_mod_grad(tt, name):
    slopes = tt.nn.Parameter(tt.from_numpy(SLOPES))  # a captured tensor that requires grad itself
    numpy_mod, t_mod = {
        "softcap": (ar.softcap_score_mod(2.0), lambda s, b, h, i, j: 2.0 * tt.tanh(s / 2.0)),
        "alibi": (ar.alibi_score_mod(SLOPES), lambda s, b, h, i, j: s - slopes[h] * (i - j).abs()),
    }[name]
    shape = (B, H, L, S)
    scores = 3 * np.random.default_rng(24).standard_normal(shape)
    index = tuple(np.asarray(t) for t in torch_index(tt, shape))
    got = flex._autograd_slope(t_mod, scores, index, "in the test")
    want = np.broadcast_to(numpy_mod.score_mod_grad(scores, *index), shape)
    assert got.shape == shape and got.dtype == np.float64
    np.testing.assert_array_equal(flex.autograd_derivative(t_mod)(scores, *index), got)  # for the checkers
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    if name == "softcap":
        assert not np.all(got == got.flat[0])  # a derivative that depends on the score


@pytest.mark.torch
def test_a_score_mod_of_plain_arithmetic_gets_torch_autograds_derivative(tt):
    """A mod that runs on NumPy arrays and torch tensors alike, as FlexAttention's are written, needs no
    score_mod_grad where torch is installed; one that calls NumPy's functions still does."""
    q, k, v = problem()
    dout = np.random.default_rng(3).standard_normal((B, H, L, EV))

    def shifted(score, b, h, q_idx, kv_idx):
        return 2 * score + (q_idx - kv_idx) * 0.25

    got = ar.flex_attention_backward(q, k, v, dout, shifted)
    given = ar.flex_attention_backward(q, k, v, dout, shifted,
                                       score_mod_grad=lambda s, b, h, i, j: np.full_like(s, 2.0))
    for a, b in zip(got[:3], given[:3], strict=True):
        np.testing.assert_array_equal(a, b)

    def tanh_cap(score, b, h, q_idx, kv_idx):  # NumPy's tanh: no tensor that requires its gradient gets through
        return 5 * np.tanh(score / 5)

    with pytest.raises(TypeError, match="score_mod 'tanh_cap' has no derivative: pass score_mod_grad"):
        ar.flex_attention_backward(q, k, v, dout, tanh_cap)
    with pytest.raises(TypeError, match="score_mod_grad must be a function or None; got int"):
        ar.flex_attention_backward(q, k, v, dout, shifted, score_mod_grad=2)


@pytest.mark.torch
def test_a_mod_that_raises_on_numpy_and_on_torch_names_both_attempts(tt):
    q, k, v = problem()
    short = tt.zeros(10, dtype=tt.int64)

    def document(b, h, q_idx, kv_idx):
        return short[q_idx] == short[kv_idx]  # past 10: IndexError on NumPy index arrays and on tensors

    with pytest.raises(ValueError, match=r"mask_mod 'document' raised IndexError: .* on torch tensors \(cpu\).* "
                                         r"\(on the tile of queries 0:8 and keys 8:16\)") as info:
        ar.flex_attention(q, k, v, mask_mod=document, block_size=8)  # a torch mod from the first tile on
    assert isinstance(info.value.__cause__, IndexError) and "NumPy" not in str(info.value)

    def shifted(b, h, q_idx, kv_idx):
        return short[q_idx + 20] == short[kv_idx]

    with pytest.raises(ValueError, match=r"mask_mod 'shifted' raised IndexError: .* on NumPy arrays and "
                                         r"IndexError: .* on torch tensors \(cpu\).* \(on the tile of queries 0:8 "
                                         r"and keys 0:8\)") as info:
        ar.flex_attention(q, k, v, mask_mod=shifted, block_size=8)
    assert isinstance(info.value.__cause__, IndexError)

    def wrong(score, b, h, q_idx, kv_idx):
        return tt.tanh(score, 2)

    with pytest.raises(TypeError, match=r"^score_mod 'wrong' raised TypeError: .* on NumPy arrays and TypeError: "
                                        r".* on torch tensors") as info:
        ar.flex_attention(q, k, v, wrong)
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.torch
def test_a_torch_mod_that_fails_on_the_cpu_is_tried_on_the_next_device(tt, monkeypatch):
    # A mod that captured CUDA tensors fails on CPU tensors and runs on the accelerator; without one here, the
    # devices to try are a meta device (standing for the CPU, where the mod fails) and then the CPU.
    monkeypatch.setattr(flex, "_torch_devices", lambda torch: [torch.device("meta"), torch.device("cpu")])
    ids = tt.from_numpy(IDS)

    def document(b, h, q_idx, kv_idx):
        if q_idx.device != ids.device:  # NumPy's "cpu" too
            raise RuntimeError(f"Expected all tensors to be on the same device, got {q_idx.device}")
        return ids[q_idx] == ids[kv_idx]

    q, k, v = problem()
    ours = ar.flex_attention(q, k, v, mask_mod=document, block_size=8)
    np.testing.assert_allclose(ours, ar.scaled_dot_product_attention(q, k, v, mask=IDS[:L, None] == IDS),
                               rtol=0, atol=1e-14)
    assert flex._known_device(document) == tt.device("cpu")


@pytest.mark.torch
def test_torch_eager_flex_attention_agrees_with_torch_mods_here(tt, record_deviation):
    q, k, v = problem(seed=25)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def softcap(score, b, h, q_idx, kv_idx):
        return 3.0 * tt.tanh(score / 3.0)

    theirs, theirs_lse = torch_flex(tt, q, k, v, softcap, causal)
    ours, ours_lse = ar.flex_attention(q, k, v, softcap, causal, return_lse=True, block_size=(8, 16))
    assert_same(record_deviation, "torch mods causal softcap", ours, theirs, ours_lse, theirs_lse)


DENSE_CASES = {  # (B, H, L, S): None broadcasts; lengths not multiples of 128, and 256 (full blocks)
    "causal": ((None, None, 200, 300), lambda ids: lambda b, h, i, j: i >= j),
    "sliding window": ((2, None, 200, 300), lambda ids: lambda b, h, i, j: (i - j).abs() <= 40),
    "document": ((None, None, 300, 300), lambda ids: lambda b, h, i, j: ids[i] == ids[j]),
    "causal per head": ((2, 3, 256, 256), lambda ids: lambda b, h, i, j: (i >= j) | ((h == 1) & (b == 0))),
}


@pytest.mark.torch
@pytest.mark.parametrize("name", list(DENSE_CASES))
def test_block_mask_to_dense_reads_a_torch_block_mask(tt, name):
    from torch.nn.attention.flex_attention import create_block_mask

    (Bm, Hm, Lm, Sm), make = DENSE_CASES[name]
    doc_ids = np.repeat(np.arange(4), [50, 70, 30, 150])
    block_mask = create_block_mask(make(tt.from_numpy(doc_ids)), Bm, Hm, Lm, Sm, device="cpu")
    assert block_mask.seq_lengths == (Lm, Sm) and block_mask.BLOCK_SIZE == (128, 128)
    dense = ar.block_mask_to_dense(block_mask)
    b, h, i, j = np.arange(Bm or 1)[:, None, None, None], np.arange(Hm or 1)[:, None, None], np.arange(Lm)[:, None], \
        np.arange(Sm)
    want = np.broadcast_to(make(doc_ids)(b, h, i, j) if name != "sliding window" else abs(i - j) <= 40,
                           (Bm or 1, Hm or 1, Lm, Sm))
    np.testing.assert_array_equal(dense, want)
    if name == "causal per head":
        assert int(block_mask.full_kv_num_blocks.sum()) > 0  # full blocks read too
    fields = {key: getattr(block_mask, key) for key in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                                        "full_kv_indices", "BLOCK_SIZE", "mask_mod", "seq_lengths")}
    np.testing.assert_array_equal(ar.block_mask_to_dense(fields), dense)  # a dict of tensors and a torch mod
    np.testing.assert_array_equal(ar.block_mask_to_dense(**fields), dense)


@pytest.mark.torch
def test_block_mask_to_dense_takes_a_block_mask_or_keywords_not_both(tt):
    from torch.nn.attention.flex_attention import create_block_mask

    block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, 8, 8, device="cpu", BLOCK_SIZE=4)
    with pytest.raises(TypeError, match="takes a block_mask or keywords, not both; got a BlockMask and BLOCK_SIZE"):
        ar.block_mask_to_dense(block_mask, BLOCK_SIZE=4)
    with pytest.raises(TypeError, match=r"block_mask as a dict takes the keywords .*; got 'block_size'"):
        ar.block_mask_to_dense({"block_size": 4})
    with pytest.raises(TypeError, match="needs a block_mask or the keywords kv_num_blocks, kv_indices, BLOCK_SIZE"):
        ar.block_mask_to_dense({"seq_lengths": (8, 8)})
    with pytest.raises(TypeError, match=r"block_mask must be a torch BlockMask .*; got ndarray"):
        ar.block_mask_to_dense(np.ones((1, 1, 8, 8), bool))


def test_the_package_does_not_import_torch_for_numpy_mods():
    code = ("import sys, numpy as np, attention_ref as ar\n"
            "x = np.ones((1, 2, 5, 4))\n"
            "ar.flex_attention_backward(x, x, x, x, ar.softcap_score_mod(2.0), ar.causal_mask_mod(), block_size=2)\n"
            "ar.block_mask_to_dense({'kv_num_blocks': np.ones((1, 1, 1), int), 'kv_indices': np.zeros((1, 1, 1, 1), "
            "int), 'BLOCK_SIZE': 4, 'seq_lengths': (4, 4), 'mask_mod': lambda b, h, i, j: i >= j})\n"
            "try:\n"
            "    ar.flex_attention(x, x, x, mask_mod=lambda b, h, i, j: i.frob())\n"
            "except ValueError as exc:\n"
            "    assert 'torch' not in str(exc), exc\n"
            "assert 'torch' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr


@pytest.mark.torch
def test_a_torch_mod_tried_on_numpy_arrays_shows_no_numpy_warning(tt):
    # tensor + ndarray makes NumPy wrap a tensor through torch's one-argument __array_wrap__, a
    # DeprecationWarning of NumPy 2 raised on that first, NumPy try: the caller never asked for it
    half = tt.tensor(0.5, dtype=tt.float64)

    def relative(score, b, h, q_idx, kv_idx):
        return half * (q_idx - kv_idx) + score

    q, k, v = problem(seed=25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ar.flex_attention(q, k, v, relative, block_size=16)
    assert [str(w.message) for w in caught] == []
    rel = np.arange(L)[:, None] - np.arange(S)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, bias=0.5 * rel), rtol=0, atol=1e-14)
    assert flex._known_device(relative) == tt.device("cpu")


def test_a_numpy_mod_keeps_its_own_warnings():
    def noisy(score, b, h, q_idx, kv_idx):
        warnings.warn("the mod's own warning", UserWarning, stacklevel=1)
        return score

    q, k, v = problem(seed=26)
    with pytest.warns(UserWarning, match="the mod's own warning") as caught:
        out = ar.flex_attention(q, k, v, noisy, block_size=16)
    assert all(w.filename == __file__ for w in caught)  # shown where the mod raised it
    np.testing.assert_array_equal(out, ar.flex_attention(q, k, v, block_size=16))


# --- a block mask's empty blocks are skipped, as FlexAttention skips them ------------------------------------

#: Two batch entries, blocks of 2 by 2 over L = S = 8: query block m has its diagonal block partial (causal),
#: the blocks before it full and those after it empty; batch 1 has block (0, 1) full as well.
BLOCK = 2
N_BLOCKS = 4
STATUS = np.zeros((2, 1, N_BLOCKS, N_BLOCKS), int)  # 0 empty, 1 partial, 2 full
for _m in range(N_BLOCKS):
    STATUS[:, :, _m, :_m] = 2
    STATUS[:, :, _m, _m] = 1
STATUS[1, 0, 0, 1] = 2


def _listed(kind):
    """``(counts, indices)`` of the blocks of `STATUS` equal to `kind`, as a BlockMask holds them."""
    counts = (STATUS == kind).sum(axis=-1)
    indices = np.zeros((*STATUS.shape[:3], N_BLOCKS), np.int64)
    for b, h, m in np.ndindex(*STATUS.shape[:3]):
        found = np.flatnonzero(STATUS[b, h, m] == kind)
        indices[b, h, m, :found.size] = found
    return counts, indices


def _in_block(status_kind, b, q_idx, kv_idx):
    """Whether any of the positions (b, q_idx, kv_idx) lies in a block of `STATUS` of that kind."""
    return np.any(STATUS[b, 0, q_idx // BLOCK, kv_idx // BLOCK] == status_kind)


def _guarded_causal(b, h, q_idx, kv_idx):
    assert not _in_block(0, b, q_idx, kv_idx), "mask_mod called on an empty block"
    assert not _in_block(2, b, q_idx, kv_idx), "mask_mod called on a full block"
    return kv_idx <= q_idx


def _guarded_softcap(score, b, h, q_idx, kv_idx):
    assert not _in_block(0, b, q_idx, kv_idx), "score_mod called on an empty block"
    return 2.0 * np.tanh(score / 2.0)


def _guarded_softcap_grad(score, b, h, q_idx, kv_idx):
    assert not _in_block(0, b, q_idx, kv_idx), "score_mod_grad called on an empty block"
    return 1.0 - np.tanh(score / 2.0) ** 2


def _block_mask():
    partial, full = _listed(1), _listed(2)
    return {"kv_num_blocks": partial[0], "kv_indices": partial[1], "full_kv_num_blocks": full[0],
            "full_kv_indices": full[1], "BLOCK_SIZE": BLOCK, "mask_mod": _guarded_causal, "seq_lengths": (8, 8)}


def test_a_block_masks_empty_blocks_are_skipped_and_its_full_ones_need_no_mask_mod():
    rng = np.random.default_rng(11)
    q, k, v, dout = rng.standard_normal((4, 2, 3, 8, 4))
    dense = np.zeros((2, 1, 8, 8), bool)  # the mask written out: causal, and batch 1's block (0, 1)
    dense[:] = np.tril(np.ones((8, 8), bool))
    dense[1, 0, 0:2, 2:4] = True
    assert np.array_equal(ar.block_mask_to_dense(_block_mask()), dense)
    out, lse = ar.flex_attention(q, k, v, _guarded_softcap, block_mask=_block_mask(), return_lse=True)
    want, want_lse = ar.scaled_dot_product_attention(q, k, v, mask=dense, softcap=2.0, return_lse=True)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-14)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-14)
    grads = ar.flex_attention_backward(q, k, v, dout, _guarded_softcap, block_mask=_block_mask(),
                                       score_mod_grad=_guarded_softcap_grad)
    for got, expected in zip(grads[:3], ar.attention_backward(q, k, v, dout, mask=dense, softcap=2.0)[:3],
                             strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
    # the same mods over the dense mask meet the empty blocks: the guards would see them
    with pytest.raises(ValueError, match="score_mod called on an empty block"):
        ar.flex_attention(q, k, v, _guarded_softcap, lambda b, h, i, j: dense[b, 0, i, j])


def test_a_block_mask_is_refused_with_a_mask_mod_or_for_other_lengths():
    q = np.zeros((2, 3, 8, 4))
    with pytest.raises(ValueError, match="give mask_mod or block_mask, not both"):
        ar.flex_attention(q, q, q, mask_mod=ar.causal_mask_mod(), block_mask=_block_mask())
    with pytest.raises(ValueError, match=r"block_mask describes sequence lengths \(L, S\) = \(8, 8\), but q and k "
                                         r"have \(6, 6\)"):
        ar.flex_attention(q[:, :, :6], q[:, :, :6], q[:, :, :6], block_mask=_block_mask())
    with pytest.raises(ValueError, match=r"block_mask has 2 on the axis of the batch B = 3"):
        ar.flex_attention(np.zeros((3, 1, 8, 4)), np.zeros((3, 1, 8, 4)), np.zeros((3, 1, 8, 4)),
                          block_mask=_block_mask())
