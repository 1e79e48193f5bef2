"""attention_ref.testing.assert_attention_close: correct low-precision kernels pass, buggy ones fail."""

import math
import re

import numpy as np
import pytest
from conftest import require
from plain_options import reference_with_options

import attention_ref as ar
from attention_ref.testing import assert_attention_close, assert_attention_grads_close, assert_lse_close
from attention_ref.testing._baseline import naive_attention, naive_backward
from attention_ref.testing._rule import ATOL_UNITS, ATOL_UNITS_GRAD, EPS

DTYPES = ["float16", "bfloat16", "float32", "float64"]


def as_dtype(name):
    return np.dtype(require("ml_dtypes").bfloat16) if name == "bfloat16" else np.dtype(name)


def qkv(seed, dtype, *, B=2, H=3, Hkv=None, L=37, S=53, E=16, Ev=8, spread=1.0):
    rng = np.random.default_rng(seed)
    Hkv = H if Hkv is None else Hkv
    q = (spread * rng.standard_normal((B, H, L, E))).astype(dtype)
    k = (spread * rng.standard_normal((B, Hkv, S, E))).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, Ev)).astype(dtype)
    return q, k, v


def flash_like(q, k, v, *, block=16, is_causal=False):
    """A FlashAttention-2 style kernel: online softmax in float32, P rounded to the input dtype before P @ V."""
    dtype = q.dtype
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    L, S = q.shape[-2], k.shape[-2]
    qs = q32 * np.float32(1 / math.sqrt(q.shape[-1]))
    m = np.full(q.shape[:-1], -np.inf, np.float32)
    l = np.zeros_like(m)
    acc = np.zeros((*m.shape, v.shape[-1]), np.float32)
    for c0 in range(0, S, block):
        s = qs @ np.swapaxes(k32[..., c0:c0 + block, :], -1, -2)
        if is_causal:
            s = np.where(np.arange(c0, min(S, c0 + block)) <= np.arange(L)[:, None], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1))
        shift = np.where(np.isneginf(m_new), 0, m_new).astype(np.float32)
        alpha = np.exp(m - shift)
        p = np.exp(s - shift[..., None])
        l = l * alpha + p.sum(axis=-1)
        acc = acc * alpha[..., None] + p.astype(dtype).astype(np.float32) @ v32[..., c0:c0 + block, :]
        m = m_new
    return (acc / np.where(l > 0, l, 1)[..., None]).astype(dtype)


# --------------------------------------------------------------------- correct kernels pass


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blockwise_and_dense_pass_in_every_dtype(name, seed):
    dtype = as_dtype(name)
    for spread in (0.5, 1.0, 2.0):
        q, k, v = qkv(seed, dtype, spread=spread)
        for options in ({}, {"is_causal": True}, {"is_causal": True, "causal_alignment": "bottom-right"}):
            assert_attention_close(ar.blockwise_attention(q, k, v, block_size=(8, 5), **options), q, k, v, **options)
            assert_attention_close(ar.scaled_dot_product_attention(q, k, v, **options), q, k, v, **options)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_flash_attention_style_kernel_passes(name, seed):
    dtype = as_dtype(name)
    q, k, v = qkv(seed, dtype, L=40, S=200, E=64, spread=1.5)
    for is_causal in (False, True):
        assert_attention_close(flash_like(q, k, v, block=32, is_causal=is_causal), q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("name", DTYPES)
def test_options_pass_through(name):
    dtype = as_dtype(name)
    q, k, v = qkv(4, dtype, H=4, Hkv=2)
    rng = np.random.default_rng(4)
    mask = rng.random((37, 53)) < 0.8
    mask[3] = False  # a fully masked row
    bias = rng.standard_normal((4, 37, 53)).astype(dtype)
    for options in (
        {"enable_gqa": True, "mask": mask},
        {"enable_gqa": True, "bias": bias, "scale": 0.2},
        {"enable_gqa": True, "is_causal": True, "mask": mask, "bias": bias},
    ):
        actual = ar.blockwise_attention(q, k, v, block_size=7, **options)
        assert_attention_close(actual, q, k, v, **options)


def test_correctly_rounded_output_passes_with_no_slack():
    # The reference rounded to float16 is as close as a float16 array can be: it passes even with atol=0, factor=1.
    q, k, v = qkv(5, np.float16)
    best = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v))).astype(np.float16)
    assert_attention_close(best, q, k, v, factor=1.0, atol=0.0)


def test_inputs_may_be_wider_than_the_output():
    # A kernel fed float32 that writes float16: the baseline rounds the inputs to float16 as well.
    q, k, v = qkv(6, np.float32)
    assert_attention_close(ar.scaled_dot_product_attention(q, k, v).astype(np.float16), q, k, v)


