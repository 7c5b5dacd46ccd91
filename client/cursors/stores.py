"""Cursor stores, chosen by URL: where jobs keep their per-rank cursors, keyed by checkpoint step.

    redis://host:6379/0, rediss://… (TLS)   Redis through redis-py (the fleet default; redis_store.py)
    redis+cluster://host:7000               Redis Cluster (keys of one job share a hash slot)
    sqlite:///path/to/cursors.db            an embedded file (sqlite_store.py); the default is .shardstream/cursors.db
    memory://                               this process only (tests, single-process jobs)

A step is *committed* for a job when every rank of the world size it was written with has
written it, all with the same cursor (see `CursorStore`); `write` says whether this write completed
the step. Writes of one (job, step, cursor, rank) overwrite each other (a retried commit is
idempotent).

Every process that commits first claims its rank (`claim`) and writes with the generation it got:
a write of a process whose rank a newer run has claimed is refused with `StaleRunError`, and a step
completes only with records of the ranks' current holders (fence.py says why and what it cannot
tell). A `durable` write returns once the store keeps it across a crash of the store, as far as
the store's configuration allows (redis_store.py says what that is per Redis configuration; SQLite
commits with synchronous=FULL, so every write is).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from shardstream.errors import InvalidArgumentError, StaleRunError, UnclaimedError

from .fence import Run, Slot, decide_claim, issued_by, new_run_base, stale_message
from .redis_store import RedisStore
from .sqlite_store import SqliteStore, sqlite_path

__all__ = [
    "DEFAULT_STORE_URL",
    "CursorStore",
    "MemoryStore",
    "RedisStore",
    "SqliteStore",
    "check_shared",
    "open_store",
]

DEFAULT_STORE_URL = os.environ.get("SHARDSTREAM_CURSOR_STORE", "sqlite:///.shardstream/cursors.db")


@runtime_checkable
class CursorStore(Protocol):
    """Records are grouped per (job, step, cursor key): the key names the cursor (world size, dataset,
    epoch, offset) so that records left by an earlier run of the job at the same step number — a rank
    that died before its peers committed — never count towards a later run's commit. When several
    runs complete the same step, the last one to complete it is the step's committed record set."""

    url: str

    def claim(self, job: str, rank: int, world_size: int, token: str) -> int: ...  # the generation
    def write(
        self,
        job: str,
        step: int,
        key: str,
        rank: int,
        world_size: int,
        record: bytes,
        *,
        gen: int | None = None,  # the writer's claim; None: unfenced (tools, records of old clients)
        durable: bool = False,
    ) -> bool: ...
    def run(self, job: str) -> Run | None: ...  # who holds each rank of the job now
    def read(self, job: str, step: int) -> dict[int, bytes]: ...  # the committed records of the step
    # ... of these ranks only (those it has): a rank's resume reads two records, not all W (O(W) a storm)
    def read_ranks(self, job: str, step: int, ranks: Sequence[int]) -> dict[int, bytes]: ...
    def committed(self, job: str) -> list[int]: ...
    def latest(self, job: str) -> int | None: ...  # the newest committed step
    def steps(self, job: str) -> dict[int, int]: ...  # step -> most ranks written under one key
    def jobs(self) -> list[str]: ...
    def set_migration(self, job: str, record: bytes) -> None: ...  # the job's pending version move
    def get_migration(self, job: str) -> bytes | None: ...
    def close(self) -> None: ...


