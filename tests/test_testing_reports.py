"""The checkers' failure reports, word for word: a fixed set of failing cases against a committed record.

Every checker (`assert_attention_close`, `assert_lse_close`, `assert_attention_grads_close`,
`assert_paged_attention_close`) and every line of the report (the count, the bound with the baseline's
largest error, the largest error with its index, the NaN and infinity counts, the runs of rows by batch and
head with "no allowed key" and the "... more runs" line, the dtype= and textbook notes) fail here on purpose,
with the options that change how the reference and the baseline are computed (masks, windows, soft caps,
ALiBi, sinks, dropout masks, grouped heads, fp8 descales, FlexAttention mods and block masks) and with shapes
whose query rows, keys and heads take several tiles. The record, ``tests/data/testing_reports.json``, was
written by the checkers as they were before they computed by tiles (issue 42); a rewrite of how the
checkers compute must leave every message as it was. ``python tests/test_testing_reports.py --write COMMIT``,
with PYTHONPATH a copy of that commit's ``attention_ref``, rewrites the record (only for a deliberate change
of the reports).
"""

import json
import pathlib
import sys

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.flex_mods import causal_mask_mod, softcap_score_mod
from attention_ref.testing import (
    assert_attention_close,
    assert_attention_grads_close,
    assert_lse_close,
    assert_paged_attention_close,
)

RECORD = pathlib.Path(__file__).parent / "data" / "testing_reports.json"
ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def qkv(seed, dtype, B=2, H=3, L=150, S=150, E=32, Ev=32, Hkv=None):
    rng = np.random.default_rng(seed)
    Hkv = H if Hkv is None else Hkv
    return (rng.standard_normal((B, H, L, E)).astype(dtype), rng.standard_normal((B, Hkv, S, E)).astype(dtype),
            rng.standard_normal((B, Hkv, S, Ev)).astype(dtype))


def sdpa(q, k, v, dtype, **options):
    """The float64 attention of `q`, `k`, `v` in `dtype`: a kernel, correct or not by its options."""
    wide = [a.astype(np.float64) for a in (q, k, v)]
    return ar.scaled_dot_product_attention(*wide, **options).astype(dtype)


def grads(q, k, v, dout, dtype, **options):
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    return tuple(None if g is None else g.astype(dtype) for g in ar.attention_backward(*wide, **options))


# ------------------------------------------------------------------------------------------ the cases

def output_causal_off_by_one():  # many runs: the "... more runs" line
    q, k, v = qkv(0, np.float16)
    wrong = sdpa(q, k, v, np.float16, mask=np.tri(150, k=1, dtype=bool))
    assert_attention_close(wrong, q, k, v, is_causal=True)


def output_nan_and_empty_rows():
    q, k, v = qkv(1, BF16)
    mask = np.ones((150, 150), bool)
    mask[40:45] = False  # rows with no allowed key
    out = sdpa(q, k, v, BF16, mask=mask).astype(np.float32)
    out[0, 1, 7, 3] = np.nan
    out[1, 2, 41, :] = np.inf  # an empty row that is not zeros
    out[1, 0, 100] = -np.inf
    assert_attention_close(out.astype(BF16), q, k, v, mask=mask)


def output_widened():
    q, k, v = qkv(2, np.float16)
    assert_attention_close(sdpa(q, k, v, np.float16, is_causal=True).astype(np.float32) + np.float32(1e-3),
                           q, k, v, is_causal=True)


def output_textbook_hint():
    from attention_ref.testing._baseline import naive_attention
    q, k, v = qkv(3, BF16, L=130, S=130)
    q, k = (a.astype(np.float32) * 4 for a in (q, k))
    q, k = q.astype(BF16), k.astype(BF16)
    assert_attention_close(naive_attention(q, k, v, BF16, {}, fused=False), q, k, v)


def output_float64_wrong_scale():
    q, k, v = qkv(4, np.float64, B=1, H=2)
    assert_attention_close(sdpa(q, k, v, np.float64, scale=0.18), q, k, v)


def output_float32_window_softcap_alibi_sinks():
    q, k, v = qkv(5, np.float32, L=140, S=170)
    options = {"window": (30, 5), "softcap": 3.0, "alibi_slopes": np.array([0.1, 0.2, 0.4]),
               "sinks": np.array([0.5, -1.0, 2.0])}
    wrong = sdpa(q, k, v, np.float32, **options | {"sinks": np.array([0.5, -1.0, 2.1])})
    assert_attention_close(wrong, q, k, v, **options)


