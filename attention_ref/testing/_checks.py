"""The checkers' rule: a kernel's result against the float64 reference and a naive baseline in its dtype."""

from __future__ import annotations

import numpy as np

from .._options import DROPOUT
from .._validation import as_real_array, check_real, is_bfloat16, is_fp8
from ..attention import prepare_attention, scaled_dot_product_attention
from ..backward import AttentionGrads, attention_backward, finish_grads
from ..fp8 import dequantize_inputs

__all__ = ["assert_attention_close", "assert_attention_grads_close", "assert_lse_close"]

#: Machine epsilon (spacing of the numbers just above 1) of each dtype `actual` may have.
_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
#: Default `atol` in units of ``eps * max|reference|``: one unit where the baseline's rounding dominates
#: (16-bit), sixteen where the kernel and the baseline are equally precise (float32) or the reference is
#: no more precise than the kernel (float64).
_ATOL_UNITS = {"float16": 1.0, "bfloat16": 1.0, "float32": 16.0, "float64": 16.0}
#: Options of scaled_dot_product_attention that make no sense for comparing one deterministic output
#: (``dropout_p`` is one unless a ``dropout_mask`` makes the dropout deterministic).
_NOT_OPTIONS = ("return_weights", "dropout_p", "rng")


def _check_deterministic(options: dict, function: str) -> None:
    """Raise TypeError if `options` make the call random or ask for more than the output."""
    for name in _NOT_OPTIONS:
        if name in options and not (name == "dropout_p" and options.get("dropout_mask") is not None):
            raise TypeError(
                f"{function} checks one deterministic call; {name} is not an option here"
                + (" without dropout_mask, the kernel's own keep-mask" if name == "dropout_p" else "")
            )
#: The bases a kernel's log-sum-exp may have, each with the factor turning a natural log into it.
_LOG_BASES = {"e": 1.0, 2: 1.0 / np.log(2.0)}


def _output_array(actual, name: str = "actual") -> np.ndarray:
    """`actual` as a float16/32/64 or bfloat16 ndarray; integers, booleans and the rest are a TypeError."""
    if isinstance(actual, np.ndarray):
        original = actual.dtype
    else:
        try:
            original = np.asarray(actual).dtype
        except (TypeError, ValueError):
            original = np.dtype(object)  # as_real_array below names the problem
    arr = as_real_array(actual, name)
    if original.kind in "iu":
        raise TypeError(
            f"{name} must be a kernel's floating-point output (float16, float32, float64 or bfloat16); "
            f"got dtype {original}"
        )
    return arr


def _rounding(dtype: np.dtype):
    """``(rnd, work)``: rounding of every step to `dtype`, computed in `work` (float32 for 16-bit dtypes)."""
    rounds = dtype.itemsize < 4  # float16, bfloat16: products accumulate in float32, each step is rounded
    work = np.dtype(np.float32) if rounds else dtype

    def rnd(x):
        return x.astype(dtype).astype(work) if rounds else x.astype(work, copy=False)

    return rnd, work


def _dequantized(q, k, v, options: dict):
    """``(q, k, v, options, fp8)``: float64 copies of what the kernel's inputs stand for, and the rest.

    fp8 arrays are dequantized by their descales (exactly, in float64) and the descales leave the options;
    ``fp8`` is the fp8 dtype of the input (None when no array is fp8).
    """
    options = dict(options)
    fp8 = next((a.dtype for a in (q, k, v) if is_fp8(getattr(a, "dtype", None))), None)
    arrays = [np.asarray(a).astype(np.float64) if is_fp8(getattr(a, "dtype", None))
              else as_real_array(a, name).astype(np.float64) for a, name in ((q, "q"), (k, "k"), (v, "v"))]
    q64, k64, v64, _ = dequantize_inputs(arrays[0], arrays[1], arrays[2], options)
    return q64, k64, v64, options, fp8


