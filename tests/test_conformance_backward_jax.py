"""attention_backward against ``jax.grad`` of ``jax.nn.dot_product_attention`` in float64.

JAX's layout is (batch, length, heads, features); the arrays are transposed to it and the gradients back.
Compared: plain, ``scale``, causal, boolean masks, a bias (its gradient is our ``dbias``), grouped-query heads
(JAX takes fewer key/value heads directly) and JAX's ``local_window_size`` (our ``window``).

JAX computes the softmax in float32 whatever the input dtype ("Softmax is always computed in float32", in
``jax/_src/nn/functions.py``, checked with 0.10.2: the logits are cast with ``.astype(np.float32)``), so even in
float64 its gradients carry float32 rounding: each call asserts ``max |ours - jax| <= 1e-6 * max |gradient|``
(about eight float32 ulps; measured up to about 1e-7). The float64 agreement to 1e-12 is PyTorch's
(test_conformance_backward_torch.py). Without JAX the tests skip locally and fail in CI (``require``).
"""

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import assert_finite_where, max_deviation, not_recorded, planted, require

from attention_ref import attention_backward

TOL = 1e-6  # JAX's float32 softmax; see the module docstring
SEEDS = range(2)


@pytest.fixture(scope="module")
def jax():
    return require("jax")


def to_jax_layout(a):
    """(B, H, T, D) -> (B, T, H, D), and back (the same swap)."""
    return np.swapaxes(a, -2, -3)


def jax_grads(jax, dout, q, k, v, *, bias=None, mask=None, **kwargs):
    """``jax.grad`` of ``sum(dout * dot_product_attention(...))`` for q, k, v (and bias), in our layout."""
    with jax.enable_x64(True):
        import jax.numpy as jnp

        def loss(q, k, v, bias):
            out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, implementation="xla", **kwargs)
            return jnp.sum(out * jnp.asarray(to_jax_layout(dout)))

        arrays = [jnp.asarray(to_jax_layout(a)) for a in (q, k, v)]
        jbias = None if bias is None else jnp.asarray(bias)
        argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
        grads = jax.grad(loss, argnums=argnums)(*arrays, jbias)
        result = {name: to_jax_layout(np.asarray(g)) for name, g in zip(("dq", "dk", "dv"), grads[:3], strict=True)}
        if bias is not None:
            result["dbias"] = np.asarray(grads[3])
        return result


def assert_close_to(ours, theirs, record_deviation, option):
    """Every gradient within TOL of JAX's largest gradient entry, finite wherever JAX's is."""
    assert all(np.all(np.isfinite(g)) for g in theirs.values()), "jax gave a non-finite gradient"
    top = max(np.abs(g).max() for g in theirs.values())
    worst = 0.0
    for name, want in theirs.items():
        got = getattr(ours, name)
        assert got.shape == want.shape, name
        assert_finite_where(got, want, f"jax's {name}")
        worst = max(worst, max_deviation(got, want))  # never NaN: max(worst, nan) would drop it
    assert record_deviation(f"jax backward: {option}", worst / top, 0.0) <= TOL


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["dq", "dk", "dv"])
def test_assert_close_to_fails_on_nan_or_inf_in_ours(value, name):
    grads = {n: planted(0.0, seed=i)[1] for i, n in enumerate(("dq", "dk", "dv"))}
    assert_close_to(SimpleNamespace(**{n: g.copy() for n, g in grads.items()}), grads, not_recorded, "planted")
    bad = SimpleNamespace(**{n: g.copy() for n, g in grads.items()})
    getattr(bad, name)[1, 2, 3] = value
    with pytest.raises(AssertionError):
        assert_close_to(bad, grads, not_recorded, "planted")


def problem(seed, *, heads=3, kv_heads=None, L=4, S=5, E=3):
    g = np.random.default_rng(seed)
    kv_heads = heads if kv_heads is None else kv_heads
    q = g.normal(size=(2, heads, L, E))
    k = g.normal(size=(2, kv_heads, S, E))
    v = g.normal(size=(2, kv_heads, S, E))  # JAX needs Ev == E
    dout = g.normal(size=(2, heads, L, E))
    return g, q, k, v, dout


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("option", "ours", "theirs"),
    [
        ("plain", {}, {}),
        ("scale", {"scale": 0.8}, {"scale": 0.8}),
        ("causal", {"is_causal": True}, {"is_causal": True}),
        ("window", {"window": (1, 2)}, {"local_window_size": (1, 2)}),
        ("causal window", {"window": (2, 0), "is_causal": True}, {"local_window_size": (2, 0), "is_causal": True}),
    ],
)
def test_options(jax, record_deviation, option, ours, theirs, seed, block_size):
    _, q, k, v, dout = problem(seed, L=5, S=5)  # JAX's window and causal mask are top-left; L = S keeps rows full
    assert_close_to(attention_backward(q, k, v, dout, block_size=block_size, **ours), jax_grads(jax, dout, q, k, v,
                    **theirs), record_deviation, option)


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("seed", SEEDS)
def test_boolean_mask_and_bias(jax, record_deviation, seed, block_size):
    g, q, k, v, dout = problem(seed)
    mask = g.random((2, 1, 4, 5)) < 0.6
    mask[..., 1] = True
    bias = g.normal(size=(2, 3, 4, 5))
    ours = attention_backward(q, k, v, dout, mask=mask, bias=bias, block_size=block_size)
    theirs = jax_grads(jax, dout, q, k, v, bias=bias, mask=mask)
    assert_close_to(ours, theirs, record_deviation, "mask and bias (dbias)")


@pytest.mark.parametrize("block_size", [None, 3])
@pytest.mark.parametrize(("kv_heads", "group"), [(1, 4), (2, 2)])
def test_grouped_query_heads(jax, record_deviation, kv_heads, group, block_size):
    _, q, k, v, dout = problem(0, heads=kv_heads * group, kv_heads=kv_heads)
    ours = attention_backward(q, k, v, dout, enable_gqa=True, block_size=block_size)
    assert_close_to(ours, jax_grads(jax, dout, q, k, v), record_deviation, "grouped-query heads")
