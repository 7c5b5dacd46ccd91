"""The autoscaling rules of a local fleet (server/serving/autoscale.py), as properties over signals
and over a simulated fleet: bounds hold, a steady signal never flaps, a sustained stall grows the
fleet, and demand that halves shrinks it without stalling the trainers."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shardstream.server.serving import worker_scaling
from shardstream.server.serving.autoscale import (
    REASONS,
    SATURATED_CPU,
    AutoscalePolicy,
    AutoscaleState,
    Decision,
    Signal,
    decide,
)
from shardstream.server.serving.worker_scaling import WorkerScaler, cpu_seconds

CAPACITY = 100.0  # samples/s one simulated worker sends at most


@st.composite
def policies(draw: st.DrawFn) -> AutoscalePolicy:
    low = draw(st.integers(1, 4))
    return AutoscalePolicy(
        min_workers=low,
        max_workers=draw(st.integers(low, 12)),
        stall_target=draw(st.sampled_from([0.0, 0.02, 0.05, 0.2])),
        up_ticks=draw(st.integers(1, 5)),
        down_ticks=draw(st.integers(1, 30)),
        cooldown_ticks=draw(st.integers(0, 8)),
        headroom=draw(st.sampled_from([0.5, 0.8, 1.0])),
    )


signals = st.builds(
    Signal,
    stall=st.floats(0, 1),
    consumption=st.floats(0, 1e6),
    ranks=st.integers(0, 1000),
    sent=st.floats(0, 1e6),
)


def fleet_signal(workers: int, demand: float, ranks: int = 8) -> Signal:
    """A simulated fleet: each worker sends CAPACITY at most; the trainers wait for what it lacks."""
    sent = min(demand, workers * CAPACITY)
    stall = max(0.0, 1 - workers * CAPACITY / demand) if demand else 0.0
    return Signal(stall=stall, consumption=sent, ranks=ranks, sent=sent)


def run(policy: AutoscalePolicy, workers: int, demands: list[float], state: AutoscaleState | None = None) -> tuple[list[Decision], AutoscaleState]:
    state = state or AutoscaleState()
    decisions = []
    for demand in demands:
        d, state = decide(policy, state, fleet_signal(workers, demand), workers)
        decisions.append(d)
        workers = d.workers
    return decisions, state


@settings(max_examples=300, deadline=None)
@given(policies(), st.lists(signals, min_size=1, max_size=60), st.integers(0, 20))
def test_the_count_stays_within_the_bounds_and_moves_one_at_a_time(policy: AutoscalePolicy, seq: list[Signal], start: int) -> None:
    workers, state = start, AutoscaleState()
    for s in seq:
        d, state = decide(policy, state, s, workers)
        assert policy.min_workers <= d.workers <= policy.max_workers
        if policy.min_workers <= workers <= policy.max_workers:
            assert abs(d.workers - workers) <= 1
        if d.workers != workers:
            assert d.reason in REASONS
        workers = d.workers


@settings(max_examples=200, deadline=None)
@given(policies(), signals, st.integers(1, 12))
def test_a_steady_signal_never_flaps(policy: AutoscalePolicy, s: Signal, start: int) -> None:
    """Whatever the signal, held steady it moves the count one way only (no up-then-down)."""
    workers, state = max(policy.min_workers, min(start, policy.max_workers)), AutoscaleState()
    directions = set()
    for _ in range(200):
        d, state = decide(policy, state, s, workers)
        if d.workers != workers:
            directions.add(d.workers > workers)
        workers = d.workers
    assert len(directions) <= 1


@settings(max_examples=200, deadline=None)
@given(policies(), st.floats(1.0, 20.0))
def test_a_simulated_fleet_grows_under_stall_then_holds(policy: AutoscalePolicy, load: float) -> None:
    """Trainers that want `load` workers' worth: the fleet grows until they stop stalling (or to the
    most), then never shrinks or flaps on that same demand."""
    demand = load * CAPACITY
    decisions, _ = run(policy, policy.min_workers, [demand] * 400)
    counts = [d.workers for d in decisions]
    assert counts == sorted(counts)  # up only
    final = counts[-1]
    assert fleet_signal(final, demand).stall <= policy.stall_target or final == policy.max_workers


@settings(max_examples=200, deadline=None)
@given(policies(), st.floats(2.0, 12.0))
def test_a_simulated_fleet_shrinks_when_demand_halves_without_stalling(policy: AutoscalePolicy, load: float) -> None:
    demand = load * CAPACITY
    first, state = run(policy, policy.min_workers, [demand] * 400)
    grown = first[-1].workers
    second, _ = run(policy, grown, [demand / 2] * 600, state)
    counts = [d.workers for d in second]
    assert counts == sorted(counts, reverse=True)  # down only
    final = counts[-1]
    assert fleet_signal(final, demand / 2).stall <= policy.stall_target or final == policy.max_workers
    # it shrank as far as the headroom allows: one worker fewer would run busier than the headroom
    if final > policy.min_workers and fleet_signal(final, demand / 2).stall <= policy.stall_target:
        assert demand / 2 > (final - 1) * CAPACITY * policy.headroom - 1e-6
    # ... and it did shrink when it grew (so learned a worker's capacity) and one fewer has the headroom
    if grown > policy.min_workers and demand / 2 <= (grown - 1) * CAPACITY * policy.headroom - 1e-6:
        assert final < grown


def test_the_default_rules_on_a_saturated_fleet_learn_its_capacity() -> None:
    policy = AutoscalePolicy(min_workers=1, max_workers=4)
    decisions, state = run(policy, 1, [300.0] * 100)
    assert decisions[-1].workers == 3 and state.capacity == pytest.approx(CAPACITY)
    grew = [d for d in decisions if d.reason == "stall_above_target"]
    assert len(grew) == 2 and "stall" in grew[0].why


def test_the_busiest_worker_says_the_capacity_when_the_load_is_uneven() -> None:
    """Ranks pinned to one of two workers: the mean per worker is half a worker's capacity, the busiest
    worker's rate is all of it (and demand that one worker carries with headroom shrinks the fleet)."""
    policy = AutoscalePolicy(min_workers=1, max_workers=2, down_ticks=2, cooldown_ticks=0)
    stalled = Signal(stall=0.5, consumption=100.0, ranks=8, sent=100.0, busiest=100.0)
    _, state = decide(policy, AutoscaleState(), stalled, 2)
    assert state.capacity == 100.0  # not 50
    calm = Signal(stall=0.0, consumption=70.0, ranks=4, sent=70.0, busiest=70.0)
    d1, state = decide(policy, state, calm, 2)
    d2, _ = decide(policy, state, calm, 2)
    assert (d1.workers, d2.workers, d2.reason) == (2, 1, "capacity_to_spare")


