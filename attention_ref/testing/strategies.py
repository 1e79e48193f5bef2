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

from .._interop import numpy_to_torch
from .._normalization import NORMALIZATIONS
from .._validation import check_bool, check_choice, check_int, float_dtype, is_dtype_like
from ..attention import scaled_dot_product_attention
from ..masks import ALIGNMENTS, causal_mask, sliding_window_mask
from ..positional import alibi_bias, alibi_slopes

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
#: Standard deviations of a drawn additive bias.
_BIAS_SPREADS = (1.0, 0.1, 5.0)
#: Multipliers of ALiBi's standard slopes (`attention_ref.alibi_slopes`).
_ALIBI_FACTORS = (1.0, 0.25, 4.0)
#: Standard deviations of drawn sink logits (about the size of the scores, and far above them).
_SINK_SPREADS = (1.0, 10.0)
#: The options torch's scaled_dot_product_attention has no counterpart for (`AttentionProblem.sdpa_kwargs`).
_NOT_IN_SDPA = ("softcap", "sinks")


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
        ``causal_alignment``, ``window``, ``scale``, ``softcap``,
        ``enable_gqa``, and when asked for ``bias``, ``alibi_slopes`` and
        ``sinks``.

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

    def allowed(self) -> np.ndarray:
        """Which keys each query may see: the mask, causality and window together, shape (B, H, L, S).

        Returns
        -------
        ndarray of bool, shape (B, H, L, S)
            True where `mask` (if any), ``is_causal`` and `window` (placed
            by ``causal_alignment``) all allow the pair.

        Examples
        --------
        Two queries placed on the last two of three keys:

        >>> import numpy as np
        >>> from attention_ref.testing.strategies import AttentionProblem
        >>> q, k = np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 3, 4))
        >>> options = {"is_causal": True, "causal_alignment": "bottom-right"}
        >>> AttentionProblem(q, k, k, options).allowed()[0, 0]
        array([[ True,  True, False],
               [ True,  True,  True]])
        """
        B, H, L, _ = self.q.shape
        S = self.k.shape[-2]
        allowed = _geometry(L, S, self.options)
        if self.options.get("mask") is not None:
            allowed = allowed & self.options["mask"]
        return np.broadcast_to(allowed, (B, H, L, S))

    def to_torch(self, device="cpu"):
        """`q`, `k` and `v` as torch tensors in the problem's dtype (bfloat16 included), on `device`.

        Parameters
        ----------
        device : str or torch.device, optional
            Where the tensors go. Default the CPU.

        Returns
        -------
        q, k, v : torch.Tensor
            The same values, shapes and dtype as the arrays: exact, bit for
            bit. On the CPU they are copies, so a kernel may change them.

        Raises
        ------
        ImportError
            If torch is not installed.

        See Also
        --------
        sdpa_kwargs : The options as keyword arguments of torch's attention.
        """
        import torch

        return tuple(numpy_to_torch(torch, np.array(a), device) for a in (self.q, self.k, self.v))

    def sdpa_kwargs(self, device="cpu") -> dict:
        r"""Keyword arguments with which torch's ``scaled_dot_product_attention`` computes this problem.

        ``torch.nn.functional.scaled_dot_product_attention(*p.to_torch(),
        **p.sdpa_kwargs())`` is the attention of ``scaled_dot_product_attention(
        p.q, p.k, p.v, **p.options)``, computed by torch.

        Parameters
        ----------
        device : str or torch.device, optional
            Where the mask goes, as the tensors of `to_torch`. Default the CPU.

        Returns
        -------
        dict
            ``attn_mask``: None when every key is allowed, else one boolean
            tensor (True = may attend) folding `mask`, ``is_causal`` and
            `window` with either ``causal_alignment`` (torch's own
            ``is_causal`` is top-left only, so it is never passed); with
            ``bias`` or ``alibi_slopes`` a float tensor in the problem's
            dtype instead, their sum where allowed and ``-inf`` elsewhere.
            ``scale``: the drawn scale, or None (both mean ``1 / sqrt(E)``
            otherwise). ``enable_gqa``: whether `k` and `v` have fewer
            heads than `q`.

        Raises
        ------
        ValueError
            If the problem has an option torch's attention cannot express:
            ``softcap`` or ``sinks`` (draw without them: ``softcap=False``,
            ``sinks=False``), or ``normalization="sigmoid"``.
        ImportError
            If torch is not installed.

        Notes
        -----
        What torch returns for a row with no allowed key depends on its
        kernel (zeros on the CPU in recent versions, NaN in some others):
        draws with ``hard=False`` or ``min_keys=2`` have no such row (see
        `attention_problems`).

        Examples
        --------
        A soft cap has no counterpart (this needs no torch):

        >>> import numpy as np
        >>> from attention_ref.testing.strategies import AttentionProblem
        >>> x = np.zeros((1, 1, 2, 4), dtype=np.float32)
        >>> AttentionProblem(x, x, x, {"softcap": 20.0}).sdpa_kwargs()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: torch's scaled_dot_product_attention cannot express softcap; this ...

        With torch installed, the problem runs through torch's attention::

            >>> import torch                                          # doctest: +SKIP
            >>> F = torch.nn.functional                               # doctest: +SKIP
            >>> out = F.scaled_dot_product_attention(*p.to_torch(), **p.sdpa_kwargs())  # doctest: +SKIP
        """
        normalization = self.options.get("normalization", "softmax")
        if normalization != "softmax":
            raise ValueError(f"torch's scaled_dot_product_attention has no normalization={normalization!r}, only the "
                             f"softmax (draw with normalizations=('softmax',), the default)")
        present = [name for name in _NOT_IN_SDPA if self.options.get(name) is not None]
        if present:
            shown = ", ".join(f"{name}={_describe(self.options[name])}" for name in present)
            raise ValueError(f"torch's scaled_dot_product_attention cannot express {' and '.join(present)}; this "
                             f"problem has {shown} (draw with {', '.join(f'{n}=False' for n in present)})")
        import torch

        H, L = self.q.shape[1], self.q.shape[2]
        S = self.k.shape[-2]
        allowed = _geometry(L, S, self.options)
        if self.options.get("mask") is not None:
            allowed = allowed & self.options["mask"]
        additive = None
        if self.options.get("bias") is not None:
            additive = self.options["bias"].astype(np.float64)
        if self.options.get("alibi_slopes") is not None:
            slopes = self.options["alibi_slopes"]
            alignment = self.options.get("causal_alignment", "top-left")
            # alibi_bias uses the standard slopes; a drawn slope is a multiple of them, the same for every head
            factor = float(slopes[0] / alibi_slopes(H)[0])
            term = factor * alibi_bias(H, L, S, alignment=alignment)  # (H, L, S)
            additive = term if additive is None else additive + term
        if additive is not None:
            with np.errstate(invalid="ignore"):
                folded = np.where(allowed, additive, -np.inf).astype(self.q.dtype)
            attn_mask = numpy_to_torch(torch, folded, device)
        elif allowed.all():
            attn_mask = None
        else:
            attn_mask = numpy_to_torch(torch, np.array(allowed), device)
        return {"attn_mask": attn_mask, "scale": self.options.get("scale"),
                "enable_gqa": self.q.shape[1] != self.k.shape[1]}


