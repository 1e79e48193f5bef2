"""Boolean attention masks (True = may attend) and their additive form."""

from __future__ import annotations

import numpy as np

from ._validation import as_bool_mask, check_choice, check_int, float_dtype

__all__ = ["causal_mask", "mask_to_bias", "padding_mask", "sliding_window_mask"]

ALIGNMENTS = ("top-left", "bottom-right")


def _query_positions(n_queries, n_keys, alignment):
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
    rows, cols = _query_positions(n_queries, n_keys, alignment)
    return cols <= rows


def sliding_window_mask(n_queries, n_keys=None, *, window, alignment="top-left"):
    r"""Causal mask that keeps only the `window` most recent keys per query.

    Parameters
    ----------
    n_queries : int
        Number of queries, L.
    n_keys : int, optional
        Number of keys, S. Defaults to `n_queries`.
    window : int
        How many keys each query may see, itself included (>= 1).
    alignment : {"top-left", "bottom-right"}, optional
        Diagonal placement when L != S, as in `causal_mask`.

    Returns
    -------
    ndarray of bool, shape (L, S)
        True where ``0 <= p_i - j < window``, with ``p_i`` the key position
        of query ``i``.

    Raises
    ------
    TypeError
        If a size or `window` is not an integer.
    ValueError
        If a size is negative, `window` < 1, or `alignment` is unknown.

    See Also
    --------
    causal_mask : The unlimited window.

    Notes
    -----
    Local (sliding-window) attention as used by Longformer and Mistral:
    entry :math:`(i, j)` is True iff :math:`0 \le i + o - j < w`. With
    :math:`w \ge S` it equals `causal_mask`.

    References
    ----------
    .. [1] Beltagy, I., M. E. Peters, A. Cohan, "Longformer: The
       Long-Document Transformer", arXiv:2004.05150, 2020.

    Examples
    --------
    >>> from attention_ref import sliding_window_mask
    >>> sliding_window_mask(4, window=2).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    window = check_int(window, "window", minimum=1)
    rows, cols = _query_positions(n_queries, n_keys, alignment)
    distance = rows - cols
    return (distance >= 0) & (distance < window)


def padding_mask(lengths, n_keys):
    r"""Mask out padded keys: sequence ``b`` has only ``lengths[b]`` real keys.

    Parameters
    ----------
    lengths : array_like of int, shape (B,) or any batch shape
        Number of valid (non-padding) keys in each sequence.
    n_keys : int
        Padded key length, S.

    Returns
    -------
    ndarray of bool, shape (\*lengths.shape, 1, S)
        True for key positions ``j < lengths[b]``. The size-one query axis
        broadcasts against scores of shape ``(B, L, S)``; for scores with a
        head axis ``(B, H, L, S)`` insert it: ``padding_mask(...)[:, None]``.

    Raises
    ------
    TypeError
        If `lengths` does not hold integers.
    ValueError
        If a length is negative or larger than `n_keys`.

    See Also
    --------
    causal_mask : Combine with ``&`` for padded causal attention.

    Notes
    -----
    Entry :math:`(b, 0, j)` is True iff :math:`j < \ell_b`. A sequence of
    length 0 masks every key, and attention then returns zeros for it.

    Examples
    --------
    >>> from attention_ref import padding_mask
    >>> padding_mask([3, 1], 4).astype(int)
    array([[[1, 1, 1, 0]],
    <BLANKLINE>
           [[1, 0, 0, 0]]])
    """
    n_keys = check_int(n_keys, "n_keys", minimum=0)
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
    return np.arange(n_keys) < lengths[..., None, None]


def mask_to_bias(mask, dtype=np.float64):
    r"""Turn a boolean mask into an additive bias: 0 where True, ``-inf`` where False.

    Parameters
    ----------
    mask : array_like of bool, any shape
        True where attention is allowed.
    dtype : {numpy.float16, numpy.float32, numpy.float64}, optional
        Floating dtype of the bias. Default float64.

    Returns
    -------
    ndarray of `dtype`, same shape as `mask`
        0 where `mask` is True, ``-inf`` where it is False.

    Raises
    ------
    TypeError
        If `mask` is not boolean or `dtype` is not float16, float32 or float64.

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
