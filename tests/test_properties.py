"""Property-based tests (hypothesis) for softmax, masks and scaled_dot_product_attention."""

import os
from contextlib import contextmanager

import numpy as np
import pytest
from conftest import require

from attention_ref import (
    causal_mask,
    log_softmax,
    logsumexp,
    mask_to_bias,
    scaled_dot_product_attention,
    softmax,
)

try:  # without hypothesis: the module skips locally; in CI require fails, and so does the collection
    require("hypothesis")
except pytest.skip.Exception as exc:
    pytest.skip(str(exc), allow_module_level=True)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

dims = st.integers(min_value=1, max_value=5)
moderate = st.floats(min_value=-30, max_value=30, allow_nan=False, width=64)
wide = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, width=64)


def arrays(shape, elements=moderate):
    return hnp.arrays(np.float64, shape, elements=elements)


@st.composite
def matrices(draw, elements=moderate):
    return draw(arrays((draw(dims), draw(dims)), elements))


@st.composite
def attention_inputs(draw, heads=False):
    """Random (q, k, v, mask) with small shapes; the mask may have fully masked rows.

    Hypothesis draws the shapes, a seed and the mask density; NumPy draws the
    values (much faster than element-wise strategies, still reproducible).
    """
    L, S, E, Ev = draw(dims), draw(dims), draw(dims), draw(dims)
    batch = (draw(st.integers(1, 3)),) if heads else ()
    gen = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    spread = draw(st.sampled_from([0.1, 1.0, 3.0]), label="spread")
    q = gen.normal(scale=spread, size=(*batch, L, E))
    k = gen.normal(scale=spread, size=(*batch, S, E))
    v = gen.normal(size=(*batch, S, Ev))
    mask = gen.random((L, S)) < draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]), label="density")
    return q, k, v, mask


# --- softmax ----------------------------------------------------------------


@given(matrices(wide), st.sampled_from([0, 1, -1]))
def test_softmax_rows_sum_to_one_and_lie_in_unit_interval(x, axis):
    w = softmax(x, axis=axis)
    assert np.all((w >= 0) & (w <= 1))
    np.testing.assert_allclose(w.sum(axis=axis), 1.0, rtol=1e-12)


@given(matrices(wide), st.floats(-1e3, 1e3))
def test_softmax_is_shift_invariant_per_row(x, c):
    shift = np.arange(x.shape[0])[:, None] * c  # a different constant per row
    np.testing.assert_allclose(softmax(x + shift), softmax(x), rtol=1e-9, atol=1e-12)


@given(matrices(wide))
def test_log_softmax_is_log_of_softmax(x):
    w, lw = softmax(x), log_softmax(x)
    np.testing.assert_allclose(np.exp(lw), w, rtol=1e-10, atol=1e-300)
    visible = w > 1e-300  # where log(softmax) is finite and not denormal
    np.testing.assert_allclose(lw[visible], np.log(w[visible]), rtol=1e-10, atol=1e-10)
    assert np.all(lw <= 0)


@given(matrices(st.floats(-50, 50)))
def test_logsumexp_matches_direct_computation(x):
    # With |x| <= 50 the unshifted sum neither overflows nor underflows in float64.
    np.testing.assert_allclose(logsumexp(x), np.log(np.sum(np.exp(x), axis=-1)), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(softmax(x), np.exp(x - logsumexp(x, keepdims=True)), rtol=1e-12, atol=1e-300)


# --- masks ------------------------------------------------------------------


@given(dims, dims, st.sampled_from(["top-left", "bottom-right"]))
def test_causal_mask_definition(L, S, alignment):
    m = causal_mask(L, S, alignment=alignment)
    offset = 0 if alignment == "top-left" else S - L
    for i in range(L):
        for j in range(S):
            assert m[i, j] == (j <= i + offset)


# --- attention --------------------------------------------------------------


@given(attention_inputs(heads=True))
def test_sdpa_weights_rows_sum_to_one_or_zero(inputs):
    q, k, v, mask = inputs
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    sums = w.sum(-1)
    empty = ~mask.any(-1)  # (L,)
    np.testing.assert_allclose(sums[..., ~empty], 1.0, rtol=1e-12)
    np.testing.assert_array_equal(sums[..., empty], 0.0)
    np.testing.assert_array_equal(out[..., empty, :], 0.0)


@st.composite
def biases(draw, shape):
    """None, or a small (L, S) bias plus offsets of 0 or +-1e3 (constant or per row), some keys padded.

    Padded keys get ``np.finfo(float64).min``; a row may be padded throughout (a finite bias: uniform weights).
    """
    if not draw(st.booleans(), label="with bias"):
        return None
    L, S = shape
    bias = np.linspace(-1, 1, L * S).reshape(L, S)
    offsets = st.sampled_from([0.0, -1e3, 1e3])
    if draw(st.booleans(), label="per-row offsets"):
        bias += draw(hnp.arrays(np.float64, (L, 1), elements=offsets), label="offsets")
    else:
        bias += draw(offsets, label="offset")
    padded = draw(hnp.arrays(np.bool_, (1, S), elements=st.booleans()), label="padded keys")
    return np.where(padded, np.finfo(np.float64).min, bias)


@given(attention_inputs(heads=True), st.sampled_from([None, 0.0, 0.3, 2.0]), st.data())
def test_sdpa_equals_independent_float64_formula(reference_attention, inputs, scale, data):
    q, k, v, mask = inputs
    bias = data.draw(biases(mask.shape), label="bias")
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=scale, return_weights=True)
    ref_out, ref_w = reference_attention(q, k, v, allowed=mask, bias=bias, scale=scale)
    # Adding an offset of 1e3 rounds the scores to about 1e3 * eps.
    big = 0.0 if bias is None else np.abs(bias[bias > np.finfo(np.float64).min]).max(initial=0.0)
    tol = 1.0 + big / 10
    np.testing.assert_allclose(w, ref_w, rtol=1e-12 * tol, atol=1e-14 * tol)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12 * tol, atol=1e-13 * tol)


