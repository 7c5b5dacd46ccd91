"""How many worker processes a local fleet should run, from the trainers' stall (DESIGN §11): pure.

`serve --workers auto` (supervisor.py) evaluates this every tick on the signal its workers export
(job_reports.py): the trainers' data stall, their consumption and the samples the workers sent. The
rules, with their hysteresis:

- grow: the stall is above `stall_target` for `up_ticks` ticks in a row -> one more worker
  ("stall_above_target"), up to `max_workers`;
- shrink: the stall is at or below the target AND the estimate says one worker fewer still carries
  the consumption with `headroom` to spare (consumption <= (workers - 1) x capacity x headroom) for
  `down_ticks` ticks in a row -> one worker fewer ("capacity_to_spare"), down to `min_workers`;
- after any move, `cooldown_ticks` ticks without another (the reports of the trainers must first
  show what the new size does: a report covers the last report interval);
- no reporting ranks: no move (a fleet whose trainers do not report keeps its size).

A worker's capacity is learned from what the workers sent (the mean, or the busiest worker's when
more): while the trainers stall and the busiest worker's CPU is saturated (`SATURATED_CPU` of its
share, when known), what each sent *is* its capacity (the estimate is set to it); otherwise it is only
a lower bound (the estimate is raised to it, never lowered). A stall while the workers have CPU to
spare is latency — a stream's first message, an epoch boundary, a move — not capacity: taking what
they sent then for their capacity would keep a fleet whose demand halved from ever shrinking. A fleet
that grew because it
was saturated at n workers with consumption C thus learned capacity C / n, and shrinks back only
once consumption is below C x headroom: a steady signal never makes it flap.

Ticks, not seconds: the caller decides the period (supervisor: `--autoscale-interval`), so the
rules are the same at any speed and the tests step them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = [
    "DEFAULT_COOLDOWN_TICKS",
    "DEFAULT_DOWN_TICKS",
    "DEFAULT_HEADROOM",
    "DEFAULT_STALL_TARGET",
    "DEFAULT_UP_TICKS",
    "REASONS",
    "SATURATED_CPU",
    "AutoscalePolicy",
    "AutoscaleState",
    "Decision",
    "Signal",
    "decide",
]

DEFAULT_STALL_TARGET = 0.05  # the data-stall SLO of the ShardstreamDataStall alert (as fleet recommend)
DEFAULT_UP_TICKS = 3  # ticks in a row above the target before a worker is added
DEFAULT_DOWN_TICKS = 24  # ticks in a row with capacity to spare before one is removed (2 min at 5 s)
DEFAULT_COOLDOWN_TICKS = 6  # ticks after a move before the next (30 s at 5 s: a few report intervals)
DEFAULT_HEADROOM = 0.8  # shrink only while the workers left would run at most this busy
SATURATED_CPU = 0.9  # a worker using this much of its CPU share sends what it can: its capacity

# why the count moved (the `reason` label of shardstream_autoscale_decisions_total)
REASONS = ("stall_above_target", "capacity_to_spare", "below_min", "above_max")


@dataclass(frozen=True)
class AutoscalePolicy:
    """The bounds and the hysteresis; validated once."""

    min_workers: int = 1
    max_workers: int = 1
    stall_target: float = DEFAULT_STALL_TARGET
    up_ticks: int = DEFAULT_UP_TICKS
    down_ticks: int = DEFAULT_DOWN_TICKS
    cooldown_ticks: int = DEFAULT_COOLDOWN_TICKS
    headroom: float = DEFAULT_HEADROOM

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {self.min_workers} and {self.max_workers}")
        if not 0 <= self.stall_target < 1:
            raise ValueError(f"stall_target must be from 0 to 1, got {self.stall_target}")
        if min(self.up_ticks, self.down_ticks) < 1 or self.cooldown_ticks < 0:
            raise ValueError(
                f"up_ticks and down_ticks must be >= 1 and cooldown_ticks >= 0, got "
                f"{self.up_ticks}, {self.down_ticks}, {self.cooldown_ticks}"
            )
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom}")


@dataclass(frozen=True)
class Signal:
    """One tick's observation: the trainers' mean stall (0-1) and consumption (samples/s), how many
    ranks report, the samples per second all the workers sent together and the most one of them sent
    (0: not known; ranks stay on the worker they first reached, so the load can be uneven), and the
    busiest worker's CPU use as a fraction of the CPU one worker has (None: not known)."""

    stall: float
    consumption: float
    ranks: int
    sent: float
    busiest: float = 0.0
    busy: float | None = None


