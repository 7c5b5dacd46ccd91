"""The read plan (DESIGN §4): pure functions from a request to the rows it delivers. No I/O.

Three pieces, each usable alone:

* `EpochOrder` — the global sample order of one epoch: position p in [0, N) -> dataset row index.
  It depends only on (manifest fingerprint, seed, epoch, shuffle spec): never on world size, server
  count or timing. The modes ("none", "full", "block") live in the `shuffle` package. Epoch e of
  seed s uses the key (fingerprint, s, e, spec), so every epoch has its own order.
* `RowLocator` — dataset row index -> (shard, row in shard, row group, row in row group), O(log G)
  for G row groups, O(G) memory.
* `StepLayout` — which global positions a step and a rank cover. Global step t of world size W and
  per-rank batch B, started at offset o, covers positions [o + t·W·B, o + (t+1)·W·B) clipped to the
  epoch, and rank r gets the r-th slice of B. The job's cursor is one number — the global offset
  in the epoch — so resuming with another W or B is exact. The last step of an epoch may be short
  (drop_last=False): its L < W·B positions are split as evenly as contiguous slices allow
  (rank r gets [r·L//W, (r+1)·L//W)), so every rank still takes the same number of steps and no
  sample is repeated or padded. With drop_last=True that short step is dropped and counted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardstream import kernels
from shardstream.errors import InvalidArgumentError
from shardstream.order.buckets import Buckets
from shardstream.order.permutation import derive_key
from shardstream.order.shuffle import ShuffleSpec, get_order

__all__ = ["DatasetOrder", "EpochOrder", "RowLocator", "ShuffleSpec", "StepLayout"]


class EpochOrder:
    """Global position -> dataset row index, for one epoch."""

    def __init__(
        self,
        fingerprint: str,
        blocks: int | Sequence[int] | np.ndarray,
        seed: int,
        epoch: int,
        shuffle: ShuffleSpec | bool | str,
    ) -> None:
        """`blocks`: the dataset's non-empty row-group sizes in storage order (or just N)."""
        spec = ShuffleSpec.parse(shuffle)
        if seed < 0 or epoch < 0:
            raise InvalidArgumentError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
        sizes = np.asarray([blocks] if isinstance(blocks, int) else blocks, dtype=np.int64)
        self.num_rows = int(sizes.sum())
        self.spec = spec
        # The key names everything the order may depend on, and nothing else.
        key = derive_key("shardstream.order.v1", fingerprint, seed, epoch, *spec.key_parts)
        self._order = get_order(spec, sizes, key)

    def rows(self, positions: np.ndarray) -> np.ndarray:
        return self._order(np.asarray(positions, dtype=np.int64))

    def rows_in_range(self, start: int, end: int) -> np.ndarray:
        return self.rows(np.arange(start, end, dtype=np.int64))


