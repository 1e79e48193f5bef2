r"""Hypothesis strategies for property tests of attention kernels: `attention_problems`.

A kernel author states once what the kernel must do, and hypothesis draws
the problems: shapes, dtypes, masks, causality with either alignment,
windows, soft caps, grouped-query heads and the data. With ``hard=True``
(the default) the draws reach the regimes kernels get wrong: scaled scores
in the hundreds, rows with no allowed key, ``L != S`` under both causal
alignments, grouped-query heads and lengths just off the block sizes
(1, 15, 17, 33, 63, ...). When a check fails, hypothesis shrinks the
problem and prints it (shapes, dtype and options; see `AttentionProblem`).

hypothesis is an optional dependency of attention_ref; this module needs it
(``pip install hypothesis``), and bfloat16 draws need ml_dtypes.

Examples
--------
A property test of a kernel: here `attention_ref.blockwise_attention`, which
takes the same options, against `attention_ref.testing.assert_attention_close`.

>>> from hypothesis import given, settings
>>> from attention_ref import blockwise_attention
>>> from attention_ref.testing import assert_attention_close
>>> from attention_ref.testing.strategies import attention_problems
>>> @settings(max_examples=5, deadline=None)
... @given(attention_problems(dtypes=("float16", "float32")))
... def test_kernel(p):
...     out = blockwise_attention(p.q, p.k, p.v, block_size=16, **p.options)
...     assert_attention_close(out, p.q, p.k, p.v, **p.options)
>>> test_kernel()
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

try:
    from hypothesis import strategies as st
except ImportError:
    raise ImportError(
        "attention_ref.testing.strategies needs the optional hypothesis package: pip install hypothesis"
    ) from None

from .._validation import check_bool, check_int, float_dtype, is_dtype_like
from ..attention import scaled_dot_product_attention
from ..masks import ALIGNMENTS

__all__ = ["AttentionProblem", "attention_problems"]

#: Lengths just before, at and after the block sizes kernels tile by (16 to 128), and 1 (decoding).
_BOUNDARY_LENGTHS = (1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
#: Query/key feature sizes E and value sizes Ev: benign ones, and with ``hard=True`` odd ones besides.
_BENIGN_DIMS = (8, 16, 32)
_HARD_DIMS = (8, 1, 3, 16, 17, 32, 64)
#: Standard deviation of the q and k entries with ``hard=True``: 10 puts the scaled scores in the hundreds.
_HARD_SPREADS = (1.0, 0.1, 3.0, 10.0)
#: Multipliers of the default scale 1 / sqrt(E) when ``scale`` is drawn.
_SCALE_FACTORS = (2.0, 0.5)
#: Soft caps (Gemma 2 caps its attention logits at 50).
_SOFTCAPS = (50.0, 20.0, 5.0, 1.0)
#: Fractions of True in a random mask.
_DENSITIES = (0.9, 0.5, 0.1, 1.0)
#: Benign lengths stay within this (and `max_len`).
_BENIGN_MAX_LEN = 32


def _largest(arr: np.ndarray) -> float:
    """The largest magnitude in `arr` (0 for an empty one)."""
    return float(np.max(np.abs(arr.astype(np.float64)), initial=0.0))


def _describe(value) -> str:
    """Short text for an option value or array in a repr: dtype and shape of an array, else its repr."""
    if isinstance(value, np.ndarray):
        extra = f" {value.mean():.0%} True" if value.dtype == np.bool_ else ""
        return f"{value.dtype}{value.shape}{extra}"
    return repr(value)


@dataclass(frozen=True, eq=False)
class AttentionProblem:
    r"""One drawn attention problem: inputs `q`, `k`, `v` and the options of the call.

    Parameters
    ----------
    q : ndarray, shape (B, H, L, E)
        Queries, in the drawn dtype.
    k : ndarray, shape (B, Hkv, S, E)
        Keys, in the dtype of `q`; ``Hkv`` divides ``H``.
    v : ndarray, shape (B, Hkv, S, Ev)
        Values, in the dtype of `q`.
    options : dict
        Keyword arguments of the package's scaled dot-product attention
        and of its blockwise attention: some of ``mask``, ``is_causal``,
        ``causal_alignment``, ``window``, ``scale``, ``softcap`` and
        ``enable_gqa``.

    See Also
    --------
    attention_problems : The strategy that draws these.

    Notes
    -----
    The repr gives the dtype and shapes, the options (a mask as its dtype,
    shape and fraction of True) and the largest magnitude in each array, not
    the arrays: it is what hypothesis prints for a failing example.

    Examples
    --------
    >>> import numpy as np
    >>> from attention_ref.testing.strategies import AttentionProblem
    >>> q = np.full((1, 1, 3, 4), 0.5, dtype=np.float32)
    >>> k, v = np.ones((1, 1, 5, 4), dtype=np.float32), np.arange(5.0, dtype=np.float32).reshape(1, 1, 5, 1)
    >>> p = AttentionProblem(q, k, v, {"is_causal": True})
    >>> p
    AttentionProblem(float32 q(1, 1, 3, 4) k(1, 1, 5, 4) v(1, 1, 5, 1), max |q| 0.5 |k| 1 |v| 4, is_causal=True)

    Every score is the same, so each query averages the values it may see:

    >>> p.reference()[0, 0]
    array([[0. ],
           [0.5],
           [1. ]])
    """

    q: np.ndarray  # (B, H, L, E)
    k: np.ndarray  # (B, Hkv, S, E)
    v: np.ndarray  # (B, Hkv, S, Ev)
    options: dict

    def __repr__(self) -> str:
        shapes = " ".join(f"{name}{getattr(self, name).shape}" for name in ("q", "k", "v"))
        largest = " ".join(f"|{name}| {_largest(getattr(self, name)):.3g}" for name in ("q", "k", "v"))
        options = "".join(f", {name}={_describe(value)}" for name, value in self.options.items())
        return f"AttentionProblem({self.q.dtype} {shapes}, max {largest}{options})"

    def _repr_pretty_(self, printer, cycle) -> None:
        """The repr, for hypothesis's report of a failing example and IPython (which print dataclass fields)."""
        printer.text(repr(self))

    def reference(self) -> np.ndarray:
        """The float64 attention output, shape (B, H, L, Ev): `scaled_dot_product_attention` of float64 copies.

        Returns
        -------
        ndarray, shape (B, H, L, Ev)
            ``scaled_dot_product_attention(q, k, v, **options)`` with `q`, `k`,
            `v` converted exactly to float64.
        """
        q, k, v = (a.astype(np.float64) for a in (self.q, self.k, self.v))
        return scaled_dot_product_attention(q, k, v, **self.options)


