"""The fast exact kernel behind the dense attention path.

It computes exactly what the textbook formula computes, row by row, but in
blocks of queries so that the (block, S) slice of scores stays in cache, with
every step done in place, and the softmax normalisation applied to the
(block, Ev) output instead of the (block, S) weights. Where a Cauchy-Schwarz
bound proves that ``exp(score)`` cannot overflow, the row maximum is not
subtracted at all (the softmax does not depend on the shift). Blocks are
independent, so they run on a small thread pool: NumPy releases the GIL inside
matmul and ufuncs. A small call runs as one block of every head at once
(`_one_task`), the same step without the tasks' bookkeeping.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__: list[str] = []  # private module

#: Most queries per block, and the most bytes one block's (rows, S) scores may take.
MAX_BLOCK_ROWS = 512
BLOCK_BYTES = 4 << 20
MIN_BLOCK_ROWS = 64
#: Query blocks a banded problem (causal mask or window) is split into at least, so that the
#: blocks' key ranges follow the band closely: at 8 blocks a causal call computes 56 % of the scores.
BANDED_BLOCKS = 8
#: Below this much work (score entries computed plus key and value entries read) threads cost more than they save.
PARALLEL_MIN = 1 << 20
#: Below this many score entries the dense kernel subtracts the row maximum rather than bounding the scores.
_BOUND_MIN = 1 << 14

_pool: ThreadPoolExecutor | None = None
_blas_controller = None


def one_blas_thread():
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


@functools.cache
def _cpu_count() -> int:
    """``os.cpu_count()``, read once: it costs about 0.1 ms a call on some machines (a tiny call takes less)."""
    return os.cpu_count() or 1


def n_threads() -> int:
    """Worker threads to use: ``ATTENTION_REF_NUM_THREADS`` if set, else one per core."""
    value = os.environ.get("ATTENTION_REF_NUM_THREADS", "").strip()
    if not value:
        return _cpu_count()
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"ATTENTION_REF_NUM_THREADS must be a positive integer; got {value!r}")
    return n


def _get_pool(n: int) -> ThreadPoolExecutor | None:
    """A process-wide pool with `n` workers (None for one thread)."""
    global _pool
    if n < 2:
        return None
    if _pool is None or _pool._max_workers != n:
        _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="attention_ref")
    return _pool


def run_blocks(fn, tasks, work: int, threads: int | None = None) -> None:
    """Call ``fn(task)`` for every task, on the thread pool when there is enough work.

    The tasks must be independent (they write disjoint parts of an output).
    ``work`` counts the entries the whole call computes or reads (score
    entries, and for the dense kernel key and value entries); below
    ``PARALLEL_MIN`` threads cost more than they save. `threads` defaults to
    `n_threads`. NumPy's error state is thread-local, so `fn` must set its
    own ``np.errstate``.
    """
    tasks = list(tasks)
    threads = n_threads() if threads is None else threads  # checks ATTENTION_REF_NUM_THREADS
    pool = _get_pool(threads) if threads > 1 and len(tasks) > 1 and work >= PARALLEL_MIN else None
    limit = one_blas_thread() if pool is not None else None
    if pool is None or limit is None:
        for task in tasks:
            fn(task)
        return
    # Every thread (the caller's included) takes the next task from a shared
    # queue until none is left, so a thread slowed by the machine's other load
    # simply does fewer of them; a future per task would cost ~25 us each.
    queue = iter(tasks)
    lock = threading.Lock()
    failed = threading.Event()  # after an exception the other threads stop taking tasks

    def worker():
        while not failed.is_set():
            with lock:
                task = next(queue, None)
            if task is None:
                return
            try:
                fn(task)
            except BaseException:
                failed.set()
                raise

    with limit:  # held until every helper has finished, also when one raised
        helpers = [pool.submit(worker) for _ in range(min(threads, len(tasks)) - 1)]
        try:
            worker()
        finally:
            wait(helpers)
        for helper in helpers:
            helper.result()  # re-raises a helper's exception here


def softmax_rows_times(scores, v, out, shift=True, sink=None) -> None:
    """Write ``softmax(scores, axis=-1) @ v`` into `out`, overwriting
    `scores`.

    ``scores`` (l, S) holds scaled scores with any additive terms already
    added, ``v`` is (S, Ev) and ``out`` (l, Ev). Rows whose maximum is
    ``-inf`` (no allowed key) give zeros. The weights are normalised after
    the product, on the (l, Ev) output instead of the (l, S) weights.
    A `sink` (a scalar logit) adds ``exp(sink)`` to every row's
    denominator: one more key with a zero value.

    With ``shift=False`` the row maximum is not subtracted before ``exp``;
    the caller has bounded ``|scores|`` by `exp_limit`. The softmax is
    unchanged, since ``exp(s - m) / sum exp(s - m) = exp(s) / sum exp(s)``,
    and two passes over the scores are saved. The unnormalised sums can
    overflow when ``v`` comes within a factor of about ``S`` of the largest
    float (see `scaled_down_values`).
    """
    m = 0.0
    if shift:
        m = scores.max(axis=-1, keepdims=True)  # (l, 1)
        if sink is not None:
            # the sink is one more term of the row
            np.maximum(m, sink, out=m)
        m[~np.isfinite(m)] = 0.0  # fully masked rows: exp(-inf - 0) = 0
        scores -= m
    np.exp(scores, out=scores)  # unnormalised weights
    total = scores.sum(axis=-1, keepdims=True)  # (l, 1): sum_j e_j
    if sink is not None:
        total += np.exp(sink - m)
    np.matmul(scores, v, out=out)  # (l, Ev): sum_j e_j v_j
    # zero rows stay as they are instead of 0/0
    np.divide(out, total, out=out, where=total != 0)


def scaled_down_values(v, n_keys: int):
    """``(v * 2**-e, e)`` with ``2**e >= 2 * n_keys``, for recomputing attention whose sums overflowed.

    Both kernels normalise after summing ``e_j v_j`` over the keys, with
    weights ``e_j <= 1`` once the row maximum is subtracted, so the sums reach
    ``n_keys * max|v|``. With the values scaled down they stay below
    ``max|v| / 2``; scaling by a power of two is exact, so the result
    multiplied back by ``2**e`` (``np.ldexp``) is the attention of `v`.
    """
    e = int(np.ceil(np.log2(2 * max(n_keys, 1))))
    return np.ldexp(v, -e), e


def exp_limit(dtype) -> float:
    """Largest ``|score|`` for which `softmax_rows_times` may skip the max shift.

    A quarter of ``log(finfo.max)``: 22.2 in float32, 177 in float64. With
    every allowed score in ``[-limit, limit]`` the largest weight
    ``exp(s)`` is at least ``exp(-limit)``, so the row cannot underflow to
    zero, and the weights that do underflow are below ``exp(-3 * limit)`` of
    it, far under the rounding error. The sums cannot overflow unless ``v``
    is within a factor ``S * exp(limit)`` of ``finfo.max``; the dense kernel
    checks its output and recomputes a block with `scaled_down_values` if
    they did.
    """
    return _exp_limit(np.dtype(dtype))


@functools.cache
def _exp_limit(dtype: np.dtype) -> float:
    return float(np.log(np.finfo(dtype).max)) / 4


def block_rows(
    n_rows: int, n_keys: int, itemsize: int, n_batch: int = 1, threads: int | None = None, banded: bool = False
) -> int:
    """Query rows per block: a power of two with (rows, n_keys) scores within `BLOCK_BYTES`.

    Between `MIN_BLOCK_ROWS` and `MAX_BLOCK_ROWS` (the largest that helps the
    matrix products), and halved while there would be fewer than two blocks
    per thread (`threads`, default `n_threads`), so that small problems still
    use every core. A `banded` problem (causal mask or window) is split into
    at least `BANDED_BLOCKS` blocks, each visiting only the keys it may see.
    """
    threads = n_threads() if threads is None else threads
    rows = MAX_BLOCK_ROWS
    while rows > MIN_BLOCK_ROWS and rows * n_keys * itemsize > BLOCK_BYTES:
        rows //= 2
    while rows > MIN_BLOCK_ROWS and n_batch * -(-n_rows // rows) < 2 * threads:
        rows //= 2
    while banded and rows > MIN_BLOCK_ROWS and -(-n_rows // rows) < BANDED_BLOCKS:
        rows //= 2
    return rows


def heads_per_task(n_heads: int, block_bytes: int, n_other: int, threads: int) -> int:
    """Heads (last batch axis) one task computes together: as many as fit `BLOCK_BYTES` of scores.

    Small problems then run as one batched product instead of one Python
    step per head. With several `threads` the group is halved while there
    would be fewer than two tasks per thread (`n_other` tasks per group
    come from the query blocks and the other batch axes).
    """
    group = max(1, min(n_heads, BLOCK_BYTES // max(block_bytes, 1)))
    while threads > 1 and group > 1 and -(-n_heads // group) * n_other < 2 * threads:
        group = -(-group // 2)
    return group


def _full_batch(arr: np.ndarray, batch: tuple[int, ...], broadcast: bool = True) -> np.ndarray:
    """`arr` (..., m, n) as a view with exactly the batch axes `batch` (no copy; no call when it has them).

    With ``broadcast=False`` the missing leading axes get size one instead: a
    cheaper view, for a caller that takes every batch index at once and lets
    the arithmetic broadcast.
    """
    if arr.shape[:-2] == batch:
        return arr
    if not broadcast:
        return arr.reshape((1,) * (len(batch) + 2 - arr.ndim) + arr.shape)
    return np.broadcast_to(arr, batch + arr.shape[-2:])


def _edges(p, rows: slice, keys: slice) -> list[slice]:
    """The parts of `keys` that need the additive term for the query `rows`, as slices relative to `keys`.

    With only a window (or causal mask) the keys every query of the block
    may see need none: the term is built and added for the band's edges only.
    """
    if p.mask is not None or p.bias is not None:
        return [slice(0, keys.stop - keys.start)]
    start, stop = p.inside_keys(rows)
    start, stop = max(start, keys.start), min(stop, keys.stop)
    if start >= stop:
        return [slice(0, keys.stop - keys.start)]
    return [s for s in (slice(0, start - keys.start), slice(stop - keys.start, keys.stop - keys.start))
            if s.stop > s.start]


@dataclass(slots=True)
class _Call:
    """What every block of one `dense_attention` call reads, and the output it writes."""

    p: Any  # the AttentionProblem
    batch: tuple[int, ...]  # batch axes of the output
    q: np.ndarray  # (..., L, E) with every batch axis (broadcast views)
    k: np.ndarray  # (..., S, E)
    v: np.ndarray  # (..., S, Ev)
    out: np.ndarray  # (..., L, Ev) in the working dtype
    scale: np.floating  # in the working dtype
    limit: float  # the |score| bound under which exp needs no shift (see exp_limit); -1: always shift
    slopes: np.ndarray | None  # (...): the ALiBi slope of every batch index
    sinks: np.ndarray | None  # (...): the sink logit of every batch index


def _block_extras(c: _Call, rows: slice, broadcast: bool = True) -> tuple[slice, list, np.ndarray | None]:
    """``(keys, [(key part, additive term)], ALiBi distances)`` of the queries `rows` (clipped to L).

    ``keys`` are the keys some query of `rows` may see under the window; the
    terms (mask, window, bias) cover only the key parts that need one, with
    every batch axis (`_full_batch`, `broadcast` as there).
    """
    p = c.p
    keys = slice(*p.key_range(rows))
    terms = []
    if p.mask is not None or p.bias is not None or p.window is not None:
        for part in _edges(p, rows, keys):
            cols = slice(keys.start + part.start, keys.start + part.stop)
            term = p.additive(rows, cols, alibi=False)  # (..., l, part)
            terms.append((part, _full_batch(term, c.batch, broadcast)))
    distances = None if c.slopes is None else p.alibi_distances(rows, keys)  # (l, s)
    return keys, terms, distances


def _key_norm(k: np.ndarray):
    """``max_j |k_j|`` over every key of every batch index of `k` (..., S, E)."""
    return np.sqrt(np.einsum("...se,...se->...s", k, k).max())


def _needs_shift(c: _Call, q_block: np.ndarray, key_norm) -> bool:
    """Whether a block must subtract its row maxima: unless every ``|score|`` is provably within ``c.limit``.

    Cauchy-Schwarz: ``|q_i . k_j| <= |q_i| max_j |k_j|`` (`key_norm()` gives the
    second factor); a soft cap ``c`` bounds every score by ``c``.
    """
    if c.limit <= 0:
        return True
    if c.p.softcap is not None:
        bound = c.p.softcap  # |c tanh(x / c)| <= c
    else:
        bound = np.sqrt(np.einsum("...le,...le->...l", q_block, q_block).max()) * key_norm()
    return not bound <= c.limit  # NaN compares False: shifted path


def _attend(c: _Call, idx: tuple, rows: slice, extras, scratch: np.ndarray | None, key_norm) -> None:
    """Write the attention of the queries `rows` of the batch entries `idx` into ``c.out[(*idx, rows)]``.

    The step of every block, on one thread: `extras` is `_block_extras` of
    `rows`, `scratch` a flat buffer holding at least the block's scores (or
    None: the product makes its own), `key_norm()` ``max_j |k_j|`` over the
    heads `idx`.
    """
    target = c.out[(*idx, rows)]  # (g, l, Ev), or (l, Ev) without batch axes
    keys, terms, distances = extras
    n_keys = keys.stop - keys.start
    if n_keys == 0:
        target[...] = 0.0  # the window hides every key from these queries
        return
    sink = None if c.sinks is None else np.asarray(c.sinks[idx])[..., None, None]
    k_idx, v_idx = c.k[(*idx, keys)], c.v[(*idx, keys)]  # (g, s, E), (g, s, Ev)
    with np.errstate(invalid="ignore", over="ignore"):  # per thread: errstate is thread-local
        # (g, l, E): scale the queries, not the (l, S) scores; C order whatever the input's, so that the products
        # see the same layout whether a block holds one head or all of them
        q_block = np.multiply(c.q[(*idx, rows)], c.scale, order="C")
        shift = _needs_shift(c, q_block, key_norm)
        for redo in (False, True):
            buffer = None if scratch is None else scratch[: target.size // target.shape[-1] * n_keys].reshape(
                *target.shape[:-1], n_keys)
            scores = np.matmul(q_block, k_idx.swapaxes(-1, -2), out=buffer)  # (g, l, s)
            c.p.cap(scores)
            for part, term in terms:
                scores[..., part] += term[idx]
            if c.slopes is not None and distances is not None:  # both or neither (_block_extras)
                scores -= c.slopes[idx][..., None, None] * distances  # ALiBi: -m_h |p_i - j|
            if not redo:
                softmax_rows_times(scores, v_idx, target, shift=shift, sink=sink)
                if np.isfinite(target).all():
                    break  # else a sum overflowed (or the input is not finite): redo the block
            else:
                v_small, e = scaled_down_values(v_idx, c.p.n_keys)
                softmax_rows_times(scores, v_small, target, sink=sink)
                np.ldexp(target, e, out=target)


def _call(p, batch: tuple[int, ...], n_batch: int) -> _Call:
    """The `_Call` of a checked problem with output batch axes `batch` (`n_batch` entries, none empty)."""
    dtype = p.q.dtype
    q, k, v = _full_batch(p.q, batch), _full_batch(p.k, batch), _full_batch(p.v, batch)  # (..., L|S, E|Ev)
    slopes = None if p.alibi_slopes is None else np.broadcast_to(p.alibi_slopes[..., 0, 0], batch)
    sinks = None if p.sinks is None else np.broadcast_to(p.sinks, batch)
    # Cauchy-Schwarz: |q_i . k_j| <= |q_i| max_j |k_j|. Where that bound (or the soft cap, which bounds
    # every score) is below exp_limit, exp(score) is safe without subtracting the row maximum. Masks add
    # 0 or -inf and keep the bound; a float bias or ALiBi term does not, nor does a large sink. The key
    # norms read all of k (S E per head), the shift two passes over the scores (2 L S): with fewer than
    # E / 2 queries (decoding) the shift is the cheaper of the two.
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    limit = exp_limit(dtype) if p.bias is None and slopes is None else -1.0
    if p.softcap is None and (2 * L < E or n_batch * L * S < _BOUND_MIN):
        limit = -1.0  # the bound's few calls cost more than the passes they save in a tiny call
    if sinks is not None and not np.abs(sinks).max(initial=0.0) <= limit:
        limit = -1.0
    out = np.empty((*batch, L, v.shape[-1]), dtype=dtype)
    return _Call(p, batch, q, k, v, out, dtype.type(p.scale), limit, slopes, sinks)


def _one_task(c: _Call, all_heads_at_once: bool, n_outer: int, serial: bool) -> bool:
    """Whether the whole problem can run as one block: the same arithmetic as the tasks, without their machinery.

    True when the plan is a single task (one query block of every head,
    `all_heads_at_once`, at the one index of the outer batch axes), or `serial` tasks that
    differ only in the outer batch index and always subtract the row
    maximum, whose scores together fit `BLOCK_BYTES`. (A block whose sums
    overflowed is redone with the values scaled by a power of two, which
    gives its other entries the same bits only when it was shifted already.)
    """
    if not all_heads_at_once:
        return False
    if n_outer == 1:
        return True
    same_shift = c.limit <= 0  # else the bound or the soft cap may leave a block unshifted
    return serial and same_shift and c.out.size // c.out.shape[-1] * c.p.n_keys * c.out.itemsize <= BLOCK_BYTES


def dense_attention(problem) -> np.ndarray:
    """Attention output for a checked ``AttentionProblem`` (no weights, no dropout)."""
    p = problem
    batch = p.out_shape[:-2]
    L, S = p.n_queries, p.n_keys
    E, Ev = p.q.shape[-1], p.v.shape[-1]
    if S == 0 or L == 0 or Ev == 0 or 0 in batch:
        # No keys: every row is fully masked, so the output is zeros.
        return np.zeros((*batch, L, Ev), dtype=p.out_dtype)
    threads = n_threads()  # checks ATTENTION_REF_NUM_THREADS on every call
    n_batch = math.prod(batch)
    c = _call(p, batch, n_batch)
    itemsize = c.out.itemsize
    rows_per_block = block_rows(L, S, itemsize, n_batch, threads, banded=p.window is not None)
    n_row_blocks = -(-L // rows_per_block)
    # Tasks: one query block of a group of heads (the last batch axis). Small problems take all heads
    # in one batched product; large ones one head per task, as many tasks as keep the threads busy.
    n_heads, outer = (batch[-1], batch[:-1]) if batch else (1, ())
    n_outer = math.prod(outer)
    work = n_batch * S * (L + E + Ev)  # scores computed, keys and values read
    busy = threads if work >= PARALLEL_MIN else 1  # below it run_blocks takes the tasks in turn
    group = heads_per_task(n_heads, min(L, rows_per_block) * S * itemsize, n_row_blocks * n_outer, busy)
    if _one_task(c, n_row_blocks == 1 and group == n_heads, n_outer, busy == 1):
        whole = (slice(None),) * len(batch)
        extras = _block_extras(c, slice(0, L), broadcast=False)  # indexed by `whole`: no broadcast view needed
        _attend(c, whole, slice(0, L), extras, None, lambda: _key_norm(c.k))
    else:
        _attend_in_tasks(c, rows_per_block, outer, group, work, threads)
    return c.out.astype(p.out_dtype, copy=False)


def _attend_in_tasks(c: _Call, rows_per_block: int, outer: tuple[int, ...], group: int, work: int, threads: int):
    """Fill ``c.out`` task by task, on the thread pool when there is enough `work`.

    A task is one query block of `rows_per_block` rows of `group` heads (the
    last batch axis) at one index of the `outer` batch axes.
    """
    L, S = c.p.n_queries, c.p.n_keys
    n_heads = c.batch[-1] if c.batch else 1
    heads = range(0, n_heads, group)
    # The head groups of one query block run one after another, so that the
    # block's additive term (mask, window, bias) is built once, shared, and dropped
    # when its last group is done: O(threads * rows * S), not O(L * S). Only
    # the keys some query of the block may see under the window are used.
    outer_indices = list(itertools.product(*map(range, outer)))  # np.ndindex costs more for one index
    tasks = [(o, h0, r0) for r0 in range(0, L, rows_per_block) for o in outer_indices for h0 in heads]
    extras: dict = {}
    uses = dict.fromkeys(range(0, L, rows_per_block), 0)
    k_norms: dict = {}  # max_j |k_j| per task group, filled by whichever thread needs it first
    lock = threading.Lock()
    scratch = threading.local()  # one (group * rows_per_block * S) score buffer per thread

    def shared(r0, rows):
        """`_block_extras` of the query block at `r0`, built once and dropped after its last task."""
        entry = extras.get(r0)
        if entry is None:  # two threads may both build it: same value, no harm
            entry = extras[r0] = _block_extras(c, rows)
        with lock:
            uses[r0] += 1
            if uses[r0] == len(outer_indices) * len(heads):
                del extras[r0]
        return entry

    def block(task):
        outer_idx, h0, r0 = task
        idx = (*outer_idx, slice(h0, h0 + group)) if c.batch else ()
        rows = slice(r0, min(L, r0 + rows_per_block))

        def key_norm():
            if (outer_idx, h0) not in k_norms:
                k_norms[outer_idx, h0] = _key_norm(c.k[idx])
            return k_norms[outer_idx, h0]

        if not hasattr(scratch, "scores"):
            scratch.scores = np.empty(min(n_heads, group) * min(L, rows_per_block) * S, dtype=c.out.dtype)
        _attend(c, idx, rows, shared(r0, rows), scratch.scores, key_norm)

    run_blocks(block, tasks, work, threads)
