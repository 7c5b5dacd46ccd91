"""The gather: rows taken from several row groups, in the order a batch needs them.

A take on the concatenation of the row groups would first concatenate them all: for a batch drawn
from a window of large row groups, hundreds of MB copied per batch (Arrow's take over a chunked
array concatenates too). `gather` touches only the rows taken, and a contiguous run of them (an
unshuffled read) is a zero-copy slice of its row group.

Fixed-width columns without nulls (integers, floats, fixed-size lists of them: embeddings, token
windows; extension types over those, such as fixed-shape tensors: decoded images from the feature
cache) are gathered by numpy straight into the message's buffers, each row copied once, in
message order (`_gather_fixed`): a shuffled message with one take a chunk of rows across all its
row groups (`_take_across`), an unshuffled one that straddles row groups one slice copy a run. The
buffers come from the process's message buffers (message_buffers.py), warm pages reused. Binary and
string columns without nulls (encoded images, text) are gathered beside them, each row's bytes
copied once into the message's values (`_gather_values`). Any other column takes Arrow's path
(`gather_arrow`: a take per row group, their concatenation, a reordering take — three copies and
~17 pyarrow calls per row group). Measured on 2 MiB messages of 2,032 rows
of 1,032 B from 32 cached row groups (2 shared vCPUs, `python -m loadtest.build_bench`), the whole
build: block shuffle 4.4 ms with Arrow's path, 2.0 ms with a numpy take per row group into fresh
buffers, 1.2 ms now (loadtest/README.md, "One message's build"). All give the same bytes
(tests/test_gather_identity.py, tests/test_message_buffers.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from shardstream import kernels
from shardstream.errors import DataLossError
from shardstream.numpy_view import numpy_view

from .message_buffers import message_buffers

__all__ = ["ListSpans", "empty_batch", "gather", "gather_arrow", "gather_spans", "gather_with", "is_run"]


def gather(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """Row `row[i]` of `tables[group[i]]` for every i, in order, touching only the rows taken: one
    run of consecutive rows of one table as its zero-copy slice (the batch a reader's message of one
    run is, buffers and all: a feature cache's shared rows then make the same IPC bytes as running
    the transforms on the message)."""
    if len(tables) == 1 and is_run(row):
        return tables[0].slice(int(row[0]), len(row))
    fixed = _gather_fixed(tables, group, row)
    assert fixed is None or isinstance(fixed, pa.Table)
    return fixed if fixed is not None else gather_arrow(tables, group, row)


def is_run(rows: np.ndarray) -> bool:
    """Whether `rows` are one or more consecutive rows, in order (a zero-copy slice)."""
    n = len(rows)
    return bool(n and int(rows[-1]) - int(rows[0]) == n - 1 and (n == 1 or (np.diff(rows) == 1).all()))


def gather_with(
    tables: list[pa.Table],
    group: np.ndarray,
    row: np.ndarray,
    fields: tuple[pa.Field, ...],
    columns: list[pa.Array],
) -> pa.RecordBatch | None:
    """`gather`'s rows with `columns` (named and typed by `fields`, as long as `row`) after them, as
    one record batch, where every column is fixed-width, binary or string without nulls; None
    otherwise (the caller gathers and appends them its own way). A shuffled message with its provenance columns in one
    step: no table, no batch of it and no schema made twice a message."""
    fixed = _gather_fixed(tables, group, row, (fields, columns))
    assert fixed is None or isinstance(fixed, pa.RecordBatch)
    return fixed


def int_array(values: np.ndarray, signed_bits: int = 64) -> pa.Array:
    """Integers as an Arrow int64 (or int32) array without nulls, over `values` (copied only to
    that width, or to be contiguous). Not `pa.array`: from numpy, its first call in a process
    imports pandas where it is installed (~250 ms), which a fresh server's first shuffled message
    paid."""
    t, dtype = (pa.int64(), np.int64) if signed_bits == 64 else (pa.int32(), np.int32)
    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(t, len(data), [None, pa.py_buffer(data)])


def gather_arrow(tables: list[pa.Table], group: np.ndarray, row: np.ndarray) -> pa.Table:
    """`gather` with Arrow's kernels, for any column type."""
    order = np.argsort(group, kind="stable")  # rows grouped by row group, batch order inside
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(tables)))])
    pieces = []
    for g, t in enumerate(tables):
        rows = row[order[bounds[g] : bounds[g + 1]]]
        if is_run(rows):
            pieces.append(t.slice(int(rows[0]), len(rows)))  # a contiguous run: zero-copy
        else:
            pieces.append(t.take(int_array(rows)))
    grouped = pa.concat_tables(pieces)
    if (order == np.arange(len(order))).all():
        return grouped  # already in batch order (e.g. an unshuffled read)
    restore = np.empty_like(order)
    restore[order] = np.arange(len(order))
    return grouped.combine_chunks().take(int_array(restore))


