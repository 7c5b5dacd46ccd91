"""The Checkpointer's Prometheus metrics, beside the Loader's (client/metrics.py: same labels
`job_name` and `rank`, same default registry; a trainer that serves that registry exports these).

    shardstream_client_checkpoint_saves_total{job_name,rank}            saves started
    shardstream_client_checkpoint_save_failures_total                  saves that did not commit
    shardstream_client_checkpoint_stall_seconds                        time save() held the training
                                                                        step (staging; histogram)
    shardstream_client_checkpoint_upload_seconds                       from save() returning to the
                                                                        commit: the upload lag (histogram)
    shardstream_client_checkpoint_state_bytes_total                    bytes of the states saved
    shardstream_client_checkpoint_sent_bytes_total                     bytes sent (the chunks the server
                                                                        lacked): 1 - sent/state is the
                                                                        dedup ratio
    shardstream_client_checkpoint_loaded_bytes_total                   bytes loaded
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = ["LOADED", "SAVES", "SAVE_FAILURES", "SENT", "STALL", "STATE", "UPLOAD", "export"]

LABELS = ("job_name", "rank")
_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)

SAVES = Counter("shardstream_client_checkpoint_saves_total", "Checkpoint saves started", LABELS)
SAVE_FAILURES = Counter(
    "shardstream_client_checkpoint_save_failures_total", "Checkpoint saves that did not commit", LABELS
)
STALL = Histogram(
    "shardstream_client_checkpoint_stall_seconds",
    "Time Checkpointer.save held the training step (staging to host memory)",
    LABELS,
    buckets=_SECONDS,
)
UPLOAD = Histogram(
    "shardstream_client_checkpoint_upload_seconds",
    "From save() returning to the step committed (the upload lag)",
    LABELS,
    buckets=_SECONDS,
)
STATE = Counter("shardstream_client_checkpoint_state_bytes_total", "Bytes of the states saved", LABELS)
SENT = Counter(
    "shardstream_client_checkpoint_sent_bytes_total", "Checkpoint bytes sent (chunks the server lacked)", LABELS
)
LOADED = Counter("shardstream_client_checkpoint_loaded_bytes_total", "Checkpoint bytes loaded", LABELS)


def export(job: str, rank: int) -> None:
    """Export every series of `job`'s `rank` from the start, at 0 (a failures panel has a line before
    the first failure, and 1 - sent/state a denominator before the first save)."""
    for metric in (SAVES, SAVE_FAILURES, STALL, UPLOAD, STATE, SENT, LOADED):
        metric.labels(job, str(rank))
