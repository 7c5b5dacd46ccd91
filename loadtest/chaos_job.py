"""The chaos driver's side of a training job: its trainer processes phase by phase, their logs, the tally.

    job = Job(workdir / "kill9", TrainerConfig(...))
    phase = job.start([[0], [1], [2], [3]])   # a phase: one process per list of ranks (loadtest/chaos_rank.py)
    phase.wait_step(40)                       # until every rank of the phase has logged step 40
    phase.kill()                              # SIGKILL, process groups; or phase.wait_exit()
    job.start([[0, 1]], resume=True)          # the next phase resumes the job (world size may change)
    tally = job.tally(plan)                   # what the job delivered, judged against the plan

The tally follows the training job's trajectory: a phase that resumed at step S discards what earlier
phases delivered after S (those steps were lost with the model state of the killed processes, and are
counted as `replayed`), then every (epoch, global position) of the plan must be delivered exactly
once with the sample the plan puts there (its key, see chaos_rank.py). Reported: samples delivered,
lost (expected but never delivered; None when the job ended with a typed error), duplicated (beyond
once), wrong (a sample other than the plan's), the longest wait for one batch (the first batch of
every process apart: start-up), the failovers of all processes, and how each phase resumed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.order.delivery import Selector, make_selector
from shardstream.order.read_order import ShuffleSpec
from shardstream.server.backends.roots import open_registry

from .chaos_rank import KEY_STRIDE, TrainerConfig

__all__ = ["Job", "Phase", "Plan", "Tally", "plan_of"]

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.02
DEFAULT_WAIT_S = 300.0
KILL_WAIT_S = 30.0


@dataclass(frozen=True)
class Plan:
    """What a job must deliver: the plan's sample at every position of `epochs` epochs."""

    selector: Selector
    epochs: int

    def keys(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        src, rows = self.selector.order.select(epoch, positions)
        return np.asarray(src, np.int64) * KEY_STRIDE + np.asarray(rows, np.int64)


def plan_of(root: str, dataset: str | Mapping[str, float], *, seed: int, shuffle: str, epochs: int) -> Plan:
    """The plan of a dataset or mixture under `root`, as a Loader with these options reads it."""
    refs = [dataset] if isinstance(dataset, str) else list(dataset)
    weights = None if isinstance(dataset, str) else list(dataset.values())
    with open_registry(root) as reg:
        manifests = [reg.resolve(r) for r in refs]
    return Plan(make_selector(manifests, weights, seed=seed, shuffle=ShuffleSpec.parse(shuffle)), epochs)


class _Log:
    """One rank's log file, read as it grows (a partial last line waits for its end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self._rest = b""

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        new = [json.loads(ln) for ln in lines if ln]
        self.records += new
        return new


class Phase:
    """The processes of one phase of a job."""

    def __init__(self, job: Job, number: int, ranks: list[int], procs: list[subprocess.Popen[bytes]]) -> None:
        self.job = job
        self.number = number
        self.ranks = ranks
        self.procs = procs
        self.started_at = time.monotonic()

    def records(self, rank: int) -> list[dict[str, Any]]:
        self.job.poll()
        return [r for r in self.job.logs[rank].records if r["phase"] == self.number]

    def step(self, rank: int) -> int | None:
        """The last step `rank` logged in this phase (None before its first)."""
        steps = [r["s"] for r in self.records(rank) if "s" in r]
        return steps[-1] if steps else None

    def finished(self, rank: int) -> bool:
        """`rank` read to the end of its epochs or ended with an error (chaos_rank.py's last records)."""
        return any("end" in r or ("error" in r and "start" not in r) for r in self.records(rank))

    def wait(
        self,
        cond: Callable[[], bool],
        what: str,
        timeout_s: float = DEFAULT_WAIT_S,
        *,
        exits_ok: bool = False,
    ) -> None:
        """Until `cond()`; fails naming `what` when it times out or (unless `exits_ok`) a process of the
        phase exits first."""
        deadline = time.monotonic() + timeout_s
        while not cond():
            exited = [p.returncode for p in self.procs if p.poll() is not None]
            if exited and not exits_ok and not cond():
                raise RuntimeError(
                    f"{self.job.name} phase {self.number}: a trainer exited ({exited}) before {what}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.job.name} phase {self.number}: no {what} after {timeout_s:g} s")
            time.sleep(POLL_S)

    def wait_step(self, step: int, ranks: list[int] | None = None, timeout_s: float = DEFAULT_WAIT_S) -> None:
        ranks = self.ranks if ranks is None else ranks
        self.wait(lambda: all((self.step(r) or 0) >= step for r in ranks), f"step {step}", timeout_s)

    def wait_held(self, timeout_s: float = DEFAULT_WAIT_S) -> None:
        self.wait(
            lambda: all(any("held" in x for x in self.records(r)) for r in self.ranks), "hold", timeout_s
        )

    def progress(self) -> float:
        """The share of the job's epochs the slowest rank of this phase has read (0..1)."""
        plan = self.job.plan
        if plan is None:
            return 0.0
        total = plan.epochs * plan.selector.num_rows
        done = []
        for r in self.ranks:
            last = [x for x in self.records(r) if "s" in x]
            done.append(0 if not last else last[-1]["e"] * plan.selector.num_rows + last[-1]["p"][1])
        return min(done) / total if total else 0.0

    def wait_exit(self, timeout_s: float = DEFAULT_WAIT_S) -> list[int]:
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise TimeoutError(
                    f"{self.job.name} phase {self.number}: trainers still running after {timeout_s:g} s"
                ) from None
        self.job.poll()
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=KILL_WAIT_S)
        self.job.poll()


class Job:
    """A training job's trainer processes over its phases (module docstring)."""

    def __init__(self, workdir: Path, base: TrainerConfig, plan: Plan | None = None) -> None:
        self.workdir = workdir
        self.name = workdir.name
        self.base = dataclasses.replace(base, log_dir=str(workdir / "logs"))
        self.plan = plan
        self.phases: list[Phase] = []
        self.logs: dict[int, _Log] = {}
        shutil.rmtree(workdir, ignore_errors=True)  # a job starts with no logs
        (workdir / "logs").mkdir(parents=True)

    def start(self, groups: list[list[int]], **changes: Any) -> Phase:
        """A new phase: one trainer process per group of ranks, with `changes` to the base config."""
        number = len(self.phases)
        procs = []
        for i, ranks in enumerate(groups):
            cfg = dataclasses.replace(self.base, ranks=ranks, phase=number, **changes)
            for r in ranks:
                self.logs.setdefault(r, _Log(Path(cfg.log_dir) / f"rank-{r}.jsonl"))
            path = cfg.dump(self.workdir / f"p{number}-{i}.json")
            with (self.workdir / f"p{number}-{i}.out").open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "loadtest.chaos_rank", str(path)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        cwd=REPO,
                        env={**os.environ, **cfg.env},
                    )
                )
        phase = Phase(self, number, [r for g in groups for r in g], procs)
        self.phases.append(phase)
        return phase

    def kill(self) -> None:
        for phase in self.phases:
            phase.kill()

    def poll(self) -> None:
        for log in self.logs.values():
            log.poll()

    def output(self, phase: int, lines: int = 20) -> str:
        """The tail of a phase's process output (tracebacks)."""
        out = []
        for path in sorted(self.workdir.glob(f"p{phase}-*.out")):
            out += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def tally(self) -> Tally:
        assert self.plan is not None, "a job without a plan has nothing to be judged against"
        self.poll()
        return tally(self.plan, [rec for log in self.logs.values() for rec in log.records], len(self.phases))


