"""Benchmark attention_ref against PyTorch's CPU kernel, side by side in one run.

Prints a table and, with ``--write PATH``, records the figures (and the machine
they ran on) as JSON for the book's Performance chapter. Run it with
``make bench``; timings are the best of several repeats, interleaved so that
both implementations see the same machine load. Ratios are what to quote.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

import attention_ref as ar

SHAPE_BH = (1, 8)  # batch, heads
E = 64
LENGTHS = (512, 1024, 2048)
DTYPES = ("float32", "float64")


def machine() -> dict:
    """Describe the machine: CPU model, cores, library versions and BLAS."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "load_average": list(os.getloadavg()),  # 1, 5 and 15 minutes, at the start: others' work slows every call
    }
    try:
        from threadpoolctl import threadpool_info

        blas = [f"{p['internal_api']} {p['version']} ({p.get('architecture')}, {p['num_threads']} threads)"
                for p in threadpool_info()]
        info["blas"] = "; ".join(blas)
    except ImportError:
        info["blas"] = "unknown (threadpoolctl not installed)"
    try:
        import torch

        info["torch"] = f"{torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        info["torch"] = None
    return info


def best_time(fn, repeats: int) -> float:
    """Best wall time of `repeats` calls (seconds), after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_kernels(repeats: int) -> list[dict]:
    """Time dense, blockwise and torch SDPA at (1, 8, L, 64), L = S."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    rows = []
    rng = np.random.default_rng(0)
    for dtype in DTYPES:
        for L in LENGTHS:
            q, k, v = (rng.standard_normal((*SHAPE_BH, L, E)).astype(dtype) for _ in range(3))
            cands = {
                "dense": lambda q=q, k=k, v=v: ar.scaled_dot_product_attention(q, k, v),
                "blockwise": lambda q=q, k=k, v=v: ar.blockwise_attention(q, k, v),
            }
            if torch is not None:
                t = [torch.from_numpy(a) for a in (q, k, v)]
                cands["torch"] = lambda t=t: F.scaled_dot_product_attention(*t)
            # Interleave: every candidate once per round, best of the rounds.
            best = {name: float("inf") for name in cands}
            for fn in cands.values():
                fn()
            for _ in range(repeats):
                for name, fn in cands.items():
                    t0 = time.perf_counter()
                    fn()
                    best[name] = min(best[name], time.perf_counter() - t0)
            row = {"dtype": dtype, "L": L, **{f"{n}_s": t for n, t in best.items()}}
            if "torch" in best:
                row["dense_ratio"] = best["dense"] / best["torch"]
                row["blockwise_ratio"] = best["blockwise"] / best["torch"]
            rows.append(row)
            gc.collect()
    return rows



#: The shapes an oracle is called with (issue 22): (name, (B, H, L, S, E), options).
SHAPES = (
    ("square", (1, 8, 1024, 1024, 64), {}),
    ("causal", (1, 8, 1024, 1024, 64), {"is_causal": True}),
    ("decode", (1, 32, 1, 4096, 128), {}),
    ("boolean mask", (1, 8, 512, 512, 64), {"mask": True}),
    ("small", (2, 8, 128, 128, 64), {}),
    ("tiny", (1, 1, 16, 16, 32), {}),
    ("long causal", (1, 4, 4096, 4096, 64), {"is_causal": True}),
)
QUICK_SKIP = ("long causal",)  # --quick leaves out the one shape that takes seconds per call
#: multi_head_attention at a model-like shape: batch, length, d_model, heads.
MHA_SHAPE = (4, 256, 512, 8)


def _interleaved(cands: dict, repeats: int, number: int = 1) -> dict:
    """Best time (s) of one call of each candidate, every candidate once per round so all see the same load.

    A round times `number` calls of each candidate in a row (for calls too short to time one by one).
    """
    best = {name: float("inf") for name in cands}
    for fn in cands.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in cands.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / number)
    return best


#: Shortest timed sample (s): calls shorter than this are timed several in a row (timer and loop cost).
MIN_SAMPLE_S = 2e-3


