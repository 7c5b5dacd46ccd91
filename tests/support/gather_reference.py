"""The gather as it was before issue #26, kept as the reference for the byte-identity tests."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def reference_gather(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """Row `row[i]` of `tables[group[i]]` for every i, as the build path before issue #26 took them
    (a take per row group, their concatenation, a reordering take): the reference the faster paths
    are compared with."""
    order = np.argsort(group, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(tables)))])
    pieces = []
    for g, t in enumerate(tables):
        rows = row[order[bounds[g] : bounds[g + 1]]]
        n = len(rows)
        if n and rows[-1] - rows[0] == n - 1 and (n == 1 or (np.diff(rows) == 1).all()):
            pieces.append(t.slice(int(rows[0]), n))
        else:
            pieces.append(t.take(pa.array(rows)))
    grouped = pa.concat_tables(pieces)
    if (order == np.arange(len(order))).all():
        return grouped
    restore = np.empty_like(order)
    restore[order] = np.arange(len(order))
    return grouped.combine_chunks().take(pa.array(restore))
