"""`python -m loadtest.scale`: the rank simulator — ≥ 1,000 ranks of one job against a local fleet.

Real Arrow Flight streams from real `shardstream serve` processes, real cursor commits to a real
redis-server (append-only file, fsync every second), many ranks per process: each rank is a
`Loader` driven by a thread (loadtest/scale_ranks.py), its training step a long `time.sleep`, its
batches small — it measures the control paths (discovery, stream opens, commits, resumes,
failover), not bandwidth. The scenarios run in this order, on one job:

  cold      every rank builds its Loader and takes its first batch, all at once
  steady    --steps training steps of --step-s each (next() timed)
  commit    the same with commit(step) every --commit-every steps; the job's step must land in Redis
  restart   every Loader closed, then every rank resumes (resume="latest") from the same committed
            step at once: each must resume there, at its own first sample of that step
  failover  --steps steps during which one server is SIGKILLed (a third of the way in)
  scaleout  a server is added; every rank reopens its stream over the longer endpoint list: the
            new server must take its share of the new streams
  ckptload  a checkpoint of --ckpt-mib (256) saved through the fleet, then --ckpt-ranks (64) ranks
            load it at once, each with its own Checkpointer, every chunk verified: the load's
            latency, the bytes the servers read from the checkpoint root (once per server at
            most: their caches serve the rest) and sent, the loaded bytes' sha256

Each row: p50/p99/max latency (first batch for cold/restart/scaleout, next() for steady/failover,
the commit() call for commit), errors (exceptions out of the Loader: its own retries are not
errors), server CPU and RSS, rank processes' CPU, Redis ops/s, commands per rank and memory (INFO),
control-plane calls/s (GetDataset and the other grpcio methods) and DoGets. Figures only; the exit
status is 1 when a correctness check failed (errors, a rank without its first batch, a commit not
in Redis, a rank resumed elsewhere, a sample lost, duplicated or not the plan's, a replayed step
with other samples than the first time).

Samples, as the chaos runs check them (loadtest/scale_samples.py): every rank answers the `id`s of
every batch it took, by job step, in every scenario but ckptload; the driver checks each global step
the run took against the plan the servers compute (no sample lost, none duplicated across ranks,
each rank's the plan's), that every epoch wholly taken holds each row once (the default --steps take
several), and that the steps replayed after the restart and scaleout resumes hold the same samples
as the first time, none skipped (checks `samples_exactly_once`, `samples_replays_identical`; the
figures in the result's `samples`).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.common import bench_main, bench_parser, log, results_path, versions
from shardstream.client import CursorRecord, open_store
from shardstream.client.checkpoint import Checkpointer

from .driver import LoadConfig, dataset_name, ensure_dataset
from .scale_fleet import SERVER_COUNTERS, ScaleFleet, Snapshot, rpc_delta, server_rpcs
from .scale_samples import SampleLog

__all__ = ["SCENARIOS", "main", "run_scale"]

SCENARIOS = ("cold", "steady", "commit", "restart", "failover", "scaleout", "ckptload")
JOB = "scale-sim"
CKPT_JOB = "scale-sim-model"
CKPT_TENSORS = 16  # the checkpoint's state: this many float32 tensors of --ckpt-mib in all

LAND_TIMEOUT_S = 120.0

EXAMPLES = """examples:
  python -m loadtest.scale                                   # 1,000 ranks, 4 servers, every scenario (~4 min)
  python -m loadtest.scale --ranks 200 --servers 2 --scenarios cold commit restart
  python -m loadtest.scale --ranks 2000 --processes 8 --step-s 2 --json /tmp/scale.json
  make scale SCALE_ARGS="--ranks 500"
