r"""Checking an attention kernel against attention_ref: `assert_attention_close`.

A kernel in float16 or bfloat16 cannot match a float64 reference to a fixed
tolerance that suits every problem: its rounding error grows with the scores,
the sequence length and the values. `assert_attention_close` therefore
measures the kernel against what rounding alone costs, as FlashAttention's
tests do: it computes the float64 reference and the textbook formula
evaluated in the kernel's own dtype (the *baseline*), and asks the kernel to
be at most ``factor`` times as far from the reference as that baseline.

Examples
--------
>>> import numpy as np
>>> from attention_ref import blockwise_attention
>>> from attention_ref.testing import assert_attention_close
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((3, 2, 16, 8)).astype(np.float16)
>>> assert_attention_close(blockwise_attention(q, k, v, block_size=4), q, k, v)
"""

from __future__ import annotations

import numpy as np

from ._validation import as_real_array, check_real, is_bfloat16
from .attention import prepare_attention, scaled_dot_product_attention

__all__ = ["assert_attention_close"]

#: Machine epsilon (spacing of the numbers just above 1) of each dtype `actual` may have.
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
#: Default `atol` in units of ``eps * max|reference|``: one unit where the baseline's rounding dominates
#: (16-bit), sixteen where the kernel and the baseline are equally precise (float32) or the reference is
#: no more precise than the kernel (float64).
_ATOL_UNITS = {"float16": 1.0, "bfloat16": 1.0, "float32": 16.0, "float64": 16.0}
#: Options of scaled_dot_product_attention that make no sense for comparing one deterministic output.
_NOT_OPTIONS = ("return_weights", "dropout_p", "rng")


def _output_array(actual) -> np.ndarray:
    """`actual` as a float16/32/64 or bfloat16 ndarray; integers, booleans and the rest are a TypeError."""
    if isinstance(actual, np.ndarray):
        original = actual.dtype
    else:
        try:
            original = np.asarray(actual).dtype
        except (TypeError, ValueError):
            original = np.dtype(object)  # as_real_array below names the problem
    arr = as_real_array(actual, "actual")
    if original.kind in "iu":
        raise TypeError(
            f"actual must be a kernel's floating-point output (float16, float32, float64 or bfloat16); "
            f"got dtype {original}"
        )
    return arr


def _naive_attention(q, k, v, dtype: np.dtype, options: dict) -> np.ndarray:
    """The textbook formula with every step rounded to `dtype` (the baseline; see assert_attention_close)."""
    rounds = dtype.itemsize < 4  # float16, bfloat16: products accumulate in float32, each step is rounded
    work = np.dtype(np.float32) if rounds else dtype

    def rnd(x):
        return x.astype(dtype).astype(work) if rounds else x.astype(work, copy=False)

    q, k, v = (as_real_array(a, name).astype(dtype) for a, name in ((q, "q"), (k, "k"), (v, "v")))
    p = prepare_attention(q, k, v, **options)  # the package's own masks, window, bias and ALiBi
    sinks = p.sinks
    with np.errstate(invalid="ignore", over="ignore"):  # overflow to inf and NaN are the baseline's own
        s = rnd(p.q.astype(work) @ np.swapaxes(p.k.astype(work), -1, -2))  # (..., L, S)
        s = rnd(s * work.type(p.scale))
        if p.softcap is not None:
            s = rnd(p.cap(s))
        extra = p.additive()
        if extra is not None:
            s = rnd(s + rnd(extra.astype(work)))
        top = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., L, 1)
        if sinks is not None:
            sinks = rnd(np.asarray(sinks).astype(work))[..., None, None]
            top = np.maximum(top, sinks)
        top = np.where(np.isfinite(top), top, 0.0).astype(work)
        e = rnd(np.exp(rnd(s - top)))
        total = e.sum(axis=-1, keepdims=True)
        if sinks is not None:
            total = total + rnd(np.exp(rnd(sinks - top)))
        total = rnd(total)
        weights = rnd(e / np.where(total > 0, total, 1.0))  # rows with no allowed key: zeros
        out = rnd(weights @ p.v.astype(work))  # (..., L, Ev)
    return np.broadcast_to(out, p.out_shape).astype(dtype)


