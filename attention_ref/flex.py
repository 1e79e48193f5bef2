r"""FlexAttention in NumPy: any attention variant as a ``score_mod`` and a ``mask_mod``, tile by tile.

`flex_attention` gives the semantics of PyTorch's
``torch.nn.attention.flex_attention`` with an online softmax over
``(block_size, block_size)`` tiles, so that memory stays O(L · block_size);
`flex_attention_backward` its gradients, tiled the same way; and
`block_mask_to_dense` the dense mask a block-sparse description
(FlexAttention's ``BlockMask``, the torch object itself or its fields)
stands for. Mods may be written for NumPy or, as for PyTorch, for torch:
those run on torch tensors made from the tiles, and torch autograd gives
a torch ``score_mod``'s derivative, and that of a ``score_mod`` of plain
arithmetic, which runs on both (torch is imported for that alone, where
it is installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import warnings
import weakref

import numpy as np

from ._interop import is_torch_tensor, numpy_to_torch, to_numpy
from ._kernel import run_blocks, scaled_down_values
from ._online import online_update, safe_max
from ._validation import (
    as_real_array,
    check_bool,
    check_exact_ndim,
    check_fits_dtype,
    check_int,
    check_last_dim,
    check_real,
    check_shape,
    result_dtype,
)
from .backward import AttentionGrads
from .blockwise import block_sizes

__all__ = ["block_mask_to_dense", "flex_attention", "flex_attention_backward"]


# --- calling the user's functions -----------------------------------------------------------------
#
# A mod is tried on NumPy arrays first. One that raises there, or returns a torch tensor, is a mod written
# for torch (possible only once the caller has imported torch): it is evaluated on torch tensors made from
# the same arrays, on the CPU, else on the accelerator, and the device it ran on is remembered per mod.

#: The torch device each mod written for torch runs on, by mod.
_TORCH_DEVICE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _mod_name(fn, kind: str) -> str:
    """How an error names the function: its ``__name__``, or `kind` for a lambda or a nameless callable."""
    name = getattr(fn, "__name__", None)
    return kind if not isinstance(name, str) or name == "<lambda>" else f"{kind} {name!r}"


def _known_device(fn):
    """The torch device `fn` is known to run on, or None (a NumPy mod, or not seen yet)."""
    try:
        return _TORCH_DEVICE.get(fn)
    except TypeError:  # neither hashable nor weakly referenceable: never remembered
        return None


def _remember(fn, device) -> None:
    try:
        _TORCH_DEVICE[fn] = device
    except TypeError:
        pass


def _torch_devices(torch) -> list:
    """Where to try a mod not seen yet: the CPU, then the accelerator (for tensors the mod captured there)."""
    devices = [torch.device("cpu")]
    try:
        accelerator = torch.accelerator.current_accelerator(check_available=True)
    except (AttributeError, TypeError):  # an older torch
        accelerator = torch.device("cuda") if torch.cuda.is_available() else None
    return devices if accelerator is None else [*devices, accelerator]


def _as_tensor(torch, x, device):
    """`x` as a torch tensor on `device`: integers as int64, floats in their own dtype (bfloat16 and fp8 too)."""
    arr = np.asarray(x)
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)  # a copy: the mod may change its indices in place
    return numpy_to_torch(torch, arr, device)


def _failure(fn, kind: str, where: str, numpy_error, torch_errors) -> Exception:
    """The error of a mod that raised: named, typed and chained by its first exception, with every attempt."""
    first = numpy_error if numpy_error is not None else torch_errors[0][1]
    parts = [] if numpy_error is None else [f"{type(numpy_error).__name__}: {numpy_error}"
                                            + (" on NumPy arrays" if torch_errors else "")]
    parts += [f"{type(exc).__name__}: {exc} on torch tensors ({device})" for device, exc in torch_errors]
    error = TypeError if isinstance(first, TypeError) else ValueError
    failure = error(f"{_mod_name(fn, kind)} raised {' and '.join(parts)} ({where})")
    failure.__cause__ = first
    return failure


def _warn_again(caught) -> None:
    """Issue the recorded warnings `caught` again, each from where it was first raised, under the caller's filters."""
    for record in caught:
        warnings.warn_explicit(record.message, record.category, record.filename, record.lineno, source=record.source)


def _on_torch(fn, kind: str, attempt, where: str, numpy_error=None, remember: bool = True):
    """``(attempt(torch, device), device)`` on the first device it runs on: where `fn` ran last, then `_torch_devices`.

    The device is remembered for `fn` (unless `remember` is False); where every attempt raises, the error
    names `fn` and each attempt.
    """
    torch = sys.modules["torch"]
    known = _known_device(fn)

    def devices():  # the others only once the known one has failed
        if known is not None:
            yield known
        yield from (device for device in _torch_devices(torch) if device != known)

    errors = []
    for device in devices():
        try:
            result = attempt(torch, device)
        except Exception as exc:
            errors.append((device, exc))
            continue
        if remember:
            _remember(fn, device)
        return result, device
    raise _failure(fn, kind, where, numpy_error, errors)


def _call(fn, kind: str, args, where: str):
    """``fn(*args)`` on NumPy arrays, or on torch tensors for a mod written for torch; the result not checked.

    Returns ``(result, device)``: the result (an ndarray where torch computed it) and the torch device it
    ran on, None for NumPy. An exception inside `fn` is re-raised naming it, chained to the first one.
    """
    numpy_error = None
    if _known_device(fn) is None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # kept, not shown, until the mod is known to be NumPy's
            try:
                result = fn(*args)
            except Exception as exc:
                numpy_error = exc
        if numpy_error is None and not is_torch_tensor(result):
            _warn_again(caught)  # a NumPy mod: its warnings are the caller's to see
            return result, None
        # a mod written for torch: what it warned on NumPy arrays (NumPy's __array_wrap__ DeprecationWarning
        # when a tensor meets an ndarray) belongs to an attempt the caller never asked for
        if "torch" not in sys.modules:
            raise _failure(fn, kind, where, numpy_error, [])

    def attempt(torch, device):
        with torch.no_grad():
            return fn(*(_as_tensor(torch, a, device) for a in args))

    result, device = _on_torch(fn, kind, attempt, where, numpy_error)
    return (to_numpy(result, f"the result of {kind}") if is_torch_tensor(result) else result), device


def _is_torch_mod(fn, kind: str, args, where: str) -> bool:
    """Whether `fn` is a mod written for torch: known to be, or found so by calling it on `args`."""
    if _known_device(fn) is not None:
        return True
    return "torch" in sys.modules and _call(fn, kind, args, where)[1] is not None


