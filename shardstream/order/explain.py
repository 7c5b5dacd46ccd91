"""`shardstream explain`, the pure part: where a job's step T was in the plan, and where a sample lands.

A job's cursor store holds, per checkpoint step and rank, the Loader's state (client/loader_state.py): the
dataset version (or mixture), its fingerprint, seed, shuffle, the epoch and global offset where the
next step starts, `steps` (how many steps the job had taken: the index of that next step), world
size, batch size, drop_last, transforms and a mixture's parameters. From one such `Cursor` the plan
(DESIGN §4) gives every other step: within its epoch the steps follow at W·B positions each, the
epoch's last one short (or dropped), and every later epoch starts at offset 0. `place_step` walks
there; `shardstream.order.delivery.step_samples` then says which samples each rank got — the functions the
servers run.

Going backwards from a cursor assumes the job ran with that world and batch size from the start of
the epochs it walks back over (a job resumed with other sizes is only exact from a cursor of the
new run on): the CLI and the web's job pages start from the newest cursor at or before T whenever
there is one, with the world and batch size of the run that committed it.

Step numbers count from 0 everywhere: a job's step S is the number of steps it took before it — the
Loader state's `steps`, what `commit(S)` after S steps records, `explain --job --step S`, the web's
job links — and step t of an epoch (inspect, web, view) covers [t·W·B, (t+1)·W·B).

A sample's place (`find_position`, `place_of`) inverts the epoch's order by scanning it in chunks —
the same order function the servers evaluate, so exact for every shuffle mode, at O(N) time and
O(chunk) memory (a second or so per 10^7 rows).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardstream.errors import InvalidArgumentError, NotFoundError
from shardstream.order.read_order import ShuffleSpec, StepLayout
from shardstream.order.schedule import Schedule
from shardstream.order.scheduled_steps import Layout, make_layout, split_start, step_position

__all__ = [
    "Cursor",
    "StepPlace",
    "find_position",
    "parse_shuffle",
    "place_of",
    "place_scheduled_step",
    "place_step",
]

SCAN_CHUNK = 1 << 20  # positions evaluated at once by find_position


def parse_shuffle(text: str) -> ShuffleSpec:
    """A shuffle as a state records it (`str(ShuffleSpec)`): 'none', 'full', 'block(window=16)'."""
    m = re.fullmatch(r"block\(window=(\d+)\)", text)
    if m:
        return ShuffleSpec("block", int(m[1]))
    return ShuffleSpec.parse(text)


@dataclass(frozen=True)
class Cursor:
    """Where a job's step `steps` starts, and how its steps are cut (one rank's recorded state)."""

    epoch: int
    offset: int  # global sample offset in `epoch` where step `steps` starts
    steps: int  # the job's steps taken before it
    world_size: int
    batch_size: int
    drop_last: bool = False

    def layout(self, num_rows: int, offset: int) -> StepLayout:
        return StepLayout(num_rows, offset, self.world_size, self.batch_size, self.drop_last)


@dataclass(frozen=True)
class StepPlace:
    """Step T of a job: epoch, the layout of that epoch's steps (from `layout.start_offset`) and its index."""

    step: int  # the job's step T
    epoch: int
    layout: Layout  # a StepLayout, or a ScheduledLayout for a job with batch-size phases or skip ranges
    index: int  # in layout: the step covers layout.global_range(index)
    how: str  # "at the cursor", "after the cursor" or "before the cursor"


