"""`make bench`: the benchmarks of issues #7 and #17 in one run, each as a ratio against a baseline of the same run.

    python -m loadtest.suite [--quick] [--only NAME ...] [--json loadtest/results/suite.json]

1. dataplane    per row shape (flight_bench.SHAPES: 1 KiB vectors, 2,048-token rows, 16-token rows,
                ~150 KiB images; --quick: the first two) and shuffle mode, shardstream's data plane (Arrow Flight DoGet of a `shardstream serve`, read by a plain
                FlightClient with the ReadRequest as ticket and by the Loader) vs Arrow Flight DoGet
                serving the same 2 MiB batches from memory, same allocator settings
                (`loadtest.flight_bench`): per-stream MB/s, server and client CPU/GB and p99 batch
                wait as ratios per round, alternating; issue #17's targets (>= 1.0x MB/s, server
                CPU/GB <= 1.2x). Shuffled, also against Flight copying each batch's rows out of its
                table in a shuffled order as it sends them (`--gather`): what a shuffle's copy costs.
2. servers      2 server processes vs 1 on a server-bound load (full shuffle of 264 B rows,
                batches of 4,096 rows, 2 ranks, no step time): total samples/s, alternating.
3. cache        8 ranks on 2 servers, one block-shuffled epoch, row-group cache 1 GiB vs 1 MiB
                (below one row group: nothing is kept), and 1 GiB plus one `--cache-dir` shared by
                both servers (a node-local disk tier, cold at start): storage read amplification.
4. client_rss   one rank (output numpy), 2 MiB batches, a slow step so the prefetch queue stays
                full: the rank's peak RSS, and its growth over the RSS it had before iterating,
                vs its prefetch budget (prefetch x batch bytes), for 2 budgets.
5. small        264 B samples in batches of 32: one server + Loader(output="torch") vs torchdata's
                StatefulDataLoader over the same rows memmapped (loadtest/peers.py), alternating.
6. scaling      `serve --workers W`, W = 1, 2, 4, 8 (those the CPUs allow), on a CPU-bound load
                (image.decode of 500x375 JPEGs, 16 client streams): images/s, speedup over one
                worker, efficiency (loadtest/scaling.py).
7. checkpoints  (loadtest/checkpoint_bench.py) Checkpointer vs torch.distributed.checkpoint on a local
                directory: save stall vs dcp.save, load vs dcp.load (warm server), bytes of a save
                with 10% changed, storage reads of 4 concurrent loads, follow() latency.
8. balance      (loadtest/balance_bench.py) balanced steps: packed rows and attention cost per rank,
                balance=None vs "tokens" vs "attention" on CPython's sources and a lognormal corpus,
                and the simulated data-parallel time as a ratio to None (arithmetic: no servers).

Figures only: it prints a table of ratios, writes everything as JSON and exits 0 unless something
crashed. Read /work/shared/BENCHMARKING.md (or loadtest/README.md) before quoting a number.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import balance_bench, checkpoint_bench, flight_bench, peers, scaling
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from loadtest.driver import LoadConfig, dataset_name, ensure_dataset, run_load
from loadtest.flight_server import METADATA_BYTES
from shardstream.server.local_fleet import LocalServer

__all__ = ["main"]

SECTIONS = ("dataplane", "servers", "cache", "client_rss", "small", "scaling", "checkpoints", "balance")
MIB = 1 << 20


@dataclass(frozen=True)
class Sizes:
    dataplane_mib: int
    dataplane_pairs: int
    dataplane_epochs: int
    servers_rows: int
    servers_pairs: int
    servers_duration_s: float
    cache_rows: int
    rss_duration_s: float
    small_rows: int
    small_pairs: int
    scaling_images: int
    scaling_pairs: int
    dataplane_shapes: tuple[str, ...] = tuple(flight_bench.SHAPES)  # the row shapes the data plane is measured on


# data plane: 4 epochs (2 GB) a pass, so that a pass's CPU, read in 10 ms ticks, is known within ~2-5%
# on a fast machine (2 epochs at 4 GB/s took ~0.25 s, Flight's server ~0.2 CPU-s: ~5% a tick)
FULL = Sizes(512, 5, 4, 1_000_000, 3, 6.0, 200_000, 5.0, 1_000_000, 3, 480, 3)
QUICK = Sizes(128, 5, 2, 200_000, 2, 3.0, 50_000, 3.0, 200_000, 2, 160, 2, ("vec", "tokens"))


def _spread(values: list[float]) -> dict[str, float] | None:
    return spread(values) if values else None


def _fmt(s: dict[str, float] | None, digits: int = 2) -> str:
    if s is None:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _slim(res: dict[str, Any]) -> dict[str, Any]:
    """A load-test result without its timeline (the suite keeps the figures only)."""
    return {k: v for k, v in res.items() if k != "timeline"}


def _load(cfg: LoadConfig, workdir: Path, label: str) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=workdir))
    res = run_load(cfg, workdir=run_dir)
    t = res["total"]
    log(
        f"  {label:<22} {t['samples_per_s']:>10.0f} samples/s {t['mb_per_s']:>7.1f} MB/s  "
        f"read amp {t['read_amplification'] or 0:.2f}  server CPU {t['server_cpu_s']:.1f} s  "
        f"rank CPU {t['rank_cpu_s']:.1f} s"
    )
    return _slim(res)


# --- 1 ----------------------------------------------------------------------------------------
def dataplane(sz: Sizes, workdir: Path) -> dict[str, Any]:
    """Every shape of `sz.dataplane_shapes`, each in every shuffle mode on every path."""
    del workdir
    shapes = {}
    for shape in sz.dataplane_shapes:
        log(f"-- shape {shape}: {flight_bench.SHAPES[shape][1]}")
        args = argparse.Namespace(
            shape=shape,
            mib=sz.dataplane_mib,
            pairs=sz.dataplane_pairs,
            epochs=sz.dataplane_epochs,
            batch_mib=2,
            no_loader=False,
            ceiling=True,  # the floor: Flight's batches handed over from Python with their metadata
            gather=True,  # shuffled: Flight's rows shuffled, each batch copied as it is sent
            shuffle=list(flight_bench.MODES),
        )
        res = flight_bench.run(args)
        summary = res["summary"]
        shapes[shape] = {
            # per shuffle mode: ratios doget/flight, loader/flight, loader/doget (mb_per_s, server/client
            # CPU/GB, p99 wait), targets, paths
            "modes": summary["modes"],
            "same_rows": summary["same_rows_on_every_path"],
            "config": res["config"],
            "passes": res["passes"],
        }
    return {"shapes": shapes}


# the paths of the data plane's table, in its order: the baselines first
TABLE_PATHS = (
    (flight_bench.BASELINE, "Flight from memory"),
    (flight_bench.GATHER, "Flight gathering"),
    (flight_bench.DOGET, "plain DoGet"),
    (flight_bench.LOADER, "Loader"),
)


def print_dataplane_table(d: dict[str, Any]) -> None:
    """The table: shape x shuffle x path, MB/s and server/client CPU-s/GB as median (min-max)."""
    print(f"{'shape':<7} {'shuffle':<7} {'path':<19} {'MB/s':>18} {'server CPU-s/GB':>20} {'client CPU-s/GB':>20}")
    for shape, sd in d["shapes"].items():
        for mode, md in sd["modes"].items():
            for path, label in TABLE_PATHS:
                p = md["paths"].get(path)
                if p is not None:
                    print(
                        f"{shape:<7} {mode:<7} {label:<19} {_fmt(p['mb_per_s'], 0):>18} "
                        f"{_fmt(p['server_cpu_s_per_gb']):>20} {_fmt(p['client_cpu_s_per_gb']):>20}"
                    )


# --- 2 ----------------------------------------------------------------------------------------
def servers(sz: Sizes, workdir: Path) -> dict[str, Any]:
    base = LoadConfig(
        ranks=2,
        step_ms=0.0,
        duration_s=sz.servers_duration_s,
        batch_size=4096,
        root=str(workdir / "root"),
        rows=sz.servers_rows,
        dim=64,
        shuffle="full",
    )
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for round_ in range(sz.servers_pairs):
        for m in (1, 2):
            cfg = LoadConfig(**{**base.__dict__, "servers": m, "seed": round_})
            runs[m].append(_load(cfg, workdir, f"servers={m} round {round_}"))
    ratios = [
        b["total"]["samples_per_s"] / a["total"]["samples_per_s"]
        for a, b in zip(runs[1], runs[2], strict=True)
    ]

    def per_cpu(r: dict[str, Any]) -> float:
        return r["total"]["rows"] / r["total"]["server_cpu_s"] if r["total"]["server_cpu_s"] else 0.0

    def cores(r: dict[str, Any], key: str) -> float:
        return r["total"][key] / r["window_s"]

    return {
        "ratio": _spread(ratios),
        # What one server CPU-second delivers, and how many cores servers and ranks kept busy: on a
        # machine with fewer cores than servers + ranks need, the ratio measures the machine.
        "samples_per_server_cpu_s": {str(m): _spread([per_cpu(r) for r in rs]) for m, rs in runs.items()},
        "server_cores_busy": {
            str(m): _spread([cores(r, "server_cpu_s") for r in rs]) for m, rs in runs.items()
        },
        "rank_cores_busy": {str(m): _spread([cores(r, "rank_cpu_s") for r in rs]) for m, rs in runs.items()},
        "samples_per_s": {
            str(m): _spread([r["total"]["samples_per_s"] for r in rs]) for m, rs in runs.items()
        },
        "server_cpu_s": {str(m): _spread([r["total"]["server_cpu_s"] for r in rs]) for m, rs in runs.items()},
        "rank_cpu_s": {str(m): _spread([r["total"]["rank_cpu_s"] for r in rs]) for m, rs in runs.items()},
        "runs": runs,
    }


# --- 3 ----------------------------------------------------------------------------------------
def cache(sz: Sizes, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shared = workdir / "shared-cache-dir"
    for label, mib, cache_dir in (
        ("cache", 1024, None),
        ("no_cache", 1, None),
        ("cache_shared_disk", 1024, str(shared)),
    ):
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)  # cold: the tier starts empty
        cfg = LoadConfig(
            servers=2,
            ranks=8,
            step_ms=0.0,
            duration_s=600.0,
            epochs=1,
            batch_size=256,
            root=str(workdir / "root"),
            rows=sz.cache_rows,
            dim=64,
            shuffle="block",
            cache_mib=mib,
            cache_dir=cache_dir,
        )
        out[label] = _load(cfg, workdir, f"8 ranks, {label}")
    amp = {k: out[k]["total"]["read_amplification"] for k in out}
    return {
        "read_amplification": amp,
        "ratio_no_cache_over_cache": amp["no_cache"] / amp["cache"] if amp["cache"] else None,
        "samples_per_s": {k: out[k]["total"]["samples_per_s"] for k in out},
        "exactly_once": {k: out[k]["check"]["positions_exactly_once"] for k in out},
        "runs": out,
    }


# --- 4 ----------------------------------------------------------------------------------------
def client_rss(sz: Sizes, workdir: Path) -> dict[str, Any]:
    batch_rows = 2 * MIB // (8 + 4 * 256)
    out = {}
    for prefetch in (4, 32):
        cfg = LoadConfig(
            servers=1,
            ranks=1,
            step_ms=20.0,
            duration_s=sz.rss_duration_s,
            batch_size=batch_rows,
            root=str(workdir / "root"),
            rows=batch_rows * 128,  # 256 MiB
            dim=256,
            shuffle="none",
            prefetch=prefetch,
            output="numpy",  # the SDK's own footprint (importing torch alone adds ~150 MiB of RSS)
        )
        res = _load(cfg, workdir, f"client rss prefetch {prefetch}")
        rank = res["ranks"][0]
        budget_mib = prefetch * batch_rows * (8 + 4 * 256) / MIB
        out[str(prefetch)] = {
            "prefetch_batches": prefetch,
            "budget_mib": budget_mib,
            "rss_start_mib": rank["rss_start_mib"],
            "peak_rss_mib": rank["peak_rss_mib"],
            "growth_mib": rank["peak_rss_mib"] - rank["rss_start_mib"],
            "peak_minus_budget_mib": rank["peak_rss_mib"] - budget_mib,
            "stall_fraction": rank["stall_fraction"],
        }
    return {"batch_mib": batch_rows * (8 + 4 * 256) / MIB, "by_prefetch": out}


# --- 5 ----------------------------------------------------------------------------------------
def small(sz: Sizes, workdir: Path) -> dict[str, Any]:
    cfg = LoadConfig(root=str(workdir / "root"), rows=sz.small_rows, dim=64)
    manifest, _ = ensure_dataset(cfg, cfg.root, workdir)  # type: ignore[arg-type]
    ids_path, vec_path = peers.write_memmap(cfg.root, dataset_name(cfg), workdir / "memmap")  # type: ignore[arg-type]
    ds = peers.MemmapRows(ids_path, vec_path)
    out: dict[str, Any] = {}
    with LocalServer(cfg.root) as server:  # type: ignore[arg-type]
        for shuffle in (False, True):
            runs: dict[str, list[dict[str, Any]]] = {"shardstream": [], "torchdata": []}
            for round_ in range(sz.small_pairs + 1):  # round 0: warm-up
                for name in ("shardstream", "torchdata"):
                    if name == "shardstream":
                        r = peers.fleet_pass(server.target, str(manifest.ref), 32, shuffle)
                    else:
                        r = peers.peer_pass(ds, 32, shuffle)
                    r["round"] = round_
                    runs[name].append(r)
                    log(
                        f"  small shuffle={shuffle!s:<5} {'warm-up' if round_ == 0 else f'round {round_}'} "
                        f"{name:<12} {r['samples_per_s']:>9.0f} samples/s"
                    )
            a = [r for r in runs["shardstream"] if r["round"] > 0]
            b = [r for r in runs["torchdata"] if r["round"] > 0]
            out["shuffled" if shuffle else "in_order"] = {
                "ratio": _spread(
                    [x["samples_per_s"] / y["samples_per_s"] for x, y in zip(a, b, strict=True)]
                ),
                "shardstream_samples_per_s": _spread([x["samples_per_s"] for x in a]),
                "torchdata_samples_per_s": _spread([y["samples_per_s"] for y in b]),
                "same_rows": len({x["rows"] for x in a + b}) == 1,
                "runs": runs,
            }
    return {"rows": manifest.num_rows, "row_bytes": 264, "batch_size": 32, **out}


# --- 7 ----------------------------------------------------------------------------------------
def checkpoints(sz: Sizes, workdir: Path) -> dict[str, Any]:
    args = argparse.Namespace(mib=64 if sz is QUICK else 256, tensors=20, rounds=sz.servers_pairs, readers=4)
    (workdir / "checkpoints").mkdir()
    return checkpoint_bench.run(args, workdir / "checkpoints")


# --- 8 ----------------------------------------------------------------------------------------
def balance(sz: Sizes, workdir: Path) -> dict[str, Any]:
    return balance_bench.run(
        argparse.Namespace(steps=10 if sz is QUICK else 40, seed=0, quick=sz is QUICK, rounds=3 if sz is QUICK else 5, served=True)
    )


# --- 6 ----------------------------------------------------------------------------------------
def scaling_curve(sz: Sizes, workdir: Path) -> dict[str, Any]:
    args = argparse.Namespace(
        workers=None, images=sz.scaling_images, streams=16, chunk_steps=1, pairs=sz.scaling_pairs
    )
    (workdir / "scaling").mkdir()
    return scaling.measure_scaling(args, workdir / "scaling")


# --- report -----------------------------------------------------------------------------------
def print_report(res: dict[str, Any]) -> None:
    s = res["sections"]
    print(
        f"\nshardstream benchmark suite ({'quick' if res['quick'] else 'full'}), {res['machine']['cpus']} CPUs"
    )
    print(f"{'benchmark':<58} {'ratio med (min-max)':>24}  detail")
    print("-" * 110)
    for shape, sd in s.get("dataplane", {}).get("shapes", {}).items():
        for shuffle, d in sd["modes"].items():
            mode = f"{shape}/{shuffle}"
            stored = shuffle == "none"  # held to Flight from memory; a shuffle to Flight gathering
            mbs = {k: v["mb_per_s"]["median"] for k, v in d["paths"].items()}
            cpu = {k: v["server_cpu_s_per_gb"]["median"] for k, v in d["paths"].items()}
            ccpu = {k: v["client_cpu_s_per_gb"]["median"] for k, v in d["paths"].items()}
            for path, label in (
                (flight_bench.DOGET, f"data plane {mode}, plain DoGet / Flight DoGet from memory"),
                (flight_bench.LOADER, f"data plane {mode}, Loader / Flight DoGet from memory"),
            ):
                r = d["ratios"][f"{path}/{flight_bench.BASELINE}"]
                print(
                    f"{label + ' (MB/s)':<58} {_fmt(r['mb_per_s']):>24}  {mbs[path]:.0f} vs "
                    f"{mbs[flight_bench.BASELINE]:.0f} MB/s per stream "
                    + (f"(target >= {flight_bench.TARGET_MB_PER_S})" if stored else "(no target: a shuffle's copy)")
                )
                print(
                    f"{'  server CPU s/GB':<58} {_fmt(r['server_cpu_s_per_gb']):>24}  {cpu[path]:.2f} vs "
                    f"{cpu[flight_bench.BASELINE]:.2f} "
                    + (f"(target <= {flight_bench.TARGET_SERVER_CPU})" if stored else "(no target)")
                    + f"; client CPU/GB {_fmt(r['client_cpu_s_per_gb'])}, p99 wait {_fmt(r['wait_p99_ms'])}"
                )
            build = {k: v["server_build_cpu_s_per_gb"]["median"] for k, v in d["paths"].items()}
            main = {k: v["client_main_cpu_s_per_gb"]["median"] for k, v in d["paths"].items()}
            print(
                f"{'  of the server CPU s/GB, its build threads':<58} {'':>24}  plain DoGet "
                f"{build[flight_bench.DOGET]:.3f}, Loader {build[flight_bench.LOADER]:.3f}; of the client's, "
                f"its iterating thread: plain reader {main[flight_bench.DOGET]:.3f}, Loader "
                f"{main[flight_bench.LOADER]:.3f}"
            )
            r = d["ratios"][f"{flight_bench.LOADER}/{flight_bench.DOGET}"]
            print(
                f"{'  client CPU s/GB, Loader / plain pyarrow.flight reader':<58} "
                f"{_fmt(r['client_cpu_s_per_gb']):>24}  {ccpu[flight_bench.LOADER]:.2f} vs "
                f"{ccpu[flight_bench.DOGET]:.2f} (target <= 1.1)"
            )
            floor = d["ratios"].get(f"{flight_bench.GENERATOR}/{flight_bench.BASELINE}")
            if floor is not None:  # the same batches whatever the mode: the floor of any Python data plane
                print(
                    f"{'  floor: Flight fed from Python / Flight (server CPU s/GB)':<58} "
                    f"{_fmt(floor['server_cpu_s_per_gb']):>24}  {cpu[flight_bench.GENERATOR]:.2f} vs "
                    f"{cpu[flight_bench.BASELINE]:.2f}: each message yielded with {METADATA_BYTES} B of metadata, "
                    "nothing built"
                )
            for path, label in ((flight_bench.DOGET, "plain DoGet"), (flight_bench.LOADER, "Loader")):
                r = d["ratios"].get(f"{path}/{flight_bench.GATHER}")
                if r is not None:  # shuffled: against Flight copying out the same kind of shuffle
                    print(
                        f"{f'  {label} / Flight gathering its rows (server CPU s/GB)':<58} "
                        f"{_fmt(r['server_cpu_s_per_gb']):>24}  {cpu[path]:.2f} vs "
                        f"{cpu[flight_bench.GATHER]:.2f} (target <= {flight_bench.TARGET_GATHER_SERVER_CPU}); "
                        f"MB/s {_fmt(r['mb_per_s'])} (target >= {flight_bench.TARGET_GATHER_MB_PER_S}): each "
                        "batch copied out of Flight's table as it is sent"
                    )
            for name, t in d.get("targets", {}).items():
                print(
                    f"{f'  targets, {name}':<58} {'':>24}  "
                    + ", ".join(f"{k} {'met' if ok else 'NOT met'}" for k, ok in t.items())
                )
    if "servers" in s:
        d = s["servers"]
        print(
            f"{'2 servers / 1 server (samples/s, server-bound)':<58} {_fmt(d['ratio']):>24}  "
            f"{d['samples_per_s']['2']['median']:.0f} vs {d['samples_per_s']['1']['median']:.0f} samples/s; "
            f"cores busy servers+ranks {d['server_cores_busy']['2']['median']:.2f}+"
            f"{d['rank_cores_busy']['2']['median']:.2f} vs {d['server_cores_busy']['1']['median']:.2f}+"
            f"{d['rank_cores_busy']['1']['median']:.2f} of {os.cpu_count()}"
        )
    if "cache" in s:
        d = s["cache"]
        amp = d["read_amplification"]
        print(
            f"{'8 ranks, 2 servers: read amplification no cache / cache':<58} "
            f"{d['ratio_no_cache_over_cache'] or 0:>24.2f}  cache {amp['cache']:.2f}x, no cache "
            f"{amp['no_cache']:.2f}x, cache + shared --cache-dir {amp['cache_shared_disk']:.2f}x"
        )
    if "client_rss" in s:
        for k, d in s["client_rss"]["by_prefetch"].items():
            label = f"client peak RSS, prefetch {k} x {s['client_rss']['batch_mib']:.0f} MiB"
            print(
                f"{label:<58} {d['peak_rss_mib']:>20.0f} MiB  budget {d['budget_mib']:.0f} MiB, "
                f"peak - budget {d['peak_minus_budget_mib']:.0f} MiB, growth {d['growth_mib']:.0f} MiB"
            )
    if "small" in s:
        for key in ("in_order", "shuffled"):
            d = s["small"][key]
            label = f"264 B x 32, {key.replace('_', ' ')}: fleet / StatefulDataLoader"
            print(
                f"{label:<58} {_fmt(d['ratio']):>24}  {d['shardstream_samples_per_s']['median']:.0f} vs "
                f"{d['torchdata_samples_per_s']['median']:.0f} samples/s"
            )

    if "scaling" in s:
        d = s["scaling"]
        for w in d["workers_measured"][1:]:
            k = str(w)
            print(
                f"{f'{w} workers / 1 worker (images/s, image decode)':<58} {_fmt(d['speedup'][k]):>24}  "
                f"efficiency {d['efficiency'][k]['median']:.2f}; {d['images_per_s'][k]['median']:.0f} vs "
                f"{d['images_per_s']['1']['median']:.0f} images/s; server cores busy "
                f"{d['server_cores_busy'][k]['median']:.2f} vs {d['server_cores_busy']['1']['median']:.2f}"
            )
        if d["workers_not_measured"]:
            missing = ", ".join(map(str, d["workers_not_measured"]))
            print(f"{f'workers {missing}: not measured':<58} {'-':>24}  {d['cpus']} CPUs here")
    if "checkpoints" in s:
        print(
            f"{'checkpoints (Checkpointer vs torch.distributed.checkpoint)':<58} {'-':>24}  {checkpoint_bench.summary(s['checkpoints'])}"
        )
    if "balance" in s:
        print("balanced steps (packed rows per rank; loadtest/balance_bench.py):")
        balance_bench.report(s["balance"])
    if "dataplane" in s:
        print("\ndata plane, every shape (per stream; median (min-max) over the rounds):")
        print_dataplane_table(s["dataplane"])


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    sz = QUICK if args.quick else FULL
    fns = {
        "dataplane": dataplane,
        "servers": servers,
        "cache": cache,
        "client_rss": client_rss,
        "small": small,
        "scaling": scaling_curve,
        "checkpoints": checkpoints,
        "balance": balance,
    }
    sections: dict[str, Any] = {}
    elapsed: dict[str, float] = {}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardstream-suite-") as tmp:
        for name in args.only or SECTIONS:
            log(f"== {name}")
            t0 = time.perf_counter()
            sections[name] = fns[name](sz, Path(tmp))
            elapsed[name] = time.perf_counter() - t0
            log(f"   {elapsed[name]:.0f} s")
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.suite", *sys.argv[1:]]),
        "quick": args.quick,
        "sizes": sz.__dict__,
        "versions": versions("shardstream", "grpcio", "protobuf", "uvloop", "torch", "torchdata"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "git_commit": _git("rev-parse", "HEAD"),
            "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        },
        "elapsed_s": {**elapsed, "total": time.perf_counter() - t_all},
        "sections": sections,
    }


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.suite", __doc__)
    ap.add_argument("--quick", action="store_true", help="smaller data and fewer rounds (~3 min)")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these benchmarks")
    return bench_main(
        ap,
        argv,
        run,
        json_default=results_path("suite"),
        report=print_report,
        then=lambda args, res: print(f"({res['elapsed_s']['total']:.0f} s)"),
    )


if __name__ == "__main__":
    sys.exit(main())
