"""Durable, fenced job cursors — real Redis processes (kill -9, restarts, snapshots), real rank processes.

commit(wait=True) survives a kill -9 of Redis with an append-only file; a Redis without persistence
is warned about; a stale run's commits are refused and change nothing; resume="latest" refuses a
store that is behind the checkpoint being restored; a multi-rank job on a relative SQLite file is
refused; commit failures are logged once per burst and never dropped by close().
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from shardstream.client import Loader
from shardstream.client.cursors.records import CursorRecord
from shardstream.client.cursors.redis_store import Persistence, RedisStore
from shardstream.client.cursors.stores import open_store
from shardstream.errors import (
    CursorStoreBehindError,
    InvalidArgumentError,
    StaleRunError,
    UnavailableError,
    UnclaimedError,
)

from .support.data import N_ROWS
from .support.rank_worker import RankProcs, steps_logged
from .support.redis_server import RedisServer
from .support.resume import CommittingRanks, check_resume, ids


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


# --- fencing: the store contract ------------------------------------------------------------------


def test_claims_fence_a_replaced_process_per_rank_and_every_rank_on_a_new_world_size(store_url: str) -> None:
    store = open_store(store_url)
    try:
        a0, a1 = store.claim("j", 0, 2, "A"), store.claim("j", 1, 2, "A")
        assert a0 != a1 and store.claim("j", 0, 2, "A") == a0  # the same process keeps its claim
        assert store.write("j", 3, "k", 0, 2, b"A0", gen=a0) is False
        b0 = store.claim("j", 0, 2, "B")  # rank 0 restarted (alone, or as the first rank of a new run)
        assert b0 > a1
        with pytest.raises(StaleRunError, match=r"job 'j': a newer run owns rank 0 \(process B, generation"):
            store.write("j", 6, "k", 0, 2, b"A0-late", gen=a0)
        # rank 1's process was not replaced: it goes on, but rank 0's old record no longer counts
        assert store.write("j", 3, "k", 1, 2, b"A1", gen=a1) is False
        assert store.committed("j") == []
        assert store.write("j", 3, "k", 0, 2, b"B0", gen=b0) is True  # rank 0's new holder completes step 3
        assert store.read("j", 3) == {0: b"B0", 1: b"A1"}
        assert store.steps("j") == {3: 2}  # the refused write of step 6 left nothing behind
        run = store.run("j")
        assert (
            run is not None
            and run.world_size == 2
            and {r: s.token for r, s in run.slots.items()} == {0: "B", 1: "A"}
        )

        c0 = store.claim("j", 0, 4, "C")  # a new run with 4 ranks: no rank of the 2-rank run writes again
        for rank, gen, newer in (
            (0, b0, r"owns rank 0 \(process C"),
            (1, a1, "of world size 4 owns the job"),
        ):
            with pytest.raises(StaleRunError, match=f"a newer run {newer}"):
                store.write("j", 9, "k", rank, 2, b"late", gen=gen)
        assert store.write("j", 9, "k4", 0, 4, b"C0", gen=c0) is False
        assert store.committed("j") == [3] and store.read("j", 3) == {0: b"B0", 1: b"A1"}

        with pytest.raises(UnclaimedError, match="holds no run of job 'never-claimed'"):
            store.write("never-claimed", 1, "k", 0, 1, b"x", gen=1)
        assert store.write("unfenced", 1, "k", 0, 1, b"x") is True  # records of older clients still count
    finally:
        store.close()


def test_records_of_processes_replaced_before_a_step_completes_never_complete_it(store_url: str) -> None:
    """Both ranks of run A wrote step 5 but rank 1 (A's) was late; the job restarts (run B, same world
    size) before it writes: A's leftover records cannot complete step 5 with A's late rank 1."""
    store = open_store(store_url)
    try:
        a = [store.claim("j", r, 3, "A") for r in range(3)]
        store.write("j", 5, "k", 0, 3, b"A0", gen=a[0])
        store.write("j", 5, "k", 2, 3, b"A2", gen=a[2])
        b = [store.claim("j", r, 3, "B") for r in (0, 2)]  # B's ranks 0 and 2 started; B's rank 1 not yet
        assert store.write("j", 5, "k", 1, 3, b"A1", gen=a[1]) is False  # A's rank 1 is not refused yet ...
        assert store.committed("j") == []  # ... but with A's replaced ranks 0 and 2 it completes nothing
        assert store.write("j", 5, "k", 0, 3, b"B0", gen=b[0]) is False
        assert store.write("j", 5, "k", 2, 3, b"B2", gen=b[1]) is True  # the same cursor, B's own records
        assert store.read("j", 5) == {0: b"B0", 1: b"A1", 2: b"B2"}
    finally:
        store.close()


# --- fencing: real rank processes -----------------------------------------------------------------


def test_a_stale_run_is_refused_and_the_committed_cursors_are_unchanged(
    endpoints: list[str], redis_server: RedisServer, tmp_path: Path
) -> None:
    """Run 1 (2 rank processes) pauses at step 6 and lives on; the job is restarted (run 2, 2 new
    processes, resume="latest") and finishes the epoch. Then run 1 goes on: its next commit is refused
    — with wait=True (rank 0) at once, asynchronously (rank 1) at its next commit or flush — and every
    committed cursor is byte for byte what run 2 wrote."""
    world, batch, every, pause = 2, 10, 3, 6
    job = "stale"
    ranks = RankProcs(endpoints, redis_server.url, job, every)
    store = open_store(redis_server.url)
    try:
        logs = [tmp_path / f"old{r}.log" for r in range(world)]
        errs = [tmp_path / f"old{r}.err" for r in range(world)]
        old = [
            ranks.spawn(
                r,
                world,
                batch,
                logs[r],
                "--pause-at",
                str(pause),
                *(["--wait"] if r == 0 else []),
                stderr=errs[r],
            )
            for r in range(world)
        ]
        deadline = time.monotonic() + 120
        while not all(Path(f"{log}.paused").exists() for log in logs):
            assert all(p.poll() is None for p in old), "a rank of run 1 died on its own"
            assert time.monotonic() < deadline, "run 1 made no progress"
            time.sleep(0.01)
        assert store.latest(job) == pause

        new_logs = [tmp_path / f"new{r}.log" for r in range(world)]
        new = [ranks.spawn(r, world, batch, new_logs[r], "--resume") for r in range(world)]
        assert [p.wait(timeout=120) for p in new] == [0] * world
        committed = store.committed(job)
        before = {step: store.read(job, step) for step in committed}
        total = -(-N_ROWS // (world * batch))
        assert committed[-1] == total // every * every
        assert steps_logged(new_logs[0])[0]["step"] == pause + 1

        for p in old:
            ranks.go(p)
        codes = [p.wait(timeout=120) for p in old]
        assert codes == [1, 1], [e.read_text()[-2000:] for e in errs]
        for rank, err in enumerate(errs):
            text = err.read_text()
            assert "StaleRunError" in text, text[-2000:]
            assert f"job 'stale': a newer run owns rank {rank}" in text, text[-2000:]
        assert steps_logged(logs[0])[-1]["step"] == pause + every  # rank 0 stopped at its refused commit
        assert store.committed(job) == committed
        assert {step: store.read(job, step) for step in committed} == before

        def writers(steps: list[int]) -> set[str]:
            return {CursorRecord.from_bytes(b, where="t").run for s in steps for b in before[s].values()}

        old_steps, new_steps = [s for s in committed if s <= pause], [s for s in committed if s > pause]
        assert len(writers(old_steps)) == len(writers(new_steps)) == world  # a process per rank in each run
        assert not writers(old_steps) & writers(new_steps)
    finally:
        ranks.close()
        store.close()


# --- durability: Redis kill -9 ----------------------------------------------------------------------


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_a_durable_commit_survives_kill_9_of_redis_with_an_append_only_file(
    endpoints: list[str], tmp_path: Path, appendfsync: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis", persistent=True, appendfsync=appendfsync).start()
    try:
        with Loader(endpoints, "toy@1", batch_size=10, epochs=None, job="aof", cursor_store=server.url) as ld:
            it = iter(ld)
            for _ in range(7):
                next(it)
            ld.commit(7, wait=True)  # returns once Redis keeps it: then kill -9, at once
            server.kill()
            server.start()  # the same port and data directory: Redis replays its append-only file
            store = RedisStore(server.url)
            assert store.latest("aof") == 7 and set(store.read("aof", 7)) == {0}
            # what wait=True waited for: the fsync itself (always), or WAITAOF / the AOF write (everysec)
            expected = {"always": ("fsync",), "everysec": ("waitaof", "aof-written")}[appendfsync]
            assert store.persistence().durability in expected
            store.close()
            next(it)
            ld.commit(8, wait=True)  # the store is back, and this process still holds rank 0
        with Loader(
            endpoints, "toy@1", batch_size=10, job="aof", cursor_store=server.url, resume="latest"
        ) as ld:
            assert ld.resumed_from == 8 and ld.state_dict()["offset"] == 80
    finally:
        server.kill()
    assert warnings_about(caplog, "persistence") == []


def test_a_job_resumes_its_durable_checkpoint_after_kill_9_of_redis(
    endpoints: list[str], tmp_path: Path
) -> None:
    """Through the resume harness: every checkpoint is a commit(wait=True) of each rank; before the job
    restarts, Redis gets SIGKILL and comes back on its append-only file."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    runs = iter(range(100))

    def job() -> CommittingRanks:
        name = f"job-{next(runs)}"
        return CommittingRanks(
            lambda rank: Loader(
                endpoints, "toy@1", batch_size=20, rank=rank, world_size=2, job=name, cursor_store=server.url
            ),
            2,
            commit_every=4,
            wait=True,
        )

    def restarted(state: dict) -> CommittingRanks:  # type: ignore[type-arg]
        server.kill()
        server.start()
        return CommittingRanks(
            lambda rank: Loader(
                endpoints,
                "toy@1",
                batch_size=25,
                rank=rank,
                world_size=3,
                job=state["job"],
                cursor_store=server.url,
                resume="latest",
                resume_min_step=state["step"],
            ),
            3,
            commit_every=10**9,
            resumed_from=state["step"],
        )

    try:
        check_resume(job, cuts=[9], item=ids, flatten=True, resume=restarted, overrun=2)
    finally:
        server.kill()


