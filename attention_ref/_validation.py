"""Argument checking shared by every public function.

All error messages are built here so that they read the same everywhere:
they name the argument, say what it got and what was expected.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from collections.abc import Iterable, Sequence

import numpy as np

from ._interop import DeviceCopyError, to_numpy

__all__: list[str] = []  # private module

_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: Names of ml_dtypes' float types narrower than 16 bits (float8_e4m3fn, float8_e5m2, float6_*, float4_*).
_NARROW_FLOAT_PREFIXES = ("float8_", "float6_", "float4_")
#: NumPy's own float scalar types. A dtype of one of them is named "float<bits>", never "bfloat16" nor a narrow
#: float, so the checks below need not read ``dtype.name`` for it. They avoid it on purpose: NumPy builds that
#: name anew on every access, through a method lookup by a freshly made string that CPython 3.11's type cache keeps
#: alive or frees depending on the string's address, so every read moved traced memory by 0 or 58 bytes depending
#: on the process's memory layout (chapter 9 measures traced peaks; docs/chapters/09_memory_wall.md).
_NUMPY_FLOAT_TYPES = (np.float16, np.float32, np.float64, np.longdouble)


#: Scalar types of the NumPy floats accepted as they are.
_CHECKED_FLOAT_TYPES = frozenset(dt.type for dt in _FLOAT_DTYPES)


def _extension_name(dtype: np.dtype) -> str:
    """``dtype.name``, read only for a dtype that is not one of NumPy's own floats ("" for those: see above)."""
    return "" if dtype.type in _NUMPY_FLOAT_TYPES else dtype.name


def is_bfloat16(dtype) -> bool:
    """Whether `dtype` is bfloat16 (ml_dtypes', the NumPy dtype JAX uses), told without importing ml_dtypes."""
    return isinstance(dtype, np.dtype) and _extension_name(dtype) == "bfloat16" and dtype.itemsize == 2


def ml_dtypes_dtype(type_name: str) -> np.dtype:
    """Return ml_dtypes' dtype called `type_name` (bfloat16, float8_e4m3fn, ...), importing ml_dtypes only now.

    ImportError saying how to install ml_dtypes if it is missing; AttributeError if it has no such type.
    """
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            f"{type_name} needs the optional ml_dtypes package (the NumPy dtypes JAX uses): pip install ml_dtypes"
        ) from None
    return np.dtype(getattr(ml_dtypes, type_name))


def bfloat16_dtype() -> np.dtype:
    """Return ml_dtypes' bfloat16, importing ml_dtypes only now; ImportError saying how to install it if missing."""
    return ml_dtypes_dtype("bfloat16")


def is_fp8(dtype) -> bool:
    """Whether `dtype` is one of the fp8 formats the attention functions take (float8_e4m3fn, float8_e5m2)."""
    return isinstance(dtype, np.dtype) and _extension_name(dtype) in ("float8_e4m3fn", "float8_e5m2")


def _reject_narrow_float(dtype: np.dtype, name: str) -> None:
    """Raise TypeError for 8-bit and narrower ml_dtypes floats: storage formats, upcast exactly first."""
    if _extension_name(dtype).startswith(_NARROW_FLOAT_PREFIXES):
        raise TypeError(
            f"{name} has dtype {dtype}, a storage format attention_ref does not compute in; "
            f"convert it first (exactly) with .astype(numpy.float32) or to bfloat16"
        )


def as_real_array(x, name: str, *, fp8: bool = False) -> np.ndarray:
    """Return `x` as a real floating ndarray, rejecting bool, complex and object.

    Integer input becomes float64; float16/32/64 and bfloat16 keep their
    dtype; float8 (kept as it is with ``fp8=True`` for float8_e4m3fn and
    float8_e5m2) and other floating types (e.g. longdouble) are rejected so
    results stay comparable.
    """
    if isinstance(x, np.ndarray):
        if x.dtype.type in _CHECKED_FLOAT_TYPES:
            return x  # the common case, decided without the checks below (a tiny call's time counts)
        arr = x
    else:
        try:
            arr = to_numpy(x, name)
        except DeviceCopyError:
            raise
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be array-like of real numbers; got {type(x).__name__}: {exc}") from None
    if is_bfloat16(arr.dtype) or (fp8 and is_fp8(arr.dtype)):
        return arr
    _reject_narrow_float(arr.dtype, name)
    kind = arr.dtype.kind
    if kind == "b":
        raise TypeError(f"{name} must hold real numbers, not booleans; got dtype {arr.dtype}")
    if kind == "c":
        raise TypeError(f"{name} must be real; got complex dtype {arr.dtype}")
    if kind in "iu":
        return arr.astype(np.float64)
    if kind == "f":
        if arr.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, float32, float64 or bfloat16; got dtype {arr.dtype}")
        return arr
    raise TypeError(f"{name} must hold real numbers; got dtype {arr.dtype}")


