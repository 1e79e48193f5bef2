"""attention_backward: central finite differences of an independent forward, dense against tiled, identities.

The finite differences differentiate ``tests/plain_options.py``'s independent float64 formula (it never calls
attention_ref), so a wrong gradient cannot hide behind a wrong forward; the forward itself is checked against
PyTorch elsewhere. Conformance with PyTorch and JAX autograd is in ``test_conformance_backward_*.py``.
"""

import copy
import inspect
import warnings

import numpy as np
import pytest
from conftest import require
from plain_options import reference_with_options

from attention_ref import (
    AttentionGrads,
    attention_backward,
    blockwise_attention,
    scaled_dot_product_attention,
)

B, H, L, S, E, EV = 2, 2, 4, 5, 3, 2

#: Option name -> a function of a generator giving the options (arrays drawn from it). Every forward option.
OPTIONS = {
    "plain": lambda g: {},
    "causal": lambda g: {"is_causal": True},
    "causal bottom-right": lambda g: {"is_causal": True, "causal_alignment": "bottom-right"},
    "bool mask": lambda g: {
        "mask": np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 1], [0, 1, 1, 0, 1]], bool)
    },
    "bias": lambda g: {"bias": g.standard_normal((H, 1, S))},
    "full bias": lambda g: {"bias": g.standard_normal((B, H, L, S))},
    "window": lambda g: {"window": (1, 1)},
    "window bottom-right": lambda g: {"window": (2, 0), "causal_alignment": "bottom-right"},
    "scale": lambda g: {"scale": 0.7},
    "softcap": lambda g: {"softcap": 1.5, "scale": 2.0},
    "alibi": lambda g: {"alibi_slopes": np.array([0.5, 0.25])},
    "sinks": lambda g: {"sinks": g.standard_normal(H)},
    "gqa": lambda g: {"enable_gqa": True},
    "everything": lambda g: {
        "is_causal": True,
        "causal_alignment": "bottom-right",
        "bias": g.standard_normal((L, S)),
        "window": (2, None),
        "softcap": 2.0,
        "alibi_slopes": np.array([0.3, 0.1]),
        "sinks": g.standard_normal((B, H)),
    },
}
#: Options whose forward takes dropout (with a generator made from `DROPOUT_SEED` each time).
DROPOUT = {
    "dropout": {"dropout_p": 0.3},
    "dropout with everything": {
        "dropout_p": 0.5,
        "is_causal": True,
        "sinks": np.array([0.2, -0.3]),
        "bias": np.linspace(-1.0, 1.0, L * S).reshape(L, S),
        "softcap": 2.0,
        "window": (1, None),
    },
}
DROPOUT_SEED = 11


def problem(name, seed=0):
    """``(q, k, v, dout, options)`` for the option `name`, float64; GQA gives k and v half of q's heads."""
    g = np.random.default_rng(seed)
    options = OPTIONS[name](g)
    hk = H // 2 if options.get("enable_gqa") else H
    q = g.standard_normal((B, H, L, E))
    k = g.standard_normal((B, hk, S, E))
    v = g.standard_normal((B, hk, S, EV))
    dout = g.standard_normal((B, H, L, EV))
    return q, k, v, dout, options


def plain_loss(q, k, v, dout, options):
    """``sum(dout * out)`` with `out` from the independent float64 formula."""
    from conftest import _reference_attention

    out, _, _ = reference_with_options(_reference_attention, q, k, v, **options)
    return float(np.sum(dout * out))


