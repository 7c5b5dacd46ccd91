"""One rank of the demo's training job: a process of its own with its own Loader, as in a real job.

    python -m shardstream.demo rank --endpoints A,B --rank 0 --world-size 2 --batch-size 32 ...

It trains a model replica, saves a checkpoint and commits the data cursor for the same step every
`--commit-every` steps, and writes the ids of every batch it trained on (`seen.jsonl`) so the demo
can prove that every sample was seen exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

__all__ = ["CLASSES", "DATASET", "FEATURES", "JOB", "main", "model"]

DATASET = "demo"
JOB = "demo-job"
FEATURES = 8
CLASSES = 4


def model():  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))


# --- one rank ------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    import torch

    from shardstream.client import Loader

    p = argparse.ArgumentParser(prog="shardstream.demo rank")
    p.add_argument("--endpoints", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--store", required=True, help="cursor store URL")
    p.add_argument("--commit-every", type=int, required=True, help="checkpoint interval in steps")
    p.add_argument(
        "--stop-at", type=int, default=0, help="job step of the simulated preemption (0: epoch end)"
    )
    p.add_argument("--die-at", type=int, default=0, help="SIGKILL this process after this job step (a crash)")
    p.add_argument("--resume", action="store_true", help="resume from the job's latest committed step")
    p.add_argument("--ckpt-dir", help="where this rank's model-STEP.pt checkpoints are (default: --out)")
    p.add_argument(
        "--init-model", help="model weights to resume from when there is no checkpoint of the step"
    )
    p.add_argument("--out", required=True, help="directory for checkpoints and the ids this rank saw")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses: list[float] = []
    with Loader(
        a.endpoints.split(","),
        DATASET,
        batch_size=a.batch_size,
        rank=a.rank,
        world_size=a.world_size,
        seed=1234,
        shuffle=True,
        output="torch",
        columns=["id", "features", "label"],
        job=JOB,
        cursor_store=a.store,
        resume="latest" if a.resume else None,
    ) as loader:
        step = loader.resumed_from or 0  # the job step this rank's checkpoint is for
        if a.resume:
            mine = Path(a.ckpt_dir or out) / f"model-{step}.pt"
            net.load_state_dict(torch.load(mine if mine.exists() else a.init_model))
        with (out / "seen.jsonl").open("a") as seen:
            for batch in loader:
                step += 1
                x, y = batch["features"].float(), batch["label"].long()
                if len(y):
                    loss = torch.nn.functional.cross_entropy(net(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                seen.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
                seen.flush()
                if step % a.commit_every == 0 or step == a.stop_at:
                    torch.save(net.state_dict(), out / f"model-{step}.pt")  # the model checkpoint ...
                    loader.commit(step)  # ... and the data cursor describe the same step
                if step == a.die_at:
                    loader.flush_commits()
                    os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, threads and all
                if step == a.stop_at:
                    break
        loader.flush_commits()
    torch.save(net.state_dict(), out / "model-final.pt")
    (out / "summary.json").write_text(
        json.dumps({"steps": step, "first_loss": losses[:10], "last_loss": losses[-10:]})
    )
    return 0
