"""Server CPU of image decode: many jobs sharing one decode (the feature cache), and draft decoding.

    python -m loadtest.decode_bench [--only jobs draft] [--images 480] [--jobs 4] [--pairs 3]
                                    [--json loadtest/results/decode_bench.json]

1. **jobs** — decode once for many jobs (server/read/feature_cache.py). --images JPEGs of 500x375
   (loadtest.transform_bench's generator: smooth content + noise, quality 90) in row groups of 32,
   read by jobs with the pipeline of a training run that augments: `image.decode` to 256x256
   (resize to cover, center crop) then `image.crop` 224x224 at a random offset with a random flip.
   Each job is one whole block-shuffled epoch through `Loader(output="arrow")`, batch 32, its own
   seed (0, 1, 2, ...), the jobs of a run concurrent (one thread each in this process). Every run
   gets a fresh server (`--transform-threads 2`, one process) and, with the feature cache, a fresh
   empty `--cache-dir`: each run pays its decode once, cold (the server is first warmed up — imports,
   thread pools — on another small dataset, outside the measurement). Runs, alternating after a warm-up:
   A = 1 job and B = --jobs jobs with the feature cache; C = 1 job and D = --jobs jobs without a
   disk tier (every job decodes every image); E = --jobs jobs one after another on one fresh
   server and disk tier (a sweep whose jobs do not start at the same moment). Server CPU = CPU
   seconds of the server process during the run (psutil); ratios B/A, D/C and E / E's first job per
   round, median (min-max).
2. **draft** — `"draft": true` (JPEG DCT scaling, not bit-identical) vs the default decode, one
   server with `--transform-threads 1`, one client, one unshuffled epoch per pass: images per server
   CPU-second, alternating A B after a warm-up each, for 500x375 JPEGs to 224x224 (the image is
   less than twice the target: no scale applies) and 1024x768 JPEGs to 224x224 (decoded at 1/2).

Client and server share the machine's cores (and on a shared machine, other processes do too):
the figures to quote are the ratios of one run. Figures only; exits 0.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from loadtest.transform_bench import make_jpegs
from shardstream.client import Loader
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

__all__ = ["main"]

PARTS = ("jobs", "draft")
ROW_GROUP_ROWS = 32
BATCH = 32
AUGMENT = [
    {"op": "image.decode", "column": "image", "size": [256, 256]},
    {"op": "image.crop", "column": "image", "size": [224, 224], "crop": "random", "hflip": True},
]
DECODE = {"op": "image.decode", "column": "image", "size": [224, 224]}


def large_jpegs(n: int, width: int, height: int, seed: int = 0) -> list[bytes]:
    """n JPEGs of width x height, the content of `make_jpegs` at another size."""
    from PIL import Image

    out = []
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    for _ in range(n):
        f = rng.uniform(0.0025, 0.025, 6)
        img = np.stack(
            [127 + 120 * np.sin(f[2 * c] * xx + f[2 * c + 1] * yy + rng.uniform(0, 6)) for c in range(3)],
            axis=-1,
        )
        img += rng.normal(0, 12, img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def write_images(work: Path, root: Path, name: str, jpegs: list[bytes]) -> None:
    src = work / f"{name}.parquet"
    pq.write_table(pa.table({"image": pa.array(jpegs, pa.binary())}), src)
    ingest(src, name, root, IngestOptions(row_group_rows=ROW_GROUP_ROWS, progress=False))


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def read_epoch(target: str, dataset: str, seed: int, transforms: list[dict[str, Any]], shuffle: Any) -> int:
    n = 0
    with Loader(
        [target],
        dataset,
        batch_size=BATCH,
        seed=seed,
        shuffle=shuffle,
        columns=["image"],
        output="arrow",
        transforms=transforms,
        world_size=1,
        rank=0,
    ) as loader:
        for batch in loader:
            n += batch.num_rows
    return n


# --- 1. jobs sharing one decode -----------------------------------------------------------------
def jobs_run(root: Path, work: Path, jobs: int, shared: bool, images: int) -> dict[str, float]:
    """`jobs` concurrent jobs (seeds 0..jobs-1) on a fresh server: its CPU seconds and the wall time."""
    args = ["--transform-threads", "2"]
    with tempfile.TemporaryDirectory(dir=work, prefix="cache-") as cache:
        if shared:
            args += ["--cache-dir", cache]
        with LocalServer(root, extra_args=tuple(args)) as server:
            counts = [0] * jobs
            errors: list[BaseException] = []

            def job(k: int) -> None:
                try:
                    counts[k] = read_epoch(server.target, "images", k, AUGMENT, "block")
                except BaseException as exc:  # re-raised below
                    errors.append(exc)

            # Warm the fresh server (imports, thread pools) on another dataset: not part of the run.
            read_epoch(server.target, "warm", 0, AUGMENT, "block")
            warm_files = list(Path(cache).glob("feat-*"))
            threads = [threading.Thread(target=job, args=(k,)) for k in range(jobs)]
            c0, t0 = _cpu_s(server.pid), time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall, cpu = time.perf_counter() - t0, _cpu_s(server.pid) - c0
            if errors:
                raise errors[0]
            if counts != [images] * jobs:
                raise AssertionError(f"jobs received {counts} images, not {images} each")
            files = len(list(Path(cache).glob("feat-*"))) - len(warm_files)
    return {"server_cpu_s": cpu, "wall_s": wall, "images": sum(counts), "feature_files": files}


def staggered_run(root: Path, work: Path, jobs: int, images: int) -> dict[str, float]:
    """`jobs` jobs one after another (a sweep whose jobs do not start at the same moment) on a fresh
    server and disk tier: the server's CPU seconds for all of them, and for the first alone."""
    with tempfile.TemporaryDirectory(dir=work, prefix="cache-") as cache:
        args = ("--transform-threads", "2", "--cache-dir", cache)
        with LocalServer(root, extra_args=args) as server:
            read_epoch(server.target, "warm", 0, AUGMENT, "block")
            each, t0 = [], time.perf_counter()
            for k in range(jobs):
                c0 = _cpu_s(server.pid)
                if read_epoch(server.target, "images", k, AUGMENT, "block") != images:
                    raise AssertionError(f"job {k} did not receive {images} images")
                each.append(_cpu_s(server.pid) - c0)
            wall = time.perf_counter() - t0
    return {
        "server_cpu_s": sum(each),
        "first_job_cpu_s": each[0],
        "wall_s": wall,
        "images": jobs * images,
        "feature_files": 0,
    }