def _autograd_slope(score_mod, scores, index, where) -> np.ndarray:
    """``d score_mod / d score`` on one tile by torch autograd, elementwise: an ndarray of `scores`' shape."""

    def attempt(torch, device):
        score = _as_tensor(torch, scores, device).detach().clone().requires_grad_(True)
        with torch.enable_grad():
            result = score_mod(score.clone(), *(_as_tensor(torch, i, device) for i in index))  # in place allowed
            if not (is_torch_tensor(result) and result.requires_grad):
                return np.zeros_like(scores)  # does not depend on the score
            (slope,) = torch.autograd.grad(result.sum(), score, allow_unused=True)
        return np.zeros_like(scores) if slope is None else to_numpy(slope, "the derivative")

    # a mod that also runs on NumPy arrays (plain arithmetic) is differentiated here, and still evaluated there
    return _on_torch(score_mod, "score_mod", attempt, f"{where}, differentiated by torch autograd",
                     remember=_known_device(score_mod) is not None)[0]


def _checked_result(fn, kind: str, result, shape: tuple[int, ...], where: str) -> np.ndarray:
    """`result` as an array that broadcasts to `shape`, else a ValueError naming the function."""
    try:
        arr = np.asarray(result)
    except (TypeError, ValueError):
        arr = None
    try:
        fits = arr is not None and np.broadcast_shapes(arr.shape, shape) == shape
    except ValueError:
        fits = False
    if not fits:
        got = f"shape {arr.shape}" if arr is not None else f"{type(result).__name__}"
        raise ValueError(f"{_mod_name(fn, kind)} must return an array that broadcasts to {shape} ({where}); "
                         f"got {got}")
    assert arr is not None  # for mypy: `fits` is False without an array
    return arr


def tile_mask(mask_mod, index, shape, where) -> np.ndarray:
    """The ``mask_mod`` of one tile: booleans broadcastable to `shape` (B, H, l, s).

    `index` holds the integer arrays ``(b, h, q_idx, kv_idx)``; a mod written for torch gets them as int64
    tensors and its result comes back as an ndarray. `where` says which tile, for the errors.
    """
    allowed = _checked_result(mask_mod, "mask_mod", _call(mask_mod, "mask_mod", index, where)[0], shape, where)
    if allowed.dtype != np.bool_:
        raise TypeError(f"{_mod_name(mask_mod, 'mask_mod')} must return booleans (True = may attend) ({where}); "
                        f"got dtype {allowed.dtype}")
    return allowed


def tile_score(score_mod, scores, index, where) -> np.ndarray:
    """``score_mod`` of one tile of `scores` (B, H, l, s), as a real array of that shape and dtype.

    A mod written for torch gets `scores` as a tensor of its dtype (bfloat16 too) and `index` as int64 tensors.
    """
    result = _call(score_mod, "score_mod", (scores, *index), where)[0]
    arr = _checked_result(score_mod, "score_mod", result, scores.shape, where)
    if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
        raise TypeError(f"{_mod_name(score_mod, 'score_mod')} must return real scores ({where}); "
                        f"got dtype {arr.dtype}")
    if result is scores:
        return scores  # the caller's own copy, changed in place or returned as it is
    return np.array(np.broadcast_to(arr, scores.shape), dtype=scores.dtype)  # a copy: the tile is overwritten later


def autograd_derivative(score_mod):
    """``score_mod``'s derivative by torch autograd, called as a ``score_mod_grad`` is (NumPy arrays in and out)."""

    def score_mod_grad(score, b, h, q_idx, kv_idx):
        return _autograd_slope(score_mod, score, (b, h, q_idx, kv_idx), "differentiated by torch autograd")

    return score_mod_grad


def choose_score_mod_derivative(score_mod, score_mod_grad, probe):
    """The derivative of `score_mod` a backward pass uses, chosen in one order for every caller.

    `score_mod_grad` when given; else the ``score_mod_grad`` attribute the package's score functions carry;
    else None, meaning torch autograd, when `score_mod` is written for torch (tried on `probe`, a pair
    ``((scores, b, h, q_idx, kv_idx), where)``, or known to be; a None `probe`, for an empty problem, tries
    nothing) or torch's autograd differentiates it on `probe` (`_torch_differentiates`). A TypeError names
    the mod otherwise.
    """
    if score_mod_grad is not None and not callable(score_mod_grad):
        raise TypeError(f"score_mod_grad must be a function or None; got {type(score_mod_grad).__name__}")
    derivative = getattr(score_mod, "score_mod_grad", None) if score_mod_grad is None else score_mod_grad
    if callable(derivative):
        return derivative
    if probe is not None and (_is_torch_mod(score_mod, "score_mod", *probe)
                              or _torch_differentiates(score_mod, *probe)):
        return None
    raise TypeError(f"{_mod_name(score_mod, 'score_mod')} has no derivative: pass score_mod_grad, the "
                    f"derivative of score_mod with respect to the score (same arguments), or write "
                    f"score_mod so that it also runs on torch tensors, with torch installed: torch's autograd "
                    f"differentiates it")


def _torch_differentiates(score_mod, args, where: str) -> bool:
    """Whether torch's autograd differentiates `score_mod`, a mod that also ran on NumPy arrays, on `args`.

    A mod of plain arithmetic (``score + (q_idx - kv_idx) * 0.01``, as FlexAttention's mods are written) runs
    on both; where torch is installed, its autograd differentiates it exactly (torch is imported for it, so
    the answer does not depend on what the caller imported). A mod that calls NumPy's functions fails on a
    tensor that requires its gradient, and has no derivative this way.
    """
    if "torch" not in sys.modules:
        if importlib.util.find_spec("torch") is None:
            return False
        importlib.import_module("torch")
    try:
        _autograd_slope(score_mod, args[0], args[1:], where)
    except (TypeError, ValueError):
        return False
    return True


def _tile_slope(score_mod, score_mod_grad, raw, index, shape, where) -> np.ndarray:
    """The derivative of ``score_mod`` at the tile's scores `raw`: ``score_mod_grad``'s, or None: torch autograd's."""
    if score_mod_grad is None:
        return _autograd_slope(score_mod, raw, index, where)
    slope = _checked_result(score_mod_grad, "score_mod_grad",
                            _call(score_mod_grad, "score_mod_grad", (raw, *index), where)[0], shape, where)
    if slope.dtype.kind not in "fiu":
        raise TypeError(f"{_mod_name(score_mod_grad, 'score_mod_grad')} must return real values ({where}); "
                        f"got dtype {slope.dtype}")
    return slope


def _tile_products(a, b):
    """``a @ b``: every matrix product a tile computes goes through here (the tests count them)."""
    return a @ b


# --- the problem ----------------------------------------------------------------------------------


