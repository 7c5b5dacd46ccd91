"""What a server is asked to be: `ServerConfig` and its defaults.

Its own module because both ends of a server read it: the process that serves (app.py) and the
supervisor of several such processes (workers.py), which hands each worker a copy as JSON
(worker.py); neither of them imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .readahead import DEFAULT_READ_AHEAD_MESSAGES
from .spill import DEFAULT_SPILL_BYTES

__all__ = ["DEFAULT_CACHE_BYTES", "DEFAULT_GRACE_S", "ServerConfig"]

DEFAULT_CACHE_BYTES = 1 << 30
DEFAULT_GRACE_S = 10.0


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
    workers: int = 1  # processes serving the port; > 1 makes `run` a supervisor (workers.py)
    read_ahead: int = DEFAULT_READ_AHEAD_MESSAGES  # messages per stream whose row groups are read ahead
    reuse_port: bool = False  # set by the supervisor for its workers only
    cache_dir: str | None = None  # local-disk tier under the memory cache, shared by the workers
    cache_dir_bytes: int = DEFAULT_SPILL_BYTES
    transform_threads: int = 1  # per-sample transform work (server/transforms/)
