"""Checkpoint benchmark: save stall, load throughput, incremental bytes, follow() latency (DESIGN §13).

    python -m loadtest.checkpoint_bench [--mib 256] [--tensors 20] [--rounds 3] [--readers 4]
                                        [--json PATH (default loadtest/results/checkpoint_bench.json)]

One state of --tensors float32 tensors, --mib MiB in all, on CPU; one `LocalServer` with
`--checkpoint-root` in a private temp dir (its row-group cache, 1 GiB, holds the checkpoint), and a
local directory for torch.distributed.checkpoint (DCP) in the same temp dir. Each figure is the
median over --rounds, A and B alternating:

(a) stall: how long `Checkpointer.save(step, state)` holds the caller (staging to host memory; the
    upload runs in the background and is waited for before the next round) vs `dcp.save(state,
    storage_writer=FileSystemWriter(dir))` (synchronous). Target <= 0.1x.
(b) load: `Checkpointer.load(step, into=state)` from a warm server (one load before) vs
    `dcp.load(state, storage_reader=FileSystemReader(dir))` with a warm page cache. Target >= 1.0x.
    Then --readers Checkpointers load a fresh checkpoint at once (threads): the server's
    `shardstream_checkpoint_storage_read_bytes_total` over the checkpoint's bytes (target ~1x).
(c) incremental: bytes sent by a save after 10% of the tensors changed, over the state's bytes
    (target <= 0.15x).
(d) follow: a reader in `follow(poll_s=0.05)`; time from the writer's `result()` returning to the
    reader having loaded that step (1 MiB: an upper bound of the time to its first byte), per save.

Figures only: it never asserts on time and exits 0 unless something crashed. Both sides share this
machine's cores, as a trainer and its local disk would not with a real fleet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

from loadtest.common import bench_main, bench_parser, results_path

__all__ = ["main", "run", "summary"]


def _scrape(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name + " "))


def _state(torch: Any, mib: int, tensors: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    n = (mib << 20) // 4 // tensors
    return {f"layer{i}": torch.randn(n, generator=g) for i in range(tensors)}


def run(args: argparse.Namespace, workdir: Path | None = None) -> dict[str, Any]:
    """The figures (the docstring's (a) to (d)); files under `workdir` (default: a temp dir, removed)."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as tmp:
            return run(args, Path(tmp))
    import torch
    import torch.distributed.checkpoint as dcp

    from shardstream.client.checkpoint import Checkpointer
    from shardstream.server.local_fleet import LocalServer

    warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
    tmp = workdir
    (tmp / "datasets").mkdir()
    state = _state(torch, args.mib, args.tensors, 0)
    total = sum(t.numel() * 4 for t in state.values())
    out: dict[str, Any] = {"state_bytes": total, "tensors": args.tensors}
    with LocalServer(tmp / "datasets", metrics=True, extra_args=("--checkpoint-root", str(tmp / "ck"))) as server:
        target = [server.target]
        with Checkpointer(target, job="bench") as ck:
            stalls, dcp_s = [], []
            for r in range(-1, args.rounds):  # round -1: the warm-up (staging buffers, page cache)
                for t in state.values():
                    t.add_(1.0)  # every byte changes: a full save each round
                handle = ck.save(r + 1, state)
                handle.result()
                t0 = time.perf_counter()
                dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp / f"dcp{r + 1}")), no_dist=True)
                if r >= 0:
                    stalls.append(handle.stall_s)
                    dcp_s.append(time.perf_counter() - t0)
            out["stall"] = {
                "save_s": statistics.median(stalls),
                "dcp_save_s": statistics.median(dcp_s),
                "ratio": statistics.median(stalls) / statistics.median(dcp_s),
            }
            last = args.rounds
            into = _state(torch, args.mib, args.tensors, 1)
            ck.load(last, into=into)  # warm the server's cache
            fleet_s, disk_s = [], []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                ck.load(last, into=into)
                fleet_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                dcp.load(into, storage_reader=dcp.FileSystemReader(str(tmp / f"dcp{last}")), no_dist=True)
                disk_s.append(time.perf_counter() - t0)
            assert all(torch.equal(into[k], state[k]) for k in state)
            out["load"] = {
                "fleet_s": statistics.median(fleet_s),
                "dcp_load_s": statistics.median(disk_s),
                "fleet_gib_per_s": total / statistics.median(fleet_s) / (1 << 30),
                "ratio_throughput": statistics.median(disk_s) / statistics.median(fleet_s),
            }
            # (c) incremental: 10% of the tensors change
            changed = max(1, args.tensors // 10)
            for name in list(state)[:changed]:
                state[name].add_(1.0)
            handle = ck.save(100, state, blocking=True)
            out["incremental"] = {"changed_tensors": changed, "ratio_bytes": handle.bytes_sent / handle.bytes_total}
            # (b, continued) N readers of a checkpoint no server has read yet
            for t in state.values():
                t.add_(1.0)
            ck.save(200, state, blocking=True)
        before = _scrape(server.metrics_port, "shardstream_checkpoint_storage_read_bytes_total")
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                with Checkpointer(target, job="bench") as mine:
                    mine.load(200)
            except BaseException as exc:  # noqa: BLE001 — reported below
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(args.readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        read = _scrape(server.metrics_port, "shardstream_checkpoint_storage_read_bytes_total") - before
        out["concurrent_readers"] = {"readers": args.readers, "storage_read_over_checkpoint": read / total}
        # (d) follow latency, on a small state (a policy update)
        small = {"w": torch.zeros(1 << 18)}
        with Checkpointer(target, job="follow") as writer, Checkpointer(target, job="follow") as follower:
            writer.save(0, small, blocking=True)
            follow = follower.follow(poll_s=0.05)
            policy = {"w": torch.empty(1 << 18)}
            lags = []
            for step in range(1, args.rounds + 3):
                small["w"].fill_(step)
                writer.save(step, small, blocking=True)
                committed = time.perf_counter()
                seen = next(follow)
                follower.load(seen, into=policy)
                lags.append(time.perf_counter() - committed)
            out["follow"] = {"commit_to_loaded_s": statistics.median(lags), "max_s": max(lags)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("loadtest.checkpoint_bench", __doc__)
    p.add_argument("--mib", type=int, default=256, help="MiB of the state (default 256)")
    p.add_argument("--tensors", type=int, default=20, help="tensors of the state; 10%% of them change for (c)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of (a) and (b), after one warm-up each")
    p.add_argument("--readers", type=int, default=4, help="concurrent loads of (b)")
    return bench_main(
        p,
        argv,
        run,
        json_default=results_path("checkpoint_bench"),
        report=lambda out: print(f"{json.dumps(out, indent=2)}\n{summary(out)}"),
    )


def summary(out: dict[str, Any]) -> str:
    return (
        f"stall save/dcp.save {out['stall']['ratio']:.3f}x; load throughput fleet/dcp.load "
        f"{out['load']['ratio_throughput']:.2f}x ({out['load']['fleet_gib_per_s']:.2f} GiB/s); incremental bytes "
        f"{out['incremental']['ratio_bytes']:.3f}x; {out['concurrent_readers']['readers']} readers read storage "
        f"{out['concurrent_readers']['storage_read_over_checkpoint']:.2f}x the checkpoint; follow commit->loaded "
        f"{out['follow']['commit_to_loaded_s'] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    raise SystemExit(main())
