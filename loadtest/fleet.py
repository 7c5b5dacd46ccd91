"""Processes of a load test: servers' /metrics, their data ports, plain Flight reads of a Read stream,
rank processes, and a CPU/RSS sampler for all of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import psutil
import pyarrow.flight as flight

from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

from .rank import peak_rss_mib, reset_peak_rss

__all__ = [
    "SERVER_METRICS",
    "DoGetClients",
    "RankProcess",
    "Sampler",
    "data_ports",
    "doget_bytes",
    "scrape",
    "tree_cpu_s",
    "tree_threads_cpu_s",
]

# Counters scraped from every server before and after the measured window.
SERVER_METRICS = (
    "shardstream_storage_read_bytes_total",  # decoded row-group bytes read from storage (local or S3)
    "shardstream_storage_fetched_bytes_total",  # bytes fetched from remote storage (S3 only)
    "shardstream_storage_reads_total",
    "shardstream_bytes_sent_total",
    "shardstream_messages_sent_total",
    "shardstream_batches_sent_total",
    "shardstream_rows_sent_total",
    "shardstream_cache_hits_total",
    "shardstream_cache_misses_total",
)
STOP_TIMEOUT_S = 10.0


def scrape(server: LocalServer, names: tuple[str, ...] = SERVER_METRICS) -> dict[str, float]:
    """The server's unlabelled metrics `names` (0 when absent)."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        name = parts[0].partition("{")[0] if parts else ""  # summed over labels (dataset)
        if len(parts) >= 2 and name in out:
            out[name] += float(parts[-1])
    return out


GET_DATASET = "/shardstream.v1.ShardStream/GetDataset"


