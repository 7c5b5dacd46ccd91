"""`serve --workers auto` on a slow transform: the trainers' stall, the worker count and every move, over time.

    python -m loadtest.autoscale_bench [--ranks 8] [--max-workers 2] [--interval-s 1] [--steady-s 60] [--half-s S]
                                       [--nice 10]

One dataset of 256x256 noise PNGs (~2 ms each to decode: `image.decode` to 64x64 is the cost), one
`shardstream serve --workers auto --max-workers M --transform-threads 1 --pin-workers` (a worker is one core's
worth). Phases, each a fresh set of `--ranks` Loaders (threads, report_interval_s 1 s, simulated
compute `step_s` a step; each rank thread, and the Loader threads it starts, at niceness `--nice`:
they stand for trainers on other hosts, so the workers get their cores first — at 0 the 8 Loaders
take a share of the two cores the two workers are pinned to, and two workers deliver ~1.5 x one
worker's calibrated capacity, the very demand of the steady phase):

1. calibrate: one worker's capacity C (samples/s) with ranks that never compute (they stall);
   then step_s is chosen so that the ranks ask 1.5 x C: ~33 % stall on one worker, none on two;
2. grow: the paced ranks on the auto server (one worker at first) until it has M workers;
3. steady: the same ranks restarted (as a job restarts); once settled (3 samples in a row under 2 %
   stall with the ranks spread over the workers: the time it took is printed), for --steady-s: the
   stall, the moves (none is a flap-free run) and the rebalance rounds (running streams handed to a
   less busy worker);
4. half leave: half the ranks stop; until the server is back at one worker (or --half-s; by default
   --steady-s, at least 120).

Printed: the stall (the fleet's, as `fleet recommend` computes it, sampled every second) per phase,
the moves with their reasons and times, and samples delivered exactly once per rank (each rank's
sequence is a prefix of its first-phase order). Figures only; tests/test_autoscale_workers.py
asserts the behaviour.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.cli.fleet_command import parse_metrics, recommend
from shardstream.client import Loader
from shardstream.server.local_fleet import LocalServer
from shardstream.server.writing.ingest import IngestOptions, ingest

from .common import bench_main, bench_parser, results_path

BATCH = 4
# Long epochs, as in training: a rank's epoch (2,048 samples at 8 ranks) lasts half a minute, so its
# stream is open all along (a server counts open streams to spread them over its workers; an epoch
# of a second or two ends server-side while the rank still reads it, and looks like no load)
ROWS = 16 * 1024
ROW_GROUP_ROWS = 256
WARM, MEASURED = 1024, 4096  # samples before and during the calibration
DECODE = [{"op": "image.decode", "column": "image", "size": [64, 64]}]


def _dataset(root: Path, rows: int) -> None:
    from PIL import Image

    pngs = []
    for seed in range(16):
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(buf, format="PNG")
        pngs.append(buf.getvalue())
    table = pa.table({"idx": np.arange(rows, dtype=np.int64), "image": pa.array([pngs[i % 16] for i in range(rows)], pa.binary())})
    src = root.parent / "slow.parquet"
    # 16 distinct images: dictionary-encoded row groups keep 16,384 rows at ~215 MB on disk
    pq.write_table(table, src, row_group_size=ROW_GROUP_ROWS)
    ingest(src, "slow", root, IngestOptions(row_group_rows=ROW_GROUP_ROWS, shard_rows=16 * ROW_GROUP_ROWS, progress=False))


class _Ranks:
    """`n` training loops in threads: take a batch, compute `step_s`, until stopped."""

    def __init__(self, server: LocalServer, n: int, job: str, step_s: float, nice: int = 0) -> None:
        self.got: list[list[int]] = [[] for _ in range(n)]
        self.stops = [threading.Event() for _ in range(n)]
        self.errors: list[BaseException] = []
        self.nice = nice
        self.threads = [threading.Thread(target=self._run, args=(server, r, n, job, step_s), daemon=True) for r in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, server: LocalServer, rank: int, n: int, job: str, step_s: float) -> None:
        if self.nice:  # this thread's own (Linux: per thread), inherited by the threads it starts
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
        try:
            with Loader([server.target], "slow@1", batch_size=BATCH, rank=rank, world_size=n, shuffle=False, epochs=None,
                        job=job, cursor_store="memory://", report_interval_s=1.0, output="arrow", columns=["idx", "image"],
                        transforms=DECODE) as loader:  # fmt: skip
                for batch in loader:
                    self.got[rank].extend(batch.column("idx").to_pylist())
                    if self.stops[rank].wait(step_s):
                        return
        except BaseException as exc:
            self.errors.append(exc)

    def stop(self, ranks: range | None = None) -> None:
        for r in ranks if ranks is not None else range(len(self.threads)):
            self.stops[r].set()
            self.threads[r].join(timeout=60)

    def samples(self) -> int:
        return sum(len(g) for g in self.got)


def _sample(server: LocalServer) -> tuple[float, int, dict[str, float]]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    r = recommend([parse_metrics(text)])
    moves = {}
    for line in text.splitlines():
        if line.startswith("shardstream_autoscale_decisions_total{"):
            key, _, value = line.rpartition(" ")
            moves[key.split('"')[1]] = float(value)
        elif line.startswith("shardstream_rebalance_rounds_total "):
            moves["rebalance_rounds"] = float(line.rpartition(" ")[2])
        elif line.startswith(("shardstream_worker_streams{", "shardstream_worker_ranks{")):  # by worker slot
            key, _, value = line.rpartition(" ")
            what = "streams_" if line.startswith("shardstream_worker_streams{") else "ranks_"
            moves[what + key.split('"')[1]] = float(value)
    return r.stall, len(server.info()["workers"]), moves


def _watch(server: LocalServer, until: Any, limit_s: float, log: list[dict[str, Any]], phase: str) -> list[float]:
    """Sample the stall and the count every second until `until()` or `limit_s`; the stalls seen."""
    stalls, t0 = [], time.monotonic()
    while time.monotonic() - t0 < limit_s and not until():
        stall, workers, moves = _sample(server)
        stalls.append(stall)
        log.append({"phase": phase, "t_s": round(time.monotonic() - t0, 1), "stall": round(stall, 3), "workers": workers, "moves": moves})
        time.sleep(1.0)
    return stalls


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = ROWS
    result: dict[str, Any] = {"ranks": args.ranks, "max_workers": args.max_workers, "interval_s": args.interval_s, "nice": args.nice}
    log: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="autoscale-bench-") as tmp:
        root = Path(tmp) / "root"
        _dataset(root, rows)
        # each worker pinned to a CPU: a worker is one core's worth (unpinned, one worker's build
        # threads already spread over every core, and a second adds nothing: serving/cpus.py)
        common = ("--transform-threads", "1", "--grace", "5", "--pin-workers")
        # 1. one worker's capacity, trainers that never compute
        with LocalServer(root, metrics=True, workers=1, extra_args=common) as one:
            ranks = _Ranks(one, args.ranks, "calibrate", 0.0, args.nice)
            while ranks.samples() < WARM:
                time.sleep(0.2)
            n0, t0 = ranks.samples(), time.monotonic()
            while ranks.samples() < n0 + MEASURED:
                time.sleep(0.2)
            capacity = (ranks.samples() - n0) / (time.monotonic() - t0)
            ranks.stop()
        step_s = args.ranks * BATCH / (1.5 * capacity)
        result |= {"capacity_samples_per_s": round(capacity, 1), "step_s": round(step_s, 4)}
        extra = (*common, "--max-workers", str(args.max_workers), "--autoscale-interval", str(args.interval_s))
        log_path = Path(args.server_log) if args.server_log else None
        with LocalServer(root, metrics=True, workers="auto", extra_args=extra, log_path=log_path) as auto:
            t_start = time.monotonic()
            ranks = _Ranks(auto, args.ranks, "bench", step_s, args.nice)  # 2. grow
            grow = _watch(auto, lambda: len(auto.info()["workers"]) >= args.max_workers, 300, log, "grow")
            result["grow"] = {"s": round(time.monotonic() - t_start, 1), "stall_mean": _mean(grow), "stall_max": _max(grow)}
            reference = [list(g) for g in ranks.got]
            ranks.stop()
            ranks = _Ranks(auto, args.ranks, "bench", step_s, args.nice)  # 3. steady, restarted
            # settled: the last 3 samples under 2 % stall, with the ranks spread over the workers (a
            # restarted job's ranks first land where the old job's dying streams are not: see README)
            t_settle = time.monotonic()
            _watch(auto, lambda: _settled(log, args.max_workers), 120, log, "settle")
            result["settle_s"] = round(time.monotonic() - t_settle, 1)
            before = _sample(auto)[2]
            steady = _watch(auto, lambda: False, args.steady_s, log, "steady")
            after = _sample(auto)[2]
            result["steady"] = {"s": args.steady_s, "stall_mean": _mean(steady), "stall_p90": _p90(steady),
                                "moves": _moves(after) - _moves(before), "workers": len(auto.info()["workers"]),
                                "rebalance_rounds": after.get("rebalance_rounds", 0) - before.get("rebalance_rounds", 0)}  # fmt: skip
            half = range(args.ranks // 2, args.ranks)  # 4. half leave
            ranks.stop(half)
            t_half = time.monotonic()
            half_s = args.half_s if args.half_s is not None else max(args.steady_s, 120)
            left = _watch(auto, lambda: len(auto.info()["workers"]) == 1, half_s, log, "half")
            result["half_leave"] = {"s_to_one_worker": round(time.monotonic() - t_half, 1), "stall_mean": _mean(left),
                                    "workers": len(auto.info()["workers"])}  # fmt: skip
            ranks.stop()
            result["moves"] = _sample(auto)[2]
            result["errors"] = [repr(e) for e in ranks.errors]
            result["in_order_once"] = all(g[: len(ref)] == ref[: len(g)] for g, ref in zip(ranks.got, reference, strict=True))
    result["log"] = log
    return result


def _settled(log: list[dict[str, Any]], workers: int) -> bool:
    last = [e for e in log[-3:] if e["phase"] == "settle"]
    if len(last) < 3 or any(e["stall"] > 0.02 or e["workers"] < workers for e in last):
        return False
    ranks = [v for k, v in last[-1]["moves"].items() if k.startswith("ranks_")]
    return len(ranks) == workers and max(ranks) - min(ranks) <= 1


def _moves(counts: dict[str, float]) -> float:
    """Worker count changes (autoscale decisions), not rebalance rounds or streams."""
    return sum(v for k, v in counts.items() if k != "rebalance_rounds" and not k.startswith(("streams_", "ranks_")))


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 3) if xs else None


def _max(xs: list[float]) -> float | None:
    return round(max(xs), 3) if xs else None


def _p90(xs: list[float]) -> float | None:
    return round(sorted(xs)[int(0.9 * (len(xs) - 1))], 3) if xs else None


def report(result: dict[str, Any]) -> None:
    print(f"one worker's capacity {result['capacity_samples_per_s']} samples/s; ranks step every {result['step_s']} s (1.5 x capacity)")
    print(f"  restarted job settled (3 s under 2 % stall, ranks spread) in {result.get('settle_s')} s")
    for phase in ("grow", "steady", "half_leave"):
        print(f"  {phase:10s} {result[phase]}")
    print(f"  moves {result['moves']}; errors {result['errors'] or 0}; every sample once, in order: {result['in_order_once']}")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("loadtest.autoscale_bench", __doc__ or "")
    parser.add_argument("--ranks", type=int, default=8, help="simulated ranks (8)")
    parser.add_argument("--max-workers", type=int, default=2, help="serve --max-workers (2)")
    parser.add_argument("--interval-s", type=float, default=1.0, help="serve --autoscale-interval (1 s)")
    parser.add_argument("--server-log", metavar="PATH", help="the auto-sized server's log (stream.start/end lines: every move)")
    parser.add_argument("--steady-s", type=float, default=60.0, help="seconds of the steady phase (60; the issue's is 600)")
    parser.add_argument("--half-s", type=float, help="the most seconds to wait for the shrink after half leave (--steady-s, at least 120)")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the rank threads: trainers on other hosts (10; 0: as the workers)")
    return bench_main(parser, argv, run, json_default=results_path("autoscale_bench"), report=report, failed=lambda r: not r["in_order_once"] or bool(r["errors"]))


if __name__ == "__main__":
    raise SystemExit(main())
