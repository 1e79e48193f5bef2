"""The backward pass of scaled dot-product attention: gradients of every input and option."""

from __future__ import annotations

import copy
import dataclasses
from typing import NamedTuple

import numpy as np

from ._attention_problem import AttentionProblem, prepare_attention
from ._normalization import needs_softmax
from ._online import safe_max
from ._options import DESCALES, DETERMINISTIC, OPTIONS, takes_options
from ._validation import as_real_array, check_shape, result_dtype
from .blockwise import block_sizes, blockwise_attention
from .softmax import logsumexp

__all__ = ["AttentionGrads", "attention_backward"]


class AttentionGrads(NamedTuple):
    """Gradients returned by `attention_backward`.

    Attributes
    ----------
    dq : ndarray
        Gradient with respect to `q`; its shape and dtype.
    dk : ndarray
        Gradient with respect to `k`; its shape and dtype (with grouped
        queries, summed over each key/value head's group).
    dv : ndarray
        Gradient with respect to `v`; its shape and dtype.
    dbias : ndarray or None
        Gradient with respect to `bias`, summed over the axes it was
        broadcast along; None without a bias.
    dsinks : ndarray or None
        Gradient with respect to `sinks`, in their shape; None without sinks.

    See Also
    --------
    attention_backward : Returns it.

    Examples
    --------
    A named tuple: unpack it, or read the gradients by name. Two queries,
    two keys and a sink, all with score 0, so every weight is 1/3:

    >>> import numpy as np
    >>> from attention_ref import attention_backward
    >>> x = np.ones((2, 1))
    >>> dq, dk, dv, dbias, dsinks = attention_backward(x, x, x, x, scale=0.0, sinks=0.0)
    >>> dv
    array([[0.66666667],
           [0.66666667]])
    >>> dsinks
    array(-0.44444444)
    """

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dbias: np.ndarray | None
    dsinks: np.ndarray | None


