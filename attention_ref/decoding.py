"""Incremental decoding: a key/value cache and one attention step over it."""

from __future__ import annotations

import numpy as np

from ._options import NORMALIZATION, takes_options
from ._validation import as_real_array, check_int, check_ndim, check_window, result_dtype
from .attention import scaled_dot_product_attention

__all__ = ["KVCache", "decode_step"]


class KVCache:
    r"""Keys and values of the positions decoded so far, grown in place.

    Autoregressive decoding computes the keys and values of each position
    once and stores them; every later step attends its new queries to all
    stored positions. The cache keeps them in buffers whose length doubles
    when full, so appending ``T`` positions one at a time copies
    :math:`O(T)` elements in total rather than :math:`O(T^2)`. With
    `max_len` it is a sliding-window cache that keeps only the most recent
    `max_len` positions, as local-attention models do at inference.

    Parameters
    ----------
    k : array_like, shape (..., S, E), optional
        Initial keys (e.g. a prompt's). Equivalent to calling
        ``append(k, v)`` on an empty cache; give both or neither.
    v : array_like, shape (..., S, Ev), optional
        Initial values.
    max_len : int, optional
        Keep only the `max_len` most recent positions (>= 1); older ones
        are dropped as new ones arrive. Default: keep every position.
        `decode_step` then attends each query to its `max_len` most recent
        positions, itself included.

    Attributes
    ----------
    keys : ndarray, shape (..., len(cache), E), or None
        Read-only view of the cached keys; None before the first append.
    values : ndarray, shape (..., len(cache), Ev), or None
        Read-only view of the cached values; None before the first append.
    capacity : int
        Number of positions the buffers hold before they must be
        reallocated.
    max_len : int or None
        The window given at construction.

    Raises
    ------
    ValueError, TypeError
        As `append`, for the initial `k` and `v`; ValueError if only one of
        them is given or `max_len` < 1; TypeError if `max_len` is not an
        integer.

    See Also
    --------
    decode_step : Append to the cache and attend in one call.
    sliding_window_mask : The attention pattern a `max_len` cache gives.

    Notes
    -----
    The first append fixes the leading (batch, head) shape and the key and
    value sizes ``E`` and ``Ev``; later appends must match them. The dtype
    is the promotion of everything appended (appending float64 to a
    float32 cache upgrades the whole cache to float64). Views returned by
    `keys` and `values` are read-only snapshots: after the buffers grow,
    an old view still shows the positions it showed before.

    With `max_len` = :math:`w` the buffers stop growing at about
    :math:`2w` positions (plus the size of the largest append): when they
    are full, the :math:`w` retained positions move to the front of a new
    buffer, which happens at most once per :math:`w` appended positions,
    so appends still copy :math:`O(1)` elements per position on average.
    `len` counts the retained positions, at most :math:`w`.

    A model with local attention, ``window=(left, right)`` in `decode_step`
    (the right side is moot: decoding is causal), never looks further back
    than `left` positions, so only the last ``left + 1`` positions, the
    query's own included, are ever needed: ``KVCache(max_len=left + 1)``
    gives the same outputs as a cache that keeps everything, in
    :math:`O(\mathrm{left})` memory. Conversely `max_len` = :math:`w`
    alone acts as the window ``(w - 1, 0)``; with both, the narrower one
    applies. A smaller `max_len` than ``left + 1`` therefore changes the
    result, a larger one only costs memory.

    References
    ----------
    .. [1] Pope, R., S. Douglas, A. Chowdhery, J. Devlin, J. Bradbury,
       A. Levskaya, J. Heek, K. Xiao, S. Agrawal and J. Dean, "Efficiently
       Scaling Transformer Inference", arXiv:2211.05102, 2022.
    .. [2] Beltagy, I., M. E. Peters and A. Cohan, "Longformer: The
       Long-Document Transformer", arXiv:2004.05150, 2020.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import KVCache
    >>> cache = KVCache()
    >>> len(cache), cache.keys
    (0, None)
    >>> cache.append(np.zeros((2, 3)), np.ones((2, 1)))  # two positions, E = 3, Ev = 1
    >>> cache.append(np.full((1, 3), 7.0), np.full((1, 1), 5.0))
    >>> len(cache)
    3
    >>> cache.keys
    array([[0., 0., 0.],
           [0., 0., 0.],
           [7., 7., 7.]])
    >>> cache.values[:, 0]
    array([1., 1., 5.])

    A sliding-window cache keeps the newest positions only:

    >>> window = KVCache(max_len=2)
    >>> window.append(np.arange(3.0)[:, None], np.zeros((3, 1)))
    >>> len(window), window.keys[:, 0]
    (2, array([1., 2.]))
    """

    def __init__(self, k=None, v=None, *, max_len=None):
        self._k = None  # buffer (..., capacity, E); the cache is buffer[..., start:end, :]
        self._v = None  # buffer (..., capacity, Ev)
        self._start = 0
        self._end = 0
        self._max_len = None if max_len is None else check_int(max_len, "max_len", minimum=1)
        if (k is None) != (v is None):
            raise ValueError("give both k and v to start a KVCache with positions, or neither")
        if k is not None:
            self.append(k, v)

    def __len__(self) -> int:
        return self._end - self._start

    def __repr__(self) -> str:
        if self._k is None:
            return "KVCache(empty)"
        return (
            f"KVCache(len={len(self)}, capacity={self.capacity}, max_len={self._max_len}, "
            f"keys {self.keys.shape}, values {self.values.shape}, dtype={self._k.dtype})"
        )

    @property
    def capacity(self) -> int:
        """Positions the buffers can hold before the next reallocation (0 while empty)."""
        return 0 if self._k is None else self._k.shape[-2]

    @property
    def max_len(self) -> int | None:
        """The most positions the cache retains, or None if it keeps them all."""
        return self._max_len

    @property
    def keys(self):
        """Read-only view of the cached keys, shape (..., len(cache), E); None before the first append."""
        return None if self._k is None else self._recent(len(self))[0]

    @property
    def values(self):
        """Read-only view of the cached values, shape (..., len(cache), Ev); None before the first append."""
        return None if self._v is None else self._recent(len(self))[1]

    def _recent(self, m):
        """Read-only views of the last `m` positions written to the buffers.

        Right after an append these may reach back past the retained window
        (positions dropped by that append are still in the buffer), which
        `decode_step` uses to attend the first new queries.
        """
        span = slice(self._end - m, self._end)
        return _read_only(self._k[..., span, :]), _read_only(self._v[..., span, :])

    def append(self, k, v) -> None:
        """Store new positions after the cached ones.

        The buffers double in length when full, so this copies only `k`
        and `v` except on the rare calls that grow the buffers.

        Parameters
        ----------
        k : array_like, shape (..., T, E)
            Keys of the ``T`` new positions.
        v : array_like, shape (..., T, Ev)
            Their values.

        Raises
        ------
        TypeError
            If `k` or `v` is not real (boolean, complex, non-numeric).
        ValueError
            If `k` or `v` has fewer than 2 dimensions, they disagree in
            leading shape or ``T``, or they do not match the leading shape,
            ``E`` or ``Ev`` already in the cache.

        See Also
        --------
        decode_step : Append and attend in one call.

        Examples
        --------
        >>> import numpy as np
        >>> from attention_ref import KVCache
        >>> cache = KVCache()
        >>> cache.append(np.ones((2, 4, 8)), np.ones((2, 4, 8)))  # 2 heads, 4 positions
        >>> cache.append(np.ones((2, 1, 8)), np.ones((2, 1, 8)))
        >>> len(cache), cache.keys.shape, cache.capacity
        (5, (2, 5, 8), 8)
        """
        k = as_real_array(k, "k")
        v = as_real_array(v, "v")
        check_ndim(k, "k", 2, "(..., T, E)")
        check_ndim(v, "v", 2, "(..., T, Ev)")
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(
                f"k and v must have the same leading shape and number of new positions T (all axes but "
                f"the last); got k {k.shape} and v {v.shape}"
            )
        if self._k is not None:
            _check_fits(k, "k", self._k, "keys")
            _check_fits(v, "v", self._v, "values")
        t = k.shape[-2]
        # The promotion of the attention functions: bfloat16 with float16 gives float32 (NumPy would raise).
        dtype = result_dtype(k, v)[0] if self._k is None else result_dtype(self._k, k, v)[0]
        if self._k is None or self._end + t > self.capacity or dtype != self._k.dtype:
            # Doubling gives O(1) amortised copies per position; a window caps the buffers at about 2 max_len.
            limit = 2 * self.capacity if self._max_len is None else min(2 * self.capacity, 2 * self._max_len)
            capacity = max(len(self) + t, limit)
            kept = slice(self._start, self._end)  # the retained positions move to the front
            self._k = _regrown(self._k, kept, k.shape, capacity, dtype)
            self._v = _regrown(self._v, kept, v.shape, capacity, dtype)
            self._start, self._end = 0, len(self)
        end = self._end + t
        self._k[..., self._end : end, :] = k
        self._v[..., self._end : end, :] = v
        self._end = end
        if self._max_len is not None:
            self._start = max(self._start, end - self._max_len)

    def _state(self):
        """The buffers and window; restoring them undoes later appends (which never write before `end`)."""
        return self._k, self._v, self._start, self._end

    def _restore(self, state) -> None:
        self._k, self._v, self._start, self._end = state