def as_bool_mask(mask, name: str = "mask") -> np.ndarray:
    """Return `mask` as a boolean ndarray; any other dtype is a TypeError."""
    try:
        arr = to_numpy(mask, name)
    except DeviceCopyError:
        raise
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name} must be a boolean array (True = may attend); got {type(mask).__name__}: {exc}"
        ) from None
    if arr.dtype != np.bool_:
        raise TypeError(
            f"{name} must be a boolean array (True = may attend); got dtype {arr.dtype}. "
            "Pass additive float terms as `bias` instead, or convert with mask_to_bias."
        )
    return arr


def _torch_dtype_name(dtype) -> str | None:
    """The name of a torch dtype without its "torch." ("bfloat16" for ``torch.bfloat16``); None for anything else.

    Told from the object's type, so torch is never imported: a torch dtype exists only once the caller has.
    """
    kind = type(dtype)
    if kind.__name__ == "dtype" and kind.__module__.split(".", 1)[0] == "torch":
        return str(dtype).removeprefix("torch.")
    return None


def is_dtype_like(value) -> bool:
    """Whether `value` is one dtype (a name, NumPy dtype, scalar type or torch dtype), not a sequence of them."""
    return isinstance(value, (str, np.dtype, type)) or _torch_dtype_name(value) is not None


def as_dtype(dtype, name: str = "dtype") -> np.dtype:
    """Return `dtype` as a NumPy dtype, whichever library spelled it.

    Accepted: a NumPy dtype, scalar type or name (``None`` is float64, as for NumPy), an ml_dtypes type or its
    name ("bfloat16", "float8_e4m3fn", ...), a JAX dtype (``jnp.bfloat16``: its ``dtype`` is NumPy's) and a
    torch dtype (``torch.bfloat16``, ``torch.float8_e4m3fnuz``, ...: the NumPy or ml_dtypes dtype of the same
    format). No framework is imported; ml_dtypes only for its own names (ImportError if it is missing). Anything
    else is a TypeError naming `name`.
    """
    torch_name = _torch_dtype_name(dtype)
    spelled = dtype if torch_name is None else torch_name
    if isinstance(spelled, str) and (spelled == "bfloat16" or spelled.startswith(_NARROW_FLOAT_PREFIXES)):
        try:
            return ml_dtypes_dtype(spelled)
        except AttributeError:
            pass  # no such ml_dtypes type: rejected below
    else:
        try:
            return np.dtype(spelled)
        except (TypeError, ValueError):
            pass
    raise TypeError(
        f"{name} must be a dtype: a NumPy, ml_dtypes, JAX or torch dtype, or its name; got {dtype!r}"
    )


def float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """Return `dtype` as float16, float32, float64 or bfloat16; anything else is a TypeError.

    `dtype` is read by `as_dtype`: NumPy, ml_dtypes, JAX and torch dtypes and names. ``"bfloat16"`` and
    ``torch.bfloat16`` import ml_dtypes (ImportError if it is missing).
    """
    try:
        dt = as_dtype(dtype, name)
    except TypeError:
        dt = np.dtype(object)  # not understood: rejected below
    if is_bfloat16(dt):
        return dt
    if dt not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, float32, float64 or bfloat16; got {dtype!r}")
    return dt


