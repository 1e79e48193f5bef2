"""The checkers' baselines: the textbook attention, forward and backward, with every step rounded to a dtype.

The rule of `attention_ref.testing` compares a kernel with the float64 reference *and* with this naive
computation in the kernel's own dtype: the kernel may be at most ``factor`` times as far from the reference
as the baseline is. `naive_forward` and `naive_backward` take the options of
`attention_ref.scaled_dot_product_attention`; `naive_flex_forward` and `naive_flex_backward` take a ``score_mod``
and a ``mask_mod`` as `attention_ref.flex_attention` does, evaluated on the whole (L, S) score matrix.
"""

from __future__ import annotations

import numpy as np

from .._attention_problem import prepare_attention
from .._validation import as_real_array
from ..backward import AttentionGrads, finish_grads
from ..flex import tile_mask, tile_score
from ._rounding import FAST_MIN, round_to, widen_float16

__all__: list[str] = []  # private module


def rounding(dtype: np.dtype, fused: bool = False):
    """``(rnd, inner, work)``: rounding to `dtype`, the rounding of the inner steps, and the working dtype.

    In float16 and bfloat16 every step is computed in float32 (``work``) and ``rnd`` rounds it to `dtype`.
    The *inner* steps, the scores and the softmax, are rounded too in the textbook model, and kept in
    float32 in the fused one (``fused=True``), as a tensor-core kernel keeps them; there only the inputs,
    the weights before the product with the values, and the results are rounded. In float32 and float64
    nothing rounds beyond the arithmetic itself.
    """
    rounds = dtype.itemsize < 4  # float16, bfloat16: products accumulate in float32, each step is rounded
    work = np.dtype(np.float32) if rounds else dtype

    def rnd(x):
        if not rounds:
            return x.astype(work, copy=False)
        return round_to(x, dtype) if x.dtype == work else x.astype(dtype).astype(work)

    def keep(x):
        return x.astype(work, copy=False)

    return rnd, (keep if fused else rnd), work


def _naive_softmax(s, sinks, rnd, work, weights=True, scratch=False):
    """``(weights, sink_weight, lse)`` of scores `s` (..., L, S), every step rounded by `rnd`.

    `sinks` (..., 1, 1) or None joins each row's denominator; ``sink_weight`` (..., L) is its weight (None
    without sinks). A row whose denominator is zero (no allowed key, no sink) gets zero weights and an
    ``lse`` of ``-inf``. Without `weights` only ``lse`` is computed (the weights and ``sink_weight`` are None).
    With `scratch` the caller gives `s` up: ``s - m`` is written into it (one (L, S) array fewer at once).
    """
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., L, 1)
    if sinks is not None:
        top = np.maximum(top, sinks)
    top = np.where(np.isfinite(top), top, 0.0).astype(work)
    e = rnd(np.subtract(s, top, out=s) if scratch else s - top)
    e = rnd(np.exp(e, out=e))  # in place: `e` is this function's own array
    total = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        sink_e = rnd(np.exp(rnd(sinks - top)))
        total = total + sink_e
    total = rnd(total)
    safe_total = np.where(total > 0, total, 1.0)
    lse = rnd(top + rnd(np.log(safe_total)))[..., 0]  # (..., L)
    lse[(total == 0)[..., 0]] = -np.inf
    if not weights:
        return None, None, lse
    weights = rnd(np.divide(e, safe_total, out=e))  # rows with no allowed key: zeros
    sink_weight = None if sinks is None else rnd(sink_e / safe_total)[..., 0]  # (..., L)
    return weights, sink_weight, lse


def into(ufunc, x: np.ndarray, y) -> np.ndarray:
    """``ufunc(x, y)``, written into `x` (a step's own temporary) where the result has its shape."""
    return ufunc(x, y, out=x) if np.broadcast_shapes(x.shape, np.shape(y)) == x.shape else ufunc(x, y)


