"""Rows of a dataset version -> one Arrow record batch (blocking; run it in a worker thread).

The read plan says which dataset rows a message needs; this module fetches the row groups that
hold them (through the process-wide cache, several at once) and takes the rows in plan order
(gather.py), adding the provenance columns `_shard` and `_row`.

Shards are local files or objects of a remote storage, opened by shards.py. Integrity: the first
time a reader opens a shard it checks it against the manifest (`open_shard`: size, the footer's
crc32, row-group row counts; for a shard of an older manifest without checksums, the whole file's
sha256 up to `hash_check_max_bytes` instead of the footer's crc32) and remembers the result; each row
group fetched from storage is then checked chunk by chunk before it is decoded (shards.py). Any
failure (and any shard that cannot be read) raises DataLossError naming the version, the shard, the
row group and the check that failed, so no batch is built from a bad shard.

Row groups read from a shard with checksums and from one without are cached apart (memory and disk
tier), even when two versions share content: bytes read unchecked are never served as checked.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import pyarrow as pa
from prometheus_client import Counter, Histogram

from shardstream import kernels
from shardstream.errors import DataLossError, InvalidArgumentError, ShardstreamError
from shardstream.ipc import ipc_size
from shardstream.manifest import Manifest
from shardstream.order.read_order import RowLocator
from shardstream.provenance import ROW_BYTES, one_run
from shardstream.storage import ObjectRef
from shardstream.v1 import shardstream_pb2 as pb

from .cache import Lease, LRUCache
from .gather import ListSpans, empty_batch, gather, gather_spans, gather_with, int_array, is_run
from .shards import ShardFile, open_shard
from .spill import SpillTier

__all__ = [
    "DEFAULT_HASH_CHECK_MAX_BYTES",
    "DatasetReader",
    "GroupRun",
    "RowGroupCache",
    "new_row_group_cache",
]

log = logging.getLogger(__name__)

DEFAULT_HASH_CHECK_MAX_BYTES = 64 << 20  # shards without checksums: hashed whole on first open up to this size
FETCH_THREADS = 16  # row groups fetched at once for one batch

STORAGE_READS = Counter("shardstream_storage_reads_total", "Row-group reads from storage")
STORAGE_READ_ERRORS = Counter("shardstream_storage_read_errors_total", "Row-group reads that failed")
STORAGE_READ_BYTES = Counter("shardstream_storage_read_bytes_total", "Bytes of row groups read (decoded)")
STORAGE_READ_SECONDS = Histogram("shardstream_storage_read_seconds", "Time to read and decode one row group")
SHARD_CHECKS = Counter(
    "shardstream_shard_checks_total",
    "Shards opened and checked against their manifest: ok, failed, or unhashed (an older manifest's "
    "shard without checksums, over the whole-file hash limit: size and row counts checked only)",
    ["result"],
)

_FETCH_POOL = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shardstream-fetch")


class RowGroupCache(LRUCache[pa.Table]):
    """The process's in-memory LRU of decoded row groups, over an optional local-disk tier (spill.py)."""

    def __init__(self, capacity_bytes: int, spill: SpillTier | None = None) -> None:
        super().__init__(capacity_bytes, sizeof=lambda t: t.nbytes)
        self.spill = spill


def new_row_group_cache(capacity_bytes: int, spill: SpillTier | None = None) -> RowGroupCache:
    return RowGroupCache(capacity_bytes, spill)


