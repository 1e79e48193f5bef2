"""Multi-head attention: projections, head splitting, grouped key/value heads."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._options import NORMALIZATION, takes_options
from ._validation import (
    as_real_array,
    check_bool,
    check_generator,
    check_int,
    check_last_dim,
    check_ndim,
    check_shape,
    float_dtype,
    result_dtype,
)
from .attention import scaled_dot_product_attention

__all__ = ["MultiHeadParams", "init_multi_head_params", "merge_heads", "multi_head_attention", "split_heads"]

_ARRAY_FIELDS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


@dataclass(frozen=True, eq=False)
class MultiHeadParams:
    r"""Weights of one multi-head attention layer, checked for consistent shapes.

    Row-vector convention: a row of features is multiplied from the left,
    ``Q = x @ w_q + b_q``. Head ``h`` owns columns ``h*d_head:(h+1)*d_head``
    of `w_q` (and of `w_k`, `w_v` for key/value head ``h``) and rows
    ``h*d_head:(h+1)*d_head`` of `w_o`.

    Parameters
    ----------
    w_q : array_like, shape (d_model, n_heads * d_head)
        Query projection.
    w_k : array_like, shape (d_context, n_kv_heads * d_head)
        Key projection. ``d_context`` is the feature size of the sequence
        that keys and values are read from; it equals ``d_model`` for
        self-attention and may differ for cross-attention (PyTorch's
        ``kdim``/``vdim``).
    w_v : array_like, shape (d_context, n_kv_heads * d_head)
        Value projection. Values have the same head size as queries and keys.
    w_o : array_like, shape (n_heads * d_head, d_model)
        Output projection applied to the concatenated heads.
    n_heads : int
        Number of query heads, H >= 1; must divide ``w_q.shape[1]``.
    b_q : array_like, shape (n_heads * d_head,), optional
        Query bias; None means no bias.
    b_k, b_v : array_like, shape (n_kv_heads * d_head,), optional
        Key and value biases.
    b_o : array_like, shape (d_model,), optional
        Output bias.
    n_kv_heads : int, optional
        Number of key/value heads; defaults to `n_heads` (ordinary
        multi-head attention). 1 gives multi-query attention [2]_, a divisor
        of `n_heads` in between gives grouped-query attention [3]_: query
        head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``.

    Attributes
    ----------
    d_model : int
        Feature size of the queries' input and of the output.
    d_context : int
        Feature size of the keys' and values' input.
    d_head : int
        Size of one head.
    n_kv_heads : int
        Always an int after construction (`n_heads` if it was None).
    n_params : int
        Number of scalar parameters, biases included.

    Raises
    ------
    TypeError
        If a weight is missing (None) or not a real numeric array, or a head
        count is not an int.
    ValueError
        If a weight is not 2-D, shapes disagree with each other, or
        `n_kv_heads` does not divide `n_heads`.

    See Also
    --------
    init_multi_head_params : Random (Glorot-uniform) parameters.
    multi_head_attention : Applies the layer.

    Notes
    -----
    Arrays are stored as given (integers become float64); the dataclass is
    frozen, so the fields cannot be reassigned, but the arrays themselves
    are not copied. Instances compare by identity.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.
    .. [2] Shazeer, N., "Fast Transformer Decoding: One Write-Head is All
       You Need", arXiv:1911.02150, 2019.
    .. [3] Ainslie, J. et al., "GQA: Training Generalized Multi-Query
       Transformer Models from Multi-Head Checkpoints", EMNLP, 2023.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import MultiHeadParams
    >>> eye = np.eye(4)
    >>> p = MultiHeadParams(w_q=eye, w_k=eye, w_v=eye, w_o=eye, n_heads=2)
    >>> p.d_model, p.d_head, p.n_kv_heads, p.n_params
    (4, 2, 2, 64)

    Two query heads sharing one key/value head (multi-query attention):

    >>> p = MultiHeadParams(w_q=eye, w_k=eye[:, :2], w_v=eye[:, :2], w_o=eye, n_heads=2, n_kv_heads=1)
    >>> p.w_k.shape, p.n_kv_heads
    ((4, 2), 1)
    """

    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray
    w_o: np.ndarray
    n_heads: int
    b_q: np.ndarray | None = None
    b_k: np.ndarray | None = None
    b_v: np.ndarray | None = None
    b_o: np.ndarray | None = None
    n_kv_heads: int | None = None

    def __post_init__(self):
        for name in ("w_q", "w_k", "w_v", "w_o"):
            if getattr(self, name) is None:
                raise TypeError(f"{name} is required: a 2-D array of real numbers; got None")
        for name in _ARRAY_FIELDS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_real_array(value, name))
        n_heads = check_int(self.n_heads, "n_heads", minimum=1)
        n_kv = n_heads if self.n_kv_heads is None else check_int(self.n_kv_heads, "n_kv_heads", minimum=1)
        object.__setattr__(self, "n_heads", n_heads)
        object.__setattr__(self, "n_kv_heads", n_kv)
        if n_heads % n_kv:
            raise ValueError(f"n_kv_heads must divide n_heads; got n_heads={n_heads} and n_kv_heads={n_kv}")

        for name in ("w_q", "w_k", "w_v", "w_o"):
            w = getattr(self, name)
            if w.ndim != 2:
                raise ValueError(f"{name} must be a 2-D matrix; got shape {w.shape}")
        d_model, width_q = self.w_q.shape
        if width_q == 0 or width_q % n_heads:
            raise ValueError(
                f"w_q must have n_heads * d_head columns with d_head >= 1; got shape {self.w_q.shape} "
                f"for n_heads={n_heads}"
            )
        d_head = width_q // n_heads
        d_context = self.w_k.shape[0]
        check_shape(self.w_k, "w_k", (d_context, n_kv * d_head))
        check_shape(self.w_v, "w_v", (d_context, n_kv * d_head))
        check_shape(self.w_o, "w_o", (n_heads * d_head, d_model))
        for name, size in (("b_q", n_heads * d_head), ("b_k", n_kv * d_head), ("b_v", n_kv * d_head), ("b_o", d_model)):
            b = getattr(self, name)
            if b is not None:
                check_shape(b, name, (size,))

    @property
    def d_model(self) -> int:
        """Feature size of the queries' input and of the output."""
        return self.w_q.shape[0]

    @property
    def d_context(self) -> int:
        """Feature size of the keys' and values' input."""
        return self.w_k.shape[0]

    @property
    def d_head(self) -> int:
        """Size of one head."""
        return self.w_q.shape[1] // self.n_heads

    @property
    def n_params(self) -> int:
        """Number of scalar parameters, biases included."""
        return sum(a.size for a in _present_arrays(self).values())


