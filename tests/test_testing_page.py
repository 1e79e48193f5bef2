"""The testing page (docs/chapters/testing_your_kernel.md): its listings run, its table of empty rows holds, and the
GPU record it shows has the form the page reads.

* The copyable ``conftest.py`` files and their example tests (``docs/chapters/testing_your_kernel/``) are copied into
  an empty folder, the conftest as ``conftest.py`` as a reader would, and run by pytest in a fresh interpreter with
  the repository's attention_ref first on the path: every test must pass. PyTorch's pair needs torch, JAX's jax
  (each skips without it locally and fails without it in CI, ``require``).
* Every row of the page's table of what a kernel returns for a query with no allowed key is checked against the
  installed frameworks, through the checker with the ``empty_rows=`` the table names, and against the others.
* ``docs/chapters/gpu_record.json`` (written by ``benchmarks/gpu_check.py``): every key, each verdict one of pass,
  fail and error, ``ok`` the comparison of verdict and expectation, and a summary that agrees with the rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require

from attention_ref.testing import assert_attention_close

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "docs" / "chapters"
PAGE = CHAPTERS / "testing_your_kernel.md"
LISTINGS = CHAPTERS / "testing_your_kernel"
GPU_RECORD = CHAPTERS / "gpu_record.json"
PAIRS = {"torch": ("conftest_torch.py", "test_example_torch.py"), "jax": ("conftest_jax.py", "test_example_jax.py")}
# What the page's reader sees of a listing: no line wider than a code block at 1280 px.
WIDTH = 77


def run_listing(framework, folder, tests_text=None, *args):
    """Copy a pair of listings into `folder` (its conftest as conftest.py; the tests' text replaced by `tests_text`
    if given) and run pytest there in a fresh interpreter; return the finished process."""
    conftest, tests = PAIRS[framework]
    shutil.copyfile(LISTINGS / conftest, folder / "conftest.py")
    (folder / tests).write_text(tests_text or (LISTINGS / tests).read_text(encoding="utf-8"), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": "cpu"}
    # -p no:cacheprovider: nothing written beside the copies. The folder has no pytest configuration, so the run
    # is a reader's plain one, not the repository's (no doctests, no warnings as errors).
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, str(folder)]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False)


def passed(result):
    """The number of tests a pytest run passed, asserting that none failed or errored."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"the listing's tests failed:\n{output[-4000:]}"
    summary = re.search(r"(\d+) passed", output)
    assert summary and not re.search(r"\d+ (failed|error)", output), output[-2000:]
    return int(summary.group(1))


@pytest.mark.torch
def test_the_pytorch_listings_pass(tmp_path):
    require("torch")
    assert passed(run_listing("torch", tmp_path)) >= 20


def test_the_jax_listings_pass(tmp_path):
    require("jax")
    assert passed(run_listing("jax", tmp_path)) >= 10


@pytest.mark.torch
def test_a_failing_listing_fails_the_run(tmp_path):
    # The run can fail: PyTorch's gradient test with the kernel's causal flag dropped (still checked as causal).
    require("torch")
    original = (LISTINGS / "test_example_torch.py").read_text(encoding="utf-8")
    broken = original.replace("out = kernel(q, k, v, is_causal=True)", "out = kernel(q, k, v)")
    assert broken != original
    result = run_listing("torch", tmp_path, broken, "-k", "test_gradients")
    assert result.returncode != 0
    assert "3 failed" in result.stdout and "too far from the float64 reference" in result.stdout


def test_the_page_shows_every_listing_and_they_fit_its_width():
    page = PAGE.read_text(encoding="utf-8")
    for conftest, tests in PAIRS.values():
        for name in (conftest, tests):
            assert f"```{{literalinclude}} testing_your_kernel/{name}\n" in page, name
            wide = [line for line in (LISTINGS / name).read_text().splitlines() if len(line) > WIDTH]
            assert wide == [], f"{name}: lines wider than {WIDTH} characters: {wide}"


# -- The table of rows with no allowed key --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qkv():
    """float32 q, k, v (1, 2, 6, 8) and a mask whose row 2 allows nothing."""
    rng = np.random.default_rng(34)
    q, k, v = (rng.standard_normal((1, 2, 6, 8)).astype(np.float32) for _ in range(3))
    mask = np.ones((6, 6), dtype=bool)
    mask[2] = False
    return q, k, v, mask


