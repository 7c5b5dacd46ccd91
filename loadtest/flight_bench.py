"""Data plane A/B: today's grpcio Read stream against a prototype of the same stream on Arrow Flight.

    python -m loadtest.flight_bench [--mib 512] [--pairs 3] [--epochs 4] [--batch-mib 2]
                                    [--shuffle none|block|full] [--loader] [--json PATH]

One dataset as in `loadtest.bench` (`id` int64 + `vec` fixed_size_list<float32>[256], 1,032 B/row,
ingested with the defaults, row groups of two batches) and two servers over the same root, each in
its own process with the same row-group cache (1 GiB: the dataset stays in it after the warm-up) and
the same allocator settings (shardstream/allocator.py: both call `allocator.tune()`):

    grpcio   `shardstream serve` (the product: grpc.aio servicer, hand-framed Arrow IPC)
             -> `Connection.read` (client/channel.py) -> `decode_message` (client/decode.py)
    flight   loadtest/flight_plane.py: DoGet with the ReadRequest as ticket, batches from the same
             ReadPlanner and MessageBuilder, the ReadHeader as each batch's app_metadata
             -> `pyarrow.flight.FlightClient.do_get` -> the same `decode_message`
    loader   (--loader) `Loader(output="arrow")` on the grpcio server: what a trainer runs

Both clients send the same ReadRequest (one rank, world size 1, batches of --batch-mib MiB, seed 0)
and hand every decoded step to nobody (counted, not touched). The Flight client's `decode_message`
gets the batch Flight already read instead of an IPC payload to parse (`read_ipc` is swapped in that
client's process only); everything else it does — checks, provenance, the per-step split and cursor
items — is the Loader's. Each path's client runs in its own process, kept for all its passes
(bench.py's `ClientProcess`). A pass is --epochs whole epochs, one stream each (2 GiB with the
defaults). One warm-up pass per path, then --pairs rounds alternating the order (A B, B A, ...).

Per pass: MB/s of payload (rows x 1,032 B), time to the first step, p50/p99 of the wait for each
later step (time from one step handed over to the next: receive + decode; the client does nothing
else), client and server CPU seconds (psutil, user + system) per GB of payload. Ratios flight/grpcio
per round, median (min-max). Figures only: it exits 0 unless something crashed. MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from loadtest.bench import DATASET, ROW_BYTES, ClientProcess, FlightProcess, Layout, build_dataset
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from loadtest.flight_plane import flight_messages
from shardstream import allocator
from shardstream.client import Loader
from shardstream.client import decode as client_decode
from shardstream.client.channel import Connection
from shardstream.client.spec import ReadSpec
from shardstream.client.target import Target
from shardstream.plan import ShuffleSpec, StepLayout
from shardstream.server.fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main"]

PATHS = ("grpcio", "flight")
LOADER = "loader"
CACHE_MIB = 1024


class FlightPlaneProcess(FlightProcess):
    """loadtest/flight_plane.py over the registry root, in its own process group."""

    def __init__(self, workdir: Path, root: Path, cache_mib: int = CACHE_MIB) -> None:
        super().__init__(workdir, [], 0, name="flight-plane")
        self.root = root
        self.cache_mib = cache_mib

    def command(self, shards_file: Path, ready: Path) -> list[str]:
        del shards_file
        return [
            sys.executable,
            "-m",
            "loadtest.flight_plane",
            "--root",
            str(self.root),
            "--ready-file",
            str(ready),
            "--cache-mib",
            str(self.cache_mib),
        ]


# --- in each path's client process ------------------------------------------------------------
class _Read:
    """decode_message's payload on the Flight path: the batch Flight's client already read."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self.size = batch.nbytes  # what decode_message counts as received bytes


def _hand_flight_batches_to_decode() -> None:
    """In the Flight client's process: decode_message's `read_ipc` takes a `_Read` as read."""
    if getattr(client_decode, "_flight_bench", False):
        return
    ipc = client_decode.read_ipc
    client_decode.read_ipc = lambda p: p.batch if isinstance(p, _Read) else ipc(p)  # type: ignore[assignment]
    client_decode._flight_bench = True  # type: ignore[attr-defined]


def _spec(info: pb.DatasetInfo, batch_rows: int, shuffle: str, endpoint: str) -> ReadSpec:
    target = Target(
        f"{info.name}@{info.version}",
        info.fingerprint,
        info.num_rows,
        [f.name for f in info.fields],
        [info],
        None,
    )
    return ReadSpec(
        target=target,
        endpoints=(endpoint,),
        rank=0,
        world_size=1,
        batch_size=batch_rows,
        seed=0,
        shuffle=ShuffleSpec.parse(shuffle),
        drop_last=False,
        columns=(),
        max_message_bytes=0,
        transforms=(),
        on_error="fail",
        output="arrow",
        provenance=False,
        pin_memory=False,
        prefetch=1,
        streams=1,
        epochs=1,
    )


