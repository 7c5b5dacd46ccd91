"""A step layout whose ranks get balanced work (ReadRequest.balance; shardstream/order/balance.py).

The set of samples in global step t is the wrapped layout's; only which rank gets which changes, and
every server computes the same split from the step's samples' costs, read from the dataset (one
number a sample — never another rank's text or pixels):

- "tokens": the step's documents are packed as one token stream in global order (token counts from
  text.pack's "lengths" column) and its R rows dealt in contiguous runs, rank r getting rows
  [r·R // W, (r+1)·R // W): every rank within one row of the others. Its documents are a
  contiguous run of the step's positions, the first and last possibly cut (a document cut between
  two ranks is in both ranks' positions, each sending its own tokens of it).
- "attention": the same rows, dealt so that the largest rank's Σ(document-chunk length²) is small
  (`deal_attention`), rows still within one: a rank's rows, and so its documents, are not contiguous.
- "cost": unpacked samples partitioned by a cost column (`partition_costs`, LPT): a rank's samples
  are those of the step assigned to it, in the step's order; ranks get different numbers of them.

`rank_positions(step, rank)` are the rank's positions of the step (in order), `rank_range` their hull
(what a message header names), and `window(step, rank)` which tokens of its documents' stream make
each of its rows (packed modes). Everything else (`num_steps`, `global_range`, `dropped`,
`offset_after`, ...) is the wrapped layout's: the cursor, resume and every schedule work as without
balance. Splits of the last STEPS_KEPT steps are kept (a build and the read-ahead ask for the same).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.order.balance import deal_attention, deal_tokens, pack_step, partition_costs
from shardstream.order.scheduled_steps import Layout

__all__ = ["BalancedLayout", "TokenWindow", "rank_positions", "rank_samples"]

STEPS_KEPT = 64


@dataclass(frozen=True)
class TokenWindow:
    """One rank's rows of a balanced packed step. Its documents (`sizes`: each one's declared tokens
    with EOS, in order) make a stream of tokens; row k of the rank is tokens `segments[k]` of that
    stream (a whole row but for the step's last, which is padded), and `pad_to` rows are sent (0:
    no padding rows). `labels`: its tokens with a label (all but each document's EOS: its loss's
    terms); `step_labels`: those of every rank."""

    segments: tuple[tuple[int, int], ...]
    sizes: np.ndarray
    pad_to: int
    labels: int
    step_labels: int

    @property
    def rows(self) -> int:
        return len(self.segments)


@dataclass(frozen=True)
class _Split:
    positions: list[np.ndarray]  # per rank: its positions of the step, in order
    windows: list[TokenWindow | None]  # per rank (packed modes)
    cost: np.ndarray  # per rank: its cost (tokens² for packed modes, the column's for "cost")


class BalancedLayout:
    def __init__(
        self,
        base: Layout,
        *,
        mode: str,
        costs: Callable[[int, int], np.ndarray],
        seq_len: int = 0,
        pad_rows: bool = False,
    ) -> None:
        """`costs(start, end)`: the values of the positions [start, end) of the epoch: token counts
        (EOS not counted) in the packed modes, the cost column's for "cost"."""
        if mode not in ("tokens", "attention", "cost"):
            raise ValueError(f"unknown balance mode {mode!r}")
        self.base = base
        self.mode = mode
        self.seq_len = seq_len
        self.pad_rows = pad_rows
        self._costs = costs
        self._splits: OrderedDict[int, _Split] = OrderedDict()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # the wrapped layout's steps, ranges and cursor arithmetic
        return getattr(self.base, name)

    @property
    def packed(self) -> bool:
        return self.mode != "cost"

    def _split(self, step: int) -> _Split:
        with self._lock:
            hit = self._splits.get(step)
            if hit is not None:
                self._splits.move_to_end(step)
                return hit
        gs, ge = self.base.global_range(step)
        values = self._costs(gs, ge)
        split = self._packed(gs, values) if self.packed else self._by_cost(gs, values)
        with self._lock:
            self._splits[step] = split
            while len(self._splits) > STEPS_KEPT:
                self._splits.popitem(last=False)
        return split

    def _by_cost(self, gs: int, costs: np.ndarray) -> _Split:
        world = self.base.world_size
        ranks = partition_costs(costs, world)
        positions = [gs + np.nonzero(ranks == r)[0].astype(np.int64) for r in range(world)]
        return _Split(positions, [None] * world, np.bincount(ranks, weights=costs, minlength=world))

    def _packed(self, gs: int, lengths: np.ndarray) -> _Split:
        L, world = self.seq_len, self.base.world_size
        sizes = np.asarray(lengths, dtype=np.int64) + 1  # + EOS
        step = pack_step(sizes, L)
        ranks = deal_tokens(step.num_rows, world) if self.mode == "tokens" else deal_attention(step.row_cost, world)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        total = int(ends[-1]) if len(ends) else 0
        eos = ends - 1  # each document's EOS has no label
        pad_to = -(-step.num_rows // world) if self.pad_rows else 0
        positions, windows = [], []
        for r in range(world):
            rows = np.nonzero(ranks == r)[0]
            lo, hi = rows * L, np.minimum((rows + 1) * L, total)
            first = np.searchsorted(ends, lo, side="right")  # the document of each row's first token
            last = np.searchsorted(ends, hi, side="left")  # of its last
            docs = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last, strict=True)])) if len(rows) else np.empty(0, np.int64)
            local = np.cumsum(sizes[docs]) - sizes[docs]  # where each of its documents starts in its stream
            at = local[np.searchsorted(docs, first)] + (lo - starts[first]) if len(rows) else lo
            segments = tuple(zip((at).tolist(), (at + hi - lo).tolist(), strict=True))
            labels = int((hi - lo).sum()) - int((np.searchsorted(eos, hi) - np.searchsorted(eos, lo)).sum())
            positions.append(gs + docs.astype(np.int64))
            windows.append(TokenWindow(segments, sizes[docs], pad_to, labels, total - len(sizes)))
        cost = np.bincount(ranks, weights=step.row_cost, minlength=world)
        return _Split(positions, windows, cost)

    def rank_positions(self, step: int, rank: int) -> np.ndarray:
        self.base.rank_range(step, rank)  # its checks (step and rank in range)
        return self._split(step).positions[rank]

    def rank_range(self, step: int, rank: int) -> tuple[int, int]:
        """The hull of the rank's positions (a message header's position_start/end)."""
        p = self.rank_positions(step, rank)
        if not len(p):
            start = self.base.global_range(step)[0]
            return start, start
        return int(p[0]), int(p[-1]) + 1

    def window(self, step: int, rank: int) -> TokenWindow | None:
        return self._split(step).windows[rank]

    def cost(self, step: int, rank: int) -> tuple[float, float]:
        """(this rank's cost of the step, every rank's)."""
        cost = self._split(step).cost
        return float(cost[rank]), float(cost.sum())


def rank_positions(layout: Any, step: int, rank: int) -> np.ndarray:
    """The positions of `step` that `rank` gets, in order: its range of the layout, or a balanced
    layout's own (not always a range)."""
    if isinstance(layout, BalancedLayout):
        return layout.rank_positions(step, rank)
    ps, pe = layout.rank_range(step, rank)
    return np.arange(ps, pe, dtype=np.int64)


def rank_samples(layout: Any, step: int, rank: int) -> int:
    """How many positions of `step` `rank` gets."""
    if isinstance(layout, BalancedLayout):
        return len(layout.rank_positions(step, rank))
    ps, pe = layout.rank_range(step, rank)
    return pe - ps
