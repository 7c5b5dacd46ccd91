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

import numpy as np
import pyarrow as pa

from shardstream.errors import DataLossError
from shardstream.numpy_view import numpy_view
from shardstream.order.cursor_math import cursor_after, is_last_step
from shardstream.order.scheduled_steps import Layout
from shardstream.provenance import check, expand
from shardstream.v1 import shardstream_pb2 as pb

from .batch import DOCUMENTS, PROVENANCE, BatchInfo, PackedDocument, RowProvenance, SkippedSample
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
    GIL for a whole message of small steps while the training loop waits for it.

    Per message, not per step: the header's steps are read once, the provenance columns become
    numpy views (no copy) that each step slices (the header's runs instead: checked here, made into
    arrays when a batch's are first read), columns are converted once and sliced per step
    (convert.splitter). The message's size for the bytes counter is the size of its buffers
    (`get_total_buffer_size`, ~0.2 us; `nbytes` walks every buffer's referenced range: ~10 us)."""
    if header.epoch != epoch:
        raise DataLossError(f"server sent epoch {header.epoch}, expected {epoch}")
    spec.metrics.bytes.inc(batch.get_total_buffer_size())
    steps = list(header.steps)
    covered = sum(st.rows for st in steps)
    if covered != batch.num_rows:
        raise DataLossError(f"message has {batch.num_rows} rows, its steps cover {covered}")
    names = batch.schema.names
    at = {name: i for i, name in enumerate(names)}
    prov = {c: numpy_view(batch.column(at[c])) for c in PROVENANCE if c in at}
    shards, rows = prov.get("_shard"), prov.get("_row")  # (every message with steps has them, or:)
    runs = None
    if shards is None and header.HasField("provenance"):  # ReadRequest.provenance_in_header
        runs = _Runs(header.provenance, batch.num_rows)  # (checked now, made only if a batch's are read)
    elif shards is None and steps:
        raise DataLossError("the server sent rows without their provenance (no _shard/_row columns, no header provenance)")
    sources = prov.get("_source")
    mixture = sources is not None
    documents = batch.column(at[DOCUMENTS]) if DOCUMENTS in at else None
    # text.pack's "documents" is BatchInfo's, never a data column; the provenance columns stay only
    # when asked for
    keep = [
        i for i, name in enumerate(names) if name != DOCUMENTS and (spec.provenance or name not in PROVENANCE)
    ]
    if len(keep) != len(names):
        batch = batch.select(keep)
    split = splitter(batch, spec.output)
    num_steps = layout.num_steps
    last_index = len(steps) - 1
    row = 0
    for i, st in enumerate(steps):
        step = st.step
        if step != first_step + i * step_stride:
            raise DataLossError(
                f"server sent step {step}, expected {first_step + i * step_stride} (epoch {epoch})"
            )
        global_start, global_end = st.global_start, st.global_end
        planned = layout.global_range(step) if step < num_steps else None
        if planned is None or global_start != planned[0] or global_end != planned[1]:
            # e.g. a server that predates schedules, which ignores batch_schedule and skip ranges
            raise DataLossError(
                f"server sent positions [{global_start}, {global_end}) for step {step} of epoch {epoch}, "
                f"the plan says {'no such step' if planned is None else list(planned)} "
                "(is every server of the fleet up to date?)"
            )
        if spec.balance.mode is not None and not st.balanced:
            raise DataLossError(
                f"the server sent step {step} of epoch {epoch} unbalanced although balance={spec.balance.mode!r} "
                "was asked (is every server of the fleet up to date?)"
            )
        if st.balanced and st.step_cost > 0:
            spec.metrics.step_cost_ratio.observe(st.cost * spec.world_size / st.step_cost)
        n = st.rows
        end = row + n
        info = BatchInfo(
            epoch=epoch,
            step=step,
            position_start=st.position_start,
            position_end=st.position_end,
            global_start=global_start,
            global_end=global_end,
            provenance=(
                RowProvenance(runs, row, end)
                if runs is not None
                else RowProvenance.of(shards[row:end], rows[row:end])  # type: ignore[index]
            ),
            sources=sources[row:end] if mixture else None,
            skipped=_skipped(st.skipped, mixture) if st.skipped else (),
            documents=None if documents is None else _documents(documents.slice(row, n), mixture),
            tokens=st.tokens,
            step_tokens=st.step_tokens,
            cost=st.cost,
            step_cost=st.step_cost,
        )
        out = split(row, n)
        row = end
        if spec.pin_memory:
            out = {k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in out.items()}
        last = is_last_step(layout, step, spec.split)  # this reader's last step of the epoch
        if last and not (header.end_of_epoch and i == last_index):
            raise DataLossError(f"step {step} ends epoch {epoch} but the server's stream goes on")
        yield Item(epoch, *cursor_after(layout, epoch, step, spec.split), header.dropped if last else 0, out, info)
    if header.end_of_epoch and not steps:
        yield empty_epoch(spec, epoch, header.dropped)


class _Runs:
    """A message's provenance as its header names it (runs), made into arrays when first asked for."""

    __slots__ = ("_arrays", "_n", "_provenance")

    def __init__(self, provenance: pb.Provenance, n: int) -> None:
        check(provenance, n)
        self._provenance, self._n = provenance, n
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = expand(self._provenance, self._n)
        return self._arrays


def _skipped(skipped: Any, mixture: bool) -> tuple[SkippedSample, ...]:
    """A step's samples a server-side transform left out (on_error="skip")."""
    return tuple(
        SkippedSample(s.position, s.shard, s.row, s.source if mixture else None, s.reason) for s in skipped
    )


def _documents(column: Any, mixture: bool) -> tuple[tuple[PackedDocument, ...], ...]:
    """A step's `_documents` column as every row's documents."""
    return tuple(
        tuple(
            PackedDocument(d["shard"], d["row"], d["start"], d["end"], d["source"] if mixture else None)
            for d in docs or ()
        )
        for docs in column.to_pylist()
    )