def _items(
    spec: ReadSpec, epoch: int, layout: StepLayout, messages: Iterator[tuple[pb.ReadHeader, Any]]
) -> Iterator[Any]:
    """The Loader's decode of one epoch's stream (steps 0, 1, 2, ..., checked)."""
    first = 0
    for header, payload in messages:
        yield from client_decode.decode_message(spec, epoch, layout, first, 1, header, payload)
        if header.steps:
            first = header.steps[-1].step + 1


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def stream_pass(
    path: str,
    where: str | int,
    info_bytes: bytes,
    batch_rows: int,
    shuffle: str,
    epochs: int,
    server_pid: int,
) -> dict[str, Any]:
    """`epochs` whole epochs, one stream each, of `path`, timed; run in that path's client process."""
    allocator.tune()  # both clients run with the settings the Loader applies (Connection does too)
    info = pb.DatasetInfo.FromString(info_bytes)
    spec = _spec(info, batch_rows, shuffle, str(where))
    layout = spec.layout(0)
    me, server = psutil.Process(), psutil.Process(server_pid)
    conn: Connection | None = None
    loader: Loader | None = None
    steps: Iterator[Any]
    if path == "grpcio":
        conn = Connection(str(where))
        steps = (
            item
            for e in range(epochs)
            for item in _items(spec, e, layout, conn.read(spec.request(e, 0, 0, 1)))
        )
    elif path == "flight":
        _hand_flight_batches_to_decode()
        steps = (
            item
            for e in range(epochs)
            for item in _items(
                spec,
                e,
                layout,
                ((h, _Read(b)) for h, b in flight_messages(int(where), spec.request(e, 0, 0, 1))),
            )
        )
    else:
        loader = Loader(
            [str(where)],
            DATASET,
            batch_size=batch_rows,
            shuffle=shuffle,
            output="arrow",
            world_size=1,
            rank=0,
            epochs=epochs,
        )
        steps = iter(loader)
    waits: list[float] = []
    rows = n = 0
    first = float("nan")
    s0, c0 = _cpu_s(server), _cpu_s(me)
    t0 = last = time.perf_counter()
    try:
        for item in steps:
            now = time.perf_counter()
            batch = item if path == LOADER else item.batch
            if batch is None:
                continue
            if n == 0:
                first = now - t0
            else:
                waits.append(now - last)
            n += 1
            rows += batch.num_rows
            last = now
    finally:
        if conn is not None:
            conn.close()
        if loader is not None:
            loader.close()
    wall = time.perf_counter() - t0
    client_cpu, server_cpu = _cpu_s(me) - c0, _cpu_s(server) - s0
    gb = rows * ROW_BYTES / 1e9
    w = np.array(waits) * 1e3
    return {
        "path": path,
        "steps": n,
        "rows": rows,
        "payload_bytes": rows * ROW_BYTES,
        "wall_s": wall,
        "mb_per_s": rows * ROW_BYTES / wall / 1e6,
        "first_step_ms": first * 1e3,
        "wait_p50_ms": float(np.percentile(w, 50)) if len(w) else float("nan"),
        "wait_p99_ms": float(np.percentile(w, 99)) if len(w) else float("nan"),
        "wait_max_ms": float(w.max()) if len(w) else float("nan"),
        "client_cpu_s": client_cpu,
        "server_cpu_s": server_cpu,
        "client_cpu_s_per_gb": client_cpu / gb,
        "server_cpu_s_per_gb": server_cpu / gb,
    }


# --- the run ----------------------------------------------------------------------------------
METRICS = ("mb_per_s", "wait_p50_ms", "wait_p99_ms", "client_cpu_s_per_gb", "server_cpu_s_per_gb")