class DatasetReader:
    """Reads rows of one manifest from its shards: local paths or `ObjectRef`s of a storage."""

    def __init__(
        self,
        manifest: Manifest,
        shard_paths: Sequence[Path | str | ObjectRef],
        cache: RowGroupCache,
        *,
        hash_check_max_bytes: int = DEFAULT_HASH_CHECK_MAX_BYTES,
    ) -> None:
        self.manifest = manifest
        self._paths = list(shard_paths)
        self._cache = cache
        self._hash_max = hash_check_max_bytes
        # (rows a drop_rows version masks are not dataset rows: manifest.py)
        self.locator = RowLocator(
            [s.row_groups for s in manifest.shards], [s.masked for s in manifest.shards]
        )
        self._files: dict[int, ShardFile] = {}
        self._row_bytes: dict[tuple[str, ...], float] = {}  # decoded bytes per row, for read-ahead
        self._keys: dict[tuple[str, ...], dict[int, str]] = {}  # columns -> shard << 32 | group -> key
        self._group_keys_of: dict[tuple[str, ...], list[str | None]] = {}  # columns -> key by row-group index
        self._open_locks = [threading.Lock() for _ in manifest.shards]
        self._checked = [s.checksums is not None for s in manifest.shards]
        unhashed = [s for s in manifest.shards if s.checksums is None and s.bytes > hash_check_max_bytes]
        if unhashed:
            log.warning(
                "%s: %d shard(s) have no row-group checksums (registered before they existed) and are over "
                "the %d-byte whole-file hash limit: served after size and row-count checks only; register "
                "the files again for a version with checksums (same fingerprint)",
                manifest.ref,
                len(unhashed),
                hash_check_max_bytes,
            )

    def check_columns(self, columns: Sequence[str]) -> list[str]:
        names = self.manifest.schema.names
        if not columns:
            return list(names)
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise InvalidArgumentError(
                f"unknown column(s) {', '.join(map(repr, unknown))} in {self.manifest.ref}; "
                f"columns are: {', '.join(names)}"
            )
        if len(set(columns)) != len(columns):
            raise InvalidArgumentError(f"columns listed twice: {list(columns)}")
        return list(columns)

    def _file(self, shard: int) -> ShardFile:
        f = self._files.get(shard)
        if f is not None:
            return f
        with self._open_locks[shard]:  # one check per shard; other shards open in parallel
            f = self._files.get(shard)
            if f is None:
                try:
                    f = open_shard(
                        self._paths[shard], self.manifest.shards[shard], hash_check_max_bytes=self._hash_max
                    )
                except DataLossError as exc:
                    SHARD_CHECKS.labels("failed").inc()
                    raise self._loss(shard, str(exc)) from exc
                info = self.manifest.shards[shard]
                unhashed = info.checksums is None and info.bytes > self._hash_max
                SHARD_CHECKS.labels("unhashed" if unhashed else "ok").inc()
                self._files[shard] = f
            return f

    def _loss(self, shard: int, what: str) -> DataLossError:
        STORAGE_READ_ERRORS.inc()
        return DataLossError(f"{self.manifest.ref}: shard {self.manifest.shards[shard].uri}: {what}")

    def _fetcher(self, shard: int, group: int, columns: tuple[str, ...]) -> Callable[[], pa.Table]:
        spill = self._cache.spill
        info = self.manifest.shards[shard]

        def read() -> pa.Table:
            t0 = time.perf_counter()
            STORAGE_READS.inc()
            try:
                table = self._file(shard).read_row_group(group, list(columns))
            except DataLossError as exc:
                if str(exc).startswith(f"{self.manifest.ref}: shard "):
                    raise
                raise self._loss(shard, f"row group {group}: {exc}") from exc
            except ShardstreamError:
                STORAGE_READ_ERRORS.inc()
                raise
            except (OSError, pa.ArrowException) as exc:
                if "checksum" in str(exc).lower():  # a Parquet page checksum (pyarrow: OSError)
                    raise self._loss(shard, f"row group {group}: a Parquet page checksum differs") from exc
                raise self._loss(shard, f"row group {group} unreadable") from exc  # details: the server log
            STORAGE_READ_SECONDS.observe(time.perf_counter() - t0)
            STORAGE_READ_BYTES.inc(table.nbytes)
            if table.num_rows:
                self._row_bytes[columns] = table.nbytes / table.num_rows
            return table

        def fetch() -> pa.Table:
            if spill is None:
                return read()
            # The disk tier: a whole file of the same content, or one read for all processes.
            checked = info.checksums is not None
            return spill.get_or_read(info.sha256, group, columns, info.row_groups[group], read, checked=checked)

        return fetch

    def _key(self, shard: int, group: int, columns: tuple[str, ...]) -> str:
        """The cache key of a row group read with `columns`: a string, made once (a string keeps its
        hash: a lease does a dozen dict operations a key, and one of 64 keys took 40 us with string
        keys, 70 with tuples)."""
        known = self._keys.get(columns)
        if known is None:
            known = self._keys[columns] = {}
        place = shard << 32 | group
        key = known.get(place)
        if key is None:
            fp = self.manifest.fingerprint
            key = known[place] = f"{fp}/{shard}/{group}/{int(self._checked[shard])}/{columns!r}"
        return key

    def _estimate(self, shard: int, group: int, columns: tuple[str, ...]) -> int:
        """Decoded bytes of a row group before it is read: the bytes per row of the last row group
        read with these columns (the shard's stored bytes per row before any)."""
        info = self.manifest.shards[shard]
        per_row = self._row_bytes.get(columns) or info.bytes / max(1, info.rows)
        return int(per_row * info.row_groups[group])

    def read_ahead(
        self, rows: np.ndarray, columns: Sequence[str], budget_bytes: int
    ) -> list[tuple[int, Callable[[], bool]]]:
        """(estimated bytes, task) reading ahead each row group holding `rows` that the cache neither
        holds nor is reading, in order of first use, while the estimates stay within `budget_bytes`.

        Estimates use the decoded bytes per row of the last row group read with these columns (the
        shard's stored bytes per row before any). A task returns True if it read storage.
        """
        cols = tuple(columns)
        if not len(rows):
            return []
        shard, _, group, _ = self.locator.locate(rows)
        keys = shard.astype(np.int64) << 32 | group.astype(np.int64)
        unique, first = np.unique(keys, return_index=True)
        tasks: list[tuple[int, Callable[[], bool]]] = []
        spent = 0
        for k in unique[np.argsort(first)]:
            s, g = int(k >> 32), int(k & 0xFFFFFFFF)
            key = self._key(s, g, cols)
            if key in self._cache:
                continue
            estimate = self._estimate(s, g, cols)
            if spent + estimate > budget_bytes:
                break
            spent += estimate
            fetch = self._fetcher(s, g, cols)
            tasks.append((estimate, lambda key=key, fetch=fetch: self._cache.prefetch(key, fetch)))
        return tasks

    def take(
        self, rows: np.ndarray, columns: Sequence[str], spans: ListSpans | None = None
    ) -> pa.RecordBatch:
        """The dataset rows `rows` (in that order) with `columns` and provenance, as one batch;
        with `spans`, its list column holds only those values of each row (`gather_spans`)."""
        cols = tuple(columns)
        n = len(rows)
        run = self.locator.run(int(rows[0]), n) if is_run(rows) else None
        if run is not None:
            # An unshuffled message inside one row group: one zero-copy slice, located by its
            # first row alone (~40 us a message less than locating each row: issue #26)
            s, g, start, first_row = run
            with self._leased([(s, g)], cols) as lease:
                table = lease.values[0].slice(start, n)
                if spans is not None:
                    table = _spanned([table], np.zeros(n, np.int64), np.arange(n), spans)
            shards = np.full(n, s, dtype=np.int32)
            return _with_provenance(table, shards, np.arange(first_row, first_row + n, dtype=np.int64))
        g, shard, row_in_shard, row_in_group = self.locator.locate_groups(rows)
        if n and _one_run(g, row_in_group):
            # An unshuffled (or block-shuffled) message inside one row group: one zero-copy slice,
            # without the sorting and grouping of the general gather (most of a message's CPU).
            s, group = self.locator.group_place(g[:1])
            with self._leased([(int(s[0]), int(group[0]))], cols) as lease:
                table = lease.values[0].slice(int(row_in_group[0]), n)
                if spans is not None:
                    table = _spanned([table], np.zeros(n, np.int64), np.arange(n), spans)
            return _with_provenance(table, shard, row_in_shard)
        unique, inverse = _unique(g, self.locator.num_groups)
        s, group = self.locator.group_place(unique)
        if not len(unique):
            schema = self.manifest.schema
            table = pa.table({c: pa.array([], type=schema.field(c).type) for c in cols})
            return _with_provenance(table, shard, row_in_shard)
        # the keys by row-group index, not one _key call a row group: a full shuffle's message
        # touches every row group of a cached dataset (128 of 512 MiB here: ~13 us a message less,
        # 5% of its build; build_bench, 5 alternating rounds)
        by_group = self._group_keys(cols)
        keys = [by_group[i] or self._group_key(by_group, i, cols) for i in unique.tolist()]
        with self._leased(list(zip(s.tolist(), group.tolist(), strict=True)), cols, keys) as lease:
            if spans is None and n:  # fixed-width, binary or string rows: gathered with their provenance in one batch
                provenance = [int_array(shard, 32), int_array(row_in_shard)]
                batch = gather_with(lease.values, inverse, row_in_group, _PROVENANCE_FIELDS, provenance)
                if batch is not None:
                    return batch
            table = _spanned(lease.values, inverse, row_in_group, spans)
        return _with_provenance(table, shard, row_in_shard)

    def _group_keys(self, cols: tuple[str, ...]) -> list[str | None]:
        """The row groups' cache keys with `cols` by row-group index (`locate_groups`'): None until
        `_group_key` makes one."""
        known = self._group_keys_of.get(cols)
        if known is None:
            known = self._group_keys_of.setdefault(cols, [None] * self.locator.num_groups)
        return known

    def _group_key(self, by_group: list[str | None], g: int, cols: tuple[str, ...]) -> str:
        """Row group `g`'s key with `cols`, made and kept in `by_group` (`_group_keys(cols)`)."""
        shard, group = self.locator.group_place(np.array([g]))
        key = by_group[g] = self._key(int(shard[0]), int(group[0]), cols)
        return key

    def group_run(
        self,
        shard: int,
        group: int,
        start_row: int,
        columns: Sequence[str],
        *,
        held: bool = False,
        bare: bool = False,
    ) -> GroupRun | None:
        """Row group `group` of `shard` (its first row is row `start_row` of the shard), leased, to
        cut consecutive rows from (`GroupRun`; `bare`: without the provenance columns); None when
        its columns are not one chunk each, or,
        with `held`, when the cache does not hold it or cannot pin it at once (a build that leases
        one row group already never waits for another)."""
        cols = tuple(columns)
        if held:
            lease = self._cache.try_lease([self._key(shard, group, cols)])
            if lease is None:
                return None
        else:
            lease = self._leased([(shard, group)], cols)
        try:
            table = lease.values[0]
            assert table is not None
            cut = _Cut.of(table, shard, start_row)
            if cut is None:
                lease.release()
                return None
            return GroupRun(lease, cut, bare)
        except BaseException:
            lease.release()
            raise

    def _leased(
        self, places: list[tuple[int, int]], cols: tuple[str, ...], keys: list[str] | None = None
    ) -> Lease[pa.Table]:
        """The row groups at `places` (shard, group) as the lease's values, pinned in the cache until
        the caller releases it (cache.py `lease`: the build waits for room first): those the cache
        holds at once, the others read several at a time (concurrent ranged reads on remote storage).
        `keys`: their cache keys, where the caller has them."""
        if keys is None:
            keys = [self._key(s, g, cols) for s, g in places]
        lease = self._cache.lease(keys, lambda i: self._estimate(*places[i], cols))
        try:
            tables = lease.values
            missing = [i for i, t in enumerate(tables) if t is None]
            if len(missing) > 1:
                get = self._cache.get
                reads = [_FETCH_POOL.submit(get, keys[i], self._fetcher(*places[i], cols)) for i in missing]
                wait(reads)  # every one, even past a failure: nothing is read after the lease ends
                for i, read in zip(missing, reads, strict=True):
                    tables[i] = read.result()
            elif missing:
                i = missing[0]
                tables[i] = self._cache.get(keys[i], self._fetcher(*places[i], cols))
        except BaseException:
            lease.release()
            raise
        return lease


