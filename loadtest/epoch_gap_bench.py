"""The wait at an epoch's first step of a striped Loader: the next epoch's streams opened ahead or not.

    python -m loadtest.epoch_gap_bench [--mib 64] [--batch-mib 0.5] [--epochs 6] [--streams 2]
                                       [--compute-ms 0] [--rounds 4] [--json PATH]

One dataset as in `loadtest.bench` (`id` + 256 float32, 1,032 B/row), two `shardstream serve`
processes over it, and a Loader(streams=K, shuffle="block", prefetch=2) reading --epochs epochs in
this process, sleeping --compute-ms after each batch (the training step; 0: a loop bound by its
input). Two ways, alternating round by round:

    ahead           as shipped: the next epoch's K streams are opened while the rank still has a few
                    steps and a message's span of this epoch to read (client/striped.py)
    at the end      the same Loader with StripedEpochs._open_next made a no-op: each epoch's streams
                    are opened when its first step is wanted (the behaviour before 2026-11-30)

Per pass: the mean wait of the training loop for an epoch's first batch (epochs 1 on) and the median
wait for the other batches. Median (min-max) over the rounds. Figures only.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from loadtest.bench import DATASET, Layout, build_dataset
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from shardstream.client import Loader
from shardstream.client.striped import StripedEpochs
from shardstream.server.local_fleet import LocalServer

__all__ = ["main"]

WAYS = ("ahead", "at the end")


def one_pass(targets: list[str], batch_rows: int, args: argparse.Namespace, ahead: bool) -> tuple[float, float]:
    """(mean wait for an epoch's first batch, median wait for the others), in ms."""
    opened_ahead = StripedEpochs._open_next
    if not ahead:
        StripedEpochs._open_next = lambda self, epoch: None  # type: ignore[method-assign]
    try:
        first: list[float] = []
        other: list[float] = []
        with Loader(targets, DATASET, batch_size=batch_rows, shuffle="block", seed=1, epochs=args.epochs,
                    streams=args.streams, prefetch=2, output="arrow") as loader:  # fmt: skip
            it = iter(loader)
            epoch = 0
            while True:
                t0 = time.perf_counter()
                batch = next(it, None)
                waited = time.perf_counter() - t0
                if batch is None:
                    break
                assert loader.last_batch is not None
                (first if loader.last_batch.epoch != epoch else other).append(waited * 1e3)
                epoch = loader.last_batch.epoch
                time.sleep(args.compute_ms / 1e3)  # the training step
        return statistics.mean(first), statistics.median(other)
    finally:
        StripedEpochs._open_next = opened_ahead  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.plan(args.mib, args.batch_mib)
    with tempfile.TemporaryDirectory(prefix="shardstream-epoch-gap-") as tmp:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, _ = pool.submit(build_dataset, Path(tmp), layout).result()
        with LocalServer(root) as a, LocalServer(root) as b:
            targets = [a.target, b.target]
            one_pass(targets, layout.batch_rows, args, True)  # warm-up: the servers' caches
            passes: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
            for round_ in range(1, args.rounds + 1):
                for way in WAYS if round_ % 2 else reversed(WAYS):
                    first, other = one_pass(targets, layout.batch_rows, args, way == "ahead")
                    log(f"  round {round_} {way:<11} first batch of an epoch {first:7.2f} ms, others {other:.3f} ms")
                    passes[way].append((first, other))
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.epoch_gap_bench", *sys.argv[1:]]),
        "config": {**vars(args), "json": str(args.json), "batch_rows": layout.batch_rows, "rows": layout.num_rows},
        "versions": versions("shardstream", "grpcio"),
        "first_batch_ms": {w: spread([p[0] for p in v]) for w, v in passes.items()},
        "other_batches_ms": {w: spread([p[1] for p in v]) for w, v in passes.items()},
        "passes": passes,
    }


def print_report(res: dict[str, Any]) -> None:
    print(f"\n{'way':<12} {'epoch first batch, ms':>26} {'other batches, ms':>24}")
    for w in WAYS:
        f, o = res["first_batch_ms"][w], res["other_batches_ms"][w]
        print(f"{w:<12} {f['median']:>9.2f} ({f['min']:.2f}-{f['max']:.2f}) {o['median']:>12.3f} ({o['min']:.3f}-{o['max']:.3f})")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.epoch_gap_bench", __doc__)
    ap.add_argument("--mib", type=int, default=64, help="dataset payload (default 64)")
    ap.add_argument("--batch-mib", type=float, default=0.5, help="batch size (default 0.5)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs a pass (default 6)")
    ap.add_argument("--streams", type=int, default=2, help="Loader(streams=K) (default 2)")
    ap.add_argument("--compute-ms", type=float, default=0.0, help="the training step's sleep (default 0)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of both ways (default 4)")

    def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.epochs < 2 or args.streams < 2 or args.rounds < 1 or args.mib < 1 or args.compute_ms < 0:
            parser.error("needs --epochs >= 2, --streams >= 2, --rounds >= 1, --mib >= 1, --compute-ms >= 0")

    return bench_main(ap, argv, run, json_default=results_path("epoch_gap_bench"), report=print_report, check=check)


if __name__ == "__main__":
    sys.exit(main())
