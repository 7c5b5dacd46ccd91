"""Rows of a dataset version -> one Arrow record batch (blocking; run it in a worker thread).

The read plan says which dataset rows a message needs; this module fetches the row groups that
hold them (through the process-wide cache, several at once) and takes the rows in plan order,
adding the provenance columns `_shard` and `_row`.

Shards are local files or objects of a remote storage (`shardstream.storage.ObjectRef`). A remote
shard is read as the Parquet format allows: its footer once (one ranged read of the tail), then
only the byte ranges of the row groups and columns a batch needs, every read pinned to the ETag
seen when the shard was opened.

Integrity: the first time a reader opens a shard it checks it against the manifest — size always,
sha256 of the whole content when the shard is at most `hash_check_max_bytes`, row-group row counts
from the footer — and remembers the result. Any failure (and any shard that cannot be read) raises
DataLossError naming the shard and the check that failed, so no batch is built from a bad shard.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import Counter, Histogram

from shardstream.errors import DataLossError, InvalidArgumentError, NotFoundError, ShardstreamError
from shardstream.manifest import Manifest
from shardstream.plan import RowLocator
from shardstream.storage import ObjectRef

from .cache import LRUCache
from .spill import SpillTier

__all__ = [
    "DEFAULT_HASH_CHECK_MAX_BYTES",
    "PROVENANCE_COLUMNS",
    "DatasetReader",
    "RowGroupCache",
    "read_footer",
]

PROVENANCE_COLUMNS = ("_shard", "_row")
DEFAULT_HASH_CHECK_MAX_BYTES = 64 << 20  # hash shards up to this size on first open
FOOTER_READ_BYTES = 64 << 10  # first guess at the footer size: one ranged read usually gets it all
COALESCE_GAP_BYTES = 1 << 20  # column chunks closer than this are fetched in one ranged read
FETCH_THREADS = 16  # row groups fetched at once for one batch

STORAGE_READS = Counter("shardstream_storage_reads_total", "Row-group reads from storage")
STORAGE_READ_ERRORS = Counter("shardstream_storage_read_errors_total", "Row-group reads that failed")
STORAGE_READ_BYTES = Counter("shardstream_storage_read_bytes_total", "Bytes of row groups read (decoded)")
STORAGE_FETCHED_BYTES = Counter(
    "shardstream_storage_fetched_bytes_total", "Bytes fetched from remote storage (footers and row groups)"
)
STORAGE_READ_SECONDS = Histogram("shardstream_storage_read_seconds", "Time to read and decode one row group")
SHARD_CHECKS = Counter("shardstream_shard_checks_total", "Shards checked against their manifest", ["result"])

_FETCH_POOL = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shardstream-fetch")
# Byte ranges of one row group: a pool of their own, so row-group tasks never wait on their own pool.
_RANGE_POOL = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shardstream-range")


class RowGroupCache(LRUCache[pa.Table]):
    """The process's in-memory LRU of decoded row groups, over an optional local-disk tier (spill.py)."""

    def __init__(self, capacity_bytes: int, spill: SpillTier | None = None) -> None:
        super().__init__(capacity_bytes, sizeof=lambda t: t.nbytes)
        self.spill = spill


def new_row_group_cache(capacity_bytes: int, spill: SpillTier | None = None) -> RowGroupCache:
    return RowGroupCache(capacity_bytes, spill)


class _Shard(Protocol):
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
        raise DataLossError(f"unreadable Parquet footer ({exc})") from exc
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


