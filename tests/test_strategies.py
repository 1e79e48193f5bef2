"""attention_ref.testing.strategies: every draw is a valid call that a correct kernel passes, wrong kernels are
caught, the flags switch families of draws off, and ``hard=True`` reaches each hard regime often."""

import importlib
import math
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import require

from attention_ref import alibi_slopes, blockwise_attention, causal_mask, scaled_dot_product_attention
from attention_ref.testing import assert_attention_close

try:  # without hypothesis: the module skips locally; in CI require fails, and so does the collection
    require("hypothesis")
except pytest.skip.Exception as exc:
    pytest.skip(str(exc), allow_module_level=True)
from hypothesis import Phase, find, given, settings

from attention_ref.testing.strategies import AttentionProblem, attention_problems

OPTION_NAMES = {"mask", "is_causal", "causal_alignment", "window", "scale", "softcap", "enable_gqa"}
#: Drawn only when asked for, each by its flag.
EXTRA_FAMILIES = {"bias": "bias", "alibi": "alibi_slopes", "sinks": "sinks"}
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
    fake = type("dtype", (), {"__module__": "torch", "__str__": lambda self: "torch.float16"})()  # torch's, faked
    assert {p.q.dtype for p in draws(attention_problems(dtypes=fake), 10)} == {np.dtype(np.float16)}
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


def window_alone_empties_a_row(p):
    """Whether the window, without the mask or causality, leaves some query row no key (written out here)."""
    L, S = p.q.shape[2], p.k.shape[2]
    left, right = p.options["window"]
    offset = S - L if p.options.get("causal_alignment") == "bottom-right" else 0
    position = np.arange(L) + offset  # the key position of each query
    lo = position - (np.inf if left is None else left)  # the keys of the window, before clipping to [0, S)
    hi = position + (np.inf if right is None else right)
    return bool(np.any((hi < 0) | (lo > S - 1)))


def hard_mechanisms(p):
    """Each way a hard draw empties rows, told on its own from the drawn options."""
    L, S = p.q.shape[2], p.k.shape[2]
    mask = p.options.get("mask")
    return {
        # in a mask of 16 keys or more, a third of them True or more: a row that random density leaves empty
        # about once in 100,000 rows, so one found there was emptied on purpose
        "a dense mask with an all-False row": mask is not None and mask.shape[-2] == L > 1 and S >= 16
        and mask.mean() >= 1 / 3 and not mask.any(-1).all(),
        "key padding of every key": mask is not None and mask.shape[-2] == 1 and not mask.any(-1).all(),
        "bottom-right causality with L > S": bool(p.options.get("is_causal")) and L > S
        and p.options.get("causal_alignment") == "bottom-right",
        "a window past the keys": "window" in p.options and window_alone_empties_a_row(p),
    }


def test_hard_draws_reach_each_way_of_emptying_rows_on_its_own():
    found = draws(attention_problems(), 300)
    counts = Counter(name for p in found for name, hit in hard_mechanisms(p).items() if hit)
    share = {name: counts[name] / len(found) for name in hard_mechanisms(found[0])}
    assert min(share.values()) >= 0.02, share
    for p in found:  # and each one does empty a row
        if any(hard_mechanisms(p).values()):
            assert empty_rows(p), p
    assert not any(any(hard_mechanisms(p).values()) for p in draws(attention_problems(hard=False), 100))


@pytest.mark.parametrize("flag", sorted(EXTRA_FAMILIES))
def test_bias_alibi_and_sinks_are_drawn_when_asked_for_and_only_then(flag):
    option = EXTRA_FAMILIES[flag]
    on = draws(attention_problems(**{flag: True}, max_len=24), 100)
    share = sum(option in p.options for p in on) / len(on)
    assert 0.2 <= share <= 0.8, share
    assert not any(option in p.options for p in draws(attention_problems(max_len=24), 60))
    for p in on:
        if option not in p.options:
            continue
        B, H, L, _ = p.q.shape
        S = p.k.shape[2]
        value = p.options[option]
        assert np.isfinite(value.astype(np.float64)).all()
        if flag == "bias":
            assert value.dtype == p.q.dtype and np.broadcast_shapes(value.shape, (B, H, L, S)) == (B, H, L, S)
        else:
            assert value.shape == (H,)
        if flag == "alibi":
            ratio = value / alibi_slopes(H)
            assert np.allclose(ratio, ratio[0]) and ratio[0] in (1.0, 4.0, 0.25)
        assert_attention_close(blockwise(p.q, p.k, p.v, **p.options), p.q, p.k, p.v, **p.options)


def allowed_keys(p):
    """How many keys each query row may see, (B, H, L): the reference's weights with every score 0 are 1 / count."""
    q = np.zeros(p.q.shape)
    k = np.zeros(p.k.shape)
    geometry = {name: value for name, value in p.options.items() if name not in ("bias", "alibi_slopes", "sinks")}
    _, weights = scaled_dot_product_attention(q, k, p.v.astype(np.float64), return_weights=True, **geometry)
    return (weights > 0).sum(axis=-1)


@pytest.mark.parametrize("hard", [True, False])
@pytest.mark.parametrize("min_keys", [2, 5])
def test_with_min_keys_every_row_has_that_many_allowed_keys(min_keys, hard):
    found = draws(attention_problems(min_keys=min_keys, hard=hard, bias=True, alibi=True), 150)
    fewest = [int(allowed_keys(p).min()) for p in found]
    assert min(fewest) >= min_keys
    assert fewest.count(min_keys) >= 5  # reached, not avoided by drawing only long rows
    assert any(p.options.get("is_causal") for p in found) and any("window" in p.options for p in found)
    assert any("mask" in p.options and p.options["mask"].shape[-2] == 1 for p in found) or not hard
    for p in found[:40]:
        assert_attention_close(blockwise(p.q, p.k, p.v, **p.options), p.q, p.k, p.v, **p.options)