def _present_arrays(params) -> dict[str, np.ndarray]:
    """The weight and bias arrays of `params` that are not None, by field name."""
    return {name: a for name in _ARRAY_FIELDS if (a := getattr(params, name)) is not None}


def _glorot_uniform(rng, fan_in, fan_out, dtype):
    """A ``(fan_in, fan_out)`` matrix drawn from U(-a, a), ``a = sqrt(6 / (fan_in + fan_out))``."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(dtype)


def init_multi_head_params(rng, d_model, n_heads, *, n_kv_heads=None, d_head=None, bias=True, dtype=np.float64):
    r"""Random multi-head attention parameters: Glorot-uniform weights, zero biases.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of randomness (e.g. ``numpy.random.default_rng(0)``).
    d_model : int
        Model width (>= 1); also the key/value input size (self-attention).
    n_heads : int
        Number of query heads (>= 1).
    n_kv_heads : int, optional
        Number of key/value heads; must divide `n_heads`. Default `n_heads`.
    d_head : int, optional
        Size of each head. Default ``d_model // n_heads``, which then must
        divide exactly.
    bias : bool, optional
        Create zero biases (True, default) or none (False).
    dtype : {numpy.float16, numpy.float32, numpy.float64}, optional
        Dtype of every array: a NumPy dtype or name, or the same float as
        a torch or JAX dtype (``torch.float32``). Default float64.

    Returns
    -------
    MultiHeadParams
        With ``w_q (d_model, n_heads*d_head)``, ``w_k`` and ``w_v``
        ``(d_model, n_kv_heads*d_head)``, ``w_o (n_heads*d_head, d_model)``.

    Raises
    ------
    TypeError
        If `rng` is not a Generator, a size is not an int, `bias` is not a
        bool, or `dtype` is not one of the three float dtypes.
    ValueError
        If a size is < 1, `n_heads` does not divide `d_model` when `d_head`
        is not given, or `n_kv_heads` does not divide `n_heads`.

    See Also
    --------
    MultiHeadParams : The container returned.
    multi_head_attention : Applies the layer.

    Notes
    -----
    Each matrix of shape ``(fan_in, fan_out)`` is drawn independently from

    .. math::

        W_{ij} \sim \mathcal{U}\!\left(-a, a\right), \qquad
        a = \sqrt{\frac{6}{\mathrm{fan_{in}} + \mathrm{fan_{out}}}},

    which gives :math:`\operatorname{Var}(W_{ij}) = 2 / (\mathrm{fan_{in}} +
    \mathrm{fan_{out}})` [1]_. PyTorch's ``nn.MultiheadAttention`` applies
    the same rule to its stacked ``(3E, E)`` input projection, so its
    query/key/value bound is slightly smaller; the distributions are not
    meant to match PyTorch draw for draw.

    References
    ----------
    .. [1] Glorot, X. and Y. Bengio, "Understanding the difficulty of training
       deep feedforward neural networks", AISTATS, 2010.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import init_multi_head_params
    >>> p = init_multi_head_params(np.random.default_rng(0), 8, 4, n_kv_heads=2)
    >>> p.w_q.shape, p.w_k.shape, p.w_o.shape, p.d_head
    ((8, 8), (8, 4), (8, 8), 2)
    >>> bool(np.abs(p.w_q).max() <= np.sqrt(6 / 16)), p.b_o
    (True, array([0., 0., 0., 0., 0., 0., 0., 0.]))
    """
    check_generator(rng)
    d_model = check_int(d_model, "d_model", minimum=1)
    n_heads = check_int(n_heads, "n_heads", minimum=1)
    n_kv = n_heads if n_kv_heads is None else check_int(n_kv_heads, "n_kv_heads", minimum=1)
    if d_head is None:
        if d_model % n_heads:
            raise ValueError(
                f"n_heads must divide d_model when d_head is not given; got d_model={d_model}, n_heads={n_heads}"
            )
        d_head = d_model // n_heads
    else:
        d_head = check_int(d_head, "d_head", minimum=1)
    dtype = float_dtype(dtype)
    bias = check_bool(bias, "bias")
    if n_heads % n_kv:  # checked here too so the message comes before any random draw
        raise ValueError(f"n_kv_heads must divide n_heads; got n_heads={n_heads} and n_kv_heads={n_kv}")

    width_q, width_kv = n_heads * d_head, n_kv * d_head
    weights = {
        "w_q": _glorot_uniform(rng, d_model, width_q, dtype),
        "w_k": _glorot_uniform(rng, d_model, width_kv, dtype),
        "w_v": _glorot_uniform(rng, d_model, width_kv, dtype),
        "w_o": _glorot_uniform(rng, width_q, d_model, dtype),
    }
    biases = {}
    if bias:
        biases = {
            "b_q": np.zeros(width_q, dtype),
            "b_k": np.zeros(width_kv, dtype),
            "b_v": np.zeros(width_kv, dtype),
            "b_o": np.zeros(d_model, dtype),
        }
    return MultiHeadParams(n_heads=n_heads, n_kv_heads=n_kv, **weights, **biases)


def split_heads(x, n_heads):
    r"""Split the feature axis into heads: ``(..., T, H*D) -> (..., H, T, D)``.

    Parameters
    ----------
    x : array_like, shape (..., T, H * D)
        Projected features; head ``h`` owns features ``h*D:(h+1)*D``.
    n_heads : int
        Number of heads H (>= 1); must divide the last axis.

    Returns
    -------
    ndarray, shape (..., H, T, D)
        A view where possible (integers become float64).

    Raises
    ------
    TypeError
        If `x` is not real numeric or `n_heads` is not an int.
    ValueError
        If `x` has fewer than 2 axes or `n_heads` does not divide its last axis.

    See Also
    --------
    merge_heads : The inverse.
    multi_head_attention : Splits its projections with this.

    Notes
    -----
    With :math:`X \in \mathbb{R}^{T \times HD}`, head :math:`h` is the
    column block :math:`X_{:,\, hD:(h+1)D}`, the slicing of the projections
    into heads of [1]_. Only the axes are rearranged; no value changes.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import split_heads
    >>> x = np.array([[0.0, 1.0, 2.0, 3.0],
    ...               [4.0, 5.0, 6.0, 7.0]])  # T = 2, H*D = 4
    >>> split_heads(x, 2)
    array([[[0., 1.],
            [4., 5.]],
    <BLANKLINE>
           [[2., 3.],
            [6., 7.]]])
    """
    x = as_real_array(x, "x")
    check_ndim(x, "x", 2, "(..., T, H*D)")
    n_heads = check_int(n_heads, "n_heads", minimum=1)
    width = x.shape[-1]
    if width % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide the last axis of x; got shape {x.shape}")
    t = x.shape[-2]
    return np.swapaxes(x.reshape(*x.shape[:-2], t, n_heads, width // n_heads), -3, -2)


def merge_heads(x):
    r"""Concatenate heads along the feature axis: ``(..., H, T, D) -> (..., T, H*D)``.

    Parameters
    ----------
    x : array_like, shape (..., H, T, D)
        Per-head features.

    Returns
    -------
    ndarray, shape (..., T, H * D)
        Head ``h`` in features ``h*D:(h+1)*D``.

    Raises
    ------
    TypeError
        If `x` is not real numeric.
    ValueError
        If `x` has fewer than 3 axes.

    See Also
    --------
    split_heads : The inverse.
    multi_head_attention : Merges the heads with this before ``w_o``.

    Notes
    -----
    The result is :math:`[\operatorname{head}_0, \ldots,
    \operatorname{head}_{H-1}]`, concatenated along features, which [1]_
    multiplies by :math:`W^O`.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import merge_heads
    >>> heads = np.array([[[0.0, 1.0]], [[2.0, 3.0]]])  # H = 2, T = 1, D = 2
    >>> merge_heads(heads)
    array([[0., 1., 2., 3.]])
    """
    x = as_real_array(x, "x")
    check_ndim(x, "x", 3, "(..., H, T, D)")
    h, t, d = x.shape[-3:]
    return np.swapaxes(x, -3, -2).reshape(*x.shape[:-3], t, h * d)


def _project(x, w, b):
    """Affine map in the row convention, ``x @ w + b``; non-finite input gives NaN/inf quietly."""
    with np.errstate(invalid="ignore", over="ignore"):
        y = x @ w
        return y if b is None else y + b


@takes_options("mask", "bias", "is_causal", "causal_alignment", "window", "softcap", "alibi_slopes", "sinks",
               *NORMALIZATION)
def multi_head_attention(x, params, *, context=None, return_weights=False, **options):
    r"""Multi-head (and grouped-query) attention with input and output projections.

    Parameters
    ----------
    x : array_like, shape (..., L, d_model)
        Sequence the queries are computed from.
    params : MultiHeadParams
        Projections and head counts.
    context : array_like, shape (..., S, d_context), optional
        Sequence the keys and values are computed from (cross-attention).
        Default `x` (self-attention, then ``S = L``; needs ``d_context ==
        d_model``). Leading axes broadcast against those of `x`.
    mask : array_like of bool, shape broadcastable to (..., H, L, S), optional
        True where query ``i`` may attend to key ``j``. The head axis comes
        before L: a per-sequence mask of shape ``(B, L, S)`` must be given as
        ``(B, 1, L, S)``.
    bias : array_like of float, shape broadcastable to (..., H, L, S), optional
        Additive term on the scaled scores, e.g. `alibi_bias`.
    is_causal : bool, optional
        Apply a causal mask (see `causal_mask`).
    causal_alignment : {"top-left", "bottom-right"}, optional
        Diagonal placement when L != S, and the query positions for
        `window` and `alibi_slopes`.
    window : (int or None, int or None), optional
        Local attention ``(left, right)``, as in
        `scaled_dot_product_attention`.
    softcap : float, optional
        Soft cap ``c > 0`` of every head's scaled scores,
        ``c * tanh(scores / c)``, before `bias`, ALiBi and the masks.
    alibi_slopes : array_like of float, shape (H,) or broadcastable to (..., H), optional
        One ALiBi slope per query head, e.g. ``alibi_slopes(H)``.
    sinks : array_like of float, shape (H,) or broadcastable to (..., H), optional
        One attention-sink logit per query head (learned parameters in
        gpt-oss); each row's softmax denominator gains ``exp(sink)``.
    normalization : {"softmax", "sigmoid"}, optional
        How each head's scores become weights, as in
        `scaled_dot_product_attention`.
    sigmoid_bias : float, optional
        The sigmoid's bias; default ``-log S``. Only with
        ``normalization="sigmoid"``.
    return_weights : bool, optional
        Also return the per-head attention weights.

    Returns
    -------
    out : ndarray, shape (..., L, d_model)
        ``concat(heads) @ w_o + b_o``, in the dtype NumPy promotion gives
        the inputs and parameters (computed in at least float32).
    weights : ndarray, shape (..., H, L, S)
        Only with ``return_weights=True``; not averaged over heads.

    Raises
    ------
    TypeError
        If `params` is not a `MultiHeadParams`, an array is not real numeric,
        `mask` is not boolean, or `is_causal` or `return_weights` is not a
        bool; as `scaled_dot_product_attention` for `window` and `softcap`.
    ValueError
        If the last axis of `x` is not ``d_model`` or of `context` not
        ``d_context`` (or `context` is missing when they differ), or
        leading, mask or bias shapes do not broadcast; as
        `scaled_dot_product_attention` for `window`, `softcap`,
        `alibi_slopes`, `sinks`, `normalization` and `sigmoid_bias`.

    See Also
    --------
    scaled_dot_product_attention : What each head computes.
    split_heads : Turns projected features into heads.
    merge_heads : Concatenates the heads again.
    MultiHeadParams : The weights.

    Notes
    -----
    With :math:`X` the input, :math:`C` the context, :math:`d` the head
    size, :math:`g = H / H_{kv}` and the slices :math:`W^Q_h` of `w_q` (and
    likewise for keys and values) [1]_:

    .. math::

        \operatorname{head}_h = \operatorname{softmax}\!\left(
            \frac{(X W^Q_h + b^Q_h)(C W^K_{\lfloor h/g \rfloor}
            + b^K_{\lfloor h/g \rfloor})^\top}{\sqrt{d}} + B_h\right)
            (C W^V_{\lfloor h/g \rfloor} + b^V_{\lfloor h/g \rfloor}),

    .. math::

        \operatorname{MHA}(X, C) = [\operatorname{head}_0, \ldots,
        \operatorname{head}_{H-1}]\, W^O + b^O .

    :math:`g = 1` is the original multi-head attention, :math:`H_{kv} = 1`
    multi-query attention [2]_, anything between grouped-query attention
    [3]_. A query with no allowed key gets a zero head output, so its row
    of `out` equals ``b_o`` (PyTorch's ``nn.MultiheadAttention`` gives NaN).

    Conventions match ``torch.nn.MultiheadAttention(batch_first=True)``
    with ``w_q = in_proj_weight[:E].T`` (and so on), ``w_o =
    out_proj.weight.T``, and masks of the opposite polarity (PyTorch's
    boolean ``attn_mask`` and ``key_padding_mask`` mark *forbidden* pairs).

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.
    .. [2] Shazeer, N., "Fast Transformer Decoding: One Write-Head is All
       You Need", arXiv:1911.02150, 2019.
    .. [3] Ainslie, J. et al., "GQA: Training Generalized Multi-Query
       Transformer Models from Multi-Head Checkpoints", EMNLP, 2023.

    Examples
    --------
    Two heads of size 1 with identity projections: head 0 attends with
    feature 0, head 1 with feature 1.

    >>> import numpy as np
    >>> from attention_ref import MultiHeadParams, multi_head_attention
    >>> eye = np.eye(2)
    >>> p = MultiHeadParams(w_q=eye, w_k=eye, w_v=eye, w_o=eye, n_heads=2)
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> out, w = multi_head_attention(x, p, return_weights=True)
    >>> w
    array([[[0.73105858, 0.26894142],
            [0.5       , 0.5       ]],
    <BLANKLINE>
           [[0.5       , 0.5       ],
            [0.26894142, 0.73105858]]])
    >>> out
    array([[0.73105858, 0.5       ],
           [0.5       , 0.73105858]])

    A sink of 0 on head 0 only (:math:`-\infty` is not allowed, a very
    negative logit is as good as none):

    >>> out, w = multi_head_attention(x, p, sinks=[0.0, -1e3], return_weights=True)
    >>> w[0]
    array([[0.57611688, 0.21194156],
           [0.33333333, 0.33333333]])
    """
    if not isinstance(params, MultiHeadParams):
        raise TypeError(f"params must be a MultiHeadParams; got {type(params).__name__}")
    return_weights = check_bool(return_weights, "return_weights")
    x = as_real_array(x, "x")
    check_ndim(x, "x", 2, "(..., L, d_model)")
    check_last_dim(x, "x", params.d_model, "params.w_q (d_model)")
    if context is None:
        if params.d_context != params.d_model:
            raise ValueError(
                f"params project keys/values from d_context={params.d_context} features but x has "
                f"d_model={params.d_model}; pass context of shape (..., S, {params.d_context})"
            )
        ctx = x
    else:
        ctx = as_real_array(context, "context")
        check_ndim(ctx, "context", 2, "(..., S, d_context)")
        check_last_dim(ctx, "context", params.d_context, "params.w_k (d_context)")

    present = _present_arrays(params)
    out_dtype, work = result_dtype(x, ctx, *present.values())
    x, ctx = x.astype(work, copy=False), ctx.astype(work, copy=False)
    w = dict.fromkeys(_ARRAY_FIELDS) | {name: a.astype(work, copy=False) for name, a in present.items()}

    q = split_heads(_project(x, w["w_q"], w["b_q"]), params.n_heads)  # (..., H, L, D)
    k = split_heads(_project(ctx, w["w_k"], w["b_k"]), params.n_kv_heads)  # (..., Hkv, S, D)
    v = split_heads(_project(ctx, w["w_v"], w["b_v"]), params.n_kv_heads)  # (..., Hkv, S, D)
    # Weights are formed only when asked for: the output alone runs the cache-blocked kernel.
    enable_gqa = params.n_kv_heads != params.n_heads
    result = scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa, return_weights=return_weights, **options)
    heads, weights = result if return_weights else (result, None)
    out = _project(merge_heads(heads), w["w_o"], w["b_o"])  # (..., L, d_model)
    with np.errstate(over="ignore"):  # a float16 result beyond 65504 is inf, without a warning
        out = out.astype(out_dtype, copy=False)
    if return_weights:
        return out, weights.astype(out_dtype, copy=False)
    return out