class GroupRun:
    """One row group, leased, from which an unshuffled stream's messages are cut: each is a slice
    of its rows with their provenance, made once for the row group, instead of a take per message;
    or, `bare`, of its rows alone (a stream whose headers carry the provenance: `one_run`).

    The batches are those `DatasetReader.take` makes of the same rows, buffer for buffer as the
    IPC writer writes them (tests/test_group_runs.py). The writer writes a fixed-width array at an
    offset with its length rounded up to 8 bytes (or to the buffer's end), and one at offset 0 whole
    when the buffer is within 64 bytes of its length; take's provenance arrays are exact. So the
    provenance columns here start one value into their buffers (every slice is at an offset), and
    a slice of an odd number of 4-byte `_shard` values before the row group's end gets `_shard` as
    an exact array of its own. `release()` ends the lease; the batches keep the row group's buffers
    alive as take's do.

    The row group as one batch, and the IPC sizes of its slices, are made once for each row group the
    cache holds, not once a build (`_Cut`): a row group's table is one object as long as the cache
    holds it, and the cut is forgotten with it. So are its provenance columns (~20-25 us in process)
    for rows of 192 bytes or more: they are not counted in the cache's bytes (12 bytes a row, at most
    1/16 over what the cache counts); rows smaller than that get provenance columns of their own each
    build. A bare run makes no provenance columns at all."""

    def __init__(self, lease: Lease[pa.Table], cut: _Cut, bare: bool = False) -> None:
        self._lease = lease
        self.rows = cut.rows
        self.bare = bare
        self.shard_id, self.start_row = cut.shard_id, cut.start_row
        self._full, self._shard = (cut.data, None) if bare else cut.full
        self.schema = self._full.schema
        self._shard_at = len(self.schema) - 2
        self.nbytes = self._full.get_total_buffer_size()  # what its batches keep alive
        self._sizes = cut.sizes[bare] if cut.sizes is not None else None

    def batch(self, start: int, n: int) -> pa.RecordBatch:
        """Rows [start, start + n) of the row group, with their provenance unless bare (n >= 1)."""
        batch = self._full.slice(start, n)
        if not self.bare and n % 2 and start + n < self.rows:
            assert self._shard is not None
            shard = pa.Array.from_buffers(pa.int32(), n, [None, self._shard.slice(0, 4 * n)])
            batch = batch.set_column(self._shard_at, _PROVENANCE_FIELDS[0], shard)
        return batch

    def provenance(self, start: int, n: int) -> pb.Provenance:
        """Rows [start, start + n) of the row group's provenance: one run (a bare run's header's)."""
        return one_run(self.shard_id, self.start_row + start, n)

    def ipc_size(self, batch: pa.RecordBatch, start: int) -> int:
        """`ipc_size(batch)` of `batch(start, n)`. Where every column is fixed-width without nulls,
        the writer's bytes depend on n and on whether the slice starts the row group or ends it, not
        on the values: counted once for each of those in the row group (~5-7 us a message)."""
        if self._sizes is None:
            return ipc_size(batch)
        n = batch.num_rows
        key = (n, start == 0, start + n == self.rows)
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = ipc_size(batch)
        return size

    def release(self) -> None:
        self._lease.release()


