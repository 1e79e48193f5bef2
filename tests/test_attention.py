"""Unit tests for scaled_dot_product_attention: every documented convention."""

import math
import warnings

import numpy as np
import pytest

from attention_ref import blockwise_attention, causal_mask, mask_to_bias, padding_mask, scaled_dot_product_attention

FLOATS = [np.float16, np.float32, np.float64]


def rounding(dtype, ulps=4):
    """A tolerance of a few units of `dtype`'s rounding, ``ulps * eps``: 3.9e-3 in float16, 8.9e-16 in float64."""
    return ulps * float(np.finfo(dtype).eps)


def qkv(rng, batch=(), L=3, S=4, E=5, Ev=None, dtype=np.float64):
    Ev = E if Ev is None else Ev
    q = rng.normal(size=(*batch, L, E)).astype(dtype)
    k = rng.normal(size=(*batch, S, E)).astype(dtype)
    v = rng.normal(size=(*batch, S, Ev)).astype(dtype)
    return q, k, v


# --- hand-computed case -----------------------------------------------------


def test_two_keys_by_hand():
    # scores = q k^T / sqrt(2) = [[1, 0], [0, 1]] / sqrt(2); the weights are logistic.
    q = np.eye(2)
    k = np.eye(2)
    v = np.array([[10.0], [20.0]])
    a = 1.0 / (1.0 + math.exp(-1.0 / math.sqrt(2.0)))
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(w, [[a, 1 - a], [1 - a, a]], rtol=1e-15)
    np.testing.assert_allclose(out[:, 0], [10 * a + 20 * (1 - a), 10 * (1 - a) + 20 * a], rtol=1e-15)


def test_matches_independent_reference(rng, reference_attention):
    q, k, v = qkv(rng, batch=(2, 3), L=4, S=6, E=5, Ev=7)
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    ref_out, ref_w = reference_attention(q, k, v)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(w, ref_w, rtol=1e-12, atol=1e-15)


def test_return_weights_switches_the_return_type(rng):
    q, k, v = qkv(rng)
    out = scaled_dot_product_attention(q, k, v)
    assert isinstance(out, np.ndarray) and out.shape == (3, 5)
    pair = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert isinstance(pair, tuple) and len(pair) == 2
    np.testing.assert_array_equal(pair[0], out)
    assert pair[1].shape == (3, 4)


# --- masks ------------------------------------------------------------------


def test_mask_true_means_attend(rng, reference_attention):
    q, k, v = qkv(rng, L=3, S=4)
    mask = np.array([[True, False, True, True], [False, False, False, True], [True, True, True, True]])
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    assert np.all(w[~mask] == 0.0)
    assert np.all(w[mask] > 0.0)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-15)
    np.testing.assert_allclose(w[1], [0, 0, 0, 1])
    np.testing.assert_allclose(out[1], v[3], rtol=1e-15)
    ref_out, _ = reference_attention(q, k, v, allowed=mask)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-14)


def test_mask_is_added_not_multiplied(rng):
    # Renormalising over the allowed keys is what an additive -inf does; a
    # multiplied mask (scores * mask, or weights * mask) would either leave
    # exp(0) on masked keys or break the row sums.
    q, k, v = qkv(rng, L=2, S=5)
    mask = np.array([True, True, False, True, False])
    _, w = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    _, w_sub = scaled_dot_product_attention(q, k[mask], v[mask], return_weights=True)
    np.testing.assert_allclose(w[:, mask], w_sub, rtol=1e-14)
    np.testing.assert_array_equal(w[:, ~mask], 0.0)


def test_bool_mask_equals_its_bias(rng):
    q, k, v = qkv(rng, batch=(2,), L=4, S=4)
    mask = causal_mask(4) & np.array([True, True, False, True])
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, mask=mask),
        scaled_dot_product_attention(q, k, v, bias=mask_to_bias(mask)),
        rtol=1e-13,  # a few ulps: the bias path subtracts the row maximum, the mask path need not
        atol=1e-16,
    )


def test_bias_is_added_to_scaled_scores(rng, reference_attention):
    q, k, v = qkv(rng, L=3, S=4)
    bias = rng.normal(size=(3, 4))
    out = scaled_dot_product_attention(q, k, v, bias=bias, scale=0.7)
    np.testing.assert_allclose(out, reference_attention(q, k, v, bias=bias, scale=0.7)[0], rtol=1e-12)
    # a constant per row in the bias changes nothing
    shifted = scaled_dot_product_attention(q, k, v, bias=bias + np.array([[3.0], [-50.0], [7.0]]), scale=0.7)
    np.testing.assert_allclose(shifted, out, rtol=1e-12, atol=1e-14)


def test_mask_and_bias_together(rng, reference_attention):
    q, k, v = qkv(rng, L=3, S=4)
    bias = rng.normal(size=(1, 4))
    mask = np.array([[True], [False], [True]]) | np.eye(3, 4, dtype=bool)
    out = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    np.testing.assert_allclose(out, reference_attention(q, k, v, allowed=mask, bias=bias)[0], rtol=1e-12)


def test_is_causal_combines_with_mask_by_and(rng):
    q, k, v = qkv(rng, L=4, S=4)
    mask = np.array([True, False, True, True])
    both = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True)
    explicit = scaled_dot_product_attention(q, k, v, mask=mask & causal_mask(4))
    np.testing.assert_array_equal(both, explicit)


# --- causal alignment -------------------------------------------------------


@pytest.mark.parametrize("L, S", [(2, 5), (5, 2), (4, 4)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_is_causal_pattern(rng, L, S, alignment):
    q, k, v = qkv(rng, L=L, S=S)
    _, w = scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment=alignment, return_weights=True)
    offset = 0 if alignment == "top-left" else S - L
    i, j = np.indices((L, S))
    np.testing.assert_array_equal(w > 0, j <= i + offset)


def test_is_causal_default_is_top_left(rng):
    q, k, v = qkv(rng, L=2, S=5)
    np.testing.assert_array_equal(
        scaled_dot_product_attention(q, k, v, is_causal=True),
        scaled_dot_product_attention(q, k, v, mask=causal_mask(2, 5, alignment="top-left")),
    )
    np.testing.assert_array_equal(
        scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right"),
        scaled_dot_product_attention(q, k, v, mask=causal_mask(2, 5, alignment="bottom-right")),
    )


def test_bottom_right_last_query_sees_every_key(rng):
    q, k, v = qkv(rng, L=1, S=6)
    full = scaled_dot_product_attention(q, k, v)
    last = scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right")
    np.testing.assert_array_equal(last, full)
    # top-left: the single query sees only key 0
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, is_causal=True), v[:1], rtol=1e-15)


# --- fully masked rows ------------------------------------------------------


