"""paged_attention: each sequence's keys are read from pages named by its block table, and nothing else."""

import itertools
import re

import numpy as np
import pytest
from conftest import require

import attention_ref as ar
from attention_ref import block_table_from_indptr, nhd_to_hnd, paged_attention, scaled_dot_product_attention

#: One case per option `paged_attention` passes on to every sequence (Hq = 4 query heads, Hkv = 2).
OPTION_CASES = {
    "none": {},
    "is_causal": {"is_causal": True},
    "bottom-right": {"is_causal": True, "causal_alignment": "bottom-right"},
    "window": {"window": (2, 1), "causal_alignment": "bottom-right"},
    "scale": {"scale": 0.37},
    "softcap": {"softcap": 1.5},
    "alibi_slopes": {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]), "causal_alignment": "bottom-right"},
    "sinks": {"sinks": np.array([0.3, -1.0, 2.0, 0.0])},
    "enable_gqa": {"enable_gqa": True},
}


def paged_problem(rng, kv_lens, *, page_size=4, Lq=3, Hq=4, Hkv=4, E=5, Ev=3, spare_pages=3, fill=None):
    """A pool whose pages are handed out in random order, the block table and kv_lens.

    Every slot that no sequence uses (whole pages and the tail of each last page) holds `fill` when given.
    """
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    n_pages = -(-kv_lens // page_size)
    max_pages = int(n_pages.max(initial=0)) + 1  # one more column than needed: never read
    num_pages = int(n_pages.sum()) + spare_pages
    order = rng.permutation(num_pages)
    table = rng.integers(-5, num_pages + 5, size=(len(kv_lens), max_pages))  # junk in unused entries
    start = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = order[start : start + n]
        start += n
    k_pages = rng.standard_normal((num_pages, Hkv, page_size, E))
    v_pages = rng.standard_normal((num_pages, Hkv, page_size, Ev))
    if fill is not None:
        used = np.zeros((num_pages, page_size), dtype=bool)
        for b, length in enumerate(kv_lens):
            for j in range(length):
                used[table[b, j // page_size], j % page_size] = True
        k_pages[~used[:, None, :].repeat(Hkv, axis=1)] = fill
        v_pages[~used[:, None, :].repeat(Hkv, axis=1)] = fill
    q = rng.standard_normal((len(kv_lens), Hq, Lq, E))
    return q, k_pages, v_pages, table, kv_lens


def gathered(pages, table, b, length):
    """Sequence `b`'s keys (or values), written out one position at a time: (H, length, E)."""
    page_size = pages.shape[2]
    rows = [pages[table[b, j // page_size], :, j % page_size] for j in range(length)]  # each (H, E)
    return np.stack(rows, axis=1) if rows else pages[:0, :, 0].swapaxes(0, 1)


def reference(q, k_pages, v_pages, table, kv_lens, **options):
    """The definition: per sequence, scaled_dot_product_attention over its gathered keys; outputs stacked."""
    outs = [
        scaled_dot_product_attention(
            q[b], gathered(k_pages, table, b, n), gathered(v_pages, table, b, n), **options
        )
        for b, n in enumerate(kv_lens)
    ]
    return np.stack(outs)


def test_exported():
    for name in ("paged_attention", "block_table_from_indptr", "nhd_to_hnd"):
        assert name in ar.__all__


def test_reads_the_pages_the_table_names():
    # One key per page, all scores equal: a query averages the values of exactly its sequence's used slots.
    k_pages = np.zeros((4, 1, 2, 1))
    v_pages = np.array([1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 1000.0, 2000.0]).reshape(4, 1, 2, 1)
    table = np.array([[3, 1], [0, 2]])
    out = paged_attention(np.zeros((2, 1, 1, 1)), k_pages, v_pages, table, [3, 1])
    np.testing.assert_array_equal(out[:, 0, 0, 0], [(1000.0 + 2000.0 + 10.0) / 3, 1.0])


@pytest.mark.parametrize("name", OPTION_CASES)
@pytest.mark.parametrize("packed", [False, True], ids=["dense-q", "packed-q"])
def test_equals_the_written_out_gather(rng, name, packed):
    options = OPTION_CASES[name]
    Hkv = 2 if options.get("enable_gqa") else 4
    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [7, 0, 1, 12, 4], Hkv=Hkv)
    expected = reference(q, k_pages, v_pages, table, kv_lens, **options)
    if not packed:
        out = paged_attention(q, k_pages, v_pages, table, kv_lens, **options)
    else:
        cu = np.arange(0, 3 * len(kv_lens) + 1, 3)
        flat = np.concatenate(list(q), axis=-2)  # (Hq, total_q, E)
        out = paged_attention(flat, k_pages, v_pages, table, kv_lens, cu_seqlens_q=cu, **options)
        out = np.stack(np.split(out, len(kv_lens), axis=-2))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(out[1], 0.0)  # kv_lens 0: exact zeros


def test_dropout_draws_as_the_gather_does(rng):
    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [5, 2, 9])
    out = paged_attention(q, k_pages, v_pages, table, kv_lens, dropout_p=0.3, rng=np.random.default_rng(7))
    expected = reference(q, k_pages, v_pages, table, kv_lens, dropout_p=0.3, rng=np.random.default_rng(7))
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)


def test_chunked_prefill_with_packed_queries_of_different_lengths(rng):
    # Sequence b brings Lq_b new queries, the last ones of its kv_lens[b] keys; one brings none.
    _, k_pages, v_pages, table, kv_lens = paged_problem(rng, [6, 9, 3, 5], Lq=1)
    lengths_q = [3, 0, 3, 1]
    cu = np.concatenate([[0], np.cumsum(lengths_q)])
    q = rng.standard_normal((4, int(cu[-1]), 5))
    out, lse = paged_attention(q, k_pages, v_pages, table, kv_lens, cu_seqlens_q=cu, is_causal=True,
                               causal_alignment="bottom-right", return_lse=True)
    for b, (q0, q1) in enumerate(itertools.pairwise(cu)):
        k_b, v_b = gathered(k_pages, table, b, kv_lens[b]), gathered(v_pages, table, b, kv_lens[b])
        want, want_lse = scaled_dot_product_attention(q[:, q0:q1], k_b, v_b, is_causal=True,
                                                      causal_alignment="bottom-right", return_lse=True)
        np.testing.assert_allclose(out[:, q0:q1], want, rtol=0, atol=1e-13)
        np.testing.assert_allclose(lse[:, q0:q1], want_lse, rtol=0, atol=1e-13)
    assert out.shape == (4, 7, 3) and lse.shape == (4, 7)


def test_lse_is_the_log_of_the_softmax_denominator(rng):
    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [5, 0, 8])
    sinks = np.array([0.5, -0.5, 1.0, 0.0])
    _, lse = paged_attention(q, k_pages, v_pages, table, kv_lens, sinks=sinks, return_lse=True)
    assert lse.shape == (3, 4, 3) and lse.dtype == np.float64
    for b in (0, 2):
        k_b = gathered(k_pages, table, b, kv_lens[b])
        scores = q[b] @ np.swapaxes(k_b, -1, -2) / np.sqrt(5)  # (Hq, Lq, S)
        expected = np.log(np.exp(scores).sum(axis=-1) + np.exp(sinks)[:, None])
        np.testing.assert_allclose(lse[b], expected, rtol=1e-14)
    np.testing.assert_array_equal(lse[1], np.broadcast_to(sinks[:, None], (4, 3)))  # no key: the sink's logit
    _, no_sink = paged_attention(q, k_pages, v_pages, table, kv_lens, return_lse=True)
    assert np.all(no_sink[1] == -np.inf)


def test_nan_in_every_unused_slot_changes_no_bit(rng):
    lens = [7, 0, 1, 12, 16]
    clean = paged_problem(np.random.default_rng(5), lens)
    dirty = paged_problem(np.random.default_rng(5), lens, fill=np.nan)
    assert np.isnan(dirty[1]).any()
    for options in ({}, {"is_causal": True, "causal_alignment": "bottom-right"}, {"sinks": np.zeros(4)}):
        a, lse_a = paged_attention(*clean, return_lse=True, **options)
        b, lse_b = paged_attention(*dirty, return_lse=True, **options)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(lse_a, lse_b)


def test_float32_in_float32_out(rng):
    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [3, 5])
    out, lse = paged_attention(q.astype(np.float32), k_pages.astype(np.float32), v_pages.astype(np.float32),
                               table, kv_lens, return_lse=True)
    assert out.dtype == lse.dtype == np.float32


def test_no_sequences(rng):
    _, k_pages, v_pages, _, _ = paged_problem(rng, [3])
    out, lse = paged_attention(np.zeros((0, 4, 2, 5)), k_pages, v_pages, np.zeros((0, 2), int), [],
                               return_lse=True)
    assert out.shape == (0, 4, 2, 3) and lse.shape == (0, 4, 2)
    packed = paged_attention(np.zeros((4, 0, 5)), k_pages, v_pages, np.zeros((0, 2), int), [], cu_seqlens_q=[0])
    assert packed.shape == (4, 0, 3)


def test_return_weights_per_sequence(rng):
    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [3, 6])
    out, weights, lse = paged_attention(q, k_pages, v_pages, table, kv_lens, return_weights=True,
                                        return_lse=True)
    assert [w.shape for w in weights] == [(4, 3, 3), (4, 3, 6)]
    np.testing.assert_allclose(out, reference(q, k_pages, v_pages, table, kv_lens), rtol=0, atol=1e-13)
    assert lse.shape == (2, 4, 3)


