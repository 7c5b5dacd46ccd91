"""The message build path as it was before issue #26, kept for same-run comparisons.

`loadtest.build_bench --previous` alternates it with today's path; tests/test_gather_identity.py and
tests/test_message_buffers.py compare today's bytes against it. A frozen copy, not today's code: a
take per row group fetched through the fetch pool, their concatenation, a reordering take
(`previous_gather`); provenance appended to a table and its chunks combined (`previous_take`); IPC
sizing with a stream writer over a mock sink (`previous_ipc_size`); every message built alone, as
before messages were cut from row groups several a build (`no_runs`, for
`MessageBuilder._group_run`; its chunks cut at row-group ends as today's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from shardstream.server.read import build as build_module
from shardstream.server.read import reader as reader_module
from shardstream.server.read.gather import empty_batch

__all__ = ["no_runs", "previous_gather", "previous_ipc_size", "previous_take"]


def previous_gather(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """Row `row[i]` of `tables[group[i]]` for every i: a take per row group (a contiguous run is a
    slice), their concatenation, a reordering take."""
    order = np.argsort(group, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(tables)))])
    pieces = []
    for g, t in enumerate(tables):
        rows = row[order[bounds[g] : bounds[g + 1]]]
        n = len(rows)
        if n and rows[-1] - rows[0] == n - 1 and (n == 1 or (np.diff(rows) == 1).all()):
            pieces.append(t.slice(int(rows[0]), n))
        else:
            pieces.append(t.take(pa.array(rows)))
    grouped = pa.concat_tables(pieces)
    if (order == np.arange(len(order))).all():
        return grouped
    restore = np.empty_like(order)
    restore[order] = np.arange(len(order))
    return grouped.combine_chunks().take(pa.array(restore))


def _row_group(self: reader_module.DatasetReader, shard: int, group: int, cols: tuple[str, ...]) -> pa.Table:
    """One row group through the cache, unpinned, as the build read them before the cache's leases."""
    return self._cache.get(self._key(shard, group, cols), self._fetcher(shard, group, cols))


def previous_take(
    self: reader_module.DatasetReader, rows: np.ndarray, columns: Sequence[str], spans: object = None
) -> pa.RecordBatch:
    """`DatasetReader.take` as it was before issue #26 (patched in as the method; whole rows only)."""
    assert spans is None, "the reference takes whole rows"
    cols = tuple(columns)
    shard, row_in_shard, group, row_in_group = self.locator.locate(rows)
    n = len(rows)
    if (
        n
        and (shard == shard[0]).all()
        and (group == group[0]).all()
        and (n == 1 or (np.diff(row_in_group) == 1).all())
    ):
        table = _row_group(self, int(shard[0]), int(group[0]), cols).slice(int(row_in_group[0]), n)
        table = table.append_column("_shard", pa.array(shard.astype(np.int32), type=pa.int32()))
        table = table.append_column("_row", pa.array(row_in_shard, type=pa.int64()))
        return table.combine_chunks().to_batches()[0]
    keys = shard.astype(np.int64) << 32 | group.astype(np.int64)
    unique, inverse = np.unique(keys, return_inverse=True)

    def one(k: np.int64) -> pa.Table:
        return _row_group(self, int(k >> 32), int(k & 0xFFFFFFFF), cols)

    tables = list(reader_module._FETCH_POOL.map(one, unique)) if len(unique) > 1 else [one(k) for k in unique]
    if tables:
        table = previous_gather(tables, inverse, row_in_group)
    else:
        schema = self.manifest.schema
        table = pa.table({c: pa.array([], type=schema.field(c).type) for c in cols})
    table = table.append_column("_shard", pa.array(shard.astype(np.int32), type=pa.int32()))
    table = table.append_column("_row", pa.array(row_in_shard, type=pa.int64()))
    return table.combine_chunks().to_batches()[0] if table.num_rows else empty_batch(table.schema)


def previous_ipc_size(batch: pa.RecordBatch) -> int:
    """Bytes of `batch`'s IPC stream, counted by writing it to a mock sink."""
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.size()


def no_runs(self: Any, plan: Any, chunk: Any, steps: Any, order: Any, *args: Any) -> tuple[list[Any], Any]:
    """`MessageBuilder._group_run` that takes no run: every chunk is built the general way. The
    chunks are today's: cut at row-group ends as `_group_run` cuts them (`_in_group`), so the two
    ways make the same messages."""
    chunk, _ = build_module._in_group(plan, chunk, order.run(chunk), steps, plan.readers[0].locator)
    return [], chunk
