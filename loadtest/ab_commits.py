"""Before/after of the data path: the working tree's server + client against an older commit's, one run.

    python -m loadtest.ab_commits COMMIT [--mib 256] [--rounds 4] [--json PATH]

`git archive COMMIT core client server` is laid out as an importable `shardstream` package in a
temp dir; processes started with it first on PYTHONPATH run that commit's code (the loadtest
harness is the working tree's). Variants, each with its own `shardstream serve` subprocess and its
own client process (loadtest.bench.ClientProcess), over one dataset as in `loadtest.bench`:

    old           COMMIT's server and client
    new           the working tree's server and client
    new, no tune  the working tree's, with SHARDSTREAM_MALLOC_TUNE=0 (no mallopt: allocator.py)

One warm-up round, then --rounds rounds of every variant in turn (A B C A B C ...): MB/s of one
unshuffled epoch through `Loader(output="arrow")`, client and server CPU seconds; ratios to `old`
per round, median (min-max). Figures only.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from loadtest.bench import ClientProcess, Layout, build_dataset
from loadtest.common import bench_main, bench_parser, log, results_path, spread, versions
from shardstream.server.local_fleet import LocalServer

__all__ = ["main"]

REPO = Path(__file__).resolve().parent.parent


def overlay(commit: str, dest: Path) -> str:
    """COMMIT's shared package, client/, server/ as dest/shardstream (the installed layout); its hash.

    The shared package's folder is `shardstream/` (older commits: `core/`)."""
    sha = subprocess.run(
        ["git", "rev-parse", commit], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    raw = dest / "raw"
    raw.mkdir(parents=True)
    tree = subprocess.run(
        ["git", "ls-tree", "--name-only", sha], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    shared = "shardstream" if "shardstream" in tree else "core"
    archive = subprocess.run(
        ["git", "archive", sha, shared, "client", "server"], cwd=REPO, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(raw)], input=archive.stdout, check=True)
    pkg = dest / "shardstream"
    shutil.move(str(raw / shared), pkg)
    shutil.move(str(raw / "client"), pkg / "client")
    shutil.move(str(raw / "server"), pkg / "server")
    return sha


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shardstream-ab-") as tmp, contextlib.ExitStack() as stack:
        sha = overlay(args.commit, Path(tmp) / "old")
        variants = {
            "old": {"PYTHONPATH": str(Path(tmp) / "old")},
            "new": {},
            "new, no tune": {"SHARDSTREAM_MALLOC_TUNE": "0"},
        }
        layout = Layout.plan(args.mib, 2)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            root, _ = pool.submit(build_dataset, Path(tmp), layout).result()
        servers = {k: stack.enter_context(LocalServer(root, env=env)) for k, env in variants.items()}
        clients = {}
        for k, env in variants.items():
            clients[k] = ClientProcess(env)
            stack.callback(clients[k].close)
        passes: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
        for round_ in range(args.rounds + 1):
            for k in variants:
                s = servers[k]
                assert s.proc is not None
                p = clients[k].measure(
                    k, round_, ("shardstream", ([s.target], layout.batch_rows)), s.proc.pid
                )
                log(
                    f"  {'warm-up' if round_ == 0 else f'round {round_}'} {k:<13} {p.mb_per_s:6.0f} MB/s  "
                    f"client CPU {p.client_cpu_s:.2f} s  server CPU {p.server_cpu_s or 0:.2f} s"
                )
                if round_:
                    passes[k].append(p.to_json())

    summary = {
        k: {
            "mb_per_s": spread([p["mb_per_s"] for p in ps]),
            "ratio_to_old": spread(
                [p["mb_per_s"] / o["mb_per_s"] for p, o in zip(ps, passes["old"], strict=True)]
            ),
            "client_cpu_s": spread([p["client_cpu_s"] for p in ps]),
            "server_cpu_s": spread([p["server_cpu_s"] for p in ps]),
        }
        for k, ps in passes.items()
    }
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "loadtest.ab_commits", *sys.argv[1:]]),
        "old_commit": sha,
        "new": "working tree",
        "config": {"mib": args.mib, "rounds": args.rounds, "batch_rows": layout.batch_rows},
        "versions": versions("grpcio"),
        "summary": summary,
        "passes": passes,
    }


def print_report(res: dict[str, Any]) -> None:
    cfg = res["config"]
    print(
        f"\nold = {res['old_commit'][:10]}, new = working tree, {cfg['mib']} MiB passes, {cfg['rounds']} rounds"
    )
    print(
        f"{'variant':<14} {'MB/s med (min-max)':>22} {'/ old':>20} {'client CPU s':>13} {'server CPU s':>13}"
    )
    for k, s in res["summary"].items():
        m, r = s["mb_per_s"], s["ratio_to_old"]
        print(
            f"{k:<14} {m['median']:>8.0f} ({m['min']:.0f}-{m['max']:.0f}) "
            f"{r['median']:>8.2f} ({r['min']:.2f}-{r['max']:.2f}) {s['client_cpu_s']['median']:>13.3f} "
            f"{s['server_cpu_s']['median']:>13.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("loadtest.ab_commits", __doc__)
    ap.add_argument("commit", help="the older commit (e.g. HEAD~3)")
    ap.add_argument("--mib", type=int, default=256, help="dataset payload (default 256)")
    ap.add_argument("--rounds", type=int, default=4, help="measured rounds after a warm-up (default 4)")
    return bench_main(ap, argv, run, json_default=results_path("ab_commits"), report=print_report)


if __name__ == "__main__":
    sys.exit(main())
