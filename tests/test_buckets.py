"""shardstream/order/buckets.py: `Buckets.index` (and `index_one`, a value at a time) is
`np.searchsorted(starts, v, "right") - 1` for every value, on evenly spaced starts (its division)
and on any other (the search)."""

from __future__ import annotations

import numpy as np
import pytest

from shardstream.order.buckets import Buckets


def _starts(rng: np.random.Generator, kind: str) -> np.ndarray:
    n = int(rng.integers(1, 40))
    step = int(rng.integers(1, 5000))
    first = int(rng.integers(0, 3)) * int(rng.integers(0, 100))
    s = first + step * np.arange(n, dtype=np.int64)
    if kind == "short last" and n >= 2:
        s[-1] = s[-2] + int(rng.integers(1, step + 1))
    elif kind == "long last" and n >= 2:
        s[-1] = s[-2] + step + int(rng.integers(1, 10 * step))
    elif kind == "uneven":
        s = np.cumsum(rng.integers(0, 3 * step, n)) + first
    elif kind == "empty last" and n >= 2:
        s[-1] = s[-2]
    return s


@pytest.mark.parametrize("kind", ["even", "short last", "long last", "uneven", "empty last"])
@pytest.mark.parametrize("seed", range(40))
def test_index_is_the_search(kind: str, seed: int) -> None:
    rng = np.random.default_rng([seed, len(kind)])
    s = _starts(rng, kind)
    lo, hi = int(s[0]) - 3 * int(s[-1] - s[0] + 1), int(s[-1]) * 2 + 10
    values = np.concatenate([rng.integers(lo, hi, 500), s, s - 1, s + 1]).astype(np.int64)
    got = Buckets(s).index(values)
    want = np.searchsorted(s, values, side="right") - 1
    assert np.array_equal(got, want), (kind, s)
    one = [Buckets(s).index_one(int(v)) for v in values]  # one value at a time, as RowLocator.run asks
    assert one == want.tolist() and all(type(i) is int for i in one), (kind, s)


def test_evenly_spaced_starts_take_the_division() -> None:
    assert Buckets(np.arange(0, 100, 10)).step == 10
    assert Buckets(np.array([0, 10, 20, 23])).step == 10  # a short last row group
    assert Buckets(np.array([0, 10, 25])).step == 10  # a long last one
    assert Buckets(np.array([0, 10, 25, 30])).step == 0  # uneven: the search
    assert Buckets(np.array([0, 10, 10])).step == 0
    assert Buckets(np.array([5])).step == 0
