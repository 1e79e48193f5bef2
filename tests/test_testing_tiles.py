"""attention_ref.testing._tiles: the checkers' reference and baseline, one (batch, head) at a time.

The tiled computation must be the whole-array one: the float64 reference to rounding, the baseline number
for number on a problem small enough to run as one task (and to a rounding of its dtype, where BLAS rounds
its products otherwise on one thread). The report text itself is pinned by test_testing_reports.py.
"""

import sys

import numpy as np
import pytest

import attention_ref as ar
from attention_ref._attention_problem import prepare_attention, problem_scores
from attention_ref.testing import assert_attention_close, assert_attention_grads_close
from attention_ref.testing._baseline import naive_attention, naive_backward, naive_forward_arrays
from attention_ref.testing._problem import Problem
from attention_ref.testing._tiles import units

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def problem(seed, dtype, B=2, H=4, Hkv=4, L=96, S=80, E=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k, v = (rng.standard_normal((B, Hkv, S, E)).astype(dtype) for _ in range(2))
    dout = rng.standard_normal((B, H, L, E)).astype(dtype)
    return q, k, v, dout


OPTIONS = {
    "plain": {},
    "causal bottom-right": {"is_causal": True, "causal_alignment": "bottom-right"},
    "window, soft cap": {"window": (20, 3), "softcap": 2.0},
    "alibi, sinks": {"alibi_slopes": np.array([0.1, 0.2, 0.3, 0.4]), "sinks": np.array([0.0, 1.0, -1.0, 2.0])},
    "mask with empty rows": {"mask": np.arange(80) < np.arange(96)[:, None] - 10},
    "bias per head": {"bias": np.random.default_rng(9).standard_normal((4, 96, 80))},
    "dropout mask": {"dropout_p": 0.25, "dropout_mask": np.random.default_rng(8).random((2, 4, 96, 80)) > 0.25},
    "grouped heads": {"enable_gqa": True},
}


def _case(name, L):
    """The options of case `name` at length `L` (the long one runs as units, without (L, S) masks, biases or
    dropout masks) and its number of key/value heads."""
    options = OPTIONS[name]
    if L != 96:
        options = {key: value for key, value in options.items() if key not in ("mask", "bias", "dropout_mask",
                                                                              "dropout_p")}
    return options, 2 if options.get("enable_gqa") else 4


@pytest.mark.parametrize("L", [96, 700], ids=["one task", "units"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_forward_is_the_whole_array_computation(name, L):
    options, Hkv = _case(name, L)
    q, k, v, _ = problem(0, BF16, L=L, Hkv=Hkv)
    check = Problem(q, k, v, options, "test")
    reference, lse, naive = check.forward(BF16, True, magnitude=True)
    wide = [a.astype(np.float64) for a in (q, k, v)]
    want, want_lse = ar.scaled_dot_product_attention(*wide, return_lse=True, **options)
    np.testing.assert_allclose(reference, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-12)
    whole = naive_attention(q, k, v, BF16, options).astype(np.float32)
    if L == 96:  # one task: the same products, the same numbers
        np.testing.assert_array_equal(naive.astype(np.float32), whole)
    else:  # BLAS on one thread may round a product otherwise: at most a rounding of bfloat16 apart
        assert np.max(np.abs(naive.astype(np.float32) - whole)) <= 2.0**-7 * np.max(np.abs(whole))
        assert np.mean(naive.astype(np.float32) == whole) > 0.99
    plain = {key: value for key, value in options.items() if not key.startswith("dropout")}
    scores = problem_scores(prepare_attention(*wide, **plain))
    largest = max(1.0, float(np.max(np.abs(scores[np.isfinite(scores)]))))
    if "softcap" in options:  # the scores before the cap, of the pairs the softmax sees
        uncapped = problem_scores(prepare_attention(*wide, **{**plain, "softcap": None}))
        largest = max(largest, float(np.max(np.abs(uncapped[np.isfinite(scores)]))))
    assert check.score_magnitude() == pytest.approx(largest, rel=1e-12)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "textbook"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_log_sum_exp_pass_is_the_whole_array_computation(name, fused):
    """The log-sum-exp check's baseline stops at the log-sum-exp: the whole forward's, number for number."""
    options, Hkv = _case(name, 96)
    q, k, v, _ = problem(2, BF16, Hkv=Hkv)
    check = Problem(q, k, v, options, "test")
    reference, naive = check.lse_pass(np.dtype(np.float16), fused)
    wide = [a.astype(np.float64) for a in (q, k, v)]
    plain = {key: value for key, value in options.items() if not key.startswith("dropout")}
    np.testing.assert_allclose(reference, ar.scaled_dot_product_attention(*wide, return_lse=True, **plain)[1],
                               rtol=0, atol=1e-12)
    whole = naive_forward_arrays(*wide, np.dtype(np.float16), plain, fused=fused)[5]
    np.testing.assert_array_equal(naive, np.broadcast_to(whole, naive.shape))
    np.testing.assert_array_equal(np.isneginf(naive), np.isneginf(reference))  # the rows with no allowed key


@pytest.mark.parametrize("L", [96, 700], ids=["one task", "units"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_gradients_are_the_whole_array_computation(name, L):
    options, Hkv = _case(name, L)
    q, k, v, dout = problem(1, np.float16, L=L, Hkv=Hkv)
    check = Problem(q, k, v, options, "test")
    reference, lse, baselines = check.grads_pass(dout, [np.dtype(np.float16)], True, dbias="bias" in options)
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    want = ar.attention_backward(*wide, **options)
    plain = {key: value for key, value in options.items() if not key.startswith("dropout")}
    np.testing.assert_allclose(lse, ar.scaled_dot_product_attention(*wide[:3], return_lse=True, **plain)[1],
                               rtol=0, atol=1e-12)
    for got, expected in zip(reference, want, strict=True):
        if expected is None:
            continue
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * max(1.0, np.max(np.abs(expected))))
    whole = naive_backward(q, k, v, dout, np.dtype(np.float16), options)
    for field in ("dq", "dk", "dv", "dbias", "dsinks"):
        got, expected = getattr(baselines[np.dtype(np.float16)], field), getattr(whole, field)
        if expected is None:
            continue
        if L == 96:
            np.testing.assert_array_equal(got, expected, err_msg=field)
        else:
            assert np.max(np.abs(got.astype(np.float32) - expected)) <= 2.0**-9 * np.max(np.abs(expected)), field


def test_a_problem_too_large_for_memory_is_refused_before_any_work():
    q = np.zeros((1, 1, 10**6, 2), np.float16)
    with pytest.raises(ValueError, match=r"\(L, S\) = \(1000000, 1000000\) cannot run: one \(batch, head\) "
                                         r"of its reference and baseline need about 4.47e\+04 GiB"):
        assert_attention_close(q, q, q, q)
    with pytest.raises(ValueError, match=r"\(L, S\) = \(1000000, 1000000\) cannot run"):  # the whole-array path
        assert_attention_close(q.astype(np.float64), q, q, q.astype(np.float64))


@pytest.mark.parametrize("tqdm", [True, False], ids=["tqdm", "without tqdm"])
def test_progress_is_shown_when_asked_and_changes_nothing(tqdm, monkeypatch, capsys):
    if not tqdm:
        monkeypatch.setitem(sys.modules, "tqdm", None)
        monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    else:
        pytest.importorskip("tqdm")
    q, k, v, dout = problem(2, np.float16, L=700, S=700)
    grads = ar.attention_backward(*(a.astype(np.float32) for a in (q, k, v, dout)), is_causal=True)
    grads = [g.astype(np.float16) for g in grads[:3]]
    assert_attention_grads_close(grads, q, k, v, dout, is_causal=True, progress=True)
    shown = capsys.readouterr().err
    assert ("checking" in shown) == tqdm
    assert_attention_grads_close(grads, q, k, v, dout, is_causal=True)
    assert capsys.readouterr().err == ""
    wrong = [g.copy() for g in grads]
    wrong[0][1, 2, 5] += np.float16(0.1)
    with pytest.raises(AssertionError, match=r"^dq: 16 of 89600 elements .*\n.*\n.*\n.*\nwhere they are:\n"
                                             r"batch 1, head 2: row 5 \(16 elements\)$"):
        assert_attention_grads_close(wrong, q, k, v, dout, is_causal=True, progress=True)


GROUPED = {
    "bias per head, dropout mask": lambda rng: {
        "bias": rng.standard_normal((8, 256, 256)), "dropout_p": 0.25,
        "dropout_mask": rng.random((2, 8, 256, 256)) > 0.25},
    "causal, alibi, sinks": lambda rng: {
        "is_causal": True, "alibi_slopes": np.linspace(0.1, 0.8, 8), "sinks": np.linspace(-1.0, 2.0, 8)},
}


@pytest.mark.parametrize("name", list(GROUPED))
def test_groups_of_heads_are_the_whole_array_computation(name, monkeypatch):
    """A problem of 2^20 scores on two threads runs as four tasks of four heads; per-head arrays (bias, dropout
    mask, ALiBi slopes, sinks) follow each group, the bias's gradient sums over them."""
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "2")
    options = GROUPED[name](np.random.default_rng(3))
    q, k, v, dout = problem(4, np.float16, H=8, Hkv=8, L=256, S=256)
    check = Problem(q, k, v, options, "test")
    p = check.variant.prepared(check, ar.attention_backward, options, np.float16)
    tasks = units(p)[0]
    assert [t[-1] for t in tasks] == [slice(0, 4), slice(4, 8)] * 2 and [t[0] for t in tasks] == [0, 0, 1, 1]
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    reference, _, naive = check.forward(np.dtype(np.float16), True)
    np.testing.assert_allclose(reference, ar.scaled_dot_product_attention(*wide[:3], **options), rtol=0, atol=1e-13)
    whole = naive_attention(q, k, v, np.dtype(np.float16), options).astype(np.float32)
    assert np.max(np.abs(naive.astype(np.float32) - whole)) <= 2.0**-10 * np.max(np.abs(whole))
    grads, _, baselines = check.grads_pass(dout, [np.dtype(np.float16)], True, dbias="bias" in options)
    want = ar.attention_backward(*wide, **options)
    whole = naive_backward(q, k, v, dout, np.dtype(np.float16), options)
    for field in ("dq", "dk", "dv", "dbias", "dsinks"):
        if getattr(want, field) is None:
            continue
        expected = getattr(want, field)
        np.testing.assert_allclose(getattr(grads, field), expected, rtol=0,
                                   atol=1e-12 * max(1.0, np.max(np.abs(expected))), err_msg=field)
        got, base = getattr(baselines[np.dtype(np.float16)], field).astype(np.float32), getattr(whole, field)
        assert np.max(np.abs(got - base)) <= 2.0**-9 * np.max(np.abs(base)), field


@pytest.mark.parametrize("H, L, tasks", [(4, 128, None), (8, 256, [slice(0, 4), slice(4, 8)]),
                                         (4, 512, [slice(h, h + 1) for h in range(4)])])
def test_short_heads_are_grouped_up_to_a_task_s_worth(H, L, tasks, monkeypatch):
    """One batch entry on two threads: below `THREADED_SCORES` one task computes every head; heads of 256 x 256
    scores go four to a task (`TASK_SCORES`), longer ones one to a task; the baseline is the whole-array
    computation's, the reference the package's."""
    monkeypatch.setenv("ATTENTION_REF_NUM_THREADS", "2")
    q, k, v, _ = problem(5, BF16, B=1, H=H, Hkv=H, L=L, S=L)
    check = Problem(q, k, v, {"is_causal": True}, "test")
    p = check.variant.prepared(check, ar.scaled_dot_product_attention, {"is_causal": True}, BF16)
    assert [None if t is None else t[-1] for t in units(p)[0]] == (tasks or [None])
    reference, _, naive = check.forward(BF16, True)
    wide = [a.astype(np.float64) for a in (q, k, v)]
    np.testing.assert_allclose(reference, ar.scaled_dot_product_attention(*wide, is_causal=True), rtol=0, atol=1e-13)
    whole = naive_attention(q, k, v, BF16, {"is_causal": True}).astype(np.float32)
    assert np.max(np.abs(naive.astype(np.float32) - whole)) <= 2.0**-7 * np.max(np.abs(whole))


def test_query_blocks_the_window_gives_no_key_are_zeros_and_minus_infinity():
    """Rows 68 on see no key of the window (4, 0) over 64 keys: their blocks write zeros and -inf (the results
    start unset), and the gradients of those rows are zeros."""
    q, k, v, dout = problem(5, np.float16, L=256, S=64)
    options = {"window": (4, 0)}
    check = Problem(q, k, v, options, "test")
    reference, lse, _ = check.forward(np.dtype(np.float16), True)
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    want, want_lse = ar.scaled_dot_product_attention(*wide[:3], return_lse=True, **options)
    assert np.all(reference[..., 68:, :] == 0) and np.all(lse[..., 68:] == -np.inf)
    np.testing.assert_allclose(reference, want, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(lse[..., 68:], want_lse[..., 68:])
    grads = check.grads_pass(dout, [np.dtype(np.float16)], True, dbias=False)[0]
    assert np.all(grads.dq[..., 68:, :] == 0)
    np.testing.assert_allclose(grads.dq, ar.attention_backward(*wide, **options).dq, rtol=0, atol=1e-12)