class MemoryStore:
    """Process-local; shared by the Loaders of one process."""

    # job -> step -> key -> rank -> record
    _shared: dict[str, dict[int, dict[str, dict[int, bytes]]]] = {}
    _committed: dict[str, dict[int, str]] = {}  # job -> step -> the key that completed it last
    _migrations: dict[str, bytes] = {}
    _gens: dict[str, dict[tuple[int, str, int], int]] = {}  # job -> (step, key, rank) -> writer's generation
    _runs: dict[str, tuple[int, int, dict[int, Slot]]] = {}  # job -> (world size, counter, slots)
    _bases: dict[str, int] = {}  # job -> where its run state's counter started (fence.new_run_base)
    _lock = threading.Lock()

    def __init__(self, url: str = "memory://") -> None:
        self.url = url

    @classmethod
    def clear(cls) -> None:
        with cls._lock:
            cls._shared.clear()
            cls._committed.clear()
            cls._migrations.clear()
            cls._gens.clear()
            cls._runs.clear()
            cls._bases.clear()

    def claim(self, job: str, rank: int, world_size: int, token: str) -> int:
        with self._lock:
            if job not in self._runs:
                self._bases[job] = new_run_base()
            world_now, counter, slots = self._runs.get(job, (None, self._bases[job], {}))
            c = decide_claim(
                world_size_now=world_now,
                counter=counter,
                holder=slots.get(rank),
                world_size=world_size,
                token=token,
            )
            slots = {} if c.clear else dict(slots)
            if c.take:
                slots[rank] = Slot(c.gen, token, time.time())
            self._runs[job] = (world_size, c.counter, slots)
            return c.gen

    def run(self, job: str) -> Run | None:
        with self._lock:
            if job not in self._runs:
                return None
            world_size, _, slots = self._runs[job]
            return Run(world_size, dict(slots))

    def write(
        self,
        job: str,
        step: int,
        key: str,
        rank: int,
        world_size: int,
        record: bytes,
        *,
        gen: int | None = None,
        durable: bool = False,
    ) -> bool:
        with self._lock:
            world_now, _, slots = self._runs.get(job, (None, 0, {}))
            if gen is not None and (
                job not in self._runs or not issued_by(gen, self._bases.get(job, 0), self._runs[job][1])
            ):
                raise UnclaimedError(
                    f"cursor store {self.url} holds no run of job {job!r} that issued generation {gen}"
                )
            if gen is not None and (rank not in slots or slots[rank].gen != gen):
                raise StaleRunError(stale_message(job, rank, gen, slots.get(rank), world_now, step))
            ranks = self._shared.setdefault(job, {}).setdefault(step, {}).setdefault(key, {})
            ranks[rank] = record
            gens = self._gens.setdefault(job, {})
            gens[(step, key, rank)] = gen or 0
            done = len(ranks) == world_size and all(
                g == 0 or (r in slots and slots[r].gen == g)
                for r, g in ((r, gens.get((step, key, r), 0)) for r in ranks)
            )
            if done:
                self._committed.setdefault(job, {})[step] = key
            return done

    def read(self, job: str, step: int) -> dict[int, bytes]:
        with self._lock:
            key = self._committed.get(job, {}).get(step)
            return dict(self._shared[job][step][key]) if key is not None else {}

    def read_ranks(self, job: str, step: int, ranks: Sequence[int]) -> dict[int, bytes]:
        records = self.read(job, step)
        return {r: records[r] for r in ranks if r in records}

    def committed(self, job: str) -> list[int]:
        with self._lock:
            return sorted(self._committed.get(job, {}))

    def latest(self, job: str) -> int | None:
        with self._lock:
            return max(self._committed.get(job, {}), default=None)

    def steps(self, job: str) -> dict[int, int]:
        with self._lock:
            return {s: max(map(len, keys.values())) for s, keys in sorted(self._shared.get(job, {}).items())}

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._shared)

    def set_migration(self, job: str, record: bytes) -> None:
        with self._lock:
            self._migrations[job] = record

    def get_migration(self, job: str) -> bytes | None:
        with self._lock:
            return self._migrations.get(job)

    def close(self) -> None:
        pass


def check_shared(url: str, world_size: int) -> None:
    """Refuse a store that the ranks of a multi-rank job would not share: a relative SQLite file is one
    per working directory, so ranks on several hosts would each commit alone and no step would ever
    be committed, silently."""
    if world_size > 1 and url.startswith("sqlite:") and not Path(sqlite_path(url)).is_absolute():
        raise InvalidArgumentError(
            f"world_size={world_size} with the cursor store {url}, a file relative to each process's working "
            'directory (ranks elsewhere never see it): pass cursor_store="redis://host:6379/0", or an absolute '
            'path that every rank opens, cursor_store="sqlite:////shared/fs/cursors.db" (SQLite: ranks on one '
            "host only), or set $SHARDSTREAM_CURSOR_STORE"
        )


def open_store(url: str | None = None) -> CursorStore:
    url = url or DEFAULT_STORE_URL
    if url.startswith(("redis://", "rediss://", "redis+cluster://", "unix://")):
        return RedisStore(url)
    if url.startswith("sqlite://"):
        return SqliteStore(url)
    if url.startswith("memory://"):
        return MemoryStore(url)
    raise InvalidArgumentError(
        f"unknown cursor store {url!r}: use redis://…, rediss://…, redis+cluster://…, sqlite:///path or memory://"
    )
