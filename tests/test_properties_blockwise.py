"""Hypothesis properties: blockwise == dense, merging a key split == full, decoding == full causal."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import attention_ref as ar

ATOL = 1e-12
SETTINGS = settings(max_examples=60, deadline=None)

block_sizes = st.one_of(
    st.integers(1, 12),
    st.tuples(st.integers(1, 12), st.integers(1, 12)),
)


@st.composite
def problems(draw, padding=True):
    """Random float64 q, k, v (broadcast batch axes), optional mask / bias / causal / scale.

    The bias may carry offsets of +-1e3 (constant or per row) and, with `padding`, keys padded with
    ``np.finfo(float64).min``.
    """
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    L, S = draw(st.integers(1, 10)), draw(st.integers(1, 10))
    E, Ev = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    # Each array keeps some batch axes or broadcasts them (size one or missing).
    q_batch = tuple(draw(st.sampled_from([n, 1])) for n in batch)
    k_batch = tuple(draw(st.sampled_from([n, 1])) for n in batch)
    kwargs = {
        "is_causal": draw(st.booleans()),
        "causal_alignment": draw(st.sampled_from(["top-left", "bottom-right"])),
    }
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(0.0, 3.0))
    if draw(st.booleans()):
        kwargs["mask"] = rng.random((*batch, L, S)) < draw(st.floats(0.0, 1.0))
    if draw(st.booleans()):
        bias = 3.0 * rng.standard_normal(draw(st.sampled_from([(L, S), (L, 1), (1, S), (*batch, L, S)])))
        offset_shape = draw(st.sampled_from([(), (L, 1)]), label="offset shape")  # constant or per row
        bias = bias + rng.choice(draw(st.sampled_from([[0.0], [-1e3, 1e3], [-1e3, 0.0, 1e3]])), offset_shape)
        if padding and draw(st.booleans(), label="padding"):
            bias = np.where(rng.random(S) < 0.4, np.finfo(np.float64).min, bias)
        kwargs["bias"] = bias
    q = 2.0 * rng.standard_normal((*q_batch, L, E))
    k = 2.0 * rng.standard_normal((*k_batch, S, E))
    v = rng.standard_normal((*k_batch, S, Ev))
    return q, k, v, kwargs


def tolerance(kwargs):
    """ATOL, grown with the largest finite bias: adding 1e3 rounds the scores to about 1e3 * eps."""
    bias = np.asarray(kwargs.get("bias", 0.0))
    return ATOL + 16 * np.finfo(np.float64).eps * np.abs(bias[bias > np.finfo(np.float64).min]).max(initial=0.0)


def reference_lse(q, k, kwargs):
    """Log-sum-exp of the scaled, biased scores over allowed keys, from the dense pieces."""
    L, S = q.shape[-2], k.shape[-2]
    scale = kwargs.get("scale", 1.0 / np.sqrt(q.shape[-1]))
    scores = (q @ np.swapaxes(k, -1, -2)) * scale + kwargs.get("bias", 0.0)
    allowed = kwargs.get("mask", np.ones((L, S), dtype=bool))
    if kwargs["is_causal"]:
        allowed = allowed & ar.causal_mask(L, S, alignment=kwargs["causal_alignment"])
    return ar.logsumexp(np.where(allowed, scores, -np.inf))


@SETTINGS
@given(problems(), block_sizes)
def test_blockwise_equals_dense(problem, block):
    q, k, v, kwargs = problem
    out, lse = ar.blockwise_attention(q, k, v, block_size=block, return_lse=True, **kwargs)
    dense = ar.scaled_dot_product_attention(q, k, v, **kwargs)
    assert out.shape == dense.shape
    tol = tolerance(kwargs)
    np.testing.assert_allclose(out, dense, rtol=0, atol=tol)
    np.testing.assert_allclose(lse, np.broadcast_to(reference_lse(q, k, kwargs), lse.shape), rtol=0, atol=tol)


@SETTINGS
@given(problems(padding=False), st.data())
def test_merging_a_random_key_split_equals_full_attention(problem, data):
    # No padded keys: a row whose allowed keys are all padded has the lse finfo.min + log(n) in every group of n
    # keys, rounded to finfo.min, so the merge would weigh the groups equally instead of by their sizes.
    q, k, v, kwargs = problem
    tol = tolerance(kwargs)
    L, S = q.shape[-2], k.shape[-2]
    # Fold causality into an explicit mask so that it can be split by key columns.
    allowed = kwargs.pop("mask", None)
    if kwargs.pop("is_causal"):
        causal = ar.causal_mask(L, S, alignment=kwargs["causal_alignment"])
        allowed = causal if allowed is None else allowed & causal
    bias = kwargs.pop("bias", None)
    bias = None if bias is None else np.broadcast_to(bias, np.broadcast_shapes(bias.shape, (L, S)))
    kwargs.pop("causal_alignment")
    # Assign every key to one of n groups (some groups may be empty).
    n = data.draw(st.integers(1, 4))
    labels = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=S, max_size=S)))
    outs, lses = [], []
    for g in range(n):
        cols = np.flatnonzero(labels == g)
        part_mask = None if allowed is None else allowed[..., cols]
        part_bias = None if bias is None else bias[..., cols]
        o, s = ar.blockwise_attention(
            q,
            k[..., cols, :],
            v[..., cols, :],
            mask=part_mask,
            bias=part_bias,
            block_size=3,
            return_lse=True,
            **kwargs,
        )
        outs.append(o)
        lses.append(s)
    out, lse = ar.merge_attention(outs, lses)
    full = ar.scaled_dot_product_attention(q, k, v, mask=allowed, bias=bias, **kwargs)
    merged_problem = {"is_causal": False, **kwargs}  # kwargs now holds at most `scale`
    if allowed is not None:
        merged_problem["mask"] = allowed
    if bias is not None:
        merged_problem["bias"] = bias
    full_lse = reference_lse(q, k, merged_problem)
    np.testing.assert_allclose(out, full, rtol=0, atol=tol)
    np.testing.assert_allclose(lse, np.broadcast_to(full_lse, lse.shape), rtol=0, atol=tol)


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    steps=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    heads=st.sampled_from([(1, 1), (2, 2), (4, 2), (3, 1)]),
    E=st.integers(1, 4),
)
def test_kv_cache_decoding_equals_full_causal_attention(seed, steps, heads, E):
    rng = np.random.default_rng(seed)
    hq, hkv = heads
    n = sum(steps)
    q = rng.standard_normal((2, hq, n, E))
    k = rng.standard_normal((2, hkv, n, E))
    v = rng.standard_normal((2, hkv, n, 3))
    full = ar.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    cache = ar.KVCache()
    start = 0
    for t in steps:
        stop = start + t
        out = ar.decode_step(
            q[..., start:stop, :], k[..., start:stop, :], v[..., start:stop, :], cache, enable_gqa=True
        )
        np.testing.assert_allclose(out, full[..., start:stop, :], rtol=0, atol=ATOL)
        start = stop
    assert len(cache) == n
    np.testing.assert_array_equal(cache.keys, k)


# ---------------------------------------------------------------- softcap, window, ALiBi, sinks

window_sides = st.one_of(st.none(), st.integers(0, 6))


@st.composite
def option_problems(draw, padding=True):
    """`problems` plus a random subset of window, softcap, ALiBi slopes and sinks (per head or per batch)."""
    q, k, v, kwargs = draw(problems(padding=padding))
    heads = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], np.shape(kwargs.get("mask", 0))[:-2],
                                np.shape(kwargs.get("bias", 0))[:-2])
    per_head = st.sampled_from([(), heads[-1:], heads])  # what the slopes and sinks may be shaped
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="option seed"))
    if draw(st.booleans(), label="with window"):
        kwargs["window"] = (draw(window_sides, label="left"), draw(window_sides, label="right"))
    if draw(st.booleans(), label="with softcap"):
        kwargs["softcap"] = draw(st.floats(0.1, 50.0), label="softcap")
    if draw(st.booleans(), label="with ALiBi"):
        kwargs["alibi_slopes"] = rng.uniform(-1.0, 2.0, draw(per_head, label="slopes shape"))
    if draw(st.booleans(), label="with sinks"):
        kwargs["sinks"] = rng.uniform(-30.0, 30.0, draw(per_head, label="sinks shape"))
    return q, k, v, kwargs


def tolerance_with_options(kwargs):
    """`tolerance`, grown with ALiBi terms (up to 2 x 10 keys) and sinks (up to 30) as with a bias."""
    sinks, slopes = np.abs(kwargs.get("sinks", 0.0)), np.abs(kwargs.get("alibi_slopes", 0.0))
    big = sinks.max(initial=0.0) + 20 * slopes.max(initial=0.0)
    return tolerance(kwargs) + 16 * np.finfo(np.float64).eps * big


@SETTINGS
@given(option_problems(), block_sizes)
def test_blockwise_equals_dense_with_every_option(reference_attention, problem, block):
    from plain_options import reference_with_options

    q, k, v, kwargs = problem
    out, lse = ar.blockwise_attention(q, k, v, block_size=block, return_lse=True, **kwargs)
    dense = ar.scaled_dot_product_attention(q, k, v, **kwargs)
    tol = tolerance_with_options(kwargs)
    np.testing.assert_allclose(out, dense, rtol=0, atol=tol)
    _, _, expected_lse = reference_with_options(reference_attention, q, k, v, **kwargs)
    np.testing.assert_allclose(lse, np.broadcast_to(expected_lse, lse.shape), rtol=0, atol=tol)


@SETTINGS
@given(option_problems(padding=False), st.data())
def test_merging_a_key_split_with_the_sinks_folded_in_once(problem, data):
    """Parts over disjoint keys computed without sinks, merged with them: one call over every key."""
    from plain_options import alibi_plain, window_allowed

    q, k, v, kwargs = problem
    L, S = q.shape[-2], k.shape[-2]
    tol = tolerance_with_options(kwargs)
    full, full_lse = ar.blockwise_attention(q, k, v, return_lse=True, **kwargs)
    # Everything positional becomes an explicit mask and bias that can be split by key columns.
    alignment = kwargs.pop("causal_alignment")
    allowed = window_allowed(L, S, kwargs.pop("window", None), alignment, kwargs.pop("is_causal"))
    allowed = allowed & kwargs.pop("mask", True)
    bias = kwargs.pop("bias", 0.0) + alibi_plain(kwargs.pop("alibi_slopes", 0.0), L, S, alignment)
    shape = np.broadcast_shapes(allowed.shape, bias.shape)
    allowed, bias = np.broadcast_to(allowed, shape), np.broadcast_to(bias, shape)
    sinks = kwargs.pop("sinks", None)
    n = data.draw(st.integers(1, 4))
    labels = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=S, max_size=S)))
    outs, lses = [], []
    for g in range(n):
        cols = np.flatnonzero(labels == g)
        o, s = ar.blockwise_attention(
            q, k[..., cols, :], v[..., cols, :], mask=allowed[..., cols], bias=bias[..., cols], block_size=3,
            return_lse=True, **kwargs,
        )
        outs.append(o)
        lses.append(s)
    out, lse = ar.merge_attention(outs, lses, sinks=sinks)
    np.testing.assert_allclose(out, full, rtol=0, atol=tol)
    np.testing.assert_allclose(lse, full_lse, rtol=0, atol=tol)
