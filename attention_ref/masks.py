"""Boolean attention masks (True = may attend) and their additive form."""

from __future__ import annotations

import numpy as np

from ._validation import as_bool_mask, check_choice, check_int, check_window, float_dtype

__all__ = ["causal_mask", "mask_to_bias", "padding_mask", "sliding_window_mask"]

ALIGNMENTS = ("top-left", "bottom-right")
SIDES = ("right", "left")


def query_positions(n_queries, n_keys, alignment):
    """Key-axis position of each query row, shape ``(n_queries, 1)``.

    Top-left puts query ``i`` at key position ``i``; bottom-right puts the
    last query on the last key, i.e. query ``i`` at ``i + n_keys - n_queries``.
    """
    n_queries = check_int(n_queries, "n_queries", minimum=0)
    n_keys = n_queries if n_keys is None else check_int(n_keys, "n_keys", minimum=0)
    check_choice(alignment, "alignment", ALIGNMENTS)
    offset = 0 if alignment == "top-left" else n_keys - n_queries
    rows = np.arange(n_queries)[:, None] + offset  # (L, 1)
    cols = np.arange(n_keys)[None, :]  # (1, S)
    return rows, cols


def in_window(rows, cols, left, right):
    """True where ``rows - left <= cols <= rows + right``; a None side is unbounded.

    `rows` holds the key positions of the queries, shape (l, 1), `cols` the
    key indices, shape (1, s): the one definition of a window that the masks
    and the attention functions share.
    """
    sides = []
    if left is not None:
        sides.append(cols >= rows - left)
    if right is not None:
        sides.append(cols <= rows + right)
    if not sides:
        return np.ones(np.broadcast_shapes(np.shape(rows), np.shape(cols)), dtype=bool)
    return sides[0] & sides[1] if len(sides) == 2 else sides[0]


def causal_mask(n_queries, n_keys=None, *, alignment="top-left"):
    r"""Boolean causal mask: query ``i`` may attend to keys at or before it.

    Parameters
    ----------
    n_queries : int
        Number of queries, L.
    n_keys : int, optional
        Number of keys, S. Defaults to `n_queries`.
    alignment : {"top-left", "bottom-right"}, optional
        Where the diagonal sits when L != S. ``"top-left"`` (PyTorch's
        ``is_causal``, JAX) lets query ``i`` see keys ``0..i``.
        ``"bottom-right"`` (FlashAttention, ``causal_lower_right``) lets query
        ``i`` see keys ``0..i + S - L``, so the *last* query sees every key:
        what decoding with a key/value cache needs.

    Returns
    -------
    ndarray of bool, shape (L, S)
        True where the query may attend to the key.

    Raises
    ------
    TypeError
        If a size is not an integer.
    ValueError
        If a size is negative or `alignment` is not one of the two strings.

    See Also
    --------
    sliding_window_mask : Causal mask limited to the most recent keys.
    mask_to_bias : The additive 0 / ``-inf`` form.
    scaled_dot_product_attention : ``is_causal=True`` builds this mask.

    Notes
    -----
    With offset :math:`o = 0` (top-left) or :math:`o = S - L`
    (bottom-right), entry :math:`(i, j)` is True iff :math:`j \le i + o`.
    Under bottom-right alignment with :math:`L > S` the first
    :math:`L - S` rows are entirely False; attention returns zeros for them.
    This is the masking of the Transformer decoder, which keeps each position
    from attending to later ones [1]_.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.

    Examples
    --------
    >>> from attention_ref import causal_mask
    >>> causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    >>> causal_mask(2, 4).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0]])
    >>> causal_mask(2, 4, alignment="bottom-right").astype(int)
    array([[1, 1, 1, 0],
           [1, 1, 1, 1]])
    """
    rows, cols = query_positions(n_queries, n_keys, alignment)
    return cols <= rows


