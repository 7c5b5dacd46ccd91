"""What the plan delivers, computed from the plan alone (pure: manifests in, arrays out).

`shardstream inspect` uses these to say which samples rank r gets at step t — the same functions
the server runs — and to report a shuffle configuration's read locality and mixing quality. Layouts
may be scheduled (batch-size phases, skip ranges: scheduled_layout.make_layout) and selectors mixture
phases (`make_selector(..., phases=...)`): the server's own objects either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardstream.manifest import Manifest
from shardstream.order.curriculum import MixtureSchedule
from shardstream.order.mixture import MixtureOrder, MixturePlan, SourceInfo
from shardstream.order.read_order import DatasetOrder, RowLocator, ShuffleSpec
from shardstream.order.scheduled_steps import Layout

__all__ = ["Selector", "StepSamples", "make_selector", "shuffle_stats", "step_samples"]

STATS_MAX_POSITIONS = 1_000_000  # stats look at this many positions at most (evenly spaced steps)


@dataclass(frozen=True)
class Selector:
    """A dataset or mixture, ready to turn epoch positions into (source, row)."""

    manifests: list[Manifest]
    order: DatasetOrder | MixtureOrder
    locators: list[RowLocator]
    label: str
    fingerprint: str

    @property
    def num_rows(self) -> int:
        return self.order.num_rows

    @property
    def is_mixture(self) -> bool:
        return isinstance(self.order, MixtureOrder)


def make_selector(
    manifests: Sequence[Manifest],
    weights: Sequence[float] | None,
    *,
    seed: int,
    shuffle: ShuffleSpec,
    mixture_block: int = 0,
    epoch_samples: int = 0,
    phases: Sequence[tuple[int, Sequence[float]]] | None = None,
) -> Selector:
    """A dataset (`weights` None), a mixture (`weights`), or mixture phases ([(position, weights)],
    weights aligned with `manifests`: curriculum.py)."""
    locators = [RowLocator([s.row_groups for s in m.shards], [s.masked for s in m.shards]) for m in manifests]
    orders = [
        DatasetOrder(m.fingerprint, loc.block_sizes, seed, shuffle)
        for m, loc in zip(manifests, locators, strict=True)
    ]
    if phases is not None:
        sched = MixtureSchedule(
            [SourceInfo(m.ref, m.fingerprint, m.num_rows, 0.0) for m in manifests],
            phases,
            seed,
            mixture_block,
            epoch_samples,
        )
        return Selector(
            list(manifests), MixtureOrder(sched, orders), locators, sched.label, sched.fingerprint
        )
    if weights is None:
        m = manifests[0]
        return Selector(list(manifests), orders[0], locators, m.ref, m.fingerprint)
    plan = MixturePlan(
        [SourceInfo(m.ref, m.fingerprint, m.num_rows, w) for m, w in zip(manifests, weights, strict=True)],
        seed,
        mixture_block,
        epoch_samples,
    )
    return Selector(list(manifests), MixtureOrder(plan, orders), locators, plan.label, plan.fingerprint)


@dataclass(frozen=True)
class StepSamples:
    epoch: int
    step: int
    rank: int
    num_steps: int
    global_range: tuple[int, int]
    positions: np.ndarray  # global positions in the epoch
    sources: np.ndarray  # index into Selector.manifests
    rows: np.ndarray  # row index in that source
    shards: np.ndarray  # shard index in that source's manifest
    shard_rows: np.ndarray  # row within the shard
    row_groups: np.ndarray  # row group within the shard


def step_samples(
    selector: Selector, layout: Layout, epoch: int, step: int, rank: int, positions: np.ndarray | None = None
) -> StepSamples:
    """The samples rank `rank` gets at `step`: its range of the layout, or `positions` (a balanced
    step's, which need not be a range)."""
    if positions is None:
        start, end = layout.rank_range(step, rank)
        positions = np.arange(start, end, dtype=np.int64)
    src, rows = selector.order.select(epoch, positions)
    shards = np.empty_like(rows)
    shard_rows = np.empty_like(rows)
    groups = np.empty_like(rows)
    for s in np.unique(src):
        sel = src == s
        sh, sr, rg, _ = selector.locators[int(s)].locate(rows[sel])
        shards[sel], shard_rows[sel], groups[sel] = sh, sr, rg
    return StepSamples(
        epoch,
        step,
        rank,
        layout.num_steps,
        layout.global_range(step),
        positions,
        src,
        rows,
        shards,
        shard_rows,
        groups,
    )


def shuffle_stats(selector: Selector, layout: Layout, epoch: int) -> dict[str, float | int]:
    """Locality (distinct row groups per rank batch) and mixing quality of one epoch.

    mean_displacement: mean |row - position| / N over the epoch (0 = stored order; ~1/3 for a
    uniform random permutation); adjacent_correlation: Pearson correlation of the rows at
    positions p and p+1 (1 = sequential, ~0 = well mixed). Both over single datasets only.
    """
    n = layout.num_rows
    steps = layout.num_steps
    if steps == 0:
        return {"steps": 0}
    per_step = layout.global_batch
    sample_steps = np.unique(
        np.linspace(0, steps - 1, num=min(steps, max(1, STATS_MAX_POSITIONS // per_step))).astype(int)
    )
    groups_per_batch = []
    positions_all = []
    rows_all = []
    for t in sample_steps:
        for r in range(layout.world_size):
            s = step_samples(selector, layout, epoch, int(t), r)
            if len(s.positions):
                keys = set(zip(s.sources.tolist(), s.shards.tolist(), s.row_groups.tolist(), strict=True))
                groups_per_batch.append(len(keys))
                positions_all.append(s.positions)
                rows_all.append(s.rows)
    out: dict[str, float | int] = {
        "steps": steps,
        "sampled_steps": len(sample_steps),
        "row_groups_per_batch_mean": float(np.mean(groups_per_batch)) if groups_per_batch else 0.0,
        "row_groups_per_batch_max": int(np.max(groups_per_batch)) if groups_per_batch else 0,
        "dropped": layout.dropped,
    }
    if not selector.is_mixture and positions_all:
        pos = np.concatenate(positions_all)
        rows = np.concatenate(rows_all)
        out["mean_displacement"] = float(np.mean(np.abs(rows - pos)) / max(1, n))
        if len(rows) > 2 and np.ptp(rows) > 0:
            # adjacent pairs inside each sampled stretch of consecutive positions
            same_run = np.diff(pos) == 1
            a, b = rows[:-1][same_run], rows[1:][same_run]
            if len(a) > 1 and np.std(a) > 0 and np.std(b) > 0:
                out["adjacent_correlation"] = float(np.corrcoef(a, b)[0, 1])
    return out
