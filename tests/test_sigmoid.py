"""Sigmoid attention (``attention_ref/sigmoid.py``): the forward against the formula written out, the backward
against central finite differences, the checkers on correct and wrong low-precision kernels, the strategies'
draws and the errors of bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from test_backward import central_difference

import attention_ref as ar
from attention_ref.testing import assert_attention_close, assert_attention_grads_close, assert_lse_close
from attention_ref.testing.strategies import AttentionProblem, attention_problems

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16

rng = np.random.default_rng(0)
B, H, L, S, E = 2, 2, 5, 6, 4
Q = rng.standard_normal((B, H, L, E))
K = rng.standard_normal((B, H, S, E))
V = rng.standard_normal((B, H, S, 3))
DOUT = rng.standard_normal((B, H, L, 3))
BIAS = rng.standard_normal((H, L, S))
MASK = rng.random((B, 1, L, S)) < 0.7
PADDING = np.ones((B, 1, 1, S), bool)
PADDING[1, ..., 4:] = False  # batch 1: the last two keys are padding


def formula(q, k, v, allowed, scale=None, bias=None, b=None, softcap=None):
    """Sigmoid attention written out: ``sum_j sigmoid(x_ij + b) v_j`` over the allowed keys, and the weights."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    x = np.einsum("...le,...se->...ls", q, k) * scale
    if softcap is not None:
        x = softcap * np.tanh(x / softcap)
    if bias is not None:
        x = x + bias
    b = -np.log(k.shape[-2]) if b is None else b
    weights = np.where(allowed, 1 / (1 + np.exp(-(x + b))), 0.0)
    return weights @ v, weights


def sigmoid(q, k, v, **options):
    return ar.scaled_dot_product_attention(q, k, v, normalization="sigmoid", return_weights=True, **options)


CASES = {
    "plain": ({}, np.ones((L, S), bool)),
    "mask": ({"mask": MASK}, MASK),
    "padding": ({"mask": PADDING}, PADDING),
    "causal": ({"is_causal": True}, np.tril(np.ones((L, S), bool))),
    "causal bottom-right": ({"is_causal": True, "causal_alignment": "bottom-right"},
                            np.tril(np.ones((L, S), bool), k=S - L)),
    "window": ({"window": (1, 2)}, np.triu(np.tril(np.ones((L, S), bool), k=2), k=-1)),
}


@pytest.mark.parametrize("name", CASES)
def test_forward_is_the_formula(name):
    options, allowed = CASES[name]
    out, weights = sigmoid(Q, K, V, **options)
    want_out, want_weights = formula(Q, K, V, allowed)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)
    assert np.all(weights[np.broadcast_to(~np.asarray(allowed), weights.shape)] == 0)  # exactly


def test_masked_keys_weigh_exactly_zero_and_rows_need_not_sum_to_one():
    _, weights = sigmoid(Q, K, V, mask=MASK)
    assert np.all(weights[np.broadcast_to(~MASK, weights.shape)] == 0.0)
    sums = weights.sum(axis=-1)
    assert not np.allclose(sums[MASK.any(axis=-1).repeat(H, axis=1)], 1.0)


def test_scale_bias_softcap_and_a_given_sigmoid_bias_act_before_the_sigmoid():
    options = {"scale": 0.7, "bias": BIAS, "softcap": 2.0, "sigmoid_bias": -1.5}
    out, weights = sigmoid(Q, K, V, **options)
    want_out, want_weights = formula(Q, K, V, True, scale=0.7, bias=BIAS, b=-1.5, softcap=2.0)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-13)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)


def test_alibi_is_a_bias_and_gqa_repeats_the_key_heads():
    slopes = np.array([0.5, 0.25, 0.125, 1.0])
    q = rng.standard_normal((1, 4, L, E))
    out, _ = sigmoid(q, K[:1], V[:1], alibi_slopes=slopes, enable_gqa=True)
    alibi = -slopes[:, None, None] * np.abs(np.arange(L)[:, None] - np.arange(S)[None, :])  # -m_h |i - j|
    want, _ = formula(q, np.repeat(K[:1], 2, axis=1), np.repeat(V[:1], 2, axis=1), True, bias=alibi)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-14)


def test_the_default_bias_is_minus_log_s():
    zeros = np.zeros((1, 1, 1, E))
    for n_keys in (1, 3, 10):
        _, weights = sigmoid(zeros, np.zeros((1, 1, n_keys, E)), np.ones((1, 1, n_keys, 1)))
        np.testing.assert_allclose(weights, 1 / (1 + n_keys), rtol=1e-15)  # sigmoid(-log S) = 1 / (1 + S)


