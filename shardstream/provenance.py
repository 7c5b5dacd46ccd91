"""Provenance: the columns that name where each row is stored, and their form in a message's header.

Every row a server reads carries `_shard` (the shard's index in the version's manifest) and `_row` (the
row in that shard), added by the reader (server/read/reader.py) and sent with each batch (DESIGN §7:
every batch knows its provenance). A dataset whose schema has one of these names is refused by ingest,
register and engine writes (server/writing/). Beside them travel `_source` (a mixture's source index)
and text.pack's `_documents` (server/transforms/pipeline.py `PROVENANCE`, client/batch.py).

A client that sets `ReadRequest.provenance_in_header` gets the two columns of a stream in the stored
order as a `Provenance` in each message's header instead: runs of consecutive rows of one shard
(`one_run`, `runs_of`, the server's) that `expand` turns back into the two columns' values (the
client's; `check` says whether they add up without making them). A message cut from one row group
is one run of 20 bytes where the columns took 12 a row.

Core: both sides may read it.
"""

from __future__ import annotations

import struct

import numpy as np

from .errors import DataLossError
from .v1 import shardstream_pb2 as pb

__all__ = ["PROVENANCE_COLUMNS", "ROW_BYTES", "check", "expand", "joined", "one_run", "runs_of"]

PROVENANCE_COLUMNS = ("_shard", "_row")

_RUN_BYTES = 20  # a run: int32 shard, int64 first row, int64 length
ROW_BYTES = 12  # a row as the columns carry it: int32 shard, int64 row


def one_run(shard: int, row: int, rows: int) -> pb.Provenance:
    """Rows row .. row + rows - 1 of `shard`, in order."""
    return pb.Provenance(shards=struct.pack("<i", shard), rows=struct.pack("<q", row), lengths=struct.pack("<q", rows))


def runs_of(shards: np.ndarray, rows: np.ndarray) -> pb.Provenance:
    """The provenance of rows whose `_shard` and `_row` are `shards` and `rows`, as runs; row by row
    (no `lengths`) when runs would take more bytes than the columns did."""
    n = len(rows)
    if n == 0:
        return pb.Provenance()
    breaks = np.flatnonzero((np.diff(rows) != 1) | (np.diff(shards) != 0)) + 1
    if _RUN_BYTES * (len(breaks) + 1) >= ROW_BYTES * n:
        return pb.Provenance(shards=_le(shards, "<i4"), rows=_le(rows, "<i8"))
    starts = np.concatenate([[0], breaks])
    lengths = np.diff(np.append(starts, n))
    return pb.Provenance(shards=_le(shards[starts], "<i4"), rows=_le(rows[starts], "<i8"), lengths=_le(lengths, "<i8"))


def joined(parts: list[pb.Provenance]) -> pb.Provenance:
    """The provenance of the rows of `parts`, one after another (a step sent in parts, put back
    together: client/parts.py); row by row only if every part is."""
    if all(not p.lengths for p in parts):
        return pb.Provenance(shards=b"".join(p.shards for p in parts), rows=b"".join(p.rows for p in parts))
    lengths = [p.lengths or np.ones(len(p.rows) // 8, "<i8").tobytes() for p in parts]
    return pb.Provenance(
        shards=b"".join(p.shards for p in parts), rows=b"".join(p.rows for p in parts), lengths=b"".join(lengths)
    )


def check(p: pb.Provenance, n: int) -> None:
    """DataLossError unless `p` is well formed and names `n` rows (without making the rows' arrays)."""
    lengths = p.lengths
    if len(lengths) == 8 and len(p.shards) == 4 and len(p.rows) == 8:  # one run: a message cut from a row group
        (rows,) = struct.unpack("<q", lengths)
        if rows == n and n >= 1:
            return
    _runs(p, n)


def expand(p: pb.Provenance, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The `_shard` (int32) and `_row` (int64) values of the `n` rows `p` names, in order;
    DataLossError when `p` is malformed or names other than `n` rows."""
    shards, starts, lengths = _runs(p, n)
    if lengths is None:
        return shards, starts
    if len(shards) == 1:
        return np.full(n, shards[0], np.int32), np.arange(starts[0], starts[0] + n, dtype=np.int64)
    firsts = np.cumsum(lengths) - lengths  # where each run starts in the message
    return np.repeat(shards, lengths), np.repeat(starts - firsts, lengths) + np.arange(n, dtype=np.int64)


def _runs(p: pb.Provenance, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`p`'s shards, first rows and lengths (None: every run one row), checked against `n` rows."""
    if len(p.shards) % 4 or len(p.rows) % 8 or len(p.lengths) % 8:
        raise DataLossError("a message's provenance is malformed (its arrays are not whole values)")
    shards = np.frombuffer(p.shards, "<i4")
    starts = np.frombuffer(p.rows, "<i8")
    runs = len(shards)
    if len(starts) != runs or (p.lengths and len(p.lengths) != 8 * runs):
        raise DataLossError(
            f"a message's provenance is malformed ({runs} shards, {len(starts)} rows, {len(p.lengths) // 8} lengths)"
        )
    if not p.lengths:
        if runs != n:
            raise DataLossError(f"a message's provenance names {runs} rows, the message has {n}")
        return shards, starts, None
    lengths = np.frombuffer(p.lengths, "<i8")
    if int(lengths.min()) < 1:
        raise DataLossError("a message's provenance is malformed (a run of no rows)")
    if int(lengths.sum()) != n:
        raise DataLossError(f"a message's provenance names {int(lengths.sum())} rows, the message has {n}")
    return shards, starts, lengths


def _le(values: np.ndarray, dtype: str) -> bytes:
    return np.ascontiguousarray(values, dtype=dtype).tobytes()