def test_float16_inputs_worked_in_float16_fail_as_a_float32_output():
    # The baseline is rounded to the output's dtype, not the inputs': a kernel that takes float16, writes float32
    # and computes in float16 is judged by float32 arithmetic, and fails; one computing in float32 passes.
    q, k, v = qkv(16, np.float16)
    in_float16 = ar.scaled_dot_product_attention(q, k, v).astype(np.float32)
    in_float32 = ar.scaled_dot_product_attention(*(a.astype(np.float32) for a in (q, k, v)))
    assert in_float32.dtype == np.float32
    assert_attention_close(in_float32, q, k, v, atol=1e-6)
    with pytest.raises(AssertionError, match=r"naive float32 baseline"):
        assert_attention_close(in_float16, q, k, v, atol=1e-6)
    assert_attention_close(in_float16, q, k, v, dtype=np.float16, atol=1e-6)  # as a float16 kernel: it is one


def test_non_finite_input_must_give_the_same_non_finite_output():
    q, k, v = qkv(7, np.float32)
    q[0, 0, 2, 0] = np.nan
    actual = ar.blockwise_attention(q, k, v, block_size=8)
    assert np.isnan(actual[0, 0, 2]).all()
    assert_attention_close(actual, q, k, v)
    actual[0, 0, 2] = 0.0
    with pytest.raises(AssertionError, match=r"^8 of 1776 elements (.|\n)*\nlargest error inf at index "
                                             r"\(0, 0, 2, \d\): actual 0, reference nan"):
        assert_attention_close(actual, q, k, v)


# --------------------------------------------------------------------- buggy kernels fail

FAILURE = re.compile(
    r"^(?P<n>\d+) of (?P<total>\d+) elements are too far from the float64 reference\n"
    r"allowed: factor \* \(naive (?P<dtype>\w+) baseline's largest error\) \+ atol = "
    r"(?P<factor>\S+) \* (?P<base>\S+) \+ (?P<atol>\S+) = (?P<bound>\S+)\n"
    r"largest error (?P<err>\S+) at index (?P<index>\([\d, ]+\)): actual (?P<actual>\S+), "
    r"reference (?P<reference>\S+), baseline's error there (?P<there>\S+)\n"
    r"ratio to the baseline's largest error: (?P<ratio>\S+)\n"
    r"(?P<nonfinite>non-finite values in actual: [^\n]+\n)?"
    r"where they are:\n(?P<where>(?:[^\n]+\n?)+)$"
)


def failure(actual, q, k, v, **options):
    """The parsed AssertionError message of a check that must fail."""
    with pytest.raises(AssertionError) as info:
        assert_attention_close(actual, q, k, v, **options)
    match = FAILURE.match(str(info.value))
    assert match, str(info.value)
    return match


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_off_by_one_causal_mask_fails(seed):
    q, k, v = qkv(seed, np.float16, L=20, S=20)
    wrong = ar.scaled_dot_product_attention(q, k, v, mask=np.tri(20, k=1, dtype=bool))  # sees one key ahead
    m = failure(wrong, q, k, v, is_causal=True)
    assert m["dtype"] == "float16" and m["factor"] == "2"
    assert int(m["total"]) == wrong.size and 0 < int(m["n"]) <= wrong.size
    index = tuple(int(i) for i in m["index"][1:-1].split(","))
    assert index[2] < 19  # the last query sees every key either way: never the worst
    assert float(m["err"]) > 10 * float(m["bound"])
    assert float(m["ratio"]) == pytest.approx(float(m["err"]) / float(m["base"]), rel=1e-2)
    reference = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)), is_causal=True)
    assert float(m["actual"]) == pytest.approx(float(wrong[index]), rel=1e-5)
    assert float(m["reference"]) == pytest.approx(reference[index], rel=1e-5)
    assert float(m["err"]) == pytest.approx(abs(float(wrong[index]) - reference[index]), rel=1e-2)


@pytest.mark.parametrize(("name", "error"), [("float32", 0.001), ("float16", 0.05), ("bfloat16", 0.05),
                                             ("float64", 1e-9)])
def test_a_slightly_wrong_scale_fails(name, error):
    dtype = as_dtype(name)
    q, k, v = qkv(8, dtype, E=64, spread=1.5)
    wrong = ar.scaled_dot_product_attention(q, k, v, scale=(1 + error) / 8)
    assert_attention_close(ar.scaled_dot_product_attention(q, k, v, scale=1 / 8), q, k, v)
    m = failure(wrong, q, k, v)
    assert m["dtype"] == name
    assert float(m["ratio"]) > 2


def test_missing_max_shift_overflows_and_fails():
    q, k, v = qkv(9, np.float16, spread=2.5)  # scores well above 11.1, where exp overflows float16

    def no_shift(q, k, v):
        s = (q.astype(np.float32) @ np.swapaxes(k.astype(np.float32), -1, -2) / 4).astype(np.float16)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(s)  # float16: inf for s > 11.09
            return (e / e.sum(axis=-1, keepdims=True)) @ v

    wrong = no_shift(q, k, v)
    assert np.isnan(wrong).any()
    m = failure(wrong, q, k, v)
    assert m["err"] == "inf" and m["actual"] == "nan" and m["ratio"] == "inf"


