"""The normalizations of the scores (``attention_ref/_normalization.py``): the one registration point.

A toy elementwise normalization, ``relu`` (weights ``max(x, 0)``, a masked key 0), registered in
`NORMALIZATIONS` and nowhere else, reaches the dense forward, the backward, decoding, multi-head attention and
the checkers; the errors name the option.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import attention_ref as ar
from attention_ref import _normalization
from attention_ref.testing import assert_attention_close, assert_attention_grads_close, assert_lse_close

rng = np.random.default_rng(7)
B, H, L, S, E = 2, 2, 5, 6, 4
Q, K, V = (rng.standard_normal((B, H, n, E)) for n in (L, S, S))
DOUT = rng.standard_normal((B, H, L, E))
MASK = rng.random((B, 1, L, S)) < 0.7


@dataclass(frozen=True)
class Relu:
    """Weights ``max(x, 0)`` of each score on its own: a masked key (``-inf``) gets 0."""

    OPTIONS = ()

    @classmethod
    def from_options(cls, options, n_keys, dtype):
        return cls()

    def weights(self, scores, rnd=lambda x: x):
        return rnd(np.maximum(scores, scores.dtype.type(0)))

    def score_grad(self, weights, dweights, rnd=lambda x: x):
        return rnd(np.where(weights > 0, dweights, weights.dtype.type(0)))


@pytest.fixture
def relu(monkeypatch):
    monkeypatch.setitem(_normalization.NORMALIZATIONS, "relu", Relu)


def written_out(q, k, v, mask):
    x = np.where(mask, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -np.inf)
    return np.maximum(x, 0) @ v


@pytest.mark.usefixtures("relu")
def test_a_normalization_registered_once_reaches_the_forward_the_backward_and_the_callers():
    out = ar.scaled_dot_product_attention(Q, K, V, mask=MASK, normalization="relu")
    np.testing.assert_allclose(out, written_out(Q, K, V, MASK), rtol=1e-13, atol=1e-13)
    softmax = ar.scaled_dot_product_attention(Q, K, V, mask=MASK)
    assert np.abs(out - softmax).max() > 0.1

    grads = ar.attention_backward(Q, K, V, DOUT, mask=MASK, normalization="relu")
    h = 1e-6  # central differences of <dout, out> in one entry of q
    step = np.zeros_like(Q)
    step[1, 0, 2, 3] = h
    plus, minus = (np.sum(DOUT * written_out(Q + s, K, V, MASK)) for s in (step, -step))
    assert grads.dq[1, 0, 2, 3] == pytest.approx((plus - minus) / (2 * h), rel=1e-6, abs=1e-9)

    cache = ar.KVCache()
    step_out = ar.decode_step(Q, K[..., :L, :], V[..., :L, :], cache, normalization="relu")
    causal = np.tril(np.ones((L, L), bool))
    np.testing.assert_allclose(step_out, written_out(Q, K[..., :L, :], V[..., :L, :], causal), rtol=1e-13,
                               atol=1e-13)


@pytest.mark.usefixtures("relu")
def test_the_checkers_judge_a_registered_normalization_with_its_own_baseline():
    q, k, v, dout = (a.astype(np.float16) for a in (Q, K, V, DOUT))
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    out = ar.scaled_dot_product_attention(*wide[:3], mask=MASK, normalization="relu").astype(np.float16)
    assert_attention_close(out, q, k, v, mask=MASK, normalization="relu")
    with pytest.raises(AssertionError, match="too far"):
        assert_attention_close(out * np.float16(1.02), q, k, v, mask=MASK, normalization="relu")
    with pytest.raises(AssertionError, match="too far"):  # the softmax's output is not the relu's
        assert_attention_close(ar.scaled_dot_product_attention(q, k, v, mask=MASK), q, k, v, mask=MASK,
                               normalization="relu")
    grads = ar.attention_backward(*wide, mask=MASK, normalization="relu")
    assert_attention_grads_close(tuple(g.astype(np.float16) for g in grads[:3]), q, k, v, dout, mask=MASK,
                                 normalization="relu")
    with pytest.raises(ValueError, match="assert_lse_close has no meaning with normalization='relu'"):
        assert_lse_close(np.zeros((B, H, L)), q, k, v, normalization="relu")


def test_an_unknown_normalization_and_another_ones_option_are_refused_by_name():
    with pytest.raises(ValueError, match=r"normalization must be one of 'softmax', 'sigmoid'; got 'relu'"):
        ar.scaled_dot_product_attention(Q, K, V, normalization="relu")
    with pytest.raises(ValueError, match=r"sigmoid_bias is an option of normalization='sigmoid'; got "
                                         r"sigmoid_bias=0.5 with normalization='softmax'"):
        ar.scaled_dot_product_attention(Q, K, V, sigmoid_bias=0.5)
    with pytest.raises(ValueError, match=r"sinks has no meaning with normalization='sigmoid'"):
        ar.scaled_dot_product_attention(Q, K, V, normalization="sigmoid", sinks=np.zeros(H))