def output_bias_and_dropout_mask():
    q, k, v = qkv(6, np.float16)
    rng = np.random.default_rng(60)
    bias = rng.standard_normal((3, 150, 150)).astype(np.float16)
    keep = rng.random((2, 3, 150, 150)) > 0.1
    options = {"bias": bias, "dropout_p": 0.1, "dropout_mask": keep}
    wrong = sdpa(q, k, v, np.float16, **options | {"dropout_mask": keep | (np.arange(150) == 3)})
    assert_attention_close(wrong, q, k, v, **options)


def output_gqa_wrong_heads():
    q, k, v = qkv(7, np.float16, H=4, Hkv=2, L=96, S=200)
    wrong = sdpa(q, k[:, [1, 0]], v[:, [1, 0]], np.float16, enable_gqa=True, is_causal=True,
                 causal_alignment="bottom-right")
    wrong[:, :2] = sdpa(q, k, v, np.float16, enable_gqa=True, is_causal=True, causal_alignment="bottom-right")[:, :2]
    assert_attention_close(wrong, q, k, v, enable_gqa=True, is_causal=True, causal_alignment="bottom-right")


def _fp8(seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((3, 2, 2, 80, 32))
    (q8, qd), (k8, kd), (v8, vd) = (ar.quantize_fp8(x, per_head=True) for x in (q, k, 3 * v))
    return q8, k8, v8, {"q_descale": qd, "k_descale": kd, "v_descale": vd}


def output_fp8_descales():
    q8, k8, v8, options = _fp8(8)
    wrong = ar.scaled_dot_product_attention(q8, k8, v8, **options | {"v_descale": options["v_descale"] * 1.1},
                                            is_causal=True)
    assert_attention_close(wrong, q8, k8, v8, is_causal=True, **options)


def output_empty_rows_mean():
    q, k, v = qkv(9, np.float16, B=1)
    mask = np.ones((1, 3, 150, 150), bool)
    mask[0, 1, 10:20] = False
    out = sdpa(q, k, v, np.float16, mask=mask)  # zeros on the empty rows
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="mean")


def output_empty_rows_nan():
    q, k, v = qkv(10, np.float16, B=1)
    mask = np.ones((150, 150), bool)
    mask[::7] = False
    out = sdpa(q, k, v, np.float16, mask=mask)
    out[0, 0, 1, 0] = np.nan  # a NaN where a row has keys
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="nan")


def output_three_axes():
    q, k, v = (a[0] for a in qkv(11, np.float16))
    assert_attention_close(sdpa(q, k, v, np.float16, scale=0.2), q, k, v)


def output_two_axes():
    q, k, v = (a[0, 0] for a in qkv(12, BF16))
    assert_attention_close(sdpa(q, k, v, BF16, scale=0.2), q, k, v)


def output_threaded_size():  # enough work for the checkers' threads
    q, k, v = qkv(13, np.float16, B=2, H=4, L=384, S=384)
    wrong = sdpa(q, k, v, np.float16, is_causal=True)
    wrong[1, 3, 300:310] += np.float16(0.01)
    assert_attention_close(wrong, q, k, v, is_causal=True)


def output_flex_score_mod():
    q, k, v = qkv(14, np.float16, L=100, S=100)
    mods = {"score_mod": softcap_score_mod(2.0), "mask_mod": causal_mask_mod()}
    wrong = ar.flex_attention(*(a.astype(np.float64) for a in (q, k, v)), softcap_score_mod(2.2),
                              causal_mask_mod()).astype(np.float16)
    assert_attention_close(wrong, q, k, v, **mods)


def output_flex_block_mask():
    q, k, v = qkv(15, BF16, L=128, S=128)
    n = 128 // 32
    kv_num = np.tile(np.arange(1, n + 1), (2, 3, 1))  # causal by blocks of 32, one partial block a row
    kv_idx = np.tile(np.arange(n), (2, 3, n, 1))
    block_mask = {"kv_num_blocks": kv_num, "kv_indices": kv_idx, "BLOCK_SIZE": 32, "seq_lengths": (128, 128)}
    dense = ar.block_mask_to_dense(**block_mask)
    wrong = sdpa(q, k, v, BF16, mask=dense | np.eye(128, k=40, dtype=bool))
    assert_attention_close(wrong, q, k, v, block_mask=block_mask)


def lse_base_two_read_as_natural():
    q, k, v = qkv(20, np.float32)
    _, lse = ar.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    assert_lse_close((lse / np.log(2)).astype(np.float32), q, k, v, is_causal=True)


def lse_empty_rows_wrong_infinity():
    q, k, v = qkv(21, BF16)
    mask = np.ones((150, 150), bool)
    mask[30:33] = False
    _, lse = ar.scaled_dot_product_attention(q, k, v, mask=mask, return_lse=True)
    lse = lse.astype(np.float32)
    lse[lse == -np.inf] = np.inf
    lse[0, 0, 5] = np.nan
    assert_lse_close(lse, q, k, v, mask=mask)


