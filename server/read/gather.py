"""The gather: rows taken from several row groups, in the order a batch needs them.

A take on the concatenation of the row groups would first concatenate them all: for a batch drawn
from a window of large row groups, hundreds of MB copied per batch (Arrow's take over a chunked
array concatenates too). `gather` touches only the rows taken, and a contiguous run of them (an
unshuffled read) is a zero-copy slice of its row group.

Fixed-width columns without nulls (integers, floats, fixed-size lists of them: embeddings, token
windows) are gathered by numpy straight into the message's buffers, each row copied once, in
message order (`_gather_fixed`); any other column takes Arrow's path (`gather_arrow`: a take per row
group, their concatenation, a reordering take — three copies and ~17 pyarrow calls per row group).
Measured on 2 MiB messages of 2,032 rows of 1,032 B from 16 cached row groups (2 shared vCPUs): the
gather 3.3-3.7 ms with Arrow's path, 1.2 ms with numpy's, of which ~0.6 ms is the random copy itself
(the floor on this machine); 128 row groups: 3.5 vs 1.25 ms (loadtest/README.md, "One message's
build"). Both give the same bytes (tests/test_gather_identity.py).
"""

from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa

__all__ = ["empty_batch", "gather", "gather_arrow"]


def gather(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """Row `row[i]` of `tables[group[i]]` for every i, in order, touching only the rows taken."""
    fixed = _gather_fixed(tables, group, row)
    return fixed if fixed is not None else gather_arrow(tables, group, row)


def gather_arrow(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """`gather` with Arrow's kernels, for any column type."""
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


# --- fixed-width columns: numpy ----------------------------------------------------------------
# A row group's columns as numpy views (one opaque item per row), made once per cached table: None
# for a table with a column that is not fixed-width without nulls in one chunk.
_Views = tuple[np.ndarray, ...] | None
_VIEWS: dict[int, tuple[weakref.ref[pa.Table], _Views]] = {}


def _element_type(t: pa.DataType) -> pa.DataType | None:
    """The per-value type of a fixed-width column type numpy can gather (None: it cannot)."""
    if pa.types.is_fixed_size_list(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return t
    return None


def _column_view(col: pa.ChunkedArray) -> np.ndarray | None:
    if col.num_chunks != 1 or col.null_count:
        return None
    arr = col.chunk(0)
    t = arr.type
    if pa.types.is_fixed_size_list(t):
        values = arr.flatten()  # the values of its rows (the array's offset applied)
        if values.null_count or _element_type(values.type) is None:
            return None
        return _rows(values.to_numpy(zero_copy_only=True), t)
    if _element_type(t) is None:
        return None
    return _rows(arr.to_numpy(zero_copy_only=True), t)


def _rows(values: np.ndarray, t: pa.DataType) -> np.ndarray | None:
    """`values` of a column of type `t` as one opaque item per row (its bytes): numpy copies each
    row taken as one item, faster than the same take over rows x values."""
    width = t.value_type.bit_width // 8 * t.list_size if pa.types.is_fixed_size_list(t) else t.bit_width // 8
    if width == 0:
        return None  # a list of size 0: Arrow's path
    return values.view(np.uint8).view(np.dtype((np.void, width)))


def _views(table: pa.Table) -> _Views:
    key = id(table)
    held = _VIEWS.get(key)
    if held is not None and held[0]() is table:
        return held[1]
    views: list[np.ndarray] = []
    for col in table.columns:
        v = _column_view(col)
        if v is None:
            views = []
            break
        views.append(v)
    out = tuple(views) if views else None
    _VIEWS[key] = (weakref.ref(table, lambda _, key=key: _VIEWS.pop(key, None)), out)
    return out


def _gather_fixed(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table | None:
    """`gather` for tables whose every column is fixed-width without nulls; None otherwise."""
    if not tables or not tables[0].num_columns:
        return None
    per_table = [_views(t) for t in tables]
    if any(v is None for v in per_table):
        return None
    schema = tables[0].schema
    if any(not t.schema.equals(schema) for t in tables[1:]):
        return None
    n = len(row)
    # The message's buffers, from Arrow's pool (what admission and the pool's decay account for).
    outs: list[np.ndarray] = []
    buffers: list[pa.Buffer] = []
    for v in per_table[0]:  # type: ignore[union-attr]
        buf = pa.allocate_buffer(n * v.itemsize)
        buffers.append(buf)
        outs.append(np.frombuffer(buf, dtype=v.dtype))
    if len(tables) == 1:
        for v, out in zip(per_table[0], outs, strict=True):  # type: ignore[arg-type]
            np.take(v, row, axis=0, out=out)
    else:
        order = np.argsort(group, kind="stable")
        bounds = np.searchsorted(group[order], np.arange(len(tables) + 1))
        for g, views in enumerate(per_table):
            a, b = bounds[g], bounds[g + 1]
            if a == b:
                continue
            at = order[a:b]  # where its rows go in the message
            rows = row[at]
            if _run(at) and _run(rows):  # a run of rows to a run of the message: one memcpy a column
                d, r, k = int(at[0]), int(rows[0]), int(b - a)
                for v, out in zip(views, outs, strict=True):  # type: ignore[arg-type]
                    out[d : d + k] = v[r : r + k]
                continue
            for v, out in zip(views, outs, strict=True):  # type: ignore[arg-type]
                out[at] = v[rows]
    arrays = []
    for field, buf in zip(schema, buffers, strict=True):
        t = field.type
        if pa.types.is_fixed_size_list(t):
            values = pa.Array.from_buffers(t.value_type, n * t.list_size, [None, buf])
            arrays.append(pa.Array.from_buffers(t, n, [None], children=[values]))
        else:
            arrays.append(pa.Array.from_buffers(t, n, [None, buf]))
    return pa.Table.from_arrays(arrays, schema=schema)


def _run(x: np.ndarray) -> bool:
    """Whether `x` counts up by one (its ends first: a shuffled piece fails at once)."""
    n = len(x)
    return bool(x[-1] - x[0] == n - 1 and (n == 1 or (np.diff(x) == 1).all()))


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows with `schema` (a table of no rows has no batch to hand out)."""
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
