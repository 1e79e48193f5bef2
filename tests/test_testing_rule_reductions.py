"""attention_ref.testing._rule: a passing check decided by reductions alone is decided as the masks decide it.

`compare` takes the largest reference magnitude, the baseline's largest error and the largest error by
reductions when the reference is finite and nothing is skipped, and `errors` mends non-finite differences
only where there are some: the verdict at the bound itself, and with NaN, infinities or skipped elements,
must be the element-wise rule's.
"""

import numpy as np
import pytest

from attention_ref.testing._rule import ATOL_UNITS, compare, errors

ml_dtypes = pytest.importorskip("ml_dtypes")


def case(seed=0, shape=(2, 3, 40, 8)):
    rng = np.random.default_rng(seed)
    reference = rng.standard_normal(shape)
    baseline = (reference + rng.uniform(-1e-3, 1e-3, shape)).astype(np.float16)
    return reference, baseline


def verdict(actual, reference, baseline, factor=2.0, atol=0.0, **kw):
    return compare(actual, reference, baseline, factor=factor, atol=atol, units=ATOL_UNITS,
                   dtype=np.dtype(np.float16), **kw)


def test_an_error_at_the_bound_passes_and_just_above_it_fails():
    reference, baseline = case()
    actual = reference.copy()
    actual[1, 2, 7, 3] += 0.01
    err = abs(actual[1, 2, 7, 3] - reference[1, 2, 7, 3])
    assert verdict(actual, reference, baseline, factor=0.0, atol=err) == ""  # the bound is err itself
    found = verdict(actual, reference, baseline, factor=0.0, atol=np.nextafter(err, 0.0))
    assert found.startswith("1 of 1920 elements are too far") and "batch 1, head 2: row 7 (1 element)" in found
    assert verdict(actual, reference, baseline) != ""  # twice the baseline's largest error (1e-3) is less


def test_errors_mend_nan_and_infinities_and_keep_finite_differences():
    reference = np.array([1.0, np.inf, np.nan, 2.0, -np.inf, 0.5])
    actual = np.array([1.5, np.inf, np.nan, np.nan, np.inf, 0.5])
    np.testing.assert_array_equal(errors(actual, reference), [0.5, 0.0, 0.0, np.inf, np.inf, 0.0])
    np.testing.assert_array_equal(errors(np.array([1.0, -2.0]), np.array([0.25, -2.5])), [0.75, 0.5])
    assert errors(np.float16(1.5), np.float64(1.0)) == 0.5  # 0-d


@pytest.mark.parametrize("where", ["reference", "baseline", "skip"])
def test_non_finite_values_and_skips_take_the_masks(where):
    reference, baseline = case(1)
    actual = baseline.astype(np.float64)  # the baseline itself passes
    skip = None
    if where == "reference":
        reference[0, 0, 3, :] = np.nan
        actual[0, 0, 3, :] = np.nan  # the same non-finite value: no error
    elif where == "baseline":
        baseline[1, 1, 5, 2] = np.inf  # an overflowed baseline element does not count in its largest error
    else:
        skip = np.zeros(reference.shape, bool)
        skip[0, 1, 9, :] = True
        actual[0, 1, 9, :] = 1e9  # skipped: not checked
    assert verdict(actual, reference, baseline, skip=skip) == ""
    actual[1, 0, 2, 1] += 1.0
    assert "batch 1, head 0: row 2 (1 element)" in verdict(actual, reference, baseline, skip=skip)
