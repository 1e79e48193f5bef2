r"""Paged key/value caches: attention over keys stored in fixed-size pages named by a block table.

A serving engine keeps every sequence's keys and values in pages of
``page_size`` positions taken from one shared pool, and a block table lists
the pages of each sequence in order (vLLM's PagedAttention). `paged_attention`
computes what a kernel reading such a cache must compute, from a pool in either
of FlashInfer's layouts ("HND" or "NHD", vLLM's), fp8 pools included; the
converters turn FlashInfer's page lists into the block table used here, and an
"NHD" pool into "HND".
"""

from __future__ import annotations

import itertools

import numpy as np

from ._options import DESCALES
from ._validation import as_int_array, as_real_array, check_bool, check_choice, check_exact_ndim, check_int
from .varlen import attend_each, check_cu_seqlens, reject_per_pair_options

__all__ = ["block_table_from_indptr", "nhd_to_hnd", "paged_attention"]

#: The page layouts of a pool, as FlashInfer names them: the axes of the key pages (values end in Ev).
_LAYOUTS = {"HND": "(num_pages, Hkv, page_size, E)", "NHD": "(num_pages, page_size, Hkv, E)"}
#: The head axis of a pool in each layout (the page-size axis is the other one of axes 1 and 2).
_HEAD_AXIS = {"HND": 1, "NHD": 2}


def _check_pages(k_pages: np.ndarray, v_pages: np.ndarray, layout: str) -> None:
    """Raise ValueError unless `k_pages` and `v_pages` are 4-D and agree on pages, heads and page size."""
    check_exact_ndim(k_pages, "k_pages", 4, f"{_LAYOUTS[layout]} (layout={layout!r})")
    check_exact_ndim(v_pages, "v_pages", 4, f"{_LAYOUTS[layout][:-2]}Ev) (layout={layout!r})")
    heads = _HEAD_AXIS[layout]
    for axis, what in ((0, "number of pages"), (heads, "number of heads"), (3 - heads, "page size")):
        if k_pages.shape[axis] != v_pages.shape[axis]:
            raise ValueError(
                f"k_pages and v_pages must have the same {what} (axis {axis}); got k_pages {k_pages.shape} "
                f"and v_pages {v_pages.shape}"
            )


def _check_lengths(kv_lens: np.ndarray, n_sequences: int, capacity: int) -> None:
    """Raise ValueError unless `kv_lens` has one entry per sequence, each in ``[0, capacity]``."""
    if kv_lens.shape != (n_sequences,):
        raise ValueError(
            f"kv_lens must have one length per row of block_table, shape ({n_sequences},); got {kv_lens.shape}"
        )
    if kv_lens.size and kv_lens.min() < 0:
        b = int(np.argmin(kv_lens))
        raise ValueError(f"kv_lens must be >= 0; got kv_lens[{b}] = {kv_lens[b]}")
    if kv_lens.size and kv_lens.max() > capacity:
        b = int(np.argmax(kv_lens))
        raise ValueError(
            f"kv_lens must be at most the block table's capacity, max_pages * page_size = {capacity}; "
            f"got kv_lens[{b}] = {kv_lens[b]}"
        )


