"""Schedule benchmark: the cost of a schedule lookup at job position 10^10 with 100 phases, as a ratio
to the same lookup without a schedule, measured in the same run.

    python -m loadtest.schedule_bench [--phases 100] [--batch 1024] [--pairs 7] [--json PATH]

Four lookups, each the work a server or a Loader does per Read request or per message:

- step: where a step is — the global and rank ranges of a step of an epoch's layout from a cursor at
  job position 10^10 (an epoch of 10^11 samples, 100 batch-size phases and 100 skip ranges over
  it), vs a plain StepLayout (per step: a server's message, a Loader's cursor);
- layout: building that layout (once per Read request and per epoch of a Loader): ScheduledLayout
  cuts the rest of the epoch into O(phases + ranges) segments, StepLayout is four integers;
- mixture: position -> (source, source epoch, source position) for `--batch` positions at stream
  position 10^10 through 100 mixture phases (MixtureSchedule.locate), vs one MixturePlan;
- skip: `step_position` — where global step t starts, t the step at 10^10, from the job's start
  (what turns skip_steps into positions, once per Loader), in absolute time: it has no plain twin.

Ratios are medians of alternating A/B timings (each the median of `--repeats` calls); nothing
here depends on the machine beyond its speed, and no test asserts on the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from loadtest.common import bench_main, bench_parser, results_path
from shardstream.order.curriculum import MixtureSchedule
from shardstream.order.mixture import MixturePlan, SourceInfo
from shardstream.order.read_order import StepLayout
from shardstream.order.schedule import Schedule
from shardstream.order.scheduled_steps import ScheduledLayout, step_position

AT = 10**10  # the job position looked up
EPOCH = 10**11  # samples per epoch (one epoch holds the whole schedule)
WORLD = 64


def timed(fn: Callable[[], Any], repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def ab(a: Callable[[], Any], b: Callable[[], Any], pairs: int, repeats: int) -> dict[str, float]:
    """Alternating timings of a (baseline) and b; b's cost as a ratio to a's."""
    a(), b()  # warm-up
    ta, tb, ratios = [], [], []
    for _ in range(pairs):
        x, y = timed(a, repeats), timed(b, repeats)
        ta.append(x)
        tb.append(y)
        ratios.append(y / x)
    return {
        "plain_seconds": statistics.median(ta),
        "scheduled_seconds": statistics.median(tb),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.phases
    gap = 2 * AT // n  # phases spread over [0, 2·10^10): the lookup is in the middle of the schedule
    sched = Schedule(
        tuple((i * gap, 16 + 16 * (i % 4)) for i in range(n)),
        tuple((i * gap + gap // 2, i * gap + gap // 2 + 1000) for i in range(n)),
    )
    plain_batch = 32

    def layout_plain() -> Any:
        return StepLayout(EPOCH, AT, WORLD, plain_batch).num_steps

    def layout_scheduled() -> Any:
        return ScheduledLayout(EPOCH, AT, WORLD, sched).num_steps

    plain, scheduled = StepLayout(EPOCH, AT, WORLD, plain_batch), ScheduledLayout(EPOCH, AT, WORLD, sched)
    t = scheduled.num_steps // 2

    def step_plain() -> Any:
        return plain.global_range(t), plain.rank_range(t, 5)

    def step_scheduled() -> Any:
        return scheduled.global_range(t), scheduled.rank_range(t, 5)

    sources = [SourceInfo(f"s{i}@1", f"fp{i}", 10**9 + 7 * i, 1.0) for i in range(3)]
    weights = [[1 + (i + j) % 3 for j in range(3)] for i in range(n)]
    mix_plain = MixturePlan([SourceInfo(s.ref, s.fingerprint, s.num_rows, 1.0) for s in sources], 0)
    mix_sched = MixtureSchedule(sources, [(i * gap, w) for i, w in enumerate(weights)], 0)
    positions = np.arange(AT, AT + args.batch, dtype=np.int64)
    step_at = sum(
        -(-min(AT, e) - s) // (WORLD * b) if min(AT, e) > s else 0
        for (s, b), e in zip(sched.batch, [p for p, _ in sched.batch[1:]] + [AT], strict=True)
    )

    def skip_lookup() -> int:
        return step_position(step_at // 2, num_rows=EPOCH, world_size=WORLD, schedule=sched)

    return {
        "at": AT,
        "phases": n,
        "skip_ranges": len(sched.skips),
        "world_size": WORLD,
        "batch": args.batch,
        "segments": len(scheduled._segments),
        "layout": ab(layout_plain, layout_scheduled, args.pairs, args.repeats),
        "step": ab(step_plain, step_scheduled, args.pairs, args.repeats),
        "mixture": ab(
            lambda: mix_plain.locate(0, positions),
            lambda: mix_sched.locate(0, positions),
            args.pairs,
            args.repeats,
        ),
        "skip_seconds": timed(skip_lookup, args.repeats),
    }


def print_report(res: dict[str, Any]) -> None:
    print(
        f"lookup at job position {res['at']:.0e}: {res['phases']} phases, {res['skip_ranges']} skip ranges, "
        f"world size {res['world_size']}"
    )
    print(f"{'lookup':28s} {'plain µs':>10s} {'scheduled µs':>13s} {'ratio (min-max)':>18s}")
    for key, what in (
        ("step", "step -> global, rank range"),
        ("mixture", f"mixture, {res['batch']} positions"),
        ("layout", f"layout ({res['segments']} segments)"),
    ):
        r = res[key]
        print(
            f"{what:28s} {r['plain_seconds'] * 1e6:10.1f} {r['scheduled_seconds'] * 1e6:13.1f} "
            f"{r['ratio']:7.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        )
    print(f"{'step -> position (skip)':28s} {'-':>10s} {res['skip_seconds'] * 1e6:13.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.schedule_bench", __doc__, whole_doc=True)
    ap.add_argument("--phases", type=int, default=100, help="batch-size and mixture phases (default 100)")
    ap.add_argument("--batch", type=int, default=1024, help="positions per mixture lookup (default 1024)")
    ap.add_argument("--pairs", type=int, default=7, help="alternating A/B rounds (default 7)")
    ap.add_argument("--repeats", type=int, default=20, help="calls timed per round (default 20)")
    return bench_main(ap, argv, run, json_default=results_path("schedule_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
