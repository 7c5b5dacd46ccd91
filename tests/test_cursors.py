"""Job cursors keyed by checkpoint step: stores, commit, resume, failures — real Redis, real servers."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardstream.client import Loader
from shardstream.client.cursors.records import CursorRecord
from shardstream.client.cursors.stores import MemoryStore, SqliteStore, open_store
from shardstream.client.loader_state import LoaderState
from shardstream.errors import (
    CorruptCursorError,
    FailedPreconditionError,
    InvalidArgumentError,
    NoCommittedStepError,
    UnavailableError,
)

from .support.data import N_ROWS
from .support.rank_worker import RankProcs, steps_logged
from .support.resume import CommittingRanks, check_resume, ids


def test_store_contract(store_url: str) -> None:
    store = open_store(store_url)
    try:
        assert store.write("j", 10, "k", 0, 3, b"r0") is False
        assert store.write("j", 10, "k", 2, 3, b"r2") is False
        assert store.committed("j") == [] and store.read("j", 10) == {}
        assert store.write("j", 10, "k", 2, 3, b"r2-again") is False  # idempotent overwrite, still 2 of 3
        assert store.write("j", 10, "k", 1, 3, b"r1") is True
        assert store.write("j", 20, "k", 0, 3, b"x") is False
        assert store.committed("j") == [10]
        assert store.read("j", 10) == {0: b"r0", 1: b"r1", 2: b"r2-again"}
        assert store.steps("j") == {10: 3, 20: 1}
        assert store.write("other", 1, "k", 0, 1, b"y") is True
        assert store.jobs() == ["j", "other"]
    finally:
        store.close()


def test_records_of_an_earlier_run_never_complete_a_later_runs_step(store_url: str) -> None:
    """A rank of run A wrote step 32 and died before its peer; run B (3 ranks) reaches step 32 with
    another cursor: A's leftover must not count as one of B's ranks, and B's records win."""
    store = open_store(store_url)
    try:
        assert store.write("j", 32, "runA", 1, 2, b"A1") is False
        assert store.write("j", 32, "runB", 0, 3, b"B0") is False
        assert store.write("j", 32, "runB", 2, 3, b"B2") is False  # A's rank-1 record does not make 3
        assert store.committed("j") == []
        assert store.write("j", 32, "runB", 1, 3, b"B1") is True
        assert store.read("j", 32) == {0: b"B0", 1: b"B1", 2: b"B2"}
        assert store.write("j", 32, "runA", 0, 2, b"A0") is True  # the last run to complete a step wins
        assert store.read("j", 32) == {0: b"A0", 1: b"A1"}
    finally:
        store.close()


