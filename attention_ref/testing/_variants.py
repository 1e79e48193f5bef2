"""The kinds of attention the checkers judge, each one object chosen once per check.

A check compares a kernel with a float64 reference and with a naive baseline in the kernel's dtype (the rule
of `._rule`). What those two are depends on the kind of attention, the *variant*; everything else (turning
the inputs into NumPy arrays, the layout, the empty-row conventions, the memory estimate, the report) does
not, and lives in `._problem.Problem` and `._checks`. A `Variant` knows, for the inputs a `Problem` holds:

- its float64 reference: the output, the log-sum-exp where it has one (`Variant.has_lse`), the gradients;
- its naive baseline in a dtype, fused or textbook (`._baseline`);
- the largest score its normalization sees (a float32 kernel's error, and the default ``atol``, scale with it);
- its rows with no allowed key: the reference's log-sum-exp is ``-inf`` there (for a variant with none of
  its own, the softmax's of the same scores), its output is ``empty_row`` (0), and `Variant.values_mean`
  is what the ``empty_rows="mean"`` convention expects;
- optionally, the same computed one (batch, head) at a time by `._tiles`, in memory that does not grow with
  the batch (the ``*_tiles`` methods; the base class returns None: whole arrays).

The variants:

- `Softmax`: the options of `attention_ref.scaled_dot_product_attention` (masks, causality, windows, bias,
  ALiBi, soft cap, sinks, dropout's given keep-mask, grouped heads, fp8 inputs with their descales), by tiles;
- `Elementwise`: the same options with an elementwise normalization, ``normalization="sigmoid"``
  (`attention_ref.sigmoid`) or any other registered in `attention_ref._normalization`, on whole arrays;
- `Flex`: a FlexAttention description (``score_mod``, ``mask_mod``, ``block_mask``) with ``scale`` and
  ``enable_gqa``, as `attention_ref.flex_attention` takes it.

`choose_variant` picks one from the checker's keywords.

How to add a variant
--------------------
An elementwise normalization (one weight from one score, as the sigmoid):

1. ``attention_ref/<name>.py``: the class with the hooks `attention_ref._normalization` names
   (``from_options``, ``weights``, ``score_grad``, its ``OPTIONS``) and a public function of the weights;
2. ``attention_ref/_normalization.py``: its line in ``NORMALIZATIONS``;
   ``attention_ref/_options.py``: its options' defaults in ``OPTIONS`` and their names in ``NORMALIZATION``;
3. the ``normalization`` choices in the docstrings of `attention_ref.scaled_dot_product_attention` and
   `attention_ref.attention_backward`; ``tests/test_<name>.py``; its section of the book.

The dense forward and backward, decoding, multi-head attention, the checkers (this module's `Elementwise`,
`._baseline`) and the strategies' ``normalizations=`` read it from the registration; nothing else changes.

Any other kind (as the Flex mods are):

1. ``attention_ref/<name>.py``: its forward and backward in float64;
2. here (or ``testing/_<name>.py``): one class deriving `Variant` with its reference, baseline (a class of
   `._baseline`'s rounding, as `._baseline.NaiveFlex`), ``largest_score`` and ``values_mean``, and its test in
   `choose_variant` on the keywords that describe it;
3. ``tests/test_<name>.py`` and its section of the book. `Problem` and the checkers need no change.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from .._attention_problem import prepare_attention, problem_scores
from .._interop import to_numpy
from .._normalization import NORMALIZATIONS, needs_softmax
from .._options import DROPOUT, NORMALIZATION, OPTIONS
from .._validation import as_real_array, is_fp8
from ..attention import scaled_dot_product_attention
from ..backward import AttentionGrads, attention_backward, checked_array, finish_grads, tile_scores
from ..flex import (
    autograd_derivative,
    block_mask_to_dense,
    choose_score_mod_derivative,
    flex_attention,
    flex_attention_backward,
)
from ..fp8 import dequantize_inputs
from ._baseline import (
    NaiveFlex,
    naive_attention,
    naive_backward,
    naive_backward_of,
    naive_forward_arrays,
    naive_problem,
)
from ._tiles import NotTiled, add_bias_grad, at, naive_forward, reference, run, shared_extra, unit_problem, units

__all__: list[str] = []  # private module

#: The FlexAttention description a checker may take instead of (most of) the options.
FLEX = ("score_mod", "mask_mod", "block_mask", "score_mod_grad")
#: The options that go with a FlexAttention description, as `attention_ref.flex_attention` takes them.
FLEX_OPTIONS = ("scale", "enable_gqa")


def without(options: dict, names) -> dict:
    """`options` without the keys `names`."""
    return {name: value for name, value in options.items() if name not in names}


def dequantized(q, k, v, options: dict):
    """``(q, k, v, options, fp8)``: float64 copies of what the kernel's inputs stand for, and the rest.

    fp8 arrays are dequantized by their descales (exactly, in float64) and the descales leave the options;
    ``fp8`` is the fp8 dtype of the input (None when no array is fp8).
    """
    options = dict(options)
    fp8 = next((a.dtype for a in (q, k, v) if is_fp8(getattr(a, "dtype", None))), None)
    arrays = [to_numpy(a, name).astype(np.float64) if is_fp8(getattr(a, "dtype", None))
              else as_real_array(a, name).astype(np.float64) for a, name in ((q, "q"), (k, "k"), (v, "v"))]
    q64, k64, v64, _ = dequantize_inputs(arrays[0], arrays[1], arrays[2], options)
    return q64, k64, v64, options, fp8


class Variant:
    """One kind of attention as a check needs it; see the module docstring.

    The methods take the `Problem` ``x``: the inputs as the kernel got them (``x.q``, ``x.k``, ``x.v``),
    their float64 values (``x.q64``, ``x.k64``, ``x.v64``, set from ``wide``) and the bookkeeping. The
    ``*_tiles`` methods return None here: the variant is computed on whole arrays.
    """

    #: Whether the variant has a log-sum-exp, which `assert_lse_close` checks.
    has_lse = True
    #: The output of a row with no allowed key (the package's convention, ``empty_rows="zeros"``).
    empty_row = 0.0
    #: Whether key/value heads are shared by groups of query heads (grouped-query attention).
    enable_gqa = False
    #: Whether the whole-array computation holds one (batch, head) unit's (L, S) arrays at a time (else all).
    one_unit_at_a_time = False
    #: The float64 values the inputs stand for, ``(q64, k64, v64)``.
    wide: tuple[np.ndarray, np.ndarray, np.ndarray]

    def require_lse(self, function: str) -> None:
        """Nothing for a variant with a log-sum-exp; a ValueError naming the option that has none."""

    # --- the float64 reference ----------------------------------------------------------------------

    def reference(self, x, lse: bool = False):
        """The float64 output (..., L, Ev), and with `lse` the log-sum-exp (..., L) too."""
        raise NotImplementedError

    def reference_lse(self, x) -> np.ndarray:
        """The float64 log-sum-exp (..., L); ``-inf`` marks a row with no allowed key."""
        return self.reference(x, lse=True)[1]

    def reference_grads(self, x, dout64: np.ndarray) -> AttentionGrads:
        raise NotImplementedError

    # --- the naive baseline in a dtype --------------------------------------------------------------

    def naive_output(self, x, dtype: np.dtype, fused: bool) -> np.ndarray:
        raise NotImplementedError

    def naive_lse(self, x, dtype: np.dtype, fused: bool) -> np.ndarray:
        raise NotImplementedError

    def naive_grads(self, x, dout, dtype: np.dtype, fused: bool) -> AttentionGrads:
        raise NotImplementedError

    # --- the scores and the empty rows --------------------------------------------------------------

    def largest_score(self, x) -> float:
        """The largest magnitude of the float64 scores the normalization sees (finite ones; 0 when none)."""
        raise NotImplementedError

    def values_mean(self, x) -> np.ndarray:
        """Each query head's mean of its values over all keys, (..., 1, Ev): what "mean" expects on an empty row."""
        raise NotImplementedError

    # --- by tiles (None: on whole arrays) -----------------------------------------------------------

    def output_shape(self, x) -> tuple[int, ...] | None:
        """The shape of the attention output, known before any work (None where it is not)."""
        return None

    def check_dout(self, x, dout) -> None:
        """Check `dout` before any work, where the variant can (its errors)."""

    def forward_tiles(self, x, dtype, fused: bool, magnitude: bool, progress: bool):
        """``(reference, lse, naive)`` by tiles, or None."""
        return None

    def naive_output_tiles(self, x, dtype, fused: bool, progress: bool):
        """The baseline's output by tiles, or None."""
        return None

    def lse_tiles(self, x, dtype, fused: bool, progress: bool):
        """``(reference, naive)`` log-sum-exps by tiles, or None."""
        return None

    def grads_tiles(self, x, dout, dtypes, fused: bool, dbias: bool, magnitude: bool, progress: bool):
        """``(reference, lse, naive)`` gradients by tiles, or None."""
        return None


