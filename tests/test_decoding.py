"""Unit tests of KVCache and decode_step."""

import itertools
import math

import numpy as np
import pytest
from conftest import require
from hypothesis import given, settings
from hypothesis import strategies as st

import attention_ref as ar

ATOL = 1e-12


# ---------------------------------------------------------------- KVCache


def test_empty_cache():
    cache = ar.KVCache()
    assert len(cache) == 0
    assert cache.keys is None
    assert cache.values is None
    assert cache.capacity == 0
    assert "empty" in repr(cache)


def test_appends_concatenate_along_positions(rng):
    ks = [rng.standard_normal((2, t, 3)) for t in (4, 1, 0, 2, 1)]
    vs = [rng.standard_normal((2, t, 5)) for t in (4, 1, 0, 2, 1)]
    cache = ar.KVCache()
    for k, v in zip(ks, vs, strict=True):
        cache.append(k, v)
    assert len(cache) == 8
    np.testing.assert_array_equal(cache.keys, np.concatenate(ks, axis=-2))
    np.testing.assert_array_equal(cache.values, np.concatenate(vs, axis=-2))
    assert "len=8" in repr(cache)


def test_initial_positions_in_constructor():
    cache = ar.KVCache(np.ones((3, 2)), np.zeros((3, 1)))
    assert len(cache) == 3
    np.testing.assert_array_equal(cache.keys, np.ones((3, 2)))


def test_views_are_read_only_and_survive_growth():
    cache = ar.KVCache(np.array([[1.0]]), np.array([[2.0]]))
    old = cache.keys
    with pytest.raises(ValueError, match="read-only"):
        old[0, 0] = 5.0
    for i in range(10):
        cache.append(np.array([[float(i)]]), np.array([[0.0]]))
    np.testing.assert_array_equal(old, [[1.0]])
    assert len(cache) == 11


def test_growth_is_amortised():
    """One position at a time, the buffers are reallocated only O(log T) times."""
    cache = ar.KVCache()
    capacities = []
    for _ in range(1000):
        cache.append(np.zeros((2, 1, 4)), np.zeros((2, 1, 4)))
        if not capacities or cache.capacity != capacities[-1]:
            capacities.append(cache.capacity)
    assert len(cache) == 1000
    assert len(capacities) <= math.ceil(math.log2(1000)) + 1
    # Each reallocation copies the current contents: the total is below 2 T.
    assert sum(capacities[:-1]) < 2 * 1000


def test_dtype_is_promoted():
    cache = ar.KVCache(np.ones((1, 2), np.float32), np.ones((1, 2), np.float32))
    assert cache.keys.dtype == np.float32
    cache.append(np.full((1, 2), 0.1), np.ones((1, 2)))
    assert cache.keys.dtype == np.float64
    assert cache.keys[1, 0] == 0.1  # not rounded through float32
    assert cache.keys[0, 0] == 1.0


@pytest.mark.parametrize(
    ("k", "v", "error", "match"),
    [
        (np.ones((2, 1, 4)), np.ones((2, 1, 3)), ValueError, "k must have shape"),  # E changed
        (np.ones((2, 1, 3)), np.ones((2, 1, 2)), ValueError, "v must have shape"),  # Ev changed
        (np.ones((3, 1, 3)), np.ones((3, 1, 3)), ValueError, "k must have shape"),  # batch changed
        (np.ones((2, 2, 3)), np.ones((2, 1, 3)), ValueError, "same leading shape"),  # T differs
        (np.ones(3), np.ones(3), ValueError, "k must have at least 2"),
        (np.ones((2, 1, 3), bool), np.ones((2, 1, 3)), TypeError, "k must hold real"),
        (np.ones((2, 1, 3)), np.ones((2, 1, 3), complex), TypeError, "v must be real"),
    ],
)
def test_append_bad_input(k, v, error, match):
    cache = ar.KVCache(np.zeros((2, 4, 3)), np.zeros((2, 4, 3)))
    with pytest.raises(error, match=match):
        cache.append(k, v)
    assert len(cache) == 4


