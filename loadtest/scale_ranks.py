"""Many simulated ranks in one process, for the rank simulator (`python -m loadtest.scale`).

    python -m loadtest.scale_ranks CONFIG.json      # then JSON commands on stdin, one a line

CONFIG names the ranks this process holds (`ranks`: a list of rank numbers of one job of
`world_size`), the dataset, the job, the cursor store URL and the Loader options (small batches,
short prefetch: the simulator measures the control paths, not bandwidth). Each rank is a real
`Loader` — its own Flight stream, its own cursor-store connection, its own prefetch and commit
threads — driven by a thread of its own, so a few hundred ranks fit in one process on 2 cores:
their training steps are `time.sleep`, which frees the GIL as a GPU step does.

The driver (loadtest/scale.py) writes one command a line; every rank runs it at once, and the
process answers one JSON line on stdout when all have finished:

    {"op": "open", "endpoints": [...], "resume": null | "latest"}
        close what is open, build every rank's Loader, take its first batch (timed from before
        the Loader is built: discovery, the resume's store read and the first message)
    {"op": "steps", "steps": N, "step_s": S, "commit_every": K}
        N training steps: next() (timed), sleep S, and every K-th step commit(step) (timed: the
        call; the store write happens on the commit thread)
    {"op": "ckptload", "endpoints": [...], "job": J, "step": S, "ranks": N, "tensors": {name:
     [shape, dtype]}, "digest": HEX}
        the job's ranks below N each load checkpoint J@S with their own Checkpointer (timed: the
        manifest and every chunk, each verified against its name), all at once; the ranks of a
        process load into one set of arrays (allocated once: the simulator measures the fleet's
        fan-out, not this host's memory) whose sha256 the process checks after
    {"op": "close"}        flush and close every Loader
    {"op": "exit"}

Answers hold per-rank figures: latencies (seconds), errors (repr, none expected beyond the
Loader's own retries), the first batch's (epoch, position) and `resumed_from`, failovers; and, for
`open` and `steps`, the samples taken: `ids` (the `id`s of each batch, a list a batch) from the job's
step `first_step` (1: the job's first batch; a Loader resumed from step S takes S + 1 first), which
the driver checks for exactly once and identical replays (loadtest/scale_samples.py). Answers are
compact JSON (no spaces); measured: 99 KiB in all for the 4 answers of a 10-step phase at 200
ranks, about half of it ids (~5 bytes an id): ~0.5 MiB at 1,000 ranks (`answer_kib` in scale's rows).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import REGISTRY

from shardstream.client import Loader
from shardstream.client.checkpoint import Checkpointer

__all__ = ["RankSet", "main"]

log = logging.getLogger("loadtest.scale_ranks")


def _counter(name: str) -> float:
    """A client counter of this process (e.g. shardstream_client_failovers), summed over its ranks."""
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == name:
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


COUNTERS = {
    "failovers": "shardstream_client_failovers",
    "commit_failures": "shardstream_client_cursor_commit_failures",
}


def _ids(batch: dict[str, Any]) -> list[int]:
    """The `id`s of a batch (the Loader's numpy output: a dict of columns)."""
    ids: list[int] = np.asarray(batch["id"]).tolist()
    return ids


class RankSet:
    """The ranks of one process: one Loader and one iterator each, run in parallel by a pool."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.ranks: list[int] = list(cfg["ranks"])
        self.loaders: dict[int, Loader] = {}
        self.iters: dict[int, Any] = {}
        self.steps: dict[int, int] = dict.fromkeys(self.ranks, 0)  # batches taken by each rank's job
        self.pool = ThreadPoolExecutor(max_workers=len(self.ranks), thread_name_prefix="rank")

    def _all(self, fn: Any) -> dict[str, Any]:
        """Run fn(rank) -> dict on every rank at once (a barrier first); gather the answers."""
        barrier = threading.Barrier(len(self.ranks))

        def one(r: int) -> dict[str, Any]:
            barrier.wait()
            try:
                return {"rank": r, **fn(r)}
            except Exception as exc:  # reported, never swallowed: the driver counts it
                log.error("rank %d: %s", r, traceback.format_exc())
                return {"rank": r, "error": f"{type(exc).__name__}: {exc}"}

        c0 = {k: _counter(m) for k, m in COUNTERS.items()}
        out = list(self.pool.map(one, self.ranks))
        return {"ranks": out, **{k: _counter(m) - c0[k] for k, m in COUNTERS.items()}}

    def open(self, endpoints: list[str], resume: str | None) -> dict[str, Any]:
        self.close()
        c = self.cfg

        def one(r: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            loader = Loader(
                endpoints,
                c["dataset"],
                batch_size=c["batch_size"],
                rank=r,
                world_size=c["world_size"],
                seed=0,
                shuffle="block",
                epochs=None,
                prefetch=c["prefetch"],
                max_message_bytes=c["max_message_bytes"],
                timeout_s=c["timeout_s"],
                job=c["job"],
                cursor_store=c["store"],
                resume=resume,
            )
            self.loaders[r] = loader
            it = self.iters[r] = iter(loader)
            batch = next(it)
            latency = time.perf_counter() - t0
            info = loader.last_batch
            assert info is not None
            self.steps[r] = (loader.resumed_from or 0) + 1 if resume else 1
            return {
                "latency_s": latency,
                "epoch": info.epoch,
                "position": info.position_start,
                "resumed_from": loader.resumed_from,
                "first_step": self.steps[r],
                "ids": [_ids(batch)],
            }

        return self._all(one)

    def run_steps(self, steps: int, step_s: float, commit_every: int) -> dict[str, Any]:
        def one(r: int) -> dict[str, Any]:
            if r not in self.iters:
                return {"not_open": True}  # its open failed: that error was reported once
            it, loader = self.iters[r], self.loaders[r]
            waits: list[float] = []
            commits: list[float] = []
            ids: list[list[int]] = []
            first = self.steps[r] + 1
            for _ in range(steps):
                t0 = time.perf_counter()
                batch = next(it)
                waits.append(time.perf_counter() - t0)
                ids.append(_ids(batch))
                self.steps[r] += 1
                time.sleep(step_s)
                if commit_every and self.steps[r] % commit_every == 0:
                    t0 = time.perf_counter()
                    loader.commit(self.steps[r])  # the step of the checkpoint saved after it
                    commits.append(time.perf_counter() - t0)
            return {"waits_s": waits, "commits_s": commits, "step": self.steps[r], "first_step": first, "ids": ids}

        return self._all(one)

    def load_checkpoint(
        self, endpoints: list[str], job: str, step: int, ranks: int, tensors: dict[str, Any], digest: str
    ) -> dict[str, Any]:
        # this process's ranks load into one set of arrays (name -> [shape, dtype])
        arrays = {name: np.empty(shape, dtype) for name, (shape, dtype) in tensors.items()}

        def one(r: int) -> dict[str, Any]:
            if r >= ranks:
                return {"skipped": True}
            t0 = time.perf_counter()
            with Checkpointer(endpoints, job=job, rank=r, world_size=self.cfg["world_size"]) as ck:
                ck.load(step, into=arrays, verify=True)
            return {"load_s": time.perf_counter() - t0}

        out = self._all(one)
        h = hashlib.sha256()
        for name in sorted(arrays):
            h.update(arrays[name].tobytes())
        loaded = any(r in self.ranks for r in range(ranks))
        out["content_ok"] = not loaded or h.hexdigest() == digest
        return out

    def close(self) -> dict[str, Any]:
        if not self.loaders:
            return {"ranks": [], "failovers": 0.0}

        def one(r: int) -> dict[str, Any]:
            t0 = time.perf_counter()
            loader = self.loaders.pop(r, None)
            self.iters.pop(r, None)
            if loader is not None:
                loader.close()
            return {"latency_s": time.perf_counter() - t0}

        return self._all(one)


def cfg_nice(path: str) -> int:
    return int(json.loads(Path(path).read_text()).get("nice", 0))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m loadtest.scale_ranks CONFIG.json", file=sys.stderr)
        return 2
    # The ranks stand for trainers on other hosts: here they yield the 2 cores to the fleet they
    # measure (servers, Redis), which would otherwise get 1/1000th of the CPU among their threads.
    os.nice(cfg_nice(args[0]))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ranks = RankSet(json.loads(Path(args[0]).read_text()))
    out = sys.stdout
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "open":
            answer = ranks.open(cmd["endpoints"], cmd.get("resume"))
        elif op == "steps":
            answer = ranks.run_steps(cmd["steps"], cmd["step_s"], cmd.get("commit_every", 0))
        elif op == "ckptload":
            answer = ranks.load_checkpoint(
                cmd["endpoints"], cmd["job"], cmd["step"], cmd["ranks"], cmd["tensors"], cmd["digest"]
            )
        elif op == "close":
            answer = ranks.close()
        elif op == "exit":
            ranks.close()
            break
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer, separators=(",", ":")), file=out, flush=True)
    ranks.pool.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
