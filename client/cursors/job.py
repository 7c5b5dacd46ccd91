"""One rank's side of a job's cursors: the store it commits to as one run of the job, and where it resumes.

`Loader(job=...)` hands everything about the job to a `JobCursors`: the options are checked
(`check_job_options`) and the store is checked before anything is opened (a multi-rank job on a relative SQLite file is refused: `check_shared`); the
commit thread (committer.py) starts — and claims the rank for this process, fence.py — when the
Loader starts streaming or first commits, so a Loader that is only built (to validate arguments, or
to read `resumed_from`) takes nothing over from a running job.

`close` raises when the newest commit did not reach the store (it failed and nothing reported it,
or it is still pending): the job would otherwise end looking fine with its last cursor lost. Earlier
failures that a later commit superseded are only logged (the store holds the newer cursor), and so
is everything while an exception is already on its way out of a `with` block (never masked).
"""

from __future__ import annotations

import logging
import time

from shardstream.errors import InvalidArgumentError

from ..loader_state import LoaderState
from ..step_timings import StepTimings
from ..target import Target
from .committer import Committer
from .records import CursorRecord, validate_job
from .resume import committed_state
from .stores import DEFAULT_STORE_URL, CursorStore, check_shared, open_store

__all__ = ["DEFAULT_COMMIT_TIMEOUT_S", "JobCursors", "check_job_options"]

log = logging.getLogger("shardstream.client")

DEFAULT_COMMIT_TIMEOUT_S = 30.0  # commit(wait=True) and flush_commits(): a Redis failover takes ~10-20 s


def check_job_options(
    job: str | None, cursor_store: object, resume: str | int | None, resume_min_step: int | None
) -> None:
    """The Loader's job options, checked before anything is opened (ValueError naming the values)."""
    if job is not None:
        validate_job(job)
    elif cursor_store is not None or resume is not None:
        raise InvalidArgumentError("cursor_store and resume need a job name (job='run-42')")
    if (
        resume is not None
        and resume != "latest"
        and (isinstance(resume, bool) or not isinstance(resume, int) or resume < 0)
    ):
        raise InvalidArgumentError(f"resume must be None, 'latest' or a step number >= 0, got {resume!r}")
    if resume_min_step is not None and (
        resume != "latest"
        or isinstance(resume_min_step, bool)
        or not isinstance(resume_min_step, int)
        or resume_min_step < 0
    ):
        raise InvalidArgumentError(
            "resume_min_step (the step of the checkpoint being restored, an integer >= 0) goes with "
            f"resume='latest', got resume={resume!r}, resume_min_step={resume_min_step!r}"
        )


class JobCursors:
    def __init__(
        self,
        job: str,
        rank: int,
        world_size: int,
        cursor_store: str | CursorStore | None,
    ) -> None:
        self.job = job
        self.rank = rank
        self.world_size = world_size
        given = isinstance(cursor_store, CursorStore)
        url = (
            cursor_store.url if isinstance(cursor_store, CursorStore) else (cursor_store or DEFAULT_STORE_URL)
        )
        check_shared(url, world_size)
        self.store: CursorStore = cursor_store if isinstance(cursor_store, CursorStore) else open_store(url)
        self._owns_store = not given
        self._committer: Committer | None = None
        self._closed = False

    def start(self) -> Committer:
        """The commit thread, started (and the rank claimed for this process) on first use."""
        if self._closed:
            raise RuntimeError(f"the Loader of job {self.job} is closed")
        if self._committer is None:
            self._committer = Committer(self.store, self.job, self.rank, self.world_size)
        return self._committer

    def resume(self, resume: str | int, target: Target, min_step: int | None) -> tuple[LoaderState, int]:
        return committed_state(self.store, self.job, resume, target, min_step=min_step, rank=self.rank)

    def commit(
        self, step: int, state: LoaderState, timings: StepTimings | None = None, *, wait: bool, timeout_s: float
    ) -> None:
        committer = self.start()
        committer.check_stale()
        record = CursorRecord(self.job, self.rank, step, state, time.time(), run=committer.token, timings=timings)
        pending = committer.submit(step, record.key, record.to_bytes(), durable=wait)
        if wait:
            committer.wait(pending, timeout_s)

    def flush(self, timeout_s: float) -> None:
        if self._committer is not None:
            self._committer.flush(timeout_s)

    def close(self, timeout_s: float, *, quiet: bool) -> None:
        """Write what is pending and stop; raise the newest commit's failure (log it when `quiet`).
        Closing again does nothing; the store can still be read (a resume)."""
        if self._closed:
            return
        self._closed = True
        committer, self._committer = self._committer, None
        error = committer.close(timeout_s) if committer is not None else None
        if self._owns_store and (committer is None or not committer.alive):
            self.store.close()
        if error is not None:
            if not quiet:
                raise error
            log.warning("%s", error)
