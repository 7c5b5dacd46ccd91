"""Read-plan invariants over many random cases (pure: no servers)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import InvalidArgumentError
from shardstream.order.read_order import EpochOrder, RowLocator, ShuffleSpec, StepLayout
from shardstream.order.shuffle import SHUFFLES


def epoch_positions(n: int, offset: int, w: int, b: int, drop_last: bool) -> list[list[list[int]]]:
    """positions[step][rank] -> list of global positions."""
    lay = StepLayout(n, offset, w, b, drop_last)
    out = []
    for t in range(lay.num_steps):
        out.append([list(range(*lay.rank_range(t, r))) for r in range(w)])
    return out


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 500),
    w=st.integers(1, 9),
    b=st.integers(1, 40),
    drop_last=st.booleans(),
)
def test_steps_cover_the_epoch_exactly_once(n: int, w: int, b: int, drop_last: bool) -> None:
    steps = epoch_positions(n, 0, w, b, drop_last)
    flat = [p for step in steps for rank in step for p in rank]
    lay = StepLayout(n, 0, w, b, drop_last)
    if drop_last:
        assert flat == list(range(n - n % (w * b)))
        assert lay.dropped == n % (w * b)
    else:
        assert flat == list(range(n))
        assert lay.dropped == 0
    for t, step in enumerate(steps):
        sizes = [len(r) for r in step]
        if t < len(steps) - 1 or sum(sizes) == w * b:
            assert sizes == [b] * w  # full steps: rank r gets the r-th slice of B
        else:
            assert max(sizes) - min(sizes) <= 1  # the short last step is split evenly


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 600),
    w1=st.integers(1, 6),
    b1=st.integers(1, 30),
    w2=st.integers(1, 6),
    b2=st.integers(1, 30),
    w3=st.integers(1, 6),
    b3=st.integers(1, 30),
    data=st.data(),
)
def test_resume_with_other_world_and_batch_sizes_is_exact(n, w1, b1, w2, b2, w3, b3, data) -> None:  # type: ignore[no-untyped-def]
    # Two crashes: run (w1,b1) for k1 steps, resume as (w2,b2) for k2 steps, finish as (w3,b3).
    delivered: list[int] = []
    offset = 0
    for w, b, last in ((w1, b1, False), (w2, b2, False), (w3, b3, True)):
        lay = StepLayout(n, offset, w, b)
        k = lay.num_steps if last else data.draw(st.integers(0, lay.num_steps))
        for t in range(k):
            for r in range(w):
                delivered.extend(range(*lay.rank_range(t, r)))
        offset = lay.offset_after(k - 1) if k else offset
    assert delivered == list(range(n))


def test_all_ranks_take_the_same_number_of_steps_even_when_a_rank_gets_nothing() -> None:
    lay = StepLayout(5, 0, 4, 4)
    assert lay.num_steps == 1
    assert [lay.rank_range(0, r) for r in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 5)]
    lay = StepLayout(2, 0, 4, 4)
    assert [lay.rank_range(0, r) for r in range(4)] == [(0, 0), (0, 1), (1, 1), (1, 2)]


@pytest.mark.parametrize(
    "bad", [dict(world_size=0), dict(batch_size=0), dict(start_offset=11), dict(start_offset=-1)]
)
def test_layout_validates(bad: dict[str, int]) -> None:
    kwargs = dict(num_rows=10, start_offset=0, world_size=2, batch_size=3) | bad
    with pytest.raises(InvalidArgumentError):
        StepLayout(**kwargs)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 2000),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 1000),
    mode=st.sampled_from(sorted(SHUFFLES)),
)
def test_epoch_order_is_a_permutation(n: int, seed: int, epoch: int, mode: str) -> None:
    rows = EpochOrder("fp", n, seed, epoch, mode).rows_in_range(0, n)
    assert np.array_equal(np.sort(rows), np.arange(n))


def test_order_depends_on_seed_epoch_fingerprint_only() -> None:
    base = EpochOrder("fp", 500, 1, 0, "full").rows_in_range(0, 500)
    assert np.array_equal(base, EpochOrder("fp", 500, 1, 0, "full").rows_in_range(0, 500))
    for other in (
        EpochOrder("fp", 500, 2, 0, "full"),
        EpochOrder("fp", 500, 1, 1, "full"),
        EpochOrder("fp2", 500, 1, 0, "full"),
    ):
        assert not np.array_equal(base, other.rows_in_range(0, 500))
    assert np.array_equal(EpochOrder("fp", 500, 1, 0, "none").rows_in_range(0, 500), np.arange(500))


def test_order_lookup_is_pointwise() -> None:
    order = EpochOrder("fp", 10**10, 7, 3, "full")
    whole = order.rows(np.array([5, 10**10 - 1, 42]))
    assert order.rows(np.array([42]))[0] == whole[2]


def test_parse_shuffle() -> None:
    assert ShuffleSpec.parse(True).mode == "block"
    assert ShuffleSpec.parse(False).mode == "none"
    assert ShuffleSpec.parse("none").mode == "none"
    with pytest.raises(InvalidArgumentError, match="unknown shuffle mode 'bogus'"):
        ShuffleSpec.parse("bogus")


@settings(max_examples=100, deadline=None)
@given(groups=st.lists(st.lists(st.integers(0, 7), max_size=5), max_size=6))
def test_row_locator_matches_brute_force(groups: list[list[int]]) -> None:
    expect = []
    for s, gs in enumerate(groups):
        row = 0
        for g, size in enumerate(gs):
            for i in range(size):
                expect.append((s, row, g, i))
                row += 1
    loc = RowLocator(groups)
    assert loc.num_rows == len(expect)
    got = loc.locate(np.arange(len(expect)))
    assert list(zip(*(a.tolist() for a in got), strict=True)) == expect