def test_fully_masked_rows_give_zeros_without_warning(rng):
    # filterwarnings = error: any RuntimeWarning here fails the test.
    q, k, v = qkv(rng, batch=(2,), L=3, S=4)
    mask = np.ones((2, 3, 4), dtype=bool)
    mask[0, 1] = False
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_array_equal(w[0, 1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(w[1], 0.0)
    np.testing.assert_allclose(w[0, [0, 2]].sum(-1), 1.0, rtol=1e-15)
    assert not np.isnan(out).any()


@pytest.mark.parametrize("dtype", FLOATS)
def test_bottom_right_with_more_queries_than_keys_zeros_the_first_rows(rng, dtype):
    q, k, v = qkv(rng, L=5, S=2, dtype=dtype)
    out, w = scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom-right", return_weights=True)
    np.testing.assert_array_equal(out[:3], 0.0)
    np.testing.assert_array_equal(w[:3], 0.0)
    np.testing.assert_allclose(w[3:].astype(np.float64).sum(-1), 1.0, rtol=rounding(dtype))


def test_zero_length_padding_gives_zeros(rng):
    q, k, v = qkv(rng, batch=(2,), L=3, S=4)
    out = scaled_dot_product_attention(q, k, v, mask=padding_mask([0, 2], 4))
    np.testing.assert_array_equal(out[0], 0.0)
    assert np.all(np.isfinite(out[1]))


def test_minus_inf_bias_row_gives_zeros(rng):
    q, k, v = qkv(rng, L=2, S=3)
    bias = np.array([[0.0, 0.0, 0.0], [-np.inf, -np.inf, -np.inf]])
    out = scaled_dot_product_attention(q, k, v, bias=bias)
    np.testing.assert_array_equal(out[1], 0.0)


# --- scale ------------------------------------------------------------------


def test_default_scale_uses_E_not_Ev(rng):
    q, k, v = qkv(rng, L=3, S=4, E=4, Ev=9)
    out = scaled_dot_product_attention(q, k, v)
    assert out.shape == (3, 9)
    np.testing.assert_array_equal(out, scaled_dot_product_attention(q, k, v, scale=0.5))  # 1 / sqrt(4)
    assert not np.allclose(out, scaled_dot_product_attention(q, k, v, scale=1 / 3))  # 1 / sqrt(9)


def test_explicit_scale_multiplies_scores(rng, reference_attention):
    q, k, v = qkv(rng)
    for scale in (2.0, 1e-3, -1.5, np.float32(0.25), np.int64(2)):
        np.testing.assert_allclose(
            scaled_dot_product_attention(q, k, v, scale=scale),
            reference_attention(q, k, v, scale=float(scale))[0],
            rtol=1e-12,
        )


def test_scale_zero_is_uniform_over_allowed_keys(rng):
    q, k, v = qkv(rng, L=3, S=4)
    mask = np.array([[True, True, True, True], [True, False, True, False], [False, False, False, True]])
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, scale=0.0, return_weights=True)
    np.testing.assert_allclose(w, mask / mask.sum(-1, keepdims=True), rtol=1e-15)
    np.testing.assert_allclose(out[0], v.mean(0), rtol=1e-14)
    np.testing.assert_allclose(out[1], (v[0] + v[2]) / 2, rtol=1e-14)
    np.testing.assert_allclose(out[2], v[3], rtol=1e-15)


def test_zero_feature_size_with_explicit_scale(rng):
    q, k, v = np.zeros((3, 0)), np.zeros((4, 0)), rng.normal(size=(4, 2))
    out = scaled_dot_product_attention(q, k, v, scale=1.0)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(0), (3, 2)), rtol=1e-14)


# --- grouped-query attention ------------------------------------------------


def test_gqa_maps_query_head_h_to_kv_head_h_div_group(rng):
    Hq, Hkv = 6, 2
    q = rng.normal(size=(2, Hq, 3, 4))
    k = rng.normal(size=(2, Hkv, 5, 4))
    v = rng.normal(size=(2, Hkv, 5, 3))
    out = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out.shape == (2, Hq, 3, 3)
    for h in range(Hq):
        g = h // (Hq // Hkv)  # 0, 0, 0, 1, 1, 1 (not h % Hkv = 0, 1, 0, 1, 0, 1)
        np.testing.assert_array_equal(out[:, h], scaled_dot_product_attention(q[:, h], k[:, g], v[:, g]))


def test_gqa_equals_explicitly_repeated_heads(rng):
    q = rng.normal(size=(4, 3, 5))
    k = rng.normal(size=(2, 6, 5))
    v = rng.normal(size=(2, 6, 2))
    mask = causal_mask(3, 6, alignment="bottom-right")
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, enable_gqa=True, mask=mask),
        scaled_dot_product_attention(q, np.repeat(k, 2, axis=0), np.repeat(v, 2, axis=0), mask=mask),
        rtol=1e-15,
    )


def test_gqa_with_equal_heads_is_plain_attention(rng):
    q, k, v = qkv(rng, batch=(3,))
    np.testing.assert_array_equal(
        scaled_dot_product_attention(q, k, v, enable_gqa=True), scaled_dot_product_attention(q, k, v)
    )


def test_head_mismatch_without_gqa_is_an_error(rng):
    q = rng.normal(size=(4, 3, 5))
    k = rng.normal(size=(2, 6, 5))
    with pytest.raises(ValueError, match=r"enable_gqa=True"):
        scaled_dot_product_attention(q, k, k)


def test_gqa_heads_must_divide(rng):
    q = rng.normal(size=(3, 3, 5))
    k = rng.normal(size=(2, 6, 5))
    with pytest.raises(ValueError, match=r"multiple of the number of key/value heads.*3 heads.*2 heads"):
        scaled_dot_product_attention(q, k, k, enable_gqa=True)


def test_gqa_needs_a_head_axis(rng):
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match=r"^q must have at least 3 dimensions"):
        scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_gqa_k_and_v_heads_must_agree(rng):
    q = rng.normal(size=(4, 3, 5))
    with pytest.raises(ValueError, match=r"k and v must have the same number of heads"):
        scaled_dot_product_attention(q, rng.normal(size=(2, 6, 5)), rng.normal(size=(1, 6, 5)), enable_gqa=True)


# --- dtypes -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_dtype_in_is_dtype_out(rng, dtype):
    q, k, v = qkv(rng, dtype=dtype)
    out, w = scaled_dot_product_attention(q, k, v, mask=causal_mask(3, 4), return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    ref = scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)), mask=causal_mask(3, 4))
    tol = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-15}[dtype]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


def test_integers_give_float64():
    q = np.array([[1, 0], [0, 1]])
    out = scaled_dot_product_attention(q, q, np.array([[1, 2], [3, 4]], dtype=np.int32))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, scaled_dot_product_attention(q.astype(float), q.astype(float), [[1.0, 2], [3, 4]]))


def test_mixed_float_dtypes_promote():
    q = np.ones((2, 2), dtype=np.float16)
    assert scaled_dot_product_attention(q, q.astype(np.float32), q).dtype == np.float32
    assert scaled_dot_product_attention(q, q, q.astype(np.float64)).dtype == np.float64