# --- fixed-width columns: numpy ----------------------------------------------------------------
# A row group's columns as numpy views (one opaque item per row) and their addresses, made once per
# cached table: None for a table with a column that is not fixed-width without nulls in one chunk.
# With each, its schema's IPC form, one bytes object for all tables of equal schemas (interned in
# _SCHEMAS): a message compares its row groups' schemas by identity, not by a pyarrow call each.
_Views = tuple[tuple["np.ndarray | _Values", int], ...] | None
_VIEWS: dict[int, tuple[weakref.ref[pa.Table], _Views, bytes]] = {}
_SCHEMAS: dict[bytes, bytes] = {}  # one entry per schema served


class _Recipe:
    """What a gathered message of one schema is made of, worked out once per schema (by its interned
    IPC form): per column its type, its storage type and, for a fixed-size list, its value type and
    size (0: binary or string values); the schema as one object, and with extra columns appended (the provenance columns). A
    message then builds its arrays without a pyarrow call per field to ask, and its batch shares
    one schema object with every other of the schema's messages, which later checks of the schema
    (`plain_schema`, `ipc_size`'s framing) compare by identity instead of by fingerprints (~6% of
    a shuffled message's build, profiled)."""

    __slots__ = ("columns", "schema", "_widened")

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        columns = []
        for field in schema:
            t = field.type
            storage = t.storage_type if isinstance(t, pa.BaseExtensionType) else t
            if pa.types.is_fixed_size_list(storage):
                columns.append((t, storage, storage.value_type, storage.list_size))
            else:  # (size 0: variable-width values, `_gather_values`)
                columns.append((t, storage, None, 0 if _variable_width(storage) else 1))
        self.columns = tuple(columns)
        self._widened: tuple[tuple[pa.Field, ...], pa.Schema] | None = None

    def widened(self, extra: tuple[pa.Field, ...]) -> pa.Schema:
        """The schema with the fields `extra` appended (kept for the last `extra` tuple asked with)."""
        held = self._widened
        if held is None or held[0] is not extra:
            held = self._widened = (extra, pa.schema([*self.schema, *extra], metadata=self.schema.metadata))
        return held[1]


_RECIPES: dict[bytes, _Recipe] = {}  # by interned schema form, one per schema served