def test_constructor_needs_both_or_neither():
    with pytest.raises(ValueError, match="both k and v"):
        ar.KVCache(np.ones((2, 2)))


# ---------------------------------------------------------------- decode_step


def test_first_position_returns_its_value():
    cache = ar.KVCache()
    out = ar.decode_step(np.array([[3.0, 1.0]]), np.array([[1.0, 2.0]]), np.array([[7.0, -7.0]]), cache)
    np.testing.assert_array_equal(out, [[7.0, -7.0]])


def test_second_step_by_hand():
    cache = ar.KVCache()
    ar.decode_step(np.array([[0.0]]), np.array([[0.0]]), np.array([[1.0]]), cache)
    # New query 2, new key 1: scores (2*0, 2*1) * 1/sqrt(1); weights softmax(0, 2).
    out, w = ar.decode_step(np.array([[2.0]]), np.array([[1.0]]), np.array([[3.0]]), cache, return_weights=True)
    w1 = 1.0 / (1.0 + math.exp(-2.0))
    np.testing.assert_allclose(w, [[1 - w1, w1]], rtol=0, atol=ATOL)
    np.testing.assert_allclose(out, [[(1 - w1) * 1.0 + w1 * 3.0]], rtol=0, atol=ATOL)


def test_prefill_then_steps_equal_full_causal_attention(rng):
    n = 9
    q = rng.standard_normal((2, 3, n, 4))
    k = rng.standard_normal((2, 3, n, 4))
    v = rng.standard_normal((2, 3, n, 2))
    full, full_w = ar.scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    cache = ar.KVCache()
    bounds = [0, 5, 6, 7, 9]  # prefill 5, two single steps, then a 2-token step
    for a, b in itertools.pairwise(bounds):
        out, w = ar.decode_step(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], cache, return_weights=True)
        assert len(cache) == b
        np.testing.assert_allclose(out, full[..., a:b, :], rtol=0, atol=ATOL)
        np.testing.assert_allclose(w, full_w[..., a:b, :b], rtol=0, atol=ATOL)


def test_grouped_query_decoding(rng):
    q = rng.standard_normal((4, 6, 3))
    k = rng.standard_normal((2, 6, 3))
    v = rng.standard_normal((2, 6, 3))
    full = ar.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.5)
    cache = ar.KVCache()
    outs = [ar.decode_step(q[:, :4], k[:, :4], v[:, :4], cache, enable_gqa=True, scale=0.5)]
    for t in (4, 5):
        outs.append(
            ar.decode_step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], cache, enable_gqa=True, scale=0.5)
        )
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), full, rtol=0, atol=ATOL)


def test_float32_stays_float32(rng):
    q, k, v = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    cache = ar.KVCache()
    out = ar.decode_step(q, k, v, cache)
    assert out.dtype == np.float32
    assert cache.keys.dtype == np.float32


def test_decode_step_bad_input_leaves_cache_unchanged():
    cache = ar.KVCache(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        ar.decode_step(np.ones((1, 3)), np.ones((1, 3)), np.ones((1, 3)), cache={})
    with pytest.raises(ValueError, match="same number of new positions"):
        ar.decode_step(np.ones((2, 3)), np.ones((1, 3)), np.ones((1, 3)), cache)
    with pytest.raises(ValueError, match="q and k"):  # E differs: raised after the append, then undone
        ar.decode_step(np.ones((1, 4)), np.ones((1, 3)), np.ones((1, 3)), cache)
    with pytest.raises(ValueError, match="k must have shape"):
        ar.decode_step(np.ones((1, 4)), np.ones((1, 4)), np.ones((1, 3)), cache)
    with pytest.raises(ValueError, match="scale"):
        ar.decode_step(np.ones((1, 3)), np.ones((1, 3)), np.ones((1, 3)), cache, scale=np.inf)
    assert len(cache) == 2
    np.testing.assert_array_equal(cache.keys, np.zeros((2, 3)))


def test_failed_first_step_leaves_cache_empty():
    cache = ar.KVCache()
    with pytest.raises(ValueError, match="q and k"):
        ar.decode_step(np.ones((1, 4)), np.ones((1, 3)), np.ones((1, 3)), cache)
    assert len(cache) == 0
    assert cache.keys is None
    ar.decode_step(np.ones((1, 4)), np.ones((1, 4)), np.ones((1, 2)), cache)  # a fresh E is accepted
    assert cache.keys.shape == (1, 4)


# ---------------------------------------------------------------- sliding-window cache (max_len)


@pytest.mark.parametrize(("max_len", "error"), [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)])
def test_max_len_must_be_a_positive_integer(max_len, error):
    with pytest.raises(error, match=r"^max_len "):
        ar.KVCache(max_len=max_len)


