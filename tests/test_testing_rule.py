"""The checkers' reports (attention_ref/testing/_rule.py): where the failures sit, NaN apart, the dtype= hint."""

import re

import numpy as np
import pytest
from conftest import require

import attention_ref as ar
from attention_ref.testing import assert_attention_close, assert_attention_grads_close, assert_lse_close
from attention_ref.testing._rule import MAX_PLACES, finite_magnitude, places


def qkv(seed=0, shape=(2, 4, 24, 8), dtype=np.float16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(dtype) for _ in range(3))


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def where_lines(text: str) -> list[str]:
    return text.split("where they are:\n", 1)[1].split("\nnote:", 1)[0].splitlines()


def test_a_wrong_head_is_named_and_nothing_else():
    q, k, v = qkv()
    out = ar.scaled_dot_product_attention(q, k, v)
    out[1, 2] = ar.scaled_dot_product_attention(q, k, v, scale=0.5)[1, 2]  # head 2 of batch 1 scaled wrongly
    lines = where_lines(message(assert_attention_close, out, q, k, v))
    assert len(lines) == 1
    assert re.fullmatch(r"batch 1, head 2: rows 0-23 \(\d+ elements\)", lines[0]), lines


def test_a_mask_edge_bug_shows_its_rows():
    q, k, v = qkv()
    # a window one key too wide on the left, for rows 10 and up only: rows 0-9 are right
    allowed = np.tri(24, dtype=bool) & ~np.tri(24, k=-4, dtype=bool)
    wrong = allowed | (np.tri(24, k=-4, dtype=bool) & ~np.tri(24, k=-5, dtype=bool) & (np.arange(24) >= 10)[:, None])
    out = ar.scaled_dot_product_attention(q, k, v, mask=wrong)
    lines = where_lines(message(assert_attention_close, out, q, k, v, mask=allowed))
    assert len(lines) == 8  # the 2 batches by 4 heads, each with the same rows
    for line in lines[:8]:
        assert re.fullmatch(r"batch [01], head [0-3]: rows 10-23 \(\d+ elements\)", line), line


def test_more_than_eight_runs_are_counted():
    bad = np.zeros((3, 4, 6, 2), bool)
    bad[..., ::2, 0] = True  # rows 0, 2, 4 of every (batch, head): 36 runs of one row
    lines = places(bad, None, rows_last=False)
    assert len(lines) == MAX_PLACES + 1
    assert lines[0] == "batch 0, head 0: row 0 (1 element)"
    assert lines[-1] == f"... and {36 - MAX_PLACES} more runs of rows ({36 - MAX_PLACES} elements)"


def test_rows_with_no_allowed_key_are_flagged_and_split_from_the_rest():
    bad = np.ones((1, 1, 6, 3), bool)
    empty = np.array([[[False, False, True, True, False, False]]])
    assert places(bad, empty, rows_last=False) == [
        "batch 0, head 0: rows 0-1 (6 elements)",
        "batch 0, head 0: rows 2-3 (6 elements), no allowed key",
        "batch 0, head 0: rows 4-5 (6 elements)",
    ]


def test_a_kernel_giving_nan_on_empty_rows_is_told_which_rows_they_are():
    q, k, v = qkv(shape=(1, 2, 6, 8))
    mask = np.ones((6, 6), bool)
    mask[3] = False
    out = ar.scaled_dot_product_attention(q, k, v, mask=mask)
    out[:, :, 3] = np.nan  # PyTorch's math path on a row with no allowed key
    text = message(assert_attention_close, out, q, k, v, mask=mask)
    assert "non-finite values in actual: 16 NaN\n" in text
    assert where_lines(text) == [
        "batch 0, head 0: row 3 (8 elements), no allowed key",
        "batch 0, head 1: row 3 (8 elements), no allowed key",
    ]
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="nan")


def test_infinities_are_counted_apart_from_nan():
    q, k, v = qkv(shape=(1, 1, 5, 4))
    out = ar.scaled_dot_product_attention(q, k, v)
    out[0, 0, 0, :2] = np.inf
    out[0, 0, 1, 0] = -np.inf
    out[0, 0, 2, 0] = np.nan
    assert "non-finite values in actual: 1 NaN, 2 +inf, 1 -inf\n" in message(assert_attention_close, out, q, k, v)


