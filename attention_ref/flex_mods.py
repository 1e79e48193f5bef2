r"""Building blocks of `flex_attention`: functions that return a ``mask_mod`` or a ``score_mod``.

A ``mask_mod(b, h, q_idx, kv_idx)`` returns True where a query may attend to
a key; a ``score_mod(score, b, h, q_idx, kv_idx)`` returns the modified
score. `flex_attention` calls them on tiles of broadcastable integer index
arrays (``b`` (B, 1, 1, 1), ``h`` (1, H, 1, 1), ``q_idx`` (1, 1, l, 1),
``kv_idx`` (1, 1, 1, s)), so each block below is written with NumPy
operators and ufuncs. The names follow PyTorch's FlexAttention
(``and_masks``, ``or_masks``, ``noop_mask``) and the attention-gym
collection of variants.

A score function built here carries its derivative with respect to the
score as the attribute ``score_mod_grad`` (same calling convention), which
`flex_attention_backward` uses when no ``score_mod_grad`` is given.
"""

from __future__ import annotations

import numpy as np

from ._validation import as_real_array, check_choice, check_int, check_positive_real, check_window
from .masks import ALIGNMENTS, in_window

__all__ = [
    "alibi_score_mod",
    "and_masks",
    "causal_mask_mod",
    "chain_score_mods",
    "chunked_mask_mod",
    "document_mask_mod",
    "noop_mask",
    "or_masks",
    "prefix_lm_mask_mod",
    "relative_bias_score_mod",
    "sliding_window_mask_mod",
    "softcap_score_mod",
]

def _query_offset(alignment, lengths) -> int:
    """Key position of query 0: 0 top-left, ``S - L`` bottom-right (`lengths` ``(L, S)`` needed then)."""
    check_choice(alignment, "alignment", ALIGNMENTS)
    if alignment == "top-left":
        return 0
    if not isinstance(lengths, (tuple, list)) or len(lengths) != 2:
        raise ValueError(f"alignment='bottom-right' needs lengths=(L, S), the query and key counts; got {lengths!r}")
    n_queries = check_int(lengths[0], "lengths[0] (L)", minimum=0)
    n_keys = check_int(lengths[1], "lengths[1] (S)", minimum=0)
    return n_keys - n_queries


def _with_grad(score_mod, grad, name: str):
    """`score_mod` named `name`, carrying `grad` as its ``score_mod_grad``."""
    score_mod.__name__ = score_mod.__qualname__ = name
    score_mod.score_mod_grad = grad
    return score_mod


def _ones_like_score(score, b, h, q_idx, kv_idx):
    """The derivative of a score plus a term that does not depend on it: 1."""
    return np.ones_like(score)


def noop_mask(b, h, q_idx, kv_idx):
    """The ``mask_mod`` that allows every pair (FlexAttention's ``noop_mask``).

    Parameters
    ----------
    b, h, q_idx, kv_idx : ndarray of int
        Batch, head, query and key indices, broadcastable to each other.

    Returns
    -------
    ndarray of bool, shape ()
        True, which broadcasts to every pair.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import noop_mask
    >>> noop_mask(np.arange(2), 0, 0, 0)
    array(True)
    """
    return np.ones((), dtype=bool)


def _combine(mask_mods, name: str, ufunc, start: bool):
    for i, fn in enumerate(mask_mods):
        if not callable(fn):
            raise TypeError(f"{name}: argument {i} must be a mask_mod (a callable); got {type(fn).__name__}")

    def combined(b, h, q_idx, kv_idx):
        result = np.full((), start)
        for fn in mask_mods:
            result = ufunc(result, fn(b, h, q_idx, kv_idx))
        return result

    combined.__name__ = combined.__qualname__ = f"{name}({', '.join(getattr(f, '__name__', '?') for f in mask_mods)})"
    return combined


