"""Property-based tests (hypothesis) of attention_backward: dense equals tiled, and identities of the gradient."""

import numpy as np
import pytest
from conftest import require

from attention_ref import attention_backward, scaled_dot_product_attention

try:  # without hypothesis: the module skips locally; in CI require fails, and so does the collection
    require("hypothesis")
except pytest.skip.Exception as exc:
    pytest.skip(str(exc), allow_module_level=True)
from hypothesis import given
from hypothesis import strategies as st
from test_properties import attention_inputs, options


@given(attention_inputs(heads=True), st.data())
def test_tiled_equals_dense_and_the_gradient_identities_hold(inputs, data):
    """For any options: every block size gives the dense gradients; out is linear in v (<dv, v> = <dout, out>);
    the scores are bilinear in q and k, so <dq, q> = <dk, k>; rows with no allowed key get zero dq."""
    q, k, v, mask = inputs
    chosen = data.draw(options(q.shape[0]), label="options")
    if data.draw(st.booleans(), label="with bias"):
        chosen["bias"] = np.random.default_rng(q.size).normal(size=(q.shape[0], 1, k.shape[-2]))
    dout = np.random.default_rng(k.size).normal(size=(*q.shape[:-1], v.shape[-1]))
    dense = attention_backward(q, k, v, dout, mask=mask, **chosen)
    grads = [g for g in dense if g is not None]
    assert all(np.isfinite(g).all() for g in grads)
    top = max(np.abs(g).max(initial=0.0) for g in grads)
    block = data.draw(st.one_of(st.integers(1, 6), st.tuples(st.integers(1, 6), st.integers(1, 6))), label="block")
    tiled = attention_backward(q, k, v, dout, mask=mask, block_size=block, **chosen)
    for a, b in zip(dense, tiled, strict=True):
        if a is not None:
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-12 * max(top, 1.0))
    out = scaled_dot_product_attention(q, k, v, mask=mask, **chosen)
    scale = max(1.0, np.abs(dout).max() * np.abs(out).max() * out.size)
    assert abs(np.sum(dense.dv * v) - np.sum(dout * out)) <= 1e-11 * scale
    assert abs(np.sum(dense.dq * q) - np.sum(dense.dk * k)) <= 1e-11 * max(1.0, top * (q.size + k.size) * 30)
    empty = ~mask.any(axis=-1)  # (L,): rows the mask leaves without a key
    assert not dense.dq[..., empty, :].any()
