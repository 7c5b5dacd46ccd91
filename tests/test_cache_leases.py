"""The row-group cache's leases (server/read/cache.py): values a build uses are pinned and counted
until it is done, so what the cache reads stays within its capacity however many builds run at once
and however the LRU would have evicted; a lease is all or nothing, in order of arrival, and one larger
than the cache runs alone. Values here are objects that count themselves while alive (CPython frees
them at their last reference), so the bound is checked on what is really kept alive."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from shardstream.errors import DataLossError
from shardstream.server.read.cache import LRUCache
from shardstream.server.read.checksums import chunk_spans
from shardstream.server.read.reader import DatasetReader, new_row_group_cache
from shardstream.server.writing.ingest import IngestOptions, ingest

from .support.data import make_table
from .support.flips import flip_byte


class Alive:
    """The bytes of values alive now, and the most ever alive at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.now += n
            self.peak = max(self.peak, self.now)


class Value:
    def __init__(self, key: int, size: int, alive: Alive) -> None:
        self.key, self.size, self._alive = key, size, alive
        alive.add(size)
        _yield()  # a read takes time: the other builds go on meanwhile

    def __del__(self) -> None:
        self._alive.add(-self.size)


def _cache(capacity: int) -> LRUCache[Value]:
    return LRUCache(capacity, sizeof=lambda v: v.size)


def _yield() -> None:
    """Lets the other threads run here (so that builds overlap); not a wait for anything."""
    time.sleep(0.0001)


def _use(cache: LRUCache[Value], keys: list[int], size: Callable[[int], int], alive: Alive) -> None:
    """What a build does: lease, read what is not held, check, drop every reference, release."""
    with cache.lease(keys, lambda i: size(keys[i])) as lease:
        values = lease.values
        for i in range(len(keys)):  # (no loop variable: it would keep a value alive past the release)
            if values[i] is None:
                values[i] = cache.get(keys[i], lambda k=keys[i]: Value(k, size(k), alive))
        _yield()  # the build uses them
        assert [v.key for v in values if v is not None] == keys
        values.clear()


def _in_threads(plans: list[list[Any]], one: Callable[[Any], None]) -> None:
    """Each plan in a thread of its own, `one(item)` for each of its items; all finish, none fails."""
    errors: list[BaseException] = []

    def run(plan: list[Any]) -> None:
        try:
            for item in plan:
                one(item)
        except BaseException as exc:  # noqa: BLE001 — reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(p,)) for p in plans]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a lease never came (deadlock)"
    assert not errors, errors[0]


def _state_is_clean(cache: LRUCache[Any]) -> None:
    assert cache.pinned_bytes == 0 and cache._reserved_bytes == 0
    assert not cache._pins and not cache._reserved
    assert not cache._waiting and not cache._inflight
    assert cache.bytes == sum(size for _, size in cache._items.values()) <= cache.capacity_bytes


@pytest.mark.parametrize("seed", range(24))
def test_what_concurrent_builds_keep_alive_stays_within_the_capacity(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, size=40).tolist()
    capacity = int(rng.integers(12, 48))
    cache = _cache(capacity)
    alive = Alive()
    threads = int(rng.integers(2, 9))
    plans = [
        [
            rng.choice(40, size=int(rng.integers(1, 7)), replace=False).tolist()
            for _ in range(int(rng.integers(10, 40)))
        ]
        for _ in range(threads)
    ]
    _in_threads(plans, lambda keys: _use(cache, keys, lambda k: sizes[k], alive))
    largest = max(sum(sizes[k] for k in keys) for plan in plans for keys in plan)
    # the estimates are exact here: alive = the cache's values, pinned or not, within its capacity
    # (or one lease larger than the cache, alone)
    assert alive.peak <= max(capacity, largest), (alive.peak, capacity, largest)
    _state_is_clean(cache)
    assert alive.now == cache.bytes


def _run_build(cache: LRUCache[Value], keys: list[int], size: Callable[[int], int], alive: Alive) -> None:
    """What an unshuffled build does (build.py `_group_run`): lease one row group (waiting for it
    as any build), then take the next ones only as `try_lease` grants them at once."""
    first = keys[0]
    leases = [cache.lease([first], lambda i: size(first))]
    try:
        values = [leases[0].values[0] or cache.get(first, lambda: Value(first, size(first), alive))]
        for key in keys[1:]:
            more = cache.try_lease([key])
            if more is None:
                break
            leases.append(more)
            values.append(more.values[0])
        _yield()  # the build uses them
        assert [v.key for v in values] == keys[: len(values)]
        values.clear()
    finally:
        for lease in leases:
            lease.release()