class _Flex:
    """A checked FlexAttention problem: arrays in the working dtype and the index arrays of the mods."""

    def __init__(self, q, k, v, score_mod, mask_mod, scale, enable_gqa, block_size, work=None, block_mask=None):
        q, k, v = (as_real_array(a, name) for a, name in ((q, "q"), (k, "k"), (v, "v")))
        for arr, name, layout in ((q, "q", "(B, Hq, L, E)"), (k, "k", "(B, Hkv, S, E)"), (v, "v", "(B, Hkv, S, Ev)")):
            check_exact_ndim(arr, name, 4, layout)
        self.out_dtype, dtype = result_dtype(q, k, v)
        dtype = np.dtype(work or dtype)
        check_last_dim(k, "k", q.shape[-1], "q's E")
        if v.shape[:-1] != k.shape[:-1]:
            raise ValueError(f"v must have the batch, heads and length of k, {k.shape[:-1]}; got shape {v.shape}")
        if k.shape[0] not in (q.shape[0], 1):
            raise ValueError(f"k and v must have q's batch size B, or 1 (shared by the batch); got q {q.shape} and "
                             f"k {k.shape}")
        n_heads, kv_heads = q.shape[1], k.shape[1]
        enable_gqa = check_bool(enable_gqa, "enable_gqa")
        if n_heads != kv_heads and not (enable_gqa and kv_heads and n_heads % kv_heads == 0):
            need = "a multiple of" if enable_gqa else "equal to (or pass enable_gqa=True for a multiple of)"
            raise ValueError(f"q's heads Hq={n_heads} must be {need} k's heads Hkv={kv_heads}")
        for fn, kind in ((score_mod, "score_mod"), (mask_mod, "mask_mod")):
            if fn is not None and not callable(fn):
                raise TypeError(f"{kind} must be a function or None; got {type(fn).__name__}")
        self.score_mod, self.mask_mod = score_mod, mask_mod
        E = q.shape[-1]
        if scale is None:
            scale = 1.0 / math.sqrt(E) if E else 1.0
        scale = check_real(scale, "scale")
        check_fits_dtype(scale, "scale", dtype)
        self.block_q, self.block_k = block_sizes(block_size)
        self.q, self.k, self.v = (a.astype(dtype, copy=False) for a in (q, k, v))
        self.dtype = dtype
        self.scale = dtype.type(scale)
        self.B, self.H, self.L, self.S = q.shape[0], n_heads, q.shape[2], k.shape[2]
        self.kv_head = np.arange(n_heads) // (n_heads // kv_heads) if kv_heads else np.arange(0)  # (Hq,)
        self.b = np.arange(self.B).reshape(-1, 1, 1, 1)
        self.h = np.arange(n_heads).reshape(1, -1, 1, 1)
        self.blocks = None if block_mask is None else self._blocks(block_mask)

    def _blocks(self, block_mask) -> _Blocks:
        """The checked block mask, whose blocks become the tiles and whose mask_mod becomes the problem's."""
        if self.mask_mod is not None:
            raise ValueError("give mask_mod or block_mask, not both: a block mask carries its own mask_mod")
        blocks = _blocks_of(block_mask)
        if (blocks.L, blocks.S) != (self.L, self.S):
            raise ValueError(f"block_mask describes sequence lengths (L, S) = ({blocks.L}, {blocks.S}), but q and k "
                             f"have ({self.L}, {self.S})")
        for axis, (size, name) in enumerate(((self.B, "batch B"), (self.H, "query heads Hq"))):
            if blocks.partial.shape[axis] not in (1, size):
                raise ValueError(f"block_mask has {blocks.partial.shape[axis]} on the axis of the {name} = {size}; "
                                 f"it must have {size} or 1")
        self.mask_mod, self.block_q, self.block_k = blocks.mask_mod, blocks.block_q, blocks.block_k
        return blocks

    def status(self, rows: slice, cols: slice) -> np.ndarray | None:
        """What the block mask says of the tile for each (b, h), (B, Hq): 0 empty, 1 partial (the mask_mod
        decides), 2 full; None without a block mask. A tile is one block of the mask."""
        if self.blocks is None:
            return None
        partial, full = self.blocks.block(rows.start // self.block_q, cols.start // self.block_k)
        return np.broadcast_to(np.where(full, 2, np.where(partial, 1, 0)), (self.B, self.H))

    def active(self, status: np.ndarray):
        """The ``(b, h)`` whose block is not empty under a tile's `status`."""
        return [(b, h) for b, h in zip(*np.nonzero(status), strict=True)]

    def keys(self, cols: slice):
        """Keys and values of `cols` for every query head: (B, Hq, s, E), (B, Hq, s, Ev) (GQA heads repeated)."""
        return self.k[:, self.kv_head, cols], self.v[:, self.kv_head, cols]

    def tile(self, rows: slice, cols: slice):
        """``(index, shape, where)`` of one tile: the mods' arguments ``(b, h, q_idx, kv_idx)``, (B, Hq, l, s)."""
        index = (self.b, self.h, np.arange(rows.start, rows.stop).reshape(1, 1, -1, 1),
                 np.arange(cols.start, cols.stop).reshape(1, 1, 1, -1))
        shape = (self.B, self.H, rows.stop - rows.start, cols.stop - cols.start)
        where = f"on the tile of queries {rows.start}:{rows.stop} and keys {cols.start}:{cols.stop}"
        return index, shape, where

    def key_blocks(self):
        return [slice(c0, min(self.S, c0 + self.block_k)) for c0 in range(0, self.S, self.block_k)]

    def scores(self, q_rows, k_cols, rows, cols):
        """The tile's scores after ``score_mod`` and ``mask_mod``, or None when the mask hides all of it.

        Returns ``(x, raw, allowed)``: ``x`` (B, Hq, l, s) with ``-inf``
        where masked, ``raw`` the scaled scores before ``score_mod`` and
        ``allowed`` the mask (None: everything allowed). Under a block mask,
        an empty block is skipped and a full one needs no mask_mod, as
        FlexAttention skips them: neither mod is called there.
        """
        index, shape, where = self.tile(rows, cols)
        status = self.status(rows, cols)
        if status is None:
            return self._scores(q_rows, k_cols, index, shape, where, self.mask_mod)
        if not status.any():
            return None
        if (status == status.flat[0]).all():  # the same block for every (b, h): the tile at once
            return self._scores(q_rows, k_cols, index, shape, where, self.mask_mod if status.flat[0] == 1 else None)
        raw = _tile_products(q_rows, np.swapaxes(k_cols, -1, -2))
        x, allowed = np.full(shape, -np.inf, raw.dtype), np.zeros(shape, bool)
        for b, h in self.active(status):  # each (b, h) whose block is not empty, on its own
            one = (index[0][b:b + 1], index[1][:, h:h + 1], index[2], index[3])
            one_shape = (1, 1, *shape[2:])
            seen = np.ones(one_shape, bool)
            if status[b, h] == 1 and self.mask_mod is not None:
                seen = tile_mask(self.mask_mod, one, one_shape, where)
            score = raw[b:b + 1, h:h + 1]
            if self.score_mod is not None:
                score = tile_score(self.score_mod, score.copy(), one, where)
            allowed[b, h], x[b, h] = seen[0, 0], np.where(seen, score, -np.inf)[0, 0]
        return (x, raw, allowed) if allowed.any() else None

    def slope(self, score_mod, score_mod_grad, raw, rows, cols) -> np.ndarray:
        """The derivative of `score_mod` on the tile (`_tile_slope`), evaluated only on the (b, h) whose block
        is not empty under a block mask (0 elsewhere, where no weight reaches it)."""
        index, shape, where = self.tile(rows, cols)
        status = self.status(rows, cols)
        if status is None or (status == status.flat[0]).all():
            return _tile_slope(score_mod, score_mod_grad, raw, index, shape, where)
        slope = np.zeros(shape, raw.dtype)
        for b, h in self.active(status):
            one = (index[0][b:b + 1], index[1][:, h:h + 1], index[2], index[3])
            slope[b, h] = np.broadcast_to(_tile_slope(score_mod, score_mod_grad, raw[b:b + 1, h:h + 1], one,
                                                      (1, 1, *shape[2:]), where), (1, 1, *shape[2:]))[0, 0]
        return slope

    def _scores(self, q_rows, k_cols, index, shape, where, mask_mod):
        """`scores` of a tile whose every (b, h) is computed alike, with `mask_mod` (None: all allowed)."""
        allowed = None
        if mask_mod is not None:
            allowed = tile_mask(mask_mod, index, shape, where)
            if not allowed.any():
                return None  # no product, no score_mod
            if allowed.all():
                allowed = None
        raw = _tile_products(q_rows, np.swapaxes(k_cols, -1, -2))  # (B, Hq, l, s), queries already scaled
        x = raw if self.score_mod is None else tile_score(self.score_mod, raw.copy(), index, where)
        if allowed is not None:
            x = np.where(allowed, x, -np.inf)
        elif x is raw:
            x = raw.copy()  # online_update overwrites its scores
        return x, raw, allowed


def _probe(p: _Flex):
    """The first score of the problem, as `choose_score_mod_derivative` tries a mod on it; None for an empty problem.

    Under a block mask, the first score of the first block that is not empty, of one (b, h) it is computed for
    (None when every block is empty)."""
    if not (p.L and p.S):
        return None
    if p.blocks is None:
        index, shape, where = p.tile(slice(0, 1), slice(0, 1))
        return (np.zeros(shape, p.dtype), *index), where
    listed = np.broadcast_to(p.blocks.partial | p.blocks.full, (p.B, p.H, *p.blocks.partial.shape[2:]))
    if not listed.any():
        return None
    b, h, m, n = (int(i[0]) for i in np.nonzero(listed))
    rows, cols = p.blocks.span(m, n)
    index, _, where = p.tile(slice(rows.start, rows.start + 1), slice(cols.start, cols.start + 1))
    return (np.zeros((1, 1, 1, 1), p.dtype), index[0][b:b + 1], index[1][:, h:h + 1], *index[2:]), where


def _forward_block(p: _Flex, rows: slice, v_scale_exp: int, out, lse) -> None:
    """Online softmax over the key tiles for the query `rows`; writes ``out[:, :, rows]`` and ``lse[:, :, rows]``."""
    q_rows = p.q[:, :, rows] * p.scale  # (B, Hq, l, E)
    shape = q_rows.shape[:-1]
    m = np.full(shape, -np.inf, dtype=p.dtype)  # running row maximum
    total = np.zeros(shape, dtype=p.dtype)  # running sum of exp(x - m)
    acc = np.zeros((*shape, p.v.shape[-1]), dtype=p.dtype)  # running sum of exp(x - m) v
    for cols in p.key_blocks():
        k_cols, v_cols = p.keys(cols)
        tile = p.scores(q_rows, k_cols, rows, cols)
        if tile is None:
            continue
        if v_scale_exp:
            v_cols = np.ldexp(v_cols, -v_scale_exp)
        online_update(m, total, acc, tile[0], v_cols)
    seen = total != 0  # False where every key was masked or scored -inf
    np.divide(acc, total[..., None], out=out[:, :, rows], where=seen[..., None])
    out[:, :, rows][~seen] = 0.0
    if v_scale_exp:
        np.ldexp(out[:, :, rows], v_scale_exp, out=out[:, :, rows])
    np.log(total, out=total, where=seen)
    lse[:, :, rows] = np.where(seen, m + total, -np.inf)


def _forward(p: _Flex):
    """``(out, lse)`` of a checked problem in the working dtype."""
    out = np.zeros((p.B, p.H, p.L, p.v.shape[-1]), dtype=p.dtype)
    lse = np.full((p.B, p.H, p.L), -np.inf, dtype=p.dtype)

    def attend(r0):
        rows = slice(r0, min(p.L, r0 + p.block_q))
        with np.errstate(invalid="ignore", over="ignore"):  # per thread; a +inf score gives NaN, no warning
            _forward_block(p, rows, 0, out, lse)
            if not np.isfinite(out[:, :, rows]).all():
                # The running sums reach S * max|v|: redo the block with the values scaled down by a power of two.
                _forward_block(p, rows, scaled_down_values(p.v[:0], p.S)[1], out, lse)

    if p.L and p.S:
        run_blocks(attend, range(0, p.L, p.block_q), p.B * p.H * p.L * p.S)
    return out, lse


def flex_attention(q, k, v, score_mod=None, mask_mod=None, *, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, block_size=256):
    r"""Attention with any ``score_mod`` and ``mask_mod``, as PyTorch's FlexAttention, in O(L) memory.

    Parameters
    ----------
    q : array_like, shape (B, Hq, L, E)
        Queries.
    k : array_like, shape (B, Hkv, S, E)
        Keys.
    v : array_like, shape (B, Hkv, S, Ev)
        Values.
    score_mod : callable, optional
        ``score_mod(score, b, h, q_idx, kv_idx)`` returns the modified
        scores. Called on tiles: ``score`` (B, Hq, l, s) holds the scaled
        scores, ``b`` (B, 1, 1, 1), ``h`` (1, Hq, 1, 1), ``q_idx``
        (1, 1, l, 1) and ``kv_idx`` (1, 1, 1, s) are integer arrays of
        global positions; the result must broadcast to (B, Hq, l, s).
        Written with NumPy operators, ufuncs and ``np.where``, or for
        torch (see Notes).
    mask_mod : callable, optional
        ``mask_mod(b, h, q_idx, kv_idx)`` returns booleans, True where the
        query may attend to the key, broadcastable to (B, Hq, l, s).
        Integers and floats are refused. NumPy or torch, as `score_mod`.
    block_mask : BlockMask or dict, optional
        A block-sparse mask instead of `mask_mod`: torch's ``BlockMask`` or
        a dict of `block_mask_to_dense`'s keywords. Its blocks are the
        tiles (its ``BLOCK_SIZE`` replaces `block_size`): an empty block is
        skipped and neither mod is called on it, a full one is computed
        without its ``mask_mod``, a partial one with it, as FlexAttention
        computes them.
    scale : float, optional
        Multiplier of ``q @ k^T``; default ``1 / sqrt(E)``.
    enable_gqa : bool, optional
        Grouped-query attention: query head ``h`` uses key/value head
        ``h // (Hq // Hkv)``.
    return_lse : bool, optional
        Also return each row's log-sum-exp.
    block_size : int or (int, int), optional
        Tile size, queries by keys (default 256 by 256).

    Returns
    -------
    out : ndarray, shape (B, Hq, L, Ev)
        In the dtype NumPy promotion gives `q`, `k`, `v`; zeros in a row
        with no allowed key (or whose every score `score_mod` made
        ``-inf``).
    lse : ndarray, shape (B, Hq, L)
        Only with ``return_lse=True``: :math:`\log \sum_j e^{x_{ij}}` over
        the allowed keys, in the working dtype (float32 for float16 and
        bfloat16, as FlexAttention returns it); ``-inf`` for an empty row.

    Raises
    ------
    TypeError
        If an array is not real, a mod is not callable, ``mask_mod``
        returns non-booleans or ``score_mod`` non-real scores; or an
        exception of that type inside a mod (named, chained to it; for a
        mod that raises on NumPy arrays and on torch tensors, the message
        gives both and the NumPy one is chained and sets the type); or as
        `block_mask_to_dense` for `block_mask`.
    ValueError
        If the shapes do not fit together, a mod's result does not
        broadcast to its tile, or an exception of any other type is raised
        inside a mod (named, chained to it); if `block_mask` comes with
        `mask_mod`, or its lengths, batch or heads are not those of `q` and
        `k`, or as `block_mask_to_dense`.

    See Also
    --------
    flex_attention_backward : Its gradients.
    block_mask_to_dense : The dense mask of a block-sparse description.
    blockwise_attention : The same online softmax, with the fixed options.
    and_masks, or_masks, causal_mask_mod, softcap_score_mod : Building blocks.

    Notes
    -----
    With :math:`\sigma` the scale, :math:`f` the ``score_mod`` and
    :math:`M` the ``mask_mod``, the scores are

    .. math::

        x_{bhij} = \begin{cases} f(\sigma\, q_{bhi} \cdot k_{b g(h) j},
        b, h, i, j) & M(b, h, i, j) \\ -\infty & \text{otherwise,}
        \end{cases}

    with :math:`g(h) = \lfloor h / (H_q / H_{kv}) \rfloor`, and the output
    is :math:`\mathrm{softmax}(x) v`, evaluated with the online softmax of
    `blockwise_attention` over tiles of `block_size` queries by
    `block_size` keys. The mask of each tile is evaluated first: a tile it
    hides completely costs no matrix product and ``score_mod`` is not
    called on it, so a causal mask halves the work. Extra memory is one
    tile per query block, O(B Hq block_q block_k), plus the running
    state. Computed in float64 for float64 input and in float32 for
    float16, bfloat16 and float32.

    PyTorch's eager path forms the whole (L, S) matrix in the input's
    dtype; its compiled kernel skips blocks from a ``BlockMask``. Here the
    block structure is found from ``mask_mod`` itself on every call, or
    read from `block_mask` when one is given, whose empty blocks are
    skipped as the compiled kernel skips them.

    *Mods written for torch.* A mod may be the one written for PyTorch's
    FlexAttention: torch operations on torch tensors, including tensors
    it captures (document ids, a bias table). A mod that raises on NumPy
    arrays, or returns a torch tensor, is called again on torch tensors
    made from the same tile: the indices as int64, the scores in the
    working dtype (float64 for float64 input, float32 for the others, so
    that they round as a NumPy mod's would), on the CPU, or on the
    accelerator when the CPU call fails (a mod that captured CUDA
    tensors); its result is copied back to NumPy. Which mods run on torch,
    and on which device, is remembered per mod, so the NumPy attempt is
    paid once. Torch is never imported here: only a caller that imported
    it can have written such a mod. PyTorch calls a mod on 0-d tensors
    under ``vmap``; here it gets the broadcastable tiles above, on which
    torch operators, indexing by tensors, ``torch.where`` and the like
    work unchanged (Python ``if`` on a tensor, or ``.item()``, do not).

    References
    ----------
    .. [1] Dong, J., B. Feng, D. Guessous, Y. Liang and H. He, "Flex
       Attention: A Programming Model for Generating Optimized Attention
       Kernels", arXiv:2412.05496, 2024.

    Examples
    --------
    A causal mask and a soft cap give what the built-in options give:

    >>> import numpy as np
    >>> from attention_ref import (causal_mask_mod, flex_attention, scaled_dot_product_attention,
    ...                            softcap_score_mod)
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 1, 2, 5, 4))
    >>> out = flex_attention(q, k, v, softcap_score_mod(2.0), causal_mask_mod(), block_size=2)
    >>> same = scaled_dot_product_attention(q, k, v, is_causal=True, softcap=2.0)
    >>> bool(np.allclose(out, same, rtol=0, atol=1e-15))
    True

    Any function of the positions works; here a key is seen only at an
    even distance, and a row with no allowed key gets zeros and ``-inf``:

    >>> def even(b, h, q_idx, kv_idx):
    ...     return ((q_idx - kv_idx) % 2 == 0) & (q_idx < 4)
    >>> out, lse = flex_attention(q, k, v, mask_mod=even, return_lse=True)
    >>> out[0, 0, 4], lse[0, 0, 4]
    (array([0., 0., 0., 0.]), np.float64(-inf))
    """
    return_lse = check_bool(return_lse, "return_lse")
    p = _Flex(q, k, v, score_mod, mask_mod, scale, enable_gqa, block_size, block_mask=block_mask)
    out, lse = _forward(p)
    out = out.astype(p.out_dtype, copy=False)
    return (out, lse) if return_lse else out


def flex_attention_backward(q, k, v, dout, score_mod=None, mask_mod=None, *, block_mask=None, score_mod_grad=None,
                            scale=None, enable_gqa=False, block_size=256):
    r"""Gradients of `flex_attention` with respect to `q`, `k` and `v`, tile by tile.

    Parameters
    ----------
    q, k, v : array_like
        As `flex_attention`: (B, Hq, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev).
    dout : array_like, shape (B, Hq, L, Ev)
        Gradient of the loss with respect to the output.
    score_mod, mask_mod : callable, optional
        As `flex_attention`.
    block_mask : BlockMask or dict, optional
        As `flex_attention`: no mod, nor `score_mod_grad`, is called on
        an empty block.
    score_mod_grad : callable, optional
        ``score_mod_grad(score, b, h, q_idx, kv_idx)``: the derivative of
        `score_mod` with respect to its first argument, elementwise, with
        the same calling convention (NumPy or torch). Default: the
        ``score_mod_grad`` attribute the package's score functions carry;
        else, for a `score_mod` written for torch, or of plain arithmetic
        that runs on torch tensors too, its derivative by torch autograd
        where torch is installed (see Notes); required for any other
        `score_mod` (one that calls NumPy's functions).
    scale, enable_gqa, block_size
        As `flex_attention`.

    Returns
    -------
    AttentionGrads
        ``dq``, ``dk``, ``dv`` (also its first three items), in the shapes
        and dtypes of `q`, `k`, `v`; ``dbias`` and ``dsinks`` are None.

    Raises
    ------
    TypeError
        As `flex_attention`; also if `score_mod` has no derivative (one
        that calls NumPy's functions, or any without torch installed, given
        without `score_mod_grad`), or `score_mod_grad` is not callable or
        returns non-real values.
    ValueError
        As `flex_attention`; also if `dout` is not shaped as the output.

    See Also
    --------
    flex_attention : The forward pass.
    attention_backward : The gradients of the fixed options.

    Notes
    -----
    With :math:`u = \sigma\, q k^\top`, :math:`x = f(u)` (masked entries
    :math:`-\infty`), :math:`P = e^{x - \mathrm{lse}}` and
    :math:`D_i = \sum_e dO_{ie} O_{ie}`:

    .. math::

        dV &= P^\top dO, \qquad dX = P \circ (dO\, V^\top - D), \\
        dU &= dX \circ f'(u), \qquad dQ = \sigma\, dU K, \qquad
        dK = \sigma\, dU^\top Q,

    each tile recomputed from the forward's log-sum-exp as in
    FlashAttention-2's backward, tiles the mask hides skipped. With
    grouped queries, ``dK`` and ``dV`` are summed over each key/value
    head's group. Computed in float64 for float16 and bfloat16 input.

    A `score_mod` written for torch (one that raises on NumPy arrays or
    returns a torch tensor, see `flex_attention`) needs no
    `score_mod_grad`: on each tile its elementwise derivative
    :math:`f'(u)` is what ``torch.autograd.grad(f(u).sum(), u)`` gives,
    with :math:`u` the tile's scores as a tensor of the working dtype
    (float64 here for all but float32 input) that requires grad, so a
    variant is written once. So does a `score_mod` of plain arithmetic
    that also runs on NumPy arrays (``score + (q_idx - kv_idx) * 0.01``),
    where torch is installed. Its derivative is taken with respect to the
    score alone: tensors it captures get no gradient.

    Examples
    --------
    The gradient of a soft-capped causal call equals the built-in one:

    >>> import numpy as np
    >>> from attention_ref import (attention_backward, causal_mask_mod, flex_attention_backward,
    ...                            softcap_score_mod)
    >>> rng = np.random.default_rng(0)
    >>> q, k, v, dout = rng.standard_normal((4, 1, 2, 5, 3))
    >>> grads = flex_attention_backward(q, k, v, dout, softcap_score_mod(1.5), causal_mask_mod(), block_size=2)
    >>> same = attention_backward(q, k, v, dout, is_causal=True, softcap=1.5)
    >>> [bool(np.allclose(a, b, rtol=0, atol=1e-14)) for a, b in zip(grads, same[:3])]
    [True, True, True]
    >>> grads.dbias is None
    True
    """
    given = (q, k, v)
    first = result_dtype(*(as_real_array(a, name) for a, name in zip(given, "qkv", strict=True)))[0]
    work = np.float64 if first.itemsize < 4 else None  # as attention_backward: half precision worked in float64
    p = _Flex(q, k, v, score_mod, mask_mod, scale, enable_gqa, block_size, work=work, block_mask=block_mask)
    if score_mod is not None:
        score_mod_grad = choose_score_mod_derivative(score_mod, score_mod_grad, _probe(p))  # None: by torch autograd
    elif score_mod_grad is not None and not callable(score_mod_grad):
        raise TypeError(f"score_mod_grad must be a function or None; got {type(score_mod_grad).__name__}")
    dout = as_real_array(dout, "dout")
    check_shape(dout, "dout", (p.B, p.H, p.L, p.v.shape[-1]), "the shape of the output (B, Hq, L, Ev)")
    dout = dout.astype(p.dtype, copy=False)
    out, lse = _forward(p)
    dq = np.zeros_like(p.q)
    dk = np.zeros((p.B, p.H, p.S, p.q.shape[-1]), dtype=p.dtype)  # per query head; summed over groups below
    dv = np.zeros((p.B, p.H, p.S, p.v.shape[-1]), dtype=p.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.einsum("bhle,bhle->bhl", dout, out)  # D = rowsum(dO * O)
        for r0 in range(0, p.L, p.block_q):
            rows = slice(r0, min(p.L, r0 + p.block_q))
            q_rows = p.q[:, :, rows]
            q_scaled = q_rows * p.scale
            shift = safe_max(lse[:, :, rows])[..., None]  # (B, Hq, l, 1); empty rows: 0, weights exp(-inf) = 0
            for cols in p.key_blocks():
                k_cols, v_cols = p.keys(cols)
                tile = p.scores(q_scaled, k_cols, rows, cols)
                if tile is None:
                    continue
                x, raw, _ = tile
                weights = np.exp(x - shift)  # P, (B, Hq, l, s)
                dx = weights * (_tile_products(dout[:, :, rows], np.swapaxes(v_cols, -1, -2))
                                - delta[:, :, rows, None])
                if score_mod is not None:
                    slope = p.slope(score_mod, score_mod_grad, raw, rows, cols)
                    dx = np.where(dx == 0, 0.0, dx * slope).astype(p.dtype, copy=False)  # masked: 0, never 0 * inf
                dq[:, :, rows] += _tile_products(dx, k_cols) * p.scale
                dk[:, :, cols] += _tile_products(np.swapaxes(dx, -1, -2), q_rows) * p.scale
                dv[:, :, cols] += _tile_products(np.swapaxes(weights, -1, -2), dout[:, :, rows])
    kv_batch, kv_heads = p.k.shape[:2]
    group = p.H // kv_heads if kv_heads else 1

    def to_kv(grad):
        """(B, Hq, S, .) -> (Bkv, Hkv, S, .): summed over each key/value head's group, and a shared batch."""
        grad = grad.reshape(p.B, kv_heads, group, p.S, -1).sum(axis=2)
        return grad.sum(axis=0, keepdims=True) if kv_batch == 1 else grad

    dk, dv = to_kv(dk), to_kv(dv)
    grads = [np.asarray(g, dtype=as_real_array(a, name).dtype) for g, a, name in zip((dq, dk, dv), given, "qkv",
                                                                                       strict=True)]
    return AttentionGrads(*grads, None, None)


def _kv_blocks(num, indices, name: str, n_blocks: int, shape: tuple[int, ...]) -> np.ndarray:
    """Which key blocks each (b, h, query block) lists: bool (B, H, nQ, n_blocks) from counts and indices."""
    num = to_numpy(num, name.split("/")[0])
    indices = to_numpy(indices, name.split("/")[1])
    if num.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
        raise TypeError(f"{name} counts and indices must be integer arrays; got {num.dtype} and {indices.dtype}")
    if num.ndim != 3 or indices.ndim != 4 or indices.shape[:3] != num.shape:
        raise ValueError(f"{name}: the counts must be (B, H, n_q_blocks) and the indices (B, H, n_q_blocks, "
                         f"max_blocks) with the same first three axes; got {num.shape} and {indices.shape}")
    if num.shape != shape:
        raise ValueError(f"{name}: the counts must have shape {shape} (the batch, heads and query blocks of "
                         f"kv_num_blocks for these seq_lengths); got {num.shape}")
    if (num < 0).any() or (num > indices.shape[-1]).any():
        raise ValueError(f"{name}: every count must be between 0 and {indices.shape[-1]} (the indices' last axis); "
                         f"got {int(num.min())} to {int(num.max())}")
    used = np.arange(indices.shape[-1]) < num[..., None]  # (B, H, nQ, max): entries past each count are ignored
    listed = indices[used]
    if listed.size and (listed.min() < 0 or listed.max() >= n_blocks):
        raise ValueError(f"{name}: a listed key block must be in [0, {n_blocks}); got {int(listed.min())} to "
                         f"{int(listed.max())}")
    out = np.zeros((*shape, n_blocks), dtype=bool)
    where = np.nonzero(used)
    out[(*where[:3], indices[where])] = True
    return out


#: block_mask_to_dense's keywords: the fields of torch's BlockMask it reads, and whether each is required.
_BLOCK_MASK_FIELDS = {"kv_num_blocks": True, "kv_indices": True, "full_kv_num_blocks": False,
                      "full_kv_indices": False, "BLOCK_SIZE": True, "mask_mod": False, "seq_lengths": True}


def _block_mask_fields(block_mask) -> dict:
    """The keywords of `block_mask_to_dense` from a torch ``BlockMask`` (read by its attributes) or a dict."""
    if isinstance(block_mask, dict):
        unknown = sorted(set(block_mask) - set(_BLOCK_MASK_FIELDS), key=str)
        if unknown:
            raise TypeError(f"block_mask as a dict takes the keywords {', '.join(_BLOCK_MASK_FIELDS)}; got "
                            f"{', '.join(map(repr, unknown))}")
        return dict(block_mask)
    if not all(hasattr(block_mask, name) for name in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE")):
        raise TypeError(f"block_mask must be a torch BlockMask (torch.nn.attention.flex_attention) or a dict of "
                        f"block_mask_to_dense's keywords; got {type(block_mask).__name__}")
    fields = {name: getattr(block_mask, name, None) for name in _BLOCK_MASK_FIELDS}
    if fields["seq_lengths"] is None:
        raise TypeError("block_mask has no seq_lengths (an older torch's BlockMask): pass its fields as keywords, "
                        "with seq_lengths=(L, S)")
    return fields


def block_mask_to_dense(block_mask=None, /, *, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None,
                        full_kv_indices=None, BLOCK_SIZE=None, mask_mod=None, seq_lengths=None):
    r"""The dense boolean mask that a block-sparse description (FlexAttention's ``BlockMask``) stands for.

    Takes either PyTorch's ``torch.nn.attention.flex_attention.BlockMask``
    itself (or a dict of the keywords) as its one positional argument, or
    the keywords, which are that object's fields (as
    ``BlockMask.from_kv_blocks`` names them) as arrays. Query block ``m``
    of batch ``b`` and head ``h`` computes the key blocks
    ``kv_indices[b, h, m, :kv_num_blocks[b, h, m]]`` with `mask_mod`
    (partial blocks) and ``full_kv_indices[b, h, m,
    :full_kv_num_blocks[b, h, m]]`` without it (full blocks).

    Parameters
    ----------
    block_mask : BlockMask or dict, optional
        A ``BlockMask`` (from ``create_block_mask`` or
        ``BlockMask.from_kv_blocks``; any device): its ``kv_num_blocks``,
        ``kv_indices``, ``full_kv_num_blocks``, ``full_kv_indices``,
        ``BLOCK_SIZE``, ``mask_mod`` and ``seq_lengths`` are read as the
        keywords below (tensors copied to NumPy exactly, its ``mask_mod``
        written for torch). Or a dict of the keywords. Positional only,
        and never together with a keyword.
    kv_num_blocks : array_like of int, shape (B, H, n_q_blocks)
        How many partial key blocks each query block lists. Required
        without `block_mask`.
    kv_indices : array_like of int, shape (B, H, n_q_blocks, max_blocks)
        Their indices; entries past each row's count are ignored.
        Required without `block_mask`.
    full_kv_num_blocks, full_kv_indices : array_like of int, optional
        The same for full blocks (all True), shaped as the two above.
    BLOCK_SIZE : int or (int, int)
        ``(Q, KV)`` rows and columns per block (one int for both).
        Required without `block_mask`.
    mask_mod : callable, optional
        ``mask_mod(b, h, q_idx, kv_idx)`` of the partial blocks, called as
        `flex_attention` calls it (written for NumPy or for torch); None:
        partial blocks are all True.
    seq_lengths : (int, int)
        ``(L, S)``; need not be multiples of the block sizes. Required
        without `block_mask`.

    Returns
    -------
    ndarray of bool, shape (B, H, L, S)
        True where the description lets query ``i`` attend to key ``j``;
        blocks not listed are False. A ``BlockMask`` made with ``B=None``
        or ``H=None`` has 1 there, which broadcasts.

    Raises
    ------
    TypeError
        If `block_mask` is neither a ``BlockMask`` nor a dict of the
        keywords, it comes with keywords, a required keyword is missing,
        counts or indices are not integers, or `mask_mod` returns
        non-booleans.
    ValueError
        If shapes disagree with each other or with `seq_lengths`, a count
        exceeds the indices' last axis, or a listed block is out of range.

    See Also
    --------
    flex_attention : Where a ``mask_mod`` is evaluated tile by tile.

    Notes
    -----
    ``create_block_mask`` rounds the lengths up to whole blocks while it
    finds the blocks; ``BlockMask.seq_lengths`` keeps the real ``(L, S)``,
    and `mask_mod` is only called on positions below them, so a document
    mask indexing ``L`` document ids works here too::

        from torch.nn.attention.flex_attention import create_block_mask
        doc_ids = torch.tensor(...)                    # (L,), L = S
        def document(b, h, q_idx, kv_idx):
            return doc_ids[q_idx] == doc_ids[kv_idx]
        block_mask = create_block_mask(document, None, None, L, L, device="cpu")
        dense = block_mask_to_dense(block_mask)        # (1, 1, L, L)

    Examples
    --------
    Two query blocks of two rows over three key blocks: the first lists key
    block 0 as partial under a causal mask, the second lists block 1 as
    partial and block 0 as full; block 2 is never listed.

    >>> import numpy as np
    >>> from attention_ref import block_mask_to_dense, causal_mask_mod
    >>> fields = dict(kv_num_blocks=np.array([[[1, 1]]]), kv_indices=np.array([[[[0, 2], [1, 2]]]]),
    ...               full_kv_num_blocks=np.array([[[0, 1]]]), full_kv_indices=np.array([[[[0], [0]]]]),
    ...               BLOCK_SIZE=2, mask_mod=causal_mask_mod(), seq_lengths=(4, 5))
    >>> dense = block_mask_to_dense(**fields)
    >>> dense[0, 0].astype(int)
    array([[1, 0, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [1, 1, 1, 0, 0],
           [1, 1, 1, 1, 0]])

    The same fields as one dict (as a ``BlockMask`` is passed):

    >>> bool(np.array_equal(block_mask_to_dense(fields), dense))
    True
    """
    return _dense_mask(_blocks_of(block_mask, kv_num_blocks=kv_num_blocks, kv_indices=kv_indices,
                                  full_kv_num_blocks=full_kv_num_blocks, full_kv_indices=full_kv_indices,
                                  BLOCK_SIZE=BLOCK_SIZE, mask_mod=mask_mod, seq_lengths=seq_lengths))


class _Blocks:
    """A checked block-sparse description: which key blocks each (b, h, query block) computes, as FlexAttention
    reads a ``BlockMask``.

    ``partial`` and ``full`` are bool (B, H, n_q_blocks, n_k_blocks) (B and H may be 1, broadcast): a partial
    block is computed with ``mask_mod`` (None: all True), a full one without it; a block in neither is empty.
    """

    def __init__(self, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, BLOCK_SIZE, mask_mod,
                 seq_lengths):
        if isinstance(BLOCK_SIZE, (tuple, list)) and len(BLOCK_SIZE) == 2:
            self.block_q = check_int(BLOCK_SIZE[0], "BLOCK_SIZE[0] (Q)", minimum=1)
            self.block_k = check_int(BLOCK_SIZE[1], "BLOCK_SIZE[1] (KV)", minimum=1)
        else:
            self.block_q = self.block_k = check_int(BLOCK_SIZE, "BLOCK_SIZE", minimum=1)
        if not isinstance(seq_lengths, (tuple, list)) or len(seq_lengths) != 2:
            raise ValueError(f"seq_lengths must be a pair (L, S); got {seq_lengths!r}")
        self.L = check_int(seq_lengths[0], "seq_lengths[0] (L)", minimum=0)
        self.S = check_int(seq_lengths[1], "seq_lengths[1] (S)", minimum=0)
        if mask_mod is not None and not callable(mask_mod):
            raise TypeError(f"mask_mod must be a function or None; got {type(mask_mod).__name__}")
        self.mask_mod = mask_mod
        counts = to_numpy(kv_num_blocks, "kv_num_blocks")
        if counts.ndim != 3:
            raise ValueError(f"kv_num_blocks must have shape (B, H, n_q_blocks); got {counts.shape}")
        n_q, n_k = -(-self.L // self.block_q), -(-self.S // self.block_k)
        shape = (*counts.shape[:2], n_q)
        self.partial = _kv_blocks(kv_num_blocks, kv_indices, "kv_num_blocks/kv_indices", n_k, shape)
        if (full_kv_num_blocks is None) != (full_kv_indices is None):
            raise ValueError("full_kv_num_blocks and full_kv_indices must be given together")
        self.full = np.zeros_like(self.partial) if full_kv_num_blocks is None else _kv_blocks(
            full_kv_num_blocks, full_kv_indices, "full_kv_num_blocks/full_kv_indices", n_k, shape)

    def block(self, m: int, n: int):
        """``(partial, full)`` of query block `m` and key block `n`: bool (B, H) each."""
        return self.partial[:, :, m, n], self.full[:, :, m, n]

    def span(self, m: int, n: int) -> tuple[slice, slice]:
        """The query rows and key columns of block ``(m, n)``."""
        return (slice(m * self.block_q, min(self.L, (m + 1) * self.block_q)),
                slice(n * self.block_k, min(self.S, (n + 1) * self.block_k)))


def _blocks_of(block_mask=None, **keywords) -> _Blocks:
    """The `_Blocks` of a torch ``BlockMask`` or a dict of `block_mask_to_dense`'s keywords, or of the keywords."""
    keywords = {name: keywords.get(name) for name in _BLOCK_MASK_FIELDS}
    if block_mask is not None:
        given = [name for name, value in keywords.items() if value is not None]
        if given:
            raise TypeError(f"block_mask_to_dense takes a block_mask or keywords, not both; got a "
                            f"{type(block_mask).__name__} and {', '.join(given)}")
        keywords.update(_block_mask_fields(block_mask))
    missing = [name for name, required in _BLOCK_MASK_FIELDS.items() if required and keywords[name] is None]
    if missing:
        raise TypeError(f"block_mask_to_dense needs a block_mask or the keywords {', '.join(missing)}")
    return _Blocks(**keywords)


def _dense_mask(blocks: _Blocks) -> np.ndarray:
    """`block_mask_to_dense` of checked `blocks`."""
    B, H, n_q, n_k = blocks.partial.shape
    dense = np.zeros((B, H, blocks.L, blocks.S), dtype=bool)
    b, h = np.arange(B).reshape(-1, 1, 1, 1), np.arange(H).reshape(1, -1, 1, 1)
    for m in range(n_q):
        for n in range(n_k):
            rows, cols = blocks.span(m, n)
            partial, full = blocks.block(m, n)
            tile = full[:, :, None, None]  # (B, H, 1, 1)
            if partial.any():
                allowed: np.ndarray | bool = True
                if blocks.mask_mod is not None:
                    index = (b, h, np.arange(rows.start, rows.stop).reshape(1, 1, -1, 1),
                             np.arange(cols.start, cols.stop).reshape(1, 1, 1, -1))
                    where = f"on the block of queries {rows.start}:{rows.stop} and keys {cols.start}:{cols.stop}"
                    allowed = tile_mask(blocks.mask_mod, index, (B, H, rows.stop - rows.start,
                                                                 cols.stop - cols.start), where)
                tile = tile | (partial[:, :, None, None] & allowed)
            dense[:, :, rows, cols] = tile
    return dense
