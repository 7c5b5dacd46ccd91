"""A training rank as a process, for crash tests: python -m tests.support.rank_worker ARGS.

Appends one JSON line per consumed step to --log (flushed, so a SIGKILL loses nothing written) and
commits its cursor every --commit-every steps (checkpoint step numbers count from the job start;
with --wait, commit(step, wait=True)). With --pause-at N it creates LOG.paused after step N and
blocks until killed, or until a line arrives on its stdin (RankProcs.go): then it goes on, as a
process the scheduler forgot about would.

RankProcs starts such ranks (and kills them with their process group); steps_logged reads a log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from shardstream.client import Loader

__all__ = ["RankProcs", "main", "steps_logged"]

REPO = Path(__file__).resolve().parents[2]


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
    p.add_argument(
        "--pause-at", type=int, default=0, help="after this step, block until killed or told to go on"
    )
    p.add_argument("--wait", action="store_true", help="commit(step, wait=True)")
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
                ld.commit(step, wait=a.wait)
            if step == a.pause_at:
                ld.flush_commits()  # commits up to here have landed; the kill hits a running loader
                open(a.log + ".paused", "w").close()  # noqa: SIM115 — tells the test to kill us now
                sys.stdin.readline()  # blocks: the test kills this process here (its threads keep running) or lets it go on
        ld.flush_commits()


def steps_logged(log: Path) -> list[dict]:  # type: ignore[type-arg]
    """The records a rank appended to `log` (none if it never wrote one)."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class RankProcs:
    """Training ranks as processes (this module as a script); all killed at teardown."""

    def __init__(self, endpoints: list[str], store: str, job: str, every: int) -> None:
        self.base = [
            "--endpoints",
            ",".join(endpoints),
            "--job",
            job,
            "--store",
            store,
            "--commit-every",
            str(every),
        ]
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, rank: int, world: int, batch: int, log: Path, *extra: str, stderr: Path | None = None
    ) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "tests.support.rank_worker",
            *self.base,
            "--rank",
            str(rank),
            "--world-size",
            str(world),
            "--batch-size",
            str(batch),
            "--log",
            str(log),
            *extra,
        ]
        err = open(stderr, "wb") if stderr is not None else None  # noqa: SIM115 — the child holds it
        try:
            proc = subprocess.Popen(cmd, start_new_session=True, cwd=REPO, stdin=subprocess.PIPE, stderr=err)
        finally:
            if err is not None:
                err.close()
        self.procs.append(proc)
        return proc

    def go(self, proc: subprocess.Popen[bytes]) -> None:
        """Let a rank paused with --pause-at go on."""
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdin:
            proc.stdin.close()

    def close(self) -> None:
        for p in self.procs:
            self.kill(p)


if __name__ == "__main__":
    main()
