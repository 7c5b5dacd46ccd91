"""A step larger than the server's message cap arrives in parts: put it back together.

The server sends such a step as consecutive messages that each carry the same one StepInfo with
`part` = 0, 1, 2, ... and `more_parts` on all but the last (protos/shardstream/v1, StepInfo).
`StepParts.add` takes every message of a stream: a whole-step message comes back as it is; a part
is kept until the step's last one, which comes back as one message — one StepInfo with the rows and
skipped samples of all the parts, one record batch with their rows in order, and, where the parts'
headers name their rows' provenance (ReadHeader.provenance), the parts' runs joined — so the decoder
and the cursor only ever see whole steps. A stream that breaks mid-step is resumed at that step
(its session's next step moves only with whole steps), so `reset()` drops the parts received.
"""

from __future__ import annotations

import pyarrow as pa

from shardstream.errors import DataLossError
from shardstream.provenance import joined
from shardstream.v1 import shardstream_pb2 as pb

__all__ = ["StepParts"]

Message = tuple[pb.ReadHeader, pa.RecordBatch]  # a received message: its header and its rows


class StepParts:
    """The parts of the one step a stream is receiving in parts."""

    def __init__(self) -> None:
        self._header: pb.ReadHeader | None = None
        self._batches: list[pa.RecordBatch] = []
        self._provenance: list[pb.Provenance] = []  # each part's, where the header carries it

    def reset(self) -> None:
        self._header = None
        self._batches = []
        self._provenance = []

    def add(self, header: pb.ReadHeader, payload: pa.RecordBatch) -> Message | None:
        """The message to hand on (a whole step's, or a step whose last part this is); None while
        parts of the step are still to come."""
        part = header.steps[0] if len(header.steps) == 1 else None
        if part is None or not (part.part or part.more_parts):
            if self._header is not None:
                pending = self._header.steps[0]
                raise DataLossError(f"step {pending.step} ended after part {pending.part}")
            if part is None and any(st.part or st.more_parts for st in header.steps):
                raise DataLossError("a message with several steps carries a part of one")
            return header, payload
        if self._header is None:
            if part.part != 0:
                raise DataLossError(f"step {part.step} began with part {part.part}")
            self._header = pb.ReadHeader()
            self._header.CopyFrom(header)
            self._header.steps[0].rows = 0
        else:
            first = self._header.steps[0]
            if part.step != first.step or part.part != first.part + 1 or header.epoch != self._header.epoch:
                raise DataLossError(
                    f"expected part {first.part + 1} of step {first.step}, the server sent part "
                    f"{part.part} of step {part.step}"
                )
            first.part = part.part
            first.skipped.extend(part.skipped)
        self._batches.append(payload)
        if header.HasField("provenance"):  # (ReadRequest.provenance_in_header: each part names its own rows)
            self._provenance.append(header.provenance)
        whole = self._header.steps[0]
        whole.rows += part.rows
        if part.more_parts:
            return None
        out, batches, provenance = self._header, self._batches, self._provenance
        self.reset()
        step = out.steps[0]
        step.part = 0
        step.more_parts = False
        out.end_of_epoch, out.dropped = header.end_of_epoch, header.dropped  # the last part's
        if provenance:
            if len(provenance) != len(batches):
                raise DataLossError(f"step {step.step}: {len(provenance)} of its {len(batches)} parts name their rows' provenance")
            out.provenance.CopyFrom(joined(provenance))
        return out, _concat(batches)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The rows of `batches` (one schema) in order, as one record batch."""
    if len(batches) == 1:
        return batches[0]
    joined = pa.Table.from_batches(batches).combine_chunks().to_batches()
    return joined[0] if joined else batches[0]