def test_float16_accumulates_in_float32():
    # 4096 keys with equal scores and values 1: every weight is 2**-12 and the
    # output exactly 1. A float16 running sum stalls (0.5 + 2**-12 rounds to 0.5).
    S = 4096
    q = np.zeros((1, 2), dtype=np.float16)
    k = np.zeros((S, 2), dtype=np.float16)
    v = np.ones((S, 1), dtype=np.float16)
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, [[1.0]])
    np.testing.assert_array_equal(w, np.full((1, S), 2.0**-12, dtype=np.float16))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_extreme_logits_stay_finite(dtype, sign):
    # scores = q k^T with scale 1 reach +-1e4
    q = np.array([[100.0], [-100.0], [1.0]], dtype=dtype) * sign
    k = np.array([[100.0], [-100.0], [0.0], [99.0]], dtype=dtype)
    v = np.arange(8.0, dtype=dtype).reshape(4, 2)
    out, w = scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    np.testing.assert_allclose(w.astype(np.float64).sum(-1), 1.0, rtol=rounding(dtype))
    winner = 0 if sign > 0 else 1  # every other weight of row 0 is below exp(-100)
    np.testing.assert_allclose(out[0].astype(np.float64), v[winner].astype(np.float64), rtol=rounding(dtype),
                               atol=rounding(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1.0, 30.0, 300.0])
def test_large_scores_match_the_reference(rng, reference_attention, dtype, size):
    # The kernel skips the row-maximum shift when the Cauchy-Schwarz bound |q_i| max|k_j| is small (size 1)
    # and must take it when exp would overflow (size 30 in float32, 300 in float64).
    q, k, v = qkv(rng, batch=(2,), L=5, S=7, E=4)
    q, k = q * size, k * size
    expected, _ = reference_attention(q, k, v, allowed=np.array([True] * 6 + [False]))
    out = scaled_dot_product_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), mask=padding_mask(6, 7))
    assert out.dtype == dtype and np.all(np.isfinite(out))
    tol = 1e-12 if dtype == np.float64 else 1e-5 * size**2  # float32 rounding of q and k moves the scores
    np.testing.assert_allclose(out, expected, rtol=0, atol=min(tol, 1e-2 if size == 300 else tol))


LARGE_BIASES = ["constant +1e3", "constant -1e3", "per-row +-1e3", "finfo.min padding", "per-row and padding"]


def large_bias(kind, L, S, dtype):
    """A (2, L, S) bias of about +-1e3 or with keys padded by ``np.finfo(dtype).min``, in `dtype`.

    Per row: in the first batch every row about -1e3, in the second alternately about -1e3 and +1e3.
    """
    rows = np.stack([np.full(L, -1e3), np.where(np.arange(L) % 2 == 0, -1e3, 1e3)]) + np.linspace(0.0, 2.0, L)
    padding = np.zeros((2, L, S))
    padding[..., S - 2 :] = np.finfo(dtype).min  # the last two keys of every row
    padding[:, L - 1] = np.finfo(dtype).min  # and every key of the last row: a finite bias, so uniform weights
    bias = {
        "constant +1e3": np.full((2, L, S), 1e3),
        "constant -1e3": np.full((2, L, S), -1e3),
        "per-row +-1e3": np.broadcast_to(rows[..., None], (2, L, S)),
        "finfo.min padding": padding,
        "per-row and padding": np.maximum(rows[..., None] + padding, np.finfo(dtype).min),
    }[kind]
    return bias.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", LARGE_BIASES)
@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_large_biases_match_the_reference(rng, reference_attention, dtype, kind, attend):
    # exp(s + b) underflows to 0 for b = -1e3 and overflows for b = +1e3: the row maximum must be subtracted.
    # The scores themselves are small, so the dense kernel's Cauchy-Schwarz bound would let it skip that shift,
    # which is only right without a bias.
    L, S = 5, 6
    q, k, v = (a.astype(dtype) for a in qkv(rng, batch=(2,), L=L, S=S, E=4))
    bias = large_bias(kind, L, S, dtype)
    kwargs = {"block_size": 2} if attend is blockwise_attention else {}
    out = attend(q, k, v, bias=bias, **kwargs)
    expected, _ = reference_attention(q, k, v, bias=bias)
    assert out.dtype == dtype
    # Adding 1e3 rounds the scores to 1e3 * eps: a relative error of that size in the weights.
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e4 * np.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [1.0, 30.0])
@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_values_near_the_largest_float_do_not_overflow(rng, dtype, size, attend):
    # Both kernels normalise after the product, so their sums reach about S * max|v| (times exp(s) when small
    # scores of size 1 let the dense kernel skip the max shift): over the largest float here. They must
    # notice and recompute safely. Attention is linear in v, so the scaled output is known.
    q, k, v = qkv(rng, batch=(3,), L=6, S=50, E=8, dtype=dtype)
    q, v = q * dtype(size), np.abs(v) + 1
    huge = dtype(np.finfo(dtype).max / 10)
    out = attend(q, k, v * huge)
    assert np.all(np.isfinite(out))
    tol = 1e4 * np.finfo(dtype).eps  # 2e-12 in float64, 1e-3 in float32 (rounding of different sums)
    np.testing.assert_allclose(out / huge, scaled_dot_product_attention(q, k, v), rtol=tol, atol=tol)


# --- broadcasting -----------------------------------------------------------


def test_leading_axes_broadcast(rng):
    q = rng.normal(size=(2, 1, 3, 4))
    k = rng.normal(size=(1, 5, 6, 4))
    v = rng.normal(size=(5, 6, 2))
    out = scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 5, 3, 2)
    for b in range(2):
        for h in range(5):
            np.testing.assert_allclose(out[b, h], scaled_dot_product_attention(q[b, 0], k[0, h], v[h]), rtol=1e-14)


def test_v_with_more_batch_axes_than_q_and_k(rng):
    q, k, _ = qkv(rng, L=2, S=4)
    v = rng.normal(size=(3, 4, 5))
    out = scaled_dot_product_attention(q, k, v)
    assert out.shape == (3, 2, 5)
    for b in range(3):
        np.testing.assert_allclose(out[b], scaled_dot_product_attention(q, k, v[b]), rtol=1e-14)


def test_padding_mask_broadcasts_over_queries(rng, reference_attention):
    q, k, v = qkv(rng, batch=(2,), L=3, S=5)
    mask = padding_mask([5, 2], 5)  # (B, 1, S)
    out = scaled_dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(out[1], scaled_dot_product_attention(q[1], k[1, :2], v[1, :2]), rtol=1e-14)
    np.testing.assert_allclose(out, reference_attention(q, k, v, allowed=mask)[0], rtol=1e-12)


def test_per_head_masks(rng):
    q, k, v = qkv(rng, batch=(2, 3), L=4, S=4)
    masks = np.stack([causal_mask(4), np.ones((4, 4), bool), np.eye(4, dtype=bool)])  # (H, L, S)
    out = scaled_dot_product_attention(q, k, v, mask=masks)
    for h in range(3):
        np.testing.assert_array_equal(out[:, h], scaled_dot_product_attention(q[:, h], k[:, h], v[:, h], mask=masks[h]))
    np.testing.assert_allclose(out[:, 2], v[:, 2], rtol=1e-15)  # the identity mask picks v row i


def test_one_dimensional_mask_is_a_key_mask(rng):
    q, k, v = qkv(rng, L=3, S=4)
    key_mask = np.array([True, False, True, False])
    np.testing.assert_array_equal(
        scaled_dot_product_attention(q, k, v, mask=key_mask),
        scaled_dot_product_attention(q, k, v, mask=np.broadcast_to(key_mask, (3, 4))),
    )


