"""`to_numpy`: the conversion every checker applies to its array arguments, for users' own code."""

from __future__ import annotations

import numpy as np

from .._interop import to_numpy as _to_numpy

__all__ = ["to_numpy"]


def to_numpy(x) -> np.ndarray:
    """Return a framework's array as a NumPy array with the same values and dtype.

    The conversion every function of `attention_ref.testing` applies to its
    array arguments: exact, keeping the dtype, and importing no framework
    the caller has not imported already.

    Parameters
    ----------
    x : array_like
        A NumPy array (returned as it is), a torch tensor (on any device,
        requiring grad or not, in any dtype: bfloat16 and every fp8 format,
        float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz and
        float8_e8m0fnu, become the ml_dtypes dtypes of the same bits), a
        JAX or CuPy array, any object with ``__array__`` or
        ``__dlpack__``, or a nested sequence of numbers.

    Returns
    -------
    ndarray
        The same values in the same dtype, on the host. A torch tensor is
        detached and copied from its device; a tensor on the CPU shares its
        memory with the result, as ``Tensor.numpy`` does.

    Raises
    ------
    TypeError
        If `x` cannot be read as an array, or holds a dtype NumPy cannot
        represent (bfloat16 or fp8 without the ml_dtypes package).
    ValueError
        If `x` is a tensor on a device that cannot be copied to the host
        (a ``meta`` tensor, say).

    See Also
    --------
    assert_attention_close : Takes such arrays as they are.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref.testing import to_numpy
    >>> to_numpy([[1.5, 2.0]])
    array([[1.5, 2. ]])
    >>> x = np.arange(3, dtype=np.float16)
    >>> to_numpy(x) is x
    True

    With PyTorch installed, a bfloat16 tensor that requires grad keeps its
    dtype (``torch`` is imported by the caller, never by the package)::

        >>> import torch                                      # doctest: +SKIP
        >>> to_numpy(torch.ones(2, dtype=torch.bfloat16, requires_grad=True))  # doctest: +SKIP
        array([1, 1], dtype=bfloat16)
    """
    return _to_numpy(x, "x")