def test_the_log_sum_exp_report_names_rows():
    q, k, v = qkv(shape=(2, 3, 7, 8), dtype=np.float32)
    _, lse = ar.blockwise_attention(q, k, v, return_lse=True)
    lse[1, 2, 4:6] += 1e-3
    assert where_lines(message(assert_lse_close, lse, q, k, v)) == ["batch 1, head 2: rows 4-5 (2 elements)"]


def test_a_gradient_report_names_its_gradient_and_rows():
    q, k, v, dout = (np.random.default_rng(1).standard_normal((1, 2, 9, 4)) for _ in range(4))
    grads = ar.attention_backward(q, k, v, dout)
    dv = grads.dv.copy()
    dv[0, 1, 7] *= 1.01
    text = message(assert_attention_grads_close, (grads.dq, grads.dk, dv), q, k, v, dout)
    assert text.startswith("dv: 4 of 72 elements")
    assert where_lines(text) == ["batch 0, head 1: row 7 (4 elements)"]


# ------------------------------------------------------------------------------------------ dtype=


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_a_widened_16_bit_output_fails_with_the_hint_and_passes_with_dtype(name):
    dtype = np.dtype(require("ml_dtypes").bfloat16) if name == "bfloat16" else np.dtype(name)
    q, k, v = qkv(3, shape=(2, 4, 64, 32), dtype=dtype)
    out = ar.blockwise_attention(q, k, v, block_size=16, is_causal=True)  # a correct 16-bit kernel
    wide = out.astype(np.float32)
    text = message(assert_attention_close, wide, q, k, v, is_causal=True)
    assert f"note: actual is float32 but the inputs are {name}; if the kernel computed in {name}\n" in text
    assert f"pass dtype={name!r} to judge it in that precision" in text
    for judged in (name, dtype, dtype.type):
        assert_attention_close(wide, q, k, v, is_causal=True, dtype=judged)


def test_dtype_judges_the_output_in_that_precision_not_its_own():
    # a float32 output of float32 inputs, computed in float16 somewhere inside: fails as float32, passes as float16
    q, k, v = qkv(4, shape=(1, 2, 40, 16), dtype=np.float32)
    halved = ar.blockwise_attention(*(a.astype(np.float16) for a in (q, k, v)), block_size=8).astype(np.float32)
    text = message(assert_attention_close, halved, q, k, v)
    assert "note:" not in text  # the inputs are as wide as the output: nothing was widened
    assert_attention_close(halved, q, k, v, dtype=np.float16)


def test_a_bad_dtype_is_a_type_error_naming_it():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"^dtype must be float16, float32, float64 or bfloat16; got 'int8'"):
        assert_attention_close(ar.scaled_dot_product_attention(q, k, v), q, k, v, dtype="int8")


def test_the_gradients_take_dtype_too():
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.standard_normal((1, 2, 32, 16)).astype(np.float16) for _ in range(4))
    grads = ar.attention_backward(q, k, v, dout, block_size=8)
    wide = [g.astype(np.float32) for g in grads[:3]]
    text = message(assert_attention_grads_close, wide, q, k, v, dout)
    assert "pass dtype='float16'" in text
    assert_attention_grads_close(wide, q, k, v, dout, dtype="float16")


# --------------------------------------------------------------------------------- the baselines


def test_the_docstrings_table_is_the_default_atol():
    from fractions import Fraction

    from attention_ref.testing._rule import ATOL_UNITS, ATOL_UNITS_GRAD, ATOL_UNITS_LSE

    doc = assert_attention_close.__doc__
    rows = re.findall(r"^\s+(float16|bfloat16|float32|float64)\s+:math:`[^`]+`\s+(\S+)\s+(\S+)\s+(\S+)\s*$", doc,
                      re.MULTILINE)
    assert len(rows) == 4
    for name, out, lse, grads in rows:
        assert [float(Fraction(x)) for x in (out, lse, grads)] == [
            ATOL_UNITS[name], ATOL_UNITS_LSE[name], ATOL_UNITS_GRAD[name]], name


def eager_bfloat16(q, k, v):
    """Eager code in bfloat16: the scores rounded to bfloat16 before a float32 softmax, as HF's eager path."""
    bf16 = q.dtype
    scores = (q.astype(np.float32) @ np.swapaxes(k.astype(np.float32), -1, -2)).astype(bf16).astype(np.float32)
    scores = (scores / np.float32(np.sqrt(q.shape[-1]))).astype(bf16).astype(np.float32)
    weights = ar.softmax(scores, axis=-1).astype(bf16).astype(np.float32)
    return (weights @ v.astype(np.float32)).astype(bf16)