def test_float16_accumulation_in_a_float32_kernel_fails():
    q, k, v = qkv(10, np.float32, S=300, E=64)
    half_inside = naive_attention(q, k, v, np.dtype(np.float16), {}).astype(np.float32)
    m = failure(half_inside, q, k, v)
    assert m["dtype"] == "float32" and float(m["ratio"]) > 100


def test_wrong_grouped_query_mapping_fails():
    q, k, v = qkv(11, np.float16, H=4, Hkv=2)
    # h % Hkv instead of PyTorch's h // (H // Hkv): heads 1 and 2 read the wrong key/value head.
    wrong = ar.scaled_dot_product_attention(q, np.tile(k, (1, 2, 1, 1)), np.tile(v, (1, 2, 1, 1)))
    m = failure(wrong, q, k, v, enable_gqa=True)
    assert m["index"].split(",")[1].strip() in ("1", "2")


def test_factor_and_atol_can_be_loosened():
    q, k, v = qkv(12, np.float32, E=64, spread=1.5)
    wrong = ar.scaled_dot_product_attention(q, k, v, scale=1.001 / 8)
    m = failure(wrong, q, k, v)
    assert_attention_close(wrong, q, k, v, factor=2 * float(m["ratio"]))
    assert_attention_close(wrong, q, k, v, atol=2 * float(m["err"]))
    m = failure(wrong, q, k, v, factor=0.0, atol=1e-6)
    assert m["factor"] == "0" and m["atol"] == "1e-06"


# --------------------------------------------------------------------- the factor 2 itself


def controlled(reference, baseline, times, dtype, seed=0):
    """``reference + times * max|baseline - reference|`` with random signs, rounded to `dtype`: a kernel
    whose error is `times` the baseline's largest (to within half a unit in the last place of the output)."""
    base_max = np.abs(baseline.astype(np.float64) - reference).max()
    signs = np.where(np.random.default_rng(seed).random(reference.shape) < 0.5, -1.0, 1.0)
    return (reference + times * base_max * signs).astype(dtype), base_max


def assert_the_test_can_tell(reference, base_max, name, units):
    """3x must exceed 2x plus the default atol and the output's rounding; 1.5x must stay under 2x plus atol."""
    ulp = EPS[name] * np.abs(reference).max()  # at least half a unit in the last place of any entry
    atol = units[name] * ulp  # the default
    assert 3 * base_max - ulp / 2 > 2 * base_max + atol, "the baseline's error is too small for this test"
    assert 1.5 * base_max + ulp / 2 <= 2 * base_max + atol


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_an_error_three_times_the_baselines_fails_by_default_and_passes_with_factor_4(name):
    dtype = as_dtype(name)
    q, k, v = qkv(20, dtype, L=64, S=256, E=32, spread=2.0)
    reference = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)))
    # the textbook baseline: its error is many units in the last place, so 3x and 1.5x of it are told apart
    baseline = naive_attention(q, k, v, dtype, {}, fused=False)
    three, base_max = controlled(reference, baseline, 3.0, dtype)
    assert_the_test_can_tell(reference, base_max, name, ATOL_UNITS)
    with pytest.raises(AssertionError, match=r"ratio to the baseline's largest error: [23]"):
        assert_attention_close(three, q, k, v, baseline="textbook")
    assert_attention_close(three, q, k, v, factor=4.0, baseline="textbook")
    assert_attention_close(controlled(reference, baseline, 1.5, dtype)[0], q, k, v, baseline="textbook")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_gradients_three_times_the_baselines_error_fail_by_default_and_pass_with_factor_4(name):
    dtype = as_dtype(name)
    g = np.random.default_rng(21)
    q, k = ((3.0 * g.standard_normal((2, n, 64))).astype(dtype) for n in (32, 256))
    v, dout = (g.standard_normal((2, n, 16)).astype(dtype) for n in (256, 32))
    reference = ar.attention_backward(*(a.astype(np.float64) for a in (q, k, v, dout)))
    baseline = naive_backward(q, k, v, dout, dtype, {}, fused=False)
    scale = max(np.abs(g).max() for g in reference[:3])  # the gradients' default atol: one scale for all three
    for i, field in enumerate(("dq", "dk", "dv")):
        ref, base = getattr(reference, field), getattr(baseline, field)
        three, base_max = controlled(ref, base, 3.0, dtype, seed=i)
        assert_the_test_can_tell(scale * np.sign(ref), base_max, name, ATOL_UNITS_GRAD)
        grads = [ar.attention_backward(q, k, v, dout)[j] for j in range(3)]
        grads[i] = three
        with pytest.raises(AssertionError, match=rf"^{field}: "):
            assert_attention_grads_close(grads, q, k, v, dout, baseline="textbook")
        assert_attention_grads_close(grads, q, k, v, dout, factor=4.0, baseline="textbook")
        grads[i] = controlled(ref, base, 1.5, dtype, seed=i)[0]
        assert_attention_grads_close(grads, q, k, v, dout, baseline="textbook")


# --------------------------------------------------------------------- the baseline and the default atol


