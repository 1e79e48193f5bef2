"""Numerically stable softmax, log-softmax and log-sum-exp."""

from __future__ import annotations

import numpy as np

from ._validation import as_real_array, check_axis, check_bool, result_dtype

__all__ = ["log_softmax", "logsumexp", "softmax"]


def _shifted(x, axis):
    """Return ``(x_work, shift, axis, out_dtype)`` with ``shift`` the finite slice max.

    A slice whose maximum is not finite (all ``-inf``, holding ``+inf`` or
    ``NaN``) gets a shift of 0, so no ``inf - inf`` is ever formed from the
    shift. An empty slice also gets 0 (its maximum would be undefined).
    """
    x = as_real_array(x, "x")
    if x.ndim == 0:
        raise ValueError(f"x must have at least 1 dimension; got shape {x.shape}")
    axis = check_axis(axis, x.ndim)
    out_dtype, work_dtype = result_dtype(x)
    xw = x.astype(work_dtype, copy=False)
    with np.errstate(invalid="ignore"):
        shift = np.max(xw, axis=axis, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(shift), shift, 0.0).astype(work_dtype, copy=False)
    return xw, shift, axis, out_dtype


def softmax(x, axis=-1):
    r"""Softmax along an axis, shifted by the maximum so it never overflows.

    Parameters
    ----------
    x : array_like, shape (..., n, ...)
        Real input (logits). Integers are converted to float64; float16
        input is computed in float32 and returned as float16.
    axis : int, optional
        Axis along which the result sums to one. Default is the last axis.

    Returns
    -------
    ndarray, same shape as `x`
        Non-negative weights summing to one along `axis`. A slice whose
        entries are all ``-inf`` (a fully masked row) gives zeros there.

    Raises
    ------
    TypeError
        If `x` is boolean, complex or not numeric, or `axis` is not an integer.
    ValueError
        If `x` is 0-dimensional or `axis` is out of range.

    See Also
    --------
    log_softmax : Logarithm of the softmax, computed without ``log(0)``.
    logsumexp : The normaliser :math:`\log \sum_j e^{x_j}`.
    scaled_dot_product_attention : Applies this to scaled scores.

    Notes
    -----
    .. math::

        \operatorname{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}},
        \qquad m = \max_j x_j .

    Subtracting :math:`m` changes nothing mathematically (the factor
    :math:`e^{-m}` cancels) but keeps every exponent :math:`\le 0`, so
    ``exp`` cannot overflow. When every entry is ``-inf`` the mathematical
    softmax is undefined (0/0); this function returns zeros, which is what
    an attention row with no allowed key should contribute. ``NaN`` anywhere
    in a slice, or ``+inf``, makes that slice ``NaN`` (no warning).

    References
    ----------
    .. [1] Bridle, J. S., "Probabilistic interpretation of feedforward
       classification network outputs", Neurocomputing, 1990.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import softmax
    >>> softmax(np.array([1.0, 2.0, 3.0]))
    array([0.09003057, 0.24472847, 0.66524096])

    Large logits do not overflow, and a fully masked row gives zeros:

    >>> softmax(np.array([[1000.0, 1000.0], [-np.inf, -np.inf]]))
    array([[0.5, 0.5],
           [0. , 0. ]])
    """
    xw, shift, axis, out_dtype = _shifted(x, axis)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(xw - shift)
        total = np.sum(e, axis=axis, keepdims=True)
        # total == 0 only for all -inf slices; divide by 1 there to get zeros.
        e /= np.where(total > 0, total, 1.0)
    # With a finite shift every exponent is <= 0, so total <= n: a total that
    # is inf or NaN means +inf or NaN in the slice, which poisons all of it.
    e = np.where(np.isfinite(total), e, np.nan)
    return e.astype(out_dtype, copy=False)


