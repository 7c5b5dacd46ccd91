"""The Arrow Flight baseline server of `loadtest.bench`, run in its own process.

    python loadtest/flight_server.py --shards shards.json --batch-rows 2032 --ready-file ready.json [--from-memory]

DoGet (any ticket) streams every shard listed in --shards, in order, read from Parquet with
`iter_batches(batch_size=--batch-rows)` on each call (nothing is cached between calls); with
--from-memory they are read that way once at start and served from memory. With --from-memory, the
ticket `generator` serves the same batches through a `GeneratorStream` that yields each with
METADATA_BYTES of app_metadata (a shardstream message's header is ~30-50 B): what handing Flight
every message from Python costs with nothing built, the least a data plane that does so can cost
(`loadtest.flight_bench --ceiling`: issue #26). With --from-memory, the ticket
`gather:MODE:WINDOW[:SEED]` (MODE `block` or `full`) serves the table's rows in a shuffled order,
each batch of --batch-rows rows copied out of the table as it is sent (`np.take` of whole rows, a
column at a time; a column of variable-width values, such as encoded images, by Arrow's take) with
the same app_metadata: the least a Flight server that shuffles does, against which shardstream's
shuffled streams can be set (`loadtest.flight_bench --gather`). The order is shardstream's kind, not
its permutation: full, any row anywhere; block, the row groups (of the Parquet shards) in a random
order, the rows permuted within each WINDOW consecutive row groups. Each such DoGet makes its own
order from SEED (default 0; flight_bench sends the epoch), as a server that shuffles every epoch
anew must: numpy's permutation, ~15-70 ns a row (until 2026-11-29 it was made at the first DoGet and
kept, which left a tiny-row baseline ~0.7 CPU-s a GB short of shuffling). The port it picked is
written, with its pid, to --ready-file once it serves; SIGTERM (default action) ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

GENERATOR_TICKET = b"generator"
GATHER_TICKET = b"gather:"  # + b"block:WINDOW" or b"full:WINDOW", then optionally b":SEED"
METADATA_BYTES = 40


def shuffled_order(group_rows: list[int], mode: str, window: int, seed: int = 0) -> np.ndarray:
    """Every row index of a table of row groups of `group_rows` rows, in a shuffled order of `mode`:
    "full", a permutation of all rows; "block", the row groups in a random order, cut into windows of
    `window` row groups, the rows of each window permuted."""
    rng = np.random.default_rng(seed)
    if mode == "full":
        return rng.permutation(sum(group_rows))
    if mode != "block" or window < 1:
        raise ValueError(f"no shuffled order {mode!r} with window {window}")
    starts = np.concatenate([[0], np.cumsum(group_rows)]).astype(np.int64)
    groups = rng.permutation(len(group_rows))
    windows = []
    for w in range(0, len(groups), window):
        rows = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups[w : w + window]])
        windows.append(rng.permutation(rows))
    return np.concatenate(windows) if windows else np.zeros(0, np.int64)


def _row_view(column: pa.ChunkedArray) -> np.ndarray | pa.Array:
    """A column of numbers, or of fixed-size lists of them, without nulls and in one chunk, as one
    opaque numpy item per row (a row taken is one copy of its bytes); any other column as its one
    Arrow array (taken by Arrow). What server/read/gather.py's `_column_view` does for shardstream,
    written again here on purpose: the baseline runs no shardstream code."""
    arr = column.chunk(0) if column.num_chunks == 1 else None
    if arr is None or arr.null_count:
        raise ValueError("the gather serves columns of one chunk without nulls")
    t = arr.type
    size = t.list_size if pa.types.is_fixed_size_list(t) else 1
    values = arr.values.slice(arr.offset * size, len(arr) * size) if pa.types.is_fixed_size_list(t) else arr
    vt = values.type
    if values.null_count or not (pa.types.is_integer(vt) or pa.types.is_floating(vt)):
        return arr  # (binary rows, such as encoded images: Arrow's take)
    item = vt.bit_width // 8
    data = np.frombuffer(values.buffers()[1], np.uint8, len(arr) * size * item, values.offset * item)
    return data.view(np.dtype((np.void, size * item)))


def _from_rows(t: pa.DataType, rows: np.ndarray | pa.Array) -> pa.Array:
    """The column of type `t` whose rows are `rows` (`_row_view`'s items, or an Arrow array as it is)."""
    if isinstance(rows, pa.Array):
        return rows
    buf = pa.py_buffer(rows)
    if pa.types.is_fixed_size_list(t):
        values = pa.Array.from_buffers(t.value_type, len(rows) * t.list_size, [None, buf])
        return pa.Array.from_buffers(t, len(rows), [None], children=[values])
    return pa.Array.from_buffers(t, len(rows), [None, buf])


class ShardFlightServer(flight.FlightServerBase):
    def __init__(
        self, shards: list[str], batch_rows: int, from_memory: bool = False, tls: tuple[bytes, bytes] | None = None
    ) -> None:
        if tls is None:
            super().__init__("grpc://127.0.0.1:0")
        else:  # (certificate, key) PEM: the same TLS a `serve --tls-cert/--tls-key` speaks
            super().__init__("grpc+tls://127.0.0.1:0", tls_certificates=[flight.CertKeyPair(*tls)])
        self.shards = shards
        self.batch_rows = batch_rows
        self.schema = pq.read_schema(shards[0]).remove_metadata()
        self.table = pa.Table.from_batches(list(self._batches()), self.schema) if from_memory else None
        self._rows: list[np.ndarray | pa.Array] | None = None  # the table's columns, for the gather
        self._groups: list[int] | None = None  # the row groups' rows, for the orders

    def _batches(self) -> Iterator[pa.RecordBatch]:
        for path in self.shards:
            yield from pq.ParquetFile(path).iter_batches(batch_size=self.batch_rows)

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        del context
        if self.table is not None:
            if ticket.ticket == GENERATOR_TICKET:
                metadata = bytes(METADATA_BYTES)
                return flight.GeneratorStream(self.schema, ((b, metadata) for b in self.table.to_batches()))
            if ticket.ticket.startswith(GATHER_TICKET):
                return flight.GeneratorStream(self.schema, self._gathered(self._order(ticket.ticket)))
            return flight.RecordBatchStream(self.table)  # one IPC message per chunk (= per batch)
        return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(self.schema, self._batches()))

    def _order(self, ticket: bytes) -> np.ndarray:
        """The order a gather ticket names, made for this DoGet (a new epoch's order costs its server this)."""
        mode, window, *seed = ticket[len(GATHER_TICKET) :].decode().split(":")
        if self._groups is None:
            shards = [pq.ParquetFile(path).metadata for path in self.shards]
            self._groups = [m.row_group(i).num_rows for m in shards for i in range(m.num_row_groups)]
        return shuffled_order(self._groups, mode, int(window), int(seed[0]) if seed else 0)

    def _gathered(self, order: np.ndarray) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """The table's rows in `order`, each batch copied out of the table as it is asked for."""
        assert self.table is not None
        if self._rows is None:
            whole = self.table.combine_chunks()
            self._rows = [_row_view(c) for c in whole.columns]  # (views: they keep `whole` alive)
        metadata = bytes(METADATA_BYTES)
        types = self.schema.types
        for a in range(0, len(order), self.batch_rows):
            rows = order[a : a + self.batch_rows]
            taken = pa.array(rows) if any(isinstance(v, pa.Array) for v in self._rows) else None
            columns = [
                _from_rows(t, view.take(taken) if isinstance(view, pa.Array) else np.take(view, rows, axis=0))
                for t, view in zip(types, self._rows, strict=True)
            ]
            yield pa.RecordBatch.from_arrays(columns, schema=self.schema), metadata


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True, help="JSON file: a list of Parquet shard paths")
    ap.add_argument("--batch-rows", type=int, required=True)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument(
        "--from-memory", action="store_true", help="read the shards once at start, serve from memory"
    )
    ap.add_argument("--tls-cert", help="serve TLS with this PEM certificate (and --tls-key)")
    ap.add_argument("--tls-key", help="the certificate's PEM key")
    args = ap.parse_args(argv)
    shards = json.loads(Path(args.shards).read_text())
    tls = (Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes()) if args.tls_cert else None
    server = ShardFlightServer(shards, args.batch_rows, args.from_memory, tls)
    tmp = Path(args.ready_file + ".tmp")
    tmp.write_text(json.dumps({"port": server.port, "pid": os.getpid()}))
    tmp.replace(args.ready_file)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
