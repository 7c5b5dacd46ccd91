"""What trainers tell the fleet: each rank's data stall and consumption, reported on the data port (DESIGN §11).

    DoAction "loader.report" {"job": J, "rank": r, "window_s": w, "wait_s": s, "samples": n[, "worker": k]} -> {}

A Loader with `report_interval_s` (client/transport/stall_report.py) sends one every interval to the
server it reads from: over the last `window_s` seconds its training loop waited `wait_s` for data
and took `samples` samples (`worker`: the DataLoader worker of the rank that reads, when a rank's
steps are split among several: each is a reader of its own). This process keeps each reader's latest
report and exports per job

    shardstream_job_data_stall_ratio{job_name}               mean of wait_s / window_s over the job's ranks
    shardstream_job_consumption_samples_per_second{job_name} Σ samples / window_s over the job's ranks
    shardstream_job_reporting_ranks{job_name}                ranks with a live report

and its own throughput, `shardstream_server_samples_per_second` (samples it sent over the last
THROUGHPUT_WINDOW_S, counted as the data plane counts its streams' rows). deploy/prometheus/scaling.yaml
turns them into `shardstream_fleet_desired_servers`; `shardstream fleet recommend` reads them.

Bounds: the body is at most MAX_REPORT_BYTES (refused before it is parsed: INVALID_ARGUMENT), every
field is checked (a job is a name, a rank below MAX_WORLD_SIZE, 0 <= wait_s <= window_s <= 1 h,
samples a count); a report expires after EXPIRY_INTERVALS of its own window (a rank that stopped, or
moved to another server, leaves the mean); at most MAX_JOBS jobs are tracked, the least recently
reported one (and its series) dropped for a new one, and MAX_RANKS_TRACKED ranks in all. The
`job_name` label (the trainers' own series use that name; `job` is Prometheus' target label) is thus
one of at most MAX_JOBS values at a time: the series of a job dropped or expired are removed.

Who may: any caller the data port authenticates (a Read stream's credentials: a token, or a grant
with its proof over the body); a report only moves metrics. With several workers per server each
worker keeps the reports of the ranks its connections carry; the supervisor sums consumption, ranks
and throughput over them and takes the largest stall ratio (multiprocess modes below).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge

from shardstream.errors import InvalidArgumentError, excerpt
from shardstream.limits import MAX_WORLD_SIZE
from shardstream.names import validate_name

__all__ = [
    "CONSUMPTION",
    "MAX_JOBS",
    "MAX_REPORT_BYTES",
    "REPORT_ACTION",
    "SERVER_SAMPLES_RATE",
    "STALL",
    "JobReports",
    "count_sent",
]

REPORT_ACTION = "loader.report"
MAX_REPORT_BYTES = 1024  # a report is ~100 bytes of JSON
MAX_WORKERS = 1024  # DataLoader workers of one rank
MAX_JOBS = 64  # jobs tracked (and `job` label values) per process
MAX_RANKS_TRACKED = 65_536  # ranks of all jobs together per process
MAX_WINDOW_S = 3600.0
EXPIRY_INTERVALS = 3  # a rank's report counts for this many of its windows
THROUGHPUT_WINDOW_S = 60.0  # the server's samples per second: over the last minute
SWEEP_S = 5.0  # how often expired reports leave and the throughput gauge is recomputed

STALL = Gauge(
    "shardstream_job_data_stall_ratio",
    "Share of wall time the job's training loops waited for data, mean over its ranks reporting here (0-1)",
    ["job_name"],
    multiprocess_mode="livemax",
)
CONSUMPTION = Gauge(
    "shardstream_job_consumption_samples_per_second",
    "Samples per second the job's training loops took, summed over its ranks reporting here",
    ["job_name"],
    multiprocess_mode="livesum",
)
RANKS = Gauge(
    "shardstream_job_reporting_ranks", "Ranks of the job whose reports here are live", ["job_name"], multiprocess_mode="livesum"
)
SERVER_SAMPLES_RATE = Gauge(
    "shardstream_server_samples_per_second",
    f"Samples this server sent per second over the last {THROUGHPUT_WINDOW_S:g} s",
    multiprocess_mode="livesum",
)
SERVER_SAMPLES_RATE.set(0)


@dataclass(frozen=True)
class Report:
    """One rank's report: over `window_s` it waited `wait_s` and took `samples`; `at` is when it came."""

    window_s: float
    wait_s: float
    samples: int
    at: float

    @property
    def stall(self) -> float:
        return min(1.0, self.wait_s / self.window_s)

    @property
    def rate(self) -> float:
        return self.samples / self.window_s


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not low <= value <= high:
        raise InvalidArgumentError(f"{REPORT_ACTION}: {key} must be a number from {low:g} to {high:g}, got {excerpt(value)}")
    return float(value)


