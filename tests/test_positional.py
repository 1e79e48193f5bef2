"""Unit tests for attention_ref.positional, against the published formulas written out by hand."""

import math

import numpy as np
import pytest

from attention_ref import alibi_bias, alibi_slopes, apply_rope, causal_mask, sinusoidal_positions

# ---------------------------------------------------------------- sinusoidal_positions


def test_sinusoidal_matches_vaswani_formula_elementwise():
    n, d, base = 7, 6, 10000.0
    pe = sinusoidal_positions(n, d)
    for p in range(n):
        for i in range(d // 2):
            angle = p / base ** (2 * i / d)
            assert pe[p, 2 * i] == pytest.approx(math.sin(angle), abs=1e-15)
            assert pe[p, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-15)


def test_sinusoidal_small_case_by_hand():
    # d = 2: one frequency, 1; columns sin(p), cos(p).
    pe = sinusoidal_positions(3, 2)
    np.testing.assert_allclose(pe, [[0.0, 1.0], [math.sin(1), math.cos(1)], [math.sin(2), math.cos(2)]], atol=1e-16)


def test_sinusoidal_odd_d_is_the_formula_with_a_lone_last_sine():
    pe = sinusoidal_positions(4, 5, base=100.0)
    assert pe.shape == (4, 5) and pe.dtype == np.float64
    p = np.arange(4)
    np.testing.assert_allclose(pe[:, 4], np.sin(p / 100.0 ** (4 / 5)), atol=1e-15)
    np.testing.assert_allclose(pe[:, 3], np.cos(p / 100.0 ** (2 / 5)), atol=1e-15)


def test_sinusoidal_relative_shift_is_a_rotation():
    # PE[p + k] is PE[p] rotated pairwise by the angle k * omega_i (the paper's motivation).
    d, k = 8, 3
    pe = sinusoidal_positions(20, d)
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    s, c = pe[:-k, 0::2], pe[:-k, 1::2]
    np.testing.assert_allclose(pe[k:, 0::2], s * np.cos(k * omega) + c * np.sin(k * omega), atol=1e-13)
    np.testing.assert_allclose(pe[k:, 1::2], c * np.cos(k * omega) - s * np.sin(k * omega), atol=1e-13)


def test_sinusoidal_empty_and_errors():
    assert sinusoidal_positions(0, 4).shape == (0, 4)
    with pytest.raises(ValueError, match="n"):
        sinusoidal_positions(-1, 4)
    with pytest.raises(ValueError, match="d"):
        sinusoidal_positions(3, 0)
    with pytest.raises(TypeError, match="d"):
        sinusoidal_positions(3, 4.0)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_positions(3, 4, base=0)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_positions(3, 4, base=np.inf)
    with pytest.raises(TypeError, match="base"):
        sinusoidal_positions(3, 4, base="10000")


# ---------------------------------------------------------------- apply_rope


def _rope_complex(x, positions, base):
    """Interleaved RoPE as complex multiplication (the RoFormer / LLaMA form): (x0 + i x1) e^{i p theta}."""
    d = x.shape[-1]
    z = x[..., 0::2] + 1j * x[..., 1::2]
    theta = base ** (-np.arange(0, d, 2) / d)
    z = z * np.exp(1j * np.asarray(positions, dtype=float)[..., None] * theta)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def _rope_rotate_half(x, positions, base):
    """Half-split RoPE as written in GPT-NeoX / Hugging Face: x * cos + rotate_half(x) * sin."""
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)
    angles = np.asarray(positions, dtype=float)[..., None] * theta
    angles = np.concatenate([angles, angles], axis=-1)
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)
    return x * np.cos(angles) + rotated * np.sin(angles)


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_interleaved_matches_complex_form(rng, base):
    x = rng.normal(size=(2, 5, 8))
    pos = np.array([0.0, 1.0, 2.0, 7.0, 100.0])
    np.testing.assert_allclose(apply_rope(x, pos, base=base, interleaved=True), _rope_complex(x, pos, base), atol=1e-13)


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_half_matches_rotate_half_form(rng, base):
    x = rng.normal(size=(3, 4, 6))
    pos = np.arange(4) + 3
    np.testing.assert_allclose(apply_rope(x, pos, base=base), _rope_rotate_half(x, pos, base), atol=1e-13)


def test_rope_default_positions_are_arange(rng):
    x = rng.normal(size=(2, 6, 4))
    np.testing.assert_array_equal(apply_rope(x), apply_rope(x, np.arange(6)))
    np.testing.assert_array_equal(apply_rope(x, interleaved=True), apply_rope(x, np.arange(6), interleaved=True))


def test_rope_position_zero_is_identity(rng):
    x = rng.normal(size=(1, 4))
    np.testing.assert_array_equal(apply_rope(x, [0]), x)


def test_rope_two_dimensional_rotation_by_hand():
    # D = 2, theta_0 = 1: position p rotates (1, 0) to (cos p, sin p).
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    out = apply_rope(x, [0.0, 0.5, 1.0])
    expected = [[1.0, 0.0], [math.cos(0.5), math.sin(0.5)], [-2 * math.sin(1.0), 2 * math.cos(1.0)]]
    np.testing.assert_allclose(out, expected, atol=1e-16)


def test_rope_layouts_agree_up_to_a_feature_permutation(rng):
    d = 8
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # interleaved -> half layout
    x = rng.normal(size=(3, 5, d))
    half = apply_rope(x[..., perm])
    inter = apply_rope(x, interleaved=True)
    np.testing.assert_allclose(half, inter[..., perm], atol=1e-14)
    assert not np.allclose(apply_rope(x), inter)  # the layouts really differ


