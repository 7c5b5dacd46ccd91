"""What the training loop learns about each batch: its positions and every row's provenance."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DOCUMENTS", "PROVENANCE", "BatchInfo", "PackedDocument", "SkippedSample"]

# The provenance columns a Read message carries (dropped from batches unless provenance=True); a
# stored-order stream sends `_shard`/`_row` in its headers instead (decode.py, ReadRequest.provenance_in_header).
PROVENANCE = ("_shard", "_row", "_source")
# text.pack's "documents": every document of each packed row (never a data column: BatchInfo.documents)
DOCUMENTS = "_documents"


@dataclass(frozen=True)
class PackedDocument:
    """One document of a packed row (text.pack with "documents": true): where it is stored and the
    tokens [start, end) of the row it fills (its EOS included)."""

    shard: int
    row: int
    start: int
    end: int
    source: int | None  # mixture source index (mixtures only)


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out of a batch because a transform could not process it (on_error="skip")."""

    position: int  # global position in the epoch's order
    shard: int
    row: int
    source: int | None  # mixture source index (mixtures only)
    reason: str


@dataclass(frozen=True)
class BatchInfo:
    """Where a batch came from: epoch, global positions, and each row's (source,) shard and row."""

    epoch: int
    step: int  # global step index in the epoch, counted from the stream's start offset
    position_start: int  # this rank's global positions [position_start, position_end)
    position_end: int
    global_start: int  # the global step's positions over all ranks
    global_end: int
    shards: np.ndarray  # int32 index into the manifest's shard list, per row
    rows: np.ndarray  # int64 row within the shard, per row
    sources: np.ndarray | None = None  # int32 index into the mixture's sources (mixtures only)
    # Samples of this step a server-side transform could not process (on_error="skip"): left out.
    skipped: tuple[SkippedSample, ...] = ()
    # text.pack with "documents": true: every document of each row, in token order (None otherwise)
    documents: tuple[tuple[PackedDocument, ...], ...] | None = None
    # balance="tokens": the step's tokens with a label (labels != -100) in this rank's rows and in
    # every rank's (the terms of the loss). A
    # trainer that averages its loss over its own tokens weights it by tokens * world_size /
    # step_tokens, so that the all-reduced mean is the mean over the step's tokens (docs/transforms.md, Balanced steps).
    tokens: int = 0
    step_tokens: int = 0
    # with balance: this rank's cost of the step (Σ chunk length² of its rows, or its samples' cost
    # column) and every rank's: cost * world_size / step_cost is its load against the step's mean
    cost: float = 0.0
    step_cost: float = 0.0
