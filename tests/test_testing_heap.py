"""attention_ref.testing._heap: a check's freed memory is kept for the next one, where the C library is glibc.

Each case runs in its own interpreter: the thresholds are set once per process, at the first check.
"""

import os
import subprocess
import sys
import textwrap

import pytest

GLIBC = hasattr(os, "confstr") and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")


def run_python(code: str, **env) -> str:
    """Run `code` in a fresh interpreter with `env` added (``None`` removes a variable); its stripped stdout."""
    environ = {**os.environ}
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                 "GLIBC_TUNABLES", "ATTENTION_REF_KEEP_HEAP"):
        environ.pop(name, None)
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


SET = "from attention_ref.testing._heap import keep_freed_memory; print(keep_freed_memory(), keep_freed_memory())"


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_set_once_on_glibc():
    assert run_python(SET) == "True True"


@pytest.mark.parametrize("env", [{"ATTENTION_REF_KEEP_HEAP": "0"}, {"MALLOC_TRIM_THRESHOLD_": "131072"},
                                 {"MALLOC_TOP_PAD_": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}])
def test_the_users_own_malloc_settings_stand(env):
    assert run_python(SET, **env) == "False False"


#: Three checks of a (2, 4, 256, 64) bfloat16 causal output, then the minor page faults of three more.
FAULTS = """
import resource
import ml_dtypes
import numpy as np
import attention_ref as ar
from attention_ref.testing import assert_attention_close

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 4, 256, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
out = ar.scaled_dot_product_attention(*(a.astype(np.float32) for a in (q, k, v)), is_causal=True)
out = out.astype(ml_dtypes.bfloat16)
for _ in range(3):
    assert_attention_close(out, q, k, v, is_causal=True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    assert_attention_close(out, q, k, v, is_causal=True)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3)
"""


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_a_repeated_check_takes_no_new_pages():
    """With ``ATTENTION_REF_KEEP_HEAP=0`` each of these checks faults in about 1,760 pages (6.9 MiB) on the
    project's 2-core machine: glibc hands the heap's top back to the system when the check frees its
    temporaries."""
    pytest.importorskip("ml_dtypes")
    faults = float(run_python(FAULTS, ATTENTION_REF_NUM_THREADS="2"))
    assert faults < 100, f"{faults} page faults a check"
