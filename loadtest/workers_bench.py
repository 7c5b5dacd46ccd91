"""`serve --workers 2` against `--workers 1` on a CPU-bound load, and read-ahead's effect on the cache.

    python -m loadtest.workers_bench [--rows 1000000] [--streams 4] [--pairs 3] [--ra-s3] [--json PATH]

Part 1, workers: one dataset of small rows (`id` int64 + `vec` fixed_size_list<float32>[16], 72 B/row,
row groups of ~4 MiB) is served by two servers at once, `--workers 1` (A) and `--workers 2` (B); only
the one being measured has load. A pass reads one block-shuffled epoch (window 16 row groups, batch
--batch-rows per rank) with --streams concurrent ranks (world size = --streams), each rank's epoch
as a sequence of Read streams of --chunk-steps steps: plain Arrow Flight DoGets (ticket = the
serialized ReadRequest) on the workers' data ports, call i of rank r on worker (r + i) mod W (each
worker serves a port of its own, learnt from GetDataset: `loadtest.fleet.data_ports`). The client
counts the bytes of the record batches and their app_metadata and decodes nothing, so the server's
work (gather rows across the window's row groups, hand them to Flight's writer) dominates. After one warm-up pass each (it fills the caches: the data fits them, so passes are
CPU-bound, not I/O-bound), A and B alternate for --pairs pairs; the figure is the median (min-max)
of B/A throughput per pair. CPU seconds of the client and of each server's processes (psutil).

Part 2, read-ahead: a single-process server with a cache of each of --ra-cache-mib (smaller than
the data: the default 24 MiB is less than the two 16-row-group windows a batch straddling them needs,
48 MiB more), `--read-ahead 0` (C) or `--read-ahead 1` (D), started cold for each pass: one block-shuffled
stream of one epoch (window 16, batch --batch-rows), C and D alternating for --pairs pairs, a fresh
seed per pair. Reported from the server's /metrics: cache misses, prefetches (and those wasted:
evicted unused), hit ratio, and read amplification = row-group bytes read from storage / decoded
bytes of the dataset (1.0 = every row group read once in the epoch). With --ra-s3 the same is run
again from an S3 root: a SeaweedFS (`weed mini`, started by loadtest/seaweed.py as the tests start
it) on loopback.

Figures only: it asserts nothing about speed and exits 0 unless something crashed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, versions, write_vectors
from loadtest.fleet import DoGetClients, data_ports, tree_cpu_s
from loadtest.seaweed import BUCKET, start_seaweed
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main"]

DIM = 16
ROW_BYTES = 8 + 4 * DIM


def build(workdir: Path, rows: int, name: str, row_group_mib: int) -> tuple[Path, int]:
    """Ingest `rows` vector rows as `name`; (root, decoded bytes of all row groups)."""
    src = workdir / f"{name}.parquet"
    write_vectors(src, rows, DIM)
    root = workdir / "root"
    m = ingest(src, name, root, IngestOptions(row_group_bytes=row_group_mib << 20, progress=False))
    decoded = 0
    for shard in m.shards:
        f = pq.ParquetFile(root / name / shard.uri)
        decoded += sum(f.read_row_group(g).nbytes for g in range(f.num_row_groups))
    return root, decoded


def scrape(server: LocalServer) -> dict[str, float]:
    out = {}
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def epoch_pass(ports: list[int], name: str, args: argparse.Namespace, seed: int) -> int:
    """--streams ranks of one epoch, concurrently, each in DoGets of --chunk-steps spread over the
    workers' data `ports`; bytes received."""
    world = args.streams
    steps = -(-args.rows // (world * args.batch_rows))
    received = [0] * world
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            with DoGetClients(ports) as clients:
                for i, first in enumerate(range(0, steps, args.chunk_steps)):
                    req = pb.ReadRequest(
                        dataset=name,
                        seed=seed,
                        shuffle=pb.Shuffle(mode="block", window=16),
                        rank=r,
                        world_size=world,
                        batch_size=args.batch_rows,
                        first_step=first,
                        num_steps=args.chunk_steps,
                    )
                    received[r] += clients.read(r + i, req)
        except BaseException as exc:  # noqa: BLE001 — re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(received)


def timed(server: LocalServer, fn: Any) -> dict[str, float]:
    me = psutil.Process()
    c0, s0, t0 = sum(me.cpu_times()[:2]), tree_cpu_s(server.pid), time.perf_counter()
    nbytes = fn()
    wall = time.perf_counter() - t0
    return {
        "seconds": wall,
        "bytes": nbytes,
        "mb_per_s": nbytes / wall / 1e6,
        "client_cpu_s": sum(me.cpu_times()[:2]) - c0,
        "server_cpu_s": tree_cpu_s(server.pid) - s0,
    }


def median_ratio(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def part_workers(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    name = "small"
    out: dict[str, Any] = {"passes": []}
    a = LocalServer(root, workers=1)
    b = LocalServer(root, workers=2)
    with a, b:
        servers = {"A (--workers 1)": a, "B (--workers 2)": b}
        ports = {label: data_ports(s, name) for label, s in servers.items()}
        out["data_ports"] = {label: len(p) for label, p in ports.items()}
        for label, s in servers.items():
            w = timed(s, lambda s=s, label=label: epoch_pass(ports[label], name, args, seed=0))
            log(f"warm-up {label}: {w['mb_per_s']:.0f} MB/s")
        ratios = []
        for i in range(args.pairs):
            pair = {}
            for label, s in servers.items():
                r = timed(s, lambda label=label: epoch_pass(ports[label], name, args, seed=0))
                pair[label] = r
                out["passes"].append({"pair": i, "server": label, **r})
                log(
                    f"pair {i} {label}: {r['mb_per_s']:.0f} MB/s, {r['seconds']:.2f} s, "
                    f"server CPU {r['server_cpu_s']:.2f} s, client CPU {r['client_cpu_s']:.2f} s"
                )
            ratios.append(pair["B (--workers 2)"]["mb_per_s"] / pair["A (--workers 1)"]["mb_per_s"])
        out["ratio_b_over_a"] = ratios
    return out


def part_read_ahead(
    root: Path | str,
    decoded: int,
    args: argparse.Namespace,
    cache_mib: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    name = "readahead"
    out: dict[str, Any] = {"passes": [], "cache_mib": cache_mib, "root": "s3" if env else "local"}
    small = ("--cache-mib", str(cache_mib))
    req_args = argparse.Namespace(
        **{**vars(args), "streams": 1, "rows": args.ra_rows, "chunk_steps": 1 << 30}
    )
    for i in range(args.pairs):
        for label, ahead in (("C (--read-ahead 0)", "0"), ("D (--read-ahead 1)", "1")):
            with LocalServer(root, metrics=True, env=env, extra_args=(*small, "--read-ahead", ahead)) as s:
                r = timed(s, lambda s=s, i=i: epoch_pass([s.data_port], name, req_args, seed=100 + i))
                after = scrape(s)

                def metric(key: str, after: dict[str, float] = after) -> float:
                    return after.get(key, 0.0)

                hits, misses = (
                    metric("shardstream_cache_hits_total"),
                    metric("shardstream_cache_misses_total"),
                )
                r.update(
                    misses=misses,
                    prefetches=metric("shardstream_cache_prefetches_total"),
                    wasted=metric("shardstream_cache_prefetches_wasted_total"),
                    hit_ratio=hits / max(1.0, hits + misses),
                    read_amplification=metric("shardstream_storage_read_bytes_total") / decoded,
                    storage_reads=metric("shardstream_storage_reads_total"),
                )
                out["passes"].append({"pair": i, "server": label, **r})
                log(
                    f"{out['root']}, cache {cache_mib} MiB, pair {i} {label}: {r['seconds']:.2f} s, misses {misses:.0f}, "
                    f"prefetches {r['prefetches']:.0f} (wasted {r['wasted']:.0f}), hit ratio {r['hit_ratio']:.3f}, "
                    f"read amplification {r['read_amplification']:.2f}"
                )
    return out


def part_read_ahead_s3(work: Path, decoded: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    seaweed = start_seaweed(work / "seaweed")
    env = seaweed.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # for ingest, in this process
    try:
        root = f"s3://{BUCKET}/workers-bench-{uuid.uuid4().hex[:8]}"
        opts = IngestOptions(row_group_bytes=1 << 20, progress=False)
        ingest(work / "readahead.parquet", "readahead", root, opts)
        return [part_read_ahead(root, decoded, args, mib, env) for mib in args.ra_cache_mib]
    finally:
        seaweed.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shardstream-workers-bench-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        root, _ = build(work, args.rows, "small", 4)
        _, ra_decoded = build(work, args.ra_rows, "readahead", 1)
        log(f"datasets built in {time.perf_counter() - t0:.1f} s")
        workers = part_workers(root, args)
        read_ahead = [part_read_ahead(root, ra_decoded, args, mib) for mib in args.ra_cache_mib]
        if args.ra_s3:
            read_ahead += part_read_ahead_s3(work, ra_decoded, args)
    return {
        "command": " ".join(["python -m loadtest.workers_bench", *sys.argv[1:]]),
        "args": {**vars(args), "json": str(args.json)},
        "versions": versions(
            "grpcio", "uvloop", "prometheus-client", cpus=str(len(psutil.Process().cpu_affinity()))
        ),
        "workers": workers,
        "read_ahead": read_ahead,
        "read_ahead_decoded_bytes": ra_decoded,  # the denominator of read amplification
    }


def print_report(result: dict[str, Any]) -> None:
    args = argparse.Namespace(**result["args"])
    workers, read_ahead, ra_decoded = (
        result["workers"],
        result["read_ahead"],
        result["read_ahead_decoded_bytes"],
    )
    print(
        f"\nworkers: {args.rows:,} rows x {ROW_BYTES} B, {args.streams} streams, batch {args.batch_rows} rows"
    )
    print(f"  B (--workers 2) / A (--workers 1) throughput: {median_ratio(workers['ratio_b_over_a'])}")
    for label in ("A (--workers 1)", "B (--workers 2)"):
        ps = [p for p in workers["passes"] if p["server"] == label]
        print(
            f"  {label}: {statistics.median(p['mb_per_s'] for p in ps):.0f} MB/s median, "
            f"server CPU {statistics.median(p['server_cpu_s'] for p in ps):.2f} s "
            f"({statistics.median(p['server_cpu_s'] / p['seconds'] for p in ps):.2f} cores, "
            f"{statistics.median(p['bytes'] / 1e6 / p['server_cpu_s'] for p in ps):.0f} MB per CPU-s), "
            f"client CPU {statistics.median(p['client_cpu_s'] for p in ps):.2f} s per pass"
        )
    print(
        f"read-ahead: {args.ra_rows:,} rows ({ra_decoded / 2**20:.1f} MiB decoded), batch {args.batch_rows} rows"
    )
    for part, label in (
        (part, label) for part in read_ahead for label in ("C (--read-ahead 0)", "D (--read-ahead 1)")
    ):
        ps = [p for p in part["passes"] if p["server"] == label]
        print(
            f"  {part['root']}, cache {part['cache_mib']} MiB, {label}: misses {statistics.median(p['misses'] for p in ps):.0f}, "
            f"prefetches {statistics.median(p['prefetches'] for p in ps):.0f} "
            f"(wasted {statistics.median(p['wasted'] for p in ps):.0f}), "
            f"hit ratio {statistics.median(p['hit_ratio'] for p in ps):.3f}, "
            f"read amplification {statistics.median(p['read_amplification'] for p in ps):.2f}, "
            f"{statistics.median(p['seconds'] for p in ps):.2f} s per epoch"
        )


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.workers_bench", __doc__)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the workers dataset (72 B each)")
    ap.add_argument("--streams", type=int, default=4, help="concurrent ranks in a workers pass")
    ap.add_argument("--batch-rows", type=int, default=4096, help="rows per rank per step")
    ap.add_argument(
        "--chunk-steps", type=int, default=8, help="steps per DoGet (calls spread over the workers)"
    )
    ap.add_argument("--pairs", type=int, default=3, help="A B pairs after the warm-ups")
    ap.add_argument("--ra-rows", type=int, default=1_200_000, help="rows of the read-ahead dataset")
    ap.add_argument(
        "--ra-cache-mib",
        type=lambda t: [int(x) for x in t.split(",")],
        default=[24, 48],
        help="cache sizes of the read-ahead servers, comma-separated (default 24,48)",
    )
    ap.add_argument("--ra-s3", action="store_true", help="read-ahead part also from an S3 root (SeaweedFS)")
    return bench_main(ap, argv, run, json_default=results_path("workers_bench"), report=print_report)


if __name__ == "__main__":
    raise SystemExit(main())
