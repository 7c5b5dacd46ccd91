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
each of its rows (packed modes) and, where the request packs a dataset's token lists (`slices`),
which values of each document the reader takes: a rank that holds two rows of a 40-row document
reads those rows' tokens, not the document (build.py `_spans`, gather.py `gather_spans`). Everything else (`num_steps`, `global_range`, `dropped`,
`offset_after`, ...) is the wrapped layout's: the cursor, resume and every schedule work as without
balance. The costs of READ_STEPS steps are read at once and those of them the stream asks for (every
step, or every k-th of a step_stride k) split at once; the splits of the last STEPS_KEPT steps are
kept (a build, its look-ahead and the read-ahead ask for the same steps).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.order.balance import (
    deal_attention,
    deal_attention_steps,
    deal_tokens,
    deal_tokens_steps,
    pack_step,
    pack_steps,
    partition_costs,
)
from shardstream.order.scheduled_steps import Layout

__all__ = ["BalancedLayout", "Positions", "TokenWindow", "hull", "positions_array", "rank_positions"]

STEPS_KEPT = 256  # steps (and one rank's shares of them) kept split: ahead of a stream's builds and read-ahead
READ_STEPS = 16  # steps whose costs are read and split at once


@dataclass(frozen=True)
class TokenWindow:
    """One rank's rows of a balanced packed step. Its documents (`sizes`: each one's declared tokens
    with EOS, in order) make a stream of tokens; row k of the rank is tokens `segments[k]` of that
    stream (a whole row but for the step's last, which is padded), and `pad_to` rows are sent (0:
    no padding rows). `labels`: its tokens with a label (all but each document's EOS: its loss's
    terms); `step_labels`: those of every rank. `starts`/`stops`: where the layout slices (`slices`),
    the values [start, stop) of each document its rows need (its tokens and the next one, the last
    one's label; a document's end asked one value past it, so a document longer than its count
    shows), which is all the reader takes of it; None: whole documents."""

    segments: np.ndarray  # (rows, 2) int64: [start, end) of each row in the stream
    sizes: np.ndarray
    pad_to: int
    labels: int
    step_labels: int
    starts: np.ndarray | None = None
    stops: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.segments)


@dataclass(frozen=True)
class _Step:
    """A step's split, for every rank at once (small: a number per sample or row)."""

    gs: int  # its first position
    values: np.ndarray  # per sample: token count (+ EOS, packed modes) or cost
    ends: np.ndarray  # packed modes: where each document ends in the step's stream (cumsum of values)
    owner: np.ndarray  # per row (packed) or per sample ("cost"): the rank that gets it
    rank_cost: np.ndarray  # per rank: Σ chunk length² of its rows (packed modes) or of its costs
    num_rows: int


@dataclass(frozen=True)
class _Share:
    positions: np.ndarray
    window: TokenWindow | None