class Softmax(Variant):
    """The softmax with the options of `attention_ref.scaled_dot_product_attention`, fp8 inputs included.

    The reference is the package's own (`scaled_dot_product_attention`, `attention_backward`), the
    baseline `._baseline`'s naive attention; both run by tiles (`._tiles`) unless the kernel is float64
    (its baseline's error is the reference's last bits) or the input is not finite.
    """

    #: Whether the tiles compute this variant (their reference is the online softmax).
    tiled = True

    def __init__(self, q, k, v, options: dict):
        self.options = options
        q64, k64, v64, self.plain, self.fp8 = dequantized(q, k, v, options)
        self.wide = (q64, k64, v64)
        self.enable_gqa = bool(options.get("enable_gqa", False))
        self._prepared_cache: dict = {}

    def reference(self, x, lse: bool = False):
        return scaled_dot_product_attention(x.q64, x.k64, x.v64, return_lse=lse, **self.plain)

    def reference_lse(self, x) -> np.ndarray:
        """Before any dropout; with the softmax of the same scores for a variant that has no log-sum-exp."""
        plain = without(self.plain, DROPOUT + NORMALIZATION)
        return scaled_dot_product_attention(x.q64, x.k64, x.v64, return_lse=True, **plain)[1]

    def reference_grads(self, x, dout64: np.ndarray) -> AttentionGrads:
        return attention_backward(x.q64, x.k64, x.v64, dout64, **{**self.options, **self._wide_options()})

    def _wide_options(self) -> dict:
        """The bias and the sinks in float64, as the reference's backward takes them."""
        return {name: as_real_array(self.options[name], name).astype(np.float64) for name in ("bias", "sinks")
                if self.options.get(name) is not None}

    def naive_output(self, x, dtype: np.dtype, fused: bool) -> np.ndarray:
        if self.fp8 is None:
            return naive_attention(x.q, x.k, x.v, dtype, self.options, fused=fused)
        # FlashAttention 3's: the dequantized inputs in the output's dtype, the weights rounded to fp8
        return naive_attention(x.q64, x.k64, x.v64, dtype, self.plain, intermediate=self.fp8, fused=fused)

    def naive_lse(self, x, dtype: np.dtype, fused: bool) -> np.ndarray:
        return naive_forward_arrays(x.q64, x.k64, x.v64, dtype, without(self.plain, DROPOUT), fused=fused)[5]

    def naive_grads(self, x, dout, dtype: np.dtype, fused: bool) -> AttentionGrads:
        return naive_backward(x.q, x.k, x.v, dout, dtype, self.options, fused=fused)

    def largest_score(self, x) -> float:
        """The largest magnitude of the scores the softmax sees and, with a soft cap, of those before it (a
        kernel rounds a score before capping it, and a score near 0 passes its rounding on whole)."""
        p = prepare_attention(x.q64, x.k64, x.v64, **without(self.plain, DROPOUT))
        raw: list[float] = []
        if p.softcap is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                tile_scores(p.q, p.k, p.scale, p.softcap, raw, p.additive())
        scores = problem_scores(p)
        return max([float(np.max(np.abs(scores[np.isfinite(scores)]), initial=0.0)), *raw])

    def values_mean(self, x) -> np.ndarray:
        values = prepare_attention(x.q64, x.k64, x.v64, **without(self.plain, DROPOUT)).v  # heads repeated
        return values.mean(axis=-2, keepdims=True)

    # --- by tiles: the reference and the baseline together, one (batch, head) at a time --------------

    def prepared(self, x, function, options: dict, dtype):
        """The float64 `AttentionProblem` of the check, or None where it runs on whole arrays (non-finite
        input, a float64 kernel, a variant the tiles do not compute).

        Its options are checked as `function` (`scaled_dot_product_attention` or `attention_backward`, which
        the whole-array computation calls) checks them, with the same errors."""
        for name in options:
            if name not in function.options:
                raise TypeError(f"{function.__name__}() got an unexpected keyword argument {name!r}")
        if not self.tiled or np.dtype(dtype) == np.float64:
            return None
        key = (function.__name__, tuple(options))
        if key not in self._prepared_cache:
            p = prepare_attention(x.q64, x.k64, x.v64, **options)
            finite = all(np.isfinite(a).all() for a in (p.q, p.k, p.v)) and all(
                np.all(a < np.inf) for a in (p.bias, p.sinks, p.alibi_slopes) if a is not None)  # -inf: masking
            self._prepared_cache[key] = p if finite else None
        return self._prepared_cache[key]

    def output_shape(self, x):
        p = self.prepared(x, scaled_dot_product_attention, self.plain, np.float32)
        return None if p is None else p.out_shape

    def check_dout(self, x, dout) -> None:
        p = self.prepared(x, attention_backward, self.options, np.float32)
        if p is not None:
            checked_array(dout, "dout", p.out_shape, "the shape of the attention output (..., L, Ev)", np.float64)

    def _output_tiles(self, x, dtype):
        """``(p, naive_p, extra)``: the reference's and the baseline's prepared problems of the output and the
        baseline's additive term in `dtype`; None where the tiles do not compute the check.

        The baseline takes the inputs as given, or for fp8 inputs their dequantized values (FlashAttention
        3's: in the output's dtype, the weights rounded to fp8)."""
        p = self.prepared(x, scaled_dot_product_attention, self.plain, dtype)
        if p is None:
            return None
        if self.fp8 is None:
            naive_p = naive_problem(x.q, x.k, x.v, dtype, self.options)
        else:
            naive_p = naive_problem(x.q64, x.k64, x.v64, dtype, self.plain)
        return p, naive_p, shared_extra(naive_p, dtype)

    def forward_tiles(self, x, dtype, fused, magnitude, progress):
        return self._forward_pass(x, dtype, fused, progress, magnitude=magnitude)

    def naive_output_tiles(self, x, dtype, fused, progress):
        tiled = self._forward_pass(x, dtype, fused, progress, with_reference=False)
        return None if tiled is None else tiled[2]

    def _forward_pass(self, x, dtype, fused, progress, magnitude=False, with_reference=True):
        """``(reference, lse, naive)`` by tiles (without `with_reference`: None, None and the baseline's
        output alone), or None where the tiles do not compute the check."""
        tiled = self._output_tiles(x, dtype)
        if tiled is None:
            return None
        p, naive_p, extra = tiled
        ref, lse = (np.empty(p.out_shape), np.empty(p.out_shape[:-1])) if with_reference else (None, None)
        out = np.empty(p.out_shape, dtype)
        largest = [1.0]
        tasks, threads, done = units(p, progress)

        def task(idx):
            if with_reference:
                r = reference(unit_problem(p, idx), magnitude=magnitude, whole_batch=idx is None)
                ref[at(idx)], lse[at(idx)] = r.out, r.lse
                largest.append(r.magnitude)
            out[at(idx)] = naive_forward(unit_problem(naive_p, idx), dtype, fused, self.fp8, extra)[0]

        try:
            run(tasks, threads, task, done)
        except NotTiled:  # only the reference raises it
            return None
        if magnitude:
            x.remember_magnitude(max(largest))
        return ref, lse, out

    def lse_tiles(self, x, dtype, fused, progress):
        plain = without(self.plain, DROPOUT)
        p = self.prepared(x, scaled_dot_product_attention, plain, dtype)
        if p is None:
            return None
        naive_p = naive_problem(*(x.inputs if self.fp8 is None else (x.q64, x.k64, x.v64)), dtype, plain)
        extra = shared_extra(naive_p, dtype)
        lse, naive = np.empty(p.out_shape[:-1]), np.empty(p.out_shape[:-1], np.float64)
        tasks, threads, done = units(p, progress)

        def task(idx):
            lse[at(idx)] = reference(unit_problem(p, idx), out=False, whole_batch=idx is None).lse
            naive[at(idx)] = naive_forward(unit_problem(naive_p, idx), dtype, fused, None, extra, lse_only=True)[1]

        try:
            run(tasks, threads, task, done)
        except NotTiled:
            return None
        return lse, naive

    def grads_tiles(self, x, dout, dtypes, fused, dbias, magnitude, progress):
        p = self.prepared(x, attention_backward, self.options, max(dtypes, key=lambda d: np.dtype(d).itemsize))
        if p is None:
            return None
        dout64 = checked_array(dout, "dout", p.out_shape, "the shape of the attention output (..., L, Ev)",
                               np.float64)
        try:
            return self._grads_tiles(x, p, dout, dout64, dtypes, fused, dbias, magnitude, progress)
        except NotTiled:
            return None

    def _grads_tiles(self, x, p, dout, dout64, dtypes, fused, want_dbias, magnitude, progress):
        batch = p.out_shape[:-2]
        L, S, E, Ev = p.n_queries, p.n_keys, p.q.shape[-1], p.v.shape[-1]
        ref = {name: np.empty(batch + shape) for name, shape in (("dq", (L, E)), ("dk", (S, E)), ("dv", (S, Ev)))}
        ref_sinks = None if p.sinks is None else np.empty(batch)
        target = np.zeros(p.bias.shape) if want_dbias and p.bias is not None else None
        lse = np.empty((*batch, L))
        naive_ps = {d: naive_problem(x.q, x.k, x.v, d, self.options) for d in dtypes}
        extras = {d: shared_extra(naive_ps[d], d) for d in dtypes}
        naive = {}
        for d, naive_p in naive_ps.items():
            work = naive_p.q.dtype
            naive[d] = [np.empty(batch + shape, work) for shape in ((L, E), (S, E), (S, Ev))]
            naive[d].append(np.empty((*batch, L, S), work) if target is not None else None)
            naive[d].append(None if p.sinks is None else np.empty(batch, work))
        dout = as_real_array(dout, "dout")
        largest = [1.0]
        lock = threading.Lock()
        tasks, threads, done = units(p, progress)

        def task(idx):
            add = None if target is None else (lambda rows, cols, dx: add_bias_grad(target, idx, rows, cols, dx, lock))
            r = reference(unit_problem(p, idx), dout64[at(idx)], magnitude=magnitude, dbias=add,
                          whole_batch=idx is None)
            for name in ref:
                ref[name][at(idx)] = getattr(r, name)
            if ref_sinks is not None:
                ref_sinks[at(idx)] = r.dsinks
            lse[at(idx)] = r.lse
            largest.append(r.magnitude)
            for d, naive_p in naive_ps.items():
                grads = naive_backward_of(unit_problem(naive_p, idx), dout[at(idx)], d, fused, extras[d],
                                          target is not None)
                for into, grad in zip(naive[d], grads, strict=True):
                    if into is not None:
                        into[at(idx)] = grad

        run(tasks, threads, task, done)
        if magnitude:
            x.remember_magnitude(max(largest))
        no_bias = dataclasses.replace(p, bias=None) if target is None else p
        reference_grads = finish_grads(no_bias, x.q64, x.k64, x.v64, {**self.options, **self._wide_options()},
                                       ref["dq"], ref["dk"], ref["dv"], target, ref_sinks, dtype=np.float64)
        baselines = {}
        for d, naive_p in naive_ps.items():
            unbiased = dataclasses.replace(naive_p, bias=None) if target is None else naive_p
            baselines[d] = finish_grads(unbiased, x.q, x.k, x.v, self.options, *naive[d], dtype=d)
        return reference_grads, lse, baselines


