"""Scaling with cores: `serve --workers W` for W = 1, 2, 4, 8 on a CPU-bound load (image decode).

    python -m loadtest.scaling [--workers 1 2 4 8] [--images 480] [--streams 16] [--pairs 3]
                               [--unique-images N] [--client-procs P] [--pin]
                               [--json loadtest/results/scaling.json]

The load: --images JPEGs of 500x375 (loadtest.transform_bench's generator) in row groups of 16,
served with `image.decode` to 224x224 (resize + center crop, Pillow) and no disk tier, so every
pass decodes every image: the servers' CPU is the bottleneck. A pass is one block-shuffled epoch
read by --streams concurrent ranks (world size = --streams, batches of 8 images), each rank's epoch
as Read streams of --chunk-steps steps: plain Arrow Flight DoGets (the ticket is the serialized
ReadRequest) on the workers' data ports, call i of rank r on worker (r + i) mod W, so the calls
spread evenly over the workers (each worker serves a data port of its own; the benchmark learns
them from GetDataset: `loadtest.fleet.data_ports`). The client counts the bytes of the record
batches and their app_metadata and decodes nothing. The ranks
are threads of this process, or (--client-procs P > 1) of P client processes (spawned once, ranks
dealt round-robin), so that on a many-core machine one Python client is not what limits W = 8.
--unique-images N makes N distinct JPEGs and repeats them up to --images (the decode costs the same;
making 10,000 distinct ones takes minutes). A single worker is not a single core: each stream's next
message is built in the data plane's thread pool (server/serving/data_plane.py) and Pillow releases the
GIL while it decodes, so one process keeps several cores busy. --pin measures scaling with cores instead: server W runs on W
CPUs (every thread of its processes; one per physical core first, then hyperthread siblings), the
client processes on the others (or on all, when none are left). One
`shardstream serve --workers W --transform-threads 1` per W, started once and warmed up with one
pass (row groups cached, imports done); then --pairs rounds, each measuring every W (the order
alternating from round to round). Reported per W: images/s, the server's CPU seconds (main process
and workers) and cores kept busy, images per server CPU-second, and per round the speedup over
W = 1 and the efficiency speedup / W (target: >= 0.8 up to 8 workers, where the machine has the
cores). By default only the W the machine has cores for are run (W <= CPUs); the others are listed
as not measured. Figures only; exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from loadtest.fleet import DoGetClients, data_ports, tree_cpu_s
from loadtest.transform_bench import make_jpegs
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest
from shardstream.transform_spec import to_wire
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["WORKERS", "main", "measure_scaling"]

WORKERS = (1, 2, 4, 8)
ROW_GROUP_ROWS = 16
BATCH = 8
DECODE = to_wire([{"op": "image.decode", "column": "image", "size": [224, 224]}])


def epoch_pass(
    ports: list[int], images: int, streams: int, chunk_steps: int, seed: int, ranks: list[int] | None = None
) -> int:
    """One epoch by `streams` concurrent ranks (or only `ranks` of them), each in DoGets of
    `chunk_steps` steps spread over the workers' data `ports`; bytes received."""
    steps = -(-images // (streams * BATCH))
    received = [0] * streams
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            with DoGetClients(ports) as clients:
                for i, first in enumerate(range(0, steps, chunk_steps)):
                    req = pb.ReadRequest(
                        dataset="images",
                        seed=seed,
                        shuffle=pb.Shuffle(mode="block"),
                        rank=r,
                        world_size=streams,
                        batch_size=BATCH,
                        first_step=first,
                        num_steps=chunk_steps,
                        columns=["image"],
                        transforms=DECODE,
                    )
                    received[r] += clients.read(r + i, req)
        except BaseException as exc:  # noqa: BLE001 — re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (range(streams) if ranks is None else ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(received)


def cpu_order() -> list[int]:
    """The CPUs this process may use, one per physical core first, then their hyperthread siblings."""
    first: list[int] = []
    rest: list[int] = []
    seen: set[tuple[str, str]] = set()
    for cpu in sorted(os.sched_getaffinity(0)):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            key = (str(cpu), "")
        (rest if key in seen else first).append(cpu)
        seen.add(key)
    return first + rest


def pin(pid: int, cpus: list[int]) -> None:
    """Every thread of process `pid` onto `cpus` (threads it starts later inherit the mask)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


def pin_tree(pid: int, cpus: list[int]) -> None:
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        pin(proc.pid, cpus)


def client_part(
    job: tuple[list[int] | None, list[int], int, int, int, int, list[int]],
) -> tuple[int, float]:
    """A client process's share of a pass (--client-procs): its ranks' bytes and its CPU seconds."""
    if job[0]:
        pin(os.getpid(), job[0])
    c0 = time.process_time()
    nbytes = epoch_pass(*job[1:])
    return nbytes, time.process_time() - c0


def one_pass(
    server: LocalServer,
    ports: list[int],
    args: argparse.Namespace,
    seed: int,
    pool: Any = None,
    procs: int = 1,
    cpus: dict[str, list[int]] | None = None,
) -> dict[str, float]:
    me = psutil.Process()
    client_cpus = cpus["client"] if cpus else None
    if cpus:
        pin_tree(server.pid, cpus["server"])
        if pool is None:
            pin(me.pid, cpus["client"])
    c0, s0, t0 = sum(me.cpu_times()[:2]), tree_cpu_s(server.pid), time.perf_counter()
    if pool is None:
        nbytes, child_cpu = epoch_pass(ports, args.images, args.streams, args.chunk_steps, seed), 0.0
    else:
        jobs = [
            (
                client_cpus,
                ports,
                args.images,
                args.streams,
                args.chunk_steps,
                seed,
                list(range(i, args.streams, procs)),
            )
            for i in range(procs)
        ]
        parts = pool.map(client_part, jobs, chunksize=1)
        nbytes, child_cpu = sum(p[0] for p in parts), sum(p[1] for p in parts)
    wall = time.perf_counter() - t0
    cpu = tree_cpu_s(server.pid) - s0
    client_cpu = sum(me.cpu_times()[:2]) - c0 + child_cpu
    return {
        "images_per_s": args.images / wall,
        "wall_s": wall,
        "server_cpu_s": cpu,
        "server_cores_busy": cpu / wall,
        "images_per_server_cpu_s": args.images / cpu if cpu else 0.0,
        "client_cpu_s": client_cpu,
        "client_cores_busy": client_cpu / wall,
        "bytes": nbytes,
    }


def measure_scaling(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The scaling curve (the suite's "scaling" section calls this too)."""
    cpus = os.cpu_count() or 1
    asked = tuple(args.workers) if args.workers else WORKERS
    workers = tuple(w for w in asked if args.workers or w <= cpus)
    root = workdir / "root"
    src = workdir / "images.parquet"
    unique = min(args.images, getattr(args, "unique_images", 0) or args.images)
    procs = getattr(args, "client_procs", 1)
    log(f"making {args.images} JPEGs of 500x375 ({unique} distinct) in {workdir}")
    jpegs = make_jpegs(unique)
    images = pa.array([jpegs[i % unique] for i in range(args.images)], pa.binary())
    pq.write_table(pa.table({"image": images}), src)
    del jpegs, images
    ingest(src, "images", root, IngestOptions(row_group_rows=ROW_GROUP_ROWS, progress=False))
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in workers}
    servers: dict[int, LocalServer] = {}
    ports: dict[int, list[int]] = {}
    pool = multiprocessing.get_context("spawn").Pool(procs) if procs > 1 else None
    cpus_in_order = cpu_order()
    pins = {
        w: {"server": sorted(cpus_in_order[:w]), "client": sorted(cpus_in_order[w:] or cpus_in_order)}
        for w in workers
        if getattr(args, "pin", False)
    }
    if pins:
        log(f"  pinned: CPUs in order {cpus_in_order}; " + "; ".join(f"W={w}: {p}" for w, p in pins.items()))
    try:
        for w in workers:
            servers[w] = LocalServer(root, workers=w, extra_args=("--transform-threads", "1")).start()
            ports[w] = data_ports(servers[w], "images")
            if len(ports[w]) < w:
                log(
                    f"  workers={w}: only {len(ports[w])} of the workers' data ports answered; reading from those"
                )
            warm = one_pass(servers[w], ports[w], args, seed=999, pool=pool, procs=procs, cpus=pins.get(w))
            log(f"  warm-up  workers={w}: {warm['images_per_s']:6.0f} images/s")
        for round_ in range(args.pairs):
            order = workers if round_ % 2 == 0 else workers[::-1]
            for w in order:
                r = one_pass(
                    servers[w], ports[w], args, seed=round_, pool=pool, procs=procs, cpus=pins.get(w)
                )
                runs[w].append(r)
                log(
                    f"  round {round_ + 1} workers={w}: {r['images_per_s']:6.0f} images/s, server "
                    f"{r['server_cores_busy']:.2f} cores busy, {r['images_per_server_cpu_s']:.0f} images/server CPU-s, "
                    f"client {r['client_cores_busy']:.2f} cores busy"
                )
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        for s in servers.values():
            s.stop()
    base = runs[workers[0]]
    speedup = {
        w: [r["images_per_s"] / b["images_per_s"] for r, b in zip(rs, base, strict=True)]
        for w, rs in runs.items()
    }
    return {
        "cpus": cpus,
        "workers_measured": list(workers),
        "workers_not_measured": [w for w in WORKERS if w not in workers],
        "images_per_s": {str(w): spread([r["images_per_s"] for r in rs]) for w, rs in runs.items()},
        "server_cores_busy": {str(w): spread([r["server_cores_busy"] for r in rs]) for w, rs in runs.items()},
        "images_per_server_cpu_s": {
            str(w): spread([r["images_per_server_cpu_s"] for r in rs]) for w, rs in runs.items()
        },
        "client_cpu_s": {str(w): spread([r["client_cpu_s"] for r in rs]) for w, rs in runs.items()},
        "client_cores_busy": {str(w): spread([r["client_cores_busy"] for r in rs]) for w, rs in runs.items()},
        "client_procs": procs,
        "pinned": {str(w): p for w, p in pins.items()},
        "distinct_images": unique,
        "speedup": {str(w): spread(v) for w, v in speedup.items()},
        "efficiency": {str(w): spread([x * workers[0] / w for x in v]) for w, v in speedup.items()},
        "runs": {str(w): rs for w, rs in runs.items()},
    }