def _calls_per_sample(cands: dict) -> int:
    """Calls per timed sample so that the slowest candidate's sample lasts about `MIN_SAMPLE_S` (1 for long calls)."""
    slowest = 0.0
    for fn in cands.values():
        fn()  # the first call pays for imports and caches
        t0 = time.perf_counter()
        fn()
        slowest = max(slowest, time.perf_counter() - t0)
    return max(1, int(MIN_SAMPLE_S / slowest))


def _timed_row(cands: dict, repeats: int, **fields) -> dict:
    """`fields` with each candidate's best time per call (``<name>_s``), its ratio to torch's (``<name>_ratio``)
    and the calls per timed sample."""
    number = _calls_per_sample(cands)
    best = _interleaved(cands, repeats, number)
    row = {**fields, "calls_per_sample": number, **{f"{n}_s": t for n, t in best.items()}}
    if "torch" in best:
        row.update({f"{n}_ratio": t / best["torch"] for n, t in best.items() if n != "torch"})
    return row


def _decode_call(q, k, v):
    """``decode_step`` of the last position on a cache holding the others, the cache rewound after each call."""
    last_k, last_v = k[..., -1:, :], v[..., -1:, :]
    cache = ar.KVCache(k[..., :-1, :], v[..., :-1, :])
    cache.append(last_k, last_v)  # grows the buffers once, so that no timed call copies the cache
    k_buffer, v_buffer, start, end = cache._state()
    state = (k_buffer, v_buffer, start, end - 1)  # the cache before the last position, in the grown buffers
    cache._restore(state)

    def call():
        out = ar.decode_step(q, last_k, last_v, cache)
        cache._restore(state)  # drop the appended position: every call attends the same S keys
        return out

    return call


#: Queries per block of the products-alone timing (the shapes' last column).
GEMM_ROWS = 512


def _gemm_call(q, k, v, rows: int = GEMM_ROWS):
    """The two matrix products of attention alone, in blocks of `rows` queries: a floor no NumPy kernel beats.

    ``q k^T`` into a reused score buffer and that buffer times ``v``, with BLAS on its own threads; no
    exponential, no normalisation, and every score computed (a causal kernel may skip half).
    """
    L, S = q.shape[-2], k.shape[-2]
    n = min(L, rows)
    scores = np.empty((*q.shape[:-2], n, S), dtype=q.dtype)
    out = np.empty((*q.shape[:-2], n, v.shape[-1]), dtype=q.dtype)
    kt = np.swapaxes(k, -1, -2)

    def call():
        for r0 in range(0, L, n):
            m = min(n, L - r0)
            np.matmul(q[..., r0:r0 + m, :], kt, out=scores[..., :m, :])
            np.matmul(scores[..., :m, :], v, out=out[..., :m, :])

    return call


def _shape_candidates(shape, options, dtype, rng):
    """The package's calls, PyTorch's and the arrays, for one benchmark shape."""
    B, H, L, S, E_ = shape
    q = rng.standard_normal((B, H, L, E_)).astype(dtype)
    k, v = (rng.standard_normal((B, H, S, E_)).astype(dtype) for _ in range(2))
    kw = {}
    if options.get("is_causal"):
        kw["is_causal"] = True
    if options.get("mask"):
        kw["mask"] = rng.random((L, S)) < 0.9  # random keys hidden, as padding or a sparse pattern would
        kw["mask"][:, 0] = True  # no row fully masked
    cands = {
        "sdpa": lambda: ar.scaled_dot_product_attention(q, k, v, **kw),
        "blockwise": lambda: ar.blockwise_attention(q, k, v, **kw),
    }
    if L == 1 and not kw:
        cands["decode_step"] = _decode_call(q, k, v)
    torch_call = None
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        pass
    else:
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        tkw = {"is_causal": kw.get("is_causal", False)}
        if "mask" in kw:
            tkw["attn_mask"] = torch.from_numpy(kw["mask"])
        torch_call = lambda: F.scaled_dot_product_attention(tq, tk, tv, **tkw)  # noqa: E731
        expected = torch_call().numpy()
        for name, fn in cands.items():
            got = fn()
            assert np.allclose(got, expected, rtol=1e-4, atol=1e-5), f"{name} disagrees with torch at {shape}"
        cands["torch"] = torch_call
    cands["gemm"] = _gemm_call(q, k, v)
    return cands