def central_difference(f, x, h=1e-6):
    """``df/dx`` of a scalar function by central differences, one entry at a time."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


def numeric_grads(q, k, v, dout, options, loss=plain_loss):
    """Central-difference gradients of ``sum(dout * attention)`` for q, k, v and, if given, bias and sinks."""
    grads = {
        "dq": central_difference(lambda x: loss(x, k, v, dout, options), q),
        "dk": central_difference(lambda x: loss(q, x, v, dout, options), k),
        "dv": central_difference(lambda x: loss(q, k, x, dout, options), v),
    }
    for name in ("bias", "sinks"):
        if options.get(name) is not None:
            grads["d" + name] = central_difference(
                lambda x, n=name: loss(q, k, v, dout, {**options, n: x}), options[name]
            )
    return grads


@pytest.mark.parametrize("name", OPTIONS)
def test_gradients_equal_central_differences_of_the_independent_formula(name):
    q, k, v, dout, options = problem(name)
    grads = attention_backward(q, k, v, dout, **options)
    expected = numeric_grads(q, k, v, dout, options)
    top = max(np.abs(g).max() for g in expected.values())
    for field, want in expected.items():
        got = getattr(grads, field)
        assert got.shape == np.shape(want), field
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7 * top, err_msg=f"{name}: {field}")
    assert (grads.dbias is None) == (options.get("bias") is None)
    assert (grads.dsinks is None) == (options.get("sinks") is None)


@pytest.mark.parametrize("name", list(DROPOUT))
def test_dropout_gradients_equal_central_differences_of_the_forward_with_the_same_generator(name):
    """The forward redraws the same mask from a fresh generator of the same seed at every evaluation."""
    options = DROPOUT[name]
    q, k, v, dout, _ = problem("plain", seed=3)

    def loss(q, k, v, dout, opts):
        rng = np.random.default_rng(DROPOUT_SEED)
        return float(np.sum(dout * scaled_dot_product_attention(q, k, v, rng=rng, **opts)))

    grads = attention_backward(q, k, v, dout, rng=np.random.default_rng(DROPOUT_SEED), **options)
    expected = numeric_grads(q, k, v, dout, options, loss=loss)
    top = max(np.abs(g).max() for g in expected.values())
    for field, want in expected.items():
        np.testing.assert_allclose(getattr(grads, field), want, rtol=0, atol=1e-7 * top, err_msg=field)
    assert np.abs(grads.dv).max() > 0


@pytest.mark.parametrize("block_size", [1, 2, 3, (2, 3), (4, 1), 64])
@pytest.mark.parametrize("name", list(OPTIONS) + list(DROPOUT))
def test_tiled_equals_dense(name, block_size):
    if name in DROPOUT:
        q, k, v, dout, _ = problem("plain", seed=5)
        options = DROPOUT[name]
        dense = attention_backward(q, k, v, dout, rng=np.random.default_rng(1), **options)
        tiled = attention_backward(q, k, v, dout, rng=np.random.default_rng(1), block_size=block_size, **options)
    else:
        q, k, v, dout, options = problem(name, seed=5)
        dense = attention_backward(q, k, v, dout, **options)
        tiled = attention_backward(q, k, v, dout, block_size=block_size, **options)
    top = max(np.abs(g).max() for g in dense if g is not None)
    for field, a, b in zip(AttentionGrads._fields, dense, tiled, strict=True):
        if a is None:
            assert b is None, field
        else:
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-14 * top, err_msg=field)


def test_the_keyword_options_are_the_forwards_plus_out_lse_and_block_size():
    def keywords(fn):
        return [n for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY]

    forward = [n for n in keywords(scaled_dot_product_attention)
               if n not in ("return_weights", "return_lse", "q_descale", "k_descale", "v_descale")]  # no fp8 here
    assert keywords(attention_backward) == [*forward, "out", "lse", "block_size"]


@pytest.mark.parametrize("block_size", [None, 2])
def test_out_and_lse_are_used_not_recomputed(block_size):
    q, k, v, dout, options = problem("everything")
    out, lse = blockwise_attention(q, k, v, return_lse=True, **options)
    plain = attention_backward(q, k, v, dout, block_size=block_size, **options)
    given = attention_backward(q, k, v, dout, out=out, lse=lse, block_size=block_size, **options)
    for a, b in zip(plain, given, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    # An lse larger by log 2 halves every recomputed weight: dv (P^T dO) halves exactly.
    halved = attention_backward(q, k, v, dout, out=out, lse=lse + np.log(2.0), block_size=block_size, **options)
    np.testing.assert_allclose(halved.dv, plain.dv / 2, rtol=1e-13, atol=1e-15)
    # D = rowsum(dO * O) comes from `out`: doubling it changes dq.
    other = attention_backward(q, k, v, dout, out=2 * out, lse=lse, block_size=block_size, **options)
    assert np.abs(other.dq - plain.dq).max() > 1e-3
    np.testing.assert_allclose(other.dv, plain.dv, rtol=0, atol=1e-14)


@pytest.mark.parametrize("block_size", [None, 3])
def test_dropout_uses_the_forwards_mask_and_consumes_the_same_draws(block_size):
    q, k, v, dout, _ = problem("plain", seed=7)
    forward_rng, backward_rng = np.random.default_rng(42), np.random.default_rng(42)
    out, weights = scaled_dot_product_attention(q, k, v, dropout_p=0.4, rng=forward_rng, return_weights=True)
    grads = attention_backward(q, k, v, dout, dropout_p=0.4, rng=backward_rng, out=out, block_size=block_size)
    # out is linear in v with the dropped-out weights: dv = weights^T dout, zero where the mask dropped a key.
    np.testing.assert_allclose(grads.dv, np.swapaxes(weights, -1, -2) @ dout, rtol=0, atol=1e-14)
    assert forward_rng.random() == backward_rng.random()  # both generators end in the same state
    # A generator in another state draws another mask: other gradients.
    other = attention_backward(q, k, v, dout, dropout_p=0.4, rng=np.random.default_rng(43), block_size=block_size)
    assert np.abs(other.dv - grads.dv).max() > 1e-3


def test_dropout_with_v_broadcasting_the_weights_draws_the_weights_mask_once():
    """v with more batch elements than the scores: the forward draws one mask for the (smaller) weights."""
    g = np.random.default_rng(8)
    q, k = g.standard_normal((2, L, E)), g.standard_normal((2, S, E))
    v, dout = g.standard_normal((3, 1, S, EV)), g.standard_normal((3, 2, L, EV))
    dense = attention_backward(q, k, v, dout, dropout_p=0.5, rng=np.random.default_rng(2))
    _, weights = scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(2), return_weights=True)
    np.testing.assert_allclose(dense.dv, (np.swapaxes(weights, -1, -2) @ dout).sum(axis=1, keepdims=True), atol=1e-14)
    tiled = attention_backward(q, k, v, dout, dropout_p=0.5, rng=np.random.default_rng(2), block_size=2)
    for a, b in zip(dense, tiled, strict=True):
        if a is not None:
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-14)


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 1), (4, 2), (6, 2), (6, 3)])
def test_grouped_query_gradients_sum_over_each_group(heads, kv_heads, block_size):
    """Query head h reads key/value head h // (H / Hk): dk and dv of a key/value head are the sums over its own
    group of H / Hk consecutive query heads (with H = 2, Hk = 1 every grouping gives the same sum; with H = 4, Hk = 2
    an interleaved grouping does not)."""
    g = np.random.default_rng(heads * 10 + kv_heads)
    group = heads // kv_heads
    q, dout = g.standard_normal((B, heads, L, E)), g.standard_normal((B, heads, L, EV))
    k, v = g.standard_normal((B, kv_heads, S, E)), g.standard_normal((B, kv_heads, S, EV))
    sinks = g.standard_normal(heads)  # per query head: the groups differ in more than their queries
    grads = attention_backward(q, k, v, dout, enable_gqa=True, sinks=sinks, block_size=block_size)
    repeated = attention_backward(q, np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3), dout, sinks=sinks,
                                  block_size=block_size)
    np.testing.assert_allclose(grads.dq, repeated.dq, rtol=0, atol=1e-15)
    np.testing.assert_allclose(grads.dsinks, repeated.dsinks, rtol=0, atol=1e-15)
    for got, full in ((grads.dk, repeated.dk), (grads.dv, repeated.dv)):
        assert got.shape == k.shape[:-1] + got.shape[-1:]
        np.testing.assert_allclose(got, full.reshape(B, kv_heads, group, S, -1).sum(axis=2), rtol=0, atol=1e-14)
    # And against central differences of the independent formula (with its own GQA pairing) on one key head.
    expected = numeric_grads(q, k, v, dout, {"enable_gqa": True, "sinks": sinks})
    top = max(np.abs(e).max() for e in expected.values())
    for field in ("dq", "dk", "dv", "dsinks"):
        np.testing.assert_allclose(getattr(grads, field), expected[field], rtol=0, atol=1e-7 * top, err_msg=field)


@pytest.mark.parametrize("block_size", [None, 2, (3, 2)])
@pytest.mark.parametrize("offset", [-750.0, 750.0])
def test_scores_hundreds_from_zero_change_no_gradient(offset, block_size):
    """A constant added to every score of a row leaves the weights, so every gradient, as they were. With the
    bias 750 from zero, each row's log-sum-exp is about 750: exp(750) overflows and exp(-750) underflows, so the
    weights must be formed as exp(x - lse), never as exp(x) / exp(lse). Dense and tiled."""
    q, k, v, dout, options = problem("everything", seed=9)
    options.pop("sinks")  # a sink is not shifted with the scores
    near = attention_backward(q, k, v, dout, block_size=block_size, **options)
    far = attention_backward(q, k, v, dout, block_size=block_size, **{**options, "bias": options["bias"] + offset})
    _, lse = blockwise_attention(q, k, v, return_lse=True, **{**options, "bias": options["bias"] + offset})
    assert np.abs(lse).min() > 700, np.abs(lse).min()
    for field, a, b in zip(AttentionGrads._fields, near, far, strict=True):
        if a is not None:
            assert np.isfinite(b).all(), field
            # the scores carry an absolute rounding error of about 750 ulp(1) = 1.7e-13
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-11 * np.abs(a).max(), err_msg=field)


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("dropout_p", [0.25, 0.6])
def test_dropout_gradients_equal_the_written_out_formula(dropout_p, block_size):
    """A second, independent check of dropout's backward: FlashAttention's formulas written out with the kept
    weights the forward returns. With P the weights and Z = keep / (1 - p): O = (P * Z) V, dV = (P * Z)^T dO,
    dP = (dO V^T) * Z, D = rowsum(dO * O), dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q."""
    q, k, v, dout, _ = problem("plain", seed=13)
    scale = 1 / np.sqrt(E)
    dropped_out, dropped = scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, return_weights=True,
                                                        rng=np.random.default_rng(5))
    _, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    z = np.divide(dropped, weights, out=np.zeros_like(weights), where=weights > 0)  # keep / (1 - p)
    assert set(np.round(np.unique(z), 12)) == {0.0, round(1 / (1 - dropout_p), 12)}  # both kept and dropped
    dp = (dout @ np.swapaxes(v, -1, -2)) * z
    ds = weights * (dp - np.sum(dout * dropped_out, axis=-1, keepdims=True))
    expected = {"dq": scale * ds @ k, "dk": scale * np.swapaxes(ds, -1, -2) @ q,
                "dv": np.swapaxes(dropped, -1, -2) @ dout}
    grads = attention_backward(q, k, v, dout, dropout_p=dropout_p, rng=np.random.default_rng(5),
                               block_size=block_size)
    for field, want in expected.items():
        np.testing.assert_allclose(getattr(grads, field), want, rtol=0, atol=1e-13, err_msg=field)


@pytest.mark.parametrize("shape", [(), (S,), (1, S), (L, 1), (H, 1, S), (B, 1, L, S), (1, H, L, S)])
@pytest.mark.parametrize("block_size", [None, 2])
def test_dbias_has_the_bias_shape_summed_over_broadcast_axes(shape, block_size):
    q, k, v, dout, _ = problem("plain", seed=9)
    bias = np.random.default_rng(1).standard_normal(shape)
    full = np.broadcast_to(bias, (B, H, L, S)).copy()
    grads = attention_backward(q, k, v, dout, bias=bias, block_size=block_size)
    full_grad = attention_backward(q, k, v, dout, bias=full).dbias
    assert grads.dbias.shape == shape
    reduce = tuple(range(4 - len(shape))) + tuple(4 - len(shape) + i for i, n in enumerate(shape) if n == 1)
    np.testing.assert_allclose(grads.dbias, full_grad.sum(axis=reduce).reshape(shape), rtol=0, atol=1e-14)


@pytest.mark.parametrize("block_size", [None, 1, 2])
def test_rows_without_allowed_keys_get_zero_gradients_without_warnings(block_size):
    q, k, v, dout, _ = problem("plain")
    mask = np.ones((L, S), bool)
    mask[1] = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for options in ({"mask": mask}, {"mask": mask, "sinks": [1.0, -2.0], "bias": np.zeros((L, S))}):
            grads = attention_backward(q, k, v, dout, block_size=block_size, **options)
            assert all(np.isfinite(g).all() for g in grads if g is not None)
            assert not grads.dq[..., 1, :].any()
            if "bias" in options:
                assert not grads.dbias[1].any()
        # bottom-right with more queries than keys: the first L - S queries see no key at all
        g = np.random.default_rng(0)
        q7, d7 = g.standard_normal((7, E)), g.standard_normal((7, EV))
        grads = attention_backward(
            q7, k[0, 0], v[0, 0], d7, is_causal=True, causal_alignment="bottom-right", block_size=block_size, sinks=0.5
        )
        assert not grads.dq[:2].any() and grads.dq[2:].any()


@pytest.mark.parametrize("shape", [(0, E), (L, E)])
def test_empty_problems_give_zero_gradients(shape):
    q = np.ones(shape)
    k, v = np.ones((0, E)), np.ones((0, EV))
    dout = np.ones((shape[0], EV))
    for block_size in (None, 2):
        grads = attention_backward(q, k, v, dout, block_size=block_size)
        assert grads.dq.shape == shape and not grads.dq.any()
        assert grads.dk.shape == (0, E) and grads.dv.shape == (0, EV)


DTYPES = ["float16", "bfloat16", "float32"]


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_low_precision_gradients_are_the_float64_ones_rounded_once(dtype, block_size):
    """A precision check, not a correctness one: low-precision gradients against the package's own float64
    gradients of the same (rounded) inputs, which the central-difference tests above check."""
    if dtype == "bfloat16":
        dtype = require("ml_dtypes").bfloat16
    q, k, v, dout, options = problem("everything")
    low = [a.astype(dtype) for a in (q, k, v, dout)]
    options = {**options, "bias": options["bias"].astype(dtype), "sinks": options["sinks"].astype(dtype)}
    grads = attention_backward(*low, block_size=block_size, **options)
    exact = attention_backward(
        *(a.astype(np.float64) for a in low),
        **{key: (val.astype(np.float64) if isinstance(val, np.ndarray) else val) for key, val in options.items()},
    )
    eps = float(np.finfo(np.float32).eps) if np.dtype(dtype).itemsize == 4 else 2.0**-7
    for field, got, want in zip(AttentionGrads._fields, grads, exact, strict=True):
        assert got.dtype == np.dtype(dtype), field
        top = np.abs(want).max()
        # float16 and bfloat16 are worked in float64, float32 in float32: the float32 work and the final rounding
        # to the dtype show (bfloat16's eps covers float16's)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=4 * eps * top, err_msg=field)


def test_each_gradient_takes_its_own_inputs_dtype():
    q, k, v, dout, _ = problem("plain")
    grads = attention_backward(
        q.astype(np.float16),
        k.astype(np.float32),
        v,
        dout,
        bias=np.zeros((L, S), np.float32),
        sinks=np.zeros(H, np.float16),
    )
    assert [g.dtype for g in grads] == [np.float16, np.float32, np.float64, np.float32, np.float16]
    ints = attention_backward([[1, 2]], [[1, 0], [0, 1]], [[1], [2]], [[1.0]], sinks=0)
    assert ints.dq.dtype == np.float64 and ints.dsinks.dtype == np.float64 and ints.dsinks.shape == ()


# ---------------------------------------------------------------------------
# Identities every correct backward satisfies, whatever the options.


@pytest.mark.parametrize("name", OPTIONS)
def test_identities(name):
    """``out`` is linear in v; scores are bilinear in q, k; adding c to a row's scores and sink changes nothing."""
    q, k, v, dout, options = problem(name, seed=2)
    out = scaled_dot_product_attention(q, k, v, **options)
    grads = attention_backward(q, k, v, dout, **options)
    assert np.sum(grads.dv * v) == pytest.approx(np.sum(dout * out), rel=1e-12)
    assert np.sum(grads.dq * q) == pytest.approx(np.sum(grads.dk * k), rel=1e-10, abs=1e-12)
    if grads.dbias is not None and grads.dbias.shape[-2:] == (L, S):
        # A constant added to the row's scores and to its sink: the weights do not move.
        total = grads.dbias.sum(axis=-1).sum()
        if grads.dsinks is not None:
            total += grads.dsinks.sum()
        assert abs(total) < 1e-12 * np.abs(grads.dbias).max() * L * S


