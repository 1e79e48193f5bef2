"""The checkers: a kernel's output, log-sum-exp and gradients against the float64 reference, by one rule."""

from __future__ import annotations

import numpy as np

from .._interop import to_numpy
from .._validation import as_real_array
from ..backward import AttentionGrads, sum_groups, sum_to
from ._layout import check_layout, heads_first, noted
from ._problem import Problem, check_empty_rows, empty_expected, is_fused, output_array
from ._rule import (
    ATOL_UNITS,
    ATOL_UNITS_GRAD,
    ATOL_UNITS_LSE,
    check_tolerances,
    compare,
    finite_magnitude,
    judged_dtype,
    textbook_hint,
    widened_hint,
)

__all__ = ["assert_attention_close", "assert_attention_grads_close", "assert_lse_close"]

#: The bases a kernel's log-sum-exp may have, each with the factor turning a natural log into it.
_LOG_BASES = {"e": 1.0, 2: 1.0 / np.log(2.0)}


def assert_attention_close(actual, q, k, v, *, factor=2.0, atol=None, dtype=None, empty_rows="zeros",
                           baseline="fused", progress=False, layout="bhsd", **options):
    r"""Assert that a kernel's attention output is as accurate as its dtype allows.

    Passes when every element of `actual` is within ``factor`` times the
    largest error of a naive implementation in the same dtype (plus `atol`)
    of the float64 reference; raises AssertionError otherwise.

    Parameters
    ----------
    actual : array_like, shape (..., L, Ev)
        The kernel's output for `q`, `k`, `v` and `options`: float16,
        float32, float64 or bfloat16 (ml_dtypes), as a NumPy array, a torch
        tensor (any device, requiring grad or not), a JAX or CuPy array or
        anything `to_numpy` reads. Judged in its own dtype unless `dtype`
        says otherwise.
    q : array_like, shape (..., L, E)
        Queries, as given to the kernel (any array `to_numpy` reads; fp8
        with ``q_descale``).
    k : array_like, shape (..., S, E)
        Keys.
    v : array_like, shape (..., S, Ev)
        Values.
    factor : float, optional
        How many times the baseline's largest error the kernel may reach.
        Default 2.0, as in FlashAttention's tests.
    atol : float, optional
        Absolute slack added to the bound. Default: ``u * eps *
        max|reference|`` with ``eps`` the machine epsilon of the dtype
        judged and ``u`` from the table in the Notes.
    dtype : dtype or str, optional
        The precision the kernel computed in, when `actual` was widened
        before the check (``out.float()`` of a bfloat16 kernel): a NumPy
        dtype, an ml_dtypes type, a name such as ``"bfloat16"``, or a
        torch or JAX dtype (``torch.bfloat16``, ``jnp.bfloat16``). The
        baseline and the default `atol` follow it. Default: the dtype of
        `actual`.
    empty_rows : {"zeros", "mean", "nan", "any"}, optional
        What the kernel returns for a query row with no allowed key (and no
        sink): ``"zeros"``, the package's convention (FlashAttention,
        PyTorch's fused kernels); ``"mean"``, the mean of the values of all
        that row's keys (JAX, Hugging Face eager, which mask with a large
        finite number); ``"nan"`` (PyTorch's math path,
        ``nn.MultiheadAttention``); ``"any"``: those rows are not checked.
    progress : bool, optional
        Show a progress bar over the (batch, head) pairs the check computes
        (tqdm's, where tqdm is installed; nothing otherwise), for a check
        that takes long. Default False.
    layout : {"bhsd", "bshd"}, optional
        Where the heads sit in `actual`, `q`, `k` and `v`: ``"bhsd"`` (the
        default), (B, H, L, E) as PyTorch holds them, or ``"bshd"``,
        (B, L, H, E) as FlashAttention, JAX and Hugging Face do. A mask or
        bias stays (..., H, L, S). The failing index is printed in this
        layout; the report's lines still name batch, head and rows.
    **options
        Keyword arguments of `attention_ref.scaled_dot_product_attention`
        describing the attention the kernel computed: ``mask``, ``bias``,
        ``is_causal``, ``causal_alignment``, ``scale``, ``enable_gqa`` and
        those it has besides (``softcap``, ``window``, ``alibi_slopes``,
        ``sinks``, fp8's ``q_descale``, ``k_descale``, ``v_descale``), and
        ``dropout_p`` with ``dropout_mask``, the kernel's own keep-mask,
        which the reference and the baseline then apply.
        ``return_weights`` and ``rng`` are not accepted, nor ``dropout_p``
        without ``dropout_mask``. Array options may be framework arrays too.
        ``normalization="sigmoid"`` (with ``sigmoid_bias``) checks sigmoid
        attention: its baseline is the naive sigmoid attention in the
        kernel's dtype (scores, plus the bias, sigmoid, product with the
        values).

        Or a FlexAttention variant, with the semantics of
        `attention_ref.flex_attention`: ``score_mod``, ``mask_mod`` (NumPy
        functions, or functions written for torch, as FlexAttention takes
        them) and ``block_mask`` (torch's ``BlockMask`` as it is, or a dict
        of `attention_ref.block_mask_to_dense`'s keywords), with ``scale``
        and ``enable_gqa`` only; `q` is then (B, Hq, L, E). The baseline
        applies the same mods in the kernel's dtype.

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
        and its largest error, and the ratio of the two largest errors; the
        NaN and infinities in `actual`, counted apart; where the failures
        sit, one line per run of consecutive failing rows of one batch and
        head (``batch 1, head 3: rows 10-20 (37 elements)``, indices from
        0, ranges inclusive, at most eight lines and a count of the rest;
        under grouped-query attention each line names the key/value head
        and joins its query heads failing on the same rows: ``batch 0,
        heads 4-7 (kv head 1): rows 0-95``), rows whose reference has no
        allowed key marked ``no allowed key``;
        when `actual` is wider than every input and no `dtype` was given, a
        note that ``dtype=`` judges it in the inputs' precision; and when
        `q` and `k` read as (B, H, L, E) have more heads than positions, a
        note that the check assumed ``layout="bhsd"`` and that
        ``layout="bshd"`` reads (B, L, H, E) arrays.
    TypeError
        If `actual` is not a float16, float32, float64 or bfloat16 array,
        if `return_weights` or `rng` is given, or `dropout_p` without
        `dropout_mask`, if a FlexAttention variant comes with options other
        than ``scale`` and ``enable_gqa``, or as
        `attention_ref.scaled_dot_product_attention` (or
        `attention_ref.flex_attention`) raises for the options.
    ValueError
        If `actual` does not have the shape of the attention output of `q`,
        `k`, `v`, if `factor` or `atol` is negative or not finite, if
        `empty_rows` is not one of its four values, if `layout` is not
        ``"bhsd"`` or ``"bshd"``, if a ``block_mask``
        describes other sequence lengths than `q` and `k` (or comes with a
        ``mask_mod``), if a tensor sits on a device it cannot be copied
        from, or as `attention_ref.scaled_dot_product_attention` raises.

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

    The baseline :math:`N` is the naive formula in the dtype :math:`D`
    judged (that of `actual`, or `dtype`), :math:`\mathrm{rd}` rounding to
    it. For float16 and bfloat16 every step is computed in float32 and the
    two matrix products accumulate in float32, as tensor-core products do;
    in float32 and float64 everything is computed in that dtype and
    :math:`\mathrm{rd}` changes nothing. With ``baseline="fused"`` (the
    default) the scores and the softmax stay in float32, as FlashAttention,
    cuDNN, PyTorch's fused kernels, JAX and FlexAttention keep them; with
    ``baseline="textbook"`` every step marked :math:`\mathrm{rd}_t` below is
    rounded to :math:`D` too, as eager code that multiplies in :math:`D`
    does (Hugging Face's eager attention, FlashAttention's test reference
    with ``upcast=False``):

    1. :math:`q, k, v` rounded to :math:`D` (grouped-query heads repeated);
    2. :math:`s = \mathrm{rd}_t(\mathrm{rd}_t(q k^\top) \cdot \sigma)`,
       with the soft cap :math:`\mathrm{rd}_t(c \tanh(s / c))` if
       ``softcap`` is given (or the ``score_mod`` of a FlexAttention
       variant, then its ``mask_mod``);
    3. :math:`s = \mathrm{rd}_t(s + \mathrm{rd}(B))` with :math:`B` the
       package's own additive term for `options` (bias, ALiBi, and 0 /
       :math:`-\infty` for masks, causality and windows);
    4. :math:`m = \max_j s_j` (and the sink), :math:`e = \mathrm{rd}_t(\exp
       \mathrm{rd}_t(s - m))`, :math:`Z = \mathrm{rd}_t(\sum_j e_j)` (plus
       the sink's term), :math:`w = \mathrm{rd}(\mathrm{rd}_t(e / Z))`;
       rows with no allowed key are zeros;
    5. :math:`N = \mathrm{rd}(w v)`.

    fp8 input (with ``q_descale``, ``k_descale``, ``v_descale``) is checked
    as FlashAttention 3's tests check it (``hopper/test_flash_attn.py``,
    whose ``attention_ref`` in ``hopper/test_util.py`` is called with
    ``intermediate_dtype`` the fp8 dtype): :math:`R` is the attention of
    the dequantized arrays, and :math:`N` runs the steps above in the dtype
    of `actual` (bfloat16 for an fp8 kernel) on the dequantized arrays,
    with the weights :math:`w` rounded to the fp8 format once more before
    step 5.

    The bound uses the baseline's *largest* error, not its error element
    by element: at a single element the baseline can land on the rounded
    reference by luck, and a correct kernel would then fail there.

    The default `atol` is :math:`u\, \epsilon \max|R|` with :math:`\epsilon`
    the machine epsilon of :math:`D` and :math:`u` from the table: twice
    the most that correct kernels (PyTorch's CPU attention and JAX's, 200
    cases a dtype, ``benchmarks/sensitivity.py``) needed, rounded up to a
    power of two. For the log-sum-exp, :math:`\epsilon` is that of the
    kernel's inputs (a float32 log-sum-exp of bfloat16 inputs is as exact
    as their scores), for the gradients :math:`\max|R|` runs over
    ``dq``, ``dk`` and ``dv`` together, and in float32 and float64, where a
    kernel's rounding of a large score moves its weights as much as the
    baseline's own, :math:`u` is multiplied by the largest score magnitude
    (at least 1; with ``softcap``, of the scores before the cap, where the
    kernel rounds them):

    ========  =================  ==========  ===============  ===========
    dtype     :math:`\epsilon`   output      log-sum-exp      gradients
    ========  =================  ==========  ===============  ===========
    float16   :math:`2^{-10}`    1/8         1                1
    bfloat16  :math:`2^{-7}`     1/8         1                1
    float32   :math:`2^{-23}`    1           4                4
    float64   :math:`2^{-52}`    2           1/8              8
    ========  =================  ==========  ===============  ===========

    In float32 and float64 the default `atol` of the output is raised
    where needed so that the bound is at least :math:`\epsilon \max |v|`
    (the values bound the output): over a few output elements the
    baseline's largest error may happen to be smaller than a correct
    kernel's rounding (72 elements of value head size 1, where PyTorch's
    float32 attention was 1.2e-7 off against a bound of 1.11e-7).

    With these defaults a scale wrong by 2 % fails in bfloat16, 0.5 % in
    float16 and 0.1 % in float32 on every case of
    benchmarks/sensitivity.py's mix, whose scores are of order one and whose
    rows allow several keys. Elsewhere a wrong scale can pass: a row with
    one allowed key does not depend on it, and in bfloat16 neither nearly
    uniform weights (scores within about 0.5 of each other) nor saturated
    rows (one score tens above the rest) move by more than the rounding.

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
    AssertionError: 236 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000769 + 0.00028 = 0.00182
    largest error 3.21 at index (0, 0, 6): actual 1.49512, reference -1.71387, baseline's error there 0
    ratio to the baseline's largest error: 4.17e+03
    where they are:
    head 0: rows 0-14 (117 elements)
    head 1: rows 0-14 (119 elements)

    A float16 kernel's output widened to float32 is judged as a float32
    kernel and fails, with a note; ``dtype=`` judges it in float16:

    >>> wide = blockwise_attention(q, k, v, block_size=4).astype(np.float32)
    >>> assert_attention_close(wide, q, k, v, dtype="float16")
    >>> assert_attention_close(wide, q, k, v)
    Traceback (most recent call last):
    ...
    AssertionError: 245 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float32 baseline's largest error) + atol = 2 * 1.64e-07 + 6.15e-07 = 9.42e-07
    largest error 0.000235 at index (0, 6, 1): actual -0.647461, reference -0.647226, baseline's error there 1.55e-08
    ratio to the baseline's largest error: 1.44e+03
    where they are:
    head 0: rows 0-15 (122 elements)
    head 1: rows 0-15 (123 elements)
    note: actual is float32 but the inputs are float16; if the kernel computed in float16
    and its output was widened (out.float()), pass dtype='float16' to judge it in that precision
    """
    layout = check_layout(layout)
    with noted(q, k, layout):
        actual, q, k, v = heads_first(layout, actual=actual, q=q, k=k, v=v)
        check = Problem(q, k, v, options, "assert_attention_close")
        failure = output_failure(actual, check, factor=factor, atol=atol, dtype=dtype, empty_rows=empty_rows,
                                 baseline=baseline, progress=progress, layout=layout)
        if failure:
            raise AssertionError(failure)


