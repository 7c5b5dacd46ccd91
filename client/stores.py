"""Cursor stores, chosen by URL: where jobs keep their per-rank cursors, keyed by checkpoint step.

    redis://host:6379/0, rediss://… (TLS)   Redis through redis-py (the fleet default)
    redis+cluster://host:7000               Redis Cluster (keys of one job share a hash slot)
    sqlite:///path/to/cursors.db            an embedded file; the default is .shardstream/cursors.db
    memory://                               this process only (tests, single-process jobs)

A step is *committed* for a job when every rank of the world size it was written with has
written it; `write` says whether this write completed the step. Writes of one (job, step, rank)
overwrite each other (a retried commit is idempotent).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

from shardstream.errors import InvalidArgumentError, UnavailableError

__all__ = ["DEFAULT_STORE_URL", "CursorStore", "MemoryStore", "RedisStore", "SqliteStore", "open_store"]

DEFAULT_STORE_URL = os.environ.get("SHARDSTREAM_CURSOR_STORE", "sqlite:///.shardstream/cursors.db")
REDIS_TIMEOUT_S = 2.0  # per Redis operation: a commit never hangs the committer thread for long


@runtime_checkable
class CursorStore(Protocol):
    url: str

    def write(self, job: str, step: int, rank: int, world_size: int, record: bytes) -> bool: ...
    def read(self, job: str, step: int) -> dict[int, bytes]: ...
    def committed(self, job: str) -> list[int]: ...
    def steps(self, job: str) -> dict[int, int]: ...  # step -> ranks written
    def jobs(self) -> list[str]: ...
    def close(self) -> None: ...


class MemoryStore:
    """Process-local; shared by the Loaders of one process."""

    _shared: dict[str, dict[int, dict[int, tuple[int, bytes]]]] = {}
    _lock = threading.Lock()

    def __init__(self, url: str = "memory://") -> None:
        self.url = url

    def write(self, job: str, step: int, rank: int, world_size: int, record: bytes) -> bool:
        with self._lock:
            ranks = self._shared.setdefault(job, {}).setdefault(step, {})
            ranks[rank] = (world_size, record)
            return len(ranks) == world_size

    def read(self, job: str, step: int) -> dict[int, bytes]:
        with self._lock:
            return {r: rec for r, (_, rec) in self._shared.get(job, {}).get(step, {}).items()}

    def committed(self, job: str) -> list[int]:
        with self._lock:
            steps = self._shared.get(job, {})
            return sorted(
                s for s, ranks in steps.items() if ranks and len(ranks) == next(iter(ranks.values()))[0]
            )

    def steps(self, job: str) -> dict[int, int]:
        with self._lock:
            return {s: len(r) for s, r in sorted(self._shared.get(job, {}).items())}

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._shared)

    def close(self) -> None:
        pass


class SqliteStore:
    """An embedded file store: ranks on one host (processes) share it safely (WAL, busy timeout)."""

    def __init__(self, url: str) -> None:
        self.url = url
        # sqlite:///relative/file.db or sqlite:////absolute/file.db (the SQLAlchemy convention)
        path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else ""
        if not path:
            raise InvalidArgumentError(f"cursor store {url!r}: no file path (sqlite:///path/to/cursors.db)")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS cursors (job TEXT NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL,"
                " world_size INTEGER NOT NULL, record BLOB NOT NULL, PRIMARY KEY (job, step, rank))"
            )

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        return db

    def write(self, job: str, step: int, rank: int, world_size: int, record: bytes) -> bool:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT OR REPLACE INTO cursors VALUES (?, ?, ?, ?, ?)", (job, step, rank, world_size, record)
            )
            (n,) = db.execute("SELECT count(*) FROM cursors WHERE job=? AND step=?", (job, step)).fetchone()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return n == world_size

    def read(self, job: str, step: int) -> dict[int, bytes]:
        rows = (
            self._db()
            .execute("SELECT rank, record FROM cursors WHERE job=? AND step=?", (job, step))
            .fetchall()
        )
        return {int(r): bytes(rec) for r, rec in rows}

    def committed(self, job: str) -> list[int]:
        rows = (
            self._db()
            .execute(
                "SELECT step FROM cursors WHERE job=? GROUP BY step HAVING count(*) = max(world_size) ORDER BY step",
                (job,),
            )
            .fetchall()
        )
        return [int(s) for (s,) in rows]

    def steps(self, job: str) -> dict[int, int]:
        rows = (
            self._db()
            .execute("SELECT step, count(*) FROM cursors WHERE job=? GROUP BY step ORDER BY step", (job,))
            .fetchall()
        )
        return {int(s): int(n) for s, n in rows}

    def jobs(self) -> list[str]:
        return [j for (j,) in self._db().execute("SELECT DISTINCT job FROM cursors ORDER BY job").fetchall()]

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


class RedisStore:
    """Redis or Redis Cluster. Keys of one job share the hash tag {job}, so a step's write and its
    completion check run in one MULTI/EXEC transaction even on a cluster."""

    _PREFIX = "shardstream"

    def __init__(self, url: str) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - redis is in the client extra
            raise InvalidArgumentError(
                "a redis:// cursor store needs the redis package (pip install redis)"
            ) from exc
        self.url = url
        self._redis = redis
        opts = {"socket_timeout": REDIS_TIMEOUT_S, "socket_connect_timeout": REDIS_TIMEOUT_S}
        if url.startswith("redis+cluster://"):
            self._client = redis.RedisCluster.from_url(
                "redis://" + url.removeprefix("redis+cluster://"), **opts
            )
        else:
            self._client = redis.Redis.from_url(url, **opts)
        self._write_script = self._client.register_script(self._WRITE)

    def _key(self, job: str, *parts: object) -> str:
        return ":".join([self._PREFIX, "{" + job + "}", *map(str, parts)])

    def _call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except self._redis.RedisError as exc:
            raise UnavailableError(f"cursor store {self.url}: {type(exc).__name__}: {exc}") from exc

    # Record this rank's cursor and, when it completes the step, mark the step committed: atomically.
    _WRITE = """
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        redis.call('ZADD', KEYS[2], ARGV[3], ARGV[3])
        if redis.call('HLEN', KEYS[1]) == tonumber(ARGV[4]) then
            redis.call('ZADD', KEYS[3], ARGV[3], ARGV[3])
            return 1
        end
        return 0
    """

    def write(self, job: str, step: int, rank: int, world_size: int, record: bytes) -> bool:
        keys = [self._key(job, "step", step), self._key(job, "steps"), self._key(job, "committed")]
        done = self._call(self._write_script, keys, [str(rank), record, str(step), str(world_size)])
        self._call(self._client.sadd, f"{self._PREFIX}:jobs", job)
        return bool(done)

    def read(self, job: str, step: int) -> dict[int, bytes]:
        raw = self._call(self._client.hgetall, self._key(job, "step", step))
        return {int(k): bytes(v) for k, v in raw.items()}

    def committed(self, job: str) -> list[int]:
        return sorted(int(s) for s in self._call(self._client.zrange, self._key(job, "committed"), 0, -1))

    def steps(self, job: str) -> dict[int, int]:
        steps = sorted(int(s) for s in self._call(self._client.zrange, self._key(job, "steps"), 0, -1))
        return {s: int(self._call(self._client.hlen, self._key(job, "step", s))) for s in steps}

    def jobs(self) -> list[str]:
        return sorted(j.decode() for j in self._call(self._client.smembers, f"{self._PREFIX}:jobs"))

    def close(self) -> None:
        self._client.close()


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