# ---------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"dout": np.ones((L, EV + 1))}, ValueError, ["dout", f"({L}, {EV})", f"({L}, {EV + 1})"]),
        ({"dout": np.ones((EV,))}, ValueError, ["dout", f"({L}, {EV})", f"({EV},)"]),
        ({"dout": np.ones((L, EV), bool)}, TypeError, ["dout", "bool"]),
        ({"out": np.ones((L + 1, EV))}, ValueError, ["out", f"({L}, {EV})", f"({L + 1}, {EV})"]),
        ({"lse": np.ones((L, 1))}, ValueError, ["lse", f"({L},)", f"({L}, 1)"]),
        ({"block_size": 0}, ValueError, ["block_size", ">= 1", "0"]),
        ({"block_size": (2, 0)}, ValueError, ["block_size", ">= 1", "0"]),
        ({"block_size": 1.5}, TypeError, ["block_size", "integer", "1.5"]),
        ({"dropout_p": 1.0}, ValueError, ["dropout_p", "< 1.0", "1.0"]),
        ({"dropout_p": 0.1}, TypeError, ["rng", "Generator", "NoneType"]),
        ({"mask": np.ones((L, S + 1), bool)}, ValueError, ["mask", f"S={S}"]),
    ],
)
def test_bad_input_names_the_argument_what_it_got_and_what_was_expected(kwargs, error, words):
    g = np.random.default_rng(0)
    args = {
        "q": g.standard_normal((L, E)),
        "k": g.standard_normal((S, E)),
        "v": g.standard_normal((S, EV)),
        "dout": g.standard_normal((L, EV)),
    }
    args.update(kwargs)
    with pytest.raises(error) as info:
        attention_backward(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("dout"), **args)
    for word in words:
        assert word in str(info.value)


