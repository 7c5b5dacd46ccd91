"""One message's build, in process: CPU per message and per GB of `MessageBuilder.stream`, by shuffle mode.

    python -m loadtest.build_bench [--mib 128] [--batch-mib 2] [--epochs 2] [--rounds 5]
                                   [--modes none block full] [--previous] [--numpy] [--profile MODE]
                                   [--json PATH]

No server, no Flight: the read plan of one rank (world size 1) over `loadtest.bench`'s dataset
(`id` int64 + `vec` fixed_size_list<float32>[256], 1,032 B/row, row groups of two batches), its
row groups cached in memory (one warm-up epoch), then whole epochs of `MessageBuilder.stream` with
Arrow's pool as the server sets it (jemalloc, decay 0: server/lifecycle.py). What it measures is
the Python and Arrow work a server does per message before Flight writes it: select, take,
provenance, sizing, the header. Per mode and round: CPU seconds per message and per GB of payload
(`time.process_time`: the process does nothing else; the fetch pool's threads count too), rounds
alternating over the modes.
`--previous`: each round also builds every mode with the build path before issue #26 (`previous()`:
Arrow's gather, a fetch-pool round trip per row group, provenance appended to a table, IPC sizing
with a stream writer, each message's samples selected through the order alone), alternating with today's, and reports the ratio today / previous per round.
`--numpy`: each round also builds every mode with today's path on the numpy kernels instead of the C
ones (shardstream/kernels.py: the permutation and the shuffled gather), alternating, as a ratio.
`--profile MODE`: cProfile of one epoch of that mode, the top functions by own time, per message
(with --previous or --numpy, of each path). Figures only; it exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import multiprocessing
import pstats
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from loadtest.bench import ROW_BYTES, Layout, build_dataset
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from loadtest.previous_build import no_runs, previous_ipc_size, previous_take
from shardstream import kernels
from shardstream.server.backends.roots import open_registry
from shardstream.server.read import build as build_module
from shardstream.server.read import reader as reader_module
from shardstream.server.read.build import MessageBuilder
from shardstream.server.read.plan import ReadPlanner
from shardstream.server.read.reader import new_row_group_cache
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main", "run"]

MODES = ("none", "block", "full")
CURRENT, PREVIOUS, NUMPY = "current", "previous", "numpy"


@contextlib.contextmanager
def previous() -> Iterator[None]:
    """The build path as it was before issue #26, while inside."""
    take, size, ahead = reader_module.DatasetReader.take, build_module.ipc_size, build_module.OrderAhead.AHEAD_SAMPLES
    runs = build_module.MessageBuilder._group_run
    reader_module.DatasetReader.take = previous_take  # type: ignore[method-assign]
    build_module.MessageBuilder._group_run = no_runs  # type: ignore[method-assign]
    build_module.ipc_size = previous_ipc_size  # type: ignore[assignment]
    build_module.OrderAhead.AHEAD_SAMPLES = 0  # each message's samples selected alone, as before
    try:
        yield
    finally:
        reader_module.DatasetReader.take = take  # type: ignore[method-assign]
        build_module.MessageBuilder._group_run = runs  # type: ignore[method-assign]
        build_module.ipc_size = size  # type: ignore[assignment]
        build_module.OrderAhead.AHEAD_SAMPLES = ahead


def _request(mode: str, batch_rows: int, epoch: int) -> pb.ReadRequest:
    return pb.ReadRequest(
        dataset="bench",
        seed=0,
        epoch=epoch,
        shuffle=pb.Shuffle(mode=mode),
        rank=0,
        world_size=1,
        batch_size=batch_rows,
        split_steps=True,
    )


def _epochs(planner: ReadPlanner, builder: MessageBuilder, mode: str, batch_rows: int, epochs: int) -> tuple[int, int]:
    """(messages, rows) of `epochs` whole epochs of `mode`."""
    messages = rows = 0
    for e in range(epochs):
        for m in builder.stream(planner.plan(_request(mode, batch_rows, e))):
            messages += 1
            rows += m.rows
    return messages, rows