def test_rope_per_batch_positions(rng):
    x = rng.normal(size=(2, 3, 4, 6))  # (B, H, T, D)
    pos = np.array([[0, 1, 2, 3], [10, 11, 12, 13]])[:, None, :]  # (B, 1, T)
    out = apply_rope(x, pos)
    for b in range(2):
        np.testing.assert_allclose(out[b], apply_rope(x[b], pos[b, 0]), atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_rope_preserves_dtype(rng, dtype):
    x = rng.normal(size=(4, 6)).astype(dtype)
    out = apply_rope(x, np.arange(4) * 1000)
    assert out.dtype == dtype and out.shape == x.shape
    ref = apply_rope(x.astype(np.float64), np.arange(4) * 1000)
    tol = {np.float16: 3e-3, np.float32: 1e-6, np.float64: 1e-15}[dtype]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


def test_rope_integer_input_gives_float64():
    assert apply_rope(np.array([[1, 2]]), [1]).dtype == np.float64


def test_rope_errors():
    with pytest.raises(ValueError, match="even"):
        apply_rope(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="x must have at least 2"):
        apply_rope(np.zeros(4))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(np.zeros((3, 4)), positions=[0, 1])
    with pytest.raises(ValueError, match="positions"):
        apply_rope(np.zeros((3, 4)), positions=np.zeros((2, 3)))  # would add a batch axis
    with pytest.raises(TypeError, match="positions"):
        apply_rope(np.zeros((3, 4)), positions=[True, False, True])
    with pytest.raises(TypeError, match="x"):
        apply_rope(np.zeros((3, 4), dtype=complex))
    with pytest.raises(TypeError, match="interleaved"):
        apply_rope(np.zeros((3, 4)), interleaved="yes")
    with pytest.raises(ValueError, match="base"):
        apply_rope(np.zeros((3, 4)), base=-1.0)


# ---------------------------------------------------------------- alibi_slopes


def test_alibi_slopes_published_eight_heads():
    np.testing.assert_array_equal(alibi_slopes(8), [1 / 2**k for k in range(1, 9)])


def test_alibi_slopes_sixteen_heads_are_powers_of_root_two():
    # Paper (Sec. 3): for 16 heads the 8-head slopes are interpolated by geometric means of consecutive
    # pairs, giving the sequence that starts at 1/sqrt(2) with ratio 1/sqrt(2).
    expected = [2.0 ** (-k / 2) for k in range(1, 17)]
    np.testing.assert_allclose(alibi_slopes(16), expected, rtol=1e-15)
    np.testing.assert_allclose(alibi_slopes(16)[1::2], alibi_slopes(8), rtol=1e-15)


def test_alibi_slopes_non_power_of_two():
    # 12 heads: the 8-head slopes, then slopes 0, 2, 4, 6 of the 16-head sequence: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    expected = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_allclose(alibi_slopes(12), expected, rtol=1e-15)
    # 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3 from 8 heads.
    np.testing.assert_allclose(alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3], rtol=1e-15)
    # 3 heads: 2 heads give 2^-4, 2^-8; then 2^-2 from 4 heads.
    np.testing.assert_allclose(alibi_slopes(3), [2.0**-4, 2.0**-8, 2.0**-2], rtol=1e-15)


def test_alibi_slopes_one_head():
    np.testing.assert_array_equal(alibi_slopes(1), [2.0**-8])


def test_alibi_slopes_errors():
    with pytest.raises(ValueError, match="n_heads"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="n_heads"):
        alibi_slopes(8.0)


# ---------------------------------------------------------------- alibi_bias


def test_alibi_bias_by_hand():
    m = alibi_slopes(2)
    b = alibi_bias(2, 3)
    assert b.shape == (2, 3, 3) and b.dtype == np.float64
    dist = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]])
    for h in range(2):
        np.testing.assert_array_equal(b[h], -m[h] * dist)
    assert np.all(b[np.signbit(b)] < 0)  # no -0.0 entries (they would print as -0.)


def test_alibi_bias_equals_paper_form_on_causal_keys():
    # Paper: query i adds m * [-(i), ..., -2, -1, 0] to its scores with keys 0..i.
    n = 5
    b = alibi_bias(4, n)
    m = alibi_slopes(4)
    for i in range(n):
        for h in range(4):
            np.testing.assert_array_equal(b[h, i, : i + 1], m[h] * np.arange(-i, 1))


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_alibi_bias_rectangular(alignment):
    L, S = 2, 5
    b = alibi_bias(1, L, S, alignment=alignment)
    offset = 0 if alignment == "top-left" else S - L
    expected = -(2.0**-8) * np.abs(np.arange(L)[:, None] + offset - np.arange(S)[None, :])
    np.testing.assert_array_equal(b[0], expected)
    # The diagonal of the causal mask with the same alignment is where the bias is zero.
    last_allowed = causal_mask(L, S, alignment=alignment).sum(-1) - 1
    np.testing.assert_array_equal(b[0, np.arange(L), last_allowed], 0.0)


def test_alibi_bias_errors():
    with pytest.raises(ValueError, match="n_heads"):
        alibi_bias(0, 3)
    with pytest.raises(ValueError, match="n_queries"):
        alibi_bias(2, -1)
    with pytest.raises(TypeError, match="n_keys"):
        alibi_bias(2, 3, 2.5)
    with pytest.raises(ValueError, match="alignment"):
        alibi_bias(2, 3, alignment="left")