def _mha_candidates(dtype, rng):
    """multi_head_attention and torch.nn.MultiheadAttention with the same weights, self-attention."""
    batch, L, d_model, heads = MHA_SHAPE
    params = ar.init_multi_head_params(rng, d_model, heads, dtype=np.dtype(dtype))
    x = rng.standard_normal((batch, L, d_model)).astype(dtype)
    cands = {"multi_head_attention": lambda: ar.multi_head_attention(x, params)}
    try:
        import torch
    except ImportError:
        return cands
    mha = torch.nn.MultiheadAttention(d_model, heads, batch_first=True, dtype=getattr(torch, dtype))
    with torch.no_grad():  # ours is x @ w; torch's Linear is x @ weight.T
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([params.w_q, params.w_k, params.w_v], 1).T))
        mha.in_proj_bias.copy_(torch.from_numpy(np.concatenate([params.b_q, params.b_k, params.b_v])))
        mha.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(params.w_o.T)))
        mha.out_proj.bias.copy_(torch.from_numpy(params.b_o))
    mha.eval()
    tx = torch.from_numpy(x)

    def torch_call():
        with torch.inference_mode():
            return mha(tx, tx, tx, need_weights=False)[0]

    assert np.allclose(cands["multi_head_attention"](), torch_call().numpy(), rtol=1e-4, atol=1e-5)
    cands["torch"] = torch_call
    return cands


