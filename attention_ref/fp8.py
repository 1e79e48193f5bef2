r"""fp8 inputs: float8 arrays with descale factors, as FlashAttention 3 and serving kernels take them.

An fp8 tensor ``x8`` stands for ``x8.astype(float32) * x_descale``: the
descale undoes the scaling that brought the tensor into fp8's narrow range.
The attention functions take ``float8_e4m3fn`` and ``float8_e5m2`` arrays
(the dtypes of the optional ``ml_dtypes`` package) with the shared options
``q_descale``, ``k_descale`` and ``v_descale``, and compute the attention of
the dequantized arrays, formed exactly (in float64), and return bfloat16;
`quantize_fp8` makes such inputs.
"""

from __future__ import annotations

import numpy as np

from ._options import DESCALES
from ._validation import (
    as_real_array,
    bfloat16_dtype,
    check_axis,
    check_bool,
    check_dtype_choice,
    check_finite,
    is_fp8,
    ml_dtypes_dtype,
    result_dtype,
)

__all__ = ["quantize_fp8"]

#: The fp8 formats accepted, with the largest finite value of each.
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def fp8_dtype(name: str) -> np.dtype:
    """ml_dtypes' fp8 dtype called `name` (ImportError if ml_dtypes is missing)."""
    return ml_dtypes_dtype(name)


def _descale(descale, name: str, x: np.ndarray, groups: int) -> np.ndarray:
    """`descale` checked and shaped to broadcast against `x` (..., H, L, E): a scalar, or one per (..., Hkv).

    The documented shape is (B, Hkv); whatever broadcasts to it is taken, and so is the per-head descale
    `quantize_fp8` returns with ``axis`` (`x`'s number of dimensions, the last two of length one: (1, Hkv, 1, 1)).
    """
    arr = as_real_array(descale, name).astype(np.float32)
    check_finite(arr, name)
    if arr.ndim == 0:
        return arr
    if arr.ndim == np.ndim(x) >= 3 and arr.shape[-2:] == (1, 1):
        arr = arr[..., 0, 0]  # (B or 1, Hkv, 1, 1) -> (B or 1, Hkv)
    if groups > 1:  # query head h is in group h // groups, as in FlashAttention 3 and PyTorch
        arr = np.repeat(arr, groups, axis=-1)
    lead = x.shape[:-2]  # (..., H): the batch and head axes
    try:
        fits = arr.ndim <= len(lead) and np.broadcast_shapes(arr.shape, lead) == lead
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{name} must be a scalar or hold one factor per batch entry and key/value head, (B, Hkv), lining up "
            f"with the axes before the last two of the array it dequantizes, {x.shape} (or the per-head "
            f"(1, Hkv, 1, 1) of quantize_fp8(..., per_head=True, axis=-3)); got {np.shape(descale)}"
        )
    return arr[..., None, None]


def dequantize_inputs(q, k, v, options: dict):
    """``(q, k, v, out_dtype)``: the arrays with their descales applied, and the output's dtype if it changes.

    fp8 arrays become float64 and make the output bfloat16; another array
    given a descale is multiplied by it in at least float32, and the output
    keeps the dtype the arrays as given would give it (None: no change). The
    descale options are removed from `options`.
    """
    arrays = {"q": q, "k": k, "v": v}
    out_dtype = None
    for name, arr in arrays.items():
        dtype = getattr(arr, "dtype", None)
        if isinstance(dtype, np.dtype) and is_fp8(dtype):
            # float64: an fp8 value (4 significant bits at most) times a float32 descale is exact there
            arrays[name], out_dtype = np.asarray(arr).astype(np.float64), fp8_output_dtype()
    given = {option: options.pop(option) for option in DESCALES if options.get(option) is not None}
    for option in DESCALES:
        options.pop(option, None)
    if given and out_dtype is None:
        out_dtype = result_dtype(*(as_real_array(arrays[name], name) for name in ("q", "k", "v")))[0]
    if given:
        groups = 1
        if options.get("enable_gqa") is True and np.ndim(arrays["q"]) >= 3 and np.ndim(arrays["k"]) >= 3:
            hq, hk = np.shape(arrays["q"])[-3], np.shape(arrays["k"])[-3]
            groups = hq // hk if hk and hq % hk == 0 else 1
        for option, factor in given.items():
            name = option[0]  # q_descale dequantizes q, ...
            x = as_real_array(arrays[name], name)
            x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
            arrays[name] = x * _descale(factor, option, x, groups if name == "q" else 1)
    return arrays["q"], arrays["k"], arrays["v"], out_dtype


def fp8_output_dtype() -> np.dtype:
    """The output dtype of fp8 input: bfloat16, FlashAttention 3's (``hopper/flash_api.cpp``)."""
    return bfloat16_dtype()


def _amax(arr: np.ndarray, per_head: bool, axis: int | None) -> np.ndarray:
    """The largest ``|x|``: of the whole array (0-d), per ``(B, H)``, or per index of `axis`, the others kept as 1."""
    if not per_head:
        return np.abs(arr).max(initial=0.0)
    if axis is None:
        if arr.ndim != 4:
            raise ValueError(f"x must be 4-D (B, H, L, E) for per_head=True; got shape {arr.shape}")
        return np.abs(arr).max(axis=(-2, -1), initial=0.0)  # (B, H)
    others = tuple(i for i in range(arr.ndim) if i != axis)
    return np.abs(arr).max(axis=others, keepdims=True, initial=0.0)  # (1, ..., H, ..., 1)