def test_a_kernel_rounding_its_scores_is_told_about_the_textbook_baseline():
    bf16 = np.dtype(require("ml_dtypes").bfloat16)
    for seed in range(20):  # the first case where the fused baseline rejects the eager kernel
        q, k, v = qkv(seed, shape=(1, 2, 64, 64), dtype=bf16)
        q = (q.astype(np.float32) * 3).astype(bf16)  # scores of order ten: their bfloat16 rounding shows
        out = eager_bfloat16(q, k, v)
        try:
            assert_attention_close(out, q, k, v)
        except AssertionError as exc:
            assert "note: the check passes with baseline='textbook'" in str(exc)
            assert_attention_close(out, q, k, v, baseline="textbook")
            return
    pytest.fail("no case told the two baselines apart")


def test_the_fused_baseline_catches_a_two_percent_scale_error_in_bfloat16():
    bf16 = np.dtype(require("ml_dtypes").bfloat16)
    q, k, v = qkv(7, shape=(1, 4, 64, 64), dtype=bf16)
    right = ar.blockwise_attention(q, k, v, is_causal=True, block_size=16)
    wrong = ar.blockwise_attention(q, k, v, is_causal=True, block_size=16, scale=1.02 / 8)
    assert_attention_close(right, q, k, v, is_causal=True)
    with pytest.raises(AssertionError):
        assert_attention_close(wrong, q, k, v, is_causal=True)


@pytest.mark.parametrize("bad", ["Fused", "exact", None, 1])
def test_an_unknown_baseline_is_a_value_error_naming_it(bad):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^baseline must be 'fused' or 'textbook'; got"):
        assert_attention_close(ar.scaled_dot_product_attention(q, k, v), q, k, v, baseline=bad)


def test_grouped_query_lines_name_the_kv_head_and_merge_its_query_heads():
    bad = np.zeros((2, 8, 6, 2), bool)  # 8 query heads, 4 per key/value head
    bad[0, 4:8, 1:3] = True  # every query head of kv head 1, the same rows: one line
    bad[0, 2, 4, 0] = True  # one query head of kv head 0
    bad[1, 3:5, 0] = True  # heads 3 and 4 sit in different groups: two lines
    bad[1, 6, 0:2] = True  # head 6, other rows than head 7
    bad[1, 7, 0] = True
    assert places(bad, None, rows_last=False, groups=4) == [
        "batch 0, head 2 (kv head 0): row 4 (1 element)",
        "batch 0, heads 4-7 (kv head 1): rows 1-2 (16 elements)",
        "batch 1, head 3 (kv head 0): row 0 (2 elements)",
        "batch 1, head 4 (kv head 1): row 0 (2 elements)",
        "batch 1, head 6 (kv head 1): rows 0-1 (4 elements)",
        "batch 1, head 7 (kv head 1): row 0 (2 elements)",
    ]
    # without groups, the lines are those of one head each, as before
    assert len(places(bad, None, rows_last=False)) == 9


def test_a_wrong_kv_head_is_named_in_the_report():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 12, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 12, 8)).astype(np.float32) for _ in range(2))
    wrong_v = v.copy()
    wrong_v[0, 1] += 0.1  # key/value head 1 read wrongly: query heads 4-7 fail
    out = ar.scaled_dot_product_attention(q, k, wrong_v, enable_gqa=True).astype(np.float32)
    lines = where_lines(message(assert_attention_close, out, q, k, v, enable_gqa=True))
    assert lines == ["batch 0, heads 4-7 (kv head 1): rows 0-11 (384 elements)"], lines
    _, lse = ar.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_lse=True)
    lse = lse.astype(np.float32)
    lse[0, 5, 3] += 1.0
    assert where_lines(message(assert_lse_close, lse, q, k, v, enable_gqa=True)) == [
        "batch 0, head 5 (kv head 1): row 3 (1 element)"]


def test_finite_magnitude_is_the_largest_finite_absolute_value():
    x = np.random.default_rng(4).standard_normal((3, 5, 7))
    x[1, 2, 3] = -9.5  # the largest magnitude is negative
    assert finite_magnitude(x) == 9.5
    for bad in (np.nan, np.inf, -np.inf):  # non-finite entries do not count
        y = x.copy()
        y[0, 0, 0] = bad
        assert finite_magnitude(y) == 9.5
    assert finite_magnitude(np.zeros((2, 0))) == 0.0
    assert finite_magnitude(np.array([np.nan, -np.inf])) == 0.0
    assert str(finite_magnitude(-np.zeros(3))) == "0.0"  # never -0.0