def sliding_window_mask(n_queries, n_keys=None, *, window, alignment="top-left"):
    r"""Local attention mask: each query sees only the keys in a window around its position.

    Parameters
    ----------
    n_queries : int
        Number of queries, L.
    n_keys : int, optional
        Number of keys, S. Defaults to `n_queries`.
    window : int or (int or None, int or None)
        An int ``w >= 1``: causal, the `w` most recent keys, the query's own
        position included. A pair ``(left, right)``, each an int >= 0 or None
        for unbounded: the keys from `left` positions before the query's
        position to `right` positions after it, as the `window` argument of
        `scaled_dot_product_attention` (``w`` is the pair ``(w - 1, 0)``).
    alignment : {"top-left", "bottom-right"}, optional
        Key position ``p_i`` of query ``i``: ``i`` (top-left) or
        ``i + S - L`` (bottom-right), as in `causal_mask`.

    Returns
    -------
    ndarray of bool, shape (L, S)
        True where ``0 <= p_i - j < w`` (int form) or
        ``p_i - left <= j <= p_i + right`` (pair form).

    Raises
    ------
    TypeError
        If a size is not an integer, `window` is neither an integer nor a
        pair, or a side of the pair is neither an integer nor None.
    ValueError
        If a size is negative, an int `window` is < 1, a pair has a negative
        side or a length other than 2, or `alignment` is unknown.

    See Also
    --------
    causal_mask : The unlimited causal window, ``(None, 0)``.
    scaled_dot_product_attention : Its `window` applies the pair form
        without building the mask.

    Notes
    -----
    Local (sliding-window) attention as used by Longformer and Mistral:
    with :math:`p_i = i + o` (:math:`o = 0` top-left, :math:`o = S - L`
    bottom-right), entry :math:`(i, j)` of the pair form is True iff

    .. math::

        p_i - \mathrm{left} \le j \le p_i + \mathrm{right},

    FlashAttention's ``window_size=(left, right)`` with bottom-right
    alignment (``-1`` there is None here). The int form is causal:
    :math:`0 \le p_i - j < w`, the pair ``(w - 1, 0)``; with
    :math:`w \ge S` it equals `causal_mask`.

    References
    ----------
    .. [1] Beltagy, I., M. E. Peters, A. Cohan, "Longformer: The
       Long-Document Transformer", arXiv:2004.05150, 2020.
    .. [2] Jiang, A. Q. et al., "Mistral 7B", arXiv:2310.06825, 2023.

    Examples
    --------
    >>> from attention_ref import sliding_window_mask
    >>> sliding_window_mask(4, window=2).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])

    A pair reaches both ways; None leaves a side open:

    >>> sliding_window_mask(4, window=(1, 1)).astype(int)
    array([[1, 1, 0, 0],
           [1, 1, 1, 0],
           [0, 1, 1, 1],
           [0, 0, 1, 1]])
    >>> sliding_window_mask(2, 4, window=(None, 0), alignment="bottom-right").astype(int)
    array([[1, 1, 1, 0],
           [1, 1, 1, 1]])
    """
    if isinstance(window, (tuple, list)):
        left, right = check_window(window)
    else:
        left, right = check_int(window, "window", minimum=1) - 1, 0
    rows, cols = query_positions(n_queries, n_keys, alignment)
    return in_window(rows, cols, left, right)