def print_scaling(res: dict[str, Any]) -> None:
    print(
        "\nworkers  images/s (min-max)      speedup (min-max)   efficiency   cores busy   images/server CPU-s"
        "   client cores"
    )
    for w in res["workers_measured"]:
        k = str(w)
        ips, sp, eff = res["images_per_s"][k], res["speedup"][k], res["efficiency"][k]
        print(
            f"{w:>7}  {ips['median']:>6.0f} ({ips['min']:.0f}-{ips['max']:.0f})  "
            f"{sp['median']:>8.2f} ({sp['min']:.2f}-{sp['max']:.2f})  {eff['median']:>10.2f}   "
            f"{res['server_cores_busy'][k]['median']:>10.2f}   {res['images_per_server_cpu_s'][k]['median']:>10.0f}"
            f"   {res['client_cores_busy'][k]['median']:>12.2f}"
        )
    if res["workers_not_measured"]:
        print(
            f"not measured: workers {', '.join(map(str, res['workers_not_measured']))} "
            f"(this machine has {res['cpus']} CPUs)"
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shardstream-scaling-") as tmp:
        res = measure_scaling(args, Path(tmp))
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.scaling", *sys.argv[1:]]),
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "versions": versions("grpcio", "pillow", "uvloop"),
        "data_plane": "Arrow Flight DoGet on each worker's data port (ticket: ReadRequest)",
        "load_average": list(psutil.getloadavg()),
        **res,
    }