def lse_dtype_and_sinks():
    q, k, v = qkv(22, BF16, L=120, S=160)
    sinks = np.array([0.0, 1.0, -2.0])
    _, lse = ar.scaled_dot_product_attention(q, k, v, sinks=sinks * 1.05, window=(40, 0), return_lse=True)
    assert_lse_close(lse.astype(BF16), q, k, v, sinks=sinks, window=(40, 0), dtype="bfloat16")


def grads_softcap_ignored():
    rng = np.random.default_rng(30)
    q, k, v, dout = rng.standard_normal((4, 2, 3, 150, 32)).astype(np.float16)
    assert_attention_grads_close(grads(q, k, v, dout, np.float16, is_causal=True), q, k, v, dout, softcap=2.0,
                                 is_causal=True)


def grads_gqa_sinks_bias():
    rng = np.random.default_rng(31)
    q, dout = rng.standard_normal((2, 2, 4, 120, 32)).astype(BF16)
    k, v = rng.standard_normal((2, 2, 2, 140, 32)).astype(BF16)
    bias = rng.standard_normal((120, 140)).astype(BF16)
    sinks = np.array([0.3, -0.5, 1.0, 0.0])
    options = {"enable_gqa": True, "bias": bias, "sinks": sinks, "window": (50, 10)}
    wrong = grads(q, k, v, dout, BF16, **options | {"sinks": sinks + 0.05})
    assert_attention_grads_close(wrong, q, k, v, dout, **options)


def grads_dropout_mask_and_alibi_float32():
    rng = np.random.default_rng(32)
    q, k, v, dout = rng.standard_normal((4, 1, 2, 100, 32)).astype(np.float32)
    keep = rng.random((1, 2, 100, 100)) > 0.2
    options = {"dropout_p": 0.2, "dropout_mask": keep, "alibi_slopes": np.array([0.05, 0.1])}
    wrong = grads(q, k, v, dout, np.float32, **options | {"dropout_p": 0.25})
    assert_attention_grads_close(wrong, q, k, v, dout, **options)


def grads_empty_rows(convention):
    rng = np.random.default_rng(33)
    q, k, v, dout = rng.standard_normal((4, 2, 2, 90, 32)).astype(np.float16)
    mask = np.ones((90, 90), bool)
    mask[20:25] = False
    got = list(grads(q, k, v, dout, np.float16, mask=mask))
    got[1] = got[1].copy()
    got[1][0, 0, 3] += np.float16(0.05)
    got[0] = got[0].copy()
    got[0][1, 1, 60] += np.float16(0.05)
    assert_attention_grads_close(got[:3], q, k, v, dout, mask=mask, empty_rows=convention)


def grads_flex():
    rng = np.random.default_rng(34)
    q, k, v, dout = rng.standard_normal((4, 1, 2, 80, 32)).astype(np.float16)
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    wrong = ar.flex_attention_backward(*wide, softcap_score_mod(2.0), causal_mask_mod(), scale=0.2)
    assert_attention_grads_close([g.astype(np.float16) for g in wrong[:3]], q, k, v, dout,
                                 score_mod=softcap_score_mod(2.0), mask_mod=causal_mask_mod())


def grads_scalar_sink():  # dsinks of a scalar sink: "the one element"
    rng = np.random.default_rng(35)
    q, k, v, dout = rng.standard_normal((4, 1, 2, 60, 16)).astype(np.float16)
    wrong = grads(q, k, v, dout, np.float16, sinks=0.9)
    assert_attention_grads_close(wrong, q, k, v, dout, sinks=0.5)


def grads_dbias(shared):
    rng = np.random.default_rng(36)
    q, k, v, dout = rng.standard_normal((4, 2, 2, 70, 16)).astype(np.float16)
    bias = rng.standard_normal((70, 70) if shared else (2, 2, 70, 70)).astype(np.float16)
    got = list(grads(q, k, v, dout, np.float16, bias=bias, is_causal=True))
    got[3] = got[3].copy()
    got[3][..., 50:52, 10] += np.float16(0.1)
    assert_attention_grads_close(got[:4], q, k, v, dout, bias=bias, is_causal=True)


def grads_threaded_size():  # enough work for the checkers' threads
    rng = np.random.default_rng(37)
    q, k, v, dout = rng.standard_normal((4, 2, 4, 384, 32)).astype(np.float16)
    got = list(grads(q, k, v, dout, np.float16, is_causal=True))
    got[2] = got[2].copy()
    got[2][1, 2, 100:104] += np.float16(0.02)
    assert_attention_grads_close(got[:3], q, k, v, dout, is_causal=True)


