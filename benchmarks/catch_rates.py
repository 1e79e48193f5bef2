"""How often a check catches a kernel's scale error: torch's CPU attention with its scale off by a fraction.

Over the same `N` hypothesis draws of `attention_ref.testing.strategies.attention_problems` (``min_keys=2``,
``softcap=False``: torch's attention has no soft cap), this runs torch's ``scaled_dot_product_attention``
three times on each draw: with the right scale (every verdict must be a pass: a failure is a false alarm),
and with the scale times ``1 + error`` for a bfloat16 error of 2% and a float32 error of 0.1%, and counts
how many of those `assert_attention_close` fails. With ``hard=True`` (the default draws) some rows are
saturated or nearly uniform, where a scale error cannot show; ``--benign`` draws ``hard=False``.

    python benchmarks/catch_rates.py [--draws 300] [--benign]

Prints one line per case; the draws are derandomized, so a run is repeatable.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

ERRORS = {"bfloat16": 0.02, "float32": 0.001}


def rates(dtype: str, error: float, draws: int, hard: bool) -> dict:
    """Counts over `draws` problems in `dtype`: passes of the correct kernel and catches of the wrong scale."""
    import torch
    from hypothesis import HealthCheck, given, settings

    from attention_ref.testing import assert_attention_close
    from attention_ref.testing.strategies import attention_problems

    counts = {"draws": 0, "false_alarms": 0, "caught": 0}

    def verdict(p, factor: float) -> bool:
        """Whether the check passes torch's attention computed with the scale times `factor`."""
        kwargs = p.sdpa_kwargs()
        scale = kwargs.pop("scale") or 1.0 / np.sqrt(p.q.shape[-1])
        out = torch.nn.functional.scaled_dot_product_attention(*p.to_torch(), scale=scale * factor, **kwargs)
        try:
            assert_attention_close(out, p.q, p.k, p.v, **p.options)
        except AssertionError:
            return False
        return True

    @settings(max_examples=draws, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(attention_problems(dtypes=(dtype,), min_keys=2, softcap=False, hard=hard))
    def run(p):
        counts["draws"] += 1
        counts["false_alarms"] += not verdict(p, 1.0)
        counts["caught"] += not verdict(p, 1.0 + error)

    run()
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--benign", action="store_true", help="draw hard=False problems")
    args = parser.parse_args(argv)
    for dtype, error in ERRORS.items():
        c = rates(dtype, error, args.draws, hard=not args.benign)
        print(f"{dtype:>9} scale error {error:.1%}: caught {c['caught']} of {c['draws']} draws, "
              f"false alarms {c['false_alarms']} (hard={not args.benign}, min_keys=2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
