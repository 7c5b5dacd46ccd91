"""Shard backends: open one shard of a manifest, check it, and read its row groups.

A shard is a local file or an object of a remote storage (`shardstream.storage.ObjectRef`). A
remote shard is read as the Parquet format allows: its footer once (one ranged read of the tail),
then only the byte ranges of the row groups and columns a batch needs, every read pinned to the
ETag seen when the shard was opened. pyarrow reads such a shard through `_SparseFile`, a file of
which only the fetched ranges exist.

`open_shard` checks what it opens against the shard's manifest entry — size always, sha256 of the
whole content when the shard is at most `hash_check_max_bytes`, row-group row counts from the
footer — and raises DataLossError saying which check failed (the reader adds version and shard).
Kept apart from the reader (reader.py) so that `register` and `verify` read footers the same way
without a cache or a manifest to read rows from.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import Counter

from shardstream.errors import DataLossError, NotFoundError
from shardstream.manifest import Shard
from shardstream.storage import ObjectRef

__all__ = ["STORAGE_FETCHED_BYTES", "ShardFile", "open_shard", "read_footer"]

FOOTER_READ_BYTES = 64 << 10  # first guess at the footer size: one ranged read usually gets it all
COALESCE_GAP_BYTES = 1 << 20  # column chunks closer than this are fetched in one ranged read
RANGE_THREADS = 16  # byte ranges of one row group fetched at once

STORAGE_FETCHED_BYTES = Counter(
    "shardstream_storage_fetched_bytes_total", "Bytes fetched from remote storage (footers and row groups)"
)

# Byte ranges of one row group: a pool of their own, so the reader's row-group tasks never wait on
# their own pool.
_RANGE_POOL = ThreadPoolExecutor(RANGE_THREADS, thread_name_prefix="shardstream-range")


class ShardFile(Protocol):
    """One opened shard, read by many threads at once."""

    def row_group_counts(self) -> tuple[int, ...]: ...

    def read_row_group(self, group: int, columns: list[str]) -> pa.Table: ...


class _LocalShard:
    """A local Parquet file: opened and its footer parsed once, read by many threads at once.

    A `pq.ParquetFile` is not thread-safe (concurrent `read_row_group` calls share its pre-buffer
    cache: wrong reads, ArrowInvalid or a segfault), so each read gets its own reader over the shared
    handle (`ReadAt` is thread-safe) and the parsed footer, as `_RemoteShard` does.
    """

    def __init__(self, path: Path) -> None:
        self._source = pa.OSFile(str(path))  # pinned: a shard replaced on disk is not mixed in
        self.metadata = pq.read_metadata(self._source)

    def row_group_counts(self) -> tuple[int, ...]:
        md = self.metadata
        return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))

    def read_row_group(self, group: int, columns: list[str]) -> pa.Table:
        return pq.ParquetFile(self._source, metadata=self.metadata).read_row_group(group, columns=columns)


class _SparseFile:
    """A read-only file of `size` bytes of which only some ranges were fetched; others are fetched on demand."""

    def __init__(
        self, size: int, segments: list[tuple[int, bytes]], fetch: Callable[[int, int], bytes]
    ) -> None:
        self._size = size
        self._segments = segments
        self._fetch = fetch
        self._pos = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._size - self._pos
        n = max(0, min(n, self._size - self._pos))
        start = self._pos
        self._pos += n
        for seg_start, data in self._segments:
            if seg_start <= start and start + n <= seg_start + len(data):
                return data[start - seg_start : start - seg_start + n]
        data = self._fetch(start, n)
        self._segments.append((start, data))
        return data

    def close(self) -> None:
        self.closed = True


def read_footer(fetch: Callable[[int, int], bytes], size: int) -> tuple[tuple[int, bytes], pq.FileMetaData]:
    """((offset, tail bytes), metadata) of a Parquet file of `size` bytes, by ranged reads of its tail."""
    if size < 12:
        raise DataLossError(f"{size} bytes is too short for Parquet")
    tail = fetch(max(0, size - FOOTER_READ_BYTES), min(size, FOOTER_READ_BYTES))
    if tail[-4:] != b"PAR1":
        raise DataLossError("not Parquet (no footer magic bytes)")
    footer_len = int.from_bytes(tail[-8:-4], "little")
    if footer_len + 8 > size:
        raise DataLossError(f"footer length {footer_len} exceeds the object's {size} bytes")
    if footer_len + 8 > len(tail):
        tail = fetch(size - footer_len - 8, footer_len + 8)
    try:
        metadata = pq.read_metadata(pa.BufferReader(tail))
    except (OSError, pa.ArrowException) as exc:
        raise DataLossError("unreadable Parquet footer") from exc  # the text stays in the chain (server log)
    return (size - len(tail), tail), metadata


class _RemoteShard:
    """A Parquet object: footer fetched once, then only the byte ranges of the row groups read."""

    def __init__(self, ref: ObjectRef, size: int, etag: str) -> None:
        self._ref = ref
        self._size = size
        self._etag = etag
        self._tail, self.metadata = read_footer(self._fetch, size)

    def _fetch(self, start: int, length: int) -> bytes:
        data = self._ref.storage.get_range(self._ref.key, start, length, etag=self._etag)
        STORAGE_FETCHED_BYTES.inc(len(data))
        if len(data) != length:
            raise DataLossError(f"short read at {start}: {len(data)} of {length} bytes")
        return data

    def row_group_counts(self) -> tuple[int, ...]:
        md = self.metadata
        return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))

    def _ranges(self, group: int, columns: list[str]) -> list[tuple[int, int]]:
        rg = self.metadata.row_group(group)
        wanted = set(columns)
        spans, seen = [], set()
        all_spans = []
        for i in range(rg.num_columns):
            c = rg.column(i)
            start = c.data_page_offset
            if (
                c.has_dictionary_page
                and c.dictionary_page_offset is not None
                and c.dictionary_page_offset > 0
            ):
                start = min(start, c.dictionary_page_offset)
            span = (start, start + c.total_compressed_size)
            all_spans.append(span)
            top = c.path_in_schema.split(".")[0]
            if top in wanted:
                spans.append(span)
                seen.add(top)
        if seen != wanted:  # names with dots or the like: take the whole row group
            spans = all_spans
        merged: list[list[int]] = []
        for s, e in sorted(spans):
            if merged and s - merged[-1][1] <= COALESCE_GAP_BYTES:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        return [(s, e - s) for s, e in merged]

    def read_row_group(self, group: int, columns: list[str]) -> pa.Table:
        ranges = self._ranges(group, columns)
        if len(ranges) == 1:
            datas = [self._fetch(*ranges[0])]
        else:
            datas = list(_RANGE_POOL.map(lambda r: self._fetch(*r), ranges))
        segments = [self._tail, *((s, d) for (s, _), d in zip(ranges, datas, strict=True))]
        view = pa.PythonFile(_SparseFile(self._size, segments, self._fetch), mode="r")
        return pq.ParquetFile(view, metadata=self.metadata).read_row_group(group, columns=columns)


def open_shard(src: Path | str | ObjectRef, expected: Shard, *, hash_check_max_bytes: int) -> ShardFile:
    """Open a shard and check it against its manifest entry (DataLossError saying which check failed)."""
    digest: str | None = None
    try:
        if isinstance(src, ObjectRef):
            info = src.storage.head(src.key)
            if info.size != expected.bytes:
                raise DataLossError(f"size {info.size} bytes differs from the manifest's {expected.bytes}")
            if info.size <= hash_check_max_bytes:
                _, digest = src.storage.digest(src.key, etag=info.etag)
            f: ShardFile = _RemoteShard(src, info.size, info.etag)
        else:
            path = Path(src)
            size = os.stat(path).st_size
            if size != expected.bytes:
                raise DataLossError(f"size {size} bytes differs from the manifest's {expected.bytes}")
            if size <= hash_check_max_bytes:
                h = hashlib.sha256()
                with path.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                digest = h.hexdigest()
            f = _LocalShard(path)
    except NotFoundError as exc:
        raise DataLossError(f"missing from storage ({exc})") from exc
    except FileNotFoundError as exc:
        raise DataLossError("missing from storage (no such file)") from exc
    except (OSError, pa.ArrowException) as exc:
        why = "permission denied" if isinstance(exc, PermissionError) else "not readable as Parquet"
        raise DataLossError(f"cannot open ({why})") from exc  # the text stays in the chain (server log)
    if digest is not None and digest != expected.sha256:
        raise DataLossError(f"sha256 {digest[:16]}… differs from the manifest's {expected.sha256[:16]}…")
    actual = f.row_group_counts()
    if actual != expected.row_groups:
        raise DataLossError(f"row groups {actual} differ from the manifest's {expected.row_groups}")
    return f