@given(attention_inputs(), st.permutations(range(6)), st.permutations(range(6)))
def test_permutation_equivariance(inputs, rows, cols):
    """Without positions, attention is a function of sets: permuting queries permutes
    the output rows, permuting keys together with values (and mask columns) changes nothing."""
    q, k, v, mask = inputs
    rows = [i for i in rows if i < q.shape[0]]
    cols = [j for j in cols if j < k.shape[0]]
    out = scaled_dot_product_attention(q, k, v, mask=mask)
    permuted_queries = scaled_dot_product_attention(q[rows], k, v, mask=mask[rows])
    np.testing.assert_allclose(permuted_queries, out[rows], rtol=1e-13, atol=1e-14)
    permuted_keys = scaled_dot_product_attention(q, k[cols], v[cols], mask=mask[:, cols])
    np.testing.assert_allclose(permuted_keys, out, rtol=1e-12, atol=1e-13)


@given(attention_inputs(), st.sampled_from(["top-left", "bottom-right"]), st.data())
def test_causal_attention_does_not_leak_the_future(inputs, alignment, data):
    q, k, v, _ = inputs
    L, S = q.shape[0], k.shape[0]
    cut = data.draw(st.integers(0, S - 1), label="first changed key")
    k2, v2 = k.copy(), v.copy()
    k2[cut:] += data.draw(st.floats(0.5, 5.0), label="perturbation")
    v2[cut:] -= 1.0
    a = scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment=alignment)
    b = scaled_dot_product_attention(q, k2, v2, is_causal=True, causal_alignment=alignment)
    offset = 0 if alignment == "top-left" else S - L
    unaffected = np.arange(L) + offset < cut  # query i sees keys up to i + offset
    np.testing.assert_array_equal(a[unaffected], b[unaffected])


@given(st.integers(1, 3), st.integers(1, 3), dims, dims, dims, st.integers(0, 2**32 - 1))
def test_gqa_equals_repeated_heads(n_kv, group, L, S, E, seed):
    gen = np.random.default_rng(seed)
    q = gen.normal(size=(2, n_kv * group, L, E))
    k = gen.normal(size=(2, n_kv, S, E))
    v = gen.normal(size=(2, n_kv, S, 2))
    got = scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    want = scaled_dot_product_attention(q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1), is_causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


@given(attention_inputs(heads=True))
@settings(max_examples=25)
def test_mask_to_bias_as_bias_equals_mask(inputs):
    q, k, v, mask = inputs
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v, bias=mask_to_bias(mask)),
        scaled_dot_product_attention(q, k, v, mask=mask),
        rtol=1e-14,
        atol=1e-15,
    )


# --- softcap, window, ALiBi and sinks ------------------------------------------
# The options spelt out in plain NumPy live in tests/plain_options.py (no attention_ref inside).

alignments = st.sampled_from(["top-left", "bottom-right"])
window_sides = st.one_of(st.none(), st.integers(0, 6))


@st.composite
def options(draw, heads):
    """A random subset of the new options for `heads` heads, with causality and an alignment."""
    chosen = {"is_causal": draw(st.booleans(), label="is_causal"), "causal_alignment": draw(alignments)}
    if draw(st.booleans(), label="with window"):
        chosen["window"] = (draw(window_sides, label="left"), draw(window_sides, label="right"))
    if draw(st.booleans(), label="with softcap"):
        chosen["softcap"] = draw(st.floats(0.1, 50.0), label="softcap")
    if draw(st.booleans(), label="with ALiBi"):
        chosen["alibi_slopes"] = draw(arrays((heads,), st.floats(-1e3, 1e3)), label="slopes")
    if draw(st.booleans(), label="with sinks"):
        chosen["sinks"] = draw(arrays((heads,), st.floats(-1e3, 1e3)), label="sinks")
    return chosen


