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
"""

import warnings

import numpy as np
import pytest

from attention_ref import causal_mask, log_softmax, logsumexp, scaled_dot_product_attention, softmax

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


def assert_conforms(record_deviation, ours, theirs, *, empty_rows=None):
    """Compare outputs of shape (..., L, Ev); rows flagged in `empty_rows` (..., L) are checked separately."""
    assert ours.shape == theirs.shape
    if empty_rows is not None and np.any(empty_rows):
        empty_rows = np.broadcast_to(empty_rows, ours.shape[:-1])
        np.testing.assert_array_equal(ours[empty_rows], 0.0)
        torch_rows = theirs[empty_rows]
        assert np.all(np.isnan(torch_rows) | (torch_rows == 0.0))
        ours, theirs = ours[~empty_rows], theirs[~empty_rows]
    assert np.all(np.isfinite(theirs)), "torch returned NaN outside fully masked rows"
    deviation = record_deviation("torch", ours, theirs)
    assert deviation <= TOL


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
