"""A bytes-bounded LRU shared by every stream of a server process, with coalesced fetches.

`get(key, fetch)` returns the cached value or calls `fetch()` once, however many threads ask for
the same key at the same time: the others wait for the first fetch's result (or its exception).
Values are charged at `sizeof(value)` bytes; the least recently used are evicted past `capacity`.
A value larger than the whole capacity is returned but not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

__all__ = ["LRUCache"]

V = TypeVar("V")

CACHE_HITS = Counter("shardstream_cache_hits_total", "Row-group cache lookups served from memory")
CACHE_MISSES = Counter("shardstream_cache_misses_total", "Row-group cache lookups that read storage")
CACHE_EVICTIONS = Counter("shardstream_cache_evictions_total", "Row groups evicted from the cache")
CACHE_BYTES = Gauge("shardstream_cache_bytes", "Bytes held by the row-group cache")


class LRUCache(Generic[V]):
    def __init__(self, capacity_bytes: int, sizeof: Callable[[V], int]) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._sizeof = sizeof
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._inflight: dict[Hashable, Future[V]] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable, fetch: Callable[[], V]) -> V:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                CACHE_HITS.inc()
                return hit[0]
            pending = self._inflight.get(key)
            owner = pending is None
            if owner:
                pending = self._inflight[key] = Future()
                CACHE_MISSES.inc()
            else:
                CACHE_HITS.inc()  # coalesced: served by another caller's read
        assert pending is not None
        if not owner:
            return pending.result()
        try:
            value = fetch()
        except BaseException as exc:
            with self._lock:
                del self._inflight[key]
            pending.set_exception(exc)
            raise
        self._put(key, value)
        pending.set_result(value)
        return value

    def _put(self, key: Hashable, value: V) -> None:
        size = self._sizeof(value)
        with self._lock:
            del self._inflight[key]
            if size > self.capacity_bytes:
                return
            self._items[key] = (value, size)
            self.bytes += size
            while self.bytes > self.capacity_bytes:
                _, (_, evicted) = self._items.popitem(last=False)
                self.bytes -= evicted
                CACHE_EVICTIONS.inc()
            CACHE_BYTES.set(self.bytes)
