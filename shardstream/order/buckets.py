"""Which of sorted starts each value falls after: `np.searchsorted(starts, v, side="right") - 1`,
by a division where the starts are evenly spaced (pure, no I/O).

A dataset's row groups are mostly of one size, so the starts of its row groups (and of a block
order's slots) are evenly spaced but for the last. A binary search over them costs ~22 ns a value
with values in random order (its branches mispredict: 46 us for a 2,032-row shuffled message over
65 starts), a division ~1.5 ns (issue #26); both give the same index for every value.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Buckets"]


class Buckets:
    """`index(v)` = `np.searchsorted(starts, v, side="right") - 1` for non-decreasing `starts`."""

    def __init__(self, starts: np.ndarray) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        s = self.starts
        self.step = 0  # > 0: s[i] = s[0] + i * step for every i but the last, and s[-1] > s[-2]
        if len(s) >= 2:
            step = int(s[1] - s[0])
            if step > 0 and int(s[-1]) > int(s[-2]) and (len(s) == 2 or (np.diff(s[:-1]) == step).all()):
                self.step = step

    def index(self, values: np.ndarray) -> np.ndarray:
        """The index of the last start <= each value (-1 before the first), as intp."""
        s = self.starts
        if not self.step:
            return np.searchsorted(s, values, side="right") - 1
        v = np.asarray(values, dtype=np.int64)
        last = len(s) - 1
        # evenly spaced up to s[-2]; values at or past s[-1] are in the last bucket, those before
        # s[0] in none (-1): exactly what the search gives
        i = np.minimum((v - s[0]) // self.step, last - 1)
        i += v >= s[last]
        np.maximum(i, -1, out=i)
        return i.astype(np.intp, copy=False)

    def index_one(self, value: int) -> int:
        """`index` of one value, in scalars (~0.2 us; an array and a numpy call: ~2)."""
        s = self.starts
        if not self.step:
            return int(np.searchsorted(s, value, side="right")) - 1
        last = len(s) - 1
        if value >= s.item(last):
            return last
        first = s.item(0)
        return -1 if value < first else min((value - first) // self.step, last - 1)
