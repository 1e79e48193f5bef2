"""bfloat16 (ml_dtypes) through every public function; float8 rejected but by the forward; ml_dtypes optional.

bfloat16 input is computed in float32 and rounded once at the end, so every result must lie within
bfloat16 rounding (half a unit in the last place, 2**-8 relative) of the float64 reference computed from
the same numbers, plus the float32 noise of the computation itself.
"""

import subprocess
import sys
import warnings

import numpy as np
import pytest
from conftest import require

import attention_ref as ar
from attention_ref import _validation as V

HALF_ULP = 2.0**-8  # bfloat16 keeps 8 significant bits: rounding to nearest is within 2**-8 relative


@pytest.fixture(scope="module")
def bf16():
    return np.dtype(require("ml_dtypes").bfloat16)


def to64(x):
    return np.asarray(x).astype(np.float64)


def assert_bf16_rounding_of(out, expected, bf16, *, noise=2.0**-14):
    """`out` is bfloat16 and within bfloat16 rounding of the float64 `expected` (plus float32 noise)."""
    assert out.dtype == bf16
    expected = np.asarray(expected, dtype=np.float64)
    got = to64(out)
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[~finite], expected[~finite])  # -inf stays -inf, zeros stay exact
    scale = float(np.max(np.abs(expected[finite]), initial=0.0))
    bound = HALF_ULP * np.abs(expected[finite]) + noise * scale
    excess = np.abs(got[finite] - expected[finite]) - bound
    assert np.all(excess <= 0), f"largest excess over bfloat16 rounding: {excess.max():.3g} (scale {scale:.3g})"


def normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _calls(rng, bf16):
    """name -> (bfloat16 call, the same call on float64 copies of the same numbers)."""
    q, k, v = (normal(rng, (2, 4, n, 8), bf16) for n in (5, 7, 7))
    x = normal(rng, (3, 6), bf16)
    logits = normal(rng, (4, 9), bf16) * bf16.type(4)
    bias = normal(rng, (4, 5, 7), bf16)
    mask = rng.random((5, 7)) < 0.7
    mask[0] = False  # a fully masked row: zeros
    xs = normal(rng, (2, 5, 16), bf16)
    p16 = ar.init_multi_head_params(rng, 16, 4, n_kv_heads=2, dtype=bf16)
    p64 = ar.MultiHeadParams(**{f: to64(getattr(p16, f)) for f in ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k",
                                                                     "b_v", "b_o")}, n_heads=4, n_kv_heads=2)
    parts = [ar.blockwise_attention(q, k[..., a:b, :], v[..., a:b, :], return_lse=True) for a, b in ((0, 3), (3, 7))]

    def decode(q, k, v):
        cache = ar.KVCache(k[..., :6, :], v[..., :6, :])
        return ar.decode_step(q[..., :1, :], k[..., 6:, :], v[..., 6:, :], cache)

    cu = np.array([0, 2, 2, 5])
    cuk = np.array([0, 3, 4, 7])
    return {
        "softmax": (lambda f: ar.softmax(f(logits))),
        "log_softmax": (lambda f: ar.log_softmax(f(logits))),
        "logsumexp": (lambda f: ar.logsumexp(f(logits), axis=0)),
        "softmax-masked-row": (lambda f: ar.softmax(f(np.array([[-np.inf, -np.inf], [1.0, 2.0]], bf16)))),
        "sdpa": (lambda f: ar.scaled_dot_product_attention(f(q), f(k), f(v))),
        "sdpa-causal-weights": (lambda f: ar.scaled_dot_product_attention(f(q), f(k), f(v), is_causal=True,
                                                                          return_weights=True)),
        "sdpa-mask-bias": (lambda f: ar.scaled_dot_product_attention(f(q), f(k), f(v), mask=mask, bias=f(bias))),
        "sdpa-gqa": (lambda f: ar.scaled_dot_product_attention(f(q), f(k[:, :2]), f(v[:, :2]), enable_gqa=True)),
        "blockwise": (lambda f: ar.blockwise_attention(f(q), f(k), f(v), is_causal=True, block_size=3,
                                                       return_lse=True)),
        "blockwise-bias": (lambda f: ar.blockwise_attention(f(q), f(k), f(v), bias=f(bias), mask=mask,
                                                            block_size=(2, 3))),
        "merge_attention": (lambda f: ar.merge_attention([f(o) for o, _ in parts], [f(s) for _, s in parts])),
        "multi_head_attention": (lambda f: ar.multi_head_attention(f(xs), p16 if f is ident else p64,
                                                                   is_causal=True, return_weights=True)),
        "split_heads": (lambda f: ar.split_heads(f(xs), 4)),
        "merge_heads": (lambda f: ar.merge_heads(ar.split_heads(f(xs), 4))),
        "apply_rope": (lambda f: ar.apply_rope(f(q))),
        "apply_rope-positions": (lambda f: ar.apply_rope(f(x), f(np.arange(3, dtype=bf16) * bf16.type(2)))),
        "decode_step": (lambda f: decode(f(q), f(k), f(v))),
        "varlen_attention": (lambda f: ar.varlen_attention(f(q[0]), f(k[0]), f(v[0]), cu, cuk, is_causal=True)),
    }