@pytest.mark.parametrize("seed", range(12))
def test_builds_that_take_more_row_groups_only_at_once_never_wait_holding_one(seed: int) -> None:
    """Builds that hold a lease and ask for more with `try_lease` never wait on each other (no
    deadlock, whatever the capacity) and keep alive what the cache's capacity allows."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, size=30).tolist()
    capacity = int(rng.integers(9, 40))
    cache = _cache(capacity)
    alive = Alive()
    plans = [
        [
            [int(k) % 30 for k in range(start, start + int(rng.integers(1, 6)))]
            for start in rng.integers(0, 30, size=int(rng.integers(10, 40)))
        ]
        for _ in range(int(rng.integers(2, 9)))
    ]
    _in_threads(plans, lambda keys: _run_build(cache, keys, lambda k: sizes[k], alive))
    assert alive.peak <= capacity, (alive.peak, capacity)
    _state_is_clean(cache)


def test_try_lease_grants_held_values_at_once_or_nothing() -> None:
    cache = _cache(10)
    alive = Alive()
    assert cache.try_lease([1]) is None  # not held
    cache.get(1, lambda: Value(1, 4, alive))
    cache.get(2, lambda: Value(2, 4, alive))
    lease = cache.try_lease([1])
    assert lease is not None and lease.values[0].key == 1 and cache.pinned_bytes == 4
    assert cache.try_lease([1, 3]) is None  # all or nothing
    lease.release()
    reading = cache.lease([5], lambda i: 2)  # being read (reserved, not held): not granted
    assert cache.try_lease([5]) is None
    reading.release()
    _state_is_clean(cache)
    waiting = cache.lease([6], lambda i: 8)
    behind = threading.Thread(target=lambda: cache.lease([7], lambda i: 8).release())
    behind.start()
    _wait_for(lambda: len(cache._waiting) == 1)
    assert cache.try_lease([2]) is None  # a lease waits for room: none is granted past it
    waiting.release()
    behind.join(timeout=30)
    assert not behind.is_alive()
    cache.get(2, lambda: Value(2, 4, alive))  # (the reservations above evicted it)
    lease = cache.try_lease([2])
    assert lease is not None and lease.values[0].key == 2
    lease.release()
    _state_is_clean(cache)


def test_a_lease_larger_than_the_cache_waits_for_the_others_and_runs_alone() -> None:
    cache = _cache(10)
    alive = Alive()
    small = cache.lease([1, 2], lambda i: 4)
    for key in (1, 2):
        cache.get(key, lambda key=key: Value(key, 4, alive))
    granted = threading.Event()
    big_lease: list[Any] = []

    def big() -> None:
        big_lease.append(cache.lease([3, 4, 5], lambda i: 6))  # 18 bytes > 10
        granted.set()

    thread = threading.Thread(target=big)
    thread.start()
    _wait_for(lambda: len(cache._waiting) == 1)
    assert not granted.is_set()
    # a lease arriving later waits behind the big one (order of arrival), though it would fit
    later = threading.Event()
    late_lease: list[Any] = []

    def late() -> None:
        late_lease.append(cache.lease([6], lambda i: 1))
        later.set()

    late_thread = threading.Thread(target=late)
    late_thread.start()
    _wait_for(lambda: len(cache._waiting) == 2)
    # one whose keys are all pinned already adds nothing: granted at once
    again: list[Any] = []
    adds_nothing = threading.Thread(target=lambda: again.append(cache.lease([1], lambda i: 4)), daemon=True)
    adds_nothing.start()
    adds_nothing.join(10)
    assert again, "a lease that adds nothing waited behind the others"
    assert again[0].values[0] is not None and again[0].values[0].key == 1
    again[0].release()
    assert not granted.is_set() and not later.is_set()
    small.release()
    assert granted.wait(10)
    thread.join()
    assert cache.pinned_bytes == 18  # nothing else pinned: the big one alone, over the capacity
    assert not later.is_set()
    big_lease[0].release()
    assert later.wait(10)
    late_thread.join()
    late_lease[0].release()
    _state_is_clean(cache)


def test_a_read_that_fails_gives_back_its_reservation() -> None:
    cache = _cache(10)

    def broken() -> Value:
        raise OSError("storage went away")

    with cache.lease([1, 2], lambda i: 5) as lease:
        assert lease.values == [None, None] and cache.pinned_bytes == 10
        with pytest.raises(OSError):
            cache.get(1, broken)
    _state_is_clean(cache)
    assert cache.bytes == 0


def test_a_read_counts_at_its_size_not_its_estimate() -> None:
    cache = _cache(100)
    alive = Alive()
    with cache.lease([1], lambda i: 10):
        assert cache.pinned_bytes == 10
        cache.get(1, lambda: Value(1, 30, alive))
        assert cache.pinned_bytes == 30 and cache.bytes == 30
    assert cache.pinned_bytes == 0 and cache.bytes == 30 and 1 in cache


def test_pinned_values_are_not_evicted_and_unpinned_ones_are_least_recently_used_first() -> None:
    cache = _cache(10)
    alive = Alive()
    for key in (1, 2):
        cache.get(key, lambda key=key: Value(key, 4, alive))
    with cache.lease([1], lambda i: 4):
        cache.get(3, lambda: Value(3, 4, alive))  # over the capacity: 2 goes, 1 is pinned
        assert 1 in cache and 2 not in cache and 3 in cache
    cache.get(4, lambda: Value(4, 4, alive))  # 1 was used last by its lease: 3 goes
    assert 1 in cache and 3 not in cache and 4 in cache
    _state_is_clean(cache)


def test_a_value_larger_than_the_cache_is_kept_while_pinned_only() -> None:
    cache = _cache(10)
    alive = Alive()
    with cache.lease([1], lambda i: 20) as lease:
        assert lease.values == [None]
        cache.get(1, lambda: Value(1, 20, alive))
        assert 1 in cache and cache.bytes == 20
    assert 1 not in cache and cache.bytes == 0 and alive.now == 0


# --- through DatasetReader.take: the builds' reads ----------------------------------------------------
@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[Any]]:
    tmp = tmp_path_factory.mktemp("leases")
    pq.write_table(make_table(4000), tmp / "src.parquet")
    options = IngestOptions(row_group_rows=100, shard_rows=1000, progress=False)
    m = ingest(tmp / "src.parquet", "toy", tmp / "root", options)
    return m, [tmp / "root" / "toy" / s.uri for s in m.shards]


@pytest.mark.parametrize("seed", range(6))
def test_takes_at_once_through_a_cache_smaller_than_their_row_groups_get_their_rows(toy: Any, seed: int) -> None:
    m, paths = toy
    reader = DatasetReader(m, paths, new_row_group_cache(0))  # capacity set below, from a row group's size
    whole = reader.take(np.arange(100), ["id", "text"]).nbytes
    cache = new_row_group_cache(4 * whole)  # 4 of the 40 row groups; a take of 24 random rows touches ~20
    reader = DatasetReader(m, paths, cache)
    rng = np.random.default_rng(seed)
    plans = [[rng.choice(4000, size=int(rng.integers(1, 25)), replace=False) for _ in range(12)] for _ in range(4)]

    def take(rows: np.ndarray) -> None:
        batch = reader.take(rows, ["id", "text"])
        assert batch.column("id").to_pylist() == rows.tolist()
        assert batch.column("text").to_pylist() == [f"sample-{i}" for i in rows]

    _in_threads(plans, take)
    _state_is_clean(cache)


def test_a_take_whose_read_fails_unpins_what_it_held(toy: Any, tmp_path: Any) -> None:
    m, paths = toy
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(paths[1].read_bytes())
    span = chunk_spans(pq.read_metadata(bad), 2, bad.stat().st_size)[0]
    flip_byte(bad, span.start + span.length // 2, 0x20)
    cache = new_row_group_cache(1 << 30)
    reader = DatasetReader(m, [paths[0], bad, *paths[2:]], cache)
    rows = np.array([5, 1250, 1150, 3000])  # shard 1's row group 2 among others
    with pytest.raises(DataLossError, match="row group 2"):
        reader.take(rows, ["id"])
    _state_is_clean(cache)
    assert reader.take(np.array([5, 3000]), ["id"]).column("id").to_pylist() == [5, 3000]
    _state_is_clean(cache)


def _wait_for(condition: Callable[[], bool]) -> None:
    event = threading.Event()
    for _ in range(10_000):
        if condition():
            return
        event.wait(0.001)
    raise AssertionError("condition not reached")