@pytest.mark.torch
def test_torch_sdpa_on_the_gathered_keys(rng):
    torch = require("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [7, 1, 12, 16], Hkv=2)
    for options, kwargs in (({}, {}), ({"is_causal": True}, {"is_causal": True}),
                            ({"enable_gqa": True, "scale": 0.3}, {"enable_gqa": True, "scale": 0.3})):
        out = paged_attention(q, k_pages if options.get("enable_gqa") else np.repeat(k_pages, 2, axis=1),
                              v_pages if options.get("enable_gqa") else np.repeat(v_pages, 2, axis=1),
                              table, kv_lens, **options)
        for b, n in enumerate(kv_lens):
            k_b, v_b = gathered(k_pages, table, b, n), gathered(v_pages, table, b, n)
            if not options.get("enable_gqa"):
                k_b, v_b = np.repeat(k_b, 2, axis=0), np.repeat(v_b, 2, axis=0)
            with sdpa_kernel(SDPBackend.MATH):
                theirs = torch.nn.functional.scaled_dot_product_attention(
                    *(torch.from_numpy(np.ascontiguousarray(a)) for a in (q[b], k_b, v_b)), **kwargs
                ).numpy()
            assert np.max(np.abs(out[b] - theirs)) <= 1e-12


# --- the "NHD" layout -----------------------------------------------------------


def to_nhd(pages):
    """A pool written out in the "NHD" order (num_pages, page_size, H, E): a contiguous copy, not a view."""
    return np.ascontiguousarray(np.swapaxes(pages, 1, 2))


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense-q", "packed-q"])
def test_nhd_layout_equals_hnd_on_the_same_data(rng, dtype, packed):
    # GQA (4 query heads, 2 key/value heads), page size 3 (neither the head count nor E), a sequence with no key
    dt = np.dtype(require("ml_dtypes").bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    q, k_pages, v_pages, table, kv_lens = (
        x.astype(dt) if x.dtype.kind == "f" else x
        for x in paged_problem(rng, [7, 0, 1, 9], page_size=3, Hq=4, Hkv=2)
    )
    options = {"enable_gqa": True, "is_causal": True, "causal_alignment": "bottom-right", "return_lse": True}
    if packed:
        options["cu_seqlens_q"] = [0, 3, 3, 4, 6]
        q = np.concatenate(list(q), axis=-2)[:, :6]  # (Hq, 6, E): 3, 0, 1 and 2 queries
    hnd, hnd_lse = paged_attention(q, k_pages, v_pages, table, kv_lens, **options)
    nhd, nhd_lse = paged_attention(q, to_nhd(k_pages), to_nhd(v_pages), table, kv_lens, layout="NHD", **options)
    assert nhd.dtype == hnd.dtype == dt
    np.testing.assert_array_equal(nhd, hnd)
    np.testing.assert_array_equal(nhd_lse, hnd_lse)
    if dtype == "float64" and not packed:  # and both are the written-out gather
        expected = reference(q, k_pages, v_pages, table, kv_lens, enable_gqa=True, is_causal=True,
                             causal_alignment="bottom-right")
        np.testing.assert_allclose(hnd, expected, rtol=0, atol=1e-13)


def test_nhd_reads_positions_before_heads():
    # 2 pages of 3 positions, 2 heads: the value of (page p, position s, head h) is 100 p + 10 s + h.
    v_nhd = (100.0 * np.arange(2)[:, None, None] + 10.0 * np.arange(3)[:, None] + np.arange(2))[..., None]
    k_nhd = np.zeros((2, 3, 2, 1))
    out = paged_attention(np.zeros((1, 2, 1, 1)), k_nhd, v_nhd, [[1, 0]], [4], layout="NHD")
    # keys 0..3: page 1 positions 0, 1, 2, then page 0 position 0; equal scores, so each head averages them
    np.testing.assert_array_equal(out[0, :, 0, 0], [(100 + 110 + 120 + 0) / 4 + h for h in (0, 1)])


def test_nhd_to_hnd_keeps_every_bit_of_fp8(rng):
    ml_dtypes = require("ml_dtypes")
    raw = rng.integers(0, 256, size=(3, 4, 2, 5), dtype=np.uint8)  # every bit pattern: NaN, -0, inf (e5m2) too
    for fmt in ("float8_e4m3fn", "float8_e5m2"):
        nhd = raw.view(getattr(ml_dtypes, fmt))
        hnd = nhd_to_hnd(nhd)
        assert hnd.dtype == nhd.dtype and hnd.shape == (3, 2, 4, 5)
        for n, s, h in itertools.product(range(3), range(4), range(2)):
            np.testing.assert_array_equal(hnd[n, h, s].view(np.uint8), raw[n, s, h])
        np.testing.assert_array_equal(nhd_to_hnd(hnd).view(np.uint8), raw)  # the transpose is its own inverse
    for dtype in (np.float16, np.float32, np.dtype(ml_dtypes.bfloat16)):
        assert nhd_to_hnd(np.ones((1, 2, 3, 4), dtype=dtype)).dtype == dtype


@pytest.mark.parametrize("layout", ["hnd", "BHSD", None, 1])
def test_unknown_layout_names_the_choices(layout):
    with pytest.raises(ValueError, match=rf"^layout must be one of 'HND', 'NHD'; got {re.escape(repr(layout))}$"):
        paged_attention(_Q, _K, _V, _T, [1, 1], layout=layout)


# --- converters -------------------------------------------------------------


def test_block_table_from_flashinfer_by_hand():
    # Three sequences: pages [7, 2, 5] with 1 slot used in the last (9 keys at page size 4), none, [0] full.
    table, lens = block_table_from_indptr(np.array([0, 3, 3, 4]), np.array([7, 2, 5, 0]), np.array([1, 0, 4]), 4)
    np.testing.assert_array_equal(table, [[7, 2, 5], [-1, -1, -1], [0, -1, -1]])
    np.testing.assert_array_equal(lens, [9, 0, 4])
    assert table.dtype == lens.dtype == np.int64


def test_flashinfer_description_gives_the_same_attention(rng):
    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [5, 8, 1], page_size=4)
    n_pages = -(-kv_lens // 4)
    indptr = np.concatenate([[0], np.cumsum(n_pages)])
    indices = np.concatenate([table[b, :n] for b, n in enumerate(n_pages)])
    last = kv_lens - (n_pages - 1) * 4
    table2, lens2 = block_table_from_indptr(indptr, indices, last, 4)
    np.testing.assert_array_equal(lens2, kv_lens)
    np.testing.assert_array_equal(paged_attention(q, k_pages, v_pages, table2, lens2),
                                  paged_attention(q, k_pages, v_pages, table, kv_lens))


def test_nhd_to_hnd_by_hand():
    nhd = np.arange(2 * 3 * 2 * 1.0).reshape(2, 3, 2, 1)  # (pages, positions, heads, E)
    hnd = nhd_to_hnd(nhd)
    assert hnd.shape == (2, 2, 3, 1)
    # page 1, head 0, position 2 is element (1, 2, 0) of the NHD cache: 6 + 4 + 0
    assert hnd[1, 0, 2, 0] == 10.0
    np.testing.assert_array_equal(hnd[0, 1, :, 0], [1.0, 3.0, 5.0])


# --- bad input --------------------------------------------------------------

_Q = np.zeros((2, 1, 1, 2))
_K = np.zeros((3, 1, 2, 2))
_V = np.zeros((3, 1, 2, 1))
_T = np.array([[0, 1], [2, -1]])


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((np.zeros((1, 1, 2)), _K, _V, _T, [1, 1]), {}, ValueError, r"^q must have exactly 4 dimensions"),
        ((_Q[:1], _K, _V, _T, [1, 1]), {}, ValueError, r"^q must have one sequence per row of block_table"),
        ((_Q, _K[0], _V, _T, [1, 1]), {}, ValueError, r"^k_pages must have exactly 4 dimensions"),
        ((_Q, _K, _V[0], _T, [1, 1]), {}, ValueError, r"^v_pages must have exactly 4 dimensions"),
        ((_Q, _K, _V[:2], _T, [1, 1]), {}, ValueError, r"^k_pages and v_pages must have the same number of pages"),
        ((_Q, _K, np.zeros((3, 1, 3, 1)), _T, [1, 1]), {}, ValueError, r"same page size"),
        ((_Q, _K, _V, _T.astype(float), [1, 1]), {}, TypeError, r"^block_table must hold integers"),
        ((_Q, _K, _V, _T[0], [1, 1]), {}, ValueError, r"^block_table must have exactly 2 dimensions"),
        ((_Q, _K, _V, _T, [1.0, 1.0]), {}, TypeError, r"^kv_lens must hold integers"),
        ((_Q, _K, _V, _T, [1]), {}, ValueError, r"^kv_lens must have one length per row of block_table"),
        ((_Q, _K, _V, _T, [1, -1]), {}, ValueError, r"^kv_lens must be >= 0; got kv_lens\[1\] = -1"),
        ((_Q, _K, _V, _T, [5, 1]), {}, ValueError, r"^kv_lens must be at most .* capacity.* = 4; got kv_lens\[0\] = 5"),
        ((_Q, _K, _V, _T, [1, 3]), {}, ValueError, r"^block_table\[1, 1\] = -1 is a used entry"),
        ((_Q, _K, _V, np.array([[0, 1], [3, 0]]), [1, 1]), {}, ValueError, r"^block_table\[1, 0\] = 3 .* \[0, 3\)"),
        ((_Q[0], _K, _V, _T, [1, 1]), {"cu_seqlens_q": [0, 1]}, ValueError,
         r"^cu_seqlens_q must have B \+ 1 = 3 entries"),
        ((_Q[0], _K, _V, _T, [1, 1]), {"cu_seqlens_q": [0.0, 1.0, 1.0]}, TypeError,
         r"^cu_seqlens_q must hold integers"),
        ((_Q, _K, _V, _T, [1, 1]), {"cu_seqlens_q": [0, 1, 1]}, ValueError, r"^q must have exactly 3 dimensions"),
        ((_Q, _K, _V, _T, [1, 1]), {"return_lse": 1}, TypeError, r"^return_lse must be True or False"),
        ((_Q, _K, _V, _T, [1, 1]), {"mask": np.ones((1, 1), bool)}, TypeError, r"^paged_attention does not take mask"),
        ((_Q, _K, _V, _T, [1, 1]), {"bias": np.zeros((1, 1))}, TypeError, r"^paged_attention does not take bias"),
        ((_Q.astype(bool), _K, _V, _T, [1, 1]), {}, TypeError, r"^q must hold real numbers"),
        ((_Q, _K, _V, _T, [1, 1]), {"alibi_slopes": [1.0, 2.0]}, ValueError, r"^alibi_slopes"),
        ((_Q, _K, _V[0], _T, [1, 1]), {"layout": "NHD"}, ValueError,
         r"^v_pages must have exactly 4 dimensions \(num_pages, page_size, Hkv, Ev\) \(layout='NHD'\)"),
        ((_Q, _K, np.zeros((3, 1, 1, 1)), _T, [1, 1]), {"layout": "NHD"}, ValueError,
         r"same number of heads \(axis 2\)"),
        ((_Q, _K, np.zeros((3, 2, 2, 1)), _T, [1, 1]), {"layout": "NHD"}, ValueError, r"same page size \(axis 1\)"),
    ],
)
def test_bad_input_names_the_argument(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        paged_attention(*args, **kwargs)


def test_unused_entries_are_not_checked():
    # -1, a stale index past the pool, junk: ignored past each sequence's used pages.
    table = np.array([[0, 99], [2, -7]])
    out = paged_attention(_Q, _K, _V, table, [2, 1])
    assert out.shape == (2, 1, 1, 1)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([0, 1], [0.5], [1], 4), TypeError, r"^indices must hold integers"),
        (([1, 1], [0], [1], 4), ValueError, r"^indptr must start at 0"),
        (([0, 2], [0], [1], 4), ValueError, r"^indptr must end at"),
        (([0, 1], [0], [1, 1], 4), ValueError, r"^last_page_len must have one entry per sequence"),
        (([0, 1], [0], [5], 4), ValueError, r"^last_page_len must be in \[0, page_size = 4\]"),
        (([0, 1], [0], [1], 0), ValueError, r"^page_size must be >= 1"),
        (([0, 1], [0], [1], 4.0), TypeError, r"^page_size must be an integer"),
    ],
)
def test_converter_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        block_table_from_indptr(*args)


