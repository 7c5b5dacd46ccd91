"""Clients that stop reading, for the admission tests: Read streams left unread, over a plain Flight
client of the server's data plane.

`write_blobs` makes a dataset of incompressible rows (so messages are as large as asked), `Streams`
opens Read streams from this process and reads only their first message (or their error),
`stalled_process` runs the same in a child process that a test can SIGSTOP (`python -m
tests.support.stalls TARGET N REQUEST_HEX READY_FILE`), and `server_rss` is a server's resident
memory (its whole process group: a supervisor's workers too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.flight as flight

from shardstream.errors import FlightStatus
from shardstream.manifest import Manifest
from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

from .media import write_table

__all__ = ["OPTIONS", "Streams", "server_rss", "stalled_process", "write_blobs"]

REPO = Path(__file__).resolve().parents[2]
# No BDP probing: the connection window stays at 64 KiB, so what a client leaves unread stays on
# the server (grpc would otherwise grow the window and buffer megabytes in the client).
OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.http2.bdp_probe", 0)]


def write_blobs(root: Path, name: str, rows: int, row_bytes: int) -> Manifest:
    """`rows` rows of `row_bytes` random bytes each (column `blob`) and their index (`id`)."""
    rng = np.random.default_rng(rows)
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "blob": pa.array([rng.bytes(row_bytes) for _ in range(rows)], pa.binary()),
        }
    )
    return write_table(root, name, table, row_group_rows=16, shard_rows=64)


class Streams:
    """Read streams opened on `connections` Flight clients of `target`'s data plane (its port from
    the server's ListDatasets answer), read no further than their first message; `close()` cancels
    them and closes the clients."""

    def __init__(self, target: str, connections: int = 1) -> None:
        self.channels = [grpc.insecure_channel(target, options=OPTIONS) for _ in range(connections)]
        self.calls: list[Any] = []
        self.codes: list[grpc.StatusCode] = []  # the first message's outcome, per stream opened
        listing = self.channels[0].unary_unary(
            "/shardstream.v1.ShardStream/ListDatasets",
            request_serializer=pb.ListDatasetsRequest.SerializeToString,
            response_deserializer=pb.ListDatasetsResponse.FromString,
        )(pb.ListDatasetsRequest(), timeout=30)
        port = listing.datasets[0].data_port if listing.datasets else 0
        host = target.rpartition(":")[0]
        assert port, "the server names no data port"
        self.flights = [flight.connect(f"grpc://{host}:{port}", generic_options=OPTIONS) for _ in range(connections)]

    def _call(self, i: int, data: bytes, timeout_s: float) -> Any:
        options = flight.FlightCallOptions(timeout=timeout_s)
        return self.flights[i % len(self.flights)].do_get(flight.Ticket(data), options)

    def open(self, request: pb.ReadRequest, n: int, timeout_s: float = 60) -> list[grpc.StatusCode]:
        """Open n streams of `request`; the outcome of each first message (OK or the error's code)."""
        data = request.SerializeToString()
        out = []
        for i in range(n):
            try:
                call = self._call(i, data, timeout_s)
                self.calls.append(call)
                call.read_chunk()
                out.append(grpc.StatusCode.OK)
            except flight.FlightError as exc:
                out.append(FlightStatus.of(exc).code())
        self.codes += out
        return out

    def refusal(self, request: pb.ReadRequest) -> grpc.RpcError:
        """The error of one more stream (its code, details and trailing metadata)."""
        try:
            self.open_raw(request)
        except flight.FlightError as exc:
            return FlightStatus.of(exc)
        raise AssertionError("the stream was admitted")

    def read_through(self, data: bytes, timeout_s: float = 120) -> tuple[grpc.StatusCode, int, int]:
        """Read a stream of `data` (a ReadRequest's bytes, or not) to its end: (its status, its
        messages, its largest message's bytes)."""
        messages = largest = 0
        try:
            for chunk in self._call(0, data, timeout_s):
                messages += 1
                largest = max(largest, chunk.data.nbytes + len(chunk.app_metadata or b""))
            return grpc.StatusCode.OK, messages, largest
        except flight.FlightError as exc:
            return FlightStatus.of(exc).code(), messages, largest

    def open_raw(self, request: pb.ReadRequest) -> None:
        call = self._call(0, request.SerializeToString(), 30)
        self.calls.append(call)
        call.read_chunk()

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for client in self.flights:
            client.close()
        for channel in self.channels:
            channel.close()

    def __enter__(self) -> Streams:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_rss(server: LocalServer) -> int:
    """Resident bytes of the server's processes (the supervisor and its workers)."""
    total = 0
    for pid in {server.pid, *server.worker_pids}:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def stalled_process(target: str, request: pb.ReadRequest, n: int, tmp: Path) -> subprocess.Popen[bytes]:
    """A child process (own process group) that opens n streams, reads their first message, writes
    READY_FILE with their codes and then reads nothing more until killed."""
    ready = tmp / "stalled.ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.stalls",
            target,
            str(n),
            request.SerializeToString().hex(),
            str(ready),
        ],
        cwd=REPO,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, 9)
            raise AssertionError(f"the stalled client did not start (exit code {proc.poll()})")
        time.sleep(0.02)
    return proc


def _main(target: str, n: str, request_hex: str, ready: str) -> None:
    streams = Streams(target)
    codes = streams.open(pb.ReadRequest.FromString(bytes.fromhex(request_hex)), int(n))
    Path(ready + ".tmp").write_text(" ".join(c.name for c in codes))
    os.replace(ready + ".tmp", ready)
    while True:  # read nothing more; the test stops (SIGSTOP) and kills this process
        time.sleep(3600)


if __name__ == "__main__":
    _main(*sys.argv[1:])
