"""Schedules through real servers (DESIGN §7): batch-size ramps × mixture phases × skip ranges × shuffle
modes, with a crash and a resume on another world size at a random step — the delivered samples are
exactly the plan's, every source epoch once, skipped samples counted and never delivered."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from shardstream.client import Loader
from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.order.curriculum import MixtureSchedule
from shardstream.order.delivery import make_selector
from shardstream.order.read_order import ShuffleSpec
from shardstream.order.schedule import Schedule, merge_ranges
from shardstream.order.scheduled_steps import make_layout, step_position
from shardstream.registry import Registry

from .support.data import N_ROWS
from .support.resume import Ranks, as_json, check_resume, ids

EPOCHS = 2


@dataclass(frozen=True)
class Case:
    """One random configuration: what every Loader of the job is given, and the two world sizes."""

    dataset: Any  # "toy@1" or mixture phases over toy@1 and toy@2
    batch: list[tuple[int, int]]
    skip_steps: list[tuple[int, int]]
    shuffle: str
    seed: int
    w1: int
    w2: int

    def loader(self, endpoints: list[str], rank: int, world: int) -> Loader:
        return Loader(
            endpoints,
            self.dataset,
            batch_size=self.batch,
            skip_steps=self.skip_steps,
            rank=rank,
            world_size=world,
            seed=self.seed,
            shuffle=self.shuffle,
            shuffle_window=3,
            epochs=EPOCHS,
            mixture_block=50,
        )


def random_case(i: int) -> Case:
    rng = random.Random(1000 + i)
    mixture = i % 2 == 1
    n = 2 * N_ROWS if mixture else N_ROWS
    total = EPOCHS * n
    starts = sorted(rng.sample(range(1, total), rng.randint(0, 3)))
    batch = [(0, rng.randint(3, 12))] + [(s, rng.randint(2, 20)) for s in starts]
    a = rng.randint(0, 30)
    skip = [(a, a + rng.randint(1, 12))] if rng.random() < 0.8 else []
    dataset: Any = "toy@1"
    if mixture:
        dataset = [(0, {"toy@1": 0.75, "toy@2": 0.25})]
        for start in sorted(rng.sample(range(100, total, 50), rng.randint(1, 3))):
            w = rng.choice(
                [{"toy@1": 0.2, "toy@2": 0.8}, {"toy@2": 1.0}, {"toy@1": 1.0}, {"toy@1": 0.5, "toy@2": 0.5}]
            )
            dataset.append((start, w))
    return Case(
        dataset,
        batch,
        skip,
        rng.choice(["none", "full", "block"]),
        rng.randint(0, 9),
        rng.randint(1, 3),
        rng.randint(1, 3),
    )


def plan_ids(data_root, case: Case) -> tuple[list[int], list[bool], int]:  # type: ignore[no-untyped-def]
    """(the ids at every position of the job's epochs, whether each is skipped, how many are), from the
    plan alone — the job delivers the unskipped ones in order (no drop_last: W does not matter)."""
    reg = Registry(data_root)
    spec = ShuffleSpec.parse(case.shuffle, 3)
    if isinstance(case.dataset, str):
        sel = make_selector([reg.resolve(case.dataset)], None, seed=case.seed, shuffle=spec)
    else:
        manifests = [reg.resolve("toy@1"), reg.resolve("toy@2")]
        phases = [(s, [w.get("toy@1", 0.0), w.get("toy@2", 0.0)]) for s, w in case.dataset]
        sel = make_selector(manifests, None, seed=case.seed, shuffle=spec, mixture_block=50, phases=phases)
    n = sel.num_rows
    base = Schedule.of(case.batch)
    where = {"num_rows": n, "world_size": case.w1, "schedule": base}
    skips = merge_ranges((step_position(a, **where), step_position(b, **where)) for a, b in case.skip_steps)
    sched = Schedule(base.batch, skips)
    stream: list[int] = []
    for epoch in range(EPOCHS):
        src, rows = sel.order.select(epoch, np.arange(n))
        stream += (rows + 10_000 * src).tolist()
    mask = [sched.skip_end(j) is not None for j in range(EPOCHS * n)]
    return stream, mask, sched.skipped_between(0, EPOCHS * n)


class Job(Ranks):
    """The job's W ranks; what rank 0 reported as skipped once the run is over, kept in `seen`."""

    def __init__(self, case: Case, endpoints: list[str], world: int, seen: list[int]) -> None:
        super().__init__(lambda rank: case.loader(endpoints, rank, world), world)
        self.seen = seen

    def __exit__(self, *exc: object) -> None:
        self.seen.append(self.loaders[0].skipped)
        super().__exit__(*exc)


def check_case(endpoints, data_root, case: Case) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(repr(case))
    seen: list[int] = []
    stream, mask, skipped = plan_ids(data_root, case)
    res = check_resume(
        lambda: Job(case, endpoints, case.w1, seen),
        cuts=lambda n: [rng.randrange(1, n)],
        remake=lambda: Job(case, endpoints, case.w2, seen),
        item=ids,
        flatten=True,
        checkpoint=as_json,
    )
    got = [i for step in res.full for i in step]
    assert got == [i for i, m in zip(stream, mask, strict=True) if not m], case  # skipped: never delivered
    assert seen[0] == skipped == sum(mask), (seen, skipped)  # ... and counted by the uninterrupted run
    # every source epoch exactly once: the samples of each source, delivered or skipped, in stream
    # order, are its epochs one after the other, each a permutation of the source's rows
    for source in (0, 1):
        mine = [i - 10_000 * source for i in stream if i // 10_000 == source]
        for k in range(len(mine) // N_ROWS):
            assert sorted(mine[k * N_ROWS : (k + 1) * N_ROWS]) == list(range(N_ROWS)), (source, k)
    # each step after the resume has W2 * B(J) samples unless clipped (an epoch's end, a skip range)
    k = res.cuts[1]
    for step in res.tails[k]:
        assert 0 < len(step) <= case.w2 * max(b for _, b in case.batch)


@pytest.mark.parametrize("i", range(10))
def test_random_schedules_resume_with_another_world_size(endpoints, data_root, i: int) -> None:  # type: ignore[no-untyped-def]
    check_case(endpoints, data_root, random_case(i))


@pytest.mark.slow
@pytest.mark.parametrize("i", range(10, 60))
def test_random_schedules_resume_with_another_world_size_more(endpoints, data_root, i: int) -> None:  # type: ignore[no-untyped-def]
    check_case(endpoints, data_root, random_case(i))


def test_batch_size_ramp_steps_and_len(endpoints) -> None:  # type: ignore[no-untyped-def]
    ramp = [(0, 8), (100, 16), (500, 32)]
    with Loader(endpoints, "toy@1", batch_size=ramp, rank=1, world_size=2, shuffle=False) as ld:
        sizes = [len(b["id"]) for b in ld]
        assert ld.batch_size == 8 and ld.schedule is not None and ld.schedule.batch == tuple(ramp)
    lay = make_layout(N_ROWS, 0, 2, 1, schedule=Schedule.of(ramp))
    assert sizes == [lay.rank_range(t, 1)[1] - lay.rank_range(t, 1)[0] for t in range(lay.num_steps)]
    assert sizes[:7] == [8] * 7 and sizes[7] == 16 and 32 in sizes  # step 7 starts at 112 >= 100


def test_skip_steps_are_counted_and_never_delivered(endpoints) -> None:  # type: ignore[no-untyped-def]
    with Loader(endpoints, "toy@1", batch_size=10, shuffle=False) as ld:
        plain = [b["id"].tolist() for b in ld]
    with Loader(endpoints, "toy@1", batch_size=10, shuffle=False, skip_steps=[(3, 5), (20, 21)]) as ld:
        got = [b["id"].tolist() for b in ld]
        assert ld.skipped == 30 and ld.state_dict()["schedule"]["skip"] == [
            {"steps": [3, 5], "positions": [30, 50]},
            {"steps": [20, 21], "positions": [200, 210]},
        ]
    assert got == plain[:3] + plain[5:20] + plain[21:]


def test_a_state_refuses_another_schedule_unless_told(endpoints) -> None:  # type: ignore[no-untyped-def]
    mix = [(0, {"toy@1": 0.5, "toy@2": 0.5}), (1000, {"toy@1": 0.9, "toy@2": 0.1})]
    with Loader(endpoints, mix, batch_size=[(0, 4), (40, 8)], skip_steps=[(2, 3)]) as ld:
        it = iter(ld)
        for _ in range(6):
            next(it)
        state = ld.state_dict()
        it.close()
    assert state["schedule"]["batch_size"] == [[0, 4], [40, 8]] and state["schedule"]["mixture"].startswith(
        "0="
    )
    with (
        Loader(endpoints, mix, batch_size=4) as ld,
        pytest.raises(InvalidArgumentError, match="batch-size schedule"),
    ):
        ld.load_state_dict(state)
    other = [(0, {"toy@1": 0.5, "toy@2": 0.5}), (2000, {"toy@1": 0.9, "toy@2": 0.1})]
    with Loader(endpoints, other, batch_size=[(0, 4), (40, 8)]) as ld:
        with pytest.raises(InvalidArgumentError, match="mixture schedule"):
            ld.load_state_dict(state)
        ld.load_state_dict(state, schedule="new")  # same sources: the new phases from the cursor on
        assert (ld.epoch, ld.offset) == (state["epoch"], state["offset"]) and ld.skipped == 4
        assert isinstance(ld.target.mixture, MixtureSchedule)
    with Loader(endpoints, mix, batch_size=[(0, 4), (40, 8)], skip_steps=[(1, 2)]) as ld:
        with pytest.raises(InvalidArgumentError, match=r"skip_steps \(1, 2\) starts before step 6"):
            ld.load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="increasing"):
        Loader(endpoints, "toy@1", batch_size=[(0, 4), (0, 8)])
    with pytest.raises(InvalidArgumentError, match="empty"):
        Loader(endpoints, "toy@1", batch_size=4, skip_steps=[(5, 5)])


def test_a_fleet_that_ignores_schedules_is_data_loss(endpoints, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a server that predates schedules ignores the fields: the client sees other positions and stops
    from shardstream.client.spec import ReadSpec

    real = ReadSpec.request

    def stripped(self, *args: Any, **kw: Any):  # type: ignore[no-untyped-def]
        req = real(self, *args, **kw)
        del req.skip[:]
        return req

    monkeypatch.setattr(ReadSpec, "request", stripped)
    with Loader(endpoints, "toy@1", batch_size=10, skip_steps=[(1, 2)], shuffle=False) as ld:
        with pytest.raises(DataLossError, match="up to date"):
            list(ld)


def test_cursor_skip_on_a_committed_job(endpoints, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = f"sqlite:///{tmp_path}/c.db"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable,
            "-m",
            "shardstream",
            "cursor",
            "skip",
            "--job",
            "spike",
            *args,
            "--store",
            store,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    with Loader(endpoints, "toy@1", batch_size=10, shuffle=False, job="spike", cursor_store=store) as ld:
        it = iter(ld)
        for _ in range(5):
            next(it)
        ld.commit(5, wait=True)
        it.close()
    r = cli("--steps", "3:9")
    assert r.returncode == 1 and "starts before step 5" in r.stderr and "Traceback" not in r.stderr
    r = cli("--steps", "7:9")
    assert r.returncode == 0 and "steps 7..8 will be skipped" in r.stdout, r.stderr
    assert "already" in cli("--steps", "7:9").stdout  # rerunning it changes nothing
    # resumed with another batch size: its steps 7 and 8 (of 5 samples each, from offset 50) are skipped
    with Loader(
        endpoints, "toy@1", batch_size=5, shuffle=False, job="spike", cursor_store=store, resume="latest"
    ) as ld:
        got = [i for b in ld for i in b["id"].tolist()]
        assert ld.skipped == 10
        assert ld.state_dict()["schedule"]["skip"] == [{"steps": [7, 9], "positions": [60, 70]}]
    assert got == list(range(50, 60)) + list(range(70, N_ROWS))


def test_inspect_understands_schedules(endpoints, data_root) -> None:  # type: ignore[no-untyped-def]
    mix = "0=toy@1:0.75,toy@2:0.25;600=toy@2:1"
    args = [
        "--batch-size",
        "0:8,300:20",
        "--skip",
        "96:144",
        "--world-size",
        "2",
        "--rank",
        "1",
        "--step",
        "20",
    ]
    args += ["--mixture-block", "50", "--seed", "4", "--epoch", "1", "--shuffle", "full", "--json"]
    r = subprocess.run(
        [sys.executable, "-m", "shardstream", "inspect", mix, *args, "--root", str(data_root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    assert planned["batch_size"] == 20 and planned["mixture_weights"] == {"toy@2": 1.0}
    assert planned["skipped_before"] == 48 and planned["job_position"] >= 2 * N_ROWS
    phases = [(0, {"toy@1": 0.75, "toy@2": 0.25}), (600, {"toy@2": 1.0})]
    with Loader(
        endpoints,
        phases,
        batch_size=[(0, 8), (300, 20)],
        skip_steps=[(6, 9)],  # steps 6..8 of 2 x 8 samples: job positions [96, 144)
        rank=1,
        world_size=2,
        seed=4,
        shuffle="full",
        mixture_block=50,
        epochs=2,
    ) as ld:
        ld.load_state_dict({**ld.state_dict(), "epoch": 1, "offset": 0})
        assert ld.schedule is not None and ld.schedule.skips == ((96, 144),)
        it = iter(ld)
        for _ in range(21):
            got = next(it)
    assert [s["id"] for s in planned["samples"]] == got["id"].tolist()
