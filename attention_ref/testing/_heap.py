"""Keep a check's freed memory for the next check, where the C library is glibc.

A check allocates its temporaries (the float64 copies of the inputs, the scores of a group of heads, the
reference's and the baseline's outputs) and frees them when it returns. glibc's ``malloc`` starts with a
*trim threshold* of 128 KiB: when more than that lies free at the top of the heap, ``free`` hands it back
to the system, and the next check takes it again, page by page, each page a fault the kernel zeroes. At
(B, H, L, E) = (2, 4, 256, 64) that is about 1,200 pages a check, more than a third of its time on a
virtual machine; whether it happens depends on what the process freed before (glibc raises its thresholds
when it frees a large block: up to a 32 MiB mmap threshold and a 64 MiB trim threshold, ``mallopt(3)``).

`keep_freed_memory` sets those two thresholds to glibc's own limits at the first check: the state glibc
reaches by itself in a process that has once freed a 32 MiB array, which any check at L = 2048 does. A
process then keeps up to 64 MiB of freed memory per malloc arena for reuse instead of returning it; blocks
of 32 MiB and more are still mapped and unmapped one by one. Nothing changes where

- the C library is not glibc (macOS, Windows, musl);
- the process's environment already tunes malloc (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``,
  ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_`` or a ``glibc.malloc`` entry of ``GLIBC_TUNABLES``): the
  user's choice stands;
- ``ATTENTION_REF_KEEP_HEAP=0`` is set.
"""

from __future__ import annotations

import ctypes
import functools
import os

__all__: list[str] = []  # private module

#: mallopt's parameter numbers (glibc's <malloc.h>).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: glibc's own upper limits for its dynamic thresholds on 64-bit machines (DEFAULT_MMAP_THRESHOLD_MAX,
#: and twice it for the trim threshold).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
#: Environment variables through which a user tunes glibc's malloc.
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


@functools.cache  # once per process (two threads' first checks setting the same values at once is harmless)
def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds to their limits, once per process; return whether they are set."""
    if os.environ.get("ATTENTION_REF_KEEP_HEAP", "").strip() == "0":
        return False
    if any(name in os.environ for name in USER_SETTINGS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (AttributeError, ValueError, OSError, TypeError):  # not POSIX, or no such name
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
