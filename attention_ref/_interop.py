"""Arrays from other frameworks as NumPy arrays: exact, in their own dtype, importing nothing new.

`to_numpy` is the one door every array argument of the package comes through
when it is not already an ``ndarray``: PyTorch tensors (any device, requiring
grad or not, bfloat16 and the fp8 formats included), JAX and CuPy arrays,
anything with ``__dlpack__`` or ``__array__``, and array_likes. A framework is
only ever looked up in ``sys.modules``: an object can only be one of its
arrays if the caller imported it already.
"""

from __future__ import annotations

import sys

import numpy as np

__all__: list[str] = []  # private module; attention_ref.testing.to_numpy is the public name

#: torch dtypes that NumPy cannot hold natively, by name: the ml_dtypes type of the same bits, and the
#: torch integer dtype of that width through which the bits travel unchanged.
_TORCH_BITS = {
    "bfloat16": ("bfloat16", "int16"),
    "float8_e4m3fn": ("float8_e4m3fn", "uint8"),
    "float8_e5m2": ("float8_e5m2", "uint8"),
    "float8_e4m3fnuz": ("float8_e4m3fnuz", "uint8"),
    "float8_e5m2fnuz": ("float8_e5m2fnuz", "uint8"),
    "float8_e8m0fnu": ("float8_e8m0fnu", "uint8"),
}


class DeviceCopyError(ValueError):
    """A tensor on a device whose memory cannot be read from the host (raised as it is, never re-worded)."""


def _module_of(x) -> str:
    return type(x).__module__.split(".", 1)[0]


def is_torch_tensor(x) -> bool:
    """Whether `x` is a ``torch.Tensor``, told without importing torch (only if the caller has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _ml_dtype(name: str, argument: str) -> np.dtype:
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(
            f"{argument} has dtype {name}, which NumPy holds only with the optional ml_dtypes package: "
            f"pip install ml_dtypes"
        ) from None
    return np.dtype(getattr(ml_dtypes, name))


def _torch_to_numpy(t, name: str) -> np.ndarray:
    """A torch tensor as an ndarray of the same values and dtype (a copy to the host where needed)."""
    t = t.detach()
    if t.device.type != "cpu":
        try:
            t = t.to("cpu")
        except Exception as exc:  # a meta tensor, a lost device: nothing to copy
            raise DeviceCopyError(
                f"{name} is a torch tensor on device {t.device!s} that cannot be copied to the host "
                f"({type(exc).__name__}: {exc}); pass it on the CPU or a device that can copy it"
            ) from None
    if t.layout != sys.modules["torch"].strided:
        t = t.to_dense()
    t = t.resolve_conj().resolve_neg()
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype in _TORCH_BITS:
        ml_name, bits = _TORCH_BITS[dtype]
        target = _ml_dtype(ml_name, name)
        return t.contiguous().view(getattr(sys.modules["torch"], bits)).numpy().view(target)
    try:
        return t.numpy()
    except TypeError as exc:
        raise TypeError(f"{name} is a torch tensor of dtype {t.dtype}, which NumPy cannot hold ({exc})") from None


def numpy_to_torch(torch, arr: np.ndarray, device):
    """The ndarray `arr` as a torch tensor of the same values and dtype on `device` (the caller passes `torch`).

    bfloat16 and the fp8 formats (ml_dtypes dtypes) travel as the torch integer of their width and are viewed
    as torch's dtype of that name: exact, whatever the dtype. The tensor shares `arr`'s memory on the CPU, unless
    `arr` is read-only (then it holds a copy: torch warns on a read-only array).
    """
    if not arr.flags.writeable:
        arr = arr.copy()
    name = arr.dtype.name
    if name in _TORCH_BITS:
        bits = np.ascontiguousarray(arr).view(_TORCH_BITS[name][1])
        tensor = torch.from_numpy(bits).view(getattr(torch, name))
    else:
        tensor = torch.from_numpy(arr)
    return tensor.to(device)


def to_numpy(x, name: str = "x") -> np.ndarray:
    """`x` as an ndarray with the same values and dtype; an ndarray is returned as it is.

    See `attention_ref.testing.to_numpy` for the public description.
    """
    if isinstance(x, np.ndarray):
        return x
    if is_torch_tensor(x):
        return _torch_to_numpy(x, name)
    module = _module_of(x)
    if module == "cupy" and hasattr(x, "get"):
        return np.asarray(x.get())
    if hasattr(x, "__array__") or not hasattr(x, "__dlpack__"):
        try:
            return np.asarray(x)
        except (TypeError, ValueError, RuntimeError) as exc:
            if not hasattr(x, "__dlpack__"):
                raise TypeError(
                    f"{name} must be an array: a NumPy array_like, a torch, JAX or CuPy array, or an object with "
                    f"__array__ or __dlpack__; got {type(x).__name__} ({type(exc).__name__}: {exc})"
                ) from None
    try:
        return np.from_dlpack(x, device="cpu", copy=True)
    except TypeError:
        try:
            return np.from_dlpack(x)
        except Exception as exc:
            raise TypeError(f"{name} could not be read through __dlpack__ ({type(exc).__name__}: {exc})") from None
    except Exception as exc:
        raise TypeError(f"{name} could not be read through __dlpack__ ({type(exc).__name__}: {exc})") from None
