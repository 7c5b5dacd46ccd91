"""Rows of a dataset version -> one Arrow record batch (blocking; run it in a worker thread).

The read plan says which dataset rows a message needs; this module fetches the row groups that
hold them (through the process-wide cache) and takes the rows in plan order, adding the
provenance columns `_shard` and `_row`. A shard that cannot be read, or whose row groups disagree
with the manifest, raises DataLossError naming the shard and the check that failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import Counter, Histogram

from shardstream.errors import DataLossError, InvalidArgumentError
from shardstream.manifest import Manifest
from shardstream.plan import RowLocator

from .cache import LRUCache

__all__ = ["PROVENANCE_COLUMNS", "DatasetReader", "RowGroupCache"]

PROVENANCE_COLUMNS = ("_shard", "_row")

STORAGE_READS = Counter("shardstream_storage_reads_total", "Row-group reads from storage")
STORAGE_READ_ERRORS = Counter("shardstream_storage_read_errors_total", "Row-group reads that failed")
STORAGE_READ_BYTES = Counter("shardstream_storage_read_bytes_total", "Bytes of row groups read (decoded)")
STORAGE_READ_SECONDS = Histogram("shardstream_storage_read_seconds", "Time to read and decode one row group")

RowGroupCache = LRUCache[pa.Table]


def new_row_group_cache(capacity_bytes: int) -> RowGroupCache:
    return LRUCache(capacity_bytes, sizeof=lambda t: t.nbytes)


class DatasetReader:
    """Reads rows of one manifest from local shard files."""

    def __init__(self, manifest: Manifest, shard_paths: Sequence[Path], cache: RowGroupCache) -> None:
        self.manifest = manifest
        self._paths = list(shard_paths)
        self._cache = cache
        self.locator = RowLocator([s.row_groups for s in manifest.shards])
        self._files: dict[int, pq.ParquetFile] = {}
        self._files_lock = threading.Lock()

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

    def _file(self, shard: int) -> pq.ParquetFile:
        with self._files_lock:
            f = self._files.get(shard)
            if f is None:
                path = self._paths[shard]
                try:
                    f = pq.ParquetFile(path)
                except (OSError, pa.ArrowException) as exc:
                    raise self._loss(shard, f"cannot open as Parquet ({exc})") from exc
                expected = self.manifest.shards[shard].row_groups
                actual = tuple(f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups))
                if actual != expected:
                    raise self._loss(shard, f"row groups {actual} differ from the manifest's {expected}")
                self._files[shard] = f
            return f

    def _loss(self, shard: int, what: str) -> DataLossError:
        STORAGE_READ_ERRORS.inc()
        return DataLossError(f"{self.manifest.ref}: shard {self.manifest.shards[shard].uri}: {what}")

    def _row_group(self, shard: int, group: int, columns: tuple[str, ...]) -> pa.Table:
        def fetch() -> pa.Table:
            t0 = time.perf_counter()
            STORAGE_READS.inc()
            try:
                table = self._file(shard).read_row_group(group, columns=list(columns))
            except DataLossError:
                raise
            except (OSError, pa.ArrowException) as exc:
                raise self._loss(shard, f"row group {group} unreadable ({exc})") from exc
            STORAGE_READ_SECONDS.observe(time.perf_counter() - t0)
            STORAGE_READ_BYTES.inc(table.nbytes)
            return table

        key = (self.manifest.fingerprint, shard, group, columns)
        return self._cache.get(key, fetch)

    def take(self, rows: np.ndarray, columns: Sequence[str]) -> pa.RecordBatch:
        """The dataset rows `rows` (in that order) with `columns` and provenance, as one batch."""
        cols = tuple(columns)
        shard, row_in_shard, group, row_in_group = self.locator.locate(rows)
        keys = shard.astype(np.int64) << 32 | group.astype(np.int64)
        unique, inverse = np.unique(keys, return_inverse=True)
        tables = [self._row_group(int(k >> 32), int(k & 0xFFFFFFFF), cols) for k in unique]
        if tables:
            starts = np.concatenate([[0], np.cumsum([t.num_rows for t in tables])[:-1]]).astype(np.int64)
            table = pa.concat_tables(tables).take(pa.array(starts[inverse] + row_in_group))
        else:
            schema = self.manifest.schema
            table = pa.table({c: pa.array([], type=schema.field(c).type) for c in cols})
        table = table.append_column("_shard", pa.array(shard.astype(np.int32), type=pa.int32()))
        table = table.append_column("_row", pa.array(row_in_shard, type=pa.int64()))
        return table.combine_chunks().to_batches()[0] if table.num_rows else _empty_batch(table.schema)


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
