"""Property-based tests (hypothesis) of attention_backward: dense equals tiled, and identities of the gradient."""

import numpy as np
import pytest
from conftest import require

from attention_ref import attention_backward, scaled_dot_product_attention

try:  # without hypothesis: the module skips locally; in CI require fails, and so does the collection
    require("hypothesis")
except pytest.skip.Exception as exc:
    pytest.skip(str(exc), allow_module_level=True)
from hypothesis import given
from hypothesis import strategies as st
from test_properties import attention_inputs, options


@given(attention_inputs(heads=True), st.data())
def test_tiled_equals_dense_and_the_gradient_identities_hold(inputs, data):
    """For any options: every block size gives the dense gradients; out is linear in v (<dv, v> = <dout, out>);
    the scores are bilinear in q and k, so <dq, q> = <dk, k>; rows with no allowed key get zero dq."""
    q, k, v, mask = inputs
    chosen = data.draw(options(q.shape[0]), label="options")
    if data.draw(st.booleans(), label="with bias"):
        chosen["bias"] = np.random.default_rng(q.size).normal(size=(q.shape[0], 1, k.shape[-2]))
    dout = np.random.default_rng(k.size).normal(size=(*q.shape[:-1], v.shape[-1]))
    dense = attention_backward(q, k, v, dout, mask=mask, **chosen)
    grads = [g for g in dense if g is not None]
    assert all(np.isfinite(g).all() for g in grads)
    top = max(np.abs(g).max(initial=0.0) for g in grads)
    block = data.draw(st.one_of(st.integers(1, 6), st.tuples(st.integers(1, 6), st.integers(1, 6))), label="block")
    tiled = attention_backward(q, k, v, dout, mask=mask, block_size=block, **chosen)
    for a, b in zip(dense, tiled, strict=True):
        if a is not None:
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-12 * max(top, 1.0))
    out = scaled_dot_product_attention(q, k, v, mask=mask, **chosen)
    scale = max(1.0, np.abs(dout).max() * np.abs(out).max() * out.size)
    assert abs(np.sum(dense.dv * v) - np.sum(dout * out)) <= 1e-11 * scale
    assert abs(np.sum(dense.dq * q) - np.sum(dense.dk * k)) <= 1e-11 * max(1.0, top * (q.size + k.size) * 30)
    empty = ~mask.any(axis=-1)  # (L,): rows the mask leaves without a key
    assert not dense.dq[..., empty, :].any()


@st.composite
def gradient_problems(draw):
    """``(q, k, v, dout, options)``: small shapes, grouped-query heads, dropout, and biases up to 800 from zero
    (log-sum-exps past exp's range), with the other options at sizes where central differences are accurate."""
    L, S, E, Ev = (draw(st.integers(1, 4), label=name) for name in ("L", "S", "E", "Ev"))
    heads, kv_heads = draw(st.sampled_from([(1, 1), (2, 2), (2, 1), (4, 2), (6, 2), (6, 3)]), label="heads")
    gen = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    q = gen.standard_normal((heads, L, E))
    k, v = gen.standard_normal((kv_heads, S, E)), gen.standard_normal((kv_heads, S, Ev))
    dout = gen.standard_normal((heads, L, Ev))
    chosen = {"enable_gqa": kv_heads != heads, "is_causal": draw(st.booleans(), label="is_causal"),
              "causal_alignment": draw(st.sampled_from(["top-left", "bottom-right"]), label="alignment")}
    if draw(st.booleans(), label="with bias"):
        offset = draw(st.sampled_from([0.0, -300.0, 300.0, -800.0, 800.0]), label="offset")
        chosen["bias"] = offset + gen.standard_normal((heads, L, S))
    if draw(st.booleans(), label="with softcap"):
        chosen["softcap"] = draw(st.floats(0.5, 5.0), label="softcap")
    if draw(st.booleans(), label="with ALiBi"):
        chosen["alibi_slopes"] = gen.uniform(-1.0, 1.0, heads)
    if draw(st.booleans(), label="with sinks"):
        chosen["sinks"] = gen.uniform(-3.0, 3.0, heads) + (chosen["bias"].mean() if "bias" in chosen else 0.0)
    if draw(st.booleans(), label="with window"):
        chosen["window"] = (draw(st.integers(0, 3), label="left"), draw(st.one_of(st.none(), st.integers(0, 3))))
    if draw(st.booleans(), label="with dropout"):
        chosen["dropout_p"] = draw(st.sampled_from([0.2, 0.5]), label="dropout_p")
    return q, k, v, dout, chosen


@given(gradient_problems(), st.data())
def test_sampled_gradient_entries_equal_central_differences(problem, data):
    """Any options: a few entries of every gradient, dense and tiled, against central differences of the loss
    sum(dout * out). Without dropout the loss is tests/plain_options.py's independent float64 formula; with dropout
    it is the forward drawing the same mask from a fresh generator of the same seed at every evaluation (plain
    NumPy has no dropout). Unlike the identities above, this fails for a backward that drops D = rowsum(dO * O),
    tanh' of the soft cap, dropout's 1 / (1 - p), or sums the grouped heads' gradients over the wrong heads."""
    from conftest import _reference_attention
    from plain_options import reference_with_options

    q, k, v, dout, chosen = problem
    dropout = chosen.pop("dropout_p", 0.0)

    def loss(values):
        q, k, v, options = values["q"], values["k"], values["v"], {**chosen, **values["options"]}
        if dropout:
            out = scaled_dot_product_attention(q, k, v, dropout_p=dropout, rng=np.random.default_rng(3), **options)
        else:
            out = reference_with_options(_reference_attention, q, k, v, **options)[0]
        return float(np.sum(dout * out))

    extra = {"dropout_p": dropout, "rng": np.random.default_rng(3)} if dropout else {}
    block = data.draw(st.sampled_from([None, 1, 2, (3, 2)]), label="block")
    grads = attention_backward(q, k, v, dout, block_size=block, **chosen, **extra)
    targets = {"dq": ("q", q), "dk": ("k", k), "dv": ("v", v), "dbias": ("bias", chosen.get("bias")),
               "dsinks": ("sinks", chosen.get("sinks"))}
    for field, (name, array) in targets.items():
        if array is None:
            assert getattr(grads, field) is None, field
            continue
        got = getattr(grads, field)
        assert got.shape == array.shape and np.isfinite(got).all(), field
        for _ in range(2):
            index = tuple(data.draw(st.integers(0, n - 1), label=f"{field} index") for n in array.shape)
            h = 1e-5
            moved = []
            for step in (h, -h):
                changed = array.copy()
                changed[index] += step
                values = {"q": q, "k": k, "v": v, "options": {}}
                if name in "qkv":
                    values[name] = changed
                else:
                    values["options"] = {name: changed}
                moved.append(loss(values))
            numeric = (moved[0] - moved[1]) / (2 * h)
            # the loss's own rounding (scores up to 800: 800 ulp(1) = 1.8e-13) over 2h, and h^2 f''' for O(1) f'''
            assert abs(got[index] - numeric) <= 1e-6 * max(1.0, abs(numeric)), (field, index, got[index], numeric)
