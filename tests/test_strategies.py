"""attention_ref.testing.strategies: every draw is a valid call that a correct kernel passes, wrong kernels are
caught, the flags switch families of draws off, and ``hard=True`` reaches each hard regime often."""

import importlib
import math
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import require

from attention_ref import blockwise_attention, scaled_dot_product_attention
from attention_ref.testing import assert_attention_close

try:  # without hypothesis: the module skips locally; in CI require fails, and so does the collection
    require("hypothesis")
except pytest.skip.Exception as exc:
    pytest.skip(str(exc), allow_module_level=True)
from hypothesis import Phase, find, given, settings

from attention_ref.testing.strategies import AttentionProblem, attention_problems

OPTION_NAMES = {"mask", "is_causal", "causal_alignment", "window", "scale", "softcap", "enable_gqa"}
FAMILIES = {"gqa": "enable_gqa", "masks": "mask", "causal": "is_causal", "windows": "window", "softcap": "softcap"}
#: Not derandomized (each run explores new draws) unless a test must count.
QUICK = settings(max_examples=40, deadline=None, database=None)


def draws(strategy, n, *, derandomize=True):
    """`n` problems drawn by hypothesis as a test sees them (reproducible with `derandomize`)."""
    found = []

    @settings(max_examples=n, deadline=None, database=None, derandomize=derandomize, phases=[Phase.generate])
    @given(strategy)
    def collect(p):
        found.append(p)

    collect()
    assert len(found) == n
    return found


def scaled_scores(p):
    """``scale * q k^T`` of a problem in float64, shape (B, H, L, S), grouped heads repeated (without the package)."""
    q, k = p.q.astype(np.float64), p.k.astype(np.float64)
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    scale = p.options.get("scale", 1 / math.sqrt(q.shape[-1]))
    return scale * q @ np.swapaxes(k, -1, -2)


def empty_rows(p):
    """Whether some query row has no allowed key: its log-sum-exp is -inf."""
    q, k, v = (a.astype(np.float64) for a in (p.q, p.k, p.v))
    _, lse = scaled_dot_product_attention(q, k, v, return_lse=True, **p.options)
    return bool(np.isneginf(lse).any())


def passes(kernel, p):
    try:
        assert_attention_close(kernel(p.q, p.k, p.v, **p.options), p.q, p.k, p.v, **p.options)
    except AssertionError:
        return False
    return True


def blockwise(q, k, v, **options):
    return blockwise_attention(q, k, v, block_size=16, **options)


def scale_off_by_5_percent(q, k, v, **options):
    scale = options.pop("scale", None) or 1 / math.sqrt(q.shape[-1])
    return blockwise(q, k, v, scale=1.05 * scale, **options)


