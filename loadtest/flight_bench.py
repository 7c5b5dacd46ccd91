"""Data plane A/B: shardstream's data plane (Arrow Flight DoGet) against Flight DoGet from memory.

    python -m loadtest.flight_bench [--shape vec|tokens|tiny|image] [--mib 512] [--pairs 3] [--epochs 2] [--batch-mib 2]
                                    [--shuffle none block full] [--no-loader] [--ceiling] [--gather]
                                    [--json PATH]

Issue #17's comparison (and issue #26's, in every shuffle mode), now that shardstream's Read streams are Arrow Flight DoGets
(server/serving/data_plane.py): does one stream of a real `shardstream serve` move bytes as fast, and
for as little server CPU, as a bare Flight server that has the batches in memory? One dataset as in
`loadtest.bench` (`id` int64 + `vec` fixed_size_list<float32>[256], 1,032 B/row, ingested with row
groups of two batches), and two servers over it, each in its own process:

    flight (the baseline)
             loadtest/flight_server.py --from-memory: a `pyarrow.flight.FlightServerBase` that reads
             the shards once at start in batches of the same rows (~--batch-mib MiB) and answers
             every DoGet with that table (`RecordBatchStream`: one Flight message per batch)
    shardstream
             `shardstream serve` (one process, `--cache-mib 1024`: the dataset stays in its row-group
             cache after the warm-up), its data plane on the port GetDataset names

Same allocator settings everywhere: shardstream's server and Loader apply them to themselves
(shardstream/allocator.py); the Flight server and the two plain Flight clients get them as
MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ in their environment. The paths, each with a client
process of its own kept for all its passes (bench.py's `ClientProcess`):

    flight   `FlightClient.do_get` of the baseline, its batches counted
    doget    a plain `FlightClient.do_get` on shardstream's data port, ticket = the serialized
             ReadRequest the Loader sends for the same epoch (one rank of world size 1, the
             pass's shuffle mode, batches of the same rows): no shardstream code in the client; it counts the batches'
             bytes and their app_metadata (each message's ReadHeader) and decodes nothing more
    loader   (unless --no-loader) `Loader(output="arrow")` on the same server: what a trainer runs
             (the DoGet, plus the Loader's checks, per-step split, cursor and prefetch thread)
    generator
             (--ceiling) the baseline's batches through a Python `GeneratorStream`, each with 40 B
             of app_metadata (loadtest/flight_server.py, ticket `generator`), read as `flight` reads
             them: what handing Flight each message from Python costs with nothing built, the
             floor under any server that does (shardstream's data plane does: data_plane.py)
    gather   (--gather; block and full only) the baseline's rows in a shuffled order of the pass's
             mode, each batch copied out of its table as it is sent (loadtest/flight_server.py,
             ticket `gather:MODE:WINDOW`), read as `flight` reads them: the least a Flight server
             that shuffles does: the baseline a shuffled stream's targets are held to (the
             ratios to `flight` say what the shuffle's copy costs)

A pass is --epochs whole epochs, one DoGet (one stream) per epoch, in one shuffle mode (--shuffle:
each mode gets its passes in every round; Flight's baseline serves the same batches whatever the
mode). One warm-up pass per path and mode, then --pairs rounds alternating the order (A B C, C B A,
...). Per pass: MB/s of payload (rows x
1,032 B), time to the first batch (connection set-up included), p50/p99 of the wait for each later
batch, client and server CPU seconds (psutil, user + system, the server's child processes
included) per GB of payload, and of those where it goes: the server's build threads' (found by
their names, `flight-build_N`, on-CPU time from /proc/PID/task/TID/schedstat: what shardstream
builds, beside what Flight and gRPC send) and the client's iterating thread's (`time.thread_time`:
the plain reader's own reads, or the Loader's training-loop side, apart from its prefetch and
gRPC's threads); peak RSS of both (VmHWM, reset before the pass). Ratios doget/flight,
loader/flight and loader/doget (the Loader's client against a plain pyarrow.flight reader of the
same stream) per round and mode, median (min-max), against the targets: in the stored order
(issue #26) per stream >= 0.9x Flight's MB/s (client and server on 2 shared cores) and server
CPU/GB <= 1.2x Flight's; shuffled (issue "performance IV", with --gather) >= 0.9x the MB/s of
Flight gathering the same kind of shuffle and server CPU/GB <= 1.15x its; the Loader's client
CPU/GB <= 1.1x the plain reader's. Figures only: it exits 0 unless something crashed.
MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import math
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
import pyarrow.flight as flight

from loadtest.bench import (
    DATASET,
    MALLOC_ENV,
    ROW_BYTES,
    ClientProcess,
    FlightProcess,
    Layout,
    _peak_rss_mib,
    _reset_peak_rss,
    build_dataset,
)
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from loadtest.fleet import tree_cpu_s, tree_threads_cpu_s
from loadtest.flight_server import GATHER_TICKET, GENERATOR_TICKET
from shardstream.client import Loader
from shardstream.client.transport.channel import Connection
from shardstream.order.shuffle import DEFAULT_WINDOW
from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main", "run"]

# The shapes users have (issue "performance IV"): name -> (payload bytes a row, what it is). "vec" is the
# original dataset (loadtest.bench's); the others are written by `_write_shape`, one column each.
SHAPES = {
    "vec": (ROW_BYTES, "id int64 + vec fixed_size_list<float32>[256] (1,032 B rows)"),
    "tokens": (4 * 2048, "tokens fixed_size_list<int32>[2048] (8 KiB rows: LLM pretraining data)"),
    "tiny": (4 * 16, "tokens fixed_size_list<int32>[16] (64 B rows: tiny samples)"),
    "image": (150 * 1024, "image binary, ~150 KiB encoded bytes a row (126-174 KiB, incompressible)"),
}

BASELINE = "flight"
DOGET = "doget"
LOADER = "loader"
GENERATOR = "generator"  # --ceiling: the baseline's batches handed over from Python, with metadata
GATHER = "gather"  # --gather: the baseline's rows shuffled, each batch copied as it is sent
CACHE_MIB = 1024
BUILD_THREADS = "flight-build"  # the data plane's build threads, by their names in /proc (BuildPool)
TARGET_MB_PER_S = 0.9  # issue #26: per stream >= 0.9x Flight DoGet from memory where they share 2 cores
TARGET_SERVER_CPU = 1.2  # ... server CPU/GB <= 1.2x Flight's
TARGET_CLIENT_CPU = 1.1  # ... the Loader's client CPU/GB <= 1.1x a plain pyarrow.flight reader's
# issue "performance IV": a shuffled stream against Flight gathering the same kind of shuffle (--gather)
TARGET_GATHER_MB_PER_S = 0.9
TARGET_GATHER_SERVER_CPU = 1.15


# --- the dataset of a shape --------------------------------------------------------------------
def shape_layout(shape: str, mib: int, batch_mib: float) -> Layout:
    """Layout.plan's rows for a shape's row size: batches of ~batch_mib, row groups of two batches."""
    row_bytes = SHAPES[shape][0]
    batch_rows = max(1, int(batch_mib * (1 << 20)) // row_bytes)
    group = 2 * batch_rows
    groups_per_shard = max(1, round(256 * (1 << 20) / (group * row_bytes)))
    groups = max(1, round(mib * (1 << 20) / (group * row_bytes)))
    return Layout(batch_rows, group, group * groups_per_shard, group * groups)


def _write_shape(path: Path, shape: str, num_rows: int) -> None:
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    chunk = 4096 if shape != "image" else 256
    writer = None
    try:
        for start in range(0, num_rows, chunk):
            n = min(chunk, num_rows - start)
            if shape == "image":  # lengths averaging the row size exactly over each chunk
                mean = SHAPES["image"][0]
                spread = rng.integers(-24 << 10, 24 << 10, n)
                sizes = (mean + spread - int(round(spread.mean()))).astype(np.int64)
                sizes[-1] += mean * n - int(sizes.sum())  # (under n bytes)
                blob = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
                offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
                col = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(blob)])
                table = pa.table({"image": col})
            else:
                width = SHAPES[shape][0] // 4
                values = pa.array(rng.integers(0, 50_000, n * width, dtype=np.int32))
                table = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(values, width)})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def build_shape_dataset(workdir: Path, layout: Layout, shape: str) -> tuple[Path, list[Path]]:
    """(registry root, shard paths in dataset order) of a shape's dataset (bench.build_dataset's for "vec")."""
    if shape == "vec":
        return build_dataset(workdir, layout)
    from shardstream.registry import Registry
    from shardstream.server.writing.ingest import IngestOptions, ingest

    src = workdir / "src" / f"{shape}.parquet"
    src.parent.mkdir()
    _write_shape(src, shape, layout.num_rows)
    root = workdir / "root"
    options = IngestOptions(row_group_rows=layout.row_group_rows, shard_rows=layout.shard_rows, progress=False)
    manifest = ingest(src, DATASET, root, options)
    src.unlink()
    registry = Registry(root)
    return root, [registry.shard_path(manifest, s.uri) for s in manifest.shards]


# --- in each path's client process ------------------------------------------------------------
def read_request(
    ref: str, fingerprint: str, batch_rows: int, epoch: int, mode: str = "none"
) -> pb.ReadRequest:
    """The ReadRequest the Loader sends for one whole epoch of rank 0 of 1 in shuffle `mode`
    (client/spec.py `ReadSpec.request`)."""
    return pb.ReadRequest(
        dataset=ref,
        fingerprint=fingerprint,
        seed=0,
        epoch=epoch,
        shuffle=pb.Shuffle(mode=mode, window=DEFAULT_WINDOW),
        rank=0,
        world_size=1,
        batch_size=batch_rows,
        split_steps=True,
        provenance_in_header=True,  # (a Loader without provenance=True asks for it)
    )


def _chunks(port: int, tickets: list[bytes]) -> Iterator[tuple[pa.RecordBatch, int]]:
    """A plain Flight client's DoGets, one per ticket on one connection: (batch, bytes received)."""
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    try:
        for ticket in tickets:
            reader = client.do_get(flight.Ticket(ticket))
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                meta = chunk.app_metadata
                yield chunk.data, chunk.data.nbytes + (meta.size if meta is not None else 0)
    finally:
        client.close()


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def stream_pass(
    path: str,
    where: str | int,
    dataset: tuple[str, str],
    batch_rows: int,
    epochs: int,
    server_pid: int,
    mode: str = "none",
    row_bytes: int = ROW_BYTES,
) -> dict[str, Any]:
    """`epochs` whole epochs, one stream each, of `path`, timed; run in that path's client process
    (`row_bytes`: the shape's payload a row, on average)."""
    ref, fingerprint = dataset
    me = psutil.Process()
    peaks = _reset_peak_rss(me.pid) and _reset_peak_rss(server_pid)
    loader: Loader | None = None
    steps: Iterator[tuple[pa.RecordBatch, int]]
    if path == BASELINE:
        steps = _chunks(int(where), [b"all"] * epochs)
    elif path == GENERATOR:
        steps = _chunks(int(where), [GENERATOR_TICKET] * epochs)
    elif path == GATHER:
        # each epoch's order made by its stream, as the Loader's server does (seeded by the epoch)
        steps = _chunks(int(where), [GATHER_TICKET + f"{mode}:{DEFAULT_WINDOW}:{e}".encode() for e in range(epochs)])
    elif path == DOGET:
        tickets = [
            read_request(ref, fingerprint, batch_rows, e, mode).SerializeToString() for e in range(epochs)
        ]
        steps = _chunks(int(where), tickets)
    else:
        loader = Loader(
            [str(where)],
            DATASET,
            batch_size=batch_rows,
            shuffle=mode,
            output="arrow",
            world_size=1,
            rank=0,
            epochs=epochs,
        )
        steps = ((b, b.nbytes) for b in loader)
    waits: list[float] = []
    rows = n = received = 0
    first = float("nan")
    s0, c0 = tree_cpu_s(server_pid), _cpu_s(me)
    b0, m0 = tree_threads_cpu_s(server_pid, BUILD_THREADS), time.thread_time()
    t0 = last = time.perf_counter()
    try:
        for batch, nbytes in steps:
            now = time.perf_counter()
            if n == 0:
                first = now - t0
            else:
                waits.append(now - last)
            n += 1
            rows += batch.num_rows
            received += nbytes
            last = now
    finally:
        if loader is not None:
            loader.close()
    wall = time.perf_counter() - t0
    main_cpu = time.thread_time() - m0  # (the Loader's close, after the last batch, counts too)
    client_cpu, server_cpu = _cpu_s(me) - c0, tree_cpu_s(server_pid) - s0
    build_cpu = tree_threads_cpu_s(server_pid, BUILD_THREADS) - b0
    gb = rows * row_bytes / 1e9
    w = np.array(waits) * 1e3
    return {
        "path": path,
        "mode": mode,
        "batches": n,
        "rows": rows,
        "payload_bytes": rows * row_bytes,
        "received_bytes": received,  # batches' buffers (+ app_metadata on the plain DoGet paths)
        "wall_s": wall,
        "mb_per_s": rows * row_bytes / wall / 1e6,
        "first_batch_ms": first * 1e3,
        "wait_p50_ms": float(np.percentile(w, 50)) if len(w) else float("nan"),
        "wait_p99_ms": float(np.percentile(w, 99)) if len(w) else float("nan"),
        "wait_max_ms": float(w.max()) if len(w) else float("nan"),
        "client_cpu_s": client_cpu,
        "server_cpu_s": server_cpu,
        "client_cpu_s_per_gb": client_cpu / gb,
        "server_cpu_s_per_gb": server_cpu / gb,
        "server_build_cpu_s_per_gb": build_cpu / gb,  # of it, the build threads' (0 for Flight's own)
        "client_main_cpu_s_per_gb": main_cpu / gb,  # of the client's, its iterating thread's
        "client_peak_rss_mib": _peak_rss_mib(me.pid) if peaks else None,
        "server_peak_rss_mib": _peak_rss_mib(server_pid) if peaks else None,
    }


