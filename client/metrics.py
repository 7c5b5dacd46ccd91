"""Client-side Prometheus metrics (prefix shardstream_client_). They live in prometheus-client's
default registry, so a trainer that already exports metrics exports these too; otherwise call
`start_metrics_server(port)`. No per-rank or per-job labels: each trainer process is its own target.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

__all__ = [
    "BATCHES",
    "BYTES",
    "COMMITS",
    "COMMITS_SKIPPED",
    "COMMIT_FAILURES",
    "COMMIT_SECONDS",
    "FAILOVERS",
    "RETRIES",
    "WAIT_SECONDS",
    "start_metrics_server",
]

WAIT_SECONDS = Histogram(
    "shardstream_client_wait_seconds",
    "Time the training loop waited for its next batch (the data stall)",
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
)
BATCHES = Counter("shardstream_client_batches_total", "Batches handed to the training loop")
BYTES = Counter("shardstream_client_bytes_total", "Bytes of Read messages received")
RETRIES = Counter("shardstream_client_stream_retries_total", "Read streams restarted after an error")
FAILOVERS = Counter("shardstream_client_failovers_total", "Stream restarts that moved to another endpoint")
COMMITS = Counter("shardstream_client_cursor_commits_total", "Cursor commits attempted")
COMMITS_SKIPPED = Counter(
    "shardstream_client_cursor_commits_skipped_total",
    "Cursor commits superseded by a newer one before the store caught up",
)
COMMIT_FAILURES = Counter("shardstream_client_cursor_commit_failures_total", "Cursor commits that failed")
COMMIT_SECONDS = Histogram(
    "shardstream_client_cursor_commit_seconds", "Time to write one cursor to the store"
)


def start_metrics_server(port: int, addr: str = "127.0.0.1") -> int:
    """Serve /metrics on `port` (0 picks one); returns the port."""
    httpd, _ = start_http_server(port, addr=addr)
    return int(httpd.server_port)
