"""A Loader's schedules (DESIGN §7): batch-size phases, skip ranges and mixture phases — what its state
records of them, and what a loaded state may change.

    Loader(..., batch_size=[(0, 8), (1_000_000, 16)], skip_steps=[(12_000, 12_200)])

The state of a Loader with a schedule carries one more key, absent from every other state (theirs
stay as they were, and older clients ignore it):

    "schedule": {"batch_size": [[0, 8], [1000000, 16]],          # more than one phase only
                 "mixture": "0=web@3:0.7,...;2000000=...",       # mixture phases only (their label)
                 "content": "<sha256>",                           # with "mixture": sources, block, epoch
                 "skip": [{"steps": [12000, 12200], "positions": [J_a, J_b]}, ...]}

Skip ranges are asked for in global steps of the job as the Loader counts them (`steps` of its state:
steps delivered so far; a skipped step gets no number, so a trainer's step counter and the Loader's
agree). They are turned into job positions once (scheduled_layout.step_position), from the cursor the
Loader starts at and with its world size — the run that would have delivered them — and recorded as
positions, which mean the same samples for any later world size. A range with only "steps" (written
by `shardstream cursor skip` on a committed cursor) is turned into positions by the Loader that
resumes from it. Ranges given together are counted in the same numbering; a range already recorded
is not asked for again (a restarted job may keep its skip_steps argument); one that starts before
the cursor's step is refused — its first steps were delivered.

`load_state_dict(state)` refuses a state whose batch-size or mixture phases differ from the
Loader's (InvalidArgumentError naming both); `load_state_dict(state, schedule="new")` takes the
Loader's from the cursor on — a mixture schedule only over the same sources, block and epoch
samples (`content`), and each source's epoch counter is then the new schedule's at the cursor.
Skip ranges are always kept: the state's and the Loader's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardstream.errors import InvalidArgumentError
from shardstream.order.curriculum import MixtureSchedule
from shardstream.order.schedule import Schedule, merge_ranges, parse_batch_schedule, parse_ranges
from shardstream.order.scheduled_steps import step_position

from .target import Target

__all__ = ["SCHEDULE_MODES", "LoaderSchedule", "SkipRecord"]

SCHEDULE_MODES = ("same", "new")


@dataclass(frozen=True)
class SkipRecord:
    """Global steps [a, b) of a job skipped, and the job positions they cover (None: not resolved yet)."""

    steps: tuple[int, int]
    positions: tuple[int, int] | None = None

    def to_json(self) -> dict[str, list[int]]:
        out = {"steps": list(self.steps)}
        if self.positions is not None:
            out["positions"] = list(self.positions)
        return out

    @classmethod
    def from_json(cls, d: object) -> SkipRecord:
        if not isinstance(d, Mapping) or "steps" not in d:
            raise InvalidArgumentError(f"Loader state: a skip record is {{'steps': [a, b], ...}}, got {d!r}")
        (steps,) = parse_ranges([tuple(d["steps"])], "a skip record's steps")
        positions = None
        if d.get("positions") is not None:
            (positions,) = parse_ranges([tuple(d["positions"])], "a skip record's positions")
        return cls(steps, positions)


class LoaderSchedule:
    """The schedules of one Loader: asked for at construction, completed by a loaded state."""

    def __init__(self, batch_size: object, skip_steps: object) -> None:
        self.batch = parse_batch_schedule(batch_size)
        self.requested = parse_ranges(skip_steps, "skip_steps")
        self.saved: tuple[SkipRecord, ...] = ()  # a loaded state's ranges
        self._records: tuple[SkipRecord, ...] | None = None  # resolved; None until first needed

    @property
    def first_batch(self) -> int:
        return self.batch[0][1]

    def records(
        self, *, num_rows: int, world_size: int, drop_last: bool, epoch: int, offset: int, steps: int
    ) -> tuple[SkipRecord, ...]:
        """Every skip range with its positions, resolving those that have none from the cursor
        (epoch, offset) where `steps` steps were delivered (once; again after a load)."""
        if self._records is None:
            known = {r.steps for r in self.saved}
            pending = [r.steps for r in self.saved if r.positions is None]
            pending += [s for s in self.requested if s not in known]
            for a, b in pending:
                if a < steps:
                    raise InvalidArgumentError(
                        f"skip_steps ({a}, {b}) starts before step {steps}, where this job's cursor is: steps "
                        f"{a}..{steps - 1} were delivered already; skip from step {steps} on"
                    )
            base = Schedule(self.batch, merge_ranges(r.positions for r in self.saved if r.positions))
            where = {
                "num_rows": num_rows,
                "world_size": world_size,
                "schedule": base,
                "drop_last": drop_last,
                "epoch": epoch,
                "offset": offset,
                "steps_done": steps,
            }
            resolved = [
                SkipRecord((a, b), (step_position(a, **where), step_position(b, **where))) for a, b in pending
            ]
            self._records = tuple(r for r in self.saved if r.positions is not None) + tuple(
                r for r in resolved if r.positions and r.positions[0] < r.positions[1]
            )
        return self._records

    def schedule(self, **cursor: Any) -> Schedule | None:
        """The plan's Schedule (None when plain: one batch size, nothing skipped)."""
        records = self.records(**cursor) if (self.requested or self.saved) else ()
        sched = Schedule(self.batch, merge_ranges(r.positions for r in records if r.positions))
        return None if sched.is_plain else sched

    def state(self, target: Target, **cursor: Any) -> dict[str, Any] | None:
        """The state's "schedule" value (None: the key is left out)."""
        out: dict[str, Any] = {}
        if len(self.batch) > 1:
            out["batch_size"] = [list(p) for p in self.batch]
        if isinstance(target.mixture, MixtureSchedule):
            out["mixture"] = target.mixture.label
            out["content"] = target.mixture.content
        if self.requested or self.saved:
            out["skip"] = [r.to_json() for r in self.records(**cursor)]
        return out or None

    def load(self, saved: Mapping[str, Any] | None, target: Target, fingerprint: str, mode: str) -> str:
        """Take a state's schedule (its "schedule" value and its fingerprint): refuse a different
        batch-size or mixture schedule unless `mode` is "new"; keep its skip ranges. Returns the
        fingerprint the state must have (the target's, or the state's own when mode="new" moves a
        mixture to new phases over the same content)."""
        if mode not in SCHEDULE_MODES:
            raise InvalidArgumentError(f"schedule must be one of {', '.join(SCHEDULE_MODES)}, got {mode!r}")
        saved = dict(saved or {})
        mine: dict[str, Any] = {}
        if len(self.batch) > 1:
            mine["batch_size"] = [list(p) for p in self.batch]
        if isinstance(target.mixture, MixtureSchedule):
            mine["mixture"] = target.mixture.label
        for key, what in (("batch_size", "batch-size schedule"), ("mixture", "mixture schedule")):
            if saved.get(key) != mine.get(key) and mode != "new":
                raise InvalidArgumentError(
                    f"the state was saved with {what} {_show(saved.get(key))}; this loader has {_show(mine.get(key))}: "
                    "load_state_dict(state, schedule='new') switches to this loader's at the state's cursor"
                )
        self.saved = tuple(SkipRecord.from_json(r) for r in saved.get("skip") or ())
        self._records = None
        if (
            mode == "new"
            and fingerprint != target.fingerprint
            and isinstance(target.mixture, MixtureSchedule)
            and saved.get("content") == target.mixture.content
        ):
            return fingerprint  # same sources, block and epoch: only the phases change
        return target.fingerprint


def _show(value: object) -> str:
    return "none" if value is None else json.dumps(value) if not isinstance(value, str) else repr(value)