def place_step(num_rows: int, cursor: Cursor, step: int) -> StepPlace:
    """Where the job's step `step` is, walking the plan from `cursor` (see the module docstring)."""
    if step < 0:
        raise InvalidArgumentError(f"step must be >= 0, got {step}")
    whole = cursor.layout(num_rows, 0)
    per_epoch = whole.num_steps  # steps of an epoch started at offset 0
    if step >= cursor.steps:
        k, epoch = step - cursor.steps, cursor.epoch
        first = cursor.layout(num_rows, min(cursor.offset, num_rows))
        if k < first.num_steps:
            return StepPlace(step, epoch, first, k, "at the cursor" if k == 0 else "after the cursor")
        k -= first.num_steps
        if per_epoch == 0:
            raise NotFoundError(f"an epoch of {num_rows} samples has no step of {whole.global_batch} samples")
        return StepPlace(step, epoch + 1 + k // per_epoch, whole, k % per_epoch, "after the cursor")
    # Backwards: the cursor's epoch from its start, then whole epochs before it.
    gb = whole.global_batch
    if cursor.offset % gb:
        raise NotFoundError(
            f"step {step} is before the job's first cursor (step {cursor.steps}, epoch {cursor.epoch} offset "
            f"{cursor.offset}), which is not on a step boundary of {cursor.world_size} x {cursor.batch_size} "
            "samples from its epoch's start: the steps before it were cut otherwise"
        )
    epoch_first = cursor.steps - cursor.offset // gb  # the job's step at the start of the cursor's epoch
    if step >= epoch_first:
        return StepPlace(step, cursor.epoch, whole, step - epoch_first, "before the cursor")
    back = (epoch_first - step - 1) // max(1, per_epoch) + 1
    if per_epoch == 0 or cursor.epoch - back < 0:
        raise NotFoundError(
            f"step {step} is before the job's start as its first cursor (step {cursor.steps}, epoch "
            f"{cursor.epoch} offset {cursor.offset}) accounts for it"
        )
    return StepPlace(
        step, cursor.epoch - back, whole, back * per_epoch - (epoch_first - step), "before the cursor"
    )


def place_scheduled_step(num_rows: int, cursor: Cursor, schedule: Schedule, step: int) -> StepPlace:
    """`place_step` for a job with batch-size phases or skip ranges (scheduled_steps.py), from a
    cursor at or before the step: where the step starts (`step_position`), then which step of that
    epoch's layout — the layout the Loader builds, from the cursor or from the epoch's first step."""
    if step < cursor.steps:
        raise NotFoundError(f"step {step} is before the cursor's step {cursor.steps}")
    w, drop = cursor.world_size, cursor.drop_last
    position = step_position(
        step,
        num_rows=num_rows,
        world_size=w,
        schedule=schedule,
        drop_last=drop,
        epoch=cursor.epoch,
        offset=cursor.offset,
        steps_done=cursor.steps,
    )
    epoch, offset = divmod(position, num_rows)
    if epoch == cursor.epoch:
        start = cursor.offset
    else:
        whole = make_layout(num_rows, 0, w, schedule.first_batch, drop, epoch=epoch, schedule=schedule)
        start = split_start(whole, 0)
    layout = make_layout(num_rows, start, w, schedule.first_batch, drop, epoch=epoch, schedule=schedule)
    lo, hi = 0, layout.num_steps - 1  # the step starting at `offset` (steps start in increasing order)
    while lo < hi:
        mid = (lo + hi) // 2
        if layout.global_range(mid)[0] < offset:
            lo = mid + 1
        else:
            hi = mid
    assert layout.global_range(lo)[0] == offset, (step, position)
    return StepPlace(step, epoch, layout, lo, "at the cursor" if step == cursor.steps else "after the cursor")


def find_position(rows_of: Callable[[np.ndarray], np.ndarray], num_rows: int, row: int) -> int:
    """The position p in [0, num_rows) whose row is `row`, for an epoch order `rows_of(positions)`."""
    if not 0 <= row < num_rows:
        raise InvalidArgumentError(f"row {row} is outside the dataset's {num_rows} rows")
    for start in range(0, num_rows, SCAN_CHUNK):
        positions = np.arange(start, min(start + SCAN_CHUNK, num_rows), dtype=np.int64)
        hit = np.flatnonzero(rows_of(positions) == row)
        if len(hit):
            return int(positions[hit[0]])
    raise AssertionError(f"row {row} has no position: the order is not a permutation")


def place_of(layout: StepLayout, position: int) -> tuple[int, int] | None:
    """(step index in `layout`, rank) of a global position; None when no step covers it (before the
    layout's start, or dropped by drop_last)."""
    if position < layout.start_offset or position >= layout.num_rows:
        return None
    index = (position - layout.start_offset) // layout.global_batch
    if index >= layout.num_steps:
        return None
    start, end = layout.global_range(index)
    size, w = end - start, layout.world_size
    if size == layout.global_batch:
        return index, (position - start) // layout.batch_size
    # a short last step: rank r has [r*size//w, (r+1)*size//w); the first r whose end passes it
    i = position - start
    rank = (i * w) // size
    while (rank + 1) * size // w <= i:
        rank += 1
    while rank * size // w > i:
        rank -= 1
    return index, rank
