"""Threads of the client and the server: waiting for several within one deadline in all, not one
deadline each (`join_all`); a thread's own name where the operating system shows it (`name_native`).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Iterable

__all__ = ["join_all", "name_native"]

_PR_SET_NAME = 15  # <linux/prctl.h>
_NATIVE_NAME_BYTES = 15  # the kernel keeps 16 bytes, the NUL included


def join_all(threads: Iterable[threading.Thread], wait_s: float) -> bool:
    """Join each of `threads`, waiting `wait_s` in all; True when every one of them has ended."""
    threads = list(threads)
    deadline = time.monotonic() + wait_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def name_native(name: str | None = None) -> bool:
    """Give the calling thread its name (default: its Python name) where Linux shows it: `top -H`,
    `ps -L`, /proc/PID/task/TID/comm. CPython does not: every thread shows the name of the process
    or of the thread that started it (gRPC's "grpcpp_sync_ser" for the data plane's build threads),
    so an operator, or a benchmark (loadtest/flight_bench.py), cannot tell them apart. Cut to 15
    bytes; best effort: False where it could not be set."""
    if not sys.platform.startswith("linux"):
        return False
    raw = (name or threading.current_thread().name).encode("utf-8", "replace")[:_NATIVE_NAME_BYTES]
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