def test_window_cache_keeps_the_newest_positions():
    cache = ar.KVCache(np.arange(5.0).reshape(5, 1), -np.arange(5.0).reshape(5, 1), max_len=3)
    assert cache.max_len == 3
    assert len(cache) == 3
    np.testing.assert_array_equal(cache.keys[:, 0], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(cache.values[:, 0], [-2.0, -3.0, -4.0])
    cache.append(np.array([[5.0]]), np.array([[-5.0]]))
    np.testing.assert_array_equal(cache.keys[:, 0], [3.0, 4.0, 5.0])
    assert "max_len=3" in repr(cache)
    assert ar.KVCache().max_len is None


@given(
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=8),
    max_len=st.integers(1, 5),
)
@settings(max_examples=40, deadline=None)
def test_window_cache_holds_the_last_max_len_positions_property(sizes, max_len):
    rng = np.random.default_rng(len(sizes))
    ks = [rng.standard_normal((2, t, 3)) for t in sizes]
    cache = ar.KVCache(max_len=max_len)
    for i, k in enumerate(ks):
        cache.append(k, k[..., :1] + 1.0)
        seen = np.concatenate(ks[: i + 1], axis=-2)
        expected = seen[..., max(0, seen.shape[-2] - max_len) :, :]
        np.testing.assert_array_equal(cache.keys, expected)
        np.testing.assert_array_equal(cache.values, expected[..., :1] + 1.0)
        assert len(cache) == min(seen.shape[-2], max_len)


def test_window_cache_memory_stays_bounded():
    """One position at a time, the buffers never exceed 2 max_len and copy O(1) positions per append."""
    cache = ar.KVCache(max_len=8)
    reallocations = 0
    buffer = None
    for i in range(1000):
        cache.append(np.full((1, 2), float(i)), np.zeros((1, 1)))
        if cache._k is not buffer:
            buffer, reallocations = cache._k, reallocations + 1
        assert cache.capacity <= 16
    # Each reallocation copies at most max_len positions; after the buffers reach 2 max_len that
    # happens once per max_len appended positions.
    assert reallocations <= 1000 // 8 + math.ceil(math.log2(16)) + 1
    np.testing.assert_array_equal(cache.keys[:, 0], np.arange(992.0, 1000.0))


def test_window_cache_views_survive_later_appends():
    cache = ar.KVCache(np.array([[1.0], [2.0]]), np.zeros((2, 1)), max_len=2)
    old = cache.keys
    for i in range(20):
        cache.append(np.array([[10.0 + i]]), np.zeros((1, 1)))
    np.testing.assert_array_equal(old[:, 0], [1.0, 2.0])
    np.testing.assert_array_equal(cache.keys[:, 0], [28.0, 29.0])


@st.composite
def _window_decoding_case(draw):
    n = draw(st.integers(1, 9))
    cuts = sorted(draw(st.lists(st.integers(1, n - 1), max_size=4, unique=True))) if n > 1 else []
    return n, [0, *cuts, n], draw(st.integers(1, 6)), draw(st.integers(0, 2**16))