def _naive_forward(q, k, v, dtype: np.dtype, options: dict, intermediate=None):
    """The textbook forward with every step rounded to `dtype`: ``(p, weights, capped, sink_weight, out, lse, kept)``.

    ``capped`` is ``tanh(s / c)`` of the soft cap (None without one), ``sink_weight`` each row's weight on
    its sink (None without sinks); ``out`` is not broadcast to the output's batch shape. ``lse`` (..., L) is
    ``rd(m + rd(log Z))``, ``-inf`` for a row whose denominator is zero. With a dropout mask, ``kept`` is
    ``keep / (1 - dropout_p)`` (..., L, S), which multiplies the weights before the product with the values
    (``weights`` are those before dropout); None without one. An `intermediate` dtype (fp8) rounds the weights
    once more before that product, FlashAttention 3's ``intermediate_dtype``.
    """
    rnd, work = _rounding(dtype)
    q, k, v = (as_real_array(a, name).astype(dtype) for a, name in ((q, "q"), (k, "k"), (v, "v")))
    p = prepare_attention(q, k, v, **options)  # the package's own masks, window, bias and ALiBi
    sinks = p.sinks
    capped = sink_weight = None
    with np.errstate(invalid="ignore", over="ignore"):  # overflow to inf and NaN are the baseline's own
        s = rnd(p.q.astype(work) @ np.swapaxes(p.k.astype(work), -1, -2))  # (..., L, S)
        s = rnd(s * work.type(p.scale))
        if p.softcap is not None:
            tanh = np.tanh(s / work.type(p.softcap))
            s, capped = rnd(tanh * work.type(p.softcap)), rnd(tanh)
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
            sink_e = rnd(np.exp(rnd(sinks - top)))
            total = total + sink_e
        total = rnd(total)
        safe_total = np.where(total > 0, total, 1.0)
        weights = rnd(e / safe_total)  # rows with no allowed key: zeros
        if sinks is not None:
            sink_weight = rnd(sink_e / safe_total)[..., 0]  # (..., L)
        if intermediate is not None:
            weights = weights.astype(intermediate).astype(work)
        kept = None
        if p.has_dropout:  # only with a given mask: the checkers take no generator
            kept = p.keep(weights.shape) * work.type(1.0 / (1.0 - p.dropout_p))  # (..., L, S)
        out = rnd((weights if kept is None else rnd(weights * kept)) @ p.v.astype(work))  # (..., L, Ev)
        lse = rnd(top + rnd(np.log(safe_total)))[..., 0]  # (..., L)
        lse[(total == 0)[..., 0]] = -np.inf
    return p, weights, capped, sink_weight, out, lse, kept


def _naive_attention(q, k, v, dtype: np.dtype, options: dict, intermediate=None) -> np.ndarray:
    """The textbook formula with every step rounded to `dtype` (the baseline; see assert_attention_close)."""
    p, _, _, _, out, _, _ = _naive_forward(q, k, v, dtype, options, intermediate)
    return np.broadcast_to(out, p.out_shape).astype(dtype)