def test_nhd_to_hnd_bad_input():
    with pytest.raises(ValueError, match=r"^pages must have exactly 4 dimensions"):
        nhd_to_hnd(np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match=r"^pages must hold real numbers"):
        nhd_to_hnd(np.zeros((1, 1, 1, 1), dtype=bool))


def test_per_sequence_dropout_masks(rng):
    q, k_pages, v_pages, table, kv_lens = paged_problem(rng, [5, 0, 9])
    masks = [rng.random((4, 3, n)) >= 0.3 for n in kv_lens]
    out = paged_attention(q, k_pages, v_pages, table, kv_lens, dropout_p=0.3, dropout_mask=masks)
    for b, n in enumerate(kv_lens):
        want = scaled_dot_product_attention(q[b], gathered(k_pages, table, b, n), gathered(v_pages, table, b, n),
                                            dropout_p=0.3, dropout_mask=masks[b])
        np.testing.assert_allclose(out[b], want, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match=r"^dropout_mask must hold one keep-mask per sequence"):
        paged_attention(q, k_pages, v_pages, table, kv_lens, dropout_p=0.3, dropout_mask=masks[:2])
    with pytest.raises(ValueError, match=r"^dropout_mask must hold one keep-mask per sequence, 3; got 4"):
        paged_attention(q, k_pages, v_pages, table, kv_lens, dropout_p=0.3, dropout_mask=[*masks, masks[0]])
