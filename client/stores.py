"""Cursor stores, chosen by URL: where jobs keep their per-rank cursors, keyed by checkpoint step.

    redis://host:6379/0, rediss://… (TLS)   Redis through redis-py (the fleet default)
    redis+cluster://host:7000               Redis Cluster (keys of one job share a hash slot)
    sqlite:///path/to/cursors.db            an embedded file; the default is .shardstream/cursors.db
    memory://                               this process only (tests, single-process jobs)

A step is *committed* for a job when every rank of the world size it was written with has
written it, all with the same cursor (see `CursorStore`); `write` says whether this write completed
the step. Writes of one (job, step, cursor, rank) overwrite each other (a retried commit is
idempotent).
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
    """Records are grouped per (job, step, cursor key): the key names the cursor (world size, dataset,
    epoch, offset) so that records left by an earlier run of the job at the same step number — a rank
    that died before its peers committed — never count towards a later run's commit. When several
    runs complete the same step, the last one to complete it is the step's committed record set."""

    url: str

    def write(self, job: str, step: int, key: str, rank: int, world_size: int, record: bytes) -> bool: ...
    def read(self, job: str, step: int) -> dict[int, bytes]: ...  # the committed records of the step
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
    _lock = threading.Lock()

    def __init__(self, url: str = "memory://") -> None:
        self.url = url

    @classmethod
    def clear(cls) -> None:
        with cls._lock:
            cls._shared.clear()
            cls._committed.clear()
            cls._migrations.clear()

    def write(self, job: str, step: int, key: str, rank: int, world_size: int, record: bytes) -> bool:
        with self._lock:
            ranks = self._shared.setdefault(job, {}).setdefault(step, {}).setdefault(key, {})
            ranks[rank] = record
            done = len(ranks) == world_size
            if done:
                self._committed.setdefault(job, {})[step] = key
            return done

    def read(self, job: str, step: int) -> dict[int, bytes]:
        with self._lock:
            key = self._committed.get(job, {}).get(step)
            return dict(self._shared[job][step][key]) if key is not None else {}

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
        self._all: list[sqlite3.Connection] = []
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS cursors (job TEXT NOT NULL, step INTEGER NOT NULL, key TEXT NOT NULL,"
                " rank INTEGER NOT NULL, world_size INTEGER NOT NULL, record BLOB NOT NULL,"
                " PRIMARY KEY (job, step, key, rank))"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS committed (job TEXT NOT NULL, step INTEGER NOT NULL, key TEXT NOT NULL,"
                " PRIMARY KEY (job, step))"
            )
            db.execute("CREATE TABLE IF NOT EXISTS migrations (job TEXT PRIMARY KEY, record BLOB NOT NULL)")

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            self._all.append(db)
        return db

    def write(self, job: str, step: int, key: str, rank: int, world_size: int, record: bytes) -> bool:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT OR REPLACE INTO cursors VALUES (?, ?, ?, ?, ?, ?)",
                (job, step, key, rank, world_size, record),
            )
            (n,) = db.execute(
                "SELECT count(*) FROM cursors WHERE job=? AND step=? AND key=?", (job, step, key)
            ).fetchone()
            if n == world_size:
                db.execute("INSERT OR REPLACE INTO committed VALUES (?, ?, ?)", (job, step, key))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return n == world_size

    def read(self, job: str, step: int) -> dict[int, bytes]:
        rows = (
            self._db()
            .execute(
                "SELECT c.rank, c.record FROM cursors c JOIN committed k ON c.job=k.job AND c.step=k.step AND c.key=k.key"
                " WHERE c.job=? AND c.step=?",
                (job, step),
            )
            .fetchall()
        )
        return {int(r): bytes(rec) for r, rec in rows}

    def committed(self, job: str) -> list[int]:
        rows = self._db().execute("SELECT step FROM committed WHERE job=? ORDER BY step", (job,)).fetchall()
        return [int(s) for (s,) in rows]

    def latest(self, job: str) -> int | None:
        (step,) = self._db().execute("SELECT max(step) FROM committed WHERE job=?", (job,)).fetchone()
        return None if step is None else int(step)

    def steps(self, job: str) -> dict[int, int]:
        rows = (
            self._db()
            .execute(
                "SELECT step, max(n) FROM (SELECT step, key, count(*) AS n FROM cursors WHERE job=? GROUP BY step, key)"
                " GROUP BY step ORDER BY step",
                (job,),
            )
            .fetchall()
        )
        return {int(s): int(n) for s, n in rows}

    def jobs(self) -> list[str]:
        return [j for (j,) in self._db().execute("SELECT DISTINCT job FROM cursors ORDER BY job").fetchall()]

    def set_migration(self, job: str, record: bytes) -> None:
        self._db().execute("INSERT OR REPLACE INTO migrations VALUES (?, ?)", (job, record))

    def get_migration(self, job: str) -> bytes | None:
        row = self._db().execute("SELECT record FROM migrations WHERE job=?", (job,)).fetchone()
        return bytes(row[0]) if row else None

    def close(self) -> None:
        for db in self._all:
            db.close()
        self._all.clear()
        self._local = threading.local()


