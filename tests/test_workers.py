"""`serve --workers N`: one port, N processes — same bytes, summed metrics, drain, restart, port checks.
Read-ahead and the cache's accounting. Real server processes on loopback; no sleeps, no timings."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from shardstream.client import Loader
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.v1 import shardstream_pb2 as pb

from .support.data import N_ROWS
from .support.doget import wire_messages, wire_messages_on
from .support.servers import rpc_count, scrape, wait_for

Factory = Callable[..., LocalServer]
REPO = Path(__file__).resolve().parent.parent


def delivered(target: str, **kw: object) -> list[pa.RecordBatch]:
    with Loader([target], "toy@1", output="arrow", provenance=True, **kw) as ld:  # type: ignore[arg-type]
        return list(ld)


@pytest.fixture(scope="module")
def pair(data_root: Path) -> Iterator[tuple[LocalServer, LocalServer]]:
    """One single-process server and one of 2 workers, over the same root."""
    one = LocalServer(data_root, metrics=True, workers=1)
    two = LocalServer(data_root, metrics=True, workers=2)
    try:
        one.start()
        two.start()
        yield one, two
    finally:
        one.stop()
        two.stop()


@pytest.mark.parametrize(
    ("seed", "world", "batch", "shuffle"),
    [(0, 1, 64, "block"), (1, 3, 17, "block"), (2, 4, 5, "full"), (3, 2, 100, "none"), (4, 5, 9, "block")],
)
def test_two_workers_deliver_the_same_bytes_in_the_same_order(
    pair: tuple[LocalServer, LocalServer], seed: int, world: int, batch: int, shuffle: str
) -> None:
    one, two = pair
    mode = {"none": False, "block": True, "full": "full"}[shuffle]
    for rank in range(world):
        kw = dict(batch_size=batch, rank=rank, world_size=world, seed=seed, shuffle=mode, epochs=2)
        # one step per message: many messages, each built by whichever worker holds the stream
        a = delivered(one.target, **kw, max_message_bytes=1)
        b = delivered(two.target, **kw, max_message_bytes=1)
        c = delivered(two.target, **kw)  # coalesced messages
        assert len(a) == len(b) == len(c) > 0
        for x, y, z in zip(a, b, c, strict=True):
            assert x.equals(y) and x.equals(z)  # rows, columns and provenance (_shard, _row)


def _established(pid: int, port: int) -> set[tuple[str, int]]:
    """The clients' addresses of the connections established to `port` in process `pid`."""
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return {tuple(c.raddr) for c in conns if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED}