def bench_shapes(repeats: int, quick: bool = False) -> list[dict]:
    """Every shape of SHAPES (and multi-head attention) in both dtypes: times and ratios against torch."""
    rows = []
    rng = np.random.default_rng(3)
    cases = [(name, shape, opts) for name, shape, opts in SHAPES if not (quick and name in QUICK_SKIP)]
    cases.append(("multi-head", (MHA_SHAPE[0], MHA_SHAPE[3], MHA_SHAPE[1], MHA_SHAPE[1],
                                 MHA_SHAPE[2] // MHA_SHAPE[3]), {"mha": True}))
    for dtype in DTYPES:
        for name, shape, opts in cases:
            cands = _mha_candidates(dtype, rng) if opts.get("mha") else _shape_candidates(shape, opts, dtype, rng)
            rows.append(_timed_row(cands, repeats, case=name, shape=list(shape), dtype=dtype))
            del cands
            gc.collect()
    return rows


#: The tiny call's profile: calls per timed sample.
TINY_CALLS = 200


def _tiny_candidates(q, k, v) -> dict:
    """The tiny call and its parts: argument checking, the kernel, the textbook formula in NumPy and one exp."""
    from attention_ref._kernel import dense_attention
    from attention_ref.attention import prepare_attention

    problem = prepare_attention(q, k, v)
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = q @ np.swapaxes(k, -1, -2) * scale

    def formula():  # softmax(q k^T scale) v: two products, max, subtract, exp, sum, divide; no checks, no guards
        s = q @ np.swapaxes(k, -1, -2) * scale
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        return w / w.sum(axis=-1, keepdims=True) @ v

    return {
        "sdpa": lambda: ar.scaled_dot_product_attention(q, k, v),
        "prepare": lambda: prepare_attention(q, k, v),  # the arguments checked and normalised
        "kernel": lambda: dense_attention(problem),  # the output from checked arguments
        "numpy": formula,
        "one_exp": lambda: np.exp(scores),  # one NumPy call on the (L, S) scores: the cost of a call of this size
    }


def bench_tiny_profile(repeats: int) -> list[dict]:
    """Where a tiny call's time goes: its parts against the bare NumPy formula, interleaved, per dtype."""
    shape = next(s for name, s, _ in SHAPES if name == "tiny")
    B, H, L, S, E_ = shape
    rng = np.random.default_rng(5)
    rows = []
    for dtype in DTYPES:
        q = rng.standard_normal((B, H, L, E_)).astype(dtype)
        k, v = (rng.standard_normal((B, H, S, E_)).astype(dtype) for _ in range(2))
        best = _interleaved(_tiny_candidates(q, k, v), repeats, TINY_CALLS)
        rows.append({"dtype": dtype, "shape": list(shape), **{f"{n}_s": t for n, t in best.items()}})
    return rows


def fmt_tiny_profile(rows: list[dict]) -> str:
    """The tiny call's profile in microseconds."""
    names = ("sdpa", "prepare", "kernel", "numpy", "one_exp")
    return "tiny call (us): " + "; ".join(
        r["dtype"] + " " + ", ".join(f"{n} {1e6 * r[n + '_s']:.1f}" for n in names) for r in rows)


def fmt_shapes(rows: list[dict]) -> str:
    """The shape benchmark as a fixed-width table: ours/torch per function, torch's time."""
    impls = ("sdpa", "blockwise", "decode_step", "multi_head_attention", "gemm")
    head = f"{'case':13} {'dtype':8} {'torch ms':>9} " + " ".join(f"{i[:11]:>11}" for i in impls)
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.get("torch_s")
        cells = [f"{r[i + '_ratio']:>10.2f}x" if i + "_ratio" in r else f"{'-':>11}" for i in impls]
        lines.append(f"{r['case']:13} {r['dtype']:8} " + (f"{1e3 * t:>9.3f} " if t else f"{'-':>9} ") + " ".join(cells))
    return "\n".join(lines)


WINDOW = (4096, 0)


def _traced(fn) -> tuple[np.ndarray, float, float]:
    """Run `fn()` under tracemalloc: its result, wall time (s) and peak memory growth (bytes)."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return out, seconds, peak


def bench_memory(n: int, block_size: int | None) -> dict:
    """Peak memory growth (tracemalloc) of causal blockwise attention at L = S = n, E = 64, float64."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((n, E)) for _ in range(3))
    kwargs = {} if block_size is None else {"block_size": block_size}
    out, seconds, peak = _traced(lambda: ar.blockwise_attention(q, k, v, is_causal=True, **kwargs))
    assert np.isfinite(out).all()
    return {
        "n": n,
        "peak_growth_MiB": peak / 2**20,
        "output_MiB": out.nbytes / 2**20,
        "dense_scores_MiB": n * n * 8 / 2**20,
        "seconds": seconds,
    }


def bench_window(n: int, window: tuple[int, int] = WINDOW) -> dict:
    """Blockwise attention at L = S = n, E = 64, float32, with `window` and without, side by side.

    The same single-head call as the long run, in float32: once with ``window=window`` and once with no window
    and no mask (every key), each timed and traced for peak memory in turn.
    """
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((n, E)).astype(np.float32) for _ in range(3))
    out_w, windowed_s, windowed_peak = _traced(lambda: ar.blockwise_attention(q, k, v, window=window))
    del out_w
    out_f, full_s, full_peak = _traced(lambda: ar.blockwise_attention(q, k, v))
    assert np.isfinite(out_f).all()
    # The last query's window holds left + 1 keys: the windowed row there equals a dense call on those keys.
    left = window[0]
    out_w = ar.blockwise_attention(q[-3:], k, v, window=window, causal_alignment="bottom-right")
    tail = ar.scaled_dot_product_attention(q[-1:], k[-left - 1:], v[-left - 1:])
    assert np.allclose(out_w[-1:], tail, rtol=1e-5, atol=1e-6)
    return {
        "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
        "n": n,
        "E": E,
        "dtype": "float32",
        "window": list(window),
        "windowed_s": windowed_s,
        "full_s": full_s,
        "windowed_peak_MiB": windowed_peak / 2**20,
        "full_peak_MiB": full_peak / 2**20,
        "output_MiB": out_f.nbytes / 2**20,
        "time_ratio": full_s / windowed_s,
    }


def bench_flex(n: int) -> dict:
    """flex_attention at L = S = n, E = 64, float64, one head: no mask, a mask hiding half the tiles, causal.

    The half mask is two documents of n / 2 positions (`document_mask_mod`): it hides exactly the two
    off-diagonal quarters, half of the (256, 256) tiles, which cost no product. Each call timed and traced.
    """
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, n, E)) for _ in range(3))
    mods = {"full": None, "half": ar.document_mask_mod(np.repeat([0, 1], [n // 2, n - n // 2])),
            "causal": ar.causal_mask_mod()}
    row: dict = {"recorded": time.strftime("%Y-%m-%d", time.gmtime()), "n": n, "E": E, "dtype": "float64",
                 "dense_scores_MiB": n * n * 8 / 2**20}
    for name, mask_mod in mods.items():
        out, seconds, peak = _traced(lambda mask_mod=mask_mod: ar.flex_attention(q, k, v, mask_mod=mask_mod))
        assert np.isfinite(out).all()
        row[f"{name}_s"], row[f"{name}_peak_MiB"] = seconds, peak / 2**20
    row["half_over_full"] = row["half_s"] / row["full_s"]
    return row


def fmt_flex(r: dict) -> str:
    return "\n".join(
        f"flex_attention L=S={r['n']} E={r['E']} float64 {name}: {r[f'{name}_s']:.1f} s, "
        f"peak growth {r[f'{name}_peak_MiB']:.1f} MiB" for name in ("full", "half", "causal")
    ) + (f"\nhalf-masked / full time: {r['half_over_full']:.2f} "
         f"(dense scores would need {r['dense_scores_MiB']:.0f} MiB)")


#: The tiled backward's block size in the benchmark (its time and its traced peak at --memory-n).
BACKWARD_BLOCK = 512


def _backward_candidates(q, k, v, dout, is_causal):
    """attention_backward dense and tiled (given the forward's out and lse) and PyTorch autograd's SDPA backward."""
    out, lse = ar.blockwise_attention(q, k, v, is_causal=is_causal, return_lse=True)
    cands = {
        "dense": lambda: ar.attention_backward(q, k, v, dout, is_causal=is_causal, out=out, lse=lse),
        "tiled": lambda: ar.attention_backward(q, k, v, dout, is_causal=is_causal, out=out, lse=lse,
                                               block_size=BACKWARD_BLOCK),
    }
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return cands
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    t_out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=is_causal)  # the forward, once, outside the timing
    t_dout = torch.from_numpy(dout)

    def torch_call():
        return torch.autograd.grad(t_out, (tq, tk, tv), t_dout, retain_graph=True)

    expected = torch_call()
    for name, fn in cands.items():
        got = fn()
        for mine, theirs in zip(got[:3], expected, strict=True):
            assert np.allclose(mine, theirs.numpy(), rtol=1e-3, atol=1e-4), f"backward {name} disagrees with torch"
    cands["torch"] = torch_call
    return cands


#: The paged-cache row: sequences, their longest cache, the page size and the heads (query, key/value) at E = 64.
PAGED = {"sequences": 64, "max_len": 4096, "page_size": 16, "heads": (8, 2), "queries": 1}


def _paged_problem(rng, dtype="float32"):
    """A decode batch over a shuffled page pool: q (B, Hq, 1, E), the pools, the block table and kv_lens."""
    B, page_size, (hq, hkv) = PAGED["sequences"], PAGED["page_size"], PAGED["heads"]
    kv_lens = rng.integers(1, PAGED["max_len"] + 1, size=B)
    kv_lens[:2] = (1, PAGED["max_len"])  # both ends of the range
    n_pages = -(-kv_lens // page_size)
    order = rng.permutation(int(n_pages.sum()))
    table = np.full((B, int(n_pages.max())), -1, dtype=np.int64)
    for b, (start, n) in enumerate(zip(np.cumsum(n_pages) - n_pages, n_pages, strict=True)):
        table[b, :n] = order[start : start + n]
    k_pages, v_pages = (rng.standard_normal((order.size, hkv, page_size, E)).astype(dtype) for _ in range(2))
    q = rng.standard_normal((B, hq, PAGED["queries"], E)).astype(dtype)
    return q, k_pages, v_pages, table, kv_lens


def _gather_then_varlen(q, k_pages, v_pages, table, kv_lens):
    """What a user does without paged_attention: gather every sequence's keys and values, pack them, call varlen."""
    page_size = k_pages.shape[2]
    n_pages = -(-kv_lens // page_size)
    pages = np.concatenate([table[b, :n] for b, n in enumerate(n_pages)])  # every used page, in order
    first = np.concatenate([[0], np.cumsum(n_pages)[:-1]]) * page_size  # each sequence's first gathered slot
    slots = np.concatenate([f + np.arange(n) for f, n in zip(first, kv_lens, strict=True)])  # drop unused tails
    k, v = (np.swapaxes(pool[pages], 0, 1).reshape(pool.shape[1], -1, E)[:, slots] for pool in (k_pages, v_pages))
    B, hq, lq, _ = q.shape
    packed_q = np.swapaxes(q, 0, 1).reshape(hq, B * lq, E)  # (Hq, B * Lq, E)
    cu_q = np.arange(0, B * lq + 1, lq)
    cu_k = np.concatenate([[0], np.cumsum(kv_lens)])
    out = ar.varlen_attention(packed_q, k, v, cu_q, cu_k, enable_gqa=True)
    return np.swapaxes(out.reshape(hq, B, lq, -1), 0, 1)  # (B, Hq, Lq, Ev)


def bench_paged(repeats: int) -> dict:
    """paged_attention against gathering the pages and calling varlen_attention: best times and peak memory."""
    q, k_pages, v_pages, table, kv_lens = _paged_problem(np.random.default_rng(8))
    cands = {
        "paged": lambda: ar.paged_attention(q, k_pages, v_pages, table, kv_lens, enable_gqa=True),
        "gather_varlen": lambda: _gather_then_varlen(q, k_pages, v_pages, table, kv_lens),
    }
    assert np.allclose(cands["paged"](), cands["gather_varlen"](), rtol=1e-5, atol=1e-6)
    row = _timed_row(cands, repeats, **{k: list(v) if isinstance(v, tuple) else v for k, v in PAGED.items()},
                     dtype="float32", cached_tokens=int(kv_lens.sum()), pool_MiB=2 * k_pages.nbytes / 2**20,
                     load_average=list(os.getloadavg()))  # others' work on the machine slows both candidates
    row["paged_over_gather"] = row["paged_s"] / row["gather_varlen_s"]
    for name, fn in cands.items():
        row[f"{name}_peak_MiB"] = _traced(fn)[2] / 2**20
    return row


def fmt_paged(r: dict) -> str:
    return (
        f"paged cache: {r['sequences']} sequences of 1..{r['max_len']} cached tokens ({r['cached_tokens']} in all), "
        f"page size {r['page_size']}, heads {r['heads']}, {r['dtype']}\n"
        f"  paged_attention {1e3 * r['paged_s']:.1f} ms (peak {r['paged_peak_MiB']:.1f} MiB), "
        f"gather + varlen_attention {1e3 * r['gather_varlen_s']:.1f} ms (peak {r['gather_varlen_peak_MiB']:.1f} MiB): "
        f"paged / gather = {r['paged_over_gather']:.2f}"
    )


def merge_record(path, what: str, **parts) -> None:
    """Write `parts` into the JSON record at `path` (made if missing), keeping its other entries."""
    result = json.loads(path.read_text()) if path.exists() else {}
    result.update(parts)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"merged {what} into {path}")


def shape_settings(args) -> dict:
    """How the shapes and backward rows were timed, for the Performance page to quote."""
    return {"repeats": args.shape_repeats, "gemm_block_rows": GEMM_ROWS, "tiny_calls": TINY_CALLS,
            "min_sample_s": MIN_SAMPLE_S}


def bench_backward(repeats: int, lengths=LENGTHS) -> list[dict]:
    """The backward pass at (1, 8, L, 64), L = S, causal and not, float32 and float64: times and ratios to torch."""
    rows = []
    rng = np.random.default_rng(4)
    for dtype in DTYPES:
        for L in lengths:
            for is_causal in (False, True):
                q, k, v, dout = (rng.standard_normal((*SHAPE_BH, L, E)).astype(dtype) for _ in range(4))
                cands = _backward_candidates(q, k, v, dout, is_causal)
                rows.append(_timed_row(cands, repeats, dtype=dtype, L=L, is_causal=is_causal))
                del cands
                gc.collect()
    return rows


def bench_backward_memory(n: int, block_size: int = BACKWARD_BLOCK) -> dict:
    """Peak traced memory growth of the tiled causal backward at L = S = n, E = 64, float64, one head."""
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.standard_normal((n, E)) for _ in range(4))
    out, lse = ar.blockwise_attention(q, k, v, is_causal=True, return_lse=True)
    grads, seconds, peak = _traced(
        lambda: ar.attention_backward(q, k, v, dout, is_causal=True, out=out, lse=lse, block_size=block_size))
    assert all(np.isfinite(g).all() for g in grads[:3])
    return {
        "n": n,
        "block_size": block_size,
        "peak_growth_MiB": peak / 2**20,
        "gradients_MiB": sum(g.nbytes for g in grads[:3]) / 2**20,
        "dense_scores_MiB": n * n * 8 / 2**20,
        "seconds": seconds,
    }


def fmt_backward(rows: list[dict]) -> str:
    """The backward benchmark as a fixed-width table."""
    head = f"{'dtype':8} {'L':>5} {'causal':>6} {'torch ms':>9} {'dense/torch':>11} {'tiled/torch':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.get("torch_s")
        lines.append(f"{r['dtype']:8} {r['L']:>5} {r['is_causal']!s:>6} " + (
            f"{1e3 * t:>9.1f} {r['dense_ratio']:>11.2f} {r['tiled_ratio']:>11.2f}" if t else f"{'-':>9}"))
    return "\n".join(lines)


def bench_import(repeats: int = 7) -> dict:
    """Best wall time of a fresh interpreter importing attention_ref, minus a bare interpreter."""

    def run(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - t0

    bare = min(run("pass") for _ in range(repeats))
    full = min(run("import attention_ref") for _ in range(repeats))
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, attention_ref; print('matplotlib' in sys.modules)"],
        check=True, capture_output=True, text=True,
    )
    return {"import_s": full - bare, "interpreter_s": bare, "matplotlib_imported": probe.stdout.strip() == "True"}


def fmt_table(rows: list[dict]) -> str:
    """The kernel timings as a fixed-width table."""
    head = (
        f"{'dtype':8} {'L':>5} {'dense ms':>9} {'block ms':>9} {'torch ms':>9} "
        f"{'dense/torch':>11} {'block/torch':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.get("torch_s")
        lines.append(
            f"{r['dtype']:8} {r['L']:>5} {1e3 * r['dense_s']:>9.1f} {1e3 * r['blockwise_s']:>9.1f} "
            + (f"{1e3 * t:>9.1f} {r['dense_ratio']:>11.2f} {r['blockwise_ratio']:>11.2f}" if t else f"{'-':>9}")
        )
    return "\n".join(lines)


def fmt_backward_memory(r: dict) -> str:
    """The tiled backward's memory run as one line."""
    return (
        f"tiled backward causal L=S={r['n']} E={E} float64 block {r['block_size']}: peak growth "
        f"{r['peak_growth_MiB']:.1f} MiB (gradients {r['gradients_MiB']:.1f} MiB; dense scores would need "
        f"{r['dense_scores_MiB']:.0f} MiB), {r['seconds']:.1f} s"
    )


def fmt_window(r: dict) -> str:
    """The windowed run against the full one, as two lines."""
    return (
        f"blockwise L=S={r['n']} E={r['E']} {r['dtype']} window={tuple(r['window'])}: {r['windowed_s']:.1f} s, "
        f"peak growth {r['windowed_peak_MiB']:.1f} MiB\n"
        f"blockwise L=S={r['n']} E={r['E']} {r['dtype']} no window: {r['full_s']:.1f} s, "
        f"peak growth {r['full_peak_MiB']:.1f} MiB ({r['time_ratio']:.1f}x the windowed time)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="write the results as JSON to this path")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--memory-n", type=int, default=16384)
    parser.add_argument("--long-n", type=int, default=65536, help="length of the long run (0 to skip)")
    parser.add_argument("--window-n", type=int, default=65536, help="length of the windowed run (0 to skip)")
    parser.add_argument(
        "--only-window", action="store_true",
        help="run only the windowed case and merge it (as window_run) into the existing --write file",
    )
    parser.add_argument(
        "--only-shapes", action="store_true",
        help="run only the oracle shapes (best of --shape-repeats) and merge them (as shapes) into the --write file",
    )
    parser.add_argument(
        "--only-flex", action="store_true",
        help="run only flex_attention at --memory-n (full, half-masked, causal) and merge it into the --write file",
    )
    parser.add_argument("--shape-repeats", type=int, default=7)
    parser.add_argument("--backward-lengths", type=int, nargs="+", default=list(LENGTHS),
                        help="L = S of the backward runs (default: the forward benchmark's)")
    parser.add_argument(
        "--only-backward", action="store_true",
        help="run only the backward pass (times and the tiled memory peak) and merge it into the --write file",
    )
    parser.add_argument(
        "--only-paged", action="store_true",
        help="run only the paged-cache row (paged_attention against gather + varlen) and merge it into --write",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="only the oracle shapes, without the long causal one, best of 3: under a minute; writes nothing",
    )
    args = parser.parse_args(argv)

    if args.quick:
        print(fmt_shapes(bench_shapes(3, quick=True)))
        print(fmt_tiny_profile(bench_tiny_profile(3)))
        return 0
    if args.only_backward:
        backward = bench_backward(args.shape_repeats, args.backward_lengths)
        print(fmt_backward(backward))
        backward_memory = bench_backward_memory(args.memory_n)
        print(fmt_backward_memory(backward_memory))
        if args.write:
            merge_record(args.write, "backward", backward=backward, backward_memory=backward_memory,
                         backward_settings=shape_settings(args))
        return 0
    if args.only_shapes:
        shapes = bench_shapes(args.shape_repeats)
        print(fmt_shapes(shapes))
        tiny_profile = bench_tiny_profile(args.shape_repeats)
        print(fmt_tiny_profile(tiny_profile))
        if args.write:
            merge_record(args.write, "shapes", shapes=shapes, tiny_profile=tiny_profile, shapes_machine=machine(),
                         shapes_settings=shape_settings(args))
        return 0

    # The sections that run alone and record one result under their own name.
    alone = [
        (args.only_flex, "flex_run", lambda: bench_flex(args.memory_n), fmt_flex),
        (args.only_paged, "paged", lambda: bench_paged(args.shape_repeats), fmt_paged),
        (args.only_window, "window_run", lambda: bench_window(args.window_n), fmt_window),
    ]
    for wanted, name, run, fmt in alone:
        if wanted:
            result = run()
            print(fmt(result))
            if args.write:
                merge_record(args.write, name, **{name: result})
            return 0

    info = machine()
    print("machine:", json.dumps(info, indent=1))
    rows = bench_kernels(args.repeats)
    print(fmt_table(rows))
    shapes = bench_shapes(args.shape_repeats)
    print(fmt_shapes(shapes))
    tiny_profile = bench_tiny_profile(args.shape_repeats)
    print(fmt_tiny_profile(tiny_profile))
    backward = bench_backward(args.shape_repeats, args.backward_lengths)
    print(fmt_backward(backward))
    backward_memory = bench_backward_memory(args.memory_n)
    print(fmt_backward_memory(backward_memory))
    memory = bench_memory(args.memory_n, None)
    print(
        f"blockwise causal L=S={memory['n']} E={E} float64: peak growth {memory['peak_growth_MiB']:.1f} MiB "
        f"(output {memory['output_MiB']:.1f} MiB; dense scores would need {memory['dense_scores_MiB']:.0f} MiB), "
        f"{memory['seconds']:.1f} s"
    )
    long = None
    if args.long_n:
        long = bench_memory(args.long_n, None)
        print(
            f"blockwise causal L=S={long['n']}: finished in {long['seconds']:.1f} s, "
            f"peak growth {long['peak_growth_MiB']:.1f} MiB"
        )
    window_run = None
    if args.window_n:
        window_run = bench_window(args.window_n)
        print(fmt_window(window_run))
    flex_run = bench_flex(args.memory_n)
    print(fmt_flex(flex_run))
    paged = bench_paged(args.shape_repeats)
    print(fmt_paged(paged))
    imp = bench_import()
    print(f"import attention_ref: {1e3 * imp['import_s']:.0f} ms (matplotlib imported: {imp['matplotlib_imported']})")
    if args.write:
        result = {
            "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
            "machine": info,
            "shape": {"batch": SHAPE_BH[0], "heads": SHAPE_BH[1], "E": E},
            "kernels": rows,
            "shapes": shapes,
            "tiny_profile": tiny_profile,
            "shapes_settings": shape_settings(args),
            "backward_settings": shape_settings(args),
            "backward": backward,
            "backward_memory": backward_memory,
            "memory": memory,
            "long_run": long,
            "window_run": window_run,
            "flex_run": flex_run,
            "paged": paged,
            "import": imp,
        }
        args.write.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