def data_ports(server: LocalServer, dataset: str, timeout_s: float = 30.0) -> list[int]:
    """The Flight data ports of a server's workers (one per worker process), sorted.

    A single process names its own in the ready file. A supervisor started on free ports does not:
    each worker's port is what that worker answers to GetDataset (DatasetInfo.data_port), and a new
    connection reaches the worker the kernel's SO_REUSEPORT hash picks, so GetDatasets on fresh
    channels are asked until every worker has answered (or `timeout_s`: the ports seen so far)."""
    want = max(1, len(server.worker_pids))
    if want == 1 and server.data_port:
        return [server.data_port]
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    req = pb.GetDatasetRequest(dataset=dataset)
    while len(seen) < want and time.monotonic() < deadline:
        with grpc.insecure_channel(server.target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            get = ch.unary_unary(
                GET_DATASET,
                request_serializer=pb.GetDatasetRequest.SerializeToString,
                response_deserializer=pb.DatasetInfo.FromString,
            )
            port = get(req, timeout=10).data_port
        if not port:
            raise RuntimeError(f"{server.target} names no data port in its GetDataset answer")
        seen.add(port)
    if not seen:
        raise TimeoutError(f"no data port from {server.target} in {timeout_s:g} s")
    return sorted(seen)


def doget_bytes(client: flight.FlightClient, request: pb.ReadRequest) -> int:
    """One Read stream as a plain Arrow Flight DoGet (the ticket is the serialized ReadRequest):
    bytes received, the record batches' buffers plus their app_metadata (each message's ReadHeader).
    Nothing is decoded beyond what Flight's reader does."""
    reader = client.do_get(flight.Ticket(request.SerializeToString()))
    n = 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return n
        if chunk.data is not None:
            n += chunk.data.nbytes
        if chunk.app_metadata is not None:
            n += chunk.app_metadata.size


class DoGetClients:
    """Plain Flight clients to a server's data ports (`data_ports`), one per port, opened on first
    use and kept; one thread's (a FlightClient is not shared between threads here). `read(i, req)`
    sends request i to port i mod len(ports): a rank's calls spread evenly over the workers."""

    def __init__(self, ports: list[int], host: str = "127.0.0.1") -> None:
        self.ports = ports
        self.host = host
        self._clients: dict[int, flight.FlightClient] = {}

    def read(self, i: int, request: pb.ReadRequest) -> int:
        port = self.ports[i % len(self.ports)]
        client = self._clients.get(port)
        if client is None:
            client = self._clients[port] = flight.connect(f"grpc://{self.host}:{port}")
        return doget_bytes(client, request)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def __enter__(self) -> DoGetClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (e.g. server worker processes)."""
    total = 0.0
    for p in _tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def tree_threads_cpu_s(pid: int, prefix: str) -> float:
    """CPU seconds of the threads of a process and its children whose name, as Linux shows it
    (shardstream.threads.name_native: e.g. the data plane's "flight-build_0"), starts with `prefix`:
    their time on a CPU from /proc/PID/task/TID/schedstat, in nanoseconds (user + system time there
    come in 10 ms ticks, ~25% of a build thread's share of a 1 GB pass). Ended threads do not count."""
    total_ns = 0
    for p in _tree(pid):
        tasks = f"/proc/{p.pid}/task"
        try:
            tids = os.listdir(tasks)
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"{tasks}/{tid}/comm") as f:
                    if not f.read().startswith(prefix):
                        continue
                with open(f"{tasks}/{tid}/schedstat") as f:
                    total_ns += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total_ns / 1e9


def tree_reset_peak(pid: int) -> None:
    for p in _tree(pid):
        reset_peak_rss(p.pid)


def tree_peak_rss_mib(pid: int) -> float | None:
    """The largest peak RSS of the process and its children (each process has its own)."""
    peaks = [peak_rss_mib(p.pid) for p in _tree(pid)]
    known = [x for x in peaks if x is not None]
    return max(known) if known else None


class RankProcess:
    """`python -m loadtest.rank CONFIG` in its own process group."""

    def __init__(self, workdir: Path, cfg: dict[str, Any]) -> None:
        r = cfg["rank"]
        self.rank = r
        self.cfg = {
            **cfg,
            "ready_path": str(workdir / f"rank-{r}.ready"),
            "result_path": str(workdir / f"rank-{r}.json"),
            "record_path": str(workdir / f"rank-{r}.npz"),
        }
        self.config_path = workdir / f"rank-{r}.config.json"
        self.log_path = workdir / f"rank-{r}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        self.config_path.write_text(json.dumps(self.cfg))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loadtest.rank", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=Path(__file__).resolve().parent.parent,
                env={**os.environ, **(env or {})},
            )

    @property
    def ready(self) -> bool:
        return Path(self.cfg["ready_path"]).exists()

    def check_alive(self, what: str) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None and (code != 0 or what == "ready"):
            raise RuntimeError(f"rank {self.rank} exited with code {code} before {what}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def result(self) -> dict[str, Any]:
        return json.loads(Path(self.cfg["result_path"]).read_text())

    def kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self.proc = None


class Sampler:
    """A thread sampling CPU % and RSS of named process trees every `interval_s` (for the plot)."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.25) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadtest-sampler", daemon=True)
        self._t0 = 0.0

    def __enter__(self) -> Sampler:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        last = {name: (time.perf_counter(), tree_cpu_s(pid)) for name, pid in self.pids.items()}
        while not self._stop.wait(self.interval_s):
            for name, pid in self.pids.items():
                if not _tree(pid):
                    continue  # exited
                now, cpu = time.perf_counter(), tree_cpu_s(pid)
                t_prev, cpu_prev = last[name]
                last[name] = (now, cpu)
                rss = 0
                for p in _tree(pid):
                    try:
                        rss += p.memory_info().rss
                    except psutil.NoSuchProcess:
                        pass
                pct = 100.0 * (cpu - cpu_prev) / (now - t_prev) if now > t_prev else 0.0
                self.samples[name].append((now - self._t0, max(0.0, pct), rss / (1 << 20)))
