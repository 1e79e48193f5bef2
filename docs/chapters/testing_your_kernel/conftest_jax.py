"""Fixtures for testing a JAX attention kernel against attention_ref.

Copy this file into your tests folder as ``conftest.py``. The checkers take
JAX arrays as they are; what differs is the layout. JAX writes (B, T, N, H):
batch, positions, heads, features, where the package (and PyTorch) put the
heads before the positions, (B, N, T, H). The fixtures pass layout="bshd",
which reads JAX's layout (and reports failing indices in it), and name
JAX's convention for a query with no allowed key.
"""

import jax
import jax.numpy as jnp
import pytest

from attention_ref.testing import (
    assert_attention_close,
    assert_attention_grads_close,
)


@pytest.fixture(params=["bfloat16", "float32"])
def dtype(request):
    """Each test that asks for a dtype runs once in each of these (add
    "float16" if your kernel takes it)."""
    return jnp.dtype(request.param)


@pytest.fixture
def make_qkv(dtype):
    """make_qkv(...) -> q (B, L, H, E), k and v (B, S, Hkv, E): seeded,
    in `dtype`, in JAX's layout."""

    def make(B=2, H=4, Hkv=4, L=64, S=64, E=32, spread=1.0):
        keys = jax.random.split(jax.random.key(0), 3)
        shapes = (B, L, H, E), (B, S, Hkv, E), (B, S, Hkv, E)
        return [
            (spread * jax.random.normal(key, shape)).astype(dtype)
            for key, shape in zip(keys, shapes, strict=True)
        ]

    return make


@pytest.fixture
def check_attention():
    """assert_attention_close for (B, T, N, H) arrays. A row with no
    allowed key is the mean of all the values with a mask (JAX masks with
    a large finite number); pass empty_rows="zeros" for rows that
    query_seq_lengths pads. A mask is (B, N, T, S), as the package's."""

    def check(out, q, k, v, *, empty_rows="mean", **options):
        assert_attention_close(
            out, q, k, v, layout="bshd", empty_rows=empty_rows, **options
        )

    return check


@pytest.fixture
def check_grads():
    """assert_attention_grads_close for (dq, dk, dv) in JAX's layout. JAX
    masks with `where`, so a row with no key passes no gradient to q and
    k, and the mean's gradient to v: empty_rows="mean" says so."""

    def check(grads, q, k, v, dout, *, empty_rows="mean", **options):
        assert_attention_grads_close(
            grads, q, k, v, dout, layout="bshd", empty_rows=empty_rows,
            **options,
        )

    return check
