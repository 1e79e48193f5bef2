"""varlen_attention: a packed batch is a loop of scaled_dot_product_attention calls, one per sequence."""

import numpy as np
import pytest

import attention_ref as ar
from attention_ref import scaled_dot_product_attention, varlen_attention


def packed(rng, lengths_q, lengths_k, *, H=2, Hkv=None, E=4, Ev=3):
    """Random packed q (H, total_q, E), k and v (Hkv, total_k, .) and their cu_seqlens."""
    Hkv = H if Hkv is None else Hkv
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = rng.standard_normal((H, int(cu_q[-1]), E))
    k = rng.standard_normal((Hkv, int(cu_k[-1]), E))
    v = rng.standard_normal((Hkv, int(cu_k[-1]), Ev))
    return q, k, v, cu_q, cu_k


def loop(q, k, v, cu_q, cu_k, **options):
    """The definition: one scaled_dot_product_attention call per sequence, concatenated."""
    outs = [
        scaled_dot_product_attention(q[:, a:b], k[:, c:d], v[:, c:d], **options)
        for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True)
    ]
    return np.concatenate(outs, axis=-2)


def test_exported():
    assert "varlen_attention" in ar.__all__
    assert ar.varlen_attention is varlen_attention


def test_two_sequences_by_hand():
    # All scores equal: each query averages the values of its own sequence only.
    q = k = np.ones((1, 5, 2))
    v = np.array([[[1.0], [3.0], [10.0], [20.0], [30.0]]])
    out = varlen_attention(q, k, v, [0, 2, 5], [0, 2, 5])
    np.testing.assert_allclose(out[0, :, 0], [2.0, 2.0, 20.0, 20.0, 20.0], rtol=0, atol=1e-12)
    causal = varlen_attention(q, k, v, [0, 2, 5], [0, 2, 5], is_causal=True)
    np.testing.assert_allclose(causal[0, :, 0], [1.0, 2.0, 10.0, 15.0, 20.0], rtol=0, atol=1e-12)


def test_equals_the_loop_with_cross_lengths(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 1, 4], [5, 2, 4])
    for options in ({}, {"is_causal": True}, {"is_causal": True, "causal_alignment": "bottom-right"},
                    {"scale": 0.3}):
        np.testing.assert_array_equal(varlen_attention(q, k, v, cu_q, cu_k, **options),
                                      loop(q, k, v, cu_q, cu_k, **options))


def test_grouped_query_heads(rng):
    q, k, v, cu_q, cu_k = packed(rng, [2, 3], [4, 3], H=4, Hkv=2)
    out = varlen_attention(q, k, v, cu_q, cu_k, enable_gqa=True, is_causal=True)
    assert out.shape == (4, 5, 3)
    np.testing.assert_array_equal(out, loop(q, k, v, cu_q, cu_k, enable_gqa=True, is_causal=True))


def test_a_sequence_never_sees_another_sequences_keys(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 2, 4], [3, 2, 4])
    out = varlen_attention(q, k, v, cu_q, cu_k)
    # Make the keys of sequences 0 and 2 irresistible and their values huge: sequence 1 does not change.
    k2, v2 = k.copy(), v.copy()
    for a, b in ((0, 3), (5, 9)):
        k2[:, a:b] = 50.0 * q[:, 3:5].mean(axis=1, keepdims=True)
        v2[:, a:b] = 1e6
    out2 = varlen_attention(q, k2, v2, cu_q, cu_k)
    np.testing.assert_array_equal(out2[:, 3:5], out[:, 3:5])
    assert np.all(np.abs(out[:, 3:5]) <= np.abs(v[:, 3:5]).max())


def test_zero_length_sequences(rng):
    # Sequence 1 has queries but no keys (zeros), sequence 2 keys but no queries, sequence 3 nothing.
    q, k, v, cu_q, cu_k = packed(rng, [2, 3, 0, 0, 1], [2, 0, 4, 0, 3])
    out = varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, causal_alignment="bottom-right")
    assert out.shape == (2, 6, 3)
    np.testing.assert_array_equal(out[:, 2:5], 0.0)
    np.testing.assert_array_equal(out, loop(q, k, v, cu_q, cu_k, is_causal=True, causal_alignment="bottom-right"))


