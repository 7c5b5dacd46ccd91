"""The Arrow Flight baseline server of `loadtest.bench`, run in its own process.

    python loadtest/flight_server.py --shards shards.json --batch-rows 2032 --ready-file ready.json [--from-memory]

DoGet (any ticket) streams every shard listed in --shards, in order, read from Parquet with
`iter_batches(batch_size=--batch-rows)` on each call (nothing is cached between calls); with
--from-memory they are read that way once at start and served from memory. With --from-memory, the
ticket `generator` serves the same batches through a `GeneratorStream` that yields each with
METADATA_BYTES of app_metadata (a shardstream message's header is ~30-50 B): what handing Flight
every message from Python costs with nothing built, the least a data plane that does so can cost
(`loadtest.flight_bench --ceiling`: issue #26). The port it picked is written, with its pid, to
--ready-file once it serves; SIGTERM (default action) ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

GENERATOR_TICKET = b"generator"
METADATA_BYTES = 40


class ShardFlightServer(flight.FlightServerBase):
    def __init__(self, shards: list[str], batch_rows: int, from_memory: bool = False) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.shards = shards
        self.batch_rows = batch_rows
        self.schema = pq.read_schema(shards[0]).remove_metadata()
        self.table = pa.Table.from_batches(list(self._batches()), self.schema) if from_memory else None

    def _batches(self) -> Iterator[pa.RecordBatch]:
        for path in self.shards:
            yield from pq.ParquetFile(path).iter_batches(batch_size=self.batch_rows)

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        del context
        if self.table is not None:
            if ticket.ticket == GENERATOR_TICKET:
                metadata = bytes(METADATA_BYTES)
                return flight.GeneratorStream(self.schema, ((b, metadata) for b in self.table.to_batches()))
            return flight.RecordBatchStream(self.table)  # one IPC message per chunk (= per batch)
        return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(self.schema, self._batches()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True, help="JSON file: a list of Parquet shard paths")
    ap.add_argument("--batch-rows", type=int, required=True)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument(
        "--from-memory", action="store_true", help="read the shards once at start, serve from memory"
    )
    args = ap.parse_args(argv)
    shards = json.loads(Path(args.shards).read_text())
    server = ShardFlightServer(shards, args.batch_rows, args.from_memory)
    tmp = Path(args.ready_file + ".tmp")
    tmp.write_text(json.dumps({"port": server.port, "pid": os.getpid()}))
    tmp.replace(args.ready_file)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