def _check_lse_shape(actual: np.ndarray, shape: tuple[int, ...]) -> None:
    if actual.shape != shape:
        raise ValueError(f"actual_lse must have the shape of the output's rows (its shape without the last axis), "
                         f"{shape}; got {actual.shape}")


def output_failure(actual, check: Problem, *, factor, atol, dtype, empty_rows, baseline, what: str = "",
                   progress: bool = False, layout: str = "bhsd") -> str:
    """The failure message of `assert_attention_close` for `check`, or ""."""
    actual = output_array(actual)
    factor, atol = check_tolerances(factor, atol)
    judged = judged_dtype(actual, dtype)
    empty_rows = check_empty_rows(empty_rows)
    fused = is_fused(baseline)
    shape = check.output_shape(judged)
    for known in ((shape,) if shape is not None else ()):
        _check_output_shape(actual, known)
    reference, lse, first = check.forward(judged, fused, magnitude=atol is None and judged.itemsize >= 4,
                                          progress=progress)
    _check_output_shape(actual, reference.shape)
    empty = np.broadcast_to(lse == -np.inf, reference.shape[:-1])  # (..., L): no allowed key (nor sink)
    mean = check.values_mean() if empty_rows == "mean" else None
    values_scale = finite_magnitude(check.v64)  # bounds |output|

    def failure(fused: bool, naive=None) -> str:
        if naive is None:
            naive = np.broadcast_to(check.naive_output_tiles(judged, fused, progress), reference.shape)
        want, naive, skip = empty_expected(reference, naive, empty, empty_rows, mean)
        return compare(actual, want, naive, factor=factor, atol=atol, units=ATOL_UNITS, dtype=judged, what=what,
                       skip=skip, empty=empty, widened=widened_hint(actual, dtype, check.inputs),
                       magnitude=check.score_magnitude, layout=layout, groups=check.kv_groups(),
                       floor_scale=values_scale)

    found = failure(fused, first)
    if found and fused and judged.itemsize < 4 and not failure(False):
        found += "\n" + textbook_hint(judged)
    return found