class _Cut:
    """A row group's table as one batch (`data`) and with its provenance columns (`full`, made when
    first asked for), as every `GroupRun` of it cuts messages from, kept while the cache holds the
    table (a weak reference to it: the entry goes with it)."""

    __slots__ = ("_full", "data", "rows", "shard_id", "sizes", "start_row")

    _MADE: dict[int, tuple[weakref.ref[pa.Table], _Cut]] = {}

    def __init__(self, table: pa.Table, shard: int, start_row: int) -> None:
        (self.data,) = table.to_batches()  # one: its columns are one chunk each (`group_run`)
        self.rows = table.num_rows
        self.shard_id, self.start_row = shard, start_row
        self._full: tuple[pa.RecordBatch, pa.Buffer] | None = None
        # sizes by (rows, first, last) where they depend on nothing else (`GroupRun.ipc_size`), of
        # the full batches [False] and of the bare ones [True]
        self.sizes: tuple[dict[tuple[int, bool, bool], int], dict[tuple[int, bool, bool], int]] | None = (
            ({}, {}) if all(_fixed_width(c.type) and not c.null_count for c in self.data.columns) else None
        )

    @property
    def full(self) -> tuple[pa.RecordBatch, pa.Buffer]:
        """The batch with its provenance columns, and the buffer of its `_shard` values (one more
        than its rows); made once where the provenance is small beside the rows (`_KEPT_CUT_FACTOR`),
        else each time asked for (its caller's build holds it as long as its messages do)."""
        if self._full is not None:
            return self._full
        n, shard, start_row = self.rows, self.shard_id, self.start_row
        shards = pa.py_buffer(np.full(n + 1, shard, dtype=np.int32))
        rows = pa.py_buffer(np.arange(start_row - 1, start_row + n, dtype=np.int64))
        full = self.data.append_column(
            _PROVENANCE_FIELDS[0], pa.Array.from_buffers(pa.int32(), n, [None, shards], offset=1)
        ).append_column(_PROVENANCE_FIELDS[1], pa.Array.from_buffers(pa.int64(), n, [None, rows], offset=1))
        if ROW_BYTES * _KEPT_CUT_FACTOR * n <= self.data.get_total_buffer_size():
            self._full = (full, shards)
        return full, shards

    @classmethod
    def of(cls, table: pa.Table, shard: int, start_row: int) -> _Cut | None:
        """The cut of `table`, row group of `shard` from its row `start_row`; None when its columns
        are not one chunk each (or it has no rows or no columns)."""
        key = id(table)
        held = cls._MADE.get(key)
        if held is not None and held[0]() is table:
            cut = held[1]
            if cut.shard_id == shard and cut.start_row == start_row:
                return cut
        if not table.num_rows or not table.num_columns or any(c.num_chunks != 1 for c in table.columns):
            return None
        cut = cls(table, shard, start_row)
        cls._MADE[key] = (weakref.ref(table, lambda _, key=key: cls._MADE.pop(key, None)), cut)
        return cut


