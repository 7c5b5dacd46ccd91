"""A job's step time, explained per rank from what its ranks recorded with a commit (pure, no I/O).

Each rank's cursor record carries "timings" since its previous commit (client/step_timings.py): the
wall time, the steps, the time waited for data, the mean cost ratio of its balanced steps and the
checkpoint saves' stall. Per rank and step this gives the step time and its parts:

    data wait      data_wait_s / steps
    slowest rank   (max ratio - own ratio) / max ratio x step time: a balanced step lasts as long as
                   its largest share, so a rank with less waits at the all-reduce for the rest (an
                   estimate: compute taken as proportional to cost; empty without balance=)
    checkpoint     checkpoint_stall_s / steps (the saves' staging, spread over the interval's steps)
    the rest       what remains: the training step's own compute (never below 0)

Records written before timings existed (or by a rank that took no step) explain nothing: None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RankStepTime", "explain"]


@dataclass(frozen=True)
class RankStepTime:
    rank: int
    steps: int
    step_s: float  # wall time per step over the interval
    data_wait_s: float  # per step
    cost_ratio: float | None
    slowest_wait_s: float | None  # per step, estimated from the ranks' cost ratios; None without them
    checkpoint_stall_s: float  # the interval's total
    checkpoints: int
    rest_s: float  # per step

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_s / self.step_s if self.step_s > 0 else 0.0


def explain(ranks: Sequence[dict[str, Any]]) -> list[tuple[int, RankStepTime | None]]:
    """(rank, its step time explained or None) for each rank record of one step (CursorRecord.describe())."""
    timings = {r["rank"]: r.get("timings") for r in ranks}
    ratios = [
        t["cost_ratio"] for t in timings.values() if t and t.get("steps") and t.get("cost_ratio") is not None
    ]
    top = max(ratios, default=0.0)
    out: list[tuple[int, RankStepTime | None]] = []
    for rank, t in sorted(timings.items()):
        if not t or not t.get("steps"):
            out.append((rank, None))
            continue
        steps = int(t["steps"])
        step_s = t["interval_s"] / steps
        wait = t["data_wait_s"] / steps
        stall = t.get("checkpoint_stall_s", 0.0)
        ratio = t.get("cost_ratio")
        slowest = (top - ratio) / top * step_s if ratio is not None and top > 0 else None
        rest = max(0.0, step_s - wait - (slowest or 0.0) - stall / steps)
        out.append(
            (
                rank,
                RankStepTime(
                    rank, steps, step_s, wait, ratio, slowest, stall, int(t.get("checkpoints", 0)), rest
                ),
            )
        )
    return out
