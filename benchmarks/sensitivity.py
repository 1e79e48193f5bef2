"""Measure how sensitive the checkers' 2x rule is, and which default ``atol`` it can afford (issue 34).

The checkers of `attention_ref.testing` pass a kernel's result A when, elementwise,
``|A - R| <= factor * max|N - R| + atol`` (R the float64 reference, N a naive baseline; see
``attention_ref/testing/_checks.py``), with a default ``atol = units * eps * max|R|``. This script runs real
kernels, PyTorch's CPU ``scaled_dot_product_attention`` (forward, autograd backward, and the log-sum-exp of
``aten._scaled_dot_product_flash_attention_for_cpu``) and JAX's ``jax.nn.dot_product_attention`` (forward,
``jax.vjp`` backward, and its log-sum-exp residual, stored in the input dtype), over a fixed mix of shapes and
seeds, and records for every checked array:

- with ``atol = 0``, the ratio ``max|A - R| / max|N - R|``;
- the units a correct kernel needs at factor 2, ``max(0, max(|A - R| - 2 max|N - R|)) / (eps max|R|)``, in the
  checkers' own terms: the log-sum-exp's ``eps`` is that of its inputs, and the gradients' ``max|R|`` runs over
  dq, dk and dv together;
- the same units for the kernel with its scale multiplied by ``1 + error`` (a wrong kernel): the check catches
  it exactly when the default units are *below* this number.

It then recommends, per dtype of the checked array (of the inputs, for the log-sum-exp) and per kind (output,
log-sum-exp, gradients), the smallest power of two at least ``--margin`` times the largest units a correct
kernel needed, and reports the catch rate of every scale error with the package's default units (the
recommendation they were chosen from, as it stands in ``attention_ref/testing/_rule.py``). Usage::

    python benchmarks/sensitivity.py --seeds 200 --write docs/chapters/sensitivity_record.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from attention_ref import attention_backward, scaled_dot_product_attention
from attention_ref._interop import to_numpy
from attention_ref._validation import bfloat16_dtype, is_bfloat16
from attention_ref.testing._baseline import naive_attention, naive_backward, naive_forward_arrays
from attention_ref.testing._rule import ATOL_UNITS, ATOL_UNITS_GRAD, ATOL_UNITS_LSE
from attention_ref.testing._rule import EPS as _EPS
from attention_ref.testing._rule import errors as _errors

DTYPES = ("float16", "bfloat16", "float32", "float64")
KINDS = ("out", "lse", "dq", "dk", "dv")
#: The default atol of each kind is shared by these kinds (one dict per group in _checks.py).
GROUPS = {"out": ("out",), "lse": ("lse",), "grads": ("dq", "dk", "dv")}
#: Relative errors of the wrong kernels' scale.
SCALE_ERRORS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
#: Candidate default atol units whose catch rates are recorded.
CANDIDATE_UNITS = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
FACTOR = 2.0


class Spec(NamedTuple):
    """One shape of the mix: batch, query heads, key/value heads, L, S, E, causal (top-left), std of q and k."""

    batch: int
    heads: int
    kv_heads: int
    L: int
    S: int
    E: int
    causal: bool
    std: float


#: The fixed mix; case ``i`` uses ``SPECS[i % len(SPECS)]`` with seed ``i``. A q/k std of s gives scores of
#: standard deviation about s**2 (the scale is 1/sqrt(E)): 9 to 16 for s = 3 or 4, so that scores reach tens.
SPECS = (
    Spec(1, 1, 1, 1, 17, 16, False, 1.0),  # one query (decoding)
    Spec(2, 4, 4, 17, 17, 32, False, 1.0),
    Spec(1, 8, 8, 64, 64, 64, True, 1.0),
    Spec(1, 8, 2, 64, 128, 64, False, 1.0),  # grouped-query 8/2, L < S
    Spec(1, 2, 2, 128, 64, 32, True, 1.0),  # L > S, causal
    Spec(1, 4, 4, 128, 128, 64, True, 1.0),
    Spec(1, 2, 2, 200, 200, 128, False, 1.0),
    Spec(1, 8, 2, 17, 200, 128, True, 1.0),  # grouped-query, causal, L < S
    Spec(1, 1, 1, 200, 17, 16, False, 1.0),
    Spec(2, 3, 3, 64, 64, 32, False, 3.0),  # scores of tens
    Spec(1, 4, 4, 128, 128, 64, True, 3.0),
    Spec(1, 8, 2, 1, 128, 64, False, 2.0),
    Spec(1, 1, 1, 17, 1, 32, False, 1.0),  # one key: the scale has no effect on out and the gradients
    Spec(1, 2, 2, 64, 200, 16, False, 4.0),
    Spec(1, 4, 4, 200, 128, 128, True, 2.0),
    Spec(1, 2, 2, 1, 64, 32, True, 1.0),  # one query, causal: it sees one key
)


def spec_options(spec: Spec) -> dict:
    """The options of `attention_ref.scaled_dot_product_attention` for `spec`."""
    return {"is_causal": spec.causal, "enable_gqa": spec.heads != spec.kv_heads}


def scale_sensitive(spec: Spec) -> bool:
    """Whether the output and gradients depend on the scale at all: not when every row has a single key."""
    return not (spec.S == 1 or (spec.causal and spec.L == 1))


def dtype_name(dtype) -> str:
    """The name of `dtype` as the checkers' tables key it: "float16", "bfloat16", "float32" or "float64"."""
    return "bfloat16" if is_bfloat16(dtype) else np.dtype(dtype).name


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype named `name` (bfloat16 from ml_dtypes)."""
    return bfloat16_dtype() if name == "bfloat16" else np.dtype(name)


def draw(spec: Spec, seed: int, dtype: str) -> tuple[np.ndarray, ...]:
    """``(q, k, v, dout)`` of `spec` in `dtype`: q and k of std ``spec.std``, v and dout standard normal."""
    rng = np.random.default_rng(seed)
    b, h, g = spec.batch, spec.heads, spec.kv_heads
    shapes = ((b, h, spec.L, spec.E), (b, g, spec.S, spec.E), (b, g, spec.S, spec.E), (b, h, spec.L, spec.E))
    stds = (spec.std, spec.std, 1.0, 1.0)
    dtype = numpy_dtype(dtype)
    return tuple((s * rng.standard_normal(shape)).astype(dtype) for shape, s in zip(shapes, stds, strict=True))


def truth(q, k, v, dout, spec: Spec) -> dict:
    """``{kind: (R, baseline)}``: the float64 reference and the checkers' baseline of each kind.

    The output's and the gradients' baselines are in the inputs' dtype; the log-sum-exp's is float32, as in
    `assert_lse_close`.
    """
    options = spec_options(spec)
    dtype = np.dtype(q.dtype)
    q64, k64, v64, d64 = (a.astype(np.float64) for a in (q, k, v, dout))
    out, lse = scaled_dot_product_attention(q64, k64, v64, return_lse=True, **options)
    grads = attention_backward(q64, k64, v64, d64, **options)
    naive_grads = naive_backward(q, k, v, dout, dtype, options)
    naive_lse = naive_forward_arrays(q64, k64, v64, np.dtype(np.float32), options)[5].astype(np.float64)
    return {
        "out": (out, naive_attention(q, k, v, dtype, options)),
        "lse": (lse, np.broadcast_to(naive_lse, lse.shape)),
        **{kind: (getattr(grads, kind), getattr(naive_grads, kind)) for kind in ("dq", "dk", "dv")},
    }


def torch_kernel(q, k, v, dout, spec: Spec, scale_error: float = 0.0) -> dict:
    """PyTorch's CPU kernels with the scale times ``1 + scale_error``: ``{kind: ndarray}`` (NumPy dtypes).

    ``out``, and ``dq``, ``dk``, ``dv`` unless `dout` is None: ``F.scaled_dot_product_attention`` and
    autograd; ``lse``: the float32 (float64 for float64 input) log-sum-exp of
    ``aten._scaled_dot_product_flash_attention_for_cpu``.
    """
    import torch
    import torch.nn.functional as F

    scale = (1.0 + scale_error) / math.sqrt(spec.E)
    dtype = getattr(torch, dtype_name(q.dtype))
    # via float64, exactly (torch.from_numpy takes no bfloat16)
    tq, tk, tv = (torch.from_numpy(a.astype(np.float64)).to(dtype) for a in (q, k, v))
    leaves = [t.clone().requires_grad_(dout is not None) for t in (tq, tk, tv)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=spec.causal, scale=scale,
                                         enable_gqa=spec.heads != spec.kv_heads)
    arrays = {"out": out.detach()}
    kk, vv = (t.repeat_interleave(spec.heads // spec.kv_heads, dim=1) for t in (tk, tv))  # the op has no GQA
    _, arrays["lse"] = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(tq, kk, vv, 0.0, spec.causal,
                                                                                  scale=scale)
    if dout is not None:
        out.backward(torch.from_numpy(dout.astype(np.float64)).to(dtype))
        arrays.update(zip(("dq", "dk", "dv"), (t.grad for t in leaves), strict=True))
    return {kind: to_numpy(t, kind) for kind, t in arrays.items()}


_JAX_CALLS = {}


def _jax_call(causal: bool, backward: bool, jit: bool):
    """JAX's ``(q, k, v, dout, scale) -> (out, lse[, dq, dk, dv])``, layout (B, H, L, E)."""
    if (causal, backward, jit) not in _JAX_CALLS:
        import jax

        def attend(q, k, v, scale):
            t = (a.swapaxes(1, 2) for a in (q, k, v))  # (B, L, H, E), JAX's layout
            out, lse = jax.nn.dot_product_attention(*t, scale=scale, is_causal=causal, return_residual=True)
            return out.swapaxes(1, 2), lse.swapaxes(1, 2)

        def call(q, k, v, dout, scale):
            if not backward:
                return attend(q, k, v, scale)
            (out, lse), pullback = jax.vjp(lambda q, k, v: attend(q, k, v, scale), q, k, v)
            dq, dk, dv = pullback((dout, np.zeros(lse.shape, lse.dtype)))
            return out, lse, dq, dk, dv

        _JAX_CALLS[causal, backward, jit] = jax.jit(call) if jit else call
    return _JAX_CALLS[causal, backward, jit]


