"""Example tests of a JAX attention kernel, with the fixtures of
conftest.py. Replace `kernel` with yours."""

import jax
import jax.numpy as jnp
import pytest


def kernel(q, k, v, **options):
    """The kernel under test: here JAX's own dot_product_attention."""
    return jax.nn.dot_product_attention(q, k, v, **options)


@pytest.mark.parametrize("options", [{}, {"is_causal": True}])
def test_output(make_qkv, check_attention, options):
    q, k, v = make_qkv()
    check_attention(kernel(q, k, v, **options), q, k, v, **options)


def test_grouped_query_heads(make_qkv, check_attention):
    q, k, v = make_qkv(H=8, Hkv=2)  # JAX infers the groups
    check_attention(kernel(q, k, v), q, k, v, enable_gqa=True)


def test_a_query_with_no_key(make_qkv, check_attention):
    q, k, v = make_qkv()
    mask = jnp.ones((1, 1, 64, 64), dtype=bool).at[..., 5, :].set(False)
    check_attention(kernel(q, k, v, mask=mask), q, k, v, mask=mask)


def test_padded_queries_are_zeros(make_qkv, check_attention):
    q, k, v = make_qkv()
    lengths = jnp.array([64, 40], dtype=jnp.int32)
    out = kernel(q, k, v, query_seq_lengths=lengths)
    real = jnp.arange(64) < lengths[:, None]  # (B, L): a real query
    mask = real[:, None, :, None]  # (B, 1, L, 1): padded rows see nothing
    check_attention(out, q, k, v, mask=mask, empty_rows="zeros")


def test_gradients(make_qkv, check_grads):
    q, k, v = make_qkv()
    out, backward = jax.vjp(
        lambda q, k, v: kernel(q, k, v, is_causal=True), q, k, v
    )
    dout = jax.random.normal(jax.random.key(1), out.shape).astype(out.dtype)
    check_grads(backward(dout), q, k, v, dout, is_causal=True)