def test_mask_with_more_leading_axes_than_q(rng):
    q, k, v = qkv(rng, L=3, S=4)
    masks = np.stack([causal_mask(3, 4), ~np.zeros((3, 4), bool)])  # (2, L, S)
    out, w = scaled_dot_product_attention(q, k, v, mask=masks, return_weights=True)
    assert out.shape == (2, 3, 5) and w.shape == (2, 3, 4)
    np.testing.assert_array_equal(out[1], scaled_dot_product_attention(q, k, v))


# --- empty axes -------------------------------------------------------------


def test_no_keys_gives_zeros(rng):
    q = rng.normal(size=(3, 4))
    out, w = scaled_dot_product_attention(q, np.zeros((0, 4)), np.zeros((0, 2)), return_weights=True)
    np.testing.assert_array_equal(out, np.zeros((3, 2)))
    assert w.shape == (3, 0)


def test_no_queries_gives_empty_output(rng):
    _, k, v = qkv(rng)
    out = scaled_dot_product_attention(np.zeros((2, 0, 5)), k, v, is_causal=True)
    assert out.shape == (2, 0, 5)


# --- NaN --------------------------------------------------------------------


def test_nan_in_a_query_row_stays_in_that_row(rng):
    q, k, v = qkv(rng, L=3, S=4)
    q[1, 2] = np.nan
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert np.all(np.isnan(out[1])) and np.all(np.isnan(w[1]))
    assert np.all(np.isfinite(out[[0, 2]])) and np.all(np.isfinite(w[[0, 2]]))


def test_nan_in_the_bias_stays_in_its_row(rng):
    q, k, v = qkv(rng, L=3, S=4)
    bias = np.zeros((3, 4))
    bias[2, 0] = np.nan
    out, w = scaled_dot_product_attention(q, k, v, bias=bias, return_weights=True)
    assert np.all(np.isnan(w[2])) and np.all(np.isnan(out[2]))
    assert np.all(np.isfinite(out[:2]))


# --- dropout ----------------------------------------------------------------


def test_dropout_needs_a_generator(rng):
    q, k, v = qkv(rng)
    with pytest.raises(TypeError, match=r"rng must be a numpy.random.Generator"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(TypeError, match=r"rng must be a numpy.random.Generator.*int"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.1, rng=0)
    with pytest.raises(TypeError, match=r"rng must be a numpy.random.Generator.*RandomState"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.1, rng=np.random.RandomState(0))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_p_outside_unit_interval(rng, p):
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match=r"dropout_p must be"):
        scaled_dot_product_attention(q, k, v, dropout_p=p, rng=rng)


def test_dropout_zero_ignores_rng(rng):
    q, k, v = qkv(rng)
    plain_out, plain_w = scaled_dot_product_attention(q, k, v, return_weights=True)
    generator = np.random.default_rng(7)
    state = generator.bit_generator.state
    for return_weights in (False, True):
        result = scaled_dot_product_attention(q, k, v, dropout_p=0.0, rng=generator, return_weights=return_weights)
        out, w = result if return_weights else (result, plain_w)
        np.testing.assert_array_equal(out, plain_out)
        np.testing.assert_array_equal(w, plain_w)
        assert generator.bit_generator.state == state  # no number drawn


def test_dropout_is_inverted_and_unbiased(rng):
    q, k, v = qkv(rng, L=3, S=4)
    p = 0.25
    _, clean = scaled_dot_product_attention(q, k, v, return_weights=True)
    n = 4000
    qb = np.broadcast_to(q, (n, 3, 5))
    out, w = scaled_dot_product_attention(qb, k, v, dropout_p=p, rng=np.random.default_rng(7), return_weights=True)
    # every weight is either dropped or scaled by 1 / (1 - p)
    kept = w != 0
    np.testing.assert_allclose(w[kept], np.broadcast_to(clean / (1 - p), w.shape)[kept], rtol=1e-14)
    assert 0.2 < 1 - kept.mean() < 0.3
    # the output uses the dropped weights
    np.testing.assert_allclose(out, w @ v, rtol=1e-12, atol=1e-14)
    # E[w] = clean: standard error per entry is at most sqrt(p / (1 - p) / n) ~ 0.009
    np.testing.assert_allclose(w.mean(0), clean, atol=0.04)
    np.testing.assert_allclose(out.mean(0), clean @ v, atol=0.1)