def test_no_sequences():
    q, k, v = np.zeros((2, 0, 4)), np.zeros((1, 0, 4)), np.zeros((1, 0, 3))
    out = varlen_attention(q, k, v, [0], np.array([0], dtype=np.uint8))
    assert out.shape == (2, 0, 3) and out.dtype == np.float64
    out, weights = varlen_attention(q, k, v, [0], [0], return_weights=True)
    assert out.shape == (2, 0, 3) and weights == []


def test_return_weights_one_array_per_sequence(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 0, 2], [2, 4, 5], H=3)
    out, weights = varlen_attention(q, k, v, cu_q, cu_k, return_weights=True, is_causal=True)
    assert [w.shape for w in weights] == [(3, 3, 2), (3, 0, 4), (3, 2, 5)]
    np.testing.assert_array_equal(out, varlen_attention(q, k, v, cu_q, cu_k, is_causal=True))
    for w, (a, b, c, d) in zip(weights, zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True), strict=True):
        _, expected = scaled_dot_product_attention(q[:, a:b], k[:, c:d], v[:, c:d], is_causal=True,
                                                   return_weights=True)
        np.testing.assert_array_equal(w, expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_dtype_preserved(rng, dtype):
    q, k, v, cu_q, cu_k = packed(rng, [2, 3], [3, 3])
    out = varlen_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), cu_q, cu_k)
    assert out.dtype == dtype


def test_dropout_consumes_the_generator_sequence_by_sequence(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 2], [3, 4])
    out = varlen_attention(q, k, v, cu_q, cu_k, dropout_p=0.5, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(out, loop(q, k, v, cu_q, cu_k, dropout_p=0.5, rng=np.random.default_rng(7)))


# --------------------------------------------------------------------- bad input

Q, K, V = np.zeros((2, 5, 4)), np.zeros((2, 6, 4)), np.zeros((2, 6, 3))


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "pattern"),
    [
        ((Q, K, V, [0.0, 5.0], [0, 6]), {}, TypeError, r"^cu_seqlens_q must hold integers.*float64"),
        ((Q, K, V, [0, 5], [False, True]), {}, TypeError, r"^cu_seqlens_k must hold integers.*bool"),
        ((Q, K, V, [0, 5], None), {}, TypeError, r"^cu_seqlens_k must hold integers"),
        ((Q, K, V, [[0, 5]], [0, 6]), {}, ValueError, r"^cu_seqlens_q must be 1-D .*got shape \(1, 2\)"),
        ((Q, K, V, [], [0, 6]), {}, ValueError, r"^cu_seqlens_q must be 1-D with batch \+ 1 entries"),
        ((Q, K, V, [1, 5], [0, 6]), {}, ValueError, r"^cu_seqlens_q must start at 0; got cu_seqlens_q\[0\] = 1"),
        ((Q, K, V, [0, 4, 2, 5], [0, 1, 2, 6]), {}, ValueError,
         r"^cu_seqlens_q must be non-decreasing .*cu_seqlens_q\[1\] = 4 > cu_seqlens_q\[2\] = 2"),
        ((Q, K, V, [0, 4], [0, 6]), {}, ValueError,
         r"^cu_seqlens_q must end at the total number of queries \(q.shape\[-2\]\), 5; got cu_seqlens_q\[-1\] = 4"),
        ((Q, K, V, [0, 5], [0, 7]), {}, ValueError, r"^cu_seqlens_k must end at the total number of keys.*, 6"),
        ((Q, K, V, [0, 2, 5], [0, 6]), {}, ValueError,
         r"^cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got 2 and 1"),
        ((Q[0], K, V, [0, 5], [0, 6]), {}, ValueError, r"^q must have exactly 3 dimensions \(H, total_q, E\)"),
        ((Q, K[None], V, [0, 5], [0, 6]), {}, ValueError, r"^k must have exactly 3 dimensions"),
        ((Q, K, V[:, :5], [0, 5], [0, 6]), {}, ValueError, r"^k and v must have the same number of keys"),
        ((Q, K, V, [0, 5], [0, 6]), {"mask": np.ones((5, 6), bool)}, TypeError,
         r"^varlen_attention does not take mask"),
        ((Q, K, V, [0, 5], [0, 6]), {"bias": np.zeros((5, 6))}, TypeError, r"^varlen_attention does not take bias"),
        ((Q, K, V, [0, 5], [0, 6]), {"return_weights": 1}, TypeError, r"^return_weights must be True or False"),
        ((Q, K, V, [0, 5], [0, 6]), {"is_causal": "yes"}, TypeError, r"^is_causal must be True or False"),
        ((Q + 0j, K, V, [0, 5], [0, 6]), {}, TypeError, r"^q must be real"),
        ((Q, K[:1], V[:1], [0, 5], [0, 6]), {"enable_gqa": True, "is_causal": True, "scale": "x"}, TypeError,
         r"^scale must be a real number"),
    ],
    ids=[
        "cu-float", "cu-bool", "cu-none", "cu-2d", "cu-empty", "cu-start", "cu-decreasing", "cu-q-end",
        "cu-k-end", "cu-count", "q-2d", "k-4d", "v-keys", "mask", "bias", "return-weights", "is-causal",
        "q-complex", "scale",
    ],
)
def test_bad_input_raises_a_named_error(args, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        varlen_attention(*args, **kwargs)


# --------------------------------------------------------------------- options of scaled_dot_product_attention

OPTIONS = [
    {"softcap": 2.0},
    {"window": (1, 0)},
    {"window": (2, 1), "causal_alignment": "bottom-right"},
    {"alibi_slopes": ar.alibi_slopes(2), "is_causal": True},
    {"sinks": np.array([0.5, -1.0])},
    {"softcap": 5.0, "window": (3, None), "alibi_slopes": np.array([0.25, 0.5]), "sinks": np.array([1.0, 0.0]),
     "is_causal": True, "causal_alignment": "bottom-right", "scale": 0.7},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o))
