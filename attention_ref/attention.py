"""Scaled dot-product attention, the dense reference: the equation, on the problem `prepare_attention` checks."""

from __future__ import annotations

import numpy as np

from ._attention_problem import AttentionProblem, prepare_attention, problem_scores
from ._kernel import dense_attention
from ._normalization import needs_softmax
from ._online import online_softmax
from ._options import takes_options
from ._validation import check_bool
from .softmax import softmax

__all__ = ["scaled_dot_product_attention"]


def _weights(p: AttentionProblem) -> np.ndarray:
    """Attention weights, shape (..., L, S): the softmax of the scores, with the sinks in the denominator
    (or the problem's elementwise normalization of each score, as the sigmoid)."""
    scores = problem_scores(p)
    if p.normalization is not None:
        return p.normalization.weights(scores)
    if p.sinks is None:
        return softmax(scores, axis=-1)
    sinks = p.sinks[..., None, None]  # (..., H, 1, 1)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN or +inf scores: NaN rows, no warning
        # The sink is one more term of the row, so the shift includes it, and a row with
        # every key masked divides zeros by exp(0) = 1: zero weights, zero output.
        top = np.maximum(scores.max(axis=-1, keepdims=True, initial=-np.inf), sinks)
        scores = np.exp(scores - top)
        return scores / (scores.sum(axis=-1, keepdims=True) + np.exp(sinks - top))