def _element_type(t: pa.DataType) -> pa.DataType | None:
    """The per-value type of a fixed-width column type numpy can gather (None: it cannot)."""
    if pa.types.is_fixed_size_list(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return t
    return None


class _Values(NamedTuple):
    """A column of variable-width values (binary or string, large or not) without nulls: each row's
    offsets into `data` (int64, the array's offset applied) and the values' bytes."""

    offsets: np.ndarray
    data: np.ndarray


def _large(t: pa.DataType) -> bool:
    """Whether binary or string type `t` has 64-bit offsets."""
    return pa.types.is_large_binary(t) or pa.types.is_large_string(t)


def _variable_width(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_string(t) or _large(t)


def _values_view(arr: pa.Array) -> _Values:
    """A binary or string array without nulls as `_Values` (its offsets widened to int64 once)."""
    n = len(arr)
    _, offsets, data = arr.buffers()
    if not n or offsets is None:
        return _Values(np.zeros(1, np.int64), np.empty(0, np.uint8))
    width = 8 if _large(arr.type) else 4
    view = np.frombuffer(offsets, np.int64 if width == 8 else np.int32, n + 1, arr.offset * width)
    return _Values(view.astype(np.int64), np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8))


def _column_view(col: pa.ChunkedArray) -> np.ndarray | _Values | None:
    if col.num_chunks != 1 or col.null_count:
        return None
    arr = col.chunk(0)
    if isinstance(arr, pa.ExtensionArray):  # e.g. a fixed-shape tensor: gathered as its storage
        arr = arr.storage
    t = arr.type
    if _variable_width(t):
        return _values_view(arr)
    if pa.types.is_fixed_size_list(t):
        # the values of its rows (the array's offset applied; not `flatten`, a compute call that
        # imports pyarrow.compute, ~35 ms the first time in a process)
        values = arr.values.slice(arr.offset * t.list_size, len(arr) * t.list_size)
        if values.null_count or _element_type(values.type) is None:
            return None
        return _rows(values, t)
    if _element_type(t) is None:
        return None
    return _rows(arr, t)


def _rows(values: pa.Array, t: pa.DataType) -> np.ndarray | None:
    """The (primitive, null-free) `values` of a column of type `t` as one opaque item per row (its
    bytes): numpy copies each row taken as one item, faster than the same take over rows x values.
    (`numpy_view`, not `to_numpy`: pyarrow's to_numpy imports pandas where it is installed, ~250 ms
    the first time, which a fresh server's first shuffled message paid.)"""
    width = t.value_type.bit_width // 8 * t.list_size if pa.types.is_fixed_size_list(t) else t.bit_width // 8
    if width == 0:
        return None  # a list of size 0: Arrow's path
    return numpy_view(values).view(np.uint8).view(np.dtype((np.void, width)))


def _views(table: pa.Table) -> tuple[_Views, bytes]:
    """`table`'s views and its schema's interned IPC form, made once for the table (kept while it
    lives)."""
    key = id(table)
    held = _VIEWS.get(key)
    if held is not None and held[0]() is table:
        return held[1], held[2]
    views: list[tuple[np.ndarray | _Values, int]] = []
    for col in table.columns:
        v = _column_view(col)
        if v is None:
            views = []
            break
        views.append((v, 0 if isinstance(v, _Values) else v.ctypes.data))
    out = tuple(views) if views else None
    form = table.schema.serialize().to_pybytes()
    form = _SCHEMAS.setdefault(form, form)  # (atomic: threads that meet a new schema at once agree)
    _VIEWS[key] = (weakref.ref(table, lambda _, key=key: _VIEWS.pop(key, None)), out, form)
    return out, form


def _table_views(tables: list[pa.Table]) -> tuple[list[tuple[tuple[np.ndarray, int], ...]], bytes] | None:
    """Each table's views and their one schema's interned form, if every table has views and all
    have one schema (else None). The views of a table are found by its id alone: an entry's weak
    reference removes it as its table dies, before its id can be another's. Equal schemas share one
    interned bytes object, so the set of the schemas is one item when they are all equal. (A full
    shuffle's message has a table per row group: 128 tables took 29 us with a `_views` call and a
    schema comparison each, 13 this way.)"""
    get = _VIEWS.get
    held = [get(id(t)) for t in tables]
    if None in held:  # a table not seen yet
        held = [(None, *_views(t)) if h is None else h for t, h in zip(tables, held, strict=True)]
    views = [h[1] for h in held]
    if None in views or len({h[2] for h in held}) != 1:
        return None
    return views, held[0][2]  # type: ignore[return-value]  (no None left)


def _gather_fixed(
    tables: list[pa.Table],
    group: np.ndarray,
    row: np.ndarray,
    extra: tuple[tuple[pa.Field, ...], list[pa.Array]] | None = None,
) -> pa.Table | pa.RecordBatch | None:
    """`gather` for tables whose every column is fixed-width (numpy's gather), binary or string
    (`_gather_values`), without nulls; None otherwise. With `extra` (fields, arrays of the message's
    length), one record batch of the rows and those columns after them, else a table of the rows."""
    if not tables or not tables[0].num_columns:
        return None
    found = _table_views(tables)
    if found is None:
        return None
    per_table, form = found
    recipe = _RECIPES.get(form)
    if recipe is None:
        recipe = _RECIPES.setdefault(form, _Recipe(tables[0].schema))
    n = len(row)
    # each row group of a message is a run at least: past _MAX_RUNS of them, no need to look
    runs = _runs(group, row) if 1 < len(tables) <= _MAX_RUNS else None
    pool = message_buffers()
    across: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (lengths, group, row): once a message
    addresses: np.ndarray | None = None  # [column, table]: once a message
    arrays = []
    for c, (t, storage, value_type, size) in enumerate(recipe.columns):
        views = [v[c][0] for v in per_table]  # type: ignore[index]
        if not size:  # binary or string values: one copy of the rows' bytes
            values = _gather_values(storage, views, group, row)  # type: ignore[arg-type]
            if values is None:
                return None
            arrays.append(pa.ExtensionArray.from_storage(t, values) if storage is not t else values)
            continue
        buf = pool.get(n * views[0].itemsize)  # reused warm pages where it can (message_buffers.py)
        out = np.frombuffer(buf, dtype=views[0].dtype) if n else None
        if out is None:
            pass  # no rows
        elif len(views) == 1:
            np.take(views[0], row, axis=0, out=out)
        elif runs is not None:  # a few runs of consecutive rows (an unshuffled read across row groups)
            for a, b in runs:
                r = int(row[a])
                out[a:b] = views[int(group[a])][r : r + b - a]
        else:
            if across is None or addresses is None:  # the first column: what all of them share
                across = _rows_across(views, group, row)
                addresses = np.array([[a for _, a in v] for v in per_table], dtype=np.int64).T.copy()  # type: ignore[union-attr]
            _take_across(views, addresses[c], group, row, out, across)
        if value_type is not None:
            values = pa.Array.from_buffers(value_type, n * size, [None, buf])
            arr = pa.Array.from_buffers(storage, n, [None], children=[values])
        else:
            arr = pa.Array.from_buffers(storage, n, [None, buf])
        arrays.append(pa.ExtensionArray.from_storage(t, arr) if storage is not t else arr)
    if extra is not None:
        fields, columns = extra
        return pa.RecordBatch.from_arrays([*arrays, *columns], schema=recipe.widened(fields))
    return pa.Table.from_arrays(arrays, schema=recipe.schema)


_MAX_RUNS = 8  # a message of at most this many runs of consecutive rows is copied run by run
_CHUNK_BYTES = 256 << 10  # rows gathered a chunk at a time: the chunk's scratch copy stays in cache


def _runs(group: np.ndarray, row: np.ndarray) -> list[tuple[int, int]] | None:
    """The message's runs [a, b) of consecutive rows of one row group, if it has at most _MAX_RUNS."""
    cuts = np.flatnonzero((np.diff(group) != 0) | (np.diff(row) != 1))
    if len(cuts) >= _MAX_RUNS:
        return None
    bounds = [0, *(cuts + 1).tolist(), len(row)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _rows_across(
    views: list[np.ndarray], group: np.ndarray, row: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `_take_across` hands the C gather besides a column's addresses, the same for every
    column of a message: the row groups' lengths in rows, and `group` and `row` as int64."""
    return (
        np.array([len(v) for v in views], dtype=np.int64),
        np.ascontiguousarray(group, dtype=np.int64),
        np.ascontiguousarray(row, dtype=np.int64),
    )


def _take_across(
    views: list[np.ndarray],
    addresses: np.ndarray,
    group: np.ndarray,
    row: np.ndarray,
    out: np.ndarray,
    across: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """out[i] = views[group[i]][row[i]] whatever the row groups: in C (shardstream/_kernels.c,
    one memcpy a row with the GIL released) where it is built, else `_take_across_numpy`.
    `across`: `_rows_across(views, group, row)`, made once for a message's columns."""
    native = kernels.native
    if native is None:
        _take_across_numpy(views, addresses, group, row, out)
        return
    lengths, groups, rows = across if across is not None else _rows_across(views, group, row)
    native.gather_rows(out, views[0].itemsize, addresses, lengths, groups, rows)


def _take_across_numpy(
    views: list[np.ndarray], addresses: np.ndarray, group: np.ndarray, row: np.ndarray, out: np.ndarray
) -> None:
    """`_take_across` with one numpy take a chunk of rows, whatever the row groups.

    The row groups' buffers lie anywhere in memory; one array of opaque items that starts at the
    lowest of them and steps ONE byte per item spans them all, so a row of any of them is one item
    of it: item (address of the row group - the lowest address + row x width). Only rows of the row
    groups are ever read (numpy checks each item against the span; the rows against their row
    groups were checked by the locator), and the row groups are alive while `views` is. It takes
    the place of a sort by row group and a take per row group (~4-14 us of Python each: a full
    shuffle touches every row group of the dataset). The take goes a chunk at a time through a
    scratch copy that stays in the CPU's cache, then into `out`.
    """
    width = views[0].itemsize
    low = int(addresses.min())
    span = int((addresses + np.array([v.nbytes for v in views], dtype=np.int64)).max()) - low
    items = np.ndarray(
        shape=(span - width + 1,), dtype=views[0].dtype, buffer=pa.foreign_buffer(low, span), strides=(1,)
    )
    at = (addresses - low)[group] + row.astype(np.int64, copy=False) * width
    step = max(1, _CHUNK_BYTES // width)
    for a in range(0, len(at), step):
        out[a : a + step] = items[at[a : a + step]]


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows with `schema` (a table of no rows has no batch to hand out)."""
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


# --- slices of list columns -------------------------------------------------------------------------
RUN_COPY_TOKENS = 32  # values a row at least, on average, for a slice copy a row (below: index arrays)
@dataclass(frozen=True)
class ListSpans:
    """The values [start[i], stop[i]) of row i's list `column` — all a reader takes of it."""

    column: str
    start: np.ndarray
    stop: np.ndarray

    def subset(self, idx: np.ndarray) -> ListSpans:
        return ListSpans(self.column, self.start[idx], self.stop[idx])


def gather_spans(
    tables: list[pa.Table],
    group: np.ndarray,
    row: np.ndarray,
    column: str,
    start: np.ndarray,
    stop: np.ndarray,
) -> pa.Array | None:
    """Values [start[i], stop[i]) (clipped to the list's length) of row `row[i]` of
    `tables[group[i]]`'s list `column`, for every i, as one list array of the column's type: the
    values taken and no others (a balanced packed step sends a few rows of a long document: its
    rank copies those, not the document). None where the column is not a list of numbers or holds a
    null list (the caller gathers it whole)."""
    t = tables[0].schema.field(column).type if tables else None
    if (
        t is None
        or not (pa.types.is_list(t) or pa.types.is_large_list(t))
        or _element_type(t.value_type) is None
    ):
        return None
    views = []
    for table in tables:
        col = table.column(column)
        if col.null_count:  # a null document: text.pack refuses it (balance packs every document)
            return None
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if arr.values.null_count:  # (whole rows would not do: the plan asked for these values only)
            raise DataLossError(f"column {column!r} holds a null value inside a list (a token that is null)")
        views.append(_Values(numpy_view(arr.offsets).astype(np.int64, copy=False), numpy_view(arr.values)))
    dtype = views[0].data.dtype if views else np.dtype(np.int32)
    out_offsets, values = _copy_spans(views, group, row, dtype, start, stop)
    return _list_array(t, out_offsets, values)


def _gather_values(t: pa.DataType, views: list[_Values], group: np.ndarray, row: np.ndarray) -> pa.Array | None:
    """Row `row[i]` of the binary or string columns `views[group[i]]` for every i, as one array of
    type `t`, each row's bytes copied once (Arrow's path takes a row group's rows, concatenates them
    and takes them again in the message's order: three copies of, say, 150 KiB encoded images, which
    made a shuffled image stream's build 4x Flight gathering the same rows). None when a message's
    values would not fit 32-bit offsets (Arrow's path then)."""
    out_offsets, values = _copy_spans(views, group, row, np.dtype(np.uint8))
    large = _large(t)
    if not large and out_offsets[-1] > np.iinfo(np.int32).max:
        return None
    offsets = pa.py_buffer(out_offsets if large else out_offsets.astype(np.int32))
    return pa.Array.from_buffers(t, len(row), [None, offsets, pa.py_buffer(values)])


def _copy_spans(
    views: list[_Values],
    group: np.ndarray,
    row: np.ndarray,
    dtype: np.dtype,
    start: np.ndarray | None = None,
    stop: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of the spans [start[i], stop[i]) (clipped; whole rows without them) of row
    `row[i]` of `views[group[i]]` for every i, in order: long spans a slice copy each, short ones a
    few passes of index arrays over a row group's values."""
    n = len(row)
    order = np.argsort(group, kind="stable")  # rows by row group
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(views)))])
    mine = [order[bounds[g] : bounds[g + 1]] for g in range(len(views))]
    base = np.empty(n, np.int64)
    size = np.empty(n, np.int64)
    for (offsets, _), rows in zip(views, mine, strict=True):
        base[rows] = offsets[row[rows]]
        size[rows] = offsets[row[rows] + 1] - base[rows]
    if start is None or stop is None:
        a, lens = np.zeros(n, np.int64), size
    else:
        a = np.minimum(np.asarray(start, np.int64), size)
        lens = np.maximum(np.minimum(np.asarray(stop, np.int64), size) - a, 0)
    out_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=out_offsets[1:])
    values = np.empty(int(out_offsets[-1]), dtype)
    src = base + a
    if n and int(out_offsets[-1]) >= RUN_COPY_TOKENS * n:  # long runs (documents, images): a slice copy each
        starts, stops, lengths = out_offsets[:-1].tolist(), src.tolist(), lens.tolist()
        for (_, vals), rows in zip(views, mine, strict=True):
            for i in rows.tolist():
                o, f, k = starts[i], stops[i], lengths[i]
                values[o : o + k] = vals[f : f + k]
        return out_offsets, values
    for (_, vals), rows in zip(views, mine, strict=True):  # short runs: a few passes over the values
        k = lens[rows]
        count = int(k.sum())
        if not count:
            continue
        # value j of the group's runs is at its run's start + j - the run's first j
        at = np.cumsum(k) - k
        j = np.arange(count, dtype=np.int64)
        values[j + np.repeat(out_offsets[rows] - at, k)] = vals[j + np.repeat(src[rows] - at, k)]
    return out_offsets, values


def _list_array(t: pa.DataType, out_offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    n = len(out_offsets) - 1
    offsets_type = pa.int64() if pa.types.is_large_list(t) else pa.int32()
    offs = pa.Array.from_buffers(
        offsets_type,
        n + 1,
        [None, pa.py_buffer(out_offsets.astype(np.int64 if pa.types.is_large_list(t) else np.int32))],
    )
    flat = pa.Array.from_buffers(t.value_type, len(values), [None, pa.py_buffer(values)])
    cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    return cls.from_arrays(offs, flat, type=t)