def ident(a):
    return a


#: Calls that return ``(out, lse)``.
LSE_CALLS = {"blockwise", "merge_attention"}

CALL_NAMES = [
    "softmax", "log_softmax", "logsumexp", "softmax-masked-row", "sdpa", "sdpa-causal-weights", "sdpa-mask-bias",
    "sdpa-gqa", "blockwise", "blockwise-bias", "merge_attention", "multi_head_attention", "split_heads",
    "merge_heads", "apply_rope", "apply_rope-positions", "decode_step", "varlen_attention",
]


@pytest.mark.parametrize("name", CALL_NAMES)
def test_bfloat16_in_bfloat16_out_within_rounding(name, bf16):
    calls = _calls(np.random.default_rng(5), bf16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low = calls[name](ident)
        high = calls[name](to64)
    low = low if isinstance(low, tuple) else (low,)
    high = high if isinstance(high, tuple) else (high,)
    if name in LSE_CALLS:  # the lse of bfloat16 input is float32, as FlashAttention returns it
        (low, lse), (high, expected_lse) = low, high
        assert lse.dtype == np.float32
        np.testing.assert_allclose(to64(lse), expected_lse, rtol=2.0**-20, atol=2.0**-20)
        low, high = (low,), (high,)
    for got, expected in zip(low, high, strict=True):
        assert_bf16_rounding_of(got, expected, bf16)


def test_every_call_name_is_tested(bf16):
    assert set(_calls(np.random.default_rng(0), bf16)) == set(CALL_NAMES)


def test_mask_to_bias_and_params_in_bfloat16(bf16):
    for dtype in (bf16, bf16.type, "bfloat16"):
        bias = ar.mask_to_bias(ar.causal_mask(3), dtype)
        assert bias.dtype == bf16
        np.testing.assert_array_equal(to64(bias), ar.mask_to_bias(ar.causal_mask(3)))
    params = ar.init_multi_head_params(np.random.default_rng(0), 8, 2, dtype="bfloat16")
    assert params.w_q.dtype == bf16 and params.b_o.dtype == bf16


def test_fully_masked_rows_are_zero_in_bfloat16(bf16):
    q, k = np.ones((3, 2), bf16), np.ones((2, 2), bf16)
    mask = np.array([[False, False], [True, False], [True, True]])
    out, w = ar.scaled_dot_product_attention(q, k, k, mask=mask, return_weights=True)
    assert out.dtype == w.dtype == bf16
    np.testing.assert_array_equal(to64(out[0]), 0.0)
    np.testing.assert_array_equal(to64(w), [[0, 0], [1, 0], [0.5, 0.5]])
    out, lse = ar.blockwise_attention(q, k, k, mask=mask, return_lse=True)
    np.testing.assert_array_equal(to64(out[0]), 0.0)
    assert to64(lse)[0] == -np.inf


def test_large_logits_do_not_overflow_in_bfloat16(bf16):
    x = np.array([3e38, 3e38, -3e38], bf16)  # near bfloat16's largest, 3.39e38
    np.testing.assert_array_equal(to64(ar.softmax(x)), [0.5, 0.5, 0.0])
    assert np.isfinite(to64(ar.logsumexp(x)))


@pytest.mark.parametrize(
    ("other", "expected"),
    [(np.float16, np.float32), (np.float32, np.float32), (np.float64, np.float64)],
)
def test_mixed_promotion_like_jax(bf16, other, expected):
    rng = np.random.default_rng(1)
    q = normal(rng, (3, 4), bf16)
    k = normal(rng, (5, 4), other)
    assert ar.scaled_dot_product_attention(q, k, k).dtype == expected
    assert V.result_dtype(q, k) == (np.dtype(expected), np.result_type(expected, np.float32))


def test_validation_helpers(bf16):
    a = np.ones(3, bf16)
    assert V.as_real_array(a, "x") is a
    assert V.is_bfloat16(bf16) and not V.is_bfloat16(np.dtype(np.float16)) and not V.is_bfloat16("bfloat16")
    assert V.result_dtype(a) == (bf16, np.dtype(np.float32))
    assert V.result_dtype(a, a) == (bf16, np.dtype(np.float32))
    assert V.float_dtype(bf16) == bf16 and V.float_dtype("bfloat16") == bf16


# --------------------------------------------------------------------- float8: rejected


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_is_rejected_with_a_conversion_hint(name):
    f8 = np.dtype(getattr(require("ml_dtypes"), name))
    x = np.ones((2, 3), f8)
    pattern = rf"has dtype {name}, a storage format attention_ref does not compute in; convert it first"
    with pytest.raises(TypeError, match=r"^x " + pattern):
        ar.softmax(x)
    with pytest.raises(TypeError, match=r"^k " + pattern):  # the forward takes fp8 (tests/test_fp8.py)
        ar.attention_backward(np.ones((2, 3)), x, np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"^bias " + pattern):
        ar.scaled_dot_product_attention(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3)), bias=np.zeros((2, 2), f8))
    with pytest.raises(TypeError, match=r"^dtype must be float16, float32, float64 or bfloat16"):
        ar.mask_to_bias(ar.causal_mask(2), f8)
    # The suggested conversion is exact and works.
    assert ar.softmax(x.astype(np.float32)).dtype == np.float32


