"""FlashAttention's test oracle, re-written in plain PyTorch from its published semantics.

FlashAttention checks its kernels against a slow reference, ``attention_ref`` in its
``tests/test_flash_attn.py``, with helpers ``construct_local_mask`` and ``attn_bias_from_alibi``. This
module writes the same semantics out again (it is not a copy of that code), so that attention_ref can be
compared with what FlashAttention's own tests accept as correct:

- layout ``(batch, seqlen, heads, head_dim)``; k and v may have fewer heads (grouped-query attention,
  query head ``h`` reads key/value head ``h // (Hq // Hkv)``);
- scores ``q k^T / sqrt(d)``, then the soft cap ``softcap * tanh(scores / softcap)`` (``softcap > 0``),
  then the key padding and the local window set to ``-inf``, then ``attn_bias`` added (ALiBi comes in
  as such a bias), then the softmax;
- every position is aligned bottom-right *per sequence*: with ``sk`` and ``sq`` the real (unpadded)
  lengths of sequence ``b``, query ``i`` sits at key position ``i + sk - sq``;
- ``window_size=(left, right)`` lets query ``i`` see the keys ``i + sk - sq - left`` to
  ``i + sk - sq + right``; ``-1`` leaves a side unbounded; ``causal=True`` sets ``right = 0``. (The
  kernels read ``-1`` this way on either side. The reference's own helper takes a lone ``right = -1``
  literally, one key left of the diagonal, a case its tests never draw; the kernels' reading is used.)
- ``key_leftpad[b]`` leading key columns are left padding: column ``j`` is key position
  ``j - key_leftpad[b]``, and the padding columns are never within a window;
- rows that the window leaves without a key, and padded query rows, are zeros; a row hidden only by
  the key padding mask comes out NaN (a softmax of ``-inf`` only), as in the original;
- ALiBi (``attn_bias_from_alibi``) is ``-slope * |i + sk - sq - j|``, or with ``causal=True``
  ``slope * (j - (seqlen_k - 1))``, which differs from it by a constant per row on the keys a causal
  row sees, so the softmax is the same.

Reference: https://github.com/Dao-AILab/flash-attention, ``tests/test_flash_attn.py``.
"""

import math

import torch


def _key_positions(batch, seqlen_k, key_leftpad):
    """Key position of every column, shape (seqlen_k,) or (batch, 1, 1, seqlen_k); padding gets 2**32."""
    col = torch.arange(seqlen_k)
    if key_leftpad is None:
        return col
    pad = key_leftpad.view(-1, 1, 1, 1)
    col = col.view(1, 1, 1, -1).expand(batch, 1, 1, seqlen_k)
    return torch.where(col >= pad, col - pad, torch.full_like(col, 2**32))


def _query_positions(seqlen_q, seqlen_k, query_padding_mask, key_padding_mask):
    """Key position ``i + sk - sq`` of every query row, shape (seqlen_q, 1) or (batch, 1, seqlen_q, 1)."""
    row = torch.arange(seqlen_q).view(-1, 1)
    sk = seqlen_k if key_padding_mask is None else key_padding_mask.sum(-1).view(-1, 1, 1, 1)
    sq = seqlen_q if query_padding_mask is None else query_padding_mask.sum(-1).view(-1, 1, 1, 1)
    return row + sk - sq


def local_mask(seqlen_q, seqlen_k, window_size, query_padding_mask=None, key_padding_mask=None, key_leftpad=None):
    """True where the window ``(left, right)`` hides key column ``j`` from query ``i`` (``-1``: unbounded side)."""
    batch = None if key_leftpad is None else key_leftpad.shape[0]
    col = _key_positions(batch, seqlen_k, key_leftpad)
    position = _query_positions(seqlen_q, seqlen_k, query_padding_mask, key_padding_mask)
    left, right = window_size
    hidden = torch.zeros(torch.broadcast_shapes(col.shape, position.shape), dtype=torch.bool)
    if right >= 0:
        hidden |= col > position + right
    if left >= 0:
        hidden |= col < position - left
    return hidden


def alibi_bias(slopes, seqlen_q, seqlen_k, query_padding_mask=None, key_padding_mask=None, causal=False,
               key_leftpad=None):
    """FlashAttention's ALiBi bias for slopes of shape (nheads,) or (batch, nheads): (batch or 1, nheads, L, S)."""
    slopes = slopes.view(-1, slopes.shape[-1], 1, 1) if slopes.dim() == 2 else slopes.view(1, -1, 1, 1)
    if causal:
        return torch.arange(-seqlen_k + 1, 1, dtype=slopes.dtype) * slopes
    batch = None if key_leftpad is None else key_leftpad.shape[0]
    col = _key_positions(batch, seqlen_k, key_leftpad)
    position = _query_positions(seqlen_q, seqlen_k, query_padding_mask, key_padding_mask)
    return -slopes * (position - col).abs().to(slopes.dtype)


def attention_ref(q, k, v, query_padding_mask=None, key_padding_mask=None, attn_bias=None, causal=False,
                  window_size=(-1, -1), softcap=0.0, key_leftpad=None):
    """``(output, attention)``: output (batch, seqlen_q, nheads, d), attention (batch, nheads, seqlen_q, seqlen_k)."""
    if causal:
        window_size = (window_size[0], 0)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q / math.sqrt(q.shape[-1]), k)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask.view(k.shape[0], 1, 1, seqlen_k), -math.inf)
    windowed = window_size[0] >= 0 or window_size[1] >= 0
    if windowed:
        hidden = local_mask(seqlen_q, seqlen_k, window_size, query_padding_mask, key_padding_mask, key_leftpad)
        scores = scores.masked_fill(hidden, -math.inf)
    if attn_bias is not None:
        scores = scores + attn_bias
    attention = torch.softmax(scores, dim=-1)
    if windowed:  # rows the window empties are zeros rather than NaN
        attention = attention.masked_fill(hidden.all(dim=-1, keepdim=True), 0.0)
    if query_padding_mask is not None:
        attention = attention.masked_fill(~query_padding_mask.view(q.shape[0], 1, seqlen_q, 1), 0.0)
    output = torch.einsum("bhqk,bkhd->bqhd", attention, v)
    if query_padding_mask is not None:
        output = output.masked_fill(~query_padding_mask.view(q.shape[0], seqlen_q, 1, 1), 0.0)
    return output, attention