_KEPT_CUT_FACTOR = 16  # a cut is kept while its row group's bytes are at least 16x its provenance's


def _fixed_width(t: pa.DataType) -> bool:
    """Whether every value of type `t` takes the same bytes, none in child arrays of their own
    lengths (a fixed-size list of such values counts; extension types by their storage)."""
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pa.types.is_fixed_size_list(t):
        return _fixed_width(t.value_type)
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_fixed_size_binary(t)


def _spanned(tables: list[pa.Table], group: np.ndarray, row: np.ndarray, spans: ListSpans | None) -> pa.Table:
    """Row `row[i]` of `tables[group[i]]` for every i (`gather`); with `spans`, its list column holds
    only the spans' values (`gather_spans`)."""
    if spans is not None:
        part = gather_spans(tables, group, row, spans.column, spans.start, spans.stop)
        if part is not None:
            names = tables[0].column_names
            others = [c for c in names if c != spans.column]
            rest = _spanned([t.select(others) for t in tables], group, row, None) if others else None
            columns = [part if c == spans.column else rest.column(c) for c in names]  # type: ignore[union-attr]
            return pa.Table.from_arrays(columns, schema=tables[0].schema)
    return gather(tables, group, row)


def _with_provenance(table: pa.Table, shard: np.ndarray, row_in_shard: np.ndarray) -> pa.RecordBatch:
    """`table`'s rows and the provenance columns `_shard`, `_row` as one record batch."""
    n = table.num_rows
    shards = np.ascontiguousarray(shard, dtype=np.int32)
    rows = np.ascontiguousarray(row_in_shard, dtype=np.int64)
    if n and table.num_columns and all(c.num_chunks == 1 for c in table.columns):
        # Its one batch, the provenance arrays over the numpy arrays' memory: the same schema and
        # buffers as append_column x2 + combine_chunks + to_batches, at ~16-25 us instead of 67-90
        (batch,) = table.to_batches()
        batch = batch.append_column(_PROVENANCE_FIELDS[0], int_array(shards, 32))
        return batch.append_column(_PROVENANCE_FIELDS[1], int_array(rows))
    table = table.append_column("_shard", int_array(shards, 32))
    table = table.append_column("_row", int_array(rows))
    return table.combine_chunks().to_batches()[0] if n else empty_batch(table.schema)