def naive_forward_arrays(q, k, v, dtype: np.dtype, options: dict, intermediate=None, fused=True):
    """The naive forward in `dtype`: ``(p, weights, capped, sink_weight, out, lse, kept, exact_weights)``.

    The steps are rounded as `rounding` says (`fused`: the scores and the softmax in float32).
    ``weights`` are those multiplying the values (rounded to `dtype`, and to the `intermediate` dtype, fp8,
    when given: FlashAttention 3's ``intermediate_dtype``); ``exact_weights`` those of the softmax before
    that rounding. ``capped`` is ``tanh(s / c)`` of the soft cap (None without one), ``sink_weight`` each
    row's weight on its sink (None without sinks); ``out`` is not broadcast to the output's batch shape.
    ``lse`` (..., L) is ``m + log Z``, ``-inf`` for a row whose denominator is zero (None for the sigmoid).
    With a dropout mask, ``kept`` is ``keep / (1 - dropout_p)`` (..., L, S), which multiplies the weights before
    the product with the values (``weights`` are those before dropout); None without one.
    """
    return naive_forward_of(naive_problem(q, k, v, dtype, options), dtype, intermediate, fused)


def naive_problem(q, k, v, dtype: np.dtype, options: dict):
    """The `attention_ref.attention.AttentionProblem` of `q`, `k`, `v` rounded to `dtype`, with `options`."""
    q, k, v = (in_dtype(as_real_array(a, name), dtype) for a, name in ((q, "q"), (k, "k"), (v, "v")))
    return prepare_attention(q, k, v, **options)  # the package's own masks, window, bias and ALiBi (read only)


