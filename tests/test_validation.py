"""Bad input: every public core function raises ValueError/TypeError naming the argument.

Also unit tests for the private checking helpers in ``attention_ref._validation``.
"""

import os

import numpy as np
import pytest

import attention_ref
from attention_ref import _validation as V
from attention_ref import (
    causal_mask,
    log_softmax,
    logsumexp,
    mask_to_bias,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
    softmax,
)

PACKAGE_DIR = os.path.dirname(attention_ref.__file__)

_r = np.random.default_rng(0)
Q = _r.normal(size=(2, 3, 4))  # (B, L, E)
K = _r.normal(size=(2, 5, 4))  # (B, S, E)
VV = _r.normal(size=(2, 5, 6))  # (B, S, Ev)


def sdpa(**overrides):
    args = {"q": Q, "k": K, "v": VV}
    args.update(overrides)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    return lambda: scaled_dot_product_attention(q, k, v, **args)


# (id, callable, exception type, regex that must match the message; it names the argument)
BAD_INPUT = [
    # softmax family
    ("softmax-bool", lambda: softmax(np.array([True, False])), TypeError, r"^x must hold real numbers, not booleans"),
    ("softmax-complex", lambda: softmax(np.array([1j, 2.0])), TypeError, r"^x must be real; got complex"),
    ("softmax-str", lambda: softmax(["a", "b"]), TypeError, r"^x must hold real numbers"),
    ("softmax-object", lambda: softmax(np.array([1.0, None])), TypeError, r"^x must hold real numbers"),
    ("softmax-ragged", lambda: softmax([[1.0], [1.0, 2.0]]), TypeError, r"^x must be array-like"),
    ("softmax-longdouble", lambda: softmax(np.ones(2, np.longdouble)), TypeError, r"^x must be float16, float32"),
    ("softmax-0d", lambda: softmax(1.0), ValueError, r"^x must have at least 1 dimension"),
    ("softmax-axis-range", lambda: softmax(np.ones((2, 3)), axis=2), ValueError, r"^axis=2 is out of range"),
    ("softmax-axis-neg", lambda: softmax(np.ones((2, 3)), axis=-3), ValueError, r"^axis=-3 is out of range"),
    ("softmax-axis-float", lambda: softmax(np.ones(3), axis=0.0), TypeError, r"^axis must be an integer"),
    ("softmax-axis-bool", lambda: softmax(np.ones(3), axis=True), TypeError, r"^axis must be an integer"),
    ("log_softmax-bool", lambda: log_softmax(np.array([True])), TypeError, r"^x must hold real numbers"),
    ("log_softmax-axis", lambda: log_softmax(np.ones(3), axis=1), ValueError, r"^axis=1 is out of range"),
    ("logsumexp-complex", lambda: logsumexp(np.ones(2, complex)), TypeError, r"^x must be real"),
    ("logsumexp-axis", lambda: logsumexp(np.ones(3), axis="0"), TypeError, r"^axis must be an integer"),
    ("logsumexp-0d", lambda: logsumexp(np.float64(2.0)), ValueError, r"^x must have at least 1 dimension"),
    # masks
    ("causal-negative", lambda: causal_mask(-1), ValueError, r"^n_queries must be >= 0; got -1"),
    ("causal-negative-keys", lambda: causal_mask(2, -3), ValueError, r"^n_keys must be >= 0; got -3"),
    ("causal-float", lambda: causal_mask(2.0), TypeError, r"^n_queries must be an integer; got 2.0"),
    ("causal-bool", lambda: causal_mask(True), TypeError, r"^n_queries must be an integer"),
    ("causal-keys-float", lambda: causal_mask(2, 3.5), TypeError, r"^n_keys must be an integer"),
    ("causal-array", lambda: causal_mask(np.array([2])), TypeError, r"^n_queries must be an integer"),
    ("causal-alignment", lambda: causal_mask(2, alignment="bottom"), ValueError,
     r"^alignment must be one of 'top-left', 'bottom-right'; got 'bottom'"),
    ("causal-alignment-type", lambda: causal_mask(2, alignment=None), ValueError, r"^alignment must be one of"),
    ("window-zero", lambda: sliding_window_mask(3, window=0), ValueError, r"^window must be >= 1; got 0"),
    ("window-negative", lambda: sliding_window_mask(3, window=-2), ValueError, r"^window must be >= 1"),
    ("window-float", lambda: sliding_window_mask(3, window=1.5), TypeError, r"^window must be an integer"),
    ("window-none", lambda: sliding_window_mask(3, window=None), TypeError, r"^window must be an integer"),
    ("window-size", lambda: sliding_window_mask(-1, window=2), ValueError, r"^n_queries must be >= 0"),
    ("window-alignment", lambda: sliding_window_mask(3, window=2, alignment="left"), ValueError, r"^alignment"),
    ("padding-too-long", lambda: padding_mask([2, 5], 4), ValueError, r"^lengths must lie in \[0, n_keys=4\]"),
    ("padding-negative", lambda: padding_mask([-1], 4), ValueError, r"^lengths must lie in"),
    ("padding-float", lambda: padding_mask([1.0, 2.0], 4), TypeError, r"^lengths must hold integers"),
    ("padding-bool", lambda: padding_mask([True], 4), TypeError, r"^lengths must hold integers"),
    ("padding-ragged", lambda: padding_mask([[1], [1, 2]], 4), TypeError, r"^lengths must be an array of integers"),
    ("padding-n_keys", lambda: padding_mask([1], -1), ValueError, r"^n_keys must be >= 0"),
    ("padding-n_keys-float", lambda: padding_mask([1], 4.0), TypeError, r"^n_keys must be an integer"),
    ("bias-float-mask", lambda: mask_to_bias(np.ones(3)), TypeError, r"^mask must be a boolean array"),
    ("bias-int-mask", lambda: mask_to_bias([1, 0]), TypeError, r"^mask must be a boolean array"),
    ("bias-ragged-mask", lambda: mask_to_bias([[True], [True, False]]), TypeError, r"^mask must be a boolean array"),
    ("bias-dtype-int", lambda: mask_to_bias([True], dtype=np.int32), TypeError, r"^dtype must be float16, float32"),
    ("bias-dtype-junk", lambda: mask_to_bias([True], dtype="nonsense"), TypeError, r"^dtype must be float16"),
    ("bias-dtype-complex", lambda: mask_to_bias([True], dtype=complex), TypeError, r"^dtype must be float16"),
    # attention: shapes
    ("sdpa-E", sdpa(k=np.ones((2, 5, 3))), ValueError, r"^q and k must have the same feature size E"),
    ("sdpa-S", sdpa(v=np.ones((2, 4, 6))), ValueError, r"^k and v must have the same number of keys S"),
    ("sdpa-batch", sdpa(k=np.ones((3, 5, 4)), v=np.ones((3, 5, 6))), ValueError,
     r"score matrix .* cannot be formed.*q \(2, 3, 1\), k \(3, 1, 5\)"),
    ("sdpa-v-batch", sdpa(v=np.ones((3, 5, 6))), ValueError, r"batch axes .* do not broadcast.*v \(3,\)"),
    ("sdpa-q-1d", sdpa(q=np.ones(4)), ValueError, r"^q must have at least 2 dimensions"),
    ("sdpa-k-1d", sdpa(k=np.ones(4)), ValueError, r"^k must have at least 2 dimensions"),
    ("sdpa-v-0d", sdpa(v=np.float64(1.0)), ValueError, r"^v must have at least 2 dimensions"),
    ("sdpa-mask-S", sdpa(mask=np.ones((3, 4), bool)), ValueError, r"cannot be formed.*mask \(3, 4\)"),
    ("sdpa-mask-L", sdpa(mask=np.ones((2, 5), bool)), ValueError, r"cannot be formed.*mask \(2, 5\)"),
    ("sdpa-mask-batch", sdpa(mask=np.ones((4, 3, 5), bool)), ValueError, r"mask \(4, 3, 5\)"),
    ("sdpa-bias-shape", sdpa(bias=np.zeros((3, 6))), ValueError, r"cannot be formed.*bias \(3, 6\)"),
    ("sdpa-heads", sdpa(q=np.ones((4, 3, 4)), k=np.ones((2, 5, 4)), v=np.ones((2, 5, 6))), ValueError,
     r"pass enable_gqa=True"),
    ("sdpa-gqa-divide", sdpa(q=np.ones((3, 3, 4)), enable_gqa=True), ValueError, r"with enable_gqa=True the number"),
    ("sdpa-E0-noscale", sdpa(q=np.ones((3, 0)), k=np.ones((5, 0)), v=np.ones((5, 2))), ValueError,
     r"E = 0 .*explicit scale"),
    # attention: kinds and dtypes
    ("sdpa-float-mask", sdpa(mask=np.ones((3, 5))), TypeError, r"^mask must be a boolean array.*bias"),
    ("sdpa-int-mask", sdpa(mask=np.ones((3, 5), int)), TypeError, r"^mask must be a boolean array"),
    ("sdpa-ragged-mask", sdpa(mask=[[True], [True, False]]), TypeError, r"^mask must be a boolean array"),
    ("sdpa-complex-q", sdpa(q=Q.astype(complex)), TypeError, r"^q must be real; got complex"),
    ("sdpa-complex-k", sdpa(k=K.astype(complex)), TypeError, r"^k must be real"),
    ("sdpa-complex-v", sdpa(v=VV.astype(complex)), TypeError, r"^v must be real"),
    ("sdpa-bool-v", sdpa(v=VV > 0), TypeError, r"^v must hold real numbers, not booleans"),
    ("sdpa-str-q", sdpa(q=[["a"]]), TypeError, r"^q must hold real numbers"),
    ("sdpa-none-k", sdpa(k=None), TypeError, r"^k must hold real numbers"),
    ("sdpa-complex-bias", sdpa(bias=np.zeros((3, 5), complex)), TypeError, r"^bias must be real"),
    ("sdpa-bool-bias", sdpa(bias=np.ones((3, 5), bool)), TypeError, r"^bias must hold real numbers, not booleans"),
    # attention: scalars and choices
    ("sdpa-scale-str", sdpa(scale="0.5"), TypeError, r"^scale must be a real number"),
    ("sdpa-scale-nan", sdpa(scale=float("nan")), ValueError, r"^scale must be finite"),
    ("sdpa-scale-inf", sdpa(scale=np.inf), ValueError, r"^scale must be finite"),
    ("sdpa-scale-complex", sdpa(scale=1j), TypeError, r"^scale must be a real number"),
    ("sdpa-scale-bool", sdpa(scale=True), TypeError, r"^scale must be a real number"),
    ("sdpa-alignment", sdpa(causal_alignment="lower-right", is_causal=True), ValueError,
     r"^causal_alignment must be one of 'top-left', 'bottom-right'"),
    ("sdpa-is_causal", sdpa(is_causal="yes"), TypeError, r"^is_causal must be True or False"),
    ("sdpa-is_causal-int", sdpa(is_causal=1), TypeError, r"^is_causal must be True or False"),
    ("sdpa-dropout-high", sdpa(dropout_p=1.0, rng=np.random.default_rng(0)), ValueError, r"^dropout_p must be < 1"),
    ("sdpa-dropout-neg", sdpa(dropout_p=-0.5, rng=np.random.default_rng(0)), ValueError, r"^dropout_p must be >= 0"),
    ("sdpa-dropout-nan", sdpa(dropout_p=float("nan"), rng=np.random.default_rng(0)), ValueError, r"^dropout_p must"),
    ("sdpa-dropout-str", sdpa(dropout_p="0.1"), TypeError, r"^dropout_p must be a real number"),
    ("sdpa-dropout-rng", sdpa(dropout_p=0.1), TypeError, r"^rng must be a numpy.random.Generator"),
    ("sdpa-dropout-seed", sdpa(dropout_p=0.1, rng=1234), TypeError, r"^rng must be a numpy.random.Generator"),
]


