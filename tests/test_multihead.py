"""Unit tests for attention_ref.multihead: parameters, initialisation, head splitting, the layer."""

import math

import numpy as np
import pytest

from attention_ref import (
    MultiHeadParams,
    causal_mask,
    init_multi_head_params,
    merge_heads,
    multi_head_attention,
    split_heads,
)


def _params(rng, d_model=4, n_heads=2, d_head=2, n_kv_heads=None, d_context=None, bias=True):
    """Random normal parameters with random (non-zero) biases; also used by the property tests."""
    n_kv = n_heads if n_kv_heads is None else n_kv_heads
    d_context = d_model if d_context is None else d_context
    arrays = {
        "w_q": rng.normal(size=(d_model, n_heads * d_head)),
        "w_k": rng.normal(size=(d_context, n_kv * d_head)),
        "w_v": rng.normal(size=(d_context, n_kv * d_head)),
        "w_o": rng.normal(size=(n_heads * d_head, d_model)),
    }
    if bias:
        arrays |= {
            "b_q": rng.normal(size=n_heads * d_head),
            "b_k": rng.normal(size=n_kv * d_head),
            "b_v": rng.normal(size=n_kv * d_head),
            "b_o": rng.normal(size=d_model),
        }
    return MultiHeadParams(n_heads=n_heads, n_kv_heads=n_kv_heads, **arrays)


# ---------------------------------------------------------------- MultiHeadParams


def test_params_derived_sizes(rng):
    p = _params(rng, d_model=6, n_heads=4, d_head=3, n_kv_heads=2, d_context=5)
    assert (p.d_model, p.d_context, p.d_head, p.n_heads, p.n_kv_heads) == (6, 5, 3, 4, 2)
    # 6*12 + 5*6 + 5*6 + 12*6 weights, 12 + 6 + 6 + 6 biases
    assert p.n_params == 72 + 30 + 30 + 72 + 30


def test_params_n_kv_heads_defaults_to_n_heads(rng):
    p = _params(rng, n_heads=2)
    assert p.n_kv_heads == 2 and isinstance(p.n_kv_heads, int)


def test_params_integer_arrays_become_float64():
    eye = np.eye(2, dtype=int)
    p = MultiHeadParams(w_q=eye, w_k=eye, w_v=eye, w_o=eye, n_heads=1, b_o=[1, 2])
    assert p.w_q.dtype == np.float64 and p.b_o.dtype == np.float64


def test_params_are_frozen(rng):
    p = _params(rng)
    with pytest.raises(AttributeError):
        p.n_heads = 3


_SHAPE_ERRORS = [
    ({"w_q": np.zeros((4, 5))}, "w_q"),  # 5 columns not divisible by 2 heads
    ({"w_q": np.zeros((4, 0))}, "w_q"),
    ({"w_q": np.zeros(4)}, "w_q"),
    ({"w_k": np.zeros((4, 3))}, "w_k"),
    ({"w_v": np.zeros((3, 4))}, "w_v"),  # rows differ from w_k
    ({"w_o": np.zeros((4, 3))}, "w_o"),
    ({"b_q": np.zeros(3)}, "b_q"),
    ({"b_k": np.zeros((1, 4))}, "b_k"),
    ({"b_o": np.zeros(5)}, "b_o"),
    ({"n_heads": 0}, "n_heads"),
    ({"n_kv_heads": 3}, "n_kv_heads"),
    ({"n_kv_heads": 0}, "n_kv_heads"),
]
_TYPE_ERRORS = [
    ({"n_heads": 2.0}, "n_heads"),
    ({"n_kv_heads": True}, "n_kv_heads"),
    ({"w_q": np.zeros((4, 4), dtype=bool)}, "w_q"),
    ({"w_o": np.zeros((4, 4), dtype=complex)}, "w_o"),
    ({"b_v": ["a"] * 4}, "b_v"),
]


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [(c, ValueError, m) for c, m in _SHAPE_ERRORS] + [(c, TypeError, m) for c, m in _TYPE_ERRORS],
)
def test_params_reject_bad_arguments(change, exc, match):
    args = {"w_q": np.zeros((4, 4)), "w_k": np.zeros((4, 4)), "w_v": np.zeros((4, 4)), "w_o": np.zeros((4, 4))}
    args |= {"n_heads": 2} | change
    with pytest.raises(exc, match=match):
        MultiHeadParams(**args)


