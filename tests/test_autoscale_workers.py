"""`serve --workers auto` on real server processes: trainers that stall on a slow transform make the
supervisor add a worker (counted with its reason, logged), and every sample is still delivered
exactly once. Every wait is on a condition (the ready file, a metric, counts), never a time window."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardstream.client import Loader
from shardstream.server.local_fleet import LocalServer

from .support.media import blob_table, random_png, write_table
from .support.servers import scrape, wait_for

RANKS = 8
BATCH = 4
ROWS = 16 * 32  # 16 distinct 256x256 noise PNGs (~2 ms each to decode), 32 times over
SHARE = ROWS // RANKS  # samples of one rank in one epoch
# 48 KiB a step decoded: a stream is never far ahead of its slow trainer (the window holds a step or
# two), so the drained worker has streams in flight
DECODE = [{"op": "image.decode", "column": "image", "size": [64, 64]}]


@pytest.fixture(scope="module")
def slow_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("autoscale") / "root"
    pngs = [(f"noise-{i}", random_png(i, 256, 256)) for i in range(16)]
    write_table(root, "slow", blob_table("image", pngs, repeat=32), row_group_rows=16, shard_rows=128)
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


def _rank(
    server: LocalServer, rank: int, got: list[int], stop: threading.Event, errors: list[BaseException], *, job: str, step_s: float
) -> None:
    """A training loop until told to stop: with no compute (it waits for data most of the time), or
    `step_s` of simulated compute a batch (it hardly waits: the prefetch keeps up). It reports every
    step or so (every 0.2 s at least): a report window with a whole number of steps in it."""
    try:
        with Loader([server.target], "slow@1", batch_size=BATCH, rank=rank, world_size=RANKS, shuffle=False,
                    epochs=None, job=job, cursor_store="memory://", report_interval_s=max(0.2, step_s), output="arrow",
                    columns=["idx", "image"], transforms=DECODE) as loader:  # fmt: skip
            for batch in loader:
                got.extend(batch.column("idx").to_pylist())
                if stop.wait(step_s):
                    return
    except BaseException as exc:  # handed to the test thread
        errors.append(exc)


class _Trainers:
    """RANKS training loops in threads; `stop()` ends them and hands back their first error."""

    def __init__(self, server: LocalServer, job: str, step_s: float = 0.0) -> None:
        self.got: list[list[int]] = [[] for _ in range(RANKS)]
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=_rank, args=(server, r, self.got[r], self._stop, self.errors), kwargs={"job": job, "step_s": step_s})
            for r in range(RANKS)
        ]
        for t in self._threads:
            t.start()

    def wait_for(self, cond: Callable[[], bool], what: str) -> None:
        wait_for(lambda: bool(self.errors) or cond(), what, timeout_s=120)
        assert not self.errors, self.errors

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not self.errors, self.errors


def _spread(counts: list[int]) -> bool:
    """Both workers carry half the ranks: a spread the rebalancing leaves as it is (under 2)."""
    return min(counts) >= RANKS // 2 and max(counts) - min(counts) <= 1


def _ranks_per_worker(server: LocalServer) -> list[int]:
    m = scrape(server)
    return [int(m.get(f'shardstream_worker_ranks{{worker="{slot}"}}', -1)) for slot in (0, 1)]


_UNAVAILABLE_READS = (
    'grpc_server_handled_total{grpc_code="Unavailable",grpc_method="DoGet",'
    'grpc_service="arrow.flight.protocol.FlightService",grpc_type="server_stream"}'
)


def _decisions(server: LocalServer, reason: str) -> float:
    return scrape(server)[f'shardstream_autoscale_decisions_total{{reason="{reason}"}}']


def test_stalled_trainers_grow_the_workers_then_slow_ones_shrink_them_without_losing_a_sample(
    auto_server: LocalServer, tmp_path: Path
) -> None:
    assert len(auto_server.info()["workers"]) == 1  # auto starts at one
    assert _decisions(auto_server, "stall_above_target") == 0
    # 1. trainers that only wait for data: the stall grows the server to its most, 2 workers
    fast = _Trainers(auto_server, "autoscale-fast")
    try:
        fast.wait_for(lambda: len(auto_server.info()["workers"]) == 2, "a second worker")
        m = scrape(auto_server)
        assert m['shardstream_autoscale_decisions_total{reason="stall_above_target"}'] == 1
        assert m["shardstream_workers"] == 2
        # the running ranks' streams spread over both: the first worker hands some back at a step
        # boundary, and their clients resume on the new one (server/serving/placement.py)
        # (an epoch here is one message: a rank opens its next epoch's stream as that message arrives,
        # so it holds one or two streams at a time; the rounds count ranks, once each)
        fast.wait_for(lambda: _spread(_ranks_per_worker(auto_server)), "the ranks spread over both workers")
        m = scrape(auto_server)
        assert m["shardstream_rebalance_rounds_total"] >= 1 and m["shardstream_streams_rebalanced_total"] >= RANKS // 2
        # handed over, not broken: each moved rank opened its successor where the old stream ended
        # (ReadHeader.move_at), so no stream ended UNAVAILABLE and no client retried
        assert m.get(_UNAVAILABLE_READS, 0) == 0, "a moved stream ended UNAVAILABLE"
        fast.wait_for(lambda: min(len(g) for g in fast.got) >= SHARE, "every rank's first epoch")  # counted
    finally:
        fast.stop()
    reference = [g[:SHARE] for g in fast.got]  # each rank's first epoch, in order
    assert sorted(i for g in reference for i in g) == list(range(ROWS))  # each sample exactly once
    assert _decisions(auto_server, "capacity_to_spare") == 0  # no flapping back while stalled
    log = (tmp_path / "server.log").read_text()
    assert "autoscale: 1 -> 2 workers (stall_above_target: stall" in log
    # (the first round's counts: 8 and 0, or a few already on the new worker — a next epoch's stream
    # opened ahead asks GetDataset too — on a busy machine)
    assert re.search(r"rebalance: ranks per worker slot \{0: \d+, 1: \d+\} \(mean of the last 5 counts\); asking slot 0 to hand back \d+", log)
    # 2. trainers that compute for a while each step (new ones: their connections spread over both
    # workers): one worker carries them, so the other drains, and its ranks resume on the one left
    slow = _Trainers(auto_server, "autoscale-slow", step_s=1.0)  # simulated compute, not a wait on a condition
    try:
        slow.wait_for(lambda: len(auto_server.info()["workers"]) == 1, "a worker drained")
        assert _decisions(auto_server, "capacity_to_spare") == 1
        # then a whole epoch more: past what any stream had sent ahead when its worker drained (the
        # drained worker's ranks resumed, or opened their next epoch, on the worker left)
        after = [len(g) for g in slow.got]
        slow.wait_for(lambda: all(len(g) > n + SHARE for g, n in zip(slow.got, after, strict=True)), "an epoch more a rank")
    finally:
        slow.stop()
    for r, g in enumerate(slow.got):  # the same samples in the same order as the first run: none lost or repeated
        assert g[:SHARE] == reference[r] and g[SHARE : 2 * SHARE] == reference[r][: len(g) - SHARE], f"rank {r}"
    log = (tmp_path / "server.log").read_text()
    assert "autoscale: 2 -> 1 workers (capacity_to_spare: stall" in log and "drained, exit code 0" in log


def _two_free_ports() -> int:
    """A port P with P + 1 free too (--data-port P: worker 1 serves P + 1)."""
    for _ in range(100):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            try:
                b.bind(("127.0.0.1", a.getsockname()[1] + 1))
            except OSError:
                continue
            return int(a.getsockname()[1])
    raise AssertionError("no two free ports in a row")


def test_a_worker_that_cannot_be_added_leaves_the_server_serving(slow_root: Path, tmp_path: Path) -> None:
    server = LocalServer(slow_root, metrics=True, workers="auto", log_path=tmp_path / "server.log",
                         extra_args=("--max-workers", "2", "--autoscale-interval", "0.2", "--transform-threads", "1"))  # fmt: skip
    server.data_port = _two_free_ports()
    log = tmp_path / "server.log"
    try:
        server.start()  # worker 1's data port is checked free here, then taken by someone else
        with socket.socket() as other:
            other.bind(("127.0.0.1", server.data_port + 1))
            other.listen()
            fast = _Trainers(server, "autoscale-blocked")
            try:
                fast.wait_for(lambda: "did not serve" in log.read_text(), "the failed start logged")
            finally:
                fast.stop()
        assert "staying at 1 workers" in log.read_text()
        assert len(server.info()["workers"]) == 1 and scrape(server)["shardstream_workers"] == 1
        assert server.proc is not None and server.proc.poll() is None  # still serving
    finally:
        server.stop()