def quantize_fp8(x, dtype="float8_e4m3fn", *, per_head=False, axis=None):
    r"""Quantize a float array to fp8 with amax scaling: ``(x8, descale)``.

    The array is divided by ``descale = amax / fp8_max`` (``amax`` the
    largest ``|x|``, ``fp8_max`` the largest finite value of the format)
    and rounded to fp8, so that its largest entry lands on the format's
    largest value; ``x8.astype(np.float32) * descale`` approximates `x`.

    Parameters
    ----------
    x : array_like, shape (B, H, L, E) with `per_head` and no `axis`, else any shape
        The values to quantize.
    dtype : {"float8_e4m3fn", "float8_e5m2"} or dtype, optional
        The fp8 format: its name, or the dtype of that name from ml_dtypes,
        torch (``torch.float8_e4m3fn``) or JAX (``jnp.float8_e5m2``). The
        result is ml_dtypes' dtype of that format whichever was given.
    per_head : bool, optional
        One descale per head instead of one for the whole array. Without
        `axis`, `x` is read as ``(B, H, L, E)`` and gets one descale per
        batch entry and head, shape ``(B, H)`` (FlashAttention 3's descale
        shape).
    axis : int, optional
        With ``per_head=True``: the head axis (negative counts from the
        end). The amax is taken over every other axis, and the descale keeps
        `x`'s number of dimensions, the head axis whole and every other axis
        of length one, so that it broadcasts against `x`: ``(1, Hkv, 1, 1)``
        for a pool in the "HND" layout ``(num_pages, Hkv, page_size, E)``
        with ``axis=1``, ``(1, 1, Hkv, 1)`` for "NHD" ``(num_pages,
        page_size, Hkv, E)`` with ``axis=2``. `paged_attention` takes these
        as ``k_descale`` and ``v_descale``.

        A page pool needs `axis`: without it, ``per_head=True`` reads the
        pool's four axes as ``(B, H, L, E)`` and returns one descale per
        (page, head) for "HND" or per (page, position) for "NHD", neither of
        which is one per head.

    Returns
    -------
    x8 : ndarray of fp8
        The quantized array, of `x`'s shape.
    descale : numpy.float32 or ndarray of float32
        The factor that dequantizes `x8`: pass it as ``q_descale``,
        ``k_descale`` or ``v_descale``. A scalar; with `per_head`, shape
        ``(B, H)``, the descale shape the attention functions document
        (FlashAttention 3's ``(B, Hkv)`` for keys and values); with `axis`,
        `x`'s shape with every axis but `axis` of length one, which they
        accept besides: ``(1, Hkv, 1, 1)`` for ``(B, Hkv, S, E)`` keys
        (``axis=1``) or an "HND" pool, ``(1, 1, Hkv, 1)`` for an "NHD"
        pool (`paged_attention`). 1 where the array (or head) is all zeros.

    Raises
    ------
    TypeError
        If `x` does not hold real numbers, `per_head` is not a bool or
        `axis` not an int.
    ValueError
        If `dtype` is not an fp8 format, `x` is not finite, `axis` is given
        without ``per_head=True`` or is out of range for `x`, or `per_head`
        without `axis` is asked of an array that is not 4-D.
    ImportError
        If ml_dtypes is not installed.

    See Also
    --------
    scaled_dot_product_attention : Takes fp8 arrays with their descales.
    paged_attention : Takes fp8 page pools with their descales.

    Examples
    --------
    The descale is ``amax / fp8_max``; dequantizing gives the values back
    when they are representable in fp8. fp8 needs the optional ml_dtypes
    package, which the lines below import only when it is installed:

    >>> import importlib.util
    >>> import numpy as np
    >>> from attention_ref import quantize_fp8
    >>> x = np.array([0.5, -2.0, 1.0])
    >>> if importlib.util.find_spec("ml_dtypes") is not None:
    ...     x8, descale = quantize_fp8(x)
    ...     assert x8.dtype.name == "float8_e4m3fn"
    ...     assert descale == np.float32(2.0) / 448
    ...     assert (x8.astype(np.float32) * descale == x).all()

    A pool of 5 pages of 4 positions for 2 heads ("HND") quantized per head,
    each head's largest value landing on 448:

    >>> pool = np.ones((5, 2, 4, 8)) * np.array([1.0, 4.0])[:, None, None]
    >>> if importlib.util.find_spec("ml_dtypes") is not None:
    ...     pool8, descale = quantize_fp8(pool, per_head=True, axis=1)
    ...     assert descale.shape == (1, 2, 1, 1)
    ...     assert (descale.ravel() == np.array([1.0, 4.0], dtype=np.float32) / 448).all()
    ...     assert (pool8.astype(np.float32) == 448).all()
    """
    dtype = check_dtype_choice(dtype, "dtype", tuple(FP8_MAX))
    per_head = check_bool(per_head, "per_head")
    arr = as_real_array(x, "x").astype(np.float32)
    if axis is not None:
        if not per_head:
            raise ValueError(
                f"axis names the head axis of per_head=True; got axis={axis!r} with per_head=False "
                f"(pass per_head=True, or leave axis out for one descale of the whole array)"
            )
        axis = check_axis(axis, arr.ndim, "axis")
    check_finite(arr, "x")
    amax = _amax(arr, per_head, axis)
    descale = np.where(amax > 0, amax / np.float32(FP8_MAX[dtype]), np.float32(1.0)).astype(np.float32)
    by_batch_and_head = per_head and axis is None  # (B, H): lined up with the axes before (L, E)
    scaled = arr / (descale[..., None, None] if by_batch_and_head else descale)
    return scaled.astype(fp8_dtype(dtype)), descale if per_head else np.float32(descale)
