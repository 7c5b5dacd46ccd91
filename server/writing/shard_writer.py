"""Batches in, Parquet shards out: the shard layout every ingest writes.

Row groups of a fixed row count (a few MB each, so a reader fetches one with one ranged read) and
shards of a bounded size, with Parquet page checksums (`write_page_checksum`; verified on read).
Each shard, once closed, is read back once for the manifest's `Shard` entry: its row-group counts,
the sha256 of the whole file and the crc32 of its footer and of every column chunk (server/read/checksums.py),
which the reader checks on open and on every row group it fetches (server/read/shards.py). ingest.py owns the
rest of an ingest: inputs, schemas, staging, upload and registration.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.manifest import Shard

from ..read.checksums import footer_bytes_of, scan_shard
from ..read.shards import read_footer

__all__ = ["ShardWriter", "describe_shard"]

READ_BACK_BYTES = 8 << 20  # blocks in which a closed shard is read back for its hashes


def describe_shard(path: Path, uri: str) -> Shard:
    """The manifest entry of the local Parquet file `path`: one read of its footer, one of the whole."""
    size = path.stat().st_size
    with path.open("rb", buffering=0) as f:
        (_, tail), meta = read_footer(lambda start, n: os.pread(f.fileno(), n, start), size)
        blocks = iter(lambda: f.read(READ_BACK_BYTES), b"")
        read, digest, sums = scan_shard(blocks, meta, size, footer_bytes_of(tail))
    groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    return Shard(uri=uri, rows=sum(groups), bytes=read, row_groups=groups, sha256=digest, checksums=sums)


def group_rows(row_group_bytes: int, row_bytes: int) -> int:
    """Rows a row group of about `row_group_bytes` holds: the power of two nearest that many rows
    (within 0.71x-1.41x of the bytes). Batch sizes are powers of two mostly, so an unshuffled
    stream's messages then lie within one row group each and are sent as slices of it: with 496-row
    groups (4 MiB of 8 KiB token rows) every 512-row message straddled two and was copied out of
    them — 9x the build's CPU (loadtest/README.md, "Row groups of a power of two")."""
    rows = max(1.0, row_group_bytes / max(1, row_bytes))
    return int(min(1 << 20, 1 << round(math.log2(rows))))


class ShardWriter:
    """Writes batches into Parquet shards under `out_dir` (`<dataset>/data/<ingest id>/`).

    Row groups hold `row_group_rows` rows, or (None) about `row_group_bytes` judging by the first
    batch, rounded to a power of two (`group_rows`); a shard is closed after `shard_rows` rows, or (None) about
    `shard_bytes` bytes (uncompressed).
    """

    def __init__(
        self,
        out_dir: Path,
        schema: pa.Schema,
        *,
        row_group_rows: int | None,
        row_group_bytes: int,
        shard_rows: int | None,
        shard_bytes: int,
    ) -> None:
        self._dir = out_dir
        self._schema = schema
        self._row_group_bytes = row_group_bytes
        self._shard_rows_max = shard_rows
        self._shard_bytes_max = shard_bytes
        self._rows_per_group: int | None = row_group_rows
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._path: Path | None = None
        self._shard_rows = 0
        self._shard_bytes = 0
        self.shards: list[Shard] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self._rows_per_group is None:
            per_row = max(1, batch.nbytes // batch.num_rows)
            self._rows_per_group = group_rows(self._row_group_bytes, per_row)
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._pending_rows >= self._rows_per_group:
            self._flush_group(self._rows_per_group)

    def _flush_group(self, rows: int) -> None:
        table = pa.Table.from_batches(self._pending, schema=self._schema)
        group, rest = table.slice(0, rows), table.slice(rows)
        self._pending = rest.to_batches()
        self._pending_rows = rest.num_rows
        if self._writer is None:
            self._path = self._dir / f"part-{len(self.shards):05d}.parquet"
            self._writer = pq.ParquetWriter(self._path, self._schema, write_page_checksum=True)
        self._writer.write_table(group, row_group_size=rows)
        self._shard_rows += group.num_rows
        self._shard_bytes += group.nbytes
        full_rows = self._shard_rows_max is not None and self._shard_rows >= self._shard_rows_max
        full_bytes = self._shard_rows_max is None and self._shard_bytes >= self._shard_bytes_max
        if full_rows or full_bytes:
            self._close_shard()

    def _close_shard(self) -> None:
        assert self._writer is not None and self._path is not None
        self._writer.close()
        uri = self._path.relative_to(self._dir.parent.parent).as_posix()
        self.shards.append(describe_shard(self._path, uri))
        self._writer = None
        self._shard_rows = self._shard_bytes = 0

    def finish(self) -> list[Shard]:
        if self._pending_rows:
            self._flush_group(self._pending_rows)
        if self._writer is not None:
            self._close_shard()
        return self.shards
