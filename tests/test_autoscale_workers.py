"""`serve --workers auto` on real server processes: trainers that stall on a slow transform make the
supervisor add a worker (counted with its reason, logged), and every sample is still delivered
exactly once. Every wait is on a condition (the ready file, a metric, counts), never a time window."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardstream.client import Loader
from shardstream.server.local_fleet import LocalServer

from .support.media import blob_table, random_png, write_table
from .support.servers import scrape, wait_for

RANKS = 8
BATCH = 4
ROWS = 16 * 64  # 16 distinct 256x256 noise PNGs (~2 ms each to decode), 64 times over
SHARE = ROWS // RANKS  # samples of one rank in one epoch
DECODE = [{"op": "image.decode", "column": "image", "size": [16, 16]}]


@pytest.fixture(scope="module")
def slow_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("autoscale") / "root"
    pngs = [(f"noise-{i}", random_png(i, 256, 256)) for i in range(16)]
    write_table(root, "slow", blob_table("image", pngs, repeat=64), row_group_rows=16, shard_rows=128)
    return root


@pytest.fixture
def auto_server(slow_root: Path, tmp_path: Path) -> Iterator[LocalServer]:
    # one transform thread a worker: a worker is one core's worth, as in a CPU-bound fleet
    args = ("--max-workers", "2", "--autoscale-interval", "0.2", "--transform-threads", "1")
    server = LocalServer(slow_root, metrics=True, workers="auto", extra_args=args, log_path=tmp_path / "server.log")
    try:
        yield server.start()
    finally:
        server.stop()


def _rank(server: LocalServer, rank: int, got: list[int], stop: threading.Event, errors: list[BaseException]) -> None:
    """A training loop with no compute (it waits for data most of the time), until told to stop."""
    try:
        with Loader([server.target], "slow@1", batch_size=BATCH, rank=rank, world_size=RANKS, shuffle=False,
                    epochs=None, job="autoscale", cursor_store="memory://", report_interval_s=0.2, output="arrow",
                    columns=["idx", "image"], transforms=DECODE) as loader:  # fmt: skip
            for batch in loader:
                got.extend(batch.column("idx").to_pylist())
                if stop.is_set():
                    return
    except BaseException as exc:  # handed to the test thread
        errors.append(exc)


def test_stalled_trainers_grow_the_workers_and_every_sample_comes_once(auto_server: LocalServer, tmp_path: Path) -> None:
    info = auto_server.info()
    assert len(info["workers"]) == 1  # auto starts at one
    assert scrape(auto_server)['shardstream_autoscale_decisions_total{reason="stall_above_target"}'] == 0
    got: list[list[int]] = [[] for _ in range(RANKS)]
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=_rank, args=(auto_server, r, got[r], stop, errors)) for r in range(RANKS)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: bool(errors) or len(auto_server.info()["workers"]) == 2, "a second worker", timeout_s=120)
        assert not errors, errors
        m = scrape(auto_server)
        assert m['shardstream_autoscale_decisions_total{reason="stall_above_target"}'] == 1
        assert m["shardstream_workers"] == 2
        assert m['shardstream_job_data_stall_ratio{job_name="autoscale"}'] > 0.05  # why it grew
        # every rank reads its whole first epoch (counted, not timed)
        wait_for(lambda: bool(errors) or min(len(g) for g in got) >= SHARE, "every rank's first epoch", timeout_s=120)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    first_epoch = sorted(i for g in got for i in g[:SHARE])
    assert first_epoch == list(range(ROWS))  # each sample exactly once over the ranks
    log = (tmp_path / "server.log").read_text()
    assert "autoscale: 1 -> 2 workers (stall_above_target: stall" in log
    m = scrape(auto_server)
    assert m["shardstream_workers"] == 2  # at the most: never more, and no flapping back while stalled
    assert m['shardstream_autoscale_decisions_total{reason="capacity_to_spare"}'] == 0
