"""Message buffers kept for the next message: a bounded free list of the gather's output buffers.

The server allocates Arrow memory from jemalloc with immediate decay (server/lifecycle.py), which is
what keeps its RSS within the buffer budget: a message's buffers go back to the system the moment
Flight has written it. The price is that every copied message starts on fresh pages: a 2 MiB
gathered message takes ~514 page faults, ~550 us of its ~2 ms build (block shuffle, 2 shared vCPUs;
loadtest/README.md, issue #26). `MessageBuffers` keeps up to `max_bytes` of such buffers (Arrow's
pool, allocated once) and hands one out again once nothing refers to it any more: the batch that
used it has been written and dropped, so its pages are reused warm. The server sets `max_bytes` to
an eighth of its stream buffer budget, at most 32 MiB (server/lifecycle.py).

How it knows a buffer is free: each is a numpy array over an Arrow allocation; a message gets
`pa.py_buffer` of a slice of it, and that slice (held by the Arrow buffer until Arrow drops it)
refers to the array. When the array's reference count is back to what the pool itself holds, no
message uses it. The free list never blocks: when every buffer it holds is in use (stalled streams
keep theirs), a new buffer comes from Arrow's pool as before and goes back to the system when
dropped. So the pool adds at most `max_bytes` to the process's memory (within the slack of the bound
in admission.py), and what a message holds is counted by admission as before (build.py
`Message.holds`).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pyarrow as pa

__all__ = ["DEFAULT_MAX_BYTES", "MIN_POOLED_BYTES", "MessageBuffers", "message_buffers"]

DEFAULT_MAX_BYTES = 32 << 20  # buffers kept, in use or free, per process
MIN_POOLED_BYTES = 64 << 10  # smaller buffers come from Arrow's pool every time (few pages each)
_ROUND = 64 << 10  # capacities are multiples of this, so messages of nearly one size share buffers
_FREE_REFS = 2  # a free buffer is referred to by the pool's list and `_in_use`'s call only


class MessageBuffers:
    """Writable buffers of an exact size, reusing ones no message refers to any more."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, *, min_bytes: int = MIN_POOLED_BYTES) -> None:
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._held: list[np.ndarray] = []  # uint8 arrays over Arrow allocations: in use or free
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # buffers handed out again (tests, benchmarks)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def get(self, nbytes: int) -> pa.Buffer:
        """A buffer of `nbytes` (contents undefined: the caller writes all of it)."""
        if nbytes < self.min_bytes or nbytes > self.max_bytes // 4:
            return pa.allocate_buffer(nbytes)
        with self._lock:
            base = self._free(nbytes)
            if base is None:
                base = self._add(max(1, -(-nbytes // _ROUND)) * _ROUND)
                if base is None:
                    return pa.allocate_buffer(nbytes)
            else:
                self.reused += 1
            return pa.py_buffer(base[:nbytes])  # the slice refers to `base` while Arrow holds it

    def _free(self, nbytes: int) -> np.ndarray | None:
        """A free buffer of at least `nbytes` and at most a quarter more (the smallest such)."""
        best = None
        for i in range(len(self._held)):
            size = len(self._held[i])
            if nbytes <= size <= nbytes + nbytes // 4 + _ROUND and not self._in_use(i):
                if best is None or size < len(self._held[best]):
                    best = i
        return None if best is None else self._held[best]

    def _in_use(self, i: int) -> bool:
        return sys.getrefcount(self._held[i]) > _FREE_REFS

    def _add(self, capacity: int) -> np.ndarray | None:
        """A new buffer of `capacity`, making room by dropping free ones of other sizes; None if the
        buffers in use leave no room."""
        while self._bytes + capacity > self.max_bytes:
            victim = next((i for i in range(len(self._held)) if not self._in_use(i)), None)
            if victim is None:
                return None
            self._bytes -= len(self._held.pop(victim))
        base = np.frombuffer(pa.allocate_buffer(capacity), dtype=np.uint8)
        self._held.append(base)
        self._bytes += capacity
        return base

    def clear(self) -> None:
        """Let go of every buffer (those in use stay alive as long as their messages do)."""
        with self._lock:
            self._held.clear()
            self._bytes = 0


_BUFFERS = MessageBuffers()


def message_buffers() -> MessageBuffers:
    """The process's message buffers."""
    return _BUFFERS
