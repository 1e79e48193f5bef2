"""Variable-length (packed) attention: many sequences in one array, as FlashAttention's varlen API takes them."""

from __future__ import annotations

import numpy as np

from ._options import DESCALES
from ._validation import as_real_array, check_bool, check_exact_ndim
from .attention import scaled_dot_product_attention

__all__ = ["varlen_attention"]

#: Options of `scaled_dot_product_attention` that describe an (L, S) matrix of one call, not of each sequence.
_PER_PAIR_OPTIONS = ("mask", "bias")


def check_cu_seqlens(cu_seqlens, name: str, total: int, axis_name: str) -> np.ndarray:
    """Return `cu_seqlens` as a 1-D int64 array of offsets ``0 = c_0 <= c_1 <= ... <= c_B = total``."""
    try:
        arr = np.asarray(cu_seqlens)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name} must be a 1-D array of integer offsets; got {type(cu_seqlens).__name__}: {exc}"
        ) from None
    if arr.size == 0 and arr.dtype == np.float64:
        arr = arr.astype(np.int64)  # an empty list: the shape check below names the problem
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (cumulative sequence offsets); got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"{name} must be 1-D with batch + 1 entries (0, then each sequence's end); got shape {arr.shape}"
        )
    arr = arr.astype(np.int64)
    if arr[0] != 0:
        raise ValueError(f"{name} must start at 0; got {name}[0] = {arr[0]}")
    steps = np.diff(arr)
    if steps.size and steps.min() < 0:
        i = int(np.argmax(steps < 0))
        raise ValueError(
            f"{name} must be non-decreasing (sequence lengths >= 0); got {name}[{i}] = {arr[i]} "
            f"> {name}[{i + 1}] = {arr[i + 1]}"
        )
    if arr[-1] != total:
        raise ValueError(
            f"{name} must end at the total number of {axis_name}, {total}; got {name}[-1] = {arr[-1]}"
        )
    return arr


def reject_per_pair_options(options: dict, function: str) -> None:
    """Raise TypeError if `options` hold ``mask`` or ``bias``, which a batch of sequences does not have."""
    for name in _PER_PAIR_OPTIONS:
        if name in options:
            raise TypeError(
                f"{function} does not take {name}: it is an (L, S) matrix of one call, which a packed "
                f"batch does not have; use is_causal, window or alibi_slopes, or call "
                f"scaled_dot_product_attention on each sequence"
            )


def sequence_options(options: dict, b: int) -> dict:
    """The options of sequence `b` of a batch: row b of each (B, Hkv) descale, entry b of a list of keep-masks.

    Every other option, and a descale that is a scalar or per head, is the whole batch's. A ValueError names
    the option when it has no entry `b`.
    """
    mine = dict(options)
    given = options.get("dropout_mask")
    if isinstance(given, (list, tuple)):  # one keep-mask per sequence
        if b >= len(given):
            raise ValueError(f"dropout_mask must hold one keep-mask per sequence; got {len(given)} for more")
        mine["dropout_mask"] = given[b]
    for name in DESCALES:
        if options.get(name) is not None and np.ndim(options[name]) == 2:  # (B, Hkv): one factor per head
            factors = np.asarray(options[name])
            if b >= len(factors):
                raise ValueError(f"{name} must have one row per sequence; got shape {factors.shape} for more")
            mine[name] = factors[b]
    return mine


