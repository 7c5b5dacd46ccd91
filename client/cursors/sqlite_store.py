"""The embedded cursor store: one SQLite file (sqlite:///relative/path.db, sqlite:////absolute/path.db).

Ranks on one host (processes) share it safely: WAL, a busy timeout, and every write one
`BEGIN IMMEDIATE` transaction that is durable when it returns (synchronous=FULL). Runs (fence.py)
live in tables of their own — `runs`, `run_slots`, `cursor_gens` — so files written before fencing
existed keep working, and so do older clients writing to a newer file (unfenced).

SQLite's WAL needs every process on the same host (shared memory): across hosts use Redis.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from shardstream.errors import FailedPreconditionError, InvalidArgumentError, StaleRunError, UnclaimedError

from .fence import RUN_FORMAT, Run, Slot, decide_claim, stale_message

__all__ = ["SqliteStore", "sqlite_path"]

_BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another's lock


class SqliteStore:
    """An embedded file store (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = Path(sqlite_path(url))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        _enable_wal(self._db())
        # the tables in one BEGIN IMMEDIATE: it waits for the write lock (the busy timeout) holding no
        # read lock, where statement by statement two ranks creating them could each find the other's
        # write between its read and its own (SQLITE_BUSY at once, no busy handler)
        with self._transaction() as db:
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
            db.execute(
                "CREATE TABLE IF NOT EXISTS runs (job TEXT PRIMARY KEY, format INTEGER NOT NULL,"
                " world_size INTEGER NOT NULL, counter INTEGER NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS run_slots (job TEXT NOT NULL, rank INTEGER NOT NULL, gen INTEGER NOT NULL,"
                " token TEXT NOT NULL, time REAL NOT NULL, PRIMARY KEY (job, rank))"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS cursor_gens (job TEXT NOT NULL, step INTEGER NOT NULL, key TEXT NOT NULL,"
                " rank INTEGER NOT NULL, gen INTEGER NOT NULL, PRIMARY KEY (job, step, key, rank))"
            )

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = sqlite3.connect(
                self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA synchronous=FULL")  # a transaction that returned is on disk
            self._all.append(db)
        return db

    def _transaction(self):  # type: ignore[no-untyped-def]
        return _Immediate(self._db())

    def claim(self, job: str, rank: int, world_size: int, token: str) -> int:
        with self._transaction() as db:
            row = db.execute("SELECT format, world_size, counter FROM runs WHERE job=?", (job,)).fetchone()
            if row is not None and row[0] > RUN_FORMAT:
                raise FailedPreconditionError(
                    f"cursor store {self.url}: job {job!r} was claimed by a newer client (run format {row[0]}, "
                    f"this one writes {RUN_FORMAT}): upgrade shardstream on every rank"
                )
            c = decide_claim(
                world_size_now=row[1] if row else None,
                counter=row[2] if row else 0,
                holder=self._slot(db, job, rank),
                world_size=world_size,
                token=token,
            )
            if c.clear:
                db.execute("DELETE FROM run_slots WHERE job=?", (job,))
            db.execute(
                "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?)", (job, RUN_FORMAT, world_size, c.counter)
            )
            if c.take:
                db.execute(
                    "INSERT OR REPLACE INTO run_slots VALUES (?, ?, ?, ?, ?)",
                    (job, rank, c.gen, token, time.time()),
                )
        return c.gen

    @staticmethod
    def _slot(db: sqlite3.Connection, job: str, rank: int) -> Slot | None:
        row = db.execute(
            "SELECT gen, token, time FROM run_slots WHERE job=? AND rank=?", (job, rank)
        ).fetchone()
        return Slot(int(row[0]), str(row[1]), float(row[2])) if row else None

    def run(self, job: str) -> Run | None:
        db = self._db()
        row = db.execute("SELECT world_size FROM runs WHERE job=?", (job,)).fetchone()
        if row is None:
            return None
        rows = db.execute(
            "SELECT rank, gen, token, time FROM run_slots WHERE job=? ORDER BY rank", (job,)
        ).fetchall()
        return Run(int(row[0]), {int(r): Slot(int(g), str(t), float(at)) for r, g, t, at in rows})

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
        with self._transaction() as db:
            if gen is not None:
                slot = self._slot(db, job, rank)
                if slot is None or slot.gen != gen:
                    row = db.execute("SELECT world_size FROM runs WHERE job=?", (job,)).fetchone()
                    if row is None:
                        raise UnclaimedError(f"cursor store {self.url} holds no run of job {job!r}")
                    raise StaleRunError(stale_message(job, rank, gen, slot, row[0], step))
            db.execute(
                "INSERT OR REPLACE INTO cursors VALUES (?, ?, ?, ?, ?, ?)",
                (job, step, key, rank, world_size, record),
            )
            db.execute(
                "INSERT OR REPLACE INTO cursor_gens VALUES (?, ?, ?, ?, ?)", (job, step, key, rank, gen or 0)
            )
            (n,) = db.execute(
                "SELECT count(*) FROM cursors WHERE job=? AND step=? AND key=?", (job, step, key)
            ).fetchone()
            # Records of processes that no longer hold their rank never complete a step.
            (replaced,) = db.execute(
                "SELECT count(*) FROM cursor_gens g LEFT JOIN run_slots s ON s.job=g.job AND s.rank=g.rank"
                " WHERE g.job=? AND g.step=? AND g.key=? AND g.gen != 0 AND (s.gen IS NULL OR s.gen != g.gen)",
                (job, step, key),
            ).fetchone()
            done = n == world_size and replaced == 0
            if done:
                db.execute("INSERT OR REPLACE INTO committed VALUES (?, ?, ?)", (job, step, key))
        return done

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

    def read_ranks(self, job: str, step: int, ranks: Sequence[int]) -> dict[int, bytes]:
        wanted = sorted(set(ranks))
        if not wanted:
            return {}
        rows = (
            self._db()
            .execute(
                "SELECT c.rank, c.record FROM cursors c JOIN committed k ON c.job=k.job AND c.step=k.step AND c.key=k.key"
                f" WHERE c.job=? AND c.step=? AND c.rank IN ({','.join('?' * len(wanted))})",
                (job, step, *wanted),
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


def _enable_wal(db: sqlite3.Connection) -> None:
    """`PRAGMA journal_mode=WAL`, retried for as long as the busy timeout. Switching a file to WAL
    takes it exclusively, and SQLite answers SQLITE_BUSY at once, without calling its busy handler,
    to a connection that holds a read lock while another waits for the file (a deadlock otherwise):
    ranks that open one new file together then fail "database is locked" (4 processes at once: 5
    rounds of 60 did). Once the file is in WAL mode the pragma changes nothing."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    delay = 0.001
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "database is locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay * (0.5 + random.random()))  # jittered: the other openers retry too
            delay = min(2 * delay, 0.05)


class _Immediate:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def sqlite_path(url: str) -> str:
    """The file of sqlite:///relative/file.db or sqlite:////absolute/file.db (SQLAlchemy's convention)."""
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else ""
    if not path:
        raise InvalidArgumentError(f"cursor store {url!r}: no file path (sqlite:///path/to/cursors.db)")
    return path
