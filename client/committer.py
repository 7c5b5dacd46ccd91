"""Writes cursor records to the store off the training thread.

`submit` returns at once; a daemon thread writes in order (only the newest, when several are
pending: the store never falls unboundedly behind). Failures are counted, kept, and
reported to the caller on its next call (`take_failures`) and by `flush`; a store that is down
never blocks or crashes training.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from shardstream.errors import ShardstreamError, UnavailableError

from . import metrics
from .stores import CursorStore

__all__ = ["Committer"]

log = logging.getLogger("shardstream.client")


class Committer:
    def __init__(self, store: CursorStore, job: str, rank: int) -> None:
        self.store = store
        self.job = job
        self.rank = rank
        self._queue: queue.Queue[tuple[int, str, bytes, int] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._failures: list[tuple[int, BaseException]] = []
        self.committed_steps: list[int] = []  # steps this rank's write completed for the job
        self._thread = threading.Thread(target=self._run, name=f"shardstream-commit-r{rank}", daemon=True)
        self._thread.start()

    def submit(self, step: int, key: str, record: bytes, world_size: int) -> None:
        self._queue.put((step, key, record, world_size))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            # When the store lags behind the training loop, write only the newest pending commit:
            # resuming needs the latest step every rank committed, not each step on the way.
            while item is not None and not self._queue.empty():
                newer = self._queue.get_nowait()
                self._queue.task_done()
                metrics.COMMITS_SKIPPED.inc()
                item = newer
            try:
                if item is None:
                    return
                step, key, record, world_size = item
                metrics.COMMITS.inc()
                t0 = time.perf_counter()
                try:
                    done = self.store.write(self.job, step, key, self.rank, world_size, record)
                except Exception as exc:  # noqa: BLE001 — kept and reported on the next call
                    metrics.COMMIT_FAILURES.inc()
                    with self._lock:
                        self._failures.append((step, exc))
                    continue
                metrics.COMMIT_SECONDS.observe(time.perf_counter() - t0)
                if done:
                    with self._lock:
                        self.committed_steps.append(step)
            finally:
                self._queue.task_done()

    def take_failures(self) -> list[tuple[int, BaseException]]:
        with self._lock:
            out, self._failures = self._failures, []
        for step, exc in out:
            log.warning(
                "cursor commit of job %s step %d (rank %d) failed: %s", self.job, step, self.rank, exc
            )
        return out

    def flush(self, timeout_s: float) -> None:
        """Wait until every submitted commit is written; raise if any failed since the last report."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"cursor commits of job {self.job} still pending after {timeout_s:g} s"
                )
            time.sleep(0.01)
        failures = self.take_failures()
        if failures:
            step, exc = failures[-1]
            cls = type(exc) if isinstance(exc, ShardstreamError) else UnavailableError
            raise cls(f"{len(failures)} cursor commit(s) failed; last: step {step}: {exc}") from exc

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
