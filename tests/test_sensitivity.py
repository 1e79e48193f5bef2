"""The checkers' default ``atol`` (issue 34): no false alarm on correct kernels, a wrong scale caught.

Real kernels, PyTorch's CPU ``scaled_dot_product_attention`` (output, autograd gradients, and the
log-sum-exp of ``aten._scaled_dot_product_flash_attention_for_cpu``) and JAX's
``jax.nn.dot_product_attention`` (output), are checked with the DEFAULT rule of
`attention_ref.testing` (``atol=None``) over 200 seeded cases per dtype drawn from a mix of small shapes
with scores of order one:

- every correct result passes;
- the same kernels with their scale multiplied by ``1 + error`` fail in every case once ``error``
  reaches ``MUST_CATCH[dtype]``: 0.5 % in float16, 2 % in bfloat16, 0.1 % in float32 and float64.
  In 16-bit dtypes this rests on the fused baseline (the scores and the softmax in float32, as the
  kernels compute them): the textbook one, every step rounded, caught 2 % in bfloat16 in only 63.6 % of
  a wider mix of cases even with ``atol=0`` (benchmarks/sensitivity.py's record).

The kernels and the drawing of the cases are those of ``benchmarks/sensitivity.py``, which measures the
same over larger shapes and records the numbers the defaults were chosen from
(``docs/chapters/sensitivity_record.json``). Left out of this mix: rows with a single allowed key in every
row (one key, or one query under a top-left causal mask), where a wrong scale changes nothing to catch, and
large scores, where a 2 % scale error moves the weights less than the kernels' own rounding of them.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import require

from attention_ref.testing import assert_attention_close, assert_attention_grads_close, assert_lse_close

pytestmark = pytest.mark.torch

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "sensitivity.py"
_spec = importlib.util.spec_from_file_location("sensitivity", _PATH)
sensitivity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sensitivity)
Spec = sensitivity.Spec

DTYPES = ["float16", "bfloat16", "float32", "float64"]
CASES = 200
#: Small shapes, case ``i`` taking ``SPECS[i % len(SPECS)]`` with seed ``i``: every query sees at least two
#: keys in most rows (row 0 of a causal mask sees one), scores of order one (q and k of std 1).
SPECS = (
    Spec(1, 4, 4, 64, 64, 32, True, 1.0),
    Spec(1, 4, 2, 32, 96, 32, False, 1.0),  # grouped-query 4/2, L < S
    Spec(1, 2, 2, 96, 32, 16, True, 1.0),  # causal, L > S
    Spec(1, 2, 2, 128, 17, 16, False, 1.0),
    Spec(2, 2, 2, 48, 48, 64, False, 1.0),
)
#: The scale error the default rule must catch in every case of the mix, per dtype.
MUST_CATCH = {"float16": 0.005, "bfloat16": 0.02, "float32": 0.001, "float64": 0.001}


@pytest.fixture
def tt(torch):
    """torch with one thread (the test machine is shared)."""
    torch.set_num_threads(1)
    return torch


def cases(dtype):
    """``(spec, q, k, v, dout)`` of the mix, in `dtype`."""
    for seed in range(CASES):
        spec = SPECS[seed % len(SPECS)]
        yield (spec, *sensitivity.draw(spec, seed, dtype))


def fails(check, *args, **options) -> bool:
    """Whether `check` raises AssertionError for `args`."""
    try:
        check(*args, **options)
    except AssertionError:
        return True
    return False


def smallest_caught(kernel, spec, q, k, v):
    """The smallest of `sensitivity.SCALE_ERRORS` whose wrong `kernel` output fails the default rule (inf if none).

    The errors are tried in increasing order; a larger one moves the output further.
    """
    options = sensitivity.spec_options(spec)
    for error in sensitivity.SCALE_ERRORS:
        if fails(assert_attention_close, kernel(q, k, v, None, spec, error)["out"], q, k, v, **options):
            return error
    return np.inf


@pytest.mark.parametrize("dtype", DTYPES)
def test_correct_torch_kernels_pass_by_default(tt, dtype):
    alarms = []
    for seed, (spec, q, k, v, dout) in enumerate(cases(dtype)):
        got = sensitivity.torch_kernel(q, k, v, dout, spec)
        options = sensitivity.spec_options(spec)
        checks = {
            "out": (assert_attention_close, got["out"]),
            "lse": (assert_lse_close, got["lse"]),
            "grads": (assert_attention_grads_close, (got["dq"], got["dk"], got["dv"]), dout),
        }
        alarms += [(seed, kind) for kind, (check, *args) in checks.items()
                   if fails(check, args[0], q, k, v, *args[1:], **options)]
    assert alarms == [], f"{dtype}: correct results fail (seed, kind): {alarms}"


def stacked_outputs(kernel, dtype):
    """`kernel`'s output for each case of the mix, from one call per shape on the cases stacked along the batch.

    The batch entries are independent, and JAX's float16 kernel runs eagerly (see `sensitivity.jax_kernel`),
    one dispatch per operation: one call per shape instead of per case keeps the test fast.
    """
    drawn = list(cases(dtype))
    outputs = [None] * len(drawn)
    for spec in SPECS:
        seeds = [seed for seed, (s, *_) in enumerate(drawn) if s == spec]
        q, k, v = (np.concatenate([drawn[seed][i] for seed in seeds]) for i in (1, 2, 3))
        out = kernel(q, k, v, None, spec)["out"]
        for seed, part in zip(seeds, np.split(out, len(seeds)), strict=True):
            outputs[seed] = part
    return drawn, outputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])  # JAX's float64 softmax is float32
def test_correct_jax_output_passes_by_default(dtype):
    require("jax")
    drawn, outputs = stacked_outputs(sensitivity.jax_kernel, dtype)
    alarms = [seed for seed, ((spec, q, k, v, _), out) in enumerate(zip(drawn, outputs, strict=True))
              if fails(assert_attention_close, out, q, k, v, **sensitivity.spec_options(spec))]
    assert alarms == [], f"{dtype}: JAX's correct outputs fail for seeds {alarms}"


@pytest.fixture(scope="module")
def smallest_errors_caught():
    """``measure(dtype)``: the smallest error caught in each case for PyTorch's forward output, computed once."""
    found = {}

    def measure(dtype):
        if dtype not in found:
            found[dtype] = [smallest_caught(sensitivity.torch_kernel, spec, q, k, v)
                            for spec, q, k, v, _ in cases(dtype)]
        return found[dtype]

    return measure


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_rule_catches_a_wrong_scale(tt, smallest_errors_caught, dtype):
    caught = smallest_errors_caught(dtype)
    worst = max(caught)  # the smallest error caught in every case
    missed = [seed for seed, error in enumerate(caught) if error > MUST_CATCH[dtype]]
    assert worst <= MUST_CATCH[dtype], (
        f"{dtype}: a scale error of {MUST_CATCH[dtype]:.1%} passes the default rule for seeds {missed}; "
        f"the smallest error caught in all {CASES} cases is {worst:.1%}"
    )


def _property_sensitivity():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "property_sensitivity.py"
    spec = importlib.util.spec_from_file_location("property_sensitivity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_property_draws_with_two_keys_a_row_catch_a_float32_scale_error(tt):
    require("hypothesis")
    counts = _property_sensitivity().measure("float32", 0.001, 40, 2)
    assert counts["draws"] == 40 and counts["false_alarms"] == 0
    assert counts["caught"] >= 36, counts  # benchmarks/property_sensitivity.py: 292 of 300
    right = _property_sensitivity().measure("float32", 0.0, 20, 2)  # a scale off by nothing is no error
    assert right["caught"] == right["false_alarms"] == 0
