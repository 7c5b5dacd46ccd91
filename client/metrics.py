"""Client-side Prometheus metrics (prefix shardstream_client_), exposed by the trainer's own process.

Every series carries the Loader's job and rank: `job_name` (its `job=`, "" without one — not `job`,
which is Prometheus' own label for the scrape target: a scraped `job` would be renamed
`exported_job` or, with honor_labels, overwrite the target's; kube-state-metrics names Kubernetes
jobs `job_name` for the same reason) and `rank`. A trainer process runs one rank (or a few), so a
process has few series; the Training dashboard and the data-stall alert aggregate by them.

    shardstream_client_wait_seconds{job_name,rank}                 the data stall: time the training
                                                                   loop waited for each batch (histogram)
    shardstream_client_first_batch_seconds                         time from the loop's start (iter(),
                                                                   a resume included) to its first
                                                                   batch (histogram: one per iteration)
    shardstream_client_batches_total                               batches handed to the training loop
    shardstream_client_bytes_total                                 bytes of Read messages received
    shardstream_client_stream_retries_total                        streams reopened after an error
    shardstream_client_failovers_total                             ... that moved to another endpoint
    shardstream_client_cursor_commits_total                        cursor writes attempted
    shardstream_client_cursor_commits_skipped_total                commits superseded before written
    shardstream_client_cursor_commit_failures_total                cursor writes that failed
    shardstream_client_cursor_commit_seconds                       time to write one cursor (histogram)
    shardstream_client_cursor_last_commit_timestamp_seconds        when the last write succeeded

Two ways to expose them. (1) They live in prometheus-client's default registry: a trainer that
already serves it (its own `start_http_server`, a framework's exporter) exports them as they are;
else `start_metrics_server(port)` serves it. (2) A trainer with its own `CollectorRegistry` calls
`register(registry)`. Either way the process must be a scrape target (a PodMonitor or a static
target); DataLoader worker processes (`num_workers > 0`) count in their own processes, which nobody
scrapes: use `num_workers=0` (the usual choice) for complete client metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = [
    "BATCHES",
    "BYTES",
    "COMMITS",
    "COMMITS_SKIPPED",
    "COMMIT_FAILURES",
    "COMMIT_SECONDS",
    "FAILOVERS",
    "FIRST_BATCH_SECONDS",
    "LABELS",
    "LAST_COMMIT",
    "RETRIES",
    "STEP_COST_RATIO",
    "WAIT_SECONDS",
    "RankMetrics",
    "for_rank",
    "register",
    "start_metrics_server",
]

LABELS = ("job_name", "rank")

# balance= (shardstream/order/balance.py): this rank's share of a step's work against the mean share,
# cost x world_size / step cost — 1 is even; the step waits for its largest (the all-reduce)
STEP_COST_RATIO = Histogram(
    "shardstream_client_step_cost_ratio",
    "This rank's cost of a balanced step (Σ chunk length² of its packed rows, or its samples' cost column) "
    "over the step's mean cost per rank",
    LABELS,
    buckets=(0.5, 0.8, 0.9, 0.95, 1.0, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0, 5.0),
)
WAIT_SECONDS = Histogram(
    "shardstream_client_wait_seconds",
    "Time the training loop waited for its next batch (the data stall)",
    LABELS,
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
)
FIRST_BATCH_SECONDS = Histogram(
    "shardstream_client_first_batch_seconds",
    "Time from the start of an iteration (a resume included) to its first batch handed to the loop",
    LABELS,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
BATCHES = Counter("shardstream_client_batches_total", "Batches handed to the training loop", LABELS)
BYTES = Counter("shardstream_client_bytes_total", "Bytes of Read messages received", LABELS)
RETRIES = Counter("shardstream_client_stream_retries_total", "Read streams restarted after an error", LABELS)
FAILOVERS = Counter(
    "shardstream_client_failovers_total", "Stream restarts that moved to another endpoint", LABELS
)
COMMITS = Counter("shardstream_client_cursor_commits_total", "Cursor commits attempted", LABELS)
COMMITS_SKIPPED = Counter(
    "shardstream_client_cursor_commits_skipped_total",
    "Cursor commits superseded by a newer one before the store caught up",
    LABELS,
)
COMMIT_FAILURES = Counter(
    "shardstream_client_cursor_commit_failures_total", "Cursor commits that failed", LABELS
)
COMMIT_SECONDS = Histogram(
    "shardstream_client_cursor_commit_seconds", "Time to write one cursor to the store", LABELS
)
LAST_COMMIT = Gauge(
    "shardstream_client_cursor_last_commit_timestamp_seconds",
    "When this rank's last cursor commit succeeded (Unix time; 0 before the first)",
    LABELS,
)
_ALL = (
    WAIT_SECONDS,
    BATCHES,
    BYTES,
    RETRIES,
    FAILOVERS,
    COMMITS,
    COMMITS_SKIPPED,
    COMMIT_FAILURES,
    COMMIT_SECONDS,
    LAST_COMMIT,
    FIRST_BATCH_SECONDS,
    STEP_COST_RATIO,
)


@dataclass(frozen=True)
class RankMetrics:
    """The metrics of one (job, rank), labelled once (the hot paths only call inc/observe)."""

    wait_seconds: Any
    batches: Any
    bytes: Any
    retries: Any
    failovers: Any
    commits: Any
    commits_skipped: Any
    commit_failures: Any
    commit_seconds: Any
    last_commit: Any
    first_batch_seconds: Any
    step_cost_ratio: Any


_ranks: dict[tuple[str, str], RankMetrics] = {}


def for_rank(job: str | None, rank: int) -> RankMetrics:
    """The labelled metrics of `job`'s `rank` (every series exported from the start, at 0)."""
    key = (job or "", str(rank))
    found = _ranks.get(key)
    if found is None:
        found = _ranks[key] = RankMetrics(*(m.labels(*key) for m in _ALL))
    return found


def register(registry: CollectorRegistry) -> None:
    """Also expose the client metrics through `registry` (a trainer's own CollectorRegistry)."""
    for metric in _ALL:
        registry.register(metric)


def start_metrics_server(port: int, addr: str = "127.0.0.1") -> int:
    """Serve prometheus-client's default registry on `port` (0 picks one) at /metrics; returns the port."""
    httpd, _ = start_http_server(port, addr=addr)
    return int(httpd.server_port)