def jax_kernel(q, k, v, dout, spec: Spec, scale_error: float = 0.0) -> dict:
    """JAX's ``jax.nn.dot_product_attention`` (its XLA implementation) with the scale times ``1 + scale_error``.

    ``out``, ``lse`` (JAX's residual log-sum-exp, which it stores in the inputs' dtype), and ``dq``, ``dk``,
    ``dv`` (``jax.vjp``) unless `dout` is None. float64 needs ``jax_enable_x64``. float16 runs eagerly: JAX
    asks for float32 accumulation, which XLA's CPU backend refuses for float16 when compiling, and JAX falls
    back to the default precision only when the refusal comes at once (eagerly), not inside a jitted function.
    """
    scale = (1.0 + scale_error) / math.sqrt(spec.E)
    call = _jax_call(spec.causal, backward=dout is not None, jit=np.dtype(q.dtype) != np.float16)
    results = call(q, k, v, dout, scale)
    return {kind: np.asarray(a) for kind, a in zip(KINDS[: len(results)], results, strict=True)}


KERNELS = {"torch": torch_kernel, "jax": jax_kernel}


def slack(actual: np.ndarray, reference: np.ndarray, baseline: np.ndarray, *, scale=None,
          eps_name=None, magnitude=1.0) -> tuple[float, float]:
    """``(ratio, units)`` of one checked array (see the module docstring), as the checkers bound it.

    The units are those of the checkers' default atol: ``eps * scale`` with ``eps`` that of `eps_name` (default
    the array's dtype; the log-sum-exp's is its inputs') and `scale` (default the largest finite reference
    entry; the gradients' is the largest over dq, dk and dv), times `magnitude` (the largest score magnitude,
    for the output and gradients of float32 and float64). ``units`` is inf when the scale is zero and `actual`
    misses the reference by more than twice the baseline.
    """
    name = dtype_name(actual.dtype) if eps_name is None else eps_name
    finite = np.isfinite(reference)
    if scale is None:
        scale = float(np.max(np.abs(reference[finite]), initial=0.0))
    err = _errors(actual, reference)
    base_err = _errors(baseline, reference)
    base_max = float(np.max(base_err[finite & np.isfinite(base_err)], initial=0.0))
    worst = float(np.max(err, initial=0.0))
    ratio = worst / base_max if base_max > 0 else (0.0 if worst == 0 else math.inf)
    excess = float(np.max(err - FACTOR * base_max, initial=0.0))
    if excess <= 0:
        return ratio, 0.0
    unit = _EPS[name] * scale * magnitude
    return ratio, excess / unit if unit > 0 else math.inf


