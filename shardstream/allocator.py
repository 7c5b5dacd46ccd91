"""glibc malloc settings for the data plane, applied by the server and the client themselves.

Each Read message is a fresh multi-MiB `bytes` on both sides (and grpcio's buffers around it).
glibc serves allocations that large with mmap and gives them back at free, so every message pays
fresh page faults; measured on the grpcio paths, keeping them in the heap gave +25–60% throughput
(loadtest/README.md). `tune()` sets what `MALLOC_MMAP_THRESHOLD_=33554432
MALLOC_TRIM_THRESHOLD_=1073741824` would, through mallopt(3), once per process:

- M_MMAP_THRESHOLD 32 MiB (glibc's maximum): messages up to 32 MiB come from the heap and their
  pages are reused by the next message;
- M_TRIM_THRESHOLD 1 GiB: freed heap is kept for reuse rather than returned at once.

Not applied when the user set either variable (theirs win), when SHARDSTREAM_MALLOC_TUNE=0, or
where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "tune"]

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_lock = threading.Lock()
_applied: bool | None = None


def tune() -> bool:
    """Apply the settings (once per process); True when they are in force."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = _apply()
        return _applied


def _apply() -> bool:
    if os.environ.get("SHARDSTREAM_MALLOC_TUNE", "1") == "0" or any(k in os.environ for k in _ENV):
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