@takes_options()
def scaled_dot_product_attention(q, k, v, *, return_weights=False, return_lse=False, **options):
    r"""Scaled dot-product attention: ``softmax(q k^T * scale + bias) v``.

    Parameters
    ----------
    q : array_like, shape (..., L, E)
        Queries. Leading axes (batch, heads on axis -3) broadcast against
        those of `k`, `v`, `mask` and `bias`.
    k : array_like, shape (..., S, E)
        Keys.
    v : array_like, shape (..., S, Ev)
        Values; ``Ev`` may differ from ``E``.
    mask : array_like of bool, shape broadcastable to (..., L, S), optional
        True where query ``i`` may attend to key ``j`` (PyTorch's polarity).
        It is turned into an additive 0 / ``-inf`` term, never multiplied.
    bias : array_like of float, shape broadcastable to (..., L, S), optional
        Additive term on the scaled scores (ALiBi, relative positions, a
        float mask).
    is_causal : bool, optional
        Also apply `causal_mask` with `causal_alignment`. May be combined
        with `mask` (both must allow a pair).
    causal_alignment : {"top-left", "bottom-right"}, optional
        Diagonal placement when L != S; see `causal_mask`. It also places
        the queries for `window` and `alibi_slopes`: query ``i`` sits at key
        position ``p_i = i`` (top-left) or ``p_i = i + S - L``
        (bottom-right), whether or not `is_causal` is set.
    window : (int or None, int or None), optional
        Local attention ``(left, right)``: query ``i`` may attend to key
        ``j`` only if ``p_i - left <= j <= p_i + right``; each side is an
        int >= 0, or None for unbounded. With ``is_causal=True`` the right
        side is at most 0. The pattern of ``sliding_window_mask(L, S,
        window=window, alignment=causal_alignment)``, never built whole.
    scale : float, optional
        Multiplier of the scores; default ``1 / sqrt(E)``. ``0.0`` is legal
        and gives uniform weights over the allowed keys.
    softcap : float, optional
        Soft cap ``c > 0``: the scaled scores become ``c * tanh(scores /
        c)``, before `bias`, ALiBi and the masks are added (the order of
        Gemma 2 and FlashAttention).
    alibi_slopes : array_like of float, optional
        ALiBi slopes ``m``, broadcastable to the batch and head axes of the
        scores, ``(..., H)``; a 1-D array holds one slope per head (axis
        -3 of the scores). Adds ``-m_h * |p_i - j|`` to the scores, built
        block by block rather than as an (L, S) bias; the same as passing
        `alibi_bias` as `bias`.
    sinks : array_like of float, optional
        Attention-sink logits ``s``, broadcastable to ``(..., H)`` like
        `alibi_slopes`: every row's softmax denominator gains
        ``exp(s_h)``, as if one more key with that score and a zero value
        were allowed (gpt-oss's learned sinks; StreamingLLM's sinks are
        instead the first tokens' own keys and values, kept in the cache).
        The output sums over the real keys only, and their weights sum to
        less than one.
    dropout_p : float, optional
        Probability in [0, 1) of zeroing each weight (inverted dropout: kept
        weights are divided by ``1 - dropout_p``). Needs `rng`.
    rng : numpy.random.Generator, optional
        Source of randomness for dropout; required when ``dropout_p > 0``
        unless `dropout_mask` is given.
    dropout_mask : array_like of bool, shape broadcastable to (..., L, S), optional
        The dropout keep-mask to apply instead of drawing one: True keeps a
        weight, which is then divided by ``1 - dropout_p``. Lets a kernel's
        own mask be replayed; not together with `rng`. FlashAttention's
        ``S_dmask`` (returned with ``return_attn_probs=True``) marks a
        dropped weight with its sign bit, so its keep-mask is
        ``S_dmask >= 0`` (cut to the (L, S) of the call).
    enable_gqa : bool, optional
        Grouped-query attention: `k` and `v` may have fewer heads (axis -3)
        than `q`; query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
    q_descale, k_descale, v_descale : float or array_like, optional
        Descale factors of fp8 input (float8_e4m3fn or float8_e5m2, the
        ml_dtypes dtypes): the attention is that of ``x.astype(float64) *
        x_descale``, formed exactly, and the output is bfloat16 (FlashAttention
        3's convention). A scalar, or FlashAttention 3's shape ``(B, Hkv)``
        lining up with the axes before the last two; under `enable_gqa`,
        ``q_descale[b, g]`` applies to every query head of group ``g``.
        Also accepted: what broadcasts to ``(B, Hkv)`` (``(Hkv,)`` or
        ``(1, Hkv)``: one factor per head for every batch entry), and the
        per-head descale `quantize_fp8` returns with ``per_head=True,
        axis=-3``, ``(1, Hkv, 1, 1)``. Without a descale an fp8 array stands
        for itself (descale 1).
    normalization : {"softmax", "sigmoid"}, optional
        How scores become weights: the softmax of each row (default), or
        sigmoid attention [3]_, each weight ``sigmoid(x + sigmoid_bias)`` of
        its own score (`sigmoid_weights`). A masked key gets weight 0 under
        both, and the sigmoid's rows need not sum to one. The sigmoid takes
        every option but `sinks` and `return_lse`, which need the softmax.
    sigmoid_bias : float, optional
        The sigmoid's bias ``b``; default ``-log S``. Only with
        ``normalization="sigmoid"``.
    return_weights : bool, optional
        Also return the attention weights.
    return_lse : bool, optional
        Also return the log-sum-exp of each row's scores, as
        `blockwise_attention` returns it.

    Returns
    -------
    out : ndarray, shape (..., L, Ev)
        Attention output, in the dtype NumPy promotion gives `q`, `k` and
        `v` (float16 and bfloat16 stay as they are, computed in float32;
        integers give float64).
    weights : ndarray, shape (..., L, S)
        Only with ``return_weights=True``: the weights applied to `v` (after
        dropout, if any). Rows sum to one (to less than one with `sinks`),
        except rows with no allowed key, which are zero.
    lse : ndarray, shape (..., L)
        Only with ``return_lse=True``, after `weights` if both are asked
        for: :math:`\log(e^{s_h} + \sum_{j \in A_i} e^{x_{ij}})` in the
        natural log (notation of the Notes), the sink counted once; ``-inf``
        for a row with no allowed key, or the sink's logit :math:`s_h` where
        there is a sink. Before dropout, in the working dtype (float32 for
        float16 and bfloat16 input, as FlashAttention returns it).

    Raises
    ------
    TypeError
        If an array is complex, boolean or non-numeric (or `mask` is not
        boolean), `is_causal`, `enable_gqa`, `return_weights` or
        `return_lse` is not a bool, `rng` is not a Generator when dropout is on, `softcap` is not
        a real number, or `window` is not a pair of ints or None.
    ValueError
        If shapes do not fit: E differs between `q` and `k`, S between `k`
        and `v`, batch or mask shapes do not broadcast, heads do not divide
        under `enable_gqa`, `alibi_slopes` or `sinks` do not broadcast to
        the batch and head axes of the scores; if `causal_alignment` is
        unknown, `dropout_p` is outside [0, 1), `softcap` is not finite and
        > 0, a side of `window` is negative (or it is not of length 2),
        `alibi_slopes` or `sinks` hold NaN or an infinity, or `scale`,
        `softcap`, `alibi_slopes` or `sinks` overflow the working dtype
        (float32 for float16, bfloat16 and float32 input); if
        `normalization` is unknown, `sigmoid_bias` is given with the
        softmax or is not finite, or the sigmoid comes with `sinks` or
        `return_lse`.

    See Also
    --------
    blockwise_attention : Same result without forming the (L, S) matrix.
    multi_head_attention : Projections, heads and output projection.
    causal_mask : The mask ``is_causal`` applies.
    sliding_window_mask : The mask `window` applies.
    padding_mask : Hides padded keys.
    alibi_bias : The bias `alibi_slopes` adds.
    mask_to_bias : The additive form a boolean mask takes here.
    merge_attention : Folds `sinks` into results merged over key splits.
    softmax : Normalises each row of scores.
    sigmoid_weights : The weights of ``normalization="sigmoid"``.

    Notes
    -----
    With :math:`\sigma` the scale and :math:`B` the total additive term
    (bias plus :math:`\log` of the boolean masks, i.e. 0 or :math:`-\infty`):

    .. math::

        \operatorname{Attention}(Q, K, V)
        = \operatorname{softmax}\!\left(\sigma\, Q K^\top + B\right) V,
        \qquad \sigma = \frac{1}{\sqrt{E}} .

    If the entries of :math:`q` and :math:`k` are independent with mean 0
    and variance 1, :math:`\operatorname{Var}(q \cdot k) = E`; the default
    scale brings the scores back to unit variance so the softmax does not
    saturate. A row whose every key is masked has no defined softmax; it
    returns zeros. Recent PyTorch SDPA does the same (checked with 2.13),
    whereas ``torch.softmax`` of an all ``-inf`` row is NaN.

    The options act in this order. With the soft cap :math:`c`, the ALiBi
    slope :math:`m_h` and the sink :math:`s_h` of the row's head, the key
    position :math:`p_i` of query :math:`i` and the allowed set
    :math:`A_i` (the keys that `mask`, `is_causal` and `window` all allow,
    :math:`p_i - \ell \le j \le p_i + r` for the window):

    .. math::

        x_{ij} = c \tanh\!\left(\frac{\sigma\, q_i \cdot k_j}{c}\right)
                 + b_{ij} - m_h \lvert p_i - j \rvert, \qquad
        w_{ij} = \frac{e^{x_{ij}}}{e^{s_h} + \sum_{j' \in A_i} e^{x_{ij'}}}
        \quad (j \in A_i),

    :math:`w_{ij} = 0` for :math:`j \notin A_i`, and
    :math:`o_i = \sum_j w_{ij} v_j`. Without a cap the first term is
    :math:`\sigma\, q_i \cdot k_j`; without sinks :math:`e^{s_h}` is 0.
    The sink is an extra key with score :math:`s_h` and value 0 that no
    mask hides. A row with no allowed key then gets zero weights and a zero
    output, as without sinks: its denominator is :math:`e^{s_h}` alone.
    gpt-oss's reference (``sdpa`` in ``gpt_oss/torch/model.py``, a softmax
    over the scores with the sink appended as a last column, which is then
    dropped) gives the same: the whole weight goes to the sink and none to
    the keys.

    Conventions match ``torch.nn.functional.scaled_dot_product_attention``:
    layout, mask polarity, top-left ``is_causal``, ``scale`` and
    ``enable_gqa``.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.
    .. [2] Ainslie, J. et al., "GQA: Training Generalized Multi-Query
       Transformer Models from Multi-Head Checkpoints", EMNLP, 2023.
    .. [3] Ramapuram, J. et al., "Theory, Analysis, and Best Practices for
       Sigmoid Self-Attention", arXiv:2409.04431, 2024.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import scaled_dot_product_attention
    >>> q = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> k = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> v = np.array([[10.0], [20.0]])
    >>> out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    >>> w
    array([[0.66976155, 0.33023845],
           [0.33023845, 0.66976155]])
    >>> out
    array([[13.30238451],
           [16.69761549]])

    A causal mask lets the first query see only the first key:

    >>> scaled_dot_product_attention(q, k, v, is_causal=True)
    array([[10.        ],
           [16.69761549]])

    With ``scale=0.0`` every allowed key gets the same weight, which shows
    the patterns. A window of one key on each side:

    >>> x, values = np.zeros((4, 1)), np.arange(4.0)[:, None]
    >>> _, w = scaled_dot_product_attention(x, x, values, scale=0.0, window=(1, 1), return_weights=True)
    >>> w[:2]
    array([[0.5       , 0.5       , 0.        , 0.        ],
           [0.33333333, 0.33333333, 0.33333333, 0.        ]])

    ALiBi with slope 0.5 weighs keys by :math:`e^{-0.5 |i - j|}`:

    >>> _, w = scaled_dot_product_attention(x[:3], x[:3], values[:3], scale=0.0, alibi_slopes=0.5,
    ...                                     return_weights=True)
    >>> w
    array([[0.50648039, 0.30719589, 0.18632372],
           [0.27406862, 0.45186276, 0.27406862],
           [0.18632372, 0.30719589, 0.50648039]])

    A sink of score :math:`\log 2` counts as two more keys with value 0:

    >>> out, w = scaled_dot_product_attention(x[:2], x[:2], values[:2] + 1, scale=0.0, sinks=np.log(2.0),
    ...                                       return_weights=True)
    >>> w, out
    (array([[0.25, 0.25],
           [0.25, 0.25]]), array([[0.75],
           [0.75]]))

    A soft cap of 2 turns a score of 9 into :math:`2 \tanh(4.5)`:

    >>> _, w = scaled_dot_product_attention(np.array([[3.0]]), np.array([[3.0], [0.0]]), values[:2], scale=1.0,
    ...                                     softcap=2.0, return_weights=True)
    >>> w
    array([[0.88074525, 0.11925475]])

    The log-sum-exp of each row's scores, the softmax's normaliser:

    >>> out, lse = scaled_dot_product_attention(q, k, v, return_lse=True)
    >>> lse
    array([1.10794031, 1.10794031])
    >>> bool(np.allclose(lse, np.log(np.exp(q @ k.T / np.sqrt(2)).sum(axis=-1))))
    True

    Sigmoid attention weighs each key by
    :math:`\operatorname{sigmoid}(x_{ij} - \log S)` alone; the causal mask
    leaves the first query one key, of weight
    :math:`\operatorname{sigmoid}(1/\sqrt{2} - \log 2)`:

    >>> out, w = scaled_dot_product_attention(q, k, v, normalization="sigmoid", is_causal=True,
    ...                                       return_weights=True)
    >>> w
    array([[0.50348984, 0.        ],
           [0.33333333, 0.50348984]])
    >>> out
    array([[ 5.03489843],
           [13.4031302 ]])
    """
    p = prepare_attention(q, k, v, **options)
    return_weights = check_bool(return_weights, "return_weights")
    return_lse = check_bool(return_lse, "return_lse")
    lse = None
    if return_lse:
        needs_softmax(options["normalization"], "return_lse")
        lse = online_softmax(p)[1]  # (..., L), the online softmax's normaliser

    blocked = not p.has_dropout and p.normalization is None  # the softmax with no dropout: the blocked kernel
    if blocked:
        # The same formula, evaluated in cache-sized blocks of queries in place;
        # `out` does not depend on whether the weights are asked for as well.
        out = dense_attention(p)  # non-finite input gives NaN rows, without a warning
        if not return_weights:
            return out if lse is None else (out, lse)
    weights = _weights(p)  # (..., L, S)
    if not blocked:
        if p.has_dropout:
            weights = weights * p.keep(weights.shape) / (1.0 - p.dropout_p)
        with np.errstate(invalid="ignore"):  # an infinite value times a zero weight: NaN, no warning
            out = np.broadcast_to(weights @ p.v, p.out_shape)  # (..., L, Ev)
        out = np.ascontiguousarray(out, dtype=p.out_dtype)
    results = (out, weights.astype(p.out_dtype, copy=False)) if return_weights else (out,)
    if lse is not None:
        results += (lse,)
    return results if len(results) > 1 else out