@pytest.mark.parametrize("options", [
    {}, {"is_causal": True}, {"is_causal": True, "causal_alignment": "bottom-right"}, {"scale": 0.0},
    {"enable_gqa": True, "mask": np.tri(37, 53, k=5, dtype=bool)},
])
def test_the_float64_baseline_is_the_reference_formula(reference_attention, options):
    """In float64 nothing is rounded beyond float64: the baseline is the formula, here the independent one."""
    q, k, v = qkv(13, np.float64, H=4, Hkv=2 if options.get("enable_gqa") else 4)
    baseline = naive_attention(q, k, v, np.dtype(np.float64), options)
    expected, _, _ = reference_with_options(reference_attention, q, k, v, **options)
    assert baseline.dtype == np.float64
    np.testing.assert_allclose(baseline, expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_the_low_precision_baseline_rounds_every_step(name):
    dtype = as_dtype(name)
    q, k, v = qkv(14, dtype)
    baseline = naive_attention(q, k, v, dtype, {"is_causal": True})
    assert baseline.dtype == dtype
    reference = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)), is_causal=True)
    ours = ar.scaled_dot_product_attention(q, k, v, is_causal=True)  # float32 inside, rounded once
    base_err = np.abs(baseline.astype(np.float64) - reference).max()
    our_err = np.abs(ours.astype(np.float64) - reference).max()
    assert our_err < base_err < 20 * our_err


@pytest.mark.parametrize(("name", "units"), [("float16", 2.0**-13), ("bfloat16", 2.0**-10), ("float32", 2.0**-23),
                                             ("float64", 2.0**-51)])
def test_default_atol_per_dtype(name, units):
    dtype = as_dtype(name)
    q, k, v = qkv(15, dtype)
    m = failure(ar.scaled_dot_product_attention(q, k, v, scale=0.5), q, k, v)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    reference = ar.scaled_dot_product_attention(q64, k64, v64)
    # float32 and float64: times the largest score magnitude (the kernel's rounding of its scores)
    wide = name in ("float32", "float64")
    magnitude = max(1.0, np.abs(q64 @ np.swapaxes(k64, -1, -2) / 4.0).max()) if wide else 1.0
    assert float(m["atol"]) == pytest.approx(units * np.abs(reference).max() * magnitude, rel=2e-3)


# --------------------------------------------------------------------- bad arguments

Q = np.zeros((2, 3, 4))
OUT = np.zeros((2, 3, 4))