def padding_mask(lengths, n_keys, *, side="right"):
    r"""Mask out padded keys: sequence ``b`` has only ``lengths[b]`` real keys.

    Parameters
    ----------
    lengths : array_like of int, shape (B,) or any batch shape
        Number of valid (non-padding) keys in each sequence.
    n_keys : int
        Padded key length, S.
    side : {"right", "left"}, optional
        Where the padding sits. ``"right"``: the real keys come first,
        positions ``j < lengths[b]``. ``"left"``: they come last, positions
        ``j >= S - lengths[b]``, as in batched generation, where every
        sequence ends at the same position so the next tokens line up.

    Returns
    -------
    ndarray of bool, shape (\*lengths.shape, 1, S)
        True for the real key positions. The size-one query axis
        broadcasts against scores of shape ``(B, L, S)``; for scores with a
        head axis ``(B, H, L, S)`` insert it: ``padding_mask(...)[:, None]``.

    Raises
    ------
    TypeError
        If `lengths` does not hold integers.
    ValueError
        If a length is negative or larger than `n_keys`, or `side` is not
        ``"right"`` or ``"left"``.

    See Also
    --------
    causal_mask : Combine with ``&`` for padded causal attention.
    decode_step : Left-padded batches decode with bottom-right alignment.

    Notes
    -----
    Right padding: entry :math:`(b, 0, j)` is True iff :math:`j < \ell_b`.
    Left padding: iff :math:`j \ge S - \ell_b`. A sequence of length 0
    masks every key, and attention then returns zeros for it.

    With left padding the last real key of every sequence is key
    :math:`S - 1`, so bottom-right alignment (``causal_alignment=
    "bottom-right"``) puts each sequence's last query on its own last key;
    causal masks, windows and ALiBi distances then hold per sequence
    without knowing the lengths.

    Examples
    --------
    >>> from attention_ref import padding_mask
    >>> padding_mask([3, 1], 4).astype(int)
    array([[[1, 1, 1, 0]],
    <BLANKLINE>
           [[1, 0, 0, 0]]])
    >>> padding_mask([3, 1], 4, side="left").astype(int)
    array([[[0, 1, 1, 1]],
    <BLANKLINE>
           [[0, 0, 0, 1]]])
    """
    n_keys = check_int(n_keys, "n_keys", minimum=0)
    check_choice(side, "side", SIDES)
    try:
        lengths = np.asarray(lengths)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"lengths must be an array of integers; got {type(lengths).__name__}: {exc}") from None
    if lengths.size == 0 and lengths.dtype == np.float64:
        lengths = lengths.astype(np.int64)  # an empty list: no sequences, nothing to check
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"lengths must hold integers; got dtype {lengths.dtype}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > n_keys):
        raise ValueError(
            f"lengths must lie in [0, n_keys={n_keys}]; got values from {lengths.min()} to {lengths.max()}"
        )
    if side == "left":
        return np.arange(n_keys) >= n_keys - lengths.astype(np.int64)[..., None, None]  # no unsigned wrap-around
    return np.arange(n_keys) < lengths[..., None, None]


def mask_to_bias(mask, dtype=np.float64):
    r"""Turn a boolean mask into an additive bias: 0 where True, ``-inf`` where False.

    Parameters
    ----------
    mask : array_like of bool, any shape
        True where attention is allowed.
    dtype : {numpy.float16, numpy.float32, numpy.float64, bfloat16}, optional
        Floating dtype of the bias (bfloat16 from the ``ml_dtypes``
        package), as a NumPy or ml_dtypes dtype, a name, or a torch or JAX
        dtype (``torch.bfloat16``, ``jnp.float16``). Default float64.

    Returns
    -------
    ndarray of `dtype`, same shape as `mask`
        0 where `mask` is True, ``-inf`` where it is False.

    Raises
    ------
    TypeError
        If `mask` is not boolean or `dtype` is not float16, float32,
        float64 or bfloat16.

    See Also
    --------
    scaled_dot_product_attention : Adds this bias to the scores.

    Notes
    -----
    Adding :math:`\log m_j` (0 or :math:`-\infty`) to a score multiplies its
    exponential by :math:`m_j` (1 or 0) *before* normalising:

    .. math::

        \operatorname{softmax}(s + \log m)_j
        = \frac{m_j e^{s_j}}{\sum_k m_k e^{s_k}} .

    A finite stand-in such as ``-1e9`` is not representable in float16
    (it overflows to ``-inf``) and, in wider types, leaves a weight of
    :math:`e^{-10^9}` rather than an exact zero; ``-inf`` is exact in every
    dtype. Masking by setting scores to :math:`-\infty` before the softmax
    is how [1]_ keeps the decoder from seeing later positions.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.

    Examples
    --------
    >>> from attention_ref import causal_mask, mask_to_bias
    >>> mask_to_bias(causal_mask(3))
    array([[  0., -inf, -inf],
           [  0.,   0., -inf],
           [  0.,   0.,   0.]])
    """
    mask = as_bool_mask(mask)
    dtype = float_dtype(dtype)
    return np.where(mask, dtype.type(0), dtype.type(-np.inf))