@given(_window_decoding_case())
@settings(max_examples=40, deadline=None)
def test_window_decoding_equals_sliding_window_attention_property(case):
    """Every step equals dense attention under a bottom-right sliding-window mask over the sequence so far."""
    n, bounds, window, seed = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, n, 3))
    k = rng.standard_normal((2, n, 3))
    v = rng.standard_normal((2, n, 2))
    cache = ar.KVCache(max_len=window)
    for a, b in itertools.pairwise(bounds):
        seen = len(cache)
        assert seen == min(a, window)
        out, w = ar.decode_step(q[:, a:b], k[:, a:b], v[:, a:b], cache, return_weights=True)
        mask = ar.sliding_window_mask(b - a, b, window=window, alignment="bottom-right")
        dense, dense_w = ar.scaled_dot_product_attention(
            q[:, a:b], k[:, :b], v[:, :b], mask=mask, return_weights=True
        )
        np.testing.assert_allclose(out, dense, rtol=0, atol=ATOL)
        # The step only sees the positions the cache held plus the new ones; every other weight is zero.
        np.testing.assert_allclose(w, dense_w[..., a - seen :], rtol=0, atol=ATOL)
        assert not dense_w[..., : a - seen].any()


def test_window_decoding_by_hand():
    # Window 2, E = 1, scale 1: the third query (q = 1) sees keys 1 and 2 only, not key 0.
    cache = ar.KVCache(max_len=2)
    k = np.array([[5.0], [0.0], [1.0]])
    v = np.array([[100.0], [2.0], [4.0]])
    ar.decode_step(np.zeros((2, 1)), k[:2], v[:2], cache)
    out, w = ar.decode_step(np.array([[1.0]]), k[2:], v[2:], cache, scale=1.0, return_weights=True)
    w2 = 1.0 / (1.0 + math.exp(-1.0))  # softmax(0, 1)[1]
    np.testing.assert_allclose(w, [[0.0, 1 - w2, w2]], rtol=0, atol=ATOL)
    np.testing.assert_allclose(out, [[(1 - w2) * 2.0 + w2 * 4.0]], rtol=0, atol=ATOL)


def test_window_at_least_the_sequence_is_plain_causal_decoding(rng):
    q, k, v = (rng.standard_normal((5, 2)) for _ in range(3))
    cache = ar.KVCache(max_len=5)
    outs = [ar.decode_step(q[:3], k[:3], v[:3], cache)]
    outs += [ar.decode_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], cache) for t in (3, 4)]
    full = ar.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(np.concatenate(outs), full, rtol=0, atol=ATOL)


def test_failed_window_step_leaves_cache_unchanged():
    cache = ar.KVCache(np.arange(4.0).reshape(4, 1), np.zeros((4, 1)), max_len=2)
    state = (len(cache), cache.keys.copy(), cache.capacity)
    with pytest.raises(ValueError, match="scale"):
        ar.decode_step(np.ones((3, 1)), np.ones((3, 1)), np.ones((3, 1)), cache, scale=np.nan)
    assert (len(cache), cache.capacity) == (state[0], state[2])
    np.testing.assert_array_equal(cache.keys, state[1])
    ar.decode_step(np.ones((1, 1)), np.full((1, 1), 9.0), np.ones((1, 1)), cache)
    np.testing.assert_array_equal(cache.keys[:, 0], [3.0, 9.0])


# ---------------------------------------------------------------- softcap, window, ALiBi, sinks


def _decode(q, k, v, cache, bounds, **options):
    """Decode the positions split at `bounds` one step after another; return the concatenated outputs."""
    return np.concatenate(
        [ar.decode_step(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], cache, **options)
         for a, b in itertools.pairwise(bounds)],
        axis=-2,
    )


OPTIONS = [
    {"window": (2, 0)},
    {"window": (3, 5)},  # the right side is moot: decoding is causal
    {"window": (None, 0)},
    {"softcap": 1.5},
    {"alibi_slopes": [0.5, 0.25]},
    {"sinks": [0.5, -1.0]},
    {"window": (1, 0), "softcap": 2.0, "alibi_slopes": [0.3, 0.7], "sinks": [[1.0, 0.0], [0.0, 2.0]]},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o))