def _errors(actual: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``|actual - reference|`` in float64: inf where actual is NaN or misses a finite reference,
    0 where both hold the same non-finite value (non-finite input)."""
    a = actual.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - reference)
    same = (a == reference) | (np.isnan(a) & np.isnan(reference))
    return np.where(same, 0.0, np.where(np.isnan(err), np.inf, err))


def assert_attention_close(actual, q, k, v, *, factor=2.0, atol=None, **options):
    r"""Assert that a kernel's attention output is as accurate as its dtype allows.

    Passes when every element of `actual` is within ``factor`` times the
    largest error of a naive implementation in the same dtype (plus `atol`)
    of the float64 reference; raises AssertionError otherwise.

    Parameters
    ----------
    actual : array_like, shape (..., L, Ev)
        The kernel's output for `q`, `k`, `v` and `options`: float16,
        float32, float64 or bfloat16 (ml_dtypes).
    q : array_like, shape (..., L, E)
        Queries, as given to the kernel.
    k : array_like, shape (..., S, E)
        Keys.
    v : array_like, shape (..., S, Ev)
        Values.
    factor : float, optional
        How many times the baseline's largest error the kernel may reach.
        Default 2.0, as in FlashAttention's tests.
    atol : float, optional
        Absolute slack added to the bound. Default: ``eps * max|reference|``
        for float16 and bfloat16, ``16 * eps * max|reference|`` for float32
        and float64, with ``eps`` the machine epsilon of the dtype of
        `actual` (see Notes).
    **options
        Keyword arguments of `attention_ref.scaled_dot_product_attention`
        describing the attention the kernel computed: ``mask``, ``bias``,
        ``is_causal``, ``causal_alignment``, ``scale``, ``enable_gqa`` and
        those it has besides (``softcap``, ``window``, ``alibi_slopes``,
        ``sinks``). ``return_weights``, ``dropout_p`` and ``rng`` are not
        accepted.

    Returns
    -------
    None
        Returns quietly when `actual` is close enough.

    Raises
    ------
    AssertionError
        If some element is too far from the reference. The message gives
        how many elements fail, the largest error among them with its index,
        the actual and reference values there, the baseline's error there
        and its largest error, and the ratio of the two largest errors.
    TypeError
        If `actual` is not a float16, float32, float64 or bfloat16 array,
        if `return_weights`, `dropout_p` or `rng` is given, or as
        `attention_ref.scaled_dot_product_attention` raises for the options.
    ValueError
        If `actual` does not have the shape of the attention output of `q`,
        `k`, `v`, if `factor` or `atol` is negative or not finite, or as
        `attention_ref.scaled_dot_product_attention` raises.

    See Also
    --------
    attention_ref.scaled_dot_product_attention : The reference, run on float64 copies.
    attention_ref.blockwise_attention : A correct low-precision kernel: float32 accumulation.
    numpy.testing.assert_allclose : A fixed-tolerance comparison.

    Notes
    -----
    Let :math:`R` be `attention_ref.scaled_dot_product_attention` of float64
    copies of `q`, `k`, `v` with `options`, :math:`A` the kernel's output
    and :math:`N` the baseline. The check passes when, elementwise,

    .. math::

        |A - R| \le \mathrm{factor} \cdot \max |N - R| + \mathrm{atol},

    the maximum running over the elements where :math:`R` and :math:`N`
    are finite. Where :math:`R` is not finite (non-finite input),
    :math:`A` must hold the same value (NaN where :math:`R` is NaN).

    The baseline :math:`N` is the textbook formula with every step rounded
    to the dtype :math:`D` of `actual`, :math:`\mathrm{rd}` below. For
    float16 and bfloat16 each step is computed in float32 and then rounded,
    and the two matrix products accumulate in float32, as a kernel's
    tensor-core products do; in float32 and float64 everything is computed
    in that dtype:

    1. :math:`q, k, v` rounded to :math:`D` (grouped-query heads repeated);
    2. :math:`s = \mathrm{rd}(\mathrm{rd}(q k^\top) \cdot \sigma)`, with
       the soft cap :math:`\mathrm{rd}(c \tanh(s / c))` if ``softcap`` is
       given;
    3. :math:`s = \mathrm{rd}(s + \mathrm{rd}(B))` with :math:`B` the
       package's own additive term for `options` (bias, ALiBi, and 0 /
       :math:`-\infty` for masks, causality and windows);
    4. :math:`m = \max_j s_j` (and the sink), :math:`e = \mathrm{rd}(\exp
       \mathrm{rd}(s - m))`, :math:`Z = \mathrm{rd}(\sum_j e_j)` (plus
       :math:`\mathrm{rd}(e^{\mathrm{sink} - m})`), :math:`w =
       \mathrm{rd}(e / Z)`; rows with no allowed key are zeros;
    5. :math:`N = \mathrm{rd}(w v)`.

    The bound uses the baseline's *largest* error, not its error element
    by element: at a single element the baseline can land on the rounded
    reference by luck, and a correct kernel would then fail there.

    Default `atol`, with :math:`\epsilon` the machine epsilon of :math:`D`:

    ========  ======================  ================================
    dtype     :math:`\epsilon`        default `atol`
    ========  ======================  ================================
    float16   :math:`2^{-10}`         :math:`\epsilon \max|R|`
    bfloat16  :math:`2^{-7}`          :math:`\epsilon \max|R|`
    float32   :math:`2^{-23}`         :math:`16\,\epsilon \max|R|`
    float64   :math:`2^{-52}`         :math:`16\,\epsilon \max|R|`
    ========  ======================  ================================

    In 16-bit dtypes the baseline's error dominates and `atol` only covers
    the rounding of the output itself. In float32 the baseline is as
    precise as a good kernel, which may then reach a little over twice its
    error (a long sequential sum over key blocks); in float64 the reference
    is no more precise than the kernel, so `atol` does most of the work
    there. Either way a wrong scale by 0.1 %, a misplaced mask or a
    16-bit accumulator in a float32 kernel is thousands of times larger.

    References
    ----------
    .. [1] Dao, T., D. Y. Fu, S. Ermon, A. Rudra and C. Ré, "FlashAttention:
       Fast and Memory-Efficient Exact Attention with IO-Awareness",
       NeurIPS, 2022.

    Examples
    --------
    A float16 kernel that accumulates in float32 passes:

    >>> import numpy as np
    >>> from attention_ref import blockwise_attention
    >>> from attention_ref.testing import assert_attention_close
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 16, 8)).astype(np.float16)
    >>> assert_attention_close(blockwise_attention(q, k, v, is_causal=True, block_size=4), q, k, v, is_causal=True)

    A kernel whose causal mask is off by one (each query also sees the
    next key) does not:

    >>> from attention_ref import scaled_dot_product_attention
    >>> wrong = scaled_dot_product_attention(q, k, v, mask=np.tri(16, k=1, dtype=bool))
    >>> assert_attention_close(wrong, q, k, v, is_causal=True)
    Traceback (most recent call last):
    ...
    AssertionError: 225 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000996 + 0.00224 = 0.00423
    largest error 3.21 at index (0, 0, 6): actual 1.49512, reference -1.71387, baseline's error there 0
    ratio to the baseline's largest error: 3.22e+03
    """
    for name in _NOT_OPTIONS:
        if name in options:
            raise TypeError(
                f"assert_attention_close compares one deterministic output; {name} is not an option here"
            )
    actual = _output_array(actual)
    factor = check_real(factor, "factor", minimum=0.0)
    if atol is not None:
        atol = check_real(atol, "atol", minimum=0.0)
    dtype = np.dtype(actual.dtype)
    reference = scaled_dot_product_attention(
        *(as_real_array(a, name).astype(np.float64) for a, name in ((q, "q"), (k, "k"), (v, "v"))), **options
    )
    if actual.shape != reference.shape:
        raise ValueError(
            f"actual must have the shape of the attention output of q, k and v, {reference.shape}; "
            f"got {actual.shape}"
        )
    baseline = _naive_attention(q, k, v, dtype, options)

    finite = np.isfinite(reference)
    scale = float(np.max(np.abs(reference[finite]), initial=0.0))
    eps = _EPS["bfloat16" if is_bfloat16(dtype) else dtype.name]
    if atol is None:
        atol = _ATOL_UNITS["bfloat16" if is_bfloat16(dtype) else dtype.name] * eps * scale
    err = _errors(actual, reference)
    base_err = _errors(baseline, reference)
    counted = finite & np.isfinite(base_err)
    base_max = float(np.max(base_err[counted], initial=0.0))
    bound = factor * base_max + atol
    bad = err > bound
    if not bad.any():
        return
    worst = np.unravel_index(np.argmax(np.where(bad, err, -1.0)), err.shape)
    index = tuple(int(i) for i in worst)
    ratio = err[worst] / base_max if base_max > 0 else np.inf
    name = "bfloat16" if is_bfloat16(dtype) else dtype.name
    raise AssertionError(
        f"{int(bad.sum())} of {bad.size} elements are too far from the float64 reference\n"
        f"allowed: factor * (naive {name} baseline's largest error) + atol = "
        f"{factor:g} * {base_max:.3g} + {atol:.3g} = {bound:.3g}\n"
        f"largest error {err[worst]:.3g} at index {index}: actual {float(actual[worst]):.6g}, "
        f"reference {reference[worst]:.6g}, baseline's error there {base_err[worst]:.3g}\n"
        f"ratio to the baseline's largest error: {ratio:.3g}"
    )
