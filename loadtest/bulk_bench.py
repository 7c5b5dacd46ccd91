"""Data engineering at scale: task-side registration on Spark vs `register`, and materialized vs online decode.

    python -m loadtest.bulk_bench [--files 2000] [--rows-per-file 64] [--images 600] [--pairs 3] [--json PATH]

1. register: --files small Parquet files (--rows-per-file rows of `id` int64, `text` ~120 B and a
   512 B incompressible `payload`; written by pyarrow with page checksums, as a Spark job would leave
   them) under `ROOT/files/data/job/`, registered as a version
   - by today's single-process `register` (footers read on 32 threads, then every file hashed on 32
     threads: `shardstream register`), and
   - by `shardstream.engines.spark_io.register_files` on a local[2] Spark: one task per file reads its footer,
     sha256 and row-group checksums (and, by default, decodes it once for its page checksums), the
     driver registers; also with the default grouping (about 4 tasks per core), with and without
     the page check.
   One run each after a warm-up `register` (page cache warm); Spark's start-up is reported apart.
   Ratio: Spark's time / `register`'s. On one 2-CPU machine Spark can only lose (a JVM, task
   scheduling, Python workers, the same 2 CPUs): the figure says what a task costs, so that a
   cluster's gain can be judged (files / (executors x files per second per task)).
2. serve: --images 500x375 JPEGs (loadtest.transform_bench.make_jpegs) served as 224x224 pixels by one
   server (`--transform-threads 1`, 1 worker) to one client, batches of 32: `image.decode` online
   over the JPEGs vs the version `materialize` made of the same transform (no decode). Passes
   alternate online, materialized after a warm-up each, --pairs pairs; per pass the server's CPU
   seconds (psutil, user + system) per image, the client's, images/s. Ratio: materialized / online
   server CPU per image. Also: what `materialize` itself cost (local engine, CPU-s), the storage it
   adds, and the epochs after which it has paid for itself in server CPU.

Figures only: never asserts on time, exits 0 unless something crashed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.client import Loader
from shardstream.registry import Registry
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.server.writing.materialize import materialize
from shardstream.server.writing.registry_ops import register

from .common import bench_main, bench_parser, log, results_path, spread, versions
from .transform_bench import make_jpegs

__all__ = ["main"]

SIZE = 224
DECODE = [{"op": "image.decode", "column": "image", "size": [SIZE, SIZE]}]


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


# --- 1. register -----------------------------------------------------------------------------------
def write_files(root: Path, files: int, rows: int) -> int:
    rng = np.random.default_rng(0)
    out = root / "files" / "data" / "job"
    out.mkdir(parents=True)
    total = 0
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "text": [f"document {j} " + "lorem ipsum dolor sit amet " * 4 for j in ids.tolist()],
                "payload": [rng.bytes(512) for _ in range(rows)],
            }
        )
        path = out / f"part-{i:05d}.parquet"
        pq.write_table(table, path, write_page_checksum=True)
        total += path.stat().st_size
    return total


def local_spark(scratch: Path) -> Any:
    """A local[2] SparkSession (no UI), Python workers on this interpreter."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers' interpreter: this one
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("shardstream-bulk-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", str(scratch))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed(fn: Any) -> tuple[float, float, Any]:
    """(wall seconds, this process's CPU seconds, result)."""
    c0, t0 = _cpu_self(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, _cpu_self() - c0, out


def bench_register(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    root = work / "reg"
    t0 = time.perf_counter()
    size = write_files(root, args.files, args.rows_per_file)
    log(f"register: {args.files} files, {size / 2**20:.1f} MiB, written in {time.perf_counter() - t0:.1f} s")
    reg = Registry(root)
    register(reg, "files", ["data/job"], progress=False)  # warm-up: page cache, imports
    out: dict[str, Any] = {"files": args.files, "bytes": size, "rows_per_file": args.rows_per_file}
    wall, cpu, m = timed(lambda: register(reg, "files", ["data/job"], progress=False))
    out["register"] = {"seconds": wall, "driver_cpu_s": cpu, "version": m.ref}
    log(f"  register (1 process, 32 threads): {wall:.2f} s")
    if args.skip_spark:
        return out
    from shardstream.engines.spark_io import register_files

    t0 = time.perf_counter()
    spark = local_spark(work / "spark")
    spark.sparkContext.parallelize(range(4), 2).count()  # Python workers started
    out["spark_startup_s"] = time.perf_counter() - t0
    log(f"  spark local[2] start-up: {out['spark_startup_s']:.1f} s")
    try:
        runs = {
            "spark_task_per_file": {"files_per_task": 1},
            "spark_default_grouping": {},
            "spark_default_no_page_check": {"verify_pages": False},
        }
        for label, kwargs in runs.items():
            wall, cpu, ref = timed(
                lambda kw=kwargs: register_files(spark, root, "files", ["data/job"], quiet=True, **kw)
            )
            out[label] = {"seconds": wall, "driver_cpu_s": cpu, "version": ref, **kwargs}
            out[f"{label}_over_register"] = wall / out["register"]["seconds"]
            log(f"  {label}: {wall:.2f} s ({wall / out['register']['seconds']:.2f}x register)")
        fps = {Registry(root).resolve(out[k]["version"]).fingerprint for k in ("register", *runs)}
        out["same_fingerprint"] = len(fps) == 1
    finally:
        spark.stop()
    return out


# --- 2. serve ---------------------------------------------------------------------------------------
def one_pass(server: LocalServer, ref: str, transforms: list[dict[str, Any]] | None) -> dict[str, float]:
    proc = psutil.Process(server.pid)
    s0 = sum(proc.cpu_times()[:2])
    c0, t0 = time.process_time(), time.perf_counter()
    n = 0
    with Loader(
        [server.target], ref, batch_size=32, shuffle=False, columns=["image"], transforms=transforms
    ) as ld:
        for b in ld:
            n += len(b["image"])
    wall = time.perf_counter() - t0
    server_cpu = sum(proc.cpu_times()[:2]) - s0
    return {
        "images": n,
        "seconds": wall,
        "images_per_s": n / wall,
        "server_cpu_ms_per_image": server_cpu / n * 1e3,
        "client_cpu_ms_per_image": (time.process_time() - c0) / n * 1e3,
    }


def bench_serve(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    root = work / "serve"
    log(f"serve: making {args.images} JPEGs (500x375)")
    src = work / "images.parquet"
    pq.write_table(pa.table({"image": pa.array(make_jpegs(args.images), pa.binary())}), src)
    jpegs = ingest(
        src, "images", root, IngestOptions(row_group_rows=64, shard_rows=args.images // 2 + 1, progress=False)
    )
    wall, cpu, mat = timed(lambda: materialize(str(root), jpegs.ref, DECODE, "images-224", threads=1))
    log(f"  materialize ({jpegs.ref} -> {mat.ref}, local engine, 1 thread): {wall:.1f} s, {cpu:.1f} CPU-s")
    out: dict[str, Any] = {
        "images": args.images,
        "source_bytes": jpegs.num_bytes,
        "materialized_bytes": mat.num_bytes,
        "materialize": {"seconds": wall, "cpu_s": cpu},
    }
    passes: dict[str, list[dict[str, float]]] = {"online": [], "materialized": []}
    with LocalServer(root, extra_args=("--transform-threads", "1")) as server:
        modes = {"online": (jpegs.ref, DECODE), "materialized": (mat.ref, None)}
        for ref, transforms in modes.values():  # warm-ups
            one_pass(server, ref, transforms)
        for pair in range(args.pairs):
            for mode, (ref, transforms) in modes.items():
                p = one_pass(server, ref, transforms)
                passes[mode].append(p)
                log(
                    f"  pair {pair} {mode}: {p['images_per_s']:.0f} images/s, server "
                    f"{p['server_cpu_ms_per_image']:.2f} CPU-ms/image, client {p['client_cpu_ms_per_image']:.2f}"
                )
    out["passes"] = passes
    out["materialized_over_online_server_cpu_per_image"] = spread(
        [
            m["server_cpu_ms_per_image"] / o["server_cpu_ms_per_image"]
            for o, m in zip(passes["online"], passes["materialized"], strict=True)
        ]
    )
    out["materialized_over_online_images_per_s"] = spread(
        [
            m["images_per_s"] / o["images_per_s"]
            for o, m in zip(passes["online"], passes["materialized"], strict=True)
        ]
    )
    online = statistics.median(p["server_cpu_ms_per_image"] for p in passes["online"])
    stored = statistics.median(p["server_cpu_ms_per_image"] for p in passes["materialized"])
    saved_per_epoch_s = (online - stored) * args.images / 1e3
    out["break_even_epochs"] = cpu / saved_per_epoch_s if saved_per_epoch_s > 0 else None
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shardstream-bulk-bench-") as tmp:
        work = Path(tmp)
        result: dict[str, Any] = {
            "command": " ".join(["python -m loadtest.bulk_bench", *sys.argv[1:]]),
            "args": {**vars(args), "json": str(args.json)},
            "versions": versions(
                "grpcio", "pillow", "pyspark", cpus=str(len(psutil.Process().cpu_affinity()))
            ),
        }
        if not args.skip_register:
            result["register"] = bench_register(work, args)
        if not args.skip_serve:
            result["serve"] = bench_serve(work, args)
    return result


def print_report(result: dict[str, Any]) -> None:
    r = result.get("register")
    if r is not None:
        print(
            f"\nregister {r['files']} files ({r['bytes'] / 2**20:.1f} MiB, {r['rows_per_file']} rows each), warm page cache:"
        )
        print(f"  register, one process (32 threads):  {r['register']['seconds']:.2f} s")
        if "spark_startup_s" in r:
            for k, v in r.items():
                if k.startswith("spark_") and isinstance(v, dict):
                    print(f"  {k:36s} {v['seconds']:.2f} s  = {r[k + '_over_register']:.2f}x register")
            print(
                f"  (Spark local[2] start-up, not counted: {r['spark_startup_s']:.1f} s; same fingerprint: {r['same_fingerprint']})"
            )
    s = result.get("serve")
    if s is not None:
        print(
            f"\nserve {s['images']} images as {SIZE}x{SIZE}, one server (--transform-threads 1), batches of 32:"
        )
        for mode in ("online", "materialized"):
            ps = s["passes"][mode]
            print(
                f"  {mode:12s}: server {statistics.median(p['server_cpu_ms_per_image'] for p in ps):.3f} CPU-ms/image, "
                f"client {statistics.median(p['client_cpu_ms_per_image'] for p in ps):.3f}, "
                f"{statistics.median(p['images_per_s'] for p in ps):.0f} images/s"
            )
        c = s["materialized_over_online_server_cpu_per_image"]
        t = s["materialized_over_online_images_per_s"]
        print(
            f"  materialized / online server CPU per image: {c['median']:.3f} (min {c['min']:.3f}, max {c['max']:.3f})"
        )
        print(
            f"  materialized / online images per second:    {t['median']:.2f} (min {t['min']:.2f}, max {t['max']:.2f})"
        )
        print(
            f"  materialize once: {s['materialize']['cpu_s']:.1f} CPU-s; storage {s['source_bytes'] / 2**20:.1f} MiB of JPEGs "
            f"-> {s['materialized_bytes'] / 2**20:.1f} MiB of pixels ({s['materialized_bytes'] / s['source_bytes']:.1f}x); "
            f"pays for itself after {s['break_even_epochs']:.2f} epoch(s)"
        )


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.bulk_bench", __doc__)
    ap.add_argument("--files", type=int, default=2000, help="files to register (default 2000)")
    ap.add_argument("--rows-per-file", type=int, default=64, help="rows per file (~0.7 kB each; default 64)")
    ap.add_argument("--images", type=int, default=600, help="JPEGs served (default 600)")
    ap.add_argument("--pairs", type=int, default=3, help="online/materialized pairs after the warm-ups")
    ap.add_argument("--skip-spark", action="store_true", help="register with `register` only")
    ap.add_argument("--skip-register", action="store_true", help="only the serving comparison")
    ap.add_argument("--skip-serve", action="store_true", help="only the registration comparison")
    return bench_main(ap, argv, run, json_default=results_path("bulk_bench"), report=print_report)


if __name__ == "__main__":
    raise SystemExit(main())
