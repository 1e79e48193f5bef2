"""Unit tests for softmax, log_softmax and logsumexp."""

import math
import warnings

import numpy as np
import pytest

from attention_ref import log_softmax, logsumexp, softmax

FLOATS = [np.float16, np.float32, np.float64]


# --- values derived by hand -------------------------------------------------


def test_softmax_of_log_weights_returns_the_normalised_weights():
    # exp(log(c)) = c, so softmax(log([1, 2, 3])) = [1, 2, 3] / 6.
    x = np.log([1.0, 2.0, 3.0])
    np.testing.assert_allclose(softmax(x), [1 / 6, 2 / 6, 3 / 6], rtol=1e-15)


def test_softmax_of_equal_entries_is_uniform():
    np.testing.assert_array_equal(softmax(np.full((2, 4), 7.5)), np.full((2, 4), 0.25))


def test_two_entry_softmax_is_the_logistic_function():
    a, b = 0.3, -1.2
    expected = 1.0 / (1.0 + math.exp(b - a))
    np.testing.assert_allclose(softmax(np.array([a, b])), [expected, 1 - expected], rtol=1e-15)


def test_logsumexp_hand_values():
    assert logsumexp(np.zeros(4)) == pytest.approx(math.log(4), rel=1e-15)
    assert logsumexp(np.array([1000.0, 1000.0])) == pytest.approx(1000 + math.log(2), rel=1e-15)
    assert logsumexp(np.log([1.0, 2.0, 3.0])) == pytest.approx(math.log(6), rel=1e-15)


def test_log_softmax_hand_values_keep_tiny_weights_exact():
    # log softmax([0, -1000]) = [-log(1 + e^-1000), -1000 - log(1 + e^-1000)] = [0, -1000] in float64.
    np.testing.assert_array_equal(log_softmax(np.array([0.0, -1000.0])), [0.0, -1000.0])
    np.testing.assert_allclose(log_softmax(np.zeros(3)), np.full(3, -math.log(3)), rtol=1e-15)


def test_matches_direct_float64_formula_on_moderate_input(rng):
    x = rng.normal(size=(3, 4, 5))
    direct = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(softmax(x), direct, rtol=1e-14, atol=0)
    np.testing.assert_allclose(logsumexp(x), np.log(np.exp(x).sum(axis=-1)), rtol=1e-14)
    np.testing.assert_allclose(log_softmax(x), np.log(direct), rtol=1e-13, atol=1e-15)


# --- axis and keepdims ------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_axis_selects_the_normalised_axis(rng, axis):
    x = rng.normal(size=(2, 3, 4))
    w = softmax(x, axis=axis)
    np.testing.assert_allclose(w.sum(axis=axis), 1.0, rtol=1e-14)
    direct = np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(w, direct, rtol=1e-14)
    np.testing.assert_allclose(logsumexp(x, axis=axis), np.log(np.exp(x).sum(axis=axis)), rtol=1e-14)
    np.testing.assert_allclose(np.exp(log_softmax(x, axis=axis)), direct, rtol=1e-13)


def test_logsumexp_keepdims(rng):
    x = rng.normal(size=(2, 3, 4))
    assert logsumexp(x, axis=1).shape == (2, 4)
    assert logsumexp(x, axis=1, keepdims=True).shape == (2, 1, 4)
    np.testing.assert_array_equal(logsumexp(x, axis=1, keepdims=True)[:, 0, :], logsumexp(x, axis=1))


def test_accepts_lists_and_integers_giving_float64():
    w = softmax([[0, 0], [1, 1]])
    assert w.dtype == np.float64
    np.testing.assert_array_equal(w, np.full((2, 2), 0.5))
    assert log_softmax(np.array([1, 1], dtype=np.int32)).dtype == np.float64
    assert logsumexp(np.array([0, 0], dtype=np.uint8)).dtype == np.float64


# --- masked and empty slices ------------------------------------------------


def test_fully_masked_slice_gives_zeros_and_minus_inf_without_warning():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    w = softmax(x)
    np.testing.assert_array_equal(w[1], [0.0, 0.0, 0.0])
    assert w[0, 1] == 0.0
    np.testing.assert_allclose(w[0].sum(), 1.0, rtol=1e-15)
    assert logsumexp(x)[1] == -np.inf
    np.testing.assert_array_equal(log_softmax(x)[1], [-np.inf] * 3)
    assert log_softmax(x)[0, 1] == -np.inf