def logsumexp(x, axis=-1, keepdims=False):
    r"""Logarithm of the sum of exponentials, computed stably.

    Parameters
    ----------
    x : array_like, shape (..., n, ...)
        Real input.
    axis : int, optional
        Axis to reduce. Default is the last axis.
    keepdims : bool, optional
        Keep the reduced axis with size one.

    Returns
    -------
    ndarray, shape of `x` without `axis` (or with size 1 if `keepdims`)
        :math:`\log \sum_j e^{x_j}`; ``-inf`` for a slice of all ``-inf``
        (or an empty slice), ``+inf`` if the slice holds ``+inf``, ``NaN``
        if it holds ``NaN``.

    Raises
    ------
    TypeError
        If `x` is boolean, complex or not numeric, `axis` is not an integer
        or `keepdims` is not a bool.
    ValueError
        If `x` is 0-dimensional or `axis` is out of range.

    See Also
    --------
    softmax : Equals ``exp(x - logsumexp(x, keepdims=True))``.
    log_softmax : ``x - logsumexp(x)``.

    Notes
    -----
    .. math::

        \operatorname{LSE}(x) = m + \log \sum_j e^{x_j - m},
        \qquad m = \max_j x_j .

    The blockwise (online-softmax) algorithms keep exactly this quantity per
    query row so that partial results can be merged. Shifting by the maximum
    is the standard way to avoid overflow; [1]_ analyses its accuracy.

    References
    ----------
    .. [1] Blanchard, P., D. J. Higham and N. J. Higham, "Accurately computing
       the log-sum-exp and softmax functions", IMA Journal of Numerical
       Analysis, 41(4), 2021.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import logsumexp
    >>> float(logsumexp(np.array([0.0, 0.0])))  # log 2
    0.6931471805599453
    >>> float(logsumexp(np.array([1000.0, 1000.0])))
    1000.6931471805599
    >>> float(logsumexp(np.array([-np.inf, -np.inf])))
    -inf
    """
    xw, shift, axis, out_dtype = _shifted(x, axis)
    keepdims = check_bool(keepdims, "keepdims")
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        total = np.sum(np.exp(xw - shift), axis=axis, keepdims=True)
        out = shift + np.log(total)
    if not keepdims:
        out = np.squeeze(out, axis=axis)
    return out.astype(out_dtype, copy=False)


def log_softmax(x, axis=-1):
    r"""Logarithm of the softmax, computed without taking ``log`` of a ratio.

    Parameters
    ----------
    x : array_like, shape (..., n, ...)
        Real input.
    axis : int, optional
        Axis along which ``exp`` of the result sums to one.

    Returns
    -------
    ndarray, same shape as `x`
        ``x - logsumexp(x, axis, keepdims=True)``. A slice of all ``-inf``
        gives ``-inf`` everywhere (the log of the zeros that `softmax` gives);
        a slice holding ``NaN`` or ``+inf`` gives ``NaN`` everywhere.

    Raises
    ------
    TypeError
        If `x` is boolean, complex or not numeric.
    ValueError
        If `x` is 0-dimensional or `axis` is out of range.

    See Also
    --------
    softmax : ``exp`` of this, up to rounding.
    logsumexp : The normaliser subtracted here.

    Notes
    -----
    .. math::

        \log \operatorname{softmax}(x)_i = x_i - \operatorname{LSE}(x).

    Computing ``np.log(softmax(x))`` instead loses everything below the
    smallest positive float: tiny weights underflow to 0 and their log to
    ``-inf``, whereas the difference above stays exact [1]_.

    References
    ----------
    .. [1] Blanchard, P., D. J. Higham and N. J. Higham, "Accurately computing
       the log-sum-exp and softmax functions", IMA Journal of Numerical
       Analysis, 41(4), 2021.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref import log_softmax
    >>> log_softmax(np.array([0.0, 0.0]))
    array([-0.69314718, -0.69314718])
    >>> log_softmax(np.array([0.0, -1000.0]))  # np.log(softmax(...)) would give -inf
    array([    0., -1000.])
    """
    xw, _, axis, out_dtype = _shifted(x, axis)
    lse = logsumexp(xw, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        # lse = -inf: all -inf slice, log of softmax's zeros. lse = +inf or
        # NaN: +inf or NaN in the slice, NaN throughout as in softmax.
        out = np.where(np.isfinite(lse), xw - lse, np.where(np.isneginf(lse), -np.inf, np.nan))
    with np.errstate(over="ignore"):
        # Computed in float32 for float16 input: a difference beyond float16's range rounds to -inf, as it should.
        return out.astype(out_dtype, copy=False)
