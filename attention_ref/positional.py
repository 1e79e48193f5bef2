"""Position information: sinusoidal encodings, rotary embeddings (RoPE) and ALiBi biases."""

from __future__ import annotations

import numpy as np

from ._validation import (
    as_real_array,
    broadcast_shapes,
    check_bool,
    check_finite,
    check_int,
    check_ndim,
    check_real,
    result_dtype,
)
from .masks import query_positions

__all__ = ["alibi_bias", "alibi_slopes", "apply_rope", "sinusoidal_positions"]


def _check_base(base):
    """Return `base` as a float > 0 (the wavelength base of the sinusoids)."""
    base = check_real(base, "base")
    if base <= 0:
        raise ValueError(f"base must be > 0; got {base}")
    return base


def sinusoidal_positions(n, d, *, base=10000):
    r"""Fixed sinusoidal position encodings of the original Transformer.

    Parameters
    ----------
    n : int
        Number of positions (>= 0); rows are positions ``0..n-1``.
    d : int
        Encoding size (>= 1), usually ``d_model``. May be odd.
    base : float, optional
        Wavelength base (> 0). Default 10000, as in [1]_.

    Returns
    -------
    ndarray of float64, shape (n, d)
        Sines in even columns, cosines in odd columns.

    Raises
    ------
    TypeError
        If `n` or `d` is not an int, or `base` is not a real number.
    ValueError
        If `n` < 0, `d` < 1 or `base` <= 0.

    See Also
    --------
    apply_rope : Rotary embeddings built from the same frequencies.

    Notes
    -----
    For position :math:`p` and :math:`0 \le 2i < d` [1]_:

    .. math::

        PE_{p, 2i} = \sin\!\left(\frac{p}{b^{2i/d}}\right), \qquad
        PE_{p, 2i+1} = \cos\!\left(\frac{p}{b^{2i/d}}\right).

    The formula is applied literally to every column index below `d`, with
    `d` itself in the exponent; for odd `d` the last column is therefore a
    sine whose cosine partner is cut off. (Some libraries instead round
    `d` up and drop a column; the frequencies then differ slightly.)
    Wavelengths grow geometrically from :math:`2\pi` to almost
    :math:`2\pi b`, and :math:`PE_{p+k}` is a fixed linear function
    (a rotation in each sine/cosine pair) of :math:`PE_p`.

    References
    ----------
    .. [1] Vaswani, A. et al., "Attention Is All You Need", NeurIPS, 2017.

    Examples
    --------
    >>> from attention_ref import sinusoidal_positions
    >>> sinusoidal_positions(3, 4)
    array([[ 0.        ,  1.        ,  0.        ,  1.        ],
           [ 0.84147098,  0.54030231,  0.00999983,  0.99995   ],
           [ 0.90929743, -0.41614684,  0.01999867,  0.99980001]])
    """
    n = check_int(n, "n", minimum=0)
    d = check_int(d, "d", minimum=1)
    base = _check_base(base)
    cols = np.arange(d)
    inv_freq = base ** (-(cols - cols % 2) / d)  # b^(-2i/d) for columns 2i and 2i+1
    angles = np.arange(n)[:, None] * inv_freq  # (n, d)
    return np.where(cols % 2 == 0, np.sin(angles), np.cos(angles))