def test_dropout_is_deterministic_given_the_seed(rng):
    q, k, v = qkv(rng, batch=(2,))
    a = scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(3))
    b = scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(3))
    c = scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(4))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_thread_count_does_not_change_the_result(monkeypatch, rng, reference_attention, threads):
    # Large enough to take the threaded path of the dense and blockwise kernels.
    q, k, v = (rng.standard_normal((2, 800, 16)) for _ in range(3))
    expected, _ = reference_attention(q, k, v, allowed=causal_mask(800))
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", threads)
    dense = scaled_dot_product_attention(q, k, v, is_causal=True)
    blocks = blockwise_attention(q, k, v, is_causal=True, block_size=128)
    np.testing.assert_allclose(dense, expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(blocks, expected, rtol=0, atol=1e-13)


def _one_task_case(rng, name, dtype):
    """``(q, k, v, options, one task expected)`` of a small call for `test_one_task_path_equals_the_task_path`."""
    batch, L, S = {"no batch": ((), 6, 9), "bound": ((4,), 64, 64), "softcap over outer axes": ((2, 2), 64, 64),
                   "bound over outer axes": ((2, 2), 64, 64)}.get(name, ((2, 3), 5, 7))
    q, k, v = qkv(rng, batch, L, S, E=8, Ev=4, dtype=dtype)
    heads = batch[-1] if batch else 1
    options = {
        "plain": {},
        "no batch": {"scale": 0.7},
        "causal": {"is_causal": True, "causal_alignment": "bottom-right"},
        "mask with a fully masked row": {"mask": np.vstack([np.zeros((1, S), bool), rng.random((L - 1, S)) < 0.6])},
        "bias and alibi": {"bias": rng.standard_normal((L, S)), "alibi_slopes": rng.random(heads)},
        "window and sinks": {"window": (1, 2), "sinks": rng.standard_normal(heads)},
        "softcap over outer axes": {"softcap": 5.0},
        "softcap and an overflowing entry": {"softcap": 5.0},
        "Fortran-ordered queries and sinks": {"sinks": 3 * rng.standard_normal(heads)},
    }.get(name, {})
    if name == "Fortran-ordered queries and sinks":
        q = np.asfortranarray(q[:, :1])  # one query head for all: the same layout in one block and per head
    if name == "bound over outer axes":
        q[1] *= 30  # outer index 1 must subtract its row maxima, index 0 need not: separate tasks
    if name == "overflowing sums" and dtype != np.float16:  # float16 input is worked in float32: no overflow
        v *= np.finfo(dtype).max / 4  # some sums of e_j v_j overflow: the block is redone with scaled values
    if name == "softcap and an overflowing entry" and dtype != np.float16:
        v[0] *= np.finfo(dtype).max / 4  # outer index 0 is redone (shifted, scaled values); index 1 must not be
    if name == "non-finite input":
        q[0, 1, 2, 3] = np.inf
    # Unshifted blocks over several outer indices run as separate tasks: a redo must touch only its own entries.
    separate = ("bound over outer axes", "softcap over outer axes", "softcap and an overflowing entry")
    return q, k, v, options, name not in separate


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "name",
    ["plain", "no batch", "causal", "mask with a fully masked row", "bias and alibi", "window and sinks", "bound",
     "softcap over outer axes", "softcap and an overflowing entry", "bound over outer axes", "overflowing sums",
     "non-finite input", "Fortran-ordered queries and sinks"],
)
def test_one_task_path_equals_the_task_path_bitwise(monkeypatch, rng, dtype, name):
    # A small call runs as one block of every head (private _kernel._one_task decides); forcing the task
    # loop instead must give the same bits, since both run the same block step on the same slices.
    from attention_ref import _kernel

    q, k, v, options, one_task = _one_task_case(rng, name, dtype)
    decisions = []
    decide = _kernel._one_task
    monkeypatch.setattr(_kernel, "_one_task", lambda *args: decisions.append(decide(*args)) or decisions[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning on either path, non-finite input included
        fast = scaled_dot_product_attention(q, k, v, **options)
        monkeypatch.setattr(_kernel, "_one_task", lambda *args: False)
        tasks = scaled_dot_product_attention(q, k, v, **options)
    assert fast.dtype == tasks.dtype == q.dtype and fast.shape == tasks.shape
    np.testing.assert_array_equal(fast.view(np.uint8), tasks.view(np.uint8))
    assert decisions == [one_task]


def test_dense_causal_output_does_not_build_the_full_mask(rng):
    # Without weights the dense kernel works block by block; the causal mask of each query block is built
    # when needed and dropped after its last head, so memory stays far below the (L, S) mask's 128 MiB.
    import tracemalloc

    q, k, v = (rng.standard_normal((2, 4096, 16)) for _ in range(3))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = scaled_dot_product_attention(q, k, v, is_causal=True)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert np.all(np.isfinite(out))
    assert peak < 48 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_an_error_in_one_block_is_raised_and_stops_the_others(monkeypatch):
    # The kernels' thread pool (private helper): the first exception reaches the caller, the other threads take
    # no new block after it, and none is still running when the call returns.
    import time

    from attention_ref._kernel import run_blocks

    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "2")
    started = []

    def block(task):
        started.append(task)
        if task == 2:
            raise RuntimeError("block 2 failed")
        time.sleep(0.005)

    with pytest.raises(RuntimeError, match="block 2 failed"):
        run_blocks(block, range(100), work=1 << 30)
    count = len(started)
    time.sleep(0.05)
    assert len(started) == count < 10


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_thread_count_is_a_named_error(monkeypatch, rng, value):
    q = rng.standard_normal((2, 80, 16))
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", value)
    with pytest.raises(ValueError, match="ATTENTION_REF_NUM_THREADS"):
        scaled_dot_product_attention(q, q, q)


# --- softcap, window, ALiBi and sinks ----------------------------------------
# Checked against tests/plain_options.py: the options written out in plain NumPy (explicit masks and biases, the
# cap applied to explicit scores, the sink as one more key with a zero value) and fed to the independent formula.

ALIGNMENTS = ["top-left", "bottom-right"]


def options_reference(reference_attention, q, k, v, **kwargs):
    from plain_options import reference_with_options

    return reference_with_options(reference_attention, q, k, v, **kwargs)


@pytest.mark.parametrize("softcap", [0.5, 2.0, 30.0])
def test_softcap_matches_the_reference(rng, reference_attention, softcap):
    q, k, v = qkv(rng, batch=(2,), L=4, S=6)
    q = 3.0 * q  # scores of several units, so that the cap bites
    bias = rng.normal(size=(4, 6))
    mask = rng.random((4, 6)) < 0.7
    out, w = scaled_dot_product_attention(q, k, v, softcap=softcap, bias=bias, mask=mask, return_weights=True)
    ref_out, ref_w, _ = options_reference(reference_attention, q, k, v, softcap=softcap, bias=bias, mask=mask)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-13)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-14)


def test_softcap_is_applied_before_the_bias_by_hand():
    # scores (scale 1) 9 and 0; capped at 1: tanh(9) and 0; the bias +2 on key 1 is added after the cap.
    q, k, v = np.array([[3.0]]), np.array([[3.0], [0.0]]), np.array([[1.0], [0.0]])
    _, w = scaled_dot_product_attention(q, k, v, scale=1.0, softcap=1.0, bias=np.array([0.0, 2.0]), return_weights=True)
    a = math.tanh(9.0)
    expected = math.exp(a) / (math.exp(a) + math.exp(2.0))
    np.testing.assert_allclose(w[0], [expected, 1 - expected], rtol=1e-15)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softcap_bounds_huge_scores(dtype):
    # Scores of about +-1e8 become +-c: weights stay within exp(2c) of each other, finite, without a warning.
    big = 200.0 if dtype == np.float16 else 1e4
    q = np.full((2, 4), big, dtype)
    k = np.array([[big] * 4, [-big] * 4, [0.0] * 4], dtype)
    v = np.eye(3, dtype=dtype)
    out, w = scaled_dot_product_attention(q, k, v, softcap=2.0, return_weights=True)
    assert out.dtype == dtype and np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    expected = np.exp([2.0, -2.0, 0.0]) / np.exp([2.0, -2.0, 0.0]).sum()
    np.testing.assert_allclose(w[0].astype(np.float64), expected, rtol=rounding(dtype))
    np.testing.assert_allclose(blockwise_attention(q, k, v, softcap=2.0, block_size=1).astype(np.float64),
                               out.astype(np.float64), rtol=rounding(dtype))


