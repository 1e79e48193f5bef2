"""Example tests of a PyTorch attention kernel, with the fixtures of
conftest.py. Replace `kernel` with yours."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from attention_ref.testing import assert_attention_close
from attention_ref.testing.strategies import attention_problems


def kernel(q, k, v, **options):
    """The kernel under test: here PyTorch's own SDPA."""
    return F.scaled_dot_product_attention(q, k, v, **options)


@pytest.mark.parametrize(
    "options",
    [{}, {"is_causal": True}, {"enable_gqa": True}, {"scale": 0.3}],
)
def test_output(make_qkv, check_attention, options):
    q, k, v = make_qkv(Hkv=2 if options.get("enable_gqa") else 4)
    check_attention(kernel(q, k, v, **options), q, k, v, **options)


def test_more_keys_than_queries_and_large_scores(make_qkv, check_attention):
    q, k, v = make_qkv(L=17, S=77, spread=3.0)
    check_attention(kernel(q, k, v), q, k, v)


def test_padding_leaves_a_query_with_no_key(make_qkv, check_attention):
    q, k, v = make_qkv()
    mask = torch.ones(64, 64, dtype=torch.bool, device=q.device)
    mask[5] = False  # query 5 may attend to nothing
    check_attention(kernel(q, k, v, attn_mask=mask), q, k, v, mask=mask)


def test_gradients(make_qkv, check_grads):
    q, k, v = make_qkv()
    out = kernel(q, k, v, is_causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    grads = q.grad, k.grad, v.grad
    check_grads(grads, q, k, v, dout, is_causal=True)


def test_widened_output(make_qkv, check_attention, dtype):
    q, k, v = make_qkv()
    out = kernel(q, k, v).float()  # computed in dtype, returned wider
    check_attention(out, q, k, v, dtype=dtype)


def test_dropout(make_qkv, check_attention, replay_keep_mask):
    q, k, v = make_qkv()
    p = 0.2

    def run(values):
        torch.manual_seed(2024)  # the same draws on every call
        return kernel(q, k, values, dropout_p=p)

    out = run(v)
    keep = replay_keep_mask(run, k)
    check_attention(out, q, k, v, dropout_p=p, dropout_mask=keep)


# --- property test: hypothesis draws the problems -------------------------
# SDPA has no soft cap; with two allowed keys or more in every row, a
# wrong scale changes every row's weights.
problems = attention_problems(
    dtypes=("bfloat16", "float32"), softcap=False, min_keys=2
)


@settings(deadline=None)
@given(problems)
def test_drawn_problems(p):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = p.to_torch(device)  # in the problem's dtype
    out = kernel(q, k, v, **p.sdpa_kwargs(device))
    assert_attention_close(out, p.q, p.k, p.v, **p.options)
