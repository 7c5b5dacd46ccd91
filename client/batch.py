"""What the training loop learns about each batch: its positions and every row's provenance."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["DOCUMENTS", "PROVENANCE", "BatchInfo", "PackedDocument", "RowProvenance", "SkippedSample"]

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


class RowProvenance:
    """Rows [start, stop) of a message's provenance: each row's shard (int32, its index in the
    version's manifest) and row in that shard (int64). A message whose header names them as runs
    (ReadHeader.provenance) makes the arrays the first time a batch's are read, once for all its
    batches; a message's columns are read as they are (`of`)."""

    __slots__ = ("_arrays", "_make", "start", "stop")

    def __init__(self, make: Callable[[], tuple[np.ndarray, np.ndarray]], start: int, stop: int) -> None:
        self._make = make  # the message's (shards, rows), cached by its maker
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.start, self.stop = start, stop

    @classmethod
    def of(cls, shards: np.ndarray, rows: np.ndarray) -> RowProvenance:
        """Provenance already in arrays (a message's columns, sliced)."""
        out = cls(lambda: (shards, rows), 0, len(rows))
        out._arrays = (shards, rows)
        return out

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            shards, rows = self._make()
            self._arrays = (shards[self.start : self.stop], rows[self.start : self.stop])
        return self._arrays

    def __len__(self) -> int:
        return self.stop - self.start

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RowProvenance):
            return NotImplemented
        (a, b), (c, d) = self.arrays(), other.arrays()
        return bool(np.array_equal(a, c) and np.array_equal(b, d))

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Callable[..., RowProvenance], tuple[np.ndarray, np.ndarray]]:
        return RowProvenance.of, self.arrays()  # pickled (and copied) as its arrays

    def __repr__(self) -> str:
        shards, rows = self.arrays()
        return f"RowProvenance(shards={shards!r}, rows={rows!r})"


@dataclass(frozen=True)
class BatchInfo:
    """Where a batch came from: epoch, global positions, and each row's (source,) shard and row
    (`shards`, `rows`: numpy arrays, one value a row)."""

    epoch: int
    step: int  # global step index in the epoch, counted from the stream's start offset
    position_start: int  # this rank's global positions [position_start, position_end)
    position_end: int
    global_start: int  # the global step's positions over all ranks
    global_end: int
    provenance: RowProvenance  # `shards` and `rows`, made when first read
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

    @property
    def shards(self) -> np.ndarray:
        """int32 index into the manifest's shard list, per row."""
        return self.provenance.arrays()[0]

    @property
    def rows(self) -> np.ndarray:
        """int64 row within the shard, per row."""
        return self.provenance.arrays()[1]

    @property
    def num_rows(self) -> int:
        """The batch's rows (without making `shards` and `rows`)."""
        return len(self.provenance)