# --------------------------------------------------------------------- ml_dtypes optional


def test_import_does_not_import_ml_dtypes():
    code = (
        "import sys, numpy as np, attention_ref, attention_ref.testing as t\n"
        "q = np.ones((2, 3, 4), np.float16)\n"
        "t.assert_attention_close(attention_ref.blockwise_attention(q, q, q), q, q, q)\n"
        "print('ml_dtypes' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_without_ml_dtypes_float_work_and_bfloat16_by_name_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` now raises ImportError
    with pytest.raises(ImportError, match=r"^bfloat16 needs the optional ml_dtypes package.*pip install ml_dtypes"):
        ar.mask_to_bias(ar.causal_mask(2), "bfloat16")
    with pytest.raises(ImportError, match=r"pip install ml_dtypes"):
        ar.init_multi_head_params(np.random.default_rng(0), 4, 2, dtype="bfloat16")
    q = np.ones((2, 3), np.float16)
    assert ar.scaled_dot_product_attention(q, q, q).dtype == np.float16
    assert ar.mask_to_bias(ar.causal_mask(2), "float32").dtype == np.float32


# --------------------------------------------------------------------- softcap, window, ALiBi and sinks in bfloat16


@pytest.mark.parametrize("attend", ["scaled_dot_product_attention", "blockwise_attention", "decode_step"])
def test_new_options_in_bfloat16(bf16, attend):
    rng = np.random.default_rng(6)
    q, k, v = (normal(rng, (4, n, 8), bf16) * bf16.type(2) for n in (5, 9, 9))
    options = {"softcap": 3.0, "window": (4, 0), "alibi_slopes": ar.alibi_slopes(4).astype(bf16),
               "sinks": normal(rng, (4,), bf16)}

    def call(f):
        if attend == "decode_step":
            cache = ar.KVCache(f(k[:, :8]), f(v[:, :8]))
            return ar.decode_step(f(q[:, :1]), f(k[:, 8:]), f(v[:, 8:]), cache, **options)
        return getattr(ar, attend)(f(q), f(k), f(v), causal_alignment="bottom-right", **options)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = call(ident), call(to64)
    assert_bf16_rounding_of(low, high, bf16)
