"""`assert_paged_attention_close`: a paged-cache kernel checked by the rule, one sequence at a time."""

from __future__ import annotations

import numpy as np

from .._interop import to_numpy
from .._kernel import PARALLEL_MIN, run_blocks
from ..paged import gather_pages, prepare_paged
from ..varlen import sequence_options
from ._checks import output_failure
from ._problem import Problem
from ._tiles import THREADED_SCORES

__all__ = ["assert_paged_attention_close"]


def assert_paged_attention_close(actual, q, k_pages, v_pages, block_table, kv_lens, *, layout="HND",
                                 cu_seqlens_q=None, factor=2.0, atol=None, dtype=None, empty_rows="zeros",
                                 baseline="fused", progress=False, **options):
    r"""Assert that a paged-cache kernel's output is as accurate as its dtype allows.

    The check of `assert_attention_close`, applied to each sequence of a
    batch whose keys and values sit in a paged cache, as
    `attention_ref.paged_attention` reads them: the reference and the
    naive baseline are those of each sequence's gathered keys and values.

    Parameters
    ----------
    actual : array_like, shape (B, Hq, Lq, Ev), or (Hq, total_q, Ev) with `cu_seqlens_q`
        The kernel's output, in `q`'s layout (any array `to_numpy` reads).
    q : array_like, shape (B, Hq, Lq, E), or (Hq, total_q, E) with `cu_seqlens_q`
        Queries, as given to the kernel.
    k_pages : array_like, shape (num_pages, Hkv, page_size, E) or (num_pages, page_size, Hkv, E)
        The pool of key pages, in the `layout` given (fp8 with ``k_descale``).
    v_pages : array_like, shape (num_pages, Hkv, page_size, Ev) or (num_pages, page_size, Hkv, Ev)
        The pool of value pages, in the same layout.
    block_table : array_like of int, shape (B, max_pages)
        The pages of each sequence, in order; entries past a sequence's
        length are ignored.
    kv_lens : array_like of int, shape (B,)
        How many keys each sequence has.
    layout : {"HND", "NHD"}, optional
        ``"HND"``: heads before positions in a page (FlashInfer's default);
        ``"NHD"``: positions before heads (vLLM, FlashInfer's other).
    cu_seqlens_q : array_like of int, shape (B + 1,), optional
        Cumulative query offsets of packed queries.
    factor, atol, dtype, empty_rows, baseline, progress
        As `assert_attention_close`, for each sequence.
    **options
        The options of `attention_ref.paged_attention` (``is_causal``,
        usually with ``causal_alignment="bottom-right"``, ``window``,
        ``softcap``, ``alibi_slopes``, ``sinks``, ``scale``, ``enable_gqa``,
        the descales as (B, Hkv) arrays, one row per sequence).

    Returns
    -------
    None
        Returns quietly when every sequence's output is close enough.

    Raises
    ------
    AssertionError
        If some sequence's output is too far from its reference: one report
        of `assert_attention_close` per failing sequence, each naming it,
        counted from 0 (``sequence 3: ...``).
    TypeError
        As `attention_ref.paged_attention` and `assert_attention_close`.
    ValueError
        If `layout` is not ``"HND"`` or ``"NHD"``, if `actual` does not have
        the shape of the output, or as `attention_ref.paged_attention` and
        `assert_attention_close`.

    See Also
    --------
    attention_ref.paged_attention : The reference this check uses.
    assert_attention_close : The rule, for one dense call.

    Examples
    --------
    Two sequences of 5 and 2 cached keys in pages of 4 positions, one
    decoding query each, checked against `paged_attention` in float16; a
    kernel that reads one position too many of sequence 1 fails there:

    >>> import numpy as np
    >>> from attention_ref import paged_attention
    >>> from attention_ref.testing import assert_paged_attention_close
    >>> rng = np.random.default_rng(0)
    >>> k_pages, v_pages = rng.standard_normal((2, 3, 2, 4, 8)).astype(np.float16)
    >>> q = rng.standard_normal((2, 2, 1, 8)).astype(np.float16)
    >>> table = np.array([[2, 0], [1, 0]])
    >>> out = paged_attention(q, k_pages, v_pages, table, [5, 2])
    >>> assert_paged_attention_close(out, q, k_pages, v_pages, table, [5, 2])
    >>> wrong = paged_attention(q, k_pages, v_pages, table, [5, 3])
    >>> assert_paged_attention_close(wrong, q, k_pages, v_pages, table, [5, 2])
    Traceback (most recent call last):
    ...
    AssertionError: sequence 1: 16 of 16 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000746 + 0.000385 = 0.00188
    largest error 1.2 at index (0, 0, 6): actual -0.438477, reference 0.76179, baseline's error there 7.1e-05
    ratio to the baseline's largest error: 1.61e+03
    where they are:
    head 0: row 0 (8 elements)
    head 1: row 0 (8 elements)
    """
    q, k_pages, v_pages, rows, used, lens, options = prepare_paged(
        q, k_pages, v_pages, block_table, kv_lens, layout, cu_seqlens_q, options, "assert_paged_attention_close")
    actual = to_numpy(actual, "actual")
    want = (*q.shape[:-1], v_pages.shape[-1])
    if actual.shape != want:
        raise ValueError(f"actual must have the shape of the output, {want} (q's layout with Ev last); "
                         f"got {actual.shape}")
    failures: list = [None] * len(rows)  # each sequence's report, or the exception its check raised

    def check_sequence(b):
        index, length = rows[b], int(lens[b])
        try:
            k_b, v_b = gather_pages(k_pages, used[b], length), gather_pages(v_pages, used[b], length)
            check = Problem(q[index], k_b, v_b, sequence_options(options, b), "assert_paged_attention_close")
            failures[b] = output_failure(actual[index], check, factor=factor, atol=atol, dtype=dtype,
                                         empty_rows=empty_rows, baseline=baseline, what=f"sequence {b}: ",
                                         progress=progress)
        except Exception as exc:  # raised below, the first sequence's first, whatever the threads' order
            failures[b] = exc

    # Sequences too small to be split into tasks (under `THREADED_SCORES` scores each) run side by side on the
    # threads, when together they reach that many; else one after the other, each check as it plans.
    if len(rows) > 1 and not progress:
        heads = int(np.prod(actual.shape[:-2])) // len(rows) if cu_seqlens_q is None else actual.shape[0]
        scores = [heads * q[index].shape[-2] * int(length) for index, length in zip(rows, lens, strict=True)]
        side_by_side = max(scores) < THREADED_SCORES <= sum(scores)
        run_blocks(check_sequence, range(len(rows)), PARALLEL_MIN if side_by_side else 0)
    else:
        for b in range(len(rows)):
            check_sequence(b)
    for found in failures:
        if isinstance(found, Exception):
            raise found
    reports = [f for f in failures if f]
    if reports:
        raise AssertionError("\n".join(reports))
