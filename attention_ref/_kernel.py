"""The fast exact kernel behind the dense attention path.

It computes exactly what the textbook formula computes, row by row, but in
blocks of queries so that the (block, S) slice of scores stays in cache, with
every step done in place, and the softmax normalisation applied to the
(block, Ev) output instead of the (block, S) weights. Blocks are independent,
so they run on a small thread pool: NumPy releases the GIL inside matmul and
ufuncs.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__: list[str] = []  # private module

#: Queries per block: (QUERY_BLOCK, S) scores in float64 stay within a few MiB.
QUERY_BLOCK = 256
#: Below this many score entries threads cost more than they save.
_PARALLEL_MIN = 1 << 20

_pool: ThreadPoolExecutor | None = None
_blas_controller = None


def _one_blas_thread():
    """Context manager limiting BLAS to one thread while our own threads run.

    Two Python threads each calling a multi-threaded BLAS oversubscribe the
    cores; with threadpoolctl installed each block's matmul runs on one
    BLAS thread instead. Without it the blocks run serially (returns None).
    """
    global _blas_controller
    if _blas_controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _blas_controller = False
        else:
            _blas_controller = ThreadpoolController()
    if _blas_controller is False:
        return None
    return _blas_controller.limit(limits=1, user_api="blas")


def n_threads() -> int:
    """Worker threads to use: ``ATTENTION_REF_NUM_THREADS`` if set, else one per core."""
    value = os.environ.get("ATTENTION_REF_NUM_THREADS", "").strip()
    if not value:
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"ATTENTION_REF_NUM_THREADS must be a positive integer; got {value!r}")
    return n


def _get_pool() -> ThreadPoolExecutor | None:
    """A process-wide pool with one worker per thread allowed (None for one thread)."""
    global _pool
    n = n_threads()
    if n < 2:
        return None
    if _pool is None or _pool._max_workers != n:
        _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="attention_ref")
    return _pool


def run_blocks(fn, tasks, n_scores: int) -> None:
    """Call ``fn(task)`` for every task, on the thread pool when there is enough work.

    The tasks must be independent (they write disjoint parts of an output).
    ``n_scores`` is the number of score entries the whole call computes; below
    ``_PARALLEL_MIN`` threads cost more than they save. NumPy's error state is
    thread-local, so `fn` must set its own ``np.errstate``.
    """
    tasks = list(tasks)
    threads = n_threads()  # checks ATTENTION_REF_NUM_THREADS on every call
    pool = _get_pool() if threads > 1 and len(tasks) > 1 and n_scores >= _PARALLEL_MIN else None
    limit = _one_blas_thread() if pool is not None else None
    if pool is None or limit is None:
        for task in tasks:
            fn(task)
        return
    # One submission per thread (a future per task costs ~25 us); interleaved
    # so that each thread gets a share of the heavier late causal blocks.
    chunks = [tasks[i::threads] for i in range(threads)]

    def run_chunk(chunk):
        for task in chunk:
            fn(task)

    with limit:
        for _ in pool.map(run_chunk, chunks):
            pass


def softmax_rows_times(scores, v1, out):
    """Write ``softmax(scores, axis=-1) @ v`` into `out`, overwriting `scores`.

    ``scores`` (l, S) holds scaled scores with any additive terms already
    added; ``v1`` (S, Ev + 1) is ``v`` with a column of ones appended, so that
    one matrix product gives both the unnormalised output and the row sums.
    Rows whose maximum is ``-inf`` (no allowed key) give zeros.
    """
    m = scores.max(axis=-1, keepdims=True)  # (l, 1)
    m[~np.isfinite(m)] = 0.0  # fully masked rows: exp(-inf - 0) = 0
    scores -= m
    np.exp(scores, out=scores)  # unnormalised weights, each <= 1
    both = scores @ v1  # (l, Ev + 1): [sum_j e_j v_j, sum_j e_j]
    total = both[:, -1:]
    total[total == 0] = 1.0  # zero rows stay zero instead of 0/0
    np.divide(both[:, :-1], total, out=out)


def dense_attention(problem) -> np.ndarray:
    """Attention output for a checked ``AttentionProblem`` (no weights, no dropout)."""
    p = problem
    batch = p.out_shape[:-2]
    L, S = p.n_queries, p.n_keys
    Ev = p.v.shape[-1]
    if S == 0 or L == 0 or Ev == 0 or 0 in batch:
        # No keys: every row is fully masked, so the output is zeros.
        return np.zeros((*batch, L, Ev), dtype=p.out_dtype)
    out = np.empty((*batch, L, Ev), dtype=p.q.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        q = p.q * p.q.dtype.type(p.scale)  # scale the (L, E) queries, not the (L, S) scores
    q = np.broadcast_to(q, batch + q.shape[-2:])
    kt = np.swapaxes(np.broadcast_to(p.k, batch + p.k.shape[-2:]), -1, -2)  # (..., E, S)
    ones = np.ones((*p.v.shape[:-1], 1), dtype=p.v.dtype)
    v1 = np.concatenate([p.v, ones], axis=-1)  # (..., S, Ev + 1)
    v1 = np.broadcast_to(v1, (*batch, S, Ev + 1))
    starts = range(0, L, QUERY_BLOCK)
    extras = {}
    for r0 in starts:
        extra = p.additive(slice(r0, r0 + QUERY_BLOCK), slice(None))
        if extra is not None:
            extra = np.broadcast_to(extra, batch + extra.shape[-2:])
        extras[r0] = extra

    def block(task):
        idx, r0 = task
        rows = slice(r0, r0 + QUERY_BLOCK)
        with np.errstate(invalid="ignore", over="ignore"):  # per thread: errstate is thread-local
            scores = q[(*idx, rows)] @ kt[idx]  # (l, S), already scaled
            extra = extras[r0]
            if extra is not None:
                scores += extra[idx]
            softmax_rows_times(scores, v1[idx], out[(*idx, rows)])

    n_scores = int(np.prod(batch, dtype=np.int64)) * L * S
    run_blocks(block, [(idx, r0) for idx in np.ndindex(*batch) for r0 in starts], n_scores)
    return out.astype(p.out_dtype, copy=False)
