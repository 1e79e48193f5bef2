"""Incremental decoding: a key/value cache and one attention step over it."""

from __future__ import annotations

import numpy as np

from ._validation import as_real_array, check_ndim
from .attention import scaled_dot_product_attention

__all__ = ["KVCache", "decode_step"]


class KVCache:
    r"""Keys and values of the positions decoded so far, grown in place.

    Autoregressive decoding computes the keys and values of each position
    once and stores them; every later step attends its new queries to all
    stored positions. The cache keeps them in buffers whose length doubles
    when full, so appending ``T`` positions one at a time copies
    :math:`O(T)` elements in total rather than :math:`O(T^2)`.

    Parameters
    ----------
    k : array_like, shape (..., S, E), optional
        Initial keys (e.g. a prompt's). Equivalent to calling
        ``append(k, v)`` on an empty cache; give both or neither.
    v : array_like, shape (..., S, Ev), optional
        Initial values.

    Attributes
    ----------
    keys : ndarray, shape (..., len(cache), E), or None
        Read-only view of the cached keys; None before the first append.
    values : ndarray, shape (..., len(cache), Ev), or None
        Read-only view of the cached values; None before the first append.
    capacity : int
        Number of positions the buffers hold before they must grow.

    Raises
    ------
    ValueError, TypeError
        As `append`, for the initial `k` and `v`; ValueError if only one of
        them is given.

    See Also
    --------
    decode_step : Append to the cache and attend in one call.

    Notes
    -----
    The first append fixes the leading (batch, head) shape and the key and
    value sizes ``E`` and ``Ev``; later appends must match them. The dtype
    is the promotion of everything appended (appending float64 to a
    float32 cache upgrades the whole cache to float64). Views returned by
    `keys` and `values` are read-only snapshots: after the buffers grow,
    an old view still shows the positions it showed before.

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
    """

    def __init__(self, k=None, v=None):
        self._k = None  # buffer (..., capacity, E)
        self._v = None  # buffer (..., capacity, Ev)
        self._n = 0
        if (k is None) != (v is None):
            raise ValueError("give both k and v to start a KVCache with positions, or neither")
        if k is not None:
            self.append(k, v)

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        if self._k is None:
            return "KVCache(empty)"
        return (
            f"KVCache(len={self._n}, capacity={self.capacity}, keys {self.keys.shape}, "
            f"values {self.values.shape}, dtype={self._k.dtype})"
        )

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[-2]

    @property
    def keys(self):
        return None if self._k is None else _read_only(self._k[..., : self._n, :])

    @property
    def values(self):
        return None if self._v is None else _read_only(self._v[..., : self._n, :])

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
        n, t = self._n, k.shape[-2]
        dtype = np.result_type(k, v) if self._k is None else np.result_type(self._k, k, v)
        if self._k is None or n + t > self.capacity or dtype != self._k.dtype:
            capacity = max(n + t, 2 * self.capacity)  # doubling: O(1) amortised copies per position
            self._k = _regrown(self._k, n, k.shape, capacity, dtype)
            self._v = _regrown(self._v, n, v.shape, capacity, dtype)
        self._k[..., n : n + t, :] = k
        self._v[..., n : n + t, :] = v
        self._n = n + t

    def _state(self):
        """The buffers and length; restoring them undoes later appends."""
        return self._k, self._v, self._n

    def _restore(self, state) -> None:
        self._k, self._v, self._n = state


def _read_only(view):
    view.flags.writeable = False
    return view


def _regrown(buffer, n, shape, capacity, dtype):
    """A new buffer of `capacity` positions for arrays shaped like `shape`, holding ``buffer[..., :n, :]``."""
    new = np.empty((*shape[:-2], capacity, shape[-1]), dtype=dtype)
    if buffer is not None:
        new[..., :n, :] = buffer[..., :n, :]
    return new


def _check_fits(new, name, buffer, what):
    """Raise ValueError unless `new` (..., T, D) matches `buffer` (..., capacity, D) but for T."""
    if new.shape[:-2] != buffer.shape[:-2] or new.shape[-1] != buffer.shape[-1]:
        expected = (*buffer.shape[:-2], "T", buffer.shape[-1])
        raise ValueError(
            f"{name} must have shape {expected} to match the cached {what} "
            f"(same leading axes and last axis); got {new.shape}"
        )


def decode_step(q, k, v, cache, *, scale=None, enable_gqa=False, return_weights=False):
    r"""One decoding step: cache the new keys and values, then attend the new queries to every cached position.

    Call it once with the whole prompt (prefill), then once per generated
    token; each call returns exactly the rows that full causal attention
    over the sequence so far would give for the new positions.

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
        was before the call.
    scale : float, optional
        Multiplier of the scores; default ``1 / sqrt(E)``.
    enable_gqa : bool, optional
        Grouped-query attention: the cache may hold fewer heads (axis -3)
        than `q`; query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
    return_weights : bool, optional
        Also return the attention weights over all cached positions.

    Returns
    -------
    out : ndarray, shape (..., T, Ev)
        Attention output of the new positions.
    weights : ndarray, shape (..., T, S)
        Only with ``return_weights=True``; ``S = len(cache)`` after the
        append.

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

    Notes
    -----
    After the append the cache holds :math:`S` positions and the new
    queries are positions :math:`S - T, \dots, S - 1`. Query :math:`i` of
    the step may attend to key :math:`j` iff :math:`j \le i + S - T`: the
    bottom-right causal mask. So every row equals the matching row of full
    causal attention over the whole sequence, whatever the split into
    steps, while each step costs :math:`O(T S)` instead of
    :math:`O(S^2)`.

    References
    ----------
    .. [1] R. Pope et al., "Efficiently Scaling Transformer Inference",
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
    cache.append(k, v)
    try:
        return scaled_dot_product_attention(
            q,
            cache.keys,
            cache.values,
            is_causal=True,
            causal_alignment="bottom-right",
            scale=scale,
            enable_gqa=enable_gqa,
            return_weights=return_weights,
        )
    except Exception:
        cache._restore(before)
        raise