@dataclass
class Tally:
    delivered: int = 0
    replayed: int = 0
    lost: int | None = None
    duplicated: int = 0
    wrong: int = 0
    max_stall_s: float = 0.0
    failovers: int = 0
    retries: int = 0
    complete: bool = False  # every rank of the last phase read to the end of the epochs
    errors: list[str] = field(default_factory=list)  # typed errors that ended ranks: "Class: message"
    resumes: dict[str, int] = field(default_factory=dict)  # how phases started: fresh, store, checkpoint
    resume_errors: list[str] = field(default_factory=list)  # typed errors a resume met (and what it did)
    commit_failures: int = 0
    problems: list[str] = field(default_factory=list)  # the job's own inconsistencies (ranks resumed apart)

    @property
    def exact(self) -> bool:
        return (
            self.complete
            and self.lost == 0
            and self.duplicated == 0
            and self.wrong == 0
            and not self.problems
        )


def tally(plan: Plan, records: list[dict[str, Any]], phases: int) -> Tally:
    """Judge a job's records (every rank's log, every phase) against its plan: see the module docstring."""
    t = Tally()
    by_phase: dict[int, list[dict[str, Any]]] = {p: [] for p in range(phases)}
    for rec in records:
        by_phase[rec["phase"]].append(rec)
    kept: list[dict[str, Any]] = []
    failovers: dict[tuple[int, int], int] = {}
    how: Counter[str] = Counter()
    for p in range(phases):
        recs = by_phase[p]
        starts = {r["start"] for r in recs if "start" in r and r["start"] is not None}
        if len(starts) > 1:
            t.problems.append(f"phase {p}: ranks resumed at different steps {sorted(starts)}")
        how.update({r["how"] for r in recs if "how" in r})
        if starts:
            s0 = min(starts)
            t.replayed += sum(r["p"][1] - r["p"][0] for r in kept if r["s"] > s0)
            kept = [r for r in kept if r["s"] <= s0]
        seen: set[int] = set()
        for r in recs:
            if "f" in r:
                key = (p, r["rank"])
                failovers[key] = max(failovers.get(key, 0), r["f"])
            if "s" in r:
                if r["rank"] in seen:  # the first batch of a process is its start-up, not a stall
                    t.max_stall_s = max(t.max_stall_s, r["w"])
                seen.add(r["rank"])
                kept.append(r)
            elif "start" in r:
                if r.get("error"):
                    t.resume_errors.append(r["error"])
            elif "end" in r:
                t.retries += r.get("retries", 0)
            elif "commit_failed" in r:
                t.commit_failures += 1
            elif "error" in r:
                t.errors.append(f"{r['error']}: {r.get('message', '')}")
    t.resumes = dict(how)
    t.failovers = sum(failovers.values())
    last = by_phase.get(phases - 1, [])
    ranks_last = {r["rank"] for r in last}
    t.complete = bool(ranks_last) and all(any("end" in r for r in last if r["rank"] == k) for k in ranks_last)
    _count(plan, kept, t)
    return t


def _count(plan: Plan, kept: list[dict[str, Any]], t: Tally) -> None:
    n = plan.selector.num_rows
    if not kept:
        t.lost = plan.epochs * n if t.complete else None
        return
    gpos, keys, wrong = [], [], 0
    for e in sorted({r["e"] for r in kept}):
        recs = [r for r in kept if r["e"] == e]
        pos = np.concatenate([np.arange(r["p"][0], r["p"][1], dtype=np.int64) for r in recs])
        got = np.concatenate([np.asarray(r["k"], np.int64) for r in recs])
        if len(got) != len(pos):
            t.problems.append(f"epoch {e}: {len(got)} keys for {len(pos)} positions")
            continue
        wrong += int((got != plan.keys(e, pos)).sum())
        gpos.append(pos + e * n)
        keys.append(got)
    allpos = np.concatenate(gpos) if gpos else np.empty(0, np.int64)
    uniq, counts = np.unique(allpos, return_counts=True)
    t.delivered = len(allpos)
    t.duplicated = int((counts - 1).sum())
    t.wrong = wrong
    t.lost = plan.epochs * n - len(uniq[uniq < plan.epochs * n]) if t.complete else None