def no_max_shift(q, k, v, *, scale=None, enable_gqa=False):
    """A float32 kernel that exponentiates the scores without subtracting the row maximum (no masks)."""
    q, k, v = (a.astype(np.float32) for a in (q, k, v))
    k, v = (np.repeat(a, q.shape[1] // k.shape[1], axis=1) for a in (k, v))
    scale = np.float32(scale or 1 / math.sqrt(q.shape[-1]))
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(scale * q @ np.swapaxes(k, -1, -2))  # (B, H, L, S), inf beyond scores of about 88
        return (e / e.sum(axis=-1, keepdims=True)) @ v


def finite_fill(q, k, v, **options):
    """A kernel that fills masked scores with -1e9 instead of -inf: a row with no allowed key averages every value."""
    out, weights = scaled_dot_product_attention(q, k, v, return_weights=True, **options)
    v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    empty = weights.sum(axis=-1, keepdims=True) == 0  # (B, H, L, 1)
    return np.where(empty, v.mean(axis=-2, keepdims=True), out).astype(out.dtype)


# --- every draw is a valid problem --------------------------------------------------------------------------------


@pytest.mark.parametrize("hard", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_draws_have_the_documented_shapes_and_are_valid_calls(dtype, hard):
    if dtype == "bfloat16":
        require("ml_dtypes")
    max_len = 40

    @QUICK
    @given(attention_problems(dtypes=(dtype,), max_len=max_len, hard=hard))
    def check(p):
        B, H, L, E = p.q.shape
        assert p.k.shape[:2] == p.v.shape[:2] == (B, p.k.shape[1]) and H % p.k.shape[1] == 0
        S, Ev = p.k.shape[2], p.v.shape[3]
        assert p.k.shape == (B, p.k.shape[1], S, E) and p.v.shape[2] == S
        assert 1 <= L <= max_len and 1 <= S <= max_len and B in (1, 2) and E <= 64 and Ev <= 64
        assert p.q.dtype.name == p.k.dtype.name == p.v.dtype.name == dtype
        assert all(np.isfinite(a.astype(np.float64)).all() for a in (p.q, p.k, p.v))
        assert set(p.options) <= OPTION_NAMES
        if "mask" in p.options:
            assert p.options["mask"].dtype == np.bool_
            assert np.broadcast_shapes(p.options["mask"].shape, (B, H, L, S)) == (B, H, L, S)
        out = scaled_dot_product_attention(p.q, p.k, p.v, **p.options)
        assert out.shape == (B, H, L, Ev) and out.dtype == p.q.dtype
        reference = p.reference()
        assert reference.dtype == np.float64 and reference.shape == (B, H, L, Ev)
        if dtype == "float64" and hard:
            # The float64 bound of assert_attention_close is eps * max|R| wide, narrower than the rounding a
            # blockwise float64 kernel shows at scores in the hundreds; compare it to the reference directly.
            np.testing.assert_allclose(blockwise(p.q, p.k, p.v, **p.options), reference, rtol=1e-11, atol=1e-11)
        else:
            assert_attention_close(blockwise(p.q, p.k, p.v, **p.options), p.q, p.k, p.v, **p.options)

    check()


def test_dtypes_are_drawn_from_the_given_ones_by_name_or_dtype():
    found = {p.q.dtype for p in draws(attention_problems(dtypes=("float16", np.float64)), 60)}
    assert found == {np.dtype(np.float16), np.dtype(np.float64)}
    assert {p.q.dtype for p in draws(attention_problems(dtypes=np.float16), 10)} == {np.dtype(np.float16)}
    assert {p.q.dtype for p in draws(attention_problems(dtypes="float64"), 10)} == {np.dtype(np.float64)}


def test_the_repr_gives_dtype_shapes_and_options_not_arrays():
    q = np.zeros((2, 4, 17, 8), dtype=np.float16)
    k = v = np.full((2, 2, 33, 8), -3.0, dtype=np.float16)
    mask = np.zeros((2, 1, 17, 33), dtype=bool)
    mask[..., :11] = True
    p = AttentionProblem(q, k, v, {"mask": mask, "causal_alignment": "bottom-right", "enable_gqa": True})
    assert repr(p) == (
        "AttentionProblem(float16 q(2, 4, 17, 8) k(2, 2, 33, 8) v(2, 2, 33, 8), max |q| 0 |k| 3 |v| 3, "
        "mask=bool(2, 1, 17, 33) 33% True, causal_alignment='bottom-right', enable_gqa=True)"
    )


# --- wrong kernels are caught ---------------------------------------------------------------------------------------


def test_a_scale_off_by_5_percent_is_caught_and_shrunk_to_a_small_problem():
    p = find(attention_problems(dtypes=("float16", "float32")), lambda p: not passes(scale_off_by_5_percent, p),
             settings=settings(max_examples=100, deadline=None, database=None))
    assert p.q.shape[2] * p.k.shape[2] <= 4 and p.options == {}  # shrunk: two keys suffice


def test_a_failing_property_reports_the_problem():
    @settings(max_examples=100, deadline=None, database=None, phases=[Phase.generate, Phase.shrink])
    @given(attention_problems())
    def check(p):
        assert passes(scale_off_by_5_percent, p)

    with pytest.raises(AssertionError) as failure:
        check()
    notes = "\n".join(getattr(failure.value, "__notes__", []))
    assert "check(\n    p=AttentionProblem(float32 q(1, 1, " in notes and "array" not in notes, notes


def test_hard_draws_catch_a_kernel_that_overflows_benign_draws_do_not():
    plain = {"masks": False, "causal": False, "windows": False, "softcap": False}
    p = find(attention_problems(**plain), lambda p: not passes(no_max_shift, p),
             settings=settings(max_examples=200, deadline=None, database=None))
    assert np.abs(scaled_scores(p)).max() > 80
    assert all(passes(no_max_shift, p) for p in draws(attention_problems(hard=False, **plain), 100))


def test_hard_draws_catch_a_kernel_that_averages_empty_rows_benign_draws_do_not():
    p = find(attention_problems(), lambda p: not passes(finite_fill, p),
             settings=settings(max_examples=200, deadline=None, database=None))
    assert empty_rows(p)
    benign = draws(attention_problems(hard=False), 100)
    assert not any(empty_rows(p) for p in benign)
    assert all(passes(finite_fill, p) for p in benign)


# --- flags and regimes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", sorted(FAMILIES))
def test_each_flag_switches_its_family_off(flag):
    option = FAMILIES[flag]
    assert any(option in p.options for p in draws(attention_problems(), 60))  # present when on
    off = draws(attention_problems(**{flag: False}), 60)
    assert not any(option in p.options for p in off)
    if flag == "gqa":
        assert all(p.q.shape[1] == p.k.shape[1] == p.v.shape[1] for p in off)


def test_without_causal_and_windows_there_is_no_alignment():
    found = draws(attention_problems(causal=False, windows=False), 60)
    assert all(set(p.options) <= {"mask", "scale", "softcap", "enable_gqa"} for p in found)
    assert all(set(p.options) <= {"scale"} for p in draws(
        attention_problems(gqa=False, masks=False, causal=False, windows=False, softcap=False), 30))


def regimes(p):
    """The hard regimes a problem reaches, told from its arrays and the package's log-sum-exp."""
    L, S = p.q.shape[2], p.k.shape[2]
    alignment = p.options.get("causal_alignment")
    return {
        "scores >= 100": np.abs(scaled_scores(p)).max() >= 100,
        "a row with no allowed key": empty_rows(p),
        "L != S, top-left": L != S and alignment == "top-left",
        "L != S, bottom-right": L != S and alignment == "bottom-right",
        "grouped-query heads": p.q.shape[1] > p.k.shape[1],
        "L or S is 1 or 16n +- 1": any(n == 1 or n % 16 in (1, 15) for n in (L, S)),
    }


def test_hard_draws_reach_each_hard_regime_in_a_few_percent_of_draws():
    found = draws(attention_problems(), 300)
    counts = Counter(name for p in found for name, hit in regimes(p).items() if hit)
    share = {name: counts[name] / len(found) for name in regimes(found[0])}
    assert min(share.values()) >= 0.05, share


def test_benign_draws_are_standard_normal_square_and_moderate():
    found = draws(attention_problems(hard=False, max_len=200), 100)
    assert all(p.q.shape[2] == p.k.shape[2] and 8 <= p.q.shape[2] <= 32 for p in found)
    assert max(np.abs(scaled_scores(p)).max() for p in found) < 30
    assert all(p.q.shape[3] in (8, 16, 32) for p in found)
    assert not any(regimes(p)["scores >= 100"] for p in found)
    assert {p.q.shape[2] for p in draws(attention_problems(hard=False, max_len=5), 20)} <= {5}


# --- bad arguments --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"dtypes": "int8"}, TypeError, "dtypes"),
    ({"dtypes": ("float32", "complex64")}, TypeError, "dtypes"),
    ({"dtypes": ()}, ValueError, "dtypes"),
    ({"dtypes": 5}, TypeError, "dtypes"),
    ({"max_len": 0}, ValueError, "max_len"),
    ({"max_len": 2.5}, TypeError, "max_len"),
    ({"gqa": 1}, TypeError, "gqa"),
    ({"masks": None}, TypeError, "masks"),
    ({"hard": "yes"}, TypeError, "hard"),
    ({"softcap": 50.0}, TypeError, "softcap"),
])
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        attention_problems(**kwargs)


def test_without_hypothesis_the_import_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # an import of hypothesis now fails
    monkeypatch.delitem(sys.modules, "attention_ref.testing.strategies")
    with pytest.raises(ImportError, match="pip install hypothesis"):
        importlib.import_module("attention_ref.testing.strategies")