def and_masks(*mask_mods):
    """The ``mask_mod`` allowing a pair where every one of `mask_mods` does.

    Parameters
    ----------
    *mask_mods : callable
        Functions ``mask_mod(b, h, q_idx, kv_idx)`` returning booleans.
        With none, every pair is allowed (as ``noop_mask``).

    Returns
    -------
    callable
        Their elementwise AND.

    Raises
    ------
    TypeError
        If an argument is not callable.

    Examples
    --------
    A causal mask and a window of one key back:

    >>> import numpy as np
    >>> from attention_ref import and_masks, causal_mask_mod, sliding_window_mask_mod
    >>> both = and_masks(causal_mask_mod(), sliding_window_mask_mod((1, None)))
    >>> both(0, 0, np.arange(3)[:, None], np.arange(3)[None, :])
    array([[ True, False, False],
           [ True,  True, False],
           [False,  True,  True]])
    """
    return _combine(mask_mods, "and_masks", np.logical_and, True)


def or_masks(*mask_mods):
    """The ``mask_mod`` allowing a pair where any one of `mask_mods` does.

    Parameters
    ----------
    *mask_mods : callable
        Functions ``mask_mod(b, h, q_idx, kv_idx)`` returning booleans.
        With none, no pair is allowed.

    Returns
    -------
    callable
        Their elementwise OR.

    Raises
    ------
    TypeError
        If an argument is not callable.

    Examples
    --------
    Prefix-LM by hand: the first key is seen by every query, the rest causally:

    >>> import numpy as np
    >>> from attention_ref import causal_mask_mod, or_masks
    >>> def first_key(b, h, q_idx, kv_idx):
    ...     return kv_idx < 1
    >>> or_masks(first_key, causal_mask_mod())(0, 0, np.arange(3)[:, None], np.arange(3)[None, :])
    array([[ True, False, False],
           [ True,  True, False],
           [ True,  True,  True]])
    """
    return _combine(mask_mods, "or_masks", np.logical_or, False)


def causal_mask_mod(alignment="top-left", lengths=None):
    """The causal ``mask_mod``: query ``i`` sees the keys up to its position.

    Parameters
    ----------
    alignment : {"top-left", "bottom-right"}, optional
        Where the diagonal sits when ``L != S``, as `causal_alignment` in
        `scaled_dot_product_attention`: query ``i`` sits at key position
        ``i`` (top-left) or ``i + S - L`` (bottom-right).
    lengths : (int, int), optional
        ``(L, S)``, required for ``"bottom-right"``.

    Returns
    -------
    callable
        ``mask_mod(b, h, q_idx, kv_idx)``: ``kv_idx <= q_idx + offset``.

    Raises
    ------
    ValueError
        If `alignment` is not one of the two, or `lengths` is missing for
        ``"bottom-right"``.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import causal_mask_mod
    >>> i, j = np.arange(2)[:, None], np.arange(3)[None, :]
    >>> causal_mask_mod()(0, 0, i, j)
    array([[ True, False, False],
           [ True,  True, False]])
    >>> causal_mask_mod("bottom-right", lengths=(2, 3))(0, 0, i, j)
    array([[ True,  True, False],
           [ True,  True,  True]])
    """
    offset = _query_offset(alignment, lengths)

    def causal(b, h, q_idx, kv_idx):
        return in_window(q_idx + offset, kv_idx, None, 0)

    return causal