class DatasetReader:
    """Reads rows of one manifest from its shards: local paths or `ObjectRef`s of a storage."""

    def __init__(
        self,
        manifest: Manifest,
        shard_paths: Sequence[Path | str | ObjectRef],
        cache: RowGroupCache,
        *,
        hash_check_max_bytes: int = DEFAULT_HASH_CHECK_MAX_BYTES,
    ) -> None:
        self.manifest = manifest
        self._paths = list(shard_paths)
        self._cache = cache
        self._hash_max = hash_check_max_bytes
        self.locator = RowLocator([s.row_groups for s in manifest.shards])
        self._files: dict[int, _Shard] = {}
        self._row_bytes: dict[tuple[str, ...], float] = {}  # decoded bytes per row, for read-ahead
        self._open_locks = [threading.Lock() for _ in manifest.shards]

    def check_columns(self, columns: Sequence[str]) -> list[str]:
        names = self.manifest.schema.names
        if not columns:
            return list(names)
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise InvalidArgumentError(
                f"unknown column(s) {', '.join(map(repr, unknown))} in {self.manifest.ref}; "
                f"columns are: {', '.join(names)}"
            )
        if len(set(columns)) != len(columns):
            raise InvalidArgumentError(f"columns listed twice: {list(columns)}")
        return list(columns)

    def _file(self, shard: int) -> _Shard:
        f = self._files.get(shard)
        if f is not None:
            return f
        with self._open_locks[shard]:  # one check per shard; other shards open in parallel
            f = self._files.get(shard)
            if f is None:
                try:
                    f = self._open_checked(shard)
                except DataLossError as exc:
                    SHARD_CHECKS.labels("failed").inc()
                    raise self._loss(shard, str(exc)) from exc
                SHARD_CHECKS.labels("ok").inc()
                self._files[shard] = f
            return f

    def _open_checked(self, shard: int) -> _Shard:
        """Open a shard and check it against the manifest (DataLossError saying which check failed)."""
        expected = self.manifest.shards[shard]
        src = self._paths[shard]
        digest: str | None = None
        try:
            if isinstance(src, ObjectRef):
                info = src.storage.head(src.key)
                if info.size != expected.bytes:
                    raise DataLossError(
                        f"size {info.size} bytes differs from the manifest's {expected.bytes}"
                    )
                if info.size <= self._hash_max:
                    _, digest = src.storage.digest(src.key, etag=info.etag)
                f: _Shard = _RemoteShard(src, info.size, info.etag)
            else:
                path = Path(src)
                size = os.stat(path).st_size
                if size != expected.bytes:
                    raise DataLossError(f"size {size} bytes differs from the manifest's {expected.bytes}")
                if size <= self._hash_max:
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
            raise DataLossError(f"cannot open as Parquet ({exc})") from exc
        if digest is not None and digest != expected.sha256:
            raise DataLossError(f"sha256 {digest[:16]}… differs from the manifest's {expected.sha256[:16]}…")
        actual = f.row_group_counts()
        if actual != expected.row_groups:
            raise DataLossError(f"row groups {actual} differ from the manifest's {expected.row_groups}")
        return f

    def _loss(self, shard: int, what: str) -> DataLossError:
        STORAGE_READ_ERRORS.inc()
        return DataLossError(f"{self.manifest.ref}: shard {self.manifest.shards[shard].uri}: {what}")

    def _fetcher(self, shard: int, group: int, columns: tuple[str, ...]) -> Callable[[], pa.Table]:
        spill = self._cache.spill
        info = self.manifest.shards[shard]

        def read() -> pa.Table:
            t0 = time.perf_counter()
            STORAGE_READS.inc()
            try:
                table = self._file(shard).read_row_group(group, list(columns))
            except DataLossError as exc:
                if str(exc).startswith(f"{self.manifest.ref}: shard "):
                    raise
                raise self._loss(shard, f"row group {group}: {exc}") from exc
            except ShardstreamError:
                STORAGE_READ_ERRORS.inc()
                raise
            except (OSError, pa.ArrowException) as exc:
                raise self._loss(shard, f"row group {group} unreadable ({exc})") from exc
            STORAGE_READ_SECONDS.observe(time.perf_counter() - t0)
            STORAGE_READ_BYTES.inc(table.nbytes)
            if table.num_rows:
                self._row_bytes[columns] = table.nbytes / table.num_rows
            return table

        def fetch() -> pa.Table:
            if spill is None:
                return read()
            # The disk tier: a whole file of the same content, or one read for all processes.
            return spill.get_or_read(info.sha256, group, columns, info.row_groups[group], read)

        return fetch

    def _row_group(self, shard: int, group: int, columns: tuple[str, ...]) -> pa.Table:
        key = (self.manifest.fingerprint, shard, group, columns)
        return self._cache.get(key, self._fetcher(shard, group, columns))

    def read_ahead(
        self, rows: np.ndarray, columns: Sequence[str], budget_bytes: int
    ) -> list[tuple[int, Callable[[], bool]]]:
        """(estimated bytes, task) reading ahead each row group holding `rows` that the cache neither
        holds nor is reading, in order of first use, while the estimates stay within `budget_bytes`.

        Estimates use the decoded bytes per row of the last row group read with these columns (the
        shard's stored bytes per row before any). A task returns True if it read storage.
        """
        cols = tuple(columns)
        if not len(rows):
            return []
        shard, _, group, _ = self.locator.locate(rows)
        keys = shard.astype(np.int64) << 32 | group.astype(np.int64)
        unique, first = np.unique(keys, return_index=True)
        tasks: list[tuple[int, Callable[[], bool]]] = []
        spent = 0
        for k in unique[np.argsort(first)]:
            s, g = int(k >> 32), int(k & 0xFFFFFFFF)
            key = (self.manifest.fingerprint, s, g, cols)
            if key in self._cache:
                continue
            info = self.manifest.shards[s]
            per_row = self._row_bytes.get(cols) or info.bytes / max(1, info.rows)
            estimate = int(per_row * info.row_groups[g])
            if spent + estimate > budget_bytes:
                break
            spent += estimate
            fetch = self._fetcher(s, g, cols)
            tasks.append((estimate, lambda key=key, fetch=fetch: self._cache.prefetch(key, fetch)))
        return tasks

    def take(self, rows: np.ndarray, columns: Sequence[str]) -> pa.RecordBatch:
        """The dataset rows `rows` (in that order) with `columns` and provenance, as one batch."""
        cols = tuple(columns)
        shard, row_in_shard, group, row_in_group = self.locator.locate(rows)
        keys = shard.astype(np.int64) << 32 | group.astype(np.int64)
        unique, inverse = np.unique(keys, return_inverse=True)

        def one(k: np.int64) -> pa.Table:
            return self._row_group(int(k >> 32), int(k & 0xFFFFFFFF), cols)

        # Several row groups are fetched at once (concurrent ranged reads on remote storage).
        tables = list(_FETCH_POOL.map(one, unique)) if len(unique) > 1 else [one(k) for k in unique]
        if tables:
            table = _gather(tables, inverse, row_in_group)
        else:
            schema = self.manifest.schema
            table = pa.table({c: pa.array([], type=schema.field(c).type) for c in cols})
        table = table.append_column("_shard", pa.array(shard.astype(np.int32), type=pa.int32()))
        table = table.append_column("_row", pa.array(row_in_shard, type=pa.int64()))
        return table.combine_chunks().to_batches()[0] if table.num_rows else _empty_batch(table.schema)


def _gather(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """Row `row[i]` of `tables[group[i]]` for every i, in order, touching only the rows taken.

    (A take on the concatenation of the row groups would first concatenate them all: for a
    batch drawn from a window of large row groups, hundreds of MB copied per batch.)
    """
    order = np.argsort(group, kind="stable")  # rows grouped by row group, batch order inside
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(tables)))])
    pieces = []
    for g, t in enumerate(tables):
        rows = row[order[bounds[g] : bounds[g + 1]]]
        n = len(rows)
        if n and rows[-1] - rows[0] == n - 1 and (n == 1 or (np.diff(rows) == 1).all()):
            pieces.append(t.slice(int(rows[0]), n))  # a contiguous run: zero-copy
        else:
            pieces.append(t.take(pa.array(rows)))
    grouped = pa.concat_tables(pieces)
    if (order == np.arange(len(order))).all():
        return grouped  # already in batch order (e.g. an unshuffled read)
    restore = np.empty_like(order)
    restore[order] = np.arange(len(order))
    return grouped.combine_chunks().take(pa.array(restore))


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
