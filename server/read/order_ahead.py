"""The samples of a stream's next steps, selected through the plan's order several messages at a time."""

from __future__ import annotations

import numpy as np

from shardstream.order.read_order import DatasetOrder, StepLayout

from .balanced_layout import Positions, positions_array, rank_positions
from .message_steps import Chunk
from .plan import ReadPlan

__all__ = ["OrderAhead"]


class OrderAhead:
    """The samples of a stream's next steps, selected through the plan's order several messages at
    a time: a keyed permutation costs ~70 numpy calls a round of its cycle walk whatever the number
    of positions, so 2,032 positions (a 2 MiB step) took 705 us and 8 steps' worth 215 us a step
    (full shuffle of 130,048 rows; 16 steps' worth: 198 us). The order is a function of each position alone, so a chunk's
    samples are the same whichever positions were selected with them. The stream's first chunk is
    selected alone: a resumed stream's first batch does not wait for the look-ahead. Unshuffled too:
    its order is cheap, but selecting a 2 MiB message's alone cost ~25 us of its ~140 us build."""

    AHEAD_SAMPLES = 16_384  # positions selected at once (at least a chunk's): 128 KiB a stream
    AHEAD_STEPS = 16  # at most this many times a chunk's steps

    def __init__(self, plan: ReadPlan) -> None:
        self._plan = plan
        self._first = 0  # the first step selected
        self._count = 0  # steps selected, every plan.stride-th from _first
        self._starts = np.zeros(1, np.int64)  # where each selected step's samples start
        self._src = self._rows = np.empty(0, np.int64)
        # the stored order (position p is row p): `run` needs no selection; one rank's steps abut
        self.stored = (
            not plan.mixture and isinstance(plan.selector, DatasetOrder) and plan.selector.spec.mode == "none"
        )
        self._one_rank = isinstance(plan.layout, StepLayout) and plan.layout.world_size == 1

    def select(self, chunk: Chunk) -> tuple[np.ndarray, np.ndarray]:
        """(source, row) of the chunk's samples, in order: its steps' or its part's."""
        p = self._plan
        first, n = chunk.steps[0], len(chunk.steps)
        i = (first - self._first) // p.stride
        if first < self._first or (first - self._first) % p.stride or i + n > self._count:
            self._fill(chunk)
            i = 0
        a, b = int(self._starts[i]), int(self._starts[i + n])
        if chunk.samples is not None:
            a, b = a + chunk.samples[0], a + chunk.samples[1]
        return self._src[a:b], self._rows[a:b]

    def run(self, chunk: Chunk) -> tuple[int, int] | None:
        """(first row, rows) of a chunk of whole steps when its samples are consecutive dataset rows
        in order, else None. Only in the stored order (`stored`: position p is row p), where a
        chunk's rows are its positions, one run when its steps' abut: a step, or one rank's steps."""
        p = self._plan
        steps = chunk.steps
        if not self.stored or (len(steps) > 1 and not self._one_rank):
            return None
        a, b = p.layout.rank_range(steps[0], p.rank)
        if len(steps) > 1:
            b = p.layout.rank_range(steps[-1], p.rank)[1]
        return (a, b - a) if b > a else None

    def _fill(self, chunk: Chunk) -> None:
        p = self._plan
        ranges: list[Positions] = []
        total = 0
        step = chunk.steps[0]
        # the stream's first chunk alone (a quick first batch: a resume waits for it), later ones ahead
        ahead = self.AHEAD_SAMPLES if self._count else 0
        limit = chunk.steps[-1] + p.stride * len(chunk.steps) * self.AHEAD_STEPS
        while step < p.end_step and (step <= chunk.steps[-1] or (total < ahead and step < limit)):
            ranges.append(rank_positions(p.layout, step, p.rank))
            total += len(ranges[-1])
            step += p.stride
        src, self._rows = p.selector.select(p.epoch, positions_array(ranges))
        # a plain dataset's sources are all 0: kept as a view of one zero, not an array a position
        self._src = src if p.mixture else np.broadcast_to(src.dtype.type(0), src.shape)
        self._first, self._count = chunk.steps[0], len(ranges)
        self._starts = np.concatenate([[0], np.cumsum([len(r) for r in ranges])]).astype(np.int64)
