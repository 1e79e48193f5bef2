"""attention_backward against PyTorch autograd in float64.

Through ``torch.nn.functional.scaled_dot_product_attention`` (math kernel) for what SDPA has: plain, causal in
both alignments (bottom-right as an explicit boolean mask), boolean masks, float masks (``attn_mask.grad`` is
our ``dbias``), grouped-query heads, ``scale``, L != S and Ev != E. Through the attention written out in float64
torch for what SDPA lacks: the soft cap, windows, ALiBi and sinks (with the sinks' gradient).

Every call asserts ``max |ours - torch| <= 1e-12 * max |gradient|`` over all the call's gradients, dense and
tiled, and records that relative deviation per option ("torch backward: <option>" in the session summary).
"""

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import assert_finite_where, max_deviation, not_recorded, planted
from plain_options import alibi_plain, window_allowed

from attention_ref import attention_backward

pytestmark = pytest.mark.torch

TOL = 1e-12
SEEDS = range(3)


@pytest.fixture
def tt(torch):
    torch.set_num_threads(1)
    return torch


def leaf(torch, a):
    """A float64 torch leaf tensor that records its gradient."""
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=torch.float64, requires_grad=True)


def torch_grads(torch, forward, dout, **inputs):
    """Gradients of ``sum(dout * forward(**tensors))`` for every input given as an array (None ones pass)."""
    tensors = {name: None if a is None else leaf(torch, a) for name, a in inputs.items()}
    out = forward(**tensors)
    (out * torch.from_numpy(np.asarray(dout, dtype=np.float64))).sum().backward()
    return {name: None if t is None else t.grad.numpy() for name, t in tensors.items()}


