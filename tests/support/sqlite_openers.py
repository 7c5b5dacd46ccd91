"""A rank process for tests/test_cursors.py: opens one new SQLite cursor store per round at the same
moment as the other ranks (a barrier), writes its record and says how it went."""

from __future__ import annotations

from typing import Any


def open_together(urls: list[str], rank: int, world: int, barrier: Any, results: Any) -> None:
    from shardstream.client.cursors.sqlite_store import SqliteStore

    for url in urls:
        barrier.wait(timeout=120)
        try:
            store = SqliteStore(url)
            try:
                store.write("j", 1, "k", rank, world, b"r%d" % rank)
            finally:
                store.close()
            results.put((url, rank, None))
        except Exception as exc:  # noqa: BLE001 — reported to the test, which fails on it
            results.put((url, rank, repr(exc)))
