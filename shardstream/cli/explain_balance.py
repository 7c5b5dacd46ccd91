"""`shardstream explain --job` for a job read with balance= (shardstream/order/balance.py): which rank got
which of a step's samples, and why.

The split is the servers' own (server/read/balanced_layout.py): the step's samples and their costs —
the token counts of text.pack's "lengths" column, or the cost column — read from the registry's shards
(one number a sample), dealt by the same pure functions. Per rank: its positions (not a range), its
packed rows and their tokens with a label, its cost (Σ document-chunk length² of its rows, or Σ of its
samples' costs) and that cost over the step's mean: the figure a trainer's `step imbalance` panel shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardstream.errors import InvalidArgumentError
from shardstream.order.delivery import Selector
from shardstream.order.scheduled_steps import Layout
from shardstream.registry import Registry

__all__ = ["BalancedStep", "balanced_step"]

WHY = {
    "tokens": "the step's documents packed as one stream of {rows} rows of {seq_len} tokens, in global order, "
    "dealt in contiguous runs: every rank within one row of the others",
    "attention": "the step's documents packed as one stream of {rows} rows of {seq_len} tokens, dealt to even out "
    "each rank's Σ (document-chunk length)² (largest rows first, to the least loaded rank, one a rank a round)",
    "cost": "the step's samples partitioned by column {column!r} (largest first, each to the rank with the least "
    "cost so far): ranks get different numbers of samples and near-equal cost",
}


class BalancedStep:
    """A balanced job's step as every server splits it."""

    def __init__(self, layout: Any, step: int, why: str) -> None:
        self.layout = layout
        self.step = step
        self.why = why

    def positions(self, rank: int) -> np.ndarray:
        return np.asarray(self.layout.rank_positions(self.step, rank), dtype=np.int64)

    def rank(self, rank: int) -> dict[str, Any]:
        """A rank's share: rows and tokens (packed), cost, and cost over the step's mean."""
        cost, total = self.layout.cost(self.step, rank)
        world = self.layout.world_size
        out: dict[str, Any] = {
            "cost": cost,
            "cost_over_mean": round(cost / (total / world), 4) if total else 1.0,
        }
        window = self.layout.window(self.step, rank)
        if window is not None:
            out["rows"] = max(window.rows, window.pad_to)
            out["tokens"] = window.labels  # tokens with a label: its loss's terms
        return out

    def summary(self) -> dict[str, Any]:
        world = self.layout.world_size
        shares = [self.rank(r) for r in range(world)]
        costs = [s["cost"] for s in shares]
        mean = sum(costs) / world
        out: dict[str, Any] = {
            "mode": self.layout.mode,
            "why": self.why,
            "cost_max_over_mean": round(max(costs) / mean, 4) if mean else 1.0,
            "step_cost": sum(costs),
        }
        if "rows" in shares[0]:
            out["rows_per_rank"] = [s["rows"] for s in shares]
            out["step_tokens"] = sum(s["tokens"] for s in shares)
        return out


def balanced_step(
    reg: Registry, sel: Selector, balance: Mapping[str, Any], transforms: list[dict[str, Any]], layout: Layout, epoch: int, step: int
) -> BalancedStep:
    """The split of `step` of `layout` (an epoch's steps, as explain places them) for the recorded
    balance= and transforms, with the costs read from the registry's shards."""
    from shardstream.server.read.balanced_layout import BalancedLayout
    from shardstream.server.read.reader import DatasetReader, new_row_group_cache
    from shardstream.server.read.selection import cost_values

    mode = str(balance.get("mode"))
    pack = transforms[-1] if transforms and transforms[-1].get("op") == "text.pack" else None
    if mode == "cost":
        column, what, seq_len = str(balance.get("column")), "balance cost column", 0
    elif pack is not None and pack.get("lengths"):
        column, what, seq_len = str(pack["lengths"]), "text.pack lengths", int(pack["seq_len"])
    else:
        raise InvalidArgumentError(f'the job\'s balance="{mode}" has no text.pack with "lengths" among its recorded transforms')
    cache = new_row_group_cache(64 << 20)
    readers = [DatasetReader(m, [reg.shard_path(m, s.uri) for s in m.shards], cache) for m in sel.manifests]

    def costs(start: int, end: int) -> np.ndarray:
        src, rows = sel.order.select(epoch, np.arange(start, end, dtype=np.int64))
        return cost_values(readers, src, rows, column, mixture=sel.is_mixture, floats=mode == "cost", what=what)

    balanced = BalancedLayout(layout, mode=mode, costs=costs, seq_len=seq_len, pad_rows=bool(balance.get("pad_rows")))
    start, end = layout.global_range(step)
    samples = end - start
    why = WHY[mode].format(column=column, seq_len=seq_len, rows=balanced.step_rows(step))
    return BalancedStep(balanced, step, f"{samples} samples: {why}")
