"""Shuffle mode "block": permute the blocks, then permute samples within windows of blocks.

1. The M blocks (row groups, across all shards) are put in a keyed random order. This shuffles the
   shards and the row groups inside them at once: consecutive blocks of the order come from
   anywhere in the dataset, yet each remains one contiguous storage read.
2. The permuted blocks are cut into windows of `window` consecutive blocks; the samples of each
   window are permuted with a key of their own. A batch therefore draws from at most a window's
   blocks, and consecutive batches reuse them (cache hits) until the window is consumed.

Lookup of a position: window by binary search over window starts (O(log M)), one keyed permutation
inside the window (O(1)), then slot and row by binary search over the permuted blocks' cumulative
sizes (O(log M)). Memory: three arrays of M integers, however many rows there are.
"""

from __future__ import annotations

import numpy as np

from shardstream.order.buckets import Buckets
from shardstream.order.permutation import KeyedPermutation, derive_key


class BlockOrder:
    def __init__(self, block_sizes: np.ndarray, key: bytes, window: int) -> None:
        sizes = np.asarray(block_sizes, dtype=np.int64)
        m = len(sizes)
        self._key = key
        self._block_start = np.concatenate([[0], np.cumsum(sizes)])[:-1].astype(np.int64)
        # slot j of the epoch's block order holds block _slot_block[j]
        self._slot_block = KeyedPermutation(m, derive_key(key.hex(), "blocks"))(np.arange(m, dtype=np.int64))
        self._slot_start = np.concatenate([[0], np.cumsum(sizes[self._slot_block])]).astype(np.int64)
        self._window_start = (
            np.append(self._slot_start[0:m:window], self._slot_start[-1]) if m else np.zeros(1, np.int64)
        )
        self.num_rows = int(self._slot_start[-1])
        # blocks of one size (a dataset's row groups, mostly) make both a division
        self._windows, self._slots = Buckets(self._window_start), Buckets(self._slot_start)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.num_rows):
            raise IndexError(f"positions must lie in [0, {self.num_rows})")
        if not p.size:
            return p.copy()
        win = self._windows.index(p)
        mixed = np.empty_like(p)
        cuts = np.flatnonzero(win[1:] != win[:-1]) + 1
        if len(cuts) < _MAX_RUNS:
            # runs of positions in one window (a rank's positions in order cross a few): a slice each,
            # no mask over all positions a window (np.unique alone was ~40% of a 16,384-position call)
            bounds = [0, *cuts.tolist(), len(p)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                start, perm = self._window(int(win[a]))
                mixed[a:b] = start + perm(p[a:b] - start)
        else:
            for w in np.unique(win):
                sel = win == w
                start, perm = self._window(int(w))
                mixed[sel] = start + perm(p[sel] - start)
        slot = self._slots.index(mixed)
        return self._block_start[self._slot_block[slot]] + (mixed - self._slot_start[slot])

    def _window(self, w: int) -> tuple[int, KeyedPermutation]:
        """Window w's first position and the permutation of its samples."""
        start, end = int(self._window_start[w]), int(self._window_start[w + 1])
        return start, KeyedPermutation(end - start, derive_key(self._key.hex(), "window", w))


_MAX_RUNS = 64  # past this many runs of one window, positions are grouped by window with masks


def block_order(block_sizes: np.ndarray, key: bytes, window: int) -> BlockOrder:
    return BlockOrder(block_sizes, key, window)
