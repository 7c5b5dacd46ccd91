"""A prototype of shardstream's data plane on Arrow Flight: DoGet with the `ReadRequest` as ticket.

    python -m loadtest.flight_plane --root ROOT --ready-file F [--cache-mib 1024] [--transform-threads 1]

The server (`ReadFlightServer`, a `pyarrow.flight.FlightServerBase`) plans a ticket exactly as the
grpcio servicer plans a Read (server/read_plan.py: `ReadPlanner.plan`, the same registry, row-group
cache and request limits) and builds the same record batches (server/build.py: `MessageSteps` for what
each message covers, `MessageBuilder.build_batch` for its rows, provenance and transforms). Instead of
framing header + Arrow IPC into one `bytes` (framing.py), each message is one Flight record batch whose
`app_metadata` is the serialized `ReadHeader`: Flight's C++ writes the batch's buffers into gRPC
without a Python copy. `flight_messages(port, request)` is the client side: a plain
`pyarrow.flight.FlightClient` DoGet yielding (ReadHeader, RecordBatch), which loadtest/flight_bench.py
feeds to the Loader's decode (client/decode.py).

What the prototype leaves out (the migration plan in loadtest/README.md says where each goes): steps
over the message cap sent in parts (a chunk is always whole steps here), admission (streams per
server and per peer, the buffer budget), the write timeout, read-ahead, metrics and TLS/auth (Flight
has both: `tls_certificates`, middleware). Errors leave as Flight errors carrying the same message;
the grpcio servicer's status-code mapping (errors.py) would move to `FlightError` subclasses.

The port it picked is written, with its pid, to --ready-file once it serves; SIGTERM (default action) ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight

from shardstream import allocator
from shardstream.errors import ShardstreamError
from shardstream.framing import decode_read_response, ipc_size, read_ipc
from shardstream.server.build import MessageBuilder, MessageSteps
from shardstream.server.read_plan import ReadPlan, ReadPlanner
from shardstream.server.reader import new_row_group_cache
from shardstream.server.roots import open_registry
from shardstream.server.spill import SpillTier
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["ReadFlightServer", "flight_messages", "main"]

DEFAULT_CACHE_MIB = 1024  # as `shardstream serve`
_FRAMING_BYTES = 48  # what the grpcio message adds around header + IPC: the same step grouping here
BUILD_THREADS = 16  # messages built at once (one per stream at a time)


class ReadFlightServer(flight.FlightServerBase):
    """DoGet(ticket = serialized ReadRequest) -> the Read stream's messages as Flight record batches."""

    def __init__(
        self,
        root: str,
        *,
        location: str = "grpc://127.0.0.1:0",
        cache_bytes: int = DEFAULT_CACHE_MIB << 20,
        cache_dir: str | None = None,
        transform_threads: int = 1,
    ) -> None:
        super().__init__(location)
        self.registry = open_registry(root)
        spill = SpillTier(cache_dir) if cache_dir else None
        self.planner = ReadPlanner(self.registry, new_row_group_cache(cache_bytes, spill))
        self.builder = MessageBuilder(transform_threads=transform_threads)
        self._build_pool = ThreadPoolExecutor(BUILD_THREADS, thread_name_prefix="flight-build")

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        del context
        try:
            request = pb.ReadRequest.FromString(ticket.ticket)
        except Exception as exc:  # noqa: BLE001 — protobuf's DecodeError
            raise flight.FlightServerError("the ticket is not a ReadRequest") from exc
        try:
            plan = self.planner.plan(request)
            messages = self._messages(plan)
            first = next(messages)  # the stream's schema is the first batch's
        except ShardstreamError as exc:
            raise flight.FlightServerError(f"{type(exc).__name__}: {exc}") from exc

        def rest() -> Iterator[tuple[pa.RecordBatch, bytes]]:
            yield first
            yield from messages

        return flight.GeneratorStream(first[0].schema, rest())

    def _messages(self, plan: ReadPlan) -> Iterator[tuple[pa.RecordBatch, bytes]]:
        """(batch, ReadHeader bytes) per message, in order: the chunks build.py's stream would send."""
        if plan.nothing_left:  # one message without rows: the epoch is over (transforms set its schema)
            header, payload = decode_read_response(self.builder.end_of_epoch(plan))
            header.ClearField("padding")  # the grpcio framing's alignment
            yield read_ipc(payload), header.SerializeToString()
            return
        steps = MessageSteps(plan)

        def build() -> tuple[pa.RecordBatch, bytes] | None:
            if not steps.remaining:
                return None
            chunk = steps.next()
            header, batch = self.builder.build_batch(plan, chunk)
            metadata = header.SerializeToString()
            steps.record(chunk, batch.num_rows, ipc_size(batch) + len(metadata) + _FRAMING_BYTES)
            return batch, metadata

        # As the grpcio servicer does, the next message is built (in a worker thread) while Flight
        # sends this one; one build at a time per stream, so `steps` is used by one thread at a time.
        pending = self._build_pool.submit(build)
        while True:
            message = pending.result()
            if message is None:
                return
            pending = self._build_pool.submit(build)
            yield message


def flight_messages(port: int, request: pb.ReadRequest) -> Iterator[tuple[pb.ReadHeader, pa.RecordBatch]]:
    """A plain FlightClient's DoGet of `request`: (header, batch) per message."""
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        reader = client.do_get(flight.Ticket(request.SerializeToString()))
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return
            yield pb.ReadHeader.FromString(chunk.app_metadata.to_pybytes()), chunk.data
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.flight_plane", description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="registry root (a local directory or s3://...)")
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--cache-mib", type=int, default=DEFAULT_CACHE_MIB)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--transform-threads", type=int, default=1)
    args = ap.parse_args(argv)
    allocator.tune()  # the allocator settings `shardstream serve` applies to itself
    server = ReadFlightServer(
        args.root,
        cache_bytes=args.cache_mib << 20,
        cache_dir=args.cache_dir,
        transform_threads=args.transform_threads,
    )
    tmp = Path(args.ready_file + ".tmp")
    tmp.write_text(json.dumps({"port": server.port, "pid": os.getpid()}))
    tmp.replace(args.ready_file)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
