"""The checkers' rule and their report: ``|A - R| <= factor * max|N - R| + atol``, and where it fails.

Every checker ends here: the kernel's result ``A``, the float64 reference ``R`` and the naive baseline ``N``
(the textbook formula in the kernel's dtype) go in; out comes "" or the failure message, which says how many
elements fail and by how much, where they sit (batch, head and rows), which of them are NaN or infinite,
which rows have no allowed key, and, when ``A`` is wider than the kernel's inputs, that ``dtype=`` exists.
"""

from __future__ import annotations

import numpy as np

from .._validation import check_real, float_dtype, is_bfloat16
from ._layout import caller_index

__all__: list[str] = []  # private module

#: Machine epsilon (spacing of the numbers just above 1) of each dtype a kernel may compute in.
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
#: Default `atol` of the attention output, in units of ``eps * max|reference|`` (see assert_attention_close):
#: chosen from benchmarks/sensitivity.py's record (docs/chapters/sensitivity_record.json), twice the most a
#: correct kernel (PyTorch's and JAX's) needed over 200 cases a dtype, rounded up to a power of two.
ATOL_UNITS = {"float16": 0.125, "bfloat16": 0.125, "float32": 1.0, "float64": 2.0}
#: Default `atol` of a log-sum-exp (assert_lse_close), in units of ``eps * max|reference|`` with ``eps`` that of
#: the kernel's inputs: a float32 log-sum-exp of bfloat16 inputs is as exact as those inputs' scores.
ATOL_UNITS_LSE = {"float16": 1.0, "bfloat16": 1.0, "float32": 4.0, "float64": 0.125}
#: Default `atol` of each gradient (assert_attention_grads_close), in units of ``eps * max|reference|`` with the
#: maximum over dq, dk and dv together (a gradient that is zero in exact arithmetic has no scale of its own).
ATOL_UNITS_GRAD = {"float16": 1.0, "bfloat16": 1.0, "float32": 4.0, "float64": 8.0}
#: The floor of the output's default bound in float32 and float64, in units of ``eps * max|v|``: above what
#: PyTorch's float32 SDPA needed where the baseline's largest error, over few elements, was smaller than its
#: rounding (1500 draws of value head size 1, 6 query heads on 3 key/value heads, L = 12, S = 41, scale 0.25,
#: scores of order one: at most 0.68 in these units), and below the bound of ordinary cases (the float32
#: reports of tests/test_testing_reports.py).
FLOOR_UNITS = {"float32": 1.0, "float64": 1.0}
#: At most this many lines of "where the failures sit"; the rest are counted.
MAX_PLACES = 8


def dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if is_bfloat16(dtype) else np.dtype(dtype).name


def judged_dtype(actual: np.ndarray, dtype) -> np.dtype:
    """The precision a result is judged in: `dtype` when given (``out.float()`` of a bfloat16 kernel), else its own."""
    return np.dtype(actual.dtype) if dtype is None else float_dtype(dtype, "dtype")


def check_tolerances(factor, atol) -> tuple[float, float | None]:
    factor = check_real(factor, "factor", minimum=0.0)
    return factor, None if atol is None else check_real(atol, "atol", minimum=0.0)