def _profile(planner: ReadPlanner, builder: MessageBuilder, mode: str, batch_rows: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    messages, _ = _epochs(planner, builder, mode, batch_rows, 1)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(
        f"cProfile, shuffle {mode}: {messages} messages, {total / messages * 1e6:.0f} us per message "
        "(profiled: slower than unprofiled)",
        file=out,
    )
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


@contextlib.contextmanager
def numpy_kernels() -> Iterator[None]:
    """Today's build path on the numpy kernels, while inside."""
    native = kernels.native
    kernels.native = None
    try:
        yield
    finally:
        kernels.native = native


def _path(path: str) -> contextlib.AbstractContextManager[None]:
    return {PREVIOUS: previous, NUMPY: numpy_kernels}.get(path, contextlib.nullcontext)()


def run(args: argparse.Namespace) -> dict[str, Any]:
    pa.set_memory_pool(pa.jemalloc_memory_pool())  # as server/lifecycle.py sets it
    pa.jemalloc_set_decay_ms(0)
    layout = Layout.plan(args.mib, args.batch_mib)
    passes: list[dict[str, Any]] = []
    profiles: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="shardstream-build-") as tmp:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, _ = pool.submit(build_dataset, Path(tmp), layout).result()
        with open_registry(str(root)) as registry:
            planner = ReadPlanner(registry, new_row_group_cache(2 * args.mib << 20))
            builder = MessageBuilder()
            for mode in args.modes:  # warm-up: the row groups into the cache
                _epochs(planner, builder, mode, layout.batch_rows, 1)
            others = [p for p, on in ((PREVIOUS, args.previous), (NUMPY, args.numpy)) if on]
            paths = (CURRENT, *others)
            for r in range(args.rounds):
                order = args.modes if r % 2 == 0 else args.modes[::-1]
                for mode in order:
                    for path in paths if r % 2 == 0 else paths[::-1]:
                        with _path(path):
                            c0 = time.process_time()
                            messages, rows = _epochs(planner, builder, mode, layout.batch_rows, args.epochs)
                            cpu = time.process_time() - c0
                        gb = rows * ROW_BYTES / 1e9
                        passes.append(
                            {"mode": mode, "path": path, "round": r, "messages": messages, "rows": rows,
                             "cpu_s": cpu, "us_per_message": cpu / messages * 1e6, "cpu_s_per_gb": cpu / gb}
                        )
                        log(
                            f"  round {r + 1} {mode:<6} {path:<8} {cpu / messages * 1e6:7.0f} us/message  "
                            f"{cpu / gb:.3f} CPU-s/GB"
                        )
            for mode in args.profile or ():
                for path in paths:
                    with _path(path):
                        profiles[f"{mode} {path}"] = _profile(planner, builder, mode, layout.batch_rows, args.top)
    summary: dict[str, Any] = {}
    for mode in args.modes:
        for path in paths:
            ps = [p for p in passes if p["mode"] == mode and p["path"] == path]
            summary[f"{mode} {path}"] = {m: spread([p[m] for p in ps]) for m in ("us_per_message", "cpu_s_per_gb")}
        cur = [p for p in passes if p["mode"] == mode and p["path"] == CURRENT]
        for other in others:
            then = [p for p in passes if p["mode"] == mode and p["path"] == other]
            summary[f"{mode} current/{other}"] = {
                "cpu_ratio": spread([a["cpu_s"] / b["cpu_s"] for a, b in zip(cur, then, strict=True)])
            }
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.build_bench", *sys.argv[1:]]),
        "config": {"previous": args.previous, "numpy": args.numpy, "kernels": kernels.describe(), "mib": args.mib, "batch_rows": layout.batch_rows, "row_group_rows": layout.row_group_rows,
                   "epochs_per_pass": args.epochs, "rounds": args.rounds, "arrow_pool": "jemalloc, decay 0"},
        "versions": versions("shardstream"),
        "passes": passes,
        "summary": summary,
        "profiles": profiles,
    }


def print_report(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"\nbuild only: {cfg['mib']} MiB, batches of {cfg['batch_rows']} rows, row groups of "
        f"{cfg['row_group_rows']}, {cfg['epochs_per_pass']} epochs per pass, {cfg['rounds']} rounds"
    )
    print(f"{'shuffle / path':<26} {'us/message':>24} {'CPU-s/GB':>24}")
    for key, s in result["summary"].items():
        if "cpu_ratio" in s:
            r = s["cpu_ratio"]
            print(f"{key:<26} CPU ratio per round {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
            continue
        u, g = s["us_per_message"], s["cpu_s_per_gb"]
        print(
            f"{key:<26} {u['median']:>8.0f} ({u['min']:.0f}-{u['max']:.0f})".ljust(52)
            + f"{g['median']:>8.3f} ({g['min']:.3f}-{g['max']:.3f})"
        )
    for text in result["profiles"].values():
        print()
        print(text)


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.build_bench", __doc__)
    ap.add_argument("--mib", type=int, default=128, help="dataset payload size (default 128)")
    ap.add_argument("--batch-mib", type=float, default=2.0, help="batch size in MiB of payload (default 2)")
    ap.add_argument("--epochs", type=int, default=2, help="whole epochs per pass (default 2)")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument(
        "--previous", action="store_true", help="also the build path before issue #26, alternating, as a ratio"
    )
    ap.add_argument(
        "--numpy", action="store_true", help="also today's path on the numpy kernels, alternating, as a ratio"
    )
    ap.add_argument("--profile", nargs="*", choices=MODES, help="cProfile one epoch of these modes")
    ap.add_argument("--top", type=int, default=18, help="functions listed per profile (default 18)")
    return bench_main(ap, argv, run, json_default=results_path("build_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