@given(attention_inputs(heads=True), st.tuples(window_sides, window_sides), alignments, st.booleans())
def test_window_equals_its_explicit_mask(inputs, window, alignment, is_causal):
    from plain_options import window_allowed

    q, k, v, mask = inputs
    allowed = window_allowed(q.shape[-2], k.shape[-2], window, alignment, is_causal)
    kwargs = {"is_causal": is_causal, "causal_alignment": alignment}
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, window=window, return_weights=True, **kwargs)
    explicit_out, explicit_w = scaled_dot_product_attention(q, k, v, mask=mask & allowed, return_weights=True)
    np.testing.assert_allclose(out, explicit_out, rtol=0, atol=1e-14)
    np.testing.assert_allclose(w, explicit_w, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(w[..., ~allowed], 0.0)


@given(attention_inputs(heads=True), st.data())
def test_sinks_equal_one_more_key_with_a_zero_value(inputs, data):
    """The sink of head h is key S with score s_h (a zero key plus a bias of s_h), value 0, never masked."""
    from plain_options import alibi_plain, window_allowed

    q, k, v, mask = inputs
    H, L, S = q.shape[0], q.shape[-2], k.shape[-2]
    chosen = data.draw(options(H), label="options")
    sinks = chosen.setdefault("sinks", data.draw(arrays((H,), st.floats(-30.0, 30.0)), label="sinks"))
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True, **chosen)
    # The window and ALiBi, written out for the S real keys only, so that they leave key S alone.
    alignment = chosen["causal_alignment"]
    allowed = mask & window_allowed(L, S, chosen.get("window"), alignment, chosen["is_causal"])
    bias = np.zeros((H, L, S)) if "alibi_slopes" not in chosen else alibi_plain(chosen["alibi_slopes"], L, S, alignment)
    extended = scaled_dot_product_attention(
        q,
        np.concatenate([k, np.zeros((H, 1, k.shape[-1]))], axis=-2),
        np.concatenate([v, np.zeros((H, 1, v.shape[-1]))], axis=-2),
        mask=np.concatenate([np.broadcast_to(allowed, (H, L, S)), np.ones((H, L, 1), dtype=bool)], axis=-1),
        bias=np.concatenate([bias, np.broadcast_to(sinks[:, None, None], (H, L, 1))], axis=-1),
        softcap=chosen.get("softcap"),
        return_weights=True,
    )
    np.testing.assert_allclose(out, extended[0], rtol=0, atol=1e-13)
    np.testing.assert_allclose(w, extended[1][..., :S], rtol=0, atol=1e-14)
    # Below one up to the rounding of S weights (a sink of exp(-40) of the row rounds away).
    assert np.all(w.sum(-1) <= 1 + S * np.finfo(w.dtype).eps)


@given(attention_inputs(heads=True), st.data())
def test_options_equal_the_independent_formula(reference_attention, inputs, data):
    from plain_options import reference_with_options

    q, k, v, mask = inputs
    chosen = data.draw(options(q.shape[0]), label="options")
    if data.draw(st.booleans(), label="with bias"):
        shape = data.draw(st.sampled_from([(k.shape[-2],), (q.shape[-2], 1), (q.shape[0], 1, k.shape[-2])]))
        chosen["bias"] = data.draw(arrays(shape, st.floats(-1e3, 1e3)), label="bias")
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True, **chosen)
    ref_out, ref_w, _ = reference_with_options(reference_attention, q, k, v, mask=mask, **chosen)
    # Scores up to about 1e3 * 5 carry rounding of about 5e3 * eps into each exponent: the weights' error scales.
    tol = 1e-13 * max(1.0, *(np.abs(chosen.get(n, 0.0)).max(initial=0.0) for n in ("alibi_slopes", "sinks", "bias")))
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=tol)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * np.abs(v).max(initial=1.0))