def test_the_dropout_generator_is_not_consumed_on_bad_input():
    rng = np.random.default_rng(0)
    state = copy.deepcopy(rng.bit_generator.state)
    with pytest.raises(ValueError):
        attention_backward(
            np.ones((L, E)), np.ones((S, E)), np.ones((S, EV)), np.ones((L, EV + 1)), dropout_p=0.5, rng=rng
        )
    assert rng.bit_generator.state == state


@pytest.mark.parametrize("block_size", [None, 2, (3, 2)])
def test_dropout_mask_gives_the_gradients_of_the_generators_draw(block_size):
    rng = np.random.default_rng(11)
    q, k, v, dout = rng.standard_normal((4, 2, 3, 5, 4))
    keep = np.random.default_rng(3).random((2, 3, 5, 5)) >= 0.3  # what the generator draws, in C order
    drawn = attention_backward(q, k, v, dout, dropout_p=0.3, rng=np.random.default_rng(3), block_size=block_size,
                               is_causal=True)
    given = attention_backward(q, k, v, dout, dropout_p=0.3, dropout_mask=keep, block_size=block_size,
                               is_causal=True)
    for a, b in zip(drawn[:3], given[:3], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)
    other = attention_backward(q, k, v, dout, dropout_p=0.3, dropout_mask=~keep, block_size=block_size,
                               is_causal=True)
    assert np.abs(other.dq - given.dq).max() > 0.01  # the mask is used, not ignored
