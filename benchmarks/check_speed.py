"""What a check costs: each checker of attention_ref.testing against the matrix products it must do.

For each problem (B, H, L, E) in float16, bfloat16 and float32, causal or not, with or without grouped
heads, this times the four checkers (`assert_attention_close`, `assert_lse_close`,
`assert_attention_grads_close`, `assert_paged_attention_close`) on a correct kernel's results, after a
warm-up call on a small problem, and sets each beside

- its *GEMM floor*: the matrix products of the float64 reference and of the float32 baseline, timed by
  NumPy in the same run (the (L, E) x (E, S) and (L, S) x (S, E) products of every head: 2 + 2 for the
  output, the log-sum-exp and the paged check, 7 + 7 for the gradients, the backward's 5 and its
  forward's 2), timed again before each problem's checks, the least time so far kept;
- the check's peak memory above its inputs, measured in a child process (which also runs the timing, so
  that the largest checks run only as often as timed: the best of 50 tiny checks, of 10 at (2, 4, 256, 64), of
  2 from L = 1024 on);
- what a kernel suite uses instead today: FlashAttention's test reference (`tests/flash_reference.py`),
  the attention in PyTorch upcast to float32 plus the same in the kernel's dtype, forward and autograd
  backward, on the same CPU (the output and paged checks against its forward, the gradients against its
  forward and backward).

``make bench-checks`` runs it and records ``benchmarks/check_speed.json`` (``--write``); ``--quick``
runs the small problems and one medium one, printed only. The machine's load average is recorded: other
work on the machine slows every figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SHAPES = {"tiny": (1, 1, 16, 128), "small": (2, 4, 256, 64), "medium": (2, 16, 1024, 128),
          "large": (2, 16, 2048, 128)}
DTYPES = ("float16", "bfloat16", "float32")
CHECKERS = ("output", "lse", "grads", "paged")
#: GEMMs of the float64 reference and of the float32 baseline: (for each precision) of each checker.
GEMMS = {"output": 2, "lse": 2, "paged": 2, "grads": 7}
PAGE = 16
#: Timed runs of each check (and of PyTorch's reference), the best kept: a tiny check takes a fraction of a
#: millisecond, where one interruption moved a best of 5 by a third.
REPEATS = {"tiny": 50, "small": 10, "medium": 2, "large": 2}


def as_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def inputs(shape, dtype: str, causal: bool, gqa: bool, seed: int = 0) -> dict:
    """A problem and a correct kernel's results for it (computed in float32, rounded to `dtype`)."""
    import attention_ref as ar

    B, H, L, E = shape
    Hkv = max(1, H // 4) if gqa else H
    rng = np.random.default_rng(seed)
    dt = as_dtype(dtype)
    q = rng.standard_normal((B, H, L, E)).astype(dt)
    k, v = (rng.standard_normal((B, Hkv, L, E)).astype(dt) for _ in range(2))
    dout = rng.standard_normal((B, H, L, E)).astype(dt)
    wide = [a.astype(np.float32) for a in (q, k, v, dout)]
    options = {"is_causal": causal, "enable_gqa": gqa}
    out, lse = ar.scaled_dot_product_attention(*wide[:3], return_lse=True, **options)
    grads = ar.attention_backward(*wide, block_size=256, **options)
    pages = -(-L // PAGE)
    k_pages, v_pages = (np.ascontiguousarray(
        np.pad(a, ((0, 0), (0, 0), (0, pages * PAGE - L), (0, 0))).reshape(B, Hkv, pages, PAGE, E)
        .transpose(0, 2, 1, 3, 4).reshape(B * pages, Hkv, PAGE, E)) for a in (k, v))
    return {"q": q, "k": k, "v": v, "dout": dout, "out": out.astype(dt), "lse": lse.astype(np.float32),
            "dq": grads.dq.astype(dt), "dk": grads.dk.astype(dt), "dv": grads.dv.astype(dt),
            "k_pages": k_pages, "v_pages": v_pages, "table": np.arange(B * pages).reshape(B, pages),
            "kv_lens": np.full(B, L), "causal": causal, "gqa": gqa}


def check(name: str, a: dict) -> None:
    """Run checker `name` on the problem `a` (it passes: the results are correct)."""
    from attention_ref.testing import (
        assert_attention_close,
        assert_attention_grads_close,
        assert_lse_close,
        assert_paged_attention_close,
    )

    options = {"is_causal": bool(a["causal"]), "enable_gqa": bool(a["gqa"])}
    q, k, v = a["q"], a["k"], a["v"]
    if name == "output":
        assert_attention_close(a["out"], q, k, v, **options)
    elif name == "lse":
        assert_lse_close(a["lse"], q, k, v, **options)
    elif name == "grads":
        assert_attention_grads_close((a["dq"], a["dk"], a["dv"]), q, k, v, a["dout"], **options)
    else:
        assert_paged_attention_close(a["out"], q, a["k_pages"], a["v_pages"], a["table"], a["kv_lens"],
                                     causal_alignment="bottom-right", **options)


def child(folder: str, name: str, repeats: int) -> None:
    """In a fresh process: warm up, time checker `name` on the saved problem, and print seconds and peak bytes.

    OpenBLAS's threads spin for a while after the library starts and after each product they share (about
    0.1 s here), taking a core from whatever runs then: the checks of a (2, 4, 256, 64) problem timed in that
    window took 1.6 times as long as those after it. So both problems are read from .npy files (computing
    them would start the threads again), and the timing starts 0.5 s after the warm-up call, as the checks
    of a suite run, long after its start. The peak is the process's largest resident size during the
    checks less its resident size before them (the inputs read from .npy files, which arrive without a
    second copy)."""
    a, warm_up = load(Path(folder)), load(Path(folder) / "warm_up")
    check(name, warm_up)  # the warm-up call
    time.sleep(0.5)  # OpenBLAS's threads idle again
    before = resident_bytes()
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        check(name, a)
        best = min(best, time.perf_counter() - start)
    peak = resident_bytes("VmHWM") - before
    print(json.dumps({"seconds": best, "peak_bytes": max(0, peak)}))


def save(a: dict, folder: Path) -> None:
    """Write problem `a` as .npy files into `folder` (bfloat16 as its bits)."""
    folder.mkdir(exist_ok=True)
    for key, value in a.items():
        value = np.asarray(value)
        np.save(folder / f"{key}.npy", value.view(np.uint16) if value.dtype.name == "bfloat16" else value)


def load(folder: Path) -> dict:
    """The problem `save` wrote into `folder`."""
    a = {}
    for path in sorted(folder.glob("*.npy")):
        a[path.stem] = np.load(path)
        if a[path.stem].dtype == np.uint16:  # bfloat16, saved as its bits
            a[path.stem] = a[path.stem].view(as_dtype("bfloat16"))
    return a


def resident_bytes(field: str = "VmRSS") -> int:
    """The process's resident memory now (``VmRSS``) or its largest so far (``VmHWM``), on Linux.

    Not ``ru_maxrss``: Linux carries that over from the forked parent through ``exec``, so a child of a
    large parent would report the parent's size. Elsewhere ``ru_maxrss`` is all there is."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(a: dict, name: str, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        save(a, Path(tmp))
        save(inputs(SHAPES["tiny"], "bfloat16", True, False, seed=1), Path(tmp) / "warm_up")
        # the child imports attention_ref as this process does (PYTHONPATH and the environment inherited)
        done = subprocess.run([sys.executable, __file__, "--child", tmp, name, str(repeats)],
                              capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the {name} check failed in its child process:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gemm_floor(shape, repeats: int) -> dict:
    """Seconds of the 2 forward products and of the 7 products of a gradient check, float64 plus float32."""
    floor = {2: 0.0, 7: 0.0}
    for dt in (np.float64, np.float32):
        fwd, bwd = products(shape, dt)
        floor[2] += best_of(fwd, repeats)
        floor[7] += best_of(fwd, repeats) + best_of(bwd, repeats)
    return floor


def products(shape, dt):
    """Functions computing the forward's 2 and the backward's 5 products of every head of `shape` in `dt`."""
    B, H, L, E = shape
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, H, L, E)).astype(dt) for _ in range(4))
    p = rng.random((B, H, L, L)).astype(dt)
    kt, vt, pt = (np.swapaxes(a, -1, -2) for a in (k, v, p))

    def forward():
        q @ kt  # S = Q K^T
        p @ v  # O = P V

    def backward():
        q @ kt  # S again, for P
        pt @ do  # dV = P^T dO
        do @ vt  # dP = dO V^T
        p @ k  # dQ = dS K
        pt @ q  # dK = dS^T Q

    return forward, backward


def best_of(fn, repeats: int) -> float:
    fn()
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def torch_reference(a: dict, repeats: int) -> dict | None:
    """Seconds of FlashAttention's test reference in PyTorch: forward (float32 and kernel dtype) and with backward."""
    try:
        import torch

        sys.path.insert(0, str(HERE.parent / "tests"))
        from flash_reference import attention_ref
    except ImportError:
        return None
    kernel = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    name = a["q"].dtype.name
    dt = kernel[name]

    def tensor(x):
        return torch.from_numpy(np.ascontiguousarray(
            np.swapaxes(x.astype(np.float32), 1, 2))).to(dt)  # (B, L, H, E), as FlashAttention lays it out

    q, k, v, dout = (tensor(a[key]) for key in ("q", "k", "v", "dout"))
    causal = bool(a["causal"])

    def forward():
        with torch.no_grad():
            attention_ref(q.float(), k.float(), v.float(), causal=causal)
            attention_ref(q, k, v, causal=causal)

    def both():
        for cast in (lambda t: t.float(), lambda t: t):
            leaves = [cast(t).detach().requires_grad_() for t in (q, k, v)]
            out = attention_ref(*leaves, causal=causal)[0]
            torch.autograd.grad(out, leaves, cast(dout))

    return {"forward": best_of(forward, repeats), "backward": best_of(both, repeats)}


def configs(args):
    for size in args.shapes:
        shape = SHAPES[size]
        for dtype, causal, gqa in itertools.product(args.dtypes, (True, False), (False, True)):
            if gqa and shape[1] < 4:
                continue  # one head: no groups
            if size in args.narrow and (dtype != "bfloat16" or gqa):
                continue  # the largest problems: bfloat16 without groups only, unless asked
            if args.quick and (size == "medium" and not causal):
                continue
            yield size, shape, dtype, causal, gqa


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, help="record the results as JSON to this path")
    parser.add_argument("--quick", action="store_true", help="tiny, small and one medium problem, bfloat16 only")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--checkers", nargs="+", choices=CHECKERS, default=list(CHECKERS))
    parser.add_argument("--narrow", nargs="*", choices=list(SHAPES), default=["medium", "large"],
                        help="shapes run in bfloat16 without grouped heads only (default: medium and large)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch's reference")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    if args.quick:
        args.shapes, args.dtypes = ["tiny", "small", "medium"], ["bfloat16"]
    import attention_ref

    load_start = list(os.getloadavg())
    rows = []
    print(f"{'shape':>18} {'dtype':>8} {'causal':>6} {'gqa':>5} {'checker':>7} {'seconds':>9} {'floor':>8} "
          f"{'ratio':>6} {'peak GiB':>8} {'torch s':>8} {'vs torch':>8}")
    floors: dict = {}
    for size, shape, dtype, causal, gqa in configs(args):
        repeats = REPEATS[size]
        # the floor again before each problem's checks, keeping the least: other work on the machine only adds
        floor_now = gemm_floor(shape, 7 if size in ("tiny", "small") else 2)
        floors[size] = {n: min(t, floors.get(size, floor_now)[n]) for n, t in floor_now.items()}
        a = inputs(shape, dtype, causal, gqa)
        torch_s = None if args.no_torch else torch_reference(a, repeats)
        for name in args.checkers:
            got = measure(a, name, repeats)
            floor = floors[size][GEMMS[name]]
            versus = None if torch_s is None else torch_s["backward" if name == "grads" else "forward"]
            row = {"size": size, "shape": list(shape), "dtype": dtype, "causal": causal, "gqa": gqa,
                   "checker": name, "seconds": got["seconds"], "floor_seconds": floor,
                   "ratio": got["seconds"] / floor, "peak_gib": got["peak_bytes"] / 2**30,
                   "torch_seconds": versus, "ratio_to_torch": None if versus is None else got["seconds"] / versus}
            rows.append(row)
            print(f"{tuple(shape)!s:>18} {dtype:>8} {causal!s:>6} {gqa!s:>5} {name:>7} {row['seconds']:9.4f} "
                  f"{floor:8.4f} {row['ratio']:6.1f} {row['peak_gib']:8.3f} "
                  + ("" if versus is None else f"{versus:8.4f} {row['ratio_to_torch']:8.2f}"), flush=True)
    result = {"machine": {"cores": os.cpu_count(), "numpy": np.__version__,
                          "attention_ref": getattr(attention_ref, "__version__", "unknown"),
                          "load_average_start": load_start, "load_average_end": list(os.getloadavg())},
              "rows": rows}
    print("load average (1, 5, 15 min) at the start", load_start, "and the end", result["machine"]["load_average_end"])
    if args.write:
        args.write.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
