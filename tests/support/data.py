"""The toy datasets the tests read, and Parquet put under any registry root (local or s3://)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.manifest import Manifest
from shardstream.server.backends.roots import open_storage
from shardstream.server.writing.ingest import IngestOptions, ingest

__all__ = ["N_ROWS", "make_table", "put_parquet", "write_dataset"]

# A prime row count, shards of unequal size and small row groups, so steps straddle everything.
N_ROWS = 1009


def make_table(n: int, start: int = 0) -> pa.Table:
    """Rows `start .. start+n`: id, x = [id, id, id] as float32, label = id % 7, text = 'sample-<id>'."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3),
            "label": pa.array((ids % 7).astype(np.int32)),
            "text": pa.array([f"sample-{i}" for i in ids]),
        }
    )


def write_dataset(
    root: Path, name: str, n: int, *, row_group_rows: int = 50, shard_rows: int = 230, start: int = 0
) -> Manifest:
    """Ingest make_table(n, start) as a new version of `name` under the local `root`."""
    src = root.parent / f"src-{name}-{n}-{start}.parquet"
    pq.write_table(make_table(n, start), src)
    return ingest(
        src, name, root, IngestOptions(row_group_rows=row_group_rows, shard_rows=shard_rows, progress=False)
    )


def put_parquet(root: str, key: str, table: pa.Table, tmp_path: Path, row_group_size: int = 40) -> None:
    """Write `table` as Parquet to `key` under `root` (a directory or s3://), via a local file."""
    local = tmp_path / f"tmp-{key.replace('/', '_')}"
    pq.write_table(table, local, row_group_size=row_group_size)
    with open_storage(root) as st:
        st.put_file(key, local)
