"""Shard backends: open one shard of a manifest, check it, and read its row groups.

A shard is a local file or an object of a remote storage (`shardstream.storage.ObjectRef`). A
remote shard is read as the Parquet format allows: its footer once (one ranged read of the tail),
then only the byte ranges of the row groups and columns a batch needs, every read pinned to the
ETag seen when the shard was opened. pyarrow reads such a shard through a file of which only the
fetched ranges exist.

`open_shard` checks what it opens against the shard's manifest entry and raises DataLossError
saying which check failed (the reader adds version and shard):

- a shard with row-group checksums (`manifest.ShardChecksums`, checksums.py): size, then the crc32
  of its footer before the footer is parsed, then row-group row counts. Every row group read then
  fetches its column chunks' byte ranges (local files too: by `pread`), checks the crc32 of each
  chunk of the columns asked for, and only then lets pyarrow decode — from those checked bytes
  alone (`_CheckedFile` refuses any other), with Parquet page checksums verified too where the
  shard has them. So every byte decoded was checked, at any shard size.
- a shard of a manifest written before checksums existed: size always, the sha256 of the whole
  content when the shard is at most `hash_check_max_bytes`, row-group row counts from the footer.
  Larger ones are served after those cheaper checks only (the reader logs it once).

Kept apart from the reader (reader.py) so that `register` and `verify` read footers the same way
without a cache or a manifest to read rows from.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import Counter

from shardstream.errors import DataLossError, InternalError, NotFoundError
from shardstream.manifest import Shard, ShardChecksums
from shardstream.storage import ObjectRef

from .checksums import check_footer, chunk_spans, crc32, footer_bytes_of, select

__all__ = ["STORAGE_FETCHED_BYTES", "ShardFile", "open_shard", "read_footer"]

FOOTER_READ_BYTES = 64 << 10  # first guess at the footer size: one ranged read usually gets it all
COALESCE_GAP_BYTES = 1 << 20  # column chunks closer than this are fetched in one ranged read
RANGE_THREADS = 16  # byte ranges of one row group fetched at once

STORAGE_FETCHED_BYTES = Counter(
    "shardstream_storage_fetched_bytes_total", "Bytes fetched from remote storage (footers and row groups)"
)

# Arrow decodes a row group read through a Python file (pa.PythonFile) in the calling thread, not in
# its CPU pool, and without pre-buffering (which reads in its IO pool). Otherwise its pool threads
# read the file and hold the Python objects the reads return (as PyBuffers) until their tasks'
# closures are destroyed, which can be after the read has returned. A process that exits right then
# (a CLI command whose last act was a read) has a pool thread ask for the GIL during finalization;
# CPython ends that thread with pthread_exit, and the unwinding through Arrow's C++ frames aborts
# the process ("terminate called without an active exception", exit status -6; 1 in ~150 runs of
# `shardstream inspect` beside two busy loops). The server decodes several row groups at once in its
# own threads (reader.py's fetch pool), so little is lost: one column at a time within a row group
# (2 and 10 columns of 4,000 rows: no slower on 2 cores).
PYTHON_FILE_THREADS = False

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


class _ReadOnlyFile:
    """What pyarrow asks of a file object besides read(): a position over `_size` bytes, never written."""

    _size: int
    _pos: int
    closed: bool

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

    def close(self) -> None:
        self.closed = True


class _SparseFile(_ReadOnlyFile):
    """A read-only file of `size` bytes of which only some ranges were fetched; others are fetched on demand."""

    def __init__(
        self, size: int, segments: list[tuple[int, bytes]], fetch: Callable[[int, int], bytes]
    ) -> None:
        self._size = size
        self._segments = segments
        self._fetch = fetch
        self._pos = 0
        self.closed = False

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


Fetch = Callable[[int, int], bytes]


class _CheckedFile(_ReadOnlyFile):
    """A read-only file of `size` bytes that serves only the checked ranges of `blobs` (fetched
    (start, bytes) pieces): a read of anything else is refused, never fetched."""

    def __init__(self, size: int, blobs: list[tuple[int, bytes]], checked: list[tuple[int, int]]) -> None:
        self._size = size
        self._blobs = sorted(blobs)
        self._checked: list[list[int]] = []
        for s, e in sorted(checked):  # merged: adjacent chunks are read at once
            if self._checked and s <= self._checked[-1][1]:
                self._checked[-1][1] = max(self._checked[-1][1], e)
            else:
                self._checked.append([s, e])
        self._pos = 0
        self.closed = False

    def read(self, n: int = -1) -> bytes | memoryview:
        if n is None or n < 0:
            n = self._size - self._pos
        n = max(0, min(n, self._size - self._pos))
        start, end = self._pos, self._pos + n
        self._pos = end
        if n == 0:
            return b""
        i = bisect.bisect_right(self._checked, [start, float("inf")]) - 1
        if i >= 0 and self._checked[i][1] >= end:
            for at, data in self._blobs:
                if at <= start and end <= at + len(data):
                    return memoryview(data)[start - at : end - at]  # no copy: pyarrow keeps a reference
        raise InternalError(
            f"the Parquet reader asked for bytes {start}-{end}, outside the checked column chunks"
        )


class _RangedShard:
    """A shard read by byte ranges: any remote object, and local files that have checksums.

    With `sums` (the manifest's checksums) every column chunk read is checked before it is decoded;
    without (a remote shard of an older manifest), the ranges are read as they come.
    """

    def __init__(
        self,
        fetch: Fetch,
        size: int,
        tail: tuple[int, bytes],
        metadata: pq.FileMetaData,
        sums: ShardChecksums | None,
        keep: object = None,
    ) -> None:
        self._fetch = fetch
        self._size = size
        self._tail = tail
        self.metadata = metadata
        self._sums = sums
        self._keep = keep  # what `fetch` reads from (a local file stays open while the shard does)

    @classmethod
    def checked(cls, fetch: Fetch, size: int, sums: ShardChecksums, keep: object = None) -> _RangedShard:
        """Open by the manifest's footer length: the footer's crc32 is checked before it is parsed."""
        if sums.footer_bytes > size:
            raise DataLossError(
                f"footer of {sums.footer_bytes} bytes per the manifest exceeds the file's {size}"
            )
        footer = fetch(size - sums.footer_bytes, sums.footer_bytes)
        check_footer(footer, sums)
        if footer[-4:] != b"PAR1" or footer_bytes_of(footer) != sums.footer_bytes:
            raise DataLossError("footer: no Parquet magic bytes or another length than the manifest's")
        try:
            md = pq.read_metadata(pa.BufferReader(footer))
        except (OSError, pa.ArrowException) as exc:
            raise DataLossError(
                "unreadable Parquet footer"
            ) from exc  # the text stays in the chain (server log)
        if md.num_row_groups != len(sums.row_groups) or (
            md.num_row_groups and md.num_columns != sums.columns
        ):
            raise DataLossError(
                f"footer lists {md.num_row_groups} row groups of {md.num_columns} column chunks, the manifest's "
                f"checksums {len(sums.row_groups)} of {sums.columns}"
            )
        return cls(fetch, size, (size - len(footer), footer), md, sums, keep)

    def row_group_counts(self) -> tuple[int, ...]:
        md = self.metadata
        return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))

    def read_row_group(self, group: int, columns: list[str]) -> pa.Table:
        spans = chunk_spans(self.metadata, group, self._size)
        chosen = select(spans, columns)
        merged: list[list[int]] = []
        for s, e in sorted((spans[i].start, spans[i].end) for i in chosen):
            if merged and s - merged[-1][1] <= COALESCE_GAP_BYTES:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        ranges = [(s, e - s) for s, e in merged]
        if len(ranges) == 1:
            datas = [self._fetch(*ranges[0])]
        else:
            datas = list(_RANGE_POOL.map(lambda r: self._fetch(*r), ranges))
        blobs = [(s, d) for (s, _), d in zip(ranges, datas, strict=True)]
        if self._sums is None:
            view = pa.PythonFile(_SparseFile(self._size, [self._tail, *blobs], self._fetch), mode="r")
            pf = pq.ParquetFile(view, metadata=self.metadata, pre_buffer=False)  # (the ranges are here)
            return pf.read_row_group(group, columns=columns, use_threads=PYTHON_FILE_THREADS)
        expected = self._sums.chunks(group)
        for i in chosen:
            span = spans[i]
            at, data = next((at, d) for at, d in blobs if at <= span.start and span.end <= at + len(d))
            got = crc32(memoryview(data)[span.start - at : span.end - at])
            if got != expected[i]:
                raise DataLossError(
                    f"column chunk {span.column!r} (bytes {span.start}-{span.end}): crc32 {got:08x} differs "
                    f"from the manifest's {expected[i]:08x}"
                )
        checked = [(spans[i].start, spans[i].end) for i in chosen]
        view = pa.PythonFile(_CheckedFile(self._size, blobs, checked), mode="r")
        # pre_buffer off: pyarrow then reads each chunk it decodes as one range (on, it would also read
        # the unchecked holes up to 8 KiB between them); the bytes are in memory already anyway.
        pf = pq.ParquetFile(view, metadata=self.metadata, pre_buffer=False, page_checksum_verification=True)
        return pf.read_row_group(group, columns=columns, use_threads=PYTHON_FILE_THREADS)


def _remote_fetch(ref: ObjectRef, etag: str) -> Fetch:
    def fetch(start: int, length: int) -> bytes:
        data = ref.storage.get_range(ref.key, start, length, etag=etag)
        STORAGE_FETCHED_BYTES.inc(len(data))
        if len(data) != length:
            raise DataLossError(f"short read at {start}: {len(data)} of {length} bytes")
        return data

    return fetch


def _local_fetch(fh: pa.NativeFile) -> Fetch:
    def fetch(start: int, length: int) -> bytes:
        data = fh.read_at(
            length, start
        )  # pread on the handle opened: a shard replaced on disk is not mixed in
        if len(data) != length:
            raise DataLossError(f"short read at {start}: {len(data)} of {length} bytes")
        return data

    return fetch


def open_shard(src: Path | str | ObjectRef, expected: Shard, *, hash_check_max_bytes: int) -> ShardFile:
    """Open a shard and check it against its manifest entry (DataLossError saying which check failed)."""
    digest: str | None = None
    sums = expected.checksums
    try:
        if isinstance(src, ObjectRef):
            info = src.storage.head(src.key)
            if info.size != expected.bytes:
                raise DataLossError(f"size {info.size} bytes differs from the manifest's {expected.bytes}")
            fetch = _remote_fetch(src, info.etag)
            if sums is not None:
                f: ShardFile = _RangedShard.checked(fetch, info.size, sums)
            else:
                if info.size <= hash_check_max_bytes:
                    _, digest = src.storage.digest(src.key, etag=info.etag)
                f = _RangedShard(fetch, info.size, *read_footer(fetch, info.size), None)
        else:
            path = Path(src)
            size = os.stat(path).st_size
            if size != expected.bytes:
                raise DataLossError(f"size {size} bytes differs from the manifest's {expected.bytes}")
            if sums is not None:
                handle = pa.OSFile(str(path))
                f = _RangedShard.checked(_local_fetch(handle), size, sums, keep=handle)
            else:
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