def connections_on_every_worker(server: LocalServer) -> list[grpc.Channel]:
    """Channels (one connection each) opened until every worker holds at least one (at most 64).

    A new connection lands on a worker the kernel picks (a hash of the addresses); 64 tries all on
    one of 2 workers has a probability of 2^-63.
    """
    server.info()
    # connections there before (server.info()'s may still be closing): not counted, by client address
    base = {p: _established(p, server.port) for p in server.worker_pids}

    def held() -> list[int]:
        return [len(_established(p, server.port) - base[p]) for p in server.worker_pids]

    channels: list[grpc.Channel] = []
    while len(channels) < 64 and not all(held()):
        # its own connection (channels with equal arguments would share one)
        ch = grpc.insecure_channel(server.target, options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(ch)
        grpc.channel_ready_future(ch).result(timeout=30)
        wait_for(lambda: sum(held()) == len(channels), "the worker to accept the new connection")
    assert all(held()), held()
    return channels


def raw_read(ch: grpc.Channel, **kw: object) -> list[tuple[bytes, bytes]]:
    """A Read on the data plane of the worker that holds connection `ch`, as wire bytes."""
    return wire_messages(ch, pb.ReadRequest(world_size=1, **kw))  # type: ignore[arg-type]


def test_streams_land_on_every_worker_and_metrics_are_summed(pair: tuple[LocalServer, LocalServer]) -> None:
    _, two = pair
    two.info()
    assert len(two.worker_pids) == 2 and two.pid not in two.worker_pids
    before = scrape(two)
    channels = connections_on_every_worker(two)
    try:
        for ch in channels:  # one Read on each connection
            assert raw_read(ch, dataset="toy@1", batch_size=100)
    finally:
        for ch in channels:
            ch.close()
    after = scrape(two)
    n = len(channels)
    assert rpc_count(after, "Read") - rpc_count(before, "Read") == n
    assert after["shardstream_rows_sent_total"] - before["shardstream_rows_sent_total"] == n * N_ROWS
    assert after["shardstream_streams_active"] == 0
    assert after["shardstream_workers"] == 2
    assert after["shardstream_cache_capacity_bytes"] == 2 * (512 << 20)  # 1 GiB split between 2


def test_sigterm_to_the_supervisor_drains_every_worker_and_exits_zero(server_factory: Factory) -> None:
    server = server_factory(workers=2)
    workers = [psutil.Process(p) for p in server.info()["workers"]]
    with Loader([server.target], "toy@1", batch_size=7, prefetch=1, max_retries=1) as ld:
        it = iter(ld)
        got = [next(it)["id"]]
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGTERM)  # the supervisor alone: it must reach the workers
        got += [b["id"] for b in it]
    assert server.proc.wait(timeout=60) == 0
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert sorted(np.concatenate(got).tolist()) == list(range(N_ROWS))


def test_every_stop_signal_reaches_the_supervisors_loop() -> None:
    """The supervisor's stop wait, signalled 300 times while it waits with no pause: every signal is
    seen. With a threading.Event set by the handler, about half the signals hung the process for good
    (the handler waits on the lock its own thread holds in Event.wait: StopRequest's docstring)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "from tests.support.stop_signals import main; main()"],
        cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert child.stdout is not None

    def line() -> str:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        return child.stdout.readline().strip() if ready else "(nothing in 60 s: the process hangs)"

    try:
        assert line() == "ready"
        for i in range(300):
            child.send_signal(signal.SIGTERM)
            assert line() == "stopped", f"signal {i + 1}"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()


def test_a_killed_worker_is_replaced_and_no_stream_loses_a_row(server_factory: Factory) -> None:
    server = server_factory(workers=2, metrics=True)
    victim = server.info()["workers"][0]
    kw = dict(batch_size=5, seed=6, prefetch=2, max_message_bytes=1, max_retries=20)
    with Loader([server.target], "toy@1", **kw) as ld:  # type: ignore[arg-type]
        it = iter(ld)
        got = [next(it)["id"] for _ in range(20)]
        os.kill(victim, signal.SIGKILL)  # whichever worker carries the stream, the other serves on
        got += [b["id"] for b in it]
    ids = np.concatenate(got).tolist()
    with Loader([server.target], "toy@1", batch_size=5, seed=6) as ref:
        assert ids == np.concatenate([b["id"] for b in ref]).tolist()
    wait_for(lambda: server.info()["restarts"] == 1, "the supervisor to replace the worker")
    assert len(server.worker_pids) == 2 and victim not in server.worker_pids
    m = scrape(server)
    assert m["shardstream_worker_restarts_total"] == 1 and m["shardstream_workers"] == 2
    assert server.proc is not None and server.proc.poll() is None


def _listening(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_the_ready_file_names_the_data_ports_the_workers_bound(server_factory: Factory) -> None:
    server = server_factory(workers=2)  # --port 0 --data-port 0: each worker takes a free data port
    info = server.info()
    ports = info["data_ports"]
    assert info["data_port"] == ports[0] and len(set(ports)) == 2 and all(isinstance(p, int) for p in ports)
    for pid, port in zip(info["workers"], ports, strict=True):
        assert port in _listening(pid)  # by slot: worker 0's is the data_port
    client = flight.connect(f"grpc://127.0.0.1:{info['data_port']}")
    try:
        request = pb.ReadRequest(dataset="toy@1", batch_size=100, world_size=1).SerializeToString()
        assert client.do_get(flight.Ticket(request)).read_all().num_rows == N_ROWS
    finally:
        client.close()
    victim = info["workers"][0]
    os.kill(victim, signal.SIGKILL)  # its replacement takes another free port: the file follows
    wait_for(lambda: server.info()["restarts"] == 1 and server.info()["workers"][0] != victim, "a new worker 0")
    info = server.info()
    assert info["data_port"] == info["data_ports"][0] in _listening(info["workers"][0])


def test_a_crash_looping_worker_stops_the_supervisor_with_one_line(server_factory: Factory) -> None:
    server = server_factory(workers=2)
    assert server.proc is not None
    killed: set[int] = set()
    while server.proc.poll() is None:  # kill every worker as soon as it serves, until it gives up
        live = set(server.info()["workers"]) - killed
        for pid in live:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        wait_for(
            lambda: server.proc.poll() is not None or bool(set(server.info()["workers"]) - killed),
            "a replacement worker or the supervisor's exit",
        )
    assert server.proc.returncode == 1 and len(killed) > 5


@pytest.mark.parametrize("workers", [1, 2])
def test_a_taken_port_is_one_clear_line(
    workers: int, pair: tuple[LocalServer, LocalServer], data_root: Path
) -> None:
    for holder in pair:  # a single process (no SO_REUSEPORT) and a supervisor of 2
        r = subprocess.run(
            [sys.executable, "-m", "shardstream", "serve", "--root", str(data_root)]
            + ["--port", str(holder.port), "--workers", str(workers)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, r.stderr
        assert "cannot listen" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture(scope="module")
def wide_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 rows of 1 KiB random bytes in row groups of 40 rows (~40 KiB): 50 row groups."""
    base = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(0)
    n = 2000
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "blob": pa.array([rng.bytes(1024) for _ in range(n)], type=pa.binary()),
        }
    )
    pq.write_table(table, base / "wide.parquet")
    ingest(base / "wide.parquet", "wide", base / "root", IngestOptions(row_group_rows=40, progress=False))
    return base / "root"