def test_sqlite_store_is_shared_across_instances(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    a, b = SqliteStore(url), SqliteStore(url)
    a.write("j", 1, "k", 0, 2, b"a")
    b.write("j", 1, "k", 1, 2, b"b")
    assert a.committed("j") == [1] == b.committed("j")
    a.close()
    b.close()


def test_ranks_opening_one_new_sqlite_store_at_once_all_get_it(tmp_path: Path) -> None:
    """8 rank processes open one new file at the same moment, 50 times (a new file each): none is
    told "database is locked" (switching a file to WAL took it exclusively, and SQLite refuses a
    would-be deadlock at once: 4 processes failed 5 rounds of 60), and every rank's record is there."""
    import multiprocessing

    from .support.sqlite_openers import open_together

    world, rounds = 8, 50
    urls = [f"sqlite:///{tmp_path}/c{i}.db" for i in range(rounds)]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(world), ctx.Queue()
    procs = [ctx.Process(target=open_together, args=(urls, r, world, barrier, results)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=120) for _ in range(world * rounds)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [o for o in outcomes if o[2] is not None] == []
    for url in urls:
        store = SqliteStore(url)
        try:
            assert store.committed("j") == [1]
            assert store.read("j", 1) == {r: b"r%d" % r for r in range(world)}
        finally:
            store.close()


@pytest.mark.parametrize("bad", ["ftp://x", "sqlite://", "postgres://db"])
def test_unknown_store_urls(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        open_store(bad)


def consume(
    endpoints,
    *,
    job: str,
    store: str,
    world: int,
    batch: int,
    steps: int | None,
    commit_every: int,
    resume=None,
    seed: int = 0,
    dataset: str = "toy@1",
):  # type: ignore[no-untyped-def]
    """Every rank runs `steps` steps (None: to the end), committing every `commit_every` steps.
    Returns ids[rank][step]."""
    out = []
    for rank in range(world):
        with Loader(
            endpoints,
            dataset,
            batch_size=batch,
            rank=rank,
            world_size=world,
            seed=seed,
            job=job,
            cursor_store=store,
            resume=resume,
        ) as ld:
            got = []
            for i, b in enumerate(ld):
                got.append(b["id"].tolist())
                if (i + 1) % commit_every == 0:
                    ld.commit(i + 1 + (ld.resumed_from or 0))
                    ld.flush_commits()  # each checkpoint lands before the next (no coalescing)
                if steps is not None and i + 1 == steps:
                    break
            ld.flush_commits()
            out.append(got)
    return out


def flat(per_rank: list[list[list[int]]]) -> list[int]:
    return [i for t in range(len(per_rank[0])) for r in per_rank for i in r[t]]


@pytest.mark.parametrize("case", range(5))
def test_crash_after_commits_resumes_exactly_at_the_committed_step(
    endpoints, store_url: str, case: int
) -> None:
    rng = random.Random(case)
    w1, b1, w2, b2 = rng.choice([2, 4]), rng.choice([8, 20]), rng.choice([1, 3]), rng.choice([5, 16])
    every = rng.choice([3, 5])
    total = -(-N_ROWS // (w1 * b1))
    crash_at = rng.randrange(every, total - 1)  # the ranks die here, some steps after their last commit
    committed_step = (crash_at // every) * every  # the model checkpoint is at committed_step
    runs = itertools.count()

    def job() -> CommittingRanks:
        name = f"job{case}-{next(runs)}"  # each run a job of its own
        return CommittingRanks(
            lambda rank: Loader(
                endpoints,
                "toy@1",
                batch_size=b1,
                rank=rank,
                world_size=w1,
                seed=0,
                job=name,
                cursor_store=store_url,
            ),
            w1,
            commit_every=every,
        )

    def restarted(state: dict) -> CommittingRanks:  # type: ignore[type-arg]
        return CommittingRanks(
            lambda rank: Loader(
                endpoints,
                "toy@1",
                batch_size=b2,
                rank=rank,
                world_size=w2,
                seed=0,
                job=state["job"],
                cursor_store=store_url,
                resume="latest",
                resume_min_step=state["step"],  # the model checkpoint's step: the store is not behind it
            ),
            w2,
            commit_every=10**9,
            resumed_from=state["step"],  # exactly the committed step
        )

    # Commits every `every` steps, dies `crash_at - committed_step` steps after the last one, and
    # resumes "latest" with another world size and batch size (also from step 0 and the epoch's end).
    res = check_resume(
        job,
        cuts=[committed_step],
        overrun=crash_at - committed_step,
        item=ids,
        flatten=True,
        resume=restarted,
    )
    whole = flat(
        consume(
            endpoints, job=f"ref{case}", store="memory://", world=1, batch=64, steps=None, commit_every=10**9
        )
    )
    assert [i for step in res.full for i in step] == whole
    assert sorted(whole) == list(range(N_ROWS))


def test_resume_a_named_step_and_refusals(endpoints, store_url: str) -> None:
    consume(endpoints, job="named", store=store_url, world=2, batch=10, steps=12, commit_every=4)
    with Loader(endpoints, "toy@1", batch_size=10, job="named", cursor_store=store_url, resume=8) as ld:
        assert ld.state_dict()["offset"] == 8 * 2 * 10 and ld.resumed_from == 8
    with Loader(endpoints, "toy@1", batch_size=10, job="named", cursor_store=store_url, resume=6) as ld:
        with pytest.raises(NoCommittedStepError, match="step 6 is not committed"):
            iter(ld)
    with Loader(
        endpoints, "toy@1", batch_size=10, job="nothing", cursor_store=store_url, resume="latest"
    ) as ld:
        with pytest.raises(NoCommittedStepError, match="no step committed"):
            iter(ld)
    with Loader(
        endpoints, "toy@2", batch_size=10, job="named", cursor_store=store_url, resume="latest"
    ) as ld:
        with pytest.raises(FailedPreconditionError, match="toy@1"):
            iter(ld)
    with Loader(
        endpoints, "toy@1", batch_size=10, seed=5, job="named", cursor_store=store_url, resume="latest"
    ) as ld:
        with pytest.raises(InvalidArgumentError, match="seed"):
            iter(ld)


def good_record(job: str, rank: int, step: int) -> bytes:
    state = LoaderState("toy@1", "f" * 64, 0, "block(window=16)", 0, 40, 2, 10)
    return CursorRecord(job, rank, step, state, 1.0).to_bytes()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "not a cursor record"),
        (b'{"kind": "shardstream.Cursor", "format": 1, "job": "x"', "truncated or garbage"),
        (b'{"kind": "something else"}', "not a shardstream cursor"),
        (b'{"kind": "shardstream.Cursor", "format": 7}', "cursor format 7"),
        (b'{"kind": "shardstream.Cursor", "format": 1, "job": "g", "rank": 1, "step": 4}', "malformed"),
        (good_record("intruder", 1, 4), "belongs to job 'intruder'"),
        (good_record("g", 1, 99), "step 99"),
    ],
)
def test_garbage_truncated_or_foreign_cursors_are_refused(
    endpoints, store_url: str, payload: bytes, message: str
) -> None:
    store = open_store(store_url)
    store.write("g", 4, "k", 0, 2, good_record("g", 0, 4))
    store.write("g", 4, "k", 1, 2, payload)
    store.close()
    with Loader(endpoints, "toy@1", batch_size=10, job="g", cursor_store=store_url, resume="latest") as ld:
        with pytest.raises(CorruptCursorError, match=message):
            iter(ld)


def test_redis_outage_never_stops_training_and_commits_recover(endpoints, redis_server) -> None:
    url = redis_server.url
    with Loader(endpoints, "toy@1", batch_size=10, job="outage", cursor_store=url, epochs=None) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        ld.commit(3)
        ld.flush_commits()
        redis_server.kill()
        for _ in range(3):
            next(it)  # training continues
        ld.commit(6)
        with pytest.raises(UnavailableError, match="cursor commit"):
            ld.flush_commits(timeout_s=60)
        redis_server.start()  # same port, empty
        next(it)
        ld.commit(7)
        ld.flush_commits()
    store = open_store(url)
    assert store.committed("outage") == [7]
    store.close()


def test_wiped_redis_says_nothing_is_committed(endpoints, redis_server) -> None:
    import redis

    consume(endpoints, job="wiped", store=redis_server.url, world=1, batch=10, steps=4, commit_every=2)
    redis.Redis.from_url(redis_server.url).flushall()
    with Loader(
        endpoints, "toy@1", batch_size=10, job="wiped", cursor_store=redis_server.url, resume="latest"
    ) as ld:
        with pytest.raises(NoCommittedStepError):
            iter(ld)


def test_job_arguments_are_validated_before_any_network_call() -> None:
    for kwargs in (
        dict(job="bad job"),
        dict(resume="latest"),
        dict(job="j", resume="soon"),
        dict(job="j", resume=-1),
        dict(job="j", cursor_store="ftp://x"),
    ):
        with pytest.raises(ValueError):
            Loader(["127.0.0.1:1"], "toy", batch_size=1, **kwargs)
    with Loader(["127.0.0.1:1"], "toy", batch_size=1) as ld, pytest.raises(RuntimeError, match="needs a job"):
        ld.commit(1)


def test_cursor_cli_list_and_show(endpoints, tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path}/c.db"
    consume(endpoints, job="cli-job", store=url, world=2, batch=10, steps=7, commit_every=3)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shardstream", "cursor", *args, "--store", url],
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = json.loads(cli("list", "--json").stdout)
    assert listed == [{"job": "cli-job", "committed_steps": 2, "latest": 6, "steps_written": 2}]
    shown = json.loads(cli("show", "cli-job", "--json").stdout)
    assert shown["step"] == 6 and [r["offset"] for r in shown["ranks"]] == [120, 120]
    # both ranks ran in this process, one after the other: one run, each rank held by this process
    assert shown["run"]["world_size"] == 2 and [r["rank"] for r in shown["run"]["ranks"]] == [0, 1]
    assert {r["process"] for r in shown["run"]["ranks"]} == {r["run"] for r in shown["ranks"]}
    r = cli("show", "cli-job")
    assert (
        r.returncode == 0
        and "committed steps  3, 6" in r.stdout
        and "run              world size 2: rank 0 by" in r.stdout
    )
    r = cli("show", "ghost")
    assert r.returncode == 1 and "no cursors" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("case", range(4))
def test_kill_9_of_rank_processes_then_resume_latest(
    endpoints, redis_server, tmp_path: Path, case: int
) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(100 + case)
    world, batch, every = 2, rng.choice([8, 12]), rng.choice([3, 4])
    crash = rng.randrange(every + 1, -(-N_ROWS // (world * batch)) - 2)
    job = f"kill{case}"
    ranks = RankProcs(endpoints, redis_server.url, job, every)
    try:
        # Phase 1: each rank pauses after step `crash` (as if mid-step), then gets SIGKILL.
        logs = [tmp_path / f"r{r}.log" for r in range(world)]
        procs = [ranks.spawn(r, world, batch, logs[r], "--pause-at", str(crash)) for r in range(world)]
        deadline = time.monotonic() + 120
        while not all(Path(f"{log}.paused").exists() for log in logs):
            assert all(p.poll() is None for p in procs), "a rank died on its own"
            assert time.monotonic() < deadline, "ranks made no progress"
            time.sleep(0.01)
        for p in procs:
            ranks.kill(p)  # its prefetch and commit threads die with it
        store = open_store(redis_server.url)
        committed = store.committed(job)[-1]
        store.close()
        assert every <= committed <= crash

        # Phase 2: the job restarts from the committed step with another world size and batch size.
        w2, b2 = 3, 10
        logs2 = [tmp_path / f"again{r}.log" for r in range(w2)]
        procs2 = [ranks.spawn(r, w2, b2, logs2[r], "--resume") for r in range(w2)]
        assert [p.wait(timeout=120) for p in procs2] == [0] * w2
    finally:
        ranks.close()
    before = [[rec["ids"] for rec in steps_logged(log) if rec["step"] <= committed] for log in logs]
    after = [steps_logged(log) for log in logs2]
    assert all(recs[0]["step"] == committed + 1 for recs in after)  # exactly at the committed step
    order = [i for t in range(len(before[0])) for r in before for i in r[t]]
    order += [i for t in range(len(after[0])) for recs in after for i in recs[t]["ids"]]
    with Loader(endpoints, "toy@1", batch_size=64, seed=21) as ld:
        assert order == [i for b in ld for i in b["id"].tolist()]


def test_job_of_8_ranks_resumes_as_4_then_as_3_with_another_batch_size(endpoints, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = f"sqlite:///{tmp_path}/c.db"
    a = consume(endpoints, job="shrink", store=store, world=8, batch=6, steps=5, commit_every=5)
    b = consume(
        endpoints, job="shrink", store=store, world=4, batch=6, steps=7, commit_every=7, resume="latest"
    )
    c = consume(
        endpoints,
        job="shrink",
        store=store,
        world=3,
        batch=25,
        steps=None,
        commit_every=10**9,
        resume="latest",
    )
    reference = flat(
        consume(
            endpoints, job="ref-shrink", store="memory://", world=1, batch=100, steps=None, commit_every=10**9
        )
    )
    assert flat(a) + flat(b) + flat(c) == reference


def test_cursor_migrate_moves_a_job_at_its_next_epoch_boundary(endpoints, data_root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = f"sqlite:///{tmp_path}/c.db"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "shardstream",
                "cursor",
                *args,
                "--store",
                store,
                "--root",
                str(data_root),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    consume(endpoints, job="mig", store=store, world=1, batch=100, steps=3, commit_every=3)
    with Loader(endpoints, "toy@2", batch_size=100, job="mig", cursor_store=store, resume="latest") as ld:
        with pytest.raises(FailedPreconditionError, match="cursor migrate mig --to toy@2"):
            iter(ld)
    r = cli("migrate", "mig", "--to", "toy@2")
    assert r.returncode == 0 and "at epoch 1" in r.stdout, r.stderr
    with Loader(endpoints, "toy@2", batch_size=100, job="mig", cursor_store=store, resume="latest") as ld:
        with pytest.raises(FailedPreconditionError, match="finish the epoch on toy@1"):
            iter(ld)
    # finish epoch 0 on toy@1 and commit at its end, then epoch 1 runs on toy@2
    with Loader(endpoints, "toy@1", batch_size=100, job="mig", cursor_store=store, resume="latest") as ld:
        first = [i for b in ld for i in b["id"].tolist()]
        ld.commit(100)
    with Loader(
        endpoints, "toy@2", batch_size=100, epochs=2, job="mig", cursor_store=store, resume="latest"
    ) as ld:
        assert ld.state_dict()["epoch"] == 1 and ld.state_dict()["dataset"] == "toy@2"
        second = [i for b in ld for i in b["id"].tolist()]
    assert len(first) == N_ROWS - 300 and sorted(second) == list(range(10_000, 10_000 + N_ROWS))

    r = cli("migrate", "ghost-job", "--to", "toy@2")
    assert r.returncode == 1 and "nothing to migrate" in r.stderr
    consume(
        endpoints, job="backwards", store=store, world=1, batch=100, steps=1, commit_every=1, dataset="toy@2"
    )
    r = cli("migrate", "backwards", "--to", "toy@1")
    assert r.returncode == 1 and "does not descend from toy@2" in r.stderr and "Traceback" not in r.stderr
    r = cli("migrate", "backwards", "--to", "tiny@1")
    assert r.returncode == 1 and "another dataset" in r.stderr


def test_client_metrics_count_batches_stall_bytes_and_commits(endpoints, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client import REGISTRY

    from shardstream.client import metrics

    def value(name: str) -> float:  # this Loader's series: the job and rank are labels
        return REGISTRY.get_sample_value(name, {"job_name": "metrics", "rank": "0"}) or 0.0

    before = {
        n: value(n)
        for n in (
            "shardstream_client_batches_total",
            "shardstream_client_wait_seconds_count",
            "shardstream_client_bytes_total",
            "shardstream_client_cursor_commits_total",
            "shardstream_client_cursor_commit_seconds_count",
        )
    }
    with Loader(
        endpoints, "toy@1", batch_size=100, job="metrics", cursor_store=f"sqlite:///{tmp_path}/c.db"
    ) as ld:
        n = sum(1 for _ in ld)
        ld.commit(n)
        ld.flush_commits()
    assert n == 11
    assert value("shardstream_client_batches_total") - before["shardstream_client_batches_total"] == n
    assert (
        value("shardstream_client_wait_seconds_count") - before["shardstream_client_wait_seconds_count"]
        == n + 1
    )
    assert value("shardstream_client_bytes_total") > before["shardstream_client_bytes_total"]
    assert (
        value("shardstream_client_cursor_commits_total") - before["shardstream_client_cursor_commits_total"]
        == 1
    )
    assert (
        value("shardstream_client_cursor_commit_seconds_count")
        - before["shardstream_client_cursor_commit_seconds_count"]
        == 1
    )
    port = metrics.start_metrics_server(0)
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "shardstream_client_wait_seconds_bucket" in text
    assert 'shardstream_client_batches_total{job_name="metrics",rank="0"} ' in text
    assert value("shardstream_client_cursor_last_commit_timestamp_seconds") > 0
    assert value("shardstream_client_failovers_total") == 0  # exported from the start


def test_commits_coalesce_when_the_store_lags() -> None:
    """A store slower than the training loop gets the newest pending commit, not a growing backlog."""
    import threading

    from shardstream.client.cursors.committer import Committer

    release = threading.Event()
    written: list[int] = []

    class SlowStore(MemoryStore):
        def write(self, job, step, key, rank, world_size, record, **kw):  # type: ignore[no-untyped-def]
            release.wait(timeout=30)
            written.append(step)
            return super().write(job, step, key, rank, world_size, record, **kw)

    MemoryStore.clear()
    c = Committer(SlowStore(), "lag", 0, 1)
    try:
        first = c.submit(1, "k1", b"r1")
        while c._queue.unfinished_tasks and not c._queue.empty():  # the writer has taken the claim and step 1
            threading.Event().wait(0.005)
        later = [c.submit(step, f"k{step}", b"r") for step in range(2, 11)]
        release.set()
        c.flush(timeout_s=30)
    finally:
        c.close(timeout_s=30)
    assert written == [1, 10]
    assert MemoryStore().latest("lag") == 10
    assert first.done.is_set() and all(p.done.is_set() and p.error is None for p in later)