#: Kernels whose results are less precise than their dtype, measured but left out of the recommendation:
#: JAX's XLA attention runs its softmax in float32 whatever the inputs' dtype (jax/_src/nn/functions.py).
NOT_ACCURATE = {("jax", "float64")}


def measure_case(spec: Spec, seed: int, dtype: str, kernels: dict) -> list[dict]:
    """One record per kernel and kind for one case: the correct kernel's ratio and units, the wrong ones' units.

    ``sensitive``: the exact result depends on the scale (not for the output and the gradients when every row
    has a single key); ``degenerate``: the exact result is zero (dq and dk then), so that ``eps * max|R|`` is
    rounding noise and no units of it can bound a kernel's rounding.
    """
    q, k, v, dout = draw(spec, seed, dtype)
    expected = truth(q, k, v, dout, spec)
    grads_scale = max(float(np.max(np.abs(expected[kind][0]), initial=0.0)) for kind in ("dq", "dk", "dv"))
    # float32 and float64: the default atol of the output and the gradients grows with the largest score
    wide = dtype in ("float32", "float64")
    keys = np.repeat(k.astype(np.float64), spec.heads // spec.kv_heads, axis=1)  # (B, H, S, E)
    scores = q.astype(np.float64) @ np.swapaxes(keys, -1, -2) / math.sqrt(spec.E)
    if spec.causal:  # top-left: the scores the softmax sees
        scores = np.where(np.tri(spec.L, spec.S, dtype=bool), scores, 0.0)
    magnitude = max(1.0, float(np.abs(scores).max(initial=0.0))) if wide else 1.0
    terms = {"lse": {"eps_name": dtype}, "out": {"magnitude": magnitude},
             **{kind: {"scale": grads_scale, "magnitude": magnitude} for kind in ("dq", "dk", "dv")}}
    records = []
    for kernel_name, kernel in kernels.items():
        runs = [kernel(q, k, v, dout, spec, error) for error in (0.0, *SCALE_ERRORS)]
        for kind, (reference, baseline) in expected.items():
            ratio, units = slack(runs[0][kind], reference, baseline, **terms.get(kind, {}))
            records.append({
                "kernel": kernel_name, "input": dtype, "dtype": dtype_name(runs[0][kind].dtype),
                "kind": kind, "spec": spec, "seed": seed, "ratio": ratio, "units": units,
                "wrong": [slack(run[kind], reference, baseline, **terms.get(kind, {}))[1] for run in runs[1:]],
                "sensitive": kind == "lse" or scale_sensitive(spec),
                "degenerate": kind in ("dq", "dk") and not scale_sensitive(spec),
                "accurate": (kernel_name, dtype) not in NOT_ACCURATE,
            })
    return records


def power_of_two_at_least(x: float) -> float:
    """The smallest power of two >= `x`, with a floor of 1/8 (a guard against exact ties at factor 2)."""
    return 2.0 ** max(-3, math.ceil(math.log2(x))) if x > 0 else 0.125


def catch_rates(records: list[dict], units: float) -> dict:
    """``{error: fraction}``: how often each scale error fails the check with default `units`."""
    return {f"{e:g}": sum(r["wrong"][i] > units for r in records) / len(records) if records else None
            for i, e in enumerate(SCALE_ERRORS)}


def smallest_caught(rates: dict):
    """The smallest scale error caught in every case (from `catch_rates`), or None."""
    return next((e for e in SCALE_ERRORS if rates[f"{e:g}"] == 1.0), None)


def recommend(records: list[dict], margin: float, key: str) -> dict:
    """``{group: {dtype: units}}``: a power of two >= `margin` times the largest units needed (records by `key`)."""
    group_of = {kind: group for group, kinds in GROUPS.items() for kind in kinds}
    needed = defaultdict(float)
    for r in records:
        slot = (group_of[r["kind"]], r[key])
        needed[slot] = max(needed[slot], r["units"])
    recommended = {group: {} for group in GROUPS}
    for (group, dtype), units in sorted(needed.items(), key=lambda item: DTYPES.index(item[0][1])):
        recommended[group][dtype] = power_of_two_at_least(margin * units)
    return recommended


def default_units(kind: str, dtype: str, given: str) -> float:
    """The package's default atol for `kind`, in the units `slack` measures (the log-sum-exp's keyed by the
    inputs' dtype `given`): the catch rates of the record are those of the rule as it stands."""
    if kind == "lse":
        return ATOL_UNITS_LSE[given]
    return (ATOL_UNITS if kind == "out" else ATOL_UNITS_GRAD)[dtype]


def summarize(records: list[dict], margin: float) -> dict:
    """The record's recommendations, one row per (checked dtype, kind, input dtype), and the excluded cases."""
    counted = [r for r in records if r["accurate"] and not r["degenerate"]]
    recommended = recommend([r for r in counted if r["kind"] != "lse"], margin, "dtype")
    recommended["lse"] = recommend([r for r in counted if r["kind"] == "lse"], margin, "input")["lse"]
    group_of = {kind: group for group, kinds in GROUPS.items() for kind in kinds}
    rows = []
    for dtype in DTYPES:
        for kind in KINDS:
            for given in DTYPES:
                rs = [r for r in counted if (r["dtype"], r["kind"], r["input"]) == (dtype, kind, given)]
                if not rs:
                    continue
                units = default_units(kind, dtype, given)
                sensitive = [r for r in rs if r["sensitive"]]
                unit_scores = [r for r in sensitive if r["spec"].std == 1.0]
                caught, caught_unit = catch_rates(sensitive, units), catch_rates(unit_scores, units)
                worst = max(rs, key=lambda r: r["units"])
                rows.append({
                    "dtype": dtype, "kind": kind, "input": given, "cases": len(rs),
                    "kernels": sorted({r["kernel"] for r in rs}),
                    "largest_ratio": max(r["ratio"] for r in rs),
                    "largest_units_needed": worst["units"],
                    "worst_case": {"kernel": worst["kernel"], "seed": worst["seed"], "spec": worst["spec"]._asdict()},
                    "false_alarms_at_0_units": sum(r["units"] > 0 for r in rs),
                    "recommended_units": recommended[group_of[kind]][dtype if kind != "lse" else given],
                    "default_units": units,
                    "false_alarms_at_default": sum(r["units"] > units for r in rs),
                    "scale_sensitive_cases": len(sensitive),
                    "catch_rate": caught,
                    "smallest_error_caught_in_all": smallest_caught(caught),
                    "unit_score_cases": len(unit_scores),
                    "catch_rate_unit_scores": caught_unit,
                    "smallest_error_caught_in_all_unit_scores": smallest_caught(caught_unit),
                    "catch_rate_by_units": {f"{u:g}": catch_rates(sensitive, u) for u in CANDIDATE_UNITS},
                    "catch_rate_by_units_unit_scores": {f"{u:g}": catch_rates(unit_scores, u)
                                                        for u in CANDIDATE_UNITS},
                })
    excluded = []
    for reason, rs in (("reference zero in exact arithmetic (every row has one key)",
                        [r for r in records if r["degenerate"] and r["accurate"]]),
                       ("kernel less precise than its dtype", [r for r in records if not r["accurate"]])):
        for slot in sorted({(r["kernel"], r["dtype"], r["kind"]) for r in rs}):
            these = [r for r in rs if (r["kernel"], r["dtype"], r["kind"]) == slot]
            units = default_units(slot[2], slot[1], slot[1])
            excluded.append({
                "reason": reason, "kernel": slot[0], "dtype": slot[1], "kind": slot[2], "cases": len(these),
                "largest_ratio": max(r["ratio"] for r in these),
                "smallest_units_needed": min(r["units"] for r in these),
                "largest_units_needed": max(r["units"] for r in these),
                "failing_at_default": sum(r["units"] > units for r in these),
            })
    return {
        "recommended_units": recommended,
        "rows": rows,
        "excluded": excluded,
    }


def versions() -> dict:
    """Library versions and the machine."""
    info = {"python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(),
            "cores": os.cpu_count()}
    for module in ("torch", "jax", "ml_dtypes"):
        try:
            info[module] = __import__(module).__version__
        except ImportError:
            info[module] = None
    return info


def format_table(summary: dict) -> str:
    """The summary as a plain-text table (catch rates with the package's default units; 'std 1': scores of order
    one; 'recom.': the units the measurement recommends)."""
    head = (f"{'dtype':8} {'kind':4} {'input':8} {'cases':>5} {'ratio':>7} {'needed':>7} {'recom.':>6} {'units':>6} "
            f"{'all caught':>10} {'std 1':>6} {'1%':>5} {'2%':>5} {'1% std1':>7} {'2% std1':>7}")
    lines = [head, "-" * len(head)]

    def pct(error):
        return "none" if error is None else f"{100 * error:g} %"

    for r in summary["rows"]:
        lines.append(
            f"{r['dtype']:8} {r['kind']:4} {r['input']:8} {r['cases']:5d} {r['largest_ratio']:7.3g} "
            f"{r['largest_units_needed']:7.3g} {r['recommended_units']:6g} {r['default_units']:6g} "
            f"{pct(r['smallest_error_caught_in_all']):>10} {pct(r['smallest_error_caught_in_all_unit_scores']):>6} "
            f"{r['catch_rate']['0.01']:5.2f} {r['catch_rate']['0.02']:5.2f} "
            f"{r['catch_rate_unit_scores']['0.01']:7.2f} {r['catch_rate_unit_scores']['0.02']:7.2f}"
        )
    lines.append("excluded from the recommendation:")
    lines.extend(f"  {e['kernel']} {e['dtype']} {e['kind']}: {e['cases']} cases, ratio up to {e['largest_ratio']:.3g}, "
                 f"{e['failing_at_default']} fail at the default units ({e['reason']})"
                 for e in summary["excluded"])
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="cases per input dtype (default 200)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--margin", type=float, default=2.0,
                        help="safety margin over the largest units a correct kernel needed (default 2)")
    parser.add_argument("--write", metavar="PATH", help="write the JSON record to PATH")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import torch

    torch.set_num_threads(1)
    kernels = {name: KERNELS[name] for name in args.kernels}
    if "jax" in kernels and "float64" in args.dtypes:
        import jax

        jax.config.update("jax_enable_x64", True)
    started = time.perf_counter()
    records, seconds = [], {}
    for dtype in args.dtypes:
        t0 = time.perf_counter()
        for seed in range(args.seeds):
            records.extend(measure_case(SPECS[seed % len(SPECS)], seed, dtype, kernels))
        seconds[dtype] = round(time.perf_counter() - t0, 1)
        print(f"{dtype}: {args.seeds} cases in {seconds[dtype]} s", file=sys.stderr, flush=True)
    summary = summarize(records, args.margin)
    print(format_table(summary))
    print("recommended units (the log-sum-exp's keyed by the inputs' dtype):", json.dumps(summary["recommended_units"]))
    if args.write:
        record = {
            "date": datetime.date.today().isoformat(),
            "machine": versions(),
            "command": "python benchmarks/sensitivity.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "seeds_per_dtype": args.seeds,
            "specs": [s._asdict() for s in SPECS],
            "scale_errors": list(SCALE_ERRORS),
            "factor": FACTOR,
            "margin": args.margin,
            "seconds": {**seconds, "total": round(time.perf_counter() - started, 1)},
            **summary,
        }
        with open(args.write, "w") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
