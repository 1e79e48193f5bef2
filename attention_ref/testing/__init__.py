r"""Checking an attention kernel against attention_ref: `assert_attention_close`.

A kernel in float16 or bfloat16 cannot match a float64 reference to a fixed
tolerance that suits every problem: its rounding error grows with the scores,
the sequence length and the values. `assert_attention_close` therefore
measures the kernel against what rounding alone costs, as FlashAttention's
tests do: it computes the float64 reference and the textbook formula
evaluated in the kernel's own dtype (the *baseline*), and asks the kernel to
be at most ``factor`` times as far from the reference as that baseline.

The checkers take a kernel's tensors as they are: PyTorch tensors on any
device and in any float dtype (bfloat16 and fp8 included, requiring grad or
not), JAX and CuPy arrays, and anything with ``__dlpack__`` or
``__array__``, converted exactly by `to_numpy` without importing a framework
the caller has not imported. They describe the attention with the options of
`attention_ref.scaled_dot_product_attention` or as a FlexAttention variant
(``score_mod``, ``mask_mod``, ``block_mask``; mods written for torch work
unchanged), and take ``dtype=`` (the precision of a widened result) and
``empty_rows=`` (the kernel's convention for a row with no allowed key).

- `assert_attention_close`: the output;
- `assert_lse_close`: the log-sum-exp, natural or base 2;
- `assert_attention_grads_close`: the gradients, each by the same rule;
- `assert_paged_attention_close`: a paged-cache kernel, sequence by sequence;
- `to_numpy`: the conversion, for the author's own code;
- `attention_ref.testing.strategies`: hypothesis strategies drawing the
  problems kernels get wrong (``pip install 'attention_ref[strategies]'``).

Notes
-----
A check runs on the package's threads (``ATTENTION_REF_NUM_THREADS`` caps
them). Where the C library is glibc, the first check sets ``malloc``'s trim
and mmap thresholds to glibc's own upper limits (64 and 32 MiB), the values
glibc reaches by itself once a process has freed a 32 MiB block: the next
check then reuses the memory this one freed instead of taking it from the
system again, page by page. ``ATTENTION_REF_KEEP_HEAP=0`` leaves ``malloc``
alone, and so does any ``MALLOC_*`` tuning in the environment.

Examples
--------
>>> import numpy as np
>>> from attention_ref import blockwise_attention
>>> from attention_ref.testing import assert_attention_close
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((3, 2, 16, 8)).astype(np.float16)
>>> assert_attention_close(blockwise_attention(q, k, v, block_size=4), q, k, v)
"""

from ._checks import assert_attention_close, assert_attention_grads_close, assert_lse_close
from ._convert import to_numpy
from ._paged import assert_paged_attention_close

__all__ = [
    "assert_attention_close",
    "assert_attention_grads_close",
    "assert_lse_close",
    "assert_paged_attention_close",
    "to_numpy",
]
