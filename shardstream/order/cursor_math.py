"""Where one rank's cursor stands, as pure functions of the plan (no I/O): the exactly-once arithmetic.

A job's cursor is (epoch, global sample offset): the offset where the next global step starts
(DESIGN §4). The client advances it when a batch is handed to the training loop; these functions say
to what. A rank's stream can also be split by step between the k data-loader workers of that rank
(`WorkerSplit`): worker j takes the steps j, j+k, j+2k, ... of the rank's stream — counted across
epochs, so that DataLoader's round robin over its workers hands the steps over in the stream's own
order at every epoch boundary too (an epoch of 64 steps and 3 workers: worker 1 takes steps 1, 4,
..., 61 of one epoch and steps 0, 3, ... of the next). A worker's cursor is the start of its next
step; it moves k steps of the stream at a time, into a later epoch when its epoch has no more.

    layout = StepLayout(num_rows, offset, world_size, batch_size, drop_last)
    cursor_after(layout, epoch, step, split)   # the cursor once `step` is handed over
    epoch_start(num_rows, global_batch, split) # where a worker's first step of an epoch starts (no split)
    stream = RankStream.of(layout)             # the rank's epochs, to walk a cursor across them
    stream.advance(epoch, offset, n)           # the start of the n-th step delivered from a cursor
    stream.worker_epoch_start(origin, workers, epoch)  # a worker's first step of a later epoch

A `ScheduledLayout` (batch-size phases, skip ranges: scheduled_steps.py) works the same way; the
next epoch's first step is then where its layout says (a skip range may cover the epoch's start).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError
from shardstream.order.read_order import StepLayout
from shardstream.order.schedule import Schedule, job_position
from shardstream.order.scheduled_steps import Layout, ScheduledLayout, make_layout

__all__ = [
    "NO_SPLIT",
    "RankStream",
    "WorkerSplit",
    "cursor_after",
    "epoch_start",
    "is_last_step",
    "split_offset",
]


@dataclass(frozen=True)
class WorkerSplit:
    """Worker `worker` of `workers` takes every `workers`-th step of one rank's stream (no split: 0 of 1)."""

    worker: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise InvalidArgumentError(f"workers must be an integer >= 1, got {self.workers!r}")
        if (
            isinstance(self.worker, bool)
            or not isinstance(self.worker, int)
            or not 0 <= self.worker < self.workers
        ):
            raise InvalidArgumentError(f"worker must be in [0, {self.workers}), got {self.worker!r}")


NO_SPLIT = WorkerSplit()