def result_dtype(*arrays: np.ndarray) -> tuple[np.dtype, np.dtype]:
    """Return ``(out_dtype, work_dtype)`` for float arrays.

    ``out_dtype`` follows NumPy promotion; ``work_dtype`` is at least float32
    so that float16 and bfloat16 input accumulates in float32. bfloat16
    promotes as in JAX: with itself to bfloat16, with float16 to float32,
    with a wider float to that float.
    """
    first = getattr(arrays[0], "dtype", None)
    if first is not None and first.type in _CHECKED_FLOAT_TYPES and all(
        getattr(a, "dtype", None) == first for a in arrays
    ):
        return first, np.dtype(np.float32) if first.itemsize < 4 else first  # one NumPy float: no promotion
    dtypes = [np.dtype(getattr(a, "dtype", a)) for a in arrays]
    wide = [d for d in dtypes if not is_bfloat16(d)]
    if len(wide) == len(dtypes):
        out = np.result_type(*arrays)
    elif not wide:
        return dtypes[0], np.dtype(np.float32)
    else:
        out = np.result_type(np.float32, *wide)
    work = np.result_type(out, np.float32)
    return np.dtype(out), np.dtype(work)


def check_ndim(arr: np.ndarray, name: str, min_ndim: int, layout: str) -> None:
    """Raise ValueError if `arr` has fewer than `min_ndim` axes."""
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions {layout}; got shape {arr.shape}")


def check_axis(axis, ndim: int, name: str = "axis") -> int:
    """Return `axis` normalised to ``0 <= axis < ndim``."""
    axis = check_int(axis, name)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for an array with {ndim} dimensions")
    return axis % ndim


def check_int(value, name: str, *, minimum: int | None = None) -> int:
    """Return `value` as a Python int, rejecting floats and bools."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {value!r} of type {type(value).__name__}")
    value = operator.index(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return value


def check_real(value, name: str, *, minimum: float | None = None, below: float | None = None) -> float:
    """Return `value` as a finite float, optionally within ``[minimum, below)``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {value!r} of type {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    if below is not None and value >= below:
        raise ValueError(f"{name} must be < {below}; got {value}")
    return value


def check_positive_real(value, name: str) -> float:
    """Return `value` as a finite float > 0."""
    value = check_real(value, name)
    if not value > 0:
        raise ValueError(f"{name} must be > 0; got {value}")
    return value


def check_window(window, name: str = "window") -> tuple[int | None, int | None]:
    """Return `window` as ``(left, right)``, each an int >= 0 or None (unbounded)."""
    if not isinstance(window, (tuple, list)):
        raise TypeError(
            f"{name} must be a pair (left, right), each an int >= 0 or None for unbounded; "
            f"got {window!r} of type {type(window).__name__}"
        )
    if len(window) != 2:
        raise ValueError(f"{name} must be a pair (left, right); got a sequence of length {len(window)}")
    left, right = (
        None if side is None else check_int(side, f"{name}[{i}] ({which})", minimum=0)
        for i, (side, which) in enumerate(zip(window, ("left", "right"), strict=True))
    )
    return left, right


@functools.cache
def _largest(dtype: np.dtype) -> float:
    """``finfo(dtype).max`` as a float, looked up once per dtype (a scale check is part of every call's time)."""
    return float(np.finfo(dtype).max)


def check_fits_dtype(value, name: str, dtype) -> None:
    """Raise ValueError if the finite `value` (a number or array) has a magnitude beyond `dtype`'s largest float."""
    largest = _largest(np.dtype(dtype))
    biggest = abs(value) if isinstance(value, float) else float(np.max(np.abs(value), initial=0.0))
    if biggest > largest:
        raise ValueError(
            f"{name} overflows the working dtype {np.dtype(dtype)}: got a magnitude of {biggest:g}, "
            f"above its largest finite value {largest:g}"
        )


def as_per_head(values, name: str, batch_shape: tuple[int, ...], dtype) -> np.ndarray:
    """Return finite per-head `values` in `dtype`, checked to broadcast to `batch_shape` (the scores' ``(..., H)``).

    A 1-D array holds one value per head: it lines up with the last batch axis, the head axis.
    """
    arr = as_real_array(values, name)
    check_finite(arr, name)
    try:
        fits = np.broadcast_shapes(arr.shape, batch_shape) == tuple(batch_shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{name} must broadcast to the batch and head axes of the scores, {tuple(batch_shape)} "
            f"(a 1-D array holds one value per head); got shape {arr.shape}"
        )
    check_fits_dtype(arr, name, dtype)
    return arr.astype(dtype, copy=False)


def check_choice(value, name: str, choices: Sequence[str]) -> str:
    """Raise ValueError unless `value` is one of `choices`."""
    if not isinstance(value, str) or value not in choices:
        expected = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {expected}; got {value!r}")
    return value


def check_supported(value, name: str, supported: Sequence[str], function: str, elsewhere: str = "") -> str:
    """`value` if `function` supports it (one of `supported`), else a ValueError naming `name`, `value`, what
    `function` supports and, `elsewhere`, where the value is taken instead."""
    if not isinstance(value, str) or value not in supported:
        expected = " or ".join(f"{name}={c!r}" for c in supported)
        raise ValueError(f"{function} supports {expected} only; got {name}={value!r}"
                         + (f" ({elsewhere})" if elsewhere else ""))
    return value


def check_dtype_choice(dtype, name: str, choices: Sequence[str]) -> str:
    """The name of `dtype` (any spelling `as_dtype` reads) if it is one of `choices`, else a ValueError."""
    try:
        chosen = as_dtype(dtype, name)
    except TypeError:
        chosen = None
    if chosen is None or _extension_name(chosen) not in choices:
        expected = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {expected} (names or NumPy, ml_dtypes, JAX or torch dtypes); "
                         f"got {dtype!r}")
    return _extension_name(chosen)


