"""Waiting for several threads within one deadline in all, not one deadline each (client and server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

__all__ = ["join_all"]


def join_all(threads: Iterable[threading.Thread], wait_s: float) -> bool:
    """Join each of `threads`, waiting `wait_s` in all; True when every one of them has ended."""
    threads = list(threads)
    deadline = time.monotonic() + wait_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)
