"""The rank simulator's sample check (`python -m loadtest.scale`): every global step's samples exactly
once, and a resumed job replays the very samples it took before — as the chaos runs judge a job
(loadtest/chaos_job.py), adapted to steps that every rank of the job takes together.

Each simulated rank (loadtest/scale_ranks.py) answers the `id`s of every batch it took (the generated
dataset's `id` is its row index: loadtest/common.py write_vectors), numbered by the job's step:
1 is the first batch of the job, a Loader resumed from the committed step S takes S + 1 next. The
driver gathers them here (`add`) and judges them (`judge`) against two things:

- the plan, computed as the servers compute it (shardstream/order: `make_selector` over the manifest,
  `StepLayout.rank_range`): step s is global step s - 1 of an endless run, epoch (s - 1) // E of E
  steps, and rank r's samples there are the plan's rows at its range of the layout. `wrong`: ids a
  rank got other than the plan's at their place; `lost`: ids of a step taken by some rank that no
  rank got; `duplicated`: ids a step held beyond once.
- the data alone, without the plan: every epoch whose every step was taken holds each row of the
  dataset exactly once (`epochs_exactly_once`), and a step taken again after a resume (restart,
  scaleout: the steps after the committed one are replayed) holds the same ids in the same order
  as the first time (`replay_mismatches`); every rank's steps run from 1 without a hole (`gaps`:
  none skipped between the committed step and the resumed one).

The answers stay small: 4 ids a step at the default --batch-size, 5–6 bytes of JSON each; a 10-step
phase's answers are 99 KiB in all at 200 ranks (measured, the rows' `answer_kib`), about half of it ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shardstream.manifest import Manifest
from shardstream.order.delivery import make_selector
from shardstream.order.read_order import ShuffleSpec, StepLayout

__all__ = ["SampleLog", "SampleReport"]


@dataclass
class SampleReport:
    """What the ranks took, judged (see the module docstring); `exactly_once` and `replays_identical`
    are the simulator's checks."""

    steps: int = 0  # global steps some rank took
    samples: int = 0  # ids taken, replays included
    replayed: int = 0  # (rank, step) batches taken again after a resume
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    whole_epochs: int = 0
    epochs_exactly_once: bool = True
    replay_mismatches: int = 0
    gaps: int = 0  # ranks whose steps are not 1..last without a hole
    problems: list[str] = field(default_factory=list)  # the first few, for a reader

    @property
    def exactly_once(self) -> bool:
        return (
            self.steps > 0
            and self.lost == 0
            and self.duplicated == 0
            and self.wrong == 0
            and self.epochs_exactly_once
        )

    @property
    def replays_identical(self) -> bool:
        return self.replay_mismatches == 0 and self.gaps == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "exactly_once": self.exactly_once,
            "replays_identical": self.replays_identical,
        }


class SampleLog:
    """Every (rank, step)'s ids as first taken; replays compared with them as they come in."""

    MAX_PROBLEMS = 10

    def __init__(
        self, manifest: Manifest, world_size: int, batch_size: int, *, seed: int, shuffle: str
    ) -> None:
        self.world_size = world_size
        self.batch_size = batch_size
        self.num_rows = manifest.num_rows
        self.layout = StepLayout(self.num_rows, 0, world_size, batch_size)
        if self.num_rows % self.layout.global_batch:
            raise ValueError(
                f"{self.num_rows} rows are not whole steps of {world_size} ranks x {batch_size} samples"
            )
        self.selector = make_selector([manifest], None, seed=seed, shuffle=ShuffleSpec.parse(shuffle))
        self.taken: dict[tuple[int, int], list[int]] = {}
        self.report = SampleReport()

    def _problem(self, text: str) -> None:
        if len(self.report.problems) < self.MAX_PROBLEMS:
            self.report.problems.append(text)

    def add(self, answers: Iterable[dict[str, Any]]) -> None:
        """The rank processes' answers to one command: ranks with `ids` (a list a batch) from `first_step`."""
        for answer in answers:
            for r in answer.get("ranks", []):
                for i, ids in enumerate(r.get("ids") or []):
                    key = (r["rank"], r["first_step"] + i)
                    self.report.samples += len(ids)
                    before = self.taken.setdefault(key, ids)
                    if before is ids:
                        continue
                    self.report.replayed += 1
                    if before != ids:
                        self.report.replay_mismatches += 1
                        self._problem(f"rank {key[0]} step {key[1]}: took {ids}, before {before}")

    def expected(self, step: int) -> np.ndarray:
        """The plan's rows at job step `step` (1 = the first), rank by rank: (world_size, batch_size)."""
        epoch, k = divmod(step - 1, self.layout.num_steps)
        start, end = self.layout.global_range(k)
        _, rows = self.selector.order.select(epoch, np.arange(start, end, dtype=np.int64))
        return np.asarray(rows, np.int64).reshape(self.world_size, self.batch_size)

    def judge(self) -> SampleReport:
        t = self.report
        by_step: dict[int, dict[int, list[int]]] = {}
        for (rank, step), ids in self.taken.items():
            by_step.setdefault(step, {})[rank] = ids
        t.steps = len(by_step)
        for step in sorted(by_step):
            want = self.expected(step)
            got = by_step[step]
            ids = np.concatenate([np.asarray(v, np.int64) for v in got.values()])
            uniq = np.unique(ids)
            t.duplicated += len(ids) - len(uniq)
            t.lost += len(np.setdiff1d(want.ravel(), uniq))
            for rank, v in got.items():
                w, a = want[rank], np.asarray(v, np.int64)
                n = min(len(w), len(a))
                bad = int((a[:n] != w[:n]).sum()) + abs(len(a) - len(w))
                if bad:
                    t.wrong += bad
                    self._problem(f"rank {rank} step {step}: took {v}, the plan's {w.tolist()}")
        # Without the plan: an epoch whose every step was taken holds every row exactly once.
        per_epoch = self.layout.num_steps
        for e in sorted({(s - 1) // per_epoch for s in by_step}):
            steps = range(e * per_epoch + 1, (e + 1) * per_epoch + 1)
            if not all(s in by_step for s in steps):
                continue
            t.whole_epochs += 1
            ids = np.sort(
                np.concatenate([np.asarray(v, np.int64) for s in steps for v in by_step[s].values()])
            )
            if not np.array_equal(ids, np.arange(self.num_rows, dtype=np.int64)):
                t.epochs_exactly_once = False
                self._problem(
                    f"epoch {e}: {len(ids)} ids, {len(np.unique(ids))} distinct, of {self.num_rows} rows"
                )
        steps_of: dict[int, list[int]] = {}
        for rank, step in self.taken:
            steps_of.setdefault(rank, []).append(step)
        for rank, steps_taken in steps_of.items():
            if sorted(steps_taken) != list(range(1, len(steps_taken) + 1)):
                t.gaps += 1
                self._problem(
                    f"rank {rank}: steps {sorted(steps_taken)[:3]}… not 1..{len(steps_taken)} without a hole"
                )
        return t