def _naive_backward(q, k, v, dout, dtype: np.dtype, options: dict) -> AttentionGrads:
    """The textbook backward with every step rounded to `dtype` (the baseline of assert_attention_grads_close)."""
    rnd, work = _rounding(dtype)
    p, w, capped, sink_weight, out, _, kept = _naive_forward(q, k, v, dtype, options)
    do = rnd(as_real_array(dout, "dout").astype(work))
    with np.errstate(invalid="ignore", over="ignore"):
        dropped = w if kept is None else rnd(w * kept)
        dv = rnd(np.swapaxes(dropped, -1, -2) @ do)  # (..., S, Ev)
        dp = rnd(do @ np.swapaxes(p.v.astype(work), -1, -2))  # (..., L, S)
        if kept is not None:
            dp = rnd(dp * kept)  # the gradient reaching the weights before dropout
        delta = rnd(np.sum(rnd(do * out), axis=-1))  # (..., L)
        dx = rnd(w * rnd(dp - delta[..., None]))  # the bias's gradient
        ds = dx if capped is None else rnd(dx * rnd(1 - rnd(capped * capped)))
        dq = rnd(rnd(ds @ p.k.astype(work)) * work.type(p.scale))
        dk = rnd(rnd(np.swapaxes(ds, -1, -2) @ p.q.astype(work)) * work.type(p.scale))
        dsinks = None if sink_weight is None else rnd(-np.sum(rnd(sink_weight * delta), axis=-1))
    return finish_grads(p, q, k, v, options, dq, dk, dv, dx, dsinks, dtype=dtype)


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
        ``sinks``), and ``dropout_p`` with ``dropout_mask``, the kernel's
        own keep-mask, which the reference and the baseline then apply.
        ``return_weights`` and ``rng`` are not accepted, nor ``dropout_p``
        without ``dropout_mask``.

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
        if `return_weights` or `rng` is given, or `dropout_p` without
        `dropout_mask`, or as `attention_ref.scaled_dot_product_attention`
        raises for the options.
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

    fp8 input (with ``q_descale``, ``k_descale``, ``v_descale``) is checked
    as FlashAttention 3's tests check it (``hopper/test_flash_attn.py``,
    whose ``attention_ref`` in ``hopper/test_util.py`` is called with
    ``upcast=False`` and ``intermediate_dtype`` the fp8 dtype): :math:`R`
    is the attention of the dequantized arrays, and :math:`N` runs the
    steps above in the dtype of `actual` (bfloat16 for an fp8 kernel) on
    the dequantized arrays, with the weights :math:`w` rounded to the fp8
    format once more before step 5.

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
    _check_deterministic(options, "assert_attention_close")
    actual = _output_array(actual)
    factor = check_real(factor, "factor", minimum=0.0)
    if atol is not None:
        atol = check_real(atol, "atol", minimum=0.0)
    dtype = np.dtype(actual.dtype)
    q64, k64, v64, plain, fp8 = _dequantized(q, k, v, options)
    reference = scaled_dot_product_attention(q64, k64, v64, **plain)
    if actual.shape != reference.shape:
        raise ValueError(
            f"actual must have the shape of the attention output of q, k and v, {reference.shape}; "
            f"got {actual.shape}"
        )
    if fp8 is None:
        baseline = _naive_attention(q, k, v, dtype, options)
    else:  # FlashAttention 3's: the dequantized inputs in the output's dtype, the weights rounded to fp8
        baseline = _naive_attention(q64, k64, v64, dtype, plain, intermediate=fp8)
    failure = _compare(actual, reference, baseline, factor, atol)
    if failure:
        raise AssertionError(failure)


