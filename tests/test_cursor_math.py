"""Cursor arithmetic (shardstream/order/cursor_math.py) as properties: every sample exactly once, over data-loader
worker splits (within an epoch and across epochs), world sizes, batch sizes, drop_last and start offsets;
a cursor resumes exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import InvalidArgumentError
from shardstream.order.cursor_math import (
    NO_SPLIT,
    RankStream,
    WorkerSplit,
    cursor_after,
    epoch_start,
    is_last_step,
    split_offset,
)
from shardstream.order.read_order import StepLayout

from .support.splits import rank_steps, round_robin, worker_steps

cases = st.fixed_dictionaries(
    {
        "num_rows": st.integers(0, 400),
        "world_size": st.integers(1, 5),
        "batch_size": st.integers(1, 9),
        "drop_last": st.booleans(),
        "workers": st.integers(1, 4),
        "start_step": st.integers(0, 60),
        "epoch": st.integers(0, 3),
    }
)


def worker_walk(c: dict, worker: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(global range, cursor after it) of each step worker `worker` takes from the case's start."""
    gb = c["world_size"] * c["batch_size"]
    split = WorkerSplit(worker, c["workers"])
    start = min(c["start_step"] * gb, c["num_rows"])
    layout = StepLayout(
        c["num_rows"],
        split_offset(start, c["num_rows"], gb, worker),
        c["world_size"],
        c["batch_size"],
        c["drop_last"],
    )
    return [
        (layout.global_range(s), cursor_after(layout, c["epoch"], s, split))
        for s in range(0, layout.num_steps, c["workers"])
    ]


@settings(max_examples=400, deadline=None)
@given(cases)
def test_the_workers_of_a_rank_take_every_step_of_the_epoch_exactly_once(c: dict) -> None:
    gb = c["world_size"] * c["batch_size"]
    start = min(c["start_step"] * gb, c["num_rows"])
    whole = StepLayout(c["num_rows"], start, c["world_size"], c["batch_size"], c["drop_last"])
    expected = [whole.global_range(s) for s in range(whole.num_steps)]
    taken = [r for w in range(c["workers"]) for r, _ in worker_walk(c, w)]
    assert sorted(taken) == expected  # no step lost, none twice
    # worker j has step j, j+k, ...: DataLoader's round robin hands them over in the original order
    for w in range(c["workers"]):
        assert [r for r, _ in worker_walk(c, w)] == expected[w :: c["workers"]]


@settings(max_examples=400, deadline=None)
@given(cases, st.integers(1, 3))
def test_across_epochs_the_round_robin_of_the_workers_is_the_rank_stream_and_each_cursor_resumes_it(
    c: dict, more: int
) -> None:
    """Worker j takes steps j, j+k, ... of the stream counted across epochs (DataLoader's round robin
    then hands the steps over in the stream's order at every epoch boundary, whatever the steps per
    epoch), and a worker restarted from the cursor after any of its steps delivers exactly the rest."""
    stream = RankStream(c["num_rows"], c["world_size"], c["batch_size"], c["drop_last"])
    gb = c["world_size"] * c["batch_size"]
    cursor = (c["epoch"], min(c["start_step"] * gb, c["num_rows"]))
    epochs = c["epoch"] + more
    ref = rank_steps(stream, cursor, epochs)
    k = c["workers"]
    walks = [worker_steps(stream, cursor, w, k, epochs) for w in range(k)]
    assert [s[:2] for s in round_robin(walks)] == [s[:2] for s in ref]
    for w, walk in enumerate(walks):
        assert [s[:2] for s in walk] == [s[:2] for s in ref[w::k]]
        for i, (_, _, after) in enumerate(walk):
            rest = worker_steps(stream, after, w, k, epochs, split=False)
            assert [s[:2] for s in rest] == [s[:2] for s in walk[i + 1 :]], (w, i, after)


@settings(max_examples=300, deadline=None)
@given(cases, st.integers(0, 12))
def test_advance_is_the_nth_step_delivered(c: dict, n: int) -> None:
    stream = RankStream(c["num_rows"], c["world_size"], c["batch_size"], c["drop_last"])
    gb = c["world_size"] * c["batch_size"]
    cursor = (c["epoch"], min(c["start_step"] * gb, c["num_rows"]))
    ref = rank_steps(stream, cursor, c["epoch"] + 2 + n)
    got = stream.advance(*cursor, n)
    if ref[n:]:
        assert got == (ref[n][0], ref[n][1][0])
    else:  # epochs without steps
        assert got is None and stream.layout(0, 0).num_steps == 0


@settings(max_examples=200, deadline=None)
@given(cases)
def test_without_a_split_the_cursor_is_the_end_of_the_step_taken(c: dict) -> None:
    layout = StepLayout(c["num_rows"], 0, c["world_size"], c["batch_size"], c["drop_last"])
    for s in range(layout.num_steps):
        last = is_last_step(layout, s)
        assert last == (s == layout.num_steps - 1)
        expected = (c["epoch"] + 1, 0) if last else (c["epoch"], layout.offset_after(s))
        assert cursor_after(layout, c["epoch"], s, NO_SPLIT) == expected


def test_split_offset_moves_whole_global_steps_and_stops_at_the_epoch_end() -> None:
    assert split_offset(0, 100, 12, 0) == 0
    assert split_offset(24, 100, 12, 2) == 48
    assert split_offset(96, 100, 12, 1) == 100  # past the end: nothing left this epoch
    assert epoch_start(100, 12, WorkerSplit(3, 4)) == 36
    assert epoch_start(10, 12, WorkerSplit(1, 2)) == 10


@pytest.mark.parametrize(("worker", "workers"), [(0, 0), (1, 1), (-1, 2), (2, 2), (True, 2), (0, 1.5)])
def test_a_bad_split_is_one_clear_error(worker: object, workers: object) -> None:
    with pytest.raises(InvalidArgumentError, match="worker"):
        WorkerSplit(worker, workers)  # type: ignore[arg-type]
