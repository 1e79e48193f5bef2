"""What a checker was told the kernel computed: its inputs as NumPy arrays, its options, and the reference.

A `Problem` holds the kernel's inputs exactly as given (torch, JAX, CuPy arrays converted by `to_numpy`, in
their own dtypes, fp8 included), float64 copies of what they stand for (fp8 dequantized), and either the
options of `attention_ref.scaled_dot_product_attention` or a FlexAttention description (``score_mod``,
``mask_mod``, ``block_mask``). It computes the float64 reference, the naive baseline in a dtype, and the rows
with no allowed key together with what each empty-row convention (``empty_rows=``) expects there.

The checkers ask for everything one check needs at once (`Problem.forward`, `Problem.lse_pass`,
`Problem.grads_pass`), computed one (batch, head) at a time by `._tiles`. A FlexAttention variant, a float64
kernel (whose baseline's error is the reference's last bits) and non-finite input are computed on whole
arrays, as the methods ``reference*`` and ``naive_*`` do.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from .._attention_problem import prepare_attention, problem_scores
from .._interop import to_numpy
from .._options import DROPOUT, NORMALIZATION, OPTIONS
from .._validation import as_real_array, is_fp8, result_dtype
from ..attention import scaled_dot_product_attention
from ..backward import AttentionGrads, attention_backward, checked_array, finish_grads
from ..flex import (
    autograd_derivative,
    block_mask_to_dense,
    choose_score_mod_derivative,
    flex_attention,
    flex_attention_backward,
)
from ..fp8 import dequantize_inputs, fp8_output_dtype
from ._baseline import (
    NaiveFlex,
    naive_attention,
    naive_backward,
    naive_backward_of,
    naive_forward_arrays,
    naive_problem,
)
from ._tiles import (
    NotTiled,
    add_bias_grad,
    at,
    fits,
    naive_forward,
    reference,
    run,
    shared_extra,
    unit_problem,
    units,
)

__all__: list[str] = []  # private module

#: Options of scaled_dot_product_attention that make no sense for comparing one deterministic output
#: (``dropout_p`` is one unless a ``dropout_mask`` makes the dropout deterministic).
_NOT_OPTIONS = ("return_weights", "dropout_p", "rng")
#: Options that hold arrays: converted to NumPy with the arrays (torch tensors and the like).
_ARRAY_OPTIONS = ("mask", "bias", "sinks", "alibi_slopes", "dropout_mask", "q_descale", "k_descale", "v_descale")
#: The FlexAttention description a checker may take instead of (most of) the options.
_FLEX = ("score_mod", "mask_mod", "block_mask", "score_mod_grad")
#: The options that go with a FlexAttention description, as `attention_ref.flex_attention` takes them.
_FLEX_OPTIONS = ("scale", "enable_gqa")
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


class _Flex:
    """A FlexAttention description: the mods (a block mask's as a mask_mod), the scale and grouped heads."""

    def __init__(self, given: dict, options: dict, q: np.ndarray, k: np.ndarray, function: str):
        others = sorted(name for name, value in options.items()
                        if name not in _FLEX_OPTIONS and not _is_default(name, value))
        if others:
            raise TypeError(f"{function} takes score_mod, mask_mod and block_mask with scale and enable_gqa only, "
                            f"as flex_attention does; got also {', '.join(others)} (write them as mods)")
        self.score_mod, self.mask_mod = given.get("score_mod"), given.get("mask_mod")
        block_mask = given.get("block_mask")
        if block_mask is not None:
            if self.mask_mod is not None:
                raise ValueError("give mask_mod or block_mask, not both: a block mask carries its own mask_mod")
            self.mask_mod = _dense_mask_mod(block_mask, q.shape[-2], k.shape[-2])
        E = q.shape[-1]
        scale = options.get("scale")
        self.scale = float(scale) if scale is not None else (1.0 / np.sqrt(E) if E else 1.0)
        self.enable_gqa = bool(options.get("enable_gqa", False))
        self.given_grad = given.get("score_mod_grad")
        self._derivative = None

    def derivative(self, *args):
        """``score_mod``'s derivative with respect to the score, elementwise (needed by the backward only)."""
        if self._derivative is None:
            self._derivative = score_mod_derivative(self.score_mod, self.given_grad)
        return self._derivative(*args)

    def keywords(self) -> dict:
        return {"scale": self.scale, "enable_gqa": self.enable_gqa}


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


class Problem:
    """The kernel's inputs and options, checked and converted; see the module docstring."""

    def __init__(self, q, k, v, options: dict, function: str):
        options = dict(options)
        _check_deterministic(options, function)
        given = {name: options.pop(name) for name in _FLEX if name in options}
        for name in _ARRAY_OPTIONS:
            if options.get(name) is not None:
                options[name] = to_numpy(options[name], name)
        self.q, self.k, self.v = (to_numpy(a, name) for a, name in ((q, "q"), (k, "k"), (v, "v")))
        self.options = options
        #: Sigmoid attention (`attention_ref.sigmoid`), computed on whole arrays.
        self.sigmoid = options.get("normalization", "softmax") == "sigmoid"
        self.flex = None
        self._magnitude: float | None = None
        self._prepared_cache: dict = {}
        if any(value is not None for value in given.values()):
            self.flex = _Flex(given, options, self.q, self.k, function)
            self.q64, self.k64, self.v64 = (as_real_array(a, n).astype(np.float64) for a, n in
                                            ((self.q, "q"), (self.k, "k"), (self.v, "v")))
            self.plain, self.fp8 = {}, None
        else:
            self.q64, self.k64, self.v64, self.plain, self.fp8 = dequantized(self.q, self.k, self.v, options)

    @property
    def inputs(self) -> tuple[np.ndarray, ...]:
        return self.q, self.k, self.v

    def kv_groups(self) -> int:
        """Query heads per key/value head under grouped-query attention (``enable_gqa`` with fewer key/value
        heads than query heads), else 1: the report names each query head's key/value head."""
        gqa = self.flex.enable_gqa if self.flex is not None else bool(self.options.get("enable_gqa", False))
        if not gqa or self.q.ndim < 3 or self.k.ndim < 3:
            return 1
        hq, hkv = self.q.shape[-3], self.k.shape[-3]
        return hq // hkv if 0 < hkv < hq else 1

    def input_dtype(self) -> np.dtype:
        """The precision of the scores: the promoted dtype of `q` and `k` (bfloat16 for fp8 inputs)."""
        q, k = (fp8_output_dtype() if is_fp8(a.dtype) else as_real_array(a, n).dtype
                for a, n in ((self.q, "q"), (self.k, "k")))
        return result_dtype(np.zeros(0, q), np.zeros(0, k))[0]

    # --- the float64 reference ----------------------------------------------------------------------

    def reference(self, lse: bool = False):
        """The float64 output (..., L, Ev), and with `lse` the log-sum-exp (..., L) too."""
        if self.flex is not None:
            out, row_lse = flex_attention(self.q64, self.k64, self.v64, self.flex.score_mod, self.flex.mask_mod,
                                          return_lse=True, **self.flex.keywords())
            return (out, row_lse) if lse else out
        if lse and self.sigmoid:
            return scaled_dot_product_attention(self.q64, self.k64, self.v64, **self.plain), self.reference_lse()
        return scaled_dot_product_attention(self.q64, self.k64, self.v64, return_lse=lse, **self.plain)

    def reference_lse(self) -> np.ndarray:
        """The float64 log-sum-exp (..., L) of the scores, before any dropout; ``-inf`` marks a row with no
        allowed key (the sigmoid has none of its own, so this serves its checks to find those rows)."""
        if self.flex is not None:
            return self.reference(lse=True)[1]
        plain = {name: value for name, value in self.plain.items() if name not in DROPOUT + NORMALIZATION}
        return scaled_dot_product_attention(self.q64, self.k64, self.v64, return_lse=True, **plain)[1]

    def reference_grads(self, dout64: np.ndarray) -> AttentionGrads:
        if self.flex is not None:
            return flex_attention_backward(self.q64, self.k64, self.v64, dout64, self.flex.score_mod,
                                           self.flex.mask_mod, score_mod_grad=self.flex.derivative,
                                           **self.flex.keywords())
        wide = {name: as_real_array(self.options[name], name).astype(np.float64) for name in ("bias", "sinks")
                if self.options.get(name) is not None}
        return attention_backward(self.q64, self.k64, self.v64, dout64, **{**self.options, **wide})

    # --- by tiles: the reference and the baseline together, one (batch, head) at a time --------------

    def _prepared(self, function, options: dict, dtype):
        """The float64 `AttentionProblem` of the check, or None where it runs on whole arrays (a FlexAttention
        variant, non-finite input, a float64 kernel: its baseline's error is the reference's last bits).

        Its options are checked as `function` (`scaled_dot_product_attention` or `attention_backward`, which
        the whole-array computation calls) checks them, with the same errors."""
        for name in options:
            if name not in function.options:
                raise TypeError(f"{function.__name__}() got an unexpected keyword argument {name!r}")
        if self.flex is not None or np.dtype(dtype) == np.float64 or self.sigmoid:
            return None  # the sigmoid too: the tiles' reference is the online softmax
        key = (function.__name__, tuple(options))
        if key not in self._prepared_cache:
            p = prepare_attention(self.q64, self.k64, self.v64, **options)
            finite = all(np.isfinite(a).all() for a in (p.q, p.k, p.v)) and all(
                np.all(a < np.inf) for a in (p.bias, p.sinks, p.alibi_slopes) if a is not None)  # -inf: masking
            self._prepared_cache[key] = p if finite else None
        return self._prepared_cache[key]

    def _whole(self) -> None:
        """Before the whole-array computation: a ValueError if its (..., L, S) arrays cannot fit in memory."""
        n_units = max(int(np.prod(self.q.shape[:-2])), int(np.prod(self.k.shape[:-2])))
        fits(self.q.shape[-2], self.k.shape[-2], n_units, 8)

    def output_shape(self, dtype) -> tuple[int, ...] | None:
        """The shape of the attention output, known before any work (None for a FlexAttention variant)."""
        p = self._prepared(scaled_dot_product_attention, self.plain, np.float32)
        return None if p is None else p.out_shape

    def _naive_of(self, dtype, options: dict, wide: bool):
        """The baseline's prepared problem: the inputs as given (or, `wide`, their float64 values) in `dtype`."""
        if wide:
            return naive_problem(self.q64, self.k64, self.v64, dtype, options)
        return naive_problem(self.q, self.k, self.v, dtype, options)

    def forward(self, dtype, fused: bool, *, magnitude: bool = False, progress: bool = False):
        """``(reference, lse, naive)``: the float64 output and log-sum-exp and the baseline's output in `dtype`."""
        p = self._prepared(scaled_dot_product_attention, self.plain, dtype)
        if p is not None:
            try:
                return self._forward_tiles(p, dtype, fused, magnitude, progress)
            except NotTiled:
                pass
        self._whole()
        ref, lse = self.reference(lse=True)
        return ref, lse, np.broadcast_to(self.naive_output(dtype, fused), ref.shape)

    def _forward_tiles(self, p, dtype, fused, magnitude, progress, naive=True):
        fp8 = self.fp8 is not None
        naive_p = self._naive_of(dtype, self.plain if fp8 else self.options, fp8) if naive else None
        extra = shared_extra(naive_p, dtype) if naive else None
        ref, lse = np.empty(p.out_shape), np.empty(p.out_shape[:-1])
        out = np.empty(p.out_shape, dtype) if naive else None
        largest = [1.0]
        tasks, threads, done = units(p, progress)

        def task(idx):
            r = reference(unit_problem(p, idx), magnitude=magnitude, one_blas_thread=idx is None)
            ref[at(idx)], lse[at(idx)] = r.out, r.lse
            largest.append(r.magnitude)
            if naive:
                out[at(idx)] = naive_forward(unit_problem(naive_p, idx), dtype, fused, self.fp8, extra)[0]

        run(tasks, threads, task, done)
        if magnitude:
            self._magnitude = max(largest)
        return ref, lse, out

    def naive_output_tiles(self, dtype, fused: bool, progress: bool = False) -> np.ndarray:
        """`naive_output` for a problem the tiles can take (else the whole-array one)."""
        p = self._prepared(scaled_dot_product_attention, self.plain, dtype)
        if p is None:
            return self.naive_output(dtype, fused)
        fp8 = self.fp8 is not None
        naive_p = self._naive_of(dtype, self.plain if fp8 else self.options, fp8)
        extra = shared_extra(naive_p, dtype)
        out = np.empty(p.out_shape, dtype)
        tasks, threads, done = units(p, progress)

        def task(idx):
            out[at(idx)] = naive_forward(unit_problem(naive_p, idx), dtype, fused, self.fp8, extra)[0]

        run(tasks, threads, task, done)
        return out

    def lse_pass(self, dtype, fused: bool, progress: bool = False):
        """``(reference, naive)`` log-sum-exps (..., L): the float64 one and the baseline's in `dtype`."""
        plain = {name: value for name, value in self.plain.items() if name not in DROPOUT}
        p = self._prepared(scaled_dot_product_attention, plain, dtype)
        if p is not None:
            naive_p = naive_problem(self.q64, self.k64, self.v64, dtype, plain)
            extra = shared_extra(naive_p, dtype)
            lse, naive = np.empty(p.out_shape[:-1]), np.empty(p.out_shape[:-1], np.float64)
            tasks, threads, done = units(p, progress)

            def task(idx):
                lse[at(idx)] = reference(unit_problem(p, idx), out=False, one_blas_thread=idx is None).lse
                naive[at(idx)] = naive_forward(unit_problem(naive_p, idx), dtype, fused, None, extra)[1]

            try:
                run(tasks, threads, task, done)
                return lse, naive
            except NotTiled:
                pass
        self._whole()
        return self.reference_lse(), self.naive_lse(dtype, fused)

    def grads_prepare(self, dout):
        """Check the options and `dout` as `attention_backward` does (its errors), before any work."""
        p = self._prepared(attention_backward, self.options, np.float32)
        if p is not None:
            checked_array(dout, "dout", p.out_shape, "the shape of the attention output (..., L, Ev)", np.float64)

    def grads_pass(self, dout, dtypes, fused: bool, *, dbias: bool, magnitude: bool = False,
                   progress: bool = False):
        """``(reference, lse, naive)``: the float64 gradients, log-sum-exp, and a dict of the baseline's
        gradients for each dtype of `dtypes` (each computed once, with one forward)."""
        p = self._prepared(attention_backward, self.options, max(dtypes, key=lambda d: np.dtype(d).itemsize))
        if p is not None:
            dout64 = checked_array(dout, "dout", p.out_shape, "the shape of the attention output (..., L, Ev)",
                              np.float64)
            try:
                return self._grads_tiles(p, dout, dout64, dtypes, fused, dbias, magnitude, progress)
            except NotTiled:
                pass
        self._whole()
        dout64 = as_real_array(dout, "dout").astype(np.float64)
        ref = self.reference_grads(dout64)
        return ref, self.reference_lse(), {d: self.naive_grads(dout, d, fused) for d in dtypes}

    def _grads_tiles(self, p, dout, dout64, dtypes, fused, want_dbias, magnitude, progress):
        batch = p.out_shape[:-2]
        L, S, E, Ev = p.n_queries, p.n_keys, p.q.shape[-1], p.v.shape[-1]
        ref = {name: np.empty(batch + shape) for name, shape in (("dq", (L, E)), ("dk", (S, E)), ("dv", (S, Ev)))}
        ref_sinks = None if p.sinks is None else np.empty(batch)
        target = np.zeros(p.bias.shape) if want_dbias and p.bias is not None else None
        lse = np.empty((*batch, L))
        naive_ps = {d: naive_problem(self.q, self.k, self.v, d, self.options) for d in dtypes}
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
                          one_blas_thread=idx is None)
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
            self._magnitude = max(largest)
        wide = {name: as_real_array(self.options[name], name).astype(np.float64) for name in ("bias", "sinks")
                if self.options.get(name) is not None}
        no_bias = dataclasses.replace(p, bias=None) if target is None else p
        reference_grads = finish_grads(no_bias, self.q64, self.k64, self.v64, {**self.options, **wide}, ref["dq"],
                                       ref["dk"], ref["dv"], target, ref_sinks, dtype=np.float64)
        baselines = {}
        for d, naive_p in naive_ps.items():
            unbiased = dataclasses.replace(naive_p, bias=None) if target is None else naive_p
            baselines[d] = finish_grads(unbiased, self.q, self.k, self.v, self.options, *naive[d], dtype=d)
        return reference_grads, lse, baselines

    # --- the naive baseline -------------------------------------------------------------------------

    def naive_output(self, dtype: np.dtype, fused: bool) -> np.ndarray:
        if self.flex is not None:
            return NaiveFlex(self.q, self.k, self.v, dtype, self.flex, fused).out.astype(dtype)
        if self.fp8 is None:
            return naive_attention(self.q, self.k, self.v, dtype, self.options, fused=fused)
        # FlashAttention 3's: the dequantized inputs in the output's dtype, the weights rounded to fp8
        return naive_attention(self.q64, self.k64, self.v64, dtype, self.plain, intermediate=self.fp8, fused=fused)

    def naive_lse(self, dtype: np.dtype, fused: bool) -> np.ndarray:
        if self.flex is not None:
            return NaiveFlex(self.q64, self.k64, self.v64, dtype, self.flex, fused).lse
        plain = {name: value for name, value in self.plain.items() if name not in DROPOUT}
        return naive_forward_arrays(self.q64, self.k64, self.v64, dtype, plain, fused=fused)[5]

    def naive_grads(self, dout, dtype: np.dtype, fused: bool) -> AttentionGrads:
        if self.flex is not None:
            return NaiveFlex(self.q, self.k, self.v, dtype, self.flex, fused).backward(dout)
        return naive_backward(self.q, self.k, self.v, dout, dtype, self.options, fused=fused)

    def score_magnitude(self) -> float:
        """The largest magnitude of the scores the softmax sees (finite ones), at least 1.

        A float32 or float64 kernel's error grows with it (a score ``x`` is rounded to ``eps * |x|``, and its
        weight with it), as the baseline's does by chance: the default `atol` of those dtypes scales with it.
        """
        if self._magnitude is None:  # computed once: each gradient's check asks for it
            if self.flex is not None:
                scores = NaiveFlex(self.q64, self.k64, self.v64, np.dtype(np.float64), self.flex).scores
            else:
                plain = {name: value for name, value in self.plain.items() if name not in DROPOUT}
                scores = problem_scores(prepare_attention(self.q64, self.k64, self.v64, **plain))
            self._magnitude = max(1.0, float(np.max(np.abs(scores[np.isfinite(scores)]), initial=0.0)))
        return self._magnitude

    # --- rows with no allowed key -------------------------------------------------------------------

    def values_mean(self) -> np.ndarray:
        """Each query head's mean of its values over all keys, (..., 1, Ev): what "mean" expects on an empty row."""
        if self.flex is not None:
            group = self.q.shape[1] // self.k.shape[1] if self.k.shape[1] else 1
            return np.repeat(self.v64, group, axis=1).mean(axis=-2, keepdims=True)
        plain = {name: value for name, value in self.plain.items() if name not in DROPOUT}
        values = prepare_attention(self.q64, self.k64, self.v64, **plain).v  # key/value heads repeated
        return values.mean(axis=-2, keepdims=True)


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
