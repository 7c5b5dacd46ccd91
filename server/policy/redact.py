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

import re

from shardstream.errors import ShardstreamError
from shardstream.storage import Storage

__all__ = ["INTERNAL_MESSAGE", "client_message"]

INTERNAL_MESSAGE = "internal error (the server's log has the details)"
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
