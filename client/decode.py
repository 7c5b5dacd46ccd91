"""A received Read message -> the items the prefetch thread queues: batch, provenance, next cursor.

Each item carries the cursor the Loader moves to once the item is handed to the training loop
(`cursor_math.cursor_after`), so a batch that was received but never handed over is read again after
a restart, and one handed over is never read twice. The message is checked against what was asked
for: its epoch, its steps in order, their global positions (the plan's, schedules included), their
rows, and where the epoch ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from shardstream.errors import DataLossError
from shardstream.order.cursor_math import cursor_after, is_last_step
from shardstream.order.scheduled_steps import Layout
from shardstream.v1 import shardstream_pb2 as pb

from .batch import DOCUMENTS, PROVENANCE, BatchInfo, PackedDocument, SkippedSample
from .convert import splitter
from .spec import ReadSpec

__all__ = ["Item", "decode_message", "empty_epoch"]


@dataclass
class Item:
    """One step for the training loop (or, without a batch, an epoch with no steps left)."""

    epoch: int
    next_epoch: int  # the cursor once this item is handed over
    next_offset: int
    dropped: int = 0  # samples drop_last left out of the epoch (on its last item)
    batch: Any = None
    info: BatchInfo | None = None


def empty_epoch(spec: ReadSpec, epoch: int, dropped: int) -> Item:
    """The item of an epoch with no steps left for this reader: only the cursor moves on."""
    return Item(epoch, epoch + 1, spec.epoch_start(epoch + 1), dropped)


def decode_message(
    spec: ReadSpec,
    epoch: int,
    layout: Layout,
    first_step: int,
    step_stride: int,
    header: pb.ReadHeader,
    batch: pa.RecordBatch,
) -> Iterator[Item]:
    """The items of one message whose steps must be first_step, first_step + step_stride, ...

    A generator: each step is made just before it is queued, so the prefetch thread never holds the
    GIL for a whole message of small steps while the training loop waits for it."""
    if header.epoch != epoch:
        raise DataLossError(f"server sent epoch {header.epoch}, expected {epoch}")
    spec.metrics.bytes.inc(batch.nbytes)
    covered = sum(st.rows for st in header.steps)
    if covered != batch.num_rows:
        raise DataLossError(f"message has {batch.num_rows} rows, its steps cover {covered}")
    # Per message, not per step: provenance as numpy, columns converted once and sliced per step.
    names = batch.schema.names
    prov = {c: batch.column(c).to_numpy() for c in PROVENANCE if c in names}
    documents = batch.column(DOCUMENTS) if DOCUMENTS in names else None
    if documents is not None:  # text.pack's "documents": BatchInfo's, never a data column
        batch = batch.drop_columns([DOCUMENTS])
    if not spec.provenance:
        batch = batch.drop_columns([c for c in PROVENANCE if c in names])
    split = splitter(batch, spec.output)
    row = 0
    for i, st in enumerate(header.steps):
        if st.step != first_step + i * step_stride:
            raise DataLossError(
                f"server sent step {st.step}, expected {first_step + i * step_stride} (epoch {epoch})"
            )
        planned = list(layout.global_range(st.step)) if st.step < layout.num_steps else "no such step"
        if [st.global_start, st.global_end] != planned:
            # e.g. a server that predates schedules, which ignores batch_schedule and skip ranges
            raise DataLossError(
                f"server sent positions [{st.global_start}, {st.global_end}) for step {st.step} of epoch {epoch}, "
                f"the plan says {planned} (is every server of the fleet up to date?)"
            )
        n = st.rows
        end = row + n
        info = BatchInfo(
            epoch=epoch,
            step=st.step,
            position_start=st.position_start,
            position_end=st.position_end,
            global_start=st.global_start,
            global_end=st.global_end,
            shards=prov["_shard"][row:end],
            rows=prov["_row"][row:end],
            sources=prov["_source"][row:end] if "_source" in prov else None,
            skipped=tuple(
                SkippedSample(s.position, s.shard, s.row, s.source if "_source" in prov else None, s.reason)
                for s in st.skipped
            ),
            documents=None if documents is None else _documents(documents.slice(row, n), "_source" in prov),
        )
        out = split(row, n)
        row = end
        if spec.pin_memory:
            out = {k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in out.items()}
        last = is_last_step(layout, st.step, spec.split)  # this reader's last step of the epoch
        if last and not (header.end_of_epoch and i == len(header.steps) - 1):
            raise DataLossError(f"step {st.step} ends epoch {epoch} but the server's stream goes on")
        yield Item(
            epoch, *cursor_after(layout, epoch, st.step, spec.split), header.dropped if last else 0, out, info
        )
    if header.end_of_epoch and not header.steps:
        yield empty_epoch(spec, epoch, header.dropped)


def _documents(column: Any, mixture: bool) -> tuple[tuple[PackedDocument, ...], ...]:
    """A step's `_documents` column as every row's documents."""
    return tuple(
        tuple(
            PackedDocument(d["shard"], d["row"], d["start"], d["end"], d["source"] if mixture else None)
            for d in docs or ()
        )
        for docs in column.to_pylist()
    )