def _check_output_shape(actual: np.ndarray, shape: tuple[int, ...]) -> None:
    if actual.shape != shape:
        raise ValueError(f"actual must have the shape of the attention output of q, k and v, {shape}; "
                         f"got {actual.shape}")


def assert_lse_close(actual_lse, q, k, v, *, base="e", empty=-np.inf, factor=2.0, atol=None, dtype=None,
                     empty_rows="zeros", baseline="fused", progress=False, layout="bhsd", **options):
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
        Absolute slack added to the bound. Default ``u * eps * max|R|``,
        with ``eps`` the machine epsilon of the dtype judged, :math:`R` the
        reference (in the kernel's base) and ``u`` from the table in
        `assert_attention_close`'s Notes (its log-sum-exp row).
    dtype : dtype or str, optional
        The precision the kernel computed its log-sum-exp in (as in
        `assert_attention_close`: a NumPy or ml_dtypes dtype, a name, or a
        torch or JAX dtype (``torch.bfloat16``, ``jnp.bfloat16``)): the
        baseline is computed in it and the default `atol` follows it.
        Default: the baseline in float32 (as kernels keep it), `atol` from
        the dtype of `actual_lse`.
    empty_rows : {"zeros", "mean", "nan", "any"}, optional
        The kernel's convention for a row with no allowed key, as in
        `assert_attention_close`: with ``"zeros"`` (the default) such a row
        must hold `empty`, with ``"nan"`` NaN; with ``"mean"`` (whose
        log-sum-exp is that of the kernel's masking constant) and ``"any"``
        those rows are not checked.
    progress : bool, optional
        Show a progress bar over the (batch, head) pairs the check computes
        (tqdm's, where tqdm is installed; nothing otherwise), for a check
        that takes long. Default False.
    layout : {"bhsd", "bshd"}, optional
        Where the heads sit in `q`, `k` and `v`: (B, H, L, E), the default,
        or (B, L, H, E) with ``"bshd"``, as in `assert_attention_close`.
        `actual_lse` stays (B, H, L), as those kernels return it.
    **options
        The options of `assert_attention_close`, describing the attention
        the kernel computed (``sinks`` are counted in the log-sum-exp), or
        its FlexAttention variant (``score_mod``, ``mask_mod``,
        ``block_mask``, with ``scale`` and ``enable_gqa``). Not
        ``normalization="sigmoid"``: sigmoid attention has no log-sum-exp.

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
        rows, `base` is not ``"e"`` or 2, `empty` is not an infinity,
        ``normalization`` is not the softmax,
        `factor` or `atol` is negative or not finite, or `layout` is not
        ``"bhsd"`` or ``"bshd"``.

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
    allowed: factor * (naive float32 baseline's largest error) + atol = 2 * 3.27e-07 + 2.61e-06 = 3.26e-06
    largest error 2.42 at index (1, 13): actual 7.88563, reference 5.4659, baseline's error there 4.43e-08
    ratio to the baseline's largest error: 7.4e+06
    where they are:
    head 0: rows 0-15 (16 elements)
    head 1: rows 0-15 (16 elements)
    """
    layout = check_layout(layout)
    with noted(q, k, layout):
        q, k, v = heads_first(layout, q=q, k=k, v=v)
        check = Problem(q, k, v, options, "assert_lse_close")
        check.variant.require_lse("assert_lse_close")  # the sigmoid has no log-sum-exp
        actual = output_array(actual_lse, "actual_lse")
        if base not in _LOG_BASES:
            raise ValueError(f'base must be "e" or 2; got {base!r}')
        if not (isinstance(empty, (int, float, np.floating)) and np.isinf(empty)):
            raise ValueError(f"empty must be -inf or inf, the kernel's value for a row with no key; got {empty!r}")
        factor, atol = check_tolerances(factor, atol)
        empty_rows = check_empty_rows(empty_rows)
        judged = np.dtype(np.float32) if dtype is None else judged_dtype(actual, dtype)
        shape = check.output_shape(judged)
        for known in ((shape[:-1],) if shape is not None else ()):
            _check_lse_shape(actual, known)
        fused = is_fused(baseline)
        reference, baseline = check.lse_pass(judged, fused, progress)
        _check_lse_shape(actual, reference.shape)
        baseline = np.broadcast_to(baseline, reference.shape).astype(np.float64)
        per_nat = _LOG_BASES[base]  # 1 / log(base)
        no_key = reference == -np.inf
        expected = {"zeros": float(empty), "nan": np.nan}.get(empty_rows, float(empty))
        reference, baseline = (np.where(no_key, expected, x * per_nat) for x in (reference, baseline))
        skip = no_key if empty_rows in ("mean", "any") else None
        failure = compare(actual, reference, baseline, factor=factor, atol=atol, units=ATOL_UNITS_LSE,
                          dtype=judged_dtype(actual, dtype), baseline_name=None if dtype is not None else "float32",
                          skip=skip, empty=no_key, rows_last=True, eps_dtype=judged if dtype is not None else
                          check.input_dtype(), groups=check.kv_groups())
        if failure:
            raise AssertionError(failure)


def assert_attention_grads_close(actual, q, k, v, dout, *, factor=2.0, atol=None, dtype=None, empty_rows="zeros",
                                 baseline="fused", progress=False, layout="bhsd", **options):
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
        Absolute slack added to each bound. Default ``u * eps * max|R_G|``
        from each gradient's judged dtype and largest reference entry, with
        ``u`` from the table in `assert_attention_close`'s Notes (its
        gradients row).
    dtype : dtype or str, optional
        The precision the kernel's backward computed in, when the gradients
        were widened before the check (as in `assert_attention_close`: a
        NumPy or ml_dtypes dtype, a name, or a torch or JAX dtype
        (``torch.bfloat16``, ``jnp.bfloat16``)); the baselines and the
        default `atol` follow it. Default: each gradient's own dtype.
    empty_rows : {"zeros", "mean", "nan", "any"}, optional
        The forward's convention for a row with no allowed key, as in
        `assert_attention_close`, and what it implies for the gradients:
        ``"zeros"``: no gradient flows from such a row. ``"mean"``: the row
        is the mean of the values, a function of `v` alone, so ``dv`` gets
        ``dout / S`` from it and ``dq``, ``dk`` nothing (JAX, which masks
        with ``where``; Hugging Face eager adds its mask and passes a
        gradient to ``q`` and ``k``: check it with ``"any"``). ``"nan"``:
        ``dq`` is NaN on the row, and the other gradients of a head holding
        such a row are not checked (the NaN reaches all of them). ``"any"``:
        the row of ``dq`` and the other gradients of its head are not
        checked.
    progress : bool, optional
        Show a progress bar over the (batch, head) pairs the check computes
        (tqdm's, where tqdm is installed; nothing otherwise), for a check
        that takes long. Default False.
    layout : {"bhsd", "bshd"}, optional
        Where the heads sit in `q`, `k`, `v`, `dout` and ``dq``, ``dk``,
        ``dv``: (B, H, L, E), the default, or (B, L, H, E) with ``"bshd"``,
        as in `assert_attention_close` (``dbias`` keeps the bias's shape).
    **options
        Keyword arguments of `attention_ref.scaled_dot_product_attention`
        describing the attention, as for `assert_attention_close`
        (``dropout_p`` only with ``dropout_mask``; ``return_weights`` and
        ``rng`` are not accepted; ``normalization="sigmoid"`` differentiates
        the sigmoid), or a FlexAttention variant
        (``score_mod``, ``mask_mod``, ``block_mask``, with ``scale`` and
        ``enable_gqa``), with ``score_mod_grad``, the derivative of
        ``score_mod`` with respect to the score, where ``score_mod`` is
        neither one of the package's (which carry theirs) nor written for
        torch (differentiated by torch's autograd).

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
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000222 + 0.000875 = 0.00132
    largest error 1.2 at index (1, 10, 4): actual 1.3252, reference 0.124797, baseline's error there 1.99e-05
    ratio to the baseline's largest error: 5.4e+03
    where they are:
    head 0: rows 0-15 (127 elements)
    head 1: rows 0-15 (128 elements)
    dk: 252 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000244 + 0.000875 = 0.00136
    largest error 1.24 at index (1, 2, 2): actual -1.48535, reference -0.24819, baseline's error there 0.000143
    ratio to the baseline's largest error: 5.08e+03
    where they are:
    head 0: rows 0-15 (125 elements)
    head 1: rows 0-15 (127 elements)
    dv: 249 of 256 elements are too far from the float64 reference
    allowed: factor * (naive float16 baseline's largest error) + atol = 2 * 0.000347 + 0.000875 = 0.00157
    largest error 0.834 at index (0, 3, 5): actual -1.5, reference -0.665751, baseline's error there 0.000224
    ratio to the baseline's largest error: 2.4e+03
    where they are:
    head 0: rows 0-15 (124 elements)
    head 1: rows 0-15 (125 elements)
    """
    layout = check_layout(layout)
    with noted(q, k, layout):
        q, k, v, dout = heads_first(layout, q=q, k=k, v=v, dout=dout)
        check = Problem(q, k, v, options, "assert_attention_grads_close")
        if isinstance(actual, np.ndarray) or not isinstance(actual, (tuple, list)) or not 3 <= len(actual) <= 5:
            raise TypeError(
                "actual must be a sequence (dq, dk, dv) or (dq, dk, dv, dbias, dsinks), like AttentionGrads; "
                f"got {type(actual).__name__}"
                + (f" of length {len(actual)}" if isinstance(actual, (tuple, list)) else "")
            )
        named = {f"actual.{name}": grad for name, grad in zip(("dq", "dk", "dv"), actual, strict=False)}
        actual = [*heads_first(layout, **named), *actual[3:]]
        factor, atol = check_tolerances(factor, atol)
        empty_rows = check_empty_rows(empty_rows)
        fused = is_fused(baseline)
        given = dict(zip(AttentionGrads._fields[: len(actual)], actual, strict=True))
        dout = to_numpy(dout, "dout")
        check.grads_prepare(dout)
        shapes = {"dq": check.q.shape, "dk": check.k.shape, "dv": check.v.shape,
                  **{f"d{name}": np.shape(check.options[name]) for name in ("bias", "sinks")
                     if check.options.get(name) is not None}}
        checked, judged = {}, {}
        for field, grad in given.items():  # every argument checked before any work, in the order of the fields
            if grad is None:
                continue
            if field not in shapes:
                raise ValueError(f"actual has {field} but the options have no {field[1:]} to differentiate")
            grad = output_array(grad, f"actual.{field}")
            if grad.shape != shapes[field]:
                raise ValueError(f"actual.{field} must have the shape of {field[1:]}, {shapes[field]}; "
                                 f"got {grad.shape}")
            checked[field], judged[field] = grad, judged_dtype(grad, dtype)
        dtypes = list(dict.fromkeys(judged.values()))
        reference, lse, baselines = check.grads_pass(
            dout, dtypes or [np.dtype(np.float32)], fused, dbias="dbias" in checked, progress=progress,
            magnitude=atol is None and any(d.itemsize >= 4 for d in dtypes))
        empty = lse == -np.inf  # (..., L): rows with no allowed key (nor sink)
        scale = max(finite_magnitude(g) for g in reference[:3])  # dq, dk, dv
        failures = []
        for field, grad in checked.items():
            want = getattr(reference, field)
            naive = getattr(baselines[judged[field]], field).astype(np.float64)
            want, naive, skip, rows = _empty_grads(field, want, naive, empty, empty_rows, check, dout)
            judged_here = judged[field]
            failures.append(compare(grad, want, naive, factor=factor, atol=atol, units=ATOL_UNITS_GRAD,
                                    dtype=judged_here, what=f"{field}: ", skip=skip, empty=rows,
                                    widened=widened_hint(grad, dtype, check.inputs), magnitude=check.score_magnitude,
                                    scale=scale if field in ("dq", "dk", "dv") else None,
                                    layout=layout if field in ("dq", "dk", "dv") else "bhsd",
                                    groups=check.kv_groups() if field == "dq" else 1))
        failures = [f for f in failures if f]
        if failures:
            raise AssertionError("\n".join(failures))


def _empty_grads(field: str, want, baseline, empty, empty_rows: str, check: Problem, dout):
    """``(want, baseline, skip, rows)`` of one gradient with the rows with no allowed key as `empty_rows` says.

    ``rows`` marks dq's empty rows for the report (None for the other gradients). "zeros": nothing changes.
    "mean" (the output is the values' mean there, a function of v alone): dq and dk as for zeros, and dv
    gets ``dout / S`` from each empty row. "nan": dq's empty rows must be NaN, and dk, dv, dbias and dsinks
    of a head holding an empty row are not checked (NaN reaches every key of that head). "any": dq's empty
    rows and those heads' other gradients are not checked.
    """
    rows = _reduce_to(empty.astype(np.float64), want.shape[:-1]) > 0 if field == "dq" else None
    if empty_rows == "zeros" or not empty.any():
        return want, baseline, None, rows
    if rows is not None:  # dq
        mask = np.broadcast_to(rows[..., None], want.shape)
        if empty_rows == "nan":
            return np.where(mask, np.nan, want), np.where(mask, np.nan, baseline), None, rows
        return want, baseline, (mask if empty_rows == "any" else None), rows
    if empty_rows == "mean":
        if field != "dv":
            return want, baseline, None, None
        # out_i = mean_j v_j on an empty row i: each key's value gets dout_i / S, per query head
        rows_dout = np.where(empty[..., None], as_real_array(dout, "dout").astype(np.float64), 0.0)
        extra = rows_dout.sum(axis=-2, keepdims=True) / want.shape[-2]  # (..., Hq, 1, Ev)
        extra = _reduce_to(np.broadcast_to(extra, (*extra.shape[:-2], *want.shape[-2:])), want.shape)
        return want + extra, baseline + extra, None, None
    if field == "dbias":
        touched = _reduce_to(empty.astype(np.float64)[..., None], (*want.shape[:-1], 1)) > 0  # the empty rows
    else:  # dk, dv: every key of a head that an empty row reads; dsinks: a row with a sink is never empty
        touched = _reduce_to(empty.any(axis=-1).astype(np.float64)[..., None, None],
                             (*want.shape[:-2], 1, 1)) > 0 if field != "dsinks" else np.zeros((), bool)
    return want, baseline, np.broadcast_to(touched, want.shape), None


def _reduce_to(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`values` (..., Hq, ...) summed to `shape`: over broadcast axes, and over grouped query heads on axis -3."""
    if values.ndim >= 3 and len(shape) >= 3 and values.shape[-3] != shape[-3] and shape[-3] > 1:
        values = sum_groups(values, shape[-3])
    return sum_to(values, shape)
