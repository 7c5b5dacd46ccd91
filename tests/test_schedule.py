"""Batch-size schedules and skip ranges (shardstream/order/schedule.py, scheduled_layout.py): properties over
many random schedules, world sizes, epochs and crash points, against a step-by-step reference (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import InvalidArgumentError
from shardstream.order.cursor_math import RankStream, cursor_after
from shardstream.order.read_order import StepLayout
from shardstream.order.schedule import Schedule, job_position, merge_ranges, parse_batch_schedule
from shardstream.order.scheduled_steps import ScheduledLayout, make_layout, step_position

from .support.splits import rank_steps, round_robin, worker_steps


# --- a reference: the definition, one step at a time, over plain lists ----------------------------
def ref_batch(phases: list[tuple[int, int]], j: int) -> int:
    return [b for s, b in phases if s <= j][-1]


def ref_skipped(skips: list[tuple[int, int]], j: int) -> bool:
    return any(a <= j < b for a, b in skips)


def ref_epoch(n: int, start: int, w: int, phases, skips, epoch: int, drop_last: bool):  # type: ignore[no-untyped-def]
    """[(start, end, B)] of the epoch's steps from `start`, and the samples drop_last left out."""
    base = epoch * n
    steps = []
    o = start
    while o < n:
        if ref_skipped(skips, base + o):
            o += 1
            continue
        b = ref_batch(phases, base + o)
        e = o
        while e < min(n, o + w * b) and not ref_skipped(skips, base + e):
            e += 1
        steps.append((o, e, b))
        o = e
    dropped = 0
    if drop_last and steps and steps[-1][1] - steps[-1][0] < w * steps[-1][2]:
        dropped = steps[-1][1] - steps[-1][0]
        steps.pop()
    return steps, dropped


phases_st = st.lists(st.tuples(st.integers(1, 400), st.integers(1, 9)), max_size=4).map(
    lambda ps: [(0, 3)] + sorted({s: b for s, b in ps}.items())
)
skips_st = st.lists(st.tuples(st.integers(0, 400), st.integers(1, 60)), max_size=4).map(
    lambda rs: [(a, a + d) for a, d in rs]
)


@settings(max_examples=400, deadline=None)
@given(
    n=st.integers(1, 160),
    w=st.integers(1, 5),
    phases=phases_st,
    skips=skips_st,
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_layout_is_the_definition(n, w, phases, skips, epoch, drop_last, data) -> None:  # type: ignore[no-untyped-def]
    sched = Schedule(tuple(phases), merge_ranges(skips))
    start = data.draw(st.integers(0, n))
    lay = make_layout(n, start, w, 1, drop_last, epoch=epoch, schedule=sched)
    steps, dropped = ref_epoch(n, start, w, phases, skips, epoch, drop_last)
    assert lay.num_steps == len(steps)
    assert lay.dropped == dropped
    for t, (s, e, b) in enumerate(steps):
        assert lay.global_range(t) == (s, e)
        ranks = [lay.rank_range(t, r) for r in range(w)]
        assert ranks[0][0] == s and ranks[-1][1] == e
        assert all(ranks[r][1] == ranks[r + 1][0] for r in range(w - 1))  # contiguous slices in rank order
        if e - s == w * b:
            assert all(hi - lo == b for lo, hi in ranks)
        else:
            assert max(hi - lo for lo, hi in ranks) - min(hi - lo for lo, hi in ranks) <= 1
        # memoryless: a layout from this step's start is the rest of this one
        if t in (1, len(steps) - 1):
            rest = make_layout(n, s, w, 1, drop_last, epoch=epoch, schedule=sched)
            assert [rest.global_range(i) for i in range(rest.num_steps)] == [
                lay.global_range(i) for i in range(t, lay.num_steps)
            ]


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 300),
    w=st.integers(1, 6),
    b=st.integers(1, 20),
    start=st.integers(0, 300),
    drop=st.booleans(),
)
def test_a_plain_schedule_is_todays_step_layout(n: int, w: int, b: int, start: int, drop: bool) -> None:
    start = min(start, n)
    lay = make_layout(n, start, w, 99, drop, epoch=5, schedule=Schedule.of(b))
    assert isinstance(lay, StepLayout) and lay == StepLayout(n, start, w, b, drop)
    # ... and the scheduled code path computes the same steps when forced
    sched = ScheduledLayout(n, start, w, Schedule.of(b), epoch=5, drop_last=drop)
    assert sched.num_steps == lay.num_steps and sched.dropped == lay.dropped
    for t in range(lay.num_steps):
        assert sched.global_range(t) == lay.global_range(t)
        assert [sched.rank_range(t, r) for r in range(w)] == [lay.rank_range(t, r) for r in range(w)]


