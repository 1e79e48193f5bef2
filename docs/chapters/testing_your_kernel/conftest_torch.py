"""Fixtures for testing a PyTorch attention kernel against attention_ref.

Copy this file into your tests folder as ``conftest.py``. The checkers take
torch tensors as they are: on any device, in any dtype (bfloat16 and fp8
included), requiring grad or not. PyTorch's layout, (B, H, L, E), is the
package's, so nothing is converted.
"""

import pytest
import torch

from attention_ref.testing import (
    assert_attention_close,
    assert_attention_grads_close,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=["float16", "bfloat16", "float32"])
def dtype(request):
    """Each test that asks for a dtype runs once in each of these."""
    return getattr(torch, request.param)


@pytest.fixture
def make_qkv(dtype):
    """make_qkv(...) -> q (B, H, L, E), k and v (B, Hkv, S, E): seeded,
    on DEVICE, in `dtype`, requiring grad."""

    def make(B=2, H=4, Hkv=4, L=64, S=64, E=32, spread=1.0):
        gen = torch.Generator().manual_seed(0)
        shapes = (B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, E)
        return [
            (spread * torch.randn(shape, generator=gen))
            .to(DEVICE, dtype)
            .requires_grad_()
            for shape in shapes
        ]

    return make


@pytest.fixture
def check_attention():
    """assert_attention_close, with PyTorch's conventions: a row with no
    allowed key is zeros (SDPA; pass empty_rows="nan" for
    nn.MultiheadAttention), and a torch dtype as dtype=."""

    def check(out, q, k, v, *, dtype=None, empty_rows="zeros", **options):
        assert_attention_close(
            out, q, k, v, dtype=dtype, empty_rows=empty_rows, **options
        )

    return check


@pytest.fixture
def check_grads():
    """assert_attention_grads_close for (dq, dk, dv), as check_attention."""

    def check(grads, q, k, v, dout, *, dtype=None, **options):
        assert_attention_grads_close(
            grads, q, k, v, dout, dtype=dtype, **options
        )

    return check


@pytest.fixture
def replay_keep_mask():
    """replay_keep_mask(run, k) -> the keep-mask (B, H, L, S) of a dropout
    kernel that never returns it.

    `run(v)` must call the kernel with the same seed every time (re-seed
    inside it). Values that are columns of the identity make the output
    the weights the kernel applied, kept and rescaled: zero where it
    dropped. The values keep k's shape, so the same kernel runs.
    """

    def replay(run, k):
        S, width = k.shape[-2], k.shape[-1]
        # columns S.. are zero: the last block may reach past the keys
        eye = torch.eye(S, S + width, dtype=k.dtype, device=k.device)
        blocks = []
        with torch.no_grad():
            for start in range(0, S, width):
                v = eye[:, start:start + width].expand(k.shape)
                weights = run(v.contiguous())  # (B, H, L, width)
                blocks.append(weights[..., : S - start])
        return torch.cat(blocks, dim=-1) != 0

    return replay
