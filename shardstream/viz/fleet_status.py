"""The fleet and the jobs, for the web app: each server's health and load, each job's committed steps
and the checkpoints the fleet keeps for it.

Health is grpc.health.v1 `Check` (the probe Kubernetes runs), sent as raw bytes so the web extra
needs no health-checking package; load comes from a server's Prometheus `/metrics`: streams active
and rows sent, whose rate is measured between two scrapes. Jobs come from a cursor store, read only
(an embedded SQLite store that does not exist holds no jobs and is not created); their checkpoints
from the servers (`serve --checkpoint-root`), through the Checkpointer's public API: `steps()` and
each step's `manifest()` (what `shardstream checkpoint list|show` print).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from shardstream.client import DEFAULT_STORE_URL, ChannelSecurity, CursorRecord, open_store

__all__ = ["CheckpointRow", "FleetMonitor", "JobStep", "ServerStatus", "job_checkpoints", "job_steps", "list_jobs"]

HEALTH = ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")
RATE_WINDOW_S = 0.5  # a first visit scrapes twice, this far apart


@dataclass(frozen=True)
class ServerStatus:
    endpoint: str
    health: str
    metrics_url: str | None
    streams: float | None = None
    rows_total: float | None = None
    rows_per_s: float | None = None
    error: str = ""


def check_health(endpoint: str, timeout_s: float = 3.0, security: ChannelSecurity | None = None) -> str:
    """grpc.health.v1.Health/Check with the empty service name: SERVING, NOT_SERVING, or why not
    (over TLS when `security` has it: health shares the port)."""
    with (security or ChannelSecurity()).channel(endpoint, []) as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            raw: bytes = call(b"", timeout=timeout_s)
        except grpc.RpcError as exc:
            return f"DOWN ({exc.code().name})"
    # HealthCheckResponse { ServingStatus status = 1; }: field 1, varint (absent = 0 = UNKNOWN)
    status = raw[1] if len(raw) >= 2 and raw[0] == 0x08 else 0
    return HEALTH[status] if status < len(HEALTH) else str(status)


def scrape(url: str, timeout_s: float = 3.0) -> dict[str, float]:
    """{'name{labels}': value}, and {'name': the sum over its label sets} of labelled series."""
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - an operator's URL
        for line in resp.read().decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    continue
                if "{" in key:
                    name = key.partition("{")[0]
                    sums[name] = sums.get(name, 0.0) + out[key]
    return {**sums, **out}


class FleetMonitor:
    """Scrapes each server's metrics and keeps the last scrape, for rows/s between two visits."""

    def __init__(
        self, endpoints: list[str], metrics_urls: list[str], security: ChannelSecurity | None = None
    ) -> None:
        self.endpoints = endpoints
        self.security = security
        self.metrics_urls = metrics_urls
        self._last: dict[str, tuple[float, float]] = {}  # url -> (time, rows_total)
        self._lock = threading.Lock()

    def _rows(self, url: str) -> tuple[float, float]:
        m = scrape(url)
        return m.get("shardstream_rows_sent_total", 0.0), m.get("shardstream_streams_active", 0.0)

    def status(self) -> list[ServerStatus]:
        out = []
        for i, endpoint in enumerate(self.endpoints):
            url = self.metrics_urls[i] if i < len(self.metrics_urls) else None
            health = check_health(endpoint, security=self.security)
            if url is None:
                out.append(ServerStatus(endpoint, health, None))
                continue
            try:
                rows, streams = self._rows(url)
                now = time.monotonic()
                with self._lock:
                    before = self._last.get(url)
                if before is None:
                    time.sleep(RATE_WINDOW_S)
                    before = (now, rows)
                    rows, streams = self._rows(url)
                    now = time.monotonic()
                with self._lock:
                    self._last[url] = (now, rows)
                rate = (rows - before[1]) / max(1e-6, now - before[0])
                out.append(ServerStatus(endpoint, health, url, streams, rows, rate))
            except OSError as exc:
                out.append(ServerStatus(endpoint, health, url, error=f"metrics unreachable ({exc})"))
        return out


# --- jobs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobStep:
    step: int
    committed: bool
    ranks: list[dict[str, Any]]  # CursorRecord.describe() + seed, shuffle and the LoaderState (links to the step)


def _open(url: str | None) -> Any:
    url = url or DEFAULT_STORE_URL
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None
    return open_store(url)


def list_jobs(url: str | None) -> list[dict[str, Any]]:
    store = _open(url)
    if store is None:
        return []
    try:
        out = []
        for job in store.jobs():
            committed = store.committed(job)
            out.append({"job": job, "committed": len(committed), "latest": committed[-1] if committed else None})
        return out
    finally:
        store.close()


def job_steps(url: str | None, job: str, limit: int = 20) -> list[JobStep]:
    """The job's newest `limit` steps written, each with every rank's cursor."""
    store = _open(url)
    if store is None:
        return []
    try:
        committed = set(store.committed(job))
        out = []
        for step in sorted(store.steps(job), reverse=True)[:limit]:
            ranks = []
            for rank, raw in sorted(store.read(job, step).items()):
                rec = CursorRecord.from_bytes(raw, where=f"job {job!r} step {step} rank {rank}")
                ranks.append({**rec.describe(), "seed": rec.state.seed, "shuffle": rec.state.shuffle, "state": rec.state})
            out.append(JobStep(step, step in committed, ranks))
        return out
    finally:
        store.close()


# --- checkpoints (DESIGN §13) -------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointRow:
    step: int
    world_size: int  # ranks that saved it
    bytes: int  # the state's bytes (every rank's parts)
    age_s: float  # since its commit
    position: str  # rank 0's data position: "epoch E offset O, step S", "-" when saved without a Loader

    @property
    def age(self) -> str:
        """The age in its largest unit: 42s, 7m, 3h, 2d."""
        for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
            if self.age_s >= seconds:
                return f"{int(self.age_s // seconds)}{unit}"
        return f"{max(0, int(self.age_s))}s"


def _position(part: dict[str, Any]) -> str:
    loader = part.get("loader") or {}
    if "offset" not in loader:
        return "-"
    steps = f", step {loader['steps']}" if "steps" in loader else ""
    return f"epoch {loader['epoch']} offset {loader['offset']}{steps}"


def job_checkpoints(
    endpoints: list[str], job: str, *, tls: Any = None, token: str | None = None, limit: int = 20
) -> tuple[list[CheckpointRow], str]:
    """The job's newest `limit` committed checkpoints, newest first, and a note saying why there are
    none when the fleet cannot list them ("" when it can: no checkpoint yet is an empty list)."""
    from shardstream.checkpoint import Checkpointer  # its public path; imported when asked (its metrics)
    from shardstream.errors import FailedPreconditionError, InvalidArgumentError, ShardstreamError

    try:
        ck = Checkpointer(endpoints, job=job, tls=tls, token=token)
    except InvalidArgumentError as exc:  # a cursor-store job name that no checkpoint job can have
        return [], str(exc)
    with ck:
        try:
            steps = ck.steps()
        except FailedPreconditionError:
            return [], "the servers keep no checkpoints (serve --checkpoint-root URL)"
        except ShardstreamError as exc:
            return [], f"checkpoints unavailable: {exc}"
        rows, now = [], time.time()
        for step in sorted(steps, reverse=True)[:limit]:
            m = ck.manifest(step)
            part = m["parts"][0] if m.get("parts") else {}
            rows.append(CheckpointRow(step, m["world_size"], m["bytes"], now - m["committed_s"], _position(part)))
        return rows, ""
