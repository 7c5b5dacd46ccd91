"""Read-plan benchmark: lookup cost vs position, positions resolved per second, plan memory.

    python -m loadtest.plan_bench [--json PATH]

An epoch of 10^10 samples over 10^5 shards (10 row groups of 10^4 rows each): the cost of
resolving a batch of positions at offset 0 vs near 10^10 (the ratio should be ~1: lookups are
O(1) in the position), throughput in positions/s per shuffle mode, and the memory an epoch's
plan holds (tracemalloc of building it). Ratios come from alternating runs in one process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from loadtest.common import bench_main, bench_parser, results_path
from shardstream.order.read_order import EpochOrder, RowLocator, ShuffleSpec

SHARDS = 100_000
GROUPS_PER_SHARD = 10
ROWS_PER_GROUP = 10_000
N = SHARDS * GROUPS_PER_SHARD * ROWS_PER_GROUP  # 10^10


def time_lookup(order: EpochOrder, loc: RowLocator, start: int, count: int, repeats: int) -> float:
    positions = np.arange(start, start + count, dtype=np.int64)
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loc.locate(order.rows(positions))
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tracemalloc.start()
    loc = RowLocator([[ROWS_PER_GROUP] * GROUPS_PER_SHARD] * SHARDS)
    locator_bytes = tracemalloc.get_traced_memory()[0]
    results: dict[str, dict[str, float]] = {}
    for mode in ("none", "full", "block"):
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        order = EpochOrder("bench", loc.block_sizes, 0, 3, ShuffleSpec(mode, 16))
        build_s = time.perf_counter() - t0
        plan_bytes = tracemalloc.get_traced_memory()[1] - before
        time_lookup(order, loc, 0, args.batch, 2)  # warm-up
        ratios, at0, atend = [], [], []
        for _ in range(args.pairs):
            a = time_lookup(order, loc, 0, args.batch, 5)
            b = time_lookup(order, loc, N - args.batch, args.batch, 5)
            at0.append(a)
            atend.append(b)
            ratios.append(b / a)
        results[mode] = {
            "build_seconds": build_s,
            "plan_peak_bytes": plan_bytes,
            "lookup_seconds_at_0": statistics.median(at0),
            "lookup_seconds_at_1e10": statistics.median(atend),
            "ratio_1e10_vs_0": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "positions_per_second": args.batch / statistics.median(at0 + atend),
        }
    tracemalloc.stop()
    return {"n": N, "shards": SHARDS, "batch": args.batch, "locator_bytes": locator_bytes, "modes": results}


def print_report(res: dict[str, Any]) -> None:
    print(
        f"epoch of {res['n']:.0e} samples, {res['shards']} shards x {GROUPS_PER_SHARD} row groups; batch {res['batch']} positions"
    )
    print(f"row locator: {res['locator_bytes'] / 2**20:.1f} MiB")
    print(
        f"{'mode':6s} {'build s':>8s} {'plan MiB':>9s} {'µs/batch@0':>11s} {'µs/batch@1e10':>14s} {'ratio (min-max)':>20s} {'positions/s':>12s}"
    )
    for mode, r in res["modes"].items():
        print(
            f"{mode:6s} {r['build_seconds']:8.3f} {r['plan_peak_bytes'] / 2**20:9.1f} {r['lookup_seconds_at_0'] * 1e6:11.0f} "
            f"{r['lookup_seconds_at_1e10'] * 1e6:14.0f} {r['ratio_1e10_vs_0']:7.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
            f" {r['positions_per_second']:12.3g}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.plan_bench", __doc__, whole_doc=True)
    ap.add_argument("--batch", type=int, default=4096, help="positions per lookup (default 4096)")
    ap.add_argument("--pairs", type=int, default=5)
    return bench_main(ap, argv, run, json_default=results_path("plan_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