def assert_lse_close(actual_lse, q, k, v, *, base="e", empty=-np.inf, factor=2.0, atol=None, **options):
    r"""Assert that a kernel's log-sum-exp is as accurate as a float32 computation of it.

    Attention kernels return each query row's log-sum-exp, the logarithm of
    the softmax denominator, for the backward pass or for merging partial
    results. This checks it against the float64 reference by the rule of
    `assert_attention_close`, with a naive float32 computation as the
    baseline.

    Parameters
    ----------
    actual_lse : array_like, shape (..., L)
        The kernel's log-sum-exp for `q`, `k`, `v` and `options`.
    q : array_like, shape (..., L, E)
        Queries, as given to the kernel.
    k : array_like, shape (..., S, E)
        Keys.
    v : array_like, shape (..., S, Ev)
        Values (they set the batch shape; the log-sum-exp does not depend
        on them).
    base : {"e", 2}, optional
        The kernel's logarithm: natural (FlashAttention) or base 2
        (Triton's tutorial, FlashInfer).
    empty : {-inf, inf}, optional
        What the kernel returns for a row with no allowed key (and no sink).
        The kernel must put exactly this value there.
    factor : float, optional
        How many times the baseline's largest error the kernel may reach.
    atol : float, optional
        Absolute slack added to the bound. Default ``16 * eps * max|R|``,
        with ``eps`` the machine epsilon of the dtype of `actual_lse` and
        :math:`R` the reference (in the kernel's base).
    **options
        The options of `assert_attention_close`, describing the attention
        the kernel computed (``sinks`` are counted in the log-sum-exp).

    Returns
    -------
    None
        Returns quietly when `actual_lse` is close enough.

    Raises
    ------
    AssertionError
        If some element is too far from the reference, with the report of
        `assert_attention_close`. A NaN, or the other infinity, in a row
        with no allowed key fails.
    TypeError
        If `actual_lse` is not a float array, or as
        `assert_attention_close` raises for the options.
    ValueError
        If `actual_lse` does not have the shape ``(..., L)`` of the output's
        rows, `base` is not ``"e"`` or 2, `empty` is not an infinity, or
        `factor` or `atol` is negative or not finite.

    See Also
    --------
    assert_attention_close : The same check of the output.
    attention_ref.scaled_dot_product_attention : The reference, with ``return_lse=True``.

    Notes
    -----
    With :math:`R` the float64 reference :math:`\log(e^{s_h} + \sum_{j \in
    A_i} e^{x_{ij}})` divided by :math:`\ln 2` when ``base=2``, and
    :math:`N` the baseline, steps 1 to 4 of `assert_attention_close` in
    float32 followed by :math:`N = \mathrm{rd}(m + \mathrm{rd}(\log Z))`,
    the check passes when
    :math:`|A - R| \le \mathrm{factor} \cdot \max |N - R| + \mathrm{atol}`
    elementwise. Rows where :math:`R = -\infty` (no allowed key, no sink)
    must hold `empty` exactly.

    Examples
    --------
    `blockwise_attention` in float32 passes:

    >>> import numpy as np
    >>> from attention_ref import blockwise_attention
    >>> from attention_ref.testing import assert_lse_close
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 16, 8)).astype(np.float32)
    >>> _, lse = blockwise_attention(q, k, v, block_size=4, return_lse=True)
    >>> assert_lse_close(lse, q, k, v)

    A base-2 kernel must be checked as one; its log-sum-exp read as natural
    fails:

    >>> lse2 = (lse / np.log(2)).astype(np.float32)
    >>> assert_lse_close(lse2, q, k, v, base=2)
    >>> assert_lse_close(lse2, q, k, v)
    Traceback (most recent call last):
    ...
    AssertionError: 32 of 32 elements are too far from the float64 reference
    allowed: factor * (naive float32 baseline's largest error) + atol = 2 * 3.27e-07 + 1.04e-05 = 1.11e-05
    largest error 2.42 at index (1, 13): actual 7.88563, reference 5.4659, baseline's error there 4.43e-08
    ratio to the baseline's largest error: 7.4e+06
    """
    _check_deterministic(options, "assert_lse_close")
    options = {name: value for name, value in options.items() if name not in DROPOUT}  # lse: before dropout
    actual = _output_array(actual_lse, "actual_lse")
    if base not in _LOG_BASES:
        raise ValueError(f'base must be "e" or 2; got {base!r}')
    if not (isinstance(empty, (int, float, np.floating)) and np.isinf(empty)):
        raise ValueError(f"empty must be -inf or inf, the kernel's value for a row with no key; got {empty!r}")
    factor = check_real(factor, "factor", minimum=0.0)
    if atol is not None:
        atol = check_real(atol, "atol", minimum=0.0)
    q64, k64, v64, plain, _ = _dequantized(q, k, v, options)
    _, reference = scaled_dot_product_attention(q64, k64, v64, return_lse=True, **plain)
    if actual.shape != reference.shape:
        raise ValueError(
            f"actual_lse must have the shape of the output's rows (its shape without the last axis), "
            f"{reference.shape}; got {actual.shape}"
        )
    _, _, _, _, _, baseline, _ = _naive_forward(q64, k64, v64, np.dtype(np.float32), plain)
    baseline = np.broadcast_to(baseline, reference.shape).astype(np.float64)
    per_nat = _LOG_BASES[base]  # 1 / log(base)
    no_key = reference == -np.inf
    reference, baseline = (np.where(no_key, float(empty), x * per_nat) for x in (reference, baseline))
    failure = _compare(actual, reference, baseline, factor, atol, baseline_name="float32")
    if failure:
        raise AssertionError(failure)


def _dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if is_bfloat16(dtype) else dtype.name


