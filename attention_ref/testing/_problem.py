"""What a checker was told the kernel computed: its inputs as NumPy arrays, its options and its variant.

A `Problem` holds the kernel's inputs exactly as given (torch, JAX, CuPy arrays converted by `to_numpy`, in
their own dtypes, fp8 included), float64 copies of what they stand for (fp8 dequantized), the options, and
the *variant* those describe (`._variants`: the softmax with the options of
`attention_ref.scaled_dot_product_attention`, the sigmoid, or a FlexAttention description), chosen once.
The variant computes the float64 reference, the naive baseline in a dtype and the scores; the `Problem`
keeps the bookkeeping that does not depend on it, with no branch per variant: what the empty-row
conventions (``empty_rows=``) expect, the memory estimate before a whole-array computation, the largest
score, the grouped heads.

The checkers ask for everything one check needs at once (`Problem.forward`, `Problem.lse_pass`,
`Problem.grads_pass`): by tiles (`._tiles`, one (batch, head) at a time) where the variant has them, else
on whole arrays.
"""
from __future__ import annotations

import numpy as np

from .._interop import to_numpy
from .._validation import as_real_array, is_fp8, result_dtype
from ..fp8 import fp8_output_dtype
from ._heap import keep_freed_memory
from ._tiles import fits
from ._variants import FLEX, choose_variant

__all__: list[str] = []  # private module

#: Options of scaled_dot_product_attention that make no sense for comparing one deterministic output
#: (``dropout_p`` is one unless a ``dropout_mask`` makes the dropout deterministic).
_NOT_OPTIONS = ("return_weights", "dropout_p", "rng")
#: Options that hold arrays: converted to NumPy with the arrays (torch tensors and the like).
_ARRAY_OPTIONS = ("mask", "bias", "sinks", "alibi_slopes", "dropout_mask", "q_descale", "k_descale", "v_descale")
#: What a kernel may return for a row with no allowed key: the package's zeros, the mean of the values
#: (JAX, Hugging Face eager), NaN (PyTorch's math path, nn.MultiheadAttention), or anything (not checked).
EMPTY_ROWS = ("zeros", "mean", "nan", "any")


#: The baselines: the scores and the softmax in float32 and the weights rounded before the product with the
#: values, as tensor-core kernels compute ("fused"), or every step rounded to the kernel's dtype ("textbook").
BASELINES = ("fused", "textbook")


def is_fused(baseline) -> bool:
    """Whether `baseline` names the fused model; a ValueError unless it is "fused" or "textbook"."""
    if not isinstance(baseline, str) or baseline not in BASELINES:
        raise ValueError(f"baseline must be 'fused' or 'textbook'; got {baseline!r}")
    return baseline == "fused"


def check_empty_rows(empty_rows) -> str:
    if not isinstance(empty_rows, str) or empty_rows not in EMPTY_ROWS:
        raise ValueError(f"empty_rows must be one of {', '.join(map(repr, EMPTY_ROWS))}; got {empty_rows!r}")
    return empty_rows


def _check_deterministic(options: dict, function: str) -> None:
    """Raise TypeError if `options` make the call random or ask for more than the output."""
    for name in _NOT_OPTIONS:
        if name in options and not (name == "dropout_p" and options.get("dropout_mask") is not None):
            raise TypeError(
                f"{function} checks one deterministic call; {name} is not an option here"
                + (" without dropout_mask, the kernel's own keep-mask" if name == "dropout_p" else "")
            )


def output_array(actual, name: str = "actual") -> np.ndarray:
    """`actual` as a float16/32/64 or bfloat16 ndarray; integers, booleans and the rest are a TypeError."""
    try:
        original = to_numpy(actual, name).dtype
    except (TypeError, ValueError):
        original = np.dtype(object)  # as_real_array below names the problem
    arr = as_real_array(actual, name)
    if original.kind in "iu":
        raise TypeError(
            f"{name} must be a kernel's floating-point output (float16, float32, float64 or bfloat16); "
            f"got dtype {original}"
        )
    return arr