def add_options(ap: argparse.ArgumentParser, images: int = 480, pairs: int = 3) -> None:
    ap.add_argument(
        "--workers",
        type=int,
        nargs="+",
        help=f"worker counts to measure (default {' '.join(map(str, WORKERS))}, those the CPUs allow)",
    )
    ap.add_argument("--images", type=int, default=images, help=f"JPEGs per pass (default {images})")
    ap.add_argument("--streams", type=int, default=16, help="concurrent ranks per pass (default 16)")
    ap.add_argument("--chunk-steps", type=int, default=1, help="steps per DoGet (default 1)")
    ap.add_argument(
        "--pairs", type=int, default=pairs, help=f"measured rounds after the warm-up (default {pairs})"
    )
    ap.add_argument(
        "--unique-images",
        type=int,
        default=0,
        metavar="N",
        help="distinct JPEGs, repeated up to --images (default 0: all distinct)",
    )
    ap.add_argument(
        "--client-procs",
        type=int,
        default=1,
        metavar="P",
        help="client processes the ranks are dealt over (default 1: threads of this process)",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="server W on W CPUs, the clients on the others: scaling with cores, not processes",
    )


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.scaling", __doc__)
    add_options(ap)
    return bench_main(ap, argv, run, json_default=results_path("scaling"), report=print_scaling)


if __name__ == "__main__":
    # `timeout` (loadtest/device_run.sh) sends SIGTERM: unwind, so that the servers (own sessions)
    # and the client processes are stopped rather than left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