def in_dtype(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`a` rounded to `dtype`; already in float16 or bfloat16, it comes back `widened` to float32, where the
    baseline works (the same values)."""
    if a.dtype == dtype and a.dtype.itemsize < 4:
        return widened(a, np.dtype(np.float32))
    return a.astype(dtype, copy=False)


def widened(a: np.ndarray, work: np.dtype) -> np.ndarray:
    """`a` in the wider dtype `work`, exactly: float16 to float32 by `._rounding.widen_float16` from
    `FAST_MIN` elements on (NumPy's conversion is scalar code), anything else by NumPy."""
    if a.dtype == np.float16 and work == np.float32 and a.size >= FAST_MIN:
        return widen_float16(a)
    return a.astype(work, copy=False)


def naive_extra(p, dtype: np.dtype) -> np.ndarray | None:
    """The additive term of problem `p` (bias, ALiBi, masks) rounded to `dtype`, as the baseline adds it."""
    extra = p.additive()
    rnd, _, work = rounding(dtype)
    return None if extra is None else rnd(extra.astype(work))  # a bias is an input in the kernel's dtype


def naive_forward_of(p, dtype: np.dtype, intermediate=None, fused=True, extra=False, lse_only=False,
                     keep_exact=True):
    """`naive_forward_arrays` of the prepared problem `p` (one (batch, head) of it, or all); `extra`: its
    `naive_extra` when the caller has it (False: computed here). With `lse_only` (a softmax's log-sum-exp
    is all the caller needs) the steps stop there: the weights, ``out`` and ``kept`` are None. Without
    `keep_exact` (a caller that needs no ``exact_weights``, which are then not meaningful) the weights may
    be rounded in their place."""
    rnd, inner, work = rounding(dtype, fused)
    sinks = p.sinks
    capped = None
    with np.errstate(invalid="ignore", over="ignore"):  # overflow to inf and NaN are the baseline's own
        s = inner(p.q.astype(work, copy=False) @ np.swapaxes(p.k.astype(work, copy=False), -1, -2))  # (..., L, S)
        s = inner(np.multiply(s, work.type(p.scale), out=s))  # in place: `s` is always a new array here
        if p.softcap is not None:
            tanh = np.tanh(np.divide(s, work.type(p.softcap), out=s), out=s)
            s, capped = inner(tanh * work.type(p.softcap)), inner(tanh)
        if extra is False:
            extra = naive_extra(p, dtype)
        if extra is not None:
            s = inner(into(np.add, s, extra))
        if sinks is not None:
            sinks = rnd(np.asarray(sinks).astype(work))[..., None, None]
        if p.normalization is not None:  # elementwise (the sigmoid), each step rounded as the scores; no lse
            exact, sink_weight, lse = p.normalization.weights(s, inner), None, None
        else:
            exact, sink_weight, lse = _naive_softmax(s, sinks, inner, work, weights=not lse_only, scratch=True)
        if lse_only:
            return p, None, capped, None, None, lse, None, None
        weights = rnd(exact) if keep_exact or exact.dtype == dtype else round_to(exact, dtype, in_place=True)
        if intermediate is not None:
            weights = weights.astype(intermediate).astype(work)
        kept = None
        if p.has_dropout:  # only with a given mask: the checkers take no generator
            kept = p.keep(weights.shape) * work.type(1.0 / (1.0 - p.dropout_p))  # (..., L, S)
        out = rnd((weights if kept is None else rnd(weights * kept)) @ p.v.astype(work, copy=False))  # (..., L, Ev)
    return p, weights, capped, sink_weight, out, lse, kept, exact


def naive_attention(q, k, v, dtype: np.dtype, options: dict, intermediate=None, fused=True) -> np.ndarray:
    """The naive formula in `dtype`, fused or textbook (the baseline; see assert_attention_close)."""
    p, _, _, _, out, _, _, _ = naive_forward_arrays(q, k, v, dtype, options, intermediate, fused)
    return np.broadcast_to(out, p.out_shape).astype(dtype)


def naive_backward(q, k, v, dout, dtype: np.dtype, options: dict, fused=True) -> AttentionGrads:
    """The naive backward in `dtype`, fused or textbook (the baseline of assert_attention_grads_close).

    Fused, as FlashAttention-2's backward: ``dV = P^T dO`` with the rounded weights, ``dP``, ``D`` and
    ``dS = P * (dP - D)`` in float32 from the exact weights, ``dS`` rounded before its two products.
    """
    p = naive_problem(q, k, v, dtype, options)
    dq, dk, dv, dbias, dsinks = naive_backward_of(p, dout, dtype, fused)
    return finish_grads(p, q, k, v, options, dq, dk, dv, dbias, dsinks, dtype=dtype)


def naive_backward_of(p, dout, dtype: np.dtype, fused=True, extra=False, dbias=True):
    """``(dq, dk, dv, dbias, dsinks)`` of `naive_backward` for the prepared problem `p`, before they are
    summed to the inputs' shapes (`attention_ref.backward.finish_grads`); `extra` as `naive_forward_of`.
    ``dbias`` is None without a bias, or when not asked for (`dbias` False)."""
    rnd, inner, work = rounding(dtype, fused)
    _, w, capped, sink_weight, out, _, kept, exact = naive_forward_of(p, dtype, fused=fused, extra=extra)
    dout = as_real_array(dout, "dout")
    do = widened(dout, work) if dout.dtype == dtype else rnd(dout.astype(work))  # in `dtype` already: exact
    with np.errstate(invalid="ignore", over="ignore"):
        dropped = w if kept is None else rnd(w * kept)
        dv = rnd(np.swapaxes(dropped, -1, -2) @ do)  # (..., S, Ev)
        dp = inner(do @ np.swapaxes(p.v.astype(work, copy=False), -1, -2))  # (..., L, S)
        if kept is not None:
            dp = inner(into(np.multiply, dp, kept))  # the gradient reaching the weights before dropout
        delta = inner(np.sum(inner(do * out), axis=-1))  # (..., L)
        if p.normalization is not None:
            dx = p.normalization.score_grad(exact, dp, inner)  # the sigmoid's P (1 - P) dP: the bias's gradient
        else:
            dx = inner(into(np.subtract, dp, delta[..., None]))  # in place: `dp` is not needed after
            dx = inner(into(np.multiply, dx, exact))  # the bias's gradient
        ds = dx if capped is None else inner(dx * inner(1 - inner(capped * capped)))
        ds = rnd(ds)  # the operand of the two products
        dq = rnd(rnd(ds @ p.k.astype(work, copy=False)) * work.type(p.scale))
        dk = rnd(rnd(np.swapaxes(ds, -1, -2) @ p.q.astype(work, copy=False)) * work.type(p.scale))
        dsinks = None if sink_weight is None else rnd(-np.sum(inner(sink_weight * delta), axis=-1))
    return dq, dk, dv, rnd(dx) if dbias and p.bias is not None else None, dsinks


class NaiveFlex:
    """The textbook forward of a FlexAttention problem in `dtype`, with what its backward needs.

    ``raw`` are the scaled scores before ``score_mod`` (B, Hq, L, S), ``weights`` the softmax, ``out``
    (B, Hq, L, Ev) and ``lse`` (B, Hq, L); ``keys`` and ``values`` hold the key/value heads repeated for
    each query head. The mods are evaluated once on the whole score matrix, in the working dtype. With
    `unit` ``(b, h)`` the problem is that one batch entry and query head alone (B = Hq = 1, with its key/value
    head), the mods given ``b`` and ``h``: the same numbers, in memory that does not grow with the batch.
    """

    def __init__(self, q, k, v, dtype: np.dtype, flex, fused=True, unit=None):
        rnd, inner, work = rounding(dtype, fused)
        self.rnd, self.inner, self.work, self.flex = rnd, inner, work, flex
        q, k, v = (as_real_array(a, name) for a, name in ((q, "q"), (k, "k"), (v, "v")))
        batch, heads = np.arange(q.shape[0]), np.arange(q.shape[1])
        self.where = "on the whole score matrix"
        if unit is not None:
            b, h = unit
            g = h // (q.shape[1] // k.shape[1])  # the key/value head of query head h
            kv = slice(g, g + 1)
            kb = slice(b, b + 1) if k.shape[0] > 1 else slice(0, 1)
            q, k, v = q[b:b + 1, h:h + 1], k[kb, kv], v[kb, kv]
            batch, heads = np.array([b]), np.array([h])
            self.where = f"on the score matrix of batch {b}, head {h}"
        q, k, v = (a.astype(dtype) for a in (q, k, v))
        B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        group = H // k.shape[1] if k.shape[1] else 1
        self.q, self.k, self.v = q, k, v
        self.keys, self.values = (np.repeat(a, group, axis=1).astype(work) for a in (k, v))  # (B|1, Hq, S, .)
        self.index = (batch.reshape(-1, 1, 1, 1), heads.reshape(1, -1, 1, 1),
                      np.arange(L).reshape(1, 1, -1, 1), np.arange(S).reshape(1, 1, 1, -1))
        self.shape = (B, H, L, S)
        with np.errstate(invalid="ignore", over="ignore"):  # overflow to inf and NaN are the baseline's own
            s = inner(q.astype(work) @ np.swapaxes(self.keys, -1, -2))  # (B, Hq, L, S)
            self.raw = inner(s * work.type(flex.scale))
            x = self.raw
            if flex.score_mod is not None:
                x = inner(tile_score(flex.score_mod, self.raw.copy(), self.index, self.where).astype(work))
            if flex.mask_mod is not None:
                x = np.where(tile_mask(flex.mask_mod, self.index, self.shape, self.where), x, -np.inf)
            self.scores = x  # what the softmax sees
            self.exact, _, self.lse = _naive_softmax(x, None, inner, work)
            self.weights = rnd(self.exact)  # what multiplies the values
            self.out = rnd(self.weights @ self.values)  # (B, Hq, L, Ev)

    def query_head_grads(self, dout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dq, dk, dv)`` of the textbook backward in the working dtype, dk and dv per query head
        (B, Hq, S, .), before they are summed to the key/value heads."""
        rnd, inner, work = self.rnd, self.inner, self.work
        do = rnd(as_real_array(dout, "dout").astype(work))
        scale = work.type(self.flex.scale)
        with np.errstate(invalid="ignore", over="ignore"):
            dv = rnd(np.swapaxes(self.weights, -1, -2) @ do)  # (B, Hq, S, Ev), per query head
            dp = inner(do @ np.swapaxes(self.values, -1, -2))  # (B, Hq, L, S)
            delta = inner(np.sum(inner(do * self.out), axis=-1))  # (B, Hq, L)
            ds = inner(self.exact * inner(dp - delta[..., None]))
            if self.flex.score_mod is not None:
                slope = inner(np.broadcast_to(self.flex.derivative(self.raw, *self.index), ds.shape).astype(work))
                ds = np.where(ds == 0, work.type(0), inner(ds * slope))  # masked: 0, never 0 * inf
            ds = rnd(ds)  # the operand of the two products
            dq = rnd(rnd(ds @ self.keys) * scale)
            dk = rnd(rnd(np.swapaxes(ds, -1, -2) @ self.q.astype(work)) * scale)  # (B, Hq, S, E)
        return dq, dk, dv

    def backward(self, dout) -> AttentionGrads:
        """The textbook backward of this problem in its dtype: ``(dq, dk, dv, None, None)``."""
        dq, dk, dv = self.query_head_grads(dout)

        def to_kv(grad, like):
            """(B, Hq, S, .) -> the shape of `like` (B|1, Hkv, S, .): summed over groups and a shared batch."""
            B, H, S = grad.shape[:3]
            grad = grad.reshape(B, like.shape[1], H // max(like.shape[1], 1), S, -1).sum(axis=2)
            return grad.sum(axis=0, keepdims=True) if like.shape[0] == 1 and B != 1 else grad

        dtype = self.q.dtype
        return AttentionGrads(dq.astype(dtype), to_kv(dk, self.k).astype(dtype), to_kv(dv, self.v).astype(dtype),
                              None, None)
