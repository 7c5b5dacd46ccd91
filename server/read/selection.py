"""Selected rows of one dataset or of a mixture's sources -> one record batch in stream order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from shardstream.errors import DataLossError, InvalidArgumentError

from .gather import ListSpans, int_array
from .reader import DatasetReader

__all__ = ["check_mixture_columns", "cost_values", "take_provenance", "take_selection"]


def check_mixture_columns(readers: Sequence[DatasetReader], columns: Sequence[str]) -> list[str]:
    """The columns to send: every source must have each, with the same type."""
    first = readers[0]
    cols = first.check_columns(columns)
    for r in readers[1:]:
        r.check_columns(cols)
        for c in cols:
            a, b = first.manifest.schema.field(c).type, r.manifest.schema.field(c).type
            if not a.equals(b):
                raise InvalidArgumentError(
                    f"mixture sources disagree on column {c!r}: {first.manifest.ref} has {a}, {r.manifest.ref} has {b}"
                )
    return cols


def take_selection(
    readers: Sequence[DatasetReader],
    src: np.ndarray,
    rows: np.ndarray,
    columns: Sequence[str],
    *,
    mixture: bool,
    spans: ListSpans | None = None,
) -> pa.RecordBatch:
    if not mixture:
        return readers[0].take(rows, columns, spans)
    parts = []
    order = []
    for s in np.unique(src):
        idx = np.nonzero(src == s)[0]
        order.append(idx)
        parts.append(
            pa.Table.from_batches([readers[int(s)].take(rows[idx], columns, spans and spans.subset(idx))])
        )
    if parts:
        perm = np.concatenate(order)
        inverse = np.empty_like(perm)
        inverse[perm] = np.arange(len(perm))
        table = pa.concat_tables(parts).take(int_array(inverse))
    else:
        table = pa.Table.from_batches([readers[0].take(rows, columns)])
    table = table.append_column("_source", int_array(src, 32))
    return (
        table.combine_chunks().to_batches()[0]
        if table.num_rows
        else pa.RecordBatch.from_pylist([], schema=table.schema)
    )


def take_provenance(
    readers: Sequence[DatasetReader], src: np.ndarray, rows: np.ndarray, *, mixture: bool
) -> pa.RecordBatch:
    """The provenance columns `take_selection` gives the same rows (`_shard`, `_row`; `_source` in a
    mixture), and no other: the rows are located, not read."""
    if not mixture:
        shard, row, _, _ = readers[0].locator.locate(rows)
    else:
        shard, row = np.empty(len(rows), np.int32), np.empty(len(rows), np.int64)
        for s in np.unique(src).tolist():
            at = src == s
            shard[at], row[at], _, _ = readers[s].locator.locate(rows[at])
    arrays, names = [int_array(shard, 32), int_array(row)], ["_shard", "_row"]
    if mixture:
        arrays.append(int_array(src, 32))
        names.append("_source")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def cost_values(
    readers: Sequence[DatasetReader], src: np.ndarray, rows: np.ndarray, column: str, *, mixture: bool, floats: bool, what: str
) -> np.ndarray:
    """A balanced step's costs: `column` of the selected rows as float64 (`floats`) or int64, each
    finite and not negative (else DATA_LOSS naming `what` and the column)."""
    values = take_selection(readers, src, rows, [column], mixture=mixture).column(column)
    out = None if values.null_count else values.to_numpy(zero_copy_only=False).astype(np.float64 if floats else np.int64)
    if out is None or (len(out) and not (np.all(np.isfinite(out)) and out.min() >= 0)):
        raise DataLossError(f"{what}: column {column!r} holds a null, negative or infinite value")
    return out