# ---------------------------------------------------------------- init_multi_head_params


def test_init_shapes_and_zero_biases():
    p = init_multi_head_params(np.random.default_rng(1), 12, 6, n_kv_heads=2, d_head=5)
    assert p.w_q.shape == (12, 30) and p.w_k.shape == (12, 10) and p.w_v.shape == (12, 10)
    assert p.w_o.shape == (30, 12)
    for b in (p.b_q, p.b_k, p.b_v, p.b_o):
        assert b is not None and not b.any()


def test_init_without_bias():
    p = init_multi_head_params(np.random.default_rng(1), 4, 2, bias=False)
    assert p.b_q is None and p.b_k is None and p.b_v is None and p.b_o is None
    assert p.n_params == 4 * 4 * 4


def test_init_glorot_bounds_and_variance():
    # U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) has variance a^2 / 3 = 2 / (fan_in + fan_out).
    p = init_multi_head_params(np.random.default_rng(2), 64, 4, d_head=32)  # w_q is (64, 128)
    a = math.sqrt(6 / (64 + 128))
    assert np.abs(p.w_q).max() <= a and np.abs(p.w_o).max() <= a
    assert np.abs(p.w_q).max() > 0.95 * a  # fills the interval
    assert np.var(p.w_q) == pytest.approx(2 / (64 + 128), rel=0.05)
    assert abs(np.mean(p.w_q)) < 0.01


def test_init_is_reproducible_and_uses_the_generator():
    a = init_multi_head_params(np.random.default_rng(3), 4, 2)
    b = init_multi_head_params(np.random.default_rng(3), 4, 2)
    c = init_multi_head_params(np.random.default_rng(4), 4, 2)
    assert np.array_equal(a.w_v, b.w_v)
    assert not np.array_equal(a.w_v, c.w_v)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_init_dtype(dtype):
    p = init_multi_head_params(np.random.default_rng(0), 4, 2, dtype=dtype)
    assert all(a.dtype == dtype for a in (p.w_q, p.w_k, p.w_v, p.w_o, p.b_q, p.b_o))


def test_init_default_d_head():
    assert init_multi_head_params(np.random.default_rng(0), 8, 4).d_head == 2


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        ((0, 8, 2), {}, TypeError, "rng"),
        ((None, 8, 2), {}, TypeError, "rng"),
        (("rng", 8, 3), {}, ValueError, "d_model"),  # 3 does not divide 8
        (("rng", 0, 1), {}, ValueError, "d_model"),
        (("rng", 8, 0), {}, ValueError, "n_heads"),
        (("rng", 8, 4), {"n_kv_heads": 3}, ValueError, "n_kv_heads"),
        (("rng", 8, 4), {"d_head": 0}, ValueError, "d_head"),
        (("rng", 8.0, 4), {}, TypeError, "d_model"),
        (("rng", 8, 4), {"dtype": np.int32}, TypeError, "dtype"),
        (("rng", 8, 4), {"dtype": "not a dtype"}, TypeError, "dtype"),
    ],
)
def test_init_rejects_bad_arguments(args, kwargs, exc, match):
    args = tuple(np.random.default_rng(0) if a == "rng" else a for a in args)
    with pytest.raises(exc, match=match):
        init_multi_head_params(*args, **kwargs)


# ---------------------------------------------------------------- split_heads / merge_heads


def test_split_heads_by_hand():
    x = np.arange(12.0).reshape(2, 6)  # T = 2, H = 3, D = 2
    expected = np.array(
        [
            [[0.0, 1.0], [6.0, 7.0]],
            [[2.0, 3.0], [8.0, 9.0]],
            [[4.0, 5.0], [10.0, 11.0]],
        ]
    )
    np.testing.assert_array_equal(split_heads(x, 3), expected)