def output_nonfinite_input():
    q, k, v = qkv(16, np.float16, L=64, S=64)
    q[0, 1, 5, 3] = np.nan
    v[1, 2, 7, 0] = np.inf
    out = sdpa(q, k, v, np.float16)
    out[1, 0, 3] = 0
    assert_attention_close(out, q, k, v)


def paged_nhd_wrong_length():
    rng = np.random.default_rng(40)
    k_pages, v_pages = rng.standard_normal((2, 9, 16, 2, 32)).astype(np.float16)  # NHD pools
    table = np.array([[3, 0, 5, 8], [6, 1, -1, -1], [2, 4, 7, -1]])
    lens = np.array([60, 20, 40])
    q = rng.standard_normal((3, 4, 5, 32)).astype(np.float16)
    options = {"is_causal": True, "causal_alignment": "bottom-right", "enable_gqa": True, "layout": "NHD"}
    wrong = ar.paged_attention(q, k_pages, v_pages, table, lens - np.array([0, 1, 2]), **options)
    assert_paged_attention_close(wrong, q, k_pages, v_pages, table, lens, **options)


def paged_fp8_packed():
    rng = np.random.default_rng(41)
    k_pages, v_pages = rng.standard_normal((2, 6, 2, 8, 32))
    (k8, kd), (v8, vd) = (ar.quantize_fp8(x, per_head=True, axis=1) for x in (k_pages, v_pages))
    table = np.array([[0, 2, 4], [1, 3, 5]])
    lens = np.array([24, 17])
    cu = np.array([0, 3, 7])
    q = rng.standard_normal((2, 7, 32)).astype(np.float32)
    options = {"k_descale": kd, "v_descale": vd, "cu_seqlens_q": cu}
    wrong = ar.paged_attention(q, k8, v8, table, lens, **options | {"softcap": 1.0})
    assert_paged_attention_close(wrong, q, k8, v8, table, lens, **options)


CASES = {
    **{f.__name__: f for f in (
        output_causal_off_by_one, output_nan_and_empty_rows, output_widened, output_textbook_hint,
        output_float64_wrong_scale, output_float32_window_softcap_alibi_sinks, output_bias_and_dropout_mask,
        output_gqa_wrong_heads, output_fp8_descales, output_empty_rows_mean, output_empty_rows_nan,
        output_three_axes, output_two_axes, output_threaded_size, output_flex_score_mod, output_flex_block_mask,
        lse_base_two_read_as_natural, lse_empty_rows_wrong_infinity, lse_dtype_and_sinks,
        grads_softcap_ignored, grads_gqa_sinks_bias, grads_scalar_sink,
        grads_dropout_mask_and_alibi_float32, grads_flex,
        paged_nhd_wrong_length, paged_fp8_packed)},
    **{f"grads_empty_rows_{c}": (lambda c=c: grads_empty_rows(c)) for c in ("zeros", "mean", "nan", "any")},
    "grads_dbias_shared": lambda: grads_dbias(True),
    "grads_dbias_per_head": lambda: grads_dbias(False),
    "grads_threaded_size": grads_threaded_size,
    "output_nonfinite_input": output_nonfinite_input,
}


def message(case) -> str:
    """The AssertionError message of `case`; a case that passes is an error of this test itself."""
    try:
        CASES[case]()
    except AssertionError as exc:
        return str(exc)
    raise RuntimeError(f"case {case} passed its check: it must fail")


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_is_word_for_word_the_record(case):
    record = json.loads(RECORD.read_text())
    assert message(case) == record["messages"][case]


def test_record_covers_every_case_and_every_report_line():
    messages = json.loads(RECORD.read_text())["messages"]
    assert sorted(messages) == sorted(CASES)
    text = "\n".join(messages.values())
    for line in ("elements are too far", "allowed: factor", "largest error", "ratio to the baseline",
                 "non-finite values in actual:", "NaN", "+inf", "-inf", "where they are:", "no allowed key",
                 "more runs of rows", "note: actual is float32", "baseline='textbook'", "sequence 1: ",
                 "dq: ", "dk: ", "dv: ", "dsinks: ", "batch 1, head 2: ", "\nhead 0: ", "the one element",
                 "heads 2-3 (kv head 1): "):
        assert line in text, line


if __name__ == "__main__" and sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
    # python tests/test_testing_reports.py --write COMMIT, with PYTHONPATH a copy of COMMIT's attention_ref
    header = (f"Written by `PYTHONPATH=<attention_ref of commit {sys.argv[2]}> python tests/test_testing_reports.py "
              f"--write {sys.argv[2]}`: the checkers of commit {sys.argv[2]}, before they computed by tiles "
              "(issue 42). Each case's AssertionError message, which the tiled checkers must reproduce exactly.")
    RECORD.write_text(json.dumps({"header": header, "messages": {c: message(c) for c in sorted(CASES)}},
                                 indent=1) + "\n")
