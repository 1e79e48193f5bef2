"""Conformance with PyTorch in float64: SDPA, softmax, log_softmax, logsumexp.

Every comparison asserts ``max |ours - torch| <= 1e-12`` and records the
deviation; the largest one is printed at the end of the session (see
``pytest_terminal_summary`` in conftest.py).

PyTorch is pinned to its math SDPA kernel (``SDPBackend.MATH``): the fused
CPU kernels are not meant for float64 reference work.

Fully masked rows: ``torch.softmax`` of an all ``-inf`` row is NaN, ours is
zeros (tested below). PyTorch's SDPA has used a "safe" softmax since 2.5 and
gives zeros as well (measured with 2.13); older versions gave NaN. The SDPA
comparison therefore accepts NaN *or* zeros from torch in such rows and
compares all other rows exactly.

Soft caps, windows, ALiBi and sinks are compared with three peers, each in its own
group of the deviation summary:

- ``torch.nn.attention.flex_attention`` (FlexAttention), run eagerly on the CPU (it
  warns that it is not compiled and materialises the scores: fine for an oracle),
  with ``score_mod`` for the soft cap and ALiBi and ``mask_mod``/``create_block_mask``
  for windows; float64 to 1e-12, and float32 against our float32;
- FlashAttention's test oracle ``attention_ref`` (windows with its per-sequence
  bottom-right alignment under key and query padding and left-padded keys, the soft
  cap before the masks, ALiBi as ``attn_bias``), re-written in plain torch in
  ``tests/flash_reference.py``;
- gpt-oss's reference attention with sinks (a softmax over the scores with the sink
  appended as a last column, which is then dropped), written out below.
"""

import warnings

import numpy as np
import pytest
from conftest import assert_finite_where, not_recorded, planted

from attention_ref import (
    blockwise_attention,
    causal_mask,
    log_softmax,
    logsumexp,
    scaled_dot_product_attention,
    softmax,
)

pytestmark = pytest.mark.torch

TOL = 1e-12
SEEDS = range(4)


@pytest.fixture
def tt(torch):
    """torch with one thread (the test machine is shared) and the math SDPA kernel."""
    torch.set_num_threads(1)
    return torch


def t64(torch, a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def torch_sdpa(torch, q, k, v, **kwargs):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = kwargs.pop("attn_mask", None)
    if isinstance(mask, np.ndarray):
        mask = torch.from_numpy(mask) if mask.dtype == np.bool_ else t64(torch, mask)
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            t64(torch, q), t64(torch, k), t64(torch, v), attn_mask=mask, **kwargs
        )
    return out.numpy()


def assert_conforms(record_deviation, ours, theirs, *, empty_rows=None, group="torch"):
    """Compare outputs of shape (..., L, Ev); rows flagged in `empty_rows` (..., L) are checked separately."""
    assert ours.shape == theirs.shape
    if empty_rows is not None and np.any(empty_rows):
        empty_rows = np.broadcast_to(empty_rows, ours.shape[:-1])
        np.testing.assert_array_equal(ours[empty_rows], 0.0)
        torch_rows = theirs[empty_rows]
        assert np.all(np.isnan(torch_rows) | (torch_rows == 0.0))
        ours, theirs = ours[~empty_rows], theirs[~empty_rows]
    assert np.all(np.isfinite(theirs)), f"{group} returned NaN outside fully masked rows"
    assert_finite_where(ours, theirs, group)
    deviation = record_deviation(group, ours, theirs)
    assert deviation <= TOL


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_assert_conforms_fails_on_nan_or_inf_in_ours(value):
    ours, theirs = planted(value)
    assert_conforms(not_recorded, theirs.copy(), theirs)
    with pytest.raises(AssertionError):
        assert_conforms(not_recorded, ours, theirs)
    with pytest.raises(AssertionError):  # also when an empty row of the reference is set aside
        assert_conforms(not_recorded, ours, theirs, empty_rows=np.arange(3) == 0)


def random_problem(seed, *, batch=(2, 3), L=None, S=None, E=None, Ev=None):
    gen = np.random.default_rng(seed)
    L = int(gen.integers(1, 7)) if L is None else L
    S = int(gen.integers(1, 7)) if S is None else S
    E = int(gen.integers(1, 9)) if E is None else E
    Ev = int(gen.integers(1, 9)) if Ev is None else Ev
    q = gen.normal(size=(*batch, L, E))
    k = gen.normal(size=(*batch, S, E))
    v = gen.normal(size=(*batch, S, Ev))
    return gen, q, k, v


