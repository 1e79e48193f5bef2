"""Where the heads sit: the checkers' ``layout=``, (B, H, L, E) or (B, L, H, E), and the caller's indices.

The checkers compute in the package's layout, ``"bhsd"``: batch, heads, positions, features, as PyTorch holds
attention's arrays. FlashAttention, JAX and Hugging Face hold them as ``"bshd"``, positions before heads. Arrays
given in that layout are read with those two axes swapped (a view, nothing copied); a failure's index is turned
back into the caller's layout; and a failure on arrays that look like (B, L, H, E) given without ``layout``
says which layout the check assumed.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .._interop import to_numpy
from .._validation import check_choice

__all__: list[str] = []  # private module

#: The layouts a checker reads: heads before positions (the package's, PyTorch's) or after (FlashAttention's,
#: JAX's, Hugging Face's).
LAYOUTS = ("bhsd", "bshd")


def check_layout(layout) -> str:
    """`layout` if it is one of `LAYOUTS`; a ValueError naming the argument otherwise."""
    return check_choice(layout, "layout", LAYOUTS)


def heads_first(layout: str, **arrays) -> list:
    """The arrays, named by keyword, in the package's layout (..., H, L, E): as given for "bhsd" (None stays
    None), else NumPy views with their last axes but one swapped; a ValueError naming an array of fewer than
    three axes given as "bshd"."""
    if layout == "bhsd":
        return list(arrays.values())
    swapped = []
    for name, x in arrays.items():
        arr = None if x is None else to_numpy(x, name)
        if arr is not None and arr.ndim < 3:
            raise ValueError(f'{name} must have at least three axes (..., L, H, E) with layout="bshd"; '
                             f"got shape {arr.shape}")
        swapped.append(None if arr is None else np.swapaxes(arr, -3, -2))
    return swapped


def caller_index(index: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """An index (..., head, row, column) of the package's layout as the caller's layout writes it."""
    if layout == "bhsd" or len(index) < 3:
        return index
    return (*index[:-3], index[-2], index[-3], index[-1])


def looks_bshd(q, k) -> bool:
    """Whether `q` and `k`, read as (..., H, L, E), look like (..., L, H, E) arrays instead: both have more
    "heads" than "positions", as (B, L, H, E) arrays of sequences longer than their head count do."""
    shapes = [np.shape(a) for a in (q, k)]
    return all(len(s) >= 3 and s[-3] > s[-2] for s in shapes)


def layout_note(q, k, layout: str) -> str:
    """The line a failure gets when the check read (B, L, H, E)-looking arrays as (B, H, L, E) (else "")."""
    if layout != "bhsd" or not looks_bshd(q, k):
        return ""
    return (f"note: the check assumed layout='bhsd', q as (B, H, L, E) = {tuple(np.shape(q))}; if the arrays are "
            f"(B, L, H, E),\nas FlashAttention, JAX and Hugging Face hold them, pass layout='bshd'")


@contextlib.contextmanager
def noted(q, k, layout: str):
    """Re-raise an AssertionError or ValueError of the block with `layout_note` added, where it applies, and a
    ValueError of a "bshd" check with a note that the shapes it names are in the package's order."""
    try:
        yield
    except (AssertionError, ValueError) as error:
        note = layout_note(q, k, layout)
        if layout == "bshd" and isinstance(error, ValueError) and "with layout=" not in str(error):
            note = ("note: with layout='bshd' the arrays are read as (B, H, L, E), their heads and positions "
                    "swapped;\nthe shapes above are in that order")
        if not note:
            raise
        raise type(error)(f"{error}\n{note}") from error