def run_jobs(args: argparse.Namespace, root: Path, work: Path) -> dict[str, Any]:
    runs: dict[str, Callable[[], dict[str, float]]] = {
        "A_1_job_shared": lambda: jobs_run(root, work, 1, True, args.images),
        f"B_{args.jobs}_jobs_shared": lambda: jobs_run(root, work, args.jobs, True, args.images),
        "C_1_job_unshared": lambda: jobs_run(root, work, 1, False, args.images),
        f"D_{args.jobs}_jobs_unshared": lambda: jobs_run(root, work, args.jobs, False, args.images),
        f"E_{args.jobs}_jobs_staggered": lambda: staggered_run(root, work, args.jobs, args.images),
    }
    out: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
    for round_ in range(args.pairs + 1):
        for name, fn in runs.items():
            r = fn()
            log(
                f"  {'warm-up' if round_ == 0 else f'round {round_}'} {name:<22} server {r['server_cpu_s']:6.2f} CPU-s"
                f"  {r['images'] / r['wall_s']:6.0f} images/s  {r['feature_files']} feature files"
            )
            if round_:
                out[name].append(r)
    a, b, c, d, e = out.values()
    return {
        "staggered_ratio": spread([r["server_cpu_s"] / r["first_job_cpu_s"] for r in e]),
        "runs": out,
        "server_cpu_s": {k: spread([r["server_cpu_s"] for r in v]) for k, v in out.items()},
        "shared_ratio": spread([y["server_cpu_s"] / x["server_cpu_s"] for x, y in zip(a, b, strict=True)]),
        "unshared_ratio": spread([y["server_cpu_s"] / x["server_cpu_s"] for x, y in zip(c, d, strict=True)]),
        "shared_jobs_over_one_unshared_job": spread(
            [y["server_cpu_s"] / x["server_cpu_s"] for x, y in zip(c, b, strict=True)]
        ),
        "one_job_shared_over_unshared": spread(
            [x["server_cpu_s"] / y["server_cpu_s"] for x, y in zip(a, c, strict=True)]
        ),
    }


