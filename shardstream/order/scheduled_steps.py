"""The steps of one epoch under a Schedule (schedule.py): StepLayout's interface, computed, not replayed.

    layout = make_layout(num_rows, offset, world_size, batch_size, drop_last, epoch=e, schedule=s)

returns a `StepLayout` (read_order.py) when the schedule is plain — the same object, messages and cursors
as before schedules existed — and a `ScheduledLayout` otherwise. Both answer `num_steps`,
`global_range(step)`, `rank_range(step, rank)`, `dropped`, `offset_after(step)` and
`next_epoch_start(worker)`, so the server (server/read/plan.py, server/read/build.py), the client (decode.py) and
cursor_math.py use either unchanged.

A ScheduledLayout of epoch e from offset s cuts [s, N) into *segments*: runs of steps of one batch
size between two events (a phase start, a skip range, the epoch's end). Inside a segment step k
starts at `start + (k - first)·W·B` and is clipped to the segment's `end` (the run's end: the
epoch's end or the next skip range's start). Building them is O(events in the epoch); a step's
range is a bisection over them. The epoch's last step, when short, is dropped with drop_last
(`dropped` counts its samples), whatever made it short.

`step_position` says where global step t of a job starts, counted from a cursor at which some steps
were delivered — the arithmetic that turns `skip_steps` into skipped positions. It walks epoch by
epoch only across epochs that hold an event; runs of identical epochs are jumped by division.
"""

from __future__ import annotations

import bisect

from shardstream.errors import InvalidArgumentError
from shardstream.order.read_order import StepLayout
from shardstream.order.schedule import Schedule, job_position

__all__ = ["Layout", "ScheduledLayout", "make_layout", "split_start", "step_position"]


class ScheduledLayout:
    """Steps of epoch `epoch` from `start_offset` for world size W under `schedule` (see the module
    docstring). `batch_size` and `global_batch` are those of the layout's first step."""

    def __init__(
        self,
        num_rows: int,
        start_offset: int,
        world_size: int,
        schedule: Schedule,
        *,
        epoch: int = 0,
        drop_last: bool = False,
    ) -> None:
        if world_size < 1:
            raise InvalidArgumentError(f"world_size must be >= 1, got {world_size}")
        if epoch < 0:
            raise InvalidArgumentError(f"epoch must be >= 0, got {epoch}")
        if not 0 <= start_offset <= num_rows:
            raise InvalidArgumentError(
                f"start offset {start_offset} is outside the epoch of {num_rows} samples"
            )
        self.num_rows = num_rows
        self.start_offset = start_offset
        self.world_size = world_size
        self.schedule = schedule
        self.epoch = epoch
        self.drop_last = drop_last
        self._base = job_position(epoch, 0, num_rows)
        # segments: (first step, start offset, steps, per-rank batch, end offset)
        self._segments: list[tuple[int, int, int, int, int]] = []
        self.dropped = 0  # samples of the epoch's short last step left out (drop_last only)
        self._dropped_start = num_rows
        self._build()
        self._firsts = [seg[0] for seg in self._segments]
        self.num_steps = sum(seg[2] for seg in self._segments)
        self.batch_size = schedule.batch_at(self._base + self._unskipped(start_offset))
        self.global_batch = world_size * self.batch_size

    def __repr__(self) -> str:
        return (
            f"ScheduledLayout(num_rows={self.num_rows}, start_offset={self.start_offset}, "
            f"world_size={self.world_size}, epoch={self.epoch}, steps={self.num_steps})"
        )

    def _unskipped(self, offset: int) -> int:
        """The first offset >= `offset` of the epoch that is not skipped (N when none is)."""
        while offset < self.num_rows:
            end = self.schedule.skip_end(self._base + offset)
            if end is None:
                return offset
            offset = end - self._base
        return self.num_rows

    def _build(self) -> None:
        n, w, base, sched = self.num_rows, self.world_size, self._base, self.schedule
        phases, skips = sched.batch, sched.skips
        o = self._unskipped(self.start_offset)
        # walk the phases and skip ranges once, from the ones at the first step
        ip = bisect.bisect_right(phases, (base + o, float("inf"))) - 1  # the phase in effect
        isk = bisect.bisect_right(skips, (base + o, float("inf")))  # the next skip range
        k = 0
        while o < n:
            j = base + o
            while ip + 1 < len(phases) and phases[ip + 1][0] <= j:
                ip += 1
            b = phases[ip][1]
            g = w * b
            end = n if isk == len(skips) else min(n, skips[isk][0] - base)  # this run of unskipped offsets
            limit = end if ip + 1 == len(phases) else min(end, phases[ip + 1][0] - base)
            count = -(-(limit - o) // g)  # the steps that start before the limit
            self._segments.append((k, o, count, b, end))
            k += count
            o += count * g
            if o >= end:  # past the run: over the skip range(s) that end it
                o = end
                while isk < len(skips) and skips[isk][0] - base <= o < n:
                    o = max(o, skips[isk][1] - base)
                    isk += 1
                o = min(o, n)
        if self.drop_last and self._segments:
            first, start, count, b, end = self._segments[-1]
            last = start + (count - 1) * w * b
            if end - last < w * b:
                self.dropped = end - last
                self._dropped_start = last
                if count > 1:
                    self._segments[-1] = (first, start, count - 1, b, end)
                else:
                    self._segments.pop()

    # --- StepLayout's interface ----------------------------------------------------------------
    @property
    def remaining(self) -> int:
        return self.num_rows - self.start_offset

    def batch_of(self, step: int) -> int:
        """The per-rank batch size of step `step` (its full size: a clipped step has fewer samples)."""
        return self._segment(step)[3]

    def _segment(self, step: int) -> tuple[int, int, int, int, int]:
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} outside [0, {self.num_steps})")
        return self._segments[bisect.bisect_right(self._firsts, step) - 1]

    def global_range(self, step: int) -> tuple[int, int]:
        first, start, _, b, end = self._segment(step)
        s = start + (step - first) * self.world_size * b
        return s, min(s + self.world_size * b, end)

    def rank_range(self, step: int, rank: int) -> tuple[int, int]:
        if not 0 <= rank < self.world_size:
            raise InvalidArgumentError(f"rank must be in [0, {self.world_size}), got {rank}")
        b = self.batch_of(step)
        start, end = self.global_range(step)
        size = end - start
        if size == self.world_size * b:
            return start + rank * b, start + (rank + 1) * b
        w = self.world_size
        return start + rank * size // w, start + (rank + 1) * size // w

    def offset_after(self, step: int) -> int:
        """The cursor (offset in the epoch) once `step` is consumed: the next step's start, or the
        epoch's end after its last step."""
        self.global_range(step)
        return self.global_range(step + 1)[0] if step + 1 < self.num_steps else self.num_rows

    def split_start(self, worker: int) -> int:
        """Where the `worker`-th step from this layout's start begins (a data-loader worker's first
        step); past the last step: the dropped step's start, then the epoch's end."""
        if worker < self.num_steps:
            return self.global_range(worker)[0]
        return self._dropped_start if worker == self.num_steps else self.num_rows

    def next_epoch_start(self, worker: int = 0) -> int:
        """Where worker `worker`'s first step of the next epoch starts (skip ranges at its start
        passed)."""
        nxt = ScheduledLayout(
            self.num_rows, 0, self.world_size, self.schedule, epoch=self.epoch + 1, drop_last=self.drop_last
        )
        return nxt.split_start(worker)


