"""What a client may see of an error (DESIGN §10): dataset versions and shards, never a server path
or a Python exception's text.

Errors are written for the command line, where naming a file by its full location helps; the server
passes every message through `client_message` on its way out (control_plane.py, the one place errors leave
it):

- a ShardstreamError keeps its message, with the storage's root (`Storage.locations`: the directory
  as given, absolute and resolved; an S3 root's URL and endpoint) cut from the keys under it — a
  shard reads `toy/data/<id>/part-00000.parquet`, the version's own directory layout — and named
  `the server's root` where it stands alone; any other absolute path left becomes `<path>`;
- anything else (a bug) is `internal error`, its text and traceback kept for the server's log.
"""

from __future__ import annotations

import logging
import re

from shardstream.errors import InternalError, ShardstreamError
from shardstream.storage import Storage

__all__ = ["INTERNAL_MESSAGE", "MAX_DETAILS_CHARS", "client_error", "client_message"]

INTERNAL_MESSAGE = "internal error (the server's log has the details)"
MAX_DETAILS_CHARS = 2000  # of an error's message: status details travel in a size-limited trailer
ROOT_NAME = "the server's root"
# An absolute path: '/' at the start or after a space, quote, bracket or '=', then a path segment.
_ABSOLUTE_PATH = re.compile(r"(?<![^\s'\"(\[=,:])/[^\s'\"()\[\],;]+")


def client_message(exc: BaseException, storage: Storage) -> str:
    """The text of `exc` a client may see (see the module docstring)."""
    if not isinstance(exc, ShardstreamError):
        return INTERNAL_MESSAGE
    text = str(exc)
    for where in storage.locations():  # longest first: a resolved path before a prefix of it
        base = where.rstrip("/")
        if not base:
            continue
        text = text.replace(base + "/", "").replace(base, ROOT_NAME)
    return _ABSOLUTE_PATH.sub("<path>", text)


def client_error(
    exc: BaseException, storage: Storage, log: logging.Logger, what: str
) -> tuple[ShardstreamError, str]:
    """The error a failed call ends with, and the text of it a client may see (trimmed to
    MAX_DETAILS_CHARS): `exc` itself, or — anything that is not a ShardstreamError: a bug — an
    InternalError, its traceback logged as `what` failing. (The one mapping of both the Read streams
    and the checkpoint calls of the data port.)"""
    if not isinstance(exc, ShardstreamError):
        log.exception("%s failed unexpectedly", what, exc_info=exc)
        exc = InternalError(client_message(exc, storage))
    details = client_message(exc, storage)
    if len(details) > MAX_DETAILS_CHARS:
        details = f"{details[:MAX_DETAILS_CHARS]}... ({len(details)} characters)"
    return exc, details