@pytest.mark.parametrize(("L", "S"), [(5, 5), (3, 8), (8, 3)])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("window", [(0, 0), (1, 0), (2, 1), (None, 1), (1, None), (0, None), (None, None), (9, 9)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_window_equals_its_explicit_mask(rng, L, S, alignment, window, is_causal):
    from plain_options import window_allowed

    q, k, v = qkv(rng, batch=(2,), L=L, S=S)
    kwargs = {"causal_alignment": alignment, "is_causal": is_causal}
    out, w = scaled_dot_product_attention(q, k, v, window=window, return_weights=True, **kwargs)
    allowed = window_allowed(L, S, window, alignment, is_causal)
    expected_out, expected_w = scaled_dot_product_attention(q, k, v, mask=allowed, return_weights=True)
    np.testing.assert_allclose(out, expected_out, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(w, expected_w)
    np.testing.assert_array_equal(w[:, ~allowed], 0.0)
    # The same mask through sliding_window_mask (without causality it is the pair form).
    if not is_causal:
        from attention_ref import sliding_window_mask

        np.testing.assert_array_equal(sliding_window_mask(L, S, window=window, alignment=alignment), allowed)


def test_is_causal_caps_the_right_side_of_the_window(rng):
    q, k, v = qkv(rng, L=6, S=6)
    expected = scaled_dot_product_attention(q, k, v, window=(2, 0))
    for window in [(2, 0), (2, 3), (2, None)]:
        np.testing.assert_array_equal(scaled_dot_product_attention(q, k, v, window=window, is_causal=True), expected)
    np.testing.assert_array_equal(
        scaled_dot_product_attention(q, k, v, window=(None, 4), is_causal=True),
        scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def test_window_alignment_follows_causal_alignment_without_is_causal(rng):
    # L = 2, S = 5: bottom-right puts query 0 at key position 3, so window (0, 0) picks keys 3 and 4.
    q, k, v = qkv(rng, L=2, S=5)
    out = scaled_dot_product_attention(q, k, v, window=(0, 0), causal_alignment="bottom-right")
    np.testing.assert_allclose(out, v[3:], rtol=1e-15)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, window=(0, 0)), v[:2], rtol=1e-15)


@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
@pytest.mark.parametrize("sinks", [None, 0.5])
def test_rows_the_window_empties_give_zeros_without_warning(rng, attend, sinks):
    # Top-left, L > S: queries 3.. sit beyond the last key, and window (0, 0) leaves them nothing.
    q, k, v = qkv(rng, batch=(2,), L=6, S=3)
    kwargs = {"block_size": 2} if attend is blockwise_attention else {"return_weights": True}
    result = attend(q, k, v, window=(0, 0), sinks=sinks, **kwargs)
    out = result[0] if isinstance(result, tuple) else result
    np.testing.assert_array_equal(out[:, 3:], 0.0)
    # Query i < 3 sees key i alone: out = v_i e^x / (e^s + e^x), x its scaled score, s the sink.
    own_score = np.einsum("ble,ble->bl", q[:, :3], k) / math.sqrt(5)
    expected = v if sinks is None else v / (1 + np.exp(sinks - own_score))[..., None]
    np.testing.assert_allclose(out[:, :3], expected, rtol=1e-14)
    if attend is scaled_dot_product_attention:
        np.testing.assert_array_equal(result[1][:, 3:], 0.0)


@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("L", "S"), [(4, 4), (3, 7), (7, 3)])
def test_alibi_slopes_equal_alibi_bias(rng, reference_attention, alignment, is_causal, L, S):
    """The option, and the bias `alibi_bias` builds, both equal ALiBi written out in plain NumPy."""
    from plain_options import alibi_plain, reference_with_options

    from attention_ref import alibi_bias, alibi_slopes

    q, k, v = qkv(rng, batch=(2, 4), L=L, S=S)
    slopes = 2.0 ** (-8.0 / 4 * np.arange(1, 5))  # the paper's 2^(-8h/n) for n = 4 heads
    np.testing.assert_array_equal(alibi_slopes(4), slopes)
    np.testing.assert_allclose(alibi_bias(4, L, S, alignment=alignment), alibi_plain(slopes, L, S, alignment),
                               rtol=0, atol=0)
    kwargs = {"causal_alignment": alignment, "is_causal": is_causal}
    expected_out, expected_w, _ = reference_with_options(reference_attention, q, k, v, alibi_slopes=slopes, **kwargs)
    for options in ({"alibi_slopes": alibi_slopes(4)}, {"bias": alibi_bias(4, L, S, alignment=alignment)}):
        out, w = scaled_dot_product_attention(q, k, v, return_weights=True, **options, **kwargs)
        np.testing.assert_allclose(out, expected_out, rtol=0, atol=1e-14)
        np.testing.assert_allclose(w, expected_w, rtol=0, atol=1e-15)


@pytest.mark.parametrize("slopes_shape", [(), (3,), (2, 3), (2, 1)])
@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_alibi_slopes_broadcast_over_batch_and_heads(rng, reference_attention, slopes_shape, attend):
    q, k, v = qkv(rng, batch=(2, 3), L=5, S=6)
    slopes = rng.uniform(-0.5, 1.0, slopes_shape)  # negative slopes are legal: they favour far keys
    kwargs = {"block_size": (2, 3)} if attend is blockwise_attention else {}
    out = attend(q, k, v, alibi_slopes=slopes, causal_alignment="bottom-right", **kwargs)
    expected, _, _ = options_reference(
        reference_attention, q, k, v, alibi_slopes=slopes, causal_alignment="bottom-right"
    )
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)


def test_alibi_slopes_pick_the_query_heads_under_gqa(rng, reference_attention):
    q = rng.normal(size=(2, 4, 3, 5))
    k, v = rng.normal(size=(2, 2, 6, 5)), rng.normal(size=(2, 2, 6, 2))
    slopes = np.array([0.1, 0.2, 0.4, 0.8])
    out = scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, enable_gqa=True, is_causal=True)
    expected, _, _ = options_reference(
        reference_attention, q, k, v, alibi_slopes=slopes, enable_gqa=True, is_causal=True
    )
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-14)


@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_alibi_does_not_build_the_full_bias(rng, attend):
    # 4 heads of 2048 x 2048: the explicit bias would take 128 MiB; the ALiBi term is built per block instead.
    import tracemalloc

    q, k, v = (rng.standard_normal((4, 2048, 8)) for _ in range(3))
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = attend(q, k, v, alibi_slopes=slopes, is_causal=True)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert np.all(np.isfinite(out))
    assert peak < 40 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    np.testing.assert_allclose(out[:, :3], scaled_dot_product_attention(
        q[:, :3], k[:, :3], v[:, :3], alibi_slopes=slopes, is_causal=True), rtol=0, atol=1e-13)


@pytest.mark.parametrize("sinks_shape", [(), (3,), (2, 3), (2, 1)])
def test_sinks_are_one_more_key_with_a_zero_value(rng, reference_attention, sinks_shape):
    q, k, v = qkv(rng, batch=(2, 3), L=4, S=5)
    sinks = rng.normal(size=sinks_shape)
    out, w = scaled_dot_product_attention(q, k, v, sinks=sinks, return_weights=True)
    expected_out, expected_w, _ = options_reference(reference_attention, q, k, v, sinks=sinks)
    np.testing.assert_allclose(out, expected_out, rtol=0, atol=1e-14)
    np.testing.assert_allclose(w, expected_w, rtol=0, atol=1e-15)
    # The sink takes the share exp(s) / (exp(s) + sum_j exp(x_j)): the weights sum to less than one.
    scores = np.einsum("...le,...se->...ls", q, k) / math.sqrt(5)
    share = np.exp(sinks)[..., None] / (np.exp(sinks)[..., None] + np.exp(scores).sum(-1))
    np.testing.assert_allclose(w.sum(-1), 1 - share, rtol=1e-14)


@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_sinks_with_fully_masked_rows_give_zeros_without_warning(rng, attend):
    q, k, v = qkv(rng, batch=(2,), L=3, S=4)
    mask = np.ones((2, 3, 4), dtype=bool)
    mask[0, 1] = False
    mask[1] = False
    kwargs = {"block_size": 2, "return_lse": True} if attend is blockwise_attention else {"return_weights": True}
    out, second = attend(q, k, v, mask=mask, sinks=np.array([0.5, -2.0])[:, None][:, 0], **kwargs)
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    if attend is blockwise_attention:  # the log-sum-exp of such a row is the sink's alone
        np.testing.assert_array_equal(second[0, 1], 0.5)
        np.testing.assert_array_equal(second[1], -2.0)
    else:
        np.testing.assert_array_equal(second[0, 1], 0.0)
        np.testing.assert_array_equal(second[1], 0.0)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sink", [-1e3, -30.0, 30.0, 1e3])
