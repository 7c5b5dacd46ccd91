"""Cursor arithmetic (shardstream/cursor_math.py) as properties: every sample exactly once, over data-loader
worker splits, world sizes, batch sizes, drop_last and start offsets; a cursor resumes exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.cursor_math import (
    NO_SPLIT,
    WorkerSplit,
    cursor_after,
    epoch_start,
    is_last_step,
    split_offset,
)
from shardstream.errors import InvalidArgumentError
from shardstream.plan import StepLayout

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
@given(cases)
def test_a_cursor_resumes_at_exactly_the_next_step_of_its_worker(c: dict) -> None:
    for w in range(c["workers"]):
        split = WorkerSplit(w, c["workers"])
        walk = worker_walk(c, w)
        for i, (_, (epoch, offset)) in enumerate(walk):
            if i + 1 < len(walk):  # mid-epoch: the next layout's first step is the worker's next step
                assert epoch == c["epoch"]
                resumed = StepLayout(c["num_rows"], offset, c["world_size"], c["batch_size"], c["drop_last"])
                assert resumed.num_steps > 0 and resumed.global_range(0) == walk[i + 1][0]
            else:  # the worker's last step: the cursor is its start of the next epoch
                gb = c["world_size"] * c["batch_size"]
                assert (epoch, offset) == (c["epoch"] + 1, epoch_start(c["num_rows"], gb, split))
        offsets = [off for _, (e, off) in walk if e == c["epoch"]]
        assert offsets == sorted(set(offsets))  # strictly forward


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