def test_read_ahead_changes_no_byte_and_turns_misses_into_prefetches(
    server_factory: Factory, wide_root: Path
) -> None:
    """A block-shuffled stream (windows of 4 row groups) through a 1 MiB cache, smaller than the data."""
    runs = {}
    for ahead in (0, 1):
        server = server_factory(
            wide_root, metrics=True, extra_args=("--cache-mib", "1", "--read-ahead", str(ahead))
        )
        kw = dict(batch_size=32, seed=5, shuffle=True, shuffle_window=4, max_message_bytes=1, epochs=2)
        with Loader([server.target], "wide", output="arrow", provenance=True, **kw) as ld:  # type: ignore[arg-type]
            batches = list(ld)
        runs[ahead] = (batches, scrape(server))
        server.stop()
    (plain, m0), (ahead, m1) = runs[0], runs[1]
    assert len(plain) == len(ahead) and all(x.equals(y) for x, y in zip(plain, ahead, strict=True))
    assert m0["shardstream_cache_prefetches_total"] == 0
    assert m1["shardstream_cache_prefetches_total"] > 0
    assert m0["shardstream_cache_evictions_total"] > 0  # the cache is smaller than the data
    assert m0["shardstream_cache_misses_total"] >= 50  # every row group once per epoch, at least
    assert m1["shardstream_cache_misses_total"] < m0["shardstream_cache_misses_total"] / 4
    for m in (m0, m1):  # lookups weighed in bytes too; storage reads cover the misses and prefetches
        assert m["shardstream_cache_hit_bytes_total"] > 0
        assert (m["shardstream_cache_miss_bytes_total"] > 0) == (m["shardstream_cache_misses_total"] > 0)
        assert m["shardstream_storage_reads_total"] == (
            m["shardstream_cache_misses_total"] + m["shardstream_cache_prefetches_total"]
        )
        assert m["shardstream_storage_read_bytes_total"] >= m["shardstream_cache_miss_bytes_total"]