@dataclass(frozen=True)
class RankStream:
    """One rank's steps, epoch after epoch: the layouts a cursor walks through (any world size W;
    `batch_size` is the first phase's when `schedule` has batch-size phases)."""

    num_rows: int
    world_size: int
    batch_size: int
    drop_last: bool = False
    schedule: Schedule | None = None

    @classmethod
    def of(cls, layout: Layout) -> RankStream:
        if isinstance(layout, ScheduledLayout):
            s = layout.schedule
            return cls(layout.num_rows, layout.world_size, s.first_batch, layout.drop_last, s)
        return cls(layout.num_rows, layout.world_size, layout.batch_size, layout.drop_last)

    def layout(self, offset: int, epoch: int) -> Layout:
        """The steps of `epoch` from `offset`."""
        return make_layout(
            self.num_rows,
            offset,
            self.world_size,
            self.batch_size,
            self.drop_last,
            epoch=epoch,
            schedule=self.schedule,
        )

    def _alike_from(self, epoch: int) -> bool:
        """Whether every epoch from `epoch` on has the same steps (no schedule event ahead)."""
        if self.schedule is None or self.schedule.is_plain:
            return True
        return self.schedule.plain_until(job_position(epoch, 0, self.num_rows)) is None

    def seek(self, epoch: int, index: int) -> tuple[int, int] | None:
        """The cursor (epoch, start) of step `index` counted from the first step of `epoch`, in that
        epoch or a later one; None when no later epoch has a step (the stream has no such step).
        O(epochs with an event) layouts: runs of alike epochs are jumped by division."""
        while True:
            whole = self.layout(0, epoch)
            m = whole.num_steps
            if index < m:
                return epoch, whole.global_range(index)[0]
            if self._alike_from(epoch):
                if m == 0:
                    return None
                epoch, index = epoch + index // m, index % m
                continue
            epoch, index = epoch + 1, index - m

    def advance(self, epoch: int, offset: int, n: int) -> tuple[int, int] | None:
        """The cursor (epoch, start) of the n-th step delivered from cursor (epoch, offset) — n=0: the
        next one, which is the cursor itself unless its epoch has no step left; None when none is."""
        here = self.layout(offset, epoch)
        if n < here.num_steps:
            return epoch, here.global_range(n)[0]
        return self.seek(epoch + 1, n - here.num_steps)

    def worker_epoch_start(self, origin: tuple[int, int], workers: int, epoch: int) -> int:
        """Where a worker whose next step starts at cursor `origin` (and that takes every `workers`-th
        step of the stream from there) has its first step of the later epoch `epoch`: that step's
        start, or the epoch's end (num_rows) when it has none there. O(epoch - origin epoch)."""
        if epoch <= origin[0]:
            raise InvalidArgumentError(f"epoch {epoch} is not after the worker's cursor's epoch {origin[0]}")
        for e, start in self.worker_epoch_starts(origin, workers):
            if e == epoch:
                return start
        raise AssertionError("unreachable")

    def worker_epoch_starts(self, origin: tuple[int, int], workers: int) -> Iterator[tuple[int, int]]:
        """(epoch, worker_epoch_start) for every epoch after the origin's, in order (one layout each)."""
        e, o = origin
        m = self.layout(o, e).num_steps
        r = (-m) % workers  # the worker's next step, counted from the next epoch's first step
        while True:
            e += 1
            whole = self.layout(0, e)
            m = whole.num_steps
            yield e, (whole.global_range(r)[0] if r < m else self.num_rows)
            r = (r - m) % workers if r < m else r - m


def split_offset(offset: int, num_rows: int, global_batch: int, worker: int) -> int:
    """The global cursor `offset` moved `worker` global steps on, within its epoch (clipped to its end)."""
    return min(offset + worker * global_batch, num_rows)


def epoch_start(num_rows: int, global_batch: int, split: WorkerSplit = NO_SPLIT) -> int:
    """Where a reader's first step of an epoch starts (0 without a split; with one, the worker's first
    step of the stream's first epoch: later epochs are `RankStream.worker_epoch_start`'s)."""
    return split_offset(0, num_rows, global_batch, split.worker)


def is_last_step(layout: Layout, step: int, split: WorkerSplit = NO_SPLIT) -> bool:
    """Whether `step` (of a layout that starts at this worker's cursor) is its last of the epoch."""
    return step + split.workers >= layout.num_steps


def cursor_after(layout: Layout, epoch: int, step: int, split: WorkerSplit = NO_SPLIT) -> tuple[int, int]:
    """The (epoch, offset) cursor once `step` of `layout` is handed over by this worker.

    `layout` starts at the worker's cursor, and the worker takes its steps 0, workers, 2·workers, …;
    without a split, after the epoch's last step the cursor is the next epoch's start. With one, the
    worker's next step is `workers` steps of the stream on — in a later epoch after its last step of
    this one: the cursor is that step's start (the epoch after's end when the stream has none)."""
    if not is_last_step(layout, step, split):
        return epoch, layout.global_range(step + split.workers)[0]
    if split.workers > 1:
        found = RankStream.of(layout).seek(epoch + 1, step + split.workers - layout.num_steps)
        return found if found is not None else (epoch + 1, layout.num_rows)
    if isinstance(layout, ScheduledLayout):
        return epoch + 1, layout.next_epoch_start(0)
    assert isinstance(layout, StepLayout)
    return epoch + 1, epoch_start(layout.num_rows, layout.global_batch)
