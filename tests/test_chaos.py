"""The chaos suite's faults, small (`make chaos` runs them full size): every fault of loadtest/chaos.py
against real servers, trainer processes, Redis and SeaweedFS — 0 samples lost, 0 duplicated, 0 other
than the plan's, or the typed error where the fault is unrecoverable — plus the judge itself (a tally
that misses a loss would pass everything) and the client's keepalive against a silent server.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loadtest.chaos import FAULTS, markdown
from loadtest.chaos_ctx import Ctx, Sizes
from loadtest.chaos_job import tally
from loadtest.chaos_net import Blackhole
from loadtest.chaos_rank import packed_keys
from shardstream.client import Loader
from shardstream.client.cursors.stores import open_store
from shardstream.server.local_fleet import LocalServer

from .support.redis_server import RedisServer
from .support.servers import data_port_behind, unused_port


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Ctx]:
    """The faults' datasets, stable fleet and Redis/S3 at the test sizes; SeaweedFS is the session's."""
    with Ctx(
        tmp_path_factory.mktemp("chaos"), Sizes.small(), s3=lambda: request.getfixturevalue("s3_server")
    ) as c:
        yield c


def run(ctx: Ctx, name: str) -> dict:  # type: ignore[type-arg]
    with contextlib.ExitStack() as stack:
        out = FAULTS[name](ctx, stack)
    print(markdown({"rows": [out]}), out["details"])
    return out


# corrupt-shard ends in a typed error (below); redis-wipe-midrun's small version is below, in a fixed
# order (the chaos row depends on which rank commits first after the wipe);
# resize-mixture: the plain and mixture+transforms versions stand for it here (make chaos runs it).
@pytest.mark.parametrize(
    "name", [n for n in FAULTS if n not in ("corrupt-shard", "redis-wipe-midrun", "resize-mixture")]
)
def test_each_fault_loses_and_repeats_nothing(ctx: Ctx, name: str) -> None:
    row = run(ctx, name)
    assert row["ok"], row["outcome"]
    assert row["outcome"] == "exact"
    assert row["lost"] == 0 and row["duplicated"] == 0 and row["wrong"] == 0
    assert row["delivered"] > 0 and row["tally"]["complete"]
    t = row["tally"]
    if name.startswith("rank-kills"):
        assert len(row["details"]["kills"]) == ctx.sizes.rank_kills and t["replayed"] > 0
    if name.startswith("resize"):
        assert t["resumes"] == {"fresh": 1, "store": 2}
    if name == "redis-restart":
        assert t["commit_failures"] > 0 and t["resumes"] == {"fresh": 1, "store": 1}
    if name == "redis-wipe-down":
        # the loud failure first (exit status 3, the typed error), then the checkpoint's state
        assert row["details"]["loud_exit_codes"] == [3]
        assert {e.split(":")[0] for e in t["resume_errors"]} == {"CursorStoreBehindError"}
        assert t["resumes"] == {"fresh": 1, "failed": 1, "checkpoint": 1}
    if name == "s3":
        proxy = row["details"]["proxy"]
        assert proxy["error_503"] + proxy["error_500"] > 0 and proxy["cut"] > 0
    if name == "blackhole":
        assert row["failovers"] >= 1
    if name == "corrupt-cache":
        assert row["details"]["corrupt_noticed"] >= row["details"]["flipped"] > 0


def test_a_corrupt_shard_is_a_typed_data_loss_naming_it(ctx: Ctx) -> None:
    row = run(ctx, "corrupt-shard")
    assert row["ok"] and row["outcome"] == "typed DataLossError", row["outcome"]
    assert row["duplicated"] == 0 and row["wrong"] == 0 and row["lost"] is None
    assert all("row group" in e and "part-" in e for e in row["details"]["errors"])


def test_ranks_commit_again_after_redis_is_wiped_mid_run(ctx: Ctx, tmp_path: Path) -> None:
    """redis-wipe-midrun, small and in order: two ranks of one job commit step 2, Redis loses
    everything, rank 1 commits step 3 (it claims the job again), then rank 0 commits step 3."""
    import redis as redis_py

    redis = RedisServer(tmp_path / "redis").start()
    try:
        loaders = [
            Loader(
                [x.target for x in ctx.fleet],
                ctx.vectors,
                batch_size=8,
                rank=r,
                world_size=2,
                job="wiped-mid-run",
                cursor_store=redis.url,
            )
            for r in range(2)
        ]
        with contextlib.ExitStack() as stack:
            for ld in loaders:
                stack.enter_context(ld)
            batches = [iter(ld) for ld in loaders]
            for step in (1, 2, 3):
                for it in batches:
                    next(it)
                if step == 2:
                    for ld in loaders:
                        ld.commit(2, wait=True)
                    redis_py.Redis.from_url(redis.url).flushall()
            loaders[1].commit(3, wait=True)
            loaders[0].commit(3, wait=True)
        store = open_store(redis.url)
        assert store.committed("wiped-mid-run") == [3]
        store.close()
    finally:
        redis.kill()


def test_the_tally_counts_what_is_lost_duplicated_wrong_and_rolled_back(ctx: Ctx) -> None:
    """The judge itself, on records made up from the plan: a trajectory with one step missing, one
    delivered twice and one wrong sample; and a resume that discards what came after its step."""
    plan = ctx.plan(ctx.vectors, 1)
    n, b = plan.selector.num_rows, 100
    steps = [(i, i * b, min(n, (i + 1) * b)) for i in range(-(-n // b))]

    def rec(phase: int, s: int, first: int, end: int) -> dict:  # type: ignore[type-arg]
        keys = plan.keys(0, np.arange(first, end)).tolist()
        return {"phase": phase, "rank": 0, "s": s + 1, "e": 0, "p": [first, end], "k": keys, "w": 0.0}

    start = {"phase": 0, "rank": 0, "start": 0, "how": "fresh", "error": None}
    end = {"phase": 0, "rank": 0, "end": len(steps), "f": 0}
    good = [start, *(rec(0, *x) for x in steps), end]
    assert tally(plan, good, 1).exact
    bad = [start, *(rec(0, *x) for x in steps if x[0] != 3), rec(0, *steps[5]), end]
    bad[2]["k"][7] += 1
    t = tally(plan, bad, 1)
    assert (t.lost, t.duplicated, t.wrong, t.exact) == (b, b, 1, False)
    # phase 0 dies after step 6, phase 1 resumes at step 4: steps 5 and 6 of phase 0 do not count
    resumed = [
        start,
        *(rec(0, *x) for x in steps[:6]),
        {"phase": 1, "rank": 0, "start": 4, "how": "store", "error": None},
        *(rec(1, *x) for x in steps[4:]),
        {**end, "phase": 1},
    ]
    t = tally(plan, resumed, 2)
    assert t.exact and t.replayed == 2 * b and t.resumes == {"fresh": 1, "store": 1}


def test_packed_keys_read_each_documents_key_from_its_tokens() -> None:
    docs = {10: b"1000000005:alpha beta", 11: b"7:gamma"}
    tokens, doc_ids = [], []
    for d, text in docs.items():
        tokens += [*text, 256]  # the bytes tokenizer: UTF-8 bytes, then EOS
        doc_ids += [d] * (len(text) + 1)
    tokens += [256] * (-len(tokens) % 8)  # padding
    doc_ids += [-1] * (len(tokens) - len(doc_ids))
    batch = {"input_ids": np.array(tokens).reshape(-1, 8), "document_ids": np.array(doc_ids).reshape(-1, 8)}
    assert packed_keys(batch, 10, 12) == [1_000_000_005, 7]
    assert packed_keys(batch, 10, 13) == [1_000_000_005, 7, -1]  # a position with no document
    assert packed_keys(batch, 11, 12) == [-2]  # a document that is not this step's


def test_keepalive_drops_a_silent_server_before_the_idle_watchdog(
    ctx: Ctx, caplog: pytest.LogCaptureFixture
) -> None:
    """A server whose data plane is behind a proxy that goes silent (accepts, sends nothing): with the idle watchdog out of
    the way (40 s), the client's keepalive ping, unanswered, must end the stream and move it to the
    other server — not the watchdog (grpcio 1.85 ignores keepalive_timeout_ms for the ping's answer
    and waits grpc.http2.ping_timeout_ms, 60 s by default: client/transport/channel.py sets both).
    The dataset (33 MB an epoch) outlasts what gRPC, the sockets and the proxy buffer (~10 MB) by
    far: whenever the proxy goes silent, the rank still needs most of the epoch from that server.
    (On the 432 KB test vectors, the whole of both epochs could arrive before a late blackhole:
    no failover at all.)"""
    stable = ctx.fleet
    rows = 32_000
    dataset = ctx.vector_dataset(rows, 2_000, dim=256)
    data_port = unused_port()
    with (
        Blackhole(data_port) as proxy,
        LocalServer(ctx.root, extra_args=data_port_behind(proxy, data_port)) as behind,
        Loader(
            [behind.target, stable[1].target],
            dataset,
            batch_size=256,
            epochs=2,
            prefetch=2,
            seed=3,
            stream_idle_timeout_s=40,
        ) as ld,
        caplog.at_level(logging.WARNING, logger="shardstream.client"),
    ):
        it = iter(ld)
        got = [next(it)["id"] for _ in range(3)]
        proxy.blackhole()
        got += [b["id"] for b in it]
    messages = [r.getMessage() for r in caplog.records]
    assert any("ping timeout" in m for m in messages), messages
    assert not any("no data from the server" in m for m in messages), messages
    ids = np.concatenate(got)
    assert len(ids) == 2 * rows and (np.bincount(ids) == 2).all()
