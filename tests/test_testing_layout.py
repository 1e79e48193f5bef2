"""The checkers' ``layout=`` (attention_ref/testing/_layout.py): (B, L, H, E) arrays checked as they are, failing
indices in the caller's layout, and the note on (B, L, H, E)-looking arrays read as (B, H, L, E)."""

import numpy as np
import pytest

from attention_ref import attention_backward, scaled_dot_product_attention
from attention_ref.testing import assert_attention_close, assert_attention_grads_close, assert_lse_close
from attention_ref.testing._layout import caller_index, looks_bshd

OPTIONS = {"enable_gqa": True, "is_causal": True}


def bshd(a):
    return np.ascontiguousarray(np.swapaxes(a, 1, 2))


@pytest.fixture
def problem():
    """(q, k, v, dout, out, lse, grads) of a GQA problem, (B, H, L, E), float32 results of the float64 reference."""
    rng = np.random.default_rng(3)
    q, dout = (rng.standard_normal((2, 4, 20, 8)) for _ in range(2))
    k, v = (rng.standard_normal((2, 2, 24, 8)) for _ in range(2))
    out, lse = scaled_dot_product_attention(q, k, v, return_lse=True, **OPTIONS)
    grads = attention_backward(q, k, v, dout, **OPTIONS)
    f32 = [a.astype(np.float32) for a in (q, k, v, dout, out, lse)]
    return (*f32, [g.astype(np.float32) for g in grads[:3]])


def test_bshd_arrays_pass_as_they_are(problem):
    q, k, v, dout, out, lse, grads = problem
    assert_attention_close(bshd(out), bshd(q), bshd(k), bshd(v), layout="bshd", **OPTIONS)
    assert_lse_close(lse, bshd(q), bshd(k), bshd(v), layout="bshd", **OPTIONS)  # the LSE stays (B, H, L)
    assert_attention_grads_close([bshd(g) for g in grads], bshd(q), bshd(k), bshd(v), bshd(dout), layout="bshd",
                                 **OPTIONS)


def test_failing_index_in_the_callers_layout(problem):
    q, k, v, dout, out, _, grads = problem
    wrong = bshd(out)
    wrong[1, 5, 3, 2] += 1.0  # batch 1, row 5, head 3 (of kv head 1)
    with pytest.raises(AssertionError) as info:
        assert_attention_close(wrong, bshd(q), bshd(k), bshd(v), layout="bshd", **OPTIONS)
    message = str(info.value)
    assert "at index (1, 5, 3, 2)" in message
    assert "batch 1, head 3 (kv head 1): row 5 (1 element)" in message
    assert "layout=" not in message
    wrong_dk = [bshd(g) for g in grads]
    wrong_dk[1][0, 7, 1, 4] += 1.0  # dk: batch 0, key 7, kv head 1
    with pytest.raises(AssertionError, match=r"(?s)dk: 1 of .*at index \(0, 7, 1, 4\).*batch 0, head 1: row 7"):
        assert_attention_grads_close(wrong_dk, bshd(q), bshd(k), bshd(v), bshd(dout), layout="bshd", **OPTIONS)


def test_bshd_arrays_without_layout_get_a_note():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 4, 20, 8)).astype(np.float32) for _ in range(3))
    out = scaled_dot_product_attention(q, k, v).astype(np.float32)
    assert_attention_close(bshd(out), bshd(q), bshd(k), bshd(v), layout="bshd")
    with pytest.raises(AssertionError) as info:
        assert_attention_close(bshd(out), bshd(q), bshd(k), bshd(v))
    assert "assumed layout='bhsd'" in str(info.value) and "layout='bshd'" in str(info.value)
    # a validation error on such arrays (GQA heads that do not divide) names it too
    k2, v2 = (rng.standard_normal((2, 2, 24, 8)).astype(np.float32) for _ in range(2))
    with pytest.raises(ValueError, match="layout='bshd'"):
        assert_attention_close(bshd(out), bshd(q), bshd(k2), bshd(v2), enable_gqa=True)
    # arrays in the package's layout fail without the note
    with pytest.raises(AssertionError) as info:
        assert_attention_close(out + np.float32(1.0), q, k, v)
    assert "layout" not in str(info.value)


def test_bad_layouts(problem):
    q, k, v, _, out, lse, _ = problem
    for check, first in ((assert_attention_close, out), (assert_lse_close, lse)):
        with pytest.raises(ValueError, match="layout must be one of 'bhsd', 'bshd'; got 'BSHD'"):
            check(first, q, k, v, layout="BSHD")
    with pytest.raises(ValueError, match="layout must be"):
        assert_attention_grads_close((q, k, v), q, k, v, out, layout=None)
    with pytest.raises(ValueError, match=r"(?s)the attention output of q, k and v, \(2, 4, 20, 8\); got \(2, 4, 19, 8\)"
                       r".*with layout='bshd' the arrays are read as \(B, H, L, E\)"):
        assert_attention_close(bshd(out[:, :, :19]), bshd(q), bshd(k), bshd(v), layout="bshd", **OPTIONS)
    with pytest.raises(ValueError, match=r'q must have at least three axes \(\.\.\., L, H, E\) with layout="bshd"'):
        assert_attention_close(out, q[0, 0], k[0, 0], v[0, 0], layout="bshd")


def test_caller_index_and_looks_bshd():
    assert caller_index((1, 2, 3, 4), "bshd") == (1, 3, 2, 4)
    assert caller_index((1, 2, 3, 4), "bhsd") == (1, 2, 3, 4)
    assert caller_index((2, 3), "bshd") == (2, 3)
    assert looks_bshd(np.zeros((2, 64, 4, 8)), np.zeros((2, 64, 2, 8)))
    assert not looks_bshd(np.zeros((2, 4, 64, 8)), np.zeros((2, 2, 64, 8)))
    assert not looks_bshd(np.zeros((2, 8, 1, 8)), np.zeros((2, 8, 64, 8)))  # decoding: one query row