# --- persistence checks ---------------------------------------------------------------------------


def test_a_redis_without_persistence_is_warned_about_once(
    endpoints: list[str], redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    for run in range(2):  # two Loaders, two stores of one URL: one warning
        with Loader(endpoints, "toy@1", batch_size=10, job=f"w{run}", cursor_store=redis_server.url) as ld:
            next(iter(ld))
            ld.commit(1, wait=True)
    (warning,) = warnings_about(caplog, "persistence")
    assert (
        f"cursor store {redis_server.url} has no persistence (appendonly no, no RDB save points)" in warning
    )
    assert "a Redis restart loses every committed cursor" in warning and "appendonly yes" in warning


def test_managed_redis_without_config_is_checked_through_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis", args=["--rename-command", "CONFIG", ""]).start()
    try:
        store = open_store(server.url)
        gen = store.claim("m", 0, 1, "T")
        assert store.write("m", 1, "k", 0, 1, b"r", gen=gen, durable=True) is True
        store.close()
    finally:
        server.kill()
    (warning,) = warnings_about(caplog, "append-only")
    assert "has no append-only file (INFO persistence: aof_enabled 0; CONFIG is disabled" in warning


def sent_commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """What this process sends to Redis, one entry a round trip (a pipeline is one), each the names
    of its commands ("CONFIG GET", "EVALSHA", ...)."""
    sent: list[list[str]] = []
    send = redis.connection.Connection.send_packed_command

    def counting(self, command, check_health=True):  # type: ignore[no-untyped-def]
        packed = command if isinstance(command, bytes) else b"".join(command)
        names = []
        for request in packed.split(b"\r\n*"):  # *<n> $<len> NAME $<len> SUBCOMMAND-or-argument ...
            parts = request.split(b"\r\n")
            names.append(" ".join(p.decode().upper() for p in parts[2:5:2] if p.isalpha()))
        sent.append(names)
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    return sent


def test_a_rank_start_checks_persistence_in_one_round_trip(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 ranks start at once against one Redis thread: after the connection's handshake (HELLO,
    CLIENT SETINFO: redis-py's, per connection) a rank's start is 2 round trips: the persistence check
    (INFO server and CONFIG GET, pipelined) and the claim script. It was 5 (INFO, 3 CONFIG GET, claim)."""
    open_store(redis_server.url).claim("rt", 0, 2, "T0")  # rank 0 loads the claim script
    sent = sent_commands(monkeypatch)
    store = open_store(redis_server.url)
    gen = store.claim("rt", 1, 2, "T1")
    handshake = {"HELLO", "CLIENT", "AUTH", "SELECT"}
    after_handshake = [names for names in sent if names[0].split()[0] not in handshake]
    assert after_handshake == [["INFO SERVER", "CONFIG GET"], ["EVALSHA"]], sent
    assert store.persistence().source == "CONFIG GET" and store.persistence().aof is False
    started = len(sent)
    store.write("rt", 1, "k", 1, 2, b"r", gen=gen, durable=True)
    assert not any("CONFIG GET" in names for names in sent[started:]), "asked once per store"
    store.close()


class _RedisBefore7:
    """A Redis before 7.0 as the persistence check sees it: one parameter a CONFIG GET (more is
    'wrong number of arguments'), and redis_version 6.2.14. The installed Redis answers the rest."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def pipeline(self, transaction: bool) -> _RedisBefore7:
        self.pipe = self.client.pipeline(transaction=transaction)
        return self

    def info(self, section: str) -> None:
        self.pipe.info(section)

    def config_get(self, *names: str) -> None:
        if len(names) > 1:
            self.pipe.execute_command("CONFIG", "GET")  # refused as 6.2 refuses several parameters
        else:
            self.pipe.config_get(*names)

    def execute(self, raise_on_error: bool) -> list[object]:
        out = self.pipe.execute(raise_on_error=raise_on_error)
        return [{**a, "redis_version": "6.2.14"} if isinstance(a, dict) and "redis_version" in a else a for a in out]


def test_a_redis_before_7_is_asked_one_config_parameter_at_a_time(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", persistent=True, appendfsync="everysec").start()
    try:
        store = RedisStore(server.url)
        old = store._ask_persistence(_RedisBefore7(store._client))
        assert old == dataclasses.replace(store.persistence(), version=(6, 2, 14))
        assert (old.aof, old.appendfsync, old.source, old.durability) == (True, "everysec", "CONFIG GET", "aof-written")
        store.close()
    finally:
        server.kill()


def test_persistence_settings_say_what_a_durable_write_waits_for() -> None:
    cases = [
        (Persistence(True, "always", "", (7, 0, 15)), "fsync", None),
        (Persistence(True, "everysec", "", (7, 2, 4)), "waitaof", None),
        (Persistence(True, "everysec", "", (7, 0, 15)), "aof-written", None),
        (Persistence(True, None, None, (7, 0, 15), "INFO persistence"), "aof-written", None),
        (Persistence(True, "no", "", (7, 2, 4)), "aof-written", None),
        (
            Persistence(False, "everysec", "3600 1", (7, 0, 15)),
            "acknowledged",
            "persists by RDB snapshots only",
        ),
        (Persistence(False, "everysec", "", (7, 0, 15)), "acknowledged", "has no persistence"),
        (
            Persistence(False, None, None, (7, 2), "INFO persistence"),
            "acknowledged",
            "has no append-only file",
        ),
        (Persistence(None, None, None, (), "nothing"), "acknowledged", "could not tell"),
    ]
    for persistence, durability, problem in cases:
        assert persistence.durability == durability, persistence
        text = persistence.problem("redis://r")
        assert (text is None) if problem is None else (text is not None and problem in text), persistence


def test_a_redis_that_says_7_2_but_has_no_waitaof_still_gets_durable_writes(tmp_path: Path) -> None:
    """A proxy or fork may report redis_version 7.2 without WAITAOF: the write goes through (in one
    pipeline with WAITAOF), the store falls back to waiting for the AOF write, and stops asking. This
    Redis (7.0) plays that server: its reported version is set to 7.2 in the store's cached check."""
    server = RedisServer(tmp_path / "redis", persistent=True, appendfsync="everysec").start()
    try:
        store = RedisStore(server.url)
        store._persistence = dataclasses.replace(store.persistence(), version=(7, 2, 0))
        assert store.persistence().durability == "waitaof"
        gen = store.claim("w", 0, 1, "T")
        assert store.write("w", 1, "k", 0, 1, b"r", gen=gen, durable=True) is True
        assert store.persistence().durability == "aof-written"  # not asked again
        assert store.write("w", 2, "k", 0, 1, b"r", gen=gen, durable=True) is True
        with pytest.raises(StaleRunError):  # a refusal still comes through the pipeline's path
            store._persistence = dataclasses.replace(store.persistence(), version=(7, 2, 0))
            store.claim("w", 0, 1, "U")  # another process takes rank 0 over: "T" is stale
            store.write("w", 3, "k", 0, 1, b"r", gen=gen, durable=True)
        store.close()
        server.kill()
        server.start()
        store = RedisStore(server.url)
        assert store.committed("w") == [1, 2]
        store.close()
    finally:
        server.kill()


# --- commit(wait=True), failures, close() ---------------------------------------------------------


def commit_failures() -> float:
    """Over every Loader of this process (the series carry job_name and rank labels)."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "shardstream_client_cursor_commit_failures_total"
    )


def test_commit_failures_raise_when_waited_for_and_are_logged_once_per_burst(
    endpoints: list[str], redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with Loader(
        endpoints, "toy@1", batch_size=10, epochs=None, job="burst", cursor_store=redis_server.url
    ) as ld:
        it = iter(ld)
        next(it)
        ld.commit(1, wait=True)
        redis_server.kill()
        before = commit_failures()
        with pytest.raises(UnavailableError, match="cursor commit of job burst step 2 .rank 0. failed"):
            ld.commit(2, wait=True)
        for step in (3, 4, 5):
            next(it)
            ld.commit(step)
            with pytest.raises(
                UnavailableError, match=f"1 cursor commit.s. of job burst .rank 0. failed; last: step {step}"
            ):
                ld.flush_commits()
        assert commit_failures() - before == 4
        assert len(warnings_about(caplog, "cursor store failing for job burst")) == 1  # one burst, one line
        redis_server.start()  # empty: the store lost the job's run too, and rank 0 claims it again
        ld.commit(6, wait=True)
        assert len(warnings_about(caplog, "work again after 4 failed attempt(s)")) == 1
    store = open_store(redis_server.url)
    assert store.committed("burst") == [6]
    store.close()


def test_close_raises_when_the_newest_commit_did_not_reach_the_store(
    endpoints: list[str], redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    ld = Loader(endpoints, "toy@1", batch_size=10, job="closing", cursor_store=redis_server.url)
    it = iter(ld)
    next(it)
    ld.commit(1)
    ld.flush_commits()
    redis_server.kill()
    next(it)
    ld.commit(2)
    with pytest.raises(
        UnavailableError, match=r"the last cursor commit \(step 2\) failed and the store does not hold it"
    ):
        ld.close()

    # an earlier failure that a later commit superseded: logged with the count and the last error
    redis_server.start()
    with Loader(endpoints, "toy@1", batch_size=10, job="closing2", cursor_store=redis_server.url) as ld:
        it = iter(ld)
        next(it)
        ld.flush_commits()  # the claim landed
        redis_server.kill()
        before = commit_failures()
        ld.commit(1)
        deadline = time.monotonic() + 60
        while commit_failures() == before:  # step 1's write failed (and nothing reported it)
            assert time.monotonic() < deadline, "the failed commit was never counted"
            time.sleep(0.01)
        redis_server.start()
        next(it)
        ld.commit(2)
    (line,) = warnings_about(caplog, "failed since the last flush_commits()")
    assert "job closing2 (rank 0): 1 cursor commit(s) failed" in line and "last: step 1" in line
    assert "the newest commit, step 2, was written" in line

    # leaving a with block on an exception: that exception, not the commit failure
    redis_server.kill()
    with pytest.raises(KeyError, match="the training loop's own error"):
        with Loader(endpoints, "toy@1", batch_size=10, job="closing3", cursor_store=redis_server.url) as ld:
            next(iter(ld))
            ld.commit(1)
            raise KeyError("the training loop's own error")
    assert warnings_about(caplog, "job closing3 (rank 0): the last cursor commit (step 1) failed")


# --- resume below the checkpoint, shared stores ---------------------------------------------------


def test_resume_latest_refuses_a_store_behind_the_checkpoint_after_a_snapshot_rollback(
    endpoints: list[str], redis_server: RedisServer
) -> None:
    """Redis persists by snapshots only: SAVE after step 4, commits up to step 8, kill -9, restart —
    the store is back at step 4 while the model checkpoint being restored is step 8's."""
    url = redis_server.url
    with Loader(endpoints, "toy@1", batch_size=10, job="rollback", cursor_store=url) as ld:
        for step, _ in enumerate(ld, 1):
            if step % 4 == 0:
                ld.commit(step, wait=True)
            if step == 4:
                redis.Redis.from_url(url).save()  # the last snapshot
            if step == 8:
                break
    redis_server.kill()
    redis_server.start()
    with Loader(
        endpoints,
        "toy@1",
        batch_size=10,
        job="rollback",
        cursor_store=url,
        resume="latest",
        resume_min_step=8,
    ) as ld:
        with pytest.raises(CursorStoreBehindError) as err:
            iter(ld)
    message = str(err.value)
    assert "job 'rollback'" in message and "latest committed step is 4, older than step 8" in message
    assert "resume=4 with the model checkpoint of step 4" in message
    with Loader(
        endpoints,
        "toy@1",
        batch_size=10,
        job="rollback",
        cursor_store=url,
        resume="latest",
        resume_min_step=4,
    ) as ld:
        assert ld.resumed_from == 4 and ld.state_dict()["offset"] == 40
    with Loader(
        endpoints, "toy@1", batch_size=10, job="wiped", cursor_store=url, resume="latest", resume_min_step=3
    ) as ld:
        with pytest.raises(CursorStoreBehindError, match="has no committed step, older than step 3"):
            iter(ld)
    for resume in (None, 5):
        with pytest.raises(ValueError, match="resume_min_step .* goes with resume='latest'"):
            Loader(
                endpoints,
                "toy@1",
                batch_size=10,
                job="rollback",
                cursor_store=url,
                resume=resume,
                resume_min_step=4,
            )


def test_a_multi_rank_job_on_a_relative_sqlite_store_is_refused(
    endpoints: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # the default (.shardstream/cursors.db), or any relative file
    for store in (None, "sqlite:///cursors.db"):
        with pytest.raises(InvalidArgumentError) as err:
            Loader(endpoints, "toy@1", batch_size=10, rank=1, world_size=2, job="multi", cursor_store=store)
        message = str(err.value)
        assert "world_size=2" in message and "relative to each process's working directory" in message
        assert (
            'cursor_store="redis://host:6379/0"' in message
            and 'cursor_store="sqlite:////shared/fs/cursors.db"' in message
        )
    assert list(tmp_path.iterdir()) == []  # refused before anything was created
    with Loader(
        endpoints,
        "toy@1",
        batch_size=10,
        rank=1,
        world_size=2,
        job="multi",
        cursor_store=f"sqlite:///{tmp_path}/c.db",
    ):
        pass
    with Loader(endpoints, "toy@1", batch_size=10, job="single"):  # one rank: the default is fine
        pass
    assert (tmp_path / ".shardstream" / "cursors.db").is_file()


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_generation_of_a_lost_run_state_is_claimed_again_not_refused_as_stale(
    kind: str, redis_server: RedisServer
) -> None:
    """The store loses the job's run (Redis wiped mid-run); rank 1 claims first and makes a new run
    state; rank 0's generation was issued by the lost one: its write is UnclaimedError (claim again),
    never StaleRunError — while a generation the new run state took over is still stale."""
    from shardstream.client.cursors.stores import MemoryStore

    store = open_store("memory://" if kind == "memory" else redis_server.url)
    try:
        g0 = store.claim("j", 0, 2, "A")
        g1 = store.claim("j", 1, 2, "B")
        assert not store.write("j", 1, "k", 0, 2, b"r0", gen=g0) and store.write(
            "j", 1, "k", 1, 2, b"r1", gen=g1
        )
        if kind == "memory":
            MemoryStore.clear()
        else:
            redis.Redis.from_url(redis_server.url).flushall()
        g1_new = store.claim("j", 1, 2, "B")
        with pytest.raises(UnclaimedError):
            store.write("j", 2, "k", 0, 2, b"r0", gen=g0)
        g0_new = store.claim("j", 0, 2, "A")
        assert not store.write("j", 2, "k", 0, 2, b"r0", gen=g0_new)
        assert store.write("j", 2, "k", 1, 2, b"r1", gen=g1_new)
        assert store.committed("j") == [2]
        store.claim("j", 0, 2, "C")  # a newer process takes rank 0 over: "A" is stale now
        with pytest.raises(StaleRunError):
            store.write("j", 3, "k", 0, 2, b"r0", gen=g0_new)
    finally:
        store.close()
        if kind == "memory":
            MemoryStore.clear()


def test_a_call_that_times_out_is_asked_again_when_repeating_it_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A storm's calls (1,000 ranks at once against one Redis thread) time out now and then: a read or
    a record's write is asked again (READ_ATTEMPTS in all, backoff), then UNAVAILABLE naming the
    attempts; a call that is not idempotent (`_call`: the claim) is reported at once."""
    from shardstream.client.cursors import redis_store

    sleeps: list[float] = []
    monkeypatch.setattr(redis_store.time, "sleep", sleeps.append)
    store = RedisStore("redis://127.0.0.1:1/0")  # never connects: the calls below are scripted
    calls = 0

    def flaky(fail: int) -> object:
        def fn() -> object:
            nonlocal calls
            calls += 1
            if calls <= fail:
                raise redis.TimeoutError("Timeout reading from socket")
            return [b"7"]

        return fn

    assert store._idempotent(flaky(redis_store.READ_ATTEMPTS - 1)) == [b"7"]
    assert calls == redis_store.READ_ATTEMPTS and len(sleeps) == redis_store.READ_ATTEMPTS - 1
    assert sleeps == sorted(sleeps) and sleeps[0] >= redis_store.READ_BACKOFF_S
    calls = 0
    with pytest.raises(UnavailableError, match=f"{redis_store.READ_ATTEMPTS} attempts"):
        store._idempotent(flaky(redis_store.READ_ATTEMPTS))
    calls = 0
    with pytest.raises(UnavailableError):
        store._call(flaky(1))
    assert calls == 1
    monkeypatch.setattr(store._client, "zrevrange", lambda *a: flaky(2)())
    calls = 0
    assert store.latest("job") == 7  # latest() is such a read