# --- the run ----------------------------------------------------------------------------------
METRICS = (
    "mb_per_s",
    "first_batch_ms",
    "wait_p50_ms",
    "wait_p99_ms",
    "client_cpu_s_per_gb",
    "server_cpu_s_per_gb",
    "server_build_cpu_s_per_gb",
    "client_main_cpu_s_per_gb",
)
RATIOS = ("mb_per_s", "wait_p99_ms", "client_cpu_s_per_gb", "server_cpu_s_per_gb")
MODES = ("none", "block", "full")


def _summarize_mode(passes: list[dict[str, Any]], paths: tuple[str, ...], mode: str) -> dict[str, Any]:
    """One shuffle mode's passes: per path, the ratios to Flight of the same round, the targets:
    in the stored order against Flight from memory; shuffled against Flight gathering the same
    kind of shuffle (no targets for a shuffled mode run without --gather: no fair baseline)."""
    by_path = {name: [p for p in passes if p["path"] == name] for name in paths}
    out: dict[str, Any] = {
        "paths": {
            name: {
                **{m: spread([p[m] for p in ps]) for m in METRICS},
                "batches": ps[0]["batches"],
                "client_peak_rss_mib": max((p["client_peak_rss_mib"] or 0.0) for p in ps) or None,
                "server_peak_rss_mib": max((p["server_peak_rss_mib"] or 0.0) for p in ps) or None,
            }
            for name, ps in by_path.items()
        },
        "ratios": {},
        "targets": {},
    }

    def ratios(path: str, base: str) -> dict[str, dict[str, float]]:
        """`path`'s passes over `base`'s of the same round, per metric of RATIOS (kept in `out`)."""
        pairs = list(zip(by_path[path], by_path[base], strict=True))
        # (a pass too short for the CPU clock's 10 ms tick reads 0 CPU-s: its ratio is not a number)
        r = out["ratios"][f"{path}/{base}"] = {
            m: spread([a[m] / b[m] if b[m] else math.nan for a, b in pairs]) for m in RATIOS
        }
        return r

    for other in paths:
        if other == BASELINE:
            continue
        r = ratios(other, BASELINE)
        if other in (GENERATOR, GATHER) or mode != "none":
            continue  # baselines of their own, not shardstream; a shuffle is held to Flight gathering
        out["targets"][other] = _verdicts(r, BASELINE, TARGET_MB_PER_S, TARGET_SERVER_CPU)
    if GATHER in paths:  # shardstream's shuffled streams against the least a shuffling Flight server does
        for other in (DOGET, LOADER):
            if other in paths:
                r = ratios(other, GATHER)
                out["targets"][other] = _verdicts(r, GATHER, TARGET_GATHER_MB_PER_S, TARGET_GATHER_SERVER_CPU)
    if LOADER in paths:  # the Loader's client against a plain pyarrow.flight reader of the same stream
        r = ratios(LOADER, DOGET)
        out["targets"].setdefault(LOADER, {})[f"client_cpu_s_per_gb <= {TARGET_CLIENT_CPU}x doget's"] = (
            r["client_cpu_s_per_gb"]["median"] <= TARGET_CLIENT_CPU
        )
    return out


