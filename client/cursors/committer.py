"""Writes one rank's cursor records to the store off the training thread, as one run of the job.

The thread first claims the rank for this process (fence.py; again before a write while the claim
has not succeeded, e.g. the store was down at start), then writes submitted commits in order — only
the newest when several are pending, so the store never falls unboundedly behind. `submit` returns
at once with a `PendingCommit`; `wait` blocks on one (commit(wait=True): a durable write, its error
raised to the caller).

Failures of commits nobody waits for are counted (shardstream_client_cursor_commit_failures_total),
logged once per burst — when commits start failing and when they recover, not once per failed
commit — and handed to the consumer: `flush` raises them, `close` returns the error its owner should
raise. A store that is down never blocks or crashes training. A run refused as stale (a newer run
holds the rank) stays refused: nothing more is sent to the store, and `check_stale` raises.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from shardstream.errors import ShardstreamError, StaleRunError, UnavailableError, UnclaimedError

from .. import metrics
from .fence import process_token
from .stores import CursorStore

__all__ = ["Committer", "PendingCommit"]

log = logging.getLogger("shardstream.client")


@dataclass(eq=False)
class PendingCommit:
    step: int
    key: str
    record: bytes
    world_size: int
    durable: bool = False
    waited: bool = False  # a caller blocks on it: its error goes to that caller
    done: threading.Event = field(default_factory=threading.Event)
    error: ShardstreamError | None = None


_CLAIM = object()  # the first item: claim the rank before anything is written
_STOP = object()  # the last item


class Committer:
    def __init__(self, store: CursorStore, job: str, rank: int, world_size: int) -> None:
        self.store = store
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.token = process_token()
        self._metrics = metrics.for_rank(job, rank)
        self.gen: int | None = None  # this process's claim on the rank, once made
        self._queue: queue.Queue[object] = queue.Queue()
        self._lock = threading.Lock()
        self._stale: StaleRunError | None = None
        self._stale_logged = False
        self._unreported = 0  # failed commits nobody waited for, since the last flush
        self._last_failure: tuple[int, ShardstreamError] | None = None
        self._burst = 0  # consecutive failed store calls (logged at the first and at recovery)
        self._newest: PendingCommit | None = None
        self.committed_steps: list[int] = []  # steps this rank's write completed for the job
        self._queue.put(_CLAIM)
        self._thread = threading.Thread(target=self._run, name=f"shardstream-commit-r{rank}", daemon=True)
        self._thread.start()

    def submit(self, step: int, key: str, record: bytes, *, durable: bool = False) -> PendingCommit:
        item = PendingCommit(step, key, record, self.world_size, durable=durable, waited=durable)
        with self._lock:
            self._newest = item
        self._queue.put(item)
        return item

    # --- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            # When the store lags behind the training loop, write only the newest pending commit:
            # resuming needs the latest step every rank committed, not each step on the way.
            items = [self._queue.get()]
            while isinstance(items[-1], PendingCommit) and not self._queue.empty():
                items.append(self._queue.get_nowait())
            batch = [i for i in items if isinstance(i, PendingCommit)]
            try:
                if batch:
                    self._metrics.commits_skipped.inc(len(batch) - 1)
                    self._write(batch)
                if items[-1] is _CLAIM:
                    self._claim()
            finally:
                for _ in items:
                    self._queue.task_done()
            if items[-1] is _STOP:
                return

    def _claim(self) -> None:
        try:
            self.gen = self.store.claim(self.job, self.rank, self.world_size, self.token)
        except Exception as exc:  # noqa: BLE001 — logged here, retried before the next write
            self._failed(_shardstream_error(exc, self.store.url), f"claiming rank {self.rank}")

    def _write(self, batch: list[PendingCommit]) -> None:
        item = batch[-1]
        durable = any(p.durable for p in batch)
        self._metrics.commits.inc()
        t0 = time.perf_counter()
        try:
            if self._stale is not None:
                raise self._stale
            if self.gen is None:  # the claim at start failed: again, as part of this commit
                self.gen = self.store.claim(self.job, self.rank, self.world_size, self.token)
            try:
                done = self._store_write(item, durable)
            except UnclaimedError as exc:
                # the store lost the job's run (wiped, restarted empty): nobody newer can hold the rank
                log.warning("%s: claiming rank %d again", exc, self.rank)
                self.gen = None
                self.gen = self.store.claim(self.job, self.rank, self.world_size, self.token)
                done = self._store_write(item, durable)
        except Exception as exc:  # noqa: BLE001 — handed to the consumer below
            err = _shardstream_error(exc, self.store.url)
            if isinstance(err, StaleRunError):
                self._stale = err
            self._metrics.commit_failures.inc()
            with self._lock:
                if not any(p.waited for p in batch):
                    self._unreported += 1
                    self._last_failure = (item.step, err)
                for p in batch:
                    p.error = err
                    p.done.set()
            self._failed(err, f"committing step {item.step}")
            return
        self._metrics.commit_seconds.observe(time.perf_counter() - t0)
        self._metrics.last_commit.set_to_current_time()
        if self._burst:
            log.warning(
                "cursor commits of job %s (rank %d) work again after %d failed attempt(s)",
                self.job,
                self.rank,
                self._burst,
            )
            self._burst = 0
        with self._lock:
            if done:
                self.committed_steps.append(item.step)
            for p in batch:
                p.done.set()

    def _store_write(self, item: PendingCommit, durable: bool) -> bool:
        return self.store.write(
            self.job,
            item.step,
            item.key,
            self.rank,
            item.world_size,
            item.record,
            gen=self.gen,
            durable=durable,
        )

    def _failed(self, err: ShardstreamError, doing: str) -> None:
        """Log the first failure of a burst; the rest are counted until the store answers again.
        A refusal as a stale run is logged once, at error: it never ends."""
        if isinstance(err, StaleRunError):
            if not self._stale_logged:
                self._stale_logged = True
                log.error("%s", err)
            return
        self._burst += 1
        if self._burst == 1:
            log.warning(
                "cursor store failing for job %s (rank %d), %s: %s — training goes on; further failures are "
                "counted in shardstream_client_cursor_commit_failures_total and raised by flush_commits()",
                self.job,
                self.rank,
                doing,
                err,
            )

    # --- the consumer's side ---------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def check_stale(self) -> None:
        """Raise StaleRunError once this run is known to be stale: nothing it commits is kept."""
        if self._stale is not None:
            raise StaleRunError(str(self._stale))

    def wait(self, item: PendingCommit, timeout_s: float) -> None:
        """Until `item` is written (durably, if it asked to be); its error, or UnavailableError after timeout_s."""
        if not item.done.wait(timeout_s):
            with self._lock:
                item.waited = False  # if it fails later, flush reports it
            raise UnavailableError(
                f"cursor commit of job {self.job} step {item.step} (rank {self.rank}) not written within {timeout_s:g} s"
            )
        if item.error is not None:
            raise _again(
                item.error, f"cursor commit of job {self.job} step {item.step} (rank {self.rank}) failed"
            )

    def _drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def _take_failures(self) -> tuple[int, tuple[int, ShardstreamError] | None]:
        with self._lock:
            out = (self._unreported, self._last_failure)
            self._unreported, self._last_failure = 0, None
        return out

    def flush(self, timeout_s: float) -> None:
        """Wait until every submitted commit is written; raise if any failed since the last report."""
        if not self._drain(timeout_s):
            raise UnavailableError(f"cursor commits of job {self.job} still pending after {timeout_s:g} s")
        n, last = self._take_failures()
        if last is not None:
            step, exc = last
            raise _again(
                exc, f"{n} cursor commit(s) of job {self.job} (rank {self.rank}) failed; last: step {step}"
            )

    def close(self, timeout_s: float) -> ShardstreamError | None:
        """Write what is pending (at most timeout_s) and stop the thread. Returns the error the owner
        should raise: the newest commit did not land (it failed unreported, or is still pending).
        Earlier failures that a later commit superseded are logged here, at warning."""
        drained = self._drain(timeout_s)
        n, last = self._take_failures()
        with self._lock:
            newest = self._newest
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout_s if drained else 0)
        if not drained and newest is not None and not newest.done.is_set():
            return UnavailableError(
                f"job {self.job} (rank {self.rank}): the cursor commit of step {newest.step} was still not written "
                f"after {timeout_s:g} s at close(); the store does not hold it"
            )
        if last is None:
            return None
        step, exc = last
        if newest is not None and newest.error is exc:
            return _again(
                exc,
                f"job {self.job} (rank {self.rank}): the last cursor commit (step {step}) failed and the store does not "
                f"hold it; {n} commit(s) failed since the last flush_commits()",
            )
        log.warning(
            "job %s (rank %d): %d cursor commit(s) failed since the last flush_commits() (last: step %d: %s); the "
            "newest commit, step %d, was written",
            self.job,
            self.rank,
            n,
            step,
            exc,
            newest.step if newest is not None else -1,
        )
        return None


def _shardstream_error(exc: BaseException, url: str) -> ShardstreamError:
    if isinstance(exc, ShardstreamError):
        return exc
    err = UnavailableError(f"cursor store {url}: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def _again(exc: ShardstreamError, context: str) -> ShardstreamError:
    """A fresh error of the same class, raised on the consumer's side with what it is about."""
    err = type(exc)(f"{context}: {exc}")
    err.__cause__ = exc
    return err