@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_extreme_sinks(rng, reference_attention, dtype, sink, attend):
    # A sink of -1e3 is no sink at all; +1e3 takes (nearly) all the weight: outputs near 0, finite, quiet.
    q, k, v = (a.astype(dtype) for a in qkv(rng, batch=(2,), L=3, S=5))
    out = attend(q, k, v, sinks=np.array(sink, dtype=dtype))
    expected, _, _ = options_reference(reference_attention, q, k, v, sinks=sink)
    assert out.dtype == dtype and np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, rtol=0, atol=10 * np.finfo(dtype).eps)


def test_sinks_with_large_scores_take_the_shifted_path(reference_attention):
    # Small scores would let the dense kernel skip the max shift; a sink of 500 must not overflow exp.
    q = np.array([[0.1, 0.2], [0.3, -0.1]])
    k = np.array([[0.2, 0.1], [-0.3, 0.4], [0.0, 0.1]])
    v = np.array([[1.0], [2.0], [3.0]])
    for sink in (500.0, 700.0, 1e4):
        out = scaled_dot_product_attention(q, k, v, sinks=sink)
        expected, _, _ = options_reference(reference_attention, q, k, v, sinks=sink)
        np.testing.assert_allclose(out, expected, rtol=1e-14, atol=0)  # about exp(-500) or 0, not NaN or a warning


@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_every_option_at_once_matches_the_reference(rng, reference_attention, alignment, gqa, attend):
    B, H, L, S = 2, 4, 7, 9
    q = 2 * rng.normal(size=(B, H, L, 6))
    k = 2 * rng.normal(size=(B, 2 if gqa else H, S, 6))
    v = rng.normal(size=(B, 2 if gqa else H, S, 3))
    options = {
        "mask": rng.random((B, 1, L, S)) < 0.8,
        "bias": rng.normal(size=(H, L, S)),
        "is_causal": True,
        "causal_alignment": alignment,
        "window": (3, 1),
        "scale": 0.4,
        "softcap": 1.5,
        "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]),
        "sinks": rng.normal(size=(B, H)),
        "enable_gqa": gqa,
    }
    expected, expected_w, expected_lse = options_reference(reference_attention, q, k, v, **options)
    if attend is blockwise_attention:
        out, lse = attend(q, k, v, block_size=(3, 2), return_lse=True, **options)
        np.testing.assert_allclose(lse, expected_lse, rtol=0, atol=1e-13)
    else:
        out, w = attend(q, k, v, return_weights=True, **options)
        np.testing.assert_allclose(w, expected_w, rtol=0, atol=1e-14)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)


def test_dropout_with_every_option_drops_the_option_weights(rng, reference_attention):
    q, k, v = qkv(rng, batch=(200, 2), L=4, S=6)
    options = {"window": (2, 1), "softcap": 1.0, "alibi_slopes": [0.3, 0.6], "sinks": [0.2, -0.4]}
    p = 0.25
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=p, rng=np.random.default_rng(5), return_weights=True,
                                          **options)
    _, clean, _ = options_reference(reference_attention, q, k, v, **options)
    kept = w != 0
    np.testing.assert_allclose(w[kept], np.broadcast_to(clean / (1 - p), w.shape)[kept], rtol=1e-14)
    np.testing.assert_allclose(out, w @ v, rtol=1e-12, atol=1e-14)
    assert 0.2 < 1 - kept[clean != 0].mean() < 0.3


@pytest.mark.parametrize(("dtype", "atol"), [(np.float16, 3e-3), (np.float32, 1e-6)])
@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blockwise_attention])
def test_options_keep_the_dtype(rng, reference_attention, dtype, atol, attend):
    q, k, v = (a.astype(dtype) for a in qkv(rng, batch=(2,), L=5, S=6))
    options = {"window": (2, 2), "softcap": 2.0, "alibi_slopes": [0.5, 0.25], "sinks": np.array([0.3, -1.0])}
    out = attend(q, k, v, **options)
    expected, _, _ = options_reference(reference_attention, q, k, v, **options)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, expected, rtol=0, atol=atol)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_thread_count_does_not_change_the_result_with_options(monkeypatch, rng, reference_attention, threads):
    q, k, v = (rng.standard_normal((2, 700, 16)) for _ in range(3))
    options = {"window": (90, 30), "softcap": 3.0, "alibi_slopes": [0.05, 0.1], "sinks": [1.0, -1.0]}
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", threads)
    expected, _, _ = options_reference(reference_attention, q, k, v, **options)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, **options), expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(blockwise_attention(q, k, v, block_size=128, **options), expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    ("name", "value"), [("scale", 1e39), ("softcap", 1e39), ("sinks", 1e39), ("alibi_slopes", [-1e39])]
)
def test_option_beyond_float32_range_is_a_value_error(name, value):
    # Finite as a Python float but infinite in float32: it gave an overflow warning or silent NaN.
    q = np.ones((1, 2, 3), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=rf"^{name} overflows the working dtype float32"):
            scaled_dot_product_attention(q, q, q, **{name: value})
        # float64 input works in float64, where the value fits.
        assert np.isfinite(scaled_dot_product_attention(q.astype(np.float64), q, q, **{name: value})).all()