# --- 2. draft decoding --------------------------------------------------------------------------
def run_draft(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with LocalServer(root, extra_args=("--transform-threads", "1")) as server:
        for dataset in ("images", "large"):

            def one(draft: bool, dataset: str = dataset) -> float:
                c0 = _cpu_s(server.pid)
                n = read_epoch(server.target, dataset, 0, [{**DECODE, "draft": draft}], False)
                return n / (_cpu_s(server.pid) - c0)

            one(False), one(True)  # warm-up
            plain, draft = [], []
            for _ in range(args.pairs):
                plain.append(one(False))
                draft.append(one(True))
            log(
                f"  {dataset}: images per server CPU-s {np.median(plain):.0f} default, {np.median(draft):.0f} draft"
            )
            out[dataset] = {
                "default_images_per_cpu_s": spread(plain),
                "draft_images_per_cpu_s": spread(draft),
                "ratio": spread([b / a for a, b in zip(plain, draft, strict=True)]),
            }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "versions": versions("grpcio", "pillow"),
    }
    with tempfile.TemporaryDirectory(prefix="shardstream-decode-") as tmp:
        work = Path(tmp)
        root = work / "root"
        log(f"making {args.images} JPEGs of 500x375 in {work}")
        write_images(work, root, "images", make_jpegs(args.images))
        write_images(work, root, "warm", make_jpegs(BATCH, seed=1))
        if "jobs" in args.only:
            log(f"1. server CPU: {args.jobs} concurrent jobs vs 1, with and without the feature cache")
            result["jobs"] = run_jobs(args, root, work)
        if "draft" in args.only:
            log(f"making {args.images // 2} JPEGs of 1024x768")
            write_images(work, root, "large", large_jpegs(args.images // 2, 1024, 768))
            log("2. images per server CPU-second: draft vs default decode")
            result["draft"] = run_draft(args, root)
    result["load_average"] = list(psutil.getloadavg())
    return result


def _fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def print_report(result: dict[str, Any]) -> None:
    if "jobs" in result:
        r, n = result["jobs"], result["config"]["jobs"]
        print(f"\nserver CPU-s per run (median, min-max), {result['config']['images']} images per job:")
        for name, s in r["server_cpu_s"].items():
            print(f"  {name:<24} {_fmt(s)}")
        print(f"{n} jobs / 1 job, feature cache:    {_fmt(r['shared_ratio'])}  (target <= 1.3)")
        print(
            f"{n} jobs one after another / the first: {_fmt(r['staggered_ratio'])}  (same server, feature cache)"
        )
        print(f"{n} jobs / 1 job, no feature cache: {_fmt(r['unshared_ratio'])}")
        print(f"{n} jobs with / 1 job without cache: {_fmt(r['shared_jobs_over_one_unshared_job'])}")
        print(f"1 job, feature cache / none:       {_fmt(r['one_job_shared_over_unshared'])}")
    for dataset, r in result.get("draft", {}).items():
        print(
            f"draft / default images per server CPU-s, {dataset}: {_fmt(r['ratio'])}"
            f"  ({r['default_images_per_cpu_s']['median']:.0f} vs {r['draft_images_per_cpu_s']['median']:.0f})"
        )


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.images < BATCH or args.jobs < 2 or args.pairs < 1:
        ap.error(f"--images must be >= {BATCH}, --jobs >= 2 and --pairs >= 1")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.decode_bench", __doc__)
    ap.add_argument(
        "--only", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run (default both)"
    )
    ap.add_argument("--images", type=int, default=480, help="JPEGs of 500x375 (default 480)")
    ap.add_argument("--jobs", type=int, default=4, help="concurrent jobs of run B and D (default 4)")
    ap.add_argument("--pairs", type=int, default=3, help="rounds after the warm-up (default 3)")
    return bench_main(
        ap, argv, run, json_default=results_path("decode_bench"), report=print_report, check=_check
    )


if __name__ == "__main__":
    raise SystemExit(main())