def job_positions(n, w, sched, drop_last, epochs, cursor=(0, 0), steps=None):  # type: ignore[no-untyped-def]
    """The positions a job delivers from `cursor` to the end of `epochs`, step by step: (list of
    job-position lists per step, the cursor after each step)."""
    out, cursors = [], []
    e, off = cursor
    while e < epochs and (steps is None or len(out) < steps):
        lay = make_layout(n, off, w, 1, drop_last, epoch=e, schedule=sched)
        if lay.num_steps == 0:
            e, off = e + 1, (lay.next_epoch_start(0) if isinstance(lay, ScheduledLayout) else 0)
            continue
        for t in range(lay.num_steps):
            lo, hi = lay.global_range(t)
            out.append([job_position(e, p, n) for p in range(lo, hi)])
            cursors.append(cursor_after(lay, e, t))
            if steps is not None and len(out) == steps:
                break
        e, off = cursors[-1]
    return out, cursors


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 120),
    w1=st.integers(1, 5),
    w2=st.integers(1, 5),
    phases=phases_st,
    skips=skips_st,
    drop_last=st.booleans(),
    data=st.data(),
)
def test_resume_with_another_world_size_mid_ramp_is_exact(n, w1, w2, phases, skips, drop_last, data) -> None:  # type: ignore[no-untyped-def]
    sched = Schedule(tuple(phases), merge_ranges(skips))
    epochs = 3
    full, _ = job_positions(n, w1, sched, drop_last, epochs)
    flat = [p for s in full for p in s]
    if not drop_last:  # every position exactly once, except the skipped ones
        assert flat == [j for j in range(epochs * n) if not ref_skipped(skips, j)]
    # crash after k steps of w1, resume at the cursor with w2: the same samples in the same order
    k = data.draw(st.integers(0, len(full)))
    head, cursors = job_positions(n, w1, sched, drop_last, epochs, steps=k)
    cursor = cursors[-1] if k else (0, 0)
    tail, _ = job_positions(n, w2, sched, drop_last, epochs, cursor=cursor)
    got = [p for s in head + tail for p in s]
    if w1 == w2 or not drop_last:  # (drop_last drops the last short step, which depends on W)
        assert got == flat
    assert len(set(got)) == len(got)
    assert not any(ref_skipped(skips, j) for j in got)
    # every step after the crash starts where its batch size says: W2 * B(J) samples unless clipped
    for s in tail:
        b = ref_batch(phases, s[0])
        assert len(s) <= w2 * b


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 90),
    w=st.integers(1, 4),
    workers=st.integers(1, 4),
    phases=phases_st,
    skips=skips_st,
    drop_last=st.booleans(),
    start=st.integers(0, 90),
)
def test_worker_splits_take_every_kth_step_across_epochs(
    n, w, workers, phases, skips, drop_last, start
) -> None:  # type: ignore[no-untyped-def]
    """Under batch-size phases and skip ranges too: the workers' round robin is the rank's stream
    (epochs 1..3, from any cursor), and each worker cursor resumes exactly the rest of its steps."""
    sched = Schedule(tuple(phases), merge_ranges(skips))
    stream = RankStream(n, w, phases[0][1], drop_last, None if sched.is_plain else sched)
    cursor = (1, min(start, n))
    ref = rank_steps(stream, cursor, 4)
    walks = [worker_steps(stream, cursor, j, workers, 4) for j in range(workers)]
    assert [s[:2] for s in round_robin(walks)] == [s[:2] for s in ref]
    for j, walk in enumerate(walks):
        for i, (_, _, after) in enumerate(walk):
            rest = worker_steps(stream, after, j, workers, 4, split=False)
            assert [s[:2] for s in rest] == [s[:2] for s in walk[i + 1 :]]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 60),
    w=st.integers(1, 4),
    phases=phases_st,
    skips=skips_st,
    drop_last=st.booleans(),
    data=st.data(),
)
def test_step_position_counts_delivered_steps_without_replay(n, w, phases, skips, drop_last, data) -> None:  # type: ignore[no-untyped-def]
    sched = Schedule(tuple(phases), merge_ranges(skips))
    full, cursors = job_positions(n, w, sched, drop_last, 30)
    if len(full) < 2:
        return
    done = data.draw(st.integers(0, len(full) - 1))
    cursor = cursors[done - 1] if done else (0, 0)
    for t in sorted({done, len(full) - 1, data.draw(st.integers(done, len(full) - 1))}):
        got = step_position(
            t,
            num_rows=n,
            world_size=w,
            schedule=sched,
            drop_last=drop_last,
            epoch=cursor[0],
            offset=cursor[1],
            steps_done=done,
        )
        assert got == full[t][0]