def _as_dtypes(dtypes) -> tuple[np.dtype, ...]:
    """`dtypes` (one dtype or name, or a sequence of them) as a non-empty tuple of checked float dtypes."""
    if is_dtype_like(dtypes):
        dtypes = (dtypes,)
    try:
        listed = tuple(dtypes)
    except TypeError:
        raise TypeError(
            f"dtypes must be a sequence of float16, bfloat16, float32 or float64 (names or dtypes); "
            f"got {dtypes!r} of type {type(dtypes).__name__}"
        ) from None
    if not listed:
        raise ValueError("dtypes must name at least one of float16, bfloat16, float32 and float64; got none")
    return tuple(dict.fromkeys(float_dtype(dtype, "dtypes") for dtype in listed))


def _lengths(max_len: int, hard: bool):
    """Strategy for L or S in [1, max_len]: with `hard` lengths at block boundaries or any, else moderate ones."""
    if not hard:
        top = min(max_len, _BENIGN_MAX_LEN)
        return st.integers(min(top, 8), top)
    boundary = sorted({n for n in (*_BOUNDARY_LENGTHS, max_len - 1, max_len) if 1 <= n <= max_len})
    return st.one_of(st.sampled_from(boundary), st.integers(1, max_len))


def _padding_mask(rng, shape) -> np.ndarray:
    """A key-padding mask of `shape` (B, 1, 1, S): batch element b keeps its first n_b keys, 0 <= n_b <= S."""
    B, S = shape[0], shape[-1]
    kept = rng.integers(0, S + 1, size=(B, 1, 1, 1))  # (B, 1, 1, 1)
    return np.arange(S) < kept  # (B, 1, 1, S)