def _used_pages(block_table: np.ndarray, kv_lens: np.ndarray, page_size: int, num_pages: int) -> list[np.ndarray]:
    """The page indices each sequence uses, ``block_table[b, :ceil(kv_lens[b] / page_size)]``, checked in range."""
    used = []
    for b, length in enumerate(kv_lens):
        pages = block_table[b, : -(-int(length) // page_size)]
        bad = (pages < 0) | (pages >= num_pages)
        if bad.any():
            j = int(np.argmax(bad))
            raise ValueError(
                f"block_table[{b}, {j}] = {pages[j]} is a used entry (kv_lens[{b}] = {length}) and must be a "
                f"page index in [0, {num_pages}) (k_pages.shape[0])"
            )
        used.append(pages)
    return used


def _sequence_descale(descale, name: str, layout: str, n_seq: int, n_heads: int):
    """`descale` as FlashAttention 3's ``(B, Hkv)``, one factor per sequence and key/value head; a scalar stays one.

    Whatever broadcasts to ``(B, Hkv)`` is broadcast (``(Hkv,)`` or ``(1, Hkv)``: one factor per head for every
    sequence); a 4-D `k_descale` or `v_descale` is a pool's per-head descale, the head axis of `layout` kept
    and every other axis of length one (`quantize_fp8` with ``per_head=True, axis=`` that axis).
    """
    arr = as_real_array(descale, name)
    if arr.ndim == 0:
        return arr
    pool = arr.ndim == 4 and name != "q_descale"
    if pool:  # (1, Hkv, 1, 1) in HND, (1, 1, Hkv, 1) in NHD -> (1, Hkv)
        heads = np.moveaxis(arr, _HEAD_AXIS[layout], -1)
        arr = heads.reshape(1, heads.shape[-1]) if heads.shape[:-1] == (1, 1, 1) else arr
    if arr.ndim <= 2:
        try:
            return np.broadcast_to(arr, (n_seq, n_heads))  # (B, Hkv)
        except ValueError:
            pass
    pool_shape = [1, 1, 1, 1]
    pool_shape[_HEAD_AXIS[layout]] = n_heads
    pool_hint = f", or a per-head descale of the {layout} pool, {tuple(pool_shape)}" if name != "q_descale" else ""
    raise ValueError(
        f"{name} must be a scalar, or broadcast to (B, Hkv) = {(n_seq, n_heads)}: one factor per sequence and "
        f"key/value head (FlashAttention 3's convention; (Hkv,) or (1, Hkv) for one factor per head){pool_hint}; "
        f"got shape {np.shape(descale)}"
    )


def gather_pages(pages_pool: np.ndarray, pages: np.ndarray, length: int) -> np.ndarray:
    """The first `length` positions of the pages `pages` of the pool, in order: shape (Hkv, length, E)."""
    _, heads, page_size, size = pages_pool.shape
    chosen = pages_pool[pages]  # (n, Hkv, page_size, E): only the used pages are read
    return np.swapaxes(chosen, 0, 1).reshape(heads, pages.size * page_size, size)[:, :length]


def prepare_paged(q, k_pages, v_pages, block_table, kv_lens, layout, cu_seqlens_q, options: dict, function: str):
    """The checked arguments of a paged call: ``(q, k_pages, v_pages, rows, used, lens, options)``.

    The pools come back in "HND" order (views of an "NHD" pool); ``rows[b]`` indexes sequence b's queries in
    `q` (``(b,)``, or ``(:, q0:q1)`` of packed queries), ``used[b]`` its pages and ``lens[b]`` its length;
    the descales in `options` become (B, Hkv), one row per sequence.
    """
    reject_per_pair_options(options, function)
    layout = check_choice(layout, "layout", tuple(_LAYOUTS))
    q = as_real_array(q, "q", fp8=True)
    k_pages = as_real_array(k_pages, "k_pages", fp8=True)
    v_pages = as_real_array(v_pages, "v_pages", fp8=True)
    _check_pages(k_pages, v_pages, layout)
    if layout == "NHD":  # (num_pages, page_size, Hkv, E) -> (num_pages, Hkv, page_size, E): views, nothing copied
        k_pages, v_pages = np.swapaxes(k_pages, 1, 2), np.swapaxes(v_pages, 1, 2)
    num_pages, n_kv_heads, page_size, _ = k_pages.shape
    table = as_int_array(block_table, "block_table", 2, "(B, max_pages)")
    lens = as_int_array(kv_lens, "kv_lens", 1, "(B,)")
    n_seq = table.shape[0]
    _check_lengths(lens, n_seq, table.shape[1] * page_size)
    used = _used_pages(table, lens, page_size, num_pages)
    rows: list[tuple]
    if cu_seqlens_q is None:
        check_exact_ndim(q, "q", 4, "(B, Hq, Lq, E) without cu_seqlens_q")
        if q.shape[0] != n_seq:
            raise ValueError(
                f"q must have one sequence per row of block_table on axis 0, {n_seq}; got q {q.shape}"
            )
        rows = [(b,) for b in range(n_seq)]
    else:
        check_exact_ndim(q, "q", 3, "(Hq, total_q, E) with cu_seqlens_q")
        cu = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[-2], "queries (q.shape[-2])")
        if cu.size != n_seq + 1:
            raise ValueError(
                f"cu_seqlens_q must have B + 1 = {n_seq + 1} entries for the {n_seq} rows of block_table; "
                f"got {cu.size}"
            )
        rows = [(slice(None), slice(q0, q1)) for q0, q1 in itertools.pairwise(cu)]
    options = options | {
        name: _sequence_descale(options[name], name, layout, n_seq, n_kv_heads)
        for name in DESCALES if options.get(name) is not None
    }
    return q, k_pages, v_pages, rows, used, lens, options


def paged_attention(
    q, k_pages, v_pages, block_table, kv_lens, *, layout="HND", cu_seqlens_q=None, return_lse=False, **options
):
    r"""Attention of a batch of sequences whose keys and values sit in a paged cache.

    Sequence ``b`` has ``kv_lens[b]`` keys; key ``j`` of it is
    ``k_pages[block_table[b, j // page_size], :, j % page_size]`` in the
    "HND" layout (``k_pages[block_table[b, j // page_size], j % page_size]``
    in "NHD"), and likewise its value. Each sequence is computed as a call of
    its own to `scaled_dot_product_attention` over its own keys, with every
    option applied per sequence, as in `varlen_attention`.

    Parameters
    ----------
    q : array_like, shape (B, Hq, Lq, E), or (Hq, total_q, E) with `cu_seqlens_q`
        Queries: ``Lq`` of every sequence, or packed sequences of different
        lengths, as `varlen_attention` takes them.
    k_pages : array_like, shape (num_pages, Hkv, page_size, E) or (num_pages, page_size, Hkv, E)
        The pool of key pages, in the order `layout` names. fp8 pools
        (``float8_e4m3fn``, ``float8_e5m2``) take ``k_descale``.
    v_pages : array_like, shape (num_pages, Hkv, page_size, Ev) or (num_pages, page_size, Hkv, Ev)
        The pool of value pages, aligned with `k_pages`, in the same layout.
    block_table : array_like of int, shape (B, max_pages)
        Row ``b`` lists the pages of sequence ``b`` in order. Only its first
        ``ceil(kv_lens[b] / page_size)`` entries are read; the rest are
        ignored, whatever they hold (-1, 0, a stale index).
    kv_lens : array_like of int, shape (B,)
        Number of cached keys of each sequence, in ``[0, max_pages *
        page_size]``. The unused positions of a sequence's last page are
        never read.
    layout : {"HND", "NHD"}, optional
        The order of a page's axes, as FlashInfer names them: "HND" (the
        default), heads before positions, ``(num_pages, Hkv, page_size, E)``;
        "NHD", positions before heads, ``(num_pages, page_size, Hkv, E)``,
        the order of vLLM's and FlashAttention's caches. Both give the same
        result on the same data: an "NHD" pool is read through a transposed
        view, nothing copied (`nhd_to_hnd`).
    cu_seqlens_q : array_like of int, shape (B + 1,), optional
        Cumulative query offsets of a packed `q`, as in `varlen_attention`.
        A sequence may have no queries.
    return_lse : bool, optional
        Also return the log-sum-exp of each query's scores, as
        `scaled_dot_product_attention` gives it.
    **options
        The per-sequence options of `varlen_attention`: ``is_causal``,
        ``causal_alignment``, ``window``, ``scale``, ``softcap``,
        ``alibi_slopes`` and ``sinks`` (one per query head, shape
        ``(Hq,)``), ``enable_gqa``, ``dropout_p`` with ``rng`` or
        ``dropout_mask`` (a list of one keep-mask per sequence, each
        broadcastable to ``(Hq, Lq_b, kv_lens[b])``), ``return_weights``,
        and for fp8 input ``q_descale``, ``k_descale`` and ``v_descale``
        (see Notes). ``causal_alignment="bottom-right"`` makes each
        sequence's queries its last positions: chunked prefill and decoding.
        ``mask`` and ``bias`` are not accepted.

    Returns
    -------
    out : ndarray, shape (B, Hq, Lq, Ev), or (Hq, total_q, Ev) with `cu_seqlens_q`
        The output in `q`'s layout, in the dtype
        `scaled_dot_product_attention` gives. A sequence with no keys gets
        zeros.
    weights : list of ndarray
        Only with ``return_weights=True``: sequence ``b``'s weights, shape
        ``(Hq, Lq_b, kv_lens[b])``.
    lse : ndarray, shape (B, Hq, Lq), or (Hq, total_q) with `cu_seqlens_q`
        Only with ``return_lse=True`` (last): natural log, sinks counted;
        ``-inf``, or the sink's logit, for a query with no allowed key.

    Raises
    ------
    TypeError
        If `block_table`, `kv_lens` or `cu_seqlens_q` does not hold integers,
        if `mask` or `bias` is given, or as `scaled_dot_product_attention`
        raises.
    ValueError
        If `layout` is not "HND" or "NHD", an array has the wrong number of
        dimensions, `k_pages` and `v_pages` disagree on the number of pages,
        heads or the page size, a descale does not have one of the shapes
        in Notes,
        `kv_lens` does not have one entry per row of `block_table`, a length
        is negative or past the table's capacity, a used entry of
        `block_table` is not a page index, `q` or `cu_seqlens_q` does not
        describe ``B`` sequences, or as `scaled_dot_product_attention`
        raises.

    See Also
    --------
    varlen_attention : The same batch with the keys already gathered and packed.
    block_table_from_indptr : FlashInfer's page lists as a block table.
    nhd_to_hnd : The "NHD" layout as "HND".
    quantize_fp8 : Quantizes a pool to fp8 with one descale per head (``per_head=True, axis=``).

    Notes
    -----
    With :math:`P` the page size and :math:`T` the block table, sequence
    :math:`b` attends to the keys

    .. math::

        K_b[j] = K_{\text{pages}}[T_{b, \lfloor j / P \rfloor}, :,
                 j \bmod P], \qquad 0 \le j < \ell_b,

    and its output is :math:`\operatorname{Attention}(Q_b, K_b, V_b)`,
    exactly. Only the used pages are gathered, one sequence at a time, so
    the memory taken besides the output is that of one sequence's keys and
    values; nothing else in the pool is read.

    A descale is a scalar (one factor for the whole array), or anything
    that broadcasts to ``(B, Hkv)``, FlashAttention 3's convention: one
    factor per sequence and key/value head, row ``b`` for sequence ``b``
    (``q_descale[b, g]`` scales every query head of group ``g``). So
    ``(Hkv,)`` or ``(1, Hkv)`` give each head one factor for every
    sequence. ``k_descale`` and ``v_descale`` may also be the descale of a
    pool quantized per head, as ``quantize_fp8(pages, per_head=True,
    axis=h)`` returns it with ``h`` the layout's head axis: shape ``(1,
    Hkv, 1, 1)`` for "HND" (``axis=1``), ``(1, 1, Hkv, 1)`` for "NHD"
    (``axis=2``). Any other shape is a ValueError; a descale that varies by
    page or position is not a per-sequence factor and is not accepted.

    References
    ----------
    .. [1] Kwon, W. et al., "Efficient Memory Management for Large Language
       Model Serving with PagedAttention", SOSP, 2023.

    Examples
    --------
    Two sequences of 3 and 1 cached keys in pages of 2 positions, one
    decoding query each; the pool's pages are used out of order:

    >>> import numpy as np
    >>> from attention_ref import paged_attention
    >>> k_pages = np.zeros((3, 1, 2, 1))
    >>> v_pages = np.arange(6.0).reshape(3, 1, 2, 1)
    >>> block_table = np.array([[2, 0], [1, -1]])
    >>> q = np.zeros((2, 1, 1, 1))
    >>> paged_attention(q, k_pages, v_pages, block_table, [3, 1])
    array([[[[3.]]],
    <BLANKLINE>
    <BLANKLINE>
           [[[2.]]]])

    Sequence 0 averages the values 4, 5 (page 2) and 0 (page 0); sequence 1
    reads the value 2 of page 1 alone.

    The same pool with positions before heads, vLLM's order, gives the same
    result with ``layout="NHD"``:

    >>> k_nhd, v_nhd = np.swapaxes(k_pages, 1, 2), np.swapaxes(v_pages, 1, 2)
    >>> k_nhd.shape
    (3, 2, 1, 1)
    >>> nhd = paged_attention(q, k_nhd, v_nhd, block_table, [3, 1], layout="NHD")
    >>> np.array_equal(nhd, paged_attention(q, k_pages, v_pages, block_table, [3, 1]))
    True
    """
    return_lse = check_bool(return_lse, "return_lse")
    q, k_pages, v_pages, rows, used, lens, options = prepare_paged(
        q, k_pages, v_pages, block_table, kv_lens, layout, cu_seqlens_q, options, "paged_attention")
    parts = (
        (q[index], gather_pages(k_pages, pages, length), gather_pages(v_pages, pages, length))
        for index, pages, length in zip(rows, used, lens, strict=True)
    )
    outs, weights, lses = attend_each(parts, options, return_lse)
    # (B, Hq, Lq, Ev) and (B, Hq, Lq) stacked; (Hq, total_q, Ev) and (Hq, total_q) packed
    join, axis, lse_axis = (np.stack, 0, 0) if cu_seqlens_q is None else (np.concatenate, -2, -1)
    if not outs:  # no sequences: one empty call gives the checks, the output's shape and its dtype
        none = np.zeros(0, dtype=np.int64)
        empty = (q, gather_pages(k_pages, none, 0), gather_pages(v_pages, none, 0))
        # (0, Hkv) descales have no row for the one call; they do not change the output's dtype
        no_rows = {name: None for name in DESCALES if np.ndim(options.get(name)) == 2}
        outs, _, lses = attend_each([empty], options | no_rows | {"return_weights": False}, return_lse)
        join = lambda parts, axis: parts[0]  # noqa: E731  (the one call's output is the result)
    results = (join(outs, axis=axis),)
    if options.get("return_weights", False):
        results += (weights,)
    if return_lse:
        results += (join(lses, axis=lse_axis),)
    return results if len(results) > 1 else results[0]


def block_table_from_indptr(indptr, indices, last_page_len, page_size):
    """FlashInfer's paged-cache description as ``(block_table, kv_lens)``.

    FlashInfer lists the pages of sequence ``b`` as
    ``indices[indptr[b]:indptr[b + 1]]`` and counts the used positions of
    its last page in ``last_page_len[b]``.

    Parameters
    ----------
    indptr : array_like of int, shape (B + 1,)
        Offsets into `indices`: 0, then the end of each sequence's pages.
    indices : array_like of int, shape (indptr[-1],)
        Page indices of all sequences, concatenated.
    last_page_len : array_like of int, shape (B,)
        Used positions of each sequence's last page, in ``[0, page_size]``
        (ignored for a sequence with no page).
    page_size : int
        Positions per page.

    Returns
    -------
    block_table : ndarray of int64, shape (B, max_pages)
        Row ``b`` holds the pages of sequence ``b``, then -1.
    kv_lens : ndarray of int64, shape (B,)
        ``(n_b - 1) * page_size + last_page_len[b]`` for a sequence of
        ``n_b > 0`` pages, 0 for one of none.

    Raises
    ------
    TypeError
        If an array does not hold integers, or `page_size` is not an int.
    ValueError
        If an array has the wrong shape, `indptr` does not start at 0,
        decreases or does not end at ``len(indices)``, `page_size` < 1, or
        a `last_page_len` is outside ``[0, page_size]``.

    See Also
    --------
    paged_attention : Takes the result.

    Examples
    --------
    >>> from attention_ref import block_table_from_indptr
    >>> table, lens = block_table_from_indptr([0, 2, 2, 3], [5, 1, 4], [3, 0, 1], page_size=4)
    >>> table
    array([[ 5,  1],
           [-1, -1],
           [ 4, -1]])
    >>> lens
    array([7, 0, 1])
    """
    page_size = check_int(page_size, "page_size", minimum=1)
    pages = as_int_array(indices, "indices", 1, "(indptr[-1],)")
    ptr = check_cu_seqlens(indptr, "indptr", pages.size, "pages (len(indices))")
    last = as_int_array(last_page_len, "last_page_len", 1, "(B,)")
    n_seq = ptr.size - 1
    if last.shape != (n_seq,):
        raise ValueError(f"last_page_len must have one entry per sequence, shape ({n_seq},); got {last.shape}")
    if last.size and (last.min() < 0 or last.max() > page_size):
        b = int(np.argmax((last < 0) | (last > page_size)))
        raise ValueError(f"last_page_len must be in [0, page_size = {page_size}]; got last_page_len[{b}] = {last[b]}")
    counts = np.diff(ptr)  # (B,) pages per sequence
    table = np.full((n_seq, int(counts.max(initial=0))), -1, dtype=np.int64)
    for b, (p0, p1) in enumerate(itertools.pairwise(ptr)):
        table[b, : p1 - p0] = pages[p0:p1]
    kv_lens = np.where(counts > 0, (counts - 1) * page_size + last, 0)
    return table, kv_lens.astype(np.int64)


def nhd_to_hnd(pages):
    """A page pool in FlashInfer's "NHD" order, which FlashAttention and vLLM use, as "HND".

    A change of layout is a transpose: every value keeps its bits, whatever
    the dtype (float16, bfloat16, float32, float64, and the fp8 formats
    ``float8_e4m3fn`` and ``float8_e5m2``, which stay fp8). An fp8 pool's
    descales keep their values: a per-head descale of shape ``(1, 1, H,
    1)`` becomes ``(1, H, 1, 1)`` through the same function.
    `paged_attention` also reads "NHD" pools directly, with
    ``layout="NHD"``.

    Parameters
    ----------
    pages : array_like, shape (num_pages, page_size, H, E)
        Positions before heads within each page.

    Returns
    -------
    ndarray, shape (num_pages, H, page_size, E)
        A view with heads before positions (`paged_attention`'s default
        order), in the dtype of `pages` (integers become float64).

    Raises
    ------
    TypeError
        If `pages` does not hold real numbers.
    ValueError
        If `pages` is not 4-D.

    See Also
    --------
    paged_attention : Takes pages in either order.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import nhd_to_hnd
    >>> cache = np.arange(12.0).reshape(1, 3, 2, 2)  # 1 page, 3 positions, 2 heads
    >>> nhd_to_hnd(cache)[0, 1]  # head 1's three positions
    array([[ 2.,  3.],
           [ 6.,  7.],
           [10., 11.]])
    """
    arr = as_real_array(pages, "pages", fp8=True)
    check_exact_ndim(arr, "pages", 4, "(num_pages, page_size, H, E)")
    return np.swapaxes(arr, 1, 2)