def _read_only(view):
    view.flags.writeable = False
    return view


def _regrown(buffer, kept, shape, capacity, dtype):
    """A new buffer of `capacity` positions for arrays shaped like `shape`, starting with ``buffer[..., kept, :]``."""
    new = np.empty((*shape[:-2], capacity, shape[-1]), dtype=dtype)
    if buffer is not None:
        old = buffer[..., kept, :]
        new[..., : old.shape[-2], :] = old
    return new


def _check_fits(new, name, buffer, what):
    """Raise ValueError unless `new` (..., T, D) matches `buffer` (..., capacity, D) but for T."""
    if new.shape[:-2] != buffer.shape[:-2] or new.shape[-1] != buffer.shape[-1]:
        expected = (*buffer.shape[:-2], "T", buffer.shape[-1])
        raise ValueError(
            f"{name} must have shape {expected} to match the cached {what} "
            f"(same leading axes and last axis); got {new.shape}"
        )


@takes_options("window", "scale", "softcap", "alibi_slopes", "sinks", "enable_gqa", *NORMALIZATION)
def decode_step(q, k, v, cache, *, return_weights=False, **options):
    r"""One decoding step: cache the new keys and values, then attend the new queries to every cached position.

    Call it once with the whole prompt (prefill), then once per generated
    token; each call returns exactly the rows that full causal attention
    over the sequence so far would give for the new positions (with a
    ``KVCache(max_len=w)``: full attention under
    ``sliding_window_mask(..., window=w)``).

    Parameters
    ----------
    q : array_like, shape (..., T, E)
        Queries of the ``T`` newest positions: the whole prompt for the
        first call (prefill), then usually ``T = 1``.
    k : array_like, shape (..., T, E)
        Keys of the same positions; appended to `cache`.
    v : array_like, shape (..., T, Ev)
        Their values; appended to `cache`.
    cache : KVCache
        The cache, modified in place. If the step raises, it is left as it
        was before the call. If it has a `max_len`, each query sees only
        its `max_len` most recent positions, itself included.
    scale : float, optional
        Multiplier of the scores; default ``1 / sqrt(E)``.
    window : (int or None, int or None), optional
        Local attention ``(left, right)``: each query sees its `left` most
        recent positions besides itself (the right side is at most 0, as
        decoding is causal). Combined with the cache's `max_len`, the
        narrower applies; see `KVCache`.
    softcap : float, optional
        Soft cap ``c > 0`` of the scaled scores, ``c * tanh(scores / c)``.
    alibi_slopes : array_like of float, optional
        ALiBi slopes per head, broadcastable to the batch and head axes
        ``(..., H)``. The distance is counted from each new query's
        position to the cached ones, so the steps equal full ALiBi
        attention.
    sinks : array_like of float, optional
        Attention-sink logits per head, broadcastable to ``(..., H)``.
    enable_gqa : bool, optional
        Grouped-query attention: the cache may hold fewer heads (axis -3)
        than `q`; query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
    normalization : {"softmax", "sigmoid"}, optional
        How scores become weights, as in `scaled_dot_product_attention`.
    sigmoid_bias : float, optional
        The sigmoid's bias; default ``-log S``, ``S`` the positions the
        step attends to. Only with ``normalization="sigmoid"``.
    return_weights : bool, optional
        Also return the attention weights over all cached positions.

    Returns
    -------
    out : ndarray, shape (..., T, Ev)
        Attention output of the new positions.
    weights : ndarray, shape (..., T, S)
        Only with ``return_weights=True``. ``S = len(cache)`` after the
        append; with a `max_len`, ``S`` is the number of positions cached
        before the call plus ``T`` (the window of the earliest new query
        may reach back past what the cache keeps afterwards).

    Raises
    ------
    TypeError
        If `cache` is not a `KVCache`, or as `scaled_dot_product_attention`.
    ValueError
        If `q` and `k` differ in ``T``, `k` or `v` do not fit the cache (see
        `KVCache.append`), or as `scaled_dot_product_attention`.

    See Also
    --------
    KVCache : The cache this appends to.
    scaled_dot_product_attention : Called with bottom-right ``is_causal``.
    causal_mask : Shows the bottom-right alignment.
    sliding_window_mask : The pattern of a cache with `max_len` or of a `window`.

    Notes
    -----
    After the append the cache holds :math:`S` positions and the new
    queries are positions :math:`S - T, \dots, S - 1`. Query :math:`i` of
    the step may attend to key :math:`j` iff :math:`j \le i + S - T`: the
    bottom-right causal mask. So every row equals the matching row of full
    causal attention over the whole sequence, whatever the split into
    steps, while each step costs :math:`O(T S)` instead of
    :math:`O(S^2)`.

    A cache with `max_len` = :math:`w` held :math:`m \le w` positions
    before the call; the step attends to those and the :math:`T` new ones
    (:math:`S = m + T`) with the window ``(w - 1, 0)`` aligned bottom-right,
    the pattern of ``sliding_window_mask(T, S, window=w,
    alignment="bottom-right")``: query :math:`i` sees key :math:`j` iff
    :math:`0 \le i + S - T - j < w`. The cache then keeps the last
    :math:`w`, which are all that any later query can see.

    References
    ----------
    .. [1] Pope, R. et al., "Efficiently Scaling Transformer Inference",
       MLSys, 2023.

    Examples
    --------
    Prefill three positions, then decode one more; the rows match full
    causal attention over the four positions:

    >>> import numpy as np
    >>> from attention_ref import KVCache, decode_step, scaled_dot_product_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 4, 2))
    >>> cache = KVCache()
    >>> first = decode_step(q[:3], k[:3], v[:3], cache)
    >>> last = decode_step(q[3:], k[3:], v[3:], cache)
    >>> len(cache)
    4
    >>> full = scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> bool(np.allclose(np.concatenate([first, last]), full, rtol=0, atol=1e-12))
    True

    The first position sees only itself, so its output is its own value:

    >>> bool(np.array_equal(first[0], v[0]))
    True

    A window of one position back needs a cache of two positions only:

    >>> small = KVCache(max_len=2)
    >>> steps = [decode_step(q[i : i + 1], k[i : i + 1], v[i : i + 1], small, window=(1, 0)) for i in range(4)]
    >>> local = scaled_dot_product_attention(q, k, v, is_causal=True, window=(1, 0))
    >>> len(small), bool(np.allclose(np.concatenate(steps), local, rtol=0, atol=1e-12))
    (2, True)
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache; got {type(cache).__name__}")
    q = as_real_array(q, "q")
    check_ndim(q, "q", 2, "(..., T, E)")
    k = as_real_array(k, "k")
    check_ndim(k, "k", 2, "(..., T, E)")
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"q and k must hold the same number of new positions T (axis -2); got q {q.shape} and k {k.shape}"
        )
    before = cache._state()
    n_keys = len(cache) + k.shape[-2]  # what was cached plus the new positions
    cache.append(k, v)
    try:
        keys, values = cache._recent(n_keys)
        # The new positions are the last of the keys: causal, bottom-right, within what the cache keeps.
        window = _cache_window(options.pop("window"), cache.max_len)
        return scaled_dot_product_attention(q, keys, values, is_causal=True, causal_alignment="bottom-right",
                                            window=window, return_weights=return_weights, **options)
    except Exception:
        cache._restore(before)
        raise


def _cache_window(window, max_len):
    """The window of a decoding step: `window` with its left side narrowed to ``max_len - 1`` by a sliding cache."""
    left, right = (None, None) if window is None else check_window(window)
    if max_len is not None:
        left = max_len - 1 if left is None else min(left, max_len - 1)
    return None if left is None and right is None else (left, right)
