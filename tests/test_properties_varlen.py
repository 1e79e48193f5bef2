"""Property-based test (hypothesis) of varlen_attention: a packed batch equals a loop of separate calls.

Kept apart from test_varlen.py so that a missing hypothesis skips (locally; fails in CI) this property only, never
the module's other tests.
"""

import numpy as np
import pytest
from conftest import require
from test_varlen import loop, packed

from attention_ref import varlen_attention

try:  # without hypothesis: the module skips locally; in CI require fails, and so does the collection
    require("hypothesis")
except pytest.skip.Exception as exc:
    pytest.skip(str(exc), allow_module_level=True)
from hypothesis import given
from hypothesis import strategies as st


@given(
    lengths=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=0, max_size=5),
    heads=st.sampled_from([(1, 1), (2, 2), (4, 2), (3, 1)]),
    is_causal=st.booleans(),
    alignment=st.sampled_from(["top-left", "bottom-right"]),
    window=st.none() | st.tuples(st.none() | st.integers(0, 4), st.none() | st.integers(0, 4)),
    softcap=st.none() | st.floats(0.5, 20.0),
    extras=st.sets(st.sampled_from(["alibi_slopes", "sinks"])),
    seed=st.integers(0, 2**32 - 1),
)
def test_varlen_equals_a_loop_of_separate_calls(lengths, heads, is_causal, alignment, window, softcap, extras, seed):
    rng = np.random.default_rng(seed)
    H, Hkv = heads
    q, k, v, cu_q, cu_k = packed(rng, [a for a, _ in lengths], [b for _, b in lengths], H=H, Hkv=Hkv)
    options = {"is_causal": is_causal, "causal_alignment": alignment, "enable_gqa": H != Hkv,
               "window": window, "softcap": softcap}
    options |= {name: rng.standard_normal(H) for name in extras}
    out, weights = varlen_attention(q, k, v, cu_q, cu_k, return_weights=True, **options)
    assert out.shape == (H, q.shape[1], 3)
    assert len(weights) == len(lengths)
    assert np.all(np.isfinite(out))
    if lengths:
        np.testing.assert_array_equal(out, loop(q, k, v, cu_q, cu_k, **options))