@pytest.mark.parametrize(
    ("actual", "kwargs", "exc", "pattern"),
    [
        (OUT[..., :3], {}, ValueError, r"^actual must have the shape of the attention output of q, k and v, "
                                       r"\(2, 3, 4\); got \(2, 3, 3\)"),
        (OUT.astype(int), {}, TypeError, r"^actual must be a kernel's floating-point output .*got dtype int64"),
        (OUT > 0, {}, TypeError, r"^actual must hold real numbers, not booleans"),
        (OUT + 0j, {}, TypeError, r"^actual must be real"),
        (OUT.astype(np.longdouble), {}, TypeError, r"^actual must be float16, float32, float64 or bfloat16"),
        ("out", {}, TypeError, r"^actual must hold real numbers"),
        (OUT, {"return_weights": True}, TypeError, r"^assert_attention_close .*return_weights is not an option"),
        (OUT, {"dropout_p": 0.1}, TypeError, r"dropout_p is not an option"),
        (OUT, {"factor": -1.0}, ValueError, r"^factor must be >= 0.0; got -1.0"),
        (OUT, {"factor": "2"}, TypeError, r"^factor must be a real number"),
        (OUT, {"atol": np.inf}, ValueError, r"^atol must be finite"),
        (OUT, {"is_causal": 1}, TypeError, r"^is_causal must be True or False"),
        (OUT, {"colour": "red"}, TypeError, r"colour"),
    ],
    ids=["shape", "int", "bool", "complex", "longdouble", "str", "return_weights", "dropout", "factor-negative",
         "factor-str", "atol-inf", "is_causal", "unknown-option"],
)
def test_bad_arguments_raise_named_errors(actual, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        assert_attention_close(actual, Q, Q, Q, **kwargs)


def test_float8_output_is_rejected():
    f8 = np.dtype(require("ml_dtypes").float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^actual has dtype float8_e4m3fn"):
        assert_attention_close(OUT.astype(f8), Q, Q, Q)


def test_importable_as_attention_ref_testing():
    assert ar.testing.assert_attention_close is assert_attention_close
    assert ar.testing.__all__ == [
        "assert_attention_close",
        "assert_attention_grads_close",
        "assert_lse_close",
        "assert_paged_attention_close",
        "to_numpy",
    ]


# --------------------------------------------------------------------- softcap, window, ALiBi and sinks

NEW_OPTIONS = [
    {"softcap": 3.0},
    {"window": (5, 2)},
    {"window": (8, None), "is_causal": True, "causal_alignment": "bottom-right"},
    {"alibi_slopes": np.array([0.5, 0.25, 0.125])},
    {"sinks": np.array([0.0, 2.0, -1.0])},
    {"softcap": 10.0, "window": (6, 0), "alibi_slopes": np.array([0.1, 0.2, 0.3]), "sinks": np.array([1.0, 0.5, 3.0]),
     "bias": np.linspace(-1, 1, 53), "scale": 0.3},
]


@pytest.mark.parametrize("options", NEW_OPTIONS, ids=lambda o: "-".join(o))
def test_the_float64_baseline_honours_the_new_options(reference_attention, options):
    q, k, v = qkv(16, np.float64, spread=2.0)
    baseline = naive_attention(q, k, v, np.dtype(np.float64), options)
    expected, _, _ = reference_with_options(reference_attention, q, k, v, **options)  # plain NumPy, no attention_ref
    np.testing.assert_allclose(baseline, expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("options", NEW_OPTIONS, ids=lambda o: "-".join(o))
def test_blockwise_passes_with_the_new_options(name, options):
    dtype = as_dtype(name)
    q, k, v = qkv(17, dtype, spread=2.0)
    assert_attention_close(ar.blockwise_attention(q, k, v, block_size=(8, 6), **options), q, k, v, **options)


def test_a_kernel_that_ignores_the_sinks_fails():
    q, k, v = qkv(18, as_dtype("bfloat16"))
    sinks = np.array([1.0, 2.0, 0.5])
    m = failure(ar.scaled_dot_product_attention(q, k, v), q, k, v, sinks=sinks)
    assert m["dtype"] == "bfloat16"


def test_a_kernel_that_caps_after_the_bias_fails():
    q, k, v = qkv(19, np.float16, spread=2.0)
    bias = np.where(np.arange(53) % 2, 4.0, 0.0)
    # Wrong order: c * tanh((s + bias) / c) instead of c * tanh(s / c) + bias.
    s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k.astype(np.float64)) / 4 + bias
    w = np.exp(5.0 * np.tanh(s / 5.0))
    wrong = ((w / w.sum(-1, keepdims=True)) @ v.astype(np.float64)).astype(np.float16)
    failure(wrong, q, k, v, softcap=5.0, bias=bias)


# --------------------------------------------------------------------- the gradient checker

GRAD_OPTIONS = [
    {},
    {"is_causal": True, "causal_alignment": "bottom-right"},
    {"softcap": 3.0, "bias": "bias", "sinks": "sinks"},
    {"window": (5, 2), "alibi_slopes": np.array([0.5, 0.25, 0.125]), "scale": 0.3},
    {"enable_gqa": True, "mask": np.tri(20, 30, k=3, dtype=bool)},
]


def grad_problem(dtype, options, seed=22, spread=2.0):
    """q, k, v, dout (and the bias and sinks the options name) in `dtype`, as a kernel would receive them."""
    g = np.random.default_rng(seed)
    q, k, v = qkv(seed, dtype, L=20, S=30, E=16, Ev=8, Hkv=1 if options.get("enable_gqa") else 3, spread=spread)
    dout = g.standard_normal(q.shape[:-1] + v.shape[-1:]).astype(dtype)
    options = dict(options)
    if "bias" in options:
        options["bias"] = g.standard_normal((3, 1, 30)).astype(dtype)
    if "sinks" in options:
        options["sinks"] = (2 * g.standard_normal(3)).astype(dtype)
    return q, k, v, dout, options


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("options", GRAD_OPTIONS, ids=lambda o: "-".join(o) or "plain")
def test_the_packages_low_precision_backward_stays_within_the_checkers_rounding_budget(name, options):
    """A precision check: the checker's float64 reference is the package's own backward, so this shows rounding,
    not correctness (checked by test_backward.py's central differences and the PyTorch/JAX conformance tests)."""
    dtype = as_dtype(name)
    q, k, v, dout, options = grad_problem(dtype, options)
    for block_size in (None, (8, 6)):
        grads = ar.attention_backward(q, k, v, dout, block_size=block_size, **options)
        assert all(g.dtype == dtype for g in grads if g is not None)
        assert_attention_grads_close(grads, q, k, v, dout, **options)
        assert_attention_grads_close(grads[:3], q, k, v, dout, **options)  # dq, dk, dv only


@pytest.mark.parametrize(("name", "error"), [("float16", 0.01), ("bfloat16", 0.05), ("float32", 0.001)])
def test_the_gradient_checker_catches_wrong_gradients(name, error):
    dtype = as_dtype(name)
    q, k, v, dout, options = grad_problem(dtype, GRAD_OPTIONS[2])
    right = ar.attention_backward(q, k, v, dout, **options)
    wrong_scale = ar.attention_backward(q, k, v, dout, **options, scale=(1 + error) / 4)  # default 1/sqrt(16)
    with pytest.raises(AssertionError, match=r"^d[qkv]: .* too far"):
        assert_attention_grads_close(wrong_scale, q, k, v, dout, **options)
    no_sinks = ar.attention_backward(q, k, v, dout, softcap=3.0, bias=options["bias"])
    with pytest.raises(AssertionError, match=r"^dq: "):
        assert_attention_grads_close(no_sinks, q, k, v, dout, **options)
    flipped = right._replace(dsinks=-right.dsinks)
    with pytest.raises(AssertionError, match=r"^dsinks: "):
        assert_attention_grads_close(flipped, q, k, v, dout, **options)
    shifted = right._replace(dbias=(right.dbias + 0.05 * np.abs(right.dbias).max()).astype(dtype))
    with pytest.raises(AssertionError, match=r"^dbias: "):
        assert_attention_grads_close(shifted, q, k, v, dout, **options)


def test_the_naive_float64_backward_is_the_gradient():
    """In float64 the baseline is the exact backward: central differences of the independent formula agree."""
    from test_backward import numeric_grads

    q, k, v, dout, options = grad_problem(np.float64, GRAD_OPTIONS[2])
    q, k, v, dout = (a[:1, :, :4, :3] if a.ndim == 4 else a for a in (q, k, v, dout))
    options["bias"] = options["bias"][..., :k.shape[-2]]
    baseline = naive_backward(q, k, v, dout, np.dtype(np.float64), options)
    expected = numeric_grads(q, k, v, dout, options)
    for field, want in expected.items():
        np.testing.assert_allclose(getattr(baseline, field), want, rtol=0, atol=1e-7 * np.abs(want).max(),
                                   err_msg=field)


@pytest.mark.parametrize(
    ("actual", "kwargs", "exc", "pattern"),
    [
        (np.zeros((2, 3, 4)), {}, TypeError, r"^actual must be a sequence \(dq, dk, dv\)"),
        ([Q, Q], {}, TypeError, r"^actual must be a sequence .* got list of length 2"),
        ([Q, Q, Q[..., :3]], {}, ValueError, r"^actual.dv must have the shape of v, \(2, 3, 4\); got \(2, 3, 3\)"),
        ([Q, Q.astype(int), Q], {}, TypeError, r"^actual.dk must be a kernel's floating-point output"),
        ([Q, Q, Q, Q], {}, ValueError, r"^actual has dbias but the options have no bias"),
        ([Q, Q, Q], {"dropout_p": 0.1}, TypeError, r"dropout_p is not an option"),
        ([Q, Q, Q], {"factor": -1.0}, ValueError, r"^factor must be >= 0.0"),
    ],
    ids=["array", "short", "shape", "int", "dbias-without-bias", "dropout", "factor"],
)
def test_the_gradient_checker_names_bad_arguments(actual, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        assert_attention_grads_close(actual, Q, Q, Q, OUT, **kwargs)


# --- assert_lse_close -------------------------------------------------------

LSE_OPTIONS = [
    {},
    {"is_causal": True},
    {"window": (5, 0), "causal_alignment": "bottom-right"},
    {"softcap": 2.0, "alibi_slopes": np.array([0.5, 0.25, 0.125])},
    {"sinks": np.array([0.5, -2.0, 3.0])},
]


@pytest.mark.parametrize("options", LSE_OPTIONS)
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("seed", range(3))
def test_blockwise_lse_passes(name, seed, options):
    q, k, v = qkv(seed, as_dtype(name), spread=2.0)
    _, lse = ar.blockwise_attention(q, k, v, block_size=(8, 16), return_lse=True, **options)
    assert lse.dtype == np.float32
    assert_lse_close(lse, q, k, v, **options)


def test_base_2_and_plus_inf_conventions():
    # A Triton/FlashInfer-style kernel: base-2 log-sum-exp, +inf for a row with no key.
    q, k, v = qkv(0, np.float32, L=6, S=6)
    mask = np.ones((6, 6), bool)
    mask[2] = False  # query 2 sees no key
    _, lse = ar.blockwise_attention(q, k, v, mask=mask, return_lse=True)
    lse2 = np.where(np.isneginf(lse), np.inf, lse / np.float32(np.log(2.0))).astype(np.float32)
    assert_lse_close(lse2, q, k, v, mask=mask, base=2, empty=np.inf)
    with pytest.raises(AssertionError, match="too far from the float64 reference"):
        assert_lse_close(lse2, q, k, v, mask=mask, empty=np.inf)  # read as a natural log
    with pytest.raises(AssertionError, match=r"^24 of 36 elements|too far"):
        assert_lse_close(lse2, q, k, v, mask=mask, base=2)  # the empty row holds +inf, not -inf
    for wrong in (np.nan, -np.inf, 0.0):
        bad = lse2.copy()
        bad[..., 2] = wrong
        with pytest.raises(AssertionError, match=r"^6 of 36 elements are too far"):
            assert_lse_close(bad, q, k, v, mask=mask, base=2, empty=np.inf)


def test_plus_inf_for_an_empty_row_with_a_natural_log():
    # A kernel that writes +inf for a row with no key, in a batch of two with an empty row in the second only,
    # log base e: checked with empty=inf it passes, and the same rows holding -inf then fail; by default the
    # other way round.
    q, k, v = qkv(9, np.float32, B=2, H=1, L=5, S=4)
    mask = np.ones((2, 1, 5, 4), bool)
    mask[1, 0, 3] = False
    _, lse = ar.scaled_dot_product_attention(q, k, v, mask=mask, return_lse=True)
    lse = lse.astype(np.float32)
    assert np.isneginf(lse[1, 0, 3]) and np.isfinite(np.delete(lse.ravel(), 8)).all()
    plus = np.where(np.isneginf(lse), np.float32(np.inf), lse)
    assert_lse_close(plus, q, k, v, mask=mask, empty=np.inf)
    assert_lse_close(lse, q, k, v, mask=mask)
    with pytest.raises(AssertionError, match=r"^1 of 10 elements are too far"):
        assert_lse_close(lse, q, k, v, mask=mask, empty=np.inf)
    with pytest.raises(AssertionError, match=r"^1 of 10 elements are too far"):
        assert_lse_close(plus, q, k, v, mask=mask)


@pytest.mark.parametrize(
    "breakage",
    ["scale", "dropped sink", "no max shift in float16", "off by one ulp x 64"],
)
def test_lse_checker_catches_broken_kernels(breakage):
    q, k, v = qkv(1, np.float32, H=3)
    sinks = np.array([0.5, -1.0, 2.0])
    _, lse = ar.blockwise_attention(q, k, v, return_lse=True, sinks=sinks)
    if breakage == "scale":
        _, bad = ar.blockwise_attention(q, k, v, return_lse=True, sinks=sinks, scale=1.001 / 4)
    elif breakage == "dropped sink":
        _, bad = ar.blockwise_attention(q, k, v, return_lse=True)
    elif breakage == "no max shift in float16":
        scores = (q @ np.swapaxes(k, -1, -2) / np.float32(4)).astype(np.float16)
        with np.errstate(over="ignore"):
            total = np.exp(scores).sum(axis=-1, dtype=np.float16) + np.exp(sinks.astype(np.float16))[:, None]
        bad = np.log(total.astype(np.float32))
    else:
        bad = lse + 64 * np.spacing(np.abs(lse))
    assert_lse_close(lse, q, k, v, sinks=sinks)
    with pytest.raises(AssertionError, match="elements are too far from the float64 reference"):
        assert_lse_close(bad.astype(np.float32), q, k, v, sinks=sinks)


def test_lse_sink_logit_in_a_row_with_no_key():
    q, k, v = qkv(2, np.float32, H=3, L=4, S=4)
    sinks = np.array([0.5, -1.0, 2.0])
    _, lse = ar.blockwise_attention(q, k, v, window=(0, 0), causal_alignment="bottom-right",
                                    sinks=sinks, mask=np.tri(4, k=-1, dtype=bool), return_lse=True)
    np.testing.assert_array_equal(lse, np.broadcast_to(sinks[:, None].astype(np.float32), lse.shape))
    assert_lse_close(lse, q, k, v, window=(0, 0), causal_alignment="bottom-right", sinks=sinks,
                     mask=np.tri(4, k=-1, dtype=bool))


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"base": 10}, ValueError, r'^base must be "e" or 2; got 10'),
        ({"empty": 0.0}, ValueError, r"^empty must be -inf or inf"),
        ({"factor": -1.0}, ValueError, r"^factor must be >= 0"),
        ({"atol": np.nan}, ValueError, r"^atol must be finite"),
        ({"dropout_p": 0.1}, TypeError, r"dropout_p is not an option here"),
        ({"actual_lse": np.zeros((2, 3, 37, 1), np.float32)}, ValueError, r"^actual_lse must have the shape"),
        ({"actual_lse": np.zeros((2, 3, 37), int)}, TypeError, r"^actual_lse must be a kernel's floating-point"),
    ],
)
def test_lse_checker_names_bad_arguments(kwargs, exc, pattern):
    q, k, v = qkv(0, np.float32)
    actual = kwargs.pop("actual_lse", np.zeros((2, 3, 37), np.float32))
    with pytest.raises(exc, match=pattern):
        assert_lse_close(actual, q, k, v, **kwargs)