def test_empty_slices_do_not_raise():
    x = np.zeros((2, 0))
    assert softmax(x).shape == (2, 0)
    assert log_softmax(x).shape == (2, 0)
    np.testing.assert_array_equal(logsumexp(x), [-np.inf, -np.inf])  # log of an empty sum
    assert softmax(np.zeros((0, 3))).shape == (0, 3)
    assert logsumexp(np.zeros((0, 3))).shape == (0,)


# --- dtypes -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_dtype_is_preserved(dtype):
    x = np.array([[1.0, 2.0, 3.0]], dtype=dtype)
    assert softmax(x).dtype == dtype
    assert log_softmax(x).dtype == dtype
    assert logsumexp(x).dtype == dtype


def test_float16_accumulates_in_float32():
    # 4096 equal logits: each weight is exactly 2**-12. Summing 4096 ones in
    # float16 stalls at 2048 (2048 + 1 rounds back to 2048), which would give 2**-11.
    x = np.zeros(4096, dtype=np.float16)
    np.testing.assert_array_equal(softmax(x), np.full(4096, 2.0**-12, dtype=np.float16))
    assert float(logsumexp(x)) == pytest.approx(math.log(4096), rel=1e-3)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("big", [1e4, -1e4])
def test_extreme_logits_stay_finite_and_normalised(dtype, big):
    # big - 8 is exact even in float16 (whose spacing near 1e4 is 8).
    x = np.array([[big, 0.0, -big, big - 8.0], [big, big, big, big]], dtype=dtype)
    w = softmax(x)
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(w.astype(np.float64).sum(axis=-1), 1.0, rtol=2e-3 if dtype == np.float16 else 1e-6)
    np.testing.assert_allclose(w[1].astype(np.float64), 0.25)
    lse = logsumexp(x)
    assert np.all(np.isfinite(lse))
    assert float(lse[1]) == pytest.approx(big + math.log(4), rel=1e-3)
    ls = log_softmax(x)
    assert not np.any(np.isnan(ls))
    if big > 0:  # the two largest entries differ by 8: weights 1 / (1 + e^-8) and e^-8 / (1 + e^-8)
        top = 1.0 / (1.0 + math.exp(-8.0))
        np.testing.assert_allclose(w[0].astype(np.float64), [top, 0, 0, 1 - top], rtol=2e-3, atol=1e-6)


# --- NaN and +inf -----------------------------------------------------------


def test_nan_poisons_only_its_own_slice():
    x = np.array([[np.nan, 1.0, 2.0], [0.0, 1.0, 2.0]])
    w = softmax(x)
    assert np.all(np.isnan(w[0]))
    np.testing.assert_allclose(w[1].sum(), 1.0, rtol=1e-15)
    assert np.all(np.isnan(log_softmax(x)[0])) and np.all(np.isfinite(log_softmax(x)[1]))
    lse = logsumexp(x)
    assert np.isnan(lse[0]) and np.isfinite(lse[1])
    # Along axis 0 the NaN reaches only the first column.
    w0 = softmax(x, axis=0)
    assert np.all(np.isnan(w0[:, 0])) and np.all(np.isfinite(w0[:, 1:]))


def test_plus_inf_gives_nan_slice_but_infinite_logsumexp():
    x = np.array([[np.inf, 0.0], [0.0, 0.0]])
    assert np.all(np.isnan(softmax(x)[0]))
    assert np.all(np.isnan(log_softmax(x)[0]))
    np.testing.assert_array_equal(softmax(x)[1], [0.5, 0.5])
    assert logsumexp(x)[0] == np.inf
    assert logsumexp(np.array([np.inf, -np.inf])) == np.inf


def test_log_softmax_float16_beyond_its_range_rounds_to_minus_inf_without_warning():
    # Computed in float32 as softmax is: 60000 - (-60000) = 120000 exceeds float16's range and rounds to -inf.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = log_softmax(np.array([60000, -60000], np.float16))
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, [0.0, -np.inf])