def _draw_mask(draw, rng, B: int, H: int, L: int, S: int, hard: bool) -> np.ndarray:
    """A mask broadcastable to (B, H, L, S); with `hard`, some rows may be all False.

    Without `hard` (then L == S) the diagonal is always allowed, so that with any causal alignment or
    window every row keeps at least one key.
    """
    shapes = [(L, S), (B, 1, L, S), (1, H, L, S), (B, H, L, S)]
    if hard:
        shapes.append((B, 1, 1, S))  # key padding
    shape = draw(st.sampled_from(shapes), label="mask shape")
    if shape[-2] == 1:
        return _padding_mask(rng, shape)
    mask = rng.random(shape) < draw(st.sampled_from(_DENSITIES), label="mask density")  # shape, True at that rate
    if not hard:
        return mask | np.eye(L, S, dtype=bool)
    if draw(st.booleans(), label="empty mask rows"):
        mask[..., rng.random(L) < 0.3, :] = False
        mask[..., rng.integers(L), :] = False  # at least one
    return mask


def _draw_window(draw, max_len: int, is_causal: bool) -> tuple[int | None, int | None]:
    """A ``(left, right)`` window, each side None or in [0, max_len]; with `is_causal` the right side is 0 or None."""
    side = st.one_of(st.none(), st.integers(0, max_len))
    left = draw(side, label="window left")
    right = draw(st.sampled_from([None, 0]) if is_causal else side, label="window right")
    return left, right


@st.composite
def _problems(draw, dtypes, max_len, gqa, masks, causal, windows, softcap, hard):
    """The composite strategy behind `attention_problems` (arguments already checked)."""
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    B = draw(st.integers(1, 2), label="B")
    Hkv = draw(st.integers(1, 3 if hard else 2), label="Hkv")
    group = draw(st.integers(1, 4), label="query heads per key/value head") if gqa else 1
    H = Hkv * group
    lengths = _lengths(max_len, hard)
    L = draw(lengths, label="L")
    S = draw(lengths, label="S") if hard else L
    dims = st.sampled_from(_HARD_DIMS if hard else _BENIGN_DIMS)
    E, Ev = draw(dims, label="E"), draw(dims, label="Ev")
    spread = draw(st.sampled_from(_HARD_SPREADS), label="q, k spread") if hard else 1.0
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))

    options: dict = {}
    if masks and draw(st.booleans(), label="mask"):
        options["mask"] = _draw_mask(draw, rng, B, H, L, S, hard)
    is_causal = causal and draw(st.booleans(), label="is_causal")
    if is_causal:
        options["is_causal"] = True
    if windows and draw(st.booleans(), label="window"):
        options["window"] = _draw_window(draw, max_len, is_causal)
    if "window" in options or is_causal:
        options["causal_alignment"] = draw(st.sampled_from(ALIGNMENTS), label="causal_alignment")
    if draw(st.booleans(), label="scale"):
        options["scale"] = draw(st.sampled_from(_SCALE_FACTORS), label="scale factor") / math.sqrt(E)
    if softcap and draw(st.booleans(), label="softcap"):
        options["softcap"] = draw(st.sampled_from(_SOFTCAPS), label="softcap value")
    if H != Hkv:
        options["enable_gqa"] = True

    q = (spread * rng.standard_normal((B, H, L, E))).astype(dtype)
    k = (spread * rng.standard_normal((B, Hkv, S, E))).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, Ev)).astype(dtype)
    return AttentionProblem(q, k, v, options)