def test_no_reports_hold_the_count() -> None:
    policy = AutoscalePolicy(min_workers=1, max_workers=4, down_ticks=1, cooldown_ticks=0)
    d, _ = decide(policy, AutoscaleState(capacity=100.0), Signal(stall=0.0, consumption=0.0, ranks=0, sent=0.0), 3)
    assert (d.workers, d.reason) == (3, "no_reports")


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"min_workers": 0}, "min_workers"),
        ({"min_workers": 3, "max_workers": 2}, "max_workers"),
        ({"stall_target": 1.5}, "stall_target"),
        ({"up_ticks": 0}, "up_ticks"),
        ({"headroom": 0}, "headroom"),
    ],
)
def test_a_bad_policy_is_one_value_error(kw: dict[str, float], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        AutoscalePolicy(**kw)  # type: ignore[arg-type]


def test_a_stall_with_cpu_to_spare_is_not_taken_for_the_workers_capacity() -> None:
    """A stall while the busiest worker has CPU to spare is latency (a stream's first message, an epoch
    boundary, a move): what the workers sent then is no measure of what they can send. Taken for it,
    a fleet whose demand halved would learn half its capacity and never shrink."""
    policy = AutoscalePolicy(min_workers=1, max_workers=2, down_ticks=3, cooldown_ticks=0)
    learned = AutoscaleState(capacity=300.0)  # one worker, saturated, sent 300/s
    # half the ranks left: 2 workers send 200/s between them, one a second of stall at a stream's start
    blip = Signal(stall=0.2, consumption=200.0, ranks=4, sent=200.0, busiest=100.0, busy=0.35)
    d, state = decide(policy, learned, blip, 2)
    assert state.capacity == 300.0 and d.workers == 2 and "CPU 35%" in d.why
    calm = Signal(stall=0.0, consumption=200.0, ranks=4, sent=200.0, busiest=100.0, busy=0.35)
    counts = []
    for _ in range(policy.down_ticks):
        d, state = decide(policy, state, calm, 2)
        counts.append(d.workers)
    assert counts[-1] == 1 and d.reason == "capacity_to_spare"  # 200 <= 300 x 0.8
    # the same stall with the workers' CPU saturated: what they sent is their capacity
    busy = replace(blip, busy=SATURATED_CPU)
    _, state = decide(policy, learned, busy, 2)
    assert state.capacity == 100.0
    _, state = decide(policy, learned, replace(blip, busy=None), 2)  # not known: a stall is saturation
    assert state.capacity == 100.0


class _FakeProcs:
    """CPU seconds of fake processes, and a clock, as the scaler reads them."""

    def __init__(self) -> None:
        self.t = 0.0
        self.cpu: dict[int, float] = {}

    def read(self, pid: int) -> float | None:
        return self.cpu.get(pid)


def test_the_scaler_reads_the_busiest_workers_cpu_between_two_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    procs = _FakeProcs()
    scaler = WorkerScaler(AutoscalePolicy(max_workers=4), tmp_path, CollectorRegistry(), cpu_read=procs.read, clock=lambda: procs.t)
    seen: list[float | None] = []

    def spy(policy: AutoscalePolicy, state: AutoscaleState, signal: Signal, workers: int) -> tuple[Decision, AutoscaleState]:
        seen.append(signal.busy)
        return decide(policy, state, signal, workers)

    monkeypatch.setattr(worker_scaling, "decide", spy)
    procs.cpu = {10: 5.0, 11: 1.0}
    scaler.evaluate(2, [10, 11])  # a first reading: nothing to compare with
    procs.t, procs.cpu = 2.0, {10: 6.9, 11: 1.2}
    scaler.evaluate(2, [10, 11])  # 1.9 s of CPU in 2 s: 95 %
    procs.t, procs.cpu = 3.0, {10: 7.5, 11: 1.4, 12: 0.1}
    scaler.evaluate(3, [10, 11, 12], cpus_each=2.0)  # 0.6 s in 1 s of 2 CPUs; 12 just started
    procs.t, procs.cpu = 4.0, {11: 1.5}
    scaler.evaluate(1, [10, 11])  # 10 is gone: 11's 10 %
    procs.t = 5.0
    scaler.evaluate(1, [])  # no pids: not known
    assert seen[0] is None and seen[-1] is None
    assert seen[1:4] == [pytest.approx(0.95), pytest.approx(0.3), pytest.approx(0.1)]


def test_cpu_seconds_are_a_live_processes_and_none_for_a_gone_one() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    for _ in range(100_000):  # work until the CPU clock ticks over (10 ms)
        if cpu_seconds(os.getpid()) != before:
            break
        sum(range(10_000))
    assert cpu_seconds(os.getpid()) > before  # type: ignore[operator]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert cpu_seconds(gone.pid) is None
