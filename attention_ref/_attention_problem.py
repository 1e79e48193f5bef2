"""The attention problem: checked inputs, the geometry of the allowed keys and the score terms.

`prepare_attention` checks `q`, `k`, `v` and the shared options (`attention_ref._options.OPTIONS`) once and
returns an `AttentionProblem`: the arrays in the working dtype with grouped-query heads expanded, the scale,
where each query sits among the keys (``offset``), the band of keys it may see (``window``, causality folded
in), and every term added to the scores (mask, bias, ALiBi), tile by tile. `problem_scores` gives the whole
(..., L, S) matrix of scores those terms make. The equation itself, what the scores become, lives in
`attention_ref.attention` (and the blockwise, online and backward modules read the same problem).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._normalization import choose_normalization, needs_softmax
from ._options import OPTIONS
from ._validation import (
    as_bool_mask,
    as_per_head,
    as_real_array,
    broadcast_shapes,
    check_bool,
    check_choice,
    check_fits_dtype,
    check_generator,
    check_ndim,
    check_positive_real,
    check_real,
    check_window,
    result_dtype,
)
from .fp8 import dequantize_inputs
from .masks import ALIGNMENTS, in_window

__all__: list[str] = []  # private module: attention_ref.attention re-exports AttentionProblem and prepare_attention


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
    grouped-query heads already expanded. Query ``i`` sits at key position
    ``i + offset``; ``window`` is the band of keys it may see around that
    position, with causality folded in (``right = 0``). ``additive(rows,
    cols)`` gives the total additive term (mask, window, bias and ALiBi)
    for a tile of scores, and ``key_range(rows)`` the keys a block of
    queries can see at all.
    """

    q: np.ndarray  # (..., L, E)
    k: np.ndarray  # (..., S, E)
    v: np.ndarray  # (..., S, Ev)
    scale: float
    mask: np.ndarray | None  # bool, broadcastable to (..., L, S)
    bias: np.ndarray | None  # float, broadcastable to (..., L, S)
    offset: int  # key position of query 0: 0 top-left, S - L bottom-right
    window: tuple[int | None, int | None] | None  # (left, right) keys allowed around the position; None: all
    softcap: float | None
    alibi_slopes: np.ndarray | None  # (..., 1, 1), broadcastable to the scores
    sinks: np.ndarray | None  # broadcastable to the batch axes of the scores, (..., H)
    out_dtype: np.dtype
    out_shape: tuple[int, ...]  # (..., L, Ev)
    dropout_p: float = 0.0  # probability of zeroing each weight
    rng: np.random.Generator | None = None  # dropout's generator (checked when dropout_p > 0 without a mask)
    dropout_mask: np.ndarray | None = None  # bool keep-mask broadcastable to (..., L, S), instead of drawing one
    normalization: Any = None  # an elementwise normalization (`._normalization`: the sigmoid); None: the softmax

    @property
    def has_dropout(self) -> bool:
        """Whether weights are dropped: a probability above zero, or a given keep-mask."""
        return self.dropout_p > 0 or self.dropout_mask is not None

    def keep(self, shape: tuple[int, ...]) -> np.ndarray:
        """The dropout keep-mask of weights of `shape` (..., L, S): the given mask, else one draw from ``rng``."""
        if self.dropout_mask is not None:
            return np.broadcast_to(self.dropout_mask, np.broadcast_shapes(self.dropout_mask.shape, shape))
        assert self.rng is not None  # prepare_attention requires one for dropout without a mask
        return self.rng.random(shape) >= self.dropout_p

    @property
    def n_queries(self) -> int:
        return self.q.shape[-2]

    @property
    def n_keys(self) -> int:
        return self.k.shape[-2]

    def _positions(self, rows, cols):
        """Key positions of the queries ``rows``, shape (l, 1), and the key indices ``cols``, shape (1, s)."""
        return np.arange(self.n_queries)[rows, None] + self.offset, np.arange(self.n_keys)[None, cols]

    def key_range(self, rows: slice) -> tuple[int, int]:
        """Keys ``[start, stop)`` that some query of ``rows`` (a slice with start and stop) may see."""
        start, stop = 0, self.n_keys
        if self.window is not None:
            left, right = self.window
            if left is not None:
                start = min(self.n_keys, max(0, rows.start + self.offset - left))
            if right is not None:
                stop = min(self.n_keys, max(0, rows.stop - 1 + self.offset + right + 1))
        return start, max(start, stop)

    def inside_keys(self, rows: slice) -> tuple[int, int]:
        """Keys ``[start, stop)`` that the window lets every query of ``rows`` see (empty when start >= stop)."""
        start, stop = 0, self.n_keys
        if self.window is not None:
            left, right = self.window
            if left is not None:
                start = max(0, rows.stop - 1 + self.offset - left)
            if right is not None:
                stop = min(self.n_keys, rows.start + self.offset + right + 1)
        return start, stop

    def inside_window(self, rows: slice, cols: slice) -> bool:
        """Whether the window lets every query ``rows`` see every key ``cols`` (no window mask needed)."""
        start, stop = self.inside_keys(rows)
        return cols.start >= start and cols.stop <= stop

    def cap(self, scores: np.ndarray) -> np.ndarray:
        """Apply the soft cap ``softcap * tanh(scores / softcap)`` to `scores` in place (if there is one)."""
        if self.softcap is not None:
            scores /= self.softcap
            np.tanh(scores, out=scores)
            scores *= self.softcap
        return scores

    def alibi_distances(self, rows=slice(None), cols=slice(None)) -> np.ndarray:
        """``|p_i - j|`` for the queries ``rows`` and keys ``cols``, shape (l, s), in the working dtype."""
        r, c = self._positions(rows, cols)
        return np.abs(r - c).astype(self.q.dtype)

    def additive(self, rows=slice(None), cols=slice(None), *, alibi=True):
        """Return the additive term for ``scores[..., rows, cols]``, or None if there is none.

        With ``alibi=False`` the ALiBi term is left out, for a caller that
        adds it head by head from `alibi_distances`.
        """
        total = None
        if self.bias is not None:
            total = _rows_cols(self.bias, rows, cols)
        if alibi and self.alibi_slopes is not None:
            # -m_h |p_i - j| for this tile only: the (L, S) bias of the whole problem is never formed.
            linear = self.alibi_slopes * -self.alibi_distances(rows, cols)
            total = linear if total is None else total + linear
        allowed = None
        if self.mask is not None:
            allowed = _rows_cols(self.mask, rows, cols)
        if self.window is not None:
            band = in_window(*self._positions(rows, cols), *self.window)
            allowed = band if allowed is None else allowed & band
        if allowed is not None:
            # Add 0 / -inf: multiplying exp(score) by 1 / 0 before normalising.
            minus_inf = np.where(allowed, 0.0, -np.inf).astype(self.q.dtype, copy=False)
            total = minus_inf if total is None else total + minus_inf
        return total


