"""attention_ref.testing._rounding: the baselines' rounding by bit operations gives the conversion's bits.

Against ``astype(dtype).astype(float32)``, both signs: for bfloat16 every float32 bit pattern of the
exponents where its rounding changes behaviour (subnormals, around 1, float16's range, float32's largest
values, infinities and NaN); for float16, whose conversion is scalar code, every pattern of the low 16
mantissa bits (the rounding bit, the sticky bits below it) under upper bits that carry or not, at every
exponent of its subnormal range and the others above.
"""

import numpy as np
import pytest

from attention_ref.testing._baseline import rounding
from attention_ref.testing._rounding import (
    CHUNK,
    FAST_MIN,
    FLOAT16_MAX,
    _by_chunks,
    _to_bfloat16,
    _to_float16,
    round_to,
)

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
MANTISSAS = np.arange(1 << 23, dtype=np.uint32)


#: float16's mantissas: every low 16 bits under these upper 7 (none, all, halfway, alternating, ...).
UPPER = np.array([0, 1, 0x20, 0x3F, 0x40, 0x41, 0x55, 0x7F], dtype=np.uint32) << np.uint32(16)
MANTISSAS_16 = (UPPER[:, None] | np.arange(1 << 16, dtype=np.uint32)).ravel()


def every_pattern(exponent: int, mantissas=MANTISSAS) -> np.ndarray:
    """Every float32 with this exponent field and one of `mantissas`, both signs."""
    bits = (np.uint32(exponent) << np.uint32(23)) | mantissas
    return np.concatenate([bits, bits | np.uint32(1 << 31)]).view(np.float32)


def converted(x, dtype):
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and overflow warn in the conversion
        return x.astype(dtype).astype(np.float32)


def fast(x, dtype):
    """`round_to`, with the conversion's warnings silenced where it falls back to the conversion."""
    with np.errstate(invalid="ignore", over="ignore"):
        return round_to(x, dtype)


def assert_same_bits(got, want):
    assert got.dtype == np.float32 and got.shape == want.shape
    mismatch = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert mismatch.size == 0, f"{mismatch.size} differ, first {want[mismatch[0]]!r}: got {got[mismatch[0]]!r}"


# exponent fields: float32 subnormals, float16's subnormal range (2**-25 to 2**-15) and its smallest normal
# binade (2**-14), around 1, float16's largest binade, float32's largest binade, infinity and NaN
@pytest.mark.parametrize("exponent", [0, 1, 102, 103, 111, 112, 113, 126, 127, 142, 143, 254, 255])
def test_bfloat16_rounding_is_the_conversion_bit_for_bit(exponent):
    x = every_pattern(exponent)
    want = converted(x, BF16)
    finite = ~np.isnan(x)  # the bit operations themselves (NaN takes the conversion)
    assert_same_bits(_by_chunks(x[finite], _to_bfloat16), want[finite])
    assert_same_bits(fast(x, BF16), want)


@pytest.mark.parametrize("exponent", [0, 1, *range(100, 115), 126, 127, 141, 142, 143, 254, 255])
def test_float16_rounding_is_the_conversion_bit_for_bit(exponent):
    x = every_pattern(exponent, MANTISSAS_16)
    want = converted(x, np.float16)
    in_range = np.abs(x) <= FLOAT16_MAX  # the bit operations themselves
    if in_range.any():
        assert_same_bits(_by_chunks(x[in_range], _to_float16), want[in_range])
    assert_same_bits(fast(x, np.float16), want)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bfloat16", "float16"])
def test_special_values_and_shapes(dtype):
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65519.996, 65520.0, -65520.0,
                         2.0**-24, 2.0**-25, -(2.0**-25), 3 * 2.0**-26, 1 + 2.0**-8, 1 + 3 * 2.0**-8,
                         np.finfo(np.float32).max, np.finfo(np.float32).tiny], dtype=np.float32)
    payloads = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)
    ordinary = np.random.default_rng(1).standard_normal(CHUNK + 7).astype(np.float32)  # the bit operations
    for x in (specials, payloads, specials[::-3], specials.reshape(2, 9).T, specials[:0], ordinary,
              ordinary[::-3], np.concatenate([ordinary, specials]), ordinary[: 2 * FAST_MIN].reshape(64, -1).T):
        assert_same_bits(fast(x, dtype), converted(x, dtype))
    for x in (np.float32(1 + 2.0**-8), np.array(np.float32(3.3)), np.float64(0.1) * np.ones(3)):
        got, want = fast(x, dtype), converted(x, dtype)  # scalars, 0-d and float64: the conversion
        assert type(got) is type(want) and got.tobytes() == want.tobytes()


def test_round_to_leaves_its_input_alone_and_the_baselines_use_it():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    before = x.copy()
    for dtype in (BF16, np.dtype(np.float16)):
        rnd, inner, _ = rounding(dtype, fused=True)
        assert_same_bits(rnd(x), converted(x, dtype))
        assert_same_bits(inner(x), x)  # the fused model keeps its inner steps in float32
        wide = x.astype(np.float64)  # rounded once from float64, as the conversion does
        assert_same_bits(rnd(wide), converted(wide, dtype))
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bfloat16", "float16"])
def test_rounding_in_place_gives_the_same_bits(dtype):
    """``in_place``: bfloat16's bit operations write into a contiguous input and return it; float16, a strided
    input and one below `FAST_MIN` elements get a new array, the input left alone."""
    ordinary = np.random.default_rng(2).standard_normal(2 * CHUNK + 8).astype(np.float32)
    ordinary[:4] = [0.0, -0.0, 1 + 2.0**-8, -(1 + 3 * 2.0**-8)]  # a tie to even each way, signed zeros
    for x, written in ((ordinary, dtype == BF16), (ordinary.reshape(-1, 5)[:, ::2], False),
                       (ordinary[: FAST_MIN - 1], False)):
        x = x.copy() if x.flags.c_contiguous else x
        before, want = x.copy(), converted(x, dtype)
        got = round_to(x, dtype, in_place=True)
        assert_same_bits(got, want)
        assert np.shares_memory(got, x) == written
        assert_same_bits(x, want if written else before)


def test_float16_widens_to_the_conversion_s_bits():
    """`widen_float16` gives `astype(float32)`'s bits for every float16 pattern, NaN payloads included, also on a
    strided view (the baselines widen the kernel's float16 inputs with it)."""
    from attention_ref.testing._rounding import widen_float16

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)
    for x in (every, every[:, ::3], every.T):
        got = widen_float16(x)
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_array_equal(got.view(np.uint32), x.astype(np.float32).view(np.uint32))