class BalancedLayout:
    def __init__(
        self,
        base: Layout,
        *,
        mode: str,
        costs: Callable[[int, int], np.ndarray],
        seq_len: int = 0,
        pad_rows: bool = False,
        slices: str | None = None,
    ) -> None:
        """`costs(start, end)`: the values of the positions [start, end) of the epoch: token counts
        (EOS not counted) in the packed modes, the cost column's for "cost". `slices`: the dataset's
        list column text.pack packs, where the reader may take only the values a rank's rows need
        (TokenWindow.starts/stops); None: whole documents (e.g. tokenized by the request)."""
        if mode not in ("tokens", "attention", "cost"):
            raise ValueError(f"unknown balance mode {mode!r}")
        self.base = base
        self.mode = mode
        self.seq_len = seq_len
        self.pad_rows = pad_rows
        self.slices = slices
        self._costs = costs
        self._steps: OrderedDict[int, _Step] = OrderedDict()
        self._shares: OrderedDict[tuple[int, int], _Share] = OrderedDict()
        self._asked: int | None = None  # the step last asked
        self._gap = READ_STEPS  # the smallest step forward seen between two asks
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # the wrapped layout's steps, ranges and cursor arithmetic
        return getattr(self.base, name)

    @property
    def packed(self) -> bool:
        return self.mode != "cost"

    # --- the step, every rank ---------------------------------------------------------------------
    def _step(self, step: int) -> _Step:
        with self._lock:
            if self._asked is not None and step > self._asked:
                self._gap = min(self._gap, step - self._asked)
            self._asked, gap = step, self._gap
            hit = self._steps.get(step)
            if hit is not None:
                self._steps.move_to_end(step)
                return hit
        planned = self._plan(step, gap)
        with self._lock:
            for s, split in planned.items():
                self._steps.setdefault(s, split)
            while len(self._steps) > STEPS_KEPT:
                self._steps.popitem(last=False)
        return planned[step]

    def _plan(self, step: int, gap: int) -> dict[int, _Step]:
        """The splits of `step` and of every `gap`-th step after it among the next READ_STEPS (`gap`:
        the smallest step its stream was seen to move on by, READ_STEPS until it has: a stream of
        `step_stride` k asks every k-th step). The values of the READ_STEPS steps are read in one
        read (one selection and one take, not one a step: ~0.5 ms a call); the steps are packed and
        dealt together (`pack_steps`, `deal_*_steps`: a few numpy calls for all of them, the same
        split as step by step)."""
        last = min(self.base.num_steps, step + READ_STEPS)
        start = self.base.global_range(step)[0]
        values = self._costs(start, self.base.global_range(last - 1)[1])
        bounds = [self.base.global_range(s) for s in range(step, last, gap)]
        parts = [values[a - start : b - start] for a, b in bounds]
        world = self.base.world_size
        out: dict[int, _Step] = {}
        if not self.packed:
            for s, (a, _), v in zip(range(step, last, gap), bounds, parts, strict=True):
                owner = partition_costs(v, world)
                cost = np.bincount(owner, weights=v, minlength=world)
                out[s] = _Step(a, np.asarray(v, dtype=np.float64), np.empty(0, np.int64), owner, cost, 0)
            return out
        sizes = np.asarray(np.concatenate(parts) if len(parts) > 1 else parts[0], dtype=np.int64) + 1  # + EOS
        counts = np.array([b - a for a, b in bounds], np.int64)
        if len(counts) == 1:  # (a stream of step_stride READ_STEPS or more: the step alone, its own calls)
            packed = pack_step(sizes, self.seq_len)
            rows, row_cost = np.array([packed.num_rows]), packed.row_cost
            owner = deal_tokens(packed.num_rows, world) if self.mode == "tokens" else deal_attention(row_cost, world)
        else:
            rows, row_cost = pack_steps(sizes, counts, self.seq_len)
            tokens = self.mode == "tokens"
            owner = deal_tokens_steps(rows, world) if tokens else deal_attention_steps(row_cost, rows, world)
        which = np.repeat(np.arange(len(rows)), rows) * world + owner  # (step, rank) of each row
        cost = np.bincount(which, weights=row_cost, minlength=len(rows) * world).reshape(-1, world)
        ends = np.cumsum(sizes)
        doc0 = (np.cumsum(counts) - counts).tolist()
        row0 = (np.cumsum(rows) - rows).tolist()
        for j, (s, (a, b)) in enumerate(zip(range(step, last, gap), bounds, strict=True)):
            d0, d1, r0 = doc0[j], doc0[j] + b - a, row0[j]
            before = int(ends[d0 - 1]) if d0 else 0
            out[s] = _Step(a, sizes[d0:d1], ends[d0:d1] - before, owner[r0 : r0 + rows[j]], cost[j], int(rows[j]))
        return out

    # --- one rank's share ---------------------------------------------------------------------------
    def _share(self, step: int, rank: int) -> _Share:
        key = (step, rank)
        with self._lock:
            hit = self._shares.get(key)
            if hit is not None:
                self._shares.move_to_end(key)
                return hit
        planned = self._step(step)
        share = self._packed_share(planned, rank) if self.packed else self._cost_share(planned, rank)
        with self._lock:
            self._shares[key] = share
            while len(self._shares) > STEPS_KEPT:
                self._shares.popitem(last=False)
        return share

    @staticmethod
    def _cost_share(planned: _Step, rank: int) -> _Share:
        return _Share(planned.gs + np.nonzero(planned.owner == rank)[0].astype(np.int64), None)

    def _packed_share(self, planned: _Step, rank: int) -> _Share:
        L, sizes, ends = self.seq_len, planned.values, planned.ends
        total = int(ends[-1]) if len(ends) else 0
        rows = np.flatnonzero(planned.owner == rank)
        pad_to = -(-planned.num_rows // self.base.world_size) if self.pad_rows else 0
        if not len(rows):
            none = np.empty(0, np.int64)
            window = TokenWindow(np.empty((0, 2), np.int64), none, pad_to, 0, total - len(sizes))
            if self.slices is not None:
                window = TokenWindow(window.segments, none, pad_to, 0, total - len(sizes), none, none.copy())
            return _Share(planned.gs + none, window)
        lo = rows * L
        hi = np.minimum(lo + L, total)
        first = np.searchsorted(ends, lo, side="right")  # the document of each row's first token
        last = np.searchsorted(ends, hi, side="left")  # of its last
        # the (row, document) pairs, row by row: the documents first..last of each. The rows are in
        # order and a row's documents end where the next row's start, so the pairs are sorted and a
        # document's pairs (the rows it spans) are neighbours: its documents are where pair changes.
        counts = last - first + 1
        run = np.cumsum(counts) - counts  # each row's first pair
        pair = np.arange(int(run[-1] + counts[-1]), dtype=np.int64) + np.repeat(first - run, counts)
        new = np.empty(len(pair), bool)
        new[0] = True
        np.not_equal(pair[1:], pair[:-1], out=new[1:])
        docs = pair[new]
        mine = sizes[docs]
        local = np.cumsum(mine) - mine  # where each of its documents starts in its stream
        at = local[np.cumsum(new)[run] - 1] + (lo - (ends[first] - sizes[first]))
        # each document's EOS (its last token, ends - 1) has no label: those in [lo, hi)
        labels = int((hi - lo).sum()) - int((np.searchsorted(ends, hi, side="right") - first).sum())
        starts = stops = None
        if self.slices is not None:
            # each document's tokens its rows hold, [a, b) of the document (its EOS is token n): from
            # its first pair's row to its last's (later rows start and end later)
            begin = ends[docs] - mine
            a = np.maximum(np.repeat(lo, counts)[new], begin) - begin
            b = np.minimum(np.repeat(hi, counts)[np.append(new[1:], True)], ends[docs]) - begin
            n = mine - 1
            starts = np.minimum(a, n)
            stops = np.minimum(b + 1, n)  # the value after its last token: that token's label
            stops[stops == n] += 1  # one past the end: a document longer than its count shows
        window = TokenWindow(
            np.stack([at, at + hi - lo], axis=1), mine, pad_to, labels, total - len(sizes), starts, stops
        )
        return _Share(planned.gs + docs, window)

    # --- what the builder asks ------------------------------------------------------------------------
    def rank_positions(self, step: int, rank: int) -> np.ndarray:
        self.base.rank_range(step, rank)  # its checks (step and rank in range)
        return self._share(step, rank).positions

    def rank_range(self, step: int, rank: int) -> tuple[int, int]:
        """The hull of the rank's positions (a message header's position_start/end)."""
        return hull(self.rank_positions(step, rank), self.base.global_range(step)[0])

    def window(self, step: int, rank: int) -> TokenWindow | None:
        return self._share(step, rank).window

    def step_rows(self, step: int) -> int:
        """The packed rows of the whole step (0 under "cost")."""
        return self._step(step).num_rows

    def cost(self, step: int, rank: int) -> tuple[float, float]:
        """(this rank's cost of the step, every rank's)."""
        cost = self._step(step).rank_cost
        return float(cost[rank]), float(cost.sum())


Positions = range | np.ndarray  # a rank's positions of a step: a range but under balance


def rank_positions(layout: Any, step: int, rank: int) -> Positions:
    """The positions of `step` that `rank` gets, in order: its range of the layout (no array made),
    or a balanced layout's own (not always a range)."""
    if isinstance(layout, BalancedLayout):
        return layout.rank_positions(step, rank)
    return range(*layout.rank_range(step, rank))


def hull(positions: Positions, start: int) -> tuple[int, int]:
    """[first, last + 1) of `positions`; (start, start) when there are none."""
    if isinstance(positions, range):
        return positions.start, positions.stop
    if not len(positions):
        return start, start
    return int(positions[0]), int(positions[-1]) + 1


def positions_array(parts: list[Positions]) -> np.ndarray:
    """Several steps' positions, in order, as one int64 array."""
    arrays = [np.arange(p.start, p.stop, dtype=np.int64) if isinstance(p, range) else p for p in parts]
    if not arrays:
        return np.empty(0, np.int64)
    return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