# --- a kernel's own dropout mask ------------------------------------------------


@pytest.mark.parametrize("name", ["float16", "float32"])
def test_checkers_replay_a_kernels_dropout_mask(name):
    dtype = as_dtype(name)
    q, k, v = qkv(5, dtype, L=12, S=20)
    keep = np.random.default_rng(8).random((2, 3, 12, 20)) >= 0.25
    out = ar.scaled_dot_product_attention(q, k, v, dropout_p=0.25, dropout_mask=keep)
    assert_attention_close(out, q, k, v, dropout_p=0.25, dropout_mask=keep)
    with pytest.raises(AssertionError, match="too far from the float64 reference"):
        assert_attention_close(out, q, k, v, dropout_p=0.25, dropout_mask=np.roll(keep, 1, axis=-1))
    with pytest.raises(AssertionError, match="too far from the float64 reference"):
        assert_attention_close(out, q, k, v, dropout_p=0.5, dropout_mask=keep)  # wrong rescaling
    dout = np.random.default_rng(9).standard_normal(out.shape).astype(dtype)
    grads = ar.attention_backward(q, k, v, dout, dropout_p=0.25, dropout_mask=keep)
    assert_attention_grads_close(grads[:3], q, k, v, dout, dropout_p=0.25, dropout_mask=keep)
    with pytest.raises(AssertionError, match="too far from the float64 reference"):
        assert_attention_grads_close(grads[:3], q, k, v, dout, dropout_p=0.25, dropout_mask=~keep)
    with pytest.raises(TypeError, match=r"dropout_p is not an option here without dropout_mask"):
        assert_attention_close(out, q, k, v, dropout_p=0.25)


