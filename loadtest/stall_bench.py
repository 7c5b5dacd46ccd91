"""Server memory with stalled Read streams: peak RSS against the documented bound, per shuffle mode.

    python -m loadtest.stall_bench [--streams 256 1000] [--modes none block full] [--budget-mib 256]
                                   [--cache-mib 64] [--rows 2048] [--row-kib 64] [--json PATH]

One dataset of incompressible rows (`--rows` rows of `--row-kib` KiB, row groups of 64 rows, shards
of 512), and for each (number of streams, shuffle mode) a fresh `shardstream serve` with
`--stream-buffer-mib B --cache-mib C` (and the stream limits raised to the number of streams, so the
buffer budget is the limit that binds). The server is warmed by one stream read through (thread
pools started, cache filled); its RSS then is `warm`. Then this process opens the streams (over
ceil(N/128) Flight connections whose HTTP/2 window stays at 64 KiB: no BDP probing), 32 at a time
(a burst, as ranks starting together), reads each one's first message and nothing more, and samples the server's RSS every 50 ms while it opens them
and for `--settle-s` after: `peak`. The bound (deploy/RUNBOOK.md, "Limits"; server/serving/admission.py):

    warm + cache + budget x BOUND_FACTOR

Printed per run: streams admitted and refused (RESOURCE_EXHAUSTED), the buffer gauge's peak
(`shardstream_stream_buffer_bytes`, sampled), warm, peak, the bound and peak / bound. Figures only
(exit 0); the slow test tests/test_admission.py asserts the bound on a smaller configuration.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, versions
from shardstream.errors import FlightStatus
from shardstream.server.local_fleet import LocalServer
from shardstream.server.serving.admission import BOUND_FACTOR
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main"]

MiB = 1 << 20
DATASET = "stallblobs"
ROW_GROUP_ROWS = 64
SHARD_ROWS = 512
STREAMS_PER_CONNECTION = 128
OPENERS = 32  # streams opened at once
# No BDP probing: each connection's window stays at 64 KiB, so what the client leaves unread stays
# on the server (gRPC would otherwise grow the window and buffer megabytes here).
CLIENT_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.http2.bdp_probe", 0)]


def write_dataset(workdir: Path, rows: int, row_bytes: int) -> Path:
    rng = np.random.default_rng(rows)
    src = workdir / "src.parquet"
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "blob": pa.array([rng.bytes(row_bytes) for _ in range(rows)], pa.binary()),
        }
    )
    pq.write_table(table, src, compression="none")
    root = workdir / "root"
    ingest(src, DATASET, root, IngestOptions(row_group_rows=ROW_GROUP_ROWS, shard_rows=SHARD_ROWS, progress=False))
    src.unlink()
    return root


def request(mode: str, batch_rows: int, message_bytes: int, seed: int) -> pb.ReadRequest:
    return pb.ReadRequest(
        dataset=f"{DATASET}@1",
        seed=seed,
        shuffle=pb.Shuffle(mode=mode),
        world_size=1,
        batch_size=batch_rows,
        max_message_bytes=message_bytes,
    )


def metric(server: LocalServer, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def rss(server: LocalServer) -> int:
    try:
        return int(psutil.Process(server.pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return 0


class Sampler:
    """The server's RSS and buffer gauge, sampled every 50 ms in a thread: their peaks."""

    def __init__(self, server: LocalServer) -> None:
        self.server = server
        self.peak_rss = 0
        self.peak_gauge = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_rss = max(self.peak_rss, rss(self.server))
            try:
                self.peak_gauge = max(self.peak_gauge, metric(self.server, "shardstream_stream_buffer_bytes"))
            except OSError:
                pass

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read_through(port: int, req: pb.ReadRequest) -> int:
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        return sum(1 for _ in client.do_get(flight.Ticket(req.SerializeToString())))
    finally:
        client.close()