@dataclass(frozen=True)
class AutoscaleState:
    """What the rules remember between ticks (start from `AutoscaleState()`)."""

    above: int = 0  # ticks in a row with the stall above the target
    spare: int = 0  # ticks in a row with a worker to spare
    cooldown: int = 0  # ticks left before the next move may happen
    capacity: float = 0.0  # samples/s one worker can send (learned; 0: not yet known)


@dataclass(frozen=True)
class Decision:
    workers: int  # what to run next
    reason: str  # one of REASONS when it differs from the count asked about, else what holds it
    why: str  # one line for the log: the figures behind it


def decide(policy: AutoscalePolicy, state: AutoscaleState, signal: Signal, workers: int) -> tuple[Decision, AutoscaleState]:
    """The count after this tick (`workers`: serving now) and the state for the next tick."""
    p = policy
    if workers < p.min_workers:
        return Decision(p.min_workers, "below_min", f"{workers} workers, the least is {p.min_workers}"), state
    if workers > p.max_workers:
        return Decision(p.max_workers, "above_max", f"{workers} workers, the most is {p.max_workers}"), state
    stalled = signal.stall > p.stall_target
    per_worker = max(signal.sent / workers if workers else 0.0, signal.busiest)
    # saturated (stalled, and no CPU to spare): this is what a worker does; else a lower bound
    saturated = stalled and (signal.busy is None or signal.busy >= SATURATED_CPU)
    if signal.ranks and per_worker > 0:
        capacity = per_worker if saturated else max(state.capacity, per_worker)
    else:
        capacity = state.capacity
    figures = (
        f"stall {signal.stall:.1%} (target {p.stall_target:.0%}), consumption {signal.consumption:.1f}/s "
        f"of {signal.ranks} rank(s), {per_worker:.1f}/s per worker (capacity {capacity:.1f}/s)"
        + ("" if signal.busy is None else f", busiest worker's CPU {signal.busy:.0%}")
    )
    if not signal.ranks:  # nothing to go by: hold, forget the streaks
        return Decision(workers, "no_reports", figures), AutoscaleState(capacity=capacity)
    spare = (
        not stalled
        and workers > p.min_workers
        and capacity > 0
        and signal.consumption <= (workers - 1) * capacity * p.headroom
    )
    nxt = AutoscaleState(
        above=state.above + 1 if stalled else 0,
        spare=state.spare + 1 if spare else 0,
        cooldown=max(0, state.cooldown - 1),
        capacity=capacity,
    )
    if state.cooldown > 0:
        return Decision(workers, "cooldown", figures), nxt
    if nxt.above >= p.up_ticks and workers < p.max_workers:
        return Decision(workers + 1, "stall_above_target", figures), _moved(p, nxt)
    if nxt.spare >= p.down_ticks:
        need = max(p.min_workers, math.ceil(signal.consumption / (capacity * p.headroom)))
        return Decision(workers - 1, "capacity_to_spare", f"{figures}: {need} would do"), _moved(p, nxt)
    return Decision(workers, "at_max" if stalled and workers >= p.max_workers else "steady", figures), nxt


def _moved(policy: AutoscalePolicy, state: AutoscaleState) -> AutoscaleState:
    """The state right after a move: streaks start again, the cooldown runs."""
    return replace(state, above=0, spare=0, cooldown=policy.cooldown_ticks)
