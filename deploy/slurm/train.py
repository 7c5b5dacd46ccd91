"""One training rank under torchrun, fed by shardstream servers (train.sbatch / train-cpu-servers.sbatch
start them and set SHARDSTREAM_ENDPOINTS).

    SHARDSTREAM_ENDPOINTS=node1:7070,node2:7070 torchrun --nproc-per-node 8 train.py web@1 --batch-size 32
    # on one machine, against `shardstream serve --root ./datasets`:
    SHARDSTREAM_ENDPOINTS=127.0.0.1:7070 torchrun --standalone --nproc-per-node 2 train.py web@1

Rank and world size come from torch.distributed (torchrun's environment). With --job, every rank
commits its cursor at each checkpoint step and `--resume latest` continues the job at the newest step
that every rank committed, with any world size or batch size (e.g. after a requeue on fewer nodes).
The model below is a placeholder: put yours where `train_step` is.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from shardstream.client import Loader


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="NAME@VERSION, NAME@TAG, or a mixture such as web@3:0.7,code@1:0.3")
    p.add_argument("--endpoints", default=os.environ.get("SHARDSTREAM_ENDPOINTS"),
                   help="host:port,... or dns:///name:port (default: $SHARDSTREAM_ENDPOINTS)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--columns", help="comma-separated columns (default: all)")
    p.add_argument("--job", help="job name for cursors in --cursor-store (needed for --resume)")
    p.add_argument("--cursor-store", default=os.environ.get("SHARDSTREAM_CURSOR_STORE"),
                   help="redis://... shared by the ranks (default: $SHARDSTREAM_CURSOR_STORE)")
    p.add_argument("--resume", help="'latest' or a committed step: continue the job there")
    p.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints/commits")
    p.add_argument("--record", type=Path,
                   help="write the global positions every step of this rank covered to DIR/rank-R.jsonl")
    args = p.parse_args()
    if not args.endpoints:
        p.error("no servers: pass --endpoints or set SHARDSTREAM_ENDPOINTS")
    if args.resume and not args.job:
        p.error("--resume needs --job")
    return args


def train_step(batch: dict[str, torch.Tensor]) -> int:
    """Placeholder for forward/backward/step: returns the number of samples in the batch."""
    return len(next(iter(batch.values()))) if batch else 0


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    job = {"job": args.job, "cursor_store": args.cursor_store, "resume": args.resume} if args.job else {}
    record = None
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
        record = (args.record / f"rank-{rank}.jsonl").open("a")
    samples = 0
    with Loader(
        args.endpoints,
        args.dataset,
        batch_size=args.batch_size,
        rank=rank,
        world_size=world,
        seed=args.seed,
        epochs=args.epochs,
        columns=args.columns.split(",") if args.columns else None,
        output="torch",
        pin_memory=cuda,
        **job,
    ) as loader:
        start = (loader.resumed_from or 0) if args.resume else 0
        # with --resume, restore the model checkpointed at step `start` here
        for step, batch in enumerate(loader, start + 1):
            samples += train_step(batch)
            if record is not None:
                info = loader.last_batch
                record.write(json.dumps({"step": step, "epoch": info.epoch, "start": info.position_start,
                                         "end": info.position_end}) + "\n")
            if step % args.checkpoint_every == 0:
                # save the model checkpoint of `step` here, then:
                if args.job:
                    loader.commit(step)
        if args.job:
            loader.flush_commits()
    if record is not None:
        record.close()
    total = torch.tensor([samples], device="cuda" if cuda else "cpu")
    dist.all_reduce(total)
    if rank == 0:
        print(f"trained on {int(total.item())} samples over {world} ranks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