def test_split_heads_batched_matches_per_head_slices(rng):
    x = rng.normal(size=(2, 5, 3, 8))  # (..., T=3, H*D=8)
    out = split_heads(x, 4)
    assert out.shape == (2, 5, 4, 3, 2)
    for h in range(4):
        np.testing.assert_array_equal(out[..., h, :, :], x[..., 2 * h : 2 * h + 2])


def test_merge_heads_inverts_split_heads(rng):
    x = rng.normal(size=(3, 4, 6))
    np.testing.assert_array_equal(merge_heads(split_heads(x, 3)), x)
    y = rng.normal(size=(2, 3, 4, 5))  # (..., H, T, D)
    np.testing.assert_array_equal(split_heads(merge_heads(y), 3), y)


def test_merge_heads_by_hand():
    heads = np.array([[[1.0], [2.0]], [[3.0], [4.0]]])  # H = 2, T = 2, D = 1
    np.testing.assert_array_equal(merge_heads(heads), [[1.0, 3.0], [2.0, 4.0]])


def test_split_merge_errors():
    with pytest.raises(ValueError, match="n_heads=4"):
        split_heads(np.zeros((2, 6)), 4)
    with pytest.raises(ValueError, match="x must have at least 2"):
        split_heads(np.zeros(6), 2)
    with pytest.raises(ValueError, match="n_heads"):
        split_heads(np.zeros((2, 6)), 0)
    with pytest.raises(TypeError, match="n_heads"):
        split_heads(np.zeros((2, 6)), 2.0)
    with pytest.raises(ValueError, match="x must have at least 3"):
        merge_heads(np.zeros((2, 6)))
    with pytest.raises(TypeError, match="x"):
        merge_heads(np.zeros((2, 2, 2), dtype=complex))


# ---------------------------------------------------------------- multi_head_attention


def test_mha_identity_projections_by_hand():
    # One head, d_head = 1, all projections 1: scores q_i k_j = x_i x_j, scale 1.
    one = np.ones((1, 1))
    p = MultiHeadParams(w_q=one, w_k=one, w_v=one, w_o=2 * one, n_heads=1, b_o=np.array([0.5]))
    x = np.array([[0.0], [1.0]])
    w0 = np.array([0.5, 0.5])  # query 0: scores (0, 0)
    w1 = np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum()  # query 1: scores (0, 1)
    out, weights = multi_head_attention(x, p, return_weights=True)
    np.testing.assert_allclose(weights, [[w0, w1]], rtol=1e-15)
    np.testing.assert_allclose(out[:, 0], 2 * np.array([w0 @ x[:, 0], w1 @ x[:, 0]]) + 0.5, rtol=1e-15)


def test_mha_shapes_self_and_cross(rng):
    p = _params(rng, d_model=4, n_heads=2, d_head=3, d_context=5)
    x = rng.normal(size=(2, 3, 4))
    ctx = rng.normal(size=(2, 7, 5))
    out, w = multi_head_attention(x, p, context=ctx, return_weights=True)
    assert out.shape == (2, 3, 4) and w.shape == (2, 2, 3, 7)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-14)


def test_mha_context_broadcasts_over_batch(rng):
    p = _params(rng)
    x = rng.normal(size=(3, 2, 4))
    ctx = rng.normal(size=(5, 4))  # shared by the three sequences
    out = multi_head_attention(x, p, context=ctx)
    for b in range(3):
        np.testing.assert_allclose(out[b], multi_head_attention(x[b], p, context=ctx), rtol=1e-13, atol=1e-14)


def test_mha_causal_equals_causal_mask(rng):
    p = _params(rng)
    x = rng.normal(size=(5, 4))
    a = multi_head_attention(x, p, is_causal=True)
    b = multi_head_attention(x, p, mask=causal_mask(5))
    np.testing.assert_array_equal(a, b)
    # The first query sees only the first key, so its output is independent of the rest.
    y = x.copy()
    y[1:] = rng.normal(size=(4, 4))
    np.testing.assert_allclose(multi_head_attention(y, p, is_causal=True)[0], a[0], rtol=1e-13)


