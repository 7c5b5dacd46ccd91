"""Allocator settings for the data plane, applied by the server and the client themselves.

## glibc malloc

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

## Arrow's jemalloc, on the server: transparent huge pages

The server allocates its Arrow memory (cached row groups, gathered rows) from Arrow's jemalloc
(server/lifecycle.py). Its extents are 4 KiB pages unless jemalloc advises huge ones, and every
message a server sends is copied out of them (into the socket, or into gRPC's TLS frames): the
copy's page walks cost the server 4-9% CPU a GB (loadtest/README.md, "Huge pages for the server's
Arrow memory"). `arrow_huge_pages()` sets `JE_ARROW_MALLOC_CONF=thp:always,narenas:N` for a serving
process, N its usable CPUs (the caller's count: the server's `usable_cpus`, cgroup quota included):
jemalloc's default of 4 arenas a CPU leaves a partly used huge page in
each, ~15 MiB more RSS at rest on 2 CPUs, for no speed measured (loadtest/README.md).
jemalloc reads it once, when pyarrow's library is loaded, so the entry point (shardstream/__main__.py)
calls it before anything imports pyarrow; the server's workers inherit it. A value the user set wins
(`JE_ARROW_MALLOC_CONF=thp:default` turns it off); `SHARDSTREAM_MALLOC_TUNE=0` turns it off too.
Where the kernel's THP mode is `never`, the advice is ignored.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import MutableMapping

__all__ = ["ARROW_JEMALLOC_THP", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "arrow_huge_pages", "tune"]

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
ARROW_JEMALLOC_THP = "thp:always"
_ARROW_JEMALLOC_ENV = "JE_ARROW_MALLOC_CONF"

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


def arrow_huge_pages(environ: MutableMapping[str, str], cpus: int) -> bool:
    """Set Arrow's jemalloc to advise transparent huge pages in `environ` (one arena per CPU of
    `cpus`), unless the user chose its configuration or turned tuning off. Only takes effect in a
    process that loads pyarrow after it (and in its children). True when `environ` asks for them."""
    if environ.get("SHARDSTREAM_MALLOC_TUNE", "1") == "0":
        return False
    environ.setdefault(_ARROW_JEMALLOC_ENV, f"{ARROW_JEMALLOC_THP},narenas:{max(1, cpus)}")
    return ARROW_JEMALLOC_THP in environ[_ARROW_JEMALLOC_ENV].split(",")
