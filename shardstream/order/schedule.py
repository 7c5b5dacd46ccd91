"""Schedules (DESIGN §7): per-rank batch size and skipped samples as pure functions of the job position.

The **job position** of a cursor (epoch, offset) is

    J = epoch · N + offset          N = samples per epoch (a dataset's rows, a mixture's epoch samples)

— every position the job's stream of epochs has passed: samples delivered, samples drop_last left
out and samples skipped. It depends on the cursor alone, never on world size, batch sizes or the
job's history, so a schedule keyed by it resumes anywhere, with any world size, exactly. A
mixture's stream position (`epoch·L + p`, mixture.py) is the same number, so batch-size phases,
mixture phases and skip ranges all speak of one axis. Schedules are keyed by J rather than by the
offset inside an epoch so that a ramp or a curriculum happens once in a job, not once per epoch.

Batch-size schedule, `[(0, 8), (1_000_000, 16), (4_000_000, 32)]`: (job position where the phase
starts, per-rank batch size B); the first phase starts at 0. B(J) is the batch size of the last
phase that starts at or before J, and **a step that starts at J has W·B(J) samples** (fewer at the
end of an epoch or before a skip range). A phase change inside a step takes effect at the next
step: the first step of the new size is the first step that starts at or after the phase's
position. Nothing is replayed to find a step: the steps between two events (phase starts, skip
ranges, epoch ends) are an arithmetic sequence (scheduled_steps.py).

Skip ranges, job positions [start, end): never delivered. A step that would start inside one starts
at its end; a step that would run into one ends at its start (a short step, split evenly over the
ranks like the last step of an epoch). A cursor moves past them as past delivered samples, so
`skipped_between(0, J)` — the skipped positions behind a cursor — is the count a Loader reports.
Ranges given as global steps (`Loader(skip_steps=...)`) are turned into positions once, against
the steps of the run that will deliver them (scheduled_layout.step_position); positions are what a
state records, so a resume with another world size skips exactly the same samples.

A `Schedule` with one phase and no skip range is plain: every layout of it is today's StepLayout,
bit for bit. Pure and small: O(phases + ranges) memory, lookups O(log) of that, no I/O.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from shardstream.errors import InvalidArgumentError
from shardstream.limits import MAX_BATCH_SIZE, MAX_POSITION, check_int, shown

__all__ = [
    "MAX_BATCH_PHASES",
    "MAX_SKIP_RANGES",
    "Schedule",
    "job_position",
    "merge_ranges",
    "parse_batch_schedule",
    "parse_ranges",
]

MAX_BATCH_PHASES = 4096  # a Read request carries at most this many (server/read/request_limits.py)
MAX_SKIP_RANGES = 4096


def job_position(epoch: int, offset: int, num_rows: int) -> int:
    """J = epoch · N + offset: the job position of the cursor (epoch, offset) (see the module docstring)."""
    return epoch * num_rows + offset


_DIGITS = re.compile(r"[0-9]+", re.ASCII)  # str.isdigit() also takes '²', which int() refuses


def parse_batch_schedule(value: object) -> tuple[tuple[int, int], ...]:
    """((start, B), ...) from a batch size B, pairs [(0, 8), (1_000_000, 16)], or '0:8,1000000:16'.

    The first phase starts at 0, starts increase strictly, every B is 1 to MAX_BATCH_SIZE (the wire's
    uint32) and every start at most MAX_POSITION; one clear error naming batch_size otherwise."""
    if isinstance(value, str):
        text = value.strip()
        if _DIGITS.fullmatch(text) and len(text) <= 20:
            return ((0, check_int("batch_size", int(text), 1, MAX_BATCH_SIZE)),)
        pairs: list[tuple[object, object]] = []
        for part in text.split(","):
            start, sep, size = (p.strip() for p in part.partition(":"))
            if not sep or not _DIGITS.fullmatch(start) or not _DIGITS.fullmatch(size) or len(start + size) > 40:
                raise InvalidArgumentError(
                    f"batch_size phase {part.strip()[:60]!r} is not 'OFFSET:BATCH_SIZE' (ASCII digits)"
                )
            pairs.append((int(start), int(size)))
        value = pairs
    if isinstance(value, int) and not isinstance(value, bool):
        return ((0, check_int("batch_size", value, 1, MAX_BATCH_SIZE)),)
    if not isinstance(value, Sequence) or not value:
        raise InvalidArgumentError(
            f"batch_size must be an integer from 1 to {MAX_BATCH_SIZE} or a schedule [(offset, batch_size), ...], got {shown(value)}"
        )
    out: list[tuple[int, int]] = []
    for i, item in enumerate(value):
        if not isinstance(item, Sequence) or isinstance(item, str) or len(item) != 2:
            raise InvalidArgumentError(f"a batch_size phase is (offset, batch_size), got {shown(item)}")
        start = check_int(f"the offset of batch_size phase {i}", item[0], 0, MAX_POSITION)
        size = check_int(f"the batch_size of phase {i} (at {start})", item[1], 1, MAX_BATCH_SIZE)
        if out and start <= out[-1][0]:
            raise InvalidArgumentError(
                f"batch_size phases must start at increasing offsets, got {out[-1][0]} then {start}"
            )
        out.append((start, size))
    if out[0][0] != 0:
        raise InvalidArgumentError(f"the first batch_size phase must start at offset 0, got {out[0][0]}")
    if len(out) > MAX_BATCH_PHASES:
        raise InvalidArgumentError(f"at most {MAX_BATCH_PHASES} batch_size phases, got {len(out)}")
    return tuple(out)


def parse_ranges(value: object, what: str) -> tuple[tuple[int, int], ...]:
    """[(a, b), ...] (or 'A:B,C:D') as sorted, non-empty half-open ranges (not merged)."""
    if value is None:
        return ()
    if isinstance(value, str):
        items: list[object] = []
        for part in value.split(","):
            a, sep, b = (p.strip() for p in part.partition(":"))
            if not sep or not _DIGITS.fullmatch(a) or not _DIGITS.fullmatch(b) or len(a + b) > 40:
                raise InvalidArgumentError(f"{what} {part.strip()[:60]!r} is not 'START:END' (ASCII digits)")
            items.append((int(a), int(b)))
        value = items
    if not isinstance(value, Iterable):
        raise InvalidArgumentError(f"{what} must be a list of (start, end) pairs, got {shown(value)}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, Sequence) or isinstance(item, str) or len(item) != 2:
            raise InvalidArgumentError(f"{what} are (start, end) pairs, got {shown(item)}")
        a = check_int(f"the start of {what} range {i}", item[0], 0, MAX_POSITION)
        b = check_int(f"the end of {what} range {i}", item[1], 0, MAX_POSITION)
        if b <= a:
            raise InvalidArgumentError(
                f"{what} ({a}, {b}) is empty: a range is [start, end) with start < end"
            )
        out.append((a, b))
    return tuple(sorted(out))


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted half-open ranges with overlapping and touching ones merged."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


@dataclass(frozen=True)
class Schedule:
    """Batch-size phases and skip ranges of a job, keyed by job position.

    `batch`: ((start, B), ...) as `parse_batch_schedule` returns it; `skips`: merged [start, end)
    ranges of job positions (`merge_ranges`). Build one with `Schedule.of(batch_size, skips)`."""

    batch: tuple[tuple[int, int], ...]
    skips: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if parse_batch_schedule(list(self.batch)) != self.batch:
            raise InvalidArgumentError(f"not a batch-size schedule: {self.batch!r}")
        if merge_ranges(self.skips) != self.skips or any(a >= b or a < 0 for a, b in self.skips):
            raise InvalidArgumentError(f"skip ranges must be sorted, merged and non-empty: {self.skips!r}")
        if len(self.skips) > MAX_SKIP_RANGES:
            raise InvalidArgumentError(f"at most {MAX_SKIP_RANGES} skip ranges, got {len(self.skips)}")

    @classmethod
    def of(cls, batch_size: object, skips: Iterable[tuple[int, int]] = ()) -> Schedule:
        return cls(parse_batch_schedule(batch_size), merge_ranges(skips))

    # --- what it is ----------------------------------------------------------------------------
    @property
    def is_plain(self) -> bool:
        """One batch size and nothing skipped: today's StepLayout exactly."""
        return len(self.batch) == 1 and not self.skips

    @property
    def first_batch(self) -> int:
        return self.batch[0][1]

    @property
    def max_batch(self) -> int:
        return max(b for _, b in self.batch)

    @cached_property
    def _starts(self) -> list[int]:
        return [s for s, _ in self.batch]

    @cached_property
    def _skip_starts(self) -> list[int]:
        return [a for a, _ in self.skips]

    @cached_property
    def _skipped_before(self) -> list[int]:
        """_skipped_before[i]: positions in the ranges before range i."""
        out = [0]
        for a, b in self.skips:
            out.append(out[-1] + b - a)
        return out

    @property
    def last_event(self) -> int:
        """The job position after which nothing changes any more (last phase start, last skip end)."""
        return max(self.batch[-1][0], self.skips[-1][1] if self.skips else 0)

    # --- lookups (O(log phases) / O(log ranges)) ----------------------------------------------
    def batch_at(self, position: int) -> int:
        """B(J): the per-rank batch size of a step that starts at job position J."""
        return self.batch[bisect.bisect_right(self._starts, position) - 1][1]

    def next_change(self, position: int) -> int | None:
        """The first phase start after J, None when J is in the last phase."""
        i = bisect.bisect_right(self._starts, position)
        return self._starts[i] if i < len(self._starts) else None

    def skip_end(self, position: int) -> int | None:
        """The end of the skip range J is in, None when J is not skipped."""
        i = bisect.bisect_right(self._skip_starts, position) - 1
        if i >= 0 and position < self.skips[i][1]:
            return self.skips[i][1]
        return None

    def next_skip(self, position: int) -> int | None:
        """The first skip range start after J, None when there is none."""
        i = bisect.bisect_right(self._skip_starts, position)
        return self._skip_starts[i] if i < len(self._skip_starts) else None

    def plain_until(self, position: int) -> int | None:
        """The first position >= J where the batch size changes or a skip range starts (J itself
        when J is skipped); None when nothing ever happens after J."""
        if self.skip_end(position) is not None:
            return position
        events = [p for p in (self.next_change(position), self.next_skip(position)) if p is not None]
        return min(events) if events else None

    def skipped_between(self, start: int, end: int) -> int:
        """Skipped positions in [start, end) — `skipped_between(0, J)` is what a cursor at J passed."""
        if end <= start or not self.skips:
            return 0
        return self._skipped_to(end) - self._skipped_to(start)

    def _skipped_to(self, position: int) -> int:
        i = bisect.bisect_right(self._skip_starts, position) - 1
        if i < 0:
            return 0
        a, b = self.skips[i]
        return self._skipped_before[i] + min(position, b) - a

    def with_skips(self, ranges: Iterable[tuple[int, int]]) -> Schedule:
        """The same schedule with more skip ranges (merged with its own)."""
        return Schedule(self.batch, merge_ranges([*self.skips, *ranges]))

    def describe(self) -> dict[str, object]:
        """A JSON-safe summary (for `inspect --json`, tools)."""
        return {"batch_size": [list(p) for p in self.batch], "skip": [list(r) for r in self.skips]}