# --- SDPA -------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_plain_attention(tt, record_deviation, seed):
    _, q, k, v = random_problem(seed)
    assert_conforms(record_deviation, scaled_dot_product_attention(q, k, v), torch_sdpa(tt, q, k, v))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [0.0, 0.125, 1.0, 3.0])
def test_explicit_scale(tt, record_deviation, seed, scale):
    _, q, k, v = random_problem(seed, E=4, Ev=7)
    assert_conforms(record_deviation, scaled_dot_product_attention(q, k, v, scale=scale),
                    torch_sdpa(tt, q, k, v, scale=scale))


@pytest.mark.parametrize("seed", SEEDS)
def test_boolean_mask_with_empty_rows(tt, record_deviation, seed):
    gen, q, k, v = random_problem(seed, L=5, S=4)
    mask = gen.random((2, 1, 5, 4)) < 0.5  # broadcast over heads
    mask[0, 0, 1] = False  # at least one fully masked row
    ours = scaled_dot_product_attention(q, k, v, mask=mask)
    assert_conforms(record_deviation, ours, torch_sdpa(tt, q, k, v, attn_mask=mask), empty_rows=~mask.any(-1))


@pytest.mark.parametrize("seed", SEEDS)
def test_float_bias(tt, record_deviation, seed):
    gen, q, k, v = random_problem(seed)
    bias = gen.normal(size=q.shape[-2:-1] + k.shape[-2:-1]) * 2
    bias[0, -1] = -np.inf  # a float mask entry
    ours = scaled_dot_product_attention(q, k, v, bias=bias)
    assert_conforms(record_deviation, ours, torch_sdpa(tt, q, k, v, attn_mask=bias))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("L, S", [(3, 3), (2, 6), (6, 2)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_is_causal(tt, record_deviation, seed, L, S, alignment):
    """Top-left is torch's ``is_causal``; bottom-right is ``causal_lower_right``."""
    from torch.nn.attention.bias import causal_lower_right

    _, q, k, v = random_problem(seed, L=L, S=S)
    if alignment == "top-left":
        torch_kwargs = {"is_causal": True}
    else:
        with warnings.catch_warnings():
            # torch warns that L > S "will produce NaNs"; the rows it means are the fully masked ones.
            warnings.filterwarnings("ignore", message="Lower right causal bias", category=UserWarning)
            torch_kwargs = {"attn_mask": causal_lower_right(L, S)}
    ours = scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment=alignment)
    empty = ~causal_mask(L, S, alignment=alignment).any(-1)
    assert_conforms(record_deviation, ours, torch_sdpa(tt, q, k, v, **torch_kwargs), empty_rows=empty)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_kv, group", [(1, 4), (2, 2), (2, 3), (3, 1)])
def test_enable_gqa(tt, record_deviation, seed, n_kv, group):
    gen = np.random.default_rng(seed)
    L, S = int(gen.integers(1, 6)), int(gen.integers(1, 6))
    q = gen.normal(size=(2, n_kv * group, L, 4))
    k = gen.normal(size=(2, n_kv, S, 4))
    v = gen.normal(size=(2, n_kv, S, 3))
    ours = scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    assert_conforms(record_deviation, ours, torch_sdpa(tt, q, k, v, enable_gqa=True, is_causal=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_broadcast_batch_axes(tt, record_deviation, seed):
    gen = np.random.default_rng(seed)
    q = gen.normal(size=(2, 1, 3, 4))
    k = gen.normal(size=(1, 3, 5, 4))
    v = gen.normal(size=(1, 3, 5, 2))
    mask = gen.random((5,)) < 0.7
    mask[0] = True
    ours = scaled_dot_product_attention(q, k, v, mask=mask)
    assert_conforms(record_deviation, ours, torch_sdpa(tt, q, k, v, attn_mask=mask))


@pytest.mark.parametrize("seed", SEEDS)
def test_everything_at_once(tt, record_deviation, seed):
    # Boolean mask plus is_causal is not allowed by torch; fold the causal mask into a float bias instead.
    gen = np.random.default_rng(seed)
    L, S = int(gen.integers(2, 6)), int(gen.integers(2, 6))
    q = gen.normal(size=(2, 4, L, 6)) * 2
    k = gen.normal(size=(2, 2, S, 6)) * 2
    v = gen.normal(size=(2, 2, S, 3))
    bias = gen.normal(size=(4, L, S))
    ours = scaled_dot_product_attention(q, k, v, bias=bias, is_causal=True, scale=0.3, enable_gqa=True)
    torch_bias = bias + np.where(causal_mask(L, S), 0.0, -np.inf)
    theirs = torch_sdpa(tt, q, k, v, attn_mask=torch_bias, scale=0.3, enable_gqa=True)
    assert_conforms(record_deviation, ours, theirs, empty_rows=~causal_mask(L, S).any(-1))


def test_fully_masked_rows_are_zeros_here_and_in_current_torch_sdpa(tt, record_deviation):
    _, q, k, v = random_problem(0, L=3, S=4)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    ours = scaled_dot_product_attention(q, k, v, mask=mask)
    theirs = torch_sdpa(tt, q, k, v, attn_mask=mask)
    np.testing.assert_array_equal(ours[..., 1, :], 0.0)
    # torch >= 2.5 uses a safe softmax in SDPA (zeros); earlier versions returned NaN.
    row = theirs[..., 1, :]
    assert np.all(row == 0.0) or np.all(np.isnan(row))
    assert_conforms(record_deviation, ours, theirs, empty_rows=~mask.any(-1))


# --- softmax family ---------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("spread", [1.0, 30.0, 1e4])
def test_softmax_family(tt, record_deviation, seed, spread):
    gen = np.random.default_rng(seed)
    x = gen.normal(size=(3, 4, 7)) * spread
    xt = t64(tt, x)
    for axis in (-1, 0, 1):
        dev = record_deviation("torch", softmax(x, axis=axis), tt.softmax(xt, dim=axis).numpy())
        assert dev <= TOL
        # log_softmax and logsumexp are O(spread): compare relative to the magnitude
        lsm_t = tt.log_softmax(xt, dim=axis).numpy()
        np.testing.assert_allclose(log_softmax(x, axis=axis), lsm_t, rtol=TOL, atol=TOL)
        lse_t = tt.logsumexp(xt, dim=axis).numpy()
        np.testing.assert_allclose(logsumexp(x, axis=axis), lse_t, rtol=TOL, atol=TOL)
        if spread == 1.0:
            assert record_deviation("torch", log_softmax(x, axis=axis), lsm_t) <= TOL
            assert record_deviation("torch", logsumexp(x, axis=axis), lse_t) <= TOL


def test_softmax_of_all_minus_inf_row_differs_from_torch(tt):
    # Documented difference: ours gives zeros (a fully masked attention row), torch.softmax gives NaN.
    x = np.array([[-np.inf, -np.inf], [0.0, 1.0]])
    theirs = tt.softmax(t64(tt, x), dim=-1).numpy()
    assert np.all(np.isnan(theirs[0]))
    np.testing.assert_array_equal(softmax(x)[0], 0.0)
    np.testing.assert_allclose(softmax(x)[1], theirs[1], rtol=0, atol=TOL)
    # log-space functions agree: -inf for the empty row
    np.testing.assert_array_equal(logsumexp(x)[0], tt.logsumexp(t64(tt, x), dim=-1).numpy()[0])


def test_nan_and_inf_slices_match_torch(tt):
    x = np.array([[np.nan, 0.0], [np.inf, 0.0], [np.inf, -np.inf], [1.0, 2.0]])
    xt = t64(tt, x)
    # NaN anywhere, or +inf, poisons the whole slice in both; logsumexp keeps +inf.
    np.testing.assert_array_equal(softmax(x)[:3], tt.softmax(xt, dim=-1).numpy()[:3])
    np.testing.assert_array_equal(log_softmax(x)[:3], tt.log_softmax(xt, dim=-1).numpy()[:3])
    np.testing.assert_array_equal(logsumexp(x)[:3], tt.logsumexp(xt, dim=-1).numpy()[:3])


# --- soft cap, windows, ALiBi: FlexAttention ----------------------------------------


def flex_attention(torch, q, k, v, *, score_mod=None, mask_mod=None, scale=None, enable_gqa=False, dtype=np.float64):
    """Eager FlexAttention on the CPU: ``(out, lse)`` as NumPy arrays in `dtype`."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as flex

    def as_tensor(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))

    L, S = q.shape[-2], k.shape[-2]
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, L, S, device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
        out, aux = flex(as_tensor(q), as_tensor(k), as_tensor(v), score_mod=score_mod, block_mask=block_mask,
                        scale=scale, enable_gqa=enable_gqa, return_aux=AuxRequest(lse=True))
    return out.numpy(), aux.lse.numpy()


def flex_window(offset, window):
    """FlexAttention ``mask_mod`` of the window ``(left, right)`` around key position ``q_idx + offset``."""
    left, right = window

    def mask_mod(b, h, q_idx, kv_idx):
        position = q_idx + offset
        allowed = kv_idx >= 0
        if left is not None:
            allowed = allowed & (kv_idx >= position - left)
        if right is not None:
            allowed = allowed & (kv_idx <= position + right)
        return allowed

    return mask_mod


def flex_score_mod(torch, *, softcap=None, slopes=None, offset=0):
    """FlexAttention ``score_mod``: the soft cap, then ``- slope_h |q_idx + offset - kv_idx|``."""
    slopes = None if slopes is None else torch.from_numpy(np.asarray(slopes, dtype=np.float64))

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            score = score - slopes.to(score.dtype)[h] * (q_idx + offset - kv_idx).abs().to(score.dtype)
        return score

    return score_mod


def offset_of(alignment, L, S):
    return 0 if alignment == "top-left" else S - L


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("is_causal", [False, True])
def test_softcap_matches_flex_attention(tt, record_deviation, seed, softcap, is_causal):
    _, q, k, v = random_problem(seed, L=5, S=7)
    q = 3 * q
    mask_mod = flex_window(0, (None, 0)) if is_causal else None
    theirs, _ = flex_attention(tt, q, k, v, score_mod=flex_score_mod(tt, softcap=softcap), mask_mod=mask_mod)
    ours = scaled_dot_product_attention(q, k, v, softcap=softcap, is_causal=is_causal)
    assert_conforms(record_deviation, ours, theirs, group="flex_attention softcap")


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize(("L", "S"), [(5, 5), (3, 7), (7, 3)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_alibi_matches_flex_attention(tt, record_deviation, seed, L, S, alignment, is_causal):
    from attention_ref import alibi_slopes

    _, q, k, v = random_problem(seed, L=L, S=S)
    slopes = alibi_slopes(3)
    offset = offset_of(alignment, L, S)
    mask_mod = flex_window(offset, (None, 0)) if is_causal else None
    theirs, _ = flex_attention(tt, q, k, v, score_mod=flex_score_mod(tt, slopes=slopes, offset=offset),
                               mask_mod=mask_mod)
    ours = scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, is_causal=is_causal, causal_alignment=alignment)
    empty = ~causal_mask(L, S, alignment=alignment).any(-1) if is_causal else None
    assert_conforms(record_deviation, ours, theirs, empty_rows=empty, group="flex_attention alibi")


WINDOWS = [(0, 0), (1, 0), (2, 1), (None, 1), (2, None), (0, None), (5, 5)]


@pytest.mark.parametrize(("L", "S"), [(5, 5), (3, 8), (8, 3)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("window", WINDOWS)
def test_window_matches_flex_attention(tt, record_deviation, L, S, alignment, window):
    from attention_ref import sliding_window_mask

    _, q, k, v = random_problem(0, L=L, S=S)
    theirs, theirs_lse = flex_attention(tt, q, k, v, mask_mod=flex_window(offset_of(alignment, L, S), window))
    ours, lse = blockwise_attention(q, k, v, window=window, causal_alignment=alignment, block_size=2, return_lse=True)
    empty = ~sliding_window_mask(L, S, window=window, alignment=alignment).any(-1)
    assert_conforms(record_deviation, ours, theirs, empty_rows=empty, group="flex_attention window")
    assert_conforms(record_deviation, scaled_dot_product_attention(q, k, v, window=window, causal_alignment=alignment),
                    theirs, empty_rows=empty, group="flex_attention window")
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(theirs_lse))
    finite = np.isfinite(lse)
    assert record_deviation("flex_attention window lse", lse[finite], theirs_lse[finite]) <= TOL


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_every_option_with_gqa_matches_flex_attention(tt, record_deviation, seed, alignment):
    gen = np.random.default_rng(seed)
    L, S = int(gen.integers(2, 9)), int(gen.integers(2, 9))
    q = 2 * gen.normal(size=(2, 4, L, 6))
    k = 2 * gen.normal(size=(2, 2, S, 6))
    v = gen.normal(size=(2, 2, S, 3))
    slopes, window, softcap, scale = np.array([0.5, 0.25, 0.125, 1.0]), (2, 1), 2.5, 0.3
    offset = offset_of(alignment, L, S)
    theirs, theirs_lse = flex_attention(
        tt, q, k, v, score_mod=flex_score_mod(tt, softcap=softcap, slopes=slopes, offset=offset),
        mask_mod=flex_window(offset, (window[0], 0)), scale=scale, enable_gqa=True,
    )
    options = {"window": window, "is_causal": True, "causal_alignment": alignment, "softcap": softcap,
               "alibi_slopes": slopes, "scale": scale, "enable_gqa": True}
    ours, lse = blockwise_attention(q, k, v, block_size=(2, 3), return_lse=True, **options)
    empty = ~causal_mask(L, S, alignment=alignment).any(-1)
    assert_conforms(record_deviation, ours, theirs, empty_rows=empty, group="flex_attention all options")
    assert_conforms(record_deviation, scaled_dot_product_attention(q, k, v, **options), theirs, empty_rows=empty,
                    group="flex_attention all options")
    finite = np.isfinite(lse)
    np.testing.assert_array_equal(finite, np.isfinite(theirs_lse))
    assert record_deviation("flex_attention all options lse", lse[finite], theirs_lse[finite]) <= TOL


@pytest.mark.parametrize("seed", SEEDS)
def test_every_option_matches_flex_attention_in_float32(tt, seed):
    """Our float32 against FlexAttention's (not recorded: the summary's maxima are float64's; measured 3.6e-7)."""
    gen = np.random.default_rng(seed)
    q, k = (gen.normal(size=(2, 3, 9, 8)).astype(np.float32) for _ in range(2))
    v = gen.normal(size=(2, 3, 9, 4)).astype(np.float32)
    slopes = np.array([0.5, 0.25, 0.125], np.float32)
    theirs, _ = flex_attention(tt, q, k, v, score_mod=flex_score_mod(tt, softcap=3.0, slopes=slopes),
                               mask_mod=flex_window(0, (3, 1)), dtype=np.float32)
    ours = scaled_dot_product_attention(q, k, v, window=(3, 1), softcap=3.0, alibi_slopes=slopes)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


# --- soft cap, windows, ALiBi, padding: FlashAttention's test oracle -----------------


def flash(tt, q, k, v, **kwargs):
    """tests/flash_reference.attention_ref on our (batch, heads, seqlen, d) layout, in float64."""
    from flash_reference import attention_ref

    def to_flash(a):
        return torch_layout(tt, a)

    out, attention = attention_ref(to_flash(q), to_flash(k), to_flash(v), **kwargs)
    return np.swapaxes(out.numpy(), 1, 2), attention.numpy()


def torch_layout(tt, a):
    """(batch, heads, seqlen, d) -> a float64 tensor (batch, seqlen, heads, d)."""
    return t64(tt, np.swapaxes(a, 1, 2))


def flash_window(window):
    """Our window pair as FlashAttention's window_size (-1 for unbounded)."""
    return tuple(-1 if side is None else side for side in window)


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize(("L", "S"), [(5, 5), (3, 8), (8, 3)])
@pytest.mark.parametrize("window", [*WINDOWS, (None, None)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_window_matches_flash_attention_reference(tt, record_deviation, seed, L, S, window, is_causal):
    _, q, k, v = random_problem(seed, L=L, S=S)
    theirs, theirs_w = flash(tt, q, k, v, window_size=flash_window(window), causal=is_causal)
    ours, w = scaled_dot_product_attention(q, k, v, window=window, is_causal=is_causal,
                                           causal_alignment="bottom-right", return_weights=True)
    empty = ~w.any(-1)  # only rows the window (or causal mask) empties: FlashAttention zeros them too
    assert_conforms(record_deviation, ours, theirs, empty_rows=empty, group="flash_attn reference window")
    assert record_deviation("flash_attn reference window", w[~empty], theirs_w[~empty]) <= TOL
    assert_conforms(record_deviation, blockwise_attention(q, k, v, window=window, is_causal=is_causal,
                                                          causal_alignment="bottom-right", block_size=3),
                    theirs, empty_rows=empty, group="flash_attn reference window")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("softcap", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("is_causal", [False, True])
def test_softcap_matches_flash_attention_reference(tt, record_deviation, seed, softcap, is_causal):
    _, q, k, v = random_problem(seed, L=4, S=6)
    q = 3 * q
    theirs, _ = flash(tt, q, k, v, softcap=softcap, causal=is_causal)
    ours = scaled_dot_product_attention(q, k, v, softcap=softcap, is_causal=is_causal, causal_alignment="bottom-right")
    assert_conforms(record_deviation, ours, theirs, group="flash_attn reference softcap")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("L", "S"), [(5, 5), (3, 7), (7, 3)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("per_batch", [False, True])
def test_alibi_matches_flash_attention_reference(tt, record_deviation, seed, L, S, is_causal, per_batch):
    from flash_reference import alibi_bias

    gen, q, k, v = random_problem(seed, L=L, S=S)
    slopes = gen.uniform(0.0, 1.0, (2, 3) if per_batch else (3,))
    bias = alibi_bias(t64(tt, slopes), L, S, causal=is_causal)
    theirs, _ = flash(tt, q, k, v, attn_bias=bias, causal=is_causal)
    ours = scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, is_causal=is_causal,
                                       causal_alignment="bottom-right")
    empty = ~causal_mask(L, S, alignment="bottom-right").any(-1) if is_causal else None
    assert_conforms(record_deviation, ours, theirs, empty_rows=empty, group="flash_attn reference alibi")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("window", [(2, 1), (None, 0), (1, None), (3, 0)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_padded_batches_match_flash_attention_reference(tt, record_deviation, seed, window, is_causal):
    """Right-padded queries and keys: FlashAttention aligns each sequence bottom-right on its real lengths,
    which is attention_ref on the unpadded sequence with causal_alignment="bottom-right"."""
    from flash_reference import alibi_bias

    _, q, k, v = random_problem(seed, L=6, S=8)
    sq, sk = np.array([6, 3]), np.array([5, 8])
    query_padding = np.arange(6) < sq[:, None]
    key_padding = np.arange(8) < sk[:, None]
    slopes = np.array([0.5, 0.25, 0.125])
    padding = {"query_padding_mask": tt.from_numpy(query_padding), "key_padding_mask": tt.from_numpy(key_padding)}
    bias = alibi_bias(t64(tt, slopes), 6, 8, causal=is_causal, **padding)
    theirs, _ = flash(tt, q, k, v, attn_bias=bias, causal=is_causal, window_size=flash_window(window), softcap=4.0,
                      **padding)
    options = {"window": window, "is_causal": is_causal, "causal_alignment": "bottom-right", "softcap": 4.0,
               "alibi_slopes": slopes}
    for b in range(2):
        mine = scaled_dot_product_attention(q[b, :, : sq[b]], k[b, :, : sk[b]], v[b, :, : sk[b]], **options)
        assert_conforms(record_deviation, mine, theirs[b, :, : sq[b]], group="flash_attn reference padding")
        np.testing.assert_array_equal(theirs[b, :, sq[b] :], 0.0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("window", [(2, 1), (None, 0), (1, None), (3, 0), (None, None)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_left_padded_keys_match_flash_attention_reference(tt, record_deviation, seed, window, is_causal):
    """FlashAttention's key_leftpad: with the real keys at the end, bottom-right alignment over the padded
    arrays is its per-sequence alignment, so padding_mask(side="left") is all attention_ref needs."""
    from flash_reference import alibi_bias

    from attention_ref import padding_mask

    _, q, k, v = random_problem(seed, L=3, S=8)
    pad = np.array([0, 3])
    key_padding = np.arange(8) >= pad[:, None]
    leftpad = {"key_leftpad": tt.from_numpy(pad), "key_padding_mask": tt.from_numpy(key_padding)}
    slopes = np.array([0.5, 0.25, 0.125])
    bias = alibi_bias(t64(tt, slopes), 3, 8, causal=is_causal, **leftpad)
    theirs, _ = flash(tt, q, k, v, attn_bias=bias, causal=is_causal, window_size=flash_window(window), **leftpad)
    mask = padding_mask(8 - pad, 8, side="left")[:, None]  # (B, 1, 1, S)
    options = {"window": window, "is_causal": is_causal, "causal_alignment": "bottom-right", "alibi_slopes": slopes}
    ours = scaled_dot_product_attention(q, k, v, mask=mask, **options)
    assert_conforms(record_deviation, ours, theirs, group="flash_attn reference left padding")
    np.testing.assert_allclose(blockwise_attention(q, k, v, mask=mask, block_size=3, **options), ours, rtol=0,
                               atol=TOL)


# --- sinks: gpt-oss's reference --------------------------------------------------------


def sink_softmax(torch, scores, sinks, v):
    """gpt-oss's treatment of sinks: a column holding the head's sink appended to the scores, a softmax over
    the row, the sink's column dropped. Returns ``(out, weights, lse)`` as NumPy arrays, with the log-sum-exp
    of that extended row (sink included) for comparison with ``return_lse``."""
    sink = t64(torch, sinks).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    row = torch.cat([scores, sink], dim=-1)
    weights = torch.softmax(row, dim=-1)[..., :-1]
    return (weights @ t64(torch, v)).numpy(), weights.numpy(), torch.logsumexp(row, dim=-1).numpy()


def gpt_oss_sdpa(torch, q, k, v, sinks, *, scale, sliding_window=0):
    """gpt-oss's reference attention with sinks (``sdpa`` in ``gpt_oss/torch/model.py``), written out in our
    layout: causal scores with an optional sliding window (``sliding_window`` keys, the query's own included),
    then `sink_softmax`."""
    n = q.shape[-2]
    mask = torch.triu(torch.full((n, n), -torch.inf, dtype=torch.float64), diagonal=1)
    if sliding_window > 0:
        mask = mask + torch.tril(torch.full((n, n), -torch.inf, dtype=torch.float64), diagonal=-sliding_window)
    scores = t64(torch, q) @ t64(torch, k).transpose(-1, -2) * scale + mask
    return sink_softmax(torch, scores, sinks, v)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("sliding_window", [0, 1, 3])
def test_sinks_match_gpt_oss_reference(tt, record_deviation, seed, sliding_window):
    gen, q, k, v = random_problem(seed, L=7, S=7, batch=(4,))
    sinks = gen.normal(size=4) * 2
    theirs, theirs_w, theirs_lse = gpt_oss_sdpa(tt, q, k, v, sinks, scale=0.5, sliding_window=sliding_window)
    window = (sliding_window - 1, 0) if sliding_window else None
    ours, w = scaled_dot_product_attention(q, k, v, sinks=sinks, is_causal=True, window=window, scale=0.5,
                                           return_weights=True)
    assert_conforms(record_deviation, ours, theirs, group="gpt-oss reference sinks")
    assert record_deviation("gpt-oss reference sinks", w, theirs_w) <= TOL
    out, lse = blockwise_attention(q, k, v, sinks=sinks, is_causal=True, window=window, scale=0.5, block_size=2,
                                   return_lse=True)
    assert_conforms(record_deviation, out, theirs, group="gpt-oss reference sinks")
    assert record_deviation("gpt-oss reference sinks lse", lse, theirs_lse) <= TOL


def test_fully_masked_rows_with_sinks_are_zeros_here_and_in_gpt_oss(tt, record_deviation):
    # gpt-oss's treatment gives a row with every key masked weight 1 on the sink and 0 on every key: a zero output,
    # which is what attention_ref returns; the log-sum-exp of such a row is the sink's.
    _, q, k, v = random_problem(1, L=3, S=3, batch=(2,))
    sinks = np.array([0.5, -1.0])
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    scores = t64(tt, np.where(mask, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -np.inf))
    theirs, theirs_w, theirs_lse = sink_softmax(tt, scores, sinks, v)
    ours, w = scaled_dot_product_attention(q, k, v, mask=mask, sinks=sinks, return_weights=True)
    _, lse = blockwise_attention(q, k, v, mask=mask, sinks=sinks, return_lse=True)
    for out in (ours, theirs, w, theirs_w):
        np.testing.assert_array_equal(out[:, 1], 0.0)
    np.testing.assert_array_equal(lse[:, 1], sinks)
    np.testing.assert_array_equal(theirs_lse[:, 1], sinks)
    assert_conforms(record_deviation, ours, theirs, group="gpt-oss reference sinks")
    assert record_deviation("gpt-oss reference sinks lse", lse, theirs_lse) <= TOL