@given(attention_inputs(heads=True), st.sampled_from(["float16", "bfloat16"]), st.data())
def test_low_precision_kernels_stay_within_the_checkers_rounding_budget(inputs, name, data):
    """A precision check, not a correctness one: the checkers' float64 reference is the package itself, so this
    shows that the package's blockwise forward and tiled backward in float16/bfloat16, every option drawn, round
    no worse than FlashAttention's 2x rule allows. Correctness of the float64 results is checked against the
    independent formula (test_properties_blockwise.py, test_properties_backward.py) and PyTorch."""
    from attention_ref import attention_backward, blockwise_attention
    from attention_ref.testing import assert_attention_close, assert_attention_grads_close

    dtype = np.dtype(require("ml_dtypes").bfloat16) if name == "bfloat16" else np.dtype(name)
    q, k, v, mask = inputs
    chosen = {key: (val.astype(dtype) if isinstance(val, np.ndarray) else val)
              for key, val in data.draw(options(q.shape[0]), label="options").items()}
    if data.draw(st.booleans(), label="with bias"):
        size = data.draw(st.sampled_from([30.0, 3e4]), label="bias size")  # 3e4: near float16's largest, 65504
        chosen["bias"] = data.draw(arrays((q.shape[-2], k.shape[-2]), st.floats(-size, size)), label="bias").astype(
            dtype)
    loud = data.draw(st.sampled_from([1.0, 10.0]), label="query size")  # 10: |scores| of hundreds, exp overflows
    q, k, v = (a.astype(dtype) for a in (q * loud, k, v))
    dout = np.random.default_rng(q.size).standard_normal((*q.shape[:-1], v.shape[-1])).astype(dtype)
    block = data.draw(st.integers(1, 4), label="block")
    assert_attention_close(blockwise_attention(q, k, v, mask=mask, block_size=block, **chosen), q, k, v, mask=mask,
                           **chosen)
    grads = attention_backward(q, k, v, dout, mask=mask, block_size=block, **chosen)
    assert_attention_grads_close(grads, q, k, v, dout, mask=mask, **chosen)


# --- large calls: the dense kernel's bound, one-task and threaded paths ---------------------------------------


@contextmanager
def threads(n):
    """ATTENTION_REF_NUM_THREADS set to `n` for the calls inside (the kernel reads it on every call)."""
    before = os.environ.get("ATTENTION_REF_NUM_THREADS")
    os.environ["ATTENTION_REF_NUM_THREADS"] = str(n)
    try:
        yield
    finally:
        if before is None:
            del os.environ["ATTENTION_REF_NUM_THREADS"]
        else:
            os.environ["ATTENTION_REF_NUM_THREADS"] = before


@st.composite
def large_problems(draw):
    """Few values, many scores, broadcast. "one task": q (1, L, E) against k and v (H, S, E), past the kernel's
    16,384 scores (below it the kernel always shifts) and small enough for one block of every head
    (`_kernel._one_task`). "threaded": q (8, 1, L, E) against (1, 8, S, E), past 2^20 entries of work (below it
    the threads are not used). Query sizes from tiny to |scores| of thousands: both sides of the bound
    exp_limit (22 in float32, 177 in float64), in every head or in some heads only."""
    path = draw(st.sampled_from(["one task", "threaded"]), label="path")
    L, S = draw(st.integers(96, 160), label="L"), draw(st.integers(96, 160), label="S")
    E, Ev = draw(st.sampled_from([2, 8, 16]), label="E"), draw(st.integers(1, 4), label="Ev")
    H = draw(st.integers(2, 8), label="H") if path == "one task" else 8
    q_batch, kv_batch = ((1,), (H,)) if path == "one task" else ((8, 1), (1, H))
    gen = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    q = gen.normal(size=(*q_batch, L, E)) * draw(st.sampled_from([0.05, 1.0, 5.0]), label="query size")
    loud = draw(st.sampled_from([1.0, 10.0, 40.0]), label="loud")
    k = gen.normal(size=(*kv_batch, S, E)) * gen.choice([1.0, loud], size=(*kv_batch, 1, 1))  # some heads loud
    v = gen.normal(size=(*kv_batch, S, Ev))
    return q, k, v


@settings(max_examples=12)
@given(large_problems(), st.sampled_from([np.float32, np.float64]), st.sampled_from([1, 2]), st.booleans())
def test_large_broadcast_calls_equal_the_independent_formula(reference_attention, problem, dtype, n_threads,
                                                             is_causal):
    q, k, v = (a.astype(dtype) for a in problem)
    with threads(n_threads):
        out = scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert out.shape == (*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], v.shape[-1])
    assert out.dtype == dtype
    allowed = causal_mask(q.shape[-2], k.shape[-2]) if is_causal else None
    want, _ = reference_attention(q, k, v, allowed=allowed)
    # The scores carry about |score| eps of rounding into each weight's exponent, in the input's dtype.
    scores = np.abs(q.astype(np.float64) @ np.swapaxes(k, -1, -2)).max() / np.sqrt(q.shape[-1])
    tol = 16 * float(np.finfo(dtype).eps) * max(1.0, scores) * np.abs(v).max()
    np.testing.assert_allclose(out, want, rtol=0, atol=tol)
