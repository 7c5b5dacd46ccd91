"""Where one rank's step time went between two cursor commits: the numbers a commit records.

A Loader keeps a `StepClock`; each `commit(step)` takes its `StepTimings` since the previous commit
(or since the loop started) and writes them into the rank's cursor record ("timings", records.py),
so the web job page can show, per committed step and per rank, what the step time was spent on:

    interval_s           wall time between the previous commit (or the loop's start) and this one
    steps                batches handed to the training loop in it
    data_wait_s          time the loop waited for those batches (the data stall; the same waits as
                         shardstream_client_wait_seconds)
    cost_ratio           mean over its balanced steps of this rank's cost over the step's mean cost
                         (shardstream_client_step_cost_ratio); absent without balance=
    checkpoint_stall_s   time Checkpointer.save(..., loader=loader) held the loop (staging), and
    checkpoints          how many saves that was

The time a rank waits for the slowest one is not measured on a rank: it follows from every rank's
cost ratio at the same step (the web page and the Grafana row estimate it as
(max ratio - own ratio) / max ratio x step time: a step lasts as long as its largest share).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["StepClock", "StepTimings"]


@dataclass(frozen=True)
class StepTimings:
    interval_s: float
    steps: int
    data_wait_s: float
    checkpoint_stall_s: float = 0.0
    checkpoints: int = 0
    cost_ratio: float | None = None  # None: no balanced step in the interval

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "interval_s": round(self.interval_s, 6),
            "steps": self.steps,
            "data_wait_s": round(self.data_wait_s, 6),
            "checkpoint_stall_s": round(self.checkpoint_stall_s, 6),
            "checkpoints": self.checkpoints,
        }
        if self.cost_ratio is not None:
            d["cost_ratio"] = round(self.cost_ratio, 6)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepTimings:
        """ValueError naming the field when one is not a number >= 0 (keys added later are ignored)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"'timings' must be an object, got {d!r}")
        ratio = d.get("cost_ratio")
        return cls(
            interval_s=_seconds(d, "interval_s"),
            steps=int(_seconds(d, "steps")),
            data_wait_s=_seconds(d, "data_wait_s"),
            checkpoint_stall_s=_seconds(d, "checkpoint_stall_s", 0.0),
            checkpoints=int(_seconds(d, "checkpoints", 0)),
            cost_ratio=None if ratio is None else _seconds(d, "cost_ratio"),
        )


def _seconds(d: Mapping[str, Any], key: str, default: float | None = None) -> float:
    value = d.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"timings {key!r} must be a number >= 0, got {value!r}")
    return float(value)


class StepClock:
    """Sums one rank's waits between commits. The training thread adds batches and takes the
    timings; a Checkpointer's save adds its stall (possibly from another thread: a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None  # the interval's start: the loop's first iter(), then each commit
        self._steps = 0
        self._wait_s = 0.0
        self._stall_s = 0.0
        self._checkpoints = 0
        self._ratio_sum = 0.0
        self._ratios = 0

    def started(self) -> None:
        """The training loop starts (iter()): the first interval starts here, later ones at commits."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()

    def waited(self, seconds: float) -> None:
        """The loop waited `seconds` for its next item (a batch, or the end)."""
        with self._lock:
            self._wait_s += seconds

    def batch(self, cost_ratio: float | None) -> None:
        with self._lock:
            self._steps += 1
            if cost_ratio is not None:
                self._ratio_sum += cost_ratio
                self._ratios += 1

    def checkpoint_stall(self, seconds: float) -> None:
        """A checkpoint save held the loop `seconds` (Checkpointer.save with loader=)."""
        with self._lock:
            self._stall_s += seconds
            self._checkpoints += 1

    def take(self) -> StepTimings:
        """The timings since the previous take (or the loop's start), and a new interval from now."""
        now = time.monotonic()
        with self._lock:
            out = StepTimings(
                interval_s=now - (self._since if self._since is not None else now),
                steps=self._steps,
                data_wait_s=self._wait_s,
                checkpoint_stall_s=self._stall_s,
                checkpoints=self._checkpoints,
                cost_ratio=self._ratio_sum / self._ratios if self._ratios else None,
            )
            self._since = now
            self._steps = self._checkpoints = self._ratios = 0
            self._wait_s = self._stall_s = self._ratio_sum = 0.0
        return out
