"""Checkpoints and snapshot transfer on the server (DESIGN §13), enabled by `serve --checkpoint-root URL`.

    store.py   chunks, parts and the commit protocol over one Storage (local directory or s3://)
    reclaim.py `checkpoint gc --keep N`: old manifests, dead parts, unreferenced chunks
    limits.py  what one writer may ask: record and chunk sizes, bytes in flight, a quota per job
    plane.py   the Flight calls a Checkpointer makes (DoPut, DoGet, DoAction, ListFlights), auth

The format is shardstream/checkpoint_format.py's (the client builds the same records).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pyarrow as pa

from ..backends.roots import open_storage
from ..policy.auth import Authenticator
from ..policy.grants import Grants
from ..read.cache import LRUCache
from .limits import DEFAULT_LIMITS, CheckpointLimits
from .plane import CHUNK_TICKET_PREFIX, Call, CheckpointPlane
from .reclaim import GcReport, collect
from .store import CheckpointStore

__all__ = [
    "CHUNK_TICKET_PREFIX",
    "DEFAULT_LIMITS",
    "Call",
    "CheckpointLimits",
    "CheckpointPlane",
    "CheckpointStore",
    "GcReport",
    "collect",
    "open_checkpoint_plane",
    "open_checkpoint_store",
]


def open_checkpoint_store(url: str | os.PathLike[str], *, s3_endpoint: str | None = None) -> CheckpointStore:
    """The checkpoints under `url` (a local directory, made if missing, or s3://bucket/prefix)."""
    text = os.fspath(url)
    if not text.startswith("s3://"):
        os.makedirs(text, exist_ok=True)
    storage = open_storage(text, s3_endpoint=s3_endpoint)
    storage.check_root()
    return CheckpointStore(storage)


def open_checkpoint_plane(
    url: str,
    cache: LRUCache[pa.Table],
    auth: Authenticator,
    grants: Callable[[], Grants | None] = lambda: None,
    *,
    s3_endpoint: str | None = None,
    limits: CheckpointLimits = DEFAULT_LIMITS,
) -> CheckpointPlane:
    return CheckpointPlane(open_checkpoint_store(url, s3_endpoint=s3_endpoint), cache, auth, grants, limits)