def attend_each(parts, options: dict, return_lse: bool) -> tuple[list, list, list]:
    """Call `scaled_dot_product_attention` on every ``(q_b, k_b, v_b)`` of `parts`, each a call of its own.

    Returns the lists of the outputs, of the weights (None entries unless
    ``options["return_weights"]``) and of the log-sum-exps (None entries
    unless `return_lse`). `parts` may be a generator: one sequence's keys
    are then held at a time. Each sequence gets its own options (`sequence_options`).
    """
    return_weights = check_bool(options.get("return_weights", False), "return_weights")
    outs, weights, lses = [], [], []
    for b, (q_b, k_b, v_b) in enumerate(parts):
        result = scaled_dot_product_attention(q_b, k_b, v_b, return_lse=return_lse, **sequence_options(options, b))
        out, *rest = result if return_weights or return_lse else (result,)
        outs.append(out)
        weights.append(rest[0] if return_weights else None)
        lses.append(rest[-1] if return_lse else None)
    given = options.get("dropout_mask")
    if isinstance(given, (list, tuple)) and len(given) != len(outs):
        raise ValueError(f"dropout_mask must hold one keep-mask per sequence, {len(outs)}; got {len(given)}")
    for name in DESCALES:
        if options.get(name) is not None and np.ndim(options[name]) == 2 and len(options[name]) != len(outs):
            raise ValueError(f"{name} must have one row per sequence, {len(outs)}; "
                             f"got shape {np.shape(options[name])}")
    return outs, weights, lses


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, return_lse=False, **options):
    r"""Attention over a packed batch of sequences of different lengths.

    Sequence ``b`` owns queries ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and
    keys/values ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` (FlashAttention's
    ``cu_seqlens`` convention); its queries see only its own keys, and every
    option (causal mask, window, ALiBi, sinks, ...) applies to each sequence
    as if it were a call of its own.

    Parameters
    ----------
    q : array_like, shape (H, total_q, E)
        Queries of all sequences, concatenated along axis -2.
    k : array_like, shape (Hkv, total_k, E)
        Keys of all sequences, concatenated along axis -2.
    v : array_like, shape (Hkv, total_k, Ev)
        Values, aligned with `k`.
    cu_seqlens_q : array_like of int, shape (B + 1,)
        Cumulative query offsets: 0, then the end of each sequence; it must
        be non-decreasing and end at ``total_q``. Zero-length sequences are
        allowed.
    cu_seqlens_k : array_like of int, shape (B + 1,)
        Cumulative key offsets, likewise, ending at ``total_k``.
    return_lse : bool, optional
        Also return each query's log-sum-exp, as
        `scaled_dot_product_attention` returns it for its sequence.
    **options
        Keyword arguments of `scaled_dot_product_attention`, passed to it
        unchanged for every sequence: ``is_causal``, ``causal_alignment``,
        ``scale``, ``enable_gqa``, ``return_weights``, ``dropout_p`` with
        ``rng`` or ``dropout_mask`` (a list of one keep-mask per sequence,
        each broadcastable to ``(H, Lq_b, Sk_b)``), and ``softcap``,
        ``window``, ``alibi_slopes`` and ``sinks``; for fp8 input
        ``q_descale``, ``k_descale`` and ``v_descale``, scalars or of shape
        ``(B, Hkv)``, row ``b`` for sequence ``b``. ``mask`` and ``bias``
        are not accepted: they are (L, S) matrices of one call, which a
        packed batch does not have.

    Returns
    -------
    out : ndarray, shape (H, total_q, Ev)
        The attention output of every sequence, packed like `q`, in the
        dtype `scaled_dot_product_attention` gives. Queries of a sequence
        with no keys get zeros.
    weights : list of ndarray
        Only with ``return_weights=True``: for sequence ``b`` an array of
        shape ``(H, Lq_b, Sk_b)``, its lengths taken from `cu_seqlens_q` and
        `cu_seqlens_k`.
    lse : ndarray, shape (H, total_q)
        Only with ``return_lse=True`` (last): the natural-log log-sum-exp of
        every query, packed like `q`; ``-inf`` (or the sink's logit) for
        the queries of a sequence with no keys.

    Raises
    ------
    TypeError
        If `mask` or `bias` is given, if a ``cu_seqlens`` does not hold
        integers, or as `scaled_dot_product_attention` raises.
    ValueError
        If `q`, `k` or `v` is not 3-D, if a ``cu_seqlens`` is not 1-D, does
        not start at 0, decreases, or does not end at the packed length, if
        the two ``cu_seqlens`` describe different numbers of sequences, or as
        `scaled_dot_product_attention` raises.

    See Also
    --------
    scaled_dot_product_attention : What runs on each sequence.
    padding_mask : The padded alternative: one (B, L, S) batch with masked keys.

    Notes
    -----
    With :math:`c^q` and :math:`c^k` the offsets, sequence :math:`b` has
    queries :math:`Q_b = Q[c^q_b : c^q_{b+1}]` and keys and values
    :math:`K_b, V_b = K, V[c^k_b : c^k_{b+1}]`, and

    .. math::

        O[c^q_b : c^q_{b+1}] = \operatorname{Attention}(Q_b, K_b, V_b),

    which is exactly a loop of `scaled_dot_product_attention` calls, so a
    causal mask or a window is aligned with each sequence's own lengths
    (``causal_alignment="bottom-right"`` puts the last query of each
    sequence on its last key, as FlashAttention does for
    ``flash_attn_varlen_func``). Packing avoids the padding of a (B, L, S)
    batch: no score is computed between tokens of different sequences.

    References
    ----------
    .. [1] Dao, T., "FlashAttention-2: Faster Attention with Better
       Parallelism and Work Partitioning", ICLR, 2024.

    Examples
    --------
    Two sequences of 2 and 1 tokens packed together; the causal mask starts
    afresh at each sequence:

    >>> import numpy as np
    >>> from attention_ref import varlen_attention
    >>> q = k = np.ones((1, 3, 2))
    >>> v = np.array([[[1.0], [3.0], [10.0]]])
    >>> varlen_attention(q, k, v, [0, 2, 3], [0, 2, 3], is_causal=True)
    array([[[ 1.],
            [ 2.],
            [10.]]])
    >>> out, weights = varlen_attention(q, k, v, [0, 2, 3], [0, 2, 3], return_weights=True)
    >>> [w.shape for w in weights]
    [(1, 2, 2), (1, 1, 1)]
    >>> out, lse = varlen_attention(q, k, v, [0, 2, 3], [0, 2, 3], is_causal=True, return_lse=True)
    >>> lse
    array([[1.41421356, 2.10736074, 1.41421356]])
    """
    reject_per_pair_options(options, "varlen_attention")
    return_lse = check_bool(return_lse, "return_lse")
    q = as_real_array(q, "q", fp8=True)
    k = as_real_array(k, "k", fp8=True)
    v = as_real_array(v, "v", fp8=True)
    check_exact_ndim(q, "q", 3, "(H, total_q, E)")
    check_exact_ndim(k, "k", 3, "(Hkv, total_k, E)")
    check_exact_ndim(v, "v", 3, "(Hkv, total_k, Ev)")
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[-2], "queries (q.shape[-2])")
    cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[-2], "keys (k.shape[-2])")
    if cu_q.size != cu_k.size:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got "
            f"{cu_q.size - 1} and {cu_k.size - 1} (lengths {cu_q.size} and {cu_k.size})"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys (axis -2); got k {k.shape} and v {v.shape}")
    return_weights = check_bool(options.get("return_weights", False), "return_weights")

    bounds = zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:], strict=True)
    parts = ((q[:, q0:q1], k[:, k0:k1], v[:, k0:k1]) for q0, q1, k0, k1 in bounds)
    outs, weights, lses = attend_each(parts, options, return_lse)
    if not outs:  # no sequences: run the checks of one empty call for the shape and dtype
        outs, _, lses = attend_each([(q, k[:, :0], v[:, :0])], options | {"return_weights": False}, return_lse)
    results = (np.concatenate(outs, axis=-2),)
    if return_weights:
        results += (weights,)
    if return_lse:
        results += (np.concatenate(lses, axis=-1),)
    return results if len(results) > 1 else results[0]