def parse_report(raw: bytes, now: float) -> tuple[str, tuple[int, int], Report]:
    """(job, (rank, worker), report) of a report's body; INVALID_ARGUMENT naming what is wrong (before parsing
    when the body is over MAX_REPORT_BYTES)."""
    if len(raw) > MAX_REPORT_BYTES:
        raise InvalidArgumentError(f"a {REPORT_ACTION} body is {len(raw)} bytes, over {MAX_REPORT_BYTES}")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        raise InvalidArgumentError(f"a {REPORT_ACTION} body must be a JSON object")
    job = validate_name(body.get("job"), "job")
    rank = body.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_WORLD_SIZE:
        raise InvalidArgumentError(f"{REPORT_ACTION}: rank must be an int from 0 to {MAX_WORLD_SIZE - 1}, got {excerpt(rank)}")
    worker = body.get("worker", 0)
    if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < MAX_WORKERS:
        raise InvalidArgumentError(f"{REPORT_ACTION}: worker must be an int from 0 to {MAX_WORKERS - 1}, got {excerpt(worker)}")
    window = _number(body, "window_s", 0.001, MAX_WINDOW_S)
    wait = _number(body, "wait_s", 0.0, window)
    samples = int(_number(body, "samples", 0, 2**53))
    return job, (rank, worker), Report(window, wait, samples, now)


class _Throughput:
    """Samples sent, as a rate over the last THROUGHPUT_WINDOW_S (a few points of the running total)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.total = 0
        self._points: deque[tuple[float, int]] = deque([(clock(), 0)])

    def add(self, samples: int) -> None:
        with self._lock:
            self.total += samples

    def rate(self) -> float:
        """Samples per second since the oldest point of the window (and a new point now)."""
        now = self._clock()
        with self._lock:
            points = self._points
            if now - points[-1][0] >= 1.0:  # a point a second at most, however many reports come
                points.append((now, self.total))
            while len(points) > 2 and now - points[1][0] >= THROUGHPUT_WINDOW_S:
                points.popleft()
            t0, n0 = points[0]
        return (self.total - n0) / (now - t0) if now > t0 else 0.0


class JobReports:
    """The live reports of this process, by job and rank, and the gauges made of them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, dict[tuple[int, int], Report]] = OrderedDict()  # least recently reported first
        self._ranks = 0
        self.sent = _Throughput(clock)
        self._sweeper: threading.Thread | None = None

    def report(self, raw: bytes) -> dict[str, Any]:
        """Take one report's body (see parse_report); the answer is {}."""
        job, reader, report = parse_report(raw, self._clock())
        with self._lock:
            ranks = self._jobs.get(job)
            if ranks is None:
                while len(self._jobs) >= MAX_JOBS:
                    self._drop(next(iter(self._jobs)))
                ranks = self._jobs[job] = {}
            self._jobs.move_to_end(job)
            if reader not in ranks:
                if self._ranks >= MAX_RANKS_TRACKED:
                    raise InvalidArgumentError(f"this server tracks {MAX_RANKS_TRACKED} reporting ranks already")
                self._ranks += 1
            ranks[reader] = report
            self._export(job)
        SERVER_SAMPLES_RATE.set(self.sent.rate())
        self.start_sweeping()
        return {}

    def _drop(self, job: str) -> None:
        ranks = self._jobs.pop(job)
        self._ranks -= len(ranks)
        for gauge in (STALL, CONSUMPTION, RANKS):
            try:
                gauge.labels(job).set(0)  # with several workers the supervisor keeps the last value: 0 ranks
                gauge.remove(job)
            except KeyError:
                pass

    def _export(self, job: str) -> None:
        """The job's gauges from its live reports (under the lock)."""
        reports = self._jobs[job].values()
        STALL.labels(job).set(sum(r.stall for r in reports) / len(reports))
        CONSUMPTION.labels(job).set(sum(r.rate for r in reports))
        RANKS.labels(job).set(len({rank for rank, _ in self._jobs[job]}))

    def sweep(self) -> None:
        """Drop the reports older than EXPIRY_INTERVALS of their window (a job with none left goes,
        its series with it) and recompute the server's throughput."""
        now = self._clock()
        with self._lock:
            for job in list(self._jobs):
                ranks = self._jobs[job]
                for rank in [r for r, rep in ranks.items() if now - rep.at > EXPIRY_INTERVALS * rep.window_s]:
                    del ranks[rank]
                    self._ranks -= 1
                if ranks:
                    self._export(job)
                else:
                    self._drop(job)
        SERVER_SAMPLES_RATE.set(self.sent.rate())

    def jobs(self) -> dict[str, dict[tuple[int, int], Report]]:
        """A copy of the live reports (for tests and the log)."""
        with self._lock:
            return {job: dict(ranks) for job, ranks in self._jobs.items()}

    def start_sweeping(self) -> None:
        """Start the thread that sweeps every SWEEP_S (once; on the first report or stream)."""
        if self._sweeper is not None:
            return
        with self._lock:
            if self._sweeper is not None:
                return
            self._sweeper = threading.Thread(target=self._sweep_forever, name="shardstream-job-reports", daemon=True)
        self._sweeper.start()

    def _sweep_forever(self) -> None:
        stop = threading.Event()  # never set: the thread lives as long as the process
        while not stop.wait(SWEEP_S):
            self.sweep()


# One per process: the data plane's streams count what they send here, its DoActions report here
_REPORTS = JobReports()


def job_reports() -> JobReports:
    """This process's reports (one per process, as its metrics are)."""
    return _REPORTS


def count_sent(samples: int) -> None:
    """`samples` more sent by a Read stream of this process (the data plane counts them as it flushes its
    stream metrics); starts the sweep that keeps the throughput gauge fresh."""
    _REPORTS.sent.add(samples)
    _REPORTS.start_sweeping()