def test_a_row_with_no_allowed_key_is_zero_and_so_are_its_gradients():
    options = {"is_causal": True, "causal_alignment": "bottom-right"}  # L > S: the first rows see no key
    q, dout = rng.standard_normal((7, E)), rng.standard_normal((7, 3))
    out, weights = sigmoid(q, K[0, 0, :3], V[0, 0, :3], **options)
    assert np.all(out[:4] == 0) and np.all(weights[:4] == 0) and np.all(out[4:] != 0)
    grads = ar.attention_backward(q, K[0, 0, :3], V[0, 0, :3], dout, normalization="sigmoid", **options)
    assert np.all(grads.dq[:4] == 0) and np.all(grads.dq[4:] != 0)
    zero_dout = dout.copy()
    zero_dout[4:] = 0  # only the empty rows' gradient flows: it reaches nothing
    grads = ar.attention_backward(q, K[0, 0, :3], V[0, 0, :3], zero_dout, normalization="sigmoid", **options)
    assert all(np.all(g == 0) for g in grads[:3])


def test_saturated_scores_give_no_warning_and_exact_limits():
    q = np.array([[1e4, 0.0]], np.float32)
    k = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
    _, weights = sigmoid(q, k, np.ones((2, 1), np.float32), scale=1.0)
    assert weights.tolist() == [[1.0, 0.0]]


GRAD_CASES = {
    "plain": {},
    "mask, softcap, bias": {"mask": MASK, "softcap": 3.0, "bias": BIAS},
    "causal, window, sigmoid_bias": {"is_causal": True, "window": (2, None), "sigmoid_bias": 0.5, "bias": BIAS},
    "dropout mask": {"dropout_p": 0.3, "dropout_mask": rng.random((B, H, L, S)) < 0.7, "bias": BIAS},
}


@pytest.mark.parametrize("name", GRAD_CASES)
def test_backward_matches_central_differences(name):
    options = {"normalization": "sigmoid", **GRAD_CASES[name]}
    grads = ar.attention_backward(Q, K, V, DOUT, **options)
    args = {"q": Q, "k": K, "v": V, "bias": options.get("bias")}

    def loss(name, x):
        given = {**args, name: x}
        opts = {**options, "bias": given["bias"]}
        return np.sum(ar.scaled_dot_product_attention(given["q"], given["k"], given["v"], **opts) * DOUT)

    for name_, grad in zip(("q", "k", "v", "bias"), grads[:4], strict=True):
        if args[name_] is None:
            assert grad is None
            continue
        numeric = central_difference(lambda x, n=name_: loss(n, x), args[name_])
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8, err_msg=f"d{name_}")
    assert grads.dsinks is None


def test_backward_is_not_the_softmax_s():
    sig = ar.attention_backward(Q, K, V, DOUT, normalization="sigmoid")
    soft = ar.attention_backward(Q, K, V, DOUT)
    assert not np.allclose(sig.dq, soft.dq)


def test_sigmoid_weights_is_the_formula_in_the_dtype_of_the_scores():
    scores = rng.standard_normal((3, 4))
    scores[1, 2] = -np.inf
    want = 1 / (1 + np.exp(-(scores - np.log(4))))
    np.testing.assert_allclose(ar.sigmoid_weights(scores), want, rtol=1e-15)
    np.testing.assert_allclose(ar.sigmoid_weights(scores, bias=2.0), 1 / (1 + np.exp(-(scores + 2))), rtol=1e-15)
    assert ar.sigmoid_weights(scores)[1, 2] == 0.0
    rounded = scores.astype(BF16)
    low = ar.sigmoid_weights(rounded)
    assert low.dtype == BF16
    want = 1 / (1 + np.exp(-(rounded.astype(np.float64) - np.log(4))))
    np.testing.assert_allclose(low.astype(np.float64), want, rtol=2**-8)  # the result rounded once to bfloat16


# --- the checkers --------------------------------------------------------------------------------------

def _low(dtype):
    q, k, v, dout = (a.astype(dtype) for a in (Q, K, V, DOUT))
    return q, k, v, dout


@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32])
@pytest.mark.parametrize("baseline", ["fused", "textbook"])
def test_the_checkers_pass_a_correct_low_precision_kernel(dtype, baseline):
    q, k, v, dout = _low(dtype)
    options = {"normalization": "sigmoid", "mask": MASK, "bias": BIAS.astype(dtype)}
    out = ar.scaled_dot_product_attention(q, k, v, **options)  # computed in float32, rounded once
    assert out.dtype == np.dtype(dtype)
    assert_attention_close(out, q, k, v, baseline=baseline, **options)
    grads = ar.attention_backward(q, k, v, dout, **options)
    assert_attention_grads_close(grads, q, k, v, dout, baseline=baseline, **options)


