"""What a server is asked to be: `ServerConfig` and its defaults.

Its own module because both ends of a server read it: the process that serves (server/lifecycle.py) and the
supervisor of several such processes (server/serving/supervisor.py), which hands each worker a copy as JSON
(server/worker_process.py) with its share of the server's memory and stream limits (`worker_shares`); neither of
them imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoints.limits import DEFAULT_LIMITS, CheckpointLimits
from ..read.readahead import DEFAULT_READ_AHEAD_MESSAGES
from ..read.request_limits import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MESSAGE_CAP_BYTES, RequestLimits
from ..read.spill import DEFAULT_SPILL_BYTES
from ..transforms.pipeline import DEFAULT_MAX_SAMPLE_BYTES
from .admission import (
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_PEER,
    DEFAULT_STREAM_BUFFER_BYTES,
    AdmissionLimits,
)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_GRACE_S",
    "DEFAULT_KEEPALIVE_TIMEOUT_S",
    "DEFAULT_KEEPALIVE_TIME_S",
    "DEFAULT_MAX_CONNECTION_IDLE_S",
    "DEFAULT_WRITE_TIMEOUT_S",
    "ServerConfig",
]

DEFAULT_CACHE_BYTES = 1 << 30
DEFAULT_GRACE_S = 10.0
# A write blocked this long means a client that stopped reading: longer than any pause of a
# training loop that still reads (an evaluation, a checkpoint) should be; its stream is cut and
# resumed by the client anyway, so a pause beyond it costs a reconnect, never data.
DEFAULT_WRITE_TIMEOUT_S = 300.0
# Keepalive pings from the server: a client that answers none for keepalive_timeout after one was
# sent (a frozen process, a dead host) loses its connection and all its streams.
DEFAULT_KEEPALIVE_TIME_S = 30.0
DEFAULT_KEEPALIVE_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTION_IDLE_S = 600.0  # a connection without calls this long is closed (clients reconnect)


@dataclass(frozen=True)
class ServerConfig:
    root: str
    port: int
    host: str = "127.0.0.1"
    metrics_port: int | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES
    grace_s: float = DEFAULT_GRACE_S
    ready_file: str | None = None
    s3_endpoint: str | None = None  # default: $AWS_ENDPOINT_URL
    workers: int = 1  # processes serving the port; > 1 makes `run` a supervisor (server/serving/supervisor.py)
    # `serve --workers auto`: start `workers` and grow/shrink between 1 and this on the trainers' stall
    # (server/serving/autoscale.py), deciding every autoscale_interval_s; 0: a fixed `workers`
    autoscale_max_workers: int = 0
    autoscale_interval_s: float = 5.0
    # worker i runs on the i-th usable CPU only (a single process: the first): a worker is one core's worth
    pin_workers: bool = False
    read_ahead: int = DEFAULT_READ_AHEAD_MESSAGES  # messages per stream whose row groups are read ahead
    reuse_port: bool = False  # set by the supervisor for its workers only
    worker_slot: int = 0  # likewise: the worker's slot (its data port: data_port + slot)
    worker_cpu: int = -1  # likewise, with pin_workers: the CPU it runs on
    placement_file: str = ""  # likewise: every worker's streams, for GetDataset and rebalancing (placement.py)
    cache_dir: str | None = None  # local-disk tier under the memory cache, shared by the workers
    cache_dir_bytes: int = DEFAULT_SPILL_BYTES
    transform_threads: int = 1  # per-sample transform work (server/transforms/)
    # Admission (server/read/request_limits.py, server/serving/admission.py, server/serving/reaper.py; the RUNBOOK's "Limits")
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_message_bytes: int = DEFAULT_MESSAGE_CAP_BYTES
    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES
    max_streams: int = DEFAULT_MAX_STREAMS  # of the server: split between its workers
    max_streams_per_peer: int = DEFAULT_MAX_STREAMS_PER_PEER  # of each worker
    stream_buffer_bytes: int = DEFAULT_STREAM_BUFFER_BYTES  # of the server: split between its workers
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    keepalive_time_s: float = DEFAULT_KEEPALIVE_TIME_S
    keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S
    max_connection_idle_s: float = DEFAULT_MAX_CONNECTION_IDLE_S
    log_format: str = "text"  # "text" or "json" (server/serving/log_format.py), the supervisor's and its workers'
    # Security (server/serving/tls.py, server/policy/auth.py; DESIGN §10): every worker reads the same files and follows their changes.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # mTLS: clients need a certificate signed by this CA
    auth_file: str | None = None  # principals, their tokens (sha256) or subjects, and datasets
    reflection: bool = False  # gRPC server reflection (lists the services to anyone who connects)
    # The data plane (server/serving/data_plane.py): Read streams as Arrow Flight DoGet on `data_port` (0: a free
    # one), which GetDataset tells clients; a supervisor's worker i serves data_port + i.
    data_port: int = 0
    advertised_data_port: int = 0  # the data port GetDataset names, when clients reach it by another
    grant_key: str = ""  # hex; signs data-plane grants (server/policy/grants.py): made at start, a supervisor's shared
    # Checkpoints (server/checkpoints/): kept under this root (a directory or s3://) and moved over the
    # data plane (Flight DoPut/DoGet/DoAction); None: not kept
    checkpoint_root: str | None = None
    checkpoint_limits: CheckpointLimits = DEFAULT_LIMITS  # what one writer may ask (server/checkpoints/limits.py)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> ServerConfig:
        """The config `dataclasses.asdict` wrote (a supervisor's to its workers)."""
        limits = fields.get("checkpoint_limits")
        if isinstance(limits, dict):
            fields = {**fields, "checkpoint_limits": CheckpointLimits(**limits)}
        return cls(**fields)

    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_batch_size=self.max_batch_size,
            max_message_bytes=self.max_message_bytes,
            max_sample_bytes=self.max_sample_bytes,
        )

    def admission_limits(self) -> AdmissionLimits:
        return AdmissionLimits(
            max_streams=self.max_streams,
            max_streams_per_peer=self.max_streams_per_peer,
            buffer_bytes=self.stream_buffer_bytes,
        )

    @property
    def worker_slots(self) -> int:
        """The most worker processes this server runs at once (each slot has its own data port)."""
        return max(self.workers, self.autoscale_max_workers)

    def worker_shares(self, workers: int) -> dict[str, Any]:
        """One worker's share of what this config gives the whole server: its cache, streams and
        stream buffer (so the server's memory and stream count stay as sized)."""
        return {
            "cache_bytes": self.cache_bytes // workers,
            "max_streams": max(1, -(-self.max_streams // workers)),
            "stream_buffer_bytes": max(1, self.stream_buffer_bytes // workers),
        }