class RedisStore:
    """Redis or Redis Cluster. Keys of one job share the hash tag {job}, so a write and its
    completion check run in one Lua script (atomic) even on a cluster."""

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

    # KEYS: records of (step, key), all steps, committed steps, step -> committed key.
    # Record this rank's cursor; when it completes the step, mark the step committed under this key.
    _WRITE = """
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        redis.call('ZADD', KEYS[2], ARGV[3], ARGV[3])
        local n = redis.call('HLEN', KEYS[1])
        redis.call('HSET', KEYS[5], ARGV[3], math.max(n, tonumber(redis.call('HGET', KEYS[5], ARGV[3]) or 0)))
        if n == tonumber(ARGV[4]) then
            redis.call('ZADD', KEYS[3], ARGV[3], ARGV[3])
            redis.call('HSET', KEYS[4], ARGV[3], ARGV[5])
            return 1
        end
        return 0
    """

    def write(self, job: str, step: int, key: str, rank: int, world_size: int, record: bytes) -> bool:
        keys = [
            self._key(job, "step", step, key),
            self._key(job, "steps"),
            self._key(job, "committed"),
            self._key(job, "committed-key"),
            self._key(job, "ranks-written"),
        ]
        done = self._call(self._write_script, keys, [str(rank), record, str(step), str(world_size), key])
        self._call(self._client.sadd, f"{self._PREFIX}:jobs", job)
        return bool(done)

    def read(self, job: str, step: int) -> dict[int, bytes]:
        key = self._call(self._client.hget, self._key(job, "committed-key"), str(step))
        if key is None:
            return {}
        raw = self._call(self._client.hgetall, self._key(job, "step", step, key.decode()))
        return {int(k): bytes(v) for k, v in raw.items()}

    def committed(self, job: str) -> list[int]:
        return sorted(int(s) for s in self._call(self._client.zrange, self._key(job, "committed"), 0, -1))

    def latest(self, job: str) -> int | None:
        top = self._call(self._client.zrevrange, self._key(job, "committed"), 0, 0)
        return int(top[0]) if top else None

    def steps(self, job: str) -> dict[int, int]:
        raw = self._call(self._client.hgetall, self._key(job, "ranks-written"))
        return {int(s): int(n) for s, n in sorted(raw.items(), key=lambda kv: int(kv[0]))}

    def jobs(self) -> list[str]:
        return sorted(j.decode() for j in self._call(self._client.smembers, f"{self._PREFIX}:jobs"))

    def set_migration(self, job: str, record: bytes) -> None:
        self._call(self._client.set, self._key(job, "migration"), record)

    def get_migration(self, job: str) -> bytes | None:
        raw = self._call(self._client.get, self._key(job, "migration"))
        return bytes(raw) if raw is not None else None

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