def test_cache_prefetch_then_get_is_one_read_and_a_hit() -> None:
    from shardstream.server.read.cache import LRUCache

    reads: list[str] = []

    def fetch(key: str) -> Callable[[], bytes]:
        return lambda: reads.append(key) or key.encode() * 10

    cache: LRUCache[bytes] = LRUCache(25, sizeof=len)
    assert cache.prefetch("a", fetch("a")) is True
    assert cache.prefetch("a", fetch("a")) is False  # held: refreshed, not read again
    assert cache.get("a", fetch("a")) == b"a" * 10 and reads == ["a"]
    assert "a" in cache and "b" not in cache
    cache.get("b", fetch("b"))
    cache.prefetch("a", fetch("a"))  # refresh: "b" is now the least recently used
    cache.get("c", fetch("c"))  # 30 bytes > 25: evicts "b", keeps "a"
    assert "a" in cache and "b" not in cache and reads == ["a", "b", "c"]
    with pytest.raises(ZeroDivisionError):
        cache.prefetch("z", lambda: 1 // 0)  # type: ignore[arg-type, return-value]
    assert "z" not in cache


def test_usable_cpus_is_the_affinity_at_most() -> None:
    from shardstream.server.serving.cpus import usable_cpus

    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


def test_disk_cache_is_shared_by_workers_and_runs(
    server_factory: Factory, pair: tuple[LocalServer, LocalServer], data_root: Path, tmp_path: Path
) -> None:
    """--cache-dir: a first server reads each row group from storage once and keeps it on disk; a
    second one, of 2 workers, serves every stream (on both workers) from those files."""
    one, _ = pair
    cache_dir = tmp_path / "spill"
    kw = dict(dataset="toy@1", batch_size=64, seed=3, shuffle=pb.Shuffle(mode="block"), max_message_bytes=1)
    reference = raw_read(grpc.insecure_channel(one.target), **kw)
    with Registry(data_root) as reg:
        groups = sum(len(s.row_groups) for s in reg.resolve("toy@1").shards)

    first = server_factory(metrics=True, extra_args=("--cache-dir", str(cache_dir)))
    with grpc.insecure_channel(first.target) as ch:
        assert raw_read(ch, **kw) == reference
    m = scrape(first)
    assert m["shardstream_storage_reads_total"] == groups == m["shardstream_disk_cache_writes_total"]
    assert len(list(cache_dir.glob("*.arrowc"))) == groups
    first.stop()

    second = server_factory(metrics=True, workers=2, extra_args=("--cache-dir", str(cache_dir)))
    # a Read on each worker's own data port (GetDataset names the least busy worker's: placement.py)
    for port in second.info()["data_ports"]:
        assert wire_messages_on(port, pb.ReadRequest(world_size=1, **kw)) == reference  # type: ignore[arg-type]
    m = scrape(second)
    assert m["shardstream_storage_reads_total"] == 0
    assert m["shardstream_disk_cache_hits_total"] == 2 * groups  # each worker loads each group once
    assert m["shardstream_disk_cache_bytes"] > 0


@pytest.mark.parametrize("seed", [1, 2])
def test_servers_sharing_a_cache_dir_read_each_row_group_once_when_cold(
    server_factory: Factory, pair: tuple[LocalServer, LocalServer], data_root: Path, tmp_path: Path, seed: int
) -> None:
    """Two servers start cold on one --cache-dir and serve 6 concurrent ranks (3 each) of one
    block-shuffled epoch: their misses on the same row group coalesce across processes (a lock per
    row group file), so storage is read once per row group for the whole fleet, bytes unchanged."""
    import threading

    one, _ = pair
    cache_dir = tmp_path / "spill"
    servers = [server_factory(metrics=True, extra_args=("--cache-dir", str(cache_dir))) for _ in range(2)]
    kw = dict(batch_size=16, world_size=6, seed=seed, shuffle="block", shuffle_window=4)
    got: dict[int, list[pa.RecordBatch]] = {}

    def rank(r: int) -> None:
        got[r] = delivered(servers[r % 2].target, rank=r, **kw)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(6):
        want = delivered(one.target, rank=r, **kw)
        assert [b.to_pydict() for b in got[r]] == [b.to_pydict() for b in want]
    with Registry(data_root) as reg:
        shards = reg.resolve("toy@1").shards
    groups = sum(len(s.row_groups) for s in shards)
    ends = [np.cumsum(s.row_groups) for s in shards]
    needed = [set(), set()]  # the row groups each server's ranks were served from (the plan decides)
    for r in range(6):
        for b in got[r]:
            for shard, row in zip(b.column("_shard").to_pylist(), b.column("_row").to_pylist(), strict=True):
                needed[r % 2].add((shard, int(np.searchsorted(ends[shard], row, side="right"))))
    reads = [scrape(s)["shardstream_storage_reads_total"] for s in servers]
    hits = [scrape(s)["shardstream_disk_cache_hits_total"] for s in servers]
    assert sum(reads) == groups  # once for the fleet, not once per server
    # the other server found on disk each row group it needed too
    assert sum(hits) == len(needed[0]) + len(needed[1]) - groups


def test_a_damaged_disk_cache_file_is_replaced_from_storage(
    server_factory: Factory, data_root: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "spill"
    kw = dict(dataset="toy@1", batch_size=1009)
    first = server_factory(extra_args=("--cache-dir", str(cache_dir)))
    with grpc.insecure_channel(first.target) as ch:
        reference = raw_read(ch, **kw)
    first.stop()
    victim = sorted(cache_dir.glob("*.arrowc"))[3]
    victim.write_bytes(victim.read_bytes()[:100])  # a truncated file (a rename is atomic, a disk is not)
    second = server_factory(metrics=True, extra_args=("--cache-dir", str(cache_dir)))
    with grpc.insecure_channel(second.target) as ch:
        assert raw_read(ch, **kw) == reference
    m = scrape(second)
    assert m["shardstream_disk_cache_errors_total"] == 1 and m["shardstream_storage_reads_total"] == 1
    assert victim.stat().st_size > 100  # read again and rewritten


def test_an_unusable_cache_dir_is_one_clear_line(data_root: Path, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for workers in ("1", "2"):
        r = subprocess.run(
            [sys.executable, "-m", "shardstream", "serve", "--root", str(data_root), "--port", "0"]
            + ["--workers", workers, "--cache-dir", str(not_a_dir / "sub")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, r.stderr
        assert "cannot use --cache-dir" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_disk_cache_evicts_least_recently_used_files_past_its_capacity(tmp_path: Path) -> None:
    from shardstream.server.read.spill import SpillTier

    table = pa.table({"x": np.arange(1000, dtype=np.int64)})  # ~8 KB as an Arrow file
    tier = SpillTier(tmp_path / "d", capacity_bytes=30_000)
    for g in range(3):
        tier.store("ab" * 32, g, ["x"], table)
        os.utime(tier._path("ab" * 32, g, ["x"]), (g, g))  # distinct, increasing use times
    assert tier.load("ab" * 32, 0, ["x"], 1000) is not None  # touched: now the most recent
    tier.store("ab" * 32, 3, ["x"], table)  # 4 files of ~8.5 KB > 30 KB: the oldest goes (<= 27 KB)
    held = [g for g in range(4) if tier._path("ab" * 32, g, ["x"]).exists()]
    assert held == [0, 2, 3]  # 1 was the least recently used (0 was just read)
    assert tier.load("ab" * 32, 1, ["x"], 1000) is None
    assert tier.load("ab" * 32, 0, ["x"], 999) is None  # other rows than the manifest's: dropped
    assert not tier._path("ab" * 32, 0, ["x"]).exists()


@pytest.mark.parametrize(("before", "after"), [(1, 1), (1, 2), (2, 2), (2, 1)])
def test_a_server_killed_mid_stream_restarts_on_its_port(
    server_factory: Factory, endpoints: list[str], before: int, after: int
) -> None:
    """The killed server's connections linger (TIME_WAIT and the like): the port is free all the same."""
    server = server_factory(workers=before)
    port = server.port
    with Loader([server.target], "toy@1", batch_size=1, prefetch=1, max_message_bytes=1, epochs=None) as ld:
        next(iter(ld))  # a stream in flight, its client not reading: the server's send buffer is full
        server.kill()
        server.workers = after
        server.start()
    assert server.port == port
    # A connection of its own: this process's shared subchannel to the port may still be in the
    # reconnect backoff it entered while the server was down (the first Loader's retries).
    with grpc.insecure_channel(server.target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        got = raw_read(ch, dataset="toy@1", batch_size=100)
    with grpc.insecure_channel(endpoints[0]) as ch:
        assert got == raw_read(ch, dataset="toy@1", batch_size=100)


def test_read_ahead_of_a_mixture_changes_no_byte(server_factory: Factory, endpoints: list[str]) -> None:
    ahead = server_factory(metrics=True, extra_args=("--cache-mib", "1", "--read-ahead", "2"))
    mix = {"toy@1": 0.75, "toy@2": 0.25}
    kw = dict(batch_size=16, world_size=3, rank=1, seed=9, max_message_bytes=1, epochs=2, output="arrow")
    with Loader([endpoints[0]], mix, provenance=True, **kw) as ld:  # type: ignore[arg-type]
        plain = list(ld)
    with Loader([ahead.target], mix, provenance=True, **kw) as ld:  # type: ignore[arg-type]
        read_ahead = list(ld)
    assert len(plain) == len(read_ahead) and all(x.equals(y) for x, y in zip(plain, read_ahead, strict=True))
    assert scrape(ahead)["shardstream_cache_prefetches_total"] > 0


def test_a_killed_supervisors_temporary_directory_is_removed_by_the_next_one() -> None:
    import tempfile

    from shardstream.server.serving.supervisor import TMP_PREFIX, _remove_dead_supervisors_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process (until reused)
    gone = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{dead.pid}-"))
    kept = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
    try:
        _remove_dead_supervisors_dirs()
        assert not gone.exists() and kept.exists()
    finally:
        kept.rmdir()


def _threads_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets every thread of process `pid` may run on."""
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


def test_pinned_workers_each_run_on_one_cpu_of_their_own(server_factory: Factory) -> None:
    """--pin-workers: worker slot i and every thread it started run on the i-th usable CPU only (in
    turn past the last), so a worker is one core's worth; the supervisor itself is not pinned."""
    cpus = sorted(os.sched_getaffinity(0))
    server = server_factory(workers=2, extra_args=("--pin-workers",))
    info = server.info()
    for slot, pid in enumerate(info["workers"]):  # the ready file lists the workers by slot
        assert _threads_cpus(pid) == {frozenset({cpus[slot % len(cpus)]})}, f"worker {slot}"
    assert _threads_cpus(info["pid"]) == {frozenset(cpus)}
    # and it serves as an unpinned server does
    assert sum(b.num_rows for b in delivered(server.target, batch_size=64)) == N_ROWS
    single = server_factory(workers=1, extra_args=("--pin-workers",))
    assert _threads_cpus(single.info()["pid"]) == {frozenset({cpus[0]})}
