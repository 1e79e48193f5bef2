"""The building blocks of flex_attention: each equals the package's built-in option or dense mask it stands for."""

import numpy as np
import pytest

import attention_ref as ar
from attention_ref import flex_mods


def grid(L, S):
    """The mods' index arrays for a whole (L, S) matrix of one batch entry and head."""
    return np.zeros((1, 1, 1, 1), int), np.zeros((1, 1, 1, 1), int), np.arange(L).reshape(1, 1, L, 1), \
        np.arange(S).reshape(1, 1, 1, S)


def dense(mask_mod, L, S):
    return np.broadcast_to(mask_mod(*grid(L, S)), (1, 1, L, S))[0, 0]


@pytest.mark.parametrize(("L", "S"), [(5, 5), (3, 7), (7, 3)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_causal_and_window_equal_the_dense_masks(L, S, alignment):
    np.testing.assert_array_equal(dense(ar.causal_mask_mod(alignment, (L, S)), L, S),
                                  ar.causal_mask(L, S, alignment=alignment))
    for window in [(2, 0), (0, 1), (None, 1), (1, None), (None, None)]:
        np.testing.assert_array_equal(dense(ar.sliding_window_mask_mod(window, alignment, (L, S)), L, S),
                                      ar.sliding_window_mask(L, S, window=window, alignment=alignment))


def test_document_prefix_and_chunked_masks_follow_their_definitions():
    ids = np.array([0, 0, 1, 1, 1, 2])
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    np.testing.assert_array_equal(dense(ar.document_mask_mod(ids), 6, 6), ids[i] == ids[j])
    np.testing.assert_array_equal(dense(ar.prefix_lm_mask_mod(3), 6, 6), (j < 3) | (j <= i))
    np.testing.assert_array_equal(dense(ar.chunked_mask_mod(4), 6, 6), (i // 4 == j // 4) & (j <= i))
    np.testing.assert_array_equal(dense(ar.chunked_mask_mod(4, causal=False), 6, 6), i // 4 == j // 4)


def test_document_ids_of_queries_and_keys_may_differ():
    ids_q = np.array([0, 1, 1, 2, 3])  # a query's document is looked up in ids_q, a key's in ids_kv
    ids_kv = np.array([0, 0, 1, 3, 3])
    allowed = np.zeros((5, 5), dtype=bool)
    for i in range(5):
        for j in range(5):
            allowed[i, j] = ids_q[i] == ids_kv[j]
    np.testing.assert_array_equal(dense(ar.document_mask_mod(ids_q, ids_kv), 5, 5), allowed)
    ids_kv = np.array([1, 3, 3, 0, 2, 2, 1])  # S = 7 keys for L = 5 queries
    np.testing.assert_array_equal(dense(ar.document_mask_mod(ids_q, ids_kv), 5, 7),
                                  [[ids_q[i] == ids_kv[j] for j in range(7)] for i in range(5)])


def test_per_batch_ids_and_prefixes_index_by_b():
    ids = np.array([[0, 0, 1], [0, 1, 1]])
    b = np.arange(2).reshape(2, 1, 1, 1)
    _, h, q_idx, kv_idx = grid(3, 3)
    got = ar.document_mask_mod(ids)(b, h, q_idx, kv_idx)
    np.testing.assert_array_equal(got[:, 0], ids[:, :, None] == ids[:, None, :])
    got = np.broadcast_to(ar.prefix_lm_mask_mod([1, 2])(b, h, q_idx, kv_idx), (2, 1, 3, 3))
    np.testing.assert_array_equal(got[1, 0, 0], [True, True, False])
    np.testing.assert_array_equal(got[0, 0, 0], [True, False, False])


def test_and_or_noop_combine_elementwise():
    a, c = ar.causal_mask_mod(), ar.sliding_window_mask_mod((1, 1))
    np.testing.assert_array_equal(dense(ar.and_masks(a, c), 5, 5), dense(a, 5, 5) & dense(c, 5, 5))
    np.testing.assert_array_equal(dense(ar.or_masks(a, c), 5, 5), dense(a, 5, 5) | dense(c, 5, 5))
    assert dense(ar.and_masks(), 2, 2).all() and not dense(ar.or_masks(), 2, 2).any()
    assert dense(ar.noop_mask, 3, 4).all()
    with pytest.raises(TypeError, match="and_masks: argument 1"):
        ar.and_masks(a, 3)


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_alibi_and_relative_bias_add_their_terms(alignment):
    L, S, H = 4, 6, 3
    slopes = ar.alibi_slopes(H)
    b, _, q_idx, kv_idx = grid(L, S)
    h = np.arange(H).reshape(1, H, 1, 1)
    got = ar.alibi_score_mod(slopes, alignment, (L, S))(np.zeros((1, H, L, S)), b, h, q_idx, kv_idx)
    np.testing.assert_array_equal(got[0], ar.alibi_bias(H, L, S, alignment=alignment))
    table = np.arange(H * 5, dtype=float).reshape(H, 5)
    got = ar.relative_bias_score_mod(table, 2)(np.zeros((1, H, L, S)), b, h, q_idx, kv_idx)
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    np.testing.assert_array_equal(got[0], table[:, np.clip(j - i, -2, 2) + 2])


def test_score_functions_carry_their_derivatives():
    s = np.linspace(-30, 30, 61)
    index = (0, 0, np.zeros_like(s, dtype=int), np.zeros_like(s, dtype=int))
    cap = ar.softcap_score_mod(5.0)
    step = 1e-6
    numeric = (cap(s + step, *index) - cap(s - step, *index)) / (2 * step)
    np.testing.assert_allclose(cap.score_mod_grad(s, *index), numeric, rtol=0, atol=1e-8)
    chained = ar.chain_score_mods(cap, ar.relative_bias_score_mod([1.0], 0), cap)
    numeric = (chained(s + step, *index) - chained(s - step, *index)) / (2 * step)
    np.testing.assert_allclose(chained.score_mod_grad(s, *index), numeric, rtol=0, atol=1e-8)
    assert not hasattr(ar.chain_score_mods(cap, lambda score, b, h, i, j: score), "score_mod_grad")


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: ar.causal_mask_mod("bottom-right"), ValueError, "lengths=\\(L, S\\)"),
    (lambda: ar.causal_mask_mod("middle"), ValueError, "alignment must be one of"),
    (lambda: ar.sliding_window_mask_mod((1, -1)), ValueError, "window\\[1\\] \\(right\\) must be >= 0"),
    (lambda: ar.document_mask_mod([0.5, 1.0]), TypeError, "document_ids must be a 1-D"),
    (lambda: ar.prefix_lm_mask_mod(-1), ValueError, "prefix_length must be >= 0"),
    (lambda: ar.chunked_mask_mod(0), ValueError, "chunk_size must be >= 1"),
    (lambda: ar.softcap_score_mod(0.0), ValueError, "softcap must be > 0"),
    (lambda: ar.alibi_score_mod([[1.0]]), ValueError, "slopes must be 1-D"),
    (lambda: ar.relative_bias_score_mod(np.zeros((2, 4)), 2), ValueError, "table must have shape \\(H, 5\\)"),
    (lambda: ar.chain_score_mods(None), TypeError, "chain_score_mods: argument 0"),
])
def test_bad_arguments_name_themselves(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_module_lists_every_block():
    assert sorted(flex_mods.__all__) == sorted(n for n in ar.__all__ if getattr(ar, n).__module__ == flex_mods.__name__)