@pytest.mark.parametrize("bounds", [[0, 9], [0, 4, 5, 6, 9], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
def test_decoding_with_options_equals_full_attention(rng, options, bounds):
    q, k, v = rng.standard_normal((3, 2, 2, 9, 4))
    full = ar.scaled_dot_product_attention(q, k, v, is_causal=True, **options)
    np.testing.assert_allclose(_decode(q, k, v, ar.KVCache(), bounds, **options), full, rtol=0, atol=ATOL)


@pytest.mark.parametrize("left", [0, 1, 3])
@pytest.mark.parametrize("bounds", [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 5, 7, 9]])
def test_a_cache_of_left_plus_one_positions_serves_window_left(rng, left, bounds):
    # window (left, 0) never looks back more than `left` positions: KVCache(max_len=left + 1) suffices.
    q, k, v = rng.standard_normal((3, 2, 9, 4))
    options = {"window": (left, 0), "alibi_slopes": 0.25, "sinks": 0.5}
    small = ar.KVCache(max_len=left + 1)
    out = _decode(q, k, v, small, bounds, **options)
    np.testing.assert_allclose(out, _decode(q, k, v, ar.KVCache(), bounds, **options), rtol=0, atol=ATOL)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, is_causal=True, **options),
                               rtol=0, atol=ATOL)
    assert len(small) == left + 1


@pytest.mark.parametrize(("max_len", "window", "effective"), [(3, (5, 0), (2, 0)), (6, (1, 0), (1, 0)),
                                                              (4, None, (3, 0)), (4, (None, 2), (3, 0))])
def test_the_narrower_of_max_len_and_window_applies(rng, max_len, window, effective):
    q, k, v = rng.standard_normal((3, 8, 2))
    out = _decode(q, k, v, ar.KVCache(max_len=max_len), [0, 3, 4, 8], window=window)
    np.testing.assert_allclose(out, ar.scaled_dot_product_attention(q, k, v, window=effective, is_causal=True),
                               rtol=0, atol=ATOL)


def test_window_decoding_weights_cover_the_window(rng):
    q, k, v = rng.standard_normal((3, 6, 2))
    cache = ar.KVCache(k[:5], v[:5])
    _, w = ar.decode_step(q[5:], k[5:], v[5:], cache, window=(2, 0), sinks=1.0, return_weights=True)
    assert w.shape == (1, 6)
    np.testing.assert_array_equal(w[0, :3], 0.0)
    assert np.all(w[0, 3:] > 0) and w.sum() < 1


def test_failed_option_check_leaves_cache_unchanged():
    cache = ar.KVCache(np.arange(4.0).reshape(4, 1), np.zeros((4, 1)))
    with pytest.raises(ValueError, match=r"^window\[0\]"):
        ar.decode_step(np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)), cache, window=(-1, 0))
    with pytest.raises(ValueError, match=r"^sinks must broadcast"):
        ar.decode_step(np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)), cache, sinks=np.zeros(3))
    assert len(cache) == 4


def test_bfloat16_with_float16_promotes_to_float32_as_attention_does():
    # NumPy has no promotion for this pair and raised DTypePromotionError; attention (and JAX) gives float32.
    bf16 = require("ml_dtypes").bfloat16
    ones = np.ones((2, 3, 4))
    cache = ar.KVCache()
    cache.append(ones.astype(bf16), ones.astype(np.float16))
    assert cache.keys.dtype == cache.values.dtype == np.float32
    cache = ar.KVCache(ones.astype(bf16), ones.astype(bf16))
    out = ar.decode_step(*(ones[:, :1].astype(np.float16) for _ in range(3)), cache)
    assert out.dtype == cache.keys.dtype == np.float32
    np.testing.assert_array_equal(out, 1.0)
