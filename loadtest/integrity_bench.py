"""What integrity costs per GB served: row-group checksums on vs off, one server, alternating passes.

    python -m loadtest.integrity_bench [--mib 1024] [--pairs 3] [--batch-rows 1024] [--json PATH]

One dataset of --mib MiB (`id` int64 + `vec` fixed_size_list<float32>[256] of random values, 1,032
B/row, incompressible) is ingested with ingest's defaults (256 MiB shards, ~4 MiB row groups, Parquet
page checksums), then registered a second time over the same files (hard links) as a version whose
manifest has no row-group checksums — what a manifest written before them looks like:

- **checked** (`bench@1`): the footer's crc32 on open; every row group fetched by ranged reads,
  each column chunk's crc32 checked before it is decoded, Parquet page checksums verified.
- **unchecked** (`plain@1`): the path of a manifest without checksums — size and row counts on open
  (the shards are over the 64 MiB whole-file hash limit), pyarrow reading the file itself.

One `shardstream serve` (1 worker, `--cache-mib 16`: below the dataset, so every pass reads every row
group from storage, with a warm page cache) serves both. A pass is one whole epoch through
`Loader(output="arrow", shuffle=False)`; after a warm-up pass of each, --pairs pairs alternate
unchecked, checked. Per pass: MB/s of Arrow payload delivered, server CPU seconds (psutil, user +
system) and client CPU seconds; per pair, checked/unchecked ratios of time and of server CPU per GB.
Also: crc32 throughput on one core over a 64 MiB buffer (the check's own cost), for scale.

Figures only: never asserts on time, exits 0 unless something crashed. MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import psutil

from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions, write_vectors
from shardstream.client import Loader
from shardstream.manifest import Manifest
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

__all__ = ["main"]

ROW_BYTES = 8 + 4 * 256
DATASETS = {"unchecked": "plain@1", "checked": "bench@1"}


def build(work: Path, mib: int) -> tuple[Path, Manifest]:
    """`bench` (with checksums) and `plain` (the same files, a manifest without them) under work/root."""
    src = work / "src.parquet"
    write_vectors(src, (mib << 20) // ROW_BYTES, 256)
    root = work / "root"
    m = ingest(src, "bench", root, IngestOptions(progress=False))
    src.unlink()
    for shard in m.shards:
        target = root / "plain" / shard.uri
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(root / "bench" / shard.uri, target)
    shards = tuple(dataclasses.replace(s, checksums=None) for s in m.shards)
    with Registry(root) as reg:
        plain = reg.create_version(
            "plain", lambda v, p: Manifest(name="plain", version=v, schema=m.schema, shards=shards)
        )
    assert plain.fingerprint == m.fingerprint and all(s.checksums is None for s in plain.shards)
    return root, m


def one_pass(server: LocalServer, dataset: str, batch_rows: int) -> dict[str, float]:
    proc = psutil.Process(server.pid)
    cpu0 = sum(proc.cpu_times()[:2])
    me0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    delivered = 0
    with Loader([server.target], dataset, batch_size=batch_rows, shuffle=False, output="arrow") as ld:
        for batch in ld:
            delivered += batch.nbytes
    seconds = time.perf_counter() - t0
    me1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "bytes": delivered,
        "mb_per_s": delivered / 1e6 / seconds,
        "server_cpu_s": sum(proc.cpu_times()[:2]) - cpu0,
        "client_cpu_s": (me1.ru_utime - me0.ru_utime) + (me1.ru_stime - me0.ru_stime),
    }


def crc32_gb_per_s() -> float:
    buf = os.urandom(64 << 20)
    best = min(_timed(lambda: zlib.crc32(buf)) for _ in range(5))
    return len(buf) / best / 1e9


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shardstream-integrity-bench-") as tmp:
        t0 = time.perf_counter()
        root, m = build(Path(tmp), args.mib)
        log(
            f"dataset: {m.num_bytes / 2**20:.0f} MiB in {len(m.shards)} shard(s), built in {time.perf_counter() - t0:.1f} s"
        )
        passes: list[dict[str, Any]] = []
        with LocalServer(root, extra_args=("--cache-mib", "16")) as server:
            for label, dataset in DATASETS.items():  # warm-ups: page cache, imports, connections
                one_pass(server, dataset, args.batch_rows)
                log(f"warm-up {label} done")
            for pair in range(args.pairs):
                for label, dataset in DATASETS.items():
                    p = {"pair": pair, "mode": label, **one_pass(server, dataset, args.batch_rows)}
                    passes.append(p)
                    log(
                        f"pair {pair} {label}: {p['mb_per_s']:.0f} MB/s, server CPU {p['server_cpu_s']:.2f} s"
                    )
    by = {(p["pair"], p["mode"]): p for p in passes}
    time_ratio = [by[(i, "checked")]["seconds"] / by[(i, "unchecked")]["seconds"] for i in range(args.pairs)]
    cpu_ratio = [
        (by[(i, "checked")]["server_cpu_s"] / by[(i, "checked")]["bytes"])
        / (by[(i, "unchecked")]["server_cpu_s"] / by[(i, "unchecked")]["bytes"])
        for i in range(args.pairs)
    ]
    return {
        "command": " ".join(["python -m loadtest.integrity_bench", *sys.argv[1:]]),
        "args": {**vars(args), "json": str(args.json)},
        "versions": versions("grpcio", cpus=str(len(psutil.Process().cpu_affinity()))),
        "dataset": {
            "bytes": m.num_bytes,
            "shards": len(m.shards),
            "row_groups": sum(len(s.row_groups) for s in m.shards),
        },
        "crc32_gb_per_s": crc32_gb_per_s(),
        "passes": passes,
        "checked_over_unchecked_time": spread(time_ratio),
        "checked_over_unchecked_server_cpu_per_gb": spread(cpu_ratio),
    }


def print_report(result: dict[str, Any]) -> None:
    d = result["dataset"]
    print(
        f"\nintegrity: {d['bytes'] / 2**20:.0f} MiB in {d['shards']} shard(s), {d['row_groups']} row groups, "
        f"batch {result['args']['batch_rows']} rows, one server (--cache-mib 16), warm page cache"
    )
    for mode in DATASETS:
        ps = [p for p in result["passes"] if p["mode"] == mode]
        print(
            f"  {mode:9s}: {statistics.median(p['mb_per_s'] for p in ps):.0f} MB/s median, server "
            f"{statistics.median(p['server_cpu_s'] / p['bytes'] * 1e9 for p in ps):.2f} CPU-s/GB, client "
            f"{statistics.median(p['client_cpu_s'] / p['bytes'] * 1e9 for p in ps):.2f} CPU-s/GB"
        )
    for key, what in (
        ("checked_over_unchecked_time", "time per pass"),
        ("checked_over_unchecked_server_cpu_per_gb", "server CPU per GB"),
    ):
        s = result[key]
        print(f"  checked / unchecked {what}: {s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f})")
    print(f"  crc32 alone: {result['crc32_gb_per_s']:.2f} GB/s on one core")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.integrity_bench", __doc__)
    ap.add_argument("--mib", type=int, default=1024, help="dataset size in MiB (default 1024)")
    ap.add_argument("--pairs", type=int, default=3, help="unchecked/checked pairs after the warm-ups")
    ap.add_argument("--batch-rows", type=int, default=1024, help="rows per batch (1,032 B each)")
    return bench_main(ap, argv, run, json_default=results_path("integrity_bench"), report=print_report)


if __name__ == "__main__":
    raise SystemExit(main())
