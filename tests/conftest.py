"""Shared fixtures. In CI (``CI=true``) optional dependencies must be present: tests fail rather than skip."""

import importlib
import os

import numpy as np
import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(module_name):
    """Import an optional module; skip without it locally, fail without it in CI."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"{module_name} is required in CI but could not be imported: {exc}")
        pytest.skip(f"{module_name} is not installed")


@pytest.fixture
def torch():
    """The torch module, float64 matmul determinism on CPU."""
    return require("torch")


@pytest.fixture
def rng():
    """A seeded generator: every test is reproducible."""
    return np.random.default_rng(20261121)