def errors(actual: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``|actual - reference|`` in float64: inf where actual is NaN or misses a finite reference,
    0 where both hold the same non-finite value (non-finite input)."""
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.asarray(np.subtract(actual, reference, dtype=np.float64))  # 0-d inputs give a scalar
        np.abs(err, out=err)
        if np.isfinite(err.max(initial=0.0)):  # NaN propagates: every difference finite, nothing to mend
            return err
    a = actual.astype(np.float64)
    same = (a == reference) | (np.isnan(a) & np.isnan(reference))
    return np.where(same, 0.0, np.where(np.isnan(err), np.inf, err))


def _finite_array(a: np.ndarray) -> bool:
    """Whether every element of `a` is finite, by two reductions (NaN propagates through both)."""
    return bool(np.isfinite(a.max(initial=0.0)) and np.isfinite(a.min(initial=0.0)))


def _largest_magnitude(a: np.ndarray) -> float:
    """``max |a|`` (0 for an empty array) of a finite array, without the copy ``np.abs`` makes."""
    return max(float(a.max(initial=0.0)), -float(a.min(initial=0.0))) + 0.0  # + 0.0: never -0.0


def finite_magnitude(a: np.ndarray) -> float:
    """``max |a|`` over the finite entries of `a` (0 without any): by two reductions where every entry is
    finite, else over a copy of the finite ones."""
    if _finite_array(a):
        return _largest_magnitude(a)
    return float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0))


def _rows_label(lo: int, hi: int) -> str:
    return f"row {lo}" if lo == hi else f"rows {lo}-{hi}"


def _lead_label(index: tuple[int, ...], last_head: int | None = None, groups: int = 1) -> str:
    """How a report names the leading axes of one failing block: batch and head for (B, H, rows, ...).

    Under grouped-query attention (`groups` query heads a key/value head) the heads ``index[-1]`` to
    `last_head` are named with their key/value head: ``batch 0, heads 4-7 (kv head 1): ``.
    """
    if len(index) not in (1, 2):
        return f"index {index}: " if index else ""
    head = index[-1]
    heads = f"head {head}" if last_head in (None, head) else f"heads {head}-{last_head}"
    if groups > 1:
        heads += f" (kv head {head // groups})"
    return f"batch {index[0]}, {heads}: " if len(index) == 2 else f"{heads}: "


def _merge_heads(runs: list, groups: int) -> list:
    """`runs` ``(lead, count, lo, hi, no key)`` as ``(lead, count, lo, hi, no key, last head)``: under
    grouped-query attention (`groups` > 1, leads (batch, head) or (head,)) the runs of the same rows in
    consecutive query heads of one key/value head merged into one, in the order of their first head."""
    if groups <= 1 or not runs or len(runs[0][0]) not in (1, 2):
        return [(*run, None) for run in runs]
    merged: dict = {}  # (batch, kv head, lo, hi, no key) -> [[lead, count, lo, hi, no key, last head], ...]
    for lead, n, lo, hi, flag in runs:
        entries = merged.setdefault((lead[:-1], lead[-1] // groups, lo, hi, flag), [])
        if entries and entries[-1][5] == lead[-1] - 1:
            entries[-1][1] += n
            entries[-1][5] = lead[-1]
        else:
            entries.append([lead, n, lo, hi, flag, lead[-1]])
    return sorted((tuple(e) for entries in merged.values() for e in entries), key=lambda e: (e[0], e[2]))


def places(bad: np.ndarray, empty: np.ndarray | None, rows_last: bool, groups: int = 1) -> list[str]:
    """Where the failing elements sit: one line per run of consecutive failing rows of one (batch, head).

    `bad` is (..., rows, cols), or (..., rows) with `rows_last` (a log-sum-exp); `empty` (..., rows) marks
    the rows whose reference has no allowed key (None: none). Indices count from 0, ranges are inclusive.
    Under grouped-query attention (`groups` query heads a key/value head, the head axis that of ``bad[..., h,
    rows, ...]``) a line names the key/value head, and query heads of one key/value head failing on the same
    rows share a line.
    """
    if bad.ndim == 0:
        return ["the one element"]
    rows_last = rows_last or bad.ndim == 1  # a vector (dsinks): each element its own row
    per_row = bad.astype(np.int64) if rows_last else bad.sum(axis=-1)  # (..., rows)
    empty = None if empty is None else np.broadcast_to(empty, per_row.shape)
    found = []  # (lead, count, lo, hi, no allowed key)
    for lead in np.ndindex(per_row.shape[:-1]):
        counts = per_row[lead]
        rows = np.flatnonzero(counts)
        if not rows.size:
            continue
        flags = np.zeros(counts.shape, bool) if empty is None else empty[lead]
        # a new run where the rows stop being consecutive or the "no allowed key" flag changes
        cut = np.flatnonzero((np.diff(rows) != 1) | (flags[rows[1:]] != flags[rows[:-1]])) + 1
        for part in np.split(rows, cut):
            found.append((lead, int(counts[part].sum()), int(part[0]), int(part[-1]), bool(flags[part[0]])))
    runs = _merge_heads(found, groups)  # (lead, count, lo, hi, no allowed key, last head)
    lines = [f"{_lead_label(lead, last, groups)}{_rows_label(lo, hi)} ({n} element{'s' * (n != 1)})"
             + (", no allowed key" if flag else "") for lead, n, lo, hi, flag, last in runs[:MAX_PLACES]]
    if len(runs) > MAX_PLACES:
        rest = sum(run[1] for run in runs[MAX_PLACES:])
        lines.append(f"... and {len(runs) - MAX_PLACES} more runs of rows ({rest} elements)")
    return lines


def _nonfinite(actual: np.ndarray) -> str:
    """"actual holds 3 NaN, 1 +inf" (what is there), or "" when every element is finite."""
    a = actual.astype(np.float64)
    counts = [(int(np.isnan(a).sum()), "NaN"), (int(np.isposinf(a).sum()), "+inf"),
              (int(np.isneginf(a).sum()), "-inf")]
    named = [f"{n} {what}" for n, what in counts if n]
    return f"non-finite values in actual: {', '.join(named)}\n" if named else ""


def compare(actual, reference, baseline, *, factor: float, atol, units: dict, dtype: np.dtype, what: str = "",
            baseline_name: str | None = None, skip=None, empty=None, rows_last: bool = False,
            widened: str = "", magnitude=None, eps_dtype=None, scale=None, layout: str = "bhsd",
            groups: int = 1, floor_scale=None) -> str:
    """The failure message of the rule (see assert_attention_close), or "" if `actual` passes.

    `dtype` is the precision judged (its eps sets the default atol, with `units`); the baseline is named by
    `baseline_name`, else by `dtype`. Elements under `skip` are not checked and do not count in the
    baseline's largest error. `empty` marks rows with no allowed key for the report, `widened` is a line
    added to a failure (the dtype= hint). `magnitude` (a function giving the largest score magnitude, at
    least 1) multiplies the default atol of float32 and float64: there a kernel's rounding of a large score
    (``eps * |s|``) moves its weights as much as the baseline's own does, and a baseline that happens to round
    its few scores well bounds nothing. The default
    atol takes its ``eps`` from `eps_dtype` (default `dtype`) and its scale from `scale` (default the largest
    finite reference entry). The failing index is printed in `layout` (`._layout.caller_index`), the
    arrays being in the package's. `groups`: query heads a key/value head under grouped-query attention,
    named in the report's lines (`places`). `floor_scale` (the values' largest magnitude, which bounds the
    output's): in float32 and float64 the default atol is raised where needed so that the bound is at least
    ``FLOOR_UNITS * eps * floor_scale``, a floor a correct kernel's rounding does not reach where the
    baseline's largest error, over few elements, happens to be smaller.
    """
    name = dtype_name(dtype)
    # Without `skip` and with a finite reference (every ordinary check) the masks below select everything:
    # the same maxima are taken by reductions alone, without the masks' copies of the arrays.
    whole = skip is None and _finite_array(reference)
    finite = None if whole else np.isfinite(reference)
    if skip is not None:
        skip = np.broadcast_to(skip, reference.shape)
        finite = finite & ~skip
    if scale is None:
        scale = _largest_magnitude(reference) if whole else float(np.max(np.abs(reference[finite]), initial=0.0))
    floor = 0.0
    if atol is None:
        eps_name = name if eps_dtype is None else dtype_name(eps_dtype)
        atol = units[eps_name] * EPS[eps_name] * scale
        if eps_name in ("float32", "float64") and magnitude is not None:
            atol *= magnitude()
        if floor_scale is not None and name in FLOOR_UNITS:
            floor = FLOOR_UNITS[name] * EPS[name] * floor_scale
    err = errors(actual, reference)
    base_err = errors(baseline, reference)
    base_max = float(base_err.max(initial=0.0))  # errors() holds no NaN
    if not (whole and base_max < np.inf):
        counted = (np.isfinite(reference) if finite is None else finite) & np.isfinite(base_err)
        base_max = float(np.max(base_err[counted], initial=0.0))
    atol = max(atol, floor - factor * base_max)  # the default atol raised to the floor where it is lower
    bound = factor * base_max + atol
    if skip is None and not err.max(initial=0.0) > bound:  # every element within the bound (no NaN in err)
        return ""
    bad = err > bound
    if skip is not None:
        bad &= ~skip
    if not bad.any():
        return ""
    worst = np.unravel_index(np.argmax(np.where(bad, err, -1.0)), err.shape)
    index = caller_index(tuple(int(i) for i in worst), layout)
    ratio = err[worst] / base_max if base_max > 0 else np.inf
    where = "\n".join(places(bad, empty, rows_last, groups))
    return (
        f"{what}{int(bad.sum())} of {bad.size} elements are too far from the float64 reference\n"
        f"allowed: factor * (naive {baseline_name or name} baseline's largest error) + atol = "
        f"{factor:g} * {base_max:.3g} + {atol:.3g} = {bound:.3g}\n"
        f"largest error {err[worst]:.3g} at index {index}: actual {float(actual[worst]):.6g}, "
        f"reference {reference[worst]:.6g}, baseline's error there {base_err[worst]:.3g}\n"
        f"ratio to the baseline's largest error: {ratio:.3g}\n"
        f"{_nonfinite(actual)}"
        f"where they are:\n{where}" + (f"\n{widened}" if widened else "")
    )


def widened_hint(actual: np.ndarray, dtype, inputs) -> str:
    """The dtype= hint for a failure, when `actual` is wider than every input and no `dtype` was given."""
    if dtype is not None:
        return ""
    widths = [np.dtype(a.dtype).itemsize for a in inputs if getattr(a, "dtype", None) is not None]
    if not widths or np.dtype(actual.dtype).itemsize <= max(widths):
        return ""
    narrow = sorted({dtype_name(a.dtype) for a in inputs if np.dtype(a.dtype).itemsize == max(widths)})
    if any(n.startswith("float8") for n in narrow):
        return ""  # fp8 kernels return a wider output by design; their baseline already is the output's dtype
    names = " and ".join(narrow)
    return (f"note: actual is {dtype_name(actual.dtype)} but the inputs are {names}; if the kernel computed in "
            f"{names}\nand its output was widened (out.float()), pass dtype={narrow[0]!r} to judge it in that "
            f"precision")


def textbook_hint(dtype: np.dtype) -> str:
    """The note added when the textbook baseline would pass a kernel the fused one fails."""
    name = dtype_name(dtype)
    return (f"note: the check passes with baseline='textbook': if the kernel rounds its scores to {name} (eager "
            f"code\nthat multiplies in {name} before the softmax), judge it with that baseline")
