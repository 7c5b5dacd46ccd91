"""`Loader`: one rank's stream of batches from a shardstream fleet, resumable to the sample.

    with Loader(["10.0.0.5:7070"], "web@3", batch_size=32, rank=r, world_size=W, seed=0) as loader:
        for batch in loader:            # dict of numpy arrays (output="numpy"), tensors or Arrow
            train_step(batch)
            if step % 1000 == 0:
                save(model, loader.state_dict())

A background thread keeps a bounded queue of decoded batches full; the cursor advances only when a
batch is handed to the caller, so prefetched batches are never lost on restart. When a stream
breaks or a server is unavailable, the thread reconnects — to the next endpoint — at the first step
it has not received, with jittered exponential backoff, within a retry budget that progress resets.
`tls` and `token` (default $SHARDSTREAM_TOKEN) secure every channel it opens (credentials.py).

This module is the SDK's public surface — the cursor, the state, the job cursors, the schedules; the
rest is elsewhere: its options are a frozen `LoaderOptions` (loader_options.py: defaults, checks,
and the immutable `ReadSpec` the prefetch thread is handed, spec.py), the thread is prefetch.py, its
streams are `StreamSession`s (transport/session.py) over its `Fleet` (transport/fleet.py: the
connections, discovery and retries; the thread is handed its `open_read`), messages become batches
in decode.py, a job's cursors (store, commits, fencing, resume) are client/cursors/job.py's and the
schedules' state is schedule_state.py's.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.order.cursor_math import NO_SPLIT, RankStream, WorkerSplit, cursor_after, is_last_step
from shardstream.order.schedule import Schedule, job_position

from . import metrics
from .batch import BatchInfo
from .cursors.job import DEFAULT_COMMIT_TIMEOUT_S, JobCursors
from .loader_options import LoaderOptions, OptionAttribute, with_option_attributes
from .loader_state import LoaderState
from .prefetch import Done, Producer
from .schedule_state import LoaderSchedule
from .step_timings import StepClock
from .target import Target, dataset_refs, normalize_dataset, target_of
from .transport.channel import normalize_endpoints
from .transport.fleet import Fleet
from .transport.stall_report import StallReporter

__all__ = ["BatchInfo", "Loader"]


@with_option_attributes
class Loader:
    """Iterable of one rank's batches (see the module docstring).

    `endpoints`: 'host:port' strings (or one comma-separated string; 'dns:///host:port' for every
    address of a name). `dataset`: 'NAME[@VERSION|@TAG]', a mixture {ref: weight}, or mixture phases
    [(position, {ref: weight}), ...]. The keyword options — batch_size (required), rank, world_size,
    seed, shuffle, columns, epochs, output, transforms, job, ... — with their defaults and meanings are
    `LoaderOptions`' (client/loader_options.py), which checks them all before any network call.
    `loader.options` holds them in their normal form, and each is an attribute too (`loader.seed`;
    `loader.batch_size` is the first phase's; `loader.pin_memory` true only where it takes effect).
    """

    options: LoaderOptions

    def __init__(
        self, endpoints: str | Sequence[str], dataset: str | Mapping[str, float], **options: Any
    ) -> None:
        self.options = o = LoaderOptions.of(options)  # all checked, before any network call
        self.endpoints = normalize_endpoints(endpoints)
        self.dataset = normalize_dataset(dataset)
        self._schedule = LoaderSchedule(o.batch_size, o.skip_steps)  # the cursor completes it
        self._resumed_from: int | None = None
        self._resume_pending = o.resume is not None
        self._split = NO_SPLIT  # data-loader workers of one rank take every workers-th step each
        self._job = JobCursors(o.job, o.rank, o.world_size, o.cursor_store) if o.job is not None else None
        # the one session with the fleet: connections, discovery, grants, retries (transport/fleet.py)
        self._fleet = Fleet(self.endpoints, o.security, o.retry, owner="Loader")
        self._target: Target | None = None
        self._epoch = 0
        self._offset = 0
        self._steps = 0
        self._active = False
        self._closed = False
        self.last_batch: BatchInfo | None = None
        # where the step time goes between commits; each commit records it (step_timings.py), and a
        # Checkpointer.save(..., loader=self) adds its stall here
        self.step_clock = StepClock()
        self.dropped: dict[int, int] = {}  # epoch -> samples dropped by drop_last

    # Its options are read-only attributes (with_option_attributes); these two are lists, as they were.
    columns = OptionAttribute(lambda v: None if v is None else list(v))
    transforms = OptionAttribute(list)  # of pb.Transform

    @property
    def batch_size(self) -> int:
        """The batch size (of the first phase, with a batch-size schedule: `schedule` has them all)."""
        return self.options.first_batch

    # --- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Loader:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._close(quiet=exc_type is not None)  # never mask the exception that ends the block

    def close(self) -> None:
        """Stop streaming, write pending cursor commits (for at most timeout_s), close channels.

        When the newest commit did not reach the store (it failed unreported, or is still pending),
        close() raises its error once everything is closed; earlier failures a later commit superseded
        are logged at warning with their count and the last error. Leaving a `with` block because of
        an exception logs instead of raising (client/cursors/job.py)."""
        self._close(quiet=False)

    def _close(self, *, quiet: bool) -> None:
        self._closed = True
        self._fleet.close()
        if self._job is not None:
            self._job.close(self.timeout_s, quiet=quiet)

    def __del__(self) -> None:
        fleet = getattr(self, "_fleet", None)
        if fleet is not None and fleet.connected:
            warnings.warn(
                f"unclosed {self!r}: call close() or use it as a context manager",
                ResourceWarning,
                stacklevel=1,
            )
            self._close(quiet=True)

    def __repr__(self) -> str:
        return f"Loader({self.dataset!r}, rank={self.rank}/{self.world_size}, batch_size={self.batch_size})"

    # --- dataset -------------------------------------------------------------------------------
    @property
    def target(self) -> Target:
        """What this loader reads — versions resolved once (first use), then pinned: one GetDataset
        per ref, asked of the endpoints in turn from this rank's on its streams' RetryPolicy
        (Fleet.find_dataset); the endpoint that answers keeps the data port its Read streams dial."""
        if self._target is None:
            infos = [self._fleet.find_dataset(ref, self.rank) for ref in dataset_refs(self.dataset)]
            self._target = target_of(
                self.dataset,
                infos,
                columns=self.options.columns,
                seed=self.seed,
                mixture_block=self.mixture_block,
                mixture_epoch_samples=self.mixture_epoch_samples,
            )
        return self._target

    @property
    def pinned(self) -> str:
        return self.target.label

    def steps_per_epoch(self, offset: int = 0, epoch: int | None = None) -> int:
        """Steps this rank takes in an epoch started at `offset` (the last one short unless drop_last);
        with a batch-size schedule or skip ranges, in epoch `epoch` (default: the current one)."""
        return self.stream.layout(offset, self._epoch if epoch is None else epoch).num_steps

    @property
    def schedule(self) -> Schedule | None:
        """The plan's batch-size phases and skip ranges (job positions), None when plain. Skip ranges
        asked for as steps are placed from the cursor the first time this is read (schedule_state.py)."""
        return self._schedule.schedule(**self._cursor())

    @property
    def skipped(self) -> int:
        """Samples the job's cursor has moved past without delivering them (skip ranges)."""
        sched = self.schedule
        n = self.target.num_rows
        return 0 if sched is None else sched.skipped_between(0, job_position(self._epoch, self._offset, n))

    def _cursor(self) -> dict[str, Any]:
        return {
            "num_rows": self.target.num_rows,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "epoch": self._epoch,
            "offset": self._offset,
            "steps": self._steps,
        }

    def __len__(self) -> int:
        """This loader's steps in a whole epoch — the number an LR scheduler needs per epoch.

        The same for a resumed loader (the epoch it resumes in has fewer left: `steps_per_epoch(offset)`);
        without drop_last the last step is short; with `split_steps` it is this worker's share."""
        if self.epochs is None:
            raise TypeError(
                "an endless Loader (epochs=None) has no len(); steps_per_epoch() gives the steps of one epoch"
            )
        steps = self.steps_per_epoch()
        return len(range(self._split.worker, steps, self._split.workers))

    # --- state ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def offset(self) -> int:
        return self._offset

    def state_dict(self) -> dict[str, Any]:
        self._apply_resume()
        target = self.target
        return LoaderState(
            dataset=target.label,
            fingerprint=target.fingerprint,
            seed=self.seed,
            shuffle=str(self.shuffle),
            epoch=self._epoch,
            offset=self._offset,
            world_size=self.world_size,
            batch_size=self.batch_size,
            steps=self._steps,
            schedule=self._schedule.state(target, **self._cursor()),
            drop_last=self.drop_last,
            transforms=self.options.transforms_as_given,
            on_error=self.on_error,
            mixture_block=self.mixture_block,
            mixture_epoch_samples=self.mixture_epoch_samples,
            columns=self.options.columns,
            epochs=self.epochs,
            balance=self.options.balance_record,
        ).to_dict()

    def split_steps(self, worker: int, workers: int) -> None:
        """Read only every `workers`-th step of this rank's stream, the first `worker` steps on.

        For k data-loader workers sharing one rank (`client/torch_dataset.py`): worker j takes steps j, j+k,
        j+2k, ... of the rank's stream from where the cursor is now — counted across epochs, so that
        DataLoader's round robin hands them over in the stream's order at epoch boundaries too — and
        its cursor moves to its own first step. Call it before iterating; a `load_state_dict()` after
        it restores that worker's own saved cursor."""
        if self._active:
            raise RuntimeError("split_steps() while iterating: split before the loop starts")
        self._split = WorkerSplit(worker, workers)
        if worker:  # (worker 0's first step is where the cursor is: no need to resolve the target)
            first = self.stream.advance(self._epoch, self._offset, worker)
            self._epoch, self._offset = first if first is not None else (self._epoch, self.target.num_rows)

    @property
    def stream(self) -> RankStream:
        """This rank's steps epoch after epoch (cursor_math.RankStream), as this Loader cuts them."""
        return RankStream(
            self.target.num_rows, self.world_size, self.batch_size, self.drop_last, self.schedule
        )

    def delivered_elsewhere(self, epoch: int, start: int) -> None:
        """Move the cursor past the step of this rank's stream that starts at (epoch, start), which
        another reader of the same stream handed to the training loop (DataLoader workers,
        `client/torch_dataset.py`): exactly as iterating this Loader would have. It must be the next step
        (DataLossError otherwise: the training loop got steps out of order)."""
        if self._active:
            raise RuntimeError("delivered_elsewhere() while iterating this Loader")
        self._apply_resume()
        stream = self.stream
        nxt = stream.advance(self._epoch, self._offset, 0)
        if nxt is None or (self.epochs is not None and nxt[0] >= self.epochs) or nxt != (epoch, start):
            where = "does not exist" if nxt is None else f"is at epoch {nxt[0]} offset {nxt[1]}"
            raise DataLossError(
                f"{self.pinned} rank {self.rank}: the training loop got the step at epoch {epoch} offset {start}, "
                f"but the next step of the stream from the cursor (epoch {self._epoch}, offset {self._offset}) {where}"
            )
        e = self._epoch
        while e < epoch:  # epochs with no step left: as the prefetch thread's empty items move the cursor
            self.dropped[e] = stream.layout(self._offset if e == self._epoch else 0, e).dropped
            e += 1
        layout = stream.layout(start, epoch)  # the step is its first
        if is_last_step(layout, 0):
            self.dropped[epoch] = layout.dropped
        self._epoch, self._offset = cursor_after(layout, epoch, 0, NO_SPLIT)
        self._steps += 1

    # --- job cursors -------------------------------------------------------------------------
    def commit(self, step: int, wait: bool = False, *, timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S) -> None:
        """Record this rank's cursor for checkpoint `step` (the step your model checkpoint is for).

        By default it returns at once and a background thread writes to the cursor store; a failed
        write is counted (shardstream_client_cursor_commit_failures_total), logged once per burst of
        failures, and raised by `flush_commits()` (or `close()`). With `wait=True` it blocks until the
        store holds the write durably — as far as its configuration allows: client/cursors/redis_store.py and
        docs/jobs.md say what that is per Redis setup — and raises on failure (`UnavailableError`, or after
        `timeout_s`). The step is committed for the job once every rank has written it.

        A process whose rank a newer run of the job has claimed (the job was restarted while this
        process lived on) may not commit: `StaleRunError`, raised here once the store refused it.
        """
        if self._closed:
            raise RuntimeError("this Loader is closed")
        if self._job is None:
            raise RuntimeError("commit() needs a job: Loader(..., job='run-42')")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"step must be an integer >= 0, got {step!r}")
        state = LoaderState.from_dict(self.state_dict())
        self._job.commit(step, state, self.step_clock.take(), wait=wait, timeout_s=timeout_s)

    def flush_commits(self, timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S) -> None:
        """Wait for submitted commits; raise the failure (UnavailableError, StaleRunError, ...) if any
        failed since the last report, naming how many and the last one."""
        if self._job is not None:
            self._job.flush(timeout_s)

    @property
    def resumed_from(self) -> int | None:
        """The committed checkpoint step this loader resumes at (resume=...), None otherwise.

        Reading it applies the resume (one cursor-store read), so a training loop can restore the
        matching model checkpoint before its first batch."""
        self._apply_resume()
        return self._resumed_from

    def _apply_resume(self) -> None:
        if not self._resume_pending:
            return
        assert self._job is not None and self.resume is not None
        state, step = self._job.resume(self.resume, self.target, self.resume_min_step)
        self._load(state)
        self._resumed_from = step
        self._resume_pending = False

    def load_state_dict(self, state: Mapping[str, Any], schedule: str = "same") -> None:
        """Resume at `state`'s cursor. A state saved with other batch-size or mixture phases is refused
        unless `schedule="new"`: this loader's then apply from the cursor on (schedule_state.py)."""
        if self._active:
            raise RuntimeError("load_state_dict() while iterating: load the state before the loop starts")
        self._load(LoaderState.from_dict(state), schedule)
        self._resume_pending = False  # an explicit state wins over resume=

    def _load(self, st: LoaderState, schedule: str = "same") -> None:
        target = self.target
        st.check_compatible(
            dataset=target.label,
            fingerprint=self._schedule.load(st.schedule, target, st.fingerprint, schedule),
            seed=self.seed,
            shuffle=str(self.shuffle),
            num_rows=target.num_rows,
        )
        self._epoch, self._offset, self._steps = st.epoch, st.offset, st.steps
        self._schedule.records(**self._cursor())  # skip ranges asked for as steps: placed from here

    def _report_job(self) -> str:
        """The job a stall report names: the Loader's job, else its dataset's name ("mixture" for a mixture)."""
        if self.job is not None:
            return self.job
        label = self.target.label
        return "mixture" if "," in label else label.partition("@")[0]

    # --- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._active:
            raise RuntimeError("this Loader is already being iterated")
        started = time.perf_counter()  # the first-batch latency counts the resume's lookup too
        self._apply_resume()
        target = self.target
        if self.epochs is None and self.steps_per_epoch() == 0:
            raise InvalidArgumentError(
                f"{self.pinned} has {target.num_rows} rows: an epoch of world_size*batch_size="
                f"{self.world_size * self.batch_size} has no steps{' with drop_last' if self.drop_last else ''}, "
                "so an endless stream would never yield"
            )
        if self._job is not None:
            self._job.start()  # this process claims its rank of the job (client/cursors/job.py) as it starts streaming
        return self._iterate(started)

    def _iterate(self, started: float) -> Iterator[Any]:
        self._active = True
        origin = (self._epoch, self._offset)
        spec = self.options.read_spec(
            target=self.target, endpoints=self.endpoints, schedule=self.schedule, split=self._split, origin=origin
        )  # the immutable ReadSpec the prefetch thread reads (spec.py)
        producer = Producer(spec, self._fleet.open_read, *origin)
        rank_metrics = metrics.for_rank(self.job, self.rank)
        clock = self.step_clock
        clock.started()
        reporter = None
        if self.options.report_interval_s > 0:  # the fleet's scaling signal (transport/stall_report.py)
            reporter = StallReporter(
                self._fleet,
                lambda: producer.endpoint,
                self._report_job(),
                self.rank,
                self.options.report_interval_s,
                worker=self._split.worker,
            )
        try:
            while True:
                t0 = time.perf_counter()
                item = producer.get()
                waited = time.perf_counter() - t0
                rank_metrics.wait_seconds.observe(waited)
                clock.waited(waited)
                if reporter is not None:
                    info = None if isinstance(item, Done) else item.info
                    reporter.record(waited, 0 if info is None else info.num_rows)
                if isinstance(item, Done):
                    return
                if item.next_epoch != item.epoch:
                    self.dropped[item.epoch] = item.dropped
                self._epoch, self._offset = item.next_epoch, item.next_offset
                if item.info is None:
                    continue  # an epoch with no steps
                self._steps += 1
                rank_metrics.batches.inc()
                info = item.info
                clock.batch(info.cost * self.world_size / info.step_cost if info.step_cost > 0 else None)
                self.last_batch = info
                if started:
                    rank_metrics.first_batch_seconds.observe(time.perf_counter() - started)
                    started = 0.0
                yield item.batch
        finally:
            producer.stop()
            if reporter is not None:
                reporter.stop()
            self._active = False