def check_generator(rng, name: str = "rng") -> np.random.Generator:
    """Raise TypeError unless `rng` is a ``numpy.random.Generator``."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (e.g. numpy.random.default_rng(0)); got {type(rng).__name__}"
        )
    return rng


def broadcast_shapes(what: str, named_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """Broadcast shapes, raising a ValueError that names every argument."""
    named_shapes = list(named_shapes)
    try:
        return np.broadcast_shapes(*(shape for _, shape in named_shapes))
    except ValueError:
        listing = ", ".join(f"{name} {shape}" for name, shape in named_shapes)
        raise ValueError(f"{what} do not broadcast: got {listing}") from None


def check_last_dim(arr: np.ndarray, name: str, size: int, other: str) -> None:
    """Raise ValueError unless ``arr.shape[-1] == size``."""
    if arr.shape[-1] != size:
        raise ValueError(f"{name} must have last dimension {size} to match {other}; got shape {arr.shape}")


def check_shape(arr: np.ndarray, name: str, shape: tuple[int, ...], what: str = "") -> None:
    """Raise ValueError unless `arr` has exactly `shape`; `what` says where that shape comes from."""
    if arr.shape != tuple(shape):
        because = f" ({what})" if what else ""
        raise ValueError(f"{name} must have shape {tuple(shape)}{because}; got {arr.shape}")


def check_exact_ndim(arr: np.ndarray, name: str, ndim: int, layout: str) -> None:
    """Raise ValueError unless `arr` has exactly `ndim` axes."""
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have exactly {ndim} dimensions {layout}; got shape {arr.shape}")


def check_bool(value, name: str) -> bool:
    """Return `value` as a Python bool; anything but True/False (or numpy.bool_) is a TypeError."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r} of type {type(value).__name__}")
    return bool(value)


def check_finite(arr: np.ndarray, name: str) -> None:
    """Raise ValueError if `arr` holds NaN or an infinity."""
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)]
        raise ValueError(f"{name} must be finite; got {bad.size} non-finite value(s), e.g. {bad.flat[0]}")


def as_int_array(x, name: str, ndim: int, layout: str) -> np.ndarray:
    """Return `x` as an int64 array of exactly `ndim` axes; floats, booleans and the rest are a TypeError.

    An empty list (which NumPy makes float64) counts as integers, so that its shape is what gets checked.
    """
    try:
        arr = to_numpy(x, name)
    except DeviceCopyError:
        raise
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of integers {layout}; got {type(x).__name__}: {exc}") from None
    if arr.size == 0 and arr.dtype == np.float64:
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers {layout}; got dtype {arr.dtype}")
    check_exact_ndim(arr, name, ndim, layout)
    return arr.astype(np.int64, copy=False)