def _compare(actual, reference, baseline, factor: float, atol, what: str = "", baseline_name=None) -> str:
    """The failure message of the 2x rule (see assert_attention_close), or "" if `actual` passes.

    The baseline is named by `baseline_name`, else by the dtype of `actual`.
    """
    dtype = np.dtype(actual.dtype)
    name = _dtype_name(dtype)
    finite = np.isfinite(reference)
    scale = float(np.max(np.abs(reference[finite]), initial=0.0))
    if atol is None:
        atol = _ATOL_UNITS[name] * _EPS[name] * scale
    err = _errors(actual, reference)
    base_err = _errors(baseline, reference)
    counted = finite & np.isfinite(base_err)
    base_max = float(np.max(base_err[counted], initial=0.0))
    bound = factor * base_max + atol
    bad = err > bound
    if not bad.any():
        return ""
    worst = np.unravel_index(np.argmax(np.where(bad, err, -1.0)), err.shape)
    index = tuple(int(i) for i in worst)
    ratio = err[worst] / base_max if base_max > 0 else np.inf
    return (
        f"{what}{int(bad.sum())} of {bad.size} elements are too far from the float64 reference\n"
        f"allowed: factor * (naive {baseline_name or name} baseline's largest error) + atol = "
        f"{factor:g} * {base_max:.3g} + {atol:.3g} = {bound:.3g}\n"
        f"largest error {err[worst]:.3g} at index {index}: actual {float(actual[worst]):.6g}, "
        f"reference {reference[worst]:.6g}, baseline's error there {base_err[worst]:.3g}\n"
        f"ratio to the baseline's largest error: {ratio:.3g}"
    )


