"""`s3://bucket/prefix` storage on aiobotocore (any S3-compatible server).

The endpoint comes from `endpoint_url` (the CLI's `--s3-endpoint`) or the standard
`AWS_ENDPOINT_URL`; credentials and region from the standard AWS variables / config files.

The blocking `Storage` methods run coroutines on one event loop in a private daemon thread, so any
number of worker threads can have requests in flight at once over one connection pool.

- Retries: botocore's `standard` mode (throttling, 5xx, connection errors) for every call, plus our
  own resume of a body cut mid-read (botocore does not retry those): the rest of the range is asked
  for again, pinned to the same ETag.
- Pinning: ranged reads carry `If-Match: <etag>`; an object rewritten since it was opened answers
  412 and the read fails with DataLossError — bytes of two versions are never mixed.
- Creates: `put_if_absent` is a conditional put (`If-None-Match: *`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    ResponseStreamingError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from prometheus_client import Counter

from shardstream.errors import (
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ShardstreamError,
    UnauthenticatedError,
    UnavailableError,
)
from shardstream.storage import CHUNK_BYTES, ObjectInfo, Storage, check_key

__all__ = ["S3Storage", "parse_s3_url"]

T = TypeVar("T")

DEFAULT_MAX_ATTEMPTS = 4  # botocore standard mode: the first try plus 3 retries
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_POOL_CONNECTIONS = 64
DEFAULT_BODY_RESUMES = 5  # a cut body is resumed this many times before giving up
DEFAULT_CALL_TIMEOUT_S = 300.0  # a blocking call never waits longer than this

S3_REQUESTS = Counter("shardstream_s3_requests_total", "S3 requests sent", ["op"])
S3_BYTES = Counter("shardstream_s3_fetched_bytes_total", "Bytes of object bodies fetched from S3")
S3_RESUMES = Counter("shardstream_s3_body_resumes_total", "Object bodies cut mid-read and resumed")

_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AuthFailure"}
# What S3-compatible stores answer when a bucket is over its quota or their disks are full
_QUOTA_CODES = {"QuotaExceeded", "XMinioStorageFull", "InsufficientStorage", "StorageFull"}
_BODY_ERRORS = (
    aiohttp.ClientPayloadError,
    aiohttp.ClientConnectionError,
    ResponseStreamingError,
    asyncio.TimeoutError,
    ConnectionError,
)


def parse_s3_url(url: str) -> tuple[str, str]:
    """('bucket', 'prefix/') of `s3://bucket/prefix`; the prefix is '' or ends with '/'."""
    if not url.startswith("s3://"):
        raise InvalidArgumentError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise InvalidArgumentError(f"{url!r}: missing bucket name (s3://BUCKET/prefix)")
    prefix = prefix.strip("/")
    if prefix:
        check_key(prefix, "s3 prefix")
    return bucket, f"{prefix}/" if prefix else ""


class S3Storage(Storage):
    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        max_pool_connections: int = DEFAULT_MAX_POOL_CONNECTIONS,
    ) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self._config = AioConfig(
            retries={"mode": "standard", "max_attempts": max_attempts},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            max_pool_connections=max_pool_connections,
            s3={"addressing_style": "path"},
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="shardstream-s3", daemon=True)
        self._thread.start()
        self._client: Any = None
        self._client_cm: Any = None
        self._closed = False
        self._lock = threading.Lock()

    # --- plumbing ------------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        if self._closed:
            coro.close()
            raise UnavailableError(f"{self.url}: storage is closed")
        fut = asyncio.run_coroutine_threadsafe(self._guard(coro, what), self._loop)
        return fut.result(timeout=DEFAULT_CALL_TIMEOUT_S)

    async def _guard(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        try:
            return await coro
        except ShardstreamError:
            raise
        except ClientError as exc:
            raise self._map_client_error(exc, what) from exc
        except NoCredentialsError as exc:
            raise UnauthenticatedError(
                f"{what}: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            ) from exc
        except (BotoConnectionError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            # The exception's own text stays in the chain (logs), out of the message a client may see.
            raise UnavailableError(
                f"{what}: cannot reach S3 at {self._where()} ({type(exc).__name__})"
            ) from exc
        except BotoCoreError as exc:
            raise UnavailableError(f"{what}: S3 request failed ({type(exc).__name__})") from exc

    def _where(self) -> str:
        return self.endpoint_url or "the default AWS endpoint"

    def _map_client_error(self, exc: ClientError, what: str) -> ShardstreamError:
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = err.get("Message") or code or f"HTTP {status}"
        if code in _AUTH_CODES:
            return UnauthenticatedError(
                f"{what}: S3 at {self._where()} refused the credentials ({code}): check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY"
            )
        if code in ("AccessDenied", "Forbidden") or status == 403:
            return PermissionDeniedError(f"{what}: access denied by S3 at {self._where()} ({msg})")
        if code == "NoSuchBucket":
            return NotFoundError(f"{what}: no bucket {self.bucket!r} at {self._where()}")
        if code in ("NoSuchKey", "NotFound", "404") or status == 404:
            return NotFoundError(f"{what}: no such object")
        if code == "PreconditionFailed" or status == 412:
            return DataLossError(f"{what}: the object was overwritten since it was opened (ETag changed)")
        if code in _QUOTA_CODES or status == 507:  # a bucket quota, a full volume behind the gateway
            return ResourceExhaustedError(
                f"{what}: S3 at {self._where()} has no room ({msg}): free space or raise the quota"
            )
        if status in (500, 502, 503, 504) or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
            return UnavailableError(f"{what}: S3 unavailable ({msg})")
        return UnavailableError(f"{what}: S3 error {code or status}: {msg}")

    async def _s3(self) -> Any:
        if self._client is None:
            self._client_cm = get_session().create_client(
                "s3", endpoint_url=self.endpoint_url, config=self._config
            )
            self._client = await self._client_cm.__aenter__()
        return self._client

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True

        async def shutdown() -> None:
            if self._client_cm is not None:
                await self._client_cm.__aexit__(None, None, None)
                self._client = self._client_cm = None

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()

    def __del__(self) -> None:  # pragma: no cover - a safety net; callers close()
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001, S110 — interpreter shutdown
                pass

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def locations(self) -> tuple[str, ...]:
        forms = {self.url, self.url.rstrip("/"), self.endpoint_url or ""}
        return tuple(sorted((f for f in forms if f), key=len, reverse=True))

    # --- Storage -------------------------------------------------------------------------------
    def check_root(self) -> None:
        async def probe() -> None:
            s3 = await self._s3()
            S3_REQUESTS.labels("list").inc()
            await s3.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)

        self._run(probe(), f"--root {self.url}")

    def head(self, key: str) -> ObjectInfo:
        async def head() -> ObjectInfo:
            s3 = await self._s3()
            S3_REQUESTS.labels("head").inc()
            r = await s3.head_object(Bucket=self.bucket, Key=self._key(key))
            return ObjectInfo(int(r["ContentLength"]), str(r["ETag"]), r["LastModified"].timestamp())

        return self._run(head(), self.url_of(key))

    def get(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key))

    async def _get_range(self, key: str, start: int, length: int, etag: str | None) -> bytes:
        """Bytes [start, start+length), resuming a body that is cut mid-read."""
        s3 = await self._s3()
        parts: list[bytes] = []
        got = 0
        resumes = 0
        while got < length:
            kwargs: dict[str, Any] = {
                "Bucket": self.bucket,
                "Key": self._key(key),
                "Range": f"bytes={start + got}-{start + length - 1}",
            }
            if etag is not None:
                kwargs["IfMatch"] = etag
            S3_REQUESTS.labels("get").inc()
            r = await s3.get_object(**kwargs)
            if etag is None:
                etag = str(r["ETag"])  # the rest of a resumed body must come from the same object
            try:
                async with r["Body"] as body:
                    while got < length:
                        chunk = await body.read(min(CHUNK_BYTES, length - got))
                        if not chunk:
                            break
                        parts.append(chunk)
                        got += len(chunk)
                        S3_BYTES.inc(len(chunk))
                if got < length:
                    raise ConnectionError("body ended early")
            except _BODY_ERRORS as exc:
                resumes += 1
                S3_RESUMES.inc()
                if resumes > DEFAULT_BODY_RESUMES:
                    raise UnavailableError(
                        f"{self.url_of(key)}: body cut mid-read {resumes} times ({type(exc).__name__})"
                    ) from exc
                await asyncio.sleep(min(2.0, 0.05 * 2**resumes))
        return b"".join(parts)

    def get_range(self, key: str, start: int, length: int, *, etag: str | None = None) -> bytes:
        if length <= 0:
            return b""
        return self._run(self._get_range(key, start, length, etag), self.url_of(key))

    def iter_chunks(self, key: str, *, etag: str | None = None) -> Iterator[bytes]:
        info = self.head(key)
        if etag is not None and info.etag != etag:
            raise DataLossError(f"{self.url_of(key)}: the object was overwritten since it was opened")
        step = 8 * CHUNK_BYTES
        for start in range(0, info.size, step):
            yield self.get_range(key, start, min(step, info.size - start), etag=info.etag)

    def put(self, key: str, data: bytes | memoryview) -> None:
        async def put() -> None:
            s3 = await self._s3()
            S3_REQUESTS.labels("put").inc()
            await s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data))

        self._run(put(), self.url_of(key))

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        async def put() -> bool:
            s3 = await self._s3()
            S3_REQUESTS.labels("put").inc()
            try:
                await s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data), IfNoneMatch="*")
            except ClientError as exc:
                err = exc.response.get("Error", {})
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if err.get("Code") in ("PreconditionFailed", "ConditionalRequestConflict") or status in (
                    409,
                    412,
                ):
                    return False
                raise
            return True

        return self._run(put(), self.url_of(key))

    def put_file(self, key: str, path: Path) -> None:
        # Shards are written once by ingest; one PUT each (multipart is not needed at shard sizes).
        self.put(key, Path(path).read_bytes())

    def delete(self, key: str) -> None:
        async def delete() -> None:
            s3 = await self._s3()
            S3_REQUESTS.labels("delete").inc()
            await s3.delete_object(Bucket=self.bucket, Key=self._key(key))

        self._run(delete(), self.url_of(key))

    def _dir(self, prefix: str) -> str:
        prefix = prefix.strip("/")
        return self.prefix + (check_key(prefix) + "/" if prefix else "")

    def list(self, prefix: str) -> list[str]:
        async def scan() -> list[str]:
            s3 = await self._s3()
            keys: list[str] = []
            token = None
            while True:
                kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._dir(prefix)}
                if token:
                    kwargs["ContinuationToken"] = token
                S3_REQUESTS.labels("list").inc()
                r = await s3.list_objects_v2(**kwargs)
                keys += [o["Key"][len(self.prefix) :] for o in r.get("Contents", [])]
                token = r.get("NextContinuationToken")
                if not r.get("IsTruncated") or not token:
                    return sorted(k for k in keys if not k.endswith("/"))

        return self._run(scan(), f"{self.url}{prefix}")

    def list_info(self, prefix: str) -> list[tuple[str, ObjectInfo]]:
        async def scan() -> list[tuple[str, ObjectInfo]]:
            s3 = await self._s3()
            out: list[tuple[str, ObjectInfo]] = []
            token = None
            while True:
                kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._dir(prefix)}
                if token:
                    kwargs["ContinuationToken"] = token
                S3_REQUESTS.labels("list").inc()
                r = await s3.list_objects_v2(**kwargs)
                out += [
                    (
                        o["Key"][len(self.prefix) :],
                        ObjectInfo(int(o["Size"]), str(o["ETag"]), o["LastModified"].timestamp()),
                    )
                    for o in r.get("Contents", [])
                    if not o["Key"].endswith("/")
                ]
                token = r.get("NextContinuationToken")
                if not r.get("IsTruncated") or not token:
                    return sorted(out)

        return self._run(scan(), f"{self.url}{prefix}")

    def children(self, prefix: str) -> list[str]:
        async def scan() -> list[str]:
            s3 = await self._s3()
            base = self._dir(prefix)
            names: list[str] = []
            token = None
            while True:
                kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base, "Delimiter": "/"}
                if token:
                    kwargs["ContinuationToken"] = token
                S3_REQUESTS.labels("list").inc()
                r = await s3.list_objects_v2(**kwargs)
                names += [p["Prefix"][len(base) :].rstrip("/") for p in r.get("CommonPrefixes", [])]
                token = r.get("NextContinuationToken")
                if not r.get("IsTruncated") or not token:
                    return sorted(n for n in names if n)

        return self._run(scan(), f"{self.url}{prefix}")


def wait_s3(storage: S3Storage, timeout_s: float = 30.0) -> None:
    """Block until the storage answers (used by tests and the demo)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            storage.check_root()
            return
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