def sliding_window_mask_mod(window, alignment="top-left", lengths=None):
    """The ``mask_mod`` of local attention: keys within ``(left, right)`` of the query's position.

    Parameters
    ----------
    window : (int or None, int or None)
        ``(left, right)``: query ``i`` at position ``p_i`` sees keys
        ``p_i - left <= j <= p_i + right``; None leaves a side unbounded,
        as `window` in `scaled_dot_product_attention`.
    alignment : {"top-left", "bottom-right"}, optional
        Query positions, as in `causal_mask_mod`.
    lengths : (int, int), optional
        ``(L, S)``, required for ``"bottom-right"``.

    Returns
    -------
    callable
        The ``mask_mod``.

    Raises
    ------
    TypeError, ValueError
        If `window` is not a pair of ints >= 0 or None, or as
        `causal_mask_mod`.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import sliding_window_mask_mod
    >>> i, j = np.arange(4)[:, None], np.arange(4)[None, :]
    >>> sliding_window_mask_mod((1, 0))(0, 0, i, j).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    left, right = check_window(window)
    offset = _query_offset(alignment, lengths)

    def sliding_window(b, h, q_idx, kv_idx):
        return in_window(q_idx + offset, kv_idx, left, right)

    return sliding_window


def _ids(ids, name: str) -> np.ndarray:
    """`ids` as a 1-D (length,) or 2-D (B, length) integer array."""
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
        raise TypeError(f"{name} must be a 1-D (length,) or 2-D (B, length) integer array; got {arr.dtype} "
                        f"of shape {arr.shape}")
    return arr


def _take(arr: np.ndarray, b, idx):
    """``arr[idx]`` for a 1-D array, ``arr[b, idx]`` for a per-batch 2-D one."""
    return arr[idx] if arr.ndim == 1 else arr[b, idx]


def document_mask_mod(document_ids, kv_document_ids=None):
    """The ``mask_mod`` of a packed sequence: a query sees only the keys of its own document.

    Parameters
    ----------
    document_ids : array_like of int, shape (L,) or (B, L)
        The document (segment) of each query position, one row per batch
        entry or one shared by all.
    kv_document_ids : array_like of int, shape (S,) or (B, S), optional
        The document of each key position; default `document_ids`.

    Returns
    -------
    callable
        ``mask_mod``: ``document_ids[q_idx] == kv_document_ids[kv_idx]``.
        Combine it with `causal_mask_mod` by `and_masks` for causal
        packing.

    Raises
    ------
    TypeError
        If the ids are not 1-D or 2-D integer arrays.

    Examples
    --------
    Three tokens of document 0 and two of document 1:

    >>> import numpy as np
    >>> from attention_ref import document_mask_mod
    >>> i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    >>> document_mask_mod([0, 0, 0, 1, 1])(0, 0, i, j).astype(int)
    array([[1, 1, 1, 0, 0],
           [1, 1, 1, 0, 0],
           [1, 1, 1, 0, 0],
           [0, 0, 0, 1, 1],
           [0, 0, 0, 1, 1]])
    """
    q_docs = _ids(document_ids, "document_ids")
    kv_docs = q_docs if kv_document_ids is None else _ids(kv_document_ids, "kv_document_ids")

    def document(b, h, q_idx, kv_idx):
        return _take(q_docs, b, q_idx) == _take(kv_docs, b, kv_idx)

    return document


def prefix_lm_mask_mod(prefix_length):
    """The prefix-LM ``mask_mod``: every query sees the prefix, the rest causally.

    Parameters
    ----------
    prefix_length : int or array_like of int, shape (B,)
        Length of the bidirectional prefix, one for all or one per batch
        entry.

    Returns
    -------
    callable
        ``mask_mod``: ``kv_idx < prefix_length`` or ``kv_idx <= q_idx``.

    Raises
    ------
    TypeError, ValueError
        If `prefix_length` is not an int (or 1-D array of ints) >= 0.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import prefix_lm_mask_mod
    >>> i, j = np.arange(4)[:, None], np.arange(4)[None, :]
    >>> prefix_lm_mask_mod(2)(0, 0, i, j).astype(int)
    array([[1, 1, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 0],
           [1, 1, 1, 1]])
    """
    if np.ndim(prefix_length) == 0:
        prefix = np.asarray(check_int(prefix_length, "prefix_length", minimum=0))
    else:
        prefix = np.asarray(prefix_length)
        if prefix.dtype.kind not in "iu" or prefix.ndim != 1:
            raise TypeError(f"prefix_length must be an int >= 0 or a 1-D array of them (one per batch entry); "
                            f"got {prefix.dtype} of shape {prefix.shape}")
        if (prefix < 0).any():
            raise ValueError(f"prefix_length must be >= 0; got {prefix.min()}")

    def prefix_lm(b, h, q_idx, kv_idx):
        length = prefix if prefix.ndim == 0 else prefix[b]
        return (kv_idx < length) | (kv_idx <= q_idx)

    return prefix_lm


def chunked_mask_mod(chunk_size, causal=True):
    """The ``mask_mod`` of chunked local attention: a query sees only keys of its own chunk.

    Positions are cut into chunks of `chunk_size` (``0 .. chunk_size - 1``,
    then the next), as in Llama 4's local layers.

    Parameters
    ----------
    chunk_size : int
        Positions per chunk, >= 1.
    causal : bool, optional
        Also require ``kv_idx <= q_idx`` (default).

    Returns
    -------
    callable
        ``mask_mod``: ``q_idx // chunk_size == kv_idx // chunk_size``.

    Raises
    ------
    TypeError, ValueError
        If `chunk_size` is not an int >= 1.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import chunked_mask_mod
    >>> i, j = np.arange(4)[:, None], np.arange(4)[None, :]
    >>> chunked_mask_mod(2)(0, 0, i, j).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 0, 1, 0],
           [0, 0, 1, 1]])
    """
    size = check_int(chunk_size, "chunk_size", minimum=1)
    causal = bool(causal)

    def chunked(b, h, q_idx, kv_idx):
        same = q_idx // size == kv_idx // size
        return same & (kv_idx <= q_idx) if causal else same

    return chunked


def softcap_score_mod(softcap):
    r"""The soft-capping ``score_mod``: ``softcap * tanh(score / softcap)``.

    Parameters
    ----------
    softcap : float
        The cap ``c > 0``; scores end in ``(-c, c)``.

    Returns
    -------
    callable
        ``score_mod``, carrying its derivative
        :math:`1 - \tanh^2(s / c)` as ``score_mod_grad``.

    Raises
    ------
    TypeError, ValueError
        If `softcap` is not a finite number > 0.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import softcap_score_mod
    >>> cap = softcap_score_mod(2.0)
    >>> cap(np.array([0.0, 2.0, 100.0]), 0, 0, 0, 0)
    array([0.        , 1.52318831, 2.        ])
    >>> cap.score_mod_grad(np.array([0.0]), 0, 0, 0, 0)
    array([1.])
    """
    c = check_positive_real(softcap, "softcap")

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return c * np.tanh(score / c)

    def softcap_grad(score, b, h, q_idx, kv_idx):
        t = np.tanh(score / c)
        return 1.0 - t * t

    return _with_grad(softcap_mod, softcap_grad, "softcap")


def alibi_score_mod(slopes, alignment="top-left", lengths=None):
    r"""The ALiBi ``score_mod``: ``score - slope_h * |p_i - j|``, as `alibi_slopes` in `scaled_dot_product_attention`.

    Parameters
    ----------
    slopes : array_like of float, shape (H,)
        One slope per query head (see `alibi_slopes`).
    alignment : {"top-left", "bottom-right"}, optional
        Query positions ``p_i``, as in `causal_mask_mod`.
    lengths : (int, int), optional
        ``(L, S)``, required for ``"bottom-right"``.

    Returns
    -------
    callable
        ``score_mod``, carrying its derivative (1) as ``score_mod_grad``.

    Raises
    ------
    TypeError, ValueError
        If `slopes` is not a 1-D real array, or as `causal_mask_mod`.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import alibi_score_mod
    >>> alibi = alibi_score_mod([0.5])
    >>> alibi(np.zeros((1, 1, 2, 3)), 0, np.zeros((1, 1, 1, 1), int), np.arange(2)[:, None], np.arange(3))
    array([[[[ 0. , -0.5, -1. ],
             [-0.5,  0. , -0.5]]]])
    """
    m = as_real_array(slopes, "slopes")
    if m.ndim != 1:
        raise ValueError(f"slopes must be 1-D, one per query head; got shape {m.shape}")
    offset = _query_offset(alignment, lengths)

    def alibi(score, b, h, q_idx, kv_idx):
        distance = np.abs(q_idx + offset - kv_idx).astype(score.dtype)
        return score - m.astype(score.dtype)[h] * distance

    return _with_grad(alibi, _ones_like_score, "alibi")


def relative_bias_score_mod(table, max_distance):
    r"""The ``score_mod`` adding a learned bias per head and clipped relative position (T5, Swin).

    The term added to score ``(i, j)`` of head ``h`` is
    ``table[h, clip(j - i, -max_distance, max_distance) + max_distance]``.

    Parameters
    ----------
    table : array_like of float, shape (H, 2 * max_distance + 1) or (2 * max_distance + 1,)
        The bias of each relative position, per head or shared.
    max_distance : int
        Relative positions beyond it share the table's first or last entry.

    Returns
    -------
    callable
        ``score_mod``, carrying its derivative (1) as ``score_mod_grad``.

    Raises
    ------
    TypeError, ValueError
        If `table` is not a real array whose last axis is
        ``2 * max_distance + 1``.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import relative_bias_score_mod
    >>> rel = relative_bias_score_mod([-1.0, 0.0, 1.0], max_distance=1)
    >>> rel(np.zeros((3, 3)), 0, 0, np.arange(3)[:, None], np.arange(3)[None, :])
    array([[ 0.,  1.,  1.],
           [-1.,  0.,  1.],
           [-1., -1.,  0.]])
    """
    reach = check_int(max_distance, "max_distance", minimum=0)
    bias = as_real_array(table, "table")
    if bias.ndim not in (1, 2) or bias.shape[-1] != 2 * reach + 1:
        raise ValueError(f"table must have shape (H, {2 * reach + 1}) or ({2 * reach + 1},) for "
                         f"max_distance={reach}; got {bias.shape}")

    def relative_bias(score, b, h, q_idx, kv_idx):
        column = np.clip(kv_idx - q_idx, -reach, reach) + reach
        term = bias[column] if bias.ndim == 1 else bias[h, column]
        return score + term.astype(score.dtype)

    return _with_grad(relative_bias, _ones_like_score, "relative_bias")


def chain_score_mods(*score_mods):
    r"""The ``score_mod`` applying `score_mods` one after another, with the chain rule's derivative.

    Parameters
    ----------
    *score_mods : callable
        Functions ``score_mod(score, b, h, q_idx, kv_idx)``, applied left
        to right. Each must carry ``score_mod_grad`` for the chain to have
        one.

    Returns
    -------
    callable
        The composition; its ``score_mod_grad`` is
        :math:`\prod_t f_t'(s_{t-1})` with :math:`s_t = f_t(s_{t-1})`, or
        absent if one of `score_mods` has none.

    Raises
    ------
    TypeError
        If an argument is not callable.

    Examples
    --------
    A soft cap, then ALiBi (Gemma 2's order of a cap before other terms):

    >>> import numpy as np
    >>> from attention_ref import alibi_score_mod, chain_score_mods, softcap_score_mod
    >>> both = chain_score_mods(softcap_score_mod(1.0), alibi_score_mod([2.0]))
    >>> both(np.full((1, 1, 1, 2), 50.0), 0, np.zeros((1, 1, 1, 1), int), np.zeros((1, 1, 1, 1), int), np.arange(2))
    array([[[[ 1., -1.]]]])
    """
    for i, fn in enumerate(score_mods):
        if not callable(fn):
            raise TypeError(f"chain_score_mods: argument {i} must be a score_mod (a callable); got {type(fn).__name__}")

    def chained(score, b, h, q_idx, kv_idx):
        for fn in score_mods:
            score = fn(score, b, h, q_idx, kv_idx)
        return score

    def chained_grad(score, b, h, q_idx, kv_idx):
        grad = np.ones_like(score)
        for fn in score_mods:
            grad = grad * fn.score_mod_grad(score, b, h, q_idx, kv_idx)
            score = fn(score, b, h, q_idx, kv_idx)
        return grad

    name = f"chain_score_mods({', '.join(getattr(f, '__name__', '?') for f in score_mods)})"
    has_grad = all(callable(getattr(fn, "score_mod_grad", None)) for fn in score_mods)
    chained.__name__ = chained.__qualname__ = name
    if has_grad:
        chained.score_mod_grad = chained_grad
    return chained