def test_options_apply_to_each_sequence_as_a_call_of_its_own(rng, options):
    q, k, v, cu_q, cu_k = packed(rng, [3, 0, 4, 2], [5, 2, 4, 0])
    out, weights = varlen_attention(q, k, v, cu_q, cu_k, return_weights=True, **options)
    np.testing.assert_array_equal(out, loop(q, k, v, cu_q, cu_k, **options))
    assert [w.shape for w in weights] == [(2, 3, 5), (2, 0, 2), (2, 4, 4), (2, 2, 0)]


def test_window_and_alibi_positions_restart_at_each_sequence(rng):
    # window (0, 0): every query sees only the key at its own position within its own sequence.
    q, k, v, cu_q, cu_k = packed(rng, [3, 2], [3, 2], H=1)
    out = varlen_attention(q, k, v, cu_q, cu_k, window=(0, 0))
    np.testing.assert_allclose(out, v, rtol=1e-15, atol=0)
    # ALiBi distances are counted within each sequence: the same as each sequence alone with an alibi bias.
    out = varlen_attention(q, k, v, cu_q, cu_k, alibi_slopes=np.array([0.5]))
    for a, b in ((0, 3), (3, 5)):
        distance = np.abs(np.arange(b - a)[:, None] - np.arange(b - a))  # |i - j| within the sequence
        alone = scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b], bias=-0.5 * distance)
        np.testing.assert_allclose(out[:, a:b], alone, rtol=0, atol=1e-14)


def test_return_lse_is_each_sequences_lse(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 2, 0, 4], [5, 0, 2, 4])
    sinks = np.array([0.5, -1.0])
    out, lse = varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, causal_alignment="bottom-right",
                                sinks=sinks, return_lse=True)
    assert lse.shape == (2, 9)
    np.testing.assert_array_equal(out, loop(q, k, v, cu_q, cu_k, is_causal=True, causal_alignment="bottom-right",
                                            sinks=sinks))
    for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True):
        _, want = scaled_dot_product_attention(q[:, a:b], k[:, c:d], v[:, c:d], is_causal=True,
                                               causal_alignment="bottom-right", sinks=sinks, return_lse=True)
        np.testing.assert_array_equal(lse[:, a:b], want)
    np.testing.assert_array_equal(lse[:, 3:5], np.broadcast_to(sinks[:, None], (2, 2)))  # no keys: the sink


def test_return_lse_with_weights_and_no_sequences(rng):
    q, k, v, cu_q, cu_k = packed(rng, [2, 1], [3, 2])
    out, weights, lse = varlen_attention(q, k, v, cu_q, cu_k, return_weights=True, return_lse=True)
    assert [w.shape for w in weights] == [(2, 2, 3), (2, 1, 2)] and lse.shape == (2, 3)
    out, lse = varlen_attention(q[:, :0], k[:, :0], v[:, :0], [0], [0], return_lse=True)
    assert out.shape == (2, 0, 3) and lse.shape == (2, 0)
    with pytest.raises(TypeError, match=r"^return_lse must be True or False"):
        varlen_attention(q, k, v, cu_q, cu_k, return_lse="yes")