def _verdicts(r: dict[str, dict[str, float]], base: str, mb_per_s: float, server_cpu: float) -> dict[str, bool]:
    """A path's MB/s and server CPU targets against `base`, met or not (median of the rounds' ratios)."""
    return {
        f"mb_per_s >= {mb_per_s}x {base}": r["mb_per_s"]["median"] >= mb_per_s,
        f"server_cpu_s_per_gb <= {server_cpu}x {base}": r["server_cpu_s_per_gb"]["median"] <= server_cpu,
    }


def mode_paths(paths: tuple[str, ...], mode: str) -> tuple[str, ...]:
    """The paths a shuffle mode's rounds run (the gather only where there is a shuffle)."""
    return tuple(p for p in paths if p != GATHER or mode != "none")


def summarize(passes: list[dict[str, Any]], paths: tuple[str, ...], modes: tuple[str, ...]) -> dict[str, Any]:
    measured = [p for p in passes if p["round"] > 0]
    return {
        "modes": {
            mode: _summarize_mode([p for p in measured if p["mode"] == mode], mode_paths(paths, mode), mode)
            for mode in modes
        },
        "same_rows_on_every_path": len({p["rows"] for p in passes}) == 1,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = getattr(args, "shape", "vec")
    row_bytes = SHAPES[shape][0]
    layout = Layout.plan(args.mib, args.batch_mib) if shape == "vec" else shape_layout(shape, args.mib, args.batch_mib)
    paths = (BASELINE, DOGET) if getattr(args, "no_loader", False) else (BASELINE, DOGET, LOADER)
    if getattr(args, "ceiling", False):
        paths = (*paths, GENERATOR)
    if getattr(args, "gather", False):
        paths = (*paths, GATHER)
    modes = tuple(getattr(args, "shuffle", None) or ("none",))
    passes: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardstream-flight-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        log(
            f"building {layout.num_rows * row_bytes / (1 << 20):.0f} MiB ({layout.num_rows} rows of {shape}) in {workdir}"
        )
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, shards = pool.submit(build_shape_dataset, workdir, layout, shape).result()
        server = stack.enter_context(LocalServer(root, extra_args=("--cache-mib", str(CACHE_MIB))))
        baseline = stack.enter_context(
            FlightProcess(workdir, shards, layout.batch_rows, from_memory=True, env=MALLOC_ENV, name=BASELINE)
        )
        assert baseline.proc is not None
        conn = Connection(server.target)
        try:
            info = conn.get_dataset(DATASET, 10.0)
        finally:
            conn.close()
        dataset = (f"{info.name}@{info.version}", info.fingerprint)
        where: dict[str, tuple[str | int, int]] = {
            BASELINE: (baseline.port, baseline.proc.pid),
            GENERATOR: (baseline.port, baseline.proc.pid),
            GATHER: (baseline.port, baseline.proc.pid),
            DOGET: (info.data_port or server.data_port, server.pid),
            LOADER: (server.target, server.pid),
        }
        clients = {}
        for name in paths:
            clients[name] = ClientProcess(None if name == LOADER else MALLOC_ENV)
            stack.callback(clients[name].close)
        setup_s = time.perf_counter() - t_start
        for round_ in range(args.pairs + 1):
            order = paths if round_ % 2 == 0 else paths[::-1]  # A B C, C B A, ...: none always first
            for mode in modes:
                for name in mode_paths(order, mode):
                    target, pid = where[name]
                    p = (
                        clients[name]
                        .pool.submit(
                            stream_pass, name, target, dataset, layout.batch_rows, args.epochs, pid, mode, row_bytes
                        )
                        .result()
                    )
                    p["round"] = round_
                    passes.append(p)
                    log(
                        f"  {'warm-up' if round_ == 0 else f'round {round_}'} {mode:<5} {name:<7} "
                        f"{p['mb_per_s']:6.0f} MB/s  p99 wait {p['wait_p99_ms']:6.2f} ms  server "
                        f"{p['server_cpu_s_per_gb']:.2f} / client {p['client_cpu_s_per_gb']:.2f} CPU-s/GB  "
                        f"{p['batches']} batches"
                    )
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.flight_bench", *sys.argv[1:]]),
        "config": {
            "mib": args.mib,
            "pairs": args.pairs,
            "shuffle_modes": list(modes),
            "batch_mib": args.batch_mib,
            "batch_rows": layout.batch_rows,
            "shape": shape,
            "shape_is": SHAPES[shape][1],
            "batch_bytes": layout.batch_rows * row_bytes,
            "rows": layout.num_rows,
            "shards": len(shards),
            "epochs_per_pass": args.epochs,
            "gb_per_pass": layout.num_rows * row_bytes * args.epochs / 1e9,
            "row_bytes": row_bytes,
            "server_cache_mib": CACHE_MIB,
            "malloc_env": MALLOC_ENV,
            "baseline": "loadtest/flight_server.py --from-memory (RecordBatchStream of the table)",
            "gather_window": DEFAULT_WINDOW,
            "page_cache": "warm (written just before the passes)",
            "setup_s": setup_s,
            "load_average": os.getloadavg(),
        },
        "versions": versions("shardstream", "grpcio", "protobuf"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "passes": passes,
        "summary": summarize(passes, paths, modes),
    }


def _fmt(s: dict[str, float], digits: int = 0) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def print_report(result: dict[str, Any]) -> None:
    cfg, summary = result["config"], result["summary"]
    print(
        f"\ndata plane A/B, {cfg.get('shape_is', 'vec')}: {cfg['rows']} rows x {cfg['row_bytes']} B, batches of {cfg['batch_rows']} rows "
        f"({cfg['batch_bytes'] / (1 << 20):.2f} MiB), {cfg['epochs_per_pass']} epochs "
        f"({cfg['gb_per_pass']:.2f} GB) per pass, {cfg['pairs']} rounds after a warm-up; pyarrow "
        f"{result['versions']['pyarrow']}, {result['machine']['cpus']} CPUs"
    )
    head = (
        f"{'shuffle':<8} {'path':<8} {'MB/s':>18} {'1st batch ms':>13} {'wait p99 ms':>18} "
        f"{'server CPU-s/GB':>18} {'client CPU-s/GB':>18} {'batches':>8}"
    )
    print(head)
    print("-" * len(head))
    for mode, m in summary["modes"].items():
        for name, s in m["paths"].items():
            print(
                f"{mode:<8} {name:<8} {_fmt(s['mb_per_s']):>18} {s['first_batch_ms']['median']:>13.1f} "
                f"{_fmt(s['wait_p99_ms'], 2):>18} {_fmt(s['server_cpu_s_per_gb'], 2):>18} "
                f"{_fmt(s['client_cpu_s_per_gb'], 2):>18} {s['batches']:>8}"
            )
    print(
        "\nwhere the CPU goes, CPU-s/GB (medians; a rest is the total's median less the part's): the "
        "server's build threads and the rest of the server; the client's iterating thread and its other "
        "threads (the Loader's prefetch thread, gRPC's)"
    )
    for mode, m in summary["modes"].items():
        for name, s in m["paths"].items():
            build, main = s["server_build_cpu_s_per_gb"]["median"], s["client_main_cpu_s_per_gb"]["median"]
            server, client = s["server_cpu_s_per_gb"]["median"], s["client_cpu_s_per_gb"]["median"]
            print(
                f"{mode:<8} {name:<10} server: build {build:.3f} + rest {server - build:.3f}   "
                f"client: iterating thread {main:.3f} + other threads {client - main:.3f}"
            )
    print()
    for mode, m in summary["modes"].items():
        for key, r in m["ratios"].items():
            print(
                f"{mode:<6} {key:<14} MB/s {_fmt(r['mb_per_s'], 2)}  server CPU/GB "
                f"{_fmt(r['server_cpu_s_per_gb'], 2)}  client CPU/GB {_fmt(r['client_cpu_s_per_gb'], 2)}  "
                f"p99 wait {_fmt(r['wait_p99_ms'], 2)}"
            )
        for name, t in m["targets"].items():
            print(
                f"{mode:<6} targets, {name}: "
                + ", ".join(f"{k} {'met' if ok else 'NOT met'}" for k, ok in t.items())
            )
    if not summary["same_rows_on_every_path"]:
        print("WARNING: the paths did not deliver the same rows; see the JSON", file=sys.stderr)


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.mib < 1 or args.pairs < 1 or args.epochs < 1 or not args.batch_mib > 0:
        ap.error("--mib, --pairs and --epochs must be >= 1 and --batch-mib > 0")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.flight_bench", __doc__)
    ap.add_argument("--mib", type=int, default=512, help="dataset payload size (default 512)")
    ap.add_argument("--pairs", type=int, default=3, help="measured rounds after the warm-up (default 3)")
    ap.add_argument("--epochs", type=int, default=2, help="whole epochs per pass, a stream each (default 2)")
    ap.add_argument("--batch-mib", type=float, default=2.0, help="batch size in MiB of payload (default 2)")
    ap.add_argument(
        "--shuffle",
        nargs="+",
        choices=MODES,
        default=["none"],
        help="shuffle modes, each a pass per path and round",
    )
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="vec",
        help="the rows: " + "; ".join(f"{k}: {v[1]}" for k, v in SHAPES.items()) + " (default vec)",
    )
    ap.add_argument(
        "--no-loader", action="store_true", help="leave out the Loader path (the two plain DoGets only)"
    )
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="add the generator path: the baseline's batches handed to Flight from Python, with metadata",
    )
    ap.add_argument(
        "--gather",
        action="store_true",
        help="add the gather path (block and full): the baseline's rows shuffled, each batch copied as it is sent",
    )
    return bench_main(
        ap, argv, run, json_default=results_path("flight_bench"), report=print_report, check=_check
    )


if __name__ == "__main__":
    sys.exit(main())
