"""The online softmax: attention over tiles of keys with a running maximum, sum and output per query row.

Below both `attention` (whose ``return_lse`` it gives) and `blockwise` (whose kernel it is), and below the
backward passes and Flex, which reuse its tile update; it takes a prepared problem and imports no module of
the package but the kernel's thread pool.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ._kernel import run_blocks, scaled_down_values


def safe_max(m):
    """`m` with ``-inf`` replaced by 0, so that ``x - m`` never forms ``-inf - (-inf)``."""
    return np.where(np.isneginf(m), 0.0, m).astype(m.dtype, copy=False)


def online_update(m, l, acc, s, v_blk):
    """Fold one tile of scores `s` (..., bq, bk) into the running
    ``(m, l, acc)``, in place.

    ``m`` (..., bq) is the running row maximum, ``l`` (..., bq) the
    running sum of ``exp(score - m)`` and ``acc`` (..., bq, Ev) the
    running ``sum exp(score - m) v``. `s` is overwritten with the
    unnormalised weights.
    """
    m_new = np.maximum(m, s.max(axis=-1))  # (..., bq)
    shift = safe_max(m_new)
    alpha = np.exp(m - shift)  # rescales the old state; 0 where m was -inf
    s -= shift[..., None]
    np.exp(s, out=s)  # (..., bq, bk)
    l *= alpha
    l += s.sum(axis=-1)
    acc *= alpha[..., None]
    acc += s @ v_blk  # (..., bq, Ev)
    m[...] = m_new


def _attend_query_block(p, p_inside, q_rows, kt, vs, rows, block_k, out, lse):
    """Run the online softmax over the key blocks for one block of query rows.

    ``q_rows`` (..., bq, E) are the queries ``rows``; ``kt`` (..., E, S) and
    ``vs`` (..., S, Ev) all keys and values. Only the keys the window (or
    causal mask) lets some query of the block see are visited; tiles that
    cross its edge get the window mask, tiles inside it are computed with
    ``p_inside``, the same problem without a window. Writes
    ``out[..., rows, :]`` and ``lse[..., rows]``.
    """
    dtype = q_rows.dtype
    q_rows = q_rows * dtype.type(p.scale)  # scale the (bq, E) queries, not every (bq, bk) tile
    shape = q_rows.shape[:-1]  # (..., bq)
    if p.sinks is None:
        m = np.full(shape, -np.inf, dtype=dtype)
        l = np.zeros(shape, dtype=dtype)
    else:
        # The sink as a first key with score s_h and value 0: m = s_h, l = exp(s_h - m) = 1, acc = 0.
        m = np.broadcast_to(p.sinks[..., None], shape).astype(dtype)
        l = np.ones(shape, dtype=dtype)
    acc = np.zeros((*shape, vs.shape[-1]), dtype=dtype)
    start, stop = p.key_range(rows)
    for c0 in range(start, stop, block_k):
        cols = slice(c0, min(stop, c0 + block_k))
        s = q_rows @ kt[..., cols]  # (..., bq, bk)
        p.cap(s)
        extra = (p_inside if p.inside_window(rows, cols) else p).additive(rows, cols)
        if extra is not None:
            s += extra
        online_update(m, l, acc, s, vs[..., cols, :])
    seen = l != 0  # False for rows with no allowed key (NaN rows stay NaN)
    np.divide(acc, l[..., None], out=out[..., rows, :], where=seen[..., None])
    np.log(l, out=l, where=seen)
    np.add(m, l, out=lse[..., rows], where=seen)


def online_softmax(p, block_q: int = 256, block_k: int = 256):
    """``(out, lse)`` of the prepared problem `p` by the online softmax, in the working dtype.

    The computation behind `blockwise_attention`, also what gives
    `scaled_dot_product_attention` its ``return_lse``: ``out`` (..., L, Ev)
    and ``lse`` (..., L), ``-inf`` (or the sink's logit) for a row with no
    allowed key. Dropout in `p` is ignored: the log-sum-exp is that of the
    weights before dropout.
    """
    # Tiles inside the window (below the causal diagonal) only need the mask, bias and ALiBi (if any).
    p_inside = dataclasses.replace(p, window=None)
    L, S = p.n_queries, p.n_keys
    batch = p.out_shape[:-2]
    dtype = p.q.dtype
    ev = p.v.shape[-1]
    # Broadcast views (no copies), so every tile has the full batch shape and
    # the running state can be updated in place.
    qs = np.broadcast_to(p.q, (*batch, L, p.q.shape[-1]))
    kt = np.broadcast_to(np.swapaxes(p.k, -1, -2), (*batch, p.k.shape[-1], S))  # (..., E, S)
    vs = np.broadcast_to(p.v, (*batch, S, ev))

    out = np.zeros((*batch, L, ev), dtype=dtype)
    lse = np.full((*batch, L), -np.inf, dtype=dtype)

    def attend(r0):
        """Fill ``out`` and ``lse`` for the query rows ``r0 : r0 + block_q``."""
        rows = slice(r0, min(L, r0 + block_q))
        with np.errstate(invalid="ignore", over="ignore"):  # per thread: errstate is thread-local
            _attend_query_block(p, p_inside, qs[..., rows, :], kt, vs, rows, block_k, out, lse)
            if not np.isfinite(out[..., rows, :]).all():
                # The running sums reach up to S * max|v|, which overflows for values within a factor S of
                # the largest float (or the input is not finite): redo the block with the values scaled down.
                v_small, e = scaled_down_values(vs, S)
                _attend_query_block(p, p_inside, qs[..., rows, :], kt, v_small, rows, block_k, out, lse)
                np.ldexp(out[..., rows, :], e, out=out[..., rows, :])

    # Query blocks are independent: run them on the package's thread pool
    # (one BLAS thread each) when there is enough work, as the dense kernel does.
    starts = range(0, L, block_q)
    visited = [p.key_range(slice(r0, min(L, r0 + block_q))) for r0 in starts]  # keys each query block visits
    n_scores = sum(min(block_q, L - r0) * (stop - start) for r0, (start, stop) in zip(starts, visited, strict=True))
    run_blocks(attend, starts, math.prod(batch) * n_scores)
    return out, lse