def test_min_keys_of_one_constrains_nothing():
    assert [repr(p) for p in draws(attention_problems(min_keys=1), 30)] == [
        repr(p) for p in draws(attention_problems(), 30)]
    assert any(allowed_keys(p).min() == 1 for p in draws(attention_problems(hard=False), 60))


# --- to torch ---------------------------------------------------------------------------------------------------


def test_sdpa_kwargs_names_the_options_torch_cannot_express_without_torch():
    q = np.zeros((1, 2, 3, 4), np.float32)
    for options, names in (({"softcap": 20.0}, "softcap"), ({"sinks": np.zeros(2)}, "sinks"),
                           ({"softcap": 5.0, "sinks": np.ones(2), "scale": 0.5}, "softcap and sinks")):
        with pytest.raises(ValueError, match=rf"^torch's scaled_dot_product_attention cannot express {names}; "):
            AttentionProblem(q, q, q, options).sdpa_kwargs()


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_to_torch_gives_the_arrays_bit_for_bit_in_their_dtype(dtype):
    torch = require("torch")
    if dtype == "bfloat16":
        require("ml_dtypes")
    for p in draws(attention_problems(dtypes=(dtype,), max_len=20), 10):
        tensors = p.to_torch()
        for tensor, arr in zip(tensors, (p.q, p.k, p.v), strict=True):
            assert tensor.dtype == getattr(torch, dtype) and tuple(tensor.shape) == arr.shape
            assert tensor.device == torch.device("cpu")
            np.testing.assert_array_equal(tensor.to(torch.float64).numpy(), arr.astype(np.float64))
        tensors[0].zero_()  # a copy: the problem keeps its arrays
        assert p.q.astype(np.float64).any() or not p.q.size


@pytest.mark.torch
def test_sdpa_kwargs_fold_masks_causality_and_windows_into_one_mask():
    torch = require("torch")
    found = draws(attention_problems(softcap=False, max_len=40), 120)
    aligned = set()
    for p in found:
        kwargs = p.sdpa_kwargs()
        assert set(kwargs) == {"attn_mask", "scale", "enable_gqa"}
        assert kwargs["scale"] == p.options.get("scale") and kwargs["enable_gqa"] == (p.q.shape[1] != p.k.shape[1])
        B, H, L, _ = p.q.shape
        counts = allowed_keys(p)
        mask = kwargs["attn_mask"]
        if mask is None:  # no mask: every key allowed
            assert (counts == p.k.shape[2]).all()
            continue
        assert mask.dtype == torch.bool
        dense = np.broadcast_to(mask.numpy(), (B, H, L, p.k.shape[2]))
        want = np.ones(dense.shape, bool)
        if "mask" in p.options:
            want &= p.options["mask"]
        if p.options.get("is_causal"):
            want &= causal_mask(L, p.k.shape[2], alignment=p.options["causal_alignment"])
            aligned.add(p.options["causal_alignment"])
        if "window" not in p.options:
            np.testing.assert_array_equal(dense, want)
        else:
            assert not (dense & ~want).any()  # the window only takes keys away
        np.testing.assert_array_equal(dense.sum(-1), counts)  # with the window too: as many keys in each row
    assert aligned == {"top-left", "bottom-right"}


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_sdpa_with_sdpa_kwargs_passes_and_a_wrong_scale_fails(dtype):
    torch = require("torch")
    if dtype == "bfloat16":
        require("ml_dtypes")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    caught = 0
    found = draws(attention_problems(dtypes=(dtype,), softcap=False, bias=True, alibi=True, min_keys=2,
                                     max_len=40), 60)
    for p in found:
        q, k, v = p.to_torch()
        kwargs = p.sdpa_kwargs()
        assert_attention_close(sdpa(q, k, v, **kwargs), p.q, p.k, p.v, **p.options)
        scale = kwargs["scale"] or 1 / math.sqrt(q.shape[-1])
        wrong = sdpa(q, k, v, **(kwargs | {"scale": 1.05 * scale}))
        caught += not passes(lambda *_, out=wrong, **__: out, p)
    assert caught >= len(found) // 2


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
    ({"bias": 1}, TypeError, "bias"),
    ({"alibi": None}, TypeError, "alibi"),
    ({"sinks": "no"}, TypeError, "sinks"),
    ({"min_keys": 0}, ValueError, "min_keys"),
    ({"min_keys": 2.0}, TypeError, "min_keys"),
    ({"min_keys": 65}, ValueError, r"^min_keys must be at most .* max_len=64; got min_keys=65$"),
    ({"min_keys": 9, "max_len": 8}, ValueError, r"^min_keys .* max_len=8; got min_keys=9$"),
    ({"min_keys": 33, "hard": False}, ValueError, r"^min_keys .* 32, the longest benign length \(hard=False\)"),
])
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        attention_problems(**kwargs)


def test_without_hypothesis_the_import_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # an import of hypothesis now fails
    monkeypatch.delitem(sys.modules, "attention_ref.testing.strategies")
    with pytest.raises(ImportError, match="pip install hypothesis"):
        importlib.import_module("attention_ref.testing.strategies")