@pytest.mark.torch
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "MATH"])
@pytest.mark.parametrize("float_mask", [False, True])
def test_pytorch_sdpa_on_the_cpu_gives_zeros(qkv, backend, float_mask):
    torch = require("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, mask = qkv
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    attn_mask = torch.from_numpy(mask)
    if float_mask:
        attn_mask = torch.zeros(mask.shape).masked_fill(~attn_mask, float("-inf"))
    with sdpa_kernel(getattr(SDPBackend, backend)):
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=attn_mask)
    assert_attention_close(out, q, k, v, mask=mask, empty_rows="zeros")
    with pytest.raises(AssertionError):  # the table's other conventions would not fit
        assert_attention_close(out, q, k, v, mask=mask, empty_rows="mean")


@pytest.mark.torch
def test_pytorch_multihead_attention_gives_nan():
    torch = require("torch")
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 6, 8)
    ignored = torch.zeros(6, 6, dtype=torch.bool)
    ignored[2] = True  # True = masked out, in nn.MultiheadAttention
    for training in (True, False):
        mha.train(training)
        with torch.no_grad():
            out, _ = mha(x, x, x, attn_mask=ignored)
        assert torch.isnan(out[0, 2]).all() and not torch.isnan(out[0, :2]).any()


def test_jax_gives_the_mean_with_a_mask_and_zeros_for_padded_queries(qkv):
    jax = require("jax")
    jnp = jax.numpy
    q, k, v, mask = qkv

    def swap(a):  # (B, H, L, E) <-> JAX's (B, T, N, H)
        return np.swapaxes(np.asarray(a), 1, 2)

    out = jax.nn.dot_product_attention(*(jnp.asarray(swap(a)) for a in (q, k, v)), mask=jnp.asarray(mask))
    assert_attention_close(swap(out), q, k, v, mask=mask, empty_rows="mean")
    with pytest.raises(AssertionError):
        assert_attention_close(swap(out), q, k, v, mask=mask, empty_rows="zeros")
    out = jax.nn.dot_product_attention(*(jnp.asarray(swap(a)) for a in (q, k, v)),
                                       query_seq_lengths=jnp.asarray([4], dtype=jnp.int32))
    padded = (np.arange(6) < 4)[:, None] & np.ones((6, 6), dtype=bool)  # queries 4 and 5 see nothing
    assert_attention_close(swap(out), q, k, v, mask=padded, empty_rows="zeros")


@pytest.mark.torch
@pytest.mark.parametrize(("dtype", "empty_rows"),
                         [("float32", "mean"), ("bfloat16", "mean"), ("float16", "mean"), ("float64", "nan")])
def test_hugging_face_eager_gives_the_mean_and_nan_in_float64(qkv, dtype, empty_rows):
    # Its softmax runs in float32 whatever the input's dtype (the frameworks page), so float64 is judged as float32.
    torch = require("torch")
    require("transformers")
    from transformers.models.llama import modeling_llama

    class Layer(torch.nn.Module):  # what eager_attention_forward reads of its module
        num_key_value_groups = 1

    q, k, v, mask = qkv
    tdtype = getattr(torch, dtype)
    tq, tk, tv = (torch.from_numpy(a).to(tdtype) for a in (q, k, v))
    additive = torch.zeros(1, 1, 6, 6, dtype=tdtype).masked_fill(~torch.from_numpy(mask), torch.finfo(tdtype).min)
    out, _ = modeling_llama.eager_attention_forward(Layer().eval(), tq, tk, tv, additive, scaling=8**-0.5)
    out = out.transpose(1, 2)  # (B, L, H, E) -> (B, H, L, E)
    judged = "float32" if dtype == "float64" else None
    assert_attention_close(out, tq, tk, tv, mask=mask, empty_rows=empty_rows, dtype=judged)
    with pytest.raises(AssertionError):
        assert_attention_close(out, tq, tk, tv, mask=mask, empty_rows="zeros", dtype=judged)