def one_run(root: Path, n: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    batch_rows = max(1, args.message_kib // args.row_kib)
    # --server-target: no size named, the server's own target (grown while its budget has room)
    message_bytes = 0 if getattr(args, "server_target", False) else args.message_kib << 10
    limits = ("--max-streams", str(n), "--max-streams-per-peer", str(n))
    sizes = ("--stream-buffer-mib", str(args.budget_mib), "--cache-mib", str(args.cache_mib))
    server = LocalServer(root, metrics=True, extra_args=(*limits, *sizes, "--write-timeout", "600"))
    with server:
        read_through(server.data_port, request(mode, batch_rows, message_bytes, 0))
        warm = rss(server)
        connections = math.ceil(n / STREAMS_PER_CONNECTION)
        clients = [
            flight.connect(f"grpc://127.0.0.1:{server.data_port}", generic_options=CLIENT_OPTIONS)
            for _ in range(connections)
        ]
        calls: list[Any] = []

        def open_one(i: int) -> grpc.StatusCode:
            ticket = flight.Ticket(request(mode, batch_rows, message_bytes, i % 4).SerializeToString())
            try:
                call = clients[i % connections].do_get(ticket)
                calls.append(call)
                call.read_chunk()
                return grpc.StatusCode.OK
            except flight.FlightError as exc:
                return FlightStatus.of(exc).code()

        try:
            with Sampler(server) as sampler, ThreadPoolExecutor(OPENERS) as pool:
                codes = list(pool.map(open_one, range(n)))  # a burst, as ranks starting together
                time.sleep(args.settle_s)  # builds ahead finish, the pools settle
        finally:
            for call in calls:
                call.cancel()
            for client in clients:
                client.close()
    bound = warm + (args.cache_mib + BOUND_FACTOR * args.budget_mib) * MiB
    row = {
        "streams": n,
        "mode": mode,
        "admitted": codes.count(grpc.StatusCode.OK),
        "refused": codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED),
        "other_errors": len(codes) - codes.count(grpc.StatusCode.OK) - codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED),
        "gauge_peak_mib": sampler.peak_gauge / MiB,
        "warm_mib": warm / MiB,
        "peak_mib": sampler.peak_rss / MiB,
        "bound_mib": bound / MiB,
        "peak_over_bound": sampler.peak_rss / bound,
    }
    log(f"{n} streams, shuffle {mode}: {row}")
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stall-bench-") as tmp:
        root = write_dataset(Path(tmp), args.rows, args.row_kib << 10)
        rows = [one_run(root, n, mode, args) for n in args.streams for mode in args.modes]
    return {
        "bench": "stall_bench",
        "dataset": {"rows": args.rows, "row_bytes": args.row_kib << 10, "row_group_rows": ROW_GROUP_ROWS},
        "message_bytes": 0 if getattr(args, "server_target", False) else args.message_kib << 10,
        "budget_mib": args.budget_mib,
        "cache_mib": args.cache_mib,
        "bound_factor": BOUND_FACTOR,
        "runs": rows,
        "versions": versions("pyarrow", "grpcio"),
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"budget {result['budget_mib']} MiB, cache {result['cache_mib']} MiB, messages "
        f"{result['message_bytes'] >> 10} KiB; bound = warm + cache + {result['bound_factor']} x budget"
    )
    print("| streams | shuffle | admitted | refused | gauge peak MiB | warm MiB | peak RSS MiB | bound MiB | peak/bound |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["runs"]:
        print(
            f"| {r['streams']} | {r['mode']} | {r['admitted']} | {r['refused']} | {r['gauge_peak_mib']:.0f} | "
            f"{r['warm_mib']:.0f} | {r['peak_mib']:.0f} | {r['bound_mib']:.0f} | {r['peak_over_bound']:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("loadtest.stall_bench", __doc__ or "")
    parser.add_argument("--streams", type=int, nargs="+", default=[256, 1000], help="stalled streams per run")
    parser.add_argument("--modes", nargs="+", default=["none", "block", "full"], choices=["none", "block", "full"])
    parser.add_argument("--budget-mib", type=int, default=256, help="the server's --stream-buffer-mib")
    parser.add_argument("--cache-mib", type=int, default=64, help="the server's --cache-mib")
    parser.add_argument("--rows", type=int, default=2048, help="rows in the dataset")
    parser.add_argument("--row-kib", type=int, default=64, help="bytes per row, KiB")
    parser.add_argument("--message-kib", type=int, default=1024, help="the streams' max_message_bytes, KiB")
    parser.add_argument(
        "--server-target",
        action="store_true",
        help="streams name no max_message_bytes: the server's target, grown up to 8 MiB while its budget has "
        "room (--message-kib then sets the step only)",
    )
    parser.add_argument("--settle-s", type=float, default=2.0, help="RSS sampled this long after the last open")
    return bench_main(parser, argv, run, json_default=results_path("stall_bench"), report=report)


if __name__ == "__main__":
    raise SystemExit(main())
