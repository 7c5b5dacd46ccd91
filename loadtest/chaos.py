"""`make chaos`: every fault against real processes, and what the fleet survived.

    python -m loadtest.chaos [--only FAULT ...] [--list] [--small] [--scale F] [--rank-kills N]
                             [--kill-every-s S] [--grace-s S] [--run-s S] [--step-ms MS]
                             [--workdir DIR] [--md PATH] [--json PATH]

Faults (each a row; loadtest/chaos_faults.py and chaos_storage.py say exactly what they do):

    kill9           kill -9 one of 3 servers every 5 s (restarted on its port) for 2 epochs, 4 ranks
    rolling         every server in turn SIGTERMed (drain, --grace) and restarted, mid-epoch
    rank-kills      a trainer rank SIGKILLed at a random step 50 times, the job resumed from the store
    rank-kills-late ... with the rank not killed starting late (after its peer's first step)
    resize-*        a job resumed 8 -> 4 -> 16 ranks: a dataset, a mixture, a mixture of packed texts
    redis-restart   Redis (AOF) kill -9 mid-run, restarted; the job killed later and resumed
    redis-wipe-midrun   Redis restarted empty while the job runs: commits claim the job again
    redis-wipe-down     ... while the job is down: the loud error (resume_min_step), then the fallback
    s3              S3 through a proxy: 20% of GETs 503/500, bodies cut mid-read, latency spikes
    blackhole       a server behind a TCP proxy that goes silent (accepts, then sends nothing)
    corrupt-shard   a flipped byte in a shard: DATA_LOSS naming the shard and row group (typed)
    corrupt-cache   flipped bytes in disk-cache files: read again from storage

Trainers are processes (loadtest/chaos_rank.py) that log every step; the driver (chaos_job.py) judges
the job's trajectory — after each resume, from its checkpoint step — against the read plan: every
(epoch, position) exactly once with the plan's sample. A row is `exact` (0 lost, 0 duplicated, 0
wrong), `typed X` (the fault is unrecoverable and the job ended with shardstream error X, having
delivered nothing twice) or FAILED. Max stall is the longest wait of the training loop for one batch
(each process's first batch apart). Writes loadtest/results/chaos.json and the table as Markdown
(loadtest/results/chaos.md). Exit status 1 when a row failed, unless the row names the known product
bug it shows (the table says so, and tests/test_chaos.py holds it as a strict xfail).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import chaos_faults as cf
from . import chaos_storage as cs
from .chaos_ctx import Ctx, Row, Sizes
from .common import RESULTS, bench_main, bench_parser, log, results_path, versions

__all__ = ["FAULTS", "main", "markdown", "run_chaos", "run_fault"]

Fault = Callable[[Ctx, contextlib.ExitStack], Row]


def _resize(kind: str) -> Fault:
    return lambda ctx, stack: cf.resize(ctx, stack, kind)


FAULTS: dict[str, Fault] = {
    "kill9": cf.kill9_servers,
    "rolling": cf.rolling_restart,
    "rank-kills": cf.rank_kills,
    "rank-kills-late": cf.rank_kills_late,
    **{f"resize-{k.replace('+', '-')}": _resize(k) for k in cf.RESIZE_KINDS},
    "redis-restart": cf.redis_restart,
    "redis-wipe-midrun": cf.redis_wipe_midrun,
    "redis-wipe-down": cf.redis_wipe_down,
    "s3": cs.s3_faults,
    "blackhole": cs.blackhole,
    "corrupt-shard": cs.corrupt_shard,
    "corrupt-cache": cs.corrupt_disk_cache,
}


def run_fault(ctx: Ctx, name: str) -> Row:
    """One fault, its own processes stopped afterwards; a crash of the driver is a failed row."""
    t0 = time.perf_counter()
    log(f"chaos: {name} ...")
    try:
        with contextlib.ExitStack() as stack:
            out = FAULTS[name](ctx, stack)
    except Exception as exc:  # noqa: BLE001 — reported as the row's outcome, with the traceback logged
        log(traceback.format_exc())
        out = {
            "fault": name,
            "load": "",
            "outcome": f"CRASHED: {type(exc).__name__}: {exc}"[:500],
            "ok": False,
        }
    out["name"] = name
    out["seconds"] = round(time.perf_counter() - t0, 1)
    log(f"chaos: {name}: {out['outcome']} ({out['seconds']:.0f} s)")
    return out


def run_chaos(sizes: Sizes, names: list[str], workdir: Path | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shardstream-chaos-")))
        workdir.mkdir(parents=True, exist_ok=True)
        ctx = stack.enter_context(Ctx(workdir, sizes))
        log(f"chaos: {len(names)} faults, work directory {workdir}")
        rows = [run_fault(ctx, name) for name in names]
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.chaos", *sys.argv[1:]]),
        "sizes": dataclasses.asdict(sizes),
        "versions": versions("shardstream", "grpcio", "aiobotocore", "redis"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }


def _cell(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.2f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x).replace("|", "\\|")


def markdown(result: dict[str, Any]) -> str:
    head = "| fault | load | samples delivered | lost | duplicated | max stall (s) | failovers | outcome |"
    lines = [head, "|" + "---|" * 8]
    for r in result["rows"]:
        cells = [
            r.get(k) for k in ("fault", "load", "delivered", "lost", "duplicated", "max_stall_s", "failovers")
        ]
        lines.append("| " + " | ".join(_cell(c) for c in [*cells, r["outcome"]]) + " |")
    return "\n".join(lines) + "\n"


def _report(result: dict[str, Any]) -> None:
    print()
    print(markdown(result))
    ok = sum(r["ok"] for r in result["rows"])
    print(f"{ok} of {len(result['rows'])} faults survived as required, in {result['seconds']:.0f} s")
    for r in result["rows"]:
        if r.get("known_bug"):
            print(f"known bug, {r['name']}: {r['known_bug']} (tests/test_chaos.py, strict xfail)")


def build_parser() -> argparse.ArgumentParser:
    d = Sizes()
    ap = bench_parser("loadtest.chaos", __doc__ or "", whole_doc=True)
    ap.add_argument("--only", nargs="+", choices=list(FAULTS), metavar="FAULT", help="run these faults only")
    ap.add_argument("--list", action="store_true", help="list the faults and exit")
    ap.add_argument("--small", action="store_true", help="the test suite's sizes (each fault in seconds)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the datasets' rows (default 1)")
    ap.add_argument("--rank-kills", type=int, help=f"trainer rank kills (default {d.rank_kills})")
    ap.add_argument(
        "--kill-every-s", type=float, help=f"seconds between server kills (default {d.kill_every_s:g})"
    )
    ap.add_argument(
        "--grace-s", type=float, help=f"drain grace of the rolling restart (default {d.grace_s:g})"
    )
    ap.add_argument(
        "--run-s",
        type=float,
        help=f"how long the jobs of kill9 and rolling run (default {d.kill9_s:g}; their step time follows)",
    )
    ap.add_argument(
        "--step-ms", type=float, help=f"simulated compute per step elsewhere (default {d.step_ms:g})"
    )
    ap.add_argument("--workdir", type=Path, help="keep datasets, trainer logs and configs here")
    ap.add_argument(
        "--md", type=Path, default=RESULTS / "chaos.md", help="the table as Markdown (default %(default)s)"
    )
    return ap


def sizes_from_args(args: argparse.Namespace) -> Sizes:
    sizes = (Sizes.small() if args.small else Sizes()).scaled(args.scale)
    for opt, names in (
        ("rank_kills", ("rank_kills",)),
        ("kill_every_s", ("kill_every_s",)),
        ("grace_s", ("grace_s",)),
        ("run_s", ("kill9_s", "rolling_s")),
        ("step_ms", ("step_ms",)),
    ):
        if getattr(args, opt) is not None:
            sizes = dataclasses.replace(sizes, **dict.fromkeys(names, getattr(args, opt)))
    return sizes


def _then(args: argparse.Namespace, result: dict[str, Any]) -> None:
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(f"`{result['command']}` ({result['seconds']:.0f} s)\n\n" + markdown(result))
    print(f"wrote {args.md}")


def _failed(result: dict[str, Any]) -> bool:
    """A row failed that no known bug explains."""
    return any(not r["ok"] and not r.get("known_bug") for r in result["rows"])


def main(argv: list[str] | None = None) -> int:
    args_seen = sys.argv[1:] if argv is None else argv
    if "--list" in args_seen:
        for name in FAULTS:
            print(name)
        return 0
    return bench_main(
        build_parser(),
        argv,
        lambda args: run_chaos(sizes_from_args(args), args.only or list(FAULTS), args.workdir),
        json_default=results_path("chaos"),
        report=_report,
        then=_then,
        failed=_failed,
    )


if __name__ == "__main__":
    sys.exit(main())
