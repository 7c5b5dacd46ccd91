"""Processes of a load test: servers' /metrics, rank processes, and a CPU/RSS sampler for all of them."""

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

import psutil

from shardstream.server.fleet import LocalServer

from .rank import peak_rss_mib, reset_peak_rss

__all__ = ["SERVER_METRICS", "RankProcess", "Sampler", "scrape", "tree_cpu_s"]

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
