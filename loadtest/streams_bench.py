"""Where the data plane's time goes: the Loader vs its bare Flight stream, and streams striped by step.

    python -m loadtest.streams_bench [--mib 256] [--batch-mib 2] [--rounds 3] [--json PATH]

One dataset as in `loadtest.bench` (`id` + 256 float32, 1,032 B/row), two `shardstream serve`
processes over it, and these ways of reading one rank's whole epoch (shuffle none) in this process:

    loader          Loader(output="arrow") from server A: what `loadtest.bench` measures
    raw             the bare Read stream from server A: `Connection.read` (client/transport/channel.py), a
                    Flight DoGet of the ReadRequest on the server's data port, its record batches
                    counted: the Loader minus its thread, queue, checks and bookkeeping
    K streams, S servers
                    K concurrent Read streams (one thread each) taking every K-th step
                    (first_step=j, step_stride=K), stream j on server j mod S: striping a rank over
                    server processes, when one stream is bound by one server's CPU

One warm-up round, then --rounds rounds in which every way runs once (A B C ... A B C ...). MB/s of
Arrow payload; ratios to `raw` per round, median (min-max). Figures only.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from loadtest.bench import DATASET, Layout, build_dataset
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from shardstream.client import Loader
from shardstream.client.transport.channel import Connection
from shardstream.server.local_fleet import LocalServer
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["main"]


def loader_pass(targets: list[str], batch_rows: int) -> int:
    n = 0
    with Loader(targets[:1], DATASET, batch_size=batch_rows, shuffle=False, output="arrow") as loader:
        for batch in loader:
            n += batch.nbytes
    return n


def striped_pass(targets: list[str], batch_rows: int, streams: int) -> int:
    conns = [Connection(t) for t in targets]
    try:
        info = conns[0].get_dataset(DATASET, 10.0)
        totals = [0] * streams
        errors: list[BaseException] = []

        def one(j: int) -> None:
            req = pb.ReadRequest(
                dataset=f"{DATASET}@{info.version}",
                fingerprint=info.fingerprint,
                shuffle=pb.Shuffle(mode="none"),
                world_size=1,
                batch_size=batch_rows,
                first_step=j,
                step_stride=streams,
            )
            try:
                for _, batch in conns[j % len(conns)].read(req):
                    totals[j] += batch.nbytes
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(j,)) for j in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return sum(totals)
    finally:
        for c in conns:
            c.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    layout = Layout.plan(args.mib, args.batch_mib)
    with tempfile.TemporaryDirectory(prefix="shardstream-streams-") as tmp:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, _ = pool.submit(build_dataset, Path(tmp), layout).result()
        with LocalServer(root) as a, LocalServer(root) as b:
            one, two = [a.target], [a.target, b.target]
            ways: dict[str, Callable[[], int]] = {
                "loader": lambda: loader_pass(one, layout.batch_rows),
                "raw": lambda: striped_pass(one, layout.batch_rows, 1),
                "2 streams, 1 server": lambda: striped_pass(one, layout.batch_rows, 2),
                "2 streams, 2 servers": lambda: striped_pass(two, layout.batch_rows, 2),
                "4 streams, 2 servers": lambda: striped_pass(two, layout.batch_rows, 4),
            }
            passes: dict[str, list[float]] = {k: [] for k in ways}
            for round_ in range(args.rounds + 1):
                for name, fn in ways.items():
                    t0 = time.perf_counter()
                    nbytes = fn()
                    mbs = nbytes / (time.perf_counter() - t0) / 1e6
                    log(f"  {'warm-up' if round_ == 0 else f'round {round_}'} {name:<22} {mbs:6.0f} MB/s")
                    if round_:
                        passes[name].append(mbs)
    ratios = {
        k: [x / y for x, y in zip(v, passes["raw"], strict=True)] for k, v in passes.items() if k != "raw"
    }
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.streams_bench", *sys.argv[1:]]),
        "config": {
            **vars(args),
            "json": str(args.json),
            "batch_rows": layout.batch_rows,
            "rows": layout.num_rows,
        },
        "versions": versions("shardstream", "grpcio"),
        "mb_per_s": {k: spread(v) for k, v in passes.items()},
        "ratio_to_raw": {k: spread(v) for k, v in ratios.items()},
        "passes": passes,
    }


def print_report(res: dict[str, Any]) -> None:
    print(f"\n{'way':<24} {'MB/s med (min-max)':>22} {'/ raw':>20}")
    for k, s in res["mb_per_s"].items():
        r = res["ratio_to_raw"].get(k)
        rtxt = f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" if r else "1"
        print(f"{k:<24} {s['median']:>8.0f} ({s['min']:.0f}-{s['max']:.0f}) {rtxt:>20}")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.streams_bench", __doc__)
    ap.add_argument("--mib", type=int, default=256, help="dataset payload (default 256)")
    ap.add_argument("--batch-mib", type=float, default=2.0, help="batch size (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds after a warm-up (default 3)")
    return bench_main(ap, argv, run, json_default=results_path("streams_bench"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