def sum_to(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum `grad` over the axes along which an array of `shape` was broadcast to ``grad.shape``."""
    lead = grad.ndim - len(shape)
    if lead > 0:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return np.broadcast_to(grad, shape)  # also for an axis of size 0


def sum_groups(grad: np.ndarray, heads: int) -> np.ndarray:
    """Sum the gradient of grouped-query-expanded keys or values, (..., Hq, S, E), back to `heads` heads."""
    hq = grad.shape[-3]
    if hq == heads:
        return grad
    return grad.reshape(*grad.shape[:-3], heads, hq // heads, *grad.shape[-2:]).sum(axis=-3)


def broadcast_index(idx: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Index, into an array of batch `shape`, of batch element `idx` of the shape it broadcasts to."""
    tail = idx[len(idx) - len(shape) :]
    return tuple(0 if n == 1 else i for i, n in zip(tail, shape, strict=True))


def _score_batch(p: AttentionProblem) -> tuple[int, ...]:
    """Batch axes of the forward's (..., L, S) weights, and so of its dropout mask."""
    shapes = [p.q.shape[:-2], p.k.shape[:-2]]
    shapes += [a.shape[:-2] for a in (p.mask, p.bias) if a is not None]
    return np.broadcast_shapes(*shapes)


@dataclasses.dataclass
class _Tile:
    """The recomputed forward of one tile of scores and its backward, shapes (..., l, s)."""

    weights: np.ndarray  # softmax weights (sinks in the denominator), before dropout
    capped: np.ndarray | None  # tanh(raw / softcap), for the soft cap's chain rule; None without a cap
    lse: np.ndarray | None  # (..., l): the rows' log-sum-exp (with the sink), as used; None for the sigmoid


def tile_scores(q_rows, k_cols, scale, softcap, raw_largest: list | None = None, extra=None):
    """The scaled (and soft-capped) scores of ``q_rows`` (..., l, E) against ``k_cols`` (..., s, E), and
    ``tanh(raw / softcap)`` for the cap's chain rule (None without a cap): ``(scores, capped)``, (..., l, s).

    With a cap, `raw_largest` (a list) gets the largest magnitude of the scores before it appended, over
    the pairs the tile's additive term `extra` (None: every pair) does not mask with ``-inf``.
    One definition for every tile the backward and the checkers' reference recompute."""
    x = q_rows @ np.swapaxes(k_cols, -1, -2)  # (..., l, s)
    x *= scale
    capped = None
    if softcap is not None:
        if raw_largest is not None:
            counted = np.isfinite(x) if extra is None else np.isfinite(x) & (extra > -np.inf)
            raw_largest.append(float(np.max(np.abs(x), initial=0.0, where=counted)))
        x /= softcap
        capped = np.tanh(x, out=x)
        x = capped * softcap
    return x, capped


def _forward_tile(p: AttentionProblem, q_rows, k_cols, extra, lse=None) -> _Tile:
    """Recompute the weights of ``q_rows`` (..., l, E) against ``k_cols`` (..., s, E).

    ``extra`` is the tile's additive term (or None). Without `lse` the tile
    must hold every key of its rows: the log-sum-exp is computed here.
    """
    x, capped = tile_scores(q_rows, k_cols, p.scale, p.softcap)
    if extra is not None:
        x = x + extra
    if p.normalization is not None:  # each weight from its own score (the sigmoid): no row's log-sum-exp
        return _Tile(p.normalization.weights(x), capped, lse)
    if lse is None:
        lse = logsumexp(x, axis=-1) if x.shape[-1] else np.full(x.shape[:-1], -np.inf, x.dtype)
        if p.sinks is not None:
            lse = np.logaddexp(lse, p.sinks[..., None])  # the sink's term exp(s_h) in each row's denominator
    x -= safe_max(lse)[..., None]  # rows with no allowed key (lse = -inf): exp(-inf - 0) = 0
    return _Tile(np.exp(x, out=x), capped, lse)


def _backward_tile(p: AttentionProblem, tile: _Tile, dout_rows, v_cols, delta_rows, keep, dropout_p):
    """Gradients of one tile: ``(dx, draw, dropped)``, each (..., l, s).

    ``dx`` is the gradient of the scores after cap and bias (the bias's
    gradient), ``draw`` that of the scaled scores ``scale * q k^T`` before
    the cap, and ``dropped`` the weights after dropout (what multiplied
    the values). ``keep`` is the tile's dropout mask or None.
    """
    dp = dout_rows @ np.swapaxes(v_cols, -1, -2)  # dP = dO V^T, (..., l, s)
    dropped = tile.weights
    if keep is not None:
        factor = keep / (1.0 - dropout_p)
        dropped = dropped * factor
        dp *= factor
    if p.normalization is not None:
        dx = p.normalization.score_grad(tile.weights, dp)  # the sigmoid's: dS = P (1 - P) dP
    else:
        dp -= delta_rows[..., None]  # dP - D
        dx = np.multiply(tile.weights, dp, out=dp)  # dS = P * (dP - D)
    if tile.capped is None:
        return dx, dx, dropped
    return dx, dx * (1.0 - tile.capped * tile.capped), dropped  # d(c tanh(u / c)) / du = 1 - tanh^2


def _dense(p, dout, out, lse, keep, dropout_p):
    """Gradients over the whole (..., L, S) matrix at once: ``(dq, dk, dv, dx, lse, delta)`` over the full batch."""
    tile = _forward_tile(p, p.q, p.k, p.additive(), lse)
    if out is None:
        dropped = tile.weights if keep is None else tile.weights * keep / (1.0 - dropout_p)
        out = dropped @ p.v  # (..., L, Ev)
    delta = np.einsum("...le,...le->...l", dout, out)  # D = rowsum(dO * O), (..., L)
    dx, draw, dropped = _backward_tile(p, tile, dout, p.v, delta, keep, dropout_p)
    dq = (draw @ p.k) * p.scale
    dk = (np.swapaxes(draw, -1, -2) @ p.q) * p.scale
    dv = np.swapaxes(dropped, -1, -2) @ dout
    return dq, dk, dv, dx, tile.lse, delta


def _tiles(p, batch, block_q, block_k, keeps):
    """Yield ``(idx, rows, cols, extra, keep)`` for every tile a causal mask or window does not hide.

    Batch elements run in the order of the forward's dropout draws: for each
    element of the weights' batch (C order), each block of query rows draws
    its ``(rows, S)`` dropout mask from `keeps` (None: no dropout) once, then
    serves every batch element sharing those weights (`v` may broadcast them).
    """
    p_inside = dataclasses.replace(p, window=None)  # tiles wholly inside the window need no band mask
    score_batch = _score_batch(p)
    members: dict = {s: [] for s in np.ndindex(*score_batch)}
    for idx in np.ndindex(*batch):
        members[broadcast_index(idx, score_batch)].append(idx)
    L = p.n_queries
    for group in members.values():
        for r0 in range(0, L, block_q):
            rows = slice(r0, min(L, r0 + block_q))
            keep = None if keeps is None else keeps(rows.stop - rows.start)  # (l, S)
            start, stop = p.key_range(rows)
            for c0 in range(start, stop, block_k):
                cols = slice(c0, min(stop, c0 + block_k))
                extra = (p_inside if p.inside_window(rows, cols) else p).additive(rows, cols)
                for idx in group:
                    tile_extra = None if extra is None else np.broadcast_to(extra, batch + extra.shape[-2:])[idx]
                    yield idx, rows, cols, tile_extra, None if keep is None else keep[:, cols]


def _accumulate(target: np.ndarray, idx, rows: slice, cols: slice, tile: np.ndarray) -> None:
    """Add the (l, s) `tile` of batch element `idx` into `target`, summing where `target` has size-one axes."""
    if target.shape[-2] == 1:
        tile, rows = tile.sum(axis=0, keepdims=True), slice(None)
    if target.shape[-1] == 1:
        tile, cols = tile.sum(axis=1, keepdims=True), slice(None)
    where: tuple = (*broadcast_index(idx, target.shape[:-2]), rows, cols)
    target[where] += tile


def _tiled(p, dout, out, lse, keeps, keeps_again, dropout_p, block_q, block_k):
    """Gradients tile by tile from `lse`: ``(dq, dk, dv, dbias, delta)``, the first three over the full batch.

    ``keeps`` draws the dropout masks (None: no dropout); ``keeps_again``
    draws the same masks a second time, for recomputing `out` if it is None.
    """
    batch = p.out_shape[:-2]
    dtype = p.q.dtype
    q = np.broadcast_to(p.q, batch + p.q.shape[-2:])  # (..., L, E)
    k = np.broadcast_to(p.k, batch + p.k.shape[-2:])  # (..., S, E)
    v = np.broadcast_to(p.v, batch + p.v.shape[-2:])  # (..., S, Ev)
    if out is None:  # only with dropout: the output that used this mask, recomputed tile by tile
        out = np.zeros(p.out_shape, dtype=dtype)
        for idx, rows, cols, extra, keep in _tiles(p, batch, block_q, block_k, keeps_again):
            tile = _forward_tile(p, q[(*idx, rows)], k[(*idx, cols)], extra, lse[(*idx, rows)])
            out[(*idx, rows)] += (tile.weights * keep / (1.0 - dropout_p)) @ v[(*idx, cols)]
    delta = np.einsum("...le,...le->...l", dout, out)  # D = rowsum(dO * O), (..., L)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dbias = None if p.bias is None else np.zeros(p.bias.shape, dtype=dtype)
    for idx, rows, cols, extra, keep in _tiles(p, batch, block_q, block_k, keeps):
        tile = _forward_tile(p, q[(*idx, rows)], k[(*idx, cols)], extra, lse[(*idx, rows)])
        dx, draw, dropped = _backward_tile(p, tile, dout[(*idx, rows)], v[(*idx, cols)], delta[(*idx, rows)], keep,
                                           dropout_p)
        dq[(*idx, rows)] += (draw @ k[(*idx, cols)]) * p.scale
        dk[(*idx, cols)] += (draw.T @ q[(*idx, rows)]) * p.scale
        dv[(*idx, cols)] += dropped.T @ dout[(*idx, rows)]
        if dbias is not None:
            _accumulate(dbias, idx, rows, cols, dx)
    return dq, dk, dv, dbias, delta


@takes_options(*(name for name in OPTIONS if name not in DESCALES))
def attention_backward(q, k, v, dout, *, out=None, lse=None, block_size=None, **options):
    r"""Gradients of `scaled_dot_product_attention` with respect to `q`, `k`, `v`, `bias` and `sinks`.

    Given the gradient `dout` of a loss with respect to the attention
    output, returns the gradients of that loss with respect to the inputs
    (vector-Jacobian products), as ``loss.backward()`` through PyTorch's
    ``scaled_dot_product_attention`` gives them.

    Parameters
    ----------
    q : array_like, shape (..., L, E)
        Queries, as given to the forward.
    k : array_like, shape (..., S, E)
        Keys.
    v : array_like, shape (..., S, Ev)
        Values.
    dout : array_like, shape (..., L, Ev)
        Gradient of the loss with respect to the output; the shape of the
        forward's output.
    mask, bias, is_causal, causal_alignment, window, scale, softcap, alibi_slopes, sinks, enable_gqa
        The options of the forward call, as in
        `scaled_dot_product_attention`. Masks, windows and ALiBi slopes get
        no gradient.
    normalization : {"softmax", "sigmoid"}, optional
        The forward's normalization of the weights (see Notes).
    sigmoid_bias : float, optional
        The sigmoid's bias, as the forward took it (default ``-log S``).
    dropout_p : float, optional
        Dropout probability of the forward call, in [0, 1).
    rng : numpy.random.Generator, optional
        Required when ``dropout_p > 0`` without `dropout_mask`: a generator
        in the state the forward's generator had before the forward call, so
        that the same dropout mask is drawn (see Notes).
    dropout_mask : array_like of bool, shape broadcastable to (..., L, S), optional
        The forward's keep-mask, as `scaled_dot_product_attention` takes it:
        the same mask is applied, nothing is drawn. Not with `rng`.
    out : array_like, shape (..., L, Ev), optional
        The forward's output. Used, not recomputed, when given.
    lse : array_like, shape (..., L), optional
        The forward's log-sum-exp of each row, as ``blockwise_attention(...,
        return_lse=True)`` returns it (with the sink in it). Used, not
        recomputed, when given.
    block_size : int or (int, int), optional
        None (default): the whole (L, S) matrix of weights at once. An int,
        or a pair ``(block_q, block_k)``: tiles of that many query rows and
        key columns, the weights recomputed tile by tile from `lse`, with
        the tiles that a causal mask or window hides skipped. Softmax
        only.

    Returns
    -------
    AttentionGrads
        The named tuple ``(dq, dk, dv, dbias, dsinks)``: `dq`, `dk`, `dv`
        with the shapes and dtypes of `q`, `k` and `v` (computed in float64
        for float16 and bfloat16 input, else in the input's float, and
        rounded once); `dbias` with the shape and dtype of `bias`, summed over the
        axes it was broadcast along, or None; `dsinks` with the shape and
        dtype of `sinks`, or None.

    Raises
    ------
    TypeError
        As `scaled_dot_product_attention`; also if `dout`, `out` or `lse`
        is not a real array or `block_size` is not an int or pair of ints.
    ValueError
        As `scaled_dot_product_attention`; also if `dout` or `out` does not
        have the shape of the output, `lse` not that of the output without
        its last axis, or a block size is < 1; if `lse` or `block_size`
        comes with ``normalization="sigmoid"`` (they need the softmax).

    See Also
    --------
    scaled_dot_product_attention : The forward pass.
    blockwise_attention : The forward pass that returns `lse`.

    Notes
    -----
    With :math:`x_{ij}` the scores after scale, cap and additive terms,
    :math:`P_{ij} = e^{x_{ij} - \mathrm{lse}_i}` the weights,
    :math:`Z_{ij}` the dropout factor (0, or :math:`1/(1-p)` where a weight
    is kept; 1 without dropout) and :math:`O = (P \circ Z) V` the output:

    .. math::

        dV = (P \circ Z)^\top dO, \qquad
        dP = (dO\, V^\top) \circ Z, \qquad
        D_i = \sum_e dO_{ie}\, O_{ie}, \qquad
        dX = P \circ (dP - D),

    the softmax's Jacobian :math:`\partial P_{ij} / \partial x_{ik} =
    P_{ij} (\delta_{jk} - P_{ik})` applied to :math:`dP`. :math:`D_i =
    \sum_j P_{ij} dP_{ij}`, but only :math:`dO` and :math:`O` are needed to
    form it, never a stored :math:`P`; with `lse` the weights of any tile
    can be recomputed alone, which is how FlashAttention's backward runs in
    :math:`O((L + S)\, b)` memory. `dX` is the gradient of `bias`. The soft
    cap :math:`x = c \tanh(u / c)` of :math:`u = \sigma\, q \cdot k`
    multiplies it by :math:`1 - \tanh^2(u / c)`, giving :math:`dU`; then
    :math:`dQ = \sigma\, dU K` and :math:`dK = \sigma\, dU^\top Q`.

    A sink :math:`s_h` is one more term :math:`e^{s_h}` of each row's
    denominator, so :math:`\partial P_{ij} / \partial s_h = -P_{ij}
    P^{\mathrm{sink}}_i` with :math:`P^{\mathrm{sink}}_i = e^{s_h -
    \mathrm{lse}_i}`, and

    .. math::

        \frac{\partial \mathcal{L}}{\partial s_h}
        = -\sum_i P^{\mathrm{sink}}_i D_i .

    A row with no allowed key has zero weights and output, so it adds
    nothing to any gradient.

    With ``normalization="sigmoid"`` each weight :math:`P_{ij} =
    \operatorname{sigmoid}(x_{ij} + b)` depends on its own score only: no
    row sum, no :math:`D`, and

    .. math::

        dX = P \circ (1 - P) \circ dP,

    zero on masked keys, where :math:`P = 0`.

    Dropout: `scaled_dot_product_attention` draws its keep mask as
    ``rng.random(shape) >= dropout_p``, one draw over the (..., L, S)
    weights in C order. Both paths here draw the same numbers (the tiled
    one a block of query rows at a time, in the same order), so a
    generator in the state the forward's was in gives the forward's mask:
    create both from the same seed, or pass ``copy.deepcopy(rng)`` of the
    forward's generator taken before the forward call.

    References
    ----------
    .. [1] Dao, T., "FlashAttention-2: Faster Attention with Better
       Parallelism and Work Partitioning", ICLR, 2024 (Algorithm 2).
    .. [2] Paszke, A. et al., "PyTorch: An Imperative Style,
       High-Performance Deep Learning Library", NeurIPS, 2019.

    Examples
    --------
    One query, two keys with scores 0 and :math:`\log 3` (weights 1/4 and
    3/4): raising the first value raises the output by 1/4, and the
    query's gradient pulls it towards the key with the larger value:

    >>> import numpy as np
    >>> from attention_ref import attention_backward
    >>> q = np.array([[1.0]])
    >>> k = np.array([[0.0], [np.log(3.0)]])
    >>> v = np.array([[0.0], [4.0]])
    >>> grads = attention_backward(q, k, v, np.ones((1, 1)), scale=1.0)
    >>> grads.dv
    array([[0.25],
           [0.75]])
    >>> grads.dq
    array([[0.82395922]])
    >>> grads.dbias is None, grads.dsinks is None
    (True, True)

    The tiled path gives the same gradients, here with a causal mask, a
    bias and sinks, whose gradients come back in their own shapes:

    >>> rng = np.random.default_rng(0)
    >>> q, k, v, dout = rng.standard_normal((4, 2, 5, 3))
    >>> options = {"is_causal": True, "bias": rng.standard_normal((5, 5)), "sinks": [0.5, -1.0]}
    >>> dense = attention_backward(q, k, v, dout, **options)
    >>> tiled = attention_backward(q, k, v, dout, block_size=2, **options)
    >>> all(np.allclose(a, b, rtol=0, atol=1e-13) for a, b in zip(dense, tiled))
    True
    >>> dense.dbias.shape, dense.dsinks.shape
    ((5, 5), (2,))

    Dropout: a generator in the forward's starting state gives its mask.

    >>> from attention_ref import scaled_dot_product_attention
    >>> out = scaled_dot_product_attention(q, k, v, dropout_p=0.5, rng=np.random.default_rng(7))
    >>> grads = attention_backward(q, k, v, dout, out=out, dropout_p=0.5, rng=np.random.default_rng(7))
    >>> bool(np.isclose(np.sum(grads.dv * v), np.sum(dout * out), rtol=1e-12, atol=0))  # out is linear in v
    True

    Sigmoid attention: one query, one key of score 0 and bias 0 (the
    default :math:`-\log S` with :math:`S = 1`), so the weight is 1/2 and
    its derivative 1/4:

    >>> one = np.ones((1, 1))
    >>> grads = attention_backward(one, one, one, one, scale=0.0, normalization="sigmoid", sigmoid_bias=0.0)
    >>> grads.dv, grads.dq
    (array([[0.5]]), array([[0.]]))
    >>> attention_backward(one, one, one, one, scale=0.0, normalization="sigmoid", bias=np.zeros((1, 1))).dbias
    array([[0.25]])
    """
    # float16 and bfloat16 are worked in float64: the weights recomputed from lse carry a float32 error of about
    # eps32 * |lse|, which dP - D turns into a large relative error where a row's weight is nearly one (a key
    # beside a far lower sink). Each gradient still comes back in its argument's dtype.
    given = (q, k, v)
    if result_dtype(*(as_real_array(a, name) for a, name in zip(given, "qkv", strict=True)))[0].itemsize < 4:
        q, k, v = (as_real_array(a, name).astype(np.float64) for a, name in zip(given, "qkv", strict=True))
    p = prepare_attention(q, k, v, **options)
    dropout_p = p.dropout_p
    work = p.q.dtype
    dout = checked_array(dout, "dout", p.out_shape, "the shape of the attention output (..., L, Ev)", work)
    if out is not None:
        out = checked_array(out, "out", p.out_shape, "the shape of the attention output (..., L, Ev)", work)
    if lse is not None:
        lse = checked_array(lse, "lse", p.out_shape[:-1],
                            "the attention output's shape without its last axis, (..., L)", work)
    blocks = None if block_size is None else block_sizes(block_size)
    for name, value in (("block_size", block_size), ("lse", lse)):
        if value is not None:  # the tiles recompute the softmax's weights from its log-sum-exp
            needs_softmax(options["normalization"], name)

    score_shape = (*_score_batch(p), p.n_queries, p.n_keys)
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite input: NaN gradients, no warning
        if blocks is None:
            keep = p.keep(score_shape) if p.has_dropout else None
            dq, dk, dv, dx, lse, delta = _dense(p, dout, out, lse, keep, dropout_p)
            dbias = None if p.bias is None else dx
        else:
            if lse is None or (out is None and not p.has_dropout):
                # The forward, tile by tile: its lse (and, without dropout, its output).
                forward = blockwise_attention(q, k, v, block_size=blocks, return_lse=True,
                                              **{name: options[name] for name in DETERMINISTIC if name in options})
                out = forward[0].astype(work) if out is None and not p.has_dropout else out
                lse = forward[1].astype(work) if lse is None else lse
            keeps = keeps_again = None
            if p.dropout_mask is not None:  # the given mask, read in the order the draws would come
                keeps, keeps_again = _mask_rows(p.keep(score_shape)), _mask_rows(p.keep(score_shape))
            elif dropout_p > 0:
                again = copy.deepcopy(p.rng)  # the same draws once more, for the output if it must be recomputed
                keeps = _draws(p.rng, p.n_keys, dropout_p)
                keeps_again = _draws(again, p.n_keys, dropout_p)
            dq, dk, dv, dbias, delta = _tiled(p, dout, out, lse, keeps, keeps_again, dropout_p, *blocks)
        dsinks = None
        if p.sinks is not None:
            sink_weight = np.exp(p.sinks[..., None] - lse)  # (..., L): each row's weight on its sink
            dsinks = -np.sum(sink_weight * delta, axis=-1)  # (..., H) over the full batch

    return finish_grads(p, *given, options, dq, dk, dv, dbias, dsinks)


def finish_grads(p: AttentionProblem, q, k, v, options: dict, dq, dk, dv, dbias, dsinks, dtype=None) -> AttentionGrads:
    """Sum gradients computed over the full batch (and expanded heads) back to the inputs' shapes.

    ``q``, ``k``, ``v``, ``options["bias"]`` and ``options["sinks"]`` are the
    arguments as given; each gradient takes its argument's shape and dtype
    (or `dtype` if given). ``dbias`` and ``dsinks`` may be None.
    """
    heads = np.shape(k)[-3] if options.get("enable_gqa") else None

    def finish(grad, shape, arg, name, grouped=False):
        if shape is None:  # no such argument
            return None
        grad = sum_to(grad, shape)  # over the axes the argument was broadcast along
        if grouped and heads:
            grad = sum_groups(grad, heads)  # over each key/value head's group of query heads
        return np.array(grad.reshape(np.shape(arg)), dtype=dtype or as_real_array(arg, name).dtype)

    return AttentionGrads(
        finish(dq, p.q.shape, q, "q"),
        finish(dk, p.k.shape, k, "k", grouped=True),
        finish(dv, p.v.shape, v, "v", grouped=True),
        finish(dbias, None if p.bias is None else p.bias.shape, options.get("bias"), "bias"),
        finish(dsinks, None if p.sinks is None else p.sinks.shape, options.get("sinks"), "sinks"),
    )


def checked_array(arr, name: str, shape, what: str, dtype) -> np.ndarray:
    """`arr` as a real array of exactly `shape`, in the working `dtype`."""
    arr = as_real_array(arr, name)
    check_shape(arr, name, shape, what)
    return arr.astype(dtype, copy=False)


def _mask_rows(keep: np.ndarray):
    """A function giving the next ``rows`` rows of the keep-mask `keep` (..., L, S), in C order, as `_draws` does."""
    flat = keep.reshape(-1, keep.shape[-1])  # (N * L, S)
    start = 0

    def keeps(rows: int) -> np.ndarray:
        nonlocal start
        start += rows
        return flat[start - rows : start]

    return keeps


def _draws(rng: np.random.Generator, n_keys: int, dropout_p: float):
    """A function drawing the dropout mask of the next ``rows`` query rows, ``(rows, n_keys)``, from `rng`."""

    def keeps(rows: int) -> np.ndarray:
        return rng.random((rows, n_keys)) >= dropout_p

    return keeps