WRONG = {
    "a wrong bias": {"normalization": "sigmoid", "sigmoid_bias": -np.log(S) + 0.25},
    "the softmax": {},
    "no mask": {"normalization": "sigmoid"},
}


@pytest.mark.parametrize("name", WRONG)
def test_the_checkers_fail_a_wrong_kernel(name):
    q, k, v, dout = _low(BF16)
    asked = {"normalization": "sigmoid", "mask": MASK}
    wrong = WRONG[name] if name == "no mask" else {**WRONG[name], "mask": MASK}
    with pytest.raises(AssertionError, match="too far"):
        assert_attention_close(ar.scaled_dot_product_attention(q, k, v, **wrong), q, k, v, **asked)
    with pytest.raises(AssertionError, match="too far"):
        assert_attention_grads_close(ar.attention_backward(q, k, v, dout, **wrong), q, k, v, dout, **asked)


def test_a_softmax_check_fails_a_sigmoid_kernel():
    q, k, v, _ = _low(BF16)
    with pytest.raises(AssertionError, match="too far"):
        assert_attention_close(ar.scaled_dot_product_attention(q, k, v, normalization="sigmoid"), q, k, v)


def test_empty_rows_are_zeros_to_the_checkers():
    q, k, v, dout = _low(BF16)
    options = {"normalization": "sigmoid", "mask": PADDING & False}  # no key at all
    out = ar.scaled_dot_product_attention(q, k, v, **options)
    assert np.all(out.astype(np.float32) == 0)
    assert_attention_close(out, q, k, v, **options)
    with pytest.raises(AssertionError):
        assert_attention_close(out + BF16(1.0), q, k, v, **options)
    assert_attention_grads_close(ar.attention_backward(q, k, v, dout, **options), q, k, v, dout, **options)


def test_assert_lse_close_refuses_the_sigmoid():
    with pytest.raises(ValueError, match="normalization"):
        assert_lse_close(np.zeros((B, H, L)), Q, K, V, normalization="sigmoid")


# --- the strategies ------------------------------------------------------------------------------------

def _normalizations(strategy, n=40):
    seen = []

    @settings(max_examples=n, deadline=None, database=None)
    @given(strategy)
    def collect(p):
        seen.append(p.options.get("normalization", "softmax"))

    collect()
    return seen


def test_the_strategies_draw_the_sigmoid_only_when_asked():
    assert set(_normalizations(attention_problems(sinks=True))) == {"softmax"}
    assert set(_normalizations(attention_problems(normalizations=("sigmoid",), sinks=True))) == {"sigmoid"}
    assert set(_normalizations(attention_problems(normalizations=("softmax", "sigmoid")), n=60)) == {
        "softmax", "sigmoid"}


@settings(max_examples=25, deadline=None, database=None)
@given(attention_problems(dtypes=("bfloat16", "float32"), normalizations=("sigmoid",), sinks=True, bias=True,
                          alibi=True))
def test_sigmoid_draws_check_against_the_package(p):
    assert "sinks" not in p.options
    out = ar.scaled_dot_product_attention(p.q, p.k, p.v, **p.options)
    assert_attention_close(out, p.q, p.k, p.v, **p.options)


def test_sdpa_kwargs_refuses_the_sigmoid():
    x = np.zeros((1, 1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="normalization"):
        AttentionProblem(x, x, x, {"normalization": "sigmoid"}).sdpa_kwargs()


# --- bad input -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, error, name", [
    ({"normalization": "relu"}, ValueError, "normalization"),
    ({"normalization": None}, ValueError, "normalization"),
    ({"sigmoid_bias": 0.0}, ValueError, "sigmoid_bias"),
    ({"normalization": "sigmoid", "sigmoid_bias": np.nan}, ValueError, "sigmoid_bias"),
    ({"normalization": "sigmoid", "sigmoid_bias": "x"}, TypeError, "sigmoid_bias"),
    ({"normalization": "sigmoid", "sinks": [0.0, 1.0]}, ValueError, "sinks"),
])
def test_bad_options_are_named(options, error, name):
    with pytest.raises(error, match=name):
        ar.scaled_dot_product_attention(Q, K, V, **options)
    with pytest.raises(error, match=name):
        ar.attention_backward(Q, K, V, DOUT, **options)
    with pytest.raises(error, match=name):
        assert_attention_close(Q, Q, K, V, **options)


