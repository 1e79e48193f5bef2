"""Scaled dot-product attention, the dense reference."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._kernel import dense_attention
from ._validation import (
    as_bool_mask,
    as_real_array,
    broadcast_shapes,
    check_bool,
    check_choice,
    check_generator,
    check_ndim,
    check_real,
    result_dtype,
)
from .masks import ALIGNMENTS
from .softmax import softmax

__all__ = ["scaled_dot_product_attention"]


def _rows_cols(arr, rows, cols):
    """Slice the last two axes of `arr`, leaving size-one (broadcast) axes whole."""
    r = rows if arr.shape[-2] != 1 else slice(None)
    c = cols if arr.shape[-1] != 1 else slice(None)
    return arr[..., r, c]


def _at_least_2d(arr):
    """Prepend size-one axes so that `arr` has a (query, key) pair of axes."""
    return arr.reshape((1,) * (2 - arr.ndim) + arr.shape) if arr.ndim < 2 else arr


@dataclass(frozen=True)
class AttentionProblem:
    """Checked inputs of one attention call, shared by the dense and blockwise paths.

    ``q``, ``k``, ``v`` are in the working dtype (at least float32) with
    grouped-query heads already expanded; ``additive(rows, cols)`` gives the
    total additive term (mask, causal mask and bias) for a tile of scores.
    """

    q: np.ndarray  # (..., L, E)
    k: np.ndarray  # (..., S, E)
    v: np.ndarray  # (..., S, Ev)
    scale: float
    mask: np.ndarray | None  # bool, broadcastable to (..., L, S)
    bias: np.ndarray | None  # float, broadcastable to (..., L, S)
    causal_offset: int | None  # key position of query 0, or None if not causal
    out_dtype: np.dtype
    out_shape: tuple[int, ...]  # (..., L, Ev)

    @property
    def n_queries(self) -> int:
        return self.q.shape[-2]

    @property
    def n_keys(self) -> int:
        return self.k.shape[-2]

    def additive(self, rows=slice(None), cols=slice(None)):
        """Return the additive term for ``scores[..., rows, cols]``, or None if there is none."""
        total = None
        if self.bias is not None:
            total = _rows_cols(self.bias, rows, cols)
        allowed = None
        if self.mask is not None:
            allowed = _rows_cols(self.mask, rows, cols)
        if self.causal_offset is not None:
            r = np.arange(self.n_queries)[rows, None] + self.causal_offset  # (l, 1)
            c = np.arange(self.n_keys)[None, cols]  # (1, s)
            causal = c <= r
            allowed = causal if allowed is None else allowed & causal
        if allowed is not None:
            # Add 0 / -inf: multiplying exp(score) by 1 / 0 before normalising.
            minus_inf = np.where(allowed, 0.0, -np.inf).astype(self.q.dtype, copy=False)
            total = minus_inf if total is None else total + minus_inf
        return total


def _scores(p: AttentionProblem) -> np.ndarray:
    """Scaled scores plus every additive term, shape (..., L, S)."""
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite input: NaN rows, no warning
        scores = p.q @ np.swapaxes(p.k, -1, -2)  # (..., L, S)
        scores *= p.scale
        extra = p.additive()
        return scores if extra is None else scores + extra


def prepare_attention(
    q, k, v, *, mask=None, bias=None, is_causal=False, causal_alignment="top-left", scale=None, enable_gqa=False
) -> AttentionProblem:
    """Check and normalise the arguments common to every attention function."""
    q = as_real_array(q, "q")
    k = as_real_array(k, "k")
    v = as_real_array(v, "v")
    is_causal = check_bool(is_causal, "is_causal")
    enable_gqa = check_bool(enable_gqa, "enable_gqa")
    check_ndim(q, "q", 2, "(..., L, E)")
    check_ndim(k, "k", 2, "(..., S, E)")
    check_ndim(v, "v", 2, "(..., S, Ev)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same feature size E (last axis); got q {q.shape} and k {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys S (axis -2); got k {k.shape} and v {v.shape}"
        )
    out_dtype, work_dtype = result_dtype(q, k, v)
    L, E = q.shape[-2:]
    S = k.shape[-2]

    if enable_gqa:
        for name, arr in (("q", q), ("k", k), ("v", v)):
            check_ndim(arr, name, 3, "(..., H, L or S, E) with heads on axis -3 when enable_gqa=True")
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if hk != hv:
            raise ValueError(f"k and v must have the same number of heads (axis -3); got k {k.shape} and v {v.shape}")
        if hk == 0 or hq % hk:
            raise ValueError(
                f"with enable_gqa=True the number of query heads must be a multiple of the number of "
                f"key/value heads; got q {q.shape} ({hq} heads) and k {k.shape} ({hk} heads)"
            )
        if hq != hk:
            # Query head h reads key/value head h // (hq // hk), as in PyTorch.
            k = np.repeat(k, hq // hk, axis=-3)
            v = np.repeat(v, hq // hk, axis=-3)

    named = [("q", (*q.shape[:-2], L, 1)), ("k", (*k.shape[:-2], 1, S))]
    if mask is not None:
        mask = _at_least_2d(as_bool_mask(mask, "mask"))
        named.append(("mask", mask.shape))
    if bias is not None:
        bias = _at_least_2d(as_real_array(bias, "bias").astype(work_dtype, copy=False))
        named.append(("bias", bias.shape))
    try:
        score_shape = np.broadcast_shapes(*(shape for _, shape in named))
    except ValueError:
        listing = ", ".join(f"{name} {shape}" for name, shape in named)
        hint = ""
        if q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3] and not enable_gqa:
            hint = "; for grouped-query attention pass enable_gqa=True"
        raise ValueError(
            f"the score matrix (..., L={L}, S={S}) cannot be formed: batch and mask shapes do not "
            f"broadcast (L and S axes shown as 1 where they do not apply): {listing}{hint}"
        ) from None
    if score_shape[-2:] != (L, S):
        raise ValueError(
            f"mask and bias must broadcast to (..., L={L}, S={S}) in their last two axes; "
            f"they broadcast to {score_shape}"
        )
    batch = broadcast_shapes(
        "the batch axes (all but the last two) of q/k/mask/bias and of v",
        [("scores", score_shape[:-2]), ("v", v.shape[:-2])],
    )
    out_shape = (*batch, L, v.shape[-1])

    if scale is None:
        if E == 0:
            raise ValueError(f"q has feature size E = 0 (shape {q.shape}); pass an explicit scale")
        scale = 1.0 / math.sqrt(E)
    else:
        scale = check_real(scale, "scale")

    check_choice(causal_alignment, "causal_alignment", ALIGNMENTS)
    causal_offset = None
    if is_causal:
        causal_offset = 0 if causal_alignment == "top-left" else S - L

    return AttentionProblem(
        q=q.astype(work_dtype, copy=False),
        k=k.astype(work_dtype, copy=False),
        v=v.astype(work_dtype, copy=False),
        scale=scale,
        mask=mask,
        bias=bias,
        causal_offset=causal_offset,
        out_dtype=out_dtype,
        out_shape=out_shape,
    )


def scaled_dot_product_attention(
    q,
    k,
    v,
    *,
    mask=None,
    bias=None,
    is_causal=False,
    causal_alignment="top-left",
    scale=None,
    dropout_p=0.0,
    rng=None,
    enable_gqa=False,
    return_weights=False,
):
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
        Diagonal placement when L != S; see `causal_mask`.
    scale : float, optional
        Multiplier of the scores; default ``1 / sqrt(E)``. ``0.0`` is legal
        and gives uniform weights over the allowed keys.
    dropout_p : float, optional
        Probability in [0, 1) of zeroing each weight (inverted dropout: kept
        weights are divided by ``1 - dropout_p``). Needs `rng`.
    rng : numpy.random.Generator, optional
        Source of randomness for dropout; required when ``dropout_p > 0``.
    enable_gqa : bool, optional
        Grouped-query attention: `k` and `v` may have fewer heads (axis -3)
        than `q`; query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
    return_weights : bool, optional
        Also return the attention weights.

    Returns
    -------
    out : ndarray, shape (..., L, Ev)
        Attention output, in the dtype NumPy promotion gives `q`, `k` and
        `v` (float16 stays float16, computed in float32; integers give
        float64).
    weights : ndarray, shape (..., L, S)
        Only with ``return_weights=True``: the weights applied to `v` (after
        dropout, if any). Rows sum to one, except rows with no allowed key,
        which are zero.

    Raises
    ------
    TypeError
        If an array is complex, boolean or non-numeric (or `mask` is not
        boolean), `is_causal`, `enable_gqa` or `return_weights` is not a
        bool, or `rng` is not a Generator when dropout is on.
    ValueError
        If shapes do not fit: E differs between `q` and `k`, S between `k`
        and `v`, batch or mask shapes do not broadcast, heads do not divide
        under `enable_gqa`; if `causal_alignment` is unknown or `dropout_p`
        is outside [0, 1).

    See Also
    --------
    blockwise_attention : Same result without forming the (L, S) matrix.
    multi_head_attention : Projections, heads and output projection.
    causal_mask : The mask ``is_causal`` applies.
    padding_mask : Hides padded keys.
    mask_to_bias : The additive form a boolean mask takes here.
    softmax : Normalises each row of scores.

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

    Conventions match ``torch.nn.functional.scaled_dot_product_attention``:
    layout, mask polarity, top-left ``is_causal``, ``scale`` and
    ``enable_gqa``.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.
    .. [2] Ainslie, J. et al., "GQA: Training Generalized Multi-Query
       Transformer Models from Multi-Head Checkpoints", EMNLP, 2023.

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
    """
    p = prepare_attention(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        enable_gqa=enable_gqa,
    )
    dropout_p = check_real(dropout_p, "dropout_p", minimum=0.0, below=1.0)
    return_weights = check_bool(return_weights, "return_weights")
    if dropout_p > 0:
        check_generator(rng)

    if dropout_p == 0:
        # The same formula, evaluated in cache-sized blocks of queries in place;
        # `out` does not depend on whether the weights are asked for as well.
        out = dense_attention(p)  # non-finite input gives NaN rows, without a warning
        if not return_weights:
            return out
    weights = softmax(_scores(p), axis=-1)  # (..., L, S)
    if dropout_p > 0:
        keep = rng.random(weights.shape) >= dropout_p
        weights = weights * keep / (1.0 - dropout_p)
        with np.errstate(invalid="ignore"):  # an infinite value times a zero weight: NaN, no warning
            out = np.broadcast_to(weights @ p.v, p.out_shape)  # (..., L, Ev)
        out = np.ascontiguousarray(out, dtype=p.out_dtype)
    if return_weights:
        return out, weights.astype(p.out_dtype, copy=False)
    return out
