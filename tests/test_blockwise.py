"""Unit tests of blockwise_attention and merge_attention."""

import math
import tracemalloc
import warnings

import numpy as np
import pytest
from conftest import require

import attention_ref as ar

ATOL = 1e-12


def dense_scores(q, k, *, scale=None, mask=None, bias=None):
    """Scaled (+ biased, masked with -inf) scores, written out independently of the package."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("...le,...se->...ls", q, k) * scale
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return s


def qkv(rng, batch_q, batch_k, L, S, E=4, Ev=3):
    q = rng.standard_normal((*batch_q, L, E))
    k = rng.standard_normal((*batch_k, S, E))
    v = rng.standard_normal((*batch_k, S, Ev))
    return q, k, v


# ---------------------------------------------------------------- hand-checkable cases


def test_two_keys_by_hand():
    # Scores: q0.k0 = 1, q0.k1 = 0, scale 1/sqrt(2); weight on key 0 is sigmoid(1/sqrt(2)).
    q = np.eye(2)
    k = np.eye(2)
    v = np.array([[10.0], [20.0]])
    w = 1.0 / (1.0 + math.exp(-1.0 / math.sqrt(2.0)))
    expected = np.array([[10 * w + 20 * (1 - w)], [10 * (1 - w) + 20 * w]])
    for block in (1, 2, 5, (1, 2), (2, 1)):
        out, lse = ar.blockwise_attention(q, k, v, block_size=block, return_lse=True)
        np.testing.assert_allclose(out, expected, rtol=0, atol=ATOL)
        np.testing.assert_allclose(lse, np.log(np.exp(1 / math.sqrt(2)) + 1.0) * np.ones(2), rtol=0, atol=ATOL)


def test_causal_first_row_is_first_value_and_lse_is_its_score():
    q = np.array([[2.0, 0.0], [1.0, 1.0], [0.0, 3.0]])
    k = np.array([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    v = np.array([[1.0, -1.0], [2.0, 0.0], [3.0, 5.0]])
    out, lse = ar.blockwise_attention(q, k, v, block_size=1, is_causal=True, return_lse=True)
    np.testing.assert_array_equal(out[0], v[0])
    assert lse[0] == pytest.approx(2.0 / math.sqrt(2.0), abs=ATOL)


def test_scale_zero_averages_the_allowed_values():
    rng = np.random.default_rng(0)
    q, k, v = qkv(rng, (), (), 5, 5)
    out = ar.blockwise_attention(q, k, v, block_size=2, scale=0.0, is_causal=True)
    expected = np.cumsum(v, axis=0) / np.arange(1, 6)[:, None]
    np.testing.assert_allclose(out, expected, rtol=0, atol=ATOL)


def test_huge_scores_do_not_overflow():
    q = np.array([[1000.0, 0.0]])
    k = np.array([[1000.0, 0.0], [999.0, 0.0], [-1000.0, 0.0]])
    v = np.array([[1.0], [2.0], [3.0]])
    out = ar.blockwise_attention(q, k, v, block_size=1, scale=1.0)
    # Score gap 1000: the second key's weight is exp(-1000) = 0 in float64.
    np.testing.assert_array_equal(out, [[1.0]])


# ---------------------------------------------------------------- equality with the dense function


@pytest.mark.parametrize("block", [1, 2, 3, 5, 7, 11, 64, (1, 4), (4, 1), (3, 5), (11, 2)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize(("L", "S"), [(7, 7), (5, 11), (11, 4)])
def test_equals_dense_for_every_block_size(rng, block, is_causal, alignment, L, S):
    q, k, v = qkv(rng, (2, 3), (2, 3), L, S)
    kw = {"is_causal": is_causal, "causal_alignment": alignment}
    out, lse = ar.blockwise_attention(q, k, v, block_size=block, return_lse=True, **kw)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, **kw), rtol=0, atol=ATOL)
    allowed = ar.causal_mask(L, S, alignment=alignment) if is_causal else None
    np.testing.assert_allclose(lse, ar.logsumexp(dense_scores(q, k, mask=allowed)), rtol=0, atol=ATOL)


def test_mask_bias_and_broadcast_batch_axes(rng):
    q, k, v = qkv(rng, (2, 1), (1, 3), 6, 9)
    mask = rng.random((3, 6, 9)) < 0.7
    bias = rng.standard_normal((2, 1, 6, 1))  # one bias per query row and batch
    kw = {"mask": mask, "bias": bias, "is_causal": True, "causal_alignment": "bottom-right", "scale": 0.3}
    out, lse = ar.blockwise_attention(q, k, v, block_size=(4, 2), return_lse=True, **kw)
    assert out.shape == (2, 3, 6, 3)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, **kw), rtol=0, atol=ATOL)
    allowed = mask & ar.causal_mask(6, 9, alignment="bottom-right")
    expected_lse = ar.logsumexp(dense_scores(q, k, scale=0.3, mask=allowed, bias=bias))
    np.testing.assert_allclose(lse, expected_lse, rtol=0, atol=ATOL)


def jumping_bias(L, S, dtype):
    """An (L, S) bias, in `dtype`, whose size jumps by about 1e3 from key to key, with padded keys and rows.

    Keys: padded (``np.finfo(dtype).min``), -1e3, 0, +1e3, -1e3, +1e3 + 1, padded, and so on; rows add about
    -1e3, +1e3, 0, ... in turn; the last row is padded throughout (a finite bias: uniform weights).
    """
    fmin = np.finfo(dtype).min
    keys = np.resize([fmin, -1e3, 0.0, 1e3, -1e3, 1e3 + 1.0, fmin], S)
    rows = np.resize([-1e3, 1e3, 0.0, -1e3 + 0.5], L)
    bias = np.maximum(rows[:, None] + keys, fmin)
    bias[L - 1] = fmin
    return bias.astype(dtype)


@pytest.mark.parametrize("block", [1, 2, 3, (2, 1), (1, 4), 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_biases_jumping_between_key_blocks(rng, reference_attention, block, dtype):
    # The running maximum moves by about 1e3 from one key block to the next, up and down, and a row may open on
    # a padded key: each step must rescale the old sums by exp(old max - new max), which is 0 or 1 here.
    L, S = 5, 7
    q, k, v = (a.astype(dtype) for a in qkv(rng, (2,), (2,), L, S))
    bias = jumping_bias(L, S, dtype)
    out, lse = ar.blockwise_attention(q, k, v, bias=bias, block_size=block, return_lse=True)
    expected, _ = reference_attention(q, k, v, bias=bias)
    tol = 1e4 * np.finfo(dtype).eps  # adding 1e3 rounds the scores to about 1e3 * eps
    assert out.dtype == lse.dtype == dtype
    np.testing.assert_allclose(out, expected, rtol=0, atol=tol)
    expected_lse = ar.logsumexp(dense_scores(q.astype(np.float64), k.astype(np.float64), bias=bias))
    np.testing.assert_allclose(lse, expected_lse, rtol=tol, atol=tol)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, bias=bias), rtol=0, atol=tol)


def test_values_with_more_batch_axes_than_scores(rng):
    q = rng.standard_normal((4, 2))
    k = rng.standard_normal((5, 2))
    v = rng.standard_normal((3, 5, 2))
    out = ar.blockwise_attention(q, k, v, block_size=2)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v), rtol=0, atol=ATOL)


def test_grouped_query_attention(rng):
    q = rng.standard_normal((2, 6, 5, 4))
    k = rng.standard_normal((2, 2, 7, 4))
    v = rng.standard_normal((2, 2, 7, 3))
    out = ar.blockwise_attention(q, k, v, block_size=3, enable_gqa=True, is_causal=True)
    # Query head h reads kv head h // 3, written out by hand.
    expected = np.stack(
        [ar.scaled_dot_product_attention(q[:, h], k[:, h // 3], v[:, h // 3], is_causal=True) for h in range(6)],
        axis=1,
    )
    np.testing.assert_allclose(out, expected, rtol=0, atol=ATOL)


def test_matches_torch_in_float64(rng, torch):
    import torch.nn.functional as F

    q, k, v = qkv(rng, (2, 2), (2, 2), 9, 9, E=8, Ev=5)
    got = ar.blockwise_attention(q, k, v, block_size=(2, 3), is_causal=True)
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=ATOL)


# ---------------------------------------------------------------- empty rows and degenerate sizes


def test_fully_masked_rows_give_zeros_and_minus_inf(rng):
    q, k, v = qkv(rng, (), (), 4, 6)
    mask = np.ones((4, 6), dtype=bool)
    mask[1] = False
    mask[3, :4] = False  # row 3 only sees keys 4, 5 (in a later block)
    out, lse = ar.blockwise_attention(q, k, v, block_size=2, mask=mask, return_lse=True)
    np.testing.assert_array_equal(out[1], 0.0)
    assert lse[1] == -np.inf
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, mask=mask), rtol=0, atol=ATOL)
    assert np.isfinite(lse[[0, 2, 3]]).all()


def test_bottom_right_with_more_queries_than_keys(rng):
    q, k, v = qkv(rng, (), (), 7, 3)
    out, lse = ar.blockwise_attention(
        q, k, v, block_size=2, is_causal=True, causal_alignment="bottom-right", return_lse=True
    )
    np.testing.assert_array_equal(out[:4], 0.0)
    np.testing.assert_array_equal(lse[:4], -np.inf)
    np.testing.assert_array_equal(out[4], v[0])  # query 4 sees only key 0


def test_no_keys_and_no_queries(rng):
    q, k, v = qkv(rng, (2,), (2,), 3, 0)
    out, lse = ar.blockwise_attention(q, k, v, return_lse=True)
    np.testing.assert_array_equal(out, np.zeros((2, 3, 3)))
    np.testing.assert_array_equal(lse, np.full((2, 3), -np.inf))
    q, k, v = qkv(rng, (2,), (2,), 0, 4)
    out, lse = ar.blockwise_attention(q, k, v, return_lse=True)
    assert out.shape == (2, 0, 3)
    assert lse.shape == (2, 0)


# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize(("dtype", "atol"), [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_low_precision_keeps_dtype_and_accuracy(rng, dtype, atol):
    q, k, v = (a.astype(dtype) for a in qkv(rng, (2,), (2,), 9, 13))
    out, lse = ar.blockwise_attention(q, k, v, block_size=4, is_causal=True, return_lse=True)
    assert out.dtype == dtype
    assert lse.dtype == np.float32  # float16's lse is float32, as FlashAttention returns it
    exact = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(out.astype(np.float64), exact, rtol=0, atol=atol)


def test_integers_become_float64():
    x = np.arange(6).reshape(3, 2)
    out = ar.blockwise_attention(x, x, x, block_size=2)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(x, x, x), rtol=0, atol=ATOL)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("block", "error", "match"),
    [
        (0, ValueError, "block_size"),
        (-3, ValueError, "block_size"),
        (2.0, TypeError, "block_size"),
        (True, TypeError, "block_size"),
        ((1, 2, 3), ValueError, "block_size"),
        ((0, 2), ValueError, r"block_size\[0\]"),
        ((2, 1.5), TypeError, r"block_size\[1\]"),
    ],
)
def test_bad_block_size(block, error, match):
    x = np.ones((3, 2))
    with pytest.raises(error, match=match):
        ar.blockwise_attention(x, x, x, block_size=block)


def test_return_lse_must_be_a_bool():
    x = np.ones((3, 2))
    with pytest.raises(TypeError, match="return_lse"):
        ar.blockwise_attention(x, x, x, return_lse="yes")


def test_an_infinite_query_gives_nan_in_its_row_only(rng):
    q, k, v = qkv(rng, (), (), 4, 6)
    q[2, 1] = np.inf
    out, lse = ar.blockwise_attention(q, k, v, block_size=2, return_lse=True)
    assert np.isnan(out[2]).all()
    assert np.isnan(lse[2])
    rows = [0, 1, 3]
    np.testing.assert_allclose(out[rows], ar.scaled_dot_product_attention(q[rows], k, v), rtol=0, atol=ATOL)


def test_bad_arrays_are_checked_like_the_dense_function():
    x = np.ones((3, 2))
    with pytest.raises(ValueError, match="q and k"):
        ar.blockwise_attention(x, np.ones((3, 4)), x)
    with pytest.raises(TypeError, match="mask"):
        ar.blockwise_attention(x, x, x, mask=np.ones((3, 3)))
    with pytest.raises(ValueError, match="causal_alignment"):
        ar.blockwise_attention(x, x, x, is_causal=True, causal_alignment="diagonal")
    with pytest.raises(ValueError, match="enable_gqa"):
        ar.blockwise_attention(np.ones((4, 3, 2)), np.ones((2, 3, 2)), np.ones((2, 3, 2)))


# ---------------------------------------------------------------- memory (not timed)


def test_peak_memory_stays_far_below_the_score_matrix():
    rng = np.random.default_rng(1)
    n, e = 2048, 64
    q, k, v = (rng.standard_normal((n, e)) for _ in range(3))
    dense_bytes = n * n * 8  # the (L, S) float64 score matrix: 32 MiB
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = ar.blockwise_attention(q, k, v, block_size=128)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out.shape == (n, e)
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert peak < dense_bytes / 4


# ---------------------------------------------------------------- merge_attention


def test_merge_equal_parts_by_hand():
    out, lse = ar.merge_attention([np.array([[2.0, 0.0]]), np.array([[4.0, 1.0]])], [np.array([0.0]), np.array([0.0])])
    np.testing.assert_allclose(out, [[3.0, 0.5]], rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, [math.log(2.0)], rtol=0, atol=ATOL)


def test_merge_weights_by_normaliser():
    # Normalisers 1 and 3: the parts weigh 1/4 and 3/4; merged normaliser 4.
    out, lse = ar.merge_attention((np.array([[4.0]]), np.array([[8.0]])), (np.array([0.0]), np.array([math.log(3.0)])))
    np.testing.assert_allclose(out, [[7.0]], rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, [math.log(4.0)], rtol=0, atol=ATOL)


def test_merge_with_empty_parts():
    a = np.array([[1.0], [0.0]])
    out, lse = ar.merge_attention([a, np.zeros((2, 1))], [np.array([0.5, -np.inf]), np.array([-np.inf, -np.inf])])
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(lse, [0.5, -np.inf])


def test_merge_of_a_split_equals_full_attention(rng):
    q, k, v = qkv(rng, (2,), (2,), 5, 8)
    mask = ar.causal_mask(5, 8, alignment="bottom-right")
    groups = [[0, 5], [1, 2, 7], [3, 4, 6]]
    parts = [
        ar.blockwise_attention(q, k[..., g, :], v[..., g, :], mask=mask[:, g], block_size=2, return_lse=True)
        for g in groups
    ]
    out, lse = ar.merge_attention([o for o, _ in parts], [s for _, s in parts])
    full, full_lse = ar.blockwise_attention(q, k, v, mask=mask, return_lse=True)
    np.testing.assert_allclose(out, full, rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, full_lse, rtol=0, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [1000.0, -1000.0])
def test_merge_with_large_finite_lses_by_hand(dtype, c):
    # exp(+-1000) overflows or underflows: only the differences of the lses may be exponentiated. Row by row the
    # second part's lse is c + log 3 (weights 1/4 and 3/4), c - 2000 (weight exp(-2000) = 0) and -inf (empty).
    lse_a = np.full(3, c, dtype=dtype)
    lse_b = np.array([c + math.log(3.0), c - 2000.0, -np.inf], dtype=dtype)
    out, lse = ar.merge_attention([np.full((3, 1), 4.0, dtype), np.full((3, 1), 8.0, dtype)], [lse_a, lse_b])
    tol = 1e4 * np.finfo(dtype).eps  # c + log 3 is rounded to about 1e3 * eps
    assert out.dtype == lse.dtype == dtype
    np.testing.assert_allclose(out, [[7.0], [4.0], [4.0]], rtol=0, atol=tol)
    np.testing.assert_allclose(lse, [c + math.log(4.0), c, c], rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merge_of_a_split_with_large_biases_equals_full_attention(rng, reference_attention, dtype):
    # Each group of keys has lses near +-1e3 (or at np.finfo(dtype).min) from the biases of its keys.
    L, S = 5, 7
    q, k, v = (a.astype(dtype) for a in qkv(rng, (2,), (2,), L, S))
    bias = jumping_bias(L, S, dtype)
    # The padded row gets one real key: a row padded throughout has lses finfo.min + log(group size), which round
    # to finfo.min, so merging would weigh its groups equally instead of by their sizes.
    bias[L - 1, 2] = 0.0
    groups = [[0, 3], [1, 2, 6], [4, 5]]
    parts = [ar.blockwise_attention(q, k[..., g, :], v[..., g, :], bias=bias[:, g], return_lse=True) for g in groups]
    out, lse = ar.merge_attention([o for o, _ in parts], [s for _, s in parts])
    expected, _ = reference_attention(q, k, v, bias=bias)
    tol = 1e4 * np.finfo(dtype).eps
    np.testing.assert_allclose(out, expected, rtol=0, atol=tol)
    expected_lse = ar.logsumexp(dense_scores(q.astype(np.float64), k.astype(np.float64), bias=bias))
    np.testing.assert_allclose(lse, expected_lse, rtol=tol, atol=tol)


def test_merge_with_an_infinite_lse_gives_nan_without_warning():
    out, lse = ar.merge_attention([np.ones((2, 1))] * 2, [np.array([np.inf, 0.0]), np.zeros(2)])
    assert np.isnan(out[0]).all()
    assert np.isnan(lse[0])
    np.testing.assert_allclose(out[1], [1.0], rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse[1], math.log(2.0), rtol=0, atol=ATOL)


def test_merge_keeps_float32():
    out, lse = ar.merge_attention([np.ones((2, 1), np.float32)] * 2, [np.zeros(2, np.float32)] * 2)
    assert out.dtype == np.float32
    assert lse.dtype == np.float32


@pytest.mark.parametrize(
    ("outs", "lses", "error", "match"),
    [
        (np.ones((2, 3, 1)), [np.zeros(3)] * 2, TypeError, "outs"),
        ([np.ones((3, 1))], np.zeros((1, 3)), TypeError, "lses"),
        ([], [], ValueError, "non-empty"),
        ([np.ones((3, 1))] * 2, [np.zeros(3)], ValueError, "same length"),
        ([np.ones((3, 1)), np.ones((3, 2))], [np.zeros(3)] * 2, ValueError, r"outs\[1\]"),
        ([np.ones((3, 1))] * 2, [np.zeros(3), np.zeros(4)], ValueError, r"lses\[1\]"),
        ([np.ones(3)], [np.zeros(())], ValueError, "at least 2"),
        ([np.ones((3, 1), dtype=complex)], [np.zeros(3)], TypeError, r"outs\[0\]"),
    ],
)
def test_merge_bad_input(outs, lses, error, match):
    with pytest.raises(error, match=match):
        ar.merge_attention(outs, lses)


# ---------------------------------------------------------------- softcap, window, ALiBi, sinks

OPTIONS = [
    {"softcap": 1.5},
    {"window": (2, 1)},
    {"window": (None, 2), "causal_alignment": "bottom-right"},
    {"window": (3, None), "is_causal": True},
    {"window": (0, 0), "is_causal": True, "causal_alignment": "bottom-right"},
    {"alibi_slopes": [0.5, 0.125]},
    {"alibi_slopes": [[0.5], [-0.25]], "is_causal": True, "causal_alignment": "bottom-right"},
    {"sinks": [0.5, -1.0]},
    {"sinks": 3.0, "mask": np.arange(11) % 3 != 0},
    {"softcap": 2.0, "window": (4, 0), "alibi_slopes": [0.3, 0.1], "sinks": [[1.0], [-2.0]], "bias": -np.eye(7, 11)},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o))
@pytest.mark.parametrize("block", [1, 2, 3, 64, (2, 5), (4, 1)])
@pytest.mark.parametrize(("L", "S"), [(7, 11), (11, 7)])
def test_every_option_equals_dense_for_every_block_size(rng, options, block, L, S):
    options = dict(options)
    if "bias" in options:
        options["bias"] = options["bias"][:L, :S] if L <= S else -np.eye(L, S)
    if "mask" in options:
        options["mask"] = np.arange(S) % 3 != 0
    q, k, v = qkv(rng, (2, 2), (2, 2), L, S)
    out, lse = ar.blockwise_attention(q, k, v, block_size=block, return_lse=True, **options)
    dense = ar.scaled_dot_product_attention(q, k, v, **options)
    np.testing.assert_allclose(out, dense, rtol=0, atol=ATOL)
    assert lse.shape == (2, 2, L)


def test_lse_counts_the_sink_once_by_hand():
    # scale 0: every allowed score is 0; a row with n allowed keys and sink s has lse log(n + e^s).
    q = k = np.zeros((4, 1))
    v = np.ones((4, 1))
    out, lse = ar.blockwise_attention(q, k, v, scale=0.0, is_causal=True, sinks=math.log(2.0), block_size=2,
                                      return_lse=True)
    np.testing.assert_allclose(lse, np.log([3.0, 4.0, 5.0, 6.0]), rtol=1e-15)
    np.testing.assert_allclose(out[:, 0], [1 / 3, 2 / 4, 3 / 5, 4 / 6], rtol=1e-15)


def test_lse_with_sinks_matches_the_reference(rng, reference_attention):
    from plain_options import reference_with_options

    q, k, v = qkv(rng, (2, 3), (2, 3), 6, 9)
    options = {"sinks": rng.normal(size=(2, 3)), "window": (2, 2), "mask": rng.random((6, 9)) < 0.6}
    _, lse = ar.blockwise_attention(q, k, v, block_size=(2, 3), return_lse=True, **options)
    _, _, expected = reference_with_options(reference_attention, q, k, v, **options)
    np.testing.assert_allclose(lse, expected, rtol=0, atol=ATOL)


def _split_parts(q, k, v, groups, **options):
    return [
        ar.blockwise_attention(q, k[..., g, :], v[..., g, :], block_size=2, return_lse=True, **options)
        for g in groups
    ]


GROUPS = [[0, 5], [1, 2, 7], [3, 4, 6]]


@pytest.mark.parametrize("sinks_shape", [(), (3,), (2, 3)])
def test_merge_folds_the_sinks_in_once(rng, sinks_shape):
    # Parts computed without sinks, the sinks given to the merge: the result of one call over all keys.
    q, k, v = qkv(rng, (2, 3), (2, 3), 5, 8)
    sinks = rng.normal(size=sinks_shape)
    parts = _split_parts(q, k, v, GROUPS)
    out, lse = ar.merge_attention([o for o, _ in parts], [s for _, s in parts], sinks=sinks)
    full, full_lse = ar.blockwise_attention(q, k, v, sinks=sinks, return_lse=True)
    np.testing.assert_allclose(out, full, rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, full_lse, rtol=0, atol=ATOL)


def test_merge_with_the_sinks_in_exactly_one_part(rng):
    q, k, v = qkv(rng, (2, 3), (2, 3), 5, 8)
    sinks = rng.normal(size=3)
    first = _split_parts(q, k, v, GROUPS[:1], sinks=sinks)
    rest = _split_parts(q, k, v, GROUPS[1:])
    out, lse = ar.merge_attention([o for o, _ in first + rest], [s for _, s in first + rest])
    full, full_lse = ar.blockwise_attention(q, k, v, sinks=sinks, return_lse=True)
    np.testing.assert_allclose(out, full, rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, full_lse, rtol=0, atol=ATOL)


def test_sinks_in_every_part_are_counted_once_per_part(rng):
    # The documented pitfall: each part's lse holds exp(s), so merging three such parts counts it three times.
    q, k, v = qkv(rng, (2, 3), (2, 3), 5, 8)
    sinks = np.array([0.0, 1.0, 2.0])
    parts = _split_parts(q, k, v, GROUPS, sinks=sinks)
    _, lse = ar.merge_attention([o for o, _ in parts], [s for _, s in parts])
    _, plain_lse = ar.blockwise_attention(q, k, v, return_lse=True)
    three_sinks = np.logaddexp(plain_lse, sinks[:, None] + math.log(3.0))
    np.testing.assert_allclose(lse, three_sinks, rtol=0, atol=ATOL)


def test_merge_of_empty_parts_with_sinks_gives_zeros_and_the_sink():
    out, lse = ar.merge_attention([np.ones((2, 1)), np.ones((2, 1))], [np.full(2, -np.inf)] * 2, sinks=0.25)
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, [0.25, 0.25])


def test_merge_with_sinks_keeps_float32():
    out, lse = ar.merge_attention([np.ones((2, 1), np.float32)], [np.zeros(2, np.float32)], sinks=np.float64(0.0))
    assert out.dtype == lse.dtype == np.float32
    np.testing.assert_allclose(out, 0.5)


# ---------------------------------------------------------------- work skipped under windows


class _Counts:
    """Counts the tiles blockwise attention visits and the window masks it builds."""

    def __init__(self, monkeypatch):
        import attention_ref._attention_problem
        import attention_ref._online

        self.tiles = self.masks = 0
        update, band = attention_ref._online.online_update, attention_ref._attention_problem.in_window

        def counting_update(*args):
            self.tiles += 1
            return update(*args)

        def counting_band(*args):
            self.masks += 1
            return band(*args)

        monkeypatch.setattr(attention_ref._online, "online_update", counting_update)
        monkeypatch.setattr(attention_ref._attention_problem, "in_window", counting_band)


@pytest.mark.parametrize(
    ("options", "tiles", "masks"),
    [
        ({}, 256, 0),
        ({"is_causal": True}, 136, 16),  # the diagonal tiles need the mask, the ones below it do not
        ({"window": (None, 0)}, 136, 16),
        ({"window": (0, None)}, 136, 16),
        ({"window": (64, 0)}, 31, 31),  # each query block: its diagonal tile and the one before, both masked
        ({"window": (64, 64)}, 46, 30),  # the block's own keys lie inside the window, its neighbours cross
        # keys r0 - 256 .. r0 + 63: 5 tiles, of which the first and the last cross the window's edges
        ({"window": (256, 0)}, 70, 28),
        ({"window": (256, 5), "is_causal": True}, 70, 28),
    ],
)
def test_blocks_outside_the_window_are_skipped(rng, monkeypatch, options, tiles, masks):
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "1")
    q, k, v = (rng.standard_normal((1024, 4)) for _ in range(3))
    counts = _Counts(monkeypatch)
    out = ar.blockwise_attention(q, k, v, block_size=64, **options)
    assert (counts.tiles, counts.masks) == (tiles, masks)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, **options), rtol=0, atol=ATOL)


def test_window_work_grows_with_the_window_not_with_the_keys(rng, monkeypatch):
    # The same window over 4x as many keys and queries: 4x the tiles (not 16x).
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "1")
    counts = _Counts(monkeypatch)
    seen = []
    for n in (512, 2048):
        q, k, v = (rng.standard_normal((n, 2)) for _ in range(3))
        counts.tiles = 0
        ar.blockwise_attention(q, k, v, block_size=64, window=(128, 0))
        seen.append(counts.tiles)
    assert seen == [8 * 3 - 3, 32 * 3 - 3]


def test_float16_lse_is_float32_and_merges_beyond_float16_range():
    # Every score is 100 * 100 * 64 / 8 = 80000, above float16's largest 65504: an lse in float16 is +inf and
    # merging two such parts gave NaN with an overflow warning. In float32 the two parts weigh equally.
    q = np.full((2, 64), 100, np.float16)
    v = np.arange(8, dtype=np.float16).reshape(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parts = [ar.blockwise_attention(q, q[a : a + 1], v[a : a + 1], return_lse=True) for a in (0, 1)]
        out, lse = ar.merge_attention([o for o, _ in parts], [s for _, s in parts])
    assert all(s.dtype == np.float32 for _, s in parts)
    np.testing.assert_array_equal(parts[0][1], [80000.0, 80000.0])
    assert out.dtype == np.float16 and lse.dtype == np.float32
    np.testing.assert_array_equal(out, [[2.0, 3.0, 4.0, 5.0]] * 2)
    np.testing.assert_allclose(lse, 80000.0 + math.log(2.0), rtol=1e-7)


def test_merge_of_float16_parts_keeps_float16_out_and_float32_lse():
    out, lse = ar.merge_attention([np.ones((2, 1), np.float16)] * 2, [np.zeros(2, np.float16)] * 2)
    assert out.dtype == np.float16
    assert lse.dtype == np.float32
    np.testing.assert_allclose(lse, math.log(2.0), rtol=1e-7)


def test_merge_of_bfloat16_with_float16_promotes_to_float32():
    # np.stack of the lses raised NumPy's DTypePromotionError; the attention functions (and JAX) give float32.
    bf16 = require("ml_dtypes").bfloat16
    ones = np.ones((2, 3, 4))
    out, lse = ar.merge_attention([ones.astype(bf16), ones.astype(np.float16)], [np.zeros((2, 3), bf16)] * 2)
    assert out.dtype == lse.dtype == np.float32
    out, lse = ar.merge_attention([ones.astype(bf16)] * 2, [np.zeros((2, 3), bf16), np.zeros((2, 3), np.float16)])
    assert out.dtype == bf16 and lse.dtype == np.float32
    np.testing.assert_allclose(lse, np.log(2.0), rtol=1e-7)


def test_merge_sinks_beyond_float32_range_is_a_value_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"^sinks overflows the working dtype float32"):
            ar.merge_attention([np.ones((2, 1), np.float32)], [np.zeros(2, np.float32)], sinks=1e39)
