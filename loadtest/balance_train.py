"""Balanced steps in a real job: torchrun, 2 ranks (gloo, DDP), balance=None against "tokens", wall time per epoch.

    python -m loadtest.balance_train [--docs 400] [--seq-len 2048] [--batch 8] [--rounds 3] [--json PATH]

A dataset of CPython's standard-library sources (the byte tokenizer; each file's UTF-8 size is its
`n_tokens` column) is served by one local server. `torchrun --nproc_per_node 2` runs two ranks of a
small model whose step time grows with its rows (an embedding and two linear layers over every token
of its packed rows, then DDP's gradient all-reduce): each step waits for the slower rank. Each round
runs an epoch with balance=None, then one with "tokens" (alternating), and reports each epoch's wall
time as the slower rank saw it; the ratio is tokens / None (median of the rounds). Rows per rank per
step are counted too (max/mean). On 2 cores the ranks and the server share the CPUs: the ratio, not
the seconds, is the figure. Not a test: nothing asserts on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.chaos_net import free_port
from loadtest.common import bench_main, bench_parser, results_path

REPO = Path(__file__).resolve().parents[1]


def _rank(config: dict[str, Any]) -> None:  # runs inside torchrun
    import numpy as np
    import torch
    import torch.distributed as dist

    from shardstream.client import Loader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Embedding(257, 64), torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 257))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    transforms = [
        {"op": "text.tokenize", "tokenizer": "bytes"},
        {"op": "text.pack", "seq_len": config["seq_len"], "lengths": "n_tokens"},
    ]
    out: dict[str, Any] = {}
    for mode in config["modes"]:
        rows: list[int] = []
        with Loader(
            [config["endpoint"]], "code", batch_size=config["batch"], rank=rank, world_size=world, seed=1,
            columns=["text"], transforms=transforms, balance=mode, output="torch", drop_last=True,
        ) as loader:  # fmt: skip
            it = iter(loader)
            first = next(it)  # the stream is up: time the epoch's steps from here
            dist.barrier()
            t0 = time.perf_counter()
            for batch in [first, *it]:
                ids = batch["input_ids"].long()
                rows.append(len(ids))
                logits = ddp(ids)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 257), batch["labels"].long().reshape(-1), ignore_index=-100)
                opt.zero_grad()
                loss.backward()  # all-reduce: the step ends with its slower rank
                opt.step()
            dist.barrier()
            elapsed = time.perf_counter() - t0
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, rows)
        per_step = np.array(gathered)  # rank x step
        out[str(mode)] = {
            "seconds": elapsed,
            "steps": per_step.shape[1],
            "rows_max_mean": float(np.median(per_step.max(0) / per_step.mean(0))),
        }
    if rank == 0:
        Path(config["out"]).write_text(json.dumps(out))
    dist.destroy_process_group()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import sysconfig

    import numpy as np
    import pyarrow as pa

    from shardstream.server.local_fleet import LocalServer
    from shardstream.server.writing.ingest import IngestOptions, ingest

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(stdlib.rglob("*.py")) if "site-packages" not in p.parts and p.stat().st_size > 0]
    files = [files[i] for i in np.random.default_rng(0).permutation(len(files))[: args.docs]]
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="balance-train-") as tmp:
        root = Path(tmp) / "root"
        src = Path(tmp) / "code.parquet"
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts, "n_tokens": pa.array([len(t.encode()) for t in texts], pa.int32())}), src)
        ingest(src, "code", root, IngestOptions(row_group_rows=64, progress=False))
        with LocalServer(root) as server:
            for i in range(args.rounds):
                modes = [None, "tokens"] if i % 2 == 0 else ["tokens", None]
                out = Path(tmp) / f"round-{i}.json"
                config = {"endpoint": server.target, "seq_len": args.seq_len, "batch": args.batch, "modes": modes, "out": str(out)}
                env = {**os.environ, "PYTHONPATH": str(REPO)}
                subprocess.run(
                    [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
                     "-m", "loadtest.balance_train", "--rank-config", json.dumps(config)],
                    check=True, env=env, cwd=REPO, timeout=1800,
                )  # fmt: skip
                rounds.append(json.loads(out.read_text()))
    ratio = statistics.median(r["tokens"]["seconds"] / r["None"]["seconds"] for r in rounds)
    return {
        "documents": len(texts),
        "seq_len": args.seq_len,
        "batch": args.batch,
        "rounds": rounds,
        "epoch_time_tokens_over_none": ratio,
    }


def report(res: dict[str, Any]) -> None:
    print(f"{res['documents']} CPython sources, seq_len {res['seq_len']}, {res['batch']} documents a rank a step, 2 ranks (gloo, DDP)")
    for i, r in enumerate(res["rounds"]):
        n, t = r["None"], r["tokens"]
        print(
            f"round {i}: None {n['seconds']:.1f} s (rows max/mean {n['rows_max_mean']:.2f}), "
            f"tokens {t['seconds']:.1f} s (rows max/mean {t['rows_max_mean']:.2f}), {n['steps']} steps"
        )
    print(f"epoch wall time, tokens / None: {res['epoch_time_tokens_over_none']:.2f} (median of {len(res['rounds'])} rounds)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-config"]:
        _rank(json.loads(argv[1]))
        return 0
    parser = bench_parser("loadtest.balance_train", __doc__ or "")
    parser.add_argument("--docs", type=int, default=400, help="standard-library files in the dataset (default 400)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="documents per rank per step (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    return bench_main(parser, argv, run, json_default=results_path("balance_train"), report=report)


if __name__ == "__main__":
    sys.exit(main())
