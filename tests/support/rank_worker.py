"""A training rank as a process, for crash tests: python -m tests.rank_worker ARGS.

Appends one JSON line per consumed step to --log (flushed, so a SIGKILL loses nothing written) and
commits its cursor every --commit-every steps (checkpoint step numbers count from the job start).
"""

from __future__ import annotations

import argparse
import json
import sys

from shardstream.client import Loader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoints", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--commit-every", type=int, required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--log", required=True)
    p.add_argument("--pause-at", type=int, default=0, help="after this step, block until killed")
    a = p.parse_args()
    with (
        Loader(
            a.endpoints.split(","),
            "toy@1",
            batch_size=a.batch_size,
            rank=a.rank,
            world_size=a.world_size,
            seed=21,
            job=a.job,
            cursor_store=a.store,
            resume="latest" if a.resume else None,
        ) as ld,
        open(a.log, "a") as log,
    ):
        step = ld.resumed_from or 0
        for batch in ld:
            step += 1
            log.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
            log.flush()
            if step % a.commit_every == 0:
                ld.commit(step)
            if step == a.pause_at:
                ld.flush_commits()  # commits up to here have landed; the kill hits a running loader
                open(a.log + ".paused", "w").close()  # noqa: SIM115 — tells the test to kill us now
                sys.stdin.read()  # blocks: the test kills this process here (its threads keep running)
        ld.flush_commits()


if __name__ == "__main__":
    main()