class Problem:
    """The kernel's inputs and options, checked and converted, and the variant they describe; see the module
    docstring. It keeps the bookkeeping a check needs whatever the variant: the memory estimate before the
    whole-array computation, the largest score, grouped heads and the dtype of the scores."""

    def __init__(self, q, k, v, options: dict, function: str):
        keep_freed_memory()  # the next check reuses this one's memory (`._heap`)
        options = dict(options)
        _check_deterministic(options, function)
        given = {name: options.pop(name) for name in FLEX if name in options}
        for name in _ARRAY_OPTIONS:
            if options.get(name) is not None:
                options[name] = to_numpy(options[name], name)
        self.q, self.k, self.v = (to_numpy(a, name) for a, name in ((q, "q"), (k, "k"), (v, "v")))
        self.options = options
        self._magnitude: float | None = None
        #: What the inputs are attention of: its reference, baseline, scores and empty rows (`._variants`).
        self.variant = choose_variant(given, options, self.q, self.k, self.v, function)
        self.q64, self.k64, self.v64 = self.variant.wide

    @property
    def inputs(self) -> tuple[np.ndarray, ...]:
        return self.q, self.k, self.v

    def kv_groups(self) -> int:
        """Query heads per key/value head under grouped-query attention (``enable_gqa`` with fewer key/value
        heads than query heads), else 1: the report names each query head's key/value head."""
        if not self.variant.enable_gqa or self.q.ndim < 3 or self.k.ndim < 3:
            return 1
        hq, hkv = self.q.shape[-3], self.k.shape[-3]
        return hq // hkv if 0 < hkv < hq else 1

    def input_dtype(self) -> np.dtype:
        """The precision of the scores: the promoted dtype of `q` and `k` (bfloat16 for fp8 inputs)."""
        q, k = (fp8_output_dtype() if is_fp8(a.dtype) else as_real_array(a, n).dtype
                for a, n in ((self.q, "q"), (self.k, "k")))
        return result_dtype(np.zeros(0, q), np.zeros(0, k))[0]

    def remember_magnitude(self, largest: float) -> None:
        """Keep the largest score magnitude a tiled pass found (`score_magnitude` then needs no more work)."""
        self._magnitude = largest

    def _whole(self) -> None:
        """Before the whole-array computation: a ValueError if its (..., L, S) arrays cannot fit in memory."""
        n_units = 1 if self.variant.one_unit_at_a_time else max(int(np.prod(self.q.shape[:-2])),
                                                                int(np.prod(self.k.shape[:-2])))
        fits(self.q.shape[-2], self.k.shape[-2], n_units, 8)

    # --- what a check asks for: by tiles where the variant has them, else on whole arrays ------------

    def output_shape(self, dtype) -> tuple[int, ...] | None:
        """The shape of the attention output, known before any work (None where the variant cannot say)."""
        return self.variant.output_shape(self)

    def forward(self, dtype, fused: bool, *, magnitude: bool = False, progress: bool = False):
        """``(reference, lse, naive)``: the float64 output and log-sum-exp and the baseline's output in `dtype`."""
        tiled = self.variant.forward_tiles(self, dtype, fused, magnitude, progress)
        if tiled is not None:
            return tiled
        self._whole()
        ref, lse = self.variant.reference(self, lse=True)
        return ref, lse, np.broadcast_to(self.variant.naive_output(self, dtype, fused), ref.shape)

    def naive_output_tiles(self, dtype, fused: bool, progress: bool = False) -> np.ndarray:
        """The baseline's output in `dtype`: by tiles where the variant can, else on whole arrays."""
        out = self.variant.naive_output_tiles(self, dtype, fused, progress)
        return self.variant.naive_output(self, dtype, fused) if out is None else out

    def lse_pass(self, dtype, fused: bool, progress: bool = False):
        """``(reference, naive)`` log-sum-exps (..., L): the float64 one and the baseline's in `dtype`."""
        tiled = self.variant.lse_tiles(self, dtype, fused, progress)
        if tiled is not None:
            return tiled
        self._whole()
        return self.variant.reference_lse(self), self.variant.naive_lse(self, dtype, fused)

    def grads_prepare(self, dout):
        """Check the options and `dout` as the variant's backward does (its errors), before any work."""
        self.variant.check_dout(self, dout)

    def grads_pass(self, dout, dtypes, fused: bool, *, dbias: bool, magnitude: bool = False,
                   progress: bool = False):
        """``(reference, lse, naive)``: the float64 gradients, log-sum-exp, and a dict of the baseline's
        gradients for each dtype of `dtypes` (each computed once, with one forward)."""
        tiled = self.variant.grads_tiles(self, dout, dtypes, fused, dbias, magnitude, progress)
        if tiled is not None:
            return tiled
        self._whole()
        dout64 = as_real_array(dout, "dout").astype(np.float64)
        ref = self.variant.reference_grads(self, dout64)
        return ref, self.variant.reference_lse(self), {d: self.variant.naive_grads(self, dout, d, fused)
                                                       for d in dtypes}

    def score_magnitude(self) -> float:
        """The largest magnitude of the scores the normalization sees (finite ones), at least 1.

        A float32 or float64 kernel's error grows with it (a score ``x`` is rounded to ``eps * |x|``, and its
        weight with it), as the baseline's does by chance: the default `atol` of those dtypes scales with it.
        """
        if self._magnitude is None:  # computed once: each gradient's check asks for it
            self._magnitude = max(1.0, self.variant.largest_score(self))
        return self._magnitude

    def values_mean(self) -> np.ndarray:
        """Each query head's mean of its values over all keys, (..., 1, Ev): what "mean" expects on an empty row."""
        return self.variant.values_mean(self)


def empty_expected(reference: np.ndarray, baseline: np.ndarray, empty: np.ndarray, empty_rows: str, mean=None):
    """``(reference, baseline, skip)`` with the rows `empty` (..., L) set as `empty_rows` says.

    "zeros" changes nothing (the package's convention); "mean" puts `mean` (..., 1, Ev) there, in the
    baseline rounded to its dtype; "nan" puts NaN there; "any" returns them in `skip`.
    """
    if empty_rows == "zeros" or not empty.any():
        return reference, baseline, None
    rows = np.broadcast_to(empty[..., None], reference.shape)
    if empty_rows == "any":
        return reference, baseline, rows
    if empty_rows == "nan":
        fill = np.full(reference.shape, np.nan)
        rounded = fill
    else:
        fill = np.broadcast_to(mean, reference.shape)
        rounded = fill.astype(baseline.dtype).astype(np.float64)
    return np.where(rows, fill, reference), np.where(rows, rounded, baseline.astype(np.float64)), None
