"""The processes of the rank simulator (`python -m loadtest.scale`): a redis-server, M `shardstream
serve` processes, P rank processes (loadtest/scale_ranks.py) holding the simulated ranks, and the
figures read from them around each scenario (CPU, RSS, Redis INFO, RPCs started per method)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from shardstream.server.local_fleet import LocalServer

from .fleet import tree_cpu_s, tree_peak_rss_mib, tree_reset_peak
from .redis_server import RedisServer

__all__ = ["RankWorker", "ScaleFleet", "Snapshot", "rpc_delta", "server_rpcs"]

# Every simulated rank connects from 127.0.0.1: the per-peer stream limit (256 by default, meant
# for the 8 ranks of one host) would refuse a server's 257th stream, which is not what a fleet of
# 1,000 hosts meets. The simulator lifts it (and the per-server limit) so the real limits show.
SERVER_ARGS = ("--max-streams-per-peer", "100000", "--max-streams", "100000")
# Read with the RPCs started: what the servers sent (messages run ahead of the ranks' steps).
SERVER_COUNTERS = (
    "shardstream_messages_sent_total",
    "shardstream_bytes_sent_total",
    # the checkpoint fan-out: chunk bytes read from the checkpoint root and sent to the ranks
    "shardstream_checkpoint_storage_read_bytes_total",
    "shardstream_checkpoint_served_bytes_total",
)


def server_rpcs(server: LocalServer) -> dict[str, float]:
    """grpc_server_started_total of a server by method (both planes) and its SERVER_COUNTERS; {} when down."""
    out: dict[str, float] = {}
    try:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in SERVER_COUNTERS:  # summed over labels
            out[name] = out.get(name, 0.0) + float(line.split()[-1])
        if not line.startswith("grpc_server_started_total{"):
            continue
        labels = line[line.index("{") + 1 : line.index("}")]
        method = next(
            (kv.split("=", 1)[1].strip('"') for kv in labels.split(",") if kv.startswith("grpc_method=")), "?"
        )
        out[method] = out.get(method, 0.0) + float(line.split()[-1])
    return out


def rpc_delta(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float]:
    """Counters' increase between two snapshots, summed over servers; a server restarted in between
    counts from 0 (as Prometheus treats a counter reset), one down at the end counts nothing."""
    out: dict[str, float] = {}
    for i, a in enumerate(after):
        b = before[i] if i < len(before) else {}
        for k, v in a.items():
            d = v - b.get(k, 0.0)
            out[k] = out.get(k, 0.0) + (d if d >= 0 else v)
    return out


def _rss_mib(pid: int) -> float:
    total = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total / (1 << 20)


@dataclass
class Snapshot:
    """What the fleet has done so far, read at one moment."""

    t: float
    server_cpu_s: list[float]
    rank_cpu_s: list[float]
    rpcs: list[dict[str, float]]  # per server (server_rpcs; {} when down)
    redis_commands: int
    redis_memory_bytes: int
    redis_cmdstats: dict[str, int] = field(default_factory=dict)


class RankWorker:
    """One `python -m loadtest.scale_ranks` process: commands in on stdin, one JSON answer a line out."""

    def __init__(self, workdir: Path, index: int, cfg: dict[str, Any]) -> None:
        self.index = index
        config = workdir / f"ranks-{index}.json"
        config.write_text(json.dumps(cfg))
        self.log_path = workdir / f"ranks-{index}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loadtest.scale_ranks", str(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                cwd=Path(__file__).resolve().parent.parent,
                env={**os.environ, "MALLOC_ARENA_MAX": "2"},  # hundreds of threads: cap glibc's arenas
            )
        self.answer_bytes = 0  # the last answer's size, JSON line (the driver reports it per scenario)
        self.answer()  # {"ready": true}

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"rank process {self.index} exited ({self.proc.poll()}):\n" + "\n".join(tail))
        self.answer_bytes = len(line)
        out: dict[str, Any] = json.loads(line)
        return out

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class ScaleFleet:
    """Redis, the servers and the rank processes of one simulator run; `close()` kills them all."""

    def __init__(self, root: str, workdir: Path, servers: int) -> None:
        self.root = root
        self.workdir = workdir
        self.checkpoints = workdir / "checkpoints"  # one checkpoint root for every server, as a shared volume
        self.checkpoints.mkdir(exist_ok=True)
        # As the RUNBOOK asks of a cursor store: an append-only file, fsynced every second.
        self.redis = RedisServer(workdir / "redis", persistent=True, appendfsync="everysec").start()
        self.servers: list[LocalServer] = []
        self.down: set[int] = set()
        self.workers: list[RankWorker] = []
        for _ in range(servers):
            self.add_server()
        self._redis = redis.Redis(port=self.redis.port)

    def add_server(self) -> LocalServer:
        server = LocalServer(
            self.root,
            metrics=True,
            extra_args=(*SERVER_ARGS, "--checkpoint-root", str(self.checkpoints)),
            log_path=self.workdir / f"server-{len(self.servers)}.log",
        )
        self.servers.append(server)
        server.start()
        return server

    def endpoints(self) -> list[str]:
        return [s.target for s in self.servers]

    def kill_server(self, i: int) -> None:
        self.servers[i].kill()
        self.down.add(i)

    def restart_server(self, i: int) -> None:
        self.servers[i].start()
        self.down.discard(i)

    def start_ranks(self, processes: int, cfg: dict[str, Any]) -> None:
        """The ranks dealt round robin over `processes` (each process has ranks on every server)."""
        world = cfg["world_size"]
        for p in range(min(processes, world)):
            self.workers.append(
                RankWorker(self.workdir, p, {**cfg, "ranks": list(range(p, world, processes))})
            )

    def command(self, cmd: dict[str, Any], during: Any = None) -> list[dict[str, Any]]:
        """Send `cmd` to every rank process, call `during()` (if given) while they run, gather the answers."""
        for w in self.workers:
            w.send(cmd)
        if during is not None:
            during()
        return [w.answer() for w in self.workers]

    def snapshot(self) -> Snapshot:
        info = self._redis.info("stats")
        mem = self._redis.info("memory")
        cmdstats = self._redis.info("commandstats")
        rpcs = [server_rpcs(s) if i not in self.down else {} for i, s in enumerate(self.servers)]
        return Snapshot(
            t=time.perf_counter(),
            server_cpu_s=[
                tree_cpu_s(s.pid) if i not in self.down else 0.0 for i, s in enumerate(self.servers)
            ],
            rank_cpu_s=[tree_cpu_s(w.proc.pid) for w in self.workers],
            rpcs=rpcs,
            redis_commands=int(info["total_commands_processed"]),
            redis_memory_bytes=int(mem["used_memory"]),
            redis_cmdstats={k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in cmdstats.items()},
        )

    def reset_peaks(self) -> None:
        for i, s in enumerate(self.servers):
            if i not in self.down:
                tree_reset_peak(s.pid)

    def server_memory(self) -> dict[str, list[float | None]]:
        """RSS now and peak RSS since reset_peaks() of every server (MiB; None when down)."""
        return {
            "rss_mib": [None if i in self.down else _rss_mib(s.pid) for i, s in enumerate(self.servers)],
            "peak_rss_mib": [
                None if i in self.down else tree_peak_rss_mib(s.pid) for i, s in enumerate(self.servers)
            ],
        }

    def rank_rss_mib(self) -> list[float]:
        return [_rss_mib(w.proc.pid) for w in self.workers]

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.send({"op": "exit"})
        deadline = time.monotonic() + 30
        for w in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            w.kill()
        for s in self.servers:
            s.stop()
        self._redis.close()
        self.redis.kill()