@pytest.mark.torch
def test_hugging_face_sdpa_gives_zeros(qkv):
    torch = require("torch")
    require("transformers")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Layer(torch.nn.Module):
        num_key_value_groups = 1
        is_causal = False

    q, k, v, mask = qkv
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    out, _ = sdpa_attention_forward(Layer().eval(), tq, tk, tv, torch.from_numpy(mask)[None, None], scaling=8**-0.5)
    assert_attention_close(out.transpose(1, 2), q, k, v, mask=mask, empty_rows="zeros")


# -- The GPU record -----------------------------------------------------------------------------------------------

RECORD_KEYS = {"gpu": str, "cuda": (str, type(None)), "versions": dict, "date": str, "quick": bool, "summary": dict,
               "rows": list}
ROW_KEYS = {"check": str, "kernel": str, "dtype": str, "shape": str, "expect": str, "got": str, "ok": bool,
            "detail": str, "seconds": (int, float)}
SUMMARY_KEYS = ("checks", "verdicts", "as_expected", "errors", "broken_rejected", "broken")


def record_problems(record):
    """What is wrong with a GPU record's form, as readable lines (none: the page can show it)."""
    problems = [f"{key}: missing or not {kind}" for key, kind in RECORD_KEYS.items()
                if not isinstance(record.get(key), kind)]
    if problems:
        return problems
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"]):
        problems.append(f"date {record['date']!r} is not YYYY-MM-DD")
    if not all(isinstance(name, str) and (value is None or isinstance(value, str))
               for name, value in record["versions"].items()) or "torch" not in record["versions"]:
        problems.append(f"versions must map names to version strings, torch's included: {record['versions']}")
    rows = record["rows"]
    if not rows:
        problems.append("no rows")
    for i, row in enumerate(rows):
        wrong = [key for key, kind in ROW_KEYS.items() if not isinstance(row.get(key), kind)
                 or (kind is bool) is not isinstance(row.get(key), bool)]
        extra = sorted(set(row) - set(ROW_KEYS))
        if wrong or extra:
            problems.append(f"row {i}: keys missing or of the wrong type {wrong}, unknown keys {extra}")
            continue
        if row["expect"] not in ("pass", "fail") or row["got"] not in ("pass", "fail", "error"):
            problems.append(f"row {i}: expect {row['expect']!r}, got {row['got']!r}")
        if row["ok"] != (row["got"] == row["expect"]):
            problems.append(f"row {i}: ok is {row['ok']} but expect {row['expect']!r}, got {row['got']!r}")
        if row["seconds"] < 0:
            problems.append(f"row {i}: negative seconds")
    if problems:
        return problems
    verdicts = [row for row in rows if row["got"] != "error"]
    broken = [row for row in verdicts if row["expect"] == "fail"]
    want = {"checks": len(rows), "verdicts": len(verdicts), "as_expected": sum(row["ok"] for row in verdicts),
            "errors": len(rows) - len(verdicts), "broken_rejected": sum(row["ok"] for row in broken),
            "broken": len(broken)}
    summary = record["summary"]
    if set(summary) != set(SUMMARY_KEYS):
        problems.append(f"summary keys {sorted(summary)}, not {sorted(SUMMARY_KEYS)}")
    problems += [f"summary {key} = {summary.get(key)!r}, but the rows give {value}"
                 for key, value in want.items() if summary.get(key) != value]
    return problems


def test_the_gpu_record_has_the_form_the_page_reads():
    assert GPU_RECORD.is_file(), f"{GPU_RECORD} is missing: python benchmarks/gpu_check.py --write {GPU_RECORD}"
    record = json.loads(GPU_RECORD.read_text(encoding="utf-8"))
    assert record_problems(record) == []


def test_the_record_check_can_fail():
    record = json.loads(GPU_RECORD.read_text(encoding="utf-8"))
    rows = record["rows"]
    flipped = {**record, "rows": [{**rows[0], "ok": not rows[0]["ok"]}, *rows[1:]]}
    assert any("row 0: ok is" in p for p in record_problems(flipped))
    odd = {**record, "rows": [{**rows[0], "got": "passed"}, *rows[1:]]}
    assert any("got 'passed'" in p for p in record_problems(odd))
    counted = {**record, "summary": {**record["summary"], "checks": len(rows) + 1}}
    assert any("summary checks" in p for p in record_problems(counted))
    assert record_problems({**record, "quick": "yes"}) == ["quick: missing or not <class 'bool'>"]
