"""Open a registry root by its URL: a local directory, or `s3://bucket/prefix` (aiobotocore).

The shared package (`shardstream.storage`) knows only local directories, so that a GPU host's client
install never reaches S3 code; everything that may be handed an `s3://` root — the server, ingest,
the command line — opens it here.
"""

from __future__ import annotations

import os

from shardstream.errors import InvalidArgumentError
from shardstream.registry import Registry
from shardstream.storage import Storage, open_local_storage

__all__ = ["open_registry", "open_storage"]


def open_storage(url: str | os.PathLike[str] | Storage, *, s3_endpoint: str | None = None) -> Storage:
    """The storage for a local directory or an `s3://bucket/prefix` URL (endpoint: $AWS_ENDPOINT_URL)."""
    if isinstance(url, Storage):
        return url
    text = os.fspath(url)
    if text.startswith("s3://"):
        try:
            from .s3 import S3Storage
        except ImportError as exc:
            raise InvalidArgumentError(
                f"{text}: s3:// needs the server dependencies (pip install 'shardstream[server]'): {exc}"
            ) from exc
        return S3Storage(text, endpoint_url=s3_endpoint)
    return open_local_storage(text)


def open_registry(root: str | os.PathLike[str] | Storage, *, s3_endpoint: str | None = None) -> Registry:
    """The registry under `root` (a local directory, `s3://bucket/prefix` or a Storage)."""
    return Registry(open_storage(root, s3_endpoint=s3_endpoint))