def assert_attention_grads_close(actual, q, k, v, dout, *, factor=2.0, atol=None, **options):
    r"""Assert that a kernel's attention gradients are as accurate as their dtype allows.

    The backward counterpart of `assert_attention_close`, by the same rule
    applied to each gradient separately, as FlashAttention's backward tests
    do: every element of each gradient must be within ``factor`` times the
    largest error of a naive backward in the same dtype (plus `atol`) of
    the float64 gradients of `attention_ref.attention_backward`.

    Parameters
    ----------
    actual : sequence of array_like
        The kernel's gradients ``(dq, dk, dv)``, or ``(dq, dk, dv, dbias,
        dsinks)`` like an `attention_ref.AttentionGrads` (None where the
        kernel has no such gradient; those given are checked). Each is
        checked in its own dtype: float16, float32, float64 or bfloat16.
    q : array_like, shape (..., L, E)
        Queries, as given to the kernel.
    k : array_like, shape (..., S, E)
        Keys.
    v : array_like, shape (..., S, Ev)
        Values.
    dout : array_like, shape (..., L, Ev)
        The gradient of the loss with respect to the output that the
        kernel's backward received.
    factor : float, optional
        How many times the baseline's largest error each gradient may
        reach. Default 2.0, as in FlashAttention's tests.
    atol : float, optional
        Absolute slack added to each bound. Default as in
        `assert_attention_close`, from each gradient's dtype and largest
        reference entry.
    **options
        Keyword arguments of `attention_ref.scaled_dot_product_attention`
        describing the attention, as for `assert_attention_close`
        (``dropout_p`` only with ``dropout_mask``; ``return_weights`` and
        ``rng`` are not accepted).

    Returns
    -------
    None
        Returns quietly when every gradient is close enough.

    Raises
    ------
    AssertionError
        If some element of a gradient is too far from the reference; the
        message names the gradient, then reads as `assert_attention_close`'s.
    TypeError
        If a gradient is not a float16, float32, float64 or bfloat16 array,
        `actual` is not a sequence of 3 to 5 entries, or as
        `assert_attention_close`.
    ValueError
        If a gradient does not have the shape of its argument, `dbias` is
        given without a `bias` (or `dsinks` without `sinks`), or as
        `assert_attention_close`.

    See Also
    --------
    attention_ref.attention_backward : The reference, run on float64 copies.
    assert_attention_close : The same check of the forward output.

    Notes
    -----
    For each gradient :math:`G` (``dq``, ``dk``, ``dv`` and, when given,
    ``dbias`` and ``dsinks``) with reference :math:`R_G` (float64
    `attention_backward`) and baseline :math:`N_G`:

    .. math::

        |G - R_G| \le \mathrm{factor} \cdot \max |N_G - R_G|
        + \mathrm{atol}_G .

    The baseline is the textbook backward in the gradient's dtype, every
    step rounded as in `assert_attention_close` (float16 and bfloat16
    computed in float32 and rounded after each step): the forward's
    weights :math:`P`, output :math:`O`, and then :math:`dV = P^\top dO`,
    :math:`dP = dO\, V^\top`, :math:`D = \mathrm{rowsum}(dO \circ O)`,
    :math:`dX = P \circ (dP - D)` (times :math:`1 - \tanh^2` under a soft
    cap), :math:`dQ = \sigma\, dX K`, :math:`dK = \sigma\, dX^\top Q`,
    and the sinks' :math:`-\sum_i P^{\mathrm{sink}}_i D_i`.
    FlashAttention's tests compare ``dq``, ``dk`` and ``dv`` with the
    gradients of their reference in float32 by the same factor 2 over a
    reference evaluated in the kernel's dtype.

    Examples
    --------
    The package's own backward in float16 (computed in float32) passes; a
    backward that ignores the soft cap does not, and each failing gradient
    is reported:

    >>> import numpy as np
    >>> from attention_ref import attention_backward
    >>> from attention_ref.testing import assert_attention_grads_close
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, dout = rng.standard_normal((4, 2, 16, 8)).astype(np.float16)
    >>> grads = attention_backward(q, k, v, dout, softcap=1.0, block_size=4)
    >>> assert_attention_grads_close(grads, q, k, v, dout, softcap=1.0)
    >>> uncapped = attention_backward(q, k, v, dout)
    >>> assert_attention_grads_close(uncapped, q, k, v, dout, softcap=1.0)
    Traceback (most recent call last):
    ...
    AssertionError: dq: 255 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000595 + 0.000582 = 0.00177
    largest error 1.2 at index (1, 10, 4): actual 1.3252, reference 0.124797, baseline's error there 1.99e-05
    ratio to the baseline's largest error: 2.02e+03
    dk: 250 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.00052 + 0.000537 = 0.00158
    largest error 1.24 at index (1, 2, 2): actual -1.48535, reference -0.24819, baseline's error there 0.000101
    ratio to the baseline's largest error: 2.38e+03
    dv: 248 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000387 + 0.000875 = 0.00165
    largest error 0.834 at index (0, 3, 5): actual -1.5, reference -0.665751, baseline's error there 0.000264
    ratio to the baseline's largest error: 2.15e+03
    """
    _check_deterministic(options, "assert_attention_grads_close")
    if isinstance(actual, np.ndarray) or not isinstance(actual, (tuple, list)) or not 3 <= len(actual) <= 5:
        raise TypeError(
            "actual must be a sequence (dq, dk, dv) or (dq, dk, dv, dbias, dsinks), like AttentionGrads; "
            f"got {type(actual).__name__}" + (f" of length {len(actual)}" if isinstance(actual, (tuple, list)) else "")
        )
    factor = check_real(factor, "factor", minimum=0.0)
    if atol is not None:
        atol = check_real(atol, "atol", minimum=0.0)
    given = dict(zip(AttentionGrads._fields[: len(actual)], actual, strict=True))
    wide = {name: options.get(name) for name in ("bias", "sinks") if options.get(name) is not None}
    wide = {name: as_real_array(a, name).astype(np.float64) for name, a in wide.items()}
    reference = attention_backward(
        *(as_real_array(a, name).astype(np.float64) for a, name in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout"))),
        **{**options, **wide},
    )
    failures = []
    for field, grad in given.items():
        if grad is None:
            continue
        want = getattr(reference, field)
        if want is None:
            raise ValueError(f"actual has {field} but the options have no {field[1:]} to differentiate")
        grad = _output_array(grad, f"actual.{field}")
        if grad.shape != want.shape:
            raise ValueError(f"actual.{field} must have the shape of {field[1:]}, {want.shape}; got {grad.shape}")
        baseline = getattr(_naive_backward(q, k, v, dout, np.dtype(grad.dtype), options), field)
        failures.append(_compare(grad, want, baseline, factor, atol, what=f"{field}: "))
    failures = [f for f in failures if f]
    if failures:
        raise AssertionError("\n".join(failures))
