"""Batches in, Parquet shards out: the shard layout every ingest writes.

Row groups of a fixed row count (a few MB each, so a reader fetches one with one ranged read) and
shards of a bounded size; each shard, once closed, is read back for its row-group counts and hashed
into the manifest's `Shard` entry (the checks the reader makes on open, shards.py). ingest.py owns
the rest of an ingest: inputs, schemas, staging, upload and registration.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.manifest import Shard

__all__ = ["ShardWriter"]


class ShardWriter:
    """Writes batches into Parquet shards under `out_dir` (`<dataset>/data/<ingest id>/`).

    Row groups hold `row_group_rows` rows, or (None) as many as make about `row_group_bytes`
    judging by the first batch; a shard is closed after `shard_rows` rows, or (None) about
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
            self._rows_per_group = max(1, min(1 << 20, self._row_group_bytes // per_row))
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
            self._writer = pq.ParquetWriter(self._path, self._schema)
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
        meta = pq.read_metadata(self._path)
        groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        digest = hashlib.sha256()
        with self._path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        self.shards.append(
            Shard(
                uri=self._path.relative_to(self._dir.parent.parent).as_posix(),
                rows=sum(groups),
                bytes=self._path.stat().st_size,
                row_groups=groups,
                sha256=digest.hexdigest(),
            )
        )
        self._writer = None
        self._shard_rows = self._shard_bytes = 0

    def finish(self) -> list[Shard]:
        if self._pending_rows:
            self._flush_group(self._pending_rows)
        if self._writer is not None:
            self._close_shard()
        return self.shards