def _geometry(L: int, S: int, options: dict) -> np.ndarray:
    """The (L, S) pattern of ``is_causal`` and ``window`` with the problem's ``causal_alignment`` (all True without)."""
    alignment = options.get("causal_alignment", "top-left")
    allowed = np.ones((L, S), dtype=bool)
    if options.get("is_causal"):
        allowed &= causal_mask(L, S, alignment=alignment)
    if options.get("window") is not None:
        allowed &= sliding_window_mask(L, S, window=options["window"], alignment=alignment)
    return allowed


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


def _lengths(max_len: int, hard: bool, least: int = 1):
    """Strategy for L or S in [least, max_len]: with `hard` lengths at block boundaries or any, else moderate ones."""
    if not hard:
        top = min(max_len, _BENIGN_MAX_LEN)
        return st.integers(max(least, min(top, 8)), top)
    boundary = sorted({n for n in (*_BOUNDARY_LENGTHS, max_len - 1, max_len) if least <= n <= max_len})
    return st.one_of(st.sampled_from(boundary), st.integers(least, max_len))


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
        padding = _padding_mask(rng, shape)
        if draw(st.booleans(), label="a sequence with no key"):
            padding[rng.integers(padding.shape[0])] = False  # as often as a dense mask's empty rows, not 1 in S + 1
        return padding
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