def test_step_position_jumps_identical_epochs() -> None:
    # a phase at 10^12 in epochs of 1009 samples: ~10^9 epochs are jumped by division
    sched = Schedule(((0, 4), (10**12, 8)), ((5 * 10**12, 5 * 10**12 + 100),))
    per_epoch = -(-1009 // 8)
    t = per_epoch * 10**10
    assert step_position(t, num_rows=1009, world_size=2, schedule=sched) > 10**12
    with pytest.raises(InvalidArgumentError, match="never comes"):
        step_position(5, num_rows=10, world_size=4, schedule=Schedule.of([(0, 2), (1, 3)]), drop_last=True)


@settings(max_examples=200, deadline=None)
@given(skips=skips_st, a=st.integers(0, 500), d=st.integers(0, 500))
def test_skipped_between_counts_the_skipped_positions(skips, a: int, d: int) -> None:  # type: ignore[no-untyped-def]
    sched = Schedule(((0, 1),), merge_ranges(skips))
    assert sched.skipped_between(a, a + d) == sum(ref_skipped(skips, j) for j in range(a, a + d))


def test_parsing_and_errors() -> None:
    assert parse_batch_schedule(8) == ((0, 8),)
    assert parse_batch_schedule("0:8,1000000:16") == ((0, 8), (1_000_000, 16))
    assert parse_batch_schedule([(0, 8), (1_000_000, 16)]) == ((0, 8), (1_000_000, 16))
    for bad, match in (
        (0, "from 1 to"),
        ([(5, 8)], "start at offset 0"),
        ([(0, 8), (0, 16)], "increasing"),
        ([(0, 8), (10, 0)], "from 1 to"),
        ("0:8,x", "OFFSET:BATCH_SIZE"),
        ("0:8,10:²", "OFFSET:BATCH_SIZE"),
        ([], "schedule"),
        (True, "from 1 to"),
    ):
        with pytest.raises(InvalidArgumentError, match=match):
            parse_batch_schedule(bad)
    assert merge_ranges([(5, 9), (0, 2), (2, 3), (8, 12)]) == ((0, 3), (5, 12))
    with pytest.raises(InvalidArgumentError):
        Schedule(((0, 2),), ((3, 1),))