def sdpa(torch, **kwargs):
    """SDPA with the math kernel (the float64 reference kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forward(q, k, v, attn_mask=None):
        with sdpa_kernel(SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)

    return forward


def written_out(torch, *, scale, softcap=None, allowed=None, extra_bias=None):
    """Attention with the soft cap, a fixed additive term, an allowed-keys mask and sinks, in plain torch.

    The sink enters as gpt-oss does it: a last column of scores holding the head's sink, dropped after the
    softmax. ``allowed`` must leave every row a key (torch's softmax of an all -inf row is NaN).
    """

    def forward(q, k, v, sinks=None):
        s = (q @ k.transpose(-1, -2)) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if extra_bias is not None:
            s = s + torch.from_numpy(extra_bias)
        if allowed is not None:
            s = s.masked_fill(~torch.from_numpy(np.broadcast_to(allowed, s.shape).copy()), float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.view(-1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
        w = torch.softmax(s, dim=-1)
        if sinks is not None:
            w = w[..., :-1]
        return w @ v

    return forward


def assert_grads_conform(record_deviation, option, ours_by_path, theirs, names):
    """Every gradient of every path within 1e-12 of the largest gradient entry; records the relative deviation."""
    top = max(np.abs(theirs[n]).max(initial=0.0) for n in names)
    for ours in ours_by_path:
        worst = 0.0
        for n in names:
            got = getattr(ours, n)
            assert got.shape == theirs[n].shape, n
            assert np.all(np.isfinite(theirs[n])), f"torch gave non-finite {n}"
            assert_finite_where(got, theirs[n], f"torch's {n}")
            worst = max(worst, max_deviation(got, theirs[n]))  # never NaN: max(worst, nan) would drop it
        deviation = record_deviation(f"torch backward: {option}", worst / top, 0.0)
        assert deviation <= TOL, option


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["dq", "dk", "dv"])
def test_assert_grads_conform_fails_on_nan_or_inf_in_ours(value, name):
    grads = {n: planted(0.0, seed=i)[1] for i, n in enumerate(QKV)}
    good = SimpleNamespace(**{n: g.copy() for n, g in grads.items()})
    assert_grads_conform(not_recorded, "planted", [good], grads, QKV)
    bad = SimpleNamespace(**{n: g.copy() for n, g in grads.items()})
    getattr(bad, name)[1, 2, 3] = value
    with pytest.raises(AssertionError):
        assert_grads_conform(not_recorded, "planted", [good, bad], grads, QKV)


def ours_both_paths(q, k, v, dout, **options):
    """Our gradients, dense and tiled (two block shapes)."""
    return [attention_backward(q, k, v, dout, block_size=b, **options) for b in (None, 2, (3, 1))]


def problem(seed, *, batch=(2, 3), L=4, S=5, E=3, Ev=2, kv_heads=None):
    g = np.random.default_rng(seed)
    kv_batch = batch if kv_heads is None else (*batch[:-1], kv_heads)
    q = g.normal(size=(*batch, L, E))
    k = g.normal(size=(*kv_batch, S, E))
    v = g.normal(size=(*kv_batch, S, Ev))
    dout = g.normal(size=(*batch, L, Ev))
    return g, q, k, v, dout


QKV = ("dq", "dk", "dv")


# --- through SDPA --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("L", "S", "E", "Ev"), [(4, 4, 3, 3), (3, 6, 4, 2), (6, 2, 2, 5)])
def test_plain_l_s_e_ev(tt, record_deviation, seed, L, S, E, Ev):
    _, q, k, v, dout = problem(seed, L=L, S=S, E=E, Ev=Ev)
    theirs = torch_grads(tt, sdpa(tt), dout, q=q, k=k, v=v)
    assert_grads_conform(record_deviation, "plain", ours_both_paths(q, k, v, dout), _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [0.0, 0.3, 2.0])
def test_scale(tt, record_deviation, seed, scale):
    _, q, k, v, dout = problem(seed)
    theirs = torch_grads(tt, sdpa(tt, scale=scale), dout, q=q, k=k, v=v)
    ours = ours_both_paths(q, k, v, dout, scale=scale)
    assert_grads_conform(record_deviation, "scale", ours, _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("L", "S"), [(4, 4), (3, 6), (6, 6)])
def test_causal_top_left(tt, record_deviation, seed, L, S):
    _, q, k, v, dout = problem(seed, L=L, S=S)
    theirs = torch_grads(tt, sdpa(tt, is_causal=True), dout, q=q, k=k, v=v)
    ours = ours_both_paths(q, k, v, dout, is_causal=True)
    assert_grads_conform(record_deviation, "causal top-left", ours, _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("L", "S"), [(4, 4), (3, 6), (2, 5)])
def test_causal_bottom_right_as_an_explicit_mask(tt, record_deviation, seed, L, S):
    _, q, k, v, dout = problem(seed, L=L, S=S)
    allowed = window_allowed(L, S, alignment="bottom-right", is_causal=True)
    forward = sdpa(tt)
    theirs = torch_grads(tt, lambda q, k, v: forward(q, k, v, tt.from_numpy(allowed)), dout, q=q, k=k, v=v)
    ours = ours_both_paths(q, k, v, dout, is_causal=True, causal_alignment="bottom-right")
    assert_grads_conform(record_deviation, "causal bottom-right", ours, _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
def test_boolean_mask(tt, record_deviation, seed):
    g, q, k, v, dout = problem(seed)
    mask = g.random((2, 1, 4, 5)) < 0.6
    mask[..., 0] = True  # every row keeps a key
    forward = sdpa(tt)
    theirs = torch_grads(tt, lambda q, k, v: forward(q, k, v, tt.from_numpy(mask)), dout, q=q, k=k, v=v)
    assert_grads_conform(record_deviation, "boolean mask", ours_both_paths(q, k, v, dout, mask=mask),
                         _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(4, 5), (3, 1, 5), (2, 3, 4, 5)])
def test_float_mask_gradient_is_dbias(tt, record_deviation, seed, shape):
    g, q, k, v, dout = problem(seed)
    bias = g.normal(size=shape) * 2
    theirs = torch_grads(tt, sdpa(tt), dout, q=q, k=k, v=v, attn_mask=bias)
    ours = ours_both_paths(q, k, v, dout, bias=bias)
    assert_grads_conform(record_deviation, "float mask (dbias)", ours, _rename(theirs), (*QKV, "dbias"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("kv_heads", "group"), [(1, 4), (2, 2), (3, 1)])
def test_enable_gqa(tt, record_deviation, seed, kv_heads, group):
    _, q, k, v, dout = problem(seed, batch=(2, kv_heads * group), kv_heads=kv_heads)
    theirs = torch_grads(tt, sdpa(tt, enable_gqa=True, is_causal=True), dout, q=q, k=k, v=v)
    ours = ours_both_paths(q, k, v, dout, enable_gqa=True, is_causal=True)
    assert_grads_conform(record_deviation, "enable_gqa", ours, _rename(theirs), QKV)


# --- through attention written out in torch ------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("softcap", [0.5, 2.0, 30.0])
def test_softcap(tt, record_deviation, seed, softcap):
    _, q, k, v, dout = problem(seed)
    q = q * 3  # scores well into the cap's curve
    theirs = torch_grads(tt, written_out(tt, scale=0.5, softcap=softcap), dout, q=q, k=k, v=v)
    ours = ours_both_paths(q, k, v, dout, scale=0.5, softcap=softcap)
    assert_grads_conform(record_deviation, "softcap", ours, _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("window", [(1, 1), (0, 2), (2, 0), (None, 1), (1, None)])
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_window(tt, record_deviation, seed, window, alignment):
    _, q, k, v, dout = problem(seed, L=5, S=6)
    allowed = window_allowed(5, 6, window, alignment)
    if not allowed.any(-1).all():
        pytest.fail("the case must leave every row a key (torch's softmax of an empty row is NaN)")
    theirs = torch_grads(tt, written_out(tt, scale=0.5, allowed=allowed), dout, q=q, k=k, v=v)
    ours = ours_both_paths(q, k, v, dout, scale=0.5, window=window, causal_alignment=alignment)
    assert_grads_conform(record_deviation, "window", ours, _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_alibi(tt, record_deviation, seed, alignment):
    _, q, k, v, dout = problem(seed, L=4, S=6)
    slopes = np.array([0.5, 0.25, 0.125])
    bias = np.ascontiguousarray(alibi_plain(slopes, 4, 6, alignment))
    theirs = torch_grads(tt, written_out(tt, scale=0.5, extra_bias=bias), dout, q=q, k=k, v=v)
    ours = ours_both_paths(q, k, v, dout, scale=0.5, alibi_slopes=slopes, causal_alignment=alignment)
    assert_grads_conform(record_deviation, "alibi", ours, _rename(theirs), QKV)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("spread", [1.0, 5.0])
def test_sinks_with_their_gradient(tt, record_deviation, seed, spread):
    g, q, k, v, dout = problem(seed)
    sinks = g.normal(size=3) * spread
    theirs = torch_grads(tt, written_out(tt, scale=0.5), dout, q=q, k=k, v=v, sinks=sinks)
    ours = ours_both_paths(q, k, v, dout, scale=0.5, sinks=sinks)
    assert_grads_conform(record_deviation, "sinks (dsinks)", ours, _rename(theirs), (*QKV, "dsinks"))


@pytest.mark.parametrize("seed", SEEDS)
def test_everything_written_out(tt, record_deviation, seed):
    g, q, k, v, dout = problem(seed, L=5, S=6)
    sinks, slopes = g.normal(size=3), np.array([0.3, 0.2, 0.1])
    allowed = window_allowed(5, 6, (2, None), "bottom-right", is_causal=True)
    bias = np.ascontiguousarray(alibi_plain(slopes, 5, 6, "bottom-right"))
    forward = written_out(tt, scale=0.7, softcap=3.0, allowed=allowed, extra_bias=bias)
    theirs = torch_grads(tt, forward, dout, q=q * 2, k=k, v=v, sinks=sinks)
    ours = ours_both_paths(q * 2, k, v, dout, scale=0.7, softcap=3.0, window=(2, None), is_causal=True,
                           causal_alignment="bottom-right", alibi_slopes=slopes, sinks=sinks)
    assert_grads_conform(record_deviation, "everything", ours, _rename(theirs), (*QKV, "dsinks"))


def _rename(grads):
    """torch's input names to AttentionGrads' field names."""
    names = {"q": "dq", "k": "dk", "v": "dv", "attn_mask": "dbias", "sinks": "dsinks"}
    return {names[n]: g for n, g in grads.items()}