def _keep_min_keys(options: dict, L: int, S: int, min_keys: int) -> int:
    """Change the drawn options so that every query row has at least `min_keys` allowed keys; the new L.

    `S` >= `min_keys` already. A causal problem becomes bottom-right with ``S - L >= min_keys - 1`` (top-left,
    query 0 sees key 0 alone), a window is widened to ``min_keys - 1`` keys a side and keeps its queries within
    the keys (``L <= S``), and a mask row left with fewer keys gains the first keys the rest allows.
    """
    if options.get("is_causal"):
        options["causal_alignment"] = "bottom-right"
        L = min(L, S - min_keys + 1)
    if "window" in options:
        options["window"] = tuple(None if side is None else max(side, min_keys - 1) for side in options["window"])
        L = min(L, S)
    mask = options.get("mask")
    if mask is not None:
        if mask.shape[-2] != 1:
            mask = mask[..., :L, :]
        geometry = _geometry(L, S, options)  # (L, S): at least min_keys True in every row
        first = geometry & (np.cumsum(geometry, axis=-1) <= min_keys)  # the first min_keys of each row
        short = np.sum(mask & geometry, axis=-1) < min_keys  # (..., L)
        fill = np.where(short[..., None], first, False)  # (..., L, S)
        if mask.shape[-2] == 1:  # key padding: one row of keys for every query
            options["mask"] = mask | fill.any(axis=-2, keepdims=True)
        else:
            options["mask"] = mask | fill
    return L


@st.composite
def _problems(draw, dtypes, max_len, gqa, masks, causal, windows, softcap, bias, alibi, sinks, hard, min_keys,
              normalizations=("softmax",)):
    """The composite strategy behind `attention_problems` (arguments already checked)."""
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    B = draw(st.integers(1, 2), label="B")
    Hkv = draw(st.integers(1, 3 if hard else 2), label="Hkv")
    group = draw(st.integers(1, 4), label="query heads per key/value head") if gqa else 1
    H = Hkv * group
    L = draw(_lengths(max_len, hard, 1 if hard else min_keys), label="L")
    S = draw(_lengths(max_len, hard, min_keys), label="S") if hard else L
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
    if bias and draw(st.booleans(), label="bias"):
        shape = draw(st.sampled_from([(L, S), (B, 1, L, S), (1, H, L, S), (B, H, L, S)]), label="bias shape")
        spread_b = draw(st.sampled_from(_BIAS_SPREADS), label="bias spread")
        options["bias"] = (spread_b * rng.standard_normal(shape)).astype(dtype)
    if alibi and draw(st.booleans(), label="alibi"):
        options["alibi_slopes"] = draw(st.sampled_from(_ALIBI_FACTORS), label="alibi factor") * alibi_slopes(H)
    normalization = draw(st.sampled_from(normalizations), label="normalization") if len(normalizations) > 1 \
        else normalizations[0]
    if normalization != "softmax":
        options["normalization"] = normalization  # the sigmoid: no sinks (no denominator to join)
    elif sinks and draw(st.booleans(), label="sinks"):
        options["sinks"] = draw(st.sampled_from(_SINK_SPREADS), label="sink spread") * rng.standard_normal(H)
    if min_keys > 1:
        L = _keep_min_keys(options, L, S, min_keys)
        if "bias" in options and options["bias"].shape[-2] != L:
            options["bias"] = options["bias"][..., :L, :]

    q = (spread * rng.standard_normal((B, H, L, E))).astype(dtype)
    k = (spread * rng.standard_normal((B, Hkv, S, E))).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, Ev)).astype(dtype)
    return AttentionProblem(q, k, v, options)