def summarize(passes: list[dict[str, Any]], paths: tuple[str, ...]) -> dict[str, Any]:
    measured = [p for p in passes if p["round"] > 0]
    by_path = {name: [p for p in measured if p["path"] == name] for name in paths}
    out: dict[str, Any] = {
        "paths": {
            name: {m: spread([p[m] for p in ps]) for m in (*METRICS, "first_step_ms")}
            for name, ps in by_path.items()
        },
        "ratios": {},
    }
    for other in paths[1:]:
        pairs = list(zip(by_path[other], by_path["grpcio"], strict=True))
        out["ratios"][f"{other}/grpcio"] = {m: spread([a[m] / b[m] for a, b in pairs]) for m in METRICS}
    out["same_steps_and_rows"] = len({(p["steps"], p["rows"]) for p in passes}) == 1
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.plan(args.mib, args.batch_mib)
    paths = (*PATHS, LOADER) if args.loader else PATHS
    passes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shardstream-flight-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        log(
            f"building {layout.num_rows * ROW_BYTES / (1 << 20):.0f} MiB ({layout.num_rows} rows) in {workdir}"
        )
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, _ = pool.submit(build_dataset, workdir, layout).result()
        grpc_server = stack.enter_context(LocalServer(root, extra_args=("--cache-mib", str(CACHE_MIB))))
        flight_server = stack.enter_context(FlightPlaneProcess(workdir, root))
        assert grpc_server.proc is not None and flight_server.proc is not None
        conn = Connection(grpc_server.target)
        info = conn.get_dataset(DATASET, 10.0).SerializeToString()
        conn.close()
        where: dict[str, tuple[str | int, int]] = {
            "grpcio": (grpc_server.target, grpc_server.pid),
            "flight": (flight_server.port, flight_server.proc.pid),
            LOADER: (grpc_server.target, grpc_server.pid),
        }
        clients = {}
        for name in paths:
            clients[name] = ClientProcess()
            stack.callback(clients[name].close)
        for round_ in range(args.pairs + 1):
            order = paths if round_ % 2 else paths[::-1]  # A B, B A, ...: neither always goes first
            for name in order:
                target, pid = where[name]
                p = (
                    clients[name]
                    .pool.submit(
                        stream_pass, name, target, info, layout.batch_rows, args.shuffle, args.epochs, pid
                    )
                    .result()
                )
                p["round"] = round_
                passes.append(p)
                log(
                    f"  {'warm-up' if round_ == 0 else f'round {round_}'} {name:<7} {p['mb_per_s']:6.0f} MB/s  "
                    f"p99 wait {p['wait_p99_ms']:6.2f} ms  server {p['server_cpu_s_per_gb']:.2f} / client "
                    f"{p['client_cpu_s_per_gb']:.2f} CPU-s/GB"
                )
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.flight_bench", *sys.argv[1:]]),
        "config": {
            "mib": args.mib,
            "pairs": args.pairs,
            "batch_mib": args.batch_mib,
            "batch_rows": layout.batch_rows,
            "rows": layout.num_rows,
            "shuffle": args.shuffle,
            "epochs_per_pass": args.epochs,
            "row_bytes": ROW_BYTES,
            "server_cache_mib": CACHE_MIB,
            "load_average": os.getloadavg(),
        },
        "versions": versions("shardstream", "grpcio", "protobuf", "uvloop"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "passes": passes,
        "summary": summarize(passes, paths),
    }


def _fmt(s: dict[str, float], digits: int = 0) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def print_report(result: dict[str, Any]) -> None:
    cfg, summary = result["config"], result["summary"]
    print(
        f"\ndata plane A/B: {cfg['rows']} rows x {cfg['row_bytes']} B, batches of {cfg['batch_rows']} rows, "
        f"shuffle {cfg['shuffle']}, {cfg['pairs']} rounds after a warm-up; pyarrow "
        f"{result['versions']['pyarrow']}, grpcio {result['versions']['grpcio']}, {result['machine']['cpus']} CPUs"
    )
    head = f"{'path':<8} {'MB/s':>18} {'wait p50 ms':>12} {'wait p99 ms':>18} {'server CPU-s/GB':>18} {'client CPU-s/GB':>18}"
    print(head)
    print("-" * len(head))
    for name, s in summary["paths"].items():
        print(
            f"{name:<8} {_fmt(s['mb_per_s']):>18} {s['wait_p50_ms']['median']:>12.2f} {_fmt(s['wait_p99_ms'], 2):>18} "
            f"{_fmt(s['server_cpu_s_per_gb'], 2):>18} {_fmt(s['client_cpu_s_per_gb'], 2):>18}"
        )
    print()
    for key, r in summary["ratios"].items():
        print(
            f"{key:<14} MB/s {_fmt(r['mb_per_s'], 2)}  p99 wait {_fmt(r['wait_p99_ms'], 2)}  "
            f"server CPU/GB {_fmt(r['server_cpu_s_per_gb'], 2)}  client CPU/GB {_fmt(r['client_cpu_s_per_gb'], 2)}"
        )
    if not summary["same_steps_and_rows"]:
        print("WARNING: the paths did not deliver the same steps and rows; see the JSON", file=sys.stderr)


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.mib < 1 or args.pairs < 1 or args.epochs < 1 or not args.batch_mib > 0:
        ap.error("--mib, --pairs and --epochs must be >= 1 and --batch-mib > 0")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.flight_bench", __doc__)
    ap.add_argument("--mib", type=int, default=512, help="dataset payload size (default 512)")
    ap.add_argument("--pairs", type=int, default=3, help="measured rounds after the warm-up (default 3)")
    ap.add_argument("--batch-mib", type=float, default=2.0, help="batch size in MiB of payload (default 2)")
    ap.add_argument(
        "--epochs", type=int, default=4, help="whole epochs per pass, one stream each (default 4)"
    )
    ap.add_argument("--shuffle", choices=("none", "block", "full"), default="none", help="(default none)")
    ap.add_argument(
        "--loader", action="store_true", help="also measure Loader(output='arrow') on the grpcio server"
    )
    return bench_main(
        ap, argv, run, json_default=results_path("flight_bench"), report=print_report, check=_check
    )


if __name__ == "__main__":
    sys.exit(main())