"""


def _lat(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    a = np.asarray(values) * 1e3
    return {
        "n": len(values),
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
    }


def _row(
    name: str, fleet: ScaleFleet, before: Snapshot, answers: list[dict[str, Any]], key: str
) -> dict[str, Any]:
    after = fleet.snapshot()
    wall = after.t - before.t
    ranks = [r for a in answers for r in a["ranks"]]
    values: list[float] = []
    for r in ranks:
        v = r.get(key)
        values.extend(v if isinstance(v, list) else [] if v is None else [v])
    rpcs = rpc_delta(before.rpcs, after.rpcs)
    control = sum(v for k, v in rpcs.items() if k != "DoGet" and k not in SERVER_COUNTERS)
    redis_cmds = after.redis_commands - before.redis_commands
    cmdstats = {
        k: v - before.redis_cmdstats.get(k, 0)
        for k, v in after.redis_cmdstats.items()
        if v - before.redis_cmdstats.get(k, 0) > 0
    }
    server_cpu = [a - b for a, b in zip(after.server_cpu_s, before.server_cpu_s + [0.0] * 8, strict=False)]
    mem = fleet.server_memory()
    up_rss = [x for x in mem["rss_mib"] if x is not None]
    up_peak = [x for x in mem["peak_rss_mib"] if x is not None]
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if "error" in r]
    return {
        "scenario": name,
        "ranks": len(ranks),
        "wall_s": wall,
        **_lat(values),
        "errors": len(errors),
        "error_samples": errors[:5],
        "failovers": sum(a.get("failovers", 0.0) for a in answers),
        "commit_failures": sum(a.get("commit_failures", 0.0) for a in answers),
        "server_cpu_s": sum(x for x in server_cpu if x > 0),
        "server_cpu_pct": 100.0 * sum(x for x in server_cpu if x > 0) / wall if wall > 0 else 0.0,
        "server_rss_mib_max": max(up_rss, default=None),
        "server_peak_rss_mib_max": max(up_peak, default=None),
        "server_rss_mib_sum": sum(up_rss),
        "rank_cpu_s": sum(a - b for a, b in zip(after.rank_cpu_s, before.rank_cpu_s, strict=True)),
        "rank_rss_mib_sum": sum(fleet.rank_rss_mib()),
        "redis_ops": redis_cmds,
        "redis_ops_per_s": redis_cmds / wall if wall > 0 else 0.0,
        "redis_ops_per_rank": redis_cmds / max(1, len(ranks)),
        "redis_commands": cmdstats,
        "redis_memory_mib": after.redis_memory_bytes / (1 << 20),
        "rpcs": rpcs,
        "control_calls": control,
        "control_calls_per_s": control / wall if wall > 0 else 0.0,
        "control_calls_per_rank": control / max(1, len(ranks)),
        "dogets": rpcs.get("DoGet", 0.0),
        # Messages the servers sent per rank: how far the streams run ahead of the steps taken.
        "messages_sent_per_rank": rpcs.get("shardstream_messages_sent_total", 0.0) / max(1, len(ranks)),
        "bytes_sent_per_rank": rpcs.get("shardstream_bytes_sent_total", 0.0) / max(1, len(ranks)),
    }


def _wait_committed(store_url: str, step: int, timeout_s: float) -> tuple[int | None, float]:
    """(the job's latest committed step once it reaches `step` or the timeout, seconds waited)."""
    t0 = time.perf_counter()
    store = open_store(store_url)
    try:
        while True:
            latest = store.latest(JOB)
            if (latest is not None and latest >= step) or time.perf_counter() - t0 > timeout_s:
                return latest, time.perf_counter() - t0
            time.sleep(0.05)
    finally:
        store.close()


def _committed_cursor(store_url: str, step: int) -> tuple[int, int]:
    """(epoch, offset) of the job's committed cursor at `step`, as rank 0 wrote it."""
    store = open_store(store_url)
    try:
        records = store.read(JOB, step)
        state = CursorRecord.from_bytes(records[0], where="scale").state
        return state.epoch, state.offset
    finally:
        store.close()


def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="shardstream-scale-")
    workdir = Path(tmp.name)
    world, batch = args.ranks, args.batch_size
    # Whole steps only (rows = world × batch × steps per epoch): every rank has a sample in every step.
    rows = world * batch * args.steps_per_epoch
    lcfg = LoadConfig(rows=rows, dim=args.dim)
    root = args.root or str(workdir / "root")
    Path(root).mkdir(parents=True, exist_ok=True)
    manifest, _ = ensure_dataset(lcfg, root, workdir)
    rows_out: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    # the Loaders' seed and shuffle (scale_ranks.py)
    samples = SampleLog(manifest, world, batch, seed=0, shuffle="block")
    sample_report: dict[str, Any] = {}
    fleet = ScaleFleet(root, workdir, args.servers)
    try:
        cfg = {
            "dataset": dataset_name(lcfg),
            "world_size": world,
            "batch_size": batch,
            "prefetch": args.prefetch,
            "max_message_bytes": args.max_message_bytes,
            "timeout_s": args.timeout_s,
            "nice": args.nice,
            "job": JOB,
            "store": fleet.redis.url,
        }
        log(f"scale: {world} ranks in {args.processes} processes, {args.servers} servers, {rows} rows")
        t0 = time.perf_counter()
        fleet.start_ranks(args.processes, cfg)
        checks["rank_processes_start_s"] = time.perf_counter() - t0
        want = set(args.scenarios)
        steps = {"op": "steps", "steps": args.steps, "step_s": args.step_s, "commit_every": 0}

        def phase(
            name: str, cmd: dict[str, Any], key: str, during: Any = None
        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            fleet.reset_peaks()
            before = fleet.snapshot()
            log(f"scale: {name} …")
            answers = fleet.command(cmd, during)
            row = _row(name, fleet, before, answers, key)
            row["answer_kib"] = sum(w.answer_bytes for w in fleet.workers) / 1024
            samples.add(answers)
            log(
                f"scale: {name}: p50 {row['p50_ms'] or 0:.1f} ms, p99 {row['p99_ms'] or 0:.1f} ms, "
                f"max {row['max_ms'] or 0:.1f} ms, {row['errors']} errors"
            )
            if name in want:
                rows_out.append(row)
            return row, answers

        idle = fleet.server_memory()["rss_mib"]
        cold, _ = phase("cold", {"op": "open", "endpoints": fleet.endpoints(), "resume": None}, "latency_s")
        idle_sum = sum(x for x in idle if x is not None)
        cold["server_rss_mib_idle_sum"] = idle_sum
        # Memory per open stream: what the servers grew by with every rank's stream open, per stream.
        cold["server_mib_per_stream"] = (cold["server_rss_mib_sum"] - idle_sum) / world
        checks["every_rank_first_batch"] = cold["n"] == world and cold["errors"] == 0
        if "steady" in want:
            phase("steady", steps, "waits_s")
        if want & {"commit", "restart"}:
            k = args.commit_every
            n = args.steps if "commit" in want else k  # restart alone: just enough steps for one commit
            row, answers = phase("commit", {**steps, "steps": n, "commit_every": k}, "commits_s")
            step = min(r.get("step", 0) for a in answers for r in a["ranks"])
            expect = step - step % k
            latest, waited = _wait_committed(
                fleet.redis.url, expect, LAND_TIMEOUT_S if checks["every_rank_first_batch"] else 2.0
            )
            row["committed_step"], row["commit_land_s"] = latest, waited
            checks["commits_in_redis"] = latest == expect
        latest = None
        if "restart" in want:
            fleet.command({"op": "close"})  # every rank's pending commit flushed, Loaders gone
            latest, _ = _wait_committed(
                fleet.redis.url, 0, 120.0 if checks["every_rank_first_batch"] else 2.0
            )
        if "restart" in want and latest is None:  # no step committed by every rank (some never started)
            log("scale: no committed step: the restart storm has nothing to resume from")
            checks["every_rank_resumed"] = False
        elif "restart" in want:
            assert latest is not None
            epoch, offset = _committed_cursor(fleet.redis.url, latest)
            row, answers = phase(
                "restart", {"op": "open", "endpoints": fleet.endpoints(), "resume": "latest"}, "latency_s"
            )
            checks["restart_step"] = latest
            checks["every_rank_resumed"] = row["n"] == world and row["errors"] == 0
            checks["resumed_at_committed"] = all(
                r.get("resumed_from") == latest
                and (r.get("epoch"), r.get("position")) == (epoch, offset + r["rank"] * batch)
                for a in answers
                for r in a["ranks"]
            )
        if "failover" in want and args.servers >= 2:

            def kill() -> None:
                time.sleep(args.step_s * args.steps / 3)
                log("scale: SIGKILL server 0")
                fleet.kill_server(0)

            phase("failover", steps, "waits_s", during=kill)
            fleet.restart_server(0)
        if "scaleout" in want:
            before_n = len(fleet.servers)
            new = fleet.add_server()
            row, _ = phase(
                "scaleout", {"op": "open", "endpoints": fleet.endpoints(), "resume": "latest"}, "latency_s"
            )
            got = server_rpcs(new).get("DoGet", 0.0)
            row["new_server_dogets"] = got
            row["new_server_share"] = got / row["dogets"] if row["dogets"] else 0.0
            checks["new_server_takes_streams"] = got >= world // (before_n + 1) // 2
        if "ckptload" in want:
            row, ok = _checkpoint_fanout(args, fleet, phase)
            checks["checkpoint_loaded_intact"] = ok and row["n"] == min(args.ckpt_ranks, world) and row["errors"] == 0
            checks["checkpoint_read_once_per_server"] = row["ckpt_storage_read_mib"] <= row["ckpt_mib"] * len(fleet.servers) + 1
        judged = samples.judge()
        sample_report = judged.as_dict()
        log(
            f"scale: samples: {judged.steps} steps, {judged.samples} samples ({judged.replayed} batches "
            f"replayed), {judged.lost} lost, {judged.duplicated} duplicated, {judged.wrong} wrong, "
            f"{judged.whole_epochs} whole epochs, {judged.replay_mismatches} replays differing"
        )
        checks["samples_exactly_once"] = judged.exactly_once
        checks["samples_replays_identical"] = judged.replays_identical
        checks["errors"] = sum(r["errors"] for r in rows_out)
    finally:
        fleet.close()
        tmp.cleanup()
    return {
        "benchmark": "scale",
        "config": {**vars(args), "json": str(args.json), "rows": rows},
        "versions": versions("grpcio", "redis"),
        "scenarios": rows_out,
        "samples": sample_report,
        "checks": checks,
    }


def _checkpoint_fanout(args: argparse.Namespace, fleet: ScaleFleet, phase: Any) -> tuple[dict[str, Any], bool]:
    """Save one checkpoint of --ckpt-mib through the fleet, then let --ckpt-ranks ranks load it at once."""
    rng = np.random.default_rng(0)
    n = args.ckpt_mib * (1 << 20) // 4 // CKPT_TENSORS
    state = {f"layer{i:02d}": rng.standard_normal(n, dtype=np.float32) for i in range(CKPT_TENSORS)}
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(state[name].tobytes())
    log(f"scale: saving a {args.ckpt_mib} MiB checkpoint …")
    t0 = time.perf_counter()
    with Checkpointer(fleet.endpoints(), job=CKPT_JOB, rank=0, world_size=1) as ck:
        ck.save(1, state).result(timeout=600)
    save_s = time.perf_counter() - t0
    tensors = {name: [list(a.shape), str(a.dtype)] for name, a in state.items()}
    del state
    cmd = {
        "op": "ckptload",
        "endpoints": fleet.endpoints(),
        "job": CKPT_JOB,
        "step": 1,
        "ranks": args.ckpt_ranks,
        "tensors": tensors,
        "digest": digest.hexdigest(),
    }
    row, answers = phase("ckptload", cmd, "load_s")
    mib = 1 << 20
    row["ranks"] = row["n"]  # the ranks that loaded (the others of the job stood by)
    row["ckpt_mib"] = args.ckpt_mib
    row["ckpt_save_s"] = save_s
    row["ckpt_storage_read_mib"] = row["rpcs"].get("shardstream_checkpoint_storage_read_bytes_total", 0.0) / mib
    row["ckpt_served_mib"] = row["rpcs"].get("shardstream_checkpoint_served_bytes_total", 0.0) / mib
    row["ckpt_load_mb_per_s"] = row["ckpt_served_mib"] * mib / 1e6 / row["wall_s"] if row["wall_s"] else 0.0
    log(
        f"scale: ckptload: saved in {save_s:.1f} s; {row['ranks']} ranks read {row['ckpt_served_mib']:.0f} MiB "
        f"({row['ckpt_load_mb_per_s']:.0f} MB/s), the servers read {row['ckpt_storage_read_mib']:.0f} MiB from storage"
    )
    return row, all(a.get("content_ok", False) for a in answers)


def failed(result: dict[str, Any]) -> bool:
    return any(v is False for v in result["checks"].values()) or bool(result["checks"].get("errors"))


def report(result: dict[str, Any]) -> None:
    print(table(result["scenarios"]))
    for r in result["scenarios"]:
        if r["scenario"] == "ckptload":
            print(
                f"ckptload: {r['ranks']} ranks loaded a {r['ckpt_mib']} MiB checkpoint (saved in {r['ckpt_save_s']:.1f} s): "
                f"{r['ckpt_served_mib']:.0f} MiB sent ({r['ckpt_load_mb_per_s']:.0f} MB/s), "
                f"{r['ckpt_storage_read_mib']:.0f} MiB read from the checkpoint root"
            )
    s = result.get("samples") or {}
    if s:
        print(
            f"samples: {s['steps']} global steps, {s['samples']} samples taken ({s['replayed']} batches replayed "
            f"after resumes), {s['lost']} lost, {s['duplicated']} duplicated, {s['wrong']} not the plan's, "
            f"{s['whole_epochs']} whole epochs each row once: {s['epochs_exactly_once']}, "
            f"{s['replay_mismatches']} replays differing, {s['gaps']} ranks with skipped steps"
        )
        for p in s["problems"]:
            print("  ", p)
    print("checks:", ", ".join(f"{k}={v}" for k, v in result["checks"].items()))


def table(rows: list[dict[str, Any]]) -> str:
    """The scenarios as a Markdown table (loadtest/README.md's)."""

    def f(x: float | None, fmt: str = ".0f") -> str:
        return "—" if x is None else format(x, fmt)

    head = (
        "| scenario | ranks | latency p50 / p99 / max ms | errors | failovers | server CPU % (sum) | "
        "server RSS MiB (max) | Redis ops/s | Redis ops/rank | Redis MiB | control calls/s | control calls/rank |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['ranks']} | {f(r['p50_ms'], '.1f')} / {f(r['p99_ms'], '.1f')} / "
            f"{f(r['max_ms'], '.1f')} | {r['errors']} | {r['failovers']:.0f} | {f(r['server_cpu_pct'])} | "
            f"{f(r['server_rss_mib_max'])} | {f(r['redis_ops_per_s'])} | {f(r['redis_ops_per_rank'], '.1f')} | "
            f"{f(r['redis_memory_mib'], '.1f')} | {f(r['control_calls_per_s'])} | {f(r['control_calls_per_rank'], '.2f')} |"
        )
    return "\n".join(lines)


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("ranks", "servers", "processes", "batch_size", "steps", "commit_every", "prefetch", "dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.step_s < 0:
        parser.error(f"--step-s must be >= 0, got {args.step_s}")
    bad = [s for s in args.scenarios if s not in SCENARIOS]
    if bad:
        parser.error(f"unknown scenario {bad[0]!r}: the scenarios are {', '.join(SCENARIOS)}")
    if "failover" in args.scenarios and args.servers < 2:
        parser.error("the failover scenario needs --servers >= 2")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("loadtest.scale", __doc__ or "", whole_doc=True, epilog=EXAMPLES)
    parser.add_argument(
        "--ranks", type=int, default=1000, help="simulated ranks: the job's world size (1000)"
    )
    parser.add_argument("--servers", type=int, default=4, help="shardstream serve processes (4)")
    parser.add_argument("--processes", type=int, default=4, help="rank processes the ranks are dealt to (4)")
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=list(SCENARIOS),
        metavar="NAME",
        help=f"which to report, run in the fixed order ({' '.join(SCENARIOS)})",
    )
    parser.add_argument("--batch-size", type=int, default=4, help="samples per rank per step (4)")
    parser.add_argument(
        "--dim", type=int, default=1024, help="float32 values per sample (1024: 4 KiB rows, 16 KiB a step)"
    )
    parser.add_argument("--steps-per-epoch", type=int, default=5, help="the generated dataset's steps (5)")
    parser.add_argument("--step-s", type=float, default=2.0, help="simulated training step, seconds (2.0)")
    parser.add_argument(
        "--steps", type=int, default=10, help="steps of the steady, commit and failover phases (10)"
    )
    parser.add_argument("--commit-every", type=int, default=5, help="commit every K steps (5)")
    parser.add_argument("--prefetch", type=int, default=2, help="each Loader's prefetch depth (2)")
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=1,
        help="the Loaders' message target (1: one step a message, the most messages per byte)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=10.0,
        help="each Loader's timeout_s: finding a server, a stream's retry budget (10, the Loader's default)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=10,
        help="niceness of the rank processes (10): they stand for other hosts, the fleet gets the CPU first",
    )
    parser.add_argument("--root", help="dataset root to reuse (default: a temporary one)")
    parser.add_argument("--ckpt-ranks", type=int, default=64, help="ranks that load the checkpoint at once (64)")
    parser.add_argument("--ckpt-mib", type=int, default=256, help="the checkpoint's size, MiB (256)")
    return bench_main(
        parser,
        argv,
        run_scale,
        json_default=results_path("scale"),
        report=report,
        check=_check,
        failed=failed,
    )


if __name__ == "__main__":
    sys.exit(main())