def attention_problems(*, dtypes=("float32",), max_len=64, gqa=True, masks=True, causal=True, windows=True,
                       softcap=True, bias=False, alibi=False, sinks=False, hard=True, min_keys=1,
                       normalizations=("softmax",)):
    r"""Hypothesis strategy drawing attention problems (`AttentionProblem`) to check a kernel on.

    Every draw is a valid call of `attention_ref.scaled_dot_product_attention`
    and, unless it is a sigmoid draw (`normalizations`), of
    `attention_ref.blockwise_attention`:
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
    bias : bool, optional
        Draw an additive float ``bias`` (in the problem's dtype) of shape
        ``(L, S)``, ``(B, 1, L, S)``, ``(1, H, L, S)`` or ``(B, H, L, S)``,
        normal with standard deviation 0.1, 1 or 5. Default False.
    alibi : bool, optional
        Draw ``alibi_slopes``: ALiBi's standard slopes
        (`attention_ref.alibi_slopes`) times 1, 4 or 1/4, one per query
        head. Default False.
    sinks : bool, optional
        Draw ``sinks``, one attention-sink logit per query head, normal with
        standard deviation 1 or 10. Default False.
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
    min_keys : int, optional
        With 2 or more, every query row has at least this many allowed
        keys, so that the scale, which cannot show in a row of one key (its
        weight is 1 whatever the scores), matters in every row: ``S >=
        min_keys``, masks keep that many keys in every row, windows are at
        least that wide, and causal draws are bottom-right with ``S - L >=
        min_keys - 1`` (top-left, query 0 sees one key). The default, 1,
        constrains nothing: with `hard` rows with no allowed key are drawn.
    normalizations : sequence of {"softmax", "sigmoid"}, optional
        The normalizations of the weights to draw from: a sigmoid draw has
        ``normalization="sigmoid"`` in its options (with the default bias
        :math:`-\log S`, and no ``sinks``), a softmax draw no such key.
        Default the softmax only, so the sigmoid is drawn only when asked.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws `AttentionProblem` instances: ``q`` (B, H, L, E), ``k``
        (B, Hkv, S, E), ``v`` (B, Hkv, S, Ev), all finite and in one dtype
        drawn from `dtypes`, and ``options``, a dict of keyword arguments
        (``mask``, ``is_causal``, ``causal_alignment``, ``window``,
        ``scale``, ``softcap``, ``enable_gqa``, ``bias``,
        ``alibi_slopes``, ``sinks``; those not drawn are absent). B is 1 or
        2 and E, Ev are at most 64.

    Raises
    ------
    TypeError
        If `dtypes` holds something other than the four float dtypes, if
        `max_len` is not an integer, or a flag is not a bool.
    ValueError
        If `dtypes` is empty, `max_len` < 1, or `min_keys` < 1 or larger
        than the draws allow: `max_len`, and with ``hard=False`` at most 32.
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
        ("bias", bias), ("alibi", alibi), ("sinks", sinks), ("hard", hard))}
    min_keys = check_int(min_keys, "min_keys", minimum=1)
    if isinstance(normalizations, str) or not isinstance(normalizations, (tuple, list)) or not normalizations:
        raise ValueError(f"normalizations must be a non-empty sequence of 'softmax' and 'sigmoid'; "
                         f"got {normalizations!r}")
    normalizations = tuple(check_choice(n, "normalizations", tuple(NORMALIZATIONS)) for n in normalizations)
    most = max_len if hard else min(max_len, _BENIGN_MAX_LEN)
    if min_keys > most:
        limit = f"max_len={max_len}" if most == max_len else f"{most}, the longest benign length (hard=False)"
        raise ValueError(f"min_keys must be at most the number of keys the draws can have, {limit}; "
                         f"got min_keys={min_keys}")
    return _problems(dtypes, max_len, min_keys=min_keys, normalizations=normalizations, **flags)

