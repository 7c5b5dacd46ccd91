"""A step layout whose ranks get balanced work: packed rows dealt by tokens (ReadRequest.balance).

With balance "tokens" (shardstream/order/balance.py), global step t's documents — the same set as
without it — are packed as one token stream in global order and its R rows dealt in contiguous
runs, rank r getting rows [r·R // W, (r+1)·R // W). The rank's documents are then a contiguous run
of the step's positions, its first and last possibly cut: `rank_range(step, rank)` is that run (a
document cut between two ranks is in both ranks' ranges, each sending its own tokens of it), and
`window(step, rank)` says which of those documents' tokens are this rank's. Every server computes
the same split from the step's documents' token counts, read from the dataset's lengths column
(`lengths(start, end)`: the step's positions): one integer a document, never another rank's text.

Everything else (`num_steps`, `global_range`, `dropped`, `offset_after`, ...) is the wrapped layout's:
the cursor, resume and every schedule work as without balance. Splits of the last STEPS_KEPT steps
are kept (a build and the read-ahead ask for the same steps).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.order.balance import pack_step, token_range
from shardstream.order.scheduled_steps import Layout

__all__ = ["BalancedLayout", "TokenWindow"]

STEPS_KEPT = 64


@dataclass(frozen=True)
class TokenWindow:
    """One rank's share of a balanced step: tokens [skip, skip + take) of the stream its documents
    (`sizes`: each one's declared tokens with EOS, in order) make, as `rows` rows, padded with whole
    rows of padding to `pad_to` rows (0: not padded). `labels`: its tokens that have a label (all but
    each document's EOS: the terms of its loss); `step_labels`: those of every rank."""

    skip: int
    take: int
    sizes: np.ndarray
    rows: int
    pad_to: int
    labels: int
    step_labels: int


@dataclass(frozen=True)
class _Split:
    starts: np.ndarray  # per rank: its first position
    ends: np.ndarray  # per rank: one past its last
    windows: list[TokenWindow]


class BalancedLayout:
    def __init__(
        self,
        base: Layout,
        *,
        seq_len: int,
        pad_rows: bool,
        lengths: Callable[[int, int], np.ndarray],
    ) -> None:
        self.base = base
        self.seq_len = seq_len
        self.pad_rows = pad_rows
        self._lengths = lengths
        self._splits: OrderedDict[int, _Split] = OrderedDict()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # the wrapped layout's steps, ranges and cursor arithmetic
        return getattr(self.base, name)

    def _split(self, step: int) -> _Split:
        with self._lock:
            hit = self._splits.get(step)
            if hit is not None:
                self._splits.move_to_end(step)
                return hit
        gs, ge = self.base.global_range(step)
        sizes = np.asarray(self._lengths(gs, ge), dtype=np.int64) + 1  # + EOS
        packed = pack_step(sizes, self.seq_len)
        world = self.base.world_size
        ends = np.cumsum(sizes)
        doc_starts = ends - sizes
        total = int(ends[-1]) if len(ends) else 0
        eos = ends - 1  # where each document's EOS stands in the stream (it has no label)
        pad_to = -(-packed.num_rows // world) if self.pad_rows else 0
        starts, stops, windows = np.empty(world, np.int64), np.empty(world, np.int64), []
        for r in range(world):
            a, b = token_range(packed, world, r)
            if b > a:
                d0 = int(np.searchsorted(ends, a, side="right"))
                d1 = int(np.searchsorted(ends, b, side="left")) + 1
            else:
                d0 = d1 = int(np.searchsorted(ends, a, side="right")) if a < total else len(sizes)
            starts[r], stops[r] = gs + d0, gs + d1
            rows = -(-(b - a) // self.seq_len)
            skip = a - int(doc_starts[d0]) if d1 > d0 else 0
            labels = (b - a) - int(np.searchsorted(eos, b) - np.searchsorted(eos, a))
            windows.append(TokenWindow(skip, b - a, sizes[d0:d1], rows, pad_to, labels, total - len(sizes)))
        split = _Split(starts, stops, windows)
        with self._lock:
            self._splits[step] = split
            while len(self._splits) > STEPS_KEPT:
                self._splits.popitem(last=False)
        return split

    def rank_range(self, step: int, rank: int) -> tuple[int, int]:
        self.base.rank_range(step, rank)  # its checks (step and rank in range)
        split = self._split(step)
        return int(split.starts[rank]), int(split.ends[rank])

    def window(self, step: int, rank: int) -> TokenWindow:
        return self._split(step).windows[rank]
