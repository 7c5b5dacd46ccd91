"""The deterministic head of a pipeline: which transforms it holds, and running it over any rows.

A pipeline's first transforms whose `deterministic` is true (decode, resize, tokenize; not a random
crop or flip, not text.pack) map every input row to at most one output row that depends on that
row's values and the parameters alone. So their output for a row is the same whichever message,
stream or job the row travels in, and it can be computed once per row group and shared
(server/read/feature_cache.py). `Prefixed` is what the head made of some rows, in the form the pipeline
continues from: the output rows, the input row each comes from, and per transform of the head the
input rows it could not process with the reason — the same records a transform's `Result` gives,
in the rows' own numbering.

`PrefixSource` is what serves a message's head from such shared results (the pipeline only sees
this protocol, never the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from .base import BatchContext, Transform

__all__ = ["PrefixSource", "Prefixed", "deterministic_head", "run_prefix"]


@dataclass(frozen=True)
class Prefixed:
    """What the deterministic head made of n input rows."""

    batch: pa.RecordBatch  # the output rows
    index: np.ndarray  # int64, per output row: its input row (increasing)
    errors: list[list[tuple[int, str]]]  # per transform of the head: (input row, reason), rows ascending


class PrefixSource(Protocol):
    def prefix(self, batch: pa.RecordBatch, pool: Executor | None, threads: int) -> Prefixed | None:
        """The head's output for the rows of `batch` (data columns and provenance), or None when it
        cannot serve them (the pipeline then runs the head itself)."""
        ...


def deterministic_head(transforms: Sequence[Transform]) -> int:
    """How many of the first transforms are deterministic (and per sample)."""
    n = 0
    for t in transforms:
        if not (t.per_sample and t.deterministic):
            break
        n += 1
    return n


def run_prefix(
    transforms: Sequence[Transform], batch: pa.RecordBatch, pool: Executor | None = None, threads: int = 1
) -> Prefixed:
    """Apply `transforms` (a deterministic head) to the data columns of `batch`.

    The context has seed 0, epoch 0 and positions 0..n-1: a deterministic transform reads none of
    them, so the output equals what it makes of the same rows anywhere else."""
    n = batch.num_rows
    ctx = BatchContext(0, 0, np.arange(n, dtype=np.int64), np.zeros(n, np.int64), pool, threads)
    origin = np.arange(n, dtype=np.int64)  # input row of each current row
    errors: list[list[tuple[int, str]]] = []
    data = batch
    for t in transforms:
        ctx.positions, ctx.steps = origin, np.zeros(len(origin), np.int64)
        res = t.apply(data, ctx)
        errors.append(sorted((int(origin[i]), reason) for i, reason in res.errors))
        origin = origin[res.index]
        data = res.batch
    return Prefixed(data, origin, errors)
