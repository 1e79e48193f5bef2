"""What the checkers are told (attention_ref/testing/_problem.py): empty-row conventions and Flex variants."""

import numpy as np
import pytest
from conftest import require

import attention_ref as ar
from attention_ref.testing import assert_attention_close, assert_attention_grads_close, assert_lse_close


def problem(seed=0, B=2, H=2, L=6, S=7, E=8, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k, v = (rng.standard_normal((B, H, S, E)).astype(dtype) for _ in range(2))
    mask = np.ones((L, S), bool)
    mask[2] = False  # query 2 may attend to no key
    return q, k, v, mask


def mean_kernel(q, k, v, mask):
    """A kernel written as JAX's and Hugging Face eager are: a large finite number where the mask says no."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    scores = np.where(mask, q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(q.shape[-1]), -1e30)
    return (ar.softmax(scores, axis=-1) @ v64).astype(q.dtype)


# ------------------------------------------------------------------------------------- empty_rows


def test_zeros_is_the_default_and_a_mean_kernel_fails_it_on_the_empty_row_only():
    q, k, v, mask = problem()
    out = mean_kernel(q, k, v, mask)
    with pytest.raises(AssertionError, match=r"head 0: row 2 \(8 elements\), no allowed key") as info:
        assert_attention_close(out, q, k, v, mask=mask)
    assert "rows" not in str(info.value).split("where they are:")[1]  # only row 2, of each head
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="mean")
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="any")
    with pytest.raises(AssertionError):
        assert_attention_close(out, q, k, v, mask=mask, empty_rows="nan")


def test_mean_wants_the_mean_of_all_keys_not_of_the_allowed_ones():
    q, k, v, mask = problem(1)
    out = mean_kernel(q, k, v, mask)
    out[:, :, 2] = v[:, :, 1:].mean(axis=-2)  # the mean of all keys but the first
    with pytest.raises(AssertionError, match="no allowed key"):
        assert_attention_close(out, q, k, v, mask=mask, empty_rows="mean")


def test_mean_with_grouped_query_heads_averages_each_heads_own_values():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 4, 5, 8))
    k, v = (rng.standard_normal((1, 2, 9, 8)) for _ in range(2))
    mask = np.ones((5, 9), bool)
    mask[4] = False
    out = ar.scaled_dot_product_attention(q, k, v, mask=mask, enable_gqa=True)
    out[0, :, 4] = np.repeat(v[0], 2, axis=0).mean(axis=-2)  # query head h reads key/value head h // 2
    assert_attention_close(out, q, k, v, mask=mask, enable_gqa=True, empty_rows="mean")
    out[0, :, 4] = np.tile(v[0], (2, 1, 1)).mean(axis=-2)  # the interleaved grouping: wrong
    with pytest.raises(AssertionError):
        assert_attention_close(out, q, k, v, mask=mask, enable_gqa=True, empty_rows="mean")


def test_nan_wants_nan_exactly_there_and_any_skips():
    q, k, v, mask = problem(3)
    out = ar.scaled_dot_product_attention(q, k, v, mask=mask)
    with pytest.raises(AssertionError, match="no allowed key"):
        assert_attention_close(out, q, k, v, mask=mask, empty_rows="nan")  # zeros where NaN is wanted
    out[:, :, 2] = np.nan
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="nan")
    out[:, :, 2] = 123.0
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="any")
    out[0, 0, 3, 0] += 0.1  # "any" skips the empty rows only
    with pytest.raises(AssertionError, match=r"batch 0, head 0: row 3 \(1 element\)"):
        assert_attention_close(out, q, k, v, mask=mask, empty_rows="any")


@pytest.mark.parametrize("bad", ["mean ", "NaN", None, 0, "skip"])
def test_an_unknown_empty_rows_is_a_value_error_naming_it(bad):
    q, k, v, _ = problem()
    out = ar.scaled_dot_product_attention(q, k, v)
    for check, first in ((assert_attention_close, out), (assert_lse_close, out[..., 0])):
        with pytest.raises(ValueError, match=r"^empty_rows must be one of 'zeros', 'mean', 'nan', 'any'; got"):
            check(first, q, k, v, empty_rows=bad)
    with pytest.raises(ValueError, match=r"^empty_rows must be one of"):
        assert_attention_grads_close(ar.attention_backward(q, k, v, out)[:3], q, k, v, out, empty_rows=bad)


def test_the_log_sum_exp_of_an_empty_row():
    q, k, v, mask = problem(4)
    _, lse = ar.scaled_dot_product_attention(q, k, v, mask=mask, return_lse=True)
    lse = lse.astype(np.float32)
    assert_lse_close(lse, q, k, v, mask=mask)
    nan = lse.copy()
    nan[:, :, 2] = np.nan
    assert_lse_close(nan, q, k, v, mask=mask, empty_rows="nan")
    with pytest.raises(AssertionError, match="no allowed key"):
        assert_lse_close(nan, q, k, v, mask=mask)
    junk = lse.copy()
    junk[:, :, 2] = -1e30 + 5.0  # a masking constant's log-sum-exp
    assert_lse_close(junk, q, k, v, mask=mask, empty_rows="mean")
    assert_lse_close(junk, q, k, v, mask=mask, empty_rows="any")


def test_jax_is_checked_with_mean_forward_and_backward():
    jax = require("jax")
    jnp = jax.numpy
    q, k, v, mask = problem(5, L=9, S=12, E=16)
    dout = np.random.default_rng(6).standard_normal(q.shape).astype(np.float32)
    layout = (0, 2, 1, 3)  # JAX's (B, T, N, H)

    def attend(q, k, v):
        o = jax.nn.dot_product_attention(*(x.transpose(layout) for x in (q, k, v)), mask=jnp.asarray(mask))
        return o.transpose(layout)

    out, pullback = jax.vjp(attend, *(jnp.asarray(a) for a in (q, k, v)))
    grads = pullback(jnp.asarray(dout))
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="mean")
    assert_attention_grads_close(grads, q, k, v, dout, mask=mask, empty_rows="mean")
    with pytest.raises(AssertionError, match=r"^dv: "):
        assert_attention_grads_close(grads, q, k, v, dout, mask=mask)  # zeros: dv misses dout / S


def test_mean_gradients_shift_the_baseline_as_well_as_the_reference():
    """With empty_rows="mean", dv gets dout / S from an empty row in the reference *and* in the baseline: a
    baseline left without it would be off by dout / S there, and its largest error would loosen the bound
    of every element of dv to about that much."""
    q, k, v, mask = problem(8, L=9, S=12, E=16)
    dout = np.random.default_rng(9).standard_normal(q.shape).astype(np.float32)
    q64, k64, v64, dout64 = (a.astype(np.float64) for a in (q, k, v, dout))
    dq, dk, dv = ar.attention_backward(q64, k64, v64, dout64, mask=mask)[:3]
    dv = dv + dout64[:, :, 2:3].sum(axis=-2, keepdims=True) / k.shape[-2]  # the mean's gradient, every key
    assert np.abs(dout64[:, :, 2]).max() / k.shape[-2] > 0.1  # the shift is far above float32's rounding
    grads = [g.astype(np.float32) for g in (dq, dk, dv)]
    assert_attention_grads_close(grads, q, k, v, dout, mask=mask, empty_rows="mean")
    wrong = grads[2].copy()
    wrong[1, 0, 5, 3] += 1e-3  # far beyond float32's bound, far below dout / S
    with pytest.raises(AssertionError, match=r"^dv: 1 of "):
        assert_attention_grads_close([*grads[:2], wrong], q, k, v, dout, mask=mask, empty_rows="mean")


def test_nan_gradients_are_expected_on_the_row_and_skipped_in_its_heads():
    q, k, v, mask = problem(7)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    dout = np.ones_like(q64)
    grads = ar.attention_backward(q64, k64, v64, dout, mask=mask)
    dq, dk, dv = (g.copy() for g in grads[:3])
    dq[:, :, 2] = np.nan
    dk[:] = np.nan  # NaN reaches every key of a head with an empty row
    dv[:] = np.nan
    assert_attention_grads_close((dq, dk, dv), q64, k64, v64, dout, mask=mask, empty_rows="nan")
    with pytest.raises(AssertionError, match=r"dq"):
        assert_attention_grads_close((grads.dq, dk, dv), q64, k64, v64, dout, mask=mask, empty_rows="nan")
    assert_attention_grads_close((grads.dq, dk, dv), q64, k64, v64, dout, mask=mask, empty_rows="any")


def test_heads_without_an_empty_row_are_still_checked_under_any():
    q, k, v, _ = problem(8, B=1, H=2)
    mask = np.ones((1, 2, 6, 7), bool)
    mask[0, 0, 1] = False  # head 0 has an empty row, head 1 none
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    dout = np.ones_like(q64)
    dq, dk, dv = (g.copy() for g in ar.attention_backward(q64, k64, v64, dout, mask=mask)[:3])
    dk[0, 0] = 7.0  # anything in head 0
    assert_attention_grads_close((dq, dk, dv), q64, k64, v64, dout, mask=mask, empty_rows="any")
    dk[0, 1, 3, 0] += 1e-3
    with pytest.raises(AssertionError, match=r"(?s)^dk: 1 of .*batch 0, head 1: row 3"):
        assert_attention_grads_close((dq, dk, dv), q64, k64, v64, dout, mask=mask, empty_rows="any")


# ----------------------------------------------------------------------------------- Flex variants


def doc_mod(ids):
    def same_document(b, h, q_idx, kv_idx):
        return ids[q_idx] == ids[kv_idx]

    return same_document


def test_a_flex_variant_is_checked_by_the_rule_forward_lse_and_backward():
    rng = np.random.default_rng(9)
    q, k, v, dout = (rng.standard_normal((2, 4, 37, 16)).astype(np.float16) for _ in range(4))
    ids = np.repeat(np.arange(3), [10, 20, 7])
    mods = {"score_mod": ar.softcap_score_mod(5.0), "mask_mod": ar.and_masks(ar.causal_mask_mod(), doc_mod(ids))}
    out, lse = ar.flex_attention(q, k, v, **mods, return_lse=True, block_size=8)
    assert_attention_close(out, q, k, v, **mods)
    assert_lse_close(lse, q, k, v, **mods)
    grads = ar.flex_attention_backward(q, k, v, dout, **mods, block_size=8)
    assert_attention_grads_close(grads, q, k, v, dout, **mods)
    wrong_ids = np.repeat(np.arange(3), [11, 19, 7])  # a document boundary one token off
    wrong = ar.flex_attention(q, k, v, mods["score_mod"], ar.and_masks(ar.causal_mask_mod(), doc_mod(wrong_ids)))
    with pytest.raises(AssertionError, match=r"rows 10-29"):
        assert_attention_close(wrong, q, k, v, **mods)


def test_the_flex_baseline_applies_the_mods_in_the_kernels_dtype():
    # a soft cap computed in float16: only the baseline in float16 lets it pass at factor 2
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal((1, 2, 64, 32)).astype(np.float16) for _ in range(3))
    out = ar.flex_attention(q, k, v, ar.softcap_score_mod(2.0), block_size=16)
    assert_attention_close(out, q, k, v, score_mod=ar.softcap_score_mod(2.0))
    with pytest.raises(AssertionError):
        assert_attention_close(out, q, k, v, score_mod=ar.softcap_score_mod(2.1))


def test_a_block_mask_as_a_dict_of_keywords():
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 1, 4, 8)) for _ in range(3))
    fields = {"kv_num_blocks": np.array([[[1, 1]]]), "kv_indices": np.array([[[[0, 2], [1, 2]]]]),
              "full_kv_num_blocks": np.array([[[0, 1]]]), "full_kv_indices": np.array([[[[0], [0]]]]),
              "BLOCK_SIZE": 2, "mask_mod": ar.causal_mask_mod(), "seq_lengths": (4, 4)}
    # blocks of 2: query block 0 sees key block 0 through mask_mod (causal), query block 1 key block 1 through
    # mask_mod and key block 0 whole (a full block)
    dense = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    out = ar.scaled_dot_product_attention(q, k, v, mask=dense)
    assert_attention_close(out, q, k, v, block_mask=fields)
    # query block 0's key block 1 made a full block: mask_mod would deny all of it, a full block keeps it whole
    above = fields | {"full_kv_num_blocks": np.array([[[1, 1]]]), "full_kv_indices": np.array([[[[1], [0]]]])}
    dense_above = np.array([[1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    out_above = ar.scaled_dot_product_attention(q, k, v, mask=dense_above)
    assert_attention_close(out_above, q, k, v, block_mask=above)
    with pytest.raises(AssertionError):
        assert_attention_close(out, q, k, v, block_mask=above)
    with pytest.raises(AssertionError):
        assert_attention_close(ar.scaled_dot_product_attention(q, k, v), q, k, v, block_mask=fields)
    with pytest.raises(ValueError, match=r"^block_mask describes sequence lengths \(L, S\) = \(4, 4\), but q and k"):
        assert_attention_close(out[:, :, :3], q[:, :, :3], k, v, block_mask=fields | {"seq_lengths": (4, 4)})
    with pytest.raises(ValueError, match=r"^give mask_mod or block_mask, not both"):
        assert_attention_close(out, q, k, v, block_mask=fields, mask_mod=ar.causal_mask_mod())


def test_a_flex_variant_takes_scale_and_enable_gqa_only():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 4, 5, 8))
    k, v = (rng.standard_normal((1, 2, 5, 8)) for _ in range(2))
    out = ar.flex_attention(q, k, v, mask_mod=ar.causal_mask_mod(), scale=0.3, enable_gqa=True)
    assert_attention_close(out, q, k, v, mask_mod=ar.causal_mask_mod(), scale=0.3, enable_gqa=True)
    with pytest.raises(TypeError, match=r"with scale and enable_gqa only, .* got also is_causal, softcap"):
        assert_attention_close(out, q, k, v, mask_mod=ar.causal_mask_mod(), is_causal=True, softcap=2.0)


def test_a_mod_that_raises_is_named():
    q = np.zeros((1, 1, 3, 4))

    def broken(score, b, h, q_idx, kv_idx):
        raise KeyError("oops")

    with pytest.raises(ValueError, match=r"score_mod 'broken' raised KeyError"):
        assert_attention_close(q, q, q, q, score_mod=broken)


def test_a_custom_score_mod_needs_its_derivative_for_the_gradients():
    rng = np.random.default_rng(13)
    q, k, v, dout = (rng.standard_normal((1, 2, 6, 4)) for _ in range(4))

    def cube(score, b, h, q_idx, kv_idx):  # NumPy's function: torch's autograd cannot go through it
        return np.power(score, 3) / 3

    def cube_grad(score, b, h, q_idx, kv_idx):
        return score**2

    grads = ar.flex_attention_backward(q, k, v, dout, cube, score_mod_grad=cube_grad)
    assert_attention_grads_close(grads, q, k, v, dout, score_mod=cube, score_mod_grad=cube_grad)
    with pytest.raises(TypeError, match=r"^score_mod 'cube' has no derivative: pass score_mod_grad"):
        assert_attention_grads_close(grads, q, k, v, dout, score_mod=cube)


def test_a_score_mod_of_plain_arithmetic_is_differentiated_by_torch_where_it_is_installed(torch):
    # As a FlexAttention user writes it: runs on NumPy arrays and torch tensors alike, no score_mod_grad given
    rng = np.random.default_rng(15)
    q, k, v, dout = (rng.standard_normal((1, 2, 6, 4)) for _ in range(4))

    def cube(score, b, h, q_idx, kv_idx):
        return score**3 / 3 + (q_idx - kv_idx) * 0.1

    grads = ar.flex_attention_backward(q, k, v, dout, cube, score_mod_grad=lambda s, b, h, i, j: s**2)
    assert_attention_grads_close(grads, q, k, v, dout, score_mod=cube)
    wrong = grads._replace(dk=grads.dk * 1.01)
    with pytest.raises(AssertionError, match="dk: "):
        assert_attention_grads_close(wrong, q, k, v, dout, score_mod=cube)


def test_the_gradient_check_applies_the_score_mods_derivative_chosen_as_the_backward_chooses_it():
    # What a torch score_mod gets from autograd, a NumPy one brings along: the derivative the checker's reference
    # chains through. The package's soft cap carries it (score_mod_grad); a given score_mod_grad comes first.
    rng = np.random.default_rng(14)
    q, k, v, dout = (2.0 * rng.standard_normal((1, 2, 12, 8)) for _ in range(4))
    cap = ar.softcap_score_mod(1.5)  # scores of 2 or so: tanh' far from 1

    def slope_one(score, b, h, q_idx, kv_idx):  # the derivative of the soft cap ignored
        return np.ones_like(score)

    right = ar.flex_attention_backward(q, k, v, dout, cap)
    wrong = ar.flex_attention_backward(q, k, v, dout, cap, score_mod_grad=slope_one)
    assert not np.allclose(right.dq, wrong.dq)
    assert_attention_grads_close(right, q, k, v, dout, score_mod=cap)
    with pytest.raises(AssertionError, match=r"dq"):
        assert_attention_grads_close(wrong, q, k, v, dout, score_mod=cap)
    assert_attention_grads_close(wrong, q, k, v, dout, score_mod=cap, score_mod_grad=slope_one)
    with pytest.raises(AssertionError, match=r"dq"):
        assert_attention_grads_close(right, q, k, v, dout, score_mod=cap, score_mod_grad=slope_one)
