"""Shuffle modes over random dataset layouts (pure: no servers)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import InvalidArgumentError
from shardstream.order.read_order import EpochOrder, RowLocator, ShuffleSpec
from shardstream.order.shuffle import SHUFFLES

from .support.processes import same_output_in_processes

# shards -> row groups -> rows; empty shards and empty row groups included
layouts = st.lists(st.lists(st.integers(0, 40), max_size=6), max_size=8)


@settings(max_examples=200, deadline=None)
@given(
    groups=layouts,
    mode=st.sampled_from(sorted(SHUFFLES)),
    window=st.integers(1, 10),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 50),
)
def test_every_mode_is_a_permutation_of_the_rows(groups, mode, window, seed, epoch) -> None:  # type: ignore[no-untyped-def]
    loc = RowLocator(groups)
    order = EpochOrder("fp", loc.block_sizes, seed, epoch, ShuffleSpec(mode, window))
    rows = order.rows_in_range(0, loc.num_rows)
    assert np.array_equal(np.sort(rows), np.arange(loc.num_rows))


@settings(max_examples=150, deadline=None)
@given(
    groups=layouts,
    mode=st.sampled_from(sorted(SHUFFLES)),
    window=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_a_position_maps_alone_as_in_any_array(groups, mode, window, seed, data) -> None:  # type: ignore[no-untyped-def]
    """An order maps each position as it would alone, whatever else the array holds and in what
    order: in order (block mode: a slice a run of one window), shuffled or repeated (masks a window)."""
    loc = RowLocator(groups)
    n = loc.num_rows
    if not n:
        return
    order = SHUFFLES[mode](loc.block_sizes, b"key-%d" % seed, window)
    alone = np.array([int(order(np.array([p]))[0]) for p in range(n)])
    assert np.array_equal(order(np.arange(n)), alone)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    mixed = rng.integers(0, n, int(rng.integers(1, 3 * n + 2)))
    assert np.array_equal(order(mixed), alone[mixed])


@settings(max_examples=150, deadline=None)
@given(groups=layouts, window=st.integers(1, 6), seed=st.integers(0, 2**32))
def test_block_windows_are_runs_of_whole_blocks(groups, window, seed) -> None:  # type: ignore[no-untyped-def]
    loc = RowLocator(groups)
    n = loc.num_rows
    order = EpochOrder("fp", loc.block_sizes, seed, 0, ShuffleSpec("block", window))
    rows = order.rows_in_range(0, n)
    block_of_row = np.searchsorted(np.cumsum(loc.block_sizes), rows, side="right")
    # Cut the order into segments, closing one as soon as every block seen in it is complete: if
    # windows are contiguous runs of <= `window` whole blocks, no segment ever holds more blocks.
    done: set[int] = set()
    current: set[int] = set()
    pending = 0
    for blk in block_of_row.tolist():
        assert blk not in done, "a block is split across windows"
        if blk not in current:
            current.add(blk)
            pending += int(loc.block_sizes[blk])
            assert len(current) <= window
        pending -= 1
        if pending == 0:
            done |= current
            current = set()
    assert not current and len(done) == len(loc.block_sizes)


def test_block_mode_keeps_locality_and_still_mixes() -> None:
    groups = [[100] * 10 for _ in range(10)]  # 100 blocks of 100 rows
    loc = RowLocator(groups)
    full = EpochOrder("fp", loc.block_sizes, 1, 0, "full").rows_in_range(0, 10_000)
    block = EpochOrder("fp", loc.block_sizes, 1, 0, ShuffleSpec("block", 4)).rows_in_range(0, 10_000)

    def blocks_per_batch(rows: np.ndarray) -> float:
        return float(np.mean([len(set((rows[i : i + 64] // 100).tolist())) for i in range(0, len(rows), 64)]))

    assert blocks_per_batch(block) <= 4.5 < blocks_per_batch(full)
    assert not np.array_equal(block, np.arange(10_000))
    # the first window's 400 rows come from 4 blocks spread over the dataset, not the first 4
    first_blocks = set((block[:400] // 100).tolist())
    assert len(first_blocks) == 4 and first_blocks != {0, 1, 2, 3}


def test_huge_epoch_over_many_shards_is_addressable() -> None:
    sizes = np.full(100_000, 100_000, dtype=np.int64)  # 10^10 rows in 10^5 blocks
    for mode in ("full", "block"):
        order = EpochOrder("fp", sizes, 3, 7, mode)
        pos = np.array([0, 1, 5_000_000_000, 10**10 - 1])
        rows = order.rows(pos)
        assert ((rows >= 0) & (rows < 10**10)).all() and len(set(rows.tolist())) == 4


@pytest.mark.parametrize(
    ("shuffle", "window", "message"),
    [
        ("bogus", None, "unknown shuffle mode 'bogus'"),
        ("block", 0, "window must be an integer from 1 to"),
        ({"mode": "block", "windw": 3}, None, "unknown shuffle option"),
        (3.5, None, "shuffle must be"),
    ],
)
def test_bad_shuffle_specs(shuffle, window, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgumentError, match=message):
        ShuffleSpec.parse(shuffle, window)


def test_orders_are_the_same_in_other_processes() -> None:
    code = (
        "import numpy as np;from shardstream.order.read_order import EpochOrder, ShuffleSpec;"
        "print(EpochOrder('fp', [30, 7, 0, 19, 44], 5, 2, ShuffleSpec('block', 2)).rows_in_range(0, 100).tolist())"
    )
    same_output_in_processes(code)


@settings(max_examples=150, deadline=None)
@given(
    groups=layouts,
    mode=st.sampled_from(sorted(SHUFFLES)),
    window=st.integers(1, 5),
    seed=st.integers(0, 2**32),
    w=st.integers(1, 6),
    b=st.integers(1, 25),
    drop_last=st.booleans(),
)
def test_all_ranks_of_an_epoch_get_each_row_once(groups, mode, window, seed, w, b, drop_last) -> None:  # type: ignore[no-untyped-def]
    """The Mosaic-style invariant, end to end through the plan: steps x ranks x order."""
    from shardstream.order.read_order import StepLayout

    loc = RowLocator(groups)
    n = loc.num_rows
    order = EpochOrder("fp", loc.block_sizes, seed, 0, ShuffleSpec(mode, window))
    lay = StepLayout(n, 0, w, b, drop_last)
    rows = [
        int(x)
        for t in range(lay.num_steps)
        for r in range(w)
        for x in order.rows_in_range(*lay.rank_range(t, r))
    ]
    assert rows == order.rows_in_range(0, n - lay.dropped).tolist()  # the documented prefix
    assert len(set(rows)) == len(rows) and (drop_last or sorted(rows) == list(range(n)))