# --- the log-sum-exp's default atol, from its documented formula (no framework) ---------------------------------


@pytest.mark.parametrize(("name", "eps", "units"), [("bfloat16", 2.0**-7, 1.0), ("float16", 2.0**-10, 1.0),
                                                    ("float32", 2.0**-23, 4.0)])
def test_the_lse_default_atol_is_units_times_the_inputs_eps_times_the_largest_lse(name, eps, units):
    # assert_attention_close's Notes: atol = u * eps * max|R|, eps that of the kernel's INPUTS (a float32
    # log-sum-exp of bfloat16 inputs is judged by bfloat16's eps), u from the table. With factor=0 the bound is
    # atol alone: an error of half of it passes, one of twice it fails, whatever the baseline.
    q, k, v = qkv(20, as_dtype(name), B=2, H=4, L=64, S=64)
    _, exact = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)), return_lse=True)
    atol = units * eps * np.abs(exact).max()
    for fraction, passes in ((0.5, True), (2.0, False)):
        shifted = (exact + fraction * atol).astype(np.float32)  # float32 rounding: far below atol / 2
        if passes:
            assert_lse_close(shifted, q, k, v, factor=0.0)
        else:
            with pytest.raises(AssertionError, match=r"elements are too far from the float64 reference"):
                assert_lse_close(shifted, q, k, v, factor=0.0)
    assert_lse_close((exact + 2.0 * atol).astype(np.float32), q, k, v, factor=0.0, atol=2.5 * atol)  # atol given


