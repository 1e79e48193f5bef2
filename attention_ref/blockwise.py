"""Blockwise (online-softmax) attention and the merging of partial results."""

from __future__ import annotations

import numpy as np

from ._attention_problem import prepare_attention
from ._normalization import softmax_only
from ._online import online_softmax, safe_max
from ._options import DETERMINISTIC, takes_options
from ._validation import as_per_head, as_real_array, check_bool, check_int, result_dtype

__all__ = ["blockwise_attention", "merge_attention"]


def block_sizes(block_size) -> tuple[int, int]:
    """Return ``(block_q, block_k)`` from an int or a pair of ints, each >= 1."""
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise ValueError(
                f"block_size must be an int or a pair (block_q, block_k); got a sequence of length {len(block_size)}"
            )
        return (
            check_int(block_size[0], "block_size[0] (block_q)", minimum=1),
            check_int(block_size[1], "block_size[1] (block_k)", minimum=1),
        )
    size = check_int(block_size, "block_size", minimum=1)
    return size, size


@takes_options(*DETERMINISTIC, "normalization")
def blockwise_attention(q, k, v, *, block_size=256, return_lse=False, **options):
    r"""Attention computed block by block with an online softmax, never forming the (L, S) matrix.

    Gives the same result as `scaled_dot_product_attention` (to rounding)
    while holding only one ``(block_q, block_k)`` tile of scores at a time.

    Parameters
    ----------
    q : array_like, shape (..., L, E)
        Queries. Leading axes broadcast as in `scaled_dot_product_attention`.
    k : array_like, shape (..., S, E)
        Keys.
    v : array_like, shape (..., S, Ev)
        Values.
    block_size : int or (int, int), optional
        Tile size: one int for both axes, or a pair ``(block_q, block_k)``
        of query rows and key columns per tile. Any size >= 1 works, also
        sizes larger than L or S. Larger tiles mean fewer Python-level
        steps and larger matrix products, but more memory per step; the
        default 256 (a 0.5 MiB float64 tile per batch element) is near the
        fastest on a CPU with NumPy's OpenBLAS.
    mask : array_like of bool, shape broadcastable to (..., L, S), optional
        True where query ``i`` may attend to key ``j``.
    bias : array_like of float, shape broadcastable to (..., L, S), optional
        Additive term on the scaled scores.
    is_causal : bool, optional
        Apply a causal mask with `causal_alignment`. Key blocks that the
        causal mask hides entirely are skipped, not computed.
    causal_alignment : {"top-left", "bottom-right"}, optional
        Diagonal placement when L != S, and the query positions for
        `window` and `alibi_slopes`; see `scaled_dot_product_attention`.
    window : (int or None, int or None), optional
        Local attention ``(left, right)`` as in
        `scaled_dot_product_attention`. Key blocks outside the window of
        every query of a block are skipped, on both sides, so the work
        grows as ``L * (left + right + block)`` rather than ``L * S``.
    scale : float, optional
        Multiplier of the scores; default ``1 / sqrt(E)``.
    softcap : float, optional
        Soft cap ``c > 0`` of the scaled scores, ``c * tanh(scores / c)``,
        applied before `bias`, ALiBi and the masks.
    alibi_slopes : array_like of float, optional
        ALiBi slopes, broadcastable to ``(..., H)``; the term
        ``-m_h * |p_i - j|`` is built tile by tile, so memory stays
        :math:`O(b_q b_k)`.
    sinks : array_like of float, optional
        Attention-sink logits, broadcastable to ``(..., H)``; each row's
        denominator gains ``exp(s_h)``. Counted once, in `lse` as well (see
        Notes).
    enable_gqa : bool, optional
        Grouped-query attention; query head ``h`` uses key/value head
        ``h // (Hq // Hkv)``.
    q_descale, k_descale, v_descale : float or array_like, optional
        Descale factors of fp8 input, as in `scaled_dot_product_attention`;
        fp8 input gives bfloat16 output.
    normalization : {"softmax"}, optional
        The online softmax is the only normalization here; ``"sigmoid"``
        is refused by name (`scaled_dot_product_attention` computes it).
    return_lse : bool, optional
        Also return the log-sum-exp of each query row's scores.

    Returns
    -------
    out : ndarray, shape (..., L, Ev)
        Attention output, in the dtype NumPy promotion gives `q`, `k`, `v`
        (float16 is accumulated in float32). Rows with no allowed key are 0.
    lse : ndarray, shape (..., L)
        Only with ``return_lse=True``: :math:`\log \sum_j e^{x_{ij}}` over the
        allowed keys of the scaled and biased scores :math:`x`, in the
        working dtype: float32 for float16 and bfloat16 input (as
        FlashAttention returns it, since the log-sum-exp of scores that fit
        float16 may not), else the dtype of `out`; ``-inf`` for
        a row with no allowed key. With `sinks` it is the log of the whole
        denominator, :math:`\log(e^{s_h} + \sum_j e^{x_{ij}})`, and
        :math:`s_h` for a row with no allowed key. Together with `out` it
        is what `merge_attention` needs.

    Raises
    ------
    TypeError
        As `scaled_dot_product_attention`; also if `block_size` is not an
        integer or a pair of integers, or `return_lse` is not a bool.
    ValueError
        As `scaled_dot_product_attention`; also if a block size is < 1,
        `block_size` is a sequence whose length is not 2, or `normalization`
        is not ``"softmax"``.

    See Also
    --------
    scaled_dot_product_attention : The dense reference this equals.
    merge_attention : Combine results computed over disjoint key sets.
    logsumexp : The normaliser returned as `lse`.

    Notes
    -----
    For one query row with scores :math:`x_1, x_2, \dots` arriving one key
    block :math:`B_t` at a time, keep a running maximum :math:`m`, a running
    normaliser :math:`\ell` and an unnormalised output :math:`a`, starting
    from :math:`m_0 = -\infty`, :math:`\ell_0 = 0`, :math:`a_0 = 0`:

    .. math::

        m_t &= \max\bigl(m_{t-1}, \max_{j \in B_t} x_j\bigr), \\
        \ell_t &= e^{m_{t-1} - m_t}\, \ell_{t-1}
                  + \sum_{j \in B_t} e^{x_j - m_t}, \\
        a_t &= e^{m_{t-1} - m_t}\, a_{t-1}
               + \sum_{j \in B_t} e^{x_j - m_t}\, v_j .

    After the last block :math:`T`, the output is :math:`a_T / \ell_T` and
    :math:`\operatorname{LSE} = m_T + \log \ell_T`. The factor
    :math:`e^{m_{t-1} - m_t} \le 1` re-expresses the old terms relative to
    the new maximum, so every exponent stays :math:`\le 0` as in the
    one-pass `softmax`. While a row has seen only masked keys,
    :math:`m_t = -\infty`; the shift is then taken as 0 so that
    :math:`-\infty - (-\infty)` is never formed, and a row that stays empty
    ends with :math:`\ell_T = 0`, output 0 and LSE :math:`-\infty`.

    A sink :math:`s_h` is a key with score :math:`s_h` and value 0 seen
    first: the row starts from :math:`m_0 = s_h`, :math:`\ell_0 = 1`,
    :math:`a_0 = 0`. So `lse` counts the sink exactly once, and a row with
    no allowed key ends with output 0 and LSE :math:`s_h`. Results to be
    merged with `merge_attention` must not each hold the sink (it would be
    counted once per part): compute the parts without `sinks` and pass
    the sinks to `merge_attention`, or give them to exactly one part.

    With a window (or a causal mask) the query block of rows
    :math:`[r_0, r_1)` visits only the keys from :math:`p_{r_0} - \ell`
    to :math:`p_{r_1 - 1} + r`; tiles wholly inside the window are computed
    without building a mask, tiles across its edges with it.

    Extra memory is one tile of scores, :math:`O(b_q b_k)`, plus the running
    state :math:`O(b_q E_v)` and the output, per batch element; the dense
    function needs :math:`O(L S)`. Query blocks are independent, so large
    problems run them on a small thread pool (one per core, each with one
    BLAS thread), as the dense kernel does; each thread holds its own tile. The arithmetic is the same as the dense
    function's, but sums are accumulated in a different order, so results
    agree to rounding (about :math:`10^{-15}` relative in float64), not
    bit for bit.

    References
    ----------
    .. [1] Milakov, M. and N. Gimelshein, "Online normalizer calculation for
       softmax", arXiv:1805.02867, 2018.
    .. [2] Rabe, M. N. and C. Staats, "Self-attention Does Not Need
       :math:`O(n^2)` Memory", arXiv:2112.05682, 2021.
    .. [3] Dao, T., D. Y. Fu, S. Ermon, A. Rudra and C. Ré, "FlashAttention:
       Fast and Memory-Efficient Exact Attention with IO-Awareness",
       NeurIPS, 2022.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import blockwise_attention, scaled_dot_product_attention
    >>> q = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> k = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> v = np.array([[10.0], [20.0]])
    >>> blockwise_attention(q, k, v, block_size=1)
    array([[13.30238451],
           [16.69761549]])
    >>> scaled_dot_product_attention(q, k, v)
    array([[13.30238451],
           [16.69761549]])

    Any block size gives the dense result, here with a causal mask and the
    log-sum-exp of each row (the first row sees one key, scaled score
    :math:`1/\sqrt{2}`):

    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 7, 4))
    >>> out, lse = blockwise_attention(q, k, v, block_size=(3, 2), is_causal=True, return_lse=True)
    >>> bool(np.allclose(out, scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=1e-12))
    True
    >>> float(lse[0, 0]) == float(q[0, 0] @ k[0, 0]) / 2
    True

    The other options give the dense result as well; with a sink the
    log-sum-exp includes it, so with ``scale=0.0`` a row of two allowed keys
    and a sink of 0 has :math:`\log 3`:

    >>> options = {"window": (1, 0), "softcap": 5.0, "alibi_slopes": [0.5, 0.25], "sinks": [0.0, 1.0]}
    >>> out = blockwise_attention(q, k, v, block_size=2, **options)
    >>> bool(np.allclose(out, scaled_dot_product_attention(q, k, v, **options), rtol=0, atol=1e-12))
    True
    >>> _, lse = blockwise_attention(q, k, v, scale=0.0, window=(1, 0), sinks=0.0, return_lse=True)
    >>> lse[0]
    array([0.69314718, 1.09861229, 1.09861229, 1.09861229, 1.09861229,
           1.09861229, 1.09861229])
    """
    block_q, block_k = block_sizes(block_size)
    return_lse = check_bool(return_lse, "return_lse")
    softmax_only(options["normalization"], "blockwise_attention")
    p = prepare_attention(q, k, v, **options)
    out, lse = online_softmax(p, block_q, block_k)
    out = out.astype(p.out_dtype, copy=False)
    if return_lse:
        return out, lse  # in the working dtype: float32 for float16 and bfloat16, as FlashAttention returns it
    return out


