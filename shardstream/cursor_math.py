"""Where one rank's cursor stands, as pure functions of the plan (no I/O): the exactly-once arithmetic.

A job's cursor is (epoch, global sample offset): the offset where the next global step starts
(DESIGN §4). The client advances it when a batch is handed to the training loop; these functions say
to what. A rank's stream can also be split by step between the k data-loader workers of that rank
(`WorkerSplit`): worker j takes the steps j, j+k, j+2k, ... of the rank's stream, so its own cursor
starts j global steps further and moves k global steps at a time.

    layout = StepLayout(num_rows, offset, world_size, batch_size, drop_last)
    cursor_after(layout, epoch, step, split)   # the cursor once `step` is handed over
    epoch_start(num_rows, global_batch, split) # where a worker's first step of an epoch starts
    split_offset(offset, num_rows, global_batch, worker)  # a global cursor moved to a worker's first step

A `ScheduledLayout` (batch-size phases, skip ranges: scheduled_layout.py) works the same way; the
next epoch's first step is then where its layout says (a skip range may cover the epoch's start).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardstream.errors import InvalidArgumentError
from shardstream.scheduled_layout import Layout, ScheduledLayout

__all__ = ["NO_SPLIT", "WorkerSplit", "cursor_after", "epoch_start", "is_last_step", "split_offset"]


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


def split_offset(offset: int, num_rows: int, global_batch: int, worker: int) -> int:
    """The global cursor `offset` moved to worker `worker`'s first step: `worker` global steps on."""
    return min(offset + worker * global_batch, num_rows)


def epoch_start(num_rows: int, global_batch: int, split: WorkerSplit = NO_SPLIT) -> int:
    """Where this worker's first step of an epoch starts (0 without a split)."""
    return split_offset(0, num_rows, global_batch, split.worker)


def is_last_step(layout: Layout, step: int, split: WorkerSplit = NO_SPLIT) -> bool:
    """Whether `step` (of a layout that starts at this worker's cursor) is its last of the epoch."""
    return step + split.workers >= layout.num_steps


def cursor_after(layout: Layout, epoch: int, step: int, split: WorkerSplit = NO_SPLIT) -> tuple[int, int]:
    """The (epoch, offset) cursor once `step` of `layout` is handed over by this worker.

    `layout` starts at the worker's cursor, and the worker takes its steps 0, workers, 2·workers, …;
    after its last one, the cursor is the next epoch's start for this worker."""
    if is_last_step(layout, step, split):
        if isinstance(layout, ScheduledLayout):
            return epoch + 1, layout.next_epoch_start(split.worker)
        return epoch + 1, epoch_start(layout.num_rows, layout.global_batch, split)
    return epoch, layout.global_range(step + split.workers)[0]
