"""The checkers' variants (attention_ref/testing/_variants.py): each chosen once from the keywords, and the Flex
variant's baseline computed one (batch, query head) at a time, the same numbers as on whole arrays."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.flex_mods import causal_mask_mod, softcap_score_mod
from attention_ref.testing import assert_attention_close
from attention_ref.testing._baseline import NaiveFlex
from attention_ref.testing._problem import Problem
from attention_ref.testing._variants import Elementwise, Flex, Softmax

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def flex_inputs(seed=0, B=3, Hq=4, Hkv=2, Bkv=1, L=9, S=11, E=5, Ev=3, dtype=np.float16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, L, E)).astype(dtype)
    k = rng.standard_normal((Bkv, Hkv, S, E)).astype(dtype)
    v = rng.standard_normal((Bkv, Hkv, S, Ev)).astype(dtype)
    dout = rng.standard_normal((B, Hq, L, Ev)).astype(dtype)
    return q, k, v, dout


def relative(b, h, q_idx, kv_idx):
    """A mask_mod that reads the batch and the head: each (b, h) allows its own keys."""
    return (kv_idx + b + h) % 3 != 0


FLEX = {"score_mod": softcap_score_mod(2.0), "mask_mod": relative, "enable_gqa": True}


def test_each_check_gets_one_variant_chosen_from_its_keywords():
    q, k, v, _ = flex_inputs(Bkv=3, Hkv=4)
    assert type(Problem(q, k, v, {}, "test").variant) is Softmax
    assert type(Problem(q, k, v, {"is_causal": True, "normalization": "softmax"}, "test").variant) is Softmax
    assert type(Problem(q, k, v, {"normalization": "sigmoid"}, "test").variant) is Elementwise
    assert type(Problem(q, k, v, {"mask_mod": causal_mask_mod()}, "test").variant) is Flex
    assert Problem(q, k, v, {"normalization": "sigmoid"}, "test").variant.has_lse is False


@pytest.mark.parametrize("Bkv", [1, 3], ids=["keys shared by the batch", "keys per batch entry"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "textbook"])
def test_the_flex_baseline_by_units_is_the_whole_array_one_number_for_number(Bkv, fused):
    q, k, v, dout = flex_inputs(Bkv=Bkv)
    check = Problem(q, k, v, FLEX, "test")
    flex, dtype = check.variant, np.dtype(np.float16)
    whole = NaiveFlex(q, k, v, dtype, flex, fused)
    np.testing.assert_array_equal(flex.naive_output(check, dtype, fused), whole.out.astype(dtype))
    np.testing.assert_array_equal(flex.naive_lse(check, dtype, fused),
                                  NaiveFlex(check.q64, check.k64, check.v64, dtype, flex, fused).lse)
    got, want = flex.naive_grads(check, dout, dtype, fused), whole.backward(dout)
    for field in ("dq", "dk", "dv"):
        assert getattr(got, field).dtype == getattr(want, field).dtype
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    scores = NaiveFlex(check.q64, check.k64, check.v64, np.dtype(np.float64), flex).scores
    assert flex.largest_score(check) == np.max(np.abs(scores[np.isfinite(scores)]))


def test_the_mods_see_each_units_own_batch_and_head():
    q, k, v, _ = flex_inputs(B=2, Hq=2, Hkv=2, Bkv=2)
    seen = set()

    def recording(b, h, q_idx, kv_idx):
        b, h = np.broadcast_arrays(b, h)
        seen.update(zip(b.ravel().tolist(), h.ravel().tolist(), strict=True))
        return kv_idx <= q_idx

    check = Problem(q, k, v, {"mask_mod": recording}, "test")
    seen.clear()
    out = check.variant.naive_output(check, np.dtype(np.float16), True)
    assert seen == {(0, 0), (0, 1), (1, 0), (1, 1)}
    want = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)), is_causal=True)
    assert np.abs(out.astype(np.float64) - want).max() < 1e-2


def peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_flex_baseline_holds_one_units_scores_at_a_time():
    """Sixteen times the (batch, head) pairs: the peak grows by the outputs, not by 16 (L, S) score matrices."""
    def baseline(B):
        q, k, v, dout = flex_inputs(B=B, Hq=4, Hkv=4, Bkv=B, L=256, S=256, E=4, Ev=4)
        check = Problem(q, k, v, {"mask_mod": causal_mask_mod()}, "test")
        return lambda: check.variant.naive_grads(check, dout, np.dtype(np.float16), True)

    one, many = peak_bytes(baseline(1)), peak_bytes(baseline(16))  # 4 and 64 units
    assert many < 2 * one
    whole_scores = 64 * 256 * 256 * 4  # one float32 (L, S) array per unit, at once
    assert many < whole_scores


def test_the_memory_estimate_of_a_flex_check_counts_one_unit(monkeypatch):
    """Memory for one unit's (L, S) arrays but not for twelve: the Flex check runs, the softmax's whole-array
    computation (a float64 kernel's) is refused before any work."""
    from attention_ref.testing import _tiles

    q, k, v, _ = flex_inputs(B=3, Hq=4, Hkv=4, Bkv=3, dtype=np.float64)  # 12 units of (9, 11)
    one_unit = _tiles.fits(9, 11, 1, 8)
    monkeypatch.setattr(_tiles, "machine_memory", lambda: int(3 * one_unit))
    mods = {"mask_mod": causal_mask_mod()}
    out = ar.flex_attention(q, k, v, mask_mod=causal_mask_mod())
    assert_attention_close(out, q, k, v, **mods)
    with pytest.raises(ValueError, match=r"its 12 \(batch, head\) pairs .* need about"):
        assert_attention_close(ar.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, is_causal=True)


#: Each variant's keywords for a boolean (L, S) mask `allowed`.
MASKED = {"softmax": lambda allowed: {"mask": allowed},
          "sigmoid": lambda allowed: {"mask": allowed, "normalization": "sigmoid"},
          "flex": lambda allowed: {"mask_mod": lambda b, h, i, j: allowed[i, j]}}


@pytest.mark.parametrize("name", MASKED)
def test_each_variants_reference_gives_its_empty_row_value_where_its_lse_says_no_key(name):
    q, k, v, _ = flex_inputs(B=2, Hq=2, Hkv=2, Bkv=2, dtype=np.float64)
    allowed = np.ones((q.shape[2], k.shape[2]), bool)
    allowed[[1, 4]] = False  # queries 1 and 4 see no key
    check = Problem(q, k, v, MASKED[name](allowed), "test")
    out, lse = check.variant.reference(check, lse=True)
    empty = lse == -np.inf
    assert empty[..., [1, 4]].all() and not empty[..., [0, 2, 3]].any()
    assert np.all(out[empty] == check.variant.empty_row)
    assert np.all(out[~empty] != check.variant.empty_row)


@pytest.mark.parametrize("tiled", [True, False])
def test_a_soft_capped_float32_kernel_is_judged_by_its_scores_before_the_cap(tiled, monkeypatch):
    """With scores in the hundreds capped at 1, a float32 kernel's rounding of a score near 0 passes whole
    through the cap: the float32 atol scales with the scores before it. A correct blockwise kernel failed 37
    of 400 such seeds when it scaled with the capped scores (at most 1); a 0.1 % error still fails."""
    if not tiled:
        monkeypatch.setattr(Softmax, "tiled", False)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        q, k = ((10 * rng.standard_normal((1, 2, 24, 32))).astype(np.float32) for _ in range(2))
        v = rng.standard_normal((1, 2, 24, 8)).astype(np.float32)
        options = {"is_causal": True, "softcap": 1.0}
        out = ar.blockwise_attention(q, k, v, **options)
        assert_attention_close(out, q, k, v, **options)
        raw = np.tril(np.abs(q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64))).max() / np.sqrt(32)
        check = Problem(q, k, v, options, "test")
        check.forward(np.dtype(np.float32), True, magnitude=tiled)
        assert check.score_magnitude() == pytest.approx(raw, rel=1e-12)  # the causal pairs' scores before the cap
        with pytest.raises(AssertionError):
            assert_attention_close(out * np.float32(1.001), q, k, v, **options)
