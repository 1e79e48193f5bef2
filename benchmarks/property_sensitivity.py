"""Catch rates of a wrong scale over property draws, with torch's scaled_dot_product_attention as the kernel.

`attention_ref.testing.strategies.attention_problems` draws the problems (``min_keys=2`` by default here: every
query row has two allowed keys or more, so that the scale matters in every row; ``softcap=False``, which torch's
attention does not take), `AttentionProblem.to_torch` and `AttentionProblem.sdpa_kwargs` hand them to PyTorch's CPU
``scaled_dot_product_attention``, and `assert_attention_close` judges its output twice: as computed (a correct
kernel: every failure is a false alarm) and with the scale multiplied by ``1 + error`` (a wrong kernel: the share
of draws it fails is the catch rate). Usage::

    python benchmarks/property_sensitivity.py --draws 300
    python benchmarks/property_sensitivity.py --draws 300 --min-keys 1 --json results.json
    python benchmarks/property_sensitivity.py --draws 300 --benign   # hard=False: scores of order one

Needs torch and hypothesis (and ml_dtypes for bfloat16).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

#: (dtype, relative scale error) pairs measured by default: the errors issue 43 names.
CASES = (("bfloat16", 0.02), ("float32", 0.001))


def draws(n: int, dtype: str, min_keys: int, hard: bool = True) -> list:
    """`n` problems as a property test draws them (derandomized: the same every run)."""
    from hypothesis import Phase, given, settings

    from attention_ref.testing.strategies import attention_problems

    found = []

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, phases=[Phase.generate])
    @given(attention_problems(dtypes=(dtype,), softcap=False, min_keys=min_keys, hard=hard))
    def collect(p):
        found.append(p)

    collect()
    return found


def measure(dtype: str, error: float, n: int, min_keys: int, hard: bool = True) -> dict:
    """Counts over `n` draws: false alarms of torch's correct attention, and catches of its scale times 1 + error."""
    import torch

    from attention_ref.testing import assert_attention_close

    sdpa = torch.nn.functional.scaled_dot_product_attention
    counts = {"draws": 0, "false_alarms": 0, "caught": 0}
    for p in draws(n, dtype, min_keys, hard):
        q, k, v = p.to_torch()
        kwargs = p.sdpa_kwargs()
        counts["draws"] += 1
        right = sdpa(q, k, v, **kwargs)
        scale = kwargs["scale"] if kwargs["scale"] is not None else 1 / math.sqrt(q.shape[-1])
        wrong = sdpa(q, k, v, **(kwargs | {"scale": scale * (1 + error)}))
        for key, out in (("false_alarms", right), ("caught", wrong)):
            try:
                assert_attention_close(out, p.q, p.k, p.v, **p.options)
            except AssertionError:
                counts[key] += 1
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--min-keys", type=int, default=2)
    parser.add_argument("--benign", action="store_true", help="draw with hard=False (scores of order one)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results = []
    for dtype, error in CASES:
        start = time.perf_counter()
        counts = measure(dtype, error, args.draws, args.min_keys, not args.benign)
        results.append({"dtype": dtype, "scale_error": error, "min_keys": args.min_keys, "hard": not args.benign,
                        **counts})
        print(f"{dtype:9s} scale x (1 + {error:g}), min_keys={args.min_keys}, hard={not args.benign}: "
              f"caught in {counts['caught']} of {counts['draws']} draws "
              f"({counts['caught'] / counts['draws']:.0%}); correct kernel failed {counts['false_alarms']} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "numpy": np.__version__, "results": results}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
