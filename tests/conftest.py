"""Shared fixtures. In CI (``CI=true``) optional dependencies must be present: tests fail rather than skip."""

import importlib
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
EXT = Path(__file__).resolve().parents[1] / "docs" / "_ext"

try:  # hypothesis is a test dependency; keep the suite quick and free of flaky deadlines
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "attention_ref",
        deadline=None,
        max_examples=30,
        suppress_health_check=[HealthCheck.too_slow],
        print_blob=True,
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "attention_ref"))
except ImportError:  # pragma: no cover - the property tests skip themselves
    pass


def require(module_name):
    """Import an optional module; skip without it locally, fail without it in CI."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"{module_name} is required in CI but could not be imported: {exc}")
        pytest.skip(f"{module_name} is not installed")


def require_built_book(site):
    """`site`, the built book's folder, if it holds index.html; else skip locally and fail in CI."""
    if not (site / "index.html").is_file():
        if IN_CI:
            pytest.fail(f"the built book is required in CI: {site} has no index.html (run make docs)")
        pytest.skip(f"no built book at {site} (run make docs)")
    return site


def python_without_the_package():
    """The command of a Python that cannot import attention_ref, as a reader's fresh interpreter: this
    environment's interpreter, isolated (``-I``) and without site-packages (``-S``), so that neither an installed
    nor an editable attention_ref (nor any other third-party package) is visible, whatever the base interpreter
    has installed. Fails if attention_ref can still be imported."""
    command = [sys.executable, "-I", "-S"]
    probe = subprocess.run([*command, "-c", "import attention_ref"], capture_output=True)
    if probe.returncode == 0:
        pytest.fail(f"{' '.join(command)} can import attention_ref; the test needs a Python without it")
    return command


def ext_module(name, *needs):
    """Module `name` of docs/_ext, imported as Sphinx (with the path docs/conf.py sets) and `make serve` import it;
    skips (fails in CI) without the modules `needs`."""
    for need in needs:
        require(need)
    sys.path.insert(0, str(EXT))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXT))


@pytest.fixture(scope="session")
def browser():
    """Chromium, offline (test_site.launch_chromium), one per test process for every browser test module."""
    from test_site import launch_chromium

    with launch_chromium() as chromium:
        yield chromium


@pytest.fixture
def torch():
    """The torch module, float64 matmul determinism on CPU."""
    return require("torch")


@pytest.fixture
def rng():
    """A seeded generator: every test is reproducible."""
    return np.random.default_rng(20261121)


# ---------------------------------------------------------------------------
# An independent float64 attention formula for the tests to compare against.
# Plain loops-free NumPy, deliberately not calling attention_ref at all.


def _reference_attention(q, k, v, *, allowed=None, bias=None, scale=None):
    """``softmax(q k^T * scale + log(allowed) + bias) v`` in float64; empty rows give zeros.

    Returns ``(out, weights)``.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    scores = np.einsum("...le,...se->...ls", q, k) * scale
    if bias is not None:
        scores = scores + np.asarray(bias, dtype=np.float64)
    if allowed is None:
        allowed = np.ones(scores.shape[-2:], dtype=bool)
    allowed = np.broadcast_to(allowed, np.broadcast_shapes(np.shape(allowed), scores.shape))
    scores = np.broadcast_to(scores, allowed.shape)
    allowed = allowed & ~np.isneginf(scores)  # -inf in a bias is a mask too
    row_max = np.max(np.where(allowed, scores, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    numerators = np.where(allowed, np.exp(np.where(allowed, scores - row_max, 0.0)), 0.0)
    totals = numerators.sum(axis=-1, keepdims=True)
    weights = numerators / np.where(totals > 0, totals, 1.0)
    out = np.einsum("...ls,...sd->...ld", weights, v)
    return out, weights


@pytest.fixture(scope="session")
def reference_attention():
    """The independent float64 formula ``(q, k, v, *, allowed, bias, scale) -> (out, weights)``."""
    return _reference_attention


# ---------------------------------------------------------------------------
# Conformance bookkeeping: tests record |ours - reference| and the largest
# value per group is printed at the end of the session for quoting.

_DEVIATIONS: dict[str, list[float]] = defaultdict(list)


def max_deviation(ours, theirs):
    """``max |ours - theirs|`` in float64, blind to nothing: an element where one side is finite and the other is
    not, or where the two are different non-finite values (NaN against an infinity, ``+inf`` against ``-inf``),
    is an infinite deviation. Equal non-finite values (``-inf`` for an empty row's LSE on both sides) agree."""
    ours, theirs = np.broadcast_arrays(np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64))
    finite = np.isfinite(ours) & np.isfinite(theirs)
    agree = finite | (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
    if not np.all(agree):
        return math.inf
    return float(np.max(np.abs(ours[finite] - theirs[finite]), initial=0.0))


def assert_finite_where(ours, theirs, who):
    """Our values are finite wherever the reference `who`'s are."""
    ours, theirs = np.broadcast_arrays(np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64))
    bad = np.isfinite(theirs) & ~np.isfinite(ours)
    assert not np.any(bad), f"ours is NaN or infinite at {np.count_nonzero(bad)} entries where {who} is finite"


def planted(value, shape=(2, 3, 4), where=(1, 2, 3), seed=0):
    """A reference array and a copy of it with `value` planted at `where`: "ours" gone wrong in one entry."""
    theirs = np.random.default_rng(seed).normal(size=shape)
    ours = theirs.copy()
    ours[where] = value
    return ours, theirs


def not_recorded(group, ours, theirs):
    """record_deviation's comparison without adding the planted failures to the session's summary."""
    return max_deviation(ours, theirs)


@pytest.fixture(scope="session")
def record_deviation():
    """``record_deviation(group, ours, theirs)`` stores ``max_deviation(ours, theirs)`` and returns it: infinite
    where one side is finite and the other is not."""

    def record(group, ours, theirs):
        value = max_deviation(ours, theirs)
        _DEVIATIONS[group].append(value)
        return value

    return record


def pytest_sessionfinish(session):
    """Under pytest-xdist, hand this worker's deviations to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["deviations"] = {group: list(values) for group, values in _DEVIATIONS.items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Under pytest-xdist, gather a finished worker's deviations for the summary."""
    for group, values in getattr(node, "workeroutput", {}).get("deviations", {}).items():
        _DEVIATIONS[group].extend(values)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _DEVIATIONS:
        return
    terminalreporter.section("conformance: largest deviations observed")
    overall = 0.0
    for group in sorted(_DEVIATIONS):
        values = _DEVIATIONS[group]
        overall = max(overall, max(values))
        terminalreporter.write_line(f"max |ours - {group}| = {max(values):.3e}  over {len(values)} comparisons")
    terminalreporter.write_line(f"overall max |ours - reference| = {overall:.3e}")


# The longest tests first, the many short ones last. `make test` runs pytest-xdist with --dist worksteal: each
# worker starts on a contiguous share of this order and an idle worker takes half of a busy one's queue, so
# the worker that takes the second book build (about a minute of CPU) starts it at once, and the short tests
# at the end fill the gaps, leaving the workers finishing within seconds of each other. (With --dist load,
# the browser tests queued on one worker ran 35 to 41 s after the other two had finished.)
_SLOW_FIRST = (
    "test_pdf_epub.py", "test_docs_reproducible.py", "test_docs_build.py", "test_doctests_plain.py", "test_lint.py",
    "test_site.py",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = item.path.name
        return _SLOW_FIRST.index(name) if name in _SLOW_FIRST else len(_SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within each group is kept