def test_what_needs_the_softmax_refuses_the_sigmoid_by_name():
    with pytest.raises(ValueError, match="return_lse"):
        ar.scaled_dot_product_attention(Q, K, V, normalization="sigmoid", return_lse=True)
    with pytest.raises(ValueError, match="block_size"):
        ar.attention_backward(Q, K, V, DOUT, normalization="sigmoid", block_size=2)
    with pytest.raises(ValueError, match="lse"):
        ar.attention_backward(Q, K, V, DOUT, normalization="sigmoid", lse=np.zeros((B, H, L)))
    with pytest.raises(ValueError, match="normalization"):
        ar.blockwise_attention(Q, K, V, block_size=2, normalization="sigmoid")
    with pytest.raises(ValueError, match="normalizations"):
        attention_problems(normalizations=("softmax", "relu"))
    with pytest.raises(ValueError, match="normalizations"):
        attention_problems(normalizations="sigmoid")


# --- every public function takes normalization="sigmoid" or refuses it by name ----------------------------------

def _sigmoid_reference(q, k, v, **options):
    return ar.scaled_dot_product_attention(q, k, v, normalization="sigmoid", sigmoid_bias=0.3, **options)


def test_decode_step_and_multi_head_attention_take_the_sigmoid():
    """Each decoding step gives the rows of full causal sigmoid attention over the sequence so far."""
    cache = ar.KVCache()
    prompt = ar.decode_step(Q[..., :3, :], K[..., :3, :], V[..., :3, :], cache, normalization="sigmoid",
                            sigmoid_bias=0.3)
    step = ar.decode_step(Q[..., 3:4, :], K[..., 3:4, :], V[..., 3:4, :], cache, normalization="sigmoid",
                          sigmoid_bias=0.3)
    full = _sigmoid_reference(Q[..., :4, :], K[..., :4, :], V[..., :4, :], is_causal=True)
    np.testing.assert_allclose(np.concatenate([prompt, step], axis=-2), full, rtol=1e-13, atol=1e-13)
    softmax = ar.decode_step(Q[..., :3, :], K[..., :3, :], V[..., :3, :], ar.KVCache())
    assert np.abs(softmax - prompt).max() > 0.01  # the option reached the weights

    params = ar.init_multi_head_params(np.random.default_rng(3), 8, 2)
    x = np.random.default_rng(4).standard_normal((L, 8))
    _, w = ar.multi_head_attention(x, params, normalization="sigmoid", is_causal=True, return_weights=True)
    _, w_softmax = ar.multi_head_attention(x, params, is_causal=True, return_weights=True)
    with np.errstate(divide="ignore"):
        scores = np.log(w) - np.log1p(-w) + np.log(L)  # the sigmoid's inverse, its bias -log S undone
    np.testing.assert_allclose(ar.softmax(scores), w_softmax, rtol=1e-10, atol=1e-15)  # the same scores
    with pytest.raises(ValueError, match="sigmoid_bias"):
        ar.multi_head_attention(x, params, sigmoid_bias=0.0)


def test_varlen_and_paged_attention_take_the_sigmoid():
    q, k, v = Q[0], K[0], V[0]  # (H, L, E): one packed sequence of each
    packed = ar.varlen_attention(q, k, v, np.array([0, L]), np.array([0, S]), normalization="sigmoid",
                                 sigmoid_bias=0.3)
    np.testing.assert_allclose(packed, _sigmoid_reference(q, k, v), rtol=1e-13)
    pages = ar.paged_attention(Q[:1], K[:1], V[:1], np.array([[0]]), np.array([S]), normalization="sigmoid",
                               sigmoid_bias=0.3)
    np.testing.assert_allclose(pages, _sigmoid_reference(Q[:1], K[:1], V[:1]), rtol=1e-13)


def test_blockwise_attention_refuses_the_sigmoid_by_name_and_says_where_it_is():
    with pytest.raises(ValueError, match=r"blockwise_attention supports normalization='softmax' only; "
                                         r"got normalization='sigmoid' \(.*scaled_dot_product_attention"):
        ar.blockwise_attention(Q, K, V, normalization="sigmoid")
    with pytest.raises(ValueError, match=r"normalization must be one of 'softmax', 'sigmoid'; got 'relu'"):
        ar.blockwise_attention(Q, K, V, normalization="relu")
    np.testing.assert_array_equal(ar.blockwise_attention(Q, K, V, normalization="softmax"),
                                  ar.blockwise_attention(Q, K, V))