def problem_scores(p: AttentionProblem) -> np.ndarray:
    """Scaled (and capped) scores plus every additive term, shape (..., L, S)."""
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite input: NaN rows, no warning
        scores = p.q @ np.swapaxes(p.k, -1, -2)  # (..., L, S)
        scores *= p.scale
        p.cap(scores)
        extra = p.additive()
        return scores if extra is None else scores + extra


def _window_with_causal(window, is_causal):
    """The checked ``(left, right)`` band with causality folded in (right <= 0), or None for no band."""
    left, right = (None, None) if window is None else check_window(window)
    if is_causal:
        right = 0 if right is None else min(right, 0)
    return None if left is None and right is None else (left, right)


def _batch_shapes(q, k, v, mask, bias, enable_gqa) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(heads, batch)``: the batch axes of the scores (what per-head slopes and sinks broadcast to) and of the output.

    Raises a ValueError naming every shape when q, k, `mask`, `bias` and v do not broadcast.
    """
    L, S = q.shape[-2], k.shape[-2]
    named = [("q", (*q.shape[:-2], L, 1)), ("k", (*k.shape[:-2], 1, S))]
    if mask is not None:
        named.append(("mask", mask.shape))
    if bias is not None:
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
    return score_shape[:-2], batch


def prepare_attention(q, k, v, **options) -> AttentionProblem:
    """Check and normalise `q`, `k`, `v` and the shared options (`_options.OPTIONS`; defaults for those not given)."""
    unknown = options.keys() - OPTIONS.keys()
    if unknown:
        raise TypeError(f"prepare_attention() got unexpected keyword arguments {sorted(unknown)}")
    options = OPTIONS | options
    q, k, v, dequantized_dtype = dequantize_inputs(q, k, v, options)  # fp8 and descales: the arrays they stand for
    mask, bias, window, scale, softcap = (options[name] for name in ("mask", "bias", "window", "scale", "softcap"))
    alibi_slopes, sinks, causal_alignment = options["alibi_slopes"], options["sinks"], options["causal_alignment"]
    q = as_real_array(q, "q")
    k = as_real_array(k, "k")
    v = as_real_array(v, "v")
    is_causal = check_bool(options["is_causal"], "is_causal")
    enable_gqa = check_bool(options["enable_gqa"], "enable_gqa")
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
    out_dtype = out_dtype if dequantized_dtype is None else dequantized_dtype
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

    if mask is not None:
        mask = _at_least_2d(as_bool_mask(mask, "mask"))
    if bias is not None:
        bias = _at_least_2d(as_real_array(bias, "bias").astype(work_dtype, copy=False))
    if mask is None and bias is None and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        heads = batch = q.shape[:-2]  # nothing to broadcast (the common call): no shapes to check
    else:
        heads, batch = _batch_shapes(q, k, v, mask, bias, enable_gqa)
    out_shape = (*batch, L, v.shape[-1])

    if scale is None:
        if E == 0:
            raise ValueError(f"q has feature size E = 0 (shape {q.shape}); pass an explicit scale")
        scale = 1.0 / math.sqrt(E)
    else:
        scale = check_real(scale, "scale")
        check_fits_dtype(scale, "scale", work_dtype)

    check_choice(causal_alignment, "causal_alignment", ALIGNMENTS)
    window = _window_with_causal(window, is_causal)
    if softcap is not None:
        softcap = check_positive_real(softcap, "softcap")
        check_fits_dtype(softcap, "softcap", work_dtype)
    if alibi_slopes is not None:
        alibi_slopes = as_per_head(alibi_slopes, "alibi_slopes", heads, work_dtype)[..., None, None]
    if sinks is not None:
        sinks = as_per_head(sinks, "sinks", heads, work_dtype)
    dropout_p = check_real(options["dropout_p"], "dropout_p", minimum=0.0, below=1.0)
    dropout_mask = options["dropout_mask"]
    if dropout_mask is None:
        rng = check_generator(options["rng"]) if dropout_p > 0 else None
    else:
        if options["rng"] is not None:
            raise TypeError(
                "dropout_mask and rng are exclusive: a given dropout_mask is applied as it is and no generator "
                "is drawn from; pass one of them"
            )
        rng = None
        dropout_mask = _at_least_2d(as_bool_mask(dropout_mask, "dropout_mask"))
        scores = (*batch, L, S)
        broadcast_shapes("dropout_mask and the scores", [("dropout_mask", dropout_mask.shape), ("scores", scores)])
    normalization = choose_normalization(options, S, work_dtype)
    if normalization is not None and sinks is not None:
        needs_softmax(options["normalization"], "sinks")

    return AttentionProblem(
        q=q.astype(work_dtype, copy=False),
        k=k.astype(work_dtype, copy=False),
        v=v.astype(work_dtype, copy=False),
        scale=scale,
        mask=mask,
        bias=bias,
        offset=0 if causal_alignment == "top-left" else S - L,
        window=window,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        out_dtype=out_dtype,
        out_shape=out_shape,
        dropout_p=dropout_p,
        rng=rng,
        dropout_mask=dropout_mask,
        normalization=normalization,
    )
