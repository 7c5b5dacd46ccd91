"""Read-ahead of the plan: fetch the row groups of a stream's next message before it is built.

A stream builds message k+1 while message k is sent; without read-ahead, building k+1 starts by
waiting for its row groups. `ReadAhead.schedule(plan, steps)` is called as message k is submitted
with the steps the next message(s) will likely cover: in a background pool it selects their rows
(the same pure plan functions `MessageBuilder.build` uses) and reads their row groups into the shared cache, where
the build finds them held or in flight (a coalesced wait, never a second read). It changes no byte:
it only warms the cache, and a guess that misses (the next message covers other steps) costs reads.
It looks up at most SAMPLE_POSITIONS evenly spaced positions of those steps (a block-shuffled lookup
costs ~0.25 µs a position: 7 ms for the ~28k rows of a 2 MiB message, 0.7 ms for 1,024), enough to
find the row groups of a shuffle window; a row group it misses is read by the build as usual.

Bounded so that read-ahead never evicts what the streams are using: all streams together hold at
most `capacity / 4` bytes read ahead and not used yet (in flight, estimated, plus in the cache), and
at most `2 × threads` jobs queued; beyond that read-ahead is skipped (counted), never queued. A
prefetched row group evicted before use is counted as wasted (cache.py).

A stream whose last IDLE_BEFORE_PROBING read-aheads found every row group held (a dataset hot in the
cache) looks only every PROBE_EVERY-th message after that, and at every message again once a look
finds one to read: a look costs ~60 µs a 2 MiB message unshuffled and ~330-460 µs shuffled (the
order of 1,024 positions, their row groups, a cache lookup each), all of it wasted on a hot dataset
(issue #26; loadtest/README.md, "One message's build").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
from prometheus_client import Counter

from .balanced_layout import positions_array, rank_positions
from .reader import DatasetReader, RowGroupCache

__all__ = ["DEFAULT_READ_AHEAD_MESSAGES", "ReadAhead"]

log = logging.getLogger(__name__)

DEFAULT_READ_AHEAD_MESSAGES = 1
READ_AHEAD_THREADS = 8
SAMPLE_POSITIONS = 1024
IDLE_BEFORE_PROBING = 8  # a stream's read-aheads in a row that found nothing to read ...
PROBE_EVERY = 8  # ... before it looks only every PROBE_EVERY-th message
_MAX_STREAMS_TRACKED = 4096  # streams whose idle look-ups are remembered (forgotten all at once beyond)

READ_AHEAD_SKIPPED = Counter(
    "shardstream_read_ahead_skipped_total",
    "Read-aheads of a message skipped or cut short because the read-ahead budget was spent",
)


class _Plan(Protocol):
    """What read-ahead needs of a stream's `ReadPlan` (plan.py)."""

    readers: list[DatasetReader]
    selector: Any  # DatasetOrder | MixtureOrder: select(epoch, positions) -> (source, row)
    layout: Any  # StepLayout
    columns: list[str]
    rank: int
    epoch: int


class ReadAhead:
    def __init__(self, messages: int, cache: RowGroupCache, threads: int = READ_AHEAD_THREADS) -> None:
        if messages < 0:
            raise ValueError(f"read-ahead must be >= 0 messages, got {messages}")
        self.messages = messages
        self._cache = cache
        self._max_unused_bytes = cache.capacity_bytes // 4
        self._max_jobs = 2 * threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="shardstream-readahead")
        self._lock = threading.Lock()
        self._inflight_bytes = 0
        self._jobs = 0
        self._idle: dict[int, int] = {}  # id(plan) -> its read-aheads in a row that found nothing to read

    def schedule(self, plan: _Plan, steps: Sequence[int]) -> None:
        """Start reading the row groups of `steps` of `plan` in the background (returns at once)."""
        if not self.messages or not steps or not self._max_unused_bytes:
            return
        with self._lock:
            idle = self._idle.get(id(plan), 0)
            if idle >= IDLE_BEFORE_PROBING and (idle - IDLE_BEFORE_PROBING) % PROBE_EVERY:
                self._idle[id(plan)] = idle + 1  # a hot stream: this message is not looked at
                return
            if self._jobs >= self._max_jobs:
                READ_AHEAD_SKIPPED.inc()
                return
            self._jobs += 1
        try:
            self._pool.submit(self._job, plan, steps)
        except RuntimeError:  # the pool is shut down (interpreter exit)
            with self._lock:
                self._jobs -= 1

    def _job(self, plan: _Plan, steps: Sequence[int]) -> None:
        try:
            positions = positions_array([rank_positions(plan.layout, s, plan.rank) for s in steps])
            if len(positions) > SAMPLE_POSITIONS:
                positions = positions[np.linspace(0, len(positions) - 1, SAMPLE_POSITIONS).astype(np.int64)]
            src, rows = plan.selector.select(plan.epoch, positions)
            budget = self._budget()
            found = budget < self._max_unused_bytes  # (other reads ahead in flight: not idle)
            for i, reader in enumerate(plan.readers):
                mine = rows[src == i] if len(plan.readers) > 1 else rows
                for estimate, task in reader.read_ahead(mine, plan.columns, budget):
                    found = True
                    if not self._reserve(estimate):
                        READ_AHEAD_SKIPPED.inc()
                        self._idled(plan, True)
                        return
                    budget -= estimate
                    self._pool.submit(self._run, task, estimate)
            self._idled(plan, found)
        except Exception:  # noqa: BLE001 — the build that needs these rows reads and reports itself
            log.debug("read-ahead failed", exc_info=True)
        finally:
            with self._lock:
                self._jobs -= 1

    def _idled(self, plan: _Plan, found: bool) -> None:
        """Count a look at `plan`'s next rows that found row groups to read (`found`) or none."""
        with self._lock:
            if len(self._idle) > _MAX_STREAMS_TRACKED:
                self._idle.clear()
            self._idle[id(plan)] = 0 if found else self._idle.get(id(plan), 0) + 1

    def _budget(self) -> int:
        with self._lock:
            return self._max_unused_bytes - self._inflight_bytes - self._cache.unused_prefetch_bytes

    def _reserve(self, nbytes: int) -> bool:
        with self._lock:
            if self._inflight_bytes + self._cache.unused_prefetch_bytes + nbytes > self._max_unused_bytes:
                return False
            self._inflight_bytes += nbytes
            return True

    def _run(self, task: Callable[[], bool], estimate: int) -> None:
        try:
            task()
        except Exception:  # noqa: BLE001 — handed to any build waiting on this read (cache.py)
            log.debug("read-ahead of a row group failed", exc_info=True)
        finally:
            with self._lock:
                self._inflight_bytes -= estimate
