"""The checkers' engine: the float64 reference and the naive baseline, one (batch, head) at a time.

A check needs, for every query row, the float64 reference (output, log-sum-exp, and for the gradients the
backward) and the naive baseline in the kernel's dtype. Computed on whole (B, H, L, S) arrays that costs
memory growing with B * H * L * S and streams every elementwise step through it. Here the problem is cut
into *units*, one element of the output's batch (a batch entry and a query head, with its key/value head),
and the units run as tasks on the dense path's thread pool (`attention_ref._kernel.run_blocks`), a task
being a group of heads of one batch entry (one head for long sequences; for short ones as many as the
dense path's tasks take, `attention_ref._kernel.heads_per_task`, so that their steps run batched while
both cores have tasks, and at least `TASK_SCORES` scores), each task writing its own slice of the results:

- the reference runs in blocks of query rows (`attention_ref._kernel.block_rows`), each block visiting only
  the keys a causal mask or window lets it see (`AttentionProblem.key_range`), with the forward and the
  backward of a block done together: ``dq`` row by row, ``dk`` and ``dv`` accumulated over the blocks;
- the baseline runs the textbook steps of `._baseline` on the unit whole, so that every product it rounds
  has the shape it has in the whole-array computation and the baseline is the same, number for number
  (up to how BLAS, on one thread in the tasks, orders a product's sums: a last bit in a few elements);
  one forward serves ``dq``, ``dk``, ``dv``, ``dbias`` and ``dsinks`` alike.

A small problem (below `THREADED_SCORES` scores) runs as one task over every unit at once (the same steps,
batched), BLAS as configured: its baseline is the whole-array computation's, bit for bit. What falls outside
(non-finite input or scores, which the whole-array code handles as it always has) raises `NotTiled`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Any

import numpy as np

from .._kernel import PARALLEL_MIN, block_rows, heads_per_task, n_threads, one_blas_thread, run_blocks
from ..backward import broadcast_index, sum_to, tile_scores
from ._baseline import into, naive_extra, naive_forward_of

__all__: list[str] = []  # private module

#: (L, S) float32 arrays one unit of the naive backward holds at once, at most (the forward's scores,
#: weights and exact weights, dropout's factors, dP, dS and their roundings), for the memory estimate.
NAIVE_ARRAYS = 12
#: From this many scores on, a problem run as one task computes its reference with BLAS on one thread
#: (below, the limit costs more than the products).
ONE_THREAD_SCORES = 1 << 16
#: From this many scores on (all units together), a problem with several units runs them as tasks on the
#: threads: below, a task's steps cost more than the threads save.
THREADED_SCORES = 1 << 19
#: Scores a task computes at least (heads grouped up to them where the heads are short): below, a task's
#: steps and its hand-over to a thread cost more than running it beside another saves.
TASK_SCORES = 1 << 18
#: The share of the machine's memory a check may plan to hold at once.
MEMORY_SHARE = 0.5
#: Scores of a unit (or group of heads) from which a causal or windowed reference is cut into banded blocks
#: that skip the keys no query of theirs sees: below, the blocks' steps cost more than the skipped keys.
BANDED_SCORES = 1 << 19


class NotTiled(Exception):
    """A unit met something the tiles leave to the whole-array computation (a NaN or infinite score)."""


def machine_memory() -> int:
    """Bytes of physical memory (a large number where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return 1 << 40


def plan_threads(p, itemsize: int) -> int:
    """Threads for the units of `p` within `MEMORY_SHARE` of memory; a ValueError naming the size if not one fits."""
    unit = fits(p.n_queries, p.n_keys, 1, itemsize)
    return max(1, min(n_threads(), int(MEMORY_SHARE * machine_memory() // max(unit, 1))))


def fits(L: int, S: int, n_units: int, itemsize: int) -> int:
    """Bytes the check holds at once for `n_units` (batch, head) units of (L, S) scores; a ValueError, before
    any work, when that is more than `MEMORY_SHARE` of the machine's memory."""
    need = NAIVE_ARRAYS * n_units * L * S * max(itemsize, 4)
    if need > MEMORY_SHARE * machine_memory():
        what = "one (batch, head)" if n_units == 1 else f"its {n_units} (batch, head) pairs"
        raise ValueError(
            f"the check of (L, S) = ({L}, {S}) cannot run: {what} of its reference and baseline need about "
            f"{need / 2**30:.3g} GiB at once (the (L, S) scores and weights), more than half of this machine's "
            f"{machine_memory() / 2**30:.3g} GiB; check shorter sequences"
        )
    return need


def unit_problem(p, idx):
    """The problem `p` restricted to the unit `idx` of its output's batch (all of it when `idx` is None).

    `idx` indexes every batch axis; its last entry may be a slice (a group of heads, see `units`)."""
    if idx is None:
        return p

    def at(arr):
        return None if arr is None else arr[broadcast_index(idx, arr.shape[:-2])]

    batch = p.out_shape[:-2]
    heads = tuple(len(range(n)[i]) for i, n in zip(idx, batch, strict=True) if isinstance(i, slice))
    sinks = None if p.sinks is None else p.sinks[broadcast_index(idx, p.sinks.shape)]
    return dataclasses.replace(p, q=at(p.q), k=at(p.k), v=at(p.v), mask=at(p.mask), bias=at(p.bias),
                               alibi_slopes=at(p.alibi_slopes), sinks=sinks, dropout_mask=at(p.dropout_mask),
                               out_shape=heads + p.out_shape[-2:])


def shared_extra(p, dtype):
    """The baseline's rounded additive term when every unit has the same one (else False: each computes its own)."""
    if p.alibi_slopes is not None:
        return False
    if any(a is not None and int(np.prod(a.shape[:-2])) != 1 for a in (p.mask, p.bias)):
        return False
    extra = naive_extra(p, dtype)
    return None if extra is None else extra.reshape(extra.shape[-2:])


@dataclasses.dataclass
class Reference:
    """The float64 reference of one unit (or all): output, log-sum-exp, largest score, and gradients."""

    out: Any  # ndarray, or None when not asked for (and likewise below)
    lse: np.ndarray
    magnitude: float
    dq: Any = None
    dk: Any = None
    dv: Any = None
    dsinks: Any = None


def reference(u, dout=None, *, out=True, magnitude=False, dbias=None, whole_batch=False) -> Reference:
    """`reference_blocks`, with BLAS on one thread for the `whole_batch` of a small problem run as one task
    (`run` limits BLAS for units) that has `ONE_THREAD_SCORES` scores or more."""
    if not whole_batch or int(np.prod(u.out_shape[:-2])) * u.n_queries * u.n_keys < ONE_THREAD_SCORES:
        return reference_blocks(u, dout, out=out, magnitude=magnitude, dbias=dbias)
    with one_blas_thread() or contextlib.nullcontext():
        return reference_blocks(u, dout, out=out, magnitude=magnitude, dbias=dbias)


def reference_blocks(u, dout=None, *, out=True, magnitude=False, dbias=None) -> Reference:
    """The float64 reference of problem `u` (one unit, or a batch), by blocks of query rows.

    With `dout` the backward too: ``dq`` (per expanded head), ``dk`` and ``dv`` (per query head, before
    the group sums), ``dsinks`` per batch element; `dbias` is called as ``dbias(rows, cols, dx)`` with
    each block's bias gradient. `magnitude`: also the largest finite score magnitude (else 0), with a soft
    cap the larger of the scores' before and after it (a kernel rounds the score before the cap).
    Raises `NotTiled` on a NaN or infinite row maximum.
    """
    batch = u.out_shape[:-2]
    L, S, E, Ev = u.n_queries, u.n_keys, u.q.shape[-1], u.v.shape[-1]
    q, k, v = (np.broadcast_to(a, batch + a.shape[-2:]) for a in (u.q, u.k, u.v))
    sinks = None if u.sinks is None else np.broadcast_to(u.sinks, batch)[..., None]  # (..., 1)
    keep = u.keep((*batch, L, S)) if u.has_dropout else None
    inside = dataclasses.replace(u, window=None)  # blocks wholly inside the window need no band
    grads = dout is not None
    # every block writes its rows of the output, log-sum-exp and dq (np.empty: no pass zeroing them first);
    # dk and dv are sums over the blocks
    result = Reference(np.empty((*batch, L, Ev)) if out or grads else None, np.empty((*batch, L)), 0.0)
    if grads:
        result.dq = np.empty((*batch, L, E))
        result.dk, result.dv = (np.zeros(batch + shape) for shape in ((S, E), (S, Ev)))
        result.dsinks = None if sinks is None else np.zeros(batch)
    banded = u.window is not None and int(np.prod(batch)) * L * S > BANDED_SCORES
    block = block_rows(L, S, 8, threads=1, banded=banded)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for r0 in range(0, L, block):
            rows = slice(r0, min(L, r0 + block))
            cols = slice(*u.key_range(rows))
            extra = (inside if u.inside_window(rows, cols) else u).additive(rows, cols)
            raw: list[float] = []  # with a cap and `magnitude`: the largest score before it, where kernels round
            x, capped = tile_scores(q[..., rows, :], k[..., cols, :], u.scale, u.softcap,
                                    raw if magnitude else None, extra)  # (..., l, s)
            if extra is not None:  # into the block's own scores where the sum has their shape
                x = into(np.add, x, extra)
            top = x.max(axis=-1, initial=-np.inf)  # (..., l)
            if magnitude:
                result.magnitude = max(result.magnitude, largest_finite(x, top), *raw)
            if sinks is not None:
                top = np.maximum(top, sinks)
            if not np.all(top < np.inf):  # NaN or +inf: the whole-array computation's business
                raise NotTiled
            shift = np.where(top > -np.inf, top, 0.0)
            x -= shift[..., None]
            weights = np.exp(x, out=x)
            total = weights.sum(axis=-1)
            if sinks is not None:
                sink_e = np.exp(sinks - shift)
                total += sink_e
            safe = np.where(total > 0, total, 1.0)
            result.lse[..., rows] = np.where(total > 0, shift + np.log(safe), -np.inf)
            if not (out or grads):
                continue  # the log-sum-exp is all that was asked for
            weights /= safe[..., None]
            dropped = weights if keep is None else weights * keep[..., rows, cols] / (1.0 - u.dropout_p)
            o = np.matmul(dropped, v[..., cols, :], out=result.out[..., rows, :])
            if not grads:
                continue
            do = dout[..., rows, :]
            delta = np.einsum("...le,...le->...l", do, o)  # D = rowsum(dO * O)
            dp = do @ np.swapaxes(v[..., cols, :], -1, -2)
            if keep is not None:
                dp *= keep[..., rows, cols] / (1.0 - u.dropout_p)
            dp -= delta[..., None]
            dx = np.multiply(weights, dp, out=dp)  # dS = P * (dP - D): the bias's gradient
            draw = dx if capped is None else dx * (1.0 - capped * capped)
            result.dq[..., rows, :] = (draw @ k[..., cols, :]) * u.scale
            result.dk[..., cols, :] += (np.swapaxes(draw, -1, -2) @ q[..., rows, :]) * u.scale
            result.dv[..., cols, :] += np.swapaxes(dropped, -1, -2) @ do
            if dbias is not None:
                dbias(rows, cols, dx)
            if sinks is not None:
                result.dsinks -= np.sum(sink_e / safe * delta, axis=-1)
    return result


def largest_finite(x: np.ndarray, top: np.ndarray) -> float:
    """``max |x|`` over the finite entries of `x` (0 without any), given its row maxima `top`.

    By reductions: the largest entry is the largest finite row maximum, the smallest one the minimum, over
    the entries above ``-inf`` (masked) where there are such. (NaN and ``+inf`` leave the tiles anyway.)"""
    lo = float(x.min(initial=np.inf))
    if lo == -np.inf:
        lo = float(np.min(x, where=x > -np.inf, initial=np.inf))
    hi = float(np.max(top, where=np.isfinite(top), initial=-np.inf))
    return max(0.0, hi, -lo)


def add_bias_grad(target: np.ndarray, idx, rows: slice, cols: slice, dx: np.ndarray, lock) -> None:
    """Add a block's bias gradient `dx` of unit `idx` (None: every unit) into `target`, the bias's shape."""
    r = rows if target.shape[-2] != 1 else slice(None)
    c = cols if target.shape[-1] != 1 else slice(None)
    lead = () if idx is None else broadcast_index(idx, target.shape[:-2])
    where: tuple = (*lead, Ellipsis, r, c)
    with lock:  # units may share a bias
        view = target[where]
        view += sum_to(dx, view.shape)


def units(p, progress: bool = False):
    """``(tasks, threads, done)``: the tasks of `p`, the threads to use, and a function each task calls with
    its number of units when finished (advancing a progress bar when asked and tqdm is there).

    A small problem is one None task (every unit at once); else a task is a group of heads (the last batch
    axis, a slice) at one index of the other batch axes, as many heads as `attention_ref._kernel.heads_per_task`
    puts in one of the dense path's tasks: one head for long sequences, more for short ones, so that their
    steps run batched while every thread still has tasks to take; and at least `TASK_SCORES` scores."""
    batch = p.out_shape[:-2]
    n_units = int(np.prod(batch))
    threads = plan_threads(p, 4)  # the baseline works in float32 (a float64 check runs on whole arrays)
    if n_units < 2 or n_units * p.n_queries * p.n_keys < THREADED_SCORES:
        return [None], threads, progress_bar(1, progress)
    outer, n_heads = batch[:-1], batch[-1]
    n_outer = int(np.prod(outer))
    group = heads_per_task(n_heads, p.n_queries * p.n_keys * 8, n_outer, threads)
    group = min(n_heads, max(group, -(-TASK_SCORES // (p.n_queries * p.n_keys))))  # worth a task's steps
    tasks = [(*o, slice(h, min(n_heads, h + group))) for o in np.ndindex(*outer) for h in range(0, n_heads, group)]
    return tasks, threads, progress_bar(n_units, progress)


def progress_bar(total: int, progress: bool):
    """A function to call with the units each task finished (`total` in all): a tqdm bar's update when asked
    and installed, else nothing."""
    if not progress or total < 2:
        return lambda n: None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return lambda n: None
    bar = tqdm(total=total, desc="checking", unit="head", leave=False)
    lock = threading.Lock()
    count = [0]

    def done(n):
        with lock:
            bar.update(n)
            count[0] += n
            if count[0] == total:
                bar.close()

    return done


def run(tasks, threads: int, fn, done) -> None:
    """Run ``fn(task)`` for every task on the dense path's threads; `NotTiled` from any task propagates.

    With units (groups of heads) BLAS runs on one thread meanwhile, also when they run one after the other:
    the tiles' products are small, and a multi-threaded BLAS spends more on waking its threads (and, on a
    busy machine, on waiting for them) than the products take. One task (a small problem, every unit at
    once) runs as the whole-array computation did, BLAS as configured."""
    def task(idx):
        fn(idx)
        done(1 if idx is None else idx[-1].stop - idx[-1].start)

    if tasks == [None]:
        task(None)
        return
    with one_blas_thread() or contextlib.nullcontext():  # also for one group of heads (one thread asked for)
        run_blocks(task, tasks, PARALLEL_MIN, threads=threads)


def naive_forward(u, dtype, fused, intermediate, extra, lse_only=False):
    """The baseline's ``(out, lse)`` of unit `u` (`._baseline.naive_forward_of`); with `lse_only` ``out``
    is None (the steps stop at the log-sum-exp)."""
    _, _, _, _, out, lse, _, _ = naive_forward_of(u, dtype, intermediate, fused, extra=extra, lse_only=lse_only,
                                          keep_exact=False)
    return out, lse


def at(idx):
    """The index of unit `idx` into a full-batch array (everything for None)."""
    return (Ellipsis,) if idx is None else idx
