"""Property-based test (hypothesis) of paged_attention: any page order and page size gives the gathered result.

Kept apart from test_paged.py so that a missing hypothesis skips (locally; fails in CI) these properties only.
"""

import numpy as np
import pytest
from conftest import require
from test_paged import gathered, paged_problem

from attention_ref import paged_attention, scaled_dot_product_attention

try:  # without hypothesis: the module skips locally; in CI require fails, and so does the collection
    require("hypothesis")
except pytest.skip.Exception as exc:
    pytest.skip(str(exc), allow_module_level=True)
from hypothesis import given
from hypothesis import strategies as st


@given(
    page_size=st.integers(1, 64),
    # each sequence's length: 0, 1, a full number of pages, or anything up to three pages
    lengths=st.lists(st.tuples(st.sampled_from(["zero", "one", "full", "any"]), st.integers(1, 3),
                               st.integers(0, 191)), min_size=1, max_size=4),
    heads=st.sampled_from([(1, 1), (2, 2), (4, 2)]),
    Lq=st.integers(1, 3),
    is_causal=st.booleans(),
    extras=st.sets(st.sampled_from(["alibi_slopes", "sinks", "window", "softcap"])),
    size=st.sampled_from([1e-3, 1.0, 30.0, 300.0]),  # of the slopes and sinks, either sign
    seed=st.integers(0, 2**32 - 1),
)
def test_any_page_order_and_size_gives_the_gathered_result(page_size, lengths, heads, Lq, is_causal, extras, size,
                                                           seed):
    kv_lens = [{"zero": 0, "one": 1, "full": pages * page_size, "any": min(n, 3 * page_size)}[kind]
               for kind, pages, n in lengths]
    Hq, Hkv = heads
    options = {"is_causal": is_causal, "causal_alignment": "bottom-right", "enable_gqa": Hq != Hkv}
    rng = np.random.default_rng(seed)
    options |= {name: size * rng.uniform(-1.0, 1.0, Hq) for name in extras & {"alibi_slopes", "sinks"}}
    options |= {"window": (3, 0)} if "window" in extras else {}
    options |= {"softcap": 2.0} if "softcap" in extras else {}
    clean = paged_problem(np.random.default_rng(seed), kv_lens, page_size=page_size, Lq=Lq, Hq=Hq, Hkv=Hkv)
    dirty = paged_problem(np.random.default_rng(seed), kv_lens, page_size=page_size, Lq=Lq, Hq=Hq, Hkv=Hkv,
                          fill=np.nan)
    out, lse = paged_attention(*clean, return_lse=True, **options)
    out_nan, lse_nan = paged_attention(*dirty, return_lse=True, **options)
    np.testing.assert_array_equal(out_nan, out)  # NaN in every unused slot: not one bit changes
    np.testing.assert_array_equal(lse_nan, lse)
    q, k_pages, v_pages, table, lens = clean
    # |scores| up to |slope| times the longest distance, or a sink's size: the rounding of exp's argument scales
    tol = 1e-13 * max(1.0, *(np.abs(options.get(n, 0.0)).max() * (max(kv_lens) + 1) for n in ("alibi_slopes", "sinks")))
    for b, n in enumerate(lens):
        want, want_lse = scaled_dot_product_attention(q[b], gathered(k_pages, table, b, n),
                                                      gathered(v_pages, table, b, n), return_lse=True, **options)
        np.testing.assert_allclose(out[b], want, rtol=0, atol=tol)
        np.testing.assert_allclose(lse[b], want_lse, rtol=0, atol=tol)
        if n == 0:
            assert np.all(out[b] == 0.0)
