"""Real GPU kernels through attention_ref.testing: the checkers' record on CUDA (docs/chapters/gpu_record.json).

Runs PyTorch's CUDA attention (SDPA's flash, memory-efficient, cuDNN and math backends; bfloat16 and float16;
forward and backward), compiled FlexAttention with score and mask mods and its log-sum-exp, and JAX's cuDNN
attention through the checkers exactly as a kernel author would call them (tensors as they are, mods written
for torch), together with deliberately broken kernels that must fail. Each check is one row of the record:
what ran, what the checker was expected to say and what it said.

    python benchmarks/gpu_check.py --write docs/chapters/gpu_record.json

It needs CUDA (and exits with a message without it); ``--device cpu --quick`` runs the same script on the CPU's
kernels, to try it out where no GPU is.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's attention_ref

import attention_ref
from attention_ref.testing import (
    assert_attention_close,
    assert_attention_grads_close,
    assert_lse_close,
)

ROWS: list[dict] = []
#: Called after every row: writes the record so far (set by main with --write).
AFTER_ROW: list = []


def record(name: str, kernel: str, dtype: str, shape: str, expect: str, check) -> None:
    """Run `check` (a function raising AssertionError on a failed check) and keep its row."""
    start = time.perf_counter()
    try:
        check()
        got, detail = "pass", ""
    except AssertionError as exc:
        got, detail = "fail", str(exc).splitlines()[0]
    except Exception as exc:  # the kernel could not run this case: recorded, not counted as a verdict
        got, detail = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        if "unsupported" not in detail.lower() and "no available kernel" not in detail.lower():
            traceback.print_exc()
    seconds = time.perf_counter() - start
    row = {"check": name, "kernel": kernel, "dtype": dtype, "shape": shape, "expect": expect, "got": got,
           "ok": got == expect, "detail": detail, "seconds": round(seconds, 2)}
    ROWS.append(row)
    for after in AFTER_ROW:
        after()
    mark = "ok " if row["ok"] else ("ERR" if got == "error" else "BAD")
    print(f"{mark} {name:<42} {kernel:<28} {dtype:<9} {shape:<26} expect {expect}, got {got} {detail[:90]}",
          flush=True)


def sdpa_checks(torch, device: str, quick: bool) -> None:
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    if device == "cpu":
        backends = {"flash (CPU)": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    n = 128 if quick else 256
    shapes = {  # name: (B, Hq, Hkv, L, S, E, options, q/k spread)
        "causal": (2, 8, 8, n, n, 64, {"is_causal": True}, 1.0),
        "L<S": (2, 8, 8, n // 4, n + 77, 64, {}, 1.0),
        "GQA 8/2": (2, 8, 2, n, n, 64, {"enable_gqa": True}, 1.0),
        "decode, 4096 keys": (4, 8, 8, 1, 1024 if quick else 4096, 128, {}, 1.0),
        "large logits": (2, 4, 4, n, n, 64, {"is_causal": True}, 4.0),
    }
    gen = torch.Generator(device="cpu").manual_seed(0)
    for (backend_name, backend) in backends.items():
        for dtype_name in ("bfloat16", "float16"):
            dtype = getattr(torch, dtype_name)
            for shape_name, (B, H, Hkv, L, S, E, options, spread) in shapes.items():
                q = (torch.randn(B, H, L, E, generator=gen) * spread).to(device, dtype).requires_grad_()
                k = (torch.randn(B, Hkv, S, E, generator=gen) * spread).to(device, dtype).requires_grad_()
                v = torch.randn(B, Hkv, S, E, generator=gen).to(device, dtype).requires_grad_()
                dout = torch.randn(B, H, L, E, generator=gen).to(device, dtype)
                shape = f"{B}x{H}/{Hkv}x{L}x{S}x{E}"
                kernel = f"SDPA {backend_name}"
                state = {}

                def forward(q=q, k=k, v=v, options=options, backend=backend, state=state, dout=dout):
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(q, k, v, **options)
                    state["grads"] = torch.autograd.grad(out, (q, k, v), dout)
                    return out

                def check_forward(q=q, k=k, v=v, options=options, state=state, forward=forward):
                    state["out"] = forward()
                    assert_attention_close(state["out"], q, k, v, **options)

                def check_backward(q=q, k=k, v=v, dout=dout, options=options, state=state):
                    if "grads" not in state:
                        raise RuntimeError("the forward did not run")
                    assert_attention_grads_close(state["grads"], q, k, v, dout, **options)

                record(f"{shape_name}: output", kernel, dtype_name, shape, "pass", check_forward)
                record(f"{shape_name}: dq, dk, dv", kernel, dtype_name, shape, "pass", check_backward)


def broken_checks(torch, device: str, quick: bool) -> None:
    """Kernels with one deliberate bug each: the checkers must reject every one."""
    F = torch.nn.functional
    gen = torch.Generator(device="cpu").manual_seed(1)
    B, H, L, S, E = 2, 8, 256 if not quick else 64, 256 if not quick else 64, 64
    dtype = torch.bfloat16

    def rand(*shape, grad=True):
        t = torch.randn(*shape, generator=gen).to(device, dtype)
        return t.requires_grad_() if grad else t

    q, k, v = rand(B, H, L, E), rand(B, H, S, E), rand(B, H, S, E)
    dout = rand(B, H, L, E, grad=False)
    shape = f"{B}x{H}x{L}x{S}x{E}"

    def scale_off(factor):
        def check():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=factor / math.sqrt(E))
            assert_attention_close(out, q, k, v, is_causal=True)
        return check

    record("scale off by 2%", "SDPA (default backend)", "bfloat16", shape, "fail", scale_off(1.02))
    record("scale off by 5%", "SDPA (default backend)", "bfloat16", shape, "fail", scale_off(1.05))
    record("right scale (control)", "SDPA (default backend)", "bfloat16", shape, "pass", scale_off(1.0))

    def dk_off(factor, dtype):
        def check():
            q_, k_, v_ = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
            out = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
            dq, dk, dv = torch.autograd.grad(out, (q_, k_, v_), dout.to(dtype))
            assert_attention_grads_close((dq, dk * factor, dv), q_, k_, v_, dout.to(dtype), is_causal=True)
        return check

    # the smallest error of dk the default rule catches on every case measured: 1 % in float16, 2 % in bfloat16
    record("dk off by 1%", "SDPA (default backend)", "float16", shape, "fail", dk_off(1.01, torch.float16))
    record("dk off by 2%", "SDPA (default backend)", "bfloat16", shape, "fail", dk_off(1.02, torch.bfloat16))

    q_short = rand(B, H, L // 4, E)

    def alignment():
        out = F.scaled_dot_product_attention(q_short, k, v, is_causal=True)  # top-left
        assert_attention_close(out, q_short, k, v, is_causal=True, causal_alignment="bottom-right")

    record("top-left causal checked as bottom-right", "SDPA (default backend)", "bfloat16",
           f"{B}x{H}x{L // 4}x{S}x{E}", "fail", alignment)

    k2, v2 = rand(B, 2, S, E), rand(B, 2, S, E)

    def interleaved():
        heads = torch.arange(H, device=device) % 2  # head h reads h % 2: the interleaved grouping
        out = F.scaled_dot_product_attention(q, k2[:, heads], v2[:, heads], is_causal=True)
        assert_attention_close(out, q, k2, v2, is_causal=True, enable_gqa=True)

    record("interleaved GQA grouping", "SDPA on repeated heads", "bfloat16", f"{B}x{H}/2x{L}x{S}x{E}", "fail",
           interleaved)

    mask = torch.rand(L, S, generator=gen).to(device) > 0.3

    def multiplied():
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(E) * mask  # the mask multiplied in
        out = (scores.softmax(-1) @ v.float()).to(dtype)
        assert_attention_close(out, q, k, v, mask=mask)

    record("mask multiplied into the scores", "hand-written", "bfloat16", shape, "fail", multiplied)

    def widened_right():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).float()
        assert_attention_close(out, q, k, v, is_causal=True, dtype="bfloat16")

    record("out.float() judged with dtype='bfloat16'", "SDPA (default backend)", "bfloat16", shape, "pass",
           widened_right)


def flex_checks(torch, device: str, quick: bool, compiled: bool) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled_flex = torch.compile(flex_attention) if compiled else flex_attention
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # before PyTorch 2.9: return_lse
        AuxRequest = None

    def run(q, k, v, score_mod=None, block_mask=None, return_lse=False):
        if not return_lse:
            return compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask)
        if AuxRequest is None:
            return compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)
        out, aux = compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, return_aux=AuxRequest(lse=True))
        return out, aux.lse
    kernel = "flex_attention (compiled)" if compiled else "flex_attention (eager)"
    gen = torch.Generator(device="cpu").manual_seed(2)
    B, H, L, E = 2, 4, 256 if quick else 1024, 64
    q, k, v = (torch.randn(B, H, L, E, generator=gen).to(device, torch.float32) for _ in range(3))
    doc_ids = torch.repeat_interleave(torch.arange(4), torch.tensor([L // 8, L // 2, L // 4, L // 8])).to(device)
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(H)], device=device)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= 128)

    def document(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (q_idx >= kv_idx)

    def softcap(score, b, h, q_idx, kv_idx):
        return 20.0 * torch.tanh(score / 20.0)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    variants = {
        "causal": (None, causal),
        "sliding window 128": (None, sliding),
        "document + causal": (None, document),
        "soft cap 20, causal": (softcap, causal),
        "ALiBi, causal": (alibi, causal),
    }
    shape = f"{B}x{H}x{L}x{L}x{E}"
    for name, (score_mod, mask_mod) in variants.items():
        block_mask = create_block_mask(mask_mod, None, None, L, L, device=device)
        out, lse = run(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)
        mods = {"score_mod": score_mod} if score_mod is not None else {}

        def check_out(out=out, mods=mods, block_mask=block_mask):
            assert_attention_close(out, q, k, v, block_mask=block_mask, **mods)

        def check_lse(lse=lse, mods=mods, mask_mod=mask_mod):
            assert_lse_close(lse, q, k, v, mask_mod=mask_mod, **mods)

        record(f"{name}: output", kernel, "float32", shape, "pass", check_out)
        record(f"{name}: log-sum-exp", kernel, "float32", shape, "pass", check_lse)

    wrong_ids = torch.roll(doc_ids, 1)

    def wrong_document(b, h, q_idx, kv_idx):
        return (wrong_ids[q_idx] == wrong_ids[kv_idx]) & (q_idx >= kv_idx)

    bad = run(q, k, v, block_mask=create_block_mask(wrong_document, None, None, L, L, device=device))
    record("document boundary one token off", kernel, "float32", shape, "fail",
           lambda: assert_attention_close(bad, q, k, v, mask_mod=document))
    lse2 = run(q, k, v, block_mask=create_block_mask(causal, None, None, L, L, device=device),
               return_lse=True)[1] / math.log(2)
    record("base-2 LSE checked as base e", kernel, "float32", shape, "fail",
           lambda: assert_lse_close(lse2, q, k, v, mask_mod=causal))
    record("base-2 LSE checked as base 2", kernel, "float32", shape, "pass",
           lambda: assert_lse_close(lse2, q, k, v, mask_mod=causal, base=2))


def jax_checks(quick: bool, device: str) -> None:
    import jax
    import jax.numpy as jnp

    implementation = "cudnn" if device == "cuda" else None
    rng = np.random.default_rng(3)
    B, L, H, E = 2, 128 if quick else 512, 8, 64
    q, k, v, dout = (jnp.asarray(rng.standard_normal((B, L, H, E)), dtype=jnp.bfloat16) for _ in range(4))

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)

    out, pullback = jax.vjp(attend, q, k, v)
    grads = pullback(dout)
    heads_first = (0, 2, 1, 3)  # JAX's (B, T, N, H) to (B, N, T, H)
    qh, kh, vh, douth = (jnp.transpose(x, heads_first) for x in (q, k, v, dout))
    kernel = f"jax.nn.dot_product_attention ({implementation or 'xla'})"
    shape = f"{B}x{H}x{L}x{L}x{E}"
    record("causal: output", kernel, "bfloat16", shape, "pass",
           lambda: assert_attention_close(jnp.transpose(out, heads_first), qh, kh, vh, is_causal=True))
    record("causal: dq, dk, dv", kernel, "bfloat16", shape, "pass",
           lambda: assert_attention_grads_close([jnp.transpose(g, heads_first) for g in grads], qh, kh, vh, douth,
                                                is_causal=True))


def write(path: Path | None, torch, device: str, quick: bool) -> dict:
    """The summary of the rows so far; with `path`, the record written there (after every part: a run cut
    short still leaves what it checked)."""
    verdicts = [row for row in ROWS if row["got"] != "error"]
    summary = {"checks": len(ROWS), "verdicts": len(verdicts), "as_expected": sum(r["ok"] for r in verdicts),
               "errors": len(ROWS) - len(verdicts),
               "broken_rejected": sum(r["ok"] for r in verdicts if r["expect"] == "fail"),
               "broken": sum(r["expect"] == "fail" for r in verdicts)}
    if path is not None:
        versions = {"torch": torch.__version__, "numpy": np.__version__, "attention_ref": attention_ref.__version__,
                    "python": platform.python_version()}
        if "jax" in sys.modules:
            versions["jax"] = sys.modules["jax"].__version__
        gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "CPU"
        record_ = {"gpu": gpu, "cuda": torch.version.cuda, "versions": versions,
                   "date": datetime.date.today().isoformat(), "quick": quick, "summary": summary, "rows": ROWS}
        path.write_text(json.dumps(record_, indent=1) + "\n")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the record (JSON) here")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="smaller shapes")
    parser.add_argument("--no-compile", action="store_true", help="run FlexAttention eagerly")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check.py needs CUDA (or --device cpu to try it out); nothing was recorded")
        return 2
    start = time.perf_counter()
    AFTER_ROW.append(lambda: write(args.write, torch, args.device, args.quick))
    parts = (lambda: broken_checks(torch, args.device, args.quick),
             lambda: flex_checks(torch, args.device, args.quick, not args.no_compile),
             lambda: jax_checks(args.quick, args.device),
             lambda: sdpa_checks(torch, args.device, args.quick))
    for part in parts:
        try:
            part()
        except Exception:
            traceback.print_exc()
    summary = write(args.write, torch, args.device, args.quick)
    print(json.dumps(summary), f"{time.perf_counter() - start:.0f} s")
    return 0 if summary["as_expected"] == summary["verdicts"] else 1


if __name__ == "__main__":
    sys.exit(main())