def apply_rope(x, positions=None, *, base=10000, interleaved=False):
    r"""Rotary position embedding (RoPE): rotate feature pairs by position-dependent angles.

    Parameters
    ----------
    x : array_like, shape (..., T, D)
        Queries or keys (heads, if any, on axis -3). ``D`` must be even.
    positions : array_like of real, shape broadcastable to (..., T), optional
        Position of each of the T rows; default ``0, 1, ..., T-1``. Need not
        be integers (e.g. interpolated positions). Must not add axes beyond
        those of ``x.shape[:-1]``.
    base : float, optional
        Frequency base (> 0); default 10000 [1]_.
    interleaved : bool, optional
        Which features form a pair. False (default): feature ``i`` with
        ``i + D/2`` (GPT-NeoX, Hugging Face ``rotate_half``). True: feature
        ``2i`` with ``2i + 1`` (RoFormer [1]_, the original LLaMA complex
        form).

    Returns
    -------
    ndarray, same shape and dtype as `x`
        Rotated features (integers become float64). Angles are computed in
        float64 and the rotation in at least float32.

    Raises
    ------
    TypeError
        If `x` or `positions` is not real numeric, `base` is not real or
        `interleaved` is not a bool.
    ValueError
        If `x` has fewer than 2 axes, ``D`` is odd, `positions` holds NaN or
        an infinity or does not broadcast to ``x.shape[:-1]``, or `base`
        is not finite and > 0.

    See Also
    --------
    sinusoidal_positions : The same frequencies, added instead of rotating.
    scaled_dot_product_attention : Takes the rotated queries and keys.
    multi_head_attention : Projections and heads; rotate after `split_heads`.

    Notes
    -----
    Pair :math:`i` (:math:`0 \le i < D/2`) at position :math:`p` is rotated by
    :math:`p\,\theta_i` with :math:`\theta_i = b^{-2i/D}`:

    .. math::

        \begin{pmatrix} y_a \\ y_b \end{pmatrix} =
        \begin{pmatrix} \cos p\theta_i & -\sin p\theta_i \\
                        \sin p\theta_i & \cos p\theta_i \end{pmatrix}
        \begin{pmatrix} x_a \\ x_b \end{pmatrix},

    with :math:`(a, b) = (2i, 2i+1)` when interleaved and :math:`(i, i +
    D/2)` otherwise. The two layouts are the same map up to a fixed
    permutation of the features: with ``perm = [0, 2, 4, ..., 1, 3, 5,
    ...]``, ``apply_rope(x[..., perm]) == apply_rope(x, interleaved=True)[...,
    perm]``. A model trained with one layout needs its projection columns
    permuted to run with the other.

    Rotations preserve norms, and since :math:`R_m^\top R_n = R_{n-m}`,

    .. math::

        \langle R_m q, R_n k \rangle = \langle q, R_{n-m} k \rangle,

    so the attention score depends on positions only through :math:`n - m`
    [1]_. Apply it to queries and keys (after splitting heads), not to
    values.

    References
    ----------
    .. [1] Su, J., Y. Lu, S. Pan, A. Murtadha, B. Wen, Y. Liu, "RoFormer:
       Enhanced Transformer with Rotary Position Embedding",
       arXiv:2104.09864, 2021.

    Examples
    --------
    With ``D = 2`` there is one pair, rotated by ``p`` radians at position ``p``:

    >>> import numpy as np
    >>> from attention_ref import apply_rope
    >>> apply_rope(np.array([[1.0, 0.0], [1.0, 0.0]]), positions=[0.0, np.pi / 2])
    array([[1.000000e+00, 0.000000e+00],
           [6.123234e-17, 1.000000e+00]])

    With ``D = 4`` and ``base=1`` both pairs turn by the same angle, which
    shows which features each layout pairs:

    >>> x = np.array([[1.0, 2.0, 3.0, 4.0]])
    >>> apply_rope(x, positions=[np.pi / 2], base=1.0)  # pairs (0, 2) and (1, 3)
    array([[-3., -4.,  1.,  2.]])
    >>> apply_rope(x, positions=[np.pi / 2], base=1.0, interleaved=True)  # pairs (0, 1) and (2, 3)
    array([[-2.,  1., -4.,  3.]])
    """
    x = as_real_array(x, "x")
    check_ndim(x, "x", 2, "(..., T, D)")
    interleaved = check_bool(interleaved, "interleaved")
    base = _check_base(base)
    t, d = x.shape[-2:]
    if d % 2:
        raise ValueError(f"the last axis of x (D) must be even to form rotation pairs; got shape {x.shape}")
    if positions is None:
        pos = np.arange(t, dtype=np.float64)
    else:
        pos = as_real_array(positions, "positions").astype(np.float64)
        check_finite(pos, "positions")
        shape = broadcast_shapes("positions and x.shape[:-1]", [("positions", pos.shape), ("x[..., 0]", x.shape[:-1])])
        if shape != x.shape[:-1]:
            raise ValueError(
                f"positions must broadcast to x.shape[:-1] = {x.shape[:-1]} without adding axes; "
                f"got positions of shape {pos.shape}"
            )
    out_dtype, work = result_dtype(x)
    theta = base ** (-np.arange(0, d, 2) / d)  # (D/2,)
    angles = pos[..., None] * theta  # (..., T, D/2)
    cos, sin = np.cos(angles).astype(work), np.sin(angles).astype(work)
    xw = x.astype(work, copy=False)
    if interleaved:
        a, b = xw[..., 0::2], xw[..., 1::2]
    else:
        a, b = xw[..., : d // 2], xw[..., d // 2 :]
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite x: NaN/inf quietly, as any arithmetic
        ya, yb = a * cos - b * sin, b * cos + a * sin
        if interleaved:
            out = np.stack([ya, yb], axis=-1).reshape(*ya.shape[:-1], d)  # (a0, b0, a1, b1, ...)
        else:
            out = np.concatenate([ya, yb], axis=-1)
        return np.broadcast_to(out, x.shape).astype(out_dtype)


def alibi_slopes(n_heads):
    r"""Per-head slopes of ALiBi (attention with linear biases).

    Parameters
    ----------
    n_heads : int
        Number of heads, H >= 1.

    Returns
    -------
    ndarray of float64, shape (H,)
        Slope ``m_h`` of head ``h``, all in (0, 1).

    Raises
    ------
    TypeError
        If `n_heads` is not an int.
    ValueError
        If `n_heads` < 1.

    See Also
    --------
    alibi_bias : The bias these slopes scale.

    Notes
    -----
    For :math:`H` a power of two the slopes form the geometric sequence [1]_

    .. math::

        m_h = 2^{-8(h+1)/H}, \qquad h = 0, \ldots, H-1,

    starting and stepping by :math:`2^{-8/H}`: for 8 heads
    :math:`1/2, 1/4, \ldots, 1/256`. Otherwise, with :math:`2^k` the largest
    power of two below :math:`H`, the first :math:`2^k` slopes are those of
    :math:`2^k` heads and the remaining :math:`H - 2^k` are the
    even-indexed slopes (every other one, from the first) of
    :math:`2^{k+1}` heads, as in the paper's reference code.

    References
    ----------
    .. [1] Press, O., N. A. Smith, M. Lewis, "Train Short, Test Long:
       Attention with Linear Biases Enables Input Length Extrapolation",
       ICLR, 2022.

    Examples
    --------
    >>> from attention_ref import alibi_slopes
    >>> alibi_slopes(8)
    array([0.5       , 0.25      , 0.125     , 0.0625    , 0.03125   ,
           0.015625  , 0.0078125 , 0.00390625])
    >>> alibi_slopes(2)
    array([0.0625    , 0.00390625])
    """
    n_heads = check_int(n_heads, "n_heads", minimum=1)
    return _slopes(n_heads)


def _slopes(n):
    """Slopes for ``n`` heads (the recursion of the ALiBi reference code)."""
    if n & (n - 1) == 0:  # power of two
        return 2.0 ** (-8.0 * np.arange(1, n + 1) / n)
    low = 1 << (n.bit_length() - 1)  # largest power of two below n
    return np.concatenate([_slopes(low), _slopes(2 * low)[0::2][: n - low]])


def alibi_bias(n_heads, n_queries, n_keys=None, *, alignment="top-left"):
    r"""ALiBi bias: each head penalises attention linearly in the query-key distance.

    Parameters
    ----------
    n_heads : int
        Number of heads, H >= 1.
    n_queries : int
        Number of queries, L.
    n_keys : int, optional
        Number of keys, S. Defaults to `n_queries`.
    alignment : {"top-left", "bottom-right"}, optional
        Key position of query ``i``: ``i`` (top-left) or ``i + S - L``
        (bottom-right, for decoding with a key/value cache), as in
        `causal_mask`.

    Returns
    -------
    ndarray of float64, shape (H, L, S)
        ``-m_h * |p_i - j|``; pass as ``bias`` (it broadcasts over a batch
        axis in front).

    Raises
    ------
    TypeError
        If a size is not an int.
    ValueError
        If `n_heads` < 1, a size is negative or `alignment` is unknown.

    See Also
    --------
    alibi_slopes : The slopes ``m_h``.
    causal_mask : Combine via ``is_causal=True`` with the same alignment.
    multi_head_attention : Takes the bias as ``bias``.

    Notes
    -----
    With :math:`p_i = i` (top-left) or :math:`p_i = i + S - L`
    (bottom-right):

    .. math::

        B_{h,i,j} = -m_h \, \lvert p_i - j \rvert .

    On the keys a causal mask allows (:math:`j \le p_i`) this is
    :math:`m_h (j - p_i)`, the paper's bias :math:`m \cdot [-(i-1), \ldots,
    -2, -1, 0]` [1]_; use it with ``is_causal=True`` and the same
    alignment for the original (decoder) ALiBi. Without a causal mask the
    absolute value gives the symmetric variant often used for encoders.
    Implementations that add :math:`m_h\, j` instead differ by a constant
    per row, which the softmax ignores.

    References
    ----------
    .. [1] Press, O., N. A. Smith, M. Lewis, "Train Short, Test Long:
       Attention with Linear Biases Enables Input Length Extrapolation",
       ICLR, 2022.

    Examples
    --------
    >>> from attention_ref import alibi_bias
    >>> alibi_bias(2, 3)
    array([[[ 0.        , -0.0625    , -0.125     ],
            [-0.0625    ,  0.        , -0.0625    ],
            [-0.125     , -0.0625    ,  0.        ]],
    <BLANKLINE>
           [[ 0.        , -0.00390625, -0.0078125 ],
            [-0.00390625,  0.        , -0.00390625],
            [-0.0078125 , -0.00390625,  0.        ]]])
    """
    n_heads = check_int(n_heads, "n_heads", minimum=1)
    rows, cols = query_positions(n_queries, n_keys, alignment)  # (L, 1), (1, S)
    distance = -np.abs(rows - cols)  # (L, S), integer, so 0 stays +0.0 below
    return _slopes(n_heads)[:, None, None] * distance