class Elementwise(Softmax):
    """An elementwise normalization of the scores (`attention_ref._normalization`): sigmoid attention
    (``normalization="sigmoid"``, `attention_ref.sigmoid`) and any other registered there, on whole arrays.

    The options, the reference and the baseline are the softmax's with the normalization among the options:
    the package's forward and backward and `._baseline` read its hooks from the prepared problem. It has no
    log-sum-exp: its empty rows are found from the softmax's of the same scores (``-inf`` where no key is
    allowed), and `assert_lse_close` refuses it.
    """

    has_lse = False
    tiled = False  # the tiles' reference is the online softmax

    def require_lse(self, function: str) -> None:
        needs_softmax(self.options.get("normalization", "softmax"), function)

    def reference(self, x, lse: bool = False):
        out = scaled_dot_product_attention(x.q64, x.k64, x.v64, **self.plain)
        return (out, self.reference_lse(x)) if lse else out


class Flex(Variant):
    """A FlexAttention description: the mods (a block mask's as a mask_mod), the scale and grouped heads.

    The reference is `attention_ref.flex_attention` (and its backward), tile by tile; the baseline
    `._baseline.NaiveFlex`, one (batch, query head) at a time: the check's memory does not grow with the batch.
    """

    one_unit_at_a_time = True

    def __init__(self, given: dict, options: dict, q: np.ndarray, k: np.ndarray, v: np.ndarray, function: str):
        others = sorted(name for name, value in options.items()
                        if name not in FLEX_OPTIONS and not _is_default(name, value))
        if others:
            raise TypeError(f"{function} takes score_mod, mask_mod and block_mask with scale and enable_gqa only, "
                            f"as flex_attention does; got also {', '.join(others)} (write them as mods)")
        self.score_mod, self.mask_mod = given.get("score_mod"), given.get("mask_mod")
        #: The block mask the reference skips the empty blocks of, as FlexAttention does (the baseline reads the
        #: dense mask it stands for, as ``mask_mod``).
        self.block_mask = given.get("block_mask")
        if self.block_mask is not None:
            if self.mask_mod is not None:
                raise ValueError("give mask_mod or block_mask, not both: a block mask carries its own mask_mod")
            self.mask_mod = _dense_mask_mod(self.block_mask, q.shape[-2], k.shape[-2])
        E = q.shape[-1]
        scale = options.get("scale")
        self.scale = float(scale) if scale is not None else (1.0 / np.sqrt(E) if E else 1.0)
        self.enable_gqa = bool(options.get("enable_gqa", False))
        self.given_grad = given.get("score_mod_grad")
        self._derivative = None
        self.wide = (as_real_array(q, "q").astype(np.float64), as_real_array(k, "k").astype(np.float64),
                     as_real_array(v, "v").astype(np.float64))

    def derivative(self, *args):
        """``score_mod``'s derivative with respect to the score, elementwise (needed by the backward only)."""
        if self._derivative is None:
            self._derivative = score_mod_derivative(self.score_mod, self.given_grad)
        return self._derivative(*args)

    def check_dout(self, x, dout) -> None:
        """Choose ``score_mod``'s derivative before any work: a mod without one is a TypeError naming it."""
        if self.score_mod is not None and self._derivative is None:
            self._derivative = score_mod_derivative(self.score_mod, self.given_grad)

    def keywords(self) -> dict:
        return {"scale": self.scale, "enable_gqa": self.enable_gqa}

    def _masks(self) -> dict:
        """The mask of the reference: the block mask when one was given, else the mask_mod."""
        if self.block_mask is not None:
            return {"block_mask": self.block_mask}
        return {"mask_mod": self.mask_mod}

    def reference(self, x, lse: bool = False):
        out, row_lse = flex_attention(x.q64, x.k64, x.v64, self.score_mod, return_lse=True, **self._masks(),
                                      **self.keywords())
        return (out, row_lse) if lse else out

    def reference_grads(self, x, dout64: np.ndarray) -> AttentionGrads:
        return flex_attention_backward(x.q64, x.k64, x.v64, dout64, self.score_mod, score_mod_grad=self.derivative,
                                       **self._masks(), **self.keywords())

    # The baseline one (batch, query head) at a time: memory grows with L * S, not with the batch.

    def _naive(self, x, dtype, fused=True, wide=False):
        """``((b, h), baseline)`` of each unit in turn (`wide`: of the float64 values of the inputs)."""
        q, k, v = (x.q64, x.k64, x.v64) if wide else (x.q, x.k, x.v)
        for unit in np.ndindex(*x.q.shape[:2]):
            yield unit, NaiveFlex(q, k, v, dtype, self, fused, unit)

    def naive_output(self, x, dtype: np.dtype, fused: bool) -> np.ndarray:
        out = np.empty((*x.q.shape[:3], x.v.shape[-1]), dtype)
        for (b, h), naive in self._naive(x, dtype, fused):
            out[b, h] = naive.out[0, 0]
        return out

    def naive_lse(self, x, dtype: np.dtype, fused: bool) -> np.ndarray:
        lse = np.empty(x.q.shape[:3])  # the baseline's float32 (or float64) values, exactly
        for (b, h), naive in self._naive(x, dtype, fused, wide=True):
            lse[b, h] = naive.lse[0, 0]
        return lse

    def naive_grads(self, x, dout, dtype: np.dtype, fused: bool) -> AttentionGrads:
        """Each unit's gradients; dk and dv summed over each key/value head's query heads and, for keys and
        values shared by the batch, over the batch, in the order the whole-array sums take them."""
        (B, H, L, E), (Bkv, Hkv, S, Ev) = x.q.shape, x.v.shape
        dout = np.broadcast_to(as_real_array(dout, "dout"), (B, H, L, Ev))
        dq = np.empty(x.q.shape, dtype)
        dk: Any = None  # and dv, groups: in the baseline's working dtype, known with the first unit
        dv: Any = None
        groups: Any = None
        for (b, h), naive in self._naive(x, dtype, fused):
            if dk is None:  # in the working dtype, summed there and rounded once, as the whole-array backward
                dk, dv = np.zeros((Bkv, Hkv, S, E), naive.work), np.zeros((Bkv, Hkv, S, Ev), naive.work)
                groups = (np.zeros((Hkv, S, E), naive.work), np.zeros((Hkv, S, Ev), naive.work))
            if h == 0:
                for total in groups:
                    total[...] = 0
            unit_dq, unit_dk, unit_dv = naive.query_head_grads(dout[b:b + 1, h:h + 1])
            dq[b, h] = unit_dq[0, 0]
            groups[0][h // (H // Hkv)] += unit_dk[0, 0]
            groups[1][h // (H // Hkv)] += unit_dv[0, 0]
            if h == H - 1:  # the batch entry's sums over the groups: its own, or added to the shared ones
                for into, total in zip((dk, dv), groups, strict=True):
                    if Bkv == 1 and B != 1:
                        into[0] += total
                    else:
                        into[b] = total
        if dk is None:
            dk, dv = np.zeros(x.k.shape), np.zeros(x.v.shape)
        return AttentionGrads(dq, dk.astype(dtype), dv.astype(dtype), None, None)

    def largest_score(self, x) -> float:
        largest = 0.0
        for _, naive in self._naive(x, np.dtype(np.float64), wide=True):
            finite = naive.scores[np.isfinite(naive.scores)]
            largest = max(largest, float(np.max(np.abs(finite), initial=0.0)))
        return largest

    def values_mean(self, x) -> np.ndarray:
        group = x.q.shape[1] // x.k.shape[1] if x.k.shape[1] else 1
        return np.repeat(x.v64, group, axis=1).mean(axis=-2, keepdims=True)


def choose_variant(given: dict, options: dict, q, k, v, function: str) -> Variant:
    """The variant of a check: `Flex` for the FlexAttention description `given`, else `Elementwise` for a
    normalization registered in `attention_ref._normalization.NORMALIZATIONS` other than the softmax, else
    `Softmax` (which refuses an unknown name as `attention_ref.scaled_dot_product_attention` does)."""
    if any(value is not None for value in given.values()):
        return Flex(given, options, q, k, v, function)
    normalization = options.get("normalization", "softmax")
    elementwise = isinstance(normalization, str) and NORMALIZATIONS.get(normalization) is not None
    return (Elementwise if elementwise else Softmax)(q, k, v, options)


def score_mod_derivative(score_mod, given):
    """``score_mod``'s derivative with respect to the score, chosen as `attention_ref.flex_attention_backward`
    chooses it (`attention_ref.flex.choose_score_mod_derivative`), torch's autograd wrapped as a function."""
    probe = (np.zeros((1, 1, 1, 1)), *(np.zeros((1, 1, 1, 1), np.int64) for _ in range(4))), "on a probe of one score"
    derivative = choose_score_mod_derivative(score_mod, given, probe)
    return autograd_derivative(score_mod) if derivative is None else derivative


def _is_default(name: str, value) -> bool:
    default = OPTIONS.get(name, None)
    return value is None or (default is not None and isinstance(value, type(default)) and value == default)


def _dense_mask_mod(block_mask, L: int, S: int):
    """A mask_mod reading the dense mask a block mask (torch's BlockMask, or a dict of keywords) stands for."""
    try:
        dense = block_mask_to_dense(**block_mask) if isinstance(block_mask, dict) else block_mask_to_dense(block_mask)
    except TypeError as exc:
        raise TypeError(f"block_mask must be torch's BlockMask or a dict of block_mask_to_dense's keywords; "
                        f"got {type(block_mask).__name__} ({exc})") from None
    if dense.shape[-2:] != (L, S):
        raise ValueError(f"block_mask describes sequence lengths (L, S) = {dense.shape[-2:]}, but q and k have "
                         f"({L}, {S})")
    many_b, many_h = dense.shape[0] > 1, dense.shape[1] > 1

    def block_mask_mod(b, h, q_idx, kv_idx):
        return dense[b * many_b, h * many_h, q_idx, kv_idx]

    return block_mask_mod
