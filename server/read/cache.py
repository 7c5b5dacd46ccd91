"""A bytes-bounded LRU shared by every stream of a server process, with coalesced fetches.

`get(key, fetch)` returns the cached value or calls `fetch()` once, however many threads ask for
the same key at the same time: the others wait for the first fetch's result (or its exception).
Values are charged at `sizeof(value)` bytes; the least recently used are evicted past `capacity`.
A value larger than the whole capacity is returned but not kept (unless a lease pins it: then
until the lease ends).

`prefetch(key, fetch)` is the read-ahead side: it reads a value nobody asked for yet (or refreshes
one already held, so it is not evicted before it is used); a `get` arriving while it reads waits for
that read instead of starting another.

`lease(keys, estimate)` is a build's side: it pins the values of `keys` for the build (held ones and
those it will read) so that none is evicted while the build uses them, and it waits first until the
cache has room for all of them at once. Pinned values and the estimated bytes of pinned reads in
flight stay within `capacity`, so the decoded row groups in memory stay within it too, however many
builds run (an evicted row group a build still used was memory nobody counted). A lease is granted
whole or not at all and holds nothing while it waits, so builds cannot deadlock; leases are granted
in order of arrival, except one that adds nothing (its keys pinned already); one larger than the
whole capacity is granted when nothing else is pinned. Unpinned values are evicted, least recently
used first; a read nobody pinned (`get`, `prefetch`) can still outgrow `capacity` by what it reads.

Accounting, for hit ratio and read amplification from Prometheus:
- a `get` is a **hit** when served from memory or by a read already in flight (coalesced, including
  a read-ahead), a **miss** when it had to read storage itself; `_hit_bytes_total` and
  `_miss_bytes_total` weigh them by the value's size;
- `_prefetches_total` counts reads started by read-ahead (not lookups: neither hit nor miss), and
  `_prefetches_wasted_total` those evicted before any lookup used them. `unused_prefetch_bytes` (the
  bytes read ahead and not used yet) is what read-ahead budgets against;
- a lease counts a hit for each of its keys held when it is granted (the others are read by `get`);
  `_room_waits_total` and `_room_wait_seconds_total` count the leases that waited for room.
Gauges are summed over live processes when several workers share a port (multiprocess mode).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

__all__ = ["LRUCache", "Lease"]

V = TypeVar("V")

CACHE_HITS = Counter("shardstream_cache_hits_total", "Row-group cache lookups served from memory")
CACHE_MISSES = Counter("shardstream_cache_misses_total", "Row-group cache lookups that read storage")
CACHE_HIT_BYTES = Counter("shardstream_cache_hit_bytes_total", "Bytes of row groups served by the cache")
CACHE_MISS_BYTES = Counter(
    "shardstream_cache_miss_bytes_total", "Bytes of row groups a lookup had to read from storage"
)
CACHE_PREFETCHES = Counter(
    "shardstream_cache_prefetches_total", "Row groups read ahead of need (read-ahead of the plan)"
)
CACHE_PREFETCHES_WASTED = Counter(
    "shardstream_cache_prefetches_wasted_total", "Row groups read ahead and evicted before any use"
)
CACHE_EVICTIONS = Counter("shardstream_cache_evictions_total", "Row groups evicted from the cache")
CACHE_ROOM_WAITS = Counter(
    "shardstream_cache_room_waits_total",
    "Builds that waited for room in the row-group cache (the row groups of builds in progress filled it)",
)
CACHE_ROOM_WAIT_SECONDS = Counter(
    "shardstream_cache_room_wait_seconds_total", "Seconds builds waited for room in the row-group cache"
)
CACHE_BYTES = Gauge(
    "shardstream_cache_bytes", "Bytes held by the row-group cache", multiprocess_mode="livesum"
)
CACHE_CAPACITY_BYTES = Gauge(
    "shardstream_cache_capacity_bytes", "Capacity of the row-group cache", multiprocess_mode="livesum"
)


class Lease(Generic[V]):
    """Keys pinned for one build (`LRUCache.lease`): `values[i]` is the value of `keys[i]` if it was
    held when the lease was granted, else None (read it with `get`: it stays pinned). `release()`
    unpins them (once); a lease is also a context manager that releases on exit."""

    def __init__(self, cache: LRUCache[V], keys: Sequence[Hashable], values: list[V | None]) -> None:
        self._cache = cache
        self.keys = keys
        self.values = values
        self._open = True

    def release(self) -> None:
        if self._open:
            self._open = False
            self._cache._unpin(self.keys)

    def __enter__(self) -> Lease[V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LRUCache(Generic[V]):
    def __init__(self, capacity_bytes: int, sizeof: Callable[[V], int]) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._sizeof = sizeof
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # leases waiting for room
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()  # least recently used first
        self._pins: dict[Hashable, int] = {}  # leases per pinned key (held or not)
        self._reserved: dict[Hashable, int] = {}  # pinned keys not held yet: their estimated bytes
        self._waiting: deque[object] = deque()  # leases waiting for room, in order of arrival
        self._inflight: dict[Hashable, Future[V]] = {}
        self._unused: set[Hashable] = set()  # read ahead, not looked up since
        self.bytes = 0  # held, pinned or not
        self.pinned_bytes = 0  # held and pinned, plus the estimates of pinned keys not held yet
        self._reserved_bytes = 0  # those estimates
        self.unused_prefetch_bytes = 0
        CACHE_CAPACITY_BYTES.set(capacity_bytes)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        """Held or being read."""
        with self._lock:
            return key in self._items or key in self._inflight

    def get(self, key: Hashable, fetch: Callable[[], V]) -> V:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                self._used(key, hit[1])
                CACHE_HITS.inc()
                CACHE_HIT_BYTES.inc(hit[1])
                return hit[0]
            pending = self._inflight.get(key)
            owner = pending is None
            if owner:
                pending = self._inflight[key] = Future()
                CACHE_MISSES.inc()
        assert pending is not None
        if not owner:
            value = pending.result()  # coalesced: served by another caller's read
            size = self._sizeof(value)
            with self._lock:
                self._used(key, size)
            CACHE_HITS.inc()
            CACHE_HIT_BYTES.inc(size)
            return value
        value = self._fill(key, pending, fetch)
        CACHE_MISS_BYTES.inc(self._sizeof(value))
        return value

    def lease(self, keys: Sequence[Hashable], estimate: Callable[[int], int]) -> Lease[V]:
        """Pin `keys` (distinct) for a build, once the cache has room for all of them (the module
        docstring): `estimate(i)` is the bytes `keys[i]` will take if it is not held. Held values
        count as hits."""
        with self._lock:
            if not self._waiting and self._fits(self._need(keys, estimate)):
                return Lease(self, keys, self._pin(keys, estimate))
            token = object()
            self._waiting.append(token)
            waited = time.perf_counter()
            while True:
                need = self._need(keys, estimate)
                if need == 0 or (self._waiting[0] is token and self._fits(need)):
                    break
                self._room.wait()
            self._waiting.remove(token)
            self._room.notify_all()  # the next in line may fit too
            values = self._pin(keys, estimate)
        CACHE_ROOM_WAITS.inc()
        CACHE_ROOM_WAIT_SECONDS.inc(time.perf_counter() - waited)
        return Lease(self, keys, values)

    def try_lease(self, keys: Sequence[Hashable]) -> Lease[V] | None:
        """`lease` of `keys` the cache holds, granted at once or not at all (None): when one is not
        held (or is being read), when leases wait for room, or when pinning them would not fit. A
        build that holds a lease already asks this way for more, so it never waits holding one."""
        with self._lock:
            if self._waiting or any(key not in self._items for key in keys):
                return None
            if not self._fits(self._need(keys, lambda i: 0)):
                return None
            return Lease(self, keys, self._pin(keys, lambda i: 0))

    def _fits(self, need: int) -> bool:
        """Whether a lease adding `need` bytes may be granted (under the lock): it adds nothing, fits
        beside what is pinned, or nothing is pinned (a lease larger than the cache, alone)."""
        pinned = self.pinned_bytes
        return need == 0 or pinned + need <= self.capacity_bytes or pinned == 0

    def _need(self, keys: Sequence[Hashable], estimate: Callable[[int], int]) -> int:
        """The bytes pinning `keys` would add (under the lock; no value referenced after: a lease
        waiting must not keep alive what the cache evicts meanwhile)."""
        pins, items = self._pins, self._items  # (locals: a full shuffle's lease has a key per row group)
        need = 0
        for i, key in enumerate(keys):
            if key not in pins:
                hit = items.get(key)
                need += hit[1] if hit is not None else estimate(i)
        return need

    def _pin(self, keys: Sequence[Hashable], estimate: Callable[[int], int]) -> list[V | None]:
        values: list[V | None] = []
        pins, items, unused = self._pins, self._items, self._unused
        hits = hit_bytes = pinned = 0
        for i, key in enumerate(keys):
            count = pins.get(key, 0)
            pins[key] = count + 1
            hit = items.get(key)
            if hit is None:
                if not count:
                    self._reserved[key] = size = estimate(i)
                    pinned += size
                    self._reserved_bytes += size
                values.append(None)
                continue
            size = hit[1]
            if not count:
                pinned += size
            if unused and key in unused:
                self._used(key, size)
            hits += 1
            hit_bytes += size
            values.append(hit[0])
        self.pinned_bytes += pinned
        if self._reserved_bytes:
            self._evict()  # room for the reads reserved
        if hits:
            CACHE_HITS.inc(hits)
            CACHE_HIT_BYTES.inc(hit_bytes)
        return values

    def _unpin(self, keys: Sequence[Hashable]) -> None:
        with self._lock:
            pins, items = self._pins, self._items
            unpinned = 0
            for key in keys:
                count = pins[key] - 1
                if count:
                    pins[key] = count
                    continue
                del pins[key]
                hit = items.get(key)
                if hit is not None:
                    unpinned += hit[1]
                    items.move_to_end(key)  # used last by this lease
                else:  # never read (its read failed, or the build stopped first)
                    estimate = self._reserved.pop(key)
                    unpinned += estimate
                    self._reserved_bytes -= estimate
            self.pinned_bytes -= unpinned
            self._evict()
            if self._waiting:
                self._room.notify_all()

    def prefetch(self, key: Hashable, fetch: Callable[[], V]) -> bool:
        """Read `key` ahead of need unless held or being read (then only refresh it); True if it read.

        Exceptions of `fetch` go to the `get` calls waiting on this read, and are raised here too.
        """
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return False
            if key in self._inflight:
                return False
            pending = self._inflight[key] = Future()
            CACHE_PREFETCHES.inc()
        self._fill(key, pending, fetch, prefetched=True)
        return True

    def _used(self, key: Hashable, size: int) -> None:
        if key in self._unused:  # (under the lock)
            self._unused.discard(key)
            self.unused_prefetch_bytes -= size

    def _fill(
        self, key: Hashable, pending: Future[V], fetch: Callable[[], V], *, prefetched: bool = False
    ) -> V:
        try:
            value = fetch()
        except BaseException as exc:
            with self._lock:
                del self._inflight[key]
            pending.set_exception(exc)
            raise
        self._put(key, value, prefetched)
        pending.set_result(value)
        return value

    def _put(self, key: Hashable, value: V, prefetched: bool) -> None:
        size = self._sizeof(value)
        with self._lock:
            del self._inflight[key]
            if key in self._pins:  # read for a lease: pinned, counted at its size instead of its estimate
                estimate = self._reserved.pop(key)
                self.pinned_bytes += size - estimate
                self._reserved_bytes -= estimate
                if size < estimate and self._waiting:
                    self._room.notify_all()  # smaller than its estimate: room for a lease waiting, maybe
            elif size > self.capacity_bytes:
                return
            self._items[key] = (value, size)
            self.bytes += size
            if prefetched:
                self._unused.add(key)
                self.unused_prefetch_bytes += size
            if not self._evict():
                CACHE_BYTES.set(self.bytes)

    def _evict(self) -> int:
        """Unpinned values, least recently used first, until they, the pinned ones and the reads
        reserved are within capacity (under the lock); how many."""
        evicted = 0
        items = self._items
        for _ in range(len(items)):  # each value looked at once at most
            if self.bytes + self._reserved_bytes <= self.capacity_bytes:
                break
            old = next(iter(items))
            if old in self._pins:
                items.move_to_end(old)  # in use: not evictable
                continue
            size = items.pop(old)[1]  # (the value is freed here, not when this returns)
            self.bytes -= size
            evicted += 1
            if old in self._unused:
                self._used(old, size)
                CACHE_PREFETCHES_WASTED.inc()
        if evicted:
            CACHE_EVICTIONS.inc(evicted)
            CACHE_BYTES.set(self.bytes)
        return evicted