@pytest.mark.parametrize(("func", "exc", "pattern"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_raises_a_named_error(func, exc, pattern):
    with pytest.raises(exc, match=pattern) as info:
        func()
    # Our own check raised it: the innermost frame is in the package, not in NumPy.
    assert os.path.dirname(str(info.traceback[-1].path)) == PACKAGE_DIR, info.traceback[-1].path
    assert type(info.value) in (ValueError, TypeError)


def test_bad_input_matrix_covers_every_public_core_function():
    names = {c[0].split("-")[0] for c in BAD_INPUT}
    assert {"softmax", "log_softmax", "logsumexp", "causal", "window", "padding", "bias", "sdpa"} <= names


# --- the helpers themselves -------------------------------------------------


def test_as_real_array_conversions():
    assert V.as_real_array([1, 2], "x").dtype == np.float64
    assert V.as_real_array(np.array([1], np.uint16), "x").dtype == np.float64
    a = np.ones(2, np.float32)
    assert V.as_real_array(a, "x") is a  # no copy
    assert V.as_real_array(np.ones(1, np.float16), "x").dtype == np.float16


def test_as_bool_mask():
    m = np.array([True, False])
    assert V.as_bool_mask(m) is m
    with pytest.raises(TypeError, match=r"^attn must be a boolean array"):
        V.as_bool_mask([0.0], "attn")


def test_result_dtype():
    f16, f32, f64 = (np.ones(1, t) for t in (np.float16, np.float32, np.float64))
    assert V.result_dtype(f16) == (np.float16, np.float32)
    assert V.result_dtype(f16, f32) == (np.float32, np.float32)
    assert V.result_dtype(f32, f64) == (np.float64, np.float64)


def test_float_dtype():
    assert V.float_dtype("float16") == np.float16
    assert V.float_dtype(None) == np.float64  # NumPy's default
    with pytest.raises(TypeError, match=r"^out_dtype must be float16"):
        V.float_dtype(np.longdouble, "out_dtype")


class _FakeTorchDtype:
    """Stands for a torch dtype as the package tells one, without torch: type ``torch.dtype``, str "torch.<name>"."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"

    __repr__ = __str__


_FakeTorchDtype.__name__ = "dtype"
_FakeTorchDtype.__module__ = "torch"


@pytest.mark.parametrize("name", ["float16", "float32", "float64", "bfloat16"])
def test_float_dtype_reads_a_torch_dtype_by_its_name_without_torch(name):
    pytest.importorskip("ml_dtypes")
    dt = V.float_dtype(_FakeTorchDtype(name))
    assert str(dt) == name and dt.itemsize == {"float16": 2, "float32": 4, "float64": 8, "bfloat16": 2}[name]


def test_as_dtype_reads_every_fp8_name_as_its_own_format():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    names = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"]
    got = [V.as_dtype(_FakeTorchDtype(name)) for name in names]
    assert got == [np.dtype(getattr(ml_dtypes, name)) for name in names]
    assert len(set(got)) == len(names)  # no two formats read as one


@pytest.mark.parametrize("bad", [_FakeTorchDtype("int32"), _FakeTorchDtype("float8_e4m3fn"), _FakeTorchDtype("quint8"),
                                 "nonsense", 3])
def test_float_dtype_refuses_other_dtypes_naming_what_it_got(bad):
    with pytest.raises(TypeError, match=r"^dtype must be float16, float32, float64 or bfloat16; got ") as info:
        V.float_dtype(bad)
    assert str(info.value).endswith(repr(bad))


def test_as_dtype_refuses_what_is_no_dtype():
    with pytest.raises(TypeError, match=r"^out must be a dtype: a NumPy, ml_dtypes, JAX or torch dtype.*; got 3$"):
        V.as_dtype(3, "out")
    with pytest.raises(TypeError, match=r"; got torch.quint8$"):
        V.as_dtype(_FakeTorchDtype("quint8"))


def test_float_dtype_takes_torch_dtypes(torch):
    pytest.importorskip("ml_dtypes")
    assert V.float_dtype(torch.bfloat16) == V.bfloat16_dtype()
    assert V.float_dtype(torch.float16) == np.float16
    assert V.float_dtype(torch.float32) == np.float32
    assert V.float_dtype(torch.float64) == np.float64
    with pytest.raises(TypeError, match=r"^dtype must be float16, float32, float64 or bfloat16; got torch.int32$"):
        V.float_dtype(torch.int32)


def test_as_dtype_reads_torchs_fp8_dtypes_each_as_its_own_format(torch):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"):
        if hasattr(torch, name):
            assert V.as_dtype(getattr(torch, name)) == np.dtype(getattr(ml_dtypes, name)), name


def test_float_dtype_takes_jax_dtypes():
    from conftest import require

    jnp = require("jax.numpy")
    assert V.float_dtype(jnp.bfloat16) == V.bfloat16_dtype()
    assert V.float_dtype(jnp.float16) == np.float16
    assert V.float_dtype(jnp.float32) == np.float32


def test_check_int_and_real():
    assert V.check_int(np.int8(3), "n") == 3 and type(V.check_int(np.int8(3), "n")) is int
    with pytest.raises(TypeError, match=r"^n must be an integer; got np.True_|^n must be an integer"):
        V.check_int(np.True_, "n")
    with pytest.raises(ValueError, match=r"^n must be >= 1; got 0"):
        V.check_int(0, "n", minimum=1)
    assert V.check_real(np.float32(0.5), "p") == 0.5
    assert V.check_real(2, "p") == 2.0
    with pytest.raises(ValueError, match=r"^p must be < 1.0; got 1.0"):
        V.check_real(1.0, "p", minimum=0.0, below=1.0)
    with pytest.raises(TypeError, match=r"^p must be a real number"):
        V.check_real(np.array(0.5), "p")


def test_check_axis_and_ndim():
    assert V.check_axis(-1, 3) == 2
    assert V.check_axis(np.int64(1), 3) == 1
    with pytest.raises(ValueError, match=r"^dim=3 is out of range for an array with 3 dimensions"):
        V.check_axis(3, 3, "dim")
    with pytest.raises(ValueError, match=r"^x must have at least 2 dimensions \(\.\.\., L, E\); got shape \(3,\)"):
        V.check_ndim(np.ones(3), "x", 2, "(..., L, E)")


def test_shape_helpers():
    assert V.broadcast_shapes("inputs", [("a", (2, 1)), ("b", (3,))]) == (2, 3)
    with pytest.raises(ValueError, match=r"^inputs do not broadcast: got a \(2,\), b \(3,\)"):
        V.broadcast_shapes("inputs", [("a", (2,)), ("b", (3,))])
    V.check_last_dim(np.ones((2, 3)), "w", 3, "d_model")
    with pytest.raises(ValueError, match=r"^w must have last dimension 4 to match d_model; got shape \(2, 3\)"):
        V.check_last_dim(np.ones((2, 3)), "w", 4, "d_model")
    V.check_shape(np.ones((2, 3)), "b", (2, 3))
    with pytest.raises(ValueError, match=r"^b must have shape \(3,\); got \(2, 3\)"):
        V.check_shape(np.ones((2, 3)), "b", (3,))


def test_check_choice_and_generator():
    assert V.check_choice("a", "mode", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"^mode must be one of 'a', 'b'; got 1"):
        V.check_choice(1, "mode", ("a", "b"))
    g = np.random.default_rng(0)
    assert V.check_generator(g) is g
    with pytest.raises(TypeError, match=r"^gen must be a numpy.random.Generator"):
        V.check_generator(np.random, "gen")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_checks_of_numpy_floats_keep_no_memory(dtype):
    # NumPy builds dtype.name anew on every read, by a method lookup through a freshly made string that
    # CPython 3.11's type cache keeps alive, or not, depending on its address: each read left 0 or 58 traced
    # bytes behind depending on the process's memory layout, and chapter 9's memory peaks moved between builds.
    # The checks of NumPy's own floats must not read it.
    import tracemalloc

    x = np.ones(3, dtype=dtype)
    V.as_real_array(x, "x"), V.result_dtype(x, x, x)  # warm-up: first-call caches
    tracemalloc.start()
    try:
        for _ in range(200):
            V.as_real_array(x, "x")
            V.result_dtype(x, x, x)
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    kept = snapshot.filter_traces([tracemalloc.Filter(True, V.__file__)]).statistics("lineno")
    assert kept == [], [str(stat) for stat in kept]
