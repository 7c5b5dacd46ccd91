"""A training rank that reads through DataLoader workers, as a process: python -m tests.support.torch_rank CONFIG.

CONFIG is JSON: endpoints, rank, world_size, batch_size (an int or phases), seed, epochs, workers,
job, store, commit_every, resume (None, "latest" or a step), log, pause_at, and optional skip_steps. The rank iterates
`ShardStreamDataset(...).dataloader(num_workers=workers)` with the job's cursors, appends one JSON line
per step handed to it to `log` (flushed), commits every `commit_every` steps with wait=True, and after
step `pause_at` creates LOG.paused and blocks, its DataLoader workers still prefetching, until the
test kills its process group (`kill_group`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["kill_group", "main", "start_rank", "wait_paused"]

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    from shardstream.client.torch_dataset import ShardStreamDataset

    c = json.loads(sys.argv[1])
    ds = ShardStreamDataset(
        c["endpoints"],
        "toy@1",
        batch_size=[tuple(p) for p in c["batch_size"]]
        if isinstance(c["batch_size"], list)
        else c["batch_size"],
        rank=c["rank"],
        world_size=c["world_size"],
        seed=c["seed"],
        epochs=c["epochs"],
        columns=["id"],
        skip_steps=[tuple(r) for r in c.get("skip_steps", [])] or None,
        job=c["job"],
        cursor_store=c["store"],
        resume=c["resume"],
    )
    extra = {"multiprocessing_context": "spawn"} if c["workers"] else {}
    with ds, open(c["log"], "a") as log:
        step = ds.resumed_from or 0
        for batch in ds.dataloader(num_workers=c["workers"], **extra):
            step += 1
            log.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
            log.flush()
            if step % c["commit_every"] == 0:
                ds.commit(step, wait=True)
            if step == c.get("pause_at"):
                open(c["log"] + ".paused", "w").close()  # noqa: SIM115 — the test kills us now
                sys.stdin.readline()


def start_rank(config: dict[str, Any]) -> subprocess.Popen[bytes]:
    """This module as a process in its own session (its DataLoader workers join its process group)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.torch_rank", json.dumps(config)],
        start_new_session=True,
        cwd=REPO,
        stdin=subprocess.PIPE,
    )


def wait_paused(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 180.0) -> None:
    """Until the rank paused (LOG.paused exists); AssertionError if it exited or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while not Path(str(log) + ".paused").exists():
        assert proc.poll() is None, f"the rank exited with {proc.returncode} before pausing"
        assert time.monotonic() < deadline, "the rank did not pause in time"
        time.sleep(0.05)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the rank and its DataLoader workers (its process group); reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    if proc.stdin:
        proc.stdin.close()


if __name__ == "__main__":
    main()