class RowLocator:
    """Dataset row index -> where it lives, from the shards' row-group row counts.

    `masked` (per shard, the [start, end) rows of its file a drop_rows version does not hold:
    Manifest shards' `masked`) makes dataset row indexes count the rows the version holds only: row
    i is the i-th unmasked row in storage order, `block_sizes` are the unmasked rows of each row
    group (those left with none are not blocks), and `locate` answers with places in the files. The
    order of an epoch (EpochOrder over `block_sizes`) is then a permutation of the rows held.
    Without masks nothing of this runs: the same arrays as always."""

    def __init__(
        self,
        shard_row_groups: Sequence[Sequence[int]],
        masked: Sequence[Sequence[tuple[int, int]]] | None = None,
    ) -> None:
        counts: list[int] = []
        shard_of: list[int] = []
        index_in_shard: list[int] = []
        shard_starts = [0]
        for s, groups in enumerate(shard_row_groups):
            for g, rows in enumerate(groups):
                if rows > 0:
                    counts.append(rows)
                    shard_of.append(s)
                    index_in_shard.append(g)
            shard_starts.append(shard_starts[-1] + sum(groups))
        self.num_rows = shard_starts[-1]
        self.block_sizes = np.asarray(counts, dtype=np.int64)  # non-empty row groups, storage order
        self._group_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._groups = Buckets(self._group_starts)  # a division when the row groups are of one size
        self._group_shard = np.asarray(shard_of, dtype=np.int32)
        self._group_index = np.asarray(index_in_shard, dtype=np.int32)
        self._shard_starts = np.asarray(shard_starts, dtype=np.int64)
        self._gap_starts: np.ndarray | None = None  # masked ranges, in dataset rows of the files
        if masked and any(masked):
            self._mask(masked)

    def _mask(self, masked: Sequence[Sequence[tuple[int, int]]]) -> None:
        ranges = sorted(
            (int(self._shard_starts[s]) + a, int(self._shard_starts[s]) + b)
            for s, rs in enumerate(masked)
            for a, b in rs
        )
        starts = np.asarray([a for a, _ in ranges], dtype=np.int64)
        lengths = np.asarray([b - a for a, b in ranges], dtype=np.int64)
        self._gap_starts, self._gap_lengths = starts, lengths
        self._gap_before = np.concatenate([[0], np.cumsum(lengths)])  # masked rows before range i
        self._gap_live = starts - self._gap_before[:-1]  # the held row index where range i was
        sizes = np.diff(self._group_starts) - np.diff(self._masked_before(self._group_starts))
        self.block_sizes = sizes[sizes > 0]
        self.num_rows -= int(self._gap_before[-1])

    def _masked_before(self, stored: np.ndarray) -> np.ndarray:
        """Masked rows before each stored row index (0 without masks)."""
        stored = np.asarray(stored, dtype=np.int64)
        if self._gap_starts is None:
            return np.zeros_like(stored)
        i = np.searchsorted(self._gap_starts, stored, side="right") - 1
        inside = np.minimum(stored - self._gap_starts[np.maximum(i, 0)], self._gap_lengths[np.maximum(i, 0)])
        return np.where(i >= 0, self._gap_before[np.maximum(i, 0)] + inside, 0)

    def stored(self, rows: np.ndarray) -> np.ndarray:
        """Dataset row index -> row index over all rows of the files (the same without masks)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._gap_starts is None:
            return rows
        return rows + self._gap_before[np.searchsorted(self._gap_live, rows, side="right")]

    def row_index(self, shard: np.ndarray, row_in_shard: np.ndarray) -> np.ndarray:
        """(shard, row in shard) -> dataset row index; -1 for a masked row (explain's way back)."""
        stored = self._shard_starts[np.asarray(shard, dtype=np.int64)] + np.asarray(
            row_in_shard, dtype=np.int64
        )
        out = stored - self._masked_before(stored)
        if self._gap_starts is not None:
            i = np.searchsorted(self._gap_starts, stored, side="right") - 1
            hit = (i >= 0) & (
                stored < self._gap_starts[np.maximum(i, 0)] + self._gap_lengths[np.maximum(i, 0)]
            )
            out = np.where(hit, -1, out)
        return out

    @property
    def masked(self) -> bool:
        """Whether dataset rows skip masked rows of the files (a drop_rows version)."""
        return self._gap_starts is not None

    def run(self, first: int, n: int) -> tuple[int, int, int, int] | None:
        """(shard, row group in shard, row in row group, row in shard) of dataset row `first` when
        rows first .. first+n-1 are consecutive rows of one row group in storage (what `locate`
        would say of each, without an array per row); None when they are not."""
        if n < 1 or first < 0 or first + n > self.num_rows:
            return None
        if self._gap_starts is None:
            a, b = first, first + n - 1
        else:
            a, b = self.stored(np.array([first, first + n - 1], dtype=np.int64)).tolist()
            if b - a != n - 1:  # a masked range between them
                return None
        # in scalars: an unshuffled build asks once a message or row group (~0.5 us; ~2 through numpy)
        starts = self._group_starts
        g = self._groups.index_one(a)
        if b >= starts.item(g + 1):
            return None
        shard = self._group_shard.item(g)
        return shard, self._group_index.item(g), a - starts.item(g), a - self._shard_starts.item(shard)

    def group_bounds(self, row: int) -> tuple[int, int] | None:
        """The dataset rows [start, end) of the row group holding dataset row `row`, or None in a
        version with masked rows (where a row group's dataset rows need not be consecutive)."""
        if self._gap_starts is not None or not 0 <= row < self.num_rows:
            return None
        g = self._groups.index_one(row)
        return self._group_starts.item(g), self._group_starts.item(g + 1)

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(shard, row in shard, row group in shard, row in row group) for each dataset row."""
        g, shard, row_in_shard, row_in_group = self.locate_groups(rows)
        return shard, row_in_shard, self._group_index[g], row_in_group

    @property
    def num_groups(self) -> int:
        """Non-empty row groups of the dataset (the `g` of `locate_groups`)."""
        return len(self._group_shard)

    def locate_groups(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(row group, shard, row in shard, row in row group) for each dataset row, the row group
        as its index among the dataset's non-empty row groups in storage order (`group_place`)."""
        rows = self.stored(rows)
        native = kernels.native
        if native is not None and len(rows) and len(self._group_shard):
            # one pass in C (shardstream/_kernels.c) for the four arrays numpy makes in ~8 calls
            n = len(rows)
            g, shard = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int32)
            in_shard, in_group = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
            native.locate_rows(
                np.ascontiguousarray(rows, dtype=np.int64), self._group_starts, self._groups.step,
                self._group_shard, self._shard_starts, g, shard, in_shard, in_group,
            )  # fmt: skip
            return g, shard, in_shard, in_group
        g = self._groups.index(rows)
        shard = self._group_shard[g]
        return g, shard, rows - self._shard_starts[shard], rows - self._group_starts[g]

    def group_place(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row group in shard) of row groups `g` (indexes of `locate_groups`)."""
        return self._group_shard[g], self._group_index[g]


@dataclass(frozen=True)
class StepLayout:
    """Steps of one epoch from `start_offset` for world size W and per-rank batch size B."""

    num_rows: int
    start_offset: int
    world_size: int
    batch_size: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise InvalidArgumentError(f"world_size must be >= 1, got {self.world_size}")
        if self.batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.start_offset <= self.num_rows:
            raise InvalidArgumentError(
                f"start offset {self.start_offset} is outside the epoch of {self.num_rows} samples"
            )

    # Computed once: a Read message's build asks for them a few dozen times (issue #26)
    @cached_property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size

    @property
    def remaining(self) -> int:
        return self.num_rows - self.start_offset

    @cached_property
    def num_steps(self) -> int:
        full, rest = divmod(self.remaining, self.global_batch)
        return full if (self.drop_last or rest == 0) else full + 1

    @property
    def dropped(self) -> int:
        """Samples of the epoch this layout never delivers (only with drop_last)."""
        return self.remaining % self.global_batch if self.drop_last else 0

    def global_range(self, step: int) -> tuple[int, int]:
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} outside [0, {self.num_steps})")
        start = self.start_offset + step * self.global_batch
        return start, min(start + self.global_batch, self.num_rows)

    def rank_range(self, step: int, rank: int) -> tuple[int, int]:
        if not 0 <= rank < self.world_size:
            raise InvalidArgumentError(f"rank must be in [0, {self.world_size}), got {rank}")
        start, end = self.global_range(step)
        size = end - start
        if size == self.global_batch:
            return start + rank * self.batch_size, start + (rank + 1) * self.batch_size
        w = self.world_size
        return start + rank * size // w, start + (rank + 1) * size // w

    def offset_after(self, step: int) -> int:
        """The global offset in the epoch once `step` is consumed (the cursor value)."""
        return self.global_range(step)[1]


class DatasetOrder:
    """The orders of one dataset for one (seed, shuffle), epoch by epoch; a few are kept built.

    `select(epoch, positions)` -> (source index (all 0), row index), the same shape as
    MixtureOrder.select, so servers and tools handle datasets and mixtures alike.
    """

    KEEP_EPOCHS = 4

    def __init__(
        self, fingerprint: str, block_sizes: np.ndarray | Sequence[int], seed: int, spec: ShuffleSpec
    ) -> None:
        self.fingerprint = fingerprint
        self.block_sizes = np.asarray(block_sizes, dtype=np.int64)
        self.num_rows = int(self.block_sizes.sum())
        self.seed = seed
        self.spec = spec
        self._orders: dict[int, EpochOrder] = {}
        self._lock = threading.Lock()  # shared by the streams of a server

    def epoch(self, epoch: int) -> EpochOrder:
        with self._lock:
            order = self._orders.get(epoch)
            if order is None:
                if len(self._orders) >= self.KEEP_EPOCHS:
                    self._orders.pop(next(iter(self._orders)))
                order = EpochOrder(self.fingerprint, self.block_sizes, self.seed, epoch, self.spec)
                self._orders[epoch] = order
            return order

    def rows(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        return self.epoch(epoch).rows(positions)

    def select(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = self.rows(epoch, positions)
        return np.zeros(len(rows), dtype=np.int32), rows