def test_mha_bottom_right_alignment(rng):
    p = _params(rng)
    x, ctx = rng.normal(size=(2, 4)), rng.normal(size=(5, 4))
    a = multi_head_attention(x, p, context=ctx, is_causal=True, causal_alignment="bottom-right")
    b = multi_head_attention(x, p, context=ctx, mask=causal_mask(2, 5, alignment="bottom-right"))
    np.testing.assert_array_equal(a, b)


def test_mha_fully_masked_row_gives_output_bias(rng):
    p = _params(rng)
    x = rng.normal(size=(3, 4))
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    out, w = multi_head_attention(x, p, mask=mask, return_weights=True)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(w[:, 1], 0.0)
    np.testing.assert_array_equal(out[1], p.b_o)


def test_mha_per_head_bias_shifts_only_that_head(rng):
    p = _params(rng)
    x = rng.normal(size=(3, 4))
    bias = np.zeros((2, 3, 3))
    bias[1, :, 0] = -np.inf  # head 1 may not look at key 0
    _, w = multi_head_attention(x, p, bias=bias, return_weights=True)
    _, w_plain = multi_head_attention(x, p, return_weights=True)
    np.testing.assert_allclose(w[0], w_plain[0], rtol=1e-15)
    np.testing.assert_array_equal(w[1, :, 0], 0.0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_mha_low_precision_dtype(rng, dtype):
    p = _params(rng)
    x = rng.normal(size=(3, 4))
    ref = multi_head_attention(x, p)
    p_low = MultiHeadParams(
        **{name: getattr(p, name).astype(dtype) for name in ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")},
        n_heads=2,
    )
    out, w = multi_head_attention(x.astype(dtype), p_low, return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    tol = 5e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


def test_mha_integer_input_gives_float64(rng):
    eye = np.eye(2)
    p = MultiHeadParams(w_q=eye, w_k=eye, w_v=eye, w_o=eye, n_heads=2)
    out = multi_head_attention(np.array([[1, 0], [0, 1]]), p)
    assert out.dtype == np.float64


def test_mha_errors(rng):
    p = _params(rng, d_model=4)
    x = rng.normal(size=(3, 4))
    with pytest.raises(TypeError, match="params must be a MultiHeadParams"):
        multi_head_attention(x, {"w_q": p.w_q})
    with pytest.raises(ValueError, match=r"x must have last dimension 4"):
        multi_head_attention(rng.normal(size=(3, 5)), p)
    with pytest.raises(ValueError, match="x must have at least 2"):
        multi_head_attention(rng.normal(size=4), p)
    with pytest.raises(ValueError, match=r"context must have last dimension 4"):
        multi_head_attention(x, p, context=rng.normal(size=(3, 6)))
    with pytest.raises(TypeError, match="mask"):
        multi_head_attention(x, p, mask=np.ones((3, 3)))
    with pytest.raises(ValueError, match="mask"):
        multi_head_attention(x, p, mask=np.ones((3, 4), dtype=bool))
    with pytest.raises(ValueError, match="bias"):
        multi_head_attention(x, p, bias=np.zeros((3, 3, 3)))  # 3 is not the head count 2
    with pytest.raises(TypeError, match="x"):
        multi_head_attention(x.astype(complex), p)
    with pytest.raises(ValueError, match="causal_alignment"):
        multi_head_attention(x, p, is_causal=True, causal_alignment="middle")
    cross = _params(rng, d_model=4, d_context=6)
    with pytest.raises(ValueError, match="pass context"):
        multi_head_attention(x, cross)


# ---------------------------------------------------------------- softcap, window, ALiBi, sinks


def _heads(x, p, context=None):
    """The per-head q, k, v of the layer, written out with NumPy (row convention, biases included)."""
    ctx = x if context is None else context
    d = p.w_q.shape[1] // p.n_heads

    def split(y, n):
        return np.swapaxes(y.reshape(*y.shape[:-1], n, d), -3, -2)

    return (
        split(x @ p.w_q + p.b_q, p.n_heads),
        split(ctx @ p.w_k + p.b_k, p.n_kv_heads),
        split(ctx @ p.w_v + p.b_v, p.n_kv_heads),
    )


@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_mha_passes_every_option_to_each_head(rng, reference_attention, n_kv_heads, alignment):
    from plain_options import reference_with_options

    p = _params(rng, d_model=6, n_heads=2, d_head=3, n_kv_heads=n_kv_heads)
    x, ctx = rng.normal(size=(2, 4, 6)), rng.normal(size=(2, 7, 6))
    options = {
        "window": (2, 1),
        "softcap": 1.5,
        "alibi_slopes": np.array([0.5, 0.125]),
        "sinks": np.array([0.3, -0.7]),
        "is_causal": True,
        "causal_alignment": alignment,
    }
    out, w = multi_head_attention(x, p, context=ctx, return_weights=True, **options)
    q, k, v = _heads(x, p, ctx)
    heads, expected_w, _ = reference_with_options(reference_attention, q, k, v, enable_gqa=True, **options)
    expected = np.swapaxes(heads, -3, -2).reshape(2, 4, 6) @ p.w_o + p.b_o
    np.testing.assert_allclose(w, expected_w, rtol=0, atol=1e-13)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


def test_mha_sinks_per_head(rng):
    # A very negative sink is no sink; a very large one silences its head, as if every key were masked there.
    p = _params(rng)
    x = rng.normal(size=(3, 4))
    plain, w_plain = multi_head_attention(x, p, return_weights=True)
    out, w = multi_head_attention(x, p, sinks=[-1e3, 1e3], return_weights=True)
    np.testing.assert_allclose(w[0], w_plain[0], rtol=1e-14)
    np.testing.assert_array_equal(w[1], 0.0)
    head_1_masked = multi_head_attention(x, p, mask=np.array([True, False])[:, None, None])
    np.testing.assert_allclose(out, head_1_masked, rtol=0, atol=1e-12)
    assert not np.allclose(out, plain)


def test_mha_window_equals_sliding_window_mask(rng):
    from attention_ref import sliding_window_mask

    p = _params(rng)
    x = rng.normal(size=(6, 4))
    for window in [(1, 1), (None, 2), (3, 0)]:
        np.testing.assert_allclose(
            multi_head_attention(x, p, window=window),
            multi_head_attention(x, p, mask=sliding_window_mask(6, window=window)),
            rtol=0,
            atol=1e-14,
        )


def test_mha_alibi_slopes_equal_alibi_bias(rng):
    from attention_ref import alibi_bias, alibi_slopes

    p = _params(rng)
    x = rng.normal(size=(2, 5, 4))
    np.testing.assert_allclose(
        multi_head_attention(x, p, alibi_slopes=alibi_slopes(2), is_causal=True),
        multi_head_attention(x, p, bias=alibi_bias(2, 5), is_causal=True),
        rtol=0,
        atol=1e-14,
    )


def test_weights_are_formed_only_when_asked_for(monkeypatch, rng):
    # multi_head_attention once always asked scaled_dot_product_attention for the weights, an (..., L, S) softmax
    # beside the blocked kernel's output; now only return_weights=True forms them.
    from attention_ref import attention

    params = init_multi_head_params(rng, 16, 4)
    x = rng.standard_normal((2, 10, 16))
    expected, weights = multi_head_attention(x, params, is_causal=True, return_weights=True)

    def refuse(p):
        raise AssertionError("weights formed although return_weights=False")

    monkeypatch.setattr(attention, "_weights", refuse)
    np.testing.assert_allclose(multi_head_attention(x, params, is_causal=True), expected, rtol=1e-12, atol=1e-14)
    assert weights.shape == (2, 4, 10, 10)