def test_a_call_does_not_ask_the_os_for_the_core_count(monkeypatch, rng):
    # os.cpu_count() cost ~0.1 ms a call on the benchmark machine, four times per call: it is read once per process.
    import os

    from attention_ref import _kernel

    _kernel._cpu_count()  # read it now, as the first call of a process does
    monkeypatch.delenv("ATTENTION_REF_NUM_THREADS", raising=False)

    def refuse():
        raise AssertionError("os.cpu_count() called during an attention call")

    monkeypatch.setattr(os, "cpu_count", refuse)
    q = rng.standard_normal((2, 3, 40, 8))
    for is_causal in (False, True):
        out = scaled_dot_product_attention(q, q, q, is_causal=is_causal)
        np.testing.assert_allclose(out, blockwise_attention(q, q, q, is_causal=is_causal), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("window", [(None, 0), (5, 0), (3, 2), (None, 4), (0, 0)])
def test_banded_blocks_add_the_mask_on_the_band_edges_only(monkeypatch, rng, window):
    # Several query blocks (ATTENTION_REF_NUM_THREADS=2 and L=300 give 64-row blocks): keys inside the window for
    # every query of a block get no additive term, the edges get it. The result equals the explicit mask.
    from attention_ref import sliding_window_mask

    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "2")
    q, k, v = rng.standard_normal((3, 2, 300, 8))
    allowed = sliding_window_mask(300, 300, window=window)
    got = scaled_dot_product_attention(q, k, v, window=window)
    np.testing.assert_allclose(got, scaled_dot_product_attention(q, k, v, mask=allowed), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("loud", [0, 1])
def test_one_call_with_heads_of_very_different_score_sizes(reference_attention, monkeypatch, loud, threads):
    """One batched call (the kernel's one-task path: every head in one product, at least 2^14 scores, no bias)
    where one head's scores sit near -730, past float64's smallest normal exp(-708): unless that head subtracts its
    row maxima, its exp values are subnormal, with about 7 significant digits. The kernel decides whether to shift
    from |q_i| max_j |k_j| over every head of the block; a decision read off the quiet head alone leaves the loud
    head unshifted. Both orders of the heads, so neither the first nor the last head alone can stand for all. One
    thread runs the whole call as one block (`_kernel._one_task`); two split the queries into tasks of both heads."""
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", threads)
    gen = np.random.default_rng(41)
    H, L, S, E = 2, 128, 160, 8
    q = gen.standard_normal((H, L, E))
    k = gen.standard_normal((H, S, E))
    v = gen.standard_normal((H, S, E))
    # The loud head: every query near e_0, every key near -730 sqrt(E) e_0, so its scores are -730 +- a few.
    q[loud] = 0.01 * gen.standard_normal((L, E))
    q[loud, :, 0] = 1.0
    k[loud] = 0.01 * gen.standard_normal((S, E))
    k[loud, :, 0] = -730.0 * np.sqrt(E) * (1 + 0.003 * gen.standard_normal(S))
    scores = np.einsum("le,se->ls", q[loud], k[loud]) / np.sqrt(E)
    assert -745 < scores.min() and scores.max() < -715, (scores.min(), scores.max())
    expected, weights = reference_attention(q, k, v)
    assert weights[loud].max() > 0.05  # the loud head's weights are far from uniform: the scores differ
    out = scaled_dot_product_attention(q, k, v)
    # Scores near -730 carry an absolute rounding error of about 730 ulp(1) = 1.6e-13 into the weights, in either
    # computation; unshifted subnormal weights are off by 1e-7 and more.
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-12)


def test_one_task_float32_with_the_loud_head_between_two_quiet_ones(reference_attention, monkeypatch):
    """The one-task path's shift decision again, in float32 (limit 22.2, smallest normal exp(-87.3)) and with three
    heads, the loud one in the middle: its scores near -101 give subnormal float32 weights unless it subtracts its
    row maxima. Neither the first nor the last head stands for the block's largest key norm."""
    from attention_ref import _kernel

    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "1")
    decisions = []
    decide = _kernel._one_task
    monkeypatch.setattr(_kernel, "_one_task", lambda *args: decisions.append(decide(*args)) or decisions[-1])
    gen = np.random.default_rng(43)
    H, L, S, E = 3, 64, 96, 4  # 18,432 scores: past _BOUND_MIN, so the bound decides
    q = 0.5 * gen.standard_normal((H, L, E))
    k = 0.5 * gen.standard_normal((H, S, E))
    v = gen.standard_normal((H, S, E))
    q[1] = 0.01 * gen.standard_normal((L, E))
    q[1, :, 0] = 1.0
    k[1] = 0.01 * gen.standard_normal((S, E))
    k[1, :, 0] = -101.0 * np.sqrt(E) * (1 + 0.01 * gen.standard_normal(S))
    q, k, v = (a.astype(np.float32) for a in (q, k, v))
    expected, weights = reference_attention(q, k, v)
    assert weights[1].max() > 0.05  # far from uniform: the loud head's scores differ by a few units
    out = scaled_dot_product_attention(q, k, v)
    assert decisions == [True]
    # float32 scores near -101 carry about 101 ulp(1) = 6e-6 into the weights; unshifted subnormal ones far more
    np.testing.assert_allclose(out, expected, rtol=0, atol=5e-5)


# --- return_lse ---------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"is_causal": True}, {"window": (2, 1)}, {"softcap": 1.5, "alibi_slopes": [0.5, 0.25]},
     {"sinks": [0.5, -1.0]}, {"mask": np.tri(5, 7, k=-3, dtype=bool)}],
)
def test_return_lse_is_the_blockwise_lse_and_leaves_out_unchanged(options):
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 7, 4)), rng.standard_normal((2, 7, 3))
    out, lse = scaled_dot_product_attention(q, k, v, return_lse=True, **options)
    np.testing.assert_array_equal(out, scaled_dot_product_attention(q, k, v, **options))
    _, expected = blockwise_attention(q, k, v, return_lse=True, **options)
    np.testing.assert_array_equal(lse, expected)
    assert lse.shape == (2, 5) and lse.dtype == np.float64


def test_return_lse_by_hand_with_an_empty_row_and_a_sink():
    q = np.zeros((1, 3, 1))
    k = np.zeros((1, 2, 1))
    v = np.ones((1, 2, 1))
    mask = np.array([[True, True], [True, False], [False, False]])
    _, lse = scaled_dot_product_attention(q, k, v, mask=mask, return_lse=True)
    np.testing.assert_array_equal(lse, [[np.log(2.0), 0.0, -np.inf]])
    _, lse = scaled_dot_product_attention(q, k, v, mask=mask, sinks=[np.log(3.0)], return_lse=True)
    np.testing.assert_allclose(lse, [[np.log(5.0), np.log(4.0), np.log(3.0)]], rtol=1e-15)


def test_return_lse_with_weights_and_dropout_is_the_lse_before_dropout():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((3, 5, 4))
    out, w, lse = scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(0),
                                               return_weights=True, return_lse=True)
    np.testing.assert_array_equal(lse, scaled_dot_product_attention(q, k, v, return_lse=True)[1])
    assert w.shape == (5, 5) and out.shape == (5, 4)
    np.testing.assert_array_equal(
        out, scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(0))
    )


def test_return_lse_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^return_lse must be True or False"):
        scaled_dot_product_attention(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 1)), return_lse=1)


# --- dropout_mask ---------------------------------------------------------------


def test_dropout_mask_replays_the_generators_draw():
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((3, 2, 5, 4))
    drawn = scaled_dot_product_attention(q, k, v, dropout_p=0.4, rng=np.random.default_rng(9))
    keep = np.random.default_rng(9).random((2, 5, 5)) >= 0.4  # the draw the generator makes
    np.testing.assert_array_equal(scaled_dot_product_attention(q, k, v, dropout_p=0.4, dropout_mask=keep), drawn)
    _, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, dropout_p=0.4, dropout_mask=keep),
                               (w * keep / 0.6) @ v, rtol=0, atol=1e-14)


def test_dropout_mask_broadcasts_and_is_checked():
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((3, 2, 4, 3))
    row = np.array([True, False, True, True])  # (S,): the same keys dropped for every query and head
    out = scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_mask=row)
    _, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(out, (w * row / 0.5) @ v, rtol=0, atol=1e-14)
    with pytest.raises(TypeError, match=r"^dropout_mask and rng are exclusive"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_mask=row, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"^dropout_mask must be a boolean array"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_mask=row.astype(float))
    with pytest.raises(ValueError, match=r"^dropout_mask and the scores do not broadcast"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_mask=np.ones((3, 4), bool))
