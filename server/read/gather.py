"""The gather: rows taken from several row groups, in the order a batch needs them.

A take on the concatenation of the row groups would first concatenate them all: for a batch drawn
from a window of large row groups, hundreds of MB copied per batch. `gather` touches only the rows
taken, and a contiguous run of them (an unshuffled read) is a zero-copy slice of its row group.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["empty_batch", "gather"]


def gather(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """Row `row[i]` of `tables[group[i]]` for every i, in order, touching only the rows taken."""
    order = np.argsort(group, kind="stable")  # rows grouped by row group, batch order inside
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(tables)))])
    pieces = []
    for g, t in enumerate(tables):
        rows = row[order[bounds[g] : bounds[g + 1]]]
        n = len(rows)
        if n and rows[-1] - rows[0] == n - 1 and (n == 1 or (np.diff(rows) == 1).all()):
            pieces.append(t.slice(int(rows[0]), n))  # a contiguous run: zero-copy
        else:
            pieces.append(t.take(pa.array(rows)))
    grouped = pa.concat_tables(pieces)
    if (order == np.arange(len(order))).all():
        return grouped  # already in batch order (e.g. an unshuffled read)
    restore = np.empty_like(order)
    restore[order] = np.arange(len(order))
    return grouped.combine_chunks().take(pa.array(restore))


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows with `schema` (a table of no rows has no batch to hand out)."""
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