def _as_parts(parts, name: str) -> list[np.ndarray]:
    """Return a list or tuple of arrays as a list of real arrays."""
    if not isinstance(parts, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple of arrays (one per key subset); got {type(parts).__name__}")
    return [as_real_array(a, f"{name}[{i}]") for i, a in enumerate(parts)]


def merge_attention(outs, lses, *, sinks=None):
    r"""Merge attention results computed over disjoint sets of keys.

    If the keys (and values) are split into groups and `blockwise_attention`
    (with ``return_lse=True``) is run on each group, this returns what one
    call over all keys would have returned. It is how attention is split
    across devices (ring attention) or across chunks of a long context.

    Parameters
    ----------
    outs : list or tuple of array_like, each shape (..., L, Ev)
        Partial outputs, one per key group, all of the same shape.
    lses : list or tuple of array_like, each shape (..., L)
        The matching log-sum-exps, shape ``outs[i].shape[:-1]``; ``-inf``
        for a row with no allowed key in that group.
    sinks : array_like of float, optional
        Attention-sink logits to fold in once, broadcastable to the batch
        and head axes ``outs[0].shape[:-2]`` (a 1-D array holds one per
        head), as the `sinks` of `blockwise_attention`. The parts must then
        have been computed without sinks.

    Returns
    -------
    out : ndarray, shape (..., L, Ev)
        The merged output, in the dtype NumPy promotion gives `outs`
        (bfloat16 with float16 gives float32); zeros in rows where every
        `lses` entry is ``-inf``.
    lse : ndarray, shape (..., L)
        The merged log-sum-exp, :math:`\log \sum_i e^{\mathrm{lse}_i}`
        (plus :math:`e^{s_h}` inside the log with `sinks`), in the dtype
        promotion gives `outs` and `lses` but at least float32, the dtype of
        the `lse` that `blockwise_attention` returns for float16 and
        bfloat16.

    Raises
    ------
    TypeError
        If `outs` or `lses` is not a list or tuple, or holds non-real
        arrays, or `sinks` is not real.
    ValueError
        If the two sequences are empty or of different lengths, the outputs
        differ in shape, an output has fewer than 2 dimensions, an `lses`
        entry is not shaped ``outs[i].shape[:-1]``, or `sinks` does not
        broadcast to ``outs[0].shape[:-2]`` or is not finite.

    See Also
    --------
    blockwise_attention : Produces ``(out, lse)`` pairs.
    logsumexp : The same reduction over the key axis.

    Notes
    -----
    Part :math:`i` holds :math:`o_i = \sum_{j \in K_i} e^{x_j - \lambda_i} v_j`
    with :math:`\lambda_i = \log \sum_{j \in K_i} e^{x_j}`. Over the union
    of disjoint key sets,

    .. math::

        \lambda = \log \sum_i e^{\lambda_i}, \qquad
        o = \sum_i e^{\lambda_i - \lambda}\, o_i ,

    computed with the largest :math:`\lambda_i` subtracted first, as in
    `logsumexp`. This is the online-softmax recurrence of
    `blockwise_attention` applied to whole parts instead of key blocks.

    A sink belongs to the whole row, not to a key subset: it must enter the
    denominator once. A part computed with `sinks` already holds it, so
    merging several such parts would count it once per part. Compute the
    parts without sinks and pass `sinks` here: they join as one more part
    with :math:`\lambda = s_h` and output 0. The merged `lse` then equals
    the one `blockwise_attention` returns with `sinks` over all keys.

    References
    ----------
    .. [1] Milakov, M. and N. Gimelshein, "Online normalizer calculation for
       softmax", arXiv:1805.02867, 2018.
    .. [2] Liu, H., M. Zaharia and P. Abbeel, "Ring Attention with Blockwise
       Transformers for Near-Infinite Context", arXiv:2310.01889, 2023.

    Examples
    --------
    Attention over four keys, split into the first one and the last three:

    >>> import numpy as np
    >>> from attention_ref import blockwise_attention, merge_attention, scaled_dot_product_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 4))
    >>> parts = [blockwise_attention(q, k[a:b], v[a:b], return_lse=True) for a, b in ((0, 1), (1, 4))]
    >>> out, lse = merge_attention([o for o, _ in parts], [s for _, s in parts])
    >>> bool(np.allclose(out, scaled_dot_product_attention(q, k, v), rtol=0, atol=1e-12))
    True

    Two equal halves with equal ``lse`` average, and the merged ``lse``
    grows by :math:`\log 2`:

    >>> merge_attention([np.array([[2.0]]), np.array([[4.0]])], [np.array([0.0]), np.array([0.0])])
    (array([[3.]]), array([0.69314718]))

    A sink of 0 joins them once, as a third part with output 0:

    >>> merge_attention([np.array([[2.0]]), np.array([[4.0]])], [np.array([0.0]), np.array([0.0])], sinks=0.0)
    (array([[2.]]), array([1.09861229]))
    """
    outs = _as_parts(outs, "outs")
    lses = _as_parts(lses, "lses")
    if not outs or len(outs) != len(lses):
        raise ValueError(
            "outs and lses must be non-empty and of the same length; "
            f"got {len(outs)} outputs and {len(lses)} log-sum-exps"
        )
    shape = outs[0].shape
    if len(shape) < 2:
        raise ValueError(f"outs[0] must have at least 2 dimensions (..., L, Ev); got shape {shape}")
    for i, (o, s) in enumerate(zip(outs, lses, strict=True)):
        if o.shape != shape:
            raise ValueError(f"every output must have the shape of outs[0], {shape}; got outs[{i}] {o.shape}")
        if s.shape != shape[:-1]:
            raise ValueError(f"lses[{i}] must have shape {shape[:-1]} (outs[{i}] without its last axis); got {s.shape}")
    out_dtype = result_dtype(*outs)[0]
    work_dtype = result_dtype(*outs, *lses)[1]  # at least float32; also the dtype of the merged lse
    # Each part is cast before stacking: np.stack would promote bfloat16 with float16 by NumPy's rules (an error).
    lse_parts = np.stack([s.astype(work_dtype, copy=False) for s in lses])  # (n, ..., L)
    if sinks is not None:
        # One more part: lse = s_h, output 0 (so it is left out of the weighted sum below).
        sinks = as_per_head(sinks, "sinks", shape[:-2], work_dtype)
        lse_parts = np.concatenate([lse_parts, np.broadcast_to(sinks[..., None], shape[:-1])[None]])
    with np.errstate(invalid="ignore", over="ignore"):  # +inf or NaN parts: NaN rows, no warning
        shift = safe_max(lse_parts.max(axis=0))  # (..., L)
        weights = np.exp(lse_parts - shift)  # (n, ..., L); 0 for -inf parts
        total = weights.sum(axis=0)
        seen = total != 0  # False where every part is empty
        out = np.zeros(shape, dtype=work_dtype)
        for w, o in zip(weights[: len(outs)], outs, strict=True):
            out += w[..., None] * o
        np.divide(out, total[..., None], out=out, where=seen[..., None])
        lse = np.full(shape[:-1], -np.inf, dtype=work_dtype)
        np.log(total, out=total, where=seen)
        np.add(shift, total, out=lse, where=seen)
    return out.astype(out_dtype, copy=False), lse