Layout = StepLayout | ScheduledLayout


def make_layout(
    num_rows: int,
    start_offset: int,
    world_size: int,
    batch_size: int,
    drop_last: bool = False,
    *,
    epoch: int = 0,
    schedule: Schedule | None = None,
) -> Layout:
    """A StepLayout when `schedule` is None or plain (its batch size wins), else a ScheduledLayout."""
    if schedule is None:
        return StepLayout(num_rows, start_offset, world_size, batch_size, drop_last)
    if schedule.is_plain:
        return StepLayout(num_rows, start_offset, world_size, schedule.first_batch, drop_last)
    return ScheduledLayout(num_rows, start_offset, world_size, schedule, epoch=epoch, drop_last=drop_last)


def split_start(layout: Layout, worker: int) -> int:
    """The offset of the `worker`-th step from the layout's start (StepLayout: clipped to the epoch)."""
    if isinstance(layout, StepLayout):  # as cursor_math.split_offset
        return min(layout.start_offset + worker * layout.global_batch, layout.num_rows)
    return layout.split_start(worker)


def step_position(
    step: int,
    *,
    num_rows: int,
    world_size: int,
    schedule: Schedule,
    drop_last: bool = False,
    epoch: int = 0,
    offset: int = 0,
    steps_done: int = 0,
) -> int:
    """The job position where global step `step` starts, for a job whose cursor (epoch, offset) is
    the start of its step `steps_done` (the steps it delivered so far) and whose next steps have
    world size W under `schedule`. Steps are counted as delivered: skipped steps get no number.
    Cost: O(events) layouts of O(events) each; never O(step)."""
    if step < steps_done:
        raise InvalidArgumentError(f"step {step} is before the cursor's step {steps_done}")
    if num_rows < 1:
        raise InvalidArgumentError("an epoch of 0 samples has no steps")
    e, off, k = epoch, offset, steps_done
    while True:
        lay = make_layout(
            num_rows, off, world_size, schedule.first_batch, drop_last, epoch=e, schedule=schedule
        )
        if step - k < lay.num_steps:
            return job_position(e, lay.global_range(step - k)[0], num_rows)
        if off == 0:
            # Epochs [e, e + m) hold no event: each has this one's steps; jump over them.
            base = job_position(e, 0, num_rows)
            event = schedule.plain_until(base)
            m = None if event is None else (event - base) // num_rows
            if m is None or m >= 1:
                if lay.num_steps == 0:
                    if m is None:
                        raise InvalidArgumentError(
                            f"step {step} never comes: from epoch {e} on, epochs of {num_rows} samples have "
                            f"no steps (world size {world_size}, batch size {schedule.batch_at(base)}"
                            f"{', drop_last' if drop_last else ''})"
                        )
                    e += m
                    continue
                q = (step - k) // lay.num_steps
                q = q if m is None else min(q, m)
                e, k = e + q, k + q * lay.num_steps
                continue
        k += lay.num_steps
        off = lay.next_epoch_start(0) if isinstance(lay, ScheduledLayout) else 0
        e += 1