def attention_problems(*, dtypes=("float32",), max_len=64, gqa=True, masks=True, causal=True, windows=True,
                       softcap=True, hard=True):
    r"""Hypothesis strategy drawing attention problems (`AttentionProblem`) to check a kernel on.

    Every draw is a valid call of `attention_ref.scaled_dot_product_attention`
    and of `attention_ref.blockwise_attention`:
    ``scaled_dot_product_attention(p.q, p.k, p.v, **p.options)``.

    Parameters
    ----------
    dtypes : sequence of str or dtype, optional
        The dtypes to draw from (one per problem, shared by `q`, `k`, `v`):
        float16, bfloat16 (needs ml_dtypes), float32, float64, as names or
        NumPy, ml_dtypes, JAX or torch dtypes (``torch.bfloat16``). A single
        name or dtype is one dtype. Default float32.
    max_len : int, optional
        Largest number of queries L and of keys S (both are >= 1), and of
        the sides of a window. Default 64.
    gqa : bool, optional
        Draw grouped-query heads: ``Hkv`` divides ``H`` (up to 4 query
        heads per key/value head) with ``enable_gqa=True`` where they
        differ. False: ``Hkv == H`` and no ``enable_gqa``.
    masks : bool, optional
        Draw boolean masks, of shape ``(L, S)``, ``(B, 1, L, S)``,
        ``(1, H, L, S)``, ``(B, H, L, S)`` or (with `hard`) a key-padding
        mask ``(B, 1, 1, S)``.
    causal : bool, optional
        Draw ``is_causal=True`` (with a ``causal_alignment``).
    windows : bool, optional
        Draw a ``window=(left, right)``, each side None or in
        ``[0, max_len]`` (the right side 0 or None with ``is_causal``),
        with a ``causal_alignment``.
    softcap : bool, optional
        Draw a ``softcap`` among 50, 20, 5 and 1.
    hard : bool, optional
        Reach the regimes kernels get wrong, each in a few per cent of the
        draws or more: q and k entries with standard deviation up to 10
        (scaled scores in the hundreds), rows with no allowed key (masks
        with all-False rows, key padding of every key, bottom-right
        alignment with ``L > S``, windows past the keys), ``L != S`` under
        both alignments, lengths just off the block sizes (1, 15, 17, 31,
        33, 63, ...) and odd head sizes (1, 3, 17). False: benign draws,
        standard normal data, ``8 <= L == S <= 32`` (within `max_len`),
        head sizes 8, 16, 32, and every row keeps at least one key.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws `AttentionProblem` instances: ``q`` (B, H, L, E), ``k``
        (B, Hkv, S, E), ``v`` (B, Hkv, S, Ev), all finite and in one dtype
        drawn from `dtypes`, and ``options``, a dict of keyword arguments
        (``mask``, ``is_causal``, ``causal_alignment``, ``window``,
        ``scale``, ``softcap``, ``enable_gqa``; those not drawn are absent).
        B is 1 or 2 and E, Ev are at most 64.

    Raises
    ------
    TypeError
        If `dtypes` holds something other than the four float dtypes, if
        `max_len` is not an integer, or a flag is not a bool.
    ValueError
        If `dtypes` is empty or `max_len` < 1.
    ImportError
        If `dtypes` holds bfloat16 and ml_dtypes is not installed.

    See Also
    --------
    attention_ref.testing.assert_attention_close : Checks a kernel's output on a drawn problem.
    AttentionProblem : What is drawn.
    attention_ref.scaled_dot_product_attention : The reference and the meaning of the options.

    Notes
    -----
    Hypothesis draws the shapes, options and a seed; NumPy's generator,
    seeded with it, draws the arrays. That is fast and shrinks well: a
    failing problem shrinks towards small shapes, few options and seed 0.
    The data's scale (``hard``) and the mask's density are drawn by
    hypothesis, so they shrink too.

    Examples
    --------
    Checking a kernel (here `attention_ref.blockwise_attention`, correct by
    construction) on float16 and float32 problems:

    >>> from hypothesis import given, settings
    >>> from attention_ref import blockwise_attention
    >>> from attention_ref.testing import assert_attention_close
    >>> from attention_ref.testing.strategies import attention_problems
    >>> @settings(max_examples=5, deadline=None)
    ... @given(attention_problems(dtypes=("float16", "float32")))
    ... def test_kernel(p):
    ...     out = blockwise_attention(p.q, p.k, p.v, block_size=16, **p.options)
    ...     assert_attention_close(out, p.q, p.k, p.v, **p.options)
    >>> test_kernel()

    A kernel without masks or windows is checked on the problems it supports:

    >>> problems = attention_problems(masks=False, windows=False, softcap=False)
    """
    dtypes = _as_dtypes(dtypes)
    max_len = check_int(max_len, "max_len", minimum=1)
    flags = {name: check_bool(value, name) for name, value in (
        ("gqa", gqa), ("masks", masks), ("causal", causal), ("windows", windows), ("softcap", softcap),
        ("hard", hard))}
    return _problems(dtypes, max_len, **flags)