_PROVENANCE_FIELDS = (pa.field("_shard", pa.int32()), pa.field("_row", pa.int64()))


def _one_run(group: np.ndarray, row_in_group: np.ndarray) -> bool:
    """Whether the rows are consecutive rows of one row group, in order."""
    n = len(row_in_group)
    return bool(
        group[0] == group[-1]
        and row_in_group[-1] - row_in_group[0] == n - 1
        and (n == 1 or (np.diff(row_in_group) == 1).all())
        and (group == group[0]).all()
    )


_DENSE_UNIQUE_GROUPS = 1 << 16  # up to this many row groups, `_unique` marks them in an array


def _unique(g: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(g, return_inverse=True)` for row-group indexes in [0, groups): by marking them in
    an array of `groups` flags, without np.unique's sort (~90 -> ~15 us for a 2,032-row message)."""
    if groups > _DENSE_UNIQUE_GROUPS:
        return np.unique(g, return_inverse=True)
    native = kernels.native
    if native is not None:  # the same marking in C, one call (shardstream/_kernels.c)
        g = np.ascontiguousarray(g, dtype=np.int64)
        unique, inverse = np.empty(len(g), dtype=np.int64), np.empty(len(g), dtype=np.int64)
        return unique[: native.unique_groups(g, groups, unique, inverse)], inverse
    present = np.zeros(groups, dtype=bool)
    present[g] = True
    unique = np.flatnonzero(present)
    slot = np.empty(groups, dtype=np.intp)
    slot[unique] = np.arange(len(unique))
    return unique, slot[g]