def _few_outputs():
    """Issue 43's false alarm: 72 output elements (value head size 1, GQA 6/3, L = 12, S = 41, scale 0.25), the
    float32 rounding of the reference, and the default atol of float32 there."""
    rng = np.random.default_rng(416)
    E, spread = int(rng.integers(1, 17)), float(rng.choice([0.5, 1, 2, 4]))
    q = (spread * rng.standard_normal((1, 6, 12, E))).astype(np.float32)
    k = (spread * rng.standard_normal((1, 3, 41, E))).astype(np.float32)
    v = rng.standard_normal((1, 3, 41, 1)).astype(np.float32)
    options = {"scale": 0.25, "enable_gqa": True}
    reference = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)), **options)
    return q, k, v, options, reference


def test_few_output_elements_get_a_floor_a_correct_float32_kernel_does_not_reach():
    q, k, v, options, reference = _few_outputs()
    kernel = reference.astype(np.float32)
    kernel[0, 4, 2, 0] = reference[0, 4, 2, 0] + 1.2e-7  # torch's float32 SDPA was 1.2e-7 off there
    assert_attention_close(kernel, q, k, v, **options)
    # without the floor (an atol given keeps it as given) the bound is the baseline's few elements': a false alarm
    default_atol = ATOL_UNITS["float32"] * EPS["float32"] * float(np.abs(reference).max())
    with pytest.raises(AssertionError, match=r"= 2 \* \S+ \+ \S+ = 1\.\d+e-07\n"):
        assert_attention_close(kernel, q, k, v, atol=default_atol, **options)
    # an error one and a half floors wide still fails, and the report's bound is the floor
    floor = EPS["float32"] * float(np.abs(v).max())
    kernel[0, 4, 2, 0] = reference[0, 4, 2, 0] + 1.5 * floor
    with pytest.raises(AssertionError) as info:
        assert_attention_close(kernel, q, k, v, **options)
    bound = re.search(r"\+ atol = 2 \* \S+ \+ \S+ = (\S+)\n", str(info.value)).group(1)
    assert float(bound) == pytest.approx(floor, rel=1e-2)


def test_the_floor_keeps_a_wrong_float32_scale_failing_on_few_outputs():
    q, k, v, options, _ = _few_outputs()
    wrong = ar.scaled_dot_product_attention(*(a.astype(np.float64) for a in (q, k, v)),
                                            **options | {"scale": 0.25 * 1.001}).astype(np.float32)
    with pytest.raises(AssertionError):
        assert_attention_close(wrong, q, k, v, **options)


def test_torch_float32_sdpa_on_few_outputs_passes():
    torch = require("torch")
    q, k, v, options, _ = _few_outputs()
    out = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), **options)
    assert_attention_close(out, q, k, v, **options)
