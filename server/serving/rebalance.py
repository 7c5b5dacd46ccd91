"""Which worker of a supervisor a stream should go to, and how many streams a busy one hands back: pure.

A supervisor's workers share one control port (SO_REUSEPORT: the kernel spreads *connections*), but
each has a data port of its own, and a rank keeps the data port its first GetDataset named until its
stream fails. So a worker added by `serve --workers auto`, or one restarted after a crash, would
serve only the ranks that start later. Two rules, applied by placement.py (the supervisor publishes
what every worker carries — its trainer ranks, each counted once however many streams it holds;
each worker reads them), move streams onto it. The counts below are those (called streams here:
the rules do not care what is counted, only that each unit costs a worker the same):

- `pick_slot`: GetDataset names the data port of the worker expected to have the fewest streams —
  what the supervisor last counted, less what that worker was asked to hand back, plus what this
  worker already sent there since that count. Ties go to the answering worker's own port (so an idle
  server answers as a single worker would).
- `plan_shed`: when the busiest worker has at least 2 streams more than the least busy, each worker
  above the fair share (ceil(total / workers)) ends that many streams at the next message boundary
  with UNAVAILABLE. Their clients resume at the first step they have not received (exactly once, as
  after any failover); their new GetDataset names a less busy worker's port (`pick_slot`).

The caller spaces shed rounds and smooths the counts they look at (placement.py: the mean of the
last counts, a fresh window after each round), so a steady load never makes streams move back and forth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["MIN_SPREAD", "pick_slot", "plan_shed"]

MIN_SPREAD = 2  # streams between the busiest worker and the least busy before any stream is moved


def plan_shed(streams: Mapping[int, int]) -> dict[int, int]:
    """Streams each worker (by slot) should end so that the others take them: empty unless the
    spread is at least MIN_SPREAD; then every worker above ceil(mean) sheds down to it."""
    if len(streams) < 2:
        return {}
    counts = list(streams.values())
    if max(counts) - min(counts) < MIN_SPREAD:
        return {}
    fair = math.ceil(sum(counts) / len(counts))
    return {slot: n - fair for slot, n in streams.items() if n > fair}


def pick_slot(
    streams: Mapping[int, int], own: int, shed: Mapping[int, int], given: Mapping[int, int]
) -> int:
    """The slot whose data port a new stream should be sent to (see the module docstring): the
    least expected streams, `own` on a tie (and when nothing was counted yet)."""
    if not streams:
        return own

    def expected(slot: int) -> int:
        return streams.get(slot, 0) - shed.get(slot, 0) + given.get(slot, 0)

    return min(streams, key=lambda s: (expected(s), s != own, s))
